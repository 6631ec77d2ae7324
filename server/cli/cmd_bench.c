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

#include "../../engine/io/aio.h"
#include "../../engine/engine.h"
#include "../../engine/base/json.h"
#include "../../engine/base/util.h"
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

/* Bytes of weights one decode step of b sequences reads: every layer, the
 * final norm and lm_head in full; b embedding rows. */
static uint64_t decode_weight_bytes(const engine *e, int b)
{
    const model_weights *w = &e->w;
    uint64_t total = 0;
#define WB(x) ((x).data ? (uint64_t)(x).rows * (uint64_t)(x).cols * dtype_size((x).dtype) : 0)
    for (int l = 0; l < e->cfg.n_layers; l++) {
        const layer_weights *lw = &w->layers[l];
        total += WB(lw->attn_norm) + WB(lw->wq) + WB(lw->wk) + WB(lw->wv) + WB(lw->wo) + WB(lw->bq) + WB(lw->bk) +
                 WB(lw->bv) + WB(lw->bo) + WB(lw->q_norm) + WB(lw->k_norm) + WB(lw->mlp_norm) + WB(lw->w_gate) +
                 WB(lw->w_up) + WB(lw->w_down);
    }
    total += WB(w->final_norm) + WB(w->lm_head);
    total += (uint64_t)b * (uint64_t)w->embed.cols * dtype_size(w->embed.dtype);
#undef WB
    return total;
}

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
    store_source blobs[engine_n_groups(e)];
    int n_blobs = 0;
    uint64_t largest = 0;
    for (int g = 0; g < engine_n_groups(e); g++) {
        store_source src = engine_group_source(e, g);
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
} step_rec;

static step_rec stats_delta(const pipeline_stats *a, const pipeline_stats *b)
{
    step_rec r = {b->wall_s - a->wall_s, b->compute_s - a->compute_s, b->stall_s - a->stall_s,
                  b->fetch_s - a->fetch_s, {0}};
    for (int t = 0; t < TIER_COUNT; t++) r.bytes[t] = b->bytes[t] - a->bytes[t];
    return r;
}

