/*
 * fuzz_gguf.c - libFuzzer target for the GGUF container reader (gguf_parse
 * in engine/weights/gguf.h).
 *
 * The input is a whole file. A refused file must leave no result and name
 * the file; an accepted one must keep every promise of gguf.h: keys and
 * tensor names non-empty, unique and found by their lookups; every string
 * inside the file; arrays' items inside the file; each tensor's data inside
 * the data section, aligned, its size its type's blocks x its elements, no
 * two overlapping. Every string's and tensor's first and last byte is read,
 * so AddressSanitizer catches one outside the buffer. A broken promise
 * aborts. An accepted file's metadata is then made into the config.json and
 * the tokenizer.json it stands for (gguf_hf.h, gguf_vocab.h), which ferry's
 * config parser and tokenizer must take or refuse naming the file; a
 * refused tokenizer appends nothing. Build: README.md.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/weights/gguf.h"
#include "../../engine/weights/gguf_hf.h"
#include "../../engine/weights/gguf_vocab.h"
#include "../../engine/weights/model.h"
#include "../../text/tokenizer.h"

static volatile uint8_t sink;

static void in_file(const uint8_t *data, size_t size, gguf_str s)
{
    if (s.len == 0) return;
    if ((const uint8_t *)s.ptr < data || s.len > size || (const uint8_t *)s.ptr - data > (ptrdiff_t)(size - s.len))
        abort();
    sink ^= (uint8_t)s.ptr[0] ^ (uint8_t)s.ptr[s.len - 1];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gguf_file *g = (gguf_file *)1;
    if (gguf_parse(data, size, "fuzz.gguf", &g) != FERRY_OK) {
        if (g) abort();
        if (!strstr(ferry_errmsg(), "fuzz.gguf")) abort();
        return 0;
    }
    uint32_t al = gguf_alignment(g);
    if (!al || (al & (al - 1)) || gguf_data_offset(g) > size) abort();
    for (size_t i = 0; i < gguf_kv_count(g); i++) {
        const gguf_kv *kv = gguf_kv_at(g, i);
        if (!kv->key.len) abort();
        in_file(data, size, kv->key);
        char key[256];
        if (kv->key.len < sizeof key) {
            memcpy(key, kv->key.ptr, kv->key.len);
            key[kv->key.len] = 0;
            if (gguf_find(g, key) != kv) abort(); /* unique: the first with the key is this one */
        }
        if (kv->type == GGUF_V_STRING) in_file(data, size, kv->v.s);
        if (kv->type == GGUF_V_ARRAY) {
            if (kv->v.arr.type == GGUF_V_ARRAY) abort();
            if (kv->v.arr.type == GGUF_V_STRING) {
                if (!kv->v.arr.strs && kv->v.arr.n) abort();
                for (uint64_t j = 0; j < kv->v.arr.n; j++) in_file(data, size, kv->v.arr.strs[j]);
            } else if (kv->v.arr.data < data || kv->v.arr.data > data + size) {
                abort();
            }
        }
    }
    uint64_t data_size = size - gguf_data_offset(g);
    for (size_t i = 0; i < gguf_tensor_count(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        in_file(data, size, t->name);
        uint32_t be, bb;
        if (!gguf_type_block(t->type, &be, &bb)) abort();
        if (t->dims[0] % be || gguf_tensor_numel(t) / be * bb != t->nbytes) abort();
        if (t->offset % al || t->offset > data_size || t->nbytes > data_size - t->offset) abort();
        if (t->data != data + gguf_data_offset(g) + t->offset) abort();
        if (t->nbytes) sink ^= t->data[0] ^ t->data[t->nbytes - 1];
        for (size_t j = 0; j < i; j++) { /* no overlap (small inputs: quadratic is fine) */
            const gguf_tensor *u = gguf_tensor_at(g, j);
            if (t->nbytes && u->nbytes && t->offset < u->offset + u->nbytes && u->offset < t->offset + t->nbytes)
                abort();
        }
        char name[256];
        if (t->name.len < sizeof name) {
            memcpy(name, t->name.ptr, t->name.len);
            name[t->name.len] = 0;
            if (gguf_find_tensor(g, name) != t) abort();
        }
    }
    strbuf sb;
    sb_init(&sb);
    if (gguf_hf_config_json(g, "fuzz.gguf", &sb) == FERRY_OK) {
        model_config cfg;
        if (sb.oom) abort();
        if (model_config_parse(sb.data, sb.len, "fuzz.gguf", &cfg) != FERRY_OK && !strstr(ferry_errmsg(), "fuzz.gguf"))
            abort();
    } else if (!strstr(ferry_errmsg(), "fuzz.gguf")) {
        abort();
    }
    sb_free(&sb);
    sb_init(&sb);
    if (gguf_vocab_tokenizer_json(g, "fuzz.gguf", &sb) == FERRY_OK) {
        tokenizer *t = NULL;
        if (sb.oom) abort();
        if (tok_parse(sb.data, sb.len, "fuzz.gguf", &t) == FERRY_OK) tok_free(t);
        else if (!strstr(ferry_errmsg(), "fuzz.gguf")) abort();
    } else if (sb.len || !strstr(ferry_errmsg(), "fuzz.gguf")) {
        abort();
    }
    sb_free(&sb);
    gguf_close(g);
    return 0;
}
