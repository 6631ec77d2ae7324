/*
 * test_kv.c - the paged KV cache's accounting (engine/kv.c): blocks taken
 * as sequences grow, given back on release, refusal when the pool is
 * exhausted (nothing taken), no leaks after any mix, and the memory of a
 * pool on the CPU and cpu-split backends (every block addressable through
 * the table the kernels read); the faults of engine/base/fault.h that reach
 * it (kv_block: a reservation finds the pool empty; dev_alloc: its memory
 * cannot be had).
 */
#include <stdlib.h>
#include <string.h>

#include "../../engine/base/fault.h"
#include "../../engine/kv.h"
#include "check.h"

static void set_fault(const char *spec)
{
    if (spec) setenv("FERRY_FAULT", spec, 1);
    else unsetenv("FERRY_FAULT");
    fault_reset();
}

static void test_reserve_release(void)
{
    kv_pool *p;
    CHECK_STATUS(kv_pool_create(&p, 10, 3, 4), FERRY_OK); /* 3 sequences of up to 64 positions */
    CHECK_EQ_INT(kv_total_blocks(p), 10);
    CHECK_EQ_INT(kv_free_blocks(p), 10);
    CHECK_EQ_INT(kv_capacity(p, 0), 0);
    CHECK_STATUS(kv_reserve(p, 0, 1), FERRY_OK);
    CHECK_EQ_INT(kv_capacity(p, 0), KV_BLOCK_POSITIONS);
    CHECK_EQ_INT(kv_free_blocks(p), 9);
    CHECK_STATUS(kv_reserve(p, 0, KV_BLOCK_POSITIONS), FERRY_OK); /* still one block */
    CHECK_EQ_INT(kv_free_blocks(p), 9);
    CHECK_STATUS(kv_reserve(p, 0, KV_BLOCK_POSITIONS + 1), FERRY_OK);
    CHECK_EQ_INT(kv_free_blocks(p), 8);
    CHECK_STATUS(kv_reserve(p, 0, 3), FERRY_OK); /* never shrinks */
    CHECK_EQ_INT(kv_capacity(p, 0), 2 * KV_BLOCK_POSITIONS);
    /* past the context */
    CHECK_STATUS(kv_reserve(p, 1, 4 * KV_BLOCK_POSITIONS + 1), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("context");
    CHECK_EQ_INT(kv_free_blocks(p), 8);
    CHECK_STATUS(kv_reserve(p, 1, 4 * KV_BLOCK_POSITIONS), FERRY_OK);
    CHECK_STATUS(kv_reserve(p, 2, 4 * KV_BLOCK_POSITIONS), FERRY_OK);
    CHECK_EQ_INT(kv_free_blocks(p), 0);
    kv_release(p, 1);
    CHECK_EQ_INT(kv_free_blocks(p), 4);
    CHECK_EQ_INT(kv_capacity(p, 1), 0);
    kv_release(p, 1); /* twice: nothing */
    CHECK_EQ_INT(kv_free_blocks(p), 4);
    kv_release(p, 0);
    kv_release(p, 2);
    CHECK_EQ_INT(kv_free_blocks(p), 10);
    kv_pool_free(p);
}

static void test_exhaustion(void)
{
    kv_pool *p;
    CHECK_STATUS(kv_pool_create(&p, 5, 2, 8), FERRY_OK);
    CHECK_STATUS(kv_reserve(p, 0, 3 * KV_BLOCK_POSITIONS), FERRY_OK);
    /* 3 more blocks asked, 2 free: refused, nothing taken */
    CHECK_STATUS(kv_reserve(p, 1, 3 * KV_BLOCK_POSITIONS), FERRY_ERR_BUSY);
    CHECK_MSG_HAS("2 free blocks");
    CHECK_EQ_INT(kv_free_blocks(p), 2);
    CHECK_EQ_INT(kv_capacity(p, 1), 0);
    CHECK_STATUS(kv_reserve(p, 1, 2 * KV_BLOCK_POSITIONS), FERRY_OK);
    CHECK_EQ_INT(kv_free_blocks(p), 0);
    CHECK_STATUS(kv_reserve(p, 0, 3 * KV_BLOCK_POSITIONS + 1), FERRY_ERR_BUSY);
    CHECK_EQ_INT(kv_capacity(p, 0), 3 * KV_BLOCK_POSITIONS);
    kv_release(p, 1);
    CHECK_STATUS(kv_reserve(p, 0, 3 * KV_BLOCK_POSITIONS + 1), FERRY_OK);
    kv_release(p, 0);
    CHECK_EQ_INT(kv_free_blocks(p), 5);
    kv_pool_free(p);
    kv_pool *none = NULL;
    CHECK_STATUS(kv_pool_create(&none, 0, 1, 1), FERRY_ERR_INVALID);
    kv_pool_free(none);
}

/* Random grow/release over many rounds: the free count always equals the
 * pool less what the sequences hold, and everything comes back. */
static void test_no_leaks(void)
{
    enum { SEQS = 7, BLOCKS = 40, MAXB = 12 };
    kv_pool *p;
    CHECK_STATUS(kv_pool_create(&p, BLOCKS, SEQS, MAXB), FERRY_OK);
    uint64_t rng = 42;
    for (int round = 0; round < 5000; round++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int s = (int)((rng >> 33) % SEQS), n = (int)((rng >> 20) % (MAXB * KV_BLOCK_POSITIONS)) + 1;
        if ((rng >> 60) < 4) kv_release(p, s);
        else {
            ferry_status st = kv_reserve(p, s, n);
            if (st != FERRY_OK && st != FERRY_ERR_BUSY) CHECK_STATUS(st, FERRY_OK);
        }
        int held = 0;
        for (int k = 0; k < SEQS; k++) held += kv_capacity(p, k) / KV_BLOCK_POSITIONS;
        if (held + kv_free_blocks(p) != BLOCKS) {
            CHECK_EQ_INT(held + kv_free_blocks(p), BLOCKS);
            break;
        }
    }
    for (int k = 0; k < SEQS; k++) kv_release(p, k);
    CHECK_EQ_INT(kv_free_blocks(p), BLOCKS);
    kv_pool_free(p);
}

/* The memory on a backend: every block of every layer is distinct and
 * written through the table (a sequence's rows land where kv_row says). */
static void test_memory(const char *device)
{
    backend *be;
    backend_opts bo = {2, NULL, NULL};
    CHECK_STATUS(backend_create(device, &bo, &be), FERRY_OK);
    kv_pool *p;
    int kv_dim = 8, layers = 2;
    CHECK_STATUS(kv_pool_create(&p, 6, 2, 3), FERRY_OK);
    CHECK_STATUS(kv_pool_alloc_memory(p, be, layers, kv_dim), FERRY_OK);
    CHECK_STATUS(kv_reserve(p, 1, 2 * KV_BLOCK_POSITIONS), FERRY_OK);
    CHECK_STATUS(kv_reserve(p, 0, 1), FERRY_OK);
    kv_pool_sync_table(p);
    kv_layer l0 = kv_pool_layer(p, 0), l1 = kv_pool_layer(p, 1);
    CHECK(l0.k != l1.k && l0.k != l0.v);
    CHECK_EQ_INT(l0.block_size, KV_BLOCK_POSITIONS);
    CHECK_EQ_INT(l0.n_blocks, 6);
    CHECK_EQ_INT(l0.max_blocks, 3);
    /* the table the kernels read: sequence 1 has blocks 0, 1 (the pool
     * hands out the lowest first), sequence 0 block 2 */
    int32_t table[6];
    be->ops->download(be, table, l0.table, sizeof table);
    be->ops->sync(be);
    CHECK_EQ_INT(table[3], 0);
    CHECK_EQ_INT(table[4], 1);
    CHECK_EQ_INT(table[5], -1);
    CHECK_EQ_INT(table[0], 2);
    /* the pre-faulted memory reads as zeros */
    float row[8];
    be->ops->download(be, row, l1.v + (size_t)(6 * KV_BLOCK_POSITIONS - 1) * (size_t)kv_dim, sizeof row);
    be->ops->sync(be);
    for (int i = 0; i < kv_dim; i++) CHECK(row[i] == 0.0f);
    kv_release(p, 1);
    kv_release(p, 0);
    CHECK_EQ_INT(kv_free_blocks(p), 6);
    kv_pool_free(p);
    backend_free(be);
}

/* kv_block: the Nth reservation that takes blocks is refused as if the
 * pool were empty, taking nothing; one that takes none is not counted, and
 * the next succeeds. */
static void test_fault_kv_block(void)
{
    kv_pool *p;
    CHECK_STATUS(kv_pool_create(&p, 8, 2, 4), FERRY_OK);
    set_fault("kv_block=2");
    CHECK_STATUS(kv_reserve(p, 0, 1), FERRY_OK);                  /* the first: takes a block */
    CHECK_STATUS(kv_reserve(p, 0, KV_BLOCK_POSITIONS), FERRY_OK); /* takes none: not counted */
    CHECK_STATUS(kv_reserve(p, 1, 3 * KV_BLOCK_POSITIONS), FERRY_ERR_BUSY);
    CHECK_MSG_HAS("0 free blocks, 3 more are needed");
    CHECK_EQ_INT(kv_free_blocks(p), 7);
    CHECK_EQ_INT(kv_capacity(p, 1), 0);
    CHECK_STATUS(kv_reserve(p, 1, 3 * KV_BLOCK_POSITIONS), FERRY_OK); /* it fires once */
    CHECK_EQ_INT(kv_free_blocks(p), 4);
    set_fault(NULL);
    kv_release(p, 0);
    kv_release(p, 1);
    CHECK_EQ_INT(kv_free_blocks(p), 8);
    kv_pool_free(p);
}

/* dev_alloc on any of the pool's allocations (the table, then K and V of
 * each layer): a whole-pool error naming its size, and what was had is
 * given back by kv_pool_free. */
static void test_fault_dev_alloc(const char *device)
{
    backend *be;
    backend_opts bo = {2, NULL, NULL};
    CHECK_STATUS(backend_create(device, &bo, &be), FERRY_OK);
    for (int n = 1; n <= 5; n++) { /* 1 table + 2 layers x (K, V) */
        char spec[32];
        snprintf(spec, sizeof spec, "dev_alloc=%d", n);
        set_fault(spec);
        kv_pool *p;
        CHECK_STATUS(kv_pool_create(&p, 6, 2, 3), FERRY_OK);
        CHECK_STATUS(kv_pool_alloc_memory(p, be, 2, 8), FERRY_ERR_NOMEM);
        CHECK_MSG_HAS("KV cache of 12.00 KiB (6 blocks of 16 positions) cannot be allocated");
        kv_pool_free(p);
    }
    set_fault(NULL);
    backend_free(be);
}

int main(void)
{
    test_reserve_release();
    test_exhaustion();
    test_no_leaks();
    test_memory("cpu");
    test_memory("cpu-split");
    test_fault_kv_block();
    test_fault_dev_alloc("cpu");
    test_fault_dev_alloc("cpu-split");
    return check_report();
}
