/*
 * dtype.h - element types of checkpoint tensors and their conversions.
 *
 * The safetensors reader knows every dtype of the format (to validate sizes);
 * compute handles F32, F16 and BF16 weights and does its arithmetic in f32.
 */
#ifndef FERRY_DTYPE_H
#define FERRY_DTYPE_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

typedef enum {
    DT_F32, DT_F16, DT_BF16, DT_F64,
    DT_I64, DT_I32, DT_I16, DT_I8,
    DT_U64, DT_U32, DT_U16, DT_U8,
    DT_BOOL, DT_F8_E4M3, DT_F8_E5M2,
    DT_COUNT
} ferry_dtype;

/* Bytes per element. */
unsigned dtype_size(ferry_dtype dt);
/* Safetensors spelling ("F32", "BF16", ...). */
const char *dtype_name(ferry_dtype dt);
/* Parses the safetensors spelling; false if unknown. */
bool dtype_from_name(const char *name, ferry_dtype *out);
/* True for the dtypes compute can read as weights. */
static inline bool dtype_is_compute(ferry_dtype dt) { return dt == DT_F32 || dt == DT_F16 || dt == DT_BF16; }

static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even; NaN stays NaN. */
static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h)
{
    _Float16 x;
    memcpy(&x, &h, 2);
    return (float)x;
}

static inline uint16_t f32_to_f16(float f)
{
    _Float16 x = (_Float16)f;
    uint16_t h;
    memcpy(&h, &x, 2);
    return h;
}

/* Element i of an F32/F16/BF16 array, widened to f32; and stored back,
 * rounded to nearest-even (F16/BF16). */
static inline float dtype_load_f32(ferry_dtype dt, const void *p, size_t i)
{
    switch (dt) {
    case DT_BF16: return bf16_to_f32(((const uint16_t *)p)[i]);
    case DT_F16: return f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static inline void dtype_store_f32(ferry_dtype dt, void *p, size_t i, float v)
{
    switch (dt) {
    case DT_BF16: ((uint16_t *)p)[i] = f32_to_bf16(v); break;
    case DT_F16: ((uint16_t *)p)[i] = f32_to_f16(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

#endif
