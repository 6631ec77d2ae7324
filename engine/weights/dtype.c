/*
 * dtype.c - names and sizes of the safetensors element types.
 */
#include "dtype.h"

static const struct { const char *name; unsigned size; } k_dtypes[DT_COUNT] = {
    [DT_F32] = {"F32", 4},   [DT_F16] = {"F16", 2},   [DT_BF16] = {"BF16", 2}, [DT_F64] = {"F64", 8},
    [DT_I64] = {"I64", 8},   [DT_I32] = {"I32", 4},   [DT_I16] = {"I16", 2},   [DT_I8] = {"I8", 1},
    [DT_U64] = {"U64", 8},   [DT_U32] = {"U32", 4},   [DT_U16] = {"U16", 2},   [DT_U8] = {"U8", 1},
    [DT_BOOL] = {"BOOL", 1}, [DT_F8_E4M3] = {"F8_E4M3", 1}, [DT_F8_E5M2] = {"F8_E5M2", 1},
};

unsigned dtype_size(ferry_dtype dt) { return dt < DT_COUNT ? k_dtypes[dt].size : 0; }
const char *dtype_name(ferry_dtype dt) { return dt < DT_COUNT ? k_dtypes[dt].name : "?"; }

bool dtype_from_name(const char *name, ferry_dtype *out)
{
    for (int i = 0; i < DT_COUNT; i++) {
        if (strcmp(name, k_dtypes[i].name) == 0) {
            *out = (ferry_dtype)i;
            return true;
        }
    }
    return false;
}
