/*
 * cuda_matmul.cu - y = x W^T (+ b): W [rows, cols] in F32/F16/BF16, x and y
 * f32 row-major, f32 accumulation everywhere. Two paths:
 *
 * Decode (n <= GEMV_MAX_TOKENS token rows) is bound by the bytes of W: a
 * GEMV kernel reads every weight row once (a warp per 2-4 rows, 16-byte
 * loads), widens it in registers and applies it to all n f32 token rows. x is never
 * rounded, so this path matches the CPU backend to f32 rounding.
 *
 * Prefill and large batches go through cuBLASLt with A = W in its own dtype,
 * B = x in the same dtype and CUBLAS_COMPUTE_32F (A bf16 with B f32 is not a
 * combination cuBLASLt offers). Rounding x to 16 bits would cost ~3 decimal
 * digits (2^-9 relative for bf16), so x is split into two 16-bit halves,
 * x = hi + lo with hi = round(x), lo = round(x - hi), and both go into one
 * GEMM as 2n columns; a small kernel adds the two partial products (and the
 * bias). What x loses is |x - hi - lo| <= 2^-18 |x| for bf16; for f16 lo is
 * stored scaled by 1024 (else small remainders fall into f16's subnormals:
 * 6e-5 relative at |x| = 1e-3), giving ~2^-22 |x| down to |x| ~ 1e-3 (f16
 * halves saturate at +-65504: activations beyond ~1.3e5 are clipped; NaN
 * stays NaN). All of this is untested on a GPU. At the price of twice the arithmetic of a plain GEMM but one
 * pass over W. F32 weights take a plain SGEMM (no TF32). Token rows are
 * processed in chunks that fit the scratch allocated at creation.
 *
 * cuBLASLt plans (descriptors, layouts and the heuristic's algorithm) are
 * cached per shape and alignment: the heuristic query costs tens of
 * microseconds, a decode step runs hundreds of matmuls. A shape cuBLASLt has
 * no algorithm for (odd leading dimensions; never a real model's) runs
 * through the GEMV, 8 token rows at a time. Quantized weights go to
 * cuda_qmatmul.cu, whose prefill borrows the SGEMM here (cuda_lt_sgemm).
 */
#include <stdlib.h>

#include "cuda_common.cuh"

#define GEMV_MAX_TOKENS 8
#define GEMV_WARPS 4 /* warps per block */

/* ---- decode: GEMV ------------------------------------------------------------- */

/* 16 bytes of weights at element i (16-byte aligned) as f32: 4 (F32) or 8. */
template <int DT>
__device__ __forceinline__ void load16_f32(const void *base, size_t i, float *f)
{
    constexpr size_t esz = DT == CUDA_F32 ? 4 : 2;
    uint4 raw = __ldg((const uint4 *)((const char *)base + i * esz));
    if (DT == CUDA_F32) {
        f[0] = __uint_as_float(raw.x);
        f[1] = __uint_as_float(raw.y);
        f[2] = __uint_as_float(raw.z);
        f[3] = __uint_as_float(raw.w);
    } else {
        const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (DT == CUDA_BF16) {
                f[2 * j] = __uint_as_float(u[j] << 16);
                f[2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);
            } else {
                __half2 h = *reinterpret_cast<const __half2 *>(&u[j]);
                float2 v = __half22float2(h);
                f[2 * j] = v.x;
                f[2 * j + 1] = v.y;
            }
        }
    }
}

/* One warp per R consecutive weight rows; NT >= n token rows in registers.
 * Each x element loaded serves R rows: with R = 1 the x traffic from L1
 * would be 2 * n times the weight traffic (f32 x, 16-bit W) and cap the
 * decode of a batch of 8 well below memory bandwidth. VEC: W rows and x rows
 * are 16-byte aligned and cols is a multiple of the vector. */
