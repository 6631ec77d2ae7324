/*
 * tmpl_str.c - Python's str for chat templates: the str methods templates
 * call (strip, split, startswith, replace, format, ...), the string work of
 * jinja2's filters (case, trim, title, indent, escape), printf-style `%`
 * formatting, format specs, and int()/float() of a str.
 *
 * Strings are UTF-8; positions, lengths and widths count code points as
 * Python does, and whitespace is str.isspace(). Case mappings are Unicode's
 * simple one-to-one mappings (utf8proc): Python's full mappings differ for
 * a few characters ('ß'.upper() is 'SS' in Python, 'ß' here).
 */
#define _GNU_SOURCE /* memmem */
#include "../engine/base/util.h"
#include "tmpl_internal.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <utf8proc.h>

/* ---- Unicode case ------------------------------------------------------ */


static uint32_t case_cp(uint32_t c, int mode)
{
    if (c < 0x80) {
        if (mode == TMPL_CASE_UPPER || mode == TMPL_CASE_TITLE) return (c >= 'a' && c <= 'z') ? c - 32 : c;
        if (mode == TMPL_CASE_LOWER) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
        if (c >= 'a' && c <= 'z') return c - 32;
        if (c >= 'A' && c <= 'Z') return c + 32;
        return c;
    }
    /* simple (one to one) mappings: Python's full mappings (ß -> SS) differ */
    switch (mode) {
    case TMPL_CASE_UPPER: return (uint32_t)utf8proc_toupper((utf8proc_int32_t)c);
    case TMPL_CASE_LOWER: return (uint32_t)utf8proc_tolower((utf8proc_int32_t)c);
    case TMPL_CASE_TITLE: return (uint32_t)utf8proc_totitle((utf8proc_int32_t)c);
    default: {
        uint32_t u = (uint32_t)utf8proc_toupper((utf8proc_int32_t)c);
        return u != c ? u : (uint32_t)utf8proc_tolower((utf8proc_int32_t)c);
    }
    }
}

static bool cp_is_cased(uint32_t c)
{
    if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

static bool cp_is_upper(uint32_t c)
{
    if (c < 0x80) return c >= 'A' && c <= 'Z';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT;
}

static bool cp_is_lower(uint32_t c)
{
    if (c < 0x80) return c >= 'a' && c <= 'z';
    return utf8proc_category((utf8proc_int32_t)c) == UTF8PROC_CATEGORY_LL;
}

static bool cp_is_alpha(uint32_t c)
{
    if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}

static bool cp_is_decimal(uint32_t c)
{
    if (c < 0x80) return c >= '0' && c <= '9';
    return utf8proc_category((utf8proc_int32_t)c) == UTF8PROC_CATEGORY_ND;
}

static bool cp_is_numeric(uint32_t c)
{
    if (c < 0x80) return c >= '0' && c <= '9';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

/* a string with every code point mapped; mode per character via fn */
bool tmpl_str_case(trender *r, const char *s, size_t n, int mode, tval *out)
{
    char *d = tmpl_ralloc(r, n * 2 + 4); /* simple mappings change length by at most 1 byte per char */
    if (!d) return false;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += tmpl_utf8_decode((const unsigned char *)s + i, n - i, &cp);
        k += util_utf8_put(d + k, case_cp(cp, mode));
    }
    d[k] = '\0';
    *out = tv_str(d, k);
    return tmpl_charge(r, n / 16);
}

/* Python's str.title() and str.capitalize() */
bool tmpl_str_title(trender *r, const char *s, size_t n, bool capitalize, tval *out)
{
    char *d = tmpl_ralloc(r, n * 2 + 4);
    if (!d) return false;
    size_t k = 0;
    bool prev_cased = false, first = true;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += tmpl_utf8_decode((const unsigned char *)s + i, n - i, &cp);
        uint32_t m;
        if (capitalize) m = first ? case_cp(cp, TMPL_CASE_TITLE) : case_cp(cp, TMPL_CASE_LOWER);
        else m = prev_cased ? case_cp(cp, TMPL_CASE_LOWER) : case_cp(cp, TMPL_CASE_TITLE);
        prev_cased = cp_is_cased(cp);
        first = false;
        k += util_utf8_put(d + k, m);
    }
    d[k] = '\0';
    *out = tv_str(d, k);
    return tmpl_charge(r, n / 16);
}

/* jinja's wordcount: runs of \w (letters, digits, underscore) */
int64_t tmpl_str_wordcount(const char *p, size_t n)
{
    int64_t words = 0;
    bool in_word = false;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += tmpl_utf8_decode((const unsigned char *)p + i, n - i, &cp);
        bool w = cp == '_' || cp_is_alpha(cp) || cp_is_numeric(cp);
        if (w && !in_word) words++;
        in_word = w;
    }
    return words;
}

/* ---- str helpers ------------------------------------------------------ */

static bool in_chars(uint32_t cp, const tval *chars)
{
    if (!chars) return tmpl_py_isspace(cp);
    for (size_t i = 0; i < chars->s.n;) {
        uint32_t c;
        i += tmpl_utf8_decode((const unsigned char *)chars->s.p + i, chars->s.n - i, &c);
        if (c == cp) return true;
    }
    return false;
}

/* strip from the left and/or right; chars NULL: whitespace */
static void strip(const char *s, size_t n, const tval *chars, bool left, bool right, size_t *b, size_t *e)
{
    size_t i = 0, j = n;
    if (left)
        while (i < n) {
            uint32_t cp;
            size_t k = tmpl_utf8_decode((const unsigned char *)s + i, n - i, &cp);
            if (!in_chars(cp, chars)) break;
            i += k;
        }
    if (right)
        while (j > i) {
            size_t st = j - 1;
            while (st > i && ((unsigned char)s[st] & 0xC0) == 0x80) st--;
            uint32_t cp;
            tmpl_utf8_decode((const unsigned char *)s + st, j - st, &cp);
            if (!in_chars(cp, chars)) break;
            j = st;
        }
    *b = i;
    *e = j;
}

bool tmpl_str_strip(trender *r, const tval *s, const tval *chars, bool left, bool right, tval *out)
{
    if (chars && chars->kind == TV_NONE) chars = NULL;
    if (chars && !tmpl_arg_str(r, chars, "strip arg")) return false;
    size_t b, e;
    if (!tmpl_charge(r, s->s.n / 16)) return false;
    strip(s->s.p, s->s.n, chars, left, right, &b, &e);
    *out = tv_str(s->s.p + b, e - b);
    return true;
}

static bool push_str(trender *r, tlist *l, size_t *cap, const char *p, size_t n)
{
    return tmpl_list_push(r, l, cap, tv_str(p, n));
}

