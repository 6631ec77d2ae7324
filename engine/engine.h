/*
 * engine.h - a loaded model ready to run steps.
 *
 * The engine owns the checkpoint mapping, the weights (copied into backend
 * memory in the checkpoint's dtype, which compute reads directly), the
 * backend, the KV cache (n_slots sequences of up to max_ctx positions) and
 * the activation
 * buffers. engine_step runs one forward pass over a batch - any mix of
 * prompt (prefill) rows and single decode rows - and returns the logits of
 * the last row of every sequence. One pass over the weights serves the whole
 * batch; this is what batching buys when weights are streamed.
 */
#ifndef FERRY_ENGINE_H
#define FERRY_ENGINE_H

#include "backend.h"
#include "model.h"
#include "safetensors.h"
#include "sampling.h"

typedef struct {
    const char *model_dir;
    const char *device;  /* "cpu" (default) or "cuda" */
    int threads;         /* CPU workers; 0 = all cores */
    int n_slots;         /* sequences the KV cache holds */
    int max_ctx;         /* positions per sequence; 0 = max_position_embeddings */
} engine_opts;

typedef struct {
    model_config cfg;
    st_checkpoint *ck;
    model_weights w;
    backend *be;
    void **resident;     /* [n_resident] backend buffers holding the weights */
    int n_resident;
    int n_slots, max_ctx;
    kv_layer *kv;        /* [n_layers] */
    /* activations in backend memory, sized for cap_tokens rows */
    int cap_tokens;
    float *x;            /* [cap, dim] residual stream */
    float *xn;           /* [cap, dim] normed input / projection output */
    float *q;            /* [cap, n_heads * head_dim] */
    float *k;            /* [cap, kv_dim] */
    float *v;            /* [cap, kv_dim] */
    float *att;          /* [cap, n_heads * head_dim] */
    float *gate;         /* [cap, hidden] */
    float *up;           /* [cap, hidden] */
    float *last;         /* [n_slots, dim] */
    float *logits;       /* [n_slots, vocab] */
} engine;

ferry_status engine_open(const engine_opts *opts, engine **out);
void engine_close(engine *e);

/* Bytes of KV cache for the engine's slots and context. */
uint64_t engine_kv_bytes(const model_config *cfg, int n_slots, int max_ctx);

/* One forward pass. Every token id must be < vocab and every sequence must
 * fit its slot (checked). logits_out: host [b->n_seqs, vocab]. */
ferry_status engine_step(engine *e, const batch *b, float *logits_out);

/* Generates max_new tokens for each prompt, all prompts in one batch: one
 * prefill step, then one decode step per token. out[i] receives max_new ids;
 * first_logits (optional, host [n, vocab]) the logits of each prompt's last
 * position. Sequence i samples with stream i of params->seed. */
ferry_status engine_generate(engine *e, int n, const int32_t *const *prompts, const int *lens, int max_new,
                             const sampling_params *params, int32_t **out, float *first_logits);



/* The units of the forward pass (forward.c), for engine_step and the
 * pipeline. */
void forward_embed(engine *e, const batch *b);
void forward_layer(engine *e, const layer_weights *lw, int layer, const batch *b);
void forward_head(engine *e, const batch *b);
#endif
