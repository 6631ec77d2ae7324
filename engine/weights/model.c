/*
 * model.c - config.json parsing and the checkpoint <-> engine tensor table.
 * See model.h.
 */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/json.h"
#include "../base/util.h"
#include "model_dir.h"
#include "quant.h"

/* ---- config.json ------------------------------------------------------ */

/* The supported architectures, and the defaults their config classes give
 * the fields that differ between them (transformers' *Config). */
static const struct {
    const char *name;
    model_arch arch;
    int max_pos;       /* max_position_embeddings */
    double norm_eps;   /* rms_norm_eps */
    double theta;      /* rope_theta */
    int head_dim;      /* 0: hidden_size / num_attention_heads (Qwen3MoeConfig has no head_dim field) */
    int kv_heads;      /* num_key_value_heads; 0: num_attention_heads */
    int hidden;        /* intermediate_size; 0: required */
} k_archs[] = {
    {"LlamaForCausalLM", ARCH_LLAMA, 2048, 1e-6, 10000.0, 0, 0, 0},
    {"MistralForCausalLM", ARCH_MISTRAL, 4096 * 32, 1e-6, 10000.0, 0, 0, 0},
    {"Qwen2ForCausalLM", ARCH_QWEN2, 32768, 1e-6, 10000.0, 0, 0, 0},
    {"Qwen3ForCausalLM", ARCH_QWEN3, 32768, 1e-6, 10000.0, 128, 0, 0},
    {"MixtralForCausalLM", ARCH_MIXTRAL, 4096 * 32, 1e-5, 1000000.0, 0, 8, 14336},
    {"Qwen3MoeForCausalLM", ARCH_QWEN3_MOE, 32768, 1e-6, 10000.0, 0, 4, 6144},
};
#define N_ARCHS (sizeof k_archs / sizeof k_archs[0])

/* Architectures near a supported one whose maths differ, refused with why. */
static const struct {
    const char *name, *why;
} k_refused[] = {
    {"Qwen2MoeForCausalLM", "its shared expert and shared expert gate are not implemented"},
};

#define INT_LIMIT (1 << 24) /* bound on every dimension: keeps products in range */

/* Upper bounds far above any real model that keep every size product in
 * range and a bogus config from allocating gigabytes of bookkeeping. */
static int dim_limit(const char *key)
{
    if (!strcmp(key, "num_hidden_layers")) return 4096;
    if (!strcmp(key, "num_attention_heads") || !strcmp(key, "num_key_value_heads")) return 4096;
    if (!strcmp(key, "head_dim")) return 16384;
    return INT_LIMIT;
}

static ferry_status get_dim(const json_value *root, const char *label, const char *key, bool required, int def,
                            int *out)
{
    int64_t v;
    bool bad = false;
    if (!json_get_int(root, key, &v, &bad)) {
        if (bad) return ferry_fail(FERRY_ERR_INVALID, "%s: field '%s' must be an integer", label, key);
        if (required) return ferry_fail(FERRY_ERR_INVALID, "%s: missing field '%s'", label, key);
        *out = def;
        return FERRY_OK;
    }
    if (v <= 0 || v > dim_limit(key))
        return ferry_fail(FERRY_ERR_INVALID, "%s: field '%s' = %lld is out of range (1..%d)", label, key,
                          (long long)v, dim_limit(key));
    *out = (int)v;
    return FERRY_OK;
}

static ferry_status get_float(const json_value *obj, const char *label, const char *key, double def, float *out)
{
    double v;
    bool bad = false;
    if (!json_get_num(obj, key, &v, &bad)) {
        if (bad) return ferry_fail(FERRY_ERR_INVALID, "%s: field '%s' must be a number", label, key);
        v = def;
    }
    float f = (float)v;
    if (!(f > 0) || !isfinite(f))
        return ferry_fail(FERRY_ERR_INVALID, "%s: field '%s' = %g must be a positive number within float range", label,
                          key, v);
    *out = f;
    return FERRY_OK;
}

static ferry_status get_flag(const json_value *root, const char *label, const char *key, bool def, bool *out)
{
    bool bad = false;
    *out = def;
    json_get_bool(root, key, out, &bad);
    if (bad) return ferry_fail(FERRY_ERR_INVALID, "%s: field '%s' must be true or false", label, key);
    return FERRY_OK;
}

/* Fields that change the maths and that ferry does not implement. */
static ferry_status reject_unsupported(const json_value *root, const char *label, const model_config *cfg)
{
    const json_value *v;
    bool bad = false;
    const char *act = json_get_str(root, "hidden_act", &bad);
    if (bad || (act && strcmp(act, "silu") != 0))
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: field 'hidden_act' = '%s' is not supported (only 'silu')", label,
                          act ? act : "?");
    bool flag = false;
    if ((json_get_bool(root, "mlp_bias", &flag, &bad) && flag) || bad)
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: field 'mlp_bias' must be false (a bias is not supported)", label);
    /* Mistral and Mixtral read sliding_window alone (model_config_parse) */
    if (cfg->arch != ARCH_MISTRAL && cfg->arch != ARCH_MIXTRAL &&
        ((json_get_bool(root, "use_sliding_window", &flag, &bad) && flag) || bad))
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: field 'use_sliding_window' must be false (not supported)", label);
    double f;
    if ((json_get_num(root, "partial_rotary_factor", &f, &bad) && f != 1.0) || bad)
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: field 'partial_rotary_factor' must be 1 (partial RoPE is not supported)", label);
    if ((v = json_get(root, "layer_types")) && v->type == JSON_ARRAY) {
        for (size_t i = 0; i < v->len; i++)
            if (v->items[i].type != JSON_STRING || strcmp(v->items[i].str, "full_attention") != 0)
                return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: field 'layer_types' entry %zu is not 'full_attention'", label, i);
    }
    /* other mixtures' shared experts (Qwen2-MoE, DeepSeek) */
    static const char *const shared[] = {"shared_expert_intermediate_size", "n_shared_experts", "num_shared_experts"};
    for (size_t i = 0; i < sizeof shared / sizeof shared[0]; i++)
        if ((json_get_num(root, shared[i], &f, &bad) && f != 0) || bad)
            return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: field '%s' must be 0 or absent (shared experts are not "
                              "supported)", label, shared[i]);
    return FERRY_OK;
}

