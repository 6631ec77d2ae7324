/*
 * frontend.c - the front ends' shutdown order, written once for all of
 * them; see frontend.h.
 */
#include "frontend.h"

#include "../engine/base/status.h"

void frontends_add(frontend_set *set, frontend fe)
{
    FERRY_ASSERT(set->n < FRONTENDS_MAX);
    set->fe[set->n++] = fe;
}

void frontends_attach(frontend_set *set, engine *e, sched *sc, const text_model *tm)
{
    for (int i = 0; i < set->n; i++) set->fe[i].ops->attach(set->fe[i].self, e, sc, tm);
}

/* Each step below goes through the front ends in the reverse of their
 * start order: the last started (the admin API, whose export is cancelled
 * at once) first, the first started (HTTP, which answered before the
 * others listened) last. */

void frontends_quiesce(frontend_set *set)
{
    for (int i = set->n - 1; i >= 0; i--) set->fe[i].ops->quiesce(set->fe[i].self);
}

void frontends_shutdown(frontend_set *set, double deadline, sched *sc, engine *e)
{
    frontends_quiesce(set); /* again: nothing for those already quiesced */
    for (int i = set->n - 1; i >= 0; i--) set->fe[i].ops->drain(set->fe[i].self, deadline);
    for (int i = set->n - 1; i >= 0; i--) set->fe[i].ops->detach(set->fe[i].self);
    sched_free(sc);
    frontends_stop(set);
    engine_close(e);
}

void frontends_stop(frontend_set *set)
{
    for (int i = set->n - 1; i >= 0; i--) set->fe[i].ops->stop(set->fe[i].self);
    set->n = 0;
}
