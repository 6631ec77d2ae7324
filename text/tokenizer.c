/*
 * tokenizer.c - loading: tokenizer.json into the pipeline of tok_internal.h
 * (normalizers, pre-tokenizers, the BPE model, post-processor, decoders,
 * added tokens), tokenizer_config.json's BOS/EOS/chat template, and the
 * accessors of tokenizer.h.
 *
 * tokenizer.json is untrusted input: every field is checked for its type
 * and an error names the file and the field
 * ("tokenizer.json: pre_tokenizer.pretokenizers[1] type 'Digits' is not
 * supported"). Anything the encoder does not implement is
 * FERRY_ERR_UNSUPPORTED rather than approximated. Both files are read
 * through model_dir.h, inside the model directory.
 *
 * Added tokens get their ids as HF tokenizers 0.23 gives them
 * (added_vocabulary.rs add_tokens), not from the "id" field: a token whose
 * content is in the vocabulary takes that id, the others take consecutive
 * ids from the vocabulary's size on. Real files agree with this; one that
 * does not is read as HF reads it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/base/util.h"
#include "../engine/weights/model_dir.h"
#include "tok_internal.h"

#define TOK_GPT2_PATTERN "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

typedef struct {
    tokenizer *t;
    const char *file;
} loader;

static ferry_status nomem(const loader *L) { return ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", L->file); }

/* A growable array of pipeline parts, kept with realloc (parts own regexes). */
static void *grow(void *v, size_t *n, size_t elem)
{
    void *nv = realloc(v, (*n + 1) * elem);
    if (!nv) return NULL;
    memset((char *)nv + *n * elem, 0, elem);
    (*n)++;
    return nv;
}

static const char *type_of(const loader *L, const json_value *v, const char *where, ferry_status *st)
{
    if (v->type != JSON_OBJECT) {
        *st = ferry_fail(FERRY_ERR_INVALID, "%s: %s must be an object or null", L->file, where);
        return NULL;
    }
    const json_value *ty = json_get(v, "type");
    if (!ty || ty->type != JSON_STRING) {
        *st = ferry_fail(FERRY_ERR_INVALID, "%s: %s has no \"type\" string", L->file, where);
        return NULL;
    }
    return ty->str;
}

static ferry_status get_bool(const loader *L, const json_value *obj, const char *key, const char *where, bool def,
                             bool *out)
{
    bool bad = false;
    *out = def;
    json_get_bool(obj, key, out, &bad);
    if (bad) return ferry_fail(FERRY_ERR_INVALID, "%s: %s.%s must be true or false", L->file, where, key);
    return FERRY_OK;
}

/* A required string field. */
static ferry_status get_str(const loader *L, const json_value *obj, const char *key, const char *where,
                            const json_value **out)
{
    const json_value *v = json_get(obj, key);
    *out = NULL;
    if (!v || v->type != JSON_STRING)
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s.%s must be a string", L->file, where, key);
    *out = v;
    return FERRY_OK;
}

/* A one-character string (Rust's char). */
static ferry_status get_char(const loader *L, const json_value *obj, const char *key, const char *where,
                             uint32_t *cp)
{
    const json_value *v;
    FERRY_TRY(get_str(L, obj, key, where, &v));
    if (v->len == 0 || tok_utf8_next(v->str, v->len, cp) != v->len)
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s.%s must be a single character", L->file, where, key);
    return FERRY_OK;
}

static ferry_status get_count(const loader *L, const json_value *obj, const char *key, const char *where,
                              size_t *out)
{
    const json_value *v = json_get(obj, key);
    if (!v || v->type != JSON_NUMBER || !v->is_int || v->integer < 0)
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s.%s must be a non-negative integer", L->file, where, key);
    *out = v->integer > (int64_t)1 << 40 ? (size_t)1 << 40 : (size_t)v->integer;
    return FERRY_OK;
}

/* {"String": s} or {"Regex": r}: a compiled pattern; *lit = the string of a
 * String pattern. */
static ferry_status get_pattern(const loader *L, const json_value *obj, const char *where, tok_regex **re,
                                const json_value **lit)
{
    const json_value *p = json_get(obj, "pattern");
    char w[320];
    snprintf(w, sizeof w, "%s: %s.pattern", L->file, where);
    if (!p || p->type != JSON_OBJECT || p->len != 1 || p->members[0].value.type != JSON_STRING)
        return ferry_fail(FERRY_ERR_INVALID, "%s must be {\"String\": ...} or {\"Regex\": ...}", w);
    const json_member *m = &p->members[0];
    bool literal = strcmp(m->key, "String") == 0;
    if (!literal && strcmp(m->key, "Regex") != 0)
        return ferry_fail(FERRY_ERR_INVALID, "%s must be {\"String\": ...} or {\"Regex\": ...}", w);
    if (lit) *lit = literal ? &m->value : NULL;
    return tok_regex_compile(m->value.str, m->value.len, literal, w, re);
}

