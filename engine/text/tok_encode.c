/*
 * tok_encode.c - text -> ids, in HF tokenizers' order (tokenizer/mod.rs
 * encode_single_sequence):
 *   1. added tokens whose `normalized` is false are split out of the raw
 *      text (added_vocabulary.rs find_matches: leftmost-longest, then the
 *      special / single_word / lstrip / rstrip rules);
 *   2. each remaining piece is normalized on its own (tok_normalize.c), and
 *      added tokens whose `normalized` is true are split out of the
 *      normalized text;
 *   3. the pre-tokenizers cut each piece into words;
 *   4. the BPE model turns each word into ids;
 *   5. the post-processor adds BOS/EOS-style tokens.
 * Invalid UTF-8 in the input is first replaced by U+FFFD, as Python's
 * bytes.decode('utf-8', 'replace') would before calling HF.
 */
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"
#include "tok_internal.h"

/* One call's working memory. */
typedef struct {
    const tokenizer *t;
    tok_match_ctx *mc;
    mem_arena arena;  /* strings made by normalizers and pre-tokenizers, per piece of text */
    tok_spans spans;
    tok_bpe_scratch *bpe;
    int32_t *ids;
    size_t n_ids, cap;
} work;

typedef struct {
    size_t start, end;
    int32_t id; /* -1: text */
} segment;

typedef struct {
    segment *v;
    size_t n, cap;
} segments;

typedef struct {
    const char *p;
    size_t n;
    size_t zero; /* leading bytes from the original text's first character (Metaspace's "first") */
} piece;

typedef struct {
    piece *v;
    size_t n, cap;
} pieces;

static ferry_status oom(void) { return ferry_fail(FERRY_ERR_NOMEM, "tokenizer: out of memory"); }

static bool seg_push(segments *s, size_t start, size_t end, int32_t id)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        segment *v = realloc(s->v, cap * sizeof *v);
        if (!v) return false;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (segment){start, end, id};
    return true;
}

static bool piece_push(pieces *l, const char *p, size_t n, size_t zero)
{
    if (n == 0) return true; /* HF drops empty splits */
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        piece *v = realloc(l->v, cap * sizeof *v);
        if (!v) return false;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (piece){p, n, zero < n ? zero : n};
    return true;
}

static bool ids_push(work *w, int32_t id)
{
    if (w->n_ids == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 256;
        int32_t *v = realloc(w->ids, cap * sizeof *v);
        if (!v) return false;
        w->ids = v;
        w->cap = cap;
    }
    w->ids[w->n_ids++] = id;
    return true;
}

static ferry_status need_mc(work *w)
{
    if (!w->mc && !(w->mc = tok_match_ctx_new())) return oom();
    return FERRY_OK;
}

/* ---- added tokens ---------------------------------------------------------------- */

/* The leftmost-longest match at or after *pos: its start, length and added
 * token index, or false. */
static bool trie_find(const tok_trie *tr, const char *s, size_t n, size_t from, size_t *at, size_t *len,
                      int32_t *idx)
{
    for (size_t p = from; p < n; p++) {
        if (!tr->first[(unsigned char)s[p]]) continue;
        int32_t node = 0, best = -1;
        size_t best_len = 0;
        for (size_t q = p; q < n; q++) {
            const tok_pairmap_slot *e = tok_pairmap_get(&tr->edges, (uint32_t)node, (unsigned char)s[q]);
            if (!e) break;
            node = e->id;
            if (tr->value[node] >= 0) {
                best = tr->value[node];
                best_len = q - p + 1;
            }
        }
        if (best >= 0) {
            *at = p;
            *len = best_len;
            *idx = best;
            return true;
        }
    }
    return false;
}

static size_t prev_char_start(const char *s, size_t pos)
{
    size_t k = pos - 1;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    return k;
}

