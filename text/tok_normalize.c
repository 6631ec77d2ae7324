/*
 * tok_normalize.c - the normalizers of tokenizer.json (NFC, NFD, NFKC,
 * NFKD through utf8proc; Lowercase, Prepend, Replace, Strip), run as HF
 * tokenizers runs them on each stretch of text between added tokens, and on
 * each added token's content when the tokenizer loads.
 *
 * Beside the text, each step carries forward how many leading bytes come
 * from the original text's first character: HF's alignments reduced to the
 * one question they answer for the ids, Metaspace's "first" prepend scheme
 * (see tok_normalize in tok_internal.h).
 */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "../engine/base/util.h"
#include "tok_internal.h"

static ferry_status oom(void) { return ferry_fail(FERRY_ERR_NOMEM, "tokenizer: out of memory"); }

static ferry_status norm_unicode(tok_norm_kind kind, const char *s, size_t n, strbuf *out)
{
    int opt = UTF8PROC_STABLE;
    switch (kind) {
    case TOK_NORM_NFC: opt |= UTF8PROC_COMPOSE; break;
    case TOK_NORM_NFD: opt |= UTF8PROC_DECOMPOSE; break;
    case TOK_NORM_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    default: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    if (n == 0) return FERRY_OK;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, (utf8proc_option_t)opt);
    if (r < 0) {
        free(dst);
        return r == UTF8PROC_ERROR_NOMEM ? oom()
                                         : ferry_fail(FERRY_ERR_INTERNAL, "tokenizer: normalization failed: %s",
                                                      utf8proc_errmsg(r));
    }
    if (out->len == 0 && !out->oom) {
        /* utf8proc's buffer (r bytes and a NUL) becomes out's: no copy of the text */
        free(out->data);
        out->data = (char *)dst;
        out->len = (size_t)r;
        out->cap = (size_t)r + 1;
        return FERRY_OK;
    }
    tok_put(out, dst, (size_t)r);
    free(dst);
    return FERRY_OK;
}

/* Rust's char::to_lowercase: the simple mapping, except U+0130, whose full
 * lowercase is two characters. */
static void norm_lowercase(const char *s, size_t n, strbuf *out)
{
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = tok_utf8_next(s + i, n - i, &cp);
        if (cp < 0x80) {
            sb_putc(out, (char)(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
        } else if (cp == 0x130) {
            tok_put(out, "i\xCC\x87", 3);
        } else {
            char buf[4];
            tok_put(out, buf, util_utf8_put(buf, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp)));
        }
        i += k;
    }
}

/* HF replace(): every match of the pattern becomes the content, aligned
 * with the last character it replaces (with the text's start when the
 * match is empty and at 0). The matches are taken one at a time: a text of
 * spaces is one match a byte. */
static ferry_status norm_replace(tok_match_ctx *mc, const tok_normalizer *nz, const char *s, size_t n, strbuf *out,
                                 size_t *zero)
{
    tok_regex_iter it = {0};
    size_t last = 0, z = 0, base = out->len;
    bool zeroing = *zero > 0;
    for (;;) {
        tok_span m;
        bool found;
        FERRY_TRY(tok_regex_next(nz->re, mc, s, n, &it, &m, &found));
        if (!found) break;
        size_t a = m.start, b = m.end;
        tok_put(out, s + last, a - last);
        if (zeroing) {
            if (a > *zero) {
                z += *zero > last ? *zero - last : 0;
                zeroing = false;
            } else {
                z += a - last;
            }
        }
        tok_put(out, nz->str, nz->str_len);
        if (zeroing) {
            if (b == 0 || b - 1 < *zero) z += nz->str_len;
            else zeroing = false;
        }
        last = b;
    }
    tok_put(out, s + last, n - last);
    if (zeroing) z += *zero > last ? *zero - last : 0;
    *zero = z > out->len - base ? out->len - base : z;
    return FERRY_OK;
}

static void norm_strip(const tok_normalizer *nz, const char *s, size_t n, strbuf *out, size_t *zero)
{
    size_t a = 0, b = n;
    if (nz->left)
        while (a < b) {
            uint32_t cp;
            size_t k = tok_utf8_next(s + a, b - a, &cp);
            if (!tok_is_white_space(cp)) break;
            a += k;
        }
    if (nz->right)
        while (b > a) {
            size_t k = 1;
            while (k < b - a && ((unsigned char)s[b - k] & 0xC0) == 0x80) k++;
            uint32_t cp;
            tok_utf8_next(s + b - k, k, &cp);
            if (!tok_is_white_space(cp)) break;
            b -= k;
        }
    *zero = *zero > a ? *zero - a : 0;
    if (*zero > b - a) *zero = b - a;
    tok_put(out, s + a, b - a);
}

/* The length of the normalized form of s[0..z): the bytes the first
 * character becomes (unicode forms and lowercase map it on its own). */
