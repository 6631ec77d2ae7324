/*
 * test_config.c - settings (config/config.h, config/settings.def) and the
 * size helpers of engine/util.h.
 *
 * Covers: every default of settings.def as config_defaults leaves it; lookup
 * by name with '-' or '_'; config_set per type, accepting the documented
 * spellings and rejecting the rest with a message naming the flag; config_given
 * marking only explicit settings; valid ranges and words; names for typos;
 * the JSON config file (types, lines, comments, duplicates, secrets) and
 * the environment in precedence; --print's JSON; util_parse_size and
 * util_fmt_bytes.
 */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../config/config.h"
#include "../../engine/base/util.h"
#include "../../engine/engine.h"
#include "check.h"

static void test_defaults(void)
{
    ferry_config cfg;
    memset(&cfg, 0xA5, sizeof cfg); /* config_defaults must not rely on zeroed memory */
    config_defaults(&cfg);
    CHECK(cfg.model == NULL);
    CHECK_EQ_STR(cfg.device, "cpu");
    CHECK_EQ_INT(cfg.threads, 0);
    CHECK(cfg.cpu_isa && !strcmp(cfg.cpu_isa, "auto"));
    CHECK(cfg.cpu_activations && !strcmp(cfg.cpu_activations, "exact"));
    CHECK(cfg.prompt_ids == NULL);
    CHECK(cfg.prompt == NULL);
    CHECK(cfg.system == NULL);
    CHECK(cfg.tokenizer == NULL);
    CHECK_EQ_INT(cfg.max_new_tokens, 16);
    CHECK(cfg.temperature == 0.0);
    CHECK_EQ_INT(cfg.top_k, 0);
    CHECK(cfg.top_p == 1.0);
    CHECK_EQ_U64(cfg.seed, 0);
    CHECK(cfg.json == false);
    CHECK(cfg.dump_logits == NULL);
    CHECK(cfg.out == NULL);
    CHECK_EQ_STR(cfg.arch, "llama");
    CHECK_EQ_STR(cfg.preset, "tiny");
    CHECK(cfg.dtype == NULL);
    CHECK_EQ_U64(cfg.shard_size, 2147483648ull);
    CHECK_EQ_INT(cfg.layers, 0);
    CHECK_EQ_INT(cfg.kv_heads, 0);
    CHECK(cfg.tied == false);
    CHECK_EQ_INT(cfg.sliding_window, 0);
    CHECK_EQ_INT(cfg.batch, 64);
    CHECK_EQ_INT(cfg.steps, 8);
    CHECK_EQ_INT(cfg.prompt_len, 128);
    CHECK(cfg.max_memory == NULL);
    CHECK(cfg.offload_dir == NULL);
    CHECK_EQ_STR(cfg.max_memory_scope, "all");
    CHECK_EQ_INT(cfg.admin_max_connections, 32);
    CHECK_EQ_INT(cfg.grpc_max_resets, 200);
    CHECK_EQ_INT(cfg.group_size, 1);
    CHECK_EQ_INT(cfg.prefetch, 0); /* the planner's */
    CHECK_EQ_INT(cfg.max_step_tokens, 512);
    CHECK_EQ_INT(cfg.context, 0);
    CHECK_EQ_U64(cfg.kv_memory, 0);
    CHECK(cfg.trace == NULL);
    CHECK_EQ_INT(cfg.http_port, 8000);
    CHECK_EQ_INT(cfg.grpc_port, 8001);
    CHECK_EQ_INT(cfg.drain_timeout, 30);
    CHECK_EQ_STR(cfg.host, "0.0.0.0");
    CHECK(cfg.name == NULL);
    CHECK_EQ_U64(cfg.max_body, 64ull << 20);
    CHECK_EQ_INT(cfg.max_queued, 64);
    CHECK_EQ_U64(cfg.request_memory, 1ull << 30);
    CHECK(cfg.verify_reads == true);
    CHECK(cfg.weights_dtype == NULL);
    CHECK(cfg.quantize == NULL);
    CHECK(cfg.quantize_head == false);
    CHECK_EQ_INT(cfg.request_timeout, 30);
    CHECK_EQ_INT(cfg.max_connections, 2048);
    CHECK_EQ_INT(cfg.max_connections_per_ip, 256);
    CHECK_EQ_INT(cfg.grpc_max_streams, 128);
    CHECK_EQ_U64(cfg.max_header, 32ull << 10);
    CHECK_EQ_INT(cfg.connection_timeout, 60);
    CHECK_EQ_INT(cfg.max_prompt_tokens, 0);
    CHECK_EQ_INT(cfg.max_output_tokens, 4096);
    CHECK_EQ_U64(cfg.max_text_bytes, 1ull << 20);
    CHECK_EQ_INT(cfg.admin_port, 8003);
    CHECK_EQ_STR(cfg.admin_host, "127.0.0.1");
    CHECK(cfg.admin_token_file == NULL);
    CHECK(cfg.export_dir == NULL);
    CHECK_EQ_STR(cfg.layout, "converted");
    CHECK_EQ_U64(cfg.max_shard_size, 5000000000ull);
    CHECK(cfg.overwrite == false);
    CHECK(cfg.text == NULL);
    CHECK(cfg.file == NULL);
    CHECK(cfg.add_special == false);
    CHECK(cfg.ids == NULL);
    for (int i = 0; i < SETTING_COUNT; i++) {
        if (config_given(&cfg, i)) fprintf(stderr, "default of %s counted as given\n", config_settings[i].name);
        CHECK(!config_given(&cfg, i));
    }
    CHECK_EQ_U64(cfg.expert_cache, 0);
    CHECK(cfg.expert_prefetch == false);
    CHECK_EQ_STR(cfg.decode_input, "greedy");
    CHECK(cfg.config == NULL);
    CHECK(cfg.print == false);
    CHECK(cfg.docs == false);
    CHECK(cfg.admin_token == NULL);
    CHECK(cfg.config_file == NULL);
    CHECK(cfg.override_generation_config == NULL);
    for (int i = 0; i < SETTING_COUNT; i++) CHECK(cfg.source[i] == SOURCE_DEFAULT);
    CHECK_EQ_INT(SETTING_COUNT, 79); /* a new setting needs a default check above */
}

