/*
 * test_experts.c - the expert slots and on-demand fetches (engine/experts.h)
 * on the cpu-split backend, whose device memory is apart from host memory
 * and whose copies land late (FERRY_SPLIT_DELAY_US).
 *
 * As test_pipeline does for groups: the compute callback reads the expert
 * it was given - a `convert` of each of its tensors into a device buffer of
 * its own, queued on the compute stream - and after every run the buffers
 * are downloaded and compared bit for bit with the CPU backend's conversion
 * of the checkpoint. A slot read before its copy landed (fresh device
 * memory is NaN), or refilled while its ops were pending, shows up as an
 * expert with wrong bytes. Each routed expert must be computed exactly once
 * per run.
 *
 * A Mixtral-shaped checkpoint from `ferry mkmodel --arch mixtral` (8
 * experts, top-2), experts on host, on disk, and split over all three
 * tiers; slots from the least (2 x top_k) to every expert; routed sets from
 * one expert to all of them, repeated and varied, so that hits, misses and
 * evictions all happen; copies landing at once and 300 us late, the compute
 * stream inline and on its own thread; and on the unified cpu backend,
 * whose disk reads land in the slots themselves. The stats must add up
 * (uses = device + hits + misses; bytes = (misses + speculative fetches) x
 * expert bytes), and with a slot for every
 * expert a set seen before is all hits. Faults: short reads change nothing;
 * an EIO fails exactly one run, naming the blob, the runs after it are
 * right; a byte changed in an expert blob fails the run that reads it with
 * a checksum mismatch, the group is reported damaged, and after a rebuild
 * the runs are right again. Every third run is preceded by a speculative
 * prefetch of its set and one expert it does not use (left in flight).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include "../../engine/backend.h"
#include "../../engine/experts.h"
#include "../../engine/plan.h"
#include "../../engine/store.h"
#include "../../engine/base/util.h"
#include "../../engine/base/fault.h"
#include "../../engine/weights/model.h"
#include "../../engine/weights/safetensors.h"
#include "check.h"
#include "ckpt_fx.h"


/* ---- the checkpoint and what compute must read from it ----------------------- */

/* ---- one run: backend, plan, store, experts ---------------------------------- */

typedef struct {
    const char *budgets;   /* --max-memory; NULL: everything on the device */
    uint64_t cache;        /* --expert-cache */
    const char *compute;   /* FERRY_SPLIT_COMPUTE */
    unsigned delay_us;     /* FERRY_SPLIT_DELAY_US */
    const char *device;    /* NULL: cpu-split; "cpu": unified, reads land in the slots */
} run_opts;

typedef struct {
    const model_fx *m;
    store_fx f;          /* backend, plan, view, store */
    experts *x;
    float **got;           /* [m->n] device buffers, one per tensor */
    void *poison;
    size_t poison_bytes;
    int layer;             /* of the running run */
    const int32_t *ids;
    int calls[MODEL_MAX_EXPERTS];
    char what[256];
} run_fx;

static size_t floats_of(const weight *w) { return (size_t)(w->rows * w->cols); }

static void compute_expert(void *ctx, int k)
{
    run_fx *r = ctx;
    int e = r->ids[k];
    r->calls[k]++;
    for (int i = 0; i < r->m->n; i++) {
        const tensor_entry *t = &r->f.view_ents[i];
        if (t->unit == UNIT_EXPERT && t->layer == r->layer && t->expert == e)
            r->f.be->ops->convert(r->f.be, r->got[i], t->dst);
    }
}

