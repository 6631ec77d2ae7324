/*
 * cmd_bench.c - `ferry bench`: prefill and decode speed of a model, and the
 * decode roofline: weight bytes a decode step must read divided by its time,
 * against the machine's memory bandwidth measured in the same run (a large
 * multi-threaded memcpy, and a read-only pass). Figures, not tests.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "../engine/backend.h"
#include "../engine/engine.h"
#include "../engine/io/aio.h"
#include "../engine/sampling.h"
#include "../engine/store.h"
#include "../engine/base/json.h"
#include "../engine/base/util.h"
#include "cli.h"

/* ---- memory bandwidth ------------------------------------------------- */

#define BW_BYTES (1ull << 30) /* per buffer: well past any cache */

typedef struct {
    char *src, *dst;
    size_t n;
    int mode; /* 0: memcpy, 1: read */
    uint64_t sink;
} bw_job;

static void *bw_worker(void *arg)
{
    bw_job *j = arg;
    if (j->mode == 0) {
        memcpy(j->dst, j->src, j->n);
    } else {
        const uint64_t *p = (const uint64_t *)j->src;
        uint64_t a = 0, b = 0, c = 0, d = 0;
        for (size_t i = 0; i + 4 <= j->n / 8; i += 4) {
            a += p[i];
            b += p[i + 1];
            c += p[i + 2];
            d += p[i + 3];
        }
        j->sink = a + b + c + d;
    }
    return NULL;
}

/* Best of 3 passes over BW_BYTES with one thread per core; GB/s of bytes
 * copied (mode 0) or read (mode 1). */