/* HF's find_matches: the text cut at each added token kept by the rules. */
static ferry_status find_added(const tokenizer *t, const tok_trie *tr, const char *s, size_t n, bool parse_special,
                               segments *out)
{
    out->n = 0;
    size_t start_offset = 0, from = 0, at, len;
    int32_t idx;
    while (tr->n_nodes > 1 && from < n && trie_find(tr, s, n, from, &at, &len, &idx)) {
        size_t start = at, stop = at + len;
        from = stop; /* matches never overlap, even those discarded below */
        const tok_added *a = &t->added[idx];
        if (!parse_special && tok_strmap_get(&t->special_set, a->content, a->len) >= 0) continue;
        if (a->single_word) {
            uint32_t cp;
            bool start_space = true, stop_space = true;
            if (start > 0) {
                size_t k = prev_char_start(s, start);
                tok_utf8_next(s + k, start - k, &cp);
                start_space = !tok_is_regex_word(cp);
            }
            if (stop < n) {
                tok_utf8_next(s + stop, n - stop, &cp);
                stop_space = !tok_is_regex_word(cp);
            }
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t k = prev_char_start(s, ns);
                uint32_t cp;
                tok_utf8_next(s + k, ns - k, &cp);
                if (!tok_is_white_space(cp)) break;
                ns = k;
            }
            /* spaces an earlier token already took stay with it */
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip)
            while (stop < n) {
                uint32_t cp;
                size_t k = tok_utf8_next(s + stop, n - stop, &cp);
                if (!tok_is_white_space(cp)) break;
                stop += k;
            }
        if (start > stop) start = stop; /* HF would panic here (a whitespace-only token after an rstrip) */
        if (start_offset < start && !seg_push(out, start_offset, start, -1)) return oom();
        /* a match inside spaces an earlier token's rstrip took is empty:
         * HF drops empty splits, so it adds no token */
        if (start < stop && !seg_push(out, start, stop, a->id)) return oom();
        start_offset = stop;
    }
    if (start_offset < n && !seg_push(out, start_offset, n, -1)) return oom();
    return FERRY_OK;
}

/* ---- pre-tokenizers ----------------------------------------------------------------- */

typedef struct {
    size_t start, end;
    bool is_match;
} split_part;

typedef struct {
    split_part *v;
    size_t n, cap;
} split_parts;

static bool part_push(split_parts *p, size_t start, size_t end, bool is_match)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        split_part *v = realloc(p->v, cap * sizeof *v);
        if (!v) return false;
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = (split_part){start, end, is_match};
    return true;
}

/* HF NormalizedString::split: the matches and the text between them, then
 * the delimiter behaviour. The parts cover [0, n) in order. */
static ferry_status split_by(const split_parts *in, tok_split_behavior behavior, const piece *pc, pieces *out,
                             split_parts *tmp)
{
    tmp->n = 0;
    bool prev = false;
    switch (behavior) {
    case TOK_SPLIT_ISOLATED:
        for (size_t i = 0; i < in->n; i++)
            if (!part_push(tmp, in->v[i].start, in->v[i].end, false)) return oom();
        break;
    case TOK_SPLIT_REMOVED:
        for (size_t i = 0; i < in->n; i++)
            if (!part_push(tmp, in->v[i].start, in->v[i].end, in->v[i].is_match)) return oom();
        break;
    case TOK_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < in->n; i++) {
            if (in->v[i].is_match == prev && tmp->n) tmp->v[tmp->n - 1].end = in->v[i].end;
            else if (!part_push(tmp, in->v[i].start, in->v[i].end, false)) return oom();
            prev = in->v[i].is_match;
        }
        break;
    case TOK_SPLIT_MERGED_PREV:
        for (size_t i = 0; i < in->n; i++) {
            if (in->v[i].is_match && !prev && tmp->n) tmp->v[tmp->n - 1].end = in->v[i].end;
            else if (!part_push(tmp, in->v[i].start, in->v[i].end, false)) return oom();
            prev = in->v[i].is_match;
        }
        break;
    case TOK_SPLIT_MERGED_NEXT:
        /* built back to front, as HF folds the reversed list */
        for (size_t i = in->n; i-- > 0;) {
            if (in->v[i].is_match && !prev && tmp->n) tmp->v[tmp->n - 1].start = in->v[i].start;
            else if (!part_push(tmp, in->v[i].start, in->v[i].end, false)) return oom();
            prev = in->v[i].is_match;
        }
        for (size_t i = 0, j = tmp->n ? tmp->n - 1 : 0; i < j; i++, j--) {
            split_part x = tmp->v[i];
            tmp->v[i] = tmp->v[j];
            tmp->v[j] = x;
        }
        break;
    }
    for (size_t i = 0; i < tmp->n; i++) {
        if (tmp->v[i].is_match) continue; /* removed */
        size_t at = tmp->v[i].start;
        if (!piece_push(out, pc->p + at, tmp->v[i].end - at, pc->zero > at ? pc->zero - at : 0))
            return oom();
    }
    return FERRY_OK;
}

