/*
 * test_ops.c - every backend op against a plain double-precision reference,
 * on random inputs: matmul in each weight dtype and quantized (int8, int4,
 * scales in each dtype, odd groups) for token counts that take each kernel
 * path (decode chunks, prefill blocks, odd tails) with and without bias, RMSNorm, RoPE (rotate_half; the
 * tables of plain, linear, llama3 and YaRN scaling, YaRN's attention factor), embedding, SiLU x up, add,
 * gather_last, the mixture-of-experts row ops (gather_rows, scatter_rows,
 * moe_combine, bit for bit; on the CPU also through cpu-split), GGUF
 * blocks on the CPU backends (every block type ferry reads: dequantized bit
 * for bit as gguf_quant.c, the matmul against the dequantized values, batch
 * invariant), and KV
 * store + attention (GQA, sliding window, a batch of sequences at different
 * positions). Outputs are poisoned with NaN first so
 * an unwritten element fails. All data goes through the backend's
 * alloc/upload/download, so the same test runs on any backend:
 * `test_ops [cpu|cpu-split|cuda]` (default cpu); exit status 77 when the
 * cuda backend cannot be created (no GPU, no CUDA build). On the CPU, RoPE
 * is also run on cpu-split and must give the same bits.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/backend.h"
#include "../../engine/cpu/cpu.h"
#include "../../engine/weights/gguf_quant.h"
#include "../../engine/weights/rope.h"
#include "check.h"

static backend *g_be;
static uint64_t g_rng = 0x1234567u;

static float frand(void) /* uniform in [-1, 1) */
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

static void *dev_copy(const void *src, size_t bytes)
{
    void *p = g_be->ops->alloc(g_be, bytes);
    FERRY_ASSERT(p);
    if (src) g_be->ops->upload(g_be, p, src, bytes);
    return p;
}

static float *dev_poison(size_t n)
{
    float *host = malloc(n * sizeof *host);
    for (size_t i = 0; i < n; i++) host[i] = NAN;
    float *p = dev_copy(host, n * sizeof *host);
    free(host);
    return p;
}

static float *host_of(const float *dev, size_t n)
{
    float *h = malloc(n * sizeof *h);
    g_be->ops->download(g_be, h, dev, n * sizeof *h);
    g_be->ops->sync(g_be);
    return h;
}

/* max |got - want| / max |want|: error normalised by the output's scale. */
static double norm_err(const float *got, const double *want, size_t n)
{
    double num = 0, den = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (isnan(got[i])) d = INFINITY;
        if (d > num) num = d;
        if (fabs(want[i]) > den) den = fabs(want[i]);
    }
    return num / den;
}

#define CHECK_CLOSE(what, got, want, n, tol)                                                    \
    do {                                                                                      \
        double e_ = norm_err(got, want, n);                                                   \
        check_count++;                                                                        \
        if (!(e_ <= (tol))) CHECK_FAIL_("%s: normalised error %.3g > %.3g", what, e_, (double)(tol)); \
    } while (0)

/* ---- matmul tolerance per backend and weight dtype --------------------------
 * Normalised error against the exact product of the stored weights and x.
 * The CPU widens weights and keeps x in f32 (f32 rounding only). CUDA does
 * the same for n <= 8 (its GEMV); above, cuBLASLt multiplies in the weight's
 * dtype with f32 accumulation, x split into two 16-bit halves hi + lo, which
 * leaves x a relative error of 2^-18 (bf16) or 2^-22 (f16): ~4e-6 and
 * ~2.4e-7 at worst per element, well inside these bounds (the margin
 * covers tensor-core accumulation order and f16 subnormal halves). */
static const struct {
    const char *backend;
    ferry_dtype dt;
    double tol;
} k_matmul_tol[] = {
    {"cpu", DT_F32, 1e-5},  {"cpu", DT_F16, 1e-5},  {"cpu", DT_BF16, 1e-5},
    {"cuda", DT_F32, 1e-5}, {"cuda", DT_F16, 2e-5}, {"cuda", DT_BF16, 3e-5},
};

static double matmul_tol(ferry_dtype dt)
{
    for (size_t i = 0; i < sizeof k_matmul_tol / sizeof k_matmul_tol[0]; i++)
        if (k_matmul_tol[i].dt == dt && strcmp(k_matmul_tol[i].backend, g_be->ops->name) == 0) return k_matmul_tol[i].tol;
    return 1e-5;
}

/* A random weight [rows, cols] in dtype dt; *ref gets the exact values it
 * holds (after rounding to dt). */
static weight make_weight(ferry_dtype dt, int64_t rows, int64_t cols, double **ref, float lo, float hi)
{
    size_t n = (size_t)(rows * cols);
    void *host = malloc(n * 4);
    *ref = malloc(n * sizeof **ref);
    for (size_t i = 0; i < n; i++) {
        float v = lo + (hi - lo) * (frand() * 0.5f + 0.5f);
        if (dt == DT_F32) {
            ((float *)host)[i] = v;
            (*ref)[i] = v;
        } else if (dt == DT_BF16) {
            ((uint16_t *)host)[i] = f32_to_bf16(v);
            (*ref)[i] = bf16_to_f32(((uint16_t *)host)[i]);
        } else {
            ((uint16_t *)host)[i] = f32_to_f16(v);
            (*ref)[i] = f16_to_f32(((uint16_t *)host)[i]);
        }
    }
    weight w = {.dtype = dt, .rows = rows, .cols = cols, .data = dev_copy(host, n * dtype_size(dt))};
    free(host);
    return w;
}

static float *rand_vec(size_t n, double **ref)
{
    float *h = malloc(n * sizeof *h);
    *ref = malloc(n * sizeof **ref);
    for (size_t i = 0; i < n; i++) (*ref)[i] = h[i] = frand();
    float *d = dev_copy(h, n * sizeof *h);
    free(h);
    return d;
}

/* ---- a batch of 3 sequences at different positions ------------------------ */

typedef struct {
    batch_builder bb;
    batch b;
    const batch_seq *seqs;
} test_batch;

/* spec: (KV sequence, n_past, n_tokens) per sequence; free with batch_builder_free */
static void batch_make(test_batch *tb, int n_seqs, const int (*spec)[3], int vocab)
{
    FERRY_ASSERT(batch_builder_init(&tb->bb, 64, 3) == FERRY_OK);
    for (int s = 0; s < n_seqs; s++) {
        int32_t tokens[64];
        for (int i = 0; i < spec[s][2]; i++)
            tokens[i] = (int32_t)((unsigned)((tb->bb.n_tokens + i) * 7 + 3) % (unsigned)vocab);
        batch_builder_add(&tb->bb, spec[s][0], spec[s][1], tokens, spec[s][2]);
    }
    tb->b = batch_builder_get(&tb->bb);
    tb->seqs = tb->b.seqs;
}

/* ---- tests ------------------------------------------------------------------ */