static double bw_measure(char *src, char *dst, int mode, int threads)
{
    double best = 0;
    bw_job jobs[256];
    pthread_t th[256];
    size_t per = BW_BYTES / (size_t)threads & ~(size_t)4095;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = util_now();
        bool started[256] = {false};
        for (int i = 0; i < threads; i++) {
            jobs[i] = (bw_job){src + (size_t)i * per, dst + (size_t)i * per, per, mode, 0};
            started[i] = pthread_create(&th[i], NULL, bw_worker, &jobs[i]) == 0;
            if (!started[i]) bw_worker(&jobs[i]);
        }
        for (int i = 0; i < threads; i++)
            if (started[i]) pthread_join(th[i], NULL);
        double gbs = (double)per * threads / (util_now() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    return best;
}

/* ---- model timing --------------------------------------------------------- */

/* AnonHugePages of this process in bytes (0 if unknown): whether the
 * weights landed on transparent huge pages shows in decode speed. */
static uint64_t huge_page_bytes(void)
{
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "AnonHugePages: %llu kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Raw sequential O_DIRECT read rate of the offload dir's blobs (the files
 * the disk tier streams, on the same file system) through the same aio
 * layer, request size and depth, with two reads in flight so the queue
 * stays full across files, and no compute: the ceiling for the disk tier.
 * GB/s, 0 when nothing is on disk. */
static double raw_read_rate(const engine *e, uint64_t *bytes)
{
    *bytes = 0;
    const plan *p = engine_get_plan(e);
    store_source blobs[p->n_groups];
    int n_blobs = 0;
    uint64_t largest = 0;
    for (int g = 0; g < p->n_groups; g++) {
        store_source src = store_group_source(engine_store(e), g);
        if (src.tier != TIER_DISK || src.bytes == 0) continue;
        blobs[n_blobs++] = src;
        largest = src.bytes > largest ? src.bytes : largest;
    }
    if (n_blobs == 0) return 0;
    void *buf[2] = {NULL, NULL};
    aio *a = NULL;
    /* the same kind of memory as the staging slots: huge pages, so that
     * pinning pages for the DMA costs the same */
    largest = (largest + (2u << 20) - 1) & ~(uint64_t)((2u << 20) - 1);
    if (posix_memalign(&buf[0], 2u << 20, (size_t)largest) != 0 ||
        posix_memalign(&buf[1], 2u << 20, (size_t)largest) != 0 || aio_create(16, &a) != FERRY_OK) {
        free(buf[0]);
        free(buf[1]);
        return 0;
    }
    madvise(buf[0], (size_t)largest, MADV_HUGEPAGE);
    madvise(buf[1], (size_t)largest, MADV_HUGEPAGE);
    memset(buf[0], 0, (size_t)largest); /* fault the pages in before timing */
    memset(buf[1], 0, (size_t)largest);
    double t0 = util_now();
    aio_done d;
    int next = 0, ok = 1;
    for (; next < n_blobs && next < 2; next++)
        ok &= aio_read(a, blobs[next].fd, blobs[next].path, blobs[next].offset, buf[next % 2],
                       (size_t)blobs[next].bytes, (uint64_t)next) == FERRY_OK;
    while (ok && aio_pending(a) > 0) {
        if (aio_reap(a, &d, 1, true) == 0) continue;
        if (d.st != FERRY_OK) break;
        *bytes += blobs[d.tag].bytes;
        if (next < n_blobs) {
            ok &= aio_read(a, blobs[next].fd, blobs[next].path, blobs[next].offset, buf[d.tag % 2],
                           (size_t)blobs[next].bytes, (uint64_t)next) == FERRY_OK;
            next++;
        }
    }
    while (aio_pending(a) > 0) aio_reap(a, &d, 1, true);
    double dt = util_now() - t0;
    aio_free(a);
    free(buf[0]);
    free(buf[1]);
    return dt > 0 ? (double)*bytes / dt / 1e9 : 0;
}

/* Peak host -> device copy rate through the backend's own primitives
 * (copy_async on the copy stream from host_alloc'd memory - pinned where
 * the backend can - then an event): the ceiling for the host tier. GB/s. */
static double copy_peak_rate(backend *be, bool *pinned)
{
    const size_t n = 256u << 20;
    *pinned = false;
    void *host = be->ops->host_alloc(be, n, pinned);
    void *dev = be->ops->alloc(be, n);
    be_event *ev = be->ops->event_create(be);
    double best = 0;
    if (host && dev && ev) {
        memset(host, 1, n);
        for (int rep = 0; rep < 4; rep++) {
            double t0 = util_now();
            be->ops->copy_async(be, dev, host, n);
            be->ops->event_record(be, ev, STREAM_COPY);
            be->ops->event_sync(be, ev);
            double gbs = (double)n / (util_now() - t0) / 1e9;
            if (rep > 0 && gbs > best) best = gbs; /* the first pass warms up */
        }
    }
    if (ev) be->ops->event_destroy(be, ev);
    if (dev) be->ops->release(be, dev);
    if (host) be->ops->host_free(be, host, n, *pinned);
    return best;
}

static uint64_t peak_rss_bytes(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (uint64_t)ru.ru_maxrss * 1024;
}

typedef struct {
    double wall, compute, stall, fetch;
    uint64_t bytes[TIER_COUNT];
    /* a mixture of experts: experts computed, by where they were, and
     * expert bytes fetched (in bytes[] too) */
    uint64_t x_device, x_hits, x_misses, x_bytes, x_prefetched, x_prefetch_hits;
    double x_stall;
} step_rec;

static step_rec stats_delta(const pipeline_stats *a, const pipeline_stats *b, const expert_stats *xa,
                            const expert_stats *xb)
{
    step_rec r = {b->wall_s - a->wall_s, b->compute_s - a->compute_s, b->stall_s - a->stall_s,
                  b->fetch_s - a->fetch_s, {0}, xb->device_uses - xa->device_uses, xb->hits - xa->hits,
                  xb->misses - xa->misses, 0, xb->prefetched - xa->prefetched, xb->prefetch_hits - xa->prefetch_hits,
                  xb->stall_s - xa->stall_s};
    for (int t = 0; t < TIER_COUNT; t++) {
        uint64_t x = xb->bytes[t] - xa->bytes[t];
        r.bytes[t] = b->bytes[t] - a->bytes[t] + x;
        r.x_bytes += x;
    }
    return r;
}

/* What one run measured. */
typedef struct {
    int batch, plen, steps, threads;
    double load_s, prefill_s, step_s;   /* step_s: median decode step */
    step_rec *rec;                      /* [steps] */
    step_rec mean;                      /* steady state: every step but the first */
    int mean_steps;                     /* how many that is */
    double raw_gbs, copy_peak_gbs, copy_gbs, read_gbs;
    uint64_t raw_bytes, rss, wbytes;
    bool copy_pinned;
} bench_run;

/* The timed steps. Every path that is timed runs once untimed first
 * (first-use costs: page faults, library initialisation, kernel choice):
 * a whole prefill of the prompt length, and the first decode step. */
/* A uniform token id for sequence s at decode step `step` (--decode-input random). */
static uint64_t mix_token(int step, int s)
{
    return util_mix64(((uint64_t)(uint32_t)(step + 1) << 32 | (uint32_t)s) * UTIL_SPLITMIX64_GAMMA);
}

static ferry_status time_steps(engine *e, const ferry_config *cfg, bench_run *r)
{
    bool random_input = !strcmp(cfg->decode_input, "random");
    engine_limits lim = engine_get_limits(e);
    int B = r->batch, plen = r->plen;
    int ntok = plen > B * 4 ? plen : B * 4;
    batch_builder bb;
    int32_t *tokens = malloc((size_t)ntok * sizeof *tokens);
    float *logits = malloc((size_t)B * (size_t)lim.vocab * sizeof *logits);
    double *walls = malloc((size_t)r->steps * sizeof *walls);
    ferry_status st = batch_builder_init(&bb, ntok, B);
    if (st == FERRY_OK && (!tokens || !logits || !walls)) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    if (st != FERRY_OK) goto out;
    for (int i = 0; i < ntok; i++) tokens[i] = (int32_t)((uint32_t)(i * 2654435761u) % (uint32_t)lim.vocab);

    /* prefill: one prompt of plen tokens in one step, warmed then timed */
    batch_builder_add(&bb, 0, 0, tokens, plen);
    batch b = batch_builder_get(&bb);
    if ((st = engine_kv_reserve(e, 0, plen)) != FERRY_OK) goto out;
    if ((st = engine_step(e, &b, logits)) != FERRY_OK) goto out;
    double t0 = util_now();
    if ((st = engine_step(e, &b, logits)) != FERRY_OK) goto out;
    r->prefill_s = util_now() - t0;

    /* decode: B sequences with 4-token prompts, one warm step, then the timed ones */
    engine_kv_release(e, 0);
    for (int s = 0; s < B; s++)
        if ((st = engine_kv_reserve(e, s, 5 + r->steps)) != FERRY_OK) goto out;
    batch_builder_clear(&bb);
    for (int s = 0; s < B; s++) batch_builder_add(&bb, s, 0, tokens + s * 4, 4);
    b = batch_builder_get(&bb);
    if ((st = engine_step(e, &b, logits)) != FERRY_OK) goto out;
    for (int step = -1; step < r->steps; step++) {
        if (step == 0 && cfg->trace && (st = engine_trace_start(e, 1u << 20)) != FERRY_OK) goto out;
        batch_builder_clear(&bb);
        for (int s = 0; s < B; s++) {
            int32_t next = random_input ? (int32_t)(mix_token(step, s) % (uint64_t)lim.vocab)
                                        : sample_argmax(logits + (size_t)s * (size_t)lim.vocab, lim.vocab);
            batch_builder_add(&bb, s, 5 + step, &next, 1);
        }
        b = batch_builder_get(&bb);
        pipeline_stats before = engine_pipeline_stats(e);
        expert_stats xbefore, xafter;
        engine_expert_stats(e, &xbefore);
        t0 = util_now();
        if ((st = engine_step(e, &b, logits)) != FERRY_OK) goto out;
        if (step < 0) continue;
        walls[step] = util_now() - t0;
        pipeline_stats after = engine_pipeline_stats(e);
        engine_expert_stats(e, &xafter);
        r->rec[step] = stats_delta(&before, &after, &xbefore, &xafter);
        r->rec[step].wall = walls[step];
    }
    if (cfg->trace && (st = engine_trace_write(e, cfg->trace)) != FERRY_OK) goto out;
    qsort(walls, (size_t)r->steps, sizeof *walls, cmp_double);
    r->step_s = walls[r->steps / 2];
    int from = r->steps > 1 ? 1 : 0, n = r->steps - from;
    for (int i = from; i < r->steps; i++) {
        r->mean.wall += r->rec[i].wall / n;
        r->mean.compute += r->rec[i].compute / n;
        r->mean.stall += r->rec[i].stall / n;
        r->mean.fetch += r->rec[i].fetch / n;
        for (int t = 0; t < TIER_COUNT; t++) r->mean.bytes[t] += r->rec[i].bytes[t] / (uint64_t)n;
        r->mean.x_device += r->rec[i].x_device;
        r->mean.x_hits += r->rec[i].x_hits;
        r->mean.x_misses += r->rec[i].x_misses;
        r->mean.x_prefetched += r->rec[i].x_prefetched;
        r->mean.x_prefetch_hits += r->rec[i].x_prefetch_hits;
        r->mean.x_bytes += r->rec[i].x_bytes / (uint64_t)n;
        r->mean.x_stall += r->rec[i].x_stall / n;
    }
    r->mean_steps = n; /* x_device, x_hits, x_misses, x_prefetched, x_prefetch_hits are summed over them */
out:
    batch_builder_free(&bb);
    free(tokens);
    free(logits);
    free(walls);
    return st;
}

/* Host memory bandwidth, on huge pages like the weights, so that both are
 * measured on the same kind of memory. */
static ferry_status measure_bandwidth(bench_run *r)
{
    char *src = NULL, *dst = NULL;
    if (posix_memalign((void **)&src, 2u << 20, BW_BYTES) != 0 || posix_memalign((void **)&dst, 2u << 20, BW_BYTES) != 0) {
        free(src);
        free(dst);
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory for the bandwidth buffers (2 x 1 GiB)");
    }
    madvise(src, BW_BYTES, MADV_HUGEPAGE);
    madvise(dst, BW_BYTES, MADV_HUGEPAGE);
    memset(src, 1, BW_BYTES);
    memset(dst, 2, BW_BYTES);
    r->copy_gbs = bw_measure(src, dst, 0, r->threads);
    r->read_gbs = bw_measure(src, dst, 1, r->threads);
    free(src);
    free(dst);
    return FERRY_OK;
}

static void report_experts_json(strbuf *sb, engine *e, const bench_run *r);

static void report_json(const ferry_config *cfg, engine *e, const bench_run *r)
{
    engine_info info = engine_get_info(e);
    const plan *p = engine_get_plan(e);
    const step_rec *m = &r->mean;
    double weight_gbs = (double)r->wbytes / r->step_s / 1e9, bw = r->copy_gbs > r->read_gbs ? r->copy_gbs : r->read_gbs;
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\"model\": ");
    sb_json_str(&sb, cfg->model);
    sb_printf(&sb,
              ", \"device\": \"%s\", \"kernels\": \"%s\", \"threads\": %d, \"batch\": %d, \"prompt_len\": %d, \"load_s\": %.3f, "
              "\"prefill_tokens_per_s\": %.2f, \"decode_step_ms\": %.3f, \"decode_tokens_per_s\": %.2f, "
              "\"weight_bytes_per_step\": %llu, \"weight_read_gb_per_s\": %.3f, \"memcpy_gb_per_s\": %.3f, "
              "\"read_gb_per_s\": %.3f, \"roofline_fraction\": %.4f, \"huge_page_bytes\": %llu, "
              "\"tier_bytes\": {\"device\": %llu, \"host\": %llu, \"disk\": %llu}, "
              "\"step_compute_ms\": %.3f, \"step_fetch_ms\": %.3f, \"step_stall_ms\": %.3f, "
              "\"step_disk_bytes\": %llu, \"step_host_bytes\": %llu, \"disk_gb_per_s\": %.3f, "
              "\"host_gb_per_s\": %.3f, \"raw_direct_read_gb_per_s\": %.3f, \"raw_read_bytes\": %llu, "
              "\"peak_rss_bytes\": %llu, \"copy_peak_gb_per_s\": %.3f, \"copy_peak_pinned\": %s, \"steps\": [",
              info.backend, info.kernels ? info.kernels : "", r->threads, r->batch, r->plen, r->load_s,
              r->plen / r->prefill_s, r->step_s * 1e3, r->batch / r->step_s, (unsigned long long)r->wbytes, weight_gbs, r->copy_gbs, r->read_gbs,
              weight_gbs / bw, (unsigned long long)huge_page_bytes(), (unsigned long long)p->tier_bytes[TIER_DEVICE],
              (unsigned long long)p->tier_bytes[TIER_HOST], (unsigned long long)p->tier_bytes[TIER_DISK],
              m->compute * 1e3, m->fetch * 1e3, m->stall * 1e3, (unsigned long long)m->bytes[TIER_DISK],
              (unsigned long long)m->bytes[TIER_HOST], m->wall > 0 ? (double)m->bytes[TIER_DISK] / m->wall / 1e9 : 0,
              m->wall > 0 ? (double)m->bytes[TIER_HOST] / m->wall / 1e9 : 0, r->raw_gbs,
              (unsigned long long)r->raw_bytes, (unsigned long long)r->rss, r->copy_peak_gbs,
              r->copy_pinned ? "true" : "false");
    for (int i = 0; i < r->steps; i++)
        sb_printf(&sb, "%s{\"wall_ms\": %.3f, \"compute_ms\": %.3f, \"fetch_ms\": %.3f, \"stall_ms\": %.3f, "
                       "\"disk_bytes\": %llu, \"host_bytes\": %llu}",
                  i ? ", " : "", r->rec[i].wall * 1e3, r->rec[i].compute * 1e3, r->rec[i].fetch * 1e3,
                  r->rec[i].stall * 1e3, (unsigned long long)r->rec[i].bytes[TIER_DISK],
                  (unsigned long long)r->rec[i].bytes[TIER_HOST]);
    sb_putc(&sb, ']');
    report_experts_json(&sb, e, r);
    sb_puts(&sb, "}\n");
    fwrite(sb.data, 1, sb.len, stdout);
    sb_free(&sb);
}