template <int DT, int NT, int R, bool VEC>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_kernel(float *out, const float *x, const void *w, const void *bias, int bias_dt, int n, int64_t rows,
            int64_t cols)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int64_t r0 = ((int64_t)blockIdx.x * GEMV_WARPS + warp) * R;
    if (r0 >= rows) return;
    int nr = rows - r0 < R ? (int)(rows - r0) : R; /* the same for the whole warp */
    float acc[R][NT];
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[i][t] = 0.0f;
    if (VEC) {
        constexpr int V = DT == CUDA_F32 ? 4 : 8;
#pragma unroll 2
        for (int64_t k = (int64_t)lane * V; k < cols; k += 32 * V) {
            float wf[R][V];
#pragma unroll
            for (int i = 0; i < R; i++) {
                if (i < nr) {
                    load16_f32<DT>(w, (size_t)(r0 + i) * (size_t)cols + (size_t)k, wf[i]);
                } else {
#pragma unroll
                    for (int v = 0; v < V; v++) wf[i][v] = 0.0f;
                }
            }
            cuda_gemv_fma(acc, wf, x, (size_t)cols, (size_t)k, n);
        }
    } else {
        for (int64_t k = lane; k < cols; k += 32) {
            float wv[R];
#pragma unroll
            for (int i = 0; i < R; i++) wv[i] = i < nr ? cuda_load_f32<DT>(w, (size_t)(r0 + i) * (size_t)cols + (size_t)k) : 0.0f;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < n) {
                    float xv = x[(size_t)t * (size_t)cols + (size_t)k];
#pragma unroll
                    for (int i = 0; i < R; i++) acc[i][t] = fmaf(wv[i], xv, acc[i][t]);
                }
            }
        }
    }
    cuda_gemv_store(acc, nr, r0, n, bias, bias_dt, out, (size_t)rows, lane);
}

template <int DT, int NT>
static void gemv_launch(cuda_ctx *cx, float *out, const float *x, const cuda_tensor *w, const cuda_tensor *bias, int n)
{
    constexpr int64_t V = DT == CUDA_F32 ? 4 : 8;
    constexpr int R = NT >= 4 ? 4 : 2;
    bool vec = (uintptr_t)w->data % 16 == 0 && (uintptr_t)x % 16 == 0 && w->cols % V == 0;
    int64_t per_block = (int64_t)GEMV_WARPS * R;
    unsigned blocks = (unsigned)((w->rows + per_block - 1) / per_block);
    const void *b = bias ? bias->data : NULL;
    int bdt = bias ? (int)bias->dt : 0;
    if (vec)
        gemv_kernel<DT, NT, R, true><<<blocks, GEMV_WARPS * 32, 0, cx->compute>>>(out, x, w->data, b, bdt, n, w->rows,
                                                                                 w->cols);
    else
        gemv_kernel<DT, NT, R, false><<<blocks, GEMV_WARPS * 32, 0, cx->compute>>>(out, x, w->data, b, bdt, n, w->rows,
                                                                                  w->cols);
    CUDA_CHECK_LAUNCH("gemv_kernel");
}

template <int DT>
static void gemv(cuda_ctx *cx, float *out, const float *x, const cuda_tensor *w, const cuda_tensor *bias, int n)
{
    if (n == 1) gemv_launch<DT, 1>(cx, out, x, w, bias, n);
    else if (n == 2) gemv_launch<DT, 2>(cx, out, x, w, bias, n);
    else if (n <= 4) gemv_launch<DT, 4>(cx, out, x, w, bias, n);
    else gemv_launch<DT, 8>(cx, out, x, w, bias, n);
}

/* Any number of token rows through the GEMV, GEMV_MAX_TOKENS at a time:
 * the fallback for shapes cuBLASLt has no algorithm for (correct, slower). */
template <int DT>
static void gemv_rows(cuda_ctx *cx, float *out, const float *x, const cuda_tensor *w, const cuda_tensor *bias, size_t n)
{
    for (size_t t0 = 0; t0 < n; t0 += GEMV_MAX_TOKENS) {
        int c = n - t0 < GEMV_MAX_TOKENS ? (int)(n - t0) : GEMV_MAX_TOKENS;
        gemv<DT>(cx, out + t0 * (size_t)w->rows, x + t0 * (size_t)w->cols, w, bias, c);
    }
}

/* ---- prefill: split x, cuBLASLt, combine -------------------------------------------- */

/* hi = round(x), lo = round(x - hi), both 16-bit of dtype DT:
 * xs[0 .. n*cols) = hi rows, xs[n*cols .. 2*n*cols) = lo rows */
#define F16_LO_SCALE 1024.0f

template <int DT>
__global__ void split_kernel(void *xs, const float *x, size_t count)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        float v = x[i];
        if (DT == CUDA_BF16) {
            __nv_bfloat16 hi = __float2bfloat16_rn(v);
            ((__nv_bfloat16 *)xs)[i] = hi;
            ((__nv_bfloat16 *)xs)[count + i] = __float2bfloat16_rn(v - __bfloat162float(hi));
        } else {
            /* lo is scaled by F16_LO_SCALE so that small remainders stay out
             * of f16's subnormal range (|rest| <= 32 after the clamp, so
             * rest * 1024 still fits); combine_kernel divides it back. A NaN
             * stays a NaN instead of clamping to a finite value. */
            const float big = 65504.0f; /* largest finite f16 */
            if (isnan(v)) {
                ((__half *)xs)[i] = __float2half_rn(v);
                ((__half *)xs)[count + i] = __float2half_rn(0.0f);
                continue;
            }
            __half hi = __float2half_rn(fminf(fmaxf(v, -big), big));
            float rest = v - __half2float(hi);
            ((__half *)xs)[i] = hi;
            ((__half *)xs)[count + i] = __float2half_rn(fminf(fmaxf(rest * F16_LO_SCALE, -big), big));
        }
    }
}

