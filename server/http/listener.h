/*
 * listener.h - one HTTP listener on libmicrohttpd (MHD): sockets,
 * connections and their limits, request heads and bodies, the
 * request-memory budget, suspend/resume, the reaper and the prep workers,
 * with the protocols left to a table of routes. Both HTTP front ends are
 * instances of it: the inference API (http_server.c: KServe v2, OpenAI,
 * /tokenize, /metrics) and the admin API (admin.c), each with its own
 * port, options and route table.
 *
 * A route names a method and a path and the handler that answers it. The
 * listener calls the handler once the request is whole (head and body):
 * on the connection's MHD thread, or on a prep worker (HTTP_PREP) with the
 * connection suspended meanwhile. The handler answers at once
 * (http_reply*), or starts work that answers later (generation: gen.h),
 * in which case the listener calls its `resume` each time the work wakes
 * the connection. A handler never sees MHD; the listener never sees a
 * protocol - an error body's format is the instance's (error_body).
 *
 * The request life cycle, the suspend/resume invariant, reference counting
 * and the limits are written out in listener.c.
 */
#ifndef FERRY_HTTP_LISTENER_H
#define FERRY_HTTP_LISTENER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../../engine/base/json.h"
#include "../../engine/base/status.h"
#include "../budget.h"
#include "../metrics.h"

typedef struct http_listener http_listener;
typedef struct http_req http_req;

/* ---- routes ----------------------------------------------------------------------- */

enum {
    HTTP_BODY = 1, /* the route takes a body (within max_body and the budget); others' bodies are dropped */
    HTTP_PREP = 2, /* answer runs on a prep worker, never on an MHD thread (its work grows with the body) */
};

typedef struct {
    const char *method;       /* "GET" (HEAD too), "POST" or "DELETE" */
    const char *path;         /* matched whole; a trailing '*' matches one more non-empty segment
                               * without '/' (http_req_param) */
    const char *label;        /* ferry_requests_total's endpoint label */
    /* The request is whole: answer it, or start work that will wake the
     * connection (http_req_run). False: close the connection. */
    bool (*answer)(http_req *rq);
    /* Work started by answer woke the connection (MHD thread): answer now,
     * or http_req_sleep until it wakes it again. NULL: answer never waits. */
    bool (*resume)(http_req *rq);
    unsigned flags;           /* HTTP_BODY, HTTP_PREP */
    const char *header;       /* a request header answer reads (http_req_header), or NULL */
    const void *arg;          /* the handler's own: the protocol it speaks (http_route_arg) */
} http_route;

/* A route answered at once, on the MHD thread. */
#define HTTP_ROUTE(method, path, label, answer) {method, path, label, answer, NULL, 0, NULL, NULL}

typedef struct {
    const http_route *routes;
    size_t n;
} http_route_table;

/* Where a method and path lead (route.c, apart from MHD). */
typedef struct {
    const http_route *route;  /* the route to answer with; NULL: refused */
    const char *label;        /* of the first route of that path, whatever the method (NULL: none) */
    const char *param;        /* the segment a '*' matched, within path (refused: the first route's) */
    int code;                 /* refused: 404 (no such path) or 405 (not that method) */
    const char *why;          /* the refusal's message */
    char allow[48];           /* 405: the Allow header ("GET, HEAD", "POST", ...) */
    char why_buf[64];
} http_match;

/* Finds the route of method + path in tables[0..n) (the first path that
 * matches decides; HEAD is answered by a GET route). */
void http_route_find(const http_route_table *const *tables, int n, const char *method, const char *path,
                     http_match *m);

/* ---- a listener ------------------------------------------------------------------- */

/* A request head refused before its body is read (401, an unknown model's
 * 404), or let in. */
typedef struct {
    int code;                 /* 0: let in */
    const char *msg;          /* a literal, or buf */
    const char *header, *value; /* one header for the answer, or NULL */
    char buf[160];
} http_refusal;

typedef struct {
    const char *what;         /* in messages: "HTTP", "admin API" */
    const char *log_name;     /* MHD's messages (FERRY_HTTP_LOG): "http", "admin: http" */
    const char *host_flag;    /* the setting that names host, in errors: "--host" */
    const char *host;         /* address to bind */
    int port;                 /* 0 = any free port (http_listener_port says which) */
    const http_route_table *const *tables; /* searched in order */
    int n_tables;
    const char *other_label;  /* the metrics label of a path no route has */
    void *ctx;                /* the handlers' (http_req_ctx) */
    /* Maps a URL onto the tables' paths: returns url, or a rewrite of it
     * in buf, or NULL with *no set (404). NULL: paths are looked up as
     * they come. */
    const char *(*resolve)(void *ctx, const char *url, char *buf, size_t cap, http_refusal *no);
    /* The head of every request, before anything else: a refusal is
     * answered at once (and the connection keeps its place in the waiting
     * limit's order, mhd_conns_admit, only when let in). NULL: all in. */
    http_refusal (*head)(void *ctx, http_req *rq, const char *method, const char *url);
    /* An error's body, in the format of the protocol at url. */
    void (*error_body)(const char *url, strbuf *sb, int code, const char *msg, const char *param, const char *errcode);
    bool no_store;            /* every answer says Cache-Control: no-store */
    bool unescape;            /* percent-decode paths (except %00); false: matched as sent */
    uint64_t max_body;        /* larger bodies: 413 */
    const char *max_body_flag; /* named in the 413 ("--max-body"), or NULL */
    req_budget *budget;       /* bodies and what handlers take (http_req_take); owned by the caller */
    uint64_t max_header;      /* largest request head (431/414), and MHD's memory per connection
                               * (twice it); 0: MHD's defaults, no check */
    int request_timeout_s;    /* to send a request's head and body */
    int connection_timeout_s; /* a connection without a byte read or written for this long is closed */
    int max_connections;      /* MHD's limit on open connections */
    int max_connections_per_ip; /* 0: none */
    int max_waiting;          /* connections still sending a request (mhd_conns); 0: no such limit */
    int threads;              /* MHD's connection threads */
    int prep_threads;         /* prep workers (HTTP_PREP); 0: answered on MHD's threads */
    unsigned listen_backlog;  /* 0: MHD's default */
    metrics *counters;        /* ferry_requests_total; owned by the caller */
} http_listener_opts;

