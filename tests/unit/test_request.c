/*
 * test_request.c - the one request validator (engine/request.h), the
 * generation parameters' table and checks (engine/gen_params.h) and the
 * batch builder (engine/batch.h): every refusal names what is wrong and
 * says which field, every bound is exact (the last valid value passes, the
 * next fails), and built batches keep the row/position rule engine_step
 * checks.
 */
#include <math.h>
#include <string.h>

#include "../../config/config.h"
#include "../../engine/batch.h"
#include "../../engine/request.h"
#include "check.h"

static const engine_limits k_lim = {.vocab = 100, .max_ctx = 32, .max_seqs = 4, .max_step_tokens = 16};
/* a KV pool smaller than the context */
static const engine_limits k_small_pool = {.vocab = 100, .max_ctx = 32, .max_seqs = 4, .max_step_tokens = 16,
                                           .kv_positions = 20};

static gen_request good(const int32_t *prompt, int n)
{
    gen_request r = {.prompt = prompt, .prompt_len = n, .max_new_tokens = 4, .sampling = {0, 0, 1, 0}};
    return r;
}

/* The field request_check says is wrong (-1: none). */
static request_field field_of(const gen_request *r, const engine_limits *lim)
{
    request_field bad = -1;
    return request_check(r, lim, "input_ids", &bad) == FERRY_OK ? -1 : bad;
}

