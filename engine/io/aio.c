/*
 * aio.c - see aio.h.
 *
 * Two kinds of state. A *read* (aio_op) is what the caller asked for: one
 * file range into one buffer, reported once by aio_reap. A *chunk* is one
 * request of at most AIO_CHUNK bytes that the kernel works on; there are
 * `depth` chunks, and a chunk's user_data is its index. Reads wait in a
 * FIFO (the submit queue) until every byte of theirs has been handed to a
 * chunk. A chunk is FREE, PREPPED (an SQE in the ring, not yet accepted by
 * io_uring_submit) or in the kernel (KERNEL).
 *
 * Invariants, cited where they are kept:
 *   A1  Only the head of the submit queue can be partly handed out: requests
 *       reach the kernel in submission order, and dropping a failed read's
 *       unsubmitted part is O(1).
 *   A2  Each chunk holds at most one SQE and there are no more chunks than
 *       SQ entries, so io_uring_get_sqe cannot run dry.
 *   A3  A read is reported (moved to the done queue) only when it has failed
 *       or has every byte, *and* none of its chunks is PREPPED or KERNEL:
 *       the kernel may be writing into the caller's buffer until then.
 *   A4  With O_DIRECT every request, resubmissions included, starts on a
 *       AIO_BLOCK boundary: a short read is taken down to a block boundary
 *       and the partial block is read again.
 *   A5  A broken ring never submits again; a read it held is failed, and
 *       reported once its KERNEL chunks drain (A3).
 *
 * Where io_uring_queue_init fails, the same reads are done with pread when
 * the caller reaps them, through the same completion rules and fault hooks.
 */
#define _GNU_SOURCE
#include "aio.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/fault.h"

#define AIO_BLOCK 4096u      /* the O_DIRECT granule every resubmission keeps */
#define AIO_MAX_DEPTH 4096u  /* far beyond what a disk can use; bounds the ring */

typedef struct {
    int fd;
    bool direct;        /* fd has O_DIRECT: resubmissions must stay aligned */
    char *path;         /* for messages */
    uint64_t tag;
    uint64_t offset;    /* of the whole read */
    char *buf;
    size_t len;
    size_t issued;      /* bytes handed to chunks so far */
    size_t arrived;     /* bytes that have arrived */
    unsigned inflight;  /* chunks PREPPED or in the kernel */
    bool failed;
    char msg[sizeof(((aio_done *)0)->msg)];
    int next;           /* link in the submit queue, the done queue or the free list */
} aio_op;

enum { CHUNK_FREE, CHUNK_PREPPED, CHUNK_KERNEL };

typedef struct {
    int state;
    int op;             /* index into aio.ops */
    uint64_t offset;    /* file offset of the bytes still wanted */
    char *buf;          /* where they go */
    size_t remaining;
} aio_chunk;

typedef struct {
    int head, tail; /* -1 when empty */
} op_queue;

struct aio {
    bool uring;
    bool broken;              /* the ring failed; every later read fails */
    char broken_why[96];
    struct io_uring ring;
    unsigned depth;

    aio_chunk *chunks;        /* [depth] */
    int *free_chunks;         /* stack of FREE chunks */
    unsigned n_free;
    int *prepped;             /* ring [depth] of PREPPED chunks, in SQE order */
    unsigned prep_head, prep_count;

    aio_op *ops;              /* grows; referred to by index, never by pointer */
    int ops_cap;
    int free_op;              /* free list through aio_op.next */
    op_queue submit;          /* reads with bytes not yet handed to a chunk */
    op_queue done;            /* finished reads not yet reported */
    unsigned pending;         /* reads accepted and not yet reported */
};

/* ---- queues and bookkeeping ---------------------------------------------- */

static void queue_push(aio *a, op_queue *q, int i)
{
    a->ops[i].next = -1;
    if (q->tail < 0) q->head = i;
    else a->ops[q->tail].next = i;
    q->tail = i;
}

static int queue_pop(aio *a, op_queue *q)
{
    int i = q->head;
    if (i >= 0) {
        q->head = a->ops[i].next;
        if (q->head < 0) q->tail = -1;
    }
    return i;
}

