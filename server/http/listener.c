/*
 * listener.c - libmicrohttpd's life cycle for one HTTP listener: the
 * daemon, its callbacks, the request heads and bodies and their limits,
 * the prep workers and the reaper. See listener.h; request objects and
 * answers are in request.c, the routes' matching in route.c.
 *
 * Threads. MHD runs a small pool of connection threads (poll: see
 * http_listener_start); each connection is handled by one of them at a
 * time, so the access handler, the stream reader and the completion
 * callback of one request never run at once. An HTTP_PREP route's answer
 * (parse, chat template, encode, submit; /tokenize) runs on one of
 * prep_threads prep workers (prep_start), its connection suspended
 * meanwhile, so a slow encode never stalls the other connections of an
 * MHD thread. Work a handler started (gen.c: the engine thread's scheduler
 * callbacks) wakes the connection. Nothing here blocks on the engine.
 *
 * Request life cycle (struct http_req, one per HTTP request):
 *
 *   RECEIVING --body complete--> answered at once (GET, errors)
 *       |
 *       +--HTTP_PREP--> PREPARING (prep worker) --error--> answered on resume
 *                           |
 *                           +--work started--> RUNNING --done (or first event)--> answered
 *                                                 ^  |                            (STREAMING)
 *                                                 +--+ suspended until resumed
 *
 * Suspend/resume invariant: `suspended` is set, and MHD_suspend_connection
 * called, by the connection's MHD thread with rq->mu held, only when there
 * is nothing to send yet (http_req_sleep); whoever makes progress (a
 * callback with a token or the end) clears it and calls
 * MHD_resume_connection under the same mutex (http_req_wake). So a resume
 * always follows its suspend, and a suspended request always has a
 * callback of its work still to come (sched_free guarantees on_done for
 * everything queued). MHD does not watch a suspended socket, so a client
 * that went away is noticed by peeking at the socket - by the work at its
 * next event (http_req_check_peer) and by the reaper (below) - (safe: MHD
 * neither reads nor closes a suspended connection), which cancels the
 * work; a streamed one is also noticed when the next write fails. Either
 * way MHD's completion callback cancels what still runs.
 *
 * Lifetime: a request is reference counted - one reference for MHD
 * (dropped in the completion callback), one per callback its work still
 * has to come (gen.c: one per row submitted to the scheduler, dropped after
 * its on_done), one for a pieces or stream answer's reader (dropped when
 * MHD destroys the response) - and freed by whoever drops the last.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "listener_impl.h"

#define STOP_GRACE_MS 2000
#define DRAIN_MIN (1u << 20) /* body bytes past max_body read to answer 413 */

static void conn_mark(http_listener *l, struct MHD_Connection *c, bool receiving);

/* ---- the request head: max_header ------------------------------------------------ */

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
    mhd_conns_set_url_bytes(((http_listener *)cls)->conns, c, uri ? strlen(uri) : 0);
    return NULL;
}

static enum MHD_Result add_field_bytes(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                       const char *value, size_t value_size)
{
    (void)kind, (void)key, (void)value;
    *(uint64_t *)cls += key_size + 2 + value_size + 2; /* "name: value\r\n" */
    return MHD_YES;
}

/* A header value the client cut with a NUL byte. libmicrohttpd 0.9.75 ends
 * a value at a NUL (its length too), so "Bearer TOKEN<NUL>junk" would read
 * as "Bearer TOKEN". Its head stays in the connection's read buffer as
 * received, with the colon and each line's CR and LF overwritten by NULs
 * and the fields listed in the order they came. So between a value's end
 * and the next field's name there are NULs alone (1 for a bare LF, 2 for
 * CRLF) unless the client cut the value, or folded it onto another line
 * (obs-fold, which 0.9.75 mangles into the name: refused too, as RFC 9112
 * allows). After the last field come the blank line's NULs (1-2 more) and
 * then maybe a body: a byte other than NUL within the 4 after it (2 where
 * the fields before ended with bare LFs, or there were none) is a cut, so
 * nothing is read past the head. A value followed by NULs alone drops nothing and is
 * let be. test_hardening test_nul_in_a_header_is_refused holds this
 * reading of the buffer to the library in use. */
