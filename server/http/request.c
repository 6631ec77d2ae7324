/*
 * request.c - a listener's request objects (struct http_req): their
 * references, their share of the request-memory budget, suspend and
 * resume, and the three ways an answer goes out - whole, piece by piece
 * as the client reads it, or as an event stream. See listener.h for the
 * calls and listener.c for the life cycle and the invariants they keep.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "listener_impl.h"

/* ---- request objects -------------------------------------------------------------- */

http_req *req_new(http_listener *l, struct MHD_Connection *c)
{
    http_req *rq = calloc(1, sizeof *rq);
    if (!rq) return NULL;
    rq->l = l;
    rq->conn = c;
    rq->refs = 1; /* MHD's */
    __atomic_fetch_add(&l->active, 1, __ATOMIC_RELAXED);
    pthread_mutex_init(&rq->mu, NULL);
    sb_init(&rq->out);
    pthread_mutex_lock(&l->reg_mu);
    rq->next = l->live;
    if (l->live) l->live->prev = rq;
    l->live = rq;
    pthread_mutex_unlock(&l->reg_mu);
    return rq;
}

void http_req_ref(http_req *rq)
{
    pthread_mutex_lock(&rq->mu);
    rq->refs++;
    pthread_mutex_unlock(&rq->mu);
}

void http_req_unref(http_req *rq)
{
    pthread_mutex_lock(&rq->mu);
    bool last = --rq->refs == 0;
    pthread_mutex_unlock(&rq->mu);
    if (!last) return;
    http_listener *l = rq->l;
    pthread_mutex_lock(&l->reg_mu);
    if (rq->prev) rq->prev->next = rq->next;
    else l->live = rq->next;
    if (rq->next) rq->next->prev = rq->prev;
    pthread_mutex_unlock(&l->reg_mu);
    req_body_release(rq);
    if (rq->pending) MHD_destroy_response(rq->pending); /* answered by a worker, but the client left first */
    if (rq->work_ops) rq->work_ops->free(rq->work);
    free(rq->kept_header);
    sb_free(&rq->out);
    req_mem_give(rq, rq->mem);
    pthread_mutex_destroy(&rq->mu);
    free(rq);
}

void *http_req_ctx(const http_req *rq) { return rq->l->o.ctx; }
const void *http_req_arg(const http_req *rq) { return rq->route ? rq->route->arg : NULL; }
const char *http_req_param(const http_req *rq) { return rq->param; }
bool http_req_draining(const http_req *rq) { return http_listener_draining(rq->l); }
metrics *http_req_counters(const http_req *rq) { return rq->l->o.counters; }
void req_count(const http_req *rq, int code) { metrics_count_request(rq->l->o.counters, rq->label, code); }

const char *http_req_header(const http_req *rq, const char *name)
{
    if (rq->on_worker)
        return rq->route && rq->route->header && !strcasecmp(name, rq->route->header) ? rq->kept_header : NULL;
    return MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, name);
}

void http_req_peer(const http_req *rq, char *out, size_t cap)
{
    snprintf(out, cap, "unknown peer");
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(rq->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!ci || !ci->client_addr) return;
    const struct sockaddr *sa = ci->client_addr;
    socklen_t len = sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    char host[NI_MAXHOST], serv[16];
    if (getnameinfo(sa, len, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) == 0)
        snprintf(out, cap, sa->sa_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, serv);
}

void http_req_set_work(http_req *rq, void *work, const http_work_ops *ops)
{
    rq->work = work;
    rq->work_ops = ops;
}

void *http_req_work(const http_req *rq) { return rq->work; }
void http_req_lock(http_req *rq) { pthread_mutex_lock(&rq->mu); }
void http_req_unlock(http_req *rq) { pthread_mutex_unlock(&rq->mu); }
void http_req_set_busy(http_req *rq, bool busy) { rq->busy = busy; }
bool http_req_open(const http_req *rq) { return rq->conn != NULL; }
bool http_req_gone(const http_req *rq) { return rq->client_gone; }
strbuf *http_req_out(http_req *rq) { return &rq->out; }

