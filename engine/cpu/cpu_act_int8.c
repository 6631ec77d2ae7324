/*
 * cpu_act_int8.c - a GGUF file's chunked blocks, and int8/int4 weights
 * (weight.h) whose groups are whole 32-column chunks, against activations
 * quantized to 8 bits (--cpu-activations int8, llama.cpp's approach): each
 * token row is cut into blocks of 32 values, each block scaled to int8 by
 * d = max|x| / 127 (q = x / d rounded to nearest even), and a chunk of a
 * weight row is applied as integer dot products of its codes with the
 * row's int8 values (AVX-512 VNNI, 4 products a lane), then scaled once.
 * Exact in the integers; the activation's rounding (at most d / 2 a value)
 * is the whole error, bounded per output by sum_blocks d_b / 2 sum |w| -
 * test_ops checks each output against that bound.
 *
 * Per chunk: u = the stored codes (unsigned; Q8_0's and int8's signed codes
 * + 128, int4's nibbles put in column order),
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
#include "simd_sum.h"

/* One chunk of 32 values to int8 (d = max|x| / 127, q = x / d to nearest even): its
 * scale d, and its bytes in column order (lo: columns 0-15, hi: 16-31). */
static inline float qa_chunk(const float *p, __m128i *lo, __m128i *hi)
{
    const __m512 sign = _mm512_set1_ps(-0.0f);
    __m512 v0 = _mm512_loadu_ps(p), v1 = _mm512_loadu_ps(p + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1)));
    __m512 s = _mm512_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
    *lo = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, s))); /* |i| <= 127: no saturation */
    *hi = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, s)));
    return amax / 127.0f;
}

void cpu_gguf_quantize_x(const float *x, int n, size_t cols, int8_t *xq, float *xd)
{
    size_t nk = cols / GGUF_CHUNK, nd = (size_t)n * nk;
    for (int t = 0; t < n; t++)
        for (size_t k = 0; k < nk; k++) {
            const float *p = x + (size_t)t * cols + k * GGUF_CHUNK;
            int8_t *q = xq + (size_t)t * cols + k * GGUF_CHUNK;
            __m128i lo, hi;
            float d = qa_chunk(p, &lo, &hi);
            _mm_storeu_si128((__m128i *)q, lo);
            _mm_storeu_si128((__m128i *)(q + 16), hi);
            __m512i w = _mm512_add_epi32(_mm512_cvtepi8_epi32(lo), _mm512_cvtepi8_epi32(hi));
            size_t at = (size_t)t * nk + k;
            xd[at] = d;
            xd[nd + at] = d * (float)_mm512_reduce_add_epi32(w); /* d sum(q): minimums' terms */
        }
}

/* A token row's accumulators: chunks k (even) and k + 1 (odd) are taken
 * together, k's terms in lanes 0-7, k + 1's in lanes 8-15; the minimum's
 * terms apart in m. */
typedef struct {
    __m512 a, m;
    __m256 mk; /* Q4_K/Q5_K: the minimums' terms a block at a time, chunk j in lane j */
} accs;

static inline float accs_sum(accs s)
{
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(s.a), _mm512_extractf32x8_ps(s.a, 1));
    __m256 m = _mm256_add_ps(_mm512_castps512_ps256(s.m), _mm512_extractf32x8_ps(s.m, 1));
    return hsum8(_mm256_add_ps(_mm256_add_ps(a, m), s.mk));
}

/* Q4_K and Q5_K take their minimums' terms a block at a time:
 * sum_j dmin m_j (d_j sum(q_j)) from the block's 8 minimums and the
 * activations' per-chunk sums (cpu_gguf_quantize_x), one multiply-add. */
static inline bool block_mins(uint32_t type) { return type == GGUF_Q4_K || type == GGUF_Q5_K; }

static inline int log2_bias(int bias) { return bias == 8 ? 3 : bias == 16 ? 4 : bias == 32 ? 5 : 7; }

static inline __m512 halves(float a, float b)
{
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(a)), _mm256_set1_ps(b), 1);
}

static inline int int8_bias(uint32_t type) /* q = code - bias */
{
    return type == GGUF_Q8_0 ? 128 : type == GGUF_Q4_0 ? 8 : type == GGUF_Q5_0 ? 16 : type == GGUF_Q6_K ? 32 : 0;
}

