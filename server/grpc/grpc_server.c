/*
 * grpc_server.c - the gRPC front end on gRPC C core (grpc/grpc.h).
 *
 * One completion queue (grpc_completion_queue_create_for_next) and one
 * thread, cq_main, that drives it. Calls are asked for with the generic
 * grpc_server_request_call and dispatched on their method name. Each call
 * is an `rpc`, whose life is a sequence of batches (grpc_call_start_batch),
 * each completing with one of the rpc's tags:
 *
 *   NEW     the call arrived: ask for the next one; start RECV_CLOSE_ON_SERVER
 *           (tag CLOSED, fires when the call ends: finished, cancelled by
 *           the client, its deadline passed, or the server cancelled it)
 *           and RECV_MESSAGE (tag RECV)
 *   RECV    the request message: the small RPCs answer at once; ModelInfer
 *           parses (grpc_messages.c), submits every row to the scheduler,
 *           and the last row's on_done - on the engine thread, which must
 *           not block, and start_batch does not - sends the answer
 *   SENT    SEND_INITIAL_METADATA + SEND_MESSAGE + SEND_STATUS_FROM_SERVER done
 *   CLOSED  cancelled: the rows still running are cancelled (sched_cancel
 *           frees their KV sequence at the next step boundary)
 *
 * ModelStreamInfer calls read and write many messages: grpc_stream.c (its
 * WRITE tag is one SEND_MESSAGE). The messages of ModelInfer and
 * ModelStreamInfer are parsed, encoded and submitted by GRPC_WORKERS
 * threads of their own (workq.h), not by cq_main: an encode takes time in
 * proportion to its text (up to the tokenizer's regex work limit), and
 * cq_main serves every other call. A stream's next message is read only
 * once its last was submitted, so a stream's messages stay in order. Connections come from grpc_listen.c's
 * thread, which accepts them and hands them to the server.
 *
 * Invariants of an rpc:
 *   R1. refs counts the tags and flows still to come: the CLOSED batch, and
 *       the main flow (RECV .. SENT); the rpc is freed when both ended.
 *   R2. rows_left = rows still running + 1 while ModelInfer is submitting;
 *       whoever takes it to 0 (the submitter or an on_done) sends the answer,
 *       exactly once.
 *   R3. every rpc allocated is counted in live_rpcs; drain (frontend.h) waits
 *       for live_rpcs == 0 before shutting the completion queue down, so no
 *       on_done can reach a freed server.
 */
#define _GNU_SOURCE
#include "grpc_server.h"

#include <errno.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../engine/base/util.h"
#include "../kserve.h"
#include "../workq.h"
#include "grpc_call.h"
#include "grpc_listen.h"
#include "grpc_messages.h"

/* ---- rpc life ------------------------------------------------------------------- */

static rpc *rpc_new(grpc_front *g)
{
    rpc *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->g = g;
    r->t_new = (rpc_tag){TAG_NEW, r};
    r->t_recv = (rpc_tag){TAG_RECV, r};
    r->t_sent = (rpc_tag){TAG_SENT, r};
    r->t_closed = (rpc_tag){TAG_CLOSED, r};
    r->t_write = (rpc_tag){TAG_WRITE, r};
    grpc_call_details_init(&r->details);
    grpc_metadata_array_init(&r->md);
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_lock(&g->mu);
    g->live_rpcs++;
    pthread_mutex_unlock(&g->mu);
    return r;
}

static void rpc_free(rpc *r)
{
    grpc_front *g = r->g;
    bool arrived = r->arrived;
    if (r->stream) rpc_stream_free(r);
    if (r->call) grpc_call_unref(r->call);
    grpc_call_details_destroy(&r->details);
    grpc_metadata_array_destroy(&r->md);
    if (r->recv) grpc_byte_buffer_destroy(r->recv);
    if (r->send) grpc_byte_buffer_destroy(r->send);
    if (r->has_details) grpc_slice_unref(r->status_details);
    if (r->rows)
        for (int i = 0; i < r->kr.n_rows; i++) free(r->rows[i].tokens), free(r->rows[i].logits);
    if (r->texts)
        for (int i = 0; i < r->kr.n_rows; i++) text_stream_free(r->texts[i].ts), sb_free(&r->texts[i].text);
    free(r->texts);
    free(r->rows);
    free(r->sid);
    free(r->refs_of);
    free(r->model);
    kserve_request_free(&r->kr);
    if (g->budget) req_budget_give(g->budget, &r->mem, r->mem);
    pthread_mutex_destroy(&r->mu);
    free(r);
    pthread_mutex_lock(&g->mu);
    g->live_rpcs--;
    if (arrived) g->live_calls--;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->mu);
}

