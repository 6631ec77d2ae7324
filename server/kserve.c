/*
 * kserve.c - KServe v2 request parsing and response writing. See kserve.h.
 *
 * Every failure is FERRY_ERR_INVALID with a message that names the field
 * the client must change ("parameters.top_p must be a number in (0, 1]",
 * "input_ids: shape [2, 3] needs 6 values, data has 5"). Unknown fields
 * and parameters are refused rather than ignored, so that a typo
 * ("max_tokens") is an error and not a silent default. The generation
 * parameters, their types and ranges are engine/gen_params.def's, read
 * and checked by gen_params.h as gRPC and OpenAI read them.
 */
#include "kserve.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../config/config.h"

#define MAX_TOKENS (1 << 28) /* B x T bound: keeps size arithmetic far from overflow */

size_t kserve_parse_bound(size_t body_len)
{
    return body_len > (SIZE_MAX - KSERVE_PARSE_SLACK) / KSERVE_PARSE_RATIO ? SIZE_MAX
                                                                          : KSERVE_PARSE_RATIO * body_len + KSERVE_PARSE_SLACK;
}

size_t kserve_request_bytes(const kserve_request *r)
{
    return sizeof *r + (size_t)r->n_rows * 2 * sizeof(int) + (r->n_rows ? (size_t)(r->row_off[r->n_rows - 1] + r->row_len[r->n_rows - 1]) * sizeof(int32_t) : 0) +
           (r->id ? strlen(r->id) + 1 : 0) + (r->text_input ? r->text_len + 1 + (size_t)(r->n_texts + 1) * sizeof(size_t) : 0) +
           text_stops_bytes(&r->stops);
}

uint64_t kserve_held_bytes(const kserve_request *r, int vocab)
{
    uint64_t rows = (uint64_t)r->n_rows, new_tokens = (uint64_t)r->gen.max_new_tokens;
    return kserve_request_bytes(r) +
           rows * (new_tokens * sizeof(int32_t) + (r->want_logits ? (uint64_t)vocab * sizeof(float) : 0) +
                   sizeof(kserve_row));
}

/* A request's parameters start as the settings' defaults (settings.def),
 * the same a `ferry generate` without flags uses. */
void kserve_request_defaults(kserve_request *r)
{
    memset(r, 0, sizeof *r);
    config_gen_defaults(&r->gen);
}

void kserve_request_free(kserve_request *r)
{
    free(r->ids);
    free(r->row_off);
    free(r->row_len);
    free(r->id);
    free(r->text_input);
    free(r->text_off);
    text_stops_free(&r->stops);
    memset(r, 0, sizeof *r);
}

/* Allocates n rows of len ids each (len 0: row lengths set later). */
static ferry_status alloc_rows(kserve_request *r, int n, size_t total)
{
    r->n_rows = n;
    r->row_off = calloc((size_t)n, sizeof *r->row_off);
    r->row_len = calloc((size_t)n, sizeof *r->row_len);
    r->ids = malloc((total ? total : 1) * sizeof *r->ids);
    if (!r->row_off || !r->row_len || !r->ids) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    return FERRY_OK;
}

/* ---- parameters ----------------------------------------------------------------- */

static bool is_int(const json_value *v) { return v->type == JSON_NUMBER && v->is_int; }

/* The request's "parameters": gen_params.def's by their names (stop only
 * with text: the prompt as text_input, or infer's text_output asked for),
 * and infer's binary_data_output. */
static ferry_status parse_params(const json_value *params, bool infer, bool text, kserve_request *r,
                                 bool *binary_output)
{
    if (!params || params->type == JSON_NULL) return FERRY_OK;
    if (params->type != JSON_OBJECT) return ferry_fail(FERRY_ERR_INVALID, "parameters must be an object");
    for (size_t i = 0; i < params->len; i++) {
        const char *k = params->members[i].key;
        const json_value *v = &params->members[i].value;
        if (v->type == JSON_NULL) continue; /* null: the default */
        gen_param id = gen_param_find(k);
        char name[48]; /* a known parameter's: short */
        snprintf(name, sizeof name, "parameters.%.32s", k);
        if (id == GEN_stop) {
            if (!text)
                return ferry_fail(FERRY_ERR_INVALID, "parameters.stop (stop strings) needs text: the prompt as text_input%s; "
                                  "token ids stop with parameters.stop_token_ids", infer ? " or text_output asked for" : "");
            text_stops_free(&r->stops);
            FERRY_TRY(text_stops_parse(v, name, &r->stops));
        } else if (id != GEN_PARAM_COUNT) {
            FERRY_TRY(gen_param_set_json(&r->gen, id, name, v));
        } else if (infer && !strcmp(k, "binary_data_output")) {
            if (v->type != JSON_BOOL)
                return ferry_fail(FERRY_ERR_INVALID, "parameters.binary_data_output must be true or false");
            *binary_output = v->boolean;
        } else {
            char known[160];
            return ferry_fail(FERRY_ERR_INVALID, "unknown parameter '%s' (known: %s%s)", k,
                              gen_param_names(known, sizeof known, text ? 0 : 1u << GEN_stop),
                              infer ? ", binary_data_output" : "");
        }
    }
    return FERRY_OK;
}

/* ---- input_ids ------------------------------------------------------------------ */

/* Whether the vocabulary holds an id is request_check's question (after
 * parsing); here only whether it is an id at all. */
static ferry_status check_id(int64_t v, size_t at)
{
    if (v < 0 || v > INT32_MAX)
        return ferry_fail(FERRY_ERR_INVALID, "input_ids: %lld at index %zu is not a token id (ids are 0 .. vocabulary size - 1)",
                          (long long)v, at);
    return FERRY_OK;
}

/* Copies n integer ids from items into out; *at counts them (for messages). */
static ferry_status copy_ids(const json_value *items, size_t n, int32_t *out, size_t *at)
{
    for (size_t i = 0; i < n; i++, (*at)++) {
        if (!is_int(&items[i])) return ferry_fail(FERRY_ERR_INVALID, "input_ids: data value %zu is not an integer", *at);
        FERRY_TRY(check_id(items[i].integer, *at));
        out[*at] = (int32_t)items[i].integer;
    }
    return FERRY_OK;
}

/* Does data hold exactly shape [b, t] ([t] when not rank2): flat (b*t ids)
 * or nested as the shape (b lists of t ids, rank 2 only)? Checked before
 * anything is allocated for the shape. */
