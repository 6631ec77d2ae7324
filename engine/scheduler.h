/*
 * scheduler.h - continuous batching: one engine thread owns the model and
 * serves every request through shared steps.
 *
 * Requests enter a bounded queue (sched_submit fails with FERRY_ERR_BUSY
 * when it is full: the caller answers 503, memory stays bounded). At each
 * step boundary the engine thread admits queued requests into free KV slots
 * (at most n_slots sequences run at once), then runs one engine step that
 * holds a decode row for every sequence already generating plus chunks of
 * the prompts being prefilled, up to max_step_tokens rows - so a long prompt
 * is prefilled over several steps and never stalls decoding for long. One
 * pass over the weights serves the whole batch.
 *
 * Each request's callbacks run on the engine thread, in order: on_token for
 * every generated token (streaming), then exactly one on_done. They must not
 * block (hand the data to the transport and return). After sched_submit
 * fails, no callback is ever called. sched_cancel (a client went away)
 * frees the request's slot at the next step boundary; on_done then reports
 * FERRY_OK with res->cancelled set and the tokens generated so far.
 *
 * Slot states:  FREE -> PREFILL (prompt rows left) -> DECODE -> FREE
 */
#ifndef FERRY_SCHEDULER_H
#define FERRY_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"

#define SCHED_MAX_STOP 16

typedef struct {
    const int32_t *prompt;   /* copied by sched_submit */
    int prompt_len;
    int max_new_tokens;      /* >= 1 */
    sampling_params sampling;
    int32_t stop_ids[SCHED_MAX_STOP]; /* generation ends after emitting one of these */
    int n_stop;
    bool want_logits;        /* report the logits of the last prompt position */
} sched_params;

typedef struct {
    const int32_t *tokens;   /* generated ids (stop token included) */
    int n_tokens;
    const float *logits;     /* [vocab] when want_logits, else NULL */
    int vocab;
    bool cancelled;
    double queue_s;          /* submit -> admitted */
    double total_s;          /* submit -> done */
} sched_result;

typedef struct {
    /* a generated token; index counts from 0 */
    void (*on_token)(void *user, int32_t token, int index);
    /* the end: st != FERRY_OK with msg on failure (e.g. an I/O error in the
     * step); res valid only during the call */
    void (*on_done)(void *user, ferry_status st, const char *msg, const sched_result *res);
} sched_callbacks;

typedef struct {
    int max_queued;          /* requests waiting for a slot; 0 = 64 */
} sched_opts;

/* Per-step figures for metrics, read under the scheduler's lock. */
typedef struct {
    uint64_t steps;
    uint64_t tokens_prompted, tokens_generated;
    uint64_t requests_done, requests_failed, requests_cancelled;
    int running, queued;     /* now */
    double step_s_sum;       /* sum of step wall times */
    double last_step_s;
    int last_batch;          /* sequences in the last step */
    uint64_t batch_hist[8];  /* steps by sequences: 1, 2-3, 4-7, 8-15, 16-31, 32-63, 64-127, 128+ */
    uint64_t batch_sum;      /* sequences summed over steps */
} sched_stats;

typedef struct sched sched;

/* Starts the engine thread on an open engine (the scheduler does not own
 * it; close the scheduler first). */
ferry_status sched_create(engine *e, const sched_opts *o, sched **out);
/* Stops the thread: queued and running requests end with on_done
 * (FERRY_ERR_BUSY, "server shutting down"). */
void sched_free(sched *s);

/* Validates (ids in the vocabulary, prompt + max_new within the context,
 * sampling ranges: FERRY_ERR_INVALID naming the problem) and queues. *id
 * identifies the request for sched_cancel. */
ferry_status sched_submit(sched *s, const sched_params *p, const sched_callbacks *cb, void *user, uint64_t *id);
void sched_cancel(sched *s, uint64_t id);

sched_stats sched_get_stats(sched *s);

/* The queue's capacity: a request needing more places can never be queued. */
int sched_max_queued(const sched *s);

#endif
