/*
 * grpc_stream.c - ModelStreamInfer, Triton's decoupled bidirectional
 * stream: the client sends ModelInferRequests (one prompt each, input_ids
 * [1,T] or text_input [1]) whenever it likes; each is submitted to the scheduler at once, so
 * several requests of one stream run and interleave; every generated token
 * is one ModelStreamInferResponse with the request's id, output_ids
 * INT64 [1,1], and parameter triton_final_response, true on the request's
 * last token. A request that fails (bad message, queue full, a failed step)
 * gets one response with error_message; the stream stays open for the
 * others. The call ends with status OK once the client has half-closed,
 * every request has ended and every response is written.
 *
 * A request of text (text_input, or text_output asked for) is answered
 * with text instead: each response is text_output BYTES [1] holding the
 * text that became final since the last one (the tokenizer's streaming
 * decoder, then the stop strings: text that may begin one is held back),
 * sent once there is some; the final response carries what was held back
 * (possibly nothing). A stop string ends the request early, and that
 * cancel is not the client's: the final response follows, no error.
 *
 * The final flag needs to know a token is the last before sending it, and
 * the scheduler says so only in on_done: each request holds back its latest
 * token (stream_req.held) and sends it when the next one comes (final =
 * false) or in on_done (final = true).
 *
 * gRPC allows one SEND_MESSAGE in flight per call: responses wait in a
 * queue, and whoever finds no write in flight (the engine thread in
 * on_token/on_done, the CQ thread when a write completes) starts the next.
 * Everything of a stream is guarded by rpc.mu; start_batch never calls back
 * into ferry, so it is started with the lock held.
 *
 * Invariants (with R1 of grpc_server.c: the main flow's reference is
 * dropped when the status batch completes):
 *   S1. the status is sent once, and only when reading ended, no request
 *       is active (in the scheduler), the queue is empty and no write is in
 *       flight - so no callback can touch the rpc after it is freed.
 *   S2. once the call is gone (a write failed, or the client cancelled),
 *       responses are dropped and the active requests cancelled.
 *   S3. memory (budget.h): a request takes, before it is submitted, what it
 *       holds and what its responses will hold; each response moves its
 *       share of that into r->mem until it is written (anything beyond the
 *       reservation - an error response - is taken unconditionally: it is
 *       small, and S4 bounds how many can wait).
 *   S4. a client that does not read its responses stops being read: while
 *       more than g->stream_queue_max bytes wait, no new request is read, so
 *       error responses to a flood of bad requests cannot pile up.
 */
#define _GNU_SOURCE
#include <grpc/byte_buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc_call.h"
#include "grpc_messages.h"

#define STREAM_MSG_BYTES 320 /* one token response in memory, id and model name aside */

typedef struct out_msg {
    struct out_msg *next;
    grpc_byte_buffer *bb;
    uint64_t mem;            /* of the request budget, held in r->mem until written */
} out_msg;

typedef struct stream_req {
    rpc *r;
    struct stream_req *next; /* the stream's active requests */
    kserve_request kr;
    uint64_t sid;
    int32_t held;            /* the latest token, not sent yet */
    bool has_held;
    text_stream *ts;         /* a request of text: its text so far (NULL: ids) */
    bool stopped;            /* a stop string ended it */
    sched *s;                /* where it was submitted (alive while it runs) */
    uint64_t mem;            /* reserved for the request and its responses (S3) */
} stream_req;

struct grpc_stream {
    out_msg *head, *tail;    /* responses waiting for the write in flight */
    grpc_byte_buffer *writing; /* the write in flight, NULL: none */
    uint64_t writing_mem;
    uint64_t queued;         /* bytes of the responses queued or being written (S4) */
    bool meta_sent, reading_done, status_started, gone;
    bool read_paused;        /* S4: no read started while the client reads too slowly */
    int active;              /* requests in the scheduler */
    stream_req *reqs;
};

ferry_status rpc_stream_init(rpc *r)
{
    r->stream = calloc(1, sizeof *r->stream);
    return r->stream ? FERRY_OK : ferry_fail(FERRY_ERR_NOMEM, "out of memory");
}

