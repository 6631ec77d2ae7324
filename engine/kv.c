/*
 * kv.c - the paged KV cache: block accounting and the pool's memory. See
 * kv.h.
 *
 * Invariants (kept by kv_reserve and kv_release, checked by the unit
 * tests through kv_free_blocks):
 *   1. every block is either on the free stack or in exactly one table row;
 *   2. a row's first n_held[s] entries are its blocks, the rest -1;
 *   3. n_free + sum(n_held) == n_blocks.
 */
#include "kv.h"

#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "base/fault.h"

struct kv_pool {
    int n_blocks, max_seqs, max_blocks;
    int32_t *free_stack;  /* [n_blocks]: free block ids, the top at n_free - 1 */
    int n_free;
    int32_t *table;       /* [max_seqs, max_blocks] host copy */
    int *n_held;          /* [max_seqs] */
    bool dirty;           /* table changed since the last upload */
    /* memory (kv_pool_alloc_memory) */
    backend *be;
    int n_layers, kv_dim;
    float **k, **v;       /* [n_layers] each [n_blocks, KV_BLOCK_POSITIONS, kv_dim] */
    int32_t *table_dev;   /* [max_seqs, max_blocks] backend memory */
};

ferry_status kv_pool_create(kv_pool **out, int n_blocks, int max_seqs, int max_blocks)
{
    *out = NULL;
    if (n_blocks < 1 || max_seqs < 1 || max_blocks < 1)
        return ferry_fail(FERRY_ERR_INVALID, "KV pool of %d blocks for %d sequences of %d blocks", n_blocks, max_seqs,
                          max_blocks);
    kv_pool *p = calloc(1, sizeof *p);
    if (!p) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    p->n_blocks = n_blocks;
    p->max_seqs = max_seqs;
    p->max_blocks = max_blocks;
    p->free_stack = malloc((size_t)n_blocks * sizeof *p->free_stack);
    p->table = malloc((size_t)max_seqs * (size_t)max_blocks * sizeof *p->table);
    p->n_held = calloc((size_t)max_seqs, sizeof *p->n_held);
    if (!p->free_stack || !p->table || !p->n_held) {
        kv_pool_free(p);
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory for the KV block table");
    }
    /* block 0 on top: a lone sequence gets blocks 0, 1, 2, ... in order */
    for (int i = 0; i < n_blocks; i++) p->free_stack[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    for (size_t i = 0; i < (size_t)max_seqs * (size_t)max_blocks; i++) p->table[i] = -1;
    p->dirty = true;
    *out = p;
    return FERRY_OK;
}

ferry_status kv_pool_alloc_memory(kv_pool *p, backend *be, int n_layers, int kv_dim)
{
    p->be = be;
    p->n_layers = n_layers;
    p->kv_dim = kv_dim;
    p->k = calloc((size_t)n_layers, sizeof *p->k);
    p->v = calloc((size_t)n_layers, sizeof *p->v);
    size_t bytes = (size_t)p->n_blocks * KV_BLOCK_POSITIONS * (size_t)kv_dim * sizeof(float);
    size_t table_bytes = (size_t)p->max_seqs * (size_t)p->max_blocks * sizeof *p->table;
    ferry_status st = FERRY_OK;
    if (!p->k || !p->v) {
        st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        goto out;
    }
    p->table_dev = be->ops->alloc(be, table_bytes);
    for (int l = 0; l < n_layers && p->table_dev; l++) {
        p->k[l] = be->ops->alloc(be, bytes);
        p->v[l] = be->ops->alloc(be, bytes);
        if (!p->k[l] || !p->v[l]) break;
        backend_prefault(be, p->k[l], bytes);
        backend_prefault(be, p->v[l], bytes);
    }
    if (!p->table_dev || !p->k[n_layers - 1] || !p->v[n_layers - 1]) {
        char need[32];
        st = ferry_fail(FERRY_ERR_NOMEM, "KV cache of %s (%d blocks of %d positions) cannot be allocated",
                        util_fmt_bytes(2ull * (uint64_t)n_layers * bytes, need, sizeof need), p->n_blocks,
                        KV_BLOCK_POSITIONS);
        goto out;
    }
    be->ops->sync(be);
    p->dirty = true;
    kv_pool_sync_table(p);
out:
    return st;
}

void kv_pool_free(kv_pool *p)
{
    if (!p) return;
    if (p->be) {
        for (int l = 0; l < p->n_layers; l++) {
            if (p->k && p->k[l]) p->be->ops->release(p->be, p->k[l]);
            if (p->v && p->v[l]) p->be->ops->release(p->be, p->v[l]);
        }
        if (p->table_dev) p->be->ops->release(p->be, p->table_dev);
    }
    free(p->k);
    free(p->v);
    free(p->free_stack);
    free(p->table);
    free(p->n_held);
    free(p);
}

ferry_status kv_reserve(kv_pool *p, int kv_seq, int n_positions)
{
    FERRY_ASSERT(kv_seq >= 0 && kv_seq < p->max_seqs);
    int want = kv_blocks_for(n_positions);
    if (want > p->max_blocks)
        return ferry_fail(FERRY_ERR_INVALID, "%d positions exceed the context of %d positions", n_positions,
                          p->max_blocks * KV_BLOCK_POSITIONS);
    int more = want - p->n_held[kv_seq];
    if (more <= 0) return FERRY_OK;
    /* the kv_block fault (fault.h) shows the pool empty, as when other sequences hold every block */
    int n_free = fault_hit(FAULT_KV_BLOCK) ? 0 : p->n_free;
    if (more > n_free)
        return ferry_fail(FERRY_ERR_BUSY, "the KV cache has %d free blocks, %d more are needed", n_free, more);
    int32_t *row = p->table + (size_t)kv_seq * (size_t)p->max_blocks;
    for (int i = 0; i < more; i++) row[p->n_held[kv_seq]++] = p->free_stack[--p->n_free]; /* invariants 1-3 */
    p->dirty = true;
    return FERRY_OK;
}

void kv_release(kv_pool *p, int kv_seq)
{
    FERRY_ASSERT(kv_seq >= 0 && kv_seq < p->max_seqs);
    int32_t *row = p->table + (size_t)kv_seq * (size_t)p->max_blocks;
    /* the last block back first: a sequence that returns gets the same ones */
    while (p->n_held[kv_seq] > 0) {
        int i = --p->n_held[kv_seq];
        p->free_stack[p->n_free++] = row[i]; /* invariants 1-3 */
        row[i] = -1;
        p->dirty = true;
    }
    FERRY_ASSERT(p->n_free <= p->n_blocks);
}

int kv_capacity(const kv_pool *p, int kv_seq)
{
    FERRY_ASSERT(kv_seq >= 0 && kv_seq < p->max_seqs);
    return p->n_held[kv_seq] * KV_BLOCK_POSITIONS;
}

int kv_free_blocks(const kv_pool *p) { return p->n_free; }

int kv_total_blocks(const kv_pool *p) { return p->n_blocks; }

kv_layer kv_pool_layer(kv_pool *p, int layer)
{
    return (kv_layer){p->k[layer], p->v[layer], p->table_dev, p->max_seqs, p->max_blocks, KV_BLOCK_POSITIONS,
                      p->n_blocks, p->kv_dim};
}

void kv_pool_sync_table(kv_pool *p)
{
    if (!p->dirty || !p->table_dev) return;
    p->be->ops->upload(p->be, p->table_dev, p->table,
                       (size_t)p->max_seqs * (size_t)p->max_blocks * sizeof *p->table);
    p->dirty = false;
}
