/*
 * http.c - routes, request bodies and the request life cycle on
 * libmicrohttpd (MHD). See http.h; the protocol itself is in kserve.c.
 *
 * Threads. MHD runs a small pool of worker threads (epoll); each connection
 * is handled by one of them at a time, so the access handler, the stream
 * reader and the completion callback of one request never run at once. The
 * engine thread runs the scheduler callbacks. Nothing here blocks on the
 * engine.
 *
 * Request life cycle (struct request, one per HTTP request):
 *
 *   RECEIVING --body complete--> answered at once (GET, errors)
 *       |
 *       +--rows submitted--> RUNNING --done (or first token)--> answered
 *                               ^  |                            (STREAMING)
 *                               +--+ suspended until resumed
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
#include <sys/socket.h>
#include <unistd.h>

#include "kserve.h"

#define WORKER_THREADS 4
#define CONNECTION_TIMEOUT_S 60
#define STREAM_BLOCK 4096
#define STOP_GRACE_MS 2000

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
    EP_OTHER,
} endpoint;

/* metrics labels */
static const char *const k_ep_name[] = {"health_live",     "health_ready", "server_metadata",
                                        "model_metadata",  "model_ready",  "infer",
                                        "generate",        "generate_stream", "metrics",
                                        "other"};

struct http_server {
    struct MHD_Daemon *d;
    char *name;
    uint64_t max_body;
    uint64_t body_budget;    /* request bytes buffered at once, all connections */
    uint64_t body_bytes;     /* atomic */
    metrics *counters;
    bool log;                /* FERRY_HTTP_LOG set: print MHD's own messages (read once, at start) */
    int port;
    int active;              /* atomic: requests between their first call and completion */
    pthread_t reaper;        /* notices clients that left while their request waits */
    bool reaper_running;
    int reaper_stop;         /* atomic */
    pthread_mutex_t reg_mu;  /* guards the list of live requests */
    struct request *live;
    pthread_rwlock_t lock;   /* guards e, s, lim: held (read) around every use */
    engine *e;
    sched *s;
    engine_limits lim;
};

typedef enum { RQ_RECEIVING, RQ_RUNNING, RQ_STREAMING, RQ_ANSWERED } rq_state;

typedef struct request request;

typedef struct {
    request *rq;
    int row;
} row_ref;

struct request {
    http_server *srv;
    struct request *prev, *next; /* srv->live, under srv->reg_mu */
    endpoint ep;
    rq_state state;              /* the connection's MHD thread only */
    /* decided from the method and path; answered once the body is in */
    int early_code;
    const char *early_msg, *allow;
    char early_buf[160];
    /* body */
    char *body;
    size_t len, cap;
    bool too_large, over_budget;
    /* work: fixed once submitted */
    kserve_request kr;
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
    strbuf out;                  /* stream: events not yet handed to MHD */
    size_t out_sent;
    int n_events;
};

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