/* The pair's two activation scales, lanes 0-7 and 8-15 (the second 0 for
 * an odd last chunk). */
static inline __m512 dx_pair(const float *d, bool last) { return halves(d[0], last ? 0.0f : d[1]); }

/* One token row's step on chunks k, k + 1: codes u, their 64 activations at
 * xk with scales dx; ps the pair's weight scales by lane, pm its minimums
 * (the types with one). */
static inline __attribute__((always_inline)) accs apply(uint32_t type, __m512i u, const int8_t *xk, __m512 dx,
                                                       __m512 ps, __m512 pm, bool last, accs s)
{
    const __m512i zero = _mm512_setzero_si512();
    __m512i xv = last ? _mm512_maskz_loadu_epi8(0xFFFFFFFFull, xk) : _mm512_loadu_si512((const void *)xk);
    __m512i isum = _mm512_dpbusd_epi32(zero, u, xv);
    gguf_form form = block_mins(type) ? GGUF_FORM_MUL : gguf_chunk_form(type); /* (theirs: a block at a time) */
    const int bias = int8_bias(type);
    __m512i s4 = zero;
    if (bias || form != GGUF_FORM_MUL) s4 = _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(1), xv);
    if (bias) isum = _mm512_sub_epi32(isum, _mm512_slli_epi32(s4, log2_bias(bias))); /* exact: q . x */
    s.a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(ps, dx), s.a);
    if (form == GGUF_FORM_ADD)
        s.m = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s4), _mm512_mul_ps(pm, dx), s.m);
    else if (form == GGUF_FORM_SUB)
        s.m = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(s4), _mm512_mul_ps(pm, dx), s.m);
    return s;
}

/* A Q4_K/Q5_K block's 8 scales and 8 minimums (6 bits each, packed in 12
 * bytes at b + 4) times d and dmin: lanes 0-7 d sc_j, 8-15 dmin m_j. */
static inline __m512 k_scales(const uint8_t *b)
{
    uint32_t w[3];
    memcpy(w, b + 4, 12);
    uint32_t sc_lo = w[0] & 0x3f3f3f3fu, mn_lo = w[1] & 0x3f3f3f3fu;
    uint32_t sc_hi = (w[2] & 0x0f0f0f0fu) | (((w[0] >> 6) & 0x03030303u) << 4);
    uint32_t mn_hi = ((w[2] >> 4) & 0x0f0f0f0fu) | (((w[1] >> 6) & 0x03030303u) << 4);
    __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)mn_lo, (int)mn_hi)));
    return _mm512_mul_ps(v, halves(gguf_half(b), gguf_half(b + 2)));
}

/* Lanes 0-7 lane i of v, 8-15 lane j. */
static inline __m512 pick2(__m512 v, int i, int j)
{
    return _mm512_permutexvar_ps(_mm512_inserti64x4(_mm512_set1_epi32(i), _mm256_set1_epi32(j), 1), v);
}

/* The codes of a pair straight from the blocks with 512-bit operations,
 * for the types where that is short (the same bytes as gguf_chunk_ints';
 * test_ops compares the results with the rounding emulated). pa, pb: the
 * two blocks (32-value types); pa and chunk c (even) of it (k-quants). */
static inline __attribute__((always_inline)) bool pair_direct(uint32_t type)
{
    return type == GGUF_Q8_0 || type == GGUF_Q4_0 || type == GGUF_Q4_1 || type == GGUF_Q4_K || type == GGUF_Q5_K ||
           type == GGUF_Q6_K;
}

