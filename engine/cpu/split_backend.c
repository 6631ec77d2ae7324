/*
 * split_backend.c - the cpu-split backend (`--device cpu-split`): the CPU
 * backend's kernels behind a GPU's memory and stream model, so that every
 * non-unified path above the backend runs, and is tested, without a GPU.
 *
 * Memory: alloc gives device memory (split_mem.c) apart from host memory,
 * poisoned when fresh and when released; host_alloc gives ordinary memory.
 * Every pointer handed to an op, upload, download or copy is checked to be
 * on the side it must be on, and a wrong one aborts naming the op: on a GPU
 * it would fault, here it would silently work.
 *
 * Streams (split_stream.c): the copy stream always has a thread of its own,
 * so copy_async returns at once and the copy lands later - after
 * $FERRY_SPLIT_DELAY_US microseconds (default 0) of injected latency per
 * copy. The compute stream is inline by default: ops run on the calling
 * thread before they return, so an event recorded on it is complete at
 * once and a compute-stream wait blocks the caller. With
 * FERRY_SPLIT_COMPUTE=thread it gets a thread too, and the host runs ahead
 * of compute as it does of a GPU: that is what makes the host-side orders
 * (a slot released before the ops that read it ran; a bounce buffer reused
 * before its copy ran) observable.
 *
 * upload, download and sync are the CUDA backend's: upload and download wait
 * for the compute stream and copy before returning; neither waits for the
 * copy stream. release and host_free wait for both streams, as cudaFree and
 * cudaFreeHost do. set_batch copies the batch, as a GPU backend uploads it,
 * after waiting for the compute stream (whose queued ops read the previous
 * one; the CUDA backend orders that on the stream instead).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/fault.h"
#include "../base/util.h"
#include "split.h"

#define MAX_DELAY_US 10000000u

typedef struct {
    backend base;
    backend *cpu; /* runs every kernel */
    split_mem *mem;
    pthread_mutex_t mu; /* the streams' counters and the events */
    pthread_cond_t cv_done;
    split_stream *copy, *compute;
    unsigned delay_us;
    /* the step's batch, copied as a GPU backend uploads it: queued ops read
     * it after set_batch's caller may have moved on */
    batch b;
    int32_t *tokens, *pos; /* [cap_tokens] */
    batch_seq *seqs;       /* [cap_seqs] */
    int cap_tokens, cap_seqs;
} split_backend;

/* A mark: complete once `stream` has completed `seq` commands. */
struct be_event {
    split_stream *stream; /* NULL: never recorded, complete */
    uint64_t seq;
};

static split_backend *split_of(backend *be) { return (split_backend *)be; }

static split_stream *stream_of(split_backend *sb, be_stream s) { return s == STREAM_COPY ? sb->copy : sb->compute; }


/* ---- checks: each argument on its side ----------------------------------- */

static void dev(split_backend *sb, const void *p, size_t bytes, const char *who, const char *what)
{
    split_mem_check(sb->mem, p, bytes, true, who, what);
}

/* A quantized weight is two buffers, its packed data and its scales, each
 * of which must be device memory on its own. */
static void dev_weight(split_backend *sb, const weight *w, const char *who)
{
    if (!w || !w->data) return;
    split_mem_check(sb->mem, w->data, (size_t)w->rows * weight_row_bytes(w), true, who, "weight");
    if (weight_has_scales(w))
        split_mem_check(sb->mem, w->scales, (size_t)(w->rows * weight_groups(w)) * dtype_size(w->scale_dtype), true,
                        who, "weight scales");
}

static void host(split_backend *sb, const void *p, size_t bytes, const char *who, const char *what)
{
    split_mem_check(sb->mem, p, bytes, false, who, what);
}

/* ---- memory ---------------------------------------------------------------- */

static void *split_alloc(backend *be, size_t bytes)
{
    return fault_hit(FAULT_DEV_ALLOC) ? NULL : split_mem_alloc(split_of(be)->mem, bytes);
}

static void drain_all(split_backend *sb)
{
    split_stream_drain(sb->compute);
    split_stream_drain(sb->copy);
}

