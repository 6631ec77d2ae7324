/*
 * engine.c - opening a model (checkpoint, plan, store, pipeline, KV cache)
 * and running steps through the pipeline. See engine.h.
 */
#include "engine_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/util.h"
#include "weights/gguf.h"
#include "weights/model_dir.h"
#include "weights/quant.h"

void engine_opts_init(engine_opts *o)
{
    *o = (engine_opts){.device = "cpu",
                       .threads = 0,
                       .cpu_isa = "auto",
                       .cpu_activations = "exact",
                       .max_seqs = ENGINE_DEFAULT_MAX_SEQS,
                       .max_ctx = 0,
                       .max_step_tokens = ENGINE_DEFAULT_MAX_STEP_TOKENS,
                       .budget = {PLAN_UNLIMITED, PLAN_UNLIMITED},
                       .group_size = 1,
                       .prefetch = 0,
                       .verify_reads = true,
                       .convert = convert_identity()};
}

/* ---- planning --------------------------------------------------------------- */

/* What planning needs of an opened model. */
typedef struct {
    const model_config *cfg;
    const st_checkpoint *ck;
    backend *be;
} plan_inputs;

/* The one path from options to a plan: engine_open and engine_plan (and so
 * `ferry plan`) take it. The backend is asked here, once, whether its memory
 * is unified and how much it has. */
static ferry_status make_plan(const engine_opts *o, const plan_inputs *in, plan *out)
{
    const model_config *cfg = in->cfg;
    model_weights w;
    FERRY_TRY(model_weights_bind(cfg, in->ck, &w));
    uint64_t *units = calloc((size_t)model_unit_count(cfg), sizeof *units);
    int *moe_layers = calloc((size_t)cfg->n_layers, sizeof *moe_layers), n_moe = 0;
    for (int l = 0; moe_layers && l < cfg->n_layers; l++)
        if (model_layer_moe(cfg, l)) moe_layers[n_moe++] = l;
    if (!moe_layers) {
        free(units);
        units = NULL;
    }
    ferry_status st = units ? store_unit_bytes(cfg, &w, &o->convert, units) : ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    bool unified = in->be->ops->unified;
    plan_opts po = {
        .budget = {o->budget[0], o->budget[1]},
        .group_size = o->group_size,
        .prefetch = o->prefetch,
        .n_seqs = o->max_seqs,
        .context = o->max_ctx,
        .kv_memory = o->kv_memory,
        .max_step_tokens = o->max_step_tokens,
        .unified = unified,
        .device_avail = unified ? 0 : in->be->ops->mem_available(in->be),
        .host_avail = unified ? in->be->ops->mem_available(in->be) : 0,
        .expert_cache = o->expert_cache,
    };
    plan_model pm = {cfg->n_layers, cfg->dim, cfg->hidden, cfg->vocab, cfg->n_heads * cfg->head_dim,
                     cfg->n_kv_heads * cfg->head_dim, cfg->max_pos, cfg->n_experts, cfg->top_k, cfg->moe_hidden,
                     n_moe, moe_layers};
    if (st == FERRY_OK) st = o->budget_weights_only ? plan_place(&pm, units, &po, out) : plan_make(&pm, units, &po, out);
    free(units);
    free(moe_layers);
    model_weights_free(&w);
    return st;
}

