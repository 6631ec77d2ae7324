/*
 * test_sampling.c - next-token choice (engine/sampling.h).
 *
 * Covers: greedy argmax and its tie rule; temperature 0 ignoring the seed;
 * determinism per (seed, stream) and independence across them; top_k and
 * top_p cutting the candidate set (checked by what can never be drawn, and
 * by the renormalised frequencies); a frequency test of plain sampling; and
 * parameter validation naming the bad parameter.
 */
#include <math.h>
#include <stdlib.h>

#include "../../engine/sampling.h"
#include "check.h"

static sampling_params params(float temperature, int top_k, float top_p, uint64_t seed)
{
    return (sampling_params){.temperature = temperature, .top_k = top_k, .top_p = top_p, .seed = seed};
}

/* Draws n tokens and counts them per id (counts has vocab entries). */
static void draw(const sampling_params *p, uint64_t stream, const float *logits, int vocab, int n, int *counts)
{
    sampler s;
    ferry_status st = sampler_init(&s, p, vocab, stream);
    if (st != FERRY_OK) {
        fprintf(stderr, "sampler_init: %s\n", ferry_errmsg());
        exit(2);
    }
    memset(counts, 0, (size_t)vocab * sizeof *counts);
    for (int i = 0; i < n; i++) {
        int32_t t = sampler_next(&s, logits);
        if (t < 0 || t >= vocab) {
            fprintf(stderr, "sampler_next returned %d for vocab %d\n", t, vocab);
            exit(2);
        }
        counts[t]++;
    }
    sampler_free(&s);
}

/* logits log([0.5, 0.3, 0.2]) */
static float k_l3[3];

static void check_freq(const int *counts, int n, const double *want, int vocab, double tol, int line)
{
    for (int i = 0; i < vocab; i++) {
        double f = (double)counts[i] / n;
        check_count++;
        if (fabs(f - want[i]) > tol) {
            fprintf(stderr, "%s:%d: token %d drawn with frequency %.4f, expected %.4f +- %.3f\n", __FILE__, line, i,
                    f, want[i], tol);
            check_failures++;
        }
    }
}

static void test_argmax(void)
{
    const float a[] = {1, 3, 3, 2};
    const float b[] = {-3, -1, -2};
    const float c[] = {0, 0, 0, 0, 0};
    const float d[] = {5};
    const float e[] = {-INFINITY, -1e30f, -INFINITY};
    CHECK_EQ_INT(sample_argmax(a, 4), 1);
    CHECK_EQ_INT(sample_argmax(b, 3), 1);
    CHECK_EQ_INT(sample_argmax(c, 5), 0);
    CHECK_EQ_INT(sample_argmax(d, 1), 0);
    CHECK_EQ_INT(sample_argmax(e, 3), 1);
}

static void test_greedy(void)
{
    const float l[] = {0.1f, 2.0f, 2.0f, -1.0f, 1.9f};
    for (uint64_t seed = 0; seed < 5; seed++) {
        sampling_params p = params(0, 0, 1, seed * 0x9e3779b97f4a7c15ull);
        sampler s;
        CHECK_STATUS(sampler_init(&s, &p, 5, seed), FERRY_OK);
        for (int i = 0; i < 20; i++) CHECK_EQ_INT(sampler_next(&s, l), 1);
        sampler_free(&s);
    }
}

static void test_determinism(void)
{
    enum { V = 32, N = 200 };
    float l[V];
    for (int i = 0; i < V; i++) l[i] = 0.1f * (float)(i % 7);
    sampling_params p = params(1.0f, 0, 1, 42);
    sampler a, b, c, d;
    CHECK_STATUS(sampler_init(&a, &p, V, 0), FERRY_OK);
    CHECK_STATUS(sampler_init(&b, &p, V, 0), FERRY_OK);
    CHECK_STATUS(sampler_init(&c, &p, V, 1), FERRY_OK);
    sampling_params p2 = params(1.0f, 0, 1, 43);
    CHECK_STATUS(sampler_init(&d, &p2, V, 0), FERRY_OK);
    int same = 0, same_stream = 0, same_seed = 0;
    for (int i = 0; i < N; i++) {
        int32_t ta = sampler_next(&a, l), tb = sampler_next(&b, l), tc = sampler_next(&c, l), td = sampler_next(&d, l);
        same += ta == tb;
        same_stream += ta == tc;
        same_seed += ta == td;
    }
    CHECK_EQ_INT(same, N);
    /* independent draws over ~32 tokens agree about 1 time in 30 */
    CHECK(same_stream < N / 4);
    CHECK(same_seed < N / 4);
    sampler_free(&a);
    sampler_free(&b);
    sampler_free(&c);
    sampler_free(&d);
}

static void test_cutoffs_greedy(void)
{
    const float l[] = {0.5f, 1.0f, 3.0f, 3.0f, 2.9f, -2.0f};
    int counts[6];
    sampling_params p = params(1.0f, 1, 1, 7);
    draw(&p, 0, l, 6, 500, counts);
    /* top_k = 1 keeps every token tied with the best, as transformers does */
    CHECK_EQ_INT(counts[2] + counts[3], 500);
    CHECK(counts[2] > 0 && counts[3] > 0);
    p = params(1.0f, 0, 1e-6f, 7);
    draw(&p, 3, l, 6, 500, counts);
    CHECK_EQ_INT(counts[2], 500);
    p = params(5.0f, 1, 0.5f, 7);
    draw(&p, 0, k_l3, 3, 500, counts);
    CHECK_EQ_INT(counts[0], 500);
}

