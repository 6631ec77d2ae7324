/*
 * tmpl_internal.h - the private parts of the chat-template interpreter
 * (chat_template.h is the public face).
 *
 * The interpreter is split by responsibility:
 *   tmpl_lex.c      source text -> tokens; whitespace control, trim_blocks,
 *                   lstrip_blocks, comments and raw blocks are all settled
 *                   here, so the parser only sees text and tag tokens
 *   tmpl_parse.c    tokens -> statement and expression trees, with the
 *                   static checks (unknown filters, tests, statements)
 *   tmpl_symbols.c  which names each frame holds undefined from its start
 *                   (jinja's compile-time scoping)
 *   tmpl_value.c    arenas and the value model: Python semantics for
 *                   truthiness, equality, ordering, hashing, str(), repr()
 *                   and json.dumps
 *   tmpl_eval.c     renders a tree: scopes, loops, macros, limits
 *   tmpl_builtins.c filters, tests, attribute/item lookup, slicing, methods
 *                   of dict/list/loop, globals
 *   tmpl_str.c      Python's str methods and string formatting
 *   chat_template.c the API
 *
 * Everything a render creates lives in one arena per render (freed at once
 * when it ends) with a byte budget: values are never freed one by one, so
 * no value can dangle, and a template that builds ever larger strings ends
 * with FERRY_ERR_TOO_LARGE instead of exhausting memory. The parsed tree
 * lives in its own arena and is never written after tmpl_parse returns,
 * which is what makes concurrent renders safe.
 *
 * Strings are UTF-8 with an explicit length (never NUL-terminated in
 * general): they point into the template source, into the caller's JSON
 * document, or into the render arena.
 */
#ifndef FERRY_TMPL_INTERNAL_H
#define FERRY_TMPL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/base/arena.h"
#include "../engine/base/json.h"
#include "../engine/base/status.h"

/* ---- limits ----------------------------------------------------------- */

#define TMPL_MAX_SOURCE (1u << 20)        /* template bytes                       */
#define TMPL_MAX_NESTING 256              /* parser: nested expressions/blocks     */
#define TMPL_MAX_NAMES 4096               /* distinct names in one template        */
#define TMPL_NAME_SLOTS 8192              /* the parser's name table (> 1.5x names) */
#define TMPL_MAX_DEPTH 1200               /* render: nested evaluations (C stack)  */
#define TMPL_MAX_MACRO_DEPTH 64           /* render: nested macro calls            */
#define TMPL_MAX_VALUE_DEPTH 256          /* repr/json/equality of nested values   */
#define TMPL_MAX_ITERATIONS 1000000       /* loop iterations in one render         */
#define TMPL_MAX_WORK (40ull * 1000 * 1000) /* evaluation steps + bytes/16 scanned */
#define TMPL_MAX_RANGE 100000             /* range() length, as jinja's sandbox    */


/* ---- tokens ----------------------------------------------------------- */

typedef enum {
    TK_EOF,
    TK_DATA,        /* template text, whitespace control already applied */
    TK_VAR_BEGIN,   /* {{ */
    TK_VAR_END,     /* }} */
    TK_BLOCK_BEGIN, /* {% */
    TK_BLOCK_END,   /* %} */
    TK_NAME,
    TK_STRING,      /* decoded */
    TK_INT,
    TK_FLOAT,
    TK_OP,
} tmpl_tok_kind;

typedef enum {
    OP_ADD = 1, OP_SUB, OP_DIV, OP_FLOORDIV, OP_MUL, OP_POW, OP_MOD, OP_TILDE,
    OP_LBRACKET, OP_RBRACKET, OP_LPAREN, OP_RPAREN, OP_LBRACE, OP_RBRACE,
    OP_EQ, OP_NE, OP_GT, OP_GE, OP_LT, OP_LE, OP_ASSIGN, OP_DOT, OP_COLON,
    OP_PIPE, OP_COMMA, OP_SEMICOLON,
    /* not lexed: used by the tree */
    OP_IN, OP_NOTIN,
} tmpl_op;

