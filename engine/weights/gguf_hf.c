/*
 * gguf_hf.c - a GGUF file seen as the Hugging Face checkpoint it stands
 * for: config.json and generation_config.json from the metadata, the
 * tokenizer files through gguf_vocab.c, and the tensors under HF names.
 * See gguf_hf.h.
 */
#define _GNU_SOURCE
#include "gguf_hf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/util.h"
#include "gguf_quant.h"
#include "gguf_vocab.h"
#include "model.h"
#include "model_dir.h"

/* ---- what is a GGUF model --------------------------------------------------- */

static bool ends_with_gguf(const char *name)
{
    size_t n = strlen(name);
    return n > 5 && !strcasecmp(name + n - 5, ".gguf");
}

bool gguf_hf_is_model(const char *path)
{
    struct stat sb;
    return ends_with_gguf(path) && stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

ferry_status gguf_hf_find_in_dir(const char *dir, char **file)
{
    *file = NULL;
    char *cfg = util_path_join(dir, "config.json");
    struct stat sb;
    bool has_cfg = cfg && lstat(cfg, &sb) == 0;
    free(cfg);
    if (has_cfg) return FERRY_ERR_NOT_FOUND;
    DIR *d = opendir(dir);
    if (!d) return FERRY_ERR_NOT_FOUND;
    strbuf names;
    sb_init(&names);
    int n = 0, firsts = 0;
    char *first = NULL, *split_first = NULL;
    for (struct dirent *e; (e = readdir(d));) {
        struct stat es;
        /* regular files (links followed): a directory or a dangling link named *.gguf is not a model */
        if (!ends_with_gguf(e->d_name) || fstatat(dirfd(d), e->d_name, &es, 0) != 0 || !S_ISREG(es.st_mode)) continue;
        sb_printf(&names, "%s%s", n ? ", " : "", e->d_name);
        if (n++ == 0) first = strdup(e->d_name);
        size_t len = strlen(e->d_name);
        if (len > 20 && !strncmp(e->d_name + len - 20, "-00001-of-", 10) && firsts++ == 0)
            split_first = strdup(e->d_name);
    }
    closedir(d);
    ferry_status st = FERRY_ERR_NOT_FOUND;
    if (n > 1 && firsts == 1 && split_first) { /* a gguf-split set alone: its first part names it */
        int count = atoi(split_first + strlen(split_first) - 10);
        if (count == n) {
            free(first);
            first = split_first;
            split_first = NULL;
            n = 1;
        }
    }
    free(split_first);
    if (n == 1 && first) {
        *file = util_path_join(dir, first);
        st = *file ? FERRY_OK : ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    } else if (n > 1) {
        st = ferry_fail(FERRY_ERR_INVALID, "%s: holds %d GGUF files (%s): name the one to serve", dir, n,
                        names.oom ? "..." : names.data);
    }
    free(first);
    sb_free(&names);
    return st;
}

/* ---- metadata -------------------------------------------------------------- */

/* The architectures ferry maps: GGUF name -> HF class and model_type. */
typedef struct {
    const char *gguf, *hf, *model_type;
    bool permuted; /* llama.cpp's converter interleaved q/k rotary halves */
    bool moe;      /* its layers are mixtures of experts (ARCH.expert_count) */
} arch_map;

static const arch_map k_archs[] = {
    {"llama", "LlamaForCausalLM", "llama", true, false},
    {"qwen2", "Qwen2ForCausalLM", "qwen2", false, false},
    {"qwen3", "Qwen3ForCausalLM", "qwen3", false, false},
    {"qwen3moe", "Qwen3MoeForCausalLM", "qwen3_moe", false, true},
};
/* llama with ARCH.expert_count: Mixtral as llama.cpp's converter writes it */
static const arch_map k_mixtral = {"llama", "MixtralForCausalLM", "mixtral", true, true};

typedef struct {
    const gguf_file *g;            /* the first part: the metadata */
    const gguf_file *const *parts; /* every part (the tensors) */
    int n_parts;
    const char *label;
    const arch_map *arch;
    char key[160];
} meta;

/* A tensor of any part by name. */
static const gguf_tensor *find_t(const meta *m, const char *name)
{
    for (int i = 0; i < m->n_parts; i++) {
        const gguf_tensor *t = gguf_find_tensor(m->parts[i], name);
        if (t) return t;
    }
    return NULL;
}

/* ---- files split by gguf-split ------------------------------------------------
 * PREFIX-00001-of-0000N.gguf, ..., PREFIX-0000N-of-0000N.gguf: split.count N
 * and split.no (0-based) in each, the metadata in the first, the tensors
 * spread over all. --model names the first. */

/* split.count (1 when absent) and split.no of g; refused when malformed. */
static ferry_status split_of(const gguf_file *g, const char *label, int *count, int *no)
{
    uint64_t c = 1, k = 0;
    bool bad = false;
    if (!gguf_get_uint(g, "split.count", &c, &bad)) c = 1;
    if (!bad && !gguf_get_uint(g, "split.no", &k, &bad)) k = 0;
    if (bad) return ferry_fail_context(FERRY_ERR_INVALID, "%s", label);
    if (c < 1 || c > 9999 || k >= c)
        return ferry_fail(FERRY_ERR_INVALID, "%s: split.no %llu of split.count %llu", label, (unsigned long long)k,
                          (unsigned long long)c);
    *count = (int)c;
    *no = (int)k;
    return FERRY_OK;
}

/* The path of part k (0-based) of n, from the first's: NULL (an error
 * set) when the first is not named PREFIX-00001-of-0000N.gguf. */
static char *part_path(const char *first, int k, int n)
{
    char tail[40];
    snprintf(tail, sizeof tail, "-00001-of-%05d.gguf", n);
    size_t len = strlen(first), tl = strlen(tail);
    if (len < tl || strcmp(first + len - tl, tail) != 0) {
        ferry_fail(FERRY_ERR_INVALID, "%s: split.count is %d, so its name must end %s (gguf-split's names)", first, n,
                   tail);
        return NULL;
    }
    char *p;
    if (asprintf(&p, "%.*s-%05d-of-%05d.gguf", (int)(len - tl), first, k + 1, n) < 0) {
        ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        return NULL;
    }
    return p;
}

/* Checks that part k of n is what its file says it is. */
static ferry_status check_part(const gguf_file *g, const char *label, int k, int n)
{
    int count, no;
    FERRY_TRY(split_of(g, label, &count, &no));
    if (count != n || no != k)
        return ferry_fail(FERRY_ERR_INVALID, "%s: split.no %d of split.count %d, expected part %d of %d", label, no,
                          count, k, n);
    return FERRY_OK;
}

static const char *arch_key(meta *m, const char *suffix)
{
    snprintf(m->key, sizeof m->key, "%s.%s", m->arch->gguf, suffix);
    return m->key;
}

/* An unsigned ARCH.suffix in 1..INT_MAX; def (0: required) when absent. */
static ferry_status get_dim(meta *m, const char *suffix, uint64_t def, int *out)
{
    const char *key = arch_key(m, suffix);
    uint64_t v;
    bool bad = false;
    if (!gguf_get_uint(m->g, key, &v, &bad)) {
        if (bad) return ferry_fail_context(FERRY_ERR_INVALID, "%s", m->label);
        if (!def) return ferry_fail(FERRY_ERR_INVALID, "%s: metadata key %s is missing", m->label, key);
        v = def;
    }
    if (v < 1 || v > INT_MAX)
        return ferry_fail(FERRY_ERR_INVALID, "%s: metadata key %s = %llu is out of range", m->label, key,
                          (unsigned long long)v);
    *out = (int)v;
    return FERRY_OK;
}

static ferry_status get_real(meta *m, const char *suffix, double def, double *out)
{
    const char *key = arch_key(m, suffix);
    bool bad = false;
    if (!gguf_get_float(m->g, key, out, &bad)) {
        if (bad) return ferry_fail_context(FERRY_ERR_INVALID, "%s", m->label);
        *out = def;
    }
    if (!isfinite(*out) || *out <= 0)
        return ferry_fail(FERRY_ERR_INVALID, "%s: metadata key %s must be a positive number", m->label, key);
    return FERRY_OK;
}

/* The shortest decimal that reads back as the same float (metadata floats
 * are f32: 9.99999975e-06 is written 1e-05, as the original config said). */
static void put_f32(strbuf *sb, double v)
{
    char buf[40];
    float f = (float)v;
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)f);
        if ((float)strtod(buf, NULL) == f) break;
    }
    if (!strpbrk(buf, ".eEn")) strcat(buf, ".0");
    sb_puts(sb, buf);
}

