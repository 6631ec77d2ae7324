/*
 * http_server.c - the HTTP inference API as a front end: a listener
 * (listener.h) with the protocols' route tables, and the model its
 * handlers share (api.h) behind a lock that detach takes for writing. See
 * http_server.h.
 */
#define _GNU_SOURCE
#include "http_server.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../engine/base/util.h"
#include "../kserve.h"
#include "../openai.h"
#include "api.h"

#define WORKER_THREADS 4 /* MHD's: connections, heads, bodies, answers */
#define PREP_THREADS 2   /* parse, render, encode, submit (listener.c's prep workers) */

struct http_server {
    http_listener *l;
    char *name;
    req_budget *budget;      /* --request-memory, shared with the gRPC front end */
    pthread_rwlock_t lock;   /* guards m: held (read) around every use */
    api_model m;
};

static void stop(void *self);

/* Every protocol's routes; KServe's model paths go through kserve_resolve. */
static const http_route_table *const k_tables[] = {&health_routes, &kserve_routes, &openai_routes, &token_routes};

/* An error in the format of the protocol at url: OpenAI's error object on
 * /v1 (param and code only there), {"error": msg} elsewhere. */
static void error_body(const char *url, strbuf *sb, int code, const char *msg, const char *param, const char *errcode)
{
    if (!strncmp(url, "/v1/", 4) || !strcmp(url, "/v1")) oai_error_body(sb, code, msg, param, errcode);
    else kserve_error(sb, msg);
}

ferry_status http_server_start(const http_opts *o, http_server **out)
{
    *out = NULL;
    http_server *srv = calloc(1, sizeof *srv);
    if (!srv || !(srv->name = strdup(o->model_name))) {
        free(srv);
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    srv->budget = o->budget;
    /* writer-preferring: under sustained load shutdown must still get it */
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&srv->lock, &ra);
    pthread_rwlockattr_destroy(&ra);
    http_listener_opts lo = {
        .what = NULL,
        .log_name = "http",
        .host_flag = "--host",
        .host = o->host,
        .port = o->port,
        .tables = k_tables,
        .n_tables = (int)(sizeof k_tables / sizeof k_tables[0]),
        .other_label = "other",
        .ctx = srv,
        .resolve = kserve_resolve,
        .error_body = error_body,
        .unescape = true,
        .max_body = o->max_body,
        .max_body_flag = "--max-body",
        .budget = o->budget,
        .max_header = o->max_header,
        .request_timeout_s = o->request_timeout_s,
        .connection_timeout_s = o->connection_timeout_s,
        .max_connections = o->max_connections,
        .max_connections_per_ip = o->max_connections_per_ip,
        .threads = WORKER_THREADS,
        .prep_threads = PREP_THREADS,
        .listen_backlog = 512,
        .counters = o->counters,
    };
    ferry_status st = http_listener_start(&lo, &srv->l);
    if (st != FERRY_OK) {
        stop(srv);
        return st;
    }
    *out = srv;
    return FERRY_OK;
}

int http_server_port(const http_server *s) { return http_listener_port(s->l); }

/* ---- the front end's life cycle (frontend.h) ------------------------------------ */

static void attach(void *self, engine *e, sched *sc, const text_model *tm)
{
    http_server *s = self;
    pthread_rwlock_wrlock(&s->lock);
    s->m.e = e;
    s->m.s = sc;
    s->m.tm = tm;
    s->m.attached_unix = (int64_t)util_wall_now();
    s->m.lim = engine_get_limits(e);
    pthread_rwlock_unlock(&s->lock);
}

static void quiesce(void *self) { http_listener_quiesce(((http_server *)self)->l); }

/* Until the inference requests in flight have ended or the deadline. */
static void drain(void *self, double deadline)
{
    http_server *s = self;
    quiesce(s);
    while (util_now() < deadline && http_listener_busy(s->l) > 0) usleep(10000);
}

static void detach(void *self)
{
    http_server *s = self;
    pthread_rwlock_wrlock(&s->lock);
    s->m.e = NULL;
    s->m.s = NULL;
    pthread_rwlock_unlock(&s->lock);
}

static void stop(void *self)
{
    http_server *s = self;
    if (!s) return;
    http_listener_stop(s->l);
    pthread_rwlock_destroy(&s->lock);
    free(s->name);
    free(s);
}

static const frontend_ops k_http_frontend = {"http", attach, quiesce, drain, detach, stop};

frontend http_frontend(http_server *s) { return (frontend){&k_http_frontend, s}; }

/* ---- what the handlers share (api.h) ---------------------------------------------- */

const api_model *api_hold(http_server *srv)
{
    pthread_rwlock_rdlock(&srv->lock);
    return &srv->m;
}

void api_release(http_server *srv) { pthread_rwlock_unlock(&srv->lock); }
const char *api_name(const http_server *srv) { return srv->name; }
req_budget *api_budget(const http_server *srv) { return srv->budget; }

void api_look(http_req *rq, api_view *v)
{
    http_server *srv = http_req_ctx(rq);
    memset(v, 0, sizeof *v);
    const api_model *m = api_hold(srv);
    v->loaded = m->s != NULL;
    v->lim = m->lim;
    v->attached_unix = m->attached_unix;
    if (v->loaded) v->sched = sched_get_stats(m->s);
    api_release(srv);
    /* loaded, and its steps are not failing one after another */
    v->ready = v->loaded && sched_healthy(&v->sched) && !http_req_draining(rq);
}
