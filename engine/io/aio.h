/*
 * aio.h - asynchronous file reads for weight streaming: io_uring, large
 * requests, several in flight.
 *
 * A read is one (fd, offset, buffer, length) the caller wants whole, such as
 * one group's blob into one staging slot. aio splits it into requests of at
 * most AIO_CHUNK bytes and keeps up to `depth` requests in flight across all
 * reads, in submission order. A short completion is resubmitted for the
 * remainder; a completion of 0 bytes before the end is an error (unexpected
 * end of file); a negative result (EIO, ...) fails that read with a message
 * naming the file, and the other reads go on. With O_DIRECT descriptors the
 * buffer, offset and length must be multiples of 4096.
 *
 * One aio is used by one thread. Where io_uring is unavailable (kernel,
 * seccomp) aio_create falls back to synchronous pread and says so once on
 * stderr; behaviour is otherwise the same.
 */
#ifndef FERRY_AIO_H
#define FERRY_AIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/status.h"

#define AIO_CHUNK (4u << 20)

typedef struct aio aio;

typedef struct {
    uint64_t tag;      /* the caller's tag of the read */
    ferry_status st;   /* FERRY_OK, or FERRY_ERR_IO with msg set */
    char msg[FERRY_MSG_MAX]; /* one line naming the file, e.g. "offload/g3.bin: read at 4194304: Input/output error" */
} aio_done;

ferry_status aio_create(unsigned depth, aio **out);
void aio_free(aio *a);

/* Queues a read. `path` names the file in errors (copied). Never blocks on
 * the read itself. */
ferry_status aio_read(aio *a, int fd, const char *path, uint64_t offset, void *buf, size_t len, uint64_t tag);

/* Collects reads that finished (every byte arrived, or failed) into out[0..max),
 * returning how many. With wait, blocks until at least one read finishes,
 * unless none is pending (then returns 0). */
int aio_reap(aio *a, aio_done *out, int max, bool wait);

/* Reads not yet reported by aio_reap. */
unsigned aio_pending(const aio *a);

/* True when reads go through io_uring (false: the pread fallback). */
bool aio_is_uring(const aio *a);

#endif
