/*
 * cpu_backend.c - the CPU backend: memory is host RAM, "upload" is memcpy,
 * ops run on the calling thread plus the worker pool. The heavy kernels live
 * in cpu_matmul.c and cpu_attention.c; the light element-wise ones are here.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../base/fault.h"
#include "../base/util.h"
#include "cpu.h"

float *cpu_scratch_get(cpu_backend *cb, int worker, size_t n)
{
    cpu_scratch *s = &cb->scratch[worker];
    if (s->cap < n) {
        float *p = realloc(s->buf, n * sizeof *p);
        if (!p) return NULL;
        s->buf = p;
        s->cap = n;
    }
    return s->buf;
}

/* ---- memory ------------------------------------------------------------ */

#define HUGE_PAGE (2u << 20)

/* Large buffers (weights, KV cache) are 2 MiB aligned and ask for
 * transparent huge pages: a decode step streams gigabytes through them, and
 * 4 KiB pages would cost a TLB miss and a prefetcher restart every 4 KiB. */
static void *cpu_mem(size_t bytes)
{
    void *p = NULL;
    if (bytes >= 2 * HUGE_PAGE) {
        size_t n = (bytes + HUGE_PAGE - 1) & ~(size_t)(HUGE_PAGE - 1);
        if (posix_memalign(&p, HUGE_PAGE, n) != 0) return NULL;
        madvise(p, n, MADV_HUGEPAGE);
        return p;
    }
    /* page-aligned: staging slots receive O_DIRECT reads */
    if (posix_memalign(&p, bytes >= 4096 ? 4096 : 64, bytes ? bytes : 64) != 0) return NULL;
    return p;
}

static void *cpu_alloc(backend *be, size_t bytes)
{
    (void)be;
    return fault_hit(FAULT_DEV_ALLOC) ? NULL : cpu_mem(bytes);
}

static void cpu_release(backend *be, void *p)
{
    (void)be;
    free(p);
}

static void cpu_copy(backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    memcpy(dst, src, bytes);
}

static void cpu_sync(backend *be) { (void)be; }

/* Host and device are the same RAM: host buffers are backend buffers. */
static void *cpu_host_alloc(backend *be, size_t bytes, bool *pinned)
{
    (void)be;
    *pinned = false;
    return fault_hit(FAULT_HOST_ALLOC) ? NULL : cpu_mem(bytes);
}

static void cpu_host_free(backend *be, void *p, size_t bytes, bool pinned)
{
    (void)bytes;
    (void)pinned;
    cpu_release(be, p);
}

/* Ops complete before they return, so an event has nothing to wait for. */
struct be_event {
    int unused;
};
static be_event k_cpu_event;

static be_event *cpu_event_create(backend *be)
{
    (void)be;
    return &k_cpu_event;
}
static void cpu_event_destroy(backend *be, be_event *ev) { (void)be, (void)ev; }
static void cpu_event_record(backend *be, be_event *ev, be_stream s) { (void)be, (void)ev, (void)s; }
static void cpu_stream_wait(backend *be, be_stream s, be_event *ev) { (void)be, (void)ev, (void)s; }
static void cpu_event_sync(backend *be, be_event *ev) { (void)be, (void)ev; }

static uint64_t cpu_mem_available(backend *be)
{
    (void)be;
    return util_mem_available();
}

static ferry_status cpu_set_batch(backend *be, const batch *b)
{
    cpu_backend *cb = (cpu_backend *)be;
    if (cb->seq_of_cap < b->n_tokens) {
        int *p = realloc(cb->seq_of, (size_t)b->n_tokens * sizeof *p);
        if (!p) return ferry_fail(FERRY_ERR_NOMEM, "out of memory for a batch of %d tokens", b->n_tokens);
        cb->seq_of = p;
        cb->seq_of_cap = b->n_tokens;
    }
    for (int s = 0; s < b->n_seqs; s++)
        for (int i = 0; i < b->seqs[s].n_tokens; i++) cb->seq_of[b->seqs[s].first + i] = s;
    cb->b = b;
    return FERRY_OK;
}

/* ---- element-wise and row ops ----------------------------------------- */

static void cpu_embed(backend *be, float *out, const weight *table)
{
    cpu_backend *cb = (cpu_backend *)be;
    const batch *b = cb->b;
    for (int i = 0; i < b->n_tokens; i++)
        cpu_row_to_f32(out + (size_t)i * (size_t)table->cols, table, b->tokens[i], 0, table->cols);
}

static void cpu_convert(backend *be, float *out, const weight *w)
{
    (void)be;
    for (int64_t r = 0; r < w->rows; r++) cpu_row_to_f32(out + r * w->cols, w, r, 0, w->cols);
}

typedef struct {
    float *out;
    const float *x;
    const weight *w;
    int n, dim, rows_per_task;
    float eps;
    cpu_backend *cb;
} norm_ctx;

