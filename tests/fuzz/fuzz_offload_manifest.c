/*
 * fuzz_offload_manifest.c - libFuzzer target for the offload directory's
 * manifest, ferry-offload.json (offload_manifest_parse in
 * engine/io/offload_manifest.h), which offload_open reads back from a disk
 * that may hold a damaged, truncated or hand-edited one.
 *
 * The input is the manifest's text. An unusable one must say why. A usable
 * one must have as many entries as the JSON lists blobs, in order, each key
 * well-formed ([a-z0-9-]+, so that its file KEY.bin is one of ferry's own
 * names and nothing else is ever deleted) and distinct, each findable by
 * its key, with the size and checksum the JSON says; and the manifest
 * written back from the entries (offload_manifest_render) must parse to
 * the same entries and fingerprint. A broken promise aborts, which
 * libFuzzer reports as a crash. Build: README.md.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/io/offload_manifest.h"

static void check_entries(const offload_manifest *m, const char *text, size_t len)
{
    json_doc *doc;
    if (json_parse(text, len, &doc) != FERRY_OK) abort(); /* usable, so JSON */
    const json_value *root = json_doc_root(doc), *blobs = json_get(root, "blobs");
    bool bad = false;
    const char *fp = json_get_str(root, "fingerprint", &bad);
    if (!fp || !m->fingerprint || strcmp(fp, m->fingerprint) || !blobs || blobs->len != (size_t)m->n) abort();
    for (int i = 0; i < m->n; i++) {
        const offload_entry *e = &m->entries[i];
        const json_value *b = &blobs->items[i];
        int64_t size = -1;
        const char *key = json_get_str(b, "key", &bad), *crc = json_get_str(b, "crc32c", &bad);
        json_get_int(b, "size", &size, &bad);
        if (bad || !key || strcmp(key, e->key) || size < 0 || (uint64_t)size != e->size || !crc) abort();
        if (!offload_key_valid(e->key) || offload_manifest_find(m, e->key) != e) abort();
        if (strtoul(crc, NULL, 16) != e->crc) abort();
    }
    json_doc_free(doc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    offload_manifest m = {0};
    if (!(m.text = malloc(size ? size : 1))) abort();
    memcpy(m.text, data, size);
    m.len = size;
    const char *why = offload_manifest_parse(&m);
    if (why) {
        if (!*why) abort();
        offload_manifest_clear(&m);
        return 0;
    }
    check_entries(&m, m.text, m.len);

    /* written back, read again: the same */
    offload_blob *blobs = calloc((size_t)(m.n ? m.n : 1), sizeof *blobs);
    if (!blobs) abort();
    for (int i = 0; i < m.n; i++)
        blobs[i] = (offload_blob){.key = m.entries[i].key, .size = m.entries[i].size, .crc = m.entries[i].crc};
    strbuf sb;
    sb_init(&sb);
    if (offload_manifest_render(m.fingerprint, blobs, m.n, &sb) != FERRY_OK) abort();
    offload_manifest again = {.text = sb.data, .len = sb.len};
    sb.data = NULL; /* again owns it */
    if (offload_manifest_parse(&again) || again.n != m.n || strcmp(again.fingerprint, m.fingerprint)) {
        fprintf(stderr, "fuzz_offload_manifest: the manifest written back does not read back\n");
        abort();
    }
    for (int i = 0; i < m.n; i++)
        if (strcmp(again.entries[i].key, m.entries[i].key) || again.entries[i].size != m.entries[i].size ||
            again.entries[i].crc != m.entries[i].crc)
            abort();
    offload_manifest_clear(&again);
    sb_free(&sb);
    free(blobs);
    offload_manifest_clear(&m);
    return 0;
}