void rpc_unref(rpc *r)
{
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left == 0) rpc_free(r);
}

/* Asks gRPC for the next call (the CQ thread, or start). */
static void request_next_call(grpc_front *g)
{
    rpc *r = rpc_new(g);
    if (!r) {
        fprintf(stderr, "ferry: grpc: out of memory: no further calls accepted\n");
        return;
    }
    RPC_TAG_RELEASE(&r->t_new);
    grpc_call_error ce = grpc_server_request_call(g->server, &r->call, &r->details, &r->md, g->cq, g->cq, &r->t_new);
    if (ce != GRPC_CALL_OK) {
        fprintf(stderr, "ferry: grpc: request_call failed (%d)\n", (int)ce);
        rpc_free(r);
    }
}

/* ---- answering ------------------------------------------------------------------ */

/* Ends the main flow: body (malloc'd, taken over; NULL with an error) and
 * the status. The answer's batch holds the main flow's reference (R1). */
void rpc_count(const rpc *r, grpc_status_code code)
{
    if (r->g->counters) metrics_count_request(r->g->counters, r->endpoint ? r->endpoint : "grpc_other", (int)code);
}

void rpc_observe_queue(const rpc *r, double seconds)
{
    if (r->g->counters) metrics_observe_queue(r->g->counters, seconds);
}

void rpc_finish(rpc *r, grpc_status_code code, const char *msg, uint8_t *body, size_t len)
{
    rpc_count(r, code);
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (body) {
        grpc_slice sl = grpc_slice_new(body, len, free);
        r->send = grpc_raw_byte_buffer_create(&sl, 1);
        grpc_slice_unref(sl);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = r->send;
    }
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = code;
    if (msg && *msg) {
        r->status_details = grpc_slice_from_copied_string(msg);
        r->has_details = true;
        ops[n].data.send_status_from_server.status_details = &r->status_details;
    }
    n++;
    if (rpc_batch(r, ops, n, &r->t_sent) != GRPC_CALL_OK) rpc_unref(r);
}

bool rpc_mem_take(rpc *r, uint64_t n, char *busy, size_t cap)
{
    if (!r->g->budget || req_budget_take(r->g->budget, &r->mem, n)) return true;
    req_budget_busy_msg(r->g->budget, busy, cap);
    return false;
}

static void rpc_fail(rpc *r, ferry_status st, const char *msg)
{
    rpc_finish(r, grpc_status_of(st), msg, NULL, 0);
}

static void rpc_answer(rpc *r, ferry_status st, uint8_t *body, size_t len)
{
    if (st != FERRY_OK) rpc_fail(r, st, ferry_errmsg());
    else rpc_finish(r, GRPC_STATUS_OK, NULL, body, len);
}

/* ---- ModelInfer ----------------------------------------------------------------- */

/* All rows ended (R2): the answer, on whichever thread took rows_left to 0. */
static void infer_finish(rpc *r)
{
    if (r->st != FERRY_OK) {
        rpc_fail(r, r->st, r->msg);
        return;
    }
    if (r->client_gone) {
        rpc_finish(r, GRPC_STATUS_CANCELLED, "cancelled", NULL, 0);
        return;
    }
    uint8_t *body = NULL;
    size_t len = 0;
    ferry_status st = grpc_infer_response(&r->kr, r->g->model_name, r->rows, r->g->lim.vocab, &body, &len);
    rpc_answer(r, st, body, len);
}

static void on_token(void *user, int32_t token, int index)
{
    (void)index; /* unary: the answer waits for on_done; a text row's stream is fed here */
    struct row_ref *ref = user;
    rpc *r = ref->r;
    if (!r->texts) return;
    pthread_mutex_lock(&r->mu);
    struct rpc_text *t = &r->texts[ref->row];
    bool stop = !t->stopped && text_stream_push(t->ts, token, &t->text);
    if (stop) t->stopped = true;
    pthread_mutex_unlock(&r->mu);
    /* the engine thread is alive, so the scheduler is; sid[row] was set before the row could run */
    if (stop) sched_cancel(r->s, r->sid[ref->row]);
}

