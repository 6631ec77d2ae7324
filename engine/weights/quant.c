/*
 * quant.c - round-to-nearest weight quantization, bit-exact with
 * compressed-tensors (docs/quantization.md has the math and its sources).
 *
 * One row at a time: widen the row to f32, refuse NaN/Inf, then per group
 * take the absmax, derive the scale in the weight's dtype, round it to the
 * scale dtype (eps where it is 0), and quantize every element as
 * clamp(round_half_even(fl_div(x / scale))), where fl_div rounds the f32
 * quotient to the dtype PyTorch divides in (the promotion of the weight and
 * scale dtypes). Rounding the quotient matters: compressed-tensors divides
 * bf16 by bf16 and gets a bf16 quotient (spacing 0.5 between 64 and 128),
 * which rounds to another integer than the f32 quotient would for about 7%
 * of int8 values of a bf16 weight (0.7% for int4, 1% / 0.2% for f16).
 */
#include "quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- names and sizes ------------------------------------------------------ */

static const char *const k_quant_names[] = {[WQ_NONE] = "none", [WQ_INT8] = "int8", [WQ_INT4] = "int4"};
#define N_PARSED 3 /* --quantize takes these; WQ_GGUF is only ever a checkpoint's */

const char *quant_name(weight_quant q)
{
    if (q == WQ_GGUF) return "gguf blocks";
    return (unsigned)q < sizeof k_quant_names / sizeof *k_quant_names ? k_quant_names[q] : "?";
}

bool quant_parse(const char *s, weight_quant *out)
{
    for (unsigned i = 0; s && i < N_PARSED; i++) {
        if (strcmp(s, k_quant_names[i]) == 0) {
            *out = (weight_quant)i;
            return true;
        }
    }
    return false;
}

int quant_default_group(weight_quant q, int64_t cols)
{
    switch (q) {
    case WQ_INT8: return (int)cols;
    case WQ_INT4:
        if (cols <= QUANT_INT4_GROUP) return (int)cols;
        for (int g = QUANT_INT4_GROUP; g >= QUANT_INT4_MIN_GROUP; g /= 2)
            if (cols % g == 0) return g;
        return (int)cols;
    default: return 0;
    }
}

size_t quant_data_bytes(weight_quant q, int64_t rows, int64_t cols)
{
    weight w = {.quant = q, .rows = rows, .cols = cols, .group = 1};
    return (size_t)rows * weight_row_bytes(&w);
}

size_t quant_scale_bytes(int64_t rows, int64_t cols, int group, ferry_dtype scale_dtype)
{
    if (group < 1) return 0;
    return (size_t)(rows * ((cols + group - 1) / group)) * dtype_size(scale_dtype);
}

/* ---- element conversions ---------------------------------------------------- */

/* v rounded to nearest-even in dt and widened back (what a PyTorch op with
 * an f32 opmath and a dt result leaves). */
static float round_to(ferry_dtype dt, float v)
{
    switch (dt) {
    case DT_F16: return f16_to_f32(f32_to_f16(v));
    case DT_BF16: return bf16_to_f32(f32_to_bf16(v));
    default: return v;
    }
}

/* torch.promote_types over the float dtypes: equal ones stay, F32 wins,
 * F16 with BF16 is F32. */
static ferry_dtype promote(ferry_dtype a, ferry_dtype b)
{
    return a == b ? a : DT_F32;
}

/* torch.finfo(dt).eps: what compressed-tensors puts in place of a 0 scale. */
static float dtype_eps(ferry_dtype dt)
{
    switch (dt) {
    case DT_F16: return 0x1p-10f;
    case DT_BF16: return 0x1p-7f;
    default: return 0x1p-23f;
    }
}

/* ---- quantize --------------------------------------------------------------- */

/* q_min, q_max and the scale's divisor (q_max - q_min) / 2 of a layout. */
typedef struct {
    float q_min, q_max, half_range;
} quant_range;

static quant_range range_of(weight_quant q)
{
    return q == WQ_INT8 ? (quant_range){-128.f, 127.f, 127.5f} : (quant_range){-8.f, 7.f, 7.5f};
}

