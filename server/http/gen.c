/*
 * gen.c - a generation over HTTP: parse, submit, collect, answer; see
 * gen.h. The protocol's own steps are its gen_proto's; what is here is
 * the same for all of them.
 *
 * A request's rows run on the engine thread, whose callbacks (on_token,
 * on_done) never block: they append to the request's results and events
 * under its lock and wake its connection (listener.c's suspend/resume
 * invariant). Each row submitted holds a reference on the request until
 * its on_done; `rows_left` counts the rows still to end, and the request is
 * busy (http_req_set_busy) while any does.
 *
 * Text answers (OpenAI, KServe with text_input or text_output): each row
 * has a text_stream, fed in on_token and ended in on_done under the lock;
 * a row whose stop string matched is cancelled from on_token, and its
 * on_done (cancelled) counts as a normal end, not as a client that left.
 * Streamed rows append their deltas as events; the others collect their
 * text until the answer is written whole.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen.h"

typedef struct gen_call gen_call;

typedef struct {
    gen_call *g;
    int row;
} row_ref;

struct gen_call {
    http_req *rq;
    const gen_proto *p;
    http_server *srv;
    const char *model;           /* the served name (the server's, outliving the request) */
    void *req;                   /* the protocol's parse */
    uint64_t encode_held;        /* of the request's budget: the parse's encodes, until the parse is done */
    /* fixed once submitted */
    int n_rows;
    int vocab;
    bool streaming;              /* answered as server-sent events */
    const text_model *tm;        /* a text answer: the server's text model, else NULL */
    sched *s;                    /* the scheduler the rows went to */
    uint64_t *sid;               /* [n_rows] scheduler ids, valid below n_submitted */
    row_ref *refs_of;            /* [n_rows] callback user pointers */

    /* under the request's lock (http_req_lock) */
    int n_submitted;
    int rows_left;
    bool done;                   /* every row ended */
    kserve_row *rows;            /* [n_rows] */
    ferry_status st;             /* the first failure */
    char msg[256];
    bool cancelled;
    int n_events;
    gen_text *texts;             /* [n_rows] when the answer is text */
    strbuf delta;                /* a streamed row's text from one callback */
};

void gen_refuse(gen_refusal *no, ferry_status st)
{
    memset(no, 0, sizeof *no);
    no->status = kserve_http_status(st);
    snprintf(no->msg, sizeof no->msg, "%s", ferry_errmsg());
}

/* ---- the work's life (http_work_ops) ---------------------------------------------- */

/* The request's lock not held (sched_cancel takes the scheduler's). */
static void cancel_rows(gen_call *g)
{
    http_req_lock(g->rq);
    int n = g->n_submitted;
    http_req_unlock(g->rq);
    for (int i = 0; i < n; i++) sched_cancel(g->s, g->sid[i]);
}

/* The error event that ends a stream which already sent events. Lock held. */
static void stream_error(gen_call *g)
{
    g->p->write_error(http_req_out(g->rq), kserve_http_status(g->st), g->msg);
}

/* The client left, or the connection completed: free the rows' places -
 * while the scheduler they went to is the server's (detach comes before
 * sched_free). */
static void work_cancel(http_req *rq)
{
    gen_call *g = http_req_work(rq);
    const api_model *m = api_hold(g->srv);
    if (m->s && m->s == g->s) cancel_rows(g);
    api_release(g->srv);
}

static void work_abort(http_req *rq, const char *why)
{
    gen_call *g = http_req_work(rq);
    if (g->st == FERRY_OK) {
        g->st = FERRY_ERR_INTERNAL;
        snprintf(g->msg, sizeof g->msg, "%s", why);
        if (g->streaming && g->n_events > 0) stream_error(g);
    }
    g->done = true;
    http_req_set_busy(rq, false); /* as when its last row ends */
}

static void work_free(void *arg)
{
    gen_call *g = arg;
    if (g->rows)
        for (int i = 0; i < g->n_rows; i++) {
            free(g->rows[i].tokens);
            free(g->rows[i].logits);
        }
    if (g->texts)
        for (int i = 0; i < g->n_rows; i++) {
            text_stream_free(g->texts[i].ts);
            sb_free(&g->texts[i].text);
        }
    free(g->texts);
    sb_free(&g->delta);
    if (g->req) g->p->free(g->req);
    free(g->rows);
    free(g->sid);
    free(g->refs_of);
    free(g);
}