static void split_release(backend *be, void *p)
{
    split_backend *sb = split_of(be);
    if (!p) return;
    drain_all(sb);
    split_mem_release(sb->mem, p);
}

static void split_upload(backend *be, void *dst, const void *src, size_t bytes)
{
    split_backend *sb = split_of(be);
    dev(sb, dst, bytes, "upload", "destination");
    host(sb, src, bytes, "upload", "source");
    split_stream_drain(sb->compute);
    memcpy(dst, src, bytes);
}

static void split_download(backend *be, void *dst, const void *src, size_t bytes)
{
    split_backend *sb = split_of(be);
    dev(sb, src, bytes, "download", "source");
    host(sb, dst, bytes, "download", "destination");
    split_stream_drain(sb->compute);
    memcpy(dst, src, bytes);
}

static void split_sync(backend *be) { split_stream_drain(split_of(be)->compute); }

/* Ordinary memory, reported pinned: the copy thread reads it directly while
 * the host goes on, which is what pinning buys a GPU's copy engine (a
 * pageable source would be staged). 4096-aligned: bounce buffers receive
 * O_DIRECT reads. The host_pin fault reports it pageable (and warns), as
 * cuda's fallback does, so that the callers' pageable paths run here too. */
static void *split_host_alloc(backend *be, size_t bytes, bool *pinned)
{
    (void)be;
    void *p = NULL;
    bool fail = fault_hit(FAULT_HOST_ALLOC), unpinned = fault_hit(FAULT_HOST_PIN);
    *pinned = !unpinned;
    if (fail || posix_memalign(&p, 4096, bytes ? bytes : 4096) != 0) return NULL;
    if (unpinned) backend_warn_unpinned(bytes);
    return p;
}

static void split_host_free(backend *be, void *p, size_t bytes, bool pinned)
{
    (void)bytes, (void)pinned;
    if (!p) return;
    drain_all(split_of(be));
    free(p);
}

/* ---- streams and events ------------------------------------------------------ */

static void split_copy_async(backend *be, void *dst, const void *src, size_t bytes)
{
    split_backend *sb = split_of(be);
    dev(sb, dst, bytes, "copy_async", "destination");
    host(sb, src, bytes, "copy_async", "source");
    split_stream_submit(sb->copy, &(split_cmd){.op = SPLIT_COPY, .dst = dst, .src = src, .bytes = bytes});
}

static be_event *split_event_create(backend *be)
{
    (void)be;
    return calloc(1, sizeof(be_event));
}

static void split_event_destroy(backend *be, be_event *ev)
{
    (void)be;
    free(ev);
}

/* On the inline compute stream every submitted command has completed, so
 * the mark is complete as soon as it is made; the rule is the same. */
static void split_event_record(backend *be, be_event *ev, be_stream s)
{
    split_backend *sb = split_of(be);
    pthread_mutex_lock(&sb->mu);
    ev->stream = stream_of(sb, s);
    ev->seq = split_stream_submitted(ev->stream);
    pthread_mutex_unlock(&sb->mu);
}

/* The wait takes the event's mark now: recording the event again later does
 * not change what is waited for (as with cudaStreamWaitEvent). */
static void split_wait(backend *be, be_stream s, be_event *ev)
{
    split_backend *sb = split_of(be);
    split_stream *target = stream_of(sb, s);
    pthread_mutex_lock(&sb->mu);
    split_cmd c = {.op = SPLIT_WAIT, .on = ev->stream, .seq = ev->seq};
    pthread_mutex_unlock(&sb->mu);
    if (!c.on || c.on == target) return; /* never recorded, or earlier on the same stream */
    split_stream_submit(target, &c);
}

static void split_event_sync(backend *be, be_event *ev)
{
    split_backend *sb = split_of(be);
    pthread_mutex_lock(&sb->mu);
    while (ev->stream && !split_stream_reached(ev->stream, ev->seq)) pthread_cond_wait(&sb->cv_done, &sb->mu);
    pthread_mutex_unlock(&sb->mu);
}

static uint64_t split_mem_available(backend *be)
{
    (void)be;
    return util_mem_available();
}