static ferry_status get_prepend_scheme(const loader *L, const json_value *v, const char *where,
                                       tok_prepend_scheme *out)
{
    *out = TOK_PREPEND_ALWAYS;
    const json_value *ps = json_get(v, "prepend_scheme");
    if (ps && ps->type != JSON_NULL) {
        if (ps->type != JSON_STRING)
            return ferry_fail(FERRY_ERR_INVALID, "%s: %s.prepend_scheme must be a string", L->file, where);
        if (!strcmp(ps->str, "first")) *out = TOK_PREPEND_FIRST;
        else if (!strcmp(ps->str, "never")) *out = TOK_PREPEND_NEVER;
        else if (!strcmp(ps->str, "always")) *out = TOK_PREPEND_ALWAYS;
        else
            return ferry_fail(FERRY_ERR_INVALID, "%s: %s.prepend_scheme '%s' is not first, never or always",
                              L->file, where, ps->str);
    }
    /* the field older files carry instead; false must agree with "never" */
    bool bad = false, aps = true;
    if (json_get_bool(v, "add_prefix_space", &aps, &bad) && !aps) {
        if (*out != TOK_PREPEND_NEVER)
            return ferry_fail(FERRY_ERR_INVALID, "%s: %s.add_prefix_space false does not match prepend_scheme",
                              L->file, where);
    }
    if (bad) return ferry_fail(FERRY_ERR_INVALID, "%s: %s.add_prefix_space must be true or false", L->file, where);
    return FERRY_OK;
}

/* ---- normalizer --------------------------------------------------------------- */

static ferry_status load_normalizer(loader *L, const json_value *v, const char *where, int depth)
{
    tokenizer *t = L->t;
    ferry_status st = FERRY_OK;
    if (v->type == JSON_NULL) return FERRY_OK;
    const char *type = type_of(L, v, where, &st);
    if (!type) return st;
    if (!strcmp(type, "Sequence")) {
        const json_value *list = json_get(v, "normalizers");
        if (!list || list->type != JSON_ARRAY)
            return ferry_fail(FERRY_ERR_INVALID, "%s: %s.normalizers must be an array", L->file, where);
        if (depth > 16) return ferry_fail(FERRY_ERR_INVALID, "%s: %s: Sequences nested too deep", L->file, where);
        for (size_t i = 0; i < list->len; i++) {
            char w[256];
            snprintf(w, sizeof w, "%s.normalizers[%zu]", where, i);
            FERRY_TRY(load_normalizer(L, &list->items[i], w, depth + 1));
        }
        return FERRY_OK;
    }
    tok_normalizer nz = {0};
    if (!strcmp(type, "NFC")) nz.kind = TOK_NORM_NFC;
    else if (!strcmp(type, "NFD")) nz.kind = TOK_NORM_NFD;
    else if (!strcmp(type, "NFKC")) nz.kind = TOK_NORM_NFKC;
    else if (!strcmp(type, "NFKD")) nz.kind = TOK_NORM_NFKD;
    else if (!strcmp(type, "Lowercase")) nz.kind = TOK_NORM_LOWERCASE;
    else if (!strcmp(type, "Prepend")) {
        const json_value *p;
        FERRY_TRY(get_str(L, v, "prepend", where, &p));
        nz.kind = TOK_NORM_PREPEND;
        nz.str = p->str;
        nz.str_len = p->len;
    } else if (!strcmp(type, "Replace")) {
        const json_value *c;
        FERRY_TRY(get_str(L, v, "content", where, &c));
        const json_value *lit;
        nz.kind = TOK_NORM_REPLACE;
        nz.str = c->str;
        nz.str_len = c->len;
        FERRY_TRY(get_pattern(L, v, where, &nz.re, &lit));
        nz.may_match_empty = tok_regex_may_match_empty(nz.re);
        nz.lit_cp = -1;
        uint32_t cp;
        if (lit && lit->len && tok_utf8_valid(lit->str, lit->len) && tok_utf8_next(lit->str, lit->len, &cp) == lit->len)
            nz.lit_cp = (int32_t)cp; /* one character: tok_encode_size follows it exactly */
    } else if (!strcmp(type, "Strip")) {
        nz.kind = TOK_NORM_STRIP;
        FERRY_TRY(get_bool(L, v, "strip_left", where, false, &nz.left));
        FERRY_TRY(get_bool(L, v, "strip_right", where, false, &nz.right));
    } else {
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: %s type '%s' is not supported", L->file, where, type);
    }
    /* the strings live in the JSON document: copy them into the tokenizer */
    if (nz.str && !(nz.str = arena_strdup(&t->arena, nz.str, nz.str_len))) {
        tok_regex_free(nz.re);
        return nomem(L);
    }
    tok_normalizer *a = grow(t->norm, &t->n_norm, sizeof *a);
    if (!a) {
        tok_regex_free(nz.re);
        return nomem(L);
    }
    t->norm = a;
    t->norm[t->n_norm - 1] = nz;
    return FERRY_OK;
}

/* ---- pre-tokenizer ----------------------------------------------------------------- */