/* ---- quantization_config (compressed-tensors) -------------------------- */

/* A field that must be absent or null. */
static ferry_status must_be_null(const json_value *obj, const char *label, const char *path, const char *key)
{
    const json_value *v = json_get(obj, key);
    if (v && v->type != JSON_NULL)
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: quantization_config%s.%s is not supported (ferry loads "
                          "weight-only int8/int4 checkpoints: it must be null)", label, path, key);
    return FERRY_OK;
}

/* One config group's weights: symmetric int, 8 or 4 bits, per channel or
 * per group (compressed-tensors' W8A16 preset is int8 group 128 from 0.19
 * on, per channel before). */
static ferry_status parse_weights_scheme(const json_value *w, const char *label, const char *path,
                                         model_quant_scheme *out)
{
    bool bad = false, sym = false, dyn = false;
    int64_t bits = 0, group = 0;
    const char *type = json_get_str(w, "type", &bad), *strategy = json_get_str(w, "strategy", &bad);
    json_get_int(w, "num_bits", &bits, &bad);
    json_get_bool(w, "symmetric", &sym, &bad);
    json_get_bool(w, "dynamic", &dyn, &bad);
    if (bad) return ferry_fail(FERRY_ERR_INVALID, "%s: quantization_config%s.weights has a field of the wrong type", label, path);
    if (!type || strcmp(type, "int"))
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: quantization_config%s.weights.type '%s' is not supported (only int)",
                          label, path, type ? type : "(missing)");
    if (!sym || dyn)
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: quantization_config%s.weights must be symmetric and static "
                          "(asymmetric or dynamic weights are not supported)", label, path);
    char wpath[128]; /* the fields are the weights object's */
    snprintf(wpath, sizeof wpath, "%s.weights", path);
    FERRY_TRY(must_be_null(w, label, wpath, "actorder"));
    FERRY_TRY(must_be_null(w, label, wpath, "block_structure"));
    bool channel = strategy && !strcmp(strategy, "channel"), grouped = strategy && !strcmp(strategy, "group");
    if (grouped && (!json_get_int(w, "group_size", &group, &bad) || group < 1 || group > INT_LIMIT))
        return ferry_fail(FERRY_ERR_INVALID, "%s: quantization_config%s.weights.group_size must be a positive integer",
                          label, path);
    if ((bits != 8 && bits != 4) || !(channel || grouped))
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: quantization_config%s.weights: %lld bits, strategy '%s' is not "
                          "supported (int8 or int4, per channel or group)", label, path, (long long)bits,
                          strategy ? strategy : "(missing)");
    out->quant = bits == 8 ? WQ_INT8 : WQ_INT4;
    out->group = grouped ? (int)group : 0;
    return FERRY_OK;
}

/* compressed-tensors' quantization_config of a weight-only int8/int4
 * checkpoint; anything else is refused naming what it is. Config groups
 * of the same scheme count once. */
static ferry_status parse_quantization(const json_value *qc, const char *label, model_config *cfg)
{
    bool bad = false;
    if (qc->type != JSON_OBJECT) return ferry_fail(FERRY_ERR_INVALID, "%s: quantization_config must be an object", label);
    const char *method = json_get_str(qc, "quant_method", &bad);
    if (!method || strcmp(method, "compressed-tensors"))
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: quantization_config.quant_method '%s' is not supported (only "
                          "compressed-tensors int8/int4 weight-only checkpoints)", label, method ? method : "(missing)");
    const char *format = json_get_str(qc, "format", &bad), *status = json_get_str(qc, "quantization_status", &bad);
    if (!format || (strcmp(format, "pack-quantized") && strcmp(format, "int-quantized")))
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: quantization_config.format '%s' is not supported (pack-quantized "
                          "or int-quantized)", label, format ? format : "(missing)");
    if (status && strcmp(status, "compressed"))
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: quantization_config.quantization_status '%s' is not supported "
                          "(only 'compressed' checkpoints)", label, status);
    FERRY_TRY(must_be_null(qc, label, "", "kv_cache_scheme"));
    const json_value *groups = json_get(qc, "config_groups");
    if (!groups || groups->type != JSON_OBJECT || groups->len == 0)
        return ferry_fail(FERRY_ERR_INVALID, "%s: quantization_config.config_groups must be a non-empty object", label);
    cfg->ckpt_packed = !strcmp(format, "pack-quantized");
    for (size_t i = 0; i < groups->len; i++) {
        char path[96];
        snprintf(path, sizeof path, ".config_groups.%.60s", groups->members[i].key);
        const json_value *g = &groups->members[i].value, *w = json_get(g, "weights");
        if (g->type != JSON_OBJECT || !w || w->type != JSON_OBJECT)
            return ferry_fail(FERRY_ERR_INVALID, "%s: quantization_config%s must have a weights object", label, path);
        FERRY_TRY(must_be_null(g, label, path, "input_activations"));
        FERRY_TRY(must_be_null(g, label, path, "output_activations"));
        model_quant_scheme one;
        FERRY_TRY(parse_weights_scheme(w, label, path, &one));
        if (!cfg->ckpt_packed && one.quant == WQ_INT4)
            return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: quantization_config: 4-bit weights in format int-quantized are "
                              "not supported (pack-quantized)", label);
        int k = 0;
        while (k < cfg->n_ckpt_schemes && memcmp(&cfg->ckpt_schemes[k], &one, sizeof one)) k++;
        if (k < cfg->n_ckpt_schemes) continue;
        if (k == MODEL_MAX_SCHEMES)
            return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: quantization_config has more than %d different weight schemes",
                              label, MODEL_MAX_SCHEMES);
        cfg->ckpt_schemes[cfg->n_ckpt_schemes++] = one;
    }
    return FERRY_OK;
}

