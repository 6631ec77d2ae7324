/*
 * gen_params.c - the generation parameters' table, ranges and checks. See
 * gen_params.h.
 */
#include "gen_params.h"

#include "base/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


const gen_param_def gen_param_defs[GEN_PARAM_COUNT] = {
#define FERRY_GEN_PARAM(name, openai, chat, type, valid, doc) {#name, openai, chat, GEN_##type, valid, doc},
#include "gen_params.def"
#undef FERRY_GEN_PARAM
};

/* ---- ranges --------------------------------------------------------------------- */

/* A parameter's valid string, "LO..HI" as settings.def writes it. */
typedef struct {
    bool has_lo, has_hi, lo_open;
    double lo, hi;
    int lo_len;       /* LO's text: valid[0 .. lo_len) */
    const char *text; /* valid */
    const char *hi_s; /* HI's text */
} range;

static range range_of(gen_param id)
{
    range r = {0};
    if (!(r.text = gen_param_defs[id].valid)) return r;
    const char *dots = strstr(r.text, "..");
    FERRY_ASSERT(dots);
    r.lo_open = dots > r.text && dots[-1] == '<';
    r.lo_len = (int)(dots - r.text) - r.lo_open;
    r.has_lo = r.lo_len > 0;
    r.has_hi = dots[2] != '\0';
    r.lo = strtod(r.text, NULL);
    r.hi = strtod(dots + 2, NULL);
    r.hi_s = dots + 2;
    return r;
}

/* hi_f: the value is held in a float, which holds HI rounded (a top_p of 1
 * stays 1, a temperature of 1e30 is 1.00000002e30 in a float). */
static bool in_range(const range *r, double x, bool hi_f)
{
    if (isnan(x)) return false;
    if (r->has_lo && !(r->lo_open ? x > r->lo : x >= r->lo)) return false;
    if (r->has_hi && !(x <= (hi_f ? (double)(float)r->hi : r->hi))) return false;
    return true;
}

/* What parameter id must be: "an integer in 1..16777216", "a number in
 * (0, 1]", "an integer >= 0". */
static const char *describe(gen_param id, char *buf, size_t cap)
{
    const gen_param_def *d = &gen_param_defs[id];
    const char *what = d->type == GEN_REAL ? "a number" : "an integer";
    range r = range_of(id);
    if (r.has_lo && r.has_hi && r.lo_open) snprintf(buf, cap, "%s in (%.*s, %s]", what, r.lo_len, r.text, r.hi_s);
    else if (r.has_lo && r.has_hi) snprintf(buf, cap, "%s in %.*s..%s", what, r.lo_len, r.text, r.hi_s);
    else if (r.has_lo) snprintf(buf, cap, "%s %s %.*s", what, r.lo_open ? ">" : ">=", r.lo_len, r.text);
    else if (r.has_hi) snprintf(buf, cap, "%s <= %s", what, r.hi_s);
    else if (d->type == GEN_U64) snprintf(buf, cap, "%s >= 0", what);
    else snprintf(buf, cap, "%s", what);
    return buf;
}

static ferry_status wrong_type(gen_param id, const char *name)
{
    char want[64];
    return ferry_fail(FERRY_ERR_INVALID, "%s must be %s", name, describe(id, want, sizeof want));
}

ferry_status gen_param_check_int(gen_param id, const char *name, int64_t v)
{
    FERRY_ASSERT(gen_param_defs[id].type == GEN_INT || gen_param_defs[id].type == GEN_U64);
    range r = range_of(id);
    if (gen_param_defs[id].type == GEN_U64 ? v >= 0 : in_range(&r, (double)v, false)) return FERRY_OK;
    char want[64];
    return ferry_fail(FERRY_ERR_INVALID, "%s must be %s (got %lld)", name, describe(id, want, sizeof want), (long long)v);
}

static ferry_status check_real(gen_param id, const char *name, double v, bool hi_f)
{
    FERRY_ASSERT(gen_param_defs[id].type == GEN_REAL);
    range r = range_of(id);
    if (isfinite(v) && in_range(&r, v, hi_f)) return FERRY_OK;
    char want[64], got[32];
    util_fmt_double(v, got, sizeof got); /* 1.0000001, not %g's 1 */
    return ferry_fail(FERRY_ERR_INVALID, "%s must be %s (got %s)", name, describe(id, want, sizeof want), got);
}

ferry_status gen_param_check_real(gen_param id, const char *name, double v) { return check_real(id, name, v, false); }

ferry_status gen_param_check_stop_count(const char *name, size_t n)
{
    if (n <= REQUEST_MAX_STOP) return FERRY_OK;
    return ferry_fail(FERRY_ERR_INVALID, "%s: at most %d ids (got %zu)", name, REQUEST_MAX_STOP, n);
}

ferry_status gen_param_check_stop_id(const char *name, size_t at, int64_t v)
{
    if (v >= 0 && v <= INT32_MAX) return FERRY_OK;
    return ferry_fail(FERRY_ERR_INVALID, "%s[%zu] = %lld is outside every vocabulary", name, at, (long long)v);
}

