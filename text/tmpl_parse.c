/*
 * tmpl_parse.c - tokens to statement and expression trees.
 *
 * A recursive-descent parser with jinja2's grammar and precedence (its
 * parser.py, read for the rules, not copied): conditional expressions, or,
 * and, not, chained comparisons and `in`, + -, ~, * / // %, **, unary - +,
 * then postfix (.attr, [item], [a:b:c], calls) and filters/tests, which bind
 * tighter than unary minus on their left (`-x|abs` is abs(-x)).
 *
 * A construct outside the subset is an error here, naming it and its line,
 * even where jinja would only meet it when rendering: filters and tests
 * jinja has and this interpreter lacks, statements outside the subset,
 * argument unpacking, recursive loops, methods of str/list/dict that are
 * not implemented. What jinja itself refuses when it compiles is refused
 * here too: syntax errors, break/continue outside a loop, and filters and
 * tests that do not exist at all - except inside an if statement or a
 * conditional expression, where jinja (and so this) fails only if one runs.
 *
 * Nesting (TMPL_MAX_NESTING) and the number of distinct names
 * (TMPL_MAX_NAMES) are bounded, so that a hostile template can exhaust
 * neither the stack nor the time of the passes over the tree.
 */
#include "tmpl_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    struct chat_template *t;
    const tmpl_token *tok;
    size_t n, pos;
    char *err;
    size_t errsz;
    bool failed;
    int depth;
    int loop_depth;              /* enclosing for loops in the current frame */
    tmpl_macro *macros[TMPL_MAX_NESTING]; /* macros being parsed, innermost last */
    int nmacros;
    int *name_slots;             /* intern's hash table: id + 1, 0 when free */
} parser;

