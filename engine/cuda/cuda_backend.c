/*
 * cuda_backend.c - the CUDA backend: the backend_ops vtable over the CUDA
 * runtime. Memory is device memory (cudaMalloc); host buffers for the host
 * tier and the disk bounce buffers are pinned when they can be; the kernels
 * live one family per file (cuda_*.cu, see cuda.h).
 *
 * Streams and threads. Every op, upload, download and set_batch's table copy
 * runs on the compute stream, from the engine thread. copy_async runs on the
 * copy stream, from the pipeline's fetcher thread; events order the two
 * (pipeline.c: a slot's copy waits for the compute that last read it, the
 * compute on a group waits for that group's copy). Functions that another
 * thread may call bind the device first (cudaSetDevice is per thread).
 *
 * This file is built into libferry_cuda.so, which engine/backend.c loads
 * with dlopen for --device cuda; the binary itself never links CUDA. The
 * library takes ferry_fail from the executable (ferry links -rdynamic), so
 * there is one error message per thread, not one per copy of status.c.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend.h"
#include "../base/fault.h"
#include "cuda.h"

/* The library's one export; engine/backend.c resolves it with dlsym. */
__attribute__((visibility("default"))) ferry_status ferry_cuda_backend_create(const backend_opts *opts, backend **out);

#define CUDA_WORKSPACE_BYTES (32u << 20) /* cuBLASLt workspace (what Hopper kernels want) */
#define CUDA_MM_X_BYTES (32u << 20)      /* activations split to 16-bit, per chunk of tokens */
#define CUDA_MM_Y_BYTES (32u << 20)      /* the two partial products, per chunk */
#define CUDA_TABLES_MIN 4096             /* int32 entries of the batch tables at first */

typedef struct {
    backend base;
    cuda_ctx cx;
    /* set_batch: the tables are packed on the host, then copied in one go;
     * the host copy is reused once the previous copy has completed */
    int32_t *tables_host;
    bool tables_pinned;
    int32_t *tables_dev;
    size_t tables_cap; /* int32 entries of both */
    cudaEvent_t tables_copied;
    int seqs_cap;
} cuda_backend;

struct be_event {
    cudaEvent_t ev;
};

static cuda_backend *cuda_of(backend *be) { return (cuda_backend *)be; }

void cuda_check_fail(const char *file, int line, const char *call, const char *what)
{
    fprintf(stderr, "ferry: CUDA error at %s:%d: %s: %s\n", file, line, call, what);
    abort();
}

/* Another thread (the fetcher, an export) may call in: the device is
 * current per thread. */
static void cuda_bind(cuda_backend *cb) { CUDA_CHECK(cudaSetDevice(cb->cx.device)); }

static cudaStream_t stream_of(cuda_backend *cb, be_stream s)
{
    return s == STREAM_COPY ? cb->cx.copy : cb->cx.compute;
}

/* ---- memory ------------------------------------------------------------------- */

static void *cuda_alloc(backend *be, size_t bytes)
{
    cuda_backend *cb = cuda_of(be);
    cuda_bind(cb);
    void *p = NULL;
    if (fault_hit(FAULT_DEV_ALLOC)) return NULL;
    if (cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess) {
        (void)cudaGetLastError(); /* not sticky; keep it from blaming the next launch */
        return NULL;
    }
    return p;
}

static void cuda_release(backend *be, void *p)
{
    if (!p) return;
    cuda_bind(cuda_of(be));
    CUDA_CHECK(cudaFree(p));
}

/* Both complete before returning: the caller may reuse src / read dst. */
static void cuda_upload(backend *be, void *dst, const void *src, size_t bytes)
{
    cuda_backend *cb = cuda_of(be);
    if (bytes == 0) return;
    cuda_bind(cb);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cb->cx.compute));
    CUDA_CHECK(cudaStreamSynchronize(cb->cx.compute));
}

