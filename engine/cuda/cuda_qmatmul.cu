/*
 * cuda_qmatmul.cu - y = x W^T (+ b) for weight-only quantized W: int8 with
 * per-row scales or int4 in int32 words of 8 nibbles (q + 8) with group-wise
 * scales (backend.h has the layouts), x and y f32, f32 accumulation.
 * UNTESTED: written and compiled without a GPU; `test_ops cuda` (make
 * test-gpu) compares it with a double-precision reference on a GPU host.
 *
 * Decode (n <= QGEMV_MAX_TOKENS) is bound by the bytes of W, which is why W
 * is quantized: a warp handles R rows, each lane reads 16 bytes of each row
 * per step (a warp's loads of a row are 512 contiguous bytes), widens them
 * in registers - int8 by sign extension, int4 by shift and mask, minus the
 * +8 - multiplies by the group's scale (a 16-byte chunk never straddles two
 * groups on this path) and applies the values to all n token rows; a warp
 * sum finishes each row. Rows, pointers or groups that do not fit 16-byte
 * chunks take an element-at-a-time variant of the same kernel.
 *
 * Prefill is bound by arithmetic: W is dequantized tile by tile (as many
 * rows as fit the matmul scratch mm_x) into f32, which is exact for int8 and
 * int4 times an f16/bf16 scale, and multiplied by cuBLASLt's SGEMM (f32
 * compute, no TF32) into mm_y; a small kernel scatters the tile's columns
 * into y and adds the bias. One pass over W, one SGEMM per tile and chunk of
 * tokens. Where cuBLASLt has no algorithm the tile goes through the GEMV.
 *
 * A GGUF file's blocks (CUDA_Q_GGUF, cuda_gguf.cuh) take the prefill path
 * for every token count: tiles dequantized to f32 exactly as the reference
 * dequantizers compute them, SGEMM, scatter (a plain dot-product kernel
 * where cuBLASLt has no algorithm). Correct, not yet fast for decode (it
 * writes and reads the f32 tile); UNTESTED like the rest of this file.
 */
#include "cuda_common.cuh"
#include "cuda_gguf.cuh"

#define QGEMV_MAX_TOKENS 8
#define QGEMV_WARPS 4 /* warps per block */

/* q(row, c) as a signed integer; row points at the row's packed bytes */
template <int QT>
__device__ __forceinline__ int q_at(const uint8_t *row, int64_t c)
{
    if (QT == CUDA_Q_INT8) return (int)((const int8_t *)row)[c];
    return (int)((row[c >> 1] >> (4 * (c & 1))) & 15) - 8;
}

/* element e of a 32-bit word of packed values (4 int8 or 8 int4) */
template <int QT>
__device__ __forceinline__ float q_of_word(uint32_t word, int e)
{
    if (QT == CUDA_Q_INT8) return (float)(int8_t)(word >> (8 * e));
    return (float)((int)((word >> (4 * e)) & 15u) - 8);
}

/* A quantized weight as the kernels read it: rows of row_bytes, scales
 * [rows, n_groups] of dtype SDT; `rows` may be a tile of a larger weight. */
struct qweight {
    const uint8_t *data;
    const void *scales;
    int64_t rows, cols, row_bytes, n_groups;
    int group;
};

/* ---- decode: GEMV ----------------------------------------------------------------- */

/* out[t * ldo + r] = sum_c W[r, c] x[t, c] (+ b[r]) for t < n <= NT, a warp
 * per R rows. VEC: 16-byte chunks (4 words: 16 int8 or 32 int4 values), all
 * inside one group, rows and x 16-byte aligned, cols a multiple of the chunk. */