static bool pfail_at(parser *p, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static bool pfail_at(parser *p, int line, const char *fmt, ...)
{
    if (p->failed) return false;
    p->failed = true;
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(p->err, p->errsz, "line %d: %s", line, msg);
    return false;
}

#define pfail(p, ...) pfail_at((p), (p)->tok[(p)->pos].line, __VA_ARGS__)

static const tmpl_token *cur(const parser *p) { return &p->tok[p->pos]; }
static const tmpl_token *peek(const parser *p, size_t k)
{
    size_t i = p->pos + k;
    return &p->tok[i < p->n ? i : p->n - 1];
}
static void next(parser *p)
{
    if (p->pos + 1 < p->n) p->pos++;
}

static bool tok_is_op(const tmpl_token *t, int op) { return t->kind == TK_OP && t->op == op; }
static bool tok_is_name(const tmpl_token *t, const char *name)
{
    size_t k = strlen(name);
    return t->kind == TK_NAME && t->n == k && memcmp(t->s, name, k) == 0;
}
static bool at_op(const parser *p, int op) { return tok_is_op(cur(p), op); }
static bool at_name(const parser *p, const char *name) { return tok_is_name(cur(p), name); }

static const char *describe(const tmpl_token *t, char *buf, size_t n)
{
    static const char *opnames[] = {"", "+", "-", "/", "//", "*", "**", "%", "~", "[", "]", "(", ")", "{", "}",
                                    "==", "!=", ">", ">=", "<", "<=", "=", ".", ":", "|", ",", ";"};
    switch (t->kind) {
    case TK_EOF: return "end of template";
    case TK_DATA: return "template data";
    case TK_VAR_BEGIN: return "begin of print statement";
    case TK_VAR_END: return "end of print statement";
    case TK_BLOCK_BEGIN: return "begin of statement block";
    case TK_BLOCK_END: return "end of statement block";
    case TK_NAME: snprintf(buf, n, "%.*s", (int)(t->n > 40 ? 40 : t->n), t->s); return buf;
    case TK_STRING: return "string";
    case TK_INT: return "integer";
    case TK_FLOAT: return "float";
    case TK_OP: return t->op < sizeof opnames / sizeof opnames[0] ? opnames[t->op] : "operator";
    }
    return "token";
}

static bool expect_op(parser *p, int op, const char *what)
{
    if (at_op(p, op)) {
        next(p);
        return true;
    }
    char buf[64];
    return pfail(p, "expected '%s', got '%s'", what, describe(cur(p), buf, sizeof buf));
}

static bool expect_kind(parser *p, int kind, const char *what)
{
    if (cur(p)->kind == kind) {
        next(p);
        return true;
    }
    char buf[64];
    return pfail(p, "expected %s, got '%s'", what, describe(cur(p), buf, sizeof buf));
}

static void *palloc(parser *p, size_t n)
{
    void *v = arena_alloc(&p->t->arena, n);
    if (!v) pfail(p, "out of memory");
    else memset(v, 0, n);
    return v;
}

static bool enter(parser *p)
{
    if (++p->depth > TMPL_MAX_NESTING) return pfail(p, "template nested too deeply (limit %d)", TMPL_MAX_NESTING);
    return true;
}
static void leave(parser *p) { p->depth--; }

/* Loops that extend a chain (a + b + c, x.a.b, x|f|g) build trees as deep
 * as the chain is long: each link counts as a level of nesting, so that
 * every later recursion over the tree is bounded too. */
static bool link(parser *p, int *links)
{
    ++*links;
    return enter(p);
}

/* ---- names ------------------------------------------------------------ */

static uint32_t name_hash(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

/* The id of a name, interned on first sight. Ids stay below
 * TMPL_MAX_NAMES, which bounds every per-name table (scopes, symbols). */
static int intern(parser *p, const char *s, size_t n)
{
    tmpl_names *nm = &p->t->names;
    uint32_t slot = name_hash(s, n) & (TMPL_NAME_SLOTS - 1);
    for (;; slot = (slot + 1) & (TMPL_NAME_SLOTS - 1)) {
        int id = p->name_slots[slot] - 1;
        if (id < 0) break;
        if (nm->n[id] == n && memcmp(nm->s[id], s, n) == 0) return id;
    }
    if (nm->count >= TMPL_MAX_NAMES) {
        pfail(p, "too many distinct names (limit %d)", TMPL_MAX_NAMES);
        return -1;
    }
    p->name_slots[slot] = (int)nm->count + 1;
    if (nm->count == nm->cap) {
        uint32_t cap = nm->cap ? nm->cap * 2 : 64;
        const char **ns = arena_grow(&p->t->arena, nm->s, nm->cap * sizeof *ns, cap * sizeof *ns);
        size_t *nn = ns ? arena_grow(&p->t->arena, nm->n, nm->cap * sizeof *nn, cap * sizeof *nn) : NULL;
        if (!nn) {
            pfail(p, "out of memory");
            return -1;
        }
        nm->s = ns;
        nm->n = nn;
        nm->cap = cap;
    }
    nm->s[nm->count] = s;
    nm->n[nm->count] = n;
    return (int)nm->count++;
}

/* a growable array of pointers in the arena */
typedef struct {
    void **v;
    uint32_t n, cap;
} ptrvec;

static bool pv_push(parser *p, ptrvec *pv, void *x)
{
    if (pv->n == pv->cap) {
        uint32_t cap = pv->cap ? pv->cap * 2 : 4;
        void **v = arena_grow(&p->t->arena, pv->v, pv->cap * sizeof *v, cap * sizeof *v);
        if (!v) return pfail(p, "out of memory");
        pv->v = v;
        pv->cap = cap;
    }
    pv->v[pv->n++] = x;
    return true;
}

/* ---- expressions ------------------------------------------------------ */

static tmpl_expr *new_expr(parser *p, int kind, int line)
{
    tmpl_expr *e = palloc(p, sizeof *e);
    if (e) {
        e->kind = (uint8_t)kind;
        e->line = line;
    }
    return e;
}

static tmpl_expr *parse_expression(parser *p, bool with_condexpr);
static tmpl_expr *parse_tuple(parser *p, bool with_condexpr, const char *extra_end, bool explicit_parens);
static tmpl_expr *parse_unary(parser *p, bool with_filter);
static tmpl_expr *parse_primary(parser *p);
static tmpl_expr *parse_postfix(parser *p, tmpl_expr *node);

typedef struct {
    ptrvec args, kwvals;
    ptrvec kwnames;  /* const char * */
    ptrvec kwlens;   /* (void *)(uintptr_t)len */
} callargs;

static bool parse_call_args(parser *p, callargs *ca)
{
    memset(ca, 0, sizeof *ca);
    int line = cur(p)->line;
    if (!expect_op(p, OP_LPAREN, "(")) return false;
    bool need_comma = false;
    while (!at_op(p, OP_RPAREN)) {
        if (need_comma) {
            if (!expect_op(p, OP_COMMA, ",")) return false;
            if (at_op(p, OP_RPAREN)) break;
        }
        if (at_op(p, OP_MUL) || at_op(p, OP_POW))
            return pfail(p, "argument unpacking (*args, **kwargs) is not supported");
        if (cur(p)->kind == TK_NAME && tok_is_op(peek(p, 1), OP_ASSIGN)) {
            const tmpl_token *k = cur(p);
            next(p);
            next(p);
            tmpl_expr *v = parse_expression(p, true);
            if (!v) return false;
            if (!pv_push(p, &ca->kwnames, (void *)k->s) || !pv_push(p, &ca->kwlens, (void *)(uintptr_t)k->n) ||
                !pv_push(p, &ca->kwvals, v))
                return false;
        } else {
            if (ca->kwvals.n) return pfail_at(p, line, "invalid syntax for function call expression (positional argument after keyword argument)");
            tmpl_expr *v = parse_expression(p, true);
            if (!v || !pv_push(p, &ca->args, v)) return false;
        }
        need_comma = true;
    }
    return expect_op(p, OP_RPAREN, ")");
}

static bool set_args(parser *p, tmpl_expr *e, callargs *ca)
{
    e->args = (tmpl_expr **)ca->args.v;
    e->nargs = ca->args.n;
    e->kwvals = (tmpl_expr **)ca->kwvals.v;
    e->nkw = ca->kwvals.n;
    e->kwnames = (const char **)ca->kwnames.v;
    if (ca->kwlens.n) {
        e->kwname_n = palloc(p, ca->kwlens.n * sizeof *e->kwname_n);
        if (!e->kwname_n) return false;
        for (uint32_t i = 0; i < ca->kwlens.n; i++) e->kwname_n[i] = (size_t)(uintptr_t)ca->kwlens.v[i];
    }
    return true;
}

static bool const_str_arg(const tmpl_expr *e, size_t i, const char **s, size_t *n)
{
    if (i >= e->nargs || e->args[i]->kind != E_CONST || e->args[i]->cval.kind != TV_STR) return false;
    *s = e->args[i]->cval.s.p;
    *n = e->args[i]->cval.s.n;
    return true;
}

/* map/select/... name a filter or test by a string: check it when it is a
 * literal, as jinja would fail on it at render time */
static bool check_named_builtin(parser *p, const tmpl_expr *e, int line)
{
    static const struct {
        const char *filter;
        int argi;
        bool is_test;
    } uses[] = {{"map", 0, false}, {"select", 0, true}, {"reject", 0, true}, {"selectattr", 1, true}, {"rejectattr", 1, true}};
    for (size_t k = 0; k < sizeof uses / sizeof uses[0]; k++) {
        if (strlen(uses[k].filter) != e->name_n || memcmp(uses[k].filter, e->name, e->name_n) != 0) continue;
        const char *s;
        size_t n;
        if (!const_str_arg(e, (size_t)uses[k].argi, &s, &n)) return true;
        if (uses[k].is_test && n == 2 && (!memcmp(s, "==", 2) || !memcmp(s, "!=", 2) || !memcmp(s, ">=", 2) || !memcmp(s, "<=", 2)))
            return true;
        if (uses[k].is_test && n == 1 && (s[0] == '<' || s[0] == '>')) return true;
        bool known;
        int id = uses[k].is_test ? tmpl_test_id(s, n, &known) : tmpl_filter_id(s, n, &known);
        /* a name jinja lacks too fails when the filter runs, as in jinja */
        if (id < 0 && known)
            return pfail_at(p, line, "%s '%.*s' is not supported", uses[k].is_test ? "test" : "filter",
                            (int)(n > 60 ? 60 : n), s);
    }
    return true;
}

/* name(.name)* of a filter or test */
static bool parse_dotted_name(parser *p, const char **s, size_t *n)
{
    if (cur(p)->kind != TK_NAME) {
        char buf[64];
        return pfail(p, "expected a name, got '%s'", describe(cur(p), buf, sizeof buf));
    }
    /* jinja reads `x|a.b` as a filter named "a.b" (which no environment here has) */
    *s = cur(p)->s;
    *n = cur(p)->n;
    next(p);
    while (at_op(p, OP_DOT) && peek(p, 1)->kind == TK_NAME) {
        next(p);
        *n = (size_t)(cur(p)->s + cur(p)->n - *s);
        next(p);
    }
    return true;
}

/* |name(args) chains; node is the operand (NULL in filter blocks) */
static tmpl_expr *parse_filter(parser *p, tmpl_expr *node, bool start_inline)
{
    int links = 0;
    while ((at_op(p, OP_PIPE) || start_inline) && link(p, &links)) {
        if (!start_inline) next(p);
        start_inline = false;
        int line = cur(p)->line;
        tmpl_expr *e = new_expr(p, E_FILTER, line);
        if (!e || !parse_dotted_name(p, &e->name, &e->name_n)) return NULL;
        bool known;
        int id = tmpl_filter_id(e->name, e->name_n, &known);
        if (id < 0 && known) {
            pfail_at(p, line, "filter '%.*s' is not supported", (int)(e->name_n > 60 ? 60 : e->name_n), e->name);
            return NULL;
        }
        /* a filter no one has: an error at parse time or when it runs, as
         * jinja decides (check_unknown) */
        e->fn = (uint16_t)(id < 0 ? TMPL_UNKNOWN : id);
        e->a = node;
        if (at_op(p, OP_LPAREN)) {
            callargs ca;
            if (!parse_call_args(p, &ca) || !set_args(p, e, &ca)) return NULL;
        }
        if (!check_named_builtin(p, e, line)) return NULL;
        node = e;
    }
    p->depth -= links;
    return p->failed ? NULL : node;
}

static tmpl_expr *parse_test(parser *p, tmpl_expr *node)
{
    int line = cur(p)->line;
    next(p); /* is */
    bool negated = false;
    if (at_name(p, "not")) {
        next(p);
        negated = true;
    }
    tmpl_expr *e = new_expr(p, E_TEST, line);
    if (!e || !parse_dotted_name(p, &e->name, &e->name_n)) return NULL;
    bool known;
    int id = tmpl_test_id(e->name, e->name_n, &known);
    if (id < 0 && known) {
        pfail_at(p, line, "test '%.*s' is not supported", (int)(e->name_n > 60 ? 60 : e->name_n), e->name);
        return NULL;
    }
    e->fn = (uint16_t)(id < 0 ? TMPL_UNKNOWN : id);
    e->a = node;
    const tmpl_token *t = cur(p);
    if (at_op(p, OP_LPAREN)) {
        callargs ca;
        if (!parse_call_args(p, &ca) || !set_args(p, e, &ca)) return NULL;
    } else if ((t->kind == TK_NAME || t->kind == TK_STRING || t->kind == TK_INT || t->kind == TK_FLOAT ||
                tok_is_op(t, OP_LBRACKET) || tok_is_op(t, OP_LBRACE)) &&
               !tok_is_name(t, "else") && !tok_is_name(t, "or") && !tok_is_name(t, "and")) {
        /* `x is divisibleby 3`: one argument without parentheses */
        if (tok_is_name(t, "is")) {
            pfail(p, "you cannot chain multiple tests with is");
            return NULL;
        }
        tmpl_expr *arg = parse_primary(p);
        if (arg) arg = parse_postfix(p, arg);
        if (!arg) return NULL;
        e->args = palloc(p, sizeof *e->args);
        if (!e->args) return NULL;
        e->args[0] = arg;
        e->nargs = 1;
    }
    if (negated) {
        tmpl_expr *n = new_expr(p, E_NOT, line);
        if (!n) return NULL;
        n->a = e;
        return n;
    }
    return e;
}

/* jinja's optimizer replaces an expression by its value when it can
 * compute it at compile time (its nodes' as_const: no names, calls or
 * context filters, though `and`, `or`, `if` and comparisons stop early)
 * and the value has a safe repr; a {{ }} prints a value computed that way
 * whatever it is. Such computations slice through the sandbox's getitem,
 * which turns a TypeError into undefined, where a slice at render time
 * raises: `{{ none[1:] }}` prints nothing, `{{ {}[1:] is string }}` is
 * False, `{% set x = none[1:] %}` raises. Slices are the only place where
 * folding changes a result, so expressions holding one are marked
 * (FOLD_SLICE; FOLD_OUTPUT on the expression of a print) and the evaluator
 * folds those the same way (tmpl_eval.c). */
static bool mark_folds(tmpl_expr *e)
{
    if (!e) return false;
    bool slice = e->kind == E_SLICE;
    slice |= mark_folds(e->a);
    slice |= mark_folds(e->b);
    slice |= mark_folds(e->c);
    slice |= mark_folds(e->d);
    for (uint32_t i = 0; i < e->nargs; i++) slice |= mark_folds(e->args[i]);
    for (uint32_t i = 0; i < e->nkw; i++) slice |= mark_folds(e->kwvals[i]);
    if (slice) e->fold |= FOLD_SLICE;
    return slice;
}

static void mark_output(tmpl_expr *e)
{
    mark_folds(e);
    e->fold |= FOLD_OUTPUT;
}

static tmpl_expr *parse_subscribed(parser *p)
{
    int line = cur(p)->line;
    tmpl_expr *parts[3] = {NULL, NULL, NULL};
    if (at_op(p, OP_COLON)) {
        next(p);
    } else {
        tmpl_expr *node = parse_expression(p, true);
        if (!node) return NULL;
        if (!at_op(p, OP_COLON)) return node;
        next(p);
        parts[0] = node;
    }
    if (!at_op(p, OP_COLON) && !at_op(p, OP_RBRACKET) && !at_op(p, OP_COMMA)) {
        if (!(parts[1] = parse_expression(p, true))) return NULL;
    }
    if (at_op(p, OP_COLON)) {
        next(p);
        if (!at_op(p, OP_RBRACKET) && !at_op(p, OP_COMMA)) {
            if (!(parts[2] = parse_expression(p, true))) return NULL;
        }
    }
    tmpl_expr *s = new_expr(p, E_SLICE, line);
    if (!s) return NULL;
    /* a is filled by the caller with the subscripted object */
    s->b = parts[0];
    s->c = parts[1];
    s->d = parts[2];
    return s;
}

static tmpl_expr *parse_subscript(parser *p, tmpl_expr *node)
{
    const tmpl_token *t = cur(p);
    int line = t->line;
    next(p);
    if (t->kind == TK_OP && t->op == OP_DOT) {
        const tmpl_token *a = cur(p);
        next(p);
        if (a->kind == TK_NAME) {
            tmpl_expr *e = new_expr(p, E_ATTR, line);
            if (!e) return NULL;
            e->a = node;
            e->name = a->s;
            e->name_n = a->n;
            if (at_op(p, OP_LPAREN) && tmpl_method_unsupported(a->s, a->n)) {
                pfail_at(p, line, "method '%.*s' is not supported", (int)a->n, a->s);
                return NULL;
            }
            return e;
        }
        if (a->kind != TK_INT) {
            pfail_at(p, a->line, "expected name or number after '.'");
            return NULL;
        }
        tmpl_expr *k = new_expr(p, E_CONST, a->line);
        tmpl_expr *e = new_expr(p, E_ITEM, line);
        if (!k || !e) return NULL;
        k->cval = tv_int(a->i);
        e->a = node;
        e->b = k;
        return e;
    }
    /* [ */
    ptrvec args = {0};
    while (!at_op(p, OP_RBRACKET)) {
        if (args.n && !expect_op(p, OP_COMMA, ",")) return NULL;
        if (cur(p)->kind == TK_EOF) {
            pfail(p, "unexpected end of template in a subscript");
            return NULL;
        }
        tmpl_expr *s = parse_subscribed(p);
        if (!s || !pv_push(p, &args, s)) return NULL;
    }
    if (!expect_op(p, OP_RBRACKET, "]")) return NULL;
    if (args.n == 1) {
        tmpl_expr *s = args.v[0];
        if (s->kind == E_SLICE && s->a == NULL) {
            s->a = node;
            return s;
        }
        tmpl_expr *e = new_expr(p, E_ITEM, line);
        if (!e) return NULL;
        e->a = node;
        e->b = s;
        return e;
    }
    /* x[a, b] and x[] subscript with a tuple, as in jinja */
    for (uint32_t i = 0; i < args.n; i++)
        if (((tmpl_expr *)args.v[i])->kind == E_SLICE && ((tmpl_expr *)args.v[i])->a == NULL) {
            pfail_at(p, line, "slices inside a tuple subscript are not supported");
            return NULL;
        }
    tmpl_expr *tup = new_expr(p, E_TUPLE, line);
    tmpl_expr *e = new_expr(p, E_ITEM, line);
    if (!tup || !e) return NULL;
    tup->args = (tmpl_expr **)args.v;
    tup->nargs = args.n;
    e->a = node;
    e->b = tup;
    return e;
}

static tmpl_expr *parse_call(parser *p, tmpl_expr *node)
{
    tmpl_expr *e = new_expr(p, E_CALL, cur(p)->line);
    if (!e) return NULL;
    callargs ca;
    if (!parse_call_args(p, &ca) || !set_args(p, e, &ca)) return NULL;
    e->a = node;
    return e;
}

static tmpl_expr *parse_postfix(parser *p, tmpl_expr *node)
{
    int links = 0;
    while (node) {
        if (!(at_op(p, OP_DOT) || at_op(p, OP_LBRACKET) || at_op(p, OP_LPAREN))) break;
        if (!link(p, &links)) { node = NULL; break; }
        if (at_op(p, OP_LPAREN)) node = parse_call(p, node);
        else node = parse_subscript(p, node);
    }
    p->depth -= links;
    return node;
}

static tmpl_expr *parse_filter_expr(parser *p, tmpl_expr *node)
{
    int links = 0;
    while (node) {
        if (!(at_op(p, OP_PIPE) || at_name(p, "is") || at_op(p, OP_LPAREN))) break;
        if (!link(p, &links)) { node = NULL; break; }
        if (at_op(p, OP_PIPE)) node = parse_filter(p, node, false);
        else if (at_name(p, "is")) node = parse_test(p, node);
        else node = parse_call(p, node);
    }
    p->depth -= links;
    return node;
}

static tmpl_expr *parse_list_or_dict(parser *p, bool dict)
{
    int line = cur(p)->line;
    next(p);
    int close = dict ? OP_RBRACE : OP_RBRACKET;
    ptrvec keys = {0}, vals = {0};
    while (!at_op(p, close)) {
        if (keys.n && !expect_op(p, OP_COMMA, ",")) return NULL;
        if (at_op(p, close)) break;
        tmpl_expr *k = parse_expression(p, true);
        if (!k || !pv_push(p, &keys, k)) return NULL;
        if (dict) {
            if (!expect_op(p, OP_COLON, ":")) return NULL;
            tmpl_expr *v = parse_expression(p, true);
            if (!v || !pv_push(p, &vals, v)) return NULL;
        }
    }
    if (!expect_op(p, close, dict ? "}" : "]")) return NULL;
    tmpl_expr *e = new_expr(p, dict ? E_DICT : E_LIST, line);
    if (!e) return NULL;
    e->args = (tmpl_expr **)keys.v;
    e->nargs = keys.n;
    e->kwvals = (tmpl_expr **)vals.v;
    e->nkw = vals.n;
    return e;
}

static tmpl_expr *parse_primary(parser *p)
{
    if (!enter(p)) return NULL;
    const tmpl_token *t = cur(p);
    tmpl_expr *e = NULL;
    switch (t->kind) {
    case TK_NAME:
        if (tok_is_name(t, "true") || tok_is_name(t, "True") || tok_is_name(t, "false") || tok_is_name(t, "False")) {
            if ((e = new_expr(p, E_CONST, t->line))) e->cval = tv_bool(t->s[0] == 't' || t->s[0] == 'T');
        } else if (tok_is_name(t, "none") || tok_is_name(t, "None")) {
            if ((e = new_expr(p, E_CONST, t->line))) e->cval = tv_none();
        } else if ((e = new_expr(p, E_NAME, t->line))) {
            e->name = t->s;
            e->name_n = t->n;
            e->id = intern(p, t->s, t->n);
            if (e->id < 0) e = NULL;
            else if (e->id == NAME_VARARGS || e->id == NAME_KWARGS || e->id == NAME_CALLER)
                for (int i = 0; i < p->nmacros; i++) {
                    if (e->id == NAME_VARARGS) p->macros[i]->uses_varargs = true;
                    if (e->id == NAME_KWARGS) p->macros[i]->uses_kwargs = true;
                    if (e->id == NAME_CALLER) p->macros[i]->uses_caller = true;
                }
        }
        next(p);
        break;
    case TK_STRING: {
        /* adjacent literals join, as in Python */
        size_t total = 0, k = p->pos;
        while (p->tok[k].kind == TK_STRING) total += p->tok[k++].n;
        char *s = palloc(p, total + 1);
        if (!s) break;
        size_t off = 0;
        while (cur(p)->kind == TK_STRING) {
            memcpy(s + off, cur(p)->s, cur(p)->n);
            off += cur(p)->n;
            next(p);
        }
        if ((e = new_expr(p, E_CONST, t->line))) e->cval = tv_str(s, total);
        break;
    }
    case TK_INT:
    case TK_FLOAT:
        if ((e = new_expr(p, E_CONST, t->line))) e->cval = t->kind == TK_INT ? tv_int(t->i) : tv_float(t->f);
        next(p);
        break;
    case TK_OP:
        if (t->op == OP_LPAREN) {
            next(p);
            e = parse_tuple(p, true, NULL, true);
            if (e && !expect_op(p, OP_RPAREN, ")")) e = NULL;
            break;
        }
        if (t->op == OP_LBRACKET || t->op == OP_LBRACE) {
            e = parse_list_or_dict(p, t->op == OP_LBRACE);
            break;
        }
        /* fall through */
    default: {
        char buf[64];
        pfail(p, "unexpected '%s'", describe(t, buf, sizeof buf));
        break;
    }
    }
    leave(p);
    return e;
}

static tmpl_expr *parse_unary(parser *p, bool with_filter)
{
    if (!enter(p)) return NULL;
    tmpl_expr *node;
    int line = cur(p)->line;
    if (at_op(p, OP_SUB) || at_op(p, OP_ADD)) {
        int kind = at_op(p, OP_SUB) ? E_NEG : E_POS;
        next(p);
        tmpl_expr *inner = parse_unary(p, false);
        node = inner ? new_expr(p, kind, line) : NULL;
        if (node) node->a = inner;
    } else {
        node = parse_primary(p);
    }
    node = parse_postfix(p, node);
    if (with_filter) node = parse_filter_expr(p, node);
    leave(p);
    return node;
}

static tmpl_expr *binop(parser *p, int kind, int op, tmpl_expr *l, tmpl_expr *r, int line)
{
    if (!l || !r) return NULL;
    tmpl_expr *e = new_expr(p, kind, line);
    if (!e) return NULL;
    e->op = (uint8_t)op;
    e->a = l;
    e->b = r;
    return e;
}

static tmpl_expr *parse_pow(parser *p)
{
    tmpl_expr *l = parse_unary(p, true);
    int links = 0;
    while (l && at_op(p, OP_POW) && link(p, &links)) {
        int line = cur(p)->line;
        next(p);
        l = binop(p, E_BINOP, OP_POW, l, parse_unary(p, true), line);
    }
    p->depth -= links;
    return p->failed ? NULL : l;
}

static tmpl_expr *parse_math2(parser *p)
{
    tmpl_expr *l = parse_pow(p);
    int links = 0;
    while (l && (at_op(p, OP_MUL) || at_op(p, OP_DIV) || at_op(p, OP_FLOORDIV) || at_op(p, OP_MOD)) && link(p, &links)) {
        int op = cur(p)->op, line = cur(p)->line;
        next(p);
        l = binop(p, E_BINOP, op, l, parse_pow(p), line);
    }
    p->depth -= links;
    return p->failed ? NULL : l;
}

static tmpl_expr *parse_concat(parser *p)
{
    int line = cur(p)->line;
    tmpl_expr *first = parse_math2(p);
    if (!first || !at_op(p, OP_TILDE)) return first;
    ptrvec parts = {0};
    if (!pv_push(p, &parts, first)) return NULL;
    while (at_op(p, OP_TILDE)) {
        next(p);
        tmpl_expr *x = parse_math2(p);
        if (!x || !pv_push(p, &parts, x)) return NULL;
    }
    tmpl_expr *e = new_expr(p, E_CONCAT, line);
    if (!e) return NULL;
    e->args = (tmpl_expr **)parts.v;
    e->nargs = parts.n;
    return e;
}

static tmpl_expr *parse_math1(parser *p)
{
    tmpl_expr *l = parse_concat(p);
    int links = 0;
    while (l && (at_op(p, OP_ADD) || at_op(p, OP_SUB)) && link(p, &links)) {
        int op = cur(p)->op, line = cur(p)->line;
        next(p);
        l = binop(p, E_BINOP, op, l, parse_concat(p), line);
    }
    p->depth -= links;
    return p->failed ? NULL : l;
}

static tmpl_expr *parse_compare(parser *p)
{
    int line = cur(p)->line;
    tmpl_expr *first = parse_math1(p);
    if (!first) return NULL;
    ptrvec operands = {0};
    uint8_t ops[64];
    for (;;) {
        int op = 0;
        const tmpl_token *t = cur(p);
        if (t->kind == TK_OP && (t->op == OP_EQ || t->op == OP_NE || t->op == OP_LT || t->op == OP_LE ||
                                 t->op == OP_GT || t->op == OP_GE)) {
            op = t->op;
            next(p);
        } else if (tok_is_name(t, "in")) {
            op = OP_IN;
            next(p);
        } else if (tok_is_name(t, "not") && tok_is_name(peek(p, 1), "in")) {
            op = OP_NOTIN;
            next(p);
            next(p);
        } else {
            break;
        }
        if (operands.n >= sizeof ops) {
            pfail(p, "too many chained comparisons");
            return NULL;
        }
        tmpl_expr *x = parse_math1(p);
        if (!x || !pv_push(p, &operands, x)) return NULL;
        ops[operands.n - 1] = (uint8_t)op;
    }
    if (!operands.n) return first;
    tmpl_expr *e = new_expr(p, E_COMPARE, line);
    if (!e) return NULL;
    e->a = first;
    e->args = (tmpl_expr **)operands.v;
    e->nargs = operands.n;
    e->cmpops = palloc(p, operands.n);
    if (!e->cmpops) return NULL;
    memcpy(e->cmpops, ops, operands.n);
    return e;
}

static tmpl_expr *parse_not(parser *p)
{
    if (at_name(p, "not")) {
        int line = cur(p)->line;
        next(p);
        if (!enter(p)) return NULL;
        tmpl_expr *inner = parse_not(p);
        leave(p);
        tmpl_expr *e = inner ? new_expr(p, E_NOT, line) : NULL;
        if (e) e->a = inner;
        return e;
    }
    return parse_compare(p);
}

static tmpl_expr *parse_and(parser *p)
{
    tmpl_expr *l = parse_not(p);
    int links = 0;
    while (l && at_name(p, "and") && link(p, &links)) {
        int line = cur(p)->line;
        next(p);
        l = binop(p, E_AND, 0, l, parse_not(p), line);
    }
    p->depth -= links;
    return p->failed ? NULL : l;
}

static tmpl_expr *parse_or(parser *p)
{
    tmpl_expr *l = parse_and(p);
    int links = 0;
    while (l && at_name(p, "or") && link(p, &links)) {
        int line = cur(p)->line;
        next(p);
        l = binop(p, E_OR, 0, l, parse_and(p), line);
    }
    p->depth -= links;
    return p->failed ? NULL : l;
}

static tmpl_expr *parse_condexpr(parser *p)
{
    tmpl_expr *e1 = parse_or(p);
    int links = 0;
    while (e1 && at_name(p, "if") && link(p, &links)) {
        int line = cur(p)->line;
        next(p);
        tmpl_expr *cond = parse_or(p);
        if (!cond) return NULL;
        tmpl_expr *e3 = NULL;
        if (at_name(p, "else")) {
            next(p);
            if (!enter(p)) return NULL;
            e3 = parse_condexpr(p);
            leave(p);
            if (!e3) return NULL;
        }
        tmpl_expr *c = new_expr(p, E_COND, line);
        if (!c) return NULL;
        c->a = cond;
        c->b = e1;
        c->c = e3;
        e1 = c;
    }
    p->depth -= links;
    return p->failed ? NULL : e1;
}

static tmpl_expr *parse_expression(parser *p, bool with_condexpr)
{
    if (!enter(p)) return NULL;
    tmpl_expr *e = with_condexpr ? parse_condexpr(p) : parse_or(p);
    leave(p);
    return e;
}

static bool is_tuple_end(parser *p, const char *extra_end)
{
    const tmpl_token *t = cur(p);
    if (t->kind == TK_VAR_END || t->kind == TK_BLOCK_END || tok_is_op(t, OP_RPAREN)) return true;
    return extra_end && tok_is_name(t, extra_end);
}

static tmpl_expr *parse_tuple(parser *p, bool with_condexpr, const char *extra_end, bool explicit_parens)
{
    int line = cur(p)->line;
    ptrvec items = {0};
    bool is_tuple = false;
    for (;;) {
        if (items.n && !expect_op(p, OP_COMMA, ",")) return NULL;
        if (is_tuple_end(p, extra_end)) break;
        tmpl_expr *e = parse_expression(p, with_condexpr);
        if (!e || !pv_push(p, &items, e)) return NULL;
        if (at_op(p, OP_COMMA)) is_tuple = true;
        else break;
    }
    if (!is_tuple) {
        if (items.n) return items.v[0];
        if (!explicit_parens) {
            char buf[64];
            pfail(p, "expected an expression, got '%s'", describe(cur(p), buf, sizeof buf));
            return NULL;
        }
    }
    tmpl_expr *t = new_expr(p, E_TUPLE, line);
    if (!t) return NULL;
    t->args = (tmpl_expr **)items.v;
    t->nargs = items.n;
    return t;
}

/* ---- assignment targets ----------------------------------------------- */

static bool reserved_target(const tmpl_token *t)
{
    return tok_is_name(t, "true") || tok_is_name(t, "false") || tok_is_name(t, "none") || tok_is_name(t, "True") ||
           tok_is_name(t, "False") || tok_is_name(t, "None");
}

static tmpl_target *parse_target_primary(parser *p);

/* name, or (a, b, ...), possibly a bare tuple "a, b" when with_tuple; a
 * trailing comma only inside parentheses (jinja refuses `for a, in x`) */
static tmpl_target *parse_target(parser *p, bool with_tuple, const char *extra_end, bool in_parens)
{
    int line = cur(p)->line;
    if (!with_tuple) return parse_target_primary(p);
    ptrvec items = {0};
    bool is_tuple = false;
    for (;;) {
        if (items.n && !expect_op(p, OP_COMMA, ",")) return NULL;
        if (in_parens && is_tuple_end(p, extra_end)) break;
        tmpl_target *t = parse_target_primary(p);
        if (!t || !pv_push(p, &items, t)) return NULL;
        if (at_op(p, OP_COMMA)) is_tuple = true;
        else break;
    }
    if (!is_tuple) {
        if (items.n) return items.v[0];
        pfail(p, "expected an assignment target");
        return NULL;
    }
    tmpl_target *t = palloc(p, sizeof *t);
    if (!t) return NULL;
    t->kind = T_TUPLE;
    t->line = line;
    t->items = (tmpl_target **)items.v;
    t->n = items.n;
    return t;
}

static tmpl_target *parse_target_primary(parser *p)
{
    const tmpl_token *t = cur(p);
    if (!enter(p)) return NULL;
    tmpl_target *r = NULL;
    if (t->kind == TK_NAME && !reserved_target(t)) {
        r = palloc(p, sizeof *r);
        if (r) {
            r->kind = T_NAME;
            r->line = t->line;
            r->id = intern(p, t->s, t->n);
            if (r->id < 0) r = NULL;
        }
        next(p);
    } else if (tok_is_op(t, OP_LPAREN)) {
        next(p);
        r = parse_target(p, true, NULL, true);
        if (r && !expect_op(p, OP_RPAREN, ")")) r = NULL;
    } else {
        char buf[64];
        pfail(p, "can't assign to '%s'", describe(t, buf, sizeof buf));
    }
    leave(p);
    return r;
}

/* ---- statements ------------------------------------------------------- */

static bool parse_body(parser *p, tmpl_body *body, const char *const *ends, int *which);

static tmpl_stmt *new_stmt(parser *p, int kind, int line)
{
    tmpl_stmt *s = palloc(p, sizeof *s);
    if (s) {
        s->kind = (uint8_t)kind;
        s->line = line;
    }
    return s;
}

static bool expect_block_end(parser *p)
{
    return expect_kind(p, TK_BLOCK_END, "end of statement block");
}

/* the body of a block statement: an optional ':' and the end of the tag,
 * then statements up to one of `ends` (consumed with its block end unless
 * keep_open) */
static bool parse_block_body(parser *p, tmpl_body *body, const char *const *ends, int *which)
{
    if (at_op(p, OP_COLON)) next(p);
    if (!expect_block_end(p)) return false;
    return parse_body(p, body, ends, which);
}

static bool parse_if(parser *p, tmpl_stmt *s)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    s->expr = parse_tuple(p, false, NULL, false);
    if (!s->expr) return false;
    int which;
    if (!parse_block_body(p, &s->body, ends, &which)) return false;
    if (which == 0) { /* elif: a nested if in the else branch */
        tmpl_stmt *e = new_stmt(p, S_IF, cur(p)->line);
        if (!e) return false;
        e->elif = true;
        s->else_body.v = palloc(p, sizeof *s->else_body.v);
        if (!s->else_body.v) return false;
        s->else_body.v[0] = e;
        s->else_body.n = 1;
        if (!enter(p)) return false;
        bool ok = parse_if(p, e);
        leave(p);
        return ok;
    }
    if (which == 1) {
        static const char *const ends2[] = {"endif", NULL};
        if (!parse_block_body(p, &s->else_body, ends2, &which)) return false;
    }
    return expect_block_end(p);
}

static bool parse_for(parser *p, tmpl_stmt *s)
{
    s->target = parse_target(p, true, "in", false);
    if (!s->target) return false;
    if (!at_name(p, "in")) return pfail(p, "expected 'in' in a for loop");
    next(p);
    s->expr = parse_tuple(p, false, "recursive", false);
    if (!s->expr) return false;
    if (at_name(p, "if")) {
        next(p);
        s->cond = parse_expression(p, true);
        if (!s->cond) return false;
    }
    if (at_name(p, "recursive")) return pfail(p, "recursive for loops are not supported");
    static const char *const ends[] = {"endfor", "else", NULL};
    int which;
    p->loop_depth++;
    bool ok = parse_block_body(p, &s->body, ends, &which);
    p->loop_depth--;
    if (!ok) return false;
    if (which == 1) {
        static const char *const ends2[] = {"endfor", NULL};
        if (!parse_block_body(p, &s->else_body, ends2, &which)) return false;
    }
    return expect_block_end(p);
}

static bool parse_set(parser *p, tmpl_stmt *s)
{
    if (cur(p)->kind == TK_NAME && tok_is_op(peek(p, 1), OP_DOT)) {
        /* set ns.attr = value */
        tmpl_target *t = palloc(p, sizeof *t);
        if (!t) return false;
        t->kind = T_NSATTR;
        t->line = cur(p)->line;
        t->id = intern(p, cur(p)->s, cur(p)->n);
        if (t->id < 0) return false;
        next(p);
        next(p);
        if (cur(p)->kind != TK_NAME) return pfail(p, "expected an attribute name after '.'");
        t->attr = cur(p)->s;
        t->attr_n = cur(p)->n;
        next(p);
        s->target = t;
    } else {
        s->target = parse_target(p, true, NULL, false);
        if (!s->target) return false;
    }
    if (at_op(p, OP_ASSIGN)) {
        next(p);
        s->expr = parse_tuple(p, true, NULL, false);
        return s->expr && expect_block_end(p);
    }
    /* {% set x | filters %}...{% endset %} */
    s->kind = S_SETBLOCK;
    if (s->target->kind == T_NSATTR) return pfail(p, "a block set cannot assign a namespace attribute");
    if (at_op(p, OP_PIPE)) {
        s->filter = parse_filter(p, NULL, false);
        if (!s->filter) return false;
    }
    static const char *const ends[] = {"endset", NULL};
    int which;
    return parse_block_body(p, &s->body, ends, &which) && expect_block_end(p);
}

/* (a, b=default, ...) */
static bool parse_signature(parser *p, tmpl_macro *m)
{
    if (!expect_op(p, OP_LPAREN, "(")) return false;
    ptrvec ids = {0}, names = {0}, lens = {0}, defs = {0};
    bool any_default = false;
    while (!at_op(p, OP_RPAREN)) {
        if (ids.n && !expect_op(p, OP_COMMA, ",")) return false;
        const tmpl_token *t = cur(p);
        if (t->kind != TK_NAME || reserved_target(t)) {
            char buf[64];
            return pfail(p, "expected a parameter name, got '%s'", describe(t, buf, sizeof buf));
        }
        int id = intern(p, t->s, t->n);
        if (id < 0) return false;
        next(p);
        tmpl_expr *def = NULL;
        if (at_op(p, OP_ASSIGN)) {
            next(p);
            def = parse_expression(p, true);
            if (!def) return false;
            any_default = true;
        } else if (any_default) {
            return pfail(p, "non-default argument follows default argument");
        }
        if (!pv_push(p, &ids, (void *)(intptr_t)id) || !pv_push(p, &names, (void *)t->s) ||
            !pv_push(p, &lens, (void *)(uintptr_t)t->n) || !pv_push(p, &defs, def))
            return false;
    }
    next(p);
    m->nparams = ids.n;
    if (ids.n) {
        m->param_ids = palloc(p, ids.n * sizeof *m->param_ids);
        m->param_name_n = palloc(p, ids.n * sizeof *m->param_name_n);
        if (!m->param_ids || !m->param_name_n) return false;
        for (uint32_t i = 0; i < ids.n; i++) {
            m->param_ids[i] = (int)(intptr_t)ids.v[i];
            m->param_name_n[i] = (size_t)(uintptr_t)lens.v[i];
        }
        m->param_names = (const char **)names.v;
        m->defaults = (tmpl_expr **)defs.v;
    }
    return true;
}

/* a macro's body: a frame of its own (no enclosing loop for break) */
static bool parse_macro_body(parser *p, tmpl_macro *m, const char *end)
{
    if (p->nmacros >= TMPL_MAX_NESTING) return pfail(p, "macros nested too deeply");
    p->macros[p->nmacros++] = m;
    int saved = p->loop_depth;
    p->loop_depth = 0;
    const char *const ends[] = {end, NULL};
    int which;
    bool ok = parse_block_body(p, &m->body, ends, &which) && expect_block_end(p);
    p->loop_depth = saved;
    p->nmacros--;
    return ok;
}

static bool parse_macro(parser *p, tmpl_stmt *s)
{
    tmpl_macro *m = palloc(p, sizeof *m);
    if (!m) return false;
    m->line = s->line;
    const tmpl_token *t = cur(p);
    if (t->kind != TK_NAME || reserved_target(t)) return pfail(p, "expected a macro name");
    m->name = t->s;
    m->name_n = t->n;
    m->id = intern(p, t->s, t->n);
    if (m->id < 0) return false;
    next(p);
    s->macro = m;
    return parse_signature(p, m) && parse_macro_body(p, m, "endmacro");
}

static bool parse_call_block(parser *p, tmpl_stmt *s)
{
    tmpl_macro *m = palloc(p, sizeof *m);
    if (!m) return false;
    m->line = s->line;
    m->name = "caller";
    m->name_n = 6;
    m->id = NAME_CALLER;
    if (at_op(p, OP_LPAREN) && !parse_signature(p, m)) return false;
    s->expr = parse_expression(p, true);
    if (!s->expr) return false;
    if (s->expr->kind != E_CALL) return pfail_at(p, s->line, "expected a call after 'call'");
    s->macro = m;
    return parse_macro_body(p, m, "endcall");
}

static bool parse_with(parser *p, tmpl_stmt *s)
{
    ptrvec targets = {0}, values = {0};
    while (cur(p)->kind != TK_BLOCK_END) {
        if (targets.n && !expect_op(p, OP_COMMA, ",")) return false;
        tmpl_target *t = parse_target(p, true, NULL, false);
        if (!t || !expect_op(p, OP_ASSIGN, "=")) return false;
        tmpl_expr *v = parse_expression(p, true);
        if (!v || !pv_push(p, &targets, t) || !pv_push(p, &values, v)) return false;
    }
    s->with_targets = (tmpl_target **)targets.v;
    s->with_values = (tmpl_expr **)values.v;
    s->nwith = targets.n;
    static const char *const ends[] = {"endwith", NULL};
    int which;
    return parse_block_body(p, &s->body, ends, &which) && expect_block_end(p);
}

/* statements jinja has that this subset does not */
static bool jinja_statement(const tmpl_token *t)
{
    static const char *const names[] = {"block", "extends", "include", "import", "from", "autoescape", "do",
                                        "trans", "pluralize", "debug", "endblock", NULL};
    for (int i = 0; names[i]; i++)
        if (tok_is_name(t, names[i])) return true;
    return false;
}

/* after {%: one statement */
static tmpl_stmt *parse_statement(parser *p)
{
    const tmpl_token *t = cur(p);
    int line = t->line;
    if (t->kind != TK_NAME) {
        pfail(p, "tag name expected");
        return NULL;
    }
    if (!enter(p)) return NULL;
    tmpl_stmt *s = NULL;
    bool ok = false;
    next(p);
    if (tok_is_name(t, "if")) {
        ok = (s = new_stmt(p, S_IF, line)) && parse_if(p, s);
    } else if (tok_is_name(t, "for")) {
        ok = (s = new_stmt(p, S_FOR, line)) && parse_for(p, s);
    } else if (tok_is_name(t, "set")) {
        ok = (s = new_stmt(p, S_SET, line)) && parse_set(p, s);
    } else if (tok_is_name(t, "macro")) {
        ok = (s = new_stmt(p, S_MACRO, line)) && parse_macro(p, s);
    } else if (tok_is_name(t, "call")) {
        ok = (s = new_stmt(p, S_CALLBLOCK, line)) && parse_call_block(p, s);
    } else if (tok_is_name(t, "filter")) {
        static const char *const ends[] = {"endfilter", NULL};
        int which;
        ok = (s = new_stmt(p, S_FILTERBLOCK, line)) && (s->filter = parse_filter(p, NULL, true)) &&
             parse_block_body(p, &s->body, ends, &which) && expect_block_end(p);
    } else if (tok_is_name(t, "break") || tok_is_name(t, "continue")) {
        bool brk = tok_is_name(t, "break");
        if (p->loop_depth == 0) pfail_at(p, line, "'%s' outside loop", brk ? "break" : "continue");
        else ok = (s = new_stmt(p, brk ? S_BREAK : S_CONTINUE, line)) && expect_block_end(p);
    } else if (tok_is_name(t, "generation")) {
        /* transformers' {% generation %} marks assistant text; its body is
         * a call block's caller: rendered in a frame of its own */
        static const char *const ends[] = {"endgeneration", NULL};
        int which;
        int saved = p->loop_depth;
        p->loop_depth = 0;
        ok = (s = new_stmt(p, S_SCOPE, line)) && parse_block_body(p, &s->body, ends, &which) && expect_block_end(p);
        p->loop_depth = saved;
    } else if (tok_is_name(t, "with")) {
        ok = (s = new_stmt(p, S_SCOPE, line)) && parse_with(p, s);
    } else if (tok_is_name(t, "print")) {
        /* {% print a, b %}: each expression is output, in the current frame */
        ok = (s = new_stmt(p, S_GROUP, line)) != NULL;
        ptrvec items = {0};
        while (ok && cur(p)->kind != TK_BLOCK_END) {
            if (items.n && !expect_op(p, OP_COMMA, ",")) { ok = false; break; }
            tmpl_stmt *o = new_stmt(p, S_PRINT, cur(p)->line);
            ok = o && (o->expr = parse_expression(p, true)) && pv_push(p, &items, o);
        }
        if (ok) {
            s->body.v = (tmpl_stmt **)items.v;
            s->body.n = items.n;
            ok = expect_block_end(p);
        }
    } else if (jinja_statement(t)) {
        pfail_at(p, line, "statement '%.*s' is not supported", (int)t->n, t->s);
    } else {
        pfail_at(p, line, "unknown statement '%.*s'", (int)(t->n > 60 ? 60 : t->n), t->s);
    }
    leave(p);
    return ok ? s : NULL;
}

/* Statements until {% end %} where end is one of `ends` (NULL-terminated;
 * ends == NULL: until the end of the template). *which: the index of the end
 * found; the parser is left after its name. */
static bool parse_body(parser *p, tmpl_body *body, const char *const *ends, int *which)
{
    ptrvec v = {0};
    for (;;) {
        const tmpl_token *t = cur(p);
        if (t->kind == TK_EOF) {
            if (ends) {
                char list[128] = "";
                for (int i = 0; ends[i]; i++)
                    snprintf(list + strlen(list), sizeof list - strlen(list), "%s'%s'", i ? " or " : "", ends[i]);
                return pfail(p, "unexpected end of template, expected %s", list);
            }
            break;
        }
        if (t->kind == TK_DATA) {
            tmpl_stmt *s = new_stmt(p, S_DATA, t->line);
            if (!s) return false;
            s->text = t->s;
            s->len = t->n;
            if (!pv_push(p, &v, s)) return false;
            next(p);
        } else if (t->kind == TK_VAR_BEGIN) {
            next(p);
            tmpl_stmt *s = new_stmt(p, S_PRINT, t->line);
            if (!s) return false;
            s->expr = parse_tuple(p, true, NULL, false);
            if (!s->expr || !expect_kind(p, TK_VAR_END, "end of print statement")) return false;
            if (!pv_push(p, &v, s)) return false;
        } else if (t->kind == TK_BLOCK_BEGIN) {
            next(p);
            if (ends)
                for (int i = 0; ends[i]; i++)
                    if (at_name(p, ends[i])) {
                        next(p);
                        *which = i;
                        body->v = (tmpl_stmt **)v.v;
                        body->n = v.n;
                        return true;
                    }
            const tmpl_token *n = cur(p);
            if (n->kind == TK_NAME && n->n > 3 && memcmp(n->s, "end", 3) == 0 && !jinja_statement(n) &&
                !tok_is_name(n, "endblock"))
                return pfail(p, "unexpected '%.*s'", (int)(n->n > 40 ? 40 : n->n), n->s);
            if (tok_is_name(n, "elif") || tok_is_name(n, "else"))
                return pfail(p, "unexpected '%.*s'", (int)n->n, n->s);
            tmpl_stmt *s = parse_statement(p);
            if (!s || !pv_push(p, &v, s)) return false;
        } else {
            char buf[64];
            return pfail(p, "unexpected '%s'", describe(t, buf, sizeof buf));
        }
    }
    body->v = (tmpl_stmt **)v.v;
    body->n = v.n;
    return true;
}

/* An unknown filter or test is an error when jinja compiles the template,
 * except inside an if statement (its test and bodies, not a loop or macro
 * opened there) or a conditional expression, where jinja makes it an error
 * only if it runs (so that `{% if 'x' is filter %}{{ v|x }}{% endif %}`
 * works). */
static bool check_unknown(parser *p, const tmpl_expr *e, bool soft)
{
    if (!e) return true;
    if ((e->kind == E_FILTER || e->kind == E_TEST) && e->fn == TMPL_UNKNOWN && !soft)
        return pfail_at(p, e->line, "%s '%.*s' does not exist", e->kind == E_FILTER ? "filter" : "test",
                        (int)(e->name_n > 60 ? 60 : e->name_n), e->name);
    if (e->kind == E_COND) soft = true;
    if (!check_unknown(p, e->a, soft) || !check_unknown(p, e->b, soft) || !check_unknown(p, e->c, soft) ||
        !check_unknown(p, e->d, soft))
        return false;
    for (uint32_t i = 0; i < e->nargs; i++)
        if (!check_unknown(p, e->args[i], soft)) return false;
    for (uint32_t i = 0; i < e->nkw; i++)
        if (!check_unknown(p, e->kwvals[i], soft)) return false;
    return true;
}

static bool check_body_unknown(parser *p, const tmpl_body *b, bool soft)
{
    for (uint32_t i = 0; i < b->n; i++) {
        const tmpl_stmt *s = b->v[i];
        bool ok = true;
        switch (s->kind) {
        case S_IF:
            ok = check_unknown(p, s->expr, true) && check_body_unknown(p, &s->body, true) &&
                 check_body_unknown(p, &s->else_body, true);
            break;
        case S_FOR:
            /* the iterable in this frame; body, else and filter in a new one */
            ok = check_unknown(p, s->expr, soft) && check_unknown(p, s->cond, false) &&
                 check_body_unknown(p, &s->body, false) && check_body_unknown(p, &s->else_body, false);
            break;
        case S_MACRO:
        case S_CALLBLOCK:
            for (uint32_t k = 0; ok && k < s->macro->nparams; k++)
                ok = !s->macro->defaults || check_unknown(p, s->macro->defaults[k], false);
            ok = ok && check_unknown(p, s->expr, soft) && check_body_unknown(p, &s->macro->body, false);
            break;
        case S_SCOPE:
            for (uint32_t k = 0; ok && k < s->nwith; k++) ok = check_unknown(p, s->with_values[k], soft);
            ok = ok && check_body_unknown(p, &s->body, false);
            break;
        case S_SETBLOCK:
        case S_FILTERBLOCK:
            ok = check_unknown(p, s->filter, false) && check_body_unknown(p, &s->body, false);
            break;
        case S_GROUP:
            ok = check_body_unknown(p, &s->body, soft);
            break;
        default:
            ok = check_unknown(p, s->expr, soft);
        }
        if (!ok) return false;
    }
    return true;
}

/* constant folding marks on every expression of the template */
static void mark_body_folds(const tmpl_body *b)
{
    for (uint32_t i = 0; i < b->n; i++) {
        tmpl_stmt *s = b->v[i];
        if (s->kind == S_PRINT) mark_output(s->expr);
        else mark_folds(s->expr);
        mark_folds(s->cond);
        mark_folds(s->filter);
        for (uint32_t k = 0; k < s->nwith; k++) mark_folds(s->with_values[k]);
        if (s->macro) {
            for (uint32_t k = 0; k < s->macro->nparams; k++)
                if (s->macro->defaults) mark_folds(s->macro->defaults[k]);
            mark_body_folds(&s->macro->body);
        }
        mark_body_folds(&s->body);
        mark_body_folds(&s->else_body);
    }
}

bool tmpl_parse_tokens(struct chat_template *t, const tmpl_tokens *toks, char *err, size_t errsz)
{
    parser p = {.t = t, .tok = toks->v, .n = toks->n, .err = err, .errsz = errsz};
    p.name_slots = arena_alloc(&t->arena, TMPL_NAME_SLOTS * sizeof *p.name_slots);
    if (!p.name_slots) {
        snprintf(err, errsz, "out of memory parsing the template");
        return false;
    }
    memset(p.name_slots, 0, TMPL_NAME_SLOTS * sizeof *p.name_slots);
    static const char *const fixed[NAME_FIXED_COUNT] = {
        "loop", "varargs", "kwargs", "caller", "range", "namespace", "dict", "raise_exception", "strftime_now",
        "cycler", "joiner", "lipsum"};
    for (int i = 0; i < NAME_FIXED_COUNT; i++)
        if (intern(&p, fixed[i], strlen(fixed[i])) != i) return false;
    if (!parse_body(&p, &t->body, NULL, NULL) || p.failed || !check_body_unknown(&p, &t->body, false)) return false;
    mark_body_folds(&t->body);
    return tmpl_analyze_frames(t, err, errsz);
}