static void on_done(void *user, ferry_status st, const char *msg, const gen_result *res)
{
    struct row_ref *ref = user;
    rpc *r = ref->r;
    kserve_row *row = &r->rows[ref->row];
    if (st == FERRY_OK && !res->cancelled) rpc_observe_queue(r, res->queue_s);
    pthread_mutex_lock(&r->mu);
    if (st == FERRY_OK && kserve_row_keep(row, res) != FERRY_OK)
        st = FERRY_ERR_NOMEM, msg = "out of memory for a response";
    bool stopped = false;
    if (st == FERRY_OK && r->texts) {
        struct rpc_text *t = &r->texts[ref->row];
        text_stream_end(t->ts, &t->text);
        if (t->text.oom || text_stream_failed(t->ts)) st = FERRY_ERR_NOMEM, msg = "out of memory for a response's text";
        row->text = t->text.data;
        row->text_len = t->text.len;
        /* output_ids beside the text: up to the stop string, not what ran on before the cancel */
        if (row->n_tokens > text_stream_tokens(t->ts)) row->n_tokens = text_stream_tokens(t->ts);
        stopped = t->stopped;
    }
    if (st != FERRY_OK && r->st == FERRY_OK) {
        r->st = st;
        snprintf(r->msg, sizeof r->msg, "%s", msg && *msg ? msg : ferry_status_name(st));
    }
    if (st == FERRY_OK && res->cancelled && !stopped) r->client_gone = true;
    bool last = --r->rows_left == 0;
    pthread_mutex_unlock(&r->mu);
    if (last) infer_finish(r);
}

/* Cancels the rows submitted so far (the scheduler runs: drain
 * comes before sched_free). */
static void cancel_rows(rpc *r)
{
    grpc_front *g = r->g;
    pthread_mutex_lock(&r->mu);
    int n = r->n_submitted;
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&g->mu);
    if (g->s)
        for (int i = 0; i < n; i++) sched_cancel(g->s, r->sid[i]);
    pthread_mutex_unlock(&g->mu);
}

/* The most a ModelInfer holds once parsed, taken before any row is
 * submitted so that nothing after can fail for memory: the request, its
 * results, and the answer, built whole (raw contents plus the message's
 * own fields). */
static uint64_t infer_held_bytes(const kserve_request *kr, int vocab, const text_model *tm)
{
    uint64_t rows = (uint64_t)kr->n_rows;
    uint64_t answer = rows * ((uint64_t)kr->gen.max_new_tokens * sizeof(int64_t) +
                              (kr->want_logits ? (uint64_t)vocab * sizeof(float) : 0)) + 4096;
    if (kr->text_out) { /* each row's text, held, and again in the answer */
        uint64_t text_row = (uint64_t)kr->gen.max_new_tokens * text_max_token_bytes(tm);
        answer += rows * (sizeof(struct rpc_text) + TEXT_STREAM_BYTES + text_stops_bytes(&kr->stops) + 2 * text_row + 4);
    }
    return kserve_held_bytes(kr, vocab) + answer;
}

/* A text answer: the prompts encoded (within the budget), each row's stream. */
static ferry_status text_start(rpc *r, const text_model *tm, const engine_limits *lim, char *busy, size_t cap)
{
    uint64_t hold = kserve_encode_bound(&r->kr, tm);
    if (!rpc_mem_take(r, hold, busy, cap)) return FERRY_ERR_BUSY;
    ferry_status st = tm ? kserve_encode_text(&r->kr, tm, lim) : ferry_fail(FERRY_ERR_UNSUPPORTED, "text: no text model");
    if (r->g->budget) req_budget_give(r->g->budget, &r->mem, hold);
    if (st != FERRY_OK) {
        snprintf(busy, cap, "%s", ferry_errmsg());
        return st;
    }
    return FERRY_OK;
}

