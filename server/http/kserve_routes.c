/*
 * kserve_routes.c - KServe v2 over HTTP: server and model metadata, model
 * readiness, Triton's model configuration and statistics, and the three
 * ways to generate - infer (tensors, binary or JSON), Triton's generate
 * and generate_stream (ids or text) - as gen_protos (gen.h). The messages
 * themselves are kserve.c's; this file binds them to paths.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen.h"

/* ---- paths ------------------------------------------------------------------------ */

#define MODELS "/v2/models/"

const char *kserve_resolve(void *ctx, const char *url, char *buf, size_t cap, http_refusal *no)
{
    if (strncmp(url, MODELS, strlen(MODELS)) != 0 || !strcmp(url, MODELS "stats")) /* every model's stats: this one */
        return url;
    const char *name = api_name(ctx);
    const char *m = url + strlen(MODELS), *slash = strchr(m, '/');
    size_t n = slash ? (size_t)(slash - m) : strlen(m);
    if (n != strlen(name) || strncmp(m, name, n) != 0) {
        no->code = 404;
        char shown[64];
        size_t k = 0;
        for (; k < n && k < sizeof shown - 1; k++) /* the answer stays ASCII JSON whatever the URL holds */
            shown[k] = m[k] >= 0x20 && m[k] < 0x7f ? m[k] : '?';
        shown[k] = '\0';
        snprintf(no->buf, sizeof no->buf, "unknown model '%s' (this server serves '%s')", shown, name);
        no->msg = no->buf;
        return NULL;
    }
    const char *tail = m + n;
    if (!strncmp(tail, "/versions/", 10)) {
        const char *v = tail + 10, *vs = strchr(v, '/');
        size_t vn = vs ? (size_t)(vs - v) : strlen(v);
        if (vn != strlen(KSERVE_MODEL_VERSION) || strncmp(v, KSERVE_MODEL_VERSION, vn) != 0) {
            no->code = 404;
            no->msg = "unknown model version (this server has version " KSERVE_MODEL_VERSION ")";
            return NULL;
        }
        tail = v + vn;
    }
    if ((size_t)snprintf(buf, cap, MODELS "{m}%s", tail) >= cap) return "/"; /* no route's: not found */
    return buf;
}

/* ---- GET routes ------------------------------------------------------------------- */

static bool get_server_metadata(http_req *rq)
{
    strbuf sb;
    sb_init(&sb);
    kserve_server_metadata(&sb);
    return http_reply_json(rq, 200, &sb, NULL, NULL);
}

static bool get_model_ready(http_req *rq)
{
    api_view v;
    api_look(rq, &v);
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\"name\": ");
    sb_json_str(&sb, api_name(http_req_ctx(rq)));
    sb_puts(&sb, v.ready ? ", \"ready\": true}" : ", \"ready\": false, \"error\": \"model not ready\"}");
    return http_reply_json(rq, v.ready ? 200 : 503, &sb, NULL, NULL);
}

/* A page about the loaded model (503 before it is): metadata, Triton's
 * configuration and statistics. */
static bool model_page(http_req *rq, void (*write)(strbuf *sb, const char *model, const api_view *v))
{
    api_view v;
    api_look(rq, &v);
    if (!v.loaded) return http_reply_json_text(rq, 503, "{\"error\": \"model not ready\"}");
    strbuf sb;
    sb_init(&sb);
    write(&sb, api_name(http_req_ctx(rq)), &v);
    return http_reply_json(rq, 200, &sb, NULL, NULL);
}

static void metadata(strbuf *sb, const char *model, const api_view *v) { kserve_model_metadata(sb, model, v->lim.vocab); }

static void config(strbuf *sb, const char *model, const api_view *v)
{
    kserve_config c;
    kserve_config_fill(&c, model, v->lim.vocab, v->lim.max_seqs);
    kserve_model_config(sb, &c);
}

static void statistics(strbuf *sb, const char *model, const api_view *v)
{
    kserve_stats k;
    kserve_stats_fill(&k, &v->sched);
    kserve_model_stats(sb, model, &k);
}

