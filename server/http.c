/*
 * http.c - routes, request bodies and the request life cycle on
 * libmicrohttpd (MHD). See http.h; the protocols themselves are in
 * kserve.c (KServe v2, Triton's generate) and openai.c (/v1), the text
 * they share in text.c.
 *
 * Threads. MHD runs a small pool of connection threads (poll: see http_server_start); each connection
 * is handled by one of them at a time, so the access handler, the stream
 * reader and the completion callback of one request never run at once. A
 * POST's work once its body is in (parse, chat template, encode, submit;
 * /tokenize) runs on PREP_THREADS prep workers (prep_start), its
 * connection suspended meanwhile, so a slow encode never stalls the other
 * connections of an MHD thread. The engine thread runs the scheduler
 * callbacks. Nothing here blocks on the engine.
 *
 * Request life cycle (struct request, one per HTTP request):
 *
 *   RECEIVING --body complete--> answered at once (GET, errors)
 *       |
 *       +--POST--> PREPARING (prep worker) --error--> answered on resume
 *                      |
 *                      +--rows submitted--> RUNNING --done (or first token)--> answered
 *                                              ^  |                            (STREAMING)
 *                                              +--+ suspended until resumed
 *
 * Suspend/resume invariant: `suspended` is set, and MHD_suspend_connection
 * called, by the connection's MHD thread with rq->mu held, only when there
 * is nothing to send yet; whoever makes progress (a callback with a token
 * or the end) clears it and calls MHD_resume_connection under the same
 * mutex. So a resume always follows its suspend, and a suspended request
 * always has a scheduler callback still to come (sched_free guarantees
 * on_done for everything queued). MHD does not watch a suspended socket, so
 * a client that went away is noticed in on_token by peeking at the socket
 * (safe: MHD neither reads nor closes a suspended connection), which
 * cancels the rows; a streamed one is also noticed when the next write
 * fails. Either way MHD's completion callback cancels what still runs.
 *
 * Text answers (OpenAI, generate with text_input): each row has a
 * text_stream, fed in on_token and ended in on_done under rq->mu; a row
 * whose stop string matched is cancelled from on_token, and its on_done
 * (cancelled) counts as a normal end, not as a client that left. Streamed
 * rows append their deltas to rq->out as events; the others collect their
 * text until the answer is written whole.
 *
 * Lifetime: a request is reference counted - one reference for MHD (dropped
 * in the completion callback), one per row submitted to the scheduler
 * (dropped after its on_done), one for a stream response's reader (dropped
 * when MHD destroys the response) - and freed by whoever drops the last.
 */
#define _GNU_SOURCE
#include "http.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../engine/base/util.h"
#include "kserve.h"
#include "mhd_common.h"
#include "openai.h"
#include "text.h"
#include "workq.h"

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

#define WORKER_THREADS 4 /* MHD's: connections, heads, bodies, answers */
#define PREP_THREADS 2   /* parse, render, encode, submit (prep_start) */
#define STREAM_BLOCK 4096
#define STOP_GRACE_MS 2000
#define DRAIN_MIN (1u << 20) /* body bytes past --max-body read to answer 413 */

typedef enum {
    EP_LIVE,
    EP_READY,
    EP_SERVER_META,
    EP_MODEL_META,
    EP_MODEL_READY,
    EP_INFER,
    EP_GENERATE,
    EP_STREAM,
    EP_METRICS,
    EP_MODEL_CONFIG,
    EP_STATS,            /* /v2/models/stats and /v2/models/{m}/stats */
    EP_OAI_MODELS,       /* GET /v1/models */
    EP_OAI_COMPLETIONS,  /* POST /v1/completions */
    EP_OAI_CHAT,         /* POST /v1/chat/completions */
    EP_TOKENIZE,         /* POST /tokenize (llama.cpp's server) */
    EP_DETOKENIZE,       /* POST /detokenize */
    EP_OTHER,
} endpoint;

/* metrics labels */
static const char *const k_ep_name[] = {"health_live",     "health_ready", "server_metadata",
                                        "model_metadata",  "model_ready",  "infer",
                                        "generate",        "generate_stream", "metrics",
                                        "model_config",    "model_stats",  "openai_models",
                                        "completions",     "chat_completions", "tokenize",
                                        "detokenize",      "other"};

struct http_server {
    struct MHD_Daemon *d;
    char *name;
    uint64_t max_body;
    uint64_t max_header;     /* --max-header: the largest request head, checked in head_check */
    req_budget *budget;      /* --request-memory, shared with the gRPC front end */
    int request_timeout_s;   /* to receive a request's head and body */
    metrics *counters;
    bool log;                /* FERRY_HTTP_LOG set: print MHD's own messages (read once, at start) */
    int port;
    int active;              /* atomic: requests between their first call and completion */
    pthread_t reaper;        /* notices clients that left while their request waits */
    bool reaper_running;
    int reaper_stop;         /* atomic */
    pthread_mutex_t reg_mu;  /* guards the list of live requests */
    struct request *live;
    mhd_conns *conns;        /* open connections: the receive deadline (mhd_common.h) */
    pthread_rwlock_t lock;   /* guards e, s, lim: held (read) around every use */
    engine *e;
    sched *s;
    engine_limits lim;
    const text_model *tm;    /* the model's text files (a text_model is immutable) */
    int64_t attached_unix;   /* when the model became ready: /v1/models' created */
    int draining;            /* atomic: stopping; new requests get 503, ready says not */
    MHD_socket listen_fd;    /* after http_server_drain: the socket MHD no longer accepts on */
    pthread_rwlock_t work_lock; /* guards work: read to post, written to close it (http_server_stop) */
    workq *work;             /* PREP_THREADS threads: the POST endpoints' work (prep_start); NULL once stopped */
};

typedef enum { RQ_RECEIVING, RQ_PREPARING, RQ_RUNNING, RQ_STREAMING, RQ_ANSWERED } rq_state;

typedef struct request request;

typedef struct {
    request *rq;
    int row;
} row_ref;

/* One row of a text answer. */
typedef struct {
    text_stream *ts;
    strbuf text;                 /* not streamed: the text so far */
    text_finish finish;
    int n_tokens;
    bool stopped;                /* a stop string ended it: its cancel is not the client's */
} row_text;

struct request {
    http_server *srv;
    struct request *prev, *next; /* srv->live, under srv->reg_mu */
    endpoint ep;
    rq_state state;              /* the connection's MHD thread, or its prep worker while PREPARING */
    /* decided from the method and path; answered once the body is in */
    int early_code;
    const char *early_msg, *allow;
    char early_buf[160];
    bool openai_errors;          /* a /v1 path: errors in OpenAI's format */
    /* body */
    char *body;
    size_t len, cap;
    bool too_large, over_budget;
    bool raw_answered;           /* too_large midway: the 413 went out past MHD (refuse_midway) */
    uint64_t received;           /* body bytes received, kept or not */
    uint64_t mem;                /* bytes of the budget this request holds (MHD thread; last unref) */
    uint64_t encode_held;        /* of mem: the OpenAI prompts' encodes, until the parse is done */
    int64_t header_len;          /* Inference-Header-Content-Length (header_length), read before PREPARING */
    /* PREPARING: a prep worker's answer, queued by the MHD thread once resumed (prep_deliver) */
    bool on_worker;              /* respond() keeps its answer in pending instead of queueing it */
    bool prepared;               /* the worker is done: prep_deliver on the next call */
    struct MHD_Response *pending;
    unsigned pending_code;
    bool pending_fail;           /* the worker's step failed without an answer: close the connection */
    /* work: fixed once submitted */
    kserve_request kr;
    oai_request *oai;            /* the OpenAI endpoints' parse, else NULL */
    int n_rows;
    bool streaming;              /* answered as server-sent events */
    const text_model *tm;        /* a text answer: the server's text model, else NULL */
    sched *s;                    /* the scheduler the rows went to */
    uint64_t *sid;               /* [n_rows] scheduler ids, valid below n_submitted */
    row_ref *refs_of;            /* [n_rows] callback user pointers */

    pthread_mutex_t mu;          /* guards everything below */
    int refs;
    int n_submitted;
    struct MHD_Connection *conn; /* NULL once MHD completed the request (its thread writes it) */
    bool suspended;
    bool client_gone;
    int rows_left;
    bool done;                   /* every row ended */
    kserve_row *rows;            /* [n_rows] */
    ferry_status st;             /* the first failure */
    char msg[256];
    bool cancelled;
    strbuf out;                  /* stream: events not yet handed to MHD; infer: the current piece */
    size_t out_sent;
    int n_events;
    row_text *texts;             /* [n_rows] when the answer is text */
    strbuf delta;                /* a streamed row's text from one callback */
    kserve_infer_writer writer;  /* infer: the answer, piece by piece */
};

static void conn_mark(http_server *srv, struct MHD_Connection *c, bool receiving);

/* ---- request objects ------------------------------------------------------------ */

static request *request_new(http_server *srv, struct MHD_Connection *c)
{
    request *rq = calloc(1, sizeof *rq);
    if (!rq) return NULL;
    rq->srv = srv;
    rq->conn = c;
    rq->refs = 1; /* MHD's */
    __atomic_fetch_add(&srv->active, 1, __ATOMIC_RELAXED);
    pthread_mutex_init(&rq->mu, NULL);
    sb_init(&rq->out);
    pthread_mutex_lock(&srv->reg_mu);
    rq->next = srv->live;
    if (srv->live) srv->live->prev = rq;
    srv->live = rq;
    pthread_mutex_unlock(&srv->reg_mu);
    return rq;
}

/* ---- the request-memory budget ------------------------------------------------ */

/* Every byte held for a request - its body, its parse, its results and the
 * answer not yet sent - is taken from one budget (--request-memory) before
 * it is allocated; a request that cannot have it is answered 503. */