void rpc_stream_free(rpc *r)
{
    struct grpc_stream *s = r->stream;
    for (out_msg *m = s->head, *next; m; m = next) {
        next = m->next;
        grpc_byte_buffer_destroy(m->bb);
        free(m);
    }
    if (s->writing) grpc_byte_buffer_destroy(s->writing);
    free(s);
    r->stream = NULL;
}

/* ---- writing (all with r->mu held) ---------------------------------------------- */

/* A response written or dropped: its memory back to the budget (S3). */
static void msg_done(rpc *r, uint64_t mem)
{
    r->stream->queued -= mem;
    if (r->g->budget) req_budget_give(r->g->budget, &r->mem, mem);
    else r->mem -= mem;
}

/* What request q has left of its reservation goes back (S3). */
static void req_done(rpc *r, stream_req *q)
{
    if (r->g->budget) {
        r->mem += q->mem;
        req_budget_give(r->g->budget, &r->mem, q->mem);
    }
    q->mem = 0;
}

/* Starts the next write, or the status when the stream is over (S1).
 * Returns true when the main flow's reference must be dropped (the status
 * batch could not start) - by the caller, after unlocking. */
static bool settle(rpc *r)
{
    struct grpc_stream *s = r->stream;
    if (s->gone) /* S2 */
        while (s->head) {
            out_msg *m = s->head;
            s->head = m->next;
            grpc_byte_buffer_destroy(m->bb);
            msg_done(r, m->mem);
            free(m);
        }
    if (!s->head) s->tail = NULL;
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!s->meta_sent) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (s->head && !s->writing) {
        out_msg *m = s->head;
        s->head = m->next;
        if (!s->head) s->tail = NULL;
        s->writing = m->bb;
        s->writing_mem = m->mem;
        free(m);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = s->writing;
        s->meta_sent = true;
        if (rpc_batch(r, ops, n, &r->t_write) != GRPC_CALL_OK) {
            grpc_byte_buffer_destroy(s->writing);
            s->writing = NULL;
            msg_done(r, s->writing_mem);
            s->gone = true;
            return settle(r);
        }
        return false;
    }
    if (s->reading_done && s->active == 0 && !s->writing && !s->head && !s->status_started) {
        s->status_started = s->meta_sent = true;
        ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[n++].data.send_status_from_server.status = GRPC_STATUS_OK;
        return rpc_batch(r, ops, n, &r->t_sent) != GRPC_CALL_OK;
    }
    return false;
}

/* Queues a response (body malloc'd, taken over; NULL with st: nothing),
 * its memory moved from q's reservation (S3; q NULL: none). */
static void push(rpc *r, stream_req *q, ferry_status st, uint8_t *body, size_t len)
{
    struct grpc_stream *s = r->stream;
    if (st != FERRY_OK || s->gone) {
        if (st != FERRY_OK) fprintf(stderr, "ferry: grpc: a stream response is lost: %s\n", ferry_errmsg());
        free(body);
        return;
    }
    out_msg *m = malloc(sizeof *m);
    if (!m) {
        free(body);
        fprintf(stderr, "ferry: grpc: out of memory: a stream response is lost\n");
        return;
    }
    grpc_slice sl = grpc_slice_new(body, len, free);
    m->bb = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    m->next = NULL;
    m->mem = len + STREAM_MSG_BYTES;
    uint64_t moved = q && q->mem < m->mem ? q->mem : q ? m->mem : 0;
    if (q) q->mem -= moved;
    r->mem += moved;
    if (r->g->budget && m->mem > moved) req_budget_force(r->g->budget, &r->mem, m->mem - moved);
    else if (m->mem > moved) r->mem += m->mem - moved;
    s->queued += m->mem;
    if (s->tail) s->tail->next = m;
    else s->head = m;
    s->tail = m;
}

static void push_error(rpc *r, stream_req *q, const char *msg, const char *id)
{
    uint8_t *body = NULL;
    size_t len = 0;
    ferry_status st = grpc_stream_error_response(msg, r->g->model_name, id, &body, &len);
    push(r, q, st, body, len);
}

static void push_token(rpc *r, stream_req *q, const int32_t *token, bool final)
{
    uint8_t *body = NULL;
    size_t len = 0;
    ferry_status st = grpc_stream_token_response(r->g->model_name, q->kr.id, token, final, &body, &len);
    push(r, q, st, body, len);
}

