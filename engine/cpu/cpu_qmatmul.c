/*
 * cpu_qmatmul.c - y = x W^T for weight-only quantized W (WQ_INT8, WQ_INT4;
 * backend.h has the layouts), computed from the packed weights: no
 * full-precision copy of W exists at any time. cpu_matmul.c calls in here.
 *
 * cpu_matmul.c sends here the layouts its own kernels (mm_kern.h) do not
 * take: groups that are not whole vector steps (int8: 8 or 16 columns,
 * int4: 16 or 32, by instruction set), decode and prefill alike, 16 token
 * rows at a time (8 lanes, AVX2). Decode is bound by the bytes of W: each
 * packed row is read once, widened to f32 in registers and applied to every
 * token row, with software prefetch of the next rows (a packed row is too
 * short a stream for the hardware prefetcher). Scales are applied once per
 * group rather than per element: the kernel sums q * x over a group, then
 * adds scale * sum to the row's total. Two kernels:
 *   q4kern, int4 with groups of 16k columns: x is split once per call into
 *     even and odd columns so that the low and high nibbles of packed bytes
 *     widen straight into vectors, and the +8 bias leaves the inner loop
 *     (the banner above it says how);
 *   qkern, everything else, in column order (int8: sign-extend, convert;
 *     int4: broadcast a word of 8 nibbles, shift lane j right by 4j, mask,
 *     subtract 8, convert). A group that is not a multiple of 8 columns
 *     (one vector could straddle two groups) takes its per-element-scale
 *     variant: correct, slower, not a layout checkpoints use.
 * cpu_qrow_to_f32 (any layout, every build) backs cpu_row_to_f32 for
 * quantized weights, which the portable build computes with.
 */
#include <string.h>

#include "cpu.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include "simd_sum.h"
#define HAVE_AVX2 1
#endif

/* A quantized weight with its derived sizes, computed once per call. */
typedef struct {
    weight_quant qt;
    const uint8_t *data; /* [rows, row_bytes] */
    size_t row_bytes;
    const void *scales; /* [rows, n_groups] of sdt */
    ferry_dtype sdt;
    size_t cols, group, n_groups;
} qview;

static qview qview_of(const weight *w)
{
    return (qview){w->quant, w->data, weight_row_bytes(w), w->scales, w->scale_dtype,
                   (size_t)w->cols, (size_t)w->group, (size_t)weight_groups(w)};
}

bool cpu_qweight_valid(const weight *w)
{
    bool packing = (w->quant == WQ_INT8 && w->dtype == DT_I8) || (w->quant == WQ_INT4 && w->dtype == DT_I32);
    return packing && w->group >= 1 && dtype_is_compute(w->scale_dtype) && w->scales;
}

static inline float scale_at(const qview *v, size_t r, size_t g)
{
    return cpu_q_scale(v->scales, v->sdt, r * v->n_groups + g);
}

/* q(r, c) of the packed row `row`, as a signed integer. */
static inline int q_at(weight_quant qt, const uint8_t *row, size_t c)
{
    if (qt == WQ_INT8) return ((const int8_t *)row)[c];
    return (int)((row[c / 2] >> (4 * (c % 2))) & 15) - 8;
}

#ifdef HAVE_AVX2

/* Software prefetch distance: the same bytes NR rows on, i.e. the next
 * call's rows. A packed row (2 KiB int4, 4 KiB int8 at 4096 columns) is too
 * short a stream for the hardware prefetcher, which stops at each 4 KiB
 * page and has to learn every new row again. */
#define QPF_AHEAD(NR, v) ((size_t)(NR) * (v)->row_bytes)

