/*
 * openai.h - the OpenAI-compatible API (/v1/models, /v1/completions,
 * /v1/chat/completions), independent of the transport: a request body
 * becomes rows for the scheduler, generated text becomes the answer - whole,
 * or as server-sent event chunks ending with "data: [DONE]".
 *
 * As OpenAI servers do (vLLM, llama.cpp), fields this server does not know
 * are ignored, but a known field of the wrong type or out of range is a 400
 * naming it (the error's param). Known fields it cannot honour are refused
 * rather than ignored: logprobs, suffix, logit_bias, penalties other than 0,
 * best_of other than n, response_format other than text, tool_choice
 * "required" or a named function, content parts other than text. Extensions
 * taken as vLLM spells them: top_k, ignore_eos, stop_token_ids,
 * chat_template_kwargs.
 *
 * Rows: each prompt of a completion request (a string, a list of strings,
 * a list of token ids, a list of such lists) times n; choice i of the
 * answer is row i (prompt i / n). A chat request is one prompt times n.
 * Defaults: max_tokens 16 for completions (as OpenAI), the rest of the
 * context for chat (as vLLM); temperature and top_p from
 * generation_config.json where the request gives none, else OpenAI's (1,
 * 1); no seed: a fresh one per request, so sampled answers differ.
 */
#ifndef FERRY_OPENAI_H
#define FERRY_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/base/json.h"
#include "../engine/request.h"
#include "../text/text.h"

#define OAI_MAX_N 64        /* choices per prompt */
#define OAI_MAX_ROWS 1024   /* prompts x n in one request */

typedef enum { OAI_COMPLETIONS, OAI_CHAT } oai_kind;

typedef struct oai_request oai_request;

/* What parsing needs to know of the server. */
typedef struct {
    const char *model;           /* the served name: `model` must be it when given */
    const text_model *tm;
    const engine_limits *lim;
    size_t max_parse;            /* bytes parsing the body may hold (json_parse_limited) */
    size_t max_render;           /* chat: bytes the rendered prompt may have */
    /* The budget for each prompt's encode, taken before it and held until
     * the caller is done with the parse: 0 when taken, else the HTTP status
     * to answer (503 busy, 413 never fits) with msg set. NULL: unbounded. */
    int (*hold)(void *arg, uint64_t bytes, char *msg, size_t cap);
    void *hold_arg;
} oai_ctx;

/* How an error is reported, beside ferry_errmsg's message. */
typedef struct {
    int status;                  /* HTTP status */
    char param[64];              /* the request field at fault; "" = null */
    const char *code;            /* "model_not_found", "context_length_exceeded", or NULL */
} oai_error;

/* Parses and checks a body, every row with request_check; on failure
 * ferry_errmsg() is the message and err says how to answer it. */
ferry_status oai_parse(oai_kind kind, const char *body, size_t len, const oai_ctx *ctx, oai_request **out,
                       oai_error *err);
void oai_request_free(oai_request *r);
/* Memory the parsed request holds. */
size_t oai_request_bytes(const oai_request *r);

int oai_rows(const oai_request *r);
/* Row i as a gen_request (its prompt points into r; stream i of the seed). */
gen_request oai_row_request(const oai_request *r, int row);
const text_stops *oai_stops(const oai_request *r);
bool oai_streaming(const oai_request *r);

/* The most bytes the answer can take (a whole body, or every event of a
 * stream its client has not read), given the most bytes one token adds to
 * a text (text_max_token_bytes). */
uint64_t oai_answer_bytes(const oai_request *r, const char *model, size_t token_bytes);

/* ---- answers ------------------------------------------------------------------------ */

/* {"error": {"message", "type", "param", "code"}}: type invalid_request_error
 * below 500, server_error from it. */
void oai_error_body(strbuf *sb, int status, const char *msg, const char *param, const char *code);
/* GET /v1/models */
void oai_models(strbuf *sb, const char *model, int64_t created, int max_model_len);

/* One choice of a finished request. */
typedef struct {
    const char *text;
    size_t len;
    text_finish finish;
    int n_tokens;
} oai_choice;

/* The whole answer: choices[oai_rows(r)], and usage. */
void oai_response(strbuf *sb, const oai_request *r, const char *model, const oai_choice *choices);

/* Stream events. start: what goes before any token (chat: each choice's
 * role chunk; completions with echo: each prompt); delta: text of one
 * choice, and its finish reason when it ended (TEXT_FINISH_NONE while it
 * runs); error: an error event (a failure after the stream began); end:
 * when ok, the usage chunk if stream_options.include_usage asked for it,
 * then "data: [DONE]" in every case. */
void oai_stream_start(strbuf *sb, const oai_request *r, const char *model);
void oai_stream_delta(strbuf *sb, const oai_request *r, const char *model, int row, const char *text, size_t len,
                      text_finish finish);
void oai_stream_end(strbuf *sb, const oai_request *r, const char *model, bool ok, int completion_tokens);
void oai_stream_error(strbuf *sb, int status, const char *msg);

#endif