void http_req_end(http_req *rq)
{
    rq->ended = true;
    req_wake(rq);
}

/* ---- the body and the budget -------------------------------------------------------- */

/* Every byte held for a request - its body, its parse, its results and the
 * answer not yet sent - is taken from one budget (--request-memory) before
 * it is allocated; a request that cannot have it is answered 503. */
bool req_mem_take(http_req *rq, uint64_t n) { return req_budget_take(rq->l->o.budget, &rq->mem, n); }
void req_mem_give(http_req *rq, uint64_t n) { req_budget_give(rq->l->o.budget, &rq->mem, n); }
bool http_req_take(http_req *rq, uint64_t n) { return req_mem_take(rq, n); }
void http_req_give(http_req *rq, uint64_t n) { req_mem_give(rq, n); }
uint64_t http_req_limit(const http_req *rq) { return rq->l->o.budget->limit; }

int http_req_take_more(http_req *rq, uint64_t n, const char *what, char *msg, size_t cap)
{
    req_budget *b = rq->l->o.budget;
    if (n > b->limit || rq->mem > b->limit - n) { /* n may be UINT64_MAX: a bound that saturated */
        snprintf(msg, cap, "%s may need %llu bytes, more than --request-memory (%llu)", what,
                 (unsigned long long)(n > UINT64_MAX - rq->mem ? UINT64_MAX : rq->mem + n), (unsigned long long)b->limit);
        return 413;
    }
    if (!req_mem_take(rq, n)) {
        req_budget_busy_msg(b, msg, cap);
        return 503;
    }
    return 0;
}

const char *http_req_body(const http_req *rq, size_t *len)
{
    *len = rq->len;
    return rq->body ? rq->body : "";
}

void req_body_release(http_req *rq)
{
    req_mem_give(rq, rq->cap);
    free(rq->body);
    rq->body = NULL;
    rq->len = rq->cap = 0;
}

void http_req_body_free(http_req *rq) { req_body_release(rq); }

/* ---- suspend and resume ------------------------------------------------------------- */

/* Both with rq->mu held; see the invariant in listener.c. */
void http_req_sleep(http_req *rq)
{
    FERRY_ASSERT(!rq->on_worker); /* a prep worker's connection is suspended already (prep_start) */
    rq->suspended = true;
    MHD_suspend_connection(rq->conn);
}

void req_wake(http_req *rq)
{
    if (!rq->suspended) return;
    rq->suspended = false;
    MHD_resume_connection(rq->conn);
}

void http_req_wake(http_req *rq) { req_wake(rq); }

/* Has the peer of a suspended connection closed or reset it? rq->mu held. */
bool req_peer_gone(http_req *rq)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(rq->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

bool http_req_check_peer(http_req *rq)
{
    if (!rq->suspended || rq->client_gone || !req_peer_gone(rq)) return false;
    return rq->client_gone = true;
}

bool http_req_run(http_req *rq)
{
    rq->state = RQ_RUNNING;
    return rq->on_worker ? true : rq->route->resume(rq); /* on a worker: prep_deliver resumes */
}

/* ---- answers ------------------------------------------------------------------------ */

static void add_headers(const http_req *rq, struct MHD_Response *r, const char *type, const char *h1, const char *v1)
{
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (rq->l->o.no_store) MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    if (h1) MHD_add_response_header(r, h1, v1);
}

/* Queues body (malloc'd, taken over) with the given status. */
bool http_reply(http_req *rq, int code, const char *type, char *body, size_t len, const char *h1, const char *v1)
{
    rq->state = RQ_ANSWERED;
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body ? body : (char *)"",
                                                             body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(body);
        return false;
    }
    add_headers(rq, r, type, h1, v1);
    req_count(rq, code);
    if (rq->on_worker) { /* queued by the MHD thread (prep_deliver) */
        rq->pending = r;
        rq->pending_code = (unsigned)code;
        return true;
    }
    enum MHD_Result ret = MHD_queue_response(rq->conn, (unsigned)code, r);
    MHD_destroy_response(r);
    return ret == MHD_YES;
}

