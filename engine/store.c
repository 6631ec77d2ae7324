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
#include <sys/stat.h>
#include <unistd.h>

#include "base/util.h"
#include "io/crc32c.h"

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
    int *unit;             /* [n_tensors] the unit each belongs to (model.h numbering) */
    group_layout *layouts; /* [plan->n_groups] */
    void **resident;       /* [n_groups] backend (device) or host buffer; NULL when on disk */
    bool *pinned;          /* [n_groups] host buffer is pinned */
    offload_dir *od;       /* disk tier, or NULL */
    int *blob;             /* [n_groups] blob index in od, or -1 */
    uint64_t *blob_at;     /* [n_groups] where the group starts in its blob (experts share one per run) */
    int *blob_region;      /* [n_groups] its region of the blob */
    int *blob_first;       /* [od->n] the first group of each blob ... */
    int *blob_groups;      /* [od->n] ... and how many consecutive groups it holds */
    int embed_group;       /* the group holding model.embed_tokens.weight */
    uint64_t embed_offset; /* its offset in that group */
    int embed_fd;          /* buffered descriptor on the verified embedding blob, for row reads when on disk */
    pthread_rwlock_t blobs; /* readers of blob descriptors outside the pipeline (export) vs a rebuild */
};


/* Unit of each tensor entry (model.h numbering: 0 embedding, 1 + l layer
 * l, n_layers + 1 head, then the experts). A tied embedding table belongs to
 * the head: it is the lm_head (unless --quantize-head holds a quantized copy
 * as the head: cfg->tied is false then, convert_config). */
static int unit_of(const model_config *cfg, const tensor_entry *t)
{
    switch (t->unit) {
    case UNIT_EMBED: return cfg->tied ? cfg->n_layers + 1 : 0;
    case UNIT_LAYER: return 1 + t->layer;
    case UNIT_HEAD: return cfg->n_layers + 1;
    case UNIT_EXPERT: return model_expert_unit(cfg, t->layer, t->expert);
    }
    return 0;
}

ferry_status store_unit_bytes(const model_config *cfg, const model_weights *w, const convert_opts *conv,
                              uint64_t *unit_bytes)
{
    tensor_entry *entries;
    int n;
    FERRY_TRY(model_tensor_entries(cfg, (model_weights *)w, &entries, &n));
    int n_units = model_unit_count(cfg);
    memset(unit_bytes, 0, (size_t)n_units * sizeof *unit_bytes);
    ferry_status st = FERRY_OK;
    for (int i = 0; i < n; i++) {
        weight fmt;
        if ((st = convert_format(conv, &entries[i], &fmt)) != FERRY_OK) break; /* fmt is incomplete */
        int u = unit_of(cfg, &entries[i]);
        unit_bytes[u] = ALIGN_UP(unit_bytes[u], STORE_TENSOR_ALIGN) + convert_bytes(&fmt);
    }
    for (int u = 0; u < n_units; u++) unit_bytes[u] = ALIGN_UP(unit_bytes[u], OFFLOAD_ALIGN);
    free(entries);
    return st;
}

/* The group of unit u (plan.h: embed, layer groups, head, experts). */
static int group_of_unit(const plan *p, int u, int n_layers)
{
    if (u == 0) return 0;
    if (u <= n_layers) return 1 + (u - 1) / p->opts.group_size;
    if (u == n_layers + 1) return p->first_expert - 1;
    return p->first_expert + (u - n_layers - 2);
}

/* Offsets: units in order within the group, each starting 4096-aligned,
 * tensors 256-aligned within the unit - the layout store_unit_bytes sized.
 * The entries come in execution order, so each unit's tensors come
 * together and a group's units in order. */
