/*
 * test_pipeline.c - the pipeline's slot protocol (engine/pipeline.h) on the
 * cpu-split backend, whose device memory is apart from host memory and whose
 * copies land late (FERRY_SPLIT_DELAY_US).
 *
 * The units here compute nothing of a model: each reads the weights its
 * group bound, as compute would - a `convert` of every tensor into a device
 * buffer of its own, queued on the compute stream - and after the step the
 * buffers are downloaded and compared bit for bit with the CPU backend's
 * conversion of the checkpoint (what an all-resident run reads). A slot
 * read before its copy landed (fresh device memory is NaN), or overwritten
 * while its ops were pending, shows up as a named tensor with wrong bytes.
 * Units must also come in execution order, once per step.
 *
 * Two checkpoints from `ferry mkmodel` (llama untied f32, 5 layers; qwen2
 * tied bf16, 4 layers: the table in the head group) under every placement
 * (host, disk, mixed, only the embedding off the device), group sizes 1 and
 * 2, prefetch 1 and 2, the compute stream inline and on its own thread,
 * copies landing at once and 300 us late. Then faults (engine/base/fault.h):
 * read_short on every completion changes nothing; read_eio fails exactly
 * one step with FERRY_ERR_IO and a message naming the blob, whole, and the
 * steps after it are right. The stats count steps and streamed bytes. Last,
 * the backend itself: fresh memory is poison, event_sync and compute-stream
 * waits last as long as the copy they wait for.
 *
 * Built against a mutant pipeline (make test-mutants) this test must fail.
 */
#define _GNU_SOURCE
#include <ftw.h>
#include <limits.h>
#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>

#include "../../engine/backend.h"
#include "../../engine/pipeline.h"
#include "../../engine/plan.h"
#include "../../engine/store.h"
#include "../../engine/base/util.h"
#include "../../engine/base/fault.h"
#include "../../engine/weights/model.h"
#include "../../engine/weights/safetensors.h"
#include "check.h"
#include "ckpt_fx.h"


#define STEPS 4
#define MAX_VISITS 64
#define HEAD_VISIT 1000
#define EMBED_VISIT -1

static const int32_t k_tokens[] = {0, 255, 7, 7, 123}; /* the first and last rows of the table (vocab 256) */
#define N_TOKENS ((int)(sizeof k_tokens / sizeof k_tokens[0]))

/* ---- the checkpoint and what compute must read from it ----------------------- */

/* ---- one run: backend, plan, store, pipeline, and the units ------------------ */

typedef struct {
    int group_size, prefetch;
    const char *budgets; /* "device=..,host=.." as --max-memory; NULL: everything on the device */
    const char *compute; /* FERRY_SPLIT_COMPUTE */
    unsigned delay_us;   /* FERRY_SPLIT_DELAY_US */
} run_opts;

typedef struct {
    const model_fx *m;
    store_fx f;          /* backend, plan, view, store */
    pipeline *pl;
    float **got;        /* [m->n] device buffers, one per tensor */
    void *rows_host, *rows_dev;
    float *rows_got;    /* [N_TOKENS, dim] device */
    void *poison;       /* host, 0xFF: the largest buffer's size */
    size_t poison_bytes;
    int visits[MAX_VISITS], n_visits;
    char what[256];
} run_fx;

static size_t floats_of(const weight *w) { return (size_t)(w->rows * w->cols); }

/* Queues a convert of every tensor of the given unit (layer: only that layer). */
static void read_unit(run_fx *r, unit_kind kind, int layer)
{
    for (int k = 0; k < r->m->n; k++) {
        const tensor_entry *e = &r->f.view_ents[k];
        if (e->unit == kind && (kind != UNIT_LAYER || e->layer == layer))
            r->f.be->ops->convert(r->f.be, r->got[k], e->dst);
    }
}

static void visit(run_fx *r, int v)
{
    if (r->n_visits < MAX_VISITS) r->visits[r->n_visits] = v;
    r->n_visits++;
}

static void unit_embed(void *ctx)
{
    run_fx *r = ctx;
    visit(r, EMBED_VISIT);
    read_unit(r, UNIT_EMBED, 0);
}