/* ---- the step's batch ---------------------------------------------------------- */

static ferry_status split_set_batch(backend *be, const batch *b)
{
    split_backend *sb = split_of(be);
    split_stream_drain(sb->compute); /* queued ops read the previous batch */
    if (b->n_tokens > sb->cap_tokens) {
        int32_t *t = realloc(sb->tokens, (size_t)b->n_tokens * sizeof *t);
        if (t) sb->tokens = t;
        int32_t *p = t ? realloc(sb->pos, (size_t)b->n_tokens * sizeof *p) : NULL;
        if (p) sb->pos = p;
        if (!t || !p) return ferry_fail(FERRY_ERR_NOMEM, "out of memory for a batch of %d tokens", b->n_tokens);
        sb->cap_tokens = b->n_tokens;
    }
    if (b->n_seqs > sb->cap_seqs) {
        batch_seq *s = realloc(sb->seqs, (size_t)b->n_seqs * sizeof *s);
        if (!s) return ferry_fail(FERRY_ERR_NOMEM, "out of memory for a batch of %d sequences", b->n_seqs);
        sb->seqs = s;
        sb->cap_seqs = b->n_seqs;
    }
    memcpy(sb->tokens, b->tokens, (size_t)b->n_tokens * sizeof *sb->tokens);
    memcpy(sb->pos, b->pos, (size_t)b->n_tokens * sizeof *sb->pos);
    memcpy(sb->seqs, b->seqs, (size_t)b->n_seqs * sizeof *sb->seqs);
    sb->b = *b;
    sb->b.tokens = sb->tokens;
    sb->b.pos = sb->pos;
    sb->b.seqs = sb->seqs;
    return sb->cpu->ops->set_batch(sb->cpu, &sb->b);
}

/* ---- ops: checked and queued on the compute stream ------------------------------ */

static void submit(split_backend *sb, const split_cmd *c) { split_stream_submit(sb->compute, c); }

#define F32(n) ((size_t)(n) * sizeof(float))

static void split_embed(backend *be, float *out, const weight *table)
{
    split_backend *sb = split_of(be);
    dev(sb, out, F32(sb->b.n_tokens * table->cols), "embed", "out");
    dev_weight(sb, table, "embed");
    submit(sb, &(split_cmd){.op = SPLIT_EMBED, .out = out, .w = *table});
}

static void split_convert(backend *be, float *out, const weight *w)
{
    split_backend *sb = split_of(be);
    dev(sb, out, F32(w->rows * w->cols), "convert", "out");
    dev_weight(sb, w, "convert");
    submit(sb, &(split_cmd){.op = SPLIT_CONVERT, .out = out, .w = *w});
}

static void split_rmsnorm(backend *be, float *out, const float *x, const weight *w, int n, int dim, float eps)
{
    split_backend *sb = split_of(be);
    dev(sb, out, F32((size_t)n * dim), "rmsnorm", "out");
    dev(sb, x, F32((size_t)n * dim), "rmsnorm", "x");
    dev_weight(sb, w, "rmsnorm");
    submit(sb, &(split_cmd){.op = SPLIT_RMSNORM, .out = out, .x = x, .w = *w, .n = n, .dim = dim, .f = eps});
}

static void split_matmul(backend *be, float *out, const float *x, const weight *w, const weight *bias, int n)
{
    split_backend *sb = split_of(be);
    dev(sb, out, F32((size_t)n * w->rows), "matmul", "out");
    dev(sb, x, F32((size_t)n * w->cols), "matmul", "x");
    dev_weight(sb, w, "matmul");
    dev_weight(sb, bias, "matmul bias");
    split_cmd c = {.op = SPLIT_MATMUL, .out = out, .x = x, .w = *w, .n = n, .has_bias = bias != NULL};
    if (bias) c.bias = *bias;
    submit(sb, &c);
}

