/*
 * engine_impl.h - the engine's state, private to engine.c and forward.c
 * (the forward pass reads the activations, KV cache and weights view).
 * Everything else goes through engine.h.
 */
#ifndef FERRY_ENGINE_IMPL_H
#define FERRY_ENGINE_IMPL_H

#include "backend.h"
#include "engine.h"
#include "experts.h"
#include "kv.h"
#include "moe.h"
#include "pipeline.h"
#include "store.h"
#include "weights/model.h"
#include "weights/safetensors.h"

struct engine {
    model_config cfg;
    st_checkpoint *ck;
    model_weights ckw;   /* bound to the checkpoint mapping: the source of every load */
    model_weights w;     /* the compute view: points into resident buffers or staging slots */
    backend *be;
    convert_opts convert; /* the conversion the weights were loaded with */
    plan_opts popts;
    int max_prompt, max_new; /* engine_opts' per-request caps, reported by engine_get_limits */
    plan placement;
    store *storage;
    pipeline *pipe;
    kv_pool *kvp;        /* the paged KV cache: blocks and block tables */
    kv_layer *kv;        /* [n_layers] the kernels' view of kvp */
    uint8_t *seq_seen;   /* [max_seqs] scratch for batch checks */
    const batch *cur;    /* the batch of the running step */
    /* activations in backend memory, sized for max_step_tokens rows */
    float *x;            /* [max, dim] residual stream */
    float *xn;           /* [max, dim] normed input / projection output */
    float *q;            /* [max, n_heads * head_dim] */
    float *k;            /* [max, kv_dim] */
    float *v;            /* [max, kv_dim] */
    float *att;          /* [max, n_heads * head_dim] */
    float *gate;         /* [max, hidden] */
    float *up;           /* [max, hidden] */
    float *last;         /* [max_seqs, dim] */
    float *logits;       /* [max_seqs, vocab] */
    float *rope_freq;    /* [head_dim / 2] RoPE inverse frequencies (weights/rope.h), from the config at open */
    float rope_scale;    /* what RoPE's cos and sin are multiplied by */
    void *rows_host;     /* [max, dim] embedding rows gathered on the host (table not on device) */
    void *rows_dev;      /* [max, dim] the same rows in backend memory */
    bool rows_pinned;
    /* mixture of experts (NULL / unused for a dense model) */
    experts *experts;    /* the experts' tiers, slots and fetches */
    bool expert_prefetch; /* predict the next sparse layer's experts and fetch them early (--expert-prefetch) */
    moe_route route;     /* the running sparse layer's routing, on the host */
    float *router;       /* [max, n_experts] router logits (backend memory) */
    float *router_host;  /* [max, n_experts] the same, downloaded */
    int32_t *moe_rows;   /* [max * top_k] route.rows in backend memory */
    int32_t *moe_dest;   /* [max * top_k] route.dest in backend memory */
    float *moe_scale;    /* [max * top_k] route.scale in backend memory */
    float *moe_x;        /* [max, dim] an expert's gathered input rows, then its output */
    float *moe_gate;     /* [max, moe_hidden] */
    float *moe_up;       /* [max, moe_hidden] */
    float *moe_y;        /* [max * top_k, dim] each (token, choice)'s weighted output, for moe_combine */
};

/* The units of the forward pass (forward.c), for the pipeline. */
void forward_embed(engine *e, const batch *b);
/* Fails only where a sparse layer's expert could not be fetched. */
ferry_status forward_layer(engine *e, const layer_weights *lw, int layer, const batch *b);
void forward_head(engine *e, const batch *b);

#endif
