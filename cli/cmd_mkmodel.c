/*
 * cmd_mkmodel.c - `ferry mkmodel`: a random checkpoint in the Hugging Face
 * layout (config.json + model.safetensors, or shards + index), for demos,
 * tests and benchmarks.
 *
 * Values are uniform with variance 1/fan_in for matrices (so activations and
 * logits stay O(1) at any size), 1 +- 0.2 for norm weights and +-0.5 for
 * biases; each tensor draws from its own generator seeded by (seed, index),
 * so the data does not depend on how it is sharded. Data is generated and
 * written chunk by chunk; the whole checkpoint appears at --out by one
 * rename only when complete.
 *
 * --tokenizer DIR copies a tokenizer in (tokenizer.json, and
 * tokenizer_config.json, special_tokens_map.json, chat_template.jinja when
 * DIR has them): the vocabulary is then the tokenizer's, config.json's
 * bos/eos ids are its tokens', and generation_config.json names them, so
 * the random model serves text and stops at the tokenizer's eos token.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>

#include "../engine/base/json.h"
#include "../engine/weights/model.h"
#include "../engine/weights/st_writer.h"
#include "../engine/base/util.h"
#include "../text/tokenizer.h"
#include "cli.h"

/* A model shape. The mixtures of experts take theirs from their own tables:
 * experts > 0. */
typedef struct {
    const char *name;
    int dim, hidden, layers, heads, kv_heads, vocab, max_pos;
    bool tied;
    const char *dtype;   /* the default --dtype */
    int head_dim;        /* 0: dim / heads (Qwen3: twice that) */
    int experts, top_k, moe_hidden;
    bool norm_topk;      /* Qwen3-MoE norm_topk_prob (Mixtral: always) */
    int sparse_step;     /* Qwen3-MoE decoder_sparse_step */
    const char *mlp_only; /* Qwen3-MoE mlp_only_layers, a JSON list */
} preset;

#define SHAPE(n, d, h, l, hd, kv, v, mp, t, dt) \
    .name = n, .dim = d, .hidden = h, .layers = l, .heads = hd, .kv_heads = kv, .vocab = v, .max_pos = mp, \
    .tied = t, .dtype = dt

static const preset k_dense_presets[] = {
    {SHAPE("tiny", 64, 128, 2, 4, 2, 256, 512, false, "f32")},
    {SHAPE("small", 256, 688, 4, 8, 4, 2048, 2048, true, "f32")},
    {SHAPE("1b", 2048, 8192, 16, 32, 8, 128256, 8192, true, "bf16")}, /* the shape of Llama 3.2 1B */
    {.name = NULL},
};

/* Mixtral: hidden is intermediate_size, the experts' size. */
static const preset k_mixtral_presets[] = {
    {SHAPE("tiny", 64, 128, 2, 4, 2, 256, 512, false, "f32"), .experts = 8, .top_k = 2, .moe_hidden = 128,
     .norm_topk = true},
    {SHAPE("small", 256, 512, 4, 8, 4, 2048, 2048, false, "f32"), .experts = 8, .top_k = 2, .moe_hidden = 512,
     .norm_topk = true},
    {.name = NULL},
};

/* Qwen3-MoE: hidden is the dense layers' intermediate_size. small keeps
 * layer 0 dense (mlp_only_layers) and leaves the top-k weights as the
 * softmax gives them (norm_topk_prob false, Qwen3MoeConfig's default). */
static const preset k_qwen3moe_presets[] = {
    {SHAPE("tiny", 64, 128, 2, 4, 2, 256, 512, false, "f32"), .head_dim = 32, .experts = 8, .top_k = 2,
     .moe_hidden = 32, .norm_topk = true, .sparse_step = 1, .mlp_only = "[]"},
    {SHAPE("small", 256, 512, 4, 8, 4, 2048, 2048, false, "f32"), .head_dim = 64, .experts = 16, .top_k = 4,
     .moe_hidden = 128, .norm_topk = false, .sparse_step = 1, .mlp_only = "[0]"},
    /* the shape of Qwen3-30B-A3B */
    {SHAPE("30b-a3b", 2048, 6144, 48, 32, 4, 151936, 40960, false, "bf16"), .head_dim = 128, .experts = 128,
     .top_k = 8, .moe_hidden = 768, .norm_topk = true, .sparse_step = 1, .mlp_only = "[]"},
    {.name = NULL},
};
#undef SHAPE