static ferry_status zero_after(const tok_normalizer *nz, const char *s, size_t z, size_t *out)
{
    strbuf tmp;
    sb_init(&tmp);
    ferry_status st = FERRY_OK;
    if (nz->kind == TOK_NORM_LOWERCASE) norm_lowercase(s, z, &tmp);
    else st = norm_unicode(nz->kind, s, z, &tmp);
    *out = tmp.len;
    if (tmp.oom) st = oom();
    sb_free(&tmp);
    return st;
}

/* ---- tok_encode_size: an upper bound on the normalized text's bytes ---- */

enum { GROWN_MAX_CPS = 256 }; /* U+FDFA's compatibility decomposition is 18 */

static size_t add_sat(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }
static size_t mul_sat(size_t a, size_t b) { return b && a > SIZE_MAX / b ? SIZE_MAX : a * b; }

/* The most n code points become through the normalizers from step `from`
 * on, in bytes, without following them: each step's most code points for
 * one (lowercase 2, a Unicode form 18 - U+FDFA -, a one-character Replace
 * its content's), 4 bytes each. char_grown's bound once its scratch is
 * too small (a Replace whose content is long). */
static size_t grown_bound(const tokenizer *t, size_t from, size_t n)
{
    for (size_t i = from; i < t->n_norm; i++) {
        const tok_normalizer *nz = &t->norm[i];
        size_t per = 1;
        if (nz->kind == TOK_NORM_LOWERCASE) per = 2;
        else if (nz->kind == TOK_NORM_NFC || nz->kind == TOK_NORM_NFD || nz->kind == TOK_NORM_NFKC ||
                 nz->kind == TOK_NORM_NFKD) per = 18;
        else if (nz->kind == TOK_NORM_REPLACE && nz->lit_cp >= 0) per = nz->str_len ? nz->str_len : 1;
        n = mul_sat(n, per);
    }
    return mul_sat(n, 4);
}

/* What one character becomes through the normalizers from step `from` on:
 * a Unicode form at the character's full decomposition (what composition
 * then does only shortens it), lowercase as norm_lowercase maps, a Replace
 * of that one character by its content. Replaces of other patterns,
 * Prepend and Strip leave it as it is here (tok_encode_size adds theirs).
 * Returns its bytes; past the scratch, grown_bound's. */
static size_t char_grown(const tokenizer *t, size_t from, uint32_t cp)
{
    utf8proc_int32_t a[GROWN_MAX_CPS], b[GROWN_MAX_CPS];
    size_t n = 1;
    a[0] = (utf8proc_int32_t)cp;
    for (size_t i = from; i < t->n_norm; i++) {
        const tok_normalizer *nz = &t->norm[i];
        size_t m = 0;
        switch (nz->kind) {
        case TOK_NORM_LOWERCASE:
            for (size_t j = 0; j < n; j++) {
                if (m + 2 > GROWN_MAX_CPS) return grown_bound(t, i, n);
                if (a[j] == 0x130) b[m++] = 'i', b[m++] = 0x307;
                else b[m++] = utf8proc_tolower(a[j]);
            }
            break;
        case TOK_NORM_NFC:
        case TOK_NORM_NFD:
        case TOK_NORM_NFKC:
        case TOK_NORM_NFKD: {
            int opt = UTF8PROC_DECOMPOSE | (nz->kind == TOK_NORM_NFKC || nz->kind == TOK_NORM_NFKD ? UTF8PROC_COMPAT : 0);
            for (size_t j = 0; j < n; j++) {
                int last = 0;
                utf8proc_ssize_t r = utf8proc_decompose_char(a[j], b + m, (utf8proc_ssize_t)(GROWN_MAX_CPS - m),
                                                             (utf8proc_option_t)opt, &last);
                if (r < 0 || (size_t)r > GROWN_MAX_CPS - m) return grown_bound(t, i, n);
                m += (size_t)r;
            }
            break;
        }
        case TOK_NORM_REPLACE:
            if (nz->lit_cp < 0) continue;
            for (size_t j = 0; j < n; j++) {
                if (a[j] != nz->lit_cp) {
                    if (m == GROWN_MAX_CPS) return grown_bound(t, i, n);
                    b[m++] = a[j];
                    continue;
                }
                for (size_t k = 0; k < nz->str_len;) {
                    uint32_t c;
                    k += tok_utf8_next(nz->str + k, nz->str_len - k, &c);
                    if (m == GROWN_MAX_CPS) return grown_bound(t, i, n);
                    b[m++] = (utf8proc_int32_t)c;
                }
            }
            break;
        default:
            continue;
        }
        memcpy(a, b, m * sizeof *a);
        n = m;
    }
    size_t bytes = 0;
    char tmp[4];
    for (size_t j = 0; j < n; j++) bytes += util_utf8_put(tmp, (uint32_t)a[j]);
    return bytes;
}

/* The bytes s[0..n) (valid UTF-8: a normalizer's text) becomes through the
 * normalizers from step `from` on, as char_grown counts. */
