/*
 * cuda_elementwise.cu - the light ops: SiLU(gate) x up, the residual add,
 * gather_last (each sequence's last row, for the head) and kv_store (the
 * step's K/V rows into their sequences' rows of the cache). All memory-bound, all in
 * f32 with the CPU backend's expressions (expf and IEEE division: nvcc's
 * defaults, no fast math).
 */
#include "cuda_common.cuh"

__global__ void silu_mul_kernel(float *gate, const float *up, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

/* x and y may be the same buffer */
__global__ void add_kernel(float *x, const float *y, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

/* grid.x: sequences */
__global__ void gather_last_kernel(float *out, const float *x, const cuda_seq *seqs, int n_seqs, int dim)
{
    for (int s = blockIdx.x; s < n_seqs; s += gridDim.x) {
        int last = seqs[s].first + seqs[s].n_tokens - 1;
        const float *src = x + (size_t)last * (size_t)dim;
        float *dst = out + (size_t)s * (size_t)dim;
        for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = src[i];
    }
}

/* grid.x: tokens. Token t of sequence s goes to position n_past + (t - first)
 * of KV sequence s.kv_seq, in the block its table names - the rows kv_store
 * fills on the CPU. */
__global__ void kv_store_kernel(const cuda_kv kv, const float *k, const float *v, const int32_t *seq_of,
                                const cuda_seq *seqs, int n_tokens)
{
    for (int t = blockIdx.x; t < n_tokens; t += gridDim.x) {
        const cuda_seq *s = &seqs[seq_of[t]];
        size_t dst = cuda_kv_row(kv, s->kv_seq, s->n_past + t - s->first) * (size_t)kv.kv_dim;
        size_t src = (size_t)t * (size_t)kv.kv_dim;
        for (int i = threadIdx.x; i < kv.kv_dim; i += blockDim.x) {
            kv.k[dst + i] = k[src + i];
            kv.v[dst + i] = v[src + i];
        }
    }
}

void cuda_silu_mul(cuda_ctx *cx, float *gate, const float *up, size_t n)
{
    if (n == 0) return;
    silu_mul_kernel<<<cuda_blocks(n, 256), 256, 0, cx->compute>>>(gate, up, n);
    CUDA_CHECK_LAUNCH("silu_mul_kernel");
}

void cuda_add(cuda_ctx *cx, float *x, const float *y, size_t n)
{
    if (n == 0) return;
    add_kernel<<<cuda_blocks(n, 256), 256, 0, cx->compute>>>(x, y, n);
    CUDA_CHECK_LAUNCH("add_kernel");
}

void cuda_gather_last(cuda_ctx *cx, float *out, const float *x, int dim)
{
    if (cx->n_seqs == 0) return;
    unsigned blocks = cx->n_seqs < 65535 ? (unsigned)cx->n_seqs : 65535u;
    gather_last_kernel<<<blocks, 256, 0, cx->compute>>>(out, x, cx->d_seqs, cx->n_seqs, dim);
    CUDA_CHECK_LAUNCH("gather_last_kernel");
}

void cuda_kv_store(cuda_ctx *cx, const cuda_kv *kv, const float *k, const float *v)
{
    if (cx->n_tokens == 0) return;
    unsigned blocks = cx->n_tokens < 65535 ? (unsigned)cx->n_tokens : 65535u;
    unsigned threads = kv->kv_dim >= 256 ? 256u : (unsigned)((kv->kv_dim + 31) / 32 * 32);
    kv_store_kernel<<<blocks, threads, 0, cx->compute>>>(*kv, k, v, cx->d_seq_of, cx->d_seqs, cx->n_tokens);
    CUDA_CHECK_LAUNCH("kv_store_kernel");
}
