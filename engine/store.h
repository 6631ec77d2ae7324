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
#include "weights/model.h"
#include "io/offload.h"
#include "plan.h"

#define STORE_TENSOR_ALIGN 256u

typedef struct {
    int n;             /* tensors in the group */
    int *slot;         /* [n] index into store.src / store.view */
    uint64_t *offset;  /* [n] byte offset in the group's buffer */
} group_layout;

typedef struct {
    backend *be;
    const plan *plan;
    int n_slots;           /* tensors of the model */
    tensor_slot *src;      /* [n_slots] bound to the checkpoint weights */
    tensor_slot *view;     /* [n_slots] the same tensors in the compute view */
    group_layout *layouts; /* [plan->n_groups] */
    void **resident;       /* [n_groups] backend (device) or host buffer; NULL when on disk */
    bool *pinned;          /* [n_groups] host buffer is pinned */
    offload_dir *od;       /* disk tier, or NULL */
    int *blob;             /* [n_groups] blob index in od, or -1 */
    int embed_group;       /* the group holding model.embed_tokens.weight */
    uint64_t embed_offset; /* its offset in that group */
    int embed_fd;          /* buffered descriptor for row reads when the table is on disk */
} store;

/* Byte sizes of the units (embedding, layers, head) in the blob layout. */
ferry_status store_unit_bytes(const model_config *cfg, const model_weights *w, uint64_t *unit_bytes);

/* Lays out and loads every group as the plan says. `ckpt` (the bound
 * checkpoint weights) supplies the data; `view` is the compute view that
 * store_bind fills. offload_dir may be NULL when no group is on disk.
 * fingerprint identifies the checkpoint + conversion for the offload dir. */
ferry_status store_open(store *s, backend *be, const plan *p, const model_config *cfg, model_weights *ckpt,
                        model_weights *view, const char *offload_dir, const char *fingerprint);
void store_close(store *s);

/* Points the view's weights of group g at base (a buffer in g's layout). */
void store_bind(const store *s, int g, const void *base);

/* Copies the embedding rows of tokens[0..n) (in the table's dtype) into
 * dst (host memory, n x row bytes) from the host copy or the blob. */
ferry_status store_embed_rows(const store *s, const int32_t *tokens, int n, void *dst);

/* Bytes of one embedding row. */
size_t store_embed_row_bytes(const store *s);

#endif