void model_quant_describe(const model_config *cfg, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    if (cfg->n_ckpt_schemes == 0) snprintf(buf, cap, "none");
    for (int k = 0; k < cfg->n_ckpt_schemes && n < cap; k++) {
        const model_quant_scheme *q = &cfg->ckpt_schemes[k];
        int w = q->group ? snprintf(buf + n, cap - n, "%s%s group %d", k ? ", " : "", quant_name(q->quant), q->group)
                         : snprintf(buf + n, cap - n, "%s%s per channel", k ? ", " : "", quant_name(q->quant));
        n += w > 0 ? (size_t)w : 0;
    }
}

/* Whether config.json gives rope_theta where rope_config_parse looks for it
 * (else that takes 10000, and the architecture's own default applies). */
static bool rope_theta_given(const json_value *root)
{
    static const char *const where[] = {"rope_parameters", "rope_scaling"};
    double v;
    bool bad = false;
    if (json_get_num(root, "rope_theta", &v, &bad)) return true;
    for (size_t i = 0; i < 2; i++) {
        const json_value *o = json_get(root, where[i]);
        if (o && o->type == JSON_OBJECT && json_get_num(o, "rope_theta", &v, &bad)) return true;
    }
    return false;
}

/* ---- mixtures of experts ------------------------------------------------- */

/* An integer field in lo..hi, def when absent or null. */
static ferry_status get_int_in(const json_value *root, const char *label, const char *key, int def, int lo, int hi,
                               int *out)
{
    int64_t v;
    bool bad = false;
    if (!json_get_int(root, key, &v, &bad)) {
        if (bad) return ferry_fail(FERRY_ERR_INVALID, "%s: field '%s' must be an integer", label, key);
        v = def;
    }
    if (v < lo || v > hi)
        return ferry_fail(FERRY_ERR_INVALID, "%s: field '%s' = %lld is out of range (%d..%d)", label, key,
                          (long long)v, lo, hi);
    *out = (int)v;
    return FERRY_OK;
}

static void set_sparse(model_config *cfg, int l)
{
    cfg->moe_mask[l / 64] |= 1ull << (l % 64);
    cfg->n_moe_layers++;
}

/* Mixtral (MixtralConfig, MixtralSparseMoeBlock): every layer sparse, of
 * num_local_experts experts of intermediate_size, weights always
 * renormalized. Qwen3-MoE (Qwen3MoeConfig, Qwen3MoeDecoderLayer): layer l is
 * sparse iff l is not in mlp_only_layers, num_experts > 0 and (l + 1) %
 * decoder_sparse_step == 0, its experts of moe_intermediate_size; the other
 * layers keep a dense MLP of intermediate_size. */
static ferry_status parse_moe(const json_value *root, const char *label, model_config *cfg)
{
    if (cfg->arch == ARCH_MIXTRAL) {
        FERRY_TRY(get_int_in(root, label, "num_local_experts", 8, 1, MODEL_MAX_EXPERTS, &cfg->n_experts));
        FERRY_TRY(get_int_in(root, label, "num_experts_per_tok", 2, 1, cfg->n_experts, &cfg->top_k));
        cfg->moe_hidden = cfg->hidden;
        cfg->norm_topk = true;
        for (int l = 0; l < cfg->n_layers; l++) set_sparse(cfg, l);
        return FERRY_OK;
    }
    int step;
    FERRY_TRY(get_int_in(root, label, "num_experts", 128, 0, MODEL_MAX_EXPERTS, &cfg->n_experts));
    FERRY_TRY(get_int_in(root, label, "decoder_sparse_step", 1, 1, INT_LIMIT, &step));
    FERRY_TRY(get_flag(root, label, "norm_topk_prob", false, &cfg->norm_topk));
    if (cfg->n_experts > 0) {
        FERRY_TRY(get_int_in(root, label, "num_experts_per_tok", 8, 1, cfg->n_experts, &cfg->top_k));
        FERRY_TRY(get_int_in(root, label, "moe_intermediate_size", 768, 1, INT_LIMIT, &cfg->moe_hidden));
    }
    bool dense_only[MODEL_MAX_LAYERS] = {false};
    const json_value *only = json_get(root, "mlp_only_layers");
    if (only && only->type != JSON_NULL) {
        if (only->type != JSON_ARRAY)
            return ferry_fail(FERRY_ERR_INVALID, "%s: field 'mlp_only_layers' must be a list of layer indices", label);
        for (size_t i = 0; i < only->len; i++) {
            const json_value *v = &only->items[i];
            if (v->type != JSON_NUMBER || !v->is_int)
                return ferry_fail(FERRY_ERR_INVALID, "%s: field 'mlp_only_layers' entry %zu is not an integer", label, i);
            /* transformers asks `layer_idx not in mlp_only_layers`: an index that is no layer changes nothing */
            if (v->integer >= 0 && v->integer < cfg->n_layers) dense_only[v->integer] = true;
        }
    }
    for (int l = 0; l < cfg->n_layers; l++)
        if (cfg->n_experts > 0 && !dense_only[l] && (l + 1) % step == 0) set_sparse(cfg, l);
    if (cfg->n_moe_layers == 0) cfg->n_experts = cfg->top_k = cfg->moe_hidden = 0; /* a dense model */
    return FERRY_OK;
}