static void test_matmul(void)
{
    static const ferry_dtype dts[] = {DT_F32, DT_F16, DT_BF16};
    static const int ns[] = {1, 2, 3, 4, 5, 7, 8, 16, 17, 50, 100};
    /* 776 columns: several passes of a vectorised loop plus a partial one */
    static const int64_t shapes[][2] = {{37, 67}, {64, 128}, {130, 256}, {70, 776}};
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
                for (int with_bias = 0; with_bias < 2; with_bias++) {
                    int64_t rows = shapes[s][0], cols = shapes[s][1];
                    int n = ns[k];
                    double *wref, *bref = NULL, *xref;
                    weight w = make_weight(dts[d], rows, cols, &wref, -1, 1);
                    weight b = {0};
                    if (with_bias) b = make_weight(dts[d], 1, rows, &bref, -1, 1);
                    float *x = rand_vec((size_t)n * (size_t)cols, &xref);
                    float *out = dev_poison((size_t)n * (size_t)rows);
                    g_be->ops->matmul(g_be, out, x, &w, with_bias ? &b : NULL, n);
                    double *want = malloc((size_t)n * (size_t)rows * sizeof *want);
                    for (int t = 0; t < n; t++)
                        for (int64_t r = 0; r < rows; r++) {
                            double acc = bref ? bref[r] : 0;
                            for (int64_t c = 0; c < cols; c++) acc += wref[r * cols + c] * xref[t * cols + c];
                            want[t * rows + r] = acc;
                        }
                    float *got = host_of(out, (size_t)n * (size_t)rows);
                    char what[96];
                    snprintf(what, sizeof what, "matmul %s [%lld,%lld] n=%d bias=%d", dtype_name(dts[d]),
                             (long long)rows, (long long)cols, n, with_bias);
                    CHECK_CLOSE(what, got, want, (size_t)n * (size_t)rows, matmul_tol(dts[d]));
                    free(got);
                    free(want);
                    free(wref);
                    free(bref);
                    free(xref);
                    g_be->ops->release(g_be, (void *)w.data);
                    if (with_bias) g_be->ops->release(g_be, (void *)b.data);
                    g_be->ops->release(g_be, x);
                    g_be->ops->release(g_be, out);
                }
}

/* A random quantized weight [rows, cols] (backend.h's layouts) with scales
 * in sdt; *ref gets the exact value of every element, q * scale after the
 * scale is rounded to sdt. */
static weight make_qweight(weight_quant qt, ferry_dtype sdt, int64_t rows, int64_t cols, int group, double **ref)
{
    weight w = {.dtype = qt == WQ_INT8 ? DT_I8 : DT_I32, .rows = rows, .cols = cols, .quant = qt, .group = group,
                .scale_dtype = sdt};
    int64_t n_groups = weight_groups(&w);
    size_t row_bytes = weight_row_bytes(&w), n_scales = (size_t)(rows * n_groups);
    uint8_t *data = calloc((size_t)rows, row_bytes);
    void *scales = malloc(n_scales * 4);
    double *sref = malloc(n_scales * sizeof *sref);
    for (size_t i = 0; i < n_scales; i++) {
        float v = (0.5f + 0.5f * fabsf(frand())) / (qt == WQ_INT8 ? 127 : 8);
        if (sdt == DT_F32) sref[i] = ((float *)scales)[i] = v;
        else if (sdt == DT_BF16) sref[i] = bf16_to_f32(((uint16_t *)scales)[i] = f32_to_bf16(v));
        else sref[i] = f16_to_f32(((uint16_t *)scales)[i] = f32_to_f16(v));
    }
    *ref = malloc((size_t)(rows * cols) * sizeof **ref);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            int q;
            uint8_t *row = data + (size_t)r * row_bytes;
            if (qt == WQ_INT8) {
                q = (int)lrintf(frand() * 127);
                ((int8_t *)row)[c] = (int8_t)q;
            } else {
                q = (int)floorf((frand() * 0.5f + 0.5f) * 16) - 8; /* -8 .. 7 */
                if (q > 7) q = 7;
                /* word c / 8, bits 4 * (c % 8): byte c / 2 of the little-endian word */
                row[c / 2] |= (uint8_t)((q + 8) << (4 * (c % 2)));
            }
            (*ref)[r * cols + c] = q * sref[r * n_groups + c / group];
        }
    w.data = dev_copy(data, (size_t)rows * row_bytes);
    w.scales = dev_copy(scales, n_scales * dtype_size(sdt));
    free(data);
    free(scales);
    free(sref);
    return w;
}

/* int8 and int4 weights: scales in each dtype; groups of 128, of 32, of 100
 * and 5 (not multiples of 8: vectors straddle groups), one group per row;
 * columns off a multiple of 8 and of the group; token counts on both sides
 * of the decode / prefill switch; shapes over several of the prefill GEMM's
 * panels, column blocks and token passes. */
static void test_qmatmul(void)
{
    static const struct {
        weight_quant qt;
        int64_t rows, cols;
        int group;
    } cases[] = {
        {WQ_INT8, 64, 256, 256}, {WQ_INT8, 37, 300, 300}, {WQ_INT8, 21, 300, 32},  {WQ_INT4, 64, 256, 128},
        {WQ_INT4, 40, 300, 128}, {WQ_INT4, 33, 300, 32},  {WQ_INT4, 50, 300, 100}, {WQ_INT4, 19, 77, 5},
        {WQ_INT4, 18, 1030, 1030}, {WQ_INT4, 203, 1100, 32}, {WQ_INT8, 203, 1100, 1100},
    };
    static const ferry_dtype sdts[] = {DT_F32, DT_F16, DT_BF16};
    static const int ns[] = {1, 2, 5, 8, 9, 16, 17, 64, 100};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (size_t d = 0; d < 3; d++)
            for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
                for (int with_bias = 0; with_bias < 2; with_bias++) {
                    int64_t rows = cases[ci].rows, cols = cases[ci].cols;
                    int n = ns[k];
                    double *wref, *bref = NULL, *xref;
                    weight w = make_qweight(cases[ci].qt, sdts[d], rows, cols, cases[ci].group, &wref);
                    weight b = {0};
                    if (with_bias) b = make_weight(DT_BF16, 1, rows, &bref, -1, 1);
                    float *x = rand_vec((size_t)n * (size_t)cols, &xref);
                    float *out = dev_poison((size_t)n * (size_t)rows);
                    g_be->ops->matmul(g_be, out, x, &w, with_bias ? &b : NULL, n);
                    double *want = malloc((size_t)n * (size_t)rows * sizeof *want);
                    for (int t = 0; t < n; t++)
                        for (int64_t r = 0; r < rows; r++) {
                            double acc = bref ? bref[r] : 0;
                            for (int64_t c = 0; c < cols; c++) acc += wref[r * cols + c] * xref[t * cols + c];
                            want[t * rows + r] = acc;
                        }
                    float *got = host_of(out, (size_t)n * (size_t)rows);
                    char what[128];
                    snprintf(what, sizeof what, "matmul %s scales %s group %d [%lld,%lld] n=%d bias=%d",
                             cases[ci].qt == WQ_INT8 ? "int8" : "int4", dtype_name(sdts[d]), cases[ci].group,
                             (long long)rows, (long long)cols, n, with_bias);
                    CHECK_CLOSE(what, got, want, (size_t)n * (size_t)rows, 1e-5);
                    free(got);
                    free(want);
                    free(wref);
                    free(bref);
                    free(xref);
                    g_be->ops->release(g_be, (void *)w.data);
                    g_be->ops->release(g_be, (void *)w.scales);
                    if (with_bias) g_be->ops->release(g_be, (void *)b.data);
                    g_be->ops->release(g_be, x);
                    g_be->ops->release(g_be, out);
                }
}

