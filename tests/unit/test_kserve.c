/*
 * test_kserve.c - the transport-neutral KServe v2 layer (server/kserve.h):
 * request parsing, the response writers and the status mapping.
 *
 * Infer bodies: input_ids INT64 [B,T] and [T], data flat and nested, the
 * binary tensor data extension (JSON length given, little-endian INT64 ids
 * after it), every generation parameter, the outputs list with its binary
 * flags, the id echoed. Generate bodies: flat and nested input_ids. Then
 * every family of malformed body - wrong datatype, shape and data that
 * disagree, ids outside the vocabulary (or not ids at all), prompts whose new
 * tokens overrun the context, unknown fields, parameters of the wrong type or
 * range, too many rows, binary sizes that do not add up, invalid JSON - is
 * refused with FERRY_ERR_INVALID, a message naming the field, and nothing
 * left allocated. The writers' output is read back with
 * the project's JSON reader and compared value by value (the -1 padding of
 * shorter rows, binary outputs after the JSON, flat and nested generate
 * answers, stream events, error bodies, metadata). Generate with
 * text_input: parsed without rows (kserve_encode_text fills them), stop
 * strings taken only with text, and the text answer and events.
 *
 * Only the parse/response API and kserve_request's fields are used (the
 * engine's limits are made up here), so the test does not depend on which
 * engine header kserve.h includes.
 */
#include <math.h>
#include <stdlib.h>

#include "../../server/kserve.h"
#include "check.h"

#define VOCAB 256
#define MAX_CTX 4096
#define N_STOP_MAX ((int)(sizeof ((kserve_request *)0)->gen.stop_ids / sizeof(int32_t)))

static kserve_request g_r;
static json_doc *g_doc;
static const engine_limits g_lim = {.vocab = VOCAB, .max_ctx = MAX_CTX, .max_seqs = 8, .max_step_tokens = 64};

/* The two parsers, into g_r (freed first); the only calls that know how
 * the engine's limits are passed. */
static ferry_status parse_infer(const char *body, size_t len, int64_t json_len)
{
    kserve_request_free(&g_r);
    return kserve_parse_infer(body, len, json_len, &g_lim, &g_r);
}

static ferry_status parse_generate(const char *body, size_t len)
{
    kserve_request_free(&g_r);
    return kserve_parse_generate(body, len, &g_lim, &g_r);
}

static ferry_status infer(const char *body, int64_t json_len) { return parse_infer(body, strlen(body), json_len); }
static ferry_status generate(const char *body) { return parse_generate(body, strlen(body)); }

/* Parses text[0..len) into g_doc; NULL when it is not JSON. */
static const json_value *reparse(const char *text, size_t len)
{
    json_doc_free(g_doc);
    g_doc = NULL;
    if (json_parse(text, len, &g_doc) != FERRY_OK) {
        fprintf(stderr, "response does not parse (%s): %.*s\n", ferry_errmsg(), (int)len, text);
        return NULL;
    }
    return json_doc_root(g_doc);
}

/* The rows of g_r are the given ids (rows x cols, every row cols long). */
static void check_rows(const int32_t *want, int rows, int cols, int line)
{
    check_count++;
    bool ok = g_r.n_rows == rows && g_r.ids && g_r.row_off && g_r.row_len;
    for (int i = 0; ok && i < rows; i++) ok = g_r.row_off[i] == i * cols && g_r.row_len[i] == cols;
    for (int k = 0; ok && k < rows * cols; k++) ok = g_r.ids[k] == want[k];
    if (!ok) {
        fprintf(stderr, "%s:%d: expected %d rows of %d ids, got %d rows:", __FILE__, line, rows, cols, g_r.n_rows);
        for (int i = 0; g_r.row_len && i < g_r.n_rows; i++) {
            fprintf(stderr, " [");
            for (int k = 0; k < g_r.row_len[i]; k++) fprintf(stderr, " %d", g_r.ids[g_r.row_off[i] + k]);
            fprintf(stderr, " ]");
        }
        fputc('\n', stderr);
        check_failures++;
    }
}

#define CHECK_ROWS(rows, cols, ...)                                          \
    do {                                                                     \
        static const int32_t want_[] = {__VA_ARGS__};                        \
        check_rows(want_, rows, cols, __LINE__);                             \
    } while (0)

/* g_r's generation parameters are these (n_stop stop ids, checked apart). */
static void check_gen(int max_new, float temperature, int top_k, float top_p, uint64_t seed, int n_stop, int line)
{
    check_count++;
    const gen_params *p = &g_r.gen;
    if (p->max_new_tokens != max_new || p->sampling.temperature != temperature || p->sampling.top_k != top_k ||
        p->sampling.top_p != top_p || p->sampling.seed != seed || p->n_stop != n_stop) {
        fprintf(stderr,
                "%s:%d: expected max_new_tokens %d, temperature %g, top_k %d, top_p %g, seed %llu, %d stop ids; "
                "got %d, %g, %d, %g, %llu, %d\n",
                __FILE__, line, max_new, (double)temperature, top_k, (double)top_p, (unsigned long long)seed, n_stop,
                p->max_new_tokens, (double)p->sampling.temperature, p->sampling.top_k, (double)p->sampling.top_p,
                (unsigned long long)p->sampling.seed, p->n_stop);
        check_failures++;
    }
}

#define CHECK_GEN(max_new, temperature, top_k, top_p, seed, n_stop) \
    check_gen(max_new, temperature, top_k, top_p, seed, n_stop, __LINE__)

/* A refused request is left empty and its message names the field. */
static void check_refused(ferry_status st, const char *body, const char *sub, int line)
{
    check_count++;
    const char *m = ferry_errmsg();
    if (st != FERRY_ERR_INVALID || !strstr(m, sub) || g_r.ids || g_r.row_off || g_r.row_len || g_r.id ||
        g_r.n_rows) {
        fprintf(stderr, "%s:%d: %s\n  expected FERRY_ERR_INVALID with \"%s\" and an empty request, got '%s' \"%s\"\n",
                __FILE__, line, body, sub, ferry_status_name(st), m);
        check_failures++;
    }
}

#define REFUSE_INFER(body, sub) check_refused(infer(body, -1), body, sub, __LINE__)
#define REFUSE_GENERATE(body, sub) check_refused(generate(body), body, sub, __LINE__)

/* An infer body around one input_ids tensor (fields inside the input). */
#define INFER1(fields) "{\"inputs\": [{\"name\": \"input_ids\", " fields "}]}"
/* A valid [1,2] infer body with these top-level parameters. */
#define INFER_P(params) "{\"inputs\": [{\"name\": \"input_ids\", \"datatype\": \"INT64\", \"shape\": [1, 2], " \
                        "\"data\": [1, 2]}], \"parameters\": " params "}"

/* ---- infer: valid bodies ---------------------------------------------------- */

