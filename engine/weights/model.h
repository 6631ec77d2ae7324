/*
 * model.h - Llama-family architectures: config.json, and the mapping between
 * checkpoint tensors and the engine's weights.
 *
 * Supported: LlamaForCausalLM, MistralForCausalLM (sliding window),
 * Qwen2ForCausalLM (q/k/v bias) and Qwen3ForCausalLM (per-head q_norm and
 * k_norm), with plain or scaled RoPE (rope.h: linear, llama3, yarn); and the
 * mixtures of experts MixtralForCausalLM and Qwen3MoeForCausalLM, whose
 * sparse layers replace the MLP by a router and n_experts SwiGLU experts of
 * which each token uses top_k (softmax over all experts in f32, then top-k,
 * renormalized where norm_topk). A field
 * that would change the maths and is not implemented (another rope_scaling
 * type, another activation, ...) is an error naming the field, never a
 * silently wrong answer.
 *
 * The mapping is one table (model.c, k_specs): each entry names a checkpoint
 * tensor, the unit it belongs to (embedding, layer, head), its expected shape
 * and the engine field it fills. Loading walks it checkpoint -> engine.
 */
#ifndef FERRY_MODEL_H
#define FERRY_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "../base/status.h"
#include "weight.h"
#include "rope.h"
#include "safetensors.h"

typedef enum { ARCH_LLAMA, ARCH_MISTRAL, ARCH_QWEN2, ARCH_QWEN3, ARCH_MIXTRAL, ARCH_QWEN3_MOE } model_arch;

#define MODEL_MAX_LAYERS 4096 /* num_hidden_layers bound */
#define MODEL_MAX_EXPERTS 1024 /* num_experts / num_local_experts bound */
#define MODEL_MAX_SCHEMES 8    /* distinct weight schemes of a compressed-tensors checkpoint */

/* One weight scheme of a compressed-tensors config group that ferry loads. */
typedef struct {
    weight_quant quant;    /* WQ_INT8 or WQ_INT4 */
    int group;             /* input columns per scale; 0: one scale per output channel */
} model_quant_scheme;

typedef struct {
    model_arch arch;
    const char *arch_name; /* as in config.json "architectures" */
    int vocab;             /* vocab_size */
    int dim;               /* hidden_size */
    int hidden;            /* intermediate_size */
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int max_pos;           /* max_position_embeddings */
    int sliding_window;    /* 0: none */
    rope_config rope;      /* rope_theta and rope_scaling (rope.h) */
    float norm_eps;
    bool tied;             /* tie_word_embeddings, as the engine holds the model: the head is the embedding table */
    bool head_from_embed;  /* tie_word_embeddings in the checkpoint, but the engine holds the head apart
                            * (model_config_untie_head): lm_head.weight is read from model.embed_tokens.weight */
    bool qkv_bias;         /* q/k/v projections have a bias */
    bool o_bias;           /* o_proj has a bias */
    bool qk_norm;          /* Qwen3 q_norm / k_norm */
    /* mixture of experts (Mixtral, Qwen3-MoE); n_experts == 0: every layer dense */
    int n_experts;         /* num_local_experts (Mixtral) / num_experts (Qwen3-MoE) */
    int top_k;             /* num_experts_per_tok */
    int moe_hidden;        /* an expert's intermediate size: Mixtral intermediate_size, Qwen3-MoE moe_intermediate_size */
    bool norm_topk;        /* the top-k weights are divided by their sum: Mixtral always, Qwen3-MoE norm_topk_prob */
    int n_moe_layers;      /* layers whose MLP is a mixture of experts */
    uint64_t moe_mask[MODEL_MAX_LAYERS / 64]; /* bit l: layer l is sparse (Qwen3-MoE: decoder_sparse_step, mlp_only_layers) */
    /* a compressed-tensors checkpoint (config.json quantization_config,
     * model.c): the distinct weight schemes of its config groups; none for
     * a plain checkpoint */
    int n_ckpt_schemes;
    model_quant_scheme ckpt_schemes[MODEL_MAX_SCHEMES];
    bool ckpt_packed;      /* format pack-quantized (weight_packed int32), else int-quantized (weight int8) */
} model_config;

/* The schemes as one string: "none", "int4 group 128", "int8 per channel,
 * int4 group 64" (inspect, errors). */
void model_quant_describe(const model_config *cfg, char *buf, size_t cap);

/* Parses config.json text; `label` names the file in errors. */
ferry_status model_config_parse(const char *text, size_t len, const char *label, model_config *cfg);
/* Reads dir/config.json (under model_dir.h's rule). */
ferry_status model_config_load(const char *dir, model_config *cfg);

/* One expert of a sparse layer: a SwiGLU MLP of moe_hidden. */
typedef struct {
    weight w_gate;    /* [moe_hidden, dim] Mixtral w1, Qwen3-MoE gate_proj */
    weight w_up;      /* [moe_hidden, dim] Mixtral w3, Qwen3-MoE up_proj */
    weight w_down;    /* [dim, moe_hidden] Mixtral w2, Qwen3-MoE down_proj */
} expert_weights;

