/*
 * test_rope.c - config.json's RoPE settings (weights/rope.h): which object
 * is read (rope_scaling, the legacy "type", v5's rope_parameters), the
 * defaults transformers applies (YaRN's beta_fast/beta_slow, truncate, the
 * original length, the attention factor from factor, mscale and
 * mscale_all_dim), the errors that name what is wrong, and the shape of each
 * table: plain RoPE bit for bit as ferry computed it before scaling existed,
 * linear exactly divided, Llama 3.1's bands, YaRN's ramp. That the tables
 * match transformers' numbers is tests/integration/test_rope_scaling.py's
 * job (against PyTorch).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/base/json.h"
#include "../../engine/weights/rope.h"
#include "check.h"

/* Parses a config.json body (the object's members, braces added). */
static ferry_status parse(const char *members, int max_pos, rope_config *rc)
{
    char text[2048];
    snprintf(text, sizeof text, "{%s}", members);
    json_doc *doc;
    FERRY_ASSERT(json_parse(text, strlen(text), &doc) == FERRY_OK);
    ferry_status st = rope_config_parse(json_doc_root(doc), "config.json", max_pos, rc);
    json_doc_free(doc);
    return st;
}

static void check_fails(const char *members, ferry_status want, const char *needle, int line)
{
    rope_config rc;
    ferry_status st = parse(members, 4096, &rc);
    check_count++;
    if (st != want) CHECK_FAIL_("line %d: %s: expected %s, got %s (%s)", line, members, ferry_status_name(want),
                                ferry_status_name(st), ferry_errmsg());
    else if (!strstr(ferry_errmsg(), needle))
        CHECK_FAIL_("line %d: %s: message \"%s\" lacks \"%s\"", line, members, ferry_errmsg(), needle);
}

static void test_which_object(void)
{
    rope_config rc;
    CHECK_STATUS(parse("\"rope_theta\": 500000.0", 4096, &rc), FERRY_OK);
    CHECK(rc.type == ROPE_DEFAULT && rc.theta == 500000.0 && rc.attention_factor == 1);
    CHECK_STATUS(parse("", 4096, &rc), FERRY_OK);
    CHECK(rc.type == ROPE_DEFAULT && rc.theta == 10000.0);
    /* Qwen2's configs: null, or an empty object */
    CHECK_STATUS(parse("\"rope_scaling\": null", 4096, &rc), FERRY_OK);
    CHECK(rc.type == ROPE_DEFAULT);
    CHECK_STATUS(parse("\"rope_scaling\": {}", 4096, &rc), FERRY_OK);
    CHECK(rc.type == ROPE_DEFAULT);
    CHECK_STATUS(parse("\"rope_scaling\": {\"rope_type\": \"default\"}", 4096, &rc), FERRY_OK);
    CHECK(rc.type == ROPE_DEFAULT);
    /* the legacy key */
    CHECK_STATUS(parse("\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}", 4096, &rc), FERRY_OK);
    CHECK(rc.type == ROPE_LINEAR && rc.factor == 2);
    /* v5: everything in rope_parameters, theta included */
    CHECK_STATUS(parse("\"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, \"factor\": 32.0, "
                       "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                       "\"original_max_position_embeddings\": 8192}", 131072, &rc), FERRY_OK);
    CHECK(rc.type == ROPE_LLAMA3 && rc.theta == 500000.0 && rc.factor == 32 && rc.original_max_pos == 8192);
    CHECK_STATUS(parse("\"rope_parameters\": {\"rope_theta\": 1000.0}", 4096, &rc), FERRY_OK);
    CHECK(rc.type == ROPE_DEFAULT && rc.theta == 1000.0);
    /* a top-level rope_theta wins (as before); rope_scaling wins over rope_parameters */
    CHECK_STATUS(parse("\"rope_theta\": 7.0, \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 9.0}",
                       4096, &rc), FERRY_OK);
    CHECK(rc.theta == 7.0);
    CHECK_STATUS(parse("\"rope_scaling\": {\"type\": \"linear\", \"factor\": 3}, "
                       "\"rope_parameters\": {\"rope_type\": \"default\"}", 4096, &rc), FERRY_OK);
    CHECK(rc.type == ROPE_LINEAR && rc.factor == 3);
    CHECK_STATUS(parse("\"rope_scaling\": {\"type\": \"linear\", \"factor\": 3}, "
                       "\"rope_parameters\": {\"rope_theta\": 5.0}", 4096, &rc), FERRY_OK);
    CHECK(rc.type == ROPE_LINEAR && rc.theta == 5.0);
    CHECK_STATUS(parse("\"rope_scaling\": {\"type\": \"linear\", \"factor\": 3, \"rope_theta\": 6.0}", 4096, &rc),
                 FERRY_OK);
    CHECK(rc.theta == 6.0);
}

