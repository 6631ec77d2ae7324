/*
 * fuzz_openai.c - libFuzzer target for the OpenAI-compatible request parser
 * (oai_parse in server/openai.h: /v1/completions and /v1/chat/completions
 * bodies), and the answers written for what it accepts.
 *
 * Byte 0 picks the endpoint (even: completions, odd: chat); the rest is the
 * body. The server is fixed: the model "m" with the demo tokenizer and its
 * chat template (config/demo-tokenizer, loaded once from FUZZ_ROOT, set by
 * the Makefile), a context of MAX_CTX positions. A refused body must leave
 * no request, a message, and a status the transport can send (400, 404 for
 * another model's name, 413, 503), with OpenAI's error codes only where
 * they belong. An accepted one must keep the parser's promises: 1 ..
 * OAI_MAX_ROWS rows, each passing request_check against the engine's
 * limits (ids in the vocabulary, prompt and new tokens in the context), at
 * most TEXT_MAX_STOPS stop strings of 1 .. TEXT_MAX_STOP_BYTES bytes. The
 * answer is then written with made-up choices, whole and as a stream: it
 * must parse back as JSON (each event of the stream), and where small
 * enough to write in full - every choice max_tokens tokens of the text
 * that costs most to escape - it must fit in oai_answer_bytes, which the
 * server reserves from its memory budget. A broken promise aborts, which
 * libFuzzer reports as a crash. Build: README.md.
 */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../server/openai.h"

#ifndef FUZZ_ROOT
#define FUZZ_ROOT "."
#endif
#define MODEL "m"
#define MAX_CTX 4096
#define MAX_WRITTEN (1u << 16) /* bytes of made-up text the bound is checked with */

static text_model *g_tm;
static engine_limits g_lim;
static oai_ctx g_ctx;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (text_model_load(FUZZ_ROOT "/config/demo-tokenizer", 0, &g_tm) != FERRY_OK || text_error(g_tm) ||
        text_chat_error(g_tm)) {
        fprintf(stderr, "fuzz_openai: the demo tokenizer does not load from %s\n", FUZZ_ROOT);
        abort();
    }
    g_lim = (engine_limits){.vocab = tok_vocab_size(text_tokenizer(g_tm)), .max_ctx = MAX_CTX, .max_seqs = 64,
                            .max_step_tokens = 512};
    g_ctx = (oai_ctx){.model = MODEL, .tm = g_tm, .lim = &g_lim, .max_parse = 1u << 24, .max_render = 1u << 16};
    return 0;
}

static void check_refused(ferry_status st, const oai_request *r, const oai_error *e)
{
    if (st == FERRY_OK || r || !ferry_errmsg()[0]) abort();
    if (e->status != 400 && e->status != 404 && e->status != 413 && e->status != 503) {
        fprintf(stderr, "fuzz_openai: status %d (%s)\n", e->status, ferry_errmsg());
        abort();
    }
    if ((e->status == 404) != (e->code && !strcmp(e->code, "model_not_found"))) abort();
    if (e->code && !strcmp(e->code, "context_length_exceeded") && e->status != 400) abort();
    if (strnlen(e->param, sizeof e->param) >= sizeof e->param) abort();
}

static void check_rows(const oai_request *r)
{
    int rows = oai_rows(r);
    if (rows < 1 || rows > OAI_MAX_ROWS) abort();
    for (int i = 0; i < rows; i++) {
        gen_request g = oai_row_request(r, i);
        if (request_check(&g, &g_lim, "row", NULL) != FERRY_OK) {
            fprintf(stderr, "fuzz_openai: row %d: %s\n", i, ferry_errmsg());
            abort();
        }
    }
    const text_stops *s = oai_stops(r);
    if (s->n < 0 || s->n > TEXT_MAX_STOPS) abort();
    for (int i = 0; i < s->n; i++)
        if (!s->s[i] || s->len[i] < 1 || s->len[i] > TEXT_MAX_STOP_BYTES) abort();
    if (oai_request_bytes(r) < sizeof(int32_t)) abort();
}

