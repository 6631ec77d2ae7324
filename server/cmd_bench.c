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
#include <unistd.h>

#include "../engine/engine.h"
#include "../engine/json.h"
#include "../engine/util.h"
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
        for (int i = 0; i < threads; i++) {
            jobs[i] = (bw_job){src + (size_t)i * per, dst + (size_t)i * per, per, mode, 0};
            pthread_create(&th[i], NULL, bw_worker, &jobs[i]);
        }
        for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
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

int cmd_bench(const ferry_config *cfg)
{
    int B = (int)cfg->batch, steps = (int)cfg->steps, plen = (int)cfg->prompt_len;
    if (B < 1 || B > 4096) return cli_error(EXIT_USAGE, "--batch must be in 1..4096");
    if (steps < 1) return cli_error(EXIT_USAGE, "--steps must be >= 1");
    if (plen < 1) return cli_error(EXIT_USAGE, "--prompt-len must be >= 1");
    int threads = cfg->threads > 0 ? (int)cfg->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads > 256) threads = 256;

    char *src = malloc(BW_BYTES), *dst = malloc(BW_BYTES);
    if (!src || !dst) {
        free(src);
        free(dst);
        return cli_error(EXIT_RUNTIME, "out of memory for the bandwidth buffers (2 x 1 GiB)");
    }
    memset(src, 1, BW_BYTES);
    memset(dst, 2, BW_BYTES);
    double copy_gbs = bw_measure(src, dst, 0, threads), read_gbs = bw_measure(src, dst, 1, threads);
    free(src);
    free(dst);

    engine *e;
    engine_opts eo = {cfg->model, cfg->device, (int)cfg->threads, B, plen + steps + 8};
    ferry_status st = engine_open(&eo, &e);
    if (st != FERRY_OK) return cli_fail(st);
    const model_config *c = &e->cfg;
    int ntok = plen > B * 4 ? plen : B * 4;
    int32_t *tokens = malloc((size_t)ntok * sizeof *tokens), *pos = malloc((size_t)ntok * sizeof *pos);
    float *logits = malloc((size_t)B * (size_t)c->vocab * sizeof *logits);
    batch_seq *seqs = calloc((size_t)B, sizeof *seqs);
    double *times = malloc((size_t)steps * sizeof *times);
    int rc = 0;
    if (!tokens || !pos || !logits || !seqs || !times) {
        rc = cli_error(EXIT_RUNTIME, "out of memory");
        goto out;
    }
    for (int i = 0; i < ntok; i++) tokens[i] = (int32_t)((uint32_t)(i * 2654435761u) % (uint32_t)c->vocab);

    /* warm-up: touches every weight page once */
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
    for (int step = 0; step < steps; step++) {
        for (int s = 0; s < B; s++) {
            seqs[s] = (batch_seq){s, 4 + step, 1, s};
            tokens[s] = sample_argmax(logits + (size_t)s * (size_t)c->vocab, c->vocab);
            pos[s] = 4 + step;
        }
        b = (batch){B, B, tokens, pos, seqs};
        t0 = util_now();
        if ((st = engine_step(e, &b, logits)) != FERRY_OK) goto fail;
        times[step] = util_now() - t0;
    }
    qsort(times, (size_t)steps, sizeof *times, cmp_double);
    double step_s = times[steps / 2];
    uint64_t wbytes = decode_weight_bytes(e, B);
    double weight_gbs = (double)wbytes / step_s / 1e9;
    double bw = copy_gbs > read_gbs ? copy_gbs : read_gbs;

    if (cfg->json) {
        printf("{\"model\": \"%s\", \"device\": \"%s\", \"threads\": %d, \"batch\": %d, \"prompt_len\": %d, "
               "\"prefill_tokens_per_s\": %.2f, \"decode_step_ms\": %.3f, \"decode_tokens_per_s\": %.2f, "
               "\"weight_bytes_per_step\": %llu, \"weight_read_gb_per_s\": %.3f, \"memcpy_gb_per_s\": %.3f, "
               "\"read_gb_per_s\": %.3f, \"roofline_fraction\": %.4f, \"huge_page_bytes\": %llu}\n",
               cfg->model, e->be->ops->name, threads, B, plen, plen / prefill_s, step_s * 1e3, B / step_s,
               (unsigned long long)wbytes, weight_gbs, copy_gbs, read_gbs, weight_gbs / bw,
               (unsigned long long)huge_page_bytes());
    } else {
        char wb[32];
        printf("model            %s (%s, %d layers)\n", cfg->model, c->arch_name, c->n_layers);
        printf("device           %s, %d threads\n", e->be->ops->name, threads);
        printf("memory bandwidth memcpy %.2f GB/s (bytes copied), read %.2f GB/s\n", copy_gbs, read_gbs);
        printf("prefill          %d tokens in %.3f s: %.1f tokens/s\n", plen, prefill_s, plen / prefill_s);
        printf("decode batch %-3d step %.2f ms (median of %d): %.2f tokens/s\n", B, step_s * 1e3, steps, B / step_s);
        printf("huge pages       %s of anonymous memory\n", util_fmt_bytes(huge_page_bytes(), wb, sizeof wb));
        printf("decode roofline  %s of weights per step: %.2f GB/s = %.0f%% of %.2f GB/s\n",
               util_fmt_bytes(wbytes, wb, sizeof wb), weight_gbs, 100 * weight_gbs / bw, bw);
    }
    goto out;
fail:
    rc = cli_fail(st);
out:
    free(tokens);
    free(pos);
    free(logits);
    free(seqs);
    free(times);
    engine_close(e);
    return rc;
}