/* The engine's own defaults (engine_opts_init: the engine reads no
 * settings) are the settings' defaults, so a library user and the
 * commands get the same engine. */
static void test_engine_defaults(void)
{
    ferry_config cfg;
    config_defaults(&cfg);
    engine_opts eo;
    engine_opts_init(&eo);
    CHECK_EQ_STR(eo.device, cfg.device);
    CHECK_EQ_INT(eo.threads, (int)cfg.threads);
    CHECK_EQ_STR(eo.cpu_isa, cfg.cpu_isa);
    CHECK_EQ_STR(eo.cpu_activations, cfg.cpu_activations);
    CHECK_EQ_INT(eo.max_seqs, (int)cfg.batch);
    CHECK_EQ_INT(eo.max_ctx, (int)cfg.context);
    CHECK_EQ_INT(eo.max_step_tokens, (int)cfg.max_step_tokens);
    CHECK_EQ_INT(eo.group_size, (int)cfg.group_size);
    CHECK_EQ_INT(eo.prefetch, (int)cfg.prefetch);
    CHECK(eo.verify_reads == cfg.verify_reads);
    CHECK_EQ_U64(eo.kv_memory, cfg.kv_memory);
    CHECK_EQ_U64(eo.expert_cache, cfg.expert_cache);
    CHECK(eo.expert_prefetch == cfg.expert_prefetch);
    CHECK(cfg.max_memory == NULL && eo.budget[0] == PLAN_UNLIMITED && eo.budget[1] == PLAN_UNLIMITED);
}

static void test_find(void)
{
    CHECK_EQ_INT(config_find("max-new-tokens"), SETTING_max_new_tokens);
    CHECK_EQ_INT(config_find("max_new_tokens"), SETTING_max_new_tokens);
    CHECK_EQ_INT(config_find("model"), SETTING_model);
    CHECK_EQ_INT(config_find("prompt-len"), SETTING_prompt_len);
    CHECK_EQ_INT(config_find("max-new-token"), -1);
    CHECK_EQ_INT(config_find("max-new-tokens-"), -1);
    CHECK_EQ_INT(config_find("maxnewtokens"), -1);
    CHECK_EQ_INT(config_find("--max-new-tokens"), -1);
    CHECK_EQ_INT(config_find("bogus"), -1);
    CHECK_EQ_INT(config_find(""), -1);

    /* every setting is found under its own name and under its flag */
    char flag[64];
    for (int i = 0; i < SETTING_COUNT; i++) {
        CHECK_EQ_INT(config_find(config_settings[i].name), i);
        CHECK_EQ_INT(config_find(config_flag(i, flag, sizeof flag) + 2), i);
    }
    CHECK_EQ_STR(config_flag(SETTING_max_new_tokens, flag, sizeof flag), "--max-new-tokens");
}

