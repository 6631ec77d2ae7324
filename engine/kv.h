/*
 * kv.h - the KV cache as one pool of fixed-size blocks (paged), and the
 * block table of every KV sequence.
 *
 * A block holds KV_BLOCK_POSITIONS consecutive positions of one KV
 * sequence, for every layer, K and V. The pool's blocks are allocated once
 * (kv_pool_alloc_memory, from the backend, every page touched at startup so
 * that no step faults pages in) and handed out to sequences as they grow
 * (kv_reserve); kv_release gives a sequence's blocks back. A sequence's
 * table row lists its blocks in position order: position p lives in block
 * table[kv_seq][p / KV_BLOCK_POSITIONS], row p % KV_BLOCK_POSITIONS. The
 * kernels read K/V through that table (backend.h kv_layer), so the blocks
 * of a sequence need not be contiguous.
 *
 * Block size 16: a sequence wastes fewer than 16 positions (the tail of its
 * last block), so short sequences commit almost nothing beyond what they
 * use; a table row of a 4096-position context is 256 entries (1 KiB), small
 * enough to upload every step; and 16 rows of a layer's K (16 x kv_dim f32,
 * 16 KiB at kv_dim 256) are one contiguous run, so attention still reads
 * long sequential stretches.
 *
 * The accounting (which block belongs to whom) is host state of the engine
 * thread; the memory is backend memory.
 */
#ifndef FERRY_KV_H
#define FERRY_KV_H

#include <stdint.h>

#include "backend.h"
#include "base/status.h"

#define KV_BLOCK_POSITIONS 16

typedef struct kv_pool kv_pool;

/* Blocks needed for n positions. */
static inline int kv_blocks_for(int64_t n_positions)
{
    return (int)((n_positions + KV_BLOCK_POSITIONS - 1) / KV_BLOCK_POSITIONS);
}

/* n_blocks blocks shared by max_seqs KV sequences of at most max_blocks
 * blocks each (the context). No memory yet. */
ferry_status kv_pool_create(kv_pool **out, int n_blocks, int max_seqs, int max_blocks);
/* Allocates the memory of every layer from be, [n_blocks, KV_BLOCK_POSITIONS,
 * kv_dim] f32 for K and for V, and the table in backend memory, and
 * touches every page. */
ferry_status kv_pool_alloc_memory(kv_pool *p, backend *be, int n_layers, int kv_dim);
void kv_pool_free(kv_pool *p);

/* Makes room for n_positions positions of kv_seq (positions 0 ..
 * n_positions - 1), taking blocks from the pool as needed. FERRY_ERR_BUSY
 * (and nothing taken) when too few blocks are free; FERRY_ERR_INVALID past
 * the context. */
ferry_status kv_reserve(kv_pool *p, int kv_seq, int n_positions);
/* Returns every block of kv_seq to the pool. */
void kv_release(kv_pool *p, int kv_seq);

/* Positions kv_seq has room for. */
int kv_capacity(const kv_pool *p, int kv_seq);
int kv_free_blocks(const kv_pool *p);
int kv_total_blocks(const kv_pool *p);

/* The view of layer l for the kernels, the table uploaded when it changed
 * since the last call (between steps, the backend quiet). */
kv_layer kv_pool_layer(kv_pool *p, int layer);
void kv_pool_sync_table(kv_pool *p);

#endif