/* str.split / str.rsplit */
static bool do_split(trender *r, const tval *s, const tval *sep, int64_t maxsplit, bool from_right, tval *out)
{
    tlist *l = tmpl_list_new(r, 0, LF_LIST);
    size_t cap = 0;
    if (!l || !tmpl_charge(r, s->s.n / 16)) return false;
    const char *p = s->s.p;
    size_t n = s->s.n;
    if (maxsplit < 0) maxsplit = INT64_MAX;
    if (sep && sep->kind != TV_NONE) {
        if (!tmpl_arg_str(r, sep, "separator")) return false;
        size_t m = sep->s.n;
        if (m == 0) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: empty separator", r->line);
        if (!from_right) {
            size_t start = 0;
            while (maxsplit > 0) {
                const char *hit = m <= n - start ? memmem(p + start, n - start, sep->s.p, m) : NULL;
                if (!hit) break;
                if (!push_str(r, l, &cap, p + start, (size_t)(hit - (p + start)))) return false;
                start = (size_t)(hit - p) + m;
                maxsplit--;
            }
            if (!push_str(r, l, &cap, p + start, n - start)) return false;
        } else {
            /* collect from the right, then reverse */
            size_t end = n;
            while (maxsplit > 0 && end >= m) {
                size_t i = end - m + 1;
                const char *hit = NULL;
                while (i-- > 0)
                    if (memcmp(p + i, sep->s.p, m) == 0) {
                        hit = p + i;
                        break;
                    }
                if (!hit) break;
                if (!push_str(r, l, &cap, hit + m, end - (size_t)(hit - p) - m)) return false;
                end = (size_t)(hit - p);
                maxsplit--;
            }
            if (!push_str(r, l, &cap, p, end)) return false;
            for (size_t i = 0; i < l->n / 2; i++) {
                tval t = l->items[i];
                l->items[i] = l->items[l->n - 1 - i];
                l->items[l->n - 1 - i] = t;
            }
        }
    } else {
        /* runs of whitespace; no empty strings */
        if (!from_right) {
            size_t i = 0;
            for (;;) {
                while (i < n) {
                    uint32_t cp;
                    size_t k = tmpl_utf8_decode((const unsigned char *)p + i, n - i, &cp);
                    if (!tmpl_py_isspace(cp)) break;
                    i += k;
                }
                if (i >= n) break;
                if (maxsplit == 0) {
                    size_t b, e;
                    strip(p + i, n - i, NULL, false, true, &b, &e);
                    if (!push_str(r, l, &cap, p + i, e)) return false;
                    break;
                }
                size_t j = i;
                while (j < n) {
                    uint32_t cp;
                    size_t k = tmpl_utf8_decode((const unsigned char *)p + j, n - j, &cp);
                    if (tmpl_py_isspace(cp)) break;
                    j += k;
                }
                if (!push_str(r, l, &cap, p + i, j - i)) return false;
                maxsplit--;
                i = j;
            }
        } else {
            size_t j = n;
            for (;;) {
                size_t b, e;
                strip(p, j, NULL, false, true, &b, &e);
                j = e;
                if (j == 0) break;
                if (maxsplit == 0) {
                    strip(p, j, NULL, true, false, &b, &e);
                    if (!push_str(r, l, &cap, p + b, j - b)) return false;
                    break;
                }
                size_t i = j;
                while (i > 0) {
                    size_t st = i - 1;
                    while (st > 0 && ((unsigned char)p[st] & 0xC0) == 0x80) st--;
                    uint32_t cp;
                    tmpl_utf8_decode((const unsigned char *)p + st, i - st, &cp);
                    if (tmpl_py_isspace(cp)) break;
                    i = st;
                }
                if (!push_str(r, l, &cap, p + i, j - i)) return false;
                maxsplit--;
                j = i;
            }
            for (size_t i = 0; i < l->n / 2; i++) {
                tval t = l->items[i];
                l->items[i] = l->items[l->n - 1 - i];
                l->items[l->n - 1 - i] = t;
            }
        }
    }
    *out = tv_list(l);
    return true;
}

/* Python's line boundaries (str.splitlines); the end of the line break at i, 0 if none */
static size_t line_break_at(const char *s, size_t n, size_t i)
{
    unsigned char c = (unsigned char)s[i];
    if (c == '\r') return (i + 1 < n && s[i + 1] == '\n') ? i + 2 : i + 1;
    if (c == '\n' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E) return i + 1;
    if (c >= 0x80) {
        uint32_t cp;
        size_t k = tmpl_utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (cp == 0x85 || cp == 0x2028 || cp == 0x2029) return i + k;
    }
    return 0;
}

static bool splitlines(trender *r, const char *s, size_t n, bool keepends, tlist **out)
{
    tlist *l = tmpl_list_new(r, 0, LF_LIST);
    size_t cap = 0;
    if (!l || !tmpl_charge(r, n / 16)) return false;
    size_t start = 0, i = 0;
    while (i < n) {
        size_t e = line_break_at(s, n, i);
        if (e) {
            if (!push_str(r, l, &cap, s + start, (keepends ? e : i) - start)) return false;
            start = i = e;
        } else {
            i++;
        }
    }
    if (start < n && !push_str(r, l, &cap, s + start, n - start)) return false;
    *out = l;
    return true;
}

/* str.replace(old, new, count) */
bool tmpl_str_replace(trender *r, const tval *s, const tval *old, const tval *new_, int64_t count, tval *out)
{
    if (count < 0) count = INT64_MAX;
    strbuf sb;
    sb_init(&sb);
    const char *p = s->s.p;
    size_t n = s->s.n, m = old->s.n;
    if (m == 0) {
        /* the new text between every character and at both ends */
        size_t i = 0;
        if (count > 0) {
            sb_append(&sb, new_->s.p, new_->s.n);
            count--;
        }
        while (i < n) {
            uint32_t cp;
            size_t k = tmpl_utf8_decode((const unsigned char *)p + i, n - i, &cp);
            sb_append(&sb, p + i, k);
            i += k;
            if (count > 0) {
                sb_append(&sb, new_->s.p, new_->s.n);
                count--;
            }
            if (sb.len > r->arena.limit) break;
        }
    } else {
        size_t i = 0;
        while (count > 0 && i + m <= n) {
            const char *hit = memmem(p + i, n - i, old->s.p, m);
            if (!hit) break;
            sb_append(&sb, p + i, (size_t)(hit - (p + i)));
            sb_append(&sb, new_->s.p, new_->s.n);
            i = (size_t)(hit - p) + m;
            count--;
            if (sb.len > r->arena.limit) break;
        }
        sb_append(&sb, p + i, n - i);
    }
    if (sb.len > r->arena.limit) {
        sb_free(&sb);
        return tmpl_fail(r, FERRY_ERR_TOO_LARGE, "line %d: string too large", r->line);
    }
    return tmpl_sb_out(r, &sb, out);
}

/* ---- number parsing (Python's int() and float() of a str) -------------- */

/* the text with surrounding whitespace removed, in a NUL-terminated copy
 * without underscores between digits; false when an underscore is misplaced */
static bool clean_number(const tval *s, char *buf, size_t bufsz, bool allow_alpha_digits)
{
    size_t b, e;
    strip(s->s.p, s->s.n, NULL, true, true, &b, &e);
    if (e - b == 0 || e - b >= bufsz) return false;
    size_t k = 0;
    for (size_t i = b; i < e; i++) {
        char c = s->s.p[i];
        if ((unsigned char)c >= 0x80) return false;
        if (c == '_') {
            bool prev_ok = i > b && (isalnum((unsigned char)s->s.p[i - 1]));
            bool next_ok = i + 1 < e && (isalnum((unsigned char)s->s.p[i + 1]));
            if (!prev_ok || !next_ok) return false;
            if (!allow_alpha_digits && (!isdigit((unsigned char)s->s.p[i - 1]) || !isdigit((unsigned char)s->s.p[i + 1])))
                return false;
            continue;
        }
        buf[k++] = c;
    }
    buf[k] = '\0';
    return true;
}

bool tmpl_parse_int(const tval *s, int base, int64_t *out, bool *overflow)
{
    char buf[128];
    *overflow = false;
    if (!clean_number(s, buf, sizeof buf, true)) return false;
    const char *p = buf;
    bool neg = false;
    if (*p == '+' || *p == '-') neg = *p++ == '-';
    if (base == 0 || base == 16 || base == 8 || base == 2) {
        if (p[0] == '0' && (p[1] | 0x20) == 'x' && (base == 0 || base == 16)) { base = 16; p += 2; }
        else if (p[0] == '0' && (p[1] | 0x20) == 'o' && (base == 0 || base == 8)) { base = 8; p += 2; }
        else if (p[0] == '0' && (p[1] | 0x20) == 'b' && (base == 0 || base == 2)) { base = 2; p += 2; }
        else if (base == 0) {
            base = 10;
            if (p[0] == '0') /* base 0: no leading zeros except 0 itself */
                for (const char *q = p; *q; q++)
                    if (*q != '0') return false;
        }
    }
    if (base < 2 || base > 36 || !*p) return false;
    uint64_t v = 0;
    for (; *p; p++) {
        int d = isdigit((unsigned char)*p) ? *p - '0' : isalpha((unsigned char)*p) ? ((*p | 0x20) - 'a' + 10) : 99;
        if (d >= base) return false;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) { *overflow = true; return false; }
        v = v * (uint64_t)base + (uint64_t)d;
    }
    if (v > (uint64_t)INT64_MAX + (neg ? 1u : 0u)) { *overflow = true; return false; }
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