ferry_status model_config_parse(const char *text, size_t len, const char *label, model_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    json_doc *doc;
    ferry_status st = json_parse(text, len, &doc);
    if (st != FERRY_OK) return ferry_fail_context(st, "%s", label);
    const json_value *root = json_doc_root(doc);
    const json_value *archs = json_get(root, "architectures");
    if (root->type != JSON_OBJECT) {
        st = ferry_fail(FERRY_ERR_INVALID, "%s: not a JSON object", label);
        goto out;
    }
    if (!archs || archs->type != JSON_ARRAY || archs->len != 1 || archs->items[0].type != JSON_STRING) {
        st = ferry_fail(FERRY_ERR_INVALID, "%s: field 'architectures' must be a list of one name", label);
        goto out;
    }
    size_t k = 0;
    while (k < N_ARCHS && strcmp(k_archs[k].name, archs->items[0].str) != 0) k++;
    if (k == N_ARCHS) {
        char names[256] = "";
        for (size_t i = 0; i < N_ARCHS; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", k_archs[i].name);
        const char *why = NULL;
        for (size_t i = 0; i < sizeof k_refused / sizeof k_refused[0]; i++)
            if (!strcmp(k_refused[i].name, archs->items[0].str)) why = k_refused[i].why;
        st = ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: unsupported architecture '%s'%s%s (supported: %s)", label,
                        archs->items[0].str, why ? ": " : "", why ? why : "", names);
        goto out;
    }
    cfg->arch = k_archs[k].arch;
    cfg->arch_name = k_archs[k].name;

    if ((st = get_dim(root, label, "vocab_size", true, 0, &cfg->vocab)) ||
        (st = get_dim(root, label, "hidden_size", true, 0, &cfg->dim)) ||
        (st = get_dim(root, label, "intermediate_size", !k_archs[k].hidden, k_archs[k].hidden, &cfg->hidden)) ||
        (st = get_dim(root, label, "num_hidden_layers", true, 0, &cfg->n_layers)) ||
        (st = get_dim(root, label, "num_attention_heads", true, 0, &cfg->n_heads)) ||
        (st = get_dim(root, label, "num_key_value_heads", false,
                      k_archs[k].kv_heads ? k_archs[k].kv_heads : cfg->n_heads, &cfg->n_kv_heads)) ||
        (st = get_dim(root, label, "head_dim", false,
                      k_archs[k].head_dim ? k_archs[k].head_dim : cfg->dim / cfg->n_heads, &cfg->head_dim)) ||
        (st = get_dim(root, label, "max_position_embeddings", false, k_archs[k].max_pos, &cfg->max_pos)))
        goto out;
    if (cfg->n_heads % cfg->n_kv_heads != 0) {
        st = ferry_fail(FERRY_ERR_INVALID, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                        label, cfg->n_heads, cfg->n_kv_heads);
        goto out;
    }
    if (cfg->head_dim % 2 != 0 || cfg->head_dim == 0) {
        st = ferry_fail(FERRY_ERR_INVALID, "%s: head_dim %d must be even", label, cfg->head_dim);
        goto out;
    }
    if ((uint64_t)cfg->n_heads * (uint64_t)cfg->head_dim > INT_LIMIT) {
        st = ferry_fail(FERRY_ERR_INVALID, "%s: num_attention_heads x head_dim is too large", label);
        goto out;
    }

    if ((st = rope_config_parse(root, label, cfg->max_pos, &cfg->rope)) ||
        (st = get_float(root, label, "rms_norm_eps", k_archs[k].norm_eps, &cfg->norm_eps)) ||
        (st = get_flag(root, label, "tie_word_embeddings", false, &cfg->tied)) ||
        (st = reject_unsupported(root, label, cfg)))
        goto out;
    const json_value *qc = json_get(root, "quantization_config");
    if (qc && qc->type != JSON_NULL && (st = parse_quantization(qc, label, cfg)) != FERRY_OK) goto out;

    bool attention_bias = false;
    if ((st = get_flag(root, label, "attention_bias", false, &attention_bias))) goto out;
    switch (cfg->arch) {
    case ARCH_QWEN2:
        cfg->qkv_bias = true;
        break;
    case ARCH_QWEN3:
    case ARCH_QWEN3_MOE:
        cfg->qk_norm = true;
        /* fall through */
    case ARCH_LLAMA:
        cfg->qkv_bias = cfg->o_bias = attention_bias;
        break;
    case ARCH_MISTRAL:
    case ARCH_MIXTRAL:
        break; /* MistralAttention (and Mixtral's) has no biases whatever attention_bias says */
    }
    if (cfg->arch == ARCH_MISTRAL || cfg->arch == ARCH_MIXTRAL) {
        /* MistralConfig defaults sliding_window to 4096, MixtralConfig to
         * null; null disables it. */
        const json_value *sw = json_get(root, "sliding_window");
        if (!sw) {
            cfg->sliding_window = cfg->arch == ARCH_MISTRAL ? 4096 : 0;
        } else if (sw->type != JSON_NULL &&
                   (st = get_dim(root, label, "sliding_window", true, 0, &cfg->sliding_window))) {
            goto out;
        }
    }
    if (!rope_theta_given(root)) cfg->rope.theta = k_archs[k].theta;
    if ((cfg->arch == ARCH_MIXTRAL || cfg->arch == ARCH_QWEN3_MOE) && (st = parse_moe(root, label, cfg)) != FERRY_OK)
        goto out;
out:
    json_doc_free(doc);
    return st;
}

