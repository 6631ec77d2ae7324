/*
 * request.h - what a front end asks of the engine, and the one check of it.
 *
 * Every front end (the CLI, KServe over HTTP, gRPC and the OpenAI API
 * next) turns its protocol into gen_request values and hands them to the
 * scheduler; the engine's limits (engine_limits) are all a front end needs
 * to know of the model to validate and describe it. request_check is the
 * one validator: token ids in the vocabulary, prompt + new tokens within
 * the context and the server's per-request caps, generation and sampling
 * parameters in range (gen_params.h's checks, the ones every protocol's
 * reader runs). Besides its message it says which part of the request is
 * wrong, for protocols that name it apart (OpenAI's "param"). This header is
 * what a transport-neutral protocol layer (server/kserve) includes: no
 * scheduler, engine or backend internals.
 */
#ifndef FERRY_REQUEST_H
#define FERRY_REQUEST_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "gen_params.h"
#include "sampling.h"

/* One sequence to generate. */
typedef struct {
    const int32_t *prompt;   /* [prompt_len] token ids; copied by sched_submit */
    int prompt_len;
    int max_new_tokens;      /* >= 1 */
    sampling_params sampling;
    uint64_t stream;         /* sampling stream of sampling.seed: prompt i of a request draws from stream i */
    int32_t stop_ids[REQUEST_MAX_STOP]; /* generation ends after emitting one of these */
    int n_stop;
    bool want_logits;        /* report the logits of the last prompt position */
} gen_request;

/* What a loaded engine accepts. */
typedef struct {
    int vocab;               /* token ids are 0 .. vocab - 1 */
    int max_ctx;             /* positions per sequence: prompt + new tokens */
    int max_seqs;            /* sequences generating at once (the KV cache holds them) */
    int max_step_tokens;     /* token rows in one step */
    int64_t kv_positions;    /* positions the whole KV pool holds (blocks x block positions): a sequence
                              * longer than that could never run; 0 = no bound beyond max_ctx */
    int max_prompt;          /* a server's cap on one prompt's tokens (--max-prompt-tokens); 0 = none */
    int max_new;             /* a server's cap on one sequence's new tokens (--max-output-tokens); 0 = none */
} engine_limits;

/* The outcome of one gen_request. */
typedef struct {
    const int32_t *tokens;   /* generated ids (stop token included) */
    int n_tokens;
    const float *logits;     /* [vocab] when want_logits, else NULL */
    int vocab;
    bool cancelled;
    double queue_s;          /* submit -> admitted */
    double total_s;          /* submit -> done */
} gen_result;

/* What request_check refused: a generation parameter (a gen_param:
 * max_new_tokens, stop_token_ids, temperature, top_k, top_p), the prompt
 * (empty, an id outside the vocabulary, past the server's --max-prompt-tokens)
 * or the two together past the context (request_context). */
typedef int request_field;
enum { REQUEST_FIELD_PROMPT = GEN_PARAM_COUNT, REQUEST_FIELD_CONTEXT };

/* FERRY_ERR_INVALID with a message naming the problem, `what` naming the
 * prompt in it (e.g. "input_ids", "input_ids[2]", "prompt 1"); *bad (may be
 * NULL) says which part is wrong. */
ferry_status request_check(const gen_request *r, const engine_limits *lim, const char *what, request_field *bad);

/* The most positions one sequence may take, prompt and new tokens: the
 * context, or the whole KV pool where that is smaller. */
int64_t request_context(const engine_limits *lim);

/* The parameters of p in g (its prompt, stream and want_logits are left). */
void request_set_params(gen_request *g, const gen_params *p);

#endif
