/*
 * cpu_gguf.c - y = x W^T for W held as a GGUF file's blocks (WQ_GGUF:
 * Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), computed from the
 * blocks as stored: no full-precision copy of W exists, only the few rows
 * being applied. cpu_matmul.c calls in here.
 *
 * Decode (1 or 2 token rows) dequantizes each 32-value chunk of a row in
 * registers and applies it at once; more token rows take a block of up to
 * 4 weight rows dequantized into the worker's f32 scratch, then dotted with
 * every token row. Both are f32 activations, 8 lanes x 4 accumulators
 * summed in one fixed order, on the same values: the weight bytes are read
 * once per call, and each output is the same operations in the same order
 * whatever the number of token rows, so a row's result does not depend on
 * the rest of its step (batch invariance, as the other kernels).
 *
 * The dequantization gives the values gguf_quant.c (ggml's reference
 * dequantizers) gives, bit for bit: the AVX2 path (every type above)
 * unpacks each chunk's integers and scales, then computes the same products
 * (each exact but the last, as in the reference) eight at a time; the
 * portable build takes gguf_dequant. test_ops checks it against the
 * reference.
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
/* ---- 32 values at a time ------------------------------------------------------
 * chunk32 gives values 32c .. 32c + 31 of a block as four vectors of 8, the
 * reference's products (each exact but the last: Q4_1's q d + m, Q4_K's
 * (d sc) q - dmin m, Q6_K's (d sc) q, so fused or not they round alike).
 * Every type's block is a whole number of chunks; the dot products below
 * take a chunk as one step of their four accumulators. */

#define CHUNK 32

static inline __m256 widen_i8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

/* 16 bytes of signed values (4-bit ones with the bias taken off) as 2 x 8 floats
 * of lo = bytes 0..7, hi = bytes 8..15. */
static inline void widen16(__m128i v, __m256 *lo, __m256 *hi)
{
    *lo = widen_i8(v);
    *hi = widen_i8(_mm_srli_si128(v, 8));
}

static inline void k4_scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Whether chunk32 handles the type (the others go through gguf_dequant). */
static inline bool chunked(uint32_t type)
{
    return type == GGUF_Q8_0 || type == GGUF_Q4_0 || type == GGUF_Q4_1 || type == GGUF_Q5_0 || type == GGUF_Q5_1 ||
           type == GGUF_Q4_K || type == GGUF_Q5_K || type == GGUF_Q6_K;
}

/* 16 bits (value e's fifth bit is bit e) as 16 bytes of 0x10 or 0. */
static inline __m128i fifth_bits(uint32_t bits)
{
    __m128i v = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)bits), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    __m128i m = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
    return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(v, m), m), _mm_set1_epi8(0x10));
}

/* Four vectors of 8 values; named fields, not an array: the compiler kept
 * arrays of vectors in memory. */
typedef struct {
    __m256 v0, v1, v2, v3;
} w4;