/* As the engine does it: rows gathered on the host, uploaded, widened. */
static ferry_status unit_embed_rows(void *ctx)
{
    run_fx *r = ctx;
    visit(r, EMBED_VISIT);
    FERRY_TRY(store_embed_rows(r->f.s, k_tokens, N_TOKENS, r->rows_host));
    r->f.be->ops->upload(r->f.be, r->rows_dev, r->rows_host, (size_t)N_TOKENS * store_embed_row_bytes(r->f.s));
    weight rows = {.dtype = r->m->w.embed.dtype, .rows = N_TOKENS, .cols = r->m->cfg.dim, .data = r->rows_dev};
    r->f.be->ops->convert(r->f.be, r->rows_got, &rows);
    return FERRY_OK;
}

static ferry_status unit_layer(void *ctx, int layer)
{
    run_fx *r = ctx;
    visit(r, layer);
    read_unit(r, UNIT_LAYER, layer);
    return FERRY_OK;
}

static void unit_head(void *ctx)
{
    run_fx *r = ctx;
    visit(r, HEAD_VISIT);
    read_unit(r, UNIT_HEAD, 0);
    if (r->m->cfg.tied) read_unit(r, UNIT_EMBED, 0); /* the table is the head group's */
}

static bool run_open(run_fx *r, const model_fx *m, const run_opts *o, const char *od)
{
    memset(r, 0, sizeof *r);
    r->m = m;
    snprintf(r->what, sizeof r->what, "%s %s group=%d prefetch=%d compute=%s delay=%uus", m->label,
             o->budgets ? o->budgets : "resident", o->group_size, o->prefetch, o->compute, o->delay_us);
    char delay[16];
    snprintf(delay, sizeof delay, "%u", o->delay_us);
    setenv("FERRY_SPLIT_DELAY_US", delay, 1);
    setenv("FERRY_SPLIT_COMPUTE", o->compute, 1);
    plan_opts po = {.group_size = o->group_size, .prefetch = o->prefetch, .n_seqs = 1, .context = 64,
                    .max_step_tokens = N_TOKENS};
    const model_config *c = &m->cfg;
    ferry_status st = fx_store_open(&r->f, m, "cpu-split", po, o->budgets, od, "test-pipeline");
    if (st == FERRY_OK) st = pipeline_create(&r->pl, r->f.be, r->f.s, &r->f.p);
    CHECK_STATUS(st, FERRY_OK);
    if (st != FERRY_OK) {
        fprintf(stderr, "  (%s)\n", r->what);
        return false;
    }
    r->got = calloc((size_t)m->n, sizeof *r->got);
    for (int k = 0; k < m->n; k++) {
        size_t bytes = floats_of(m->ents[k].dst) * sizeof(float);
        r->got[k] = r->f.be->ops->alloc(r->f.be, bytes);
        if (bytes > r->poison_bytes) r->poison_bytes = bytes;
    }
    size_t row = store_embed_row_bytes(r->f.s);
    bool pinned;
    r->rows_host = r->f.be->ops->host_alloc(r->f.be, N_TOKENS * row, &pinned);
    r->rows_dev = r->f.be->ops->alloc(r->f.be, N_TOKENS * row);
    r->rows_got = r->f.be->ops->alloc(r->f.be, (size_t)N_TOKENS * (size_t)c->dim * sizeof(float));
    r->poison = malloc(r->poison_bytes);
    if (!r->poison) exit(2);
    memset(r->poison, 0xFF, r->poison_bytes);
    return true;
}

static void run_close(run_fx *r)
{
    pipeline_free(r->pl); /* before the slots' store and backend go */
    if (r->f.be) {
        for (int k = 0; r->got && k < r->m->n; k++) r->f.be->ops->release(r->f.be, r->got[k]);
        if (r->rows_host) r->f.be->ops->host_free(r->f.be, r->rows_host, 0, true);
        r->f.be->ops->release(r->f.be, r->rows_dev);
        r->f.be->ops->release(r->f.be, r->rows_got);
    }
    fx_store_close(&r->f);
    free(r->got);
    free(r->poison);
}

