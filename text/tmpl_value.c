/*
 * tmpl_value.c - the arenas and the value model of the chat-template
 * interpreter: Python's semantics wherever the rendered text depends on
 * them.
 *
 * A template's output is compared byte for byte with what Python jinja2
 * produces, so str() and repr() follow CPython: True/None spelled that way,
 * floats in their shortest round-tripping form with Python's switch to
 * exponent notation ("1e-05", "1e+16"), containers with repr()'d items and
 * single quotes unless the text holds one and no double quote. Equality
 * treats 1, 1.0 and True alike and never raises; ordering raises TypeError
 * between unrelated types, as Python 3 does. json.dumps is transformers'
 * tojson: ensure_ascii off, Python's separators and indentation.
 */
#include "tmpl_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- UTF-8 ------------------------------------------------------------ */

/* The input is valid UTF-8 (checked where it enters); a stray byte still
 * decodes as itself, so that nothing reads past n. */
size_t tmpl_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp)
{
    unsigned char c = s[0];
    if (c < 0x80 || n < 2) { *cp = c; return 1; }
    if ((c & 0xE0) == 0xC0) { *cp = ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F); return 2; }
    if ((c & 0xF0) == 0xE0 && n >= 3) {
        *cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        return 3;
    }
    if ((c & 0xF8) == 0xF0 && n >= 4) {
        *cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
              (s[3] & 0x3F);
        return 4;
    }
    *cp = c;
    return 1;
}

size_t tmpl_utf8_count(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) k++;
    return k;
}

/* str.isspace() of CPython */
bool tmpl_py_isspace(uint32_t c)
{
    if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* str.isprintable() of CPython, for repr() */
static bool py_isprintable(uint32_t c)
{
    if (c < 0x80) return c >= 0x20 && c < 0x7F;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return false;
    default:
        return true;
    }
}

/* ---- containers ------------------------------------------------------- */

tlist *tmpl_list_new(trender *r, size_t n, uint8_t flavour)
{
    if (n > SIZE_MAX / sizeof(tval) / 2) {
        tmpl_fail(r, FERRY_ERR_TOO_LARGE, "list too large");
        return NULL;
    }
    tlist *l = tmpl_ralloc(r, sizeof *l);
    if (!l) return NULL;
    memset(l, 0, sizeof *l);
    l->flavour = flavour;
    if (n) {
        l->items = tmpl_ralloc(r, n * sizeof *l->items);
        if (!l->items) return NULL;
    }
    return l;
}

bool tmpl_list_push(trender *r, tlist *l, size_t *cap, tval v)
{
    if (l->n == *cap) {
        size_t nc = *cap ? *cap * 2 : 8;
        if (!tmpl_charge(r, nc / 8)) return false;
        tval *items = tmpl_rgrow(r, l->items, *cap * sizeof *items, nc * sizeof *items);
        if (!items) return false;
        l->items = items;
        *cap = nc;
    }
    l->items[l->n++] = v;
    return true;
}