static ferry_status check_data_shape(const json_value *data, int64_t b, int64_t t, bool rank2)
{
    size_t total = (size_t)(b * t);
    if (!data) return ferry_fail(FERRY_ERR_INVALID, "input_ids: data is missing");
    if (data->type != JSON_ARRAY) return ferry_fail(FERRY_ERR_INVALID, "input_ids: data must be an array");
    bool nested = data->len > 0 && data->items[0].type == JSON_ARRAY;
    if (!nested) {
        if (data->len != total && rank2)
            return ferry_fail(FERRY_ERR_INVALID, "input_ids: shape [%lld, %lld] needs %zu values, data has %zu",
                              (long long)b, (long long)t, total, data->len);
        if (data->len != total)
            return ferry_fail(FERRY_ERR_INVALID, "input_ids: shape [%lld] needs %zu values, data has %zu", (long long)t,
                              total, data->len);
        return FERRY_OK;
    }
    if (!rank2 || data->len != (size_t)b)
        return ferry_fail(FERRY_ERR_INVALID, "input_ids: nested data does not match shape [%lld, %lld]", (long long)b,
                          (long long)t);
    for (int64_t i = 0; i < b; i++) {
        const json_value *row = &data->items[i];
        if (row->type != JSON_ARRAY || row->len != (size_t)t)
            return ferry_fail(FERRY_ERR_INVALID,
                              "input_ids: nested data does not match shape [%lld, %lld] (row %lld)", (long long)b,
                              (long long)t, (long long)i);
    }
    return FERRY_OK;
}

/* Copies data, whose shape check_data_shape accepted, checking every id. */
static ferry_status copy_data(const json_value *data, int64_t b, int64_t t, int32_t *out)
{
    size_t at = 0;
    if (!(data->len > 0 && data->items[0].type == JSON_ARRAY)) return copy_ids(data->items, (size_t)(b * t), out, &at);
    for (int64_t i = 0; i < b; i++) FERRY_TRY(copy_ids(data->items[i].items, (size_t)t, out, &at));
    return FERRY_OK;
}

/* One input of an infer request; *bin_used grows by its binary bytes. */
static ferry_status parse_input(const json_value *in, const uint8_t *bin, size_t bin_len, size_t *bin_used,
                                kserve_request *r)
{
    const json_value *datatype = NULL, *shape = NULL, *data = NULL, *params = NULL;
    for (size_t i = 0; i < in->len; i++) {
        const char *k = in->members[i].key;
        const json_value *v = &in->members[i].value;
        if (!strcmp(k, "name")) continue; /* checked by the caller */
        else if (!strcmp(k, "datatype")) datatype = v;
        else if (!strcmp(k, "shape")) shape = v;
        else if (!strcmp(k, "data")) data = v;
        else if (!strcmp(k, "parameters")) params = v;
        else return ferry_fail(FERRY_ERR_INVALID, "input_ids: unknown field '%s'", k);
    }
    if (!datatype || datatype->type != JSON_STRING)
        return ferry_fail(FERRY_ERR_INVALID, "input_ids: datatype must be given as a string (INT64)");
    if (strcmp(datatype->str, "INT64") != 0)
        return ferry_fail(FERRY_ERR_INVALID, "input_ids: datatype must be INT64 (got %s)", datatype->str);
    if (!shape || shape->type != JSON_ARRAY || shape->len < 1 || shape->len > 2)
        return ferry_fail(FERRY_ERR_INVALID, "input_ids: shape must be [B, T] or [T]");
    int64_t dims[2];
    for (size_t i = 0; i < shape->len; i++) {
        if (!is_int(&shape->items[i]) || shape->items[i].integer < 0)
            return ferry_fail(FERRY_ERR_INVALID, "input_ids: shape must hold non-negative integers");
        dims[i] = shape->items[i].integer;
    }
    int64_t b = shape->len == 2 ? dims[0] : 1, t = shape->len == 2 ? dims[1] : dims[0];
    if (b == 0 || t == 0) return ferry_fail(FERRY_ERR_INVALID, "input_ids is empty (shape has a 0)");
    if (b > KSERVE_MAX_ROWS)
        return ferry_fail(FERRY_ERR_INVALID, "input_ids: %lld prompts in one request (at most %d)", (long long)b,
                          KSERVE_MAX_ROWS);
    if (t > MAX_TOKENS || b * t > MAX_TOKENS)
        return ferry_fail(FERRY_ERR_INVALID, "input_ids: shape [%lld, %lld] is too large", (long long)b,
                          (long long)t);
    size_t total = (size_t)(b * t);

    int64_t binary_size = -1;
    if (params && params->type != JSON_NULL) {
        if (params->type != JSON_OBJECT) return ferry_fail(FERRY_ERR_INVALID, "input_ids: parameters must be an object");
        for (size_t i = 0; i < params->len; i++) {
            const json_value *v = &params->members[i].value;
            if (strcmp(params->members[i].key, "binary_data_size") != 0)
                return ferry_fail(FERRY_ERR_INVALID, "input_ids: unknown parameter '%s'", params->members[i].key);
            if (v->type == JSON_NULL) continue;
            if (!is_int(v) || v->integer < 0)
                return ferry_fail(FERRY_ERR_INVALID, "input_ids: binary_data_size must be an integer >= 0");
            binary_size = v->integer;
        }
    }

    /* sizes are checked against what arrived before allocating for the
     * shape: a 60-byte body must not make ferry allocate for [1, 2^28] */
    if (binary_size >= 0) {
        if (data) return ferry_fail(FERRY_ERR_INVALID, "input_ids: both data and binary_data_size are given");
        if ((uint64_t)binary_size != total * 8)
            return ferry_fail(FERRY_ERR_INVALID, "input_ids: binary_data_size is %lld, shape [%lld, %lld] INT64 needs %zu",
                              (long long)binary_size, (long long)b, (long long)t, total * 8);
        if (bin_len - *bin_used < total * 8)
            return ferry_fail(FERRY_ERR_INVALID, "input_ids: binary_data_size is %lld but only %zu binary bytes follow",
                              (long long)binary_size, bin_len - *bin_used);
    } else {
        FERRY_TRY(check_data_shape(data, b, t, shape->len == 2));
    }
    FERRY_TRY(alloc_rows(r, (int)b, total));
    for (int i = 0; i < (int)b; i++) {
        r->row_off[i] = i * (int)t;
        r->row_len[i] = (int)t;
    }
    if (binary_size >= 0) {
        const uint8_t *p = bin + *bin_used;
        for (size_t k = 0; k < total; k++) {
            uint64_t u = 0;
            for (int j = 7; j >= 0; j--) u = (u << 8) | p[k * 8 + (size_t)j]; /* little-endian */
            FERRY_TRY(check_id((int64_t)u, k));
            r->ids[k] = (int32_t)u;
        }
        *bin_used += total * 8;
        return FERRY_OK;
    }
    return copy_data(data, b, t, r->ids);
}

