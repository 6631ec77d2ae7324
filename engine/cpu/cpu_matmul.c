/*
 * cpu_matmul.c - y = x W^T (+ b) for F32/F16/BF16 weights, f32 accumulation,
 * parallel over blocks of output rows.
 *
 * Decode (a few token rows) is bound by the bytes of W: each weight element
 * is loaded and widened once and used for every token row in registers, with
 * several rows in flight to hide FMA latency. Prefill (many token rows) is
 * bound by arithmetic: a block of 4 weight rows is widened to f32 once into
 * per-worker scratch and reused across all token rows, which are walked in
 * blocks small enough to stay in cache.
 */
#include <string.h>

#include "cpu.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define HAVE_AVX2 1
#endif

#define DIRECT_MAX_TOKENS 4 /* up to this many rows: widen weights on the fly */
#define TOKEN_BLOCK 32      /* prefill: token rows per cache block */

void cpu_row_to_f32(float *dst, const weight *w, int64_t row, int64_t col0, int64_t n)
{
    size_t base = (size_t)row * (size_t)w->cols + (size_t)col0;
    switch (w->dtype) {
    case DT_F32:
        memcpy(dst, (const float *)w->data + base, (size_t)n * sizeof(float));
        break;
    case DT_BF16: {
        const uint16_t *s = (const uint16_t *)w->data + base;
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
        break;
    }
    case DT_F16: {
        const uint16_t *s = (const uint16_t *)w->data + base;
        for (int64_t i = 0; i < n; i++) dst[i] = f16_to_f32(s[i]);
        break;
    }
    default: FERRY_ASSERT(!"weight dtype not computable");
    }
}

typedef struct {
    float *out;
    const float *x;
    const weight *w;
    const weight *bias;
    int n;
    int64_t rows_per_task;
    cpu_backend *cb;
} mm_ctx;

#ifdef HAVE_AVX2

static inline __attribute__((always_inline)) __m256 load8(ferry_dtype dt, const void *base, size_t i)
{
    switch (dt) {
    case DT_BF16:
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i))), 16));
    case DT_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)));
    default:
        return _mm256_loadu_ps((const float *)base + i);
    }
}

static inline __attribute__((always_inline)) float load1(ferry_dtype dt, const void *base, size_t i)
{
    switch (dt) {
    case DT_BF16: return bf16_to_f32(((const uint16_t *)base)[i]);
    case DT_F16: return f16_to_f32(((const uint16_t *)base)[i]);
    default: return ((const float *)base)[i];
    }
}

static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* out[t, r0 + i] = sum_k W[r0 + i, k] * x[t, k] for i < NR, t < NT. */
static inline __attribute__((always_inline)) void kern(ferry_dtype dt, int NR, int NT, const void *w, size_t cols,
                                                       size_t r0, const float *x, size_t ldx, float *out, size_t ldo)
{
    __m256 acc[4][4];
    for (int i = 0; i < NR; i++)
        for (int t = 0; t < NT; t++) acc[i][t] = _mm256_setzero_ps();
    size_t k = 0;
    for (; k + 8 <= cols; k += 8) {
        __m256 xv[4];
        for (int t = 0; t < NT; t++) xv[t] = _mm256_loadu_ps(x + t * ldx + k);
        for (int i = 0; i < NR; i++) {
            __m256 wv = load8(dt, w, (r0 + i) * cols + k);
            for (int t = 0; t < NT; t++) acc[i][t] = _mm256_fmadd_ps(wv, xv[t], acc[i][t]);
        }
    }
    for (int i = 0; i < NR; i++) {
        for (int t = 0; t < NT; t++) {
            float s = hsum8(acc[i][t]);
            for (size_t kk = k; kk < cols; kk++) s += load1(dt, w, (r0 + i) * cols + kk) * x[t * ldx + kk];
            out[t * ldo + r0 + i] = s;
        }
    }
}

/* Rows [r0, r1) for tokens [t0, t0 + nt), nt <= 4, weights read directly. */
static inline __attribute__((always_inline)) void rows_direct(ferry_dtype dt, const void *w, size_t cols, size_t r0,
                                                              size_t r1, const float *x, int nt, float *out, size_t ldo)
{
    size_t r = r0;
    switch (nt) {
    case 1:
        for (; r + 4 <= r1; r += 4) kern(dt, 4, 1, w, cols, r, x, cols, out, ldo);
        for (; r < r1; r++) kern(dt, 1, 1, w, cols, r, x, cols, out, ldo);
        break;
    case 2:
        for (; r + 4 <= r1; r += 4) kern(dt, 4, 2, w, cols, r, x, cols, out, ldo);
        for (; r < r1; r++) kern(dt, 1, 2, w, cols, r, x, cols, out, ldo);
        break;
    case 3:
        for (; r + 2 <= r1; r += 2) kern(dt, 2, 3, w, cols, r, x, cols, out, ldo);
        for (; r < r1; r++) kern(dt, 1, 3, w, cols, r, x, cols, out, ldo);
        break;
    default:
        for (; r + 2 <= r1; r += 2) kern(dt, 2, 4, w, cols, r, x, cols, out, ldo);
        for (; r < r1; r++) kern(dt, 1, 4, w, cols, r, x, cols, out, ldo);
        break;
    }
}