static ferry_status add_pretok(loader *L, tok_pretok *pt)
{
    tok_pretok *a = grow(L->t->pretok, &L->t->n_pretok, sizeof *a);
    if (!a) {
        tok_regex_free(pt->re);
        return nomem(L);
    }
    L->t->pretok = a;
    a[L->t->n_pretok - 1] = *pt;
    return FERRY_OK;
}

static ferry_status load_pretok(loader *L, const json_value *v, const char *where, int depth)
{
    ferry_status st = FERRY_OK;
    if (v->type == JSON_NULL) return FERRY_OK;
    const char *type = type_of(L, v, where, &st);
    if (!type) return st;
    tok_pretok pt = {0};
    if (!strcmp(type, "Sequence")) {
        const json_value *list = json_get(v, "pretokenizers");
        if (!list || list->type != JSON_ARRAY)
            return ferry_fail(FERRY_ERR_INVALID, "%s: %s.pretokenizers must be an array", L->file, where);
        if (depth > 16) return ferry_fail(FERRY_ERR_INVALID, "%s: %s: Sequences nested too deep", L->file, where);
        for (size_t i = 0; i < list->len; i++) {
            char w[256];
            snprintf(w, sizeof w, "%s.pretokenizers[%zu]", where, i);
            FERRY_TRY(load_pretok(L, &list->items[i], w, depth + 1));
        }
        return FERRY_OK;
    }
    if (!strcmp(type, "Split")) {
        pt.kind = TOK_PRE_SPLIT;
        const json_value *b;
        FERRY_TRY(get_str(L, v, "behavior", where, &b));
        if (!strcmp(b->str, "Removed")) pt.behavior = TOK_SPLIT_REMOVED;
        else if (!strcmp(b->str, "Isolated")) pt.behavior = TOK_SPLIT_ISOLATED;
        else if (!strcmp(b->str, "MergedWithPrevious")) pt.behavior = TOK_SPLIT_MERGED_PREV;
        else if (!strcmp(b->str, "MergedWithNext")) pt.behavior = TOK_SPLIT_MERGED_NEXT;
        else if (!strcmp(b->str, "Contiguous")) pt.behavior = TOK_SPLIT_CONTIGUOUS;
        else
            return ferry_fail(FERRY_ERR_INVALID, "%s: %s.behavior '%s' is not a split behavior", L->file, where,
                              b->str);
        FERRY_TRY(get_bool(L, v, "invert", where, false, &pt.invert));
        FERRY_TRY(get_pattern(L, v, where, &pt.re, NULL));
    } else if (!strcmp(type, "ByteLevel")) {
        pt.kind = TOK_PRE_BYTE_LEVEL;
        bool use_regex;
        FERRY_TRY(get_bool(L, v, "add_prefix_space", where, true, &pt.add_prefix_space));
        FERRY_TRY(get_bool(L, v, "use_regex", where, true, &use_regex));
        if (use_regex) {
            char w[320];
            snprintf(w, sizeof w, "%s: %s (GPT-2 pattern)", L->file, where);
            FERRY_TRY(tok_regex_compile(TOK_GPT2_PATTERN, strlen(TOK_GPT2_PATTERN), false, w, &pt.re));
        }
    } else if (!strcmp(type, "Metaspace")) {
        pt.kind = TOK_PRE_METASPACE;
        FERRY_TRY(get_char(L, v, "replacement", where, &pt.replacement));
        pt.rep_len = util_utf8_put(pt.rep, pt.replacement);
        FERRY_TRY(get_prepend_scheme(L, v, where, &pt.prepend));
        FERRY_TRY(get_bool(L, v, "split", where, true, &pt.split));
    } else {
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: %s type '%s' is not supported", L->file, where, type);
    }
    return add_pretok(L, &pt);
}

/* ---- decoder -------------------------------------------------------------------------- */

