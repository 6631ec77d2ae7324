/*
 * tmpl_symbols.c - which names a frame holds as undefined from its start.
 *
 * jinja2 compiles each frame (the template, a loop body, a macro, a call
 * block's body, a block set, a filter block, a with) to Python code whose
 * local variables are decided before it runs (jinja2/idtracking.py). A
 * name the frame assigns, where the first thing the frame's own code does
 * with it (in document order, not counting nested frames) is the
 * assignment, starts out *undefined* in that frame when no enclosing frame
 * knows the name - even if the caller passed a variable of that name. Code
 * of nested frames that runs before the assignment sees that undefined:
 *
 *     {% for m in messages %}{{ system }}{% endfor %}{% set system = 'x' %}
 *
 * prints nothing for `system` even when the caller passed one. A name read
 * before it is assigned, or assigned in some branches of an if only, starts
 * from the caller's value (or the enclosing frame's) instead, which is what
 * the evaluator's scope chain gives anyway; so only the names that start
 * undefined are recorded (tmpl_body.undef_ids) and the evaluator declares
 * them when it enters the frame.
 *
 * The analysis mirrors jinja's Symbols: refs per frame with how each is
 * loaded (parameter, resolve, alias, undefined), if-branches analyzed on
 * copies and merged (a name stored in the body, the elifs and the else
 * alike counts as stored unconditionally), child frames analyzed after
 * their parent is complete, with the parent's refs visible.
 */
#include "tmpl_internal.h"

#include <stdio.h>
#include <string.h>

enum { L_PARAM, L_RESOLVE, L_ALIAS, L_UNDEFINED };

typedef struct symtab symtab;
struct symtab {
    const symtab *parent;
    int *ref_ids;
    uint8_t *ref_load;
    uint32_t nrefs, refcap;
    int *stores;
    uint32_t nstores, storecap;
};

typedef struct {
    tmpl_arena tmp;   /* symbol tables, freed when the analysis ends */
    tmpl_arena *keep; /* the template's arena: the results */
    bool oom;
} analyzer;

static bool push_int(analyzer *a, int **v, uint32_t *n, uint32_t *cap, int x)
{
    if (*n == *cap) {
        uint32_t nc = *cap ? *cap * 2 : 8;
        int *nv = tmpl_grow(&a->tmp, *v, *cap * sizeof **v, nc * sizeof **v);
        if (!nv) return !(a->oom = true);
        *v = nv;
        *cap = nc;
    }
    (*v)[(*n)++] = x;
    return true;
}

static long find_own(const symtab *s, int id)
{
    for (uint32_t i = 0; i < s->nrefs; i++)
        if (s->ref_ids[i] == id) return (long)i;
    return -1;
}

static bool find_ref(const symtab *s, int id)
{
    for (; s; s = s->parent)
        if (find_own(s, id) >= 0) return true;
    return false;
}

static bool stored(const symtab *s, int id)
{
    for (uint32_t i = 0; i < s->nstores; i++)
        if (s->stores[i] == id) return true;
    return false;
}

static bool define(analyzer *a, symtab *s, int id, uint8_t load)
{
    long k = find_own(s, id);
    if (k >= 0) {
        s->ref_load[k] = load;
        return true;
    }
    if (s->nrefs == s->refcap) {
        uint32_t nc = s->refcap ? s->refcap * 2 : 8;
        int *ids = tmpl_grow(&a->tmp, s->ref_ids, s->refcap * sizeof *ids, nc * sizeof *ids);
        uint8_t *ld = ids ? tmpl_grow(&a->tmp, s->ref_load, s->refcap, nc) : NULL;
        if (!ld) return !(a->oom = true);
        s->ref_ids = ids;
        s->ref_load = ld;
        s->refcap = nc;
    }
    s->ref_ids[s->nrefs] = id;
    s->ref_load[s->nrefs] = load;
    s->nrefs++;
    return true;
}

static bool sym_load(analyzer *a, symtab *s, int id)
{
    return find_ref(s, id) || define(a, s, id, L_RESOLVE);
}

static bool sym_store(analyzer *a, symtab *s, int id)
{
    if (!stored(s, id) && !push_int(a, &s->stores, &s->nstores, &s->storecap, id)) return false;
    if (find_own(s, id) >= 0) return true;
    return define(a, s, id, s->parent && find_ref(s->parent, id) ? L_ALIAS : L_UNDEFINED);
}

static bool sym_param(analyzer *a, symtab *s, int id)
{
    if (!stored(s, id) && !push_int(a, &s->stores, &s->nstores, &s->storecap, id)) return false;
    return define(a, s, id, L_PARAM);
}

