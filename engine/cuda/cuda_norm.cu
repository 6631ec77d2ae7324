/*
 * cuda_norm.cu - RMSNorm: out = w * (x / sqrt(mean(x^2) + eps)) per row of
 * dim, in f32 with the CPU backend's expression. One block per row; out may
 * be x (the forward pass norms q and k in place, one row per head), which is
 * safe because every thread writes only the elements it read, after the
 * block's sum is complete.
 */
#include "cuda_common.cuh"

template <int DT>
__global__ void rmsnorm_kernel(float *out, const float *x, const void *w, int n, int dim, float eps)
{
    __shared__ float red[32];
    for (int r = blockIdx.x; r < n; r += gridDim.x) {
        const float *xr = x + (size_t)r * (size_t)dim;
        float *o = out + (size_t)r * (size_t)dim;
        float ss = 0;
        for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
        ss = cuda_block_sum(ss, red);
        float inv = 1.0f / sqrtf(ss / (float)dim + eps);
        for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = cuda_load_f32<DT>(w, (size_t)i) * (xr[i] * inv);
    }
}

void cuda_rmsnorm(cuda_ctx *cx, float *out, const float *x, const cuda_tensor *w, int n, int dim, float eps)
{
    if (n <= 0) return;
    CUDA_REQUIRE(w->cols == dim);
    /* a warp per 32 elements up to 512 threads: per-head rows of 64-256 do
     * not leave most of a large block idle */
    unsigned threads = (unsigned)((dim + 31) / 32 * 32);
    if (threads > 512) threads = 512;
    unsigned blocks = n < 65535 ? (unsigned)n : 65535u;
    CUDA_DISPATCH_DT(w->dt, DT, rmsnorm_kernel<DT><<<blocks, threads, 0, cx->compute>>>(out, x, w->data, n, dim, eps));
    CUDA_CHECK_LAUNCH("rmsnorm_kernel");
}
