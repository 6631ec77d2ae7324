/*
 * engine.c - opening a model (checkpoint, plan, store, pipeline, KV cache),
 * running steps through the pipeline, and batched generation.
 */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/util.h"

#define DEFAULT_STEP_TOKENS 512
#define DEFAULT_PREFETCH 2

/* What makes the disk tier's blobs: if any of it changes, they are rebuilt.
 * Bump CONVERSION when the blob layout or the conversion of weights changes. */
#define CONVERSION "ferry-blob-v1 identity align=256/4096"

plan_opts engine_plan_opts(const engine_opts *o, const model_config *cfg, bool unified)
{
    plan_opts p = {
        .budget = {o->budget[0], o->budget[1]},
        .group_size = o->group_size ? o->group_size : 1,
        .prefetch = o->prefetch ? o->prefetch : DEFAULT_PREFETCH,
        .n_seqs = o->n_slots > 0 ? o->n_slots : 1,
        .context = o->max_ctx > 0 ? o->max_ctx : cfg->max_pos,
        .max_step_tokens = o->max_step_tokens > 0 ? o->max_step_tokens : DEFAULT_STEP_TOKENS,
        .unified = unified,
    };
    return p;
}

ferry_status engine_plan(const engine_opts *o, const model_config *cfg, const st_checkpoint *ck, bool unified,
                         plan *out)
{
    model_weights w;
    FERRY_TRY(model_weights_bind(cfg, ck, &w));
    uint64_t *units = calloc((size_t)cfg->n_layers + 2, sizeof *units);
    ferry_status st = units ? store_unit_bytes(cfg, &w, units) : ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    plan_opts po = engine_plan_opts(o, cfg, unified);
    if (po.context > cfg->max_pos) {
        free(units);
        model_weights_free(&w);
        return ferry_fail(FERRY_ERR_INVALID, "context of %d positions exceeds max_position_embeddings %d", po.context,
                          cfg->max_pos);
    }
    plan_model pm = {cfg->n_layers, cfg->dim, cfg->hidden, cfg->vocab, cfg->n_heads * cfg->head_dim,
                     cfg->n_kv_heads * cfg->head_dim};
    if (st == FERRY_OK) st = plan_make(&pm, units, &po, out);
    free(units);
    model_weights_free(&w);
    return st;
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Fingerprint of the inputs of the blobs: conversion, config.json, and for
 * every checkpoint file its name, size, mtime and header. */
static ferry_status fingerprint(const engine *e, const char *dir, char out[40])
{
    uint64_t h = fnv1a(0xcbf29ce484222325ull, CONVERSION, sizeof CONVERSION);
    char *path = util_path_join(dir, "config.json"), *text;
    size_t len;
    if (!path) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    ferry_status st = util_read_file(path, &text, &len);
    free(path);
    if (st != FERRY_OK) return st;
    h = fnv1a(h, text, len);
    free(text);
    for (int i = 0; i < e->ck->n_files; i++) {
        const st_file *f = &e->ck->files[i];
        struct stat sb;
        if (fstat(f->fd, &sb) != 0) return ferry_fail(FERRY_ERR_IO, "%s: stat failed", f->path);
        /* ctime and inode too: `cp -p` or rsync keep the mtime of new data */
        uint64_t meta[7] = {(uint64_t)sb.st_size,         (uint64_t)sb.st_mtim.tv_sec, (uint64_t)sb.st_mtim.tv_nsec,
                            (uint64_t)sb.st_ctim.tv_sec,  (uint64_t)sb.st_ctim.tv_nsec, (uint64_t)sb.st_ino,
                            (uint64_t)sb.st_dev};
        h = fnv1a(h, f->name, strlen(f->name) + 1);
        h = fnv1a(h, meta, sizeof meta);
        uint64_t hdr = 8;
        for (int k = 0; k < 8; k++) hdr += (uint64_t)f->map[k] << (8 * k);
        h = fnv1a(h, f->map, (size_t)hdr);
    }
    snprintf(out, 40, "%016llx", (unsigned long long)h);
    return FERRY_OK;
}

static ferry_status alloc_activations(engine *e)
{
    const model_config *c = &e->cfg;
    size_t n = (size_t)e->max_step_tokens;
    size_t qd = (size_t)c->n_heads * (size_t)c->head_dim, kvd = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    struct {
        float **p;
        size_t floats;
    } bufs[] = {{&e->x, n * (size_t)c->dim},         {&e->xn, n * (size_t)c->dim},
                {&e->q, n * qd},                     {&e->k, n * kvd},
                {&e->v, n * kvd},                    {&e->att, n * qd},
                {&e->gate, n * (size_t)c->hidden},   {&e->up, n * (size_t)c->hidden},
                {&e->last, (size_t)e->n_slots * (size_t)c->dim},
                {&e->logits, (size_t)e->n_slots * (size_t)c->vocab}};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        *bufs[i].p = e->be->ops->alloc(e->be, bufs[i].floats * sizeof(float));
        if (!*bufs[i].p) return ferry_fail(FERRY_ERR_NOMEM, "out of memory for activations of %zu tokens", n);
    }
    if (e->plan.groups[store_embed_group(e->store)].tier != TIER_DEVICE) {
        size_t bytes = n * store_embed_row_bytes(e->store);
        e->rows_host = e->be->ops->host_alloc(e->be, bytes, &e->rows_pinned);
        e->rows_dev = e->be->ops->alloc(e->be, bytes);
        if (!e->rows_host || !e->rows_dev) return ferry_fail(FERRY_ERR_NOMEM, "out of memory for embedding rows");
    }
    return FERRY_OK;
}

