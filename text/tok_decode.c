/*
 * tok_decode.c - ids -> text, whole (tok_decode) or one id at a time
 * (tok_stream), through the decoder chain of tokenizer.json.
 *
 * HF decodes a list of token strings with each decoder in turn
 * (decode_chain: list -> list) and joins the result. Here every decoder is
 * a stage that takes tokens as they come and passes on what can no longer
 * change; tok_decode is a stream pushed every id and flushed, so the
 * concatenation of a stream's output is tok_decode's output by
 * construction. A stage sees either whole tokens ("closed" mode) or, once a
 * Fuse or ByteLevel stage before it has joined everything into the one
 * token HF then holds, pieces of that growing token ("fragment" mode):
 *
 *   stage         closed tokens in                 fragments in
 *   Replace       each token rewritten             a String pattern: the last
 *                                                  len-1 bytes held back;
 *                                                  a regex: held to the end
 *   Strip         each token stripped              leading: dropped as they
 *                                                  come; trailing: up to
 *                                                  `stop` held back
 *   Metaspace     replacement -> ' ' (dropped in   as the first token
 *                 the first token unless never)
 *   ByteFallback  a run of <0xNN> tokens held      held to the end
 *                 until a token that is not one
 *   Fuse          -> fragments                     passed on
 *   ByteLevel     -> bytes, decoded as UTF-8 with  held to the end
 *                 an incomplete sequence held
 * Invalid UTF-8 becomes U+FFFD exactly as HF writes it (from_utf8_lossy in
 * ByteLevel; one U+FFFD per byte of an invalid run in ByteFallback).
 */
#define _GNU_SOURCE /* memmem */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

typedef struct {
    strbuf hold;
    size_t count;    /* closed tokens received: Metaspace's "first token" */
    size_t lead;     /* Strip: leading content characters removed */
    bool lead_done;  /* Strip: the leading run is over */
    size_t trail;    /* Strip: content characters held in `hold` */
} stage;

struct tok_stream {
    const tokenizer *t;
    bool skip_special;
    size_t n_sink;       /* tokens the sink received (spaces between them without a decoder) */
    tok_match_ctx *mc;   /* for regex Replace stages */
    ferry_status err;    /* the first failure inside a stage */
    bool *frag;          /* per stage: fragment mode */
    stage *st;
};

static void deliver(tok_stream *s, size_t k, const char *p, size_t n, bool closed, strbuf *out);

/* ---- token text --------------------------------------------------------------- */

const char *tok_id_text(const tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->vocab_size) return NULL;
    int32_t a = t->added_at[id];
    if (a >= 0) {
        *len = t->added[a].form_len;
        return t->added[a].form;
    }
    if (id <= t->bpe.max_id && t->bpe.id_str[id]) {
        *len = t->bpe.id_len[id];
        return t->bpe.id_str[id];
    }
    return NULL;
}

/* ---- helpers ---------------------------------------------------------------- */

static void set_err(tok_stream *s, ferry_status st)
{
    if (s->err == FERRY_OK) s->err = st;
}

static void hold_clear(stage *g)
{
    g->hold.len = 0;
    if (g->hold.data) g->hold.data[0] = '\0';
}

/* Drops the first n bytes of the held text. */
static void hold_consume(stage *g, size_t n)
{
    if (n == 0) return;
    memmove(g->hold.data, g->hold.data + n, g->hold.len - n);
    g->hold.len -= n;
    g->hold.data[g->hold.len] = '\0';
}

/* HF ByteFallback's test: "<0x" + two characters u8::from_str_radix reads
 * in base 16 (which takes a leading '+') + ">". */
static bool byte_token(const char *p, size_t n, unsigned char *b)
{
    if (n != 6 || memcmp(p, "<0x", 3) != 0 || p[5] != '>') return false;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) {
            if (i == 3 && c == '+') continue;
            return false;
        }
        v = v * 16 + d;
    }
    *b = (unsigned char)v;
    return true;
}

