/*
 * engine.h - a loaded model ready to run steps.
 *
 * The engine owns the checkpoint mapping, the plan (which tier holds each
 * group), the store (the weights on those tiers, in the checkpoint's dtype,
 * which compute reads directly), the pipeline that streams the non-resident
 * groups, the backend, the KV cache (n_slots sequences of up to max_ctx
 * positions) and the activation buffers. engine_step runs one forward pass
 * over a batch - any mix of prompt (prefill) rows and single decode rows, at
 * most max_step_tokens rows - and returns the logits of the last row of every
 * sequence. One pass over the weights serves the whole batch; this is what
 * batching buys when weights are streamed.
 */
#ifndef FERRY_ENGINE_H
#define FERRY_ENGINE_H

#include "backend.h"
#include "weights/model.h"
#include "pipeline.h"
#include "plan.h"
#include "weights/safetensors.h"
#include "sampling.h"
#include "store.h"

typedef struct {
    const char *model_dir;
    const char *device;      /* "cpu" (default) or "cuda" */
    int threads;             /* CPU workers; 0 = all cores */
    int n_slots;             /* sequences the KV cache holds */
    int max_ctx;             /* positions per sequence; 0 = max_position_embeddings */
    int max_step_tokens;     /* most token rows in one step; 0 = 512 */
    uint64_t budget[2];      /* device, host weight budgets (PLAN_UNLIMITED) */
    const char *offload_dir; /* disk tier; needed when the budgets do not hold every group */
    int group_size;          /* 0 = 1 */
    int prefetch;            /* 0 = 2 */
} engine_opts;

/* The plan options an engine_opts and model imply (shared with `ferry plan`). */
plan_opts engine_plan_opts(const engine_opts *o, const model_config *cfg, bool unified);
/* Plans placement for a model directory without loading weights. */
ferry_status engine_plan(const engine_opts *o, const model_config *cfg, const st_checkpoint *ck, bool unified,
                         plan *out);

typedef struct {
    model_config cfg;
    st_checkpoint *ck;
    model_weights ckw;   /* bound to the checkpoint mapping: the source of every load */
    model_weights w;     /* the compute view: points into resident buffers or staging slots */
    backend *be;
    plan_opts popts;
    plan plan;
    store *store;
    pipeline *pipe;
    int n_slots, max_ctx, max_step_tokens;
    kv_layer *kv;        /* [n_layers] */
    uint8_t *slot_used;  /* [n_slots] scratch for batch checks */
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
    float *last;         /* [n_slots, dim] */
    float *logits;       /* [n_slots, vocab] */
    void *rows_host;     /* [max, dim] embedding rows gathered on the host (table not on device) */
    void *rows_dev;      /* [max, dim] the same rows in backend memory */
    bool rows_pinned;
} engine;

ferry_status engine_open(const engine_opts *opts, engine **out);
/* The placement groups and where each one's bytes live (store.h). */
int engine_n_groups(const engine *e);
store_source engine_group_source(const engine *e, int g);
void engine_close(engine *e);

/* One forward pass. Every token id must be < vocab and every sequence must
 * fit its slot (checked). logits_out: host [b->n_seqs, vocab]. */
ferry_status engine_step(engine *e, const batch *b, float *logits_out);

/* Generates max_new tokens for each prompt, all prompts in one batch:
 * prefill (in chunks of at most max_step_tokens rows), then one decode step
 * per token. out[i] receives max_new ids; first_logits (optional, host
 * [n, vocab]) the logits of each prompt's last position. Sequence i samples
 * with stream i of params->seed. */
ferry_status engine_generate(engine *e, int n, const int32_t *const *prompts, const int *lens, int max_new,
                             const sampling_params *params, int32_t **out, float *first_logits);

/* The units of the forward pass (forward.c), for the pipeline. */
void forward_embed(engine *e, const batch *b);
void forward_layer(engine *e, const layer_weights *lw, int layer, const batch *b);
void forward_head(engine *e, const batch *b);

#endif
