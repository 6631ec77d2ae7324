/*
 * test_store.c - where the weights live (engine/store.h), on the CPU backend.
 *
 * Three tiny checkpoints are written with st_writer into a temporary
 * directory, their tensors those model_tensor_entries lists, each byte a
 * function of (tensor, offset): Llama untied in F32, Qwen2 tied in BF16 (q/k/v
 * biases: 1-D tensors between the matrices) and Qwen3 tied in F16 (q_norm,
 * k_norm). Each is placed (plan_place on store_unit_bytes) and opened
 * (store_open) under six placements: all device, all host, all disk, layers
 * spread over the three tiers, everything resident but the embedding (host),
 * and groups of two layers. For every group, store_group_source must say
 * what the plan says (tier, bytes) and where the bytes are (a resident
 * buffer, or a readable blob fd and path in the offload dir); the group's
 * bytes, copied from the buffer or pread from the blob, bound to the view
 * with store_bind, must hold every tensor of exactly the group's units, with
 * the checkpoint's shape, dtype and bytes, 256-aligned, not overlapping, the
 * layout ending where the plan's group size says. The embedding group is the
 * head group when tied; embedding rows (store_embed_rows) equal the
 * checkpoint's rows from every tier. A plan with disk groups and no offload
 * dir fails naming --offload-dir, and a second store on the same offload
 * dir reuses the blobs with the same bytes.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <ftw.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../engine/backend.h"
#include "../../engine/plan.h"
#include "../../engine/store.h"
#include "../../engine/base/json.h"
#include "../../engine/base/util.h"
#include "../../engine/weights/model.h"
#include "../../engine/weights/safetensors.h"
#include "../../engine/weights/st_writer.h"
#include "check.h"

static const convert_opts k_identity = {CONVERT_KEEP, CONVERT_KEEP, false};

#define N_LAYERS 3
#define VOCAB 256
#define DIM 64
#define UNL PLAN_UNLIMITED

typedef struct {
    const char *arch;  /* config.json "architectures" */
    bool tied;
    ferry_dtype dtype;
    const char *dtype_name;
} model_spec;

static const model_spec k_models[] = {
    {"LlamaForCausalLM", false, DT_F32, "f32"},
    {"Qwen2ForCausalLM", true, DT_BF16, "bf16"},
    {"Qwen3ForCausalLM", true, DT_F16, "f16"},
};

/* ---- the checkpoint ------------------------------------------------------- */

static uint8_t content_byte(int tensor, uint64_t off)
{
    uint64_t w = ((uint64_t)tensor * 0x9E3779B97F4A7C15ull) ^ (off / 8 * 0xBF58476D1CE4E5B9ull);
    w ^= w >> 29;
    return (uint8_t)(w >> (8 * (off % 8)));
}

static char *config_text(const model_spec *m)
{
    strbuf sb;
    sb_init(&sb);
    sb_printf(&sb,
              "{\"architectures\": [\"%s\"], \"vocab_size\": %d, \"hidden_size\": %d, \"intermediate_size\": 128, "
              "\"num_hidden_layers\": %d, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, "
              "\"max_position_embeddings\": 512, \"hidden_act\": \"silu\", \"rms_norm_eps\": 1e-6, "
              "\"tie_word_embeddings\": %s}",
              m->arch, VOCAB, DIM, N_LAYERS, m->tied ? "true" : "false");
    return sb.data;
}

/* dir/config.json and dir/model.safetensors for m. */
static ferry_status write_model(const char *dir, const model_spec *m)
{
    char *text = config_text(m);
    model_config cfg;
    ferry_status st = model_config_parse(text, strlen(text), "config.json", &cfg);
    char *path = util_path_join(dir, "config.json");
    FILE *f = st == FERRY_OK ? fopen(path, "w") : NULL;
    if (st == FERRY_OK && (!f || fputs(text, f) < 0)) st = ferry_fail(FERRY_ERR_IO, "cannot write %s", path);
    if (f) fclose(f);
    free(path);
    free(text);
    if (st != FERRY_OK) return st;

    model_weights w;
    tensor_entry *e = NULL;
    int n = 0;
    st = model_weights_alloc(&cfg, &w);
    if (st == FERRY_OK) st = model_tensor_entries(&cfg, &w, &e, &n);
    st_decl *d = calloc((size_t)n + 1, sizeof *d);
    for (int i = 0; st == FERRY_OK && i < n; i++) {
        d[i].name = e[i].name;
        d[i].dtype = m->dtype;
        d[i].ndim = e[i].rows ? 2 : 1;
        d[i].shape[0] = e[i].rows ? e[i].rows : e[i].cols;
        d[i].shape[1] = e[i].cols;
    }
    path = util_path_join(dir, "model.safetensors");
    st_writer *wr = NULL;
    if (st == FERRY_OK) st = st_writer_open(path, d, n, &wr);
    uint8_t buf[4096];
    for (int i = 0; st == FERRY_OK && i < n; i++) {
        uint64_t bytes = (uint64_t)(e[i].rows ? e[i].rows : 1) * (uint64_t)e[i].cols * dtype_size(m->dtype);
        for (uint64_t off = 0; st == FERRY_OK && off < bytes; off += sizeof buf) {
            size_t k = bytes - off < sizeof buf ? (size_t)(bytes - off) : sizeof buf;
            for (size_t j = 0; j < k; j++) buf[j] = content_byte(i, off + j);
            st = st_writer_write(wr, buf, k);
        }
    }
    if (st == FERRY_OK) st = st_writer_finish(wr);
    else st_writer_abort(wr);
    free(path);
    free(d);
    free(e);
    model_weights_free(&w);
    return st;
}

