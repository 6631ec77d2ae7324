/*
 * test_config.c - settings (config/config.h, config/settings.def) and the
 * size helpers of engine/util.h.
 *
 * Covers: every default of settings.def as config_defaults leaves it; lookup
 * by name with '-' or '_'; config_set per type, accepting the documented
 * spellings and rejecting the rest with a message naming the flag; given[]
 * marking only explicit settings; util_parse_size and util_fmt_bytes.
 */
#include <stdlib.h>

#include "../../config/config.h"
#include "../../engine/base/util.h"
#include "check.h"

static void test_defaults(void)
{
    ferry_config cfg;
    memset(&cfg, 0xA5, sizeof cfg); /* config_defaults must not rely on zeroed memory */
    config_defaults(&cfg);
    CHECK(cfg.model == NULL);
    CHECK_EQ_STR(cfg.device, "cpu");
    CHECK_EQ_INT(cfg.threads, 0);
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
    CHECK_EQ_INT(cfg.group_size, 1);
    CHECK_EQ_INT(cfg.prefetch, 2);
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
    CHECK_EQ_INT(cfg.request_timeout, 30);
    CHECK_EQ_INT(cfg.max_connections, 2048);
    CHECK_EQ_INT(cfg.max_connections_per_ip, 256);
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
        if (cfg.given[i]) fprintf(stderr, "default of %s counted as given\n", config_settings[i].name);
        CHECK(!cfg.given[i]);
    }
    CHECK_EQ_U64(cfg.expert_cache, 0);
    CHECK(cfg.expert_prefetch == false);
    CHECK_EQ_STR(cfg.decode_input, "greedy");
    CHECK_EQ_INT(SETTING_COUNT, 62); /* a new setting needs a default check above */
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
    CHECK_STATUS(config_set(&cfg, SETTING_max_new_tokens, "12x"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--max-new-tokens");
    CHECK_MSG_HAS("12x");
    CHECK_STATUS(config_set(&cfg, SETTING_max_new_tokens, ""), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--max-new-tokens");
    CHECK_STATUS(config_set(&cfg, SETTING_max_new_tokens, "1.5"), FERRY_ERR_INVALID);
    CHECK_STATUS(config_set(&cfg, SETTING_max_new_tokens, "99999999999"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--max-new-tokens");
    CHECK_STATUS(config_set(&cfg, SETTING_max_new_tokens, "99999999999999999999999"), FERRY_ERR_INVALID);
    CHECK_EQ_INT(cfg.max_new_tokens, 16); /* failures leave the value alone */
    CHECK(!cfg.given[SETTING_max_new_tokens]);
    CHECK_STATUS(config_set(&cfg, SETTING_max_new_tokens, "32"), FERRY_OK);
    CHECK_EQ_INT(cfg.max_new_tokens, 32);
    CHECK(cfg.given[SETTING_max_new_tokens]);
    CHECK_STATUS(config_set(&cfg, SETTING_top_k, "-3"), FERRY_OK); /* ranges are checked by the user of the value */
    CHECK_EQ_INT(cfg.top_k, -3);

    /* FLOAT */
    CHECK_STATUS(config_set(&cfg, SETTING_temperature, "abc"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--temperature");
    CHECK_STATUS(config_set(&cfg, SETTING_temperature, "nan"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--temperature");
    CHECK_STATUS(config_set(&cfg, SETTING_temperature, "inf"), FERRY_ERR_INVALID);
    CHECK_STATUS(config_set(&cfg, SETTING_temperature, "-infinity"), FERRY_ERR_INVALID);
    CHECK_STATUS(config_set(&cfg, SETTING_temperature, "1e999"), FERRY_ERR_INVALID);
    CHECK_STATUS(config_set(&cfg, SETTING_temperature, ""), FERRY_ERR_INVALID);
    CHECK_STATUS(config_set(&cfg, SETTING_temperature, "0.7x"), FERRY_ERR_INVALID);
    CHECK(!cfg.given[SETTING_temperature]);
    CHECK_STATUS(config_set(&cfg, SETTING_temperature, "0.7"), FERRY_OK);
    CHECK(cfg.temperature == 0.7);
    CHECK(cfg.given[SETTING_temperature]);
    CHECK_STATUS(config_set(&cfg, SETTING_top_p, "1e-1"), FERRY_OK);
    CHECK(cfg.top_p == 0.1);

    /* BOOL */
    static const char *const yes[] = {"true", "yes", "1", "TRUE", "Yes"};
    static const char *const no[] = {"false", "no", "0", "False", "NO"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        cfg.json = false;
        CHECK_STATUS(config_set(&cfg, SETTING_json, yes[i]), FERRY_OK);
        CHECK(cfg.json == true);
        CHECK_STATUS(config_set(&cfg, SETTING_json, no[i]), FERRY_OK);
        CHECK(cfg.json == false);
    }
    CHECK_STATUS(config_set(&cfg, SETTING_tied, "maybe"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--tied");
    CHECK_MSG_HAS("maybe");
    CHECK_STATUS(config_set(&cfg, SETTING_tied, ""), FERRY_ERR_INVALID);
    CHECK_STATUS(config_set(&cfg, SETTING_tied, "2"), FERRY_ERR_INVALID);
    CHECK(!cfg.given[SETTING_tied]);

    /* SIZE */
    CHECK_STATUS(config_set(&cfg, SETTING_shard_size, "512MiB"), FERRY_OK);
    CHECK_EQ_U64(cfg.shard_size, 512ull << 20);
    CHECK_STATUS(config_set(&cfg, SETTING_shard_size, "lots"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--shard-size");
    CHECK_MSG_HAS("lots");
    CHECK_EQ_U64(cfg.shard_size, 512ull << 20);

    /* U64 */
    CHECK_STATUS(config_set(&cfg, SETTING_seed, "18446744073709551615"), FERRY_OK);
    CHECK_EQ_U64(cfg.seed, UINT64_MAX);
    CHECK_STATUS(config_set(&cfg, SETTING_seed, "-1"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("--seed");
    CHECK_STATUS(config_set(&cfg, SETTING_seed, "18446744073709551616"), FERRY_ERR_INVALID);
    CHECK_STATUS(config_set(&cfg, SETTING_seed, "7z"), FERRY_ERR_INVALID);
    CHECK_EQ_U64(cfg.seed, UINT64_MAX);

    /* STR */
    CHECK_STATUS(config_set(&cfg, SETTING_device, "cuda"), FERRY_OK);
    CHECK_EQ_STR(cfg.device, "cuda");
    CHECK_STATUS(config_set(&cfg, SETTING_model, ""), FERRY_OK);
    CHECK_EQ_STR(cfg.model, "");

    /* given[] is set by exactly the successful config_set calls above */
    for (int i = 0; i < SETTING_COUNT; i++) {
        bool want = i == SETTING_max_new_tokens || i == SETTING_top_k || i == SETTING_temperature ||
                    i == SETTING_top_p || i == SETTING_json || i == SETTING_shard_size || i == SETTING_seed ||
                    i == SETTING_device || i == SETTING_model;
        if (cfg.given[i] != want) fprintf(stderr, "given[%s] is %d\n", config_settings[i].name, cfg.given[i]);
        CHECK(cfg.given[i] == want);
    }
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
    test_find();
    test_set();
    test_sizes();
    return check_report();
}
