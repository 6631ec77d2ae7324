/*
 * cmd_inspect.c - `ferry inspect`: what a checkpoint holds and whether ferry
 * can run it: architecture and config, files, tensor count, bytes by dtype,
 * a compressed-tensors checkpoint's scheme, the RoPE scaling (type, factor;
 * in JSON also the inverse frequencies the engine rotates by), and the bytes
 * the engine holds after the conversion --weights-dtype / --quantize ask
 * for.
 */
#include <stdio.h>
#include <stdlib.h>

#include "../engine/backend.h"
#include "../engine/base/json.h"
#include "../engine/weights/convert.h"
#include "../engine/weights/model.h"
#include "../engine/weights/quant.h"
#include "../engine/base/util.h"
#include "cli.h"

/* The rope scaling's parameters beyond its type, as config.json names them. */
static void rope_params(strbuf *sb, const rope_config *r, bool json)
{
    const char *sep = ", ", *eq = json ? "\": " : " ", *q = json ? "\"" : "";
    if (r->type == ROPE_DEFAULT) return;
    sb_printf(sb, "%s%sfactor%s%.15g", sep, q, eq, r->factor);
    if (r->type == ROPE_LLAMA3)
        sb_printf(sb, "%s%slow_freq_factor%s%.15g%s%shigh_freq_factor%s%.15g", sep, q, eq, r->low_freq_factor, sep, q,
                  eq, r->high_freq_factor);
    if (r->type == ROPE_YARN)
        sb_printf(sb, "%s%sbeta_fast%s%.15g%s%sbeta_slow%s%.15g%s%struncate%s%s%s%sattention_factor%s%.15g", sep, q,
                  eq, r->beta_fast, sep, q, eq, r->beta_slow, sep, q, eq, r->truncate ? "true" : "false", sep, q, eq,
                  r->attention_factor);
    if (r->original_max_pos)
        sb_printf(sb, "%s%soriginal_max_position_embeddings%s%d", sep, q, eq, r->original_max_pos);
}

/* "rope": the type, its parameters and the table the engine uses. */
static void rope_json(strbuf *sb, const model_config *mc)
{
    sb_puts(sb, ", \"rope\": {\"rope_type\": ");
    sb_json_str(sb, rope_type_name(mc->rope.type));
    rope_params(sb, &mc->rope, true);
    sb_puts(sb, ", \"attention_scaling\": ");
    sb_json_f32(sb, rope_attn_scale(&mc->rope));
    sb_puts(sb, ", \"inv_freq\": [");
    float *inv = malloc((size_t)(mc->head_dim / 2) * sizeof *inv);
    if (!inv) {
        sb->oom = true;
        return;
    }
    rope_inv_freq(&mc->rope, mc->head_dim, inv);
    for (int i = 0; i < mc->head_dim / 2; i++) {
        if (i) sb_puts(sb, ", ");
        sb_json_f32(sb, inv[i]);
    }
    free(inv);
    sb_puts(sb, "]}");
}