typedef struct {
    uint8_t kind; /* tmpl_tok_kind */
    uint8_t op;   /* tmpl_op for TK_OP */
    int line;
    const char *s; /* TK_DATA, TK_NAME, TK_STRING */
    size_t n;
    int64_t i;     /* TK_INT */
    double f;      /* TK_FLOAT */
} tmpl_token;

typedef struct {
    tmpl_token *v;
    size_t n, cap;
} tmpl_tokens;

/* Normalizes \r\n and \r to \n and drops one trailing newline, as jinja's
 * lexer does; the copy lives in the arena. */
char *tmpl_lex_prepare(mem_arena *a, const char *src, size_t len, size_t *out_len);
/* Tokenizes src (newline-normalized by tmpl_lex_prepare), ending with
 * TK_EOF. On error returns false with a message in err ("line 3:
 * unexpected char '$'"). */
bool tmpl_lex(mem_arena *a, const char *src, size_t len, tmpl_tokens *out, char *err, size_t errsz);

/* ---- values ----------------------------------------------------------- */

typedef enum {
    TV_UNDEF,  /* jinja's Undefined: prints "", iterates empty, fails on use */
    TV_NONE,
    TV_BOOL,
    TV_INT,
    TV_FLOAT,
    TV_STR,
    TV_LIST,   /* list, tuple, generator, dict view, range (see tlist.flavour) */
    TV_DICT,
    TV_NS,     /* namespace(): a dict with attribute syntax, mutable by set */
    TV_MACRO,  /* a macro closed over its defining scope, or a call block's caller */
    TV_FUNC,   /* a global function (range, namespace, ...) */
    TV_METHOD, /* a bound method of a str/dict/list/loop value */
    TV_LOOP,   /* the `loop` object of a for loop */
} tval_kind;

/* flavours of TV_LIST: what Python type the sequence stands for */
enum { LF_LIST, LF_TUPLE, LF_GEN, LF_KEYS, LF_VALUES, LF_ITEMS, LF_RANGE };

/* flags of TV_STR: STR_OWNED, it is its whole arena allocation (may grow in
 * place, see str_append in tmpl_eval.c); STR_MARKUP, a markupsafe.Markup
 * (from |safe and |escape: repr()s as Markup('...'), is not escaped again,
 * escapes what + joins to it) */
enum { STR_OWNED = 1, STR_MARKUP = 2 };

/* sub-kinds of TV_UNDEF, for messages: a missing name, attribute, item
 * (s.p NULL: an integer index held in s.n), an attribute the sandbox
 * hides, or another reason spelled out in s */
enum { UD_NAME, UD_ATTR, UD_ITEM, UD_UNSAFE, UD_OTHER };

typedef struct tlist tlist;
typedef struct tdict tdict;
typedef struct tclosure tclosure;
typedef struct tmethod tmethod;
typedef struct tloop tloop;

typedef struct tval {
    uint8_t kind;
    uint8_t sub; /* TV_UNDEF: UD_*; TV_STR: STR_* flags */
    /* TV_UNDEF from a lookup (UD_ATTR, UD_ITEM): the kind and list flavour
     * of the object that lacked it, for the message */
    uint8_t owner_kind, owner_flavour;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p; /* TV_STR; TV_UNDEF: the missing name (may be NULL) */
            size_t n;
        } s;
        tlist *list;
        tdict *dict; /* TV_DICT, TV_NS */
        tclosure *macro;
        int fn;      /* TV_FUNC: TF_* */
        tmethod *method;
        tloop *loop;
    };
} tval;

struct tlist {
    size_t n;
    tval *items;
    uint8_t flavour;   /* LF_* */
    bool consumed;     /* LF_GEN: iterated once already */
    int64_t r_start, r_stop, r_step; /* LF_RANGE: for repr */
};

/* Keys keep insertion order (Python dicts do); idx is an open-addressing
 * index into keys, built once the dict grows past a few entries. */
struct tdict {
    size_t n, cap;
    tval *keys, *vals;
    uint32_t *idx;
    size_t icap;
};

typedef struct tmpl_macro tmpl_macro;
typedef struct tscope tscope;

struct tclosure {
    const tmpl_macro *m;
    tscope *env;       /* the scope it was defined in (read at call time) */
    tval caller;       /* the caller passed by a call block, or undefined */
};

