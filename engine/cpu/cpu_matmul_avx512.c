/*
 * cpu_matmul_avx512.c - cpu_matmul.c's F32/F16/BF16 kernels with 16 lanes
 * (dense_kern.h, the same code as the AVX2 build's), for processors with
 * AVX-512 F/BW/VL/DQ, chosen at run time (cpu_isa.c). Prefill takes tiles
 * of 4 weight rows x 6 token rows: 24 accumulators of the 32 registers.
 * Within this instruction set decode and prefill sum each output in one
 * order (batch invariance); against the AVX2 kernels (8 lanes) the last
 * bits differ, so the choice is made once per backend.
 */
#include "cpu.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include "simd_sum.h"

static inline __attribute__((always_inline)) __m512 dk_loadw(ferry_dtype dt, const void *base, size_t i)
{
    switch (dt) {
    case DT_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i))), 16));
    case DT_F16:
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i)));
    default:
        return _mm512_loadu_ps((const float *)base + i);
    }
}

#define DK_VEC __m512
#define DK_W 16
#define DK_NT 6
#define DK_ZERO() _mm512_setzero_ps()
#define DK_LOADF(p) _mm512_loadu_ps(p)
#define DK_STOREF(p, v) _mm512_storeu_ps(p, v)
#define DK_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define DK_HSUM(v) hsum16(v)
#include "dense_kern.h"

void cpu_dense_rows_avx512(const weight *w, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo,
                           float *wf)
{
    dense_rows(w, r0, r1, x, n, out, ldo, wf);
}

bool cpu_matmul_avx512_built(void) { return true; }

#else /* built without AVX-512: never offered */

bool cpu_matmul_avx512_built(void) { return false; }

void cpu_dense_rows_avx512(const weight *w, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo,
                           float *wf)
{
    (void)w, (void)r0, (void)r1, (void)x, (void)n, (void)out, (void)ldo, (void)wf;
    FERRY_ASSERT(!"cpu_dense_rows_avx512: not built with AVX-512");
}
#endif
