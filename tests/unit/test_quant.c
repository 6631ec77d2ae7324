/*
 * test_quant.c - the weight quantizer (engine/weights/quant.h).
 *
 * Covers: names and sizes; rows of zeros (scale eps of the scale dtype, all
 * q 0); values at exactly +-absmax (127.5 -> 127 clamped, -127.5 -> -128;
 * 7.5 -> 7, -7.5 -> -8); .5 ties rounding to even; a bf16 quotient rounding
 * before the integer rounding; rows shorter than a group and column counts
 * not a multiple of 8 or 128 (zero padding nibbles, short last group); huge
 * outliers; F32/F16/BF16 weights with every scale dtype; the error bound
 * |x - q s| <= s (1/2 + half an ulp of x / s in the quotient's dtype) on
 * random rows; NaN and Inf refused naming tensor, row and column; bad
 * arguments and scales that overflow their dtype refused; --quantize-head
 * (convert.h): refused without --quantize int8/int4, a tied head held
 * apart, lm_head's engine form. Bit-for-bit
 * agreement with compressed-tensors' own op sequence is
 * tests/integration/test_quant_exact.py.
 */
#include <math.h>
#include <stdlib.h>

#include "../../engine/weights/convert.h"
#include "../../engine/weights/ct_config.h"
#include "../../engine/weights/quant.h"
#include "check.h"

/* ---- helpers ------------------------------------------------------------------ */

/* A weight of dtype dt holding x[rows * cols] (rounded to dt); owns its data. */
static weight make_weight(ferry_dtype dt, int64_t rows, int64_t cols, const float *x)
{
    size_t n = (size_t)(rows * cols);
    void *d = malloc(n * dtype_size(dt));
    for (size_t i = 0; i < n; i++) {
        if (dt == DT_F32) ((float *)d)[i] = x[i];
        if (dt == DT_F16) ((uint16_t *)d)[i] = f32_to_f16(x[i]);
        if (dt == DT_BF16) ((uint16_t *)d)[i] = f32_to_bf16(x[i]);
    }
    return (weight){.dtype = dt, .rows = rows, .cols = cols, .data = d};
}