static void test_set(void)
{
    ferry_config cfg;
    config_defaults(&cfg);

    /* INT */
    CHECK_STATUS(config_set(&cfg, SETTING_max_new_tokens, "12x", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--max-new-tokens");
    CHECK_MSG_HAS("12x");
    CHECK_STATUS(config_set(&cfg, SETTING_max_new_tokens, "", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--max-new-tokens");
    CHECK_STATUS(config_set(&cfg, SETTING_max_new_tokens, "1.5", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_STATUS(config_set(&cfg, SETTING_max_new_tokens, "99999999999", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--max-new-tokens");
    CHECK_STATUS(config_set(&cfg, SETTING_max_new_tokens, "99999999999999999999999", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_EQ_INT(cfg.max_new_tokens, 16); /* failures leave the value alone */
    CHECK(!config_given(&cfg, SETTING_max_new_tokens));
    CHECK_STATUS(config_set(&cfg, SETTING_max_new_tokens, "32", SOURCE_FLAG, 0), FERRY_OK);
    CHECK_EQ_INT(cfg.max_new_tokens, 32);
    CHECK(config_given(&cfg, SETTING_max_new_tokens));
    CHECK_STATUS(config_set(&cfg, SETTING_top_k, "-3", SOURCE_FLAG, 0), FERRY_ERR_INVALID); /* valid: "0.." */
    CHECK_MSG_HAS("--top-k must be >= 0 (got -3)");
    CHECK_STATUS(config_set(&cfg, SETTING_top_k, "3", SOURCE_FLAG, 0), FERRY_OK);
    CHECK_EQ_INT(cfg.top_k, 3);

    /* FLOAT */
    CHECK_STATUS(config_set(&cfg, SETTING_temperature, "abc", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--temperature");
    CHECK_STATUS(config_set(&cfg, SETTING_temperature, "nan", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--temperature");
    CHECK_STATUS(config_set(&cfg, SETTING_temperature, "inf", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_STATUS(config_set(&cfg, SETTING_temperature, "-infinity", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_STATUS(config_set(&cfg, SETTING_temperature, "1e999", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_STATUS(config_set(&cfg, SETTING_temperature, "", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_STATUS(config_set(&cfg, SETTING_temperature, "0.7x", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK(!config_given(&cfg, SETTING_temperature));
    CHECK_STATUS(config_set(&cfg, SETTING_temperature, "0.7", SOURCE_FLAG, 0), FERRY_OK);
    CHECK(cfg.temperature == 0.7);
    CHECK(config_given(&cfg, SETTING_temperature));
    CHECK_STATUS(config_set(&cfg, SETTING_top_p, "1e-1", SOURCE_FLAG, 0), FERRY_OK);
    CHECK(cfg.top_p == 0.1);

    /* BOOL */
    static const char *const yes[] = {"true", "yes", "1", "TRUE", "Yes"};
    static const char *const no[] = {"false", "no", "0", "False", "NO"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        cfg.json = false;
        CHECK_STATUS(config_set(&cfg, SETTING_json, yes[i], SOURCE_FLAG, 0), FERRY_OK);
        CHECK(cfg.json == true);
        CHECK_STATUS(config_set(&cfg, SETTING_json, no[i], SOURCE_FLAG, 0), FERRY_OK);
        CHECK(cfg.json == false);
    }
    CHECK_STATUS(config_set(&cfg, SETTING_tied, "maybe", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--tied");
    CHECK_MSG_HAS("maybe");
    CHECK_STATUS(config_set(&cfg, SETTING_tied, "", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_STATUS(config_set(&cfg, SETTING_tied, "2", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK(!config_given(&cfg, SETTING_tied));

    /* SIZE */
    CHECK_STATUS(config_set(&cfg, SETTING_shard_size, "512MiB", SOURCE_FLAG, 0), FERRY_OK);
    CHECK_EQ_U64(cfg.shard_size, 512ull << 20);
    CHECK_STATUS(config_set(&cfg, SETTING_shard_size, "lots", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--shard-size");
    CHECK_MSG_HAS("lots");
    CHECK_EQ_U64(cfg.shard_size, 512ull << 20);

    /* U64 */
    CHECK_STATUS(config_set(&cfg, SETTING_seed, "18446744073709551615", SOURCE_FLAG, 0), FERRY_OK);
    CHECK_EQ_U64(cfg.seed, UINT64_MAX);
    CHECK_STATUS(config_set(&cfg, SETTING_seed, "-1", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--seed");
    CHECK_STATUS(config_set(&cfg, SETTING_seed, "18446744073709551616", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_STATUS(config_set(&cfg, SETTING_seed, "7z", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_EQ_U64(cfg.seed, UINT64_MAX);

    /* STR */
    CHECK_STATUS(config_set(&cfg, SETTING_device, "cuda", SOURCE_FLAG, 0), FERRY_OK);
    CHECK_EQ_STR(cfg.device, "cuda");
    CHECK_STATUS(config_set(&cfg, SETTING_model, "", SOURCE_FLAG, 0), FERRY_OK);
    CHECK_EQ_STR(cfg.model, "");

    /* config_given holds for exactly the successful config_set calls above */
    for (int i = 0; i < SETTING_COUNT; i++) {
        bool want = i == SETTING_max_new_tokens || i == SETTING_top_k || i == SETTING_temperature ||
                    i == SETTING_top_p || i == SETTING_json || i == SETTING_shard_size || i == SETTING_seed ||
                    i == SETTING_device || i == SETTING_model;
        if (config_given(&cfg, i) != want) fprintf(stderr, "given[%s] is %d\n", config_settings[i].name, config_given(&cfg, i));
        CHECK(config_given(&cfg, i) == want);
    }
}

/* ---- ranges, names, sources ------------------------------------------- */

static void test_ranges(void)
{
    ferry_config cfg;
    config_defaults(&cfg);
    /* both ends are valid, one past either end is not, and the message says
     * which flag, what range and what was given */
    CHECK_STATUS(config_set(&cfg, SETTING_threads, "0", SOURCE_FLAG, 0), FERRY_OK);
    CHECK_STATUS(config_set(&cfg, SETTING_threads, "1024", SOURCE_FLAG, 0), FERRY_OK);
    CHECK_STATUS(config_set(&cfg, SETTING_threads, "1025", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--threads must be in 0..1024 (got 1025)");
    CHECK_STATUS(config_set(&cfg, SETTING_threads, "-1", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_EQ_INT(cfg.threads, 1024);
    CHECK_STATUS(config_set(&cfg, SETTING_grpc_port, "-1", SOURCE_FLAG, 0), FERRY_OK);
    CHECK_STATUS(config_set(&cfg, SETTING_grpc_port, "-2", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_STATUS(config_set(&cfg, SETTING_http_port, "65536", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--http-port must be in 0..65535 (got 65536)");
    /* FLOAT: top_p in 0..1 */
    CHECK_STATUS(config_set(&cfg, SETTING_top_p, "1.0000001", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_STATUS(config_set(&cfg, SETTING_temperature, "-0.5", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--temperature must be in 0..1e30 (got -0.5)");
    /* SIZE: "1.." refuses 0 in any spelling */
    CHECK_STATUS(config_set(&cfg, SETTING_max_body, "0", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--max-body must be >= 1");
    CHECK_STATUS(config_set(&cfg, SETTING_max_body, "0KiB", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_STATUS(config_set(&cfg, SETTING_max_body, "1", SOURCE_FLAG, 0), FERRY_OK);
    /* words: exact, and a near miss suggested (a swap is one edit) */
    CHECK_STATUS(config_set(&cfg, SETTING_device, "cpu-split", SOURCE_FLAG, 0), FERRY_OK);
    CHECK_STATUS(config_set(&cfg, SETTING_device, "cdua", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--device must be one of cpu, cpu-split, cuda (got 'cdua'; did you mean cuda?)");
    CHECK_STATUS(config_set(&cfg, SETTING_device, "tpu-v5", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("(got 'tpu-v5')");
    CHECK_STATUS(config_set(&cfg, SETTING_device, "CUDA", SOURCE_FLAG, 0), FERRY_ERR_INVALID); /* words are exact */
    CHECK_STATUS(config_set(&cfg, SETTING_device, "", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_EQ_STR(cfg.device, "cpu-split");
    CHECK_STATUS(config_set(&cfg, SETTING_quantize, "int4", SOURCE_FLAG, 0), FERRY_OK);
    /* "" for a word whose default is "not set" is "not set" (--quantize "") */
    CHECK_STATUS(config_set(&cfg, SETTING_quantize, "", SOURCE_FLAG, 0), FERRY_OK);
    CHECK_STATUS(config_set(&cfg, SETTING_weights_dtype, "", SOURCE_FLAG, 0), FERRY_OK);
    /* an excluded low end: top_p in (0, 1] as sampling wants it */
    CHECK_STATUS(config_set(&cfg, SETTING_top_p, "0", SOURCE_FLAG, 0), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--top-p must be > 0 and <= 1 (got 0)");
    CHECK_STATUS(config_set(&cfg, SETTING_top_p, "1e-9", SOURCE_FLAG, 0), FERRY_OK);
    CHECK_STATUS(config_set(&cfg, SETTING_temperature, "1e39", SOURCE_FLAG, 0), FERRY_ERR_INVALID); /* not a float */
    /* no upper bound where the code has none */
    CHECK_STATUS(config_set(&cfg, SETTING_prefetch, "100", SOURCE_FLAG, 0), FERRY_OK);
    CHECK_STATUS(config_set(&cfg, SETTING_group_size, "5000", SOURCE_FLAG, 0), FERRY_OK);

    /* the definition itself: every range well-formed for its type, every
     * default inside its own range (config_defaults asserts it too) */
    for (int i = 0; i < SETTING_COUNT; i++) {
        const setting_def *d = &config_settings[i];
        CHECK(d->doc && *d->doc);
        CHECK(d->where == SETTING_ANY || d->where == SETTING_SECRET || d->where == SETTING_NOFILE);
        if (!d->valid) continue;
        bool numeric = d->type != SET_STR && d->type != SET_BOOL;
        CHECK(d->type != SET_BOOL);
        CHECK(numeric == (strstr(d->valid, "..") != NULL));
        if (numeric) { /* "LO..HI", "LO<..HI", "LO..", "..HI": numbers, LO < HI */
            const char *dots = strstr(d->valid, "..");
            char *end, low[64];
            double lo = -1e300, hi = 1e300;
            if (dots != d->valid) {
                snprintf(low, sizeof low, "%.*s", (int)(dots - d->valid), d->valid);
                lo = strtod(low, &end);
                CHECK(end != low && (*end == '\0' || (*end == '<' && end[1] == '\0')));
            }
            if (dots[2]) {
                hi = strtod(dots + 2, &end);
                CHECK(*end == '\0');
            }
            if (!(lo < hi)) fprintf(stderr, "%s: valid %s is empty\n", d->name, d->valid);
            CHECK(lo < hi);
        } else {
            CHECK(!strchr(d->valid, ' ') && d->valid[0] != '|' && !strstr(d->valid, "||"));
        }
        if (d->def) {
            ferry_config c2;
            config_defaults(&c2);
            CHECK_STATUS(config_set(&c2, i, d->def, SOURCE_FLAG, 0), FERRY_OK);
        }
    }
}

static void test_names(void)
{
    char buf[96];
    CHECK_EQ_STR(config_env(SETTING_max_new_tokens, buf, sizeof buf), "FERRY_MAX_NEW_TOKENS");
    CHECK_EQ_STR(config_env(SETTING_admin_token, buf, sizeof buf), "FERRY_ADMIN_TOKEN");
    CHECK_EQ_INT(config_closest("http_prot", -1), SETTING_http_port);
    CHECK_EQ_INT(config_closest("http-prot", -1), SETTING_http_port);
    CHECK_EQ_INT(config_closest("modle", -1), SETTING_model);
    CHECK_EQ_INT(config_closest("max-new-token", -1), SETTING_max_new_tokens);
    CHECK_EQ_INT(config_closest("MAX_MEMORY", -1), SETTING_max_memory);
    CHECK_EQ_INT(config_closest("ofload_dri", -1), SETTING_offload_dir);
    CHECK_EQ_INT(config_closest("xyzzy", -1), -1);
    CHECK_EQ_INT(config_closest("confg", -1), SETTING_config);
    CHECK(config_closest("confg", SETTING_NOFILE) != SETTING_config); /* a file cannot hold it: not suggested */
    CHECK_EQ_INT(config_closest("admin-tokn", -1), SETTING_admin_token);
    CHECK(config_closest("admin-tokn", SETTING_SECRET) != SETTING_admin_token);
    CHECK_EQ_INT(config_closest("completely-unrelated-name", -1), -1);
    CHECK_EQ_INT(config_closest("", -1), -1);
    /* a name of 100 characters is far from everything, and safe */
    char long_name[101];
    memset(long_name, 'a', 100);
    long_name[100] = '\0';
    CHECK_EQ_INT(config_closest(long_name, -1), -1);
}

static const char *write_tmp(const char *name, const char *text, int mode)
{
    static char path[512];
    const char *base = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/ferry-test-config-%d-%s", base && *base ? base : "/tmp", (int)getpid(), name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return path;
    fputs(text, f);
    fclose(f);
    chmod(path, (mode_t)mode);
    return path;
}

/* Loads text as a config file into a fresh config; the status. */
static ferry_status load(ferry_config *cfg, const char *text, int mode)
{
    config_free(cfg);
    config_defaults(cfg);
    const char *path = write_tmp("cfg.json", text, mode);
    ferry_status st = config_load_file(cfg, path);
    unlink(path);
    return st;
}

static void test_file(void)
{
    ferry_config cfg;
    config_defaults(&cfg);
    CHECK_STATUS(load(&cfg,
                      "{\n"
                      "  \"// a comment\": \"ignored\",\n"
                      "  \"http_port\": 9000,\n"
                      "  \"max_memory\": \"device=4GiB,host=16GiB\",\n"
                      "  \"kv_memory\": \"2GiB\",\n"
                      "  \"max_body\": 1048576,\n"
                      "  \"temperature\": 0.25,\n"
                      "  \"top_p\": 1,\n"
                      "  \"verify_reads\": false,\n"
                      "  \"offload_dir\": null,\n"
                      "  \"seed\": 42\n"
                      "}\n",
                      0644),
                 FERRY_OK);
    CHECK_EQ_INT(cfg.http_port, 9000);
    CHECK(cfg.source[SETTING_http_port] == SOURCE_FILE);
    CHECK_EQ_INT(cfg.line[SETTING_http_port], 3);
    CHECK(config_given(&cfg, SETTING_http_port));
    CHECK_EQ_STR(cfg.max_memory, "device=4GiB,host=16GiB");
    CHECK_EQ_U64(cfg.kv_memory, 2ull << 30);
    CHECK_EQ_U64(cfg.max_body, 1048576);
    CHECK(cfg.temperature == 0.25);
    CHECK(cfg.top_p == 1.0);
    CHECK(cfg.verify_reads == false);
    CHECK(cfg.offload_dir == NULL && cfg.source[SETTING_offload_dir] == SOURCE_DEFAULT); /* null: the default */
    CHECK_EQ_U64(cfg.seed, 42);
    CHECK_EQ_INT(cfg.line[SETTING_seed], 11);
    CHECK(cfg.config_file && strstr(cfg.config_file, "cfg.json"));

    /* the environment overrides the file, a flag overrides both */
    setenv("FERRY_HTTP_PORT", "9100", 1);
    setenv("FERRY_KV_MEMORY", "1GiB", 1);
    bool wanted[SETTING_COUNT] = {0};
    wanted[SETTING_http_port] = true; /* kv_memory not wanted: left alone */
    CHECK_STATUS(config_load_env(&cfg, wanted), FERRY_OK);
    CHECK_EQ_INT(cfg.http_port, 9100);
    CHECK(cfg.source[SETTING_http_port] == SOURCE_ENV);
    CHECK_EQ_U64(cfg.kv_memory, 2ull << 30);
    CHECK_STATUS(config_set(&cfg, SETTING_http_port, "9200", SOURCE_FLAG, 0), FERRY_OK);
    CHECK(cfg.source[SETTING_http_port] == SOURCE_FLAG);
    setenv("FERRY_HTTP_PORT", "http", 1);
    CHECK_STATUS(config_load_env(&cfg, NULL), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("FERRY_HTTP_PORT: 'http' is not an integer");
    unsetenv("FERRY_HTTP_PORT");
    unsetenv("FERRY_KV_MEMORY");

    /* the printed configuration: values, sources, where */
    strbuf sb;
    sb_init(&sb);
    config_print_json(&sb, &cfg);
    json_doc *doc = NULL;
    CHECK_STATUS(json_parse(sb.data, sb.len, &doc), FERRY_OK);
    if (doc) {
        const json_value *set = json_get(json_doc_root(doc), "settings");
        const json_value *hp = json_get(set, "http_port"), *sd = json_get(set, "seed"), *dv = json_get(set, "device");
        CHECK(json_get(hp, "value")->integer == 9200);
        CHECK_EQ_STR(json_get_str(hp, "source", NULL), "flag");
        CHECK_EQ_STR(json_get_str(hp, "from", NULL), "--http-port");
        CHECK_EQ_STR(json_get_str(sd, "source", NULL), "file");
        CHECK(strstr(json_get_str(sd, "from", NULL), "cfg.json:11") != NULL);
        CHECK_EQ_STR(json_get_str(dv, "source", NULL), "default");
        CHECK(json_get(dv, "from") == NULL);
        CHECK_EQ_INT(json_get(json_get(set, "max_body"), "value")->integer, 1048576);
        CHECK(json_get(json_get(set, "temperature"), "value")->number == 0.25);
        CHECK(json_get(json_get(set, "model"), "value")->type == JSON_NULL);
        CHECK_EQ_INT(json_get(json_doc_root(doc), "settings")->len, SETTING_COUNT);
        json_doc_free(doc);
    }
    sb_free(&sb);

    /* each error names the file, the line and the key */
    CHECK_STATUS(load(&cfg, "{\n  \"threads\": 4,\n  \"http_prot\": 1\n}\n", 0644), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("cfg.json:3: unknown setting 'http_prot' (did you mean http_port?)");
    CHECK_STATUS(load(&cfg, "{\"zzzzzz\": 1}", 0644), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("unknown setting 'zzzzzz'");
    CHECK_STATUS(load(&cfg, "{\n\"threads\": \"4\"}", 0644), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("cfg.json:2: threads must be an integer, not a string");
    CHECK_STATUS(load(&cfg, "{\"threads\": 1.5}", 0644), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("threads must be an integer, not a number");
    CHECK_STATUS(load(&cfg, "{\"verify_reads\": \"no\"}", 0644), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("verify_reads must be true or false, not a string");
    CHECK_STATUS(load(&cfg, "{\"kv_memory\": -5}", 0644), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("kv_memory");
    CHECK_STATUS(load(&cfg, "{\"kv_memory\": [1]}", 0644), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("kv_memory must be a size");
    CHECK_STATUS(load(&cfg, "{\"device\": 1}", 0644), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("device must be a string, not an integer");
    CHECK_STATUS(load(&cfg, "{\n\n\"threads\": 4000}", 0644), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("cfg.json:3: threads must be in 0..1024 (got 4000)");
    CHECK_STATUS(load(&cfg, "{\"device\": \"cdua\"}", 0644), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("did you mean cuda?");
    CHECK_STATUS(load(&cfg, "{\n\"batch\": 8,\n\"batch\": 16\n}", 0644), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("cfg.json:3: batch is set twice (first at line 2)");
    CHECK_STATUS(load(&cfg, "{\n  \"batch\": 8\n  \"threads\": 2\n}", 0644), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("cfg.json:3:3: invalid JSON: expected ',' or '}'");
    CHECK_STATUS(load(&cfg, "[1, 2]", 0644), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("one JSON object of settings, not an array");
    CHECK_STATUS(load(&cfg, "", 0644), FERRY_ERR_INVALID);
    CHECK_STATUS(load(&cfg, "{\"config\": \"other.json\"}", 0644), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("config is not read from a config file");
    CHECK_STATUS(load(&cfg, "{\"model\": \"a\\u0000b\"}", 0644), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("cfg.json:1:19: invalid JSON"); /* the reader refuses \u0000: no string is cut short */

    /* numbers: an integer may be written 2.0; past the range the range
     * check speaks; a seed beyond 2^53 goes as a string */
    CHECK_STATUS(load(&cfg, "{\"threads\": 2.0}", 0644), FERRY_OK);
    CHECK_EQ_INT(cfg.threads, 2);
    CHECK_STATUS(load(&cfg, "{\"threads\": 99999999999999999999}", 0644), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("threads: 100000000000000000000 is out of range 0..1024"); /* the double it reads as */
    CHECK_STATUS(load(&cfg, "{\"seed\": 18446744073709551615}", 0644), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("seed: a JSON number beyond 2^53 is not exact: write it as a string");
    CHECK_STATUS(load(&cfg, "{\"seed\": \"18446744073709551615\"}", 0644), FERRY_OK);
    CHECK_EQ_U64(cfg.seed, UINT64_MAX);
    CHECK_STATUS(load(&cfg, "{\"seed\": \"12a\"}", 0644), FERRY_ERR_INVALID);
    CHECK_STATUS(load(&cfg, "{\"seed\": -1}", 0644), FERRY_ERR_INVALID);
    CHECK_STATUS(load(&cfg, "{\"top_p\": 1.1}", 0644), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("(got 1.1)"); /* as written, not 1.1000000000000001 */
    CHECK_STATUS(load(&cfg, "{\"kv_memory\": 1.5}", 0644), FERRY_ERR_INVALID);
    /* a UTF-8 byte-order mark is skipped; lines count as before */
    CHECK_STATUS(load(&cfg, "\xEF\xBB\xBF{\n\"threads\": 3}", 0644), FERRY_OK);
    CHECK_EQ_INT(cfg.threads, 3);
    CHECK_EQ_INT(cfg.line[SETTING_threads], 2);

    /* a secret only in the user's own file that no one else can read */
    CHECK_STATUS(load(&cfg, "{\"admin_token\": \"0123456789abcdef\"}", 0644), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("admin_token is a secret, but the file's mode 0644 lets group or others read it: chmod 600");
    CHECK_STATUS(load(&cfg, "{\"admin_token\": \"0123456789abcdef\"}", 0640), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("mode 0640");
    CHECK_STATUS(load(&cfg, "{\"admin_token\": \"0123456789abcdef\"}", 0600), FERRY_OK);
    CHECK_EQ_STR(cfg.admin_token, "0123456789abcdef");
    sb_init(&sb);
    config_print_json(&sb, &cfg);
    CHECK(sb.data && !strstr(sb.data, "0123456789abcdef") && strstr(sb.data, "<redacted>"));
    sb_free(&sb);

    /* text with no file behind it (config_load_text): named as given, and no
     * place for a secret */
    config_free(&cfg);
    config_defaults(&cfg);
    static const char text[] = "{\n\"batch\": 5}";
    CHECK_STATUS(config_load_text(&cfg, "inline.json", text, sizeof text - 1, NULL), FERRY_OK);
    CHECK_EQ_INT(cfg.batch, 5);
    CHECK_EQ_INT(cfg.line[SETTING_batch], 2);
    CHECK_EQ_STR(cfg.config_file, "inline.json");
    static const char secret[] = "{\"admin_token\": \"0123456789abcdef\"}";
    CHECK_STATUS(config_load_text(&cfg, "inline.json", secret, sizeof secret - 1, NULL), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("inline.json:1: admin_token is a secret, which only a file of this user's, mode 0600, may hold");

    /* owned by someone else (as root, a file given to nobody) */
    if (geteuid() == 0) {
        config_free(&cfg);
        config_defaults(&cfg);
        const char *path = write_tmp("other.json", "{\"admin_token\": \"0123456789abcdef\"}", 0600);
        CHECK(chown(path, 65534, 65534) == 0);
        CHECK_STATUS(config_load_file(&cfg, path), FERRY_ERR_INVALID);
        CHECK_MSG_HAS("owned by uid 65534, not by this user");
        unlink(path);
    }

    /* a FIFO with no writer reads as empty instead of hanging; a pipe with
     * one is read to its end (--config <(...)) */
    {
        config_free(&cfg);
        config_defaults(&cfg);
        char fifo[512];
        snprintf(fifo, sizeof fifo, "%s.fifo", write_tmp("fifo", "", 0600));
        CHECK(mkfifo(fifo, 0600) == 0);
        CHECK_STATUS(config_load_file(&cfg, fifo), FERRY_ERR_INVALID);
        CHECK_MSG_HAS("invalid JSON");
        int fds[2];
        CHECK(pipe(fds) == 0);
        CHECK(write(fds[1], "{\"batch\": 7}", 12) == 12);
        close(fds[1]);
        char dev[64];
        snprintf(dev, sizeof dev, "/dev/fd/%d", fds[0]);
        config_free(&cfg);
        config_defaults(&cfg);
        CHECK_STATUS(config_load_file(&cfg, dev), FERRY_OK);
        CHECK_EQ_INT(cfg.batch, 7);
        close(fds[0]);
        unlink(fifo);
    }

    /* not a file, no file, too large */
    config_free(&cfg);
    config_defaults(&cfg);
    CHECK_STATUS(config_load_file(&cfg, "/nonexistent/ferry.json"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("config file /nonexistent/ferry.json: No such file or directory");
    CHECK_STATUS(config_load_file(&cfg, "/tmp"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("not a regular file");
    CHECK_STATUS(config_load_file(&cfg, "/dev/null"), FERRY_ERR_INVALID); /* a character device */
    CHECK_MSG_HAS("not a regular file");
    char *big = malloc((2u << 20) + 3);
    if (big) {
        memset(big, ' ', 2u << 20);
        strcpy(big + (2u << 20), "{}");
        CHECK_STATUS(load(&cfg, big, 0644), FERRY_ERR_INVALID);
        CHECK_MSG_HAS("a config file holds at most that");
        free(big);
    }
    config_free(&cfg);
}

static void check_size(const char *s, uint64_t want, int line)
{
    uint64_t got = 12345;
    ferry_status st = util_parse_size(s, &got);
    check_count++;
    if (st != FERRY_OK || got != want) {
        fprintf(stderr, "%s:%d: util_parse_size(\"%s\"): expected %" PRIu64 ", got '%s' %" PRIu64 " (%s)\n",
                __FILE__, line, s, want, ferry_status_name(st), got, st ? ferry_errmsg() : "");
        check_failures++;
    }
}

static void check_bad_size(const char *s, int line)
{
    uint64_t got = 12345;
    ferry_status st = util_parse_size(s, &got);
    check_count++;
    if (st != FERRY_ERR_INVALID || got != 12345 || !strstr(ferry_errmsg(), s)) {
        fprintf(stderr, "%s:%d: util_parse_size(\"%s\"): expected FERRY_ERR_INVALID naming the input, got '%s' %" PRIu64 " (%s)\n",
                __FILE__, line, s, ferry_status_name(st), got, ferry_errmsg());
        check_failures++;
    }
}

static void test_sizes(void)
{
    check_size("0", 0, __LINE__);
    check_size("4096", 4096, __LINE__);
    check_size("7B", 7, __LINE__);
    check_size("64KiB", 64ull << 10, __LINE__);
    check_size("512MiB", 512ull << 20, __LINE__);
    check_size("2GiB", 2ull << 30, __LINE__);
    check_size("1.5GiB", 3ull << 29, __LINE__);
    check_size("1TiB", 1ull << 40, __LINE__);
    check_size("2G", 2ull << 30, __LINE__);
    check_size("64k", 64ull << 10, __LINE__);
    check_size("2gib", 2ull << 30, __LINE__);
    check_size("10MB", 10000000, __LINE__);
    check_size("3KB", 3000, __LINE__);
    check_size("1GB", 1000000000, __LINE__);
    check_bad_size("", __LINE__);
    check_bad_size("-1", __LINE__);
    check_bad_size("12XB", __LINE__);
    check_bad_size("abc", __LINE__);
    check_bad_size("GiB", __LINE__);
    check_bad_size(" 1", __LINE__);
    check_bad_size("1 GiB", __LINE__);
    check_bad_size("1GiBs", __LINE__);
    check_bad_size("99999999TiB", __LINE__);

    char buf[32];
    CHECK_EQ_STR(util_fmt_bytes(0, buf, sizeof buf), "0 B");
    CHECK_EQ_STR(util_fmt_bytes(1023, buf, sizeof buf), "1023 B");
    CHECK_EQ_STR(util_fmt_bytes(1024, buf, sizeof buf), "1.00 KiB");
    CHECK_EQ_STR(util_fmt_bytes(1536, buf, sizeof buf), "1.50 KiB");
    CHECK_EQ_STR(util_fmt_bytes(512ull << 20, buf, sizeof buf), "512.00 MiB");
    CHECK_EQ_STR(util_fmt_bytes(3ull << 29, buf, sizeof buf), "1.50 GiB");
    CHECK_EQ_STR(util_fmt_bytes(2147483648ull, buf, sizeof buf), "2.00 GiB");
    CHECK_EQ_STR(util_fmt_bytes(1ull << 40, buf, sizeof buf), "1.00 TiB");
    CHECK_EQ_STR(util_fmt_bytes(1ull << 50, buf, sizeof buf), "1024.00 TiB");
    /* a short buffer is truncated, never overrun */
    char small[5];
    memset(small, 'x', sizeof small);
    CHECK(util_fmt_bytes(3ull << 29, small, sizeof small) == small);
    CHECK_EQ_STR(small, "1.50");
}

int main(void)
{
    test_defaults();
    test_engine_defaults();
    test_find();
    test_set();
    test_ranges();
    test_names();
    test_file();
    test_sizes();
    return check_report();
}
