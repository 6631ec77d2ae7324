/*
 * cpu_gguf_int8.c - a GGUF file's chunked blocks against activations
 * quantized to 8 bits (--cpu-activations int8, llama.cpp's approach): each
 * token row is cut into blocks of 32 values, each block scaled to int8 by
 * d = max|x| / 127 (q = x / d rounded to nearest even), and a chunk of a
 * weight row is applied as integer dot products of its codes with the
 * row's int8 values (AVX-512 VNNI, 4 products a lane), then scaled once.
 * Exact in the integers; the activation's rounding (at most d / 2 a value)
 * is the whole error, bounded per output by sum_blocks d_b / 2 sum |w| -
 * test_ops checks each output against that bound.
 *
 * Per chunk: u = the stored codes (unsigned; Q8_0's signed codes + 128),
 * isum = u . xq and s4 = 1 . xq by lanes of 4 (vpdpbusd), q . xq = isum -
 * bias s4 exactly; then acc += (s dx) isum' (+ (+-m dx) s4 for the types
 * with a minimum, in accumulators of their own), 8 lanes, even and odd
 * chunks apart, summed in one fixed order. Each output is the
 * same operations whatever the number of token rows and their grouping
 * (batch invariance). Built with AVX-512 F/BW/VL/DQ + VNNI; called only
 * where the processor has them (cpu_isa.c).
 */
#include "cpu.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    defined(__AVX512VNNI__) && defined(__FMA__) && defined(__F16C__)
#include "gguf_chunk.h"

void cpu_gguf_quantize_x(const float *x, int n, size_t cols, int8_t *xq, float *xd)
{
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int t = 0; t < n; t++)
        for (size_t k = 0; k < cols; k += GGUF_CHUNK) {
            const float *p = x + (size_t)t * cols + k;
            __m512 v0 = _mm512_loadu_ps(p), v1 = _mm512_loadu_ps(p + 16);
            float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1)));
            float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
            __m512 s = _mm512_set1_ps(id);
            int8_t *q = xq + (size_t)t * cols + k;
            _mm_storeu_si128((__m128i *)q, _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, s))));
            _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, s))));
            xd[(size_t)t * (cols / GGUF_CHUNK) + k / GGUF_CHUNK] = d;
        }
}

static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* A token row's accumulators: chunk k adds its q . x term to a[k & 1] and
 * its minimum's term to m[k & 1] - four independent chains, so a chunk does
 * not wait on the last one's multiply-add. */
typedef struct {
    __m256 a0, a1, m0, m1;
} accs;

static inline accs accs_zero(void)
{
    __m256 z = _mm256_setzero_ps();
    return (accs){z, z, z, z};
}

static inline float accs_sum(accs s)
{
    return hsum8(_mm256_add_ps(_mm256_add_ps(s.a0, s.a1), _mm256_add_ps(s.m0, s.m1)));
}

static inline int log2_bias(int bias) { return bias == 8 ? 3 : bias == 16 ? 4 : bias == 32 ? 5 : 7; }

/* One token row's step on chunk k (odd: the second chains). */
static inline __attribute__((always_inline)) accs apply(uint32_t type, __m256i u, const gguf_ints *q,
                                                       const int8_t *xk, float dx, bool odd, accs s)
{
    const __m256i zero = _mm256_setzero_si256();
    __m256i xv = _mm256_loadu_si256((const __m256i *)xk);
    __m256i isum = _mm256_dpbusd_epi32(zero, u, xv);
    gguf_form form = gguf_chunk_form(type);
    int bias = type == GGUF_Q8_0 ? 128 : q->bias;
    __m256i s4 = zero;
    if (bias || form != GGUF_FORM_MUL) s4 = _mm256_dpbusd_epi32(zero, _mm256_set1_epi8(1), xv);
    if (bias) isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(s4, log2_bias(bias))); /* exact: q . x */
    __m256 scale = type == GGUF_Q6_K ? _mm256_setr_m128(_mm_set1_ps(q->s0 * dx), _mm_set1_ps(q->s1 * dx))
                                     : _mm256_set1_ps(q->s0 * dx);
    __m256 t = _mm256_cvtepi32_ps(isum);
    if (odd)
        s.a1 = _mm256_fmadd_ps(t, scale, s.a1);
    else
        s.a0 = _mm256_fmadd_ps(t, scale, s.a0);
    if (form != GGUF_FORM_MUL) {
        __m256 mt = _mm256_cvtepi32_ps(s4), ms = _mm256_set1_ps((form == GGUF_FORM_ADD ? q->m : -q->m) * dx);
        if (odd)
            s.m1 = _mm256_fmadd_ps(mt, ms, s.m1);
        else
            s.m0 = _mm256_fmadd_ps(mt, ms, s.m0);
    }
    return s;
}

/* Rows [r0, r1) for N (1-4) token rows: each chunk's codes unpacked once
 * and applied to every row. */
