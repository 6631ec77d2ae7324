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
#include "weights/weight.h"
#include "base/status.h"

/* The KV cache of one layer, paged (kv.h): K and V are [n_blocks,
 * block_size, kv_dim] f32; table [n_seqs, max_blocks] (backend memory) lists
 * the blocks of each KV sequence in position order, batch_seq.kv_seq picks
 * the row. Position p of sequence s is row kv_row(kv, s, p) of K and V. */
typedef struct {
    float *k, *v;
    const int32_t *table;
    int n_seqs, max_blocks, block_size, n_blocks, kv_dim;
} kv_layer;

/* The row (of kv_dim floats) holding position pos of KV sequence kv_seq. */
static inline size_t kv_row(const kv_layer *kv, int kv_seq, int pos)
{
    int32_t blk = kv->table[(size_t)kv_seq * (size_t)kv->max_blocks + (size_t)(pos / kv->block_size)];
    return (size_t)blk * (size_t)kv->block_size + (size_t)(pos % kv->block_size);
}

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
    /* the kernels' instruction set, for reports (the CPU backends: avx2, avx512); NULL: not said */
    const char *(*kernels)(backend *be);
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
    /* matmul computes a GGUF's blocks (WQ_GGUF, weight.h); a backend that
     * does not gets them converted (engine_open says how) */
    bool gguf_blocks;
    void *(*host_alloc)(backend *be, size_t bytes, bool *pinned); /* pinned when it can be (else warns) */
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
    /* rotate_half RoPE in place at the batch's positions: the pair (i, i + head_dim/2) of each head turns
     * by the float32 angle pos * inv_freq[i], with cos and sin times attn_scale (YaRN; 1 otherwise).
     * The table comes from the config once (weights/rope.h), so every backend rotates alike. */
    void (*rope)(backend *be, float *x /* [n_tokens, heads * head_dim] */, int heads, int head_dim,
                 const float *inv_freq /* [head_dim / 2] */, float attn_scale);
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

    /* mixture of experts (forward.c, moe.h): an expert runs on the rows of
     * the tokens routed to it, gathered; its outputs, scaled by the routing
     * weights, go to one row per (token, choice), which combine sums in a
     * fixed order - so the result does not depend on the order experts ran
     * in (cached ones first, fetched ones as they arrive). rows, dest and
     * scale are backend memory. */
    /* out[i] = x[rows[i]], i < n */
    void (*gather_rows)(backend *be, float *out /* [n, dim] */, const float *x /* [*, dim] */,
                        const int32_t *rows /* [n] */, int n, int dim);
    /* out[dest[i]] = y[i] * scale[i] (f32 multiply), i < n */
    void (*scatter_rows)(backend *be, float *out /* [*, dim] */, const float *y /* [n, dim] */,
                         const int32_t *dest /* [n] */, const float *scale /* [n] */, int n, int dim);
    /* x[t] += ((y[t*k] + y[t*k+1]) + ... + y[t*k+k-1]): the k rows summed
     * left to right first, then added to x, as transformers' index_add_
     * into zeros and the residual add do */
    void (*moe_combine)(backend *be, float *x /* [n, dim] */, const float *y /* [n * k, dim] */, int n, int k,
                        int dim);
};

struct backend {
    const struct backend_ops *ops;
};

typedef struct {
    int threads;     /* CPU: 0 = all cores */
    const char *isa; /* CPU: the kernels' vector instructions, auto (NULL) | avx2 | avx512 (cpu_isa.c) */
    const char *activations; /* CPU: exact (NULL) | int8 (cpu_isa.c) */
} backend_opts;

/* What the CPU backends can be asked for on this processor and build
 * (cpu_isa.c): the instruction sets (--cpu-isa; the first the one auto
 * takes) and the activation modes (--cpu-activations) each name offered,
 * in order. */
typedef struct {
    const char *isas[4];
    const char *activations[4];
    int n_isas, n_activations;
} cpu_offer;
cpu_offer backend_cpu_offer(void);

/* Creates the named backend ("cpu", "cpu-split", "cuda"). */
ferry_status backend_create(const char *name, const backend_opts *opts, backend **out);
/* Writes zeros over [dst, dst + bytes) of backend memory through upload, so
 * that its pages are faulted in and zero-filled now, at startup, rather than
 * by the first steps that reach them (on the CPU a first touch is a page
 * fault and a 2 MiB clear; measured: half of a cold burst's time). */
void backend_prefault(backend *be, void *dst, size_t bytes);

/* host_alloc's fallback, said once per process on stderr: host memory that
 * could not be pinned is pageable. It works (copies from it are staged, or
 * slower), so it is a warning, not an error. */
void backend_warn_unpinned(size_t bytes);

static inline void backend_free(backend *be)
{
    if (be) be->ops->free(be);
}

/* The built-in backends (backend_create picks by name): the CPU kernels
 * (cpu/cpu_backend.c), and cpu-split, the same kernels behind a GPU's
 * separate memory and streams (cpu/split_backend.c). */
ferry_status cpu_backend_create(const backend_opts *opts, backend **out);
ferry_status split_backend_create(const backend_opts *opts, backend **out);

#endif
