/*
 * weight.h - a weight tensor as compute reads it: its dtype, shape, data and,
 * when quantized, its scales (the layouts compressed-tensors writes). The
 * loaders (model.c, convert.c) make them, the backends (backend.h) compute
 * from them.
 */
#ifndef FERRY_WEIGHT_H
#define FERRY_WEIGHT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "gguf.h"

/* How a weight's values are stored. Quantized weights are weight-only,
 * symmetric (zero point 0), in the layouts compressed-tensors writes, so a
 * checkpoint's tensors are used as they are:
 *   WQ_INT8: data int8 [rows, cols]; one scale per output row (group = cols)
 *            or per `group` input columns (compressed-tensors' W8A16 from 0.19).
 *   WQ_INT4: data [rows, ceil(cols / 8)] little-endian int32 words: element c
 *            of a row is bits 4*(c % 8) .. 4*(c % 8)+3 of word c / 8 (so byte
 *            c / 2, low nibble for even c), stored as q + 8 in 0..15; one
 *            scale per `group` input columns (128; a row's last group may be
 *            shorter).
 * The value of element (r, c) is q(r, c) * scales[r * n_groups + c / group],
 * n_groups = ceil(cols / group), scales in scale_dtype (F32/F16/BF16).
 *   WQ_GGUF: a GGUF file's blocks as stored (gguf_quant.h has the layouts):
 *            data [rows, cols / block elements x block bytes] of type
 *            `block` (Q8_0, Q4_K, ...), the scales inside the blocks. */
typedef enum { WQ_NONE, WQ_INT8, WQ_INT4, WQ_GGUF } weight_quant;

/* A weight tensor as compute reads it. 1-D weights have rows == 1. */
typedef struct {
    ferry_dtype dtype;        /* WQ_NONE: F32/F16/BF16; WQ_INT8: I8; WQ_INT4: I32 (packed words); WQ_GGUF: U8 */
    int64_t rows, cols;       /* the logical shape, before packing */
    const void *data;         /* backend-readable; NULL for an absent optional weight */
    weight_quant quant;
    int group;                /* quantized: input columns per scale */
    ferry_dtype scale_dtype;  /* quantized: F32/F16/BF16 */
    const void *scales;       /* quantized: [rows, ceil(cols / group)], backend-readable */
    uint32_t block;           /* WQ_GGUF: the block type (gguf.h's gguf_type) */
} weight;

/* Whether w has a scales array (int8, int4; GGUF blocks hold their own). */
static inline bool weight_has_scales(const weight *w) { return w->quant == WQ_INT8 || w->quant == WQ_INT4; }

/* Scales per row (0 for an unquantized weight), bytes of one row of data,
 * and of data and scales together. */
static inline int64_t weight_groups(const weight *w)
{
    return weight_has_scales(w) ? (w->cols + w->group - 1) / w->group : 0;
}
static inline size_t weight_row_bytes(const weight *w)
{
    switch (w->quant) {
    case WQ_INT8: /* I8; I32: a pack-quantized checkpoint's four per word (convert.c) */
        return w->dtype == DT_I32 ? 4 * (size_t)((w->cols + 3) / 4) : (size_t)w->cols;
    case WQ_INT4: return 4 * (size_t)((w->cols + 7) / 8);
    case WQ_GGUF: {
        uint32_t elems = 1, bytes = 0;
        gguf_type_block(w->block, &elems, &bytes);
        return (size_t)(w->cols / elems) * bytes;
    }
    default: return (size_t)w->cols * dtype_size(w->dtype);
    }
}
static inline size_t weight_bytes(const weight *w)
{
    size_t scales = weight_has_scales(w) ? (size_t)(w->rows * weight_groups(w)) * dtype_size(w->scale_dtype) : 0;
    return (size_t)w->rows * weight_row_bytes(w) + scales;
}

#endif
