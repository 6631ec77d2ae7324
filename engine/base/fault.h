/*
 * fault.h - fault injection for tests, in ferry's own I/O layer and
 * allocators.
 *
 * FERRY_FAULT="KIND=N[,KIND=N...]" makes the Nth event of each named kind
 * (counting from 1, per kind, over the whole process) fail as the kind says.
 * read_short repeats every N events; every other kind fires once, so that
 * what comes after the fault must work again. The real call still runs
 * where there is one (a read, a write, an fsync): the hook alters its
 * result, it does not mock the system. Unset, every check is one load.
 *
 *   read_short    a read of the offload dir comes back short (half its
 *                 length, block-aligned); the rest must be asked for again.
 *                 Reads: io_uring completions (aio.c: the layer pipeline,
 *                 expert fetches) and an export's reads of disk-tier blobs
 *   read_eio      such a read fails with EIO
 *   write_enospc  a write (util_write_all: offload blobs and manifest,
 *                 exports, --dump-logits) fails with ENOSPC
 *   write_eio     the same write fails with EIO
 *   fsync_eio     an fsync (util_fsync: files and directories) fails with EIO
 *   host_alloc    a backend's host allocation (host tier, bounce buffers,
 *                 embedding rows) returns NULL
 *   host_pin      pinning a host allocation fails: the backend falls back to
 *                 pageable memory (cpu-split, cuda; the cpu backend pins
 *                 nothing)
 *   dev_alloc     a backend's device allocation returns NULL (device tier,
 *                 staging slots, KV pool, activations; on cuda also the
 *                 batch tables, grown during a step)
 *   kv_block      taking KV blocks for a sequence finds the pool empty
 *
 * docs/faults.md lists, per fault and component, what ferry does and the
 * test that shows it.
 */
#ifndef FERRY_FAULT_H
#define FERRY_FAULT_H

#include <stdbool.h>

typedef enum {
    FAULT_READ_SHORT,
    FAULT_READ_EIO,
    FAULT_WRITE_ENOSPC,
    FAULT_WRITE_EIO,
    FAULT_FSYNC_EIO,
    FAULT_HOST_ALLOC,
    FAULT_HOST_PIN,
    FAULT_DEV_ALLOC,
    FAULT_KV_BLOCK,
    FAULT_COUNT
} fault_kind;

/* Counts one event of this kind; true when the fault should fire now. */
bool fault_hit(fault_kind kind);

/* Re-reads FERRY_FAULT and resets the counters (tests). */
void fault_reset(void);

#endif
