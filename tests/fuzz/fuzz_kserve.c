/*
 * fuzz_kserve.c - libFuzzer target for the KServe v2 request parsers
 * (kserve_parse_infer and kserve_parse_generate in server/kserve.h).
 *
 * Input layout: byte 0 picks the entry point (mod 3):
 *   0  infer, whole body JSON (json_len -1: no Inference-Header-Content-Length)
 *   1  infer with the binary tensor data extension: bytes 1..4 are json_len as
 *      a little-endian int32 (negative: absent; past the body: refused), the
 *      rest is the body, JSON then binary bytes
 *   2  generate
 * The engine's limits are fixed: a vocabulary of VOCAB, a context of MAX_CTX.
 *
 * A refused body must leave nothing allocated in the request and a message
 * for the 400. An accepted one must keep the parser's promises: 1..1024 rows
 * that tile the id array in order, every id (and stop id) inside the
 * vocabulary, every prompt and its new tokens inside the context, the ids
 * equal to what the JSON data (or the little-endian binary data) said,
 * parameters in their ranges, valid infer outputs; a generate body with
 * text_input instead keeps the text exactly, holds no rows yet (the
 * tokenizer's, later) and at most TEXT_MAX_STOPS stop strings. The
 * response writers are then run on the request with made-up results and
 * their output must parse back as JSON of the right shape. A hook on the
 * sanitizer allocator also aborts when one allocation made by the parser is
 * far larger than the body could justify (a small body must not make ferry
 * allocate for a huge shape); FUZZ_KSERVE_NO_ALLOC_BOUND=1 in the
 * environment turns that check off, to fuzz the rest while such a finding
 * is open. (The hook needs AddressSanitizer; a build without it skips the
 * bound.) A broken promise aborts, which libFuzzer reports as a crash.
 * Only the parse and response API of kserve.h is used. Build: README.md.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../server/kserve.h"

#include "fuzz_asan.h"
#ifdef FUZZ_HAVE_ASAN
#if __has_include(<sanitizer/allocator_interface.h>)
#include <sanitizer/allocator_interface.h>
#else /* gcc ships no header for it; libasan has the function */
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                              void (*free_hook)(const volatile void *));
#endif
#endif

#define VOCAB 256
#define MAX_CTX (1 << 20)
#define MAX_TOKENS (1 << 28) /* kserve.c's bound on B x T */
#define MAX_STOP ((int)(sizeof ((kserve_request *)0)->gen.stop_ids / sizeof(int32_t)))

static const engine_limits g_limits = {.vocab = VOCAB, .max_ctx = MAX_CTX, .max_seqs = 64, .max_step_tokens = 512};

static volatile uint8_t sink;
static float g_logits[VOCAB];

/* ---- allocation bound --------------------------------------------------- */

/* While a parser runs, no single allocation may exceed g_alloc_limit: the
 * JSON tree costs at most ~64 bytes a body byte (doubling vectors
 * included), the ids 4 bytes an id and an id at least 2 body bytes. */
static volatile size_t g_alloc_limit; /* 0: not checking */
static bool g_alloc_bound = true;

#ifdef FUZZ_HAVE_ASAN
static void malloc_hook(const volatile void *p, size_t size)
{
    (void)p;
    size_t limit = g_alloc_limit;
    if (limit && size > limit) {
        fprintf(stderr, "fuzz_kserve: the parser allocated %zu bytes in one block (bound for this body: %zu)\n",
                size, limit);
        abort();
    }
}

static void free_hook(const volatile void *p) { (void)p; }
#endif

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *off = getenv("FUZZ_KSERVE_NO_ALLOC_BOUND");
    g_alloc_bound = !(off && *off && strcmp(off, "0") != 0);
#ifdef FUZZ_HAVE_ASAN
    if (g_alloc_bound && !__sanitizer_install_malloc_and_free_hooks(malloc_hook, free_hook)) abort();
#else
    g_alloc_bound = false;
