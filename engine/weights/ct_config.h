/*
 * ct_config.h - writing compressed-tensors' quantization_config (config.json)
 * for the linear layers of an exported checkpoint.
 *
 * compressed-tensors (and transformers and vLLM through it) applies a
 * config group's weight scheme to every module its `targets` match - an
 * exact module name, "re:" and a Python regex matched from the start of
 * the name, or a class name such as "Linear" - unless `ignore` matches it
 * too. ferry writes one config group per distinct scheme of the engine's
 * layers (int8/int4, per channel or a group size), whose targets are the
 * layers' names with every layer and expert index made \d+
 * ("re:model\.layers\.\d+\.self_attn\.q_proj$"): disjoint between groups,
 * short however many layers there are. Where the layers of one such
 * pattern have different schemes (a checkpoint served as it is may mix
 * them), those layers are named exactly instead. `ignore` names lm_head
 * unless it is quantized, and every linear layer left full precision (so
 * that a pattern covering it does not claim it). format is
 * "pack-quantized": ferry writes weight_packed for int8 and int4 alike
 * (docs/quantization.md). model.c's parse_quantization reads it back.
 */
#ifndef FERRY_CT_CONFIG_H
#define FERRY_CT_CONFIG_H

#include "../base/status.h"
#include "weight.h"
#include "../base/json.h"

/* A linear layer of the export. */
typedef struct {
    const char *name;   /* its weight's checkpoint name, "model.layers.0.mlp.down_proj.weight" */
    weight_quant quant; /* WQ_NONE: left full precision (ignored) */
    int group;          /* quantized: input columns per scale, 0 per channel */
} ct_layer;

/* Appends the quantization_config object to sb; nothing when no layer is
 * quantized. */
ferry_status ct_config_write(const ct_layer *layers, int n, strbuf *sb);

#endif