/* ---- directories ------------------------------------------------------------ */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static char *make_dir(void)
{
    const char *base = getenv("TMPDIR");
    char *tmpl = util_path_join(base && *base ? base : "/tmp", "ferry-test-store-XXXXXX");
    if (!mkdtemp(tmpl)) {
        perror("mkdtemp");
        exit(2);
    }
    return tmpl;
}

/* ---- one model ---------------------------------------------------------------- */

typedef struct {
    const model_spec *spec;
    char *dir;
    model_config cfg;
    st_checkpoint *ck;
    model_weights ckw;          /* bound to the checkpoint */
    tensor_entry *ck_entries;   /* [n] into ckw */
    int n;
    uint64_t units[N_LAYERS + 2];
    backend *be;
} model;

static bool model_open(model *m, const model_spec *spec, const char *root, int index)
{
    memset(m, 0, sizeof *m);
    m->spec = spec;
    char name[32];
    snprintf(name, sizeof name, "model-%d", index);
    m->dir = util_path_join(root, name);
    if (mkdir(m->dir, 0700) != 0) return false;
    ferry_status st = write_model(m->dir, spec);
    if (st == FERRY_OK) st = model_config_load(m->dir, &m->cfg);
    if (st == FERRY_OK) st = st_checkpoint_open(m->dir, &m->ck);
    if (st == FERRY_OK) st = model_weights_bind(&m->cfg, m->ck, &m->ckw);
    if (st == FERRY_OK) st = model_tensor_entries(&m->cfg, &m->ckw, &m->ck_entries, &m->n);
    if (st == FERRY_OK) st = store_unit_bytes(&m->cfg, &m->ckw, &k_identity, m->units);
    backend_opts bo = {.threads = 1};
    if (st == FERRY_OK) st = backend_create("cpu", &bo, &m->be);
    if (st != FERRY_OK) fprintf(stderr, "%s: setting up the model failed: %s\n", spec->arch, ferry_errmsg());
    return st == FERRY_OK;
}

static void model_close(model *m)
{
    backend_free(m->be);
    free(m->ck_entries);
    model_weights_free(&m->ckw);
    st_checkpoint_close(m->ck);
    free(m->dir);
}

static uint64_t entry_bytes(const tensor_entry *t)
{
    return (uint64_t)t->dst->rows * (uint64_t)t->dst->cols * dtype_size(t->dst->dtype);
}

/* The unit a tensor is laid out in: 0 embedding, 1 + l layer l, n_layers + 1
 * head (a tied table is the lm_head). */
static int unit_of(const model *m, const tensor_entry *t)
{
    if (t->unit == UNIT_LAYER) return 1 + t->layer;
    if (t->unit == UNIT_HEAD || m->cfg.tied) return N_LAYERS + 1;
    return 0;
}

static bool group_has_unit(const plan_group *g, int u)
{
    switch (g->kind) {
    case GROUP_EMBED: return u == 0;
    case GROUP_HEAD: return u == N_LAYERS + 1;
    case GROUP_LAYERS: return u >= 1 + g->first_layer && u < 1 + g->first_layer + g->n_layers;
    case GROUP_EXPERT: return false; /* the models here are dense */
    }
    return false;
}

/* Unit sizes: 4096-multiples that hold their tensors with 256-byte alignment;
 * the embedding unit is empty when the table is tied to the head. */