/* Pattern::find_matches over a regex: matches and gaps, in order. */
static ferry_status regex_parts(work *w, const tok_regex *re, bool invert, const char *s, size_t n,
                                split_parts *parts)
{
    parts->n = 0;
    FERRY_TRY(need_mc(w));
    FERRY_TRY(tok_regex_find_all(re, w->mc, s, n, &w->spans));
    size_t prev = 0;
    for (size_t i = 0; i < w->spans.n; i++) {
        size_t a = w->spans.v[i].start, b = w->spans.v[i].end;
        if (prev != a && !part_push(parts, prev, a, invert)) return oom();
        if (!part_push(parts, a, b, !invert)) return oom();
        prev = b;
    }
    if (prev != n && !part_push(parts, prev, n, invert)) return oom();
    return FERRY_OK;
}

/* GPT-2's byte-to-character mapping of a piece; *zero is mapped along. */
static const char *byte_level_map(work *w, const char *s, size_t n, size_t *out_n, size_t *zero)
{
    char *d = arena_alloc(&w->arena, n * 2 + 1);
    if (!d) return NULL;
    size_t k = 0, z = 0;
    for (size_t i = 0; i < n; i++) {
        k += util_utf8_put(d + k, tok_byte_char[(unsigned char)s[i]]);
        if (i < *zero) z = k;
    }
    *out_n = k;
    *zero = z;
    return d;
}

static ferry_status pre_byte_level(work *w, const tok_pretok *pt, const piece *pc, pieces *out, split_parts *parts,
                                   split_parts *tmp)
{
    piece src = *pc;
    if (pt->add_prefix_space && pc->p[0] != ' ') {
        char *d = arena_alloc(&w->arena, pc->n + 1);
        if (!d) return oom();
        d[0] = ' ';
        memcpy(d + 1, pc->p, pc->n);
        src.p = d;
        src.n = pc->n + 1;
        if (src.zero) src.zero++; /* aligned with the first character */
    }
    size_t first = out->n;
    if (pt->re) {
        FERRY_TRY(regex_parts(w, pt->re, false, src.p, src.n, parts));
        FERRY_TRY(split_by(parts, TOK_SPLIT_ISOLATED, &src, out, tmp));
    } else if (!piece_push(out, src.p, src.n, src.zero)) {
        return oom();
    }
    for (size_t i = first; i < out->n; i++) {
        size_t m;
        const char *mapped = byte_level_map(w, out->v[i].p, out->v[i].n, &m, &out->v[i].zero);
        if (!mapped) return oom();
        out->v[i].p = mapped;
        out->v[i].n = m;
    }
    return FERRY_OK;
}