typedef struct {
    const char *key, *value; /* the field before this one, judged when its successor's name is known */
    size_t value_size;
    size_t gap;              /* its bytes between the value's end and the next name (0: none yet) */
    const char *cut;         /* the first field found cut, or NULL */
} nul_scan;

#define NUL_GAP_MAX 65536 /* past this, two fields are not neighbours in one buffer: not judged */

static bool gap_cut(const char *end, const char *next_key, size_t *gap)
{
    uintptr_t e = (uintptr_t)end, k = (uintptr_t)next_key;
    if (k <= e || k - e > NUL_GAP_MAX) return false;
    *gap = k - e;
    for (const char *p = end; p < next_key; p++)
        if (*p) return true;
    return false;
}

static bool last_cut(const char *end, size_t prev_gap)
{
    int tail = prev_gap == 2 ? 4 : 2; /* CRLF CRLF, or LF LF: the head's last bytes */
    for (int k = 0; k < tail; k++)
        if (end[k]) return true;
    return false;
}

static enum MHD_Result scan_field(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                  const char *value, size_t value_size)
{
    (void)kind, (void)key_size;
    nul_scan *s = cls;
    if (s->value && !s->cut && gap_cut(s->value + s->value_size, key, &s->gap)) s->cut = s->key;
    s->key = key, s->value = value, s->value_size = value_size;
    return MHD_YES;
}

/* On a request's first call: 0 when its head is within max_header, else
 * 414 (the URL alone is over it) or 431, or 400 for a header value holding
 * a NUL or folded (scan_field), with the message in msg. The head
 * counts as MHD received it: the request line (method, URL, version, two
 * spaces, CRLF), each header line as "name: value" CRLF (blanks MHD
 * dropped around a value are not counted) and the blank line. An untracked connection's URL
 * counts as the unescaped path (on_uri had nowhere to keep its length). */
