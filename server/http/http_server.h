/*
 * http_server.h - the HTTP inference API: KServe v2 REST, Triton's
 * generate extension (token ids or text), the OpenAI-compatible API (/v1),
 * /tokenize and /detokenize, and /metrics, on a listener (listener.h)
 * whose route table each protocol fills (kserve_routes.c,
 * openai_routes.c, token_routes.c, health_routes.c).
 *
 * The server listens before the model is loaded (health/live answers at
 * once; ready and inference endpoints answer 503 "model not ready") and
 * starts serving when the caller attaches the engine and its scheduler.
 * Worker threads never wait for the engine: a handler submits its rows to
 * the scheduler and suspends the connection; the scheduler's callbacks
 * (engine thread) store the results and resume it (gen.c, listener.c).
 *
 * Shutdown order (frontend.h, the same for every front end): quiesce,
 * drain, detach (no new work reaches the scheduler), sched_free (every
 * request in flight ends, its connection is resumed), stop (closes the
 * connections), engine_close.
 */
#ifndef FERRY_HTTP_SERVER_H
#define FERRY_HTTP_SERVER_H

#include <stdint.h>

#include "../../engine/engine.h"
#include "../../engine/scheduler.h"
#include "../../text/text.h"
#include "../budget.h"
#include "../frontend.h"
#include "../metrics.h"

typedef struct {
    const char *host;        /* address to bind: "0.0.0.0", "127.0.0.1", "::", a host name */
    int port;                /* 0 = any free port (http_server_port says which) */
    const char *model_name;  /* the {m} of /v2/models/{m} */
    uint64_t max_body;       /* request bodies above this get 413 */
    req_budget *budget;      /* --request-memory, for requests in flight on every connection (and
                              * gRPC call); beyond it: 503. Owned by the caller, outlives the server */
    int request_timeout_s;   /* a client sends a request's head and body within this, or is cut off */
    int connection_timeout_s; /* a connection without a byte read or written for this long is closed */
    uint64_t max_header;     /* largest request head: over it 431 (414: the URL); MHD's memory per connection is twice this */
    int max_connections;     /* open connections, all clients */
    int max_connections_per_ip;
    metrics *counters;        /* owned by the caller, outlives the server */
} http_opts;

typedef struct http_server http_server;

/* Binds and starts the worker threads. */
ferry_status http_server_start(const http_opts *o, http_server **out);
int http_server_port(const http_server *s);

/* Its life cycle (frontend.h): attach makes inference endpoints submit
 * to the scheduler and ready answer 200, the text endpoints use the text
 * model (its text_error answers them when the model has no tokenizer; it
 * must outlive the server); quiesce stops accepting connections (new
 * requests on open ones get 503 "server shutting down", ready says not
 * ready); drain waits for the inference requests in flight; after detach
 * no handler touches the engine or scheduler; stop closes every
 * connection (none may still wait on a scheduler: sched_free first). */
frontend http_frontend(http_server *s);

#endif
