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
#include <string.h>

#include "cpu.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    defined(__AVX512BF16__)
#include <immintrin.h>

#include "simd_sum.h"

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

/* ---- more token rows: cache-blocked, as mm_kern.h's GEMM ------------------
 * Rows a panel at a time, each panel's columns a block at a time copied
 * into scratch (rows off the 4 KiB stride, zero-padded to whole steps as
 * the decode kernel's masked last step reads them), against tiles of 6
 * token rows copied the same way; 4 x 6 accumulators run over the block
 * and wait in scratch, lane by lane, for the next: each output takes the
 * decode kernel's operations in its order. */

#define BF_BLOCK 1024                         /* bf16 columns per block (2 KiB a row): a multiple of 32 */
#define BF_PANEL 96                           /* weight rows per panel: a multiple of 4 */
#define BF_PASS 96                            /* token rows per pass: a multiple of 6 */
#define BF_LD (BF_BLOCK + 32)                 /* bf16 values from one copied row to the next */
#define BF_DIRECT_MAX 4                       /* up to this many token rows: the decode kernels */

size_t cpu_bf16_scratch(void) /* floats */
{
    return (size_t)BF_PANEL * BF_LD / 2 + (size_t)BF_PANEL * BF_PASS * 16 + 6 * (size_t)BF_LD / 2 + 32;
}

/* buf[i * NT + t] (16 lanes) += W[i, k] x[t, k] for k < len (whole steps):
 * w and x a block's copied rows, BF_LD apart. */