static void split_rope(backend *be, float *x, int heads, int head_dim, const float *inv_freq, float attn_scale)
{
    split_backend *sb = split_of(be);
    dev(sb, x, F32((size_t)sb->b.n_tokens * heads * head_dim), "rope", "x");
    dev(sb, inv_freq, F32((size_t)(head_dim / 2)), "rope", "inv_freq");
    submit(sb, &(split_cmd){.op = SPLIT_ROPE, .out = x, .y = inv_freq, .n = heads, .dim = head_dim, .f = attn_scale});
}

static void check_kv(split_backend *sb, const kv_layer *kv, const char *who)
{
    size_t pool = F32((size_t)kv->n_blocks * (size_t)kv->block_size * (size_t)kv->kv_dim);
    dev(sb, kv->k, pool, who, "K cache");
    dev(sb, kv->v, pool, who, "V cache");
    dev(sb, kv->table, (size_t)kv->n_seqs * (size_t)kv->max_blocks * sizeof *kv->table, who, "KV block table");
}

static void split_kv_store(backend *be, const kv_layer *kv, const float *k, const float *v)
{
    split_backend *sb = split_of(be);
    check_kv(sb, kv, "kv_store");
    dev(sb, k, F32((size_t)sb->b.n_tokens * kv->kv_dim), "kv_store", "k");
    dev(sb, v, F32((size_t)sb->b.n_tokens * kv->kv_dim), "kv_store", "v");
    submit(sb, &(split_cmd){.op = SPLIT_KV_STORE, .kv = *kv, .x = k, .y = v});
}

static void split_attention(backend *be, float *out, const float *q, const kv_layer *kv, const attn_shape *shape)
{
    split_backend *sb = split_of(be);
    size_t rows = F32((size_t)sb->b.n_tokens * shape->n_heads * shape->head_dim);
    dev(sb, out, rows, "attention", "out");
    dev(sb, q, rows, "attention", "q");
    check_kv(sb, kv, "attention");
    submit(sb, &(split_cmd){.op = SPLIT_ATTENTION, .out = out, .x = q, .kv = *kv, .shape = *shape});
}

static void split_silu_mul(backend *be, float *gate, const float *up, size_t n)
{
    split_backend *sb = split_of(be);
    dev(sb, gate, F32(n), "silu_mul", "gate");
    dev(sb, up, F32(n), "silu_mul", "up");
    submit(sb, &(split_cmd){.op = SPLIT_SILU_MUL, .out = gate, .x = up, .count = n});
}

static void split_add(backend *be, float *x, const float *y, size_t n)
{
    split_backend *sb = split_of(be);
    dev(sb, x, F32(n), "add", "x");
    dev(sb, y, F32(n), "add", "y");
    submit(sb, &(split_cmd){.op = SPLIT_ADD, .out = x, .x = y, .count = n});
}

static void split_gather_last(backend *be, float *out, const float *x, int dim)
{
    split_backend *sb = split_of(be);
    dev(sb, out, F32((size_t)sb->b.n_seqs * dim), "gather_last", "out");
    dev(sb, x, F32((size_t)sb->b.n_tokens * dim), "gather_last", "x");
    submit(sb, &(split_cmd){.op = SPLIT_GATHER_LAST, .out = out, .x = x, .dim = dim});
}

/* An expert's rows (forward.c): rows, dest and scale are device memory,
 * read when the command runs; the rows they index are checked then. */
static void split_gather_rows(backend *be, float *out, const float *x, const int32_t *rows, int n, int dim)
{
    split_backend *sb = split_of(be);
    if (n <= 0) return;
    dev(sb, out, F32((size_t)n * dim), "gather_rows", "out");
    dev(sb, x, F32(dim), "gather_rows", "x");
    dev(sb, rows, (size_t)n * sizeof *rows, "gather_rows", "rows");
    submit(sb, &(split_cmd){.op = SPLIT_GATHER_ROWS, .out = out, .x = x, .idx = rows, .n = n, .dim = dim});
}