static inline __attribute__((always_inline)) __m512i pair_codes(uint32_t type, const uint8_t *pa, const uint8_t *pb,
                                                               int c)
{
    const __m512i nib = _mm512_set1_epi8(0x0F);
    switch (type) {
    case GGUF_Q8_0: {
        __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(pa + 2))),
                                       _mm256_loadu_si256((const __m256i *)(pb + 2)), 1);
        return _mm512_xor_si512(u, _mm512_set1_epi8((char)0x80));
    }
    case GGUF_Q4_0:
    case GGUF_Q4_1: { /* [a, a, b, b] by 128-bit lanes, shifted by 0, 4, 0, 4: low and high nibbles */
        int off = type == GGUF_Q4_0 ? 2 : 4;
        __m512i v = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(pa + off)))),
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(pb + off))), 1);
        __m512i sh = _mm512_setr_epi64(0, 0, 0x0004000400040004, 0x0004000400040004, 0, 0, 0x0004000400040004,
                                       0x0004000400040004);
        return _mm512_and_si512(_mm512_srlv_epi16(v, sh), nib);
    }
    case GGUF_Q4_K: { /* chunks c, c + 1: the low and high nibbles of the same 32 bytes */
        __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(pa + 16 + 32 * (c / 2))));
        __m512i sh = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
        return _mm512_and_si512(_mm512_srlv_epi16(v, sh), nib);
    }
    case GGUF_Q5_K: { /* Q4_K's, with bits c and c + 1 of the 32 qh bytes as fifth bits */
        __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(pa + 48 + 32 * (c / 2))));
        __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(pa + 16)));
        __m512i sh = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
        __m512i hsh = _mm512_inserti64x4(_mm512_set1_epi16((short)c), _mm256_set1_epi16((short)(c + 1)), 1);
        __m512i hb = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(h, hsh), _mm512_set1_epi8(1)), 4);
        return _mm512_or_si512(_mm512_and_si512(_mm512_srlv_epi16(v, sh), nib), hb);
    }
    default: { /* Q6_K, chunks c, c + 1 (c even): 64 ql bytes, one shift; qh shifted by 2 (c % 4) and 2 more */
        int h = c / 4, qq = c % 4;
        __m512i l = _mm512_loadu_si512((const void *)(pa + 64 * h));
        __m512i hv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(pa + 128 + 32 * h)));
        __m512i hsh = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * qq)), _mm256_set1_epi16((short)(2 * qq + 2)), 1);
        __m512i lo = _mm512_and_si512(_mm512_srli_epi16(l, 4 * (qq >> 1)), nib);
        __m512i hi = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hv, hsh), _mm512_set1_epi8(3)), 4);
        return _mm512_or_si512(lo, hi);
    }
    }
}

static inline __attribute__((always_inline)) __m512i codes(uint32_t type, const gguf_ints *qa, const gguf_ints *qb)
{
    __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(qa->hi, qa->lo)),
                                   _mm256_set_m128i(qb->hi, qb->lo), 1);
    return type == GGUF_Q8_0 ? _mm512_xor_si512(u, _mm512_set1_epi8((char)0x80)) : u;
}

/* Rows [r0, r1) for N (1-4) token rows: each pair of chunks' codes
 * unpacked once and applied to every row. A pair is two chunks of one
 * k-quant block, or two blocks of the 32-value types; an odd last block
 * is paired with nothing (zero codes and scales). */
static inline __attribute__((always_inline)) void rows_n(const weight *w, uint32_t type, size_t r0, size_t r1,
                                                        const int8_t *xq, const float *xd, const float *xs,
                                                        const int N, float *out, size_t ldo)
{
    const int chunks = gguf_chunk_count(type);
    const uint32_t be = (uint32_t)chunks * GGUF_CHUNK, bb = gguf_chunk_block_bytes(type);
    size_t cols = (size_t)w->cols, row_bytes = weight_row_bytes(w), nb = cols / be, nk = cols / GGUF_CHUNK;
    const __m512 z = _mm512_setzero_ps();
    const gguf_ints none = {0};
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *p = (const uint8_t *)w->data + r * row_bytes;
        accs s0 = {z, z, _mm256_setzero_ps()}, s1 = s0, s2 = s0, s3 = s0;
#define STEP(k, last, U, PS, PM)                                                                         \
    do {                                                                                                 \
        __m512i u = (U);                                                                                 \
        __m512 ps_ = (PS), pm_ = (PM);                                                                     \
        const int8_t *xk = xq + (k) * GGUF_CHUNK;                                                        \
        s0 = apply(type, u, xk, dx_pair(xd + (k), last), ps_, pm_, last, s0);                              \
        if (N > 1) s1 = apply(type, u, xk + cols, dx_pair(xd + nk + (k), last), ps_, pm_, last, s1);       \
        if (N > 2) s2 = apply(type, u, xk + 2 * cols, dx_pair(xd + 2 * nk + (k), last), ps_, pm_, last, s2); \
        if (N > 3) s3 = apply(type, u, xk + 3 * cols, dx_pair(xd + 3 * nk + (k), last), ps_, pm_, last, s3); \
    } while (0)
        if (chunks > 1) {
            size_t k = 0;
            for (size_t i = 0; i < nb; i++, p += bb) {
                _mm_prefetch((const char *)p + 4 * bb, _MM_HINT_T0);
                __m512 bs = z; /* the block's scales: Q6_K d sc (16), Q4_K/Q5_K k_scales */
                if (type == GGUF_Q6_K)
                    bs = _mm512_mul_ps(_mm512_set1_ps(gguf_half(p + 208)),
                                       _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 192)))));
                else
                    bs = k_scales(p);
                if (block_mins(type)) { /* - sum_j dmin m_j xs_j, xs = the activations' d sum(q) a chunk */
                    __m256 mins = _mm512_extractf32x8_ps(bs, 1);
                    s0.mk = _mm256_fnmadd_ps(mins, _mm256_loadu_ps(xs + k), s0.mk);
                    if (N > 1) s1.mk = _mm256_fnmadd_ps(mins, _mm256_loadu_ps(xs + nk + k), s1.mk);
                    if (N > 2) s2.mk = _mm256_fnmadd_ps(mins, _mm256_loadu_ps(xs + 2 * nk + k), s2.mk);
                    if (N > 3) s3.mk = _mm256_fnmadd_ps(mins, _mm256_loadu_ps(xs + 3 * nk + k), s3.mk);
                }