static const struct {
    const char *name, *arch, *model_type;
    model_arch id;
    const preset *presets;
} k_archs[] = {
    {"llama", "LlamaForCausalLM", "llama", ARCH_LLAMA, k_dense_presets},
    {"mistral", "MistralForCausalLM", "mistral", ARCH_MISTRAL, k_dense_presets},
    {"qwen2", "Qwen2ForCausalLM", "qwen2", ARCH_QWEN2, k_dense_presets},
    {"qwen3", "Qwen3ForCausalLM", "qwen3", ARCH_QWEN3, k_dense_presets},
    {"mixtral", "MixtralForCausalLM", "mixtral", ARCH_MIXTRAL, k_mixtral_presets},
    {"qwen3moe", "Qwen3MoeForCausalLM", "qwen3_moe", ARCH_QWEN3_MOE, k_qwen3moe_presets},
};
#define N_ARCHS (sizeof k_archs / sizeof k_archs[0])

/* ---- random values ------------------------------------------------------ */

typedef struct {
    uint64_t state;
    float lo, hi;
} value_gen;

static float gen_next(value_gen *g)
{
    double u = (double)(util_splitmix64(&g->state) >> 11) * 0x1.0p-53;
    return g->lo + (float)u * (g->hi - g->lo);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static void gen_for(const tensor_entry *s, uint64_t seed, int index, value_gen *g)
{
    g->state = util_mix64(seed * 0x100000001b3ull + (uint64_t)index + 1);
    if (s->unit == UNIT_LAYER && ends_with(s->name, ".gate.weight")) {
        /* a router: logits of standard deviation ~2, so that each token's
         * top k stand apart from the rest and tokens differ in them */
        float a = 2.0f * sqrtf(3.0f / (float)s->cols);
        g->lo = -a, g->hi = a;
    } else if (strstr(s->name, "norm")) {
        g->lo = 0.8f, g->hi = 1.2f;
    } else if (strstr(s->name, ".bias")) {
        g->lo = -0.5f, g->hi = 0.5f;
    } else {
        float a = sqrtf(3.0f / (float)s->cols);
        g->lo = -a, g->hi = a;
    }
}

/* ---- writing ------------------------------------------------------------ */

static uint64_t entry_numel(const tensor_entry *s) { return (uint64_t)(s->rows ? s->rows : 1) * (uint64_t)s->cols; }

static ferry_status write_tensor(st_writer *w, const tensor_entry *s, ferry_dtype dt, uint64_t seed, int index,
                                 void *buf, size_t chunk)
{
    value_gen g;
    gen_for(s, seed, index, &g);
    uint64_t left = entry_numel(s);
    while (left) {
        size_t n = left < chunk ? (size_t)left : chunk;
        if (dt == DT_F32) {
            float *f = buf;
            for (size_t i = 0; i < n; i++) f[i] = gen_next(&g);
        } else {
            uint16_t *h = buf;
            for (size_t i = 0; i < n; i++) h[i] = dt == DT_BF16 ? f32_to_bf16(gen_next(&g)) : f32_to_f16(gen_next(&g));
        }
        FERRY_TRY(st_writer_write(w, buf, n * dtype_size(dt)));
        left -= n;
    }
    return FERRY_OK;
}

static ferry_status write_shard(const char *path, const tensor_entry *slots, int from, int to, ferry_dtype dt,
                                uint64_t seed)
{
    st_decl *d = calloc((size_t)(to - from), sizeof *d);
    size_t chunk = 1 << 20;
    void *buf = malloc(chunk * sizeof(float));
    st_writer *w = NULL;
    ferry_status st = FERRY_OK;
    if (!d || !buf) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    for (int i = from; st == FERRY_OK && i < to; i++) {
        st_decl *x = &d[i - from];
        x->name = slots[i].name;
        x->dtype = dt;
        x->ndim = slots[i].rows ? 2 : 1;
        x->shape[0] = slots[i].rows ? slots[i].rows : slots[i].cols;
        x->shape[1] = slots[i].cols;
    }
    if (st == FERRY_OK) st = st_writer_open(path, d, to - from, &w);
    for (int i = from; st == FERRY_OK && i < to; i++) st = write_tensor(w, &slots[i], dt, seed, i, buf, chunk);
    if (st == FERRY_OK) {
        st = st_writer_finish(w);
    } else {
        st_writer_abort(w);
    }
    free(d);
    free(buf);
    return st;
}

/* The special tokens a tokenizer brings (-1: none). */
typedef struct {
    const char *dir;         /* NULL: no --tokenizer */
    int32_t bos, eos;
} tok_info;

static void put_id(strbuf *sb, const char *key, int32_t id)
{
    if (id >= 0) sb_printf(sb, "  \"%s\": %d,\n", key, id);
    else sb_printf(sb, "  \"%s\": null,\n", key);
}

/* config.json as transformers' config class for the architecture reads it;
 * p gives what model_config does not hold (Qwen3-MoE's sparse layout). */
static void config_json(strbuf *sb, const model_config *c, const preset *p, const char *model_type, ferry_dtype dt,
                        const tok_info *ti)
{
    static const char *torch_dtype[] = {[DT_F32] = "float32", [DT_F16] = "float16", [DT_BF16] = "bfloat16"};
    sb_printf(sb, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n", c->arch_name, model_type);
    sb_printf(sb, "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n", c->vocab, c->dim,
              c->hidden);
    sb_printf(sb, "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n",
              c->n_layers, c->n_heads, c->n_kv_heads);
    sb_printf(sb, "  \"head_dim\": %d,\n  \"hidden_act\": \"silu\",\n  \"max_position_embeddings\": %d,\n",
              c->head_dim, c->max_pos);
    sb_printf(sb, "  \"rms_norm_eps\": %g,\n  \"rope_theta\": %.1f,\n  \"rope_scaling\": null,\n", (double)c->norm_eps,
              c->rope.theta);
    sb_printf(sb, "  \"tie_word_embeddings\": %s,\n", c->tied ? "true" : "false");
    if (c->arch == ARCH_LLAMA || c->arch == ARCH_QWEN3 || c->arch == ARCH_QWEN3_MOE)
        sb_printf(sb, "  \"attention_bias\": false,\n");
    if (c->arch == ARCH_LLAMA || c->arch == ARCH_QWEN3) sb_printf(sb, "  \"mlp_bias\": false,\n");
    if (c->arch == ARCH_MISTRAL || c->arch == ARCH_MIXTRAL) {
        if (c->sliding_window) sb_printf(sb, "  \"sliding_window\": %d,\n", c->sliding_window);
        else sb_puts(sb, "  \"sliding_window\": null,\n");
    }
    if (c->arch == ARCH_QWEN2 || c->arch == ARCH_QWEN3 || c->arch == ARCH_QWEN3_MOE)
        sb_puts(sb, "  \"use_sliding_window\": false,\n");
    if (c->arch == ARCH_MIXTRAL) {
        sb_printf(sb, "  \"num_local_experts\": %d,\n  \"num_experts_per_tok\": %d,\n", c->n_experts, c->top_k);
        sb_puts(sb, "  \"router_aux_loss_coef\": 0.02,\n  \"router_jitter_noise\": 0.0,\n");
    }
    if (c->arch == ARCH_QWEN3_MOE) {
        sb_printf(sb, "  \"sliding_window\": null,\n  \"max_window_layers\": %d,\n", c->n_layers);
        sb_printf(sb, "  \"num_experts\": %d,\n  \"num_experts_per_tok\": %d,\n  \"moe_intermediate_size\": %d,\n",
                  c->n_experts, c->top_k, c->moe_hidden);
        sb_printf(sb, "  \"norm_topk_prob\": %s,\n  \"decoder_sparse_step\": %d,\n  \"mlp_only_layers\": %s,\n",
                  c->norm_topk ? "true" : "false", p->sparse_step, p->mlp_only);
        sb_puts(sb, "  \"router_aux_loss_coef\": 0.001,\n");
    }
    if (c->n_experts) sb_puts(sb, "  \"output_router_logits\": false,\n");
    put_id(sb, "bos_token_id", ti->dir ? ti->bos : 1);
    put_id(sb, "eos_token_id", ti->dir ? ti->eos : 2);
    sb_printf(sb, "  \"torch_dtype\": \"%s\"\n}\n", torch_dtype[dt]);
}

/* The names in a NULL-terminated table, for errors. */
static void preset_names(const preset *t, char *buf, size_t cap)
{
    buf[0] = 0;
    for (int i = 0; t[i].name; i++)
        snprintf(buf + strlen(buf), cap - strlen(buf), "%s%s", i ? ", " : "", t[i].name);
}

/* The config before its layout: a mixture of experts' sparse layers follow
 * from the config.json written for it (write_checkpoint). */
static ferry_status build_config(const ferry_config *cfg, model_config *c, const preset **out, const char **model_type,
                                 ferry_dtype *dt)
{
    char names[128];
    size_t a = 0;
    while (a < N_ARCHS && strcmp(cfg->arch, k_archs[a].name)) a++;
    if (a == N_ARCHS) {
        names[0] = 0;
        for (size_t i = 0; i < N_ARCHS; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", k_archs[i].name);
        return ferry_fail(FERRY_ERR_INVALID, "--arch '%s' is not one of %s", cfg->arch, names);
    }
    const preset *p = NULL;
    for (const preset *q = k_archs[a].presets; q->name; q++)
        if (!strcmp(cfg->preset, q->name)) p = q;
    if (!p) {
        preset_names(k_archs[a].presets, names, sizeof names);
        return ferry_fail(FERRY_ERR_INVALID, "--preset '%s' is not one of %s (--arch %s)", cfg->preset, names,
                          cfg->arch);
    }
    *out = p;
    const char *dts = cfg->dtype ? cfg->dtype : p->dtype;
    if (!strcmp(dts, "f32")) *dt = DT_F32;
    else if (!strcmp(dts, "f16")) *dt = DT_F16;
    else if (!strcmp(dts, "bf16")) *dt = DT_BF16;
    else return ferry_fail(FERRY_ERR_INVALID, "--dtype '%s' is not one of f32, f16, bf16", dts);

    memset(c, 0, sizeof *c);
    c->arch = k_archs[a].id;
    c->arch_name = k_archs[a].arch;
    *model_type = k_archs[a].model_type;
    c->vocab = p->vocab;
    c->dim = p->dim;
    c->hidden = p->hidden;
    c->n_layers = cfg->layers > 0 ? (int)cfg->layers : p->layers;
    c->n_heads = p->heads;
    c->n_kv_heads = cfg->kv_heads > 0 ? (int)cfg->kv_heads : p->kv_heads;
    c->head_dim = p->head_dim ? p->head_dim : p->dim / p->heads;
    if (c->arch == ARCH_QWEN3 && !p->head_dim) c->head_dim *= 2; /* Qwen3 sets head_dim independently of hidden/heads */
    c->max_pos = p->max_pos;
    c->tied = config_given(cfg, SETTING_tied) ? cfg->tied : p->tied;
    bool qwen = c->arch == ARCH_QWEN2 || c->arch == ARCH_QWEN3 || c->arch == ARCH_QWEN3_MOE;
    c->rope = (rope_config){.type = ROPE_DEFAULT,
                            .theta = qwen || c->arch == ARCH_MIXTRAL ? 1000000.0
                                     : !strcmp(p->name, "1b")        ? 500000.0
                                                                     : 10000.0,
                            .factor = 1, .attention_factor = 1};
    c->norm_eps = qwen ? 1e-6f : 1e-5f;
    c->qkv_bias = c->arch == ARCH_QWEN2;
    c->qk_norm = c->arch == ARCH_QWEN3 || c->arch == ARCH_QWEN3_MOE;
    c->n_experts = p->experts;
    c->top_k = p->top_k;
    c->moe_hidden = p->moe_hidden;
    c->norm_topk = p->norm_topk;
    if (c->n_heads % c->n_kv_heads)
        return ferry_fail(FERRY_ERR_INVALID, "--kv-heads %d must divide the %d attention heads", c->n_kv_heads,
                          c->n_heads);
    if (cfg->sliding_window > 0 && c->arch != ARCH_MISTRAL && c->arch != ARCH_MIXTRAL)
        return ferry_fail(FERRY_ERR_INVALID, "--sliding-window applies to --arch mistral and mixtral only");
    c->sliding_window = (int)cfg->sliding_window;
    return FERRY_OK;
}

static bool dir_is_empty(const char *path)
{
    DIR *d = opendir(path);
    if (!d) return false;
    struct dirent *e;
    bool empty = true;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = false;
    closedir(d);
    return empty;
}

static void remove_tree(const char *path)
{
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char *p = util_path_join(path, e->d_name);
            if (p) unlink(p);
            free(p);
        }
        closedir(d);
    }
    rmdir(path);
}

/* Writes sb to dir/name. */
static ferry_status write_in(const char *dir, const char *name, const strbuf *sb)
{
    char *path = util_path_join(dir, name);
    ferry_status st = path && !sb->oom ? util_write_file_atomic(path, sb->data, sb->len)
                                       : ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    free(path);
    return st;
}

/* Copies the tokenizer's files into tmp, and writes generation_config.json. */
static ferry_status copy_tokenizer(const char *tmp, const tok_info *ti)
{
    static const char *const files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                        "chat_template.jinja"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char *src = util_path_join(ti->dir, files[i]), *data = NULL;
        size_t len = 0;
        ferry_status st = src ? util_read_file(src, &data, &len) : ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        free(src);
        if (st == FERRY_ERR_NOT_FOUND && i > 0) continue; /* tokenizer.json is checked by tok_load already */
        if (st != FERRY_OK) return st;
        strbuf sb = {data, len, len + 1, false};
        st = write_in(tmp, files[i], &sb);
        free(data);
        FERRY_TRY(st);
    }
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\n");
    put_id(&sb, "bos_token_id", ti->bos);
    put_id(&sb, "eos_token_id", ti->eos);
    sb_puts(&sb, "  \"transformers_version\": \"4.46.0\"\n}\n");
    ferry_status st = write_in(tmp, "generation_config.json", &sb);
    sb_free(&sb);
    return st;
}