/* q(row, k .. k+7) as f32, k a multiple of 8 for int4 (one whole word). */
static inline __attribute__((always_inline)) __m256 deq8(weight_quant qt, const uint8_t *row, size_t k)
{
    if (qt == WQ_INT8)
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + k))));
    int32_t word;
    memcpy(&word, row + k / 2, 4);
    __m256i q = _mm256_srlv_epi32(_mm256_set1_epi32(word), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    q = _mm256_sub_epi32(_mm256_and_si256(q, _mm256_set1_epi32(15)), _mm256_set1_epi32(8));
    return _mm256_cvtepi32_ps(q);
}

/* The scales of columns k .. k+7 of row r, one per element (PE variant). */
static inline __m256 scales8(const qview *v, size_t r, size_t k)
{
    float s[8];
    for (int j = 0; j < 8; j++) s[j] = scale_at(v, r, (k + (size_t)j) / v->group);
    return _mm256_loadu_ps(s);
}

/* acc[i][t] += W[r0 + i, k .. k+7] * x[t, k .. k+7], one step of qkern. */
static inline __attribute__((always_inline)) void qstep(weight_quant qt, bool PE, int NR, int NT, const qview *v,
                                                        size_t r0, const uint8_t *const *row, size_t k, const float *x,
                                                        size_t ldx, __m256 acc[4][4])
{
    __m256 xv[4];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) xv[t] = _mm256_loadu_ps(x + (size_t)t * ldx + k);
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++) {
        __m256 wv = deq8(qt, row[i], k);
        if (PE) wv = _mm256_mul_ps(wv, scales8(v, r0 + (size_t)i, k));
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) acc[i][t] = _mm256_fmadd_ps(wv, xv[t], acc[i][t]);
    }
}

/* out[t * ldo + r0 + i] = sum_k W[r0 + i, k] * x[t * ldx + k] for i < NR,
 * t < NT. PE: scales per element (group % 8 != 0). The group sums live in
 * acc, the row totals in tot: NR * NT <= 4 keeps both in registers. With
 * pf, prefetches the rows NR rows on (QPF_AHEAD). */
static inline __attribute__((always_inline)) void qkern(weight_quant qt, bool PE, int NR, int NT, bool pf,
                                                        const qview *v, size_t r0, const float *x, size_t ldx,
                                                        float *out, size_t ldo)
{
    __m256 tot[4][4], acc[4][4];
    float tail[4][4]; /* the columns after the last multiple of 8 */
    const uint8_t *row[4];
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++) {
        row[i] = v->data + (r0 + (size_t)i) * v->row_bytes;
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            tot[i][t] = _mm256_setzero_ps();
            tail[i][t] = 0;
        }
    }
    /* a span is one group, or the whole row when scales go per element */
    size_t span = PE ? v->cols : v->group, cols = v->cols;
    const size_t line = qt == WQ_INT8 ? 64 : 128; /* columns per cache line */
    for (size_t g0 = 0; g0 < cols; g0 += span) {
        size_t g1 = cols - g0 < span ? cols : g0 + span;
#pragma GCC unroll 4
        for (int i = 0; i < NR; i++)
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) acc[i][t] = _mm256_setzero_ps();
        size_t k = g0;
        if (pf)
            for (; k + line <= g1; k += line) {
#pragma GCC unroll 4
                for (int i = 0; i < NR; i++)
                    _mm_prefetch((const char *)row[i] + QPF_AHEAD(NR, v) + (qt == WQ_INT8 ? k : k / 2), _MM_HINT_T0);
#pragma GCC unroll 16
                for (size_t j = 0; j < line; j += 8) qstep(qt, PE, NR, NT, v, r0, row, k + j, x, ldx, acc);
            }
        for (; k + 8 <= g1; k += 8) qstep(qt, PE, NR, NT, v, r0, row, k, x, ldx, acc);