static bool mem_take(request *rq, uint64_t n) { return req_budget_take(rq->srv->budget, &rq->mem, n); }

static void mem_give(request *rq, uint64_t n) { req_budget_give(rq->srv->budget, &rq->mem, n); }

static void body_release(request *rq)
{
    mem_give(rq, rq->cap);
    free(rq->body);
    rq->body = NULL;
    rq->len = rq->cap = 0;
}

static void request_unref(request *rq)
{
    pthread_mutex_lock(&rq->mu);
    bool last = --rq->refs == 0;
    pthread_mutex_unlock(&rq->mu);
    if (!last) return;
    http_server *srv = rq->srv;
    pthread_mutex_lock(&srv->reg_mu);
    if (rq->prev) rq->prev->next = rq->next;
    else srv->live = rq->next;
    if (rq->next) rq->next->prev = rq->prev;
    pthread_mutex_unlock(&srv->reg_mu);
    body_release(rq);
    if (rq->pending) MHD_destroy_response(rq->pending); /* answered by a worker, but the client left first */
    if (rq->rows)
        for (int i = 0; i < rq->n_rows; i++) {
            free(rq->rows[i].tokens);
            free(rq->rows[i].logits);
        }
    if (rq->texts)
        for (int i = 0; i < rq->n_rows; i++) {
            text_stream_free(rq->texts[i].ts);
            sb_free(&rq->texts[i].text);
        }
    free(rq->texts);
    sb_free(&rq->delta);
    oai_request_free(rq->oai);
    free(rq->rows);
    free(rq->sid);
    free(rq->refs_of);
    kserve_request_free(&rq->kr);
    sb_free(&rq->out);
    mem_give(rq, rq->mem);
    pthread_mutex_destroy(&rq->mu);
    free(rq);
}

/* Both with rq->mu held; see the invariant at the top. */
static void conn_sleep(request *rq)
{
    rq->suspended = true;
    MHD_suspend_connection(rq->conn);
}

static void conn_wake(request *rq)
{
    if (!rq->suspended) return;
    rq->suspended = false;
    MHD_resume_connection(rq->conn);
}

