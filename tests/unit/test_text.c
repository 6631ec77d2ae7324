/*
 * test_text.c - the text layer (text/text.h) on the repository's demo
 * tokenizer (config/demo-tokenizer; run from the repository root, as
 * `make unit` does).
 *
 * Covers: loading (the model's eos, the chat template, a directory without
 * tokenizer.json, generation_config.json's values and a malformed one);
 * streaming decode whose deltas concatenate to the whole decode; stop
 * strings matched across token boundaries, never returned, held back
 * while they could still begin (and released at the end when they did
 * not), the first of several winning; finish reasons (stop string, stop
 * id, length); stop-string parsing; request defaults; chat rendering of
 * content parts; the JSON string writer with NUL and control bytes.
 */
#define _GNU_SOURCE /* memmem, mkdtemp */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../engine/base/util.h"
#include "../../text/text.h"
#include "check.h"

#define DEMO "config/demo-tokenizer"

static text_model *g_m;

static gen_request request_for(int max_new)
{
    gen_request g;
    memset(&g, 0, sizeof g);
    g.max_new_tokens = max_new;
    return g;
}

static text_stops stops_of(const char *json)
{
    json_doc *doc = NULL;
    text_stops s;
    memset(&s, 0, sizeof s);
    CHECK_STATUS(json_parse(json, strlen(json), &doc), FERRY_OK);
    if (doc) CHECK_STATUS(text_stops_parse(json_doc_root(doc), "stop", &s), FERRY_OK);
    json_doc_free(doc);
    return s;
}

/* Streams the ids of text through a text_stream with stops; returns the
 * concatenated deltas (malloc'd), the finish reason, and checks that no
 * delta is released past where a stop string could begin. */
static char *stream_through(const char *text, const char *stops_json, int max_new, text_finish *finish,
                            int *pushed_until_stop)
{
    int32_t *ids = NULL;
    int n = 0;
    CHECK_STATUS(text_encode(g_m, text, strlen(text), false, &ids, &n), FERRY_OK);
    text_stops stops = stops_of(stops_json ? stops_json : "null");
    gen_request g = request_for(max_new);
    text_stream *ts = NULL;
    CHECK_STATUS(text_stream_new(g_m, &g, &stops, &ts), FERRY_OK);
    strbuf all, delta;
    sb_init(&all);
    sb_init(&delta);
    *pushed_until_stop = -1;
    for (int i = 0; ts && i < n; i++) {
        delta.len = 0;
        bool stop = text_stream_push(ts, ids[i], &delta);
        sb_append(&all, delta.data, delta.len);
        for (int k = 0; k < stops.n; k++) { /* a stop string is never released, not even in part across deltas */
            sb_putc(&all, '\0');
            all.len--;
            CHECK(!memmem(all.data, all.len, stops.s[k], stops.len[k]));
        }
        if (stop && *pushed_until_stop < 0) *pushed_until_stop = i + 1;
    }
    delta.len = 0;
    if (ts) *finish = text_stream_end(ts, &delta);
    sb_append(&all, delta.data, delta.len);
    sb_putc(&all, '\0');
    text_stream_free(ts);
    text_stops_free(&stops);
    sb_free(&delta);
    free(ids);
    return all.data;
}

static void test_load(void)
{
    CHECK_STATUS(text_model_load(DEMO, 0, &g_m), FERRY_OK);
    CHECK(text_error(g_m) == NULL);
    CHECK(text_chat_error(g_m) == NULL);
    const int32_t *eos = NULL;
    CHECK_EQ_INT(text_eos_ids(g_m, &eos), 1);
    CHECK_EQ_INT(eos[0], tok_token_id(text_tokenizer(g_m), "<|im_end|>"));
    CHECK(text_max_token_bytes(g_m) >= 3);

    /* no tokenizer.json: ids only, and every text call says why */
    text_model *bare = NULL;
    CHECK_STATUS(text_model_load("tests/unit", 0, &bare), FERRY_OK);
    CHECK(bare && text_error(bare) && strstr(text_error(bare), "tokenizer.json"));
    CHECK(bare && text_chat_error(bare) != NULL);
    int32_t *ids = NULL;
    int n = 0;
    if (bare) CHECK_STATUS(text_encode(bare, "x", 1, true, &ids, &n), FERRY_ERR_UNSUPPORTED);
    text_model_free(bare);
}

