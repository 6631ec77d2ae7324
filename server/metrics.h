/*
 * metrics.h - the figures GET /metrics reports, in the Prometheus text
 * format (version 0.0.4).
 *
 * Two kinds of figures. Counters the front ends feed as requests happen
 * (requests by endpoint and status code, time spent queued) live here,
 * behind one mutex, so any thread - an HTTP worker, the engine thread in a
 * callback - may record. Figures the engine already keeps (tokens, steps,
 * batch sizes, bytes fetched per tier, stall time, weight bytes per tier)
 * are read from the scheduler, pipeline and plan when the page is rendered
 * and passed in as a metrics_engine_view, so this module knows nothing of
 * the transports and the engine knows nothing of Prometheus.
 */
#ifndef FERRY_METRICS_H
#define FERRY_METRICS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "../engine/base/json.h"
#include "../engine/stats.h"

#define METRICS_MAX_SERIES 128  /* distinct (endpoint, code) pairs kept */
#define METRICS_QUEUE_BUCKETS 12

typedef struct {
    const char *endpoint;    /* a string literal the caller owns */
    int code;
    uint64_t count;
} metrics_series;

typedef struct {
    pthread_mutex_t mu;
    metrics_series req[METRICS_MAX_SERIES];
    int n_req;
    uint64_t queue_buckets[METRICS_QUEUE_BUCKETS]; /* by upper bound, not cumulative */
    uint64_t queue_count;
    double queue_sum;
    uint64_t admin_auth_failures; /* admin requests refused for a missing or wrong token */
} metrics;

/* What the engine side says at render time; ready false: only the
 * front-end counters are reported. */
typedef struct {
    bool ready;
    sched_stats sched;
    pipeline_stats pipe;
    uint64_t weight_bytes[TIER_COUNT]; /* the plan's bytes per tier */
    uint64_t mem_bytes[2][PLAN_MEM_KINDS]; /* what the plan allocates in device (0) and host (1) memory, by kind */
    bool unified;            /* device memory is host memory: no device figures */
    bool has_experts;        /* a mixture of experts: the expert figures below */
    expert_stats experts;
    uint64_t request_memory, request_memory_limit; /* the front end's budget: in use, limit */
} metrics_engine_view;

void metrics_init(metrics *m);
void metrics_free(metrics *m);

/* One answered request; endpoint must outlive m (use literals). */
void metrics_count_request(metrics *m, const char *endpoint, int code);
/* Seconds one sequence waited between submission and admission. */
void metrics_observe_queue(metrics *m, double seconds);
/* One admin request refused 401 (no token, a wrong one). */
void metrics_count_admin_auth_failure(metrics *m);

void metrics_render(metrics *m, const metrics_engine_view *v, strbuf *out);

#endif