static const http_work_ops k_gen_work = {work_cancel, work_abort, work_free};

/* ---- scheduler callbacks (engine thread) ------------------------------------------ */

/* A streamed text row's delta (with its finish reason at the end) as an
 * event. Lock held. */
static void text_event(gen_call *g, int row, text_finish finish)
{
    if (!http_req_open(g->rq) || http_req_gone(g->rq) || g->st != FERRY_OK) return;
    g->p->write_text(http_req_out(g->rq), g->req, g->model, row, g->delta.data, g->delta.len, finish);
    g->n_events++;
    http_req_wake(g->rq);
}

/* A text row's token; true when a stop string ended the row. Lock held. */
static bool text_token(gen_call *g, int row, int32_t token)
{
    gen_text *t = &g->texts[row];
    g->delta.len = 0;
    bool stop = text_stream_push(t->ts, token, g->streaming ? &g->delta : &t->text);
    if (g->streaming && g->delta.len) text_event(g, row, TEXT_FINISH_NONE);
    t->stopped |= stop;
    return stop;
}

/* A text row ended: what its stream held back, and why it ended. Lock held. */
static void text_end(gen_call *g, int row)
{
    gen_text *t = &g->texts[row];
    g->delta.len = 0;
    t->finish = text_stream_end(t->ts, g->streaming ? &g->delta : &t->text);
    t->n_tokens = text_stream_tokens(t->ts);
    if (g->streaming) text_event(g, row, t->finish);
}

static void on_token(void *user, int32_t token, int index)
{
    row_ref *ref = user;
    gen_call *g = ref->g;
    bool cancel = false, stop = false;
    http_req_lock(g->rq);
    cancel = http_req_check_peer(g->rq);
    if (g->texts) {
        stop = text_token(g, ref->row, token);
    } else if (g->streaming && http_req_open(g->rq) && !http_req_gone(g->rq)) {
        g->p->write_token(http_req_out(g->rq), g->req, g->model, token, index);
        g->n_events++;
        http_req_wake(g->rq);
    }
    http_req_unlock(g->rq);
    /* the engine thread is alive, so the scheduler is: no server lock needed
     * (and taking it here could deadlock against sched_free) */
    if (cancel) cancel_rows(g);
    else if (stop) sched_cancel(g->s, g->sid[ref->row]); /* sid[row] was set before the row could run */
}

static void on_done(void *user, ferry_status st, const char *msg, const gen_result *res)
{
    row_ref *ref = user;
    gen_call *g = ref->g;
    http_req *rq = g->rq;
    kserve_row *row = &g->rows[ref->row];
    if (st == FERRY_OK && !res->cancelled) metrics_observe_queue(http_req_counters(rq), res->queue_s);
    http_req_lock(rq);
    if (st == FERRY_OK && kserve_row_keep(row, res) != FERRY_OK)
        st = FERRY_ERR_NOMEM, msg = "out of memory for a response";
    if (st == FERRY_OK && g->texts) {
        gen_text *t = &g->texts[ref->row];
        text_end(g, ref->row);
        /* output_ids beside the text: the tokens up to the stop string, not
         * those generated before the cancel took effect */
        if (row->n_tokens > t->n_tokens) row->n_tokens = t->n_tokens;
        if (text_stream_failed(t->ts) || t->text.oom) st = FERRY_ERR_NOMEM, msg = "out of memory for a response's text";
    }
    if (st != FERRY_OK && g->st == FERRY_OK) {
        g->st = st;
        snprintf(g->msg, sizeof g->msg, "%s", msg && *msg ? msg : ferry_status_name(st));
        if (g->streaming && g->n_events > 0) stream_error(g);
    }
    if (res->cancelled && !(g->texts && g->texts[ref->row].stopped)) g->cancelled = true;
    if (--g->rows_left == 0) {
        g->done = true;
        http_req_set_busy(rq, false);
        if (g->p->write_end && g->streaming && http_req_open(rq) && !http_req_gone(rq) &&
            (g->st == FERRY_OK || g->n_events > 0)) {
            int tokens = 0;
            for (int i = 0; i < g->n_rows; i++) tokens += g->texts[i].n_tokens;
            g->p->write_end(http_req_out(rq), g->req, g->model, g->st == FERRY_OK, tokens);
            g->n_events++;
        }
        http_req_end(rq);
    }
    http_req_unlock(rq);
    http_req_unref(rq);
}

