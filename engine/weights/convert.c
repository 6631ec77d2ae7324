/*
 * convert.c - checkpoint tensors to engine tensors. See convert.h.
 */
#include "convert.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"
#include "gguf_quant.h"
#include "quant.h"

/* Names quant.c's output in the offload dir's fingerprint: bump it when a
 * change to the quantizer changes the bits it writes. */
#define QUANTIZER_ID "compressed-tensors-rtn-2"

#define ALIGN_UP(x, a) (((x) + (uint64_t)(a) - 1) & ~((uint64_t)(a) - 1))

ferry_status convert_opts_parse(const char *dtype, const char *quant, bool head, convert_opts *out)
{
    *out = convert_identity();
    if (dtype && *dtype) {
        static const struct {
            const char *name;
            ferry_dtype dt;
        } k[] = {{"f32", DT_F32}, {"f16", DT_F16}, {"bf16", DT_BF16}};
        size_t i = 0;
        while (i < sizeof k / sizeof k[0] && strcmp(k[i].name, dtype)) i++;
        if (i == sizeof k / sizeof k[0])
            return ferry_fail(FERRY_ERR_INVALID, "--weights-dtype must be f32, f16 or bf16 (got '%s')", dtype);
        out->dtype = k[i].dt;
    }
    if (quant && *quant) {
        weight_quant q;
        if (!quant_parse(quant, &q))
            return ferry_fail(FERRY_ERR_INVALID, "--quantize must be none, int8 or int4 (got '%s')", quant);
        out->quant = q;
    }
    if (head && out->quant != WQ_INT8 && out->quant != WQ_INT4)
        return ferry_fail(FERRY_ERR_INVALID, "--quantize-head needs --quantize int8 or int4 (--quantize is %s)",
                          out->quant == CONVERT_KEEP ? "not given" : "none");
    out->head = head;
    return FERRY_OK;
}

void convert_config(const convert_opts *o, model_config *cfg)
{
    if (o->head && cfg->tied) model_config_untie_head(cfg);
}

/* What lm_head becomes: a quantized checkpoint head stays as it is (unless
 * --quantize none dequantizes everything), a full-precision one is int8 on
 * --quantize-head. */
static weight_quant head_quant(const convert_opts *o, const weight *src)
{
    if (src->quant != WQ_NONE) return o->quant == WQ_NONE ? WQ_NONE : src->quant;
    return o->head ? WQ_INT8 : WQ_NONE;
}

/* The int8 of a pack-quantized 8-bit checkpoint is packed four to an int32
 * word, offset by 128: the engine keeps plain int8 (convert_rows repacks). */
static bool packed_int8(const weight *w) { return w->quant == WQ_INT8 && w->dtype == DT_I32; }

ferry_status convert_format(const convert_opts *o, const tensor_entry *e, weight *fmt)
{
    const weight *src = e->dst;
    *fmt = (weight){.rows = src->rows, .cols = src->cols};
    weight_quant q = WQ_NONE;
    if (e->linear) q = o->quant == CONVERT_KEEP ? src->quant : (weight_quant)o->quant;
    else if (e->lm_head) q = head_quant(o, src);
    else if (src->quant == WQ_GGUF && o->quant != WQ_NONE) q = WQ_GGUF; /* a GGUF's embedding table: rows
                                                                          * dequantized as they are gathered */
    if (q == WQ_NONE) {
        fmt->dtype = o->dtype != CONVERT_KEEP ? (ferry_dtype)o->dtype
                     : src->quant == WQ_GGUF  ? DT_F32
                     : src->quant != WQ_NONE  ? src->scale_dtype
                                              : src->dtype;
        return FERRY_OK;
    }
    if (q == WQ_GGUF) { /* a GGUF's blocks stay as stored */
        *fmt = *src;
        fmt->data = NULL;
        return FERRY_OK;
    }
    fmt->quant = q;
    fmt->dtype = q == WQ_INT8 ? DT_I8 : DT_I32;
    if (src->quant == WQ_GGUF) { /* dequantized, then quantized as a full-precision weight is */
        fmt->group = quant_default_group(q, src->cols);
        fmt->scale_dtype = o->dtype != CONVERT_KEEP ? (ferry_dtype)o->dtype : DT_F32;
        return FERRY_OK;
    }
    if (src->quant != WQ_NONE) {
        if (src->quant != q)
            return ferry_fail(FERRY_ERR_UNSUPPORTED,
                              "%s is %s in the checkpoint: it cannot be requantized to %s (quantize the "
                              "full-precision checkpoint, or use --quantize none to dequantize)",
                              e->name, quant_name(src->quant), quant_name(q));
        fmt->group = src->group;
        fmt->scale_dtype = src->scale_dtype; /* a quantized checkpoint's scales stay as they are */
        return FERRY_OK;
    }
    fmt->group = quant_default_group(q, src->cols);
    fmt->scale_dtype = o->dtype != CONVERT_KEEP ? (ferry_dtype)o->dtype : src->dtype;
    return FERRY_OK;
}