ferry_status engine_plan(const engine_opts *opts, plan *out, plan_opts *po)
{
    memset(out, 0, sizeof *out);
    model_config cfg;
    st_checkpoint *ck = NULL;
    backend *be = NULL;
    backend_opts bo = {opts->threads, opts->cpu_isa, opts->cpu_activations};
    ferry_status st = model_config_load(opts->model_dir, &cfg);
    if (st == FERRY_OK) convert_config(&opts->convert, &cfg);
    if (st == FERRY_OK) st = st_checkpoint_open(opts->model_dir, &ck);
    if (st == FERRY_OK) st = backend_create(opts->device ? opts->device : "cpu", &bo, &be);
    plan_inputs in = {&cfg, ck, be};
    if (st == FERRY_OK) st = make_plan(opts, &in, out);
    if (st == FERRY_OK) *po = out->opts;
    backend_free(be);
    st_checkpoint_close(ck);
    return st;
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* What makes the disk tier's blobs besides the checkpoint: the layout
 * (built from the alignment constants themselves, so that changing one
 * rebuilds the blobs) and the conversion of the weights. Bump the version
 * when the blob layout changes in a way the constants do not show. */
static void conversion_id(const convert_opts *o, char *buf, size_t cap)
{
    char c[160];
    convert_describe(o, c, sizeof c);
    snprintf(buf, cap, "ferry-blob-v2 %s tensor-align=%u unit-align=%u scales-align=%u", c, STORE_TENSOR_ALIGN,
             OFFLOAD_ALIGN, CONVERT_ALIGN);
}

/* Fingerprint of the inputs of the blobs: conversion, config.json, and for
 * every checkpoint file its name, size, mtime and header. */
static ferry_status fingerprint(const engine *e, const engine_opts *o, char out[40])
{
    const char *dir = o->model_dir;
    char conv[256];
    conversion_id(&o->convert, conv, sizeof conv);
    uint64_t h = fnv1a(0xcbf29ce484222325ull, conv, strlen(conv) + 1);
    char *text;
    size_t len;
    ferry_status st = model_dir_read(dir, "config.json", &text, &len);
    if (st != FERRY_OK) return st;
    h = fnv1a(h, text, len);
    free(text);
    /* a GGUF model: the file itself, not its converted tensors (a new
     * temporary file each start); what converting does is versioned here */
    int n_files = e->ck->gguf_model ? e->ck->n_gguf_parts : e->ck->n_files;
    if (e->ck->gguf_model) h = fnv1a(h, "gguf-hf-v2", 11); /* v2: the embedding kept as blocks */
    for (int i = 0; i < n_files; i++) {
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
        if (e->ck->gguf_model) hdr = gguf_data_offset(e->ck->gguf_parts[i]); /* metadata and tensor directory */
        else
            for (int k = 0; k < 8; k++) hdr += (uint64_t)f->map[k] << (8 * k);
        h = fnv1a(h, f->map, (size_t)hdr);
    }
    snprintf(out, 40, "%016llx", (unsigned long long)h);
    return FERRY_OK;
}

static ferry_status alloc_activations(engine *e)
{
    const model_config *c = &e->cfg;
    size_t n = (size_t)e->popts.max_step_tokens;
    size_t qd = (size_t)c->n_heads * (size_t)c->head_dim, kvd = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    struct {
        float **p;
        size_t floats;
    } bufs[] = {{&e->x, n * (size_t)c->dim},         {&e->xn, n * (size_t)c->dim},
                {&e->q, n * qd},                     {&e->k, n * kvd},
                {&e->v, n * kvd},                    {&e->att, n * qd},
                {&e->gate, n * (size_t)c->hidden},   {&e->up, n * (size_t)c->hidden},
                {&e->last, (size_t)e->popts.n_seqs * (size_t)c->dim},
                {&e->logits, (size_t)e->popts.n_seqs * (size_t)c->vocab}};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        *bufs[i].p = e->be->ops->alloc(e->be, bufs[i].floats * sizeof(float));
        if (!*bufs[i].p) return ferry_fail(FERRY_ERR_NOMEM, "out of memory for activations of %zu tokens", n);
    }
    if (c->n_experts) { /* engine_impl.h */
        size_t nk = n * (size_t)c->top_k;
        struct {
            void **p;
            size_t bytes;
        } moe[] = {{(void **)&e->router, n * (size_t)c->n_experts * 4}, {(void **)&e->moe_rows, nk * 4},
                   {(void **)&e->moe_dest, nk * 4},                     {(void **)&e->moe_scale, nk * 4},
                   {(void **)&e->moe_x, n * (size_t)c->dim * 4},        {(void **)&e->moe_gate, n * (size_t)c->moe_hidden * 4},
                   {(void **)&e->moe_up, n * (size_t)c->moe_hidden * 4}, {(void **)&e->moe_y, nk * (size_t)c->dim * 4}};
        for (size_t i = 0; i < sizeof moe / sizeof moe[0]; i++)
            if (!(*moe[i].p = e->be->ops->alloc(e->be, moe[i].bytes)))
                return ferry_fail(FERRY_ERR_NOMEM, "out of memory for expert activations of %zu tokens", n);
        e->router_host = malloc(n * (size_t)c->n_experts * sizeof(float));
        if (!e->router_host) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        FERRY_TRY(moe_route_init(&e->route, (int)n, c->top_k, c->n_experts));
    }
    if (e->placement.groups[store_embed_group(e->storage)].tier != TIER_DEVICE) {
        size_t bytes = n * store_embed_row_bytes(e->storage);
        e->rows_host = e->be->ops->host_alloc(e->be, bytes, &e->rows_pinned);
        e->rows_dev = e->be->ops->alloc(e->be, bytes);
        if (!e->rows_host || !e->rows_dev) return ferry_fail(FERRY_ERR_NOMEM, "out of memory for embedding rows");
    }
    return FERRY_OK;
}