/* Batch invariance: a token row's output does not depend on how many rows
 * share the call (decode and prefill paths, any token chunking), bit for
 * bit - otherwise a request's logits would depend on what else is in its
 * step, and a prompt's on how its prefill is split. The CPU backends keep
 * it; the CUDA backend does not promise it (its prefill is cuBLASLt). */
static void test_matmul_batch_invariant(void)
{
    /* the second shape takes the dense prefill GEMM through more than one
     * panel of rows, widened column chunk, L1 column block and token pass
     * (mm_kern.h), each with a partial last one, and a column tail; int8/int4
     * the same, their groups closing inside and across column blocks */
    static const int ns[] = {2, 3, 5, 16, 17, 40, 64, 97, 130};
    static const int64_t shapes[][2] = {{37, 300}, {203, 1100}};
    enum { N = 130 };
    for (int kind = 0; kind < 13; kind++) {
        bool big = kind >= 6; /* the second shape: dense, int8 a group a row and of 64, int4 of 128 and 32 */
        int64_t rows = shapes[big][0], cols = shapes[big][1];
        double *wref, *xref;
        weight w = kind < 3 || (big && kind < 9)
                       ? make_weight(kind % 3 == 0 ? DT_F32 : kind % 3 == 1 ? DT_F16 : DT_BF16, rows, cols, &wref, -1, 1)
                   : kind == 3 || kind == 9 ? make_qweight(WQ_INT8, DT_BF16, rows, cols, (int)cols, &wref)
                   : kind == 10             ? make_qweight(WQ_INT8, DT_F16, rows, cols, 64, &wref)
                   : kind == 4 || kind == 11 ? make_qweight(WQ_INT4, DT_BF16, rows, cols, 128, &wref)
                   : kind == 12             ? make_qweight(WQ_INT4, DT_F32, rows, cols, 32, &wref)
                                            : make_qweight(WQ_INT4, DT_F16, rows, cols, 100, &wref);
        float *x = rand_vec((size_t)N * (size_t)cols, &xref);
        float *one = dev_poison((size_t)rows), *all = dev_poison((size_t)N * (size_t)rows);
        float *want = malloc((size_t)N * (size_t)rows * sizeof *want);
        for (int t = 0; t < N; t++) {
            g_be->ops->matmul(g_be, one, x + (size_t)t * (size_t)cols, &w, NULL, 1);
            float *h = host_of(one, (size_t)rows);
            memcpy(want + (size_t)t * (size_t)rows, h, (size_t)rows * sizeof *h);
            free(h);
        }
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            int n = ns[k];
            g_be->ops->matmul(g_be, all, x, &w, NULL, n);
            float *got = host_of(all, (size_t)n * (size_t)rows);
            size_t bad = 0;
            for (size_t i = 0; i < (size_t)n * (size_t)rows; i++) bad += memcmp(&got[i], &want[i], sizeof got[i]) != 0;
            if (bad) fprintf(stderr, "matmul kind %d: n=%d differs from n=1 in %zu of %zu outputs\n", kind, n, bad,
                             (size_t)n * (size_t)rows);
            CHECK(bad == 0);
            free(got);
        }
        free(want);
        free(wref);
        free(xref);
        g_be->ops->release(g_be, (void *)w.data);
        if (w.scales) g_be->ops->release(g_be, (void *)w.scales);
        g_be->ops->release(g_be, x);
        g_be->ops->release(g_be, one);
        g_be->ops->release(g_be, all);
    }
}

/* ---- GGUF blocks (CPU backends) ------------------------------------------- */

static const struct {
    uint32_t type;
    int scale_at[2]; /* byte offsets of the block's fp16 scales; -1: none */
} k_gguf_types[] = {
    {GGUF_Q8_0, {0, -1}}, {GGUF_Q4_0, {0, -1}}, {GGUF_Q4_1, {0, 2}}, {GGUF_Q5_0, {0, -1}},
    {GGUF_Q5_1, {0, 2}},  {GGUF_Q4_K, {0, 2}},  {GGUF_Q5_K, {0, 2}}, {GGUF_Q6_K, {208, -1}},
};

/* Random blocks of type k (random bits, finite scales) for [rows, cols];
 * *ref gets gguf_dequant's values (the reference dequantizer, checked bit
 * for bit against the gguf package by test_gguf.py). Host memory. */
static uint8_t *gguf_blocks(size_t k, int64_t rows, int64_t cols, double **ref)
{
    uint32_t be, bb;
    FERRY_ASSERT(gguf_type_block(k_gguf_types[k].type, &be, &bb));
    size_t nb = (size_t)(rows * cols) / be;
    uint8_t *raw = malloc(nb * bb);
    for (size_t i = 0; i < nb * bb; i++) raw[i] = (uint8_t)((frand() + 1.0f) * 128.0f);
    for (size_t b = 0; b < nb; b++)
        for (int s = 0; s < 2 && k_gguf_types[k].scale_at[s] >= 0; s++) {
            uint16_t h = f32_to_f16(frand() * 0.01f);
            memcpy(raw + b * bb + k_gguf_types[k].scale_at[s], &h, 2);
        }
    float *f = malloc((size_t)(rows * cols) * sizeof *f);
    FERRY_ASSERT(gguf_dequant(k_gguf_types[k].type, raw, f, (uint64_t)(rows * cols)));
    *ref = malloc((size_t)(rows * cols) * sizeof **ref);
    for (size_t i = 0; i < (size_t)(rows * cols); i++) (*ref)[i] = f[i];
    free(f);
    return raw;
}

/* --cpu-activations int8: x is rounded to 8 bits a 32 values (scale d =
 * max|x| / 127), so an output may be off by up to sum over blocks of
 * d / 2 sum |w| (each value moves at most d / 2), plus f32 rounding. */
static double int8_bound(const double *wrow, const float *x, int cols)
{
    double b = 0, mag = 0;
    for (int k0 = 0; k0 < cols; k0 += 32) {
        double amax = 0, wsum = 0;
        for (int k = k0; k < k0 + 32; k++) {
            amax = fabs(x[k]) > amax ? fabs(x[k]) : amax;
            wsum += fabs(wrow[k]);
            mag += fabs(wrow[k] * x[k]);
        }
        b += amax / 127 / 2 * wsum;
    }
    return b * 1.001 + 1e-5 * mag;
}

/* The same output with x rounded as the kernels round it (d = max|x| / 127
 * and q = x (127 / max|x|) to nearest even, in f32), in double: what the
 * int8 kernels compute but for their f32 rounding. */
static double int8_emulated(const double *wrow, const float *x, int cols, double *mag)
{
    double acc = 0;
    *mag = 0;
    for (int k0 = 0; k0 < cols; k0 += 32) {
        float amax = 0;
        for (int k = k0; k < k0 + 32; k++) amax = fabsf(x[k]) > amax ? fabsf(x[k]) : amax;
        float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
        for (int k = k0; k < k0 + 32; k++) {
            float q = nearbyintf(x[k] * id);
            acc += wrow[k] * (double)q * d;
            *mag += fabs(wrow[k] * (double)q * d);
        }
    }
    return acc;
}