/* Has the peer of a suspended connection closed or reset it? rq->mu held. */
static bool peer_gone(request *rq)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(rq->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* ---- scheduler callbacks (engine thread) ---------------------------------------- */

/* rq->mu not held (sched_cancel takes the scheduler's lock). */
static void cancel_rows(request *rq)
{
    pthread_mutex_lock(&rq->mu);
    int n = rq->n_submitted;
    pthread_mutex_unlock(&rq->mu);
    for (int i = 0; i < n; i++) sched_cancel(rq->s, rq->sid[i]);
}

/* The error event that ends a stream which already sent events. rq->mu held. */
static void stream_error(request *rq)
{
    if (rq->oai) oai_stream_error(&rq->out, kserve_http_status(rq->st), rq->msg);
    else kserve_stream_error(&rq->out, rq->msg);
}

/* A streamed text row's delta (with its finish reason at the end) as an
 * event. rq->mu held. */
static void text_event(request *rq, int row, text_finish finish)
{
    if (!rq->conn || rq->client_gone || rq->st != FERRY_OK) return;
    if (rq->oai) oai_stream_delta(&rq->out, rq->oai, rq->srv->name, row, rq->delta.data, rq->delta.len, finish);
    else kserve_text_event(&rq->out, rq->srv->name, rq->delta.data, rq->delta.len, finish);
    rq->n_events++;
    conn_wake(rq);
}

/* A text row's token; true when a stop string ended the row. rq->mu held. */
static bool text_token(request *rq, int row, int32_t token)
{
    row_text *t = &rq->texts[row];
    rq->delta.len = 0;
    bool stop = text_stream_push(t->ts, token, rq->streaming ? &rq->delta : &t->text);
    if (rq->streaming && rq->delta.len) text_event(rq, row, TEXT_FINISH_NONE);
    t->stopped |= stop;
    return stop;
}

/* A text row ended: what its stream held back, and why it ended. rq->mu held. */
static void text_end(request *rq, int row)
{
    row_text *t = &rq->texts[row];
    rq->delta.len = 0;
    t->finish = text_stream_end(t->ts, rq->streaming ? &rq->delta : &t->text);
    t->n_tokens = text_stream_tokens(t->ts);
    if (rq->streaming) text_event(rq, row, t->finish);
}

static void on_token(void *user, int32_t token, int index)
{
    row_ref *ref = user;
    request *rq = ref->rq;
    bool cancel = false, stop = false;
    pthread_mutex_lock(&rq->mu);
    if (rq->suspended && !rq->client_gone && peer_gone(rq)) cancel = rq->client_gone = true;
    if (rq->texts) {
        stop = text_token(rq, ref->row, token);
    } else if (rq->streaming && rq->conn && !rq->client_gone) {
        kserve_stream_event(&rq->out, rq->srv->name, token, index);
        rq->n_events++;
        conn_wake(rq);
    }
    pthread_mutex_unlock(&rq->mu);
    /* the engine thread is alive, so the scheduler is: no server lock needed
     * (and taking it here could deadlock against sched_free) */
    if (cancel) cancel_rows(rq);
    else if (stop) sched_cancel(rq->s, rq->sid[ref->row]); /* sid[row] was set before the row could run */
}

static void on_done(void *user, ferry_status st, const char *msg, const gen_result *res)
{
    row_ref *ref = user;
    request *rq = ref->rq;
    kserve_row *row = &rq->rows[ref->row];
    if (st == FERRY_OK && !res->cancelled) metrics_observe_queue(rq->srv->counters, res->queue_s);
    pthread_mutex_lock(&rq->mu);
    if (st == FERRY_OK && kserve_row_keep(row, res) != FERRY_OK)
        st = FERRY_ERR_NOMEM, msg = "out of memory for a response";
    if (st == FERRY_OK && rq->texts) {
        text_end(rq, ref->row);
        /* output_ids beside the text: the tokens up to the stop string, not
         * those generated before the cancel took effect */
        if (row->n_tokens > rq->texts[ref->row].n_tokens) row->n_tokens = rq->texts[ref->row].n_tokens;
        if (text_stream_failed(rq->texts[ref->row].ts) || rq->texts[ref->row].text.oom)
            st = FERRY_ERR_NOMEM, msg = "out of memory for a response's text";
    }
    if (st != FERRY_OK && rq->st == FERRY_OK) {
        rq->st = st;
        snprintf(rq->msg, sizeof rq->msg, "%s", msg && *msg ? msg : ferry_status_name(st));
        if (rq->streaming && rq->n_events > 0) stream_error(rq);
    }
    if (res->cancelled && !(rq->texts && rq->texts[ref->row].stopped)) rq->cancelled = true;
    if (--rq->rows_left == 0) {
        rq->done = true;
        if (rq->oai && rq->streaming && rq->conn && !rq->client_gone && (rq->st == FERRY_OK || rq->n_events > 0)) {
            int tokens = 0;
            for (int i = 0; i < rq->n_rows; i++) tokens += rq->texts[i].n_tokens;
            oai_stream_end(&rq->out, rq->oai, rq->srv->name, rq->st == FERRY_OK, tokens);
            rq->n_events++;
        }
        conn_wake(rq);
    }
    pthread_mutex_unlock(&rq->mu);
    request_unref(rq);
}

/* ---- answering ------------------------------------------------------------------ */

/* Queues body (malloc'd, taken over) with the given status. */
static enum MHD_Result respond(request *rq, int code, const char *type, char *body, size_t len, const char *h1,
                               const char *v1)
{
    rq->state = RQ_ANSWERED;
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body ? body : (char *)"",
                                                             body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (h1) MHD_add_response_header(r, h1, v1);
    metrics_count_request(rq->srv->counters, k_ep_name[rq->ep], code);
    if (rq->on_worker) { /* queued by the MHD thread (prep_deliver) */
        rq->pending = r;
        rq->pending_code = (unsigned)code;
        return MHD_YES;
    }
    enum MHD_Result ret = MHD_queue_response(rq->conn, (unsigned)code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result respond_sb(request *rq, int code, strbuf *sb, const char *h1, const char *v1)
{
    if (sb->oom) {
        sb_free(sb);
        sb_puts(sb, "{\"error\": \"out of memory\"}");
        code = 503;
    }
    size_t len = sb->len;
    return respond(rq, code, "application/json", sb->data, len, h1, v1);
}

/* An error in the format of the request's protocol: OpenAI's error object
 * on /v1 (param and code only there), {"error": msg} elsewhere. */
static void error_body(const request *rq, strbuf *sb, int code, const char *msg, const char *param, const char *errcode)
{
    if (rq->openai_errors) oai_error_body(sb, code, msg, param, errcode);
    else kserve_error(sb, msg);
}

static enum MHD_Result respond_fail(request *rq, int code, const char *msg, const char *param, const char *errcode,
                                    const char *h1, const char *v1)
{
    strbuf sb;
    sb_init(&sb);
    error_body(rq, &sb, code, msg, param, errcode);
    return respond_sb(rq, code, &sb, h1, v1);
}

static enum MHD_Result respond_error(request *rq, int code, const char *msg, const char *h1, const char *v1)
{
    return respond_fail(rq, code, msg, NULL, NULL, h1, v1);
}

/* ---- routing -------------------------------------------------------------------- */

static bool is_get(const char *m) { return !strcmp(m, MHD_HTTP_METHOD_GET) || !strcmp(m, MHD_HTTP_METHOD_HEAD); }

static bool is_post_endpoint(endpoint ep)
{
    return ep == EP_INFER || ep == EP_GENERATE || ep == EP_STREAM || ep == EP_OAI_COMPLETIONS || ep == EP_OAI_CHAT ||
           ep == EP_TOKENIZE || ep == EP_DETOKENIZE;
}

/* Sets rq->ep, and rq->early_code/msg/allow for 404 and 405. */
static void route(request *rq, const char *url, const char *method)
{
    const char *tail = NULL;
    rq->ep = EP_OTHER;
    rq->openai_errors = !strncmp(url, "/v1/", 4) || !strcmp(url, "/v1");
    if (!strcmp(url, "/v2/health/live")) rq->ep = EP_LIVE;
    else if (!strcmp(url, "/v1/models")) rq->ep = EP_OAI_MODELS;
    else if (!strcmp(url, "/v1/completions")) rq->ep = EP_OAI_COMPLETIONS;
    else if (!strcmp(url, "/v1/chat/completions")) rq->ep = EP_OAI_CHAT;
    else if (!strcmp(url, "/tokenize")) rq->ep = EP_TOKENIZE;
    else if (!strcmp(url, "/detokenize")) rq->ep = EP_DETOKENIZE;
    else if (!strcmp(url, "/v2/health/ready")) rq->ep = EP_READY;
    else if (!strcmp(url, "/v2") || !strcmp(url, "/v2/")) rq->ep = EP_SERVER_META;
    else if (!strcmp(url, "/metrics")) rq->ep = EP_METRICS;
    else if (!strcmp(url, "/v2/models/stats")) rq->ep = EP_STATS; /* every model's: this one */
    else if (!strncmp(url, "/v2/models/", 11)) {
        const char *m = url + 11, *slash = strchr(m, '/');
        size_t n = slash ? (size_t)(slash - m) : strlen(m);
        if (n != strlen(rq->srv->name) || strncmp(m, rq->srv->name, n) != 0) {
            rq->early_code = 404;
            char shown[64];
            size_t k = 0;
            for (; k < n && k < sizeof shown - 1; k++) /* the answer stays ASCII JSON whatever the URL holds */
                shown[k] = m[k] >= 0x20 && m[k] < 0x7f ? m[k] : '?';
            shown[k] = '\0';
            snprintf(rq->early_buf, sizeof rq->early_buf, "unknown model '%s' (this server serves '%s')", shown,
                     rq->srv->name);
            rq->early_msg = rq->early_buf;
            return;
        }
        tail = m + n;
        if (!strncmp(tail, "/versions/", 10)) {
            const char *v = tail + 10, *vs = strchr(v, '/');
            size_t vn = vs ? (size_t)(vs - v) : strlen(v);
            if (vn != strlen(KSERVE_MODEL_VERSION) || strncmp(v, KSERVE_MODEL_VERSION, vn) != 0) {
                rq->early_code = 404;
                rq->early_msg = "unknown model version (this server has version " KSERVE_MODEL_VERSION ")";
                return;
            }
            tail = v + vn;
        }
        if (!*tail) rq->ep = EP_MODEL_META;
        else if (!strcmp(tail, "/ready")) rq->ep = EP_MODEL_READY;
        else if (!strcmp(tail, "/infer")) rq->ep = EP_INFER;
        else if (!strcmp(tail, "/generate")) rq->ep = EP_GENERATE;
        else if (!strcmp(tail, "/generate_stream")) rq->ep = EP_STREAM;
        else if (!strcmp(tail, "/config")) rq->ep = EP_MODEL_CONFIG;
        else if (!strcmp(tail, "/stats")) rq->ep = EP_STATS;
    }
    if (rq->ep == EP_OTHER) {
        rq->early_code = 404;
        rq->early_msg = "not found";
        return;
    }
    bool post = is_post_endpoint(rq->ep);
    if (post ? strcmp(method, MHD_HTTP_METHOD_POST) != 0 : !is_get(method)) {
        rq->early_code = 405;
        rq->early_msg = post ? "method not allowed (use POST)" : "method not allowed (use GET)";
        rq->allow = post ? "POST" : "GET, HEAD";
    }
}

/* ---- GET endpoints -------------------------------------------------------------- */

static enum MHD_Result answer_get(request *rq)
{
    http_server *srv = rq->srv;
    strbuf sb;
    sb_init(&sb);
    pthread_rwlock_rdlock(&srv->lock);
    bool loaded = srv->s != NULL;
    engine_limits lim = srv->lim;
    int vocab = lim.vocab;
    int64_t attached = srv->attached_unix;
    metrics_engine_view view;
    memset(&view, 0, sizeof view);
    if (loaded) view.sched = sched_get_stats(srv->s);
    /* loaded, and its steps are not failing one after another */
    bool ready = loaded && sched_healthy(&view.sched) && !__atomic_load_n(&srv->draining, __ATOMIC_RELAXED);
    if (rq->ep == EP_METRICS && loaded) {
        view.ready = ready;
        view.pipe = engine_pipeline_stats(srv->e);
        view.has_experts = engine_expert_stats(srv->e, &view.experts);
        const plan *pl = engine_get_plan(srv->e);
        memcpy(view.weight_bytes, pl->tier_bytes, sizeof view.weight_bytes);
        for (int m = 0; m < 2; m++) plan_memory_bytes(pl, m, view.mem_bytes[m]);
        view.unified = pl->opts.unified;
    }
    pthread_rwlock_unlock(&srv->lock);
    view.request_memory = req_budget_used(srv->budget);
    view.request_memory_limit = srv->budget->limit;
    int code = 200;
    switch (rq->ep) {
    case EP_LIVE: sb_puts(&sb, "{\"live\": true}"); break;
    case EP_READY:
        if (ready) sb_puts(&sb, "{\"ready\": true}");
        else if (loaded) sb_puts(&sb, "{\"ready\": false, \"error\": \"the last steps failed (see the server log)\"}");
        else sb_puts(&sb, "{\"ready\": false, \"error\": \"model not ready\"}");
        code = ready ? 200 : 503;
        break;
    case EP_SERVER_META: kserve_server_metadata(&sb); break;
    case EP_MODEL_META:
        if (loaded) kserve_model_metadata(&sb, srv->name, vocab);
        else sb_puts(&sb, "{\"error\": \"model not ready\"}"), code = 503;
        break;
    case EP_MODEL_CONFIG:
        if (loaded) {
            kserve_config c;
            kserve_config_fill(&c, srv->name, vocab, lim.max_seqs);
            kserve_model_config(&sb, &c);
        } else {
            sb_puts(&sb, "{\"error\": \"model not ready\"}");
            code = 503;
        }
        break;
    case EP_STATS:
        if (loaded) {
            kserve_stats k;
            kserve_stats_fill(&k, &view.sched);
            kserve_model_stats(&sb, srv->name, &k);
        } else {
            sb_puts(&sb, "{\"error\": \"model not ready\"}");
            code = 503;
        }
        break;
    case EP_MODEL_READY:
        sb_puts(&sb, "{\"name\": ");
        sb_json_str(&sb, srv->name);
        sb_puts(&sb, ready ? ", \"ready\": true}" : ", \"ready\": false, \"error\": \"model not ready\"}");
        code = ready ? 200 : 503;
        break;
    case EP_OAI_MODELS:
        sb_free(&sb);
        if (!loaded) return respond_error(rq, 503, "model not ready", NULL, NULL);
        oai_models(&sb, srv->name, attached, lim.max_ctx);
        break;
    case EP_METRICS: {
        metrics_render(srv->counters, &view, &sb);
        if (sb.oom) return respond_sb(rq, 503, &sb, NULL, NULL);
        return respond(rq, 200, "text/plain; version=0.0.4; charset=utf-8", sb.data, sb.len, NULL, NULL);
    }
    default: sb_free(&sb); return respond_error(rq, 500, "internal error: no handler", NULL, NULL);
    }
    return respond_sb(rq, code, &sb, NULL, NULL);
}

/* ---- inference endpoints -------------------------------------------------------- */

static enum MHD_Result respond_busy(request *rq)
{
    char msg[160];
    req_budget_busy_msg(rq->srv->budget, msg, sizeof msg);
    return respond_error(rq, 503, msg, NULL, NULL);
}

/* The most a request's results and answer can hold, taken before any row
 * is submitted so that nothing after can fail for memory: every row's
 * tokens and logits; and the answer: an infer answer goes out one piece
 * (one row of one output) at a time, a generate answer is built whole, a
 * stream holds the events its client has not read yet. */
#define EVENT_BYTES 160 /* one SSE token event, model name aside */
static uint64_t answer_bytes(const request *rq, int vocab)
{
    const kserve_request *r = &rq->kr;
    uint64_t rows = (uint64_t)rq->n_rows;
    uint64_t token_bytes = rq->tm ? text_max_token_bytes(rq->tm) : 0;
    if (rq->oai) {
        uint64_t new_tokens = (uint64_t)oai_row_request(rq->oai, 0).max_new_tokens;
        uint64_t per_row = new_tokens * sizeof(int32_t) + sizeof(kserve_row) + sizeof(row_text) + TEXT_STREAM_BYTES +
                           text_stops_bytes(oai_stops(rq->oai)) + (rq->streaming ? 0 : new_tokens * token_bytes);
        return oai_request_bytes(rq->oai) + rows * per_row + oai_answer_bytes(rq->oai, rq->srv->name, token_bytes) +
               2 * (TEXT_MAX_STOP_BYTES + token_bytes); /* rq->delta */
    }
    uint64_t new_tokens = (uint64_t)r->max_new_tokens;
    uint64_t results = kserve_held_bytes(r, vocab);
    uint64_t answer;
    if (r->text_out && rq->ep == EP_INFER) {
        /* each row's text is held whole; the writer's largest piece is a
         * row of one output (text escaped: at most 6 bytes per byte) */
        uint64_t text_row = new_tokens * token_bytes;
        results += rows * (sizeof(row_text) + TEXT_STREAM_BYTES + text_stops_bytes(&r->stops) + text_row) +
                   2 * (TEXT_MAX_STOP_BYTES + token_bytes);
        uint64_t ids_row = new_tokens * 24, logits_row = r->want_logits ? (uint64_t)vocab * 24 : 0, piece = 6 * text_row;
        if (ids_row > piece) piece = ids_row;
        if (logits_row > piece) piece = logits_row;
        answer = 2 * (piece + 4096);
    } else if (r->text_out) {
        results += rows * (sizeof(row_text) + TEXT_STREAM_BYTES + text_stops_bytes(&r->stops)) +
                   2 * (TEXT_MAX_STOP_BYTES + token_bytes);
        if (rq->ep == EP_STREAM) answer = (new_tokens + 1) * (EVENT_BYTES + strlen(rq->srv->name) + 6 * token_bytes) + 4096;
        else answer = rows * new_tokens * 7 * token_bytes + 4096; /* the text, and the answer holding it escaped */
    } else if (rq->ep == EP_INFER) {
        uint64_t ids_row = new_tokens * 24, logits_row = r->want_logits ? (uint64_t)vocab * 24 : 0; /* JSON */
        answer = 2 * ((ids_row > logits_row ? ids_row : logits_row) + 4096); /* a piece, and its growth */
    } else if (rq->ep == EP_GENERATE) {
        answer = rows * new_tokens * 16 + 4096;
    } else {
        answer = new_tokens * (EVENT_BYTES + strlen(rq->srv->name)) + 4096;
    }
    return results + answer;
}

static enum MHD_Result stream_start(request *rq);
static enum MHD_Result infer_start(request *rq);

/* Answers once every row ended (or, streaming, once the first token is
 * there), else suspends until a callback resumes the connection. */
static enum MHD_Result finish_or_wait(request *rq)
{
    pthread_mutex_lock(&rq->mu);
    bool ready = rq->done || (rq->streaming && rq->n_events > 0);
    if (!ready) {
        conn_sleep(rq);
        pthread_mutex_unlock(&rq->mu);
        return MHD_YES;
    }
    bool events = rq->n_events > 0;
    pthread_mutex_unlock(&rq->mu);
    if (rq->streaming && events) return stream_start(rq);
    /* done: rows, st, msg, cancelled are final */
    if (rq->st != FERRY_OK) return respond_error(rq, kserve_http_status(rq->st), rq->msg, NULL, NULL);
    /* cancelled: the client went away; 499 (nginx's "client closed request") only shows in the metrics */
    if (rq->cancelled) return respond_error(rq, 499, "request cancelled", NULL, NULL);
    if (rq->streaming) return respond_error(rq, 500, "internal error: a stream ended without tokens", NULL, NULL);
    if (rq->ep == EP_INFER) {
        for (int i = 0; rq->texts && i < rq->n_rows; i++) { /* text_output: each row's text, held in its row_text */
            if (rq->texts[i].text.oom) return respond_error(rq, 503, "out of memory for a response", NULL, NULL);
            rq->rows[i].text = rq->texts[i].text.data;
            rq->rows[i].text_len = rq->texts[i].text.len;
        }
        return infer_start(rq);
    }
    strbuf sb;
    sb_init(&sb);
    if (rq->oai) {
        oai_choice *c = calloc((size_t)rq->n_rows, sizeof *c);
        if (!c) return respond_error(rq, 503, "out of memory", NULL, NULL);
        for (int i = 0; i < rq->n_rows; i++) {
            const row_text *t = &rq->texts[i];
            c[i] = (oai_choice){t->text.data ? t->text.data : "", t->text.len, t->finish, t->n_tokens};
            sb.oom |= t->text.oom;
        }
        oai_response(&sb, rq->oai, rq->srv->name, c);
        free(c);
    } else if (rq->texts) {
        const row_text *t = &rq->texts[0];
        sb.oom |= t->text.oom;
        kserve_text_response(&sb, &rq->kr, rq->srv->name, t->text.data ? t->text.data : "", t->text.len, t->finish);
    } else {
        kserve_generate_response(&sb, &rq->kr, rq->srv->name, rq->rows);
    }
    return respond_sb(rq, 200, &sb, NULL, NULL);
}

/* MHD asks for the next bytes of an infer answer: pieces from the writer,
 * one at a time, so that the answer is never held whole (its rows are). */
static ssize_t infer_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    request *rq = cls;
    while (rq->out.len == rq->out_sent) {
        rq->out.len = rq->out_sent = 0;
        if (!kserve_infer_writer_next(&rq->writer, &rq->out)) return MHD_CONTENT_READER_END_OF_STREAM;
        if (rq->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = rq->out.len - rq->out_sent < max ? rq->out.len - rq->out_sent : max;
    memcpy(buf, rq->out.data + rq->out_sent, n);
    rq->out_sent += n;
    return (ssize_t)n;
}

static void reader_free(void *cls) { request_unref(cls); }

/* The answer of a finished infer request, streamed by infer_read. With a
 * binary output, Inference-Header-Content-Length needs the JSON part's
 * length first: a counting pass formats it once without keeping it. */
static enum MHD_Result infer_start(request *rq)
{
    kserve_infer_writer_init(&rq->writer, &rq->kr, rq->srv->name, rq->rows, rq->srv->lim.vocab);
    size_t json_len = kserve_infer_json_len(&rq->kr, rq->srv->name, rq->rows, rq->srv->lim.vocab);
    pthread_mutex_lock(&rq->mu);
    rq->refs++; /* the reader's */
    pthread_mutex_unlock(&rq->mu);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK * 16, infer_read, rq,
                                                               reader_free);
    if (!r) {
        request_unref(rq);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, json_len ? "application/octet-stream" : "application/json");
    if (json_len) {
        char hl[32];
        snprintf(hl, sizeof hl, "%zu", json_len);
        MHD_add_response_header(r, "Inference-Header-Content-Length", hl);
    }
    rq->state = RQ_ANSWERED;
    enum MHD_Result ret = MHD_queue_response(rq->conn, 200, r);
    MHD_destroy_response(r);
    metrics_count_request(rq->srv->counters, k_ep_name[rq->ep], 200);
    return ret;
}

/* MHD asks for the next bytes of the event stream. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    request *rq = cls;
    pthread_mutex_lock(&rq->mu);
    if (rq->out.oom) {
        pthread_mutex_unlock(&rq->mu);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t avail = rq->out.len - rq->out_sent;
    if (avail > 0) {
        size_t n = avail < max ? avail : max;
        memcpy(buf, rq->out.data + rq->out_sent, n);
        rq->out_sent += n;
        if (rq->out_sent == rq->out.len) rq->out.len = rq->out_sent = 0; /* reuse the buffer */
        pthread_mutex_unlock(&rq->mu);
        return (ssize_t)n;
    }
    if (rq->done) {
        pthread_mutex_unlock(&rq->mu);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    conn_sleep(rq); /* allowed from a content reader; on_token/on_done resume */
    pthread_mutex_unlock(&rq->mu);
    return 0;
}

static enum MHD_Result stream_start(request *rq)
{
    pthread_mutex_lock(&rq->mu);
    rq->refs++; /* the reader's */
    pthread_mutex_unlock(&rq->mu);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, stream_read, rq,
                                                               reader_free);
    if (!r) {
        request_unref(rq);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    rq->state = RQ_STREAMING;
    enum MHD_Result ret = MHD_queue_response(rq->conn, 200, r);
    MHD_destroy_response(r);
    metrics_count_request(rq->srv->counters, k_ep_name[rq->ep], 200);
    return ret;
}

/* Reads Inference-Header-Content-Length: -1 when absent, -2 when malformed. */
static int64_t header_length(struct MHD_Connection *c)
{
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Inference-Header-Content-Length");
    if (!v) return -1;
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (end == v || *end || errno || n < 0) return -2;
    return n;
}

/* Chat prompts: the rendered template may hold RENDER_RATIO x the body
 * (plus a template's own text) before it is refused 413. */
#define RENDER_RATIO 4
#define RENDER_SLACK (256u << 10)

static uint64_t render_bound(size_t len) { return (uint64_t)RENDER_RATIO * len + RENDER_SLACK; }

/* What parsing a body may hold at once: its JSON tree; for chat also the
 * template's variables (a second tree) and the rendered prompt. The OpenAI
 * prompts' encodes take theirs as they come (take_encode): only then is
 * the text the tokenizer works on known. */
static uint64_t parse_hold(const request *rq, size_t len)
{
    uint64_t parse = kserve_parse_bound(len);
    if (rq->ep == EP_OAI_CHAT) return 2 * parse + render_bound(len);
    return parse;
}

/* n more bytes of the budget for rq, beside what it holds: 0 when taken;
 * else the status to answer, msg set - 413 when `what` could never fit
 * --request-memory, 503 while others hold it. */
static int take_more(request *rq, uint64_t n, const char *what, char *msg, size_t cap)
{
    req_budget *b = rq->srv->budget;
    if (n > b->limit || rq->mem > b->limit - n) { /* n may be UINT64_MAX: a bound that saturated */
        snprintf(msg, cap, "%s may need %llu bytes, more than --request-memory (%llu)", what,
                 (unsigned long long)(n > UINT64_MAX - rq->mem ? UINT64_MAX : rq->mem + n), (unsigned long long)b->limit);
        return 413;
    }
    if (!mem_take(rq, n)) {
        req_budget_busy_msg(b, msg, cap);
        return 503;
    }
    return 0;
}

/* oai_ctx.hold: an encode's budget, held in rq->encode_held until the
 * parse is done. */
static int take_encode(void *arg, uint64_t n, char *msg, size_t cap)
{
    request *rq = arg;
    int status = take_more(rq, n, "parsing and encoding the prompt", msg, cap);
    if (status == 0) rq->encode_held += n;
    return status;
}

/* Parses the body into rq->kr or rq->oai (the budget for it is held by
 * the caller); answers and returns false when it is refused. */
static bool parse_body(request *rq, const engine_limits *lim, enum MHD_Result *ret)
{
    ferry_status st;
    const char *body = rq->body ? rq->body : "";
    if (rq->ep == EP_OAI_COMPLETIONS || rq->ep == EP_OAI_CHAT) {
        oai_ctx ctx = {rq->srv->name, rq->tm, lim, kserve_parse_bound(rq->len), render_bound(rq->len), take_encode, rq};
        oai_error err;
        st = oai_parse(rq->ep == EP_OAI_CHAT ? OAI_CHAT : OAI_COMPLETIONS, body, rq->len, &ctx, &rq->oai, &err);
        if (st != FERRY_OK) *ret = respond_fail(rq, err.status, ferry_errmsg(), err.param, err.code, NULL, NULL);
        return st == FERRY_OK;
    }
    int64_t hl = rq->ep == EP_INFER ? rq->header_len : -1;
    if (rq->ep == EP_INFER) st = kserve_parse_infer(body, rq->len, hl, lim, &rq->kr);
    else st = kserve_parse_generate(body, rq->len, lim, &rq->kr);
    if (st != FERRY_OK) *ret = respond_error(rq, kserve_http_status(st), ferry_errmsg(), NULL, NULL);
    return st == FERRY_OK;
}

/* A generate request with text_input: its prompt encoded, within the budget. */
static bool encode_text(request *rq, const engine_limits *lim, enum MHD_Result *ret)
{
    uint64_t hold = kserve_encode_bound(&rq->kr, rq->tm);
    char msg[200];
    int status = take_more(rq, hold, "encoding text_input", msg, sizeof msg);
    if (status) {
        *ret = respond_error(rq, status, msg, NULL, NULL);
        return false;
    }
    ferry_status st = kserve_encode_text(&rq->kr, rq->tm, lim);
    mem_give(rq, hold);
    if (st != FERRY_OK) *ret = respond_error(rq, kserve_http_status(st), ferry_errmsg(), NULL, NULL);
    return st == FERRY_OK;
}

/* Per-row text streams, and a stream's first events (chat's role chunks). */
static ferry_status text_rows_start(request *rq)
{
    if (!(rq->texts = calloc((size_t)rq->n_rows, sizeof *rq->texts))) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    for (int i = 0; i < rq->n_rows; i++) {
        gen_request g = rq->oai ? oai_row_request(rq->oai, i) : kserve_row_request(&rq->kr, i);
        FERRY_TRY(text_stream_new(rq->tm, &g, rq->oai ? oai_stops(rq->oai) : &rq->kr.stops, &rq->texts[i].ts));
    }
    if (rq->oai && rq->streaming) {
        oai_stream_start(&rq->out, rq->oai, rq->srv->name);
        if (rq->out.oom) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        rq->n_events = rq->out.len > 0;
    }
    return FERRY_OK;
}

static enum MHD_Result start_inference(request *rq)
{
    http_server *srv = rq->srv;
    pthread_rwlock_rdlock(&srv->lock);
    bool ready = srv->s != NULL;
    engine_limits lim = srv->lim;
    const text_model *tm = srv->tm;
    pthread_rwlock_unlock(&srv->lock);
    if (!ready) return respond_error(rq, 503, "model not ready", NULL, NULL);
    if (__atomic_load_n(&srv->draining, __ATOMIC_RELAXED)) return respond_error(rq, 503, "server shutting down", NULL, NULL);
    rq->tm = tm; /* outlives the server's requests (http.h) */

    ferry_status st;
    if (rq->ep == EP_INFER && rq->header_len == -2)
        return respond_error(rq, 400, "Inference-Header-Content-Length is not a byte count", NULL, NULL);
    /* the parse may hold up to parse_hold of the body's size */
    uint64_t parse = parse_hold(rq, rq->len);
    if (parse > srv->budget->limit) {
        char msg[160];
        snprintf(msg, sizeof msg, "a body of %zu bytes may need %llu bytes to parse, more than --request-memory (%llu)",
                 rq->len, (unsigned long long)parse, (unsigned long long)srv->budget->limit);
        return respond_error(rq, 413, msg, NULL, NULL);
    }
    if (!mem_take(rq, parse)) return respond_busy(rq);
    enum MHD_Result ret = MHD_NO;
    bool parsed = parse_body(rq, &lim, &ret);
    mem_give(rq, parse + rq->encode_held);
    rq->encode_held = 0;
    body_release(rq);
    if (!parsed) return ret;
    if (!rq->oai && rq->kr.text_out && !encode_text(rq, &lim, &ret)) return ret;
    if (!rq->oai && !rq->kr.text_out) rq->tm = NULL; /* an answer of ids */
    int n = rq->n_rows = rq->oai ? oai_rows(rq->oai) : rq->kr.n_rows;
    rq->streaming = rq->ep == EP_STREAM || (rq->oai && oai_streaming(rq->oai));
    if (rq->ep == EP_STREAM && n != 1)
        return respond_error(rq, 400, "generate_stream takes one prompt (input_ids: a list of token ids)", NULL, NULL);
    uint64_t answer = answer_bytes(rq, lim.vocab);
    if (rq->tm && answer > srv->budget->limit) { /* could never be had: the client must ask for less */
        char msg[200];
        snprintf(msg, sizeof msg, "the answer may need %llu bytes (tokens x choices), more than --request-memory (%llu): "
                 "ask for fewer tokens", (unsigned long long)answer, (unsigned long long)srv->budget->limit);
        return respond_fail(rq, 413, msg, rq->oai ? "max_tokens" : NULL, NULL, NULL, NULL);
    }
    if (!mem_take(rq, answer)) return respond_busy(rq);
    rq->sid = calloc((size_t)n, sizeof *rq->sid);
    rq->refs_of = calloc((size_t)n, sizeof *rq->refs_of);
    rq->rows = calloc((size_t)n, sizeof *rq->rows);
    if (!rq->sid || !rq->refs_of || !rq->rows) return respond_error(rq, 503, "out of memory", NULL, NULL);
    if (rq->tm && (st = text_rows_start(rq)) != FERRY_OK)
        return respond_error(rq, kserve_http_status(st), ferry_errmsg(), NULL, NULL);

    sched_callbacks cb = {on_token, on_done};
    pthread_mutex_lock(&rq->mu);
    rq->rows_left = n;
    pthread_mutex_unlock(&rq->mu);
    char msg[256] = "";
    st = FERRY_OK;
    pthread_rwlock_rdlock(&srv->lock);
    rq->s = srv->s;
    if (!rq->s) st = FERRY_ERR_BUSY, snprintf(msg, sizeof msg, "model not ready");
    if (st == FERRY_OK && n > sched_max_queued(rq->s)) {
        /* could never be queued whole: a client error, not a retryable 503 */
        st = FERRY_ERR_INVALID;
        if (rq->oai)
            snprintf(msg, sizeof msg, "the request asks for %d sequences (prompts x n) but the server queues at most %d "
                     "(--max-queued)", n, sched_max_queued(rq->s));
        else
            snprintf(msg, sizeof msg, "the request holds %d prompts but the server queues at most %d (--max-queued)", n,
                     sched_max_queued(rq->s));
    }
    for (int i = 0; i < n && st == FERRY_OK; i++) {
        rq->refs_of[i] = (row_ref){rq, i};
        gen_request p = rq->oai ? oai_row_request(rq->oai, i) : kserve_row_request(&rq->kr, i);
        pthread_mutex_lock(&rq->mu);
        rq->refs++; /* on_done may run before sched_submit returns */
        pthread_mutex_unlock(&rq->mu);
        st = sched_submit(rq->s, &p, &cb, &rq->refs_of[i], &rq->sid[i]);
        pthread_mutex_lock(&rq->mu);
        if (st != FERRY_OK) rq->refs--; /* MHD's reference keeps rq alive */
        else rq->n_submitted = i + 1;
        pthread_mutex_unlock(&rq->mu);
        if (st != FERRY_OK) snprintf(msg, sizeof msg, "%s", ferry_errmsg());
    }
    if (st != FERRY_OK) {
        pthread_mutex_lock(&rq->mu);
        rq->rows_left -= n - rq->n_submitted;
        if (rq->rows_left == 0) rq->done = true;
        pthread_mutex_unlock(&rq->mu);
        /* the rows already queued end with on_done(cancelled); nobody waits for them */
        if (rq->s) cancel_rows(rq);
    }
    pthread_rwlock_unlock(&srv->lock);
    if (st != FERRY_OK) return respond_error(rq, kserve_http_status(st), msg, NULL, NULL);
    rq->state = RQ_RUNNING;
    return rq->on_worker ? MHD_YES : finish_or_wait(rq); /* on a worker: prep_deliver waits */
}

/* ---- /tokenize and /detokenize --------------------------------------------------- */

/* {"content": "...", "add_special": false, "parse_special": true} -> {"tokens": [...]} */
static ferry_status tokenize_body(const text_model *tm, const json_value *root, strbuf *sb)
{
    bool bad = false, add_special = false, parse_special = true, pieces = false;
    const json_value *content = json_get(root, "content");
    json_get_bool(root, "add_special", &add_special, &bad);
    if (bad) return ferry_fail(FERRY_ERR_INVALID, "add_special must be true or false");
    json_get_bool(root, "parse_special", &parse_special, &bad);
    if (bad) return ferry_fail(FERRY_ERR_INVALID, "parse_special must be true or false");
    json_get_bool(root, "with_pieces", &pieces, &bad);
    if (bad || pieces) return ferry_fail(FERRY_ERR_INVALID, "with_pieces is not supported");
    if (!content || content->type != JSON_STRING) return ferry_fail(FERRY_ERR_INVALID, "content must be a string");
    int32_t *ids = NULL;
    int n = 0;
    FERRY_TRY(text_tokenize(tm, content->str, content->len, add_special, parse_special, &ids, &n));
    sb_puts(sb, "{\"tokens\": [");
    for (int i = 0; i < n; i++) sb_printf(sb, "%s%d", i ? ", " : "", ids[i]);
    sb_puts(sb, "]}");
    free(ids);
    return FERRY_OK;
}

/* /tokenize's hold counts a byte of content a byte of the body; a content
 * that grows before it is tokenized (NFC, lowercase) needs more: taken into
 * *hold here. */
static ferry_status hold_grown_text(request *rq, const text_model *tm, const json_value *content, size_t len,
                                    uint64_t *hold)
{
    if (!content || content->type != JSON_STRING || content->len > text_max_bytes(tm))
        return FERRY_OK; /* tokenize_body refuses it */
    size_t size = text_encode_size(tm, content->str, content->len);
    if (size <= len) return FERRY_OK;
    /* saturates as text_encode_bound does, not wrapping to a small sum */
    uint64_t more = size > UINT64_MAX / 32 ? UINT64_MAX
                                           : text_encode_bound(size) - text_encode_bound(len) + (uint64_t)(size - len) * 12;
    char msg[200];
    int status = take_more(rq, more, "encoding the content (grown when normalized)", msg, sizeof msg);
    if (status) return ferry_fail(status == 413 ? FERRY_ERR_TOO_LARGE : FERRY_ERR_BUSY, "%s", msg);
    *hold += more;
    return FERRY_OK;
}

/* {"tokens": [...]} -> {"content": "..."}, special tokens written out */
static ferry_status detokenize_body(const tokenizer *t, const json_value *root, int vocab, strbuf *sb)
{
    const json_value *tokens = json_get(root, "tokens");
    if (!tokens || tokens->type != JSON_ARRAY) return ferry_fail(FERRY_ERR_INVALID, "tokens must be a list of token ids");
    int32_t *ids = malloc((tokens->len + 1) * sizeof *ids);
    if (!ids) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    ferry_status st = FERRY_OK;
    for (size_t i = 0; st == FERRY_OK && i < tokens->len; i++) {
        const json_value *v = &tokens->items[i];
        if (v->type != JSON_NUMBER || !v->is_int || v->integer < 0 || v->integer >= vocab)
            st = ferry_fail(FERRY_ERR_INVALID, "tokens[%zu] is not a token id of the model (0..%d)", i, vocab - 1);
        else ids[i] = (int32_t)v->integer;
    }
    strbuf text;
    sb_init(&text);
    if (st == FERRY_OK) st = tok_decode(t, ids, (int)tokens->len, false, &text);
    if (st == FERRY_OK) {
        sb_puts(sb, "{\"content\": ");
        sb_json_strn(sb, text.data ? text.data : "", text.len);
        sb_putc(sb, '}');
        sb->oom |= text.oom;
    }
    sb_free(&text);
    free(ids);
    return st;
}

/* No engine, only the tokenizer, answered on a prep worker (prep_start).
 * Their errors are KServe-style {"error": ...}, as the other paths outside /v1. */
static enum MHD_Result answer_tokens(request *rq)
{
    http_server *srv = rq->srv;
    pthread_rwlock_rdlock(&srv->lock);
    const text_model *tm = srv->s ? srv->tm : NULL;
    int vocab = srv->lim.vocab;
    pthread_rwlock_unlock(&srv->lock);
    if (!tm) return respond_error(rq, 503, "model not ready", NULL, NULL);
    if (text_error(tm)) return respond_error(rq, 400, text_error(tm), NULL, NULL);
    size_t len = rq->len;
    /* the tree, and: the ids and their JSON (12 bytes each; a byte of text
     * makes at most one id, BOS/EOS aside; text that grows when normalized
     * takes more, hold_grown_text); or the text of at most len / 2
     * ids ("1," each) and its JSON (6 bytes a byte at worst) */
    uint64_t hold = kserve_parse_bound(len) + 4096 +
                    (rq->ep == EP_TOKENIZE ? text_encode_bound(len) + ((uint64_t)len + 8) * 12
                                           : ((uint64_t)len / 2 + 1) * text_max_token_bytes(tm) * 7);
    if (hold > srv->budget->limit) return respond_error(rq, 413, "the request is too large for --request-memory", NULL, NULL);
    if (!mem_take(rq, hold)) return respond_busy(rq);
    json_doc *doc = NULL;
    strbuf sb;
    sb_init(&sb);
    ferry_status st = json_parse_limited(rq->body ? rq->body : "", len, kserve_parse_bound(len), &doc);
    if (st == FERRY_ERR_INVALID) ferry_fail_context(st, "malformed JSON");
    const json_value *root = st == FERRY_OK ? json_doc_root(doc) : NULL;
    if (st == FERRY_OK && root->type != JSON_OBJECT) st = ferry_fail(FERRY_ERR_INVALID, "the request must be a JSON object");
    if (st == FERRY_OK && rq->ep == EP_TOKENIZE) st = hold_grown_text(rq, tm, json_get(root, "content"), len, &hold);
    if (st == FERRY_OK)
        st = rq->ep == EP_TOKENIZE ? tokenize_body(tm, root, &sb)
                                   : detokenize_body(text_tokenizer(tm), root, vocab, &sb);
    json_doc_free(doc);
    body_release(rq);
    if (st != FERRY_OK) {
        sb_free(&sb);
        enum MHD_Result ret = respond_error(rq, kserve_http_status(st), ferry_errmsg(), NULL, NULL);
        mem_give(rq, hold);
        return ret;
    }
    size_t keep = sb.cap < hold ? sb.cap : hold; /* the answer, until MHD has sent it (request_unref) */
    enum MHD_Result ret = respond_sb(rq, 200, &sb, NULL, NULL);
    mem_give(rq, hold - keep);
    return ret;
}

/* ---- the request head: --max-header -------------------------------------------- */

/* MHD keeps a request's head in the connection's memory pool, and answers
 * a head that does not fit with its own HTML page (431; 414 while the
 * request line is incomplete): libmicrohttpd 0.9.75 has no option or
 * callback to replace those bodies. So the pool is HEAD_POOL_RATIO x
 * --max-header and ferry refuses a head over --max-header itself, in JSON;
 * only a head past the pool still gets MHD's page (docs/limits.md). Why
 * twice: besides the head's bytes the pool holds MHD's record of each
 * header field, query argument and cookie (64 bytes each) and, at the end,
 * the answer's status and header lines (~150 bytes), so a head up to the
 * limit with up to (max_header - 150) / 64 fields fits, and there is room
 * to refuse in JSON a head well over it. The pool is memory every open
 * connection may touch (MHD zeroes it between the requests of a kept-alive
 * connection: 64 KiB of RSS each at the default, measured); request bodies
 * pass through it too, in pieces of up to half of it. */
#define HEAD_POOL_RATIO 2

/* The URI log callback: MHD has the request line, and passes its URL as
 * the client sent it - query included, before unescaping - which
 * head_check needs and the access handler no longer sees. Its return value
 * becomes the request's *con_cls: none yet. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c)
{
    mhd_conns_set_url_bytes(((http_server *)cls)->conns, c, uri ? strlen(uri) : 0);
    return NULL;
}

static enum MHD_Result add_field_bytes(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                       const char *value, size_t value_size)
{
    (void)kind, (void)key, (void)value;
    *(uint64_t *)cls += key_size + 2 + value_size + 2; /* "name: value\r\n" */
    return MHD_YES;
}

/* On a request's first call: 0 when its head is within --max-header, else
 * 414 (the URL alone is over it) or 431, with the message in msg. The head
 * counts as MHD received it: the request line (method, URL, version, two
 * spaces, CRLF), each header line as "name: value" CRLF (blanks MHD
 * dropped around a value are not counted) and the blank line. An untracked connection's URL
 * counts as the unescaped path (on_uri had nowhere to keep its length). */
static int head_check(const request *rq, struct MHD_Connection *c, const char *url, const char *method,
                      const char *version, char *msg, size_t cap)
{
    uint64_t limit = rq->srv->max_header;
    uint64_t url_bytes = mhd_conns_url_bytes(c, strlen(url));
    if (url_bytes > limit) {
        snprintf(msg, cap, "URL is %llu bytes, more than this server takes (%llu, --max-header)",
                 (unsigned long long)url_bytes, (unsigned long long)limit);
        return 414;
    }
    uint64_t n = strlen(method) + 1 + url_bytes + 1 + strlen(version) + 2 + 2;
    MHD_get_connection_values_n(c, MHD_HEADER_KIND, add_field_bytes, &n);
    if (n <= limit) return 0;
    snprintf(msg, cap, "request head is %llu bytes, more than this server takes (%llu, --max-header)",
             (unsigned long long)n, (unsigned long long)limit);
    return 431;
}

/* ---- the prep workers ------------------------------------------------------------ */

/* A POST's body is in: what follows - parsing it, rendering a chat
 * template, encoding text, submitting the rows, or answering /tokenize -
 * takes time in proportion to the body (up to the regex and template work
 * limits), so it runs on a prep worker, never on an MHD thread, which
 * serves many other connections (health checks, other clients' tokens).
 * The connection is suspended meanwhile; `suspended` stays false, so no
 * scheduler callback resumes it: only the worker does, when it is done,
 * and the MHD thread then queues the worker's answer (prep_deliver) or, if
 * rows were submitted, waits for them as usual (finish_or_wait). */
static enum MHD_Result post_work(request *rq)
{
    return rq->ep == EP_TOKENIZE || rq->ep == EP_DETOKENIZE ? answer_tokens(rq) : start_inference(rq);
}

static void prep_run(void *arg)
{
    request *rq = arg;
    rq->on_worker = true;
    enum MHD_Result ret = post_work(rq);
    rq->on_worker = false;
    rq->pending_fail = ret == MHD_NO && !rq->pending;
    pthread_mutex_lock(&rq->mu);
    rq->prepared = true;
    MHD_resume_connection(rq->conn);
    pthread_mutex_unlock(&rq->mu);
}

static enum MHD_Result prep_start(request *rq)
{
    http_server *srv = rq->srv;
    rq->header_len = header_length(rq->conn);
    pthread_rwlock_rdlock(&srv->work_lock);
    if (!srv->work) { /* stopping (or no queue): answered here */
        pthread_rwlock_unlock(&srv->work_lock);
        return post_work(rq);
    }
    rq->state = RQ_PREPARING;
    pthread_mutex_lock(&rq->mu);
    MHD_suspend_connection(rq->conn);
    pthread_mutex_unlock(&rq->mu);
    workq_post(srv->work, prep_run, rq); /* without a thread or memory: run here, resumed at once */
    pthread_rwlock_unlock(&srv->work_lock);
    return MHD_YES;
}

/* The MHD thread, resumed after prep_run: its answer, or the rows' wait. */
static enum MHD_Result prep_deliver(request *rq)
{
    rq->prepared = false;
    if (rq->pending) {
        struct MHD_Response *r = rq->pending;
        rq->pending = NULL;
        enum MHD_Result ret = MHD_queue_response(rq->conn, rq->pending_code, r);
        MHD_destroy_response(r);
        return ret;
    }
    if (rq->pending_fail || rq->state != RQ_RUNNING) return MHD_NO;
    return finish_or_wait(rq);
}

/* ---- MHD callbacks -------------------------------------------------------------- */

static void too_large_msg(const request *rq, char *msg, size_t cap)
{
    snprintf(msg, cap, "request body larger than %llu bytes (--max-body)", (unsigned long long)rq->srv->max_body);
}

/* A chunked body (which announces no length) just went past --max-body:
 * its 413 goes out now, past MHD (mhd_answer_raw), and the rest of the body
 * is read and dropped until it ends or the drain allowance is spent
 * (on_request), then the connection closes - so the client reads the 413
 * however much more it meant to send. */
static void refuse_midway(request *rq)
{
    char msg[96];
    too_large_msg(rq, msg, sizeof msg);
    strbuf sb;
    sb_init(&sb);
    error_body(rq, &sb, 413, msg, NULL, NULL);
    /* written whole in practice (a few hundred bytes); either way the write
     * side is shut: tried once */
    mhd_answer_raw(rq->conn, 413, "application/json", sb.oom ? "" : sb.data, sb.oom ? 0 : sb.len);
    rq->raw_answered = true;
    metrics_count_request(rq->srv->counters, k_ep_name[rq->ep], 413);
    sb_free(&sb);
}

static enum MHD_Result dispatch(request *rq)
{
    if (rq->early_code) return respond_error(rq, rq->early_code, rq->early_msg, rq->allow ? MHD_HTTP_HEADER_ALLOW : NULL, rq->allow);
    if (rq->too_large) {
        char msg[96];
        too_large_msg(rq, msg, sizeof msg);
        return respond_error(rq, 413, msg, NULL, NULL);
    }
    if (rq->over_budget) return respond_error(rq, 503, "server busy: too many request bytes in flight", NULL, NULL);
    if (is_post_endpoint(rq->ep)) return prep_start(rq);
    return answer_get(rq);
}

static enum MHD_Result count_content_length(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind, (void)value;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) (*(int *)cls)++;
    return MHD_YES;
}