/* RoPE's inverse frequencies, from the config once (rope.h), in backend
 * memory where the rope op reads them. */
static ferry_status alloc_rope(engine *e)
{
    int half = e->cfg.head_dim / 2;
    float *host = malloc((size_t)half * sizeof *host);
    if (!host) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    rope_inv_freq(&e->cfg.rope, e->cfg.head_dim, host);
    e->rope_scale = rope_attn_scale(&e->cfg.rope);
    e->rope_freq = e->be->ops->alloc(e->be, (size_t)half * sizeof *host);
    if (e->rope_freq) e->be->ops->upload(e->be, e->rope_freq, host, (size_t)half * sizeof *host);
    free(host);
    return e->rope_freq ? FERRY_OK : ferry_fail(FERRY_ERR_NOMEM, "out of memory for the RoPE table");
}

/* The KV pool: its size is the plan's (kv_blocks), every page touched
 * here, at startup, rather than by the first steps that reach it. */
static ferry_status alloc_kv(engine *e)
{
    const model_config *c = &e->cfg;
    int kvd = c->n_kv_heads * c->head_dim;
    e->kv = calloc((size_t)c->n_layers, sizeof *e->kv);
    if (!e->kv) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    FERRY_TRY(kv_pool_create(&e->kvp, (int)e->placement.kv_blocks, e->popts.n_seqs, kv_blocks_for(e->popts.context)));
    FERRY_TRY(kv_pool_alloc_memory(e->kvp, e->be, c->n_layers, kvd));
    for (int l = 0; l < c->n_layers; l++) e->kv[l] = kv_pool_layer(e->kvp, l);
    return FERRY_OK;
}

/* Says once, at startup, that --quantize int4 took another group than 128
 * for layers whose columns 128 does not divide (quant_default_group): what
 * `ferry inspect` shows, so that nobody expects group 128 throughout. */
static void warn_regrouped(const engine *e, const engine_opts *opts)
{
    convert_summary sum;
    if (convert_model_summary(&e->cfg, (model_weights *)&e->ckw, &opts->convert, &sum) != FERRY_OK || !sum.n_regrouped)
        return;
    char schemes[512];
    convert_summary_describe(&sum, schemes, sizeof schemes);
    fprintf(stderr, "ferry: warning: --quantize int4: %d of %d quantized layers have input columns that %d does not "
            "divide and take a group that does (compressed-tensors needs one): %s\n", sum.n_regrouped,
            sum.n_quantized, QUANT_INT4_GROUP, schemes);
}

/* A backend without kernels for GGUF blocks is refused a conversion that
 * keeps them, naming the way out. */
static ferry_status check_gguf_blocks(const engine *e, const engine_opts *opts)
{
    convert_summary sum;
    if (e->be->ops->gguf_blocks || convert_model_summary(&e->cfg, (model_weights *)&e->ckw, &opts->convert, &sum) != FERRY_OK)
        return FERRY_OK;
    for (int k = 0; k < sum.n_schemes; k++)
        if (sum.schemes[k].quant == WQ_GGUF)
            return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: the %s backend does not compute GGUF blocks (%s) yet: add "
                              "--quantize none to dequantize them as the model loads (int8 and int4 keep the "
                              "embedding's and the head's blocks)", e->ck->dir, e->be->ops->name,
                              gguf_type_name((uint32_t)sum.schemes[k].group));
    return FERRY_OK;
}