static ferry_status alloc_kv(engine *e)
{
    const model_config *c = &e->cfg;
    e->kv = calloc((size_t)c->n_layers, sizeof *e->kv);
    if (!e->kv) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    size_t kvd = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    size_t per = (size_t)e->n_slots * (size_t)e->max_ctx * kvd * sizeof(float);
    for (int l = 0; l < c->n_layers; l++) {
        kv_layer *kv = &e->kv[l];
        *kv = (kv_layer){e->be->ops->alloc(e->be, per), e->be->ops->alloc(e->be, per), e->n_slots, e->max_ctx, (int)kvd};
        if (!kv->k || !kv->v) {
            char need[32];
            return ferry_fail(FERRY_ERR_NOMEM, "KV cache of %s (%d sequences x %d positions) cannot be allocated",
                              util_fmt_bytes(e->plan.kv_bytes, need, sizeof need), e->n_slots, e->max_ctx);
        }
    }
    return FERRY_OK;
}

ferry_status engine_open(const engine_opts *opts, engine **out)
{
    *out = NULL;
    engine *e = calloc(1, sizeof *e);
    if (!e) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    ferry_status st;
    backend_opts bo = {opts->threads};
    char fp[40];
    if ((st = model_config_load(opts->model_dir, &e->cfg)) != FERRY_OK) goto fail;
    if ((st = st_checkpoint_open(opts->model_dir, &e->ck)) != FERRY_OK) goto fail;
    if ((st = model_weights_bind(&e->cfg, e->ck, &e->ckw)) != FERRY_OK) goto fail;
    if ((st = backend_create(opts->device ? opts->device : "cpu", &bo, &e->be)) != FERRY_OK) goto fail;

    const model_config *c = &e->cfg;
    e->popts = engine_plan_opts(opts, c, e->be->ops->unified);
    e->n_slots = e->popts.n_seqs;
    e->max_ctx = e->popts.context;
    e->max_step_tokens = e->popts.max_step_tokens;
    if (e->max_ctx > c->max_pos) {
        st = ferry_fail(FERRY_ERR_INVALID, "context of %d positions exceeds max_position_embeddings %d", e->max_ctx,
                        c->max_pos);
        goto fail;
    }
    if ((st = engine_plan(opts, c, e->ck, e->be->ops->unified, &e->plan)) != FERRY_OK) goto fail;
    if (!e->be->ops->unified && opts->budget[0] == PLAN_UNLIMITED) {
        /* No device budget given on a GPU: keep resident what fits beside
         * the working memory (the default a user of a GPU expects), and
         * plan again. The working memory of the second plan can only be
         * larger by its staging slots, which are counted below. */
        uint64_t avail = e->be->ops->mem_available(e->be), host_need, dev_need;
        plan_needs(&e->plan, &e->popts, &host_need, &dev_need);
        uint64_t work = dev_need - e->plan.tier_bytes[TIER_DEVICE];
        if (work < avail && e->plan.tier_bytes[TIER_DEVICE] > avail - work) {
            engine_opts o2 = *opts;
            uint64_t largest = 0;
            for (int g = 0; g < e->plan.n_groups; g++)
                largest = e->plan.groups[g].bytes > largest ? e->plan.groups[g].bytes : largest;
            uint64_t slots = (uint64_t)(e->popts.prefetch + 1) * largest;
            o2.budget[0] = avail - work > slots ? avail - work - slots : 0;
            plan_free(&e->plan);
            if ((st = engine_plan(&o2, c, e->ck, false, &e->plan)) != FERRY_OK) goto fail;
            e->popts.budget[0] = o2.budget[0];
        }
    }
    if ((st = plan_check(&e->plan, &e->popts, plan_host_available(), e->be->ops->mem_available(e->be))) != FERRY_OK)
        goto fail;
    e->w.layers = calloc((size_t)c->n_layers, sizeof *e->w.layers);
    e->slot_used = calloc((size_t)e->n_slots, 1);
    if (!e->w.layers || !e->slot_used) {
        st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = fingerprint(e, opts->model_dir, fp)) != FERRY_OK) goto fail;
    if ((st = store_open(&e->store, e->be, &e->plan, c, &e->ckw, &e->w, opts->offload_dir, fp)) != FERRY_OK) goto fail;
    if ((st = pipeline_create(&e->pipe, e->be, e->store, &e->plan)) != FERRY_OK) goto fail;
    if ((st = alloc_kv(e)) != FERRY_OK) goto fail;
    if ((st = alloc_activations(e)) != FERRY_OK) goto fail;
    *out = e;
    return FERRY_OK;
