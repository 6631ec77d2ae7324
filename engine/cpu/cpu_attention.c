/*
 * cpu_attention.c - causal attention of a batch's query rows against the KV
 * cache, parallel over (token, head) pairs.
 *
 * Token i of sequence s sits at position p = pos[i] and sees cache positions
 * [lo, p] of its KV sequence, where lo = 0, or p - window + 1 with a sliding
 * window (Mistral: a key is visible while p - k < window); each position's
 * row is found through the sequence's block table (kv.h), in the same order
 * and with the same arithmetic as a contiguous cache. The new K/V rows were
 * stored by kv_store before this runs, so prefill rows also see each other.
 * Query head h reads KV head h / (n_heads / n_kv_heads) (grouped-query).
 */
#include <math.h>
#include <string.h>

#include "cpu.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

static inline float dot(const float *a, const float *b, int n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int e = 0;
    for (; e + 16 <= n; e += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + e), _mm256_loadu_ps(b + e), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + e + 8), _mm256_loadu_ps(b + e + 8), s1);
    }
    for (; e + 8 <= n; e += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + e), _mm256_loadu_ps(b + e), s0);
    s0 = _mm256_add_ps(s0, s1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float r = _mm_cvtss_f32(h);
    for (; e < n; e++) r += a[e] * b[e];
    return r;
}

/* o += w * v */
static inline void axpy(float *o, float w, const float *v, int n)
{
    __m256 wv = _mm256_set1_ps(w);
    int e = 0;
    for (; e + 8 <= n; e += 8) _mm256_storeu_ps(o + e, _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + e), _mm256_loadu_ps(o + e)));
    for (; e < n; e++) o[e] += w * v[e];
}
#else
static inline float dot(const float *a, const float *b, int n)
{
    float r = 0;
    for (int e = 0; e < n; e++) r += a[e] * b[e];
    return r;
}

static inline void axpy(float *o, float w, const float *v, int n)
{
    for (int e = 0; e < n; e++) o[e] += w * v[e];
}
#endif

typedef struct {
    float *out;
    const float *q;
    const kv_layer *kv;
    const attn_shape *shape;
    cpu_backend *cb;
} att_ctx;

static void att_task(void *vctx, int task, int worker)
{
    att_ctx *c = vctx;
    const attn_shape *sh = c->shape;
    const batch *b = c->cb->b;
    int tok = task / sh->n_heads, h = task % sh->n_heads;
    int hd = sh->head_dim, g = h / (sh->n_heads / sh->n_kv_heads);
    const batch_seq *s = &b->seqs[c->cb->seq_of[tok]];
    int p = b->pos[tok];
    int lo = sh->sliding_window > 0 && p - sh->sliding_window + 1 > 0 ? p - sh->sliding_window + 1 : 0;
    int n = p - lo + 1;
    const float *qv = c->q + (size_t)tok * (size_t)sh->n_heads * (size_t)hd + (size_t)h * (size_t)hd;
    const kv_layer *kv = c->kv;
    size_t row = (size_t)kv->kv_dim;
    const float *kbase = kv->k + (size_t)g * (size_t)hd, *vbase = kv->v + (size_t)g * (size_t)hd;
    float *score = cpu_scratch_get(c->cb, worker, (size_t)n);
    FERRY_ASSERT(score);
    float scale = 1.0f / sqrtf((float)hd);
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) {
        float d = dot(qv, kbase + kv_row(kv, s->kv_seq, lo + j) * row, hd) * scale;
        score[j] = d;
        if (d > mx) mx = d;
    }
    float sum = 0;
    for (int j = 0; j < n; j++) {
        score[j] = expf(score[j] - mx);
        sum += score[j];
    }
    float inv = 1.0f / sum;
    float *o = c->out + (size_t)tok * (size_t)sh->n_heads * (size_t)hd + (size_t)h * (size_t)hd;
    memset(o, 0, (size_t)hd * sizeof *o);
    for (int j = 0; j < n; j++) {
        axpy(o, score[j] * inv, vbase + kv_row(kv, s->kv_seq, lo + j) * row, hd);
    }
}

void cpu_attention(backend *be, float *out, const float *q, const kv_layer *kv, const attn_shape *shape)
{
    cpu_backend *cb = (cpu_backend *)be;
    const batch *b = cb->b;
    FERRY_ASSERT(b && shape->n_heads % shape->n_kv_heads == 0);
    att_ctx c = {out, q, kv, shape, cb};
    pool_run(cb->pool, b->n_tokens * shape->n_heads, att_task, &c);
}
