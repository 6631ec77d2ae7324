/*
 * tmpl_eval.c - renders a parsed chat template.
 *
 * Scopes follow jinja2's frames, which decide what a `set` can reach:
 *   - the template's top level is one scope; a name not set there comes
 *     from the caller's variables, then from the globals (range, namespace,
 *     raise_exception, strftime_now, dict);
 *   - every iteration of a for loop runs in a fresh scope over the
 *     enclosing one, so `set` inside a loop is gone after the iteration and
 *     a read before the set sees the outer value (hence namespace());
 *   - macro bodies, call-block bodies, {% generation %}, {% with %},
 *     block sets and filter blocks run in scopes of their own; `if` does not
 *     open a scope.
 * A macro reads the scope it was defined in when it is called (so a macro
 * at the top level sees later top-level sets, as in jinja). Entering a
 * frame also declares the names jinja's compiler makes undefined there
 * until assigned (tmpl_symbols.c).
 *
 * Expressions holding a slice may be computed "as jinja's compiler would"
 * (r->folding, see FOLD_SLICE in tmpl_parse.c): jinja folds constants when
 * it compiles, with slightly different rules for slices.
 *
 * Limits keep hostile templates and inputs from crashing or hanging a
 * render: nesting depth (the C stack), macro depth, loop iterations, a work
 * budget (evaluation steps plus bytes scanned by string builtins), the
 * arena's byte budget and the output limit. Each ends the render with an
 * error; nothing is left behind because all of it lives in the arena.
 * Every operation is charged by what it touches: a step, plus a unit per
 * TMPL_BYTES_PER_STEP bytes a string operation reads (comparison, hashing,
 * startswith, `in`, ...) or an item a list operation visits. A render
 * cancelled by tmpl_cancel_renders stops at its next charge.
 */
#define _GNU_SOURCE /* memmem */
#include "tmpl_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A frame's variables. Most hold a handful, searched in order; past
 * SCOPE_INDEXED entries an open-addressing index (position + 1 per slot,
 * keyed by the interned id) keeps lookups constant. */
struct tscope {
    tscope *parent;
    uint32_t n, cap;
    int *ids;
    tval *vals;
    uint32_t *idx;
    uint32_t icap;
};

#define SCOPE_INDEXED 16

typedef enum { X_OK, X_ERR, X_BREAK, X_CONTINUE } xres;

/* ---- errors and budgets ----------------------------------------------- */

bool tmpl_fail(trender *r, ferry_status st, const char *fmt, ...)
{
    if (r->st != FERRY_OK) return false; /* the first error is the one that explains */
    char msg[FERRY_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->st = ferry_fail(st, "%s", msg);
    return false;
}

bool tmpl_fail_undef(trender *r, const tval *v)
{
    int n = (int)(v->s.n > 80 ? 80 : v->s.n);
    switch (v->sub) {
    case UD_NAME:
        return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: '%.*s' is undefined", r->line, n, v->s.p ? v->s.p : "");
    case UD_ATTR:
    case UD_ITEM: {
        /* jinja's wording: 'dict object' has no attribute 'x', list object has no element 3 */
        tval owner = {0};
        owner.kind = v->owner_kind;
        tlist l = {0};
        l.flavour = v->owner_flavour;
        owner.list = &l;
        const char *type = owner.kind == TV_NONE ? "None" : tmpl_type_name(&owner);
        const char *obj = owner.kind == TV_NONE ? "" : " object";
        if (!v->s.p)
            return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: %s%s has no element %lld", r->line, type, obj,
                             (long long)(int64_t)v->s.n);
        return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: '%s%s' has no attribute '%.*s'", r->line, type, obj, n, v->s.p);
    }
    case UD_UNSAFE:
        return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: access to attribute '%.*s' is unsafe", r->line, n,
                         v->s.p ? v->s.p : "");
    default:
        return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: use of an undefined value%s%.*s", r->line,
                         v->s.p ? ": " : "", n, v->s.p ? v->s.p : "");
    }
}

static atomic_bool g_cancelled;

void tmpl_cancel_renders(void) { atomic_store(&g_cancelled, true); }

bool tmpl_charge(trender *r, uint64_t units)
{
    if (atomic_load_explicit(&g_cancelled, memory_order_relaxed))
        return tmpl_fail(r, FERRY_ERR_BUSY, "chat template render cancelled: the server is shutting down");
    r->work += units;
    if (r->work > TMPL_MAX_WORK)
        return tmpl_fail(r, FERRY_ERR_TOO_LARGE, "chat template render exceeds its work limit (%llu steps)",
                         (unsigned long long)TMPL_MAX_WORK);
    return true;
}

static bool arena_fail(trender *r)
{
    if (r->arena.over)
        return tmpl_fail(r, FERRY_ERR_TOO_LARGE, "chat template render needs more than %zu bytes of memory",
                         r->arena.limit);
    return tmpl_fail(r, FERRY_ERR_NOMEM, "out of memory rendering the chat template");
}

void *tmpl_ralloc(trender *r, size_t n)
{
    if (!tmpl_charge(r, n / 64)) return NULL;
    void *p = arena_alloc(&r->arena, n);
    if (!p) arena_fail(r);
    return p;
}

void *tmpl_rgrow(trender *r, void *p, size_t old_n, size_t new_n)
{
    void *q = arena_grow(&r->arena, p, old_n, new_n);
    if (!q) {
        arena_fail(r);
        return NULL;
    }
    /* growing in place costs nothing; a copy costs its size */
    if (q != p && !tmpl_charge(r, new_n / 64)) return NULL;
    return q;
}

/* ---- scopes ----------------------------------------------------------- */

static tscope *scope_new(trender *r, tscope *parent)
{
    tscope *s = tmpl_ralloc(r, sizeof *s);
    if (s) {
        memset(s, 0, sizeof *s);
        s->parent = parent;
    }
    return s;
}

static uint32_t id_slot(int id, uint32_t icap) { return ((uint32_t)id * 2654435761u) & (icap - 1); }

/* the position of id in s, or -1 */
static long scope_find(const tscope *s, int id)
{
    if (s->idx) {
        for (uint32_t k = id_slot(id, s->icap);; k = (k + 1) & (s->icap - 1)) {
            uint32_t pos = s->idx[k];
            if (!pos) return -1;
            if (s->ids[pos - 1] == id) return (long)pos - 1;
        }
    }
    for (uint32_t i = 0; i < s->n; i++)
        if (s->ids[i] == id) return (long)i;
    return -1;
}