ferry_status model_config_load(const char *dir, model_config *cfg)
{
    char *path = util_path_join(dir, "config.json");
    if (!path) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    char *text;
    size_t len;
    ferry_status st = model_dir_read(dir, "config.json", &text, &len);
    if (st == FERRY_OK) {
        st = model_config_parse(text, len, path, cfg);
        free(text);
    }
    free(path);
    return st;
}

void model_config_untie_head(model_config *cfg)
{
    cfg->head_from_embed = cfg->tied;
    cfg->tied = false;
}

/* ---- units ---------------------------------------------------------------- */

int model_unit_count(const model_config *c) { return c->n_layers + 2 + c->n_moe_layers * c->n_experts; }

int model_moe_index(const model_config *c, int l)
{
    if (!model_layer_moe(c, l)) return -1;
    int i = 0;
    for (int w = 0; w < l / 64; w++) i += __builtin_popcountll(c->moe_mask[w]);
    uint64_t below = c->moe_mask[l / 64] & ((1ull << (l % 64)) - 1);
    return i + __builtin_popcountll(below);
}

int model_expert_unit(const model_config *c, int l, int e)
{
    int i = model_moe_index(c, l);
    FERRY_ASSERT(i >= 0 && e >= 0 && e < c->n_experts);
    return c->n_layers + 2 + i * c->n_experts + e;
}

/* One block: the layers, then each sparse layer's experts, so that
 * model_weights_free (and a caller that calloc'd layers alone for a dense
 * model) frees it with free(layers). */
ferry_status model_weights_alloc(const model_config *cfg, model_weights *w)
{
    memset(w, 0, sizeof *w);
    size_t n_layers = (size_t)cfg->n_layers, n_experts = (size_t)cfg->n_moe_layers * (size_t)cfg->n_experts;
    _Static_assert(sizeof(layer_weights) % _Alignof(expert_weights) == 0, "experts follow the layers aligned");
    char *block = calloc(1, n_layers * sizeof(layer_weights) + n_experts * sizeof(expert_weights));
    if (!block) return ferry_fail(FERRY_ERR_NOMEM, "out of memory for the weights of %d layers", cfg->n_layers);
    w->layers = (layer_weights *)block;
    expert_weights *next = (expert_weights *)(block + n_layers * sizeof(layer_weights));
    for (int l = 0; l < cfg->n_layers; l++)
        if (model_layer_moe(cfg, l)) {
            w->layers[l].experts = next;
            next += cfg->n_experts;
        }
    return FERRY_OK;
}

void model_weights_free(model_weights *w)
{
    free(w->layers);
    memset(w, 0, sizeof *w);
}

/* ---- the tensor table ------------------------------------------------- */

#define EMBED_NAME "model.embed_tokens.weight" /* also a head_from_embed model's lm_head */

typedef enum { D_NONE, D_ONE, D_DIM, D_VOCAB, D_HIDDEN, D_QDIM, D_KVDIM, D_HEAD, D_EXPERTS, D_MOE_HIDDEN } dim_code;
typedef enum { IF_ALWAYS, IF_QKV_BIAS, IF_O_BIAS, IF_QK_NORM, IF_UNTIED, IF_DENSE, IF_SPARSE } spec_cond;

static const struct {
    unit_kind unit;
    const char *fmt; /* %d: layer index; NULL: the architecture's router (k_moe_names) */
    size_t field;    /* offsetof in layer_weights or model_weights */
    dim_code rows, cols; /* rows == D_NONE: 1-D */
    spec_cond cond;
    bool linear;     /* what quantization applies to (never the router: compressed-tensors leaves gates alone) */
} k_specs[] = {
    {UNIT_EMBED, EMBED_NAME, offsetof(model_weights, embed), D_VOCAB, D_DIM, IF_ALWAYS, false},
    {UNIT_LAYER, "model.layers.%d.input_layernorm.weight", offsetof(layer_weights, attn_norm), D_NONE, D_DIM, IF_ALWAYS, false},
    {UNIT_LAYER, "model.layers.%d.self_attn.q_proj.weight", offsetof(layer_weights, wq), D_QDIM, D_DIM, IF_ALWAYS, true},
    {UNIT_LAYER, "model.layers.%d.self_attn.q_proj.bias", offsetof(layer_weights, bq), D_NONE, D_QDIM, IF_QKV_BIAS, false},
    {UNIT_LAYER, "model.layers.%d.self_attn.k_proj.weight", offsetof(layer_weights, wk), D_KVDIM, D_DIM, IF_ALWAYS, true},
    {UNIT_LAYER, "model.layers.%d.self_attn.k_proj.bias", offsetof(layer_weights, bk), D_NONE, D_KVDIM, IF_QKV_BIAS, false},
    {UNIT_LAYER, "model.layers.%d.self_attn.v_proj.weight", offsetof(layer_weights, wv), D_KVDIM, D_DIM, IF_ALWAYS, true},
    {UNIT_LAYER, "model.layers.%d.self_attn.v_proj.bias", offsetof(layer_weights, bv), D_NONE, D_KVDIM, IF_QKV_BIAS, false},
    {UNIT_LAYER, "model.layers.%d.self_attn.q_norm.weight", offsetof(layer_weights, q_norm), D_NONE, D_HEAD, IF_QK_NORM, false},
    {UNIT_LAYER, "model.layers.%d.self_attn.k_norm.weight", offsetof(layer_weights, k_norm), D_NONE, D_HEAD, IF_QK_NORM, false},
    {UNIT_LAYER, "model.layers.%d.self_attn.o_proj.weight", offsetof(layer_weights, wo), D_DIM, D_QDIM, IF_ALWAYS, true},
    {UNIT_LAYER, "model.layers.%d.self_attn.o_proj.bias", offsetof(layer_weights, bo), D_NONE, D_DIM, IF_O_BIAS, false},
    {UNIT_LAYER, "model.layers.%d.post_attention_layernorm.weight", offsetof(layer_weights, mlp_norm), D_NONE, D_DIM, IF_ALWAYS, false},
    {UNIT_LAYER, NULL, offsetof(layer_weights, router), D_EXPERTS, D_DIM, IF_SPARSE, false},
    {UNIT_LAYER, "model.layers.%d.mlp.gate_proj.weight", offsetof(layer_weights, w_gate), D_HIDDEN, D_DIM, IF_DENSE, true},
    {UNIT_LAYER, "model.layers.%d.mlp.up_proj.weight", offsetof(layer_weights, w_up), D_HIDDEN, D_DIM, IF_DENSE, true},
    {UNIT_LAYER, "model.layers.%d.mlp.down_proj.weight", offsetof(layer_weights, w_down), D_DIM, D_HIDDEN, IF_DENSE, true},
    {UNIT_HEAD, "model.norm.weight", offsetof(model_weights, final_norm), D_NONE, D_DIM, IF_ALWAYS, false},
    {UNIT_HEAD, "lm_head.weight", offsetof(model_weights, lm_head), D_VOCAB, D_DIM, IF_UNTIED, false},
};
#define N_SPECS (sizeof k_specs / sizeof k_specs[0])

