/*
 * tmpl_builtins.c - what a chat template can call: jinja2's filters and
 * tests, the methods of Python's str, dict and list that templates use, the
 * attributes of `loop`, attribute and item lookup with the sandbox's rules,
 * slicing, printf-style and str.format formatting, and the globals
 * (range, namespace, dict, raise_exception, strftime_now).
 *
 * Each follows the Python it stands for (jinja2/filters.py and tests.py,
 * CPython's str methods) in what it returns and in when it raises, because
 * the output is compared with transformers' rendering byte for byte. Where
 * Python returns an iterator (map, select, reject, selectattr, rejectattr,
 * items, reverse) the result is a list marked as a generator: true even when
 * empty, without len(), used up by one iteration, not printable.
 *
 * The immutable sandbox transformers renders with refuses methods that
 * modify a list or dict (append, update, pop, ...): calling one is an error
 * here too.
 */
#define _GNU_SOURCE /* memmem */
#include "tmpl_internal.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <utf8proc.h>

/* ---- names ------------------------------------------------------------ */

enum {
    F_ABS, F_ATTR, F_CAPITALIZE, F_CENTER, F_DEFAULT, F_DICTSORT, F_ESCAPE, F_FIRST, F_FLOAT, F_FORMAT,
    F_INDENT, F_INT, F_ITEMS, F_JOIN, F_LAST, F_LENGTH, F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN, F_REJECT,
    F_REJECTATTR, F_REPLACE, F_REVERSE, F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR, F_SORT, F_STRING, F_SUM,
    F_TITLE, F_TOJSON, F_TRIM, F_UNIQUE, F_UPPER, F_WORDCOUNT, F_FORCEESCAPE,
};

static const struct {
    const char *name;
    int id;
} filter_names[] = {
    {"abs", F_ABS}, {"attr", F_ATTR}, {"capitalize", F_CAPITALIZE}, {"center", F_CENTER}, {"count", F_LENGTH},
    {"d", F_DEFAULT}, {"default", F_DEFAULT}, {"dictsort", F_DICTSORT}, {"e", F_ESCAPE}, {"escape", F_ESCAPE},
    {"first", F_FIRST}, {"float", F_FLOAT}, {"forceescape", F_FORCEESCAPE}, {"format", F_FORMAT}, {"indent", F_INDENT},
    {"int", F_INT}, {"items", F_ITEMS}, {"join", F_JOIN}, {"last", F_LAST}, {"length", F_LENGTH}, {"list", F_LIST},
    {"lower", F_LOWER}, {"map", F_MAP}, {"max", F_MAX}, {"min", F_MIN}, {"reject", F_REJECT},
    {"rejectattr", F_REJECTATTR}, {"replace", F_REPLACE}, {"reverse", F_REVERSE}, {"round", F_ROUND},
    {"safe", F_SAFE}, {"select", F_SELECT}, {"selectattr", F_SELECTATTR}, {"sort", F_SORT}, {"string", F_STRING},
    {"sum", F_SUM}, {"title", F_TITLE}, {"tojson", F_TOJSON}, {"trim", F_TRIM}, {"unique", F_UNIQUE},
    {"upper", F_UPPER}, {"wordcount", F_WORDCOUNT},
};

/* jinja2's own filters, for telling "not supported" from "does not exist" */
static const char *const jinja_filters[] = {
    "batch", "filesizeformat", "groupby", "pprint", "random", "slice", "striptags", "truncate", "urlencode",
    "urlize", "wordwrap", "xmlattr", NULL};

enum {
    T_ODD, T_EVEN, T_DIVISIBLEBY, T_DEFINED, T_UNDEFINED, T_FILTER, T_TEST, T_NONE, T_BOOLEAN, T_FALSE, T_TRUE,
    T_INTEGER, T_FLOAT, T_LOWER, T_UPPER, T_STRING, T_MAPPING, T_NUMBER, T_SEQUENCE, T_ITERABLE, T_CALLABLE,
    T_SAMEAS, T_ESCAPED, T_IN, T_EQ, T_NE, T_GT, T_GE, T_LT, T_LE,
};

static const struct {
    const char *name;
    int id;
} test_names[] = {
    {"odd", T_ODD}, {"even", T_EVEN}, {"divisibleby", T_DIVISIBLEBY}, {"defined", T_DEFINED},
    {"undefined", T_UNDEFINED}, {"filter", T_FILTER}, {"test", T_TEST}, {"none", T_NONE}, {"boolean", T_BOOLEAN},
    {"false", T_FALSE}, {"true", T_TRUE}, {"integer", T_INTEGER}, {"float", T_FLOAT}, {"lower", T_LOWER},
    {"upper", T_UPPER}, {"string", T_STRING}, {"mapping", T_MAPPING}, {"number", T_NUMBER},
    {"sequence", T_SEQUENCE}, {"iterable", T_ITERABLE}, {"callable", T_CALLABLE}, {"sameas", T_SAMEAS},
    {"escaped", T_ESCAPED}, {"in", T_IN}, {"==", T_EQ}, {"eq", T_EQ}, {"equalto", T_EQ}, {"!=", T_NE},
    {"ne", T_NE}, {">", T_GT}, {"gt", T_GT}, {"greaterthan", T_GT}, {">=", T_GE}, {"ge", T_GE}, {"<", T_LT},
    {"lt", T_LT}, {"lessthan", T_LT}, {"<=", T_LE}, {"le", T_LE},
};

static bool name_is(const char *s, size_t n, const char *lit) { return strlen(lit) == n && memcmp(s, lit, n) == 0; }

int tmpl_filter_id(const char *name, size_t n, bool *known)
{
    if (known) *known = false;
    for (size_t i = 0; i < sizeof filter_names / sizeof filter_names[0]; i++)
        if (name_is(name, n, filter_names[i].name)) return filter_names[i].id;
    for (int i = 0; jinja_filters[i]; i++)
        if (name_is(name, n, jinja_filters[i]) && known) *known = true;
    return -1;
}

int tmpl_test_id(const char *name, size_t n, bool *known)
{
    if (known) *known = false;
    for (size_t i = 0; i < sizeof test_names / sizeof test_names[0]; i++)
        if (name_is(name, n, test_names[i].name)) return test_names[i].id;
    return -1;
}

/* methods by name; `recv` says which receivers have them */
enum { R_STR = 1, R_DICT = 2, R_LIST = 4, R_LOOP = 8 };

static const struct {
    const char *name;
    int id;
    int recv;
} method_names[] = {
    {"strip", TM_STRIP, R_STR}, {"lstrip", TM_LSTRIP, R_STR}, {"rstrip", TM_RSTRIP, R_STR},
    {"split", TM_SPLIT, R_STR}, {"rsplit", TM_RSPLIT, R_STR}, {"splitlines", TM_SPLITLINES, R_STR},
    {"startswith", TM_STARTSWITH, R_STR}, {"endswith", TM_ENDSWITH, R_STR}, {"upper", TM_UPPER, R_STR},
    {"lower", TM_LOWER, R_STR}, {"title", TM_TITLE, R_STR}, {"capitalize", TM_CAPITALIZE, R_STR},
    {"swapcase", TM_SWAPCASE, R_STR}, {"replace", TM_REPLACE, R_STR}, {"find", TM_FIND, R_STR},
    {"rfind", TM_RFIND, R_STR}, {"index", TM_INDEX, R_STR | R_LIST}, {"rindex", TM_RINDEX, R_STR},
    {"count", TM_COUNT, R_STR | R_LIST}, {"join", TM_JOIN, R_STR}, {"format", TM_FORMAT, R_STR},
    {"isdigit", TM_ISDIGIT, R_STR}, {"isalpha", TM_ISALPHA, R_STR}, {"isalnum", TM_ISALNUM, R_STR},
    {"isspace", TM_ISSPACE, R_STR}, {"islower", TM_ISLOWER, R_STR}, {"isupper", TM_ISUPPER, R_STR},
    {"isnumeric", TM_ISNUMERIC, R_STR}, {"isdecimal", TM_ISDECIMAL, R_STR}, {"istitle", TM_ISTITLE, R_STR},
    {"center", TM_CENTER, R_STR}, {"ljust", TM_LJUST, R_STR}, {"rjust", TM_RJUST, R_STR}, {"zfill", TM_ZFILL, R_STR},
    {"partition", TM_PARTITION, R_STR}, {"rpartition", TM_RPARTITION, R_STR},
    {"removeprefix", TM_REMOVEPREFIX, R_STR}, {"removesuffix", TM_REMOVESUFFIX, R_STR},
    {"expandtabs", TM_EXPANDTABS, R_STR}, {"casefold", TM_CASEFOLD, R_STR},
    {"items", TM_ITEMS, R_DICT}, {"keys", TM_KEYS, R_DICT}, {"values", TM_VALUES, R_DICT}, {"get", TM_GET, R_DICT},
    {"copy", TM_DICT_COPY, R_DICT}, {"copy", TM_LIST_COPY, R_LIST},
    {"cycle", TM_LOOP_CYCLE, R_LOOP}, {"changed", TM_LOOP_CHANGED, R_LOOP},
    /* refused by the immutable sandbox */
    {"append", TM_UNSAFE, R_LIST}, {"extend", TM_UNSAFE, R_LIST}, {"insert", TM_UNSAFE, R_LIST},
    {"pop", TM_UNSAFE, R_LIST | R_DICT}, {"remove", TM_UNSAFE, R_LIST}, {"reverse", TM_UNSAFE, R_LIST},
    {"sort", TM_UNSAFE, R_LIST}, {"clear", TM_UNSAFE, R_LIST | R_DICT}, {"update", TM_UNSAFE, R_DICT},
    {"popitem", TM_UNSAFE, R_DICT}, {"setdefault", TM_UNSAFE, R_DICT},
};

/* Python methods of str/dict/list/int/float that are not implemented */
static const char *const unsupported_methods[] = {
    "encode", "format_map", "isascii", "isidentifier", "isprintable", "maketrans", "translate", "fromkeys",
    "bit_length", "bit_count", "to_bytes", "from_bytes", "as_integer_ratio", "conjugate", "is_integer", "hex",
    "fromhex", NULL};

bool tmpl_method_unsupported(const char *name, size_t n)
{
    for (int i = 0; unsupported_methods[i]; i++)
        if (name_is(name, n, unsupported_methods[i])) return true;
    return false;
}

static int method_id(const char *name, size_t n, int recv)
{
    for (size_t i = 0; i < sizeof method_names / sizeof method_names[0]; i++)
        if ((method_names[i].recv & recv) && name_is(name, n, method_names[i].name)) return method_names[i].id;
    return TM_NONE;
}

/* ---- helpers ---------------------------------------------------------- */

static bool type_error(trender *r, const char *fmt, const tval *v)
{
    if (v && v->kind == TV_UNDEF) return tmpl_fail_undef(r, v);
    char msg[256];
    snprintf(msg, sizeof msg, fmt, v ? tmpl_type_name(v) : "");
    return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: %s", r->line, msg);
}