static ferry_status load_decoder(loader *L, const json_value *v, const char *where, int depth)
{
    tokenizer *t = L->t;
    ferry_status st = FERRY_OK;
    if (v->type == JSON_NULL) return FERRY_OK;
    const char *type = type_of(L, v, where, &st);
    if (!type) return st;
    t->has_decoder = true;
    tok_decoder d = {0};
    if (!strcmp(type, "Sequence")) {
        const json_value *list = json_get(v, "decoders");
        if (!list || list->type != JSON_ARRAY)
            return ferry_fail(FERRY_ERR_INVALID, "%s: %s.decoders must be an array", L->file, where);
        if (depth > 16) return ferry_fail(FERRY_ERR_INVALID, "%s: %s: Sequences nested too deep", L->file, where);
        for (size_t i = 0; i < list->len; i++) {
            char w[256];
            snprintf(w, sizeof w, "%s.decoders[%zu]", where, i);
            FERRY_TRY(load_decoder(L, &list->items[i], w, depth + 1));
        }
        return FERRY_OK;
    }
    if (!strcmp(type, "ByteLevel")) {
        d.kind = TOK_DEC_BYTE_LEVEL;
    } else if (!strcmp(type, "Fuse")) {
        d.kind = TOK_DEC_FUSE;
    } else if (!strcmp(type, "ByteFallback")) {
        d.kind = TOK_DEC_BYTE_FALLBACK;
    } else if (!strcmp(type, "Metaspace")) {
        d.kind = TOK_DEC_METASPACE;
        tok_prepend_scheme ps;
        FERRY_TRY(get_char(L, v, "replacement", where, &d.ch));
        FERRY_TRY(get_prepend_scheme(L, v, where, &ps));
        d.meta_prepend = ps != TOK_PREPEND_NEVER;
    } else if (!strcmp(type, "Strip")) {
        d.kind = TOK_DEC_STRIP;
        FERRY_TRY(get_char(L, v, "content", where, &d.ch));
        FERRY_TRY(get_count(L, v, "start", where, &d.start));
        FERRY_TRY(get_count(L, v, "stop", where, &d.stop));
    } else if (!strcmp(type, "Replace")) {
        d.kind = TOK_DEC_REPLACE;
        const json_value *c, *lit;
        FERRY_TRY(get_str(L, v, "content", where, &c));
        FERRY_TRY(get_pattern(L, v, where, &d.re, &lit));
        if (!(d.content = arena_strdup(&t->arena, c->str, c->len))) {
            tok_regex_free(d.re);
            return nomem(L);
        }
        d.content_len = c->len;
        if (lit && lit->len) { /* a plain string is matched without PCRE2 */
            tok_regex_free(d.re);
            d.re = NULL;
            if (!(d.lit = arena_strdup(&t->arena, lit->str, lit->len))) return nomem(L);
            d.lit_len = lit->len;
        }
    } else {
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: %s type '%s' is not supported", L->file, where, type);
    }
    tok_decoder *a = grow(t->dec, &t->n_dec, sizeof *a);
    if (!a) {
        tok_regex_free(d.re);
        return nomem(L);
    }
    t->dec = a;
    a[t->n_dec - 1] = d;
    return FERRY_OK;
}

/* ---- post-processor --------------------------------------------------------------------- */

static ferry_status add_template(loader *L, const int32_t *items, size_t n)
{
    tokenizer *t = L->t;
    int32_t *copy = arena_alloc(&t->arena, (n ? n : 1) * sizeof *copy);
    tok_template *a = copy ? grow(t->post, &t->n_post, sizeof *a) : NULL;
    if (!a) return nomem(L);
    memcpy(copy, items, n * sizeof *copy);
    t->post = a;
    a[t->n_post - 1] = (tok_template){copy, n};
    return FERRY_OK;
}

static ferry_status token_id_field(const loader *L, const json_value *v, const char *where, const char *key,
                                   int32_t *id)
{
    /* ["</s>", 2] */
    const json_value *p = json_get(v, key);
    if (!p || p->type != JSON_ARRAY || p->len != 2 || p->items[0].type != JSON_STRING ||
        p->items[1].type != JSON_NUMBER || !p->items[1].is_int || p->items[1].integer < 0 ||
        p->items[1].integer >= TOK_MAX_ID)
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s.%s must be [token, id]", L->file, where, key);
    *id = (int32_t)p->items[1].integer;
    return FERRY_OK;
}

static ferry_status load_template(loader *L, const json_value *v, const char *where)
{
    const json_value *single = json_get(v, "single"), *specials = json_get(v, "special_tokens");
    if (!single || single->type != JSON_ARRAY)
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s.single must be an array of pieces", L->file, where);
    if (specials && specials->type != JSON_OBJECT && specials->type != JSON_NULL)
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s.special_tokens must be an object", L->file, where);
    size_t cap = 16, n = 0;
    int32_t *items = malloc(cap * sizeof *items);
    if (!items) return nomem(L);
    ferry_status st = FERRY_OK;
    for (size_t i = 0; i < single->len && st == FERRY_OK; i++) {
        const json_value *pc = &single->items[i];
        if (pc->type != JSON_OBJECT || pc->len != 1 || pc->members[0].value.type != JSON_OBJECT) {
            st = ferry_fail(FERRY_ERR_INVALID, "%s: %s.single[%zu] must be {\"Sequence\": ...} or {\"SpecialToken\": ...}",
                            L->file, where, i);
            break;
        }
        const json_value *id = json_get(&pc->members[0].value, "id");
        if (!id || id->type != JSON_STRING) {
            st = ferry_fail(FERRY_ERR_INVALID, "%s: %s.single[%zu].id must be a string", L->file, where, i);
            break;
        }
        int32_t one = -1;
        const json_value *ids = NULL;
        if (!strcmp(pc->members[0].key, "Sequence")) {
            if (strcmp(id->str, "A") != 0) {
                st = ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: %s.single[%zu]: only sequence A can be in the single template",
                                L->file, where, i);
                break;
            }
        } else if (!strcmp(pc->members[0].key, "SpecialToken")) {
            const json_value *sp = json_get(specials, id->str);
            ids = sp ? json_get(sp, "ids") : NULL;
            if (!ids || ids->type != JSON_ARRAY) {
                st = ferry_fail(FERRY_ERR_INVALID, "%s: %s.special_tokens has no ids for '%s'", L->file, where, id->str);
                break;
            }
        } else {
            st = ferry_fail(FERRY_ERR_INVALID, "%s: %s.single[%zu] must be {\"Sequence\": ...} or {\"SpecialToken\": ...}",
                            L->file, where, i);
            break;
        }
        size_t add = ids ? ids->len : 1;
        if (n + add > cap) {
            while (n + add > cap) cap *= 2;
            int32_t *g = realloc(items, cap * sizeof *g);
            if (!g) {
                st = nomem(L);
                break;
            }
            items = g;
        }
        if (!ids) {
            items[n++] = one;
            continue;
        }
        for (size_t k = 0; k < ids->len; k++) {
            const json_value *x = &ids->items[k];
            if (x->type != JSON_NUMBER || !x->is_int || x->integer < 0 || x->integer >= TOK_MAX_ID) {
                st = ferry_fail(FERRY_ERR_INVALID, "%s: %s.special_tokens['%s'].ids[%zu] must be a token id", L->file,
                                where, id->str, k);
                break;
            }
            items[n++] = (int32_t)x->integer;
        }
    }
    if (st == FERRY_OK) st = add_template(L, items, n);
    free(items);
    return st;
}

