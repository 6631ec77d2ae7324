/*
 * safetensors.c - header validation and checkpoint (single file or shards)
 * opening. See safetensors.h.
 */
#define _GNU_SOURCE
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/json.h"
#include "../base/util.h"
#include "gguf_hf.h"
#include "model_dir.h"

struct st_header {
    json_doc *doc; /* owns the tensor names */
    size_t n;
    st_tensor *tensors;
};

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

static int cmp_offset(const void *a, const void *b)
{
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return 0;
}

static uint64_t read_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static ferry_status parse_tensor(const char *label, const json_member *m, st_tensor *t)
{
    const json_value *info = &m->value;
    t->name = m->key;
    if (info->type != JSON_OBJECT)
        return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%s': entry is not an object", label, m->key);
    const json_value *dt = json_get(info, "dtype");
    const json_value *shape = json_get(info, "shape");
    const json_value *offs = json_get(info, "data_offsets");
    if (!dt || dt->type != JSON_STRING)
        return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%s': missing or non-string dtype", label, m->key);
    if (!dtype_from_name(dt->str, &t->dtype))
        return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%s': unknown dtype '%s'", label, m->key, dt->str);
    if (!shape || shape->type != JSON_ARRAY)
        return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%s': missing or non-array shape", label, m->key);
    if (shape->len > ST_MAX_DIMS)
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: tensor '%s': %zu dimensions (at most %d supported)",
                          label, m->key, shape->len, ST_MAX_DIMS);
    t->ndim = (int)shape->len;
    uint64_t numel = 1;
    for (size_t i = 0; i < shape->len; i++) {
        const json_value *d = &shape->items[i];
        if (d->type != JSON_NUMBER || !d->is_int || d->integer < 0)
            return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%s': shape[%zu] is not a non-negative integer",
                              label, m->key, i);
        t->shape[i] = d->integer;
        if (__builtin_mul_overflow(numel, (uint64_t)d->integer, &numel))
            return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%s': shape overflows", label, m->key);
    }
    uint64_t nbytes;
    if (__builtin_mul_overflow(numel, (uint64_t)dtype_size(t->dtype), &nbytes))
        return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%s': shape x dtype size overflows", label, m->key);
    if (!offs || offs->type != JSON_ARRAY || offs->len != 2)
        return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%s': data_offsets must be [begin, end]", label, m->key);
    for (int i = 0; i < 2; i++)
        if (offs->items[i].type != JSON_NUMBER || !offs->items[i].is_int || offs->items[i].integer < 0)
            return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%s': data_offsets are not non-negative integers",
                              label, m->key);
    uint64_t begin = (uint64_t)offs->items[0].integer, end = (uint64_t)offs->items[1].integer;
    if (end < begin)
        return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%s': data_offsets end %llu before begin %llu", label,
                          m->key, (unsigned long long)end, (unsigned long long)begin);
    if (end - begin != nbytes)
        return ferry_fail(FERRY_ERR_INVALID,
                          "%s: tensor '%s': %s shape needs %llu bytes but data_offsets span %llu", label, m->key,
                          dtype_name(t->dtype), (unsigned long long)nbytes, (unsigned long long)(end - begin));
    t->offset = begin; /* relative to the data section until st_parse rebases it */
    t->nbytes = nbytes;
    return FERRY_OK;
}

static ferry_status validate_metadata(const char *label, const json_value *meta)
{
    if (meta->type != JSON_OBJECT)
        return ferry_fail(FERRY_ERR_INVALID, "%s: __metadata__ is not an object", label);
    for (size_t i = 0; i < meta->len; i++)
        if (meta->members[i].value.type != JSON_STRING)
            return ferry_fail(FERRY_ERR_INVALID, "%s: __metadata__ value '%s' is not a string", label,
                              meta->members[i].key);
    return FERRY_OK;
}