/* The values as a sampler holds them: floats (gen_param_set_real stored them). */
ferry_status gen_param_check_sampling(const sampling_params *s, gen_param *bad)
{
    gen_param which = GEN_PARAM_COUNT;
    if (check_real(GEN_temperature, "temperature", s->temperature, true) != FERRY_OK) which = GEN_temperature;
    else if (gen_param_check_int(GEN_top_k, "top_k", s->top_k) != FERRY_OK) which = GEN_top_k;
    else if (check_real(GEN_top_p, "top_p", s->top_p, true) != FERRY_OK) which = GEN_top_p;
    if (bad) *bad = which;
    return which == GEN_PARAM_COUNT ? FERRY_OK : FERRY_ERR_INVALID;
}

/* ---- storing -------------------------------------------------------------------- */

/* Where each parameter lives in gen_params, by its type; checked before. */
void gen_param_put_int(gen_params *p, gen_param id, int64_t v)
{
    switch (id) {
    case GEN_max_new_tokens: p->max_new_tokens = (int)v; break;
    case GEN_top_k: p->sampling.top_k = v > INT32_MAX ? INT32_MAX : (int)v; break; /* >= vocabulary: all */
    default: FERRY_ASSERT(!"an INT parameter without a field");
    }
}

void gen_param_put_real(gen_params *p, gen_param id, double v)
{
    switch (id) {
    case GEN_temperature: p->sampling.temperature = (float)v; break;
    case GEN_top_p:
        p->sampling.top_p = (float)v;
        if (!(p->sampling.top_p > 0)) p->sampling.top_p = 1e-30f; /* a denormal double: keep it positive */
        break;
    default: FERRY_ASSERT(!"a REAL parameter without a field");
    }
}

void gen_param_put_u64(gen_params *p, gen_param id, uint64_t v)
{
    FERRY_ASSERT(id == GEN_seed);
    p->sampling.seed = v;
}

ferry_status gen_param_set_int(gen_params *p, gen_param id, const char *name, int64_t v)
{
    FERRY_TRY(gen_param_check_int(id, name, v));
    if (gen_param_defs[id].type == GEN_U64) gen_param_put_u64(p, id, (uint64_t)v);
    else gen_param_put_int(p, id, v);
    p->given[id] = true;
    return FERRY_OK;
}

ferry_status gen_param_set_u64(gen_params *p, gen_param id, const char *name, uint64_t v)
{
    if (gen_param_defs[id].type != GEN_U64) {
        if (v <= INT64_MAX) return gen_param_set_int(p, id, name, (int64_t)v);
        char want[64];
        return ferry_fail(FERRY_ERR_INVALID, "%s must be %s (got %llu)", name, describe(id, want, sizeof want),
                          (unsigned long long)v);
    }
    gen_param_put_u64(p, id, v);
    p->given[id] = true;
    return FERRY_OK;
}

ferry_status gen_param_set_real(gen_params *p, gen_param id, const char *name, double v)
{
    FERRY_TRY(gen_param_check_real(id, name, v));
    gen_param_put_real(p, id, v);
    p->given[id] = true;
    return FERRY_OK;
}

static ferry_status set_ids_json(gen_params *p, const char *name, const json_value *v)
{
    if (v->type != JSON_ARRAY) return ferry_fail(FERRY_ERR_INVALID, "%s must be an array of token ids", name);
    FERRY_TRY(gen_param_check_stop_count(name, v->len));
    for (size_t j = 0; j < v->len; j++) {
        const json_value *t = &v->items[j];
        if (t->type != JSON_NUMBER || !t->is_int) return ferry_fail(FERRY_ERR_INVALID, "%s[%zu] is not an integer", name, j);
        FERRY_TRY(gen_param_check_stop_id(name, j, t->integer));
        p->stop_ids[j] = (int32_t)t->integer;
    }
    p->n_stop = (int)v->len;
    p->given[GEN_stop_token_ids] = true;
    return FERRY_OK;
}

ferry_status gen_param_set_json(gen_params *p, gen_param id, const char *name, const json_value *v)
{
    switch (gen_param_defs[id].type) {
    case GEN_INT:
    case GEN_U64:
        if (v->type != JSON_NUMBER || !v->is_int) return wrong_type(id, name);
        return gen_param_set_int(p, id, name, v->integer);
    case GEN_REAL:
        if (v->type != JSON_NUMBER) return wrong_type(id, name);
        return gen_param_set_real(p, id, name, v->number);
    case GEN_IDS: return set_ids_json(p, name, v);
    case GEN_STOPS: break;
    }
    return ferry_fail(FERRY_ERR_INTERNAL, "%s: stop strings are read by the text layer", name);
}

/* ---- names and defaults ----------------------------------------------------------- */

gen_param gen_param_find(const char *name)
{
    for (int id = 0; id < GEN_PARAM_COUNT; id++)
        if (!strcmp(gen_param_defs[id].name, name)) return (gen_param)id;
    return GEN_PARAM_COUNT;
}

const char *gen_param_names(char *buf, size_t cap, unsigned skip)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int id = 0; id < GEN_PARAM_COUNT; id++) {
        if (skip & (1u << id)) continue;
        int n = snprintf(buf + at, cap - at, "%s%s", at ? ", " : "", gen_param_defs[id].name);
        if (n < 0 || (size_t)n >= cap - at) break;
        at += (size_t)n;
    }
    return buf;
}