/* out[t, r] = y[t, r] + y[n + t, r] * lo_unscale + b[r] for t < n (y: [2n, rows]) */
__global__ void combine_kernel(float *out, const float *y, const void *bias, int bias_dt, size_t n_rows, int64_t rows,
                               float lo_unscale)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_rows; i += (size_t)gridDim.x * blockDim.x) {
        float b = bias ? cuda_load_f32_dyn(bias_dt, bias, i % (size_t)rows) : 0.0f;
        out[i] = y[i] + y[n_rows + i] * lo_unscale + b;
    }
}

/* out[t, r] += b[r] */
__global__ void bias_add_kernel(float *out, const void *bias, int bias_dt, size_t n_rows, int64_t rows)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_rows; i += (size_t)gridDim.x * blockDim.x)
        out[i] += cuda_load_f32_dyn(bias_dt, bias, i % (size_t)rows);
}

struct cuda_mm_plan {
    cudaDataType_t ab; /* A and B type; C/D are f32 */
    int64_t m, n, k;
    uint32_t align_a, align_b, align_d;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
    bool ok; /* false: cuBLASLt has no algorithm for it (odd leading dimensions) */
};

static uint32_t ptr_align(const void *p)
{
    uint32_t al = 256;
    while (al > 1 && (uintptr_t)p % al) al >>= 1;
    return al;
}

static void plan_destroy(cuda_mm_plan *p)
{
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->a));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->b));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->d));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(p->desc));
}

/* D [m, n] col-major (= out rows-major [n, m]) = A^T B with A the weight
 * stored [k, m] col-major (= W [m, k] row-major), B [k, n] col-major.
 * NULL when cuBLASLt offers no algorithm (remembered, so asked once). */
static const cuda_mm_plan *plan_get(cuda_ctx *cx, cudaDataType_t ab, int64_t m, int64_t n, int64_t k,
                                    const void *a, const void *b, const void *d)
{
    uint32_t aa = ptr_align(a), ab_ = ptr_align(b), ad = ptr_align(d);
    if (!cx->plans) {
        cx->plans = (cuda_mm_plan *)calloc(CUDA_MM_PLANS, sizeof(cuda_mm_plan));
        CUDA_REQUIRE(cx->plans != NULL);
    }
    for (int i = 0; i < cx->n_plans; i++) {
        const cuda_mm_plan *p = &cx->plans[i];
        if (p->ab == ab && p->m == m && p->n == n && p->k == k && p->align_a == aa && p->align_b == ab_ &&
            p->align_d == ad)
            return p->ok ? p : NULL;
    }
    cuda_mm_plan *p;
    if (cx->n_plans < CUDA_MM_PLANS) {
        p = &cx->plans[cx->n_plans++];
    } else {
        p = &cx->plans[cx->plan_evict];
        cx->plan_evict = (cx->plan_evict + 1) % CUDA_MM_PLANS;
        plan_destroy(p);
    }
    p->ab = ab;
    p->m = m;
    p->n = n;
    p->k = k;
    p->align_a = aa;
    p->align_b = ab_;
    p->align_d = ad;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, ab, (uint64_t)k, (uint64_t)m, k));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, ab, (uint64_t)k, (uint64_t)n, k));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, CUDA_R_32F, (uint64_t)m, (uint64_t)n, m));

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = cx->lt_ws_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    /* the heuristic assumes 256-byte aligned pointers unless told */
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab_, sizeof ab_));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof ad));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof ad));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cx->lt, p->desc, p->a, p->b, p->d, p->d, pref, 1, &res, &found);
    if (st != CUBLAS_STATUS_NOT_SUPPORTED) CUBLAS_CHECK(st);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    p->ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
    if (p->ok) p->algo = res.algo;
    return p->ok ? p : NULL;
}

static void lt_matmul(cuda_ctx *cx, const cuda_mm_plan *p, const void *a, const void *b, float *d)
{
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(cx->lt, p->desc, &alpha, a, p->a, b, p->b, &beta, d, p->d, d, p->d, &p->algo,
                                cx->lt_ws, cx->lt_ws_bytes, cx->compute));
}

