/*
 * grpc_call.h - what grpc_server.c (unary calls, the completion-queue
 * thread) and grpc_stream.c (ModelStreamInfer) share: the front end, one
 * call (`rpc`) and its tags. Private to server/grpc; the invariants R1-R3
 * are written in grpc_server.c.
 */
#ifndef FERRY_GRPC_CALL_H
#define FERRY_GRPC_CALL_H

#include <grpc/grpc.h>
#include <pthread.h>
#include <stdbool.h>

#include "../../engine/engine.h"
#include "../../engine/scheduler.h"
#include "../kserve.h"
#include "grpc_server.h"

#define SERVICE "/inference.GRPCInferenceService/"
#define GRPC_STREAM_QUEUE_MAX (256u << 10)
#define GRPC_WORKERS 2 /* threads that parse ModelInfer messages and encode their text */

enum tag_kind { TAG_NEW, TAG_RECV, TAG_SENT, TAG_CLOSED, TAG_WRITE, TAG_SHUTDOWN };

typedef struct rpc rpc;
typedef struct {
    enum tag_kind kind;
    rpc *r;
} rpc_tag;

struct grpc_front {
    grpc_server *server;
    grpc_completion_queue *cq;
    struct grpc_listener *listener; /* grpc_listen.c: accepts, and hands connections to relay */
    struct grpc_relay *relay;       /* grpc_relay.c: between each client and server */
    pthread_t thread;
    int port;
    char *model_name;
    metrics *counters;       /* NULL: none */
    req_budget *budget;      /* NULL: unbounded */
    uint64_t stream_queue_max; /* grpc_stream.c, S4: GRPC_STREAM_QUEUE_MAX, or FERRY_GRPC_STREAM_QUEUE_MAX
                              * (tests: 1 pauses reading after every response) */
    rpc_tag shutdown_tag;
    struct workq *work;      /* grpc_server.c: GRPC_WORKERS threads that parse and encode, off the CQ thread */
    bool quiesced, drained;  /* its quiesce, its drain ran (grpc_server.c; the thread that shuts down) */
    double quiesced_at;      /* util_now */

    pthread_mutex_t mu;      /* guards what follows */
    pthread_cond_t cond;     /* shutdown_done or live_rpcs changed */
    engine *e;               /* NULL until attached */
    sched *s;
    engine_limits lim;
    const text_model *tm;    /* the model's text files (text_input, text_output); outlives the front */
    bool shutdown_done;      /* the shutdown tag came */
    int live_rpcs;           /* R3 */
    int live_calls;          /* of those, the calls that arrived (not the one asked for next) */
};

struct rpc {
    grpc_front *g;
    rpc_tag t_new, t_recv, t_sent, t_closed, t_write;
    bool arrived;            /* a call came into it (counted in live_calls) */
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array md;
    grpc_byte_buffer *recv, *send;
    grpc_slice status_details;
    bool has_details;
    int cancelled;           /* set by RECV_CLOSE_ON_SERVER */
    const char *endpoint;    /* the metrics' name of the method, set by the first RECV */

    pthread_mutex_t mu;      /* guards what follows (engine thread vs CQ thread and workers) */
    int refs;                /* R1 */
    uint64_t mem;            /* taken from g->budget, given back in rpc_free */
    /* ModelInfer */
    char *model;
    kserve_request kr;
    kserve_row *rows;
    uint64_t *sid;           /* [n_rows] the scheduler's ids */
    struct row_ref {
        rpc *r;
        int row;
    } *refs_of;              /* [n_rows] each row's callback argument */
    int n_submitted, rows_left; /* R2 */
    bool client_gone;
    /* an answer of text (kr.text_out): each row's text as it is generated,
     * fed in on_token and ended in on_done, under mu */
    struct rpc_text {
        text_stream *ts;
        strbuf text;
        bool stopped;        /* a stop string ended the row (its cancel is not the client's) */
    } *texts;                /* [n_rows], or NULL */
    sched *s;                /* the scheduler the rows went to (alive while they run) */
    ferry_status st;         /* the first failure of a row */
    char msg[FERRY_MSG_MAX];
    /* ModelStreamInfer (grpc_stream.c); NULL for the unary RPCs */
    struct grpc_stream *stream;
};

/* Every batch starts through rpc_batch. gRPC orders a batch's start before
 * the CQ thread's handling of its completion, with its own atomics, which
 * ThreadSanitizer cannot see in a gRPC not built with it: so what the engine
 * thread wrote into an rpc before rpc_finish started the answer's batch
 * (r->send, r->status_details) looked raced with rpc_free on the CQ thread.
 * rpc_batch releases the tag and cq_main acquires it, the edge gRPC
 * guarantees; nothing is emitted without -fsanitize=thread
 * (docs/sanitizers.md). */
#if defined(__SANITIZE_THREAD__)
#define RPC_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RPC_TSAN 1
#endif
#endif
#ifdef RPC_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define RPC_TAG_RELEASE(tag) __tsan_release(tag)
#define RPC_TAG_ACQUIRE(tag) __tsan_acquire(tag)
#else
#define RPC_TAG_RELEASE(tag) ((void)(tag))
#define RPC_TAG_ACQUIRE(tag) ((void)(tag))
#endif

static inline grpc_call_error rpc_batch(rpc *r, const grpc_op *ops, size_t n, rpc_tag *tag)
{
    grpc_call *call = r->call; /* read before the release: the CQ thread may free r once it is started */
    RPC_TAG_RELEASE(tag);
    return grpc_call_start_batch(call, ops, n, tag, NULL);
}

/* Ends the main flow with body (malloc'd, taken over; NULL: none) and the
 * status; the answer's batch holds the main flow's reference (R1). */
void rpc_finish(rpc *r, grpc_status_code code, const char *msg, uint8_t *body, size_t len);
void rpc_unref(rpc *r);
/* Counts one answered request (metrics), and one sequence's queue time. */
void rpc_count(const rpc *r, grpc_status_code code);
void rpc_observe_queue(const rpc *r, double seconds);
/* Takes n bytes of the request budget for r (false: the budget is spent;
 * busy gets the message); with r->mu held where another thread may too. */
bool rpc_mem_take(rpc *r, uint64_t n, char *busy, size_t cap);

/* grpc_stream.c: the CQ thread (a worker: rpc_stream_message) hands a ModelStreamInfer call its events */
ferry_status rpc_stream_init(rpc *r);
void rpc_stream_message(rpc *r, const uint8_t *buf, size_t len); /* one request; reads the next */
void rpc_stream_read_end(rpc *r);   /* the client half-closed, or the call ended */
void rpc_stream_written(rpc *r, bool ok);
void rpc_stream_closed(rpc *r);     /* RECV_CLOSE_ON_SERVER completed */
void rpc_stream_free(rpc *r);

#endif