/* Empties a scope that is used again (a loop's next iteration). */
static void scope_reset(tscope *s)
{
    if (s->idx) memset(s->idx, 0, s->icap * sizeof *s->idx);
    s->n = 0;
}

static bool scope_index(trender *r, tscope *s)
{
    uint32_t icap = 64;
    while (icap < s->cap * 2) icap *= 2;
    uint32_t *idx = tmpl_ralloc(r, icap * sizeof *idx);
    if (!idx) return false;
    memset(idx, 0, icap * sizeof *idx);
    for (uint32_t i = 0; i < s->n; i++) {
        uint32_t k = id_slot(s->ids[i], icap);
        while (idx[k]) k = (k + 1) & (icap - 1);
        idx[k] = i + 1;
    }
    s->idx = idx;
    s->icap = icap;
    return true;
}

static bool scope_set(trender *r, tscope *s, int id, tval v)
{
    long pos = scope_find(s, id);
    if (pos >= 0) {
        s->vals[pos] = v;
        return true;
    }
    if (s->n == s->cap) {
        uint32_t cap = s->cap ? s->cap * 2 : 4;
        int *ids = tmpl_ralloc(r, cap * sizeof *ids);
        tval *vals = tmpl_ralloc(r, cap * sizeof *vals);
        if (!ids || !vals) return false;
        if (s->n) {
            memcpy(ids, s->ids, s->n * sizeof *ids);
            memcpy(vals, s->vals, s->n * sizeof *vals);
        }
        s->ids = ids;
        s->vals = vals;
        s->cap = cap;
    }
    s->ids[s->n] = id;
    s->vals[s->n] = v;
    s->n++;
    if (s->n > SCOPE_INDEXED && (!s->idx || s->icap < s->cap * 2)) return scope_index(r, s);
    if (s->idx) {
        uint32_t k = id_slot(id, s->icap);
        while (s->idx[k]) k = (k + 1) & (s->icap - 1);
        s->idx[k] = s->n;
    }
    return true;
}

/* Enters a frame: the names it holds undefined until it assigns them
 * (tmpl_symbols.c) shadow the caller's variables from the start. */
static bool predeclare(trender *r, tscope *s, const tmpl_body *b)
{
    for (uint32_t i = 0; i < b->nundef; i++) {
        int id = b->undef_ids[i];
        tval u = tv_undef();
        u.sub = UD_NAME;
        u.s.p = r->t->names.s[id];
        u.s.n = r->t->names.n[id];
        if (!scope_set(r, s, id, u)) return false;
    }
    return true;
}

static tval lookup(trender *r, const tscope *s, int id)
{
    for (; s; s = s->parent) {
        long pos = scope_find(s, id);
        if (pos >= 0) return s->vals[pos];
    }
    return r->globals[id];
}

/* ---- output ----------------------------------------------------------- */

static bool sink_check(trender *r, tmpl_sink *k)
{
    if (k->sb.oom) return tmpl_fail(r, FERRY_ERR_NOMEM, "out of memory rendering the chat template");
    if (k->sb.len > k->max)
        return tmpl_fail(r, FERRY_ERR_TOO_LARGE, "chat template output exceeds %zu bytes", k->max);
    return true;
}

static bool emit(trender *r, const char *p, size_t n)
{
    tmpl_sink *k = r->out;
    if (n > k->max - k->sb.len)
        return tmpl_fail(r, FERRY_ERR_TOO_LARGE, "chat template output exceeds %zu bytes", k->max);
    sb_append(&k->sb, p, n);
    return sink_check(r, k);
}

static bool emit_value(trender *r, const tval *v)
{
    if (v->kind == TV_STR) return emit(r, v->s.p, v->s.n);
    if (!tmpl_str(r, v, &r->out->sb)) return false;
    return sink_check(r, r->out);
}

/* ---- evaluation ------------------------------------------------------- */

static bool eval(trender *r, tscope *sc, const tmpl_expr *e, tval *out);
static xres exec_body(trender *r, tscope *sc, const tmpl_body *b);

static bool enter(trender *r)
{
    if (++r->depth > TMPL_MAX_DEPTH) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: chat template recursion too deep", r->line);
    return true;
}

static bool eval_list(trender *r, tscope *sc, tmpl_expr **items, size_t n, uint8_t flavour, tval *out)
{
    tlist *l = tmpl_list_new(r, n, flavour);
    if (!l) return false;
    for (size_t i = 0; i < n; i++)
        if (!eval(r, sc, items[i], &l->items[i])) return false;
    l->n = n;
    *out = (tval){.kind = TV_LIST, .list = l};
    return true;
}

/* positional and keyword arguments of a call, filter or test */
typedef struct {
    tval *args, *kwv;
    size_t nargs, nkw;
    const char **kwn;
    size_t *kwnn;
} evargs;

static bool eval_args(trender *r, tscope *sc, const tmpl_expr *e, evargs *a, size_t extra_kw)
{
    memset(a, 0, sizeof *a);
    a->nargs = e->nargs;
    a->nkw = e->nkw;
    size_t nkw_cap = e->nkw + extra_kw;
    if (e->nargs && !(a->args = tmpl_ralloc(r, e->nargs * sizeof *a->args))) return false;
    if (nkw_cap) {
        a->kwv = tmpl_ralloc(r, nkw_cap * sizeof *a->kwv);
        a->kwn = tmpl_ralloc(r, nkw_cap * sizeof *a->kwn);
        a->kwnn = tmpl_ralloc(r, nkw_cap * sizeof *a->kwnn);
        if (!a->kwv || !a->kwn || !a->kwnn) return false;
    }
    for (size_t i = 0; i < e->nargs; i++)
        if (!eval(r, sc, e->args[i], &a->args[i])) return false;
    for (size_t i = 0; i < e->nkw; i++) {
        if (!eval(r, sc, e->kwvals[i], &a->kwv[i])) return false;
        a->kwn[i] = e->kwnames[i];
        a->kwnn[i] = e->kwname_n[i];
    }
    return true;
}

static bool int_overflow(trender *r)
{
    return tmpl_fail(r, FERRY_ERR_UNSUPPORTED, "line %d: integer overflow (Python's big integers are not supported)", r->line);
}

static bool binop_type_error(trender *r, int op, const tval *a, const tval *b)
{
    if (a->kind == TV_UNDEF) return tmpl_fail_undef(r, a);
    if (b->kind == TV_UNDEF) return tmpl_fail_undef(r, b);
    static const char *sym[] = {"", "+", "-", "/", "//", "*", "**", "%"};
    return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: unsupported operand type(s) for %s: '%s' and '%s'", r->line,
                     op < 8 ? sym[op] : "?", tmpl_type_name(a), tmpl_type_name(b));
}