static void op_fail(aio_op *op, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Records the first failure of a read; later ones add nothing useful. */
static void op_fail(aio_op *op, const char *fmt, ...)
{
    if (op->failed) return;
    op->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(op->msg, sizeof op->msg, fmt, ap);
    va_end(ap);
}

/* Moves read i to the done queue once nothing of it is left to arrive. A
 * failed read leaves the submit queue here (it can only be at its head), so
 * its chunks not yet handed out are never submitted. */
static void op_settle(aio *a, int i)
{
    aio_op *op = &a->ops[i];
    if (op->failed && a->submit.head == i) queue_pop(a, &a->submit); /* A1: only the head is partly out */
    if (op->inflight > 0) return;                                   /* A3 */
    if (!op->failed && op->arrived < op->len) return;
    queue_push(a, &a->done, i);
}

static void chunk_release(aio *a, int c)
{
    a->chunks[c].state = CHUNK_FREE;
    a->free_chunks[a->n_free++] = c;
}

/* Applies the fault hooks to one completion of a request for `remaining`
 * bytes at file offset `off`, then the completion rules. Returns the bytes
 * to accept (> 0), or 0 after failing the read. */
static size_t op_accept(aio_op *op, uint64_t off, long res, size_t remaining)
{
    /* Both hooks count every completion, so "the Nth completion" means the
     * same thing whichever faults are armed together. */
    bool eio = fault_hit(FAULT_READ_EIO);
    bool short_read = fault_hit(FAULT_READ_SHORT);
    if (eio) res = -EIO;
    else if (short_read && res > (long)AIO_BLOCK) {
        /* Half, kept block-aligned for O_DIRECT, but never less than one
         * block: a fault must delay a read, not end it. */
        res = (res / 2) & ~(long)(AIO_BLOCK - 1);
        if (res < (long)AIO_BLOCK) res = AIO_BLOCK;
    }

    if (op->failed) return 0;
    if (res < 0) {
        op_fail(op, "%s: read at %" PRIu64 ": %s", op->path, off, strerror((int)-res));
        return 0;
    }
    if ((size_t)res >= remaining) return remaining;
    /* A short read: take what arrived and ask again for the rest. With
     * O_DIRECT the rest must start on a block boundary, so a partial block
     * is read again; less than a block before the end means the file ended
     * inside that block. */
    if (op->direct) res &= ~(long)(AIO_BLOCK - 1); /* A4 */
    if (res == 0) {
        op_fail(op, "%s: unexpected end of file at %" PRIu64, op->path, off);
        return 0;
    }
    return (size_t)res;
}

/* ---- io_uring ------------------------------------------------------------- */

static void chunk_prep(aio *a, int c)
{
    aio_chunk *ch = &a->chunks[c];
    struct io_uring_sqe *sqe = io_uring_get_sqe(&a->ring);
    FERRY_ASSERT(sqe != NULL); /* A2 */
    unsigned n = (unsigned)ch->remaining; /* <= AIO_CHUNK */
    io_uring_prep_read(sqe, a->ops[ch->op].fd, ch->buf, n, ch->offset);
    io_uring_sqe_set_data64(sqe, (uint64_t)c);
    ch->state = CHUNK_PREPPED;
    a->prepped[(a->prep_head + a->prep_count) % a->depth] = c;
    a->prep_count++;
}

/* Hands the next pieces of queued reads to free chunks, in order (A1:
 * a read leaves the submit queue only once wholly handed out). */
static void pump(aio *a)
{
    while (a->n_free > 0 && a->submit.head >= 0) {
        int i = a->submit.head;
        aio_op *op = &a->ops[i];
        size_t n = op->len - op->issued;
        if (n > AIO_CHUNK) n = AIO_CHUNK;
        int c = a->free_chunks[--a->n_free];
        aio_chunk *ch = &a->chunks[c];
        ch->op = i;
        ch->offset = op->offset + op->issued;
        ch->buf = op->buf + op->issued;
        ch->remaining = n;
        op->issued += n;
        op->inflight++;
        chunk_prep(a, c);
        if (op->issued == op->len) queue_pop(a, &a->submit);
    }
}

/* The ring itself failed (not one read): fail every unfinished read. Chunks
 * that the kernel holds still complete and are drained as usual unless
 * `drop_kernel` (completions can no longer be collected); PREPPED ones are
 * forgotten - a broken aio never submits again, so their SQEs never reach
 * the kernel. */
static void break_ring(aio *a, int err, const char *call, bool drop_kernel)
{
    a->broken = true;
    snprintf(a->broken_why, sizeof a->broken_why, "%s: %s", call, strerror(err));
    for (unsigned c = 0; c < a->depth; c++) {
        aio_chunk *ch = &a->chunks[c];
        if (ch->state == CHUNK_FREE) continue;
        aio_op *op = &a->ops[ch->op];
        op_fail(op, "%s: read at %" PRIu64 ": io_uring %s", op->path, ch->offset, a->broken_why);
    }
    for (int i = a->submit.head; i >= 0; i = a->ops[i].next) {
        aio_op *op = &a->ops[i];
        op_fail(op, "%s: read at %" PRIu64 ": io_uring %s", op->path, op->offset + op->issued, a->broken_why);
    }
    for (unsigned c = 0; c < a->depth; c++) {
        aio_chunk *ch = &a->chunks[c];
        if (ch->state == CHUNK_PREPPED || (ch->state == CHUNK_KERNEL && drop_kernel)) {
            int i = ch->op;
            a->ops[i].inflight--;
            chunk_release(a, (int)c);
            op_settle(a, i);
        }
    }
    a->prep_count = 0;
    /* What is left in the submit queue had nothing handed out, except
     * perhaps its head (A1), which settles when its last chunk drains (A3). */
    int i;
    while ((i = queue_pop(a, &a->submit)) >= 0)
        if (a->ops[i].inflight == 0) queue_push(a, &a->done, i);
}

/* Submits the PREPPED chunks. EINTR is retried; EAGAIN/EBUSY/ENOMEM mean
 * "not now" and leave them PREPPED for the next call; anything else breaks
 * the ring. */
static void flush(aio *a)
{
    while (a->prep_count > 0 && !a->broken) { /* A5 */
        int r = io_uring_submit(&a->ring);
        if (r == -EINTR) continue;
        if (r == -EAGAIN || r == -EBUSY || r == -ENOMEM || r == 0) return;
        if (r < 0) {
            break_ring(a, -r, "submit", false);
            return;
        }
        for (int k = 0; k < r && a->prep_count > 0; k++) {
            a->chunks[a->prepped[a->prep_head]].state = CHUNK_KERNEL;
            a->prep_head = (a->prep_head + 1) % a->depth;
            a->prep_count--;
        }
    }
}

static void handle_cqe(aio *a, struct io_uring_cqe *cqe)
{
    int c = (int)io_uring_cqe_get_data64(cqe);
    long res = cqe->res;
    io_uring_cqe_seen(&a->ring, cqe);
    if (a->broken && (c < 0 || c >= (int)a->depth || a->chunks[c].state != CHUNK_KERNEL))
        return; /* a chunk given up on when waiting failed */
    FERRY_ASSERT(c >= 0 && c < (int)a->depth && a->chunks[c].state == CHUNK_KERNEL);
    aio_chunk *ch = &a->chunks[c];
    int i = ch->op;
    aio_op *op = &a->ops[i];
    /* A broken ring has failed every read it holds, so op_accept accepts
     * nothing and no resubmission is PREPPED that would never be sent. */
    size_t got = op_accept(op, ch->offset, res, ch->remaining);
    if (got > 0) {
        op->arrived += got;
        ch->remaining -= got;
        if (ch->remaining > 0) {
            ch->offset += got;
            ch->buf += got;
            chunk_prep(a, c);
            return;
        }
    }
    op->inflight--;
    chunk_release(a, c);
    op_settle(a, i);
}

/* Everything that can be done without blocking: hand out chunks, submit,
 * and handle the completions already posted (which may free chunks or ask
 * for resubmissions, hence the loop). */
static void progress(aio *a)
{
    for (;;) {
        if (!a->broken) {
            pump(a);
            flush(a);
        }
        int handled = 0;
        struct io_uring_cqe *cqe;
        while (io_uring_peek_cqe(&a->ring, &cqe) == 0) {
            handle_cqe(a, cqe);
            handled++;
        }
        if (handled == 0) return;
    }
}

/* ---- the pread fallback --------------------------------------------------- */

/* Performs the read at the head of the submit queue, whole. */
static void sync_run_one(aio *a)
{
    int i = queue_pop(a, &a->submit);
    aio_op *op = &a->ops[i];
    while (op->arrived < op->len) {
        size_t want = op->len - op->arrived;
        if (want > AIO_CHUNK) want = AIO_CHUNK;
        uint64_t off = op->offset + op->arrived;
        ssize_t r = pread(op->fd, op->buf + op->arrived, want, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        size_t got = op_accept(op, off, r < 0 ? -(long)errno : (long)r, want);
        if (got == 0) break;
        op->arrived += got;
    }
    op->issued = op->len;
    queue_push(a, &a->done, i);
}

/* ---- public --------------------------------------------------------------- */

ferry_status aio_create(unsigned depth, aio **out)
{
    *out = NULL;
    if (depth == 0) return ferry_fail(FERRY_ERR_INVALID, "aio: queue depth must be at least 1");
    if (depth > AIO_MAX_DEPTH) depth = AIO_MAX_DEPTH;
    aio *a = calloc(1, sizeof *a);
    if (!a) goto nomem;
    a->depth = depth;
    a->free_op = -1;
    a->submit = (op_queue){-1, -1};
    a->done = (op_queue){-1, -1};
    a->chunks = calloc(depth, sizeof *a->chunks);
    a->free_chunks = calloc(depth, sizeof *a->free_chunks);
    a->prepped = calloc(depth, sizeof *a->prepped);
    if (!a->chunks || !a->free_chunks || !a->prepped) goto nomem;
    for (unsigned c = 0; c < depth; c++) a->free_chunks[a->n_free++] = (int)(depth - 1 - c);

    int r = io_uring_queue_init(depth, &a->ring, 0);
    if (r == 0) {
        a->uring = true;
    } else {
        fprintf(stderr, "ferry: warning: io_uring unavailable (%s); using synchronous reads\n", strerror(-r));
    }
    *out = a;
    return FERRY_OK;

nomem:
    aio_free(a);
    return ferry_fail(FERRY_ERR_NOMEM, "aio: out of memory");
}

void aio_free(aio *a)
{
    if (!a) return;
    if (a->uring) {
        /* The kernel may still be writing into callers' buffers: wait for
         * every chunk it holds before the caller frees them. PREPPED chunks
         * were never submitted and simply die with the ring. */
        for (unsigned c = 0; c < a->depth; c++) {
            while (a->chunks[c].state == CHUNK_KERNEL) {
                struct io_uring_cqe *cqe;
                int r = io_uring_wait_cqe(&a->ring, &cqe);
                if (r == -EINTR || r == -EAGAIN) continue;
                if (r < 0) break; /* the ring is gone; nothing more will arrive */
                int k = (int)io_uring_cqe_get_data64(cqe);
                io_uring_cqe_seen(&a->ring, cqe);
                if (k >= 0 && k < (int)a->depth) a->chunks[k].state = CHUNK_FREE;
            }
        }
        io_uring_queue_exit(&a->ring);
    }
    for (int i = 0; i < a->ops_cap; i++) free(a->ops[i].path);
    free(a->ops);
    free(a->chunks);
    free(a->free_chunks);
    free(a->prepped);
    free(a);
}

ferry_status aio_read(aio *a, int fd, const char *path, uint64_t offset, void *buf, size_t len, uint64_t tag)
{
    /* io_uring reads offset -1 as "the current file position": an offset
     * that is not a valid off_t must never reach the ring. */
    if (offset > (uint64_t)INT64_MAX || len > (uint64_t)INT64_MAX - offset)
        return ferry_fail(FERRY_ERR_INVALID, "%s: read of %zu bytes at %" PRIu64 ": offset out of range", path, len,
                          offset);
    if (len > 0 && !buf) return ferry_fail(FERRY_ERR_INVALID, "%s: read into a NULL buffer", path);
    int fl = fcntl(fd, F_GETFL);
    bool direct = fl >= 0 && (fl & O_DIRECT);
    if (direct && (((uintptr_t)buf | offset | len) & (AIO_BLOCK - 1)))
        return ferry_fail(FERRY_ERR_INVALID, "%s: O_DIRECT read of %zu bytes at %" PRIu64 " is not %u-aligned", path,
                          len, offset, AIO_BLOCK);
    if (a->broken) return ferry_fail(FERRY_ERR_IO, "%s: read at %" PRIu64 ": io_uring %s", path, offset, a->broken_why);

    char *name = strdup(path);
    if (!name) return ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", path);
    if (a->free_op < 0) {
        int cap = a->ops_cap ? 2 * a->ops_cap : 16;
        aio_op *ops = realloc(a->ops, (size_t)cap * sizeof *ops);
        if (!ops) {
            free(name);
            return ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", path);
        }
        a->ops = ops;
        for (int k = cap - 1; k >= a->ops_cap; k--) {
            ops[k] = (aio_op){.path = NULL, .next = a->free_op};
            a->free_op = k;
        }
        a->ops_cap = cap;
    }
    int i = a->free_op;
    aio_op *op = &a->ops[i];
    a->free_op = op->next;
    *op = (aio_op){.fd = fd, .direct = direct, .path = name, .tag = tag, .offset = offset, .buf = buf, .len = len};
    a->pending++;
    if (len == 0) queue_push(a, &a->done, i);
    else queue_push(a, &a->submit, i);
    if (a->uring) progress(a); /* start the read now; never waits */
    return FERRY_OK;
}

/* Moves finished reads into out[0..max), in the order they finished. */
static int take_done(aio *a, aio_done *out, int max)
{
    int n = 0;
    while (n < max && a->done.head >= 0) {
        int i = queue_pop(a, &a->done);
        aio_op *op = &a->ops[i];
        out[n].tag = op->tag;
        out[n].st = op->failed ? FERRY_ERR_IO : FERRY_OK;
        memcpy(out[n].msg, op->failed ? op->msg : "", op->failed ? sizeof out[n].msg : 1);
        n++;
        free(op->path);
        op->path = NULL;
        op->next = a->free_op;
        a->free_op = i;
        a->pending--;
    }
    return n;
}

int aio_reap(aio *a, aio_done *out, int max, bool wait)
{
    if (max <= 0) return 0;
    int n = take_done(a, out, max);
    if (!a->uring) {
        /* Without a ring the read happens now, whether or not the caller
         * wanted to wait: otherwise a polling caller would never progress. */
        while (n == 0 && a->submit.head >= 0) {
            sync_run_one(a);
            n += take_done(a, out + n, max - n);
        }
        return n;
    }
    for (;;) {
        progress(a);
        n += take_done(a, out + n, max - n);
        if (n > 0 || !wait || a->pending == 0) return n;

        bool in_kernel = false;
        for (unsigned c = 0; c < a->depth && !in_kernel; c++) in_kernel = a->chunks[c].state == CHUNK_KERNEL;
        if (!in_kernel) {
            /* Everything pending is PREPPED and the kernel said "not now":
             * give it a moment rather than block on a CQE that cannot come. */
            FERRY_ASSERT(a->prep_count > 0);
            usleep(1000);
            continue;
        }
        struct io_uring_cqe *cqe;
        int r = io_uring_wait_cqe(&a->ring, &cqe);
        if (r == -EINTR || r == -EAGAIN) continue;
        if (r < 0) {
            /* Completions can no longer be collected, so nothing would ever
             * drain: fail the kernel's chunks too. */
            break_ring(a, -r, "wait", true);
            continue;
        }
        handle_cqe(a, cqe);
    }
}

unsigned aio_pending(const aio *a) { return a->pending; }

bool aio_is_uring(const aio *a) { return a->uring; }
