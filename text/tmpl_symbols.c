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

/* A frame's symbols. Names are interned ids below TMPL_MAX_NAMES, so
 * membership is a table per frame; the lists keep the order. Tables are
 * malloc'd and freed as soon as a frame (or an if-branch copy) is done, so
 * that a template with thousands of ifs stays linear in time and memory. */
typedef struct symtab symtab;
struct symtab {
    const symtab *parent;
    uint8_t *load;   /* per name: 0 when the frame has no ref, else 1 + L_* */
    uint8_t *stored; /* per name: the frame stores it */
    int *refs, *stores;
    uint32_t nrefs, refcap, nstores, storecap;
    /* a branch copy: the ids whose load it set, and how many stores it
     * started with, so that merging it back costs what the branch did */
    int *dirty;
    uint32_t ndirty, dirtycap, base_stores;
};

typedef struct {
    mem_arena *keep; /* the template's arena: the results */
    uint32_t nnames;
    bool oom;
} analyzer;

static bool sym_init(analyzer *a, symtab *s, const symtab *parent)
{
    *s = (symtab){.parent = parent};
    s->load = calloc(a->nnames ? a->nnames : 1, 1);
    s->stored = calloc(a->nnames ? a->nnames : 1, 1);
    if (!s->load || !s->stored) return !(a->oom = true);
    return true;
}

static void sym_free(symtab *s)
{
    free(s->load);
    free(s->stored);
    free(s->refs);
    free(s->stores);
    free(s->dirty);
    memset(s, 0, sizeof *s);
}

static bool push_int(analyzer *a, int **v, uint32_t *n, uint32_t *cap, int x)
{
    if (*n == *cap) {
        uint32_t nc = *cap ? *cap * 2 : 8;
        int *nv = realloc(*v, nc * sizeof *nv);
        if (!nv) return !(a->oom = true);
        *v = nv;
        *cap = nc;
    }
    (*v)[(*n)++] = x;
    return true;
}

static bool find_ref(const symtab *s, int id)
{
    for (; s; s = s->parent)
        if (s->load[id]) return true;
    return false;
}

static bool define(analyzer *a, symtab *s, int id, uint8_t load)
{
    if (s->load[id] == 1 + load) return true;
    if (!s->load[id] && !push_int(a, &s->refs, &s->nrefs, &s->refcap, id)) return false;
    s->load[id] = (uint8_t)(1 + load);
    return push_int(a, &s->dirty, &s->ndirty, &s->dirtycap, id);
}

static bool add_store(analyzer *a, symtab *s, int id)
{
    if (s->stored[id]) return true;
    s->stored[id] = 1;
    return push_int(a, &s->stores, &s->nstores, &s->storecap, id);
}

static bool sym_load(analyzer *a, symtab *s, int id)
{
    return find_ref(s, id) || define(a, s, id, L_RESOLVE);
}

static bool sym_store(analyzer *a, symtab *s, int id)
{
    if (!add_store(a, s, id)) return false;
    if (s->load[id]) return true;
    return define(a, s, id, s->parent && find_ref(s->parent, id) ? L_ALIAS : L_UNDEFINED);
}

static bool sym_param(analyzer *a, symtab *s, int id)
{
    return add_store(a, s, id) && define(a, s, id, L_PARAM);
}

static bool copy_list(analyzer *a, int **v, uint32_t *n, uint32_t *cap, const int *from, uint32_t nfrom)
{
    if (!nfrom) return true;
    *v = malloc(nfrom * sizeof **v);
    if (!*v) return !(a->oom = true);
    memcpy(*v, from, nfrom * sizeof **v);
    *n = *cap = nfrom;
    return true;
}

static bool sym_copy(analyzer *a, const symtab *from, symtab *to)
{
    if (!sym_init(a, to, from->parent)) return false;
    memcpy(to->load, from->load, a->nnames);
    memcpy(to->stored, from->stored, a->nnames);
    to->base_stores = from->nstores;
    return copy_list(a, &to->refs, &to->nrefs, &to->refcap, from->refs, from->nrefs) &&
           copy_list(a, &to->stores, &to->nstores, &to->storecap, from->stores, from->nstores);
}