/* Replace with a String pattern: non-overlapping, leftmost first, as the
 * escaped regex finds them. */
static void replace_literal(const tok_decoder *d, const char *p, size_t n, strbuf *out)
{
    size_t last = 0, i = 0;
    while (i + d->lit_len <= n) {
        const char *m = memmem(p + i, n - i, d->lit, d->lit_len);
        if (!m) break;
        size_t at = (size_t)(m - p);
        tok_put(out, p + last, at - last);
        tok_put(out, d->content, d->content_len);
        i = last = at + d->lit_len;
    }
    tok_put(out, p + last, n - last);
}

static ferry_status replace_regex(tok_stream *s, const tok_decoder *d, const char *p, size_t n, strbuf *out)
{
    if (!s->mc && !(s->mc = tok_match_ctx_new())) return ferry_fail(FERRY_ERR_NOMEM, "tokenizer: out of memory");
    tok_spans sp = {0};
    ferry_status st = tok_regex_find_all(d->re, s->mc, p, n, &sp);
    if (st == FERRY_OK) {
        size_t last = 0;
        for (size_t i = 0; i < sp.n; i++) {
            tok_put(out, p + last, sp.v[i].start - last);
            tok_put(out, d->content, d->content_len);
            last = sp.v[i].end;
        }
        tok_put(out, p + last, n - last);
    }
    free(sp.v);
    return st;
}

static void replace_whole(tok_stream *s, const tok_decoder *d, const char *p, size_t n, strbuf *out)
{
    if (d->lit) replace_literal(d, p, n, out);
    else set_err(s, replace_regex(s, d, p, n, out));
}

/* Metaspace: the replacement becomes a space, or nothing in the first token. */
static void metaspace_map(const tok_decoder *d, const char *p, size_t n, bool first, strbuf *out)
{
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = tok_utf8_next(p + i, n - i, &cp);
        if (cp == d->ch) {
            if (!(first && d->meta_prepend)) sb_putc(out, ' ');
        } else {
            tok_put(out, p + i, k);
        }
        i += k;
    }
}

/* Strip on a whole token: up to `start` leading and `stop` trailing content
 * characters removed. */
static void strip_whole(const tok_decoder *d, const char *p, size_t n, strbuf *out)
{
    size_t a = 0, b = n;
    for (size_t i = 0; i < d->start && a < n; i++) {
        uint32_t cp;
        size_t k = tok_utf8_next(p + a, n - a, &cp);
        if (cp != d->ch) break;
        a += k;
    }
    for (size_t i = 0; i < d->stop && b > a; i++) {
        size_t k = 1;
        while (k < b - a && ((unsigned char)p[b - k] & 0xC0) == 0x80) k++;
        uint32_t cp;
        tok_utf8_next(p + b - k, k, &cp);
        if (cp != d->ch) break;
        b -= k;
    }
    tok_put(out, p + a, b - a);
}

/* ByteLevel: a token whose characters all stand for bytes becomes those
 * bytes; any other token (an added token's text) stays as it is. */
static void byte_level_bytes(const char *p, size_t n, strbuf *out)
{
    size_t start = out->len;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = tok_utf8_next(p + i, n - i, &cp);
        int b = tok_char_byte(cp);
        if (b < 0) {
            out->len = start;
            tok_put(out, p, n);
            return;
        }
        char c = (char)b;
        tok_put(out, &c, 1);
        i += k;
    }
}

/* ---- the stages ------------------------------------------------------------------- */

static void flush_byte_run(tok_stream *s, size_t k, stage *g, strbuf *out)
{
    if (!g->hold.len) return;
    if (tok_utf8_valid(g->hold.data, g->hold.len)) {
        deliver(s, k + 1, g->hold.data, g->hold.len, true, out);
    } else {
        /* HF writes one U+FFFD per byte of a run that is not UTF-8 */
        size_t n = g->hold.len;
        for (size_t i = 0; i < n; i++) deliver(s, k + 1, "\xEF\xBF\xBD", 3, true, out);
    }
    hold_clear(g);
}