static inline __attribute__((always_inline)) w4 chunk32(uint32_t type, const uint8_t *b, int c)
{
    const __m128i nib = _mm_set1_epi8(0x0F);
    w4 w;
    switch (type) {
    case GGUF_Q8_0: {
        __m256 d = _mm256_set1_ps(half(b));
        w.v0 = _mm256_mul_ps(d, widen_i8(_mm_loadl_epi64((const __m128i *)(b + 2))));
        w.v1 = _mm256_mul_ps(d, widen_i8(_mm_loadl_epi64((const __m128i *)(b + 10))));
        w.v2 = _mm256_mul_ps(d, widen_i8(_mm_loadl_epi64((const __m128i *)(b + 18))));
        w.v3 = _mm256_mul_ps(d, widen_i8(_mm_loadl_epi64((const __m128i *)(b + 26))));
        return w;
    }
    case GGUF_Q4_0: {
        __m128i v = _mm_loadu_si128((const __m128i *)(b + 2)), eight = _mm_set1_epi8(8);
        __m128i lo = _mm_sub_epi8(_mm_and_si128(v, nib), eight);
        __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), nib), eight);
        __m256 d = _mm256_set1_ps(half(b));
        widen16(lo, &w.v0, &w.v1);
        widen16(hi, &w.v2, &w.v3);
        w.v0 = _mm256_mul_ps(d, w.v0);
        w.v1 = _mm256_mul_ps(d, w.v1);
        w.v2 = _mm256_mul_ps(d, w.v2);
        w.v3 = _mm256_mul_ps(d, w.v3);
        return w;
    }
    case GGUF_Q4_1: {
        __m128i v = _mm_loadu_si128((const __m128i *)(b + 4));
        widen16(_mm_and_si128(v, nib), &w.v0, &w.v1);
        widen16(_mm_and_si128(_mm_srli_epi16(v, 4), nib), &w.v2, &w.v3);
        __m256 d = _mm256_set1_ps(half(b)), m = _mm256_set1_ps(half(b + 2));
        w.v0 = _mm256_add_ps(_mm256_mul_ps(w.v0, d), m);
        w.v1 = _mm256_add_ps(_mm256_mul_ps(w.v1, d), m);
        w.v2 = _mm256_add_ps(_mm256_mul_ps(w.v2, d), m);
        w.v3 = _mm256_add_ps(_mm256_mul_ps(w.v3, d), m);
        return w;
    }
    case GGUF_Q4_K: { /* chunk c: sub-block c, the low (even c) or high nibbles of 32 bytes */
        uint8_t sc, mn;
        k4_scale_min(c, b + 4, &sc, &mn);
        __m256 s = _mm256_set1_ps(half(b) * (float)sc), m = _mm256_set1_ps(half(b + 2) * (float)mn);
        const uint8_t *qs = b + 16 + 32 * (c / 2);
        __m128i v0 = _mm_loadu_si128((const __m128i *)qs), v1 = _mm_loadu_si128((const __m128i *)(qs + 16));
        __m128i sh = _mm_cvtsi32_si128(4 * (c & 1));
        widen16(_mm_and_si128(_mm_srl_epi16(v0, sh), nib), &w.v0, &w.v1);
        widen16(_mm_and_si128(_mm_srl_epi16(v1, sh), nib), &w.v2, &w.v3);
        w.v0 = _mm256_sub_ps(_mm256_mul_ps(s, w.v0), m);
        w.v1 = _mm256_sub_ps(_mm256_mul_ps(s, w.v1), m);
        w.v2 = _mm256_sub_ps(_mm256_mul_ps(s, w.v2), m);
        w.v3 = _mm256_sub_ps(_mm256_mul_ps(s, w.v3), m);
        return w;
    }
    case GGUF_Q5_0:
    case GGUF_Q5_1: { /* value e's fifth bit is bit e of the 32-bit qh */
        bool q50 = type == GGUF_Q5_0;
        uint32_t qh;
        memcpy(&qh, b + (q50 ? 2 : 4), 4);
        __m128i v = _mm_loadu_si128((const __m128i *)(b + (q50 ? 6 : 8)));
        __m128i lo = _mm_or_si128(_mm_and_si128(v, nib), fifth_bits(qh & 0xFFFF));
        __m128i hi = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(v, 4), nib), fifth_bits(qh >> 16));
        if (q50) {
            lo = _mm_sub_epi8(lo, _mm_set1_epi8(16));
            hi = _mm_sub_epi8(hi, _mm_set1_epi8(16));
        }
        widen16(lo, &w.v0, &w.v1);
        widen16(hi, &w.v2, &w.v3);
        __m256 d = _mm256_set1_ps(half(b));
        if (q50) {
            w.v0 = _mm256_mul_ps(d, w.v0);
            w.v1 = _mm256_mul_ps(d, w.v1);
            w.v2 = _mm256_mul_ps(d, w.v2);
            w.v3 = _mm256_mul_ps(d, w.v3);
        } else {
            __m256 m = _mm256_set1_ps(half(b + 2));
            w.v0 = _mm256_add_ps(_mm256_mul_ps(w.v0, d), m);
            w.v1 = _mm256_add_ps(_mm256_mul_ps(w.v1, d), m);
            w.v2 = _mm256_add_ps(_mm256_mul_ps(w.v2, d), m);
            w.v3 = _mm256_add_ps(_mm256_mul_ps(w.v3, d), m);
        }
        return w;
    }
    case GGUF_Q5_K: { /* Q4_K's chunk with a fifth bit: bit c of qh[l] for value l of chunk c */
        uint8_t sc, mn;
        k4_scale_min(c, b + 4, &sc, &mn);
        __m256 s = _mm256_set1_ps(half(b) * (float)sc), m = _mm256_set1_ps(half(b + 2) * (float)mn);
        const uint8_t *qs = b + 48 + 32 * (c / 2), *qh = b + 16;
        __m128i sh = _mm_cvtsi32_si128(4 * (c & 1)), hsh = _mm_cvtsi32_si128(c), one = _mm_set1_epi8(1);
        __m128i h0 = _mm_slli_epi16(_mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)qh), hsh), one), 4);
        __m128i h1 = _mm_slli_epi16(_mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)(qh + 16)), hsh), one), 4);
        __m128i v0 = _mm_loadu_si128((const __m128i *)qs), v1 = _mm_loadu_si128((const __m128i *)(qs + 16));
        widen16(_mm_or_si128(_mm_and_si128(_mm_srl_epi16(v0, sh), nib), h0), &w.v0, &w.v1);
        widen16(_mm_or_si128(_mm_and_si128(_mm_srl_epi16(v1, sh), nib), h1), &w.v2, &w.v3);
        w.v0 = _mm256_sub_ps(_mm256_mul_ps(s, w.v0), m);
        w.v1 = _mm256_sub_ps(_mm256_mul_ps(s, w.v1), m);
        w.v2 = _mm256_sub_ps(_mm256_mul_ps(s, w.v2), m);
        w.v3 = _mm256_sub_ps(_mm256_mul_ps(s, w.v3), m);
        return w;
    }
    case GGUF_Q6_K: { /* chunk c: half c / 4 (128 values), quarter c % 4; a scale per 16 values */
        int h = c / 4, q = c % 4;
        const uint8_t *ql = b + 64 * h + 32 * (q & 1), *qh = b + 128 + 32 * h;
        const int8_t *sc = (const int8_t *)(b + 192) + 8 * h + 2 * q;
        float d = half(b + 208);
        __m128i lsh = _mm_cvtsi32_si128(4 * (q >> 1)), hsh = _mm_cvtsi32_si128(2 * q);
        __m128i three = _mm_set1_epi8(3), bias = _mm_set1_epi8(32);
        __m128i l0 = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)ql), lsh), nib);
        __m128i l1 = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)(ql + 16)), lsh), nib);
        __m128i h0 = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)qh), hsh), three);
        __m128i h1 = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)(qh + 16)), hsh), three);
        widen16(_mm_sub_epi8(_mm_or_si128(l0, _mm_slli_epi16(h0, 4)), bias), &w.v0, &w.v1);
        widen16(_mm_sub_epi8(_mm_or_si128(l1, _mm_slli_epi16(h1, 4)), bias), &w.v2, &w.v3);
        __m256 s0 = _mm256_set1_ps(d * (float)sc[0]), s1 = _mm256_set1_ps(d * (float)sc[1]);
        w.v0 = _mm256_mul_ps(s0, w.v0);
        w.v1 = _mm256_mul_ps(s0, w.v1);
        w.v2 = _mm256_mul_ps(s1, w.v2);
        w.v3 = _mm256_mul_ps(s1, w.v3);
        return w;
    }
    default: FERRY_ASSERT(!"chunk32: type not chunked");
    }
    return w;
}

