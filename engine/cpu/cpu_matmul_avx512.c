/*
 * cpu_matmul_avx512.c - cpu_matmul.c's exact-mode kernels (F32/F16/BF16,
 * int8/int4) with 16 lanes (mm_kern.h, the same code as the AVX2 build's),
 * for processors with AVX-512 F/BW/VL/DQ, chosen at run time (cpu_isa.c).
 * Prefill takes tiles of 4 weight rows x 6 token rows: 24 accumulators of
 * the 32 registers.
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

/* 16 int8 codes as f32 */
static inline __attribute__((always_inline)) __m512 dk_q8(const uint8_t *p)
{
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* 16 bytes' low nibbles (a 32-column chunk's even columns) and high ones
 * (its odd), less 8 */
static inline __attribute__((always_inline)) void dk_q4(const uint8_t *p, __m512 *lo, __m512 *hi)
{
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)), eight = _mm512_set1_epi32(8);
    *lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(b, _mm512_set1_epi32(15)), eight));
    *hi = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(b, 4), eight));
}

/* the even and odd columns of p[0 .. 31] */
static inline __attribute__((always_inline)) void dk_split(const float *p, __m512 *e, __m512 *o)
{
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    __m512 a = _mm512_loadu_ps(p), b = _mm512_loadu_ps(p + 16);
    *e = _mm512_permutex2var_ps(a, ie, b);
    *o = _mm512_permutex2var_ps(a, _mm512_add_epi32(ie, _mm512_set1_epi32(1)), b);
}

#define DK_VEC __m512
#define DK_W 16
#define DK_NT 6
#define DK_QNR 4 /* int8/int4 tiles: 4 x 3 accumulators and totals */
#define DK_QNT 3
#define DK_ZERO() _mm512_setzero_ps()
#define DK_LOADF(p) _mm512_loadu_ps(p)
#define DK_STOREF(p, v) _mm512_storeu_ps(p, v)
#define DK_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define DK_SET1(f) _mm512_set1_ps(f)
#define DK_HSUM(v) hsum16(v)
#include "mm_kern.h"

const cpu_mm_kernels cpu_mm_avx512 = MM_KERNELS;

bool cpu_matmul_avx512_built(void) { return true; }

#else /* built without AVX-512: never offered */

bool cpu_matmul_avx512_built(void) { return false; }

const cpu_mm_kernels cpu_mm_avx512 = {0};
#endif