struct tmethod {
    tval self;
    int id; /* TM_* */
};

struct tloop {
    tlist *items;
    size_t i; /* index0 */
    int depth0;
    bool has_changed;
    tval changed_last;
};

/* the render state needed by the value helpers */
typedef struct trender trender;

static inline tval tv_undef(void) { tval v = {0}; v.kind = TV_UNDEF; v.sub = UD_OTHER; return v; }
static inline tval tv_none(void) { tval v = {0}; v.kind = TV_NONE; return v; }
static inline tval tv_bool(bool b) { tval v = {0}; v.kind = TV_BOOL; v.b = b; return v; }
static inline tval tv_int(int64_t i) { tval v = {0}; v.kind = TV_INT; v.i = i; return v; }
static inline tval tv_float(double f) { tval v = {0}; v.kind = TV_FLOAT; v.f = f; return v; }
static inline tval tv_str(const char *p, size_t n) { tval v = {0}; v.kind = TV_STR; v.s.p = p; v.s.n = n; return v; }

/* ---- tree ------------------------------------------------------------- */

typedef enum {
    E_CONST, E_NAME, E_LIST, E_TUPLE, E_DICT,
    E_ATTR,    /* a.name */
    E_ITEM,    /* a[b] */
    E_SLICE,   /* a[b:c:d], each optional */
    E_CALL,    /* a(args, kw=...) */
    E_FILTER,  /* a|name(args) (a NULL in filter blocks: the body) */
    E_TEST,    /* a is name(args) */
    E_NEG, E_POS, E_NOT, E_AND, E_OR,
    E_BINOP,   /* op: OP_ADD .. OP_MOD */
    E_CONCAT,  /* a ~ b ~ ... */
    E_COMPARE, /* a op1 b op2 c ... (Python's chained comparison) */
    E_COND,    /* b if a else c */
} tmpl_expr_kind;

typedef struct tmpl_expr tmpl_expr;

enum { FOLD_SLICE = 1, FOLD_OUTPUT = 2 };

struct tmpl_expr {
    uint8_t kind;
    uint8_t op;     /* E_BINOP: the operator */
    uint8_t fold;   /* FOLD_*: constant folding as jinja's optimizer does it (tmpl_parse.c) */
    uint16_t fn;    /* E_FILTER: TF filter id; E_TEST: test id */
    int line;
    int id;         /* E_NAME: interned name */
    const char *name; /* E_NAME, E_ATTR, E_FILTER, E_TEST */
    size_t name_n;
    tmpl_expr *a, *b, *c, *d;
    tmpl_expr **args; /* items, call/filter/test positional args, compare operands, concat parts, dict keys */
    uint32_t nargs;
    uint32_t nkw;
    tmpl_expr **kwvals;      /* keyword values; E_DICT: values (nkw == nargs) */
    const char **kwnames;
    size_t *kwname_n;
    uint8_t *cmpops;         /* E_COMPARE: one per args entry */
    tval cval;               /* E_CONST */
};

typedef enum { T_NAME, T_TUPLE, T_NSATTR } tmpl_target_kind;

typedef struct tmpl_target tmpl_target;
struct tmpl_target {
    uint8_t kind;
    int line;
    int id;              /* T_NAME, T_NSATTR (the namespace variable) */
    const char *attr;    /* T_NSATTR */
    size_t attr_n;
    tmpl_target **items; /* T_TUPLE */
    uint32_t n;
};

typedef struct tmpl_stmt tmpl_stmt;

typedef struct {
    tmpl_stmt **v;
    uint32_t n;
    /* a frame's body (template, loop, macro, ...): names the frame holds
     * undefined from its start (tmpl_symbols.c) */
    int *undef_ids;
    uint32_t nundef;
} tmpl_body;

typedef enum {
    S_DATA, S_PRINT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_MACRO, S_CALLBLOCK,
    S_FILTERBLOCK, S_BREAK, S_CONTINUE,
    S_SCOPE, /* generation, with: a body in a frame of its own */
    S_GROUP, /* print: statements in the current frame */
} tmpl_stmt_kind;

