/*
 * rope.h - the rotary position embedding of a checkpoint: config.json's
 * rope_theta and rope_scaling (or the newer rope_parameters), and the table
 * of inverse frequencies the backends' rope op rotates by.
 *
 * The frequencies are computed once, when the model loads, the way
 * transformers' modeling_rope_utils.py computes them: its tensor arithmetic
 * in float32, one rounding per torch op (rope.c is built without
 * floating-point contraction for that), and its Python arithmetic (YaRN's
 * correction range and attention factor) in double. Supported types:
 *   default  inv_freq[i] = 1 / theta^(2i / head_dim)
 *   linear   default / factor
 *   llama3   Llama 3.1's bands: wavelengths longer than
 *            original_max_position_embeddings / low_freq_factor divided by
 *            factor, shorter than .../ high_freq_factor kept, a smooth blend
 *            in between
 *   yarn     a ramp between interpolated (/ factor) and extrapolated
 *            frequencies over the dimensions beta_fast..beta_slow rotations
 *            delimit, and an attention factor both cos and sin are
 *            multiplied by
 * "dynamic", "longrope" and any other type are refused, naming the type:
 * they would give silently different answers.
 */
#ifndef FERRY_ROPE_H
#define FERRY_ROPE_H

#include <stdbool.h>

#include "../base/json.h"
#include "../base/status.h"

typedef enum { ROPE_DEFAULT, ROPE_LINEAR, ROPE_LLAMA3, ROPE_YARN } rope_type;

typedef struct {
    rope_type type;
    double theta;            /* rope_theta */
    double factor;           /* linear, llama3, yarn; 1 for default */
    double low_freq_factor;  /* llama3 */
    double high_freq_factor; /* llama3 */
    int original_max_pos;    /* llama3, yarn (yarn: else max_position_embeddings); 0 for the others */
    double beta_fast;        /* yarn: rotations bounding the ramp, 32 and 1 by default */
    double beta_slow;
    bool truncate;           /* yarn: round the ramp's ends to whole dimensions */
    double attention_factor; /* yarn: given, or from factor, mscale and mscale_all_dim; 1 for the others */
} rope_config;

/* Reads rope_theta and rope_scaling / rope_parameters from config.json's
 * root object; `label` names the file in errors, max_pos is the config's
 * max_position_embeddings (YaRN's default original length). */
ferry_status rope_config_parse(const json_value *root, const char *label, int max_pos, rope_config *out);

/* "default", "linear", "llama3", "yarn". */
const char *rope_type_name(rope_type t);

/* inv_freq[head_dim / 2]: the angle of pair (i, i + head_dim/2) at position
 * p is p * inv_freq[i], in float32 (head_dim even). */
void rope_inv_freq(const rope_config *rc, int head_dim, float *inv_freq);

/* What cos and sin are multiplied by (transformers' attention_scaling),
 * in the float32 the multiplication is done in. */
float rope_attn_scale(const rope_config *rc);

#endif