static void cuda_download(backend *be, void *dst, const void *src, size_t bytes)
{
    cuda_backend *cb = cuda_of(be);
    if (bytes == 0) return;
    cuda_bind(cb);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cb->cx.compute));
    CUDA_CHECK(cudaStreamSynchronize(cb->cx.compute));
}

static void cuda_sync(backend *be)
{
    cuda_backend *cb = cuda_of(be);
    cuda_bind(cb);
    CUDA_CHECK(cudaStreamSynchronize(cb->cx.compute));
}

/* Pinned when it can be; pageable (4096-aligned: disk bounce buffers take
 * O_DIRECT reads) otherwise, with a warning. */
static void *cuda_host_alloc(backend *be, size_t bytes, bool *pinned)
{
    cuda_bind(cuda_of(be));
    void *p = NULL;
    bool fail = fault_hit(FAULT_HOST_ALLOC), unpinned = fault_hit(FAULT_HOST_PIN);
    *pinned = false;
    if (fail) return NULL;
    if (!unpinned && cudaHostAlloc(&p, bytes ? bytes : 4096, cudaHostAllocPortable) == cudaSuccess) {
        *pinned = true;
        return p;
    }
    (void)cudaGetLastError();
    if (posix_memalign(&p, 4096, bytes ? bytes : 4096) != 0) return NULL;
    backend_warn_unpinned(bytes);
    return p;
}

static void cuda_host_free(backend *be, void *p, size_t bytes, bool pinned)
{
    (void)bytes;
    if (!p) return;
    if (!pinned) {
        free(p);
        return;
    }
    cuda_bind(cuda_of(be));
    CUDA_CHECK(cudaFreeHost(p));
}

/* ---- streaming ---------------------------------------------------------------- */

/* Called from the fetcher thread. src is pinned (host tier, bounce buffer)
 * or, after a failed pin, pageable: then the runtime stages the copy. */
static void cuda_copy_async(backend *be, void *dst, const void *src, size_t bytes)
{
    cuda_backend *cb = cuda_of(be);
    if (bytes == 0) return;
    cuda_bind(cb);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cb->cx.copy));
}

static be_event *cuda_event_create(backend *be)
{
    cuda_bind(cuda_of(be));
    be_event *ev = malloc(sizeof *ev);
    if (!ev) return NULL;
    if (cudaEventCreateWithFlags(&ev->ev, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();
        free(ev);
        return NULL;
    }
    return ev;
}

static void cuda_event_destroy(backend *be, be_event *ev)
{
    if (!ev) return;
    cuda_bind(cuda_of(be));
    CUDA_CHECK(cudaEventDestroy(ev->ev));
    free(ev);
}

static void cuda_event_record(backend *be, be_event *ev, be_stream s)
{
    cuda_backend *cb = cuda_of(be);
    cuda_bind(cb);
    CUDA_CHECK(cudaEventRecord(ev->ev, stream_of(cb, s)));
}

/* An event never recorded is complete: waiting on it is a no-op, which is
 * what a slot's first fill needs. */
static void cuda_stream_wait(backend *be, be_stream s, be_event *ev)
{
    cuda_backend *cb = cuda_of(be);
    cuda_bind(cb);
    CUDA_CHECK(cudaStreamWaitEvent(stream_of(cb, s), ev->ev, 0));
}

static void cuda_event_sync(backend *be, be_event *ev)
{
    cuda_bind(cuda_of(be));
    CUDA_CHECK(cudaEventSynchronize(ev->ev));
}

static uint64_t cuda_mem_available(backend *be)
{
    cuda_bind(cuda_of(be));
    size_t free_b = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total));
    /* headroom for what is allocated after planning: lazily loaded kernel
     * modules, cuBLASLt, allocation rounding, the batch tables */
    size_t reserve = total / 50 > ((size_t)512 << 20) ? total / 50 : ((size_t)512 << 20);
    return free_b > reserve ? free_b - reserve : 0;
}

/* ---- the step's batch ----------------------------------------------------------- */

