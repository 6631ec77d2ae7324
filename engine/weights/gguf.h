/*
 * gguf.h - reading llama.cpp's GGUF files (version 3; 2 read the same way),
 * the container only: the metadata (typed key-value pairs) and the tensor
 * directory, with every count, length, offset, size and alignment checked
 * against the file before anything is used, so a damaged or hostile file is
 * refused in one line naming the field, never read past its end.
 *
 * A file is: "GGUF", version u32, tensor count u64, metadata count u64;
 * the metadata (key: string, type: u32, value); the tensor infos (name:
 * string, n_dims: u32, dims: u64[n_dims], type: u32, offset: u64); padding
 * to general.alignment (32 unless given); the data, each tensor at its
 * offset from the data's start. Strings are a u64 length and that many
 * bytes (not NUL-terminated); all numbers little-endian. Checks beyond
 * llama.cpp's reader: duplicate keys and tensor names, overlapping tensor
 * data, arrays of arrays, and a tensor type without a known block size are
 * refused.
 *
 * What a tensor's block type means for the model (dequantizing, kernels) is
 * not this file's concern: gguf_type_block gives each type's block shape.
 */
#ifndef FERRY_GGUF_H
#define FERRY_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/status.h"

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

/* ggml's tensor types, numbered as in the file. */
typedef enum {
    GGUF_F32 = 0,
    GGUF_F16 = 1,
    GGUF_Q4_0 = 2,
    GGUF_Q4_1 = 3,
    GGUF_Q5_0 = 6,
    GGUF_Q5_1 = 7,
    GGUF_Q8_0 = 8,
    GGUF_Q2_K = 10,
    GGUF_Q3_K = 11,
    GGUF_Q4_K = 12,
    GGUF_Q5_K = 13,
    GGUF_Q6_K = 14,
    GGUF_Q8_K = 15,
    GGUF_I8 = 24,
    GGUF_I16 = 25,
    GGUF_I32 = 26,
    GGUF_I64 = 27,
    GGUF_F64 = 28,
    GGUF_BF16 = 30,
} gguf_type;
#define GGUF_TYPES 40 /* type numbers are below this */

/* Elements per block and bytes per block of a tensor type; false for a type
 * this reader does not know (the i-quants, ternary types, ...). */
bool gguf_type_block(uint32_t type, uint32_t *elems, uint32_t *bytes);
/* "Q4_K", "F16", ...; "type N" for an unknown one (a static buffer for those: messages only). */
const char *gguf_type_name(uint32_t type);

/* Metadata value types, as in the file. */
typedef enum {
    GGUF_V_U8 = 0,
    GGUF_V_I8 = 1,
    GGUF_V_U16 = 2,
    GGUF_V_I16 = 3,
    GGUF_V_U32 = 4,
    GGUF_V_I32 = 5,
    GGUF_V_F32 = 6,
    GGUF_V_BOOL = 7,
    GGUF_V_STRING = 8,
    GGUF_V_ARRAY = 9,
    GGUF_V_U64 = 10,
    GGUF_V_I64 = 11,
    GGUF_V_F64 = 12,
} gguf_vtype;

typedef struct {
    const char *ptr; /* inside the file: not NUL-terminated */
    uint64_t len;
} gguf_str;

typedef struct {
    gguf_str key;
    gguf_vtype type;
    union {
        uint64_t u;  /* U8..U64 and BOOL (0 or 1) */
        int64_t i;   /* I8..I64 */
        double f;    /* F32, F64 */
        gguf_str s;  /* STRING */
        struct {
            gguf_vtype type;        /* the items' type: never ARRAY */
            uint64_t n;
            const uint8_t *data;    /* the first item in the file (numbers: packed little-endian) */
            const gguf_str *strs;   /* STRING items: [n], else NULL */
        } arr;
    } v;
} gguf_kv;

typedef struct {
    gguf_str name;
    uint32_t n_dims;
    uint64_t dims[GGUF_MAX_DIMS]; /* ggml order: dims[0] is the fastest-varying (a row's length) */
    uint32_t type;                /* gguf_type */
    uint64_t offset;              /* from the start of the data section */
    uint64_t nbytes;
    const uint8_t *data;          /* inside the file's bytes */
} gguf_tensor;

typedef struct gguf_file gguf_file;

/* Parses a whole file held in buf[0..size) (the bytes must outlive the
 * result). `label` names the file in errors. */
ferry_status gguf_parse(const uint8_t *buf, uint64_t size, const char *label, gguf_file **out);
/* Maps path read-only and parses it. */
ferry_status gguf_open(const char *path, gguf_file **out);
void gguf_close(gguf_file *g);

uint32_t gguf_version(const gguf_file *g);
uint32_t gguf_alignment(const gguf_file *g);
uint64_t gguf_data_offset(const gguf_file *g); /* of the data section, from the file's start */

size_t gguf_kv_count(const gguf_file *g);
const gguf_kv *gguf_kv_at(const gguf_file *g, size_t i); /* in file order */
const gguf_kv *gguf_find(const gguf_file *g, const char *key);
/* Typed lookups: false when the key is absent; a key of another type is
 * refused (ferry_fail, naming the key and both types) with *bad set. */
bool gguf_get_uint(const gguf_file *g, const char *key, uint64_t *v, bool *bad);
bool gguf_get_float(const gguf_file *g, const char *key, double *v, bool *bad);
bool gguf_get_str(const gguf_file *g, const char *key, gguf_str *v, bool *bad);
const char *gguf_vtype_name(gguf_vtype t);

size_t gguf_tensor_count(const gguf_file *g);
const gguf_tensor *gguf_tensor_at(const gguf_file *g, size_t i); /* in file order */
const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name);
uint64_t gguf_tensor_numel(const gguf_tensor *t);

/* s equals the NUL-terminated c. */
bool gguf_str_eq(gguf_str s, const char *c);

#endif
