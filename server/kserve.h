/*
 * kserve.h - the KServe v2 (Open Inference Protocol) messages ferry speaks,
 * independent of the transport: turning a request body into scheduler work
 * and results into a response body. The HTTP front end (http.c) uses it
 * today; the gRPC front end maps its protobuf messages onto the same
 * kserve_request and kserve_row results.
 *
 * Requests carry prompts as rows of token ids. `infer` takes the tensor
 * input_ids INT64 [B,T] (or [T], read as [1,T]) as JSON data, flat or
 * nested, or as little-endian bytes after the JSON (the binary tensor data
 * extension: the transport passes the JSON length, from the
 * Inference-Header-Content-Length header), or prompts as text: the tensor
 * text_input BYTES [B] (or [B,1]; JSON strings, or in binary each element
 * a 4-byte little-endian length and its bytes, as Triton writes BYTES),
 * answered by default with text_output BYTES [B] (output_ids and logits may
 * be asked for beside it; a request of ids may ask for text_output too).
 * With text, parameters.stop takes stop strings. `generate` (Triton's generate
 * extension) takes {"input_ids": [...] or [[...], ...], "parameters": {...}},
 * or the prompt as text: {"text_input": "...", "parameters": {...}} (then
 * parameters.stop takes stop strings), answered with text_output.
 * Every row becomes one gen_request with the same parameters.
 *
 * Parsing checks the protocol (fields, types, shapes), then every row with
 * request_check against the engine's limits (ids in the vocabulary, prompt
 * + new tokens within the context), so a request is refused whole before
 * any row is submitted. Failures are FERRY_ERR_INVALID with a message naming
 * the field: the transport answers 400 with {"error": message}.
 */
#ifndef FERRY_KSERVE_H
#define FERRY_KSERVE_H

#include <stdbool.h>
#include <stdint.h>

#include "../engine/base/json.h"
#include "../engine/request.h"
#include "../engine/stats.h"
#include "../text/text.h"

#define FERRY_VERSION "0.1.0"
#define KSERVE_MODEL_VERSION "1"
#define KSERVE_MAX_ROWS 1024 /* prompts in one request */
#define KSERVE_MAX_ID 1024   /* bytes of a request's "id" (it is echoed in the answer) */
/* Parsing a body may hold at most RATIO x its size + SLACK bytes (the JSON
 * tree): more is a 413, however much memory the server has. */
#define KSERVE_PARSE_RATIO 24
#define KSERVE_PARSE_SLACK (1u << 20)

typedef struct {
    /* prompts: row i is ids[row_off[i] .. row_off[i] + row_len[i]) */
    int n_rows;
    int32_t *ids;
    int *row_off, *row_len;
    bool nested;             /* generate: input_ids was a list of lists (answer likewise) */
    gen_params gen;          /* generation parameters, shared by every row (defaults: settings.def's) */
    /* infer outputs, in the order to report them */
    int n_outputs;
    int outputs[3];          /* KSERVE_OUT_* */
    bool binary[3];          /* per entry of outputs[]: binary tensor data */
    bool want_logits;
    char *id;                /* echoed when given */
    /* prompts as text (generate's text_input, infer's BYTES text_input [B]):
     * row i's text is text_input[text_off[i] .. text_off[i + 1]); the rows
     * of ids are empty until kserve_encode_text */
    char *text_input;        /* NULL: the prompts came as ids */
    size_t text_len;         /* all rows' text, back to back */
    int n_texts;
    size_t *text_off;        /* [n_texts + 1] */
    bool text_out;           /* the answer is text: text_input was given, or infer asked for text_output */
    text_stops stops;        /* parameters.stop */
} kserve_request;

enum { KSERVE_OUT_IDS, KSERVE_OUT_LOGITS, KSERVE_OUT_TEXT };

/* One row's outcome, as the transport collected it from the scheduler. */
typedef struct {
    int32_t *tokens;         /* generated ids, stop token included */
    int n_tokens;
    float *logits;           /* [vocab] for the last prompt position, or NULL */
    const char *text;        /* text_output: the row's text, held by the transport (not owned here) */
    size_t text_len;
} kserve_row;

