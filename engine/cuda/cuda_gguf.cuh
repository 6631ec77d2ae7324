/*
 * cuda_gguf.cuh - a GGUF block type's values on the device (WQ_GGUF weights,
 * CUDA_Q_GGUF tensors): value c of a row of blocks, computed as ggml's
 * reference dequantizers (engine/weights/gguf_quant.c) compute it - the same
 * products in the same order, with explicit round-to-nearest operations so
 * the compiler cannot fuse them (each product but the last is exact, so
 * the values are the reference's bit for bit). UNTESTED: written and
 * compiled without a GPU (`make test-gpu` runs test_ops' GGUF cases on one).
 * Device code only; included by cuda_qmatmul.cu and cuda_embed.cu.
 */
#ifndef FERRY_CUDA_GGUF_CUH
#define FERRY_CUDA_GGUF_CUH

#include <cuda_fp16.h>
#include <stdint.h>

/* gguf.h's type numbers */
#define CG_Q4_0 2
#define CG_Q4_1 3
#define CG_Q5_0 6
#define CG_Q5_1 7
#define CG_Q8_0 8
#define CG_Q4_K 12
#define CG_Q5_K 13
#define CG_Q6_K 14

/* Values and bytes of one block; 0 for a type the device does not read. */
__host__ __device__ __forceinline__ void cuda_gguf_block(uint32_t type, int *elems, int *bytes)
{
    switch (type) {
    case CG_Q4_0: *elems = 32; *bytes = 18; return;
    case CG_Q4_1: *elems = 32; *bytes = 20; return;
    case CG_Q5_0: *elems = 32; *bytes = 22; return;
    case CG_Q5_1: *elems = 32; *bytes = 24; return;
    case CG_Q8_0: *elems = 32; *bytes = 34; return;
    case CG_Q4_K: *elems = 256; *bytes = 144; return;
    case CG_Q5_K: *elems = 256; *bytes = 176; return;
    case CG_Q6_K: *elems = 256; *bytes = 210; return;
    default: *elems = 0; *bytes = 0;
    }
}

__device__ __forceinline__ float cg_half(const uint8_t *p)
{
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

__device__ __forceinline__ void cg_k4_scale_min(int j, const uint8_t *q, int *d, int *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Value c of a row of blocks of `type` starting at row. */
__device__ __forceinline__ float cuda_gguf_at(uint32_t type, const uint8_t *row, int64_t c)
{
    int be, bb;
    cuda_gguf_block(type, &be, &bb);
    const uint8_t *b = row + (c / be) * bb;
    int i = (int)(c % be);
    switch (type) {
    case CG_Q8_0: return __fmul_rn((float)(int8_t)b[2 + i], cg_half(b));
    case CG_Q4_0: {
        int nib = i < 16 ? b[2 + i] & 15 : b[2 + i - 16] >> 4;
        return __fmul_rn((float)(nib - 8), cg_half(b));
    }
    case CG_Q4_1: {
        int nib = i < 16 ? b[4 + i] & 15 : b[4 + i - 16] >> 4;
        return __fadd_rn(__fmul_rn((float)nib, cg_half(b)), cg_half(b + 2));
    }
    case CG_Q5_0:
    case CG_Q5_1: {
        bool q50 = type == CG_Q5_0;
        const uint8_t *qh = b + (q50 ? 2 : 4), *qs = b + (q50 ? 6 : 8);
        uint32_t h = (uint32_t)qh[0] | ((uint32_t)qh[1] << 8) | ((uint32_t)qh[2] << 16) | ((uint32_t)qh[3] << 24);
        int nib = i < 16 ? qs[i] & 15 : qs[i - 16] >> 4;
        int q = nib | (int)(((h >> i) & 1u) << 4);
        if (q50) return __fmul_rn((float)(q - 16), cg_half(b));
        return __fadd_rn(__fmul_rn((float)q, cg_half(b)), cg_half(b + 2));
    }
    case CG_Q4_K:
    case CG_Q5_K: { /* 32-value sub-block k: low (even k) or high nibbles of 32 bytes; Q5_K's fifth bit k of qh */
        bool q5 = type == CG_Q5_K;
        int k = i / 32, l = i % 32, sc, mn;
        cg_k4_scale_min(k, b + 4, &sc, &mn);
        uint8_t byte = b[(q5 ? 48 : 16) + 32 * (k / 2) + l];
        int q = (k & 1) ? byte >> 4 : byte & 15;
        if (q5) q += ((b[16 + l] >> k) & 1) << 4;
        float d = __fmul_rn(cg_half(b), (float)sc), m = __fmul_rn(cg_half(b + 2), (float)mn);
        return __fsub_rn(__fmul_rn(d, (float)q), m);
    }
    case CG_Q6_K: { /* half h of 128 values, quarter q4 of 32, a scale per 16 */
        int h = i / 128, w = i % 128, q4 = w / 32, l = w % 32;
        uint8_t lo = b[64 * h + l + 32 * (q4 & 1)];
        int low = q4 >= 2 ? lo >> 4 : lo & 15, high = (b[128 + 32 * h + l] >> (2 * q4)) & 3;
        int q = (low | (high << 4)) - 32;
        float d = __fmul_rn(cg_half(b + 208), (float)(int8_t)b[192 + 8 * h + 2 * q4 + l / 16]);
        return __fmul_rn(d, (float)q);
    }
    default: return __int_as_float(0x7fc00000); /* NaN: the host refused the type already */
    }
}

#endif