static void test_gguf_matmul_cols(bool check_rows, int COLS)
{
    bool int8 = g_be->ops->kernels && strstr(g_be->ops->kernels(g_be), "int8");
    static const int ns[] = {1, 2, 5, 16, 17, 64};
    enum { ROWS_ = 37 };
    for (size_t k = 0; k < sizeof k_gguf_types / sizeof k_gguf_types[0]; k++) {
        uint32_t be_, bb_;
        FERRY_ASSERT(gguf_type_block(k_gguf_types[k].type, &be_, &bb_));
        if (COLS % (int)be_) continue; /* a k-quant's 256-value blocks: not at this width */
        double *wref, *xref, *bref = NULL;
        uint8_t *raw = gguf_blocks(k, ROWS_, COLS, &wref);
        weight host = {.dtype = DT_U8, .rows = ROWS_, .cols = COLS, .data = raw, .quant = WQ_GGUF,
                       .block = k_gguf_types[k].type};
        const char *tn = gguf_type_name(host.block);
        if (check_rows) { /* the kernels' dequantization, whole rows and pieces, is the reference's bit for bit */
            float *got = malloc((size_t)COLS * sizeof *got);
            size_t bad = 0;
            for (int64_t r = 0; r < ROWS_; r++) {
                cpu_gguf_row_to_f32(got, &host, r, 0, COLS);
                for (int c = 0; c < COLS; c++) bad += got[c] != (float)wref[r * COLS + c];
                cpu_gguf_row_to_f32(got, &host, r, 37, 300);
                for (int c = 0; c < 300; c++) bad += got[c] != (float)wref[r * COLS + 37 + c];
            }
            free(got);
            if (bad) fprintf(stderr, "gguf %s: %zu dequantized values differ from gguf_dequant's\n", tn, bad);
            CHECK(bad == 0);
        }
        weight w = host;
        w.data = dev_copy(raw, (size_t)ROWS_ * weight_row_bytes(&host));
        weight b = make_weight(DT_F32, 1, ROWS_, &bref, -1, 1);
        float *x = rand_vec((size_t)64 * COLS, &xref);
        float *x_host = host_of(x, (size_t)64 * COLS);
        float *one = dev_poison(ROWS_), *all = dev_poison((size_t)64 * ROWS_);
        float *alone = malloc((size_t)64 * ROWS_ * sizeof *alone);
        for (int t = 0; t < 64; t++) {
            g_be->ops->matmul(g_be, one, x + (size_t)t * COLS, &w, &b, 1);
            float *h = host_of(one, ROWS_);
            memcpy(alone + (size_t)t * ROWS_, h, ROWS_ * sizeof *h);
            free(h);
        }
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            int n = ns[i];
            g_be->ops->matmul(g_be, all, x, &w, &b, n);
            float *got = host_of(all, (size_t)n * ROWS_);
            double *want = malloc((size_t)n * ROWS_ * sizeof *want);
            size_t bad = 0;
            for (int t = 0; t < n; t++)
                for (int r = 0; r < ROWS_; r++) {
                    double acc = bref[r];
                    for (int c = 0; c < COLS; c++) acc += wref[r * COLS + c] * xref[t * COLS + c];
                    want[t * ROWS_ + r] = acc;
                    bad += memcmp(&got[t * ROWS_ + r], &alone[t * ROWS_ + r], sizeof *got) != 0;
                }
            char what[96];
            snprintf(what, sizeof what, "matmul gguf %s [%d,%d] n=%d%s", tn, ROWS_, COLS, n, int8 ? " int8" : "");
            if (int8) {
                size_t over = 0, off = 0;
                for (int t = 0; t < n; t++)
                    for (int r = 0; r < ROWS_; r++) {
                        const double *wr = wref + (size_t)r * COLS;
                        const float *xr = x_host + (size_t)t * COLS;
                        double mag, e = int8_emulated(wr, xr, COLS, &mag) + bref[r];
                        over += fabs(got[t * ROWS_ + r] - want[t * ROWS_ + r]) > int8_bound(wr, xr, COLS);
                        off += fabs(got[t * ROWS_ + r] - e) > 1e-5 * (mag + fabs(bref[r]));
                    }
                if (over) fprintf(stderr, "%s: %zu outputs past the 8-bit activations' bound\n", what, over);
                if (off) fprintf(stderr, "%s: %zu outputs not the emulated 8-bit rounding's\n", what, off);
                CHECK(over == 0);
                CHECK(off == 0);
            } else {
                CHECK_CLOSE(what, got, want, (size_t)n * ROWS_, 1e-5);
            }
            if (strcmp(g_be->ops->name, "cuda") != 0) { /* batch invariance, bit for bit (the CPU backends promise it) */
                if (bad) fprintf(stderr, "%s: %zu outputs differ from the same rows computed alone\n", what, bad);
                CHECK(bad == 0);
            }
            free(got);
            free(want);
        }
        free(alone);
        free(x_host);
        free(raw);
        free(wref);
        free(xref);
        free(bref);
        g_be->ops->release(g_be, (void *)w.data);
        g_be->ops->release(g_be, (void *)b.data);
        g_be->ops->release(g_be, x);
        g_be->ops->release(g_be, one);
        g_be->ops->release(g_be, all);
    }
}

/* 512 columns (every type); 544 (17 chunks: the 32-value types' odd last block) */
static void test_gguf_matmul(bool check_rows)
{
    test_gguf_matmul_cols(check_rows, 512);
    test_gguf_matmul_cols(check_rows, 544);
}

/* A rounded-activations mode's outputs, each judged against the exact
 * product: past its bound (over) or not what the rounding emulated in
 * double gives (off); and each the same bits alone as in a step of n rows
 * (varies). ns: the step sizes. */
typedef void (*mode_judge)(const double *wrow, const float *x, int cols, float got, size_t *over, size_t *off);

static void check_mode(const char *what, weight *w, const double *wref, const int *ns, size_t nns, mode_judge judge)
{
    int64_t rows = w->rows, cols = w->cols;
    int N = 1;
    for (size_t i = 0; i < nns; i++) N = ns[i] > N ? ns[i] : N;
    double *xref;
    float *x = rand_vec((size_t)N * (size_t)cols, &xref);
    float *xh = host_of(x, (size_t)N * (size_t)cols);
    float *one = dev_poison((size_t)rows), *all = dev_poison((size_t)N * (size_t)rows);
    float *alone = malloc((size_t)N * (size_t)rows * sizeof *alone);
    for (int t = 0; t < N; t++) {
        g_be->ops->matmul(g_be, one, x + (size_t)t * (size_t)cols, w, NULL, 1);
        float *h = host_of(one, (size_t)rows);
        memcpy(alone + (size_t)t * (size_t)rows, h, (size_t)rows * sizeof *h);
        free(h);
    }
    for (size_t i = 0; i < nns; i++) {
        int n = ns[i];
        g_be->ops->matmul(g_be, all, x, w, NULL, n);
        float *got = host_of(all, (size_t)n * (size_t)rows);
        size_t over = 0, off = 0, varies = 0;
        for (int t = 0; t < n; t++)
            for (int64_t r = 0; r < rows; r++) {
                float g = got[(size_t)t * (size_t)rows + (size_t)r];
                judge(wref + (size_t)(r * cols), xh + (size_t)t * (size_t)cols, (int)cols, g, &over, &off);
                varies += memcmp(&g, &alone[(size_t)t * (size_t)rows + (size_t)r], sizeof g) != 0;
            }
        if (over || off || varies)
            fprintf(stderr, "%s [%lld,%lld] n=%d: %zu past the bound, %zu not the rounding's, %zu vary\n", what,
                    (long long)rows, (long long)cols, n, over, off, varies);
        CHECK(over == 0);
        CHECK(off == 0);
        CHECK(varies == 0);
        free(got);
    }
    free(alone);
    free(xh);
    free(xref);
    g_be->ops->release(g_be, x);
    g_be->ops->release(g_be, one);
    g_be->ops->release(g_be, all);
}