bool tmpl_parse_float(const tval *s, double *out)
{
    char buf[128];
    if (!clean_number(s, buf, sizeof buf, false)) return false;
    const char *p = buf;
    const char *q = p + (*p == '+' || *p == '-');
    if (!strcasecmp(q, "inf") || !strcasecmp(q, "infinity") || !strcasecmp(q, "nan")) {
        double v = (q[0] | 0x20) == 'n' ? NAN : INFINITY;
        *out = *p == '-' ? -v : v;
        return true;
    }
    bool digit = false;
    for (const char *c = q; *c; c++) {
        if (isdigit((unsigned char)*c)) digit = true;
        else if (!strchr(".eE+-", *c)) return false;
    }
    if (!digit) return false;
    char *end;
    *out = strtod(p, &end);
    return *end == '\0';
}

/* ---- formatting ------------------------------------------------------- */

typedef struct {
    char fill, align, sign;
    bool alt, zero;
    int64_t width, prec; /* -1: none */
    char type;
    char group;
} fspec;

static void pad_out(strbuf *sb, const char *body, size_t n, size_t cps, const fspec *f, char dflt_align)
{
    char align = f->align ? f->align : dflt_align;
    size_t width = f->width > 0 ? (size_t)f->width : 0;
    size_t pad = width > cps ? width - cps : 0;
    char fill[8];
    size_t fl = util_utf8_put(fill, (uint32_t)(unsigned char)(f->fill ? f->fill : ' '));
    size_t left = align == '<' ? 0 : align == '^' ? pad / 2 : pad;
    for (size_t i = 0; i < left; i++) sb_append(sb, fill, fl);
    sb_append(sb, body, n);
    for (size_t i = left; i < pad; i++) sb_append(sb, fill, fl);
}

/* digits with thousands grouping */
static void group_digits(strbuf *out, const char *in, size_t n, char sep)
{
    for (size_t i = 0; i < n; i++) {
        if (i && (n - i) % 3 == 0) sb_putc(out, sep);
        sb_putc(out, in[i]);
    }
}

/* a number formatted by type with sign, zero padding and width */
static bool format_number(trender *r, const tval *v, const fspec *f, strbuf *sb)
{
    char type = f->type;
    char digits[160]; /* %.*f with precision <= 100 of any double fits in 420; see below */
    strbuf body;
    sb_init(&body);
    bool neg = false;
    if (strchr("dioxXbcu", type)) {
        int64_t x;
        if (v->kind == TV_FLOAT) {
            if (type != 'd' && type != 'i' && type != 'u')
                return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: %%%c format: an integer is required, not float", r->line, type);
            if (!isfinite(v->f) || fabs(v->f) >= 9.2e18) return tmpl_fail(r, FERRY_ERR_UNSUPPORTED, "line %d: number too large to format", r->line);
            x = (int64_t)v->f;
        } else {
            x = tv_int_of(v);
        }
        uint64_t ux = x < 0 ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
        neg = x < 0;
        if (type == 'c') {
            if (x < 0 || x > 0x10FFFF) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: %%c arg not in range(0x110000)", r->line);
            char ch[4];
            size_t k = util_utf8_put(ch, (uint32_t)x);
            pad_out(sb, ch, k, 1, f, '>');
            return true;
        }
        if (type == 'x' || type == 'X') snprintf(digits, sizeof digits, type == 'x' ? "%llx" : "%llX", (unsigned long long)ux);
        else if (type == 'o') snprintf(digits, sizeof digits, "%llo", (unsigned long long)ux);
        else if (type == 'b') {
            int k = 0;
            char tmp[70];
            do { tmp[k++] = (char)('0' + (ux & 1)); ux >>= 1; } while (ux);
            for (int i = 0; i < k; i++) digits[i] = tmp[k - 1 - i];
            digits[k] = '\0';
        } else snprintf(digits, sizeof digits, "%llu", (unsigned long long)ux);
        if (f->alt) sb_puts(&body, type == 'x' ? "0x" : type == 'X' ? "0X" : type == 'o' ? "0o" : type == 'b' ? "0b" : "");
        size_t dl = strlen(digits);
        /* printf-style precision: at least that many digits */
        for (int64_t i = (int64_t)dl; f->prec >= 0 && i < f->prec && i < 1000; i++) sb_putc(&body, '0');
        if (f->group && (type == 'd' || type == 'u')) group_digits(&body, digits, dl, f->group);
        else sb_puts(&body, digits);
    } else {
        double x = tv_num_of(v);
        neg = signbit(x) && !isnan(x);
        double ax = fabs(x);
        int prec = f->prec >= 0 ? (int)(f->prec > 100 ? 100 : f->prec) : 6;
        char t = type;
        if (t == '%') {
            ax *= 100;
            t = 'f';
        }
        char *text = NULL;
        if (!isfinite(ax)) {
            bool up = t >= 'A' && t <= 'Z';
            sb_puts(&body, isnan(ax) ? (up ? "NAN" : "nan") : (up ? "INF" : "inf"));
        } else if (t == 'r') {
            tmpl_float_repr(ax, digits, sizeof digits);
            sb_puts(&body, digits);
        } else {
            char fmt[16];
            snprintf(fmt, sizeof fmt, "%%%s.*%c", f->alt ? "#" : "", t);
            int len = snprintf(NULL, 0, fmt, prec, ax);
            text = len > 0 ? malloc((size_t)len + 1) : NULL;
            if (!text) return tmpl_fail(r, FERRY_ERR_NOMEM, "out of memory rendering the chat template");
            snprintf(text, (size_t)len + 1, fmt, prec, ax);
            const char *dot = strpbrk(text, ".eE");
            size_t il = dot ? (size_t)(dot - text) : strlen(text);
            if (f->group) group_digits(&body, text, il, f->group);
            else sb_append(&body, text, il);
            sb_puts(&body, text + il);
            free(text);
        }
        if (type == '%') sb_putc(&body, '%');
    }
    if (body.oom) {
        sb_free(&body);
        return tmpl_fail(r, FERRY_ERR_NOMEM, "out of memory rendering the chat template");
    }
    const char *sign = neg ? "-" : f->sign == '+' ? "+" : f->sign == ' ' ? " " : "";
    size_t bl = body.len, sl = strlen(sign);
    const char *bd = body.data ? body.data : "";
    if (f->zero || f->align == '=') {
        /* padding goes between the sign (and prefix) and the digits */
        size_t width = f->width > 0 ? (size_t)f->width : 0;
        sb_puts(sb, sign);
        size_t pre = 0;
        if (f->alt && bl >= 2 && bd[0] == '0' && strchr("xXob", bd[1])) pre = 2;
        sb_append(sb, bd, pre);
        char fill = f->zero ? '0' : (f->fill ? f->fill : ' ');
        for (size_t i = sl + bl; i < width; i++) sb_putc(sb, fill);
        sb_append(sb, bd + pre, bl - pre);
    } else {
        strbuf full;
        sb_init(&full);
        sb_puts(&full, sign);
        sb_append(&full, bd, bl);
        pad_out(sb, full.data ? full.data : "", full.len, full.len, f, '>');
        sb_free(&full);
    }
    sb_free(&body);
    return true;
}

/* a string with precision (truncation) and width */
static void format_text(strbuf *sb, const char *p, size_t n, const fspec *f, char dflt_align)
{
    size_t cps = tmpl_utf8_count(p, n);
    if (f->prec >= 0 && (size_t)f->prec < cps) {
        n = tmpl_cp_to_byte(p, n, (size_t)f->prec);
        cps = (size_t)f->prec;
    }
    pad_out(sb, p, n, cps, f, dflt_align);
}

