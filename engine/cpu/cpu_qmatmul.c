/*
 * cpu_qmatmul.c - y = x W^T for weight-only quantized W (WQ_INT8, WQ_INT4;
 * backend.h has the layouts), computed from the packed weights: no
 * full-precision copy of W exists at any time. cpu_matmul.c calls in here.
 *
 * Decode (cpu_matmul's direct path, up to 16 token rows) is bound by the
 * bytes of W, which is why W is quantized at all: each packed row is read
 * once, widened to f32 in registers (int8: sign-extend, convert; int4:
 * broadcast one 32-bit word of 8 nibbles, shift lane j right by 4j, mask,
 * subtract the +8 bias, convert) and applied to every token row. Scales
 * are applied once per group rather than per element: the kernel sums q * x
 * over a group, then adds scale * sum to the row's total. A group that is
 * not a multiple of 8 columns (one vector could straddle two groups) takes a
 * per-element-scale variant: correct, slower, not a layout checkpoints use.
 *
 * Prefill is bound by arithmetic: cpu_matmul widens a few rows at a time
 * into per-worker f32 scratch through cpu_row_to_f32 (which comes here, to
 * cpu_qrow_to_f32) and runs its f32 micro-kernel; the portable build does
 * the same for every token count.
 */
#include <string.h>

#include "cpu.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
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
    size_t i = r * v->n_groups + g;
    switch (v->sdt) {
    case DT_BF16: return bf16_to_f32(((const uint16_t *)v->scales)[i]);
    case DT_F16: return f16_to_f32(((const uint16_t *)v->scales)[i]);
    default: return ((const float *)v->scales)[i];
    }
}

/* q(r, c) of the packed row `row`, as a signed integer. */
static inline int q_at(weight_quant qt, const uint8_t *row, size_t c)
{
    if (qt == WQ_INT8) return ((const int8_t *)row)[c];
    return (int)((row[c / 2] >> (4 * (c % 2))) & 15) - 8;
}

#ifdef HAVE_AVX2

static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

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

/* out[t * ldo + r0 + i] = sum_k W[r0 + i, k] * x[t * ldx + k] for i < NR,
 * t < NT. PE: scales per element (group % 8 != 0). The group sums live in
 * acc, the row totals in tot: NR * NT <= 4 keeps both in registers. */
static inline __attribute__((always_inline)) void qkern(weight_quant qt, bool PE, int NR, int NT, const qview *v,
                                                        size_t r0, const float *x, size_t ldx, float *out, size_t ldo)
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
    for (size_t g0 = 0; g0 < cols; g0 += span) {
        size_t g1 = cols - g0 < span ? cols : g0 + span;
#pragma GCC unroll 4
        for (int i = 0; i < NR; i++)
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) acc[i][t] = _mm256_setzero_ps();
        size_t k = g0;
        for (; k + 8 <= g1; k += 8) {
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
 * the row staying in L1 after the first chunk has streamed it in. */
static inline __attribute__((always_inline)) void qrows(weight_quant qt, bool PE, const qview *v, size_t r0, size_t r1,
                                                        const float *x, int n, float *out, size_t ldo)
{
    size_t cols = v->cols, r = r0;
    if (n == 1) {
        for (; r + 4 <= r1; r += 4) qkern(qt, PE, 4, 1, v, r, x, cols, out, ldo);
        for (; r < r1; r++) qkern(qt, PE, 1, 1, v, r, x, cols, out, ldo);
        return;
    }
    if (n == 2) {
        for (; r + 2 <= r1; r += 2) qkern(qt, PE, 2, 2, v, r, x, cols, out, ldo);
        for (; r < r1; r++) qkern(qt, PE, 1, 2, v, r, x, cols, out, ldo);
        return;
    }
    for (; r < r1; r++)
        for (int t = 0; t < n; t += 4) {
            const float *xt = x + (size_t)t * cols;
            float *ot = out + (size_t)t * ldo;
            switch (n - t < 4 ? n - t : 4) {
            case 1: qkern(qt, PE, 1, 1, v, r, xt, cols, ot, ldo); break;
            case 2: qkern(qt, PE, 1, 2, v, r, xt, cols, ot, ldo); break;
            case 3: qkern(qt, PE, 1, 3, v, r, xt, cols, ot, ldo); break;
            default: qkern(qt, PE, 1, 4, v, r, xt, cols, ot, ldo); break;
            }
        }
}

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

void cpu_qmatmul_direct(const weight *w, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo)
{
    qview v = qview_of(w);
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
