/*
 * fuzz_grpc.c - libFuzzer target for the gRPC front end's message layer
 * (server/grpc/grpc_messages.h): the input is the bytes of a
 * ModelInferRequest as a client would send them.
 *
 * A refused message must leave nothing allocated in the request and a
 * message for the status details. An accepted one must keep the parser's
 * promises: 1..1024 rows of equal length that tile the id array in order,
 * every id (and stop id) inside the vocabulary, every prompt and its new
 * tokens inside the context, outputs valid. The response writer is then
 * run on the request with made-up results, and its bytes must decode as a
 * ModelInferResponse with one raw_output_contents per output of the
 * declared shape; the stream responses must decode as well. A broken promise
 * aborts, which libFuzzer reports as a crash. Build: README.md.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../server/grpc/grpc_messages.h"
#include "grpc_service.pb-c.h"

#define VOCAB 256
#define MAX_CTX (1 << 20)

static const engine_limits g_limits = {.vocab = VOCAB, .max_ctx = MAX_CTX, .max_seqs = 64, .max_step_tokens = 512};

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "fuzz_grpc: %s:%d: promise broken: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

static void check_accepted(const kserve_request *r)
{
    CHECK(r->n_rows >= 1 && r->n_rows <= KSERVE_MAX_ROWS);
    int off = 0;
    for (int i = 0; i < r->n_rows; i++) {
        CHECK(r->row_off[i] == off && r->row_len[i] == r->row_len[0] && r->row_len[i] >= 1);
        CHECK(r->row_len[i] + r->gen.max_new_tokens <= MAX_CTX);
        for (int k = 0; k < r->row_len[i]; k++) CHECK(r->ids[off + k] >= 0 && r->ids[off + k] < VOCAB);
        off += r->row_len[i];
    }
    for (int k = 0; k < r->gen.n_stop; k++) CHECK(r->gen.stop_ids[k] >= 0);
    CHECK(r->n_outputs >= 1 && r->n_outputs <= 2);
    for (int o = 0; o < r->n_outputs; o++) CHECK(r->outputs[o] == KSERVE_OUT_IDS || r->outputs[o] == KSERVE_OUT_LOGITS);
}

/* Made-up results (row i has i % 4 tokens), through the writer and back. */
static void check_response(const kserve_request *r)
{
    kserve_row *rows = calloc((size_t)r->n_rows, sizeof *rows);
    static int32_t tokens[4] = {1, 2, 3, 4};
    static float logits[VOCAB];
    CHECK(rows);
    int n = 0;
    for (int i = 0; i < r->n_rows; i++) {
        rows[i].tokens = tokens;
        rows[i].n_tokens = i % 4;
        rows[i].logits = r->want_logits ? logits : NULL;
        if (rows[i].n_tokens > n) n = rows[i].n_tokens;
    }
    uint8_t *body;
    size_t len;
    CHECK(grpc_infer_response(r, "m", rows, VOCAB, &body, &len) == FERRY_OK);
    Inference__ModelInferResponse *m = inference__model_infer_response__unpack(NULL, len, body);
    CHECK(m);
    CHECK((int)m->n_outputs == r->n_outputs && m->n_raw_output_contents == m->n_outputs);
    for (size_t o = 0; o < m->n_outputs; o++) {
        bool ids = !strcmp(m->outputs[o]->name, "output_ids");
        CHECK(m->outputs[o]->n_shape == 2 && m->outputs[o]->shape[0] == r->n_rows);
        CHECK(m->outputs[o]->shape[1] == (ids ? n : VOCAB));
        CHECK(m->raw_output_contents[o].len == (size_t)r->n_rows * (size_t)(ids ? n : VOCAB) * (ids ? 8 : 4));
    }
    CHECK(!strcmp(m->id, r->id ? r->id : ""));
    inference__model_infer_response__free_unpacked(m, NULL);
    free(body);
    free(rows);
}

static void check_stream_responses(const kserve_request *r)
{
    int32_t tok = 7;
    uint8_t *body;
    size_t len;
    for (int final = 0; final < 2; final++) {
        CHECK(grpc_stream_token_response("m", r->id, final ? NULL : &tok, final, &body, &len) == FERRY_OK);
        Inference__ModelStreamInferResponse *s = inference__model_stream_infer_response__unpack(NULL, len, body);
        CHECK(s && s->infer_response && s->infer_response->n_parameters == 1);
        CHECK(s->infer_response->n_raw_output_contents == (final ? 0u : 1u));
        inference__model_stream_infer_response__free_unpacked(s, NULL);
        free(body);
    }
    CHECK(grpc_stream_error_response("bad", "m", r->id, &body, &len) == FERRY_OK);
    Inference__ModelStreamInferResponse *s = inference__model_stream_infer_response__unpack(NULL, len, body);
    CHECK(s && !strcmp(s->error_message, "bad"));
    inference__model_stream_infer_response__free_unpacked(s, NULL);
    free(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kserve_request r;
    char *model = NULL;
    /* a roomy budget, or one that decoding often outgrows: either way the
     * parse gives back all it took */
    req_budget budget;
    req_budget_init(&budget, (size & 1) ? (1u << 24) : 4096 + 4 * (uint64_t)size);
    ferry_status st = grpc_infer_parse(data, size, &g_limits, &budget, &r, &model);
    CHECK(req_budget_used(&budget) == 0);
    CHECK(st != FERRY_ERR_BUSY || !(size & 1) || size > (1u << 21));
    if (st != FERRY_OK) {
        CHECK(r.ids == NULL && r.row_off == NULL && r.row_len == NULL && r.id == NULL);
        CHECK(*ferry_errmsg());
        free(model);
        free(grpc_infer_peek_id(data, size));
        return 0;
    }
    CHECK(model);
    check_accepted(&r);
    check_response(&r);
    check_stream_responses(&r);
    kserve_request_free(&r);
    free(model);
    return 0;
}