/* Binds positional and keyword arguments to parameters, as Python does. */
static bool bind(trender *r, const char *what, const char *const *names, size_t nparams, const tval *args,
                 size_t nargs, const char **kwn, const size_t *kwnn, const tval *kwv, size_t nkw, tval *out, bool *given)
{
    for (size_t i = 0; i < nparams; i++) given[i] = false;
    if (nargs > nparams)
        return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: %s takes at most %zu argument(s) (%zu given)", r->line, what,
                         nparams, nargs);
    for (size_t i = 0; i < nargs; i++) {
        out[i] = args[i];
        given[i] = true;
    }
    for (size_t k = 0; k < nkw; k++) {
        size_t p;
        for (p = 0; p < nparams; p++)
            if (name_is(kwn[k], kwnn[k], names[p])) break;
        if (p == nparams)
            return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: %s got an unexpected keyword argument '%.*s'", r->line,
                             what, (int)kwnn[k], kwn[k]);
        if (given[p])
            return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: %s got multiple values for argument '%s'", r->line, what,
                             names[p]);
        out[p] = kwv[k];
        given[p] = true;
    }
    return true;
}

#define BIND(what, ...)                                                                            \
    static const char *const names_[] = {__VA_ARGS__};                                            \
    enum { NP_ = sizeof names_ / sizeof names_[0] };                                               \
    tval p[NP_];                                                                                  \
    bool g[NP_];                                                                                  \
    if (!bind(r, what, names_, NP_, args, nargs, kwn, kwnn, kwv, nkw, p, g)) return false

static bool no_args(trender *r, const char *what, size_t nargs, size_t nkw)
{
    if (nargs || nkw) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: %s takes no arguments", r->line, what);
    return true;
}

static bool is_intlike(const tval *v) { return v->kind == TV_INT || v->kind == TV_BOOL; }
static int64_t intval(const tval *v) { return v->kind == TV_BOOL ? (int64_t)v->b : v->i; }
static bool is_number(const tval *v) { return is_intlike(v) || v->kind == TV_FLOAT; }
static double numval(const tval *v) { return v->kind == TV_FLOAT ? v->f : (double)intval(v); }

static bool arg_int(trender *r, const tval *v, int64_t *out)
{
    if (!is_intlike(v)) return type_error(r, "'%s' object cannot be interpreted as an integer", v);
    *out = intval(v);
    return true;
}

static bool arg_str(trender *r, const tval *v, const char *what)
{
    if (v->kind == TV_STR) return true;
    if (v->kind == TV_UNDEF) return tmpl_fail_undef(r, v);
    return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: %s must be str, not %s", r->line, what, tmpl_type_name(v));
}

static tval list_val(tlist *l) { return (tval){.kind = TV_LIST, .list = l}; }

/* a string from a strbuf (freed) */
static bool sb_out(trender *r, strbuf *sb, tval *out)
{
    if (!tmpl_charge(r, sb->len / 16)) {
        sb_free(sb);
        return false;
    }
    return tmpl_sb_to_str(r, sb, out);
}

/* byte offsets of the code points of s (count + 1 entries) */
static bool cp_offsets(trender *r, const char *s, size_t n, size_t **offs, size_t *count)
{
    size_t c = tmpl_utf8_count(s, n);
    size_t *o = tmpl_ralloc(r, (c + 1) * sizeof *o);
    if (!o) return false;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) o[k++] = i;
    o[k] = n;
    *offs = o;
    *count = c;
    return true;
}

/* the byte offset of code point index i of s */
static size_t cp_to_byte(const char *s, size_t n, size_t i)
{
    size_t b = 0;
    while (i > 0 && b < n) {
        b++;
        while (b < n && ((unsigned char)s[b] & 0xC0) == 0x80) b++;
        i--;
    }
    return b;
}

/* ---- Unicode case ------------------------------------------------------ */

enum { CASE_UPPER, CASE_LOWER, CASE_TITLE_CP, CASE_SWAP };