static void test_unit_bytes(const model *m)
{
    uint64_t sum[N_LAYERS + 2] = {0};
    int count[N_LAYERS + 2] = {0};
    for (int i = 0; i < m->n; i++) {
        int u = unit_of(m, &m->ck_entries[i]);
        sum[u] += entry_bytes(&m->ck_entries[i]);
        count[u]++;
    }
    for (int u = 0; u < N_LAYERS + 2; u++) {
        CHECK_EQ_U64(m->units[u] % OFFLOAD_ALIGN, 0);
        CHECK(m->units[u] >= sum[u]);
        if (count[u]) CHECK(m->units[u] < sum[u] + (uint64_t)count[u] * STORE_TENSOR_ALIGN + OFFLOAD_ALIGN);
        else CHECK_EQ_U64(m->units[u], 0);
    }
    if (m->cfg.tied) CHECK_EQ_U64(m->units[0], 0);
    else CHECK_EQ_U64(m->units[0], ((uint64_t)VOCAB * DIM * dtype_size(m->spec->dtype) + 4095) / 4096 * 4096);
}

/* ---- placements ------------------------------------------------------------- */

typedef struct {
    const char *name;
    int group_size;
    /* tiers of the groups in plan order (embedding, layer groups, head):
     * D device, H host, K disk, - empty group (not checked) */
    const char *want_untied, *want_tied;
} placement;

enum { P_DEVICE, P_HOST, P_DISK, P_MIXED, P_EMBED_HOST, P_GROUPED, P_COUNT };

static const placement k_placements[P_COUNT] = {
    [P_DEVICE] = {"all device", 1, "DDDDD", "-DDDD"},
    [P_HOST] = {"all host", 1, "HHHHH", "-HHHH"},
    [P_DISK] = {"all disk", 1, "KKKKK", "-KKKK"},
    [P_MIXED] = {"layer 0 device, layer 1 host, the rest disk", 1, "KDHKK", "-DHKK"},
    [P_EMBED_HOST] = {"all device but the embedding", 1, "HDDDD", "-DDDD"},
    [P_GROUPED] = {"groups of two layers: host, then disk", 2, "KHKK", "-HKK"},
};

static void budgets(const model *m, int which, uint64_t b[2])
{
    const uint64_t *u = m->units;
    switch (which) {
    case P_DEVICE: b[0] = UNL, b[1] = UNL; break;
    case P_HOST: b[0] = 0, b[1] = UNL; break;
    case P_DISK: b[0] = 0, b[1] = 0; break;
    case P_MIXED: b[0] = u[1], b[1] = u[2]; break;
    case P_EMBED_HOST: b[0] = u[1] + u[2] + u[3] + u[4], b[1] = UNL; break;
    case P_GROUPED: b[0] = 0, b[1] = u[1] + u[2]; break;
    }
}

static ferry_status make_plan(const model *m, int which, plan *p)
{
    plan_model pm = {.n_layers = N_LAYERS,
                     .dim = m->cfg.dim,
                     .hidden = m->cfg.hidden,
                     .vocab = m->cfg.vocab,
                     .q_dim = m->cfg.n_heads * m->cfg.head_dim,
                     .kv_dim = m->cfg.n_kv_heads * m->cfg.head_dim,
                     .max_pos = m->cfg.max_pos};
    plan_opts po = {.group_size = k_placements[which].group_size,
                    .prefetch = 1,
                    .n_seqs = 1,
                    .context = 64,
                    .max_step_tokens = 16,
                    .unified = m->be->ops->unified};
    budgets(m, which, po.budget);
    return plan_place(&pm, m->units, &po, p); /* budgets: weight bytes per tier */
}

/* The group's bytes: a copy of the resident buffer, or read from the blob
 * through the descriptor the pipeline would use (O_DIRECT: aligned). */
static void *group_bytes(const store_source *src)
{
    void *buf = NULL;
    if (posix_memalign(&buf, OFFLOAD_ALIGN, src->bytes ? (size_t)src->bytes : OFFLOAD_ALIGN) != 0) abort();
    if (src->resident) {
        memcpy(buf, src->resident, (size_t)src->bytes);
        return buf;
    }
    uint64_t got = 0;
    while (got < src->bytes) {
        ssize_t r = pread(src->fd, (char *)buf + got, (size_t)(src->bytes - got), (off_t)(src->offset + got));
        if (r <= 0) {
            fprintf(stderr, "%s: read at %llu failed\n", src->path, (unsigned long long)(src->offset + got));
            free(buf);
            return NULL;
        }
        got += (uint64_t)r;
    }
    return buf;
}

/* Binds group g of s to its bytes and compares every tensor of the view
 * with the checkpoint. `view` entries are cleared first, so a tensor the
 * bind did not reach is seen as missing, not as the checkpoint itself. */
