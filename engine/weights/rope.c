/*
 * rope.c - rope_theta, rope_scaling and the inverse frequency table. See
 * rope.h.
 *
 * Each formula below follows transformers' modeling_rope_utils.py step by
 * step, so that a long context lands on the angles users of transformers
 * get. What a torch op computes from a float32 tensor and a Python number is
 * a float32 operation with the number rounded to float32 first (comparisons
 * too), and `number / tensor` is reciprocal(tensor) * number (Tensor's
 * __rtruediv__). Python's own arithmetic is double. The Makefile builds this
 * file with -ffp-contract=off: a fused multiply-add would round once where
 * torch rounds twice.
 */
#include "rope.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

const char *rope_type_name(rope_type t)
{
    switch (t) {
    case ROPE_DEFAULT: return "default";
    case ROPE_LINEAR: return "linear";
    case ROPE_LLAMA3: return "llama3";
    case ROPE_YARN: return "yarn";
    }
    return "?";
}

/* ---- config.json --------------------------------------------------------- */

/* A number field of the scaling object `field`. *given false when it is
 * absent or null (an error when required); a number that must be positive
 * (`positive`) is checked here, and so is float range, since every one of
 * them ends up in float32 arithmetic. */
static ferry_status get_num(const json_value *obj, const char *label, const char *field, const char *type,
                            const char *key, bool required, bool positive, double *out, bool *given)
{
    bool bad = false;
    *given = json_get_num(obj, key, out, &bad);
    if (bad) return ferry_fail(FERRY_ERR_INVALID, "%s: %s.%s must be a number", label, field, key);
    if (!*given) {
        if (required)
            return ferry_fail(FERRY_ERR_INVALID, "%s: %s of type '%s' needs '%s'", label, field, type, key);
        return FERRY_OK;
    }
    /* the kernels compute in float: a value below FLT_MIN (1e-320) would be 0
     * there, and a factor of 0 divides every frequency into inf */
    if (!isfinite(*out) || fabs(*out) > 3.0e38 || (*out != 0 && fabs(*out) < FLT_MIN) || (positive && !(*out > 0)))
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s.%s = %g must be a %snumber within float range (%g..%g)", label,
                          field, key, *out, positive ? "positive " : "", (double)FLT_MIN, 3.0e38);
    return FERRY_OK;
}

/* original_max_position_embeddings: a positive integer. */
static ferry_status get_orig_max(const json_value *obj, const char *label, const char *field, const char *type,
                                 bool required, int def, int *out)
{
    int64_t v;
    bool bad = false;
    const char *key = "original_max_position_embeddings";
    if (!json_get_int(obj, key, &v, &bad)) {
        if (bad) return ferry_fail(FERRY_ERR_INVALID, "%s: %s.%s must be an integer", label, field, key);
        if (required)
            return ferry_fail(FERRY_ERR_INVALID, "%s: %s of type '%s' needs '%s'", label, field, type, key);
        *out = def;
        return FERRY_OK;
    }
    if (v <= 0 || v > (1 << 30))
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s.%s = %lld is out of range (1..%d)", label, field, key,
                          (long long)v, 1 << 30);
    *out = (int)v;
    return FERRY_OK;
}

/* transformers' get_mscale (inside _compute_yarn_parameters). */
static double yarn_mscale(double scale, double mscale)
{
    if (scale <= 1) return 1.0;
    return 0.1 * mscale * log(scale) + 1.0;
}