static void push_text(rpc *r, stream_req *q, const strbuf *text, bool final)
{
    uint8_t *body = NULL;
    size_t len = 0;
    ferry_status st = text->oom ? ferry_fail(FERRY_ERR_NOMEM, "out of memory")
                                : grpc_stream_text_response(r->g->model_name, q->kr.id, text->data ? text->data : "",
                                                            text->len, final, &body, &len);
    push(r, q, st, body, len);
}

/* ---- the scheduler's callbacks (engine thread) ---------------------------------- */

static void stream_on_token(void *user, int32_t token, int index)
{
    (void)index;
    stream_req *q = user;
    rpc *r = q->r;
    bool stop = false;
    pthread_mutex_lock(&r->mu);
    if (q->ts) {
        strbuf delta;
        sb_init(&delta);
        stop = !q->stopped && text_stream_push(q->ts, token, &delta);
        q->stopped |= stop;
        if (delta.len || delta.oom) push_text(r, q, &delta, false);
        sb_free(&delta);
    } else {
        if (q->has_held) push_token(r, q, &q->held, false);
        q->held = token;
        q->has_held = true;
    }
    bool drop = settle(r);
    pthread_mutex_unlock(&r->mu);
    /* the engine thread is alive, so the scheduler is; q->sid was set before the request could run */
    if (stop) sched_cancel(q->s, q->sid);
    if (drop) rpc_unref(r);
}

static void stream_on_done(void *user, ferry_status st, const char *msg, const gen_result *res)
{
    stream_req *q = user;
    rpc *r = q->r;
    struct grpc_stream *s = r->stream;
    if (st == FERRY_OK && !res->cancelled) rpc_observe_queue(r, res->queue_s);
    rpc_count(r, st != FERRY_OK ? grpc_status_of(st) : res->cancelled ? GRPC_STATUS_CANCELLED : GRPC_STATUS_OK);
    pthread_mutex_lock(&r->mu);
    if (st != FERRY_OK) {
        if (q->has_held) push_token(r, q, &q->held, false);
        push_error(r, q, msg && *msg ? msg : ferry_status_name(st), q->kr.id);
    } else if (res->cancelled && !q->stopped) {
        push_error(r, q, "cancelled", q->kr.id);
    } else if (q->ts) {
        strbuf rest;
        sb_init(&rest);
        text_stream_end(q->ts, &rest);
        if (text_stream_failed(q->ts) || rest.oom) push_error(r, q, "out of memory for a response's text", q->kr.id);
        else push_text(r, q, &rest, true);
        sb_free(&rest);
    } else {
        push_token(r, q, q->has_held ? &q->held : NULL, true);
    }
    for (stream_req **p = &s->reqs; *p; p = &(*p)->next)
        if (*p == q) {
            *p = q->next;
            break;
        }
    s->active--;
    req_done(r, q);
    bool drop = settle(r);
    pthread_mutex_unlock(&r->mu);
    text_stream_free(q->ts);
    kserve_request_free(&q->kr);
    free(q);
    if (drop) rpc_unref(r);
}

/* ---- the CQ thread's events ----------------------------------------------------- */

/* Reads the next request; a read that cannot start ends the reading. */
static void read_next(rpc *r)
{
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &r->recv;
    if (rpc_batch(r, &op, 1, &r->t_recv) != GRPC_CALL_OK) rpc_stream_read_end(r);
}