static void check_group(const model *m, const plan *p, store *s, tensor_entry *ve, int g, const char *od,
                        const char *what)
{
    const plan_group *pg = &p->groups[g];
    store_source src = store_group_source(s, g);
    CHECK_EQ_INT(src.tier, pg->tier);
    CHECK_EQ_U64(src.bytes, pg->bytes);
    uint64_t unit_sum = 0;
    for (int u = 0; u < N_LAYERS + 2; u++) unit_sum += group_has_unit(pg, u) ? m->units[u] : 0;
    CHECK_EQ_U64(pg->bytes, unit_sum);
    if (pg->bytes == 0) {
        CHECK(src.resident == NULL && src.fd < 0);
        return;
    }
    if (pg->tier == TIER_DISK) {
        CHECK(src.resident == NULL);
        CHECK(src.fd >= 0);
        CHECK(src.path && !strncmp(src.path, od, strlen(od)));
        struct stat sb;
        CHECK(fstat(src.fd, &sb) == 0 && (uint64_t)sb.st_size >= src.offset + src.bytes);
    } else {
        CHECK(src.resident != NULL);
        CHECK_EQ_INT(src.fd, -1);
    }
    void *buf = group_bytes(&src);
    if (!buf) {
        CHECK(!"the group's bytes can be read");
        return;
    }

    for (int i = 0; i < m->n; i++) ve[i].dst->data = NULL;
    store_bind(s, g, buf);
    uint64_t end = 0;
    int bound = 0, wrong = 0;
    for (int i = 0; i < m->n; i++) {
        const weight *w = ve[i].dst, *c = m->ck_entries[i].dst;
        bool mine = group_has_unit(pg, unit_of(m, &m->ck_entries[i]));
        if (!w->data) {
            if (mine) {
                fprintf(stderr, "%s: group %d: %s was not bound\n", what, g, ve[i].name);
                wrong++;
            }
            continue;
        }
        bound++;
        uint64_t off = (uint64_t)((const char *)w->data - (const char *)buf), n = entry_bytes(&m->ck_entries[i]);
        if (!mine || off % STORE_TENSOR_ALIGN || off + n > pg->bytes || w->dtype != c->dtype || w->rows != c->rows ||
            w->cols != c->cols || memcmp(w->data, c->data, (size_t)n) != 0) {
            fprintf(stderr, "%s: group %d: %s at offset %llu (%s) differs from the checkpoint\n", what, g, ve[i].name,
                    (unsigned long long)off, mine ? "its group" : "NOT its group");
            wrong++;
        }
        if (off + n > end) end = off + n;
        /* no other tensor of the group starts inside this one */
        for (int j = 0; j < m->n; j++) {
            const char *o = ve[j].dst->data;
            if (j != i && o && o >= (const char *)w->data && o < (const char *)w->data + n) {
                fprintf(stderr, "%s: group %d: %s overlaps %s\n", what, g, ve[j].name, ve[i].name);
                wrong++;
            }
        }
    }
    CHECK_EQ_INT(wrong, 0);
    CHECK(bound > 0);
    CHECK_EQ_U64((end + OFFLOAD_ALIGN - 1) / OFFLOAD_ALIGN * OFFLOAD_ALIGN, pg->bytes); /* the layout is the plan's size */
    free(buf);
}

/* Embedding rows from wherever the table lives equal the checkpoint's. */
static void check_embed_rows(const model *m, const plan *p, const store *s, const char *what)
{
    int eg = store_embed_group(s);
    CHECK(eg >= 0 && eg < p->n_groups);
    if (eg < 0 || eg >= p->n_groups) return;
    CHECK_EQ_INT(p->groups[eg].kind, m->cfg.tied ? GROUP_HEAD : GROUP_EMBED);
    size_t row = store_embed_row_bytes(s);
    CHECK_EQ_U64(row, (uint64_t)DIM * dtype_size(m->spec->dtype));
    static const int32_t tokens[] = {0, VOCAB - 1, 7, 7, 128, 1};
    int n = (int)(sizeof tokens / sizeof tokens[0]);
    char *dst = malloc((size_t)n * row);
    memset(dst, 0xee, (size_t)n * row);
    CHECK_STATUS(store_embed_rows(s, tokens, n, dst), FERRY_OK);
    int wrong = 0;
    for (int i = 0; i < n; i++)
        wrong += memcmp(dst + (size_t)i * row, (const char *)m->ckw.embed.data + (size_t)tokens[i] * row, row) != 0;
    if (wrong) fprintf(stderr, "%s: %d embedding rows differ (table in group %d, tier %s)\n", what, wrong, eg,
                       tier_name(p->groups[eg].tier));
    CHECK_EQ_INT(wrong, 0);
    free(dst);
}