#pragma GCC unroll 4
                for (int c = 0; c < chunks; c += 2, k += 2) {
                    __m512 ps, pm = z;
                    if (type == GGUF_Q6_K) /* chunk c's two scales, then c + 1's, 4 lanes each */
                        ps = _mm512_permutexvar_ps(
                            _mm512_setr_epi32(2 * c, 2 * c, 2 * c, 2 * c, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1,
                                              2 * c + 2, 2 * c + 2, 2 * c + 2, 2 * c + 2, 2 * c + 3, 2 * c + 3,
                                              2 * c + 3, 2 * c + 3),
                            bs);
                    else
                        ps = pick2(bs, c, c + 1);
                    STEP(k, false, pair_codes(type, p, p, c), ps, pm);
                }
            }
        } else {
            size_t i = 0;
            for (; i + 2 <= nb; i += 2, p += 2 * bb) {
                _mm_prefetch((const char *)p + 8 * bb, _MM_HINT_T0);
                gguf_ints qa = gguf_chunk_ints(type, p, 0), qb = gguf_chunk_ints(type, p + bb, 0);
                STEP(i, false, pair_direct(type) ? pair_codes(type, p, p + bb, 0) : codes(type, &qa, &qb),
                     halves(qa.s0, qb.s0), halves(qa.m, qb.m));
            }
            if (i < nb) {
                gguf_ints qa = gguf_chunk_ints(type, p, 0);
                STEP(i, true, codes(type, &qa, &none), halves(qa.s0, 0.0f), halves(qa.m, 0.0f));
            }
        }
#undef STEP
        out[r] = accs_sum(s0);
        if (N > 1) out[ldo + r] = accs_sum(s1);
        if (N > 2) out[2 * ldo + r] = accs_sum(s2);
        if (N > 3) out[3 * ldo + r] = accs_sum(s3);
    }
}

/* NAME: the token rows 4 at a time through KERN (rows_n, qrows_n) for
 * weights of kind CODE. */
#define BY4(NAME, KERN, CODE) \
    static void NAME(const weight *w, size_t r0, size_t r1, const int8_t *xq, const float *xd, int n, float *out, \
                     size_t ldo) \
    { \
        size_t cols = (size_t)w->cols, nk = cols / GGUF_CHUNK; \
        const float *xs_all = xd + (size_t)n * nk; \
        for (int t = 0; t < n; t += 4) { \
            const int8_t *q = xq + (size_t)t * cols; \
            const float *d = xd + (size_t)t * nk, *xs = xs_all + (size_t)t * nk; \
            float *o = out + (size_t)t * ldo; \
            switch (n - t < 4 ? n - t : 4) { \
            case 1: KERN(w, CODE, r0, r1, q, d, xs, 1, o, ldo); break; \
            case 2: KERN(w, CODE, r0, r1, q, d, xs, 2, o, ldo); break; \
            case 3: KERN(w, CODE, r0, r1, q, d, xs, 3, o, ldo); break; \
            default: KERN(w, CODE, r0, r1, q, d, xs, 4, o, ldo); break; \
            } \
        } \
    }