static bool is_intlike(const tval *v) { return v->kind == TV_INT || v->kind == TV_BOOL; }
static int64_t intval(const tval *v) { return v->kind == TV_BOOL ? (int64_t)v->b : v->i; }
static double numval(const tval *v) { return v->kind == TV_FLOAT ? v->f : (double)intval(v); }
static bool is_number(const tval *v) { return is_intlike(v) || v->kind == TV_FLOAT; }

/* seq * n for str and list/tuple */
static bool repeat(trender *r, const tval *seq, int64_t times, tval *out)
{
    if (times < 0) times = 0;
    if (seq->kind == TV_STR) {
        size_t n = seq->s.n;
        if (n && (uint64_t)times > (r->arena.limit / n)) return tmpl_fail(r, FERRY_ERR_TOO_LARGE, "line %d: string repetition too large", r->line);
        char *d = tmpl_ralloc(r, n * (size_t)times + 1);
        if (!d) return false;
        for (int64_t i = 0; i < times; i++) memcpy(d + (size_t)i * n, seq->s.p, n);
        *out = tv_str(d, n * (size_t)times);
        return true;
    }
    const tlist *l = seq->list;
    if (l->n && (uint64_t)times > r->arena.limit / (l->n * sizeof(tval)))
        return tmpl_fail(r, FERRY_ERR_TOO_LARGE, "line %d: list repetition too large", r->line);
    tlist *o = tmpl_list_new(r, l->n * (size_t)times, l->flavour);
    if (!o) return false;
    if (l->n)
        for (int64_t i = 0; i < times; i++) memcpy(o->items + (size_t)i * l->n, l->items, l->n * sizeof(tval));
    o->n = l->n * (size_t)times;
    *out = (tval){.kind = TV_LIST, .list = o};
    return true;
}

/* a + b for strings. A string that owns its whole arena allocation
 * (STR_OWNED) and is the newest one grows in place, so that accumulating
 * loops (`set ns.s = ns.s ~ x`) stay linear; the old value keeps its length
 * and so its text. */
static bool str_append(trender *r, const tval *a, const char *p, size_t n, tval *out)
{
    if (!tmpl_charge(r, n / 16)) return false;
    if (n > SIZE_MAX / 2 - a->s.n) return tmpl_fail(r, FERRY_ERR_TOO_LARGE, "line %d: string too large", r->line);
    char *d;
    if (a->sub & STR_OWNED) {
        d = tmpl_rgrow(r, (void *)a->s.p, a->s.n + 1, a->s.n + n + 1);
        if (!d) return false;
        if (d != a->s.p) memcpy(d, a->s.p, a->s.n);
    } else {
        if (!tmpl_charge(r, a->s.n / 16)) return false;
        d = tmpl_ralloc(r, a->s.n + n + 1);
        if (!d) return false;
        memcpy(d, a->s.p, a->s.n);
    }
    memcpy(d + a->s.n, p, n);
    d[a->s.n + n] = '\0';
    *out = tv_str(d, a->s.n + n);
    out->sub = STR_OWNED;
    return true;
}

static bool is_seq_list(const tval *v)
{
    return v->kind == TV_LIST && (v->list->flavour == LF_LIST || v->list->flavour == LF_TUPLE);
}

/* Python's float floor division and modulo (Objects/floatobject.c) */
static void float_divmod(double vx, double wx, double *floordiv, double *mod)
{
    double m = fmod(vx, wx);
    double div = (vx - m) / wx;
    if (m != 0) {
        if ((wx < 0) != (m < 0)) {
            m += wx;
            div -= 1.0;
        }
    } else {
        m = copysign(0.0, wx);
    }
    double fd;
    if (div != 0) {
        fd = floor(div);
        if (div - fd > 0.5) fd += 1.0;
    } else {
        fd = copysign(0.0, vx / wx);
    }
    *floordiv = fd;
    *mod = m;
}

static bool arith(trender *r, int op, const tval *a, const tval *b, tval *out)
{
    if (op == OP_MOD && a->kind == TV_STR) return tmpl_percent_format(r, a, b, out); /* str % anything */
    if (a->kind == TV_UNDEF) return tmpl_fail_undef(r, a);
    if (b->kind == TV_UNDEF) return tmpl_fail_undef(r, b);
    if (is_number(a) && is_number(b)) {
        bool ints = is_intlike(a) && is_intlike(b);
        int64_t x = ints ? intval(a) : 0, y = ints ? intval(b) : 0, z;
        double fx = numval(a), fy = numval(b);
        switch (op) {
        case OP_ADD:
            if (!ints) { *out = tv_float(fx + fy); return true; }
            if (__builtin_add_overflow(x, y, &z)) return int_overflow(r);
            *out = tv_int(z);
            return true;
        case OP_SUB:
            if (!ints) { *out = tv_float(fx - fy); return true; }
            if (__builtin_sub_overflow(x, y, &z)) return int_overflow(r);
            *out = tv_int(z);
            return true;
        case OP_MUL:
            if (!ints) { *out = tv_float(fx * fy); return true; }
            if (__builtin_mul_overflow(x, y, &z)) return int_overflow(r);
            *out = tv_int(z);
            return true;
        case OP_DIV:
            if (fy == 0) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: division by zero", r->line);
            if (ints) *out = tv_float((double)x / (double)y); /* Python rounds int/int correctly; doubles do for |x|,|y| < 2^53 */
            else *out = tv_float(fx / fy);
            return true;
        case OP_FLOORDIV:
        case OP_MOD:
            if (fy == 0) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: integer division or modulo by zero", r->line);
            if (ints) {
                if (x == INT64_MIN && y == -1) return int_overflow(r);
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    q--;
                    m += y;
                }
                *out = tv_int(op == OP_FLOORDIV ? q : m);
            } else {
                double fd, fm;
                float_divmod(fx, fy, &fd, &fm);
                *out = tv_float(op == OP_FLOORDIV ? fd : fm);
            }
            return true;
        case OP_POW:
            if (ints && y >= 0) {
                int64_t acc = 1, base = x;
                for (int64_t e = y; e > 0; e >>= 1) {
                    if ((e & 1) && __builtin_mul_overflow(acc, base, &acc)) return int_overflow(r);
                    if (e > 1 && __builtin_mul_overflow(base, base, &base)) return int_overflow(r);
                }
                *out = tv_int(acc);
                return true;
            }
            if (fx == 0 && fy < 0) return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: 0.0 cannot be raised to a negative power", r->line);
            if (fx < 0 && fy != floor(fy))
                return tmpl_fail(r, FERRY_ERR_UNSUPPORTED, "line %d: complex results of ** are not supported", r->line);
            *out = tv_float(pow(fx, fy));
            return true;
        }
    }
    if (op == OP_ADD) {
        if (a->kind == TV_STR && b->kind == TV_STR) {
            if ((a->sub | b->sub) & STR_MARKUP) return tmpl_markup_add(r, a, b, out);
            return str_append(r, a, b->s.p, b->s.n, out);
        }
        if (is_seq_list(a) && is_seq_list(b) && a->list->flavour == b->list->flavour) {
            tlist *l = tmpl_list_new(r, a->list->n + b->list->n, a->list->flavour);
            if (!l) return false;
            if (a->list->n) memcpy(l->items, a->list->items, a->list->n * sizeof(tval));
            if (b->list->n) memcpy(l->items + a->list->n, b->list->items, b->list->n * sizeof(tval));
            l->n = a->list->n + b->list->n;
            *out = (tval){.kind = TV_LIST, .list = l};
            return true;
        }
    }
    if (op == OP_MUL) {
        if ((a->kind == TV_STR || is_seq_list(a)) && is_intlike(b)) return repeat(r, a, intval(b), out);
        if ((b->kind == TV_STR || is_seq_list(b)) && is_intlike(a)) return repeat(r, b, intval(a), out);
    }
    if (op == OP_MOD && a->kind == TV_STR) return tmpl_percent_format(r, a, b, out);
    return binop_type_error(r, op, a, b);
}