bool tmpl_percent_format(trender *r, const tval *fmt, const tval *args, tval *out)
{
    const tlist *tuple = args->kind == TV_LIST && args->list->flavour == LF_TUPLE ? args->list : NULL;
    const tdict *map = args->kind == TV_DICT ? args->dict : NULL;
    /* Python's PyMapping_Check: anything with __getitem__ but a tuple or a
     * str may be left unused without "not all arguments converted" */
    bool mapping_like = map || args->kind == TV_UNDEF ||
                        (args->kind == TV_LIST && (args->list->flavour == LF_LIST || args->list->flavour == LF_RANGE));
    size_t argi = 0, nargs = tuple ? tuple->n : 1;
    bool used_single = false;
    strbuf sb;
    sb_init(&sb);
    const char *p = fmt->s.p;
    size_t n = fmt->s.n, i = 0;
    bool ok = true;
    while (ok && i < n) {
        const char *pct = memchr(p + i, '%', n - i);
        if (!pct) {
            sb_append(&sb, p + i, n - i);
            break;
        }
        sb_append(&sb, p + i, (size_t)(pct - (p + i)));
        i = (size_t)(pct - p) + 1;
        fspec f = {.width = -1, .prec = -1};
        tval val = {0};
        bool have_val = false;
        if (i < n && p[i] == '(') {
            size_t depth = 1, k = i + 1;
            while (k < n && depth) {
                if (p[k] == '(') depth++;
                else if (p[k] == ')') depth--;
                k++;
            }
            if (depth) { ok = tmpl_fail(r, FERRY_ERR_INVALID, "line %d: incomplete format key", r->line); break; }
            if (args->kind == TV_UNDEF) { ok = tmpl_fail_undef(r, args); break; }
            if (!map) { ok = tmpl_fail(r, FERRY_ERR_INVALID, "line %d: format requires a mapping", r->line); break; }
            bool found;
            ok = tmpl_dict_get_str(r, map, p + i + 1, k - i - 2, &val, &found);
            if (ok && !found) ok = tmpl_fail(r, FERRY_ERR_INVALID, "line %d: format key '%.*s' not found", r->line, (int)(k - i - 2), p + i + 1);
            have_val = true;
            i = k;
        }
        while (ok && i < n && strchr("-+ #0", p[i])) {
            if (p[i] == '-') f.align = '<';
            else if (p[i] == '+') f.sign = '+';
            else if (p[i] == ' ' && f.sign != '+') f.sign = ' ';
            else if (p[i] == '#') f.alt = true;
            else f.zero = true;
            i++;
        }
        if (ok && i < n && p[i] == '*') { ok = tmpl_fail(r, FERRY_ERR_UNSUPPORTED, "line %d: '*' widths in %% formats are not supported", r->line); break; }
        while (ok && i < n && isdigit((unsigned char)p[i]) && f.width < 100000) f.width = (f.width < 0 ? 0 : f.width) * 10 + (p[i++] - '0');
        if (ok && i < n && p[i] == '.') {
            i++;
            f.prec = 0;
            while (i < n && isdigit((unsigned char)p[i]) && f.prec < 100000) f.prec = f.prec * 10 + (p[i++] - '0');
        }
        while (ok && i < n && strchr("hlL", p[i])) i++;
        if (!ok) break;
        if (i >= n) { ok = tmpl_fail(r, FERRY_ERR_INVALID, "line %d: incomplete format", r->line); break; }
        char type = p[i++];
        if (type == '%') {
            sb_putc(&sb, '%');
            continue;
        }
        if (!have_val) {
            if (tuple) {
                if (argi >= nargs) { ok = tmpl_fail(r, FERRY_ERR_INVALID, "line %d: not enough arguments for format string", r->line); break; }
                val = tuple->items[argi++];
            } else {
                if (used_single) { ok = tmpl_fail(r, FERRY_ERR_INVALID, "line %d: not enough arguments for format string", r->line); break; }
                val = *args;
                used_single = true;
            }
        }
        if (f.zero && f.align == '<') f.zero = false;
        if (type == 's' || type == 'r' || type == 'a') {
            strbuf t;
            sb_init(&t);
            ok = type == 's' ? tmpl_str(r, &val, &t) : tmpl_repr(r, &val, &t);
            if (ok) format_text(&sb, t.data ? t.data : "", t.len, &(fspec){.width = f.width, .prec = f.prec, .align = f.align ? f.align : '>'}, '>');
            sb_free(&t);
        } else if (strchr("diouxXeEfFgGc", type)) {
            if (type == 'c' && val.kind == TV_STR) {
                if (tmpl_utf8_count(val.s.p, val.s.n) != 1) ok = tmpl_fail(r, FERRY_ERR_INVALID, "line %d: %%c requires int or char", r->line);
                else format_text(&sb, val.s.p, val.s.n, &(fspec){.width = f.width, .prec = -1, .align = f.align ? f.align : '>'}, '>');
            } else if (!tv_is_num(&val)) {
                ok = val.kind == TV_UNDEF ? tmpl_fail_undef(r, &val)
                                          : tmpl_fail(r, FERRY_ERR_INVALID, "line %d: %%%c format: a real number is required, not %s", r->line, type, tmpl_type_name(&val));
            } else {
                f.type = type == 'i' || type == 'u' ? 'd' : type;
                ok = format_number(r, &val, &f, &sb);
            }
        } else {
            ok = tmpl_fail(r, FERRY_ERR_INVALID, "line %d: unsupported format character '%c'", r->line, type);
        }
        if (sb.len > r->arena.limit) ok = tmpl_fail(r, FERRY_ERR_TOO_LARGE, "line %d: string too large", r->line);
    }
    if (ok && !mapping_like && ((tuple && argi < nargs) || (!tuple && !used_single)))
        ok = tmpl_fail(r, FERRY_ERR_INVALID, "line %d: not all arguments converted during string formatting", r->line);
    if (!ok) {
        sb_free(&sb);
        return false;
    }
    return tmpl_sb_out(r, &sb, out);
}

/* format(value, spec) of Python for str, int and float */
static bool format_spec(trender *r, const tval *v, const char *s, size_t n, strbuf *sb)
{
    if (n == 0) return tmpl_str(r, v, sb); /* format(x, '') is str(x): True, not 1 */
    fspec f = {.width = -1, .prec = -1};
    size_t i = 0;
    if (n >= 2 && strchr("<>=^", s[1]) && (unsigned char)s[0] < 0x80) {
        f.fill = s[0];
        f.align = s[1];
        i = 2;
    } else if (n >= 1 && strchr("<>=^", s[0])) {
        f.align = s[0];
        i = 1;
    }
    if (i < n && strchr("+- ", s[i])) f.sign = s[i++];
    if (i < n && s[i] == '#') { f.alt = true; i++; }
    if (i < n && s[i] == '0') { f.zero = !f.align; if (!f.fill) f.fill = '0'; if (!f.align) f.align = '='; i++; }
    while (i < n && isdigit((unsigned char)s[i]) && f.width < 100000) f.width = (f.width < 0 ? 0 : f.width) * 10 + (s[i++] - '0');
    if (i < n && (s[i] == ',' || s[i] == '_')) f.group = s[i++];
    if (i < n && s[i] == '.') {
        i++;
        f.prec = 0;
        if (i >= n || !isdigit((unsigned char)s[i])) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: format specifier missing precision", r->line);
        while (i < n && isdigit((unsigned char)s[i]) && f.prec < 100000) f.prec = f.prec * 10 + (s[i++] - '0');
    }
    if (i < n) f.type = s[i++];
    if (i < n) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: invalid format specifier", r->line);
    f.zero = false; /* handled through fill '0' and align '=' */
    if (v->kind == TV_STR) {
        if (f.type && f.type != 's') return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: unknown format code '%c' for object of type 'str'", r->line, f.type);
        format_text(sb, v->s.p, v->s.n, &f, '<');
        return true;
    }
    if (tv_is_num(v)) {
        if (!f.type) {
            if (v->kind == TV_FLOAT) {
                if (f.prec >= 0) return tmpl_fail(r, FERRY_ERR_UNSUPPORTED, "line %d: float format with precision and no type is not supported", r->line);
                f.type = 'r';
            } else {
                f.type = 'd';
            }
        }
        if (v->kind == TV_FLOAT && strchr("dxXobc", f.type))
            return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: unknown format code '%c' for object of type 'float'", r->line, f.type);
        if (!strchr("dxXobceEfFgG%r", f.type)) return tmpl_fail(r, FERRY_ERR_UNSUPPORTED, "line %d: format code '%c' is not supported", r->line, f.type);
        if (f.type == 'd' || f.type == 'x' || f.type == 'X' || f.type == 'o' || f.type == 'b' || f.type == 'c') f.prec = -1;
        return format_number(r, v, &f, sb);
    }
    if (n == 0) return tmpl_str(r, v, sb);
    return tmpl_fail(r, FERRY_ERR_UNSUPPORTED, "line %d: format spec for a %s is not supported", r->line, tmpl_type_name(v));
}