/* Writes everything into tmp (an empty directory). The tensors are those
 * of the config.json written, as ferry reads it back. */
static ferry_status write_checkpoint(const char *tmp, const model_config *built, const preset *p,
                                     const char *model_type, ferry_dtype dt, uint64_t seed, uint64_t shard_size,
                                     const tok_info *ti)
{
    strbuf sb;
    sb_init(&sb);
    config_json(&sb, built, p, model_type, dt, ti);
    model_config parsed, *c = &parsed;
    ferry_status st = sb.oom ? ferry_fail(FERRY_ERR_NOMEM, "out of memory")
                             : model_config_parse(sb.data, sb.len, "the config.json written", c);
    if (st == FERRY_OK) st = write_in(tmp, "config.json", &sb);
    sb_free(&sb);
    if (st == FERRY_OK && ti->dir) st = copy_tokenizer(tmp, ti);
    if (st != FERRY_OK) return st;
    char *path = NULL;

    model_weights w;
    tensor_entry *slots = NULL;
    int n = 0;
    int *shard_of = NULL;
    FERRY_TRY(model_weights_alloc(c, &w));
    if ((st = model_tensor_entries(c, &w, &slots, &n)) != FERRY_OK) goto out;
    shard_of = calloc((size_t)n + 1, sizeof *shard_of);
    if (!shard_of) {
        st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        goto out;
    }
    int shards = 1;
    uint64_t cur = 0;
    for (int i = 0; i < n; i++) {
        uint64_t b = entry_numel(&slots[i]) * dtype_size(dt);
        if (cur > 0 && cur + b > shard_size) {
            shards++;
            cur = 0;
        }
        cur += b;
        shard_of[i] = shards - 1;
    }
    char name[64];
    int from = 0;
    for (int s = 0; s < shards && st == FERRY_OK; s++) {
        int to = from;
        while (to < n && shard_of[to] == s) to++;
        if (shards == 1) snprintf(name, sizeof name, "model.safetensors");
        else snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, shards);
        path = util_path_join(tmp, name);
        st = path ? write_shard(path, slots, from, to, dt, seed) : ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        free(path);
        from = to;
    }
    if (st == FERRY_OK && shards > 1) {
        uint64_t total = 0;
        for (int i = 0; i < n; i++) total += entry_numel(&slots[i]) * dtype_size(dt);
        sb_init(&sb);
        sb_printf(&sb, "{\n  \"metadata\": {\"total_size\": %llu},\n  \"weight_map\": {\n", (unsigned long long)total);
        for (int i = 0; i < n; i++) {
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", shard_of[i] + 1, shards);
            sb_puts(&sb, "    ");
            sb_json_str(&sb, slots[i].name);
            sb_puts(&sb, ": ");
            sb_json_str(&sb, name);
            sb_puts(&sb, i + 1 < n ? ",\n" : "\n");
        }
        sb_puts(&sb, "  }\n}\n");
        path = util_path_join(tmp, "model.safetensors.index.json");
        st = path && !sb.oom ? util_write_file_atomic(path, sb.data, sb.len)
                             : ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        free(path);
        sb_free(&sb);
    }