static ferry_status refuse_nonfinite(const char *name, int64_t row, int64_t col, float v)
{
    return ferry_fail(FERRY_ERR_INVALID, "%s: row %lld, column %lld is %s: a weight with NaN or infinite values cannot be quantized",
                      name ? name : "weight", (long long)row, (long long)col,
                      isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf");
}

/* Quantizes x[0..n) with divisor s into q[0..n): the rounded quotient, clamped. */
static void quantize_group(const float *x, int64_t n, float s, ferry_dtype div_dtype, quant_range r,
                           int8_t *q)
{
    switch (div_dtype) {
    case DT_BF16:
        for (int64_t i = 0; i < n; i++) {
            float t = rintf(bf16_to_f32(f32_to_bf16(x[i] / s)));
            q[i] = (int8_t)fminf(fmaxf(t, r.q_min), r.q_max);
        }
        break;
    case DT_F16:
        for (int64_t i = 0; i < n; i++) {
            float t = rintf((float)(_Float16)(x[i] / s));
            q[i] = (int8_t)fminf(fmaxf(t, r.q_min), r.q_max);
        }
        break;
    default:
        for (int64_t i = 0; i < n; i++) {
            float t = rintf(x[i] / s);
            q[i] = (int8_t)fminf(fmaxf(t, r.q_min), r.q_max);
        }
        break;
    }
}

ferry_status quant_weight(weight_quant q, int group, ferry_dtype scale_dtype, const weight *src,
                          void *data_out, void *scales_out, const char *name)
{
    const char *nm = name ? name : "weight";
    if (q != WQ_INT8 && q != WQ_INT4)
        return ferry_fail(FERRY_ERR_INVALID, "%s: unknown quantization %d", nm, (int)q);
    if (src->quant != WQ_NONE || !dtype_is_compute(src->dtype))
        return ferry_fail(FERRY_ERR_INVALID, "%s: only an F32, F16 or BF16 weight can be quantized (got %s)", nm,
                          src->quant != WQ_NONE ? quant_name(src->quant) : dtype_name(src->dtype));
    if (!dtype_is_compute(scale_dtype))
        return ferry_fail(FERRY_ERR_INVALID, "%s: scales must be F32, F16 or BF16 (got %s)", nm, dtype_name(scale_dtype));
    if (src->rows < 0 || src->cols < 1)
        return ferry_fail(FERRY_ERR_INVALID, "%s: cannot quantize a [%lld, %lld] weight", nm, (long long)src->rows,
                          (long long)src->cols);
    if (group < 1)
        return ferry_fail(FERRY_ERR_INVALID, "%s: group %d does not fit %s (cols %lld)", nm, group, quant_name(q),
                          (long long)src->cols);

    const int64_t rows = src->rows, cols = src->cols, n_groups = (cols + group - 1) / group;
    const quant_range r = range_of(q);
    const ferry_dtype div_dtype = promote(src->dtype, scale_dtype);
    const float eps = dtype_eps(scale_dtype);
    const size_t row_bytes = quant_data_bytes(q, 1, cols);
    float *x = malloc((size_t)cols * sizeof *x);      /* [cols] the row widened */
    int8_t *qv = malloc((size_t)cols * sizeof *qv);   /* [cols] its quantized values */
    if (!x || !qv) {
        free(x);
        free(qv);
        return ferry_fail(FERRY_ERR_NOMEM, "%s: no memory for a row of %lld columns", nm, (long long)cols);
    }

    ferry_status st = FERRY_OK;
    for (int64_t row = 0; row < rows && st == FERRY_OK; row++) {
        for (int64_t c = 0; c < cols; c++) x[c] = dtype_load_f32(src->dtype, src->data, (size_t)(row * cols + c));
        for (int64_t c = 0; c < cols; c++) {
            if (!isfinite(x[c])) {
                st = refuse_nonfinite(nm, row, c, x[c]);
                break;
            }
        }
        if (st != FERRY_OK) break;

        for (int64_t g = 0; g < n_groups; g++) {
            const int64_t c0 = g * group, n = cols - c0 < group ? cols - c0 : group;
            /* min clamped to <= 0 and max to >= 0, so max(|min|, |max|) is
             * the absmax of the group and 0 (not -inf) for an empty one */
            float amax = 0.f;
            for (int64_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[c0 + i]));
            /* the scale as PyTorch computes it in the weight's dtype, then
             * rounded to the scale dtype; 0 becomes eps so nothing divides
             * by zero */
            float s = round_to(scale_dtype, round_to(src->dtype, amax / r.half_range));
            if (s == 0.f) s = eps;
            if (!isfinite(s)) {
                st = ferry_fail(FERRY_ERR_INVALID, "%s: row %lld, group %lld: scale %g overflows %s", nm,
                                (long long)row, (long long)g, (double)(amax / r.half_range), dtype_name(scale_dtype));
                break;
            }
            dtype_store_f32(scale_dtype, scales_out, (size_t)(row * n_groups + g), s);
            quantize_group(x + c0, n, s, div_dtype, r, qv + c0);
        }
        if (st != FERRY_OK) break;

        uint8_t *out = (uint8_t *)data_out + (size_t)row * row_bytes;
        if (q == WQ_INT8) {
            memcpy(out, qv, (size_t)cols);
        } else {
            /* element c in bits 4*(c % 8) of little-endian word c / 8, i.e.
             * the low nibble of byte c / 2 for even c; stored as q + 8; the
             * padding nibbles of the last word are 0, as pack_to_int32
             * pads the offset values with zeros */
            memset(out, 0, row_bytes);
            for (int64_t c = 0; c < cols; c++) out[c >> 1] |= (uint8_t)((qv[c] + 8) << (4 * (c & 1)));
        }
    }
    free(x);
    free(qv);
    return st;
}

/* ---- dequantize ------------------------------------------------------------- */

int quant_value(const weight *w, int64_t row, int64_t col)
{
    const uint8_t *d = (const uint8_t *)w->data + (size_t)row * weight_row_bytes(w);
    if (w->quant == WQ_INT8) return ((const int8_t *)d)[col];
    return ((d[col >> 1] >> (4 * (col & 1))) & 0xf) - 8;
}

void quant_dequant_row(const weight *w, int64_t row, float *out)
{
    FERRY_ASSERT(w->quant == WQ_INT8 || w->quant == WQ_INT4);
    const int64_t n_groups = weight_groups(w);
    for (int64_t c = 0; c < w->cols; c++) {
        float s = dtype_load_f32(w->scale_dtype, w->scales, (size_t)(row * n_groups + c / w->group));
        out[c] = (float)quant_value(w, row, c) * s;
    }
}