static ferry_status pre_metaspace(work *w, const tok_pretok *pt, const piece *pc, pieces *out, split_parts *parts,
                                  split_parts *tmp)
{
    size_t spaces = 0;
    for (size_t i = 0; i < pc->n; i++) spaces += pc->p[i] == ' ';
    char *d = arena_alloc(&w->arena, pc->n + spaces * pt->rep_len + pt->rep_len + 1);
    if (!d) return oom();
    size_t k = 0, zero = 0;
    bool starts = pc->n >= pt->rep_len && memcmp(pc->p, pt->rep, pt->rep_len) == 0;
    starts = starts || (pc->p[0] == ' '); /* a leading space becomes the replacement */
    /* "first": HF prepends when the piece's original offset is 0, i.e. its
     * first byte comes from the text's first character */
    if ((pt->prepend == TOK_PREPEND_ALWAYS || (pt->prepend == TOK_PREPEND_FIRST && pc->zero)) && !starts) {
        memcpy(d, pt->rep, pt->rep_len);
        k = pt->rep_len;
        if (pc->zero) zero = k;
    }
    for (size_t i = 0; i < pc->n; i++) {
        if (pc->p[i] == ' ') {
            memcpy(d + k, pt->rep, pt->rep_len);
            k += pt->rep_len;
        } else {
            d[k++] = pc->p[i];
        }
        if (i < pc->zero) zero = k;
    }
    piece src = {d, k, zero};
    if (!pt->split) return piece_push(out, d, k, zero) ? FERRY_OK : oom();
    /* every replacement character is a match, merged with what follows */
    parts->n = 0;
    size_t prev = 0;
    for (size_t i = 0; i + pt->rep_len <= k;) {
        if (memcmp(d + i, pt->rep, pt->rep_len) == 0) {
            if (prev != i && !part_push(parts, prev, i, false)) return oom();
            if (!part_push(parts, i, i + pt->rep_len, true)) return oom();
            i += pt->rep_len;
            prev = i;
        } else {
            i += tok_utf8_len((unsigned char)d[i]);
        }
    }
    if (prev != k && !part_push(parts, prev, k, false)) return oom();
    return split_by(parts, TOK_SPLIT_MERGED_NEXT, &src, out, tmp);
}

static ferry_status pre_tokenize(work *w, const tok_pretok *pt, const pieces *in, pieces *out, split_parts *parts,
                                 split_parts *tmp)
{
    out->n = 0;
    for (size_t i = 0; i < in->n; i++) {
        const piece *pc = &in->v[i];
        switch (pt->kind) {
        case TOK_PRE_SPLIT:
            FERRY_TRY(regex_parts(w, pt->re, pt->invert, pc->p, pc->n, parts));
            FERRY_TRY(split_by(parts, pt->behavior, pc, out, tmp));
            break;
        case TOK_PRE_BYTE_LEVEL:
            FERRY_TRY(pre_byte_level(w, pt, pc, out, parts, tmp));
            break;
        case TOK_PRE_METASPACE:
            FERRY_TRY(pre_metaspace(w, pt, pc, out, parts, tmp));
            break;
        }
    }
    return FERRY_OK;
}

/* ---- the pipeline ------------------------------------------------------------------------ */

typedef struct {
    pieces a, b;
    split_parts parts, tmp;
    segments segs;
    strbuf norm;
} buffers;

static ferry_status encode_piece(work *w, buffers *bf, const char *p, size_t n, size_t zero)
{
    const tokenizer *t = w->t;
    bf->a.n = 0;
    if (!piece_push(&bf->a, p, n, zero)) return oom();
    pieces *cur = &bf->a, *next = &bf->b;
    for (size_t k = 0; k < t->n_pretok; k++) {
        FERRY_TRY(pre_tokenize(w, &t->pretok[k], cur, next, &bf->parts, &bf->tmp));
        pieces *x = cur;
        cur = next;
        next = x;
    }
    if (w->arena.oom) return oom();
    for (size_t i = 0; i < cur->n; i++)
        FERRY_TRY(tok_bpe_word(&t->bpe, cur->v[i].p, cur->v[i].n, &w->bpe, &w->ids, &w->n_ids, &w->cap));
    return FERRY_OK;
}

/* A stretch of raw text between added tokens: normalized, then cut at the
 * normalized added tokens. */