static bool sym_copy(analyzer *a, const symtab *from, symtab *to)
{
    *to = (symtab){.parent = from->parent};
    for (uint32_t i = 0; i < from->nrefs; i++)
        if (!define(a, to, from->ref_ids[i], from->ref_load[i])) return false;
    for (uint32_t i = 0; i < from->nstores; i++)
        if (!push_int(a, &to->stores, &to->nstores, &to->storecap, from->stores[i])) return false;
    return true;
}

/* jinja's Symbols.branch_update over the three branches of an if */
static bool branch_update(analyzer *a, symtab *s, symtab *br, int nbr)
{
    /* names newly stored, with the number of branches storing them */
    int *ids = NULL, *counts = NULL;
    uint32_t n = 0, cap = 0, n2 = 0, cap2 = 0;
    for (int b = 0; b < nbr; b++)
        for (uint32_t i = 0; i < br[b].nstores; i++) {
            int id = br[b].stores[i];
            if (stored(s, id)) continue;
            uint32_t k;
            for (k = 0; k < n; k++)
                if (ids[k] == id) break;
            if (k == n) {
                if (!push_int(a, &ids, &n, &cap, id) || !push_int(a, &counts, &n2, &cap2, 0)) return false;
            }
            counts[k]++;
        }
    for (int b = 0; b < nbr; b++) {
        for (uint32_t i = 0; i < br[b].nrefs; i++)
            if (!define(a, s, br[b].ref_ids[i], br[b].ref_load[i])) return false;
        for (uint32_t i = 0; i < br[b].nstores; i++)
            if (!stored(s, br[b].stores[i]) && !push_int(a, &s->stores, &s->nstores, &s->storecap, br[b].stores[i]))
                return false;
    }
    for (uint32_t k = 0; k < n; k++) {
        if (counts[k] == nbr) continue;
        if (!define(a, s, ids[k], s->parent && find_ref(s->parent, ids[k]) ? L_ALIAS : L_RESOLVE)) return false;
    }
    return true;
}

/* ---- visiting a frame ------------------------------------------------- */

/* frames met while visiting one, analyzed once it is complete */
typedef struct {
    const tmpl_stmt **v;
    uint32_t n, cap;
} stmtvec;

static bool expr_loads(analyzer *a, symtab *s, const tmpl_expr *e)
{
    if (!e) return true;
    if (e->kind == E_NAME && !sym_load(a, s, e->id)) return false;
    if (!expr_loads(a, s, e->a) || !expr_loads(a, s, e->b) || !expr_loads(a, s, e->c) || !expr_loads(a, s, e->d))
        return false;
    for (uint32_t i = 0; i < e->nargs; i++)
        if (!expr_loads(a, s, e->args[i])) return false;
    for (uint32_t i = 0; i < e->nkw; i++)
        if (!expr_loads(a, s, e->kwvals[i])) return false;
    return true;
}

static bool target_stores(analyzer *a, symtab *s, const tmpl_target *t, bool param)
{
    switch (t->kind) {
    case T_NAME: return param ? sym_param(a, s, t->id) : sym_store(a, s, t->id);
    case T_NSATTR: return sym_load(a, s, t->id);
    default:
        for (uint32_t i = 0; i < t->n; i++)
            if (!target_stores(a, s, t->items[i], param)) return false;
        return true;
    }
}

static bool visit_body(analyzer *a, symtab *s, const tmpl_body *b, stmtvec *children);

static bool add_child(analyzer *a, stmtvec *c, const tmpl_stmt *st)
{
    if (c->n == c->cap) {
        uint32_t nc = c->cap ? c->cap * 2 : 8;
        const tmpl_stmt **v = tmpl_grow(&a->tmp, c->v, c->cap * sizeof *v, nc * sizeof *v);
        if (!v) return !(a->oom = true);
        c->v = v;
        c->cap = nc;
    }
    c->v[c->n++] = st;
    return true;
}

/* an if with its elifs (the chain of else-bodies holding one elif each) */
static bool visit_if(analyzer *a, symtab *s, const tmpl_stmt *st, stmtvec *children)
{
    if (!expr_loads(a, s, st->expr)) return false;
    symtab br[3];
    if (!sym_copy(a, s, &br[0]) || !visit_body(a, &br[0], &st->body, children)) return false;
    if (!sym_copy(a, s, &br[1])) return false;
    const tmpl_stmt *cur = st;
    while (cur->else_body.n == 1 && cur->else_body.v[0]->elif) {
        /* each elif is an if of its own without branches, visited in the elif copy */
        const tmpl_stmt *e = cur->else_body.v[0];
        if (!expr_loads(a, &br[1], e->expr)) return false;
        symtab inner[3];
        if (!sym_copy(a, &br[1], &inner[0]) || !visit_body(a, &inner[0], &e->body, children) ||
            !sym_copy(a, &br[1], &inner[1]) || !sym_copy(a, &br[1], &inner[2]) || !branch_update(a, &br[1], inner, 3))
            return false;
        cur = e;
    }
    if (!sym_copy(a, s, &br[2]) || !visit_body(a, &br[2], &cur->else_body, children)) return false;
    return branch_update(a, s, br, 3);
}