template <int QT, int SDT, int NT, int R, bool VEC>
__global__ void __launch_bounds__(QGEMV_WARPS * 32)
qgemv_kernel(float *out, int64_t ldo, const float *x, qweight w, const void *bias, int bias_dt, int n)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int64_t r0 = ((int64_t)blockIdx.x * QGEMV_WARPS + warp) * R;
    if (r0 >= w.rows) return;
    int nr = w.rows - r0 < R ? (int)(w.rows - r0) : R; /* the same for the whole warp */
    float acc[R][NT];
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[i][t] = 0.0f;
    if (VEC) {
        constexpr int EPW = QT == CUDA_Q_INT8 ? 4 : 8; /* values per 32-bit word */
        constexpr int V = 4 * EPW;                     /* values per 16-byte chunk */
        for (int64_t k = (int64_t)lane * V; k < w.cols; k += 32 * V) {
            uint4 raw[R];
            float s[R];
            int64_t g = k / w.group;
#pragma unroll
            for (int i = 0; i < R; i++) {
                if (i < nr) {
                    raw[i] = __ldg((const uint4 *)(w.data + (r0 + i) * w.row_bytes + k / V * 16));
                    s[i] = cuda_load_f32<SDT>(w.scales, (size_t)((r0 + i) * w.n_groups + g));
                } else {
                    raw[i] = make_uint4(0, 0, 0, 0);
                    s[i] = 0.0f;
                }
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                float wf[R][EPW];
#pragma unroll
                for (int i = 0; i < R; i++) {
                    uint32_t word = u == 0 ? raw[i].x : u == 1 ? raw[i].y : u == 2 ? raw[i].z : raw[i].w;
#pragma unroll
                    for (int e = 0; e < EPW; e++) wf[i][e] = q_of_word<QT>(word, e) * s[i];
                }
                cuda_gemv_fma(acc, wf, x, (size_t)w.cols, (size_t)(k + u * EPW), n);
            }
        }
    } else {
        for (int64_t k = lane; k < w.cols; k += 32) {
            float wv[R];
            int64_t g = k / w.group;
#pragma unroll
            for (int i = 0; i < R; i++)
                wv[i] = i < nr ? (float)q_at<QT>(w.data + (r0 + i) * w.row_bytes, k) *
                                     cuda_load_f32<SDT>(w.scales, (size_t)((r0 + i) * w.n_groups + g))
                               : 0.0f;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < n) {
                    float xv = x[(size_t)t * (size_t)w.cols + (size_t)k];
#pragma unroll
                    for (int i = 0; i < R; i++) acc[i][t] = fmaf(wv[i], xv, acc[i][t]);
                }
            }
        }
    }
    cuda_gemv_store(acc, nr, r0, n, bias, bias_dt, out, (size_t)ldo, lane);
}

template <int QT, int SDT, int NT>
static void qgemv_launch(cuda_ctx *cx, float *out, int64_t ldo, const float *x, const qweight &w, const void *bias,
                         int bias_dt, int n)
{
    constexpr int64_t V = QT == CUDA_Q_INT8 ? 16 : 32;
    constexpr int R = NT >= 4 ? 4 : 2;
    bool vec = (uintptr_t)w.data % 16 == 0 && w.row_bytes % 16 == 0 && (uintptr_t)x % 16 == 0 && w.cols % V == 0 &&
               (w.group % V == 0 || w.group >= w.cols);
    int64_t per_block = (int64_t)QGEMV_WARPS * R;
    unsigned blocks = (unsigned)((w.rows + per_block - 1) / per_block);
    if (vec)
        qgemv_kernel<QT, SDT, NT, R, true><<<blocks, QGEMV_WARPS * 32, 0, cx->compute>>>(out, ldo, x, w, bias, bias_dt, n);
    else
        qgemv_kernel<QT, SDT, NT, R, false><<<blocks, QGEMV_WARPS * 32, 0, cx->compute>>>(out, ldo, x, w, bias, bias_dt, n);
    CUDA_CHECK_LAUNCH("qgemv_kernel");
}

/* Any number of token rows, QGEMV_MAX_TOKENS at a time. */
template <int QT, int SDT>
static void qgemv(cuda_ctx *cx, float *out, int64_t ldo, const float *x, const qweight &w, const void *bias,
                  int bias_dt, int n)
{
    for (int t0 = 0; t0 < n; t0 += QGEMV_MAX_TOKENS) {
        int c = n - t0 < QGEMV_MAX_TOKENS ? n - t0 : QGEMV_MAX_TOKENS;
        float *o = out + (size_t)t0 * (size_t)ldo;
        const float *xt = x + (size_t)t0 * (size_t)w.cols;
        if (c == 1) qgemv_launch<QT, SDT, 1>(cx, o, ldo, xt, w, bias, bias_dt, c);
        else if (c == 2) qgemv_launch<QT, SDT, 2>(cx, o, ldo, xt, w, bias, bias_dt, c);
        else if (c <= 4) qgemv_launch<QT, SDT, 4>(cx, o, ldo, xt, w, bias, bias_dt, c);
        else qgemv_launch<QT, SDT, 8>(cx, o, ldo, xt, w, bias, bias_dt, c);
    }
}

/* ---- prefill: dequantize a tile, SGEMM, scatter ------------------------------------ */