/* ---- answering -------------------------------------------------------------------- */

static bool reply_refusal(http_req *rq, const gen_refusal *no)
{
    return http_reply_fail(rq, no->status, no->msg, no->param, no->code, NULL, NULL);
}

/* Answers once every row ended (or, streaming, once the first event is
 * there), else suspends until a callback resumes the connection. */
bool gen_resume(http_req *rq)
{
    gen_call *g = http_req_work(rq);
    http_req_lock(rq);
    bool ready = g->done || (g->streaming && g->n_events > 0);
    if (!ready) {
        http_req_sleep(rq);
        http_req_unlock(rq);
        return true;
    }
    bool events = g->n_events > 0;
    http_req_unlock(rq);
    if (g->streaming && events) return http_reply_events(rq);
    /* done: rows, st, msg, cancelled are final */
    if (g->st != FERRY_OK) return http_reply_error(rq, kserve_http_status(g->st), g->msg);
    /* cancelled: the client went away; 499 (nginx's "client closed request") only shows in the metrics */
    if (g->cancelled) return http_reply_error(rq, 499, "request cancelled");
    if (g->streaming) return http_reply_error(rq, 500, "internal error: a stream ended without tokens");
    gen_outcome o = {g->req, g->model, g->vocab, g->n_rows, g->rows, g->texts};
    return g->p->write_whole(rq, &o);
}

/* ---- starting ----------------------------------------------------------------------- */

/* Per-row text streams, and a stream's first events (chat's role chunks).
 * Lock not needed: no row runs yet. */
static ferry_status text_rows_start(gen_call *g)
{
    if (!(g->texts = calloc((size_t)g->n_rows, sizeof *g->texts))) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    for (int i = 0; i < g->n_rows; i++) {
        gen_request r = g->p->row(g->req, i);
        FERRY_TRY(text_stream_new(g->tm, &r, g->p->stops(g->req), &g->texts[i].ts));
    }
    if (g->streaming && g->p->write_start) {
        strbuf *out = http_req_out(g->rq);
        g->p->write_start(out, g->req, g->model);
        if (out->oom) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        g->n_events = out->len > 0;
    }
    return FERRY_OK;
}

/* Submits every row; on a failure, cancels those queued and says why
 * (the answer is the caller's). */
static ferry_status submit(gen_call *g, char *msg, size_t cap)
{
    http_req *rq = g->rq;
    int n = g->n_rows;
    sched_callbacks cb = {on_token, on_done};
    http_req_lock(rq);
    g->rows_left = n;
    http_req_set_busy(rq, true);
    http_req_unlock(rq);
    ferry_status st = FERRY_OK;
    const api_model *m = api_hold(g->srv);
    g->s = m->s;
    if (!g->s) st = FERRY_ERR_BUSY, snprintf(msg, cap, "model not ready");
    if (st == FERRY_OK && n > sched_max_queued(g->s)) {
        /* could never be queued whole: a client error, not a retryable 503 */
        st = FERRY_ERR_INVALID;
        snprintf(msg, cap, g->p->too_many_rows, n, sched_max_queued(g->s));
    }
    for (int i = 0; i < n && st == FERRY_OK; i++) {
        g->refs_of[i] = (row_ref){g, i};
        gen_request r = g->p->row(g->req, i);
        http_req_ref(rq); /* on_done may run before sched_submit returns */
        st = sched_submit(g->s, &r, &cb, &g->refs_of[i], &g->sid[i]);
        if (st != FERRY_OK) http_req_unref(rq); /* MHD's reference keeps rq alive */
        http_req_lock(rq);
        if (st == FERRY_OK) g->n_submitted = i + 1;
        http_req_unlock(rq);
        if (st != FERRY_OK) snprintf(msg, cap, "%s", ferry_errmsg());
    }
    if (st != FERRY_OK) {
        http_req_lock(rq);
        g->rows_left -= n - g->n_submitted;
        if (g->rows_left == 0) {
            g->done = true;
            http_req_set_busy(rq, false);
            http_req_end(rq);
        }
        http_req_unlock(rq);
        /* the rows already queued end with on_done(cancelled); nobody waits for them */
        if (g->s) cancel_rows(g);
    }
    api_release(g->srv);
    return st;
}