#pragma GCC unroll 4
        for (int i = 0; i < NR; i++) {
            __m256 s = _mm256_set1_ps(PE ? 1.0f : scale_at(v, r0 + (size_t)i, g0 / v->group));
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) tot[i][t] = _mm256_fmadd_ps(acc[i][t], s, tot[i][t]);
        }
        /* only the row's last span can end off a multiple of 8 */
        for (; k < g1; k++)
            for (int i = 0; i < NR; i++) {
                float w = (float)q_at(qt, row[i], k) * scale_at(v, r0 + (size_t)i, k / v->group);
                for (int t = 0; t < NT; t++) tail[i][t] += w * x[(size_t)t * ldx + k];
            }
    }
    for (int i = 0; i < NR; i++)
        for (int t = 0; t < NT; t++) out[(size_t)t * ldo + r0 + (size_t)i] = hsum8(tot[i][t]) + tail[i][t];
}

/* Rows [r0, r1) for n <= 16 token rows. One token row: 4 weight rows at a
 * time; two: 2 x 2; more: one weight row against chunks of 4 token rows,
 * the row staying in L1 after the first chunk has streamed it in (and
 * prefetched the next). */
static inline __attribute__((always_inline)) void qrows(weight_quant qt, bool PE, const qview *v, size_t r0, size_t r1,
                                                        const float *x, int n, float *out, size_t ldo)
{
    size_t cols = v->cols, r = r0;
    if (n == 1) {
        for (; r + 4 <= r1; r += 4) qkern(qt, PE, 4, 1, true, v, r, x, cols, out, ldo);
        for (; r < r1; r++) qkern(qt, PE, 1, 1, true, v, r, x, cols, out, ldo);
        return;
    }
    if (n == 2) {
        for (; r + 2 <= r1; r += 2) qkern(qt, PE, 2, 2, true, v, r, x, cols, out, ldo);
        for (; r < r1; r++) qkern(qt, PE, 1, 2, true, v, r, x, cols, out, ldo);
        return;
    }
    for (; r < r1; r++)
        for (int t = 0; t < n; t += 4) {
            const float *xt = x + (size_t)t * cols;
            float *ot = out + (size_t)t * ldo;
            switch (n - t < 4 ? n - t : 4) {
            case 1: qkern(qt, PE, 1, 1, t == 0, v, r, xt, cols, ot, ldo); break;
            case 2: qkern(qt, PE, 1, 2, t == 0, v, r, xt, cols, ot, ldo); break;
            case 3: qkern(qt, PE, 1, 3, t == 0, v, r, xt, cols, ot, ldo); break;
            default: qkern(qt, PE, 1, 4, t == 0, v, r, xt, cols, ot, ldo); break;
            }
        }
}

/* ---- int4 decode on de-interleaved x ---------------------------------------
 * Widening int4 in column order costs ~5 vector ops per 8 values (broadcast
 * a word, variable shift, mask, -8, convert), which made the kernel compute-
 * bound at a third of the memory bandwidth. Here 8 packed bytes (16 columns)
 * are zero-extended to 8 lanes in one op; the low nibbles (mask) are the
 * even columns, the high nibbles (shift) the odd ones, so each widened
 * vector meets a contiguous vector of x if x is split the same way: once per
 * call, each chunk of 16 columns of x is stored as its 8 even then its 8 odd
 * columns (q4_split_x; cols floats per token, nothing next to the weights).
 * The +8 bias is folded out of the inner loop: sum (n - 8) x = sum n x -
 * 8 sum x, with 8 sum x over each group computed once per call and kept as
 * 8 lane-wise partial sums that line up with the accumulator's lanes, so
 * the subtraction happens per lane per group, before the scale, where the
 * terms are still small (measured: normalised error ~2e-7 against ~1e-7 for
 * qkern, both f32 rounding). What is left per 16 columns and token: zero-
 * extend, and, shift, two converts, two FMAs; that is still the bound on a
 * 2-core AVX2 VM (~15 GB/s of int4 per core with x in L1), not memory. Each
 * task splits x again into its worker's scratch: n * cols floats, noise
 * next to the task's weight bytes.
 *
 * The split needs every group but the last to be whole chunks of 16: group %
 * 16 == 0, or one group spanning the row. Other groups take qkern. The
 * columns after the last whole chunk (cols % 16) are done one at a time. */