/* str.format(*args, **kwargs) through the sandbox's formatter */
static bool str_format(trender *r, const tval *fmt, const tmpl_args *a, tval *out)
{
    strbuf sb;
    sb_init(&sb);
    const char *p = fmt->s.p;
    size_t n = fmt->s.n, i = 0, auto_idx = 0;
    bool ok = true;
    while (ok && i < n) {
        char c = p[i];
        if (c == '}') {
            if (i + 1 < n && p[i + 1] == '}') { sb_putc(&sb, '}'); i += 2; continue; }
            ok = tmpl_fail(r, FERRY_ERR_INVALID, "line %d: single '}' encountered in format string", r->line);
            break;
        }
        if (c != '{') { sb_putc(&sb, c); i++; continue; }
        if (i + 1 < n && p[i + 1] == '{') { sb_putc(&sb, '{'); i += 2; continue; }
        size_t k = i + 1;
        while (k < n && p[k] != '}' && p[k] != '{') k++;
        if (k >= n || p[k] != '}') { ok = tmpl_fail(r, FERRY_ERR_UNSUPPORTED, "line %d: unsupported or unterminated field in format string", r->line); break; }
        const char *field = p + i + 1;
        size_t fl = k - i - 1;
        i = k + 1;
        const char *spec = memchr(field, ':', fl);
        size_t specn = spec ? fl - (size_t)(spec - field) - 1 : 0;
        size_t namel = spec ? (size_t)(spec - field) : fl;
        char conv = 0;
        const char *bang = memchr(field, '!', namel);
        if (bang) {
            if ((size_t)(bang - field) + 2 != namel) { ok = tmpl_fail(r, FERRY_ERR_INVALID, "line %d: bad conversion in format string", r->line); break; }
            conv = bang[1];
            namel = (size_t)(bang - field);
        }
        /* the first part: an index or a name, then .attr / [key] */
        size_t j = 0;
        while (j < namel && field[j] != '.' && field[j] != '[') j++;
        tval v;
        if (j == 0) {
            if (auto_idx >= a->nargs) { ok = tmpl_fail(r, FERRY_ERR_INVALID, "line %d: replacement index %zu out of range", r->line, auto_idx); break; }
            v = a->args[auto_idx++];
        } else if (isdigit((unsigned char)field[0])) {
            size_t idx = 0;
            for (size_t q = 0; q < j; q++) idx = idx * 10 + (size_t)(field[q] - '0');
            if (idx >= a->nargs) { ok = tmpl_fail(r, FERRY_ERR_INVALID, "line %d: replacement index %zu out of range", r->line, idx); break; }
            v = a->args[idx];
        } else {
            size_t q;
            for (q = 0; q < a->nkw; q++)
                if (a->kwnn[q] == j && memcmp(a->kwn[q], field, j) == 0) break;
            if (q == a->nkw) { ok = tmpl_fail(r, FERRY_ERR_INVALID, "line %d: format key '%.*s' not given", r->line, (int)j, field); break; }
            v = a->kwv[q];
        }
        while (ok && j < namel) {
            if (field[j] == '.') {
                size_t e = j + 1;
                while (e < namel && field[e] != '.' && field[e] != '[') e++;
                ok = tmpl_getattr(r, &v, field + j + 1, e - j - 1, &v);
                j = e;
            } else {
                const char *close = memchr(field + j, ']', namel - j);
                if (!close) { ok = tmpl_fail(r, FERRY_ERR_INVALID, "line %d: missing ']' in format string", r->line); break; }
                size_t kl = (size_t)(close - field) - j - 1;
                tval key = tv_str(field + j + 1, kl);
                bool digits = kl > 0 && kl < 18;
                for (size_t q = 0; q < kl; q++)
                    if (!isdigit((unsigned char)field[j + 1 + q])) digits = false;
                if (digits) {
                    int64_t x = 0;
                    for (size_t q = 0; q < kl; q++) x = x * 10 + (field[j + 1 + q] - '0');
                    key = tv_int(x);
                }
                ok = tmpl_getitem(r, &v, &key, &v);
                j = (size_t)(close - field) + 1;
            }
        }
        if (!ok) break;
        if (conv == 's' || conv == 'r' || conv == 'a') {
            strbuf t;
            sb_init(&t);
            ok = conv == 's' ? tmpl_str(r, &v, &t) : tmpl_repr(r, &v, &t);
            if (ok) ok = tmpl_sb_to_str(r, &t, &v);
            else sb_free(&t);
        } else if (conv) {
            ok = tmpl_fail(r, FERRY_ERR_INVALID, "line %d: unknown conversion specifier %c", r->line, conv);
        }
        if (!ok) break;
        if (spec && memchr(spec + 1, '{', specn)) { ok = tmpl_fail(r, FERRY_ERR_UNSUPPORTED, "line %d: nested format fields are not supported", r->line); break; }
        ok = format_spec(r, &v, spec ? spec + 1 : "", specn, &sb);
        if (ok && sb.len > r->arena.limit) ok = tmpl_fail(r, FERRY_ERR_TOO_LARGE, "line %d: string too large", r->line);
    }
    if (!ok) {
        sb_free(&sb);
        return false;
    }
    return tmpl_sb_out(r, &sb, out);
}

bool tmpl_html_escape(trender *r, const tval *v, tval *out, bool force)
{
    if (v->kind == TV_STR && (v->sub & STR_MARKUP) && !force) {
        *out = *v; /* already safe */
        return true;
    }
    tval s;
    if (!tmpl_to_str(r, v, &s)) return false;
    strbuf sb;
    sb_init(&sb);
    for (size_t i = 0; i < s.s.n; i++) {
        char c = s.s.p[i];
        switch (c) {
        case '&': sb_puts(&sb, "&amp;"); break;
        case '<': sb_puts(&sb, "&lt;"); break;
        case '>': sb_puts(&sb, "&gt;"); break;
        case '"': sb_puts(&sb, "&#34;"); break;
        case '\'': sb_puts(&sb, "&#39;"); break;
        default: sb_putc(&sb, c);
        }
    }
    if (!tmpl_sb_out(r, &sb, out)) return false;
    out->sub |= STR_MARKUP;
    return true;
}

bool tmpl_markup_add(trender *r, const tval *a, const tval *b, tval *out)
{
    /* Markup's __add__ and __radd__ escape the plain str */
    tval x = *a, y = *b;
    if (!(x.sub & STR_MARKUP) && !tmpl_html_escape(r, &x, &x, false)) return false;
    if (!(y.sub & STR_MARKUP) && !tmpl_html_escape(r, &y, &y, false)) return false;
    strbuf sb;
    sb_init(&sb);
    sb_append(&sb, x.s.p, x.s.n);
    sb_append(&sb, y.s.p, y.s.n);
    if (!tmpl_sb_out(r, &sb, out)) return false;
    out->sub |= STR_MARKUP;
    return true;
}