static ferry_status load_post(loader *L, const json_value *v, const char *where, int depth)
{
    ferry_status st = FERRY_OK;
    if (v->type == JSON_NULL) return FERRY_OK;
    const char *type = type_of(L, v, where, &st);
    if (!type) return st;
    if (!strcmp(type, "Sequence")) {
        const json_value *list = json_get(v, "processors");
        if (!list || list->type != JSON_ARRAY)
            return ferry_fail(FERRY_ERR_INVALID, "%s: %s.processors must be an array", L->file, where);
        if (depth > 16) return ferry_fail(FERRY_ERR_INVALID, "%s: %s: Sequences nested too deep", L->file, where);
        for (size_t i = 0; i < list->len; i++) {
            char w[256];
            snprintf(w, sizeof w, "%s.processors[%zu]", where, i);
            FERRY_TRY(load_post(L, &list->items[i], w, depth + 1));
        }
        return FERRY_OK;
    }
    if (!strcmp(type, "ByteLevel")) return FERRY_OK; /* offsets only */
    if (!strcmp(type, "TemplateProcessing")) return load_template(L, v, where);
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        int32_t items[3];
        FERRY_TRY(token_id_field(L, v, where, "cls", &items[0]));
        FERRY_TRY(token_id_field(L, v, where, "sep", &items[2]));
        items[1] = -1;
        return add_template(L, items, 3);
    }
    return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: %s type '%s' is not supported", L->file, where, type);
}

/* ---- added tokens ------------------------------------------------------------------------ */

typedef struct {
    const char *content;
    uint32_t len;
    bool special, lstrip, rstrip, normalized, single_word;
} added_spec;

static bool same_token(const tok_added *a, const added_spec *s)
{
    return a->len == s->len && !memcmp(a->content, s->content, s->len) && a->special == s->special &&
           a->lstrip == s->lstrip && a->rstrip == s->rstrip && a->normalized == s->normalized &&
           a->single_word == s->single_word;
}

static ferry_status trie_init(tok_trie *tr)
{
    if (!tok_pairmap_init(&tr->edges, 64)) return ferry_fail(FERRY_ERR_NOMEM, "tokenizer: out of memory");
    tr->value = malloc(sizeof *tr->value);
    if (!tr->value) return ferry_fail(FERRY_ERR_NOMEM, "tokenizer: out of memory");
    tr->value[0] = -1;
    tr->n_nodes = 1;
    return FERRY_OK;
}

static ferry_status trie_insert(tok_trie *tr, const char *s, size_t n, int32_t val)
{
    if (n == 0) return FERRY_OK; /* an empty pattern never matches */
    int32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        const tok_pairmap_slot *e = tok_pairmap_get(&tr->edges, (uint32_t)node, (unsigned char)s[i]);
        if (e) {
            node = e->id;
            continue;
        }
        int32_t *v = realloc(tr->value, (tr->n_nodes + 1) * sizeof *v);
        if (!v) return ferry_fail(FERRY_ERR_NOMEM, "tokenizer: out of memory");
        tr->value = v;
        v[tr->n_nodes] = -1;
        if (!tok_pairmap_put(&tr->edges, (uint32_t)node, (unsigned char)s[i], 0, (int32_t)tr->n_nodes))
            return ferry_fail(FERRY_ERR_NOMEM, "tokenizer: out of memory");
        node = (int32_t)tr->n_nodes++;
    }
    tr->first[(unsigned char)s[0]] = true;
    tr->value[node] = val; /* two tokens with one pattern: the later wins */
    return FERRY_OK;
}

static void trie_free(tok_trie *tr)
{
    tok_pairmap_free(&tr->edges);
    free(tr->value);
    memset(tr, 0, sizeof *tr);
}