tdict *tmpl_dict_new(trender *r, size_t cap)
{
    tdict *d = tmpl_ralloc(r, sizeof *d);
    if (!d) return NULL;
    memset(d, 0, sizeof *d);
    if (cap) {
        d->keys = tmpl_ralloc(r, cap * sizeof *d->keys);
        d->vals = tmpl_ralloc(r, cap * sizeof *d->vals);
        if (!d->keys || !d->vals) return NULL;
        d->cap = cap;
    }
    return d;
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static bool hash_depth(trender *r, const tval *v, uint64_t *h, int depth)
{
    if (depth > TMPL_MAX_VALUE_DEPTH) return tmpl_fail(r, FERRY_ERR_INVALID, "value nested too deeply");
    switch (v->kind) {
    case TV_UNDEF: *h = 0x5bd1e995; return true;
    case TV_NONE: *h = 0x9e3779b9; return true;
    case TV_BOOL: *h = mix64((uint64_t)v->b); return true;
    case TV_INT: *h = mix64((uint64_t)v->i); return true;
    case TV_FLOAT: {
        /* equal numbers hash alike: 1.0 like 1 */
        double f = v->f;
        if (f == floor(f) && f >= -9223372036854775808.0 && f < 9223372036854775808.0) {
            *h = mix64((uint64_t)(int64_t)f);
        } else {
            uint64_t bits;
            memcpy(&bits, &f, sizeof bits);
            *h = mix64(bits ^ 0x1234567);
        }
        return true;
    }
    case TV_STR: {
        if (!tmpl_charge_bytes(r, v->s.n)) return false;
        uint64_t x = 1469598103934665603ULL;
        for (size_t i = 0; i < v->s.n; i++) x = (x ^ (unsigned char)v->s.p[i]) * 1099511628211ULL;
        *h = x;
        return true;
    }
    case TV_LIST:
        if (v->list->flavour == LF_TUPLE) {
            uint64_t x = 0x345678;
            for (size_t i = 0; i < v->list->n; i++) {
                uint64_t e;
                if (!hash_depth(r, &v->list->items[i], &e, depth + 1)) return false;
                x = mix64(x ^ e) + i;
            }
            *h = x;
            return tmpl_charge(r, v->list->n);
        }
        break;
    case TV_FUNC: *h = mix64((uint64_t)v->fn + 77); return true;
    case TV_MACRO: *h = mix64((uint64_t)(uintptr_t)v->macro); return true;
    case TV_NS: *h = mix64((uint64_t)(uintptr_t)v->dict); return true;
    default: break;
    }
    return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: unhashable type: '%s'", r->line, tmpl_type_name(v));
}

bool tmpl_hash(trender *r, const tval *v, uint64_t *h) { return hash_depth(r, v, h, 0); }

bool tmpl_hashable(const tval *v)
{
    switch (v->kind) {
    case TV_LIST:
        if (v->list->flavour != LF_TUPLE) return false;
        for (size_t i = 0; i < v->list->n; i++)
            if (!tmpl_hashable(&v->list->items[i])) return false;
        return true;
    case TV_DICT: case TV_METHOD: case TV_LOOP: return false;
    default: return true;
    }
}

static bool dict_reindex(trender *r, tdict *d)
{
    size_t icap = 16;
    while (icap < d->n * 2 + 2) icap *= 2;
    uint32_t *idx = tmpl_ralloc(r, icap * sizeof *idx);
    if (!idx) return false;
    memset(idx, 0xFF, icap * sizeof *idx);
    for (size_t i = 0; i < d->n; i++) {
        uint64_t h;
        if (!tmpl_hash(r, &d->keys[i], &h)) return false;
        size_t j = h & (icap - 1);
        while (idx[j] != UINT32_MAX) j = (j + 1) & (icap - 1);
        idx[j] = (uint32_t)i;
    }
    d->idx = idx;
    d->icap = icap;
    return true;
}

/* the position of key in d, or -1 */
static bool dict_find(trender *r, const tdict *d, const tval *key, long *pos)
{
    *pos = -1;
    uint64_t h;
    if (!tmpl_hash(r, key, &h)) return false; /* unhashable keys raise even on lookup */
    if (!d->idx) {
        for (size_t i = 0; i < d->n; i++) {
            bool eq;
            if (!tmpl_equal(r, &d->keys[i], key, &eq)) return false;
            if (eq) { *pos = (long)i; return true; }
        }
        return true;
    }
    for (size_t j = h & (d->icap - 1);; j = (j + 1) & (d->icap - 1)) {
        uint32_t k = d->idx[j];
        if (k == UINT32_MAX) return true;
        bool eq;
        if (!tmpl_equal(r, &d->keys[k], key, &eq)) return false;
        if (eq) { *pos = (long)k; return true; }
    }
}

bool tmpl_dict_set(trender *r, tdict *d, tval key, tval val)
{
    long pos;
    if (!dict_find(r, d, &key, &pos)) return false;
    if (pos >= 0) {
        d->vals[pos] = val;
        return true;
    }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4;
        tval *k = tmpl_ralloc(r, nc * sizeof *k), *v = tmpl_ralloc(r, nc * sizeof *v);
        if (!k || !v) return false;
        if (d->n) {
            memcpy(k, d->keys, d->n * sizeof *k);
            memcpy(v, d->vals, d->n * sizeof *v);
        }
        d->keys = k;
        d->vals = v;
        d->cap = nc;
    }
    d->keys[d->n] = key;
    d->vals[d->n] = val;
    d->n++;
    if (d->n > 8 && (d->n * 2 + 2 > d->icap || !d->idx)) return dict_reindex(r, d);
    if (d->idx) {
        uint64_t h;
        if (!tmpl_hash(r, &key, &h)) return false;
        size_t j = h & (d->icap - 1);
        while (d->idx[j] != UINT32_MAX) j = (j + 1) & (d->icap - 1);
        d->idx[j] = (uint32_t)(d->n - 1);
    }
    return true;
}

bool tmpl_dict_get(trender *r, const tdict *d, const tval *key, tval *out, bool *found)
{
    long pos;
    if (!dict_find(r, d, key, &pos)) return false;
    *found = pos >= 0;
    if (pos >= 0) *out = d->vals[pos];
    return true;
}