static size_t text_grown(const tokenizer *t, size_t from, const char *s, size_t n)
{
    size_t bytes = 0;
    for (size_t k = 0; k < n;) {
        uint32_t c;
        k += tok_utf8_next(s + k, n - k, &c);
        bytes = add_sat(bytes, char_grown(t, from, c));
    }
    return bytes;
}

size_t tok_encode_size(const tokenizer *t, const char *s, size_t n)
{
    bool maps = false; /* a step that can lengthen a character */
    for (size_t i = 0; i < t->n_norm; i++)
        maps |= t->norm[i].kind <= TOK_NORM_LOWERCASE || (t->norm[i].kind == TOK_NORM_REPLACE && t->norm[i].lit_cp >= 0);
    size_t ascii[128];
    for (uint32_t c = 0; c < 128; c++) ascii[c] = maps ? char_grown(t, 0, c) : 1;
    size_t size = 0;
    for (size_t i = 0; i < n;) {
        unsigned char b = (unsigned char)s[i];
        if (b < 0x80) {
            size = add_sat(size, ascii[b]);
            i++;
            continue;
        }
        uint32_t cp;
        size_t k = tok_utf8_char(s + i, n - i, &cp);
        size = add_sat(size, maps ? char_grown(t, 0, cp) : cp == 0xFFFD ? 3 : k);
        i += k;
    }
    /* Prepend: its text once a stretch, the stretches cut by the added
     * tokens matched before normalizing (each at least min_raw bytes) */
    size_t min_raw = 0;
    for (size_t i = 0; i < t->n_added; i++)
        if (!t->added[i].normalized && t->added[i].len && (!min_raw || t->added[i].len < min_raw))
            min_raw = t->added[i].len;
    size_t stretches = 1 + (min_raw ? n / min_raw : 0);
    for (size_t i = 0; i < t->n_norm; i++)
        if (t->norm[i].kind == TOK_NORM_PREPEND)
            size = add_sat(size, mul_sat(stretches, text_grown(t, i + 1, t->norm[i].str, t->norm[i].str_len)));
    /* a Replace of any other pattern: any byte it sees may be (part of) a
     * match made into its content; one that may match "" also adds the
     * content at every position */
    for (size_t i = 0; i < t->n_norm; i++) {
        const tok_normalizer *nz = &t->norm[i];
        if (nz->kind != TOK_NORM_REPLACE || nz->lit_cp >= 0) continue;
        size_t c = text_grown(t, i + 1, nz->str, nz->str_len);
        size_t per = (c > 1 ? c : 1) + (nz->may_match_empty ? c : 0);
        size = add_sat(mul_sat(size, per), nz->may_match_empty ? c : 0);
    }
    return size;
}

ferry_status tok_normalize(const tokenizer *t, tok_match_ctx *mc, const char *s, size_t n, strbuf *out,
                           size_t *zero)
{
    /* the steps write to out and tmp in turn, the last one to out */
    strbuf tmp;
    sb_init(&tmp);
    ferry_status st = FERRY_OK;
    const char *cur = s;
    size_t cur_n = n;
    out->len = 0;
    if (t->n_norm == 0) tok_put(out, s, n);
    for (size_t i = 0; i < t->n_norm; i++) {
        const tok_normalizer *nz = &t->norm[i];
        strbuf *dst = (t->n_norm - 1 - i) % 2 ? &tmp : out;
        dst->len = 0;
        if (dst->data) dst->data[0] = '\0';
        switch (nz->kind) {
        case TOK_NORM_NFC:
        case TOK_NORM_NFD:
        case TOK_NORM_NFKC:
        case TOK_NORM_NFKD:
            st = norm_unicode(nz->kind, cur, cur_n, dst);
            if (st == FERRY_OK && *zero) st = zero_after(nz, cur, *zero, zero);
            break;
        case TOK_NORM_LOWERCASE:
            norm_lowercase(cur, cur_n, dst);
            if (*zero) st = zero_after(nz, cur, *zero, zero);
            break;
        case TOK_NORM_PREPEND:
            if (cur_n) {
                tok_put(dst, nz->str, nz->str_len);
                if (*zero) *zero += nz->str_len; /* aligned with the first character */
            }
            tok_put(dst, cur, cur_n);
            break;
        case TOK_NORM_REPLACE:
            st = norm_replace(mc, nz, cur, cur_n, dst, zero);
            break;
        case TOK_NORM_STRIP:
            norm_strip(nz, cur, cur_n, dst, zero);
            break;
        }
        if (st != FERRY_OK) goto done;
        if (dst->oom) {
            st = oom();
            goto done;
        }
        cur = dst->data ? dst->data : "";
        cur_n = dst->len;
        if (*zero > cur_n) *zero = cur_n;
    }
    if (out->oom) st = oom();
    /* the text is held while it is encoded: without the room doubling left */
    if (st == FERRY_OK && out->cap > out->len + out->len / 8 + 4096) {
        char *d = realloc(out->data, out->len + 1);
        if (d) {
            out->data = d;
            out->cap = out->len + 1;
        }
    }
done:
    sb_free(&tmp);
    return st;
}
