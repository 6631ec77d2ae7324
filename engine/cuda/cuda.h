/*
 * cuda.h - internals shared by the CUDA backend's files: the context every
 * kernel family reads (streams, the step's batch tables, cuBLASLt state and
 * scratch), the error-checking macros, and one entry point per op.
 *
 * The header is C and C++: cuda_backend.c (C, gcc) fills the backend_ops
 * vtable and translates its arguments; the kernel families (*.cu, nvcc, C++)
 * see only this header, not engine/backend.h - the engine's headers are
 * written for C and stay out of the C++ build. A weight crosses over as a
 * cuda_tensor.
 *
 * Uniform signature: every family function is `cuda_<op>(cuda_ctx *cx, ...)`
 * with the op's arguments as in backend.h, queues its work on cx->compute
 * and returns without waiting (but for RoPE's one-time table upload). Errors inside an op abort with the call site
 * (CUDA_CHECK): ops return void, and a failed kernel leaves the stream in a
 * state nothing after it could trust.
 */
#ifndef FERRY_CUDA_H
#define FERRY_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The weight dtypes compute reads; cuda_backend.c maps ferry_dtype. */
typedef enum { CUDA_F32 = 0, CUDA_F16 = 1, CUDA_BF16 = 2 } cuda_dtype;

/* How a weight's values are stored (weights/weight.h's weight_quant). */
typedef enum { CUDA_Q_NONE = 0, CUDA_Q_INT8 = 1, CUDA_Q_INT4 = 2, CUDA_Q_GGUF = 3 } cuda_quant;

typedef struct {
    cuda_dtype dt; /* CUDA_Q_NONE: the values' dtype (a quantized weight's is unused) */
    int64_t rows, cols;
    const void *data; /* device memory; NULL for an absent optional weight */
    /* quantized (matmul only): data packed as backend.h describes, int8
     * [rows, cols] or int4 in int32 words [rows, ceil(cols / 8)]; scales
     * [rows, ceil(cols / group)] in scale_dt, device memory */
    cuda_quant quant;
    int group;
    cuda_dtype scale_dt;
    const void *scales;
    uint32_t block; /* CUDA_Q_GGUF: a GGUF file's blocks of this type as stored (cuda_gguf.cuh), no scales */
} cuda_tensor;

/* One sequence of the batch, as batch_seq (same layout, device-readable). */
typedef struct {
    int32_t kv_seq, n_past, n_tokens, first;
} cuda_seq;

/* One layer of the paged KV cache, as backend.h kv_layer (engine/kv.h):
 * K and V [n_blocks, block_size, kv_dim], table [n_seqs, max_blocks] of
 * block ids in position order, all device memory. */
typedef struct {
    float *k, *v;
    const int32_t *table;
    int max_blocks, block_size, kv_dim;
} cuda_kv;

/* A cached cuBLASLt plan (cuda_matmul.cu owns its contents). */
typedef struct cuda_mm_plan cuda_mm_plan;

#define CUDA_MM_PLANS 64

typedef struct {
    int device;
    cudaStream_t compute; /* every op, upload, download, set_batch's tables */
    cudaStream_t copy;    /* copy_async: the fetcher thread's host -> device copies */

    /* the step's batch (set_batch). Host copies for launch sizes and checks;
     * device tables for the kernels: [tokens n][pos n][seq_of n][seqs 4*n_seqs] */
    int n_tokens, n_seqs;
    cuda_seq *seqs_host; /* [n_seqs] */
    const int32_t *d_tokens, *d_pos, *d_seq_of; /* [n_tokens] */
    const cuda_seq *d_seqs;                     /* [n_seqs] */

    /* matmul: cuBLASLt handle, workspace, and scratch allocated once at
     * creation (so that mem_available already counts them); x split into
     * two 16-bit halves goes to mm_x, the two partial products to mm_y. */
    cublasLtHandle_t lt;
    void *lt_ws;
    size_t lt_ws_bytes;
    void *mm_x; /* [2, chunk, cols] bf16/f16 */
    size_t mm_x_bytes;
    float *mm_y; /* [2, chunk, rows] f32 */
    size_t mm_y_bytes;
    cuda_mm_plan *plans; /* [CUDA_MM_PLANS] */
    int n_plans, plan_evict;
} cuda_ctx;

/* ---- error checks ----------------------------------------------------------- */

/* Prints "ferry: CUDA error at FILE:LINE: CALL: WHAT" and aborts. */
void cuda_check_fail(const char *file, int line, const char *call, const char *what) __attribute__((noreturn));