/* A mixture of experts: what the steps routed and fetched, against the
 * floors of a disk-bound decode step: the routed experts' bytes at the raw
 * O_DIRECT rate (the active-parameter floor), and the bytes of every expert
 * off the device at that rate (what streaming every expert, the dense-group
 * way, must move). Per step, over the steady steps. */
typedef struct {
    double routed, device, hits, fetched, hit_rate; /* experts per step; hits / (hits + fetched) */
    double prefetched, prefetch_hits;               /* per step: speculative fetches, and hits on them */
    double fetched_bytes, routed_bytes;             /* per step */
    uint64_t all_bytes, off_bytes;                  /* every expert; those not on the device */
    double stall_s, active_floor_s, dense_floor_s;  /* floors 0 without a raw disk rate */
    int slots;
} expert_fig;

static bool expert_figures(engine *e, const bench_run *r, expert_fig *f)
{
    expert_stats x;
    memset(f, 0, sizeof *f);
    if (!engine_expert_stats(e, &x)) return false;
    const plan *p = engine_get_plan(e);
    const step_rec *m = &r->mean;
    int n_experts = p->n_groups - p->first_expert;
    for (int g = p->first_expert; g < p->n_groups; g++) {
        f->all_bytes += p->groups[g].bytes;
        f->off_bytes += p->groups[g].tier != TIER_DEVICE ? p->groups[g].bytes : 0;
    }
    double steps = r->mean_steps ? r->mean_steps : 1, per = n_experts ? (double)f->all_bytes / n_experts : 0;
    f->device = (double)m->x_device / steps;
    f->hits = (double)m->x_hits / steps;
    f->fetched = (double)m->x_misses / steps;
    f->routed = f->device + f->hits + f->fetched;
    f->hit_rate = f->hits + f->fetched > 0 ? f->hits / (f->hits + f->fetched) : 0;
    f->prefetched = (double)m->x_prefetched / steps;
    f->prefetch_hits = (double)m->x_prefetch_hits / steps;
    f->fetched_bytes = (double)m->x_bytes;
    f->routed_bytes = f->routed * per;
    f->stall_s = m->x_stall;
    f->slots = p->n_expert_slots;
    if (r->raw_gbs > 0) {
        f->active_floor_s = f->routed_bytes / (r->raw_gbs * 1e9);
        f->dense_floor_s = (double)f->off_bytes / (r->raw_gbs * 1e9);
    }
    return true;
}