ferry_status st_parse(const uint8_t *buf, size_t buf_len, uint64_t file_size, const char *label, st_header **out)
{
    *out = NULL;
    if (file_size < 8 || buf_len < 8)
        return ferry_fail(FERRY_ERR_INVALID, "%s: file too small for a safetensors header (%llu bytes)", label,
                          (unsigned long long)file_size);
    uint64_t n = read_le64(buf);
    if (n > ST_MAX_HEADER)
        return ferry_fail(FERRY_ERR_INVALID, "%s: header length %llu exceeds the 100 MB limit", label,
                          (unsigned long long)n);
    if (n > file_size - 8)
        return ferry_fail(FERRY_ERR_INVALID, "%s: header length %llu runs past the end of the file (%llu bytes)",
                          label, (unsigned long long)n, (unsigned long long)file_size);
    if (n > buf_len - 8) return ferry_fail(FERRY_ERR_INTERNAL, "%s: header not fully read", label);
    if (n == 0 || buf[8] != '{') return ferry_fail(FERRY_ERR_INVALID, "%s: header does not start with '{'", label);

    json_doc *doc;
    ferry_status st = json_parse((const char *)buf + 8, n, &doc);
    if (st != FERRY_OK) return ferry_fail_context(st, "%s: header", label);
    const json_value *root = json_doc_root(doc);
    if (root->type != JSON_OBJECT) {
        json_doc_free(doc);
        return ferry_fail(FERRY_ERR_INVALID, "%s: header is not a JSON object", label);
    }

    st_header *h = calloc(1, sizeof *h);
    st_tensor **by_off = NULL;
    if (!h) goto nomem;
    h->doc = doc;
    h->tensors = calloc(root->len ? root->len : 1, sizeof *h->tensors);
    by_off = calloc(root->len ? root->len : 1, sizeof *by_off);
    if (!h->tensors || !by_off) goto nomem;
    for (size_t i = 0; i < root->len; i++) {
        const json_member *m = &root->members[i];
        if (strcmp(m->key, "__metadata__") == 0) {
            if ((st = validate_metadata(label, &m->value)) != FERRY_OK) goto fail;
            continue;
        }
        st_tensor *t = &h->tensors[h->n];
        t->file = -1;
        if ((st = parse_tensor(label, m, t)) != FERRY_OK) goto fail;
        by_off[h->n++] = t;
    }

    /* Contiguity: sorted by offset, each tensor starts where the last ended. */
    qsort(by_off, h->n, sizeof *by_off, cmp_offset);
    uint64_t expect = 0;
    for (size_t i = 0; i < h->n; i++) {
        const st_tensor *t = by_off[i];
        if (t->offset != expect) {
            st = ferry_fail(FERRY_ERR_INVALID,
                            t->offset < expect
                                ? "%s: tensor '%s': data_offsets [%llu, %llu) overlap the previous tensor (which ends at %llu)"
                                : "%s: tensor '%s': data_offsets [%llu, %llu) leave a gap after the previous tensor (which ends at %llu)",
                            label, t->name, (unsigned long long)t->offset,
                            (unsigned long long)(t->offset + t->nbytes), (unsigned long long)expect);
            goto fail;
        }
        expect += t->nbytes;
    }
    if (expect != file_size - 8 - n) {
        st = ferry_fail(FERRY_ERR_INVALID,
                        "%s: tensor data ends at byte %llu of the data section but the file holds %llu data bytes",
                        label, (unsigned long long)expect, (unsigned long long)(file_size - 8 - n));
        goto fail;
    }
    for (size_t i = 0; i < h->n; i++) h->tensors[i].offset += 8 + n;

    qsort(h->tensors, h->n, sizeof *h->tensors, cmp_name);
    for (size_t i = 1; i < h->n; i++) {
        if (strcmp(h->tensors[i - 1].name, h->tensors[i].name) == 0) {
            st = ferry_fail(FERRY_ERR_INVALID, "%s: duplicate tensor name '%s'", label, h->tensors[i].name);
            goto fail;
        }
    }
    free(by_off);
    *out = h;
    return FERRY_OK;

nomem:
    st = ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory reading the header", label);
fail:
    free(by_off);
    if (h) {
        free(h->tensors);
        free(h);
    }
    json_doc_free(doc);
    return st;
}

size_t st_header_count(const st_header *h) { return h->n; }
const st_tensor *st_header_tensor(const st_header *h, size_t i) { return &h->tensors[i]; }

void st_header_free(st_header *h)
{
    if (!h) return;
    json_doc_free(h->doc);
    free(h->tensors);
    free(h);
}

