/*
 * cpu_matmul.c - y = x W^T (+ b) for F32/F16/BF16 weights, f32 accumulation,
 * parallel over blocks of output rows.
 *
 * Decode (up to DENSE_DIRECT_MAX token rows) is bound by the bytes of W:
 * each block of weight rows is streamed from memory once, widened in
 * registers and applied to every token row (in chunks of up to 4, the block
 * staying in L1 between chunks), with software prefetch ahead of each row
 * stream. Prefill and batched decode (more rows) are bound by arithmetic:
 * mm_kern.h's cache-blocked GEMM widens panels of weight rows to f32 in
 * per-worker scratch and runs register tiles of 4 weight rows x 3 (AVX2) or
 * 6 (AVX-512) token rows over L1-sized column blocks. int8/int4 weights go
 * the same way (mm_kern.h, Q_DIRECT_MAX rows direct, codes widened for the
 * GEMM, scales a group at a time) where their groups are whole vector
 * steps, else through cpu_qmatmul.c; a GGUF's blocks through cpu_gguf.c,
 * and the --cpu-activations modes through cpu_act_int8.c and
 * cpu_matmul_bf16.c. Every output is computed by the
 * same operations in the same order whatever the number of token rows and
 * their blocking, so a row's result does not depend on the others of its
 * step (batch invariance: test_ops checks it bit for bit).
 */
#include <string.h>

#include "cpu.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include "simd_sum.h"
#define HAVE_AVX2 1
#endif


#ifdef HAVE_AVX2
static inline __attribute__((always_inline)) __m256 dk_loadw(ferry_dtype dt, const void *base, size_t i)
{
    switch (dt) {
    case DT_BF16:
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i))), 16));
    case DT_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)));
    default:
        return _mm256_loadu_ps((const float *)base + i);
    }
}

/* 8 int8 codes as f32 */
static inline __attribute__((always_inline)) __m256 dk_q8(const uint8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* 8 bytes' low nibbles (a 16-column chunk's even columns) and high ones
 * (its odd), less 8 */
static inline __attribute__((always_inline)) void dk_q4(const uint8_t *p, __m256 *lo, __m256 *hi)
{
    __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)), eight = _mm256_set1_epi32(8);
    *lo = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(b, _mm256_set1_epi32(15)), eight));
    *hi = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(b, 4), eight));
}

/* the even and odd columns of p[0 .. 15]: shuffle_ps leaves [a0 a2 b0 b2 |
 * a4 a6 b4 b6], the 64-bit permute puts the pairs in column order */
static inline __attribute__((always_inline)) void dk_split(const float *p, __m256 *e, __m256 *o)
{
    __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
    *e = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xd8));
    *o = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xdd)), 0xd8));
}

#define DK_VEC __m256
#define DK_W 8
#define DK_NT 3 /* 4 x 3 accumulators of the 16 registers */
#define DK_QNR 2 /* int8/int4 tiles: 2 x 2 accumulators and totals */
#define DK_QNT 2
#define DK_ZERO() _mm256_setzero_ps()
#define DK_LOADF(p) _mm256_loadu_ps(p)
#define DK_STOREF(p, v) _mm256_storeu_ps(p, v)
#define DK_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define DK_SET1(f) _mm256_set1_ps(f)
#define DK_HSUM(v) hsum8(v)
#include "mm_kern.h"

const cpu_mm_kernels cpu_mm_avx2 = MM_KERNELS;

#endif /* HAVE_AVX2 */

void cpu_row_to_f32(float *dst, const weight *w, int64_t row, int64_t col0, int64_t n)
{
    size_t base = (size_t)row * (size_t)w->cols + (size_t)col0;
    int64_t i = 0;
    if (w->quant == WQ_GGUF) {
        cpu_gguf_row_to_f32(dst, w, row, col0, n);
        return;
    }
    if (w->quant != WQ_NONE) {
        cpu_qrow_to_f32(dst, w, row, col0, n);
        return;
    }
    switch (w->dtype) {
    case DT_F32:
        memcpy(dst, (const float *)w->data + base, (size_t)n * sizeof(float));
        return;
    case DT_BF16: {
        const uint16_t *s = (const uint16_t *)w->data + base;
#ifdef HAVE_AVX2
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, dk_loadw(DT_BF16, s, (size_t)i));
#endif
        for (; i < n; i++) dst[i] = bf16_to_f32(s[i]);
        return;
    }
    case DT_F16: {
        const uint16_t *s = (const uint16_t *)w->data + base;
#ifdef HAVE_AVX2
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, dk_loadw(DT_F16, s, (size_t)i));
#endif
        for (; i < n; i++) dst[i] = f16_to_f32(s[i]);
        return;
    }
    default: FERRY_ASSERT(!"weight dtype not computable");
    }
}