static void judge_int8(const double *wr, const float *xr, int cols, float g, size_t *over, size_t *off)
{
    double exact = 0, mag;
    for (int c = 0; c < cols; c++) exact += wr[c] * xr[c];
    double e = int8_emulated(wr, xr, cols, &mag);
    *over += fabs(g - exact) > int8_bound(wr, xr, cols);
    *off += fabs(g - e) > 1e-5 * mag;
}

/* --cpu-activations int8 on int8/int4 weights whose groups are whole
 * 32-column chunks (int8_bound, int8_emulated). 544 columns: an odd last
 * chunk; groups 32, 128 (a shorter last group) and a row's width. 8224
 * columns: steps of 45 token rows taken in passes (their records held in
 * L2), groups of 96 (pairs of chunks across two groups). */
static void test_q_int8_activations(void)
{
    static const struct { weight_quant qt; ferry_dtype sdt; int cols, group; } cases[] = {
        {WQ_INT8, DT_BF16, 512, 512}, {WQ_INT8, DT_F16, 544, 32},   {WQ_INT4, DT_BF16, 512, 128},
        {WQ_INT4, DT_F32, 544, 128},  {WQ_INT4, DT_F16, 544, 32},   {WQ_INT4, DT_BF16, 544, 544},
        {WQ_INT4, DT_BF16, 8224, 96}, {WQ_INT8, DT_F16, 8224, 128}, /* wide: a step's token rows in several passes */
    };
    static const int ns[] = {1, 2, 5, 17}, ns_wide[] = {1, 4, 45};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        bool wide = cases[ci].cols > 4096;
        double *wref;
        weight w = make_qweight(cases[ci].qt, cases[ci].sdt, 37, cases[ci].cols, cases[ci].group, &wref);
        char what[64];
        snprintf(what, sizeof what, "int8 activations on %s group %d", cases[ci].qt == WQ_INT8 ? "int8" : "int4",
                 cases[ci].group);
        if (wide)
            check_mode(what, &w, wref, ns_wide, sizeof ns_wide / sizeof ns_wide[0], judge_int8);
        else
            check_mode(what, &w, wref, ns, sizeof ns / sizeof ns[0], judge_int8);
        free(wref);
        g_be->ops->release(g_be, (void *)w.data);
        g_be->ops->release(g_be, (void *)w.scales);
    }
}

/* --cpu-activations bf16: BF16 weights against x rounded to bf16 (nearest
 * even: each value moves at most 2^-9 of itself), products exact, sums in
 * f32: within sum |w x| 2^-9 (+ f32 rounding) of the exact product, and
 * within f32 rounding of the same in double on the rounded x. Columns 300
 * and 64: the last 32-column step part-filled, and not. */
static void judge_bf16(const double *wr, const float *xr, int cols, float g, size_t *over, size_t *off)
{
    double exact = 0, rounded = 0, mag = 0;
    for (int c = 0; c < cols; c++) {
        exact += wr[c] * xr[c];
        rounded += wr[c] * bf16_to_f32(f32_to_bf16(xr[c]));
        mag += fabs(wr[c] * xr[c]);
    }
    *over += fabs(g - exact) > mag * (1.0 / 512) * 1.001 + 1e-5 * mag;
    *off += fabs(g - rounded) > 1e-5 * mag;
}

static void test_bf16_activations(void)
{
    /* the third shape takes the prefill GEMM over panels, column blocks
     * (a short, padded last one) and token passes */
    static const int ns[] = {1, 2, 3, 5, 7, 17, 64}, ns_big[] = {1, 5, 17, 100};
    static const int64_t shapes[][2] = {{37, 300}, {37, 64}, {203, 2100}};
    for (int shape = 0; shape < 3; shape++) {
        double *wref;
        weight w = make_weight(DT_BF16, shapes[shape][0], shapes[shape][1], &wref, -1, 1);
        if (shape == 2)
            check_mode("bf16 activations", &w, wref, ns_big, sizeof ns_big / sizeof ns_big[0], judge_bf16);
        else
            check_mode("bf16 activations", &w, wref, ns, sizeof ns / sizeof ns[0], judge_bf16);
        free(wref);
        g_be->ops->release(g_be, (void *)w.data);
    }
}

static void test_rmsnorm(int dim)
{
    int n = 9;
    double *wref, *xref;
    weight w = make_weight(DT_BF16, 1, dim, &wref, 0.5f, 1.5f);
    float *x = rand_vec((size_t)n * (size_t)dim, &xref);
    float *out = dev_poison((size_t)n * (size_t)dim);
    g_be->ops->rmsnorm(g_be, out, x, &w, n, dim, 1e-5f);
    double *want = malloc((size_t)n * (size_t)dim * sizeof *want);
    for (int t = 0; t < n; t++) {
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += xref[t * dim + i] * xref[t * dim + i];
        double inv = 1 / sqrt(ss / dim + 1e-5);
        for (int i = 0; i < dim; i++) want[t * dim + i] = wref[i] * xref[t * dim + i] * inv;
    }
    float *got = host_of(out, (size_t)n * (size_t)dim);
    CHECK_CLOSE("rmsnorm", got, want, (size_t)n * (size_t)dim, 1e-6);
    /* in place, as the forward pass does for q_norm/k_norm */
    g_be->ops->rmsnorm(g_be, x, x, &w, n, dim, 1e-5f);
    free(got);
    got = host_of(x, (size_t)n * (size_t)dim);
    CHECK_CLOSE("rmsnorm in place", got, want, (size_t)n * (size_t)dim, 1e-6);
    free(got);
    free(want);
    free(wref);
    free(xref);
    g_be->ops->release(g_be, (void *)w.data);
    g_be->ops->release(g_be, x);
    g_be->ops->release(g_be, out);
}

/* The RoPE tables configs give (weights/rope.h): plain, linear, Llama 3.1's
 * bands and YaRN's ramp with its attention factor, which scales cos and sin. */
static const rope_config k_ropes[] = {
    {.type = ROPE_DEFAULT, .theta = 10000.0, .factor = 1, .attention_factor = 1},
    {.type = ROPE_LINEAR, .theta = 10000.0, .factor = 4, .attention_factor = 1},
    {.type = ROPE_LLAMA3, .theta = 500000.0, .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
     .original_max_pos = 64, .attention_factor = 1},
    {.type = ROPE_YARN, .theta = 10000.0, .factor = 4, .original_max_pos = 32, .beta_fast = 32, .beta_slow = 1,
     .truncate = true, .attention_factor = 1.1386294361119891},
};