ferry_status engine_open(const engine_opts *opts, engine **out)
{
    *out = NULL;
    engine *e = calloc(1, sizeof *e);
    if (!e) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    ferry_status st;
    backend_opts bo = {opts->threads, opts->cpu_isa, opts->cpu_activations};
    char fp[40];
    e->convert = opts->convert;
    e->max_prompt = opts->max_prompt;
    e->max_new = opts->max_new;
    if ((st = model_config_load(opts->model_dir, &e->cfg)) != FERRY_OK) goto fail;
    convert_config(&opts->convert, &e->cfg);
    if ((st = st_checkpoint_open(opts->model_dir, &e->ck)) != FERRY_OK) goto fail;
    if ((st = model_weights_bind(&e->cfg, e->ck, &e->ckw)) != FERRY_OK) goto fail;
    warn_regrouped(e, opts);
    if ((st = backend_create(opts->device ? opts->device : "cpu", &bo, &e->be)) != FERRY_OK) goto fail;
    if ((st = check_gguf_blocks(e, opts)) != FERRY_OK) goto fail;
    plan_inputs in = {&e->cfg, e->ck, e->be};
    if ((st = make_plan(opts, &in, &e->placement)) != FERRY_OK) goto fail;
    e->popts = e->placement.opts;
    if ((st = plan_check(&e->placement, &e->popts, util_mem_available(), e->be->ops->mem_available(e->be))) != FERRY_OK)
        goto fail;
    if ((st = model_weights_alloc(&e->cfg, &e->w)) != FERRY_OK) goto fail;
    e->seq_seen = calloc((size_t)e->popts.n_seqs, 1);
    if (!e->seq_seen) {
        st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = fingerprint(e, opts, fp)) != FERRY_OK) goto fail;
    if ((st = store_open(&e->storage, e->be, &e->placement, &e->cfg, &opts->convert, &e->ckw, &e->w, opts->offload_dir, fp)) != FERRY_OK)
        goto fail;
    if ((st = pipeline_create(&e->pipe, e->be, e->storage, &e->placement)) != FERRY_OK) goto fail;
    pipeline_set_verify(e->pipe, opts->verify_reads);
    if ((st = experts_create(&e->experts, e->be, e->storage, &e->placement)) != FERRY_OK) goto fail;
    if (e->experts) experts_set_verify(e->experts, opts->verify_reads);
    e->expert_prefetch = e->experts && opts->expert_prefetch;
    if ((st = alloc_kv(e)) != FERRY_OK) goto fail;
    if ((st = alloc_activations(e)) != FERRY_OK) goto fail;
    if ((st = alloc_rope(e)) != FERRY_OK) goto fail;
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
    experts_free(e->experts);
    if (e->be) {
        void *bufs[] = {e->x,         e->xn,       e->q,        e->k,         e->v,     e->att,
                        e->gate,      e->up,       e->last,     e->logits,    e->rope_freq, e->router,
                        e->moe_rows,  e->moe_dest, e->moe_scale, e->moe_x,    e->moe_gate,  e->moe_up,
                        e->moe_y};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]) e->be->ops->release(e->be, bufs[i]);
        kv_pool_free(e->kvp);
        if (e->rows_host)
            e->be->ops->host_free(e->be, e->rows_host, (size_t)e->popts.max_step_tokens * store_embed_row_bytes(e->storage),
                                  e->rows_pinned);
        e->be->ops->release(e->be, e->rows_dev);
        store_close(e->storage);
        backend_free(e->be);
    }
    plan_free(&e->placement);
    free(e->kv);
    free(e->seq_seen);
    free(e->router_host);
    moe_route_free(&e->route);
    model_weights_free(&e->w);
    model_weights_free(&e->ckw);
    st_checkpoint_close(e->ck);
    free(e);
}

ferry_status engine_repair(engine *e)
{
    int n_groups = e->placement.n_groups;
    bool *damaged = calloc((size_t)n_groups, sizeof *damaged);
    if (!damaged) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    int found = pipeline_damaged(e->pipe, damaged) + (e->experts ? experts_damaged(e->experts, damaged) : 0);
    if (found == 0) {
        free(damaged);
        return FERRY_OK;
    }
    pipeline_quiesce(e->pipe); /* reads ahead may have found more: the whole list once quiet */
    pipeline_damaged(e->pipe, damaged); /* sets every entry: the experts' are added after */
    if (e->experts) experts_damaged(e->experts, damaged);
    ferry_status first = FERRY_OK;
    for (int g = 0; g < n_groups; g++) {
        if (!damaged[g]) continue;
        const char *path = store_group_source(e->storage, g).path;
        fprintf(stderr, "ferry: rebuilding %s from the checkpoint\n", path);
        double t0 = util_now();
        ferry_status st = store_rebuild_group(e->storage, g);
        if (st != FERRY_OK) {
            fprintf(stderr, "ferry: could not rebuild group %d: %s\n", g, ferry_errmsg());
            if (first == FERRY_OK) first = st;
            continue;
        }
        fprintf(stderr, "ferry: rebuilt %s in %.2f s\n", store_group_source(e->storage, g).path, util_now() - t0);
        /* the blob rewritten whole: every group in it is sound (a run of experts shares one) */
        for (int h = g; h < n_groups; h++) {
            if (h != g && !store_same_blob(e->storage, g, h)) continue;
            damaged[h] = false;
            pipeline_clear_damaged(e->pipe, h);
            if (e->experts) experts_clear_damaged(e->experts, h);
        }
    }
    free(damaged);
    return first;
}

