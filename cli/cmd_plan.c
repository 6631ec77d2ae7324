/*
 * cmd_plan.c - `ferry plan`: where each group would live and what memory the
 * run needs, from the checkpoint headers alone (no weights are read).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/base/json.h"
#include "../engine/base/util.h"
#include "cli.h"

/* Who chose the prefetch depth: the user (--prefetch N) or the planner. */
static const char *prefetch_source(const plan *p)
{
    if (p->opts.prefetch > 0) return "given";
    return p->opts.readahead_cap && p->prefetch == p->opts.readahead_cap ? "planner, shortened for the budget" : "planner";
}

static const char *group_name(const plan_group *g, char *buf, size_t cap)
{
    if (g->kind == GROUP_EMBED) return "embed";
    if (g->kind == GROUP_HEAD) return "head";
    if (g->kind == GROUP_EXPERT) snprintf(buf, cap, "layer %d expert %d", g->first_layer, g->expert);
    else snprintf(buf, cap, "layers %d-%d", g->first_layer, g->first_layer + g->n_layers - 1);
    return buf;
}

/* What the run should peak at in RSS: the host memory it needs, and where
 * the device is the CPU behind a copy stream (cpu-split), its device memory
 * too. An upper bound: the KV pool and activations are touched as used. */
static uint64_t expected_rss(const plan *p, const engine_opts *eo, uint64_t need_host, uint64_t need_dev)
{
    return p->opts.unified || !eo->device || strcmp(eo->device, "cpu-split") ? need_host : need_host + need_dev;
}

static void json_budget(strbuf *sb, uint64_t b)
{
    if (b == PLAN_UNLIMITED) sb_puts(sb, "null");
    else sb_printf(sb, "%llu", (unsigned long long)b);
}

static void print_json(strbuf *sb, const plan *p, const engine_opts *eo, uint64_t need_host, uint64_t need_dev,
                       uint64_t avail, const char *conv)
{
    char name[48];
    sb_puts(sb, "{\"groups\": [");
    for (int g = 0; g < p->n_groups; g++) {
        const plan_group *pg = &p->groups[g];
        sb_printf(sb, "%s{\"group\": %d, \"name\": ", g ? ", " : "", g);
        sb_json_str(sb, group_name(pg, name, sizeof name));
        sb_printf(sb, ", \"first_layer\": %d, \"n_layers\": %d, ",
                  pg->kind == GROUP_LAYERS || pg->kind == GROUP_EXPERT ? pg->first_layer : -1, pg->n_layers);
        if (pg->kind == GROUP_EXPERT) sb_printf(sb, "\"expert\": %d, ", pg->expert);
        sb_printf(sb, "\"tier\": \"%s\", \"bytes\": %llu}", tier_name(pg->tier), (unsigned long long)pg->bytes);
    }
    sb_printf(sb,
              "], \"tier_bytes\": {\"device\": %llu, \"host\": %llu, \"disk\": %llu}, \"streamed_groups\": %d, "
              "\"prefetch\": %d, \"prefetch_source\": \"%s\", "
              "\"working\": {\"staging_slots\": %d, \"slot_bytes\": %llu, \"staging_bytes\": %llu, "
              "\"host_staging_bytes\": %llu, \"expert_slots\": %d, \"expert_slot_bytes\": %llu, "
              "\"expert_slots_bytes\": %llu, \"expert_bounce_bytes\": %llu, \"kv_bytes\": %llu, "
              "\"activation_bytes\": %llu}, "
              "\"kv_pool\": {\"blocks\": %llu, \"block_positions\": %d, \"positions\": %llu, \"bytes\": %llu, "
              "\"sequences_of_context\": %llu}, "
              "\"sequences\": %d, \"context\": %d, "
              "\"needs\": {\"host\": %llu, \"device\": %llu}, \"host_available\": %llu, \"fits\": %s, "
              "\"conversion\": ",
              (unsigned long long)p->tier_bytes[TIER_DEVICE], (unsigned long long)p->tier_bytes[TIER_HOST],
              (unsigned long long)p->tier_bytes[TIER_DISK], p->n_streamed, p->prefetch, prefetch_source(p),
              p->n_stage_slots,
              (unsigned long long)p->slot_bytes, (unsigned long long)p->stage_bytes,
              (unsigned long long)p->host_stage_bytes, p->n_expert_slots, (unsigned long long)p->expert_slot_bytes,
              (unsigned long long)p->expert_stage_bytes, (unsigned long long)p->expert_bounce_bytes,
              (unsigned long long)p->kv_bytes,
              (unsigned long long)p->act_bytes, (unsigned long long)p->kv_blocks, p->kv_block_positions,
              (unsigned long long)(p->kv_blocks * p->kv_block_positions), (unsigned long long)p->kv_bytes,
              (unsigned long long)plan_kv_sequences(p, p->opts.context), p->opts.n_seqs, p->opts.context, (unsigned long long)need_host,
              (unsigned long long)need_dev, (unsigned long long)avail, need_host <= avail ? "true" : "false");
    sb_json_str(sb, conv);
    sb_puts(sb, ", \"slot_sizes\": [");
    for (int i = 0; i < p->n_stage_slots; i++)
        sb_printf(sb, "%s%llu", i ? ", " : "", (unsigned long long)p->slot_size[i]);
    uint64_t used[2];
    plan_budget_used(p, &p->opts, used);
    sb_printf(sb, "], \"own_slots\": %d, \"budget\": {\"scope\": \"%s\", \"device\": ", p->n_own_slots,
              eo->budget_weights_only ? "weights" : "all");
    json_budget(sb, p->opts.budget[0]);
    sb_puts(sb, ", \"host\": ");
    json_budget(sb, p->opts.budget[1]);
    sb_printf(sb, ", \"used\": {\"device\": %llu, \"host\": %llu}}, \"expected_peak_rss\": %llu}\n",
              (unsigned long long)used[0], (unsigned long long)used[1],
              (unsigned long long)expected_rss(p, eo, need_host, need_dev));
}

