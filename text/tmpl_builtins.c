/*
 * tmpl_builtins.c - what a chat template can call: jinja2's filters and
 * tests, the methods of dict, list and `loop`, attribute and item lookup
 * with the sandbox's rules, slicing, and the globals (range, namespace,
 * dict, raise_exception, strftime_now). Python's str methods and string
 * formatting are tmpl_str.c.
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
 *
 * A filter is one function and one row of `filters` (the row's index is the
 * id the parser stores); a method of a dict, list or loop is one function
 * in `object_methods`, indexed by its TM_* id (a str's: tmpl_str.c).
 */
#include "tmpl_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- names ------------------------------------------------------------ */

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

bool tmpl_type_error(trender *r, const char *fmt, const tval *v)
{
    if (v && v->kind == TV_UNDEF) return tmpl_fail_undef(r, v);
    char msg[256];
    snprintf(msg, sizeof msg, fmt, v ? tmpl_type_name(v) : "");
    return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: %s", r->line, msg);
}

/* Binds positional and keyword arguments to parameters, as Python does. */
bool tmpl_bind(trender *r, const char *what, const char *const *names, size_t nparams, const tmpl_args *a,
               tval *out, bool *given)
{
    for (size_t i = 0; i < nparams; i++) given[i] = false;
    if (a->nargs > nparams)
        return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: %s takes at most %zu argument(s) (%zu given)", r->line, what,
                         nparams, a->nargs);
    for (size_t i = 0; i < a->nargs; i++) {
        out[i] = a->args[i];
        given[i] = true;
    }
    for (size_t k = 0; k < a->nkw; k++) {
        size_t p;
        for (p = 0; p < nparams; p++)
            if (name_is(a->kwn[k], a->kwnn[k], names[p])) break;
        if (p == nparams)
            return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: %s got an unexpected keyword argument '%.*s'", r->line,
                             what, (int)a->kwnn[k], a->kwn[k]);
        if (given[p])
            return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: %s got multiple values for argument '%s'", r->line, what,
                             names[p]);
        out[p] = a->kwv[k];
        given[p] = true;
    }
    return true;
}


bool tmpl_no_args(trender *r, const char *what, const tmpl_args *a)
{
    if (a->nargs || a->nkw) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: %s takes no arguments", r->line, what);
    return true;
}


bool tmpl_arg_int(trender *r, const tval *v, int64_t *out)
{
    if (!tv_is_int(v)) return tmpl_type_error(r, "'%s' object cannot be interpreted as an integer", v);
    *out = tv_int_of(v);
    return true;
}

bool tmpl_arg_str(trender *r, const tval *v, const char *what)
{
    if (v->kind == TV_STR) return true;
    if (v->kind == TV_UNDEF) return tmpl_fail_undef(r, v);
    return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: %s must be str, not %s", r->line, what, tmpl_type_name(v));
}


/* a string from a strbuf (freed) */
bool tmpl_sb_out(trender *r, strbuf *sb, tval *out)
{
    if (!tmpl_charge(r, sb->len / 16)) {
        sb_free(sb);
        return false;
    }
    return tmpl_sb_to_str(r, sb, out);
}

/* byte offsets of the code points of s (count + 1 entries) */
bool tmpl_cp_offsets(trender *r, const char *s, size_t n, size_t **offs, size_t *count)
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
size_t tmpl_cp_to_byte(const char *s, size_t n, size_t i)
{
    size_t b = 0;
    while (i > 0 && b < n) {
        b++;
        while (b < n && ((unsigned char)s[b] & 0xC0) == 0x80) b++;
        i--;
    }
    return b;
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

tval tmpl_undef_lookup(const tval *obj, int sub, const tval *key)
{
    tval v = tv_undef();
    v.sub = (uint8_t)sub;
    v.owner_kind = obj->kind;
    v.owner_flavour = obj->kind == TV_LIST ? obj->list->flavour : 0;
    if (key->kind == TV_STR) {
        v.s.p = key->s.p;
        v.s.n = key->s.n;
    } else if (tv_is_int(key)) {
        v.sub = UD_ITEM;
        v.s.p = NULL;
        v.s.n = (size_t)tv_int_of(key);
    } else {
        v.sub = UD_OTHER;
        v.s.p = "no such element";
        v.s.n = 15;
    }
    return v;
}

tval tmpl_undef_named(int sub, const char *name, size_t n)
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
    else if (name_is(name, n, "previtem")) *out = i > 0 ? l->items->items[i - 1] : tmpl_undef_named(UD_OTHER, "there is no previous item", 25);
    else if (name_is(name, n, "nextitem")) *out = i + 1 < len ? l->items->items[i + 1] : tmpl_undef_named(UD_OTHER, "there is no next item", 21);
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
        *out = tmpl_undef_named(UD_UNSAFE, name, n);
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
    tval key = tv_str(name, n);
    *out = tmpl_undef_lookup(v, UD_ATTR, &key);
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
        size_t b = tmpl_cp_to_byte(v->s.p, v->s.n, (size_t)i);
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
    if (subscriptable_seq(v) && tv_is_int(key)) {
        if (!index_seq(r, v, tv_int_of(key), out, &found)) return false;
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
        *out = tmpl_undef_lookup(v, UD_ATTR, key);
        return true;
    }
    *out = tmpl_undef_lookup(v, UD_ITEM, key);
    return true;
}