#define ROWS_T(T) BY4(rows_##T, rows_n, GGUF_##T)
ROWS_T(Q8_0) ROWS_T(Q4_0) ROWS_T(Q4_1) ROWS_T(Q5_0) ROWS_T(Q5_1) ROWS_T(Q4_K) ROWS_T(Q5_K) ROWS_T(Q6_K)
#undef ROWS_T
#undef BY4

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

/* ---- int8 / int4 weights (weight.h), groups of whole chunks -----------------------
 * Register tiles of up to 4 weight rows x 4 token rows, with the token
 * rows' share of the arithmetic done once per call (cpu_q_prep_x) rather
 * than once per weight row. Two chunks (64 columns) at a time, a pair, one
 * 512-bit vpdpbusd each: per token row and pair a record of 192 bytes holds
 *   - the 64 activations, in the byte order the weight's codes unpack to:
 *     int8, column order (lanes 0-7 chunk k, 8-15 chunk k + 1); int4, the
 *     pair's 32 packed bytes broadcast to both halves, the lower half
 *     masked to its low nibbles and the upper to its high ones (left in
 *     place: 16 times the code), so bytes 0-15 are chunk k's low nibbles
 *     (its even columns), 16-31 chunk k + 1's, 32-47 chunk k's high
 *     nibbles (odd columns), 48-63 chunk k + 1's (lanes 0-3 and 8-11 chunk
 *     k, the others k + 1);
 *   - the activations' scales d by lane, in that layout (int4's upper
 *     lanes d / 16, which undoes the high nibbles' 16 exactly);
 *   - -bias x the lane sums of the activations (int8 codes are stored + 128
 *     by the kernel's xor, int4's nibbles + 8), the starting value of each
 *     vpdpbusd, so that it yields q . x exactly.
 * Per weight row, token row and pair: one vpdpbusd, one convert, one
 * multiply (the row's scales by lane times d) and one FMA; the codes are
 * unpacked (one load, int4 one AND more) once per row and pair for every
 * token row of the tile. Each
 * output takes those operations in pair order whatever the tile and the
 * token count (batch invariance), its lanes summed by hsum16. An odd last
 * chunk is a pair whose second chunk has zero codes, activations and
 * scales. */

#define QA_REC 48 /* 32-bit words of a (token row, pair) record: 16 of codes' bytes, 16 d, 16 -bias sums */

static inline size_t qa_pairs(const weight *w) { return ((size_t)w->cols / GGUF_CHUNK + 1) / 2; }

size_t cpu_q_prep_bytes(const weight *w, int n) { return (size_t)n * qa_pairs(w) * QA_REC * 4; }

void cpu_q_prep_x(const weight *w, const float *x, int n, void *prep)
{
    bool q4 = w->quant == WQ_INT4;
    size_t cols = (size_t)w->cols, nk = cols / GGUF_CHUNK, np = qa_pairs(w);
    const __m128i split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __mmask16 second = q4 ? 0xF0F0 : 0xFF00; /* the lanes of chunk k + 1 */
    const int bias = q4 ? 8 : 128;
    int32_t *rec = prep;
    for (int t = 0; t < n; t++)
        for (size_t j = 0; j < np; j++, rec += QA_REC) {
            const float *p = x + (size_t)t * cols + 2 * j * GGUF_CHUNK;
            __m128i a0, a1, b0 = _mm_setzero_si128(), b1 = b0;
            float da = qa_chunk(p, &a0, &a1), db = 0;
            if (2 * j + 1 < nk) db = qa_chunk(p + GGUF_CHUNK, &b0, &b1);
            __m512i xv;
            if (q4) { /* each chunk's even columns, then its odd ones; then interleaved by chunk */
                a0 = _mm_shuffle_epi8(a0, split), a1 = _mm_shuffle_epi8(a1, split);
                b0 = _mm_shuffle_epi8(b0, split), b1 = _mm_shuffle_epi8(b1, split);
                __m128i ae = _mm_unpacklo_epi64(a0, a1), ao = _mm_unpackhi_epi64(a0, a1);
                __m128i be = _mm_unpacklo_epi64(b0, b1), bo = _mm_unpackhi_epi64(b0, b1);
                xv = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(be, ae)), _mm256_set_m128i(bo, ao), 1);
            } else {
                xv = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(a1, a0)), _mm256_set_m128i(b1, b0), 1);
            }
            __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), xv);
            __m512 d = _mm512_mask_blend_ps(second, _mm512_set1_ps(da), _mm512_set1_ps(db));
            __m512i nb = _mm512_mullo_epi32(sums, _mm512_set1_epi32(-bias));
            if (q4) { /* the high nibbles stay in place, 16 (n + 8): 16 x the bias, d / 16 (both exact) */
                d = _mm512_mask_mul_ps(d, 0xFF00, d, _mm512_set1_ps(1.0f / 16));
                nb = _mm512_mask_slli_epi32(nb, 0xFF00, nb, 4);
            }
            _mm512_storeu_si512((void *)rec, xv);
            _mm512_storeu_ps((float *)(rec + 16), d);
            _mm512_storeu_si512((void *)(rec + 32), nb);
        }
}