uint64_t convert_scales_offset(const weight *fmt)
{
    return ALIGN_UP((uint64_t)fmt->rows * weight_row_bytes(fmt), CONVERT_ALIGN);
}

uint64_t convert_bytes(const weight *fmt)
{
    if (!weight_has_scales(fmt)) return (uint64_t)fmt->rows * weight_row_bytes(fmt);
    return convert_scales_offset(fmt) + (uint64_t)fmt->rows * (uint64_t)weight_groups(fmt) * dtype_size(fmt->scale_dtype);
}

void convert_bind(weight *fmt, const void *base)
{
    fmt->data = base;
    fmt->scales = !weight_has_scales(fmt) ? NULL : (const char *)base + convert_scales_offset(fmt);
}

bool convert_is_copy(const weight *src, const weight *fmt)
{
    if (src->dtype != fmt->dtype || src->quant != fmt->quant) return false;
    if (src->quant == WQ_GGUF) return src->block == fmt->block;
    return src->quant == WQ_NONE || (src->group == fmt->group && src->scale_dtype == fmt->scale_dtype);
}

int64_t convert_piece_rows(const weight *src, const weight *fmt, uint64_t bytes)
{
    /* the largest of a source row, an engine row and the f32 scratch of one */
    uint64_t row = (uint64_t)src->cols * 4;
    if (weight_row_bytes(src) > row) row = weight_row_bytes(src);
    if (weight_row_bytes(fmt) > row) row = weight_row_bytes(fmt);
    int64_t n = (int64_t)(bytes / (row ? row : 1));
    return n < 1 ? 1 : n > src->rows ? src->rows : n;
}

/* ---- the element conversions -------------------------------------------------- */

static void cast_elems(ferry_dtype to, void *dst, ferry_dtype from, const void *src, size_t n)
{
    if (to == from) {
        memcpy(dst, src, n * dtype_size(to));
        return;
    }
    for (size_t i = 0; i < n; i++) dtype_store_f32(to, dst, i, dtype_load_f32(from, src, i));
}

/* One row of a pack-quantized 8-bit weight as plain int8. */
static void unpack_int8_row(const weight *src, int64_t r, int8_t *out)
{
    const uint8_t *b = (const uint8_t *)src->data + (size_t)r * weight_row_bytes(src);
    for (int64_t c = 0; c < src->cols; c++) out[c] = (int8_t)(b[c] ^ 0x80u); /* q + 128 -> q */
}

ferry_status convert_rows(const weight *src, const weight *fmt, int64_t r0, int64_t n, void *data_out,
                          void *scales_out, const char *name)
{
    size_t src_row = weight_row_bytes(src), out_row = weight_row_bytes(fmt);
    size_t n_scales = (size_t)weight_groups(src) * (size_t)n;
    const char *sdata = (const char *)src->data + (size_t)r0 * src_row;

    if (src->quant == WQ_GGUF) {
        if (fmt->quant == WQ_GGUF) {
            memcpy(data_out, sdata, (size_t)n * src_row);
            return FERRY_OK;
        }
        /* the blocks to f32 (gguf_quant.h), then converted as an f32 weight */
        float *f = malloc((size_t)n * (size_t)src->cols * sizeof *f);
        if (!f) return ferry_fail(FERRY_ERR_NOMEM, "out of memory converting %s", name);
        for (int64_t r = 0; r < n; r++)
            gguf_dequant(src->block, sdata + (size_t)r * src_row, f + (size_t)r * (size_t)src->cols, (uint64_t)src->cols);
        weight part = {.dtype = DT_F32, .rows = n, .cols = src->cols, .data = f};
        ferry_status st = convert_rows(&part, fmt, 0, n, data_out, scales_out, name);
        free(f);
        return st;
    }

    if (src->quant == WQ_NONE && fmt->quant == WQ_NONE) {
        cast_elems(fmt->dtype, data_out, src->dtype, sdata, (size_t)n * (size_t)src->cols);
        return FERRY_OK;
    }
    if (src->quant == WQ_NONE) { /* quantize, from the scales' dtype */
        weight part = {.dtype = src->dtype, .rows = n, .cols = src->cols, .data = sdata};
        void *tmp = NULL;
        if (src->dtype != fmt->scale_dtype) {
            tmp = malloc((size_t)n * (size_t)src->cols * dtype_size(fmt->scale_dtype));
            if (!tmp) return ferry_fail(FERRY_ERR_NOMEM, "out of memory converting %s", name);
            cast_elems(fmt->scale_dtype, tmp, src->dtype, sdata, (size_t)n * (size_t)src->cols);
            part.dtype = fmt->scale_dtype;
            part.data = tmp;
        }
        ferry_status st = quant_weight(fmt->quant, fmt->group, fmt->scale_dtype, &part, data_out, scales_out, name);
        free(tmp);
        if (st != FERRY_OK) return ferry_fail_context(st, "rows %lld.. of %s", (long long)r0, name);
        return FERRY_OK;
    }
    const char *sscales = (const char *)src->scales + (size_t)r0 * (size_t)weight_groups(src) * dtype_size(src->scale_dtype);
    if (fmt->quant == WQ_NONE) { /* dequantize */
        float *row = malloc((size_t)src->cols * sizeof *row);
        int8_t *unpacked = packed_int8(src) ? malloc((size_t)src->cols) : NULL;
        if (!row || (packed_int8(src) && !unpacked)) {
            free(row);
            free(unpacked);
            return ferry_fail(FERRY_ERR_NOMEM, "out of memory converting %s", name);
        }
        for (int64_t r = 0; r < n; r++) {
            weight one = *src;
            one.rows = 1;
            one.scales = sscales + (size_t)r * (size_t)weight_groups(src) * dtype_size(src->scale_dtype);
            if (unpacked) {
                unpack_int8_row(src, r0 + r, unpacked);
                one.dtype = DT_I8;
                one.data = unpacked;
            } else {
                one.data = sdata + (size_t)r * src_row;
            }
            quant_dequant_row(&one, 0, row);
            cast_elems(fmt->dtype, (char *)data_out + (size_t)r * out_row, DT_F32, row, (size_t)src->cols);
        }
        free(row);
        free(unpacked);
        return FERRY_OK;
    }
    /* the same scheme: the data as it is (int8 unpacked), the scales as they are */
    if (packed_int8(src))
        for (int64_t r = 0; r < n; r++) unpack_int8_row(src, r0 + r, (int8_t *)data_out + (size_t)r * out_row);
    else
        memcpy(data_out, sdata, (size_t)n * src_row);
    memcpy(scales_out, sscales, n_scales * dtype_size(src->scale_dtype));
    return FERRY_OK;
}