bool tmpl_add_values(trender *r, const tval *a, const tval *b, tval *out) { return arith(r, OP_ADD, a, b, out); }

/* the string of a ~ b ~ ...: everything str()'d */
static bool eval_concat(trender *r, tscope *sc, const tmpl_expr *e, tval *out)
{
    tval first;
    if (!eval(r, sc, e->args[0], &first)) return false;
    strbuf sb;
    sb_init(&sb);
    bool ok = true;
    for (uint32_t i = 1; i < e->nargs && ok; i++) {
        tval v;
        ok = eval(r, sc, e->args[i], &v) && tmpl_str(r, &v, &sb);
        if (ok && sb.len > r->arena.limit) ok = tmpl_fail(r, FERRY_ERR_TOO_LARGE, "line %d: string too large", e->line);
        if (ok && sb.oom) ok = tmpl_fail(r, FERRY_ERR_NOMEM, "out of memory rendering the chat template");
    }
    if (ok) {
        tval head = first;
        ok = first.kind == TV_STR || tmpl_to_str(r, &first, &head);
        if (ok) ok = str_append(r, &head, sb.data ? sb.data : "", sb.len, out);
    }
    sb_free(&sb);
    return ok;
}

/* x in seq, as Python's `in` */
bool tmpl_contains(trender *r, const tval *x, const tval *seq, bool *res)
{
    *res = false;
    switch (seq->kind) {
    case TV_UNDEF: return true; /* iterating Undefined finds nothing */
    case TV_STR:
        if (x->kind != TV_STR)
            return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: 'in <string>' requires string as left operand, not %s",
                             r->line, tmpl_type_name(x));
        if (!tmpl_charge(r, seq->s.n / 16)) return false;
        if (x->s.n == 0) { *res = true; return true; }
        *res = x->s.n <= seq->s.n && memmem(seq->s.p, seq->s.n, x->s.p, x->s.n) != NULL;
        return true;
    case TV_DICT: {
        tval dummy;
        uint64_t h;
        if (!tmpl_hash(r, x, &h)) return false;
        return tmpl_dict_get(r, seq->dict, x, &dummy, res);
    }
    case TV_LIST: {
        tlist *l;
        if (seq->list->flavour == LF_ITEMS && (x->kind != TV_LIST || x->list->flavour != LF_TUPLE)) return true;
        if (!tmpl_iterate(r, seq, &l)) return false;
        if (!tmpl_charge(r, l->n)) return false;
        for (size_t i = 0; i < l->n; i++) {
            if (!tmpl_equal(r, &l->items[i], x, res)) return false;
            if (*res) return true;
        }
        return true;
    }
    default:
        return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: argument of type '%s' is not iterable", r->line, tmpl_type_name(seq));
    }
}

static bool compare(trender *r, int op, const tval *a, const tval *b, bool *res)
{
    switch (op) {
    case OP_EQ: return tmpl_equal(r, a, b, res);
    case OP_NE:
        if (!tmpl_equal(r, a, b, res)) return false;
        *res = !*res;
        return true;
    case OP_IN: return tmpl_contains(r, a, b, res);
    case OP_NOTIN:
        if (!tmpl_contains(r, a, b, res)) return false;
        *res = !*res;
        return true;
    default: return tmpl_order(r, op, a, b, res);
    }
}

static bool eval_filter_chain(trender *r, tscope *sc, const tmpl_expr *e, const tval *body, tval *out);

/* what jinja cannot compute at compile time (as_const raises Impossible) */
static bool not_constant(const tmpl_expr *e)
{
    if (e->kind == E_NAME || e->kind == E_CALL) return true;
    if (e->kind != E_FILTER) return false;
    if (!e->a) return true;
    static const char *const context_filters[] = {"map", "select", "reject", "selectattr", "rejectattr", NULL};
    for (int i = 0; context_filters[i]; i++)
        if (strlen(context_filters[i]) == e->name_n && memcmp(context_filters[i], e->name, e->name_n) == 0) return true;
    return false;
}