static int head_check(const http_listener *l, struct MHD_Connection *c, const char *url, const char *method,
                      const char *version, char *msg, size_t cap)
{
    nul_scan scan = {0};
    MHD_get_connection_values_n(c, MHD_HEADER_KIND, scan_field, &scan);
    if (!scan.cut && scan.value && last_cut(scan.value + scan.value_size, scan.gap)) scan.cut = scan.key;
    if (scan.cut) {
        snprintf(msg, cap, "header %.48s holds a NUL byte or is folded (RFC 9110 forbids both)", scan.cut);
        return 400;
    }
    uint64_t limit = l->o.max_header;
    if (limit == 0) return 0;
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

/* Sets rq->route and its label, or rq->early_code/msg/allow (404, 405). */
static void route(http_req *rq, const char *url, const char *method)
{
    const http_listener_opts *o = &rq->l->o;
    char buf[512];
    const char *path = url;
    if (o->resolve) {
        http_refusal no = {0};
        if (!(path = o->resolve(o->ctx, url, buf, sizeof buf, &no))) {
            rq->label = o->other_label;
            rq->early_code = no.code;
            snprintf(rq->early_buf, sizeof rq->early_buf, "%s", no.msg);
            rq->early_msg = rq->early_buf;
            return;
        }
    }
    http_match m;
    http_route_find(o->tables, o->n_tables, method, path, &m);
    rq->label = m.label ? m.label : o->other_label;
    if (m.route) {
        rq->route = m.route;
        /* a '*' matches the path's last segment, which resolve leaves as
         * it was: the same bytes at the end of url (MHD's, valid until the
         * request completes) */
        rq->param = m.param ? url + strlen(url) - strlen(m.param) : NULL;
        return;
    }
    rq->early_code = m.code;
    snprintf(rq->early_buf, sizeof rq->early_buf, "%s", m.why);
    rq->early_msg = rq->early_buf;
    if (m.code == 405) {
        snprintf(rq->allow_buf, sizeof rq->allow_buf, "%s", m.allow);
        rq->allow = rq->allow_buf;
    }
}

static bool takes_body(const http_req *rq) { return rq->route && (rq->route->flags & HTTP_BODY); }

/* ---- the prep workers ------------------------------------------------------------ */

/* An HTTP_PREP route's body is in: what follows - parsing it, rendering a
 * chat template, encoding text, submitting the rows, or answering
 * /tokenize - takes time in proportion to the body (up to the regex and
 * template work limits), so it runs on a prep worker, never on an MHD
 * thread, which serves many other connections (health checks, other
 * clients' tokens). The connection is suspended meanwhile; `suspended`
 * stays false, so no callback of the work resumes it: only the worker
 * does, when it is done, and the MHD thread then queues the worker's
 * answer (prep_deliver) or, if work was started, resumes it as usual. */
static void prep_run(void *arg)
{
    http_req *rq = arg;
    rq->on_worker = true;
    bool ok = rq->route->answer(rq);
    rq->on_worker = false;
    rq->pending_fail = !ok && !rq->pending;
    pthread_mutex_lock(&rq->mu);
    rq->prepared = true;
    MHD_resume_connection(rq->conn);
    pthread_mutex_unlock(&rq->mu);
}

static enum MHD_Result prep_start(http_req *rq)
{
    http_listener *l = rq->l;
    pthread_rwlock_rdlock(&l->work_lock);
    if (!l->work) { /* stopping (or no queue): answered here */
        pthread_rwlock_unlock(&l->work_lock);
        return rq->route->answer(rq) ? MHD_YES : MHD_NO;
    }
    const char *h = rq->route->header; /* MHD's values are read on its thread only */
    const char *v = h ? MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, h) : NULL;
    if (v && !(rq->kept_header = strdup(v))) {
        pthread_rwlock_unlock(&l->work_lock);
        return http_reply_error(rq, 503, "out of memory") ? MHD_YES : MHD_NO;
    }
    rq->state = RQ_PREPARING;
    pthread_mutex_lock(&rq->mu);
    MHD_suspend_connection(rq->conn);
    pthread_mutex_unlock(&rq->mu);
    workq_post(l->work, prep_run, rq); /* without a thread or memory: run here, resumed at once */
    pthread_rwlock_unlock(&l->work_lock);
    return MHD_YES;
}

/* The MHD thread, resumed after prep_run: its answer, or the work's wait. */
static enum MHD_Result prep_deliver(http_req *rq)
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
    return rq->route->resume(rq) ? MHD_YES : MHD_NO;
}

/* ---- bodies: max_body and the budget ---------------------------------------------- */

static void too_large_msg(const http_req *rq, char *msg, size_t cap)
{
    const http_listener_opts *o = &rq->l->o;
    snprintf(msg, cap, "request body larger than %llu bytes%s%s%s", (unsigned long long)o->max_body,
             o->max_body_flag ? " (" : "", o->max_body_flag ? o->max_body_flag : "", o->max_body_flag ? ")" : "");
}

/* A chunked body (which announces no length) just went past max_body:
 * its 413 goes out now, past MHD (mhd_answer_raw), and the rest of the body
 * is read and dropped until it ends or the drain allowance is spent
 * (on_request), then the connection closes - so the client reads the 413
 * however much more it meant to send. */
static void refuse_midway(http_req *rq)
{
    char msg[96];
    too_large_msg(rq, msg, sizeof msg);
    strbuf sb;
    sb_init(&sb);
    req_error_body(rq, &sb, 413, msg, NULL, NULL);
    /* written whole in practice (a few hundred bytes); either way the write
     * side is shut: tried once */
    mhd_answer_raw(rq->conn, 413, "application/json", sb.oom ? "" : sb.data, sb.oom ? 0 : sb.len);
    rq->raw_answered = true;
    req_count(rq, 413);
    sb_free(&sb);
}

