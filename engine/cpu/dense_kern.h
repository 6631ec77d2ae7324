/*
 * dense_kern.h - cpu_matmul.c's F32/F16/BF16 kernels, written once for a
 * vector width: included by cpu_matmul.c (AVX2, 8 lanes) and
 * cpu_matmul_avx512.c (16 lanes), each defining first DK_VEC, DK_W (its
 * lanes), DK_ZERO(), DK_LOADF(p), DK_FMA(a, b, c), DK_HSUM(v) (lanes
 * summed in a fixed order), dk_loadw(dt, base, i) (DK_W weights widened to
 * f32) and DK_NT (the prefill tile's token rows, a divisor of TOKEN_BLOCK).
 *
 * Every output is one DK_W-lane accumulator over k in steps of DK_W, its
 * lanes summed by DK_HSUM, the rest of the row added one by one - the same
 * in decode (weights widened as they stream) and prefill (widened into
 * scratch first), whatever the tile, so a row's result does not depend on
 * the rest of its step. See cpu_matmul.c for the plan of the kernels.
 */
#ifndef FERRY_DENSE_KERN_H
#define FERRY_DENSE_KERN_H

#define DIRECT_MAX_TOKENS 16 /* up to this many rows: widen weights on the fly */
#define TOKEN_BLOCK 48       /* prefill: token rows per cache block (a multiple of DK_NT) */
#define PREFETCH_BYTES 1024  /* how far ahead of each weight row stream to prefetch */

static inline __attribute__((always_inline)) float load1(ferry_dtype dt, const void *base, size_t i)
{
    switch (dt) {
    case DT_BF16: return bf16_to_f32(((const uint16_t *)base)[i]);
    case DT_F16: return f16_to_f32(((const uint16_t *)base)[i]);
    default: return ((const float *)base)[i];
    }
}

/* out[t * ldo + r0 + i] = sum_k W[r0 + i, k] * x[t * ldx + k] for i < NR,
 * t < NT. With `pf`, prefetches each row PREFETCH_BYTES ahead. */
static inline __attribute__((always_inline)) void kern(ferry_dtype dt, int NR, int NT, bool pf, const void *w,
                                                       size_t cols, size_t r0, const float *x, size_t ldx,
                                                       float *out, size_t ldo)
{
    DK_VEC acc[4][DK_NT > 4 ? DK_NT : 4];
    const size_t esz = dt == DT_F32 ? 4 : 2;
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) acc[i][t] = DK_ZERO();
    size_t k = 0;
#define KERN_STEP(kk)                                                                                 \
    do {                                                                                              \
        DK_VEC xv[DK_NT > 4 ? DK_NT : 4];                                                             \
        _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) xv[t] = DK_LOADF(x + t * ldx + (kk));    \
        _Pragma("GCC unroll 4") for (int i = 0; i < NR; i++) {                                        \
            DK_VEC wv = dk_loadw(dt, w, (r0 + i) * cols + (kk));                                      \
            _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)                                      \
                acc[i][t] = DK_FMA(wv, xv[t], acc[i][t]);                                             \
        }                                                                                             \
    } while (0)
    if (pf) {
        const size_t step = 64 / esz; /* elements per cache line */
        for (; k + step <= cols; k += step) {
#pragma GCC unroll 4
            for (int i = 0; i < NR; i++)
                _mm_prefetch((const char *)w + ((r0 + i) * cols + k) * esz + PREFETCH_BYTES, _MM_HINT_T0);
#pragma GCC unroll 4
            for (size_t j = 0; j < step; j += DK_W) KERN_STEP(k + j);
        }
    }
    for (; k + DK_W <= cols; k += DK_W) KERN_STEP(k);
#undef KERN_STEP
    for (int i = 0; i < NR; i++) {
        for (int t = 0; t < NT; t++) {
            float s = DK_HSUM(acc[i][t]);
            for (size_t kk = k; kk < cols; kk++) s += load1(dt, w, (r0 + i) * cols + kk) * x[t * ldx + kk];
            out[t * ldo + r0 + i] = s;
        }
    }
}

/* Decode: rows [r0, r1) for n <= DIRECT_MAX_TOKENS token rows. The first
 * token chunk streams the rows from memory (with prefetch); later chunks
 * find them in L1. */