static uint32_t case_cp(uint32_t c, int mode)
{
    if (c < 0x80) {
        if (mode == CASE_UPPER || mode == CASE_TITLE_CP) return (c >= 'a' && c <= 'z') ? c - 32 : c;
        if (mode == CASE_LOWER) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
        if (c >= 'a' && c <= 'z') return c - 32;
        if (c >= 'A' && c <= 'Z') return c + 32;
        return c;
    }
    /* simple (one to one) mappings: Python's full mappings (ß -> SS) differ */
    switch (mode) {
    case CASE_UPPER: return (uint32_t)utf8proc_toupper((utf8proc_int32_t)c);
    case CASE_LOWER: return (uint32_t)utf8proc_tolower((utf8proc_int32_t)c);
    case CASE_TITLE_CP: return (uint32_t)utf8proc_totitle((utf8proc_int32_t)c);
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
static bool map_case(trender *r, const char *s, size_t n, int mode, tval *out)
{
    char *d = tmpl_ralloc(r, n * 2 + 4); /* simple mappings change length by at most 1 byte per char */
    if (!d) return false;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += tmpl_utf8_decode((const unsigned char *)s + i, n - i, &cp);
        k += tmpl_utf8_encode(case_cp(cp, mode), d + k);
    }
    d[k] = '\0';
    *out = tv_str(d, k);
    return tmpl_charge(r, n / 16);
}

/* Python's str.title() and str.capitalize() */
static bool py_title(trender *r, const char *s, size_t n, bool capitalize, tval *out)
{
    char *d = tmpl_ralloc(r, n * 2 + 4);
    if (!d) return false;
    size_t k = 0;
    bool prev_cased = false, first = true;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += tmpl_utf8_decode((const unsigned char *)s + i, n - i, &cp);
        uint32_t m;
        if (capitalize) m = first ? case_cp(cp, CASE_TITLE_CP) : case_cp(cp, CASE_LOWER);
        else m = prev_cased ? case_cp(cp, CASE_LOWER) : case_cp(cp, CASE_TITLE_CP);
        prev_cased = cp_is_cased(cp);
        first = false;
        k += tmpl_utf8_encode(m, d + k);
    }
    d[k] = '\0';
    *out = tv_str(d, k);
    return tmpl_charge(r, n / 16);
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

static bool do_strip(trender *r, const tval *s, const tval *chars, bool left, bool right, tval *out)
{
    if (chars && chars->kind == TV_NONE) chars = NULL;
    if (chars && !arg_str(r, chars, "strip arg")) return false;
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
        if (!arg_str(r, sep, "separator")) return false;
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
    *out = list_val(l);
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
static bool do_replace(trender *r, const tval *s, const tval *old, const tval *new_, int64_t count, tval *out)
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
    return sb_out(r, &sb, out);
}

/* ---- attributes, items, slices ---------------------------------------- */

static bool make_method(trender *r, const tval *self, int id, const char *name, size_t n, tval *out)
{
    if (id == TM_UNSAFE) {
        /* the sandbox turns unsafe attributes into an undefined that fails when used */
        *out = tv_undef();
        out->sub = UD_UNSAFE;
        out->s.p = name;
        out->s.n = n;
        return true;
    }
    tmethod *m = tmpl_ralloc(r, sizeof *m);
    if (!m) return false;
    m->self = *self;
    m->id = id;
    *out = (tval){.kind = TV_METHOD, .method = m};
    return true;
}

static tval undef_named(int sub, const char *name, size_t n)
{
    tval v = tv_undef();
    v.sub = (uint8_t)sub;
    v.s.p = name;
    v.s.n = n;
    return v;
}

static bool loop_attr(trender *r, const tval *v, const char *name, size_t n, tval *out, bool *found)
{
    const tloop *l = v->loop;
    size_t len = l->items->n, i = l->i;
    *found = true;
    if (name_is(name, n, "index")) *out = tv_int((int64_t)i + 1);
    else if (name_is(name, n, "index0")) *out = tv_int((int64_t)i);
    else if (name_is(name, n, "revindex")) *out = tv_int((int64_t)(len - i));
    else if (name_is(name, n, "revindex0")) *out = tv_int((int64_t)(len - i - 1));
    else if (name_is(name, n, "first")) *out = tv_bool(i == 0);
    else if (name_is(name, n, "last")) *out = tv_bool(i + 1 == len);
    else if (name_is(name, n, "length")) *out = tv_int((int64_t)len);
    else if (name_is(name, n, "depth")) *out = tv_int(l->depth0 + 1);
    else if (name_is(name, n, "depth0")) *out = tv_int(l->depth0);
    else if (name_is(name, n, "previtem")) *out = i > 0 ? l->items->items[i - 1] : undef_named(UD_OTHER, "there is no previous item", 25);
    else if (name_is(name, n, "nextitem")) *out = i + 1 < len ? l->items->items[i + 1] : undef_named(UD_OTHER, "there is no next item", 21);
    else {
        int id = method_id(name, n, R_LOOP);
        if (id != TM_NONE) return make_method(r, v, id, name, n, out);
        *found = false;
    }
    return true;
}

/* getattr(v, name) only (no item fallback); *found false when absent */
static bool attribute(trender *r, const tval *v, const char *name, size_t n, tval *out, bool *found)
{
    *found = true;
    if (n >= 2 && name[0] == '_' && name[1] == '_') {
        /* Python's dunder attributes exist but the sandbox hides them */
        *out = undef_named(UD_UNSAFE, name, n);
        return true;
    }
    int id = TM_NONE;
    switch (v->kind) {
    case TV_STR: id = method_id(name, n, R_STR); break;
    case TV_DICT: id = method_id(name, n, R_DICT); break;
    case TV_LIST:
        if (v->list->flavour == LF_LIST) id = method_id(name, n, R_LIST);
        else if (v->list->flavour == LF_TUPLE && (name_is(name, n, "index") || name_is(name, n, "count")))
            id = method_id(name, n, R_LIST);
        break;
    case TV_NS: return tmpl_dict_get_str(r, v->dict, name, n, out, found);
    case TV_LOOP: return loop_attr(r, v, name, n, out, found);
    default: break;
    }
    if (id != TM_NONE) return make_method(r, v, id, name, n, out);
    *found = false;
    return true;
}

bool tmpl_getattr(trender *r, const tval *v, const char *name, size_t n, tval *out)
{
    /* Undefined's own dunder attributes exist (the sandbox hides them); any
     * other attribute of it raises */
    if (v->kind == TV_UNDEF && !(n >= 2 && name[0] == '_' && name[1] == '_')) return tmpl_fail_undef(r, v);
    bool found;
    if (!attribute(r, v, name, n, out, &found)) return false;
    if (found) return true;
    if (v->kind == TV_DICT) {
        if (!tmpl_dict_get_str(r, v->dict, name, n, out, &found)) return false;
        if (found) return true;
    }
    *out = undef_named(UD_ATTR, name, n);
    return true;
}

/* seq[i] for str/list/tuple/range; *ok false when out of range */
static bool index_seq(trender *r, const tval *v, int64_t i, tval *out, bool *ok)
{
    *ok = false;
    if (v->kind == TV_STR) {
        size_t count = tmpl_utf8_count(v->s.p, v->s.n);
        if (!tmpl_charge(r, v->s.n / 16)) return false;
        if (i < 0) i += (int64_t)count;
        if (i < 0 || (uint64_t)i >= count) return true;
        size_t b = cp_to_byte(v->s.p, v->s.n, (size_t)i);
        uint32_t cp;
        size_t k = tmpl_utf8_decode((const unsigned char *)v->s.p + b, v->s.n - b, &cp);
        *out = tv_str(v->s.p + b, k);
        *ok = true;
        return true;
    }
    const tlist *l = v->list;
    if (i < 0) i += (int64_t)l->n;
    if (i < 0 || (uint64_t)i >= l->n) return true;
    *out = l->items[i];
    *ok = true;
    return true;
}

static bool subscriptable_seq(const tval *v)
{
    return v->kind == TV_STR ||
           (v->kind == TV_LIST && (v->list->flavour == LF_LIST || v->list->flavour == LF_TUPLE || v->list->flavour == LF_RANGE));
}

bool tmpl_getitem(trender *r, const tval *v, const tval *key, tval *out)
{
    if (v->kind == TV_UNDEF) return tmpl_fail_undef(r, v);
    bool found = false;
    if (subscriptable_seq(v) && is_intlike(key)) {
        if (!index_seq(r, v, intval(key), out, &found)) return false;
        if (found) return true;
    } else if (v->kind == TV_DICT && tmpl_hashable(key)) {
        /* (an unhashable key is a TypeError, which the sandbox turns into undefined) */
        if (!tmpl_dict_get(r, v->dict, key, out, &found)) return false;
        if (found) return true;
    }
    /* obj[key] failed: a string key falls back to the attribute */
    if (key->kind == TV_STR) {
        if (!attribute(r, v, key->s.p, key->s.n, out, &found)) return false;
        if (found) return true;
        *out = undef_named(UD_ITEM, key->s.p, key->s.n);
        return true;
    }
    *out = undef_named(UD_ITEM, NULL, 0);
    return true;
}

/* CPython's PySlice_AdjustIndices */
static int64_t slice_adjust(int64_t len, int64_t *start, int64_t *stop, int64_t step)
{
    if (*start < 0) {
        *start += len;
        if (*start < 0) *start = step < 0 ? -1 : 0;
    } else if (*start >= len) {
        *start = step < 0 ? len - 1 : len;
    }
    if (*stop < 0) {
        *stop += len;
        if (*stop < 0) *stop = step < 0 ? -1 : 0;
    } else if (*stop >= len) {
        *stop = step < 0 ? len - 1 : len;
    }
    if (step < 0) return *stop < *start ? (*start - *stop - 1) / (-step) + 1 : 0;
    return *start < *stop ? (*stop - *start - 1) / step + 1 : 0;
}

static bool slice_bound(trender *r, const tval *v, int64_t dflt, int64_t *out)
{
    if (!v || v->kind == TV_NONE) {
        *out = dflt;
        return true;
    }
    if (v->kind == TV_UNDEF) return tmpl_fail_undef(r, v);
    if (!is_intlike(v))
        return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: slice indices must be integers or None or have an __index__ method", r->line);
    *out = intval(v);
    return true;
}

bool tmpl_slice(trender *r, const tval *v, const tval *start, const tval *stop, const tval *step, tval *out)
{
    if (v->kind == TV_UNDEF) return tmpl_fail_undef(r, v);
    int64_t st;
    if (!slice_bound(r, step, 1, &st)) return false;
    if (st == 0) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: slice step cannot be zero", r->line);
    if (st == INT64_MIN) st = -INT64_MAX;
    int64_t a, b;
    if (!slice_bound(r, start, st < 0 ? INT64_MAX : 0, &a) || !slice_bound(r, stop, st < 0 ? INT64_MIN : INT64_MAX, &b))
        return false;
    if (v->kind == TV_STR) {
        size_t *offs = NULL, count;
        bool ascii = tmpl_utf8_count(v->s.p, v->s.n) == v->s.n;
        if (!ascii && !cp_offsets(r, v->s.p, v->s.n, &offs, &count)) return false;
        if (ascii) count = v->s.n;
        int64_t len = slice_adjust((int64_t)count, &a, &b, st);
        if (st == 1) {
            size_t bb = ascii ? (size_t)a : offs[a];
            size_t be = ascii ? (size_t)(a + len) : offs[a + len];
            *out = tv_str(v->s.p + bb, be - bb);
            return true;
        }
        char *d = tmpl_ralloc(r, (size_t)len * 4 + 1);
        if (!d) return false;
        size_t k = 0;
        for (int64_t i = 0, pos = a; i < len; i++, pos += st) {
            size_t bb = ascii ? (size_t)pos : offs[pos];
            size_t be = ascii ? bb + 1 : offs[pos + 1];
            memcpy(d + k, v->s.p + bb, be - bb);
            k += be - bb;
        }
        d[k] = '\0';
        *out = tv_str(d, k);
        return tmpl_charge(r, (uint64_t)len);
    }
    if (v->kind == TV_LIST && (v->list->flavour == LF_LIST || v->list->flavour == LF_TUPLE || v->list->flavour == LF_RANGE)) {
        const tlist *l = v->list;
        int64_t len = slice_adjust((int64_t)l->n, &a, &b, st);
        tlist *o = tmpl_list_new(r, (size_t)len, l->flavour);
        if (!o) return false;
        for (int64_t i = 0, pos = a; i < len; i++, pos += st) o->items[i] = l->items[pos];
        o->n = (size_t)len;
        if (l->flavour == LF_RANGE) {
            o->r_start = l->r_start + a * l->r_step;
            o->r_step = l->r_step * st;
            o->r_stop = o->r_start + len * o->r_step;
            if (len == 0) o->r_stop = o->r_start;
        }
        *out = list_val(o);
        return tmpl_charge(r, (uint64_t)len);
    }
    if (v->kind == TV_DICT) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: unhashable type: 'slice'", r->line);
    return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: '%s' object is not subscriptable", r->line, tmpl_type_name(v));
}

/* environment.getitem for each part of "a.b.0" (jinja's make_attrgetter) */
static bool attr_path(trender *r, const tval *item, const tval *attr, tval *out)
{
    *out = *item;
    if (attr->kind == TV_NONE) return true;
    if (is_intlike(attr)) return tmpl_getitem(r, out, attr, out);
    if (!arg_str(r, attr, "attribute")) return false;
    const char *p = attr->s.p;
    size_t n = attr->s.n, i = 0;
    for (;;) {
        size_t j = i;
        while (j < n && p[j] != '.') j++;
        tval key = tv_str(p + i, j - i);
        bool digits = j > i;
        for (size_t k = i; k < j; k++)
            if (p[k] < '0' || p[k] > '9') digits = false;
        if (digits && j - i < 18) {
            int64_t x = 0;
            for (size_t k = i; k < j; k++) x = x * 10 + (p[k] - '0');
            key = tv_int(x);
        }
        if (!tmpl_getitem(r, out, &key, out)) return false;
        if (j >= n) return true;
        i = j + 1;
    }
}

/* ---- sorting ---------------------------------------------------------- */

/* stable merge sort of positions by keys; reverse as Python's sorted does
 * (each comparison reversed, equal items keep their order) */
static bool msort(trender *r, const tval *keys, size_t *pos, size_t *tmp, size_t n, bool reverse)
{
    if (n < 2) return true;
    size_t h = n / 2;
    if (!msort(r, keys, pos, tmp, h, reverse) || !msort(r, keys, pos + h, tmp, n - h, reverse)) return false;
    if (!tmpl_charge(r, n)) return false;
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        bool lt;
        const tval *a = &keys[pos[j]], *b = &keys[pos[i]];
        if (!tmpl_order(r, OP_LT, reverse ? b : a, reverse ? a : b, &lt)) return false;
        tmp[k++] = lt ? pos[j++] : pos[i++];
    }
    while (i < h) tmp[k++] = pos[i++];
    while (j < n) tmp[k++] = pos[j++];
    memcpy(pos, tmp, n * sizeof *pos);
    return true;
}

/* jinja's ignore_case: strings lowered */
static bool ignore_case(trender *r, const tval *v, tval *out)
{
    if (v->kind != TV_STR) {
        *out = *v;
        return true;
    }
    return map_case(r, v->s.p, v->s.n, CASE_LOWER, out);
}

/* the sort key of an item: attribute path(s) (comma separated when multi), lowered */
static bool sort_key(trender *r, const tval *item, const tval *attr, bool case_sensitive, bool multi, tval *out)
{
    if (multi && attr->kind == TV_STR && memchr(attr->s.p, ',', attr->s.n)) {
        tlist *l = tmpl_list_new(r, 0, LF_LIST);
        size_t cap = 0;
        if (!l) return false;
        const char *p = attr->s.p;
        size_t n = attr->s.n, i = 0;
        for (;;) {
            size_t j = i;
            while (j < n && p[j] != ',') j++;
            tval part = tv_str(p + i, j - i), v;
            if (!attr_path(r, item, &part, &v)) return false;
            if (!case_sensitive && !ignore_case(r, &v, &v)) return false;
            if (!tmpl_list_push(r, l, &cap, v)) return false;
            if (j >= n) break;
            i = j + 1;
        }
        *out = list_val(l);
        return true;
    }
    if (!attr_path(r, item, attr, out)) return false;
    return case_sensitive || ignore_case(r, out, out);
}

static bool sorted_list(trender *r, const tlist *in, const tval *keys, bool reverse, tlist **out)
{
    size_t n = in->n;
    size_t *pos = tmpl_ralloc(r, (2 * n + 1) * sizeof *pos);
    tlist *o = tmpl_list_new(r, n, LF_LIST);
    if (!pos || !o) return false;
    for (size_t i = 0; i < n; i++) pos[i] = i;
    if (!msort(r, keys, pos, pos + n, n, reverse)) return false;
    for (size_t i = 0; i < n; i++) o->items[i] = in->items[pos[i]];
    o->n = n;
    *out = o;
    return true;
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

static bool py_int_from_str(const tval *s, int base, int64_t *out, bool *overflow)
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

static bool py_float_from_str(const tval *s, double *out)
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
    size_t fl = tmpl_utf8_encode((uint32_t)(unsigned char)(f->fill ? f->fill : ' '), fill);
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
            x = intval(v);
        }
        uint64_t ux = x < 0 ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
        neg = x < 0;
        if (type == 'c') {
            if (x < 0 || x > 0x10FFFF) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: %%c arg not in range(0x110000)", r->line);
            char ch[4];
            size_t k = tmpl_utf8_encode((uint32_t)x, ch);
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
        double x = numval(v);
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
        n = cp_to_byte(p, n, (size_t)f->prec);
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
            } else if (!is_number(&val)) {
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
    return sb_out(r, &sb, out);
}

