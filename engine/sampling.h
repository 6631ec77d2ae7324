/*
 * sampling.h - choosing the next token from logits.
 *
 * Temperature 0 is greedy (argmax; the lowest id wins a tie). Otherwise the
 * Hugging Face order: divide by temperature, keep the top_k most likely
 * (0 = all), keep the smallest most-likely set whose probability reaches
 * top_p (1 = all), renormalise and draw with the sampler's own generator, so
 * that the same seed gives the same tokens.
 */
#ifndef FERRY_SAMPLING_H
#define FERRY_SAMPLING_H

#include <stdint.h>

#include "base/status.h"

typedef struct {
    float temperature;
    int top_k;
    float top_p;
    uint64_t seed;
} sampling_params;

typedef struct {
    sampling_params p;
    uint64_t rng[4]; /* xoshiro256** state */
    int vocab;
    int32_t *idx;    /* [vocab] candidate ids */
    float *prob;     /* [vocab] */
} sampler;

/* Checks ranges (gen_params.def's: temperature in 0..1e30, top_k >= 0,
 * 0 < top_p <= 1) and names the offending parameter. */
ferry_status sampling_params_check(const sampling_params *p);

ferry_status sampler_init(sampler *s, const sampling_params *p, int vocab, uint64_t stream);
void sampler_free(sampler *s);
int32_t sampler_next(sampler *s, const float *logits /* [vocab] */);

int32_t sample_argmax(const float *logits, int vocab);

#endif