static bool run_open(run_fx *r, const model_fx *m, const run_opts *o, const char *od)
{
    memset(r, 0, sizeof *r);
    r->m = m;
    snprintf(r->what, sizeof r->what, "%s %s cache=%llu compute=%s delay=%uus", o->device ? o->device : "cpu-split",
             o->budgets ? o->budgets : "resident", (unsigned long long)o->cache, o->compute, o->delay_us);
    char delay[16];
    snprintf(delay, sizeof delay, "%u", o->delay_us);
    setenv("FERRY_SPLIT_DELAY_US", delay, 1);
    setenv("FERRY_SPLIT_COMPUTE", o->compute, 1);
    plan_opts po = {.group_size = 1, .prefetch = 1, .n_seqs = 1, .context = 64, .max_step_tokens = 4,
                    .expert_cache = o->cache};
    ferry_status st = fx_store_open(&r->f, m, o->device ? o->device : "cpu-split", po, o->budgets, od, "test-experts");
    if (st == FERRY_OK) st = experts_create(&r->x, r->f.be, r->f.s, &r->f.p);
    CHECK_STATUS(st, FERRY_OK);
    if (st != FERRY_OK || !r->x) {
        fprintf(stderr, "  (%s)\n", r->what);
        return false;
    }
    r->got = calloc((size_t)m->n, sizeof *r->got);
    for (int k = 0; k < m->n; k++) {
        size_t bytes = floats_of(m->ents[k].dst) * sizeof(float);
        r->got[k] = r->f.be->ops->alloc(r->f.be, bytes);
        if (bytes > r->poison_bytes) r->poison_bytes = bytes;
    }
    r->poison = malloc(r->poison_bytes);
    if (!r->poison) exit(2);
    memset(r->poison, 0xFF, r->poison_bytes);
    return true;
}

static void run_close(run_fx *r)
{
    experts_free(r->x); /* before the store and backend go */
    if (r->f.be)
        for (int k = 0; r->got && k < r->m->n; k++) r->f.be->ops->release(r->f.be, r->got[k]);
    fx_store_close(&r->f);
    free(r->got);
    free(r->poison);
}

/* One run of layer's experts ids[0..n); *right when each was computed once
 * and read exactly the checkpoint. */
static ferry_status run_layer(run_fx *r, int layer, const int32_t *ids, int n, bool *right)
{
    const model_fx *m = r->m;
    backend *be = r->f.be;
    for (int k = 0; k < m->n; k++)
        if (m->ents[k].unit == UNIT_EXPERT)
            be->ops->upload(be, r->got[k], r->poison, floats_of(m->ents[k].dst) * sizeof(float));
    memset(r->calls, 0, sizeof r->calls);
    r->layer = layer;
    r->ids = ids;
    ferry_status st = experts_run(r->x, layer, ids, n, compute_expert, r);
    *right = false;
    if (st != FERRY_OK) return st;
    bool once = true;
    for (int k = 0; k < n; k++) once &= r->calls[k] == 1;
    if (!once) CHECK_FAIL_("%s layer %d: an expert was not computed exactly once", r->what, layer);
    int bad = 0;
    float *host = malloc(r->poison_bytes);
    for (int k = 0; k < m->n; k++) {
        const tensor_entry *t = &m->ents[k];
        if (t->unit != UNIT_EXPERT || t->layer != layer) continue;
        bool routed = false;
        for (int i = 0; i < n; i++) routed |= ids[i] == t->expert;
        if (!routed) continue;
        size_t bytes = floats_of(t->dst) * sizeof(float);
        be->ops->download(be, host, r->got[k], bytes);
        if (memcmp(host, m->want[k], bytes) != 0 && bad++ == 0)
            CHECK_FAIL_("%s layer %d: compute read wrong bytes of %s", r->what, layer, t->name);
    }
    free(host);
    check_count++;
    *right = once && bad == 0;
    return FERRY_OK;
}

/* Routed sets: varied sizes, from one expert to all, some repeated. */
static int routed_set(int step, int n_experts, int32_t *ids)
{
    uint64_t h = (uint64_t)step * 0x9E3779B97F4A7C15ull + 12345;
    int n = 0;
    if (step % 5 == 4) { /* every expert */
        for (int e = 0; e < n_experts; e++) ids[n++] = (int32_t)((e + step) % n_experts);
        return n;
    }
    int want = 1 + (int)((h >> 7) % 3);
    for (int tries = 0; n < want && tries < 64; tries++) {
        h = h * 6364136223846793005ull + 1442695040888963407ull;
        int32_t e = (int32_t)((h >> 33) % (uint64_t)n_experts);
        bool dup = false;
        for (int i = 0; i < n; i++) dup |= ids[i] == e;
        if (!dup) ids[n++] = e;
    }
    return n;
}

static uint64_t expert_bytes(const run_fx *r)
{
    return r->f.p.groups[r->f.p.first_expert].bytes;
}

#define RUNS 24