/* A model dir of the demo tokenizer plus a generation_config.json. */
static char *dir_with_generation_config(const char *config)
{
    char *dir = strdup("/tmp/ferry-test-text-XXXXXX");
    if (!dir || !mkdtemp(dir)) return dir;
    static const char *const files[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 2; i++) {
        char *src = util_path_join(DEMO, files[i]), *dst = util_path_join(dir, files[i]), *data = NULL;
        size_t len = 0;
        CHECK_STATUS(util_read_file(src, &data, &len), FERRY_OK);
        CHECK_STATUS(util_write_file_atomic(dst, data, len), FERRY_OK);
        free(src), free(dst), free(data);
    }
    char *gc = util_path_join(dir, "generation_config.json");
    CHECK_STATUS(util_write_file_atomic(gc, config, strlen(config)), FERRY_OK);
    free(gc);
    return dir;
}

static void remove_dir(char *dir)
{
    static const char *const files[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json"};
    for (int i = 0; i < 3; i++) {
        char *p = util_path_join(dir, files[i]);
        unlink(p);
        free(p);
    }
    rmdir(dir);
    free(dir);
}

static void test_generation_config(void)
{
    char *dir = dir_with_generation_config("{\"eos_token_id\": [0, 2], \"temperature\": 0.6, \"top_k\": 20}");
    text_model *m = NULL;
    CHECK_STATUS(text_model_load(dir, 0, &m), FERRY_OK);
    CHECK(m && !text_error(m));
    if (m) {
        const int32_t *eos = NULL;
        CHECK_EQ_INT(text_eos_ids(m, &eos), 2); /* <|im_end|> (2) once, and 0 */
        gen_params p = {.sampling = {1.0f, 0, 1.0f, 0}, .stop_ids = {7}, .n_stop = 1};
        CHECK_STATUS(text_request_defaults(m, &p, false), FERRY_OK);
        CHECK(p.sampling.temperature == 0.6f && p.sampling.top_k == 20 && p.sampling.top_p == 1.0f);
        CHECK_EQ_INT(p.n_stop, 3);
        CHECK_EQ_INT(p.stop_ids[0], 7);
        /* what the request set stays; ignore_eos adds no ids */
        p = (gen_params){.sampling = {0.0f, 5, 0.5f, 0}};
        p.given[GEN_temperature] = p.given[GEN_top_p] = p.given[GEN_top_k] = true;
        CHECK_STATUS(text_request_defaults(m, &p, true), FERRY_OK);
        CHECK(p.sampling.temperature == 0.0f && p.sampling.top_k == 5 && p.sampling.top_p == 0.5f);
        CHECK_EQ_INT(p.n_stop, 0);
        /* no room for the eos ids */
        p.n_stop = REQUEST_MAX_STOP;
        for (int i = 0; i < REQUEST_MAX_STOP; i++) p.stop_ids[i] = 100 + i;
        CHECK_STATUS(text_request_defaults(m, &p, false), FERRY_ERR_INVALID);
    }
    text_model_free(m);
    remove_dir(dir);

    dir = dir_with_generation_config("{\"eos_token_id\": \"</s>\"}");
    CHECK_STATUS(text_model_load(dir, 0, &m), FERRY_OK);
    CHECK(m && text_error(m) && strstr(text_error(m), "eos_token_id"));
    text_model_free(m);
    remove_dir(dir);
}

static void test_stream_and_stops(void)
{
    text_finish f = TEXT_FINISH_NONE;
    int at = 0;
    const char *text = "The ferry leaves pier 4 at nine: naïve passengers wave 🚢 goodbye.";
    char *out = stream_through(text, NULL, 1000, &f, &at);
    CHECK_EQ_STR(out, text);
    CHECK(f == TEXT_FINISH_NONE && at == -1);
    free(out);

    /* a stop string across tokens: the text before it, nothing after */
    out = stream_through(text, "[\"ves pier\"]", 1000, &f, &at);
    CHECK_EQ_STR(out, "The ferry lea");
    CHECK(f == TEXT_FINISH_STOP && at > 0);
    free(out);

    /* the first of several, wherever they are in the list */
    out = stream_through(text, "[\"goodbye\", \"nine\", \"zzz\"]", 1000, &f, &at);
    CHECK_EQ_STR(out, "The ferry leaves pier 4 at ");
    free(out);

    /* one that only begins at the end is released at the end */
    out = stream_through(text, "\"goodbye. And more\"", 1000, &f, &at);
    CHECK_EQ_STR(out, text);
    CHECK(f == TEXT_FINISH_NONE && at == -1);
    free(out);

    /* a stop string inside a multi-byte character's text */
    out = stream_through(text, "\"ïve\"", 1000, &f, &at);
    CHECK_EQ_STR(out, "The ferry leaves pier 4 at nine: na");
    free(out);

    /* finish reasons: length, and a stop id */
    int32_t *ids = NULL;
    int n = 0;
    CHECK_STATUS(text_encode(g_m, "one two three", 13, false, &ids, &n), FERRY_OK);
    gen_request g = request_for(n);
    text_stream *ts = NULL;
    strbuf sb;
    sb_init(&sb);
    CHECK_STATUS(text_stream_new(g_m, &g, NULL, &ts), FERRY_OK);
    for (int i = 0; ts && i < n; i++) text_stream_push(ts, ids[i], &sb);
    if (ts) CHECK(text_stream_end(ts, &sb) == TEXT_FINISH_LENGTH);
    if (ts) CHECK_EQ_INT(text_stream_tokens(ts), n);
    text_stream_free(ts);
    g = request_for(100);
    g.stop_ids[0] = tok_token_id(text_tokenizer(g_m), "<|im_end|>");
    g.n_stop = 1;
    sb.len = 0;
    CHECK_STATUS(text_stream_new(g_m, &g, NULL, &ts), FERRY_OK);
    for (int i = 0; ts && i < n; i++) text_stream_push(ts, ids[i], &sb);
    if (ts) text_stream_push(ts, g.stop_ids[0], &sb);
    if (ts) CHECK(text_stream_end(ts, &sb) == TEXT_FINISH_STOP);
    sb_putc(&sb, '\0');
    CHECK_EQ_STR(sb.data, "one two three"); /* the special stop token has no text */
    text_stream_free(ts);
    /* an id outside the tokenizer (a model's padding rows) adds nothing */
    sb.len = 0;
    CHECK_STATUS(text_stream_new(g_m, &g, NULL, &ts), FERRY_OK);
    if (ts) CHECK(!text_stream_push(ts, 1 << 20, &sb));
    if (ts) text_stream_end(ts, &sb);
    CHECK_EQ_INT((int)sb.len, 0);
    text_stream_free(ts);
    sb_free(&sb);
    free(ids);
}

static void test_stops_parse(void)
{
    json_doc *doc = NULL;
    text_stops s;
    const char *bad[] = {"5", "[\"a\", 1]", "[\"\"]", "{}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_STATUS(json_parse(bad[i], strlen(bad[i]), &doc), FERRY_OK);
        if (doc) CHECK_STATUS(text_stops_parse(json_doc_root(doc), "stop", &s), FERRY_ERR_INVALID);
        CHECK_EQ_INT(s.n, 0);
        json_doc_free(doc);
    }
    strbuf sb;
    sb_init(&sb);
    sb_putc(&sb, '[');
    for (int i = 0; i <= TEXT_MAX_STOPS; i++) sb_puts(&sb, i ? ", \"x\"" : "\"x\"");
    sb_putc(&sb, ']');
    CHECK_STATUS(json_parse(sb.data, sb.len, &doc), FERRY_OK);
    if (doc) CHECK_STATUS(text_stops_parse(json_doc_root(doc), "stop", &s), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("at most 16");
    json_doc_free(doc);
    sb_free(&sb);
    s = stops_of("null");
    CHECK_EQ_INT(s.n, 0);
    s = stops_of("\"\\n\\n\"");
    CHECK_EQ_INT(s.n, 1);
    CHECK_EQ_INT((int)s.len[0], 2);
    CHECK_EQ_INT((int)text_stops_bytes(&s), 3);
    text_stops_free(&s);
}

static void test_render_chat(void)
{
    const char *msgs = "[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": "
                       "[{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"text\", \"text\": \"b\"}]}]";
    json_doc *doc = NULL;
    CHECK_STATUS(json_parse(msgs, strlen(msgs), &doc), FERRY_OK);
    strbuf out;
    sb_init(&out);
    if (doc) CHECK_STATUS(text_render_chat(g_m, json_doc_root(doc), NULL, NULL, 1 << 20, &out), FERRY_OK);
    sb_putc(&out, '\0');
    CHECK_EQ_STR(out.data, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\na\nb<|im_end|>\n"
                           "<|im_start|>assistant\n");
    json_doc_free(doc);
    const char *bad = "[{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]";
    CHECK_STATUS(json_parse(bad, strlen(bad), &doc), FERRY_OK);
    out.len = 0;
    if (doc) CHECK_STATUS(text_render_chat(g_m, json_doc_root(doc), NULL, NULL, 1 << 20, &out), FERRY_ERR_UNSUPPORTED);
    CHECK_MSG_HAS("messages[0].content[0]");
    json_doc_free(doc);
    /* past max_out */
    CHECK_STATUS(json_parse(msgs, strlen(msgs), &doc), FERRY_OK);
    out.len = 0;
    if (doc) CHECK_STATUS(text_render_chat(g_m, json_doc_root(doc), NULL, NULL, 10, &out), FERRY_ERR_TOO_LARGE);
    json_doc_free(doc);
    sb_free(&out);
}

/* max_text (a server's --max-text-bytes): the tokenizer's input and the
 * chat template's output, exact at the bound. */
static void test_max_text(void)
{
    text_model *m = NULL;
    CHECK_STATUS(text_model_load(DEMO, 8, &m), FERRY_OK);
    if (!m) return;
    int32_t *ids = NULL;
    int n = 0;
    CHECK_STATUS(text_encode(m, "12345678", 8, false, &ids, &n), FERRY_OK);
    free(ids);
    CHECK_STATUS(text_encode(m, "123456789", 9, false, &ids, &n), FERRY_ERR_TOO_LARGE);
    CHECK_MSG_HAS("the text is 9 bytes, more than this server encodes at once (8, --max-text-bytes)");
    CHECK(ids == NULL && n == 0);
    CHECK_STATUS(text_tokenize(m, "123456789", 9, false, false, &ids, &n), FERRY_ERR_TOO_LARGE);
    text_model_free(m);

    const char *msgs = "[{\"role\": \"user\", \"content\": \"hi\"}]";
    json_doc *doc = NULL;
    CHECK_STATUS(json_parse(msgs, strlen(msgs), &doc), FERRY_OK);
    strbuf out;
    sb_init(&out);
    /* "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n": 52 bytes */
    CHECK_STATUS(text_model_load(DEMO, 52, &m), FERRY_OK);
    if (m && doc) CHECK_STATUS(text_render_chat(m, json_doc_root(doc), NULL, NULL, 1 << 20, &out), FERRY_OK);
    CHECK_EQ_INT((int)out.len, 52);
    text_model_free(m);
    CHECK_STATUS(text_model_load(DEMO, 51, &m), FERRY_OK);
    out.len = 0;
    if (m && doc) CHECK_STATUS(text_render_chat(m, json_doc_root(doc), NULL, NULL, 1 << 20, &out), FERRY_ERR_TOO_LARGE);
    CHECK_MSG_HAS("the chat template's output is more than this server encodes at once (51 bytes, --max-text-bytes)");
    text_model_free(m);
    json_doc_free(doc);
    sb_free(&out);
}

static void test_put_json(void)
{
    strbuf sb;
    sb_init(&sb);
    sb_json_strn(&sb, "a\0b\"\\\n\x01\xc3\xa9", 9);
    sb_putc(&sb, '\0');
    CHECK_EQ_STR(sb.data, "\"a\\u0000b\\\"\\\\\\n\\u0001\xc3\xa9\"");
    sb_free(&sb);
}

int main(void)
{
    test_load();
    if (g_m) {
        test_generation_config();
        test_stream_and_stops();
        test_stops_parse();
        test_render_chat();
        test_max_text();
    }
    test_put_json();
    text_model_free(g_m);
    return check_report();
}