struct tmpl_macro {
    const char *name;
    size_t name_n;
    int id;
    uint32_t nparams;
    int *param_ids;
    const char **param_names;
    size_t *param_name_n;
    tmpl_expr **defaults; /* nparams entries, NULL where none */
    tmpl_body body;
    bool uses_varargs, uses_kwargs, uses_caller;
    int line;
};

struct tmpl_stmt {
    uint8_t kind;
    bool elif;        /* S_IF: an elif, the only statement of its parent's else */
    int line;
    const char *text; /* S_DATA */
    size_t len;
    tmpl_expr *expr;  /* S_PRINT, S_IF test, S_FOR iterable, S_SET value, S_CALLBLOCK call */
    tmpl_expr *cond;  /* S_FOR: the `if` filter */
    tmpl_target *target;
    tmpl_expr *filter; /* S_SETBLOCK, S_FILTERBLOCK: filter chain over the body */
    tmpl_body body, else_body;
    tmpl_macro *macro; /* S_MACRO; S_CALLBLOCK: the caller */
    /* S_SCOPE (with): targets and values set in the new scope */
    tmpl_target **with_targets;
    tmpl_expr **with_values;
    uint32_t nwith;
};

/* interned names; the first ones are fixed (NAME_*) */
enum {
    NAME_LOOP, NAME_VARARGS, NAME_KWARGS, NAME_CALLER,
    NAME_RANGE, NAME_NAMESPACE, NAME_DICT, NAME_RAISE_EXCEPTION, NAME_STRFTIME_NOW,
    NAME_CYCLER, NAME_JOINER, NAME_LIPSUM,
    NAME_FIXED_COUNT
};

typedef struct {
    const char **s;
    size_t *n;
    uint32_t count, cap;
} tmpl_names;

struct chat_template {
    mem_arena arena;  /* everything below lives here */
    char *label;
    const char *src;   /* normalized source */
    size_t src_len;
    tmpl_body body;
    tmpl_names names;
};

bool tmpl_parse_tokens(struct chat_template *t, const tmpl_tokens *toks, char *err, size_t errsz);
/* Fills undef_ids of every frame body (tmpl_symbols.c). */
bool tmpl_analyze_frames(struct chat_template *t, char *err, size_t errsz);

/* ---- builtins (tmpl_builtins.c) ---------------------------------------- */

/* global functions */
enum { TF_RANGE, TF_NAMESPACE, TF_DICT, TF_RAISE_EXCEPTION, TF_STRFTIME_NOW, TF_CYCLER, TF_JOINER, TF_LIPSUM };

/* methods of values (TM_*), resolved by name */
enum {
    TM_NONE = -1,
    /* str */
    TM_STRIP, TM_LSTRIP, TM_RSTRIP, TM_SPLIT, TM_RSPLIT, TM_SPLITLINES, TM_STARTSWITH, TM_ENDSWITH,
    TM_UPPER, TM_LOWER, TM_TITLE, TM_CAPITALIZE, TM_SWAPCASE, TM_REPLACE, TM_FIND, TM_RFIND,
    TM_INDEX, TM_RINDEX, TM_COUNT, TM_JOIN, TM_FORMAT, TM_ISDIGIT, TM_ISALPHA, TM_ISALNUM,
    TM_ISSPACE, TM_ISLOWER, TM_ISUPPER, TM_ISNUMERIC, TM_ISDECIMAL, TM_CENTER, TM_LJUST, TM_RJUST,
    TM_ZFILL, TM_PARTITION, TM_RPARTITION, TM_REMOVEPREFIX, TM_REMOVESUFFIX, TM_ISTITLE,
    TM_EXPANDTABS, TM_CASEFOLD,
    /* dict */
    TM_ITEMS, TM_KEYS, TM_VALUES, TM_GET, TM_DICT_COPY,
    /* list (index and count share the str ids) */
    TM_LIST_COPY,
    /* loop */
    TM_LOOP_CYCLE, TM_LOOP_CHANGED,
    /* methods that mutate (refused by the immutable sandbox transformers uses) */
    TM_UNSAFE,
    TM_COUNT_
};

/* the fn of an E_FILTER / E_TEST that names nothing jinja has: an error
 * when it runs */
#define TMPL_UNKNOWN 0xFFFF