bool tmpl_dict_get_str(trender *r, const tdict *d, const char *k, size_t kn, tval *out, bool *found)
{
    tval key = tv_str(k, kn);
    return tmpl_dict_get(r, d, &key, out, found);
}

/* ---- type, truth, equality, order ------------------------------------- */

const char *tmpl_type_name(const tval *v)
{
    switch (v->kind) {
    case TV_UNDEF: return "Undefined";
    case TV_NONE: return "NoneType";
    case TV_BOOL: return "bool";
    case TV_INT: return "int";
    case TV_FLOAT: return "float";
    case TV_STR: return "str";
    case TV_LIST:
        switch (v->list->flavour) {
        case LF_TUPLE: return "tuple";
        case LF_GEN: return "generator";
        case LF_KEYS: return "dict_keys";
        case LF_VALUES: return "dict_values";
        case LF_ITEMS: return "dict_items";
        case LF_RANGE: return "range";
        default: return "list";
        }
    case TV_DICT: return "dict";
    case TV_NS: return "Namespace";
    case TV_MACRO: return "Macro";
    case TV_FUNC: return "function";
    case TV_METHOD: return "builtin_function_or_method";
    case TV_LOOP: return "LoopContext";
    }
    return "object";
}

bool tmpl_truthy(const tval *v)
{
    switch (v->kind) {
    case TV_UNDEF: case TV_NONE: return false;
    case TV_BOOL: return v->b;
    case TV_INT: return v->i != 0;
    case TV_FLOAT: return v->f != 0.0;
    case TV_STR: return v->s.n != 0;
    case TV_LIST: return v->list->flavour == LF_GEN || v->list->n != 0; /* a generator is always true */
    case TV_DICT: return v->dict->n != 0;
    default: return true;
    }
}

static bool is_num(const tval *v) { return v->kind == TV_BOOL || v->kind == TV_INT || v->kind == TV_FLOAT; }

static bool num_is_float(const tval *v) { return v->kind == TV_FLOAT; }
static int64_t num_int(const tval *v) { return v->kind == TV_BOOL ? (int64_t)v->b : v->i; }

/* exact comparison of numbers (ints compared with floats exactly) */
static int num_cmp(const tval *a, const tval *b, bool *unordered)
{
    *unordered = false;
    if (!num_is_float(a) && !num_is_float(b)) {
        int64_t x = num_int(a), y = num_int(b);
        return x < y ? -1 : x > y;
    }
    long double x = num_is_float(a) ? (long double)a->f : (long double)num_int(a);
    long double y = num_is_float(b) ? (long double)b->f : (long double)num_int(b);
    if (isnan(x) || isnan(y)) {
        *unordered = true;
        return 0;
    }
    return x < y ? -1 : x > y;
}

static bool equal_depth(trender *r, const tval *a, const tval *b, bool *eq, int depth)
{
    *eq = false;
    if (depth > TMPL_MAX_VALUE_DEPTH) return tmpl_fail(r, FERRY_ERR_INVALID, "value nested too deeply");
    if (is_num(a) && is_num(b)) {
        bool un;
        *eq = num_cmp(a, b, &un) == 0 && !un;
        return true;
    }
    if (a->kind != b->kind) return true;
    switch (a->kind) {
    case TV_UNDEF: case TV_NONE: *eq = true; return true;
    case TV_STR:
        if (a->s.n != b->s.n) return true;
        if (!tmpl_charge_bytes(r, a->s.n)) return false;
        *eq = memcmp(a->s.p, b->s.p, a->s.n) == 0;
        return true;
    case TV_LIST: {
        const tlist *x = a->list, *y = b->list;
        if (x == y) { *eq = true; return true; }
        bool seq_x = x->flavour == LF_LIST || x->flavour == LF_TUPLE || x->flavour == LF_RANGE;
        if (!seq_x || x->flavour != y->flavour || x->n != y->n) return true;
        if (!tmpl_charge(r, x->n)) return false;
        for (size_t i = 0; i < x->n; i++) {
            if (!equal_depth(r, &x->items[i], &y->items[i], eq, depth + 1)) return false;
            if (!*eq) return true;
        }
        *eq = true;
        return true;
    }
    case TV_DICT: {
        const tdict *x = a->dict, *y = b->dict;
        if (x->n != y->n) return true;
        if (!tmpl_charge(r, x->n)) return false;
        for (size_t i = 0; i < x->n; i++) {
            tval other;
            bool found;
            if (!tmpl_dict_get(r, y, &x->keys[i], &other, &found)) return false;
            if (!found) return true;
            if (!equal_depth(r, &x->vals[i], &other, eq, depth + 1)) return false;
            if (!*eq) return true;
        }
        *eq = true;
        return true;
    }
    case TV_NS: *eq = a->dict == b->dict; return true;
    case TV_MACRO: *eq = a->macro == b->macro; return true;
    case TV_FUNC: *eq = a->fn == b->fn; return true;
    case TV_METHOD: *eq = a->method == b->method; return true;
    case TV_LOOP: *eq = a->loop == b->loop; return true;
    default: return true;
    }
}