/* Blocks [0, nb) at p to f32 at y. */
static void chunks_to_f32(uint32_t type, uint32_t be, uint32_t bb, const uint8_t *p, int64_t nb, float *y)
{
    for (int64_t i = 0; i < nb; i++, p += bb)
        for (int c = 0; c < (int)(be / CHUNK); c++, y += CHUNK) {
            w4 w = chunk32(type, p, c);
            _mm256_storeu_ps(y, w.v0);
            _mm256_storeu_ps(y + 8, w.v1);
            _mm256_storeu_ps(y + 16, w.v2);
            _mm256_storeu_ps(y + 24, w.v3);
        }
}

/* The sum of four accumulators, in dot()'s order. */
static inline float hsum4(__m256 s0, __m256 s1, __m256 s2, __m256 s3)
{
    __m256 v = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* Decode: rows [r0, r1) for N (1 or 2) token rows, each chunk dequantized
 * in registers and applied at once - the operations dot() does on the same
 * values in the same order, so the results are the scratch path's bit for
 * bit. Accumulators are named variables: arrays of vectors were kept in
 * memory by the compiler. */
static inline __attribute__((always_inline)) void rows_fused_n(const weight *w, size_t r0, size_t r1, const float *x,
                                                              const int N, float *out, size_t ldo)
{
    uint32_t be, bb;
    gguf_type_block(w->block, &be, &bb);
    const uint32_t type = w->block;
    const int chunks = (int)(be / CHUNK);
    size_t cols = (size_t)w->cols, row_bytes = weight_row_bytes(w), nb = cols / be;
    const float *x1 = x + (N > 1 ? cols : 0);
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *p = (const uint8_t *)w->data + r * row_bytes;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        const float *xk = x, *xk1 = x1;
        for (size_t i = 0; i < nb; i++, p += bb) {
            _mm_prefetch((const char *)p + 4 * bb, _MM_HINT_T0);
            for (int c = 0; c < chunks; c++, xk += CHUNK, xk1 += CHUNK) {
                w4 wv = chunk32(type, p, c);
                a0 = _mm256_fmadd_ps(wv.v0, _mm256_loadu_ps(xk), a0);
                a1 = _mm256_fmadd_ps(wv.v1, _mm256_loadu_ps(xk + 8), a1);
                a2 = _mm256_fmadd_ps(wv.v2, _mm256_loadu_ps(xk + 16), a2);
                a3 = _mm256_fmadd_ps(wv.v3, _mm256_loadu_ps(xk + 24), a3);
                if (N > 1) {
                    b0 = _mm256_fmadd_ps(wv.v0, _mm256_loadu_ps(xk1), b0);
                    b1 = _mm256_fmadd_ps(wv.v1, _mm256_loadu_ps(xk1 + 8), b1);
                    b2 = _mm256_fmadd_ps(wv.v2, _mm256_loadu_ps(xk1 + 16), b2);
                    b3 = _mm256_fmadd_ps(wv.v3, _mm256_loadu_ps(xk1 + 24), b3);
                }
            }
        }
        out[r] = hsum4(a0, a1, a2, a3);
        if (N > 1) out[ldo + r] = hsum4(b0, b1, b2, b3);
    }
}