#define Q4_CHUNK 16 /* columns per 8 packed bytes */

/* The split x of one call: xp [n, chunks * 16], each chunk's 8 even columns
 * then its 8 odd ones; xs8 [n, n_groups, 8], 8 * the lane-wise sum of the
 * group's chunks (even + odd halves), the lanes the kernel's accumulators
 * have. */
typedef struct {
    const float *xp, *xs8;
    size_t ldp, lds; /* floats per token row of xp, xs8 */
} q4x;

static bool q4_split_ok(const qview *v)
{
    return v->qt == WQ_INT4 && (v->group % Q4_CHUNK == 0 || v->group >= v->cols);
}

static size_t q4_split_floats(const qview *v, int n)
{
    return (size_t)n * (v->cols / Q4_CHUNK * Q4_CHUNK + 8 * v->n_groups);
}

static q4x q4_split_x(const qview *v, const float *x, int n, float *scratch)
{
    size_t chunk_cols = v->cols / Q4_CHUNK * Q4_CHUNK, span = v->group < v->cols ? v->group : v->cols;
    q4x s = {scratch, scratch + (size_t)n * chunk_cols, chunk_cols, 8 * v->n_groups};
    float *xp = scratch, *xs8 = scratch + (size_t)n * chunk_cols;
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * v->cols;
        float *pt = xp + (size_t)t * s.ldp, *st = xs8 + (size_t)t * s.lds;
        for (size_t g = 0, g0 = 0; g < v->n_groups; g++, g0 += span) {
            size_t g1 = g0 + span < chunk_cols ? g0 + span : chunk_cols;
            __m256 sum = _mm256_setzero_ps();
            for (size_t k = g0; k < g1; k += Q4_CHUNK) {
                __m256 a = _mm256_loadu_ps(xt + k), b = _mm256_loadu_ps(xt + k + 8);
                /* shuffle_ps leaves [a0 a2 b0 b2 | a4 a6 b4 b6]; the 64-bit
                 * permute puts the pairs in column order */
                __m256 e = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xd8));
                __m256 o = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xdd)), 0xd8));
                _mm256_storeu_ps(pt + k, e);
                _mm256_storeu_ps(pt + k + 8, o);
                sum = _mm256_add_ps(sum, _mm256_add_ps(e, o));
            }
            _mm256_storeu_ps(st + 8 * g, _mm256_mul_ps(sum, _mm256_set1_ps(8.0f)));
        }
    }
    return s;
}

/* acc_e/acc_o[i][t] += the even/odd columns of W[r0 + i, k .. k+15] times
 * those of x[t]: one step of q4kern. */
static inline __attribute__((always_inline)) void q4step(int NR, int NT, const uint8_t *const *row, size_t k,
                                                         const q4x *xs, __m256 acc_e[4][4], __m256 acc_o[4][4])
{
    const __m256i low = _mm256_set1_epi32(15);
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++) {
        __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row[i] + k / 2)));
        __m256 we = _mm256_cvtepi32_ps(_mm256_and_si256(b, low));
        __m256 wo = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const float *xp = xs->xp + (size_t)t * xs->ldp + k;
            acc_e[i][t] = _mm256_fmadd_ps(we, _mm256_loadu_ps(xp), acc_e[i][t]);
            acc_o[i][t] = _mm256_fmadd_ps(wo, _mm256_loadu_ps(xp + 8), acc_o[i][t]);
        }
    }
}

/* out[t * ldo + r0 + i] = sum_k W[r0 + i, k] * x[t, k] for i < NR, t < NT
 * (x the original rows, for the tail; xs the split of the same rows). Even
 * and odd columns keep separate accumulators: two chains per row and token
 * hide the FMA latency. NR * NT <= 4 keeps them in registers. Every output
 * takes the same operations in the same order whatever NR and NT are, so
 * the result of a token row does not depend on the others of the call
 * (batch invariance, test_ops). */
