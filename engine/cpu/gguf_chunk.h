/*
 * gguf_chunk.h - a GGUF block's 32-value chunk as integers and scales,
 * shared by the AVX2 (cpu_gguf.c) and AVX-512 (cpu_gguf_avx512.c) kernels:
 * each widens the two 16-byte halves its own way and applies the same
 * products, so both give gguf_quant.c's values bit for bit.
 *
 * gguf_chunk_ints gives chunk c of block b: lo = codes of values 0..15,
 * hi = of values 16..31, as stored - unsigned bytes whose integer is
 * q = code - bias (bias 8, 16 or 32; 0 for Q8_0, whose codes are signed q
 * already; gguf_chunk_signed takes the bias off) - and the products that
 * make them values: v = q * s (s0 for lo, s1 for hi), then + m (Q4_1,
 * Q5_1) or - m (Q4_K, Q5_K) - the reference's, each exact but the last, so
 * fused or not they round alike. SSSE3 integer code only: included by
 * files built for AVX2 or more.
 */
#ifndef FERRY_GGUF_CHUNK_H
#define FERRY_GGUF_CHUNK_H

#include <immintrin.h>
#include <string.h>

#include "../base/status.h"
#include "../weights/dtype.h"
#include "../weights/gguf_quant.h"

#define GGUF_CHUNK 32

typedef enum { GGUF_FORM_MUL, GGUF_FORM_ADD, GGUF_FORM_SUB } gguf_form; /* q s, q s + m, q s - m */

typedef struct {
    __m128i lo, hi;
    float s0, s1, m;
    int bias;
} gguf_ints;

static inline float gguf_half(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32(h);
}

/* Whether the chunk kernels handle the type (the others go through gguf_dequant). */
static inline bool gguf_chunked(uint32_t type)
{
    return type == GGUF_Q8_0 || type == GGUF_Q4_0 || type == GGUF_Q4_1 || type == GGUF_Q5_0 || type == GGUF_Q5_1 ||
           type == GGUF_Q4_K || type == GGUF_Q5_K || type == GGUF_Q6_K;
}

/* A chunked type's block: chunks of 32 values and bytes, as constants the
 * compiler folds where the type is (gguf_type_block says the same). */
static inline int gguf_chunk_count(uint32_t type)
{
    return type == GGUF_Q4_K || type == GGUF_Q5_K || type == GGUF_Q6_K ? 8 : 1;
}

static inline uint32_t gguf_chunk_block_bytes(uint32_t type)
{
    switch (type) {
    case GGUF_Q8_0: return 34;
    case GGUF_Q4_0: return 18;
    case GGUF_Q4_1: return 20;
    case GGUF_Q5_0: return 22;
    case GGUF_Q5_1: return 24;
    case GGUF_Q4_K: return 144;
    case GGUF_Q5_K: return 176;
    default: return 210; /* Q6_K */
    }
}

static inline gguf_form gguf_chunk_form(uint32_t type)
{
    return type == GGUF_Q4_1 || type == GGUF_Q5_1 ? GGUF_FORM_ADD
           : type == GGUF_Q4_K || type == GGUF_Q5_K ? GGUF_FORM_SUB
                                                    : GGUF_FORM_MUL;
}

static inline void gguf_k4_scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* 16 bits (value e's fifth bit is bit e) as 16 bytes of 0x10 or 0. */
static inline __m128i gguf_fifth_bits(uint32_t bits)
{
    __m128i v = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)bits), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    __m128i m = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
    return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(v, m), m), _mm_set1_epi8(0x10));
}

