/*
 * backend.h - the compute interface every backend fills (cpu, cpu-split, cuda).
 *
 * Everything above this interface - model, forward pass, plan, store,
 * pipeline, scheduler - is written once and calls only these functions. A backend
 * owns its memory (host RAM for the CPU, device memory for CUDA): pointers
 * passed to ops are backend memory obtained from alloc, or weights the
 * backend was given. Activations are f32, row-major [n_tokens, cols]; weights
 * are [rows, cols] in F32, F16 or BF16 and are applied as y = x W^T (+ b),
 * the Hugging Face Linear convention, with f32 accumulation.
 *
 * Ops run in submission order on the backend's compute stream; sync waits for
 * all of them. A batch (set_batch) describes which sequence, KV sequence and
 * position every token row belongs to; embed, rope, kv_store, attention and
 * gather_last read it (batch.h), so the same step serves sequences of any
 * lengths.
 */
#ifndef FERRY_BACKEND_H
#define FERRY_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "batch.h"
#include "weights/dtype.h"
#include "base/status.h"

/* A weight tensor as compute reads it. 1-D weights have rows == 1. */
typedef struct {
    ferry_dtype dtype;
    int64_t rows, cols;
    const void *data; /* backend-readable; NULL for an absent optional weight */
} weight;

/* The KV cache of one layer: [n_seqs, max_ctx, kv_dim] f32 for K and V;
 * batch_seq.kv_seq picks the sequence. */
typedef struct {
    float *k, *v;
    int n_seqs, max_ctx, kv_dim;
} kv_layer;

typedef struct backend backend;
typedef struct be_event be_event;

/* The two streams of a backend: ops run on the compute stream; the fetcher
 * thread's host -> device copies on the copy stream. */
typedef enum { STREAM_COMPUTE, STREAM_COPY } be_stream;

typedef struct {
    int n_heads, n_kv_heads, head_dim;
    int sliding_window; /* 0: full causal attention */
} attn_shape;

struct backend_ops {
    const char *name;
    void (*free)(backend *be);

    /* memory */
    void *(*alloc)(backend *be, size_t bytes); /* NULL when it cannot be had */
    void (*release)(backend *be, void *p);
    void (*upload)(backend *be, void *dst, const void *src, size_t bytes);
    void (*download)(backend *be, void *dst, const void *src, size_t bytes);
    void (*sync)(backend *be);

    /* streaming (pipeline.c). `unified`: device memory is host memory (the
     * CPU), so disk reads land in device buffers directly; the planner reads
     * it once (plan_opts.unified) and everything after follows the plan. On
     * the CPU copies are memcpy on the calling thread and events are no-ops,
     * because every op has finished when it returns. */
    bool unified;
    void *(*host_alloc)(backend *be, size_t bytes, bool *pinned); /* pinned when it can be */
    void (*host_free)(backend *be, void *p, size_t bytes, bool pinned);
    void (*copy_async)(backend *be, void *dst, const void *src, size_t bytes); /* host -> device, copy stream */
    be_event *(*event_create)(backend *be);
    void (*event_destroy)(backend *be, be_event *ev);
    void (*event_record)(backend *be, be_event *ev, be_stream s); /* after the work queued on s so far */
    void (*stream_wait)(backend *be, be_stream s, be_event *ev);  /* later work on s waits for ev */
    void (*event_sync)(backend *be, be_event *ev);                /* the host waits for ev */
    uint64_t (*mem_available)(backend *be);                        /* device memory that can be had */

    /* step */
    ferry_status (*set_batch)(backend *be, const batch *b);

    /* ops */
    void (*embed)(backend *be, float *out /* [n_tokens, dim] */, const weight *table /* [vocab, dim] */);
    /* out = w widened to f32 (embedding rows gathered on the host) */
    void (*convert)(backend *be, float *out /* [rows, cols] */, const weight *w /* [rows, cols] */);
    void (*rmsnorm)(backend *be, float *out /* [n, dim] */, const float *x /* [n, dim] */,
                    const weight *w /* [1, dim] */, int n, int dim, float eps);
    void (*matmul)(backend *be, float *out /* [n, w.rows] */, const float *x /* [n, w.cols] */,
                   const weight *w /* [rows, cols] */, const weight *bias /* [1, rows] or NULL */, int n);
    void (*rope)(backend *be, float *x /* [n_tokens, heads * head_dim] */, int heads, int head_dim,
                 float theta);
    void (*kv_store)(backend *be, const kv_layer *kv, const float *k /* [n_tokens, kv_dim] */,
                     const float *v /* [n_tokens, kv_dim] */);
    void (*attention)(backend *be, float *out /* [n_tokens, heads * head_dim] */,
                      const float *q /* [n_tokens, heads * head_dim] */, const kv_layer *kv,
                      const attn_shape *shape);
    void (*silu_mul)(backend *be, float *gate /* [n] in: gate, out: silu(gate) * up */,
                     const float *up /* [n] */, size_t n);
    void (*add)(backend *be, float *x /* [n] */, const float *y /* [n] */, size_t n);
    /* out[s] = x[last token of sequence s], for every sequence of the batch */
    void (*gather_last)(backend *be, float *out /* [n_seqs, dim] */, const float *x /* [n_tokens, dim] */,
                        int dim);
};

struct backend {
    const struct backend_ops *ops;
};

typedef struct {
    int threads; /* CPU: 0 = all cores */
} backend_opts;

/* Creates the named backend ("cpu", "cpu-split", "cuda"). */
ferry_status backend_create(const char *name, const backend_opts *opts, backend **out);

static inline void backend_free(backend *be)
{
    if (be) be->ops->free(be);
}

ferry_status cpu_backend_create(const backend_opts *opts, backend **out);

#endif