static inline __attribute__((always_inline)) void q4kern(int NR, int NT, bool pf, const qview *v, size_t r0,
                                                         const q4x *xs, const float *x, float *out, size_t ldo)
{
    __m256 tot[4][4], acc_e[4][4], acc_o[4][4];
    const uint8_t *row[4];
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++) {
        row[i] = v->data + (r0 + (size_t)i) * v->row_bytes;
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) tot[i][t] = _mm256_setzero_ps();
    }
    size_t cols = v->cols, chunk_cols = xs->ldp, span = v->group < cols ? v->group : cols;
    for (size_t g = 0, g0 = 0; g0 < chunk_cols; g++, g0 += span) {
        size_t g1 = g0 + span < chunk_cols ? g0 + span : chunk_cols;
#pragma GCC unroll 4
        for (int i = 0; i < NR; i++)
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) acc_e[i][t] = acc_o[i][t] = _mm256_setzero_ps();
        size_t k = g0;
        /* whole cache lines (128 columns) unrolled, with the prefetch for
         * each; then the chunks of a group under 128 columns or the row's
         * short last group */
        for (; k + 128 <= g1; k += 128) {
            if (pf)
#pragma GCC unroll 4
                for (int i = 0; i < NR; i++) _mm_prefetch((const char *)row[i] + QPF_AHEAD(NR, v) + k / 2, _MM_HINT_T0);
#pragma GCC unroll 8
            for (size_t j = 0; j < 128; j += Q4_CHUNK) q4step(NR, NT, row, k + j, xs, acc_e, acc_o);
        }
        for (; k < g1; k += Q4_CHUNK) {
            if (pf && k % 128 == 0)
#pragma GCC unroll 4
                for (int i = 0; i < NR; i++) _mm_prefetch((const char *)row[i] + QPF_AHEAD(NR, v) + k / 2, _MM_HINT_T0);
            q4step(NR, NT, row, k, xs, acc_e, acc_o);
        }
#pragma GCC unroll 4
        for (int i = 0; i < NR; i++) {
            __m256 s = _mm256_set1_ps(scale_at(v, r0 + (size_t)i, g));
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                __m256 sum = _mm256_add_ps(acc_e[i][t], acc_o[i][t]);
                __m256 q = _mm256_sub_ps(sum, _mm256_loadu_ps(xs->xs8 + (size_t)t * xs->lds + 8 * g));
                tot[i][t] = _mm256_fmadd_ps(q, s, tot[i][t]);
            }
        }
    }
    for (int i = 0; i < NR; i++)
        for (int t = 0; t < NT; t++) {
            float tail = 0;
            for (size_t k = chunk_cols; k < cols; k++)
                tail += (float)q_at(WQ_INT4, row[i], k) * scale_at(v, r0 + (size_t)i, k / v->group) * x[(size_t)t * cols + k];
            out[(size_t)t * ldo + r0 + (size_t)i] = hsum8(tot[i][t]) + tail;
        }
}

