/*
 * gen.h - a generation over HTTP: a request whose prompts become rows of
 * the scheduler, whatever protocol it speaks. gen.c parses the body within
 * the request-memory budget, submits the rows, takes their tokens on the
 * engine thread (through text streams with stop strings when the answer
 * is text), and answers once every row ended - whole, piece by piece, or
 * as server-sent events from the first token on.
 *
 * The protocol is a gen_proto, a route's arg (http_route.arg): KServe's
 * infer, generate and generate_stream (kserve_routes.c), OpenAI's
 * completions and chat completions (openai_routes.c). A route answers with
 * gen_answer and resumes with gen_resume.
 */
#ifndef FERRY_HTTP_GEN_H
#define FERRY_HTTP_GEN_H

#include "../kserve.h"
#include "../../text/text.h"
#include "api.h"

/* One row of a text answer. */
typedef struct {
    text_stream *ts;
    strbuf text;                 /* not streamed: the text so far */
    text_finish finish;
    int n_tokens;
    bool stopped;                /* a stop string ended it: its cancel is not the client's */
} gen_text;

/* What the protocol parses with. */
typedef struct {
    const char *model;           /* the served name */
    const text_model *tm;
    const engine_limits *lim;
} gen_env;

/* Every row ended well: what the answer is written from. */
typedef struct {
    void *req;                   /* the protocol's parse */
    const char *model;
    int vocab;
    int n_rows;
    kserve_row *rows;            /* [n_rows] tokens and logits (text: the row's text set for infer) */
    gen_text *texts;             /* [n_rows] when the answer is text, else NULL */
} gen_outcome;

/* Why a request is refused before its rows go: answered in the format of
 * its path (listener's error_body). */
typedef struct {
    int status;                  /* HTTP status */
    char msg[FERRY_MSG_MAX];
    char param[64];              /* OpenAI's param: the field at fault; "" = null */
    const char *code;            /* OpenAI's code, or NULL */
} gen_refusal;

/* Fills no from ferry_errmsg(), with the status st maps to (kserve_http_status). */
void gen_refuse(gen_refusal *no, ferry_status st);

typedef struct {
    /* Checks on the head alone, before any budget is taken. NULL: none. */
    bool (*check)(http_req *rq, gen_refusal *no);
    /* What parsing a body of len bytes may hold at once (the JSON tree, a
     * chat's template variables and rendering), taken before parse. */
    uint64_t (*parse_hold)(size_t len);
    /* The body into *req (even when refused: freed with the request). */
    bool (*parse)(http_req *rq, const gen_env *env, const char *body, size_t len, void **req, gen_refusal *no);
    /* After the parse, the body given back (KServe: encode text_input
     * within the budget). NULL: nothing. */
    bool (*prepare)(http_req *rq, const gen_env *env, void *req, gen_refusal *no);
    int (*n_rows)(const void *req);
    gen_request (*row)(const void *req, int i);
    const text_stops *(*stops)(const void *req);
    bool (*text)(const void *req);      /* the answer is text (else token ids) */
    bool (*streaming)(const void *req); /* answered as server-sent events */
    /* The most the results and the answer can hold (gen.c's answer_bytes
     * says what), given the most bytes a token adds to a text. */
    uint64_t (*answer_bytes)(const void *req, const gen_env *env, int n_rows, uint64_t token_bytes);
    /* The refusal of more rows than the queue holds: "%d ... %d" (rows, --max-queued). */
    const char *too_many_rows;
    /* The field a 413 for a too large answer names, or NULL. */
    const char *tokens_param;
    /* Events. start: before any token (NULL: none); token: an answer of ids;
     * text: a text row's delta, and its finish when it ended; error: the
     * failure of a stream that began; end: after the last row (NULL: none). */
    void (*write_start)(strbuf *out, const void *req, const char *model);
    void (*write_token)(strbuf *out, const void *req, const char *model, int32_t token, int index);
    void (*write_text)(strbuf *out, const void *req, const char *model, int row, const char *text, size_t len,
                       text_finish finish);
    void (*write_error)(strbuf *out, int status, const char *msg);
    void (*write_end)(strbuf *out, const void *req, const char *model, bool ok, int completion_tokens);
    /* The answer, not streamed (http_reply_json or http_reply_pieces). */
    bool (*write_whole)(http_req *rq, const gen_outcome *o);
    void (*free)(void *req);
} gen_proto;

/* http_route.answer and .resume of a generation route (arg: its gen_proto). */
bool gen_answer(http_req *rq);
bool gen_resume(http_req *rq);

/* The parse's budget: n more bytes held until the parse is done (an
 * OpenAI prompt's encode: oai_ctx.hold). 0, or 413/503 with msg set. */
int gen_hold(void *rq, uint64_t n, char *msg, size_t cap);

#endif
