/*
 * gguf_quant.h - GGUF's block types turned into f32, value for value as
 * ggml's reference dequantizers (ggml-quants.c dequantize_row_*) and the
 * gguf package compute them: the same products in the same order, never
 * fused (this file is compiled with -ffp-contract=off), so the results are
 * bit-equal to theirs. For conversions (--quantize, --weights-dtype), the
 * original-layout export, and as the reference the block kernels are
 * tested against.
 *
 * Block layouts (little-endian, fp16 scales), per ggml-common.h:
 *   Q4_0  32 values: d, 16 bytes of 4-bit q (low nibbles the first 16)  x = (q - 8) d
 *   Q4_1  32: d, m, 16 bytes of q                                        x = q d + m
 *   Q5_0  32: d, 32 high bits, 16 bytes of low nibbles                   x = (q - 16) d
 *   Q5_1  32: d, m, 32 high bits, 16 bytes                               x = q d + m
 *   Q8_0  32: d, 32 int8                                                 x = q d
 *   Q4_K 256: d, dmin, 12 bytes of eight 6-bit (scale, min) pairs, 128 bytes of q
 *             x = (d sc) q - (dmin m), a pair per 32 values
 *   Q5_K 256: as Q4_K with a fifth bit from 32 more bytes
 *   Q6_K 256: 128 bytes of low 4 bits, 64 of high 2 bits, 16 int8 scales, d
 *             x = (d sc) (q - 32), a scale per 16 values
 */
#ifndef FERRY_GGUF_QUANT_H
#define FERRY_GGUF_QUANT_H

#include <stdbool.h>
#include <stdint.h>

/* Whether gguf_dequant handles tensor type `type` (gguf.h's gguf_type). */
bool gguf_dequant_supported(uint32_t type);
/* n values (whole blocks of the type: gguf_type_block) from src into dst;
 * false, nothing written, for a type it does not handle. */
bool gguf_dequant(uint32_t type, const void *src, float *dst, uint64_t n);

#endif