/* Rows [r0, r1), n <= 16 token rows, the same shapes as qrows. */
static void q4rows(const qview *v, size_t r0, size_t r1, const q4x *xs, const float *x, int n, float *out, size_t ldo)
{
    size_t r = r0, cols = v->cols;
    if (n == 1) {
        for (; r + 4 <= r1; r += 4) q4kern(4, 1, true, v, r, xs, x, out, ldo);
        for (; r < r1; r++) q4kern(1, 1, true, v, r, xs, x, out, ldo);
        return;
    }
    if (n == 2) {
        for (; r + 2 <= r1; r += 2) q4kern(2, 2, true, v, r, xs, x, out, ldo);
        for (; r < r1; r++) q4kern(1, 2, true, v, r, xs, x, out, ldo);
        return;
    }
    /* more: 2 weight rows against chunks of 2 token rows, so that each load
     * of x (the L2 traffic that bounds this case) serves 2 rows */
    for (; r < r1; r += 2) {
        int nr = r + 2 <= r1 ? 2 : 1;
        for (int t = 0; t < n; t += 2) {
            q4x xt = {xs->xp + (size_t)t * xs->ldp, xs->xs8 + (size_t)t * xs->lds, xs->ldp, xs->lds};
            const float *x_t = x + (size_t)t * cols;
            float *ot = out + (size_t)t * ldo;
            bool pf = t == 0;
            switch ((n - t < 2 ? n - t : 2) * 2 + nr - 1) {
            case 2: q4kern(1, 1, pf, v, r, &xt, x_t, ot, ldo); break;
            case 3: q4kern(2, 1, pf, v, r, &xt, x_t, ot, ldo); break;
            case 4: q4kern(1, 2, pf, v, r, &xt, x_t, ot, ldo); break;
            default: q4kern(2, 2, pf, v, r, &xt, x_t, ot, ldo); break;
            }
        }
    }
}

/* ---- entry points -------------------------------------------------------- */

typedef void (*qrows_fn)(const qview *, size_t, size_t, const float *, int, float *, size_t);

static void qrows_int8(const qview *v, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo)
{
    qrows(WQ_INT8, false, v, r0, r1, x, n, out, ldo);
}
static void qrows_int4(const qview *v, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo)
{
    qrows(WQ_INT4, false, v, r0, r1, x, n, out, ldo);
}
static void qrows_int8_pe(const qview *v, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo)
{
    qrows(WQ_INT8, true, v, r0, r1, x, n, out, ldo);
}
static void qrows_int4_pe(const qview *v, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo)
{
    qrows(WQ_INT4, true, v, r0, r1, x, n, out, ldo);
}

size_t cpu_qmatmul_scratch(const weight *w, int n)
{
    qview v = qview_of(w);
    return q4_split_ok(&v) ? q4_split_floats(&v, n) : 0;
}

void cpu_qmatmul_direct(const weight *w, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo,
                        float *scratch)
{
    qview v = qview_of(w);
    if (q4_split_ok(&v)) {
        q4x xs = q4_split_x(&v, x, n, scratch);
        q4rows(&v, r0, r1, &xs, x, n, out, ldo);
        return;
    }
    /* a group of 8k columns (or one spanning the row) never splits a vector */
    bool pe = v.group % 8 != 0 && v.group < v.cols;
    qrows_fn f = v.qt == WQ_INT8 ? (pe ? qrows_int8_pe : qrows_int8) : (pe ? qrows_int4_pe : qrows_int4);
    f(&v, r0, r1, x, n, out, ldo);
}

#endif /* HAVE_AVX2 */

void cpu_qrow_to_f32(float *dst, const weight *w, int64_t row, int64_t col0, int64_t n)
{
    qview v = qview_of(w);
    const uint8_t *rp = v.data + (size_t)row * v.row_bytes;
    size_t c0 = (size_t)col0, c = c0, end = (size_t)(col0 + n);
    while (c < end) {
        size_t g = c / v.group, g1 = (g + 1) * v.group < end ? (g + 1) * v.group : end;
        float s = scale_at(&v, (size_t)row, g);
#ifdef HAVE_AVX2
        for (; c < g1 && c % 8; c++) dst[c - c0] = (float)q_at(v.qt, rp, c) * s;
        for (; c + 8 <= g1; c += 8) _mm256_storeu_ps(dst + (c - c0), _mm256_mul_ps(deq8(v.qt, rp, c), _mm256_set1_ps(s)));
#endif
        for (; c < g1; c++) dst[c - c0] = (float)q_at(v.qt, rp, c) * s;
    }
}
