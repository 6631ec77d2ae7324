/*
 * gguf_quant.c - GGUF block types to f32, one function a type, each written
 * as ggml's reference dequantizer computes it. See gguf_quant.h. Built
 * with -ffp-contract=off (Makefile): `d1 * q - m1` rounds twice in ggml and
 * numpy. (With fp16 scales and 4- to 6-bit q the products happen to be
 * exact, so an FMA would round the same today; the flag keeps it so for a
 * type where they are not.)
 */
#include "gguf_quant.h"

#include <string.h>

#include "dtype.h"
#include "gguf.h"

static float half(const uint8_t *p) { return f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

static void q4_0(const uint8_t *b, float *y)
{
    float d = half(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((qs[j] & 0x0F) - 8) * d;
        y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
    }
}

static void q4_1(const uint8_t *b, float *y)
{
    float d = half(b), m = half(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(qs[j] & 0x0F) * d + m;
        y[j + 16] = (float)(qs[j] >> 4) * d + m;
    }
}

/* Q5_0 and Q5_1: bit j of qh is the fifth bit of value j */
static void q5(const uint8_t *b, float *y, bool with_min)
{
    float d = half(b), m = with_min ? half(b + 2) : 0;
    const uint8_t *p = b + (with_min ? 4 : 2);
    uint32_t qh = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    const uint8_t *qs = p + 4;
    for (int j = 0; j < 16; j++) {
        int x0 = (qs[j] & 0x0F) | (int)(((qh >> j) << 4) & 0x10);
        int x1 = (qs[j] >> 4) | (int)((qh >> (j + 12)) & 0x10);
        if (with_min) {
            y[j] = (float)x0 * d + m;
            y[j + 16] = (float)x1 * d + m;
        } else {
            y[j] = (float)(x0 - 16) * d;
            y[j + 16] = (float)(x1 - 16) * d;
        }
    }
}

static void q8_0(const uint8_t *b, float *y)
{
    float d = half(b);
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int j = 0; j < 32; j++) y[j] = (float)qs[j] * d;
}

/* the j-th (scale, min) pair of a K-quant block's 12 bytes: 6 bits each */
static void scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Q4_K (fifth bits NULL) and Q5_K */
static void qk_45(const uint8_t *b, float *y, bool five)
{
    float d = half(b), dmin = half(b + 2);
    const uint8_t *scales = b + 4;
    const uint8_t *qh = five ? b + 16 : NULL;
    const uint8_t *ql = b + (five ? 48 : 16);
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < 256; j += 64, is += 2) {
        uint8_t sc, m;
        scale_min_k4(is, scales, &sc, &m);
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        scale_min_k4(is + 1, scales, &sc, &m);
        float d2 = d * (float)sc, m2 = dmin * (float)m;
        for (int l = 0; l < 32; l++) *y++ = d1 * (float)((ql[l] & 0xF) + (five && (qh[l] & u1) ? 16 : 0)) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * (float)((ql[l] >> 4) + (five && (qh[l] & u2) ? 16 : 0)) - m2;
        ql += 32;
        u1 <<= 2;
        u2 <<= 2;
    }
}

static void q6_k(const uint8_t *b, float *y)
{
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = half(b + 208);
    for (int n = 0; n < 256; n += 128) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * (float)sc[is] * (float)q1;
            y[l + 32] = d * (float)sc[is + 2] * (float)q2;
            y[l + 64] = d * (float)sc[is + 4] * (float)q3;
            y[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

bool gguf_dequant_supported(uint32_t type)
{
    switch (type) {
    case GGUF_F32: case GGUF_F16: case GGUF_BF16: case GGUF_Q4_0: case GGUF_Q4_1: case GGUF_Q5_0: case GGUF_Q5_1:
    case GGUF_Q8_0: case GGUF_Q4_K: case GGUF_Q5_K: case GGUF_Q6_K: return true;
    default: return false;
    }
}

bool gguf_dequant(uint32_t type, const void *src, float *dst, uint64_t n)
{
    uint32_t be, bb;
    if (!gguf_dequant_supported(type) || !gguf_type_block(type, &be, &bb) || n % be) return false;
    const uint8_t *b = src;
    uint64_t blocks = n / be;
    for (uint64_t i = 0; i < blocks; i++, b += bb, dst += be) {
        switch (type) {
        case GGUF_F32: memcpy(dst, b, 4); break;
        case GGUF_F16: dst[0] = half(b); break;
        case GGUF_BF16: dst[0] = bf16_to_f32((uint16_t)(b[0] | b[1] << 8)); break;
        case GGUF_Q4_0: q4_0(b, dst); break;
        case GGUF_Q4_1: q4_1(b, dst); break;
        case GGUF_Q5_0: q5(b, dst, false); break;
        case GGUF_Q5_1: q5(b, dst, true); break;
        case GGUF_Q8_0: q8_0(b, dst); break;
        case GGUF_Q4_K: qk_45(b, dst, false); break;
        case GGUF_Q5_K: qk_45(b, dst, true); break;
        case GGUF_Q6_K: q6_k(b, dst); break;
        }
    }
    return true;
}
