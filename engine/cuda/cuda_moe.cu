/*
 * cuda_moe.cu - the mixture-of-experts row ops (backend.h): gather an
 * expert's token rows, scatter its outputs times their routing weights to
 * one row per (token, choice), and combine each token's k rows into the
 * residual stream. Memory-bound copies; the arithmetic is the CPU
 * backend's, one f32 multiply per scattered element and the k rows summed
 * left to right before the residual add (no products to contract, so the
 * results are the CPU's bit for bit).
 */
#include "cuda_common.cuh"

/* grid.x: rows; threads over the row */
__global__ void gather_rows_kernel(float *out, const float *x, const int32_t *rows, int n, int dim)
{
    for (int i = blockIdx.x; i < n; i += gridDim.x) {
        const float *src = x + (size_t)rows[i] * (size_t)dim;
        float *dst = out + (size_t)i * (size_t)dim;
        for (int d = threadIdx.x; d < dim; d += blockDim.x) dst[d] = src[d];
    }
}

__global__ void scatter_rows_kernel(float *out, const float *y, const int32_t *dest, const float *scale, int n, int dim)
{
    for (int i = blockIdx.x; i < n; i += gridDim.x) {
        const float *src = y + (size_t)i * (size_t)dim;
        float *dst = out + (size_t)dest[i] * (size_t)dim, s = scale[i];
        for (int d = threadIdx.x; d < dim; d += blockDim.x) dst[d] = __fmul_rn(src[d], s);
    }
}

__global__ void moe_combine_kernel(float *x, const float *y, int n, int k, int dim)
{
    for (int t = blockIdx.x; t < n; t += gridDim.x) {
        const float *src = y + (size_t)t * (size_t)k * (size_t)dim;
        float *dst = x + (size_t)t * (size_t)dim;
        for (int d = threadIdx.x; d < dim; d += blockDim.x) {
            float sum = src[d];
            for (int j = 1; j < k; j++) sum += src[(size_t)j * (size_t)dim + d];
            dst[d] += sum;
        }
    }
}

static unsigned row_blocks(int n) { return n < 65535 ? (unsigned)n : 65535u; }
static unsigned row_threads(int dim) { return dim >= 256 ? 256u : (unsigned)((dim + 31) / 32 * 32); }

void cuda_gather_rows(cuda_ctx *cx, float *out, const float *x, const int32_t *rows, int n, int dim)
{
    if (n <= 0 || dim <= 0) return;
    gather_rows_kernel<<<row_blocks(n), row_threads(dim), 0, cx->compute>>>(out, x, rows, n, dim);
    CUDA_CHECK_LAUNCH("gather_rows_kernel");
}

void cuda_scatter_rows(cuda_ctx *cx, float *out, const float *y, const int32_t *dest, const float *scale, int n,
                       int dim)
{
    if (n <= 0 || dim <= 0) return;
    scatter_rows_kernel<<<row_blocks(n), row_threads(dim), 0, cx->compute>>>(out, y, dest, scale, n, dim);
    CUDA_CHECK_LAUNCH("scatter_rows_kernel");
}

void cuda_moe_combine(cuda_ctx *cx, float *x, const float *y, int n, int k, int dim)
{
    if (n <= 0 || dim <= 0) return;
    moe_combine_kernel<<<row_blocks(n), row_threads(dim), 0, cx->compute>>>(x, y, n, k, dim);
    CUDA_CHECK_LAUNCH("moe_combine_kernel");
}