bool tmpl_equal(trender *r, const tval *a, const tval *b, bool *eq) { return equal_depth(r, a, b, eq, 0); }

static bool order_fail(trender *r, int op, const tval *a, const tval *b)
{
    if (a->kind == TV_UNDEF) return tmpl_fail_undef(r, a);
    if (b->kind == TV_UNDEF) return tmpl_fail_undef(r, b);
    const char *s = op == OP_LT ? "<" : op == OP_LE ? "<=" : op == OP_GT ? ">" : ">=";
    return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: '%s' not supported between instances of '%s' and '%s'", r->line,
                     s, tmpl_type_name(a), tmpl_type_name(b));
}

/* three-way comparison for <, with *unordered for NaN */
static bool cmp_depth(trender *r, int op, const tval *a, const tval *b, int *res, bool *unordered, int depth)
{
    *unordered = false;
    if (depth > TMPL_MAX_VALUE_DEPTH) return tmpl_fail(r, FERRY_ERR_INVALID, "value nested too deeply");
    if (is_num(a) && is_num(b)) {
        *res = num_cmp(a, b, unordered);
        return true;
    }
    if (a->kind == TV_STR && b->kind == TV_STR) {
        size_t n = a->s.n < b->s.n ? a->s.n : b->s.n;
        if (!tmpl_charge_bytes(r, n)) return false;
        int c = memcmp(a->s.p, b->s.p, n); /* UTF-8 byte order is code point order */
        *res = c < 0 ? -1 : c > 0 ? 1 : a->s.n < b->s.n ? -1 : a->s.n > b->s.n;
        return true;
    }
    if (a->kind == TV_LIST && b->kind == TV_LIST && a->list->flavour == b->list->flavour &&
        (a->list->flavour == LF_LIST || a->list->flavour == LF_TUPLE)) {
        const tlist *x = a->list, *y = b->list;
        size_t n = x->n < y->n ? x->n : y->n;
        if (!tmpl_charge(r, n)) return false;
        for (size_t i = 0; i < n; i++) {
            bool eq;
            if (!equal_depth(r, &x->items[i], &y->items[i], &eq, depth + 1)) return false;
            if (!eq) return cmp_depth(r, op, &x->items[i], &y->items[i], res, unordered, depth + 1);
        }
        *res = x->n < y->n ? -1 : x->n > y->n;
        return true;
    }
    return order_fail(r, op, a, b);
}

bool tmpl_order(trender *r, int op, const tval *a, const tval *b, bool *out)
{
    int c;
    bool un;
    if (!cmp_depth(r, op, a, b, &c, &un, 0)) return false;
    if (un) *out = false;
    else if (op == OP_LT) *out = c < 0;
    else if (op == OP_LE) *out = c <= 0;
    else if (op == OP_GT) *out = c > 0;
    else *out = c >= 0;
    return true;
}

bool tmpl_cmp3(trender *r, const tval *a, const tval *b, int *res)
{
    bool un;
    if (!cmp_depth(r, OP_LT, a, b, res, &un, 0)) return false;
    if (un) *res = 0;
    return true;
}

/* ---- str() and repr() ------------------------------------------------- */

