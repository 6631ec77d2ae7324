/*
 * forward.c - the forward pass, top to bottom, in backend ops: embedding,
 * then per decoder layer attention and SwiGLU MLP with pre-norms and
 * residuals, then the final norm and lm_head on each sequence's last row.
 * Written once for every backend; the units here (embedding, layer, head) are
 * the units the planner places and the pipeline streams.
 *
 * A sparse layer (mixture of experts) replaces the MLP: the router's logits
 * come to the host, which routes every token (moe.h); each expert the batch
 * chose then runs on its tokens' rows, gathered, as soon as experts_run has
 * it present (experts.h), and scatters its outputs times their routing
 * weights to one row per (token, choice); moe_combine adds each token's rows
 * to the residual stream in a fixed order, so the result does not depend on
 * the order the experts ran in.
 */
#include "engine_impl.h"

#include <stdlib.h>
#include <string.h>

void forward_embed(engine *e, const batch *b)
{
    (void)b;
    e->be->ops->embed(e->be, e->x, &e->w.embed);
}

/* One expert's share of a sparse layer (experts_fn): its tokens' normed
 * rows gathered into moe_x, its SwiGLU, its outputs times their routing
 * weights into their (token, choice) rows of moe_y. */
typedef struct {
    engine *e;
    int layer;
} expert_call;

static void forward_expert(void *ctx, int k)
{
    const expert_call *call = ctx;
    engine *e = call->e;
    const struct backend_ops *op = e->be->ops;
    backend *be = e->be;
    const model_config *c = &e->cfg;
    int id = e->route.used[k], first = e->route.start[id], n = e->route.count[id];
    const expert_weights *ew = &e->w.layers[call->layer].experts[id]; /* bound by experts_run */
    op->gather_rows(be, e->moe_x, e->xn, e->moe_rows + first, n, c->dim);
    op->matmul(be, e->moe_gate, e->moe_x, &ew->w_gate, NULL, n);
    op->matmul(be, e->moe_up, e->moe_x, &ew->w_up, NULL, n);
    op->silu_mul(be, e->moe_gate, e->moe_up, (size_t)n * (size_t)c->moe_hidden);
    op->matmul(be, e->moe_x, e->moe_gate, &ew->w_down, NULL, n);
    op->scatter_rows(be, e->moe_y, e->moe_x, e->moe_dest + first, e->moe_scale + first, n, c->dim);
}

/* A sparse layer's MLP block on the normed rows e->xn:
 * x += sum over each token's experts of weight * expert(xn). */
/* Speculation (experts.h experts_prefetch): the next layer's router on
 * this layer's output, normed by the next layer's post-attention norm,
 * predicts the experts the next layer will route to; their fetches start
 * now, before its attention. Only where the next layer is sparse and its
 * weights are bound already (on the device tier): a streamed layer's are
 * not there yet. The prediction's buffers are scratch the next layer
 * overwrites. */
static void predict_next(engine *e, int layer, int n)
{
    const model_config *c = &e->cfg;
    int next = layer + 1;
    if (next >= c->n_layers || !model_layer_moe(c, next)) return;
    int g = 1 + next / e->placement.opts.group_size;
    if (e->placement.groups[g].tier != TIER_DEVICE) return;
    store_bind(e->storage, g, store_group_source(e->storage, g).resident); /* as the pipeline will */
    const struct backend_ops *op = e->be->ops;
    const layer_weights *nw = &e->w.layers[next];
    op->rmsnorm(e->be, e->xn, e->x, &nw->mlp_norm, n, c->dim, c->norm_eps);
    op->matmul(e->be, e->router, e->xn, &nw->router, NULL, n);
    op->download(e->be, e->router_host, e->router, (size_t)n * (size_t)c->n_experts * sizeof *e->router_host);
    moe_route_compute(&e->route, e->router_host, n, c->norm_topk);
    experts_prefetch(e->experts, next, e->route.used, e->route.n_used);
}

