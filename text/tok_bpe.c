/*
 * tok_bpe.c - the BPE model: tokenizer.json's "model" section (vocab and
 * merges, in either merge form) and the tokenization of one pre-token.
 *
 * A word starts as one symbol per character (its vocab id; else its bytes'
 * <0xNN> tokens under byte_fallback; else unk, fused under fuse_unk; else
 * nothing, as HF drops it). Merges then run lowest rank first, leftmost
 * first among equal ranks, from a binary heap of candidate pairs over a
 * list of symbols: O(n log n) in the word's length, so one 1 MB "word"
 * costs a fraction of a second, not minutes. The symbols are an array of
 * ids by initial position, -1 where one was merged into its left neighbour,
 * so that a long word holds 4 bytes a symbol and 8 a candidate (see
 * tok_bpe_scratch). The invariants are HF's (models/bpe/word.rs merge_all):
 *   1. A heap entry (rank, pos) is stale when the symbol at pos was merged
 *      away (-1), is last, or no longer forms the pair of that rank with its
 *      right neighbour; stale entries are dropped on pop, and all of them
 *      when the heap is full.
 *   2. A merge keeps the left symbol's position, so array order is word
 *      order, and the pairs it creates are pushed with their left position.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

/* ---- loading ---------------------------------------------------------------- */

/* Parses one "a b" merge string into its two tokens. HF refuses a line that
 * does not hold exactly one space; see tokenizer.h for why ferry skips it. */
static bool split_merge(const char *s, size_t n, size_t *a_len, const char **b, size_t *b_len)
{
    const char *sp = memchr(s, ' ', n);
    if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp - s) - 1)) return false;
    *a_len = (size_t)(sp - s);
    *b = sp + 1;
    *b_len = n - *a_len - 1;
    return true;
}

static ferry_status add_merge(tok_bpe *m, const char *file, size_t i, const char *a, size_t a_len, const char *b,
                              size_t b_len, uint32_t rank, char **buf, size_t *buf_cap)
{
    int32_t ia = tok_strmap_get(&m->vocab, a, a_len);
    if (ia < 0)
        return ferry_fail(FERRY_ERR_INVALID, "%s: model.merges[%zu]: token '%.*s' is not in the vocabulary", file, i,
                          (int)(a_len > 200 ? 200 : a_len), a);
    int32_t ib = tok_strmap_get(&m->vocab, b, b_len);
    if (ib < 0)
        return ferry_fail(FERRY_ERR_INVALID, "%s: model.merges[%zu]: token '%.*s' is not in the vocabulary", file, i,
                          (int)(b_len > 200 ? 200 : b_len), b);
    if (a_len + b_len > *buf_cap) {
        size_t cap = (a_len + b_len) * 2;
        char *nb = realloc(*buf, cap);
        if (!nb) return ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", file);
        *buf = nb;
        *buf_cap = cap;
    }
    memcpy(*buf, a, a_len);
    memcpy(*buf + a_len, b, b_len);
    int32_t merged = tok_strmap_get(&m->vocab, *buf, a_len + b_len);
    if (merged < 0)
        return ferry_fail(FERRY_ERR_INVALID, "%s: model.merges[%zu]: the merged token '%.*s' is not in the vocabulary",
                          file, i, (int)(a_len + b_len > 200 ? 200 : a_len + b_len), *buf);
    /* a pair listed twice keeps the later rank, as HF's map does */
    if (!tok_pairmap_put(&m->merges, (uint32_t)ia, (uint32_t)ib, rank, merged))
        return ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", file);
    return FERRY_OK;
}

