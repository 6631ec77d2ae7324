/*
 * store.h - where every group's weights live, and how they get there.
 *
 * Each group has one layout: its tensors in execution order, each 256-byte
 * aligned, each unit (layer, embedding, head) padded to 4096 bytes. The same
 * layout is used on every tier, so a group's blob on disk, its host copy
 * and its staging slot are byte-for-byte the same and a fetch is one
 * contiguous copy (all of a group's buffers move as one unit).
 *
 * At load, resident groups are filled tensor by tensor from the checkpoint
 * mapping: device groups into backend memory, host groups into host memory
 * (pinned where the backend can); disk groups are written to the offload
 * dir (offload.h) unless valid blobs are already there. Each tensor's mapped
 * pages are released once copied, so loading never holds more than the
 * resident tiers plus one tensor.
 *
 * store_bind points the compute view at a group's buffer (resident or a
 * staging slot). The embedding table is read by rows: where it is not on
 * the device, store_embed_rows gathers the step's rows from the host copy or
 * the blob.
 */
#ifndef FERRY_STORE_H
#define FERRY_STORE_H

#include "backend.h"
#include "weights/convert.h"
#include "weights/model.h"
#include "io/offload.h"
#include "plan.h"

#define STORE_TENSOR_ALIGN 256u

typedef struct store store;

/* Where group g's bytes are, in the group's layout: a resident buffer
 * (device tier: backend memory; host tier: host memory), or a blob file of
 * the offload dir (disk tier). The pipeline fetches from it and export reads
 * from it; neither needs to know how the store keeps it. */
typedef struct {
    tier tier;
    uint64_t bytes;       /* the group's size (0: nothing to fetch) */
    const void *resident; /* device / host tier */
    int fd;               /* disk tier: open for reading, O_DIRECT where the file system allows */
    const char *path;     /* disk tier: the blob, for messages */
    uint64_t offset;      /* disk tier: where the group starts in the file */
    uint32_t crc;         /* disk tier: CRC-32C of the group's bytes, as verified when the store opened */
} store_source;

/* Byte sizes of the units (embedding, layers, head) in the blob layout,
 * with every tensor in its engine form (conv). */
ferry_status store_unit_bytes(const model_config *cfg, const model_weights *w, const convert_opts *conv,
                              uint64_t *unit_bytes);

/* Lays out and loads every group as the plan says. `ckpt` (the bound
 * checkpoint weights) supplies the data, converted by conv (convert.h: a
 * quantized tensor's data and scales one unit in the layout); `view` is the
 * compute view, in the engine form, that store_bind fills. offload_path (the offload dir) may be NULL when no group is on disk.
 * fingerprint identifies the checkpoint + conversion for the offload dir.
 * The store keeps pointers to be, p, ckpt and view: they must outlive it. */
ferry_status store_open(store **out, backend *be, const plan *p, const model_config *cfg, const convert_opts *conv,
                        model_weights *ckpt, model_weights *view, const char *offload_path, const char *fingerprint);
void store_close(store *s);

store_source store_group_source(const store *s, int g);

/* Checks group g's bytes, read from its blob, against the CRC-32C the blob
 * was verified with when the store opened; a mismatch is FERRY_ERR_IO with
 * msg (cap bytes) naming the blob and both checksums. */
ferry_status store_check_read(const store *s, int g, const void *data, char *msg, size_t cap);
/* Whether disk group g's blob is now shorter than the group's end (cut
 * while serving: damage to rebuild, where an I/O error of the disk is not). */
bool store_blob_short(const store *s, int g);

/* One tensor of a group's layout, for export: the checkpoint tensor it came
 * from and its engine form (data and scales NULL; convert_bind points them
 * into a buffer holding the group). */
typedef struct {
    const char *name;     /* the checkpoint's tensor name */
    bool one_d;           /* 1-D in the checkpoint ([cols]; the engine holds [1, cols]) */
    const weight *ckpt;   /* the checkpoint tensor, bound to the mapping */
    weight fmt;           /* its engine form */
    uint64_t offset;      /* where it starts in the group's layout */
} store_tensor;

/* Tensors of group g, in layout order: count, and the k-th. */
int store_group_tensor_count(const store *s, int g);
store_tensor store_group_tensor(const store *s, int g, int k);

/* Rewrites disk group g's blob from the checkpoint (offload_rebuild: it
 * must come out with the checksum the manifest records) after a read found
 * it damaged; the pipeline must be quiet, and readers outside it (export)
 * are waited for: they read blob descriptors between
 * store_blobs_read_begin and _end (a shared lock the rebuild takes alone). */
ferry_status store_rebuild_group(store *s, int g);
/* Whether disk groups g and h are in the same blob (a run of experts). */
bool store_same_blob(const store *s, int g, int h);
void store_blobs_read_begin(store *s);
void store_blobs_read_end(store *s);

/* Points the view's weights of group g at base (a buffer in g's layout). */
void store_bind(const store *s, int g, const void *base);

/* The group that holds the embedding table (the head group when tied). */
int store_embed_group(const store *s);
/* Copies the embedding rows of tokens[0..n) (in the table's dtype) into
 * dst (host memory, n x row bytes) from the host copy or the blob. */
ferry_status store_embed_rows(const store *s, const int32_t *tokens, int n, void *dst);
/* Bytes of one embedding row. */
size_t store_embed_row_bytes(const store *s);

#endif