static void check_stats(run_fx *r, uint64_t runs, uint64_t uses, uint64_t off_device_uses)
{
    expert_stats s = experts_get_stats(r->x);
    CHECK_EQ_U64(s.layer_runs, runs);
    CHECK_EQ_U64(s.uses, uses);
    CHECK_EQ_U64(s.device_uses + s.hits + s.misses, uses);
    CHECK_EQ_U64(s.hits + s.misses, off_device_uses);
    CHECK_EQ_U64(s.bytes[TIER_HOST] + s.bytes[TIER_DISK], (s.misses + s.prefetched) * expert_bytes(r));
    CHECK(s.prefetch_hits <= s.prefetched && s.prefetch_hits <= s.hits);
}

/* Budgets for: experts on host, experts on disk, the three tiers mixed. */
static void placements(const model_fx *m, const char *root, char specs[3][96])
{
    run_fx r;
    run_opts o = {NULL, 0, "inline", 0, NULL};
    uint64_t dense = 0, expert = 0;
    if (run_open(&r, m, &o, NULL)) {
        for (int g = 0; g < r.f.p.n_groups; g++)
            if (r.f.p.groups[g].kind == GROUP_EXPERT) expert = r.f.p.groups[g].bytes;
            else if (r.f.p.groups[g].kind != GROUP_EMBED) dense += r.f.p.groups[g].bytes;
    }
    run_close(&r);
    (void)root;
    snprintf(specs[0], 96, "device=%llu", (unsigned long long)dense);
    snprintf(specs[1], 96, "device=%llu,host=0", (unsigned long long)dense);
    snprintf(specs[2], 96, "device=%llu,host=%llu", (unsigned long long)(dense + 3 * expert),
             (unsigned long long)(5 * expert));
}

static void test_placements(const model_fx *m, const char *root)
{
    char specs[3][96];
    placements(m, root, specs);
    int E = m->cfg.n_experts;
    for (int pl = 0; pl < 3; pl++)
        for (int cache = 0; cache < 3; cache++)
            for (int mode = 0; mode < 3; mode++) { /* cpu-split inline, on a thread with late copies; cpu */
                char od[PATH_MAX];
                snprintf(od, sizeof od, "%s/od-%d", root, pl);
                run_opts o = {specs[pl], 0, mode == 1 ? "thread" : "inline", mode == 1 ? 300u : 0u,
                              mode == 2 ? "cpu" : NULL};
                run_fx r;
                if (!run_open(&r, m, &o, od)) {
                    run_close(&r);
                    continue;
                }
                uint64_t eb = expert_bytes(&r);
                run_close(&r);
                o.cache = cache == 0 ? 0 : cache == 1 ? 5 * eb : (uint64_t)(E * m->n_moe) * eb;
                if (!run_open(&r, m, &o, od)) {
                    run_close(&r);
                    continue;
                }
                if (cache == 0) CHECK_EQ_INT(r.f.p.n_expert_slots, 2 * m->cfg.top_k);
                uint64_t uses = 0, off = 0;
                for (int run = 0; run < RUNS; run++) {
                    int32_t ids[MODEL_MAX_EXPERTS];
                    int n = routed_set(run, E, ids), layer = m->moe_layers[run % m->n_moe];
                    bool right;
                    if (run % 3 == 1) { /* speculation: the set and one expert it will not use, fetched ahead */
                        int32_t guess[MODEL_MAX_EXPERTS + 1];
                        memcpy(guess, ids, (size_t)n * sizeof *ids);
                        int g = n;
                        for (int32_t e = 0; e < E && g == n; e++) {
                            bool in = false;
                            for (int k = 0; k < n; k++) in |= ids[k] == e;
                            if (!in) guess[g++] = e;
                        }
                        experts_prefetch(r.x, layer, guess, g);
                    }
                    CHECK_STATUS(run_layer(&r, layer, ids, n, &right), FERRY_OK);
                    CHECK(right);
                    uses += (uint64_t)n;
                    for (int k = 0; k < n; k++) {
                        int g = r.f.p.first_expert + (run % m->n_moe) * E + ids[k];
                        off += r.f.p.groups[g].tier != TIER_DEVICE;
                    }
                }
                check_stats(&r, RUNS, uses, off);
                if (cache == 2) { /* a slot for every expert: what was seen is a hit */
                    expert_stats before = experts_get_stats(r.x);
                    int32_t all[MODEL_MAX_EXPERTS];
                    for (int e = 0; e < E; e++) all[e] = (int32_t)e;
                    bool right;
                    for (int i = 0; i < m->n_moe; i++) CHECK_STATUS(run_layer(&r, m->moe_layers[i], all, E, &right), FERRY_OK);
                    expert_stats after = experts_get_stats(r.x);
                    CHECK_EQ_U64(after.misses - before.misses, 0); /* every set of 5 contained them all */
                }
                run_close(&r);
            }
}