void st_release_pages(const void *data, size_t n)
{
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)data & ~(uintptr_t)(page - 1);
    uintptr_t hi = ((uintptr_t)data + n + (uintptr_t)page - 1) & ~(uintptr_t)(page - 1);
    madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

uint64_t st_tensor_numel(const st_tensor *t)
{
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
    return n;
}

/* ---- files and checkpoints -------------------------------------------- */

/* Through model_dir_open: where the file may resolve to (model_dir.h). */
static ferry_status file_open(const char *dir, const char *name, st_file *f)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->name = strdup(name);
    if (!f->name) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    FERRY_TRY(model_dir_open(dir, name, &f->fd, &f->path));
    struct stat sb;
    if (fstat(f->fd, &sb) != 0) return ferry_fail(FERRY_ERR_IO, "%s: %s", f->path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) return ferry_fail(FERRY_ERR_INVALID, "%s: not a regular file", f->path);
    f->size = (uint64_t)sb.st_size;
    if (f->size < 8)
        return ferry_fail(FERRY_ERR_INVALID, "%s: file too small for a safetensors header (%llu bytes)", f->path,
                          (unsigned long long)f->size);
    void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, f->fd, 0);
    if (m == MAP_FAILED) return ferry_fail(FERRY_ERR_IO, "%s: mmap: %s", f->path, strerror(errno));
    f->map = m;
    return st_parse(f->map, f->size, f->size, f->path, &f->header);
}

static void file_close(st_file *f)
{
    if (f->map) munmap((void *)f->map, f->size);
    if (f->fd >= 0) close(f->fd);
    st_header_free(f->header);
    free(f->path);
    free(f->name);
}

/* A weight_map entry must be a bare file name; where it resolves to is
 * model_dir_open's rule, checked as each shard opens. */
static ferry_status check_shard_name(const char *dir, const char *name)
{
    if (!*name || strchr(name, '/') || strchr(name, '\\') || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return ferry_fail(FERRY_ERR_INVALID,
                          "%s/model.safetensors.index.json: weight_map file '%s' is not a bare file name", dir, name);
    return FERRY_OK;
}


/* Collects the distinct shard names of the index, in order of first use. */
static ferry_status index_shards(const char *dir, const json_value *wm, char ***names, int *n)
{
    *names = NULL;
    *n = 0;
    char **v = calloc(wm->len ? wm->len : 1, sizeof *v);
    if (!v) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < wm->len; i++) {
        const json_value *f = &wm->members[i].value;
        if (f->type != JSON_STRING) {
            free(v);
            return ferry_fail(FERRY_ERR_INVALID, "%s/model.safetensors.index.json: weight_map['%s'] is not a string",
                              dir, wm->members[i].key);
        }
        int k = 0;
        while (k < *n && strcmp(v[k], f->str) != 0) k++;
        if (k < *n) continue;
        ferry_status st = check_shard_name(dir, f->str);
        if (st != FERRY_OK) {
            free(v);
            return st;
        }
        v[(*n)++] = (char *)f->str;
    }
    *names = v;
    return FERRY_OK;
}

static ferry_status gather_tensors(st_checkpoint *ck)
{
    size_t total = 0;
    for (int i = 0; i < ck->n_files; i++) total += st_header_count(ck->files[i].header);
    ck->tensors = calloc(total ? total : 1, sizeof *ck->tensors);
    if (!ck->tensors) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    for (int i = 0; i < ck->n_files; i++) {
        st_file *f = &ck->files[i];
        for (size_t k = 0; k < st_header_count(f->header); k++) {
            st_tensor t = *st_header_tensor(f->header, k);
            t.file = i;
            t.data = f->map + t.offset;
            ck->tensors[ck->n_tensors++] = t;
        }
    }
    qsort(ck->tensors, ck->n_tensors, sizeof *ck->tensors, cmp_name);
    for (size_t i = 1; i < ck->n_tensors; i++)
        if (strcmp(ck->tensors[i - 1].name, ck->tensors[i].name) == 0)
            return ferry_fail(FERRY_ERR_INVALID, "%s: tensor '%s' appears in both %s and %s", ck->dir,
                              ck->tensors[i].name, ck->files[ck->tensors[i - 1].file].name,
                              ck->files[ck->tensors[i].file].name);
    return FERRY_OK;
}