/* ---- text_input ------------------------------------------------------------------ */

/* The text_input tensor of an infer request: BYTES [B] or [B, 1], one prompt
 * per element, as JSON strings (flat, or one list per row) or as binary
 * data (each element a 4-byte little-endian length, then its bytes). */
static ferry_status parse_text_input(const json_value *in, const uint8_t *bin, size_t bin_len, size_t *bin_used,
                                     kserve_request *r)
{
    const json_value *datatype = json_get(in, "datatype"), *shape = json_get(in, "shape"), *data = json_get(in, "data"),
                     *params = json_get(in, "parameters");
    if (data && data->type == JSON_NULL) data = NULL;
    for (size_t i = 0; i < in->len; i++) {
        const char *k = in->members[i].key;
        if (strcmp(k, "name") && strcmp(k, "datatype") && strcmp(k, "shape") && strcmp(k, "data") && strcmp(k, "parameters"))
            return ferry_fail(FERRY_ERR_INVALID, "text_input: unknown field '%s'", k);
    }
    if (!datatype || datatype->type != JSON_STRING || strcmp(datatype->str, "BYTES") != 0)
        return ferry_fail(FERRY_ERR_INVALID, "text_input: datatype must be BYTES");
    if (!shape || shape->type != JSON_ARRAY || shape->len < 1 || shape->len > 2)
        return ferry_fail(FERRY_ERR_INVALID, "text_input: shape must be [B] or [B, 1]");
    for (size_t i = 0; i < shape->len; i++)
        if (!is_int(&shape->items[i]) || shape->items[i].integer < 0)
            return ferry_fail(FERRY_ERR_INVALID, "text_input: shape must hold non-negative integers");
    int64_t b = shape->items[0].integer;
    if (shape->len == 2 && shape->items[1].integer != 1)
        return ferry_fail(FERRY_ERR_INVALID, "text_input: shape must be [B] or [B, 1] (one prompt per row)");
    if (b == 0) return ferry_fail(FERRY_ERR_INVALID, "text_input is empty (shape has a 0)");
    if (b > KSERVE_MAX_ROWS)
        return ferry_fail(FERRY_ERR_INVALID, "text_input: %lld prompts in one request (at most %d)", (long long)b,
                          KSERVE_MAX_ROWS);
    int64_t binary_size = -1;
    if (params && params->type != JSON_NULL) {
        if (params->type != JSON_OBJECT) return ferry_fail(FERRY_ERR_INVALID, "text_input: parameters must be an object");
        for (size_t i = 0; i < params->len; i++) {
            const json_value *v = &params->members[i].value;
            if (strcmp(params->members[i].key, "binary_data_size") != 0)
                return ferry_fail(FERRY_ERR_INVALID, "text_input: unknown parameter '%s'", params->members[i].key);
            if (v->type == JSON_NULL) continue;
            if (!is_int(v) || v->integer < 0)
                return ferry_fail(FERRY_ERR_INVALID, "text_input: binary_data_size must be an integer >= 0");
            binary_size = v->integer;
        }
    }
    /* every element found (and checked) before the text is copied */
    kserve_bytes *el = malloc((size_t)b * sizeof *el);
    if (!el) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    ferry_status st = FERRY_OK;
    if (binary_size >= 0) {
        if (data) st = ferry_fail(FERRY_ERR_INVALID, "text_input: both data and binary_data_size are given");
        else if ((uint64_t)binary_size > bin_len - *bin_used)
            st = ferry_fail(FERRY_ERR_INVALID, "text_input: binary_data_size is %lld but only %zu binary bytes follow",
                            (long long)binary_size, bin_len - *bin_used);
        else st = kserve_bytes_split(bin + *bin_used, (size_t)binary_size, b, "binary data (binary_data_size)", el);
    } else if (!data || data->type != JSON_ARRAY) {
        st = ferry_fail(FERRY_ERR_INVALID, "text_input: data must be a list of strings");
    } else if ((int64_t)data->len != b) {
        st = ferry_fail(FERRY_ERR_INVALID, "text_input: shape says %lld prompts, data holds %zu", (long long)b, data->len);
    } else {
        for (size_t i = 0; i < data->len && st == FERRY_OK; i++) {
            const json_value *v = &data->items[i];
            if (v->type == JSON_ARRAY && v->len == 1) v = &v->items[0]; /* [B, 1] written nested */
            if (v->type != JSON_STRING) st = ferry_fail(FERRY_ERR_INVALID, "text_input: data[%zu] is not a string", i);
            else el[i] = (kserve_bytes){v->str, v->len};
        }
    }
    if (st == FERRY_OK) st = kserve_set_texts(r, b, el);
    if (st == FERRY_OK && binary_size >= 0) *bin_used += (size_t)binary_size;
    free(el);
    return st;
}

ferry_status kserve_bytes_split(const uint8_t *raw, size_t len, int64_t b, const char *what, kserve_bytes *el)
{
    size_t at = 0;
    for (int64_t i = 0; i < b; i++) {
        if (len - at < 4)
            return ferry_fail(FERRY_ERR_INVALID, "text_input: %s ends inside element %lld's length", what, (long long)i);
        size_t n = (size_t)raw[at] | (size_t)raw[at + 1] << 8 | (size_t)raw[at + 2] << 16 | (size_t)raw[at + 3] << 24;
        at += 4;
        if (len - at < n)
            return ferry_fail(FERRY_ERR_INVALID, "text_input: element %lld says %zu bytes, %zu are left", (long long)i, n,
                              len - at);
        el[i] = (kserve_bytes){(const char *)raw + at, n};
        at += n;
    }
    if (at != len)
        return ferry_fail(FERRY_ERR_INVALID, "text_input: %s holds %zu bytes, its %lld elements take %zu", what, len,
                          (long long)b, at);
    return FERRY_OK;
}

ferry_status kserve_set_texts(kserve_request *r, int64_t b, const kserve_bytes *el)
{
    size_t total = 0;
    for (int64_t i = 0; i < b; i++) total += el[i].len;
    r->n_texts = (int)b;
    if (!(r->text_input = malloc(total + 1)) || !(r->text_off = malloc((size_t)(b + 1) * sizeof *r->text_off)))
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    size_t at = 0;
    for (int64_t i = 0; i < b; i++) {
        r->text_off[i] = at;
        if (el[i].len) memcpy(r->text_input + at, el[i].p, el[i].len);
        at += el[i].len;
    }
    r->text_off[b] = at;
    r->text_input[at] = '\0';
    r->text_len = at;
    r->text_out = true;
    return FERRY_OK;
}