static ferry_status load_vocab(tok_bpe *m, const json_value *vocab, mem_arena *arena, const char *file)
{
    if (!vocab || vocab->type != JSON_OBJECT)
        return ferry_fail(FERRY_ERR_INVALID, "%s: model.vocab must be an object of token -> id", file);
    if (!tok_strmap_init(&m->vocab, vocab->len)) return ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", file);
    const char **keys = malloc((vocab->len ? vocab->len : 1) * sizeof *keys);
    if (!keys) return ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", file);
    ferry_status st = FERRY_OK;
    m->max_id = -1;
    for (size_t i = 0; i < vocab->len; i++) {
        const json_member *e = &vocab->members[i];
        if (e->value.type != JSON_NUMBER || !e->value.is_int || e->value.integer < 0 ||
            e->value.integer >= TOK_MAX_ID) {
            st = ferry_fail(FERRY_ERR_INVALID, "%s: model.vocab['%.*s'] must be an integer id in [0, %d)", file,
                            (int)(e->key_len > 200 ? 200 : e->key_len), e->key, TOK_MAX_ID);
            goto done;
        }
        keys[i] = arena_strdup(arena, e->key, e->key_len);
        if (!keys[i] || !tok_strmap_put(&m->vocab, keys[i], e->key_len, (int32_t)e->value.integer)) {
            st = ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", file);
            goto done;
        }
        if (e->value.integer > m->max_id) m->max_id = (int32_t)e->value.integer;
    }
    m->n_entries = m->vocab.count;
    size_t n_ids = (size_t)m->max_id + 1;
    m->id_str = arena_alloc(arena, (n_ids ? n_ids : 1) * sizeof *m->id_str);
    m->id_len = arena_alloc(arena, (n_ids ? n_ids : 1) * sizeof *m->id_len);
    m->bmp_id = arena_alloc(arena, 0x10000 * sizeof *m->bmp_id);
    if (!m->id_str || !m->id_len || !m->bmp_id) {
        st = ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", file);
        goto done;
    }
    memset(m->id_str, 0, n_ids * sizeof *m->id_str);
    memset(m->id_len, 0, n_ids * sizeof *m->id_len);
    memset(m->bmp_id, 0xFF, 0x10000 * sizeof *m->bmp_id);
    /* in document order, skipping bindings a later duplicate key replaced;
     * two tokens sharing an id: the later one names it */
    for (size_t i = 0; i < vocab->len; i++) {
        const json_member *e = &vocab->members[i];
        int32_t id = (int32_t)e->value.integer;
        if (tok_strmap_get(&m->vocab, e->key, e->key_len) != id) continue;
        m->id_str[id] = keys[i];
        m->id_len[id] = (uint32_t)e->key_len;
        uint32_t cp;
        if (e->key_len > 0 && tok_utf8_next(e->key, e->key_len, &cp) == e->key_len && cp < 0x10000)
            m->bmp_id[cp] = id;
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        m->byte_id[b] = tok_strmap_get(&m->vocab, name, 6);
    }
done:
    free(keys);
    return st;
}

static ferry_status load_merges(tok_bpe *m, const json_value *merges, const char *file)
{
    if (!merges || merges->type != JSON_ARRAY)
        return ferry_fail(FERRY_ERR_INVALID, "%s: model.merges must be an array", file);
    if (!tok_pairmap_init(&m->merges, merges->len)) return ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", file);
    /* HF reads either every merge as a pair or every merge as a string */
    bool pairs = merges->len == 0 || merges->items[0].type == JSON_ARRAY;
    char *buf = NULL;
    size_t buf_cap = 0;
    uint32_t rank = 0;
    ferry_status st = FERRY_OK;
    for (size_t i = 0; i < merges->len && st == FERRY_OK; i++) {
        const json_value *v = &merges->items[i];
        if (pairs) {
            if (v->type != JSON_ARRAY || v->len != 2 || v->items[0].type != JSON_STRING ||
                v->items[1].type != JSON_STRING) {
                st = ferry_fail(FERRY_ERR_INVALID, "%s: model.merges[%zu] must be a pair of strings like the others",
                                file, i);
                break;
            }
            st = add_merge(m, file, i, v->items[0].str, v->items[0].len, v->items[1].str, v->items[1].len, rank++,
                           &buf, &buf_cap);
        } else {
            if (v->type != JSON_STRING) {
                st = ferry_fail(FERRY_ERR_INVALID, "%s: model.merges[%zu] must be a string \"a b\" like the others",
                                file, i);
                break;
            }
            if (v->len >= 8 && memcmp(v->str, "#version", 8) == 0) continue; /* merges.txt's header line */
            size_t a_len, b_len;
            const char *b;
            if (!split_merge(v->str, v->len, &a_len, &b, &b_len)) {
                rank++;
                continue;
            }
            st = add_merge(m, file, i, v->str, a_len, b, b_len, rank++, &buf, &buf_cap);
        }
    }
    free(buf);
    return st;
}