static float load(ferry_dtype dt, const weight *w, int64_t i)
{
    const void *p = w->data;
    if (dt == DT_F16) return f16_to_f32(((const uint16_t *)p)[i]);
    if (dt == DT_BF16) return bf16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

static float scale_at(const weight *q, int64_t i)
{
    const void *p = q->scales;
    if (q->scale_dtype == DT_F16) return f16_to_f32(((const uint16_t *)p)[i]);
    if (q->scale_dtype == DT_BF16) return bf16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* Quantizes src into a fresh weight (data and scales malloc'd): int8 per
 * channel, int4 with groups of 128 and a short last one where 128 does not
 * divide cols - the quantizer takes any group (a checkpoint's own), even
 * where ferry's choice of group (quant_default_group) would be another. */
static ferry_status quantize(weight_quant q, ferry_dtype sdt, const weight *src, weight *out)
{
    int group = q == WQ_INT8 ? (int)src->cols : QUANT_INT4_GROUP;
    void *data = calloc(1, quant_data_bytes(q, src->rows, src->cols) + 1);
    void *scales = calloc(1, quant_scale_bytes(src->rows, src->cols, group, sdt) + 1);
    *out = (weight){.dtype = q == WQ_INT8 ? DT_I8 : DT_I32, .rows = src->rows, .cols = src->cols, .data = data,
                    .quant = q, .group = group, .scale_dtype = sdt, .scales = scales};
    return quant_weight(q, group, sdt, src, data, scales, "t.weight");
}

static void free_weight(weight *w)
{
    free((void *)w->data);
    free((void *)w->scales);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float rnd_normal(void)
{
    float u[2];
    for (int i = 0; i < 2; i++) {
        rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
        u[i] = ((float)(rng_state >> 40) + 0.5f) / 16777216.f;
    }
    return sqrtf(-2.f * logf(u[0])) * cosf(6.2831853f * u[1]);
}

static const ferry_dtype k_dtypes[] = {DT_F32, DT_F16, DT_BF16};

/* ---- names and sizes --------------------------------------------------------- */

static void test_names_and_sizes(void)
{
    weight_quant q = WQ_NONE;
    for (weight_quant i = WQ_NONE; i <= WQ_INT4; i++) {
        CHECK(quant_parse(quant_name(i), &q));
        CHECK_EQ_INT(q, i);
    }
    CHECK_EQ_STR(quant_name(WQ_INT8), "int8");
    CHECK_EQ_STR(quant_name(WQ_INT4), "int4");
    CHECK_EQ_STR(quant_name(WQ_NONE), "none");
    q = WQ_INT4;
    CHECK(!quant_parse("INT8", &q));
    CHECK(!quant_parse("", &q));
    CHECK(!quant_parse(NULL, &q));
    CHECK_EQ_INT(q, WQ_INT4);

    CHECK_EQ_INT(quant_default_group(WQ_INT8, 300), 300);
    /* int4: 128 where it divides, one group for a row of up to 128, else
     * 64 or 32 where they divide, else per channel: always a divisor */
    static const int64_t cols_group[][2] = {{256, 128}, {1536, 128}, {64, 64}, {100, 100}, {128, 128},
                                            {576, 64}, {192, 64}, {160, 32}, {352, 32}, {300, 300},
                                            {688, 688}, {130, 130}};
    for (size_t i = 0; i < sizeof cols_group / sizeof cols_group[0]; i++) {
        CHECK_EQ_INT(quant_default_group(WQ_INT4, cols_group[i][0]), cols_group[i][1]);
        CHECK_EQ_INT(cols_group[i][0] % quant_default_group(WQ_INT4, cols_group[i][0]), 0);
    }
    CHECK_EQ_U64(quant_data_bytes(WQ_INT8, 3, 7), 21);
    CHECK_EQ_U64(quant_data_bytes(WQ_INT4, 3, 7), 12);  /* one word per row */
    CHECK_EQ_U64(quant_data_bytes(WQ_INT4, 3, 17), 36); /* three words */
    CHECK_EQ_U64(quant_scale_bytes(3, 300, 128, DT_BF16), 3 * 3 * 2);
    CHECK_EQ_U64(quant_scale_bytes(3, 300, 300, DT_F32), 3 * 4);
    /* agrees with backend.h's weight_bytes */
    weight w = {.quant = WQ_INT4, .rows = 5, .cols = 130, .group = 128, .scale_dtype = DT_F16};
    CHECK_EQ_U64(weight_bytes(&w), quant_data_bytes(WQ_INT4, 5, 130) + quant_scale_bytes(5, 130, 128, DT_F16));
}

/* ---- exact cases --------------------------------------------------------------- */

static void test_zero_rows(void)
{
    static const float eps[] = {[DT_F32] = 0x1p-23f, [DT_F16] = 0x1p-10f, [DT_BF16] = 0x1p-7f};
    float x[2 * 130] = {0};
    x[130 + 3] = 1.f; /* row 1 group 0 non-zero, group 1 (cols 128, 129) zero */
    for (int d = 0; d < 3; d++) {
        for (int s = 0; s < 3; s++) {
            weight src = make_weight(k_dtypes[d], 2, 130, x), w;
            CHECK_STATUS(quantize(WQ_INT4, k_dtypes[s], &src, &w), FERRY_OK);
            CHECK(scale_at(&w, 0) == eps[k_dtypes[s]]);
            CHECK(scale_at(&w, 1) == eps[k_dtypes[s]]);
            CHECK(scale_at(&w, 3) == eps[k_dtypes[s]]);
            float out[130];
            quant_dequant_row(&w, 0, out);
            int nonzero = 0;
            for (int c = 0; c < 130; c++) nonzero += out[c] != 0.f || quant_value(&w, 0, c) != 0;
            CHECK_EQ_INT(nonzero, 0);
            CHECK_EQ_INT(quant_value(&w, 1, 3), 7);
            free_weight(&w);
            free((void *)src.data);

            src = make_weight(k_dtypes[d], 2, 130, x);
            CHECK_STATUS(quantize(WQ_INT8, k_dtypes[s], &src, &w), FERRY_OK);
            CHECK(scale_at(&w, 0) == eps[k_dtypes[s]]);
            CHECK_EQ_INT(quant_value(&w, 0, 77), 0);
            CHECK_EQ_INT(quant_value(&w, 1, 3), 127);
            free_weight(&w);
            free((void *)src.data);
        }
    }
}

/* Scale exactly 1 (absmax 127.5 or 7.5, representable in every dtype), so
 * q is round_half_even(x) clamped: ties, the ends and the clamp. */
static void test_ends_and_ties(void)
{
    static const float x8[] = {127.5f, -127.5f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f, -126.5f, 3.25f, 0.f};
    static const int q8[] = {127, -128, 0, 2, 2, 0, -2, -2, 126, -126, 3, 0};
    static const float x4[] = {7.5f, -7.5f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 6.5f, -6.5f, 3.25f};
    static const int q4[] = {7, -8, 0, 2, 2, 0, -2, -2, 6, -6, 3};
    for (int d = 0; d < 3; d++) {
        weight src = make_weight(k_dtypes[d], 1, 12, x8), w;
        CHECK_STATUS(quantize(WQ_INT8, k_dtypes[d], &src, &w), FERRY_OK);
        CHECK(scale_at(&w, 0) == 1.f);
        for (int c = 0; c < 12; c++) CHECK_EQ_INT(quant_value(&w, 0, c), q8[c]);
        free_weight(&w);
        free((void *)src.data);

        src = make_weight(k_dtypes[d], 1, 11, x4);
        CHECK_STATUS(quantize(WQ_INT4, k_dtypes[d], &src, &w), FERRY_OK);
        CHECK(scale_at(&w, 0) == 1.f);
        for (int c = 0; c < 11; c++) CHECK_EQ_INT(quant_value(&w, 0, c), q4[c]);
        float out[11];
        quant_dequant_row(&w, 0, out);
        for (int c = 0; c < 11; c++) CHECK(out[c] == (float)q4[c]);
        free_weight(&w);
        free((void *)src.data);
    }
}

/* The quotient is rounded to the weight's dtype before round-half-even:
 * absmax 95.5 gives scale bf16(0.749..) = 0.75; x = 76 gives x / s = 101.333.. in f32,
 * which bf16 rounds to 101.5 (spacing 0.5 there), a tie that rounds to 102;
 * the f32 quotient would give 101. */
static void test_quotient_in_weight_dtype(void)
{
    float x[2] = {95.5f, 76.f};
    weight src = make_weight(DT_BF16, 1, 2, x), w;
    CHECK(bf16_to_f32(f32_to_bf16(95.5f)) == 95.5f && bf16_to_f32(f32_to_bf16(76.f)) == 76.f);
    CHECK_STATUS(quantize(WQ_INT8, DT_BF16, &src, &w), FERRY_OK);
    CHECK(scale_at(&w, 0) == 0.75f);
    CHECK_EQ_INT(quant_value(&w, 0, 0), 127);
    CHECK_EQ_INT(quant_value(&w, 0, 1), 102);
    free_weight(&w);
    free((void *)src.data);
    /* an F32 weight with the same (bf16) scale divides in f32 */
    src = make_weight(DT_F32, 1, 2, x);
    CHECK_STATUS(quantize(WQ_INT8, DT_BF16, &src, &w), FERRY_OK);
    CHECK(scale_at(&w, 0) == 0.75f);
    CHECK_EQ_INT(quant_value(&w, 0, 1), 101);
    free_weight(&w);
    free((void *)src.data);
}

/* Rows shorter than a group, cols not a multiple of 8: the last group's
 * scale comes from its own columns, padding nibbles are 0. */
static void test_short_rows_and_packing(void)
{
    static const int cols_list[] = {1, 7, 9, 100, 128, 130, 300};
    for (size_t k = 0; k < sizeof cols_list / sizeof *cols_list; k++) {
        int cols = cols_list[k];
        float *x = malloc(sizeof(float) * 2 * (size_t)cols);
        for (int c = 0; c < 2 * cols; c++) x[c] = (float)((c % 15) - 7) * 0.25f; /* q = c%15 - 7 scaled */
        for (int r = 0; r < 2; r++) /* each group's absmax 7.5 * 0.25: scale 0.25 */
            for (int g = 0; g * 128 < cols; g++) x[r * cols + g * 128] = 7.5f * 0.25f;
        weight src = make_weight(DT_F32, 2, cols, x), w;
        CHECK_STATUS(quantize(WQ_INT4, DT_F32, &src, &w), FERRY_OK);
        int n_groups = (cols + 127) / 128, bad = 0;
        for (int i = 0; i < 2 * n_groups; i++) bad += scale_at(&w, i) != 0.25f;
        CHECK_EQ_INT(bad, 0);
        for (int r = 0; r < 2; r++) {
            for (int c = 0; c < cols; c++) {
                int want = c % 128 == 0 ? 7 : ((r * cols + c) % 15) - 7;
                bad += quant_value(&w, r, c) != want;
            }
            const uint8_t *row = (const uint8_t *)w.data + (size_t)r * weight_row_bytes(&w);
            for (int c = cols; c < (cols + 7) / 8 * 8; c++) bad += ((row[c >> 1] >> (4 * (c & 1))) & 0xf) != 0;
            /* element c is bits 4*(c % 8) of little-endian word c / 8 */
            uint32_t w0 = (uint32_t)row[0] | (uint32_t)row[1] << 8 | (uint32_t)row[2] << 16 | (uint32_t)row[3] << 24;
            for (int c = 0; c < cols && c < 8; c++) bad += (int)((w0 >> (4 * c)) & 0xf) - 8 != quant_value(&w, r, c);
        }
        CHECK_EQ_INT(bad, 0);
        free_weight(&w);
        free((void *)src.data);
        free(x);
    }
    /* a short last group gets its own scale: cols 130 = 128 + 2 */
    float y[130] = {0};
    y[0] = 75.f;   /* group 0: scale 10 */
    y[129] = -0.75f; /* group 1: scale 0.1 */
    weight src = make_weight(DT_F32, 1, 130, y), w;
    CHECK_STATUS(quantize(WQ_INT4, DT_F32, &src, &w), FERRY_OK);
    CHECK(scale_at(&w, 0) == 75.f / 7.5f);
    CHECK(scale_at(&w, 1) == 0.75f / 7.5f);
    CHECK_EQ_INT(quant_value(&w, 0, 129), -8);
    free_weight(&w);
    free((void *)src.data);
}

static void test_outliers(void)
{
    float x[256];
    for (int c = 0; c < 256; c++) x[c] = 0.01f * rnd_normal();
    x[17] = 1e4f;
    for (int d = 0; d < 3; d++) {
        weight src = make_weight(k_dtypes[d], 1, 256, x), w;
        CHECK_STATUS(quantize(WQ_INT8, k_dtypes[d], &src, &w), FERRY_OK);
        CHECK_EQ_INT(quant_value(&w, 0, 17), 127);
        int nonzero = 0;
        for (int c = 0; c < 256; c++) nonzero += c != 17 && quant_value(&w, 0, c) != 0;
        CHECK_EQ_INT(nonzero, 0); /* everything else is below half a step */
        free_weight(&w);
        free((void *)src.data);
    }
}

/* |x - q s| <= s (1/2 + u/2), u the ulp of x / s in the quotient's dtype
 * (F32 for mixed dtypes), for every element that is not clamped (a scale
 * rounded down to a narrower dtype puts x / s past q_max); plus the f32
 * dequantization's own rounding for F32 scales. With a bf16 quotient the
 * error reaches 0.75 s, not s / 2: compressed-tensors' arithmetic. */
static void test_error_bound(void)
{
    enum { ROWS = 16, COLS = 300 };
    float *x = malloc(sizeof(float) * ROWS * COLS), out[COLS];
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < COLS; c++) x[r * COLS + c] = rnd_normal() * powf(10.f, (float)(r % 5) - 3.f);
    for (int d = 0; d < 3; d++) {
        for (int s = 0; s < 3; s++) {
            for (weight_quant q = WQ_INT8; q <= WQ_INT4; q++) {
                ferry_dtype wd = k_dtypes[d], sd = k_dtypes[s];
                ferry_dtype div = wd == sd ? wd : DT_F32;
                int mant = div == DT_F32 ? 24 : div == DT_F16 ? 11 : 8;
                weight src = make_weight(wd, ROWS, COLS, x), w;
                CHECK_STATUS(quantize(q, sd, &src, &w), FERRY_OK);
                int bad = 0;
                for (int r = 0; r < ROWS; r++) {
                    quant_dequant_row(&w, r, out);
                    for (int c = 0; c < COLS; c++) {
                        float xv = load(wd, &src, r * COLS + c);
                        float sc = scale_at(&w, r * weight_groups(&w) + c / w.group);
                        float t = fabsf(xv / sc);
                        float lim = q == WQ_INT8 ? 127.5f : 7.5f;
                        if (xv / sc > lim || xv / sc < -lim - 1) continue; /* clamped */
                        float ulp = t > 0 ? ldexpf(1.f, ilogbf(t) - (mant - 1)) : 0;
                        double err = fabs((double)xv - (double)out[c]);
                        double bound = (double)sc * (0.5 + ulp / 2) * (1 + 0x1p-20) + fabs((double)out[c]) * 0x1p-24;
                        if (err > bound) {
                            if (!bad)
                                fprintf(stderr, "error bound: %s w %s s %s [%d,%d] x %g s %g deq %g\n",
                                        quant_name(q), dtype_name(wd), dtype_name(sd), r, c, (double)xv,
                                        (double)sc, (double)out[c]);
                            bad++;
                        }
                    }
                }
                CHECK_EQ_INT(bad, 0);
                free_weight(&w);
                free((void *)src.data);
            }
        }
    }
    free(x);
}

/* ---- refusals ------------------------------------------------------------------ */

static void test_nonfinite(void)
{
    float x[2 * 10];
    for (int i = 0; i < 20; i++) x[i] = 0.5f;
    const float bad[] = {NAN, INFINITY, -INFINITY};
    const char *what[] = {"NaN", "+Inf", "-Inf"};
    for (int d = 0; d < 3; d++) {
        for (int b = 0; b < 3; b++) {
            x[13] = bad[b]; /* row 1, column 3 */
            weight src = make_weight(k_dtypes[d], 2, 10, x), w;
            for (weight_quant q = WQ_INT8; q <= WQ_INT4; q++) {
                CHECK_STATUS(quantize(q, k_dtypes[d], &src, &w), FERRY_ERR_INVALID);
                CHECK_MSG_HAS("t.weight");
                CHECK_MSG_HAS("row 1, column 3");
                CHECK_MSG_HAS(what[b]);
                free_weight(&w);
            }
            free((void *)src.data);
        }
    }
}

static void test_bad_arguments(void)
{
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    weight src = make_weight(DT_F32, 2, 4, x);
    int8_t data[64];
    float scales[16];
    CHECK_STATUS(quant_weight(WQ_INT8, 0, DT_F32, &src, data, scales, "a"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("a: group 0");
    /* int8 per group (compressed-tensors' W8A16 preset from 0.19): a scale
     * per 2 columns, each group's absmax at +-127.5 scales */
    CHECK_STATUS(quant_weight(WQ_INT8, 2, DT_F32, &src, data, scales, "a"), FERRY_OK);
    for (int g = 0; g < 4; g++) CHECK(scales[g] == x[2 * g + 1] / 127.5f);
    weight w8 = {.dtype = DT_I8, .rows = 2, .cols = 4, .data = data, .quant = WQ_INT8, .group = 2,
                 .scale_dtype = DT_F32, .scales = scales};
    CHECK_EQ_INT(quant_value(&w8, 1, 3), 127); /* 8 / (8 / 127.5) = 127.5 -> 128, clamped */
    CHECK_EQ_INT(quant_value(&w8, 0, 0), 64);  /* 1 / (2 / 127.5) = 63.75 */
    CHECK_STATUS(quant_weight(WQ_INT4, 0, DT_F32, &src, data, scales, "a"), FERRY_ERR_INVALID);
    CHECK_STATUS(quant_weight(WQ_NONE, 4, DT_F32, &src, data, scales, "a"), FERRY_ERR_INVALID);
    CHECK_STATUS(quant_weight(WQ_INT8, 4, DT_I8, &src, data, scales, "a"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("I8");
    weight q8 = src;
    q8.dtype = DT_I8;
    CHECK_STATUS(quant_weight(WQ_INT8, 4, DT_F32, &q8, data, scales, "a"), FERRY_ERR_INVALID);
    q8 = src;
    q8.quant = WQ_INT8;
    CHECK_STATUS(quant_weight(WQ_INT8, 4, DT_F32, &q8, data, scales, "a"), FERRY_ERR_INVALID);
    /* a small int4 group works for any group size */
    CHECK_STATUS(quant_weight(WQ_INT4, 2, DT_F32, &src, data, scales, "a"), FERRY_OK);
    CHECK(scales[1] == 4.f / 7.5f);
    free((void *)src.data);

    /* an F32 weight whose scale does not fit an F16 scale */
    float big[2] = {1e7f, 1.f};
    src = make_weight(DT_F32, 1, 2, big);
    CHECK_STATUS(quant_weight(WQ_INT8, 2, DT_F16, &src, data, scales, "big"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("big: row 0");
    CHECK_MSG_HAS("F16");
    free((void *)src.data);
}

/* ---- the quantization_config an export writes (ct_config.c) ------------------- */

/* One config group per scheme; a name pattern whose layers share a scheme
 * is one regex target, one whose layers differ names them exactly; ignore
 * has lm_head (unless quantized) and the full-precision layers. */
static void test_ct_config(void)
{
    const ct_layer layers[] = {
        {"model.layers.0.self_attn.q_proj.weight", WQ_INT4, 64},
        {"model.layers.1.self_attn.q_proj.weight", WQ_INT4, 64},
        {"model.layers.0.mlp.down_proj.weight", WQ_INT4, 128},
        {"model.layers.1.mlp.down_proj.weight", WQ_INT4, 0}, /* mixed within its pattern */
        {"model.layers.0.mlp.experts.7.up_proj.weight", WQ_INT8, 0},
        {"model.layers.1.self_attn.k_proj.weight", WQ_NONE, 0},
    };
    strbuf sb;
    sb_init(&sb);
    CHECK_STATUS(ct_config_write(layers, (int)(sizeof layers / sizeof layers[0]), &sb), FERRY_OK);
    sb_putc(&sb, '\0');
    const char *want[] = {
        "\"group_0\": {\n        \"targets\": [\"re:model\\\\.layers\\\\.\\\\d+\\\\.self_attn\\\\.q_proj$\"]",
        "\"group_1\": {\n        \"targets\": [\"model.layers.0.mlp.down_proj\"]",
        "\"group_2\": {\n        \"targets\": [\"model.layers.1.mlp.down_proj\"]",
        "\"group_3\": {\n        \"targets\": [\"re:model\\\\.layers\\\\.\\\\d+\\\\.mlp\\\\.experts\\\\.\\\\d+\\\\.up_proj$\"]",
        "\"strategy\": \"group\", \"group_size\": 64",
        "\"num_bits\": 4, \"type\": \"int\", \"symmetric\": true, \"strategy\": \"channel\", \"group_size\": null",
        "\"num_bits\": 8, \"type\": \"int\", \"symmetric\": true, \"strategy\": \"channel\"",
        "\"ignore\": [\"lm_head\", \"model.layers.1.self_attn.k_proj\"]",
        "\"format\": \"pack-quantized\"",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        if (!strstr(sb.data, want[i])) fprintf(stderr, "ct_config: no %s in\n%s\n", want[i], sb.data);
        CHECK(strstr(sb.data, want[i]) != NULL);
    }
    CHECK(strstr(sb.data, "group_4") == NULL);
    sb_free(&sb);

    /* a quantized head is a target, not ignored; nothing quantized: nothing written */
    const ct_layer head[] = {{"lm_head.weight", WQ_INT8, 0}};
    sb_init(&sb);
    CHECK_STATUS(ct_config_write(head, 1, &sb), FERRY_OK);
    sb_putc(&sb, '\0');
    CHECK(strstr(sb.data, "\"targets\": [\"re:lm_head$\"]") != NULL);
    CHECK(strstr(sb.data, "\"ignore\": []") != NULL);
    sb_free(&sb);
    const ct_layer none[] = {{"model.layers.0.mlp.up_proj.weight", WQ_NONE, 0}};
    sb_init(&sb);
    CHECK_STATUS(ct_config_write(none, 1, &sb), FERRY_OK);
    CHECK_EQ_U64(sb.len, 0);
    sb_free(&sb);
}

/* ---- --quantize-head (convert.c) ------------------------------------------------- */

/* The tensor entry of lm_head in cfg's table (w from model_weights_alloc). */
static tensor_entry head_entry(const model_config *cfg, model_weights *w, int *n_out, unit_kind *first_unit)
{
    tensor_entry *v, e = {0};
    int n;
    CHECK_STATUS(model_tensor_entries(cfg, w, &v, &n), FERRY_OK);
    for (int i = 0; i < n; i++)
        if (v[i].lm_head) e = v[i];
    *n_out = n;
    *first_unit = v[0].unit;
    free(v);
    return e;
}

/* Refused without --quantize int8/int4; a tied model's head held apart
 * (its own lm_head entry, the table in the embedding unit); lm_head int8
 * per channel from a full-precision head whatever --quantize is, a
 * checkpoint's quantized head kept (dequantized by --quantize none), and
 * left alone with the option off. */
static void test_quantize_head(void)
{
    convert_opts o;
    CHECK_STATUS(convert_opts_parse(NULL, NULL, true, &o), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--quantize-head needs --quantize int8 or int4 (--quantize is not given)");
    CHECK_STATUS(convert_opts_parse(NULL, "none", true, &o), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("(--quantize is none)");
    CHECK_STATUS(convert_opts_parse(NULL, "int4", false, &o), FERRY_OK);
    CHECK(!o.head);
    CHECK_STATUS(convert_opts_parse("bf16", "int8", true, &o), FERRY_OK);
    CHECK(o.head && o.quant == WQ_INT8 && o.dtype == DT_BF16);
    char desc[160];
    convert_describe(&o, desc, sizeof desc);
    CHECK(strstr(desc, " quantize-head=int8 ") != NULL);
    convert_opts off;
    CHECK_STATUS(convert_opts_parse(NULL, "int8", false, &off), FERRY_OK);
    convert_describe(&off, desc, sizeof desc);
    CHECK(strstr(desc, "head") == NULL); /* blobs made without it keep their fingerprint */

    const char *json = "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 40, \"hidden_size\": 16, "
                       "\"intermediate_size\": 32, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
                       "\"hidden_act\": \"silu\", \"tie_word_embeddings\": true}";
    model_config tied, held;
    CHECK_STATUS(model_config_parse(json, strlen(json), "config.json", &tied), FERRY_OK);
    held = tied;
    convert_config(&off, &held);
    CHECK(held.tied && !held.head_from_embed);
    convert_config(&o, &held);
    CHECK(!held.tied && held.head_from_embed);

    model_weights w;
    int n_tied, n_held;
    unit_kind first;
    CHECK_STATUS(model_weights_alloc(&tied, &w), FERRY_OK);
    tensor_entry e = head_entry(&tied, &w, &n_tied, &first);
    CHECK(!e.lm_head); /* tied: no lm_head entry, the table is the head */
    e = head_entry(&held, &w, &n_held, &first);
    CHECK(e.lm_head && !e.linear && e.unit == UNIT_HEAD && e.dst == &w.lm_head && e.rows == 40 && e.cols == 16);
    CHECK(first == UNIT_EMBED && n_held == n_tied + 1);

    float x[40 * 16] = {0};
    weight src = make_weight(DT_BF16, 40, 16, x);
    w.lm_head = src;
    weight fmt;
    CHECK_STATUS(convert_format(&o, &e, &fmt), FERRY_OK);
    CHECK(fmt.quant == WQ_INT8 && fmt.dtype == DT_I8 && fmt.group == 16 && fmt.scale_dtype == DT_BF16);
    CHECK_STATUS(convert_format(&off, &e, &fmt), FERRY_OK);
    CHECK(fmt.quant == WQ_NONE && fmt.dtype == DT_BF16);
    /* a checkpoint's int4 head stays int4 under --quantize int8, --quantize none dequantizes it */
    w.lm_head = (weight){.dtype = DT_I32, .rows = 40, .cols = 16, .quant = WQ_INT4, .group = 16, .scale_dtype = DT_F16};
    CHECK_STATUS(convert_format(&off, &e, &fmt), FERRY_OK);
    CHECK(fmt.quant == WQ_INT4 && fmt.group == 16 && fmt.scale_dtype == DT_F16);
    convert_opts none;
    CHECK_STATUS(convert_opts_parse(NULL, "none", false, &none), FERRY_OK);
    CHECK_STATUS(convert_format(&none, &e, &fmt), FERRY_OK);
    CHECK(fmt.quant == WQ_NONE && fmt.dtype == DT_F16);
    free((void *)src.data);
    model_weights_free(&w);
}

int main(void)
{
    test_names_and_sizes();
    test_zero_rows();
    test_ends_and_ties();
    test_quotient_in_weight_dtype();
    test_short_rows_and_packing();
    test_outliers();
    test_error_bound();
    test_nonfinite();
    test_bad_arguments();
    test_ct_config();
    test_quantize_head();
    return check_report();
}