static ferry_status tables_grow(cuda_backend *cb, size_t need)
{
    size_t cap = cb->tables_cap * 2 > need ? cb->tables_cap * 2 : need;
    if (cap < CUDA_TABLES_MIN) cap = CUDA_TABLES_MIN;
    /* the old device tables may still be read by queued kernels */
    CUDA_CHECK(cudaStreamSynchronize(cb->cx.compute));
    if (cb->tables_host) {
        if (cb->tables_pinned) CUDA_CHECK(cudaFreeHost(cb->tables_host));
        else free(cb->tables_host);
        cb->tables_host = NULL;
    }
    if (cb->tables_dev) CUDA_CHECK(cudaFree(cb->tables_dev));
    cb->tables_dev = NULL;
    cb->tables_cap = 0;
    void *h = NULL, *d = NULL;
    bool unpinned = fault_hit(FAULT_HOST_PIN), no_dev = fault_hit(FAULT_DEV_ALLOC);
    cb->tables_pinned = !unpinned && cudaHostAlloc(&h, cap * sizeof(int32_t), cudaHostAllocPortable) == cudaSuccess;
    if (!cb->tables_pinned) {
        (void)cudaGetLastError();
        h = malloc(cap * sizeof(int32_t));
    }
    if (!h || no_dev || cudaMalloc(&d, cap * sizeof(int32_t)) != cudaSuccess) {
        (void)cudaGetLastError();
        if (h && cb->tables_pinned) (void)cudaFreeHost(h);
        else free(h);
        return ferry_fail(FERRY_ERR_NOMEM, "device 'cuda': out of memory for the batch tables");
    }
    cb->tables_host = h;
    cb->tables_dev = d;
    cb->tables_cap = cap;
    return FERRY_OK;
}

/* Packs [tokens][pos][seq_of][seqs] and queues one copy on the compute
 * stream: kernels of the previous step that read the tables come first in
 * stream order, kernels of this step after. */
static ferry_status cuda_set_batch(backend *be, const batch *b)
{
    cuda_backend *cb = cuda_of(be);
    cuda_ctx *cx = &cb->cx;
    cuda_bind(cb);
    size_t nt = (size_t)b->n_tokens, ns = (size_t)b->n_seqs;
    size_t need = 3 * nt + 4 * ns;
    CUDA_CHECK(cudaEventSynchronize(cb->tables_copied)); /* the host copy is free again */
    if (need > cb->tables_cap) FERRY_TRY(tables_grow(cb, need));
    if (cb->seqs_cap < b->n_seqs) {
        cuda_seq *p = realloc(cx->seqs_host, ns * sizeof *p);
        if (!p) return ferry_fail(FERRY_ERR_NOMEM, "out of memory for a batch of %d sequences", b->n_seqs);
        cx->seqs_host = p;
        cb->seqs_cap = b->n_seqs;
    }
    int32_t *h = cb->tables_host;
    memcpy(h, b->tokens, nt * sizeof *h);
    memcpy(h + nt, b->pos, nt * sizeof *h);
    int32_t *seq_of = h + 2 * nt;
    memset(seq_of, 0, nt * sizeof *seq_of);
    for (int s = 0; s < b->n_seqs; s++) {
        const batch_seq *q = &b->seqs[s];
        cx->seqs_host[s] = (cuda_seq){q->kv_seq, q->n_past, q->n_tokens, q->first};
        for (int i = 0; i < q->n_tokens; i++) seq_of[q->first + i] = s;
    }
    memcpy(h + 3 * nt, cx->seqs_host, ns * sizeof(cuda_seq));
    if (need > 0) {
        CUDA_CHECK(cudaMemcpyAsync(cb->tables_dev, h, need * sizeof *h, cudaMemcpyHostToDevice, cx->compute));
        CUDA_CHECK(cudaEventRecord(cb->tables_copied, cx->compute));
    }
    cx->n_tokens = b->n_tokens;
    cx->n_seqs = b->n_seqs;
    cx->d_tokens = cb->tables_dev;
    cx->d_pos = cb->tables_dev + nt;
    cx->d_seq_of = cb->tables_dev + 2 * nt;
    cx->d_seqs = (const cuda_seq *)(cb->tables_dev + 3 * nt);
    return FERRY_OK;
}