static enum MHD_Result dispatch(http_req *rq)
{
    if (rq->early_code)
        return http_reply_fail(rq, rq->early_code, rq->early_msg, NULL, NULL, rq->allow ? MHD_HTTP_HEADER_ALLOW : NULL,
                               rq->allow)
                   ? MHD_YES
                   : MHD_NO;
    if (rq->too_large) {
        char msg[96];
        too_large_msg(rq, msg, sizeof msg);
        return http_reply_error(rq, 413, msg) ? MHD_YES : MHD_NO;
    }
    if (rq->over_budget)
        return http_reply_error(rq, 503, "server busy: too many request bytes in flight") ? MHD_YES : MHD_NO;
    if (rq->route->flags & HTTP_PREP) return prep_start(rq);
    return rq->route->answer(rq) ? MHD_YES : MHD_NO;
}

static enum MHD_Result count_content_length(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind, (void)value;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) (*(int *)cls)++;
    return MHD_YES;
}

/* Appends upload data, within max_body and the budget. */
static void body_append(http_req *rq, const char *data, size_t n)
{
    uint64_t max_body = rq->l->o.max_body;
    if (rq->early_code || rq->too_large || rq->over_budget || !takes_body(rq)) return; /* discard */
    if (n > max_body - rq->len) {
        rq->too_large = true;
        req_body_release(rq);
        return;
    }
    if (rq->len + n > rq->cap) {
        size_t cap = rq->cap ? rq->cap : 4096;
        while (cap < rq->len + n) cap *= 2;
        if (cap > max_body) cap = (size_t)max_body;
        uint64_t grow = cap - rq->cap;
        bool taken = req_mem_take(rq, grow);
        char *p = taken ? realloc(rq->body, cap) : NULL;
        if (!p) {
            if (taken) req_mem_give(rq, grow);
            rq->over_budget = true;
            req_body_release(rq);
            return;
        }
        rq->body = p;
        rq->cap = cap;
    }
    memcpy(rq->body + rq->len, data, n);
    rq->len += n;
}

/* ---- MHD callbacks ---------------------------------------------------------------- */

/* A request's first call: its head is whole. Route it, check it, and
 * refuse a body announced too large before it is sent. */