static bool eval_inner(trender *r, tscope *sc, const tmpl_expr *e, tval *out)
{
    tval a, b;
    if (r->folding && not_constant(e)) return tmpl_fail(r, FERRY_ERR_INTERNAL, "not a constant");
    switch (e->kind) {
    case E_CONST:
        *out = e->cval;
        return true;
    case E_NAME:
        *out = lookup(r, sc, e->id);
        if (out->kind == TV_UNDEF) {
            out->sub = UD_NAME;
            out->s.p = e->name;
            out->s.n = e->name_n;
        }
        return true;
    case E_LIST: return eval_list(r, sc, e->args, e->nargs, LF_LIST, out);
    case E_TUPLE: return eval_list(r, sc, e->args, e->nargs, LF_TUPLE, out);
    case E_DICT: {
        tdict *d = tmpl_dict_new(r, e->nargs);
        if (!d) return false;
        for (uint32_t i = 0; i < e->nargs; i++) {
            if (!eval(r, sc, e->args[i], &a) || !eval(r, sc, e->kwvals[i], &b)) return false;
            r->line = e->line;
            if (!tmpl_dict_set(r, d, a, b)) return false;
        }
        *out = (tval){.kind = TV_DICT, .dict = d};
        return true;
    }
    case E_ATTR:
        if (!eval(r, sc, e->a, &a)) return false;
        r->line = e->line;
        return tmpl_getattr(r, &a, e->name, e->name_n, out);
    case E_ITEM:
        if (!eval(r, sc, e->a, &a) || !eval(r, sc, e->b, &b)) return false;
        r->line = e->line;
        return tmpl_getitem(r, &a, &b, out);
    case E_SLICE: {
        tval s0, s1, s2;
        if (!eval(r, sc, e->a, &a)) return false;
        if (e->b && !eval(r, sc, e->b, &s0)) return false;
        if (e->c && !eval(r, sc, e->c, &s1)) return false;
        if (e->d && !eval(r, sc, e->d, &s2)) return false;
        r->line = e->line;
        if (r->folding && a.kind != TV_UNDEF) {
            /* folded at compile time: the sandbox's getitem makes a TypeError undefined */
            bool seq = a.kind == TV_STR || (a.kind == TV_LIST && (a.list->flavour == LF_LIST ||
                                                                  a.list->flavour == LF_TUPLE || a.list->flavour == LF_RANGE));
            const tval *bounds[3] = {e->b ? &s0 : NULL, e->c ? &s1 : NULL, e->d ? &s2 : NULL};
            for (int k = 0; k < 3; k++)
                if (bounds[k] && bounds[k]->kind != TV_NONE && !is_intlike(bounds[k])) seq = false;
            if (!seq) {
                *out = tv_undef();
                return true;
            }
        }
        return tmpl_slice(r, &a, e->b ? &s0 : NULL, e->c ? &s1 : NULL, e->d ? &s2 : NULL, out);
    }
    case E_CALL: {
        evargs ea;
        if (!eval(r, sc, e->a, &a) || !eval_args(r, sc, e, &ea, 0)) return false;
        r->line = e->line;
        return tmpl_call_value(r, &a, ea.args, ea.nargs, ea.kwn, ea.kwnn, ea.kwv, ea.nkw, out);
    }
    case E_FILTER:
        return eval_filter_chain(r, sc, e, NULL, out);
    case E_TEST: {
        evargs ea;
        if (!eval(r, sc, e->a, &a) || !eval_args(r, sc, e, &ea, 0)) return false;
        r->line = e->line;
        if (ea.nkw) return tmpl_fail(r, FERRY_ERR_UNSUPPORTED, "line %d: keyword arguments to tests are not supported", e->line);
        bool res;
        if (e->fn == TMPL_UNKNOWN)
            return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: no test named '%.*s'", e->line, (int)e->name_n, e->name);
        if (!tmpl_call_test_id(r, e->fn, &a, ea.args, ea.nargs, &res)) return false;
        *out = tv_bool(res);
        return true;
    }
    case E_NEG:
    case E_POS:
        if (!eval(r, sc, e->a, &a)) return false;
        r->line = e->line;
        if (a.kind == TV_UNDEF) return tmpl_fail_undef(r, &a);
        if (a.kind == TV_FLOAT) *out = tv_float(e->kind == E_NEG ? -a.f : a.f);
        else if (is_intlike(&a)) {
            if (e->kind == E_NEG && intval(&a) == INT64_MIN) return int_overflow(r);
            *out = tv_int(e->kind == E_NEG ? -intval(&a) : intval(&a));
        } else
            return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: bad operand type for unary %c: '%s'", e->line,
                             e->kind == E_NEG ? '-' : '+', tmpl_type_name(&a));
        return true;
    case E_NOT:
        if (!eval(r, sc, e->a, &a)) return false;
        *out = tv_bool(!tmpl_truthy(&a));
        return true;
    case E_AND:
    case E_OR:
        /* Python's and/or: the deciding operand itself */
        if (!eval(r, sc, e->a, &a)) return false;
        if (tmpl_truthy(&a) == (e->kind == E_OR)) {
            *out = a;
            return true;
        }
        return eval(r, sc, e->b, out);
    case E_BINOP:
        if (!eval(r, sc, e->a, &a) || !eval(r, sc, e->b, &b)) return false;
        r->line = e->line;
        return arith(r, e->op, &a, &b, out);
    case E_CONCAT:
        return eval_concat(r, sc, e, out);
    case E_COMPARE: {
        if (!eval(r, sc, e->a, &a)) return false;
        bool res = true;
        for (uint32_t i = 0; i < e->nargs && res; i++) {
            if (!eval(r, sc, e->args[i], &b)) return false;
            r->line = e->line;
            if (!compare(r, e->cmpops[i], &a, &b, &res)) return false;
            a = b;
        }
        *out = tv_bool(res);
        return true;
    }
    case E_COND:
        if (!eval(r, sc, e->a, &a)) return false;
        if (tmpl_truthy(&a)) return eval(r, sc, e->b, out);
        if (e->c) return eval(r, sc, e->c, out);
        *out = tv_undef();
        return true;
    }
    return tmpl_fail(r, FERRY_ERR_INTERNAL, "line %d: unknown expression kind %d", e->line, e->kind);
}

/* Python's has_safe_repr: what jinja's optimizer may turn into a constant */
static bool safe_repr(const tval *v, int depth)
{
    if (depth > TMPL_MAX_VALUE_DEPTH) return false;
    switch (v->kind) {
    case TV_NONE: case TV_BOOL: case TV_INT: case TV_FLOAT: case TV_STR: return true;
    case TV_LIST:
        if (v->list->flavour == LF_RANGE) return true;
        if (v->list->flavour != LF_LIST && v->list->flavour != LF_TUPLE) return false;
        for (size_t i = 0; i < v->list->n; i++)
            if (!safe_repr(&v->list->items[i], depth + 1)) return false;
        return true;
    case TV_DICT:
        for (size_t i = 0; i < v->dict->n; i++)
            if (!safe_repr(&v->dict->keys[i], depth + 1) || !safe_repr(&v->dict->vals[i], depth + 1)) return false;
        return true;
    default: return false;
    }
}

/* An expression holding a slice: jinja computes it when it compiles if
 * it can and the value has a safe repr (or it is what a {{ }} prints),
 * else at render time with its foldable parts folded - which is what this
 * does, the parts through eval. */