static ferry_status encode_text(work *w, buffers *bf, const char *s, size_t n, bool at_start, bool parse_special)
{
    const tokenizer *t = w->t;
    if (n == 0) return FERRY_OK;
    size_t zero = at_start ? tok_utf8_len((unsigned char)s[0]) : 0;
    const char *ns = s;
    size_t nn = n;
    if (t->n_norm) {
        bf->norm.len = 0;
        FERRY_TRY(need_mc(w));
        FERRY_TRY(tok_normalize(t, w->mc, s, n, &bf->norm, &zero));
        ns = bf->norm.data ? bf->norm.data : "";
        nn = bf->norm.len;
    }
    if (nn == 0) return FERRY_OK;
    segments segs = {0};
    ferry_status st = find_added(t, &t->trie_norm, ns, nn, parse_special, &segs);
    for (size_t i = 0; i < segs.n && st == FERRY_OK; i++) {
        const segment *g = &segs.v[i];
        if (g->id >= 0) {
            if (!ids_push(w, g->id)) st = oom();
        } else {
            arena_reset(&w->arena);
            st = encode_piece(w, bf, ns + g->start, g->end - g->start, zero > g->start ? zero - g->start : 0);
        }
    }
    free(segs.v);
    return st;
}

static ferry_status post_process(work *w, bool add_special)
{
    const tokenizer *t = w->t;
    for (size_t k = 0; k < t->n_post; k++) {
        const tok_template *tp = &t->post[k];
        size_t extra = 0, seqs = 0;
        for (size_t i = 0; i < tp->n; i++) {
            if (tp->items[i] < 0) seqs++;
            else extra += add_special;
        }
        size_t total = seqs * w->n_ids + extra;
        int32_t *v = malloc((total ? total : 1) * sizeof *v);
        if (!v) return oom();
        size_t m = 0;
        for (size_t i = 0; i < tp->n; i++) {
            if (tp->items[i] < 0) {
                if (w->n_ids) memcpy(v + m, w->ids, w->n_ids * sizeof *v);
                m += w->n_ids;
            } else if (add_special) {
                v[m++] = tp->items[i];
            }
        }
        free(w->ids);
        w->ids = v;
        w->n_ids = m;
        w->cap = total ? total : 1;
    }
    return FERRY_OK;
}

ferry_status tok_encode(const tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                        int32_t **ids, int *n)
{
    *ids = NULL;
    *n = 0;
    /* the scratch holds a piece of text at a time, at most a few times its
     * bytes (byte-level: 2 a byte): blocks in proportion to the text */
    size_t block = len < TOK_ARENA_BLOCK / 4 ? 4 * len + 4096 : TOK_ARENA_BLOCK;
    work w = {.t = t, .arena = {.block_min = block}};
    buffers bf = {0};
    strbuf fixed;
    sb_init(&fixed);
    ferry_status st = FERRY_OK;
    if (!text) text = "";
    if (!tok_utf8_valid(text, len)) {
        tok_utf8_lossy(text, len, &fixed, NULL);
        if (fixed.oom) {
            st = oom();
            goto done;
        }
        text = fixed.data;
        len = fixed.len;
    }
    st = find_added(t, &t->trie_raw, text, len, parse_special, &bf.segs);
    for (size_t i = 0; i < bf.segs.n && st == FERRY_OK; i++) {
        const segment *g = &bf.segs.v[i];
        if (g->id >= 0) {
            if (!ids_push(&w, g->id)) st = oom();
        } else {
            st = encode_text(&w, &bf, text + g->start, g->end - g->start, g->start == 0, parse_special);
        }
    }
    if (st == FERRY_OK) st = post_process(&w, add_special);
    if (st == FERRY_OK && w.n_ids > (size_t)INT32_MAX)
        st = ferry_fail(FERRY_ERR_TOO_LARGE, "tokenizer: the text encodes to more than %d tokens", INT32_MAX);
    if (st == FERRY_OK && bf.norm.oom) st = oom();
done:
    if (st == FERRY_OK) {
        *ids = w.ids ? w.ids : malloc(sizeof(int32_t));
        *n = (int)w.n_ids;
        if (!*ids) st = oom();
    } else {
        free(w.ids);
    }
    tok_match_ctx_free(w.mc);
    arena_free(&w.arena);
    free(w.spans.v);
    tok_bpe_scratch_free(w.bpe);
    free(bf.a.v);
    free(bf.b.v);
    free(bf.parts.v);
    free(bf.tmp.v);
    free(bf.segs.v);
    sb_free(&bf.norm);
    sb_free(&fixed);
    return st;
}