bool gen_answer(http_req *rq)
{
    const gen_proto *p = http_req_arg(rq);
    http_server *srv = http_req_ctx(rq);
    gen_call *g = calloc(1, sizeof *g);
    if (!g) return http_reply_error(rq, 503, "out of memory");
    g->rq = rq;
    g->p = p;
    g->srv = srv;
    g->model = api_name(srv);
    sb_init(&g->delta);
    http_req_set_work(rq, g, &k_gen_work);

    const api_model *m = api_hold(srv);
    bool loaded = m->s != NULL;
    engine_limits lim = m->lim;
    const text_model *tm = m->tm;
    api_release(srv);
    if (!loaded) return http_reply_error(rq, 503, "model not ready");
    if (http_req_draining(rq)) return http_reply_error(rq, 503, "server shutting down");
    g->tm = tm; /* outlives the server's requests (http_server.h) */
    g->vocab = lim.vocab;
    gen_env env = {g->model, tm, &lim};
    gen_refusal no;
    if (p->check && !p->check(rq, &no)) return reply_refusal(rq, &no);

    /* the parse may hold up to parse_hold of the body's size */
    size_t len;
    const char *body = http_req_body(rq, &len);
    uint64_t parse = p->parse_hold(len);
    char msg[256];
    if (parse > http_req_limit(rq)) {
        snprintf(msg, sizeof msg, "a body of %zu bytes may need %llu bytes to parse, more than --request-memory (%llu)",
                 len, (unsigned long long)parse, (unsigned long long)http_req_limit(rq));
        return http_reply_error(rq, 413, msg);
    }
    if (!http_req_take(rq, parse)) return http_reply_busy(rq);
    bool parsed = p->parse(rq, &env, body, len, &g->req, &no);
    http_req_give(rq, parse + g->encode_held);
    g->encode_held = 0;
    http_req_body_free(rq);
    if (!parsed || (p->prepare && !p->prepare(rq, &env, g->req, &no))) return reply_refusal(rq, &no);
    if (!p->text(g->req)) g->tm = NULL; /* an answer of ids */
    int n = g->n_rows = p->n_rows(g->req);
    g->streaming = p->streaming(g->req);
    uint64_t answer = p->answer_bytes(g->req, &env, n, g->tm ? text_max_token_bytes(g->tm) : 0);
    if (g->tm && answer > http_req_limit(rq)) { /* could never be had: the client must ask for less */
        snprintf(msg, sizeof msg, "the answer may need %llu bytes (tokens x choices), more than --request-memory (%llu): "
                 "ask for fewer tokens", (unsigned long long)answer, (unsigned long long)http_req_limit(rq));
        return http_reply_fail(rq, 413, msg, p->tokens_param, NULL, NULL, NULL);
    }
    if (!http_req_take(rq, answer)) return http_reply_busy(rq);
    g->sid = calloc((size_t)n, sizeof *g->sid);
    g->refs_of = calloc((size_t)n, sizeof *g->refs_of);
    g->rows = calloc((size_t)n, sizeof *g->rows);
    if (!g->sid || !g->refs_of || !g->rows) return http_reply_error(rq, 503, "out of memory");
    ferry_status st;
    if (g->tm && (st = text_rows_start(g)) != FERRY_OK) return http_reply_error(rq, kserve_http_status(st), ferry_errmsg());
    if ((st = submit(g, msg, sizeof msg)) != FERRY_OK) return http_reply_error(rq, kserve_http_status(st), msg);
    return http_req_run(rq);
}

int gen_hold(void *arg, uint64_t n, char *msg, size_t cap)
{
    http_req *rq = arg;
    gen_call *g = http_req_work(rq);
    int status = http_req_take_more(rq, n, "parsing and encoding the prompt", msg, cap);
    if (status == 0) g->encode_held += n;
    return status;
}