static bool eval_folded(trender *r, tscope *sc, const tmpl_expr *e, tval *out)
{
    r->folding = true;
    bool ok = eval_inner(r, sc, e, out);
    r->folding = false;
    if (ok && ((e->fold & FOLD_OUTPUT) || safe_repr(out, 0))) return true;
    if (!ok) {
        if (r->st == FERRY_ERR_TOO_LARGE || r->st == FERRY_ERR_NOMEM) return false;
        r->st = FERRY_OK; /* folding failed: jinja leaves it to the render */
        r->raised = false;
    }
    return eval_inner(r, sc, e, out);
}

static bool eval(trender *r, tscope *sc, const tmpl_expr *e, tval *out)
{
    r->line = e->line;
    if (!enter(r) || !tmpl_charge(r, 1)) return false;
    bool ok = (e->fold & FOLD_SLICE) && !r->folding ? eval_folded(r, sc, e, out) : eval_inner(r, sc, e, out);
    r->depth--;
    return ok;
}

/* A filter chain; the innermost operand is `body` (filter blocks and block
 * sets) when its expression is NULL. */
static bool eval_filter_chain(trender *r, tscope *sc, const tmpl_expr *e, const tval *body, tval *out)
{
    tval in;
    if (r->folding && not_constant(e)) return tmpl_fail(r, FERRY_ERR_INTERNAL, "not a constant");
    if (e->a) {
        if (e->a->kind == E_FILTER) {
            if (!enter(r)) return false;
            bool ok = eval_filter_chain(r, sc, e->a, body, &in);
            r->depth--;
            if (!ok) return false;
        } else if (!eval(r, sc, e->a, &in)) {
            return false;
        }
    } else {
        in = *body;
    }
    evargs ea;
    if (!eval_args(r, sc, e, &ea, 0)) return false;
    r->line = e->line;
    if (e->fn == TMPL_UNKNOWN)
        return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: no filter named '%.*s'", e->line, (int)e->name_n, e->name);
    return tmpl_call_filter_id(r, e->fn, &in, ea.args, ea.nargs, ea.kwn, ea.kwnn, ea.kwv, ea.nkw, out);
}

/* ---- calls ------------------------------------------------------------ */

/* Renders body into a string in its own sink. */
static bool capture(trender *r, tscope *sc, const tmpl_body *body, tval *out)
{
    tmpl_sink k = {.max = r->max_out};
    sb_init(&k.sb);
    tmpl_sink *saved = r->out;
    r->out = &k;
    xres x = exec_body(r, sc, body);
    r->out = saved;
    if (x == X_ERR) {
        sb_free(&k.sb);
        return false;
    }
    return tmpl_sb_to_str(r, &k.sb, out);
}

static bool call_macro(trender *r, const tclosure *c, const tval *args, size_t nargs, const char **kwn,
                       const size_t *kwnn, const tval *kwv, size_t nkw, tval *out)
{
    const tmpl_macro *m = c->m;
    int line = r->line;
    if (r->macro_depth >= TMPL_MAX_MACRO_DEPTH)
        return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: macro calls nested too deeply (limit %d)", line, TMPL_MAX_MACRO_DEPTH);
    if (!tmpl_charge(r, 16)) return false;
    if (++r->iterations > TMPL_MAX_ITERATIONS)
        return tmpl_fail(r, FERRY_ERR_TOO_LARGE, "chat template render exceeds %d loop iterations and macro calls",
                         TMPL_MAX_ITERATIONS);
    tscope *s = scope_new(r, c->env);
    if (!s || !predeclare(r, s, &m->body)) return false;
    bool *given = nargs || nkw ? tmpl_ralloc(r, (m->nparams + 1) * sizeof *given) : NULL;
    if ((nargs || nkw) && !given) return false;
    if (given) memset(given, 0, (m->nparams + 1) * sizeof *given);
    if (nargs > m->nparams && !m->uses_varargs)
        return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: macro '%.*s' takes not more than %u argument(s)", line,
                         (int)m->name_n, m->name, m->nparams);
    for (size_t i = 0; i < nargs && i < m->nparams; i++) {
        if (!scope_set(r, s, m->param_ids[i], args[i])) return false;
        given[i] = true;
    }
    tdict *kwargs = NULL;
    tval caller = c->caller;
    for (size_t k = 0; k < nkw; k++) {
        uint32_t p;
        for (p = 0; p < m->nparams; p++)
            if (m->param_name_n[p] == kwnn[k] && memcmp(m->param_names[p], kwn[k], kwnn[k]) == 0) break;
        if (p < m->nparams) {
            if (given[p])
                return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: macro '%.*s' got multiple values for argument '%.*s'",
                                 line, (int)m->name_n, m->name, (int)kwnn[k], kwn[k]);
            if (!scope_set(r, s, m->param_ids[p], kwv[k])) return false;
            given[p] = true;
        } else if (kwnn[k] == 6 && memcmp(kwn[k], "caller", 6) == 0 && m->uses_caller) {
            caller = kwv[k];
        } else if (m->uses_kwargs) {
            if (!kwargs && !(kwargs = tmpl_dict_new(r, 4))) return false;
            if (!tmpl_dict_set(r, kwargs, tv_str(kwn[k], kwnn[k]), kwv[k])) return false;
        } else {
            return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: macro '%.*s' takes no keyword argument '%.*s'", line,
                             (int)m->name_n, m->name, (int)kwnn[k], kwn[k]);
        }
    }
    for (uint32_t p = 0; p < m->nparams; p++) {
        if (given && given[p]) continue;
        tval v = tv_undef();
        if (m->defaults && m->defaults[p]) {
            if (!eval(r, s, m->defaults[p], &v)) return false;
        } else {
            v.sub = UD_NAME;
            v.s.p = m->param_names[p];
            v.s.n = m->param_name_n[p];
        }
        if (!scope_set(r, s, m->param_ids[p], v)) return false;
    }
    if (m->uses_varargs) {
        size_t extra = nargs > m->nparams ? nargs - m->nparams : 0;
        tlist *l = tmpl_list_new(r, extra, LF_TUPLE);
        if (!l) return false;
        if (extra) memcpy(l->items, args + m->nparams, extra * sizeof(tval));
        l->n = extra;
        if (!scope_set(r, s, NAME_VARARGS, (tval){.kind = TV_LIST, .list = l})) return false;
    }
    if (m->uses_kwargs) {
        if (!kwargs && !(kwargs = tmpl_dict_new(r, 0))) return false;
        if (!scope_set(r, s, NAME_KWARGS, (tval){.kind = TV_DICT, .dict = kwargs})) return false;
    }
    if (m->uses_caller) {
        if (caller.kind == TV_UNDEF) {
            caller.sub = UD_OTHER;
            caller.s.p = "no caller defined";
            caller.s.n = 17;
        }
        if (!scope_set(r, s, NAME_CALLER, caller)) return false;
    }
    r->macro_depth++;
    bool ok = capture(r, s, &m->body, out);
    r->macro_depth--;
    r->line = line;
    return ok;
}

