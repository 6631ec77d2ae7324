/*
 * store.c - group layouts and loading the tiers. See store.h.
 */
#define _GNU_SOURCE
#include "store.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"

#define ALIGN_UP(x, a) (((x) + (uint64_t)(a) - 1) & ~((uint64_t)(a) - 1))

typedef struct {
    int n;             /* tensors in the group */
    int *entry;        /* [n] index into store.src / store.view */
    uint64_t *offset;  /* [n] byte offset in the group's buffer */
} group_layout;

struct store {
    backend *be;
    const plan *plan;
    convert_opts conv;     /* checkpoint tensors -> engine tensors (convert.h) */
    int n_tensors;         /* tensors of the model */
    tensor_entry *src;     /* [n_tensors] bound to the checkpoint weights */
    tensor_entry *view;    /* [n_tensors] the same tensors in the compute view: their engine form */
    group_layout *layouts; /* [plan->n_groups] */
    void **resident;       /* [n_groups] backend (device) or host buffer; NULL when on disk */
    bool *pinned;          /* [n_groups] host buffer is pinned */
    offload_dir *od;       /* disk tier, or NULL */
    int *blob;             /* [n_groups] blob index in od, or -1 */
    int embed_group;       /* the group holding model.embed_tokens.weight */
    uint64_t embed_offset; /* its offset in that group */
    int embed_fd;          /* buffered descriptor on the verified embedding blob, for row reads when on disk */
    pthread_rwlock_t blobs; /* readers of blob descriptors outside the pipeline (export) vs a rebuild */
};


/* Unit of each tensor entry: 0 embedding, 1 + l layer l, n_layers + 1 head.
 * A tied embedding table belongs to the head: it is the lm_head. */
static int unit_of(const model_config *cfg, const tensor_entry *t)
{
    switch (t->unit) {
    case UNIT_EMBED: return cfg->tied ? cfg->n_layers + 1 : 0;
    case UNIT_LAYER: return 1 + t->layer;
    case UNIT_HEAD: return cfg->n_layers + 1;
    }
    return 0;
}

ferry_status store_unit_bytes(const model_config *cfg, const model_weights *w, const convert_opts *conv,
                              uint64_t *unit_bytes)
{
    tensor_entry *entries;
    int n;
    FERRY_TRY(model_tensor_entries(cfg, (model_weights *)w, &entries, &n));
    memset(unit_bytes, 0, (size_t)(cfg->n_layers + 2) * sizeof *unit_bytes);
    ferry_status st = FERRY_OK;
    for (int i = 0; i < n; i++) {
        weight fmt;
        if ((st = convert_format(conv, &entries[i], &fmt)) != FERRY_OK) break; /* fmt is incomplete */
        int u = unit_of(cfg, &entries[i]);
        unit_bytes[u] = ALIGN_UP(unit_bytes[u], STORE_TENSOR_ALIGN) + convert_bytes(&fmt);
    }
    for (int u = 0; u < cfg->n_layers + 2; u++) unit_bytes[u] = ALIGN_UP(unit_bytes[u], OFFLOAD_ALIGN);
    free(entries);
    return st;
}

/* The group of unit u (0 embedding, 1 + l layer l, n_layers + 1 head). */
static int group_of_unit(const plan *p, int u, int n_layers)
{
    for (int g = 0; g < p->n_groups; g++) {
        const plan_group *pg = &p->groups[g];
        if ((pg->kind == GROUP_EMBED && u == 0) || (pg->kind == GROUP_HEAD && u == n_layers + 1) ||
            (pg->kind == GROUP_LAYERS && u - 1 >= pg->first_layer && u - 1 < pg->first_layer + pg->n_layers))
            return g;
    }
    FERRY_ASSERT(!"every unit has a group");
    return -1;
}

/* Offsets: units in order within the group, each starting 4096-aligned,
 * tensors 256-aligned within the unit - the layout store_unit_bytes sized. */
