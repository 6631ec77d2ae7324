/*
 * moe.h - routing a sparse layer's tokens to its experts, on the host.
 *
 * The router's logits [n_tokens, n_experts] come back from the backend;
 * each token's probabilities are the softmax over all experts in f32, its
 * experts the top_k most probable (ties to the lower index, as a stable
 * descending sort; torch.topk leaves tie order unspecified), their weights
 * those probabilities, divided by their sum where norm_topk (Mixtral always,
 * Qwen3-MoE norm_topk_prob) - transformers' MixtralSparseMoeBlock and
 * Qwen3MoeSparseMoeBlock. Every backend routes through this one function,
 * so every placement and backend picks the same experts.
 *
 * The result is laid out for the backend ops (backend.h gather_rows,
 * scatter_rows, moe_combine): token t's choices sorted by expert index,
 * choice j's output going to row t * top_k + j of the combine buffer; and
 * the (expert, token) pairs grouped by expert, ascending, tokens ascending
 * within an expert, so that an expert's rows, destinations and scales are
 * one contiguous run.
 */
#ifndef FERRY_MOE_H
#define FERRY_MOE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

typedef struct {
    int max_tokens, top_k, n_experts;
    int n_tokens;     /* of the last moe_route_compute */
    int32_t *choice;  /* [max_tokens * top_k] token t's experts, ascending: choice[t * top_k + j] */
    float *weight;    /* [max_tokens * top_k] their routing weights */
    int n_used;       /* experts chosen by at least one token */
    int32_t *used;    /* [n_experts] those experts, ascending (the first n_used) */
    int32_t *count;   /* [n_experts] tokens routed to each expert */
    int32_t *start;   /* [n_experts] where expert e's run begins in rows / dest / scale */
    int32_t *rows;    /* [max_tokens * top_k] grouped by expert: the token row */
    int32_t *dest;    /* [max_tokens * top_k] the same pairs: row t * top_k + j of the combine buffer */
    float *scale;     /* [max_tokens * top_k] the same pairs: the routing weight */
    float *prob;      /* [n_experts] scratch: one token's probabilities */
} moe_route;

ferry_status moe_route_init(moe_route *r, int max_tokens, int top_k, int n_experts);
void moe_route_free(moe_route *r);

/* Routes n tokens (n <= max_tokens) from their router logits (host f32
 * [n, n_experts]). */
void moe_route_compute(moe_route *r, const float *logits, int n, bool norm_topk);

#endif
