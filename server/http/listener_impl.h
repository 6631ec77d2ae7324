/*
 * listener_impl.h - the listener's own structs, shared by its two files
 * (listener.c: MHD's daemon, its callbacks, the limits, the reaper, the
 * prep workers; request.c: request objects and their answers). Nothing
 * outside server/http/listener*.c and request.c includes it.
 */
#ifndef FERRY_HTTP_LISTENER_IMPL_H
#define FERRY_HTTP_LISTENER_IMPL_H

#include <microhttpd.h>
#include <pthread.h>

#include "../mhd_common.h"
#include "../workq.h"
#include "listener.h"

#define STREAM_BLOCK 4096

struct http_listener {
    http_listener_opts o;    /* as started (strings and tables are the caller's, outliving the listener) */
    struct MHD_Daemon *d;
    bool log;                /* FERRY_HTTP_LOG set: print MHD's own messages (read once, at start) */
    int port;
    int active;              /* atomic: requests between their first call and completion */
    pthread_t reaper;        /* notices clients that left while their request waits */
    bool reaper_running;
    int reaper_stop;         /* atomic */
    pthread_mutex_t reg_mu;  /* guards the list of live requests */
    struct http_req *live;
    mhd_conns *conns;        /* open connections: the receive deadline (mhd_common.h) */
    int draining;            /* atomic: stopping; new requests get 503, ready says not */
    MHD_socket listen_fd;    /* after http_listener_quiesce: the socket MHD no longer accepts on */
    pthread_rwlock_t work_lock; /* guards work: read to post, written to close it (http_listener_stop) */
    workq *work;             /* the HTTP_PREP routes' work (prep_start); NULL once stopped */
};

typedef enum { RQ_RECEIVING, RQ_PREPARING, RQ_RUNNING, RQ_STREAMING, RQ_ANSWERED } rq_state;

struct http_req {
    http_listener *l;
    struct http_req *prev, *next; /* l->live, under l->reg_mu */
    const http_route *route;     /* NULL: refused on its head (early_code) */
    const char *label;           /* the metrics label */
    const char *url;             /* MHD's, valid until the request completes */
    const char *param;           /* within url */
    rq_state state;              /* the connection's MHD thread, or its prep worker while PREPARING */
    /* decided on the head; answered once the body is in */
    int early_code;
    const char *early_msg, *allow;
    char early_buf[160];
    char allow_buf[48];
    /* body */
    char *body;
    size_t len, cap;
    bool too_large, over_budget;
    bool raw_answered;           /* too_large midway: the 413 went out past MHD (refuse_midway) */
    uint64_t received;           /* body bytes received, kept or not */
    uint64_t mem;                /* bytes of the budget this request holds (MHD thread or its prep worker; last unref) */
    char *kept_header;           /* the route's header, read before PREPARING */
    /* PREPARING: a prep worker's answer, queued by the MHD thread once resumed (prep_deliver) */
    bool on_worker;              /* http_reply keeps its answer in pending instead of queueing it */
    bool prepared;               /* the worker is done: prep_deliver on the next call */
    struct MHD_Response *pending;
    unsigned pending_code;
    bool pending_fail;           /* the worker's step failed without an answer: close the connection */
    /* the handler's work (http_req_set_work) */
    void *work;
    const http_work_ops *work_ops;
    /* pieces (http_reply_pieces): the MHD thread only */
    bool (*next_piece)(void *arg, strbuf *sb);
    void *piece_arg;

    pthread_mutex_t mu;          /* guards everything below (and the work's own state) */
    int refs;
    struct MHD_Connection *conn; /* NULL once MHD completed the request (its thread writes it) */
    bool suspended;
    bool client_gone;
    bool busy;                   /* work in flight (http_req_set_busy) */
    bool ended;                  /* no more events (http_req_end) */
    strbuf out;                  /* events not yet handed to MHD; pieces: the current piece */
    size_t out_sent;
};

/* request.c, for listener.c */
http_req *req_new(http_listener *l, struct MHD_Connection *c);
void req_body_release(http_req *rq);
bool req_mem_take(http_req *rq, uint64_t n);
void req_mem_give(http_req *rq, uint64_t n);
void req_error_body(const http_req *rq, strbuf *sb, int code, const char *msg, const char *param,
                    const char *errcode);
void req_count(const http_req *rq, int code);
bool req_peer_gone(http_req *rq);
void req_wake(http_req *rq);

#endif
