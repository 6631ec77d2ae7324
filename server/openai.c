/*
 * openai.c - OpenAI-compatible request parsing and answers. See openai.h.
 *
 * Parsing goes in the order a client's mistakes are best reported: the
 * body, the model name (404), every known field's type and range (400
 * naming the field; the generation parameters by engine/gen_params.def,
 * whose checks KServe's readers share), then the prompt - encoded, or
 * rendered by the chat template and encoded - and last each row against
 * request_check, its refusal named as OpenAI does (past the context:
 * context_length_exceeded).
 */
#include "openai.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../config/config.h"
#include "../engine/base/util.h"

struct oai_request {
    oai_kind kind;
    char id[48];                 /* "cmpl-..." / "chatcmpl-..." */
    int64_t created;             /* unix seconds */
    int n_prompts, n;            /* rows = n_prompts x n; row i is prompt i / n */
    int32_t *ids;                /* every prompt's ids, one after another */
    int *off, *len;              /* [n_prompts] */
    char **echo;                 /* [n_prompts] the prompt's text when echo is asked for, else NULL */
    size_t *echo_len;
    gen_params gen;
    const char *named[GEN_PARAM_COUNT]; /* the name each parameter came under (chat: max_completion_tokens or max_tokens) */
    text_stops stops;
    bool stream, include_usage;
};

/* ---- identifiers and seeds -------------------------------------------------------------- */

/* Distinct for every call in this process, and across processes and restarts. */
static uint64_t fresh_u64(void)
{
    static uint64_t counter;
    uint64_t c = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
    return util_mix64((uint64_t)(util_wall_now() * 1e9) ^ util_mix64(c) ^ ((uint64_t)getpid() << 40));
}

/* ---- field checks ------------------------------------------------------------------------- */