static void test_infer_json(void)
{
    /* [B, T], flat data; defaults for everything else */
    CHECK_STATUS(infer(INFER1("\"datatype\": \"INT64\", \"shape\": [2, 3], \"data\": [1, 2, 3, 4, 5, 255]"), -1),
                 FERRY_OK);
    CHECK_ROWS(2, 3, 1, 2, 3, 4, 5, 255);
    CHECK(!g_r.nested);
    CHECK_GEN(16, 0.0f, 0, 1.0f, 0, 0); /* settings.def's defaults */
    CHECK_EQ_INT(g_r.n_outputs, 1);
    CHECK_EQ_INT(g_r.outputs[0], KSERVE_OUT_IDS);
    CHECK(!g_r.binary[0]);
    CHECK(!g_r.want_logits);
    CHECK(g_r.id == NULL);

    /* the same, nested as the shape */
    CHECK_STATUS(infer(INFER1("\"datatype\": \"INT64\", \"shape\": [2, 3], \"data\": [[1, 2, 3], [4, 5, 255]]"), -1),
                 FERRY_OK);
    CHECK_ROWS(2, 3, 1, 2, 3, 4, 5, 255);

    /* [T] is one row; the input's own parameters may be null or empty */
    CHECK_STATUS(infer(INFER1("\"datatype\": \"INT64\", \"shape\": [4], \"data\": [0, 9, 8, 7], \"parameters\": {}"),
                       -1),
                 FERRY_OK);
    CHECK_ROWS(1, 4, 0, 9, 8, 7);
    CHECK_STATUS(infer(INFER1("\"datatype\": \"INT64\", \"shape\": [1], \"data\": [3], \"parameters\": null"), -1),
                 FERRY_OK);
    CHECK_ROWS(1, 1, 3);

    /* KSERVE_MAX_ROWS rows is still fine */
    strbuf sb;
    sb_init(&sb);
    sb_printf(&sb, "{\"inputs\": [{\"name\": \"input_ids\", \"datatype\": \"INT64\", \"shape\": [%d, 1], \"data\": [",
              KSERVE_MAX_ROWS);
    for (int i = 0; i < KSERVE_MAX_ROWS; i++) sb_printf(&sb, "%s%d", i ? ", " : "", i % VOCAB);
    sb_puts(&sb, "]}]}");
    CHECK_STATUS(parse_infer(sb.data, sb.len, -1), FERRY_OK);
    CHECK_EQ_INT(g_r.n_rows, KSERVE_MAX_ROWS);
    if (g_r.n_rows == KSERVE_MAX_ROWS) CHECK_EQ_INT(g_r.ids[KSERVE_MAX_ROWS - 1], (KSERVE_MAX_ROWS - 1) % VOCAB);
    sb_free(&sb);
}

static void test_infer_params(void)
{
    CHECK_STATUS(infer("{\"id\": \"req-7\", \"parameters\": {\"max_new_tokens\": 5, \"temperature\": 0.75, "
                       "\"top_k\": 40, \"top_p\": 0.5, \"seed\": 123456789012, \"stop_token_ids\": [2, 255]}, "
                       "\"inputs\": [{\"name\": \"input_ids\", \"datatype\": \"INT64\", \"shape\": [1, 2], "
                       "\"data\": [1, 2]}]}",
                       -1),
                 FERRY_OK);
    CHECK_EQ_STR(g_r.id, "req-7");
    CHECK_GEN(5, 0.75f, 40, 0.5f, 123456789012ull, 2);
    CHECK_EQ_INT(g_r.gen.stop_ids[0], 2);
    CHECK_EQ_INT(g_r.gen.stop_ids[1], 255);

    /* null means the default; top_k past the vocabulary means all of it */
    CHECK_STATUS(infer(INFER_P("{\"max_new_tokens\": null, \"temperature\": 2, \"top_k\": 100000, \"top_p\": 1, "
                               "\"seed\": 0, \"stop_token_ids\": []}"),
                       -1),
                 FERRY_OK);
    CHECK_EQ_INT(g_r.gen.max_new_tokens, 16);
    CHECK(g_r.gen.sampling.temperature == 2.0f);
    CHECK(g_r.gen.sampling.top_k >= VOCAB);
    CHECK(g_r.gen.sampling.top_p == 1.0f);
    CHECK_EQ_INT(g_r.gen.n_stop, 0);

    /* a top_p too small for a float stays positive */
    CHECK_STATUS(infer(INFER_P("{\"top_p\": 1e-310}"), -1), FERRY_OK);
    CHECK(g_r.gen.sampling.top_p > 0);

    /* as many stop ids as the request holds */
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\"stop_token_ids\": [");
    for (int i = 0; i < N_STOP_MAX; i++) sb_printf(&sb, "%s%d", i ? ", " : "", i + 10);
    sb_puts(&sb, "]}");
    char body[1024];
    snprintf(body, sizeof body, INFER_P("%s"), sb.data);
    CHECK_STATUS(infer(body, -1), FERRY_OK);
    CHECK_EQ_INT(g_r.gen.n_stop, N_STOP_MAX);
    CHECK_EQ_INT(g_r.gen.stop_ids[N_STOP_MAX - 1], N_STOP_MAX - 1 + 10);
    sb_free(&sb);
}

static void test_infer_outputs(void)
{
    const char *in = "\"inputs\": [{\"name\": \"input_ids\", \"datatype\": \"INT64\", \"shape\": [1], \"data\": [1]}]";
    char body[512];

    snprintf(body, sizeof body,
             "{%s, \"outputs\": [{\"name\": \"logits\"}, {\"name\": \"output_ids\", \"parameters\": "
             "{\"binary_data\": true}}]}",
             in);
    CHECK_STATUS(infer(body, -1), FERRY_OK);
    CHECK_EQ_INT(g_r.n_outputs, 2);
    CHECK_EQ_INT(g_r.outputs[0], KSERVE_OUT_LOGITS);
    CHECK_EQ_INT(g_r.outputs[1], KSERVE_OUT_IDS);
    CHECK(!g_r.binary[0] && g_r.binary[1]);
    CHECK(g_r.want_logits);

    /* binary_data_output is the default of every output; binary_data overrides it */
    snprintf(body, sizeof body,
             "{%s, \"parameters\": {\"binary_data_output\": true}, \"outputs\": [{\"name\": \"output_ids\"}, "
             "{\"name\": \"logits\", \"parameters\": {\"binary_data\": false}}]}",
             in);
    CHECK_STATUS(infer(body, -1), FERRY_OK);
    CHECK_EQ_INT(g_r.n_outputs, 2);
    CHECK(g_r.binary[0] && !g_r.binary[1]);

    /* no outputs, or an empty list: output_ids, binary as binary_data_output says */
    snprintf(body, sizeof body, "{%s, \"parameters\": {\"binary_data_output\": true}, \"outputs\": []}", in);
    CHECK_STATUS(infer(body, -1), FERRY_OK);
    CHECK_EQ_INT(g_r.n_outputs, 1);
    CHECK_EQ_INT(g_r.outputs[0], KSERVE_OUT_IDS);
    CHECK(g_r.binary[0]);
    CHECK(!g_r.want_logits);
    snprintf(body, sizeof body, "{%s, \"outputs\": null}", in);
    CHECK_STATUS(infer(body, -1), FERRY_OK);
    CHECK_EQ_INT(g_r.n_outputs, 1);
    CHECK(!g_r.binary[0]);

    /* named twice: one entry, the last settings */
    snprintf(body, sizeof body,
             "{%s, \"outputs\": [{\"name\": \"output_ids\", \"parameters\": {\"binary_data\": true}}, "
             "{\"name\": \"output_ids\", \"parameters\": {\"binary_data\": false}}]}",
             in);
    CHECK_STATUS(infer(body, -1), FERRY_OK);
    CHECK_EQ_INT(g_r.n_outputs, 1);
    CHECK(!g_r.binary[0]);
}

/* JSON then the ids as little-endian INT64 (plus `extra` trailing bytes). */
static size_t binary_body(char *buf, const char *json, const int64_t *ids, int n, int extra)
{
    size_t len = strlen(json);
    memcpy(buf, json, len);
    for (int k = 0; k < n; k++)
        for (int j = 0; j < 8; j++) buf[len++] = (char)((uint64_t)ids[k] >> (8 * j));
    for (int j = 0; j < extra; j++) buf[len++] = 0;
    return len;
}

static ferry_status infer_bin(const char *json, const int64_t *ids, int n, int extra, int64_t json_len)
{
    static char buf[2048];
    size_t len = binary_body(buf, json, ids, n, extra);
    return parse_infer(buf, len, json_len < -1 ? (int64_t)strlen(json) : json_len);
}

#define BIN_JSON(size) INFER1("\"datatype\": \"INT64\", \"shape\": [2, 3], \"parameters\": {\"binary_data_size\": " size "}")