/* jinja's title filter: each piece after [-\s({[<]+ capitalized */
bool tmpl_jinja_title(trender *r, const tval *s, tval *out)
{
    char *d = tmpl_ralloc(r, s->s.n * 2 + 4);
    if (!d) return false;
    size_t k = 0;
    bool at_start = true;
    for (size_t i = 0; i < s->s.n;) {
        uint32_t cp;
        i += tmpl_utf8_decode((const unsigned char *)s->s.p + i, s->s.n - i, &cp);
        bool sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || tmpl_py_isspace(cp);
        uint32_t m = sep ? cp : at_start ? case_cp(cp, TMPL_CASE_UPPER) : case_cp(cp, TMPL_CASE_LOWER);
        at_start = sep;
        k += util_utf8_put(d + k, m);
    }
    d[k] = '\0';
    *out = tv_str(d, k);
    return tmpl_charge(r, s->s.n / 16);
}

bool tmpl_str_indent(trender *r, const tval *s, const tval *width, bool first, bool blank, tval *out)
{
    const char *ind = "    ";
    size_t indn = 4;
    char *spaces = NULL;
    if (width) {
        if (width->kind == TV_STR) {
            ind = width->s.p;
            indn = width->s.n;
        } else {
            int64_t w = 0;
            if (!tmpl_arg_int(r, width, &w)) return false;
            if (w < 0) w = 0;
            if (w > 4096) return tmpl_fail(r, FERRY_ERR_TOO_LARGE, "line %d: indent width too large", r->line);
            spaces = tmpl_ralloc(r, (size_t)w + 1);
            if (!spaces) return false;
            memset(spaces, ' ', (size_t)w);
            ind = spaces;
            indn = (size_t)w;
        }
    }
    /* s + "\n", split into lines (jinja appends the newline on purpose) */
    strbuf whole;
    sb_init(&whole);
    sb_append(&whole, s->s.p, s->s.n);
    sb_putc(&whole, '\n');
    tval joined;
    if (!tmpl_sb_to_str(r, &whole, &joined)) return false;
    tlist *lines;
    if (!splitlines(r, joined.s.p, joined.s.n, false, &lines)) return false;
    strbuf sb;
    sb_init(&sb);
    if (first) sb_append(&sb, ind, indn);
    for (size_t i = 0; i < lines->n; i++) {
        const tval *ln = &lines->items[i];
        if (i) {
            sb_putc(&sb, '\n');
            if (blank || ln->s.n) sb_append(&sb, ind, indn);
        }
        sb_append(&sb, ln->s.p, ln->s.n);
        if (sb.len > r->arena.limit) break;
    }
    if (sb.len > r->arena.limit) {
        sb_free(&sb);
        return tmpl_fail(r, FERRY_ERR_TOO_LARGE, "line %d: string too large", r->line);
    }
    return tmpl_sb_out(r, &sb, out);
}

static bool str_all(const tval *s, bool (*pred)(uint32_t), bool need_one)
{
    bool any = false;
    for (size_t i = 0; i < s->s.n;) {
        uint32_t cp;
        i += tmpl_utf8_decode((const unsigned char *)s->s.p + i, s->s.n - i, &cp);
        if (!pred(cp)) return false;
        any = true;
    }
    return any || !need_one;
}

/* islower/isupper: every cased character of that case, and at least one */
bool tmpl_str_case_is(const tval *s, bool upper)
{
    bool cased = false;
    for (size_t i = 0; i < s->s.n;) {
        uint32_t cp;
        i += tmpl_utf8_decode((const unsigned char *)s->s.p + i, s->s.n - i, &cp);
        if (upper ? cp_is_lower(cp) : (cp_is_upper(cp))) return false;
        if (upper ? cp_is_upper(cp) : cp_is_lower(cp)) cased = true;
    }
    return cased;
}

/* s[start:end] for the optional start/end arguments of find/count/startswith */
static bool sub_range(trender *r, const tval *s, const tval *start, const tval *end, size_t *b, size_t *e, size_t *cp_base)
{
    *b = 0;
    *e = s->s.n;
    *cp_base = 0;
    if ((!start || start->kind == TV_NONE) && (!end || end->kind == TV_NONE)) return true;
    if (!tmpl_charge_bytes(r, s->s.n)) return false; /* counted, then walked to the bounds */
    size_t count = tmpl_utf8_count(s->s.p, s->s.n);
    int64_t a, z;
    if (!tmpl_slice_bound(r, start, 0, &a) || !tmpl_slice_bound(r, end, INT64_MAX, &z)) return false;
    tmpl_slice_adjust((int64_t)count, &a, &z, 1);
    if (z < a) z = a;
    *b = tmpl_cp_to_byte(s->s.p, s->s.n, (size_t)a);
    *e = tmpl_cp_to_byte(s->s.p, s->s.n, (size_t)z);
    *cp_base = (size_t)a;
    return true;
}

static bool affix(trender *r, const tval *s, const tval *pre, const tval *start, const tval *end, bool suffix, bool *res)
{
    size_t b, e, base;
    if (!sub_range(r, s, start, end, &b, &e, &base)) return false;
    const tval *cands = pre;
    size_t nc = 1;
    if (pre->kind == TV_LIST && pre->list->flavour == LF_TUPLE) {
        cands = pre->list->items;
        nc = pre->list->n;
    }
    if (!tmpl_charge(r, nc)) return false;
    *res = false;
    for (size_t i = 0; i < nc; i++) {
        if (cands[i].kind != TV_STR)
            return tmpl_type_error(r, suffix ? "endswith first arg must be str or a tuple of str, not %s"
                                        : "startswith first arg must be str or a tuple of str, not %s", &cands[i]);
        size_t m = cands[i].s.n;
        if (m > e - b) continue;
        if (!tmpl_charge_bytes(r, m)) return false;
        if (memcmp(suffix ? s->s.p + e - m : s->s.p + b, cands[i].s.p, m) == 0) *res = true;
    }
    return true;
}

/* find/rfind/index/rindex/count */
static bool find_sub(trender *r, const tval *s, const tval *sub, const tval *start, const tval *end, int mode, tval *out)
{
    if (!tmpl_arg_str(r, sub, "substring")) return false;
    size_t b, e, base;
    if (!sub_range(r, s, start, end, &b, &e, &base)) return false;
    if (!tmpl_charge(r, (e - b) / 16)) return false;
    const char *p = s->s.p;
    size_t m = sub->s.n;
    if (mode == TM_COUNT) {
        int64_t c = 0;
        if (m == 0) c = (int64_t)tmpl_utf8_count(p + b, e - b) + 1;
        else
            for (size_t i = b; i + m <= e;) {
                const char *hit = memmem(p + i, e - i, sub->s.p, m);
                if (!hit) break;
                c++;
                i = (size_t)(hit - p) + m;
            }
        *out = tv_int(c);
        return true;
    }
    long pos = -1;
    if (m <= e - b) {
        if (mode == TM_FIND || mode == TM_INDEX) {
            const char *hit = m ? memmem(p + b, e - b, sub->s.p, m) : p + b;
            if (hit) pos = (long)(hit - p);
        } else {
            for (size_t i = e - m + 1; i-- > b;)
                if (memcmp(p + i, sub->s.p, m) == 0) {
                    pos = (long)i;
                    break;
                }
        }
    }
    if (pos < 0) {
        if (mode == TM_INDEX || mode == TM_RINDEX) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: substring not found", r->line);
        *out = tv_int(-1);
        return true;
    }
    *out = tv_int((int64_t)tmpl_utf8_count(p, (size_t)pos));
    return true;
}