/* One request of the stream: submitted, or answered with its error. */
static void submit(rpc *r, const uint8_t *buf, size_t len)
{
    grpc_front *g = r->g;
    char err[FERRY_MSG_MAX] = "";
    grpc_status_code code = GRPC_STATUS_INVALID_ARGUMENT; /* of err, for the metrics */
    stream_req *q = calloc(1, sizeof *q);
    char *model = NULL;
    pthread_mutex_lock(&g->mu);
    engine_limits lim = g->lim;
    bool ready = g->s != NULL;
    const text_model *tm = g->tm;
    pthread_mutex_unlock(&g->mu);
    ferry_status st = FERRY_OK;
    if (!q) code = GRPC_STATUS_RESOURCE_EXHAUSTED, snprintf(err, sizeof err, "out of memory");
    else if (!ready) code = GRPC_STATUS_UNAVAILABLE, snprintf(err, sizeof err, "model not ready");
    else {
        /* the message is held while it is parsed, and the parse takes its own */
        pthread_mutex_lock(&r->mu);
        bool held = rpc_mem_take(r, len, err, sizeof err);
        pthread_mutex_unlock(&r->mu);
        if (!held) code = GRPC_STATUS_RESOURCE_EXHAUSTED;
        else if ((st = grpc_infer_parse(buf, len, &lim, g->budget, &q->kr, &model)) != FERRY_OK)
            code = grpc_status_of(st), snprintf(err, sizeof err, "%s", ferry_errmsg());
        pthread_mutex_lock(&r->mu);
        if (held && g->budget) req_budget_give(g->budget, &r->mem, len);
        pthread_mutex_unlock(&r->mu);
    }
    if (model && strcmp(model, g->model_name)) { /* NOT_FOUND first, as ModelInfer */
        code = GRPC_STATUS_NOT_FOUND;
        snprintf(err, sizeof err, "model '%.200s' not found (this server serves '%s')", model, g->model_name);
    }
    free(model);
    if (!*err && q->kr.text_out) { /* the prompt encoded (within the budget), and the request's text stream */
        uint64_t hold = kserve_encode_bound(&q->kr, tm);
        if (g->budget && !req_budget_take(g->budget, &q->mem, hold)) {
            code = GRPC_STATUS_RESOURCE_EXHAUSTED;
            req_budget_busy_msg(g->budget, err, sizeof err);
        } else {
            st = tm ? kserve_encode_text(&q->kr, tm, &lim) : ferry_fail(FERRY_ERR_UNSUPPORTED, "text: no text model");
            if (st == FERRY_OK && q->kr.n_rows == 1) {
                gen_request p = kserve_row_request(&q->kr, 0);
                st = text_stream_new(tm, &p, &q->kr.stops, &q->ts);
            }
            if (st != FERRY_OK) code = grpc_status_of(st), snprintf(err, sizeof err, "%s", ferry_errmsg());
            if (g->budget) req_budget_give(g->budget, &q->mem, hold);
        }
    }
    if (!*err && q->kr.n_rows != 1)
        snprintf(err, sizeof err, "ModelStreamInfer takes one prompt per request (input_ids [1, T] or text_input [1]; "
                 "got %d)", q->kr.n_rows);
    if (!*err && q->kr.want_logits) snprintf(err, sizeof err, "ModelStreamInfer streams output_ids only (no logits)");
    if (!*err && g->budget) { /* S3 */
        uint64_t per_msg = STREAM_MSG_BYTES + strlen(g->model_name) + (q->kr.id ? strlen(q->kr.id) : 0);
        uint64_t want = kserve_held_bytes(&q->kr, lim.vocab) + ((uint64_t)q->kr.gen.max_new_tokens + 1) * per_msg;
        if (q->ts) /* the stream's state, and the text its responses carry */
            want += TEXT_STREAM_BYTES + text_stops_bytes(&q->kr.stops) +
                    (uint64_t)q->kr.gen.max_new_tokens * text_max_token_bytes(tm) + TEXT_MAX_STOP_BYTES;
        if (!req_budget_take(g->budget, &q->mem, want)) {
            code = GRPC_STATUS_RESOURCE_EXHAUSTED;
            req_budget_busy_msg(g->budget, err, sizeof err);
        }
    }
    if (!*err) {
        q->r = r;
        pthread_mutex_lock(&r->mu); /* active before on_done can run */
        r->stream->active++;
        q->next = r->stream->reqs;
        r->stream->reqs = q;
        pthread_mutex_unlock(&r->mu);
        sched_callbacks cb = {stream_on_token, stream_on_done};
        gen_request p = kserve_row_request(&q->kr, 0);
        pthread_mutex_lock(&g->mu); /* the scheduler outlives the lock (the front end drains first) */
        q->s = g->s;
        st = sched_submit(g->s, &p, &cb, q, &q->sid);
        if (st == FERRY_OK) {
            /* S2: a worker submits, so the call may have gone meanwhile */
            pthread_mutex_lock(&r->mu);
            bool gone = r->stream->gone;
            pthread_mutex_unlock(&r->mu);
            if (gone) sched_cancel(g->s, q->sid);
        }
        pthread_mutex_unlock(&g->mu);
        if (st == FERRY_OK) return;
        code = grpc_status_of(st);
        snprintf(err, sizeof err, "%s", ferry_errmsg());
        pthread_mutex_lock(&r->mu);
        r->stream->reqs = q->next; /* still first: only this thread adds */
        r->stream->active--;
        pthread_mutex_unlock(&r->mu);
    }
    rpc_count(r, code);
    char *id = q && q->kr.id ? strdup(q->kr.id) : grpc_infer_peek_id(buf, len);
    if (q) text_stream_free(q->ts), kserve_request_free(&q->kr);
    pthread_mutex_lock(&r->mu);
    if (q) req_done(r, q);
    free(q);
    push_error(r, NULL, err, id);
    bool drop = settle(r);
    pthread_mutex_unlock(&r->mu);
    free(id);
    if (drop) rpc_unref(r);
}