int cmd_inspect(const ferry_config *cfg)
{
    convert_opts conv;
    convert_summary sum;
    if (convert_opts_parse(cfg->weights_dtype, cfg->quantize, cfg->quantize_head, &conv) != FERRY_OK)
        return cli_error(EXIT_USAGE, "%s", ferry_errmsg());
    model_config mc;
    st_checkpoint *ck = NULL;
    ferry_status st = model_config_load(cfg->model, &mc);
    if (st == FERRY_OK) st = st_checkpoint_open(cfg->model, &ck);
    model_weights w;
    if (st == FERRY_OK) {
        model_config held = mc; /* mc as the checkpoint says (reported), held as the conversion holds it */
        convert_config(&conv, &held);
        st = model_weights_bind(&held, ck, &w);
        if (st == FERRY_OK) {
            st = convert_model_summary(&held, &w, &conv, &sum);
            model_weights_free(&w);
        }
    }
    if (st != FERRY_OK) {
        st_checkpoint_close(ck);
        return cli_fail(st);
    }
    char ckq[256], conv_s[160], schemes[512];
    model_quant_describe(&mc, ckq, sizeof ckq);
    convert_describe(&conv, conv_s, sizeof conv_s);
    convert_summary_describe(&sum, schemes, sizeof schemes);
    uint64_t by_dtype[DT_COUNT] = {0}, total = 0, blocks = 0; /* blocks: a GGUF's, kept as stored */
    for (size_t i = 0; i < ck->n_tensors; i++) {
        if (ck->tensors[i].blocks) blocks += ck->tensors[i].nbytes;
        else by_dtype[ck->tensors[i].dtype] += ck->tensors[i].nbytes;
        total += ck->tensors[i].nbytes;
    }
    /* a GGUF model: its own tensors by block type, as the file stores them */
    uint64_t gg_bytes[GGUF_TYPES] = {0};
    int gg_count[GGUF_TYPES] = {0};
    for (int p = 0; ck->gguf_model && p < ck->n_gguf_parts; p++)
        for (size_t i = 0; i < gguf_tensor_count(ck->gguf_parts[p]); i++) {
            const gguf_tensor *t = gguf_tensor_at(ck->gguf_parts[p], i);
            if (t->type >= GGUF_TYPES) continue; /* gguf_hf refused those */
            gg_bytes[t->type] += t->nbytes;
            gg_count[t->type]++;
        }
    strbuf sb;
    sb_init(&sb);
    if (cfg->json) {
        sb_puts(&sb, "{\"architecture\": ");
        sb_json_str(&sb, mc.arch_name);
        sb_printf(&sb,
                  ", \"vocab_size\": %d, \"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d, "
                  "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, "
                  "\"max_position_embeddings\": %d, \"rope_theta\": %g, \"rms_norm_eps\": %g, "
                  "\"tie_word_embeddings\": %s, \"sliding_window\": %d, \"files\": %d, \"tensors\": %zu, "
                  "\"bytes\": %llu, ",
                  mc.vocab, mc.dim, mc.hidden, mc.n_layers, mc.n_heads, mc.n_kv_heads, mc.head_dim, mc.max_pos,
                  mc.rope.theta, (double)mc.norm_eps, mc.tied ? "true" : "false", mc.sliding_window,
                  ck->n_files, ck->n_tensors, (unsigned long long)total);
        if (mc.n_experts) {
            sb_printf(&sb, "\"experts\": {\"num_experts\": %d, \"num_experts_per_tok\": %d, "
                           "\"expert_intermediate_size\": %d, \"norm_topk_prob\": %s, \"sparse_layers\": [",
                      mc.n_experts, mc.top_k, mc.moe_hidden, mc.norm_topk ? "true" : "false");
            for (int l = 0, n = 0; l < mc.n_layers; l++)
                if (model_layer_moe(&mc, l)) sb_printf(&sb, "%s%d", n++ ? ", " : "", l);
            sb_puts(&sb, "]}, ");
        }
        sb_puts(&sb, "\"bytes_by_dtype\": {");
        int first = 1;
        for (int d = 0; d < DT_COUNT; d++)
            if (by_dtype[d]) {
                sb_printf(&sb, "%s\"%s\": %llu", first ? "" : ", ", dtype_name((ferry_dtype)d),
                          (unsigned long long)by_dtype[d]);
                first = 0;
            }
        if (blocks) sb_printf(&sb, "%s\"gguf_blocks\": %llu", first ? "" : ", ", (unsigned long long)blocks);
        sb_puts(&sb, "}");
        if (ck->gguf_model) {
            sb_printf(&sb, ", \"gguf\": {\"version\": %u, \"tensors_by_type\": {", gguf_version(ck->gguf));
            for (int t = 0, n = 0; t < GGUF_TYPES; t++)
                if (gg_count[t])
                    sb_printf(&sb, "%s\"%s\": {\"tensors\": %d, \"bytes\": %llu}", n++ ? ", " : "",
                              gguf_type_name((uint32_t)t), gg_count[t], (unsigned long long)gg_bytes[t]);
            sb_puts(&sb, "}}");
        }
        rope_json(&sb, &mc);
        sb_puts(&sb, ", \"checkpoint_quantization\": ");
        sb_json_str(&sb, ckq);
        sb_puts(&sb, ", \"conversion\": ");
        sb_json_str(&sb, conv_s);
        sb_printf(&sb, ", \"engine_bytes\": %llu, \"quantized_tensors\": %d, \"quantized_schemes\": [",
                  (unsigned long long)sum.bytes, sum.n_quantized);
        for (int k = 0; k < sum.n_schemes; k++) {
            char name[48];
            convert_scheme_name(sum.schemes[k].quant, sum.schemes[k].group, name, sizeof name);
            sb_puts(&sb, k ? ", {\"scheme\": " : "{\"scheme\": ");
            sb_json_str(&sb, name);
            sb_printf(&sb, ", \"tensors\": %d}", sum.schemes[k].n_tensors);
        }
        sb_printf(&sb, "], \"regrouped_tensors\": %d", sum.n_regrouped);
        cpu_offer co = backend_cpu_offer();
        sb_puts(&sb, ", \"cpu\": {\"isas\": [");
        for (int i = 0; i < co.n_isas; i++) {
            if (i) sb_puts(&sb, ", ");
            sb_json_str(&sb, co.isas[i]);
        }
        sb_puts(&sb, "], \"activations\": [");
        for (int i = 0; i < co.n_activations; i++) {
            if (i) sb_puts(&sb, ", ");
            sb_json_str(&sb, co.activations[i]);
        }
        sb_puts(&sb, "]}}\n");
    } else {
        char b[32];
        sb_printf(&sb, "architecture   %s\n", mc.arch_name);
        sb_printf(&sb, "layers         %d (hidden %d, intermediate %d)\n", mc.n_layers, mc.dim, mc.hidden);
        sb_printf(&sb, "attention      %d heads, %d kv heads, head_dim %d%s%s\n", mc.n_heads, mc.n_kv_heads,
                  mc.head_dim, mc.qkv_bias ? ", qkv bias" : "", mc.qk_norm ? ", q/k norm" : "");
        if (mc.sliding_window) sb_printf(&sb, "sliding window %d\n", mc.sliding_window);
        if (mc.n_experts)
            sb_printf(&sb, "experts        %d per sparse layer, %d per token (intermediate %d%s), %d of %d layers sparse\n",
                      mc.n_experts, mc.top_k, mc.moe_hidden, mc.norm_topk ? ", top-k renormalized" : "",
                      mc.n_moe_layers, mc.n_layers);
        sb_printf(&sb, "vocab          %d%s\n", mc.vocab, mc.tied ? " (tied embeddings)" : "");
        sb_printf(&sb, "rope_theta     %g, rms_norm_eps %g, max positions %d\n", mc.rope.theta, (double)mc.norm_eps,
                  mc.max_pos);
        sb_printf(&sb, "rope scaling   %s", mc.rope.type == ROPE_DEFAULT ? "none (default)" : rope_type_name(mc.rope.type));
        rope_params(&sb, &mc.rope, false);
        sb_puts(&sb, "\n");
        sb_printf(&sb, "files          %d\n", ck->n_files);
        sb_printf(&sb, "tensors        %zu\n", ck->n_tensors);
        for (int d = 0; d < DT_COUNT; d++)
            if (by_dtype[d])
                sb_printf(&sb, "bytes %-8s %llu (%s)\n", dtype_name((ferry_dtype)d), (unsigned long long)by_dtype[d],
                          util_fmt_bytes(by_dtype[d], b, sizeof b));
        if (blocks)
            sb_printf(&sb, "bytes blocks   %llu (%s)\n", (unsigned long long)blocks, util_fmt_bytes(blocks, b, sizeof b));
        sb_printf(&sb, "bytes total    %llu (%s)\n", (unsigned long long)total, util_fmt_bytes(total, b, sizeof b));
        if (ck->gguf_model) {
            sb_printf(&sb, "gguf           version %u, as stored:", gguf_version(ck->gguf));
            for (int t = 0, n = 0; t < GGUF_TYPES; t++)
                if (gg_count[t])
                    sb_printf(&sb, "%s %s %d tensors %s", n++ ? "," : "", gguf_type_name((uint32_t)t), gg_count[t],
                              util_fmt_bytes(gg_bytes[t], b, sizeof b));
            sb_puts(&sb, "\n");
        }
        sb_printf(&sb, "quantization   %s%s\n", ckq, mc.n_ckpt_schemes == 0 ? "" : mc.ckpt_packed ? " (compressed-tensors, pack-quantized)" : " (compressed-tensors, int-quantized)");
        sb_printf(&sb, "conversion     %s\n", conv_s);
        sb_printf(&sb, "engine bytes   %llu (%s), %d tensors quantized\n", (unsigned long long)sum.bytes,
                  util_fmt_bytes(sum.bytes, b, sizeof b), sum.n_quantized);
        if (sum.n_quantized) sb_printf(&sb, "quantized as   %s\n", schemes);
        if (sum.n_regrouped)
            sb_printf(&sb, "               %d tensors have input columns that %d does not divide: a group that "
                           "divides them instead (docs/quantization.md)\n", sum.n_regrouped, QUANT_INT4_GROUP);
        cpu_offer co = backend_cpu_offer(); /* this machine's, for --cpu-isa and --cpu-activations */
        sb_printf(&sb, "cpu kernels    %s (auto)", co.isas[0]);
        for (int i = 1; i < co.n_isas; i++) sb_printf(&sb, ", %s", co.isas[i]);
        sb_puts(&sb, "; activations");
        for (int i = 0; i < co.n_activations; i++) sb_printf(&sb, "%s %s", i ? "," : "", co.activations[i]);
        sb_puts(&sb, "\n");
    }
    fwrite(sb.data, 1, sb.len, stdout);
    sb_free(&sb);
    st_checkpoint_close(ck);
    return 0;
}