typedef struct {
    float *out;
    const float *x;
    const weight *w;
    const weight *bias;
    int n;
    int64_t rows_per_task;
    cpu_backend *cb;
    const int8_t *xq; /* x quantized (int8 activations and a GGUF's chunked blocks), else NULL */
    const float *xd;
    const uint16_t *xb; /* x rounded to bf16 (bf16 activations and BF16 weights), else NULL */
#ifdef HAVE_AVX2
    const cpu_mm_kernels *k; /* the exact-mode kernels of the backend's instruction set */
    bool q_own;              /* an int8/int4 weight they take (else cpu_qmatmul.c's) */
    const float *split;      /* its split x (int4), else NULL */
#endif
} mm_ctx;

#ifndef HAVE_AVX2
/* Portable fallback: widen one row, dot it with every token row. */
static void rows_portable(const weight *w, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo,
                          float *row)
{
    size_t cols = (size_t)w->cols;
    for (size_t r = r0; r < r1; r++) {
        cpu_row_to_f32(row, w, (int64_t)r, 0, (int64_t)cols);
        for (int t = 0; t < n; t++) {
            float s = 0;
            for (size_t k = 0; k < cols; k++) s += row[k] * x[(size_t)t * cols + k];
            out[(size_t)t * ldo + r] = s;
        }
    }
}
#endif

#ifdef HAVE_AVX2
/* One task's share of the token rows of an int4 call's split x. */
static void split_task(void *vctx, int task, int worker)
{
    mm_ctx *c = vctx;
    int threads = pool_size(c->cb->pool), tasks = c->n < threads * 4 ? c->n : threads * 4;
    size_t t0 = (size_t)c->n * (size_t)task / (size_t)tasks, t1 = (size_t)c->n * (size_t)(task + 1) / (size_t)tasks;
    (void)worker;
    c->k->q_split(c->w, c->x, c->n, t0, t1, (float *)c->split);
}
#endif

static void mm_task(void *vctx, int task, int worker)
{
    mm_ctx *c = vctx;
    const weight *w = c->w;
    size_t rows = (size_t)w->rows, cols = (size_t)w->cols;
    size_t r0 = (size_t)task * (size_t)c->rows_per_task;
    size_t r1 = r0 + (size_t)c->rows_per_task;
    if (r1 > rows) r1 = rows;
    if (r0 >= r1) return;
    size_t ldo = rows;
    if (c->xb) { /* --cpu-activations bf16 */
        float *scratch = cpu_scratch_get(c->cb, worker, cpu_bf16_scratch());
        FERRY_ASSERT(scratch);
        cpu_bf16_rows(w, r0, r1, c->xb, c->n, c->out, ldo, scratch);
        goto bias;
    }
    if (c->xq) { /* --cpu-activations int8 */
        if (w->quant == WQ_GGUF)
            cpu_gguf_rows_int8(w, r0, r1, c->xq, c->xd, c->n, c->out, ldo);
        else
            cpu_q_rows_int8(w, r0, r1, c->xq, c->n, c->out, ldo);
        goto bias;
    }
    if (w->quant == WQ_GGUF) { /* every build: cpu_gguf.c has its portable path */
        float *scratch = cpu_scratch_get(c->cb, worker, cpu_gguf_scratch(w));
        FERRY_ASSERT(scratch);
        cpu_gguf_rows(w, r0, r1, c->x, c->n, c->out, ldo, scratch, c->cb->isa);
        goto bias;
    }
#ifdef HAVE_AVX2
    if (w->quant != WQ_NONE && !c->q_own) {
        /* layouts mm_kern.h does not take (groups off its steps): decode
         * and prefill alike through cpu_qmatmul.c's kernels, DIRECT_MAX_TOKENS
         * token rows at a time */
        int chunk = c->n < DIRECT_MAX_TOKENS ? c->n : DIRECT_MAX_TOKENS;
        size_t need = cpu_qmatmul_scratch(w, chunk);
        float *xs = need ? cpu_scratch_get(c->cb, worker, need) : NULL;
        FERRY_ASSERT(!need || xs);
        for (int t = 0; t < c->n; t += chunk) {
            int nt = c->n - t < chunk ? c->n - t : chunk;
            cpu_qmatmul_direct(w, r0, r1, c->x + (size_t)t * cols, nt, c->out + (size_t)t * ldo, ldo, xs);
        }
    } else {
        float *scratch = cpu_scratch_get(c->cb, worker, MM_PREFILL_SCRATCH);
        FERRY_ASSERT(scratch);
        if (w->quant != WQ_NONE)
            c->k->q_rows(w, r0, r1, c->x, c->split, c->n, c->out, ldo, scratch);
        else
            c->k->dense_rows(w, r0, r1, c->x, c->n, c->out, ldo, scratch);
    }
#else
    float *row = cpu_scratch_get(c->cb, worker, cols);
    FERRY_ASSERT(row);
    rows_portable(w, r0, r1, c->x, c->n, c->out, ldo, row);
#endif
bias:
    if (c->bias && c->bias->data) {
        for (size_t r = r0; r < r1; r++) {
            float b;
            cpu_row_to_f32(&b, c->bias, 0, (int64_t)r, 1);
            for (int t = 0; t < c->n; t++) c->out[(size_t)t * ldo + r] += b;
        }
    }
}

