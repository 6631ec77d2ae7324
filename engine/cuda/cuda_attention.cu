/*
 * cuda_attention.cu - causal attention of the batch's query rows against the
 * KV cache in device memory, for prefill and batched decode alike: one block
 * per (token, head), so sequences of any lengths share a launch.
 *
 * Token t of sequence s sits at position p = pos[t] and sees cache rows
 * [lo, p] of KV sequence s.kv_seq (through its block table), lo = 0, or p - window + 1 with a sliding window (a
 * key is visible while p - k < window); query head h reads KV head
 * h / (n_heads / n_kv_heads). kv_store has already written this step's rows,
 * so prefill rows see each other - the CPU backend's semantics.
 *
 * Each of the block's warps walks every ATT_WARPS-th key with an online
 * softmax (running max m, running sum l, output accumulator rescaled when m
 * grows), lanes splitting head_dim; the warps' partial results are merged
 * through shared memory at the end. All f32, expf: numerically stable for
 * any score range, one pass over K and V.
 *
 * Cost: prefill re-reads K/V rows per (token, head) from L2 - fine for the
 * prompt lengths ferry is tested on, quadratic for long prompts (a tiled
 * flash-attention prefill is the upgrade).
 */
#include <math.h>

#include "cuda_common.cuh"

#define ATT_WARPS 4
#define ATT_MAX_HEAD_DIM 256

/* EPL: head_dim elements per lane (head_dim <= 32 * EPL) */
template <int EPL>
__global__ void __launch_bounds__(ATT_WARPS * 32)
attention_kernel(float *out, const float *q, const cuda_kv kv, const int32_t *pos, const int32_t *seq_of,
                 const cuda_seq *seqs, int n_heads, int group, int head_dim, int window, float scale)
{
    extern __shared__ float s_acc[]; /* [ATT_WARPS, head_dim] */
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    int tok = blockIdx.x, h = blockIdx.y;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const cuda_seq *s = &seqs[seq_of[tok]];
    int p = pos[tok];
    int lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
    size_t kv_dim = (size_t)kv.kv_dim, off = (size_t)(h / group) * (size_t)head_dim;
    const float *kb = kv.k + off, *vb = kv.v + off;
    const float *qv = q + ((size_t)tok * (size_t)n_heads + (size_t)h) * (size_t)head_dim;

    float qr[EPL], acc[EPL];
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        int i = lane + 32 * e;
        qr[e] = i < head_dim ? qv[i] : 0.0f;
        acc[e] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int j = lo + warp; j <= p; j += ATT_WARPS) {
        size_t row = cuda_kv_row(kv, s->kv_seq, j) * kv_dim;
        const float *kr = kb + row;
        float d = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            int i = lane + 32 * e;
            if (i < head_dim) d += qr[e] * kr[i];
        }
        d = cuda_warp_sum(d) * scale;
        float m_new = fmaxf(m, d);
        float corr = expf(m - m_new); /* 0 for the first key (m = -inf) */
        float pj = expf(d - m_new);
        l = l * corr + pj;
        const float *vr = vb + row;
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            int i = lane + 32 * e;
            if (i < head_dim) acc[e] = acc[e] * corr + pj * vr[i];
        }
        m = m_new;
    }

    /* merge the warps; a warp that saw no key has m = -inf and weighs 0, and
     * key p is always seen, so the merged max is finite */
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        int i = lane + 32 * e;
        if (i < head_dim) s_acc[warp * head_dim + i] = acc[e];
    }
    __syncthreads();
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++) mx = fmaxf(mx, s_m[w]);
    float wgt[ATT_WARPS], sum = 0.0f;
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++) {
        wgt[w] = s_m[w] == -INFINITY ? 0.0f : expf(s_m[w] - mx);
        sum += s_l[w] * wgt[w];
    }
    float inv = 1.0f / sum;
    float *o = out + ((size_t)tok * (size_t)n_heads + (size_t)h) * (size_t)head_dim;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) v += s_acc[w * head_dim + i] * wgt[w];
        o[i] = v * inv;
    }
}

void cuda_attention(cuda_ctx *cx, float *out, const float *q, const cuda_kv *kv, int n_heads, int n_kv_heads,
                    int head_dim, int sliding_window)
{
    if (cx->n_tokens == 0) return;
    CUDA_REQUIRE(n_kv_heads > 0 && n_heads % n_kv_heads == 0 && n_heads <= 65535);
    CUDA_REQUIRE(head_dim > 0 && head_dim <= ATT_MAX_HEAD_DIM && n_kv_heads * head_dim <= kv->kv_dim);
    dim3 grid((unsigned)cx->n_tokens, (unsigned)n_heads);
    size_t smem = (size_t)ATT_WARPS * (size_t)head_dim * sizeof(float);
    int group = n_heads / n_kv_heads;
    float scale = 1.0f / sqrtf((float)head_dim);
#define ATT_LAUNCH(EPL)                                                                                        \
    attention_kernel<EPL><<<grid, ATT_WARPS * 32, smem, cx->compute>>>(out, q, *kv, cx->d_pos, cx->d_seq_of,    \
                                                                        cx->d_seqs, n_heads, group, head_dim,    \
                                                                        sliding_window, scale)
    if (head_dim <= 32) ATT_LAUNCH(1);
    else if (head_dim <= 64) ATT_LAUNCH(2);
    else if (head_dim <= 128) ATT_LAUNCH(4);
    else ATT_LAUNCH(8);
#undef ATT_LAUNCH
    CUDA_CHECK_LAUNCH("attention_kernel");
}