/* One specialization per block type and token count: the type's switch
 * and the chunk loop resolve at compile time. */
#define FUSED(T, N) \
    static void fused_##T##_##N(const weight *w, size_t r0, size_t r1, const float *x, float *out, size_t ldo) \
    { \
        weight v = *w; \
        v.block = GGUF_##T; \
        rows_fused_n(&v, r0, r1, x, N, out, ldo); \
    }
FUSED(Q8_0, 1) FUSED(Q8_0, 2) FUSED(Q4_0, 1) FUSED(Q4_0, 2) FUSED(Q4_1, 1) FUSED(Q4_1, 2)
FUSED(Q4_K, 1) FUSED(Q4_K, 2) FUSED(Q6_K, 1) FUSED(Q6_K, 2) FUSED(Q5_0, 1) FUSED(Q5_0, 2) FUSED(Q5_1, 1)
FUSED(Q5_1, 2) FUSED(Q5_K, 1) FUSED(Q5_K, 2)
#undef FUSED

static void rows_fused(const weight *w, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo)
{
#define CASE(T) \
    case GGUF_##T: (n == 1 ? fused_##T##_1 : fused_##T##_2)(w, r0, r1, x, out, ldo); return;
    switch (w->block) {
        CASE(Q8_0) CASE(Q4_0) CASE(Q4_1) CASE(Q5_0) CASE(Q5_1) CASE(Q4_K) CASE(Q5_K) CASE(Q6_K)
    default: FERRY_ASSERT(!"rows_fused: type not chunked");
    }
#undef CASE
}
#endif

/* Blocks [b0, b0 + nb) of row `row` to f32 at dst. */
static void blocks_to_f32(const weight *w, int64_t row, int64_t b0, int64_t nb, float *dst)
{
    uint32_t be, bb;
    gguf_type_block(w->block, &be, &bb);
    const uint8_t *p = (const uint8_t *)w->data + (size_t)row * weight_row_bytes(w) + (size_t)b0 * bb;
#ifdef HAVE_AVX2
    if (chunked(w->block)) {
        chunks_to_f32(w->block, be, bb, p, nb, dst);
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
    float s = hsum4(s0, s1, s2, s3);
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
#ifdef HAVE_AVX2
    if (n <= 2 && chunked(w->block)) {
        rows_fused(w, r0, r1, x, n, out, ldo);
        return;
    }
#endif
    for (size_t r = r0; r < r1; r += ROWS) {
        int nr = r + ROWS <= r1 ? ROWS : (int)(r1 - r);
        for (int i = 0; i < nr; i++)
            cpu_gguf_row_to_f32(scratch + (size_t)i * cols, w, (int64_t)(r + (size_t)i), 0, (int64_t)cols);
        for (int t = 0; t < n; t++)
            for (int i = 0; i < nr; i++)
                out[(size_t)t * ldo + r + (size_t)i] = dot(scratch + (size_t)i * cols, x + (size_t)t * cols, cols);
    }
}
