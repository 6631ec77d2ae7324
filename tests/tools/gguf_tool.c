/*
 * gguf_tool.c - prints what engine/weights/gguf.c reads from a GGUF file,
 * as one JSON object, for tests/integration/test_gguf.py to compare with
 * the `gguf` package's reader (GGUFReader), which ferry did not write;
 * and writes the Hugging Face tokenizer files of a GGUF's tokenizer for
 * tests/integration/test_gguf_vocab.py.
 *
 *   gguf_tool FILE   -> {"version", "alignment", "data_offset", "kv": [...], "tensors": [...]}
 *   gguf_tool FILE --dequant NAME OUT   tensor NAME as f32 (gguf_quant.h) into OUT
 *   gguf_tool --hf-file FILE NAME OUT   the Hugging Face file NAME (tokenizer.json or
 *                                       tokenizer_config.json) gguf_vocab.h writes for
 *                                       FILE's tokenizer, into OUT; refused: "ERR
 *                                       <status>: <message>" on stderr, exit status 1
 *
 * Strings (keys, values, tensor names) are written as hex of their bytes;
 * arrays in full. A file the reader refuses: "ERR <status>: <message>" on
 * stdout, exit status 1. Usage errors: exit status 2.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/base/json.h"
#include "../../engine/weights/gguf.h"
#include "../../engine/weights/gguf_quant.h"
#include "../../engine/weights/gguf_vocab.h"

static void put_hex(gguf_str s)
{
    static const char hx[] = "0123456789abcdef";
    putchar('"');
    for (uint64_t i = 0; i < s.len; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        putchar(hx[c >> 4]);
        putchar(hx[c & 15]);
    }
    putchar('"');
}

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* item i of a numeric array, as JSON */
static void put_item(gguf_vtype t, const uint8_t *p)
{
    switch (t) {
    case GGUF_V_U8: case GGUF_V_BOOL: printf("%u", p[0]); break;
    case GGUF_V_I8: printf("%d", (int8_t)p[0]); break;
    case GGUF_V_U16: printf("%u", (unsigned)le(p, 2)); break;
    case GGUF_V_I16: printf("%d", (int16_t)le(p, 2)); break;
    case GGUF_V_U32: printf("%u", (unsigned)le(p, 4)); break;
    case GGUF_V_I32: printf("%d", (int32_t)le(p, 4)); break;
    case GGUF_V_U64: printf("%" PRIu64, le(p, 8)); break;
    case GGUF_V_I64: printf("%" PRId64, (int64_t)le(p, 8)); break;
    case GGUF_V_F32: {
        uint32_t b = (uint32_t)le(p, 4);
        float f;
        memcpy(&f, &b, 4);
        printf("%.9g", f);
        break;
    }
    case GGUF_V_F64: {
        uint64_t b = le(p, 8);
        double f;
        memcpy(&f, &b, 8);
        printf("%.17g", f);
        break;
    }
    default: printf("null");
    }
}

static int item_size(gguf_vtype t)
{
    switch (t) {
    case GGUF_V_U8: case GGUF_V_I8: case GGUF_V_BOOL: return 1;
    case GGUF_V_U16: case GGUF_V_I16: return 2;
    case GGUF_V_U32: case GGUF_V_I32: case GGUF_V_F32: return 4;
    default: return 8;
    }
}

static void put_value(const gguf_kv *kv)
{
    switch (kv->type) {
    case GGUF_V_STRING: put_hex(kv->v.s); break;
    case GGUF_V_ARRAY:
        printf("{\"type\": %d, \"items\": [", kv->v.arr.type);
        for (uint64_t i = 0; i < kv->v.arr.n; i++) {
            if (i) printf(", ");
            if (kv->v.arr.type == GGUF_V_STRING) put_hex(kv->v.arr.strs[i]);
            else put_item(kv->v.arr.type, kv->v.arr.data + i * item_size(kv->v.arr.type));
        }
        printf("]}");
        break;
    case GGUF_V_F32: printf("%.9g", kv->v.f); break;
    case GGUF_V_F64: printf("%.17g", kv->v.f); break;
    case GGUF_V_I8: case GGUF_V_I16: case GGUF_V_I32: case GGUF_V_I64: printf("%" PRId64, kv->v.i); break;
    default: printf("%" PRIu64, kv->v.u);
    }
}