void tmpl_float_repr(double f, char *buf, size_t n)
{
    if (isnan(f)) { snprintf(buf, n, "nan"); return; }
    if (isinf(f)) { snprintf(buf, n, f < 0 ? "-inf" : "inf"); return; }
    if (f == 0) { snprintf(buf, n, signbit(f) ? "-0.0" : "0.0"); return; }
    char tmp[48];
    for (int prec = 0; prec < 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp: [-]d[.ddd]e[+-]XX */
    char digits[24];
    int nd = 0;
    const char *s = tmp;
    bool neg = *s == '-';
    if (neg) s++;
    for (; *s && *s != 'e'; s++)
        if (*s != '.') digits[nd++] = *s;
    int exp10 = atoi(s + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    int decpt = exp10 + 1; /* value = 0.digits * 10^decpt */
    char *o = buf;
    size_t left = n;
#define PUT(...) do { int k_ = snprintf(o, left, __VA_ARGS__); if (k_ < 0 || (size_t)k_ >= left) return; o += k_; left -= (size_t)k_; } while (0)
    if (neg) PUT("-");
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            PUT("0.");
            for (int i = 0; i < -decpt; i++) PUT("0");
            PUT("%s", digits);
        } else if (decpt >= nd) {
            PUT("%s", digits);
            for (int i = nd; i < decpt; i++) PUT("0");
            PUT(".0");
        } else {
            PUT("%.*s.%s", decpt, digits, digits + decpt);
        }
    } else {
        PUT("%c", digits[0]);
        if (nd > 1) PUT(".%s", digits + 1);
        int e = decpt - 1;
        PUT("e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
#undef PUT
}

static void repr_str(strbuf *sb, const char *p, size_t n)
{
    bool has_sq = memchr(p, '\'', n) != NULL, has_dq = memchr(p, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    sb_putc(sb, q);
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = tmpl_utf8_decode((const unsigned char *)p + i, n - i, &cp);
        if (cp == (uint32_t)q || cp == '\\') {
            sb_putc(sb, '\\');
            sb_putc(sb, (char)cp);
        } else if (cp == '\t') sb_puts(sb, "\\t");
        else if (cp == '\n') sb_puts(sb, "\\n");
        else if (cp == '\r') sb_puts(sb, "\\r");
        else if (py_isprintable(cp)) sb_append(sb, p + i, k);
        else if (cp < 0x100) sb_printf(sb, "\\x%02x", cp);
        else if (cp < 0x10000) sb_printf(sb, "\\u%04x", cp);
        else sb_printf(sb, "\\U%08x", cp);
        i += k;
    }
    sb_putc(sb, q);
}

static bool str_depth(trender *r, const tval *v, strbuf *sb, bool repr, int depth);

static bool seq_items(trender *r, const tlist *l, strbuf *sb, int depth, const char *open, const char *close)
{
    sb_puts(sb, open);
    for (size_t i = 0; i < l->n; i++) {
        if (i) sb_puts(sb, ", ");
        if (!str_depth(r, &l->items[i], sb, true, depth + 1)) return false;
    }
    if (l->flavour == LF_TUPLE && l->n == 1) sb_putc(sb, ',');
    sb_puts(sb, close);
    return true;
}

static bool dict_items_str(trender *r, const tdict *d, strbuf *sb, int depth)
{
    sb_putc(sb, '{');
    for (size_t i = 0; i < d->n; i++) {
        if (i) sb_puts(sb, ", ");
        if (!str_depth(r, &d->keys[i], sb, true, depth + 1)) return false;
        sb_puts(sb, ": ");
        if (!str_depth(r, &d->vals[i], sb, true, depth + 1)) return false;
    }
    sb_putc(sb, '}');
    return true;
}

static bool str_depth(trender *r, const tval *v, strbuf *sb, bool repr, int depth)
{
    if (depth > TMPL_MAX_VALUE_DEPTH) return tmpl_fail(r, FERRY_ERR_INVALID, "value nested too deeply to print");
    if (sb->len > r->max_out + 64 && r->max_out) /* a value whose text passes any output limit */
        return tmpl_fail(r, FERRY_ERR_TOO_LARGE, "chat template output exceeds %zu bytes", r->max_out);
    if (sb->oom) return tmpl_fail(r, FERRY_ERR_NOMEM, "out of memory rendering the chat template");
    char buf[48];
    switch (v->kind) {
    case TV_UNDEF: if (repr) sb_puts(sb, "Undefined"); return true;
    case TV_NONE: sb_puts(sb, "None"); return true;
    case TV_BOOL: sb_puts(sb, v->b ? "True" : "False"); return true;
    case TV_INT: sb_printf(sb, "%lld", (long long)v->i); return true;
    case TV_FLOAT: tmpl_float_repr(v->f, buf, sizeof buf); sb_puts(sb, buf); return true;
    case TV_STR:
        if (!repr) {
            sb_append(sb, v->s.p, v->s.n);
        } else if (v->sub & STR_MARKUP) {
            sb_puts(sb, "Markup(");
            repr_str(sb, v->s.p, v->s.n);
            sb_putc(sb, ')');
        } else {
            repr_str(sb, v->s.p, v->s.n);
        }
        return true;
    case TV_LIST: {
        const tlist *l = v->list;
        if (!tmpl_charge(r, l->n)) return false;
        switch (l->flavour) {
        case LF_LIST: return seq_items(r, l, sb, depth, "[", "]");
        case LF_TUPLE: return seq_items(r, l, sb, depth, "(", ")");
        case LF_KEYS: return seq_items(r, l, sb, depth, "dict_keys([", "])");
        case LF_VALUES: return seq_items(r, l, sb, depth, "dict_values([", "])");
        case LF_ITEMS: return seq_items(r, l, sb, depth, "dict_items([", "])");
        case LF_RANGE:
            if (l->r_step == 1) sb_printf(sb, "range(%lld, %lld)", (long long)l->r_start, (long long)l->r_stop);
            else sb_printf(sb, "range(%lld, %lld, %lld)", (long long)l->r_start, (long long)l->r_stop, (long long)l->r_step);
            return true;
        default:
            return tmpl_fail(r, FERRY_ERR_UNSUPPORTED,
                             "line %d: printing a generator (a filter result not passed through |list) is not supported",
                             r->line);
        }
    }
    case TV_DICT:
        if (!tmpl_charge(r, v->dict->n)) return false;
        return dict_items_str(r, v->dict, sb, depth);
    case TV_NS:
        sb_puts(sb, "<Namespace ");
        if (!dict_items_str(r, v->dict, sb, depth)) return false;
        sb_putc(sb, '>');
        return true;
    case TV_MACRO:
        sb_puts(sb, "<Macro ");
        repr_str(sb, v->macro->m->name, v->macro->m->name_n);
        sb_putc(sb, '>');
        return true;
    case TV_LOOP:
        sb_printf(sb, "<LoopContext %zu/%zu>", v->loop->i + 1, v->loop->items->n);
        return true;
    default:
        return tmpl_fail(r, FERRY_ERR_UNSUPPORTED, "line %d: printing a %s is not supported", r->line, tmpl_type_name(v));
    }
}

bool tmpl_str(trender *r, const tval *v, strbuf *sb) { return str_depth(r, v, sb, false, 0); }
bool tmpl_repr(trender *r, const tval *v, strbuf *sb) { return str_depth(r, v, sb, true, 0); }

bool tmpl_str_new(trender *r, const char *p, size_t n, tval *out)
{
    char *d = tmpl_ralloc(r, n + 1);
    if (!d) return false;
    if (n) memcpy(d, p, n);
    d[n] = '\0';
    *out = tv_str(d, n);
    out->sub = STR_OWNED; /* may grow in place (see str_append in tmpl_eval.c) */
    return true;
}

bool tmpl_sb_to_str(trender *r, strbuf *sb, tval *out)
{
    if (sb->oom) {
        sb_free(sb);
        return tmpl_fail(r, FERRY_ERR_NOMEM, "out of memory rendering the chat template");
    }
    bool ok = tmpl_str_new(r, sb->data ? sb->data : "", sb->len, out);
    sb_free(sb);
    return ok;
}

bool tmpl_to_str(trender *r, const tval *v, tval *out)
{
    if (v->kind == TV_STR) {
        *out = *v;
        return true;
    }
    if (v->kind == TV_UNDEF) {
        *out = tv_str("", 0);
        return true;
    }
    strbuf sb;
    sb_init(&sb);
    if (!tmpl_str(r, v, &sb)) {
        sb_free(&sb);
        return false;
    }
    return tmpl_sb_to_str(r, &sb, out);
}

/* ---- json.dumps ------------------------------------------------------- */

static void json_str(strbuf *sb, const char *p, size_t n, bool ensure_ascii)
{
    sb_putc(sb, '"');
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)p[i];
        if (c < 0x80) {
            switch (c) {
            case '"': sb_puts(sb, "\\\""); break;
            case '\\': sb_puts(sb, "\\\\"); break;
            case '\n': sb_puts(sb, "\\n"); break;
            case '\r': sb_puts(sb, "\\r"); break;
            case '\t': sb_puts(sb, "\\t"); break;
            case '\b': sb_puts(sb, "\\b"); break;
            case '\f': sb_puts(sb, "\\f"); break;
            default:
                if (c < 0x20) sb_printf(sb, "\\u%04x", c);
                else sb_putc(sb, (char)c);
            }
            i++;
            continue;
        }
        uint32_t cp;
        size_t k = tmpl_utf8_decode((const unsigned char *)p + i, n - i, &cp);
        if (!ensure_ascii) {
            sb_append(sb, p + i, k);
        } else if (cp >= 0x10000) {
            uint32_t v = cp - 0x10000;
            sb_printf(sb, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
        } else {
            sb_printf(sb, "\\u%04x", cp);
        }
        i += k;
    }
    sb_putc(sb, '"');
}

static void json_newline(strbuf *sb, const tmpl_json_opts *o, int level)
{
    sb_putc(sb, '\n');
    for (int i = 0; i < level; i++) sb_append(sb, o->indent, o->indent_n);
}

static bool json_float(strbuf *sb, double f)
{
    if (isnan(f)) sb_puts(sb, "NaN");
    else if (isinf(f)) sb_puts(sb, f < 0 ? "-Infinity" : "Infinity");
    else {
        char buf[48];
        tmpl_float_repr(f, buf, sizeof buf);
        sb_puts(sb, buf);
    }
    return true;
}

static bool json_depth(trender *r, const tval *v, const tmpl_json_opts *o, strbuf *sb, int level);

/* the key as json writes it, or a TypeError */
static bool json_key(trender *r, const tval *k, const tmpl_json_opts *o, strbuf *sb)
{
    switch (k->kind) {
    case TV_STR: json_str(sb, k->s.p, k->s.n, o->ensure_ascii); return true;
    case TV_INT: sb_printf(sb, "\"%lld\"", (long long)k->i); return true;
    case TV_BOOL: sb_puts(sb, k->b ? "\"true\"" : "\"false\""); return true;
    case TV_NONE: sb_puts(sb, "\"null\""); return true;
    case TV_FLOAT: sb_putc(sb, '"'); json_float(sb, k->f); sb_putc(sb, '"'); return true;
    default:
        return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: keys must be str, int, float, bool or None, not %s", r->line,
                         tmpl_type_name(k));
    }
}