static void test_placement(const model *m, int which, const char *root)
{
    const placement *pl = &k_placements[which];
    char what[160];
    snprintf(what, sizeof what, "%s (%s, %s): %s", m->spec->arch, m->spec->tied ? "tied" : "untied",
             m->spec->dtype_name, pl->name);
    plan p;
    ferry_status st = make_plan(m, which, &p);
    CHECK_STATUS(st, FERRY_OK);
    if (st != FERRY_OK) return;
    const char *want = m->cfg.tied ? pl->want_tied : pl->want_untied;
    CHECK_EQ_INT(p.n_groups, (int)strlen(want));
    if (p.n_groups != (int)strlen(want)) {
        plan_free(&p);
        return;
    }
    for (int g = 0; g < p.n_groups; g++) {
        if (want[g] == '-') {
            CHECK_EQ_U64(p.groups[g].bytes, 0);
            continue;
        }
        tier t = want[g] == 'D' ? TIER_DEVICE : want[g] == 'H' ? TIER_HOST : TIER_DISK;
        if (p.groups[g].tier != t)
            fprintf(stderr, "%s: plan put group %d on %s, the case needs %s\n", what, g, tier_name(p.groups[g].tier),
                    tier_name(t));
        CHECK_EQ_INT(p.groups[g].tier, t);
    }

    char name[32];
    snprintf(name, sizeof name, "offload-%d", which);
    char *od = util_path_join(root, name);
    model_weights view;
    CHECK_STATUS(model_weights_alloc(&m->cfg, &view), FERRY_OK);
    tensor_entry *ve = NULL;
    int nv = 0;
    CHECK_STATUS(model_tensor_entries(&m->cfg, &view, &ve, &nv), FERRY_OK);
    CHECK_EQ_INT(nv, m->n);

    /* twice: the second store reuses the blobs the first one wrote */
    for (int round = 0; round < 2 && nv == m->n; round++) {
        store *s = NULL;
        CHECK_STATUS(store_open(&s, m->be, &p, &m->cfg, &k_identity, (model_weights *)&m->ckw, &view, od, "test-store-fp"),
                     FERRY_OK);
        if (!s) break;
        for (int g = 0; g < p.n_groups; g++) check_group(m, &p, s, ve, g, od, what);
        check_embed_rows(m, &p, s, what);
        store_close(s);
    }
    free(ve);
    model_weights_free(&view);
    free(od);
    plan_free(&p);
}

/* Disk groups without an offload dir: refused, naming the option. */
static void test_no_offload_dir(const model *m)
{
    plan p;
    ferry_status st = make_plan(m, P_MIXED, &p);
    CHECK_STATUS(st, FERRY_OK);
    if (st != FERRY_OK) return;
    model_weights view;
    CHECK_STATUS(model_weights_alloc(&m->cfg, &view), FERRY_OK);
    store *s = (store *)&p; /* anything but NULL: a failed open must clear it */
    CHECK_STATUS(store_open(&s, m->be, &p, &m->cfg, &k_identity, (model_weights *)&m->ckw, &view, NULL, "fp"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--offload-dir");
    CHECK(s == NULL);
    /* nothing on disk: no directory needed */
    plan_free(&p);
    if ((st = make_plan(m, P_EMBED_HOST, &p)) == FERRY_OK) {
        CHECK_STATUS(store_open(&s, m->be, &p, &m->cfg, &k_identity, (model_weights *)&m->ckw, &view, NULL, "fp"), FERRY_OK);
        store_close(s);
        plan_free(&p);
    }
    CHECK_STATUS(st, FERRY_OK);
    model_weights_free(&view);
}

int main(void)
{
    char *root = make_dir();
    for (size_t k = 0; k < sizeof k_models / sizeof k_models[0]; k++) {
        model m;
        if (!model_open(&m, &k_models[k], root, (int)k)) {
            CHECK(!"the test model opens");
            model_close(&m);
            continue;
        }
        char sub[32];
        snprintf(sub, sizeof sub, "stores-%zu", k);
        char *dir = util_path_join(root, sub);
        mkdir(dir, 0700);
        test_unit_bytes(&m);
        for (int which = 0; which < P_COUNT; which++) test_placement(&m, which, dir);
        test_no_offload_dir(&m);
        free(dir);
        model_close(&m);
    }
    nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(root);
    return check_report();
}