/* --hf-file FILE NAME OUT */
static int hf_file(const char *path, const char *name, const char *out)
{
    bool config = !strcmp(name, "tokenizer_config.json");
    if (!config && strcmp(name, "tokenizer.json")) {
        fprintf(stderr, "gguf_tool: --hf-file writes tokenizer.json or tokenizer_config.json, not %s\n", name);
        return 2;
    }
    gguf_file *g;
    strbuf sb;
    sb_init(&sb);
    ferry_status st = gguf_open(path, &g);
    if (st == FERRY_OK) {
        st = config ? gguf_vocab_tokenizer_config_json(g, path, &sb) : gguf_vocab_tokenizer_json(g, path, &sb);
        gguf_close(g);
    }
    if (st == FERRY_OK) {
        FILE *f = fopen(out, "wb");
        bool ok = f && fwrite(sb.data, 1, sb.len, f) == sb.len;
        if (f && fclose(f)) ok = false;
        if (!ok) st = ferry_fail(FERRY_ERR_IO, "%s: cannot write", out);
    }
    sb_free(&sb);
    if (st != FERRY_OK) {
        fprintf(stderr, "ERR %s: %s\n", ferry_status_name(st), ferry_errmsg());
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "--hf-file")) return hf_file(argv[2], argv[3], argv[4]);
    if (argc != 2 && !(argc == 5 && !strcmp(argv[2], "--dequant"))) {
        fprintf(stderr, "usage: gguf_tool FILE [--dequant NAME OUT] | gguf_tool --hf-file FILE NAME OUT\n");
        return 2;
    }
    gguf_file *g;
    ferry_status st = gguf_open(argv[1], &g);
    if (st != FERRY_OK) {
        printf("ERR %s: %s\n", ferry_status_name(st), ferry_errmsg());
        return 1;
    }
    if (argc == 5) {
        const gguf_tensor *t = gguf_find_tensor(g, argv[3]);
        uint64_t n = t ? gguf_tensor_numel(t) : 0;
        float *y = t ? malloc(n * sizeof *y) : NULL;
        int rc = 1;
        if (!t) printf("ERR no tensor %s\n", argv[3]);
        else if (!y || !gguf_dequant(t->type, t->data, y, n)) printf("ERR cannot dequantize %s\n", gguf_type_name(t->type));
        else {
            FILE *f = fopen(argv[4], "wb");
            rc = !f || fwrite(y, sizeof *y, n, f) != n;
            if (f && fclose(f)) rc = 1;
            printf(rc ? "ERR writing %s\n" : "OK %s\n", argv[4]);
        }
        free(y);
        gguf_close(g);
        return rc;
    }
    printf("{\"version\": %u, \"alignment\": %u, \"data_offset\": %" PRIu64 ",\n \"kv\": [", gguf_version(g),
           gguf_alignment(g), gguf_data_offset(g));
    for (size_t i = 0; i < gguf_kv_count(g); i++) {
        const gguf_kv *kv = gguf_kv_at(g, i);
        printf("%s\n  {\"key\": ", i ? "," : "");
        put_hex(kv->key);
        printf(", \"type\": %d, \"value\": ", kv->type);
        put_value(kv);
        putchar('}');
    }
    printf("],\n \"tensors\": [");
    for (size_t i = 0; i < gguf_tensor_count(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        char name[1024];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        printf("%s\n  {\"name\": ", i ? "," : "");
        put_hex(t->name);
        printf(", \"dims\": [");
        for (uint32_t d = 0; d < t->n_dims; d++) printf("%s%" PRIu64, d ? ", " : "", t->dims[d]);
        printf("], \"type\": %u, \"type_name\": \"%s\", \"offset\": %" PRIu64 ", \"nbytes\": %" PRIu64
               ", \"found\": %s}",
               t->type, gguf_type_name(t->type), t->offset, t->nbytes,
               (t->name.len >= sizeof name || gguf_find_tensor(g, name) == t) ? "true" : "false");
    }
    printf("]}\n");
    gguf_close(g);
    return 0;
}
