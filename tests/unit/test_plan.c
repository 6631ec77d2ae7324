/*
 * test_plan.c - the placement planner (engine/plan.h) on synthetic unit
 * sizes: grouping (group_size 1, 3, larger than the model, a shorter last
 * group), first-fit placement device -> host -> disk in execution order with
 * the embedding last, budgets respected exactly at the boundary, the working
 * memory (staging slots, slot bytes, KV cache), plan_parse_budgets, and
 * plan_check's failures (host memory, and device memory when not unified),
 * and a mixture of experts' expert groups and slots.
 */
#include <stdlib.h>

#include "../../engine/plan.h"
#include "check.h"

#define K4 4096ull
#define UNL PLAN_UNLIMITED

static plan_model model_of(int n_layers)
{
    plan_model m = {.n_layers = n_layers, .dim = 64, .hidden = 176, .vocab = 256, .q_dim = 64, .kv_dim = 32, .max_pos = 1 << 24};
    return m;
}

static plan_opts opts_of(uint64_t dev, uint64_t host, int group_size, int prefetch)
{
    plan_opts o = {.budget = {dev, host},
                   .group_size = group_size,
                   .prefetch = prefetch,
                   .n_seqs = 1,
                   .context = 64,
                   .max_step_tokens = 16,
                   .unified = true};
    return o;
}

/* Invariants every plan must satisfy, whatever the inputs. */
static void check_invariants(const plan *p, const plan_model *m, const uint64_t *units, const plan_opts *o)
{
    if (m->n_experts) return; /* test_experts checks those */
    int n_layer_groups = (m->n_layers + o->group_size - 1) / o->group_size;
    CHECK_EQ_INT(p->n_groups, n_layer_groups + 2);
    if (p->n_groups != n_layer_groups + 2) return;
    CHECK_EQ_INT(p->groups[0].kind, GROUP_EMBED);
    CHECK_EQ_U64(p->groups[0].bytes, units[0]);
    CHECK_EQ_INT(p->groups[p->n_groups - 1].kind, GROUP_HEAD);
    CHECK_EQ_U64(p->groups[p->n_groups - 1].bytes, units[m->n_layers + 1]);
    /* every layer in exactly one group, groups contiguous and in order */
    int next = 0;
    for (int i = 1; i < p->n_groups - 1; i++) {
        const plan_group *g = &p->groups[i];
        CHECK_EQ_INT(g->kind, GROUP_LAYERS);
        CHECK_EQ_INT(g->first_layer, next);
        CHECK(g->n_layers >= 1 && g->n_layers <= o->group_size);
        if (i < p->n_groups - 2) CHECK_EQ_INT(g->n_layers, o->group_size);
        uint64_t b = 0;
        for (int l = 0; l < g->n_layers && g->first_layer + l < m->n_layers; l++) b += units[1 + g->first_layer + l];
        CHECK_EQ_U64(g->bytes, b);
        next = g->first_layer + g->n_layers;
    }
    CHECK_EQ_INT(next, m->n_layers);
    /* totals and budgets */
    uint64_t tb[TIER_COUNT] = {0};
    int streamed = 0;
    uint64_t slot = 0, disk_max = 0;
    for (int i = 0; i < p->n_groups; i++) {
        const plan_group *g = &p->groups[i];
        CHECK(g->tier >= TIER_DEVICE && g->tier < TIER_COUNT);
        tb[g->tier] += g->bytes;
        if (i > 0 && g->tier != TIER_DEVICE) {
            streamed++;
            if (g->bytes > slot) slot = g->bytes;
            if (g->tier == TIER_DISK && g->bytes > disk_max) disk_max = g->bytes;
        }
    }
    for (int t = 0; t < TIER_COUNT; t++) CHECK_EQ_U64(p->tier_bytes[t], tb[t]);
    if (o->budget[0] != UNL) CHECK(p->tier_bytes[TIER_DEVICE] <= o->budget[0]);
    if (o->budget[1] != UNL) CHECK(p->tier_bytes[TIER_HOST] <= o->budget[1]);
    CHECK_EQ_INT(p->n_streamed, streamed);
    /* given: as it is; 0: 2, or 256 MiB ahead for a median disk group of 4 MiB or more */
    int ahead = o->prefetch;
    if (!ahead) {
        uint64_t disk[64];
        int n_disk = 0;
        for (int i = 1; i < p->n_groups; i++)
            if (p->groups[i].tier == TIER_DISK && n_disk < 64) disk[n_disk++] = p->groups[i].bytes;
        for (int i = 1; i < n_disk; i++)
            for (int j = i; j > 0 && disk[j - 1] > disk[j]; j--) {
                uint64_t t = disk[j];
                disk[j] = disk[j - 1];
                disk[j - 1] = t;
            }
        uint64_t med = n_disk ? disk[n_disk / 2] : 0;
        ahead = 2;
        if (med >= (4ull << 20) && (int)(((256ull << 20) + med - 1) / med) > ahead)
            ahead = (int)(((256ull << 20) + med - 1) / med);
    }
    CHECK_EQ_INT(p->prefetch, ahead);
    /* the staging slots: never more bytes than a slot of the largest group
     * per fetch in flight; the largest slot holds the largest group; every
     * fetch fits its slot (and its bounce buffer), and any ahead + 1
     * consecutive fetches have distinct slots */
    CHECK(p->n_stage_slots <= streamed);
    uint64_t sum = 0, bounce = 0;
    for (int s = 0; s < p->n_stage_slots; s++) sum += p->slot_size[s], bounce += p->slot_bounce[s];
    CHECK_EQ_U64(p->stage_bytes, sum);
    CHECK_EQ_U64(p->host_stage_bytes, bounce);
    CHECK(p->stage_bytes <= (uint64_t)(streamed < ahead + 1 ? streamed : ahead + 1) * slot);
    CHECK_EQ_U64(p->slot_bytes, slot);
    if (o->unified) CHECK_EQ_U64(p->host_stage_bytes, 0);
    else CHECK(p->host_stage_bytes <= (uint64_t)(streamed < ahead + 1 ? streamed : ahead + 1) * disk_max);
    for (int i = 1, k = 0; i < p->n_groups; i++)
        if (p->groups[i].tier != TIER_DEVICE) CHECK_EQ_INT(p->stream[k++], i);
    int window = streamed < ahead + 1 ? streamed : ahead + 1;
    for (uint64_t q = 0; streamed && q < 3ull * (uint64_t)streamed + 7; q++) {
        int sl = plan_slot_of(p, q);
        CHECK(sl >= 0 && sl < p->n_stage_slots);
        if (sl < 0 || sl >= p->n_stage_slots) return;
        const plan_group *g = &p->groups[p->stream[q % (uint64_t)streamed]];
        CHECK(g->bytes <= p->slot_size[sl]);
        if (!o->unified && g->tier == TIER_DISK) CHECK(g->bytes <= p->slot_bounce[sl]);
        for (int j = 1; j < window; j++) CHECK(plan_slot_of(p, q + (uint64_t)j) != sl);
    }
    uint64_t ctx_blocks = ((uint64_t)p->opts.context + 15) / 16; /* KV_BLOCK_POSITIONS */
    if (o->kv_memory) return;
    /* the default pool: one sequence of the whole context to n_seqs of them, the most when memory is unknown */
    CHECK(p->kv_blocks >= ctx_blocks && p->kv_blocks <= (uint64_t)o->n_seqs * ctx_blocks);
    if ((o->unified ? o->host_avail : o->device_avail) == 0)
        CHECK_EQ_U64(p->kv_blocks, (uint64_t)o->n_seqs * ctx_blocks);
    CHECK_EQ_U64(p->kv_bytes, 2ull * (uint64_t)m->n_layers * p->kv_blocks * 16 * (uint64_t)m->kv_dim * 4ull);
}

