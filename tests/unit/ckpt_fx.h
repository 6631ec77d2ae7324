/*
 * ckpt_fx.h - a checkpoint fixture for the unit tests that check what
 * compute reads (test_pipeline, test_experts): a model written by `ferry
 * mkmodel` (the binary beside the tests' build directory), bound, with its
 * unit sizes and every tensor converted to f32 by the CPU backend - what an
 * all-resident run reads, to compare the device's bytes with.
 */
#ifndef FERRY_TEST_CKPT_FX_H
#define FERRY_TEST_CKPT_FX_H

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../engine/backend.h"
#include "../../engine/plan.h"
#include "../../engine/store.h"
#include "../../engine/weights/model.h"
#include "../../engine/weights/safetensors.h"

typedef struct {
    const char *label;
    char dir[PATH_MAX];
    model_config cfg;
    st_checkpoint *ck;
    model_weights w;    /* bound to the checkpoint */
    tensor_entry *ents; /* [n] in execution order */
    int n;
    uint64_t *units;    /* [model_unit_count] */
    int moe_layers[64], n_moe; /* the sparse layers */
    float **want;       /* [n] each tensor as f32 (the CPU backend's convert) */
} model_fx;

/* Writes root/label with `ferry mkmodel mkmodel_args` and opens it; exits
 * 2 (naming the test) when anything fails. */
static inline void model_open(model_fx *m, const char *test, const char *root, const char *label,
                              const char *mkmodel_args)
{
    static const convert_opts identity = {CONVERT_KEEP, CONVERT_KEEP, false};
    char exe[PATH_MAX], cmd[3 * PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) exit(2);
    exe[len] = '\0';
    *strrchr(exe, '/') = '\0'; /* .../tests */
    *strrchr(exe, '/') = '\0'; /* the build dir, which holds ferry */
    memset(m, 0, sizeof *m);
    m->label = label;
    snprintf(m->dir, sizeof m->dir, "%s/%s", root, label);
    snprintf(cmd, sizeof cmd, "%s/ferry mkmodel --out %s %s >/dev/null", exe, m->dir, mkmodel_args);
    if (system(cmd) != 0) {
        fprintf(stderr, "%s: `%s` failed (build ferry first)\n", test, cmd);
        exit(2);
    }
    if (model_config_load(m->dir, &m->cfg) != FERRY_OK || st_checkpoint_open(m->dir, &m->ck) != FERRY_OK ||
        model_weights_bind(&m->cfg, m->ck, &m->w) != FERRY_OK ||
        model_tensor_entries(&m->cfg, &m->w, &m->ents, &m->n) != FERRY_OK) {
        fprintf(stderr, "%s: %s: %s\n", test, m->dir, ferry_errmsg());
        exit(2);
    }
    for (int l = 0; l < m->cfg.n_layers && m->n_moe < 64; l++)
        if (model_layer_moe(&m->cfg, l)) m->moe_layers[m->n_moe++] = l;
    m->units = calloc((size_t)model_unit_count(&m->cfg), sizeof *m->units);
    m->want = calloc((size_t)m->n, sizeof *m->want);
    backend *cpu;
    if (!m->units || !m->want || store_unit_bytes(&m->cfg, &m->w, &identity, m->units) != FERRY_OK ||
        cpu_backend_create(&(backend_opts){.threads = 1}, &cpu) != FERRY_OK)
        exit(2);
    for (int k = 0; k < m->n; k++) {
        const weight *w = m->ents[k].dst;
        m->want[k] = malloc((size_t)(w->rows * w->cols) * sizeof(float));
        if (!m->want[k]) exit(2);
        cpu->ops->convert(cpu, m->want[k], w);
    }
    backend_free(cpu);
}

/* The plan's view of the model. */
static inline plan_model fx_plan_model(const model_fx *m)
{
    const model_config *c = &m->cfg;
    return (plan_model){.n_layers = c->n_layers, .dim = c->dim, .hidden = c->hidden, .vocab = c->vocab,
                        .q_dim = c->n_heads * c->head_dim, .kv_dim = c->n_kv_heads * c->head_dim,
                        .max_pos = c->max_pos, .n_experts = c->n_experts, .top_k = c->top_k,
                        .moe_hidden = c->moe_hidden, .n_moe_layers = m->n_moe, .moe_layers = m->moe_layers};
}

/* What a run of compute over the model needs below the pipeline or the
 * experts: a backend, a plan placing the weights by `budgets` (weight bytes
 * per tier as plan_place takes them, in --max-memory syntax; NULL: all on the
 * device), the compute view and its tensor list, and the store loaded as
 * the plan says (od: the offload dir). */
typedef struct {
    backend *be;
    plan p;
    model_weights view;
    tensor_entry *view_ents;
    store *s;
} store_fx;

static inline ferry_status fx_store_open(store_fx *f, const model_fx *m, const char *device, plan_opts po,
                                         const char *budgets, const char *od, const char *fingerprint)
{
    static const convert_opts identity = {CONVERT_KEEP, CONVERT_KEEP, false};
    memset(f, 0, sizeof *f);
    plan_model pm = fx_plan_model(m);
    po.budget[0] = po.budget[1] = PLAN_UNLIMITED;
    ferry_status st = backend_create(device, &(backend_opts){.threads = 2}, &f->be);
    if (st == FERRY_OK && budgets) st = plan_parse_budgets(budgets, po.budget);
    po.unified = f->be ? f->be->ops->unified : false;
    if (st == FERRY_OK) st = plan_place(&pm, m->units, &po, &f->p); /* budgets: weight bytes per tier */
    if (st == FERRY_OK) st = model_weights_alloc(&m->cfg, &f->view);
    if (st == FERRY_OK)
        st = store_open(&f->s, f->be, &f->p, &m->cfg, &identity, (model_weights *)&m->w, &f->view, od, fingerprint);
    if (st == FERRY_OK) st = model_tensor_entries(&m->cfg, &f->view, &f->view_ents, &(int){0});
    return st;
}

/* After whatever reads the store (pipeline, experts) is gone. */
static inline void fx_store_close(store_fx *f)
{
    store_close(f->s);
    backend_free(f->be);
    plan_free(&f->p);
    free(f->view_ents);
    model_weights_free(&f->view);
}

static inline void model_close(model_fx *m)
{
    for (int k = 0; k < m->n; k++) free(m->want[k]);
    free(m->want);
    free(m->units);
    free(m->ents);
    model_weights_free(&m->w);
    st_checkpoint_close(m->ck);
}

#endif