/* ---- what the engine is ------------------------------------------------------ */

engine_info engine_get_info(const engine *e)
{
    return (engine_info){e->cfg.arch_name,
                         e->cfg.n_layers,
                         e->cfg.dim,
                         e->be->ops->name,
                         e->be->ops->kernels ? e->be->ops->kernels(e->be) : NULL,
                         e->placement.opts.unified,
                         e->cfg.head_from_embed};
}

engine_limits engine_get_limits(const engine *e)
{
    return (engine_limits){e->cfg.vocab, e->popts.context, e->popts.n_seqs, e->popts.max_step_tokens,
                           (int64_t)kv_total_blocks(e->kvp) * KV_BLOCK_POSITIONS, e->max_prompt, e->max_new};
}

const plan *engine_get_plan(const engine *e) { return &e->placement; }

convert_opts engine_get_convert(const engine *e) { return e->convert; }

pipeline_stats engine_pipeline_stats(engine *e) { return pipeline_get_stats(e->pipe); }

bool engine_expert_stats(engine *e, expert_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!e->experts) return false;
    *out = experts_get_stats(e->experts);
    return true;
}

backend *engine_backend(engine *e) { return e->be; }

const store *engine_store(const engine *e) { return e->storage; }

const char *engine_model_dir(const engine *e) { return e->ck->dir; }

ferry_status engine_trace_start(engine *e, size_t max_events) { return pipeline_trace_start(e->pipe, max_events); }

ferry_status engine_trace_write(engine *e, const char *path) { return pipeline_trace_write(e->pipe, path); }

/* The engine form's bytes (the view's formats are set whether or not a
 * group is bound; an absent optional weight is all zero). */
static uint64_t present_bytes(const weight *w) { return w->rows > 0 ? weight_bytes(w) : 0; }

uint64_t engine_decode_weight_bytes(const engine *e, int n_seqs)
{
    const model_weights *w = &e->w;
    uint64_t total = 0;
    for (int l = 0; l < e->cfg.n_layers; l++) {
        const layer_weights *lw = &w->layers[l];
        const weight *all[] = {&lw->attn_norm, &lw->wq, &lw->wk,     &lw->wv,       &lw->wo,   &lw->bq,
                               &lw->bk,        &lw->bv, &lw->bo,     &lw->q_norm,   &lw->k_norm, &lw->mlp_norm,
                               &lw->w_gate,    &lw->w_up, &lw->w_down};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) total += present_bytes(all[i]);
    }
    total += present_bytes(&w->final_norm) + present_bytes(e->cfg.tied ? &w->embed : &w->lm_head);
    total += (uint64_t)n_seqs * weight_row_bytes(&w->embed);
    return total;
}

/* ---- the KV cache --------------------------------------------------------------- */

ferry_status engine_kv_reserve(engine *e, int kv_seq, int n_positions)
{
    if (kv_seq < 0 || kv_seq >= e->popts.n_seqs)
        return ferry_fail(FERRY_ERR_INVALID, "KV sequence %d (the engine has %d)", kv_seq, e->popts.n_seqs);
    return kv_reserve(e->kvp, kv_seq, n_positions);
}

void engine_kv_release(engine *e, int kv_seq)
{
    if (kv_seq >= 0 && kv_seq < e->popts.n_seqs) kv_release(e->kvp, kv_seq);
}

engine_kv engine_kv_info(const engine *e)
{
    return (engine_kv){KV_BLOCK_POSITIONS, kv_total_blocks(e->kvp), kv_free_blocks(e->kvp)};
}

/* ---- the step ------------------------------------------------------------------- */

/* The kernels index the KV cache by sequence and position: a batch must
 * name each KV sequence once and give every row its sequence's next
 * position. batch_builder keeps this; a hand-made batch is checked here. */
