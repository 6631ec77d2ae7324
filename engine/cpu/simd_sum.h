/*
 * simd_sum.h - the lanes of a vector summed in one fixed order, shared by
 * the CPU kernels (each output's order is part of what makes a step's rows
 * independent of each other: cpu_matmul.c). hsum8 where AVX is built,
 * hsum16 where AVX-512 F/DQ is: its two halves added, then hsum8's order.
 */
#ifndef FERRY_SIMD_SUM_H
#define FERRY_SIMD_SUM_H

#include <immintrin.h>

static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
static inline float hsum16(__m512 v)
{
    return hsum8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}
#endif

#endif
