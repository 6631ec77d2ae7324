/*
 * fuzz_chat_template.c - libFuzzer target for the chat-template interpreter
 * (text/chat_template.h), whose templates come with checkpoints and
 * whose variables come from requests.
 *
 * The input is a template, optionally followed by a line "\n--vars--\n" and
 * the variables as JSON (an object; without it a small conversation is
 * used). Promises: tmpl_parse either fails (invalid, too large, out of
 * memory) leaving no template, or succeeds; a render either succeeds with
 * output no longer than max_out or fails with a message; and renders are
 * deterministic (two give the same outcome), unless the template reads the
 * clock. A broken promise aborts, which libFuzzer reports as a crash.
 */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/base/json.h"
#include "../../text/chat_template.h"

static const char default_vars[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"hi {{ x }}\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>t</think>a\", \"tool_calls\": [{\"id\": \"abcdefghi\","
    " \"function\": {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, null]}}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"abcdefghi\", \"content\": \"r\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

#define MAX_OUT 65536

static ferry_status render(const chat_template *t, const json_value *vars, strbuf *out)
{
    sb_init(out);
    ferry_status st = tmpl_render(t, vars, MAX_OUT, out);
    if (st == FERRY_OK && out->len > MAX_OUT) abort();
    if (st != FERRY_OK && ferry_errmsg()[0] == '\0') abort();
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *src = (const char *)data;
    size_t tlen = size;
    const char *vars = default_vars;
    size_t vlen = sizeof default_vars - 1;
    static const char sep[] = "\n--vars--\n";
    for (size_t i = 0; i + sizeof sep - 1 <= size; i++)
        if (memcmp(data + i, sep, sizeof sep - 1) == 0) {
            tlen = i;
            vars = src + i + sizeof sep - 1;
            vlen = size - i - (sizeof sep - 1);
            break;
        }
    chat_template *t = NULL;
    ferry_status st = tmpl_parse(src, tlen, "chat template", &t);
    if (st != FERRY_OK) {
        if (t) abort();
        if (st != FERRY_ERR_INVALID && st != FERRY_ERR_TOO_LARGE && st != FERRY_ERR_NOMEM) abort();
        return 0;
    }
    json_doc *doc = NULL;
    if (json_parse(vars, vlen, &doc) == FERRY_OK) {
        strbuf a, b;
        ferry_status s1 = render(t, json_doc_root(doc), &a);
        ferry_status s2 = render(t, json_doc_root(doc), &b);
        bool clock = memmem(src, tlen, "strftime", 8) != NULL;
        if (!clock && (s1 != s2 || (s1 == FERRY_OK && (a.len != b.len || memcmp(a.data, b.data, a.len) != 0)))) abort();
        sb_free(&a);
        sb_free(&b);
        json_doc_free(doc);
    }
    tmpl_free(t);
    return 0;
}
