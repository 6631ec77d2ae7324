/*
 * quant_tool.c - quantizes the 2-D weights of one safetensors file with
 * engine/weights/quant.c, for tests/integration/test_quant_exact.py.
 *
 *   quant_tool int8|int4 in.safetensors out.safetensors
 *
 * Every 2-D F32/F16/BF16 tensor NAME becomes the tensors compressed-tensors
 * writes for the module whose weight it is (docs/quantization.md), with
 * scales in NAME's own dtype:
 *   int8 (int-quantized):  NAME I8 [rows, cols], NAME_scale [rows, 1]
 *   int4 (pack-quantized): NAME_packed I32 [rows, ceil(cols / 8)],
 *                          NAME_scale [rows, cols / G], NAME_shape I64 [2]
 * with G the group `--quantize int4` takes for those columns
 * (quant_default_group: 128, or 64 / 32 / cols where 128 does not divide)
 * so "x.weight" gives x.weight / x.weight_packed, x.weight_scale and
 * x.weight_shape. Other tensors are copied as they are. Errors are one line
 * on stderr starting "quant_tool: ", exit status 1.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../engine/weights/quant.h"
#include "../../engine/weights/safetensors.h"
#include "../../engine/weights/st_writer.h"

static bool is_quantized(const st_tensor *t)
{
    return t->ndim == 2 && dtype_is_compute(t->dtype) && t->shape[1] > 0;
}

static char *suffixed(const char *name, const char *suffix)
{
    size_t n = strlen(name), m = strlen(suffix);
    char *s = malloc(n + m + 1);
    if (!s) abort();
    memcpy(s, name, n);
    memcpy(s + n, suffix, m + 1);
    return s;
}

/* Quantizes t and appends its data, scales (and shape) in declaration order. */
static ferry_status write_quantized(st_writer *w, weight_quant q, const st_tensor *t, const void *values)
{
    weight src = {.dtype = t->dtype, .rows = t->shape[0], .cols = t->shape[1], .data = values};
    int group = quant_default_group(q, src.cols);
    size_t data_bytes = quant_data_bytes(q, src.rows, src.cols);
    size_t scale_bytes = quant_scale_bytes(src.rows, src.cols, group, t->dtype);
    void *data = malloc(data_bytes ? data_bytes : 1), *scales = malloc(scale_bytes ? scale_bytes : 1);
    ferry_status st = data && scales ? FERRY_OK : ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", t->name);
    if (st == FERRY_OK) st = quant_weight(q, group, t->dtype, &src, data, scales, t->name);
    if (st == FERRY_OK) st = st_writer_write(w, data, data_bytes);
    if (st == FERRY_OK) st = st_writer_write(w, scales, scale_bytes);
    if (st == FERRY_OK && q == WQ_INT4) {
        int64_t shape[2] = {src.rows, src.cols};
        st = st_writer_write(w, shape, sizeof shape);
    }
    free(data);
    free(scales);
    return st;
}

static ferry_status run(weight_quant q, const char *in, const char *out)
{
    int fd = open(in, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ferry_fail(FERRY_ERR_NOT_FOUND, "%s: %s", in, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_size < 8) {
        close(fd);
        return ferry_fail(FERRY_ERR_INVALID, "%s: not a safetensors file", in);
    }
    uint8_t *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return ferry_fail(FERRY_ERR_IO, "%s: mmap: %s", in, strerror(errno));

    st_header *h = NULL;
    st_decl *decls = NULL;
    char **names = NULL;
    st_writer *w = NULL;
    size_t n = 0;
    int nd = 0;
    ferry_status st = st_parse(map, (size_t)sb.st_size, (uint64_t)sb.st_size, in, &h);
    if (st == FERRY_OK) {
        n = st_header_count(h);
        decls = calloc(3 * n + 1, sizeof *decls);
        names = calloc(3 * n + 1, sizeof *names);
        if (!decls || !names) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; st == FERRY_OK && i < n; i++) {
        const st_tensor *t = st_header_tensor(h, i);
        if (!is_quantized(t)) {
            decls[nd] = (st_decl){.name = t->name, .dtype = t->dtype, .ndim = t->ndim};
            memcpy(decls[nd].shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
            nd++;
            continue;
        }
        int64_t rows = t->shape[0], cols = t->shape[1];
        int64_t n_groups = (cols + quant_default_group(q, cols) - 1) / quant_default_group(q, cols);
        if (q == WQ_INT8) {
            decls[nd++] = (st_decl){.name = t->name, .dtype = DT_I8, .ndim = 2, .shape = {rows, cols}};
        } else {
            names[nd] = suffixed(t->name, "_packed");
            decls[nd] = (st_decl){.name = names[nd], .dtype = DT_I32, .ndim = 2, .shape = {rows, (cols + 7) / 8}};
            nd++;
        }
        names[nd] = suffixed(t->name, "_scale");
        decls[nd] = (st_decl){.name = names[nd], .dtype = t->dtype, .ndim = 2, .shape = {rows, n_groups}};
        nd++;
        if (q == WQ_INT4) {
            names[nd] = suffixed(t->name, "_shape");
            decls[nd] = (st_decl){.name = names[nd], .dtype = DT_I64, .ndim = 1, .shape = {2}};
            nd++;
        }
    }
    if (st == FERRY_OK) st = st_writer_open(out, decls, nd, &w);
    for (size_t i = 0; st == FERRY_OK && i < n; i++) {
        const st_tensor *t = st_header_tensor(h, i);
        if (is_quantized(t))
            st = write_quantized(w, q, t, map + t->offset);
        else
            st = st_writer_write(w, map + t->offset, t->nbytes);
    }
    if (st == FERRY_OK) {
        st = st_writer_finish(w);
    } else {
        st_writer_abort(w);
    }
    for (int i = 0; names && i < nd; i++) free(names[i]);
    free(names);
    free(decls);
    st_header_free(h);
    munmap(map, (size_t)sb.st_size);
    return st;
}

int main(int argc, char **argv)
{
    weight_quant q;
    if (argc != 4 || !quant_parse(argv[1], &q) || q == WQ_NONE) {
        fprintf(stderr, "usage: quant_tool int8|int4 in.safetensors out.safetensors\n");
        return 2;
    }
    if (run(q, argv[2], argv[3]) != FERRY_OK) {
        fprintf(stderr, "quant_tool: %s\n", ferry_errmsg());
        return 1;
    }
    return 0;
}