/* Appends upload data, within max_body and the server-wide budget. */
static void body_append(request *rq, const char *data, size_t n)
{
    http_server *srv = rq->srv;
    if (rq->early_code || rq->too_large || rq->over_budget || !is_post_endpoint(rq->ep)) return; /* discard */
    if (n > srv->max_body - rq->len) {
        rq->too_large = true;
        body_release(rq);
        return;
    }
    if (rq->len + n > rq->cap) {
        size_t cap = rq->cap ? rq->cap : 4096;
        while (cap < rq->len + n) cap *= 2;
        if (cap > srv->max_body) cap = (size_t)srv->max_body;
        uint64_t grow = cap - rq->cap;
        bool taken = mem_take(rq, grow);
        char *p = taken ? realloc(rq->body, cap) : NULL;
        if (!p) {
            if (taken) mem_give(rq, grow);
            rq->over_budget = true;
            body_release(rq);
            return;
        }
        rq->body = p;
        rq->cap = cap;
    }
    memcpy(rq->body + rq->len, data, n);
    rq->len += n;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    http_server *srv = cls;
    request *rq = *con_cls;
    if (!rq) { /* headers only: route, and refuse a body announced too large before it is sent */
        if (!(rq = request_new(srv, c))) return MHD_NO;
        *con_cls = rq;
        route(rq, url, method);
        char msg[128];
        int code = head_check(rq, c, url, method, version, msg, sizeof msg);
        if (code) {
            /* closed after the answer, as MHD closes after its own: the
             * rest of the request is not read */
            conn_mark(srv, c, false);
            return respond_error(rq, code, msg, MHD_HTTP_HEADER_CONNECTION, "close");
        }
        int lengths = 0;
        MHD_get_connection_values(c, MHD_HEADER_KIND, count_content_length, &lengths);
        if (lengths > 1) {
            /* two lengths: a proxy in front may have read the body by the other (request smuggling) */
            rq->early_code = 400;
            rq->early_msg = "more than one Content-Length header";
            conn_mark(srv, c, false);
            return dispatch(rq);
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (!rq->early_code && is_post_endpoint(rq->ep) && cl) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(cl, &end, 10);
            if (end != cl && !*end && (errno || v > srv->max_body)) {
                rq->too_large = true;
                conn_mark(srv, c, false);
                return dispatch(rq);
            }
        }
        return MHD_YES;
    }
    pthread_mutex_lock(&rq->mu); /* what the worker wrote before its resume */
    bool prepared = rq->prepared;
    pthread_mutex_unlock(&rq->mu);
    if (prepared) return prep_deliver(rq);
    switch (rq->state) {
    case RQ_RECEIVING:
        if (*upload_data_size) {
            body_append(rq, upload_data, *upload_data_size);
            rq->received += *upload_data_size;
            *upload_data_size = 0;
            /* past --max-body (a chunked body announces no length): the 413
             * goes out at once (refuse_midway), and the rest is read and
             * dropped - for at most another max(--max-body, 1 MiB), so that
             * the client reads it rather than a reset; beyond that the
             * connection is closed rather than read on (a 30 GB body) */
            if (rq->too_large && !rq->raw_answered) refuse_midway(rq);
            if (rq->too_large && rq->received - srv->max_body > (srv->max_body > DRAIN_MIN ? srv->max_body : DRAIN_MIN)) {
                if (!rq->raw_answered) metrics_count_request(srv->counters, k_ep_name[rq->ep], 413);
                rq->state = RQ_ANSWERED;
                return MHD_NO;
            }
            return MHD_YES;
        }
        conn_mark(srv, c, false);
        if (rq->raw_answered) { /* the body ended within the drain: its 413 is out, the connection closes */
            rq->state = RQ_ANSWERED;
            return MHD_NO;
        }
        return dispatch(rq);
    case RQ_RUNNING: return finish_or_wait(rq);
    case RQ_PREPARING: /* not called while suspended */
    case RQ_STREAMING:
    case RQ_ANSWERED: *upload_data_size = 0; return MHD_YES;
    }
    return MHD_NO;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)toe;
    http_server *srv = cls;
    request *rq = *con_cls;
    conn_mark(srv, c, true); /* a kept-alive connection now waits for its next request */
    if (!rq) return;
    *con_cls = NULL;
    __atomic_fetch_sub(&srv->active, 1, __ATOMIC_RELAXED);
    /* never answered: the client left while its request waited (a 499 is
     * counted when one is queued; this one had no chance to be) */
    if (rq->state != RQ_ANSWERED && rq->state != RQ_STREAMING)
        metrics_count_request(srv->counters, k_ep_name[rq->ep], 499);
    pthread_mutex_lock(&rq->mu);
    rq->conn = NULL;
    bool running = rq->rows_left > 0;
    pthread_mutex_unlock(&rq->mu);
    if (running) {
        /* the client went away (or the server is stopping): free the slots */
        pthread_rwlock_rdlock(&srv->lock);
        if (srv->s && srv->s == rq->s) cancel_rows(rq);
        pthread_rwlock_unlock(&srv->lock);
    }
    request_unref(rq);
}