/* S4, with r->mu held: a paused stream resumes reading once its client has
 * caught up (true: the caller starts the read, unlocked), or stops reading
 * when the call is gone (no read is pending). */
static bool unpause(rpc *r)
{
    struct grpc_stream *s = r->stream;
    if (!s->read_paused || (!s->gone && s->queued > r->g->stream_queue_max / 2)) return false;
    s->read_paused = false;
    if (!s->gone) return true;
    s->reading_done = true;
    return false;
}

void rpc_stream_message(rpc *r, const uint8_t *buf, size_t len)
{
    submit(r, buf, len);
    pthread_mutex_lock(&r->mu);
    struct grpc_stream *s = r->stream;
    bool pause = !s->gone && s->queued > r->g->stream_queue_max; /* S4 */
    s->read_paused = pause;
    pthread_mutex_unlock(&r->mu);
    if (!pause) read_next(r);
}

void rpc_stream_read_end(rpc *r)
{
    pthread_mutex_lock(&r->mu);
    r->stream->reading_done = true;
    bool drop = settle(r);
    pthread_mutex_unlock(&r->mu);
    if (drop) rpc_unref(r);
}

/* Cancels the stream's sequences sids[0..n) and frees sids (r->mu not
 * held: the scheduler takes its own lock). */
static void cancel_sids(rpc *r, uint64_t *sids, int n)
{
    if (n) { /* S2 */
        pthread_mutex_lock(&r->g->mu);
        if (r->g->s)
            for (int i = 0; i < n; i++) sched_cancel(r->g->s, sids[i]);
        pthread_mutex_unlock(&r->g->mu);
    }
    free(sids);
}

void rpc_stream_written(rpc *r, bool ok)
{
    struct grpc_stream *s = r->stream;
    pthread_mutex_lock(&r->mu);
    grpc_byte_buffer_destroy(s->writing);
    s->writing = NULL;
    msg_done(r, s->writing_mem);
    if (!ok) s->gone = true;
    bool resume = unpause(r);
    bool drop = settle(r);
    int n = 0;
    uint64_t *sids = NULL;
    if (!ok && s->active > 0 && (sids = malloc((size_t)s->active * sizeof *sids)))
        for (stream_req *q = s->reqs; q; q = q->next) sids[n++] = q->sid;
    pthread_mutex_unlock(&r->mu);
    cancel_sids(r, sids, n);
    if (resume) read_next(r);
    if (drop) rpc_unref(r);
}

void rpc_stream_closed(rpc *r)
{
    struct grpc_stream *s = r->stream;
    int n = 0;
    uint64_t *sids = NULL;
    pthread_mutex_lock(&r->mu);
    if (r->cancelled) {
        s->gone = true;
        if (s->active > 0 && (sids = malloc((size_t)s->active * sizeof *sids)))
            for (stream_req *q = s->reqs; q; q = q->next) sids[n++] = q->sid;
    }
    unpause(r); /* gone: no read is pending, reading ends */
    bool drop = settle(r);
    pthread_mutex_unlock(&r->mu);
    cancel_sids(r, sids, n);
    if (drop) rpc_unref(r);
}