/* jinja's Symbols.branch_update over the three branches of an if (frees them) */
static bool branch_update(analyzer *a, symtab *s, symtab *br, int nbr)
{
    bool ok = true;
    /* names newly stored, with the number of branches storing them */
    uint8_t *count = calloc(a->nnames ? a->nnames : 1, 1);
    int *ids = NULL;
    uint32_t n = 0, cap = 0;
    if (!count) ok = !(a->oom = true);
    /* (a branch holds the frame's stores as its first base_stores) */
    for (int b = 0; ok && b < nbr; b++)
        for (uint32_t i = br[b].base_stores; ok && i < br[b].nstores; i++) {
            int id = br[b].stores[i];
            if (s->stored[id]) continue;
            if (!count[id]) ok = push_int(a, &ids, &n, &cap, id);
            count[id]++;
        }
    /* refs and loads as the branches left them, in branch order */
    for (int b = 0; ok && b < nbr; b++) {
        for (uint32_t i = 0; ok && i < br[b].ndirty; i++) {
            int id = br[b].dirty[i];
            ok = define(a, s, id, (uint8_t)(br[b].load[id] - 1));
        }
        for (uint32_t i = br[b].base_stores; ok && i < br[b].nstores; i++) ok = add_store(a, s, br[b].stores[i]);
    }
    for (uint32_t k = 0; ok && k < n; k++) {
        if (count[ids[k]] == nbr) continue;
        ok = define(a, s, ids[k], s->parent && find_ref(s->parent, ids[k]) ? L_ALIAS : L_RESOLVE);
    }
    free(count);
    free(ids);
    for (int b = 0; b < nbr; b++) sym_free(&br[b]);
    return ok;
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
        const tmpl_stmt **v = realloc(c->v, nc * sizeof *v);
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
    symtab br[3] = {{0}, {0}, {0}};
    bool ok = sym_copy(a, s, &br[0]) && visit_body(a, &br[0], &st->body, children) && sym_copy(a, s, &br[1]);
    const tmpl_stmt *cur = st;
    while (ok && cur->else_body.n == 1 && cur->else_body.v[0]->elif) {
        /* each elif is an if of its own without branches, visited in the elif copy */
        const tmpl_stmt *e = cur->else_body.v[0];
        symtab inner[3] = {{0}, {0}, {0}};
        ok = expr_loads(a, &br[1], e->expr) && sym_copy(a, &br[1], &inner[0]) &&
             visit_body(a, &inner[0], &e->body, children) && sym_copy(a, &br[1], &inner[1]) &&
             sym_copy(a, &br[1], &inner[2]);
        ok = branch_update(a, &br[1], inner, 3) && ok;
        cur = e;
    }
    ok = ok && sym_copy(a, s, &br[2]) && visit_body(a, &br[2], &cur->else_body, children);
    return branch_update(a, s, br, 3) && ok;
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
    for (uint32_t i = 0; i < s->nrefs; i++) n += s->load[s->refs[i]] == 1 + L_UNDEFINED;
    if (n) {
        body->undef_ids = arena_alloc(a->keep, n * sizeof *body->undef_ids);
        if (!body->undef_ids) return !(a->oom = true);
        for (uint32_t i = 0; i < s->nrefs; i++)
            if (s->load[s->refs[i]] == 1 + L_UNDEFINED) body->undef_ids[body->nundef++] = s->refs[i];
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
static bool frame_prelude(analyzer *a, symtab *s, const tmpl_stmt *owner, int which)
{
    if (owner && owner->kind == S_FOR && which == 0) {
        if (!target_stores(a, s, owner->target, true) || !sym_param(a, s, NAME_LOOP)) return false;
    } else if (owner && (owner->kind == S_MACRO || owner->kind == S_CALLBLOCK)) {
        const tmpl_macro *m = owner->macro;
        for (uint32_t i = 0; i < m->nparams; i++)
            if (!sym_param(a, s, m->param_ids[i])) return false;
        if ((m->uses_varargs && !sym_param(a, s, NAME_VARARGS)) || (m->uses_kwargs && !sym_param(a, s, NAME_KWARGS)) ||
            (m->uses_caller && !sym_param(a, s, NAME_CALLER)))
            return false;
        for (uint32_t i = 0; i < m->nparams; i++)
            if (m->defaults && !expr_loads(a, s, m->defaults[i])) return false;
    } else if (owner && owner->kind == S_SCOPE) {
        for (uint32_t i = 0; i < owner->nwith; i++)
            if (!target_stores(a, s, owner->with_targets[i], true)) return false;
    }
    return true;
}

static bool analyze_frame(analyzer *a, const symtab *parent, tmpl_body *body, const tmpl_stmt *owner, int which)
{
    symtab s;
    stmtvec children = {0};
    bool ok = sym_init(a, &s, parent) && frame_prelude(a, &s, owner, which) && visit_body(a, &s, body, &children) &&
              finish_frame(a, &s, body, &children);
    free(children.v);
    sym_free(&s);
    return ok;
}

bool tmpl_analyze_frames(struct chat_template *t, char *err, size_t errsz)
{
    analyzer a = {.keep = &t->arena, .nnames = t->names.count};
    bool ok = analyze_frame(&a, NULL, &t->body, NULL, 0);
    if (!ok) snprintf(err, errsz, "out of memory analyzing the template");
    return ok;
}