template <int DT>
static void gemm_split(cuda_ctx *cx, float *out, const float *x, const cuda_tensor *w, const cuda_tensor *bias, int n)
{
    int64_t rows = w->rows, cols = w->cols;
    size_t by_y = cx->mm_y_bytes / (2 * (size_t)rows * sizeof(float));
    size_t by_x = cx->mm_x_bytes / (2 * (size_t)cols * 2);
    size_t chunk = by_y < by_x ? by_y : by_x;
    CUDA_REQUIRE(chunk >= 1);
    cudaDataType_t ab = DT == CUDA_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    const void *b = bias ? bias->data : NULL;
    int bdt = bias ? (int)bias->dt : 0;
    for (size_t t0 = 0; t0 < (size_t)n; t0 += chunk) {
        size_t c = (size_t)n - t0 < chunk ? (size_t)n - t0 : chunk;
        const cuda_mm_plan *p = plan_get(cx, ab, rows, (int64_t)(2 * c), cols, w->data, cx->mm_x, cx->mm_y);
        if (!p) {
            gemv_rows<DT>(cx, out + t0 * (size_t)rows, x + t0 * (size_t)cols, w, bias, c);
            continue;
        }
        size_t count = c * (size_t)cols;
        split_kernel<DT><<<cuda_blocks(count, 256), 256, 0, cx->compute>>>(cx->mm_x, x + t0 * (size_t)cols, count);
        CUDA_CHECK_LAUNCH("split_kernel");
        lt_matmul(cx, p, w->data, cx->mm_x, cx->mm_y);
        size_t n_rows = c * (size_t)rows;
        combine_kernel<<<cuda_blocks(n_rows, 256), 256, 0, cx->compute>>>(out + t0 * (size_t)rows, cx->mm_y, b, bdt,
                                                                         n_rows, rows,
                                                                         DT == CUDA_BF16 ? 1.0f : 1.0f / F16_LO_SCALE);
        CUDA_CHECK_LAUNCH("combine_kernel");
    }
}

bool cuda_lt_sgemm(cuda_ctx *cx, float *d, const float *a, const float *x, int64_t m, int64_t n, int64_t k)
{
    const cuda_mm_plan *p = plan_get(cx, CUDA_R_32F, m, n, k, a, x, d);
    if (!p) return false;
    lt_matmul(cx, p, a, x, d);
    return true;
}

static void gemm_f32(cuda_ctx *cx, float *out, const float *x, const cuda_tensor *w, const cuda_tensor *bias, int n)
{
    if (!cuda_lt_sgemm(cx, out, (const float *)w->data, x, w->rows, n, w->cols)) {
        gemv_rows<CUDA_F32>(cx, out, x, w, bias, (size_t)n);
        return;
    }
    if (bias) {
        size_t n_rows = (size_t)n * (size_t)w->rows;
        bias_add_kernel<<<cuda_blocks(n_rows, 256), 256, 0, cx->compute>>>(out, bias->data, (int)bias->dt, n_rows,
                                                                          w->rows);
        CUDA_CHECK_LAUNCH("bias_add_kernel");
    }
}

/* ---- entry points --------------------------------------------------------------------- */

void cuda_matmul(cuda_ctx *cx, float *out, const float *x, const cuda_tensor *w, const cuda_tensor *bias, int n)
{
    if (n <= 0 || w->rows == 0) return;
    CUDA_REQUIRE(!bias || bias->rows * bias->cols == w->rows);
    if (w->quant != CUDA_Q_NONE) {
        cuda_qmatmul(cx, out, x, w, bias, n);
        return;
    }
    if (n <= GEMV_MAX_TOKENS) {
        CUDA_DISPATCH_DT(w->dt, DT, gemv<DT>(cx, out, x, w, bias, n));
        return;
    }
    switch (w->dt) {
    case CUDA_F32: gemm_f32(cx, out, x, w, bias, n); break;
    case CUDA_F16: gemm_split<CUDA_F16>(cx, out, x, w, bias, n); break;
    case CUDA_BF16: gemm_split<CUDA_BF16>(cx, out, x, w, bias, n); break;
    default: CUDA_REQUIRE(!"weight dtype not computable");
    }
}

void cuda_matmul_free(cuda_ctx *cx)
{
    for (int i = 0; i < cx->n_plans; i++) plan_destroy(&cx->plans[i]);
    free(cx->plans);
    cx->plans = NULL;
    cx->n_plans = 0;
}
