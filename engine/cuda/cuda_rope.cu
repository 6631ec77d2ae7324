/*
 * cuda_rope.cu - RoPE, Hugging Face rotate_half: the pair (i, i + hd/2) of
 * every head rotates by pos * inv_freq[i].
 *
 * inv_freq is the engine's table (weights/rope.h), computed once on the host
 * as transformers computes it and uploaded: a device powf may differ by an
 * ulp, which at position 500 is already a 1e-4 error in the angle. The
 * angle is pos * inv_freq in float and its cos/sin are taken in double and
 * rounded, then multiplied by attn_scale (YaRN's attention factor, 1
 * otherwise), as on the CPU (and in transformers).
 */
#include "cuda_common.cuh"

/* grid: (token, head); threads over the half head */
__global__ void rope_kernel(float *x, const int32_t *pos, const float *inv_freq, float attn_scale, int n_tokens,
                            int heads, int head_dim)
{
    int half = head_dim / 2;
    for (int t = blockIdx.x; t < n_tokens; t += gridDim.x) {
        float p = (float)pos[t];
        float *v = x + ((size_t)t * (size_t)heads + blockIdx.y) * (size_t)head_dim;
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            float ang = p * inv_freq[i];
            float c = (float)cos((double)ang) * attn_scale, s = (float)sin((double)ang) * attn_scale;
            float a = v[i], b = v[half + i];
            v[i] = a * c - b * s;
            v[half + i] = b * c + a * s;
        }
    }
}

void cuda_rope(cuda_ctx *cx, float *x, int heads, int head_dim, const float *inv_freq, float attn_scale)
{
    if (cx->n_tokens == 0 || heads == 0) return;
    CUDA_REQUIRE(head_dim % 2 == 0 && heads <= 65535 && inv_freq != NULL);
    unsigned threads = (unsigned)((head_dim / 2 + 31) / 32 * 32);
    if (threads > 256) threads = 256;
    dim3 grid(cx->n_tokens < 65535 ? (unsigned)cx->n_tokens : 65535u, (unsigned)heads);
    rope_kernel<<<grid, threads, 0, cx->compute>>>(x, cx->d_pos, inv_freq, attn_scale, cx->n_tokens, heads, head_dim);
    CUDA_CHECK_LAUNCH("rope_kernel");
}
