/*
 * grpc_messages.c - protobuf <-> kserve_request for the gRPC front end
 * (see grpc_messages.h for what a ModelInfer may hold).
 */
#include "grpc_messages.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grpc_service.pb-c.h"

#define MAX_TOKENS (1 << 28) /* B x T bound, as kserve.c */

typedef Inference__ModelInferRequest infer_req;
typedef Inference__ModelInferRequest__InferInputTensor infer_input;
typedef Inference__InferParameter infer_param;

grpc_status_code grpc_status_of(ferry_status st)
{
    switch (st) {
    case FERRY_OK: return GRPC_STATUS_OK;
    case FERRY_ERR_INVALID:
    case FERRY_ERR_UNSUPPORTED: return GRPC_STATUS_INVALID_ARGUMENT;
    case FERRY_ERR_NOT_FOUND: return GRPC_STATUS_NOT_FOUND;
    case FERRY_ERR_TOO_LARGE:
    case FERRY_ERR_BUSY:
    case FERRY_ERR_NOMEM: return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case FERRY_ERR_IO:
    case FERRY_ERR_INTERNAL: return GRPC_STATUS_INTERNAL;
    }
    return GRPC_STATUS_UNKNOWN;
}

/* ---- parameters ----------------------------------------------------------------- */

/* stop_token_ids: InferParameter holds no list, so ids separated by ','. */
static ferry_status param_stop_ids(const char *name, const infer_param *p, kserve_request *r)
{
    if (p->parameter_choice_case != INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM)
        return ferry_fail(FERRY_ERR_INVALID, "%s must be a string_param of ids separated by ','", name);
    size_t n = 0; /* the entries: each starts after a ',' (or at the start) */
    for (const char *s = p->string_param; *s; s++) n += *s != ',' && (s == p->string_param || s[-1] == ',');
    FERRY_TRY(gen_param_check_stop_count(name, n));
    r->gen.n_stop = 0;
    for (const char *s = p->string_param; *s;) {
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (end == s || errno || (*end && *end != ','))
            return ferry_fail(FERRY_ERR_INVALID, "%s: '%s' is not a list of token ids", name, p->string_param);
        FERRY_TRY(gen_param_check_stop_id(name, (size_t)r->gen.n_stop, v));
        r->gen.stop_ids[r->gen.n_stop++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    r->gen.given[GEN_stop_token_ids] = true;
    return FERRY_OK;
}

/* One InferParameter: gen_params.def's by their names, from the kinds that
 * hold their types (grpc_messages.h lists them). */
static ferry_status parse_param(const char *key, const infer_param *p, kserve_request *r)
{
    if (!p) return ferry_fail(FERRY_ERR_INVALID, "parameters.%s has no value", key);
    int kind = p->parameter_choice_case;
    gen_param id = gen_param_find(key);
    if (id == GEN_PARAM_COUNT) {
        if (strcmp(key, "binary_data_output") && strcmp(key, "triton_enable_empty_final_response")) {
            char known[160];
            return ferry_fail(FERRY_ERR_INVALID,
                              "unknown parameter '%s' (known: %s, binary_data_output, triton_enable_empty_final_response)",
                              key, gen_param_names(known, sizeof known, 0));
        }
        if (kind != INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM)
            return ferry_fail(FERRY_ERR_INVALID, "parameters.%s must be a bool_param", key);
        return FERRY_OK;
    }
    char name[48];
    snprintf(name, sizeof name, "parameters.%.32s", key); /* a known parameter's: short */
    switch (gen_param_defs[id].type) {
    case GEN_INT:
    case GEN_U64:
        if (kind == INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM)
            return gen_param_set_int(&r->gen, id, name, p->int64_param);
        if (kind == INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_UINT64_PARAM)
            return gen_param_set_u64(&r->gen, id, name, p->uint64_param);
        return ferry_fail(FERRY_ERR_INVALID, "%s must be an int64_param", name);
    case GEN_REAL:
        if (kind == INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_DOUBLE_PARAM)
            return gen_param_set_real(&r->gen, id, name, p->double_param);
        if (kind == INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM)
            return gen_param_set_real(&r->gen, id, name, (double)p->int64_param);
        return ferry_fail(FERRY_ERR_INVALID, "%s must be a double_param or int64_param", name);
    case GEN_IDS: return param_stop_ids(name, p, r);
    case GEN_STOPS: {
        /* one stop string (InferParameter holds no list); text only, checked once the input is known */
        if (kind != INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM)
            return ferry_fail(FERRY_ERR_INVALID, "%s must be a string_param (one stop string)", name);
        json_value sv = {.type = JSON_STRING, .len = strlen(p->string_param), .str = p->string_param};
        text_stops_free(&r->stops);
        return text_stops_parse(&sv, name, &r->stops);
    }
    }
    return ferry_fail(FERRY_ERR_INTERNAL, "%s: a parameter of no known type", name);
}

/* ---- input_ids and outputs ------------------------------------------------------ */

/* text_input BYTES [B] or [B, 1]: contents.bytes_contents, one element per
 * prompt, or raw_input_contents[0] holding each element as a 4-byte
 * little-endian length and its bytes (Triton's serialization). */
static ferry_status parse_text_input(const infer_req *m, const infer_input *in, kserve_request *r)
{
    if (strcmp(in->datatype, "BYTES"))
        return ferry_fail(FERRY_ERR_INVALID, "text_input: datatype must be BYTES (got '%s')", in->datatype);
    if (in->n_parameters) return ferry_fail(FERRY_ERR_INVALID, "text_input: unsupported parameter '%s'", in->parameters[0]->key);
    if (in->n_shape < 1 || in->n_shape > 2 || (in->n_shape == 2 && in->shape[1] != 1))
        return ferry_fail(FERRY_ERR_INVALID, "text_input: shape must be [B] or [B, 1]");
    int64_t b = in->shape[0];
    if (b < 1 || b > KSERVE_MAX_ROWS)
        return ferry_fail(FERRY_ERR_INVALID, "text_input: %lld prompts (1..%d)", (long long)b, KSERVE_MAX_ROWS);
    kserve_bytes *el = malloc((size_t)b * sizeof *el);
    if (!el) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    ferry_status st = FERRY_OK;
    const Inference__InferTensorContents *c = in->contents;
    if (m->n_raw_input_contents) {
        if (m->n_raw_input_contents != 1)
            st = ferry_fail(FERRY_ERR_INVALID, "raw_input_contents: one entry per input expected (got %zu)",
                            m->n_raw_input_contents);
        else if (c) st = ferry_fail(FERRY_ERR_INVALID, "text_input: contents and raw_input_contents are both given");
        else st = kserve_bytes_split(m->raw_input_contents[0].data, m->raw_input_contents[0].len, b, "raw contents", el);
    } else if (!c || c->n_bytes_contents != (size_t)b) {
        st = ferry_fail(FERRY_ERR_INVALID, "text_input: shape [%lld] needs %lld bytes_contents, got %zu", (long long)b,
                        (long long)b, c ? c->n_bytes_contents : 0);
    } else {
        for (int64_t i = 0; i < b; i++) el[i] = (kserve_bytes){(const char *)c->bytes_contents[i].data, c->bytes_contents[i].len};
    }
    if (st == FERRY_OK) st = kserve_set_texts(r, b, el);
    free(el);
    return st;
}

static ferry_status parse_input_ids(const infer_req *m, kserve_request *r)
{
    if (m->n_inputs != 1)
        return ferry_fail(FERRY_ERR_INVALID, "expected one input, input_ids or text_input (got %zu)", m->n_inputs);
    const infer_input *in = m->inputs[0];
    if (!strcmp(in->name, "text_input")) return parse_text_input(m, in, r);
    if (strcmp(in->name, "input_ids"))
        return ferry_fail(FERRY_ERR_INVALID, "unknown input '%s' (the model takes input_ids or text_input)", in->name);
    if (strcmp(in->datatype, "INT64"))
        return ferry_fail(FERRY_ERR_INVALID, "input_ids: datatype must be INT64 (got '%s')", in->datatype);
    if (in->n_parameters) return ferry_fail(FERRY_ERR_INVALID, "input_ids: unsupported parameter '%s'", in->parameters[0]->key);
    int64_t b, t;
    if (in->n_shape == 2) b = in->shape[0], t = in->shape[1];
    else if (in->n_shape == 1) b = 1, t = in->shape[0];
    else return ferry_fail(FERRY_ERR_INVALID, "input_ids: shape must be [B, T] or [T] (got %zu dimensions)", in->n_shape);
    if (b < 1 || b > KSERVE_MAX_ROWS || t < 1 || t > MAX_TOKENS / b)
        return ferry_fail(FERRY_ERR_INVALID, "input_ids: shape [%lld, %lld] out of range (1..%d rows, 1..%d ids in all)",
                          (long long)b, (long long)t, KSERVE_MAX_ROWS, MAX_TOKENS);
    size_t n = (size_t)(b * t);
    const int64_t *typed = NULL;
    const uint8_t *raw = NULL;
    if (m->n_raw_input_contents) {
        if (m->n_raw_input_contents != 1)
            return ferry_fail(FERRY_ERR_INVALID, "raw_input_contents: one entry per input expected (got %zu)",
                              m->n_raw_input_contents);
        if (in->contents)
            return ferry_fail(FERRY_ERR_INVALID, "input_ids: contents and raw_input_contents are both given");
        if (m->raw_input_contents[0].len != n * 8)
            return ferry_fail(FERRY_ERR_INVALID, "input_ids: shape [%lld, %lld] needs %zu bytes of raw contents, got %zu",
                              (long long)b, (long long)t, n * 8, m->raw_input_contents[0].len);
        raw = m->raw_input_contents[0].data;
    } else {
        const Inference__InferTensorContents *c = in->contents;
        if (!c || c->n_int64_contents != n)
            return ferry_fail(FERRY_ERR_INVALID, "input_ids: shape [%lld, %lld] needs %zu int64_contents, got %zu",
                              (long long)b, (long long)t, n, c ? c->n_int64_contents : 0);
        typed = c->int64_contents;
    }
    r->n_rows = (int)b;
    r->row_off = calloc((size_t)b, sizeof *r->row_off);
    r->row_len = calloc((size_t)b, sizeof *r->row_len);
    r->ids = malloc(n * sizeof *r->ids);
    if (!r->row_off || !r->row_len || !r->ids) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        int64_t v;
        if (typed) v = typed[i];
        else {
            uint64_t u = 0;
            for (int k = 7; k >= 0; k--) u = u << 8 | raw[i * 8 + (size_t)k]; /* little-endian */
            v = (int64_t)u;
        }
        if (v < 0 || v > INT32_MAX)
            return ferry_fail(FERRY_ERR_INVALID,
                              "input_ids: %lld at index %zu is not a token id (ids are 0 .. vocabulary size - 1)",
                              (long long)v, i);
        r->ids[i] = (int32_t)v;
    }
    for (int64_t i = 0; i < b; i++) r->row_off[i] = (int)(i * t), r->row_len[i] = (int)t;
    return FERRY_OK;
}

static ferry_status parse_outputs(const infer_req *m, kserve_request *r)
{
    for (size_t i = 0; i < m->n_outputs; i++) {
        const char *name = m->outputs[i]->name;
        int which = !strcmp(name, "output_ids")    ? KSERVE_OUT_IDS
                    : !strcmp(name, "logits")      ? KSERVE_OUT_LOGITS
                    : !strcmp(name, "text_output") ? KSERVE_OUT_TEXT
                                                   : -1;
        if (which < 0)
            return ferry_fail(FERRY_ERR_INVALID, "outputs[%zu]: unknown output '%s' (output_ids, logits, text_output)", i, name);
        for (size_t k = 0; k < m->outputs[i]->n_parameters; k++)
            if (strcmp(m->outputs[i]->parameters[k]->key, "binary_data"))
                return ferry_fail(FERRY_ERR_INVALID, "outputs[%zu]: unsupported parameter '%s'", i,
                                  m->outputs[i]->parameters[k]->key);
        int slot = -1;
        for (int k = 0; k < r->n_outputs; k++)
            if (r->outputs[k] == which) slot = k; /* named twice: once */
        if (slot < 0) slot = r->n_outputs++;
        r->outputs[slot] = which;
        r->binary[slot] = true;
        if (which == KSERVE_OUT_LOGITS) r->want_logits = true;
        if (which == KSERVE_OUT_TEXT) r->text_out = true;
    }
    if (r->n_outputs == 0) { /* output_ids, or text_output for text */
        r->n_outputs = 1;
        r->outputs[0] = r->text_input ? KSERVE_OUT_TEXT : KSERVE_OUT_IDS;
        r->binary[0] = true;
    }
    return FERRY_OK;
}

static ferry_status parse_infer(const infer_req *m, const engine_limits *lim, kserve_request *r)
{
    if (m->id && *m->id) {
        if (strlen(m->id) > KSERVE_MAX_ID) return ferry_fail(FERRY_ERR_INVALID, "id is longer than %d bytes", KSERVE_MAX_ID);
        if (!(r->id = strdup(m->id))) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < m->n_parameters; i++) FERRY_TRY(parse_param(m->parameters[i]->key, m->parameters[i]->value, r));
    FERRY_TRY(parse_input_ids(m, r));
    FERRY_TRY(parse_outputs(m, r));
    if (r->stops.n && !r->text_out)
        return ferry_fail(FERRY_ERR_INVALID, "parameters.stop (a stop string) needs text: the prompt as text_input or "
                          "text_output asked for; token ids stop with parameters.stop_token_ids");
    if (r->text_out) return FERRY_OK; /* encoded and checked by the transport (kserve_encode_text) */
    for (int i = 0; i < r->n_rows; i++) {
        char what[32];
        snprintf(what, sizeof what, r->n_rows > 1 ? "input_ids[%d]" : "input_ids", i);
        gen_request g = kserve_row_request(r, i);
        FERRY_TRY(request_check(&g, lim, what, NULL));
    }
    return FERRY_OK;
}

/* protobuf-c's allocations during a parse, taken from the request budget:
 * a few bytes on the wire can decode to many more in memory (a packed
 * varint to 8 bytes, a map entry to its structs and strings). */
typedef struct {
    req_budget *b;
    uint64_t held;
    bool refused;
} parse_mem;

#define PARSE_MEM_HEAD 16 /* the size in front of each block, keeping malloc's alignment */

static void *parse_alloc(void *data, size_t n)
{
    parse_mem *m = data;
    uint64_t total = (uint64_t)n + PARSE_MEM_HEAD;
    if (!req_budget_take(m->b, &m->held, total)) {
        m->refused = true;
        return NULL;
    }
    uint64_t *p = malloc(total);
    if (!p) {
        req_budget_give(m->b, &m->held, total);
        return NULL;
    }
    p[0] = total;
    return (char *)p + PARSE_MEM_HEAD;
}

static void parse_free(void *data, void *ptr)
{
    parse_mem *m = data;
    if (!ptr) return;
    uint64_t *p = (uint64_t *)(void *)((char *)ptr - PARSE_MEM_HEAD);
    req_budget_give(m->b, &m->held, p[0]);
    free(p);
}

ferry_status grpc_infer_parse(const uint8_t *buf, size_t len, const engine_limits *lim, req_budget *budget,
                              kserve_request *out, char **model)
{
    kserve_request_defaults(out); /* as REST's requests */
    *model = NULL;
    parse_mem pm = {budget, 0, false};
    ProtobufCAllocator counted = {parse_alloc, parse_free, &pm};
    ProtobufCAllocator *alloc = budget ? &counted : NULL;
    infer_req *m = inference__model_infer_request__unpack(alloc, len, buf);
    if (!m && pm.refused) {
        char busy[160];
        req_budget_busy_msg(budget, busy, sizeof busy);
        return ferry_fail(FERRY_ERR_BUSY, "%s; decoding a %zu-byte ModelInferRequest needs more", busy, len);
    }
    if (!m) return ferry_fail(FERRY_ERR_INVALID, "malformed ModelInferRequest (%zu bytes)", len);
    ferry_status st = FERRY_OK;
    if (!(*model = strdup(m->model_name))) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    else if (*m->model_version && strcmp(m->model_version, KSERVE_MODEL_VERSION))
        st = ferry_fail(FERRY_ERR_NOT_FOUND, "model version '%s' not found (the one version is " KSERVE_MODEL_VERSION ")",
                        m->model_version);
    else st = parse_infer(m, lim, out);
    inference__model_infer_request__free_unpacked(m, alloc);
    if (st != FERRY_OK) kserve_request_free(out);
    return st;
}

/* ---- responses ------------------------------------------------------------------ */

/* Packs msg into a malloc'd buffer. */
static ferry_status pack(const ProtobufCMessage *msg, uint8_t **out, size_t *out_len)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    *out = malloc(n ? n : 1);
    if (!*out) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    *out_len = protobuf_c_message_pack(msg, *out);
    return FERRY_OK;
}

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int k = 0; k < 8; k++) p[k] = (uint8_t)(v >> (8 * k));
}