/* One step; true when it succeeded and compute read exactly the checkpoint. */
static ferry_status run_step(run_fx *r, int step, bool *right)
{
    const model_fx *m = r->m;
    backend *be = r->f.be;
    for (int k = 0; k < m->n; k++)
        be->ops->upload(be, r->got[k], r->poison, floats_of(m->ents[k].dst) * sizeof(float));
    be->ops->upload(be, r->rows_got, r->poison, (size_t)N_TOKENS * (size_t)m->cfg.dim * sizeof(float));
    r->n_visits = 0;
    pipeline_units u = {unit_embed, unit_embed_rows, unit_layer, unit_head, r};
    ferry_status st = pipeline_step(r->pl, &u);
    *right = false;
    if (st != FERRY_OK) return st;

    /* execution order: the embedding, every layer, the head */
    bool order = r->n_visits == m->cfg.n_layers + 2 && r->visits[0] == EMBED_VISIT &&
                 r->visits[r->n_visits - 1] == HEAD_VISIT;
    for (int l = 0; order && l < m->cfg.n_layers; l++) order = r->visits[1 + l] == l;
    if (!order) CHECK_FAIL_("%s step %d: units visited out of order (%d visits)", r->what, step, r->n_visits);

    int bad = 0;
    size_t cap = r->poison_bytes;
    float *host = malloc(cap);
    bool rows = r->f.p.groups[store_embed_group(r->f.s)].tier != TIER_DEVICE;
    for (int k = 0; k < m->n; k++) {
        size_t bytes = floats_of(m->ents[k].dst) * sizeof(float);
        if (rows && m->ents[k].unit == UNIT_EMBED && !m->cfg.tied) continue; /* read by rows, below */
        be->ops->download(be, host, r->got[k], bytes);
        if (memcmp(host, m->want[k], bytes) != 0 && bad++ == 0)
            CHECK_FAIL_("%s step %d: compute read wrong bytes of %s", r->what, step, m->ents[k].name);
    }
    if (rows) {
        size_t dim = (size_t)m->cfg.dim, ek = 0;
        for (int k = 0; k < m->n; k++)
            if (m->ents[k].unit == UNIT_EMBED) ek = (size_t)k;
        be->ops->download(be, host, r->rows_got, (size_t)N_TOKENS * dim * sizeof(float));
        for (int i = 0; i < N_TOKENS; i++)
            if (memcmp(host + (size_t)i * dim, m->want[ek] + (size_t)k_tokens[i] * dim, dim * sizeof(float)) != 0 &&
                bad++ == 0)
                CHECK_FAIL_("%s step %d: embedding row of token %d is wrong", r->what, step, k_tokens[i]);
    }
    free(host);
    check_count++;
    *right = order && bad == 0;
    return FERRY_OK;
}

/* ---- every placement: compute reads the checkpoint -------------------------- */

/* --max-memory specs for the placements, from the group sizes of the all-
 * device plan of group size g. */
static void placements(const model_fx *m, int g, char specs[4][96])
{
    plan p;
    plan_opts po = {.budget = {PLAN_UNLIMITED, PLAN_UNLIMITED}, .group_size = g, .prefetch = 1, .n_seqs = 1,
                    .context = 64, .max_step_tokens = N_TOKENS, .unified = true};
    plan_model pm = fx_plan_model(m);
    if (plan_make(&pm, m->units, &po, &p) != FERRY_OK) exit(2);
    uint64_t rest = 0; /* every group but the embedding */
    for (int i = 0; i < p.n_groups; i++)
        if (p.groups[i].kind != GROUP_EMBED) rest += p.groups[i].bytes;
    snprintf(specs[0], 96, "device=0");
    snprintf(specs[1], 96, "device=0,host=0");
    /* the first layer group on the device, the second on host, the rest on disk */
    snprintf(specs[2], 96, "device=%llu,host=%llu", (unsigned long long)p.groups[1].bytes,
             (unsigned long long)p.groups[2].bytes);
    /* everything but the embedding on the device; it goes to disk (untied) */
    snprintf(specs[3], 96, "device=%llu,host=0", (unsigned long long)rest);
    plan_free(&p);
}