fail:
    engine_close(e);
    return st;
}

void engine_close(engine *e)
{
    if (!e) return;
    pipeline_free(e->pipe); /* stops the fetcher before the buffers go */
    if (e->be) {
        float **bufs[] = {&e->x, &e->xn, &e->q, &e->k, &e->v, &e->att, &e->gate, &e->up, &e->last, &e->logits};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) e->be->ops->release(e->be, *bufs[i]);
        if (e->kv)
            for (int l = 0; l < e->cfg.n_layers; l++) {
                e->be->ops->release(e->be, e->kv[l].k);
                e->be->ops->release(e->be, e->kv[l].v);
            }
        if (e->rows_host)
            e->be->ops->host_free(e->be, e->rows_host, (size_t)e->max_step_tokens * store_embed_row_bytes(e->store),
                                  e->rows_pinned);
        e->be->ops->release(e->be, e->rows_dev);
        store_close(e->store);
        backend_free(e->be);
    }
    plan_free(&e->plan);
    free(e->kv);
    free(e->slot_used);
    free(e->w.layers);
    model_weights_free(&e->ckw);
    st_checkpoint_close(e->ck);
    free(e);
}

int engine_n_groups(const engine *e) { return e->plan.n_groups; }

store_source engine_group_source(const engine *e, int g) { return store_group_source(e->store, g); }

