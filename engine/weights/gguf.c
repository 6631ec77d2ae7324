/*
 * gguf.c - the GGUF container: a bounds-checked cursor over the file's
 * bytes, the metadata and tensor directory parsed through it, the tensors'
 * data checked against the data section. See gguf.h.
 */
#define _GNU_SOURCE
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct gguf_file {
    const uint8_t *buf;
    uint64_t size;
    uint32_t version, alignment;
    uint64_t data_offset;
    size_t n_kv, n_tensors;
    gguf_kv *kv;
    gguf_tensor *tensors;
    size_t *by_name;      /* tensor indices sorted by name */
    gguf_str **str_arrays; /* the STRING arrays' item tables, freed with the file */
    size_t n_str_arrays;
    void *map;            /* gguf_open's mapping, else NULL */
    uint64_t map_len;
};

/* ---- types ------------------------------------------------------------------ */

/* ggml's block shapes (ggml-common.h). Q8_1 is left out: ggml uses it only
 * for activations, never stores it, and the gguf package's table gives it
 * another size (40 bytes, ggml 36). */
static const struct {
    uint32_t type, elems, bytes;
    const char *name;
} k_types[] = {
    {GGUF_F32, 1, 4, "F32"},        {GGUF_F16, 1, 2, "F16"},       {GGUF_BF16, 1, 2, "BF16"},
    {GGUF_Q4_0, 32, 18, "Q4_0"},    {GGUF_Q4_1, 32, 20, "Q4_1"},   {GGUF_Q5_0, 32, 22, "Q5_0"},
    {GGUF_Q5_1, 32, 24, "Q5_1"},    {GGUF_Q8_0, 32, 34, "Q8_0"},
    {GGUF_Q2_K, 256, 84, "Q2_K"},   {GGUF_Q3_K, 256, 110, "Q3_K"}, {GGUF_Q4_K, 256, 144, "Q4_K"},
    {GGUF_Q5_K, 256, 176, "Q5_K"},  {GGUF_Q6_K, 256, 210, "Q6_K"}, {GGUF_Q8_K, 256, 292, "Q8_K"},
    {GGUF_I8, 1, 1, "I8"},          {GGUF_I16, 1, 2, "I16"},       {GGUF_I32, 1, 4, "I32"},
    {GGUF_I64, 1, 8, "I64"},        {GGUF_F64, 1, 8, "F64"},
};

bool gguf_type_block(uint32_t type, uint32_t *elems, uint32_t *bytes)
{
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++)
        if (k_types[i].type == type) {
            *elems = k_types[i].elems;
            *bytes = k_types[i].bytes;
            return true;
        }
    return false;
}

const char *gguf_type_name(uint32_t type)
{
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++)
        if (k_types[i].type == type) return k_types[i].name;
    static __thread char buf[24];
    snprintf(buf, sizeof buf, "type %u", type);
    return buf;
}

