/*
 * sampling.c - see sampling.h.
 */
#include "sampling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "gen_params.h"

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(uint64_t *s)
{
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* Uniform in [0, 1) with 53 random bits. */
static double next_unit(uint64_t *s) { return (double)(next_u64(s) >> 11) * 0x1.0p-53; }

ferry_status sampling_params_check(const sampling_params *p) { return gen_param_check_sampling(p, NULL); }

ferry_status sampler_init(sampler *s, const sampling_params *p, int vocab, uint64_t stream)
{
    memset(s, 0, sizeof *s);
    FERRY_TRY(sampling_params_check(p));
    s->p = *p;
    s->vocab = vocab;
    uint64_t x = p->seed ^ (stream * 0xd1342543de82ef95ull);
    for (int i = 0; i < 4; i++) s->rng[i] = util_splitmix64(&x);
    if (p->temperature > 0) {
        s->idx = malloc((size_t)vocab * sizeof *s->idx);
        s->prob = malloc((size_t)vocab * sizeof *s->prob);
        if (!s->idx || !s->prob) {
            sampler_free(s);
            return ferry_fail(FERRY_ERR_NOMEM, "out of memory for the sampler");
        }
    }
    return FERRY_OK;
}

void sampler_free(sampler *s)
{
    free(s->idx);
    free(s->prob);
    s->idx = NULL;
    s->prob = NULL;
}

int32_t sample_argmax(const float *logits, int vocab)
{
    int32_t best = 0;
    for (int i = 1; i < vocab; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

/* Sort order: higher logit first, lower id first among equals. */
static _Thread_local const float *t_logits;

static int before(const float *l, int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); }

static int cmp_desc(const void *pa, const void *pb)
{
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    if (a == b) return 0;
    return before(t_logits, a, b) ? -1 : 1;
}

/* Moves the k best candidates of idx[0..n) to the front (quickselect). */
static void select_top(const float *l, int32_t *idx, int n, int k)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int32_t pivot = idx[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (before(l, idx[i], pivot)) i++;
            while (before(l, pivot, idx[j])) j--;
            if (i <= j) {
                int32_t t = idx[i];
                idx[i] = idx[j];
                idx[j] = t;
                i++;
                j--;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

int32_t sampler_next(sampler *s, const float *logits)
{
    if (s->p.temperature <= 0) return sample_argmax(logits, s->vocab);
    int n = s->vocab;
    for (int i = 0; i < n; i++) s->idx[i] = i;
    if (s->p.top_k > 0 && s->p.top_k < n) {
        select_top(logits, s->idx, n, s->p.top_k);
        /* like transformers' TopKLogitsWarper, keep every token tied with
         * the k-th logit: the k best are idx[0..k), so their minimum is it */
        int k = s->p.top_k;
        float kth = logits[s->idx[0]];
        for (int i = 1; i < k; i++)
            if (logits[s->idx[i]] < kth) kth = logits[s->idx[i]];
        for (int i = k; i < n; i++)
            if (logits[s->idx[i]] == kth) {
                int32_t t = s->idx[k];
                s->idx[k++] = s->idx[i];
                s->idx[i] = t;
            }
        n = k;
    }
    t_logits = logits;
    qsort(s->idx, (size_t)n, sizeof *s->idx, cmp_desc);
    /* softmax of logits / T over the candidates, in double for stability */
    double mx = logits[s->idx[0]], sum = 0;
    for (int i = 0; i < n; i++) {
        s->prob[i] = (float)exp(((double)logits[s->idx[i]] - mx) / s->p.temperature);
        sum += s->prob[i];
    }
    if (s->p.top_p < 1) {
        double cum = 0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += s->prob[i] / sum;
            if (cum >= s->p.top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
        sum = 0;
        for (int i = 0; i < n; i++) sum += s->prob[i];
    }
    double u = next_unit(s->rng) * sum, cum = 0;
    for (int i = 0; i < n; i++) {
        cum += s->prob[i];
        if (u < cum) return s->idx[i];
    }
    return s->idx[n - 1];
}