static void model_infer(rpc *r, const uint8_t *buf, size_t len)
{
    grpc_front *g = r->g;
    pthread_mutex_lock(&g->mu);
    sched *s = g->s;
    engine_limits lim = g->lim;
    const text_model *tm = g->tm;
    pthread_mutex_unlock(&g->mu);
    if (!s) {
        rpc_finish(r, GRPC_STATUS_UNAVAILABLE, "model not ready", NULL, 0);
        return;
    }
    /* the message is held while it is parsed, and the parse takes its own */
    char busy[160];
    if (!rpc_mem_take(r, len, busy, sizeof busy)) {
        rpc_finish(r, GRPC_STATUS_RESOURCE_EXHAUSTED, busy, NULL, 0);
        return;
    }
    ferry_status st = grpc_infer_parse(buf, len, &lim, g->budget, &r->kr, &r->model);
    if (g->budget) req_budget_give(g->budget, &r->mem, len);
    if (r->model && strcmp(r->model, g->model_name)) {
        char m[FERRY_MSG_MAX];
        snprintf(m, sizeof m, "model '%.200s' not found (this server serves '%s')", r->model, g->model_name);
        rpc_fail(r, FERRY_ERR_NOT_FOUND, m);
        return;
    }
    if (st != FERRY_OK) {
        rpc_fail(r, st, ferry_errmsg());
        return;
    }
    if (r->kr.text_out && (st = text_start(r, tm, &lim, busy, sizeof busy)) != FERRY_OK) {
        if (st == FERRY_ERR_BUSY) rpc_finish(r, GRPC_STATUS_RESOURCE_EXHAUSTED, busy, NULL, 0);
        else rpc_fail(r, st, busy);
        return;
    }
    if (!rpc_mem_take(r, infer_held_bytes(&r->kr, lim.vocab, tm), busy, sizeof busy)) {
        rpc_finish(r, GRPC_STATUS_RESOURCE_EXHAUSTED, busy, NULL, 0);
        return;
    }
    int n = r->kr.n_rows;
    r->rows = calloc((size_t)n, sizeof *r->rows);
    r->sid = calloc((size_t)n, sizeof *r->sid);
    r->refs_of = calloc((size_t)n, sizeof *r->refs_of);
    if (!r->rows || !r->sid || !r->refs_of || (r->kr.text_out && !(r->texts = calloc((size_t)n, sizeof *r->texts)))) {
        rpc_fail(r, FERRY_ERR_NOMEM, "out of memory");
        return;
    }
    for (int i = 0; r->texts && i < n; i++) {
        gen_request p = kserve_row_request(&r->kr, i);
        if ((st = text_stream_new(tm, &p, &r->kr.stops, &r->texts[i].ts)) != FERRY_OK) {
            rpc_fail(r, st, ferry_errmsg());
            return;
        }
    }
    char msg[FERRY_MSG_MAX] = "";
    pthread_mutex_lock(&r->mu);
    r->rows_left = n + 1; /* R2: the submitter's share */
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&g->mu); /* held while submitting: the scheduler outlives it */
    r->s = g->s;
    if (!g->s) { /* detached (drain waits for the calls, so only if that changes) */
        st = FERRY_ERR_BUSY;
        snprintf(msg, sizeof msg, "model not ready");
    } else if (n > sched_max_queued(g->s)) {
        /* could never be queued whole: a client error, not a retryable one */
        st = FERRY_ERR_INVALID;
        snprintf(msg, sizeof msg, "the request holds %d prompts but the server queues at most %d (--max-queued)", n,
                 sched_max_queued(g->s));
    }
    sched_callbacks cb = {on_token, on_done};
    for (int i = 0; i < n && st == FERRY_OK; i++) {
        r->refs_of[i] = (struct row_ref){r, i};
        gen_request p = kserve_row_request(&r->kr, i);
        st = sched_submit(g->s, &p, &cb, &r->refs_of[i], &r->sid[i]);
        if (st != FERRY_OK) {
            snprintf(msg, sizeof msg, "%s", ferry_errmsg());
            break;
        }
        pthread_mutex_lock(&r->mu);
        r->n_submitted = i + 1;
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_unlock(&g->mu);
    pthread_mutex_lock(&r->mu);
    if (st != FERRY_OK) {
        r->rows_left -= n - r->n_submitted;
        if (r->st == FERRY_OK) {
            r->st = st;
            snprintf(r->msg, sizeof r->msg, "%s", msg);
        }
    }
    bool last = --r->rows_left == 0;
    pthread_mutex_unlock(&r->mu);
    if (st != FERRY_OK) cancel_rows(r); /* they end with on_done(cancelled); the answer is the failure */
    if (last) infer_finish(r);
}

/* ---- dispatch ------------------------------------------------------------------- */

static bool method_is(const rpc *r, const char *name)
{
    size_t n = GRPC_SLICE_LENGTH(r->details.method), k = strlen(SERVICE), m = strlen(name);
    const char *p = (const char *)GRPC_SLICE_START_PTR(r->details.method);
    return n == k + m && !memcmp(p, SERVICE, k) && !memcmp(p + k, name, m);
}

/* ModelReady, ModelMetadata, ModelConfig, ModelStatistics: the model
 * named, or NOT_FOUND. ModelStatistics (any_name) takes an empty name too:
 * every model, as Triton. */