const char *gguf_vtype_name(gguf_vtype t)
{
    static const char *const names[] = {"uint8", "int8",  "uint16", "int16", "uint32", "int32", "float32",
                                        "bool",  "string", "array", "uint64", "int64", "float64"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

/* Bytes of one item of a fixed-size value type; 0 for STRING and ARRAY. */
static uint32_t vtype_size(uint32_t t)
{
    switch (t) {
    case GGUF_V_U8: case GGUF_V_I8: case GGUF_V_BOOL: return 1;
    case GGUF_V_U16: case GGUF_V_I16: return 2;
    case GGUF_V_U32: case GGUF_V_I32: case GGUF_V_F32: return 4;
    case GGUF_V_U64: case GGUF_V_I64: case GGUF_V_F64: return 8;
    default: return 0;
    }
}

bool gguf_str_eq(gguf_str s, const char *c)
{
    size_t n = strlen(c);
    return s.len == n && memcmp(s.ptr, c, n) == 0;
}

/* ---- the cursor ----------------------------------------------------------------- */

typedef struct {
    const uint8_t *buf;
    uint64_t pos, size;
    const char *label;
} cursor;

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* n bytes at the cursor, or an error naming `what` */
static ferry_status take(cursor *c, uint64_t n, const char *what, const uint8_t **p)
{
    if (n > c->size - c->pos)
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s at byte %llu runs past the end of the file (%llu bytes)", c->label,
                          what, (unsigned long long)c->pos, (unsigned long long)c->size);
    *p = c->buf + c->pos;
    c->pos += n;
    return FERRY_OK;
}

static ferry_status read_u32(cursor *c, const char *what, uint32_t *v)
{
    const uint8_t *p = NULL;
    FERRY_TRY(take(c, 4, what, &p));
    *v = (uint32_t)le(p, 4);
    return FERRY_OK;
}

static ferry_status read_u64(cursor *c, const char *what, uint64_t *v)
{
    const uint8_t *p = NULL;
    FERRY_TRY(take(c, 8, what, &p));
    *v = le(p, 8);
    return FERRY_OK;
}

static ferry_status read_str(cursor *c, const char *what, gguf_str *s)
{
    uint64_t n;
    FERRY_TRY(read_u64(c, what, &n));
    const uint8_t *p = NULL;
    FERRY_TRY(take(c, n, what, &p));
    *s = (gguf_str){(const char *)p, n};
    return FERRY_OK;
}

/* ---- metadata ---------------------------------------------------------------------- */

static ferry_status read_scalar(cursor *c, uint32_t type, const char *what, gguf_kv *kv)
{
    uint32_t n = vtype_size(type);
    const uint8_t *p = NULL;
    FERRY_TRY(take(c, n, what, &p));
    uint64_t raw = le(p, (int)n);
    switch (type) {
    case GGUF_V_BOOL:
        if (raw > 1) return ferry_fail(FERRY_ERR_INVALID, "%s: %s: a bool of value %llu", c->label, what, (unsigned long long)raw);
        kv->v.u = raw;
        break;
    case GGUF_V_U8: case GGUF_V_U16: case GGUF_V_U32: case GGUF_V_U64: kv->v.u = raw; break;
    case GGUF_V_I8: kv->v.i = (int8_t)raw; break;
    case GGUF_V_I16: kv->v.i = (int16_t)raw; break;
    case GGUF_V_I32: kv->v.i = (int32_t)raw; break;
    case GGUF_V_I64: kv->v.i = (int64_t)raw; break;
    case GGUF_V_F32: {
        float f;
        uint32_t b = (uint32_t)raw;
        memcpy(&f, &b, 4);
        kv->v.f = f;
        break;
    }
    case GGUF_V_F64: memcpy(&kv->v.f, &raw, 8); break;
    }
    return FERRY_OK;
}

static ferry_status keep_str_array(gguf_file *g, gguf_str *items)
{
    gguf_str **p = realloc(g->str_arrays, (g->n_str_arrays + 1) * sizeof *p);
    if (!p) {
        free(items);
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    g->str_arrays = p;
    g->str_arrays[g->n_str_arrays++] = items;
    return FERRY_OK;
}

static ferry_status read_value(gguf_file *g, cursor *c, uint32_t type, const char *what, gguf_kv *kv)
{
    kv->type = (gguf_vtype)type;
    if (vtype_size(type)) return read_scalar(c, type, what, kv);
    if (type == GGUF_V_STRING) return read_str(c, what, &kv->v.s);
    if (type != GGUF_V_ARRAY)
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s has value type %u, not a GGUF type (0..12)", c->label, what, type);
    uint32_t it;
    uint64_t n;
    FERRY_TRY(read_u32(c, what, &it));
    FERRY_TRY(read_u64(c, what, &n));
    if (it == GGUF_V_ARRAY)
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: %s is an array of arrays (not read)", c->label, what);
    kv->v.arr.type = (gguf_vtype)it;
    kv->v.arr.n = n;
    kv->v.arr.data = c->buf + c->pos;
    kv->v.arr.strs = NULL;
    uint32_t sz = vtype_size(it);
    if (sz) {
        if (n > (c->size - c->pos) / sz)
            return ferry_fail(FERRY_ERR_INVALID, "%s: %s: an array of %llu %s items runs past the end of the file",
                              c->label, what, (unsigned long long)n, gguf_vtype_name((gguf_vtype)it));
        const uint8_t *p = NULL;
        FERRY_TRY(take(c, n * sz, what, &p));
        if (it == GGUF_V_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (p[i] > 1) return ferry_fail(FERRY_ERR_INVALID, "%s: %s[%llu]: a bool of value %u", c->label, what,
                                                (unsigned long long)i, p[i]);
        return FERRY_OK;
    }
    if (it != GGUF_V_STRING)
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s: array items of type %u, not a GGUF type (0..12)", c->label, what, it);
    if (n > (c->size - c->pos) / 8) /* each string takes at least its length */
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s: an array of %llu strings runs past the end of the file", c->label,
                          what, (unsigned long long)n);
    gguf_str *items = malloc((n ? n : 1) * sizeof *items);
    if (!items) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < n; i++) {
        ferry_status st = read_str(c, what, &items[i]);
        if (st != FERRY_OK) {
            free(items);
            return st;
        }
    }
    kv->v.arr.strs = items;
    return keep_str_array(g, items);
}

/* ---- tensors --------------------------------------------------------------------- */

static int cmp_name_idx(const void *a, const void *b, void *arg)
{
    const gguf_tensor *t = arg;
    gguf_str x = t[*(const size_t *)a].name, y = t[*(const size_t *)b].name;
    int c = memcmp(x.ptr, y.ptr, x.len < y.len ? x.len : y.len);
    return c ? c : (x.len < y.len ? -1 : x.len > y.len);
}

static int cmp_offset_idx(const void *a, const void *b, void *arg)
{
    const gguf_tensor *t = arg;
    uint64_t x = t[*(const size_t *)a].offset, y = t[*(const size_t *)b].offset;
    return x < y ? -1 : x > y;
}

static ferry_status read_tensor(cursor *c, size_t i, gguf_tensor *t)
{
    char what[64];
    snprintf(what, sizeof what, "tensor info %zu", i);
    FERRY_TRY(read_str(c, what, &t->name));
    if (t->name.len == 0 || memchr(t->name.ptr, 0, t->name.len))
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s: the name is empty or holds a NUL byte", c->label, what);
    FERRY_TRY(read_u32(c, what, &t->n_dims));
    if (t->n_dims > GGUF_MAX_DIMS)
        return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%.*s': %u dimensions (at most %d)", c->label,
                          (int)t->name.len, t->name.ptr, t->n_dims, GGUF_MAX_DIMS);
    uint64_t numel = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t->dims[d] = 1;
        if (d >= t->n_dims) continue;
        FERRY_TRY(read_u64(c, what, &t->dims[d]));
        if (t->dims[d] == 0 || t->dims[d] > (uint64_t)INT64_MAX / numel)
            return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%.*s': dimension %u is %llu (the element count must be "
                              "1 .. 2^63-1)", c->label, (int)t->name.len, t->name.ptr, d,
                              (unsigned long long)t->dims[d]);
        numel *= t->dims[d];
    }
    FERRY_TRY(read_u32(c, what, &t->type));
    uint32_t be, bb;
    if (!gguf_type_block(t->type, &be, &bb))
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: tensor '%.*s': tensor type %u is not one this reader knows",
                          c->label, (int)t->name.len, t->name.ptr, t->type);
    if (t->dims[0] % be)
        return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%.*s': a row of %llu elements is not whole %s blocks of %u",
                          c->label, (int)t->name.len, t->name.ptr, (unsigned long long)t->dims[0],
                          gguf_type_name(t->type), be);
    if (numel / be > UINT64_MAX / bb)
        return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%.*s': its byte size overflows", c->label, (int)t->name.len,
                          t->name.ptr);
    t->nbytes = numel / be * bb;
    return read_u64(c, what, &t->offset);
}

