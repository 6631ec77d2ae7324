/*
 * stats.h - the figures the engine publishes while it serves: the
 * scheduler's (requests, tokens, steps, batch sizes) and the pipeline's
 * (bytes streamed per tier, compute, stall and fetch time) and the experts'
 * (hits, fetches, bytes). Plain structs,
 * so that metrics and admin front ends read them without seeing the
 * modules that keep them.
 */
#ifndef FERRY_STATS_H
#define FERRY_STATS_H

#include <stdbool.h>
#include <stdint.h>

#include "plan.h"

typedef struct {
    uint64_t steps;
    uint64_t bytes[TIER_COUNT]; /* weight bytes brought to compute, by tier of origin */
    double compute_s;           /* compute thread busy on groups */
    double stall_s;             /* compute thread waiting for a fetch */
    double fetch_s;             /* fetcher busy (reads or copies in flight) */
    double wall_s;              /* inside pipeline_step */
} pipeline_stats;

/* A mixture-of-experts model's experts (experts.h). */
typedef struct {
    uint64_t layer_runs;   /* experts_run calls (sparse layers computed) */
    uint64_t uses;         /* experts routed to (all computed, unless the run failed) */
    uint64_t device_uses;  /* of which resident on the device tier */
    uint64_t hits;         /* of which found in a slot */
    uint64_t misses;       /* of which fetched */
    uint64_t prefetched;   /* experts fetched speculatively (experts_prefetch) */
    uint64_t prefetch_hits; /* hits on a speculatively fetched expert */
    uint64_t bytes[TIER_COUNT]; /* bytes fetched, by tier of origin */
    double stall_s;        /* compute thread waiting for a fetched expert */
    double last_step_bytes; /* bytes fetched during the last step */
} expert_stats;

/* Per-step figures for metrics, read under the scheduler's lock. */
typedef struct {
    uint64_t steps;
    uint64_t tokens_prompted, tokens_generated;
    uint64_t tokens_recomputed; /* prefix rows prefilled again after a preemption (not in tokens_prompted) */
    uint64_t requests_done, requests_failed, requests_cancelled;
    int running, queued;     /* now: holding KV blocks; waiting for a slot or for blocks */
    double step_s_sum;       /* sum of step wall times */
    double last_step_s;
    int last_batch;          /* sequences in the last step */
    uint64_t batch_hist[8];  /* steps by sequences: 1, 2-3, 4-7, 8-15, 16-31, 32-63, 64-127, 128+ */
    uint64_t batch_sum;      /* sequences summed over steps */
    int failing_steps;       /* steps failed in a row (0 after one succeeds) */
    int kv_blocks_used, kv_blocks_free; /* the paged KV cache, now */
    uint64_t preemptions;    /* sequences whose blocks were taken back to let older ones go on */
    /* for Triton's statistics: seconds summed over finished sequences */
    double done_s_sum;       /* submit -> done, sequences that succeeded */
    double failed_s_sum;     /* submit -> failed */
    double queue_s_sum;      /* submit -> admitted, every admitted sequence */
    double last_done_unix;   /* when the last sequence succeeded (seconds since the epoch; 0 = never) */
} sched_stats;

/* After this many failed steps in a row the server says it is not ready
 * (health/ready 503) until a step succeeds again. */
#define SCHED_UNHEALTHY_STEPS 3

/* The readiness rule every front end answers with (the model is loaded). */
static inline bool sched_healthy(const sched_stats *s) { return s->failing_steps < SCHED_UNHEALTHY_STEPS; }

#endif