static bool get_model_metadata(http_req *rq) { return model_page(rq, metadata); }
static bool get_model_config(http_req *rq) { return model_page(rq, config); }
static bool get_model_stats(http_req *rq) { return model_page(rq, statistics); }

/* ---- generation: infer, generate, generate_stream ----------------------------------- */

typedef enum { K_INFER, K_GENERATE, K_STREAM } kserve_kind;

typedef struct {
    kserve_request kr;
    kserve_infer_writer w;       /* infer: the answer, piece by piece */
} kserve_call;

/* Inference-Header-Content-Length: -1 when absent, -2 when malformed. */
#define HEADER_LENGTH "Inference-Header-Content-Length"

static int64_t header_length(const http_req *rq)
{
    const char *v = http_req_header(rq, HEADER_LENGTH);
    if (!v) return -1;
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (end == v || *end || errno || n < 0) return -2;
    return n;
}

static bool infer_check(http_req *rq, gen_refusal *no)
{
    if (header_length(rq) != -2) return true;
    memset(no, 0, sizeof *no);
    no->status = 400;
    snprintf(no->msg, sizeof no->msg, HEADER_LENGTH " is not a byte count");
    return false;
}

static uint64_t parse_hold(size_t len) { return kserve_parse_bound(len); }

static bool parse(http_req *rq, kserve_kind kind, const gen_env *env, const char *body, size_t len, void **req,
                  gen_refusal *no)
{
    kserve_call *k = calloc(1, sizeof *k);
    if (!k) {
        gen_refuse(no, ferry_fail(FERRY_ERR_NOMEM, "out of memory"));
        return false;
    }
    *req = k;
    ferry_status st = kind == K_INFER ? kserve_parse_infer(body, len, header_length(rq), env->lim, &k->kr)
                                      : kserve_parse_generate(body, len, env->lim, &k->kr);
    if (st != FERRY_OK) gen_refuse(no, st);
    return st == FERRY_OK;
}

static bool infer_parse(http_req *rq, const gen_env *env, const char *body, size_t len, void **req, gen_refusal *no)
{
    return parse(rq, K_INFER, env, body, len, req, no);
}

static bool generate_parse(http_req *rq, const gen_env *env, const char *body, size_t len, void **req, gen_refusal *no)
{
    return parse(rq, K_GENERATE, env, body, len, req, no);
}

/* A request with text_input: its prompts encoded, within the budget. */
static bool encode_text(http_req *rq, const gen_env *env, void *req, gen_refusal *no)
{
    kserve_request *r = &((kserve_call *)req)->kr;
    if (!r->text_out) return true;
    uint64_t hold = kserve_encode_bound(r, env->tm);
    memset(no, 0, sizeof *no);
    if ((no->status = http_req_take_more(rq, hold, "encoding text_input", no->msg, sizeof no->msg)) != 0) return false;
    ferry_status st = kserve_encode_text(r, env->tm, env->lim);
    http_req_give(rq, hold);
    if (st != FERRY_OK) gen_refuse(no, st);
    return st == FERRY_OK;
}

static bool stream_prepare(http_req *rq, const gen_env *env, void *req, gen_refusal *no)
{
    if (!encode_text(rq, env, req, no)) return false;
    if (((kserve_call *)req)->kr.n_rows == 1) return true;
    memset(no, 0, sizeof *no);
    no->status = 400;
    snprintf(no->msg, sizeof no->msg, "generate_stream takes one prompt (input_ids: a list of token ids)");
    return false;
}

static int n_rows(const void *req) { return ((const kserve_call *)req)->kr.n_rows; }
static gen_request row(const void *req, int i) { return kserve_row_request(&((const kserve_call *)req)->kr, i); }
static const text_stops *stops(const void *req) { return &((const kserve_call *)req)->kr.stops; }
static bool text(const void *req) { return ((const kserve_call *)req)->kr.text_out; }
static bool streamed(const void *req) { return (void)req, true; }
static bool whole(const void *req) { return (void)req, false; }