static ferry_status fail(oai_error *e, int status, const char *param, const char *code, ferry_status st,
                         const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static ferry_status fail(oai_error *e, int status, const char *param, const char *code, ferry_status st,
                         const char *fmt, ...)
{
    char msg[FERRY_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    e->status = status;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    e->code = code;
    return ferry_fail(st, "%s", msg);
}

/* The value of key, NULL when absent or null. */
static const json_value *field(const json_value *root, const char *key)
{
    const json_value *v = json_get(root, key);
    return v && v->type != JSON_NULL ? v : NULL;
}

static ferry_status get_int(const json_value *root, const char *key, int64_t lo, int64_t hi, int64_t *out, oai_error *e)
{
    const json_value *v = field(root, key);
    if (!v) return FERRY_OK;
    if (v->type != JSON_NUMBER || !v->is_int || v->integer < lo || v->integer > hi)
        return fail(e, 400, key, NULL, FERRY_ERR_INVALID, "%s must be an integer in %lld..%lld", key, (long long)lo,
                    (long long)hi);
    *out = v->integer;
    return FERRY_OK;
}

static ferry_status get_num(const json_value *root, const char *key, double *out, oai_error *e)
{
    const json_value *v = field(root, key);
    if (!v) return FERRY_OK;
    if (v->type != JSON_NUMBER || !isfinite(v->number))
        return fail(e, 400, key, NULL, FERRY_ERR_INVALID, "%s must be a number", key);
    *out = v->number;
    return FERRY_OK;
}

static ferry_status get_bool(const json_value *root, const char *key, bool *out, oai_error *e)
{
    const json_value *v = field(root, key);
    if (!v) return FERRY_OK;
    if (v->type != JSON_BOOL) return fail(e, 400, key, NULL, FERRY_ERR_INVALID, "%s must be true or false", key);
    *out = v->boolean;
    return FERRY_OK;
}

static ferry_status unsupported(oai_error *e, const char *param, const char *what)
{
    return fail(e, 400, param, NULL, FERRY_ERR_UNSUPPORTED, "%s is not supported by this server", what);
}

/* Fields ferry knows but cannot honour: refused unless they ask for
 * nothing (their defaults). */
static ferry_status check_unsupported(oai_kind kind, const json_value *root, int n, oai_error *e)
{
    const json_value *v;
    if ((v = field(root, "logprobs"))) {
        if (kind == OAI_CHAT && v->type != JSON_BOOL)
            return fail(e, 400, "logprobs", NULL, FERRY_ERR_INVALID, "logprobs must be true or false");
        if (kind == OAI_COMPLETIONS && (v->type != JSON_NUMBER || !v->is_int))
            return fail(e, 400, "logprobs", NULL, FERRY_ERR_INVALID, "logprobs must be an integer");
        if (v->type == JSON_NUMBER || v->boolean) return unsupported(e, "logprobs", "logprobs");
    }
    if ((v = field(root, "top_logprobs"))) {
        if (v->type != JSON_NUMBER || !v->is_int)
            return fail(e, 400, "top_logprobs", NULL, FERRY_ERR_INVALID, "top_logprobs must be an integer");
        if (v->integer != 0) return unsupported(e, "top_logprobs", "top_logprobs");
    }
    static const char *const penalties[] = {"presence_penalty", "frequency_penalty"};
    for (int i = 0; i < 2; i++) {
        double d = 0;
        FERRY_TRY(get_num(root, penalties[i], &d, e));
        if (d != 0) return unsupported(e, penalties[i], penalties[i]);
    }
    double rp = 1;
    FERRY_TRY(get_num(root, "repetition_penalty", &rp, e));
    if (rp != 1) return unsupported(e, "repetition_penalty", "repetition_penalty");
    if ((v = field(root, "logit_bias"))) {
        if (v->type != JSON_OBJECT)
            return fail(e, 400, "logit_bias", NULL, FERRY_ERR_INVALID, "logit_bias must be an object");
        if (v->len) return unsupported(e, "logit_bias", "logit_bias");
    }
    int64_t best_of = n;
    FERRY_TRY(get_int(root, "best_of", 1, OAI_MAX_N, &best_of, e));
    if (best_of != n) return unsupported(e, "best_of", "best_of other than n");
    if ((v = field(root, "suffix"))) {
        if (v->type != JSON_STRING) return fail(e, 400, "suffix", NULL, FERRY_ERR_INVALID, "suffix must be a string");
        if (v->len) return unsupported(e, "suffix", "suffix");
    }
    if ((v = field(root, "response_format"))) {
        bool bad = false;
        const char *type = json_get_str(v, "type", &bad);
        if (v->type != JSON_OBJECT || !type)
            return fail(e, 400, "response_format", NULL, FERRY_ERR_INVALID, "response_format must be an object with a type");
        if (strcmp(type, "text") != 0) return unsupported(e, "response_format", "response_format other than text");
    }
    if ((v = field(root, "tool_choice"))) {
        bool plain = v->type == JSON_STRING && (!strcmp(v->str, "none") || !strcmp(v->str, "auto"));
        if (v->type != JSON_STRING && v->type != JSON_OBJECT)
            return fail(e, 400, "tool_choice", NULL, FERRY_ERR_INVALID, "tool_choice must be a string or an object");
        if (!plain) return unsupported(e, "tool_choice", "tool_choice other than none or auto");
    }
    return FERRY_OK;
}

/* ---- prompts -------------------------------------------------------------------------------- */

/* Room for n_prompts prompts of `total` ids in all. */
static ferry_status alloc_prompts(oai_request *r, int n_prompts, size_t total, bool echo)
{
    r->n_prompts = n_prompts;
    r->ids = malloc((total ? total : 1) * sizeof *r->ids);
    r->off = calloc((size_t)n_prompts, sizeof *r->off);
    r->len = calloc((size_t)n_prompts, sizeof *r->len);
    if (echo) {
        r->echo = calloc((size_t)n_prompts, sizeof *r->echo);
        r->echo_len = calloc((size_t)n_prompts, sizeof *r->echo_len);
    }
    if (!r->ids || !r->off || !r->len || (echo && (!r->echo || !r->echo_len)))
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    return FERRY_OK;
}

static ferry_status keep_echo(oai_request *r, int p, const char *s, size_t len)
{
    if (!r->echo) return FERRY_OK;
    if (!(r->echo[p] = malloc(len + 1))) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    memcpy(r->echo[p], s, len);
    r->echo[p][len] = '\0';
    r->echo_len[p] = len;
    return FERRY_OK;
}

/* Token ids of prompt p from a JSON list; *at counts ids stored. */
static ferry_status put_ids(oai_request *r, int p, const json_value *list, size_t *at, const char *what, oai_error *e)
{
    if (list->len == 0) return fail(e, 400, "prompt", NULL, FERRY_ERR_INVALID, "%s is empty", what);
    r->off[p] = (int)*at;
    r->len[p] = (int)list->len;
    for (size_t k = 0; k < list->len; k++) {
        const json_value *t = &list->items[k];
        if (t->type != JSON_NUMBER || !t->is_int || t->integer < 0 || t->integer > INT32_MAX)
            return fail(e, 400, "prompt", NULL, FERRY_ERR_INVALID, "%s[%zu] is not a token id", what, k);
        r->ids[(*at)++] = (int32_t)t->integer;
    }
    return FERRY_OK;
}

/* Decoded ids, for echoing a prompt given as ids. */
static ferry_status echo_ids(const oai_ctx *ctx, oai_request *r, int p)
{
    if (!r->echo) return FERRY_OK;
    strbuf sb;
    sb_init(&sb);
    if (text_error(ctx->tm)) return ferry_fail(FERRY_ERR_UNSUPPORTED, "echo: %s", text_error(ctx->tm));
    ferry_status st = tok_decode(text_tokenizer(ctx->tm), r->ids + r->off[p], r->len[p], true, &sb);
    if (st == FERRY_OK && sb.oom) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    if (st == FERRY_OK) st = keep_echo(r, p, sb.data ? sb.data : "", sb.len);
    sb_free(&sb);
    return st;
}

/* A status from the text layer as the answer's status. */
static int status_of(ferry_status st)
{
    switch (st) {
    case FERRY_ERR_TOO_LARGE: return 413;
    case FERRY_ERR_NOMEM:
    case FERRY_ERR_BUSY: return 503;
    case FERRY_ERR_IO:
    case FERRY_ERR_INTERNAL: return 500;
    default: return 400;
    }
}

/* The budget for encoding s[0..len) as param (ctx->hold): by the text the
 * tokenizer will work on, known only once the text is. The prompts of a
 * list are encoded one after the other: the encoder's fixed working room
 * (TEXT_ENCODE_SLACK) is taken with the first, what grows with the text
 * (its ids, kept to the end of the parse) with each. A text past
 * --max-text-bytes takes nothing: text_encode refuses it, naming that. */
static ferry_status hold_encode(const oai_ctx *ctx, const char *s, size_t len, bool first, const char *param,
                                oai_error *e)
{
    if (!ctx->hold || len > text_max_bytes(ctx->tm)) return FERRY_OK;
    uint64_t n = text_encode_bound(text_encode_size(ctx->tm, s, len)) - (first ? 0 : TEXT_ENCODE_SLACK);
    char msg[200];
    int status = ctx->hold(ctx->hold_arg, n, msg, sizeof msg);
    if (status == 0) return FERRY_OK;
    return fail(e, status, param, NULL, status == 413 ? FERRY_ERR_TOO_LARGE : FERRY_ERR_BUSY, "%s", msg);
}

/* /v1/completions' prompt: a string, a list of strings, a list of ids, or
 * a list of lists of ids. */
static ferry_status parse_prompt(const json_value *root, const oai_ctx *ctx, bool echo, oai_request *r, oai_error *e)
{
    const json_value *pv = field(root, "prompt");
    if (!pv) return fail(e, 400, "prompt", NULL, FERRY_ERR_INVALID, "prompt is missing");
    bool strings = pv->type == JSON_STRING || (pv->type == JSON_ARRAY && pv->len && pv->items[0].type == JSON_STRING);
    if (pv->type != JSON_STRING && pv->type != JSON_ARRAY)
        return fail(e, 400, "prompt", NULL, FERRY_ERR_INVALID,
                    "prompt must be a string, a list of strings, a list of token ids or a list of such lists");
    if (pv->type == JSON_ARRAY && pv->len == 0) return fail(e, 400, "prompt", NULL, FERRY_ERR_INVALID, "prompt is empty");
    if (strings) {
        const json_value *list = pv->type == JSON_STRING ? pv : pv->items;
        size_t n = pv->type == JSON_STRING ? 1 : pv->len;
        if (n > OAI_MAX_ROWS)
            return fail(e, 400, "prompt", NULL, FERRY_ERR_INVALID, "%zu prompts in one request (at most %d)", n, OAI_MAX_ROWS);
        if (text_error(ctx->tm)) return fail(e, 400, "prompt", NULL, FERRY_ERR_UNSUPPORTED, "%s", text_error(ctx->tm));
        int32_t **enc = calloc(n, sizeof *enc);
        int *lens = calloc(n, sizeof *lens);
        ferry_status st = enc && lens ? FERRY_OK : ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        size_t total = 0;
        for (size_t i = 0; i < n && st == FERRY_OK; i++) {
            if (list[i].type != JSON_STRING) {
                st = fail(e, 400, "prompt", NULL, FERRY_ERR_INVALID, "prompt[%zu] must be a string like prompt[0]", i);
                break;
            }
            st = hold_encode(ctx, list[i].str, list[i].len, i == 0, "prompt", e);
            if (st != FERRY_OK) break;
            st = text_encode(ctx->tm, list[i].str, list[i].len, true, &enc[i], &lens[i]);
            if (st != FERRY_OK) st = fail(e, status_of(st), "prompt", NULL, st, "prompt: %s", ferry_errmsg());
            total += (size_t)lens[i];
        }
        if (st == FERRY_OK) st = alloc_prompts(r, (int)n, total, echo);
        size_t at = 0;
        for (size_t i = 0; i < n && st == FERRY_OK; i++) {
            r->off[i] = (int)at;
            r->len[i] = lens[i];
            if (lens[i]) memcpy(r->ids + at, enc[i], (size_t)lens[i] * sizeof *r->ids);
            at += (size_t)lens[i];
            st = keep_echo(r, (int)i, list[i].str, list[i].len);
        }
        for (size_t i = 0; enc && i < n; i++) free(enc[i]);
        free(enc);
        free(lens);
        return st;
    }
    bool nested = pv->items[0].type == JSON_ARRAY;
    size_t n = nested ? pv->len : 1, total = 0;
    if (n > OAI_MAX_ROWS)
        return fail(e, 400, "prompt", NULL, FERRY_ERR_INVALID, "%zu prompts in one request (at most %d)", n, OAI_MAX_ROWS);
    for (size_t i = 0; nested && i < n; i++) {
        if (pv->items[i].type != JSON_ARRAY)
            return fail(e, 400, "prompt", NULL, FERRY_ERR_INVALID, "prompt[%zu] must be a list of token ids like prompt[0]", i);
        total += pv->items[i].len;
    }
    if (!nested) total = pv->len;
    if (total > (size_t)INT32_MAX / 2) return fail(e, 400, "prompt", NULL, FERRY_ERR_INVALID, "prompt: too many tokens");
    FERRY_TRY(alloc_prompts(r, (int)n, total, echo));
    size_t at = 0;
    char what[32];
    for (size_t i = 0; i < n; i++) {
        if (nested) snprintf(what, sizeof what, "prompt[%zu]", i);
        else snprintf(what, sizeof what, "prompt");
        FERRY_TRY(put_ids(r, (int)i, nested ? &pv->items[i] : pv, &at, what, e));
        FERRY_TRY(echo_ids(ctx, r, (int)i));
    }
    return FERRY_OK;
}

/* /v1/chat/completions' messages, rendered and encoded: one prompt. */
static ferry_status parse_messages(const json_value *root, const oai_ctx *ctx, oai_request *r, oai_error *e)
{
    const json_value *msgs = field(root, "messages");
    if (!msgs) return fail(e, 400, "messages", NULL, FERRY_ERR_INVALID, "messages is missing");
    if (text_chat_error(ctx->tm))
        return fail(e, 400, "messages", NULL, FERRY_ERR_UNSUPPORTED, "%s", text_chat_error(ctx->tm));
    strbuf prompt;
    sb_init(&prompt);
    ferry_status st = text_render_chat(ctx->tm, msgs, field(root, "tools"), field(root, "chat_template_kwargs"),
                                       ctx->max_render, &prompt);
    if (st == FERRY_OK && prompt.oom) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    int32_t *ids = NULL;
    int n = 0;
    if (st == FERRY_OK) st = hold_encode(ctx, prompt.data ? prompt.data : "", prompt.len, true, "messages", e);
    if (st == FERRY_OK) st = text_encode(ctx->tm, prompt.data ? prompt.data : "", prompt.len, false, &ids, &n);
    sb_free(&prompt);
    if (st == FERRY_OK) st = alloc_prompts(r, 1, (size_t)n, false);
    if (st == FERRY_OK) {
        if (n) memcpy(r->ids, ids, (size_t)n * sizeof *ids);
        r->len[0] = n;
    }
    free(ids);
    if (st != FERRY_OK && st != FERRY_ERR_NOMEM) {
        const char *param = strstr(ferry_errmsg(), "tools") == ferry_errmsg() ? "tools" : "messages";
        return fail(e, status_of(st), param, NULL, st, "%s", ferry_errmsg());
    }
    return st;
}

/* ---- the request ------------------------------------------------------------------------------ */

/* One of gen_params.def's parameters as OpenAI writes it, and vLLM, whose
 * conventions the clients of an open model follow: top_k -1 is all, and a
 * seed is any int64 (a negative one its two's complement bits). */
static ferry_status oai_param(oai_request *r, gen_param id, const char *name, const json_value *v, oai_error *e)
{
    if (!v) return FERRY_OK;
    bool is_int = v->type == JSON_NUMBER && v->is_int;
    ferry_status st;
    if (id == GEN_stop) {
        text_stops_free(&r->stops);
        st = text_stops_parse(v, name, &r->stops);
    } else if (id == GEN_seed) {
        if (!is_int)
            return fail(e, 400, name, NULL, FERRY_ERR_INVALID, "%s must be an integer in %lld..%lld", name,
                        (long long)INT64_MIN, (long long)INT64_MAX);
        st = gen_param_set_u64(&r->gen, id, name, (uint64_t)v->integer);
    } else if (id == GEN_top_k && is_int && v->integer == -1) {
        st = gen_param_set_int(&r->gen, id, name, 0);
    } else {
        st = gen_param_set_json(&r->gen, id, name, v);
        if (st != FERRY_OK && id == GEN_top_k) return fail(e, 400, name, NULL, st, "%s, or -1 (all)", ferry_errmsg());
    }
    if (st != FERRY_OK) return fail(e, 400, name, NULL, st, "%s", ferry_errmsg());
    r->named[id] = name;
    return FERRY_OK;
}

/* The generation parameters by their OpenAI names, over the settings'
 * defaults where OpenAI's API has none of its own (temperature 1; a seed
 * of its own for every request that names none). */
static ferry_status parse_gen_params(oai_kind kind, const json_value *root, oai_request *r, oai_error *e)
{
    config_gen_defaults(&r->gen);
    r->gen.sampling.temperature = 1.0f;
    for (int id = 0; id < GEN_PARAM_COUNT; id++) {
        const gen_param_def *d = &gen_param_defs[id];
        /* chat: max_completion_tokens replaces max_tokens (deprecated), which is
         * checked even then: a wrong type is a 400 */
        FERRY_TRY(oai_param(r, (gen_param)id, d->openai, field(root, d->openai), e));
        if (kind == OAI_CHAT && d->chat) FERRY_TRY(oai_param(r, (gen_param)id, d->chat, field(root, d->chat), e));
    }
    if (!r->gen.given[GEN_seed]) r->gen.sampling.seed = fresh_u64();
    return FERRY_OK;
}

static ferry_status parse_fields(oai_kind kind, const json_value *root, const oai_ctx *ctx, oai_request *r,
                                 oai_error *e)
{
    const json_value *model = json_get(root, "model");
    if (model && model->type != JSON_NULL) {
        if (model->type != JSON_STRING) return fail(e, 400, "model", NULL, FERRY_ERR_INVALID, "model must be a string");
        if (strcmp(model->str, ctx->model) != 0)
            return fail(e, 404, "model", "model_not_found", FERRY_ERR_NOT_FOUND,
                        "The model '%.200s' does not exist (this server serves '%s')", model->str, ctx->model);
    }
    int64_t n = 1;
    FERRY_TRY(get_int(root, "n", 1, OAI_MAX_N, &n, e));
    r->n = (int)n;
    FERRY_TRY(check_unsupported(kind, root, r->n, e));
    FERRY_TRY(parse_gen_params(kind, root, r, e));
    FERRY_TRY(get_bool(root, "stream", &r->stream, e));
    const json_value *so = field(root, "stream_options");
    if (so && !r->stream) /* as vLLM */
        return fail(e, 400, "stream_options", NULL, FERRY_ERR_INVALID, "stream_options can only be given with stream: true");
    if (so) {
        if (so->type != JSON_OBJECT)
            return fail(e, 400, "stream_options", NULL, FERRY_ERR_INVALID, "stream_options must be an object");
        const json_value *iu = field(so, "include_usage");
        if (iu && iu->type != JSON_BOOL)
            return fail(e, 400, "stream_options.include_usage", NULL, FERRY_ERR_INVALID,
                        "stream_options.include_usage must be true or false");
        r->include_usage = iu && iu->boolean;
    }
    bool ignore_eos = false;
    FERRY_TRY(get_bool(root, "ignore_eos", &ignore_eos, e));
    if (!text_error(ctx->tm) && text_request_defaults(ctx->tm, &r->gen, ignore_eos) != FERRY_OK)
        return fail(e, 400, "stop_token_ids", NULL, FERRY_ERR_INVALID, "%s", ferry_errmsg());
    const json_value *tools = field(root, "tools");
    if (tools && tools->type != JSON_ARRAY)
        return fail(e, 400, "tools", NULL, FERRY_ERR_INVALID, "tools must be a list");
    const json_value *kw = field(root, "chat_template_kwargs");
    if (kw && kw->type != JSON_OBJECT)
        return fail(e, 400, "chat_template_kwargs", NULL, FERRY_ERR_INVALID, "chat_template_kwargs must be an object");
    return FERRY_OK;
}

/* Every row against request_check, a refusal named as OpenAI names it:
 * past the context, context_length_exceeded in OpenAI's words; otherwise
 * the field at fault. */
static ferry_status check_rows(oai_request *r, const engine_limits *lim, oai_error *e)
{
    const char *param = r->kind == OAI_CHAT ? "messages" : "prompt";
    int64_t cap = request_context(lim);
    for (int p = 0; p < r->n_prompts; p++)
        if (r->len[p] == 0) return fail(e, 400, param, NULL, FERRY_ERR_INVALID, "%s encodes to no tokens", param);
    if (r->kind == OAI_CHAT && !r->gen.given[GEN_max_new_tokens]) {
        /* one prompt: what the context leaves, within the server's cap; with
         * nothing left, one token, which request_check refuses as the context's */
        int64_t room = cap - r->len[0];
        if (lim->max_new > 0 && room > lim->max_new) room = lim->max_new;
        r->gen.max_new_tokens = (int)(room > 1 ? room : 1);
    }
    char what[32];
    for (int i = 0; i < oai_rows(r); i++) {
        gen_request g = oai_row_request(r, i);
        if (r->n_prompts > 1) snprintf(what, sizeof what, "%s[%d]", param, i / r->n);
        else snprintf(what, sizeof what, "%s", param);
        request_field bad;
        if (request_check(&g, lim, what, &bad) == FERRY_OK) continue;
        if (bad == REQUEST_FIELD_CONTEXT)
            return fail(e, 400, param, "context_length_exceeded", FERRY_ERR_INVALID,
                        "This model's maximum context length is %lld tokens. However, you requested %lld tokens "
                        "(%d in the %s, %d for the completion). Please reduce the length of the %s or the "
                        "completion.",
                        (long long)cap, (long long)g.prompt_len + g.max_new_tokens, g.prompt_len, param,
                        g.max_new_tokens, param);
        const char *field_at = bad == REQUEST_FIELD_PROMPT ? param
                               : r->named[bad]             ? r->named[bad]
                                                           : gen_param_defs[bad].openai;
        char msg[FERRY_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", ferry_errmsg());
        return fail(e, 400, field_at, NULL, FERRY_ERR_INVALID, "%s", msg);
    }
    return FERRY_OK;
}

ferry_status oai_parse(oai_kind kind, const char *body, size_t len, const oai_ctx *ctx, oai_request **out,
                       oai_error *err)
{
    *out = NULL;
    memset(err, 0, sizeof *err);
    err->status = 400;
    oai_request *r = calloc(1, sizeof *r);
    if (!r) return fail(err, 503, NULL, NULL, FERRY_ERR_NOMEM, "out of memory");
    r->kind = kind;
    r->created = (int64_t)util_wall_now();
    snprintf(r->id, sizeof r->id, "%s-%016llx%08llx", kind == OAI_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)fresh_u64(), (unsigned long long)(fresh_u64() & 0xffffffffu));
    json_doc *doc = NULL;
    ferry_status st = json_parse_limited(body, len, ctx->max_parse, &doc);
    if (st != FERRY_OK) {
        st = st == FERRY_ERR_INVALID ? fail(err, 400, NULL, NULL, st, "malformed JSON: %s", ferry_errmsg())
                                     : fail(err, status_of(st), NULL, NULL, st, "%s", ferry_errmsg());
        goto fail;
    }
    const json_value *root = json_doc_root(doc);
    bool echo = false;
    if (root->type != JSON_OBJECT) st = fail(err, 400, NULL, NULL, FERRY_ERR_INVALID, "the request must be a JSON object");
    if (st == FERRY_OK) st = parse_fields(kind, root, ctx, r, err);
    if (st == FERRY_OK && kind == OAI_COMPLETIONS) st = get_bool(root, "echo", &echo, err);
    if (st == FERRY_OK)
        st = kind == OAI_CHAT ? parse_messages(root, ctx, r, err) : parse_prompt(root, ctx, echo, r, err);
    if (st == FERRY_OK && (int64_t)r->n_prompts * r->n > OAI_MAX_ROWS)
        st = fail(err, 400, "n", NULL, FERRY_ERR_INVALID, "%d prompts x n %d choices: more than %d in one request",
                  r->n_prompts, r->n, OAI_MAX_ROWS);
    if (st == FERRY_OK) st = check_rows(r, ctx->lim, err);
    if (st == FERRY_ERR_NOMEM) err->status = 503;
    json_doc_free(doc);
    if (st != FERRY_OK) goto fail;
    *out = r;
    return FERRY_OK;
fail:
    oai_request_free(r);
    return st;
}

void oai_request_free(oai_request *r)
{
    if (!r) return;
    for (int p = 0; r->echo && p < r->n_prompts; p++) free(r->echo[p]);
    free(r->echo);
    free(r->echo_len);
    free(r->ids);
    free(r->off);
    free(r->len);
    text_stops_free(&r->stops);
    free(r);
}

size_t oai_request_bytes(const oai_request *r)
{
    size_t n = sizeof *r + text_stops_bytes(&r->stops) + (size_t)r->n_prompts * (2 * sizeof(int));
    for (int p = 0; p < r->n_prompts; p++) {
        n += (size_t)r->len[p] * sizeof(int32_t);
        if (r->echo) n += sizeof(char *) + sizeof(size_t) + r->echo_len[p] + 1;
    }
    return n;
}

int oai_rows(const oai_request *r) { return r->n_prompts * r->n; }
const text_stops *oai_stops(const oai_request *r) { return &r->stops; }
bool oai_streaming(const oai_request *r) { return r->stream; }

gen_request oai_row_request(const oai_request *r, int row)
{
    gen_request g;
    memset(&g, 0, sizeof g);
    int p = row / r->n;
    g.prompt = r->ids + r->off[p];
    g.prompt_len = r->len[p];
    request_set_params(&g, &r->gen);
    g.stream = (uint64_t)row; /* the n choices of a prompt draw from different streams of the one seed */
    return g;
}

#define CHUNK_BYTES 320 /* a chunk's JSON around its text, id and model name aside */

uint64_t oai_answer_bytes(const oai_request *r, const char *model, size_t token_bytes)
{
    uint64_t rows = (uint64_t)oai_rows(r), tokens = (uint64_t)r->gen.max_new_tokens;
    uint64_t chunk = CHUNK_BYTES + strlen(model) + strlen(r->id), text = 6 * (uint64_t)token_bytes; /* JSON-escaped */
    uint64_t echo = 0;
    for (int p = 0; r->echo && p < r->n_prompts; p++) echo += 6 * (uint64_t)r->echo_len[p] * (uint64_t)r->n;
    if (r->stream) return rows * (tokens + 2) * (chunk + text) + echo + 2 * chunk + 4096;
    return rows * (tokens * text + chunk) + echo + chunk + 4096;
}

/* ---- answers ---------------------------------------------------------------------------------- */

void oai_error_body(strbuf *sb, int status, const char *msg, const char *param, const char *code)
{
    sb_puts(sb, "{\"error\": {\"message\": ");
    sb_json_str(sb, msg && *msg ? msg : "error");
    sb_puts(sb, status < 500 ? ", \"type\": \"invalid_request_error\"" : ", \"type\": \"server_error\"");
    sb_puts(sb, ", \"param\": ");
    if (param && *param) sb_json_str(sb, param);
    else sb_puts(sb, "null");
    sb_puts(sb, ", \"code\": ");
    if (code) sb_json_str(sb, code);
    else sb_puts(sb, "null");
    sb_puts(sb, "}}");
}

void oai_models(strbuf *sb, const char *model, int64_t created, int max_model_len)
{
    sb_puts(sb, "{\"object\": \"list\", \"data\": [{\"id\": ");
    sb_json_str(sb, model);
    sb_printf(sb, ", \"object\": \"model\", \"created\": %lld, \"owned_by\": \"ferry\", \"root\": ", (long long)created);
    sb_json_str(sb, model);
    sb_printf(sb, ", \"max_model_len\": %d}]}", max_model_len);
}

static void put_head(strbuf *sb, const oai_request *r, const char *model, bool chunk)
{
    sb_puts(sb, "{\"id\": ");
    sb_json_str(sb, r->id);
    const char *object = r->kind == OAI_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    sb_printf(sb, ", \"object\": \"%s\", \"created\": %lld, \"model\": ", object, (long long)r->created);
    sb_json_str(sb, model);
}

static void put_finish(strbuf *sb, text_finish f)
{
    const char *name = text_finish_name(f);
    sb_puts(sb, ", \"logprobs\": null, \"finish_reason\": ");
    if (name) sb_printf(sb, "\"%s\"", name);
    else sb_puts(sb, "null");
}

static void put_usage(strbuf *sb, const oai_request *r, int completion_tokens)
{
    int64_t prompt = 0;
    for (int p = 0; p < r->n_prompts; p++) prompt += r->len[p];
    sb_printf(sb, "\"usage\": {\"prompt_tokens\": %lld, \"completion_tokens\": %d, \"total_tokens\": %lld}",
              (long long)prompt, completion_tokens, (long long)prompt + completion_tokens);
}

void oai_response(strbuf *sb, const oai_request *r, const char *model, const oai_choice *choices)
{
    put_head(sb, r, model, false);
    sb_puts(sb, ", \"choices\": [");
    int completion = 0;
    for (int i = 0; i < oai_rows(r); i++) {
        const oai_choice *c = &choices[i];
        completion += c->n_tokens;
        sb_printf(sb, "%s{\"index\": %d, ", i ? ", " : "", i);
        if (r->kind == OAI_CHAT) {
            sb_puts(sb, "\"message\": {\"role\": \"assistant\", \"content\": ");
            sb_json_strn(sb, c->text, c->len);
            sb_putc(sb, '}');
        } else {
            int p = i / r->n;
            sb_puts(sb, "\"text\": ");
            if (r->echo) { /* the prompt, then the completion, as one string */
                strbuf both;
                sb_init(&both);
                sb_append(&both, r->echo[p], r->echo_len[p]);
                sb_append(&both, c->text, c->len);
                if (both.oom) sb->oom = true;
                sb_json_strn(sb, both.data ? both.data : "", both.len);
                sb_free(&both);
            } else {
                sb_json_strn(sb, c->text, c->len);
            }
        }
        put_finish(sb, c->finish);
        sb_putc(sb, '}');
    }
    sb_puts(sb, "], ");
    put_usage(sb, r, completion);
    sb_putc(sb, '}');
}

static void put_chunk(strbuf *sb, const oai_request *r, const char *model, int row, const char *role,
                      const char *text, size_t len, bool with_text, text_finish finish)
{
    sb_puts(sb, "data: ");
    put_head(sb, r, model, true);
    sb_printf(sb, ", \"choices\": [{\"index\": %d, ", row);
    if (r->kind == OAI_CHAT) {
        sb_puts(sb, "\"delta\": {");
        if (role) sb_printf(sb, "\"role\": \"%s\"%s", role, with_text ? ", " : "");
        if (with_text) {
            sb_puts(sb, "\"content\": ");
            sb_json_strn(sb, text, len);
        }
        sb_putc(sb, '}');
    } else {
        sb_puts(sb, "\"text\": ");
        sb_json_strn(sb, text, len);
    }
    put_finish(sb, finish);
    sb_puts(sb, "}]}\n\n");
}

void oai_stream_start(strbuf *sb, const oai_request *r, const char *model)
{
    for (int i = 0; i < oai_rows(r); i++) {
        if (r->kind == OAI_CHAT) put_chunk(sb, r, model, i, "assistant", "", 0, true, TEXT_FINISH_NONE);
        else if (r->echo) put_chunk(sb, r, model, i, NULL, r->echo[i / r->n], r->echo_len[i / r->n], true, TEXT_FINISH_NONE);
    }
}

void oai_stream_delta(strbuf *sb, const oai_request *r, const char *model, int row, const char *text, size_t len,
                      text_finish finish)
{
    put_chunk(sb, r, model, row, NULL, text, len, len > 0 || r->kind != OAI_CHAT, finish);
}

void oai_stream_end(strbuf *sb, const oai_request *r, const char *model, bool ok, int completion_tokens)
{
    if (ok && r->include_usage) {
        sb_puts(sb, "data: ");
        put_head(sb, r, model, true);
        sb_puts(sb, ", \"choices\": [], ");
        put_usage(sb, r, completion_tokens);
        sb_puts(sb, "}\n\n");
    }
    sb_puts(sb, "data: [DONE]\n\n");
}

void oai_stream_error(strbuf *sb, int status, const char *msg)
{
    sb_puts(sb, "data: ");
    oai_error_body(sb, status, msg, NULL, NULL);
    sb_puts(sb, "\n\n");
}
