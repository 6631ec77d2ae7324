/*
 * plan.c - see plan.h.
 */
#define _GNU_SOURCE /* qsort_r */
#include "plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "kv.h"

const char *tier_name(tier t)
{
    switch (t) {
    case TIER_DEVICE: return "device";
    case TIER_HOST: return "host";
    case TIER_DISK: return "disk";
    default: return "?";
    }
}

/* First fit, device then host. Shared (unified, plan_make): both tiers are
 * RAM, and a group on the device tier also takes its bytes from the host
 * budget, the whole. */
static void place(plan_group *g, uint64_t left[2], bool shared)
{
    for (int t = 0; t < 2; t++) {
        if (g->bytes <= left[t] && (!shared || g->bytes <= left[1])) {
            g->tier = (tier)t;
            if (left[t] != PLAN_UNLIMITED) left[t] -= g->bytes;
            if (shared && t == 0 && left[1] != PLAN_UNLIMITED) left[1] -= g->bytes;
            return;
        }
    }
    g->tier = TIER_DISK;
}

/* Memory the plan uses in the memory the KV pool lives in (RAM when
 * unified, else device memory), the pool included. */
static uint64_t kv_memory_used(const plan *p, const plan_opts *o)
{
    uint64_t used = p->tier_bytes[TIER_DEVICE] + p->stage_bytes + p->expert_stage_bytes + p->act_bytes + p->kv_bytes;
    return o->unified ? used + p->tier_bytes[TIER_HOST] : used;
}

/* The KV pool when --kv-memory is not given (plan.h), once the weights are
 * placed with the pool at its floor, one sequence of the whole context
 * (every request that passes request_check can run): under a budget, all
 * of the budget that the rest leaves; with no budget, half of what the
 * memory has left beside the rest (the other half stays for the page cache
 * the disk tier reads through, other processes, and on a device its second
 * placement); unknown memory, the most. Never more than n_seqs sequences. */
static uint64_t kv_default_blocks(const plan *p, const plan_opts *o, uint64_t budget)
{
    uint64_t floor = (uint64_t)kv_blocks_for(o->context), most = (uint64_t)o->n_seqs * floor;
    uint64_t rest = kv_memory_used(p, o) - p->kv_bytes, afford;
    if (budget != PLAN_UNLIMITED && budget != 0) {
        afford = budget > rest ? (budget - rest) / p->kv_block_bytes : 0;
    } else {
        uint64_t avail = o->unified ? o->host_avail : o->device_avail;
        if (avail == 0 || avail == PLAN_UNLIMITED) return most;
        if (o->unified) rest += p->host_stage_bytes + PLAN_RUNTIME_OVERHEAD;
        afford = avail > rest ? (avail - rest) / 2 / p->kv_block_bytes : 0;
    }
    return afford < floor ? floor : afford > most ? most : afford;
}

/* The expert slots (plan.h): what --expert-cache asks for, at least
 * PLAN_EXPERT_MIN_SLOTS x top_k, never more than the experts that are not
 * on the device; disk reads of experts land in bounce buffers first where
 * device memory is not host memory, as many as reads in flight. */
static void size_expert_slots(const plan_model *m, const plan_opts *o, plan *out)
{
    int off_device = 0;
    uint64_t disk_max = 0;
    for (int i = out->first_expert; i < out->n_groups; i++) {
        const plan_group *g = &out->groups[i];
        if (g->tier == TIER_DEVICE) continue;
        off_device++;
        if (g->bytes > out->expert_slot_bytes) out->expert_slot_bytes = g->bytes;
        if (g->tier == TIER_DISK && g->bytes > disk_max) disk_max = g->bytes;
    }
    if (off_device == 0) return;
    uint64_t want = o->expert_cache / out->expert_slot_bytes, least = (uint64_t)PLAN_EXPERT_MIN_SLOTS * (uint64_t)m->top_k;
    if (want < least) want = least;
    out->n_expert_slots = want < (uint64_t)off_device ? (int)want : off_device;
    out->expert_stage_bytes = (uint64_t)out->n_expert_slots * out->expert_slot_bytes;
    out->expert_reads = PLAN_EXPERT_READS < out->n_expert_slots ? PLAN_EXPERT_READS : out->n_expert_slots;
    if (!o->unified && disk_max) out->expert_bounce_bytes = (uint64_t)out->expert_reads * disk_max;
}

