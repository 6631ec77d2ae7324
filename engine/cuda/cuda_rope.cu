/*
 * cuda_rope.cu - RoPE, Hugging Face rotate_half: the pair (i, i + hd/2) of
 * every head rotates by pos * inv_freq[i], inv_freq[i] = theta^(-2i/hd).
 *
 * inv_freq is computed on the host with the CPU backend's float32
 * expression (1.0f / powf(theta, 2i/hd), glibc's powf) and cached per
 * (theta, head_dim): the device powf may differ by an ulp, which at
 * position 500 is already a 1e-4 error in the angle. The angle is then
 * pos * inv_freq in float and its cos/sin are taken in double and rounded,
 * as on the CPU (and in transformers).
 */
#include <math.h>

#include "cuda_common.cuh"

/* grid: (token, head); threads over the half head */
__global__ void rope_kernel(float *x, const int32_t *pos, const float *inv_freq, int n_tokens, int heads, int head_dim)
{
    int half = head_dim / 2;
    for (int t = blockIdx.x; t < n_tokens; t += gridDim.x) {
        float p = (float)pos[t];
        float *v = x + ((size_t)t * (size_t)heads + blockIdx.y) * (size_t)head_dim;
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            float ang = p * inv_freq[i];
            float c = (float)cos((double)ang), s = (float)sin((double)ang);
            float a = v[i], b = v[half + i];
            v[i] = a * c - b * s;
            v[half + i] = b * c + a * s;
        }
    }
}

static const float *rope_table(cuda_ctx *cx, float theta, int head_dim)
{
    for (int i = 0; i < cx->n_rope; i++)
        if (cx->rope[i].theta == theta && cx->rope[i].head_dim == head_dim) return cx->rope[i].inv_freq;
    /* a model has one (theta, head_dim); the cache only grows with tests */
    CUDA_REQUIRE(cx->n_rope < CUDA_ROPE_TABLES);
    int half = head_dim / 2;
    float *host = (float *)malloc((size_t)half * sizeof(float));
    CUDA_REQUIRE(host != NULL);
    for (int i = 0; i < half; i++) host[i] = 1.0f / powf(theta, (float)(2 * i) / (float)head_dim);
    float *dev = NULL;
    CUDA_CHECK(cudaMalloc((void **)&dev, (size_t)half * sizeof(float)));
    CUDA_CHECK(cudaMemcpyAsync(dev, host, (size_t)half * sizeof(float), cudaMemcpyHostToDevice, cx->compute));
    CUDA_CHECK(cudaStreamSynchronize(cx->compute)); /* host is freed next */
    free(host);
    cx->rope[cx->n_rope++] = (cuda_rope_table){theta, head_dim, dev};
    return dev;
}

void cuda_rope(cuda_ctx *cx, float *x, int heads, int head_dim, float theta)
{
    if (cx->n_tokens == 0 || heads == 0) return;
    CUDA_REQUIRE(head_dim % 2 == 0 && heads <= 65535);
    const float *inv_freq = rope_table(cx, theta, head_dim);
    unsigned threads = (unsigned)((head_dim / 2 + 31) / 32 * 32);
    if (threads > 256) threads = 256;
    dim3 grid(cx->n_tokens < 65535 ? (unsigned)cx->n_tokens : 65535u, (unsigned)heads);
    rope_kernel<<<grid, threads, 0, cx->compute>>>(x, cx->d_pos, inv_freq, cx->n_tokens, heads, head_dim);
    CUDA_CHECK_LAUNCH("rope_kernel");
}
