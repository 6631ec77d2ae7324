/*
 * quant.h - round-to-nearest weight quantization, bit-exact with
 * compressed-tensors.
 *
 * Turns an F32/F16/BF16 weight [rows, cols] into the quantized layouts of
 * weight.h (WQ_INT8: int8 per output channel; WQ_INT4: packed int32 words,
 * one scale per group of input columns), computing scales with the min-max
 * observer and quantizing the way compressed-tensors does for symmetric
 * weight-only W8A16 ("channel") and W4A16 ("group", 128) - so a checkpoint
 * ferry quantizes at load time or exports holds the same bits as one that
 * llm-compressor's round-to-nearest QuantizationModifier writes. The formulas,
 * the sources they were read from and the one place ferry can differ are in
 * docs/quantization.md. quant_dequant_row is the reference dequantization
 * that tests and export/inspect code compare against; compute has its own
 * kernels.
 */
#ifndef FERRY_QUANT_H
#define FERRY_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/status.h"
#include "weight.h"

/* compressed-tensors' W4A16 preset: 128 input columns per scale. */
#define QUANT_INT4_GROUP 128
/* The smallest group ferry falls back to where QUANT_INT4_GROUP does not
 * divide a layer's columns (quant_default_group). */
#define QUANT_INT4_MIN_GROUP 32

/* "none", "int8", "int4"; "?" for anything else. */
const char *quant_name(weight_quant q);
/* The inverse of quant_name; false (and *out untouched) if s is none of them. */
bool quant_parse(const char *s, weight_quant *out);

/* Input columns per scale that ferry quantizes a [rows, cols] weight with
 * (docs/quantization.md, "Columns that 128 does not divide"): cols for
 * WQ_INT8 (one scale per output channel); for WQ_INT4 QUANT_INT4_GROUP
 * when it divides cols, the whole row when cols <= QUANT_INT4_GROUP, else
 * the largest of 64 and 32 (down to QUANT_INT4_MIN_GROUP) that divides
 * cols, else the whole row (per channel) - a group always divides the
 * columns, as compressed-tensors requires; 0 for WQ_NONE. */
int quant_default_group(weight_quant q, int64_t cols);

/* Bytes of the data [rows, cols or ceil(cols / 8) words] and of the scales
 * [rows, ceil(cols / group)] of a quantized [rows, cols] weight. */
size_t quant_data_bytes(weight_quant q, int64_t rows, int64_t cols);
size_t quant_scale_bytes(int64_t rows, int64_t cols, int group, ferry_dtype scale_dtype); /* 0 for group < 1 */

/* Quantizes src (F32/F16/BF16 [rows, cols], quant WQ_NONE) into data_out
 * (quant_data_bytes) and scales_out (quant_scale_bytes, scale_dtype
 * F32/F16/BF16). group >= 1 (cols: one scale per output channel). A NaN or
 * infinite element fails with FERRY_ERR_INVALID naming `name`, its row and
 * column; nothing is promised about the outputs then. Independent rows; runs
 * on the calling thread. */
ferry_status quant_weight(weight_quant q, int group, ferry_dtype scale_dtype, const weight *src,
                          void *data_out, void *scales_out, const char *name);

/* out[c] = q(row, c) * scale(row, c / group), the product in f32 (exact for
 * F16/BF16 scales). w must be quantized and host-readable. */
void quant_dequant_row(const weight *w, int64_t row, float *out /* [w.cols] */);

/* The quantized value of element (row, col) of w, in [-128, 127] or [-8, 7]. */
int quant_value(const weight *w, int64_t row, int64_t col);

#endif
