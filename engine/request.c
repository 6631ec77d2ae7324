/*
 * request.c - the one validator of generation requests. See request.h.
 */
#include "request.h"

#include <string.h>

int64_t request_context(const engine_limits *lim)
{
    return lim->kv_positions > 0 && lim->kv_positions < lim->max_ctx ? lim->kv_positions : lim->max_ctx;
}

void request_set_params(gen_request *g, const gen_params *p)
{
    g->max_new_tokens = p->max_new_tokens;
    g->sampling = p->sampling;
    memcpy(g->stop_ids, p->stop_ids, sizeof g->stop_ids);
    g->n_stop = p->n_stop;
}

/* st, the message already recorded, with *bad = field. */
static ferry_status refuse(request_field *bad, request_field field, ferry_status st)
{
    if (bad) *bad = field;
    return st;
}

ferry_status request_check(const gen_request *r, const engine_limits *lim, const char *what, request_field *bad)
{
    if (r->prompt_len < 1) return refuse(bad, REQUEST_FIELD_PROMPT, ferry_fail(FERRY_ERR_INVALID, "%s is empty", what));
    for (int k = 0; k < r->prompt_len; k++)
        if (r->prompt[k] < 0 || r->prompt[k] >= lim->vocab)
            return refuse(bad, REQUEST_FIELD_PROMPT,
                          ferry_fail(FERRY_ERR_INVALID, "%s[%d] = %d is outside the vocabulary (size %d)", what, k,
                                     r->prompt[k], lim->vocab));
    if (gen_param_check_int(GEN_max_new_tokens, "max_new_tokens", r->max_new_tokens) != FERRY_OK)
        return refuse(bad, GEN_max_new_tokens, FERRY_ERR_INVALID);
    int64_t need = (int64_t)r->prompt_len + r->max_new_tokens;
    if (need > request_context(lim)) {
        if (need > lim->max_ctx)
            ferry_fail(FERRY_ERR_INVALID, "%s: %d prompt + %d new tokens exceed the context of %d positions", what,
                       r->prompt_len, r->max_new_tokens, lim->max_ctx);
        else
            ferry_fail(FERRY_ERR_INVALID,
                       "%s: %d prompt + %d new tokens need %lld KV positions but the KV cache holds %lld in all "
                       "(raise --kv-memory)",
                       what, r->prompt_len, r->max_new_tokens, (long long)need, (long long)lim->kv_positions);
        return refuse(bad, REQUEST_FIELD_CONTEXT, FERRY_ERR_INVALID);
    }
    /* a server's caps, after the context: past both, the context is the message */
    if (lim->max_prompt > 0 && r->prompt_len > lim->max_prompt)
        return refuse(bad, REQUEST_FIELD_PROMPT,
                      ferry_fail(FERRY_ERR_INVALID,
                                 "%s is %d tokens, more than this server takes in one prompt (%d, --max-prompt-tokens)",
                                 what, r->prompt_len, lim->max_prompt));
    if (lim->max_new > 0 && r->max_new_tokens > lim->max_new)
        return refuse(bad, GEN_max_new_tokens,
                      ferry_fail(FERRY_ERR_INVALID,
                                 "max_new_tokens is %d, more than this server generates for one sequence (%d, "
                                 "--max-output-tokens)",
                                 r->max_new_tokens, lim->max_new));
    if (r->n_stop < 0)
        return refuse(bad, GEN_stop_token_ids, ferry_fail(FERRY_ERR_INVALID, "stop_token_ids: %d ids", r->n_stop));
    if (gen_param_check_stop_count("stop_token_ids", (size_t)r->n_stop) != FERRY_OK)
        return refuse(bad, GEN_stop_token_ids, FERRY_ERR_INVALID);
    for (int k = 0; k < r->n_stop; k++)
        if (r->stop_ids[k] < 0 || r->stop_ids[k] >= lim->vocab)
            return refuse(bad, GEN_stop_token_ids,
                          ferry_fail(FERRY_ERR_INVALID, "stop_token_ids[%d] = %d is outside the vocabulary (size %d)",
                                     k, r->stop_ids[k], lim->vocab));
    gen_param which;
    if (gen_param_check_sampling(&r->sampling, &which) != FERRY_OK) return refuse(bad, which, FERRY_ERR_INVALID);
    return FERRY_OK;
}