static bool visit_stmt(analyzer *a, symtab *s, const tmpl_stmt *st, stmtvec *children)
{
    switch (st->kind) {
    case S_DATA: case S_BREAK: case S_CONTINUE: return true;
    case S_PRINT: return expr_loads(a, s, st->expr);
    case S_IF: return visit_if(a, s, st, children);
    case S_FOR: return expr_loads(a, s, st->expr) && add_child(a, children, st);
    case S_SET: return expr_loads(a, s, st->expr) && target_stores(a, s, st->target, false);
    case S_SETBLOCK: return target_stores(a, s, st->target, false) && add_child(a, children, st);
    case S_MACRO: return sym_store(a, s, st->macro->id) && add_child(a, children, st);
    case S_CALLBLOCK:
        return expr_loads(a, s, st->expr) && add_child(a, children, st);
    case S_FILTERBLOCK: return expr_loads(a, s, st->filter) && add_child(a, children, st);
    case S_SCOPE:
        for (uint32_t i = 0; i < st->nwith; i++)
            if (!expr_loads(a, s, st->with_values[i])) return false;
        return add_child(a, children, st);
    case S_GROUP: return visit_body(a, s, &st->body, children);
    }
    return true;
}

static bool visit_body(analyzer *a, symtab *s, const tmpl_body *b, stmtvec *children)
{
    for (uint32_t i = 0; i < b->n; i++)
        if (!visit_stmt(a, s, b->v[i], children)) return false;
    return true;
}

static bool analyze_frame(analyzer *a, const symtab *parent, tmpl_body *body, const tmpl_stmt *owner, int which);

/* records the frame's undefined-from-the-start names, then its children */
static bool finish_frame(analyzer *a, symtab *s, tmpl_body *body, stmtvec *children)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->nrefs; i++) n += s->ref_load[i] == L_UNDEFINED;
    if (n) {
        body->undef_ids = tmpl_alloc(a->keep, n * sizeof *body->undef_ids);
        if (!body->undef_ids) return !(a->oom = true);
        for (uint32_t i = 0; i < s->nrefs; i++)
            if (s->ref_load[i] == L_UNDEFINED) body->undef_ids[body->nundef++] = s->ref_ids[i];
    }
    for (uint32_t i = 0; i < children->n; i++) {
        tmpl_stmt *c = (tmpl_stmt *)children->v[i];
        switch (c->kind) {
        case S_FOR:
            if (!analyze_frame(a, s, &c->body, c, 0) || !analyze_frame(a, s, &c->else_body, c, 1)) return false;
            break;
        case S_MACRO:
        case S_CALLBLOCK:
            if (!analyze_frame(a, s, &c->macro->body, c, 0)) return false;
            break;
        default:
            if (!analyze_frame(a, s, &c->body, c, 0)) return false;
        }
    }
    return true;
}

/* owner: the statement the frame belongs to (NULL: the template); which:
 * 1 for a loop's else */
static bool analyze_frame(analyzer *a, const symtab *parent, tmpl_body *body, const tmpl_stmt *owner, int which)
{
    symtab s = {.parent = parent};
    stmtvec children = {0};
    if (owner && owner->kind == S_FOR && which == 0) {
        if (!target_stores(a, &s, owner->target, true) || !sym_param(a, &s, NAME_LOOP)) return false;
    } else if (owner && (owner->kind == S_MACRO || owner->kind == S_CALLBLOCK)) {
        const tmpl_macro *m = owner->macro;
        for (uint32_t i = 0; i < m->nparams; i++)
            if (!sym_param(a, &s, m->param_ids[i])) return false;
        if ((m->uses_varargs && !sym_param(a, &s, NAME_VARARGS)) || (m->uses_kwargs && !sym_param(a, &s, NAME_KWARGS)) ||
            (m->uses_caller && !sym_param(a, &s, NAME_CALLER)))
            return false;
        for (uint32_t i = 0; i < m->nparams; i++)
            if (m->defaults && !expr_loads(a, &s, m->defaults[i])) return false;
    } else if (owner && owner->kind == S_SCOPE) {
        for (uint32_t i = 0; i < owner->nwith; i++)
            if (!target_stores(a, &s, owner->with_targets[i], true)) return false;
    }
    return visit_body(a, &s, body, &children) && finish_frame(a, &s, body, &children);
}

bool tmpl_analyze_frames(struct chat_template *t, char *err, size_t errsz)
{
    analyzer a = {.keep = &t->arena};
    a.tmp.limit = SIZE_MAX;
    bool ok = analyze_frame(&a, NULL, &t->body, NULL, 0);
    tmpl_arena_free(&a.tmp);
    if (!ok) snprintf(err, errsz, "out of memory analyzing the template");
    return ok;
}