out:
    free(shard_of);
    free(slots);
    model_weights_free(&w);
    return st;
}

int cmd_mkmodel(const ferry_config *cfg)
{
    model_config c;
    const preset *p = NULL;
    const char *model_type = NULL;
    ferry_dtype dt = DT_F32;
    if (build_config(cfg, &c, &p, &model_type, &dt) != FERRY_OK) return cli_error(EXIT_USAGE, "%s", ferry_errmsg());
    tok_info ti = {cfg->tokenizer, -1, -1};
    if (ti.dir) { /* the vocabulary and the special tokens come from the tokenizer */
        tokenizer *t = NULL;
        if (tok_load(ti.dir, &t) != FERRY_OK) return cli_error(EXIT_RUNTIME, "--tokenizer %s: %s", ti.dir, ferry_errmsg());
        c.vocab = tok_vocab_size(t);
        const char *bos = tok_bos_token(t), *eos = tok_eos_token(t);
        ti.bos = bos && *bos ? tok_token_id(t, bos) : -1;
        ti.eos = eos && *eos ? tok_token_id(t, eos) : -1;
        tok_free(t);
    }

    struct stat sb;
    bool exists = stat(cfg->out, &sb) == 0;
    if (exists && !(S_ISDIR(sb.st_mode) && dir_is_empty(cfg->out)))
        return cli_error(EXIT_RUNTIME, "%s: already exists and is not an empty directory", cfg->out);
    size_t len = strlen(cfg->out);
    char *tmp = malloc(len + 32);
    if (!tmp) return cli_error(EXIT_RUNTIME, "out of memory");
    while (len > 1 && cfg->out[len - 1] == '/') len--;
    snprintf(tmp, len + 32, "%.*s.partial-%ld", (int)len, cfg->out, (long)getpid());
    if (mkdir(tmp, 0755) != 0) {
        int rc = cli_error(EXIT_RUNTIME, "%s: %s", tmp, strerror(errno));
        free(tmp);
        return rc;
    }
    ferry_status st = write_checkpoint(tmp, &c, p, model_type, dt, cfg->seed, cfg->shard_size, &ti);
    if (st == FERRY_OK && exists && rmdir(cfg->out) != 0)
        st = ferry_fail(FERRY_ERR_IO, "%s: %s", cfg->out, strerror(errno));
    if (st == FERRY_OK && rename(tmp, cfg->out) != 0)
        st = ferry_fail(FERRY_ERR_IO, "%s: rename: %s", cfg->out, strerror(errno));
    if (st != FERRY_OK) {
        remove_tree(tmp);
        free(tmp);
        return cli_fail(st);
    }
    free(tmp);
    return 0;
}