/* RoPE by rc's table on the backend under test, on the same random heads
 * every time (the generator restarts); *want (malloc'd) is the rotation in
 * double of the float32 angles pos * inv_freq, times the attention factor.
 * Returns the output (host, malloc'd). */
static float *rope_run(int hd, const rope_config *rc, double **want)
{
    static const int spec[3][3] = {{0, 0, 5}, {1, 37, 1}, {2, 30000, 3}};
    test_batch tb;
    batch_make(&tb, 3, spec, 100);
    FERRY_ASSERT(g_be->ops->set_batch(g_be, &tb.b) == FERRY_OK);
    int heads = 3, n = tb.b.n_tokens, half = hd / 2;
    uint64_t saved = g_rng;
    g_rng = 0x5eedu + (uint64_t)hd;
    double *xref;
    float *x = rand_vec((size_t)n * (size_t)heads * (size_t)hd, &xref);
    g_rng = saved;
    float *inv = malloc((size_t)half * sizeof *inv);
    rope_inv_freq(rc, hd, inv);
    float scale = rope_attn_scale(rc);
    float *inv_dev = dev_copy(inv, (size_t)half * sizeof *inv);
    g_be->ops->rope(g_be, x, heads, hd, inv_dev, scale);
    *want = malloc((size_t)n * (size_t)heads * (size_t)hd * sizeof **want);
    for (int t = 0; t < n; t++)
        for (int h = 0; h < heads; h++) {
            const double *v = xref + ((size_t)t * (size_t)heads + (size_t)h) * (size_t)hd;
            double *o = *want + ((size_t)t * (size_t)heads + (size_t)h) * (size_t)hd;
            for (int i = 0; i < hd; i++) {
                /* emb = cat(freqs, freqs); out = x cos + rotate_half(x) sin, float32 angles as transformers' */
                double ang = (double)((float)tb.b.pos[t] * inv[i % half]);
                double rot = i < half ? -v[i + half] : v[i - half];
                o[i] = scale * (v[i] * cos(ang) + rot * sin(ang));
            }
        }
    float *got = host_of(x, (size_t)n * (size_t)heads * (size_t)hd);
    free(inv);
    free(xref);
    g_be->ops->release(g_be, inv_dev);
    g_be->ops->release(g_be, x);
    batch_builder_free(&tb.bb);
    return got;
}

static void test_rope(int hd)
{
    for (size_t r = 0; r < sizeof k_ropes / sizeof k_ropes[0]; r++) {
        double *want;
        float *got = rope_run(hd, &k_ropes[r], &want);
        char what[64];
        snprintf(what, sizeof what, "rope %s hd=%d", rope_type_name(k_ropes[r].type), hd);
        CHECK_CLOSE(what, got, want, (size_t)(5 + 1 + 3) * 3 * (size_t)hd, 1e-5);
        free(got);
        free(want);
    }
}

/* cpu-split runs the CPU's kernel behind its device memory: the same table
 * handed through it must give the same bits. */
static void test_rope_split_same_bits(int hd)
{
    backend *cpu = g_be, *split;
    backend_opts bo = {3, NULL, NULL};
    FERRY_ASSERT(backend_create("cpu-split", &bo, &split) == FERRY_OK);
    for (size_t r = 0; r < sizeof k_ropes / sizeof k_ropes[0]; r++) {
        double *want_cpu, *want_split;
        float *a = rope_run(hd, &k_ropes[r], &want_cpu);
        g_be = split;
        float *b = rope_run(hd, &k_ropes[r], &want_split);
        g_be = cpu;
        size_t n = (size_t)(5 + 1 + 3) * 3 * (size_t)hd;
        check_count++;
        if (memcmp(a, b, n * sizeof *a) != 0)
            CHECK_FAIL_("rope %s hd=%d: cpu-split differs from cpu", rope_type_name(k_ropes[r].type), hd);
        free(a);
        free(b);
        free(want_cpu);
        free(want_split);
    }
    backend_free(split);
}

static void test_embed_gather(void)
{
    static const int spec[3][3] = {{0, 0, 4}, {1, 3, 1}, {2, 0, 2}};
    test_batch tb;
    int vocab = 50, dim = 24;
    batch_make(&tb, 3, spec, vocab);
    FERRY_ASSERT(g_be->ops->set_batch(g_be, &tb.b) == FERRY_OK);
    double *tref;
    weight table = make_weight(DT_F16, vocab, dim, &tref, -1, 1);
    int n = tb.b.n_tokens;
    float *out = dev_poison((size_t)n * (size_t)dim);
    g_be->ops->embed(g_be, out, &table);
    double want[7 * 24];
    for (int t = 0; t < n; t++)
        for (int i = 0; i < dim; i++) want[t * dim + i] = tref[tb.b.tokens[t] * dim + i];
    float *got = host_of(out, (size_t)n * (size_t)dim);
    CHECK_CLOSE("embed", got, want, (size_t)n * (size_t)dim, 0);
    float *last = dev_poison(3 * (size_t)dim);
    g_be->ops->gather_last(g_be, last, out, dim);
    double want_last[3 * 24];
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < dim; i++) want_last[s * dim + i] = want[(tb.seqs[s].first + tb.seqs[s].n_tokens - 1) * dim + i];
    float *got_last = host_of(last, 3 * (size_t)dim);
    CHECK_CLOSE("gather_last", got_last, want_last, 3 * (size_t)dim, 0);
    free(got);
    free(got_last);
    free(tref);
    g_be->ops->release(g_be, (void *)table.data);
    g_be->ops->release(g_be, out);
    g_be->ops->release(g_be, last);
    batch_builder_free(&tb.bb);
}

static void test_elementwise(void)
{
    size_t n = 1000;
    float *gh = malloc(n * sizeof *gh), *uh = malloc(n * sizeof *uh);
    double *want = malloc(n * sizeof *want);
    for (size_t i = 0; i < n; i++) {
        gh[i] = 8 * frand(); /* both tails of SiLU */
        uh[i] = frand();
        want[i] = (double)gh[i] / (1 + exp(-(double)gh[i])) * uh[i];
    }
    float *g = dev_copy(gh, n * sizeof *gh), *u = dev_copy(uh, n * sizeof *uh);
    g_be->ops->silu_mul(g_be, g, u, n);
    float *got = host_of(g, n);
    CHECK_CLOSE("silu_mul", got, want, n, 1e-6);
    free(got);
    for (size_t i = 0; i < n; i++) want[i] = 2.0 * uh[i];
    g_be->ops->add(g_be, u, u, n);
    got = host_of(u, n);
    CHECK_CLOSE("add", got, want, n, 1e-7);
    free(got);
    free(gh);
    free(uh);
    free(want);
    g_be->ops->release(g_be, g);
    g_be->ops->release(g_be, u);
}

/* Mixture-of-experts rows: gather with repeated and out-of-order rows;
 * scatter to a shuffled set of rows times per-row weights; combine k rows
 * per token into x. The reference does the same f32 operations in the
 * same order (one product per scattered element, the k rows summed left
 * to right, then added), so every backend must match it bit for bit. */