bool tmpl_call_value(trender *r, const tval *callee, const tval *args, size_t nargs, const char **kwn,
                     const size_t *kwnn, const tval *kwv, size_t nkw, tval *out)
{
    switch (callee->kind) {
    case TV_MACRO: return call_macro(r, callee->macro, args, nargs, kwn, kwnn, kwv, nkw, out);
    case TV_FUNC: return tmpl_call_func(r, callee->fn, args, nargs, kwn, kwnn, kwv, nkw, out);
    case TV_METHOD: return tmpl_call_method(r, callee->method, args, nargs, kwn, kwnn, kwv, nkw, out);
    case TV_UNDEF: return tmpl_fail_undef(r, callee);
    default:
        return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: '%s' object is not callable", r->line, tmpl_type_name(callee));
    }
}

/* ---- statements ------------------------------------------------------- */

static bool unpack(trender *r, tscope *sc, const tmpl_target *t, const tval *v);

static bool assign(trender *r, tscope *sc, const tmpl_target *t, const tval *v)
{
    if (t->kind == T_NAME) return scope_set(r, sc, t->id, *v);
    if (t->kind == T_TUPLE) return unpack(r, sc, t, v);
    /* ns.attr = v */
    tval ns = lookup(r, sc, t->id);
    if (ns.kind != TV_NS)
        return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: cannot assign attribute on non-namespace object", t->line);
    return tmpl_dict_set(r, ns.dict, tv_str(t->attr, t->attr_n), *v);
}

static bool unpack(trender *r, tscope *sc, const tmpl_target *t, const tval *v)
{
    r->line = t->line;
    tlist *items;
    if (v->kind == TV_UNDEF) return tmpl_fail_undef(r, v);
    if (!tmpl_iterate(r, v, &items)) return false;
    if (items->n != t->n)
        return tmpl_fail(r, FERRY_ERR_INVALID, "line %d: %s values to unpack (expected %u, got %zu)", t->line,
                         items->n > t->n ? "too many" : "not enough", t->n, items->n);
    for (uint32_t i = 0; i < t->n; i++)
        if (!assign(r, sc, t->items[i], &items->items[i])) return false;
    return true;
}

static xres exec_for(trender *r, tscope *sc, const tmpl_stmt *s)
{
    tval it;
    tlist *items;
    if (!eval(r, sc, s->expr, &it)) return X_ERR;
    r->line = s->line;
    if (!tmpl_iterate(r, &it, &items)) return X_ERR;
    tscope *iter = scope_new(r, sc);
    if (!iter) return X_ERR;
    if (s->cond) {
        /* the `if` filter sees the loop variables but not `loop` */
        tlist *kept = tmpl_list_new(r, 0, LF_LIST);
        size_t cap = 0;
        if (!kept) return X_ERR;
        for (size_t i = 0; i < items->n; i++) {
            tval c;
            scope_reset(iter);
            if (!tmpl_charge(r, 1) || !assign(r, iter, s->target, &items->items[i]) || !eval(r, iter, s->cond, &c))
                return X_ERR;
            if (tmpl_truthy(&c) && !tmpl_list_push(r, kept, &cap, items->items[i])) return X_ERR;
        }
        items = kept;
    }
    if (items->n == 0) {
        /* the else branch runs in a frame of its own too */
        scope_reset(iter);
        if (!predeclare(r, iter, &s->else_body)) return X_ERR;
        xres x = exec_body(r, iter, &s->else_body);
        return x == X_ERR ? X_ERR : X_OK;
    }
    tloop *loop = tmpl_ralloc(r, sizeof *loop);
    if (!loop) return X_ERR;
    memset(loop, 0, sizeof *loop);
    loop->items = items;
    /* jinja runs the else branch unless some iteration reached the end of
     * the body: not after break or continue */
    bool completed = false;
    for (size_t i = 0; i < items->n; i++) {
        if (++r->iterations > TMPL_MAX_ITERATIONS) {
            tmpl_fail(r, FERRY_ERR_TOO_LARGE, "chat template render exceeds %d loop iterations and macro calls",
                      TMPL_MAX_ITERATIONS);
            return X_ERR;
        }
        loop->i = i;
        /* each iteration starts from the enclosing scope again: reset
         * rather than reallocate, so that long loops do not grow memory */
        scope_reset(iter);
        r->line = s->line;
        if (!predeclare(r, iter, &s->body)) return X_ERR;
        if (!scope_set(r, iter, NAME_LOOP, (tval){.kind = TV_LOOP, .loop = loop})) return X_ERR;
        if (!assign(r, iter, s->target, &items->items[i])) return X_ERR;
        xres x = exec_body(r, iter, &s->body);
        if (x == X_ERR) return X_ERR;
        if (x == X_OK) completed = true;
        if (x == X_BREAK) break;
    }
    if (!completed && s->else_body.n) {
        scope_reset(iter);
        if (!predeclare(r, iter, &s->else_body)) return X_ERR;
        xres x = exec_body(r, iter, &s->else_body);
        return x == X_ERR ? X_ERR : X_OK;
    }
    return X_OK;
}