/* ---- connections: the receive deadline ------------------------------------------ */

/* A request's head is whole and its body received (receiving false), or
 * it was answered and the connection waits for the next head (true: the
 * deadline starts again). An idle keep-alive connection counts as receiving
 * its next head; the reaper (below) cuts those past the deadline. */
static void conn_mark(http_server *srv, struct MHD_Connection *c, bool receiving)
{
    mhd_conns_mark(srv->conns, c, receiving);
}

/* Percent-decoding of the path, except %00: a NUL would end the path early
 * ("/v2/models/m%00x" would name model m), so it stays as written and
 * matches nothing. */
static size_t unescape(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls;
    (void)c;
    char *w = s;
    for (const char *r = s; *r;) {
        int hi, lo;
        if (r[0] == '%' && (hi = hexval(r[1])) >= 0 && (lo = hexval(r[2])) >= 0 && (hi | lo)) {
            *w++ = (char)(hi * 16 + lo);
            r += 3;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
    return (size_t)(w - s);
}

/* ---- the reaper ------------------------------------------------------------------- */

/* The reaper also enforces the receive deadline (above). MHD does not
 * watch a suspended socket, and on_token notices a departed
 * client only at its next token: a request still queued or prefilling
 * would hold its place until then. Every REAP_INTERVAL_US this thread
 * peeks at the sockets of suspended requests and cancels those whose
 * client is gone. Locks: reg_mu, then rq->mu (as http_server_stop); the
 * cancel itself runs with neither held, under the server lock (read), as
 * on_completed does. */
#define REAP_INTERVAL_US 250000
#define REAP_BATCH 64

static void *reaper_main(void *arg)
{
    http_server *srv = arg;
    while (!__atomic_load_n(&srv->reaper_stop, __ATOMIC_ACQUIRE)) {
        usleep(REAP_INTERVAL_US);
        mhd_conns_cut_slow(srv->conns);
        request *gone[REAP_BATCH];
        int n = 0;
        pthread_mutex_lock(&srv->reg_mu);
        for (request *rq = srv->live; rq && n < REAP_BATCH; rq = rq->next) {
            pthread_mutex_lock(&rq->mu);
            if (rq->suspended && !rq->client_gone && !rq->done && rq->n_submitted > 0 && peer_gone(rq)) {
                rq->client_gone = true;
                rq->refs++; /* keeps rq alive past reg_mu */
                gone[n++] = rq;
            }
            pthread_mutex_unlock(&rq->mu);
        }
        pthread_mutex_unlock(&srv->reg_mu);
        for (int i = 0; i < n; i++) {
            pthread_rwlock_rdlock(&srv->lock);
            if (srv->s && srv->s == gone[i]->s) cancel_rows(gone[i]);
            pthread_rwlock_unlock(&srv->lock);
            request_unref(gone[i]);
        }
    }
    return NULL;
}

/* MHD's own messages: kept quiet (client resets are routine); set
 * FERRY_HTTP_LOG=1 to see them. */
static void on_log(void *cls, const char *fmt, va_list ap)
{
    mhd_log(((const struct http_server *)cls)->log, "http", fmt, ap);
}

/* ---- server --------------------------------------------------------------------- */

ferry_status http_server_start(const http_opts *o, http_server **out)
{
    *out = NULL;
    http_server *srv = calloc(1, sizeof *srv);
    if (!srv || !(srv->name = strdup(o->model_name))) {
        free(srv);
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    srv->listen_fd = MHD_INVALID_SOCKET;
    srv->max_body = o->max_body;
    srv->max_header = o->max_header;
    srv->budget = o->budget;
    srv->request_timeout_s = o->request_timeout_s;
    srv->counters = o->counters;
    srv->log = getenv("FERRY_HTTP_LOG") != NULL;
    /* writer-preferring: under sustained load shutdown must still get it */
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&srv->lock, &ra);
    pthread_rwlockattr_destroy(&ra);
    pthread_mutex_init(&srv->reg_mu, NULL);
    pthread_rwlock_init(&srv->work_lock, NULL);
    srv->work = workq_new(PREP_THREADS, "ferry-http-prep"); /* NULL: answered on MHD's threads */
    if (!(srv->conns = mhd_conns_new(o->request_timeout_s, 0))) {
        http_server_stop(srv);
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }

    struct addrinfo *ai;
    ferry_status rst = mhd_resolve(o->host, o->port, "--host", &ai);
    if (rst != FERRY_OK) {
        http_server_stop(srv);
        return rst;
    }
    /* poll, not epoll (which MHD_USE_AUTO picks on Linux): libmicrohttpd
     * 0.9.75's MHD_quiesce_daemon takes the listening socket out of each
     * worker's epoll set while the worker may be doing the same, and aborts
     * the process when its EPOLL_CTL_DEL finds it gone (daemon.c:5531: seen
     * as "Failed to remove listen FD from epoll set" at a SIGTERM in a test).
     * With poll, quiesce only signals the workers. */
    unsigned flags = MHD_USE_POLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    errno = 0;
    srv->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, srv,
                              MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
                              MHD_OPTION_NOTIFY_CONNECTION, mhd_conns_notify, srv->conns,
                              MHD_OPTION_UNESCAPE_CALLBACK, unescape, srv,
                              MHD_OPTION_URI_LOG_CALLBACK, on_uri, srv,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_connections,
                              MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)o->max_connections_per_ip,
                              MHD_OPTION_THREAD_POOL_SIZE, (unsigned)WORKER_THREADS,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->connection_timeout_s,
                              MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(HEAD_POOL_RATIO * o->max_header),
                              MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)512,
                              MHD_OPTION_EXTERNAL_LOGGER, on_log, srv,
                              MHD_OPTION_END);
    int err = errno;
    freeaddrinfo(ai);
    if (!srv->d) {
        ferry_status st = ferry_fail(FERRY_ERR_IO, "cannot listen on %s port %d%s%s", o->host, o->port,
                                     err ? ": " : "", err ? strerror(err) : "");
        http_server_stop(srv);
        return st;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->d, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = di ? di->port : o->port;
    srv->reaper_running = pthread_create(&srv->reaper, NULL, reaper_main, srv) == 0;
    if (!srv->reaper_running)
        fprintf(stderr, "ferry: warning: no reaper thread; departed clients are noticed at their next token\n");
    *out = srv;
    return FERRY_OK;
}

