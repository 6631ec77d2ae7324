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
 * Several processes and one directory (the lock, ferry-offload.lock):
 *   L1. Only the holder of the exclusive lock writes, renames or deletes
 *       anything in the directory.
 *   L2. Every offload_dir holds the lock, shared at least, from offload_open
 *       to offload_close; a writer turns its exclusive lock into a shared
 *       one atomically when the directory is ready, so no other writer can
 *       come in between.
 *   L3. A process that finds the directory in use joins it (shared, read
 *       only) when the manifest is for its inputs and every blob it needs
 *       verifies; otherwise offload_open fails with FERRY_ERR_BUSY, "DIR: in
 *       use by another ferry process ...", having changed nothing.
 *   L4. Each blob is read through the descriptor it was verified through
 *       (or written through): a name is never opened again and trusted, so
 *       a file renamed over a blob later is not what is read.
 * The locks are open file description locks (F_OFD_SETLK): released when the
 * process ends however it ends, and converted without being let go.
 *
 * Files in the directory named like ferry's own (KEY.bin for a well-formed
 * key, a whole number of 4096-byte blocks; KEY.bin.tmp.PID and
 * ferry-offload.json.tmp.PID) that the new manifest does not list are
 * deleted by the exclusive holder: blobs of an older layout or of a build
 * that failed, temporary files of a killed one. Nothing else is touched.
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
#define OFFLOAD_LOCK "ferry-offload.lock"

typedef struct offload_writer offload_writer;

/* Appends n bytes to the blob being written (checksummed as they go). */
ferry_status offload_write(offload_writer *w, const void *data, size_t n);
/* Appends n zero bytes (alignment padding). */
ferry_status offload_pad(offload_writer *w, size_t n);

/* Writes blob i's content: exactly spec[i].size bytes through offload_write
 * and offload_pad. */
typedef ferry_status (*offload_fill_fn)(void *ctx, int i, offload_writer *w);

/* A blob may be cut into regions read on their own (the experts of a
 * layer, each fetched alone): each region's CRC-32C is computed as the blob
 * is written or verified, from the very bytes the whole blob's checksum
 * vouches for, so the manifest records only the blob's. */
typedef struct {
    const char *key; /* unique per blob, [a-z0-9-] only; also its file name stem */
    uint64_t size;   /* multiple of OFFLOAD_ALIGN */
    int n_regions;   /* 0: one region, the whole blob */
    const uint64_t *region_size; /* [n_regions], summing to size */
} offload_spec;

typedef struct {
    char *key;         /* the spec's */
    char *path;        /* dir/key.bin, for messages */
    int fd;            /* the verified (or written) file, open for reading (O_DIRECT where the file system allows) */
    bool direct;       /* fd has O_DIRECT */
    uint64_t size;
    uint32_t crc;
    bool rebuilt;      /* written by this offload_open (false: reused) */
    int n_regions;     /* >= 1 */
    uint32_t *region_crc; /* [n_regions] CRC-32C of each region (the spec's; one region: crc) */
    uint64_t *region_size; /* [n_regions] the spec's sizes */
} offload_blob;

typedef struct {
    char *dir;
    int n;
    offload_blob *blobs; /* [n], in spec order */
    int lock_fd;         /* OFFLOAD_LOCK, locked shared until offload_close (-1: a read-only dir without one) */
    bool joined;         /* the dir was in use by another process: reused, nothing written (L3) */
} offload_dir;

/* Makes dir (mkdir -p) hold a valid blob for every spec, reusing what it can
 * (see above) and calling fill for the rest; fingerprint is a string the
 * caller derives from its inputs. Files of ours that the new manifest does
 * not list are deleted. Verification reads every reused blob. Waits while
 * another process is writing the dir; fails with FERRY_ERR_BUSY when one is
 * using it for other inputs (L3). */
ferry_status offload_open(const char *dir, const char *fingerprint, const offload_spec *specs, int n,
                          offload_fill_fn fill, void *ctx, offload_dir **out);
void offload_close(offload_dir *od);

/* Rewrites blob i, which a read found damaged, from fill (the same
 * callback, with the same inputs, as offload_open's) and reads it through
 * the new file's descriptor from then on (L4); its bytes must come out with
 * the checksum the manifest records. It needs the exclusive lock for the
 * moment (L1): FERRY_ERR_BUSY, nothing changed, when another process shares
 * the dir. Nothing may be reading blob i meanwhile, and descriptors from
 * offload_blob_open_buffered on it are stale after. */
ferry_status offload_rebuild(offload_dir *od, int i, offload_fill_fn fill, void *ctx);

/* A second, buffered descriptor on blob b (for small unaligned reads; b->fd
 * may be O_DIRECT). It is proven to be the verified file (same device and
 * inode as b->fd); a file put in its place since fails with FERRY_ERR_IO. */
ferry_status offload_blob_open_buffered(const offload_blob *b, int *fd);

#endif
