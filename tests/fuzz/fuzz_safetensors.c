/*
 * fuzz_safetensors.c - libFuzzer target for the safetensors header validator
 * (st_parse in engine/safetensors.h).
 *
 * The input is a whole file (file_size = size). A rejected file must leave no
 * header; an accepted one must describe tensors that are sorted by unique
 * name, lie inside the data section, tile it exactly, and whose byte length
 * is dtype size x shape. Every tensor's first and last byte is read, so
 * AddressSanitizer catches an offset outside the buffer. A broken promise
 * aborts, which libFuzzer reports as a crash. Build: README.md.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/weights/safetensors.h"

static volatile uint8_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    st_header *h = (st_header *)1;
    if (st_parse(data, size, size, "fuzz.safetensors", &h) != FERRY_OK) {
        if (h) abort();
        if (!strstr(ferry_errmsg(), "fuzz.safetensors")) abort();
        return 0;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | data[i];
    uint64_t start = 8 + n, total = 0;
    for (size_t i = 0; i < st_header_count(h); i++) {
        const st_tensor *t = st_header_tensor(h, i);
        if (i && strcmp(st_header_tensor(h, i - 1)->name, t->name) >= 0) abort();
        if (t->ndim < 0 || t->ndim > ST_MAX_DIMS || t->dtype >= DT_COUNT) abort();
        if (st_tensor_numel(t) * dtype_size(t->dtype) != t->nbytes) abort();
        if (t->offset < start || t->offset > size || t->nbytes > size - t->offset) abort();
        if (t->nbytes) sink ^= data[t->offset] ^ data[t->offset + t->nbytes - 1];
        total += t->nbytes;
    }
    if (total != size - start) abort();
    st_header_free(h);
    return 0;
}