static ferry_status check_batch(engine *e, const batch *b)
{
    const plan_opts *o = &e->popts;
    if (b->n_seqs < 1 || b->n_seqs > o->n_seqs)
        return ferry_fail(FERRY_ERR_INVALID, "batch of %d sequences (the KV cache holds %d)", b->n_seqs, o->n_seqs);
    if (b->n_tokens > o->max_step_tokens)
        return ferry_fail(FERRY_ERR_INVALID, "step of %d tokens exceeds max_step_tokens %d", b->n_tokens,
                          o->max_step_tokens);
    memset(e->seq_seen, 0, (size_t)o->n_seqs);
    int next = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const batch_seq *q = &b->seqs[s];
        if (q->first != next || q->n_tokens < 1 || q->kv_seq < 0 || q->kv_seq >= o->n_seqs || q->n_past < 0)
            return ferry_fail(FERRY_ERR_INTERNAL, "malformed batch (sequence %d)", s);
        if (q->n_tokens > o->context - q->n_past)
            return ferry_fail(FERRY_ERR_INVALID, "sequence needs %lld positions but the context holds %d",
                              (long long)q->n_past + q->n_tokens, o->context);
        if (q->n_past + q->n_tokens > kv_capacity(e->kvp, q->kv_seq))
            return ferry_fail(FERRY_ERR_INVALID,
                              "KV sequence %d needs %d positions but has blocks for %d (engine_kv_reserve first)",
                              q->kv_seq, q->n_past + q->n_tokens, kv_capacity(e->kvp, q->kv_seq));
        if (e->seq_seen[q->kv_seq]++)
            return ferry_fail(FERRY_ERR_INTERNAL, "malformed batch (KV sequence %d twice)", q->kv_seq);
        for (int i = 0; i < q->n_tokens; i++)
            if (b->pos[q->first + i] != q->n_past + i)
                return ferry_fail(FERRY_ERR_INTERNAL, "malformed batch (sequence %d: position %d at row %d)", s,
                                  b->pos[q->first + i], i);
        next += q->n_tokens;
    }
    if (next != b->n_tokens) return ferry_fail(FERRY_ERR_INTERNAL, "malformed batch (token count)");
    /* requests were checked (request_check); this guards direct callers */
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
    FERRY_TRY(store_embed_rows(e->storage, b->tokens, b->n_tokens, e->rows_host));
    size_t row = store_embed_row_bytes(e->storage);
    e->be->ops->upload(e->be, e->rows_dev, e->rows_host, (size_t)b->n_tokens * row);
    weight rows = {.dtype = e->w.embed.dtype, .rows = b->n_tokens, .cols = e->cfg.dim, .data = e->rows_dev,
                   .quant = e->w.embed.quant, .block = e->w.embed.block}; /* a GGUF's blocks, or plain */
    e->be->ops->convert(e->be, e->x, &rows);
    return FERRY_OK;
}

static ferry_status unit_layer(void *ctx, int layer)
{
    engine *e = ctx;
    return forward_layer(e, &e->w.layers[layer], layer, e->cur);
}

static void unit_head(void *ctx)
{
    engine *e = ctx;
    if (e->cfg.tied) e->w.lm_head = e->w.embed; /* the table was bound with the head group */
    forward_head(e, e->cur);
}

/* A NaN or infinity in the logits means damaged weights or a broken
 * kernel, never an answer: the step fails rather than sample from it. */
static ferry_status check_logits(const engine *e, const batch *b, const float *logits)
{
    size_t vocab = (size_t)e->cfg.vocab;
    for (int s = 0; s < b->n_seqs; s++) {
        const float *row = logits + (size_t)s * vocab;
        float acc = 0; /* x * 0 is 0 for every finite x, NaN otherwise */
        for (size_t k = 0; k < vocab; k++) acc += row[k] * 0.0f;
        if (acc != 0)
            return ferry_fail(FERRY_ERR_INTERNAL,
                              "non-finite logits (NaN or infinity) for sequence %d of the step: the weights or a kernel "
                              "are damaged",
                              s);
    }
    return FERRY_OK;
}

ferry_status engine_step(engine *e, const batch *b, float *logits_out)
{
    FERRY_TRY(check_batch(e, b));
    kv_pool_sync_table(e->kvp); /* the backend is quiet between steps */
    FERRY_TRY(e->be->ops->set_batch(e->be, b));
    e->cur = b;
    pipeline_units u = {unit_embed, unit_embed_rows, unit_layer, unit_head, e};
    ferry_status st = pipeline_step(e->pipe, &u);
    if (e->experts) experts_step_done(e->experts);
    e->cur = NULL;
    if (st != FERRY_OK) return st;
    e->be->ops->download(e->be, logits_out, e->logits, (size_t)b->n_seqs * (size_t)e->cfg.vocab * sizeof(float));
    e->be->ops->sync(e->be);
    return check_logits(e, b, logits_out);
}