static ferry_status forward_moe(engine *e, const layer_weights *lw, int layer, int n)
{
    const struct backend_ops *op = e->be->ops;
    backend *be = e->be;
    const model_config *c = &e->cfg;
    size_t pairs = (size_t)n * (size_t)c->top_k;
    op->matmul(be, e->router, e->xn, &lw->router, NULL, n);
    op->download(be, e->router_host, e->router, (size_t)n * (size_t)c->n_experts * sizeof *e->router_host);
    moe_route_compute(&e->route, e->router_host, n, c->norm_topk);
    op->upload(be, e->moe_rows, e->route.rows, pairs * sizeof *e->moe_rows);
    op->upload(be, e->moe_dest, e->route.dest, pairs * sizeof *e->moe_dest);
    op->upload(be, e->moe_scale, e->route.scale, pairs * sizeof *e->moe_scale);
    expert_call call = {e, layer};
    FERRY_TRY(experts_run(e->experts, layer, e->route.used, e->route.n_used, forward_expert, &call));
    op->moe_combine(be, e->x, e->moe_y, n, c->top_k, c->dim);
    if (e->expert_prefetch) predict_next(e, layer, n);
    return FERRY_OK;
}

ferry_status forward_layer(engine *e, const layer_weights *lw, int layer, const batch *b)
{
    const struct backend_ops *op = e->be->ops;
    backend *be = e->be;
    const model_config *c = &e->cfg;
    int n = b->n_tokens;
    const kv_layer *kv = &e->kv[layer];
    attn_shape shape = {c->n_heads, c->n_kv_heads, c->head_dim, c->sliding_window};

    /* attention block: x += o_proj(attn(rope(q), rope(k), v)) */
    op->rmsnorm(be, e->xn, e->x, &lw->attn_norm, n, c->dim, c->norm_eps);
    op->matmul(be, e->q, e->xn, &lw->wq, &lw->bq, n);
    op->matmul(be, e->k, e->xn, &lw->wk, &lw->bk, n);
    op->matmul(be, e->v, e->xn, &lw->wv, &lw->bv, n);
    if (c->qk_norm) {
        op->rmsnorm(be, e->q, e->q, &lw->q_norm, n * c->n_heads, c->head_dim, c->norm_eps);
        op->rmsnorm(be, e->k, e->k, &lw->k_norm, n * c->n_kv_heads, c->head_dim, c->norm_eps);
    }
    op->rope(be, e->q, c->n_heads, c->head_dim, e->rope_freq, e->rope_scale);
    op->rope(be, e->k, c->n_kv_heads, c->head_dim, e->rope_freq, e->rope_scale);
    op->kv_store(be, kv, e->k, e->v);
    op->attention(be, e->att, e->q, kv, &shape);
    op->matmul(be, e->xn, e->att, &lw->wo, &lw->bo, n);
    op->add(be, e->x, e->xn, (size_t)n * (size_t)c->dim);

    /* MLP block: x += down(silu(gate(xn)) * up(xn)), or the experts' */
    op->rmsnorm(be, e->xn, e->x, &lw->mlp_norm, n, c->dim, c->norm_eps);
    if (model_layer_moe(c, layer)) return forward_moe(e, lw, layer, n);
    op->matmul(be, e->gate, e->xn, &lw->w_gate, NULL, n);
    op->matmul(be, e->up, e->xn, &lw->w_up, NULL, n);
    op->silu_mul(be, e->gate, e->up, (size_t)n * (size_t)c->hidden);
    op->matmul(be, e->xn, e->gate, &lw->w_down, NULL, n);
    op->add(be, e->x, e->xn, (size_t)n * (size_t)c->dim);
    return FERRY_OK;
}

void forward_head(engine *e, const batch *b)
{
    const struct backend_ops *op = e->be->ops;
    const model_config *c = &e->cfg;
    op->gather_last(e->be, e->last, e->x, c->dim);
    op->rmsnorm(e->be, e->xn, e->last, &e->w.final_norm, b->n_seqs, c->dim, c->norm_eps);
    op->matmul(e->be, e->logits, e->xn, &e->w.lm_head, NULL, b->n_seqs);
}