static ferry_status parse_added(const loader *L, const json_value *e, size_t i, added_spec *s)
{
    char w[64];
    snprintf(w, sizeof w, "added_tokens[%zu]", i);
    if (e->type != JSON_OBJECT) return ferry_fail(FERRY_ERR_INVALID, "%s: %s must be an object", L->file, w);
    const json_value *c;
    FERRY_TRY(get_str(L, e, "content", w, &c));
    s->content = c->str;
    s->len = (uint32_t)c->len;
    FERRY_TRY(get_bool(L, e, "special", w, false, &s->special));
    FERRY_TRY(get_bool(L, e, "lstrip", w, false, &s->lstrip));
    FERRY_TRY(get_bool(L, e, "rstrip", w, false, &s->rstrip));
    FERRY_TRY(get_bool(L, e, "single_word", w, false, &s->single_word));
    FERRY_TRY(get_bool(L, e, "normalized", w, !s->special, &s->normalized));
    const json_value *id = json_get(e, "id");
    if (id && !(id->type == JSON_NUMBER && id->is_int && id->integer >= 0))
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s.id must be a non-negative integer", L->file, w);
    return FERRY_OK;
}

/* HF's add_tokens over the whole list (see the file comment). */
static ferry_status load_added(loader *L, const json_value *list)
{
    tokenizer *t = L->t;
    ferry_status st = FERRY_OK;
    tok_match_ctx *mc = NULL;
    tok_pairmap by_id = {0}; /* id -> index in t->added */
    strbuf norm;
    sb_init(&norm);
    if (!tok_strmap_init(&t->added_by_content, 16) || !tok_strmap_init(&t->special_set, 16) ||
        !tok_pairmap_init(&by_id, 16))
        goto oom;
    size_t n = list && list->type == JSON_ARRAY ? list->len : 0;
    if (list && list->type != JSON_ARRAY && list->type != JSON_NULL) {
        st = ferry_fail(FERRY_ERR_INVALID, "%s: added_tokens must be an array", L->file);
        goto done;
    }
    t->added = calloc(n ? n : 1, sizeof *t->added);
    if (!t->added) goto oom;
    int64_t next_id = (int64_t)t->bpe.n_entries;
    for (size_t i = 0; i < n; i++) {
        added_spec s;
        if ((st = parse_added(L, &list->items[i], i, &s)) != FERRY_OK) goto done;
        if (s.len == 0) continue;
        int32_t id = tok_strmap_get(&t->added_by_content, s.content, s.len);
        if (id >= 0) {
            const tok_pairmap_slot *e = tok_pairmap_get(&by_id, (uint32_t)id, 0);
            if (e && same_token(&t->added[e->id], &s)) continue;
        }
        if (id < 0) id = tok_strmap_get(&t->bpe.vocab, s.content, s.len);
        if (id < 0) {
            if (next_id >= TOK_MAX_ID) {
                st = ferry_fail(FERRY_ERR_INVALID, "%s: added_tokens[%zu]: too many tokens", L->file, i);
                goto done;
            }
            id = (int32_t)next_id++;
        }
        const tok_pairmap_slot *e = tok_pairmap_get(&by_id, (uint32_t)id, 0);
        tok_added *a;
        if (e) {
            a = &t->added[e->id]; /* same id again: the new flags replace the old */
        } else {
            a = &t->added[t->n_added];
            if (!tok_pairmap_put(&by_id, (uint32_t)id, 0, 0, (int32_t)t->n_added)) goto oom;
            t->n_added++;
            a->form = NULL;
        }
        char *content = arena_strdup(&t->arena, s.content, s.len);
        if (!content) goto oom;
        a->content = content;
        a->len = s.len;
        a->id = id;
        a->special = s.special;
        a->lstrip = s.lstrip;
        a->rstrip = s.rstrip;
        a->normalized = s.normalized;
        a->single_word = s.single_word;
        /* the normalized form is cached by id and never dropped, as in HF */
        if (s.normalized && t->n_norm) {
            size_t zero = 0;
            norm.len = 0;
            if (!mc && !(mc = tok_match_ctx_new())) goto oom;
            if ((st = tok_normalize(t, mc, content, s.len, &norm, &zero)) != FERRY_OK) goto done;
            if (norm.len != s.len || memcmp(norm.data, content, s.len) != 0) {
                char *f = arena_strdup(&t->arena, norm.data ? norm.data : "", norm.len);
                if (!f) goto oom;
                a->form = f;
                a->form_len = (uint32_t)norm.len;
            }
        }
        if (!tok_strmap_put(&t->added_by_content, content, s.len, id)) goto oom;
        if (s.special && !tok_strmap_put(&t->special_set, content, s.len, 1)) goto oom;
    }
    if ((st = trie_init(&t->trie_raw)) != FERRY_OK || (st = trie_init(&t->trie_norm)) != FERRY_OK) goto done;
    for (size_t i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        bool cached = a->form != NULL;
        if (!cached) {
            a->form = a->content;
            a->form_len = a->len;
        }
        if (a->normalized) st = trie_insert(&t->trie_norm, a->form, a->form_len, (int32_t)i);
        else st = trie_insert(&t->trie_raw, a->content, a->len, (int32_t)i);
        if (st != FERRY_OK) goto done;
    }
    goto done;
oom:
    st = nomem(L);
done:
    tok_pairmap_free(&by_id);
    tok_match_ctx_free(mc);
    sb_free(&norm);
    return st;
}