static ferry_status make_layouts(store *s, const model_config *cfg)
{
    const plan *p = s->plan;
    s->layouts = calloc((size_t)p->n_groups, sizeof *s->layouts);
    int *count = calloc((size_t)p->n_groups, sizeof *count), *last = malloc((size_t)p->n_groups * sizeof *last);
    uint64_t *fill = calloc((size_t)p->n_groups, sizeof *fill);
    ferry_status st = FERRY_OK;
    if (!s->layouts || !count || !last || !fill) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    for (int i = 0; st == FERRY_OK && i < s->n_tensors; i++) count[group_of_unit(p, s->unit[i], cfg->n_layers)]++;
    for (int g = 0; st == FERRY_OK && g < p->n_groups; g++) {
        last[g] = -1;
        s->layouts[g].entry = calloc((size_t)count[g] + 1, sizeof(int));
        s->layouts[g].offset = calloc((size_t)count[g] + 1, sizeof(uint64_t));
        if (!s->layouts[g].entry || !s->layouts[g].offset) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; st == FERRY_OK && i < s->n_tensors; i++) {
        int u = s->unit[i], g = group_of_unit(p, u, cfg->n_layers);
        group_layout *L = &s->layouts[g];
        if (u != last[g]) fill[g] = ALIGN_UP(fill[g], OFFLOAD_ALIGN);
        last[g] = u;
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
    for (int g = 0; st == FERRY_OK && g < p->n_groups; g++)
        if (ALIGN_UP(fill[g], OFFLOAD_ALIGN) != p->groups[g].bytes)
            st = ferry_fail(FERRY_ERR_INTERNAL, "group %d layout is %llu bytes, plan says %llu", g,
                            (unsigned long long)ALIGN_UP(fill[g], OFFLOAD_ALIGN),
                            (unsigned long long)p->groups[g].bytes);
    free(fill);
    free(count);
    free(last);
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
        if (weight_has_scales(fmt)) {
            FERRY_TRY(sink(ctx, convert_scales_offset(fmt), src->scales, (size_t)fmt->rows * scale_row));
            st_release_pages(src->scales, (size_t)fmt->rows * scale_row);
        }
        return FERRY_OK;
    }
    int64_t piece = convert_piece_rows(src, fmt, PIECE_BYTES);
    size_t out_row = weight_row_bytes(fmt), src_row = weight_row_bytes(src);
    char *buf = malloc((size_t)piece * out_row);
    char *scales = weight_has_scales(fmt) ? malloc((size_t)fmt->rows * scale_row) : NULL;
    ferry_status st = FERRY_OK;
    if (!buf || (weight_has_scales(fmt) && !scales)) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory converting %s", s->src[i].name);
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
    offload_writer *w;
    uint64_t start; /* the tensor's offset in the blob */
    uint64_t *at;   /* bytes of the blob written so far */
} blob_sink;

static ferry_status put_blob(void *vctx, uint64_t at, const void *p, size_t n)
{
    blob_sink *c = vctx;
    FERRY_TRY(offload_pad(c->w, (size_t)(c->start + at - *c->at)));
    FERRY_TRY(offload_write(c->w, p, n));
    *c->at = c->start + at + n;
    return FERRY_OK;
}

/* Blob i: its groups one after the other (one group, or a run of one
 * layer's experts), each in its layout. */
static ferry_status fill_blob(void *vctx, int i, offload_writer *w)
{
    store *s = vctx;
    uint64_t at = 0;
    for (int g = s->blob_first[i]; g < s->blob_first[i] + s->blob_groups[i]; g++) {
        const group_layout *L = &s->layouts[g];
        for (int k = 0; k < L->n; k++) {
            blob_sink bs = {w, s->blob_at[g] + L->offset[k], &at};
            FERRY_TRY(emit_tensor(s, L->entry[k], put_blob, &bs));
        }
        FERRY_TRY(offload_pad(w, (size_t)(s->blob_at[g] + s->plan->groups[g].bytes - at)));
        at = s->blob_at[g] + s->plan->groups[g].bytes;
    }
    return FERRY_OK;
}

static void blob_key(const plan_group *pg, int last_expert, char *buf, size_t cap)
{
    switch (pg->kind) {
    case GROUP_EMBED: snprintf(buf, cap, "embed"); break;
    case GROUP_HEAD: snprintf(buf, cap, "head"); break;
    case GROUP_LAYERS:
        snprintf(buf, cap, "layers-%03d-%03d", pg->first_layer, pg->first_layer + pg->n_layers - 1);
        break;
    case GROUP_EXPERT: snprintf(buf, cap, "experts-%03d-%03d-%03d", pg->first_layer, pg->expert, last_expert); break;
    }
}

/* Disk groups n >= g that go in g's blob: g alone, or the run of experts of
 * g's layer that follow it on disk. */
static int blob_run(const plan *p, int g)
{
    const plan_group *pg = &p->groups[g];
    int n = 1;
    if (pg->kind != GROUP_EXPERT) return 1;
    while (g + n < p->n_groups && p->groups[g + n].kind == GROUP_EXPERT && p->groups[g + n].tier == TIER_DISK &&
           p->groups[g + n].first_layer == pg->first_layer && p->groups[g + n].bytes > 0)
        n++;
    return n;
}

