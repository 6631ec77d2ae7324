/*
 * test_request.c - the one request validator (engine/request.h) and the
 * batch builder (engine/batch.h): every refusal names what is wrong, every
 * bound is exact (the last valid value passes, the next fails), and built
 * batches keep the row/position rule engine_step checks.
 */
#include <string.h>

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

static void test_request_check(void)
{
    int32_t p[40];
    for (int i = 0; i < 40; i++) p[i] = i;
    gen_request r = good(p, 5);
    CHECK_STATUS(request_check(&r, &k_lim, "input_ids"), FERRY_OK);
    /* the KV pool: prompt + new tokens within the positions it holds in all */
    r.max_new_tokens = 15;
    CHECK_STATUS(request_check(&r, &k_small_pool, "input_ids"), FERRY_OK);
    r.max_new_tokens = 16;
    CHECK_STATUS(request_check(&r, &k_small_pool, "input_ids"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("5 prompt + 16 new tokens need 21 KV positions but the KV cache holds 20");
    r = good(p, 5);

    r = good(p, 0);
    CHECK_STATUS(request_check(&r, &k_lim, "input_ids[2]"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("input_ids[2] is empty");

    int32_t bad[3] = {1, 100, 2};
    r = good(bad, 3);
    CHECK_STATUS(request_check(&r, &k_lim, "prompt 1"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("prompt 1[1] = 100 is outside the vocabulary (size 100)");
    bad[1] = 99;
    CHECK_STATUS(request_check(&r, &k_lim, "prompt 1"), FERRY_OK);
    bad[1] = -1;
    CHECK_STATUS(request_check(&r, &k_lim, "prompt 1"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("outside the vocabulary");

    r = good(p, 5);
    r.max_new_tokens = 0;
    CHECK_STATUS(request_check(&r, &k_lim, "input_ids"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("max_new_tokens must be >= 1 (got 0)");

    /* the context bound is exact: 28 + 4 = 32 fits, 28 + 5 does not */
    r = good(p, 28);
    CHECK_STATUS(request_check(&r, &k_lim, "input_ids"), FERRY_OK);
    r.max_new_tokens = 5;
    CHECK_STATUS(request_check(&r, &k_lim, "input_ids"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("28 prompt + 5 new tokens exceed the context of 32 positions");

    /* a server's caps (--max-prompt-tokens, --max-output-tokens), exact too */
    engine_limits capped = k_lim;
    capped.max_prompt = 10;
    capped.max_new = 6;
    r = good(p, 10);
    r.max_new_tokens = 6;
    CHECK_STATUS(request_check(&r, &capped, "prompt"), FERRY_OK);
    r = good(p, 11);
    CHECK_STATUS(request_check(&r, &capped, "prompt"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("prompt is 11 tokens, more than this server takes in one prompt (10, --max-prompt-tokens)");
    r = good(p, 10);
    r.max_new_tokens = 7;
    CHECK_STATUS(request_check(&r, &capped, "prompt"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("max_new_tokens is 7, more than this server generates for one sequence (6, --max-output-tokens)");

    r = good(p, 5);
    r.n_stop = REQUEST_MAX_STOP + 1;
    CHECK_STATUS(request_check(&r, &k_lim, "input_ids"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("stop_token_ids");
    r.n_stop = 2;
    r.stop_ids[0] = 3;
    r.stop_ids[1] = 100;
    CHECK_STATUS(request_check(&r, &k_lim, "input_ids"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("stop_token_ids[1] = 100 is outside the vocabulary");

    r = good(p, 5);
    r.sampling.top_p = 0;
    CHECK_STATUS(request_check(&r, &k_lim, "input_ids"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("top_p");
    r.sampling = (sampling_params){-1, 0, 1, 0};
    CHECK_STATUS(request_check(&r, &k_lim, "input_ids"), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("temperature");
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
    test_batch_builder();
    return check_report();
}