/* ---- infer ---------------------------------------------------------------------- */

/* The request's optional "id", echoed in the response. */
static ferry_status parse_id(const json_value *v, kserve_request *r)
{
    if (v->type == JSON_NULL) return FERRY_OK;
    if (v->type != JSON_STRING) return ferry_fail(FERRY_ERR_INVALID, "id must be a string");
    if (v->len > KSERVE_MAX_ID)
        return ferry_fail(FERRY_ERR_INVALID, "id is %zu bytes (at most %d)", v->len, KSERVE_MAX_ID);
    free(r->id);
    if (!(r->id = strdup(v->str))) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    return FERRY_OK;
}

static ferry_status parse_outputs(const json_value *outs, bool binary_default, kserve_request *r)
{
    if (outs->type != JSON_ARRAY) return ferry_fail(FERRY_ERR_INVALID, "outputs must be an array");
    for (size_t i = 0; i < outs->len; i++) {
        const json_value *o = &outs->items[i];
        if (o->type != JSON_OBJECT) return ferry_fail(FERRY_ERR_INVALID, "outputs[%zu] must be an object", i);
        bool bad = false;
        const char *name = json_get_str(o, "name", &bad);
        if (!name) return ferry_fail(FERRY_ERR_INVALID, "outputs[%zu]: name %s", i, bad ? "must be a string" : "is missing");
        int which;
        if (!strcmp(name, "output_ids")) which = KSERVE_OUT_IDS;
        else if (!strcmp(name, "logits")) which = KSERVE_OUT_LOGITS;
        else if (!strcmp(name, "text_output")) which = KSERVE_OUT_TEXT;
        else
            return ferry_fail(FERRY_ERR_INVALID, "unknown output '%s' (the model has output_ids, logits and text_output)",
                              name);
        bool binary = binary_default;
        for (size_t k = 0; k < o->len; k++) {
            const char *key = o->members[k].key;
            const json_value *v = &o->members[k].value;
            if (!strcmp(key, "name")) continue;
            if (strcmp(key, "parameters") != 0)
                return ferry_fail(FERRY_ERR_INVALID, "outputs[%zu]: unknown field '%s'", i, key);
            if (v->type == JSON_NULL) continue;
            if (v->type != JSON_OBJECT) return ferry_fail(FERRY_ERR_INVALID, "outputs[%zu]: parameters must be an object", i);
            for (size_t j = 0; j < v->len; j++) {
                const json_value *pv = &v->members[j].value;
                if (strcmp(v->members[j].key, "binary_data") != 0)
                    return ferry_fail(FERRY_ERR_INVALID, "outputs[%zu]: unsupported parameter '%s'", i,
                                      v->members[j].key);
                if (pv->type == JSON_NULL) continue;
                if (pv->type != JSON_BOOL)
                    return ferry_fail(FERRY_ERR_INVALID, "outputs[%zu]: binary_data must be true or false", i);
                binary = pv->boolean;
            }
        }
        int slot = -1;
        for (int k = 0; k < r->n_outputs; k++)
            if (r->outputs[k] == which) slot = k; /* named twice: the last settings win */
        if (slot < 0) slot = r->n_outputs++;
        r->outputs[slot] = which;
        r->binary[slot] = binary;
        if (which == KSERVE_OUT_LOGITS) r->want_logits = true;
        if (which == KSERVE_OUT_TEXT) r->text_out = true;
    }
    return FERRY_OK;
}

/* Whether an outputs list names text_output (stop strings need text). */
static bool asks_text(const json_value *outs)
{
    for (size_t i = 0; outs && outs->type == JSON_ARRAY && i < outs->len; i++) {
        bool bad = false;
        const char *name = outs->items[i].type == JSON_OBJECT ? json_get_str(&outs->items[i], "name", &bad) : NULL;
        if (name && !strcmp(name, "text_output")) return true;
    }
    return false;
}

static ferry_status parse_infer(const json_value *root, const uint8_t *bin, size_t bin_len, kserve_request *r)
{
    if (root->type != JSON_OBJECT) return ferry_fail(FERRY_ERR_INVALID, "the request must be a JSON object");
    const json_value *inputs = NULL, *outputs = NULL, *params = NULL;
    for (size_t i = 0; i < root->len; i++) {
        const char *k = root->members[i].key;
        const json_value *v = &root->members[i].value;
        if (!strcmp(k, "inputs")) inputs = v;
        else if (!strcmp(k, "outputs")) outputs = v->type == JSON_NULL ? NULL : v;
        else if (!strcmp(k, "parameters")) params = v;
        else if (!strcmp(k, "id")) FERRY_TRY(parse_id(v, r));
        else {
            return ferry_fail(FERRY_ERR_INVALID, "unknown field '%s' (a request has id, parameters, inputs, outputs)", k);
        }
    }
    if (!inputs || inputs->type != JSON_ARRAY) return ferry_fail(FERRY_ERR_INVALID, "inputs must be an array");
    size_t bin_used = 0;
    const char *seen = NULL;
    for (size_t i = 0; i < inputs->len; i++) {
        const json_value *in = &inputs->items[i];
        if (in->type != JSON_OBJECT) return ferry_fail(FERRY_ERR_INVALID, "inputs[%zu] must be an object", i);
        bool bad = false;
        const char *name = json_get_str(in, "name", &bad);
        if (!name) return ferry_fail(FERRY_ERR_INVALID, "inputs[%zu]: name %s", i, bad ? "must be a string" : "is missing");
        bool text = !strcmp(name, "text_input");
        if (!text && strcmp(name, "input_ids") != 0)
            return ferry_fail(FERRY_ERR_INVALID, "unknown input '%s' (the model takes input_ids or text_input)", name);
        if (seen && !strcmp(seen, name)) return ferry_fail(FERRY_ERR_INVALID, "%s is given twice", name);
        if (seen) return ferry_fail(FERRY_ERR_INVALID, "give input_ids or text_input, not both");
        seen = text ? "text_input" : "input_ids";
        FERRY_TRY(text ? parse_text_input(in, bin, bin_len, &bin_used, r) : parse_input(in, bin, bin_len, &bin_used, r));
    }
    if (!seen) return ferry_fail(FERRY_ERR_INVALID, "input_ids is missing from inputs (or give text_input)");
    if (bin_used != bin_len)
        return ferry_fail(FERRY_ERR_INVALID, "%zu bytes of binary data follow the JSON, the inputs take %zu", bin_len,
                          bin_used);
    bool binary_output = false;
    FERRY_TRY(parse_params(params, true, r->text_input || asks_text(outputs), r, &binary_output));
    if (outputs) FERRY_TRY(parse_outputs(outputs, binary_output, r));
    if (r->n_outputs == 0) { /* no `outputs`, or an empty list: output_ids, or text_output for text */
        r->n_outputs = 1;
        r->outputs[0] = r->text_input ? KSERVE_OUT_TEXT : KSERVE_OUT_IDS;
        r->binary[0] = binary_output;
        r->text_out = r->text_input != NULL;
    }
    return FERRY_OK;
}

