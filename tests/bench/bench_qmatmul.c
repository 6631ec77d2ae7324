/*
 * bench_qmatmul.c - weight bytes per second of the CPU backend's matmul for
 * f32, f16, bf16, int8 (per-row scales) and int4 (group 128, bf16 scales)
 * weights, at decode token counts (n = 1, 16) and prefill (n = 64 and 256,
 * as GFLOP/s), against
 * the memory bandwidth measured in the same run (a parallel AVX2 read and a
 * parallel memcpy over the same workers). Not part of `make test`.
 *
 * Each case cycles through enough copies of the weight that they exceed the
 * last-level cache (BENCH_WORKING_SET), as a decode step does: every layer's
 * weights come from memory, once. Bytes counted are weight_bytes (data and
 * scales).
 *
 * Build and run (after `make`), from the repository root:
 *   gcc -std=gnu11 -O2 -march=x86-64-v3 -pthread -o build/bench_qmatmul tests/bench/bench_qmatmul.c \
 *       $(find build/obj/engine build/obj/config -name '*.o') -lmicrohttpd -luring -lm -ldl
 *   build/bench_qmatmul [threads [isa [activations]]]
 * (isa: auto, avx2, avx512; activations: exact, int8, bf16 - as --cpu-isa
 * and --cpu-activations); BENCH_KINDS=bf16,int8 (say) runs the weights
 * whose names contain one of those only.
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../engine/backend.h"
#include "../../engine/cpu/pool.h"

#define BENCH_WORKING_SET ((size_t)512 << 20) /* bytes of weights cycled through: >> L3 */
#define BENCH_SECONDS 1.0                     /* per case, at least */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_rng >> 32);
}

/* ---- memory bandwidth: the same workers, the same buffer size ---------------- */

typedef struct {
    const uint8_t *src;
    uint8_t *dst;
    size_t per; /* bytes per task */
    double sink[64];
} bw_ctx;

static void read_task(void *vc, int task, int worker)
{
    bw_ctx *c = vc;
    const __m256i *p = (const __m256i *)(c->src + (size_t)task * c->per);
    __m256i a = _mm256_setzero_si256(), b = a, d = a, e = a;
    for (size_t i = 0; i < c->per / 32; i += 4) {
        a = _mm256_xor_si256(a, _mm256_load_si256(p + i));
        b = _mm256_xor_si256(b, _mm256_load_si256(p + i + 1));
        d = _mm256_xor_si256(d, _mm256_load_si256(p + i + 2));
        e = _mm256_xor_si256(e, _mm256_load_si256(p + i + 3));
    }
    a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(d, e));
    c->sink[worker] += (double)_mm256_extract_epi32(a, 0);
}

static void copy_task(void *vc, int task, int worker)
{
    bw_ctx *c = vc;
    (void)worker;
    memcpy(c->dst + (size_t)task * c->per, c->src + (size_t)task * c->per, c->per);
}

/* bytes/s of fn over `bytes` (copy counts the bytes read, as the other figures do) */
static double bandwidth(pool *p, pool_fn fn, size_t bytes)
{
    bw_ctx c = {.per = bytes / 64};
    uint8_t *src = aligned_alloc(64, bytes), *dst = aligned_alloc(64, bytes);
    memset(src, 1, bytes);
    memset(dst, 2, bytes);
    c.src = src;
    c.dst = dst;
    pool_run(p, 64, fn, &c);
    int iters = 0;
    double t0 = now(), t;
    do {
        pool_run(p, 64, fn, &c);
        iters++;
    } while ((t = now() - t0) < BENCH_SECONDS);
    free(src);
    free(dst);
    return (double)bytes * iters / t;
}

/* ---- weights ------------------------------------------------------------------ */

typedef enum { K_F32, K_F16, K_BF16, K_INT8, K_INT4 } kind;
static const char *const kind_name[] = {"f32", "f16", "bf16", "int8", "int4 g128"};

static weight make(kind k, int64_t rows, int64_t cols)
{
    weight w = {.rows = rows, .cols = cols};
    if (k <= K_BF16) {
        w.dtype = k == K_F32 ? DT_F32 : k == K_F16 ? DT_F16 : DT_BF16;
    } else {
        w.quant = k == K_INT8 ? WQ_INT8 : WQ_INT4;
        w.dtype = k == K_INT8 ? DT_I8 : DT_I32;
        w.group = k == K_INT8 ? (int)cols : 128;
        w.scale_dtype = DT_BF16;
    }
    size_t data_bytes = (size_t)rows * weight_row_bytes(&w);
    uint8_t *data = aligned_alloc(64, (data_bytes + 63) & ~(size_t)63);
    if (k <= K_BF16) {
        for (size_t i = 0; i < (size_t)(rows * cols); i++) {
            float v = (float)(int)(rnd() % 255 - 127) / 4096;
            if (k == K_F32) ((float *)data)[i] = v;
            else ((uint16_t *)data)[i] = k == K_F16 ? f32_to_f16(v) : f32_to_bf16(v);
        }
    } else {
        for (size_t i = 0; i < data_bytes; i++) data[i] = (uint8_t)rnd();
        size_t n_scales = (size_t)(rows * weight_groups(&w));
        uint16_t *s = malloc(n_scales * 2);
        for (size_t i = 0; i < n_scales; i++) s[i] = f32_to_bf16(0.01f);
        w.scales = s;
    }
    w.data = data;
    return w;
}