static ferry_status open_disk_tier(store *s, const char *dir, const char *fingerprint)
{
    const plan *p = s->plan;
    int n = 0, n_groups = 0;
    for (int g = 0; g < p->n_groups; g++) {
        if (p->groups[g].tier != TIER_DISK || p->groups[g].bytes == 0) continue;
        int run = blob_run(p, g);
        n++;
        n_groups += run;
        g += run - 1;
    }
    if (n == 0) return FERRY_OK;
    if (!dir)
        return ferry_fail(FERRY_ERR_INVALID,
                          "%d groups do not fit the --max-memory budgets and must stream from disk: give "
                          "--offload-dir DIR",
                          n_groups);
    offload_spec *specs = calloc((size_t)n, sizeof *specs);
    char(*keys)[32] = calloc((size_t)n, sizeof *keys);
    uint64_t *regions = calloc((size_t)n_groups, sizeof *regions);
    s->blob_first = calloc((size_t)n, sizeof *s->blob_first);
    s->blob_groups = calloc((size_t)n, sizeof *s->blob_groups);
    ferry_status st = FERRY_OK;
    if (!specs || !keys || !regions || !s->blob_first || !s->blob_groups) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    int k = 0, r = 0;
    for (int g = 0; st == FERRY_OK && g < p->n_groups; g++) {
        if (p->groups[g].tier != TIER_DISK || p->groups[g].bytes == 0) continue;
        int run = blob_run(p, g);
        blob_key(&p->groups[g], p->groups[g + run - 1].expert, keys[k], sizeof keys[k]);
        specs[k] = (offload_spec){keys[k], 0, run > 1 ? run : 0, run > 1 ? &regions[r] : NULL};
        s->blob_first[k] = g;
        s->blob_groups[k] = run;
        for (int j = 0; j < run; j++) {
            s->blob[g + j] = k;
            s->blob_at[g + j] = specs[k].size;
            s->blob_region[g + j] = j;
            regions[r++] = p->groups[g + j].bytes;
            specs[k].size += p->groups[g + j].bytes;
        }
        k++;
        g += run - 1;
    }
    if (st == FERRY_OK) st = offload_open(dir, fingerprint, specs, n, fill_blob, s, &s->od);
    if (st == FERRY_OK && p->groups[s->embed_group].tier == TIER_DISK) {
        /* row reads are small and unaligned: a buffered descriptor, on the
         * very file offload_open verified (never one reopened by name) */
        st = offload_blob_open_buffered(&s->od->blobs[s->blob[s->embed_group]], &s->embed_fd);
    }
    free(specs);
    free(keys);
    free(regions);
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
    if (!(s->unit = malloc((size_t)s->n_tensors * sizeof *s->unit))) {
        st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < s->n_tensors; i++) s->unit[i] = unit_of(cfg, &s->src[i]);
    /* the view holds the engine form of every tensor; store_bind points it at data */
    for (int i = 0; i < s->n_tensors && st == FERRY_OK; i++) st = convert_format(conv, &s->src[i], s->view[i].dst);
    if (st != FERRY_OK) goto fail;
    s->resident = calloc((size_t)p->n_groups, sizeof *s->resident);
    s->pinned = calloc((size_t)p->n_groups, sizeof *s->pinned);
    s->blob = malloc((size_t)p->n_groups * sizeof *s->blob);
    s->blob_at = calloc((size_t)p->n_groups, sizeof *s->blob_at);
    s->blob_region = calloc((size_t)p->n_groups, sizeof *s->blob_region);
    if (!s->resident || !s->pinned || !s->blob || !s->blob_at || !s->blob_region) {
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
    free(s->blob_at);
    free(s->blob_region);
    free(s->blob_first);
    free(s->blob_groups);
    free(s->unit);
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
    ferry_status st = offload_rebuild(s->od, i, fill_blob, s);
    if (st == FERRY_OK && g == s->embed_group && s->embed_fd >= 0) {
        /* the row reader's descriptor is on the file replaced */
        close(s->embed_fd);
        s->embed_fd = -1;
        st = offload_blob_open_buffered(&s->od->blobs[i], &s->embed_fd);
    }
    return st;
}

bool store_same_blob(const store *s, int g, int h)
{
    return s->blob[g] >= 0 && s->blob[g] == s->blob[h];
}

store_source store_group_source(const store *s, int g)
{
    const plan_group *pg = &s->plan->groups[g];
    store_source src = {.tier = pg->tier, .bytes = pg->bytes, .resident = s->resident[g], .fd = -1};
    if (s->blob[g] >= 0) {
        const offload_blob *b = &s->od->blobs[s->blob[g]];
        src.fd = b->fd;
        src.path = b->path;
        src.offset = s->blob_at[g];
        src.crc = b->region_crc[s->blob_region[g]];
    }
    return src;
}

ferry_status store_check_read(const store *s, int g, const void *data, char *msg, size_t cap)
{
    store_source src = store_group_source(s, g);
    uint32_t got = crc32c(0, data, (size_t)src.bytes);
    if (got == src.crc) return FERRY_OK;
    snprintf(msg, cap,
             "%s: checksum mismatch (CRC-32C %08x, the offload manifest says %08x): the blob changed or the disk "
             "returned bad data; ferry rebuilds it from the checkpoint",
             src.path, (unsigned)got, (unsigned)src.crc);
    return FERRY_ERR_IO;
}

bool store_blob_short(const store *s, int g)
{
    store_source src = store_group_source(s, g);
    struct stat sb;
    return src.fd >= 0 && fstat(src.fd, &sb) == 0 && (uint64_t)sb.st_size < src.offset + src.bytes;
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
                  .scale_dtype = v->scale_dtype, .block = v->block};
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