/* A string-or-null field; *bad when it is something else. */
static const char *opt_str(const json_value *obj, const char *key, const char *file, ferry_status *st)
{
    const json_value *v = json_get(obj, key);
    if (!v || v->type == JSON_NULL) return NULL;
    if (v->type != JSON_STRING) {
        *st = ferry_fail(FERRY_ERR_INVALID, "%s: model.%s must be a string or null", file, key);
        return NULL;
    }
    return v->str;
}

static bool opt_bool(const json_value *obj, const char *key, const char *file, ferry_status *st)
{
    bool bad = false, v = false;
    json_get_bool(obj, key, &v, &bad);
    if (bad && *st == FERRY_OK) *st = ferry_fail(FERRY_ERR_INVALID, "%s: model.%s must be true or false", file, key);
    return v;
}

ferry_status tok_bpe_load(tok_bpe *m, const json_value *model, mem_arena *arena, const char *file)
{
    memset(m, 0, sizeof *m);
    m->max_id = -1;
    if (!model || model->type != JSON_OBJECT)
        return ferry_fail(FERRY_ERR_INVALID, "%s: model must be an object", file);
    const json_value *type = json_get(model, "type");
    if (type && type->type != JSON_STRING)
        return ferry_fail(FERRY_ERR_INVALID, "%s: model.type must be a string", file);
    if (type && strcmp(type->str, "BPE") != 0)
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: model type '%s' is not supported (only BPE)", file, type->str);
    if (!type && !json_get(model, "merges"))
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: model has no type and no merges: only BPE is supported", file);

    ferry_status st = FERRY_OK;
    const json_value *dropout = json_get(model, "dropout");
    if (dropout && dropout->type != JSON_NULL && !(dropout->type == JSON_NUMBER && dropout->number == 0.0))
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: model.dropout must be null (BPE dropout makes encoding random)",
                          file);
    const char *prefix = opt_str(model, "continuing_subword_prefix", file, &st);
    const char *suffix = opt_str(model, "end_of_word_suffix", file, &st);
    const char *unk = opt_str(model, "unk_token", file, &st);
    m->fuse_unk = opt_bool(model, "fuse_unk", file, &st);
    m->byte_fallback = opt_bool(model, "byte_fallback", file, &st);
    m->ignore_merges = opt_bool(model, "ignore_merges", file, &st);
    if (st != FERRY_OK) return st;
    if (prefix && *prefix)
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: model.continuing_subword_prefix '%s' is not supported", file,
                          prefix);
    if (suffix && *suffix)
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: model.end_of_word_suffix '%s' is not supported", file, suffix);
    if (unk && !(m->unk_token = arena_strdup(arena, unk, strlen(unk))))
        return ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", file);
    const json_value *vocab = json_get(model, "vocab"), *merges = json_get(model, "merges");
    if (!vocab || !merges) return ferry_fail(FERRY_ERR_INVALID, "%s: model needs vocab and merges", file);
    FERRY_TRY(load_vocab(m, vocab, arena, file));
    return load_merges(m, merges, file);
}

void tok_bpe_free(tok_bpe *m)
{
    tok_strmap_free(&m->vocab);
    tok_pairmap_free(&m->merges);
}

/* ---- one word ------------------------------------------------------------------ */

/* A word's working memory, kept from word to word (a long word's is let go
 * after it): 4 bytes a symbol and 8 a candidate merge, all of it within
 * what a front end reserves for an encode (text_encode_bound: 16 bytes a
 * byte of text) for a word as long as the text. */
struct tok_bpe_scratch {
    int32_t *sym;   /* by initial position: the symbol's id; -1 once merged into the live symbol on its left */
    size_t sym_cap;
    uint64_t *heap; /* candidate merges, min-heap: rank << 32 | the position of the pair's left symbol */
    size_t heap_n, heap_cap;
};

/* A word's scratch past this is freed after it, not kept for the next. */
#define TOK_BPE_KEEP (64 * 1024)

void tok_bpe_scratch_free(tok_bpe_scratch *s)
{
    if (!s) return;
    free(s->sym);
    free(s->heap);
    free(s);
}