static ferry_status make_layouts(store *s, const model_config *cfg)
{
    const plan *p = s->plan;
    s->layouts = calloc((size_t)p->n_groups, sizeof *s->layouts);
    if (!s->layouts) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    for (int g = 0; g < p->n_groups; g++) {
        s->layouts[g].entry = calloc((size_t)s->n_tensors, sizeof(int));
        s->layouts[g].offset = calloc((size_t)s->n_tensors, sizeof(uint64_t));
        if (!s->layouts[g].entry || !s->layouts[g].offset) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    uint64_t *fill = calloc((size_t)p->n_groups, sizeof *fill);
    if (!fill) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    /* entries come in execution order, so units (and groups) appear in order */
    for (int u = 0; u < cfg->n_layers + 2; u++) {
        int g = group_of_unit(p, u, cfg->n_layers);
        fill[g] = ALIGN_UP(fill[g], OFFLOAD_ALIGN);
        for (int i = 0; i < s->n_tensors; i++) {
            if (unit_of(cfg, &s->src[i]) != u) continue;
            group_layout *L = &s->layouts[g];
            fill[g] = ALIGN_UP(fill[g], STORE_TENSOR_ALIGN);
            L->entry[L->n] = i;
            L->offset[L->n] = fill[g];
            L->n++;
            fill[g] += convert_bytes(s->view[i].dst);
            if (s->src[i].unit == UNIT_EMBED) {
                s->embed_group = g;
                s->embed_offset = L->offset[L->n - 1];
            }
        }
    }
    ferry_status st = FERRY_OK;
    for (int g = 0; g < p->n_groups; g++)
        if (ALIGN_UP(fill[g], OFFLOAD_ALIGN) != p->groups[g].bytes)
            st = ferry_fail(FERRY_ERR_INTERNAL, "group %d layout is %llu bytes, plan says %llu", g,
                            (unsigned long long)ALIGN_UP(fill[g], OFFLOAD_ALIGN),
                            (unsigned long long)p->groups[g].bytes);
    free(fill);
    return st;
}

/* ---- loading ------------------------------------------------------------ */

/* Receives a tensor's engine form in pieces, in increasing offset order
 * (`at`: from the tensor's start in the layout). */
typedef ferry_status (*sink_fn)(void *ctx, uint64_t at, const void *p, size_t n);

#define PIECE_BYTES (8u << 20) /* converted at a time: bounds the scratch */

/* Emits tensor i in its engine form (convert.h): the checkpoint's bytes as
 * they are where there is nothing to convert, else converted a piece of
 * rows at a time; the scales of a quantized tensor after its data. Each
 * piece's mapped checkpoint pages are released once used, so loading never
 * holds more than the resident tiers plus a piece. */
static ferry_status emit_tensor(store *s, int i, sink_fn sink, void *ctx)
{
    const weight *src = s->src[i].dst, *fmt = s->view[i].dst;
    size_t data_bytes = (size_t)fmt->rows * weight_row_bytes(fmt);
    size_t scale_row = (size_t)weight_groups(fmt) * dtype_size(fmt->scale_dtype);
    if (convert_is_copy(src, fmt)) {
        FERRY_TRY(sink(ctx, 0, src->data, data_bytes));
        st_release_pages(src->data, data_bytes);
        if (fmt->quant != WQ_NONE) {
            FERRY_TRY(sink(ctx, convert_scales_offset(fmt), src->scales, (size_t)fmt->rows * scale_row));
            st_release_pages(src->scales, (size_t)fmt->rows * scale_row);
        }
        return FERRY_OK;
    }
    int64_t piece = convert_piece_rows(src, fmt, PIECE_BYTES);
    size_t out_row = weight_row_bytes(fmt), src_row = weight_row_bytes(src);
    char *buf = malloc((size_t)piece * out_row);
    char *scales = fmt->quant != WQ_NONE ? malloc((size_t)fmt->rows * scale_row) : NULL;
    ferry_status st = FERRY_OK;
    if (!buf || (fmt->quant != WQ_NONE && !scales)) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory converting %s", s->src[i].name);
    for (int64_t r0 = 0; st == FERRY_OK && r0 < fmt->rows; r0 += piece) {
        int64_t n = fmt->rows - r0 < piece ? fmt->rows - r0 : piece;
        st = convert_rows(src, fmt, r0, n, buf, scales ? scales + (size_t)r0 * scale_row : NULL, s->src[i].name);
        if (st == FERRY_OK) st = sink(ctx, (uint64_t)r0 * out_row, buf, (size_t)n * out_row);
        st_release_pages((const char *)src->data + (size_t)r0 * src_row, (size_t)n * src_row);
    }
    if (st == FERRY_OK && scales) st = sink(ctx, convert_scales_offset(fmt), scales, (size_t)fmt->rows * scale_row);
    free(buf);
    free(scales);
    return st;
}

typedef struct {
    store *s;
    char *base; /* the tensor's place in the group's buffer */
    bool device;
} resident_sink;

static ferry_status put_resident(void *vctx, uint64_t at, const void *p, size_t n)
{
    resident_sink *c = vctx;
    if (c->device) c->s->be->ops->upload(c->s->be, c->base + at, p, n);
    else memcpy(c->base + at, p, n);
    return FERRY_OK;
}

/* Fills a resident buffer in group g's layout from the checkpoint. Padding
 * bytes are left as allocated: nothing reads them. */
static ferry_status fill_resident(store *s, int g, void *base, bool device)
{
    const group_layout *L = &s->layouts[g];
    for (int k = 0; k < L->n; k++) {
        resident_sink c = {s, (char *)base + L->offset[k], device};
        FERRY_TRY(emit_tensor(s, L->entry[k], put_resident, &c));
    }
    return FERRY_OK;
}

typedef struct {
    store *s;
    int *groups; /* blob index -> group */
} blob_ctx;

typedef struct {
    offload_writer *w;
    uint64_t start; /* the tensor's offset in the group */
    uint64_t *at;   /* bytes of the group written so far */
} blob_sink;

static ferry_status put_blob(void *vctx, uint64_t at, const void *p, size_t n)
{
    blob_sink *c = vctx;
    FERRY_TRY(offload_pad(c->w, (size_t)(c->start + at - *c->at)));
    FERRY_TRY(offload_write(c->w, p, n));
    *c->at = c->start + at + n;
    return FERRY_OK;
}

static ferry_status fill_blob(void *vctx, int i, offload_writer *w)
{
    blob_ctx *c = vctx;
    store *s = c->s;
    int g = c->groups[i];
    const group_layout *L = &s->layouts[g];
    uint64_t at = 0;
    for (int k = 0; k < L->n; k++) {
        blob_sink bs = {w, L->offset[k], &at};
        FERRY_TRY(emit_tensor(s, L->entry[k], put_blob, &bs));
    }
    return offload_pad(w, (size_t)(s->plan->groups[g].bytes - at));
}

static void blob_key(const plan_group *pg, char *buf, size_t cap)
{
    switch (pg->kind) {
    case GROUP_EMBED: snprintf(buf, cap, "embed"); break;
    case GROUP_HEAD: snprintf(buf, cap, "head"); break;
    case GROUP_LAYERS:
        snprintf(buf, cap, "layers-%03d-%03d", pg->first_layer, pg->first_layer + pg->n_layers - 1);
        break;
    }
}

static ferry_status open_disk_tier(store *s, const char *dir, const char *fingerprint)
{
    const plan *p = s->plan;
    int n = 0;
    for (int g = 0; g < p->n_groups; g++) n += p->groups[g].tier == TIER_DISK && p->groups[g].bytes > 0;
    if (n == 0) return FERRY_OK;
    if (!dir)
        return ferry_fail(FERRY_ERR_INVALID,
                          "%d groups do not fit the --max-memory budgets and must stream from disk: give "
                          "--offload-dir DIR",
                          n);
    offload_spec *specs = calloc((size_t)n, sizeof *specs);
    char(*keys)[32] = calloc((size_t)n, sizeof *keys);
    int *groups = calloc((size_t)n, sizeof *groups);
    ferry_status st = FERRY_OK;
    if (!specs || !keys || !groups) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    int k = 0;
    for (int g = 0; st == FERRY_OK && g < p->n_groups; g++) {
        if (p->groups[g].tier != TIER_DISK || p->groups[g].bytes == 0) continue;
        blob_key(&p->groups[g], keys[k], sizeof keys[k]);
        specs[k] = (offload_spec){keys[k], p->groups[g].bytes};
        groups[k] = g;
        s->blob[g] = k;
        k++;
    }
    blob_ctx ctx = {s, groups};
    if (st == FERRY_OK) st = offload_open(dir, fingerprint, specs, n, fill_blob, &ctx, &s->od);
    if (st == FERRY_OK && p->groups[s->embed_group].tier == TIER_DISK) {
        /* row reads are small and unaligned: a buffered descriptor, on the
         * very file offload_open verified (never one reopened by name) */
        st = offload_blob_open_buffered(&s->od->blobs[s->blob[s->embed_group]], &s->embed_fd);
    }
    free(specs);
    free(keys);
    free(groups);
    return st;
}

ferry_status store_open(store **out, backend *be, const plan *p, const model_config *cfg, const convert_opts *conv,
                        model_weights *ckpt, model_weights *view, const char *offload_path, const char *fingerprint)
{
    *out = NULL;
    store *s = calloc(1, sizeof *s);
    if (!s) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    s->be = be;
    s->plan = p;
    s->conv = *conv;
    pthread_rwlock_init(&s->blobs, NULL);
    s->embed_fd = -1;
    int n_view;
    ferry_status st = model_tensor_entries(cfg, ckpt, &s->src, &s->n_tensors);
    if (st == FERRY_OK) st = model_tensor_entries(cfg, view, &s->view, &n_view);
    if (st != FERRY_OK) goto fail;
    FERRY_ASSERT(n_view == s->n_tensors);
    /* the view holds the engine form of every tensor; store_bind points it at data */
    for (int i = 0; i < s->n_tensors && st == FERRY_OK; i++) st = convert_format(conv, &s->src[i], s->view[i].dst);
    if (st != FERRY_OK) goto fail;
    s->resident = calloc((size_t)p->n_groups, sizeof *s->resident);
    s->pinned = calloc((size_t)p->n_groups, sizeof *s->pinned);
    s->blob = malloc((size_t)p->n_groups * sizeof *s->blob);
    if (!s->resident || !s->pinned || !s->blob) {
        st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int g = 0; g < p->n_groups; g++) s->blob[g] = -1;
    if ((st = make_layouts(s, cfg)) != FERRY_OK) goto fail;

    for (int g = 0; g < p->n_groups; g++) {
        const plan_group *pg = &p->groups[g];
        if (pg->bytes == 0 || pg->tier == TIER_DISK) continue;
        char b[32];
        if (pg->tier == TIER_DEVICE) {
            s->resident[g] = be->ops->alloc(be, (size_t)pg->bytes);
            if (!s->resident[g]) {
                st = ferry_fail(FERRY_ERR_NOMEM, "cannot allocate %s of device memory for group %d",
                                util_fmt_bytes(pg->bytes, b, sizeof b), g);
                goto fail;
            }
            if ((st = fill_resident(s, g, s->resident[g], true)) != FERRY_OK) goto fail;
        } else {
            s->resident[g] = be->ops->host_alloc(be, (size_t)pg->bytes, &s->pinned[g]);
            if (!s->resident[g]) {
                st = ferry_fail(FERRY_ERR_NOMEM, "cannot allocate %s of host memory for group %d",
                                util_fmt_bytes(pg->bytes, b, sizeof b), g);
                goto fail;
            }
            if ((st = fill_resident(s, g, s->resident[g], false)) != FERRY_OK) goto fail;
        }
    }
    if ((st = open_disk_tier(s, offload_path, fingerprint)) != FERRY_OK) goto fail;
    *out = s;
    return FERRY_OK;
fail:
    store_close(s);
    return st;
}

void store_close(store *s)
{
    if (!s) return;
    if (s->resident)
        for (int g = 0; g < s->plan->n_groups; g++) {
            if (!s->resident[g]) continue;
            if (s->plan->groups[g].tier == TIER_DEVICE) s->be->ops->release(s->be, s->resident[g]);
            else s->be->ops->host_free(s->be, s->resident[g], (size_t)s->plan->groups[g].bytes, s->pinned[g]);
        }
    if (s->layouts)
        for (int g = 0; g < s->plan->n_groups; g++) {
            free(s->layouts[g].entry);
            free(s->layouts[g].offset);
        }
    if (s->embed_fd >= 0) close(s->embed_fd);
    offload_close(s->od);
    free(s->layouts);
    free(s->resident);
    free(s->pinned);
    free(s->blob);
    free(s->src);
    free(s->view);
    pthread_rwlock_destroy(&s->blobs);
    free(s);
}

static ferry_status rebuild_group(store *s, int g);

void store_blobs_read_begin(store *s) { pthread_rwlock_rdlock(&s->blobs); }
void store_blobs_read_end(store *s) { pthread_rwlock_unlock(&s->blobs); }

ferry_status store_rebuild_group(store *s, int g)
{
    pthread_rwlock_wrlock(&s->blobs);
    ferry_status st = rebuild_group(s, g);
    pthread_rwlock_unlock(&s->blobs);
    return st;
}

static ferry_status rebuild_group(store *s, int g)
{
    int i = s->blob[g];
    if (i < 0) return ferry_fail(FERRY_ERR_INTERNAL, "group %d is not on disk", g);
    int *groups = malloc((size_t)s->od->n * sizeof *groups);
    if (!groups) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    for (int k = 0; k < s->plan->n_groups; k++)
        if (s->blob[k] >= 0) groups[s->blob[k]] = k;
    blob_ctx ctx = {s, groups};
    ferry_status st = offload_rebuild(s->od, i, fill_blob, &ctx);
    free(groups);
    if (st == FERRY_OK && g == s->embed_group && s->embed_fd >= 0) {
        /* the row reader's descriptor is on the file replaced */
        close(s->embed_fd);
        s->embed_fd = -1;
        st = offload_blob_open_buffered(&s->od->blobs[i], &s->embed_fd);
    }
    return st;
}

store_source store_group_source(const store *s, int g)
{
    const plan_group *pg = &s->plan->groups[g];
    store_source src = {.tier = pg->tier, .bytes = pg->bytes, .resident = s->resident[g], .fd = -1};
    if (s->blob[g] >= 0) {
        const offload_blob *b = &s->od->blobs[s->blob[g]];
        src.fd = b->fd;
        src.path = b->path;
        src.offset = 0; /* one blob per group */
        src.crc = b->crc;
    }
    return src;
}

int store_group_tensor_count(const store *s, int g) { return s->layouts[g].n; }

store_tensor store_group_tensor(const store *s, int g, int k)
{
    const group_layout *L = &s->layouts[g];
    FERRY_ASSERT(k >= 0 && k < L->n);
    int i = L->entry[k];
    /* the format only: the pipeline thread rebinds data/scales meanwhile */
    const weight *v = s->view[i].dst;
    weight fmt = {.dtype = v->dtype, .rows = v->rows, .cols = v->cols, .quant = v->quant, .group = v->group,
                  .scale_dtype = v->scale_dtype};
    return (store_tensor){.name = s->src[i].name, .one_d = s->src[i].rows == 0, .ckpt = s->src[i].dst, .fmt = fmt,
                          .offset = L->offset[k]};
}

int store_embed_group(const store *s) { return s->embed_group; }

void store_bind(const store *s, int g, const void *base)
{
    const group_layout *L = &s->layouts[g];
    for (int k = 0; k < L->n; k++) convert_bind(s->view[L->entry[k]].dst, (const char *)base + L->offset[k]);
}

size_t store_embed_row_bytes(const store *s)
{
    for (int i = 0; i < s->n_tensors; i++)
        if (s->view[i].unit == UNIT_EMBED) return weight_row_bytes(s->view[i].dst);
    return 0;
}

ferry_status store_embed_rows(const store *s, const int32_t *tokens, int n, void *dst)
{
    size_t row = store_embed_row_bytes(s);
    int g = s->embed_group;
    for (int i = 0; i < n; i++) {
        uint64_t off = s->embed_offset + (uint64_t)tokens[i] * row;
        char *out = (char *)dst + (size_t)i * row;
        if (s->resident[g]) {
            memcpy(out, (const char *)s->resident[g] + off, row);
            continue;
        }
        size_t got = 0;
        while (got < row) {
            ssize_t r = pread(s->embed_fd, out + got, row - got, (off_t)(off + got));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0)
                return ferry_fail(FERRY_ERR_IO, "%s: embedding row read at %llu: %s",
                                  s->od->blobs[s->blob[g]].path, (unsigned long long)(off + got),
                                  r < 0 ? strerror(errno) : "unexpected end of file");
            got += (size_t)r;
        }
    }
    return FERRY_OK;
}