static enum MHD_Result on_head(http_listener *l, http_req *rq, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version)
{
    rq->url = url;
    route(rq, url, method);
    char msg[128];
    int code = head_check(l, c, url, method, version, msg, sizeof msg);
    if (code) {
        /* closed after the answer, as MHD closes after its own: the rest of
         * the request is not read */
        conn_mark(l, c, false);
        return http_reply_fail(rq, code, msg, NULL, NULL, MHD_HTTP_HEADER_CONNECTION, "close") ? MHD_YES : MHD_NO;
    }
    if (l->o.head) {
        http_refusal no = l->o.head(l->o.ctx, rq, method, url);
        if (no.code) {
            conn_mark(l, c, false); /* answered: off the receive deadline */
            return http_reply_fail(rq, no.code, no.msg, NULL, NULL, no.header, no.value) ? MHD_YES : MHD_NO;
        }
    }
    mhd_conns_admit(l->conns, c);
    int lengths = 0;
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_content_length, &lengths);
    if (lengths > 1) {
        /* two lengths: a proxy in front may have read the body by the other (request smuggling) */
        rq->route = NULL;
        rq->early_code = 400;
        rq->early_msg = "more than one Content-Length header";
        rq->allow = NULL;
        conn_mark(l, c, false);
        return dispatch(rq);
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (!rq->early_code && takes_body(rq) && cl) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(cl, &end, 10);
        if (end != cl && !*end && (errno || v > l->o.max_body)) {
            rq->too_large = true;
            conn_mark(l, c, false);
            return dispatch(rq);
        }
    }
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    http_listener *l = cls;
    http_req *rq = *con_cls;
    if (!rq) {
        if (!(rq = req_new(l, c))) return MHD_NO;
        *con_cls = rq;
        return on_head(l, rq, c, url, method, version);
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
            /* past max_body (a chunked body announces no length): the 413
             * goes out at once (refuse_midway), and the rest is read and
             * dropped - for at most another max(max_body, 1 MiB), so that
             * the client reads it rather than a reset; beyond that the
             * connection is closed rather than read on (a 30 GB body) */
            uint64_t max_body = l->o.max_body;
            if (rq->too_large && !rq->raw_answered) refuse_midway(rq);
            if (rq->too_large && rq->received - max_body > (max_body > DRAIN_MIN ? max_body : DRAIN_MIN)) {
                if (!rq->raw_answered) req_count(rq, 413);
                rq->state = RQ_ANSWERED;
                return MHD_NO;
            }
            return MHD_YES;
        }
        conn_mark(l, c, false);
        if (rq->raw_answered) { /* the body ended within the drain: its 413 is out, the connection closes */
            rq->state = RQ_ANSWERED;
            return MHD_NO;
        }
        return dispatch(rq);
    case RQ_RUNNING: return rq->route->resume(rq) ? MHD_YES : MHD_NO;
    case RQ_PREPARING: /* not called while suspended */
    case RQ_STREAMING:
    case RQ_ANSWERED: *upload_data_size = 0; return MHD_YES;
    }
    return MHD_NO;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)toe;
    http_listener *l = cls;
    http_req *rq = *con_cls;
    conn_mark(l, c, true); /* a kept-alive connection now waits for its next request */
    if (!rq) return;
    *con_cls = NULL;
    __atomic_fetch_sub(&l->active, 1, __ATOMIC_RELAXED);
    /* never answered: the client left while its request waited (a 499 is
     * counted when one is queued; this one had no chance to be) */
    if (rq->state != RQ_ANSWERED && rq->state != RQ_STREAMING) req_count(rq, 499);
    pthread_mutex_lock(&rq->mu);
    rq->conn = NULL;
    bool busy = rq->busy;
    pthread_mutex_unlock(&rq->mu);
    if (busy) rq->work_ops->cancel(rq); /* the client went away (or the server is stopping): free the slots */
    http_req_unref(rq);
}

/* ---- connections: the receive deadline -------------------------------------------- */

/* A request's head is whole and its body received (receiving false), or
 * it was answered and the connection waits for the next head (true: the
 * deadline starts again). An idle keep-alive connection counts as receiving
 * its next head; the reaper (below) cuts those past the deadline. */