static void test_frequencies(void)
{
    enum { N = 20000 };
    int counts[3];
    sampling_params p = params(1.0f, 0, 1, 1234);
    draw(&p, 0, k_l3, 3, N, counts);
    check_freq(counts, N, (const double[]){0.5, 0.3, 0.2}, 3, 0.02, __LINE__);

    /* top_k = 3 or more, and top_p = 1, change nothing */
    p = params(1.0f, 3, 1, 99);
    draw(&p, 5, k_l3, 3, N, counts);
    check_freq(counts, N, (const double[]){0.5, 0.3, 0.2}, 3, 0.02, __LINE__);
    p = params(1.0f, 100, 1, 99);
    draw(&p, 5, k_l3, 3, N, counts);
    check_freq(counts, N, (const double[]){0.5, 0.3, 0.2}, 3, 0.02, __LINE__);

    /* temperature 2 flattens: p ~ sqrt(p), renormalised */
    double z = sqrt(0.5) + sqrt(0.3) + sqrt(0.2);
    p = params(2.0f, 0, 1, 5);
    draw(&p, 0, k_l3, 3, N, counts);
    check_freq(counts, N, (const double[]){sqrt(0.5) / z, sqrt(0.3) / z, sqrt(0.2) / z}, 3, 0.02, __LINE__);

    /* top_k = 2 keeps {0, 1} and renormalises to 0.625 / 0.375 */
    p = params(1.0f, 2, 1, 77);
    draw(&p, 0, k_l3, 3, N, counts);
    CHECK_EQ_INT(counts[2], 0);
    check_freq(counts, N, (const double[]){0.625, 0.375, 0}, 3, 0.02, __LINE__);

    /* top_p = 0.75: 0.5 < 0.75 <= 0.8, so the two most likely stay */
    p = params(1.0f, 0, 0.75f, 78);
    draw(&p, 0, k_l3, 3, N, counts);
    CHECK_EQ_INT(counts[2], 0);
    check_freq(counts, N, (const double[]){0.625, 0.375, 0}, 3, 0.02, __LINE__);

    /* top_p = 0.4 is reached by the first token alone */
    p = params(1.0f, 0, 0.4f, 79);
    draw(&p, 0, k_l3, 3, 2000, counts);
    CHECK_EQ_INT(counts[0], 2000);
}

/* top_k over a large vocabulary full of ties: the drawn ids are the tokens
 * at least as likely as the k-th best - k of them plus any tied with the
 * k-th, as transformers' TopKLogitsWarper keeps - and no others. */
static int cmp_float_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void test_top_k_large(void)
{
    enum { V = 1000 };
    static float l[V], sorted[V];
    static int counts[V];
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < V; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        l[i] = (float)(x % 50) * 0.1f; /* 50 distinct values: many ties */
    }
    memcpy(sorted, l, sizeof l);
    qsort(sorted, V, sizeof *sorted, cmp_float_desc);
    static const int ks[] = {1, 2, 5, 17, 40, 999};
    for (size_t j = 0; j < sizeof ks / sizeof ks[0]; j++) {
        int k = ks[j];
        /* a huge temperature makes every kept candidate about equally likely */
        int keep = 0;
        for (int i = 0; i < V; i++) keep += l[i] >= sorted[k - 1];
        sampling_params p = params(1e6f, k, 1, (uint64_t)k);
        draw(&p, 0, l, V, 40 * keep + 200, counts);
        int distinct = 0, below = 0;
        for (int i = 0; i < V; i++) {
            if (!counts[i]) continue;
            distinct++;
            below += l[i] < sorted[k - 1];
        }
        if (distinct != keep || below)
            fprintf(stderr, "top_k=%d: %d distinct tokens drawn (want %d), %d of them below the k-th best logit\n",
                    k, distinct, keep, below);
        CHECK_EQ_INT(distinct, keep);
        CHECK_EQ_INT(below, 0);
    }
}

static void test_params_check(void)
{
    sampling_params p = params(0.7f, 40, 0.9f, 1);
    CHECK_STATUS(sampling_params_check(&p), FERRY_OK);
    p = params(0, 0, 1, 0);
    CHECK_STATUS(sampling_params_check(&p), FERRY_OK);

    p = params(-1, 0, 1, 0);
    CHECK_STATUS(sampling_params_check(&p), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("temperature");
    p = params(NAN, 0, 1, 0);
    CHECK_STATUS(sampling_params_check(&p), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("temperature");
    p = params(INFINITY, 0, 1, 0);
    CHECK_STATUS(sampling_params_check(&p), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("temperature");
    p = params(1, -1, 1, 0);
    CHECK_STATUS(sampling_params_check(&p), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("top_k");
    p = params(1, 0, 0, 0);
    CHECK_STATUS(sampling_params_check(&p), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("top_p");
    p = params(1, 0, 1.5f, 0);
    CHECK_STATUS(sampling_params_check(&p), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("top_p");
    p = params(1, 0, -0.5f, 0);
    CHECK_STATUS(sampling_params_check(&p), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("top_p");
    p = params(1, 0, NAN, 0);
    CHECK_STATUS(sampling_params_check(&p), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("top_p");

    /* sampler_init refuses what the check refuses */
    sampler s;
    p = params(1, -1, 1, 0);
    CHECK_STATUS(sampler_init(&s, &p, 10, 0), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("top_k");
}

int main(void)
{
    k_l3[0] = logf(0.5f);
    k_l3[1] = logf(0.3f);
    k_l3[2] = logf(0.2f);
    test_argmax();
    test_greedy();
    test_determinism();
    test_cutoffs_greedy();
    test_frequencies();
    test_top_k_large();
    test_params_check();
    return check_report();
}
