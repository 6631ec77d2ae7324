/*
 * offload_manifest.h - ferry-offload.json, the offload directory's record of
 * its blobs (offload.h): which key, file, size and CRC-32C each blob has,
 * and the fingerprint of the inputs they were made from.
 *
 * The text read back may be damaged, truncated or edited by hand: parsing
 * either yields entries whose keys are well-formed ([a-z0-9-]+), distinct,
 * and whose file is exactly KEY.bin, or says why the manifest is unusable
 * and leaves nothing (offload_open then rebuilds every blob). Whatever a
 * manifest says, only names of ferry's own forms are ever deleted
 * (offload.c).
 */
#ifndef FERRY_OFFLOAD_MANIFEST_H
#define FERRY_OFFLOAD_MANIFEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/json.h"
#include "offload.h"

typedef struct {
    char *key;
    uint64_t size;
    uint32_t crc;
} offload_entry;

typedef struct {
    char *text;          /* as read, to skip rewriting an unchanged manifest */
    size_t len;
    char *fingerprint;
    offload_entry *entries; /* [n] */
    int n;
} offload_manifest;

/* A blob key: non-empty, [a-z0-9-] only (it is also a file name stem). */
bool offload_key_valid(const char *key);

/* Fills m's fingerprint and entries from m->text[0..len); returns why the
 * text is unusable, or NULL. On failure the caller clears m (its entries
 * may be partly filled). */
const char *offload_manifest_parse(offload_manifest *m);
/* Frees everything m holds, text included, and empties it. */
void offload_manifest_clear(offload_manifest *m);
/* The entry for key, or NULL. */
const offload_entry *offload_manifest_find(const offload_manifest *m, const char *key);

/* The manifest for blobs[0..n) (key, size, crc each), in order. */
ferry_status offload_manifest_render(const char *fingerprint, const offload_blob *blobs, int n, strbuf *sb);

#endif