static ferry_status parse_yarn(const json_value *s, const char *label, const char *field, int max_pos,
                               rope_config *rc)
{
    bool given;
    double attention, mscale = 0, mscale_all_dim = 0, beta;
    if (rc->theta == 1.0) /* the correction range divides by log(theta) */
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s of type 'yarn' needs rope_theta other than 1", label, field);
    FERRY_TRY(get_orig_max(s, label, field, "yarn", false, max_pos, &rc->original_max_pos));
    /* `get("beta_fast") or 32`: absent, null and 0 all mean the default */
    FERRY_TRY(get_num(s, label, field, "yarn", "beta_fast", false, false, &beta, &given));
    rc->beta_fast = given && beta != 0 ? beta : 32;
    FERRY_TRY(get_num(s, label, field, "yarn", "beta_slow", false, false, &beta, &given));
    rc->beta_slow = given && beta != 0 ? beta : 1;
    if (!(rc->beta_fast > 0) || !(rc->beta_slow > 0))
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s.beta_fast and beta_slow must be positive (rotations)", label,
                          field);
    /* `get("truncate", True)`: absent is true; null is falsy in Python */
    const json_value *t = json_get(s, "truncate");
    if (t && t->type != JSON_BOOL && t->type != JSON_NULL)
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s.truncate must be true or false", label, field);
    rc->truncate = !t || (t->type == JSON_BOOL && t->boolean);

    FERRY_TRY(get_num(s, label, field, "yarn", "attention_factor", false, true, &attention, &given));
    if (given) {
        rc->attention_factor = attention;
        return FERRY_OK;
    }
    bool has_m, has_all;
    FERRY_TRY(get_num(s, label, field, "yarn", "mscale", false, false, &mscale, &has_m));
    FERRY_TRY(get_num(s, label, field, "yarn", "mscale_all_dim", false, false, &mscale_all_dim, &has_all));
    if (has_m && has_all && mscale != 0 && mscale_all_dim != 0) { /* `if mscale and mscale_all_dim` */
        double den = yarn_mscale(rc->factor, mscale_all_dim);
        if (den == 0)
            return ferry_fail(FERRY_ERR_INVALID, "%s: %s.mscale_all_dim = %g makes the attention factor divide by "
                              "zero", label, field, mscale_all_dim);
        rc->attention_factor = yarn_mscale(rc->factor, mscale) / den;
    } else {
        rc->attention_factor = yarn_mscale(rc->factor, 1);
    }
    if (!isfinite(rc->attention_factor) || !(rc->attention_factor > 0) || rc->attention_factor > 3.0e38)
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s: the attention factor from factor, mscale and mscale_all_dim "
                          "is %g (it must be positive)", label, field, rc->attention_factor);
    return FERRY_OK;
}

/* The scaling object: transformers v5 takes rope_scaling when one is given
 * (a non-empty object), else rope_parameters; v4 reads rope_scaling only
 * and names its type "rope_type" or, in older configs, "type". */
static ferry_status parse_scaling(const json_value *s, const char *label, const char *field, int max_pos,
                                  rope_config *rc)
{
    bool bad = false, given;
    const char *type = json_get_str(s, "rope_type", &bad);
    if (!type && !bad) type = json_get_str(s, "type", &bad);
    if (bad) return ferry_fail(FERRY_ERR_INVALID, "%s: %s.rope_type must be a string", label, field);
    double partial;
    FERRY_TRY(get_num(s, label, field, "", "partial_rotary_factor", false, false, &partial, &given));
    if (given && partial != 1.0)
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: %s.partial_rotary_factor must be 1 (partial RoPE is not "
                          "supported)", label, field);
    if (!type) {
        /* rope_parameters carries rope_theta alone for plain RoPE */
        if (!strcmp(field, "rope_parameters")) return FERRY_OK;
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s has no 'rope_type' (or 'type')", label, field);
    }
    if (!strcmp(type, "default")) return FERRY_OK;
    if (!strcmp(type, "linear")) rc->type = ROPE_LINEAR;
    else if (!strcmp(type, "llama3")) rc->type = ROPE_LLAMA3;
    else if (!strcmp(type, "yarn")) rc->type = ROPE_YARN;
    else
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: %s type '%s' is not supported (supported: default, linear, "
                          "llama3, yarn)", label, field, type);
    FERRY_TRY(get_num(s, label, field, type, "factor", true, true, &rc->factor, &given));
    switch (rc->type) {
    case ROPE_LLAMA3:
        FERRY_TRY(get_num(s, label, field, type, "low_freq_factor", true, true, &rc->low_freq_factor, &given));
        FERRY_TRY(get_num(s, label, field, type, "high_freq_factor", true, true, &rc->high_freq_factor, &given));
        /* transformers only warns; equal factors divide by zero in the blend */
        if (!(rc->high_freq_factor > rc->low_freq_factor))
            return ferry_fail(FERRY_ERR_INVALID, "%s: %s.high_freq_factor (%g) must be greater than low_freq_factor "
                              "(%g)", label, field, rc->high_freq_factor, rc->low_freq_factor);
        return get_orig_max(s, label, field, type, true, 0, &rc->original_max_pos);
    case ROPE_YARN:
        return parse_yarn(s, label, field, max_pos, rc);
    default:
        return FERRY_OK;
    }
}