/* The most a request's results and answer can hold, taken before any row
 * is submitted so that nothing after can fail for memory: every row's
 * tokens and logits; and the answer: an infer answer goes out one piece
 * (one row of one output) at a time, a generate answer is built whole, a
 * stream holds the events its client has not read yet. */
#define EVENT_BYTES 160 /* one SSE token event, model name aside */
static uint64_t answer_bytes(kserve_kind kind, const void *req, const gen_env *env, int n_rows_, uint64_t token_bytes)
{
    const kserve_request *r = &((const kserve_call *)req)->kr;
    uint64_t rows = (uint64_t)n_rows_, vocab = (uint64_t)env->lim->vocab;
    uint64_t new_tokens = (uint64_t)r->gen.max_new_tokens;
    uint64_t results = kserve_held_bytes(r, env->lim->vocab);
    uint64_t answer;
    if (r->text_out && kind == K_INFER) {
        /* each row's text is held whole; the writer's largest piece is a
         * row of one output (text escaped: at most 6 bytes per byte) */
        uint64_t text_row = new_tokens * token_bytes;
        results += rows * (sizeof(gen_text) + TEXT_STREAM_BYTES + text_stops_bytes(&r->stops) + text_row) +
                   2 * (TEXT_MAX_STOP_BYTES + token_bytes);
        uint64_t ids_row = new_tokens * 24, logits_row = r->want_logits ? vocab * 24 : 0, piece = 6 * text_row;
        if (ids_row > piece) piece = ids_row;
        if (logits_row > piece) piece = logits_row;
        answer = 2 * (piece + 4096);
    } else if (r->text_out) {
        results += rows * (sizeof(gen_text) + TEXT_STREAM_BYTES + text_stops_bytes(&r->stops)) +
                   2 * (TEXT_MAX_STOP_BYTES + token_bytes);
        if (kind == K_STREAM) answer = (new_tokens + 1) * (EVENT_BYTES + strlen(env->model) + 6 * token_bytes) + 4096;
        else answer = rows * new_tokens * 7 * token_bytes + 4096; /* the text, and the answer holding it escaped */
    } else if (kind == K_INFER) {
        uint64_t ids_row = new_tokens * 24, logits_row = r->want_logits ? vocab * 24 : 0; /* JSON */
        answer = 2 * ((ids_row > logits_row ? ids_row : logits_row) + 4096); /* a piece, and its growth */
    } else if (kind == K_GENERATE) {
        answer = rows * new_tokens * 16 + 4096;
    } else {
        answer = new_tokens * (EVENT_BYTES + strlen(env->model)) + 4096;
    }
    return results + answer;
}

static uint64_t infer_bytes(const void *req, const gen_env *env, int n, uint64_t token_bytes)
{
    return answer_bytes(K_INFER, req, env, n, token_bytes);
}

static uint64_t generate_bytes(const void *req, const gen_env *env, int n, uint64_t token_bytes)
{
    return answer_bytes(K_GENERATE, req, env, n, token_bytes);
}

static uint64_t stream_bytes(const void *req, const gen_env *env, int n, uint64_t token_bytes)
{
    return answer_bytes(K_STREAM, req, env, n, token_bytes);
}

static void write_token(strbuf *out, const void *req, const char *model, int32_t token, int index)
{
    (void)req;
    kserve_stream_event(out, model, token, index);
}

static void write_text(strbuf *out, const void *req, const char *model, int row_, const char *t, size_t len,
                       text_finish finish)
{
    (void)req, (void)row_;
    kserve_text_event(out, model, t, len, finish);
}

static void write_error(strbuf *out, int status, const char *msg)
{
    (void)status;
    kserve_stream_error(out, msg);
}

static bool infer_next(void *arg, strbuf *sb) { return kserve_infer_writer_next(arg, sb); }

/* The answer of a finished infer request, written piece by piece: never
 * held whole (its rows are). With a binary output,
 * Inference-Header-Content-Length needs the JSON part's length first: a
 * counting pass formats it once without keeping it. */