/* format(value, spec) of Python for str, int and float */
static bool format_spec(trender *r, const tval *v, const char *s, size_t n, strbuf *sb)
{
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
    if (is_number(v)) {
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
static bool str_format(trender *r, const tval *fmt, const tval *args, size_t nargs, const char **kwn,
                       const size_t *kwnn, const tval *kwv, size_t nkw, tval *out)
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
            if (auto_idx >= nargs) { ok = tmpl_fail(r, FERRY_ERR_INVALID, "line %d: replacement index %zu out of range", r->line, auto_idx); break; }
            v = args[auto_idx++];
        } else if (isdigit((unsigned char)field[0])) {
            size_t idx = 0;
            for (size_t q = 0; q < j; q++) idx = idx * 10 + (size_t)(field[q] - '0');
            if (idx >= nargs) { ok = tmpl_fail(r, FERRY_ERR_INVALID, "line %d: replacement index %zu out of range", r->line, idx); break; }
            v = args[idx];
        } else {
            size_t q;
            for (q = 0; q < nkw; q++)
                if (kwnn[q] == j && memcmp(kwn[q], field, j) == 0) break;
            if (q == nkw) { ok = tmpl_fail(r, FERRY_ERR_INVALID, "line %d: format key '%.*s' not given", r->line, (int)j, field); break; }
            v = kwv[q];
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
    return sb_out(r, &sb, out);
}

/* ---- filters ---------------------------------------------------------- */

static bool round_value(trender *r, const tval *v, int64_t prec, const tval *method, tval *out)
{
    if (!is_number(v)) return type_error(r, "type %s doesn't define __round__ method", v);
    int kind = 0; /* common, ceil, floor */
    if (method) {
        if (method->kind == TV_STR && name_is(method->s.p, method->s.n, "ceil")) kind = 1;
        else if (method->kind == TV_STR && name_is(method->s.p, method->s.n, "floor")) kind = 2;
        else if (!(method->kind == TV_STR && name_is(method->s.p, method->s.n, "common")))
            return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: method must be common, ceil or floor", r->line);
    }
    if (kind == 0 && is_intlike(v)) {
        int64_t x = intval(v);
        if (prec >= 0) { *out = tv_int(x); return true; }
        if (prec < -18) { *out = tv_int(0); return true; }
        int64_t m = 1;
        for (int64_t k = 0; k < -prec; k++) m *= 10;
        int64_t q = x / m, rem = x % m;
        if (rem < 0) { rem += m; q--; }
        if (rem * 2 > m || (rem * 2 == m && (q & 1))) q++; /* half to even */
        *out = tv_int(q * m);
        return true;
    }
    double x = numval(v);
    if (kind == 0) {
        if (!isfinite(x) || prec > 300) { *out = tv_float(x); return true; }
        if (prec >= 0) {
            /* printf rounds the exact binary value half to even, as Python's round() */
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
            *out = tv_float(strtod(buf, NULL));
        } else {
            double m = pow(10.0, (double)-prec);
            double y = x / m, fl = floor(y), d = y - fl;
            if (d > 0.5 || (d == 0.5 && fmod(fl, 2) != 0)) fl += 1;
            *out = tv_float(fl * m);
        }
        return true;
    }
    double scale = pow(10.0, (double)prec);
    double y = kind == 1 ? ceil(x * scale) : floor(x * scale);
    *out = tv_float(y / scale);
    return true;
}

static bool html_escape(trender *r, const tval *v, tval *out, bool force)
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
    if (!sb_out(r, &sb, out)) return false;
    out->sub |= STR_MARKUP;
    return true;
}

bool tmpl_markup_add(trender *r, const tval *a, const tval *b, tval *out)
{
    /* Markup's __add__ and __radd__ escape the plain str */
    tval x = *a, y = *b;
    if (!(x.sub & STR_MARKUP) && !html_escape(r, &x, &x, false)) return false;
    if (!(y.sub & STR_MARKUP) && !html_escape(r, &y, &y, false)) return false;
    strbuf sb;
    sb_init(&sb);
    sb_append(&sb, x.s.p, x.s.n);
    sb_append(&sb, y.s.p, y.s.n);
    if (!sb_out(r, &sb, out)) return false;
    out->sub |= STR_MARKUP;
    return true;
}

/* jinja's title filter: each piece after [-\s({[<]+ capitalized */
static bool jinja_title(trender *r, const tval *s, tval *out)
{
    char *d = tmpl_ralloc(r, s->s.n * 2 + 4);
    if (!d) return false;
    size_t k = 0;
    bool at_start = true;
    for (size_t i = 0; i < s->s.n;) {
        uint32_t cp;
        i += tmpl_utf8_decode((const unsigned char *)s->s.p + i, s->s.n - i, &cp);
        bool sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || tmpl_py_isspace(cp);
        uint32_t m = sep ? cp : at_start ? case_cp(cp, CASE_UPPER) : case_cp(cp, CASE_LOWER);
        at_start = sep;
        k += tmpl_utf8_encode(m, d + k);
    }
    d[k] = '\0';
    *out = tv_str(d, k);
    return tmpl_charge(r, s->s.n / 16);
}

static bool do_indent(trender *r, const tval *s, const tval *width, bool first, bool blank, tval *out)
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
            if (!arg_int(r, width, &w)) return false;
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
    return sb_out(r, &sb, out);
}

static bool tojson_filter(trender *r, const tval *v, const tval *args, size_t nargs, const char **kwn,
                          const size_t *kwnn, const tval *kwv, size_t nkw, tval *out)
{
    BIND("tojson()", "ensure_ascii", "indent", "separators", "sort_keys");
    tmpl_json_opts o = {0};
    o.ensure_ascii = g[0] && tmpl_truthy(&p[0]);
    o.sort_keys = g[3] && tmpl_truthy(&p[3]);
    char *spaces = NULL;
    if (g[1] && p[1].kind != TV_NONE) {
        o.indent_set = true;
        if (p[1].kind == TV_STR) {
            o.indent = p[1].s.p;
            o.indent_n = p[1].s.n;
        } else if (is_intlike(&p[1])) {
            int64_t w = intval(&p[1]);
            if (w < 0) w = 0;
            if (w > 4096) return tmpl_fail(r, FERRY_ERR_TOO_LARGE, "line %d: tojson indent too large", r->line);
            spaces = tmpl_ralloc(r, (size_t)w + 1);
            if (!spaces) return false;
            memset(spaces, ' ', (size_t)w);
            o.indent = spaces;
            o.indent_n = (size_t)w;
        } else {
            return type_error(r, "tojson indent must be an int or a str, not %s", &p[1]);
        }
    }
    o.item_sep = o.indent_set ? "," : ", ";
    o.item_sep_n = o.indent_set ? 1 : 2;
    o.key_sep = ": ";
    o.key_sep_n = 2;
    if (g[2] && p[2].kind != TV_NONE) {
        const tval *s = &p[2];
        if (s->kind != TV_LIST || (s->list->flavour != LF_LIST && s->list->flavour != LF_TUPLE) || s->list->n != 2 ||
            s->list->items[0].kind != TV_STR || s->list->items[1].kind != TV_STR)
            return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: tojson separators must be two strings", r->line);
        o.item_sep = s->list->items[0].s.p;
        o.item_sep_n = s->list->items[0].s.n;
        o.key_sep = s->list->items[1].s.p;
        o.key_sep_n = s->list->items[1].s.n;
    }
    strbuf sb;
    sb_init(&sb);
    if (!tmpl_json(r, v, &o, &sb)) {
        sb_free(&sb);
        return false;
    }
    return sb_out(r, &sb, out);
}

static tlist *gen_of(trender *r) { return tmpl_list_new(r, 0, LF_GEN); }

/* select/reject/selectattr/rejectattr */
static bool select_filter(trender *r, const tval *v, const tval *args, size_t nargs, bool attr, bool keep,
                          tval *out)
{
    tlist *res = gen_of(r);
    size_t cap = 0;
    if (!res) return false;
    *out = list_val(res);
    if (!tmpl_truthy(v)) return true; /* jinja iterates only `if value` */
    size_t off = attr ? 1 : 0;
    if (attr && nargs < 1) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: missing parameter for attribute name", r->line);
    int test = -1;
    if (nargs > off) {
        if (args[off].kind != TV_STR) return type_error(r, "test name must be a str, not %s", &args[off]);
        test = tmpl_test_id(args[off].s.p, args[off].s.n, NULL);
        if (test < 0)
            return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: no test named '%.*s'", r->line, (int)args[off].s.n, args[off].s.p);
    }
    tlist *items;
    if (!tmpl_iterate(r, v, &items)) return false;
    for (size_t i = 0; i < items->n; i++) {
        tval x = items->items[i];
        if (attr && !attr_path(r, &items->items[i], &args[0], &x)) return false;
        bool t;
        if (test >= 0) {
            if (!tmpl_call_test_id(r, test, &x, args + off + 1, nargs - off - 1, &t)) return false;
        } else {
            t = tmpl_truthy(&x);
        }
        if (t == keep && !tmpl_list_push(r, res, &cap, items->items[i])) return false;
    }
    return tmpl_charge(r, items->n);
}

static bool map_filter(trender *r, const tval *v, const tval *args, size_t nargs, const char **kwn,
                       const size_t *kwnn, const tval *kwv, size_t nkw, tval *out)
{
    tlist *items, *res = gen_of(r);
    size_t cap = 0;
    if (!res) return false;
    *out = list_val(res);
    if (!tmpl_truthy(v)) return true;
    if (!tmpl_iterate(r, v, &items)) return false;
    if (nargs == 0) {
        const tval *attr = NULL, *dflt = NULL;
        for (size_t k = 0; k < nkw; k++) {
            if (name_is(kwn[k], kwnn[k], "attribute")) attr = &kwv[k];
            else if (name_is(kwn[k], kwnn[k], "default")) dflt = &kwv[k];
            else return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: unexpected keyword argument '%.*s'", r->line, (int)kwnn[k], kwn[k]);
        }
        if (!attr) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: map requires a filter argument", r->line);
        for (size_t i = 0; i < items->n; i++) {
            tval x;
            if (!attr_path(r, &items->items[i], attr, &x)) return false;
            if (dflt && dflt->kind != TV_NONE && x.kind == TV_UNDEF) x = *dflt;
            if (!tmpl_list_push(r, res, &cap, x)) return false;
        }
        return true;
    }
    if (args[0].kind != TV_STR) return type_error(r, "filter name must be a str, not %s", &args[0]);
    int f = tmpl_filter_id(args[0].s.p, args[0].s.n, NULL);
    if (f < 0) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: no filter named '%.*s'", r->line, (int)args[0].s.n, args[0].s.p);
    for (size_t i = 0; i < items->n; i++) {
        tval x;
        if (!tmpl_call_filter_id(r, f, &items->items[i], args + 1, nargs - 1, kwn, kwnn, kwv, nkw, &x)) return false;
        if (!tmpl_list_push(r, res, &cap, x)) return false;
    }
    return true;
}