ferry_status rope_config_parse(const json_value *root, const char *label, int max_pos, rope_config *rc)
{
    *rc = (rope_config){.type = ROPE_DEFAULT, .theta = 10000.0, .factor = 1, .attention_factor = 1,
                        .truncate = true};
    const json_value *scaling = json_get(root, "rope_scaling"), *params = json_get(root, "rope_parameters");
    if (scaling && scaling->type != JSON_NULL && scaling->type != JSON_OBJECT)
        return ferry_fail(FERRY_ERR_INVALID, "%s: field 'rope_scaling' must be an object or null", label);
    if (params && params->type != JSON_NULL && params->type != JSON_OBJECT)
        return ferry_fail(FERRY_ERR_INVALID, "%s: field 'rope_parameters' must be an object or null", label);
    bool use_scaling = scaling && scaling->type == JSON_OBJECT && scaling->len > 0;
    bool use_params = !use_scaling && params && params->type == JSON_OBJECT;

    /* rope_theta at the top level, else inside rope_parameters (v5
     * configs) or the scaling object */
    const json_value *theta_src = root;
    if (!json_get(root, "rope_theta")) {
        if (params && params->type == JSON_OBJECT && json_get(params, "rope_theta")) theta_src = params;
        else if (use_scaling && json_get(scaling, "rope_theta")) theta_src = scaling;
    }
    double theta;
    bool bad = false;
    if (json_get_num(theta_src, "rope_theta", &theta, &bad)) rc->theta = theta;
    else if (bad) return ferry_fail(FERRY_ERR_INVALID, "%s: field 'rope_theta' must be a number", label);
    if (!((float)rc->theta > 0) || !isfinite((float)rc->theta))
        return ferry_fail(FERRY_ERR_INVALID, "%s: field 'rope_theta' = %g must be a positive number within float range",
                          label, rc->theta);

    if (use_scaling) return parse_scaling(scaling, label, "rope_scaling", max_pos, rc);
    if (use_params) return parse_scaling(params, label, "rope_parameters", max_pos, rc);
    return FERRY_OK;
}

/* ---- the frequencies -------------------------------------------------------- */

/* theta^(2i / dim) as torch computes `base ** (arange(0, dim, 2).float() /
 * dim)`: the exponent divided in float32, the power of float32 operands.
 * torch's vectorised pow and glibc's powf (here) are not both correctly
 * rounded: they differ by one ulp in about 1% of entries, a 1e-7 relative
 * difference in an angle. */
static float theta_pow(const rope_config *rc, int i, int dim)
{
    return powf((float)rc->theta, (float)(2 * i) / (float)dim);
}

/* _compute_llama3_parameters, one frequency: `inv` is the default one. */
static float llama3_freq(const rope_config *rc, float inv)
{
    float factor = (float)rc->factor;
    double old = rc->original_max_pos;
    float low_wavelen = (float)(old / rc->low_freq_factor), high_wavelen = (float)(old / rc->high_freq_factor);
    float wavelen = (1.0f / inv) * (float)(2 * M_PI); /* 2 * math.pi / inv_freq */
    float llama = wavelen > low_wavelen ? inv / factor : inv;
    float smooth = ((1.0f / wavelen) * (float)old - (float)rc->low_freq_factor) /
                   (float)(rc->high_freq_factor - rc->low_freq_factor);
    float smoothed = (1.0f - smooth) * llama / factor + smooth * llama;
    bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    return medium ? smoothed : llama;
}

/* find_correction_dim: the dimension whose wavelength makes num_rotations
 * turns over the original context (Python floats). */
static double yarn_correction_dim(const rope_config *rc, double num_rotations, int dim)
{
    return (dim * log(rc->original_max_pos / (num_rotations * 2 * M_PI))) / (2 * log(rc->theta));
}

static void yarn_freqs(const rope_config *rc, int dim, float *inv_freq)
{
    double low = yarn_correction_dim(rc, rc->beta_fast, dim), high = yarn_correction_dim(rc, rc->beta_slow, dim);
    if (rc->truncate) {
        low = floor(low);
        high = ceil(high);
    }
    if (low < 0) low = 0;
    if (high > dim - 1) high = dim - 1;
    if (low == high) high += 0.001; /* linear_ramp_factor's guard against a zero-width ramp */
    float factor = (float)rc->factor, lo = (float)low, width = (float)(high - low);
    for (int i = 0; i < dim / 2; i++) {
        float pos_freq = theta_pow(rc, i, dim);
        float extrapolation = 1.0f / pos_freq, interpolation = 1.0f / (factor * pos_freq);
        float ramp = ((float)i - lo) / width;
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        float extrapolation_factor = 1.0f - ramp;
        inv_freq[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
    }
}

void rope_inv_freq(const rope_config *rc, int head_dim, float *inv_freq)
{
    if (rc->type == ROPE_YARN) {
        yarn_freqs(rc, head_dim, inv_freq);
        return;
    }
    for (int i = 0; i < head_dim / 2; i++) {
        float inv = 1.0f / theta_pow(rc, i, head_dim);
        switch (rc->type) {
        case ROPE_LINEAR: inv /= (float)rc->factor; break;
        case ROPE_LLAMA3: inv = llama3_freq(rc, inv); break;
        default: break;
        }
        inv_freq[i] = inv;
    }
}

float rope_attn_scale(const rope_config *rc) { return (float)rc->attention_factor; }