/* Offsets aligned, inside the data section, no two tensors sharing a byte;
 * then the name index. */
static ferry_status check_tensors(gguf_file *g, const char *label)
{
    uint64_t data_size = g->size - g->data_offset;
    size_t n = g->n_tensors;
    size_t *idx = malloc((n ? n : 1) * sizeof *idx);
    if (!idx) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) idx[i] = i;
    ferry_status st = FERRY_OK;
    for (size_t i = 0; i < n && st == FERRY_OK; i++) {
        gguf_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment)
            st = ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%.*s': data offset %llu is not a multiple of the alignment "
                            "(%u)", label, (int)t->name.len, t->name.ptr, (unsigned long long)t->offset, g->alignment);
        else if (t->offset > data_size || t->nbytes > data_size - t->offset)
            st = ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%.*s': data [%llu, +%llu) runs past the end of the file "
                            "(data section of %llu bytes)", label, (int)t->name.len, t->name.ptr,
                            (unsigned long long)t->offset, (unsigned long long)t->nbytes, (unsigned long long)data_size);
        else
            t->data = g->buf + g->data_offset + t->offset;
    }
    if (st == FERRY_OK) {
        qsort_r(idx, n, sizeof *idx, cmp_offset_idx, g->tensors);
        for (size_t i = 1; i < n && st == FERRY_OK; i++) {
            const gguf_tensor *a = &g->tensors[idx[i - 1]], *b = &g->tensors[idx[i]];
            if (a->offset + a->nbytes > b->offset)
                st = ferry_fail(FERRY_ERR_INVALID, "%s: tensors '%.*s' and '%.*s' overlap in the data section", label,
                                (int)a->name.len, a->name.ptr, (int)b->name.len, b->name.ptr);
        }
    }
    if (st == FERRY_OK) {
        for (size_t i = 0; i < n; i++) idx[i] = i;
        qsort_r(idx, n, sizeof *idx, cmp_name_idx, g->tensors);
        for (size_t i = 1; i < n && st == FERRY_OK; i++)
            if (cmp_name_idx(&idx[i - 1], &idx[i], g->tensors) == 0)
                st = ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%.*s' is listed twice", label,
                                (int)g->tensors[idx[i]].name.len, g->tensors[idx[i]].name.ptr);
    }
    if (st != FERRY_OK) {
        free(idx);
        return st;
    }
    g->by_name = idx;
    return FERRY_OK;
}

