/*
 * cpu_gguf.c - y = x W^T for W held as a GGUF file's blocks (WQ_GGUF:
 * Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), computed from the
 * blocks as stored: no full-precision copy of W exists, only the few rows
 * being applied. cpu_matmul.c calls in here.
 *
 * A block of up to 4 weight rows is dequantized into the worker's f32
 * scratch, then dotted with every token row (f32 activations, 8 lanes x 4
 * accumulators, summed in one fixed order): the weight bytes are read once
 * per call, and each output is the same operations in the same order
 * whatever the number of token rows, so a row's result does not depend on
 * the rest of its step (batch invariance, as the other kernels).
 *
 * The dequantization gives the values gguf_quant.c (ggml's reference
 * dequantizers) gives, bit for bit: the AVX2 paths for Q8_0, Q4_0, Q4_1,
 * Q4_K and Q6_K unpack each block's integers and scales, then compute the
 * same products (each exact but the last, as in the reference) eight at a
 * time; the other types take gguf_dequant. test_ops checks both against it.
 */
#include <string.h>

#include "../weights/gguf_quant.h"
#include "cpu.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define HAVE_AVX2 1
#endif

#define ROWS 4 /* weight rows dequantized at a time */

bool cpu_gguf_valid(const weight *w)
{
    uint32_t be, bb;
    return w->quant == WQ_GGUF && w->dtype == DT_U8 && w->data && gguf_dequant_supported(w->block) &&
           gguf_type_block(w->block, &be, &bb) && w->cols % be == 0;
}

static inline float half(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32(h);
}

#ifdef HAVE_AVX2
/* dst[i] = scale * q[i] (- min), 8 at a time, for n (a multiple of 8) values. */
static inline void scale8(float *dst, const int8_t *q, int n, float scale, float min, bool sub)
{
    __m256 s = _mm256_set1_ps(scale), m = _mm256_set1_ps(min);
    for (int i = 0; i < n; i += 8) {
        __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + i))));
        v = _mm256_mul_ps(s, v);
        _mm256_storeu_ps(dst + i, sub ? _mm256_sub_ps(v, m) : v);
    }
}

static void k4_scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* 16 bytes of nibbles to 32 values, low nibbles first (Q4_0, Q4_1 order),
 * widened 8 at a time into y as q * s + a (bias: subtracted from q first,
 * in integers). */
static inline void nibbles16(float *y, const uint8_t *p, int bias, float s, float a, bool add)
{
    __m128i v = _mm_loadu_si128((const __m128i *)p), m = _mm_set1_epi8(0x0F), bb = _mm_set1_epi8((char)bias);
    __m128i lo = _mm_sub_epi8(_mm_and_si128(v, m), bb), hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), m), bb);
    __m256 vs = _mm256_set1_ps(s), va = _mm256_set1_ps(a);
    __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int i = 0; i < 4; i++) {
        __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[i]));
        _mm256_storeu_ps(y + 8 * i, add ? _mm256_add_ps(_mm256_mul_ps(q, vs), va) : _mm256_mul_ps(vs, q));
    }
}

/* 32 bytes of nibbles (a Q4_K pair of sub-blocks): the low nibbles are 32
 * values (s1 q - m1), the high ones the next 32 (s2 q - m2). */
static inline void nibbles32_k(float *y, const uint8_t *p, float s1, float m1, float s2, float m2)
{
    __m256i v = _mm256_loadu_si256((const __m256i *)p), m = _mm256_set1_epi8(0x0F);
    __m256i lo = _mm256_and_si256(v, m), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
    const __m256i halves[2] = {lo, hi};
    const float sc[2] = {s1, s2}, mn[2] = {m1, m2};
    for (int h = 0; h < 2; h++) {
        __m256 vs = _mm256_set1_ps(sc[h]), vm = _mm256_set1_ps(mn[h]);
        __m128i a = _mm256_castsi256_si128(halves[h]), b = _mm256_extracti128_si256(halves[h], 1);
        __m128i parts[4] = {a, _mm_srli_si128(a, 8), b, _mm_srli_si128(b, 8)};
        for (int i = 0; i < 4; i++) {
            __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[i]));
            _mm256_storeu_ps(y + 32 * h + 8 * i, _mm256_sub_ps(_mm256_mul_ps(vs, q), vm));
        }
    }
}

/* One block of `type` to f32 (blocks: gguf_quant.h); false for the types
 * left to gguf_dequant. */