/* CPython's PySlice_AdjustIndices */
int64_t tmpl_slice_adjust(int64_t len, int64_t *start, int64_t *stop, int64_t step)
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

bool tmpl_slice_bound(trender *r, const tval *v, int64_t dflt, int64_t *out)
{
    if (!v || v->kind == TV_NONE) {
        *out = dflt;
        return true;
    }
    if (v->kind == TV_UNDEF) return tmpl_fail_undef(r, v);
    if (!tv_is_int(v))
        return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: slice indices must be integers or None or have an __index__ method", r->line);
    *out = tv_int_of(v);
    return true;
}

bool tmpl_slice(trender *r, const tval *v, const tval *start, const tval *stop, const tval *step, tval *out)
{
    if (v->kind == TV_UNDEF) return tmpl_fail_undef(r, v);
    int64_t st;
    if (!tmpl_slice_bound(r, step, 1, &st)) return false;
    if (st == 0) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: slice step cannot be zero", r->line);
    if (st == INT64_MIN) st = -INT64_MAX;
    int64_t a, b;
    if (!tmpl_slice_bound(r, start, st < 0 ? INT64_MAX : 0, &a) || !tmpl_slice_bound(r, stop, st < 0 ? INT64_MIN : INT64_MAX, &b))
        return false;
    if (v->kind == TV_STR) {
        size_t *offs = NULL, count;
        bool ascii = tmpl_utf8_count(v->s.p, v->s.n) == v->s.n;
        if (!ascii && !tmpl_cp_offsets(r, v->s.p, v->s.n, &offs, &count)) return false;
        if (ascii) count = v->s.n;
        int64_t len = tmpl_slice_adjust((int64_t)count, &a, &b, st);
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
        int64_t len = tmpl_slice_adjust((int64_t)l->n, &a, &b, st);
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
        *out = tv_list(o);
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
    if (tv_is_int(attr)) return tmpl_getitem(r, out, attr, out);
    if (!tmpl_arg_str(r, attr, "attribute")) return false;
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
    return tmpl_str_case(r, v->s.p, v->s.n, TMPL_CASE_LOWER, out);
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
        *out = tv_list(l);
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

/* ---- filters ---------------------------------------------------------- */

/* A filter, `in|name(args)`: one function below and one row of `filters`. */
typedef bool filter_fn(trender *r, const tval *in, const tmpl_args *a, tval *out);

static bool round_value(trender *r, const tval *v, int64_t prec, const tval *method, tval *out)
{
    if (!tv_is_num(v)) return tmpl_type_error(r, "type %s doesn't define __round__ method", v);
    int kind = 0; /* common, ceil, floor */
    if (method) {
        if (method->kind == TV_STR && name_is(method->s.p, method->s.n, "ceil")) kind = 1;
        else if (method->kind == TV_STR && name_is(method->s.p, method->s.n, "floor")) kind = 2;
        else if (!(method->kind == TV_STR && name_is(method->s.p, method->s.n, "common")))
            return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: method must be common, ceil or floor", r->line);
    }
    if (kind == 0 && tv_is_int(v)) {
        int64_t x = tv_int_of(v);
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
    double x = tv_num_of(v);
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
    if (y == 0) y = 0; /* math.ceil/floor return an int: there is no -0 */
    *out = tv_float(y / scale);
    return true;
}

static bool filter_tojson(trender *r, const tval *in, const tmpl_args *a, tval *out)
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
        } else if (tv_is_int(&p[1])) {
            int64_t w = tv_int_of(&p[1]);
            if (w < 0) w = 0;
            if (w > 4096) return tmpl_fail(r, FERRY_ERR_TOO_LARGE, "line %d: tojson indent too large", r->line);
            spaces = tmpl_ralloc(r, (size_t)w + 1);
            if (!spaces) return false;
            memset(spaces, ' ', (size_t)w);
            o.indent = spaces;
            o.indent_n = (size_t)w;
        } else {
            return tmpl_type_error(r, "tojson indent must be an int or a str, not %s", &p[1]);
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
    if (!tmpl_json(r, in, &o, &sb)) {
        sb_free(&sb);
        return false;
    }
    return tmpl_sb_out(r, &sb, out);
}

static tlist *gen_of(trender *r) { return tmpl_list_new(r, 0, LF_GEN); }

/* select/reject/selectattr/rejectattr */
static bool select_filter(trender *r, const tval *v, const tmpl_args *a, bool attr, bool keep, tval *out)
{
    if (a->nkw) return tmpl_fail(r, FERRY_ERR_UNSUPPORTED, "line %d: keyword arguments to select/reject are not supported", r->line);
    tlist *res = gen_of(r);
    size_t cap = 0;
    if (!res) return false;
    *out = tv_list(res);
    if (!tmpl_truthy(v)) return true; /* jinja iterates only `if value` */
    const tval *args = a->args;
    size_t nargs = a->nargs, off = attr ? 1 : 0;
    if (attr && nargs < 1) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: missing parameter for attribute name", r->line);
    int test = -1;
    if (nargs > off) {
        if (args[off].kind != TV_STR) return tmpl_type_error(r, "test name must be a str, not %s", &args[off]);
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

static bool filter_select(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    return select_filter(r, in, a, false, true, out);
}

static bool filter_reject(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    return select_filter(r, in, a, false, false, out);
}

static bool filter_selectattr(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    return select_filter(r, in, a, true, true, out);
}

static bool filter_rejectattr(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    return select_filter(r, in, a, true, false, out);
}

static bool filter_map(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    tlist *items, *res = gen_of(r);
    size_t cap = 0;
    if (!res) return false;
    *out = tv_list(res);
    if (!tmpl_truthy(in)) return true;
    if (!tmpl_iterate(r, in, &items)) return false;
    if (a->nargs == 0) {
        const tval *attr = NULL, *dflt = NULL;
        for (size_t k = 0; k < a->nkw; k++) {
            if (name_is(a->kwn[k], a->kwnn[k], "attribute")) attr = &a->kwv[k];
            else if (name_is(a->kwn[k], a->kwnn[k], "default")) dflt = &a->kwv[k];
            else return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: unexpected keyword argument '%.*s'", r->line, (int)a->kwnn[k], a->kwn[k]);
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
    const tval *name = &a->args[0];
    if (name->kind != TV_STR) return tmpl_type_error(r, "filter name must be a str, not %s", name);
    int f = tmpl_filter_id(name->s.p, name->s.n, NULL);
    if (f < 0) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: no filter named '%.*s'", r->line, (int)name->s.n, name->s.p);
    for (size_t i = 0; i < items->n; i++) {
        tval x;
        if (!tmpl_call_filter_id(r, f, &items->items[i], a->args + 1, a->nargs - 1, a->kwn, a->kwnn, a->kwv, a->nkw, &x))
            return false;
        if (!tmpl_list_push(r, res, &cap, x)) return false;
    }
    return true;
}

static bool minmax(trender *r, const tval *v, const tmpl_args *a, bool max, tval *out)
{
    BIND(max ? "max()" : "min()", "case_sensitive", "attribute");
    tlist *items;
    if (!tmpl_iterate(r, v, &items)) return false;
    if (items->n == 0) {
        *out = tmpl_undef_named(UD_OTHER, "no aggregated item, sequence was empty", 38);
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

static bool filter_max(trender *r, const tval *in, const tmpl_args *a, tval *out) { return minmax(r, in, a, true, out); }

static bool filter_min(trender *r, const tval *in, const tmpl_args *a, tval *out) { return minmax(r, in, a, false, out); }

static bool filter_abs(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    if (!tmpl_no_args(r, "abs()", a)) return false;
    if (in->kind == TV_FLOAT) *out = tv_float(fabs(in->f));
    else if (tv_is_int(in)) {
        if (tv_int_of(in) == INT64_MIN) return tmpl_fail(r, FERRY_ERR_UNSUPPORTED, "line %d: integer overflow", r->line);
        *out = tv_int(tv_int_of(in) < 0 ? -tv_int_of(in) : tv_int_of(in));
    } else return tmpl_type_error(r, "bad operand type for abs(): '%s'", in);
    return true;
}

static bool filter_attr(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    BIND("attr()", "name");
    if (!g[0]) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: attr() needs a name", r->line);
    if (!tmpl_arg_str(r, &p[0], "attribute name")) return false;
    if (in->kind == TV_UNDEF) return tmpl_fail_undef(r, in);
    bool found;
    if (!attribute(r, in, p[0].s.p, p[0].s.n, out, &found)) return false;
    if (!found) *out = tmpl_undef_lookup(in, UD_ATTR, &p[0]);
    return true;
}

static bool filter_batch(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    /* jinja's batch: lists of linecount items, the last filled up when asked */
    BIND("batch()", "linecount", "fill_with");
    int64_t k = 0;
    if (!g[0]) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: batch() needs a count", r->line);
    if (!tmpl_arg_int(r, &p[0], &k)) return false;
    tlist *items, *res = gen_of(r), *tmp = tmpl_list_new(r, 0, LF_LIST);
    size_t cap = 0, tcap = 0;
    if (!res || !tmp || !tmpl_iterate(r, in, &items)) return false;
    *out = tv_list(res);
    for (size_t i = 0; i < items->n; i++) {
        if ((int64_t)tmp->n == k) {
            if (!tmpl_list_push(r, res, &cap, tv_list(tmp))) return false;
            if (!(tmp = tmpl_list_new(r, 0, LF_LIST))) return false;
            tcap = 0;
        }
        if (!tmpl_list_push(r, tmp, &tcap, items->items[i])) return false;
    }
    if (tmp->n) {
        while (g[1] && p[1].kind != TV_NONE && (int64_t)tmp->n < k)
            if (!tmpl_list_push(r, tmp, &tcap, p[1])) return false;
        if (!tmpl_list_push(r, res, &cap, tv_list(tmp))) return false;
    }
    return true;
}

static bool filter_capitalize(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    tval s;
    if (!tmpl_no_args(r, "capitalize()", a) || !tmpl_to_str(r, in, &s)) return false;
    return tmpl_str_title(r, s.s.p, s.s.n, true, out);
}

static bool filter_center(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    BIND("center()", "width");
    int64_t w = 80;
    tval s;
    if (g[0] && !tmpl_arg_int(r, &p[0], &w)) return false;
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
    return tmpl_sb_out(r, &sb, out);
}

static bool filter_default(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    BIND("default()", "default_value", "boolean");
    bool boolean = g[1] && tmpl_truthy(&p[1]);
    if (in->kind == TV_UNDEF || (boolean && !tmpl_truthy(in))) *out = g[0] ? p[0] : tv_str("", 0);
    else *out = *in;
    return true;
}

static bool filter_dictsort(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    BIND("dictsort()", "case_sensitive", "by", "reverse");
    if (in->kind != TV_DICT) return tmpl_type_error(r, "dictsort needs a mapping, not %s", in);
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
        pairs->items[i] = tv_list(t);
        keys[i] = pos ? d->vals[i] : d->keys[i];
        if (!(g[0] && tmpl_truthy(&p[0])) && !ignore_case(r, &keys[i], &keys[i])) return false;
    }
    pairs->n = d->n;
    tlist *o;
    if (!sorted_list(r, pairs, keys, g[2] && tmpl_truthy(&p[2]), &o)) return false;
    *out = tv_list(o);
    return true;
}

static bool filter_escape(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    return tmpl_no_args(r, "escape()", a) && tmpl_html_escape(r, in, out, false);
}

static bool filter_forceescape(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    return tmpl_no_args(r, "escape()", a) && tmpl_html_escape(r, in, out, true);
}

static bool filter_first(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    if (!tmpl_no_args(r, "first()", a)) return false;
    tlist *items;
    if (!tmpl_iterate(r, in, &items)) return false;
    *out = items->n ? items->items[0] : tmpl_undef_named(UD_OTHER, "no first item, sequence was empty", 33);
    return true;
}

static bool filter_float(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    BIND("float()", "default");
    if (in->kind == TV_UNDEF) return tmpl_fail_undef(r, in); /* float(Undefined) raises */
    tval dflt = g[0] ? p[0] : tv_float(0.0);
    double x;
    if (in->kind == TV_FLOAT) *out = *in;
    else if (tv_is_int(in)) *out = tv_float((double)tv_int_of(in));
    else if (in->kind == TV_STR && tmpl_parse_float(in, &x)) *out = tv_float(x);
    else *out = dflt;
    return true;
}

static bool filter_format(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    if (a->nargs && a->nkw) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: can't handle positional and keyword arguments at the same time", r->line);
    tval s, fa;
    if (!tmpl_to_str(r, in, &s)) return false;
    if (a->nkw) {
        tdict *d = tmpl_dict_new(r, a->nkw);
        if (!d) return false;
        for (size_t k = 0; k < a->nkw; k++)
            if (!tmpl_dict_set(r, d, tv_str(a->kwn[k], a->kwnn[k]), a->kwv[k])) return false;
        fa = (tval){.kind = TV_DICT, .dict = d};
    } else {
        tlist *t = tmpl_list_new(r, a->nargs, LF_TUPLE);
        if (!t) return false;
        if (a->nargs) memcpy(t->items, a->args, a->nargs * sizeof *a->args);
        t->n = a->nargs;
        fa = tv_list(t);
    }
    return tmpl_percent_format(r, &s, &fa, out);
}

static bool filter_indent(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    BIND("indent()", "width", "first", "blank");
    /* jinja's indent appends "\n" to the value itself: only a str survives that */
    if (in->kind == TV_UNDEF) return tmpl_fail_undef(r, in);
    if (in->kind != TV_STR) return tmpl_type_error(r, "indent() needs a str, not %s", in);
    return tmpl_str_indent(r, in, g[0] ? &p[0] : NULL, g[1] && tmpl_truthy(&p[1]), g[2] && tmpl_truthy(&p[2]), out);
}

static bool filter_int(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    BIND("int()", "default", "base");
    if (in->kind == TV_UNDEF) return tmpl_fail_undef(r, in); /* int(Undefined) raises */
    tval dflt = g[0] ? p[0] : tv_int(0);
    int64_t base = 10, x;
    if (g[1] && !tmpl_arg_int(r, &p[1], &base)) return false;
    bool overflow;
    double f;
    if (tv_is_int(in)) {
        *out = tv_int(tv_int_of(in));
    } else if (in->kind == TV_FLOAT) {
        if (isnan(in->f)) *out = dflt;
        else if (isinf(in->f) || fabs(in->f) >= 9.2e18) return tmpl_fail(r, FERRY_ERR_UNSUPPORTED, "line %d: cannot convert float %s to integer", r->line, isinf(in->f) ? "infinity" : "(too large)");
        else *out = tv_int((int64_t)in->f);
    } else if (in->kind == TV_STR) {
        if (tmpl_parse_int(in, (int)base, &x, &overflow)) *out = tv_int(x);
        else if (overflow) return tmpl_fail(r, FERRY_ERR_UNSUPPORTED, "line %d: integer too large (Python's big integers are not supported)", r->line);
        else if (tmpl_parse_float(in, &f)) {
            if (isnan(f)) *out = dflt;
            else if (isinf(f) || fabs(f) >= 9.2e18) return tmpl_fail(r, FERRY_ERR_UNSUPPORTED, "line %d: cannot convert float to integer", r->line);
            else *out = tv_int((int64_t)f);
        } else *out = dflt;
    } else {
        *out = dflt;
    }
    return true;
}

static bool filter_items(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    if (!tmpl_no_args(r, "items()", a)) return false;
    tlist *res = gen_of(r);
    if (!res) return false;
    *out = tv_list(res);
    if (in->kind == TV_UNDEF) return true;
    if (in->kind != TV_DICT) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: can only get item pairs from a mapping", r->line);
    tval view;
    tmethod m = {.self = *in, .id = TM_ITEMS};
    if (!tmpl_call_method(r, &m, NULL, 0, NULL, NULL, NULL, 0, &view)) return false;
    res->items = view.list->items;
    res->n = view.list->n;
    return true;
}

static bool filter_join(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
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
    return tmpl_sb_out(r, &sb, out);
}

static bool filter_last(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    if (!tmpl_no_args(r, "last()", a)) return false;
    if (in->kind == TV_LIST && in->list->flavour == LF_GEN)
        return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: 'generator' object is not reversible", r->line);
    if (in->kind != TV_UNDEF && in->kind != TV_STR && in->kind != TV_LIST && in->kind != TV_DICT)
        return tmpl_type_error(r, "'%s' object is not reversible", in);
    tlist *items;
    if (!tmpl_iterate(r, in, &items)) return false;
    *out = items->n ? items->items[items->n - 1] : tmpl_undef_named(UD_OTHER, "no last item, sequence was empty", 32);
    return true;
}

static bool filter_length(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    if (!tmpl_no_args(r, "length()", a)) return false;
    int64_t n;
    if (!tmpl_length(r, in, &n)) return false;
    *out = tv_int(n);
    return true;
}

static bool filter_list(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    if (!tmpl_no_args(r, "list()", a)) return false;
    tlist *items;
    if (!tmpl_iterate(r, in, &items)) return false;
    tlist *l = tmpl_list_new(r, items->n, LF_LIST);
    if (!l) return false;
    if (items->n) memcpy(l->items, items->items, items->n * sizeof(tval));
    l->n = items->n;
    *out = tv_list(l);
    return tmpl_charge(r, l->n);
}

/* lower and upper (both say "lower()" about arguments) */
static bool case_filter(trender *r, const tval *in, const tmpl_args *a, int mode, tval *out)
{
    tval s;
    if (!tmpl_no_args(r, "lower()", a) || !tmpl_to_str(r, in, &s)) return false;
    return tmpl_str_case(r, s.s.p, s.s.n, mode, out);
}

static bool filter_lower(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    return case_filter(r, in, a, TMPL_CASE_LOWER, out);
}

static bool filter_upper(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    return case_filter(r, in, a, TMPL_CASE_UPPER, out);
}

static bool filter_replace(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    BIND("replace()", "old", "new", "count");
    if (!g[0] || !g[1]) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: replace() needs old and new", r->line);
    tval s, old, nw;
    int64_t count = -1;
    if (g[2] && p[2].kind != TV_NONE && !tmpl_arg_int(r, &p[2], &count)) return false;
    if (!tmpl_to_str(r, in, &s) || !tmpl_to_str(r, &p[0], &old) || !tmpl_to_str(r, &p[1], &nw)) return false;
    return tmpl_str_replace(r, &s, &old, &nw, count, out);
}

static bool filter_reverse(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    if (!tmpl_no_args(r, "reverse()", a)) return false;
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
    *out = tv_list(l);
    return tmpl_charge(r, l->n);
}

static bool filter_round(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    BIND("round()", "precision", "method");
    int64_t prec = 0;
    if (g[0] && !tmpl_arg_int(r, &p[0], &prec)) return false;
    return round_value(r, in, prec, g[1] ? &p[1] : NULL, out);
}

static bool filter_safe(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    if (!tmpl_no_args(r, "safe()", a) || !tmpl_to_str(r, in, out)) return false;
    out->sub |= STR_MARKUP;
    return true;
}

static bool filter_slice(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    /* jinja's slice: k columns as even as can be, the first ones one longer */
    BIND("slice()", "slices", "fill_with");
    int64_t k = 0;
    if (!g[0]) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: slice() needs a count", r->line);
    if (!tmpl_arg_int(r, &p[0], &k)) return false;
    if (k == 0) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: integer division or modulo by zero", r->line);
    if (k < 0 || k > 100000) return tmpl_fail(r, FERRY_ERR_UNSUPPORTED, "line %d: slice() count out of range", r->line);
    bool fill = g[1] && p[1].kind != TV_NONE;
    tlist *items, *res = gen_of(r);
    size_t cap = 0;
    if (!res || !tmpl_iterate(r, in, &items)) return false;
    *out = tv_list(res);
    int64_t len = (int64_t)items->n, per = len / k, extra = len % k, offset = 0;
    for (int64_t sn = 0; sn < k; sn++) {
        int64_t start = offset + sn * per;
        if (sn < extra) offset++;
        int64_t end = offset + (sn + 1) * per;
        bool pad = fill && sn >= extra;
        tlist *chunk = tmpl_list_new(r, (size_t)(end - start) + pad, LF_LIST);
        if (!chunk) return false;
        if (end > start) memcpy(chunk->items, items->items + start, (size_t)(end - start) * sizeof(tval));
        chunk->n = (size_t)(end - start);
        if (pad) chunk->items[chunk->n++] = p[1];
        if (!tmpl_list_push(r, res, &cap, tv_list(chunk))) return false;
    }
    return tmpl_charge(r, items->n + (uint64_t)k);
}

static bool filter_sort(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
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
    *out = tv_list(o);
    return true;
}

static bool filter_string(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    if (!tmpl_no_args(r, "string()", a)) return false;
    return tmpl_to_str(r, in, out);
}

static bool filter_sum(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
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

static bool filter_title(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    tval s;
    if (!tmpl_no_args(r, "title()", a) || !tmpl_to_str(r, in, &s)) return false;
    return tmpl_jinja_title(r, &s, out);
}

static bool filter_trim(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    BIND("trim()", "chars");
    tval s;
    if (!tmpl_to_str(r, in, &s)) return false;
    return tmpl_str_strip(r, &s, g[0] ? &p[0] : NULL, true, true, out);
}

static bool filter_truncate(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    BIND("truncate()", "length", "killwords", "end", "leeway");
    int64_t length = 255, leeway = 5; /* jinja's default policy truncate.leeway */
    tval end = g[2] ? p[2] : tv_str("...", 3);
    if ((g[0] && !tmpl_arg_int(r, &p[0], &length)) || (g[3] && p[3].kind != TV_NONE && !tmpl_arg_int(r, &p[3], &leeway)))
        return false;
    if (!tmpl_arg_str(r, &end, "truncate() end")) return false;
    int64_t endn = (int64_t)tmpl_utf8_count(end.s.p, end.s.n), n;
    if (length < endn || leeway < 0)
        return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: truncate() length must be >= len(end) and leeway >= 0", r->line);
    /* what is short enough comes back as it is, whatever it is (Undefined too) */
    if (!tmpl_length(r, in, &n)) return false;
    if (n <= length + leeway) {
        *out = *in;
        return true;
    }
    if (!tmpl_arg_str(r, in, "truncate() value")) return false;
    size_t cut = tmpl_cp_to_byte(in->s.p, in->s.n, (size_t)(length - endn));
    if (!(g[1] && tmpl_truthy(&p[1]))) {
        /* rsplit(" ", 1)[0]: up to the last space, if any */
        size_t k = cut;
        while (k > 0 && in->s.p[k - 1] != ' ') k--;
        if (k > 0) cut = k - 1;
    }
    strbuf sb;
    sb_init(&sb);
    sb_append(&sb, in->s.p, cut);
    sb_append(&sb, end.s.p, end.s.n);
    return tmpl_sb_out(r, &sb, out);
}

static bool filter_unique(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
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
    *out = tv_list(res);
    return true;
}

static bool filter_wordcount(trender *r, const tval *in, const tmpl_args *a, tval *out)
{
    tval s;
    if (!tmpl_no_args(r, "wordcount()", a) || !tmpl_to_str(r, in, &s)) return false;
    *out = tv_int(tmpl_str_wordcount(s.s.p, s.s.n));
    return tmpl_charge(r, s.s.n / 16);
}

/* The filters by name; a row's index is the filter's id (tmpl_expr.fn).
 * Adding one is a function above and a row here. */
static const struct {
    const char *name;
    filter_fn *fn;
} filters[] = {
    {"abs", filter_abs},
    {"attr", filter_attr},
    {"batch", filter_batch},
    {"capitalize", filter_capitalize},
    {"center", filter_center},
    {"count", filter_length},
    {"d", filter_default},
    {"default", filter_default},
    {"dictsort", filter_dictsort},
    {"e", filter_escape},
    {"escape", filter_escape},
    {"first", filter_first},
    {"float", filter_float},
    {"forceescape", filter_forceescape},
    {"format", filter_format},
    {"indent", filter_indent},
    {"int", filter_int},
    {"items", filter_items},
    {"join", filter_join},
    {"last", filter_last},
    {"length", filter_length},
    {"list", filter_list},
    {"lower", filter_lower},
    {"map", filter_map},
    {"max", filter_max},
    {"min", filter_min},
    {"reject", filter_reject},
    {"rejectattr", filter_rejectattr},
    {"replace", filter_replace},
    {"reverse", filter_reverse},
    {"round", filter_round},
    {"safe", filter_safe},
    {"select", filter_select},
    {"selectattr", filter_selectattr},
    {"slice", filter_slice},
    {"sort", filter_sort},
    {"string", filter_string},
    {"sum", filter_sum},
    {"title", filter_title},
    {"tojson", filter_tojson},
    {"trim", filter_trim},
    {"truncate", filter_truncate},
    {"unique", filter_unique},
    {"upper", filter_upper},
    {"wordcount", filter_wordcount},
};

/* jinja2's own filters that are not here, for telling "not supported" from
 * "does not exist" */
static const char *const jinja_filters[] = {
    "filesizeformat", "groupby", "pprint", "random", "striptags", "urlencode",
    "urlize", "wordwrap", "xmlattr", NULL};

int tmpl_filter_id(const char *name, size_t n, bool *known)
{
    if (known) *known = false;
    for (size_t i = 0; i < sizeof filters / sizeof filters[0]; i++)
        if (name_is(name, n, filters[i].name)) return (int)i;
    for (int i = 0; jinja_filters[i]; i++)
        if (name_is(name, n, jinja_filters[i]) && known) *known = true;
    return -1;
}

bool tmpl_call_filter_id(trender *r, int id, const tval *in, const tval *args, size_t nargs, const char **kwn,
                         const size_t *kwnn, const tval *kwv, size_t nkw, tval *out)
{
    if (id < 0 || (size_t)id >= sizeof filters / sizeof filters[0])
        return tmpl_fail(r, FERRY_ERR_INTERNAL, "line %d: unknown filter %d", r->line, id);
    const tmpl_args a = {args, nargs, kwn, kwnn, kwv, nkw};
    return filters[id].fn(r, in, &a, out);
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
    if (!tv_is_num(v) || !tv_is_num(m)) {
        return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: unsupported operand type(s) for %%: '%s' and '%s'", r->line,
                         tmpl_type_name(v), tmpl_type_name(m));
    }
    if (tv_num_of(m) == 0) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: integer division or modulo by zero", r->line);
    if (tv_is_int(v) && tv_is_int(m)) {
        int64_t x = tv_int_of(v), y = tv_int_of(m);
        if (y == -1) { *out = tv_int(0); return true; }
        int64_t q = x % y;
        if (q != 0 && ((q < 0) != (y < 0))) q += y;
        *out = tv_int(q);
        return true;
    }
    double x = tv_num_of(v), y = tv_num_of(m), q = fmod(x, y);
    if (q != 0 && ((q < 0) != (y < 0))) q += y;
    *out = tv_float(q);
    return true;
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
        *out = tmpl_str_case_is(&t, id == T_UPPER);
        return true;
    case T_STRING: *out = v->kind == TV_STR; return true;
    case T_MAPPING: *out = v->kind == TV_DICT; return true;
    case T_NUMBER: *out = tv_is_num(v); return true;
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
            l->items[i] = tv_list(t);
        }
    }
    l->n = d->n;
    *out = tv_list(l);
    return tmpl_charge(r, d->n);
}

static bool dict_items(trender *r, const tval *self, const tmpl_args *a, tval *out)
{
    return tmpl_no_args(r, "items()", a) && dict_view(r, self->dict, TM_ITEMS, out);
}

static bool dict_keys(trender *r, const tval *self, const tmpl_args *a, tval *out)
{
    return tmpl_no_args(r, "items()", a) && dict_view(r, self->dict, TM_KEYS, out);
}

static bool dict_values(trender *r, const tval *self, const tmpl_args *a, tval *out)
{
    return tmpl_no_args(r, "items()", a) && dict_view(r, self->dict, TM_VALUES, out);
}

static bool dict_get(trender *r, const tval *self, const tmpl_args *a, tval *out)
{
    BIND("get()", "key", "default");
    if (!g[0]) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: get expected at least 1 argument, got 0", r->line);
    if (a->nkw) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: get() takes no keyword arguments", r->line);
    bool found;
    if (!tmpl_dict_get(r, self->dict, &p[0], out, &found)) return false;
    if (!found) *out = g[1] ? p[1] : tv_none();
    return true;
}

static bool dict_copy(trender *r, const tval *self, const tmpl_args *a, tval *out)
{
    if (!tmpl_no_args(r, "copy()", a)) return false;
    tdict *d = tmpl_dict_new(r, self->dict->n);
    if (!d) return false;
    for (size_t i = 0; i < self->dict->n; i++)
        if (!tmpl_dict_set(r, d, self->dict->keys[i], self->dict->vals[i])) return false;
    *out = (tval){.kind = TV_DICT, .dict = d};
    return true;
}

static bool list_copy(trender *r, const tval *self, const tmpl_args *a, tval *out)
{
    if (!tmpl_no_args(r, "copy()", a)) return false;
    tlist *l = tmpl_list_new(r, self->list->n, LF_LIST);
    if (!l) return false;
    if (self->list->n) memcpy(l->items, self->list->items, self->list->n * sizeof(tval));
    l->n = self->list->n;
    *out = tv_list(l);
    return true;
}

/* list.index(x[, start[, stop]]), or list.count(x) */
static bool list_find(trender *r, const tlist *l, const tmpl_args *a, bool index, tval *out)
{
    size_t nargs = a->nargs;
    if (a->nkw || nargs < 1 || nargs > 3) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: %s() takes 1 to 3 positional arguments", r->line, index ? "index" : "count");
    int64_t count = 0;
    if (!tmpl_charge(r, l->n)) return false;
    int64_t start = 0, stop = (int64_t)l->n;
    if (index && nargs > 1) {
        if (!tmpl_slice_bound(r, &a->args[1], 0, &start) || (nargs > 2 && !tmpl_slice_bound(r, &a->args[2], INT64_MAX, &stop))) return false;
        tmpl_slice_adjust((int64_t)l->n, &start, &stop, 1);
    }
    for (int64_t i = start; i < stop; i++) {
        bool eq;
        if (!tmpl_equal(r, &l->items[i], &a->args[0], &eq)) return false;
        if (!eq) continue;
        if (index) {
            *out = tv_int(i);
            return true;
        }
        count++;
    }
    if (index) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: value is not in list", r->line);
    *out = tv_int(count);
    return true;
}

static bool list_index(trender *r, const tval *self, const tmpl_args *a, tval *out)
{
    return list_find(r, self->list, a, true, out);
}

static bool list_count(trender *r, const tval *self, const tmpl_args *a, tval *out)
{
    return list_find(r, self->list, a, false, out);
}

static bool loop_cycle(trender *r, const tval *self, const tmpl_args *a, tval *out)
{
    if (a->nkw) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: cycle() takes no keyword arguments", r->line);
    if (!a->nargs) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: no items for cycling given", r->line);
    *out = a->args[self->loop->i % a->nargs];
    return true;
}

static bool loop_changed(trender *r, const tval *self, const tmpl_args *a, tval *out)
{
    tloop *l = self->loop;
    if (a->nkw) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: changed() takes no keyword arguments", r->line);
    tlist *t = tmpl_list_new(r, a->nargs, LF_LIST);
    if (!t) return false;
    if (a->nargs) memcpy(t->items, a->args, a->nargs * sizeof *a->args);
    t->n = a->nargs;
    tval now = tv_list(t);
    bool eq = false;
    if (l->has_changed && !tmpl_equal(r, &now, &l->changed_last, &eq)) return false;
    *out = tv_bool(!l->has_changed || !eq);
    l->has_changed = true;
    l->changed_last = now;
    return true;
}

/* the methods of dicts, lists and loops by id (a str's are tmpl_str.c's);
 * adding one is a TM_* id, a row of method_names, a function above and an
 * entry here */
static tmpl_method_fn *const object_methods[TM_COUNT_] = {
    [TM_ITEMS] = dict_items,     [TM_KEYS] = dict_keys,       [TM_VALUES] = dict_values,
    [TM_GET] = dict_get,         [TM_DICT_COPY] = dict_copy,  [TM_LIST_COPY] = list_copy,
    [TM_INDEX] = list_index,     [TM_COUNT] = list_count,     [TM_LOOP_CYCLE] = loop_cycle,
    [TM_LOOP_CHANGED] = loop_changed,
};

bool tmpl_call_method(trender *r, const tmethod *m, const tval *args, size_t nargs, const char **kwn,
                      const size_t *kwnn, const tval *kwv, size_t nkw, tval *out)
{
    const tmpl_args a = {args, nargs, kwn, kwnn, kwv, nkw};
    if (m->self.kind == TV_STR) return tmpl_str_method(r, &m->self, m->id, &a, out);
    if (m->id < 0 || m->id >= TM_COUNT_ || !object_methods[m->id])
        return tmpl_fail(r, FERRY_ERR_INTERNAL, "line %d: unknown method %d", r->line, m->id);
    return object_methods[m->id](r, &m->self, &a, out);
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
    if (!tmpl_arg_str(r, fmt, "strftime_now() format")) return false;
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
            if (!tmpl_arg_int(r, &args[i], i == 0 && nargs == 1 ? &b : i == 0 ? &a : i == 1 ? &b : &st)) return false;
        if (st == 0) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: range() arg 3 must not be zero", r->line);
        __int128 span = st > 0 ? (__int128)b - a : (__int128)a - b;
        __int128 step = st > 0 ? st : -(__int128)st;
        __int128 cnt = span <= 0 ? 0 : (span - 1) / step + 1;
        if (cnt > TMPL_MAX_RANGE)
            return tmpl_fail(r, FERRY_ERR_TOO_LARGE, "line %d: range too big (the sandbox allows at most %d items)", r->line, TMPL_MAX_RANGE);
        tlist *l = tmpl_list_new(r, (size_t)cnt, LF_RANGE);
        if (!l) return false;
        /* i * st may pass int64 where a + i * st (between a and b) does not */
        for (int64_t i = 0; i < (int64_t)cnt; i++) l->items[i] = tv_int((int64_t)((__int128)a + (__int128)i * st));
        l->n = (size_t)cnt;
        l->r_start = a;
        l->r_stop = b;
        l->r_step = st;
        *out = tv_list(l);
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
        size_t n = strnlen(msg.s.p, msg.s.n); /* a message ends at a NUL */
        if (n == 0) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: raise_exception with an empty message", r->line);
        bool first = r->st == FERRY_OK;
        tmpl_fail(r, FERRY_ERR_INVALID, "%.*s", (int)(n > 900 ? 900 : n), msg.s.p);
        if (first) r->raised = true;
        return false;
    }
    case TF_STRFTIME_NOW: {
        const tmpl_args call = {args, nargs, kwn, kwnn, kwv, nkw}, *a = &call;
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