/* Filter and test ids by name; -1 when unknown. `known` (may be NULL) says
 * whether jinja itself has a filter/test of that name (for messages). */
int tmpl_filter_id(const char *name, size_t n, bool *known);
int tmpl_test_id(const char *name, size_t n, bool *known);
/* True when `name` is a method of a Python str/list/dict that this
 * interpreter does not implement (a parse error when called). */
bool tmpl_method_unsupported(const char *name, size_t n);

/* ---- render (tmpl_eval.c / tmpl_value.c / tmpl_builtins.c) ------------- */

typedef struct tmpl_sink {
    strbuf sb;
    size_t max;
} tmpl_sink;

struct trender {
    const struct chat_template *t;
    mem_arena arena;
    ferry_status st;       /* first error */
    bool raised;           /* it came from raise_exception: the template's own words */
    int line;              /* line of the construct being evaluated (messages) */
    int depth, macro_depth;
    uint64_t iterations, work;
    size_t max_out;
    tval *globals;         /* per interned name: the caller's variable or a builtin */
    tscope *top;
    tmpl_sink *out;        /* where output goes (captures push their own) */
    bool folding;          /* computing as jinja's compiler would (see FOLD_SLICE in tmpl_parse.c) */
};

/* Records an error (the first one wins) and returns false. */
bool tmpl_fail(trender *r, ferry_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* An error naming the undefined value v ("'x' is undefined"). */
bool tmpl_fail_undef(trender *r, const tval *v);
/* Adds work units; false (with an error) past the budget, or once renders
 * are cancelled (tmpl_cancel_renders). */
bool tmpl_charge(trender *r, uint64_t units);
/* The units for reading n bytes of strings. */
#define TMPL_BYTES_PER_STEP 16
static inline bool tmpl_charge_bytes(trender *r, size_t n) { return tmpl_charge(r, n / TMPL_BYTES_PER_STEP); }
/* Allocation from the render arena; NULL with an error recorded. */
void *tmpl_ralloc(trender *r, size_t n);
void *tmpl_rgrow(trender *r, void *p, size_t old_n, size_t new_n);

/* values */
const char *tmpl_type_name(const tval *v); /* Python's name: 'str', 'dict', ... */
bool tmpl_truthy(const tval *v);
/* Python ==; false with an error only past the depth limit */
bool tmpl_equal(trender *r, const tval *a, const tval *b, bool *eq);
/* Python <, <=, >, >= (op: OP_LT..): TypeError for unordered types */
bool tmpl_order(trender *r, int op, const tval *a, const tval *b, bool *res);
/* -1/0/1 ordering for sort; TypeError for unordered types */
bool tmpl_cmp3(trender *r, const tval *a, const tval *b, int *res);
/* Python hash for dict keys: TypeError for unhashable values */
bool tmpl_hash(trender *r, const tval *v, uint64_t *h);
bool tmpl_hashable(const tval *v);
/* Python's `x in seq` and `a + b` */
bool tmpl_contains(trender *r, const tval *x, const tval *seq, bool *res);
bool tmpl_add_values(trender *r, const tval *a, const tval *b, tval *out);

tlist *tmpl_list_new(trender *r, size_t n, uint8_t flavour);
bool tmpl_list_push(trender *r, tlist *l, size_t *cap, tval v);
tdict *tmpl_dict_new(trender *r, size_t cap);
/* Sets key to val (replacing the value, keeping the position of an existing key). */
bool tmpl_dict_set(trender *r, tdict *d, tval key, tval val);
/* Lookup; *found false when absent. */
bool tmpl_dict_get(trender *r, const tdict *d, const tval *key, tval *out, bool *found);
/* string-keyed lookup without hashing errors */
bool tmpl_dict_get_str(trender *r, const tdict *d, const char *k, size_t kn, tval *out, bool *found);

/* Python str(v) and repr(v) appended to sb; false on error (unprintable
 * object, depth). */
bool tmpl_str(trender *r, const tval *v, strbuf *sb);
bool tmpl_repr(trender *r, const tval *v, strbuf *sb);
/* str(v) as a value (strings are returned as they are). */
bool tmpl_to_str(trender *r, const tval *v, tval *out);
/* A string value copied into the arena. */
bool tmpl_str_new(trender *r, const char *p, size_t n, tval *out);
bool tmpl_sb_to_str(trender *r, strbuf *sb, tval *out);
/* Python's float repr ("1.0", "1e-05"). buf >= 32 bytes. */
void tmpl_float_repr(double f, char *buf, size_t n);

typedef struct {
    bool ensure_ascii, sort_keys;
    bool indent_set;     /* indent given (not None) */
    const char *indent;  /* the indent unit */
    size_t indent_n;
    const char *item_sep, *key_sep;
    size_t item_sep_n, key_sep_n;
} tmpl_json_opts;
/* json.dumps(v, ...) as transformers' tojson filter does it. */
bool tmpl_json(trender *r, const tval *v, const tmpl_json_opts *o, strbuf *sb);

/* Converts the caller's JSON into values (strings are not copied). */
bool tmpl_from_json(trender *r, const json_value *j, tval *out, int depth);

/* Values as sequences: the items an iteration would see. A string yields
 * its characters, a dict its keys, undefined nothing; a generator is used
 * up. TypeError for what Python cannot iterate. */
bool tmpl_iterate(trender *r, const tval *v, tlist **out);
/* len(v): TypeError where Python has none */
bool tmpl_length(trender *r, const tval *v, int64_t *out);

/* UTF-8 helpers */
size_t tmpl_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp); /* bytes used, >= 1 */
size_t tmpl_utf8_count(const char *s, size_t n);
bool tmpl_py_isspace(uint32_t cp);