#endif
    for (int i = 0; i < VOCAB; i++) g_logits[i] = (float)i * 0.5f - 3.0f;
    g_logits[7] = NAN;
    g_logits[9] = INFINITY; /* both written as null */
    return 0;
}

/* ---- helpers --------------------------------------------------------------- */

static bool is_int(const json_value *v) { return v && v->type == JSON_NUMBER && v->is_int; }

static uint64_t le64(const uint8_t *p)
{
    uint64_t u = 0;
    for (int j = 7; j >= 0; j--) u = (u << 8) | p[j];
    return u;
}

/* The ids the JSON data says, flat or nested, in order; aborts on a
 * mismatch with the parsed request. */
static void same_ids(const json_value *data, const int32_t *ids, size_t total)
{
    if (!data || data->type != JSON_ARRAY) abort();
    size_t at = 0;
    for (size_t i = 0; i < data->len; i++) {
        const json_value *v = &data->items[i];
        if (v->type == JSON_ARRAY) {
            for (size_t k = 0; k < v->len; k++, at++) {
                if (at >= total || !is_int(&v->items[k]) || v->items[k].integer != ids[at]) abort();
            }
        } else {
            if (at >= total || !is_int(v) || v->integer != ids[at]) abort();
            at++;
        }
    }
    if (at != total) abort();
}

/* Parses the writer's output back; aborts when it is not JSON. */
static json_doc *reparse(const char *s, size_t len)
{
    json_doc *doc = NULL;
    if (json_parse(s, len, &doc) != FERRY_OK || !doc) {
        fprintf(stderr, "fuzz_kserve: response is not JSON (%s): %.*s\n", ferry_errmsg(), (int)(len > 400 ? 400 : len),
                s);
        abort();
    }
    const json_value *root = json_doc_root(doc);
    if (root->type != JSON_OBJECT) abort();
    const json_value *name = json_get(root, "model_name");
    if (!name || name->type != JSON_STRING || strcmp(name->str, "m\"\\") != 0) abort();
    return doc;
}

static void check_id_echo(const json_value *root, const kserve_request *r)
{
    const json_value *id = json_get(root, "id");
    if (!r->id) {
        if (id) abort();
    } else if (!id || id->type != JSON_STRING || strcmp(id->str, r->id) != 0) {
        abort();
    }
}

/* ---- response writers on made-up results ---------------------------------- */

static void fake_rows(const kserve_request *r, kserve_row *rows)
{
    for (int i = 0; i < r->n_rows; i++) {
        int n = 1 + i % 3; /* rows of different lengths: the shorter ones are padded */
        rows[i].tokens = r->ids + r->row_off[i];
        rows[i].n_tokens = n < r->row_len[i] ? n : r->row_len[i];
        rows[i].logits = r->want_logits ? g_logits : NULL;
    }
}