/* ---- the file ---------------------------------------------------------------------- */

static ferry_status parse(gguf_file *g, const char *label)
{
    cursor c = {g->buf, 0, g->size, label};
    const uint8_t *magic = NULL;
    if (g->size < 4 || memcmp(g->buf, "GGUF", 4) != 0)
        return ferry_fail(FERRY_ERR_INVALID, "%s: not a GGUF file (it does not start with \"GGUF\")", label);
    FERRY_TRY(take(&c, 4, "magic", &magic));
    FERRY_TRY(read_u32(&c, "version", &g->version));
    if (g->version != 2 && g->version != 3) {
        if ((g->version & 0xffff) == 0 && g->version)
            return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: a big-endian GGUF file (not read)", label);
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: GGUF version %u (this reader takes 2 and 3)", label, g->version);
    }
    uint64_t n_tensors, n_kv;
    FERRY_TRY(read_u64(&c, "tensor count", &n_tensors));
    FERRY_TRY(read_u64(&c, "metadata count", &n_kv));
    /* each entry takes at least 13 (metadata) or 24 (tensor info) bytes */
    if (n_kv > (g->size - c.pos) / 13)
        return ferry_fail(FERRY_ERR_INVALID, "%s: metadata count %llu is more than the file can hold", label,
                          (unsigned long long)n_kv);
    if (n_tensors > (g->size - c.pos) / 24)
        return ferry_fail(FERRY_ERR_INVALID, "%s: tensor count %llu is more than the file can hold", label,
                          (unsigned long long)n_tensors);
    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_kv *kv = &g->kv[i];
        char what[96];
        snprintf(what, sizeof what, "metadata entry %llu", (unsigned long long)i);
        FERRY_TRY(read_str(&c, what, &kv->key));
        if (kv->key.len == 0 || memchr(kv->key.ptr, 0, kv->key.len))
            return ferry_fail(FERRY_ERR_INVALID, "%s: %s: the key is empty or holds a NUL byte", label, what);
        snprintf(what, sizeof what, "metadata '%.*s'", kv->key.len > 60 ? 60 : (int)kv->key.len, kv->key.ptr);
        for (uint64_t j = 0; j < i; j++)
            if (g->kv[j].key.len == kv->key.len && !memcmp(g->kv[j].key.ptr, kv->key.ptr, kv->key.len))
                return ferry_fail(FERRY_ERR_INVALID, "%s: %s is given twice", label, what);
        uint32_t type;
        FERRY_TRY(read_u32(&c, what, &type));
        g->n_kv = i + 1; /* its string table (if any) is freed with the file from here */
        FERRY_TRY(read_value(g, &c, type, what, kv));
        if (gguf_str_eq(kv->key, "general.alignment")) {
            if (kv->type != GGUF_V_U32)
                return ferry_fail(FERRY_ERR_INVALID, "%s: general.alignment is a %s, not a uint32", label,
                                  gguf_vtype_name(kv->type));
            if (kv->v.u == 0 || (kv->v.u & (kv->v.u - 1)))
                return ferry_fail(FERRY_ERR_INVALID, "%s: general.alignment %llu is not a power of two", label,
                                  (unsigned long long)kv->v.u);
            g->alignment = (uint32_t)kv->v.u;
        }
    }
    for (uint64_t i = 0; i < n_tensors; i++) FERRY_TRY(read_tensor(&c, i, &g->tensors[i]));
    g->n_tensors = n_tensors;
    uint64_t pad = (g->alignment - c.pos % g->alignment) % g->alignment;
    g->data_offset = c.pos + pad;
    if (g->data_offset > g->size) {
        if (n_tensors)
            return ferry_fail(FERRY_ERR_INVALID, "%s: the data section would start at byte %llu, past the end of the "
                              "file (%llu bytes)", label, (unsigned long long)g->data_offset,
                              (unsigned long long)g->size);
        g->data_offset = g->size; /* no tensors: the padding may be left out */
    }
    return check_tensors(g, label);
}