static inline __attribute__((always_inline)) void blk(int NR, int NT, const uint16_t *w, const uint16_t *x,
                                                      size_t len, float *buf)
{
    __m512 acc[4][6];
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 6
        for (int t = 0; t < NT; t++) acc[i][t] = _mm512_loadu_ps(buf + (size_t)(i * NT + t) * 16);
    for (size_t k = 0; k < len; k += 32) {
        __m512bh xv[6];
#pragma GCC unroll 6
        for (int t = 0; t < NT; t++) xv[t] = (__m512bh)_mm512_loadu_si512((const void *)(x + (size_t)t * BF_LD + k));
#pragma GCC unroll 4
        for (int i = 0; i < NR; i++) {
            __m512bh wv = (__m512bh)_mm512_loadu_si512((const void *)(w + (size_t)i * BF_LD + k));
#pragma GCC unroll 6
            for (int t = 0; t < NT; t++) acc[i][t] = _mm512_dpbf16_ps(acc[i][t], wv, xv[t]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 6
        for (int t = 0; t < NT; t++) _mm512_storeu_ps(buf + (size_t)(i * NT + t) * 16, acc[i][t]);
}

static void blk_any(int nr, int nt, const uint16_t *w, const uint16_t *x, size_t len, float *buf)
{
#define BLK_NT(NR)                                     \
    switch (nt) {                                      \
    case 1: blk(NR, 1, w, x, len, buf); return;        \
    case 2: blk(NR, 2, w, x, len, buf); return;        \
    case 3: blk(NR, 3, w, x, len, buf); return;        \
    case 4: blk(NR, 4, w, x, len, buf); return;        \
    case 5: blk(NR, 5, w, x, len, buf); return;        \
    default: blk(NR, 6, w, x, len, buf); return;       \
    }
    switch (nr) {
    case 1: BLK_NT(1)
    case 2: BLK_NT(2)
    case 3: BLK_NT(3)
    default: BLK_NT(4)
    }
#undef BLK_NT
}

/* n bf16 values from src, zero-padded to `to`. */
static inline void copy_pad(uint16_t *dst, const uint16_t *src, size_t n, size_t to)
{
    memcpy(dst, src, n * sizeof *dst);
    memset(dst + n, 0, (to - n) * sizeof *dst);
}

static void bf16_gemm(const weight *w, size_t r0, size_t r1, const uint16_t *xb, int n, float *out, size_t ldo,
                      float *scratch)
{
    const uint16_t *wd = w->data;
    size_t cols = (size_t)w->cols;
    uint16_t *panel = (uint16_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *accs = (float *)(panel + (size_t)BF_PANEL * BF_LD);
    uint16_t *tile = (uint16_t *)(accs + (size_t)BF_PANEL * BF_PASS * 16);
    for (size_t t0 = 0; t0 < (size_t)n; t0 += BF_PASS) {
        size_t t1 = t0 + BF_PASS < (size_t)n ? t0 + BF_PASS : (size_t)n, pass = t1 - t0;
        for (size_t p0 = r0; p0 < r1; p0 += BF_PANEL) {
            size_t np = r1 - p0 < BF_PANEL ? r1 - p0 : BF_PANEL;
            memset(accs, 0, (np + 3) / 4 * 4 * pass * 16 * sizeof *accs);
            for (size_t kb = 0; kb < cols; kb += BF_BLOCK) {
                size_t len = cols - kb < BF_BLOCK ? cols - kb : BF_BLOCK, steps = (len + 31) / 32 * 32;
                for (size_t i = 0; i < np; i++) {
                    if (i + 4 < np)
                        for (size_t c = 0; c < len * 2; c += 64)
                            _mm_prefetch((const char *)(wd + (p0 + i + 4) * cols + kb) + c, _MM_HINT_T0);
                    copy_pad(panel + i * BF_LD, wd + (p0 + i) * cols + kb, len, steps);
                }
                for (size_t t = t0; t < t1; t += 6) {
                    int nt = t1 - t < 6 ? (int)(t1 - t) : 6;
                    for (int b = 0; b < nt; b++) copy_pad(tile + (size_t)b * BF_LD, xb + (t + (size_t)b) * cols + kb, len, steps);
                    for (size_t i = 0; i < np; i += 4) {
                        int nr = np - i < 4 ? (int)(np - i) : 4;
                        blk_any(nr, nt, panel + i * BF_LD, tile, steps, accs + ((i / 4) * pass + (t - t0)) * 4 * 16);
                    }
                }
            }
            for (size_t i = 0; i < np; i += 4) {
                int nr = np - i < 4 ? (int)(np - i) : 4;
                for (size_t t = t0; t < t1; t += 6) {
                    int nt = t1 - t < 6 ? (int)(t1 - t) : 6;
                    const float *buf = accs + ((i / 4) * pass + (t - t0)) * 4 * 16;
                    for (int a = 0; a < nr; a++)
                        for (int b = 0; b < nt; b++)
                            out[(t + (size_t)b) * ldo + p0 + i + (size_t)a] =
                                hsum16(_mm512_loadu_ps(buf + (size_t)(a * nt + b) * 16));
                }
            }
        }
    }
}

/* Rows [r0, r1) of a BF16 weight for n token rows of bf16 activations xb;
 * scratch: cpu_bf16_scratch() floats of the worker's (n > BF_DIRECT_MAX). */
void cpu_bf16_rows(const weight *w, size_t r0, size_t r1, const uint16_t *xb, int n, float *out, size_t ldo,
                   float *scratch)
{
    const uint16_t *wd = w->data;
    size_t cols = (size_t)w->cols;
    if (n > BF_DIRECT_MAX) {
        bf16_gemm(w, r0, r1, xb, n, out, ldo, scratch);
        return;
    }
    /* decode: the rows stream from memory once, 4 at a time (the rest one
     * by one), applied to the token rows 2 at a time (L1 after the first) */
    size_t r = r0;
    for (; r + 4 <= r1; r += 4)
        for (int t = 0; t < n; t += 2) {
            const uint16_t *xt = xb + (size_t)t * cols;
            float *ot = out + (size_t)t * ldo;
            if (n - t == 1)
                kern(4, 1, t == 0, wd, cols, r, xt, cols, ot, ldo);
            else
                kern(4, 2, t == 0, wd, cols, r, xt, cols, ot, ldo);
        }
    for (; r < r1; r++)
        for (int t = 0; t < n; t += 2) {
            const uint16_t *xt = xb + (size_t)t * cols;
            float *ot = out + (size_t)t * ldo;
            if (n - t == 1)
                kern(1, 1, false, wd, cols, r, xt, cols, ot, ldo);
            else
                kern(1, 2, false, wd, cols, r, xt, cols, ot, ldo);
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

size_t cpu_bf16_scratch(void) { return 0; }

void cpu_bf16_rows(const weight *w, size_t r0, size_t r1, const uint16_t *xb, int n, float *out, size_t ldo,
                   float *scratch)
{
    (void)w, (void)r0, (void)r1, (void)xb, (void)n, (void)out, (void)ldo, (void)scratch;
    FERRY_ASSERT(!"cpu_bf16_rows: not built with AVX-512 BF16");
}
#endif