/* Every row against the engine's limits, before any is submitted. */
static ferry_status check_rows(const kserve_request *r, const engine_limits *lim)
{
    char what[48];
    for (int i = 0; i < r->n_rows; i++) {
        if (r->text_input && r->n_rows == 1) snprintf(what, sizeof what, "text_input");
        else if (r->text_input) snprintf(what, sizeof what, "text_input[%d]", i);
        else if (r->n_rows == 1 && !r->nested) snprintf(what, sizeof what, "input_ids");
        else snprintf(what, sizeof what, "input_ids[%d]", i);
        gen_request g = kserve_row_request(r, i);
        FERRY_TRY(request_check(&g, lim, what, NULL));
    }
    return FERRY_OK;
}

ferry_status kserve_parse_infer(const char *body, size_t len, int64_t json_len, const engine_limits *lim,
                                kserve_request *out)
{
    kserve_request_defaults(out);
    if (json_len > (int64_t)len)
        return ferry_fail(FERRY_ERR_INVALID, "Inference-Header-Content-Length %lld exceeds the body (%zu bytes)",
                          (long long)json_len, len);
    size_t jlen = json_len >= 0 ? (size_t)json_len : len;
    json_doc *doc;
    ferry_status pst = json_parse_limited(body, jlen, kserve_parse_bound(jlen), &doc);
    if (pst != FERRY_OK) return pst == FERRY_ERR_INVALID ? ferry_fail_context(pst, "malformed JSON") : pst;
    ferry_status st = parse_infer(json_doc_root(doc), (const uint8_t *)body + jlen, len - jlen, out);
    json_doc_free(doc);
    if (st == FERRY_OK && !out->text_out) st = check_rows(out, lim);
    if (st != FERRY_OK) kserve_request_free(out);
    return st;
}

/* ---- generate ------------------------------------------------------------------- */

static ferry_status parse_prompt(const json_value *v, int row, kserve_request *r, size_t *at)
{
    if (v->len == 0) return ferry_fail(FERRY_ERR_INVALID, "input_ids[%d] is empty", row);
    r->row_off[row] = (int)*at;
    r->row_len[row] = (int)v->len;
    for (size_t k = 0; k < v->len; k++) {
        const json_value *t = &v->items[k];
        if (!is_int(t)) {
            if (r->nested) return ferry_fail(FERRY_ERR_INVALID, "input_ids[%d][%zu] is not an integer", row, k);
            return ferry_fail(FERRY_ERR_INVALID, "input_ids[%zu] is not an integer", k);
        }
        if (t->integer < 0 || t->integer > INT32_MAX) {
            if (r->nested)
                return ferry_fail(FERRY_ERR_INVALID, "input_ids[%d][%zu] = %lld is outside every vocabulary", row, k,
                                  (long long)t->integer);
            return ferry_fail(FERRY_ERR_INVALID, "input_ids[%zu] = %lld is outside every vocabulary", k,
                              (long long)t->integer);
        }
        r->ids[(*at)++] = (int32_t)t->integer;
    }
    return FERRY_OK;
}

static ferry_status parse_generate(const json_value *root, kserve_request *r)
{
    if (root->type != JSON_OBJECT) return ferry_fail(FERRY_ERR_INVALID, "the request must be a JSON object");
    const json_value *ids = NULL, *params = NULL, *text = NULL;
    for (size_t i = 0; i < root->len; i++) {
        const char *k = root->members[i].key;
        const json_value *v = &root->members[i].value;
        if (!strcmp(k, "input_ids")) ids = v;
        else if (!strcmp(k, "text_input")) text = v;
        else if (!strcmp(k, "parameters")) params = v;
        else if (!strcmp(k, "id")) FERRY_TRY(parse_id(v, r));
        else {
            return ferry_fail(FERRY_ERR_INVALID,
                              "unknown field '%s' (a generate request has input_ids or text_input, and parameters; "
                              "generation parameters go inside \"parameters\")",
                              k);
        }
    }
    bool unused = false;
    FERRY_TRY(parse_params(params, false, text != NULL, r, &unused));
    if (text) {
        if (ids) return ferry_fail(FERRY_ERR_INVALID, "give input_ids or text_input, not both");
        if (text->type != JSON_STRING) return ferry_fail(FERRY_ERR_INVALID, "text_input must be a string");
        if (!(r->text_input = malloc(text->len + 1)) || !(r->text_off = malloc(2 * sizeof *r->text_off)))
            return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        memcpy(r->text_input, text->str, text->len + 1);
        r->text_len = text->len;
        r->n_texts = 1;
        r->text_off[0] = 0, r->text_off[1] = text->len;
        r->text_out = true;
        return FERRY_OK;
    }
    if (!ids) return ferry_fail(FERRY_ERR_INVALID, "input_ids is missing (or give the prompt as text_input)");
    if (ids->type != JSON_ARRAY) return ferry_fail(FERRY_ERR_INVALID, "input_ids must be an array of token ids");
    if (ids->len == 0) return ferry_fail(FERRY_ERR_INVALID, "input_ids is empty");
    r->nested = ids->items[0].type == JSON_ARRAY;
    size_t total = 0;
    int rows = 1;
    if (r->nested) {
        if (ids->len > KSERVE_MAX_ROWS)
            return ferry_fail(FERRY_ERR_INVALID, "input_ids: %zu prompts in one request (at most %d)", ids->len,
                              KSERVE_MAX_ROWS);
        for (size_t i = 0; i < ids->len; i++) {
            if (ids->items[i].type != JSON_ARRAY)
                return ferry_fail(FERRY_ERR_INVALID, "input_ids[%zu] must be a list of token ids like input_ids[0]", i);
            total += ids->items[i].len;
        }
        rows = (int)ids->len;
    } else {
        total = ids->len;
    }
    if (total > MAX_TOKENS) return ferry_fail(FERRY_ERR_INVALID, "input_ids: too many tokens (%zu)", total);
    FERRY_TRY(alloc_rows(r, rows, total));
    size_t at = 0;
    if (!r->nested) return parse_prompt(ids, 0, r, &at);
    for (int i = 0; i < rows; i++) FERRY_TRY(parse_prompt(&ids->items[i], i, r, &at));
    return FERRY_OK;
}