static bool model_ref(rpc *r, const uint8_t *buf, size_t len, bool any_name)
{
    char *name, *version;
    ferry_status st = grpc_model_ref_parse(buf, len, &name, &version);
    if (st != FERRY_OK) {
        rpc_fail(r, st, ferry_errmsg());
        return false;
    }
    char m[FERRY_MSG_MAX] = "";
    if (strcmp(name, r->g->model_name) && !(any_name && !*name))
        snprintf(m, sizeof m, "model '%.200s' not found (this server serves '%s')", name, r->g->model_name);
    else if (*version && strcmp(version, KSERVE_MODEL_VERSION))
        snprintf(m, sizeof m, "model version '%.200s' not found (the one version is " KSERVE_MODEL_VERSION ")", version);
    free(name);
    free(version);
    if (*m) rpc_fail(r, FERRY_ERR_NOT_FOUND, m);
    return !*m;
}

static void dispatch(rpc *r, const uint8_t *buf, size_t len)
{
    grpc_front *g = r->g;
    pthread_mutex_lock(&g->mu);
    bool loaded = g->s != NULL;
    /* ready as REST's /v2/health/ready: loaded, and sched_healthy */
    sched_stats stats = loaded ? sched_get_stats(g->s) : (sched_stats){0};
    bool ready = loaded && sched_healthy(&stats);
    int vocab = g->lim.vocab, max_seqs = g->lim.max_seqs;
    pthread_mutex_unlock(&g->mu);
    uint8_t *body = NULL;
    size_t blen = 0;
    ferry_status st;
    /* each answer's body is built before rpc_answer reads body and blen */
    if (method_is(r, "ModelInfer")) {
        model_infer(r, buf, len);
    } else if (method_is(r, "ServerLive")) {
        st = grpc_bool_response(GRPC_MSG_LIVE, 1, &body, &blen);
        rpc_answer(r, st, body, blen);
    } else if (method_is(r, "ServerReady")) {
        st = grpc_bool_response(GRPC_MSG_READY, ready, &body, &blen);
        rpc_answer(r, st, body, blen);
    } else if (method_is(r, "ServerMetadata")) {
        st = grpc_server_metadata_response(&body, &blen);
        rpc_answer(r, st, body, blen);
    } else if (method_is(r, "ModelReady")) {
        if (!model_ref(r, buf, len, false)) return;
        st = grpc_bool_response(GRPC_MSG_MODEL_READY, ready, &body, &blen);
        rpc_answer(r, st, body, blen);
    } else if (method_is(r, "ModelMetadata")) {
        if (!model_ref(r, buf, len, false)) return;
        if (!loaded) {
            rpc_finish(r, GRPC_STATUS_UNAVAILABLE, "model not ready", NULL, 0);
            return;
        }
        st = grpc_model_metadata_response(g->model_name, vocab, &body, &blen);
        rpc_answer(r, st, body, blen);
    } else if (method_is(r, "ModelConfig") || method_is(r, "ModelStatistics")) {
        bool config = method_is(r, "ModelConfig");
        if (!model_ref(r, buf, len, !config)) return;
        if (!loaded) {
            rpc_finish(r, GRPC_STATUS_UNAVAILABLE, "model not ready", NULL, 0);
            return;
        }
        if (config) {
            kserve_config c;
            kserve_config_fill(&c, g->model_name, vocab, max_seqs);
            st = grpc_model_config_response(&c, &body, &blen);
        } else {
            kserve_stats k;
            kserve_stats_fill(&k, &stats);
            st = grpc_model_stats_response(g->model_name, &k, &body, &blen);
        }
        rpc_answer(r, st, body, blen);
    } else {
        char m[512];
        snprintf(m, sizeof m, "method %.*s is not implemented", (int)GRPC_SLICE_LENGTH(r->details.method),
                 (const char *)GRPC_SLICE_START_PTR(r->details.method));
        rpc_finish(r, GRPC_STATUS_UNIMPLEMENTED, m, NULL, 0);
    }
}

/* ---- the completion-queue thread ------------------------------------------------ */

static void on_new_call(rpc *r, bool ok)
{
    grpc_front *g = r->g;
    if (!ok) { /* the server is shutting down: this request will not be served */
        rpc_free(r);
        return;
    }
    pthread_mutex_lock(&g->mu);
    r->arrived = true;
    g->live_calls++;
    pthread_mutex_unlock(&g->mu);
    request_next_call(g);
    r->refs = 2; /* R1: CLOSED and the main flow */
    grpc_op close_op;
    memset(&close_op, 0, sizeof close_op);
    close_op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    close_op.data.recv_close_on_server.cancelled = &r->cancelled;
    if (rpc_batch(r, &close_op, 1, &r->t_closed) != GRPC_CALL_OK) r->refs--;
    grpc_op recv_op;
    memset(&recv_op, 0, sizeof recv_op);
    recv_op.op = GRPC_OP_RECV_MESSAGE;
    recv_op.data.recv_message.recv_message = &r->recv;
    if (rpc_batch(r, &recv_op, 1, &r->t_recv) != GRPC_CALL_OK) rpc_unref(r);
}

