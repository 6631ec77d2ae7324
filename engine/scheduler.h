/*
 * scheduler.h - continuous batching: one engine thread owns the model and
 * serves every request through shared steps.
 *
 * Requests enter a bounded queue (sched_submit fails with FERRY_ERR_BUSY
 * when it is full: the caller answers 503, memory stays bounded). At each
 * step boundary the engine thread admits queued requests into free KV-cache
 * sequences (at most engine_limits.max_seqs run at once), then runs one engine step that
 * holds a decode row for every sequence already generating plus chunks of
 * the prompts being prefilled, up to max_step_tokens rows - so a long prompt
 * is prefilled over several steps and never stalls decoding for long. One
 * pass over the weights serves the whole batch.
 *
 * Each request's callbacks run on the engine thread, in order: on_token for
 * every generated token (streaming), then exactly one on_done. They must not
 * block (hand the data to the transport and return). After sched_submit
 * fails, no callback is ever called. sched_cancel (a client went away)
 * frees the request's KV sequence at the next step boundary; on_done then reports
 * FERRY_OK with res->cancelled set and the tokens generated so far.
 *
 * KV memory is paged (engine_kv_reserve): a sequence takes blocks for its
 * prompt when its prefill starts (it waits while the pool lacks them) and
 * one more block every 16 positions as it decodes. When a decode row finds
 * the pool empty, the newest sequence holding blocks is preempted: its
 * blocks are freed, its tokens kept, and it later recomputes its prefix
 * (prompt + generated tokens) before decoding on. Blocks go back when a
 * sequence ends (done, cancelled, failed).
 *
 * Sequence states:  FREE -> PREFILL (prompt rows left) -> DECODE -> FREE;
 *                   PREFILL/DECODE -> PREFILL on preemption
 */
#ifndef FERRY_SCHEDULER_H
#define FERRY_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"
#include "request.h"
#include "stats.h"

typedef struct {
    /* a generated token; index counts from 0 */
    void (*on_token)(void *user, int32_t token, int index);
    /* the end: st != FERRY_OK with msg on failure (e.g. an I/O error in the
     * step); res valid only during the call */
    void (*on_done)(void *user, ferry_status st, const char *msg, const gen_result *res);
} sched_callbacks;

typedef struct {
    int max_queued;          /* requests waiting to start; 0 = no limit (serve passes --max-queued) */
    /* a long-running server: failed steps are logged to stderr, blobs they
     * found damaged are rebuilt (engine_repair) before the next step, and
     * after SCHED_UNHEALTHY_STEPS failures in a row an idle engine runs a
     * probe step every second until one succeeds (readiness comes back) */
    bool serving;
} sched_opts;

typedef struct sched sched;

/* Starts the engine thread on an open engine (the scheduler does not own
 * it; close the scheduler first). */
ferry_status sched_create(engine *e, const sched_opts *o, sched **out);
/* Stops the thread: queued and running requests end with on_done
 * (FERRY_ERR_BUSY, "server shutting down"). */
void sched_free(sched *s);

/* Validates with request_check (FERRY_ERR_INVALID naming the problem) and
 * queues. *id identifies the request for sched_cancel. */
ferry_status sched_submit(sched *s, const gen_request *r, const sched_callbacks *cb, void *user, uint64_t *id);
void sched_cancel(sched *s, uint64_t id);

sched_stats sched_get_stats(sched *s);

/* The queue's capacity: a request needing more places can never be queued. */
int sched_max_queued(const sched *s);

#endif