ferry_status kserve_parse_generate(const char *body, size_t len, const engine_limits *lim, kserve_request *out)
{
    kserve_request_defaults(out);
    json_doc *doc;
    ferry_status pst = json_parse_limited(body, len, kserve_parse_bound(len), &doc);
    if (pst != FERRY_OK) return pst == FERRY_ERR_INVALID ? ferry_fail_context(pst, "malformed JSON") : pst;
    ferry_status st = parse_generate(json_doc_root(doc), out);
    json_doc_free(doc);
    if (st == FERRY_OK && !out->text_out) st = check_rows(out, lim);
    if (st != FERRY_OK) kserve_request_free(out);
    return st;
}

uint64_t kserve_encode_bound(const kserve_request *r, const text_model *tm)
{
    size_t size = 0;
    for (int i = 0; r->text_input && i < r->n_texts; i++) {
        size_t len = r->text_off[i + 1] - r->text_off[i];
        if (len > text_max_bytes(tm)) break; /* refused there (--max-text-bytes), before anything past it */
        size_t n = text_encode_size(tm, r->text_input + r->text_off[i], len);
        size = size > SIZE_MAX - n ? SIZE_MAX : size + n;
    }
    return text_encode_bound(size);
}

ferry_status kserve_encode_text(kserve_request *r, const text_model *tm, const engine_limits *lim)
{
    if (!r->text_out) return ferry_fail(FERRY_ERR_INTERNAL, "kserve_encode_text: the request is not answered with text");
    const char *field = r->text_input ? "text_input" : "text_output";
    if (text_error(tm)) return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: %s", field, text_error(tm));
    if (r->text_input) {
        int32_t **ids = calloc((size_t)r->n_texts, sizeof *ids);
        int *n = calloc((size_t)r->n_texts, sizeof *n);
        size_t total = 0;
        ferry_status st = ids && n ? FERRY_OK : ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        for (int i = 0; i < r->n_texts && st == FERRY_OK; i++) {
            st = text_encode(tm, r->text_input + r->text_off[i], r->text_off[i + 1] - r->text_off[i], true, &ids[i], &n[i]);
            if (st != FERRY_OK) {
                if (r->n_texts == 1) st = ferry_fail_context(st, "text_input");
                else st = ferry_fail_context(st, "text_input[%d]", i);
            }
            total += (size_t)n[i];
        }
        if (st == FERRY_OK) {
            free(r->ids), free(r->row_off), free(r->row_len);
            r->ids = NULL, r->row_off = r->row_len = NULL;
            st = alloc_rows(r, r->n_texts, total);
        }
        for (int i = 0, at = 0; i < r->n_texts && st == FERRY_OK; at += n[i], i++) {
            memcpy(r->ids + at, ids[i], (size_t)n[i] * sizeof *r->ids);
            r->row_off[i] = at;
            r->row_len[i] = n[i];
        }
        for (int i = 0; ids && i < r->n_texts; i++) free(ids[i]);
        free(ids);
        free(n);
        FERRY_TRY(st);
    }
    FERRY_TRY(text_request_defaults(tm, &r->gen, false));
    return check_rows(r, lim);
}

ferry_status kserve_row_keep(kserve_row *row, const gen_result *res)
{
    if (res->n_tokens > 0) {
        if (!(row->tokens = malloc((size_t)res->n_tokens * sizeof *row->tokens)))
            return ferry_fail(FERRY_ERR_NOMEM, "out of memory for a response");
        memcpy(row->tokens, res->tokens, (size_t)res->n_tokens * sizeof *row->tokens);
        row->n_tokens = res->n_tokens;
    }
    if (res->logits) {
        if (!(row->logits = malloc((size_t)res->vocab * sizeof *row->logits)))
            return ferry_fail(FERRY_ERR_NOMEM, "out of memory for a response");
        memcpy(row->logits, res->logits, (size_t)res->vocab * sizeof *row->logits);
    }
    return FERRY_OK;
}

gen_request kserve_row_request(const kserve_request *r, int row)
{
    gen_request g;
    memset(&g, 0, sizeof g);
    g.prompt = r->ids + r->row_off[row];
    g.prompt_len = r->row_len[row];
    request_set_params(&g, &r->gen);
    g.stream = (uint64_t)row; /* row i draws from stream i, as prompt i of `ferry generate` */
    g.want_logits = r->want_logits;
    return g;
}

/* ---- responses ------------------------------------------------------------------ */

static void put_le(strbuf *sb, uint64_t v, int bytes)
{
    char b[8];
    for (int i = 0; i < bytes; i++) b[i] = (char)(v >> (8 * i));
    sb_append(sb, b, (size_t)bytes);
}

/* {"model_name": ..., "model_version": ..., "id": ... (when the request had one) */
static void put_response_head(strbuf *sb, const kserve_request *r, const char *model)
{
    sb_puts(sb, "{\"model_name\": ");
    sb_json_str(sb, model);
    sb_puts(sb, ", \"model_version\": \"" KSERVE_MODEL_VERSION "\"");
    if (r->id) {
        sb_puts(sb, ", \"id\": ");
        sb_json_str(sb, r->id);
    }
}

enum { W_HEAD, W_OUTPUT, W_ROWS, W_BINARY, W_DONE };

void kserve_infer_writer_init(kserve_infer_writer *w, const kserve_request *r, const char *model,
                              const kserve_row *rows, int vocab)
{
    memset(w, 0, sizeof *w);
    w->r = r;
    w->model = model;
    w->rows = rows;
    w->vocab = vocab;
    for (int i = 0; i < r->n_rows; i++) w->n = rows[i].n_tokens > w->n ? rows[i].n_tokens : w->n;
    for (int o = 0; o < r->n_outputs; o++) w->any_binary |= r->binary[o];
}

/* Row i of output o as JSON values (", "-separated, continuing the list). */
static void put_row_json(kserve_infer_writer *w, strbuf *sb, int o, int i)
{
    const kserve_row *row = &w->rows[i];
    if (w->r->outputs[o] == KSERVE_OUT_TEXT) {
        if (i) sb_puts(sb, ", ");
        sb_json_strn(sb, row->text ? row->text : "", row->text_len);
        return;
    }
    if (w->r->outputs[o] == KSERVE_OUT_IDS) {
        for (int k = 0; k < w->n; k++) sb_printf(sb, "%s%d", i || k ? ", " : "", k < row->n_tokens ? row->tokens[k] : -1);
        return;
    }
    for (int k = 0; k < w->vocab; k++) {
        if (i || k) sb_puts(sb, ", ");
        sb_json_f32(sb, row->logits ? row->logits[k] : NAN);
    }
}