static bool minmax(trender *r, const tval *v, const tval *args, size_t nargs, const char **kwn,
                   const size_t *kwnn, const tval *kwv, size_t nkw, bool max, tval *out)
{
    BIND(max ? "max()" : "min()", "case_sensitive", "attribute");
    tlist *items;
    if (!tmpl_iterate(r, v, &items)) return false;
    if (items->n == 0) {
        *out = undef_named(UD_OTHER, "no aggregated item, sequence was empty", 38);
        return true;
    }
    tval none = tv_none();
    const tval *attr = g[1] ? &p[1] : &none;
    bool cs = g[0] && tmpl_truthy(&p[0]);
    tval best_key;
    size_t best = 0;
    if (!sort_key(r, &items->items[0], attr, cs, false, &best_key)) return false;
    for (size_t i = 1; i < items->n; i++) {
        tval k;
        bool better;
        if (!sort_key(r, &items->items[i], attr, cs, false, &k)) return false;
        if (!tmpl_order(r, max ? OP_GT : OP_LT, &k, &best_key, &better)) return false;
        if (better) {
            best = i;
            best_key = k;
        }
    }
    *out = items->items[best];
    return true;
}

bool tmpl_call_filter_id(trender *r, int id, const tval *in, const tval *args, size_t nargs, const char **kwn,
                         const size_t *kwnn, const tval *kwv, size_t nkw, tval *out)
{
    tval s;
    switch (id) {
    case F_ABS:
        if (!no_args(r, "abs()", nargs, nkw)) return false;
        if (in->kind == TV_FLOAT) *out = tv_float(fabs(in->f));
        else if (is_intlike(in)) {
            if (intval(in) == INT64_MIN) return tmpl_fail(r, FERRY_ERR_UNSUPPORTED, "line %d: integer overflow", r->line);
            *out = tv_int(intval(in) < 0 ? -intval(in) : intval(in));
        } else return type_error(r, "bad operand type for abs(): '%s'", in);
        return true;
    case F_ATTR: {
        BIND("attr()", "name");
        if (!g[0]) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: attr() needs a name", r->line);
        if (!arg_str(r, &p[0], "attribute name")) return false;
        if (in->kind == TV_UNDEF) return tmpl_fail_undef(r, in);
        bool found;
        if (!attribute(r, in, p[0].s.p, p[0].s.n, out, &found)) return false;
        if (!found) *out = undef_named(UD_ATTR, p[0].s.p, p[0].s.n);
        return true;
    }
    case F_CAPITALIZE:
        if (!no_args(r, "capitalize()", nargs, nkw) || !tmpl_to_str(r, in, &s)) return false;
        return py_title(r, s.s.p, s.s.n, true, out);
    case F_CENTER: {
        BIND("center()", "width");
        int64_t w = 80;
        if (g[0] && !arg_int(r, &p[0], &w)) return false;
        if (!tmpl_to_str(r, in, &s)) return false;
        if (w > 1 << 20) return tmpl_fail(r, FERRY_ERR_TOO_LARGE, "line %d: center width too large", r->line);
        int64_t len = (int64_t)tmpl_utf8_count(s.s.p, s.s.n);
        if (w <= len) { *out = s; return true; }
        int64_t marg = w - len, left = marg / 2 + (marg & w & 1);
        strbuf sb;
        sb_init(&sb);
        for (int64_t i = 0; i < left; i++) sb_putc(&sb, ' ');
        sb_append(&sb, s.s.p, s.s.n);
        for (int64_t i = left; i < marg; i++) sb_putc(&sb, ' ');
        return sb_out(r, &sb, out);
    }
    case F_DEFAULT: {
        BIND("default()", "default_value", "boolean");
        bool boolean = g[1] && tmpl_truthy(&p[1]);
        if (in->kind == TV_UNDEF || (boolean && !tmpl_truthy(in))) *out = g[0] ? p[0] : tv_str("", 0);
        else *out = *in;
        return true;
    }
    case F_DICTSORT: {
        BIND("dictsort()", "case_sensitive", "by", "reverse");
        if (in->kind != TV_DICT) return type_error(r, "dictsort needs a mapping, not %s", in);
        int pos = 0;
        if (g[1]) {
            if (p[1].kind == TV_STR && name_is(p[1].s.p, p[1].s.n, "value")) pos = 1;
            else if (!(p[1].kind == TV_STR && name_is(p[1].s.p, p[1].s.n, "key")))
                return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: you can only sort by either \"key\" or \"value\"", r->line);
        }
        const tdict *d = in->dict;
        tlist *pairs = tmpl_list_new(r, d->n, LF_LIST);
        tval *keys = tmpl_ralloc(r, (d->n + 1) * sizeof *keys);
        if (!pairs || !keys) return false;
        for (size_t i = 0; i < d->n; i++) {
            tlist *t = tmpl_list_new(r, 2, LF_TUPLE);
            if (!t) return false;
            t->items[0] = d->keys[i];
            t->items[1] = d->vals[i];
            t->n = 2;
            pairs->items[i] = list_val(t);
            keys[i] = pos ? d->vals[i] : d->keys[i];
            if (!(g[0] && tmpl_truthy(&p[0])) && !ignore_case(r, &keys[i], &keys[i])) return false;
        }
        pairs->n = d->n;
        tlist *o;
        if (!sorted_list(r, pairs, keys, g[2] && tmpl_truthy(&p[2]), &o)) return false;
        *out = list_val(o);
        return true;
    }
    case F_ESCAPE:
    case F_FORCEESCAPE:
        return no_args(r, "escape()", nargs, nkw) && html_escape(r, in, out, id == F_FORCEESCAPE);
    case F_FIRST: {
        if (!no_args(r, "first()", nargs, nkw)) return false;
        tlist *items;
        if (!tmpl_iterate(r, in, &items)) return false;
        *out = items->n ? items->items[0] : undef_named(UD_OTHER, "no first item, sequence was empty", 33);
        return true;
    }
    case F_LAST: {
        if (!no_args(r, "last()", nargs, nkw)) return false;
        if (in->kind == TV_LIST && in->list->flavour == LF_GEN)
            return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: 'generator' object is not reversible", r->line);
        if (in->kind == TV_LIST && (in->list->flavour == LF_KEYS || in->list->flavour == LF_VALUES || in->list->flavour == LF_ITEMS)) {
            /* dict views are reversible */
        }
        if (in->kind != TV_UNDEF && in->kind != TV_STR && in->kind != TV_LIST && in->kind != TV_DICT)
            return type_error(r, "'%s' object is not reversible", in);
        tlist *items;
        if (!tmpl_iterate(r, in, &items)) return false;
        *out = items->n ? items->items[items->n - 1] : undef_named(UD_OTHER, "no last item, sequence was empty", 32);
        return true;
    }
    case F_FLOAT: {
        BIND("float()", "default");
        if (in->kind == TV_UNDEF) return tmpl_fail_undef(r, in); /* float(Undefined) raises */
        tval dflt = g[0] ? p[0] : tv_float(0.0);
        double x;
        if (in->kind == TV_FLOAT) *out = *in;
        else if (is_intlike(in)) *out = tv_float((double)intval(in));
        else if (in->kind == TV_STR && py_float_from_str(in, &x)) *out = tv_float(x);
        else *out = dflt;
        return true;
    }
    case F_INT: {
        BIND("int()", "default", "base");
        if (in->kind == TV_UNDEF) return tmpl_fail_undef(r, in); /* int(Undefined) raises */
        tval dflt = g[0] ? p[0] : tv_int(0);
        int64_t base = 10, x;
        if (g[1] && !arg_int(r, &p[1], &base)) return false;
        bool overflow;
        double f;
        if (is_intlike(in)) {
            *out = tv_int(intval(in));
        } else if (in->kind == TV_FLOAT) {
            if (isnan(in->f)) *out = dflt;
            else if (isinf(in->f) || fabs(in->f) >= 9.2e18) return tmpl_fail(r, FERRY_ERR_UNSUPPORTED, "line %d: cannot convert float %s to integer", r->line, isinf(in->f) ? "infinity" : "(too large)");
            else *out = tv_int((int64_t)in->f);
        } else if (in->kind == TV_STR) {
            if (py_int_from_str(in, (int)base, &x, &overflow)) *out = tv_int(x);
            else if (overflow) return tmpl_fail(r, FERRY_ERR_UNSUPPORTED, "line %d: integer too large (Python's big integers are not supported)", r->line);
            else if (py_float_from_str(in, &f)) {
                if (isnan(f)) *out = dflt;
                else if (isinf(f) || fabs(f) >= 9.2e18) return tmpl_fail(r, FERRY_ERR_UNSUPPORTED, "line %d: cannot convert float to integer", r->line);
                else *out = tv_int((int64_t)f);
            } else *out = dflt;
        } else {
            *out = dflt;
        }
        return true;
    }
    case F_FORMAT: {
        if (nargs && nkw) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: can't handle positional and keyword arguments at the same time", r->line);
        if (!tmpl_to_str(r, in, &s)) return false;
        tval a;
        if (nkw) {
            tdict *d = tmpl_dict_new(r, nkw);
            if (!d) return false;
            for (size_t k = 0; k < nkw; k++)
                if (!tmpl_dict_set(r, d, tv_str(kwn[k], kwnn[k]), kwv[k])) return false;
            a = (tval){.kind = TV_DICT, .dict = d};
        } else {
            tlist *t = tmpl_list_new(r, nargs, LF_TUPLE);
            if (!t) return false;
            if (nargs) memcpy(t->items, args, nargs * sizeof *args);
            t->n = nargs;
            a = list_val(t);
        }
        return tmpl_percent_format(r, &s, &a, out);
    }
    case F_INDENT: {
        BIND("indent()", "width", "first", "blank");
        /* jinja's indent appends "\n" to the value itself: only a str survives that */
        if (in->kind == TV_UNDEF) return tmpl_fail_undef(r, in);
        if (in->kind != TV_STR) return type_error(r, "indent() needs a str, not %s", in);
        return do_indent(r, in, g[0] ? &p[0] : NULL, g[1] && tmpl_truthy(&p[1]), g[2] && tmpl_truthy(&p[2]), out);
    }
    case F_ITEMS: {
        if (!no_args(r, "items()", nargs, nkw)) return false;
        tlist *res = gen_of(r);
        if (!res) return false;
        *out = list_val(res);
        if (in->kind == TV_UNDEF) return true;
        if (in->kind != TV_DICT) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: can only get item pairs from a mapping", r->line);
        tval view;
        tmethod m = {.self = *in, .id = TM_ITEMS};
        if (!tmpl_call_method(r, &m, NULL, 0, NULL, NULL, NULL, 0, &view)) return false;
        res->items = view.list->items;
        res->n = view.list->n;
        return true;
    }
    case F_JOIN: {
        BIND("join()", "d", "attribute");
        tval sep = g[0] ? p[0] : tv_str("", 0);
        if (!tmpl_to_str(r, &sep, &sep)) return false;
        tlist *items;
        if (!tmpl_iterate(r, in, &items)) return false;
        strbuf sb;
        sb_init(&sb);
        for (size_t i = 0; i < items->n; i++) {
            tval x = items->items[i];
            if (g[1] && p[1].kind != TV_NONE && !attr_path(r, &items->items[i], &p[1], &x)) {
                sb_free(&sb);
                return false;
            }
            if (i) sb_append(&sb, sep.s.p, sep.s.n);
            if (!tmpl_str(r, &x, &sb) || sb.len > r->arena.limit) {
                sb_free(&sb);
                return r->st != FERRY_OK ? false : tmpl_fail(r, FERRY_ERR_TOO_LARGE, "line %d: string too large", r->line);
            }
        }
        return sb_out(r, &sb, out);
    }
    case F_LENGTH: {
        if (!no_args(r, "length()", nargs, nkw)) return false;
        int64_t n;
        if (!tmpl_length(r, in, &n)) return false;
        *out = tv_int(n);
        return true;
    }
    case F_LIST: {
        if (!no_args(r, "list()", nargs, nkw)) return false;
        tlist *items;
        if (!tmpl_iterate(r, in, &items)) return false;
        tlist *l = tmpl_list_new(r, items->n, LF_LIST);
        if (!l) return false;
        if (items->n) memcpy(l->items, items->items, items->n * sizeof(tval));
        l->n = items->n;
        *out = list_val(l);
        return tmpl_charge(r, l->n);
    }
    case F_LOWER:
    case F_UPPER:
        if (!no_args(r, "lower()", nargs, nkw) || !tmpl_to_str(r, in, &s)) return false;
        return map_case(r, s.s.p, s.s.n, id == F_LOWER ? CASE_LOWER : CASE_UPPER, out);
    case F_MAP: return map_filter(r, in, args, nargs, kwn, kwnn, kwv, nkw, out);
    case F_MAX:
    case F_MIN: return minmax(r, in, args, nargs, kwn, kwnn, kwv, nkw, id == F_MAX, out);
    case F_SELECT:
    case F_REJECT:
    case F_SELECTATTR:
    case F_REJECTATTR:
        if (nkw) return tmpl_fail(r, FERRY_ERR_UNSUPPORTED, "line %d: keyword arguments to select/reject are not supported", r->line);
        return select_filter(r, in, args, nargs, id == F_SELECTATTR || id == F_REJECTATTR,
                             id == F_SELECT || id == F_SELECTATTR, out);
    case F_REPLACE: {
        BIND("replace()", "old", "new", "count");
        if (!g[0] || !g[1]) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: replace() needs old and new", r->line);
        tval old, nw;
        int64_t count = -1;
        if (g[2] && p[2].kind != TV_NONE && !arg_int(r, &p[2], &count)) return false;
        if (!tmpl_to_str(r, in, &s) || !tmpl_to_str(r, &p[0], &old) || !tmpl_to_str(r, &p[1], &nw)) return false;
        return do_replace(r, &s, &old, &nw, count, out);
    }
    case F_REVERSE: {
        if (!no_args(r, "reverse()", nargs, nkw)) return false;
        if (in->kind == TV_STR) {
            tval step = tv_int(-1);
            return tmpl_slice(r, in, NULL, NULL, &step, out);
        }
        bool iterator = in->kind == TV_UNDEF || in->kind == TV_DICT ||
                        (in->kind == TV_LIST && in->list->flavour != LF_GEN);
        if (!iterator && !(in->kind == TV_LIST))
            return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: argument must be iterable", r->line);
        tlist *items;
        if (!tmpl_iterate(r, in, &items)) return false;
        tlist *l = tmpl_list_new(r, items->n, iterator ? LF_GEN : LF_LIST);
        if (!l) return false;
        for (size_t i = 0; i < items->n; i++) l->items[i] = items->items[items->n - 1 - i];
        l->n = items->n;
        *out = list_val(l);
        return tmpl_charge(r, l->n);
    }
    case F_ROUND: {
        BIND("round()", "precision", "method");
        int64_t prec = 0;
        if (g[0] && !arg_int(r, &p[0], &prec)) return false;
        return round_value(r, in, prec, g[1] ? &p[1] : NULL, out);
    }
    case F_SAFE:
        if (!no_args(r, "safe()", nargs, nkw) || !tmpl_to_str(r, in, out)) return false;
        out->sub |= STR_MARKUP;
        return true;
    case F_SORT: {
        BIND("sort()", "reverse", "case_sensitive", "attribute");
        tlist *items;
        if (!tmpl_iterate(r, in, &items)) return false;
        tval *keys = tmpl_ralloc(r, (items->n + 1) * sizeof *keys);
        if (!keys) return false;
        tval none = tv_none();
        for (size_t i = 0; i < items->n; i++)
            if (!sort_key(r, &items->items[i], g[2] ? &p[2] : &none, g[1] && tmpl_truthy(&p[1]), true, &keys[i])) return false;
        tlist *o;
        if (!sorted_list(r, items, keys, g[0] && tmpl_truthy(&p[0]), &o)) return false;
        *out = list_val(o);
        return true;
    }
    case F_STRING:
        if (!no_args(r, "string()", nargs, nkw)) return false;
        return tmpl_to_str(r, in, out);
    case F_SUM: {
        BIND("sum()", "attribute", "start");
        tval acc = g[1] ? p[1] : tv_int(0);
        if (acc.kind == TV_STR) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: sum() can't sum strings", r->line);
        tlist *items;
        if (!tmpl_iterate(r, in, &items)) return false;
        for (size_t i = 0; i < items->n; i++) {
            tval x = items->items[i];
            if (g[0] && p[0].kind != TV_NONE && !attr_path(r, &items->items[i], &p[0], &x)) return false;
            if (!tmpl_add_values(r, &acc, &x, &acc)) return false;
        }
        *out = acc;
        return true;
    }
    case F_TITLE:
        if (!no_args(r, "title()", nargs, nkw) || !tmpl_to_str(r, in, &s)) return false;
        return jinja_title(r, &s, out);
    case F_TOJSON: return tojson_filter(r, in, args, nargs, kwn, kwnn, kwv, nkw, out);
    case F_TRIM: {
        BIND("trim()", "chars");
        if (!tmpl_to_str(r, in, &s)) return false;
        return do_strip(r, &s, g[0] ? &p[0] : NULL, true, true, out);
    }
    case F_UNIQUE: {
        BIND("unique()", "case_sensitive", "attribute");
        tlist *items, *res = gen_of(r);
        size_t cap = 0;
        tdict *seen = tmpl_dict_new(r, 8);
        if (!res || !seen || !tmpl_iterate(r, in, &items)) return false;
        tval none = tv_none();
        for (size_t i = 0; i < items->n; i++) {
            tval k, dummy;
            bool found;
            if (!sort_key(r, &items->items[i], g[1] ? &p[1] : &none, g[0] && tmpl_truthy(&p[0]), false, &k)) return false;
            if (!tmpl_dict_get(r, seen, &k, &dummy, &found)) return false;
            if (found) continue;
            if (!tmpl_dict_set(r, seen, k, tv_none()) || !tmpl_list_push(r, res, &cap, items->items[i])) return false;
        }
        *out = list_val(res);
        return true;
    }
    case F_WORDCOUNT: {
        if (!no_args(r, "wordcount()", nargs, nkw) || !tmpl_to_str(r, in, &s)) return false;
        int64_t words = 0;
        bool in_word = false;
        for (size_t i = 0; i < s.s.n;) {
            uint32_t cp;
            i += tmpl_utf8_decode((const unsigned char *)s.s.p + i, s.s.n - i, &cp);
            bool w = cp == '_' || cp_is_alpha(cp) || cp_is_numeric(cp);
            if (w && !in_word) words++;
            in_word = w;
        }
        *out = tv_int(words);
        return tmpl_charge(r, s.s.n / 16);
    }
    }
    return tmpl_fail(r, FERRY_ERR_INTERNAL, "line %d: unknown filter %d", r->line, id);
}