static void check_infer_response(const kserve_request *r)
{
    if (r->want_logits && r->n_rows > 16) return; /* [B, VOCAB] of text: slow, and nothing new */
    kserve_row *rows = calloc((size_t)r->n_rows, sizeof *rows);
    if (!rows) abort();
    fake_rows(r, rows);
    int n = 0;
    for (int i = 0; i < r->n_rows; i++) n = rows[i].n_tokens > n ? rows[i].n_tokens : n;

    strbuf sb;
    sb_init(&sb);
    size_t json_len = 12345;
    kserve_infer_response(&sb, r, "m\"\\", rows, VOCAB, &json_len);
    if (sb.oom) abort();
    bool any_binary = false;
    for (int o = 0; o < r->n_outputs; o++) any_binary |= r->binary[o];
    if (any_binary ? json_len == 0 || json_len > sb.len : json_len != 0) abort();
    size_t jl = any_binary ? json_len : sb.len;

    json_doc *doc = reparse(sb.data, jl);
    const json_value *root = json_doc_root(doc);
    check_id_echo(root, r);
    const json_value *outs = json_get(root, "outputs");
    if (!outs || outs->type != JSON_ARRAY || outs->len != (size_t)r->n_outputs) abort();
    size_t bin_total = 0;
    for (int o = 0; o < r->n_outputs; o++) {
        const json_value *out = &outs->items[o];
        bool ids = r->outputs[o] == KSERVE_OUT_IDS;
        int cols = ids ? n : VOCAB;
        bool bad = false;
        const char *name = json_get_str(out, "name", &bad);
        if (!name || strcmp(name, ids ? "output_ids" : "logits") != 0) abort();
        const json_value *shape = json_get(out, "shape");
        if (!shape || shape->type != JSON_ARRAY || shape->len != 2 || !is_int(&shape->items[0]) ||
            !is_int(&shape->items[1]) || shape->items[0].integer != r->n_rows || shape->items[1].integer != cols)
            abort();
        if (r->binary[o]) {
            const json_value *p = json_get(out, "parameters");
            const json_value *size = p ? json_get(p, "binary_data_size") : NULL;
            size_t want = (size_t)r->n_rows * (size_t)cols * (ids ? 8 : 4);
            if (!is_int(size) || (size_t)size->integer != want || json_get(out, "data")) abort();
            /* the binary ids follow in output order */
            if (ids) {
                for (int i = 0; i < r->n_rows; i++)
                    for (int k = 0; k < cols; k++) {
                        size_t at = jl + bin_total + ((size_t)i * (size_t)cols + (size_t)k) * 8;
                        int64_t want_id = k < rows[i].n_tokens ? rows[i].tokens[k] : -1;
                        if (at + 8 > sb.len || (int64_t)le64((const uint8_t *)sb.data + at) != want_id) abort();
                    }
            }
            bin_total += want;
        } else {
            const json_value *data = json_get(out, "data");
            if (!data || data->type != JSON_ARRAY || data->len != (size_t)r->n_rows * (size_t)cols) abort();
            for (int i = 0; i < r->n_rows; i++)
                for (int k = 0; k < cols; k++) {
                    const json_value *v = &data->items[(size_t)i * (size_t)cols + (size_t)k];
                    if (ids) {
                        int64_t want_id = k < rows[i].n_tokens ? rows[i].tokens[k] : -1;
                        if (!is_int(v) || v->integer != want_id) abort();
                    } else if (isfinite(g_logits[k]) ? v->type != JSON_NUMBER || (float)v->number != g_logits[k]
                                                     : v->type != JSON_NULL) {
                        abort();
                    }
                }
        }
    }
    if (jl + bin_total != sb.len) abort();
    json_doc_free(doc);
    sb_free(&sb);
    free(rows);
}

static void check_generate_response(const kserve_request *r)
{
    kserve_row *rows = calloc((size_t)r->n_rows, sizeof *rows);
    if (!rows) abort();
    fake_rows(r, rows);
    strbuf sb;
    sb_init(&sb);
    kserve_generate_response(&sb, r, "m\"\\", rows);
    if (sb.oom) abort();
    json_doc *doc = reparse(sb.data, sb.len);
    const json_value *root = json_doc_root(doc);
    check_id_echo(root, r);
    const json_value *out = json_get(root, "output_ids");
    if (!out || out->type != JSON_ARRAY) abort();
    if (!r->nested) {
        if (out->len != (size_t)rows[0].n_tokens) abort();
        for (size_t k = 0; k < out->len; k++)
            if (!is_int(&out->items[k]) || out->items[k].integer != rows[0].tokens[k]) abort();
    } else {
        if (out->len != (size_t)r->n_rows) abort();
        for (int i = 0; i < r->n_rows; i++) {
            const json_value *row = &out->items[i];
            if (row->type != JSON_ARRAY || row->len != (size_t)rows[i].n_tokens) abort();
            for (size_t k = 0; k < row->len; k++)
                if (!is_int(&row->items[k]) || row->items[k].integer != rows[i].tokens[k]) abort();
        }
    }
    json_doc_free(doc);
    sb_free(&sb);
    free(rows);
}