static void body_release(request *rq)
{
    if (rq->cap) __atomic_fetch_sub(&rq->srv->body_bytes, (uint64_t)rq->cap, __ATOMIC_RELAXED);
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
    if (rq->rows)
        for (int i = 0; i < rq->kr.n_rows; i++) {
            free(rq->rows[i].tokens);
            free(rq->rows[i].logits);
        }
    free(rq->rows);
    free(rq->sid);
    free(rq->refs_of);
    kserve_request_free(&rq->kr);
    sb_free(&rq->out);
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

static void on_token(void *user, int32_t token, int index)
{
    request *rq = ((row_ref *)user)->rq;
    bool cancel = false;
    pthread_mutex_lock(&rq->mu);
    if (rq->suspended && !rq->client_gone && peer_gone(rq)) cancel = rq->client_gone = true;
    if (rq->ep == EP_STREAM && rq->conn && !rq->client_gone) {
        kserve_stream_event(&rq->out, rq->srv->name, token, index);
        rq->n_events++;
        conn_wake(rq);
    }
    pthread_mutex_unlock(&rq->mu);
    /* the engine thread is alive, so the scheduler is: no server lock needed
     * (and taking it here could deadlock against sched_free) */
    if (cancel) cancel_rows(rq);
}

static void on_done(void *user, ferry_status st, const char *msg, const gen_result *res)
{
    row_ref *ref = user;
    request *rq = ref->rq;
    kserve_row *row = &rq->rows[ref->row];
    if (st == FERRY_OK && !res->cancelled) metrics_observe_queue(rq->srv->counters, res->queue_s);
    pthread_mutex_lock(&rq->mu);
    if (st == FERRY_OK && res->n_tokens > 0) {
        row->tokens = malloc((size_t)res->n_tokens * sizeof *row->tokens);
        if (row->tokens) {
            memcpy(row->tokens, res->tokens, (size_t)res->n_tokens * sizeof *row->tokens);
            row->n_tokens = res->n_tokens;
        } else {
            st = FERRY_ERR_NOMEM, msg = "out of memory for a response";
        }
    }
    if (st == FERRY_OK && res->logits) {
        row->logits = malloc((size_t)res->vocab * sizeof *row->logits);
        if (row->logits) memcpy(row->logits, res->logits, (size_t)res->vocab * sizeof *row->logits);
        else st = FERRY_ERR_NOMEM, msg = "out of memory for a response";
    }
    if (st != FERRY_OK && rq->st == FERRY_OK) {
        rq->st = st;
        snprintf(rq->msg, sizeof rq->msg, "%s", msg && *msg ? msg : ferry_status_name(st));
        if (rq->ep == EP_STREAM && rq->n_events > 0) kserve_stream_error(&rq->out, rq->msg);
    }
    if (res->cancelled) rq->cancelled = true;
    if (--rq->rows_left == 0) {
        rq->done = true;
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
    enum MHD_Result ret = MHD_queue_response(rq->conn, (unsigned)code, r);
    MHD_destroy_response(r);
    metrics_count_request(rq->srv->counters, k_ep_name[rq->ep], code);
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

static enum MHD_Result respond_error(request *rq, int code, const char *msg, const char *h1, const char *v1)
{
    strbuf sb;
    sb_init(&sb);
    kserve_error(&sb, msg);
    return respond_sb(rq, code, &sb, h1, v1);
}

/* ---- routing -------------------------------------------------------------------- */

static bool is_get(const char *m) { return !strcmp(m, MHD_HTTP_METHOD_GET) || !strcmp(m, MHD_HTTP_METHOD_HEAD); }

static bool is_post_endpoint(endpoint ep) { return ep == EP_INFER || ep == EP_GENERATE || ep == EP_STREAM; }

/* Sets rq->ep, and rq->early_code/msg/allow for 404 and 405. */
static void route(request *rq, const char *url, const char *method)
{
    const char *tail = NULL;
    rq->ep = EP_OTHER;
    if (!strcmp(url, "/v2/health/live")) rq->ep = EP_LIVE;
    else if (!strcmp(url, "/v2/health/ready")) rq->ep = EP_READY;
    else if (!strcmp(url, "/v2") || !strcmp(url, "/v2/")) rq->ep = EP_SERVER_META;
    else if (!strcmp(url, "/metrics")) rq->ep = EP_METRICS;
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
    bool ready = srv->s != NULL;
    int vocab = srv->lim.vocab;
    metrics_engine_view view;
    memset(&view, 0, sizeof view);
    if (rq->ep == EP_METRICS && ready) {
        view.ready = true;
        view.sched = sched_get_stats(srv->s);
        view.pipe = engine_pipeline_stats(srv->e);
        memcpy(view.weight_bytes, engine_get_plan(srv->e)->tier_bytes, sizeof view.weight_bytes);
    }
    pthread_rwlock_unlock(&srv->lock);
    int code = 200;
    switch (rq->ep) {
    case EP_LIVE: sb_puts(&sb, "{\"live\": true}"); break;
    case EP_READY:
        sb_puts(&sb, ready ? "{\"ready\": true}" : "{\"ready\": false, \"error\": \"model not ready\"}");
        code = ready ? 200 : 503;
        break;
    case EP_SERVER_META: kserve_server_metadata(&sb); break;
    case EP_MODEL_META:
        if (ready) kserve_model_metadata(&sb, srv->name, vocab);
        else sb_puts(&sb, "{\"error\": \"model not ready\"}"), code = 503;
        break;
    case EP_MODEL_READY:
        sb_puts(&sb, "{\"name\": ");
        sb_json_str(&sb, srv->name);
        sb_puts(&sb, ready ? ", \"ready\": true}" : ", \"ready\": false, \"error\": \"model not ready\"}");
        code = ready ? 200 : 503;
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

static enum MHD_Result stream_start(request *rq);

/* Answers once every row ended (or, streaming, once the first token is
 * there), else suspends until a callback resumes the connection. */
static enum MHD_Result finish_or_wait(request *rq)
{
    pthread_mutex_lock(&rq->mu);
    bool ready = rq->done || (rq->ep == EP_STREAM && rq->n_events > 0);
    if (!ready) {
        conn_sleep(rq);
        pthread_mutex_unlock(&rq->mu);
        return MHD_YES;
    }
    bool events = rq->n_events > 0;
    pthread_mutex_unlock(&rq->mu);
    if (rq->ep == EP_STREAM && events) return stream_start(rq);
    /* done: rows, st, msg, cancelled are final */
    if (rq->st != FERRY_OK) return respond_error(rq, kserve_http_status(rq->st), rq->msg, NULL, NULL);
    /* cancelled: the client went away; 499 (nginx's "client closed request") only shows in the metrics */
    if (rq->cancelled) return respond_error(rq, 499, "request cancelled", NULL, NULL);
    if (rq->ep == EP_STREAM) return respond_error(rq, 500, "internal error: a stream ended without tokens", NULL, NULL);
    strbuf sb;
    sb_init(&sb);
    if (rq->ep == EP_INFER) {
        size_t json_len = 0;
        kserve_infer_response(&sb, &rq->kr, rq->srv->name, rq->rows, rq->srv->lim.vocab, &json_len);
        if (json_len && !sb.oom) {
            char hl[32];
            snprintf(hl, sizeof hl, "%zu", json_len);
            metrics_count_request(rq->srv->counters, k_ep_name[rq->ep], 200);
            rq->state = RQ_ANSWERED;
            struct MHD_Response *r = MHD_create_response_from_buffer(sb.len, sb.data, MHD_RESPMEM_MUST_FREE);
            if (!r) {
                sb_free(&sb);
                return MHD_NO;
            }
            MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
            MHD_add_response_header(r, "Inference-Header-Content-Length", hl);
            enum MHD_Result ret = MHD_queue_response(rq->conn, 200, r);
            MHD_destroy_response(r);
            return ret;
        }
    } else {
        kserve_generate_response(&sb, &rq->kr, rq->srv->name, rq->rows);
    }
    return respond_sb(rq, 200, &sb, NULL, NULL);
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

static void stream_free(void *cls) { request_unref(cls); }

static enum MHD_Result stream_start(request *rq)
{
    pthread_mutex_lock(&rq->mu);
    rq->refs++; /* the reader's */
    pthread_mutex_unlock(&rq->mu);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, stream_read, rq,
                                                               stream_free);
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

static enum MHD_Result start_inference(request *rq)
{
    http_server *srv = rq->srv;
    pthread_rwlock_rdlock(&srv->lock);
    bool ready = srv->s != NULL;
    engine_limits lim = srv->lim;
    pthread_rwlock_unlock(&srv->lock);
    if (!ready) return respond_error(rq, 503, "model not ready", NULL, NULL);

    ferry_status st;
    if (rq->ep == EP_INFER) {
        int64_t hl = header_length(rq->conn);
        if (hl == -2) return respond_error(rq, 400, "Inference-Header-Content-Length is not a byte count", NULL, NULL);
        st = kserve_parse_infer(rq->body ? rq->body : "", rq->len, hl, &lim, &rq->kr);
    } else {
        st = kserve_parse_generate(rq->body ? rq->body : "", rq->len, &lim, &rq->kr);
    }
    body_release(rq);
    if (st != FERRY_OK) return respond_error(rq, kserve_http_status(st), ferry_errmsg(), NULL, NULL);
    int n = rq->kr.n_rows;
    if (rq->ep == EP_STREAM && n != 1)
        return respond_error(rq, 400, "generate_stream takes one prompt (input_ids: a list of token ids)", NULL, NULL);
    rq->sid = calloc((size_t)n, sizeof *rq->sid);
    rq->refs_of = calloc((size_t)n, sizeof *rq->refs_of);
    rq->rows = calloc((size_t)n, sizeof *rq->rows);
    if (!rq->sid || !rq->refs_of || !rq->rows) return respond_error(rq, 503, "out of memory", NULL, NULL);

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
        snprintf(msg, sizeof msg, "the request holds %d prompts but the server queues at most %d (--max-queued)", n,
                 sched_max_queued(rq->s));
    }
    for (int i = 0; i < n && st == FERRY_OK; i++) {
        rq->refs_of[i] = (row_ref){rq, i};
        gen_request p = kserve_row_request(&rq->kr, i);
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
    return finish_or_wait(rq);
}

/* ---- MHD callbacks -------------------------------------------------------------- */

static enum MHD_Result dispatch(request *rq)
{
    if (rq->early_code) return respond_error(rq, rq->early_code, rq->early_msg, rq->allow ? MHD_HTTP_HEADER_ALLOW : NULL, rq->allow);
    if (rq->too_large) {
        char msg[96];
        snprintf(msg, sizeof msg, "request body larger than %llu bytes (--max-body)", (unsigned long long)rq->srv->max_body);
        return respond_error(rq, 413, msg, NULL, NULL);
    }
    if (rq->over_budget) return respond_error(rq, 503, "server busy: too many request bytes in flight", NULL, NULL);
    if (is_post_endpoint(rq->ep)) return start_inference(rq);
    return answer_get(rq);
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
        uint64_t now = __atomic_add_fetch(&srv->body_bytes, grow, __ATOMIC_RELAXED);
        char *p = now <= srv->body_budget ? realloc(rq->body, cap) : NULL;
        if (!p) {
            __atomic_fetch_sub(&srv->body_bytes, grow, __ATOMIC_RELAXED);
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
    (void)version;
    http_server *srv = cls;
    request *rq = *con_cls;
    if (!rq) { /* headers only: route, and refuse a body announced too large before it is sent */
        if (!(rq = request_new(srv, c))) return MHD_NO;
        *con_cls = rq;
        route(rq, url, method);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (!rq->early_code && is_post_endpoint(rq->ep) && cl) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(cl, &end, 10);
            if (end != cl && !*end && (errno || v > srv->max_body)) {
                rq->too_large = true;
                return dispatch(rq);
            }
        }
        return MHD_YES;
    }
    switch (rq->state) {
    case RQ_RECEIVING:
        if (*upload_data_size) {
            body_append(rq, upload_data, *upload_data_size);
            *upload_data_size = 0;
            return MHD_YES;
        }
        return dispatch(rq);
    case RQ_RUNNING: return finish_or_wait(rq);
    case RQ_STREAMING:
    case RQ_ANSWERED: *upload_data_size = 0; return MHD_YES;
    }
    return MHD_NO;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)c;
    (void)toe;
    http_server *srv = cls;
    request *rq = *con_cls;
    if (!rq) return;
    *con_cls = NULL;
    __atomic_fetch_sub(&srv->active, 1, __ATOMIC_RELAXED);
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

/* ---- the reaper ------------------------------------------------------------------- */

/* MHD does not watch a suspended socket, and on_token notices a departed
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
    const struct http_server *srv = cls;
    if (!srv->log) return;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = '\0';
    fprintf(stderr, "ferry: http: %s\n", msg);
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
    srv->max_body = o->max_body;
    srv->body_budget = o->max_body > (UINT64_MAX / 4) ? UINT64_MAX : o->max_body * 4;
    if (srv->body_budget < (256ull << 20)) srv->body_budget = 256ull << 20;
    srv->counters = o->counters;
    srv->log = getenv("FERRY_HTTP_LOG") != NULL;
    /* writer-preferring: under sustained load shutdown must still get it */
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&srv->lock, &ra);
    pthread_rwlockattr_destroy(&ra);
    pthread_mutex_init(&srv->reg_mu, NULL);

    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int gai = getaddrinfo(o->host, port, &hints, &ai);
    if (gai != 0) {
        ferry_status st = ferry_fail(FERRY_ERR_INVALID, "--host %s: %s", o->host, gai_strerror(gai));
        http_server_stop(srv);
        return st;
    }
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    errno = 0;
    srv->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, srv,
                              MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
                              MHD_OPTION_THREAD_POOL_SIZE, (unsigned)WORKER_THREADS,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)CONNECTION_TIMEOUT_S,
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

void http_server_attach(http_server *s, engine *e, sched *sc)
{
    pthread_rwlock_wrlock(&s->lock);
    s->e = e;
    s->s = sc;
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
                    if (rq->ep == EP_STREAM && rq->n_events > 0) kserve_stream_error(&rq->out, rq->msg);
                }
                rq->done = true;
                conn_wake(rq);
            }
            pthread_mutex_unlock(&rq->mu);
        }
        pthread_mutex_unlock(&s->reg_mu);
        /* stop accepting, then give the answers already queued (the 503s and
         * error events of a scheduler that just stopped) a moment to leave */
        MHD_socket fd = MHD_quiesce_daemon(s->d);
        for (int i = 0; i < STOP_GRACE_MS / 10 && __atomic_load_n(&s->active, __ATOMIC_RELAXED) > 0; i++)
            usleep(10000);
        MHD_stop_daemon(s->d);
        if (fd != MHD_INVALID_SOCKET) close(fd); /* MHD's threads may use it until stopped */
    }
    pthread_rwlock_destroy(&s->lock);
    pthread_mutex_destroy(&s->reg_mu);
    free(s->name);
    free(s);
}