int cmd_bench(const ferry_config *cfg)
{
    int B = (int)cfg->batch, steps = (int)cfg->steps, plen = (int)cfg->prompt_len;
    if (B < 1 || B > 4096) return cli_error(EXIT_USAGE, "--batch must be in 1..4096");
    if (steps < 1 || steps > 100000) return cli_error(EXIT_USAGE, "--steps must be in 1..100000");
    if (plen < 1 || plen > 1000000) return cli_error(EXIT_USAGE, "--prompt-len must be in 1..1000000");
    int threads = cfg->threads > 0 ? (int)cfg->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads > 256) threads = 256;
    engine_opts eo;
    int rc = cli_engine_opts(cfg, &eo);
    if (rc) return rc;
    eo.n_slots = B;
    eo.max_ctx = plen + steps + 8;
    if (eo.max_step_tokens < plen) eo.max_step_tokens = plen;

    engine *e;
    double t_open = util_now();
    ferry_status st = engine_open(&eo, &e);
    if (st != FERRY_OK) return cli_fail(st);
    t_open = util_now() - t_open;
    const model_config *c = &e->cfg;
    uint64_t raw_bytes;
    double raw_gbs = raw_read_rate(e, &raw_bytes);
    bool copy_pinned = false;
    double copy_peak_gbs = copy_peak_rate(e->be, &copy_pinned);

    int ntok = plen > B * 4 ? plen : B * 4;
    int32_t *tokens = malloc((size_t)ntok * sizeof *tokens), *pos = malloc((size_t)ntok * sizeof *pos);
    float *logits = malloc((size_t)B * (size_t)c->vocab * sizeof *logits);
    batch_seq *seqs = calloc((size_t)B, sizeof *seqs);
    step_rec *rec = calloc((size_t)steps, sizeof *rec);
    double *walls = malloc((size_t)steps * sizeof *walls);
    if (!tokens || !pos || !logits || !seqs || !rec || !walls) {
        rc = cli_error(EXIT_RUNTIME, "out of memory");
        goto out;
    }
    for (int i = 0; i < ntok; i++) tokens[i] = (int32_t)((uint32_t)(i * 2654435761u) % (uint32_t)c->vocab);

    /* warm-up: one step touches every weight once */
    seqs[0] = (batch_seq){0, 0, 1, 0};
    pos[0] = 0;
    batch b = {1, 1, tokens, pos, seqs};
    if ((st = engine_step(e, &b, logits)) != FERRY_OK) goto fail;

    /* prefill: one prompt of plen tokens in one step */
    for (int i = 0; i < plen; i++) pos[i] = i;
    seqs[0] = (batch_seq){0, 0, plen, 0};
    b = (batch){plen, 1, tokens, pos, seqs};
    double t0 = util_now();
    if ((st = engine_step(e, &b, logits)) != FERRY_OK) goto fail;
    double prefill_s = util_now() - t0;

    /* decode: B sequences with 4-token prompts, then `steps` timed steps */
    for (int s = 0; s < B; s++) {
        seqs[s] = (batch_seq){s, 0, 4, s * 4};
        for (int k = 0; k < 4; k++) pos[s * 4 + k] = k;
    }
    b = (batch){B * 4, B, tokens, pos, seqs};
    if ((st = engine_step(e, &b, logits)) != FERRY_OK) goto fail;
    if (cfg->trace && (st = pipeline_trace_start(e->pipe, 1u << 20)) != FERRY_OK) goto fail;
    for (int step = 0; step < steps; step++) {
        for (int s = 0; s < B; s++) {
            seqs[s] = (batch_seq){s, 4 + step, 1, s};
            tokens[s] = sample_argmax(logits + (size_t)s * (size_t)c->vocab, c->vocab);
            pos[s] = 4 + step;
        }
        b = (batch){B, B, tokens, pos, seqs};
        pipeline_stats before = pipeline_get_stats(e->pipe);
        t0 = util_now();
        if ((st = engine_step(e, &b, logits)) != FERRY_OK) goto fail;
        walls[step] = util_now() - t0;
        pipeline_stats after = pipeline_get_stats(e->pipe);
        rec[step] = stats_delta(&before, &after);
        rec[step].wall = walls[step];
    }
    if (cfg->trace && (st = pipeline_trace_write(e->pipe, cfg->trace)) != FERRY_OK) goto fail;
    /* the run's peak RSS is taken before the bandwidth buffers exist */
    uint64_t rss = peak_rss_bytes();
    double copy_gbs = 0, read_gbs = 0;
    {
        /* huge pages, like the weights, so both are measured on the same kind of memory */
        char *src = NULL, *dst = NULL;
        if (posix_memalign((void **)&src, 2u << 20, BW_BYTES) != 0 || posix_memalign((void **)&dst, 2u << 20, BW_BYTES) != 0) {
            free(src);
            free(dst);
            rc = cli_error(EXIT_RUNTIME, "out of memory for the bandwidth buffers (2 x 1 GiB)");
            goto out;
        }
        madvise(src, BW_BYTES, MADV_HUGEPAGE);
        madvise(dst, BW_BYTES, MADV_HUGEPAGE);
        memset(src, 1, BW_BYTES);
        memset(dst, 2, BW_BYTES);
        copy_gbs = bw_measure(src, dst, 0, threads);
        read_gbs = bw_measure(src, dst, 1, threads);
        free(src);
        free(dst);
    }
    qsort(walls, (size_t)steps, sizeof *walls, cmp_double);
    double step_s = walls[steps / 2];
    /* steady state: the mean of every step but the first */
    step_rec mean = {0};
    int from = steps > 1 ? 1 : 0;
    for (int i = from; i < steps; i++) {
        mean.wall += rec[i].wall / (steps - from);
        mean.compute += rec[i].compute / (steps - from);
        mean.stall += rec[i].stall / (steps - from);
        mean.fetch += rec[i].fetch / (steps - from);
        for (int t = 0; t < TIER_COUNT; t++) mean.bytes[t] += rec[i].bytes[t] / (uint64_t)(steps - from);
    }
    uint64_t wbytes = decode_weight_bytes(e, B);
    double weight_gbs = (double)wbytes / step_s / 1e9;
    double bw = copy_gbs > read_gbs ? copy_gbs : read_gbs;
    double disk_gbs = mean.wall > 0 ? (double)mean.bytes[TIER_DISK] / mean.wall / 1e9 : 0;
    double host_gbs = mean.wall > 0 ? (double)mean.bytes[TIER_HOST] / mean.wall / 1e9 : 0;

    if (cfg->json) {
        strbuf sb;
        sb_init(&sb);
        sb_puts(&sb, "{\"model\": ");
        sb_json_str(&sb, cfg->model);
        sb_printf(&sb,
                  ", \"device\": \"%s\", \"threads\": %d, \"batch\": %d, \"prompt_len\": %d, \"load_s\": %.3f, "
                  "\"prefill_tokens_per_s\": %.2f, \"decode_step_ms\": %.3f, \"decode_tokens_per_s\": %.2f, "
                  "\"weight_bytes_per_step\": %llu, \"weight_read_gb_per_s\": %.3f, \"memcpy_gb_per_s\": %.3f, "
                  "\"read_gb_per_s\": %.3f, \"roofline_fraction\": %.4f, \"huge_page_bytes\": %llu, "
                  "\"tier_bytes\": {\"device\": %llu, \"host\": %llu, \"disk\": %llu}, "
                  "\"step_compute_ms\": %.3f, \"step_fetch_ms\": %.3f, \"step_stall_ms\": %.3f, "
                  "\"step_disk_bytes\": %llu, \"step_host_bytes\": %llu, \"disk_gb_per_s\": %.3f, "
                  "\"host_gb_per_s\": %.3f, \"raw_direct_read_gb_per_s\": %.3f, \"raw_read_bytes\": %llu, "
                  "\"peak_rss_bytes\": %llu, \"copy_peak_gb_per_s\": %.3f, \"copy_peak_pinned\": %s, \"steps\": [",
                  e->be->ops->name, threads, B, plen, t_open, plen / prefill_s, step_s * 1e3, B / step_s,
                  (unsigned long long)wbytes, weight_gbs, copy_gbs, read_gbs, weight_gbs / bw,
                  (unsigned long long)huge_page_bytes(), (unsigned long long)e->plan.tier_bytes[TIER_DEVICE],
                  (unsigned long long)e->plan.tier_bytes[TIER_HOST], (unsigned long long)e->plan.tier_bytes[TIER_DISK],
                  mean.compute * 1e3, mean.fetch * 1e3, mean.stall * 1e3, (unsigned long long)mean.bytes[TIER_DISK],
                  (unsigned long long)mean.bytes[TIER_HOST], disk_gbs, host_gbs, raw_gbs,
                  (unsigned long long)raw_bytes, (unsigned long long)rss, copy_peak_gbs,
                  copy_pinned ? "true" : "false");
        for (int i = 0; i < steps; i++)
            sb_printf(&sb, "%s{\"wall_ms\": %.3f, \"compute_ms\": %.3f, \"fetch_ms\": %.3f, \"stall_ms\": %.3f, "
                           "\"disk_bytes\": %llu, \"host_bytes\": %llu}",
                      i ? ", " : "", rec[i].wall * 1e3, rec[i].compute * 1e3, rec[i].fetch * 1e3, rec[i].stall * 1e3,
                      (unsigned long long)rec[i].bytes[TIER_DISK], (unsigned long long)rec[i].bytes[TIER_HOST]);
        sb_puts(&sb, "]}\n");
        fwrite(sb.data, 1, sb.len, stdout);
        sb_free(&sb);
    } else {
        char wb[32], b2[32], b3[32];
        printf("model            %s (%s, %d layers)\n", cfg->model, c->arch_name, c->n_layers);
        printf("device           %s, %d threads; loaded in %.2f s\n", e->be->ops->name, threads, t_open);
        printf("placement        device %s, host %s, disk %s; %d groups streamed, %d staging slots\n",
               util_fmt_bytes(e->plan.tier_bytes[TIER_DEVICE], wb, sizeof wb),
               util_fmt_bytes(e->plan.tier_bytes[TIER_HOST], b2, sizeof b2),
               util_fmt_bytes(e->plan.tier_bytes[TIER_DISK], b3, sizeof b3), e->plan.n_streamed,
               e->plan.n_stage_slots);
        printf("memory bandwidth memcpy %.2f GB/s (bytes copied), read %.2f GB/s\n", copy_gbs, read_gbs);
        if (raw_bytes)
            printf("raw O_DIRECT     %.3f GB/s reading the %s of blobs in order (same fs, aio depth 16, 2 files in flight)\n", raw_gbs,
                   util_fmt_bytes(raw_bytes, wb, sizeof wb));
        printf("copy peak        %.2f GB/s host -> %s (copy_async from %s memory, 256 MiB)\n", copy_peak_gbs,
               e->be->ops->unified ? "slot (memcpy)" : "device", copy_pinned ? "pinned" : "pageable");
        printf("prefill          %d tokens in %.3f s: %.1f tokens/s\n", plen, prefill_s, plen / prefill_s);
        printf("decode batch %-3d step %.2f ms (median of %d): %.2f tokens/s\n", B, step_s * 1e3, steps, B / step_s);
        printf("per step (mean)  wall %.2f ms, compute %.2f ms, fetch %.2f ms, stall %.2f ms\n", mean.wall * 1e3,
               mean.compute * 1e3, mean.fetch * 1e3, mean.stall * 1e3);
        if (mean.bytes[TIER_DISK] || mean.bytes[TIER_HOST])
            printf("streamed         disk %s/step = %.3f GB/s; host %s/step = %.3f GB/s\n",
                   util_fmt_bytes(mean.bytes[TIER_DISK], wb, sizeof wb), disk_gbs,
                   util_fmt_bytes(mean.bytes[TIER_HOST], b2, sizeof b2), host_gbs);
        if (copy_peak_gbs > 0 && mean.bytes[TIER_HOST])
            printf("copy efficiency  host tier at %.0f%% of the copy peak\n", 100 * host_gbs / copy_peak_gbs);
        if (raw_gbs > 0 && mean.bytes[TIER_DISK])
            printf("disk efficiency  %.0f%% of the raw O_DIRECT rate; step / max(fetch, compute) = %.3f\n",
                   100 * disk_gbs / raw_gbs, mean.wall / (mean.fetch > mean.compute ? mean.fetch : mean.compute));
        printf("huge pages       %s of anonymous memory\n", util_fmt_bytes(huge_page_bytes(), wb, sizeof wb));
        printf("decode roofline  %s of weights per step: %.2f GB/s = %.0f%% of %.2f GB/s\n",
               util_fmt_bytes(wbytes, wb, sizeof wb), weight_gbs, 100 * weight_gbs / bw, bw);
        printf("peak RSS         %s\n", util_fmt_bytes(rss, wb, sizeof wb));
    }
    goto out;
fail:
    rc = cli_fail(st);
out:
    free(tokens);
    free(pos);
    free(logits);
    free(seqs);
    free(rec);
    free(walls);
    engine_close(e);
    return rc;
}