static bool justify(trender *r, const tval *s, const tval *width, const tval *fill, char how, tval *out)
{
    int64_t w = 0;
    if (!tmpl_arg_int(r, width, &w)) return false;
    if (w > 1 << 20) return tmpl_fail(r, FERRY_ERR_TOO_LARGE, "line %d: width too large", r->line);
    const char *f = " ";
    size_t fn = 1;
    if (fill) {
        if (fill->kind != TV_STR || tmpl_utf8_count(fill->s.p, fill->s.n) != 1)
            return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: the fill character must be exactly one character long", r->line);
        f = fill->s.p;
        fn = fill->s.n;
    }
    int64_t len = (int64_t)tmpl_utf8_count(s->s.p, s->s.n);
    if (w <= len) {
        *out = *s;
        return true;
    }
    int64_t marg = w - len, left = how == '<' ? 0 : how == '>' ? marg : marg / 2 + (marg & w & 1);
    strbuf sb;
    sb_init(&sb);
    for (int64_t i = 0; i < left; i++) sb_append(&sb, f, fn);
    sb_append(&sb, s->s.p, s->s.n);
    for (int64_t i = left; i < marg; i++) sb_append(&sb, f, fn);
    return tmpl_sb_out(r, &sb, out);
}

/* ---- str methods ------------------------------------------------------ */

static bool strip_method(trender *r, const tval *s, const tmpl_args *a, bool left, bool right, tval *out)
{
    BIND("strip()", "chars");
    return tmpl_str_strip(r, s, g[0] ? &p[0] : NULL, left, right, out);
}

static bool str_strip(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return strip_method(r, s, a, true, true, out);
}

static bool str_lstrip(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return strip_method(r, s, a, true, false, out);
}

static bool str_rstrip(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return strip_method(r, s, a, false, true, out);
}

static bool split_method(trender *r, const tval *s, const tmpl_args *a, bool from_right, tval *out)
{
    BIND("split()", "sep", "maxsplit");
    int64_t maxsplit = -1;
    if (g[1] && !tmpl_arg_int(r, &p[1], &maxsplit)) return false;
    return do_split(r, s, g[0] ? &p[0] : NULL, maxsplit, from_right, out);
}

static bool str_split(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return split_method(r, s, a, false, out);
}

static bool str_rsplit(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return split_method(r, s, a, true, out);
}

static bool str_splitlines(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    BIND("splitlines()", "keepends");
    tlist *l;
    if (!splitlines(r, s->s.p, s->s.n, g[0] && tmpl_truthy(&p[0]), &l)) return false;
    *out = tv_list(l);
    return true;
}

static bool affix_method(trender *r, const tval *s, const tmpl_args *a, bool suffix, tval *out)
{
    BIND("startswith()", "prefix", "start", "end");
    if (!g[0]) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: startswith/endswith needs an argument", r->line);
    bool res;
    if (!affix(r, s, &p[0], g[1] ? &p[1] : NULL, g[2] ? &p[2] : NULL, suffix, &res)) return false;
    *out = tv_bool(res);
    return true;
}

static bool str_startswith(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return affix_method(r, s, a, false, out);
}

static bool str_endswith(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return affix_method(r, s, a, true, out);
}

static bool str_upper(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return tmpl_no_args(r, "upper()", a) && tmpl_str_case(r, s->s.p, s->s.n, TMPL_CASE_UPPER, out);
}

/* lower and casefold */
static bool str_lower(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return tmpl_no_args(r, "lower()", a) && tmpl_str_case(r, s->s.p, s->s.n, TMPL_CASE_LOWER, out);
}

static bool str_swapcase(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return tmpl_no_args(r, "swapcase()", a) && tmpl_str_case(r, s->s.p, s->s.n, TMPL_CASE_SWAP, out);
}

static bool str_title(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return tmpl_no_args(r, "title()", a) && tmpl_str_title(r, s->s.p, s->s.n, false, out);
}

static bool str_capitalize(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return tmpl_no_args(r, "capitalize()", a) && tmpl_str_title(r, s->s.p, s->s.n, true, out);
}

static bool str_replace(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    BIND("replace()", "old", "new", "count");
    if (!g[0] || !g[1]) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: replace() needs old and new", r->line);
    if (!tmpl_arg_str(r, &p[0], "replace() argument 1") || !tmpl_arg_str(r, &p[1], "replace() argument 2")) return false;
    int64_t count = -1;
    if (g[2] && !tmpl_arg_int(r, &p[2], &count)) return false;
    return tmpl_str_replace(r, s, &p[0], &p[1], count, out);
}

/* find, rfind, index, rindex, count (mode: which) */
static bool find_method(trender *r, const tval *s, const tmpl_args *a, int mode, tval *out)
{
    BIND("find()", "sub", "start", "end");
    if (!g[0]) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: find() needs an argument", r->line);
    return find_sub(r, s, &p[0], g[1] ? &p[1] : NULL, g[2] ? &p[2] : NULL, mode, out);
}

static bool str_find(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return find_method(r, s, a, TM_FIND, out);
}

static bool str_rfind(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return find_method(r, s, a, TM_RFIND, out);
}

static bool str_index(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return find_method(r, s, a, TM_INDEX, out);
}

static bool str_rindex(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return find_method(r, s, a, TM_RINDEX, out);
}

static bool str_count(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return find_method(r, s, a, TM_COUNT, out);
}

static bool str_join(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    BIND("join()", "iterable");
    if (!g[0]) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: join() takes exactly one argument", r->line);
    tlist *items;
    if (!tmpl_iterate(r, &p[0], &items)) return false;
    strbuf sb;
    sb_init(&sb);
    for (size_t i = 0; i < items->n; i++) {
        if (items->items[i].kind != TV_STR) {
            sb_free(&sb);
            return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: sequence item %zu: expected str instance, %s found",
                             r->line, i, tmpl_type_name(&items->items[i]));
        }
        if (i) sb_append(&sb, s->s.p, s->s.n);
        sb_append(&sb, items->items[i].s.p, items->items[i].s.n);
        if (sb.len > r->arena.limit) {
            sb_free(&sb);
            return tmpl_fail(r, FERRY_ERR_TOO_LARGE, "line %d: string too large", r->line);
        }
    }
    return tmpl_sb_out(r, &sb, out);
}

/* isdigit and isnumeric */
static bool str_isdigit(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    if (!tmpl_no_args(r, "isdigit()", a)) return false;
    *out = tv_bool(str_all(s, cp_is_numeric, true));
    return true;
}

static bool str_isdecimal(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    if (!tmpl_no_args(r, "isdecimal()", a)) return false;
    *out = tv_bool(str_all(s, cp_is_decimal, true));
    return true;
}

static bool str_isalpha(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    if (!tmpl_no_args(r, "isalpha()", a)) return false;
    *out = tv_bool(str_all(s, cp_is_alpha, true));
    return true;
}

static bool str_isalnum(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    if (!tmpl_no_args(r, "isalnum()", a)) return false;
    bool ok = s->s.n > 0;
    for (size_t i = 0; i < s->s.n && ok;) {
        uint32_t cp;
        i += tmpl_utf8_decode((const unsigned char *)s->s.p + i, s->s.n - i, &cp);
        ok = cp_is_alpha(cp) || cp_is_numeric(cp);
    }
    *out = tv_bool(ok);
    return true;
}

static bool str_isspace(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    if (!tmpl_no_args(r, "isspace()", a)) return false;
    *out = tv_bool(str_all(s, tmpl_py_isspace, true));
    return true;
}

/* islower and isupper (both say "islower()" about arguments) */
static bool case_is_method(trender *r, const tval *s, const tmpl_args *a, bool upper, tval *out)
{
    if (!tmpl_no_args(r, "islower()", a)) return false;
    *out = tv_bool(tmpl_str_case_is(s, upper));
    return true;
}

static bool str_islower(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return case_is_method(r, s, a, false, out);
}

static bool str_isupper(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return case_is_method(r, s, a, true, out);
}

static bool str_istitle(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    if (!tmpl_no_args(r, "istitle()", a)) return false;
    bool prev_cased = false, cased = false, ok = true;
    for (size_t i = 0; i < s->s.n && ok;) {
        uint32_t cp;
        i += tmpl_utf8_decode((const unsigned char *)s->s.p + i, s->s.n - i, &cp);
        if (cp_is_upper(cp)) {
            if (prev_cased) ok = false;
            prev_cased = cased = true;
        } else if (cp_is_lower(cp)) {
            if (!prev_cased) ok = false;
            prev_cased = cased = true;
        } else {
            prev_cased = false;
        }
    }
    *out = tv_bool(ok && cased);
    return true;
}