static void report_experts_text(engine *e, const bench_run *r)
{
    expert_fig f;
    if (!expert_figures(e, r, &f)) return;
    char b1[32], b2[32], b3[32], b4[32];
    printf("experts          %.1f routed/step (%.1f on device, %.1f slot hits, %.1f fetched); hit rate %.0f%%; "
           "%d slots\n",
           f.routed, f.device, f.hits, f.fetched, 100 * f.hit_rate, f.slots);
    if (f.prefetched > 0)
        printf("expert prefetch  %.1f fetched speculatively/step, %.1f of them routed to (%.0f%%)\n", f.prefetched,
               f.prefetch_hits, 100 * f.prefetch_hits / f.prefetched);
    printf("expert bytes     fetched %s/step of %s routed/step; all experts %s (%s off the device); stall %.2f ms\n",
           util_fmt_bytes((uint64_t)f.fetched_bytes, b1, sizeof b1), util_fmt_bytes((uint64_t)f.routed_bytes, b2, sizeof b2),
           util_fmt_bytes(f.all_bytes, b3, sizeof b3), util_fmt_bytes(f.off_bytes, b4, sizeof b4), f.stall_s * 1e3);
    if (f.active_floor_s > 0)
        printf("expert floors    routed experts at raw O_DIRECT %.2f ms (step / floor = %.2f); every expert off the "
               "device %.2f ms (%.1fx the step)\n",
               f.active_floor_s * 1e3, r->step_s / f.active_floor_s, f.dense_floor_s * 1e3, f.dense_floor_s / r->step_s);
}