/* ---- tests ------------------------------------------------------------ */

static bool test_arity(trender *r, const char *name, size_t nargs, size_t want)
{
    if (nargs != want)
        return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: test '%s' takes %zu argument(s) (%zu given)", r->line, name,
                         want, nargs);
    return true;
}

/* value % 2 etc. as Python evaluates it for odd/even/divisibleby */
static bool py_mod(trender *r, const tval *v, const tval *m, tval *out)
{
    if (v->kind == TV_UNDEF) return tmpl_fail_undef(r, v);
    if (v->kind == TV_STR) return tmpl_percent_format(r, v, m, out); /* str % x formats */
    if (!is_number(v) || !is_number(m)) {
        return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: unsupported operand type(s) for %%: '%s' and '%s'", r->line,
                         tmpl_type_name(v), tmpl_type_name(m));
    }
    if (numval(m) == 0) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: integer division or modulo by zero", r->line);
    if (is_intlike(v) && is_intlike(m)) {
        int64_t x = intval(v), y = intval(m);
        if (y == -1) { *out = tv_int(0); return true; }
        int64_t q = x % y;
        if (q != 0 && ((q < 0) != (y < 0))) q += y;
        *out = tv_int(q);
        return true;
    }
    double x = numval(v), y = numval(m), q = fmod(x, y);
    if (q != 0 && ((q < 0) != (y < 0))) q += y;
    *out = tv_float(q);
    return true;
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
static bool str_case_is(const tval *s, bool upper)
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