static const arch_map *find_arch(const gguf_file *g, const char *label, ferry_status *st)
{
    gguf_str a;
    bool bad = false;
    if (!gguf_get_str(g, "general.architecture", &a, &bad)) {
        *st = bad ? ferry_fail_context(FERRY_ERR_INVALID, "%s", label)
                  : ferry_fail(FERRY_ERR_INVALID, "%s: metadata key general.architecture is missing", label);
        return NULL;
    }
    uint64_t experts = 0;
    for (size_t i = 0; i < sizeof k_archs / sizeof k_archs[0]; i++) {
        if (!gguf_str_eq(a, k_archs[i].gguf)) continue;
        char key[64];
        snprintf(key, sizeof key, "%s.expert_count", k_archs[i].gguf);
        if (!gguf_get_uint(g, key, &experts, &bad)) experts = 0;
        if (bad) {
            *st = ferry_fail_context(FERRY_ERR_INVALID, "%s", label);
            return NULL;
        }
        if (experts > 0 && !strcmp(k_archs[i].gguf, "llama")) return &k_mixtral;
        if (experts > 0 && !k_archs[i].moe) {
            *st = ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: %s = %llu: experts are served from GGUF for llama "
                             "(Mixtral) and qwen3moe", label, key, (unsigned long long)experts);
            return NULL;
        }
        return &k_archs[i];
    }
    *st = ferry_fail(FERRY_ERR_UNSUPPORTED,
                     "%s: general.architecture '%.*s' is not served from GGUF (supported: llama, qwen2, qwen3, "
                     "qwen3moe)", label, (int)(a.len > 64 ? 64 : a.len), a.ptr);
    return NULL;
}

/* A tokenizer id key, or -1 when absent (or not a number: the tokenizer
 * files refuse that). */
static int64_t token_id(const gguf_file *g, const char *key)
{
    uint64_t v;
    bool bad = false;
    return gguf_get_uint(g, key, &v, &bad) && v <= INT32_MAX ? (int64_t)v : -1;
}

/* The rows of the HF tensor a GGUF tensor is; 0 for a 1-D one. */
static int64_t rows_of(const gguf_tensor *t)
{
    return t->n_dims >= 2 ? (int64_t)t->dims[1] : 0;
}

static ferry_dtype float_dtype(uint32_t type)
{
    return type == GGUF_F32 ? DT_F32 : type == GGUF_F16 ? DT_F16 : type == GGUF_BF16 ? DT_BF16 : DT_COUNT;
}

