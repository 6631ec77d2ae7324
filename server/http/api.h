/*
 * api.h - what the inference API's handlers share (server/http/: gen.c,
 * the KServe, OpenAI, token and health routes): the served name and, once
 * attached, the model. http_server.c keeps it, behind a lock the handlers
 * hold around every use of the engine or the scheduler, so that detach
 * (then sched_free, engine_close) never pulls them from under a handler.
 *
 * The route tables each protocol registers are declared here too;
 * http_server.c hands them to the listener.
 */
#ifndef FERRY_HTTP_API_H
#define FERRY_HTTP_API_H

#include "../../engine/engine.h"
#include "../../engine/scheduler.h"
#include "../../text/text.h"
#include "listener.h"

typedef struct http_server http_server;

typedef struct {
    engine *e;               /* NULL: not attached */
    sched *s;
    engine_limits lim;
    const text_model *tm;    /* immutable; outlives the server's requests (http_server.h) */
    int64_t attached_unix;   /* when the model became ready: /v1/models' created */
} api_model;

/* The model, read-locked until api_release. */
const api_model *api_hold(http_server *srv);
void api_release(http_server *srv);
const char *api_name(const http_server *srv);
req_budget *api_budget(const http_server *srv); /* --request-memory, shared with gRPC */

/* A snapshot for the GET routes. */
typedef struct {
    bool loaded;             /* attached */
    bool ready;              /* loaded, its steps not failing one after another, not draining */
    engine_limits lim;
    int64_t attached_unix;
    sched_stats sched;       /* loaded: the scheduler's figures */
} api_view;

void api_look(http_req *rq, api_view *v);

/* The routes of each protocol (kserve_routes.c, openai_routes.c,
 * token_routes.c, health_routes.c). */
extern const http_route_table kserve_routes, openai_routes, token_routes, health_routes;

/* KServe's model paths, /v2/models/{m}[/versions/{v}]/..., onto the
 * tables' /v2/models/{m}/...: the served model and version, or 404
 * (listener's resolve). */
const char *kserve_resolve(void *ctx, const char *url, char *buf, size_t cap, http_refusal *no);

#endif
