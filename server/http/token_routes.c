/*
 * token_routes.c - POST /tokenize and /detokenize, as llama.cpp's server
 * has them: the model's tokenizer without the engine, answered on a prep
 * worker within the request-memory budget. Their errors are KServe-style
 * {"error": ...}, as on every path outside /v1.
 */
#include <stdlib.h>

#include "../kserve.h"
#include "api.h"

/* {"content": "...", "add_special": false, "parse_special": true} -> {"tokens": [...]} */
static ferry_status tokenize_body(const text_model *tm, const json_value *root, strbuf *sb)
{
    bool bad = false, add_special = false, parse_special = true, pieces = false;
    const json_value *content = json_get(root, "content");
    json_get_bool(root, "add_special", &add_special, &bad);
    if (bad) return ferry_fail(FERRY_ERR_INVALID, "add_special must be true or false");
    json_get_bool(root, "parse_special", &parse_special, &bad);
    if (bad) return ferry_fail(FERRY_ERR_INVALID, "parse_special must be true or false");
    json_get_bool(root, "with_pieces", &pieces, &bad);
    if (bad || pieces) return ferry_fail(FERRY_ERR_INVALID, "with_pieces is not supported");
    if (!content || content->type != JSON_STRING) return ferry_fail(FERRY_ERR_INVALID, "content must be a string");
    int32_t *ids = NULL;
    int n = 0;
    FERRY_TRY(text_tokenize(tm, content->str, content->len, add_special, parse_special, &ids, &n));
    sb_puts(sb, "{\"tokens\": [");
    for (int i = 0; i < n; i++) sb_printf(sb, "%s%d", i ? ", " : "", ids[i]);
    sb_puts(sb, "]}");
    free(ids);
    return FERRY_OK;
}

/* /tokenize's hold counts a byte of content a byte of the body; a content
 * that grows before it is tokenized (NFC, lowercase) needs more: taken into
 * *hold here. */
static ferry_status hold_grown_text(http_req *rq, const text_model *tm, const json_value *content, size_t len,
                                    uint64_t *hold)
{
    if (!content || content->type != JSON_STRING || content->len > text_max_bytes(tm))
        return FERRY_OK; /* tokenize_body refuses it */
    size_t size = text_encode_size(tm, content->str, content->len);
    if (size <= len) return FERRY_OK;
    /* saturates as text_encode_bound does, not wrapping to a small sum */
    uint64_t more = size > UINT64_MAX / 32 ? UINT64_MAX
                                           : text_encode_bound(size) - text_encode_bound(len) + (uint64_t)(size - len) * 12;
    char msg[200];
    int status = http_req_take_more(rq, more, "encoding the content (grown when normalized)", msg, sizeof msg);
    if (status) return ferry_fail(status == 413 ? FERRY_ERR_TOO_LARGE : FERRY_ERR_BUSY, "%s", msg);
    *hold += more;
    return FERRY_OK;
}

/* {"tokens": [...]} -> {"content": "..."}, special tokens written out */
static ferry_status detokenize_body(const tokenizer *t, const json_value *root, int vocab, strbuf *sb)
{
    const json_value *tokens = json_get(root, "tokens");
    if (!tokens || tokens->type != JSON_ARRAY) return ferry_fail(FERRY_ERR_INVALID, "tokens must be a list of token ids");
    int32_t *ids = malloc((tokens->len + 1) * sizeof *ids);
    if (!ids) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    ferry_status st = FERRY_OK;
    for (size_t i = 0; st == FERRY_OK && i < tokens->len; i++) {
        const json_value *v = &tokens->items[i];
        if (v->type != JSON_NUMBER || !v->is_int || v->integer < 0 || v->integer >= vocab)
            st = ferry_fail(FERRY_ERR_INVALID, "tokens[%zu] is not a token id of the model (0..%d)", i, vocab - 1);
        else ids[i] = (int32_t)v->integer;
    }
    strbuf text;
    sb_init(&text);
    if (st == FERRY_OK) st = tok_decode(t, ids, (int)tokens->len, false, &text);
    if (st == FERRY_OK) {
        sb_puts(sb, "{\"content\": ");
        sb_json_strn(sb, text.data ? text.data : "", text.len);
        sb_putc(sb, '}');
        sb->oom |= text.oom;
    }
    sb_free(&text);
    free(ids);
    return st;
}

static bool answer_tokens(http_req *rq, bool tokenize)
{
    http_server *srv = http_req_ctx(rq);
    const api_model *m = api_hold(srv);
    const text_model *tm = m->s ? m->tm : NULL;
    int vocab = m->lim.vocab;
    api_release(srv);
    if (!tm) return http_reply_error(rq, 503, "model not ready");
    if (text_error(tm)) return http_reply_error(rq, 400, text_error(tm));
    size_t len;
    const char *body = http_req_body(rq, &len);
    /* the tree, and: the ids and their JSON (12 bytes each; a byte of text
     * makes at most one id, BOS/EOS aside; text that grows when normalized
     * takes more, hold_grown_text); or the text of at most len / 2
     * ids ("1," each) and its JSON (6 bytes a byte at worst) */
    uint64_t hold = kserve_parse_bound(len) + 4096 +
                    (tokenize ? text_encode_bound(len) + ((uint64_t)len + 8) * 12
                              : ((uint64_t)len / 2 + 1) * text_max_token_bytes(tm) * 7);
    if (hold > http_req_limit(rq)) return http_reply_error(rq, 413, "the request is too large for --request-memory");
    if (!http_req_take(rq, hold)) return http_reply_busy(rq);
    json_doc *doc = NULL;
    strbuf sb;
    sb_init(&sb);
    ferry_status st = json_parse_limited(body, len, kserve_parse_bound(len), &doc);
    if (st == FERRY_ERR_INVALID) ferry_fail_context(st, "malformed JSON");
    const json_value *root = st == FERRY_OK ? json_doc_root(doc) : NULL;
    if (st == FERRY_OK && root->type != JSON_OBJECT) st = ferry_fail(FERRY_ERR_INVALID, "the request must be a JSON object");
    if (st == FERRY_OK && tokenize) st = hold_grown_text(rq, tm, json_get(root, "content"), len, &hold);
    if (st == FERRY_OK)
        st = tokenize ? tokenize_body(tm, root, &sb) : detokenize_body(text_tokenizer(tm), root, vocab, &sb);
    json_doc_free(doc);
    http_req_body_free(rq);
    if (st != FERRY_OK) {
        sb_free(&sb);
        bool ok = http_reply_error(rq, kserve_http_status(st), ferry_errmsg());
        http_req_give(rq, hold);
        return ok;
    }
    size_t keep = sb.cap < hold ? sb.cap : hold; /* the answer, until MHD has sent it (freed with the request) */
    bool ok = http_reply_json(rq, 200, &sb, NULL, NULL);
    http_req_give(rq, hold - keep);
    return ok;
}

static bool tokenize(http_req *rq) { return answer_tokens(rq, true); }
static bool detokenize(http_req *rq) { return answer_tokens(rq, false); }

static const http_route k_routes[] = {
    {"POST", "/tokenize", "tokenize", tokenize, NULL, HTTP_BODY | HTTP_PREP, NULL, NULL},
    {"POST", "/detokenize", "detokenize", detokenize, NULL, HTTP_BODY | HTTP_PREP, NULL, NULL},
};

const http_route_table token_routes = {k_routes, sizeof k_routes / sizeof k_routes[0]};