static void conn_mark(http_listener *l, struct MHD_Connection *c, bool receiving)
{
    mhd_conns_mark(l->conns, c, receiving);
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
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

/* Paths matched as sent (the admin API's: a "%00" cannot end a job id early). */
static size_t no_unescape(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls, (void)c;
    return strlen(s);
}

/* ---- the reaper ------------------------------------------------------------------- */

/* The reaper also enforces the receive deadline (above). MHD does not
 * watch a suspended socket, and the work notices a departed client only at
 * its next event: a request still queued or prefilling would hold its
 * place until then. Every REAP_INTERVAL_US this thread peeks at the
 * sockets of busy suspended requests and cancels the work of those whose
 * client is gone. Locks: reg_mu, then rq->mu (as http_listener_stop); the
 * cancel itself runs with neither held, as on_completed's does. */
#define REAP_INTERVAL_US 250000
#define REAP_BATCH 64

static void *reaper_main(void *arg)
{
    http_listener *l = arg;
    while (!__atomic_load_n(&l->reaper_stop, __ATOMIC_ACQUIRE)) {
        usleep(REAP_INTERVAL_US);
        mhd_conns_cut_slow(l->conns);
        http_req *gone[REAP_BATCH];
        int n = 0;
        pthread_mutex_lock(&l->reg_mu);
        for (http_req *rq = l->live; rq && n < REAP_BATCH; rq = rq->next) {
            pthread_mutex_lock(&rq->mu);
            if (rq->suspended && !rq->client_gone && rq->busy && req_peer_gone(rq)) {
                rq->client_gone = true;
                rq->refs++; /* keeps rq alive past reg_mu */
                gone[n++] = rq;
            }
            pthread_mutex_unlock(&rq->mu);
        }
        pthread_mutex_unlock(&l->reg_mu);
        for (int i = 0; i < n; i++) {
            gone[i]->work_ops->cancel(gone[i]);
            http_req_unref(gone[i]);
        }
    }
    return NULL;
}

/* MHD's own messages: kept quiet (client resets are routine); set
 * FERRY_HTTP_LOG=1 to see them. */
static void on_log(void *cls, const char *fmt, va_list ap)
{
    const http_listener *l = cls;
    mhd_log(l->log, l->o.log_name, fmt, ap);
}

/* ---- the listener ------------------------------------------------------------------ */

ferry_status http_listener_start(const http_listener_opts *o, http_listener **out)
{
    *out = NULL;
    http_listener *l = calloc(1, sizeof *l);
    if (!l) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    l->o = *o;
    l->listen_fd = MHD_INVALID_SOCKET;
    l->log = getenv("FERRY_HTTP_LOG") != NULL;
    pthread_mutex_init(&l->reg_mu, NULL);
    pthread_rwlock_init(&l->work_lock, NULL);
    if (o->prep_threads > 0) l->work = workq_new(o->prep_threads, "ferry-http-prep"); /* NULL: answered on MHD's threads */
    if (!(l->conns = mhd_conns_new(o->request_timeout_s, o->max_waiting))) {
        http_listener_stop(l);
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }

    struct addrinfo *ai;
    ferry_status rst = mhd_resolve(o->host, o->port, o->host_flag, &ai);
    if (rst != FERRY_OK) {
        http_listener_stop(l);
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
    /* the options every listener has, then those only some set */
    struct MHD_OptionItem opt[16];
    int n = 0;
    opt[n++] = (struct MHD_OptionItem){MHD_OPTION_SOCK_ADDR, 0, ai->ai_addr};
    opt[n++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)on_completed, l};
    opt[n++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)mhd_conns_notify, l->conns};
    opt[n++] = (struct MHD_OptionItem){MHD_OPTION_UNESCAPE_CALLBACK,
                                       (intptr_t)(o->unescape ? unescape : no_unescape), l};
    opt[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_LIMIT, o->max_connections, NULL};
    opt[n++] = (struct MHD_OptionItem){MHD_OPTION_THREAD_POOL_SIZE, o->threads, NULL};
    opt[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_TIMEOUT, o->connection_timeout_s, NULL};
    opt[n++] = (struct MHD_OptionItem){MHD_OPTION_EXTERNAL_LOGGER, (intptr_t)on_log, l};
    if (o->max_header) {
        opt[n++] = (struct MHD_OptionItem){MHD_OPTION_URI_LOG_CALLBACK, (intptr_t)on_uri, l};
        opt[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                                           (intptr_t)(HEAD_POOL_RATIO * o->max_header), NULL};
    }
    if (o->max_connections_per_ip)
        opt[n++] = (struct MHD_OptionItem){MHD_OPTION_PER_IP_CONNECTION_LIMIT, o->max_connections_per_ip, NULL};
    if (o->listen_backlog) opt[n++] = (struct MHD_OptionItem){MHD_OPTION_LISTEN_BACKLOG_SIZE, o->listen_backlog, NULL};
    opt[n++] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
    errno = 0;
    l->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, l, MHD_OPTION_ARRAY, opt, MHD_OPTION_END);
    int err = errno;
    freeaddrinfo(ai);
    if (!l->d) {
        ferry_status st = ferry_fail(FERRY_ERR_IO, "%s%scannot listen on %s port %d%s%s", o->what ? o->what : "",
                                     o->what ? ": " : "", o->host, o->port, err ? ": " : "", err ? strerror(err) : "");
        http_listener_stop(l);
        return st;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(l->d, MHD_DAEMON_INFO_BIND_PORT);
    l->port = di ? di->port : o->port;
    l->reaper_running = pthread_create(&l->reaper, NULL, reaper_main, l) == 0;
    if (!l->reaper_running) {
        /* it enforces the receive deadline (slow heads) and notices clients
         * that left a suspended request: a listener without it is refused */
        http_listener_stop(l);
        return ferry_fail(FERRY_ERR_IO, "%s%scannot start the connection reaper thread", o->what ? o->what : "",
                          o->what ? ": " : "");
    }
    *out = l;
    return FERRY_OK;
}