static void direct_f32(const void *w, size_t cols, size_t r0, size_t r1, const float *x, int nt, float *out, size_t ldo)
{
    rows_direct(DT_F32, w, cols, r0, r1, x, nt, out, ldo);
}
static void direct_bf16(const void *w, size_t cols, size_t r0, size_t r1, const float *x, int nt, float *out, size_t ldo)
{
    rows_direct(DT_BF16, w, cols, r0, r1, x, nt, out, ldo);
}
static void direct_f16(const void *w, size_t cols, size_t r0, size_t r1, const float *x, int nt, float *out, size_t ldo)
{
    rows_direct(DT_F16, w, cols, r0, r1, x, nt, out, ldo);
}

typedef void (*direct_fn)(const void *, size_t, size_t, size_t, const float *, int, float *, size_t);

static direct_fn direct_for(ferry_dtype dt)
{
    return dt == DT_BF16 ? direct_bf16 : dt == DT_F16 ? direct_f16 : direct_f32;
}

/* Prefill: a block of nr weight rows widened to f32 in `wf` ([nr, cols]),
 * applied to token rows [t0, t1) two at a time. */
static void block_f32(const float *wf, int nr, size_t cols, size_t r0, const float *x, size_t t0, size_t t1,
                      float *out, size_t ldo)
{
    size_t t = t0;
    for (; t + 2 <= t1; t += 2) {
        if (nr == 4) kern(DT_F32, 4, 2, wf, cols, 0, x + t * cols, cols, out + t * ldo + r0, ldo);
        else
            for (int i = 0; i < nr; i++) kern(DT_F32, 1, 2, wf, cols, (size_t)i, x + t * cols, cols, out + t * ldo + r0, ldo);
    }
    for (; t < t1; t++) {
        if (nr == 4) kern(DT_F32, 4, 1, wf, cols, 0, x + t * cols, cols, out + t * ldo + r0, ldo);
        else
            for (int i = 0; i < nr; i++) kern(DT_F32, 1, 1, wf, cols, (size_t)i, x + t * cols, cols, out + t * ldo + r0, ldo);
    }
}

#else /* portable fallback */

static void direct_rows(const weight *w, size_t r0, size_t r1, const float *x, int nt, float *out, size_t ldo,
                        float *row)
{
    size_t cols = (size_t)w->cols;
    for (size_t r = r0; r < r1; r++) {
        cpu_row_to_f32(row, w, (int64_t)r, 0, (int64_t)cols);
        for (int t = 0; t < nt; t++) {
            float s = 0;
            for (size_t k = 0; k < cols; k++) s += row[k] * x[t * cols + k];
            out[t * ldo + r] = s;
        }
    }
}

#endif

static void mm_task(void *vctx, int task, int worker)
{
    mm_ctx *c = vctx;
    const weight *w = c->w;
    size_t rows = (size_t)w->rows, cols = (size_t)w->cols;
    size_t r0 = (size_t)task * (size_t)c->rows_per_task;
    size_t r1 = r0 + (size_t)c->rows_per_task;
    if (r1 > rows) r1 = rows;
    if (r0 >= r1) return;
    size_t ldo = rows;
#ifdef HAVE_AVX2
    if (c->n <= DIRECT_MAX_TOKENS) {
        direct_for(w->dtype)(w->data, cols, r0, r1, c->x, c->n, c->out, ldo);
    } else {
        float *wf = cpu_scratch_get(c->cb, worker, 4 * cols);
        FERRY_ASSERT(wf);
        for (size_t t0 = 0; t0 < (size_t)c->n; t0 += TOKEN_BLOCK) {
            size_t t1 = t0 + TOKEN_BLOCK < (size_t)c->n ? t0 + TOKEN_BLOCK : (size_t)c->n;
            for (size_t r = r0; r < r1; r += 4) {
                int nr = r + 4 <= r1 ? 4 : (int)(r1 - r);
                for (int i = 0; i < nr; i++) cpu_row_to_f32(wf + (size_t)i * cols, w, (int64_t)(r + (size_t)i), 0, (int64_t)cols);
                block_f32(wf, nr, cols, r, c->x, t0, t1, c->out, ldo);
            }
        }
    }
#else
    float *row = cpu_scratch_get(c->cb, worker, cols);
    FERRY_ASSERT(row);
    for (int t0 = 0; t0 < c->n; t0 += DIRECT_MAX_TOKENS) {
        int nt = c->n - t0 < DIRECT_MAX_TOKENS ? c->n - t0 : DIRECT_MAX_TOKENS;
        direct_rows(w, r0, r1, c->x + (size_t)t0 * cols, nt, c->out + (size_t)t0 * ldo, ldo, row);
    }
#endif
    if (c->bias && c->bias->data) {
        for (size_t r = r0; r < r1; r++) {
            float b;
            cpu_row_to_f32(&b, c->bias, 0, (int64_t)r, 1);
            for (int t = 0; t < c->n; t++) c->out[(size_t)t * ldo + r] += b;
        }
    }
}

void cpu_matmul(backend *be, float *out, const float *x, const weight *w, const weight *bias, int n)
{
    cpu_backend *cb = (cpu_backend *)be;
    FERRY_ASSERT(dtype_is_compute(w->dtype));
    int threads = pool_size(cb->pool);
    int64_t per = (w->rows + threads * 4 - 1) / (threads * 4);
    per = (per + 3) & ~(int64_t)3;
    if (per < 4) per = 4;
    mm_ctx c = {out, x, w, bias, n, per, cb};
    pool_run(cb->pool, (int)((w->rows + per - 1) / per), mm_task, &c);
}