static ferry_status oom(void) { return ferry_fail(FERRY_ERR_NOMEM, "tokenizer: out of memory"); }

static inline uint64_t cand(uint32_t rank, size_t pos) { return (uint64_t)rank << 32 | (uint32_t)pos; }

static void heap_down(uint64_t *h, size_t n, size_t i)
{
    uint64_t x = h[i];
    for (;;) {
        size_t l = 2 * i + 1, m = l;
        if (l >= n) break;
        if (l + 1 < n && h[l + 1] < h[l]) m = l + 1;
        if (h[m] >= x) break;
        h[i] = h[m];
        i = m;
    }
    h[i] = x;
}

static void heapify(uint64_t *h, size_t n)
{
    for (size_t i = n / 2; i-- > 0;) heap_down(h, n, i);
}

static uint64_t heap_pop(tok_bpe_scratch *s)
{
    uint64_t top = s->heap[0];
    s->heap[0] = s->heap[--s->heap_n];
    if (s->heap_n) heap_down(s->heap, s->heap_n, 0);
    return top;
}

/* The live symbol after position i, or n. The dead ones skipped are those
 * merged into i: no more than its token's characters. */
static inline size_t next_live(const int32_t *sym, size_t n, size_t i)
{
    do i++;
    while (i < n && sym[i] < 0);
    return i;
}

/* The live symbol before position i (> 0): position 0 is never merged away. */
static inline size_t prev_live(const int32_t *sym, size_t i)
{
    do i--;
    while (sym[i] < 0);
    return i;
}

/* Whether a candidate still stands (invariant 1). */
static bool cand_live(const tok_bpe *m, const int32_t *sym, size_t n, uint64_t c)
{
    size_t pos = (uint32_t)c, nx;
    if (sym[pos] < 0 || (nx = next_live(sym, n, pos)) == n) return false;
    const tok_pairmap_slot *p = tok_pairmap_get(&m->merges, (uint32_t)sym[pos], (uint32_t)sym[nx]);
    return p && p->rank == (uint32_t)(c >> 32);
}

/* Adds a candidate. A full heap first drops its stale candidates, and grows
 * (at most to one a symbol, which always leaves room: the live candidates
 * are fewer than the live symbols) when that freed less than a quarter. */
static bool heap_push(const tok_bpe *m, tok_bpe_scratch *s, size_t n, uint64_t c)
{
    if (s->heap_n == s->heap_cap) {
        size_t k = 0;
        for (size_t i = 0; i < s->heap_n; i++)
            if (cand_live(m, s->sym, n, s->heap[i])) s->heap[k++] = s->heap[i];
        s->heap_n = k;
        heapify(s->heap, k);
        /* (full after all: a vocabulary whose ids name several strings
         * can hold one pair twice) */
        if ((k > s->heap_cap - s->heap_cap / 4 && s->heap_cap < n) || k == s->heap_cap) {
            size_t cap = s->heap_cap + s->heap_cap / 2 + 16;
            if (cap > n && k < n) cap = n;
            uint64_t *h = realloc(s->heap, cap * sizeof *h);
            if (!h) return false;
            s->heap = h;
            s->heap_cap = cap;
        }
    }
    size_t i = s->heap_n++;
    while (i > 0 && c < s->heap[(i - 1) / 2]) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = c;
    return true;
}

static bool ids_push(int32_t **ids, size_t *n, size_t *cap, int32_t id)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 256;
        int32_t *v = realloc(*ids, c * sizeof *v);
        if (!v) return false;
        *ids = v;
        *cap = c;
    }
    (*ids)[(*n)++] = id;
    return true;
}

/* Room for k more ids: exactly when the array is empty (a text of one word
 * holds its ids once), else at least doubled. */
static bool ids_reserve(int32_t **ids, size_t n, size_t *cap, size_t k)
{
    if (*cap - n >= k) return true;
    size_t c = *cap ? *cap * 2 : 0;
    if (c < n + k) c = n + k;
    int32_t *v = realloc(*ids, c * sizeof *v);
    if (!v) return false;
    *ids = v;
    *cap = c;
    return true;
}

/* Makes room for want entries in *a (of *cap, each size bytes), its old
 * contents not kept. */