static ferry_status open_sharded(st_checkpoint *ck, const char *index_path)
{
    char *text = NULL;
    size_t len;
    json_doc *doc = NULL;
    char **names = NULL;
    ferry_status st = model_dir_read(ck->dir, "model.safetensors.index.json", &text, &len);
    if (st != FERRY_OK) return st;
    if ((st = json_parse(text, len, &doc)) != FERRY_OK) {
        st = ferry_fail_context(st, "%s", index_path);
        goto out;
    }
    const json_value *wm = json_get(json_doc_root(doc), "weight_map");
    if (!wm || wm->type != JSON_OBJECT) {
        st = ferry_fail(FERRY_ERR_INVALID, "%s: missing or non-object weight_map", index_path);
        goto out;
    }
    int n;
    if ((st = index_shards(ck->dir, wm, &names, &n)) != FERRY_OK) goto out;
    ck->files = calloc(n ? (size_t)n : 1, sizeof *ck->files);
    if (!ck->files) {
        st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        ck->n_files++;
        if ((st = file_open(ck->dir, names[i], &ck->files[i])) != FERRY_OK) goto out;
    }
    if ((st = gather_tensors(ck)) != FERRY_OK) goto out;
    /* Every weight_map entry must be in the file it names. */
    for (size_t i = 0; i < wm->len; i++) {
        const st_tensor *t = st_checkpoint_find(ck, wm->members[i].key);
        const char *want = wm->members[i].value.str;
        if (!t || strcmp(ck->files[t->file].name, want) != 0) {
            st = ferry_fail(FERRY_ERR_INVALID, "%s: weight_map says tensor '%s' is in %s, but it is not there",
                            index_path, wm->members[i].key, want);
            goto out;
        }
    }
out:
    free(names);
    json_doc_free(doc);
    free(text);
    return st;
}

ferry_status st_checkpoint_open(const char *dir, st_checkpoint **out)
{
    *out = NULL;
    st_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck || !(ck->dir = strdup(dir))) {
        free(ck);
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    ferry_status st;
    if (gguf_hf_is_model(dir)) {
        if ((st = gguf_hf_checkpoint_open(dir, ck)) != FERRY_OK) {
            st_checkpoint_close(ck);
            return st;
        }
        *out = ck;
        return FERRY_OK;
    }
    char *index = util_path_join(dir, "model.safetensors.index.json");
    /* present even as a link to nothing: opening it says so (an
     * interrupted download in the Hugging Face cache) */
    if (!index) {
        st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    } else if (model_dir_has(dir, "model.safetensors")) {
        ck->files = calloc(1, sizeof *ck->files);
        if (!ck->files) {
            st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        } else {
            ck->n_files = 1;
            st = file_open(dir, "model.safetensors", &ck->files[0]);
            if (st == FERRY_OK) st = gather_tensors(ck);
        }
    } else if (model_dir_has(dir, "model.safetensors.index.json")) {
        st = open_sharded(ck, index);
    } else {
        st = ferry_fail(FERRY_ERR_NOT_FOUND, "%s: no model.safetensors or model.safetensors.index.json", dir);
    }
    free(index);
    if (st != FERRY_OK) {
        st_checkpoint_close(ck);
        return st;
    }
    *out = ck;
    return FERRY_OK;
}

const st_tensor *st_checkpoint_find(const st_checkpoint *ck, const char *name)
{
    st_tensor key = {.name = name};
    return bsearch(&key, ck->tensors, ck->n_tensors, sizeof key, cmp_name);
}

void st_checkpoint_close(st_checkpoint *ck)
{
    if (!ck) return;
    if (ck->gguf_model) {
        /* every slot: the parts' and the converted file's, even when opening failed before them */
        ck->n_files = ck->files ? ck->n_gguf_parts + 1 : 0;
        gguf_hf_checkpoint_free(ck);
    }
    for (int i = 0; i < ck->n_files; i++) file_close(&ck->files[i]);
    free(ck->files);
    free(ck->tensors);
    free(ck->dir);
    free(ck);
}
