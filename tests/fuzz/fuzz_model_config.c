/*
 * fuzz_model_config.c - libFuzzer target for a checkpoint's config.json
 * (model_config_parse in engine/weights/model.h: the architecture, the
 * dimensions, rope_theta and rope_scaling, the mixture of experts, the
 * compressed-tensors quantization_config), and for the tensor table an
 * accepted config gives (model_tensor_entries).
 *
 * The input is config.json's text. A refused config must say why, naming
 * the file. An accepted one must keep the parser's promises: one known
 * architecture; every dimension in its range (model.c's dim_limit), heads
 * a multiple of key-value heads, an even head_dim, heads x head_dim within
 * 2^24; a positive finite rms_norm_eps and RoPE frequencies and scale that
 * are finite; experts only in a mixture, top_k within them and the sparse
 * layers' mask within the layers; a quantization scheme the loader
 * implements. Parsing twice gives the same config. For a config small
 * enough to list (few layers and experts) the tensor table is built: every
 * entry named, distinct, with a positive shape and a destination inside the
 * weights it fills. A broken promise aborts, which libFuzzer reports as a
 * crash. Build: README.md.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/weights/model.h"

#define LABEL "fuzz/config.json"
#define DIM_MAX (1 << 24)
#define MAX_LISTED 4096 /* tensor entries the target lists */

static void check_failure(ferry_status st)
{
    if (st != FERRY_ERR_INVALID && st != FERRY_ERR_UNSUPPORTED && st != FERRY_ERR_NOMEM && st != FERRY_ERR_TOO_LARGE)
        abort();
    if (!strstr(ferry_errmsg(), LABEL)) {
        fprintf(stderr, "fuzz_model_config: the error does not name the file: %s\n", ferry_errmsg());
        abort();
    }
}

static bool in(int v, int lo, int hi) { return v >= lo && v <= hi; }

static void check_dims(const model_config *c)
{
    if (!c->arch_name || !in((int)c->arch, ARCH_LLAMA, ARCH_QWEN3_MOE)) abort();
    if (!in(c->vocab, 1, DIM_MAX) || !in(c->dim, 1, DIM_MAX) || !in(c->hidden, 1, DIM_MAX)) abort();
    if (!in(c->n_layers, 1, MODEL_MAX_LAYERS) || !in(c->n_heads, 1, 4096) || !in(c->n_kv_heads, 1, 4096)) abort();
    if (!in(c->head_dim, 2, 16384) || c->head_dim % 2 || c->n_heads % c->n_kv_heads) abort();
    if ((int64_t)c->n_heads * c->head_dim > DIM_MAX || !in(c->max_pos, 1, DIM_MAX)) abort();
    if (c->sliding_window < 0 || !(c->norm_eps > 0) || !isfinite(c->norm_eps)) abort();
}

static void check_rope(const model_config *c)
{
    static float inv_freq[16384 / 2];
    const rope_config *r = &c->rope;
    if (!in((int)r->type, ROPE_DEFAULT, ROPE_YARN) || !(r->theta > 0) || !isfinite(r->theta)) abort();
    rope_inv_freq(r, c->head_dim, inv_freq);
    for (int i = 0; i < c->head_dim / 2; i++)
        if (!(inv_freq[i] >= 0) || !isfinite(inv_freq[i])) {
            fprintf(stderr, "fuzz_model_config: inv_freq[%d] = %g (%s)\n", i, inv_freq[i], rope_type_name(r->type));
            abort();
        }
    float s = rope_attn_scale(r);
    if (!(s > 0) || !isfinite(s)) abort();
}

