/*
 * grpc_server.h - the gRPC front end: KServe v2 / Triton's
 * GRPCInferenceService (server/proto/grpc_service.proto) on gRPC C core.
 *
 * Like the HTTP front end it listens before the model is loaded (ServerLive
 * answers at once; ServerReady/ModelReady say false, ModelInfer answers
 * UNAVAILABLE) and serves once the caller attaches the engine and its
 * scheduler. One thread drives the completion queue; no thread waits for
 * the engine: ModelInfer submits its rows to the scheduler and the last
 * row's on_done (engine thread) sends the answer. See grpc_server.c.
 * Connections are accepted by ferry, not core (grpc_listen.c), so that
 * their number is bounded, and relayed by ferry (grpc_relay.c), so that
 * their reset streams and header blocks are; core bounds each one's calls,
 * idle time and metadata, and refuses compressed messages.
 *
 * Shutdown order (frontend.h): quiesce (stops accepting), drain (lets
 * calls in flight finish until the deadline, then cancels them; every call
 * has ended when it returns, so nothing reaches the scheduler after it),
 * detach, then sched_free, stop, engine_close.
 */
#ifndef FERRY_GRPC_SERVER_H
#define FERRY_GRPC_SERVER_H

#include <stdint.h>

#include "../../engine/engine.h"
#include "../../engine/scheduler.h"
#include "../budget.h"
#include "../frontend.h"
#include "../metrics.h"
#include "../../text/text.h"

typedef struct {
    const char *host;        /* address to bind, as http_opts.host */
    int port;                /* 0 = any free port (grpc_front_port says which) */
    const char *model_name;
    uint64_t max_message;    /* largest request message; larger ones get RESOURCE_EXHAUSTED */
    int max_streams;         /* calls open at once on one connection (SETTINGS_MAX_CONCURRENT_STREAMS) */
    uint64_t max_header;     /* a call's header block as sent (over it the connection gets GOAWAY) and its
                              * metadata decoded (over it the call gets RESOURCE_EXHAUSTED) */
    int max_resets;          /* RST_STREAM frames per second on one connection (a burst of as many);
                              * more: GOAWAY ENHANCE_YOUR_CALM */
    int connection_timeout_s; /* a connection with no call open this long is closed (GOAWAY) */
    int request_timeout_s;   /* a connection's HTTP/2 preface must come within it */
    int max_connections;     /* connections held at once; more wait in the listen queue */
    int max_connections_per_ip; /* of those, from one client address; more are closed at once */
    req_budget *budget;      /* --request-memory, shared with the HTTP front end (NULL: unbounded);
                              * owned by the caller, outlives the front end */
    metrics *counters;       /* ferry_requests_total{endpoint="grpc_...", code=<gRPC code>}; owned by
                              * the caller, outlives the front end (NULL: none) */
} grpc_front_opts;

typedef struct grpc_front grpc_front;

/* Descriptors a gRPC connection holds: the client's socket and the two
 * ends of the socketpair that relays it to core (grpc_relay.c). */
#define GRPC_FDS_PER_CONNECTION 3

/* Binds, and starts the completion-queue thread and the accepting one. */
ferry_status grpc_front_start(const grpc_front_opts *o, grpc_front **out);
int grpc_front_port(const grpc_front *g);

/* Its life cycle (frontend.h): attach makes ModelInfer submit to the
 * scheduler, text_input and text_output use the text model (its
 * text_error answers them when the model has no tokenizer; it must outlive
 * the front); quiesce stops accepting connections and calls; drain waits
 * until the calls in flight have ended or the deadline, cancels the rest
 * (their rows through sched_cancel: the scheduler must still run) and
 * waits for every call to end, so that nothing reaches the scheduler
 * after it; detach forgets the engine; stop frees everything (draining
 * first with no time left, if that was not done). */
frontend grpc_frontend(grpc_front *g);

#endif
