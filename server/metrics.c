/*
 * metrics.c - counters and the Prometheus text page. See metrics.h.
 */
#include "metrics.h"

#include <string.h>

/* ferry_queue_seconds bucket bounds; the last bucket is +Inf */
static const double k_queue_le[METRICS_QUEUE_BUCKETS - 1] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                             0.25,  0.5,   1,    2.5,   10};
/* sched_stats.batch_hist buckets: 1, 2-3, 4-7, ..., 64-127, 128+ */
static const char *k_batch_le[8] = {"1", "3", "7", "15", "31", "63", "127", "+Inf"};

void metrics_init(metrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void metrics_free(metrics *m) { pthread_mutex_destroy(&m->mu); }

void metrics_count_request(metrics *m, const char *endpoint, int code)
{
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < m->n_req && !(m->req[i].code == code && !strcmp(m->req[i].endpoint, endpoint))) i++;
    if (i == m->n_req && m->n_req < METRICS_MAX_SERIES) m->req[m->n_req++] = (metrics_series){endpoint, code, 0};
    if (i < m->n_req) m->req[i].count++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_observe_queue(metrics *m, double seconds)
{
    int b = 0;
    while (b < METRICS_QUEUE_BUCKETS - 1 && seconds > k_queue_le[b]) b++;
    pthread_mutex_lock(&m->mu);
    m->queue_buckets[b]++;
    m->queue_count++;
    m->queue_sum += seconds;
    pthread_mutex_unlock(&m->mu);
}

void metrics_count_admin_auth_failure(metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->admin_auth_failures++;
    pthread_mutex_unlock(&m->mu);
}

static void help(strbuf *sb, const char *name, const char *type, const char *text)
{
    sb_printf(sb, "# HELP %s %s\n# TYPE %s %s\n", name, text, name, type);
}

void metrics_render(metrics *m, const metrics_engine_view *v, strbuf *sb)
{
    pthread_mutex_lock(&m->mu);
    metrics c = *m; /* a consistent copy; the mutex member is not used */
    pthread_mutex_unlock(&m->mu);

    help(sb, "ferry_model_ready", "gauge", "1 once the model is loaded and serving");
    sb_printf(sb, "ferry_model_ready %d\n", v->ready ? 1 : 0);

    help(sb, "ferry_request_memory_bytes", "gauge", "Memory held for requests in flight (bodies, parses, results, answers)");
    sb_printf(sb, "ferry_request_memory_bytes %llu\n", (unsigned long long)v->request_memory);
    help(sb, "ferry_request_memory_limit_bytes", "gauge", "The --request-memory budget");
    sb_printf(sb, "ferry_request_memory_limit_bytes %llu\n", (unsigned long long)v->request_memory_limit);

    help(sb, "ferry_requests_total", "counter", "Requests answered, by endpoint and HTTP status code");
    for (int i = 0; i < c.n_req; i++)
        sb_printf(sb, "ferry_requests_total{endpoint=\"%s\",code=\"%d\"} %llu\n", c.req[i].endpoint, c.req[i].code,
                  (unsigned long long)c.req[i].count);

    help(sb, "ferry_admin_auth_failures_total", "counter", "Admin API requests refused for a missing or wrong bearer token");
    sb_printf(sb, "ferry_admin_auth_failures_total %llu\n", (unsigned long long)c.admin_auth_failures);

    help(sb, "ferry_queue_seconds", "histogram", "Time a sequence waited for a batch slot");
    uint64_t cum = 0;
    for (int b = 0; b < METRICS_QUEUE_BUCKETS; b++) {
        cum += c.queue_buckets[b];
        if (b < METRICS_QUEUE_BUCKETS - 1)
            sb_printf(sb, "ferry_queue_seconds_bucket{le=\"%g\"} %llu\n", k_queue_le[b], (unsigned long long)cum);
        else
            sb_printf(sb, "ferry_queue_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    }
    sb_printf(sb, "ferry_queue_seconds_sum %.9g\nferry_queue_seconds_count %llu\n", c.queue_sum,
              (unsigned long long)c.queue_count);

    const sched_stats *s = &v->sched;
    const pipeline_stats *p = &v->pipe;
    help(sb, "ferry_prompt_tokens_total", "counter", "Prompt tokens prefilled");
    sb_printf(sb, "ferry_prompt_tokens_total %llu\n", (unsigned long long)s->tokens_prompted);
    help(sb, "ferry_recomputed_tokens_total", "counter",
         "Prefix tokens prefilled again to resume preempted sequences (not in ferry_prompt_tokens_total)");
    sb_printf(sb, "ferry_recomputed_tokens_total %llu\n", (unsigned long long)s->tokens_recomputed);
    help(sb, "ferry_generated_tokens_total", "counter", "Tokens generated");
    sb_printf(sb, "ferry_generated_tokens_total %llu\n", (unsigned long long)s->tokens_generated);
    help(sb, "ferry_sequences_total", "counter", "Sequences the scheduler finished, by outcome");
    sb_printf(sb, "ferry_sequences_total{outcome=\"done\"} %llu\n", (unsigned long long)s->requests_done);
    sb_printf(sb, "ferry_sequences_total{outcome=\"failed\"} %llu\n", (unsigned long long)s->requests_failed);
    sb_printf(sb, "ferry_sequences_total{outcome=\"cancelled\"} %llu\n", (unsigned long long)s->requests_cancelled);

    help(sb, "ferry_step_seconds", "summary", "Wall time of engine steps (one pass over the weights)");
    sb_printf(sb, "ferry_step_seconds_sum %.9g\nferry_step_seconds_count %llu\n", s->step_s_sum,
              (unsigned long long)s->steps);
    help(sb, "ferry_batch_size", "histogram", "Sequences per engine step");
    cum = 0;
    for (int b = 0; b < 8; b++) {
        cum += s->batch_hist[b];
        sb_printf(sb, "ferry_batch_size_bucket{le=\"%s\"} %llu\n", k_batch_le[b], (unsigned long long)cum);
    }
    sb_printf(sb, "ferry_batch_size_sum %llu\n", (unsigned long long)s->batch_sum);
    sb_printf(sb, "ferry_batch_size_count %llu\n", (unsigned long long)s->steps);

    help(sb, "ferry_requests_running", "gauge", "Sequences holding KV blocks (prefilling or generating)");
    sb_printf(sb, "ferry_requests_running %d\n", s->running);
    help(sb, "ferry_requests_queued", "gauge",
         "Sequences waiting: for a batch slot, or for KV blocks (admitted and not yet started, or preempted)");
    sb_printf(sb, "ferry_requests_queued %d\n", s->queued);

    help(sb, "ferry_kv_blocks", "gauge", "Blocks of the paged KV cache, by state");
    sb_printf(sb, "ferry_kv_blocks{state=\"used\"} %d\n", s->kv_blocks_used);
    sb_printf(sb, "ferry_kv_blocks{state=\"free\"} %d\n", s->kv_blocks_free);
    help(sb, "ferry_preemptions_total", "counter",
         "Sequences preempted when KV blocks ran out (blocks freed, tokens kept, prefix recomputed later)");
    sb_printf(sb, "ferry_preemptions_total %llu\n", (unsigned long long)s->preemptions);

    help(sb, "ferry_fetched_bytes_total", "counter", "Weight bytes brought to compute, by tier of origin");
    for (int t = 0; t < TIER_COUNT; t++)
        sb_printf(sb, "ferry_fetched_bytes_total{tier=\"%s\"} %llu\n", tier_name((tier)t),
                  (unsigned long long)p->bytes[t]);
    help(sb, "ferry_stall_seconds_total", "counter", "Compute time spent waiting for a weight fetch");
    sb_printf(sb, "ferry_stall_seconds_total %.9g\n", p->stall_s);
    help(sb, "ferry_compute_seconds_total", "counter", "Compute time on layer groups");
    sb_printf(sb, "ferry_compute_seconds_total %.9g\n", p->compute_s);
    if (v->has_experts) {
        const expert_stats *x = &v->experts;
        help(sb, "ferry_expert_uses_total", "counter",
             "Experts the steps routed to, by where they were: on the device tier, in an expert slot "
             "(a cache hit), or fetched from host or disk (a miss)");
        sb_printf(sb, "ferry_expert_uses_total{source=\"device\"} %llu\n", (unsigned long long)x->device_uses);
        sb_printf(sb, "ferry_expert_uses_total{source=\"cache\"} %llu\n", (unsigned long long)x->hits);
        sb_printf(sb, "ferry_expert_uses_total{source=\"fetched\"} %llu\n", (unsigned long long)x->misses);
        help(sb, "ferry_expert_cache_hit_ratio", "gauge",
             "Expert slot hits / (hits + fetches) since start, over the experts not on the device tier");
        sb_printf(sb, "ferry_expert_cache_hit_ratio %.6g\n",
                  x->hits + x->misses ? (double)x->hits / (double)(x->hits + x->misses) : 0.0);
        help(sb, "ferry_expert_fetched_bytes_total", "counter", "Expert bytes fetched into slots, by tier of origin");
        for (int t = TIER_HOST; t < TIER_COUNT; t++)
            sb_printf(sb, "ferry_expert_fetched_bytes_total{tier=\"%s\"} %llu\n", tier_name((tier)t),
                      (unsigned long long)x->bytes[t]);
        help(sb, "ferry_expert_step_fetched_bytes", "gauge", "Expert bytes fetched during the last engine step");
        sb_printf(sb, "ferry_expert_step_fetched_bytes %.0f\n", x->last_step_bytes);
        help(sb, "ferry_expert_prefetched_total", "counter",
             "Experts fetched speculatively (--expert-prefetch: predicted for the next sparse layer)");
        sb_printf(sb, "ferry_expert_prefetched_total %llu\n", (unsigned long long)x->prefetched);
        help(sb, "ferry_expert_prefetch_hits_total", "counter", "Speculatively fetched experts a layer then routed to");
        sb_printf(sb, "ferry_expert_prefetch_hits_total %llu\n", (unsigned long long)x->prefetch_hits);
        help(sb, "ferry_expert_stall_seconds_total", "counter", "Compute time spent waiting for a fetched expert");
        sb_printf(sb, "ferry_expert_stall_seconds_total %.9g\n", x->stall_s);
    }
    help(sb, "ferry_host_bytes", "gauge",
         "Host memory the model takes, by kind (what --max-memory host= bounds; on the CPU backend all of it)");
    for (int k = 0; k < PLAN_MEM_KINDS; k++)
        sb_printf(sb, "ferry_host_bytes{kind=\"%s\"} %llu\n", plan_mem_kind_names[k],
                  (unsigned long long)v->mem_bytes[1][k]);
    if (!v->unified) {
        help(sb, "ferry_device_bytes", "gauge", "Device memory the model takes, by kind (what --max-memory device= bounds)");
        for (int k = 0; k < PLAN_MEM_KINDS; k++)
            sb_printf(sb, "ferry_device_bytes{kind=\"%s\"} %llu\n", plan_mem_kind_names[k],
                      (unsigned long long)v->mem_bytes[0][k]);
    }
    help(sb, "ferry_weight_bytes", "gauge", "Weight bytes placed on each tier");
    for (int t = 0; t < TIER_COUNT; t++)
        sb_printf(sb, "ferry_weight_bytes{tier=\"%s\"} %llu\n", tier_name((tier)t),
                  (unsigned long long)v->weight_bytes[t]);
}