static void test_infer_binary(void)
{
    static const int64_t ids[6] = {1, 2, 255, 0, 128, 7};
    const char *json = BIN_JSON("48");
    CHECK_STATUS(infer_bin(json, ids, 6, 0, -2), FERRY_OK);
    CHECK_ROWS(2, 3, 1, 2, 255, 0, 128, 7);

    /* json_len == len: no binary bytes where 48 are announced */
    CHECK_STATUS(infer_bin(json, ids, 0, 0, -2), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("binary_data_size is 48 but only 0 binary bytes follow");
    CHECK(g_r.ids == NULL && g_r.n_rows == 0);
    /* too few, too many */
    CHECK_STATUS(infer_bin(json, ids, 5, 0, -2), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("only 40 binary bytes follow");
    CHECK_STATUS(infer_bin(json, ids, 6, 3, -2), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("51 bytes of binary data follow the JSON, the inputs take 48");
    /* the size disagrees with the shape */
    CHECK_STATUS(infer_bin(BIN_JSON("40"), ids, 5, 0, -2), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("binary_data_size is 40, shape [2, 3] INT64 needs 48");
    CHECK_STATUS(infer_bin(BIN_JSON("-8"), ids, 6, 0, -2), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("binary_data_size must be an integer >= 0");
    CHECK_STATUS(infer_bin(BIN_JSON("\"48\""), ids, 6, 0, -2), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("binary_data_size");
    /* binary bytes without Inference-Header-Content-Length: not JSON */
    CHECK_STATUS(infer_bin(json, ids, 6, 0, -1), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("malformed JSON");
    /* the header says more than the body holds */
    CHECK_STATUS(infer_bin(json, ids, 6, 0, 100000), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("Inference-Header-Content-Length 100000 exceeds the body");
    /* ids outside the vocabulary, negative ones included */
    static const int64_t bad[6] = {1, 2, 3, 4, 256, 5};
    CHECK_STATUS(infer_bin(json, bad, 6, 0, -2), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("input_ids[1][1] = 256 is outside the vocabulary (size 256)");
    static const int64_t neg[6] = {-1, 2, 3, 4, 5, 6};
    CHECK_STATUS(infer_bin(json, neg, 6, 0, -2), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("input_ids: -1 at index 0 is not a token id");
    static const int64_t wide[6] = {1, 2, 3, (int64_t)1 << 32, 5, 6}; /* would wrap to 0 as int32 */
    CHECK_STATUS(infer_bin(json, wide, 6, 0, -2), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("4294967296 at index 3 is not a token id");
    /* data and binary_data_size together */
    CHECK_STATUS(infer_bin(INFER1("\"datatype\": \"INT64\", \"shape\": [1], \"data\": [1], "
                                  "\"parameters\": {\"binary_data_size\": 8}"),
                           ids, 1, 0, -2),
                 FERRY_ERR_INVALID);
    CHECK_MSG_HAS("both data and binary_data_size");
    /* binary_data_size: null is the default (JSON data) */
    CHECK_STATUS(infer(INFER1("\"datatype\": \"INT64\", \"shape\": [1], \"data\": [4], "
                              "\"parameters\": {\"binary_data_size\": null}"),
                       -1),
                 FERRY_OK);
    CHECK_ROWS(1, 1, 4);
}

/* ---- infer: refusals -------------------------------------------------------- */

static void test_infer_refusals(void)
{
    /* not JSON, not an object */
    REFUSE_INFER("{\"inputs\": [", "malformed JSON");
    REFUSE_INFER("", "malformed JSON");
    REFUSE_INFER("[]", "the request must be a JSON object");
    /* top-level fields */
    REFUSE_INFER("{\"inputs\": [], \"model\": \"x\"}", "unknown field 'model'");
    REFUSE_INFER("{\"outputs\": []}", "inputs must be an array");
    REFUSE_INFER("{\"inputs\": {}}", "inputs must be an array");
    REFUSE_INFER("{\"inputs\": []}", "input_ids is missing from inputs");
    REFUSE_INFER("{\"inputs\": [7]}", "inputs[0] must be an object");
    REFUSE_INFER("{\"inputs\": [{\"datatype\": \"INT64\"}]}", "inputs[0]: name is missing");
    REFUSE_INFER("{\"inputs\": [{\"name\": 5}]}", "inputs[0]: name must be a string");
    REFUSE_INFER("{\"inputs\": [{\"name\": \"tokens\"}]}", "unknown input 'tokens'");
    REFUSE_INFER("{\"id\": 5, \"inputs\": []}", "id must be a string");
    REFUSE_INFER("{\"inputs\": [{\"name\": \"input_ids\", \"datatype\": \"INT64\", \"shape\": [1], \"data\": [1]}, "
                 "{\"name\": \"input_ids\", \"datatype\": \"INT64\", \"shape\": [1], \"data\": [1]}]}",
                 "input_ids is given twice");
    /* the input's fields */
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [1], \"data\": [1], \"contents\": {}"),
                 "input_ids: unknown field 'contents'");
    REFUSE_INFER(INFER1("\"shape\": [1], \"data\": [1]"), "input_ids: datatype must be given as a string");
    REFUSE_INFER(INFER1("\"datatype\": 64, \"shape\": [1], \"data\": [1]"), "datatype must be given as a string");
    REFUSE_INFER(INFER1("\"datatype\": \"FP32\", \"shape\": [1], \"data\": [1]"), "input_ids: datatype must be INT64 (got FP32)");
    REFUSE_INFER(INFER1("\"datatype\": \"INT32\", \"shape\": [1], \"data\": [1]"), "datatype must be INT64 (got INT32)");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"parameters\": 3, \"shape\": [1], \"data\": [1]"),
                 "input_ids: parameters must be an object");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"parameters\": {\"shared_memory_region\": \"r\"}, \"shape\": [1], "
                        "\"data\": [1]"),
                 "input_ids: unknown parameter 'shared_memory_region'");
    /* shape */
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"data\": [1]"), "input_ids: shape must be [B, T] or [T]");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [], \"data\": []"), "shape must be [B, T] or [T]");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [1, 1, 1], \"data\": [1]"), "shape must be [B, T] or [T]");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [-1, 2], \"data\": [1, 2]"),
                 "input_ids: shape must hold non-negative integers");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [1.5], \"data\": [1]"), "shape must hold non-negative integers");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [0, 3], \"data\": []"), "input_ids is empty (shape has a 0)");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [0], \"data\": []"), "input_ids is empty");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [1025, 1], \"data\": [1]"),
                 "input_ids: 1025 prompts in one request (at most 1024)");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [1, 268435457], \"data\": [1]"),
                 "input_ids: shape [1, 268435457] is too large");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [1024, 1000000], \"data\": [1]"), "is too large");
    /* shape and data disagree */
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [2, 3], \"data\": [1, 2, 3, 4, 5]"),
                 "input_ids: shape [2, 3] needs 6 values, data has 5");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [3], \"data\": [1, 2, 3, 4]"),
                 "shape [3] needs 3 values, data has 4");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [2, 3], \"data\": [[1, 2, 3], [4, 5]]"),
                 "input_ids: nested data does not match shape [2, 3] (row 1)");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [2, 3], \"data\": [[1, 2, 3], 4]"),
                 "nested data does not match shape [2, 3] (row 1)");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [3, 1], \"data\": [[1], [2]]"),
                 "nested data does not match shape [3, 1]");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [3], \"data\": [[1, 2, 3]]"),
                 "nested data does not match shape [1, 3]");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [2, 1], \"data\": [1, [2]]"),
                 "input_ids: data value 1 is not an integer");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [1]"), "input_ids: data is missing");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [1], \"data\": 1"), "input_ids: data must be an array");
    /* ids */
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [2, 2], \"data\": [[1, 2], [3, 256]]"),
                 "input_ids[1][1] = 256 is outside the vocabulary (size 256)");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [3], \"data\": [1, 2, 999]"),
                 "input_ids[2] = 999 is outside the vocabulary (size 256)");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [2], \"data\": [-1, 2]"), "input_ids: -1 at index 0 is not a token id");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [1], \"data\": [4294967296]"), "4294967296 at index 0 is not a token id");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [2], \"data\": [1, 2.5]"), "input_ids: data value 1 is not an integer");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [1], \"data\": [\"7\"]"), "data value 0 is not an integer");
    REFUSE_INFER(INFER1("\"datatype\": \"INT64\", \"shape\": [1], \"data\": [1e2]"), "data value 0 is not an integer");
    /* generation parameters: type and range */
    REFUSE_INFER(INFER_P("[]"), "parameters must be an object");
    REFUSE_INFER(INFER_P("{\"max_tokens\": 5}"), "unknown parameter 'max_tokens' (known: max_new_tokens, temperature, "
                                               "top_k, top_p, seed, stop_token_ids, binary_data_output)");
    REFUSE_INFER(INFER_P("{\"max_new_tokens\": 0}"), "parameters.max_new_tokens must be an integer in 1..16777216 (got 0)");
    REFUSE_INFER(INFER_P("{\"max_new_tokens\": \"5\"}"), "parameters.max_new_tokens");
    REFUSE_INFER(INFER_P("{\"max_new_tokens\": 2.5}"), "parameters.max_new_tokens");
    REFUSE_INFER(INFER_P("{\"temperature\": -0.5}"), "parameters.temperature must be a number in 0..1e30 (got -0.5)");
    REFUSE_INFER(INFER_P("{\"temperature\": \"hot\"}"), "parameters.temperature");
    REFUSE_INFER(INFER_P("{\"temperature\": 1e300}"), "parameters.temperature");
    REFUSE_INFER(INFER_P("{\"top_k\": -1}"), "parameters.top_k must be an integer >= 0");
    REFUSE_INFER(INFER_P("{\"top_k\": 4.5}"), "parameters.top_k");
    REFUSE_INFER(INFER_P("{\"top_p\": 0}"), "parameters.top_p must be a number in (0, 1]");
    REFUSE_INFER(INFER_P("{\"top_p\": 1.01}"), "parameters.top_p");
    REFUSE_INFER(INFER_P("{\"top_p\": true}"), "parameters.top_p");
    REFUSE_INFER(INFER_P("{\"seed\": -3}"), "parameters.seed must be an integer >= 0");
    REFUSE_INFER(INFER_P("{\"seed\": 18446744073709551615}"), "parameters.seed");
    REFUSE_INFER(INFER_P("{\"stop_token_ids\": 2}"), "parameters.stop_token_ids must be an array of token ids");
    REFUSE_INFER(INFER_P("{\"stop_token_ids\": [2, \"x\"]}"), "parameters.stop_token_ids[1] is not an integer");
    REFUSE_INFER(INFER_P("{\"stop_token_ids\": [256]}"), "stop_token_ids[0] = 256 is outside the vocabulary (size 256)");
    REFUSE_INFER(INFER_P("{\"stop_token_ids\": [1, -1]}"), "parameters.stop_token_ids[1] = -1 is outside");
    /* the engine's context: prompt + new tokens */
    REFUSE_INFER(INFER_P("{\"max_new_tokens\": 4095}"), "input_ids: 2 prompt + 4095 new tokens exceed the context of 4096");
    CHECK_STATUS(infer(INFER_P("{\"max_new_tokens\": 4094}"), -1), FERRY_OK);
    REFUSE_INFER(INFER_P("{\"binary_data_output\": 1}"), "parameters.binary_data_output must be true or false");
    char body[1024], ids[256] = "";
    for (int i = 0; i <= N_STOP_MAX; i++) snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? "," : "", i);
    snprintf(body, sizeof body, INFER_P("{\"stop_token_ids\": [%s]}"), ids);
    char want[64];
    snprintf(want, sizeof want, "parameters.stop_token_ids: at most %d ids (got %d)", N_STOP_MAX, N_STOP_MAX + 1);
    REFUSE_INFER(body, want);
    /* outputs */
    const char *in = "\"inputs\": [{\"name\": \"input_ids\", \"datatype\": \"INT64\", \"shape\": [1], \"data\": [1]}]";
    static const struct {
        const char *outputs, *sub;
    } bad_outputs[] = {
        {"{}", "outputs must be an array"},
        {"[\"logits\"]", "outputs[0] must be an object"},
        {"[{\"parameters\": {}}]", "outputs[0]: name is missing"},
        {"[{\"name\": \"output_ids\"}, {\"name\": \"probs\"}]", "unknown output 'probs'"},
        {"[{\"name\": \"logits\", \"shape\": [1]}]", "outputs[0]: unknown field 'shape'"},
        {"[{\"name\": \"logits\", \"parameters\": 1}]", "outputs[0]: parameters must be an object"},
        {"[{\"name\": \"logits\", \"parameters\": {\"classification\": 3}}]", "outputs[0]: unsupported parameter 'classification'"},
        {"[{\"name\": \"logits\", \"parameters\": {\"binary_data\": \"yes\"}}]", "outputs[0]: binary_data must be true or false"},
    };
    for (size_t i = 0; i < sizeof bad_outputs / sizeof bad_outputs[0]; i++) {
        snprintf(body, sizeof body, "{%s, \"outputs\": %s}", in, bad_outputs[i].outputs);
        check_refused(infer(body, -1), body, bad_outputs[i].sub, __LINE__);
    }
    /* a refusal after the id was read frees it */
    REFUSE_INFER("{\"id\": \"x\", \"inputs\": 3}", "inputs must be an array");
}