/* center, ljust, rjust (how: '^', '<', '>') */
static bool justify_method(trender *r, const tval *s, const tmpl_args *a, char how, tval *out)
{
    BIND("center()", "width", "fillchar");
    if (!g[0]) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: width argument missing", r->line);
    return justify(r, s, &p[0], g[1] ? &p[1] : NULL, how, out);
}

static bool str_center(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return justify_method(r, s, a, '^', out);
}

static bool str_ljust(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return justify_method(r, s, a, '<', out);
}

static bool str_rjust(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return justify_method(r, s, a, '>', out);
}

static bool str_zfill(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    BIND("zfill()", "width");
    int64_t w = 0;
    if (!g[0] || !tmpl_arg_int(r, &p[0], &w)) return g[0] ? false : tmpl_fail(r, FERRY_ERR_INVALID, "line %d: zfill() needs a width", r->line);
    if (w > 1 << 20) return tmpl_fail(r, FERRY_ERR_TOO_LARGE, "line %d: width too large", r->line);
    int64_t len = (int64_t)tmpl_utf8_count(s->s.p, s->s.n);
    if (w <= len) { *out = *s; return true; }
    strbuf sb;
    sb_init(&sb);
    size_t skip = 0;
    if (s->s.n && (s->s.p[0] == '+' || s->s.p[0] == '-')) {
        sb_putc(&sb, s->s.p[0]);
        skip = 1;
    }
    for (int64_t i = 0; i < w - len; i++) sb_putc(&sb, '0');
    sb_append(&sb, s->s.p + skip, s->s.n - skip);
    return tmpl_sb_out(r, &sb, out);
}

static bool partition_method(trender *r, const tval *s, const tmpl_args *a, bool from_right, tval *out)
{
    BIND("partition()", "sep");
    if (!g[0] || !tmpl_arg_str(r, &p[0], "separator")) return g[0] ? false : tmpl_fail(r, FERRY_ERR_INVALID, "line %d: partition() needs a separator", r->line);
    if (p[0].s.n == 0) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: empty separator", r->line);
    tval idx;
    if (!find_sub(r, s, &p[0], NULL, NULL, from_right ? TM_RFIND : TM_FIND, &idx)) return false;
    tlist *t = tmpl_list_new(r, 3, LF_TUPLE);
    if (!t) return false;
    t->n = 3;
    if (idx.i < 0) {
        t->items[0] = from_right ? tv_str("", 0) : *s;
        t->items[1] = tv_str("", 0);
        t->items[2] = from_right ? *s : tv_str("", 0);
    } else {
        size_t b = tmpl_cp_to_byte(s->s.p, s->s.n, (size_t)idx.i);
        t->items[0] = tv_str(s->s.p, b);
        t->items[1] = tv_str(s->s.p + b, p[0].s.n);
        t->items[2] = tv_str(s->s.p + b + p[0].s.n, s->s.n - b - p[0].s.n);
    }
    *out = tv_list(t);
    return true;
}

static bool str_partition(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return partition_method(r, s, a, false, out);
}

static bool str_rpartition(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return partition_method(r, s, a, true, out);
}

static bool remove_affix_method(trender *r, const tval *s, const tmpl_args *a, bool suffix, tval *out)
{
    BIND("removeprefix()", "affix");
    if (!g[0] || !tmpl_arg_str(r, &p[0], "argument")) return g[0] ? false : tmpl_fail(r, FERRY_ERR_INVALID, "line %d: argument missing", r->line);
    size_t m = p[0].s.n;
    *out = *s;
    if (m <= s->s.n) {
        if (!tmpl_charge_bytes(r, m)) return false;
        if (!suffix && memcmp(s->s.p, p[0].s.p, m) == 0) *out = tv_str(s->s.p + m, s->s.n - m);
        if (suffix && m && memcmp(s->s.p + s->s.n - m, p[0].s.p, m) == 0) *out = tv_str(s->s.p, s->s.n - m);
    }
    return true;
}

static bool str_removeprefix(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return remove_affix_method(r, s, a, false, out);
}

static bool str_removesuffix(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    return remove_affix_method(r, s, a, true, out);
}

static bool str_expandtabs(trender *r, const tval *s, const tmpl_args *a, tval *out)
{
    BIND("expandtabs()", "tabsize");
    int64_t ts = 8;
    if (g[0] && !tmpl_arg_int(r, &p[0], &ts)) return false;
    if (ts > 4096) return tmpl_fail(r, FERRY_ERR_TOO_LARGE, "line %d: tab size too large", r->line);
    strbuf sb;
    sb_init(&sb);
    int64_t col = 0;
    for (size_t i = 0; i < s->s.n;) {
        uint32_t cp;
        size_t k = tmpl_utf8_decode((const unsigned char *)s->s.p + i, s->s.n - i, &cp);
        if (cp == '\t') {
            if (ts > 0) {
                int64_t sp = ts - col % ts;
                for (int64_t j = 0; j < sp; j++) sb_putc(&sb, ' ');
                col += sp;
            }
        } else {
            sb_append(&sb, s->s.p + i, k);
            col = (cp == '\n' || cp == '\r') ? 0 : col + 1;
        }
        i += k;
        if (sb.len > r->arena.limit) break;
    }
    if (sb.len > r->arena.limit) {
        sb_free(&sb);
        return tmpl_fail(r, FERRY_ERR_TOO_LARGE, "line %d: string too large", r->line);
    }
    return tmpl_sb_out(r, &sb, out);
}

/* The str methods by id; adding one is a TM_* id, a row of method_names
 * (tmpl_builtins.c), a function above and an entry here. */
static tmpl_method_fn *const str_methods[TM_COUNT_] = {
    [TM_STRIP] = str_strip,           [TM_LSTRIP] = str_lstrip,         [TM_RSTRIP] = str_rstrip,
    [TM_SPLIT] = str_split,           [TM_RSPLIT] = str_rsplit,         [TM_SPLITLINES] = str_splitlines,
    [TM_STARTSWITH] = str_startswith, [TM_ENDSWITH] = str_endswith,     [TM_UPPER] = str_upper,
    [TM_LOWER] = str_lower,           [TM_CASEFOLD] = str_lower,        [TM_SWAPCASE] = str_swapcase,
    [TM_TITLE] = str_title,           [TM_CAPITALIZE] = str_capitalize, [TM_REPLACE] = str_replace,
    [TM_FIND] = str_find,             [TM_RFIND] = str_rfind,           [TM_INDEX] = str_index,
    [TM_RINDEX] = str_rindex,         [TM_COUNT] = str_count,           [TM_JOIN] = str_join,
    [TM_FORMAT] = str_format,         [TM_ISDIGIT] = str_isdigit,       [TM_ISNUMERIC] = str_isdigit,
    [TM_ISDECIMAL] = str_isdecimal,   [TM_ISALPHA] = str_isalpha,       [TM_ISALNUM] = str_isalnum,
    [TM_ISSPACE] = str_isspace,       [TM_ISLOWER] = str_islower,       [TM_ISUPPER] = str_isupper,
    [TM_ISTITLE] = str_istitle,       [TM_CENTER] = str_center,         [TM_LJUST] = str_ljust,
    [TM_RJUST] = str_rjust,           [TM_ZFILL] = str_zfill,           [TM_PARTITION] = str_partition,
    [TM_RPARTITION] = str_rpartition, [TM_REMOVEPREFIX] = str_removeprefix,
    [TM_REMOVESUFFIX] = str_removesuffix, [TM_EXPANDTABS] = str_expandtabs,
};

bool tmpl_str_method(trender *r, const tval *s, int id, const tmpl_args *a, tval *out)
{
    if (id < 0 || id >= TM_COUNT_ || !str_methods[id])
        return tmpl_fail(r, FERRY_ERR_INTERNAL, "line %d: unknown str method %d", r->line, id);
    return str_methods[id](r, s, a, out);
}

