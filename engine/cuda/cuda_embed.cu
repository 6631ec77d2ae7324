/*
 * cuda_embed.cu - the embedding gather (table rows of the batch's tokens,
 * device-resident table) and convert (a weight widened to f32: embedding
 * rows the host gathered from a streamed table). Both are exact, a GGUF
 * table's blocks included (cuda_gguf.cuh; that path UNTESTED).
 */
#include "cuda_common.cuh"
#include "cuda_gguf.cuh"

/* grid.x: tokens (grid-stride), threads over the row */
template <int DT>
__global__ void embed_kernel(float *out, const void *table, const int32_t *tokens, int n_tokens, int64_t dim)
{
    for (int t = blockIdx.x; t < n_tokens; t += gridDim.x) {
        size_t src = (size_t)tokens[t] * (size_t)dim;
        float *o = out + (size_t)t * (size_t)dim;
        for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) o[i] = cuda_load_f32<DT>(table, src + (size_t)i);
    }
}

template <int DT>
__global__ void convert_kernel(float *out, const void *w, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = cuda_load_f32<DT>(w, i);
}

/* A GGUF table: row tokens[t] (rows == NULL: row t) of blocks, dequantized */
__global__ void gguf_rows_kernel(float *out, const uint8_t *table, const int32_t *tokens, int n_rows, int64_t dim,
                                 int64_t row_bytes, uint32_t type)
{
    for (int t = blockIdx.x; t < n_rows; t += gridDim.x) {
        const uint8_t *row = table + (size_t)(tokens ? tokens[t] : t) * (size_t)row_bytes;
        float *o = out + (size_t)t * (size_t)dim;
        for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) o[i] = cuda_gguf_at(type, row, i);
    }
}

static void gguf_rows(cuda_ctx *cx, float *out, const cuda_tensor *w, const int32_t *tokens, int n_rows)
{
    int be, bb;
    cuda_gguf_block(w->block, &be, &bb);
    CUDA_REQUIRE(be > 0 && w->cols % be == 0);
    unsigned blocks = n_rows < 65535 ? (unsigned)n_rows : 65535u;
    gguf_rows_kernel<<<blocks, 256, 0, cx->compute>>>(out, (const uint8_t *)w->data, tokens, n_rows, w->cols,
                                                       w->cols / be * bb, w->block);
    CUDA_CHECK_LAUNCH("gguf_rows_kernel");
}

void cuda_embed(cuda_ctx *cx, float *out, const cuda_tensor *table)
{
    int n = cx->n_tokens;
    if (n == 0) return;
    if (table->quant == CUDA_Q_GGUF) {
        gguf_rows(cx, out, table, cx->d_tokens, n);
        return;
    }
    unsigned blocks = n < 65535 ? (unsigned)n : 65535u;
    CUDA_DISPATCH_DT(table->dt, DT,
                     embed_kernel<DT><<<blocks, 256, 0, cx->compute>>>(out, table->data, cx->d_tokens, n, table->cols));
    CUDA_CHECK_LAUNCH("embed_kernel");
}

void cuda_convert(cuda_ctx *cx, float *out, const cuda_tensor *w)
{
    size_t n = (size_t)w->rows * (size_t)w->cols;
    if (n == 0) return;
    if (w->quant == CUDA_Q_GGUF) {
        gguf_rows(cx, out, w, NULL, (int)w->rows);
        return;
    }
    CUDA_DISPATCH_DT(w->dt, DT, convert_kernel<DT><<<cuda_blocks(n, 256), 256, 0, cx->compute>>>(out, w->data, n));
    CUDA_CHECK_LAUNCH("convert_kernel");
}