int http_server_port(const http_server *s) { return s->port; }

/* Requests whose rows still run (answered or not yet). */
static int inferences_running(http_server *s)
{
    int n = 0;
    pthread_mutex_lock(&s->reg_mu);
    for (request *rq = s->live; rq; rq = rq->next) {
        pthread_mutex_lock(&rq->mu);
        n += rq->rows_left > 0;
        pthread_mutex_unlock(&rq->mu);
    }
    pthread_mutex_unlock(&s->reg_mu);
    return n;
}

void http_server_quiesce(http_server *s)
{
    if (!__atomic_exchange_n(&s->draining, 1, __ATOMIC_RELAXED) && s->d) {
        /* MHD stops accepting; the kernel would still queue connections on
         * the socket, which MHD's threads may touch until stopped (so it
         * stays open): shutting it down makes new connections be refused */
        s->listen_fd = MHD_quiesce_daemon(s->d);
        if (s->listen_fd != MHD_INVALID_SOCKET) shutdown(s->listen_fd, SHUT_RDWR);
    }
}

void http_server_drain(http_server *s, double deadline)
{
    http_server_quiesce(s);
    while (util_now() < deadline && inferences_running(s) > 0) usleep(10000);
}

void http_server_attach(http_server *s, engine *e, sched *sc, const text_model *tm)
{
    pthread_rwlock_wrlock(&s->lock);
    s->e = e;
    s->s = sc;
    s->tm = tm;
    s->attached_unix = (int64_t)util_wall_now();
    s->lim = engine_get_limits(e);
    pthread_rwlock_unlock(&s->lock);
}