static bool room(void **a, size_t *cap, size_t want, size_t size)
{
    if (*cap >= want) return true;
    free(*a);
    *a = malloc(want * size);
    *cap = *a ? want : 0;
    return *a != NULL;
}

/* At most how many symbols w[i..n) makes (one a character, or its bytes). */
static size_t symbols_left(const tok_bpe *m, const char *w, size_t i, size_t n)
{
    size_t count = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = tok_utf8_next(w + i, n - i, &cp);
        int32_t id = cp < 0x10000 ? m->bmp_id[cp] : tok_strmap_get(&m->vocab, w + i, k);
        count += id < 0 && m->byte_fallback ? k : 1;
        i += k;
    }
    return count;
}

/* Room in s->sym for need more symbols after k, at byte i of the word: the
 * array is sized for one symbol a character, which only byte tokens
 * outgrow; then it takes what the rest of the word can make. */
static bool sym_fit(const tok_bpe *m, tok_bpe_scratch *s, const char *w, size_t i, size_t n, size_t k, size_t need)
{
    if (s->sym_cap - k >= need) return true;
    size_t cap = k + need + 1 + symbols_left(m, w, i, n);
    int32_t *v = realloc(s->sym, cap * sizeof *v);
    if (!v) return false;
    s->sym = v;
    s->sym_cap = cap;
    return true;
}

/* The initial symbols of w, as HF's merge_word builds them, into s->sym. */
static ferry_status initial_symbols(const tok_bpe *m, tok_bpe_scratch *s, const char *w, size_t n, size_t *n_sym)
{
    bool have_unk = false;
    int32_t unk_id = -1;
    size_t k_sym = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = tok_utf8_next(w + i, n - i, &cp);
        int32_t id = cp < 0x10000 ? m->bmp_id[cp] : tok_strmap_get(&m->vocab, w + i, k);
        if (id >= 0) {
            if (!sym_fit(m, s, w, i + k, n, k_sym, 1 + have_unk)) return oom();
            if (have_unk) s->sym[k_sym++] = unk_id;
            have_unk = false;
            s->sym[k_sym++] = id;
            i += k;
            continue;
        }
        if (m->byte_fallback) {
            bool all = true;
            for (size_t b = 0; b < k; b++) all = all && m->byte_id[(unsigned char)w[i + b]] >= 0;
            if (all) {
                if (!sym_fit(m, s, w, i + k, n, k_sym, k)) return oom();
                /* a pending unk stays pending across byte tokens, as in HF */
                for (size_t b = 0; b < k; b++) s->sym[k_sym++] = m->byte_id[(unsigned char)w[i + b]];
                i += k;
                continue;
            }
        }
        if (m->unk_token && !(have_unk && m->fuse_unk)) {
            if (have_unk) {
                if (!sym_fit(m, s, w, i + k, n, k_sym, 1)) return oom();
                s->sym[k_sym++] = unk_id;
            }
            unk_id = tok_strmap_get(&m->vocab, m->unk_token, strlen(m->unk_token));
            if (unk_id < 0)
                return ferry_fail(FERRY_ERR_INVALID, "tokenizer: unk_token '%s' is not in the vocabulary",
                                  m->unk_token);
            have_unk = true;
        }
        i += k;
    }
    if (have_unk) {
        if (!sym_fit(m, s, w, n, n, k_sym, 1)) return oom();
        s->sym[k_sym++] = unk_id;
    }
    *n_sym = k_sym;
    return FERRY_OK;
}

/* The merges of a word of n symbols, lowest rank first, leftmost first
 * among equal ranks. A candidate is (rank, left position): since a merge
 * line has a rank of its own, the rank names the pair, and a pair at a
 * position, once changed, never comes back (its symbols only grow), so a
 * candidate whose position still holds its pair is the one HF would take
 * (HF compares the merged id instead; the same test for a vocabulary whose
 * ids name one string each). */