ferry_status http_listener_start(const http_listener_opts *o, http_listener **out);
int http_listener_port(const http_listener *l);
/* Stops accepting connections at once; requests on the open ones see
 * http_req_draining. Called again: nothing. */
void http_listener_quiesce(http_listener *l);
bool http_listener_draining(const http_listener *l);
/* Requests whose work (http_req_set_busy) still runs. */
int http_listener_busy(http_listener *l);
/* Stops listening and closes every connection. A request still suspended
 * waiting for work is ended through its work's abort first (no scheduler
 * callback may be left to come: sched_free before). */
void http_listener_stop(http_listener *l);

/* ---- a request, for its handler --------------------------------------------------- */

void *http_req_ctx(const http_req *rq);
const void *http_req_arg(const http_req *rq);       /* its route's arg */
const char *http_req_param(const http_req *rq);     /* the segment the route's '*' matched */
/* A request header as sent (NULL: absent). On the MHD thread any; on a
 * prep worker the route's `header` only (kept for it before it ran). */
const char *http_req_header(const http_req *rq, const char *name);
/* The client's address, "host:port" ("unknown peer" when MHD has none). */
void http_req_peer(const http_req *rq, char *out, size_t cap);
bool http_req_draining(const http_req *rq);
metrics *http_req_counters(const http_req *rq);

/* The body (HTTP_BODY routes; "" when none came), and giving it back. */
const char *http_req_body(const http_req *rq, size_t *len);
void http_req_body_free(http_req *rq);

/* The budget, for what the handler holds on the request's behalf: given
 * back whole when the request is freed. */
bool http_req_take(http_req *rq, uint64_t n);
void http_req_give(http_req *rq, uint64_t n);
uint64_t http_req_limit(const http_req *rq);
/* n more bytes: 0 when taken; else 413 (`what` could never fit the
 * budget: the message says so) or 503 (others hold it), msg set. */
int http_req_take_more(http_req *rq, uint64_t n, const char *what, char *msg, size_t cap);

/* Answers. Each returns false when the connection is to be closed. On a
 * prep worker the answer is kept and queued by the MHD thread. */
bool http_reply(http_req *rq, int code, const char *type, char *body, size_t len, const char *h1, const char *v1);
/* sb (taken over) as application/json; a body out of memory is a 503. */
bool http_reply_json(http_req *rq, int code, strbuf *sb, const char *h1, const char *v1);
/* A JSON text known whole (a literal). */
bool http_reply_json_text(http_req *rq, int code, const char *json);
/* An error in the instance's format (error_body) for the request's path. */
bool http_reply_error(http_req *rq, int code, const char *msg);
bool http_reply_fail(http_req *rq, int code, const char *msg, const char *param, const char *errcode, const char *h1,
                     const char *v1);
/* 503 with the budget's "server busy" message. */
bool http_reply_busy(http_req *rq);
/* An answer written piece by piece as the client reads it: next appends
 * the next piece to sb and returns false when none is left (sb.oom: the
 * connection is cut). MHD thread. */
bool http_reply_pieces(http_req *rq, const char *type, const char *h1, const char *v1,
                       bool (*next)(void *arg, strbuf *sb), void *arg);
/* An event stream (text/event-stream): the events the work appends to
 * http_req_out, until http_req_end. MHD thread. */
bool http_reply_events(http_req *rq);

/* ---- a request whose work runs elsewhere ------------------------------------------

 * The work (gen.c: rows on the engine thread) is tied to the request: it
 * holds a reference for each callback still to come, and the request's
 * lock guards what both touch. */
typedef struct {
    /* The client left, or the connection completed, while busy: stop the
     * work (no lock held; its callbacks still come). */
    void (*cancel)(http_req *rq);
    /* The listener stops with the request suspended (a callback that
     * never came): end it now. Lock held. */
    void (*abort)(http_req *rq, const char *why);
    void (*free)(void *work);
} http_work_ops;

void http_req_set_work(http_req *rq, void *work, const http_work_ops *ops);
void *http_req_work(const http_req *rq);
void http_req_ref(http_req *rq);
void http_req_unref(http_req *rq);
void http_req_lock(http_req *rq);
void http_req_unlock(http_req *rq);
/* Work in flight (lock held): the reaper watches a busy suspended
 * request's client, drain waits for it, completion cancels it. */
void http_req_set_busy(http_req *rq, bool busy);
/* The work is submitted: the answer comes through resume (on a prep
 * worker: once it is done). */
bool http_req_run(http_req *rq);
/* Lock held. Suspends the connection until http_req_wake (MHD thread,
 * nothing to send yet). */
void http_req_sleep(http_req *rq);
void http_req_wake(http_req *rq);
/* Lock held: the connection is still there (MHD has not completed it). */
bool http_req_open(const http_req *rq);
/* Lock held: the client left (noticed by the reaper or http_req_check_peer). */
bool http_req_gone(const http_req *rq);
/* Lock held: while suspended, peeks at the socket; true when this call
 * found the client gone (then http_req_gone). */
bool http_req_check_peer(http_req *rq);
/* Lock held: the events not yet sent (http_reply_events), and the end of them. */
strbuf *http_req_out(http_req *rq);
void http_req_end(http_req *rq);

#endif
