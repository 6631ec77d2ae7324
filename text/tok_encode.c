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
 *
 * Memory: a front end reserves text_encode_bound (text/text.h: 16 bytes
 * a byte of text, and 64 KiB) for an encode, so what one holds must not
 * grow with the number of words in the text, only with the ids. Each step
 * therefore hands on one piece at a time, never a list: the added tokens
 * and the splits come from iterators (added_iter, splitter), and the
 * pre-tokenizers run depth first (encode_piece): a word goes through the
 * BPE model as soon as the last pre-tokenizer makes it, and each
 * pre-tokenizer moves on to its next piece only when every word of the last
 * one is done. The text held besides the caller's is the normalized stretch
 * and, per pre-tokenizer, the piece it made (a prefix space, Metaspace's
 * replacements, ByteLevel's mapping of the word); a word's BPE scratch is
 * let go after it when long (tok_bpe.c).
 */
#include <stdlib.h>
#include <string.h>

#include "../engine/base/util.h"
#include "tok_internal.h"

typedef struct {
    size_t start, end;
    int32_t id; /* -1: text */
} segment;

typedef struct {
    const char *p;
    size_t n;
    size_t zero; /* leading bytes from the original text's first character (Metaspace's "first") */
} piece;

typedef struct {
    size_t start, end;
    bool is_match;
} split_part;

/* How one pre-tokenizer cuts a piece: the parts are the matches of a regex,
 * or the occurrences of a literal (Metaspace's replacement), and the text
 * between them; the behaviour then joins or drops parts. Each call of
 * split_next gives the next piece. */
typedef struct {
    piece src;
    const tok_regex *re; /* NULL: the matches are the occurrences of lit */
    const char *lit;
    size_t lit_len;
    bool invert;
    tok_split_behavior behavior;
    tok_regex_iter it;       /* re's search */
    size_t scan;             /* lit's search */
    bool matches_done;
    size_t prev;             /* the end of the parts given so far */
    split_part held_match;   /* a match found, the text before it given first */
    bool have_held_match;
    split_part pend;         /* the behaviour's part not yet given (joins wait for the next part) */
    bool have_pend, last_match;
} splitter;

/* A pre-tokenizer's state while its piece's words are made. */
typedef struct {
    splitter sp;
    bool splitting;  /* false: the stage gives one piece, `one` */
    piece one;
    bool one_left;
    bool map_bytes;  /* ByteLevel: each piece given goes out mapped into word */
    char *buf;       /* the piece this stage made: a prefix space, Metaspace's replacements */
    size_t buf_cap;
    char *word;      /* ByteLevel: the mapping of the piece given last */
    size_t word_cap;
} stage;

/* One call's working memory. */
typedef struct {
    const tokenizer *t;
    tok_match_ctx *mc;
    stage *stages; /* one a pre-tokenizer */
    strbuf norm;   /* the normalized stretch of text being encoded */
    tok_bpe_scratch *bpe;
    int32_t *ids;
    size_t n_ids, cap;
} work;

static ferry_status oom(void) { return ferry_fail(FERRY_ERR_NOMEM, "tokenizer: out of memory"); }

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

/* Room for n bytes in *buf, its contents not kept (so that growing never
 * holds the old and the new at once). */
static bool buf_room(char **buf, size_t *cap, size_t n)
{
    if (*cap >= n) return true;
    free(*buf);
    *buf = malloc(n);
    *cap = *buf ? n : 0;
    return *buf != NULL;
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

/* HF's find_matches, one segment at a time: the text cut at each added
 * token kept by the rules. */
typedef struct {
    const tok_trie *tr;
    const char *s;
    size_t n;
    bool parse_special;
    size_t from;         /* where the next match is looked for */
    size_t start_offset; /* the end of the segments given so far */
    segment held;        /* a token whose text before it went first */
    bool have_held, ended;
} added_iter;

static void added_start(added_iter *it, const tok_trie *tr, const char *s, size_t n, bool parse_special)
{
    *it = (added_iter){.tr = tr, .s = s, .n = n, .parse_special = parse_special};
}

/* The next segment (non-empty), or false at the end. */
static bool added_next(const tokenizer *t, added_iter *it, segment *out)
{
    if (it->have_held) {
        it->have_held = false;
        *out = it->held;
        return true;
    }
    const char *s = it->s;
    size_t n = it->n, at, len;
    int32_t idx;
    while (!it->ended) {
        if (!(it->tr->n_nodes > 1 && it->from < n && trie_find(it->tr, s, n, it->from, &at, &len, &idx))) {
            it->ended = true;
            if (it->start_offset >= n) return false;
            *out = (segment){it->start_offset, n, -1};
            return true;
        }
        size_t start = at, stop = at + len;
        it->from = stop; /* matches never overlap, even those discarded below */
        const tok_added *a = &t->added[idx];
        if (!it->parse_special && tok_strmap_get(&t->special_set, a->content, a->len) >= 0) continue;
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
            start = ns > it->start_offset ? ns : it->start_offset;
        }
        if (a->rstrip)
            while (stop < n) {
                uint32_t cp;
                size_t k = tok_utf8_next(s + stop, n - stop, &cp);
                if (!tok_is_white_space(cp)) break;
                stop += k;
            }
        if (start > stop) start = stop; /* HF would panic here (a whitespace-only token after an rstrip) */
        size_t gap = it->start_offset;
        it->start_offset = stop;
        /* a match inside spaces an earlier token's rstrip took is empty:
         * HF drops empty splits, so it adds no token */
        bool token = start < stop;
        if (gap < start) {
            *out = (segment){gap, start, -1};
            it->held = (segment){start, stop, a->id};
            it->have_held = token;
            return true;
        }
        if (token) {
            *out = (segment){start, stop, a->id};
            return true;
        }
    }
    return false;
}

/* ---- pre-tokenizers ----------------------------------------------------------------- */

static void split_start(splitter *sp, const piece *src, const tok_regex *re, const char *lit, size_t lit_len,
                        bool invert, tok_split_behavior behavior)
{
    *sp = (splitter){.src = *src, .re = re, .lit = lit, .lit_len = lit_len, .invert = invert, .behavior = behavior};
}

/* The next match in the piece: a regex's (Pattern::find_matches), or the
 * next occurrence of the literal, looked for a character at a time. */
static ferry_status next_match(work *w, splitter *sp, tok_span *m, bool *found)
{
    const char *s = sp->src.p;
    size_t n = sp->src.n;
    if (sp->re) {
        FERRY_TRY(need_mc(w));
        return tok_regex_next(sp->re, w->mc, s, n, &sp->it, m, found);
    }
    *found = false;
    for (size_t i = sp->scan; i + sp->lit_len <= n;) {
        if (memcmp(s + i, sp->lit, sp->lit_len) == 0) {
            *m = (tok_span){i, i + sp->lit_len};
            sp->scan = i + sp->lit_len;
            *found = true;
            return FERRY_OK;
        }
        i += tok_utf8_len((unsigned char)s[i]);
    }
    sp->scan = n;
    return FERRY_OK;
}

/* The next part: the matches and the text between them (HF
 * NormalizedString::split), covering the piece in order. */
static ferry_status next_part(work *w, splitter *sp, split_part *out, bool *got)
{
    *got = true;
    if (sp->have_held_match) {
        sp->have_held_match = false;
        *out = sp->held_match;
        sp->prev = out->end;
        return FERRY_OK;
    }
    if (!sp->matches_done) {
        tok_span m;
        bool found;
        FERRY_TRY(next_match(w, sp, &m, &found));
        if (found) {
            split_part match = {m.start, m.end, !sp->invert};
            if (sp->prev != m.start) {
                *out = (split_part){sp->prev, m.start, sp->invert};
                sp->held_match = match;
                sp->have_held_match = true;
                return FERRY_OK;
            }
            *out = match;
            sp->prev = m.end;
            return FERRY_OK;
        }
        sp->matches_done = true;
    }
    if (sp->prev != sp->src.n) {
        *out = (split_part){sp->prev, sp->src.n, sp->invert};
        sp->prev = sp->src.n;
        return FERRY_OK;
    }
    *got = false;
    return FERRY_OK;
}

/* A part as a piece of the source; false when empty (HF drops empty splits). */
static bool part_piece(const splitter *sp, split_part p, piece *out)
{
    size_t at = p.start, n = p.end - p.start;
    if (n == 0) return false;
    size_t zero = sp->src.zero > at ? sp->src.zero - at : 0;
    *out = (piece){sp->src.p + at, n, zero < n ? zero : n};
    return true;
}

/* The next piece of the split, after the delimiter behaviour (HF
 * SplitDelimiterBehavior): *got false at the end. Isolated: every part;
 * Removed: the text between matches; Contiguous: a run of matches as one;
 * MergedWithPrevious: a match joins the text before it; MergedWithNext: a
 * match joins the text after it (HF folds from the end; the same joins). */
static ferry_status split_next(work *w, splitter *sp, piece *out, bool *got)
{
    for (;;) {
        split_part p, ready;
        bool more, have_ready = false;
        FERRY_TRY(next_part(w, sp, &p, &more));
        if (!more) {
            *got = false;
            if (sp->have_pend) {
                sp->have_pend = false;
                *got = part_piece(sp, sp->pend, out);
            }
            return FERRY_OK;
        }
        switch (sp->behavior) {
        case TOK_SPLIT_ISOLATED:
            ready = p;
            have_ready = true;
            break;
        case TOK_SPLIT_REMOVED:
            ready = p;
            have_ready = !p.is_match;
            break;
        case TOK_SPLIT_CONTIGUOUS:
        case TOK_SPLIT_MERGED_PREV:
            if (sp->have_pend && (sp->behavior == TOK_SPLIT_CONTIGUOUS ? p.is_match == sp->last_match
                                                                         : p.is_match && !sp->last_match)) {
                sp->pend.end = p.end;
            } else {
                ready = sp->pend;
                have_ready = sp->have_pend;
                sp->pend = p;
                sp->have_pend = true;
            }
            sp->last_match = p.is_match;
            break;
        case TOK_SPLIT_MERGED_NEXT:
            if (sp->have_pend) { /* a match, waiting for what follows it */
                ready = sp->pend;
                have_ready = true;
                if (!p.is_match) {
                    ready.end = p.end;
                    sp->have_pend = false;
                } else {
                    sp->pend = p;
                }
            } else if (p.is_match) {
                sp->pend = p;
                sp->have_pend = true;
            } else {
                ready = p;
                have_ready = true;
            }
            break;
        }
        if (have_ready && part_piece(sp, ready, out)) {
            *got = true;
            return FERRY_OK;
        }
    }
}

/* GPT-2's byte-to-character mapping of a piece into the stage's word; the
 * piece's zero is mapped along. */
static bool byte_level_map(stage *sg, piece *pc)
{
    size_t need = pc->n;
    for (size_t i = 0; i < pc->n; i++) need += tok_byte_char[(unsigned char)pc->p[i]] >= 0x80;
    if (!buf_room(&sg->word, &sg->word_cap, need)) return false;
    size_t k = 0, z = 0;
    for (size_t i = 0; i < pc->n; i++) {
        k += util_utf8_put(sg->word + k, tok_byte_char[(unsigned char)pc->p[i]]);
        if (i < pc->zero) z = k;
    }
    *pc = (piece){sg->word, k, z};
    return true;
}

/* Metaspace's piece: each space the replacement, and the replacement
 * prepended as the scheme says, into the stage's buf. */
static bool metaspace_piece(stage *sg, const tok_pretok *pt, const piece *pc, piece *out)
{
    size_t spaces = 0;
    for (size_t i = 0; i < pc->n; i++) spaces += pc->p[i] == ' ';
    if (!buf_room(&sg->buf, &sg->buf_cap, pc->n - spaces + (spaces + 1) * pt->rep_len)) return false;
    char *d = sg->buf;
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
    *out = (piece){d, k, zero < k ? zero : k};
    return true;
}

/* Stage k takes a piece (non-empty) to cut. */
static ferry_status stage_start(work *w, size_t k, const piece *pc)
{
    const tok_pretok *pt = &w->t->pretok[k];
    stage *sg = &w->stages[k];
    sg->splitting = false;
    sg->map_bytes = false;
    sg->one_left = true;
    sg->one = *pc;
    switch (pt->kind) {
    case TOK_PRE_SPLIT:
        split_start(&sg->sp, pc, pt->re, NULL, 0, pt->invert, pt->behavior);
        sg->splitting = true;
        break;
    case TOK_PRE_BYTE_LEVEL:
        sg->map_bytes = true;
        if (pt->add_prefix_space && pc->p[0] != ' ') {
            if (!buf_room(&sg->buf, &sg->buf_cap, pc->n + 1)) return oom();
            sg->buf[0] = ' ';
            memcpy(sg->buf + 1, pc->p, pc->n);
            /* aligned with the first character */
            sg->one = (piece){sg->buf, pc->n + 1, pc->zero ? pc->zero + 1 : 0};
        }
        if (pt->re) {
            split_start(&sg->sp, &sg->one, pt->re, NULL, 0, false, TOK_SPLIT_ISOLATED);
            sg->splitting = true;
        }
        break;
    case TOK_PRE_METASPACE:
        if (!metaspace_piece(sg, pt, pc, &sg->one)) return oom();
        if (pt->split) {
            /* every replacement is a match, merged with what follows */
            split_start(&sg->sp, &sg->one, NULL, pt->rep, pt->rep_len, false, TOK_SPLIT_MERGED_NEXT);
            sg->splitting = true;
        }
        break;
    }
    return FERRY_OK;
}

/* Stage k's next piece (non-empty), or *got false when its piece is done. */
static ferry_status stage_next(work *w, size_t k, piece *out, bool *got)
{
    stage *sg = &w->stages[k];
    if (sg->splitting) {
        FERRY_TRY(split_next(w, &sg->sp, out, got));
    } else {
        *got = sg->one_left && sg->one.n > 0;
        sg->one_left = false;
        *out = sg->one;
    }
    if (*got && sg->map_bytes && !byte_level_map(sg, out)) return oom();
    return FERRY_OK;
}

/* ---- the pipeline ------------------------------------------------------------------------ */

/* One piece of normalized text through the pre-tokenizers, depth first, and
 * each word through the model as soon as it is made. Stage k's pieces
 * point into its input or its own buffers, which stay put until it is
 * asked for its next piece: after stages k+1... are done with this one. */
static ferry_status encode_piece(work *w, const piece *pc)
{
    const tokenizer *t = w->t;
    if (t->n_pretok == 0)
        return tok_bpe_word(&t->bpe, pc->p, pc->n, &w->bpe, &w->ids, &w->n_ids, &w->cap);
    FERRY_TRY(stage_start(w, 0, pc));
    size_t depth = 1; /* stages [0, depth) hold a piece */
    while (depth) {
        piece sub;
        bool got;
        FERRY_TRY(stage_next(w, depth - 1, &sub, &got));
        if (!got) {
            depth--;
        } else if (depth == t->n_pretok) {
            FERRY_TRY(tok_bpe_word(&t->bpe, sub.p, sub.n, &w->bpe, &w->ids, &w->n_ids, &w->cap));
        } else {
            FERRY_TRY(stage_start(w, depth, &sub));
            depth++;
        }
    }
    return FERRY_OK;
}

/* A stretch of raw text between added tokens: normalized, then cut at the
 * normalized added tokens. */
static ferry_status encode_text(work *w, const char *s, size_t n, bool at_start, bool parse_special)
{
    const tokenizer *t = w->t;
    if (n == 0) return FERRY_OK;
    size_t zero = at_start ? tok_utf8_len((unsigned char)s[0]) : 0;
    const char *ns = s;
    size_t nn = n;
    if (t->n_norm) {
        FERRY_TRY(need_mc(w));
        FERRY_TRY(tok_normalize(t, w->mc, s, n, &w->norm, &zero));
        ns = w->norm.data ? w->norm.data : "";
        nn = w->norm.len;
    }
    if (nn == 0) return FERRY_OK;
    added_iter it;
    added_start(&it, &t->trie_norm, ns, nn, parse_special);
    segment g;
    while (added_next(t, &it, &g)) {
        if (g.id >= 0) {
            if (!ids_push(w, g.id)) return oom();
            continue;
        }
        piece pc = {ns + g.start, g.end - g.start, zero > g.start ? zero - g.start : 0};
        if (pc.zero > pc.n) pc.zero = pc.n;
        FERRY_TRY(encode_piece(w, &pc));
    }
    return FERRY_OK;
}

/* The post-processor's templates, in place when the sequence appears once
 * (the ids are the biggest thing an encode holds). */
static ferry_status post_process(work *w, bool add_special)
{
    const tokenizer *t = w->t;
    for (size_t k = 0; k < t->n_post; k++) {
        const tok_template *tp = &t->post[k];
        size_t extra = 0, seqs = 0, before = 0;
        for (size_t i = 0; i < tp->n; i++) {
            if (tp->items[i] < 0) seqs++;
            else if (add_special) {
                extra++;
                before += seqs == 0;
            }
        }
        size_t total = seqs * w->n_ids + extra;
        int32_t *v = w->ids;
        if (seqs != 1 || total > w->cap) {
            v = malloc((total ? total : 1) * sizeof *v);
            if (!v) return oom();
        }
        if (seqs == 1 && w->n_ids) memmove(v + before, w->ids, w->n_ids * sizeof *v);
        size_t m = 0;
        for (size_t i = 0; i < tp->n; i++) {
            if (tp->items[i] < 0) {
                if (seqs != 1 && w->n_ids) memcpy(v + m, w->ids, w->n_ids * sizeof *v);
                m += w->n_ids;
            } else if (add_special) {
                v[m++] = tp->items[i];
            }
        }
        if (v != w->ids) {
            free(w->ids);
            w->ids = v;
            w->cap = total ? total : 1;
        }
        w->n_ids = m;
    }
    return FERRY_OK;
}

ferry_status tok_encode(const tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                        int32_t **ids, int *n)
{
    *ids = NULL;
    *n = 0;
    work w = {.t = t};
    sb_init(&w.norm);
    strbuf fixed;
    sb_init(&fixed);
    ferry_status st = FERRY_OK;
    if (t->n_pretok && !(w.stages = calloc(t->n_pretok, sizeof *w.stages))) {
        st = oom();
        goto done;
    }
    if (!text) text = "";
    if (!tok_utf8_valid(text, len)) {
        tok_utf8_lossy(text, len, &fixed, NULL);
        if (fixed.oom) {
            st = oom();
            goto done;
        }
        char *d = realloc(fixed.data, fixed.len + 1); /* held throughout: without the doubling's room */
        if (d) fixed.data = d;
        text = fixed.data;
        len = fixed.len;
    }
    added_iter it;
    added_start(&it, &t->trie_raw, text, len, parse_special);
    segment g;
    while (st == FERRY_OK && added_next(t, &it, &g)) {
        if (g.id >= 0) {
            if (!ids_push(&w, g.id)) st = oom();
        } else {
            st = encode_text(&w, text + g.start, g.end - g.start, g.start == 0, parse_special);
        }
    }
    /* the ids are all that is left to hold */
    sb_free(&w.norm);
    sb_free(&fixed);
    if (st == FERRY_OK) st = post_process(&w, add_special);
    if (st == FERRY_OK && w.n_ids > (size_t)INT32_MAX)
        st = ferry_fail(FERRY_ERR_TOO_LARGE, "tokenizer: the text encodes to more than %d tokens", INT32_MAX);
done:
    if (st == FERRY_OK) {
        *ids = w.ids ? w.ids : malloc(sizeof(int32_t));
        *n = (int)w.n_ids;
        if (!*ids) st = oom();
    } else {
        free(w.ids);
    }
    tok_match_ctx_free(w.mc);
    for (size_t k = 0; w.stages && k < t->n_pretok; k++) {
        free(w.stages[k].buf);
        free(w.stages[k].word);
    }
    free(w.stages);
    tok_bpe_scratch_free(w.bpe);
    sb_free(&w.norm);
    sb_free(&fixed);
    return st;
}