static inline __attribute__((always_inline)) gguf_ints gguf_chunk_ints(uint32_t type, const uint8_t *b, int c)
{
    const __m128i nib = _mm_set1_epi8(0x0F);
    gguf_ints q = {0};
    switch (type) {
    case GGUF_Q8_0:
        q.lo = _mm_loadu_si128((const __m128i *)(b + 2));
        q.hi = _mm_loadu_si128((const __m128i *)(b + 18));
        q.s0 = q.s1 = gguf_half(b);
        return q;
    case GGUF_Q4_0: {
        __m128i v = _mm_loadu_si128((const __m128i *)(b + 2));
        q.lo = _mm_and_si128(v, nib);
        q.hi = _mm_and_si128(_mm_srli_epi16(v, 4), nib);
        q.bias = 8;
        q.s0 = q.s1 = gguf_half(b);
        return q;
    }
    case GGUF_Q4_1: {
        __m128i v = _mm_loadu_si128((const __m128i *)(b + 4));
        q.lo = _mm_and_si128(v, nib);
        q.hi = _mm_and_si128(_mm_srli_epi16(v, 4), nib);
        q.s0 = q.s1 = gguf_half(b);
        q.m = gguf_half(b + 2);
        return q;
    }
    case GGUF_Q4_K: { /* chunk c: sub-block c, the low (even c) or high nibbles of 32 bytes */
        uint8_t sc, mn;
        gguf_k4_scale_min(c, b + 4, &sc, &mn);
        const uint8_t *qs = b + 16 + 32 * (c / 2);
        __m128i sh = _mm_cvtsi32_si128(4 * (c & 1));
        q.lo = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)qs), sh), nib);
        q.hi = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)(qs + 16)), sh), nib);
        q.s0 = q.s1 = gguf_half(b) * (float)sc;
        q.m = gguf_half(b + 2) * (float)mn;
        return q;
    }
    case GGUF_Q5_0:
    case GGUF_Q5_1: { /* value e's fifth bit is bit e of the 32-bit qh */
        bool q50 = type == GGUF_Q5_0;
        uint32_t qh;
        memcpy(&qh, b + (q50 ? 2 : 4), 4);
        __m128i v = _mm_loadu_si128((const __m128i *)(b + (q50 ? 6 : 8)));
        q.lo = _mm_or_si128(_mm_and_si128(v, nib), gguf_fifth_bits(qh & 0xFFFF));
        q.hi = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(v, 4), nib), gguf_fifth_bits(qh >> 16));
        if (q50)
            q.bias = 16;
        else
            q.m = gguf_half(b + 2);
        q.s0 = q.s1 = gguf_half(b);
        return q;
    }
    case GGUF_Q5_K: { /* Q4_K's chunk with a fifth bit: bit c of qh[l] for value l of chunk c */
        uint8_t sc, mn;
        gguf_k4_scale_min(c, b + 4, &sc, &mn);
        const uint8_t *qs = b + 48 + 32 * (c / 2), *qh = b + 16;
        __m128i sh = _mm_cvtsi32_si128(4 * (c & 1)), hsh = _mm_cvtsi32_si128(c), one = _mm_set1_epi8(1);
        __m128i h0 = _mm_slli_epi16(_mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)qh), hsh), one), 4);
        __m128i h1 = _mm_slli_epi16(_mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)(qh + 16)), hsh), one), 4);
        q.lo = _mm_or_si128(_mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)qs), sh), nib), h0);
        q.hi = _mm_or_si128(_mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)(qs + 16)), sh), nib), h1);
        q.s0 = q.s1 = gguf_half(b) * (float)sc;
        q.m = gguf_half(b + 2) * (float)mn;
        return q;
    }
    case GGUF_Q6_K: { /* chunk c: half c / 4 (128 values), quarter c % 4; a scale per 16 values */
        int h = c / 4, qq = c % 4;
        const uint8_t *ql = b + 64 * h + 32 * (qq & 1), *qh = b + 128 + 32 * h;
        const int8_t *sc = (const int8_t *)(b + 192) + 8 * h + 2 * qq;
        float d = gguf_half(b + 208);
        __m128i lsh = _mm_cvtsi32_si128(4 * (qq >> 1)), hsh = _mm_cvtsi32_si128(2 * qq);
        __m128i three = _mm_set1_epi8(3);
        __m128i l0 = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)ql), lsh), nib);
        __m128i l1 = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)(ql + 16)), lsh), nib);
        __m128i h0 = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)qh), hsh), three);
        __m128i h1 = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)(qh + 16)), hsh), three);
        q.lo = _mm_or_si128(l0, _mm_slli_epi16(h0, 4));
        q.hi = _mm_or_si128(l1, _mm_slli_epi16(h1, 4));
        q.bias = 32;
        q.s0 = d * (float)sc[0];
        q.s1 = d * (float)sc[1];
        return q;
    }
    default: FERRY_ASSERT(!"gguf_chunk_ints: type not chunked");
    }
    return q;
}

/* The chunk's integers as signed bytes: the codes less their bias. */
static inline __attribute__((always_inline)) gguf_ints gguf_chunk_signed(gguf_ints q)
{
    if (q.bias) {
        __m128i b = _mm_set1_epi8((char)q.bias);
        q.lo = _mm_sub_epi8(q.lo, b);
        q.hi = _mm_sub_epi8(q.hi, b);
        q.bias = 0;
    }
    return q;
}

#endif
