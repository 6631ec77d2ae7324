/*
 * engine.c - opening a model (checkpoint + config + backend + KV cache),
 * running steps, and batched generation on top of engine_step.
 */
#include "engine.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t engine_kv_bytes(const model_config *cfg, int n_slots, int max_ctx)
{
    return 2ull * (uint64_t)cfg->n_layers * (uint64_t)n_slots * (uint64_t)max_ctx *
           (uint64_t)cfg->n_kv_heads * (uint64_t)cfg->head_dim * sizeof(float);
}

static void free_activations(engine *e)
{
    backend *be = e->be;
    float **bufs[] = {&e->x, &e->xn, &e->q, &e->k, &e->v, &e->att, &e->gate, &e->up};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        be->ops->release(be, *bufs[i]);
        *bufs[i] = NULL;
    }
    e->cap_tokens = 0;
}

/* Grows the activation buffers to hold n token rows. */
static ferry_status reserve_tokens(engine *e, int n)
{
    if (n <= e->cap_tokens) return FERRY_OK;
    free_activations(e);
    const model_config *c = &e->cfg;
    size_t qd = (size_t)c->n_heads * (size_t)c->head_dim, kvd = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    struct {
        float **p;
        size_t cols;
    } bufs[] = {{&e->x, (size_t)c->dim}, {&e->xn, (size_t)c->dim}, {&e->q, qd},       {&e->k, kvd},
                {&e->v, kvd},            {&e->att, qd},           {&e->gate, (size_t)c->hidden}, {&e->up, (size_t)c->hidden}};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        *bufs[i].p = e->be->ops->alloc(e->be, (size_t)n * bufs[i].cols * sizeof(float));
        if (!*bufs[i].p) {
            free_activations(e);
            return ferry_fail(FERRY_ERR_NOMEM, "out of memory for activations of %d tokens", n);
        }
    }
    e->cap_tokens = n;
    return FERRY_OK;
}

/* Copies every weight from the checkpoint mapping into backend memory (for
 * the CPU: 2 MiB-aligned buffers on huge pages), tensor by tensor, handing
 * each tensor's mapped pages back as soon as it is copied, so that peak
 * memory is the weights plus one tensor and the mapping never counts in RSS.
 * On the CPU this also makes decode ~1.4x faster than computing from the
 * 4 KiB page-cache pages of the mapping. */
static ferry_status load_resident(engine *e)
{
    tensor_slot *slots;
    int n;
    FERRY_TRY(model_tensor_slots(&e->cfg, &e->w, &slots, &n));
    ferry_status st = FERRY_OK;
    e->resident = calloc((size_t)n, sizeof *e->resident);
    if (!e->resident) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    for (int i = 0; st == FERRY_OK && i < n; i++) {
        weight *w = slots[i].dst;
        size_t bytes = (size_t)w->rows * (size_t)w->cols * dtype_size(w->dtype);
        void *p = e->be->ops->alloc(e->be, bytes);
        if (!p) {
            char b[32];
            st = ferry_fail(FERRY_ERR_NOMEM, "out of memory loading tensor '%s' (%s)", slots[i].name,
                            util_fmt_bytes(bytes, b, sizeof b));
            break;
        }
        e->be->ops->upload(e->be, p, w->data, bytes);
        st_release_pages(w->data, bytes);
        w->data = p;
        e->resident[e->n_resident++] = p;
    }
    if (e->cfg.tied) e->w.lm_head = e->w.embed;
    free(slots);
    return st;
}