static inline __attribute__((always_inline)) void rows_direct(ferry_dtype dt, const void *w, size_t cols, size_t r0,
                                                              size_t r1, const float *x, int n, float *out, size_t ldo)
{
    if (n <= 2) {
        size_t r = r0;
        if (n == 1) {
            for (; r + 4 <= r1; r += 4) kern(dt, 4, 1, false, w, cols, r, x, cols, out, ldo);
            for (; r < r1; r++) kern(dt, 1, 1, false, w, cols, r, x, cols, out, ldo);
        } else {
            for (; r + 4 <= r1; r += 4) kern(dt, 4, 2, true, w, cols, r, x, cols, out, ldo);
            for (; r < r1; r++) kern(dt, 1, 2, false, w, cols, r, x, cols, out, ldo);
        }
        return;
    }
    for (size_t r = r0; r < r1; r += 2) {
        int nr = r + 2 <= r1 ? 2 : 1;
        for (int t = 0; t < n; t += 4) {
            const float *xt = x + (size_t)t * cols;
            float *ot = out + (size_t)t * ldo;
            bool first = t == 0;
            switch ((n - t < 4 ? n - t : 4) * 2 + nr - 1) {
            case 2: kern(dt, 1, 1, false, w, cols, r, xt, cols, ot, ldo); break;
            case 3: if (first) kern(dt, 2, 1, true, w, cols, r, xt, cols, ot, ldo); else kern(dt, 2, 1, false, w, cols, r, xt, cols, ot, ldo); break;
            case 4: kern(dt, 1, 2, false, w, cols, r, xt, cols, ot, ldo); break;
            case 5: if (first) kern(dt, 2, 2, true, w, cols, r, xt, cols, ot, ldo); else kern(dt, 2, 2, false, w, cols, r, xt, cols, ot, ldo); break;
            case 6: kern(dt, 1, 3, false, w, cols, r, xt, cols, ot, ldo); break;
            case 7: if (first) kern(dt, 2, 3, true, w, cols, r, xt, cols, ot, ldo); else kern(dt, 2, 3, false, w, cols, r, xt, cols, ot, ldo); break;
            case 8: kern(dt, 1, 4, false, w, cols, r, xt, cols, ot, ldo); break;
            default: if (first) kern(dt, 2, 4, true, w, cols, r, xt, cols, ot, ldo); else kern(dt, 2, 4, false, w, cols, r, xt, cols, ot, ldo); break;
            }
        }
    }
}

static void direct_f32(const void *w, size_t cols, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo)
{
    rows_direct(DT_F32, w, cols, r0, r1, x, n, out, ldo);
}
static void direct_bf16(const void *w, size_t cols, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo)
{
    rows_direct(DT_BF16, w, cols, r0, r1, x, n, out, ldo);
}
static void direct_f16(const void *w, size_t cols, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo)
{
    rows_direct(DT_F16, w, cols, r0, r1, x, n, out, ldo);
}

typedef void (*direct_fn)(const void *, size_t, size_t, size_t, const float *, int, float *, size_t);

static direct_fn direct_for(ferry_dtype dt)
{
    return dt == DT_BF16 ? direct_bf16 : dt == DT_F16 ? direct_f16 : direct_f32;
}

/* Prefill: nr (<= 4) weight rows widened to f32 in wf ([nr, cols]) applied
 * to token rows [t0, t1); writes out[t, r0 .. r0 + nr). */
static void block_f32(const float *wf, int nr, size_t cols, size_t r0, const float *x, size_t t0, size_t t1,
                      float *out, size_t ldo)
{
    size_t t = t0;
    float *o = out + r0;
    if (nr == 4) {
        for (; t + DK_NT <= t1; t += DK_NT)
            kern(DT_F32, 4, DK_NT, false, wf, cols, 0, x + t * cols, cols, o + t * ldo, ldo);
        for (; t < t1; t++) kern(DT_F32, 4, 1, false, wf, cols, 0, x + t * cols, cols, o + t * ldo, ldo);
    } else {
        for (; t < t1; t++)
            for (int i = 0; i < nr; i++) kern(DT_F32, 1, 1, false, wf, cols, (size_t)i, x + t * cols, cols, o + t * ldo, ldo);
    }
}


/* Rows [r0, r1) of a dense weight for n token rows; wf: 4 * cols floats of
 * the worker's scratch (prefill). */
static void dense_rows(const weight *w, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo, float *wf)
{
    size_t cols = (size_t)w->cols;
    if (n <= DIRECT_MAX_TOKENS) {
        direct_for(w->dtype)(w->data, cols, r0, r1, x, n, out, ldo);
        return;
    }
    for (size_t t0 = 0; t0 < (size_t)n; t0 += TOKEN_BLOCK) {
        size_t t1 = t0 + TOKEN_BLOCK < (size_t)n ? t0 + TOKEN_BLOCK : (size_t)n;
        for (size_t r = r0; r < r1; r += 4) {
            int nr = r + 4 <= r1 ? 4 : (int)(r1 - r);
            for (int i = 0; i < nr; i++)
                cpu_row_to_f32(wf + (size_t)i * cols, w, (int64_t)(r + (size_t)i), 0, (int64_t)cols);
            block_f32(wf, nr, cols, r, x, t0, t1, out, ldo);
        }
    }
}

#endif