ferry_status convert_model_summary(const model_config *cfg, model_weights *w, const convert_opts *o,
                                   convert_summary *out)
{
    tensor_entry *entries;
    int n;
    FERRY_TRY(model_tensor_entries(cfg, w, &entries, &n));
    memset(out, 0, sizeof *out);
    ferry_status st = FERRY_OK;
    for (int i = 0; i < n && st == FERRY_OK; i++) {
        weight fmt;
        if ((st = convert_format(o, &entries[i], &fmt)) != FERRY_OK) break;
        out->bytes += weight_bytes(&fmt);
        if (fmt.quant == WQ_NONE) continue;
        out->n_quantized++;
        out->n_regrouped += entries[i].dst->quant == WQ_NONE && fmt.quant == WQ_INT4 && fmt.cols > QUANT_INT4_GROUP &&
                            fmt.cols % QUANT_INT4_GROUP != 0;
        int k = 0, g = fmt.quant == WQ_GGUF ? (int)fmt.block : convert_ct_group(&fmt);
        while (k < out->n_schemes && (out->schemes[k].quant != fmt.quant || out->schemes[k].group != g)) k++;
        if (k == out->n_schemes && k < CONVERT_MAX_SCHEMES) out->schemes[out->n_schemes++] = (convert_scheme){fmt.quant, g, 0};
        if (k < out->n_schemes) out->schemes[k].n_tensors++;
    }
    free(entries);
    return st;
}

void convert_scheme_name(weight_quant quant, int group, char *buf, size_t cap)
{
    if (quant == WQ_GGUF) snprintf(buf, cap, "gguf %s", gguf_type_name((uint32_t)group));
    else if (group) snprintf(buf, cap, "%s group %d", quant_name(quant), group);
    else snprintf(buf, cap, "%s per channel", quant_name(quant));
}

void convert_summary_describe(const convert_summary *s, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "%s", s->n_schemes ? "" : "none");
    for (int k = 0; k < s->n_schemes && n < cap; k++) {
        char name[48];
        convert_scheme_name(s->schemes[k].quant, s->schemes[k].group, name, sizeof name);
        n += (size_t)snprintf(buf + n, cap - n, "%s%s: %d tensors", k ? ", " : "", name, s->schemes[k].n_tensors);
    }
}

void convert_describe(const convert_opts *o, char *buf, size_t cap)
{
    char q[64];
    if (o->quant == CONVERT_KEEP) snprintf(q, sizeof q, "as-checkpoint");
    else if (o->quant == WQ_INT4) snprintf(q, sizeof q, "int4(group %d, or one that divides the columns)", QUANT_INT4_GROUP);
    else snprintf(q, sizeof q, "%s", quant_name((weight_quant)o->quant));
    /* quantize-head only when on: blobs made without it keep their fingerprint */
    snprintf(buf, cap, "weights-dtype=%s quantize=%s%s quantizer=%s",
             o->dtype == CONVERT_KEEP ? "as-checkpoint" : dtype_name((ferry_dtype)o->dtype), q,
             o->head ? " quantize-head=int8" : "", QUANTIZER_ID);
}