static void test_placements(const model_fx *m, const char *root)
{
    static const run_opts modes[] = {
        {.compute = "inline", .delay_us = 0},
        {.compute = "inline", .delay_us = 300},
        {.compute = "thread", .delay_us = 0},
        {.compute = "thread", .delay_us = 300},
    };
    int runs = 0;
    for (int g = 1; g <= 2; g++) {
        char specs[4][96];
        placements(m, g, specs);
        for (int pi = 0; pi < 4; pi++)
            for (int pf = 1; pf <= 2; pf++)
                for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++) {
                    run_opts o = modes[mi];
                    o.group_size = g;
                    o.prefetch = pf;
                    o.budgets = specs[pi];
                    char od[PATH_MAX];
                    snprintf(od, sizeof od, "%s/od-%s-g%d", root, m->label, g);
                    run_fx r;
                    if (run_open(&r, m, &o, od)) {
                        for (int step = 0; step < STEPS + 2; step++) {
                            /* P9: quiet between steps, the fetcher starts again where compute is */
                            if (step == STEPS) pipeline_quiesce(r.pl);
                            bool right;
                            CHECK_STATUS(run_step(&r, step, &right), FERRY_OK);
                            if (!right) break; /* one message per run */
                        }
                        runs++;
                    }
                    run_close(&r);
                }
    }
    CHECK_EQ_INT(runs, 2 * 4 * 2 * 4);
}

/* ---- faults and stats -------------------------------------------------------- */

static uint64_t streamed_bytes(const plan *p, tier t)
{
    uint64_t n = 0;
    for (int g = 0; g < p->n_groups; g++)
        if (p->groups[g].kind != GROUP_EMBED && p->groups[g].tier == t) n += p->groups[g].bytes;
    return n;
}

/* The stats count every step and every streamed byte that arrived (the
 * fetcher runs at most n_slots fetches ahead; `failed` fetches bring none). */
static void check_stats(run_fx *r, uint64_t steps, int failed)
{
    pipeline_stats s = pipeline_get_stats(r->pl);
    CHECK_EQ_U64(s.steps, steps);
    for (tier t = TIER_HOST; t <= TIER_DISK; t++) {
        uint64_t per_step = streamed_bytes(&r->f.p, t), ahead = (uint64_t)r->f.p.n_stage_slots * r->f.p.slot_bytes;
        uint64_t lost = t == TIER_DISK ? (uint64_t)failed * r->f.p.slot_bytes : 0;
        CHECK(s.bytes[t] + lost >= steps * per_step && s.bytes[t] <= steps * per_step + ahead);
    }
    CHECK_EQ_U64(s.bytes[TIER_DEVICE], 0);
    CHECK(s.wall_s > 0 && s.compute_s > 0 && s.fetch_s > 0);
}