/* ---- ids ----------------------------------------------------------------------------------- */

static ferry_status index_ids(loader *L)
{
    tokenizer *t = L->t;
    int64_t max = t->bpe.max_id;
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].id > max) max = t->added[i].id;
    t->vocab_size = (int32_t)(max + 1);
    size_t n = t->vocab_size ? (size_t)t->vocab_size : 1;
    t->added_at = arena_alloc(&t->arena, n * sizeof *t->added_at);
    t->skippable = arena_alloc(&t->arena, n);
    if (!t->added_at || !t->skippable) return nomem(L);
    memset(t->added_at, 0xFF, n * sizeof *t->added_at);
    for (size_t i = 0; i < t->n_added; i++) t->added_at[t->added[i].id] = (int32_t)i;
    /* a post-processor's ids must be tokens, not past the vocabulary nor in
     * a hole of it: what encode adds, decode reads */
    for (size_t k = 0; k < t->n_post; k++)
        for (size_t i = 0; i < t->post[k].n; i++) {
            size_t len;
            int32_t id = t->post[k].items[i];
            if (id >= 0 && !tok_id_text(t, id, &len))
                return ferry_fail(FERRY_ERR_INVALID, "%s: post_processor adds id %d, which is not in the vocabulary",
                                  L->file, id);
        }
    /* decode(skip_special) drops a token whose text, as decode finds it, is
     * the content of a special token: an added token's normalized form is
     * not (HF 0.23 keeps Llama 2's "▁<s>") */
    for (int32_t id = 0; id < t->vocab_size; id++) {
        size_t len;
        const char *s = tok_id_text(t, id, &len);
        t->skippable[id] = s && tok_strmap_get(&t->special_set, s, len) >= 0;
    }
    return FERRY_OK;
}

/* ---- tokenizer_config.json ----------------------------------------------------------------- */

static ferry_status config_token(tokenizer *t, const json_value *root, const char *key, const char *file,
                                 const char **out)
{
    *out = "";
    const json_value *v = json_get(root, key);
    if (!v || v->type == JSON_NULL) return FERRY_OK;
    if (v->type == JSON_OBJECT) v = json_get(v, "content");
    if (!v || v->type != JSON_STRING)
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s must be a string or an object with a \"content\" string", file,
                          key);
    if (!(*out = arena_strdup(&t->arena, v->str, v->len))) return ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", file);
    return FERRY_OK;
}

static ferry_status load_config(tokenizer *t, const char *dir)
{
    char *path = util_path_join(dir, "tokenizer_config.json");
    if (!path) return ferry_fail(FERRY_ERR_NOMEM, "tokenizer: out of memory");
    char *buf = NULL;
    size_t len;
    json_doc *doc = NULL;
    /* read as every model file is, inside the model directory (model_dir.h) */
    ferry_status st = model_dir_read(dir, "tokenizer_config.json", &buf, &len);
    if (st == FERRY_ERR_NOT_FOUND && !model_dir_has(dir, "tokenizer_config.json")) {
        st = FERRY_OK;
        goto done;
    }
    if (st != FERRY_OK) goto done;
    if ((st = json_parse(buf, len, &doc)) != FERRY_OK) {
        st = ferry_fail_context(st, "%s", path);
        goto done;
    }
    const json_value *root = json_doc_root(doc);
    if (root->type != JSON_OBJECT) {
        st = ferry_fail(FERRY_ERR_INVALID, "%s: must be a JSON object", path);
        goto done;
    }
    if ((st = config_token(t, root, "bos_token", path, &t->bos)) != FERRY_OK) goto done;
    if ((st = config_token(t, root, "eos_token", path, &t->eos)) != FERRY_OK) goto done;
    const json_value *ct = json_get(root, "chat_template");
    const json_value *tmpl = NULL;
    if (ct && ct->type == JSON_STRING) {
        tmpl = ct;
    } else if (ct && ct->type == JSON_ARRAY) {
        /* named templates: the "default" one is what a chat without a name uses */
        for (size_t i = 0; i < ct->len; i++) {
            const json_value *name = json_get(&ct->items[i], "name"), *tx = json_get(&ct->items[i], "template");
            if (!name || name->type != JSON_STRING || !tx || tx->type != JSON_STRING) {
                st = ferry_fail(FERRY_ERR_INVALID, "%s: chat_template[%zu] must be {\"name\": ..., \"template\": ...}",
                                path, i);
                goto done;
            }
            if (!strcmp(name->str, "default")) tmpl = tx;
        }
    } else if (ct && ct->type != JSON_NULL) {
        st = ferry_fail(FERRY_ERR_INVALID, "%s: chat_template must be a string or a list of named templates", path);
        goto done;
    }
    if (tmpl && !(t->chat_template = arena_strdup(&t->arena, tmpl->str, tmpl->len)))
        st = ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", path);
done:
    json_doc_free(doc);
    free(buf);
    free(path);
    return st;
}

/* ---- load / free --------------------------------------------------------------------------------- */