/* config.json's text for a model of n_parts parts (the metadata in the first). */
static ferry_status config_json(const gguf_file *const *parts, int n_parts, const char *label, strbuf *out)
{
    ferry_status st = FERRY_OK;
    const gguf_file *g = parts[0];
    meta m = {.g = g, .parts = parts, .n_parts = n_parts, .label = label, .arch = find_arch(g, label, &st)};
    if (!m.arch) return st;
    int dim, hidden, layers, heads, kv_heads, head_dim, ctx, rot, vocab = 0;
    double theta, eps;
    FERRY_TRY(get_dim(&m, "embedding_length", 0, &dim));
    int ffl_default = 0; /* Qwen3-MoE's dense size may be left out: its experts' then */
    if (m.arch->moe && !m.arch->permuted) FERRY_TRY(get_dim(&m, "expert_feed_forward_length", 0, &ffl_default));
    FERRY_TRY(get_dim(&m, "feed_forward_length", (uint64_t)ffl_default, &hidden));
    FERRY_TRY(get_dim(&m, "block_count", 0, &layers));
    FERRY_TRY(get_dim(&m, "attention.head_count", 0, &heads));
    FERRY_TRY(get_dim(&m, "attention.head_count_kv", (uint64_t)heads, &kv_heads));
    FERRY_TRY(get_dim(&m, "attention.key_length", (uint64_t)(dim / heads > 0 ? dim / heads : 1), &head_dim));
    FERRY_TRY(get_dim(&m, "context_length", 0, &ctx));
    FERRY_TRY(get_dim(&m, "rope.dimension_count", (uint64_t)head_dim, &rot));
    FERRY_TRY(get_real(&m, "rope.freq_base", 10000.0, &theta));
    FERRY_TRY(get_real(&m, "attention.layer_norm_rms_epsilon", 1e-6, &eps));
    int value_len;
    FERRY_TRY(get_dim(&m, "attention.value_length", (uint64_t)head_dim, &value_len));
    if (value_len != head_dim)
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: %s = %d differs from the key length %d", label,
                          arch_key(&m, "attention.value_length"), value_len, head_dim);
    if (rot != head_dim)
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: %s = %d: partial rotary embeddings (head size %d) are not served",
                          label, arch_key(&m, "rope.dimension_count"), rot, head_dim);
    bool bad = false;
    int experts = 0, used = 0, expert_hidden = 0;
    if (m.arch->moe) {
        FERRY_TRY(get_dim(&m, "expert_count", 0, &experts));
        FERRY_TRY(get_dim(&m, "expert_used_count", 0, &used));
        if (used > experts)
            return ferry_fail(FERRY_ERR_INVALID, "%s: %s = %d is more than the %d experts", label,
                              arch_key(&m, "expert_used_count"), used, experts);
        if (!m.arch->permuted) FERRY_TRY(get_dim(&m, "expert_feed_forward_length", 0, &expert_hidden));
    }
    const gguf_kv *sc = gguf_find(g, arch_key(&m, "rope.scaling.type"));
    double factor = 1;
    bool linear = false;
    if (sc) {
        if (sc->type != GGUF_V_STRING)
            return ferry_fail(FERRY_ERR_INVALID, "%s: metadata key %s must be a string", label, m.key);
        linear = gguf_str_eq(sc->v.s, "linear");
        if (!linear && !gguf_str_eq(sc->v.s, "none"))
            return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: %s '%.*s' is not served from GGUF (none, linear)", label,
                              m.key, (int)(sc->v.s.len > 32 ? 32 : sc->v.s.len), sc->v.s.ptr);
        if (linear) FERRY_TRY(get_real(&m, "rope.scaling.factor", 1.0, &factor));
    }
    if (find_t(&m, "rope_freqs.weight"))
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: tensor rope_freqs.weight (Llama 3.1-style rope scaling as "
                          "frequency factors) is not served from GGUF yet", label);
    uint64_t v;
    if (gguf_get_uint(g, arch_key(&m, "vocab_size"), &v, &bad) && v >= 1 && v <= INT_MAX) vocab = (int)v;
    const gguf_kv *toks = gguf_find(g, "tokenizer.ggml.tokens");
    if (!vocab && toks && toks->type == GGUF_V_ARRAY && toks->v.arr.n <= INT_MAX) vocab = (int)toks->v.arr.n;
    const gguf_tensor *emb = find_t(&m, "token_embd.weight");
    if (!vocab && emb && rows_of(emb) > 0 && rows_of(emb) <= INT_MAX) vocab = (int)rows_of(emb);
    if (!vocab) return ferry_fail(FERRY_ERR_INVALID, "%s: no vocabulary size (%s, tokenizer.ggml.tokens)", label,
                                  arch_key(&m, "vocab_size"));
    uint64_t ftype = 0;
    gguf_get_uint(g, "general.file_type", &ftype, &bad);
    const char *dtype = ftype == 1 ? "float16" : ftype == 32 ? "bfloat16" : "float32";
    bool bias = find_t(&m, "blk.0.attn_q.bias") != NULL;
    sb_printf(out, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n", m.arch->hf, m.arch->model_type);
    sb_printf(out, "  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n  \"num_hidden_layers\": %d,\n", dim, hidden,
              layers);
    sb_printf(out, "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n", heads,
              kv_heads, head_dim);
    sb_printf(out, "  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": ", ctx);
    put_f32(out, eps);
    sb_puts(out, ",\n  \"rope_theta\": ");
    put_f32(out, theta);
    if (linear) {
        sb_puts(out, ",\n  \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": ");
        put_f32(out, factor);
        sb_puts(out, "}");
    } else {
        sb_puts(out, ",\n  \"rope_scaling\": null");
    }
    sb_printf(out, ",\n  \"vocab_size\": %d,\n  \"hidden_act\": \"silu\",\n", vocab);
    if (m.arch->permuted && !m.arch->moe) sb_printf(out, "  \"attention_bias\": %s,\n", bias ? "true" : "false");
    if (m.arch->moe && m.arch->permuted) /* Mixtral: its experts are of intermediate_size */
        sb_printf(out, "  \"num_local_experts\": %d,\n  \"num_experts_per_tok\": %d,\n  \"sliding_window\": null,\n",
                  experts, used);
    else if (m.arch->moe) /* Qwen3-MoE: every layer sparse; llama.cpp renormalizes the top k */
        sb_printf(out, "  \"num_experts\": %d,\n  \"num_experts_per_tok\": %d,\n  \"moe_intermediate_size\": %d,\n"
                       "  \"norm_topk_prob\": true,\n  \"decoder_sparse_step\": 1,\n  \"mlp_only_layers\": [],\n",
                  experts, used, expert_hidden);
    sb_printf(out, "  \"tie_word_embeddings\": %s,\n  \"torch_dtype\": \"%s\"", find_t(&m, "output.weight") ? "false" : "true",
              dtype);
    int64_t bos = token_id(g, "tokenizer.ggml.bos_token_id"), eos = token_id(g, "tokenizer.ggml.eos_token_id");
    if (bos >= 0) sb_printf(out, ",\n  \"bos_token_id\": %lld", (long long)bos);
    if (eos >= 0) sb_printf(out, ",\n  \"eos_token_id\": %lld", (long long)eos);
    sb_puts(out, "\n}\n");
    return out->oom ? ferry_fail(FERRY_ERR_NOMEM, "out of memory") : FERRY_OK;
}

ferry_status gguf_hf_config_json(const gguf_file *g, const char *label, strbuf *out)
{
    return config_json(&g, 1, label, out);
}

/* generation_config.json: bos, and eos with end-of-turn/-message ids
 * (llama.cpp ends generation at every one of them). */
static void generation_json(const gguf_file *g, strbuf *out)
{
    static const char *const ends[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                       "tokenizer.ggml.eom_token_id"};
    int64_t bos = token_id(g, "tokenizer.ggml.bos_token_id");
    sb_puts(out, "{\n");
    if (bos >= 0) sb_printf(out, "  \"bos_token_id\": %lld,\n", (long long)bos);
    sb_puts(out, "  \"eos_token_id\": [");
    int n = 0;
    int64_t seen[3];
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++) {
        int64_t id = token_id(g, ends[i]);
        bool dup = false;
        for (int k = 0; k < n; k++) dup |= seen[k] == id;
        if (id < 0 || dup) continue;
        sb_printf(out, "%s%lld", n ? ", " : "", (long long)id);
        seen[n++] = id;
    }
    sb_puts(out, "]\n}\n");
}

/* ---- the files it stands for ------------------------------------------------ */

static const char *const k_files[] = {"config.json", "generation_config.json", "tokenizer.json",
                                      "tokenizer_config.json"};

bool gguf_hf_has(const char *path, const char *name)
{
    size_t i = 0;
    while (i < sizeof k_files / sizeof k_files[0] && strcmp(name, k_files[i]) != 0) i++;
    if (i == sizeof k_files / sizeof k_files[0] || !gguf_hf_is_model(path)) return false;
    if (strncmp(name, "tokenizer", 9) != 0) return true;
    /* the tokenizer files only where there is a tokenizer */
    gguf_file *g;
    if (gguf_open(path, &g) != FERRY_OK) return true; /* reading it says what is wrong */
    bool has = gguf_find(g, "tokenizer.ggml.model") != NULL;
    gguf_close(g);
    return has;
}

ferry_status gguf_hf_read(const char *path, const char *name, char **text, size_t *len)
{
    *text = NULL;
    *len = 0;
    if (!gguf_hf_has(path, name)) return ferry_fail(FERRY_ERR_NOT_FOUND, "%s: a GGUF file holds no %s", path, name);
    gguf_file *g;
    FERRY_TRY(gguf_open(path, &g));
    strbuf sb;
    sb_init(&sb);
    int n = 1, no = 0;
    ferry_status st = split_of(g, path, &n, &no);
    if (st == FERRY_OK && no != 0)
        st = ferry_fail(FERRY_ERR_INVALID, "%s: part %d of a split model: name the first (split.no 0)", path, no + 1);
    gguf_file **parts = NULL;
    if (st == FERRY_OK && !strcmp(name, "config.json")) { /* the tensors of every part say what the model is */
        parts = calloc((size_t)n, sizeof *parts);
        if (!parts) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        for (int k = 1; k < n && st == FERRY_OK; k++) {
            char *pp = part_path(path, k, n);
            st = pp ? gguf_open(pp, &parts[k]) : FERRY_ERR_INVALID; /* part_path said why */
            if (st == FERRY_OK) st = check_part(parts[k], pp, k, n);
            free(pp);
        }
        if (st == FERRY_OK) {
            parts[0] = g;
            st = config_json((const gguf_file *const *)parts, n, path, &sb);
        }
    } else if (st == FERRY_OK && !strcmp(name, "generation_config.json")) {
        generation_json(g, &sb);
    } else if (st == FERRY_OK && !strcmp(name, "tokenizer.json")) {
        st = gguf_vocab_tokenizer_json(g, path, &sb);
    } else if (st == FERRY_OK) {
        st = gguf_vocab_tokenizer_config_json(g, path, &sb);
    }
    for (int k = 1; parts && k < n; k++) gguf_close(parts[k]);
    free(parts);
    gguf_close(g);
    if (st == FERRY_OK && sb.oom) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    if (st != FERRY_OK) {
        sb_free(&sb);
        return st;
    }
    sb_putc(&sb, '\0');
    *len = sb.len - 1;
    *text = sb.data;
    return FERRY_OK;
}

/* ---- tensors ------------------------------------------------------------------ */

static const struct {
    const char *gguf, *hf;
} k_layer_names[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.bias", "self_attn.o_proj.bias"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};

/* The HF name of GGUF tensor `name` into buf; 0 when it has none. Sets
 * *heads to the head count whose rotary halves were interleaved (q: heads,
 * k: kv_heads) where `permuted`, else 0. */
/* The GGUF names of the weights a linear layer applies (their blocks are
 * computed from as stored). */
static bool is_linear(const char *name)
{
    static const char *const k[] = {".attn_q.weight",   ".attn_k.weight",       ".attn_v.weight",
                                    ".attn_output.weight", ".ffn_gate.weight",  ".ffn_up.weight",
                                    ".ffn_down.weight", ".ffn_gate_exps.weight", ".ffn_up_exps.weight",
                                    ".ffn_down_exps.weight"};
    if (!strcmp(name, "output.weight")) return true;
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (n > strlen(k[i]) && !strcmp(name + n - strlen(k[i]), k[i])) return true;
    return false;
}

/* A sparse layer's router and its experts' tensors (each [n_experts, rows,
 * cols] in the file: expert e is its e-th slice), per architecture. */
static const struct {
    const char *gguf, *mixtral, *qwen3moe;
} k_moe_names[] = {
    {"ffn_gate_inp.weight", "block_sparse_moe.gate.weight", "mlp.gate.weight"},
    {"ffn_gate_exps.weight", "block_sparse_moe.experts.%d.w1.weight", "mlp.experts.%d.gate_proj.weight"},
    {"ffn_up_exps.weight", "block_sparse_moe.experts.%d.w3.weight", "mlp.experts.%d.up_proj.weight"},
    {"ffn_down_exps.weight", "block_sparse_moe.experts.%d.w2.weight", "mlp.experts.%d.down_proj.weight"},
};

/* What naming and un-permuting the tensors needs of the metadata. */
typedef struct {
    const arch_map *arch;
    int layers, heads, kv_heads, experts;
} layout;

/* The HF name of GGUF tensor `name` into buf (for experts' tensors a
 * pattern with %d for the expert, *experts set); false when it has none.
 * Sets *perm_heads to the head count whose rotary halves were interleaved
 * (q: heads, k: kv_heads) where the converter permuted, else 0. */
static bool hf_name(const char *name, const layout *lo, char *buf, size_t cap, int *perm_heads, bool *experts)
{
    bool permuted = lo->arch->permuted;
    int n_layers = lo->layers, heads = lo->heads, kv_heads = lo->kv_heads;
    *perm_heads = 0;
    *experts = false;
    if (!strcmp(name, "token_embd.weight")) return snprintf(buf, cap, "model.embed_tokens.weight") > 0;
    if (!strcmp(name, "output_norm.weight")) return snprintf(buf, cap, "model.norm.weight") > 0;
    if (!strcmp(name, "output.weight")) return snprintf(buf, cap, "lm_head.weight") > 0;
    int layer, used = 0;
    if (sscanf(name, "blk.%d.%n", &layer, &used) != 1 || used == 0 || layer < 0 || layer >= n_layers) return false;
    char digits[16];
    snprintf(digits, sizeof digits, "blk.%d.", layer);
    if (strncmp(name, digits, strlen(digits)) != 0) return false; /* "blk.01." or "blk.+1." */
    const char *rest = name + used;
    for (size_t i = 0; lo->arch->moe && i < sizeof k_moe_names / sizeof k_moe_names[0]; i++) {
        if (strcmp(rest, k_moe_names[i].gguf) != 0) continue;
        *experts = i > 0;
        return snprintf(buf, cap, "model.layers.%d.%s", layer,
                        permuted ? k_moe_names[i].mixtral : k_moe_names[i].qwen3moe) > 0;
    }
    for (size_t i = 0; i < sizeof k_layer_names / sizeof k_layer_names[0]; i++) {
        if (strcmp(rest, k_layer_names[i].gguf) != 0) continue;
        if (permuted && !strncmp(rest, "attn_q.", 7)) *perm_heads = heads;
        if (permuted && !strncmp(rest, "attn_k.", 7)) *perm_heads = kv_heads;
        return snprintf(buf, cap, "model.layers.%d.%s", layer, k_layer_names[i].hf) > 0;
    }
    return false;
}

/* How a GGUF tensor becomes an HF one. */
typedef struct {
    const gguf_tensor *t;
    int64_t rows, cols;      /* HF shape; rows 1 for a 1-D tensor */
    bool one_d;
    int perm_heads;          /* > 0: rows un-interleaved per head */
    bool dequant;            /* a block type: to f32 */
    bool blocks;             /* a block type kept as stored (linear layers, the head) */
    int n_out;               /* HF tensors it is: its experts' count, else 1 */
    int part;                /* the file (of a split model) holding it */
    size_t name0;            /* their names from ck->gguf_names[name0] */
    uint64_t out_off, out_bytes; /* converted: where in the temporary file */
} tensor_job;

/* The GGUF row an HF row comes from: HF row h*R + j*(R/2) + i of a head of R
 * rows holds GGUF row h*R + 2i + j (llama.cpp's permute, inverted). */
static int64_t source_row(int64_t r, int64_t rows, int heads)
{
    if (heads <= 0) return r;
    int64_t per = rows / heads, half = per / 2, h = r / per, k = r % per;
    return h * per + (k % half) * 2 + k / half;
}

/* Writes job j's converted rows into fd at j->out_off, a chunk of rows at
 * a time. */
static ferry_status write_converted(int fd, const char *tmp_label, const tensor_job *j, const char *label)
{
    uint32_t be, bb;
    gguf_type_block(j->t->type, &be, &bb);
    size_t in_row = (size_t)(j->cols / be) * bb;
    size_t out_row = j->dequant ? (size_t)j->cols * 4 : in_row;
    size_t chunk = (16u << 20) / out_row;
    if (chunk < 1) chunk = 1;
    if (chunk > (size_t)j->rows) chunk = (size_t)j->rows;
    uint8_t *buf = malloc(chunk * out_row);
    if (!buf) return ferry_fail(FERRY_ERR_NOMEM, "out of memory converting %.*s", (int)j->t->name.len, j->t->name.ptr);
    ferry_status st = FERRY_OK;
    for (int64_t lo = 0; lo < j->rows && st == FERRY_OK; lo += (int64_t)chunk) {
        int64_t n = j->rows - lo < (int64_t)chunk ? j->rows - lo : (int64_t)chunk;
        for (int64_t r = 0; r < n; r++) {
            const uint8_t *src = j->t->data + (size_t)source_row(lo + r, j->rows, j->perm_heads) * in_row;
            uint8_t *dst = buf + (size_t)r * out_row;
            if (!j->dequant) memcpy(dst, src, in_row);
            else if (!gguf_dequant(j->t->type, src, (float *)dst, (uint64_t)j->cols))
                st = ferry_fail(FERRY_ERR_INTERNAL, "%s: cannot dequantize %s", label, gguf_type_name(j->t->type));
        }
        if (st == FERRY_OK) {
            size_t bytes = (size_t)n * out_row;
            off_t at = (off_t)(j->out_off + (uint64_t)lo * out_row);
            for (size_t done = 0; done < bytes && st == FERRY_OK;) {
                ssize_t w = pwrite(fd, buf + done, bytes - done, at + (off_t)done);
                if (w < 0 && errno == EINTR) continue;
                if (w <= 0) st = ferry_fail(FERRY_ERR_IO, "%s: writing converted tensors: %s", tmp_label,
                                            w < 0 ? strerror(errno) : "no space");
                else done += (size_t)w;
            }
        }
    }
    free(buf);
    return st;
}

/* An unlinked file for the converted tensors, in $TMPDIR or /tmp. */
static ferry_status open_tmp(char **label, int *fd_out)
{
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        char *tmpl = util_path_join(dir, "ferry-gguf-XXXXXX");
        if (!tmpl) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        fd = mkostemp(tmpl, O_CLOEXEC);
        if (fd >= 0) unlink(tmpl);
        free(tmpl);
    }
    if (fd < 0) return ferry_fail(FERRY_ERR_IO, "%s: cannot create a temporary file for converted GGUF tensors: %s", dir,
                                  strerror(errno));
    if (asprintf(label, "%s/(converted GGUF tensors)", dir) < 0) {
        close(fd);
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    *fd_out = fd;
    return FERRY_OK;
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

static ferry_status read_layout(const gguf_file *g, const char *label, layout *lo)
{
    ferry_status st = FERRY_OK;
    meta m = {.g = g, .label = label, .arch = find_arch(g, label, &st)};
    if (!m.arch) return st;
    lo->arch = m.arch;
    lo->experts = 0;
    FERRY_TRY(get_dim(&m, "block_count", 0, &lo->layers));
    FERRY_TRY(get_dim(&m, "attention.head_count", 0, &lo->heads));
    if (m.arch->moe) FERRY_TRY(get_dim(&m, "expert_count", 0, &lo->experts));
    FERRY_TRY(get_dim(&m, "attention.head_count_kv", (uint64_t)lo->heads, &lo->kv_heads));
    /* model.c's bounds, here too: the tensor mapping runs before the config is checked */
    if (lo->layers > MODEL_MAX_LAYERS || lo->heads > 65536 || lo->kv_heads > lo->heads || lo->experts > MODEL_MAX_EXPERTS)
        return ferry_fail(FERRY_ERR_INVALID, "%s: %d layers, %d heads (%d for keys and values), %d experts: out of "
                          "range", label, lo->layers, lo->heads, lo->kv_heads, lo->experts);
    return FERRY_OK;
}

/* Plans tensor i: its HF names (the n_out from names[j->name0], malloc'd),
 * shape, and whether it is converted. */
static ferry_status plan_tensor(const gguf_tensor *t, const char *label, const layout *lo, tensor_job *j,
                                char **names)
{
    char tname[160], hf[192];
    snprintf(tname, sizeof tname, "%.*s", (int)(t->name.len > 150 ? 150 : t->name.len), t->name.ptr);
    size_t name0 = j->name0;
    *j = (tensor_job){.t = t, .n_out = 1, .name0 = name0};
    bool experts;
    if (t->name.len >= 150 || memchr(t->name.ptr, 0, t->name.len) ||
        !hf_name(tname, lo, hf, sizeof hf, &j->perm_heads, &experts))
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: tensor '%s' has no Hugging Face %s counterpart", label, tname,
                          lo->arch->hf);
    if (experts) {
        if (t->n_dims != 3 || t->dims[2] != (uint64_t)lo->experts)
            return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%s' must be [%d experts, rows, columns]", label, tname,
                              lo->experts);
        j->n_out = lo->experts;
        j->cols = (int64_t)t->dims[0];
        j->rows = (int64_t)t->dims[1];
        j->blocks = float_dtype(t->type) == DT_COUNT;
        if (j->blocks && !gguf_dequant_supported(t->type))
            return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: tensor '%s' has block type %s, which ferry does not read "
                              "(F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)", label, tname,
                              gguf_type_name(t->type));
        for (int e = 0; e < lo->experts; e++) {
            char one[200];
            snprintf(one, sizeof one, hf, e);
            if (!(names[name0 + (size_t)e] = strdup(one))) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        }
        return FERRY_OK;
    }
    if (t->n_dims > 2)
        return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%s' has %u dimensions (a weight has 1 or 2)", label, tname,
                          t->n_dims);
    j->one_d = t->n_dims == 1;
    j->cols = (int64_t)t->dims[0];
    j->rows = j->one_d ? 1 : (int64_t)t->dims[1];
    if (float_dtype(t->type) == DT_COUNT) {
        if (!gguf_dequant_supported(t->type))
            return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: tensor '%s' has block type %s, which ferry does not read "
                              "(F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)", label, tname,
                              gguf_type_name(t->type));
        j->blocks = (is_linear(tname) || !strcmp(tname, "token_embd.weight")) && t->n_dims == 2;
        j->dequant = !j->blocks;
    }
    if (j->perm_heads) {
        /* a 1-D bias is its rows' one column each */
        int64_t rows = j->one_d ? j->cols : j->rows;
        if (rows % (2 * (int64_t)j->perm_heads) != 0)
            return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%s': %lld rows do not split into %d heads of two rotary "
                              "halves", label, tname, (long long)rows, j->perm_heads);
        if (j->one_d) {
            if (j->dequant)
                return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: tensor '%s': a quantized bias", label, tname);
            j->rows = rows;
            j->cols = 1;
        }
    }
    if (!(names[name0] = strdup(hf))) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    return FERRY_OK;
}

