/*
 * offload.h - the offload directory: the disk tier's blobs and manifest.
 *
 * Each disk group's converted weights are stored once as one contiguous
 * blob file, its size a multiple of 4096 (so that O_DIRECT can read it
 * whole), laid out exactly as the group's staging slot. ferry-offload.json
 * records, per blob: key (which units it holds, e.g. "layers-000-002"),
 * file name, size and CRC-32C; and one fingerprint of everything the blobs
 * were made from (checkpoint files, config, conversion, layout). At startup
 * offload_open reuses a blob only when the fingerprint, key, size and
 * checksum all match, and rebuilds it otherwise - so a restart with the same
 * inputs reads nothing from the checkpoint, and any change or corruption is
 * repaired. Blobs are written to a temporary name, fsync'd and renamed, and
 * the manifest is replaced atomically last: an interrupted build never
 * leaves a blob that a later run would trust.
 *
 * Writing streams: the fill callback hands data piece by piece (normally one
 * tensor at a time straight from the checkpoint mapping); nothing holds a
 * whole blob in memory.
 */
#ifndef FERRY_OFFLOAD_H
#define FERRY_OFFLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/status.h"

#define OFFLOAD_ALIGN 4096u
#define OFFLOAD_MANIFEST "ferry-offload.json"

typedef struct offload_writer offload_writer;

/* Appends n bytes to the blob being written (checksummed as they go). */
ferry_status offload_write(offload_writer *w, const void *data, size_t n);
/* Appends n zero bytes (alignment padding). */
ferry_status offload_pad(offload_writer *w, size_t n);

/* Writes blob i's content: exactly spec[i].size bytes through offload_write
 * and offload_pad. */
typedef ferry_status (*offload_fill_fn)(void *ctx, int i, offload_writer *w);

typedef struct {
    const char *key; /* unique per blob, [a-z0-9-] only; also its file name stem */
    uint64_t size;   /* multiple of OFFLOAD_ALIGN */
} offload_spec;

typedef struct {
    char *path;        /* dir/key.bin */
    int fd;            /* open for reading (O_DIRECT where the file system allows) */
    bool direct;       /* fd has O_DIRECT */
    uint64_t size;
    uint32_t crc;
    bool rebuilt;      /* written by this offload_open (false: reused) */
} offload_blob;

typedef struct {
    char *dir;
    int n;
    offload_blob *blobs; /* [n], in spec order */
} offload_dir;

/* Makes dir (mkdir -p) hold a valid blob for every spec, reusing what it can
 * (see above) and calling fill for the rest; fingerprint is a string the
 * caller derives from its inputs. Blobs listed in an old manifest that are
 * not needed any more are deleted. Verification reads every reused blob. */
ferry_status offload_open(const char *dir, const char *fingerprint, const offload_spec *specs, int n,
                          offload_fill_fn fill, void *ctx, offload_dir **out);
void offload_close(offload_dir *od);

#endif
