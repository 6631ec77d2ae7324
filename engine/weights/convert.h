/*
 * convert.h - the conversion between checkpoint tensors and engine tensors,
 * declared once and used by planning (bytes), loading (every tier), the
 * offload dir (its fingerprint) and export.
 *
 * A conversion is `--weights-dtype` (F32/F16/BF16 for every tensor that is
 * not quantized; default: each tensor's checkpoint dtype) and `--quantize`
 * (none/int8/int4 for the linear layers q/k/v/o and gate/up/down; default:
 * as the checkpoint - quantized tensors of a compressed-tensors checkpoint
 * stay quantized, the others stay full precision). The embedding, the norms
 * and the biases are never quantized; lm_head only where `--quantize-head`
 * asks (int8 per channel, whatever --quantize is: compressed-tensors' W8A16
 * channel scheme) or the checkpoint has it quantized (kept, like its linear
 * layers). A tied model whose head is quantized holds the head apart
 * (convert_config): the embedding table stays as it is for the row gather,
 * the head is a quantized copy of it. A quantized engine tensor is
 * one unit of data and scales (weight.h), laid out as
 *     [data: rows x weight_row_bytes][pad to CONVERT_ALIGN][scales]
 * wherever it is stored, so a group moves as one contiguous copy.
 *
 * Quantizing a full-precision weight follows quant.h (compressed-tensors'
 * formulas, docs/quantization.md); a weight in another dtype is first
 * converted to the target dtype, so its scales are in that dtype.
 * Dequantizing (--quantize none on a quantized checkpoint) gives q * scale
 * in the target dtype. A quantized checkpoint tensor cannot be requantized
 * to another scheme (that would compound two roundings): refused - except
 * a GGUF's blocks (WQ_GGUF), which stay as stored by default and are
 * dequantized to f32 (or --weights-dtype) and then quantized on --quantize
 * int8/int4, as llama.cpp's requantizing does.
 */
#ifndef FERRY_CONVERT_H
#define FERRY_CONVERT_H

#include <stdbool.h>
#include <stdint.h>

#include "../base/status.h"
#include "weight.h"
#include "model.h"

#define CONVERT_KEEP (-1) /* convert_opts: as the checkpoint */
#define CONVERT_ALIGN 256u /* the scales of a quantized tensor start here after its data */

typedef struct {
    int dtype; /* ferry_dtype DT_F32/DT_F16/DT_BF16, or CONVERT_KEEP */
    int quant; /* weight_quant of the linear layers, or CONVERT_KEEP */
    bool head; /* a full-precision lm_head is quantized int8 per channel */
} convert_opts;

static inline convert_opts convert_identity(void) { return (convert_opts){CONVERT_KEEP, CONVERT_KEEP, false}; }

/* Parses --weights-dtype ("f32", "f16", "bf16"; NULL or "" keeps),
 * --quantize ("none", "int8", "int4"; NULL or "" keeps) and
 * --quantize-head, which needs --quantize int8 or int4 (refused otherwise:
 * the head is quantized only along with the linear layers). */
ferry_status convert_opts_parse(const char *dtype, const char *quant, bool head, convert_opts *out);

/* The model as the conversion holds it; call after model_config_load and
 * before binding. A tied model whose head o quantizes gets its head apart
 * (model_config_untie_head: the embedding table its own unit, lm_head a
 * tensor of the head unit read from the table), so the head unit is the
 * quantized head alone and an export writes it untied. */
void convert_config(const convert_opts *o, model_config *cfg);

/* The engine form of checkpoint tensor e (bound: e->dst is the checkpoint
 * weight): dtype, quantization, shape; data and scales NULL. */
ferry_status convert_format(const convert_opts *o, const tensor_entry *e, weight *fmt);

/* Bytes of an engine tensor in its layout (data, pad, scales). */
uint64_t convert_bytes(const weight *fmt);
/* Byte offset of the scales in that layout. */
uint64_t convert_scales_offset(const weight *fmt);
/* Points fmt's data (and scales) into a buffer holding its layout. */
void convert_bind(weight *fmt, const void *base);
/* True when the engine form is the checkpoint tensor's bytes as they are. */
bool convert_is_copy(const weight *src, const weight *fmt);

/* Converts rows [r0, r0 + n) of src (a bound checkpoint weight) into fmt's
 * form: the rows' data to data_out (n x weight_row_bytes(fmt)) and, for a
 * quantized fmt, their scales to scales_out (n x groups). `name` names the
 * tensor in errors (a NaN or Inf refused by the quantizer). */
ferry_status convert_rows(const weight *src, const weight *fmt, int64_t r0, int64_t n, void *data_out,
                          void *scales_out, const char *name);

/* Rows per piece when converting src to fmt in pieces of about `bytes`. */
int64_t convert_piece_rows(const weight *src, const weight *fmt, uint64_t bytes);

#define CONVERT_MAX_SCHEMES 8

/* One scheme of the engine's quantized tensors, as compressed-tensors names
 * it: group 0 is one scale per output channel (a group spanning the row);
 * for WQ_GGUF, group is the block type. */
typedef struct {
    weight_quant quant;
    int group;
    int n_tensors;
} convert_scheme;

/* What a conversion makes of a model (w the bound checkpoint): the bytes
 * of its tensors in their engine form (no layout padding), how many are
 * quantized and in which schemes (more than CONVERT_MAX_SCHEMES: the rest
 * are counted in n_quantized only), and how many of those ferry quantized
 * with another group than QUANT_INT4_GROUP because it does not divide
 * their columns (quant_default_group). */
typedef struct {
    uint64_t bytes;
    int n_quantized;
    int n_schemes;
    convert_scheme schemes[CONVERT_MAX_SCHEMES];
    int n_regrouped;
} convert_summary;

ferry_status convert_model_summary(const model_config *cfg, model_weights *w, const convert_opts *o,
                                   convert_summary *out);
/* "int4 group 128: 30 tensors, int4 group 64: 180 tensors"; "none". */
void convert_summary_describe(const convert_summary *s, char *buf, size_t cap);
/* The schemes' name in compressed-tensors' terms, as above: "int4 group 64",
 * "int8 per channel". */
void convert_scheme_name(weight_quant quant, int group, char *buf, size_t cap);
/* A weight's scheme group as compressed-tensors states it: 0 (per channel)
 * for a group that spans the row. */
static inline int convert_ct_group(const weight *fmt) { return fmt->group >= fmt->cols ? 0 : fmt->group; }

/* What the conversion is, for the offload dir's fingerprint and for
 * `inspect`/`plan`: "weights-dtype=bf16 quantize=int4(group 128) quantizer=..." */
void convert_describe(const convert_opts *o, char *buf, size_t cap);

#endif