static ferry_status merge_all(const tok_bpe *m, tok_bpe_scratch *s, size_t n)
{
    int32_t *sym = s->sym;
    s->heap_n = 0;
    /* the first candidates, counted before they are stored when the word is
     * long: a word of few merges keeps a small heap */
    size_t want = n - 1;
    if (n > 4096) {
        want = 0;
        for (size_t i = 0; i + 1 < n; i++) want += tok_pairmap_get(&m->merges, (uint32_t)sym[i], (uint32_t)sym[i + 1]) != NULL;
        if (want == 0) return FERRY_OK;
        want += want / 8;
        if (want > n) want = n;
    }
    if (want < 64) want = 64;
    if (!room((void **)&s->heap, &s->heap_cap, want, sizeof *s->heap)) return oom();
    for (size_t i = 0; i + 1 < n; i++) {
        const tok_pairmap_slot *p = tok_pairmap_get(&m->merges, (uint32_t)sym[i], (uint32_t)sym[i + 1]);
        if (p) s->heap[s->heap_n++] = cand(p->rank, i);
    }
    heapify(s->heap, s->heap_n);
    while (s->heap_n) {
        uint64_t top = heap_pop(s);
        size_t pos = (uint32_t)top, right;
        if (sym[pos] < 0 || (right = next_live(sym, n, pos)) == n) continue; /* invariant 1 */
        const tok_pairmap_slot *p = tok_pairmap_get(&m->merges, (uint32_t)sym[pos], (uint32_t)sym[right]);
        if (!p || p->rank != (uint32_t)(top >> 32)) continue;
        sym[pos] = p->id;
        sym[right] = -1;
        /* invariant 2: the new pairs, keyed by their left symbol */
        if (pos > 0) {
            size_t prev = prev_live(sym, pos);
            p = tok_pairmap_get(&m->merges, (uint32_t)sym[prev], (uint32_t)sym[pos]);
            if (p && !heap_push(m, s, n, cand(p->rank, prev))) return oom();
        }
        size_t next = next_live(sym, n, right);
        if (next < n) {
            p = tok_pairmap_get(&m->merges, (uint32_t)sym[pos], (uint32_t)sym[next]);
            if (p && !heap_push(m, s, n, cand(p->rank, pos))) return oom();
        }
    }
    return FERRY_OK;
}

ferry_status tok_bpe_word(const tok_bpe *m, const char *w, size_t n, tok_bpe_scratch **scratch, int32_t **ids,
                          size_t *n_ids, size_t *cap)
{
    if (n == 0) return FERRY_OK;
    if (m->ignore_merges) {
        int32_t id = tok_strmap_get(&m->vocab, w, n);
        if (id >= 0) return ids_push(ids, n_ids, cap, id) ? FERRY_OK : oom();
    }
    if (n >= UINT32_MAX)
        return ferry_fail(FERRY_ERR_TOO_LARGE, "tokenizer: a word of %zu bytes is past the 4 GiB a word", n);
    if (!*scratch && !(*scratch = calloc(1, sizeof **scratch))) return oom();
    tok_bpe_scratch *s = *scratch;
    /* one symbol a character, unless byte tokens stand for some (sym_fit) */
    size_t chars = 0;
    for (size_t i = 0; i < n; i++) chars += ((unsigned char)w[i] & 0xC0) != 0x80;
    if (!room((void **)&s->sym, &s->sym_cap, chars ? chars : 1, sizeof *s->sym)) return oom();
    size_t n_sym = 0;
    FERRY_TRY(initial_symbols(m, s, w, n, &n_sym));
    ferry_status st = n_sym > 1 ? merge_all(m, s, n_sym) : FERRY_OK;
    if (s->heap_cap * sizeof *s->heap > TOK_BPE_KEEP) {
        free(s->heap);
        s->heap = NULL;
        s->heap_cap = 0;
    }
    if (st == FERRY_OK) {
        size_t k = 0;
        for (size_t i = 0; i < n_sym; i++)
            if (s->sym[i] >= 0) s->sym[k++] = s->sym[i];
        if (!ids_reserve(ids, *n_ids, cap, k)) st = oom();
        else if (k) memcpy(*ids + *n_ids, s->sym, k * sizeof **ids);
        if (st == FERRY_OK) *n_ids += k;
    }
    if (s->sym_cap * sizeof *s->sym > TOK_BPE_KEEP) {
        free(s->sym);
        s->sym = NULL;
        s->sym_cap = 0;
    }
    return st;
}