void http_server_detach(http_server *s)
{
    pthread_rwlock_wrlock(&s->lock);
    s->e = NULL;
    s->s = NULL;
    pthread_rwlock_unlock(&s->lock);
}

void http_server_stop(http_server *s)
{
    if (!s) return;
    if (s->reaper_running) {
        __atomic_store_n(&s->reaper_stop, 1, __ATOMIC_RELEASE);
        pthread_join(s->reaper, NULL);
        s->reaper_running = false;
    }
    /* every request a worker prepares is resumed when it is done: none is
     * left suspended for it below (later ones are answered on MHD's thread) */
    pthread_rwlock_wrlock(&s->work_lock);
    workq *work = s->work;
    s->work = NULL;
    pthread_rwlock_unlock(&s->work_lock);
    workq_free(work);
    if (s->d) {
        /* MHD aborts when stopped with a connection suspended. sched_free has
         * ended every request it knew; one still waiting means a callback
         * that never came - end it here rather than abort. */
        pthread_mutex_lock(&s->reg_mu);
        for (request *rq = s->live; rq; rq = rq->next) {
            pthread_mutex_lock(&rq->mu);
            if (rq->suspended) {
                if (rq->st == FERRY_OK) {
                    rq->st = FERRY_ERR_INTERNAL;
                    snprintf(rq->msg, sizeof rq->msg, "server stopped before the request ended");
                    if (rq->streaming && rq->n_events > 0) stream_error(rq);
                }
                rq->done = true;
                conn_wake(rq);
            }
            pthread_mutex_unlock(&rq->mu);
        }
        pthread_mutex_unlock(&s->reg_mu);
        /* stop accepting, then give the answers already queued (the 503s and
         * error events of a scheduler that just stopped) a moment to leave */
        MHD_socket fd = s->listen_fd != MHD_INVALID_SOCKET ? s->listen_fd : MHD_quiesce_daemon(s->d);
        for (int i = 0; i < STOP_GRACE_MS / 10 && __atomic_load_n(&s->active, __ATOMIC_RELAXED) > 0; i++)
            usleep(10000);
        MHD_stop_daemon(s->d);
        if (fd != MHD_INVALID_SOCKET) close(fd); /* MHD's threads may use it until stopped */
    }
    mhd_conns_free(s->conns); /* MHD has closed every connection */
    pthread_rwlock_destroy(&s->lock);
    pthread_rwlock_destroy(&s->work_lock);
    pthread_mutex_destroy(&s->reg_mu);
    free(s->name);
    free(s);
}

/* ---- the front end's life cycle (frontend.h) ------------------------------------ */

static void fe_attach(void *self, engine *e, sched *sc, const text_model *tm) { http_server_attach(self, e, sc, tm); }
static void fe_quiesce(void *self) { http_server_quiesce(self); }
static void fe_drain(void *self, double deadline) { http_server_drain(self, deadline); }
static void fe_detach(void *self) { http_server_detach(self); }
static void fe_stop(void *self) { http_server_stop(self); }

static const frontend_ops k_http_frontend = {"http", fe_attach, fe_quiesce, fe_drain, fe_detach, fe_stop};

frontend http_frontend(http_server *s) { return (frontend){&k_http_frontend, s}; }