ferry_status gguf_parse(const uint8_t *buf, uint64_t size, const char *label, gguf_file **out)
{
    *out = NULL;
    gguf_file *g = calloc(1, sizeof *g);
    if (!g) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    g->buf = buf;
    g->size = size;
    ferry_status st = parse(g, label);
    if (st != FERRY_OK) {
        gguf_close(g);
        return st;
    }
    *out = g;
    return FERRY_OK;
}

ferry_status gguf_open(const char *path, gguf_file **out)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ferry_fail(errno == ENOENT ? FERRY_ERR_NOT_FOUND : FERRY_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return ferry_fail(FERRY_ERR_INVALID, "%s: not a regular file", path);
    }
    uint64_t size = (uint64_t)sb.st_size;
    void *map = size ? mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    int err = errno;
    close(fd);
    if (size && map == MAP_FAILED) return ferry_fail(FERRY_ERR_IO, "%s: cannot map it: %s", path, strerror(err));
    gguf_file *g;
    ferry_status st = gguf_parse(map ? map : "", size, path, &g);
    if (st != FERRY_OK) {
        if (map) munmap(map, size);
        return st;
    }
    g->map = map;
    g->map_len = size;
    *out = g;
    return FERRY_OK;
}

void gguf_close(gguf_file *g)
{
    if (!g) return;
    for (size_t i = 0; i < g->n_str_arrays; i++) free(g->str_arrays[i]);
    free(g->str_arrays);
    free(g->kv);
    free(g->tensors);
    free(g->by_name);
    if (g->map) munmap(g->map, g->map_len);
    free(g);
}