static ferry_status load_json(loader *L, const json_value *root)
{
    tokenizer *t = L->t;
    if (root->type != JSON_OBJECT) return ferry_fail(FERRY_ERR_INVALID, "%s: must be a JSON object", L->file);
    const json_value *version = json_get(root, "version");
    if (version && (version->type != JSON_STRING || strcmp(version->str, "1.0") != 0))
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: version must be \"1.0\"", L->file);
    /* truncation and padding are ignored: transformers turns them off for
     * every call that does not ask for them */
    const json_value *model = json_get(root, "model");
    if (!model) return ferry_fail(FERRY_ERR_INVALID, "%s: has no model", L->file);
    FERRY_TRY(tok_bpe_load(&t->bpe, model, &t->arena, L->file));
    const json_value *v;
    if ((v = json_get(root, "normalizer"))) FERRY_TRY(load_normalizer(L, v, "normalizer", 0));
    if ((v = json_get(root, "pre_tokenizer"))) FERRY_TRY(load_pretok(L, v, "pre_tokenizer", 0));
    if ((v = json_get(root, "post_processor"))) FERRY_TRY(load_post(L, v, "post_processor", 0));
    if ((v = json_get(root, "decoder"))) FERRY_TRY(load_decoder(L, v, "decoder", 0));
    FERRY_TRY(load_added(L, json_get(root, "added_tokens")));
    return index_ids(L);
}

ferry_status tok_parse(const char *json, size_t len, const char *label, tokenizer **out)
{
    *out = NULL;
    tokenizer *t = calloc(1, sizeof *t);
    if (!t) return ferry_fail(FERRY_ERR_NOMEM, "tokenizer: out of memory");
    t->arena.block_min = TOK_ARENA_BLOCK;
    t->bos = t->eos = "";
    json_doc *doc = NULL;
    ferry_status st;
    if (!(t->path = strdup(label))) {
        st = ferry_fail(FERRY_ERR_NOMEM, "tokenizer: out of memory");
        goto fail;
    }
    if ((st = json_parse(json, len, &doc)) != FERRY_OK) {
        st = ferry_fail_context(st, "%s", t->path);
        goto fail;
    }
    loader L = {t, t->path};
    if ((st = load_json(&L, json_doc_root(doc))) != FERRY_OK) goto fail;
    if (t->arena.oom) {
        st = ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", t->path);
        goto fail;
    }
    json_doc_free(doc);
    *out = t;
    return FERRY_OK;
fail:
    json_doc_free(doc);
    tok_free(t);
    return st;
}

ferry_status tok_load(const char *dir, tokenizer **out)
{
    *out = NULL;
    char *path = util_path_join(dir, "tokenizer.json"), *buf = NULL;
    if (!path) return ferry_fail(FERRY_ERR_NOMEM, "tokenizer: out of memory");
    size_t len;
    tokenizer *t = NULL;
    ferry_status st = model_dir_read(dir, "tokenizer.json", &buf, &len);
    if (st == FERRY_OK) st = tok_parse(buf, len, path, &t);
    free(buf);
    free(path);
    if (st == FERRY_OK) st = load_config(t, dir);
    if (st == FERRY_OK && t->arena.oom) st = ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", t->path);
    if (st != FERRY_OK) {
        tok_free(t);
        return st;
    }
    *out = t;
    return FERRY_OK;
}

void tok_free(tokenizer *t)
{
    if (!t) return;
    for (size_t i = 0; i < t->n_norm; i++) tok_regex_free(t->norm[i].re);
    for (size_t i = 0; i < t->n_pretok; i++) tok_regex_free(t->pretok[i].re);
    for (size_t i = 0; i < t->n_dec; i++) tok_regex_free(t->dec[i].re);
    free(t->norm);
    free(t->pretok);
    free(t->dec);
    free(t->post);
    free(t->added);
    tok_strmap_free(&t->added_by_content);
    tok_strmap_free(&t->special_set);
    trie_free(&t->trie_raw);
    trie_free(&t->trie_norm);
    tok_bpe_free(&t->bpe);
    arena_free(&t->arena);
    free(t->path);
    free(t);
}

/* ---- accessors ----------------------------------------------------------------------------------- */

int tok_vocab_size(const tokenizer *t) { return t->vocab_size; }

int32_t tok_token_id(const tokenizer *t, const char *content)
{
    size_t n = strlen(content);
    int32_t id = tok_strmap_get(&t->added_by_content, content, n);
    return id >= 0 ? id : tok_strmap_get(&t->bpe.vocab, content, n);
}

bool tok_is_special(const tokenizer *t, int32_t id)
{
    if (id < 0 || id >= t->vocab_size || t->added_at[id] < 0) return false;
    const tok_added *a = &t->added[t->added_at[id]];
    return tok_strmap_get(&t->special_set, a->content, a->len) >= 0;
}

const char *tok_bos_token(const tokenizer *t) { return t->bos; }
const char *tok_eos_token(const tokenizer *t) { return t->eos; }
const char *tok_chat_template(const tokenizer *t) { return t->chat_template; }