/* Row i of output o as little-endian binary. */
static void put_row_binary(kserve_infer_writer *w, strbuf *sb, int o, int i)
{
    const kserve_row *row = &w->rows[i];
    if (w->r->outputs[o] == KSERVE_OUT_TEXT) { /* BYTES: a 4-byte length, then the bytes */
        put_le(sb, (uint64_t)row->text_len, 4);
        sb_append(sb, row->text ? row->text : "", row->text_len);
        return;
    }
    if (w->r->outputs[o] == KSERVE_OUT_IDS) {
        for (int k = 0; k < w->n; k++) put_le(sb, (uint64_t)(int64_t)(k < row->n_tokens ? row->tokens[k] : -1), 8);
        return;
    }
    for (int k = 0; k < w->vocab; k++) {
        float f = row->logits ? row->logits[k] : NAN;
        uint32_t u;
        memcpy(&u, &f, 4);
        put_le(sb, u, 4);
    }
}

bool kserve_infer_writer_next(kserve_infer_writer *w, strbuf *sb)
{
    const kserve_request *r = w->r;
    int b = r->n_rows;
    switch (w->stage) {
    case W_HEAD:
        put_response_head(sb, r, w->model);
        sb_puts(sb, ", \"outputs\": [");
        w->stage = W_OUTPUT;
        return true;
    case W_OUTPUT: {
        int o = w->o;
        if (o == r->n_outputs) {
            sb_puts(sb, "]}");
            w->stage = W_BINARY;
            w->o = w->i = 0;
            return true;
        }
        bool ids = r->outputs[o] == KSERVE_OUT_IDS, text = r->outputs[o] == KSERVE_OUT_TEXT;
        int cols = ids ? w->n : w->vocab;
        if (text) sb_printf(sb, "%s{\"name\": \"text_output\", \"datatype\": \"BYTES\", \"shape\": [%d]", o ? ", " : "", b);
        else
            sb_printf(sb, "%s{\"name\": \"%s\", \"datatype\": \"%s\", \"shape\": [%d, %d]", o ? ", " : "",
                      ids ? "output_ids" : "logits", ids ? "INT64" : "FP32", b, cols);
        if (r->binary[o]) {
            size_t size = (size_t)b * (size_t)cols * (ids ? 8 : 4);
            if (text) {
                size = 0;
                for (int i = 0; i < b; i++) size += 4 + w->rows[i].text_len;
            }
            sb_printf(sb, ", \"parameters\": {\"binary_data_size\": %zu}}", size);
            w->o++;
        } else if (b == 0) { /* no rows (a text request not yet encoded): nothing to walk */
            sb_puts(sb, ", \"data\": []}");
            w->o++;
        } else {
            sb_puts(sb, ", \"data\": [");
            w->stage = W_ROWS;
            w->i = 0;
        }
        return true;
    }
    case W_ROWS:
        put_row_json(w, sb, w->o, w->i);
        if (++w->i == b) {
            sb_puts(sb, "]}");
            w->o++;
            w->stage = W_OUTPUT;
        }
        return true;
    case W_BINARY:
        while (w->o < r->n_outputs && (!r->binary[w->o] || b == 0)) w->o++;
        if (w->o == r->n_outputs) {
            w->stage = W_DONE;
            return false;
        }
        put_row_binary(w, sb, w->o, w->i);
        if (++w->i == b) {
            w->i = 0;
            w->o++;
        }
        return true;
    }
    return false;
}

bool kserve_infer_writer_in_json(const kserve_infer_writer *w) { return w->stage < W_BINARY; }

size_t kserve_infer_json_len(const kserve_request *r, const char *model, const kserve_row *rows, int vocab)
{
    kserve_infer_writer w;
    kserve_infer_writer_init(&w, r, model, rows, vocab);
    if (!w.any_binary) return 0;
    strbuf piece;
    sb_init(&piece);
    size_t n = 0;
    while (kserve_infer_writer_in_json(&w) && kserve_infer_writer_next(&w, &piece)) {
        n += piece.len;
        piece.len = 0;
    }
    sb_free(&piece);
    return n;
}

void kserve_infer_response(strbuf *sb, const kserve_request *r, const char *model, const kserve_row *rows, int vocab,
                           size_t *json_len)
{
    kserve_infer_writer w;
    kserve_infer_writer_init(&w, r, model, rows, vocab);
    size_t start = sb->len;
    *json_len = 0;
    while (kserve_infer_writer_next(&w, sb))
        if (!kserve_infer_writer_in_json(&w) && w.any_binary && !*json_len) *json_len = sb->len - start;
}

static void put_ids(strbuf *sb, const kserve_row *row)
{
    sb_putc(sb, '[');
    for (int k = 0; k < row->n_tokens; k++) sb_printf(sb, "%s%d", k ? ", " : "", row->tokens[k]);
    sb_putc(sb, ']');
}

void kserve_generate_response(strbuf *sb, const kserve_request *r, const char *model, const kserve_row *rows)
{
    put_response_head(sb, r, model);
    sb_puts(sb, ", \"output_ids\": ");
    if (!r->nested) {
        put_ids(sb, &rows[0]);
    } else {
        sb_putc(sb, '[');
        for (int i = 0; i < r->n_rows; i++) {
            if (i) sb_puts(sb, ", ");
            put_ids(sb, &rows[i]);
        }
        sb_putc(sb, ']');
    }
    sb_puts(sb, "}");
}

static void put_finish(strbuf *sb, text_finish finish)
{
    const char *name = text_finish_name(finish);
    sb_puts(sb, ", \"finish_reason\": ");
    if (name) sb_printf(sb, "\"%s\"", name);
    else sb_puts(sb, "null");
}

void kserve_text_response(strbuf *sb, const kserve_request *r, const char *model, const char *text, size_t len,
                          text_finish finish)
{
    put_response_head(sb, r, model);
    sb_puts(sb, ", \"text_output\": ");
    sb_json_strn(sb, text, len);
    put_finish(sb, finish);
    sb_putc(sb, '}');
}

void kserve_text_event(strbuf *sb, const char *model, const char *text, size_t len, text_finish finish)
{
    sb_puts(sb, "data: {\"model_name\": ");
    sb_json_str(sb, model);
    sb_puts(sb, ", \"model_version\": \"" KSERVE_MODEL_VERSION "\", \"text_output\": ");
    sb_json_strn(sb, text, len);
    if (finish != TEXT_FINISH_NONE) put_finish(sb, finish);
    sb_puts(sb, "}\n\n");
}