/* HF tensors GGUF tensor t stands for: a 3-D one of the layout's expert
 * count is its experts (plan_tensor refuses other 3-D ones). */
static size_t outputs_of(const gguf_tensor *t, const layout *lo)
{
    return t->n_dims == 3 && lo->experts > 0 && t->dims[2] == (uint64_t)lo->experts ? (size_t)lo->experts : 1;
}

/* Opens path itself as the checkpoint's first file. */
static ferry_status open_source(const char *path, st_file *f, int fd)
{
    memset(f, 0, sizeof *f);
    f->fd = fd; /* already open (a part checked by model_dir_open), or -1 */
    const char *base = strrchr(path, '/');
    if (!(f->path = strdup(path)) || !(f->name = strdup(base ? base + 1 : path)))
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    if (f->fd < 0 && (f->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return ferry_fail(FERRY_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(f->fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size <= 0)
        return ferry_fail(FERRY_ERR_INVALID, "%s: not a regular, non-empty file", path);
    f->size = (uint64_t)sb.st_size;
    void *map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, f->fd, 0);
    if (map == MAP_FAILED) return ferry_fail(FERRY_ERR_IO, "%s: mmap: %s", path, strerror(errno));
    f->map = map;
    return FERRY_OK;
}

#define CONVERTED_ALIGN 64

/* Opens the n parts of the model at path (1 when it is not split) as
 * ck->files[0..n) and ck->gguf_parts; files[n] is left for the converted
 * tensors. */
static ferry_status open_parts(const char *path, st_checkpoint *ck)
{
    st_file first;
    FERRY_TRY(open_source(path, &first, -1));
    gguf_file *g = NULL;
    int n = 1, no = 0;
    ferry_status st = gguf_parse(first.map, first.size, path, &g);
    if (st == FERRY_OK) st = split_of(g, path, &n, &no);
    if (st == FERRY_OK && no != 0)
        st = ferry_fail(FERRY_ERR_INVALID, "%s: part %d of a split model: name the first (split.no 0)", path, no + 1);
    if (st == FERRY_OK && (ck->files = calloc((size_t)n + 1, sizeof *ck->files)))
        for (int k = 0; k <= n; k++) ck->files[k].fd = -1; /* before anything can fail: close skips them */
    if (st == FERRY_OK && (!ck->files || !(ck->gguf_parts = calloc((size_t)n, sizeof *ck->gguf_parts)))) {
        free(ck->files);
        ck->files = NULL;
        st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    if (st != FERRY_OK) {
        gguf_close(g);
        munmap((void *)first.map, first.size);
        close(first.fd);
        free(first.path);
        free(first.name);
        return st;
    }
    ck->files[0] = first;
    ck->gguf_parts[0] = g;
    ck->n_gguf_parts = n;
    ck->n_files = n;
    for (int k = 1; k < n; k++) {
        char *pp = part_path(path, k, n);
        if (!pp) return FERRY_ERR_INVALID; /* part_path said why */
        /* every further part under model_dir's rule (inside the first's folder,
         * or its Hugging Face cache repository), as a safetensors shard is */
        char *dir = strdup(pp), *checked = NULL;
        int fd = -1;
        if (!dir) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        else {
            char *slash = strrchr(dir, '/');
            if (slash) *slash = '\0';
            st = model_dir_open(slash ? dir : ".", slash ? slash + 1 : pp, &fd, &checked);
        }
        if (st == FERRY_OK) st = open_source(pp, &ck->files[k], fd);
        else if (fd >= 0) close(fd);
        free(checked);
        free(dir);
        free(pp);
        FERRY_TRY(st);
        FERRY_TRY(gguf_parse(ck->files[k].map, ck->files[k].size, ck->files[k].path, &ck->gguf_parts[k]));
        FERRY_TRY(check_part(ck->gguf_parts[k], ck->files[k].path, k, n));
    }
    ck->gguf = g;
    return FERRY_OK;
}

ferry_status gguf_hf_checkpoint_open(const char *path, st_checkpoint *ck)
{
    ck->gguf_model = true;
    if (!(ck->dir = strdup(path))) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    FERRY_TRY(open_parts(path, ck));
    int parts = ck->n_gguf_parts;
    layout lo;
    FERRY_TRY(read_layout(ck->gguf, path, &lo));
    size_t n = 0, n_out = 0;
    for (int p = 0; p < parts; p++) {
        n += gguf_tensor_count(ck->gguf_parts[p]);
        for (size_t i = 0; i < gguf_tensor_count(ck->gguf_parts[p]); i++)
            n_out += outputs_of(gguf_tensor_at(ck->gguf_parts[p], i), &lo);
    }
    tensor_job *jobs = calloc(n ? n : 1, sizeof *jobs);
    ck->tensors = calloc(n_out ? n_out : 1, sizeof *ck->tensors);
    ck->gguf_names = calloc(n_out ? n_out : 1, sizeof *ck->gguf_names);
    if (!jobs || !ck->tensors || !ck->gguf_names) {
        free(jobs);
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    ck->n_gguf_names = n_out;
    ferry_status st = FERRY_OK;
    uint64_t tmp_bytes = 0;
    size_t name0 = 0, n_jobs = 0;
    for (int p = 0; p < parts && st == FERRY_OK; p++)
        for (size_t i = 0; i < gguf_tensor_count(ck->gguf_parts[p]) && st == FERRY_OK; i++) {
            const gguf_tensor *t = gguf_tensor_at(ck->gguf_parts[p], i);
            tensor_job *j = &jobs[n_jobs++];
            j->name0 = name0;
            name0 += outputs_of(t, &lo);
            st = plan_tensor(t, ck->files[p].path, &lo, j, ck->gguf_names);
            j->part = p;
            if (st == FERRY_OK && (j->dequant || j->perm_heads)) {
                j->out_off = tmp_bytes;
                j->out_bytes = j->dequant ? (uint64_t)j->rows * (uint64_t)j->cols * 4 : j->t->nbytes;
                tmp_bytes += (j->out_bytes + CONVERTED_ALIGN - 1) / CONVERTED_ALIGN * CONVERTED_ALIGN;
            }
        }
    st_file *tf = &ck->files[parts];
    if (st == FERRY_OK && tmp_bytes) {
        ck->n_files = parts + 1;
        st = open_tmp(&tf->path, &tf->fd);
        if (st == FERRY_OK && !(tf->name = strdup("(converted GGUF tensors)"))) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        if (st == FERRY_OK && ftruncate(tf->fd, (off_t)tmp_bytes) != 0)
            st = ferry_fail(FERRY_ERR_IO, "%s: %s", tf->path, strerror(errno));
        for (size_t i = 0; i < n && st == FERRY_OK; i++)
            if (jobs[i].dequant || jobs[i].perm_heads) st = write_converted(tf->fd, tf->path, &jobs[i], path);
        if (st == FERRY_OK) {
            void *map = mmap(NULL, tmp_bytes, PROT_READ, MAP_SHARED, tf->fd, 0);
            if (map == MAP_FAILED) st = ferry_fail(FERRY_ERR_IO, "%s: mmap: %s", tf->path, strerror(errno));
            else {
                tf->map = map;
                tf->size = tmp_bytes;
            }
        }
    }
    size_t k = 0;
    for (size_t i = 0; i < n && st == FERRY_OK; i++) {
        const tensor_job *j = &jobs[i];
        uint64_t base = gguf_data_offset(ck->gguf_parts[j->part]) + j->t->offset;
        if (j->t->n_dims == 3) { /* experts: slices of the file's tensor */
            uint64_t slice = j->t->nbytes / (uint64_t)j->n_out;
            for (int e = 0; e < j->n_out; e++)
                ck->tensors[k++] = (st_tensor){.name = ck->gguf_names[j->name0 + (size_t)e],
                                               .dtype = j->blocks ? DT_U8 : float_dtype(j->t->type),
                                               .blocks = j->blocks, .block_type = j->t->type, .ndim = 2,
                                               .shape = {j->rows, j->cols}, .file = j->part,
                                               .offset = base + (uint64_t)e * slice,
                                               .nbytes = slice, .data = j->t->data + (uint64_t)e * slice};
            continue;
        }
        bool conv = j->dequant || j->perm_heads;
        st_tensor *t = &ck->tensors[k++];
        *t = (st_tensor){.name = ck->gguf_names[j->name0],
                         .dtype = j->dequant ? DT_F32 : j->blocks ? DT_U8 : float_dtype(j->t->type),
                         .blocks = j->blocks,
                         .block_type = j->t->type,
                         .ndim = j->one_d ? 1 : 2,
                         .file = conv ? parts : j->part,
                         .offset = conv ? j->out_off : base,
                         .nbytes = conv ? j->out_bytes : j->t->nbytes};
        if (j->one_d) t->shape[0] = j->perm_heads ? j->rows : j->cols;
        else {
            t->shape[0] = j->rows;
            t->shape[1] = j->cols;
        }
        t->data = conv ? tf->map + j->out_off : j->t->data;
    }
    free(jobs);
    if (st != FERRY_OK) return st;
    ck->n_tensors = k;
    qsort(ck->tensors, k, sizeof *ck->tensors, cmp_tensor_name);
    for (size_t i = 1; i < k; i++)
        if (!strcmp(ck->tensors[i - 1].name, ck->tensors[i].name))
            return ferry_fail(FERRY_ERR_INVALID, "%s: two tensors are both '%s'", path, ck->tensors[i].name);
    return FERRY_OK;
}

void gguf_hf_checkpoint_free(st_checkpoint *ck)
{
    for (int p = 0; p < ck->n_gguf_parts; p++) gguf_close(ck->gguf_parts[p]);
    free(ck->gguf_parts);
    for (size_t i = 0; i < ck->n_gguf_names; i++) free(ck->gguf_names[i]);
    free(ck->gguf_names);
}