/* ---- ops: argument translation; the kernels are in cuda_*.cu ------------------------ */

static cuda_dtype cuda_dtype_of(ferry_dtype dt)
{
    FERRY_ASSERT(dtype_is_compute(dt));
    return dt == DT_F32 ? CUDA_F32 : dt == DT_F16 ? CUDA_F16 : CUDA_BF16;
}

/* An unquantized weight (every op but matmul takes only these). */
static const cuda_tensor *tensor_of(const weight *w, cuda_tensor *t)
{
    if (!w || !w->data) return NULL;
    FERRY_ASSERT(w->quant == WQ_NONE);
    *t = (cuda_tensor){.dt = cuda_dtype_of(w->dtype), .rows = w->rows, .cols = w->cols, .data = w->data};
    return t;
}

/* A GGUF file's blocks as stored (matmul, and an embedding table's gather
 * and convert). */
static const cuda_tensor *gguf_tensor_of(const weight *w, cuda_tensor *t)
{
    FERRY_ASSERT(w->quant == WQ_GGUF && w->dtype == DT_U8);
    *t = (cuda_tensor){.rows = w->rows, .cols = w->cols, .data = w->data, .quant = CUDA_Q_GGUF, .block = w->block};
    return t;
}

/* An embedding table or rows of one: unquantized, or a GGUF's blocks. */
static const cuda_tensor *table_of(const weight *w, cuda_tensor *t)
{
    return w && w->data && w->quant == WQ_GGUF ? gguf_tensor_of(w, t) : tensor_of(w, t);
}

/* A matmul weight: unquantized, int8 / int4 with its scales, or a GGUF's blocks. */
static const cuda_tensor *matmul_tensor_of(const weight *w, cuda_tensor *t)
{
    if (!w || !w->data || w->quant == WQ_NONE) return tensor_of(w, t);
    if (w->quant == WQ_GGUF) return gguf_tensor_of(w, t);
    FERRY_ASSERT((w->quant == WQ_INT8 && w->dtype == DT_I8) || (w->quant == WQ_INT4 && w->dtype == DT_I32));
    FERRY_ASSERT(w->group >= 1 && w->scales);
    *t = (cuda_tensor){.rows = w->rows, .cols = w->cols, .data = w->data,
                       .quant = w->quant == WQ_INT8 ? CUDA_Q_INT8 : CUDA_Q_INT4, .group = w->group,
                       .scale_dt = cuda_dtype_of(w->scale_dtype), .scales = w->scales};
    return t;
}

static void op_embed(backend *be, float *out, const weight *table)
{
    cuda_tensor t;
    cuda_embed(&cuda_of(be)->cx, out, table_of(table, &t));
}

static void op_convert(backend *be, float *out, const weight *w)
{
    cuda_tensor t;
    cuda_convert(&cuda_of(be)->cx, out, table_of(w, &t));
}

static void op_rmsnorm(backend *be, float *out, const float *x, const weight *w, int n, int dim, float eps)
{
    cuda_tensor t;
    cuda_rmsnorm(&cuda_of(be)->cx, out, x, tensor_of(w, &t), n, dim, eps);
}

static void op_matmul(backend *be, float *out, const float *x, const weight *w, const weight *bias, int n)
{
    cuda_tensor tw, tb;
    cuda_matmul(&cuda_of(be)->cx, out, x, matmul_tensor_of(w, &tw), tensor_of(bias, &tb), n);
}

static void op_rope(backend *be, float *x, int heads, int head_dim, const float *inv_freq, float attn_scale)
{
    cuda_rope(&cuda_of(be)->cx, x, heads, head_dim, inv_freq, attn_scale);
}