/* Passes on the held bytes of a ByteLevel stage that are final. */
static void byte_level_emit(tok_stream *s, size_t k, stage *g, bool final, strbuf *out)
{
    if (!g->hold.len) return;
    strbuf txt;
    sb_init(&txt);
    size_t held = 0;
    size_t used = tok_utf8_lossy(g->hold.data, g->hold.len, &txt, final ? NULL : &held);
    if (txt.oom) set_err(s, ferry_fail(FERRY_ERR_NOMEM, "tokenizer: out of memory"));
    if (txt.len) deliver(s, k + 1, txt.data, txt.len, false, out);
    sb_free(&txt);
    hold_consume(g, used);
}

static void stage_closed(tok_stream *s, size_t k, const char *p, size_t n, strbuf *out)
{
    const tok_decoder *d = &s->t->dec[k];
    stage *g = &s->st[k];
    strbuf tmp;
    sb_init(&tmp);
    size_t index = g->count++;
    switch (d->kind) {
    case TOK_DEC_REPLACE:
        replace_whole(s, d, p, n, &tmp);
        deliver(s, k + 1, tmp.data ? tmp.data : "", tmp.len, true, out);
        break;
    case TOK_DEC_STRIP:
        strip_whole(d, p, n, &tmp);
        deliver(s, k + 1, tmp.data ? tmp.data : "", tmp.len, true, out);
        break;
    case TOK_DEC_METASPACE:
        metaspace_map(d, p, n, index == 0, &tmp);
        deliver(s, k + 1, tmp.data ? tmp.data : "", tmp.len, true, out);
        break;
    case TOK_DEC_BYTE_FALLBACK: {
        unsigned char b;
        if (byte_token(p, n, &b)) {
            tok_put(&g->hold, &b, 1);
        } else {
            flush_byte_run(s, k, g, out);
            deliver(s, k + 1, p, n, true, out);
        }
        break;
    }
    case TOK_DEC_FUSE:
        deliver(s, k + 1, p, n, false, out);
        break;
    case TOK_DEC_BYTE_LEVEL:
        byte_level_bytes(p, n, &g->hold);
        byte_level_emit(s, k, g, false, out);
        break;
    }
    if (tmp.oom || g->hold.oom) set_err(s, ferry_fail(FERRY_ERR_NOMEM, "tokenizer: out of memory"));
    sb_free(&tmp);
}

/* Strip over the growing token, one character at a time. */
static void strip_fragment(tok_stream *s, size_t k, const char *p, size_t n, strbuf *out)
{
    const tok_decoder *d = &s->t->dec[k];
    stage *g = &s->st[k];
    strbuf tmp;
    sb_init(&tmp);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t c = tok_utf8_next(p + i, n - i, &cp);
        if (!g->lead_done) {
            if (g->lead < d->start && cp == d->ch) {
                g->lead++;
                i += c;
                continue;
            }
            g->lead_done = true;
        }
        if (d->stop > 0 && cp == d->ch) {
            tok_put(&g->hold, p + i, c);
            if (++g->trail > d->stop) { /* the oldest held one is no longer in the last `stop` */
                size_t first = tok_utf8_len((unsigned char)g->hold.data[0]);
                tok_put(&tmp, g->hold.data, first);
                hold_consume(g, first);
                g->trail--;
            }
        } else {
            tok_put(&tmp, g->hold.data, g->hold.len);
            hold_clear(g);
            g->trail = 0;
            tok_put(&tmp, p + i, c);
        }
        i += c;
    }
    if (tmp.len) deliver(s, k + 1, tmp.data, tmp.len, false, out);
    sb_free(&tmp);
}

/* Replace with a String pattern over the growing token: what precedes the
 * last len-1 bytes can no longer be part of a match. */
