/*
 * fault.h - fault injection for tests, in ferry's own I/O layer.
 *
 * FERRY_FAULT="read_short=N,read_eio=N,write_enospc=N" (any subset) makes
 * the I/O layer pretend that the Nth read completion (counting from 1) came
 * back short (half its length; the remainder must be resubmitted), that the
 * Nth read completion failed with EIO, or that the Nth write failed with
 * ENOSPC. read_short repeats every N completions; read_eio and write_enospc
 * fire once. The real system calls still run: this is a hook on their
 * results, not a mock of liburing. Unset, every check is one load.
 */
#ifndef FERRY_FAULT_H
#define FERRY_FAULT_H

#include <stdbool.h>

typedef enum { FAULT_READ_SHORT, FAULT_READ_EIO, FAULT_WRITE_ENOSPC, FAULT_COUNT } fault_kind;

/* Counts one event of this kind; true when the fault should fire now. */
bool fault_hit(fault_kind kind);

/* Re-reads FERRY_FAULT and resets the counters (tests). */
void fault_reset(void);

#endif
