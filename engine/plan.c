/*
 * plan.c - see plan.h.
 */
#include "plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "kv.h"

#define RUNTIME_OVERHEAD (96ull << 20) /* code, allocator, small buffers */

const char *tier_name(tier t)
{
    switch (t) {
    case TIER_DEVICE: return "device";
    case TIER_HOST: return "host";
    case TIER_DISK: return "disk";
    default: return "?";
    }
}

static void place(plan_group *g, uint64_t left[2])
{
    for (int t = 0; t < 2; t++) {
        if (g->bytes <= left[t]) {
            g->tier = (tier)t;
            if (left[t] != PLAN_UNLIMITED) left[t] -= g->bytes;
            return;
        }
    }
    g->tier = TIER_DISK;
}

/* The KV pool when --kv-memory is not given (plan.h): half of the memory
 * the KV cache lives in that the rest of the plan leaves free, between one
 * sequence of the whole context (every request that passes request_check
 * can run) and n_seqs of them (more is never used). Half, not all: the
 * rest stays for the page cache the disk tier reads through, other
 * processes, and on a device the second placement (plan_make) that keeps
 * weights resident beside the working memory. Unknown memory: the most. */
static uint64_t kv_default_blocks(const plan *p, const plan_opts *o)
{
    uint64_t floor = (uint64_t)kv_blocks_for(o->context), most = (uint64_t)o->n_seqs * floor;
    uint64_t avail = o->unified ? o->host_avail : o->device_avail, rest = p->stage_bytes + p->expert_stage_bytes + p->act_bytes;
    if (o->unified) rest += p->tier_bytes[TIER_DEVICE] + p->tier_bytes[TIER_HOST] + p->host_stage_bytes + RUNTIME_OVERHEAD;
    else rest += p->tier_bytes[TIER_DEVICE];
    if (avail == 0 || avail == PLAN_UNLIMITED) return most;
    uint64_t afford = avail > rest ? (avail - rest) / 2 / p->kv_block_bytes : 0;
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

static ferry_status place_all(const plan_model *m, const uint64_t *unit_bytes, const plan_opts *o, plan *out)
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
    g[0] = (plan_group){GROUP_EMBED, 0, 0, 0, unit_bytes[0], TIER_DEVICE};
    for (int i = 0; i < n_layer_groups; i++) {
        plan_group *lg = &g[1 + i];
        lg->kind = GROUP_LAYERS;
        lg->first_layer = i * o->group_size;
        lg->n_layers = m->n_layers - lg->first_layer < o->group_size ? m->n_layers - lg->first_layer : o->group_size;
        for (int l = 0; l < lg->n_layers; l++) lg->bytes += unit_bytes[1 + lg->first_layer + l];
    }
    g[n_layer_groups + 1] = (plan_group){GROUP_HEAD, 0, 0, 0, unit_bytes[m->n_layers + 1], TIER_DEVICE};
    for (int i = 0; i < n_expert_groups; i++)
        g[out->first_expert + i] = (plan_group){GROUP_EXPERT, m->moe_layers[i / m->n_experts], 1, i % m->n_experts,
                                                unit_bytes[m->n_layers + 2 + i], TIER_DEVICE};

    /* layer groups and head, then experts (plan.h), then the embedding */
    uint64_t left[2] = {o->budget[0], o->budget[1]};
    for (int i = 1; i < out->n_groups; i++) place(&g[i], left);
    place(&g[0], left);

    for (int i = 0; i < out->n_groups; i++) {
        out->tier_bytes[g[i].tier] += g[i].bytes;
        if (g[i].kind != GROUP_EMBED && g[i].kind != GROUP_EXPERT && g[i].tier != TIER_DEVICE) {
            out->n_streamed++;
            if (g[i].bytes > out->slot_bytes) out->slot_bytes = g[i].bytes;
        }
    }
    uint64_t disk_max = 0;
    for (int i = 0; i < out->n_groups; i++)
        if (g[i].kind != GROUP_EMBED && g[i].kind != GROUP_EXPERT && g[i].tier == TIER_DISK && g[i].bytes > disk_max)
            disk_max = g[i].bytes;
    out->prefetch = plan_ahead(o->prefetch, out->slot_bytes, disk_max > 0);
    out->n_stage_slots = out->n_streamed < out->prefetch + 1 ? out->n_streamed : out->prefetch + 1;
    out->stage_bytes = (uint64_t)out->n_stage_slots * out->slot_bytes;
    /* disk reads land in pinned bounce buffers, one per slot */
    if (!o->unified) out->host_stage_bytes = disk_max ? (uint64_t)out->n_stage_slots * disk_max : 0;
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
    out->kv_blocks = o->kv_memory ? o->kv_memory / out->kv_block_bytes : kv_default_blocks(out, o);
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

ferry_status plan_make(const plan_model *m, const uint64_t *unit_bytes, const plan_opts *opts, plan *out)
{
    memset(out, 0, sizeof *out);
    plan_opts o = *opts;
    if (o.context == 0) o.context = m->max_pos < PLAN_DEFAULT_CONTEXT ? m->max_pos : PLAN_DEFAULT_CONTEXT;
    if (o.context < 1 || o.context > m->max_pos)
        return ferry_fail(FERRY_ERR_INVALID, "context of %d positions exceeds max_position_embeddings %d", o.context,
                          m->max_pos);
    FERRY_TRY(place_all(m, unit_bytes, &o, out));
    if (o.unified || o.budget[0] != PLAN_UNLIMITED || o.device_avail == 0) return FERRY_OK;
    /* No device budget on a device with memory of its own: keep resident
     * what fits beside the working memory, and place again. The working
     * memory of the second plan can only be larger by its staging slots,
     * which the budget leaves room for. */
    uint64_t host_need, dev_need;
    plan_needs(out, &o, &host_need, &dev_need);
    uint64_t work = dev_need - out->tier_bytes[TIER_DEVICE], avail = o.device_avail;
    if (work >= avail || out->tier_bytes[TIER_DEVICE] <= avail - work) return FERRY_OK;
    uint64_t largest = 0, expert = 0;
    for (int g = 0; g < out->n_groups; g++) {
        uint64_t b = out->groups[g].bytes;
        if (out->groups[g].kind == GROUP_EXPERT) expert = b > expert ? b : expert;
        else largest = b > largest ? b : largest;
    }
    uint64_t slots = (uint64_t)(plan_ahead(o.prefetch, largest, true) + 1) * largest;
    if (expert) { /* the expert slots the second plan will want once some experts are off the device */
        uint64_t least = (uint64_t)PLAN_EXPERT_MIN_SLOTS * (uint64_t)m->top_k * expert;
        slots += o.expert_cache > least ? o.expert_cache : least;
    }
    o.budget[0] = avail - work > slots ? avail - work - slots : 0;
    plan_free(out);
    return place_all(m, unit_bytes, &o, out);
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
    memset(p, 0, sizeof *p);
}

ferry_status plan_parse_budgets(const char *s, uint64_t budget[2])
{
    budget[0] = budget[1] = PLAN_UNLIMITED;
    if (!s || !*s) return FERRY_OK;
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
        else return ferry_fail(FERRY_ERR_INVALID, "--max-memory: unknown tier '%.*s' (expected device or host)", (int)(eq - p), p);
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

void plan_needs(const plan *p, const plan_opts *o, uint64_t *host, uint64_t *device)
{
    uint64_t work = p->stage_bytes + p->expert_stage_bytes + p->kv_bytes + p->act_bytes;
    *device = p->tier_bytes[TIER_DEVICE] + work;
    *host = p->tier_bytes[TIER_HOST] + p->host_stage_bytes + p->expert_bounce_bytes + RUNTIME_OVERHEAD;
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

uint64_t plan_host_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return PLAN_UNLIMITED;
    char line[256];
    unsigned long long kb = 0;
    bool found = false;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
            found = true;
            break;
        }
    fclose(f);
    return found ? kb * 1024ull : PLAN_UNLIMITED;
}