static void replace_fragment(tok_stream *s, size_t k, const char *p, size_t n, strbuf *out)
{
    const tok_decoder *d = &s->t->dec[k];
    stage *g = &s->st[k];
    tok_put(&g->hold, p, n);
    strbuf tmp;
    sb_init(&tmp);
    const char *h = g->hold.data;
    size_t len = g->hold.len, last = 0, i = 0;
    while (i + d->lit_len <= len) {
        const char *m = memmem(h + i, len - i, d->lit, d->lit_len);
        if (!m) break;
        size_t at = (size_t)(m - h);
        tok_put(&tmp, h + last, at - last);
        tok_put(&tmp, d->content, d->content_len);
        i = last = at + d->lit_len;
    }
    size_t safe = len >= d->lit_len - 1 ? len - (d->lit_len - 1) : 0;
    if (safe < last) safe = last;
    while (safe > last && safe < len && ((unsigned char)h[safe] & 0xC0) == 0x80) safe--;
    tok_put(&tmp, h + last, safe - last);
    hold_consume(g, safe);
    if (tmp.len) deliver(s, k + 1, tmp.data, tmp.len, false, out);
    sb_free(&tmp);
}

static void stage_fragment(tok_stream *s, size_t k, const char *p, size_t n, strbuf *out)
{
    const tok_decoder *d = &s->t->dec[k];
    stage *g = &s->st[k];
    switch (d->kind) {
    case TOK_DEC_REPLACE:
        if (d->lit) replace_fragment(s, k, p, n, out);
        else tok_put(&g->hold, p, n);
        break;
    case TOK_DEC_STRIP:
        strip_fragment(s, k, p, n, out);
        break;
    case TOK_DEC_METASPACE: {
        strbuf tmp;
        sb_init(&tmp);
        metaspace_map(d, p, n, true, &tmp);
        if (tmp.len) deliver(s, k + 1, tmp.data, tmp.len, false, out);
        sb_free(&tmp);
        break;
    }
    case TOK_DEC_FUSE:
        deliver(s, k + 1, p, n, false, out);
        break;
    case TOK_DEC_BYTE_FALLBACK:
    case TOK_DEC_BYTE_LEVEL:
        tok_put(&g->hold, p, n); /* decided on the whole token, at the end */
        break;
    }
    if (g->hold.oom) set_err(s, ferry_fail(FERRY_ERR_NOMEM, "tokenizer: out of memory"));
}

static void deliver(tok_stream *s, size_t k, const char *p, size_t n, bool closed, strbuf *out)
{
    if (k == s->t->n_dec) {
        /* no decoder at all: HF joins the tokens with spaces */
        if (!s->t->has_decoder && closed && s->n_sink++ > 0) sb_putc(out, ' ');
        tok_put(out, p, n);
        return;
    }
    if (s->frag[k]) stage_fragment(s, k, p, n, out);
    else stage_closed(s, k, p, n, out);
}

/* Passes on everything stage k still holds, then flushes the next stages. */
static void stage_flush(tok_stream *s, size_t k, strbuf *out)
{
    if (k == s->t->n_dec) return;
    const tok_decoder *d = &s->t->dec[k];
    stage *g = &s->st[k];
    if (!s->frag[k]) {
        if (d->kind == TOK_DEC_BYTE_FALLBACK) flush_byte_run(s, k, g, out);
        else if (d->kind == TOK_DEC_BYTE_LEVEL) byte_level_emit(s, k, g, true, out);
    } else {
        strbuf tmp;
        sb_init(&tmp);
        const char *h = g->hold.data ? g->hold.data : "";
        unsigned char b;
        switch (d->kind) {
        case TOK_DEC_REPLACE:
            if (d->lit) tok_put(&tmp, h, g->hold.len);
            else replace_whole(s, d, h, g->hold.len, &tmp);
            break;
        case TOK_DEC_BYTE_FALLBACK:
            if (byte_token(h, g->hold.len, &b)) {
                if (b < 0x80) tok_put(&tmp, &b, 1);
                else tok_put(&tmp, "\xEF\xBF\xBD", 3);
            } else {
                tok_put(&tmp, h, g->hold.len);
            }
            break;
        case TOK_DEC_BYTE_LEVEL: {
            strbuf bytes;
            sb_init(&bytes);
            byte_level_bytes(h, g->hold.len, &bytes);
            tok_utf8_lossy(bytes.data ? bytes.data : "", bytes.len, &tmp, NULL);
            sb_free(&bytes);
            break;
        }
        default: /* Strip drops its held trailing characters; the others hold nothing */
            break;
        }
        if (tmp.len) deliver(s, k + 1, tmp.data, tmp.len, false, out);
        sb_free(&tmp);
        hold_clear(g);
        g->trail = 0;
    }
    stage_flush(s, k + 1, out);
}