typedef struct {
    weight attn_norm; /* [1, dim] input_layernorm */
    weight wq;        /* [n_heads * head_dim, dim] */
    weight wk;        /* [n_kv_heads * head_dim, dim] */
    weight wv;        /* [n_kv_heads * head_dim, dim] */
    weight wo;        /* [dim, n_heads * head_dim] */
    weight bq;        /* [1, n_heads * head_dim] or absent */
    weight bk;        /* [1, n_kv_heads * head_dim] or absent */
    weight bv;        /* [1, n_kv_heads * head_dim] or absent */
    weight bo;        /* [1, dim] or absent */
    weight q_norm;    /* [1, head_dim] or absent (Qwen3) */
    weight k_norm;    /* [1, head_dim] or absent (Qwen3) */
    weight mlp_norm;  /* [1, dim] post_attention_layernorm */
    weight w_gate;    /* [hidden, dim]; absent in a sparse layer */
    weight w_up;      /* [hidden, dim]; absent in a sparse layer */
    weight w_down;    /* [dim, hidden]; absent in a sparse layer */
    weight router;    /* [n_experts, dim] sparse layer: the gate (block_sparse_moe.gate / mlp.gate) */
    expert_weights *experts; /* [n_experts] sparse layer, else NULL */
} layer_weights;

typedef struct {
    weight embed;          /* [vocab, dim] */
    weight final_norm;     /* [1, dim] */
    weight lm_head;        /* [vocab, dim]; the embedding when tied */
    layer_weights *layers; /* [n_layers] */
} model_weights;

/* Where a weight lives in the engine: the unit and field it fills. A
 * sparse layer's attention, norms and router are its UNIT_LAYER; each of its
 * experts is a unit of its own (UNIT_EXPERT), placed and fetched apart. */
typedef enum { UNIT_EMBED, UNIT_LAYER, UNIT_HEAD, UNIT_EXPERT } unit_kind;

typedef struct {
    char name[128];     /* checkpoint tensor name */
    unit_kind unit;
    int layer;          /* UNIT_LAYER and UNIT_EXPERT */
    int expert;         /* UNIT_EXPERT only */
    int64_t rows, cols; /* expected shape; rows == 0 means 1-D [cols] */
    bool linear;        /* a linear layer (q/k/v/o, gate/up/down): what quantization applies to */
    bool lm_head;       /* the head's [vocab, dim] weight: quantized on request (convert.h) */
    weight *dst;        /* the field it fills */
} tensor_entry;

/* Makes a tied model's head a tensor of its own: tied false, head_from_embed
 * true, so the tensor table lists lm_head.weight (bound to the embedding's
 * data) in the head unit and the embedding table in the embedding unit. */
void model_config_untie_head(model_config *cfg);

/* Whether layer l's MLP is a mixture of experts. */
static inline bool model_layer_moe(const model_config *c, int l)
{
    return c->n_experts > 0 && (c->moe_mask[l / 64] >> (l % 64) & 1);
}

/* Units, numbered: 0 the embedding, 1 + l layer l, n_layers + 1 the head,
 * then the experts: n_layers + 2 + i * n_experts + e for expert e of the
 * i-th sparse layer. model_unit_count is n_layers + 2 + n_moe_layers *
 * n_experts; model_moe_index gives i for a sparse layer l (-1 for a dense
 * one). */
int model_unit_count(const model_config *c);
int model_moe_index(const model_config *c, int l);
int model_expert_unit(const model_config *c, int l, int e);

/* Allocates w's layers (and each sparse layer's experts) zeroed, for a
 * compute view or a binding; model_weights_free releases them. */
ferry_status model_weights_alloc(const model_config *cfg, model_weights *w);

/* Lists every checkpoint tensor the config needs, in execution order
 * (embedding; per layer its attention, norms, router or MLP, then its
 * experts 0.. each gate, up, down; head), with the engine field of `w` (as
 * model_weights_alloc made it) it fills. *out is malloc'd. */
ferry_status model_tensor_entries(const model_config *cfg, model_weights *w, tensor_entry **out, int *n);

/* Binds the weights to checkpoint tensors (zero copy: data points into the
 * mapping), validating names, shapes and dtypes. In a compressed-tensors
 * checkpoint a linear layer NAME.weight is NAME.weight_packed (int32, with
 * NAME.weight_shape) or NAME.weight (int8) with NAME.weight_scale, bound
 * as a quantized weight (weights/weight.h), or a plain NAME.weight where the
 * checkpoint left that layer unquantized (its `ignore` list). Which of the
 * config's schemes a quantized layer has is read off its tensors - the
 * bits from the data's width, the group from the scale's columns - and
 * must be one of them (the config groups' `targets` are not evaluated; a
 * layer whose tensors fit two schemes that group it differently is
 * refused as ambiguous). lm_head is read the same way (a checkpoint may
 * quantize it); with head_from_embed it is bound to the embedding table. */
ferry_status model_weights_bind(const model_config *cfg, const st_checkpoint *ck, model_weights *w);
void model_weights_free(model_weights *w);


#endif