static void moe_ops_case(int n, int k, int dim)
{
    int src_rows = n + 3, m = n * k;
    double *xref, *yref, *rref;
    float *x = rand_vec((size_t)src_rows * (size_t)dim, &xref);
    int32_t *rows = malloc((size_t)m * sizeof *rows), *dest = malloc((size_t)m * sizeof *dest);
    float *scale = malloc((size_t)m * sizeof *scale);
    for (int i = 0; i < m; i++) {
        rows[i] = (int32_t)((unsigned)(i * 7 + 2) % (unsigned)src_rows);
        dest[i] = i;
        scale[i] = 0.5f + 0.5f * fabsf(frand());
    }
    for (int i = m - 1; i > 0; i--) { /* a permutation: every row of out written once */
        int j = (int)((frand() + 1.0f) * 0.5f * (float)(i + 1));
        if (j > i) j = i;
        int32_t t = dest[i];
        dest[i] = dest[j];
        dest[j] = t;
    }
    int32_t *rows_dev = dev_copy(rows, (size_t)m * sizeof *rows), *dest_dev = dev_copy(dest, (size_t)m * sizeof *dest);
    float *scale_dev = dev_copy(scale, (size_t)m * sizeof *scale);
    size_t md = (size_t)m * (size_t)dim, nd = (size_t)n * (size_t)dim;
    double *want = malloc(md * sizeof *want);
    char what[96];

    float *g = dev_poison(md);
    g_be->ops->gather_rows(g_be, g, x, rows_dev, m, dim);
    for (int i = 0; i < m; i++)
        for (int d = 0; d < dim; d++) want[(size_t)i * dim + d] = xref[(size_t)rows[i] * dim + d];
    float *got = host_of(g, md);
    snprintf(what, sizeof what, "gather_rows n=%d dim=%d", m, dim);
    CHECK_CLOSE(what, got, want, md, 0);
    free(got);

    float *y = rand_vec(md, &yref), *out = dev_poison(md);
    g_be->ops->scatter_rows(g_be, out, y, dest_dev, scale_dev, m, dim);
    for (int i = 0; i < m; i++)
        for (int d = 0; d < dim; d++) want[(size_t)dest[i] * dim + d] = (float)yref[(size_t)i * dim + d] * scale[i];
    got = host_of(out, md);
    snprintf(what, sizeof what, "scatter_rows n=%d dim=%d", m, dim);
    CHECK_CLOSE(what, got, want, md, 0);
    free(got);

    float *res = rand_vec(nd, &rref);
    g_be->ops->moe_combine(g_be, res, out, n, k, dim);
    float *outh = host_of(out, md);
    for (int t = 0; t < n; t++)
        for (int d = 0; d < dim; d++) {
            float sum = outh[(size_t)t * k * dim + d];
            for (int j = 1; j < k; j++) sum += outh[((size_t)t * k + j) * dim + d];
            want[(size_t)t * dim + d] = (float)rref[(size_t)t * dim + d] + sum;
        }
    got = host_of(res, nd);
    snprintf(what, sizeof what, "moe_combine n=%d k=%d dim=%d", n, k, dim);
    CHECK_CLOSE(what, got, want, nd, 0);
    free(got);
    free(outh);

    free(xref);
    free(yref);
    free(rref);
    free(want);
    free(rows);
    free(dest);
    free(scale);
    void *bufs[] = {x, rows_dev, dest_dev, scale_dev, g, y, out, res};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) g_be->ops->release(g_be, bufs[i]);
}

static void test_moe_ops(void)
{
    static const int cases[][3] = {{1, 1, 64}, {1, 8, 2048}, {5, 2, 70}, {37, 4, 96}, {100, 2, 33}, {3, 8, 4096}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) moe_ops_case(cases[i][0], cases[i][1], cases[i][2]);
}

/* Sequences at different positions in different KV sequences; earlier
 * positions are filled by a first step, then a second step adds rows and
 * attends. The cache is paged (kv.h) with blocks of 4 positions, so rows
 * cross block boundaries, and the block tables are shuffled over a pool
 * with spare blocks: no sequence's blocks are contiguous or in order. The
 * reference indexes logical positions. */
static void attention_case(int heads, int kv_heads, int hd, int window)
{
    int n_seqs = 3, max_ctx = 40, kv_dim = kv_heads * hd, bsize = 4;
    int max_blocks = max_ctx / bsize, n_blocks = n_seqs * max_blocks + 7;
    size_t cache = (size_t)n_seqs * (size_t)max_ctx * (size_t)kv_dim;
    size_t pool_elems = (size_t)n_blocks * (size_t)bsize * (size_t)kv_dim;
    double *kref_all = calloc(cache, sizeof *kref_all), *vref_all = calloc(cache, sizeof *vref_all);
    int32_t perm[n_blocks];
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) { /* Fisher-Yates, frand's stream */
        int j = (int)((frand() + 1.0f) * 0.5f * (float)(i + 1));
        if (j > i) j = i;
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t *table_dev = dev_copy(perm, (size_t)n_seqs * (size_t)max_blocks * sizeof *perm);
    kv_layer kv = {dev_poison(pool_elems), dev_poison(pool_elems), table_dev, n_seqs, max_blocks, bsize, n_blocks, kv_dim};
    static const int step1[3][3] = {{0, 0, 6}, {2, 0, 20}, {1, 0, 1}};
    static const int step2[3][3] = {{2, 20, 1}, {0, 6, 5}, {1, 1, 1}};
    const int (*steps[2])[3] = {step1, step2};
    for (int st = 0; st < 2; st++) {
        test_batch tb;
        batch_make(&tb, 3, steps[st], 10);
        FERRY_ASSERT(g_be->ops->set_batch(g_be, &tb.b) == FERRY_OK);
        int n = tb.b.n_tokens;
        double *qref, *kref, *vref;
        float *q = rand_vec((size_t)n * (size_t)heads * (size_t)hd, &qref);
        float *k = rand_vec((size_t)n * (size_t)kv_dim, &kref);
        float *v = rand_vec((size_t)n * (size_t)kv_dim, &vref);
        for (int s = 0; s < 3; s++)
            for (int i = 0; i < tb.seqs[s].n_tokens; i++) {
                size_t dst = ((size_t)tb.seqs[s].kv_seq * (size_t)max_ctx + (size_t)(tb.seqs[s].n_past + i)) * (size_t)kv_dim;
                size_t src = (size_t)(tb.seqs[s].first + i) * (size_t)kv_dim;
                memcpy(kref_all + dst, kref + src, (size_t)kv_dim * sizeof(double));
                memcpy(vref_all + dst, vref + src, (size_t)kv_dim * sizeof(double));
            }
        g_be->ops->kv_store(g_be, &kv, k, v);
        float *out = dev_poison((size_t)n * (size_t)heads * (size_t)hd);
        attn_shape shape = {heads, kv_heads, hd, window};
        g_be->ops->attention(g_be, out, q, &kv, &shape);
        double *want = calloc((size_t)n * (size_t)heads * (size_t)hd, sizeof *want);
        double score[64];
        for (int s = 0; s < 3; s++)
            for (int i = 0; i < tb.seqs[s].n_tokens; i++) {
                int t = tb.seqs[s].first + i, p = tb.b.pos[t];
                for (int h = 0; h < heads; h++) {
                    int g = h / (heads / kv_heads);
                    const double *qv = qref + ((size_t)t * (size_t)heads + (size_t)h) * (size_t)hd;
                    double mx = -INFINITY, sum = 0;
                    for (int j = 0; j <= p; j++) {
                        score[j] = -INFINITY;
                        if (window > 0 && p - j >= window) continue;
                        const double *kv_ = kref_all + ((size_t)tb.seqs[s].kv_seq * (size_t)max_ctx + (size_t)j) * (size_t)kv_dim + (size_t)g * (size_t)hd;
                        double d = 0;
                        for (int e = 0; e < hd; e++) d += qv[e] * kv_[e];
                        score[j] = d / sqrt(hd);
                        if (score[j] > mx) mx = score[j];
                    }
                    for (int j = 0; j <= p; j++) sum += score[j] == -INFINITY ? 0 : exp(score[j] - mx);
                    double *o = want + ((size_t)t * (size_t)heads + (size_t)h) * (size_t)hd;
                    for (int j = 0; j <= p; j++) {
                        if (score[j] == -INFINITY) continue;
                        double wgt = exp(score[j] - mx) / sum;
                        const double *vv = vref_all + ((size_t)tb.seqs[s].kv_seq * (size_t)max_ctx + (size_t)j) * (size_t)kv_dim + (size_t)g * (size_t)hd;
                        for (int e = 0; e < hd; e++) o[e] += wgt * vv[e];
                    }
                }
            }
        float *got = host_of(out, (size_t)n * (size_t)heads * (size_t)hd);
        char what[96];
        snprintf(what, sizeof what, "attention heads=%d kv=%d hd=%d window=%d step=%d", heads, kv_heads, hd, window, st);
        CHECK_CLOSE(what, got, want, (size_t)n * (size_t)heads * (size_t)hd, 1e-5);
        free(got);
        free(want);
        free(qref);
        free(kref);
        free(vref);
        g_be->ops->release(g_be, q);
        g_be->ops->release(g_be, k);
        g_be->ops->release(g_be, v);
        g_be->ops->release(g_be, out);
        batch_builder_free(&tb.bb);
    }
    free(kref_all);
    free(vref_all);
    g_be->ops->release(g_be, kv.k);
    g_be->ops->release(g_be, kv.v);
    g_be->ops->release(g_be, table_dev);
}

