/*
 * moe.c - routing a sparse layer's tokens to its experts (moe.h): per token
 * the softmax over all experts, its top_k, their weights; then the
 * (expert, token) pairs grouped by expert for the backend's gather, scatter
 * and combine. Host code, run once per sparse layer and step, between the
 * router's matmul and the experts (forward.c).
 */
#include "moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

ferry_status moe_route_init(moe_route *r, int max_tokens, int top_k, int n_experts)
{
    memset(r, 0, sizeof *r);
    FERRY_ASSERT(max_tokens >= 0 && n_experts > 0 && top_k >= 1 && top_k <= n_experts);
    size_t pairs = (size_t)max_tokens * (size_t)top_k, experts = (size_t)n_experts;
    r->max_tokens = max_tokens;
    r->top_k = top_k;
    r->n_experts = n_experts;
    r->choice = malloc(pairs * sizeof *r->choice + 1);
    r->weight = malloc(pairs * sizeof *r->weight + 1);
    r->rows = malloc(pairs * sizeof *r->rows + 1);
    r->dest = malloc(pairs * sizeof *r->dest + 1);
    r->scale = malloc(pairs * sizeof *r->scale + 1);
    r->used = calloc(experts, sizeof *r->used);
    r->count = calloc(experts, sizeof *r->count);
    r->start = calloc(experts, sizeof *r->start);
    r->prob = malloc(experts * sizeof *r->prob);
    if (!r->choice || !r->weight || !r->rows || !r->dest || !r->scale || !r->used || !r->count || !r->start ||
        !r->prob) {
        moe_route_free(r);
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory for the routing of %d tokens to %d experts", max_tokens,
                          n_experts);
    }
    return FERRY_OK;
}

void moe_route_free(moe_route *r)
{
    free(r->choice);
    free(r->weight);
    free(r->rows);
    free(r->dest);
    free(r->scale);
    free(r->used);
    free(r->count);
    free(r->start);
    free(r->prob);
    memset(r, 0, sizeof *r);
}

/* Token t: softmax (f32, max subtracted, expf, summed in expert order, as
 * torch's softmax with dtype float), then top_k by repeated selection of the
 * most probable remaining expert - strict >, scanning up, so the lower index
 * wins a tie - then the weights renormalized by their sum taken in that
 * (descending) order, as torch sums topk's values; finally the k choices
 * sorted by expert index, their weights with them. */
static void route_token(moe_route *r, const float *logits, bool norm_topk, int32_t *choice, float *weight)
{
    int E = r->n_experts, k = r->top_k;
    float *p = r->prob;
    float mx = logits[0];
    for (int e = 1; e < E; e++)
        if (logits[e] > mx) mx = logits[e];
    float sum = 0;
    for (int e = 0; e < E; e++) {
        p[e] = expf(logits[e] - mx);
        sum += p[e];
    }
    for (int e = 0; e < E; e++) p[e] /= sum;

    /* a chosen expert's probability becomes -inf (a real one is >= 0, or
     * NaN from NaN logits, which then loses every comparison: the first
     * remaining expert is taken) */
    for (int j = 0; j < k; j++) {
        int best = 0;
        while (p[best] == -INFINITY) best++;
        for (int e = best + 1; e < E; e++)
            if (p[e] != -INFINITY && p[e] > p[best]) best = e;
        choice[j] = best;
        weight[j] = p[best];
        p[best] = -INFINITY;
    }
    if (norm_topk) {
        float s = 0;
        for (int j = 0; j < k; j++) s += weight[j];
        for (int j = 0; j < k; j++) weight[j] /= s;
    }
    for (int j = 1; j < k; j++) { /* insertion sort by expert: k is small */
        int32_t c = choice[j];
        float w = weight[j];
        int i = j;
        for (; i > 0 && choice[i - 1] > c; i--) {
            choice[i] = choice[i - 1];
            weight[i] = weight[i - 1];
        }
        choice[i] = c;
        weight[i] = w;
    }
}

void moe_route_compute(moe_route *r, const float *logits, int n, bool norm_topk)
{
    FERRY_ASSERT(n >= 0 && n <= r->max_tokens);
    int E = r->n_experts, k = r->top_k;
    r->n_tokens = n;
    for (int t = 0; t < n; t++)
        route_token(r, logits + (size_t)t * (size_t)E, norm_topk, r->choice + (size_t)t * (size_t)k,
                    r->weight + (size_t)t * (size_t)k);

    /* group the pairs by expert: counts, then each run's start, then fill
     * in token order (count doubles as the fill cursor and ends restored) */
    memset(r->count, 0, (size_t)E * sizeof *r->count);
    for (size_t i = 0; i < (size_t)n * (size_t)k; i++) r->count[r->choice[i]]++;
    int32_t at = 0;
    r->n_used = 0;
    for (int e = 0; e < E; e++) {
        r->start[e] = at;
        at += r->count[e];
        if (r->count[e]) r->used[r->n_used++] = e;
        r->count[e] = 0;
    }
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            int32_t i = t * k + j, e = r->choice[i], pos = r->start[e] + r->count[e]++;
            r->rows[pos] = t;
            r->dest[pos] = i;
            r->scale[pos] = r->weight[i];
        }
}
