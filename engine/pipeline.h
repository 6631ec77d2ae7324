/*
 * pipeline.h - one step of the model, group by group, with the streamed
 * groups prefetched by a fetcher thread.
 *
 * Streamed groups (host or disk tier) are fetched in execution order,
 * cyclically across steps, into n_stage_slots staging slots: while the
 * compute thread runs group g, the fetcher is filling the slots of the next
 * groups (of this step, then of the next one). Fetch number q holds group
 * streamed[q % n_streamed] in slot q % n_slots. Slot states:
 *
 *     FREE --fetcher claims--> FILLING --data arrived--> READY
 *       ^                                                  |
 *       +------ compute releases after its ops ------------+
 *
 * The fetcher starts fetch q only once compute has released fetch
 * q - n_slots (that slot's previous group), and on backends with streams
 * the copy into the slot also waits for the event recorded after the
 * compute that read it; compute waits for READY of exactly fetch q, and for
 * the copy's event. So a slot is never overwritten while read, and never
 * read before it is whole.
 *
 * A failed read (EIO, ...) marks its slot READY with the error: the step
 * goes on consuming its remaining groups without computing, so that the
 * fetch sequence stays aligned, and returns the error; the next step runs
 * normally. Resident (device) groups are computed in place.
 */
#ifndef FERRY_PIPELINE_H
#define FERRY_PIPELINE_H

#include <stdio.h>

#include "backend.h"
#include "stats.h"
#include "store.h"

typedef struct pipeline pipeline;

ferry_status pipeline_create(pipeline **out, backend *be, store *s, const plan *p);
void pipeline_free(pipeline *pl);

/* Starts (or restarts) the fetcher; idempotent. */
ferry_status pipeline_start(pipeline *pl);

/* Walks the groups for one step. embed/layer/head run the units on the
 * compute view that store_bind has pointed at the group's buffer. */
typedef struct {
    void (*embed)(void *ctx);            /* the embedding table is bound (device) */
    ferry_status (*embed_rows)(void *ctx); /* the table is not on the device: gather rows */
    void (*layer)(void *ctx, int layer);
    void (*head)(void *ctx);
    void *ctx;
} pipeline_units;

ferry_status pipeline_step(pipeline *pl, const pipeline_units *u);

pipeline_stats pipeline_get_stats(pipeline *pl);

/* Records a Chrome trace of every fetch, copy and compute from now on (at
 * most max_events); pipeline_trace_write writes it as JSON. */
ferry_status pipeline_trace_start(pipeline *pl, size_t max_events);
ferry_status pipeline_trace_write(pipeline *pl, const char *path);

#endif