static inline __attribute__((always_inline)) void rows_n(const weight *w, uint32_t type, size_t r0, size_t r1,
                                                        const int8_t *xq, const float *xd, const int N, float *out,
                                                        size_t ldo)
{
    const int chunks = gguf_chunk_count(type);
    const uint32_t be = (uint32_t)chunks * GGUF_CHUNK, bb = gguf_chunk_block_bytes(type);
    size_t cols = (size_t)w->cols, row_bytes = weight_row_bytes(w), nb = cols / be, nk = cols / GGUF_CHUNK;
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *p = (const uint8_t *)w->data + r * row_bytes;
        accs s0 = accs_zero(), s1 = s0, s2 = s0, s3 = s0;
        size_t k = 0;
        for (size_t i = 0; i < nb; i++, p += bb) {
            _mm_prefetch((const char *)p + 4 * bb, _MM_HINT_T0);
#pragma GCC unroll 8
            for (int c = 0; c < chunks; c++, k++) {
                gguf_ints q = gguf_chunk_ints(type, p, c);
                __m256i u = _mm256_set_m128i(q.hi, q.lo);
                if (type == GGUF_Q8_0) u = _mm256_xor_si256(u, _mm256_set1_epi8((char)0x80));
                const int8_t *xk = xq + k * GGUF_CHUNK;
                bool odd = k & 1;
                s0 = apply(type, u, &q, xk, xd[k], odd, s0);
                if (N > 1) s1 = apply(type, u, &q, xk + cols, xd[nk + k], odd, s1);
                if (N > 2) s2 = apply(type, u, &q, xk + 2 * cols, xd[2 * nk + k], odd, s2);
                if (N > 3) s3 = apply(type, u, &q, xk + 3 * cols, xd[3 * nk + k], odd, s3);
            }
        }
        out[r] = accs_sum(s0);
        if (N > 1) out[ldo + r] = accs_sum(s1);
        if (N > 2) out[2 * ldo + r] = accs_sum(s2);
        if (N > 3) out[3 * ldo + r] = accs_sum(s3);
    }
}

#define ROWS_T(T) \
    static void rows_##T(const weight *w, size_t r0, size_t r1, const int8_t *xq, const float *xd, int n, \
                         float *out, size_t ldo) \
    { \
        size_t cols = (size_t)w->cols, nk = cols / GGUF_CHUNK; \
        for (int t = 0; t < n; t += 4) { \
            const int8_t *q = xq + (size_t)t * cols; \
            const float *d = xd + (size_t)t * nk; \
            float *o = out + (size_t)t * ldo; \
            switch (n - t < 4 ? n - t : 4) { \
            case 1: rows_n(w, GGUF_##T, r0, r1, q, d, 1, o, ldo); break; \
            case 2: rows_n(w, GGUF_##T, r0, r1, q, d, 2, o, ldo); break; \
            case 3: rows_n(w, GGUF_##T, r0, r1, q, d, 3, o, ldo); break; \
            default: rows_n(w, GGUF_##T, r0, r1, q, d, 4, o, ldo); break; \
            } \
        } \
    }
ROWS_T(Q8_0) ROWS_T(Q4_0) ROWS_T(Q4_1) ROWS_T(Q5_0) ROWS_T(Q5_1) ROWS_T(Q4_K) ROWS_T(Q5_K) ROWS_T(Q6_K)
#undef ROWS_T

void cpu_gguf_rows_int8(const weight *w, size_t r0, size_t r1, const int8_t *xq, const float *xd, int n, float *out,
                        size_t ldo)
{
#define CASE(T) \
    case GGUF_##T: rows_##T(w, r0, r1, xq, xd, n, out, ldo); return;
    switch (w->block) {
        CASE(Q8_0) CASE(Q4_0) CASE(Q4_1) CASE(Q5_0) CASE(Q5_1) CASE(Q4_K) CASE(Q5_K) CASE(Q6_K)
    default: FERRY_ASSERT(!"cpu_gguf_rows_int8: type not chunked");
    }
#undef CASE
}

bool cpu_gguf_int8_built(void) { return true; }

#else /* built without AVX-512 VNNI: never offered */

bool cpu_gguf_int8_built(void) { return false; }

void cpu_gguf_quantize_x(const float *x, int n, size_t cols, int8_t *xq, float *xd)
{
    (void)x, (void)n, (void)cols, (void)xq, (void)xd;
    FERRY_ASSERT(!"cpu_gguf_quantize_x: not built with AVX-512 VNNI");
}

void cpu_gguf_rows_int8(const weight *w, size_t r0, size_t r1, const int8_t *xq, const float *xd, int n, float *out,
                        size_t ldo)
{
    (void)w, (void)r0, (void)r1, (void)xq, (void)xd, (void)n, (void)out, (void)ldo;
    FERRY_ASSERT(!"cpu_gguf_rows_int8: not built with AVX-512 VNNI");
}
#endif
