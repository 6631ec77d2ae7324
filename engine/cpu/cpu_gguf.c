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
 * reference. With cpu_isa avx512 the chunked types go to
 * cpu_gguf_avx512.c (16 lanes x 2 accumulators, the same values).
 */
#include <string.h>

#include "../weights/gguf_quant.h"
#include "cpu.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "gguf_chunk.h"
#define HAVE_AVX2 1
#endif

#define ROWS 4 /* weight rows dequantized at a time */

bool cpu_gguf_valid(const weight *w)
{
    uint32_t be, bb;
    if (!(w->quant == WQ_GGUF && w->dtype == DT_U8 && w->data && gguf_dequant_supported(w->block) &&
          gguf_type_block(w->block, &be, &bb) && w->cols % be == 0))
        return false;
#ifdef HAVE_AVX2
    if (gguf_chunked(w->block)) /* the kernels' constant block shapes are the format's */
        return be == (uint32_t)gguf_chunk_count(w->block) * GGUF_CHUNK && bb == gguf_chunk_block_bytes(w->block);
#endif
    return true;
}

#ifdef HAVE_AVX2
/* ---- 32 values at a time ------------------------------------------------------
 * chunk32 gives values 32c .. 32c + 31 of a block as four vectors of 8
 * (gguf_chunk.h's integers and products). Every type's block is a whole
 * number of chunks; the dot products below take a chunk as one step of
 * their four accumulators. */

#define CHUNK GGUF_CHUNK

static inline __m256 widen_i8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

/* Four vectors of 8 values; named fields, not an array: the compiler kept
 * arrays of vectors in memory. */
typedef struct {
    __m256 v0, v1, v2, v3;
} w4;

static inline __attribute__((always_inline)) w4 chunk32(uint32_t type, const uint8_t *b, int c)
{
    gguf_ints q = gguf_chunk_signed(gguf_chunk_ints(type, b, c));
    __m256 s0 = _mm256_set1_ps(q.s0), s1 = _mm256_set1_ps(q.s1);
    w4 w = {_mm256_mul_ps(widen_i8(q.lo), s0), _mm256_mul_ps(widen_i8(_mm_srli_si128(q.lo, 8)), s0),
            _mm256_mul_ps(widen_i8(q.hi), s1), _mm256_mul_ps(widen_i8(_mm_srli_si128(q.hi, 8)), s1)};
    gguf_form form = gguf_chunk_form(type);
    if (form != GGUF_FORM_MUL) {
        __m256 m = _mm256_set1_ps(form == GGUF_FORM_ADD ? q.m : -q.m); /* - m exactly: x - m == x + (-m) */
        w.v0 = _mm256_add_ps(w.v0, m);
        w.v1 = _mm256_add_ps(w.v1, m);
        w.v2 = _mm256_add_ps(w.v2, m);
        w.v3 = _mm256_add_ps(w.v3, m);
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
    const uint32_t type = w->block;
    const int chunks = gguf_chunk_count(type); /* constants: the chunk loop unrolls, its offsets fold */
    const uint32_t be = (uint32_t)chunks * CHUNK, bb = gguf_chunk_block_bytes(type);
    size_t cols = (size_t)w->cols, row_bytes = weight_row_bytes(w), nb = cols / be;
    const float *x1 = x + (N > 1 ? cols : 0);
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *p = (const uint8_t *)w->data + r * row_bytes;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        const float *xk = x, *xk1 = x1;
        for (size_t i = 0; i < nb; i++, p += bb) {
            _mm_prefetch((const char *)p + 4 * bb, _MM_HINT_T0);
#pragma GCC unroll 8
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
    if (gguf_chunked(w->block)) {
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

bool cpu_gguf_int8_takes(const weight *w)
{
#ifdef HAVE_AVX2
    if (w->quant == WQ_INT8 || w->quant == WQ_INT4) /* a chunk never straddles two groups */
        return w->cols % GGUF_CHUNK == 0 && w->group % GGUF_CHUNK == 0;
    return w->quant == WQ_GGUF && gguf_chunked(w->block);
#else
    (void)w;
    return false;
#endif
}

size_t cpu_gguf_scratch(const weight *w)
{
    return ROWS * (size_t)w->cols;
}

/* The dot product of n floats, in one fixed order. */
static float dot(const float *a, const float *b, size_t n)
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
                   float *scratch, cpu_isa isa)
{
    (void)isa;
#ifdef HAVE_AVX2
    if (isa == CPU_ISA_AVX512 && gguf_chunked(w->block)) {
        cpu_gguf_rows_avx512(w, r0, r1, x, n, out, ldo, scratch);
        return;
    }
    if (n <= 2 && gguf_chunked(w->block)) {
        rows_fused(w, r0, r1, x, n, out, ldo);
        return;
    }
#endif
    cpu_gguf_rows_scratch(w, r0, r1, x, n, out, ldo, scratch, dot);
}

void cpu_gguf_rows_scratch(const weight *w, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo,
                           float *scratch, float (*dot_fn)(const float *w_row, const float *x_row, size_t n))
{
    size_t cols = (size_t)w->cols;
    for (size_t r = r0; r < r1; r += ROWS) {
        int nr = r + ROWS <= r1 ? ROWS : (int)(r1 - r);
        for (int i = 0; i < nr; i++)
            cpu_gguf_row_to_f32(scratch + (size_t)i * cols, w, (int64_t)(r + (size_t)i), 0, (int64_t)cols);
        for (int t = 0; t < n; t++)
            for (int i = 0; i < nr; i++)
                out[(size_t)t * ldo + r + (size_t)i] = dot_fn(scratch + (size_t)i * cols, x + (size_t)t * cols, cols);
    }
}