/* ---- faults ------------------------------------------------------------------- */

static void test_faults(const model_fx *m, const char *root)
{
    char specs[3][96], od[PATH_MAX];
    placements(m, root, specs);
    snprintf(od, sizeof od, "%s/od-faults", root);
    run_opts o = {specs[1], 0, "thread", 300, NULL};
    int32_t two[2] = {1, 6}, three[3] = {0, 3, 5};

    setenv("FERRY_FAULT", "read_short=1", 1); /* every completion short: resubmitted */
    fault_reset();
    run_fx r;
    bool right;
    if (run_open(&r, m, &o, od)) {
        for (int run = 0; run < 4; run++) {
            CHECK_STATUS(run_layer(&r, m->moe_layers[run % m->n_moe], run % 2 ? two : three, run % 2 ? 2 : 3, &right),
                         FERRY_OK);
            CHECK(right);
        }
    }
    run_close(&r);

    /* EIO on the 4th completion (the second run's): that run fails naming the blob */
    if (run_open(&r, m, &o, od)) {
        setenv("FERRY_FAULT", "read_eio=4", 1);
        fault_reset();
        int failed = 0;
        for (int run = 0; run < 4; run++) {
            ferry_status st = run_layer(&r, m->moe_layers[0], run % 2 ? two : three, run % 2 ? 2 : 3, &right);
            if (st == FERRY_OK) {
                CHECK(right);
                continue;
            }
            failed++;
            CHECK_EQ_INT(run, 1);
            CHECK_EQ_INT(st, FERRY_ERR_IO);
            CHECK_MSG_HAS("Input/output error");
            CHECK_MSG_HAS("experts-");
        }
        CHECK_EQ_INT(failed, 1);
    }
    run_close(&r);
    unsetenv("FERRY_FAULT");
    fault_reset();

    /* a byte changed in an expert's region: checksum mismatch, damaged, rebuilt */
    if (run_open(&r, m, &o, od)) {
        int g = r.f.p.first_expert + 3; /* layer moe_layers[0], expert 3 */
        store_source src = store_group_source(r.f.s, g);
        int fd = open(src.path, O_WRONLY);
        char junk[64];
        memset(junk, 0x5A, sizeof junk);
        CHECK(fd >= 0 && pwrite(fd, junk, sizeof junk, (off_t)(src.offset + src.bytes / 2)) == (ssize_t)sizeof junk);
        if (fd >= 0) close(fd);
        CHECK_EQ_INT(run_layer(&r, m->moe_layers[0], three, 3, &right), FERRY_ERR_IO);
        CHECK_MSG_HAS("checksum mismatch");
        CHECK_MSG_HAS(src.path);
        bool damaged[r.f.p.n_groups];
        memset(damaged, 0, sizeof damaged);
        CHECK_EQ_INT(experts_damaged(r.x, damaged), 1);
        CHECK(damaged[g]);
        CHECK_STATUS(store_rebuild_group(r.f.s, g), FERRY_OK);
        experts_clear_damaged(r.x, g);
        for (int run = 0; run < 3; run++) {
            CHECK_STATUS(run_layer(&r, m->moe_layers[0], run % 2 ? two : three, run % 2 ? 2 : 3, &right), FERRY_OK);
            CHECK(right);
        }
        memset(damaged, 0, sizeof damaged);
        CHECK_EQ_INT(experts_damaged(r.x, damaged), 0);
    }
    run_close(&r);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

int main(void)
{
    char root[] = "/tmp/ferry-test-experts-XXXXXX";
    if (!mkdtemp(root)) return 2;
    model_fx m;
    model_open(&m, "test_experts", root, "mixtral", "--arch mixtral --preset tiny --dtype bf16 --layers 3");
    CHECK(m.cfg.n_experts == 8 && m.cfg.top_k == 2 && m.n_moe == m.cfg.n_layers);
    test_placements(&m, root);
    test_faults(&m, root);
    model_close(&m);
    nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return check_report();
}
