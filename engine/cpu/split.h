/*
 * split.h - internals of the cpu-split backend (split_backend.c,
 * split_stream.c, split_mem.c).
 *
 * cpu-split is the CPU backend made to behave like a GPU: its device memory
 * is separate from host memory, and work runs on two streams, so that the
 * non-unified paths of the pipeline (bounce buffers, copy and compute
 * events, slot reuse) run and are tested on a machine without one.
 *
 * A stream is a queue of commands run in submission order, by its own thread
 * or, for an inline stream, by the submitting thread before submit returns.
 * Every stream counts the commands submitted and completed; an event is a
 * mark (stream, n): complete once that stream has completed n commands. A
 * wait command blocks its stream until a mark is complete, which is how one
 * stream waits for another, as cudaStreamWaitEvent does. Arguments are
 * captured by value when a command is submitted, as a kernel launch's are:
 * the caller may rebind its weight views before the command runs.
 */
#ifndef FERRY_CPU_SPLIT_H
#define FERRY_CPU_SPLIT_H

#include <pthread.h>

#include "../backend.h"


typedef struct split_stream split_stream;

typedef enum {
    SPLIT_WAIT, /* until stream `on` has completed `seq` commands */
    SPLIT_COPY, /* dst <- src, bytes (after the injected delay, on the copy stream) */
    SPLIT_EMBED,
    SPLIT_CONVERT,
    SPLIT_RMSNORM,
    SPLIT_MATMUL,
    SPLIT_ROPE,
    SPLIT_KV_STORE,
    SPLIT_ATTENTION,
    SPLIT_SILU_MUL,
    SPLIT_ADD,
    SPLIT_GATHER_LAST,
    SPLIT_GATHER_ROWS,
    SPLIT_SCATTER_ROWS,
    SPLIT_MOE_COMBINE,
} split_op;

/* One command; each op uses the fields its backend_ops function takes. */
typedef struct {
    split_op op;
    float *out;
    const float *x, *y;
    weight w, bias;
    bool has_bias;
    kv_layer kv;
    attn_shape shape;
    int n, dim, k;
    const int32_t *idx; /* gather_rows: rows; scatter_rows: dest */
    size_t count;
    float f;
    void *dst; /* SPLIT_COPY */
    const void *src;
    size_t bytes;
    split_stream *on; /* SPLIT_WAIT */
    uint64_t seq;
} split_cmd;

/* Runs one command other than SPLIT_WAIT (the stream handles those). */
typedef void (*split_exec_fn)(void *ctx, const split_cmd *c);

/* Streams of one backend share mu and cv_done (one stream waits for
 * another's progress). threaded: run commands on a thread of its own. */
ferry_status split_stream_create(const char *name, bool threaded, pthread_mutex_t *mu, pthread_cond_t *cv_done,
                                 split_exec_fn exec, void *ctx, split_stream **out);
/* Waits for every submitted command, then stops the thread. */
void split_stream_free(split_stream *s);

void split_stream_submit(split_stream *s, const split_cmd *c);
/* Blocks the caller until every command submitted so far has completed. */
void split_stream_drain(split_stream *s);

/* The mark of "everything submitted so far" (with *mu held). */
uint64_t split_stream_submitted(const split_stream *s);
/* True once s completed seq commands (with *mu held). */
bool split_stream_reached(const split_stream *s, uint64_t seq);

/* ---- device memory (split_mem.c) ------------------------------------------ */

/* The set of live device allocations. Every pointer an op, upload or copy
 * is handed is checked against it: reading host memory from compute is what
 * a GPU would fault on, and here it would silently work. */
typedef struct split_mem split_mem;

split_mem *split_mem_create(void);
void split_mem_free(split_mem *m);
/* Allocates bytes of device memory, filled with 0xFF (NaN as f32/f16/bf16),
 * so that data read before it was written shows up in outputs. */
void *split_mem_alloc(split_mem *m, size_t bytes);
/* Poisons (0xFF) and frees p; p must be a live allocation. */
void split_mem_release(split_mem *m, void *p);
/* True when [p, p + bytes) lies inside one live allocation. */
bool split_mem_holds(split_mem *m, const void *p, size_t bytes);
/* Aborts, naming what and who, unless [p, p + bytes) is device memory
 * (device true) or does not touch device memory (device false). */
void split_mem_check(split_mem *m, const void *p, size_t bytes, bool device, const char *who, const char *what);

#endif
