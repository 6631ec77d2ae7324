/*
 * cuda_common.cuh - device helpers the kernel families share: reading a
 * weight element of any compute dtype as f32, warp and block sums, and the
 * launch geometry helpers. Device code only; included by the *.cu files.
 */
#ifndef FERRY_CUDA_COMMON_CUH
#define FERRY_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "cuda.h"

/* Element i of a weight of dtype DT, widened to f32 (exact for all three). */
template <int DT>
__device__ __forceinline__ float cuda_load_f32(const void *base, size_t i)
{
    if (DT == CUDA_F32) return ((const float *)base)[i];
    if (DT == CUDA_F16) return __half2float(((const __half *)base)[i]);
    return __bfloat162float(((const __nv_bfloat16 *)base)[i]);
}

/* The same with the dtype known only at run time (rare, light paths). */
__device__ __forceinline__ float cuda_load_f32_dyn(int dt, const void *base, size_t i)
{
    switch (dt) {
    case CUDA_F16: return cuda_load_f32<CUDA_F16>(base, i);
    case CUDA_BF16: return cuda_load_f32<CUDA_BF16>(base, i);
    default: return cuda_load_f32<CUDA_F32>(base, i);
    }
}

/* The row of the paged KV cache holding position pos of KV sequence
 * kv_seq (backend.h kv_row). */
__device__ __forceinline__ size_t cuda_kv_row(const cuda_kv &kv, int kv_seq, int pos)
{
    int32_t blk = kv.table[(size_t)kv_seq * (size_t)kv.max_blocks + (size_t)(pos / kv.block_size)];
    return (size_t)blk * (size_t)kv.block_size + (size_t)(pos % kv.block_size);
}

__device__ __forceinline__ float cuda_warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The GEMV kernels' shared steps (cuda_matmul.cu, cuda_qmatmul.cu): a lane
 * holds V consecutive widened weights wf[i][0..V) of each of R rows at
 * column k and adds their products with the n (<= NT) token rows of x
 * (row stride ldx) to acc[i][t]; at the end each row's partial sums are
 * reduced across the warp and lane 0 writes out[t * ldo + r0 + i] (+ bias). */
template <int R, int NT, int V>
__device__ __forceinline__ void cuda_gemv_fma(float (&acc)[R][NT], const float (&wf)[R][V], const float *x,
                                              size_t ldx, size_t k, int n)
{
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t < n) {
            const float4 *xp = (const float4 *)(x + (size_t)t * ldx + k);
#pragma unroll
            for (int v = 0; v < V / 4; v++) {
                float4 xv = __ldg(xp + v);
#pragma unroll
                for (int i = 0; i < R; i++) {
                    acc[i][t] = fmaf(wf[i][4 * v], xv.x, acc[i][t]);
                    acc[i][t] = fmaf(wf[i][4 * v + 1], xv.y, acc[i][t]);
                    acc[i][t] = fmaf(wf[i][4 * v + 2], xv.z, acc[i][t]);
                    acc[i][t] = fmaf(wf[i][4 * v + 3], xv.w, acc[i][t]);
                }
            }
        }
    }
}

template <int R, int NT>
__device__ __forceinline__ void cuda_gemv_store(float (&acc)[R][NT], int nr, int64_t r0, int n, const void *bias,
                                                int bias_dt, float *out, size_t ldo, int lane)
{
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[i][t] = cuda_warp_sum(acc[i][t]);
    if (lane != 0) return;
#pragma unroll
    for (int i = 0; i < R; i++) {
        if (i >= nr) break;
        size_t r = (size_t)(r0 + i);
        float b = bias ? cuda_load_f32_dyn(bias_dt, bias, r) : 0.0f;
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (t < n) out[(size_t)t * ldo + r] = acc[i][t] + b;
    }
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread
 * gets the total. `red` is __shared__ float[32]. */
__device__ __forceinline__ float cuda_block_sum(float v, float *red)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = cuda_warp_sum(v);
    __syncthreads(); /* red may still be read from a previous call */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? red[lane] : 0.0f;
    return cuda_warp_sum(t);
}

/* Blocks of `threads` covering n elements (n > 0), capped to what a grid's
 * x dimension allows: kernels loop with a grid stride. */
static inline unsigned cuda_blocks(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    return b > 65535u * 32u ? 65535u * 32u : (unsigned)b;
}

/* Calls f with the dtype as a compile-time constant. */
#define CUDA_DISPATCH_DT(dt, DT, ...)                                                                \
    do {                                                                                             \
        switch (dt) {                                                                                \
        case CUDA_F32: { constexpr int DT = CUDA_F32; __VA_ARGS__; } break;                          \
        case CUDA_F16: { constexpr int DT = CUDA_F16; __VA_ARGS__; } break;                          \
        case CUDA_BF16: { constexpr int DT = CUDA_BF16; __VA_ARGS__; } break;                        \
        default: CUDA_REQUIRE(!"weight dtype not computable");                                       \
        }                                                                                            \
    } while (0)

#endif