/* ---- generate --------------------------------------------------------------- */

static void test_generate(void)
{
    CHECK_STATUS(generate("{\"input_ids\": [5, 6, 7]}"), FERRY_OK);
    CHECK_ROWS(1, 3, 5, 6, 7);
    CHECK(!g_r.nested);
    CHECK_EQ_INT(g_r.gen.max_new_tokens, 16);
    CHECK_EQ_INT(g_r.n_outputs, 0);
    CHECK(!g_r.want_logits);

    CHECK_STATUS(generate("{\"id\": \"g1\", \"input_ids\": [[1, 2], [3, 4, 5], [255]], \"parameters\": "
                          "{\"max_new_tokens\": 3, \"temperature\": 0.5, \"top_k\": 2, \"top_p\": 0.25, "
                          "\"seed\": 9, \"stop_token_ids\": [0]}}"),
                 FERRY_OK);
    CHECK(g_r.nested);
    CHECK_EQ_INT(g_r.n_rows, 3);
    if (g_r.n_rows == 3) {
        static const int off[3] = {0, 2, 5}, len[3] = {2, 3, 1};
        static const int32_t ids[6] = {1, 2, 3, 4, 5, 255};
        for (int i = 0; i < 3; i++) {
            CHECK_EQ_INT(g_r.row_off[i], off[i]);
            CHECK_EQ_INT(g_r.row_len[i], len[i]);
        }
        for (int k = 0; k < 6; k++) CHECK_EQ_INT(g_r.ids[k], ids[k]);
    }
    CHECK_EQ_STR(g_r.id, "g1");
    CHECK_GEN(3, 0.5f, 2, 0.25f, 9, 1);
    CHECK_EQ_INT(g_r.gen.stop_ids[0], 0);

    /* one nested prompt is still nested (the answer is a list of lists) */
    CHECK_STATUS(generate("{\"input_ids\": [[9]]}"), FERRY_OK);
    CHECK(g_r.nested);
    CHECK_ROWS(1, 1, 9);

    REFUSE_GENERATE("{\"input_ids\": [1,", "malformed JSON");
    REFUSE_GENERATE("[1, 2]", "the request must be a JSON object");
    REFUSE_GENERATE("{}", "input_ids is missing");
    REFUSE_GENERATE("{\"input_ids\": \"hello\"}", "input_ids must be an array of token ids");
    REFUSE_GENERATE("{\"input_ids\": []}", "input_ids is empty");
    REFUSE_GENERATE("{\"input_ids\": [[1], []]}", "input_ids[1] is empty");
    REFUSE_GENERATE("{\"input_ids\": [[1], 2]}", "input_ids[1] must be a list of token ids like input_ids[0]");
    REFUSE_GENERATE("{\"input_ids\": [1, [2]]}", "input_ids[1] is not an integer");
    REFUSE_GENERATE("{\"input_ids\": [1, 2.5]}", "input_ids[1] is not an integer");
    REFUSE_GENERATE("{\"input_ids\": [[1], [2, true]]}", "input_ids[1][1] is not an integer");
    REFUSE_GENERATE("{\"input_ids\": [1, 256]}", "input_ids[1] = 256 is outside the vocabulary (size 256)");
    REFUSE_GENERATE("{\"input_ids\": [-5]}", "input_ids[0] = -5 is outside");
    REFUSE_GENERATE("{\"input_ids\": [[1], [2, 3]], \"parameters\": {\"max_new_tokens\": 4095}}",
                    "input_ids[1]: 2 prompt + 4095 new tokens exceed the context of 4096 positions");
    REFUSE_GENERATE("{\"input_ids\": [[1], [2, 300]]}", "input_ids[1][1] = 300 is outside the vocabulary");
    REFUSE_GENERATE("{\"input_ids\": [1], \"max_new_tokens\": 4}", "unknown field 'max_new_tokens'");
    REFUSE_GENERATE("{\"input_ids\": [1], \"parameters\": {\"binary_data_output\": true}}",
                    "unknown parameter 'binary_data_output'");
    REFUSE_GENERATE("{\"input_ids\": [1], \"parameters\": {\"top_p\": 2}}", "parameters.top_p");
    REFUSE_GENERATE("{\"input_ids\": [1], \"parameters\": {\"stop_token_ids\": [999]}}",
                    "stop_token_ids[0] = 999 is outside the vocabulary");
    REFUSE_GENERATE("{\"id\": [], \"input_ids\": [1]}", "id must be a string");

    /* too many rows */
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\"input_ids\": [");
    for (int i = 0; i <= KSERVE_MAX_ROWS; i++) sb_puts(&sb, i ? ", [1]" : "[1]");
    sb_puts(&sb, "]}");
    check_refused(parse_generate(sb.data, sb.len), "(1025 rows)",
                  "input_ids: 1025 prompts in one request (at most 1024)", __LINE__);
    sb_free(&sb);
}