/* Keeps a row's outcome (its tokens, and logits when it has them) past the
 * scheduler's callback, which owns res only during the call. */
ferry_status kserve_row_keep(kserve_row *row, const gen_result *res);

/* Parses an infer body. json_len is the Inference-Header-Content-Length
 * value (the JSON is body[0..json_len), binary tensor data follows), or -1
 * when the header is absent (the whole body is JSON). */
ferry_status kserve_parse_infer(const char *body, size_t len, int64_t json_len, const engine_limits *lim,
                                kserve_request *out);
/* Parses a generate / generate_stream body. With text_input the rows are
 * left empty (and unchecked) for kserve_encode_text. */
ferry_status kserve_parse_generate(const char *body, size_t len, const engine_limits *lim, kserve_request *out);
/* One element of a BYTES tensor. */
typedef struct {
    const char *p;
    size_t len;
} kserve_bytes;
/* The b elements of a BYTES tensor in Triton's serialization (each a 4-byte
 * little-endian length, then its bytes) filling raw[0..len) exactly; `what`
 * names the bytes in errors ("raw contents"). */
ferry_status kserve_bytes_split(const uint8_t *raw, size_t len, int64_t b, const char *what, kserve_bytes *el);
/* r's prompts are the b texts el (copied back to back: text_input,
 * text_off), answered with text. */
ferry_status kserve_set_texts(kserve_request *r, int64_t b, const kserve_bytes *el);
/* A request answered with text (text_out): its text_input prompts (if
 * any) encoded with the tokenizer's special tokens, as completion prompts,
 * one row each; the model's generation defaults applied
 * (text_request_defaults); every row checked against lim.
 * FERRY_ERR_UNSUPPORTED with text_error when the model has no tokenizer. */
ferry_status kserve_encode_text(kserve_request *r, const text_model *tm, const engine_limits *lim);
/* What kserve_encode_text may hold, for the budget: text_encode_bound of
 * the rows' text as the tokenizer will see it (text_encode_size). */
uint64_t kserve_encode_bound(const kserve_request *r, const text_model *tm);
void kserve_request_free(kserve_request *r);
/* An empty request with the settings' defaults (settings.def): what every
 * transport starts from before it reads a request's parameters. */
void kserve_request_defaults(kserve_request *r);

/* The most memory parsing a body of body_len bytes may hold at once (a
 * transport reserves it before parsing). */
size_t kserve_parse_bound(size_t body_len);
/* Memory a parsed request holds. */
size_t kserve_request_bytes(const kserve_request *r);
/* What a parsed request holds until it is answered, whichever the
 * transport: the request itself and every row's results (tokens, logits). */
uint64_t kserve_held_bytes(const kserve_request *r, int vocab);

/* Row i as a gen_request (prompt points into r; stream i of the seed). */
gen_request kserve_row_request(const kserve_request *r, int row);

/* The infer response: JSON, followed by the binary outputs when any was
 * asked for binary; *json_len is then the JSON's length (for the
 * Inference-Header-Content-Length header), else 0. output_ids is [B,N] with
 * N the longest row; shorter rows (a stop token ended them) are padded
 * with -1. Built whole: for tests and small answers. */
void kserve_infer_response(strbuf *sb, const kserve_request *r, const char *model, const kserve_row *rows, int vocab,
                           size_t *json_len);

/* The same bytes piece by piece, so that a large answer (the logits of many
 * prompts) goes to the socket without being built whole: each call to
 * kserve_infer_writer_next appends one piece (a header, or one row of one
 * output) and returns false when nothing is left. rows and r must outlive
 * the writer. */
typedef struct {
    const kserve_request *r;
    const char *model;
    const kserve_row *rows;
    int vocab, n;            /* n: the longest row */
    bool any_binary;
    int stage, o, i;         /* where the next piece starts */
} kserve_infer_writer;