/* A sparse layer's checkpoint names: the router (%d: layer) and each
 * expert's projections (%d: layer, %d: expert) in unit order. */
typedef struct {
    const char *fmt;
    size_t field; /* offsetof in expert_weights */
    dim_code rows, cols;
} expert_spec;

static const struct {
    model_arch arch;
    const char *router;
    expert_spec proj[3]; /* gate, up, down */
} k_moe_names[] = {
    {ARCH_MIXTRAL, "model.layers.%d.block_sparse_moe.gate.weight",
     {{"model.layers.%d.block_sparse_moe.experts.%d.w1.weight", offsetof(expert_weights, w_gate), D_MOE_HIDDEN, D_DIM},
      {"model.layers.%d.block_sparse_moe.experts.%d.w3.weight", offsetof(expert_weights, w_up), D_MOE_HIDDEN, D_DIM},
      {"model.layers.%d.block_sparse_moe.experts.%d.w2.weight", offsetof(expert_weights, w_down), D_DIM, D_MOE_HIDDEN}}},
    {ARCH_QWEN3_MOE, "model.layers.%d.mlp.gate.weight",
     {{"model.layers.%d.mlp.experts.%d.gate_proj.weight", offsetof(expert_weights, w_gate), D_MOE_HIDDEN, D_DIM},
      {"model.layers.%d.mlp.experts.%d.up_proj.weight", offsetof(expert_weights, w_up), D_MOE_HIDDEN, D_DIM},
      {"model.layers.%d.mlp.experts.%d.down_proj.weight", offsetof(expert_weights, w_down), D_DIM, D_MOE_HIDDEN}}},
};

static int moe_names_of(const model_config *c)
{
    for (size_t i = 0; i < sizeof k_moe_names / sizeof k_moe_names[0]; i++)
        if (k_moe_names[i].arch == c->arch) return (int)i;
    FERRY_ASSERT(!"a sparse layer in an architecture without experts");
    return -1;
}

static int64_t dim_value(const model_config *c, dim_code d)
{
    switch (d) {
    case D_NONE: return 0;
    case D_ONE: return 1;
    case D_DIM: return c->dim;
    case D_VOCAB: return c->vocab;
    case D_HIDDEN: return c->hidden;
    case D_QDIM: return (int64_t)c->n_heads * c->head_dim;
    case D_KVDIM: return (int64_t)c->n_kv_heads * c->head_dim;
    case D_HEAD: return c->head_dim;
    case D_EXPERTS: return c->n_experts;
    case D_MOE_HIDDEN: return c->moe_hidden;
    }
    return 0;
}

static bool cond_holds(const model_config *c, spec_cond cond, int layer)
{
    switch (cond) {
    case IF_ALWAYS: return true;
    case IF_QKV_BIAS: return c->qkv_bias;
    case IF_O_BIAS: return c->o_bias;
    case IF_QK_NORM: return c->qk_norm;
    case IF_UNTIED: return !c->tied;
    case IF_DENSE: return !model_layer_moe(c, layer);
    case IF_SPARSE: return model_layer_moe(c, layer);
    }
    return false;
}

static void add_entry(const model_config *cfg, model_weights *w, size_t s, int layer, tensor_entry *out)
{
    memset(out, 0, sizeof *out);
    const char *fmt = k_specs[s].fmt ? k_specs[s].fmt : k_moe_names[moe_names_of(cfg)].router;
    snprintf(out->name, sizeof out->name, fmt, layer);
    out->unit = k_specs[s].unit;
    out->layer = layer;
    out->rows = dim_value(cfg, k_specs[s].rows);
    out->cols = dim_value(cfg, k_specs[s].cols);
    out->linear = k_specs[s].linear;
    out->lm_head = k_specs[s].unit == UNIT_HEAD && k_specs[s].rows == D_VOCAB;
    char *base = k_specs[s].unit == UNIT_LAYER ? (char *)&w->layers[layer] : (char *)w;
    out->dst = (weight *)(base + k_specs[s].field);
}