/* builtins */
bool tmpl_call_filter(trender *r, const tmpl_expr *e, const tval *in, tval *out);
bool tmpl_call_filter_id(trender *r, int id, const tval *in, const tval *args, size_t nargs,
                         const char **kwn, const size_t *kwnn, const tval *kwv, size_t nkw, tval *out);
bool tmpl_call_test_id(trender *r, int id, const tval *in, const tval *args, size_t nargs, bool *out);
bool tmpl_call_func(trender *r, int fn, const tval *args, size_t nargs,
                    const char **kwn, const size_t *kwnn, const tval *kwv, size_t nkw, tval *out);
bool tmpl_call_method(trender *r, const tmethod *m, const tval *args, size_t nargs,
                      const char **kwn, const size_t *kwnn, const tval *kwv, size_t nkw, tval *out);
/* v.name as jinja's sandbox resolves it (getattr first, then item). */
bool tmpl_getattr(trender *r, const tval *v, const char *name, size_t n, tval *out);
/* v[key] (getitem first, then attribute). */
bool tmpl_getitem(trender *r, const tval *v, const tval *key, tval *out);
/* a + b where one is a Markup */
bool tmpl_markup_add(trender *r, const tval *a, const tval *b, tval *out);
/* fmt % args (printf-style, the `%` operator and the format filter) */
bool tmpl_percent_format(trender *r, const tval *fmt, const tval *args, tval *out);
/* v[start:stop:step] (NULL = omitted) */
bool tmpl_slice(trender *r, const tval *v, const tval *start, const tval *stop, const tval *step, tval *out);

/* helpers shared by the builtins (tmpl_builtins.c, tmpl_str.c) */
static inline bool tv_is_int(const tval *v) { return v->kind == TV_INT || v->kind == TV_BOOL; }
static inline int64_t tv_int_of(const tval *v) { return v->kind == TV_BOOL ? (int64_t)v->b : v->i; }
static inline bool tv_is_num(const tval *v) { return tv_is_int(v) || v->kind == TV_FLOAT; }
static inline double tv_num_of(const tval *v) { return v->kind == TV_FLOAT ? v->f : (double)tv_int_of(v); }
static inline tval tv_list(tlist *l) { tval v = {0}; v.kind = TV_LIST; v.list = l; return v; }

/* fmt is a printf format with one %s for the type name of v */
bool tmpl_type_error(trender *r, const char *fmt, const tval *v);
/* The arguments of a call to a builtin (a filter, a method): positional,
 * then keyword. */
typedef struct {
    const tval *args;
    size_t nargs;
    const char **kwn;
    const size_t *kwnn;
    const tval *kwv;
    size_t nkw;
} tmpl_args;
/* self.name(args): a method of a value (tmpl_call_method dispatches on the
 * receiver's kind and the TM_* id) */