bool tmpl_call_test_id(trender *r, int id, const tval *v, const tval *args, size_t nargs, bool *out)
{
    tval t;
    size_t want = 0;
    switch (id) {
    case T_DIVISIBLEBY: case T_SAMEAS: case T_IN: case T_EQ: case T_NE: case T_GT: case T_GE: case T_LT: case T_LE:
        want = 1;
        break;
    default: break;
    }
    if (!test_arity(r, "test", nargs, want)) return false;
    switch (id) {
    case T_ODD:
    case T_EVEN: {
        tval two = tv_int(2), one = tv_int(1), zero = tv_int(0);
        if (!py_mod(r, v, &two, &t)) return false;
        return tmpl_equal(r, &t, id == T_ODD ? &one : &zero, out);
    }
    case T_DIVISIBLEBY: {
        tval zero = tv_int(0);
        if (!py_mod(r, v, &args[0], &t)) return false;
        return tmpl_equal(r, &t, &zero, out);
    }
    case T_DEFINED: *out = v->kind != TV_UNDEF; return true;
    case T_UNDEFINED: *out = v->kind == TV_UNDEF; return true;
    case T_FILTER: *out = v->kind == TV_STR && tmpl_filter_id(v->s.p, v->s.n, NULL) >= 0; return true;
    case T_TEST: *out = v->kind == TV_STR && tmpl_test_id(v->s.p, v->s.n, NULL) >= 0; return true;
    case T_NONE: *out = v->kind == TV_NONE; return true;
    case T_BOOLEAN: *out = v->kind == TV_BOOL; return true;
    case T_FALSE: *out = v->kind == TV_BOOL && !v->b; return true;
    case T_TRUE: *out = v->kind == TV_BOOL && v->b; return true;
    case T_INTEGER: *out = v->kind == TV_INT; return true;
    case T_FLOAT: *out = v->kind == TV_FLOAT; return true;
    case T_LOWER:
    case T_UPPER:
        if (!tmpl_to_str(r, v, &t)) return false;
        *out = str_case_is(&t, id == T_UPPER);
        return true;
    case T_STRING: *out = v->kind == TV_STR; return true;
    case T_MAPPING: *out = v->kind == TV_DICT; return true;
    case T_NUMBER: *out = is_number(v); return true;
    case T_SEQUENCE:
        /* has len() and __getitem__: str, list, tuple, range, dict, and Undefined */
        *out = v->kind == TV_UNDEF || v->kind == TV_STR || v->kind == TV_DICT ||
               (v->kind == TV_LIST && (v->list->flavour == LF_LIST || v->list->flavour == LF_TUPLE || v->list->flavour == LF_RANGE));
        return true;
    case T_ITERABLE:
        *out = v->kind == TV_UNDEF || v->kind == TV_STR || v->kind == TV_LIST || v->kind == TV_DICT || v->kind == TV_LOOP;
        return true;
    case T_CALLABLE:
        *out = v->kind == TV_MACRO || v->kind == TV_FUNC || v->kind == TV_METHOD;
        return true;
    case T_SAMEAS: {
        const tval *o = &args[0];
        /* identity: singletons, small ints (cached by CPython) and shared containers */
        if (v->kind != o->kind) *out = false;
        else if (v->kind == TV_NONE || v->kind == TV_UNDEF) *out = v->kind == TV_NONE;
        else if (v->kind == TV_BOOL) *out = v->b == o->b;
        else if (v->kind == TV_INT) *out = v->i == o->i && v->i >= -5 && v->i <= 256;
        else if (v->kind == TV_LIST) *out = v->list == o->list;
        else if (v->kind == TV_DICT || v->kind == TV_NS) *out = v->dict == o->dict;
        else if (v->kind == TV_STR) *out = v->s.p == o->s.p && v->s.n == o->s.n;
        else *out = false;
        return true;
    }
    case T_ESCAPED: *out = false; return true;
    case T_IN: {
        return tmpl_contains(r, v, &args[0], out);
    }
    case T_EQ: return tmpl_equal(r, v, &args[0], out);
    case T_NE:
        if (!tmpl_equal(r, v, &args[0], out)) return false;
        *out = !*out;
        return true;
    case T_GT: return tmpl_order(r, OP_GT, v, &args[0], out);
    case T_GE: return tmpl_order(r, OP_GE, v, &args[0], out);
    case T_LT: return tmpl_order(r, OP_LT, v, &args[0], out);
    case T_LE: return tmpl_order(r, OP_LE, v, &args[0], out);
    }
    return tmpl_fail(r, FERRY_ERR_INTERNAL, "line %d: unknown test %d", r->line, id);
}

/* ---- methods ---------------------------------------------------------- */

static bool dict_view(trender *r, const tdict *d, int which, tval *out)
{
    tlist *l = tmpl_list_new(r, d->n, which == TM_ITEMS ? LF_ITEMS : which == TM_KEYS ? LF_KEYS : LF_VALUES);
    if (!l) return false;
    for (size_t i = 0; i < d->n; i++) {
        if (which == TM_KEYS) l->items[i] = d->keys[i];
        else if (which == TM_VALUES) l->items[i] = d->vals[i];
        else {
            tlist *t = tmpl_list_new(r, 2, LF_TUPLE);
            if (!t) return false;
            t->items[0] = d->keys[i];
            t->items[1] = d->vals[i];
            t->n = 2;
            l->items[i] = list_val(t);
        }
    }
    l->n = d->n;
    *out = list_val(l);
    return tmpl_charge(r, d->n);
}

/* s[start:end] for the optional start/end arguments of find/count/startswith */
static bool sub_range(trender *r, const tval *s, const tval *start, const tval *end, size_t *b, size_t *e, size_t *cp_base)
{
    *b = 0;
    *e = s->s.n;
    *cp_base = 0;
    if ((!start || start->kind == TV_NONE) && (!end || end->kind == TV_NONE)) return true;
    size_t count = tmpl_utf8_count(s->s.p, s->s.n);
    int64_t a, z;
    if (!slice_bound(r, start, 0, &a) || !slice_bound(r, end, INT64_MAX, &z)) return false;
    slice_adjust((int64_t)count, &a, &z, 1);
    if (z < a) z = a;
    *b = cp_to_byte(s->s.p, s->s.n, (size_t)a);
    *e = cp_to_byte(s->s.p, s->s.n, (size_t)z);
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
    *res = false;
    for (size_t i = 0; i < nc; i++) {
        if (cands[i].kind != TV_STR)
            return type_error(r, suffix ? "endswith first arg must be str or a tuple of str, not %s"
                                        : "startswith first arg must be str or a tuple of str, not %s", &cands[i]);
        size_t m = cands[i].s.n;
        if (m > e - b) continue;
        if (memcmp(suffix ? s->s.p + e - m : s->s.p + b, cands[i].s.p, m) == 0) *res = true;
    }
    return true;
}

/* find/rfind/index/rindex/count */
static bool find_sub(trender *r, const tval *s, const tval *sub, const tval *start, const tval *end, int mode, tval *out)
{
    if (!arg_str(r, sub, "substring")) return false;
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
    if (!arg_int(r, width, &w)) return false;
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
    return sb_out(r, &sb, out);
}