static void report_experts_json(strbuf *sb, engine *e, const bench_run *r)
{
    expert_fig f;
    if (!expert_figures(e, r, &f)) return;
    sb_printf(sb,
              ", \"experts\": {\"routed_per_step\": %.3f, \"device_per_step\": %.3f, \"hits_per_step\": %.3f, "
              "\"fetched_per_step\": %.3f, \"hit_rate\": %.4f, \"fetched_bytes_per_step\": %.0f, "
              "\"routed_bytes_per_step\": %.0f, \"all_bytes\": %llu, \"off_device_bytes\": %llu, \"stall_ms\": %.3f, "
              "\"active_floor_ms\": %.3f, \"dense_floor_ms\": %.3f, \"slots\": %d, \"prefetched_per_step\": %.3f, "
              "\"prefetch_hits_per_step\": %.3f}",
              f.routed, f.device, f.hits, f.fetched, f.hit_rate, f.fetched_bytes, f.routed_bytes,
              (unsigned long long)f.all_bytes, (unsigned long long)f.off_bytes, f.stall_s * 1e3,
              f.active_floor_s * 1e3, f.dense_floor_s * 1e3, f.slots, f.prefetched, f.prefetch_hits);
}

static void report_text(const ferry_config *cfg, engine *e, const bench_run *r)
{
    engine_info info = engine_get_info(e);
    const plan *p = engine_get_plan(e);
    const step_rec *m = &r->mean;
    double weight_gbs = (double)r->wbytes / r->step_s / 1e9, bw = r->copy_gbs > r->read_gbs ? r->copy_gbs : r->read_gbs;
    double disk_gbs = m->wall > 0 ? (double)m->bytes[TIER_DISK] / m->wall / 1e9 : 0;
    double host_gbs = m->wall > 0 ? (double)m->bytes[TIER_HOST] / m->wall / 1e9 : 0;
    char wb[32], b2[32], b3[32];
    printf("model            %s (%s, %d layers)\n", cfg->model, info.arch, info.n_layers);
    printf("device           %s%s%s, %d threads; loaded in %.2f s\n", info.backend, info.kernels ? " kernels " : "",
           info.kernels ? info.kernels : "", r->threads, r->load_s);
    printf("placement        device %s, host %s, disk %s; %d groups streamed, %d staging slots\n",
           util_fmt_bytes(p->tier_bytes[TIER_DEVICE], wb, sizeof wb), util_fmt_bytes(p->tier_bytes[TIER_HOST], b2, sizeof b2),
           util_fmt_bytes(p->tier_bytes[TIER_DISK], b3, sizeof b3), p->n_streamed, p->n_stage_slots);
    printf("memory bandwidth memcpy %.2f GB/s (bytes copied), read %.2f GB/s\n", r->copy_gbs, r->read_gbs);
    if (r->raw_bytes)
        printf("raw O_DIRECT     %.3f GB/s reading the %s of blobs in order (same fs, aio depth 16, 2 files in flight)\n",
               r->raw_gbs, util_fmt_bytes(r->raw_bytes, wb, sizeof wb));
    printf("copy peak        %.2f GB/s host -> %s (copy_async from %s memory, 256 MiB)\n", r->copy_peak_gbs,
           info.unified ? "slot (memcpy)" : "device", r->copy_pinned ? "pinned" : "pageable");
    printf("prefill          %d tokens in %.3f s: %.1f tokens/s\n", r->plen, r->prefill_s, r->plen / r->prefill_s);
    printf("decode batch %-3d step %.2f ms (median of %d): %.2f tokens/s\n", r->batch, r->step_s * 1e3, r->steps,
           r->batch / r->step_s);
    printf("per step (mean)  wall %.2f ms, compute %.2f ms, fetch %.2f ms, stall %.2f ms\n", m->wall * 1e3,
           m->compute * 1e3, m->fetch * 1e3, m->stall * 1e3);
    if (m->bytes[TIER_DISK] || m->bytes[TIER_HOST])
        printf("streamed         disk %s/step = %.3f GB/s; host %s/step = %.3f GB/s\n",
               util_fmt_bytes(m->bytes[TIER_DISK], wb, sizeof wb), disk_gbs,
               util_fmt_bytes(m->bytes[TIER_HOST], b2, sizeof b2), host_gbs);
    if (r->copy_peak_gbs > 0 && m->bytes[TIER_HOST])
        printf("copy efficiency  host tier at %.0f%% of the copy peak\n", 100 * host_gbs / r->copy_peak_gbs);
    if (r->raw_gbs > 0 && m->bytes[TIER_DISK])
        printf("disk efficiency  %.0f%% of the raw O_DIRECT rate; step / max(fetch, compute) = %.3f\n",
               100 * disk_gbs / r->raw_gbs, m->wall / (m->fetch > m->compute ? m->fetch : m->compute));
    report_experts_text(e, r);
    printf("huge pages       %s of anonymous memory\n", util_fmt_bytes(huge_page_bytes(), wb, sizeof wb));
    printf("decode roofline  %s of weights per step: %.2f GB/s = %.0f%% of %.2f GB/s\n",
           util_fmt_bytes(r->wbytes, wb, sizeof wb), weight_gbs, 100 * weight_gbs / bw, bw);
    printf("peak RSS         %s\n", util_fmt_bytes(r->rss, wb, sizeof wb));
}

