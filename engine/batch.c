/*
 * batch.c - building a step's batch. See batch.h.
 */
#include "batch.h"

#include <stdlib.h>
#include <string.h>

ferry_status batch_builder_init(batch_builder *bb, int max_tokens, int max_seqs)
{
    memset(bb, 0, sizeof *bb);
    bb->max_tokens = max_tokens;
    bb->max_seqs = max_seqs;
    bb->tokens = malloc((size_t)max_tokens * sizeof *bb->tokens);
    bb->pos = malloc((size_t)max_tokens * sizeof *bb->pos);
    bb->seqs = malloc((size_t)max_seqs * sizeof *bb->seqs);
    if (!bb->tokens || !bb->pos || !bb->seqs) {
        batch_builder_free(bb);
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory for a batch of %d tokens", max_tokens);
    }
    return FERRY_OK;
}

void batch_builder_free(batch_builder *bb)
{
    free(bb->tokens);
    free(bb->pos);
    free(bb->seqs);
    memset(bb, 0, sizeof *bb);
}

void batch_builder_clear(batch_builder *bb) { bb->n_tokens = bb->n_seqs = 0; }

int batch_builder_room(const batch_builder *bb) { return bb->max_tokens - bb->n_tokens; }

int batch_builder_add(batch_builder *bb, int kv_seq, int n_past, const int32_t *tokens, int n)
{
    FERRY_ASSERT(n >= 1 && n <= batch_builder_room(bb) && bb->n_seqs < bb->max_seqs);
    bb->seqs[bb->n_seqs] = (batch_seq){.kv_seq = kv_seq, .n_past = n_past, .n_tokens = n, .first = bb->n_tokens};
    for (int i = 0; i < n; i++) {
        bb->tokens[bb->n_tokens + i] = tokens[i];
        bb->pos[bb->n_tokens + i] = n_past + i;
    }
    bb->n_tokens += n;
    return bb->n_seqs++;
}

batch batch_builder_get(const batch_builder *bb)
{
    return (batch){bb->n_tokens, bb->n_seqs, bb->tokens, bb->pos, bb->seqs};
}