void kserve_stream_event(strbuf *sb, const char *model, int32_t token, int index)
{
    sb_puts(sb, "data: {\"model_name\": ");
    sb_json_str(sb, model);
    sb_printf(sb, ", \"model_version\": \"" KSERVE_MODEL_VERSION "\", \"token_id\": %d, \"index\": %d}\n\n", token,
              index);
}

void kserve_stream_error(strbuf *sb, const char *msg)
{
    sb_puts(sb, "data: ");
    kserve_error(sb, msg);
    sb_puts(sb, "\n\n");
}

void kserve_error(strbuf *sb, const char *msg)
{
    sb_puts(sb, "{\"error\": ");
    sb_json_str(sb, msg);
    sb_putc(sb, '}');
}

void kserve_server_metadata(strbuf *sb)
{
    sb_puts(sb, "{\"name\": \"ferry\", \"version\": \"" FERRY_VERSION
                "\", \"extensions\": [\"binary_tensor_data\", \"generate\"]}");
}

void kserve_model_metadata(strbuf *sb, const char *model, int vocab)
{
    sb_puts(sb, "{\"name\": ");
    sb_json_str(sb, model);
    sb_puts(sb, ", \"versions\": [\"" KSERVE_MODEL_VERSION "\"], \"platform\": \"ferry\", "
                "\"inputs\": [{\"name\": \"input_ids\", \"datatype\": \"INT64\", \"shape\": [-1, -1]}], "
                "\"outputs\": [{\"name\": \"output_ids\", \"datatype\": \"INT64\", \"shape\": [-1, -1]}, ");
    sb_printf(sb, "{\"name\": \"logits\", \"datatype\": \"FP32\", \"shape\": [-1, %d]}]}", vocab);
}

void kserve_config_fill(kserve_config *c, const char *model, int vocab, int max_batch)
{
    memset(c, 0, sizeof *c);
    c->name = model;
    c->platform = "ferry";
    c->backend = "ferry";
    c->latest_versions = 1;
    c->max_batch_size = max_batch;
    c->n_inputs = 1;
    c->inputs[0] = (kserve_config_tensor){"input_ids", KSERVE_TYPE_INT64, -1};
    c->n_outputs = 2;
    c->outputs[0] = (kserve_config_tensor){"output_ids", KSERVE_TYPE_INT64, -1};
    c->outputs[1] = (kserve_config_tensor){"logits", KSERVE_TYPE_FP32, vocab};
    c->decoupled = true;
}

const char *kserve_type_name(int data_type)
{
    switch (data_type) {
    case KSERVE_TYPE_INT64: return "TYPE_INT64";
    case KSERVE_TYPE_FP32: return "TYPE_FP32";
    }
    return "TYPE_INVALID";
}

static void put_config_tensors(strbuf *sb, const char *key, const kserve_config_tensor *t, int n)
{
    sb_printf(sb, ", \"%s\": [", key);
    for (int i = 0; i < n; i++) {
        sb_puts(sb, i ? ", {\"name\": " : "{\"name\": ");
        sb_json_str(sb, t[i].name);
        sb_printf(sb, ", \"data_type\": \"%s\", \"dims\": [%lld]}", kserve_type_name(t[i].data_type),
                  (long long)t[i].dim);
    }
    sb_puts(sb, "]");
}

void kserve_model_config(strbuf *sb, const kserve_config *c)
{
    sb_puts(sb, "{\"name\": ");
    sb_json_str(sb, c->name);
    sb_puts(sb, ", \"platform\": ");
    sb_json_str(sb, c->platform);
    sb_puts(sb, ", \"backend\": ");
    sb_json_str(sb, c->backend);
    sb_printf(sb, ", \"version_policy\": {\"latest\": {\"num_versions\": %u}}, \"max_batch_size\": %d",
              c->latest_versions, c->max_batch_size);
    put_config_tensors(sb, "input", c->inputs, c->n_inputs);
    put_config_tensors(sb, "output", c->outputs, c->n_outputs);
    sb_printf(sb, ", \"model_transaction_policy\": {\"decoupled\": %s}}", c->decoupled ? "true" : "false");
}

static kserve_duration duration(uint64_t count, double seconds)
{
    return (kserve_duration){count, (uint64_t)(seconds * 1e9)};
}

void kserve_stats_fill(kserve_stats *k, const sched_stats *s)
{
    memset(k, 0, sizeof *k);
    k->last_inference = (uint64_t)(s->last_done_unix * 1e3);
    k->inference_count = s->requests_done;
    k->execution_count = s->steps;
    k->success = duration(s->requests_done, s->done_s_sum);
    k->fail = duration(s->requests_failed, s->failed_s_sum);
    k->queue = duration(s->requests_done + s->requests_failed + s->requests_cancelled, s->queue_s_sum);
    k->compute_infer = duration(s->steps, s->step_s_sum);
}

/* "name": {"count": n, "ns": total} */
static void put_duration(strbuf *sb, const char *name, kserve_duration d, bool comma)
{
    sb_printf(sb, "%s\"%s\": {\"count\": %llu, \"ns\": %llu}", comma ? ", " : "", name, (unsigned long long)d.count,
              (unsigned long long)d.ns);
}

void kserve_model_stats(strbuf *sb, const char *model, const kserve_stats *k)
{
    sb_puts(sb, "{\"model_stats\": [{\"name\": ");
    sb_json_str(sb, model);
    sb_printf(sb,
              ", \"version\": \"" KSERVE_MODEL_VERSION "\", \"last_inference\": %llu, \"inference_count\": %llu, "
              "\"execution_count\": %llu, \"inference_stats\": {",
              (unsigned long long)k->last_inference, (unsigned long long)k->inference_count,
              (unsigned long long)k->execution_count);
    put_duration(sb, "success", k->success, false);
    put_duration(sb, "fail", k->fail, true);
    put_duration(sb, "queue", k->queue, true);
    put_duration(sb, "compute_input", k->compute_input, true);
    put_duration(sb, "compute_infer", k->compute_infer, true);
    put_duration(sb, "compute_output", k->compute_output, true);
    sb_puts(sb, "}, \"batch_stats\": []}]}");
}

int kserve_http_status(ferry_status st)
{
    switch (st) {
    case FERRY_OK: return 200;
    case FERRY_ERR_INVALID:
    case FERRY_ERR_UNSUPPORTED: return 400;
    case FERRY_ERR_NOT_FOUND: return 404;
    case FERRY_ERR_TOO_LARGE: return 413;
    case FERRY_ERR_BUSY:
    case FERRY_ERR_NOMEM: return 503;
    case FERRY_ERR_IO:
    case FERRY_ERR_INTERNAL: return 500;
    }
    return 500;
}