static ferry_status check_batch(engine *e, const batch *b)
{
    if (b->n_seqs < 1 || b->n_seqs > e->n_slots)
        return ferry_fail(FERRY_ERR_INVALID, "batch of %d sequences (the KV cache holds %d)", b->n_seqs, e->n_slots);
    if (b->n_tokens > e->max_step_tokens)
        return ferry_fail(FERRY_ERR_INVALID, "step of %d tokens exceeds max_step_tokens %d", b->n_tokens,
                          e->max_step_tokens);
    /* The kernels index the KV cache by slot and position: a batch must name
     * each slot once and give every row its sequence's next position. */
    memset(e->slot_used, 0, (size_t)e->n_slots);
    int next = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const batch_seq *q = &b->seqs[s];
        if (q->first != next || q->n_tokens < 1 || q->slot < 0 || q->slot >= e->n_slots || q->n_past < 0)
            return ferry_fail(FERRY_ERR_INTERNAL, "malformed batch (sequence %d)", s);
        if (q->n_tokens > e->max_ctx - q->n_past)
            return ferry_fail(FERRY_ERR_INVALID, "sequence needs %lld positions but the context holds %d",
                              (long long)q->n_past + q->n_tokens, e->max_ctx);
        if (e->slot_used[q->slot]++)
            return ferry_fail(FERRY_ERR_INTERNAL, "malformed batch (slot %d twice)", q->slot);
        for (int i = 0; i < q->n_tokens; i++)
            if (b->pos[q->first + i] != q->n_past + i)
                return ferry_fail(FERRY_ERR_INTERNAL, "malformed batch (sequence %d: position %d at row %d)", s,
                                  b->pos[q->first + i], i);
        next += q->n_tokens;
    }
    if (next != b->n_tokens) return ferry_fail(FERRY_ERR_INTERNAL, "malformed batch (token count)");
    for (int i = 0; i < b->n_tokens; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= e->cfg.vocab)
            return ferry_fail(FERRY_ERR_INVALID, "token id %d is outside the vocabulary (size %d)", b->tokens[i],
                              e->cfg.vocab);
    return FERRY_OK;
}

/* ---- the pipeline's units ------------------------------------------------- */

static void unit_embed(void *ctx)
{
    engine *e = ctx;
    forward_embed(e, e->cur);
}

static ferry_status unit_embed_rows(void *ctx)
{
    engine *e = ctx;
    const batch *b = e->cur;
    FERRY_TRY(store_embed_rows(e->store, b->tokens, b->n_tokens, e->rows_host));
    size_t row = store_embed_row_bytes(e->store);
    e->be->ops->upload(e->be, e->rows_dev, e->rows_host, (size_t)b->n_tokens * row);
    weight rows = {e->ckw.embed.dtype, b->n_tokens, e->cfg.dim, e->rows_dev};
    e->be->ops->convert(e->be, e->x, &rows);
    return FERRY_OK;
}

static void unit_layer(void *ctx, int layer)
{
    engine *e = ctx;
    forward_layer(e, &e->w.layers[layer], layer, e->cur);
}

static void unit_head(void *ctx)
{
    engine *e = ctx;
    if (e->cfg.tied) e->w.lm_head = e->w.embed; /* the table was bound with the head group */
    forward_head(e, e->cur);
}

ferry_status engine_step(engine *e, const batch *b, float *logits_out)
{
    FERRY_TRY(check_batch(e, b));
    FERRY_TRY(e->be->ops->set_batch(e->be, b));
    e->cur = b;
    pipeline_units u = {unit_embed, unit_embed_rows, unit_layer, unit_head, e};
    ferry_status st = pipeline_step(e->pipe, &u);
    e->cur = NULL;
    if (st != FERRY_OK) return st;
    e->be->ops->download(e->be, logits_out, e->logits, (size_t)b->n_seqs * (size_t)e->cfg.vocab * sizeof(float));
    e->be->ops->sync(e->be);
    return FERRY_OK;
}

/* ---- generation ------------------------------------------------------------- */