static void test_yarn_defaults(void)
{
    rope_config rc;
    /* Qwen2.5's long-context setting */
    CHECK_STATUS(parse("\"max_position_embeddings\": 32768, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0, "
                       "\"original_max_position_embeddings\": 32768}", 32768, &rc), FERRY_OK);
    CHECK(rc.type == ROPE_YARN && rc.factor == 4 && rc.original_max_pos == 32768);
    CHECK(rc.beta_fast == 32 && rc.beta_slow == 1 && rc.truncate);
    CHECK(rc.attention_factor == 0.1 * log(4.0) + 1.0);
    /* no original length: max_position_embeddings; 0 and null betas: the defaults */
    CHECK_STATUS(parse("\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 2, \"beta_fast\": 0, "
                       "\"beta_slow\": null, \"truncate\": false}", 1000, &rc), FERRY_OK);
    CHECK(rc.original_max_pos == 1000 && rc.beta_fast == 32 && rc.beta_slow == 1 && !rc.truncate);
    /* `get("truncate", True)` is None for null: falsy */
    CHECK_STATUS(parse("\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 2, \"truncate\": null}", 1000, &rc),
                 FERRY_OK);
    CHECK(!rc.truncate);
    /* the attention factor: given; mscale / mscale_all_dim (DeepSeek's); 1 for factor <= 1 */
    CHECK_STATUS(parse("\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, \"attention_factor\": 0.5}", 1000,
                       &rc), FERRY_OK);
    CHECK(rc.attention_factor == 0.5);
    CHECK_STATUS(parse("\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 40, \"mscale\": 1.0, "
                       "\"mscale_all_dim\": 0.707}", 1000, &rc), FERRY_OK);
    CHECK(rc.attention_factor == (0.1 * 1.0 * log(40.0) + 1.0) / (0.1 * 0.707 * log(40.0) + 1.0));
    CHECK_STATUS(parse("\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 40, \"mscale\": 1.0, "
                       "\"mscale_all_dim\": 0}", 1000, &rc), FERRY_OK);
    CHECK(rc.attention_factor == 0.1 * log(40.0) + 1.0); /* `if mscale and mscale_all_dim` */
    CHECK_STATUS(parse("\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 0.5}", 1000, &rc), FERRY_OK);
    CHECK(rc.attention_factor == 1.0);
}

static void test_errors(void)
{
    check_fails("\"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 2}", FERRY_ERR_UNSUPPORTED, "'dynamic'",
                __LINE__);
    check_fails("\"rope_scaling\": {\"type\": \"longrope\", \"long_factor\": [1], \"short_factor\": [1]}",
                FERRY_ERR_UNSUPPORTED, "'longrope'", __LINE__);
    check_fails("\"rope_scaling\": {\"rope_type\": \"su\"}", FERRY_ERR_UNSUPPORTED, "'su'", __LINE__);
    check_fails("\"rope_parameters\": {\"rope_type\": \"ntk\"}", FERRY_ERR_UNSUPPORTED, "rope_parameters type 'ntk'",
                __LINE__);
    check_fails("\"rope_scaling\": {\"factor\": 2}", FERRY_ERR_INVALID, "no 'rope_type'", __LINE__);
    check_fails("\"rope_scaling\": {\"rope_type\": 3}", FERRY_ERR_INVALID, "rope_type must be a string", __LINE__);
    check_fails("\"rope_scaling\": \"linear\"", FERRY_ERR_INVALID, "'rope_scaling' must be an object", __LINE__);
    check_fails("\"rope_scaling\": {\"rope_type\": \"linear\"}", FERRY_ERR_INVALID, "needs 'factor'", __LINE__);
    check_fails("\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": null}", FERRY_ERR_INVALID, "needs 'factor'",
                __LINE__);
    check_fails("\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 0}", FERRY_ERR_INVALID,
                "rope_scaling.factor = 0 must be a positive", __LINE__);
    check_fails("\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": -2}", FERRY_ERR_INVALID,
                "rope_scaling.factor = -2", __LINE__);
    check_fails("\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": \"2\"}", FERRY_ERR_INVALID,
                "factor must be a number", __LINE__);
    check_fails("\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 1e300}", FERRY_ERR_INVALID, "float range",
                __LINE__);
    check_fails("\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, "
                "\"high_freq_factor\": 4}", FERRY_ERR_INVALID, "needs 'original_max_position_embeddings'", __LINE__);
    check_fails("\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"high_freq_factor\": 4, "
                "\"original_max_position_embeddings\": 8192}", FERRY_ERR_INVALID, "needs 'low_freq_factor'", __LINE__);
    check_fails("\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 4, "
                "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}", FERRY_ERR_INVALID,
                "high_freq_factor (4) must be greater", __LINE__);
    check_fails("\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, "
                "\"original_max_position_embeddings\": 0}", FERRY_ERR_INVALID, "original_max_position_embeddings = 0",
                __LINE__);
    check_fails("\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, \"attention_factor\": 0}",
                FERRY_ERR_INVALID, "attention_factor = 0", __LINE__);
    check_fails("\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, \"truncate\": 1}", FERRY_ERR_INVALID,
                "truncate must be true or false", __LINE__);
    check_fails("\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, \"beta_fast\": -1}", FERRY_ERR_INVALID,
                "beta_fast and beta_slow must be positive", __LINE__);
    check_fails("\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, \"mscale\": 1, "
                "\"mscale_all_dim\": -100}", FERRY_ERR_INVALID, "it must be positive", __LINE__);
    check_fails("\"rope_parameters\": {\"rope_type\": \"default\", \"partial_rotary_factor\": 0.5}",
                FERRY_ERR_UNSUPPORTED, "partial_rotary_factor", __LINE__);
    check_fails("\"rope_theta\": -1", FERRY_ERR_INVALID, "'rope_theta' = -1", __LINE__);
    check_fails("\"rope_theta\": \"x\"", FERRY_ERR_INVALID, "'rope_theta' must be a number", __LINE__);
}