/* dst [w.rows, cols] f32 = the tile's values */
template <int QT, int SDT>
__global__ void dequant_kernel(float *dst, qweight w)
{
    size_t count = (size_t)w.rows * (size_t)w.cols;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        int64_t r = (int64_t)(i / (size_t)w.cols), c = (int64_t)(i % (size_t)w.cols);
        dst[i] = (float)q_at<QT>(w.data + r * w.row_bytes, c) *
                 cuda_load_f32<SDT>(w.scales, (size_t)(r * w.n_groups + c / w.group));
    }
}

/* out[t, r0 + j] = y[t, j] (+ b[r0 + j]) for t < n, j < tr; y [n, tr] */
__global__ void scatter_kernel(float *out, int64_t ldo, int64_t r0, const float *y, int64_t tr, size_t n,
                               const void *bias, int bias_dt)
{
    size_t count = n * (size_t)tr;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / (size_t)tr, j = i % (size_t)tr;
        float b = bias ? cuda_load_f32_dyn(bias_dt, bias, (size_t)r0 + j) : 0.0f;
        out[t * (size_t)ldo + (size_t)r0 + j] = y[i] + b;
    }
}

/* The prefill loop every quantized format shares: tiles of as many rows as
 * fit mm_x, each dequantized by dequant(wf, r0, tr), multiplied by
 * cuBLASLt's SGEMM into mm_y in chunks of tokens and scattered into out
 * with the bias; where cuBLASLt has no algorithm, fallback(ot, xt, r0, tr,
 * c) writes the tile's rows of out itself. */
template <typename Dequant, typename Fallback>
static void tile_gemm(cuda_ctx *cx, float *out, const float *x, int64_t rows, int64_t cols, const void *bias,
                      int bias_dt, int n, Dequant dequant, Fallback fallback)
{
    int64_t tile = (int64_t)(cx->mm_x_bytes / ((size_t)cols * sizeof(float)));
    CUDA_REQUIRE(tile >= 1);
    if (tile > rows) tile = rows;
    float *wf = (float *)cx->mm_x;
    for (int64_t r0 = 0; r0 < rows; r0 += tile) {
        int64_t tr = rows - r0 < tile ? rows - r0 : tile;
        size_t chunk = cx->mm_y_bytes / ((size_t)tr * sizeof(float));
        CUDA_REQUIRE(chunk >= 1);
        dequant(wf, r0, tr);
        for (size_t t0 = 0; t0 < (size_t)n; t0 += chunk) {
            size_t c = (size_t)n - t0 < chunk ? (size_t)n - t0 : chunk;
            const float *xt = x + t0 * (size_t)cols;
            float *ot = out + t0 * (size_t)rows;
            if (!cuda_lt_sgemm(cx, cx->mm_y, wf, xt, tr, (int64_t)c, cols)) {
                fallback(ot, xt, r0, tr, c);
                continue;
            }
            scatter_kernel<<<cuda_blocks(c * (size_t)tr, 256), 256, 0, cx->compute>>>(ot, rows, r0, cx->mm_y, tr, c,
                                                                                     bias, bias_dt);
            CUDA_CHECK_LAUNCH("scatter_kernel");
        }
    }
}

template <int QT, int SDT>
static void qgemm(cuda_ctx *cx, float *out, const float *x, const qweight &w, const void *bias, int bias_dt, int n)
{
    auto tile_of = [&](int64_t r0, int64_t tr) {
        qweight t = w;
        t.data = w.data + r0 * w.row_bytes;
        t.scales = (const char *)w.scales + (size_t)(r0 * w.n_groups) * (SDT == CUDA_F32 ? 4 : 2);
        t.rows = tr;
        return t;
    };
    tile_gemm(
        cx, out, x, w.rows, w.cols, bias, bias_dt, n,
        [&](float *wf, int64_t r0, int64_t tr) {
            size_t count = (size_t)tr * (size_t)w.cols;
            dequant_kernel<QT, SDT><<<cuda_blocks(count, 256), 256, 0, cx->compute>>>(wf, tile_of(r0, tr));
            CUDA_CHECK_LAUNCH("dequant_kernel");
        },
        [&](float *ot, const float *xt, int64_t r0, int64_t tr, size_t c) {
            /* the GEMV writes the tile's rows of out itself: bias from row r0 on */
            const void *tb = bias ? (const char *)bias + (size_t)r0 * (bias_dt == CUDA_F32 ? 4 : 2) : NULL;
            qgemv<QT, SDT>(cx, ot + r0, w.rows, xt, tile_of(r0, tr), tb, bias_dt, (int)c);
        });
}

/* ---- GGUF blocks ------------------------------------------------------------------- */