int main(int argc, char **argv)
{
    const char *name = argc > 1 ? argv[1] : "cpu";
    backend_opts bo = {3, NULL, NULL}; /* more workers than cores: exercises task splitting */
    if (backend_create(name, &bo, &g_be) != FERRY_OK) {
        /* no GPU (or no CUDA build) is a skip, status 77 as automake has it;
         * `make test-gpu`, run only on GPU machines, treats it as a failure */
        bool skip = strcmp(name, "cuda") == 0;
        fprintf(stderr, "test_ops: %s%s\n", skip ? "skipped: " : "", ferry_errmsg());
        return skip ? 77 : 1;
    }
    test_matmul();
    test_qmatmul();
    if (strcmp(name, "cuda") != 0) test_matmul_batch_invariant();
    if (g_be->ops->gguf_blocks) test_gguf_matmul(strcmp(name, "cpu") == 0);
    if (strcmp(name, "cpu") == 0) /* every instruction set this processor offers (cpu_isa.c), each on its own */
        for (int i = 0; i < CPU_ISA_COUNT; i++) {
            backend *cpu = g_be;
            backend_opts io = {3, cpu_isa_name((cpu_isa)i), NULL};
            if (!cpu_isa_offered((cpu_isa)i)) {
                fprintf(stderr, "test_ops: cpu_isa %s not offered here: its kernels not run\n", io.isa);
                CHECK(backend_create("cpu", &io, &g_be) != FERRY_OK); /* refused, naming it */
                CHECK(strstr(ferry_errmsg(), io.isa) != NULL);
                g_be = cpu;
                continue;
            }
            FERRY_ASSERT(backend_create("cpu", &io, &g_be) == FERRY_OK);
            CHECK(strcmp(g_be->ops->kernels(g_be), io.isa) == 0);
            test_matmul();
            test_qmatmul();
            test_matmul_batch_invariant();
            test_gguf_matmul(true);
            backend_free(g_be);
            g_be = cpu;
        }
    if (strcmp(name, "cpu") == 0) { /* 8-bit activations where offered (AVX-512 VNNI), else refused naming why */
        backend *cpu = g_be;
        backend_opts io = {3, "avx512", "int8"};
        if (backend_create("cpu", &io, &g_be) == FERRY_OK) {
            CHECK(strcmp(g_be->ops->kernels(g_be), "avx512+int8") == 0);
            test_gguf_matmul(false);
            test_q_int8_activations();
            test_matmul(); /* the other weights keep f32 activations */
            backend_free(g_be);
        } else {
            fprintf(stderr, "test_ops: cpu_activations int8 not offered here: %s\n", ferry_errmsg());
            CHECK(strstr(ferry_errmsg(), "cpu_activations int8") || strstr(ferry_errmsg(), "cpu_isa avx512"));
        }
        io.isa = "avx2";
        CHECK(backend_create("cpu", &io, &g_be) != FERRY_OK); /* int8 needs the avx512 kernels */
        io = (backend_opts){3, "avx512", "bf16"};
        if (backend_create("cpu", &io, &g_be) == FERRY_OK) {
            CHECK(strcmp(g_be->ops->kernels(g_be), "avx512+bf16") == 0);
            test_bf16_activations();
            test_gguf_matmul(false); /* the other weights keep f32 activations */
            backend_free(g_be);
        } else {
            fprintf(stderr, "test_ops: cpu_activations bf16 not offered here: %s\n", ferry_errmsg());
            CHECK(strstr(ferry_errmsg(), "cpu_activations bf16") || strstr(ferry_errmsg(), "cpu_isa avx512"));
        }
        g_be = cpu;
    }
    test_rmsnorm(70);
    test_rmsnorm(4096);           /* more elements than one block's threads */
    test_rope(16);
    test_rope(128);
    if (strcmp(name, "cpu") == 0) {
        test_rope_split_same_bits(16);
        test_rope_split_same_bits(128);
    }
    test_embed_gather();
    test_elementwise();
    test_moe_ops();
    if (strcmp(name, "cpu") == 0) { /* and behind cpu-split's device memory and stream */
        backend *cpu = g_be;
        FERRY_ASSERT(backend_create("cpu-split", &bo, &g_be) == FERRY_OK);
        test_moe_ops();
        backend_free(g_be);
        g_be = cpu;
    }
    attention_case(4, 4, 16, 0);  /* MHA */
    attention_case(6, 2, 8, 0);   /* GQA */
    attention_case(4, 2, 16, 4);  /* sliding window */
    /* the head sizes real models use, one that is not a multiple of 32, and
     * wide query groups */
    attention_case(8, 2, 64, 0);
    attention_case(4, 1, 128, 0);
    attention_case(2, 2, 256, 0);
    attention_case(4, 2, 80, 0);
    attention_case(8, 1, 32, 6);
    backend_free(g_be);
    return check_report();
}