static void add_expert_entry(const model_config *cfg, model_weights *w, int layer, int e, int p, tensor_entry *out)
{
    const expert_spec *spec = &k_moe_names[moe_names_of(cfg)].proj[p];
    FERRY_ASSERT(w->layers[layer].experts); /* w from model_weights_alloc */
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, spec->fmt, layer, e);
    out->unit = UNIT_EXPERT;
    out->layer = layer;
    out->expert = e;
    out->rows = dim_value(cfg, spec->rows);
    out->cols = dim_value(cfg, spec->cols);
    out->linear = true;
    out->dst = (weight *)((char *)&w->layers[layer].experts[e] + spec->field);
}

ferry_status model_tensor_entries(const model_config *cfg, model_weights *w, tensor_entry **out, int *n)
{
    size_t cap = N_SPECS * (size_t)(cfg->n_layers + 1) + 3 * (size_t)cfg->n_moe_layers * (size_t)cfg->n_experts;
    tensor_entry *v = calloc(cap, sizeof *v);
    if (!v) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    int k = 0;
    for (size_t s = 0; s < N_SPECS; s++)
        if (k_specs[s].unit == UNIT_EMBED && cond_holds(cfg, k_specs[s].cond, 0)) add_entry(cfg, w, s, 0, &v[k++]);
    for (int l = 0; l < cfg->n_layers; l++) {
        for (size_t s = 0; s < N_SPECS; s++)
            if (k_specs[s].unit == UNIT_LAYER && cond_holds(cfg, k_specs[s].cond, l)) add_entry(cfg, w, s, l, &v[k++]);
        if (model_layer_moe(cfg, l))
            for (int e = 0; e < cfg->n_experts; e++)
                for (int p = 0; p < 3; p++) add_expert_entry(cfg, w, l, e, p, &v[k++]);
    }
    for (size_t s = 0; s < N_SPECS; s++)
        if (k_specs[s].unit == UNIT_HEAD && cond_holds(cfg, k_specs[s].cond, 0)) add_entry(cfg, w, s, 0, &v[k++]);
    *out = v;
    *n = k;
    return FERRY_OK;
}

/* The shape of a tensor, "[a, b]", for errors. */
static void shape_str(const st_tensor *t, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < t->ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* Checks t's shape against [rows, cols] (rows 0: 1-D [cols]). */
static ferry_status check_shape(const st_checkpoint *ck, const st_tensor *t, int64_t rows, int64_t cols)
{
    bool ok = rows == 0 ? (t->ndim == 1 && t->shape[0] == cols)
                        : (t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols);
    if (ok) return FERRY_OK;
    char got[96], want[64];
    shape_str(t, got, sizeof got);
    if (rows == 0) snprintf(want, sizeof want, "[%lld]", (long long)cols);
    else snprintf(want, sizeof want, "[%lld, %lld]", (long long)rows, (long long)cols);
    return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%s' has shape %s, expected %s", ck->files[t->file].name,
                      t->name, got, want);
}

/* Scales per row of scheme q on a layer of `cols` input columns. */
static int64_t scheme_groups(const model_quant_scheme *q, int64_t cols)
{
    return q->group ? (cols + q->group - 1) / q->group : 1;
}

/* Which of the config's schemes a quantized layer's tensors have (see
 * model_weights_bind): `quant` from its data, the group from its scale's
 * columns. Two matching schemes that split the row differently are
 * ambiguous; ones that split it alike (group 128 and per channel on 128
 * columns) are the same. */
static ferry_status pick_scheme(const model_config *cfg, const st_checkpoint *ck, const tensor_entry *s,
                                weight_quant quant, const st_tensor *scale, model_quant_scheme *out)
{
    int found = -1;
    char want[160] = "";
    size_t n = 0;
    for (int k = 0; k < cfg->n_ckpt_schemes; k++) {
        const model_quant_scheme *q = &cfg->ckpt_schemes[k];
        if (q->quant != quant) continue;
        int64_t groups = scheme_groups(q, s->cols);
        if (n < sizeof want)
            n += (size_t)snprintf(want + n, sizeof want - n, "%s[%lld, %lld]", n ? " or " : "", (long long)s->rows,
                                  (long long)groups);
        if (scale->ndim != 2 || scale->shape[0] != s->rows || scale->shape[1] != groups) continue;
        if (found >= 0) {
            int64_t a = cfg->ckpt_schemes[found].group ? cfg->ckpt_schemes[found].group : s->cols;
            int64_t b = q->group ? q->group : s->cols;
            if ((a < s->cols ? a : s->cols) != (b < s->cols ? b : s->cols))
                return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%s' fits two schemes of quantization_config (group "
                                  "%lld and %lld): ambiguous", ck->files[scale->file].name, scale->name, (long long)a,
                                  (long long)b);
            continue;
        }
        found = k;
    }
    if (found < 0) {
        char got[96];
        shape_str(scale, got, sizeof got);
        if (!n)
            return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%s' holds %s weights but quantization_config has no "
                              "%s scheme", ck->files[scale->file].name, s->name, quant_name(quant), quant_name(quant));
        return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%s' has shape %s, expected %s",
                          ck->files[scale->file].name, scale->name, got, want);
    }
    *out = cfg->ckpt_schemes[found];
    return FERRY_OK;
}

/* Whether the config has a scheme of `quant`. */
static bool has_scheme(const model_config *cfg, weight_quant quant)
{
    for (int k = 0; k < cfg->n_ckpt_schemes; k++)
        if (cfg->ckpt_schemes[k].quant == quant) return true;
    return false;
}

/* A compressed-tensors linear layer (see model_weights_bind); *bound false
 * when the checkpoint holds it unquantized. */