/* text_input: the rows wait for kserve_encode_text (the tokenizer's); the
 * parse keeps the text whole (control bytes too) and the stop strings. */
static void test_generate_text(void)
{
    CHECK_STATUS(generate("{\"text_input\": \"Hello \\u0001world\", \"parameters\": {\"stop\": [\"a\", \"bc\"], "
                          "\"temperature\": 0.5, \"max_new_tokens\": 7}}"),
                 FERRY_OK);
    CHECK_EQ_INT(g_r.n_rows, 0);
    CHECK(g_r.text_input != NULL);
    CHECK_EQ_INT((int)g_r.text_len, 12);
    CHECK(g_r.text_input && !memcmp(g_r.text_input, "Hello \001world", 12));
    CHECK_EQ_INT(g_r.stops.n, 2);
    CHECK_EQ_STR(g_r.stops.s[1], "bc");
    CHECK(g_r.gen.given[GEN_temperature] && !g_r.gen.given[GEN_top_p] && !g_r.gen.given[GEN_top_k]);
    CHECK_EQ_INT(g_r.gen.max_new_tokens, 7);
    CHECK_STATUS(generate("{\"text_input\": \"x\", \"parameters\": {\"stop\": \"\\n\"}}"), FERRY_OK);
    CHECK_EQ_INT(g_r.stops.n, 1);
    CHECK_EQ_STR(g_r.stops.s[0], "\n");

    REFUSE_GENERATE("{\"text_input\": 5}", "text_input must be a string");
    REFUSE_GENERATE("{\"text_input\": \"x\", \"input_ids\": [1]}", "not both");
    REFUSE_GENERATE("{\"input_ids\": [1], \"parameters\": {\"stop\": \"x\"}}", "needs text: the prompt as text_input");
    REFUSE_GENERATE("{\"text_input\": \"x\", \"parameters\": {\"stop\": [\"\"]}}", "parameters.stop[0] is an empty string");
    REFUSE_GENERATE("{\"text_input\": \"x\", \"parameters\": {\"stop\": 3}}", "parameters.stop must be a string");

    strbuf sb;
    sb_init(&sb);
    kserve_text_response(&sb, &g_r, "m", "a\"b\001", 4, TEXT_FINISH_STOP);
    const json_value *v = reparse(sb.data, sb.len);
    CHECK(v && json_get(v, "text_output") && json_get(v, "text_output")->len == 4);
    CHECK(v && !memcmp(json_get(v, "text_output")->str, "a\"b\001", 4));
    CHECK(v && json_get_str(v, "finish_reason", &(bool){false}) && !strcmp(json_get(v, "finish_reason")->str, "stop"));
    sb.len = 0;
    kserve_text_event(&sb, "m", "hi", 2, TEXT_FINISH_NONE);
    CHECK(sb.len > 8 && !strncmp(sb.data, "data: ", 6) && !memcmp(sb.data + sb.len - 2, "\n\n", 2));
    v = reparse(sb.data + 6, sb.len - 8);
    CHECK(v && !strcmp(json_get(v, "text_output")->str, "hi") && !json_get(v, "finish_reason"));
    sb_free(&sb);
}

/* infer with the BYTES tensor text_input: JSON (flat and [B, 1]) and
 * binary (4-byte little-endian lengths), the rows left for
 * kserve_encode_text; text_output asked for with ids; the text writer. */