static void norm_task(void *vctx, int task, int worker)
{
    norm_ctx *c = vctx;
    float *wf = cpu_scratch_get(c->cb, worker, (size_t)c->dim);
    FERRY_ASSERT(wf);
    cpu_row_to_f32(wf, c->w, 0, 0, c->dim);
    int r1 = (task + 1) * c->rows_per_task < c->n ? (task + 1) * c->rows_per_task : c->n;
    for (int r = task * c->rows_per_task; r < r1; r++) {
        const float *x = c->x + (size_t)r * (size_t)c->dim;
        float *o = c->out + (size_t)r * (size_t)c->dim;
        double ss = 0; /* in double: a float sum over 4096+ elements drifts by ~1e-6 */
        for (int i = 0; i < c->dim; i++) ss += (double)x[i] * x[i];
        float inv = (float)(1.0 / sqrt(ss / c->dim + c->eps));
        for (int i = 0; i < c->dim; i++) o[i] = wf[i] * (x[i] * inv);
    }
}

static void cpu_rmsnorm(backend *be, float *out, const float *x, const weight *w, int n, int dim, float eps)
{
    cpu_backend *cb = (cpu_backend *)be;
    int tasks = pool_size(cb->pool) * 2;
    int per = (n + tasks - 1) / tasks;
    if (per < 8) per = 8;
    norm_ctx c = {out, x, w, n, dim, per, eps, cb};
    pool_run(cb->pool, (n + per - 1) / per, norm_task, &c);
}

/* Hugging Face rotate_half: pairs (i, i + head_dim/2) rotate by pos * inv_freq[i]. */
static void cpu_rope(backend *be, float *x, int heads, int head_dim, const float *inv_freq, float attn_scale)
{
    cpu_backend *cb = (cpu_backend *)be;
    const batch *b = cb->b;
    int half = head_dim / 2;
    float *cs = cpu_scratch_get(cb, 0, (size_t)head_dim);
    FERRY_ASSERT(cs);
    /* the angles in float32, as transformers computes them, so that long
     * contexts match it rather than exact angles; cos and sin of those are
     * taken in double and rounded, then scaled in float32 as transformers
     * scales its float32 cos and sin */
    for (int t = 0; t < b->n_tokens; t++) {
        float p = (float)b->pos[t];
        for (int i = 0; i < half; i++) {
            float ang = p * inv_freq[i];
            cs[i] = (float)cos((double)ang) * attn_scale;
            cs[half + i] = (float)sin((double)ang) * attn_scale;
        }
        for (int h = 0; h < heads; h++) {
            float *v = x + ((size_t)t * (size_t)heads + (size_t)h) * (size_t)head_dim;
            for (int i = 0; i < half; i++) {
                float a = v[i], bb = v[half + i];
                v[i] = a * cs[i] - bb * cs[half + i];
                v[half + i] = bb * cs[i] + a * cs[half + i];
            }
        }
    }
}

/* Rows go to their sequence's blocks (kv.h): a run of rows is copied at
 * once up to the end of a block. */
static void cpu_kv_store(backend *be, const kv_layer *kv, const float *k, const float *v)
{
    cpu_backend *cb = (cpu_backend *)be;
    const batch *b = cb->b;
    size_t row = (size_t)kv->kv_dim;
    for (int s = 0; s < b->n_seqs; s++) {
        const batch_seq *q = &b->seqs[s];
        FERRY_ASSERT(q->kv_seq < kv->n_seqs && q->n_past + q->n_tokens <= kv->max_blocks * kv->block_size);
        for (int i = 0; i < q->n_tokens;) {
            int pos = q->n_past + i;
            int run = kv->block_size - pos % kv->block_size;
            if (run > q->n_tokens - i) run = q->n_tokens - i;
            size_t dst = kv_row(kv, q->kv_seq, pos) * row, src = (size_t)(q->first + i) * row;
            memcpy(kv->k + dst, k + src, (size_t)run * row * sizeof(float));
            memcpy(kv->v + dst, v + src, (size_t)run * row * sizeof(float));
            i += run;
        }
    }
}