static void test_tables(void)
{
    enum { HD = 128, HALF = HD / 2 };
    float plain[HALF], t[HALF];
    rope_config rc;
    /* plain RoPE: the expression every backend used before tables existed */
    FERRY_ASSERT(parse("\"rope_theta\": 500000.0", 4096, &rc) == FERRY_OK);
    rope_inv_freq(&rc, HD, plain);
    for (int i = 0; i < HALF; i++) CHECK(plain[i] == 1.0f / powf(500000.0f, (float)(2 * i) / (float)HD));
    CHECK(rope_attn_scale(&rc) == 1.0f);

    FERRY_ASSERT(parse("\"rope_theta\": 500000.0, \"rope_scaling\": {\"type\": \"linear\", \"factor\": 3}", 4096, &rc) ==
                 FERRY_OK);
    rope_inv_freq(&rc, HD, t);
    for (int i = 0; i < HALF; i++) CHECK(t[i] == plain[i] / 3.0f);

    /* Llama 3.1: wavelengths under 8192/4 kept, over 8192/1 divided by 8, blended between */
    FERRY_ASSERT(parse("\"rope_theta\": 500000.0, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
                       "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                       "\"original_max_position_embeddings\": 8192}", 131072, &rc) == FERRY_OK);
    rope_inv_freq(&rc, HD, t);
    int kept = 0, divided = 0, blended = 0;
    for (int i = 0; i < HALF; i++) {
        double wavelen = 2 * M_PI / plain[i];
        if (wavelen < 8192 / 4.0 * 0.999) {
            CHECK(t[i] == plain[i]);
            kept++;
        } else if (wavelen > 8192 * 1.001) {
            CHECK(t[i] == plain[i] / 8.0f);
            divided++;
        } else {
            CHECK(t[i] < plain[i] && t[i] > plain[i] / 8.0f * 0.999f);
            blended++;
        }
    }
    CHECK(kept > 0 && divided > 0 && blended > 0);
    CHECK(rope_attn_scale(&rc) == 1.0f);

    /* YaRN: dimensions below the ramp extrapolate (plain), above interpolate (/ factor) */
    FERRY_ASSERT(parse("\"rope_theta\": 10000.0, \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, "
                       "\"original_max_position_embeddings\": 4096}", 16384, &rc) == FERRY_OK);
    float base[HALF];
    rope_config plain10k = {.type = ROPE_DEFAULT, .theta = 10000.0, .factor = 1, .attention_factor = 1};
    rope_inv_freq(&plain10k, HD, base);
    rope_inv_freq(&rc, HD, t);
    /* the ramp's ends for 4096 positions at theta 1e4, head_dim 128: floor(20.94) and ceil(45.03) */
    double low = floor(HD * log(4096 / (32 * 2 * M_PI)) / (2 * log(10000.0)));
    double high = ceil(HD * log(4096 / (1 * 2 * M_PI)) / (2 * log(10000.0)));
    CHECK(low == 20 && high == 46);
    for (int i = 0; i < HALF; i++) {
        if (i <= low) CHECK(t[i] == 1.0f / powf(10000.0f, (float)(2 * i) / (float)HD));
        else if (i >= high) CHECK(t[i] == 1.0f / (4.0f * powf(10000.0f, (float)(2 * i) / (float)HD)));
        else CHECK(t[i] < base[i] && t[i] > base[i] / 4.0f);
    }
    CHECK(rope_attn_scale(&rc) == (float)(0.1 * log(4.0) + 1.0));
    CHECK(strcmp(rope_type_name(rc.type), "yarn") == 0);
}

int main(void)
{
    test_which_object();
    test_yarn_defaults();
    test_errors();
    test_tables();
    return check_report();
}