static cuda_kv kv_of(const kv_layer *kv)
{
    return (cuda_kv){kv->k, kv->v, kv->table, kv->max_blocks, kv->block_size, kv->kv_dim};
}

static void op_kv_store(backend *be, const kv_layer *kv, const float *k, const float *v)
{
    cuda_ctx *cx = &cuda_of(be)->cx;
    for (int s = 0; s < cx->n_seqs; s++) {
        const cuda_seq *q = &cx->seqs_host[s];
        FERRY_ASSERT(q->kv_seq >= 0 && q->kv_seq < kv->n_seqs && q->n_past >= 0 &&
                     q->n_past + q->n_tokens <= kv->max_blocks * kv->block_size);
    }
    cuda_kv ck = kv_of(kv);
    cuda_kv_store(cx, &ck, k, v);
}

static void op_attention(backend *be, float *out, const float *q, const kv_layer *kv, const attn_shape *sh)
{
    FERRY_ASSERT(sh->n_kv_heads > 0 && sh->n_heads % sh->n_kv_heads == 0);
    cuda_kv ck = kv_of(kv);
    cuda_attention(&cuda_of(be)->cx, out, q, &ck, sh->n_heads, sh->n_kv_heads, sh->head_dim, sh->sliding_window);
}

static void op_silu_mul(backend *be, float *gate, const float *up, size_t n)
{
    cuda_silu_mul(&cuda_of(be)->cx, gate, up, n);
}

static void op_add(backend *be, float *x, const float *y, size_t n) { cuda_add(&cuda_of(be)->cx, x, y, n); }

static void op_gather_last(backend *be, float *out, const float *x, int dim)
{
    cuda_gather_last(&cuda_of(be)->cx, out, x, dim);
}

static void op_gather_rows(backend *be, float *out, const float *x, const int32_t *rows, int n, int dim)
{
    cuda_gather_rows(&cuda_of(be)->cx, out, x, rows, n, dim);
}

static void op_scatter_rows(backend *be, float *out, const float *y, const int32_t *dest, const float *scale, int n,
                            int dim)
{
    cuda_scatter_rows(&cuda_of(be)->cx, out, y, dest, scale, n, dim);
}

static void op_moe_combine(backend *be, float *x, const float *y, int n, int k, int dim)
{
    cuda_moe_combine(&cuda_of(be)->cx, x, y, n, k, dim);
}

/* ---- lifecycle -------------------------------------------------------------------- */

/* Also undoes a partial creation: every field is NULL or valid. */
static void cuda_free(backend *be)
{
    cuda_backend *cb = cuda_of(be);
    cuda_ctx *cx = &cb->cx;
    (void)cudaSetDevice(cx->device);
    if (cx->compute) (void)cudaStreamSynchronize(cx->compute);
    if (cx->copy) (void)cudaStreamSynchronize(cx->copy);
    cuda_matmul_free(cx);
    if (cx->lt) (void)cublasLtDestroy(cx->lt);
    (void)cudaFree(cx->lt_ws);
    (void)cudaFree(cx->mm_x);
    (void)cudaFree(cx->mm_y);
    (void)cudaFree(cb->tables_dev);
    if (cb->tables_pinned) (void)cudaFreeHost(cb->tables_host);
    else free(cb->tables_host);
    if (cb->tables_copied) (void)cudaEventDestroy(cb->tables_copied);
    if (cx->compute) (void)cudaStreamDestroy(cx->compute);
    if (cx->copy) (void)cudaStreamDestroy(cx->copy);
    free(cx->seqs_host);
    free(cb);
}