static void test_faults(const model_fx *m, const char *root)
{
    /* a long offload dir: the message must carry all of its path */
    char od[PATH_MAX];
    snprintf(od, sizeof od, "%s/od-faults-%s-%s", root, m->label,
             "a-directory-name-long-enough-that-a-message-naming-a-blob-in-it-runs-past-one-hundred-"
             "and-twenty-characters");
    run_opts o = {.group_size = 1, .prefetch = 2, .budgets = "device=0,host=0", .compute = "thread",
                  .delay_us = 300};

    /* every completion short: resubmitted, nothing changes */
    setenv("FERRY_FAULT", "read_short=1", 1);
    fault_reset();
    run_fx r;
    if (run_open(&r, m, &o, od)) {
        for (int step = 0; step < STEPS; step++) {
            bool right;
            CHECK_STATUS(run_step(&r, step, &right), FERRY_OK);
            CHECK(right);
        }
        check_stats(&r, STEPS, 0);
    }
    run_close(&r);

    /* EIO on the (n_streamed + 2)th completion, a read of the second step:
     * that step fails naming the blob, every other step is right */
    o.compute = "inline";
    for (int pass = 0; pass < 2; pass++, o.compute = "thread") {
        if (!run_open(&r, m, &o, od)) {
            run_close(&r);
            continue;
        }
        char fault[32];
        snprintf(fault, sizeof fault, "read_eio=%d", r.f.p.n_streamed + 2);
        setenv("FERRY_FAULT", fault, 1);
        fault_reset();
        int failed = 0, failed_step = -1;
        for (int step = 0; step < STEPS; step++) {
            bool right;
            ferry_status st = run_step(&r, step, &right);
            if (st == FERRY_OK) {
                CHECK(right);
                continue;
            }
            failed++;
            failed_step = step;
            CHECK_EQ_INT(st, FERRY_ERR_IO);
            CHECK_MSG_HAS("Input/output error");
            bool names_blob = false;
            for (int g = 0; g < r.f.p.n_groups; g++) {
                store_source src = store_group_source(r.f.s, g);
                if (src.tier == TIER_DISK && src.path && strstr(ferry_errmsg(), src.path)) names_blob = true;
            }
            check_count++;
            if (!names_blob) CHECK_FAIL_("%s: the EIO message names no blob: \"%s\"", r.what, ferry_errmsg());
        }
        CHECK_EQ_INT(failed, 1);
        CHECK_EQ_INT(failed_step, 1);
        check_stats(&r, STEPS, failed);
        run_close(&r);
    }
    unsetenv("FERRY_FAULT");
    fault_reset();
}

/* A blob damaged under a running pipeline: the step that reads it fails
 * naming it (checksum), the group is reported damaged, and after a quiet
 * rebuild from the checkpoint the next steps read the checkpoint again. */
static void test_repair(const model_fx *m, const char *root)
{
    char od[PATH_MAX];
    snprintf(od, sizeof od, "%s/od-repair-%s", root, m->label);
    run_opts o = {.group_size = 1, .prefetch = 2, .budgets = "device=0,host=0", .compute = "thread", .delay_us = 0};
    run_fx r;
    if (!run_open(&r, m, &o, od)) {
        run_close(&r);
        return;
    }
    bool right;
    CHECK_STATUS(run_step(&r, 0, &right), FERRY_OK);
    CHECK(right);
    int g = 0;
    while (g < r.f.p.n_groups && !(r.f.p.groups[g].kind == GROUP_LAYERS && r.f.p.groups[g].tier == TIER_DISK)) g++;
    store_source src = store_group_source(r.f.s, g);
    int fd = open(src.path, O_WRONLY);
    char junk[512];
    memset(junk, 0x5A, sizeof junk);
    CHECK(fd >= 0 && pwrite(fd, junk, sizeof junk, (off_t)(src.bytes / 2)) == (ssize_t)sizeof junk);
    if (fd >= 0) close(fd);
    /* the fetcher ran ahead: the damaged bytes are read in this step or the next */
    ferry_status st = FERRY_OK;
    for (int step = 1; step <= 2 && st == FERRY_OK; step++) st = run_step(&r, step, &right);
    CHECK_EQ_INT(st, FERRY_ERR_IO);
    CHECK_MSG_HAS("checksum mismatch");
    CHECK_MSG_HAS(src.path);
    bool damaged[r.f.p.n_groups];
    pipeline_quiesce(r.pl);
    CHECK_EQ_INT(pipeline_damaged(r.pl, damaged), 1);
    CHECK(damaged[g]);
    CHECK_STATUS(store_rebuild_group(r.f.s, g), FERRY_OK);
    pipeline_clear_damaged(r.pl, g);
    for (int step = 3; step < 5; step++) {
        CHECK_STATUS(run_step(&r, step, &right), FERRY_OK);
        CHECK(right);
    }
    CHECK_EQ_INT(pipeline_damaged(r.pl, damaged), 0);
    run_close(&r);
}

/* ---- the backend's own model --------------------------------------------------- */

static double seconds_since(double t0) { return util_now() - t0; }