static void split_scatter_rows(backend *be, float *out, const float *y, const int32_t *dest, const float *scale, int n,
                               int dim)
{
    split_backend *sb = split_of(be);
    if (n <= 0) return;
    dev(sb, out, F32(dim), "scatter_rows", "out");
    dev(sb, y, F32((size_t)n * dim), "scatter_rows", "y");
    dev(sb, dest, (size_t)n * sizeof *dest, "scatter_rows", "dest");
    dev(sb, scale, F32(n), "scatter_rows", "scale");
    submit(sb, &(split_cmd){.op = SPLIT_SCATTER_ROWS, .out = out, .x = y, .y = scale, .idx = dest, .n = n,
                            .dim = dim});
}

static void split_moe_combine(backend *be, float *x, const float *y, int n, int k, int dim)
{
    split_backend *sb = split_of(be);
    if (n <= 0) return;
    dev(sb, x, F32((size_t)n * dim), "moe_combine", "x");
    dev(sb, y, F32((size_t)n * k * dim), "moe_combine", "y");
    submit(sb, &(split_cmd){.op = SPLIT_MOE_COMBINE, .out = x, .x = y, .n = n, .k = k, .dim = dim});
}

/* Each row an index names must lie in device memory: a GPU would fault. */
static void check_indexed_rows(split_backend *sb, const float *base, const int32_t *idx, int n, int dim,
                               const char *who, const char *what)
{
    for (int i = 0; i < n; i++) dev(sb, base + (size_t)idx[i] * (size_t)dim, F32(dim), who, what);
}

/* ---- running commands ------------------------------------------------------------ */

static void exec_copy(void *ctx, const split_cmd *c)
{
    split_backend *sb = ctx;
    FERRY_ASSERT(c->op == SPLIT_COPY);
    if (sb->delay_us) {
        struct timespec ts = {sb->delay_us / 1000000u, (long)(sb->delay_us % 1000000u) * 1000};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
    }
    memcpy(c->dst, c->src, c->bytes);
}

static void exec_op(void *ctx, const split_cmd *c)
{
    split_backend *sb = ctx;
    backend *cpu = sb->cpu;
    const struct backend_ops *op = cpu->ops;
    switch (c->op) {
    case SPLIT_EMBED: op->embed(cpu, c->out, &c->w); break;
    case SPLIT_CONVERT: op->convert(cpu, c->out, &c->w); break;
    case SPLIT_RMSNORM: op->rmsnorm(cpu, c->out, c->x, &c->w, c->n, c->dim, c->f); break;
    case SPLIT_MATMUL: op->matmul(cpu, c->out, c->x, &c->w, c->has_bias ? &c->bias : NULL, c->n); break;
    case SPLIT_ROPE: op->rope(cpu, c->out, c->n, c->dim, c->y, c->f); break;
    case SPLIT_KV_STORE: op->kv_store(cpu, &c->kv, c->x, c->y); break;
    case SPLIT_ATTENTION: op->attention(cpu, c->out, c->x, &c->kv, &c->shape); break;
    case SPLIT_SILU_MUL: op->silu_mul(cpu, c->out, c->x, c->count); break;
    case SPLIT_ADD: op->add(cpu, c->out, c->x, c->count); break;
    case SPLIT_GATHER_LAST: op->gather_last(cpu, c->out, c->x, c->dim); break;
    case SPLIT_GATHER_ROWS:
        check_indexed_rows(sb, c->x, c->idx, c->n, c->dim, "gather_rows", "a row of x");
        op->gather_rows(cpu, c->out, c->x, c->idx, c->n, c->dim);
        break;
    case SPLIT_SCATTER_ROWS:
        check_indexed_rows(sb, c->out, c->idx, c->n, c->dim, "scatter_rows", "a row of out");
        op->scatter_rows(cpu, c->out, c->x, c->idx, c->y, c->n, c->dim);
        break;
    case SPLIT_MOE_COMBINE: op->moe_combine(cpu, c->out, c->x, c->n, c->k, c->dim); break;
    case SPLIT_WAIT:
    case SPLIT_COPY: FERRY_ASSERT(!"not a compute op"); break;
    }
}

/* ---- lifecycle ------------------------------------------------------------------- */