ferry_status grpc_infer_response(const kserve_request *r, const char *model, const kserve_row *rows, int vocab,
                                 uint8_t **out, size_t *out_len)
{
    int n = 0; /* the longest row */
    for (int i = 0; i < r->n_rows; i++)
        if (rows[i].n_tokens > n) n = rows[i].n_tokens;
    Inference__ModelInferResponse m = INFERENCE__MODEL_INFER_RESPONSE__INIT;
    Inference__ModelInferResponse__InferOutputTensor t[3], *tp[3];
    int64_t shape[3][2];
    ProtobufCBinaryData raw[3] = {{0, NULL}, {0, NULL}, {0, NULL}};
    ferry_status st = FERRY_OK;
    m.model_name = (char *)model;
    m.model_version = (char *)KSERVE_MODEL_VERSION;
    m.id = r->id ? r->id : (char *)"";
    for (int o = 0; o < r->n_outputs; o++) {
        bool ids = r->outputs[o] == KSERVE_OUT_IDS;
        inference__model_infer_response__infer_output_tensor__init(&t[o]);
        tp[o] = &t[o];
        if (r->outputs[o] == KSERVE_OUT_TEXT) { /* BYTES [B]: each row a 4-byte length and its text */
            t[o].name = (char *)"text_output";
            t[o].datatype = (char *)"BYTES";
            shape[o][0] = r->n_rows;
            t[o].shape = shape[o];
            t[o].n_shape = 1;
            for (int i = 0; i < r->n_rows; i++) raw[o].len += 4 + rows[i].text_len;
            if (!(raw[o].data = malloc(raw[o].len ? raw[o].len : 1))) {
                st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
                goto done;
            }
            uint8_t *p = raw[o].data;
            for (int i = 0; i < r->n_rows; i++) {
                for (int k = 0; k < 4; k++) p[k] = (uint8_t)(rows[i].text_len >> (8 * k));
                if (rows[i].text_len) memcpy(p + 4, rows[i].text, rows[i].text_len);
                p += 4 + rows[i].text_len;
            }
            continue;
        }
        t[o].name = (char *)(ids ? "output_ids" : "logits");
        t[o].datatype = (char *)(ids ? "INT64" : "FP32");
        shape[o][0] = r->n_rows;
        shape[o][1] = ids ? n : vocab;
        t[o].shape = shape[o];
        t[o].n_shape = 2;
        size_t cols = (size_t)(ids ? n : vocab), esz = ids ? 8 : 4;
        raw[o].len = (size_t)r->n_rows * cols * esz;
        if (!(raw[o].data = malloc(raw[o].len ? raw[o].len : 1))) {
            st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (int i = 0; i < r->n_rows; i++) {
            uint8_t *p = raw[o].data + (size_t)i * cols * esz;
            if (ids) {
                for (int j = 0; j < n; j++)
                    put_le64(p + (size_t)j * 8, (uint64_t)(int64_t)(j < rows[i].n_tokens ? rows[i].tokens[j] : -1));
            } else {
                for (int j = 0; j < vocab; j++) {
                    float f = rows[i].logits ? rows[i].logits[j] : NAN;
                    uint32_t u;
                    memcpy(&u, &f, 4);
                    for (int k = 0; k < 4; k++) p[(size_t)j * 4 + (size_t)k] = (uint8_t)(u >> (8 * k));
                }
            }
        }
    }
    m.outputs = tp;
    m.n_outputs = (size_t)r->n_outputs;
    m.raw_output_contents = raw;
    m.n_raw_output_contents = (size_t)r->n_outputs;
    st = pack(&m.base, out, out_len);
done:
    for (int o = 0; o < 3; o++) free(raw[o].data);
    return st;
}

ferry_status grpc_model_ref_parse(const uint8_t *buf, size_t len, char **name, char **version)
{
    *name = *version = NULL;
    Inference__ModelReadyRequest *m = inference__model_ready_request__unpack(NULL, len, buf);
    if (!m) return ferry_fail(FERRY_ERR_INVALID, "malformed request message (%zu bytes)", len);
    *name = strdup(m->name);
    *version = strdup(m->version);
    inference__model_ready_request__free_unpacked(m, NULL);
    if (!*name || !*version) {
        free(*name);
        free(*version);
        *name = *version = NULL;
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    return FERRY_OK;
}

ferry_status grpc_bool_response(int which, int value, uint8_t **out, size_t *out_len)
{
    /* the three are {bool = 1}: one layout, three names */
    Inference__ServerLiveResponse live = INFERENCE__SERVER_LIVE_RESPONSE__INIT;
    Inference__ServerReadyResponse ready = INFERENCE__SERVER_READY_RESPONSE__INIT;
    Inference__ModelReadyResponse model = INFERENCE__MODEL_READY_RESPONSE__INIT;
    live.live = ready.ready = model.ready = value != 0;
    return pack(which == GRPC_MSG_LIVE ? &live.base : which == GRPC_MSG_READY ? &ready.base : &model.base, out, out_len);
}

ferry_status grpc_server_metadata_response(uint8_t **out, size_t *out_len)
{
    /* as kserve_server_metadata (REST): the binary tensor data extension
     * is what raw_*_contents are on gRPC */
    static char *ext[] = {(char *)"binary_tensor_data", (char *)"generate"};
    Inference__ServerMetadataResponse m = INFERENCE__SERVER_METADATA_RESPONSE__INIT;
    m.name = (char *)"ferry";
    m.version = (char *)FERRY_VERSION;
    m.extensions = ext;
    m.n_extensions = 2;
    return pack(&m.base, out, out_len);
}

ferry_status grpc_model_metadata_response(const char *model, int vocab, uint8_t **out, size_t *out_len)
{
    /* as kserve_model_metadata (REST) */
    static char *versions[] = {(char *)KSERVE_MODEL_VERSION};
    int64_t ids_shape[2] = {-1, -1}, logits_shape[2] = {-1, vocab};
    Inference__ModelMetadataResponse__TensorMetadata in = INFERENCE__MODEL_METADATA_RESPONSE__TENSOR_METADATA__INIT,
                                                     ids = INFERENCE__MODEL_METADATA_RESPONSE__TENSOR_METADATA__INIT,
                                                     logits = INFERENCE__MODEL_METADATA_RESPONSE__TENSOR_METADATA__INIT;
    in.name = (char *)"input_ids", in.datatype = (char *)"INT64", in.shape = ids_shape, in.n_shape = 2;
    ids.name = (char *)"output_ids", ids.datatype = (char *)"INT64", ids.shape = ids_shape, ids.n_shape = 2;
    logits.name = (char *)"logits", logits.datatype = (char *)"FP32", logits.shape = logits_shape, logits.n_shape = 2;
    Inference__ModelMetadataResponse__TensorMetadata *inputs[] = {&in}, *outputs[] = {&ids, &logits};
    Inference__ModelMetadataResponse m = INFERENCE__MODEL_METADATA_RESPONSE__INIT;
    m.name = (char *)model;
    m.versions = versions;
    m.n_versions = 1;
    m.platform = (char *)"ferry";
    m.inputs = inputs;
    m.n_inputs = 1;
    m.outputs = outputs;
    m.n_outputs = 2;
    return pack(&m.base, out, out_len);
}

/* ---- ModelConfig and ModelStatistics (Triton's) ---------------------------------- */

ferry_status grpc_model_config_response(const kserve_config *c, uint8_t **out, size_t *out_len)
{
    Inference__ModelInput in[1], *inp[1];
    Inference__ModelOutput outs[2], *outp[2];
    int64_t in_dims[1], out_dims[2];
    for (int i = 0; i < c->n_inputs; i++) {
        inference__model_input__init(&in[i]);
        in[i].name = (char *)c->inputs[i].name;
        in[i].data_type = (Inference__DataType)c->inputs[i].data_type; /* the same numbers */
        in_dims[i] = c->inputs[i].dim;
        in[i].dims = &in_dims[i];
        in[i].n_dims = 1;
        inp[i] = &in[i];
    }
    for (int i = 0; i < c->n_outputs; i++) {
        inference__model_output__init(&outs[i]);
        outs[i].name = (char *)c->outputs[i].name;
        outs[i].data_type = (Inference__DataType)c->outputs[i].data_type;
        out_dims[i] = c->outputs[i].dim;
        outs[i].dims = &out_dims[i];
        outs[i].n_dims = 1;
        outp[i] = &outs[i];
    }
    Inference__ModelVersionPolicy__Latest latest = INFERENCE__MODEL_VERSION_POLICY__LATEST__INIT;
    latest.num_versions = c->latest_versions;
    Inference__ModelVersionPolicy policy = INFERENCE__MODEL_VERSION_POLICY__INIT;
    policy.policy_choice_case = INFERENCE__MODEL_VERSION_POLICY__POLICY_CHOICE_LATEST;
    policy.latest = &latest;
    Inference__ModelTransactionPolicy tp = INFERENCE__MODEL_TRANSACTION_POLICY__INIT;
    tp.decoupled = c->decoupled;
    Inference__ModelConfig mc = INFERENCE__MODEL_CONFIG__INIT;
    mc.name = (char *)c->name;
    mc.platform = (char *)c->platform;
    mc.backend = (char *)c->backend;
    mc.version_policy = &policy;
    mc.max_batch_size = c->max_batch_size;
    mc.input = inp;
    mc.n_input = (size_t)c->n_inputs;
    mc.output = outp;
    mc.n_output = (size_t)c->n_outputs;
    mc.model_transaction_policy = &tp;
    Inference__ModelConfigResponse m = INFERENCE__MODEL_CONFIG_RESPONSE__INIT;
    m.config = &mc;
    return pack(&m.base, out, out_len);
}

static void set_duration(Inference__StatisticDuration *d, kserve_duration k)
{
    inference__statistic_duration__init(d);
    d->count = k.count;
    d->ns = k.ns;
}

ferry_status grpc_model_stats_response(const char *model, const kserve_stats *k, uint8_t **out, size_t *out_len)
{
    Inference__StatisticDuration success, fail, queue, cin, cinfer, cout;
    set_duration(&success, k->success);
    set_duration(&fail, k->fail);
    set_duration(&queue, k->queue);
    set_duration(&cin, k->compute_input);
    set_duration(&cinfer, k->compute_infer);
    set_duration(&cout, k->compute_output);
    Inference__InferStatistics is = INFERENCE__INFER_STATISTICS__INIT;
    is.success = &success;
    is.fail = &fail;
    is.queue = &queue;
    is.compute_input = &cin;
    is.compute_infer = &cinfer;
    is.compute_output = &cout;
    Inference__ModelStatistics ms = INFERENCE__MODEL_STATISTICS__INIT, *msp[] = {&ms};
    ms.name = (char *)model;
    ms.version = (char *)KSERVE_MODEL_VERSION;
    ms.last_inference = k->last_inference;
    ms.inference_count = k->inference_count;
    ms.execution_count = k->execution_count;
    ms.inference_stats = &is;
    Inference__ModelStatisticsResponse m = INFERENCE__MODEL_STATISTICS_RESPONSE__INIT;
    m.model_stats = msp;
    m.n_model_stats = 1;
    return pack(&m.base, out, out_len);
}

/* ---- ModelStreamInfer ----------------------------------------------------------- */

/* One ModelStreamInferResponse: the output t with its raw contents (t NULL:
 * none, the empty final response) and the final flag. */
static ferry_status stream_response(const char *model, const char *id, bool final,
                                    Inference__ModelInferResponse__InferOutputTensor *t, ProtobufCBinaryData *raw,
                                    uint8_t **out, size_t *out_len)
{
    Inference__InferParameter fin = INFERENCE__INFER_PARAMETER__INIT;
    fin.parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM;
    fin.bool_param = final;
    Inference__ModelInferResponse__ParametersEntry entry = INFERENCE__MODEL_INFER_RESPONSE__PARAMETERS_ENTRY__INIT,
                                                   *entries[] = {&entry};
    entry.key = (char *)"triton_final_response";
    entry.value = &fin;
    Inference__ModelInferResponse__InferOutputTensor *tp[] = {t};
    Inference__ModelInferResponse m = INFERENCE__MODEL_INFER_RESPONSE__INIT;
    m.model_name = (char *)model;
    m.model_version = (char *)KSERVE_MODEL_VERSION;
    m.id = (char *)(id ? id : "");
    m.parameters = entries;
    m.n_parameters = 1;
    if (t) {
        m.outputs = tp;
        m.n_outputs = 1;
        m.raw_output_contents = raw;
        m.n_raw_output_contents = 1;
    }
    Inference__ModelStreamInferResponse s = INFERENCE__MODEL_STREAM_INFER_RESPONSE__INIT;
    s.infer_response = &m;
    return pack(&s.base, out, out_len);
}

ferry_status grpc_stream_token_response(const char *model, const char *id, const int32_t *token, bool final,
                                        uint8_t **out, size_t *out_len)
{
    Inference__ModelInferResponse__InferOutputTensor t = INFERENCE__MODEL_INFER_RESPONSE__INFER_OUTPUT_TENSOR__INIT;
    int64_t shape[2] = {1, 1};
    uint8_t le[8];
    ProtobufCBinaryData raw = {8, le};
    if (!token) return stream_response(model, id, final, NULL, NULL, out, out_len); /* the empty final response */
    put_le64(le, (uint64_t)(int64_t)*token);
    t.name = (char *)"output_ids";
    t.datatype = (char *)"INT64";
    t.shape = shape;
    t.n_shape = 2;
    return stream_response(model, id, final, &t, &raw, out, out_len);
}

ferry_status grpc_stream_text_response(const char *model, const char *id, const char *text, size_t len, bool final,
                                       uint8_t **out, size_t *out_len)
{
    Inference__ModelInferResponse__InferOutputTensor t = INFERENCE__MODEL_INFER_RESPONSE__INFER_OUTPUT_TENSOR__INIT;
    int64_t shape[1] = {1};
    ProtobufCBinaryData raw = {4 + len, malloc(4 + len)};
    if (!raw.data) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    for (int k = 0; k < 4; k++) raw.data[k] = (uint8_t)(len >> (8 * k));
    if (len) memcpy(raw.data + 4, text, len);
    t.name = (char *)"text_output";
    t.datatype = (char *)"BYTES";
    t.shape = shape;
    t.n_shape = 1;
    ferry_status st = stream_response(model, id, final, &t, &raw, out, out_len);
    free(raw.data);
    return st;
}

ferry_status grpc_stream_error_response(const char *msg, const char *model, const char *id, uint8_t **out,
                                        size_t *out_len)
{
    Inference__ModelInferResponse m = INFERENCE__MODEL_INFER_RESPONSE__INIT;
    m.model_name = (char *)model;
    m.model_version = (char *)KSERVE_MODEL_VERSION;
    m.id = (char *)(id ? id : "");
    Inference__ModelStreamInferResponse s = INFERENCE__MODEL_STREAM_INFER_RESPONSE__INIT;
    s.error_message = (char *)msg;
    s.infer_response = &m; /* the id says which request failed */
    return pack(&s.base, out, out_len);
}

char *grpc_infer_peek_id(const uint8_t *buf, size_t len)
{
    infer_req *m = inference__model_infer_request__unpack(NULL, len, buf);
    if (!m) return NULL;
    char *id = *m->id ? strndup(m->id, KSERVE_MAX_ID) : NULL;
    inference__model_infer_request__free_unpacked(m, NULL);
    return id;
}