ferry_status engine_open(const engine_opts *opts, engine **out)
{
    *out = NULL;
    engine *e = calloc(1, sizeof *e);
    if (!e) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    ferry_status st;
    backend_opts bo = {opts->threads};
    if ((st = model_config_load(opts->model_dir, &e->cfg)) != FERRY_OK) goto fail;
    if ((st = st_checkpoint_open(opts->model_dir, &e->ck)) != FERRY_OK) goto fail;
    if ((st = model_weights_bind(&e->cfg, e->ck, &e->w)) != FERRY_OK) goto fail;
    if ((st = backend_create(opts->device ? opts->device : "cpu", &bo, &e->be)) != FERRY_OK) goto fail;

    if ((st = load_resident(e)) != FERRY_OK) goto fail;
    const model_config *c = &e->cfg;
    e->n_slots = opts->n_slots > 0 ? opts->n_slots : 1;
    e->max_ctx = opts->max_ctx > 0 ? opts->max_ctx : c->max_pos;
    if (e->max_ctx > c->max_pos) {
        st = ferry_fail(FERRY_ERR_INVALID, "context of %d positions exceeds max_position_embeddings %d", e->max_ctx,
                        c->max_pos);
        goto fail;
    }
    e->kv = calloc((size_t)c->n_layers, sizeof *e->kv);
    if (!e->kv) goto nomem;
    size_t kvd = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    size_t per = (size_t)e->n_slots * (size_t)e->max_ctx * kvd * sizeof(float);
    for (int l = 0; l < c->n_layers; l++) {
        kv_layer *kv = &e->kv[l];
        kv->n_slots = e->n_slots;
        kv->max_ctx = e->max_ctx;
        kv->kv_dim = (int)kvd;
        kv->k = e->be->ops->alloc(e->be, per);
        kv->v = e->be->ops->alloc(e->be, per);
        if (!kv->k || !kv->v) {
            char need[32];
            st = ferry_fail(FERRY_ERR_NOMEM, "KV cache of %s (%d sequences x %d positions) cannot be allocated",
                            util_fmt_bytes(engine_kv_bytes(c, e->n_slots, e->max_ctx), need, sizeof need),
                            e->n_slots, e->max_ctx);
            goto fail;
        }
    }
    e->last = e->be->ops->alloc(e->be, (size_t)e->n_slots * (size_t)c->dim * sizeof(float));
    e->logits = e->be->ops->alloc(e->be, (size_t)e->n_slots * (size_t)c->vocab * sizeof(float));
    if (!e->last || !e->logits) goto nomem;
    *out = e;
    return FERRY_OK;
nomem:
    st = ferry_fail(FERRY_ERR_NOMEM, "out of memory opening %s", opts->model_dir);
fail:
    engine_close(e);
    return st;
}

void engine_close(engine *e)
{
    if (!e) return;
    if (e->be) {
        free_activations(e);
        if (e->kv)
            for (int l = 0; l < e->cfg.n_layers; l++) {
                e->be->ops->release(e->be, e->kv[l].k);
                e->be->ops->release(e->be, e->kv[l].v);
            }
        for (int i = 0; i < e->n_resident; i++) e->be->ops->release(e->be, e->resident[i]);
        e->be->ops->release(e->be, e->last);
        e->be->ops->release(e->be, e->logits);
        backend_free(e->be);
    }
    free(e->kv);
    free(e->resident);
    model_weights_free(&e->w);
    st_checkpoint_close(e->ck);
    free(e);
}

static ferry_status check_batch(const engine *e, const batch *b)
{
    if (b->n_seqs < 1 || b->n_seqs > e->n_slots)
        return ferry_fail(FERRY_ERR_INVALID, "batch of %d sequences (the KV cache holds %d)", b->n_seqs, e->n_slots);
    int next = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const batch_seq *q = &b->seqs[s];
        if (q->first != next || q->n_tokens < 1 || q->slot < 0 || q->slot >= e->n_slots || q->n_past < 0)
            return ferry_fail(FERRY_ERR_INTERNAL, "malformed batch (sequence %d)", s);
        if (q->n_past + q->n_tokens > e->max_ctx)
            return ferry_fail(FERRY_ERR_INVALID, "sequence needs %d positions but the context holds %d",
                              q->n_past + q->n_tokens, e->max_ctx);
        next += q->n_tokens;
    }
    if (next != b->n_tokens) return ferry_fail(FERRY_ERR_INTERNAL, "malformed batch (token count)");
    for (int i = 0; i < b->n_tokens; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= e->cfg.vocab)
            return ferry_fail(FERRY_ERR_INVALID, "token id %d is outside the vocabulary (size %d)", b->tokens[i],
                              e->cfg.vocab);
    return FERRY_OK;
}