static json_doc *must_parse(const char *s, size_t len)
{
    json_doc *doc = NULL;
    if (json_parse(s, len, &doc) != FERRY_OK) {
        fprintf(stderr, "fuzz_openai: not JSON (%s): %.*s\n", ferry_errmsg(), (int)(len > 300 ? 300 : len), s);
        abort();
    }
    return doc;
}

/* Every event "data: ...\n\n" of a stream parses; the last is [DONE]. */
static void check_events(const strbuf *sb)
{
    size_t at = 0;
    bool done = false;
    while (at < sb->len) {
        if (done || sb->len - at < 8 || memcmp(sb->data + at, "data: ", 6)) abort();
        const char *start = sb->data + at + 6, *end = memmem(start, sb->len - at - 6, "\n\n", 2);
        if (!end) abort();
        if (end - start == 6 && !memcmp(start, "[DONE]", 6)) done = true;
        else json_doc_free(must_parse(start, (size_t)(end - start)));
        at = (size_t)(end + 2 - sb->data);
    }
    if (!done) abort();
}

/* The answers, with each choice max_tokens tokens of `per_token` text. */
static void check_answers(const oai_request *r)
{
    int rows = oai_rows(r);
    gen_request g = oai_row_request(r, 0);
    size_t per_token = text_max_token_bytes(g_tm);
    uint64_t text = (uint64_t)g.max_new_tokens * per_token;
    bool full = text * (uint64_t)rows <= MAX_WRITTEN;
    size_t len = full ? (size_t)text : 7;
    char *t = malloc(len ? len : 1);
    oai_choice *c = calloc((size_t)rows, sizeof *c);
    if (!t || !c) abort();
    memset(t, 0x01, len); /* escaped as \u0001: six bytes a byte */
    for (int i = 0; i < rows; i++) c[i] = (oai_choice){t, len, i % 2 ? TEXT_FINISH_STOP : TEXT_FINISH_LENGTH, 1};
    uint64_t bound = oai_answer_bytes(r, MODEL, per_token);

    strbuf sb;
    sb_init(&sb);
    oai_response(&sb, r, MODEL, c);
    if (sb.oom) abort();
    json_doc_free(must_parse(sb.data, sb.len));
    if (full && !oai_streaming(r) && sb.len > bound) {
        fprintf(stderr, "fuzz_openai: the answer takes %zu bytes, oai_answer_bytes said %llu\n", sb.len,
                (unsigned long long)bound);
        abort();
    }
    sb_free(&sb);

    sb_init(&sb);
    oai_stream_start(&sb, r, MODEL);
    for (int i = 0; i < rows; i++) {
        size_t step = full ? per_token : len; /* a token at a time */
        for (size_t k = 0; k < len; k += step)
            oai_stream_delta(&sb, r, MODEL, i, t + k, len - k < step ? len - k : step,
                             k + step >= len ? c[i].finish : TEXT_FINISH_NONE);
    }
    oai_stream_end(&sb, r, MODEL, true, rows);
    if (sb.oom) abort();
    check_events(&sb);
    if (full && oai_streaming(r) && sb.len > bound) {
        fprintf(stderr, "fuzz_openai: the stream takes %zu bytes, oai_answer_bytes said %llu\n", sb.len,
                (unsigned long long)bound);
        abort();
    }
    sb_free(&sb);
    free(t);
    free(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    oai_kind kind = data[0] & 1 ? OAI_CHAT : OAI_COMPLETIONS;
    oai_request *r = (oai_request *)1;
    oai_error e;
    memset(&e, 0xa5, sizeof e);
    ferry_status st = oai_parse(kind, (const char *)data + 1, size - 1, &g_ctx, &r, &e);
    if (st != FERRY_OK) {
        check_refused(st, r, &e);
        return 0;
    }
    check_rows(r);
    check_answers(r);
    oai_request_free(r);
    return 0;
}