static const struct backend_ops k_cuda_ops = {
    .name = "cuda",
    .free = cuda_free,
    .alloc = cuda_alloc,
    .release = cuda_release,
    .upload = cuda_upload,
    .download = cuda_download,
    .sync = cuda_sync,
    .unified = false,
    .gguf_blocks = true, /* cuda_gguf.cuh: UNTESTED */
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .copy_async = cuda_copy_async,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .stream_wait = cuda_stream_wait,
    .event_sync = cuda_event_sync,
    .mem_available = cuda_mem_available,
    .set_batch = cuda_set_batch,
    .embed = op_embed,
    .convert = op_convert,
    .rmsnorm = op_rmsnorm,
    .matmul = op_matmul,
    .rope = op_rope,
    .kv_store = op_kv_store,
    .attention = op_attention,
    .silu_mul = op_silu_mul,
    .add = op_add,
    .gather_last = op_gather_last,
    .gather_rows = op_gather_rows,
    .scatter_rows = op_scatter_rows,
    .moe_combine = op_moe_combine,
};

/* A failed CUDA call during creation: one line naming the call. */
static ferry_status create_fail(cuda_backend *cb, const char *call, cudaError_t e)
{
    ferry_status st = e == cudaErrorMemoryAllocation ? FERRY_ERR_NOMEM : FERRY_ERR_INTERNAL;
    (void)cudaGetLastError();
    ferry_fail(st, "device 'cuda': %s failed: %s", call, cudaGetErrorString(e));
    cuda_free(&cb->base);
    return st;
}

#define CREATE_TRY(call)                                      \
    do {                                                      \
        cudaError_t e_ = (call);                              \
        if (e_ != cudaSuccess) return create_fail(cb, #call, e_); \
    } while (0)

ferry_status ferry_cuda_backend_create(const backend_opts *opts, backend **out)
{
    (void)opts; /* threads: the CPU backend's; nothing here to size with it */
    *out = NULL;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "device 'cuda': no CUDA device available (%s)",
                          e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports 0 devices");
    }
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "device 'cuda': cannot read the compute capability");
    }
    if (major < 9)
        return ferry_fail(FERRY_ERR_UNSUPPORTED,
                          "device 'cuda': compute capability %d.%d; this build targets 9.0 and newer "
                          "(rebuild with CUDA_ARCH for this GPU)",
                          major, minor);
    cuda_backend *cb = calloc(1, sizeof *cb);
    if (!cb) return ferry_fail(FERRY_ERR_NOMEM, "out of memory creating the CUDA backend");
    cb->base.ops = &k_cuda_ops;
    cuda_ctx *cx = &cb->cx;
    cx->device = 0; /* the first visible device; CUDA_VISIBLE_DEVICES picks it */
    CREATE_TRY(cudaSetDevice(cx->device));
    CREATE_TRY(cudaStreamCreateWithFlags(&cx->compute, cudaStreamNonBlocking));
    CREATE_TRY(cudaStreamCreateWithFlags(&cx->copy, cudaStreamNonBlocking));
    CREATE_TRY(cudaEventCreateWithFlags(&cb->tables_copied, cudaEventDisableTiming));
    cublasStatus_t bs = cublasLtCreate(&cx->lt);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        cx->lt = NULL;
        ferry_fail(FERRY_ERR_INTERNAL, "device 'cuda': cublasLtCreate failed: %s", cublasLtGetStatusString(bs));
        cuda_free(&cb->base);
        return FERRY_ERR_INTERNAL;
    }
    /* scratch now, before the planner reads mem_available */
    cx->lt_ws_bytes = CUDA_WORKSPACE_BYTES;
    cx->mm_x_bytes = CUDA_MM_X_BYTES;
    cx->mm_y_bytes = CUDA_MM_Y_BYTES;
    CREATE_TRY(cudaMalloc(&cx->lt_ws, cx->lt_ws_bytes));
    CREATE_TRY(cudaMalloc(&cx->mm_x, cx->mm_x_bytes));
    CREATE_TRY(cudaMalloc((void **)&cx->mm_y, cx->mm_y_bytes));
    ferry_status st = tables_grow(cb, CUDA_TABLES_MIN);
    if (st != FERRY_OK) {
        cuda_free(&cb->base);
        return st;
    }
    *out = &cb->base;
    return FERRY_OK;
}
