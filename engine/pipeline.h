/*
 * pipeline.h - one step of the model, group by group, with the streamed
 * groups prefetched by a fetcher thread.
 *
 * Streamed groups (host or disk tier) are fetched in execution order,
 * cyclically across steps, into the plan's staging slots (sized per group:
 * plan.h): while the compute thread runs group g, the fetcher is filling
 * the slots of the next groups, at most prefetch ahead (of this step, then
 * of the next one). Fetch number q holds group streamed[q % n_streamed] in
 * slot plan_slot_of(q). Slot states:
 *
 *     FREE --fetcher claims--> FILLING --data arrived--> READY
 *       ^                                                  |
 *       +------ compute releases after its ops ------------+
 *
 * The protocol keeps these invariants; each is cited as P1..P9 at the code
 * that keeps it (pipeline.c), and `make test-mutants` breaks P3, P5 and P6
 * on purpose to show that the tests notice:
 *
 * P1  Fetch q holds group streamed[q % n_streamed] in slot plan_slot_of(q).
 *     The fetcher starts fetches, and compute consumes them, in increasing
 *     q; every step consumes each streamed group once, in execution order.
 * P2  The fetcher claims fetch q only once compute has released fetch
 *     q - prefetch - 1 and the fetch that held q's slot before: no two
 *     unreleased fetches share a slot.
 * P3  Compute releases a fetch only after it has queued every op that reads
 *     the slot, and records the slot's `computed` event after those ops;
 *     the copy for the slot's next fetch waits for that event on the copy
 *     stream. (Release is a fact of the host; on a backend with streams the
 *     ops may still be running, and the event is what covers them.)
 * P4  Compute uses fetch q only once its slot is READY with seq q: the read
 *     has finished and the copy into the slot is queued with `copied`
 *     recorded after it (unified backends: the bytes are in the slot).
 * P5  Compute's ops on a slot wait for its `copied` event on the compute
 *     stream: READY says the copy is queued, not that it has landed.
 * P6  A disk read into a slot's bounce buffer (non-unified) starts only
 *     once the host has seen the buffer's previous copy complete (event_sync
 *     on `copied`): the copy stream reads the buffer after the release.
 * P7  A failed fetch is READY with its error and released like any other;
 *     a step that failed consumes and releases each of its remaining
 *     streamed groups without computing, so that P1 holds for the next step,
 *     which runs normally. The error's message reaches the caller whole.
 * P8  pipeline_free stops the fetcher, which drains its reads, and waits for
 *     each slot's last copy before releasing the slot's buffers.
 * P9  pipeline_quiesce (between steps) stops the fetcher as P8 does, drops
 *     the fetches it made ahead (their slots FREE) and numbers the next
 *     fetch as the one compute needs next, so that P1 and P2 hold when the
 *     next step starts it again; nothing reads a blob while it is quiet.
 *
 * Resident (device) groups are computed in place.
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
    ferry_status (*layer)(void *ctx, int layer); /* fails naming what (a sparse layer's expert fetch) */
    void (*head)(void *ctx);
    void *ctx;
} pipeline_units;

ferry_status pipeline_step(pipeline *pl, const pipeline_units *u);

/* Stops the fetcher and waits for its reads and copies (P9): until the
 * next pipeline_step, nothing reads the offload dir, so a blob may be
 * rebuilt. Compute thread, between steps. */
void pipeline_quiesce(pipeline *pl);

/* Whether every group read from disk is checked against the CRC-32C the
 * offload manifest records (on by default): a blob changed or damaged while
 * serving fails the step that read it, naming the file, instead of giving
 * wrong answers. Call before the first step. */
void pipeline_set_verify(pipeline *pl, bool on);
/* Groups a read found damaged (a checksum mismatch, or the blob cut
 * short) and not yet cleared: out[g] set for each; returns how many. While
 * the fetcher runs it may find more: quiesce first for the whole list. */
int pipeline_damaged(pipeline *pl, bool *out);
/* Group g was rebuilt: reads of it are trusted again. */
void pipeline_clear_damaged(pipeline *pl, int g);

pipeline_stats pipeline_get_stats(pipeline *pl);

/* Records a Chrome trace of every fetch, copy and compute from now on (at
 * most max_events); pipeline_trace_write writes it as JSON. */
ferry_status pipeline_trace_start(pipeline *pl, size_t max_events);
ferry_status pipeline_trace_write(pipeline *pl, const char *path);

#endif
