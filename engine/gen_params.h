/*
 * gen_params.h - the generation parameters a request sets (gen_params.def)
 * and the one check of each.
 *
 * Every reader of them - KServe's JSON parameters (server/kserve.c), its
 * protobuf InferParameters (server/grpc/grpc_messages.c), an OpenAI body
 * (server/openai.c), the CLI's settings - maps its names and wire types
 * onto these calls, which check the value against the table's range and
 * store it; request_check (request.h) judges the same ranges again with
 * the same functions, so a parameter's rule is written once. Errors are
 * FERRY_ERR_INVALID naming the parameter as the caller spells it
 * ("parameters.top_p", "top_p") and the range: "parameters.top_p must be a
 * number in (0, 1] (got 1.5)".
 */
#ifndef FERRY_GEN_PARAMS_H
#define FERRY_GEN_PARAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/json.h"
#include "base/status.h"
#include "sampling.h"

#define REQUEST_MAX_STOP 16 /* stop_token_ids of one request */

typedef enum {
#define FERRY_GEN_PARAM(name, openai, chat, type, valid, doc) GEN_##name,
#include "gen_params.def"
#undef FERRY_GEN_PARAM
    GEN_PARAM_COUNT
} gen_param;

typedef enum { GEN_INT, GEN_REAL, GEN_U64, GEN_IDS, GEN_STOPS } gen_param_type;

typedef struct {
    const char *name;   /* KServe's and settings.def's */
    const char *openai; /* an OpenAI request's */
    const char *chat;   /* a chat request's first choice; NULL: openai's */
    gen_param_type type;
    const char *valid;  /* "LO..HI" as settings.def writes it, or NULL */
    const char *doc;
} gen_param_def;

extern const gen_param_def gen_param_defs[GEN_PARAM_COUNT];

/* What a request sets beside its prompts, shared by all its rows (the stop
 * strings, text only, are the text layer's: text_stops). */
typedef struct {
    int max_new_tokens;
    sampling_params sampling;
    int32_t stop_ids[REQUEST_MAX_STOP];
    int n_stop;
    bool given[GEN_PARAM_COUNT]; /* set by the request, not a default */
} gen_params;

/* Stores v as parameter id without a check and without marking it given:
 * for values already checked (the settings, config_gen_params). */
void gen_param_put_int(gen_params *p, gen_param id, int64_t v);
void gen_param_put_real(gen_params *p, gen_param id, double v);
void gen_param_put_u64(gen_params *p, gen_param id, uint64_t v);

/* The parameter KServe (and settings.def) calls name; GEN_PARAM_COUNT when
 * there is none. */
gen_param gen_param_find(const char *name);
/* "max_new_tokens, temperature, ..., stop": the names in the table's
 * order, leaving out those whose bit (1u << GEN_x) is in skip. */
const char *gen_param_names(char *buf, size_t cap, unsigned skip);

/* Range checks, one per type: v against parameter id's valid range. */
ferry_status gen_param_check_int(gen_param id, const char *name, int64_t v);
ferry_status gen_param_check_real(gen_param id, const char *name, double v);
/* stop_token_ids: at most REQUEST_MAX_STOP, each id 0 .. 2^31 - 1 (whether
 * the vocabulary holds it is request_check's question). */
ferry_status gen_param_check_stop_count(const char *name, size_t n);
ferry_status gen_param_check_stop_id(const char *name, size_t at, int64_t v);
/* temperature, top_k and top_p; *bad (may be NULL) says which failed. */
ferry_status gen_param_check_sampling(const sampling_params *s, gen_param *bad);

/* Checks a value and stores it in p, given. set_int takes an INT or a U64
 * from a signed wire type (a U64 must be >= 0); set_u64 a U64 or an INT
 * from an unsigned one (past INT64_MAX: out of any INT's range). */
ferry_status gen_param_set_int(gen_params *p, gen_param id, const char *name, int64_t v);
ferry_status gen_param_set_u64(gen_params *p, gen_param id, const char *name, uint64_t v);
ferry_status gen_param_set_real(gen_params *p, gen_param id, const char *name, double v);
/* The JSON form of any type but STOPS (KServe's parameters, an OpenAI
 * body): an integer, a number, or an array of integer ids. */
ferry_status gen_param_set_json(gen_params *p, gen_param id, const char *name, const json_value *v);

#endif