static bool block_avx2(uint32_t type, const uint8_t *b, float *y)
{
    int8_t q[256];
    switch (type) {
    case GGUF_Q8_0:
        scale8(y, (const int8_t *)(b + 2), 32, half(b), 0, false);
        return true;
    case GGUF_Q4_0:
        nibbles16(y, b + 2, 8, half(b), 0, false);
        return true;
    case GGUF_Q4_1:
        nibbles16(y, b + 4, 0, half(b), half(b + 2), true);
        return true;
    case GGUF_Q4_K: {
        float d = half(b), dmin = half(b + 2);
        const uint8_t *sc = b + 4, *qs = b + 16;
        for (int j = 0, is = 0; j < 256; j += 64, is += 2, qs += 32) {
            uint8_t s1, m1, s2, m2;
            k4_scale_min(is, sc, &s1, &m1);
            k4_scale_min(is + 1, sc, &s2, &m2);
            nibbles32_k(y + j, qs, d * (float)s1, dmin * (float)m1, d * (float)s2, dmin * (float)m2);
        }
        return true;
    }
    case GGUF_Q6_K: {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = half(b + 208);
        for (int n = 0; n < 256; n += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                q[n + l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
                q[n + l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                q[n + l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                q[n + l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
            for (int g = 0; g < 8; g++) /* a scale per 16 values: (d sc) q */
                scale8(y + n + 16 * g, q + n + 16 * g, 16, d * (float)sc[g], 0, false);
        }
        return true;
    }
    default: return false;
    }
}
#endif

/* Blocks [b0, b0 + nb) of row `row` to f32 at dst. */
static void blocks_to_f32(const weight *w, int64_t row, int64_t b0, int64_t nb, float *dst)
{
    uint32_t be, bb;
    gguf_type_block(w->block, &be, &bb);
    const uint8_t *p = (const uint8_t *)w->data + (size_t)row * weight_row_bytes(w) + (size_t)b0 * bb;
#ifdef HAVE_AVX2
    if (block_avx2(w->block, p, dst)) {
        for (int64_t i = 1; i < nb; i++) block_avx2(w->block, p + (size_t)i * bb, dst + (size_t)i * be);
        return;
    }
#endif
    gguf_dequant(w->block, p, dst, (uint64_t)nb * be);
}

void cpu_gguf_row_to_f32(float *dst, const weight *w, int64_t row, int64_t col0, int64_t n)
{
    uint32_t be, bb;
    gguf_type_block(w->block, &be, &bb);
    int64_t b0 = col0 / be, b1 = (col0 + n + be - 1) / be;
    if (col0 % be == 0 && n % be == 0) {
        blocks_to_f32(w, row, b0, b1 - b0, dst);
        return;
    }
    float tmp[256]; /* an edge block, whole (every type's block is at most 256 values) */
    for (int64_t b = b0; b < b1; b++) {
        blocks_to_f32(w, row, b, 1, tmp);
        int64_t lo = b * be > col0 ? b * be : col0, hi = (b + 1) * be < col0 + n ? (b + 1) * be : col0 + n;
        memcpy(dst + (lo - col0), tmp + (lo - b * be), (size_t)(hi - lo) * sizeof *dst);
    }
}

size_t cpu_gguf_scratch(const weight *w)
{
    return ROWS * (size_t)w->cols;
}

/* The dot product of n floats, in one fixed order. */
static inline float dot(const float *a, const float *b, size_t n)
{
#ifdef HAVE_AVX2
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    size_t k = 0;
    for (; k + 32 <= n; k += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(b + k + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 16), _mm256_loadu_ps(b + k + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 24), _mm256_loadu_ps(b + k + 24), s3);
    }
    for (; k + 8 <= n; k += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), s0);
    __m256 v = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float s = _mm_cvtss_f32(h);
#else
    float s = 0;
    size_t k = 0;
#endif
    for (; k < n; k++) s += a[k] * b[k];
    return s;
}

void cpu_gguf_rows(const weight *w, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo,
                   float *scratch)
{
    size_t cols = (size_t)w->cols;
    for (size_t r = r0; r < r1; r += ROWS) {
        int nr = r + ROWS <= r1 ? ROWS : (int)(r1 - r);
        for (int i = 0; i < nr; i++)
            cpu_gguf_row_to_f32(scratch + (size_t)i * cols, w, (int64_t)(r + (size_t)i), 0, (int64_t)cols);
        for (int t = 0; t < n; t++)
            for (int i = 0; i < nr; i++)
                out[(size_t)t * ldo + r + (size_t)i] = dot(scratch + (size_t)i * cols, x + (size_t)t * cols, cols);
    }
}