static void make_ok(const plan_model *m, const uint64_t *units, const plan_opts *o, plan *p)
{
    CHECK_STATUS(plan_place(m, units, o, p), FERRY_OK);
    check_invariants(p, m, units, o);
}

static void test_unlimited(void)
{
    plan_model m = model_of(4);
    uint64_t units[] = {4 * K4, 8 * K4, 8 * K4, 8 * K4, 8 * K4, 5 * K4};
    for (int gs = 1; gs <= 5; gs++) {
        plan_opts o = opts_of(UNL, UNL, gs, 2);
        plan p;
        make_ok(&m, units, &o, &p);
        for (int i = 0; i < p.n_groups; i++) CHECK_EQ_INT(p.groups[i].tier, TIER_DEVICE);
        CHECK_EQ_U64(p.tier_bytes[TIER_DEVICE], 41 * K4);
        CHECK_EQ_U64(p.tier_bytes[TIER_HOST], 0);
        CHECK_EQ_U64(p.tier_bytes[TIER_DISK], 0);
        CHECK_EQ_INT(p.n_streamed, 0);
        CHECK_EQ_INT(p.n_stage_slots, 0);
        CHECK_EQ_U64(p.slot_bytes, 0);
        CHECK_EQ_U64(p.stage_bytes, 0);
        CHECK_EQ_U64(p.host_stage_bytes, 0);
        plan_free(&p);
    }
}

static void test_all_disk(void)
{
    plan_model m = model_of(3);
    uint64_t units[] = {16 * K4, 8 * K4, 8 * K4, 8 * K4, 5 * K4};
    plan_opts o = opts_of(0, 0, 1, 2);
    plan p;
    make_ok(&m, units, &o, &p);
    for (int i = 0; i < p.n_groups; i++) CHECK_EQ_INT(p.groups[i].tier, TIER_DISK);
    CHECK_EQ_U64(p.tier_bytes[TIER_DISK], 45 * K4);
    CHECK_EQ_U64(p.tier_bytes[TIER_DEVICE], 0);
    CHECK_EQ_U64(p.tier_bytes[TIER_HOST], 0);
    /* the embedding is gathered by rows, not streamed through the slots */
    CHECK_EQ_INT(p.n_streamed, 4);
    CHECK_EQ_INT(p.n_stage_slots, 3);
    CHECK_EQ_U64(p.slot_bytes, 8 * K4);
    CHECK_EQ_U64(p.stage_bytes, 24 * K4);
    plan_free(&p);

    /* non-unified: pinned bounce buffers, one per slot, of the largest disk group */
    o.unified = false;
    make_ok(&m, units, &o, &p);
    CHECK_EQ_U64(p.host_stage_bytes, 3 * 8 * K4);
    plan_free(&p);

    /* tied: the embedding group is empty and weighs nothing on any tier */
    uint64_t tied[] = {0, 8 * K4, 8 * K4, 8 * K4, 20 * K4};
    o.unified = true;
    make_ok(&m, tied, &o, &p);
    for (int i = 1; i < p.n_groups; i++) CHECK_EQ_INT(p.groups[i].tier, TIER_DISK);
    CHECK_EQ_U64(p.groups[0].bytes, 0);
    CHECK_EQ_U64(p.tier_bytes[TIER_DISK], 44 * K4);
    CHECK_EQ_INT(p.n_streamed, 4);
    CHECK_EQ_U64(p.slot_bytes, 20 * K4); /* the head holds the table */
    plan_free(&p);

    /* all host: device=0, host unlimited */
    o = opts_of(0, UNL, 1, 2);
    make_ok(&m, units, &o, &p);
    for (int i = 0; i < p.n_groups; i++) CHECK_EQ_INT(p.groups[i].tier, TIER_HOST);
    CHECK_EQ_U64(p.tier_bytes[TIER_HOST], 45 * K4);
    CHECK_EQ_INT(p.n_streamed, 4);
    plan_free(&p);
}

static void test_boundary(void)
{
    plan_model m = model_of(4);
    uint64_t units[] = {2 * K4, 3 * K4, 3 * K4, 3 * K4, 3 * K4, 2 * K4};
    plan p;
    /* device holds exactly two layers; host exactly the next one */
    plan_opts o = opts_of(6 * K4, 3 * K4, 1, 1);
    make_ok(&m, units, &o, &p);
    CHECK_EQ_INT(p.groups[1].tier, TIER_DEVICE);
    CHECK_EQ_INT(p.groups[2].tier, TIER_DEVICE);
    CHECK_EQ_INT(p.groups[3].tier, TIER_HOST);
    CHECK_EQ_INT(p.groups[4].tier, TIER_DISK);
    CHECK_EQ_INT(p.groups[5].tier, TIER_DISK); /* head */
    CHECK_EQ_INT(p.groups[0].tier, TIER_DISK); /* embed: nothing left */
    CHECK_EQ_U64(p.tier_bytes[TIER_DEVICE], 6 * K4);
    CHECK_EQ_U64(p.tier_bytes[TIER_HOST], 3 * K4);
    CHECK_EQ_U64(p.tier_bytes[TIER_DISK], 7 * K4);
    CHECK_EQ_INT(p.n_streamed, 3);
    CHECK_EQ_INT(p.n_stage_slots, 2);
    plan_free(&p);

    /* one byte less and the second layer moves on; a byte more changes nothing */
    o = opts_of(6 * K4 - 1, 3 * K4, 1, 1);
    make_ok(&m, units, &o, &p);
    CHECK_EQ_INT(p.groups[1].tier, TIER_DEVICE);
    CHECK_EQ_INT(p.groups[2].tier, TIER_HOST);
    CHECK_EQ_INT(p.groups[3].tier, TIER_DISK);
    /* head (2 pages) does not fit the 3 pages - 1 byte left on the device */
    CHECK_EQ_INT(p.groups[5].tier, TIER_DEVICE);
    plan_free(&p);

    /* exactly everything: all device */
    o = opts_of(16 * K4, 0, 1, 1);
    make_ok(&m, units, &o, &p);
    for (int i = 0; i < p.n_groups; i++) CHECK_EQ_INT(p.groups[i].tier, TIER_DEVICE);
    plan_free(&p);
    /* everything but one byte: the embedding (placed last) is the one that moves */
    o = opts_of(16 * K4 - 1, 0, 1, 1);
    make_ok(&m, units, &o, &p);
    for (int i = 1; i < p.n_groups; i++) CHECK_EQ_INT(p.groups[i].tier, TIER_DEVICE);
    CHECK_EQ_INT(p.groups[0].tier, TIER_DISK);
    CHECK_EQ_INT(p.n_streamed, 0); /* the embedding does not count */
    CHECK_EQ_INT(p.n_stage_slots, 0);
    plan_free(&p);
}