/* ---- the request's promises -------------------------------------------------- */

static size_t check_request(const kserve_request *r)
{
    if (r->n_rows < 1 || r->n_rows > KSERVE_MAX_ROWS) abort();
    if (!r->ids || !r->row_off || !r->row_len) abort();
    size_t total = 0;
    for (int i = 0; i < r->n_rows; i++) {
        if (r->row_off[i] < 0 || (size_t)r->row_off[i] != total || r->row_len[i] < 1) abort();
        if ((int64_t)r->row_len[i] + r->gen.max_new_tokens > MAX_CTX) abort();
        total += (size_t)r->row_len[i];
        if (total > MAX_TOKENS) abort();
    }
    for (size_t k = 0; k < total; k++) /* ASan: reads past the id array */
        if (r->ids[k] < 0 || r->ids[k] >= VOCAB) abort();
    if (r->gen.max_new_tokens < 1 || r->gen.max_new_tokens > MAX_TOKENS) abort();
    const sampling_params *s = &r->gen.sampling;
    if (!(s->temperature >= 0) || !isfinite(s->temperature)) abort();
    if (s->top_k < 0) abort();
    if (!(s->top_p > 0 && s->top_p <= 1)) abort();
    if (r->gen.n_stop < 0 || r->gen.n_stop > MAX_STOP) abort();
    for (int j = 0; j < r->gen.n_stop; j++)
        if (r->gen.stop_ids[j] < 0 || r->gen.stop_ids[j] >= VOCAB) abort();
    if (r->id) sink ^= (uint8_t)strlen(r->id);
    return total;
}

static void check_refused(ferry_status st, const kserve_request *r)
{
    if (st != FERRY_ERR_INVALID && st != FERRY_ERR_NOMEM) abort();
    if (kserve_http_status(st) != (st == FERRY_ERR_INVALID ? 400 : 503)) abort();
    if (!ferry_errmsg()[0]) abort();
    if (r->ids || r->row_off || r->row_len || r->id || r->n_rows) abort();
}

static void fuzz_infer(const char *body, size_t len, int64_t json_len)
{
    kserve_request r;
    memset(&r, 0xa5, sizeof r); /* the parser must not rely on a zeroed request */
    ferry_fail(FERRY_OK, "%s", "");
    if (g_alloc_bound) g_alloc_limit = 128 * len + (1u << 20);
    ferry_status st = kserve_parse_infer(body, len, json_len, &g_limits, &r);
    g_alloc_limit = 0;
    if (st != FERRY_OK) {
        check_refused(st, &r);
        return;
    }
    size_t total = check_request(&r);
    if (r.nested) abort();
    for (int i = 1; i < r.n_rows; i++) /* [B, T]: rectangular */
        if (r.row_len[i] != r.row_len[0]) abort();

    /* outputs: distinct, known, logits asked for exactly when listed */
    if (r.n_outputs < 0 || r.n_outputs > 2) abort();
    bool logits = false;
    for (int o = 0; o < r.n_outputs; o++) {
        if (r.outputs[o] != KSERVE_OUT_IDS && r.outputs[o] != KSERVE_OUT_LOGITS) abort();
        if (o && r.outputs[o] == r.outputs[0]) abort();
        logits |= r.outputs[o] == KSERVE_OUT_LOGITS;
    }
    if (logits != r.want_logits) abort();

    /* the ids are what the request said */
    size_t jlen = json_len >= 0 ? (size_t)json_len : len;
    if (jlen < len) {
        if (len - jlen != total * 8) abort();
        for (size_t k = 0; k < total; k++)
            if ((int64_t)le64((const uint8_t *)body + jlen + k * 8) != r.ids[k]) abort();
    } else {
        json_doc *doc;
        if (json_parse(body, jlen, &doc) != FERRY_OK) abort();
        const json_value *inputs = json_get(json_doc_root(doc), "inputs");
        if (!inputs || inputs->type != JSON_ARRAY || inputs->len != 1) abort();
        same_ids(json_get(&inputs->items[0], "data"), r.ids, total);
        json_doc_free(doc);
    }

    check_infer_response(&r);
    kserve_request_free(&r);
    if (r.ids || r.row_off || r.row_len || r.id) abort();
}