typedef bool tmpl_method_fn(trender *r, const tval *self, const tmpl_args *a, tval *out);
/* Binds positional and keyword arguments to named parameters, as Python
 * does (out/given hold nparams entries). */
bool tmpl_bind(trender *r, const char *what, const char *const *names, size_t nparams, const tmpl_args *a,
               tval *out, bool *given);
/* BIND("f()", "x", "y") in a builtin whose arguments are `a` binds them to
 * p[] with g[] saying which were given. */
#define BIND(what, ...)                                                                            \
    static const char *const names_[] = {__VA_ARGS__};                                            \
    enum { NP_ = sizeof names_ / sizeof names_[0] };                                               \
    tval p[NP_];                                                                                  \
    bool g[NP_];                                                                                  \
    if (!tmpl_bind(r, what, names_, NP_, a, p, g)) return false
bool tmpl_no_args(trender *r, const char *what, const tmpl_args *a);
bool tmpl_arg_int(trender *r, const tval *v, int64_t *out);
bool tmpl_arg_str(trender *r, const tval *v, const char *what);
/* the strbuf (freed) as a string value */
bool tmpl_sb_out(trender *r, strbuf *sb, tval *out);
/* byte offsets of the code points of s (count + 1 entries) */
bool tmpl_cp_offsets(trender *r, const char *s, size_t n, size_t **offs, size_t *count);
size_t tmpl_cp_to_byte(const char *s, size_t n, size_t i);
/* CPython's PySlice_AdjustIndices: the slice length */
int64_t tmpl_slice_adjust(int64_t len, int64_t *start, int64_t *stop, int64_t step);
bool tmpl_slice_bound(trender *r, const tval *v, int64_t dflt, int64_t *out);
tval tmpl_undef_named(int sub, const char *name, size_t n);
/* undefined for obj.name / obj[key] that is missing */
tval tmpl_undef_lookup(const tval *obj, int sub, const tval *key);

/* strings (tmpl_str.c) */
enum { TMPL_CASE_UPPER, TMPL_CASE_LOWER, TMPL_CASE_TITLE, TMPL_CASE_SWAP };
bool tmpl_str_case(trender *r, const char *s, size_t n, int mode, tval *out);
/* str.title(), or str.capitalize() */
bool tmpl_str_title(trender *r, const char *s, size_t n, bool capitalize, tval *out);
/* jinja's title filter */
bool tmpl_jinja_title(trender *r, const tval *s, tval *out);
/* str.strip/lstrip/rstrip; chars NULL or None: whitespace */
bool tmpl_str_strip(trender *r, const tval *s, const tval *chars, bool left, bool right, tval *out);
bool tmpl_str_replace(trender *r, const tval *s, const tval *old, const tval *new_, int64_t count, tval *out);
bool tmpl_str_indent(trender *r, const tval *s, const tval *width, bool first, bool blank, tval *out);
bool tmpl_str_case_is(const tval *s, bool upper);
int64_t tmpl_str_wordcount(const char *p, size_t n);
/* markupsafe's escape (force: escape a Markup too) */
bool tmpl_html_escape(trender *r, const tval *v, tval *out, bool force);
/* Python's int(str, base) and float(str); false when Python raises
 * ValueError (*overflow: the value does not fit int64) */
bool tmpl_parse_int(const tval *s, int base, int64_t *out, bool *overflow);
bool tmpl_parse_float(const tval *s, double *out);
/* s.name(args) for the str method TM_* id */
bool tmpl_str_method(trender *r, const tval *s, int id, const tmpl_args *a, tval *out);

/* eval hooks the builtins need (map/select call filters and tests by name,
 * macros are called through the evaluator) */
bool tmpl_call_value(trender *r, const tval *callee, const tval *args, size_t nargs,
                     const char **kwn, const size_t *kwnn, const tval *kwv, size_t nkw, tval *out);

/* render entry (tmpl_eval.c) */
ferry_status tmpl_render_body(const struct chat_template *t, const json_value *vars, size_t max_out, strbuf *out);

#endif
