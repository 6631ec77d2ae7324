/*
 * forward.c - the forward pass, top to bottom, in backend ops: embedding,
 * then per decoder layer attention and SwiGLU MLP with pre-norms and
 * residuals, then the final norm and lm_head on each sequence's last row.
 * Written once for every backend; the units here (embedding, layer, head) are
 * the units the planner places and the pipeline streams.
 */
#include "engine_impl.h"

#include <stdlib.h>
#include <string.h>

void forward_embed(engine *e, const batch *b)
{
    (void)b;
    e->be->ops->embed(e->be, e->x, &e->w.embed);
}

void forward_layer(engine *e, const layer_weights *lw, int layer, const batch *b)
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

    /* MLP block: x += down(silu(gate(xn)) * up(xn)) */
    op->rmsnorm(be, e->xn, e->x, &lw->mlp_norm, n, c->dim, c->norm_eps);
    op->matmul(be, e->gate, e->xn, &lw->w_gate, NULL, n);
    op->matmul(be, e->up, e->xn, &lw->w_up, NULL, n);
    op->silu_mul(be, e->gate, e->up, (size_t)n * (size_t)c->hidden);
    op->matmul(be, e->xn, e->gate, &lw->w_down, NULL, n);
    op->add(be, e->x, e->xn, (size_t)n * (size_t)c->dim);
}

void forward_head(engine *e, const batch *b)
{
    const struct backend_ops *op = e->be->ops;
    const model_config *c = &e->cfg;
    op->gather_last(e->be, e->last, e->x, c->dim);
    op->rmsnorm(e->be, e->xn, e->last, &e->w.final_norm, b->n_seqs, c->dim, c->norm_eps);
    op->matmul(e->be, e->logits, e->xn, &e->w.lm_head, NULL, b->n_seqs);
}