static int by_bytes_desc(const void *a, const void *b, void *groups)
{
    const plan_group *g = groups;
    uint64_t x = g[*(const int *)a].bytes, y = g[*(const int *)b].bytes;
    return x < y ? 1 : x > y ? -1 : *(const int *)a - *(const int *)b;
}

/* Read-ahead depth and the staging slots (plan.h). Depth by bytes follows
 * the median disk group, not the largest: a bf16 head among int4 layers
 * must not stop the layers from being read far enough ahead. Slots: with
 * the d largest groups in slots of their own and the rest sharing
 * min(prefetch + 1, n - d) slots of the largest of the rest, the bytes are
 * the d largest + that; the d needing the fewest wins (ties: fewer). */
static ferry_status size_stage_slots(plan *out, const plan_opts *o)
{
    plan_group *g = out->groups;
    int n = out->n_streamed, n_disk = 0;
    size_t cap = (size_t)(unsigned)n + 1;
    out->stream = calloc(cap, sizeof *out->stream);
    out->stream_rank = calloc(cap, sizeof *out->stream_rank);
    int *order = calloc(cap, sizeof *order);
    uint64_t *disk = calloc(cap, sizeof *disk);
    if (!out->stream || !out->stream_rank || !order || !disk) {
        free(order);
        free(disk);
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    int k = 0;
    for (int i = 0; i < out->n_groups; i++) {
        g[i].slot = -1;
        if (g[i].kind == GROUP_EMBED || g[i].kind == GROUP_EXPERT || g[i].tier == TIER_DEVICE) continue;
        out->stream[k] = order[k] = i;
        k++;
        if (g[i].tier == TIER_DISK) disk[n_disk++] = g[i].bytes;
    }
    uint64_t median = 0;
    if (n_disk) {
        for (int i = 1; i < n_disk; i++) /* insertion sort: a few hundred groups at most */
            for (int j = i; j > 0 && disk[j - 1] > disk[j]; j--) {
                uint64_t t = disk[j];
                disk[j] = disk[j - 1];
                disk[j - 1] = t;
            }
        median = disk[n_disk / 2];
    }
    out->prefetch = plan_ahead(o->prefetch, median, n_disk > 0);
    if (!o->prefetch && o->readahead_cap && out->prefetch > o->readahead_cap) out->prefetch = o->readahead_cap;
    free(disk);
    if (n == 0) {
        free(order);
        return FERRY_OK;
    }
    qsort_r(order, (size_t)n, sizeof *order, by_bytes_desc, g);
    int window = out->prefetch + 1, best_d = 0;
    uint64_t best = UINT64_MAX, own = 0;
    for (int d = 0; d <= n; d++) {
        int shared = n - d < window ? n - d : window;
        uint64_t cost = own + (d < n ? (uint64_t)shared * g[order[d]].bytes : 0);
        if (cost < best) best = cost, best_d = d;
        if (d < n) own += g[order[d]].bytes;
    }
    int shared = n - best_d < window ? n - best_d : window;
    out->n_own_slots = best_d;
    out->n_stage_slots = best_d + shared;
    out->slot_size = calloc(cap, sizeof *out->slot_size); /* n_stage_slots <= n */
    out->slot_bounce = calloc(cap, sizeof *out->slot_bounce);
    if (!out->slot_size || !out->slot_bounce) {
        free(order);
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    uint64_t pool = 0, pool_disk = 0;
    for (int d = 0; d < n; d++) {
        plan_group *pg = &g[order[d]];
        uint64_t on_disk = pg->tier == TIER_DISK ? pg->bytes : 0;
        if (d < best_d) {
            pg->slot = d;
            out->slot_size[d] = pg->bytes;
            out->slot_bounce[d] = on_disk;
        } else {
            pool = pg->bytes > pool ? pg->bytes : pool;
            pool_disk = on_disk > pool_disk ? on_disk : pool_disk;
        }
    }
    free(order);
    for (int s = best_d; s < out->n_stage_slots; s++) out->slot_size[s] = pool, out->slot_bounce[s] = pool_disk;
    for (int i = 0, rank = 0; i < n; i++)
        if (g[out->stream[i]].slot < 0) out->stream_rank[i] = rank++;
    for (int s = 0; s < out->n_stage_slots; s++) {
        if (o->unified) out->slot_bounce[s] = 0; /* disk reads land in the slot itself */
        out->slot_bytes = out->slot_size[s] > out->slot_bytes ? out->slot_size[s] : out->slot_bytes;
        out->stage_bytes += out->slot_size[s];
        out->host_stage_bytes += out->slot_bounce[s];
    }
    return FERRY_OK;
}

int plan_slot_of(const plan *p, uint64_t q)
{
    uint64_t n = (uint64_t)p->n_streamed, i = q % n;
    int own = p->groups[p->stream[i]].slot;
    if (own >= 0) return own;
    uint64_t per_step = n - (uint64_t)p->n_own_slots, shared = (uint64_t)(p->n_stage_slots - p->n_own_slots);
    return p->n_own_slots + (int)(((q / n) * per_step + (uint64_t)p->stream_rank[i]) % shared);
}

/* Places the groups by weight budgets (shared: a unified backend's device
 * tier also takes from the host budget) and sizes the working memory, the
 * KV pool at --kv-memory or its floor. */
static ferry_status place_all(const plan_model *m, const uint64_t *unit_bytes, const plan_opts *o, bool shared, plan *out)
{
    memset(out, 0, sizeof *out);
    out->opts = *o;
    if (o->group_size < 1) return ferry_fail(FERRY_ERR_INVALID, "--group-size must be >= 1 (got %d)", o->group_size);
    if (o->prefetch < 0)
        return ferry_fail(FERRY_ERR_INVALID, "--prefetch must be >= 1, or 0 for the planner's (got %d)", o->prefetch);
    int n_layer_groups = (m->n_layers + o->group_size - 1) / o->group_size;
    int n_expert_groups = m->n_moe_layers * m->n_experts;
    out->first_expert = n_layer_groups + 2;
    out->n_groups = n_layer_groups + 2 + n_expert_groups;
    out->groups = calloc((size_t)out->n_groups, sizeof *out->groups);
    if (!out->groups) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");

    plan_group *g = out->groups;
    g[0] = (plan_group){GROUP_EMBED, 0, 0, 0, unit_bytes[0], TIER_DEVICE, -1};
    for (int i = 0; i < n_layer_groups; i++) {
        plan_group *lg = &g[1 + i];
        lg->kind = GROUP_LAYERS;
        lg->first_layer = i * o->group_size;
        lg->n_layers = m->n_layers - lg->first_layer < o->group_size ? m->n_layers - lg->first_layer : o->group_size;
        for (int l = 0; l < lg->n_layers; l++) lg->bytes += unit_bytes[1 + lg->first_layer + l];
    }
    g[n_layer_groups + 1] = (plan_group){GROUP_HEAD, 0, 0, 0, unit_bytes[m->n_layers + 1], TIER_DEVICE, -1};
    for (int i = 0; i < n_expert_groups; i++)
        g[out->first_expert + i] = (plan_group){GROUP_EXPERT, m->moe_layers[i / m->n_experts], 1, i % m->n_experts,
                                                unit_bytes[m->n_layers + 2 + i], TIER_DEVICE, -1};

    /* layer groups and head, then experts (plan.h), then the embedding */
    uint64_t left[2] = {o->budget[0], o->budget[1]};
    for (int i = 1; i < out->n_groups; i++) place(&g[i], left, shared);
    place(&g[0], left, shared);

    for (int i = 0; i < out->n_groups; i++) {
        out->tier_bytes[g[i].tier] += g[i].bytes;
        if (g[i].kind != GROUP_EMBED && g[i].kind != GROUP_EXPERT && g[i].tier != TIER_DEVICE) out->n_streamed++;
    }
    ferry_status st = size_stage_slots(out, o);
    if (st != FERRY_OK) {
        plan_free(out);
        return st;
    }
    size_expert_slots(m, o, out);
    uint64_t per_token = 2ull * (uint64_t)m->dim + 2ull * (uint64_t)m->q_dim + 2ull * (uint64_t)m->kv_dim +
                         2ull * (uint64_t)m->hidden;
    if (m->n_experts) /* engine_impl.h: router logits, route lists, an expert's rows and its outputs */
        per_token += (uint64_t)m->n_experts + 3ull * (uint64_t)m->top_k + (uint64_t)m->dim +
                     2ull * (uint64_t)m->moe_hidden + (uint64_t)m->top_k * (uint64_t)m->dim;
    out->act_bytes = (uint64_t)o->max_step_tokens * per_token * 4 +
                     (uint64_t)o->n_seqs * ((uint64_t)m->dim + (uint64_t)m->vocab) * 4;
    out->kv_block_positions = KV_BLOCK_POSITIONS;
    out->kv_block_bytes = 2ull * (uint64_t)m->n_layers * KV_BLOCK_POSITIONS * (uint64_t)m->kv_dim * 4;
    /* the floor here; plan_make grows a default pool once the weights are placed */
    out->kv_blocks = o->kv_memory ? o->kv_memory / out->kv_block_bytes : (uint64_t)kv_blocks_for(o->context);
    if (out->kv_blocks < 1 || out->kv_blocks > INT32_MAX) {
        char a[32], b[32];
        util_fmt_bytes(out->kv_block_bytes, b, sizeof b);
        plan_free(out);
        return ferry_fail(FERRY_ERR_INVALID, "--kv-memory %s: the KV pool needs 1 to %d blocks of %s",
                          util_fmt_bytes(o->kv_memory, a, sizeof a), INT32_MAX, b);
    }
    out->kv_bytes = out->kv_blocks * out->kv_block_bytes;
    return FERRY_OK;
}

void plan_budget_used(const plan *p, const plan_opts *o, uint64_t used[2])
{
    used[0] = o->unified ? 0 : kv_memory_used(p, o);
    used[1] = o->unified ? kv_memory_used(p, o) : p->tier_bytes[TIER_HOST] + p->host_stage_bytes + p->expert_bounce_bytes;
}

/* The least a memory must hold beside the weights, in one line's words. */
static ferry_status refuse_budget(const plan *p, const plan_opts *o, int mem, uint64_t budget, uint64_t used)
{
    char a[32], b[32], c[32], d[32], e[32], f[32], kv[64];
    const char *key = mem == 0 ? "device" : "host";
    if (o->kv_memory) snprintf(kv, sizeof kv, " (--kv-memory)");
    else snprintf(kv, sizeof kv, " (one sequence of %d positions)", o->context);
    if (mem == 1 && !o->unified)
        return ferry_fail(FERRY_ERR_NOMEM,
                          "--max-memory host=%s cannot hold the pinned bounce buffers the disk reads need (%s for "
                          "staging, %s for experts) with every weight on disk; raise host= (or 0: no weights in "
                          "host memory), or lower --prefetch",
                          util_fmt_bytes(budget, a, sizeof a), util_fmt_bytes(p->host_stage_bytes, b, sizeof b),
                          util_fmt_bytes(p->expert_bounce_bytes, c, sizeof c));
    return ferry_fail(FERRY_ERR_NOMEM,
                      "--max-memory %s=%s cannot hold the least this model needs beside its weights, %s: staging %d "
                      "slots %s, KV cache %s%s, activations %s, expert slots %s; raise "
                      "%s= (or 0: no weights there), or lower --prefetch, --context, --batch, --max-step-tokens "
                      "or --expert-cache",
                      key, util_fmt_bytes(budget, a, sizeof a), util_fmt_bytes(used, b, sizeof b), p->n_stage_slots,
                      util_fmt_bytes(p->stage_bytes, c, sizeof c), util_fmt_bytes(p->kv_bytes, d, sizeof d), kv,
                      util_fmt_bytes(p->act_bytes, e, sizeof e), util_fmt_bytes(p->expert_stage_bytes, f, sizeof f),
                      key);
}

static ferry_status resolve_context(const plan_model *m, plan_opts *o)
{
    if (o->context == 0) o->context = m->max_pos < PLAN_DEFAULT_CONTEXT ? m->max_pos : PLAN_DEFAULT_CONTEXT;
    if (o->context < 1 || o->context > m->max_pos)
        return ferry_fail(FERRY_ERR_INVALID, "context of %d positions exceeds max_position_embeddings %d", o->context,
                          m->max_pos);
    return FERRY_OK;
}

ferry_status plan_place(const plan_model *m, const uint64_t *unit_bytes, const plan_opts *opts, plan *out)
{
    memset(out, 0, sizeof *out);
    plan_opts o = *opts;
    FERRY_TRY(resolve_context(m, &o));
    FERRY_TRY(place_all(m, unit_bytes, &o, false, out));
    if (!o.kv_memory) {
        out->kv_blocks = kv_default_blocks(out, &o, PLAN_UNLIMITED);
        out->kv_bytes = out->kv_blocks * out->kv_block_bytes;
    }
    return FERRY_OK;
}

/* Placements plan_make tries at most: each moves weights off a memory or
 * shortens the read-ahead by a group, and a try is microseconds. */
#define PLAN_MAX_ROUNDS 1024

ferry_status plan_make(const plan_model *m, const uint64_t *unit_bytes, const plan_opts *opts, plan *out)
{
    memset(out, 0, sizeof *out);
    plan_opts o = *opts;
    FERRY_TRY(resolve_context(m, &o));
    if (o.unified && o.budget[0] != PLAN_UNLIMITED && o.budget[1] == PLAN_UNLIMITED) {
        char a[32]; /* as the user may write it back */
        uint64_t v = o.budget[0];
        if (v && v % (1ull << 30) == 0) snprintf(a, sizeof a, "%lluGiB", (unsigned long long)(v >> 30));
        else if (v && v % (1ull << 20) == 0) snprintf(a, sizeof a, "%lluMiB", (unsigned long long)(v >> 20));
        else snprintf(a, sizeof a, "%llu", (unsigned long long)v);
        return ferry_fail(FERRY_ERR_INVALID,
                          "--max-memory device=%s: this backend computes from RAM and has no device memory of its "
                          "own, so a device budget alone would bound nothing; write --max-memory %s (the whole RAM "
                          "budget, also host=%s or cpu=%s), or device=%s,host=SIZE to keep at most %s of it resident",
                          a, a, a, a, a, a);
    }
    /* What each budgeted memory must hold (plan.h): [0] device memory, [1]
     * host memory. A budget of 0 keeps weights off that memory and bounds
     * nothing else. Without a device budget, a device with memory of its
     * own keeps resident what fits beside the working memory. */
    uint64_t limit[2] = {o.unified ? 0 : o.budget[0], o.budget[1]};
    bool device_free = !o.unified && o.budget[0] == PLAN_UNLIMITED && o.device_avail != 0;
    if (device_free) limit[0] = o.device_avail;
    /* weights may have at most: unified, the device tier inside the whole */
    const uint64_t wb_all[2] = {o.unified ? (o.budget[0] < o.budget[1] ? o.budget[0] : o.budget[1]) : limit[0],
                                o.budget[1]};
    uint64_t wb[2] = {wb_all[0], wb_all[1]};
    for (int round = 0;; round++) {
        /* each round moves weights off, or shortens the read-ahead: it ends */
        plan_opts po = o;
        po.budget[0] = wb[0];
        po.budget[1] = wb[1];
        FERRY_TRY(place_all(m, unit_bytes, &po, o.unified, out));
        uint64_t used[2];
        plan_budget_used(out, &o, used);
        int over = -1;
        for (int mem = 0; mem < 2 && over < 0; mem++)
            if (limit[mem] != 0 && limit[mem] != PLAN_UNLIMITED && used[mem] > limit[mem]) over = mem;
        if (over < 0) break;
        uint64_t weights = over == 0 ? out->tier_bytes[TIER_DEVICE]
                                     : out->tier_bytes[TIER_HOST] + (o.unified ? out->tier_bytes[TIER_DEVICE] : 0);
        if (!o.prefetch && out->prefetch > PLAN_DEFAULT_PREFETCH && round < PLAN_MAX_ROUNDS) {
            /* the planner's read-ahead beyond its default gives way first, a
             * group at a time: a group kept resident saves its whole read
             * every step, a group more in flight only some disk rate */
            o.readahead_cap = out->prefetch - 1;
            plan_free(out);
            continue;
        }
        if (weights == 0 && !o.prefetch && out->prefetch > 1 && round < PLAN_MAX_ROUNDS) {
            /* every weight is off this memory already: the planner's
             * read-ahead gives way next, one group at a time, down to 1 */
            o.readahead_cap = out->prefetch - 1;
            wb[0] = wb_all[0];
            wb[1] = wb_all[1];
            plan_free(out);
            continue;
        }
        if (weights == 0 || round >= PLAN_MAX_ROUNDS) {
            if (over == 0 && device_free) break; /* plan_check says what the device lacks */
            ferry_status st = refuse_budget(out, &o, over, limit[over], used[over]);
            plan_free(out);
            return st;
        }
        /* move what the excess needs off this memory, and place again: the
         * groups that leave may enlarge the staging slots (another round) */
        uint64_t excess = used[over] - limit[over], keep = weights > excess ? weights - excess : 0;
        wb[over] = keep;
        if (o.unified) wb[0] = wb[0] < keep ? wb[0] : keep;
        plan_free(out);
    }
    if (!o.kv_memory) {
        out->kv_blocks = kv_default_blocks(out, &o, o.unified ? limit[1] : device_free ? 0 : limit[0]);
        out->kv_bytes = out->kv_blocks * out->kv_block_bytes;
    }
    out->opts.budget[0] = o.budget[0];
    out->opts.budget[1] = o.budget[1];
    return FERRY_OK;
}

uint64_t plan_kv_sequences(const plan *p, int n_positions)
{
    return n_positions < 1 ? 0 : p->kv_blocks / (uint64_t)kv_blocks_for(n_positions);
}

int plan_ahead(int prefetch, uint64_t slot_bytes, bool disk)
{
    if (prefetch > 0) return prefetch;
    if (!disk || slot_bytes < PLAN_READAHEAD_MIN_GROUP) return PLAN_DEFAULT_PREFETCH;
    uint64_t want = (PLAN_READAHEAD_BYTES + slot_bytes - 1) / slot_bytes;
    return want > PLAN_DEFAULT_PREFETCH ? (int)want : PLAN_DEFAULT_PREFETCH;
}

void plan_free(plan *p)
{
    free(p->groups);
    free(p->slot_size);
    free(p->slot_bounce);
    free(p->stream);
    free(p->stream_rank);
    memset(p, 0, sizeof *p);
}

ferry_status plan_parse_budgets(const char *s, uint64_t budget[2])
{
    budget[0] = budget[1] = PLAN_UNLIMITED;
    if (!s || !*s) return FERRY_OK;
    if (!strchr(s, '=')) { /* a bare SIZE: the host budget, as accelerate's "cpu" */
        if (util_parse_size(s, &budget[1]) == FERRY_OK) return FERRY_OK;
        budget[1] = PLAN_UNLIMITED;
        return ferry_fail(FERRY_ERR_INVALID, "--max-memory: expected SIZE or device=SIZE,host=SIZE, got '%s'", s);
    }
    bool seen[2] = {false, false};
    const char *p = s;
    while (*p) {
        const char *eq = strchr(p, '=');
        const char *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        if (!eq || eq > end)
            return ferry_fail(FERRY_ERR_INVALID, "--max-memory: expected device=SIZE,host=SIZE, got '%s'", s);
        int t;
        if ((size_t)(eq - p) == 6 && !strncmp(p, "device", 6)) t = 0;
        else if ((size_t)(eq - p) == 4 && !strncmp(p, "host", 4)) t = 1;
        else if ((size_t)(eq - p) == 3 && !strncmp(p, "cpu", 3)) t = 1; /* accelerate's name for host memory */
        else return ferry_fail(FERRY_ERR_INVALID, "--max-memory: unknown tier '%.*s' (expected device, host or cpu)", (int)(eq - p), p);
        if (seen[t])
            return ferry_fail(FERRY_ERR_INVALID, "--max-memory: the %s budget is given twice in '%s' (host and cpu name the same memory)",
                              t ? "host" : "device", s);
        seen[t] = true;
        char val[64];
        size_t n = (size_t)(end - eq - 1);
        if (n >= sizeof val) return ferry_fail(FERRY_ERR_INVALID, "--max-memory: size too long in '%s'", s);
        memcpy(val, eq + 1, n);
        val[n] = '\0';
        ferry_status st = util_parse_size(val, &budget[t]);
        if (st != FERRY_OK) return ferry_fail_context(st, "--max-memory %s", t ? "host" : "device");
        p = *end ? end + 1 : end;
    }
    return FERRY_OK;
}

const char *const plan_mem_kind_names[PLAN_MEM_KINDS] = {"weights", "staging", "kv", "activations", "experts"};

void plan_memory_bytes(const plan *p, int mem, uint64_t out[PLAN_MEM_KINDS])
{
    bool unified = p->opts.unified;
    memset(out, 0, PLAN_MEM_KINDS * sizeof *out);
    if (mem == 0 && unified) return;
    if (mem == 1 && !unified) { /* the host tier and the bounce buffers disk reads land in */
        out[PLAN_MEM_WEIGHTS] = p->tier_bytes[TIER_HOST];
        out[PLAN_MEM_STAGING] = p->host_stage_bytes;
        out[PLAN_MEM_EXPERTS] = p->expert_bounce_bytes;
        return;
    }
    out[PLAN_MEM_WEIGHTS] = p->tier_bytes[TIER_DEVICE] + (unified ? p->tier_bytes[TIER_HOST] : 0);
    out[PLAN_MEM_STAGING] = p->stage_bytes;
    out[PLAN_MEM_KV] = p->kv_bytes;
    out[PLAN_MEM_ACTIVATIONS] = p->act_bytes;
    out[PLAN_MEM_EXPERTS] = p->expert_stage_bytes;
}

void plan_needs(const plan *p, const plan_opts *o, uint64_t *host, uint64_t *device)
{
    uint64_t work = p->stage_bytes + p->expert_stage_bytes + p->kv_bytes + p->act_bytes;
    *device = p->tier_bytes[TIER_DEVICE] + work;
    *host = p->tier_bytes[TIER_HOST] + p->host_stage_bytes + p->expert_bounce_bytes + PLAN_RUNTIME_OVERHEAD;
    if (o->unified) {
        *host += *device;
        *device = *host;
    }
}

ferry_status plan_check(const plan *p, const plan_opts *o, uint64_t host_avail, uint64_t device_avail)
{
    uint64_t host, device;
    plan_needs(p, o, &host, &device);
    char a[32], b[32], c[32], d[32], e[32], f[32], g[32];
    if (host > host_avail)
        return ferry_fail(FERRY_ERR_NOMEM,
                          "the plan needs %s of %s memory (weights: device %s, host %s; staging %s; KV cache %s; "
                          "activations %s) but %s is available; lower --max-memory, --prefetch, --group-size or "
                          "the batch/context",
                          util_fmt_bytes(host, a, sizeof a), "host",
                          util_fmt_bytes(o->unified ? p->tier_bytes[TIER_DEVICE] : 0, b, sizeof b),
                          util_fmt_bytes(p->tier_bytes[TIER_HOST], c, sizeof c),
                          util_fmt_bytes(o->unified ? p->stage_bytes + p->expert_stage_bytes
                                                    : p->host_stage_bytes + p->expert_bounce_bytes, d, sizeof d),
                          util_fmt_bytes(o->unified ? p->kv_bytes : 0, e, sizeof e),
                          util_fmt_bytes(o->unified ? p->act_bytes : 0, f, sizeof f),
                          util_fmt_bytes(host_avail, g, sizeof g));
    if (!o->unified && device > device_avail)
        return ferry_fail(FERRY_ERR_NOMEM,
                          "the plan needs %s of device memory (weights %s; staging %s; KV cache %s; activations %s) "
                          "but %s is free; lower --max-memory device=, --prefetch, --group-size or the batch/context",
                          util_fmt_bytes(device, a, sizeof a), util_fmt_bytes(p->tier_bytes[TIER_DEVICE], b, sizeof b),
                          util_fmt_bytes(p->stage_bytes + p->expert_stage_bytes, c, sizeof c),
                          util_fmt_bytes(p->kv_bytes, d, sizeof d),
                          util_fmt_bytes(p->act_bytes, e, sizeof e), util_fmt_bytes(device_avail, f, sizeof f));
    return FERRY_OK;
}
