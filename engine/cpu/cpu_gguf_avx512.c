/*
 * cpu_gguf_avx512.c - cpu_gguf.c's matmul with 16-lane vectors, for
 * processors with AVX-512 F/BW/VL/DQ (chosen at run time: cpu_isa.c, the
 * cpu_isa setting). Built with those extensions enabled (Makefile); called
 * only where the processor has them.
 *
 * A chunk of 32 values is two vectors of 16 (gguf_chunk.h's integers and
 * products: gguf_quant.c's values bit for bit). Each output is two
 * accumulators over the chunks, lanes summed in one fixed order, whether
 * the chunk is dequantized in registers and applied at once (decode, 1-2
 * token rows) or dequantized into scratch and dotted (more rows): the same
 * operations on the same values, so a row's result does not depend on the
 * rest of its step (batch invariance). It differs from the AVX2 kernel's
 * (8 lanes x 4 accumulators) in the last bits, as any two summation orders
 * do: the ISA is chosen once per backend, never per step.
 */
#include "cpu.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    defined(__FMA__) && defined(__F16C__)
#include "gguf_chunk.h"
#include "simd_sum.h"

static inline __m512 widen(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)); }

typedef struct {
    __m512 v0, v1; /* values 0..15, 16..31 */
} w2;

static inline __attribute__((always_inline)) w2 chunk32(uint32_t type, const uint8_t *b, int c)
{
    gguf_ints q = gguf_chunk_signed(gguf_chunk_ints(type, b, c));
    w2 w = {_mm512_mul_ps(widen(q.lo), _mm512_set1_ps(q.s0)), _mm512_mul_ps(widen(q.hi), _mm512_set1_ps(q.s1))};
    gguf_form form = gguf_chunk_form(type);
    if (form != GGUF_FORM_MUL) {
        __m512 m = _mm512_set1_ps(form == GGUF_FORM_ADD ? q.m : -q.m); /* x - m == x + (-m) exactly */
        w.v0 = _mm512_add_ps(w.v0, m);
        w.v1 = _mm512_add_ps(w.v1, m);
    }
    return w;
}

/* The sum of two accumulators' lanes, in one fixed order. */
static inline float hsum2(__m512 a, __m512 b) { return hsum16(_mm512_add_ps(a, b)); }

/* Decode: rows [r0, r1) for N (1 or 2) token rows, each chunk applied as
 * it is dequantized - dot()'s operations on the same values. */
static inline __attribute__((always_inline)) void rows_fused_n(const weight *w, uint32_t type, size_t r0, size_t r1,
                                                              const float *x, const int N, float *out, size_t ldo)
{
    const int chunks = gguf_chunk_count(type); /* constants: the chunk loop unrolls, its offsets fold */
    const uint32_t be = (uint32_t)chunks * GGUF_CHUNK, bb = gguf_chunk_block_bytes(type);
    size_t cols = (size_t)w->cols, row_bytes = weight_row_bytes(w), nb = cols / be;
    const float *x1 = x + (N > 1 ? cols : 0);
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *p = (const uint8_t *)w->data + r * row_bytes;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
        const float *xk = x, *xk1 = x1;
        for (size_t i = 0; i < nb; i++, p += bb) {
            _mm_prefetch((const char *)p + 4 * bb, _MM_HINT_T0);
#pragma GCC unroll 8
            for (int c = 0; c < chunks; c++, xk += GGUF_CHUNK, xk1 += GGUF_CHUNK) {
                w2 wv = chunk32(type, p, c);
                a0 = _mm512_fmadd_ps(wv.v0, _mm512_loadu_ps(xk), a0);
                a1 = _mm512_fmadd_ps(wv.v1, _mm512_loadu_ps(xk + 16), a1);
                if (N > 1) {
                    b0 = _mm512_fmadd_ps(wv.v0, _mm512_loadu_ps(xk1), b0);
                    b1 = _mm512_fmadd_ps(wv.v1, _mm512_loadu_ps(xk1 + 16), b1);
                }
            }
        }
        out[r] = hsum2(a0, a1);
        if (N > 1) out[ldo + r] = hsum2(b0, b1);
    }
}

#define FUSED(T) \
    static void fused_##T(const weight *w, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo) \
    { \
        if (n == 1) \
            rows_fused_n(w, GGUF_##T, r0, r1, x, 1, out, ldo); \
        else \
            rows_fused_n(w, GGUF_##T, r0, r1, x, 2, out, ldo); \
    }
FUSED(Q8_0) FUSED(Q4_0) FUSED(Q4_1) FUSED(Q5_0) FUSED(Q5_1) FUSED(Q4_K) FUSED(Q5_K) FUSED(Q6_K)
#undef FUSED

/* n floats (a multiple of 32: every chunked type's block is), weights a
 * against activations b, in rows_fused_n's order. */
static float dot(const float *a, const float *b, size_t n)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = s0;
    for (size_t k = 0; k < n; k += GGUF_CHUNK) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + k), _mm512_loadu_ps(b + k), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + k + 16), _mm512_loadu_ps(b + k + 16), s1);
    }
    return hsum2(s0, s1);
}

void cpu_gguf_rows_avx512(const weight *w, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo,
                          float *scratch)
{
    FERRY_ASSERT(gguf_chunked(w->block));
    if (n <= 2) {
#define CASE(T) \
    case GGUF_##T: fused_##T(w, r0, r1, x, n, out, ldo); return;
        switch (w->block) {
            CASE(Q8_0) CASE(Q4_0) CASE(Q4_1) CASE(Q5_0) CASE(Q5_1) CASE(Q4_K) CASE(Q5_K) CASE(Q6_K)
        default: break;
        }
#undef CASE
    }
    cpu_gguf_rows_scratch(w, r0, r1, x, n, out, ldo, scratch, dot);
}

bool cpu_gguf_avx512_built(void) { return true; }

#else /* built without AVX-512 (another architecture, a fuzz build): never offered */

bool cpu_gguf_avx512_built(void) { return false; }

void cpu_gguf_rows_avx512(const weight *w, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo,
                          float *scratch)
{
    (void)w, (void)r0, (void)r1, (void)x, (void)n, (void)out, (void)ldo, (void)scratch;
    FERRY_ASSERT(!"cpu_gguf_rows_avx512: not built with AVX-512");
}
#endif