static void test_group_sizes(void)
{
    uint64_t units[] = {K4, 1 * K4, 2 * K4, 3 * K4, 4 * K4, 5 * K4, K4};
    plan_model m = model_of(5);
    plan p;
    /* 5 layers, group 3: [0-2] [3-4] */
    plan_opts o = opts_of(UNL, UNL, 3, 1);
    make_ok(&m, units, &o, &p);
    CHECK_EQ_INT(p.n_groups, 4);
    CHECK_EQ_INT(p.groups[1].first_layer, 0);
    CHECK_EQ_INT(p.groups[1].n_layers, 3);
    CHECK_EQ_U64(p.groups[1].bytes, 6 * K4);
    CHECK_EQ_INT(p.groups[2].first_layer, 3);
    CHECK_EQ_INT(p.groups[2].n_layers, 2);
    CHECK_EQ_U64(p.groups[2].bytes, 9 * K4);
    plan_free(&p);
    /* group 1 */
    o = opts_of(UNL, UNL, 1, 1);
    make_ok(&m, units, &o, &p);
    CHECK_EQ_INT(p.n_groups, 7);
    for (int l = 0; l < 5; l++) {
        CHECK_EQ_INT(p.groups[1 + l].first_layer, l);
        CHECK_EQ_INT(p.groups[1 + l].n_layers, 1);
        CHECK_EQ_U64(p.groups[1 + l].bytes, (uint64_t)(l + 1) * K4);
    }
    plan_free(&p);
    /* larger than the model: one group of every layer */
    o = opts_of(0, 0, 8, 1);
    make_ok(&m, units, &o, &p);
    CHECK_EQ_INT(p.n_groups, 3);
    CHECK_EQ_INT(p.groups[1].first_layer, 0);
    CHECK_EQ_INT(p.groups[1].n_layers, 5);
    CHECK_EQ_U64(p.groups[1].bytes, 15 * K4);
    CHECK_EQ_U64(p.slot_bytes, 15 * K4);
    CHECK_EQ_INT(p.n_streamed, 2);
    CHECK_EQ_INT(p.n_stage_slots, 2);
    plan_free(&p);
    /* equal to the model */
    o = opts_of(UNL, UNL, 5, 1);
    make_ok(&m, units, &o, &p);
    CHECK_EQ_INT(p.n_groups, 3);
    plan_free(&p);
    /* 7 layers in groups of 2, 3, 4, 6 */
    uint64_t u7[] = {K4, K4, K4, K4, K4, K4, K4, K4, K4};
    plan_model m7 = model_of(7);
    for (int gs = 2; gs <= 6; gs++) {
        o = opts_of(3 * K4, 2 * K4, gs, 2);
        make_ok(&m7, u7, &o, &p);
        int last = p.n_groups - 2;
        CHECK_EQ_INT(p.groups[last].n_layers, 7 - (7 - 1) / gs * gs);
        plan_free(&p);
    }
    /* bad options */
    o = opts_of(UNL, UNL, 0, 1);
    CHECK_STATUS(plan_place(&m, units, &o, &p), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("group");
    plan_free(&p);
    o = opts_of(UNL, UNL, 1, -1); /* 0 is the planner's */
    CHECK_STATUS(plan_place(&m, units, &o, &p), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("prefetch");
    plan_free(&p);
}

static void test_first_fit(void)
{
    plan_model m = model_of(4);
    /* layer 1 is big: it does not fit what is left on the device, but the
     * smaller layers after it do */
    uint64_t units[] = {K4, 2 * K4, 10 * K4, 2 * K4, 2 * K4, K4};
    plan_opts o = opts_of(5 * K4, 0, 1, 1);
    plan p;
    make_ok(&m, units, &o, &p);
    CHECK_EQ_INT(p.groups[1].tier, TIER_DEVICE); /* 2, left 3 */
    CHECK_EQ_INT(p.groups[2].tier, TIER_DISK);   /* 10 */
    CHECK_EQ_INT(p.groups[3].tier, TIER_DEVICE); /* 2, left 1 */
    CHECK_EQ_INT(p.groups[4].tier, TIER_DISK);   /* 2 > 1 */
    CHECK_EQ_INT(p.groups[5].tier, TIER_DEVICE); /* head 1, left 0 */
    CHECK_EQ_INT(p.groups[0].tier, TIER_DISK);   /* embed: nothing left */
    CHECK_EQ_U64(p.tier_bytes[TIER_DEVICE], 5 * K4);
    CHECK_EQ_U64(p.slot_bytes, 10 * K4);
    plan_free(&p);

    /* the same with a host tier: the big layer goes to host, later small ones
     * still take the device first */
    o = opts_of(5 * K4, 12 * K4, 1, 1);
    make_ok(&m, units, &o, &p);
    CHECK_EQ_INT(p.groups[1].tier, TIER_DEVICE);
    CHECK_EQ_INT(p.groups[2].tier, TIER_HOST); /* host left 2 */
    CHECK_EQ_INT(p.groups[3].tier, TIER_DEVICE);
    CHECK_EQ_INT(p.groups[4].tier, TIER_HOST); /* host left 0 */
    CHECK_EQ_INT(p.groups[5].tier, TIER_DEVICE);
    CHECK_EQ_INT(p.groups[0].tier, TIER_DISK);
    plan_free(&p);
}

static void test_embed_last(void)
{
    plan_model m = model_of(3);
    /* a big embedding that would fit the device if it were placed first */
    uint64_t units[] = {16 * K4, 8 * K4, 8 * K4, 8 * K4, 4 * K4};
    plan p;
    plan_opts o = opts_of(16 * K4, 0, 1, 1);
    make_ok(&m, units, &o, &p);
    CHECK_EQ_INT(p.groups[1].tier, TIER_DEVICE);
    CHECK_EQ_INT(p.groups[2].tier, TIER_DEVICE);
    CHECK_EQ_INT(p.groups[3].tier, TIER_DISK);
    CHECK_EQ_INT(p.groups[4].tier, TIER_DISK);
    CHECK_EQ_INT(p.groups[0].tier, TIER_DISK);
    plan_free(&p);

    /* the embedding takes what is left: here the host */
    o = opts_of(28 * K4, 16 * K4, 1, 1);
    make_ok(&m, units, &o, &p);
    for (int i = 1; i < p.n_groups; i++) CHECK_EQ_INT(p.groups[i].tier, TIER_DEVICE);
    CHECK_EQ_INT(p.groups[0].tier, TIER_HOST);
    CHECK_EQ_INT(p.n_streamed, 0);
    plan_free(&p);

    /* ... or the device, when layers and head leave room */
    o = opts_of(44 * K4, 0, 1, 1);
    make_ok(&m, units, &o, &p);
    for (int i = 0; i < p.n_groups; i++) CHECK_EQ_INT(p.groups[i].tier, TIER_DEVICE);
    plan_free(&p);

    /* a largest embedding on disk does not size the staging slots */
    o = opts_of(0, 0, 1, 1);
    make_ok(&m, units, &o, &p);
    CHECK_EQ_INT(p.groups[0].tier, TIER_DISK);
    CHECK_EQ_U64(p.slot_bytes, 8 * K4);
    plan_free(&p);
}

/* Prefetch left to the planner (0): big groups streamed from disk are
 * fetched PLAN_READAHEAD_BYTES ahead, PLAN_DEFAULT_PREFETCH groups at least;
 * from host memory, PLAN_DEFAULT_PREFETCH. A --prefetch given is obeyed,
 * below the read-ahead as above it. */
static void test_readahead(void)
{
    plan_model m = model_of(40);
    uint64_t units[42];
    units[0] = units[41] = K4;
    for (int i = 1; i <= 40; i++) units[i] = 31ull << 20; /* an int4 layer of a 1B model */
    plan p;
    plan_opts o = opts_of(0, 0, 1, 0); /* all on disk */
    make_ok(&m, units, &o, &p);
    CHECK_EQ_INT(p.n_stage_slots, 9 + 1); /* ceil(256 MiB / 31 MiB) = 9 ahead */
    plan_free(&p);
    o = opts_of(0, 0, 1, 12);
    make_ok(&m, units, &o, &p);
    CHECK_EQ_INT(p.n_stage_slots, 12 + 1); /* --prefetch beyond it stands */
    plan_free(&p);
    for (int pf = 1; pf <= 2; pf++) { /* ... and below it: staging is what the user bounded */
        o = opts_of(0, 0, 1, pf);
        make_ok(&m, units, &o, &p);
        CHECK_EQ_INT(p.n_stage_slots, pf + 1);
        CHECK_EQ_INT(p.prefetch, pf);
        plan_free(&p);
    }
    /* a 525 MB bf16 head among them: a slot of its own, the layers' slots
     * stay 31 MiB, and the read-ahead follows the layers */
    units[41] = 525ull << 20;
    o = opts_of(0, 0, 1, 0);
    make_ok(&m, units, &o, &p);
    CHECK_EQ_INT(p.prefetch, 9);
    CHECK_EQ_INT(p.n_stage_slots, 1 + 10);
    CHECK_EQ_INT(p.n_own_slots, 1);
    CHECK_EQ_U64(p.stage_bytes, (525ull << 20) + 10 * (31ull << 20));
    CHECK_EQ_INT(p.groups[41].slot, 0);
    plan_free(&p);
    units[41] = K4;
    o = opts_of(0, UNL, 1, 0); /* host memory: no read queue to keep full */
    make_ok(&m, units, &o, &p);
    CHECK_EQ_INT(p.n_stage_slots, 3);
    plan_free(&p);
    for (int i = 1; i <= 40; i++) units[i] = 300ull << 20; /* bf16 8B layers: two ahead already hold 256 MiB */
    o = opts_of(0, 0, 1, 0);
    make_ok(&m, units, &o, &p);
    CHECK_EQ_INT(p.n_stage_slots, 3);
    plan_free(&p);
}

static void test_stage_slots(void)
{
    plan_model m = model_of(6);
    uint64_t units[] = {K4, 3 * K4, K4, 7 * K4, K4, 2 * K4, K4, 5 * K4};
    plan p;
    for (int pf = 1; pf <= 9; pf++) {
        plan_opts o = opts_of(0, 0, 1, pf); /* 7 streamed groups */
        make_ok(&m, units, &o, &p);
        CHECK_EQ_INT(p.n_streamed, 7);
        CHECK_EQ_U64(p.slot_bytes, 7 * K4);
        /* the fewest bytes: groups 7,5,3,2,1,1,1 two at a time in two
         * shared slots of 7 (14, not 7+5+3+2 + 2 x 1); three and more at a
         * time, own slots for 7,5,3,2 and three shared of 1 (20, not 3 x 7) */
        CHECK_EQ_U64(p.stage_bytes, (pf == 1 ? 14 : 20) * K4);
        CHECK_EQ_INT(p.n_stage_slots, pf == 1 ? 2 : 7);
        CHECK_EQ_INT(p.n_own_slots, pf == 1 ? 0 : 4);
        plan_free(&p);
    }
    /* a device-resident largest layer does not size the slots */
    plan_opts o = opts_of(7 * K4, UNL, 1, 3);
    make_ok(&m, units, &o, &p);
    CHECK_EQ_INT(p.groups[1].tier, TIER_DEVICE); /* 3, left 4 */
    CHECK_EQ_INT(p.groups[2].tier, TIER_DEVICE); /* 1, left 3 */
    CHECK_EQ_INT(p.groups[3].tier, TIER_HOST);   /* 7 */
    CHECK_EQ_INT(p.groups[4].tier, TIER_DEVICE); /* 1, left 2 */
    CHECK_EQ_INT(p.groups[5].tier, TIER_DEVICE); /* 2, left 0 */
    CHECK_EQ_INT(p.groups[6].tier, TIER_HOST);
    CHECK_EQ_INT(p.groups[7].tier, TIER_HOST);
    CHECK_EQ_INT(p.n_streamed, 3);
    CHECK_EQ_INT(p.n_stage_slots, 3);
    CHECK_EQ_U64(p.slot_bytes, 7 * K4);
    plan_free(&p);
    o = opts_of(12 * K4, UNL, 1, 3);
    make_ok(&m, units, &o, &p);
    CHECK_EQ_INT(p.groups[3].tier, TIER_DEVICE); /* 3 + 1 + 7 + 1 = 12 on the device */
    CHECK_EQ_INT(p.groups[4].tier, TIER_DEVICE);
    CHECK_EQ_INT(p.groups[5].tier, TIER_HOST);
    CHECK_EQ_U64(p.slot_bytes, 5 * K4); /* the head is the largest streamed group */
    CHECK_EQ_INT(p.n_streamed, 3);      /* layers 4, 5 and the head */
    plan_free(&p);

    /* non-unified: host bounce buffers follow the largest disk group only */
    o = opts_of(0, 11 * K4, 1, 1); /* layers 0-2 on host, the rest on disk */
    o.unified = false;
    make_ok(&m, units, &o, &p);
    CHECK_EQ_INT(p.groups[3].tier, TIER_HOST);
    CHECK_EQ_INT(p.groups[4].tier, TIER_DISK);
    CHECK_EQ_INT(p.n_stage_slots, 2);
    CHECK_EQ_U64(p.slot_bytes, 7 * K4);
    CHECK_EQ_U64(p.host_stage_bytes, 2 * 5 * K4);
    plan_free(&p);
    /* nothing on disk: no bounce buffers */
    o = opts_of(0, UNL, 1, 1);
    o.unified = false;
    make_ok(&m, units, &o, &p);
    CHECK_EQ_U64(p.host_stage_bytes, 0);
    plan_free(&p);
}

static void test_kv(void)
{
    plan_model m = model_of(5);
    m.kv_dim = 96;
    uint64_t units[] = {K4, K4, K4, K4, K4, K4, K4};
    plan_opts o = opts_of(UNL, UNL, 2, 1);
    o.n_seqs = 7;
    o.context = 300;
    plan p;
    make_ok(&m, units, &o, &p);
    /* 300 positions take 19 blocks of 16 */
    CHECK_EQ_U64(p.kv_blocks, 7ull * 19);
    CHECK_EQ_U64(p.kv_block_bytes, 2ull * 5 * 16 * 96 * 4);
    CHECK_EQ_U64(p.kv_bytes, 2ull * 5 * 7 * 304 * 96 * 4);
    CHECK_EQ_U64(plan_kv_sequences(&p, 300), 7);
    CHECK_EQ_U64(plan_kv_sequences(&p, 16), 7ull * 19);
    uint64_t block = p.kv_block_bytes;
    plan_free(&p);
    /* --kv-memory: whole blocks of it */
    o.kv_memory = 10 * block + 5;
    make_ok(&m, units, &o, &p);
    CHECK_EQ_U64(p.kv_blocks, 10);
    CHECK_EQ_U64(p.kv_bytes, 10 * block);
    plan_free(&p);
    o.kv_memory = 5; /* not one block */
    CHECK_STATUS(plan_place(&m, units, &o, &p), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--kv-memory");
    plan_free(&p);
    o.kv_memory = 0;
    /* large: no 32-bit overflow */
    o.n_seqs = 4096;
    o.context = 131072;
    make_ok(&m, units, &o, &p);
    CHECK_EQ_U64(p.kv_bytes, 2ull * 5 * 4096 * 131072 * 96 * 4);
    CHECK(p.act_bytes > 0);
    plan_free(&p);
}

/* No --kv-memory: half of the memory the rest of the plan leaves, between
 * one sequence of the context and n_seqs of them. */
static void test_kv_default(void)
{
    plan_model m = model_of(5);
    m.kv_dim = 96;
    uint64_t units[] = {K4, K4, K4, K4, K4, K4, K4};
    plan_opts o = opts_of(UNL, UNL, 2, 1);
    o.n_seqs = 64;
    o.context = 300; /* 19 blocks */
    plan p;
    make_ok(&m, units, &o, &p);
    uint64_t block = p.kv_block_bytes, host, dev;
    plan_needs(&p, &o, &host, &dev);
    uint64_t rest = host - p.kv_bytes; /* weights, staging, activations, runtime */
    plan_free(&p);
    o.host_avail = rest + 2 * 50 * block + block / 2;
    make_ok(&m, units, &o, &p);
    CHECK_EQ_U64(p.kv_blocks, 50);
    plan_needs(&p, &o, &host, &dev);
    CHECK(host <= o.host_avail);
    plan_free(&p);
    o.host_avail = rest / 2; /* less than the rest: still one whole-context sequence */
    make_ok(&m, units, &o, &p);
    CHECK_EQ_U64(p.kv_blocks, 19);
    plan_free(&p);
    o.host_avail = 1ull << 50; /* plenty: never more than n_seqs of the context */
    make_ok(&m, units, &o, &p);
    CHECK_EQ_U64(p.kv_blocks, 64ull * 19);
    plan_free(&p);
    /* not unified: device memory beside the device's weights, staging and activations */
    o = opts_of(K4, 0, 1, 1);
    o.unified = false;
    o.n_seqs = 64;
    o.context = 300;
    make_ok(&m, units, &o, &p);
    plan_needs(&p, &o, &host, &dev);
    rest = dev - p.kv_bytes;
    plan_free(&p);
    o.device_avail = rest + 2 * 30 * block;
    o.host_avail = 1ull << 50; /* ignored: the pool is device memory */
    make_ok(&m, units, &o, &p);
    CHECK_EQ_U64(p.kv_blocks, 30);
    plan_free(&p);
}

static void test_parse_budgets(void)
{
    uint64_t b[2] = {1, 1};
    CHECK_STATUS(plan_parse_budgets("device=1GiB,host=0", b), FERRY_OK);
    CHECK_EQ_U64(b[0], 1ull << 30);
    CHECK_EQ_U64(b[1], 0);
    CHECK_STATUS(plan_parse_budgets("host=2GiB", b), FERRY_OK);
    CHECK_EQ_U64(b[0], UNL);
    CHECK_EQ_U64(b[1], 2ull << 30);
    CHECK_STATUS(plan_parse_budgets("device=512MiB", b), FERRY_OK);
    CHECK_EQ_U64(b[0], 512ull << 20);
    CHECK_EQ_U64(b[1], UNL);
    CHECK_STATUS(plan_parse_budgets("host=3MiB,device=4096", b), FERRY_OK);
    CHECK_EQ_U64(b[0], 4096);
    CHECK_EQ_U64(b[1], 3ull << 20);
    CHECK_STATUS(plan_parse_budgets("device=0,host=0", b), FERRY_OK);
    CHECK_EQ_U64(b[0], 0);
    CHECK_EQ_U64(b[1], 0);
    b[0] = b[1] = 5;
    CHECK_STATUS(plan_parse_budgets("", b), FERRY_OK);
    CHECK_EQ_U64(b[0], UNL);
    CHECK_EQ_U64(b[1], UNL);
    b[0] = b[1] = 5;
    CHECK_STATUS(plan_parse_budgets(NULL, b), FERRY_OK);
    CHECK_EQ_U64(b[0], UNL);
    CHECK_EQ_U64(b[1], UNL);

    CHECK_STATUS(plan_parse_budgets("gpu=1", b), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("gpu");
    CHECK_STATUS(plan_parse_budgets("device=1GiB,ram=1GiB", b), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("ram");
    CHECK_STATUS(plan_parse_budgets("device=x", b), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("device");
    CHECK_STATUS(plan_parse_budgets("host=1GiB,device=-1", b), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("device");
    CHECK_STATUS(plan_parse_budgets("host=12QiB", b), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("host");
    CHECK_STATUS(plan_parse_budgets("device=", b), FERRY_ERR_INVALID);
    CHECK_STATUS(plan_parse_budgets("device", b), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("device=SIZE");
    CHECK_STATUS(plan_parse_budgets("1GiB", b), FERRY_OK); /* a bare size: host memory */
    CHECK_EQ_U64(b[0], UNL);
    CHECK_EQ_U64(b[1], 1ull << 30);
    CHECK_STATUS(plan_parse_budgets("cpu=2GiB", b), FERRY_OK); /* accelerate's name for it */
    CHECK_EQ_U64(b[1], 2ull << 30);
    CHECK_STATUS(plan_parse_budgets("cpu=2GiB,host=1GiB", b), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("twice");
    CHECK_STATUS(plan_parse_budgets("lots", b), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("expected SIZE or device=SIZE,host=SIZE");
    CHECK_STATUS(plan_parse_budgets("device=1GiB,host", b), FERRY_ERR_INVALID);
    CHECK_STATUS(plan_parse_budgets("device=1GiB,,host=0", b), FERRY_ERR_INVALID);
    CHECK_STATUS(plan_parse_budgets("=1GiB", b), FERRY_ERR_INVALID);
    CHECK_STATUS(plan_parse_budgets("devices=1GiB", b), FERRY_ERR_INVALID);
    CHECK_STATUS(plan_parse_budgets("dev=1GiB", b), FERRY_ERR_INVALID);
}

static void test_check(void)
{
    plan_model m = model_of(4);
    uint64_t units[] = {4 * K4, 8 * K4, 8 * K4, 8 * K4, 8 * K4, 5 * K4};
    plan p;
    /* unified (CPU): everything counts against host memory */
    plan_opts o = opts_of(16 * K4, 8 * K4, 1, 2);
    o.n_seqs = 4;
    o.context = 1024;
    make_ok(&m, units, &o, &p);
    uint64_t host = 0, dev = 0;
    plan_needs(&p, &o, &host, &dev);
    CHECK_EQ_U64(host, dev);
    CHECK(host >= p.tier_bytes[TIER_DEVICE] + p.tier_bytes[TIER_HOST] + p.stage_bytes + p.kv_bytes + p.act_bytes);
    CHECK_STATUS(plan_check(&p, &o, host, 0), FERRY_OK); /* device_avail ignored when unified */
    CHECK_STATUS(plan_check(&p, &o, host + 1, 0), FERRY_OK);
    CHECK_STATUS(plan_check(&p, &o, host - 1, UNL), FERRY_ERR_NOMEM);
    CHECK_MSG_HAS("needs");
    CHECK_MSG_HAS("host");
    CHECK_STATUS(plan_check(&p, &o, 1 << 20, UNL), FERRY_ERR_NOMEM);
    CHECK_MSG_HAS("needs");

    /* a bigger KV cache needs exactly its extra bytes (and the activations') more */
    uint64_t kv1 = p.kv_bytes, act1 = p.act_bytes;
    plan_free(&p);
    plan_opts o2 = o;
    o2.n_seqs = 8;
    make_ok(&m, units, &o2, &p);
    uint64_t host2, dev2;
    plan_needs(&p, &o2, &host2, &dev2);
    CHECK_EQ_U64(p.kv_bytes, 2 * kv1);
    CHECK_EQ_U64(host2 - host, (p.kv_bytes - kv1) + (p.act_bytes - act1));
    plan_free(&p);

    /* not unified: device memory checked separately */
    o.unified = false;
    make_ok(&m, units, &o, &p);
    plan_needs(&p, &o, &host, &dev);
    CHECK(dev >= p.tier_bytes[TIER_DEVICE] + p.stage_bytes + p.kv_bytes + p.act_bytes);
    CHECK(host >= p.tier_bytes[TIER_HOST] + p.host_stage_bytes);
    CHECK_STATUS(plan_check(&p, &o, host, dev), FERRY_OK);
    CHECK_STATUS(plan_check(&p, &o, host, dev - 1), FERRY_ERR_NOMEM);
    CHECK_MSG_HAS("device memory");
    CHECK_MSG_HAS("needs");
    CHECK_STATUS(plan_check(&p, &o, host - 1, UNL), FERRY_ERR_NOMEM);
    CHECK_MSG_HAS("needs");
    CHECK_MSG_HAS("host");
    plan_free(&p);
}

/* A mixture of experts: layers 0 and 2 of 3 sparse, 4 experts of 4 KiB
 * each, top-2; layers and head 8 KiB, embedding 8 KiB. Expert groups come
 * after the head, are placed after the layer groups and the head and before
 * the embedding, and never stream with the layers; the expert slots follow
 * --expert-cache, at least 2 x top_k, at most the experts off the device. */
static void test_experts(void)
{
    static const int moe_layers[] = {0, 2};
    plan_model m = model_of(3);
    m.n_experts = 4;
    m.top_k = 2;
    m.moe_hidden = 32;
    m.n_moe_layers = 2;
    m.moe_layers = moe_layers;
    uint64_t units[3 + 2 + 8];
    for (int u = 0; u < 5; u++) units[u] = 2 * K4;
    for (int u = 5; u < 13; u++) units[u] = K4;
    plan p;
    plan_opts o = opts_of(UNL, UNL, 1, 1);
    CHECK_STATUS(plan_place(&m, units, &o, &p), FERRY_OK);
    CHECK_EQ_INT(p.n_groups, 1 + 3 + 1 + 8);
    CHECK_EQ_INT(p.first_expert, 5);
    CHECK_EQ_INT(p.groups[4].kind, GROUP_HEAD);
    for (int i = 0; i < 8; i++) {
        const plan_group *g = &p.groups[5 + i];
        CHECK_EQ_INT(g->kind, GROUP_EXPERT);
        CHECK_EQ_INT(g->first_layer, moe_layers[i / 4]);
        CHECK_EQ_INT(g->expert, i % 4);
        CHECK_EQ_U64(g->bytes, K4);
        CHECK_EQ_INT(g->tier, TIER_DEVICE);
    }
    CHECK_EQ_INT(p.n_expert_slots, 0);
    CHECK_EQ_U64(p.expert_stage_bytes, 0);
    CHECK_EQ_U64(p.tier_bytes[TIER_DEVICE], 5 * 2 * K4 + 8 * K4);
    plan_free(&p);

    /* attention resident, 3 experts on host, the rest and the embedding on disk */
    o = opts_of(4 * 2 * K4, 3 * K4, 1, 1);
    CHECK_STATUS(plan_place(&m, units, &o, &p), FERRY_OK);
    for (int g = 1; g <= 4; g++) CHECK_EQ_INT(p.groups[g].tier, TIER_DEVICE);
    for (int i = 0; i < 8; i++) CHECK_EQ_INT(p.groups[5 + i].tier, i < 3 ? TIER_HOST : TIER_DISK);
    CHECK_EQ_INT(p.groups[0].tier, TIER_DISK);
    CHECK_EQ_INT(p.n_streamed, 0); /* experts never stream with the layers */
    CHECK_EQ_INT(p.n_stage_slots, 0);
    CHECK_EQ_INT(p.n_expert_slots, 4); /* 2 x top_k */
    CHECK_EQ_U64(p.expert_slot_bytes, K4);
    CHECK_EQ_U64(p.expert_stage_bytes, 4 * K4);
    CHECK_EQ_INT(p.expert_reads, 4);
    CHECK_EQ_U64(p.expert_bounce_bytes, 0); /* unified: reads land in the slots */
    plan_free(&p);

    o.expert_cache = 6 * K4 + 100; /* whole slots only */
    CHECK_STATUS(plan_place(&m, units, &o, &p), FERRY_OK);
    CHECK_EQ_INT(p.n_expert_slots, 6);
    CHECK_EQ_INT(p.expert_reads, 6); /* PLAN_EXPERT_READS, at most the slots */
    plan_free(&p);
    o.expert_cache = 1ull << 30; /* more than every expert off the device */
    CHECK_STATUS(plan_place(&m, units, &o, &p), FERRY_OK);
    CHECK_EQ_INT(p.n_expert_slots, 8);
    plan_free(&p);

    /* not unified: bounce buffers for the expert reads from disk */
    o = opts_of(4 * 2 * K4, 3 * K4, 1, 1);
    o.unified = false;
    CHECK_STATUS(plan_place(&m, units, &o, &p), FERRY_OK);
    CHECK_EQ_U64(p.expert_bounce_bytes, 4 * K4);
    uint64_t host, dev;
    plan_needs(&p, &o, &host, &dev);
    CHECK_EQ_U64(dev, p.tier_bytes[TIER_DEVICE] + p.stage_bytes + p.expert_stage_bytes + p.kv_bytes + p.act_bytes);
    plan_free(&p);

    /* layer groups and head before experts: the head misses the device, an expert takes the room left */
    o = opts_of(3 * 2 * K4 + K4, 0, 1, 1);
    CHECK_STATUS(plan_place(&m, units, &o, &p), FERRY_OK);
    CHECK_EQ_INT(p.groups[4].tier, TIER_DISK);
    CHECK_EQ_INT(p.groups[5].tier, TIER_DEVICE);
    for (int i = 1; i < 8; i++) CHECK_EQ_INT(p.groups[5 + i].tier, TIER_DISK);
    CHECK_EQ_INT(p.n_streamed, 1);
    CHECK_EQ_INT(p.n_expert_slots, 4);
    plan_free(&p);
}

/* plan_make: --max-memory bounds all the model takes of a memory (plan.h). */
static uint64_t ram_used(const plan *p)
{
    return p->tier_bytes[TIER_DEVICE] + p->tier_bytes[TIER_HOST] + p->stage_bytes + p->expert_stage_bytes +
           p->kv_bytes + p->act_bytes;
}

static void test_budgets(void)
{
    plan_model m = model_of(8);
    uint64_t units[10];
    for (int u = 0; u < 10; u++) units[u] = 64 * K4;
    plan_opts o = opts_of(UNL, UNL, 1, 1);
    o.n_seqs = 8;
    o.context = 256; /* 16 blocks a sequence */
    plan p;
    CHECK_STATUS(plan_make(&m, units, &o, &p), FERRY_OK);
    uint64_t blk = p.kv_block_bytes, floor = 16 * blk, work = p.act_bytes; /* all resident: no staging */
    plan_free(&p);

    /* unified (CPU): host= is all of RAM; what fits beside the least working
     * memory stays resident, the rest goes to disk, then the KV pool grows */
    for (uint64_t b = 3 * 64 * K4; b <= 12 * 64 * K4; b += 23 * K4) {
        o.budget[1] = b;
        ferry_status st = plan_make(&m, units, &o, &p);
        if (st != FERRY_OK) { /* only when even all on disk cannot hold the least */
            CHECK_MSG_HAS("cannot hold the least");
            continue;
        }
        CHECK(ram_used(&p) <= b);
        CHECK(p.kv_blocks >= 16);
        CHECK_EQ_U64(p.tier_bytes[TIER_HOST], 0); /* no device cap: resident means the device tier */
        /* weights gave way first: a group that went to disk could not have
         * stayed with the pool at its floor */
        if (p.tier_bytes[TIER_DISK]) {
            uint64_t least = ram_used(&p) - p.kv_bytes + floor;
            CHECK(least + 64 * K4 > b || p.stage_bytes > 0);
        }
        plan_free(&p);
    }
    /* enough for everything resident and two sequences of KV: exactly that */
    o.budget[1] = 10 * 64 * K4 + work + 2 * floor;
    CHECK_STATUS(plan_make(&m, units, &o, &p), FERRY_OK);
    CHECK_EQ_U64(p.tier_bytes[TIER_DISK], 0);
    CHECK_EQ_U64(p.kv_blocks, 32);
    CHECK_EQ_U64(ram_used(&p), o.budget[1]);
    plan_free(&p);
    /* one block less: still all resident, a sequence's KV fewer blocks */
    o.budget[1] -= blk;
    CHECK_STATUS(plan_make(&m, units, &o, &p), FERRY_OK);
    CHECK_EQ_U64(p.tier_bytes[TIER_DISK], 0);
    CHECK_EQ_U64(p.kv_blocks, 31);
    plan_free(&p);
    /* less than the weights + one sequence: a group goes to disk, the pool keeps its floor */
    o.budget[1] = 10 * 64 * K4 + work + floor - 1;
    CHECK_STATUS(plan_make(&m, units, &o, &p), FERRY_OK);
    CHECK(p.tier_bytes[TIER_DISK] > 0);
    CHECK(p.kv_blocks >= 16);
    CHECK(ram_used(&p) <= o.budget[1]);
    plan_free(&p);
    /* device= caps the resident part inside host= */
    o.budget[0] = 3 * 64 * K4;
    o.budget[1] = 12 * 64 * K4;
    CHECK_STATUS(plan_make(&m, units, &o, &p), FERRY_OK);
    CHECK_EQ_U64(p.tier_bytes[TIER_DEVICE], 3 * 64 * K4);
    CHECK(ram_used(&p) <= o.budget[1]);
    plan_free(&p);
    /* device= alone bounds nothing on a unified backend: refused, saying what to write */
    o.budget[1] = UNL;
    CHECK_STATUS(plan_make(&m, units, &o, &p), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("write --max-memory 786432 (the whole RAM budget");
    /* host=0: no weights in RAM, the working memory as it needs */
    o.budget[0] = UNL;
    o.budget[1] = 0;
    CHECK_STATUS(plan_make(&m, units, &o, &p), FERRY_OK);
    CHECK_EQ_U64(p.tier_bytes[TIER_DISK], 10 * 64 * K4);
    plan_free(&p);
    /* below the least working memory: refused with the numbers */
    o.budget[1] = 64 * K4;
    CHECK_STATUS(plan_make(&m, units, &o, &p), FERRY_ERR_NOMEM);
    CHECK_MSG_HAS("--max-memory host=256.00 KiB cannot hold the least");
    CHECK_MSG_HAS("staging");
    CHECK_MSG_HAS("KV cache");
    CHECK_MSG_HAS("one sequence of 256 positions");

    /* not unified: device= bounds device weights and the working memory,
     * host= the host weights and the bounce buffers */
    o = opts_of(6 * 64 * K4, 2 * 64 * K4, 1, 1);
    o.unified = false;
    o.n_seqs = 8;
    o.context = 256;
    CHECK_STATUS(plan_make(&m, units, &o, &p), FERRY_OK);
    uint64_t host, dev;
    plan_needs(&p, &o, &host, &dev);
    CHECK(dev <= o.budget[0]);
    CHECK(p.tier_bytes[TIER_HOST] + p.host_stage_bytes + p.expert_bounce_bytes <= o.budget[1]);
    CHECK(p.tier_bytes[TIER_DEVICE] > 0 && p.tier_bytes[TIER_DEVICE] < 6 * 64 * K4);
    plan_free(&p);
    /* no device budget: what fits beside the working memory in what the device has */
    o.budget[0] = UNL;
    o.budget[1] = UNL;
    o.device_avail = 7 * 64 * K4;
    CHECK_STATUS(plan_make(&m, units, &o, &p), FERRY_OK);
    plan_needs(&p, &o, &host, &dev);
    CHECK(dev <= o.device_avail);
    CHECK(p.tier_bytes[TIER_DEVICE] > 0);
    plan_free(&p);
}

/* Under a budget the planner's read-ahead beyond its default gives way
 * before any weight leaves, and shortens on below it only with every weight
 * gone (plan.h). */
static void test_budget_readahead(void)
{
    plan_model m = model_of(40);
    uint64_t units[42];
    units[0] = units[41] = 31ull << 20;
    for (int i = 1; i <= 40; i++) units[i] = 31ull << 20;
    plan_opts o = opts_of(UNL, 0, 1, 0); /* host=0: bounds nothing, every group on disk */
    plan p;
    CHECK_STATUS(plan_make(&m, units, &o, &p), FERRY_OK);
    CHECK_EQ_INT(p.prefetch, 9); /* 256 MiB of 31 MiB groups */
    uint64_t floor_work = p.act_bytes + p.kv_bytes;
    plan_free(&p);
    o.budget[1] = 20 * (31ull << 20);
    CHECK_STATUS(plan_make(&m, units, &o, &p), FERRY_OK);
    CHECK(p.tier_bytes[TIER_DISK] > 0 && p.tier_bytes[TIER_DEVICE] > 0);
    CHECK_EQ_INT(p.prefetch, PLAN_DEFAULT_PREFETCH); /* not 9 with fewer groups resident */
    CHECK(ram_used(&p) <= o.budget[1]);
    plan_free(&p);
    /* a budget that holds the weights only without the read-ahead: all of them resident, nothing streams */
    o.budget[1] = 42 * (31ull << 20) + floor_work;
    CHECK_STATUS(plan_make(&m, units, &o, &p), FERRY_OK);
    CHECK_EQ_U64(p.tier_bytes[TIER_DISK], 0);
    plan_free(&p);
    /* every weight on disk and still short: below the default, down to 1 */
    o.budget[1] = floor_work + 2 * (31ull << 20) + 1;
    CHECK_STATUS(plan_make(&m, units, &o, &p), FERRY_OK);
    CHECK_EQ_U64(p.tier_bytes[TIER_DEVICE], 0);
    CHECK_EQ_INT(p.prefetch, 1);
    plan_free(&p);
    /* a --prefetch given never shortens: refused instead */
    o.prefetch = 9;
    CHECK_STATUS(plan_make(&m, units, &o, &p), FERRY_ERR_NOMEM);
    CHECK_MSG_HAS("cannot hold the least");
}

int main(void)
{
    test_budget_readahead();
    test_budgets();
    test_experts();
    test_unlimited();
    test_all_disk();
    test_boundary();
    test_group_sizes();
    test_first_fit();
    test_embed_last();
    test_stage_slots();
    test_readahead();
    test_kv();
    test_kv_default();
    test_parse_budgets();
    test_check();
    CHECK_EQ_STR(tier_name(TIER_DEVICE), "device");
    CHECK_EQ_STR(tier_name(TIER_HOST), "host");
    CHECK_EQ_STR(tier_name(TIER_DISK), "disk");
    return check_report();
}