static void test_request_check(void)
{
    int32_t p[40];
    for (int i = 0; i < 40; i++) p[i] = i;
    gen_request r = good(p, 5);
    CHECK_STATUS(request_check(&r, &k_lim, "input_ids", NULL), FERRY_OK);
    /* the KV pool: prompt + new tokens within the positions it holds in all */
    r.max_new_tokens = 15;
    CHECK_STATUS(request_check(&r, &k_small_pool, "input_ids", NULL), FERRY_OK);
    r.max_new_tokens = 16;
    CHECK_STATUS(request_check(&r, &k_small_pool, "input_ids", NULL), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("5 prompt + 16 new tokens need 21 KV positions but the KV cache holds 20");
    CHECK_EQ_INT(field_of(&r, &k_small_pool), REQUEST_FIELD_CONTEXT);
    CHECK_EQ_INT(request_context(&k_small_pool), 20);
    CHECK_EQ_INT(request_context(&k_lim), 32);
    r = good(p, 5);

    r = good(p, 0);
    CHECK_STATUS(request_check(&r, &k_lim, "input_ids[2]", NULL), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("input_ids[2] is empty");
    CHECK_EQ_INT(field_of(&r, &k_lim), REQUEST_FIELD_PROMPT);

    int32_t bad[3] = {1, 100, 2};
    r = good(bad, 3);
    CHECK_STATUS(request_check(&r, &k_lim, "prompt 1", NULL), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("prompt 1[1] = 100 is outside the vocabulary (size 100)");
    CHECK_EQ_INT(field_of(&r, &k_lim), REQUEST_FIELD_PROMPT);
    bad[1] = 99;
    CHECK_STATUS(request_check(&r, &k_lim, "prompt 1", NULL), FERRY_OK);
    bad[1] = -1;
    CHECK_STATUS(request_check(&r, &k_lim, "prompt 1", NULL), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("outside the vocabulary");

    r = good(p, 5);
    r.max_new_tokens = 0;
    CHECK_STATUS(request_check(&r, &k_lim, "input_ids", NULL), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("max_new_tokens must be an integer in 1..16777216 (got 0)");
    CHECK_EQ_INT(field_of(&r, &k_lim), GEN_max_new_tokens);

    /* the context bound is exact: 28 + 4 = 32 fits, 28 + 5 does not */
    r = good(p, 28);
    CHECK_STATUS(request_check(&r, &k_lim, "input_ids", NULL), FERRY_OK);
    r.max_new_tokens = 5;
    CHECK_STATUS(request_check(&r, &k_lim, "input_ids", NULL), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("28 prompt + 5 new tokens exceed the context of 32 positions");
    CHECK_EQ_INT(field_of(&r, &k_lim), REQUEST_FIELD_CONTEXT);

    /* a server's caps (--max-prompt-tokens, --max-output-tokens), exact too */
    engine_limits capped = k_lim;
    capped.max_prompt = 10;
    capped.max_new = 6;
    r = good(p, 10);
    r.max_new_tokens = 6;
    CHECK_STATUS(request_check(&r, &capped, "prompt", NULL), FERRY_OK);
    r = good(p, 11);
    CHECK_STATUS(request_check(&r, &capped, "prompt", NULL), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("prompt is 11 tokens, more than this server takes in one prompt (10, --max-prompt-tokens)");
    CHECK_EQ_INT(field_of(&r, &capped), REQUEST_FIELD_PROMPT);
    r = good(p, 10);
    r.max_new_tokens = 7;
    CHECK_STATUS(request_check(&r, &capped, "prompt", NULL), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("max_new_tokens is 7, more than this server generates for one sequence (6, --max-output-tokens)");
    CHECK_EQ_INT(field_of(&r, &capped), GEN_max_new_tokens);

    r = good(p, 5);
    r.n_stop = REQUEST_MAX_STOP + 1;
    CHECK_STATUS(request_check(&r, &k_lim, "input_ids", NULL), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("stop_token_ids: at most 16 ids (got 17)");
    CHECK_EQ_INT(field_of(&r, &k_lim), GEN_stop_token_ids);
    r.n_stop = 2;
    r.stop_ids[0] = 3;
    r.stop_ids[1] = 100;
    CHECK_STATUS(request_check(&r, &k_lim, "input_ids", NULL), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("stop_token_ids[1] = 100 is outside the vocabulary");
    CHECK_EQ_INT(field_of(&r, &k_lim), GEN_stop_token_ids);

    r = good(p, 5);
    r.sampling.top_p = 0;
    CHECK_STATUS(request_check(&r, &k_lim, "input_ids", NULL), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("top_p must be a number in (0, 1] (got 0)");
    CHECK_EQ_INT(field_of(&r, &k_lim), GEN_top_p);
    r.sampling = (sampling_params){-1, 0, 1, 0};
    CHECK_STATUS(request_check(&r, &k_lim, "input_ids", NULL), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("temperature must be a number in 0..1e30 (got -1)");
    CHECK_EQ_INT(field_of(&r, &k_lim), GEN_temperature);
    r.sampling = (sampling_params){1, -1, 1, 0};
    CHECK_EQ_INT(field_of(&r, &k_lim), GEN_top_k);
    CHECK_MSG_HAS("top_k must be an integer >= 0 (got -1)");
    /* a temperature of 1e30 (the most) held in a float, 1.00000002e30, passes */
    r.sampling = (sampling_params){1e30f, 0, 1, 0};
    CHECK_EQ_INT(field_of(&r, &k_lim), -1);
}

/* The table: each parameter with a setting has the setting's range; every
 * check's bounds are exact, its message names the parameter as the caller
 * does and its range; values are stored where a request reads them. */
static void test_gen_params(void)
{
    for (int id = 0; id < GEN_PARAM_COUNT; id++) {
        const gen_param_def *d = &gen_param_defs[id];
        int s = config_find(d->name);
        if (s < 0) continue;
        const char *v = config_settings[s].valid;
        if (!(v == d->valid || (v && d->valid && !strcmp(v, d->valid))))
            fprintf(stderr, "%s: settings.def's valid %s, gen_params.def's %s\n", d->name, v ? v : "NULL",
                    d->valid ? d->valid : "NULL");
        CHECK(v == d->valid || (v && d->valid && !strcmp(v, d->valid)));
    }
    CHECK_EQ_INT(gen_param_find("top_p"), GEN_top_p);
    CHECK_EQ_INT(gen_param_find("max_tokens"), GEN_PARAM_COUNT); /* OpenAI's name, not KServe's */
    char names[160];
    CHECK_EQ_STR(gen_param_names(names, sizeof names, 1u << GEN_stop),
                 "max_new_tokens, temperature, top_k, top_p, seed, stop_token_ids");

    gen_params p;
    config_gen_defaults(&p);
    CHECK_EQ_INT(p.max_new_tokens, 16);
    CHECK(p.sampling.temperature == 0 && p.sampling.top_k == 0 && p.sampling.top_p == 1);
    CHECK_EQ_U64(p.sampling.seed, 0);
    for (int id = 0; id < GEN_PARAM_COUNT; id++) CHECK(!p.given[id]);

    CHECK_STATUS(gen_param_set_int(&p, GEN_max_new_tokens, "parameters.max_new_tokens", 16777216), FERRY_OK);
    CHECK_EQ_INT(p.max_new_tokens, 16777216);
    CHECK(p.given[GEN_max_new_tokens]);
    CHECK_STATUS(gen_param_set_int(&p, GEN_max_new_tokens, "parameters.max_new_tokens", 16777217), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("parameters.max_new_tokens must be an integer in 1..16777216 (got 16777217)");
    CHECK_STATUS(gen_param_set_u64(&p, GEN_max_new_tokens, "max_tokens", UINT64_MAX), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("max_tokens must be an integer in 1..16777216 (got 18446744073709551615)");
    CHECK_EQ_INT(p.max_new_tokens, 16777216); /* a refusal leaves the value */
    /* top_k past the vocabulary: all (held as the most an int holds) */
    CHECK_STATUS(gen_param_set_int(&p, GEN_top_k, "top_k", (int64_t)1 << 40), FERRY_OK);
    CHECK_EQ_INT(p.sampling.top_k, INT32_MAX);
    CHECK_STATUS(gen_param_set_int(&p, GEN_top_k, "top_k", -1), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("top_k must be an integer >= 0 (got -1)");
    /* top_p: 0 left out, 1 in */
    CHECK_STATUS(gen_param_set_real(&p, GEN_top_p, "top_p", 1), FERRY_OK);
    CHECK_STATUS(gen_param_set_real(&p, GEN_top_p, "top_p", 1.0000001), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("top_p must be a number in (0, 1] (got 1.0000001)");
    CHECK_STATUS(gen_param_set_real(&p, GEN_top_p, "top_p", 0), FERRY_ERR_INVALID);
    CHECK_STATUS(gen_param_set_real(&p, GEN_top_p, "top_p", 1e-310), FERRY_OK);
    CHECK(p.sampling.top_p > 0); /* a denormal double stays positive in the float */
    CHECK_STATUS(gen_param_set_real(&p, GEN_temperature, "temperature", 1e30), FERRY_OK);
    CHECK_STATUS(gen_param_set_real(&p, GEN_temperature, "temperature", 1.1e30), FERRY_ERR_INVALID);
    CHECK_STATUS(gen_param_set_real(&p, GEN_temperature, "temperature", NAN), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("temperature must be a number in 0..1e30 (got nan)");
    /* a seed: any 64 bits from an unsigned wire, >= 0 from a signed one */
    CHECK_STATUS(gen_param_set_u64(&p, GEN_seed, "parameters.seed", UINT64_MAX), FERRY_OK);
    CHECK_EQ_U64(p.sampling.seed, UINT64_MAX);
    CHECK_STATUS(gen_param_set_int(&p, GEN_seed, "parameters.seed", -3), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("parameters.seed must be an integer >= 0 (got -3)");
    /* stop_token_ids */
    CHECK_STATUS(gen_param_check_stop_count("stop_token_ids", REQUEST_MAX_STOP), FERRY_OK);
    CHECK_STATUS(gen_param_check_stop_count("stop_token_ids", REQUEST_MAX_STOP + 1), FERRY_ERR_INVALID);
    CHECK_STATUS(gen_param_check_stop_id("parameters.stop_token_ids", 2, INT32_MAX), FERRY_OK);
    CHECK_STATUS(gen_param_check_stop_id("parameters.stop_token_ids", 2, (int64_t)INT32_MAX + 1), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("parameters.stop_token_ids[2] = 2147483648 is outside every vocabulary");
}

static void test_batch_builder(void)
{
    batch_builder bb;
    CHECK_STATUS(batch_builder_init(&bb, 10, 3), FERRY_OK);
    int32_t a[4] = {5, 6, 7, 8}, d = 9;
    CHECK_EQ_INT(batch_builder_room(&bb), 10);
    CHECK_EQ_INT(batch_builder_add(&bb, 2, 7, &d, 1), 0);   /* a decode row of KV sequence 2 at position 7 */
    CHECK_EQ_INT(batch_builder_add(&bb, 0, 3, a, 4), 1);    /* a prompt chunk at positions 3..6 */
    CHECK_EQ_INT(batch_builder_room(&bb), 5);
    batch b = batch_builder_get(&bb);
    CHECK_EQ_INT(b.n_tokens, 5);
    CHECK_EQ_INT(b.n_seqs, 2);
    CHECK_EQ_INT(b.seqs[0].kv_seq, 2);
    CHECK_EQ_INT(b.seqs[0].first, 0);
    CHECK_EQ_INT(b.seqs[1].kv_seq, 0);
    CHECK_EQ_INT(b.seqs[1].first, 1);
    CHECK_EQ_INT(b.seqs[1].n_past, 3);
    CHECK_EQ_INT(b.seqs[1].n_tokens, 4);
    /* every row: its sequence's token and next position, in sequence order */
    int32_t want_tok[5] = {9, 5, 6, 7, 8}, want_pos[5] = {7, 3, 4, 5, 6};
    for (int i = 0; i < 5; i++) {
        CHECK_EQ_INT(b.tokens[i], want_tok[i]);
        CHECK_EQ_INT(b.pos[i], want_pos[i]);
    }
    batch_builder_clear(&bb);
    CHECK_EQ_INT(batch_builder_room(&bb), 10);
    CHECK_EQ_INT(batch_builder_get(&bb).n_seqs, 0);
    batch_builder_free(&bb);
}

int main(void)
{
    test_request_check();
    test_gen_params();
    test_batch_builder();
    return check_report();
}