/* merge sort of item positions by key (stable, as Python's sorted) */
static bool sort_positions(trender *r, const tval *keys, size_t *pos, size_t *tmp, size_t n)
{
    if (n < 2) return true;
    size_t h = n / 2;
    if (!sort_positions(r, keys, pos, tmp, h) || !sort_positions(r, keys, pos + h, tmp, n - h)) return false;
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        bool lt;
        if (!tmpl_order(r, OP_LT, &keys[pos[j]], &keys[pos[i]], &lt)) return false;
        tmp[k++] = lt ? pos[j++] : pos[i++];
    }
    while (i < h) tmp[k++] = pos[i++];
    while (j < n) tmp[k++] = pos[j++];
    memcpy(pos, tmp, n * sizeof *pos);
    return true;
}

static bool json_depth(trender *r, const tval *v, const tmpl_json_opts *o, strbuf *sb, int level)
{
    if (level > TMPL_MAX_VALUE_DEPTH) return tmpl_fail(r, FERRY_ERR_INVALID, "value nested too deeply for tojson");
    if (sb->len > r->max_out + 64 && r->max_out)
        return tmpl_fail(r, FERRY_ERR_TOO_LARGE, "chat template output exceeds %zu bytes", r->max_out);
    switch (v->kind) {
    case TV_NONE: sb_puts(sb, "null"); return true;
    case TV_BOOL: sb_puts(sb, v->b ? "true" : "false"); return true;
    case TV_INT: sb_printf(sb, "%lld", (long long)v->i); return true;
    case TV_FLOAT: return json_float(sb, v->f);
    case TV_STR:
        if (!tmpl_charge(r, v->s.n / 16)) return false;
        json_str(sb, v->s.p, v->s.n, o->ensure_ascii);
        return true;
    case TV_LIST:
        if (v->list->flavour == LF_LIST || v->list->flavour == LF_TUPLE) {
            const tlist *l = v->list;
            if (!tmpl_charge(r, l->n)) return false;
            if (l->n == 0) { sb_puts(sb, "[]"); return true; }
            sb_putc(sb, '[');
            for (size_t i = 0; i < l->n; i++) {
                if (i) sb_append(sb, o->item_sep, o->item_sep_n);
                if (o->indent_set) json_newline(sb, o, level + 1);
                if (!json_depth(r, &l->items[i], o, sb, level + 1)) return false;
            }
            if (o->indent_set) json_newline(sb, o, level);
            sb_putc(sb, ']');
            return true;
        }
        break;
    case TV_DICT: {
        const tdict *d = v->dict;
        if (!tmpl_charge(r, d->n)) return false;
        if (d->n == 0) { sb_puts(sb, "{}"); return true; }
        size_t *pos = tmpl_ralloc(r, 2 * d->n * sizeof *pos);
        if (!pos) return false;
        for (size_t i = 0; i < d->n; i++) pos[i] = i;
        if (o->sort_keys && !sort_positions(r, d->keys, pos, pos + d->n, d->n)) return false;
        sb_putc(sb, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i) sb_append(sb, o->item_sep, o->item_sep_n);
            if (o->indent_set) json_newline(sb, o, level + 1);
            if (!json_key(r, &d->keys[pos[i]], o, sb)) return false;
            sb_append(sb, o->key_sep, o->key_sep_n);
            if (!json_depth(r, &d->vals[pos[i]], o, sb, level + 1)) return false;
        }
        if (o->indent_set) json_newline(sb, o, level);
        sb_putc(sb, '}');
        return true;
    }
    default:
        break;
    }
    return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: Object of type %s is not JSON serializable", r->line,
                     tmpl_type_name(v));
}