static ferry_status bind_quantized(const model_config *cfg, const st_checkpoint *ck, const tensor_entry *s, bool *bound)
{
    char packed_name[160], scale_name[160], shape_name[160];
    int base = (int)strlen(s->name) - (int)strlen("weight"); /* every linear entry ends with "weight" */
    snprintf(packed_name, sizeof packed_name, "%.*sweight_packed", base, s->name);
    snprintf(scale_name, sizeof scale_name, "%.*sweight_scale", base, s->name);
    snprintf(shape_name, sizeof shape_name, "%.*sweight_shape", base, s->name);
    const st_tensor *packed = st_checkpoint_find(ck, packed_name), *plain = st_checkpoint_find(ck, s->name);
    *bound = packed || (plain && plain->dtype == DT_I8);
    if (!*bound) return FERRY_OK;
    const st_tensor *scale = st_checkpoint_find(ck, scale_name), *data = packed ? packed : plain;
    if (!scale) return ferry_fail(FERRY_ERR_INVALID, "%s: quantized tensor '%s' has no '%s'", ck->dir, data->name, scale_name);
    weight *d = s->dst;
    weight_quant quant = WQ_INT8;
    if (packed) {
        if (packed->dtype != DT_I32)
            return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%s' has dtype %s, expected I32 (packed)",
                              ck->files[packed->file].name, packed_name, dtype_name(packed->dtype));
        /* the bits from the words per row: 8 values a word for int4, 4 for int8 */
        int64_t w4 = (s->cols + 7) / 8, w8 = (s->cols + 3) / 4;
        bool fits4 = has_scheme(cfg, WQ_INT4) && packed->ndim == 2 && packed->shape[1] == w4;
        quant = fits4 || !has_scheme(cfg, WQ_INT8) ? WQ_INT4 : WQ_INT8;
        FERRY_TRY(check_shape(ck, packed, s->rows, quant == WQ_INT4 ? w4 : w8));
        const st_tensor *shape = st_checkpoint_find(ck, shape_name);
        if (shape) {
            int64_t v[2] = {-1, -1};
            if (shape->ndim == 1 && shape->shape[0] == 2 && (shape->dtype == DT_I64 || shape->dtype == DT_I32))
                for (int i = 0; i < 2; i++)
                    v[i] = shape->dtype == DT_I64 ? ((const int64_t *)shape->data)[i] : ((const int32_t *)shape->data)[i];
            if (v[0] != s->rows || v[1] != s->cols)
                return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%s' must be [%lld, %lld] (I64 or I32 [2])",
                                  ck->files[shape->file].name, shape_name, (long long)s->rows, (long long)s->cols);
        }
    } else {
        if (!has_scheme(cfg, WQ_INT8))
            return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%s' is int8 but quantization_config has no 8-bit scheme",
                              ck->files[plain->file].name, s->name);
        FERRY_TRY(check_shape(ck, plain, s->rows, s->cols));
    }
    if (!dtype_is_compute(scale->dtype))
        return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%s' has dtype %s (scales: F32, F16, BF16)",
                          ck->files[scale->file].name, scale_name, dtype_name(scale->dtype));
    model_quant_scheme q = {WQ_NONE, 0};
    FERRY_TRY(pick_scheme(cfg, ck, s, quant, scale, &q));
    *d = (weight){.dtype = packed ? DT_I32 : DT_I8, .rows = s->rows, .cols = s->cols, .data = data->data,
                  .quant = quant, .group = q.group ? q.group : (int)s->cols, .scale_dtype = scale->dtype,
                  .scales = scale->data};
    return FERRY_OK;
}

static ferry_status bind_one(const model_config *cfg, const st_checkpoint *ck, const tensor_entry *s)
{
    bool from_embed = s->lm_head && cfg->head_from_embed;
    if ((s->linear || s->lm_head) && !from_embed && cfg->n_ckpt_schemes > 0) {
        bool bound;
        FERRY_TRY(bind_quantized(cfg, ck, s, &bound));
        if (bound) return FERRY_OK;
    }
    const char *name = from_embed ? EMBED_NAME : s->name;
    const st_tensor *t = st_checkpoint_find(ck, name);
    if (!t) return ferry_fail(FERRY_ERR_INVALID, "%s: missing tensor '%s'", ck->dir, name);
    const char *file = ck->files[t->file].name;
    if (t->blocks) { /* a GGUF's blocks: linear layers, the head, the embedding (gguf_hf.c dequantizes the rest) */
        if (!(s->linear || s->lm_head || s->unit == UNIT_EMBED) || s->rows == 0)
            return ferry_fail(FERRY_ERR_INTERNAL, "%s: tensor '%s' is %s blocks where a full-precision one is needed",
                              file, name, gguf_type_name(t->block_type));
        FERRY_TRY(check_shape(ck, t, s->rows, s->cols));
        *s->dst = (weight){.dtype = DT_U8, .rows = s->rows, .cols = s->cols, .data = t->data, .quant = WQ_GGUF,
                           .block = t->block_type};
        return FERRY_OK;
    }
    if (!dtype_is_compute(t->dtype))
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s (supported: F32, F16, BF16)", file,
                          name, dtype_name(t->dtype));
    FERRY_TRY(check_shape(ck, t, s->rows, s->cols));
    s->dst->dtype = t->dtype;
    s->dst->rows = s->rows ? s->rows : 1;
    s->dst->cols = s->cols;
    s->dst->data = t->data;
    return FERRY_OK;
}

ferry_status model_weights_bind(const model_config *cfg, const st_checkpoint *ck, model_weights *w)
{
    FERRY_TRY(model_weights_alloc(cfg, w));
    tensor_entry *entries;
    int n;
    ferry_status st = model_tensor_entries(cfg, w, &entries, &n);
    for (int i = 0; st == FERRY_OK && i < n; i++) st = bind_one(cfg, ck, &entries[i]);
    free(entries);
    if (st == FERRY_OK && cfg->tied) w->lm_head = w->embed;
    if (st != FERRY_OK) model_weights_free(w);
    return st;
}
