/*
 * openai_routes.c - the OpenAI-compatible API over HTTP: GET /v1/models,
 * and /v1/completions and /v1/chat/completions as gen_protos (gen.h),
 * answered whole or as server-sent events ending with "data: [DONE]".
 * The messages themselves are openai.c's; errors on /v1 paths are
 * OpenAI's error object (http_server.c's error_body).
 */
#include <stdio.h>
#include <stdlib.h>

#include "../openai.h"
#include "gen.h"

static bool models(http_req *rq)
{
    api_view v;
    api_look(rq, &v);
    if (!v.loaded) return http_reply_error(rq, 503, "model not ready");
    strbuf sb;
    sb_init(&sb);
    oai_models(&sb, api_name(http_req_ctx(rq)), v.attached_unix, v.lim.max_ctx);
    return http_reply_json(rq, 200, &sb, NULL, NULL);
}

/* ---- generation ------------------------------------------------------------------- */

/* Chat prompts: the rendered template may hold RENDER_RATIO x the body
 * (plus a template's own text) before it is refused 413. */
#define RENDER_RATIO 4
#define RENDER_SLACK (256u << 10)

static uint64_t render_bound(size_t len) { return (uint64_t)RENDER_RATIO * len + RENDER_SLACK; }

/* What parsing a body may hold at once: its JSON tree; for chat also the
 * template's variables (a second tree) and the rendered prompt. The
 * prompts' encodes take theirs as they come (gen_hold): only then is the
 * text the tokenizer works on known. */
static uint64_t completions_hold(size_t len) { return kserve_parse_bound(len); }
static uint64_t chat_hold(size_t len) { return 2 * (uint64_t)kserve_parse_bound(len) + render_bound(len); }

static bool parse(oai_kind kind, http_req *rq, const gen_env *env, const char *body, size_t len, void **req,
                  gen_refusal *no)
{
    oai_ctx ctx = {env->model, env->tm, env->lim, kserve_parse_bound(len), render_bound(len), gen_hold, rq};
    oai_error err;
    oai_request *r = NULL;
    ferry_status st = oai_parse(kind, body, len, &ctx, &r, &err);
    *req = r;
    if (st == FERRY_OK) return true;
    gen_refuse(no, st);
    no->status = err.status;
    snprintf(no->param, sizeof no->param, "%s", err.param);
    no->code = err.code;
    return false;
}

static bool completions_parse(http_req *rq, const gen_env *env, const char *body, size_t len, void **req,
                              gen_refusal *no)
{
    return parse(OAI_COMPLETIONS, rq, env, body, len, req, no);
}

static bool chat_parse(http_req *rq, const gen_env *env, const char *body, size_t len, void **req, gen_refusal *no)
{
    return parse(OAI_CHAT, rq, env, body, len, req, no);
}

static int n_rows(const void *req) { return oai_rows(req); }
static gen_request row(const void *req, int i) { return oai_row_request(req, i); }
static const text_stops *stops(const void *req) { return oai_stops(req); }
static bool text(const void *req) { return (void)req, true; }
static bool streaming(const void *req) { return oai_streaming(req); }

/* The parse, each row's tokens and text stream (and its text, when the
 * answer is whole), and the answer. */
static uint64_t answer_bytes(const void *req, const gen_env *env, int n, uint64_t token_bytes)
{
    const oai_request *r = req;
    bool streamed = oai_streaming(r);
    uint64_t new_tokens = (uint64_t)oai_row_request(r, 0).max_new_tokens;
    uint64_t per_row = new_tokens * sizeof(int32_t) + sizeof(kserve_row) + sizeof(gen_text) + TEXT_STREAM_BYTES +
                       text_stops_bytes(oai_stops(r)) + (streamed ? 0 : new_tokens * token_bytes);
    return oai_request_bytes(r) + (uint64_t)n * per_row + oai_answer_bytes(r, env->model, token_bytes) +
           2 * (TEXT_MAX_STOP_BYTES + token_bytes); /* the stream's delta */
}

static void write_start(strbuf *out, const void *req, const char *model) { oai_stream_start(out, req, model); }

static void write_text(strbuf *out, const void *req, const char *model, int row_, const char *t, size_t len,
                       text_finish finish)
{
    oai_stream_delta(out, req, model, row_, t, len, finish);
}

static void write_error(strbuf *out, int status, const char *msg) { oai_stream_error(out, status, msg); }

static void write_end(strbuf *out, const void *req, const char *model, bool ok, int completion_tokens)
{
    oai_stream_end(out, req, model, ok, completion_tokens);
}

static bool write_whole(http_req *rq, const gen_outcome *o)
{
    oai_choice *c = calloc((size_t)o->n_rows, sizeof *c);
    if (!c) return http_reply_error(rq, 503, "out of memory");
    strbuf sb;
    sb_init(&sb);
    for (int i = 0; i < o->n_rows; i++) {
        const gen_text *t = &o->texts[i];
        c[i] = (oai_choice){t->text.data ? t->text.data : "", t->text.len, t->finish, t->n_tokens};
        sb.oom |= t->text.oom;
    }
    oai_response(&sb, o->req, o->model, c);
    free(c);
    return http_reply_json(rq, 200, &sb, NULL, NULL);
}

static void request_free(void *req) { oai_request_free(req); }

/* Every answer is text: no token events. */
#define OAI_PROTO(hold_, parse_)                                                                                   \
    {                                                                                                              \
        .parse_hold = hold_, .parse = parse_, .n_rows = n_rows, .row = row, .stops = stops, .text = text,          \
        .streaming = streaming, .answer_bytes = answer_bytes,                                                      \
        .too_many_rows = "the request asks for %d sequences (prompts x n) but the server queues at most %d "       \
                         "(--max-queued)",                                                                         \
        .tokens_param = "max_tokens", .write_start = write_start, .write_text = write_text,                        \
        .write_error = write_error, .write_end = write_end, .write_whole = write_whole, .free = request_free,       \
    }

static const gen_proto k_completions = OAI_PROTO(completions_hold, completions_parse);
static const gen_proto k_chat = OAI_PROTO(chat_hold, chat_parse);

static const http_route k_routes[] = {
    HTTP_ROUTE("GET", "/v1/models", "openai_models", models),
    {"POST", "/v1/completions", "completions", gen_answer, gen_resume, HTTP_BODY | HTTP_PREP, NULL, &k_completions},
    {"POST", "/v1/chat/completions", "chat_completions", gen_answer, gen_resume, HTTP_BODY | HTTP_PREP, NULL, &k_chat},
};

const http_route_table openai_routes = {k_routes, sizeof k_routes / sizeof k_routes[0]};