static bool infer_whole(http_req *rq, const gen_outcome *o)
{
    kserve_call *k = o->req;
    for (int i = 0; o->texts && i < o->n_rows; i++) { /* text_output: each row's text, held in its gen_text */
        if (o->texts[i].text.oom) return http_reply_error(rq, 503, "out of memory for a response");
        o->rows[i].text = o->texts[i].text.data;
        o->rows[i].text_len = o->texts[i].text.len;
    }
    kserve_infer_writer_init(&k->w, &k->kr, o->model, o->rows, o->vocab);
    size_t json_len = kserve_infer_json_len(&k->kr, o->model, o->rows, o->vocab);
    char hl[32];
    snprintf(hl, sizeof hl, "%zu", json_len);
    return http_reply_pieces(rq, json_len ? "application/octet-stream" : "application/json",
                             json_len ? HEADER_LENGTH : NULL, hl, infer_next, &k->w);
}

static bool generate_whole(http_req *rq, const gen_outcome *o)
{
    const kserve_request *r = &((const kserve_call *)o->req)->kr;
    strbuf sb;
    sb_init(&sb);
    if (o->texts) {
        const gen_text *t = &o->texts[0];
        sb.oom |= t->text.oom;
        kserve_text_response(&sb, r, o->model, t->text.data ? t->text.data : "", t->text.len, t->finish);
    } else {
        kserve_generate_response(&sb, r, o->model, o->rows);
    }
    return http_reply_json(rq, 200, &sb, NULL, NULL);
}

static void call_free(void *req)
{
    kserve_call *k = req;
    kserve_request_free(&k->kr);
    free(k);
}

#define KSERVE_PROTO(check_, parse_, prepare_, streaming_, bytes_, whole_)                                        \
    {                                                                                                             \
        .check = check_, .parse_hold = parse_hold, .parse = parse_, .prepare = prepare_, .n_rows = n_rows,        \
        .row = row, .stops = stops, .text = text, .streaming = streaming_, .answer_bytes = bytes_,                \
        .too_many_rows = "the request holds %d prompts but the server queues at most %d (--max-queued)",          \
        .write_token = write_token, .write_text = write_text, .write_error = write_error, .write_whole = whole_, \
        .free = call_free,                                                                                        \
    }

static const gen_proto k_infer = KSERVE_PROTO(infer_check, infer_parse, encode_text, whole, infer_bytes, infer_whole);
static const gen_proto k_generate =
    KSERVE_PROTO(NULL, generate_parse, encode_text, whole, generate_bytes, generate_whole);
static const gen_proto k_stream =
    KSERVE_PROTO(NULL, generate_parse, stream_prepare, streamed, stream_bytes, generate_whole);

/* ---- the table ---------------------------------------------------------------------- */

#define GEN HTTP_BODY | HTTP_PREP

/* Model paths as kserve_resolve leaves them: /v2/models/{m}[/versions/1]/... */
static const http_route k_routes[] = {
    HTTP_ROUTE("GET", "/v2", "server_metadata", get_server_metadata),
    HTTP_ROUTE("GET", "/v2/", "server_metadata", get_server_metadata),
    HTTP_ROUTE("GET", MODELS "stats", "model_stats", get_model_stats),
    HTTP_ROUTE("GET", MODELS "{m}", "model_metadata", get_model_metadata),
    HTTP_ROUTE("GET", MODELS "{m}/ready", "model_ready", get_model_ready),
    {"POST", MODELS "{m}/infer", "infer", gen_answer, gen_resume, GEN, HEADER_LENGTH, &k_infer},
    {"POST", MODELS "{m}/generate", "generate", gen_answer, gen_resume, GEN, NULL, &k_generate},
    {"POST", MODELS "{m}/generate_stream", "generate_stream", gen_answer, gen_resume, GEN, NULL, &k_stream},
    HTTP_ROUTE("GET", MODELS "{m}/config", "model_config", get_model_config),
    HTTP_ROUTE("GET", MODELS "{m}/stats", "model_stats", get_model_stats),
};

const http_route_table kserve_routes = {k_routes, sizeof k_routes / sizeof k_routes[0]};