void cpu_matmul(backend *be, float *out, const float *x, const weight *w, const weight *bias, int n)
{
    cpu_backend *cb = (cpu_backend *)be;
    FERRY_ASSERT(w->quant == WQ_NONE   ? dtype_is_compute(w->dtype)
                 : w->quant == WQ_GGUF ? cpu_gguf_valid(w)
                                       : cpu_qweight_valid(w));
    FERRY_ASSERT(!bias || !bias->data || bias->quant == WQ_NONE);
    int threads = pool_size(cb->pool);
    int64_t per = (w->rows + threads * 4 - 1) / (threads * 4);
    per = (per + 3) & ~(int64_t)3;
    if (per < 4) per = 4;
    mm_ctx c = {.out = out, .x = x, .w = w, .bias = bias, .n = n, .rows_per_task = per, .cb = cb};
    if (cb->act == CPU_ACT_BF16 && w->quant == WQ_NONE && w->dtype == DT_BF16) { /* rounded once, for every task */
        size_t nb = (size_t)n * (size_t)w->cols;
        if (nb > cb->xb_cap) {
            uint16_t *b = realloc(cb->xb, nb * sizeof *b);
            FERRY_ASSERT(b); /* a step's activations: half the bytes of its f32 input */
            cb->xb = b, cb->xb_cap = nb;
        }
        cpu_bf16_round_x(x, n, (size_t)w->cols, cb->xb);
        c.xb = cb->xb;
    }
    if (cb->act == CPU_ACT_INT8 && cpu_gguf_int8_takes(w)) { /* the activations quantized once, for every task */
        bool gguf = w->quant == WQ_GGUF;
        size_t nq = gguf ? (size_t)n * (size_t)w->cols : cpu_q_prep_bytes(w, n);
        size_t nd = gguf ? 2 * ((size_t)n * (size_t)w->cols / 32) : 0; /* scales, then d sum(q) (cpu.h) */
        if (nq > cb->xq_cap) {
            int8_t *q = realloc(cb->xq, nq);
            FERRY_ASSERT(q); /* a step's activations: bytes of the order of its f32 input */
            cb->xq = q, cb->xq_cap = nq;
        }
        if (nd > cb->xd_cap) {
            float *d = realloc(cb->xd, nd * sizeof *d);
            FERRY_ASSERT(d);
            cb->xd = d, cb->xd_cap = nd;
        }
        if (gguf)
            cpu_gguf_quantize_x(x, n, (size_t)w->cols, cb->xq, cb->xd);
        else
            cpu_q_prep_x(w, x, n, cb->xq);
        c.xq = cb->xq, c.xd = cb->xd;
    }
#ifdef HAVE_AVX2
    c.k = cb->isa == CPU_ISA_AVX512 ? &cpu_mm_avx512 : &cpu_mm_avx2;
    c.q_own = w->quant != WQ_NONE && w->quant != WQ_GGUF && c.k->q_takes(w);
    size_t ns = c.q_own && !c.xq ? c.k->q_split_floats(w, n) : 0;
    if (ns) { /* int4's x split once for every task, token rows in parallel */
        if (ns > cb->xs_cap) {
            float *p = realloc(cb->xs, ns * sizeof *p);
            FERRY_ASSERT(p); /* a step's activations: about the bytes of its f32 input */
            cb->xs = p, cb->xs_cap = ns;
        }
        c.split = cb->xs;
        pool_run(cb->pool, n < threads * 4 ? n : threads * 4, split_task, &c);
    }
#endif
    pool_run(cb->pool, (int)((w->rows + per - 1) / per), mm_task, &c);
}