/* The codes of pair j of a row as bytes in the records' order (unsigned:
 * int8 + 128, int4 + 8); last: only chunk k exists, chunk k + 1's are 0
 * (int4) or multiply zero activations (int8). */
static inline __attribute__((always_inline)) __m512i qa_codes(bool Q4, const uint8_t *row, size_t j, bool last)
{
    if (!Q4) {
        const uint8_t *p = row + 64 * j;
        __m512i v = last ? _mm512_maskz_loadu_epi8(0xFFFFFFFFull, p) : _mm512_loadu_si512((const void *)p);
        return _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));
    }
    const uint8_t *p = row + 32 * j;
    __m256i v = last ? _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)p)) : _mm256_loadu_si256((const __m256i *)p);
    __m512i b = _mm512_broadcast_i64x4(v);
    return _mm512_and_si512(b, _mm512_inserti64x4(_mm512_set1_epi8(0x0F), _mm256_set1_epi8((char)0xF0), 1));
}

typedef struct {
    const weight *w;
    const uint8_t *data;
    size_t row_bytes, nk, np, cpg, ng; /* chunks, pairs, chunks a group, groups a row */
} qa_view;

/* out[t * ldo + r0 + i] for i < R weight rows, t < T token rows (records
 * rec, ldr words apart). With pf, prefetches the rows R rows on. */
static inline __attribute__((always_inline)) void qa_tile(bool Q4, int R, int T, bool pf, const qa_view *v, size_t r0,
                                                         const int32_t *rec, size_t ldr, float *out, size_t ldo)
{
    const __mmask16 second = Q4 ? 0xF0F0 : 0xFF00;
    const size_t pair_bytes = Q4 ? 32 : 64;
    __m512 acc[4][4], ps[4];
    const uint8_t *row[4];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) {
        row[i] = v->data + (r0 + (size_t)i) * v->row_bytes;
        ps[i] = _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[i][t] = _mm512_setzero_ps();
    }
    size_t g = 0, left = v->cpg, have = (size_t)-1; /* chunk 2j's group, chunks left in it; ps's group */
    for (size_t j = 0; j < v->np; j++) {
        bool last = 2 * j + 1 == v->nk;
        size_t ga = g;
        if (--left == 0) g++, left = v->cpg;
        size_t gb = ga;
        if (!last) {
            gb = g;
            if (--left == 0) g++, left = v->cpg;
        }
        if (ga != gb || ga != have) { /* the rows' scales by lane */
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) {
                size_t s0 = (r0 + (size_t)i) * v->ng;
                __m512 sa = _mm512_set1_ps(cpu_q_scale(v->w->scales, v->w->scale_dtype, s0 + ga));
                ps[i] = ga == gb ? sa : _mm512_mask_blend_ps(second, sa, _mm512_set1_ps(cpu_q_scale(v->w->scales, v->w->scale_dtype, s0 + gb)));
            }
            have = ga == gb ? ga : (size_t)-1;
        }
        if (pf && (j * pair_bytes) % 64 == 0)
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) _mm_prefetch((const char *)row[i] + (size_t)R * v->row_bytes + j * pair_bytes, _MM_HINT_T0);
        __m512i u[4];
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) u[i] = qa_codes(Q4, row[i], j, last);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const int32_t *rc = rec + (size_t)t * ldr + j * QA_REC;
            __m512i xv = _mm512_loadu_si512((const void *)rc), nb = _mm512_loadu_si512((const void *)(rc + 32));
            __m512 dx = _mm512_loadu_ps((const float *)(rc + 16));