/* The metrics' endpoint names of the methods (literals: metrics keeps them). */
static const char *endpoint_of(const rpc *r)
{
    static const char *const k_methods[][2] = {
        {"ServerLive", "grpc_server_live"},         {"ServerReady", "grpc_server_ready"},
        {"ServerMetadata", "grpc_server_metadata"}, {"ModelMetadata", "grpc_model_metadata"},
        {"ModelReady", "grpc_model_ready"},         {"ModelInfer", "grpc_model_infer"},
        {"ModelStreamInfer", "grpc_model_stream_infer"}, {"ModelConfig", "grpc_model_config"},
        {"ModelStatistics", "grpc_model_statistics"}};
    for (size_t i = 0; i < sizeof k_methods / sizeof k_methods[0]; i++)
        if (method_is(r, k_methods[i][0])) return k_methods[i][1];
    return "grpc_other";
}

/* ---- the workers ---------------------------------------------------------------- */

typedef struct work_item {
    rpc *r;            /* its main flow's reference (R1) is the item's until it is handled */
    grpc_slice msg;
    bool stream;
} work_item;

static void work_handle(rpc *r, grpc_slice msg, bool stream)
{
    if (stream) rpc_stream_message(r, GRPC_SLICE_START_PTR(msg), GRPC_SLICE_LENGTH(msg));
    else dispatch(r, GRPC_SLICE_START_PTR(msg), GRPC_SLICE_LENGTH(msg));
    grpc_slice_unref(msg);
}

static void work_run(void *arg)
{
    work_item *w = arg;
    work_handle(w->r, w->msg, w->stream);
    free(w);
}

/* Hands the message to a worker, which owns msg from here; handled here
 * when there is no worker or no memory for the item (workq_post). */
static void work_post(rpc *r, grpc_slice msg, bool stream)
{
    work_item *w = malloc(sizeof *w);
    if (!w) {
        work_handle(r, msg, stream);
        return;
    }
    *w = (work_item){r, msg, stream};
    workq_post(r->g->work, work_run, w);
}