static void split_free(backend *be)
{
    split_backend *sb = split_of(be);
    split_stream_free(sb->compute); /* each runs what was queued, then stops */
    split_stream_free(sb->copy);
    backend_free(sb->cpu);
    split_mem_free(sb->mem);
    pthread_mutex_destroy(&sb->mu);
    pthread_cond_destroy(&sb->cv_done);
    free(sb->tokens);
    free(sb->pos);
    free(sb->seqs);
    free(sb);
}

static const char *split_kernels(backend *be)
{
    backend *cpu = ((split_backend *)be)->cpu;
    return cpu->ops->kernels(cpu);
}

static const struct backend_ops k_split_ops = {
    .name = "cpu-split",
    .kernels = split_kernels,
    .free = split_free,
    .alloc = split_alloc,
    .release = split_release,
    .upload = split_upload,
    .download = split_download,
    .sync = split_sync,
    .unified = false,
    .gguf_blocks = true, /* the CPU kernels */
    .host_alloc = split_host_alloc,
    .host_free = split_host_free,
    .copy_async = split_copy_async,
    .event_create = split_event_create,
    .event_destroy = split_event_destroy,
    .event_record = split_event_record,
    .stream_wait = split_wait,
    .event_sync = split_event_sync,
    .mem_available = split_mem_available,
    .set_batch = split_set_batch,
    .embed = split_embed,
    .convert = split_convert,
    .rmsnorm = split_rmsnorm,
    .matmul = split_matmul,
    .rope = split_rope,
    .kv_store = split_kv_store,
    .attention = split_attention,
    .silu_mul = split_silu_mul,
    .add = split_add,
    .gather_last = split_gather_last,
    .gather_rows = split_gather_rows,
    .scatter_rows = split_scatter_rows,
    .moe_combine = split_moe_combine,
};

/* The environment's settings: FERRY_SPLIT_DELAY_US and FERRY_SPLIT_COMPUTE. */
static ferry_status read_env(unsigned *delay_us, bool *compute_thread)
{
    const char *d = getenv("FERRY_SPLIT_DELAY_US");
    *delay_us = 0;
    if (d && *d) {
        char *end;
        errno = 0;
        unsigned long v = strtoul(d, &end, 10);
        if (errno || *end || *d == '-' || v > MAX_DELAY_US)
            return ferry_fail(FERRY_ERR_INVALID, "FERRY_SPLIT_DELAY_US=%s: expected microseconds, 0 to %u", d,
                              MAX_DELAY_US);
        *delay_us = (unsigned)v;
    }
    const char *c = getenv("FERRY_SPLIT_COMPUTE");
    *compute_thread = c && strcmp(c, "thread") == 0;
    if (c && *c && !*compute_thread && strcmp(c, "inline") != 0)
        return ferry_fail(FERRY_ERR_INVALID, "FERRY_SPLIT_COMPUTE=%s: expected inline or thread", c);
    return FERRY_OK;
}

ferry_status split_backend_create(const backend_opts *opts, backend **out)
{
    *out = NULL;
    unsigned delay_us;
    bool compute_thread;
    FERRY_TRY(read_env(&delay_us, &compute_thread));
    split_backend *sb = calloc(1, sizeof *sb);
    if (!sb) return ferry_fail(FERRY_ERR_NOMEM, "out of memory creating the cpu-split backend");
    sb->base.ops = &k_split_ops;
    sb->delay_us = delay_us;
    pthread_mutex_init(&sb->mu, NULL);
    pthread_cond_init(&sb->cv_done, NULL);
    ferry_status st = cpu_backend_create(opts, &sb->cpu);
    if (st == FERRY_OK && !(sb->mem = split_mem_create()))
        st = ferry_fail(FERRY_ERR_NOMEM, "out of memory creating the cpu-split backend");
    if (st == FERRY_OK) st = split_stream_create("copy", true, &sb->mu, &sb->cv_done, exec_copy, sb, &sb->copy);
    if (st == FERRY_OK)
        st = split_stream_create("compute", compute_thread, &sb->mu, &sb->cv_done, exec_op, sb, &sb->compute);
    if (st != FERRY_OK) {
        split_free(&sb->base);
        return st;
    }
    *out = &sb->base;
    return FERRY_OK;
}