static void cpu_silu_mul(backend *be, float *gate, const float *up, size_t n)
{
    (void)be;
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

static void cpu_add(backend *be, float *x, const float *y, size_t n)
{
    (void)be;
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

static void cpu_gather_last(backend *be, float *out, const float *x, int dim)
{
    cpu_backend *cb = (cpu_backend *)be;
    const batch *b = cb->b;
    for (int s = 0; s < b->n_seqs; s++) {
        int last = b->seqs[s].first + b->seqs[s].n_tokens - 1;
        memcpy(out + (size_t)s * (size_t)dim, x + (size_t)last * (size_t)dim, (size_t)dim * sizeof(float));
    }
}

/* ---- mixture of experts: rows gathered, scattered, combined -------------- */

typedef enum { ROWS_GATHER, ROWS_SCATTER, ROWS_COMBINE } rows_op;

typedef struct {
    rows_op op;
    float *out;
    const float *x;
    const int32_t *idx;  /* gather: source rows; scatter: destination rows */
    const float *scale;  /* scatter */
    int n, k, dim, rows_per_task;
} rows_ctx;

static void rows_task(void *vctx, int task, int worker)
{
    (void)worker;
    const rows_ctx *c = vctx;
    size_t dim = (size_t)c->dim;
    int r1 = (task + 1) * c->rows_per_task < c->n ? (task + 1) * c->rows_per_task : c->n;
    for (int i = task * c->rows_per_task; i < r1; i++) {
        switch (c->op) {
        case ROWS_GATHER:
            memcpy(c->out + (size_t)i * dim, c->x + (size_t)c->idx[i] * dim, dim * sizeof(float));
            break;
        case ROWS_SCATTER: {
            float *o = c->out + (size_t)c->idx[i] * dim, s = c->scale[i];
            const float *y = c->x + (size_t)i * dim;
            for (size_t d = 0; d < dim; d++) o[d] = y[d] * s;
            break;
        }
        case ROWS_COMBINE: {
            float *o = c->out + (size_t)i * dim;
            const float *y = c->x + (size_t)i * (size_t)c->k * dim;
            for (size_t d = 0; d < dim; d++) {
                float sum = y[d];
                for (int j = 1; j < c->k; j++) sum += y[(size_t)j * dim + d];
                o[d] += sum;
            }
            break;
        }
        }
    }
}

static void run_rows(cpu_backend *cb, rows_ctx *c)
{
    if (c->n <= 0) return;
    int tasks = pool_size(cb->pool) * 2;
    int per = (c->n + tasks - 1) / tasks;
    if (per < 4) per = 4;
    c->rows_per_task = per;
    pool_run(cb->pool, (c->n + per - 1) / per, rows_task, c);
}

static void cpu_gather_rows(backend *be, float *out, const float *x, const int32_t *rows, int n, int dim)
{
    run_rows((cpu_backend *)be, &(rows_ctx){.op = ROWS_GATHER, .out = out, .x = x, .idx = rows, .n = n, .dim = dim});
}

static void cpu_scatter_rows(backend *be, float *out, const float *y, const int32_t *dest, const float *scale, int n,
                             int dim)
{
    run_rows((cpu_backend *)be,
             &(rows_ctx){.op = ROWS_SCATTER, .out = out, .x = y, .idx = dest, .scale = scale, .n = n, .dim = dim});
}

static void cpu_moe_combine(backend *be, float *x, const float *y, int n, int k, int dim)
{
    run_rows((cpu_backend *)be, &(rows_ctx){.op = ROWS_COMBINE, .out = x, .x = y, .n = n, .k = k, .dim = dim});
}

static void cpu_free(backend *be)
{
    cpu_backend *cb = (cpu_backend *)be;
    pool_free(cb->pool);
    for (int i = 0; i < CPU_MAX_WORKERS; i++) free(cb->scratch[i].buf);
    free(cb->seq_of);
    free(cb->xq);
    free(cb->xd);
    free(cb->xb);
    free(cb->xs);
    free(cb);
}

static const char *cpu_kernels(backend *be)
{
    cpu_backend *cb = (cpu_backend *)be;
    return cb->act == CPU_ACT_INT8 ? "avx512+int8" : cb->act == CPU_ACT_BF16 ? "avx512+bf16" : cpu_isa_name(cb->isa);
}

static const struct backend_ops k_cpu_ops = {
    .name = "cpu",
    .kernels = cpu_kernels,
    .free = cpu_free,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_copy,
    .download = cpu_copy,
    .sync = cpu_sync,
    .unified = true,
    .gguf_blocks = true,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .copy_async = cpu_copy,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait = cpu_stream_wait,
    .event_sync = cpu_event_sync,
    .mem_available = cpu_mem_available,
    .set_batch = cpu_set_batch,
    .embed = cpu_embed,
    .convert = cpu_convert,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .silu_mul = cpu_silu_mul,
    .add = cpu_add,
    .gather_last = cpu_gather_last,
    .gather_rows = cpu_gather_rows,
    .scatter_rows = cpu_scatter_rows,
    .moe_combine = cpu_moe_combine,
};

ferry_status cpu_backend_create(const backend_opts *opts, backend **out)
{
    *out = NULL;
    cpu_isa isa;
    cpu_act act;
    FERRY_TRY(cpu_isa_choose(opts ? opts->isa : NULL, &isa));
    FERRY_TRY(cpu_activations_choose(opts ? opts->activations : NULL, isa, &act));
    cpu_backend *cb = calloc(1, sizeof *cb);
    if (!cb) return ferry_fail(FERRY_ERR_NOMEM, "out of memory creating the CPU backend");
    cb->isa = isa;
    cb->act = act;
    int threads = opts && opts->threads > 0 ? opts->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads > CPU_MAX_WORKERS) threads = CPU_MAX_WORKERS;
    cb->pool = pool_create(threads);
    if (!cb->pool) {
        free(cb);
        return ferry_fail(FERRY_ERR_NOMEM, "could not start the CPU worker threads");
    }
    cb->base.ops = &k_cpu_ops;
    *out = &cb->base;
    return FERRY_OK;
}