int cmd_bench(const ferry_config *cfg)
{
    bench_run r = {.batch = (int)cfg->batch, .plen = (int)cfg->prompt_len, .steps = (int)cfg->steps};
    r.threads = cfg->threads > 0 ? (int)cfg->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (r.threads > 256) r.threads = 256;
    engine_opts eo;
    int rc = cli_engine_opts(cfg, &eo);
    if (rc) return rc;
    eo.max_seqs = r.batch;
    /* positions each sequence may reach: what the run uses, or --context
     * where given (the paged pool commits only the blocks used) */
    if (eo.max_ctx < r.plen + r.steps + 8) eo.max_ctx = r.plen + r.steps + 8;
    if (eo.max_step_tokens < r.plen) eo.max_step_tokens = r.plen;
    if (eo.max_step_tokens < 4 * r.batch) eo.max_step_tokens = 4 * r.batch;

    engine *e;
    double t_open = util_now();
    ferry_status st = engine_open(&eo, &e);
    if (st != FERRY_OK) return cli_fail(st);
    r.load_s = util_now() - t_open;
    r.raw_gbs = raw_read_rate(e, &r.raw_bytes);
    r.copy_peak_gbs = copy_peak_rate(engine_backend(e), &r.copy_pinned);
    r.wbytes = engine_decode_weight_bytes(e, r.batch);
    r.rec = calloc((size_t)r.steps, sizeof *r.rec);
    if (!r.rec) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    if (st == FERRY_OK) st = time_steps(e, cfg, &r);
    r.rss = peak_rss_bytes(); /* before the bandwidth buffers exist */
    if (st == FERRY_OK) st = measure_bandwidth(&r);
    if (st == FERRY_OK) {
        if (cfg->json) report_json(cfg, e, &r);
        else report_text(cfg, e, &r);
    }
    rc = st == FERRY_OK ? 0 : cli_fail(st);
    free(r.rec);
    engine_close(e);
    return rc;
}