#define CUDA_CHECK(call)                                                              \
    do {                                                                              \
        cudaError_t e_ = (call);                                                      \
        if (e_ != cudaSuccess) cuda_check_fail(__FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
    } while (0)

#define CUBLAS_CHECK(call)                                                            \
    do {                                                                              \
        cublasStatus_t s_ = (call);                                                   \
        if (s_ != CUBLAS_STATUS_SUCCESS) cuda_check_fail(__FILE__, __LINE__, #call, cublasLtGetStatusString(s_)); \
    } while (0)

/* After every kernel launch: a bad configuration is reported at the launch;
 * a fault while it runs surfaces at the next checked call on the stream. */
#define CUDA_CHECK_LAUNCH(kernel_name)                                                \
    do {                                                                              \
        cudaError_t e_ = cudaGetLastError();                                          \
        if (e_ != cudaSuccess) cuda_check_fail(__FILE__, __LINE__, "launch of " kernel_name, cudaGetErrorString(e_)); \
    } while (0)

/* Aborts with the call site when an op is given what it cannot compute. */
#define CUDA_REQUIRE(cond)                                                            \
    do {                                                                              \
        if (!(cond)) cuda_check_fail(__FILE__, __LINE__, #cond, "requirement not met"); \
    } while (0)

/* ---- the kernel families ------------------------------------------------------ */

/* cuda_embed.cu: table rows of the batch's tokens, widened to f32 */
void cuda_embed(cuda_ctx *cx, float *out /* [n_tokens, dim] */, const cuda_tensor *table /* [vocab, dim] */);
void cuda_convert(cuda_ctx *cx, float *out /* [rows, cols] */, const cuda_tensor *w);

/* cuda_norm.cu: RMSNorm over rows of dim; out may be x (q/k norm per head) */
void cuda_rmsnorm(cuda_ctx *cx, float *out /* [n, dim] */, const float *x /* [n, dim] */,
                  const cuda_tensor *w /* [1, dim] */, int n, int dim, float eps);

/* cuda_rope.cu: rotate_half RoPE in place at the batch's positions, by the
 * angles pos * inv_freq[i], cos and sin times attn_scale */
void cuda_rope(cuda_ctx *cx, float *x /* [n_tokens, heads * head_dim] */, int heads, int head_dim,
               const float *inv_freq /* [head_dim / 2] device */, float attn_scale);

/* cuda_attention.cu: causal (optionally sliding-window) GQA attention of the
 * batch's query rows against the KV cache */
void cuda_attention(cuda_ctx *cx, float *out /* [n_tokens, heads * hd] */, const float *q /* [n_tokens, heads * hd] */,
                    const cuda_kv *kv, int n_heads, int n_kv_heads, int head_dim, int sliding_window);

/* cuda_elementwise.cu */
void cuda_silu_mul(cuda_ctx *cx, float *gate /* [n] */, const float *up /* [n] */, size_t n);
void cuda_add(cuda_ctx *cx, float *x /* [n] */, const float *y /* [n] */, size_t n);
void cuda_gather_last(cuda_ctx *cx, float *out /* [n_seqs, dim] */, const float *x /* [n_tokens, dim] */, int dim);
void cuda_kv_store(cuda_ctx *cx, const cuda_kv *kv, const float *k, const float *v /* [n_tokens, kv_dim] */);

/* cuda_moe.cu: a mixture of experts' row ops (backend.h); rows, dest and
 * scale are device memory */
void cuda_gather_rows(cuda_ctx *cx, float *out /* [n, dim] */, const float *x /* [*, dim] */,
                      const int32_t *rows /* [n] */, int n, int dim);
void cuda_scatter_rows(cuda_ctx *cx, float *out /* [*, dim] */, const float *y /* [n, dim] */,
                       const int32_t *dest /* [n] */, const float *scale /* [n] */, int n, int dim);
void cuda_moe_combine(cuda_ctx *cx, float *x /* [n, dim] */, const float *y /* [n * k, dim] */, int n, int k, int dim);

/* cuda_matmul.cu: y = x W^T (+ b). Sets up / tears down its cuBLASLt state. */
void cuda_matmul(cuda_ctx *cx, float *out /* [n, w.rows] */, const float *x /* [n, w.cols] */,
                 const cuda_tensor *w /* [rows, cols] */, const cuda_tensor *bias /* [1, rows] or NULL */, int n);
void cuda_matmul_free(cuda_ctx *cx);
/* d [n, m] = x [n, k] a^T with a [m, k] f32, cuBLASLt SGEMM (f32 compute, no
 * TF32); false, with nothing queued, when cuBLASLt has no algorithm for it. */
bool cuda_lt_sgemm(cuda_ctx *cx, float *d, const float *a, const float *x, int64_t m, int64_t n, int64_t k);

/* cuda_qmatmul.cu: cuda_matmul for quantized weights (w->quant != CUDA_Q_NONE) */
void cuda_qmatmul(cuda_ctx *cx, float *out /* [n, w.rows] */, const float *x /* [n, w.cols] */,
                  const cuda_tensor *w /* [rows, cols] packed */, const cuda_tensor *bias /* [1, rows] or NULL */,
                  int n);

#ifdef __cplusplus
}
#endif

#endif