static void test_backend(void)
{
    setenv("FERRY_SPLIT_DELAY_US", "100000", 1); /* 0.1 s: longer than any scheduling hiccup */
    setenv("FERRY_SPLIT_COMPUTE", "inline", 1);
    backend *be;
    CHECK_STATUS(backend_create("cpu-split", &(backend_opts){.threads = 1}, &be), FERRY_OK);
    if (!be) return;
    CHECK(!be->ops->unified);
    enum { N = 4096 };
    uint8_t *dev = be->ops->alloc(be, N), *back = malloc(N);
    bool pinned;
    uint8_t *src = be->ops->host_alloc(be, N, &pinned);
    be_event *ev = be->ops->event_create(be), *never = be->ops->event_create(be);

    /* fresh device memory is NaN bytes */
    be->ops->download(be, back, dev, N);
    bool poison = true;
    for (int i = 0; i < N; i++) poison = poison && back[i] == 0xFF;
    CHECK(poison);

    /* an event never recorded is complete; a copy lands late and event_sync
     * waits for it. download reads other memory than the copy writes:
     * reading the copy's destination meanwhile is a data race (ThreadSanitizer
     * said so). That download does not wait for the copy stream is a matter
     * of speed, not of results, and tests do not time (bench measures the
     * overlap); what is checked is that it reads what it was given. */
    for (int i = 0; i < N; i++) src[i] = (uint8_t)i;
    uint8_t *other = be->ops->alloc(be, N);
    double t0 = util_now();
    be->ops->event_sync(be, never);
    be->ops->stream_wait(be, STREAM_COMPUTE, never);
    be->ops->copy_async(be, dev, src, N);
    be->ops->event_record(be, ev, STREAM_COPY);
    be->ops->download(be, back, other, N);
    CHECK(back[1] == 0xFF); /* other's poison */
    be->ops->event_sync(be, ev);
    CHECK(seconds_since(t0) >= 0.099);
    be->ops->download(be, back, dev, N);
    CHECK(memcmp(back, src, N) == 0);

    /* on the inline compute stream a wait for a copy blocks the caller */
    memset(src, 0x5A, N);
    t0 = util_now();
    be->ops->copy_async(be, dev, src, N);
    be->ops->event_record(be, ev, STREAM_COPY);
    be->ops->stream_wait(be, STREAM_COMPUTE, ev);
    CHECK(seconds_since(t0) >= 0.099);
    be->ops->download(be, back, dev, N);
    CHECK(back[0] == 0x5A && back[N - 1] == 0x5A);

    be->ops->event_destroy(be, ev);
    be->ops->event_destroy(be, never);
    be->ops->host_free(be, src, N, pinned);
    be->ops->release(be, dev);
    be->ops->release(be, other);
    backend_free(be);
    free(back);

    setenv("FERRY_SPLIT_DELAY_US", "-5", 1);
    CHECK_STATUS(backend_create("cpu-split", NULL, &be), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("FERRY_SPLIT_DELAY_US");
    setenv("FERRY_SPLIT_DELAY_US", "0", 1);
    setenv("FERRY_SPLIT_COMPUTE", "gpu", 1);
    CHECK_STATUS(backend_create("cpu-split", NULL, &be), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("FERRY_SPLIT_COMPUTE");
}

/* ---- main ---------------------------------------------------------------------- */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

int main(void)
{
    char root[] = "/tmp/ferry-test-pipeline-XXXXXX";
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 2;
    }
    unsetenv("FERRY_FAULT");
    fault_reset();
    test_backend();
    model_fx models[2];
    model_open(&models[0], "test_pipeline", root, "llama-f32", "--arch llama --preset tiny --layers 5 --tied false --seed 11");
    model_open(&models[1], "test_pipeline", root, "qwen2-bf16-tied",
               "--arch qwen2 --preset tiny --layers 4 --dtype bf16 --tied true --seed 12");
    for (int i = 0; i < 2; i++) {
        test_placements(&models[i], root);
        test_faults(&models[i], root);
        test_repair(&models[i], root);
        model_close(&models[i]);
    }
    nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return check_report();
}