static xres exec_stmt(trender *r, tscope *sc, const tmpl_stmt *s)
{
    tval v;
    r->line = s->line;
    if (!tmpl_charge(r, 1)) return X_ERR;
    switch (s->kind) {
    case S_DATA:
        return emit(r, s->text, s->len) ? X_OK : X_ERR;
    case S_PRINT:
        if (!eval(r, sc, s->expr, &v)) return X_ERR;
        r->line = s->line;
        return emit_value(r, &v) ? X_OK : X_ERR;
    case S_IF:
        if (!eval(r, sc, s->expr, &v)) return X_ERR;
        return exec_body(r, sc, tmpl_truthy(&v) ? &s->body : &s->else_body);
    case S_FOR:
        return exec_for(r, sc, s);
    case S_SET:
        if (!eval(r, sc, s->expr, &v)) return X_ERR;
        r->line = s->line;
        return assign(r, sc, s->target, &v) ? X_OK : X_ERR;
    case S_SETBLOCK: {
        tscope *inner = scope_new(r, sc);
        if (!inner || !predeclare(r, inner, &s->body) || !capture(r, inner, &s->body, &v)) return X_ERR;
        if (s->filter && !eval_filter_chain(r, sc, s->filter, &v, &v)) return X_ERR;
        return assign(r, sc, s->target, &v) ? X_OK : X_ERR;
    }
    case S_FILTERBLOCK: {
        tscope *inner = scope_new(r, sc);
        if (!inner || !predeclare(r, inner, &s->body) || !capture(r, inner, &s->body, &v)) return X_ERR;
        if (!eval_filter_chain(r, sc, s->filter, &v, &v)) return X_ERR;
        return emit_value(r, &v) ? X_OK : X_ERR;
    }
    case S_MACRO: {
        tclosure *c = tmpl_ralloc(r, sizeof *c);
        if (!c) return X_ERR;
        c->m = s->macro;
        c->env = sc;
        c->caller = tv_undef();
        return scope_set(r, sc, s->macro->id, (tval){.kind = TV_MACRO, .macro = c}) ? X_OK : X_ERR;
    }
    case S_CALLBLOCK: {
        /* {% call m(args) %}body{% endcall %}: m(args, caller=<body>) */
        tclosure *c = tmpl_ralloc(r, sizeof *c);
        if (!c) return X_ERR;
        c->m = s->macro;
        c->env = sc;
        c->caller = tv_undef();
        const tmpl_expr *call = s->expr;
        tval callee;
        evargs ea;
        if (!eval(r, sc, call->a, &callee) || !eval_args(r, sc, call, &ea, 1)) return X_ERR;
        r->line = s->line;
        if (callee.kind == TV_MACRO) {
            for (size_t k = 0; k < ea.nkw; k++)
                if (ea.kwnn[k] == 6 && memcmp(ea.kwn[k], "caller", 6) == 0) {
                    tmpl_fail(r, FERRY_ERR_INVALID, "line %d: macro was invoked with two values for the special caller argument", s->line);
                    return X_ERR;
                }
        }
        ea.kwn[ea.nkw] = "caller";
        ea.kwnn[ea.nkw] = 6;
        ea.kwv[ea.nkw] = (tval){.kind = TV_MACRO, .macro = c};
        ea.nkw++;
        if (!tmpl_call_value(r, &callee, ea.args, ea.nargs, ea.kwn, ea.kwnn, ea.kwv, ea.nkw, &v)) return X_ERR;
        return emit_value(r, &v) ? X_OK : X_ERR;
    }
    case S_BREAK: return X_BREAK;
    case S_CONTINUE: return X_CONTINUE;
    case S_GROUP: return exec_body(r, sc, &s->body);
    case S_SCOPE: {
        tscope *inner = scope_new(r, sc);
        if (!inner || !predeclare(r, inner, &s->body)) return X_ERR;
        for (uint32_t i = 0; i < s->nwith; i++) {
            if (!eval(r, sc, s->with_values[i], &v) || !assign(r, inner, s->with_targets[i], &v)) return X_ERR;
        }
        return exec_body(r, inner, &s->body);
    }
    }
    tmpl_fail(r, FERRY_ERR_INTERNAL, "line %d: unknown statement kind %d", s->line, s->kind);
    return X_ERR;
}

static xres exec_body(trender *r, tscope *sc, const tmpl_body *b)
{
    if (!enter(r)) return X_ERR;
    xres x = X_OK;
    for (uint32_t i = 0; i < b->n && x == X_OK; i++) x = exec_stmt(r, sc, b->v[i]);
    r->depth--;
    return x;
}

/* ---- entry ------------------------------------------------------------ */

static const int fixed_funcs[][2] = {
    {NAME_RANGE, TF_RANGE}, {NAME_NAMESPACE, TF_NAMESPACE}, {NAME_DICT, TF_DICT},
    {NAME_RAISE_EXCEPTION, TF_RAISE_EXCEPTION}, {NAME_STRFTIME_NOW, TF_STRFTIME_NOW},
    {NAME_CYCLER, TF_CYCLER}, {NAME_JOINER, TF_JOINER}, {NAME_LIPSUM, TF_LIPSUM},
};

ferry_status tmpl_render_body(const struct chat_template *t, const json_value *vars, size_t max_out, strbuf *out)
{
    if (!vars || vars->type != JSON_OBJECT)
        return ferry_fail(FERRY_ERR_INVALID, "chat template variables must be a JSON object");
    trender r = {.t = t, .max_out = max_out};
    r.arena.limit = SIZE_MAX;
    tmpl_sink main_sink = {.max = max_out};
    sb_init(&main_sink.sb);
    r.out = &main_sink;
    ferry_status st = FERRY_OK;

    /* the caller's variables become values first, outside the budget: their
     * size is the caller's business */
    tval root;
    if (!tmpl_from_json(&r, vars, &root, 0)) goto done;
    size_t budget = (size_t)64 << 20;
    if (max_out < ((size_t)1 << 40)) budget += 4 * max_out;
    r.arena.limit = r.arena.held + budget;

    r.globals = tmpl_ralloc(&r, t->names.count * sizeof *r.globals);
    if (!r.globals) goto done;
    for (uint32_t i = 0; i < t->names.count; i++) {
        bool found = false;
        if (!tmpl_dict_get_str(&r, root.dict, t->names.s[i], t->names.n[i], &r.globals[i], &found)) goto done;
        if (found) continue;
        r.globals[i] = tv_undef();
        for (size_t k = 0; k < sizeof fixed_funcs / sizeof fixed_funcs[0]; k++)
            if (fixed_funcs[k][0] == (int)i) r.globals[i] = (tval){.kind = TV_FUNC, .fn = fixed_funcs[k][1]};
    }
    r.top = scope_new(&r, NULL);
    if (!r.top || !predeclare(&r, r.top, &t->body)) goto done;
    if (exec_body(&r, r.top, &t->body) != X_OK && r.st == FERRY_OK)
        tmpl_fail(&r, FERRY_ERR_INTERNAL, "break or continue escaped its loop");
done:
    st = r.st;
    if (st != FERRY_OK && !r.raised && strncmp(ferry_errmsg(), "line ", 5) == 0) {
        /* name the template: "chat template line 3: 'x' is undefined" */
        char msg[FERRY_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", ferry_errmsg());
        ferry_fail(st, "%s %s", t->label, msg);
    }
    if (st == FERRY_OK && main_sink.sb.oom) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory rendering the chat template");
    if (st == FERRY_OK) {
        sb_append(out, main_sink.sb.data ? main_sink.sb.data : "", main_sink.sb.len);
        if (out->oom) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory rendering the chat template");
    }
    sb_free(&main_sink.sb);
    arena_free(&r.arena);
    return st;
}