bool tmpl_json(trender *r, const tval *v, const tmpl_json_opts *o, strbuf *sb)
{
    if (!json_depth(r, v, o, sb, 0)) return false;
    if (sb->oom) return tmpl_fail(r, FERRY_ERR_NOMEM, "out of memory rendering the chat template");
    return true;
}

/* ---- from the caller's JSON ------------------------------------------- */

bool tmpl_from_json(trender *r, const json_value *j, tval *out, int depth)
{
    if (depth > TMPL_MAX_VALUE_DEPTH) return tmpl_fail(r, FERRY_ERR_INVALID, "chat template variables nested too deeply");
    switch (j->type) {
    case JSON_NULL: *out = tv_none(); return true;
    case JSON_BOOL: *out = tv_bool(j->boolean); return true;
    case JSON_NUMBER: *out = j->is_int ? tv_int(j->integer) : tv_float(j->number); return true;
    case JSON_STRING: *out = tv_str(j->str, j->len); return true;
    case JSON_ARRAY: {
        tlist *l = tmpl_list_new(r, j->len, LF_LIST);
        if (!l) return false;
        for (size_t i = 0; i < j->len; i++)
            if (!tmpl_from_json(r, &j->items[i], &l->items[i], depth + 1)) return false;
        l->n = j->len;
        out->kind = TV_LIST;
        out->list = l;
        return true;
    }
    case JSON_OBJECT: {
        tdict *d = tmpl_dict_new(r, j->len);
        if (!d) return false;
        for (size_t i = 0; i < j->len; i++) {
            tval v;
            if (!tmpl_from_json(r, &j->members[i].value, &v, depth + 1)) return false;
            /* duplicate keys: the last value wins at the first position, as json.loads */
            if (!tmpl_dict_set(r, d, tv_str(j->members[i].key, j->members[i].key_len), v)) return false;
        }
        *out = (tval){.kind = TV_DICT, .dict = d};
        return true;
    }
    }
    return tmpl_fail(r, FERRY_ERR_INVALID, "bad JSON value");
}