static void release(weight *w)
{
    free((void *)w->data);
    free((void *)w->scales);
}

/* seconds per matmul, cycling through copies of the weight */
static double time_matmul(backend *be, weight *ws, int copies, int n, float *x, float *out)
{
    be->ops->matmul(be, out, x, &ws[0], NULL, n);
    int iters = 0;
    double t0 = now(), t;
    do {
        be->ops->matmul(be, out, x, &ws[iters % copies], NULL, n);
        iters++;
    } while ((t = now() - t0) < BENCH_SECONDS || iters < copies);
    return t / iters;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    backend *be;
    backend_opts bo = {threads, argc > 2 ? argv[2] : NULL, argc > 3 ? argv[3] : NULL};
    if (cpu_backend_create(&bo, &be) != FERRY_OK) return 1;
    pool *p = pool_create(threads);
    printf("threads: %d; weights cycled through: %zu MiB\n", pool_size(p), BENCH_WORKING_SET >> 20);
    double rd = bandwidth(p, read_task, BENCH_WORKING_SET), cp = bandwidth(p, copy_task, BENCH_WORKING_SET);
    printf("memory: read %.1f GB/s, memcpy %.1f GB/s (bytes read)\n\n", rd / 1e9, cp / 1e9);

    static const int64_t shapes[][2] = {{4096, 4096}, {11008, 4096}};
    static const int ns[] = {1, 16};
    /* n = 16 is reported in both units: 32 flops per weight element there
     * make it compute-bound on few cores, whatever the weight's bytes */
    printf("%-11s %-9s %6s %9s %6s %10s %12s %12s %13s\n", "shape", "weight", "MiB", "n=1 GB/s", "%read", "n=16 GB/s",
           "n=16 GFLOP/s", "n=64 GFLOP/s", "n=256 GFLOP/s");
    for (size_t s = 0; s < 2; s++)
        for (int k = K_F32; k <= K_INT4; k++) {
            if (getenv("BENCH_KINDS") && !strstr(getenv("BENCH_KINDS"), kind_name[k])) continue;
            int64_t rows = shapes[s][0], cols = shapes[s][1];
            weight probe = make((kind)k, rows, cols);
            size_t bytes = weight_bytes(&probe);
            int copies = (int)((BENCH_WORKING_SET + bytes - 1) / bytes);
            weight *ws = malloc((size_t)copies * sizeof *ws);
            ws[0] = probe;
            for (int c = 1; c < copies; c++) ws[c] = make((kind)k, rows, cols);
            float *x = malloc((size_t)256 * (size_t)cols * sizeof *x);
            float *out = malloc((size_t)256 * (size_t)rows * sizeof *out);
            for (size_t i = 0; i < (size_t)256 * (size_t)cols; i++) x[i] = (float)(int)(rnd() % 2001 - 1000) / 1000;
            double bw[2];
            for (int i = 0; i < 2; i++) bw[i] = (double)bytes / time_matmul(be, ws, copies, ns[i], x, out);
            double gflops = 2.0 * (double)rows * (double)cols * 64 / time_matmul(be, ws, copies, 64, x, out) / 1e9;
            double gflops256 = 2.0 * (double)rows * (double)cols * 256 / time_matmul(be, ws, copies, 256, x, out) / 1e9;
            char shape[32];
            snprintf(shape, sizeof shape, "%lldx%lld", (long long)rows, (long long)cols);
            double flop16 = 2.0 * (double)rows * (double)cols * 16 * bw[1] / (double)bytes / 1e9;
            printf("%-11s %-9s %6.1f %9.1f %5.0f%% %10.1f %12.1f %12.1f %13.1f\n", shape, kind_name[k],
                   (double)bytes / (1 << 20), bw[0] / 1e9, 100 * bw[0] / rd, bw[1] / 1e9, flop16, gflops, gflops256);
            for (int c = 0; c < copies; c++) release(&ws[c]);
            free(ws);
            free(x);
            free(out);
        }
    pool_free(p);
    backend_free(be);
    return 0;
}