bool http_reply_json(http_req *rq, int code, strbuf *sb, const char *h1, const char *v1)
{
    if (sb->oom) {
        sb_free(sb);
        sb_puts(sb, "{\"error\": \"out of memory\"}");
        code = 503;
    }
    size_t len = sb->len;
    return http_reply(rq, code, "application/json", sb->data, len, h1, v1);
}

bool http_reply_json_text(http_req *rq, int code, const char *json)
{
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, json);
    return http_reply_json(rq, code, &sb, NULL, NULL);
}

void req_error_body(const http_req *rq, strbuf *sb, int code, const char *msg, const char *param, const char *errcode)
{
    rq->l->o.error_body(rq->url ? rq->url : "", sb, code, msg, param, errcode);
}

bool http_reply_fail(http_req *rq, int code, const char *msg, const char *param, const char *errcode, const char *h1,
                     const char *v1)
{
    strbuf sb;
    sb_init(&sb);
    req_error_body(rq, &sb, code, msg, param, errcode);
    return http_reply_json(rq, code, &sb, h1, v1);
}

bool http_reply_error(http_req *rq, int code, const char *msg)
{
    return http_reply_fail(rq, code, msg, NULL, NULL, NULL, NULL);
}

bool http_reply_busy(http_req *rq)
{
    char msg[160];
    req_budget_busy_msg(rq->l->o.budget, msg, sizeof msg);
    return http_reply_error(rq, 503, msg);
}

static void reader_free(void *cls) { http_req_unref(cls); }

/* MHD asks for the next bytes of a pieces answer: one piece at a time, so
 * that the answer is never held whole. */
static ssize_t pieces_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    http_req *rq = cls;
    while (rq->out.len == rq->out_sent) {
        rq->out.len = rq->out_sent = 0;
        if (!rq->next_piece(rq->piece_arg, &rq->out)) return MHD_CONTENT_READER_END_OF_STREAM;
        if (rq->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = rq->out.len - rq->out_sent < max ? rq->out.len - rq->out_sent : max;
    memcpy(buf, rq->out.data + rq->out_sent, n);
    rq->out_sent += n;
    return (ssize_t)n;
}

bool http_reply_pieces(http_req *rq, const char *type, const char *h1, const char *v1,
                       bool (*next)(void *arg, strbuf *sb), void *arg)
{
    FERRY_ASSERT(!rq->on_worker); /* queued by the MHD thread only (prep_deliver) */
    rq->next_piece = next;
    rq->piece_arg = arg;
    http_req_ref(rq); /* the reader's */
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK * 16, pieces_read, rq,
                                                               reader_free);
    if (!r) {
        http_req_unref(rq);
        return false;
    }
    add_headers(rq, r, type, h1, v1);
    rq->state = RQ_ANSWERED;
    enum MHD_Result ret = MHD_queue_response(rq->conn, 200, r);
    MHD_destroy_response(r);
    req_count(rq, 200);
    return ret == MHD_YES;
}

/* MHD asks for the next bytes of the event stream. */
static ssize_t events_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    http_req *rq = cls;
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
    if (rq->ended) {
        pthread_mutex_unlock(&rq->mu);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    http_req_sleep(rq); /* allowed from a content reader; the work's callbacks resume */
    pthread_mutex_unlock(&rq->mu);
    return 0;
}

bool http_reply_events(http_req *rq)
{
    FERRY_ASSERT(!rq->on_worker); /* queued by the MHD thread only (prep_deliver) */
    http_req_ref(rq); /* the reader's */
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, events_read, rq,
                                                               reader_free);
    if (!r) {
        http_req_unref(rq);
        return false;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    rq->state = RQ_STREAMING;
    enum MHD_Result ret = MHD_queue_response(rq->conn, 200, r);
    MHD_destroy_response(r);
    req_count(rq, 200);
    return ret == MHD_YES;
}