/* ---- lookups ------------------------------------------------------------------------ */

uint32_t gguf_version(const gguf_file *g) { return g->version; }
uint32_t gguf_alignment(const gguf_file *g) { return g->alignment; }
uint64_t gguf_data_offset(const gguf_file *g) { return g->data_offset; }
size_t gguf_kv_count(const gguf_file *g) { return g->n_kv; }
const gguf_kv *gguf_kv_at(const gguf_file *g, size_t i) { return i < g->n_kv ? &g->kv[i] : NULL; }
size_t gguf_tensor_count(const gguf_file *g) { return g->n_tensors; }
const gguf_tensor *gguf_tensor_at(const gguf_file *g, size_t i) { return i < g->n_tensors ? &g->tensors[i] : NULL; }

const gguf_kv *gguf_find(const gguf_file *g, const char *key)
{
    for (size_t i = 0; i < g->n_kv; i++)
        if (gguf_str_eq(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name)
{
    size_t lo = 0, hi = g->n_tensors, n = strlen(name);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        gguf_str s = g->tensors[g->by_name[mid]].name;
        int c = memcmp(s.ptr, name, s.len < n ? s.len : n);
        if (!c) c = s.len < n ? -1 : s.len > n;
        if (!c) return &g->tensors[g->by_name[mid]];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

uint64_t gguf_tensor_numel(const gguf_tensor *t)
{
    uint64_t n = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) n *= t->dims[d];
    return n;
}

static bool wrong_type(const gguf_kv *kv, const char *want, bool *bad)
{
    ferry_fail(FERRY_ERR_INVALID, "GGUF metadata '%.*s' is a %s, not %s", (int)kv->key.len, kv->key.ptr,
               gguf_vtype_name(kv->type), want);
    *bad = true;
    return false;
}

bool gguf_get_uint(const gguf_file *g, const char *key, uint64_t *v, bool *bad)
{
    const gguf_kv *kv = gguf_find(g, key);
    if (!kv) return false;
    switch (kv->type) {
    case GGUF_V_U8: case GGUF_V_U16: case GGUF_V_U32: case GGUF_V_U64: *v = kv->v.u; return true;
    case GGUF_V_I8: case GGUF_V_I16: case GGUF_V_I32: case GGUF_V_I64:
        if (kv->v.i >= 0) {
            *v = (uint64_t)kv->v.i;
            return true;
        }
        return wrong_type(kv, "a count (it is negative)", bad);
    default: return wrong_type(kv, "an integer", bad);
    }
}

bool gguf_get_float(const gguf_file *g, const char *key, double *v, bool *bad)
{
    const gguf_kv *kv = gguf_find(g, key);
    if (!kv) return false;
    if (kv->type == GGUF_V_F32 || kv->type == GGUF_V_F64) *v = kv->v.f;
    else if (kv->type == GGUF_V_U8 || kv->type == GGUF_V_U16 || kv->type == GGUF_V_U32 || kv->type == GGUF_V_U64)
        *v = (double)kv->v.u;
    else if (kv->type == GGUF_V_I8 || kv->type == GGUF_V_I16 || kv->type == GGUF_V_I32 || kv->type == GGUF_V_I64)
        *v = (double)kv->v.i;
    else return wrong_type(kv, "a number", bad);
    return true;
}

bool gguf_get_str(const gguf_file *g, const char *key, gguf_str *v, bool *bad)
{
    const gguf_kv *kv = gguf_find(g, key);
    if (!kv) return false;
    if (kv->type != GGUF_V_STRING) return wrong_type(kv, "a string", bad);
    *v = kv->v.s;
    return true;
}