ferry_status engine_step(engine *e, const batch *b, float *logits_out)
{
    FERRY_TRY(check_batch(e, b));
    FERRY_TRY(reserve_tokens(e, b->n_tokens));
    FERRY_TRY(e->be->ops->set_batch(e->be, b));
    forward_embed(e, b);
    for (int l = 0; l < e->cfg.n_layers; l++) forward_layer(e, &e->w.layers[l], l, b);
    forward_head(e, b);
    e->be->ops->download(e->be, logits_out, e->logits, (size_t)b->n_seqs * (size_t)e->cfg.vocab * sizeof(float));
    e->be->ops->sync(e->be);
    return FERRY_OK;
}

ferry_status engine_generate(engine *e, int n, const int32_t *const *prompts, const int *lens, int max_new,
                             const sampling_params *params, int32_t **out, float *first_logits)
{
    const model_config *c = &e->cfg;
    if (max_new < 1) return ferry_fail(FERRY_ERR_INVALID, "max_new_tokens must be >= 1 (got %d)", max_new);
    if (n < 1 || n > e->n_slots) return ferry_fail(FERRY_ERR_INVALID, "%d prompts (at most %d)", n, e->n_slots);
    int total = 0;
    for (int i = 0; i < n; i++) {
        if (lens[i] < 1) return ferry_fail(FERRY_ERR_INVALID, "prompt %d is empty", i);
        for (int k = 0; k < lens[i]; k++)
            if (prompts[i][k] < 0 || prompts[i][k] >= c->vocab)
                return ferry_fail(FERRY_ERR_INVALID,
                                  "prompt %d: token id %d at position %d is outside the vocabulary (size %d)", i,
                                  prompts[i][k], k, c->vocab);
        if (lens[i] + max_new > e->max_ctx)
            return ferry_fail(FERRY_ERR_INVALID,
                              "prompt %d: %d prompt + %d new tokens exceed the context of %d positions", i, lens[i],
                              max_new, e->max_ctx);
        total += lens[i];
    }
    ferry_status st = FERRY_OK;
    sampler *smp = calloc((size_t)n, sizeof *smp);
    batch_seq *seqs = calloc((size_t)n, sizeof *seqs);
    int32_t *tokens = malloc((size_t)total * sizeof *tokens), *pos = malloc((size_t)total * sizeof *pos);
    float *logits = malloc((size_t)n * (size_t)c->vocab * sizeof *logits);
    if (!smp || !seqs || !tokens || !pos || !logits) {
        st = ferry_fail(FERRY_ERR_NOMEM, "out of memory for generation");
        goto out;
    }
    for (int i = 0; i < n && st == FERRY_OK; i++) st = sampler_init(&smp[i], params, c->vocab, (uint64_t)i);
    if (st != FERRY_OK) goto out;

    /* prefill: every prompt in one step */
    int t = 0;
    for (int i = 0; i < n; i++) {
        seqs[i] = (batch_seq){.slot = i, .n_past = 0, .n_tokens = lens[i], .first = t};
        for (int k = 0; k < lens[i]; k++, t++) {
            tokens[t] = prompts[i][k];
            pos[t] = k;
        }
    }
    batch b = {total, n, tokens, pos, seqs};
    if ((st = engine_step(e, &b, logits)) != FERRY_OK) goto out;
    if (first_logits) memcpy(first_logits, logits, (size_t)n * (size_t)c->vocab * sizeof *logits);

    for (int step = 0; step < max_new; step++) {
        for (int i = 0; i < n; i++) out[i][step] = sampler_next(&smp[i], logits + (size_t)i * (size_t)c->vocab);
        if (step + 1 == max_new) break;
        for (int i = 0; i < n; i++) {
            seqs[i] = (batch_seq){.slot = i, .n_past = lens[i] + step, .n_tokens = 1, .first = i};
            tokens[i] = out[i][step];
            pos[i] = lens[i] + step;
        }
        b = (batch){n, n, tokens, pos, seqs};
        if ((st = engine_step(e, &b, logits)) != FERRY_OK) goto out;
    }
out:
    if (smp)
        for (int i = 0; i < n; i++) sampler_free(&smp[i]);
    free(smp);
    free(seqs);
    free(tokens);
    free(pos);
    free(logits);
    return st;
}