/* dst [rows, cols] f32 = rows of blocks of `type` (row_bytes apart) */
__global__ void gguf_dequant_kernel(float *dst, const uint8_t *data, int64_t rows, int64_t cols, int64_t row_bytes,
                                    uint32_t type)
{
    size_t count = (size_t)rows * (size_t)cols;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        int64_t r = (int64_t)(i / (size_t)cols), c = (int64_t)(i % (size_t)cols);
        dst[i] = cuda_gguf_at(type, data + r * row_bytes, c);
    }
}

/* out[t * ldo + r0 + j] = sum_c wf[j, c] x[t, c] (+ b[r0 + j]): where cuBLASLt has no algorithm */
__global__ void tile_dot_kernel(float *out, int64_t ldo, int64_t r0, const float *wf, const float *x, int64_t tr,
                                int64_t cols, size_t n, const void *bias, int bias_dt)
{
    size_t count = n * (size_t)tr;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / (size_t)tr, j = i % (size_t)tr;
        float s = 0;
        for (int64_t c = 0; c < cols; c++) s = fmaf(wf[j * (size_t)cols + (size_t)c], x[t * (size_t)cols + (size_t)c], s);
        out[t * (size_t)ldo + (size_t)r0 + j] = s + (bias ? cuda_load_f32_dyn(bias_dt, bias, (size_t)r0 + j) : 0.0f);
    }
}

static void gguf_gemm(cuda_ctx *cx, float *out, const float *x, const cuda_tensor *w, const void *bias, int bias_dt,
                      int n)
{
    int be, bb;
    cuda_gguf_block(w->block, &be, &bb);
    CUDA_REQUIRE(be > 0 && w->cols % be == 0);
    int64_t rows = w->rows, cols = w->cols, row_bytes = cols / be * bb;
    tile_gemm(
        cx, out, x, rows, cols, bias, bias_dt, n,
        [&](float *wf, int64_t r0, int64_t tr) {
            size_t count = (size_t)tr * (size_t)cols;
            gguf_dequant_kernel<<<cuda_blocks(count, 256), 256, 0, cx->compute>>>(
                wf, (const uint8_t *)w->data + r0 * row_bytes, tr, cols, row_bytes, w->block);
            CUDA_CHECK_LAUNCH("gguf_dequant_kernel");
        },
        [&](float *ot, const float *xt, int64_t r0, int64_t tr, size_t c) {
            tile_dot_kernel<<<cuda_blocks(c * (size_t)tr, 256), 256, 0, cx->compute>>>(
                ot, rows, r0, (const float *)cx->mm_x, xt, tr, cols, c, bias, bias_dt);
            CUDA_CHECK_LAUNCH("tile_dot_kernel");
        });
}

/* ---- entry point ------------------------------------------------------------------- */

template <int QT, int SDT>
static void qmatmul(cuda_ctx *cx, float *out, const float *x, const qweight &w, const void *bias, int bias_dt, int n)
{
    if (n <= QGEMV_MAX_TOKENS) qgemv<QT, SDT>(cx, out, w.rows, x, w, bias, bias_dt, n);
    else qgemm<QT, SDT>(cx, out, x, w, bias, bias_dt, n);
}

void cuda_qmatmul(cuda_ctx *cx, float *out, const float *x, const cuda_tensor *w, const cuda_tensor *bias, int n)
{
    if (w->quant == CUDA_Q_GGUF) {
        gguf_gemm(cx, out, x, w, bias ? bias->data : NULL, bias ? (int)bias->dt : 0, n);
        return;
    }
    CUDA_REQUIRE(w->group >= 1 && w->scales != NULL);
    qweight q;
    q.data = (const uint8_t *)w->data;
    q.scales = w->scales;
    q.rows = w->rows;
    q.cols = w->cols;
    q.row_bytes = w->quant == CUDA_Q_INT8 ? w->cols : 4 * ((w->cols + 7) / 8);
    q.n_groups = (w->cols + w->group - 1) / w->group;
    q.group = w->group;
    const void *b = bias ? bias->data : NULL;
    int bdt = bias ? (int)bias->dt : 0;
    if (w->quant == CUDA_Q_INT8) CUDA_DISPATCH_DT(w->scale_dt, SDT, qmatmul<CUDA_Q_INT8, SDT>(cx, out, x, q, b, bdt, n));
    else CUDA_DISPATCH_DT(w->scale_dt, SDT, qmatmul<CUDA_Q_INT4, SDT>(cx, out, x, q, b, bdt, n));
}
