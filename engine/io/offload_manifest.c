/*
 * offload_manifest.c - ferry-offload.json read and written. See
 * offload_manifest.h.
 */
#include "offload_manifest.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

bool offload_key_valid(const char *key)
{
    if (!key || !*key) return false;
    for (const char *p = key; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-')) return false;
    return true;
}

static bool parse_crc(const char *s, uint32_t *out)
{
    if (!s || strlen(s) != 8) return false;
    uint32_t v = 0;
    for (int k = 0; k < 8; k++) {
        char ch = s[k];
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
              : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
        if (d < 0) return false;
        v = v << 4 | (uint32_t)d;
    }
    *out = v;
    return true;
}

void offload_manifest_clear(offload_manifest *m)
{
    for (int i = 0; i < m->n; i++) free(m->entries[i].key);
    free(m->entries);
    free(m->fingerprint);
    free(m->text);
    *m = (offload_manifest){0};
}

const offload_entry *offload_manifest_find(const offload_manifest *m, const char *key)
{
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->entries[i].key, key) == 0) return &m->entries[i];
    return NULL;
}

const char *offload_manifest_parse(offload_manifest *m)
{
    json_doc *doc = NULL;
    const char *why = NULL;
    if (json_parse(m->text, m->len, &doc) != FERRY_OK) return "not valid JSON";
    const json_value *root = json_doc_root(doc);
    const json_value *format = json_get(root, "format");
    const json_value *fp = json_get(root, "fingerprint");
    const json_value *blobs = json_get(root, "blobs");
    if (!format || !format->is_int || format->integer != 1) {
        why = "format is not 1";
        goto done;
    }
    if (!fp || fp->type != JSON_STRING || !blobs || blobs->type != JSON_ARRAY) {
        why = "missing fingerprint or blobs";
        goto done;
    }
    m->fingerprint = strdup(fp->str);
    m->entries = calloc(blobs->len ? blobs->len : 1, sizeof *m->entries);
    if (!m->fingerprint || !m->entries) {
        why = "out of memory";
        goto done;
    }
    for (size_t k = 0; k < blobs->len; k++) {
        const json_value *e = &blobs->items[k];
        bool bad = false;
        const char *key = json_get_str(e, "key", &bad);
        const char *file = json_get_str(e, "file", &bad);
        const char *crc = json_get_str(e, "crc32c", &bad);
        int64_t size = -1;
        json_get_int(e, "size", &size, &bad);
        offload_entry ent = {0};
        /* The file name must be exactly what ferry would have written (and
         * only names of that form are ever deleted). */
        if (bad || !offload_key_valid(key) || !file || strlen(file) != strlen(key) + 4 || strncmp(file, key, strlen(key)) ||
            strcmp(file + strlen(key), ".bin") || size < 0 || !parse_crc(crc, &ent.crc) || offload_manifest_find(m, key)) {
            why = "a malformed blob entry";
            goto done;
        }
        ent.size = (uint64_t)size;
        if (!(ent.key = strdup(key))) {
            why = "out of memory";
            goto done;
        }
        m->entries[m->n++] = ent;
    }
done:
    json_doc_free(doc);
    return why;
}

ferry_status offload_manifest_render(const char *fingerprint, const offload_blob *blobs, int n, strbuf *sb)
{
    sb_puts(sb, "{\n  \"format\": 1,\n  \"fingerprint\": ");
    sb_json_str(sb, fingerprint);
    sb_puts(sb, ",\n  \"blobs\": [");
    for (int i = 0; i < n; i++) {
        sb_puts(sb, i ? ",\n    {\"key\": " : "\n    {\"key\": ");
        sb_json_str(sb, blobs[i].key);
        sb_printf(sb, ", \"file\": \"%s.bin\", \"size\": %" PRIu64 ", \"crc32c\": \"%08" PRIx32 "\"}", blobs[i].key,
                  blobs[i].size, blobs[i].crc);
    }
    sb_puts(sb, n ? "\n  ]\n}\n" : "]\n}\n");
    if (sb->oom) return ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", OFFLOAD_MANIFEST);
    return FERRY_OK;
}