void kserve_infer_writer_init(kserve_infer_writer *w, const kserve_request *r, const char *model,
                              const kserve_row *rows, int vocab);
bool kserve_infer_writer_next(kserve_infer_writer *w, strbuf *sb);
/* Still writing the JSON part (before the binary outputs)? */
bool kserve_infer_writer_in_json(const kserve_infer_writer *w);
/* The JSON part's length when any output is binary, else 0 (a counting
 * pass: nothing is kept). */
size_t kserve_infer_json_len(const kserve_request *r, const char *model, const kserve_row *rows, int vocab);

/* {"model_name", "model_version", "output_ids"}: a flat list for one
 * prompt, a list of lists when input_ids was nested. */
void kserve_generate_response(strbuf *sb, const kserve_request *r, const char *model, const kserve_row *rows);
/* {"model_name", "model_version", "text_output", "finish_reason"}: the
 * answer of a text_input request. */
void kserve_text_response(strbuf *sb, const kserve_request *r, const char *model, const char *text, size_t len,
                          text_finish finish);
/* One server-sent event for a streamed token, and the error event that
 * ends a stream which already sent tokens. */
void kserve_stream_event(strbuf *sb, const char *model, int32_t token, int index);
/* A text_input stream's event: the text that became final (text_output),
 * with "finish_reason" on the last one. */
void kserve_text_event(strbuf *sb, const char *model, const char *text, size_t len, text_finish finish);
void kserve_stream_error(strbuf *sb, const char *msg);

/* {"error": msg} */
void kserve_error(strbuf *sb, const char *msg);
/* GET /v2 and GET /v2/models/{m} bodies. */
void kserve_server_metadata(strbuf *sb);
void kserve_model_metadata(strbuf *sb, const char *model, int vocab);

/* Triton's model configuration (GET /v2/models/{m}/config, gRPC
 * ModelConfig), transport-neutral: both writers read this one struct.
 * platform and backend "ferry", the latest version, max_batch_size = the
 * sequences that run at once, decoupled (a streamed request answers once
 * per token). Data types carry the numbers of Triton's DataType enum
 * (model_config.proto); kserve_type_name gives their JSON names. */
enum { KSERVE_TYPE_INT64 = 9, KSERVE_TYPE_FP32 = 11 };

typedef struct {
    const char *name;
    int data_type;           /* KSERVE_TYPE_* */
    int64_t dim;             /* dims = [dim], -1 = variable */
} kserve_config_tensor;

typedef struct {
    const char *name, *platform, *backend;
    unsigned latest_versions; /* version_policy.latest.num_versions */
    int max_batch_size;
    int n_inputs, n_outputs;
    kserve_config_tensor inputs[1], outputs[2];
    bool decoupled;          /* model_transaction_policy.decoupled */
} kserve_config;

void kserve_config_fill(kserve_config *c, const char *model, int vocab, int max_batch);
const char *kserve_type_name(int data_type); /* "TYPE_INT64", ... */
void kserve_model_config(strbuf *sb, const kserve_config *c);

/* Triton's statistics (GET /v2/models/{m}/stats, gRPC ModelStatistics),
 * transport-neutral: inference_count = sequences that succeeded,
 * execution_count = engine steps (one step serves many sequences);
 * success/fail = submit to end, queue = submit to admission,
 * compute_infer = the steps' wall time; compute_input/output are not
 * measured apart (0). */
typedef struct {
    uint64_t count, ns;
} kserve_duration;

typedef struct {
    uint64_t last_inference; /* ms since the epoch, 0 = never */
    uint64_t inference_count, execution_count;
    kserve_duration success, fail, queue, compute_input, compute_infer, compute_output;
} kserve_stats;

void kserve_stats_fill(kserve_stats *k, const sched_stats *s);
/* {"model_stats": [{...}]} for the one model */
void kserve_model_stats(strbuf *sb, const char *model, const kserve_stats *k);

/* The HTTP status of an outcome (gRPC maps the same enum its own way). */
int kserve_http_status(ferry_status st);

#endif