#pragma GCC unroll 4
            for (int i = 0; i < R; i++)
                acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(nb, u[i], xv)),
                                            _mm512_mul_ps(ps[i], dx), acc[i][t]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) out[(size_t)t * ldo + r0 + (size_t)i] = hsum16(acc[i][t]);
}

/* Token rows a pass: their records stay in L2 (half of a 1 MiB one) while
 * every weight row of the task goes by, 4 at a time. */
static size_t qa_pass(const qa_view *v, int n)
{
    size_t per = v->np * QA_REC * 4, pass = (512u << 10) / per / 4 * 4;
    return pass < 4 ? 4 : pass > (size_t)n ? (size_t)n : pass;
}

#define QA_T(R, T) qa_tile(Q4, R, T, first, v, r, rt, ldr, ot, ldo)
#define QA_BY_T(R)                       \
    switch (nt) {                        \
    case 1: QA_T(R, 1); break;           \
    case 2: QA_T(R, 2); break;           \
    case 3: QA_T(R, 3); break;           \
    default: QA_T(R, 4); break;          \
    }

static inline __attribute__((always_inline)) void qa_rows(bool Q4, const qa_view *v, size_t r0, size_t r1,
                                                         const int32_t *rec, int n, float *out, size_t ldo)
{
    size_t ldr = v->np * QA_REC, pass = qa_pass(v, n);
    for (size_t t0 = 0; t0 < (size_t)n; t0 += pass) {
        size_t t1 = t0 + pass < (size_t)n ? t0 + pass : (size_t)n;
        for (size_t r = r0; r < r1; r += 4) {
            int nr = r1 - r < 4 ? (int)(r1 - r) : 4;
            for (size_t t = t0; t < t1; t += 4) {
                int nt = t1 - t < 4 ? (int)(t1 - t) : 4;
                bool first = t == t0; /* this token block streams the rows in; the others find them in L1 */
                const int32_t *rt = rec + t * ldr;
                float *ot = out + t * ldo;
                switch (nr) {
                case 1: QA_BY_T(1) break;
                case 2: QA_BY_T(2) break;
                case 3: QA_BY_T(3) break;
                default: QA_BY_T(4) break;
                }
            }
        }
    }
}
#undef QA_BY_T
#undef QA_T

static void qa_rows_int8(const qa_view *v, size_t r0, size_t r1, const int32_t *rec, int n, float *out, size_t ldo)
{
    qa_rows(false, v, r0, r1, rec, n, out, ldo);
}
static void qa_rows_int4(const qa_view *v, size_t r0, size_t r1, const int32_t *rec, int n, float *out, size_t ldo)
{
    qa_rows(true, v, r0, r1, rec, n, out, ldo);
}

void cpu_q_rows_int8(const weight *w, size_t r0, size_t r1, const void *prep, int n, float *out, size_t ldo)
{
    size_t nk = (size_t)w->cols / GGUF_CHUNK;
    size_t cpg = (size_t)w->group / GGUF_CHUNK, ng = (size_t)weight_groups(w);
    qa_view v = {w, w->data, weight_row_bytes(w), nk, qa_pairs(w), cpg, ng};
    (w->quant == WQ_INT8 ? qa_rows_int8 : qa_rows_int4)(&v, r0, r1, prep, n, out, ldo);
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

size_t cpu_q_prep_bytes(const weight *w, int n)
{
    (void)w, (void)n;
    return 0;
}

void cpu_q_prep_x(const weight *w, const float *x, int n, void *prep)
{
    (void)w, (void)x, (void)n, (void)prep;
    FERRY_ASSERT(!"cpu_q_prep_x: not built with AVX-512 VNNI");
}

void cpu_q_rows_int8(const weight *w, size_t r0, size_t r1, const void *prep, int n, float *out, size_t ldo)
{
    (void)w, (void)r0, (void)r1, (void)prep, (void)n, (void)out, (void)ldo;
    FERRY_ASSERT(!"cpu_q_rows_int8: not built with AVX-512 VNNI");
}
#endif