/* ---- the API -------------------------------------------------------------------------- */

tok_stream *tok_stream_new(const tokenizer *t, bool skip_special)
{
    tok_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->t = t;
    s->skip_special = skip_special;
    size_t n = t->n_dec ? t->n_dec : 1;
    s->frag = calloc(n, sizeof *s->frag);
    s->st = calloc(n, sizeof *s->st);
    if (!s->frag || !s->st) {
        tok_stream_free(s);
        return NULL;
    }
    bool joined = false;
    for (size_t k = 0; k < t->n_dec; k++) {
        s->frag[k] = joined;
        joined = joined || t->dec[k].kind == TOK_DEC_FUSE || t->dec[k].kind == TOK_DEC_BYTE_LEVEL;
    }
    return s;
}

void tok_stream_free(tok_stream *s)
{
    if (!s) return;
    if (s->st)
        for (size_t k = 0; k < (s->t->n_dec ? s->t->n_dec : 1); k++) sb_free(&s->st[k].hold);
    free(s->st);
    free(s->frag);
    tok_match_ctx_free(s->mc);
    free(s);
}

ferry_status tok_stream_push(tok_stream *s, int32_t id, strbuf *out)
{
    size_t n;
    const char *p = tok_id_text(s->t, id, &n);
    if (!p) return ferry_fail(FERRY_ERR_INVALID, "token id %d is outside the vocabulary (size %d)", (int)id,
                              (int)s->t->vocab_size);
    if (s->skip_special && s->t->skippable[id]) return FERRY_OK;
    deliver(s, 0, p, n, true, out);
    if (out->oom) set_err(s, ferry_fail(FERRY_ERR_NOMEM, "tokenizer: out of memory"));
    ferry_status st = s->err;
    s->err = FERRY_OK;
    return st;
}

void tok_stream_flush(tok_stream *s, strbuf *out)
{
    stage_flush(s, 0, out);
    s->err = FERRY_OK;
}

ferry_status tok_decode(const tokenizer *t, const int32_t *ids, int n, bool skip_special, strbuf *out)
{
    size_t len;
    for (int i = 0; i < n; i++)
        if (!tok_id_text(t, ids[i], &len))
            return ferry_fail(FERRY_ERR_INVALID, "token id %d (at %d) is outside the vocabulary (size %d)",
                              (int)ids[i], i, (int)t->vocab_size);
    tok_stream *s = tok_stream_new(t, skip_special);
    if (!s) return ferry_fail(FERRY_ERR_NOMEM, "tokenizer: out of memory");
    ferry_status st = FERRY_OK;
    for (int i = 0; i < n && st == FERRY_OK; i++) st = tok_stream_push(s, ids[i], out);
    if (st == FERRY_OK) {
        stage_flush(s, 0, out);
        st = s->err;
        if (st == FERRY_OK && out->oom) st = ferry_fail(FERRY_ERR_NOMEM, "tokenizer: out of memory");
    }
    tok_stream_free(s);
    return st;
}
