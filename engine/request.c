/*
 * request.c - the one validator of generation requests. See request.h.
 */
#include "request.h"

ferry_status request_check(const gen_request *r, const engine_limits *lim, const char *what)
{
    if (r->prompt_len < 1) return ferry_fail(FERRY_ERR_INVALID, "%s is empty", what);
    for (int k = 0; k < r->prompt_len; k++)
        if (r->prompt[k] < 0 || r->prompt[k] >= lim->vocab)
            return ferry_fail(FERRY_ERR_INVALID, "%s[%d] = %d is outside the vocabulary (size %d)", what, k,
                              r->prompt[k], lim->vocab);
    if (r->max_new_tokens < 1)
        return ferry_fail(FERRY_ERR_INVALID, "max_new_tokens must be >= 1 (got %d)", r->max_new_tokens);
    if (r->max_new_tokens > lim->max_ctx - r->prompt_len)
        return ferry_fail(FERRY_ERR_INVALID, "%s: %d prompt + %d new tokens exceed the context of %d positions", what,
                          r->prompt_len, r->max_new_tokens, lim->max_ctx);
    if (lim->kv_positions > 0 && (int64_t)r->prompt_len + r->max_new_tokens > lim->kv_positions)
        return ferry_fail(FERRY_ERR_INVALID,
                          "%s: %d prompt + %d new tokens need %lld KV positions but the KV cache holds %lld in all "
                          "(raise --kv-memory)",
                          what, r->prompt_len, r->max_new_tokens, (long long)r->prompt_len + r->max_new_tokens,
                          (long long)lim->kv_positions);
    /* a server's caps, after the context: past both, the context is the message */
    if (lim->max_prompt > 0 && r->prompt_len > lim->max_prompt)
        return ferry_fail(FERRY_ERR_INVALID, "%s is %d tokens, more than this server takes in one prompt (%d, --max-prompt-tokens)",
                          what, r->prompt_len, lim->max_prompt);
    if (lim->max_new > 0 && r->max_new_tokens > lim->max_new)
        return ferry_fail(FERRY_ERR_INVALID,
                          "max_new_tokens is %d, more than this server generates for one sequence (%d, --max-output-tokens)",
                          r->max_new_tokens, lim->max_new);
    if (r->n_stop < 0 || r->n_stop > REQUEST_MAX_STOP)
        return ferry_fail(FERRY_ERR_INVALID, "at most %d stop_token_ids (got %d)", REQUEST_MAX_STOP, r->n_stop);
    for (int k = 0; k < r->n_stop; k++)
        if (r->stop_ids[k] < 0 || r->stop_ids[k] >= lim->vocab)
            return ferry_fail(FERRY_ERR_INVALID, "stop_token_ids[%d] = %d is outside the vocabulary (size %d)", k,
                              r->stop_ids[k], lim->vocab);
    return sampling_params_check(&r->sampling);
}
