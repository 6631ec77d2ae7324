/*
 * cpu_matmul_bf16.c - BF16 weights against activations rounded to bf16
 * (--cpu-activations bf16, what transformers computes for a bf16
 * checkpoint and llama.cpp's BF16 path): AVX-512 BF16 dot products, 32
 * products an instruction, the weights as stored (no widening). Built with
 * AVX-512 F/BW/VL/DQ + BF16; called only where the processor has them
 * (cpu_isa.c).
 *
 * The activations are rounded to bf16 once per matmul, row by row (nearest
 * even: cpu_bf16_round_x); each output is one 16-lane accumulator over k in
 * steps of 32 (the last step's missing columns read as zeros), lanes summed
 * in a fixed order - the same whatever the tile, so a row's result does
 * not depend on the rest of its step (batch invariance). Products of two
 * bf16 values are exact in f32; the error is the activations' rounding,
 * at most 2^-9 of each |x| (test_ops holds every output to it).
 */
#include "cpu.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    defined(__AVX512BF16__)
#include <immintrin.h>

#include "simd_sum.h"

#define X_BLOCK_BYTES (512u << 10) /* prefill: the token rows of a cache block fill about this much (in L2) */
#define PREFETCH_BYTES 1024 /* decode: how far ahead of each weight row to prefetch */

/* Row by row, so that a row's bf16 values do not depend on the others
 * (the vector conversion treats subnormals as zero, the scalar tail not). */
void cpu_bf16_round_x(const float *x, int n, size_t cols, uint16_t *xb)
{
    for (int t = 0; t < n; t++) {
        const float *xr = x + (size_t)t * cols;
        uint16_t *br = xb + (size_t)t * cols;
        size_t i = 0;
        for (; i + 32 <= cols; i += 32)
            _mm512_storeu_si512((void *)(br + i),
                                (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(xr + i + 16), _mm512_loadu_ps(xr + i)));
        for (; i < cols; i++) br[i] = f32_to_bf16(xr[i]);
    }
}

/* out[t * ldo + r0 + i] for i < NR, t < NT: W rows (bf16) against x rows
 * (bf16, ldx apart). */
static inline __attribute__((always_inline)) void kern(int NR, int NT, bool pf, const uint16_t *w, size_t cols,
                                                       size_t r0, const uint16_t *x, size_t ldx, float *out,
                                                       size_t ldo)
{
    __m512 acc[4][6];
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 6
        for (int t = 0; t < NT; t++) acc[i][t] = _mm512_setzero_ps();
    size_t k = 0;
#define STEP(LOAD)                                                                                      \
    do {                                                                                                \
        __m512bh xv[6];                                                                                 \
        _Pragma("GCC unroll 6") for (int t = 0; t < NT; t++) xv[t] = (__m512bh)LOAD(x + t * ldx + k);   \
        _Pragma("GCC unroll 4") for (int i = 0; i < NR; i++) {                                          \
            __m512bh wv = (__m512bh)LOAD(w + (r0 + i) * cols + k);                                      \
            _Pragma("GCC unroll 6") for (int t = 0; t < NT; t++) acc[i][t] = _mm512_dpbf16_ps(acc[i][t], wv, xv[t]); \
        }                                                                                               \
    } while (0)
#define FULL(p) _mm512_loadu_si512((const void *)(p))
#define PART(p) _mm512_maskz_loadu_epi16(tail, (p))
    for (; k + 32 <= cols; k += 32) {
        if (pf)
#pragma GCC unroll 4
            for (int i = 0; i < NR; i++)
                _mm_prefetch((const char *)(w + (r0 + i) * cols + k) + PREFETCH_BYTES, _MM_HINT_T0);
        STEP(FULL);
    }
    if (k < cols) {
        __mmask32 tail = (__mmask32)((1ull << (cols - k)) - 1);
        STEP(PART);
    }
#undef FULL
#undef PART
#undef STEP
    for (int i = 0; i < NR; i++)
        for (int t = 0; t < NT; t++) out[t * ldo + r0 + i] = hsum16(acc[i][t]);
}

/* Rows [r0, r1) of a BF16 weight for n token rows of bf16 activations xb. */
void cpu_bf16_rows(const weight *w, size_t r0, size_t r1, const uint16_t *xb, int n, float *out, size_t ldo)
{
    const uint16_t *wd = w->data;
    size_t cols = (size_t)w->cols;
    if (n <= 2) { /* decode: the rows stream from memory once */
        size_t r = r0;
        for (; r + 4 <= r1; r += 4) {
            if (n == 1)
                kern(4, 1, true, wd, cols, r, xb, cols, out, ldo);
            else
                kern(4, 2, true, wd, cols, r, xb, cols, out, ldo);
        }
        for (; r < r1; r++) {
            if (n == 1)
                kern(1, 1, false, wd, cols, r, xb, cols, out, ldo);
            else
                kern(1, 2, false, wd, cols, r, xb, cols, out, ldo);
        }
        return;
    }
    size_t block = X_BLOCK_BYTES / (cols * 2) / 6 * 6; /* token rows a block: each pass over W serves them all */
    if (block < 6) block = 6;
    for (size_t t0 = 0; t0 < (size_t)n; t0 += block) { /* tiles of 4 rows x 6 token rows */
        size_t t1 = t0 + block < (size_t)n ? t0 + block : (size_t)n;
        for (size_t r = r0; r < r1; r += 4) {
            int nr = r + 4 <= r1 ? 4 : (int)(r1 - r);
            size_t t = t0;
            if (nr == 4)
                for (; t + 6 <= t1; t += 6) kern(4, 6, false, wd, cols, r, xb + t * cols, cols, out + t * ldo, ldo);
            for (; t < t1; t++)
                for (int i = 0; i < nr; i++)
                    kern(1, 1, false, wd, cols, r + (size_t)i, xb + t * cols, cols, out + t * ldo, ldo);
        }
    }
}

bool cpu_bf16_built(void) { return true; }

#else /* built without AVX-512 BF16: never offered */

bool cpu_bf16_built(void) { return false; }

void cpu_bf16_round_x(const float *x, int n, size_t cols, uint16_t *xb)
{
    (void)x, (void)n, (void)cols, (void)xb;
    FERRY_ASSERT(!"cpu_bf16_round_x: not built with AVX-512 BF16");
}

void cpu_bf16_rows(const weight *w, size_t r0, size_t r1, const uint16_t *xb, int n, float *out, size_t ldo)
{
    (void)w, (void)r0, (void)r1, (void)xb, (void)n, (void)out, (void)ldo;
    FERRY_ASSERT(!"cpu_bf16_rows: not built with AVX-512 BF16");
}
#endif
