/*
 * batch.h - the token rows of one step, and the one way to build them.
 *
 * A step runs any mix of prompt chunks (prefill) and single decode rows of
 * different sequences. batch_seq says which rows belong to which sequence,
 * which KV-cache sequence they use and at which positions; the backend's
 * embed, rope, kv_store, attention and gather_last read it. The scheduler,
 * `ferry bench` and the tests build batches with batch_builder, so the
 * rule "rows in sequence order, positions n_past, n_past + 1, ..." is kept
 * in one place (and checked once more by engine_step).
 */
#ifndef FERRY_BATCH_H
#define FERRY_BATCH_H

#include <stdint.h>

#include "base/status.h"

/* One sequence's share of a step: tokens [first, first + n_tokens) of the
 * batch are at positions n_past .. n_past + n_tokens - 1 of KV-cache
 * sequence kv_seq. */
typedef struct {
    int kv_seq;
    int n_past;
    int n_tokens;
    int first;
} batch_seq;

typedef struct {
    int n_tokens;
    int n_seqs;
    const int32_t *tokens; /* [n_tokens] */
    const int32_t *pos;    /* [n_tokens] position of each token in its sequence */
    const batch_seq *seqs; /* [n_seqs], in token order */
} batch;

typedef struct {
    int max_tokens, max_seqs;
    int32_t *tokens;       /* [max_tokens] */
    int32_t *pos;          /* [max_tokens] */
    batch_seq *seqs;       /* [max_seqs] */
    int n_tokens, n_seqs;
} batch_builder;

ferry_status batch_builder_init(batch_builder *bb, int max_tokens, int max_seqs);
void batch_builder_free(batch_builder *bb);
/* Empties it for the next step. */
void batch_builder_clear(batch_builder *bb);
/* Rows left before max_tokens. */
int batch_builder_room(const batch_builder *bb);
/* Appends tokens[0..n) of KV-cache sequence kv_seq at positions n_past..;
 * returns the index of the new batch sequence. The caller keeps within
 * max_tokens / max_seqs (asserted). */
int batch_builder_add(batch_builder *bb, int kv_seq, int n_past, const int32_t *tokens, int n);
/* The batch as built (points into bb). */
batch batch_builder_get(const batch_builder *bb);

#endif