static void test_infer_text(void)
{
    CHECK_STATUS(infer("{\"inputs\": [{\"name\": \"text_input\", \"datatype\": \"BYTES\", \"shape\": [2, 1], "
                       "\"data\": [[\"ab\"], [\"\"]]}], \"parameters\": {\"stop\": \"q\"}}", -1),
                 FERRY_OK);
    CHECK(g_r.text_out && g_r.n_rows == 0 && g_r.n_texts == 2);
    CHECK(g_r.text_off && g_r.text_off[0] == 0 && g_r.text_off[1] == 2 && g_r.text_off[2] == 2);
    CHECK(g_r.text_input && !memcmp(g_r.text_input, "ab", 2));
    CHECK_EQ_INT(g_r.n_outputs, 1);
    CHECK_EQ_INT(g_r.outputs[0], KSERVE_OUT_TEXT);
    CHECK_EQ_INT(g_r.stops.n, 1);

    /* binary: "hi" and "" after the JSON */
    const char *head = "{\"inputs\": [{\"name\": \"text_input\", \"datatype\": \"BYTES\", \"shape\": [2], "
                       "\"parameters\": {\"binary_data_size\": 10}}]}";
    char body[256];
    size_t hl = strlen(head);
    memcpy(body, head, hl);
    memcpy(body + hl, "\x02\x00\x00\x00hi\x00\x00\x00\x00", 10);
    CHECK_STATUS(parse_infer(body, hl + 10, (int64_t)hl), FERRY_OK);
    CHECK(g_r.n_texts == 2 && g_r.text_len == 2 && g_r.text_off[1] == 2 && g_r.text_off[2] == 2);
    memcpy(body + hl, "\x03\x00\x00\x00hi\x00\x00\x00\x00", 10);
    CHECK_STATUS(parse_infer(body, hl + 10, (int64_t)hl), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("ends inside element 1's length");

    /* ids in, text out: the rows are kept, their check waits for the text layer */
    CHECK_STATUS(infer("{\"inputs\": [{\"name\": \"input_ids\", \"datatype\": \"INT64\", \"shape\": [1, 2], "
                       "\"data\": [1, 2]}], \"outputs\": [{\"name\": \"output_ids\"}, {\"name\": \"text_output\", "
                       "\"parameters\": {\"binary_data\": true}}], \"parameters\": {\"stop\": [\"x\"]}}", -1),
                 FERRY_OK);
    CHECK(g_r.text_out && !g_r.text_input && g_r.n_rows == 1 && g_r.n_outputs == 2);
    CHECK(g_r.outputs[1] == KSERVE_OUT_TEXT && g_r.binary[1] && !g_r.binary[0]);

    REFUSE_INFER("{\"inputs\": [{\"name\": \"text_input\", \"datatype\": \"BYTES\", \"shape\": [1], \"data\": [1]}]}",
                 "data[0] is not a string");
    REFUSE_INFER("{\"inputs\": [{\"name\": \"text_input\", \"datatype\": \"BYTES\", \"shape\": [1, 2], \"data\": [\"a\", \"b\"]}]}",
                 "shape must be [B] or [B, 1]");
    REFUSE_INFER("{\"inputs\": [{\"name\": \"text_input\", \"datatype\": \"BYTES\", \"shape\": [1], \"data\": [\"a\"]}, "
                 "{\"name\": \"text_input\", \"datatype\": \"BYTES\", \"shape\": [1], \"data\": [\"a\"]}]}",
                 "text_input is given twice");
    REFUSE_INFER(INFER_P("{\"stop\": \"x\"}"), "needs text");

    /* the writer: text_output as JSON strings, then as binary elements */
    CHECK_STATUS(infer("{\"inputs\": [{\"name\": \"input_ids\", \"datatype\": \"INT64\", \"shape\": [2, 1], "
                       "\"data\": [1, 2]}], \"outputs\": [{\"name\": \"text_output\"}]}", -1),
                 FERRY_OK);
    CHECK_EQ_INT(g_r.n_rows, 2);
    kserve_row rows[2] = {{.text = "x\"y", .text_len = 3}, {.text = "", .text_len = 0}};
    strbuf sb;
    sb_init(&sb);
    size_t jl;
    kserve_infer_response(&sb, &g_r, "m", rows, 4, &jl);
    CHECK_EQ_INT((int)jl, 0);
    const json_value *v = reparse(sb.data, sb.len);
    const json_value *o = v ? &json_get(v, "outputs")->items[0] : NULL;
    CHECK(o && !strcmp(json_get(o, "name")->str, "text_output") && !strcmp(json_get(o, "datatype")->str, "BYTES"));
    CHECK(o && json_get(o, "data")->len == 2 && !strcmp(json_get(o, "data")->items[0].str, "x\"y"));
    g_r.binary[0] = true;
    sb.len = 0;
    kserve_infer_response(&sb, &g_r, "m", rows, 4, &jl);
    CHECK(jl > 0 && sb.len == jl + 4 + 3 + 4);
    CHECK(sb.len == jl + 11 && !memcmp(sb.data + jl, "\x03\x00\x00\x00x\"y\x00\x00\x00\x00", 11));
    v = reparse(sb.data, jl);
    o = v ? &json_get(v, "outputs")->items[0] : NULL;
    CHECK(o && json_get(json_get(o, "parameters"), "binary_data_size")->integer == 11);
    sb_free(&sb);
}

/* ---- responses -------------------------------------------------------------- */

static const json_value *member(const json_value *obj, const char *key, json_type type)
{
    const json_value *v = json_get(obj, key);
    return v && v->type == type ? v : NULL;
}

/* v is an array of exactly the given integers. */
static void check_int_array(const json_value *v, const int64_t *want, size_t n, int line)
{
    check_count++;
    bool ok = v && v->type == JSON_ARRAY && v->len == n;
    for (size_t k = 0; ok && k < n; k++) ok = v->items[k].type == JSON_NUMBER && v->items[k].is_int && v->items[k].integer == want[k];
    if (!ok) {
        fprintf(stderr, "%s:%d: expected an array of %zu integers:", __FILE__, line, n);
        for (size_t k = 0; k < n; k++) fprintf(stderr, " %lld", (long long)want[k]);
        fputc('\n', stderr);
        check_failures++;
    }
}

#define CHECK_INTS(v, ...)                                                   \
    do {                                                                     \
        static const int64_t want_[] = {__VA_ARGS__};                        \
        check_int_array(v, want_, sizeof want_ / sizeof want_[0], __LINE__); \
    } while (0)

static int64_t le64(const char *p)
{
    uint64_t u = 0;
    for (int j = 7; j >= 0; j--) u = (u << 8) | (uint8_t)p[j];
    return (int64_t)u;
}

static float le_f32(const char *p)
{
    uint32_t u = 0;
    for (int j = 3; j >= 0; j--) u = (u << 8) | (uint8_t)p[j];
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* obj[key] as a string / an exact integer; NULL / INT64_MIN when it is not one. */
static const char *str_at(const json_value *obj, const char *key)
{
    const json_value *v = member(obj, key, JSON_STRING);
    return v ? v->str : NULL;
}

static int64_t int_at(const json_value *obj, const char *key)
{
    const json_value *v = member(obj, key, JSON_NUMBER);
    return v && v->is_int ? v->integer : INT64_MIN;
}

static float g_logits[2][VOCAB];

static void check_head(const json_value *root, const char *model, const char *id)
{
    const json_value *name = member(root, "model_name", JSON_STRING);
    CHECK(name && !strcmp(name->str, model));
    const json_value *ver = member(root, "model_version", JSON_STRING);
    CHECK(ver && !strcmp(ver->str, KSERVE_MODEL_VERSION));
    const json_value *idv = json_get(root, "id");
    if (id) CHECK(idv && idv->type == JSON_STRING && !strcmp(idv->str, id));
    else CHECK(idv == NULL);
}

static void test_infer_response(void)
{
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < VOCAB; k++) g_logits[i][k] = (float)(k - 100) / 7.0f + (float)i;
    g_logits[1][3] = NAN;
    static const int32_t row0[3] = {5, 6, 7}, row1[1] = {8};
    kserve_row rows[2] = {{.tokens = (int32_t *)row0, .n_tokens = 3, .logits = g_logits[0]}, {.tokens = (int32_t *)row1, .n_tokens = 1, .logits = g_logits[1]}};
    const char *model = "tiny \"m\"";
    const char *in = "\"inputs\": [{\"name\": \"input_ids\", \"datatype\": \"INT64\", \"shape\": [2, 1], \"data\": [1, 2]}]";
    char body[512];
    strbuf sb;
    size_t json_len;

    /* JSON output_ids: [2, 3], the shorter row padded with -1; id echoed */
    snprintf(body, sizeof body, "{\"id\": \"r\\\"1\", %s}", in);
    CHECK_STATUS(infer(body, -1), FERRY_OK);
    sb_init(&sb);
    json_len = 99;
    kserve_infer_response(&sb, &g_r, model, rows, VOCAB, &json_len);
    CHECK(!sb.oom);
    CHECK_EQ_U64(json_len, 0);
    const json_value *root = reparse(sb.data, sb.len);
    CHECK(root != NULL);
    if (root) {
        check_head(root, model, "r\"1");
        const json_value *outs = member(root, "outputs", JSON_ARRAY);
        CHECK(outs && outs->len == 1);
        if (outs && outs->len == 1) {
            const json_value *o = &outs->items[0];
            CHECK_EQ_STR(str_at(o, "name"), "output_ids");
            CHECK_EQ_STR(str_at(o, "datatype"), "INT64");
            CHECK_INTS(json_get(o, "shape"), 2, 3);
            CHECK_INTS(json_get(o, "data"), 5, 6, 7, 8, -1, -1);
        }
    }
    sb_free(&sb);

    /* logits as JSON (NaN written as null) and output_ids binary after the JSON */
    snprintf(body, sizeof body,
             "{%s, \"outputs\": [{\"name\": \"logits\"}, {\"name\": \"output_ids\", \"parameters\": "
             "{\"binary_data\": true}}]}",
             in);
    CHECK_STATUS(infer(body, -1), FERRY_OK);
    sb_init(&sb);
    kserve_infer_response(&sb, &g_r, model, rows, VOCAB, &json_len);
    CHECK(json_len > 0 && json_len + 2 * 3 * 8 == sb.len);
    root = json_len ? reparse(sb.data, json_len) : NULL;
    CHECK(root != NULL);
    if (root && json_len + 48 == sb.len) {
        check_head(root, model, NULL);
        const json_value *outs = member(root, "outputs", JSON_ARRAY);
        CHECK(outs && outs->len == 2);
        if (outs && outs->len == 2) {
            const json_value *lg = &outs->items[0], *ids = &outs->items[1];
            CHECK_EQ_STR(str_at(lg, "name"), "logits");
            CHECK_EQ_STR(str_at(lg, "datatype"), "FP32");
            CHECK_INTS(json_get(lg, "shape"), 2, VOCAB);
            const json_value *data = member(lg, "data", JSON_ARRAY);
            CHECK(data && data->len == 2 * VOCAB);
            int wrong = 0;
            for (int i = 0; data && data->len == 2 * VOCAB && i < 2; i++)
                for (int k = 0; k < VOCAB; k++) {
                    const json_value *v = &data->items[i * VOCAB + k];
                    if (isnan(g_logits[i][k])) wrong += v->type != JSON_NULL;
                    else wrong += v->type != JSON_NUMBER || (float)v->number != g_logits[i][k];
                }
            CHECK_EQ_INT(wrong, 0);
            CHECK_EQ_STR(str_at(ids, "name"), "output_ids");
            CHECK_INTS(json_get(ids, "shape"), 2, 3);
            CHECK(json_get(ids, "data") == NULL);
            const json_value *p = member(ids, "parameters", JSON_OBJECT);
            CHECK(p && int_at(p, "binary_data_size") == 48);
            static const int64_t want[6] = {5, 6, 7, 8, -1, -1};
            for (int k = 0; k < 6; k++) CHECK_EQ_INT(le64(sb.data + json_len + 8 * k), want[k]);
        }
    }
    sb_free(&sb);

    /* both binary (binary_data_output), in the order asked: ids then logits */
    snprintf(body, sizeof body,
             "{%s, \"parameters\": {\"binary_data_output\": true}, \"outputs\": [{\"name\": \"output_ids\"}, "
             "{\"name\": \"logits\"}]}",
             in);
    CHECK_STATUS(infer(body, -1), FERRY_OK);
    sb_init(&sb);
    kserve_infer_response(&sb, &g_r, model, rows, VOCAB, &json_len);
    size_t ids_bytes = 2 * 3 * 8, logit_bytes = 2 * VOCAB * 4;
    CHECK(json_len > 0 && json_len + ids_bytes + logit_bytes == sb.len);
    root = json_len ? reparse(sb.data, json_len) : NULL;
    if (root && json_len + ids_bytes + logit_bytes == sb.len) {
        const json_value *outs = member(root, "outputs", JSON_ARRAY);
        CHECK(outs && outs->len == 2);
        if (outs && outs->len == 2) {
            const json_value *p = member(&outs->items[1], "parameters", JSON_OBJECT);
            CHECK(p && int_at(p, "binary_data_size") == (int64_t)logit_bytes);
            CHECK(json_get(&outs->items[0], "data") == NULL && json_get(&outs->items[1], "data") == NULL);
        }
        CHECK_EQ_INT(le64(sb.data + json_len + 8 * 3), 8);
        CHECK_EQ_INT(le64(sb.data + json_len + 8 * 5), -1);
        int wrong = 0;
        for (int i = 0; i < 2; i++)
            for (int k = 0; k < VOCAB; k++) {
                float f = le_f32(sb.data + json_len + ids_bytes + 4 * ((size_t)i * VOCAB + (size_t)k));
                wrong += isnan(g_logits[i][k]) ? !isnan(f) : memcmp(&f, &g_logits[i][k], 4) != 0;
            }
        CHECK_EQ_INT(wrong, 0);
    }
    sb_free(&sb);

    /* logits asked for but a row has none: nulls, not garbage */
    snprintf(body, sizeof body, "{%s, \"outputs\": [{\"name\": \"logits\"}]}", in);
    CHECK_STATUS(infer(body, -1), FERRY_OK);
    kserve_row no_logits[2] = {{.tokens = (int32_t *)row0, .n_tokens = 3, .logits = NULL}, {.tokens = (int32_t *)row1, .n_tokens = 1, .logits = g_logits[1]}};
    sb_init(&sb);
    kserve_infer_response(&sb, &g_r, model, no_logits, VOCAB, &json_len);
    root = reparse(sb.data, sb.len);
    if (root) {
        const json_value *outs = member(root, "outputs", JSON_ARRAY);
        const json_value *data = outs && outs->len == 1 ? member(&outs->items[0], "data", JSON_ARRAY) : NULL;
        CHECK(data && data->len == 2 * VOCAB);
        if (data && data->len == 2 * VOCAB) {
            CHECK_EQ_INT(data->items[0].type, JSON_NULL);
            CHECK_EQ_INT(data->items[VOCAB - 1].type, JSON_NULL);
            CHECK(data->items[VOCAB].type == JSON_NUMBER && (float)data->items[VOCAB].number == g_logits[1][0]);
        }
    }
    sb_free(&sb);
}

static void test_generate_response(void)
{
    static const int32_t a[4] = {10, 11, 12, 2}, b[1] = {2}, c[2] = {254, 255};
    kserve_row rows[3] = {{.tokens = (int32_t *)a, .n_tokens = 4, .logits = NULL}, {.tokens = (int32_t *)b, .n_tokens = 1, .logits = NULL}, {.tokens = (int32_t *)c, .n_tokens = 2, .logits = NULL}};
    strbuf sb;

    /* flat prompt: a flat list */
    CHECK_STATUS(generate("{\"id\": \"q\", \"input_ids\": [1, 2]}"), FERRY_OK);
    sb_init(&sb);
    kserve_generate_response(&sb, &g_r, "m", rows);
    const json_value *root = reparse(sb.data, sb.len);
    CHECK(root != NULL);
    if (root) {
        check_head(root, "m", "q");
        CHECK_INTS(json_get(root, "output_ids"), 10, 11, 12, 2);
    }
    sb_free(&sb);

    /* nested prompts: a list of lists, rows of their own lengths */
    CHECK_STATUS(generate("{\"input_ids\": [[1], [2], [3]]}"), FERRY_OK);
    sb_init(&sb);
    kserve_generate_response(&sb, &g_r, "m", rows);
    root = reparse(sb.data, sb.len);
    const json_value *out = root ? member(root, "output_ids", JSON_ARRAY) : NULL;
    CHECK(out && out->len == 3);
    if (out && out->len == 3) {
        check_head(root, "m", NULL);
        CHECK_INTS(&out->items[0], 10, 11, 12, 2);
        CHECK_INTS(&out->items[1], 2);
        CHECK_INTS(&out->items[2], 254, 255);
    }
    sb_free(&sb);

    /* a row with no tokens */
    CHECK_STATUS(generate("{\"input_ids\": [[1]]}"), FERRY_OK);
    kserve_row empty = {0};
    sb_init(&sb);
    kserve_generate_response(&sb, &g_r, "m", &empty);
    root = reparse(sb.data, sb.len);
    out = root ? member(root, "output_ids", JSON_ARRAY) : NULL;
    CHECK(out && out->len == 1 && out->items[0].type == JSON_ARRAY && out->items[0].len == 0);
    sb_free(&sb);
}

/* "data: <JSON>\n\n": returns the JSON's root. */
static const json_value *sse_payload(const strbuf *sb)
{
    check_count++;
    if (sb->len < 8 || memcmp(sb->data, "data: ", 6) != 0 || memcmp(sb->data + sb->len - 2, "\n\n", 2) != 0 ||
        memchr(sb->data, '\n', sb->len - 2)) {
        fprintf(stderr, "%s: not one server-sent event: %.*s\n", __FILE__, (int)sb->len, sb->data);
        check_failures++;
        return NULL;
    }
    return reparse(sb->data + 6, sb->len - 8);
}

static void test_stream_error_metadata(void)
{
    strbuf sb;
    sb_init(&sb);
    kserve_stream_event(&sb, "m\n1", 42, 3);
    const json_value *root = sse_payload(&sb);
    if (root) {
        CHECK_EQ_STR(str_at(root, "model_name"), "m\n1");
        CHECK_EQ_STR(str_at(root, "model_version"), KSERVE_MODEL_VERSION);
        CHECK_EQ_INT(int_at(root, "token_id"), 42);
        CHECK_EQ_INT(int_at(root, "index"), 3);
    }
    sb_free(&sb);

    const char *msg = "engine step failed: \"disk\"\n\tread error \\ 5";
    sb_init(&sb);
    kserve_stream_error(&sb, msg);
    root = sse_payload(&sb);
    if (root) {
        CHECK_EQ_STR(str_at(root, "error"), msg);
        CHECK_EQ_INT(root->len, 1);
    }
    sb_free(&sb);

    sb_init(&sb);
    kserve_error(&sb, msg);
    root = reparse(sb.data, sb.len);
    CHECK(root && root->type == JSON_OBJECT && root->len == 1);
    if (root) CHECK_EQ_STR(str_at(root, "error"), msg);
    sb_free(&sb);

    sb_init(&sb);
    kserve_server_metadata(&sb);
    root = reparse(sb.data, sb.len);
    CHECK(root != NULL);
    if (root) {
        CHECK_EQ_STR(str_at(root, "name"), "ferry");
        CHECK_EQ_STR(str_at(root, "version"), FERRY_VERSION);
        const json_value *ext = member(root, "extensions", JSON_ARRAY);
        bool bin = false, gen = false;
        for (size_t i = 0; ext && i < ext->len; i++) {
            bin |= ext->items[i].type == JSON_STRING && !strcmp(ext->items[i].str, "binary_tensor_data");
            gen |= ext->items[i].type == JSON_STRING && !strcmp(ext->items[i].str, "generate");
        }
        CHECK(bin && gen);
    }
    sb_free(&sb);

    sb_init(&sb);
    kserve_model_metadata(&sb, "demo \"x\"", 32000);
    root = reparse(sb.data, sb.len);
    CHECK(root != NULL);
    if (root) {
        CHECK_EQ_STR(str_at(root, "name"), "demo \"x\"");
        const json_value *versions = member(root, "versions", JSON_ARRAY);
        CHECK(versions && versions->len == 1 && versions->items[0].type == JSON_STRING &&
              !strcmp(versions->items[0].str, KSERVE_MODEL_VERSION));
        const json_value *ins = member(root, "inputs", JSON_ARRAY);
        CHECK(ins && ins->len == 1);
        if (ins && ins->len == 1) {
            CHECK_EQ_STR(str_at(&ins->items[0], "name"), "input_ids");
            CHECK_EQ_STR(str_at(&ins->items[0], "datatype"), "INT64");
            CHECK_INTS(json_get(&ins->items[0], "shape"), -1, -1);
        }
        const json_value *outs = member(root, "outputs", JSON_ARRAY);
        CHECK(outs && outs->len == 2);
        if (outs && outs->len == 2) {
            CHECK_EQ_STR(str_at(&outs->items[0], "name"), "output_ids");
            CHECK_INTS(json_get(&outs->items[0], "shape"), -1, -1);
            CHECK_EQ_STR(str_at(&outs->items[1], "name"), "logits");
            CHECK_EQ_STR(str_at(&outs->items[1], "datatype"), "FP32");
            CHECK_INTS(json_get(&outs->items[1], "shape"), -1, 32000);
        }
    }
    sb_free(&sb);
}

/* Triton's config and statistics: the structs both transports write from,
 * and REST's JSON of them. */
static void test_config_and_stats(void)
{
    kserve_config c;
    kserve_config_fill(&c, "demo", 32000, 8);
    CHECK_EQ_STR(c.platform, "ferry");
    CHECK_EQ_INT(c.max_batch_size, 8);
    CHECK(c.decoupled && c.n_inputs == 1 && c.n_outputs == 2);
    CHECK_EQ_INT(c.outputs[1].data_type, KSERVE_TYPE_FP32);
    CHECK_EQ_INT((int)c.outputs[1].dim, 32000);
    CHECK_EQ_STR(kserve_type_name(KSERVE_TYPE_INT64), "TYPE_INT64");
    strbuf sb;
    sb_init(&sb);
    kserve_model_config(&sb, &c);
    const json_value *root = reparse(sb.data, sb.len);
    CHECK(root != NULL);
    if (root) {
        CHECK_EQ_STR(str_at(root, "name"), "demo");
        CHECK_EQ_STR(str_at(root, "backend"), "ferry");
        const json_value *mb = member(root, "max_batch_size", JSON_NUMBER);
        CHECK(mb && mb->is_int && mb->integer == 8);
        const json_value *outs = member(root, "output", JSON_ARRAY);
        CHECK(outs && outs->len == 2);
        if (outs && outs->len == 2) {
            CHECK_EQ_STR(str_at(&outs->items[1], "data_type"), "TYPE_FP32");
            CHECK_INTS(json_get(&outs->items[1], "dims"), 32000);
        }
        const json_value *tp = member(root, "model_transaction_policy", JSON_OBJECT);
        const json_value *dec = tp ? json_get(tp, "decoupled") : NULL;
        CHECK(dec && dec->type == JSON_BOOL && dec->boolean);
    }
    sb_free(&sb);

    sched_stats s;
    memset(&s, 0, sizeof s);
    s.steps = 7, s.step_s_sum = 0.5;
    s.requests_done = 3, s.done_s_sum = 1.5;
    s.requests_failed = 1, s.failed_s_sum = 0.25;
    s.requests_cancelled = 2, s.queue_s_sum = 0.125;
    s.last_done_unix = 1700000000.5;
    kserve_stats k;
    kserve_stats_fill(&k, &s);
    CHECK(k.inference_count == 3 && k.execution_count == 7 && k.last_inference == 1700000000500ull);
    CHECK(k.success.count == 3 && k.success.ns == 1500000000ull);
    CHECK(k.fail.count == 1 && k.fail.ns == 250000000ull);
    CHECK(k.queue.count == 6 && k.queue.ns == 125000000ull); /* every admitted sequence */
    CHECK(k.compute_infer.count == 7 && k.compute_infer.ns == 500000000ull);
    CHECK(k.compute_input.count == 0 && k.compute_output.ns == 0);
    sb_init(&sb);
    kserve_model_stats(&sb, "demo", &k);
    root = reparse(sb.data, sb.len);
    CHECK(root != NULL);
    const json_value *ms = root ? member(root, "model_stats", JSON_ARRAY) : NULL;
    CHECK(ms && ms->len == 1);
    if (ms && ms->len == 1) {
        const json_value *m = &ms->items[0];
        CHECK_EQ_STR(str_at(m, "version"), KSERVE_MODEL_VERSION);
        const json_value *n = json_get(m, "last_inference");
        CHECK(n && n->is_int && n->integer == 1700000000500ll);
        const json_value *is = member(m, "inference_stats", JSON_OBJECT);
        const json_value *q = is ? member(is, "queue", JSON_OBJECT) : NULL;
        const json_value *qc = q ? json_get(q, "count") : NULL, *qn = q ? json_get(q, "ns") : NULL;
        CHECK(qc && qc->integer == 6 && qn && qn->integer == 125000000);
    }
    sb_free(&sb);
}

static void test_http_status(void)
{
    CHECK_EQ_INT(kserve_http_status(FERRY_OK), 200);
    CHECK_EQ_INT(kserve_http_status(FERRY_ERR_INVALID), 400);
    CHECK_EQ_INT(kserve_http_status(FERRY_ERR_UNSUPPORTED), 400);
    CHECK_EQ_INT(kserve_http_status(FERRY_ERR_NOT_FOUND), 404);
    CHECK_EQ_INT(kserve_http_status(FERRY_ERR_BUSY), 503);
    CHECK_EQ_INT(kserve_http_status(FERRY_ERR_NOMEM), 503);
    CHECK_EQ_INT(kserve_http_status(FERRY_ERR_IO), 500);
    CHECK_EQ_INT(kserve_http_status(FERRY_ERR_INTERNAL), 500);
    CHECK_EQ_INT(kserve_http_status((ferry_status)99), 500);
}

int main(void)
{
    test_infer_json();
    test_infer_params();
    test_infer_outputs();
    test_infer_binary();
    test_infer_refusals();
    test_generate();
    test_generate_text();
    test_infer_text();
    test_infer_response();
    test_generate_response();
    test_stream_error_metadata();
    test_config_and_stats();
    test_http_status();
    kserve_request_free(&g_r);
    json_doc_free(g_doc);
    return check_report();
}