/* ---- iteration and length --------------------------------------------- */

bool tmpl_iterate(trender *r, const tval *v, tlist **out)
{
    switch (v->kind) {
    case TV_UNDEF: return (*out = tmpl_list_new(r, 0, LF_LIST)) != NULL;
    case TV_LIST:
        if (v->list->flavour == LF_GEN) {
            if (v->list->consumed) return (*out = tmpl_list_new(r, 0, LF_LIST)) != NULL;
            v->list->consumed = true;
        }
        *out = v->list;
        return true;
    case TV_DICT: {
        tlist *l = tmpl_list_new(r, v->dict->n, LF_LIST);
        if (!l) return false;
        if (v->dict->n) memcpy(l->items, v->dict->keys, v->dict->n * sizeof *l->items);
        l->n = v->dict->n;
        *out = l;
        return tmpl_charge(r, l->n);
    }
    case TV_STR: {
        size_t n = tmpl_utf8_count(v->s.p, v->s.n);
        tlist *l = tmpl_list_new(r, n, LF_LIST);
        if (!l) return false;
        for (size_t i = 0; i < v->s.n;) {
            uint32_t cp;
            size_t k = tmpl_utf8_decode((const unsigned char *)v->s.p + i, v->s.n - i, &cp);
            l->items[l->n++] = tv_str(v->s.p + i, k);
            i += k;
        }
        *out = l;
        return tmpl_charge(r, n);
    }
    default:
        return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: '%s' object is not iterable", r->line, tmpl_type_name(v));
    }
}

bool tmpl_length(trender *r, const tval *v, int64_t *out)
{
    switch (v->kind) {
    case TV_UNDEF: *out = 0; return true;
    case TV_STR: *out = (int64_t)tmpl_utf8_count(v->s.p, v->s.n); return tmpl_charge(r, v->s.n / 16);
    case TV_LIST:
        if (v->list->flavour == LF_GEN) break;
        *out = (int64_t)v->list->n;
        return true;
    case TV_DICT: *out = (int64_t)v->dict->n; return true;
    case TV_LOOP: *out = (int64_t)v->loop->items->n; return true; /* LoopContext.__len__ */
    default: break;
    }
    return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: object of type '%s' has no len()", r->line, tmpl_type_name(v));
}