ferry_status engine_generate(engine *e, int n, const int32_t *const *prompts, const int *lens, int max_new,
                             const sampling_params *params, int32_t **out, float *first_logits)
{
    const model_config *c = &e->cfg;
    if (max_new < 1) return ferry_fail(FERRY_ERR_INVALID, "max_new_tokens must be >= 1 (got %d)", max_new);
    if (n < 1 || n > e->n_slots) return ferry_fail(FERRY_ERR_INVALID, "%d prompts (at most %d)", n, e->n_slots);
    if (n > e->max_step_tokens)
        return ferry_fail(FERRY_ERR_INVALID, "%d prompts exceed max_step_tokens %d", n, e->max_step_tokens);
    for (int i = 0; i < n; i++) {
        if (lens[i] < 1) return ferry_fail(FERRY_ERR_INVALID, "prompt %d is empty", i);
        for (int k = 0; k < lens[i]; k++)
            if (prompts[i][k] < 0 || prompts[i][k] >= c->vocab)
                return ferry_fail(FERRY_ERR_INVALID,
                                  "prompt %d: token id %d at position %d is outside the vocabulary (size %d)", i,
                                  prompts[i][k], k, c->vocab);
        if (max_new > e->max_ctx - lens[i])
            return ferry_fail(FERRY_ERR_INVALID,
                              "prompt %d: %d prompt + %d new tokens exceed the context of %d positions", i, lens[i],
                              max_new, e->max_ctx);
    }
    ferry_status st = FERRY_OK;
    int cap = e->max_step_tokens;
    sampler *smp = calloc((size_t)n, sizeof *smp);
    batch_seq *seqs = calloc((size_t)n, sizeof *seqs);
    int32_t *tokens = malloc((size_t)cap * sizeof *tokens), *pos = malloc((size_t)cap * sizeof *pos);
    float *logits = malloc((size_t)n * (size_t)c->vocab * sizeof *logits);
    if (!smp || !seqs || !tokens || !pos || !logits) {
        st = ferry_fail(FERRY_ERR_NOMEM, "out of memory for generation");
        goto out;
    }
    for (int i = 0; i < n && st == FERRY_OK; i++) st = sampler_init(&smp[i], params, c->vocab, (uint64_t)i);
    if (st != FERRY_OK) goto out;

    /* prefill: as many prompt rows per step as fit. A step holds prompts
     * next, next + 1, ... in order, all whole but maybe the last, so its
     * logits row s belongs to prompt next + s; a partial prompt's row is
     * overwritten by the step that holds its end. */
    int *done = calloc((size_t)n, sizeof *done);
    if (!done) {
        st = ferry_fail(FERRY_ERR_NOMEM, "out of memory for generation");
        goto out;
    }
    for (int next = 0; next < n && st == FERRY_OK;) {
        int t = 0, ns = 0;
        for (int i = next; i < n && t < cap; i++) {
            int take = lens[i] - done[i] < cap - t ? lens[i] - done[i] : cap - t;
            seqs[ns++] = (batch_seq){.slot = i, .n_past = done[i], .n_tokens = take, .first = t};
            for (int k = 0; k < take; k++, t++) {
                tokens[t] = prompts[i][done[i] + k];
                pos[t] = done[i] + k;
            }
        }
        batch b = {t, ns, tokens, pos, seqs};
        if ((st = engine_step(e, &b, logits + (size_t)next * (size_t)c->vocab)) != FERRY_OK) break;
        for (int s = 0; s < ns; s++) done[next + s] += seqs[s].n_tokens;
        while (next < n && done[next] == lens[next]) next++;
    }
    free(done);
    if (st != FERRY_OK) goto out;
    if (first_logits) memcpy(first_logits, logits, (size_t)n * (size_t)c->vocab * sizeof *logits);

    for (int step = 0; step < max_new; step++) {
        for (int i = 0; i < n; i++) out[i][step] = sampler_next(&smp[i], logits + (size_t)i * (size_t)c->vocab);
        if (step + 1 == max_new) break;
        for (int i = 0; i < n; i++) {
            seqs[i] = (batch_seq){.slot = i, .n_past = lens[i] + step, .n_tokens = 1, .first = i};
            tokens[i] = out[i][step];
            pos[i] = lens[i] + step;
        }
        batch b = {n, n, tokens, pos, seqs};
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