static void print_text(strbuf *sb, const plan *p, const engine_opts *eo, uint64_t need_host, uint64_t need_dev,
                       uint64_t avail)
{
    char name[48], b1[32], b2[32], b3[32], b4[32];
    sb_printf(sb, "%-5s %-16s %-7s %14s\n", "group", "units", "tier", "bytes");
    for (int g = 0; g < p->n_groups; g++) {
        const plan_group *pg = &p->groups[g];
        if (pg->kind == GROUP_EXPERT) { /* a layer's experts on one line: how many on each tier */
            int end = g, on[TIER_COUNT] = {0};
            uint64_t bytes = 0;
            for (; end < p->n_groups && p->groups[end].first_layer == pg->first_layer; end++) {
                on[p->groups[end].tier]++;
                bytes += p->groups[end].bytes;
            }
            char range[24];
            snprintf(range, sizeof range, "%d-%d", g, end - 1);
            snprintf(name, sizeof name, "layer %d experts", pg->first_layer);
            sb_printf(sb, "%-5s %-16s %-7s %14llu  %d x %s: device %d, host %d, disk %d\n", range, name,
                      on[TIER_DEVICE] == end - g ? "device" : on[TIER_HOST] == end - g ? "host"
                                                           : on[TIER_DISK] == end - g ? "disk" : "mixed",
                      (unsigned long long)bytes, end - g, util_fmt_bytes(pg->bytes, b1, sizeof b1), on[TIER_DEVICE],
                      on[TIER_HOST], on[TIER_DISK]);
            g = end - 1;
            continue;
        }
        sb_printf(sb, "%-5d %-16s %-7s %14llu  %s\n", g, group_name(pg, name, sizeof name), tier_name(pg->tier),
                  (unsigned long long)pg->bytes, util_fmt_bytes(pg->bytes, b1, sizeof b1));
    }
    sb_printf(sb, "\nweights   device %s, host %s, disk %s (%d groups streamed per step)\n",
              util_fmt_bytes(p->tier_bytes[TIER_DEVICE], b1, sizeof b1),
              util_fmt_bytes(p->tier_bytes[TIER_HOST], b2, sizeof b2),
              util_fmt_bytes(p->tier_bytes[TIER_DISK], b3, sizeof b3), p->n_streamed);
    if (p->n_own_slots) /* the largest groups in slots of their own, the rest sharing slots of their largest */
        sb_printf(sb, "working   staging %d slots = %s (%d of their own, the largest %s; %d shared of %s)",
                  p->n_stage_slots, util_fmt_bytes(p->stage_bytes, b2, sizeof b2), p->n_own_slots,
                  util_fmt_bytes(p->slot_bytes, b1, sizeof b1), p->n_stage_slots - p->n_own_slots,
                  util_fmt_bytes(p->slot_size[p->n_stage_slots - 1], b3, sizeof b3));
    else
        sb_printf(sb, "working   staging %d x %s = %s", p->n_stage_slots, util_fmt_bytes(p->slot_bytes, b1, sizeof b1),
                  util_fmt_bytes(p->stage_bytes, b2, sizeof b2));
    if (p->n_streamed && p->opts.prefetch > 0)
        sb_printf(sb, " (prefetch %d: --prefetch, as given)", p->prefetch);
    else if (p->n_streamed && p->opts.readahead_cap && p->prefetch == p->opts.readahead_cap)
        sb_printf(sb, " (prefetch %d: the planner's, shortened to fit --max-memory)", p->prefetch);
    else if (p->n_streamed && p->prefetch > PLAN_DEFAULT_PREFETCH)
        sb_printf(sb, " (prefetch %d: the planner's, to read %s ahead from disk)", p->prefetch,
                  util_fmt_bytes(PLAN_READAHEAD_BYTES, b3, sizeof b3));
    else if (p->n_streamed)
        sb_printf(sb, " (prefetch %d: the planner's default)", p->prefetch);
    if (p->host_stage_bytes) sb_printf(sb, " (+ %s pinned host)", util_fmt_bytes(p->host_stage_bytes, b3, sizeof b3));
    if (p->n_expert_slots) {
        sb_printf(sb, ", expert slots %d x %s = %s", p->n_expert_slots,
                  util_fmt_bytes(p->expert_slot_bytes, b1, sizeof b1), util_fmt_bytes(p->expert_stage_bytes, b2, sizeof b2));
        if (p->expert_bounce_bytes)
            sb_printf(sb, " (+ %s pinned host)", util_fmt_bytes(p->expert_bounce_bytes, b3, sizeof b3));
    }
    sb_printf(sb, ", activations %s\n", util_fmt_bytes(p->act_bytes, b2, sizeof b2));
    sb_printf(sb, "KV pool   %llu blocks x %d positions = %llu positions, %s; holds %llu sequences of %d positions "
                  "(--batch %d run at once)\n",
              (unsigned long long)p->kv_blocks, p->kv_block_positions,
              (unsigned long long)(p->kv_blocks * p->kv_block_positions), util_fmt_bytes(p->kv_bytes, b1, sizeof b1),
              (unsigned long long)plan_kv_sequences(p, p->opts.context), p->opts.context, p->opts.n_seqs);
    uint64_t used[2];
    plan_budget_used(p, &p->opts, used);
    for (int m = p->opts.unified ? 1 : 0; m < 2; m++) {
        uint64_t b = p->opts.budget[m];
        const char *key = m ? "host" : "device";
        if (b == PLAN_UNLIMITED) continue;
        if (eo->budget_weights_only)
            sb_printf(sb, "budget    %s=%s bounds the %s tier's weights (--max-memory-scope weights)\n", key,
                      util_fmt_bytes(b, b1, sizeof b1), key);
        else if (b == 0)
            sb_printf(sb, "budget    %s=0: no weights in %s memory; the working memory there takes %s\n", key, key,
                      util_fmt_bytes(used[m], b2, sizeof b2));
        else
            sb_printf(sb, "budget    %s=%s: the model takes %s of it%s\n", key, util_fmt_bytes(b, b1, sizeof b1),
                      util_fmt_bytes(used[m], b2, sizeof b2),
                      p->opts.unified ? " (weights, staging, KV cache, activations: all in RAM)" : "");
    }
    sb_printf(sb, "peak RSS  about %s expected (the process's own ~%s included)\n",
              util_fmt_bytes(expected_rss(p, eo, need_host, need_dev), b1, sizeof b1),
              util_fmt_bytes(PLAN_RUNTIME_OVERHEAD, b4, sizeof b4));
    if (p->opts.unified)
        sb_printf(sb, "needs     %s of RAM; %s available: %s\n", util_fmt_bytes(need_host, b1, sizeof b1),
                  util_fmt_bytes(avail, b4, sizeof b4), need_host <= avail ? "fits" : "DOES NOT FIT");
    else
        sb_printf(sb, "needs     %s of host RAM (%s available), %s of device memory\n",
                  util_fmt_bytes(need_host, b1, sizeof b1), util_fmt_bytes(avail, b4, sizeof b4),
                  util_fmt_bytes(need_dev, b2, sizeof b2));
}

/* The plan `serve` would run with the same flags: engine_plan takes the
 * path engine_open takes. */
int cmd_plan(const ferry_config *cfg)
{
    engine_opts eo;
    int rc = cli_engine_opts(cfg, &eo);
    if (rc) return rc;
    plan p;
    plan_opts po;
    ferry_status st = engine_plan(&eo, &p, &po);
    if (st != FERRY_OK) return cli_fail(st);
    uint64_t need_host, need_dev;
    plan_needs(&p, &po, &need_host, &need_dev);
    uint64_t avail = util_mem_available();
    strbuf sb;
    sb_init(&sb);
    char conv[160];
    convert_describe(&eo.convert, conv, sizeof conv);
    if (cfg->json) {
        print_json(&sb, &p, &eo, need_host, need_dev, avail, conv);
    } else {
        print_text(&sb, &p, &eo, need_host, need_dev, avail);
        sb_printf(&sb, "convert   %s (bytes above are after it)\n", conv);
    }
    fwrite(sb.data, 1, sb.len, stdout);
    sb_free(&sb);
    plan_free(&p);
    return 0;
}