static void check_moe(const model_config *c)
{
    bool mixture = c->arch == ARCH_MIXTRAL || c->arch == ARCH_QWEN3_MOE;
    int sparse = 0;
    for (int w = 0; w < MODEL_MAX_LAYERS / 64; w++) sparse += __builtin_popcountll(c->moe_mask[w]);
    for (int l = c->n_layers; l < MODEL_MAX_LAYERS; l++)
        if (c->moe_mask[l / 64] >> (l % 64) & 1) abort();
    if (sparse != c->n_moe_layers) abort();
    if (c->n_experts == 0) {
        if (c->n_moe_layers || c->top_k || c->moe_hidden) abort();
        return;
    }
    if (!mixture || !in(c->n_experts, 1, MODEL_MAX_EXPERTS) || !in(c->top_k, 1, c->n_experts)) abort();
    if (!in(c->moe_hidden, 1, DIM_MAX) || c->n_moe_layers < 1) abort();
    for (int l = 0, i = 0; l < c->n_layers; l++)
        if (model_layer_moe(c, l) && model_moe_index(c, l) != i++) abort();
}

static void check_quant(const model_config *c)
{
    if (c->n_ckpt_schemes < 0 || c->n_ckpt_schemes > MODEL_MAX_SCHEMES) abort();
    if (c->n_ckpt_schemes == 0 && c->ckpt_packed) abort();
    for (int k = 0; k < c->n_ckpt_schemes; k++) {
        const model_quant_scheme *m = &c->ckpt_schemes[k];
        if (m->group < 0 || m->group > DIM_MAX) abort();
        if (m->quant != WQ_INT8 && (m->quant != WQ_INT4 || !c->ckpt_packed)) abort();
    }
}

static int by_name(const void *a, const void *b)
{
    return strcmp((*(const tensor_entry *const *)a)->name, (*(const tensor_entry *const *)b)->name);
}

/* The table of a small config: named, distinct, shaped, each destination a
 * weight inside w's own struct or its layers' block. */
static void check_entries(const model_config *c)
{
    if ((int64_t)model_unit_count(c) * 24 > MAX_LISTED) return;
    model_weights w;
    if (model_weights_alloc(c, &w) != FERRY_OK) return;
    tensor_entry *v;
    int n;
    if (model_tensor_entries(c, &w, &v, &n) != FERRY_OK) {
        model_weights_free(&w);
        return;
    }
    const tensor_entry **sorted = malloc((size_t)(n ? n : 1) * sizeof *sorted);
    if (!sorted) abort();
    const char *lo = (const char *)w.layers, *hi = lo + (size_t)c->n_layers * sizeof(layer_weights) +
                                                    (size_t)c->n_moe_layers * c->n_experts * sizeof(expert_weights);
    for (int i = 0; i < n; i++) {
        const tensor_entry *e = &v[i];
        size_t len = strnlen(e->name, sizeof e->name);
        if (len == 0 || len >= sizeof e->name - 1) abort(); /* a name cut short by its buffer */
        if (e->rows < 0 || e->cols < 1 || (e->unit == UNIT_LAYER || e->unit == UNIT_EXPERT ? !in(e->layer, 0, c->n_layers - 1) : 0))
            abort();
        const char *d = (const char *)e->dst;
        bool top = d >= (const char *)&w && d + sizeof(weight) <= (const char *)(&w + 1);
        bool inside = d >= lo && d + sizeof(weight) <= hi;
        if (!top && !inside) abort();
        sorted[i] = e;
    }
    qsort(sorted, (size_t)n, sizeof *sorted, by_name);
    for (int i = 1; i < n; i++)
        if (!strcmp(sorted[i - 1]->name, sorted[i]->name)) {
            fprintf(stderr, "fuzz_model_config: tensor '%s' listed twice\n", sorted[i]->name);
            abort();
        }
    free(sorted);
    free(v);
    model_weights_free(&w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    model_config *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    if (!a || !b) abort();
    memset(a, 0xa5, sizeof *a); /* the parser must not rely on a zeroed config */
    ferry_status st = model_config_parse((const char *)data, size, LABEL, a);
    if (st != FERRY_OK) {
        check_failure(st);
    } else {
        if (model_config_parse((const char *)data, size, LABEL, b) != FERRY_OK || memcmp(a, b, sizeof *a)) abort();
        check_dims(a);
        check_rope(a);
        check_moe(a);
        check_quant(a);
        check_entries(a);
    }
    free(a);
    free(b);
    return 0;
}