static bool str_method(trender *r, const tval *s, int id, const tval *args, size_t nargs, const char **kwn,
                       const size_t *kwnn, const tval *kwv, size_t nkw, tval *out)
{
    switch (id) {
    case TM_STRIP:
    case TM_LSTRIP:
    case TM_RSTRIP: {
        BIND("strip()", "chars");
        return do_strip(r, s, g[0] ? &p[0] : NULL, id != TM_RSTRIP, id != TM_LSTRIP, out);
    }
    case TM_SPLIT:
    case TM_RSPLIT: {
        BIND("split()", "sep", "maxsplit");
        int64_t maxsplit = -1;
        if (g[1] && !arg_int(r, &p[1], &maxsplit)) return false;
        return do_split(r, s, g[0] ? &p[0] : NULL, maxsplit, id == TM_RSPLIT, out);
    }
    case TM_SPLITLINES: {
        BIND("splitlines()", "keepends");
        tlist *l;
        if (!splitlines(r, s->s.p, s->s.n, g[0] && tmpl_truthy(&p[0]), &l)) return false;
        *out = list_val(l);
        return true;
    }
    case TM_STARTSWITH:
    case TM_ENDSWITH: {
        BIND("startswith()", "prefix", "start", "end");
        if (!g[0]) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: startswith/endswith needs an argument", r->line);
        bool res;
        if (!affix(r, s, &p[0], g[1] ? &p[1] : NULL, g[2] ? &p[2] : NULL, id == TM_ENDSWITH, &res)) return false;
        *out = tv_bool(res);
        return true;
    }
    case TM_UPPER: return no_args(r, "upper()", nargs, nkw) && map_case(r, s->s.p, s->s.n, CASE_UPPER, out);
    case TM_LOWER:
    case TM_CASEFOLD: return no_args(r, "lower()", nargs, nkw) && map_case(r, s->s.p, s->s.n, CASE_LOWER, out);
    case TM_SWAPCASE: return no_args(r, "swapcase()", nargs, nkw) && map_case(r, s->s.p, s->s.n, CASE_SWAP, out);
    case TM_TITLE: return no_args(r, "title()", nargs, nkw) && py_title(r, s->s.p, s->s.n, false, out);
    case TM_CAPITALIZE: return no_args(r, "capitalize()", nargs, nkw) && py_title(r, s->s.p, s->s.n, true, out);
    case TM_REPLACE: {
        BIND("replace()", "old", "new", "count");
        if (!g[0] || !g[1]) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: replace() needs old and new", r->line);
        if (!arg_str(r, &p[0], "replace() argument 1") || !arg_str(r, &p[1], "replace() argument 2")) return false;
        int64_t count = -1;
        if (g[2] && !arg_int(r, &p[2], &count)) return false;
        return do_replace(r, s, &p[0], &p[1], count, out);
    }
    case TM_FIND:
    case TM_RFIND:
    case TM_INDEX:
    case TM_RINDEX:
    case TM_COUNT: {
        BIND("find()", "sub", "start", "end");
        if (!g[0]) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: find() needs an argument", r->line);
        return find_sub(r, s, &p[0], g[1] ? &p[1] : NULL, g[2] ? &p[2] : NULL, id, out);
    }
    case TM_JOIN: {
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
        return sb_out(r, &sb, out);
    }
    case TM_FORMAT: return str_format(r, s, args, nargs, kwn, kwnn, kwv, nkw, out);
    case TM_ISDIGIT:
    case TM_ISNUMERIC:
        if (!no_args(r, "isdigit()", nargs, nkw)) return false;
        *out = tv_bool(str_all(s, cp_is_numeric, true));
        return true;
    case TM_ISDECIMAL:
        if (!no_args(r, "isdecimal()", nargs, nkw)) return false;
        *out = tv_bool(str_all(s, cp_is_decimal, true));
        return true;
    case TM_ISALPHA:
        if (!no_args(r, "isalpha()", nargs, nkw)) return false;
        *out = tv_bool(str_all(s, cp_is_alpha, true));
        return true;
    case TM_ISALNUM: {
        if (!no_args(r, "isalnum()", nargs, nkw)) return false;
        bool ok = s->s.n > 0;
        for (size_t i = 0; i < s->s.n && ok;) {
            uint32_t cp;
            i += tmpl_utf8_decode((const unsigned char *)s->s.p + i, s->s.n - i, &cp);
            ok = cp_is_alpha(cp) || cp_is_numeric(cp);
        }
        *out = tv_bool(ok);
        return true;
    }
    case TM_ISSPACE:
        if (!no_args(r, "isspace()", nargs, nkw)) return false;
        *out = tv_bool(str_all(s, tmpl_py_isspace, true));
        return true;
    case TM_ISLOWER:
    case TM_ISUPPER:
        if (!no_args(r, "islower()", nargs, nkw)) return false;
        *out = tv_bool(str_case_is(s, id == TM_ISUPPER));
        return true;
    case TM_ISTITLE: {
        if (!no_args(r, "istitle()", nargs, nkw)) return false;
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
    case TM_CENTER:
    case TM_LJUST:
    case TM_RJUST: {
        BIND("center()", "width", "fillchar");
        if (!g[0]) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: width argument missing", r->line);
        return justify(r, s, &p[0], g[1] ? &p[1] : NULL, id == TM_CENTER ? '^' : id == TM_LJUST ? '<' : '>', out);
    }
    case TM_ZFILL: {
        BIND("zfill()", "width");
        int64_t w = 0;
        if (!g[0] || !arg_int(r, &p[0], &w)) return g[0] ? false : tmpl_fail(r, FERRY_ERR_INVALID, "line %d: zfill() needs a width", r->line);
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
        return sb_out(r, &sb, out);
    }
    case TM_PARTITION:
    case TM_RPARTITION: {
        BIND("partition()", "sep");
        if (!g[0] || !arg_str(r, &p[0], "separator")) return g[0] ? false : tmpl_fail(r, FERRY_ERR_INVALID, "line %d: partition() needs a separator", r->line);
        if (p[0].s.n == 0) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: empty separator", r->line);
        tval idx;
        if (!find_sub(r, s, &p[0], NULL, NULL, id == TM_PARTITION ? TM_FIND : TM_RFIND, &idx)) return false;
        tlist *t = tmpl_list_new(r, 3, LF_TUPLE);
        if (!t) return false;
        t->n = 3;
        if (idx.i < 0) {
            t->items[0] = id == TM_PARTITION ? *s : tv_str("", 0);
            t->items[1] = tv_str("", 0);
            t->items[2] = id == TM_PARTITION ? tv_str("", 0) : *s;
        } else {
            size_t b = cp_to_byte(s->s.p, s->s.n, (size_t)idx.i);
            t->items[0] = tv_str(s->s.p, b);
            t->items[1] = tv_str(s->s.p + b, p[0].s.n);
            t->items[2] = tv_str(s->s.p + b + p[0].s.n, s->s.n - b - p[0].s.n);
        }
        *out = list_val(t);
        return true;
    }
    case TM_REMOVEPREFIX:
    case TM_REMOVESUFFIX: {
        BIND("removeprefix()", "affix");
        if (!g[0] || !arg_str(r, &p[0], "argument")) return g[0] ? false : tmpl_fail(r, FERRY_ERR_INVALID, "line %d: argument missing", r->line);
        size_t m = p[0].s.n;
        *out = *s;
        if (m <= s->s.n) {
            if (id == TM_REMOVEPREFIX && memcmp(s->s.p, p[0].s.p, m) == 0) *out = tv_str(s->s.p + m, s->s.n - m);
            if (id == TM_REMOVESUFFIX && m && memcmp(s->s.p + s->s.n - m, p[0].s.p, m) == 0) *out = tv_str(s->s.p, s->s.n - m);
        }
        return true;
    }
    case TM_EXPANDTABS: {
        BIND("expandtabs()", "tabsize");
        int64_t ts = 8;
        if (g[0] && !arg_int(r, &p[0], &ts)) return false;
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
        return sb_out(r, &sb, out);
    }
    }
    return tmpl_fail(r, FERRY_ERR_INTERNAL, "line %d: unknown str method %d", r->line, id);
}

bool tmpl_call_method(trender *r, const tmethod *m, const tval *args, size_t nargs, const char **kwn,
                      const size_t *kwnn, const tval *kwv, size_t nkw, tval *out)
{
    const tval *self = &m->self;
    if (self->kind == TV_STR) return str_method(r, self, m->id, args, nargs, kwn, kwnn, kwv, nkw, out);
    switch (m->id) {
    case TM_ITEMS:
    case TM_KEYS:
    case TM_VALUES:
        return no_args(r, "items()", nargs, nkw) && dict_view(r, self->dict, m->id, out);
    case TM_GET: {
        BIND("get()", "key", "default");
        if (!g[0]) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: get expected at least 1 argument, got 0", r->line);
        if (nkw) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: get() takes no keyword arguments", r->line);
        bool found;
        if (!tmpl_dict_get(r, self->dict, &p[0], out, &found)) return false;
        if (!found) *out = g[1] ? p[1] : tv_none();
        return true;
    }
    case TM_DICT_COPY: {
        if (!no_args(r, "copy()", nargs, nkw)) return false;
        tdict *d = tmpl_dict_new(r, self->dict->n);
        if (!d) return false;
        for (size_t i = 0; i < self->dict->n; i++)
            if (!tmpl_dict_set(r, d, self->dict->keys[i], self->dict->vals[i])) return false;
        *out = (tval){.kind = TV_DICT, .dict = d};
        return true;
    }
    case TM_LIST_COPY: {
        if (!no_args(r, "copy()", nargs, nkw)) return false;
        tlist *l = tmpl_list_new(r, self->list->n, LF_LIST);
        if (!l) return false;
        if (self->list->n) memcpy(l->items, self->list->items, self->list->n * sizeof(tval));
        l->n = self->list->n;
        *out = list_val(l);
        return true;
    }
    case TM_INDEX:
    case TM_COUNT: {
        if (nkw || nargs < 1 || nargs > 3) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: %s() takes 1 to 3 positional arguments", r->line, m->id == TM_INDEX ? "index" : "count");
        const tlist *l = self->list;
        int64_t count = 0;
        if (!tmpl_charge(r, l->n)) return false;
        int64_t a = 0, z = (int64_t)l->n;
        if (m->id == TM_INDEX && nargs > 1) {
            if (!slice_bound(r, &args[1], 0, &a) || (nargs > 2 && !slice_bound(r, &args[2], INT64_MAX, &z))) return false;
            slice_adjust((int64_t)l->n, &a, &z, 1);
        }
        for (int64_t i = a; i < z; i++) {
            bool eq;
            if (!tmpl_equal(r, &l->items[i], &args[0], &eq)) return false;
            if (!eq) continue;
            if (m->id == TM_INDEX) {
                *out = tv_int(i);
                return true;
            }
            count++;
        }
        if (m->id == TM_INDEX) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: value is not in list", r->line);
        *out = tv_int(count);
        return true;
    }
    case TM_LOOP_CYCLE:
        if (nkw) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: cycle() takes no keyword arguments", r->line);
        if (!nargs) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: no items for cycling given", r->line);
        *out = args[self->loop->i % nargs];
        return true;
    case TM_LOOP_CHANGED: {
        tloop *l = self->loop;
        if (nkw) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: changed() takes no keyword arguments", r->line);
        tlist *t = tmpl_list_new(r, nargs, LF_LIST);
        if (!t) return false;
        if (nargs) memcpy(t->items, args, nargs * sizeof *args);
        t->n = nargs;
        tval now = list_val(t);
        bool eq = false;
        if (l->has_changed && !tmpl_equal(r, &now, &l->changed_last, &eq)) return false;
        *out = tv_bool(!l->has_changed || !eq);
        l->has_changed = true;
        l->changed_last = now;
        return true;
    }
    }
    return tmpl_fail(r, FERRY_ERR_INTERNAL, "line %d: unknown method %d", r->line, m->id);
}

/* ---- globals ---------------------------------------------------------- */

static bool namespace_from(trender *r, tdict *d, const tval *src)
{
    if (src->kind == TV_UNDEF) return tmpl_fail_undef(r, src); /* dict() asks Undefined for .keys */
    if (src->kind == TV_DICT || src->kind == TV_NS) {
        for (size_t i = 0; i < src->dict->n; i++)
            if (!tmpl_dict_set(r, d, src->dict->keys[i], src->dict->vals[i])) return false;
        return true;
    }
    tlist *items;
    if (!tmpl_iterate(r, src, &items)) return false;
    for (size_t i = 0; i < items->n; i++) {
        tlist *pair;
        if (!tmpl_iterate(r, &items->items[i], &pair)) return false;
        if (pair->n != 2)
            return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: dictionary update sequence element #%zu has length %zu; 2 is required",
                             r->line, i, pair->n);
        if (!tmpl_dict_set(r, d, pair->items[0], pair->items[1])) return false;
    }
    return true;
}

static bool strftime_now(trender *r, const tval *fmt, tval *out)
{
    if (!arg_str(r, fmt, "strftime_now() format")) return false;
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char *f = tmpl_ralloc(r, fmt->s.n + 1);
    if (!f) return false;
    memcpy(f, fmt->s.p, fmt->s.n);
    f[fmt->s.n] = '\0';
    size_t cap = 256 + fmt->s.n * 16;
    if (cap > 65536) return tmpl_fail(r, FERRY_ERR_TOO_LARGE, "line %d: strftime format too long", r->line);
    char *buf = tmpl_ralloc(r, cap);
    if (!buf) return false;
    size_t n = fmt->s.n ? strftime(buf, cap, f, &tm) : 0;
    *out = tv_str(buf, n);
    return true;
}

bool tmpl_call_func(trender *r, int fn, const tval *args, size_t nargs, const char **kwn, const size_t *kwnn,
                    const tval *kwv, size_t nkw, tval *out)
{
    switch (fn) {
    case TF_RANGE: {
        if (nkw) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: range() takes no keyword arguments", r->line);
        if (nargs < 1 || nargs > 3) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: range expected 1 to 3 arguments, got %zu", r->line, nargs);
        int64_t a = 0, b, st = 1;
        for (size_t i = 0; i < nargs; i++)
            if (!arg_int(r, &args[i], i == 0 && nargs == 1 ? &b : i == 0 ? &a : i == 1 ? &b : &st)) return false;
        if (st == 0) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: range() arg 3 must not be zero", r->line);
        __int128 span = st > 0 ? (__int128)b - a : (__int128)a - b;
        __int128 step = st > 0 ? st : -(__int128)st;
        __int128 cnt = span <= 0 ? 0 : (span - 1) / step + 1;
        if (cnt > TMPL_MAX_RANGE)
            return tmpl_fail(r, FERRY_ERR_TOO_LARGE, "line %d: range too big (the sandbox allows at most %d items)", r->line, TMPL_MAX_RANGE);
        tlist *l = tmpl_list_new(r, (size_t)cnt, LF_RANGE);
        if (!l) return false;
        for (int64_t i = 0; i < (int64_t)cnt; i++) l->items[i] = tv_int(a + i * st);
        l->n = (size_t)cnt;
        l->r_start = a;
        l->r_stop = b;
        l->r_step = st;
        *out = list_val(l);
        return tmpl_charge(r, (uint64_t)cnt);
    }
    case TF_NAMESPACE:
    case TF_DICT: {
        if (nargs > 1)
            return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: %s expected at most 1 positional argument, got %zu", r->line,
                             fn == TF_DICT ? "dict" : "namespace", nargs);
        tdict *d = tmpl_dict_new(r, nkw + 4);
        if (!d) return false;
        if (nargs && !namespace_from(r, d, &args[0])) return false;
        for (size_t k = 0; k < nkw; k++)
            if (!tmpl_dict_set(r, d, tv_str(kwn[k], kwnn[k]), kwv[k])) return false;
        *out = (tval){.kind = fn == TF_DICT ? TV_DICT : TV_NS, .dict = d};
        return true;
    }
    case TF_RAISE_EXCEPTION: {
        /* the template's own message, as transformers raises it */
        tval msg = nargs ? args[0] : (nkw ? kwv[0] : tv_str("", 0));
        if (!tmpl_to_str(r, &msg, &msg)) return false;
        bool first = r->st == FERRY_OK;
        tmpl_fail(r, FERRY_ERR_INVALID, "%.*s", (int)(msg.s.n > 900 ? 900 : msg.s.n), msg.s.p);
        if (first) r->raised = true;
        return false;
    }
    case TF_STRFTIME_NOW: {
        BIND("strftime_now()", "format");
        if (!g[0]) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: strftime_now() needs a format", r->line);
        return strftime_now(r, &p[0], out);
    }
    default: {
        static const char *const names[] = {"range", "namespace", "dict", "raise_exception", "strftime_now",
                                            "cycler", "joiner", "lipsum"};
        return tmpl_fail(r, FERRY_ERR_UNSUPPORTED, "line %d: function '%s' is not supported", r->line,
                         fn >= 0 && fn < 8 ? names[fn] : "?");
    }
    }
}
