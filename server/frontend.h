/*
 * frontend.h - the one life cycle of every front end (the HTTP API, gRPC,
 * the admin API), so that `ferry serve` attaches and shuts them all down
 * in one loop instead of writing each one's teardown out.
 *
 * A front end is started by its own call, with its own options
 * (http_server_start, grpc_front_start, admin_server_start), and listens
 * from then on; the model is not there yet. Then, through its ops:
 *
 *   attach(e, sc, tm)  the model is ready: requests reach the scheduler
 *   quiesce            stop accepting connections, at once (does not wait)
 *   drain(deadline)    wait until the work in flight has ended or the
 *                      monotonic clock (util_now) passes deadline; what
 *                      still runs then is cancelled or left to sched_free
 *                      (the scheduler still runs during drain)
 *   detach             no handler touches the engine or the scheduler
 *                      after it returns
 *   stop               closes every connection and frees the front end;
 *                      no connection may still wait on a scheduler
 *
 * The shutdown order, for all of them together (http_server.h said it first):
 * quiesce all (none accepts while another drains), drain all, detach all,
 * sched_free (every request still in flight ends and its connection is
 * resumed), stop all, engine_close. Before any attach (a failed start or
 * load, a stop while loading) stop alone is enough: nothing was submitted.
 */
#ifndef FERRY_FRONTEND_H
#define FERRY_FRONTEND_H

#include "../engine/engine.h"
#include "../engine/scheduler.h"
#include "../text/text.h"

typedef struct {
    const char *name; /* "http", "grpc", "admin" */
    void (*attach)(void *self, engine *e, sched *sc, const text_model *tm);
    void (*quiesce)(void *self);
    void (*drain)(void *self, double deadline);
    void (*detach)(void *self);
    void (*stop)(void *self);
} frontend_ops;

typedef struct {
    const frontend_ops *ops;
    void *self;
} frontend;

#define FRONTENDS_MAX 4

/* The front ends of one server, in the order they started. */
typedef struct {
    frontend fe[FRONTENDS_MAX];
    int n;
} frontend_set;

void frontends_add(frontend_set *set, frontend fe);
void frontends_attach(frontend_set *set, engine *e, sched *sc, const text_model *tm);
/* Every front end stops accepting. */
void frontends_quiesce(frontend_set *set);
/* The rest of the shutdown order above: drain all until deadline, detach
 * all, sched_free(sc), stop all, engine_close(e). */
void frontends_shutdown(frontend_set *set, double deadline, sched *sc, engine *e);
/* Stops every front end; for a server that was never attached. */
void frontends_stop(frontend_set *set);

#endif