/* A text_input request: no rows until the tokenizer encodes it; the text
 * as the JSON string said; stop strings within their limits; the text
 * answer parses back to the same text. */
static void check_text_request(const kserve_request *r, const char *body, size_t len)
{
    if (r->n_rows != 0 || r->ids || r->row_off || r->row_len) abort();
    if (r->gen.max_new_tokens < 1 || r->gen.max_new_tokens > MAX_TOKENS) abort();
    if (r->stops.n < 0 || r->stops.n > TEXT_MAX_STOPS) abort();
    for (int i = 0; i < r->stops.n; i++)
        if (r->stops.len[i] < 1 || r->stops.len[i] > TEXT_MAX_STOP_BYTES || !r->stops.s[i]) abort();
    json_doc *doc;
    if (json_parse(body, len, &doc) != FERRY_OK) abort();
    const json_value *t = json_get(json_doc_root(doc), "text_input");
    if (!t || t->type != JSON_STRING || t->len != r->text_len || memcmp(t->str, r->text_input, t->len)) abort();
    json_doc_free(doc);
    strbuf sb;
    sb_init(&sb);
    kserve_text_response(&sb, r, "m\"\\", r->text_input, r->text_len, TEXT_FINISH_LENGTH);
    if (sb.oom) abort();
    doc = reparse(sb.data, sb.len);
    const json_value *out = json_get(json_doc_root(doc), "text_output");
    if (!out || out->type != JSON_STRING || out->len != r->text_len || memcmp(out->str, r->text_input, out->len))
        abort();
    json_doc_free(doc);
    sb_free(&sb);
}

static void fuzz_generate(const char *body, size_t len)
{
    kserve_request r;
    memset(&r, 0xa5, sizeof r);
    ferry_fail(FERRY_OK, "%s", "");
    if (g_alloc_bound) g_alloc_limit = 128 * len + (1u << 20);
    ferry_status st = kserve_parse_generate(body, len, &g_limits, &r);
    g_alloc_limit = 0;
    if (st != FERRY_OK) {
        check_refused(st, &r);
        return;
    }
    if (r.text_input) {
        check_text_request(&r, body, len);
        kserve_request_free(&r);
        if (r.text_input || r.stops.n) abort();
        return;
    }
    size_t total = check_request(&r);
    if (!r.nested && r.n_rows != 1) abort();
    if (r.n_outputs != 0 || r.want_logits) abort(); /* infer-only fields keep their defaults */

    json_doc *doc;
    if (json_parse(body, len, &doc) != FERRY_OK) abort();
    const json_value *ids = json_get(json_doc_root(doc), "input_ids");
    if (!ids || ids->type != JSON_ARRAY || ids->len == 0) abort();
    if (r.nested != (ids->items[0].type == JSON_ARRAY)) abort();
    if (r.nested && ids->len != (size_t)r.n_rows) abort();
    same_ids(ids, r.ids, total);
    json_doc_free(doc);

    check_generate_response(&r);
    kserve_request_free(&r);
    if (r.ids || r.row_off || r.row_len || r.id) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    switch (data[0] % 3) {
    case 0: fuzz_infer((const char *)data + 1, size - 1, -1); break;
    case 1: {
        if (size < 5) return 0;
        int32_t h = (int32_t)((uint32_t)data[1] | (uint32_t)data[2] << 8 | (uint32_t)data[3] << 16 |
                              (uint32_t)data[4] << 24);
        fuzz_infer((const char *)data + 5, size - 5, h);
        break;
    }
    case 2: fuzz_generate((const char *)data + 1, size - 1); break;
    }
    return 0;
}