int http_listener_port(const http_listener *l) { return l->port; }

bool http_listener_draining(const http_listener *l) { return __atomic_load_n(&l->draining, __ATOMIC_RELAXED); }

int http_listener_busy(http_listener *l)
{
    int n = 0;
    pthread_mutex_lock(&l->reg_mu);
    for (http_req *rq = l->live; rq; rq = rq->next) {
        pthread_mutex_lock(&rq->mu);
        n += rq->busy;
        pthread_mutex_unlock(&rq->mu);
    }
    pthread_mutex_unlock(&l->reg_mu);
    return n;
}

void http_listener_quiesce(http_listener *l)
{
    if (!__atomic_exchange_n(&l->draining, 1, __ATOMIC_RELAXED) && l->d) {
        /* MHD stops accepting; the kernel would still queue connections on
         * the socket, which MHD's threads may touch until stopped (so it
         * stays open): shutting it down makes new connections be refused */
        l->listen_fd = MHD_quiesce_daemon(l->d);
        if (l->listen_fd != MHD_INVALID_SOCKET) shutdown(l->listen_fd, SHUT_RDWR);
    }
}

void http_listener_stop(http_listener *l)
{
    if (!l) return;
    if (l->reaper_running) {
        __atomic_store_n(&l->reaper_stop, 1, __ATOMIC_RELEASE);
        pthread_join(l->reaper, NULL);
        l->reaper_running = false;
    }
    /* every request a worker prepares is resumed when it is done: none is
     * left suspended for it below (later ones are answered on MHD's thread) */
    pthread_rwlock_wrlock(&l->work_lock);
    workq *work = l->work;
    l->work = NULL;
    pthread_rwlock_unlock(&l->work_lock);
    workq_free(work);
    if (l->d) {
        /* MHD aborts when stopped with a connection suspended. sched_free has
         * ended every request it knew; one still waiting means a callback
         * that never came - end it here rather than abort. */
        pthread_mutex_lock(&l->reg_mu);
        for (http_req *rq = l->live; rq; rq = rq->next) {
            pthread_mutex_lock(&rq->mu);
            if (rq->suspended) { /* only a request with work sleeps (http_req_sleep) */
                if (rq->work_ops) rq->work_ops->abort(rq, "server stopped before the request ended");
                rq->ended = true;
                req_wake(rq);
            }
            pthread_mutex_unlock(&rq->mu);
        }
        pthread_mutex_unlock(&l->reg_mu);
        /* stop accepting, then give the answers already queued (the 503s and
         * error events of a scheduler that just stopped) a moment to leave */
        MHD_socket fd = l->listen_fd != MHD_INVALID_SOCKET ? l->listen_fd : MHD_quiesce_daemon(l->d);
        for (int i = 0; i < STOP_GRACE_MS / 10 && __atomic_load_n(&l->active, __ATOMIC_RELAXED) > 0; i++)
            usleep(10000);
        MHD_stop_daemon(l->d);
        if (fd != MHD_INVALID_SOCKET) close(fd); /* MHD's threads may use it until stopped */
    }
    mhd_conns_free(l->conns); /* MHD has closed every connection */
    pthread_rwlock_destroy(&l->work_lock);
    pthread_mutex_destroy(&l->reg_mu);
    free(l);
}