static void on_recv(rpc *r, bool ok)
{
    if (!r->endpoint) r->endpoint = endpoint_of(r);
    bool stream = r->stream || method_is(r, "ModelStreamInfer");
    if (stream && !r->stream && rpc_stream_init(r) != FERRY_OK) {
        rpc_finish(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory", NULL, 0);
        return;
    }
    if (!ok || !r->recv) {
        if (stream) rpc_stream_read_end(r); /* half-closed, or the call ended */
        else if (!ok) rpc_unref(r);         /* the call ended before its message came */
        else rpc_finish(r, GRPC_STATUS_INVALID_ARGUMENT, "no request message", NULL, 0);
        return;
    }
    grpc_byte_buffer_reader rd;
    bool readable = grpc_byte_buffer_reader_init(&rd, r->recv);
    grpc_slice sl = readable ? grpc_byte_buffer_reader_readall(&rd) : grpc_empty_slice();
    if (readable) grpc_byte_buffer_reader_destroy(&rd);
    grpc_byte_buffer_destroy(r->recv);
    r->recv = NULL;
    if (!stream && !readable) {
        rpc_finish(r, GRPC_STATUS_INVALID_ARGUMENT, "unreadable request message", NULL, 0);
        grpc_slice_unref(sl);
    } else if (stream || method_is(r, "ModelInfer")) {
        work_post(r, sl, stream);
    } else {
        work_handle(r, sl, false);
    }
}

static void on_closed(rpc *r)
{
    if (r->stream) {
        rpc_stream_closed(r);
        rpc_unref(r);
        return;
    }
    bool running = false;
    pthread_mutex_lock(&r->mu);
    if (r->cancelled && r->rows_left > 0) running = r->client_gone = true;
    pthread_mutex_unlock(&r->mu);
    if (running) cancel_rows(r);
    rpc_unref(r);
}

static void *cq_main(void *arg)
{
    grpc_front *g = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(g->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
        if (ev.type != GRPC_OP_COMPLETE) continue;
        RPC_TAG_ACQUIRE(ev.tag); /* rpc_batch */
        rpc_tag *t = ev.tag;
        switch (t->kind) {
        case TAG_NEW: on_new_call(t->r, ev.success); break;
        case TAG_RECV: on_recv(t->r, ev.success); break;
        case TAG_SENT: rpc_unref(t->r); break;
        case TAG_CLOSED: on_closed(t->r); break;
        case TAG_WRITE: rpc_stream_written(t->r, ev.success); break;
        case TAG_SHUTDOWN:
            pthread_mutex_lock(&g->mu);
            g->shutdown_done = true;
            pthread_cond_broadcast(&g->cond);
            pthread_mutex_unlock(&g->mu);
            break;
        }
    }
    return NULL;
}

/* ---- start and stop ------------------------------------------------------------- */

static void stop(void *self);

/* Triton's keepalive settings (README); core's listener also set the
 * accepted sockets' TCP_USER_TIMEOUT to the keepalive timeout, and so does
 * grpc_listen.c */
#define KEEPALIVE_TIME_MS 7200000
#define KEEPALIVE_TIMEOUT_MS 20000

ferry_status grpc_front_start(const grpc_front_opts *o, grpc_front **out)
{
    grpc_front *g = calloc(1, sizeof *g);
    if (!g || !(g->model_name = strdup(o->model_name))) {
        free(g);
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    grpc_listen_opts lo = {.host = o->host,
                           .port = o->port,
                           .max_conns = o->max_connections,
                           .max_conns_per_ip = o->max_connections_per_ip,
                           .preface_timeout_s = o->request_timeout_s,
                           .user_timeout_ms = KEEPALIVE_TIMEOUT_MS};
    ferry_status lst = grpc_listener_open(&lo, &g->listener);
    if (lst != FERRY_OK) {
        free(g->model_name);
        free(g);
        return lst;
    }
    g->port = grpc_listener_port(g->listener);
    g->counters = o->counters;
    g->budget = o->budget;
    const char *qmax = getenv("FERRY_GRPC_STREAM_QUEUE_MAX");
    g->stream_queue_max = qmax && *qmax ? strtoull(qmax, NULL, 10) : GRPC_STREAM_QUEUE_MAX;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cond, NULL);
    g->shutdown_tag = (rpc_tag){TAG_SHUTDOWN, NULL};
    grpc_init();
    h2_limits lim = {.max_block = o->max_header > UINT32_MAX ? UINT32_MAX : (uint32_t)o->max_header,
                     .max_continuations = H2_MAX_CONTINUATIONS,
                     .resets_per_s = (uint32_t)o->max_resets};
    ferry_status rst = grpc_relay_start(&lim, &g->relay);
    if (rst != FERRY_OK) {
        grpc_listener_stop(g->listener);
        free(g->model_name);
        free(g);
        return rst;
    }
    int max_msg = o->max_message > INT_MAX ? INT_MAX : (int)o->max_message;
    int max_meta = o->max_header > INT_MAX ? INT_MAX : (int)o->max_header;
    int idle_ms = o->connection_timeout_s > INT_MAX / 1000 ? INT_MAX : o->connection_timeout_s * 1000;
    /* No GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS: core's handshake runs only in
     * its own listener; grpc_listen.c holds a connection to --request-timeout
     * until its preface came. No GRPC_ARG_MAX_CONNECTION_AGE_MS either: idle
     * connections go after --connection-timeout, and an age limit's grace
     * would cut a long generation (docs/limits.md).
     * Compression: identity only. Core 1.51 inflates a compressed message
     * whole before it checks its size (a 1 MiB gzip of zeros is 1 GiB); with
     * the algorithm disabled it fails the call (UNIMPLEMENTED, "Compression
     * algorithm 'gzip' is disabled") when its metadata arrives, before any
     * message is read. Clients that compress by default fall back to
     * identity: core's grpc-accept-encoding says identity only. */
    struct {
        const char *key;
        int value;
    } k_args[] = {
        {GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, max_msg},
        {GRPC_ARG_MAX_CONCURRENT_STREAMS, o->max_streams},
        {GRPC_ARG_MAX_CONNECTION_IDLE_MS, idle_ms},
        {GRPC_ARG_KEEPALIVE_TIME_MS, KEEPALIVE_TIME_MS},
        {GRPC_ARG_KEEPALIVE_TIMEOUT_MS, KEEPALIVE_TIMEOUT_MS},
        {GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0},
        {GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 300000},
        {GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2},
        {GRPC_ARG_MAX_METADATA_SIZE, max_meta},
        {GRPC_COMPRESSION_CHANNEL_ENABLED_ALGORITHMS_BITSET, 1 << GRPC_COMPRESS_NONE},
    };
    enum { N_ARGS = sizeof k_args / sizeof k_args[0] };
    grpc_arg args[N_ARGS];
    for (int i = 0; i < N_ARGS; i++)
        args[i] = (grpc_arg){.type = GRPC_ARG_INTEGER, .key = (char *)k_args[i].key, .value.integer = k_args[i].value};
    grpc_channel_args ca = {N_ARGS, args};
    g->server = grpc_server_create(&ca, NULL);
    g->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(g->server, g->cq, NULL);
    grpc_server_start(g->server); /* no port of core's: grpc_listen.c hands it the connections */
    request_next_call(g);
    if (pthread_create(&g->thread, NULL, cq_main, g) != 0) {
        /* not reached in practice; leave the process to exit */
        return ferry_fail(FERRY_ERR_IO, "grpc: cannot start the completion-queue thread");
    }
    g->work = workq_new(GRPC_WORKERS, "ferry-grpc-work"); /* without: the CQ thread handles the messages (work_post) */
    *out = g;
    if (grpc_listener_start(g->listener, g->server, g->relay) != FERRY_OK) {
        stop(g); /* keeps the listener's message */
        *out = NULL;
        return FERRY_ERR_IO;
    }
    return FERRY_OK;
}

int grpc_front_port(const grpc_front *g) { return g->port; }

/* ---- the front end's life cycle (frontend.h) ------------------------------------ */

static void attach(void *self, engine *e, sched *sc, const text_model *tm)
{
    grpc_front *g = self;
    pthread_mutex_lock(&g->mu);
    g->e = e;
    g->s = sc;
    g->tm = tm;
    g->lim = engine_get_limits(e);
    pthread_mutex_unlock(&g->mu);
}

static void quiesce(void *self)
{
    grpc_front *g = self;
    if (g->quiesced) return;
    g->quiesced = true;
    g->quiesced_at = util_now();
    grpc_listener_stop(g->listener); /* no new connections; core's get its GOAWAY below */
    grpc_server_shutdown_and_notify(g->server, g->cq, &g->shutdown_tag);
}

static void drain(void *self, double deadline)
{
    grpc_front *g = self;
    quiesce(g);
    if (g->drained) return;
    g->drained = true;
    /* the monotonic deadline as the realtime clock the condition waits on */
    double left = deadline - util_now();
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    if (left > 0) {
        until.tv_sec += (time_t)left;
        until.tv_nsec += (long)((left - (double)(time_t)left) * 1e9);
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&g->mu);
    while (!g->shutdown_done && pthread_cond_timedwait(&g->cond, &g->mu, &until) != ETIMEDOUT) {}
    bool late = !g->shutdown_done;
    int running = g->live_calls;
    pthread_mutex_unlock(&g->mu);
    if (late) {
        /* with no call running the shutdown is merely on its way (no
         * grace: a failed start): nothing to say */
        if (running > 0)
            fprintf(stderr, "ferry: grpc: %d call%s still running after %.0f s: cancelled\n", running,
                    running == 1 ? "" : "s", util_now() - g->quiesced_at);
        grpc_server_cancel_all_calls(g->server);
    }
    pthread_mutex_lock(&g->mu);
    while (!g->shutdown_done || g->live_rpcs > 0) pthread_cond_wait(&g->cond, &g->mu); /* R3 */
    pthread_mutex_unlock(&g->mu);
}

static void detach(void *self)
{
    grpc_front *g = self;
    pthread_mutex_lock(&g->mu);
    g->e = NULL;
    g->s = NULL;
    pthread_mutex_unlock(&g->mu);
}

static void stop(void *self)
{
    grpc_front *g = self;
    drain(g, 0); /* drained already, or never attached: nothing to wait for */
    workq_free(g->work); /* no item is left: each holds a live rpc */
    grpc_server_destroy(g->server);
    grpc_relay_stop(g->relay); /* after core's GOAWAYs and last answers went through it */
    grpc_completion_queue_shutdown(g->cq);
    pthread_join(g->thread, NULL); /* it drains the queue to GRPC_QUEUE_SHUTDOWN */
    grpc_completion_queue_destroy(g->cq);
    grpc_shutdown();
    pthread_cond_destroy(&g->cond);
    pthread_mutex_destroy(&g->mu);
    free(g->model_name);
    free(g);
}

static const frontend_ops k_grpc_frontend = {"grpc", attach, quiesce, drain, detach, stop};

frontend grpc_frontend(grpc_front *g) { return (frontend){&k_grpc_frontend, g}; }
