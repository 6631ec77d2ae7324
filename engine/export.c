/*
 * export.c - writing a loaded engine's weights as a Hugging Face checkpoint.
 * See export.h for the contract; this file is how it is kept.
 *
 * A job is planned before its thread starts: the list of output tensors
 * (groups in order, a group's tensors sorted by name, shards filled in
 * order), from which come the shard headers, the index and the bytes the
 * free-space check asks for. The thread then walks that list once: the
 * first tensor of a group brings the group in (a resident host buffer is
 * read in place; device memory of a non-unified backend is downloaded and a
 * disk-tier blob is pread and checked against its CRC-32C, both into the
 * one group buffer), and every tensor is streamed from it into its shard,
 * through the one write buffer where its bytes must change (int8 repacked,
 * dequantized, cast).
 *
 * Memory bound, beyond serving: the largest group read into the buffer
 * (only when a group lives on disk or in non-unified device memory) plus
 * EXPORT_WRITE_BUF (or one output row, if larger) plus convert_rows'
 * one-row scratch; headers and the plan are O(tensors).
 *
 * Durability (export.h): root/.ferry-export-NAME.tmp.PID is the job's
 * directory; shards (st_writer: fsynced), config.json and the copied files
 * (fsynced), then the index, then the directory fsynced, renamed to
 * root/NAME (an existing one swapped out with RENAME_EXCHANGE and removed,
 * or renamed aside first where the file system cannot swap), and the root
 * fsynced. Temporaries whose PID is not running are removed by the next
 * export_start of any name.
 *
 * Confinement: the root is opened once with O_DIRECTORY | O_NOFOLLOW (a
 * root that is itself a symlink is refused: configure its target), and
 * every later name is a single checked component used relative to that
 * descriptor (openat / mkdirat / renameat / unlinkat), never followed
 * through a symlink. An existing root/NAME that is not a directory (a
 * symlink placed there included) is refused, overwrite or not. The job's
 * files are written through the temporary's descriptor (dirfd), and the
 * rename that publishes it goes by name, so publish first checks that the
 * name still holds dirfd's inode (is_job_dir), and again after the rename.
 */
#define _GNU_SOURCE
#include "export.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "base/json.h"
#include "base/util.h"
#include "io/crc32c.h"
#include "base/fault.h"
#include "store.h"
#include "weights/convert.h"
#include "weights/ct_config.h"
#include "weights/model_dir.h"
#include "weights/st_writer.h"

#define EXPORT_WRITE_BUF (4u << 20)       /* converted bytes staged per write */
#define EXPORT_CHUNK (1u << 20)           /* one write call; cancel and progress granularity */
#define EXPORT_READ_CHUNK (8u << 20)      /* one pread / download of a group */
#define EXPORT_DEFAULT_SHARD 5000000000ull /* transformers' "5GB" */
#define TMP_PREFIX ".ferry-export-"
#define EXPORT_MARKER ".ferry-export.json" /* in every export: what overwrite may replace */

/* How an output tensor's bytes come from its engine tensor. */
typedef enum {
    OUT_BYTES,    /* the engine bytes as they are (data, or int4 packed words) */
    OUT_SCALES,   /* the scales of a quantized tensor, as they are */
    OUT_INT8_PACK,/* plain int8 -> compressed-tensors' pack-quantized words */
    OUT_SHAPE,    /* I64 [rows, cols] */
    OUT_CONVERT,  /* convert_rows into the checkpoint's form (dequantize or cast) */
} out_kind;

typedef struct {
    char name[160];
    ferry_dtype dtype;
    int ndim;
    int64_t shape[2];
    uint64_t bytes;
    out_kind kind;
    int group, tensor; /* the store tensor it comes from */
    weight to;         /* OUT_CONVERT: the checkpoint form (unquantized) */
    int shard;
} out_tensor;

struct export_job {
    engine *e;
    const store *s;
    backend *be;
    export_layout layout;
    uint64_t max_shard;
    bool overwrite;
    export_end_fn on_end;
    void *on_end_arg;
    char name[EXPORT_NAME_MAX + 1];
    char tmp[EXPORT_NAME_MAX + 64]; /* root-relative temporary directory, flock'ed while the job runs */
    char tmp_id[17];                /* its random part */
    char *model_dir;
    int rootfd, dirfd;              /* dirfd: the temporary this job created, opened at its creation */
    dev_t dir_dev;                  /* dirfd's inode: what publish renames must be it (is_job_dir) */
    ino_t dir_ino;
    bool tmp_replaced;              /* something else took the temporary's name: not ours to remove */
    out_tensor *out;
    int n_out, n_shards;
    uint64_t total;                 /* tensor bytes */
    char *group_buf;                /* EXPORT: the one group buffer (aligned for O_DIRECT) */
    uint64_t group_cap;
    char *wbuf;                     /* the one write buffer */
    size_t wcap;
    double delay_ms_per_mib;        /* FERRY_EXPORT_DELAY_MS: a slow disk for tests */
    uint64_t delay_owed;            /* bytes written not yet paid for */
    atomic_bool cancel;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;             /* guards status */
    export_status status;
};

/* ---- names and the file system ------------------------------------------ */

bool export_layout_parse(const char *s, export_layout *out)
{
    if (!s) return false;
    if (!strcmp(s, "converted")) *out = EXPORT_CONVERTED;
    else if (!strcmp(s, "original")) *out = EXPORT_ORIGINAL;
    else return false;
    return true;
}

const char *export_state_name(export_state s)
{
    static const char *k[] = {"queued", "running", "done", "failed", "cancelled"};
    return (unsigned)s < sizeof k / sizeof k[0] ? k[s] : "?";
}

/* No leading '.': "." and "..", and the temporaries' prefix, are ferry's. */
static bool name_ok(const char *n)
{
    size_t len = strlen(n);
    if (len < 1 || len > EXPORT_NAME_MAX || n[0] == '.') return false;
    for (const char *p = n; *p; p++)
        if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '.' ||
              *p == '_' || *p == '-'))
            return false;
    return true;
}

static void remove_tree_at(int dirfd, const char *name, int depth);

/* Removes everything in the directory open as fd (its own descriptor: it is
 * closed), never following a symlink. */
static void remove_entries(int fd, int depth)
{
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && depth < 8) remove_tree_at(fd, de->d_name, depth + 1);
    closedir(d);
}

/* Removes name under dirfd: a file, or a directory and everything in it,
 * never following a symlink (a link is removed, not its target). */
static void remove_tree_at(int dirfd, const char *name, int depth)
{
    if (unlinkat(dirfd, name, 0) == 0 || (errno != EISDIR && errno != EPERM)) return;
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return;
    remove_entries(fd, depth);
    unlinkat(dirfd, name, AT_REMOVEDIR);
}

/* A temporary of an export: ".ferry-export-NAME.tmp.ID" (being written) or
 * ".ferry-export-NAME.old.ID" (a previous export renamed aside while the new
 * one is put in its place). Its writer holds an exclusive flock on it for as
 * long as it works on it, so one nobody holds is stale - whatever process,
 * container or host left it (a PID says nothing across PID namespaces: in a
 * container every restart is PID 1). NAME gets the export's name, *old
 * whether it is the renamed-aside kind. */
static bool temp_parse(const char *n, char name[EXPORT_NAME_MAX + 1], bool *old)
{
    size_t pl = strlen(TMP_PREFIX);
    if (strncmp(n, TMP_PREFIX, pl)) return false;
    const char *dot = strrchr(n, '.');
    if (!dot || dot - n < (ptrdiff_t)pl + 5) return false;
    bool is_tmp = !strncmp(dot - 4, ".tmp", 4), is_old = !strncmp(dot - 4, ".old", 4);
    size_t nl = (size_t)(dot - 4 - (n + pl));
    if ((!is_tmp && !is_old) || nl < 1 || nl > EXPORT_NAME_MAX) return false;
    memcpy(name, n + pl, nl);
    name[nl] = '\0';
    *old = is_old;
    return true;
}

/* Temporaries nobody holds: a stale ".tmp" is removed; a stale ".old" is a
 * previous export whose replacement never got its name (killed between the
 * two renames where the file system cannot swap in one step): it goes back
 * under its name if that is free, and is removed otherwise. */
static void remove_stale_temps(int rootfd)
{
    int fd = openat(rootfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        char name[EXPORT_NAME_MAX + 1];
        bool old;
        if (!temp_parse(de->d_name, name, &old)) continue;
        int tfd = openat(rootfd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (tfd < 0) continue;
        bool stale = flock(tfd, LOCK_EX | LOCK_NB) == 0; /* held while it is ours, released with tfd */
        if (stale && old && renameat2(rootfd, de->d_name, rootfd, name, RENAME_NOREPLACE) == 0) {
            close(tfd);
            continue;
        }
        if (stale) remove_tree_at(rootfd, de->d_name, 0);
        close(tfd);
    }
    closedir(d);
}

void export_remove_stale(const char *root)
{
    int rootfd = open(root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (rootfd < 0) return;
    remove_stale_temps(rootfd);
    close(rootfd);
}

/* ---- planning the output ------------------------------------------------- */

static int cmp_out_name(const void *a, const void *b)
{
    return strcmp(((const out_tensor *)a)->name, ((const out_tensor *)b)->name);
}

static uint64_t decl_bytes(const out_tensor *t)
{
    uint64_t b = dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) b *= (uint64_t)t->shape[d];
    return b;
}

/* The name of a quantized tensor's part: NAME.weight -> NAME.weight_<part>. */
static void part_name(char *buf, size_t cap, const char *name, const char *part)
{
    snprintf(buf, cap, "%s_%s", name, part);
}

/* Appends the output tensors of store tensor (g, k). */
static void plan_tensor(export_job *j, int g, int k, out_tensor *v, int *n)
{
    store_tensor st = store_group_tensor(j->s, g, k);
    const weight *f = &st.fmt;
    out_tensor base = {.group = g, .tensor = k, .ndim = st.one_d ? 1 : 2};
    if (st.one_d) base.shape[0] = f->cols;
    else {
        base.shape[0] = f->rows;
        base.shape[1] = f->cols;
    }
    if (j->layout == EXPORT_ORIGINAL) {
        if (engine_get_info(j->e).head_from_embed && !strcmp(st.name, "lm_head.weight"))
            return; /* the checkpoint ties it: its embedding table is the head */
        const weight *c = st.ckpt;
        out_tensor t = base;
        snprintf(t.name, sizeof t.name, "%s", st.name);
        t.dtype = c->quant == WQ_GGUF ? DT_F32 : c->quant != WQ_NONE ? c->scale_dtype : c->dtype;
        bool same = f->quant == WQ_NONE && f->dtype == t.dtype;
        t.kind = same ? OUT_BYTES : OUT_CONVERT;
        t.to = (weight){.dtype = t.dtype, .rows = f->rows, .cols = f->cols};
        v[(*n)++] = t;
        return;
    }
    if (f->quant == WQ_NONE) {
        out_tensor t = base;
        snprintf(t.name, sizeof t.name, "%s", st.name);
        t.dtype = f->dtype;
        t.kind = OUT_BYTES;
        v[(*n)++] = t;
        return;
    }
    if (f->quant == WQ_GGUF) { /* no Hugging Face format holds GGUF blocks: dequantized to f32 */
        out_tensor t = base;
        snprintf(t.name, sizeof t.name, "%s", st.name);
        t.dtype = DT_F32;
        t.kind = OUT_CONVERT;
        t.to = (weight){.dtype = DT_F32, .rows = f->rows, .cols = f->cols};
        v[(*n)++] = t;
        return;
    }
    int per_word = f->quant == WQ_INT8 ? 4 : 8;
    out_tensor t = base;
    part_name(t.name, sizeof t.name, st.name, "packed");
    t.dtype = DT_I32;
    t.shape[1] = (f->cols + per_word - 1) / per_word;
    t.kind = f->quant == WQ_INT8 ? OUT_INT8_PACK : OUT_BYTES;
    v[(*n)++] = t;
    t = base;
    part_name(t.name, sizeof t.name, st.name, "scale");
    t.dtype = f->scale_dtype;
    t.shape[1] = weight_groups(f);
    t.kind = OUT_SCALES;
    v[(*n)++] = t;
    t = base;
    part_name(t.name, sizeof t.name, st.name, "shape");
    t.dtype = DT_I64;
    t.ndim = 1;
    t.shape[0] = 2;
    t.kind = OUT_SHAPE;
    v[(*n)++] = t;
}

static ferry_status plan_output(export_job *j)
{
    const plan *p = engine_get_plan(j->e);
    int cap = 0;
    for (int g = 0; g < p->n_groups; g++) cap += 3 * store_group_tensor_count(j->s, g);
    j->out = calloc((size_t)(cap ? cap : 1), sizeof *j->out);
    if (!j->out) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    size_t max_row = 0;
    for (int g = 0; g < p->n_groups; g++) {
        int first = j->n_out;
        for (int k = 0; k < store_group_tensor_count(j->s, g); k++) plan_tensor(j, g, k, j->out, &j->n_out);
        qsort(j->out + first, (size_t)(j->n_out - first), sizeof *j->out, cmp_out_name);
        store_source src = store_group_source(j->s, g);
        bool buffered = src.bytes && (src.tier == TIER_DISK || (src.tier == TIER_DEVICE && !j->be->ops->unified));
        if (buffered && src.bytes > j->group_cap) j->group_cap = src.bytes;
    }
    uint64_t shard_bytes = 0;
    j->n_shards = 0;
    for (int i = 0; i < j->n_out; i++) {
        out_tensor *t = &j->out[i];
        t->bytes = decl_bytes(t);
        if (t->ndim == 2 && (size_t)t->shape[1] * 4 > max_row) max_row = (size_t)t->shape[1] * 4;
        if (j->n_shards == 0 || (shard_bytes > 0 && shard_bytes + t->bytes > j->max_shard)) {
            j->n_shards++;
            shard_bytes = 0;
        }
        t->shard = j->n_shards - 1;
        shard_bytes += t->bytes;
        j->total += t->bytes;
    }
    if (j->n_shards == 0) j->n_shards = 1;
    /* convert_piece_rows sizes pieces by the largest of a source row, an
     * output row and the f32 scratch row: at least one of those fits */
    j->wcap = max_row * 2 > EXPORT_WRITE_BUF ? max_row * 2 : EXPORT_WRITE_BUF;
    return FERRY_OK;
}

/* ---- writing --------------------------------------------------------------- */

static ferry_status cancelled(void) { return ferry_fail(FERRY_ERR_BUSY, "cancelled"); }

static void add_progress(export_job *j, uint64_t n)
{
    pthread_mutex_lock(&j->mu);
    j->status.bytes_written += n;
    j->status.progress = j->total ? (double)j->status.bytes_written / (double)j->total : 1.0;
    if (j->status.progress > 1.0) j->status.progress = 1.0;
    pthread_mutex_unlock(&j->mu);
    if (j->delay_ms_per_mib > 0) {
        j->delay_owed += n;
        if (j->delay_owed >= (64u << 10)) { /* paid every 64 KiB: a tiny model is slowed too */
            double ms = j->delay_ms_per_mib * (double)j->delay_owed / (double)(1u << 20);
            j->delay_owed = 0;
            struct timespec ts = {(time_t)(ms / 1000), (long)((ms - 1000.0 * (double)(time_t)(ms / 1000)) * 1e6)};
            nanosleep(&ts, NULL);
        }
    }
}

/* Appends n bytes of tensor data to the shard, a chunk at a time. */
static ferry_status put(export_job *j, st_writer *w, const void *data, size_t n)
{
    const char *p = data;
    while (n > 0) {
        if (atomic_load(&j->cancel)) return cancelled();
        size_t c = n < EXPORT_CHUNK ? n : EXPORT_CHUNK;
        FERRY_TRY(st_writer_write(w, p, c));
        add_progress(j, c);
        p += c;
        n -= c;
    }
    return FERRY_OK;
}

/* Brings group g in; *base is its bytes in the group's layout. */
static ferry_status read_blob(export_job *j, int g, const char **base);

static ferry_status load_group(export_job *j, int g, const char **base)
{
    store_source src = store_group_source(j->s, g);
    *base = NULL;
    if (src.bytes == 0) return FERRY_OK;
    if (src.tier != TIER_DISK && (src.tier == TIER_HOST || j->be->ops->unified)) {
        *base = src.resident; /* host memory: read in place, nothing copied */
        return FERRY_OK;
    }
    FERRY_ASSERT(src.bytes <= j->group_cap && j->group_buf);
    if (src.tier == TIER_DEVICE) {
        /* in chunks: each download waits for the compute queued before it, so
         * a step is held up by one chunk's copy at most */
        for (uint64_t at = 0; at < src.bytes; at += EXPORT_READ_CHUNK) {
            if (atomic_load(&j->cancel)) return cancelled();
            uint64_t n = src.bytes - at < EXPORT_READ_CHUNK ? src.bytes - at : EXPORT_READ_CHUNK;
            j->be->ops->download(j->be, j->group_buf + at, (const char *)src.resident + at, (size_t)n);
        }
        *base = j->group_buf;
        return FERRY_OK;
    }
    /* a rebuild of the blob (engine_repair) waits for this read; the
     * descriptor is taken under the same lock */
    store_blobs_read_begin((store *)j->s);
    ferry_status st = read_blob(j, g, base);
    store_blobs_read_end((store *)j->s);
    return st;
}

static ferry_status read_blob(export_job *j, int g, const char **base)
{
    store_source src = store_group_source(j->s, g);
    uint32_t crc = 0;
    for (uint64_t at = 0; at < src.bytes;) {
        if (atomic_load(&j->cancel)) return cancelled();
        uint64_t want = src.bytes - at < EXPORT_READ_CHUNK ? src.bytes - at : EXPORT_READ_CHUNK;
        ssize_t r = pread(src.fd, j->group_buf + at, (size_t)want, (off_t)(src.offset + at));
        if (r < 0 && errno == EINTR) continue;
        /* the I/O layer's read faults (fault.h), on the result as there: a
         * short read stays block-aligned, as one of O_DIRECT would be */
        bool eio = fault_hit(FAULT_READ_EIO), short_read = fault_hit(FAULT_READ_SHORT);
        if (eio) {
            r = -1;
            errno = EIO;
        } else if (short_read && r > (ssize_t)OFFLOAD_ALIGN) {
            r = (r / 2) & ~(ssize_t)(OFFLOAD_ALIGN - 1);
        }
        if (r <= 0)
            return ferry_fail(FERRY_ERR_IO, "%s: read at %llu: %s", src.path, (unsigned long long)(src.offset + at),
                              r < 0 ? strerror(errno) : "unexpected end of file");
        crc = crc32c(crc, j->group_buf + at, (size_t)r);
        at += (uint64_t)r;
    }
    if (crc != src.crc)
        return ferry_fail(FERRY_ERR_IO, "%s: CRC-32C %08x, the manifest says %08x: the blob changed or is damaged "
                          "(not exported)", src.path, crc, src.crc);
    *base = j->group_buf;
    return FERRY_OK;
}

/* Streams output tensor t from its group's bytes (base) into w. */
static ferry_status write_tensor(export_job *j, st_writer *w, const out_tensor *t, const char *base)
{
    store_tensor st = store_group_tensor(j->s, t->group, t->tensor);
    weight f = st.fmt;
    convert_bind(&f, base + st.offset);
    switch (t->kind) {
    case OUT_BYTES: return put(j, w, f.data, (size_t)t->bytes);
    case OUT_SCALES: return put(j, w, f.scales, (size_t)t->bytes);
    case OUT_SHAPE: {
        int64_t shape[2] = {f.rows, f.cols}; /* little-endian hosts only (safetensors is little-endian) */
        return put(j, w, shape, sizeof shape);
    }
    case OUT_INT8_PACK: {
        /* compressed-tensors pack_to_int32, 8 bits: q + 128 as a byte, four
         * to a little-endian word, a row's columns padded to a multiple of 4 */
        size_t out_row = 4 * (size_t)((f.cols + 3) / 4);
        int64_t piece = (int64_t)(j->wcap / out_row);
        for (int64_t r0 = 0; r0 < f.rows; r0 += piece) {
            int64_t n = f.rows - r0 < piece ? f.rows - r0 : piece;
            for (int64_t r = 0; r < n; r++) {
                const uint8_t *in = (const uint8_t *)f.data + (size_t)(r0 + r) * (size_t)f.cols;
                uint8_t *o = (uint8_t *)j->wbuf + (size_t)r * out_row;
                for (int64_t c = 0; c < f.cols; c++) o[c] = in[c] ^ 0x80u;
                memset(o + f.cols, 0, out_row - (size_t)f.cols);
            }
            FERRY_TRY(put(j, w, j->wbuf, (size_t)n * out_row));
        }
        return FERRY_OK;
    }
    case OUT_CONVERT: {
        int64_t piece = convert_piece_rows(&f, &t->to, j->wcap);
        size_t out_row = weight_row_bytes(&t->to);
        for (int64_t r0 = 0; r0 < f.rows; r0 += piece) {
            int64_t n = f.rows - r0 < piece ? f.rows - r0 : piece;
            FERRY_TRY(convert_rows(&f, &t->to, r0, n, j->wbuf, NULL, t->name));
            FERRY_TRY(put(j, w, j->wbuf, (size_t)n * out_row));
        }
        return FERRY_OK;
    }
    }
    return FERRY_OK;
}

static void shard_name(const export_job *j, int k, char *buf, size_t cap)
{
    snprintf(buf, cap, "model-%05d-of-%05d.safetensors", k + 1, j->n_shards);
}

static ferry_status write_shards(export_job *j)
{
    st_decl *decls = calloc((size_t)(j->n_out ? j->n_out : 1), sizeof *decls);
    if (!decls) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    ferry_status st = FERRY_OK;
    int loaded = -1;
    const char *base = NULL;
    for (int k = 0, i = 0; st == FERRY_OK && k < j->n_shards; k++) {
        int first = i, n = 0;
        while (i < j->n_out && j->out[i].shard == k) {
            const out_tensor *t = &j->out[i++];
            decls[n] = (st_decl){.name = t->name, .dtype = t->dtype, .ndim = t->ndim};
            memcpy(decls[n].shape, t->shape, sizeof t->shape);
            n++;
        }
        char fname[64];
        shard_name(j, k, fname, sizeof fname);
        st_writer *w;
        if ((st = st_writer_openat(j->dirfd, fname, decls, n, &w)) != FERRY_OK) break;
        for (int x = first; st == FERRY_OK && x < i; x++) {
            const out_tensor *t = &j->out[x];
            if (t->group != loaded) { /* groups come in order: each is read once */
                st = load_group(j, t->group, &base);
                loaded = t->group;
            }
            if (st == FERRY_OK) st = write_tensor(j, w, t, base);
        }
        if (st == FERRY_OK) st = st_writer_finish(w);
        else st_writer_abort(w);
    }
    free(decls);
    return st;
}

/* Writes a whole small file into the job's directory, synced. */
static ferry_status write_file_at(export_job *j, const char *name, const void *data, size_t len)
{
    int fd = openat(j->dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return ferry_fail(FERRY_ERR_IO, "%s: %s", name, strerror(errno));
    ferry_status st = util_write_all(fd, name, data, len);
    if (st == FERRY_OK && util_fsync(fd) != 0) st = ferry_fail(FERRY_ERR_IO, "%s: fsync: %s", name, strerror(errno));
    if (close(fd) != 0 && st == FERRY_OK) st = ferry_fail(FERRY_ERR_IO, "%s: close: %s", name, strerror(errno));
    return st;
}

/* The marker that makes ROOT/NAME an export of ferry's: overwrite replaces
 * nothing else (a model dir under the export root stays safe). */
static ferry_status write_marker(export_job *j)
{
    strbuf sb;
    sb_init(&sb);
    sb_printf(&sb, "{\"ferry_export\": 1, \"layout\": \"%s\"}\n", j->layout == EXPORT_ORIGINAL ? "original" : "converted");
    ferry_status st = sb.oom ? ferry_fail(FERRY_ERR_NOMEM, "out of memory") : write_file_at(j, EXPORT_MARKER, sb.data, sb.len);
    sb_free(&sb);
    return st;
}

static bool is_export(int rootfd, const char *name)
{
    int fd = openat(rootfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return false;
    struct stat sb;
    bool ok = fstatat(fd, EXPORT_MARKER, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode);
    close(fd);
    return ok;
}

/* Copies model_dir/name when it exists, through the write buffer; read
 * under model_dir.h's rule (a link to nothing or out of the model is an
 * error, not an absent file). */
static ferry_status copy_model_file(export_job *j, const char *name)
{
    if (!model_dir_has(j->model_dir, name)) return FERRY_OK;
    int in;
    char *path;
    FERRY_TRY(model_dir_open(j->model_dir, name, &in, &path));
    int out = openat(j->dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    ferry_status st = out < 0 ? ferry_fail(FERRY_ERR_IO, "%s: %s", name, strerror(errno)) : FERRY_OK;
    while (st == FERRY_OK) {
        ssize_t r = read(in, j->wbuf, j->wcap);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) st = ferry_fail(FERRY_ERR_IO, "%s: read: %s", path, strerror(errno));
        if (r <= 0) break;
        st = util_write_all(out, name, j->wbuf, (size_t)r);
    }
    if (st == FERRY_OK && util_fsync(out) != 0) st = ferry_fail(FERRY_ERR_IO, "%s: fsync: %s", name, strerror(errno));
    if (out >= 0) close(out);
    close(in);
    free(path);
    return st;
}

/* ---- config.json and the index ----------------------------------------------- */

static const char *torch_dtype_name(ferry_dtype dt)
{
    switch (dt) {
    case DT_F16: return "float16";
    case DT_BF16: return "bfloat16";
    default: return "float32";
    }
}

/* compressed-tensors' quantization_config for the engine's linear layers
 * and head (ct_config.h): the quantized ones (lm_head among them where
 * --quantize-head made it int8), and the 2-D *_proj weights held full
 * precision (a compressed-tensors checkpoint's own ignore list). Empty when
 * nothing is quantized. */
static ferry_status quant_config(export_job *j, strbuf *sb)
{
    const plan *p = engine_get_plan(j->e);
    int cap = 0, n = 0;
    for (int g = 0; g < p->n_groups; g++) cap += store_group_tensor_count(j->s, g);
    ct_layer *layers = calloc((size_t)(cap ? cap : 1), sizeof *layers);
    if (!layers) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    for (int g = 0; g < p->n_groups; g++)
        for (int k = 0; k < store_group_tensor_count(j->s, g); k++) {
            store_tensor t = store_group_tensor(j->s, g, k);
            size_t nl = strlen(t.name), sl = strlen("_proj.weight");
            bool proj = !t.one_d && nl > sl && !strcmp(t.name + nl - sl, "_proj.weight");
            if (weight_has_scales(&t.fmt)) layers[n++] = (ct_layer){t.name, t.fmt.quant, convert_ct_group(&t.fmt)};
            else if (proj) layers[n++] = (ct_layer){t.name, WQ_NONE, 0};
        }
    ferry_status st = ct_config_write(layers, n, sb);
    free(layers);
    return st;
}

/* The model's config.json with quantization_config and torch_dtype saying
 * what was written (torch_dtype: the embedding's dtype), and
 * tie_word_embeddings false where the converted layout writes a tied
 * model's head apart (--quantize-head). */
static ferry_status write_config(export_job *j)
{
    char *path = util_path_join(j->model_dir, "config.json"), *text = NULL;
    if (!path) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    size_t len;
    json_doc *doc = NULL;
    ferry_status st = model_dir_read(j->model_dir, "config.json", &text, &len);
    if (st == FERRY_OK) st = json_parse(text, len, &doc);
    if (st != FERRY_OK) st = ferry_fail_context(st, "%s", path);
    strbuf qc, sb;
    sb_init(&qc);
    sb_init(&sb);
    if (st == FERRY_OK && j->layout == EXPORT_CONVERTED) st = quant_config(j, &qc);
    bool untie = j->layout == EXPORT_CONVERTED && engine_get_info(j->e).head_from_embed;
    ferry_dtype dt = DT_F32;
    for (int i = 0; i < j->n_out; i++)
        if (strstr(j->out[i].name, "embed_tokens.weight")) dt = j->out[i].dtype;
    if (st == FERRY_OK && json_doc_root(doc)->type != JSON_OBJECT)
        st = ferry_fail(FERRY_ERR_INVALID, "%s: not a JSON object (changed since the model was loaded?)", path);
    if (st == FERRY_OK) {
        const json_value *root = json_doc_root(doc);
        sb_puts(&sb, "{");
        int n = 0;
        for (size_t i = 0; i < root->len; i++) {
            const json_member *m = &root->members[i];
            if (!strcmp(m->key, "quantization_config") || !strcmp(m->key, "torch_dtype")) continue;
            if (untie && !strcmp(m->key, "tie_word_embeddings")) continue;
            sb_printf(&sb, "%s\n  ", n++ ? "," : "");
            sb_json_str(&sb, m->key);
            sb_puts(&sb, ": ");
            sb_json_value(&sb, &m->value, 2);
        }
        if (untie) sb_printf(&sb, "%s\n  \"tie_word_embeddings\": false", n++ ? "," : "");
        sb_printf(&sb, "%s\n  \"torch_dtype\": \"%s\"", n++ ? "," : "", torch_dtype_name(dt));
        if (qc.len) {
            sb_puts(&sb, ",\n  \"quantization_config\": ");
            sb_append(&sb, qc.data, qc.len);
        }
        sb_puts(&sb, "\n}\n");
        st = sb.oom || qc.oom ? ferry_fail(FERRY_ERR_NOMEM, "out of memory") : write_file_at(j, "config.json", sb.data, sb.len);
    }
    sb_free(&qc);
    sb_free(&sb);
    json_doc_free(doc);
    free(text);
    free(path);
    return st;
}

static int cmp_out_ptr(const void *a, const void *b)
{
    return strcmp((*(const out_tensor *const *)a)->name, (*(const out_tensor *const *)b)->name);
}

static ferry_status write_index(export_job *j)
{
    const out_tensor **by_name = malloc((size_t)(j->n_out ? j->n_out : 1) * sizeof *by_name);
    if (!by_name) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    for (int i = 0; i < j->n_out; i++) by_name[i] = &j->out[i];
    qsort(by_name, (size_t)j->n_out, sizeof *by_name, cmp_out_ptr);
    strbuf sb;
    sb_init(&sb);
    sb_printf(&sb, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n  \"weight_map\": {",
              (unsigned long long)j->total);
    for (int i = 0; i < j->n_out; i++) {
        char fname[64];
        shard_name(j, by_name[i]->shard, fname, sizeof fname);
        sb_printf(&sb, "%s\n    ", i ? "," : "");
        sb_json_str(&sb, by_name[i]->name);
        sb_printf(&sb, ": \"%s\"", fname);
    }
    sb_puts(&sb, "\n  }\n}\n");
    ferry_status st = sb.oom ? ferry_fail(FERRY_ERR_NOMEM, "out of memory")
                             : write_file_at(j, "model.safetensors.index.json", sb.data, sb.len);
    sb_free(&sb);
    free(by_name);
    return st;
}

/* ---- the job ------------------------------------------------------------------ */

static const char *const k_copied[] = {"generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                       "special_tokens_map.json", "tokenizer.model", "chat_template.jinja",
                                       "chat_template.json"};

/* Is root/at the directory this job created (the inode dirfd holds)? A
 * rename is by name, and whoever can write the root can rename the
 * temporary away and put a symlink or another directory under its name. */
static bool is_job_dir(const export_job *j, const char *at)
{
    struct stat sb;
    return fstatat(j->rootfd, at, &sb, AT_SYMLINK_NOFOLLOW) == 0 && sb.st_dev == j->dir_dev &&
           sb.st_ino == j->dir_ino;
}

static ferry_status tmp_replaced(export_job *j)
{
    j->tmp_replaced = true;
    return ferry_fail(FERRY_ERR_IO, "export '%s': its temporary directory %s was replaced while the export ran "
                      "(renamed away, something else put under its name): not published", j->name, j->tmp);
}

/* Puts the finished directory under the final name: swapped with an
 * existing export in one step where the file system can, else that one is
 * renamed aside first; the old one is then removed. Only the directory the
 * job created is published: the name is checked against dirfd before the
 * rename, and again after it (a swap between the check and the rename is
 * undone and fails the job the same way). */
static ferry_status publish(export_job *j)
{
    if (util_fsync(j->dirfd) != 0) return ferry_fail(FERRY_ERR_IO, "%s: fsync: %s", j->tmp, strerror(errno));
    if (!is_job_dir(j, j->tmp)) return tmp_replaced(j);
    struct stat sbuf;
    bool exists = fstatat(j->rootfd, j->name, &sbuf, AT_SYMLINK_NOFOLLOW) == 0;
    if (exists && !S_ISDIR(sbuf.st_mode))
        return ferry_fail(FERRY_ERR_INVALID, "export '%s' exists and is not a directory: not replaced", j->name);
    if (exists && !j->overwrite)
        return ferry_fail(FERRY_ERR_INVALID, "export '%s' already exists (overwrite it explicitly)", j->name);
    if (exists && !is_export(j->rootfd, j->name))
        return ferry_fail(FERRY_ERR_INVALID, "'%s' is not an export of ferry (no " EXPORT_MARKER "): not replaced",
                          j->name);
    if (!exists) {
        if (renameat2(j->rootfd, j->tmp, j->rootfd, j->name, RENAME_NOREPLACE) != 0 &&
            (errno != EINVAL && errno != ENOSYS ? true : renameat(j->rootfd, j->tmp, j->rootfd, j->name) != 0))
            return ferry_fail(FERRY_ERR_IO, "export '%s': rename: %s", j->name, strerror(errno));
        if (!is_job_dir(j, j->name)) {
            renameat2(j->rootfd, j->name, j->rootfd, j->tmp, RENAME_NOREPLACE);
            return tmp_replaced(j);
        }
    } else if (renameat2(j->rootfd, j->tmp, j->rootfd, j->name, RENAME_EXCHANGE) == 0) {
        if (!is_job_dir(j, j->name)) { /* the previous export back under its name */
            renameat2(j->rootfd, j->tmp, j->rootfd, j->name, RENAME_EXCHANGE);
            return tmp_replaced(j);
        }
        util_fsync(j->rootfd);
        remove_tree_at(j->rootfd, j->tmp, 0); /* the previous export, under the temporary name now */
    } else {
        /* two renames: the previous export is held (flock) while it is aside,
         * so a sweep never takes it for stale; if this process dies between
         * them, the next sweep puts it back under its name */
        char old[EXPORT_NAME_MAX + 64];
        snprintf(old, sizeof old, TMP_PREFIX "%s.old.%s", j->name, j->tmp_id);
        int ofd = openat(j->rootfd, j->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (ofd < 0 || flock(ofd, LOCK_EX) != 0) {
            int err = errno;
            if (ofd >= 0) close(ofd);
            return ferry_fail(FERRY_ERR_IO, "export '%s': %s", j->name, strerror(err));
        }
        if (renameat(j->rootfd, j->name, j->rootfd, old) != 0) {
            int err = errno;
            close(ofd);
            return ferry_fail(FERRY_ERR_IO, "export '%s': rename aside: %s", j->name, strerror(err));
        }
        if (renameat(j->rootfd, j->tmp, j->rootfd, j->name) != 0) {
            int err = errno;
            if (renameat(j->rootfd, old, j->rootfd, j->name) != 0)
                fprintf(stderr, "ferry: export '%s': the previous export stays as %s: %s\n", j->name, old,
                        strerror(errno));
            close(ofd);
            return ferry_fail(FERRY_ERR_IO, "export '%s': rename: %s", j->name, strerror(err));
        }
        if (!is_job_dir(j, j->name)) {
            renameat2(j->rootfd, j->name, j->rootfd, j->tmp, RENAME_NOREPLACE);
            renameat2(j->rootfd, old, j->rootfd, j->name, RENAME_NOREPLACE);
            close(ofd);
            return tmp_replaced(j);
        }
        util_fsync(j->rootfd);
        remove_tree_at(j->rootfd, old, 0);
        close(ofd);
    }
    /* the export is in place: a failed sync of the root is not a failed export */
    if (util_fsync(j->rootfd) != 0)
        fprintf(stderr, "ferry: export '%s': syncing the export root: %s (the export is in place)\n", j->name,
                strerror(errno));
    return FERRY_OK;
}

static ferry_status run_export(export_job *j)
{
    /* mapped, not malloc'd: a server that exports now and then gives the
     * megabytes back when the job ends (bench/soak.py saw malloc keep about
     * 3 MiB per export under load) */
    if (j->group_cap) {
        j->group_buf = util_map_alloc((size_t)j->group_cap); /* page-aligned: O_DIRECT reads */
        if (!j->group_buf) return ferry_fail(FERRY_ERR_NOMEM, "out of memory for the export's group buffer");
    }
    j->wbuf = util_map_alloc(j->wcap);
    if (!j->wbuf) return ferry_fail(FERRY_ERR_NOMEM, "out of memory for the export's write buffer");
    FERRY_TRY(write_shards(j));
    /* the group buffer is not needed past the shards */
    util_map_free(j->group_buf, (size_t)j->group_cap);
    j->group_buf = NULL;
    FERRY_TRY(write_config(j));
    for (size_t i = 0; i < sizeof k_copied / sizeof k_copied[0]; i++) FERRY_TRY(copy_model_file(j, k_copied[i]));
    if (atomic_load(&j->cancel)) return cancelled();
    FERRY_TRY(write_marker(j));
    FERRY_TRY(write_index(j)); /* last: an index means every file it names is complete */
    if (atomic_load(&j->cancel)) return cancelled();
    return publish(j);
}

static void *job_main(void *arg)
{
    export_job *j = arg;
    pthread_mutex_lock(&j->mu);
    j->status.state = EXPORT_RUNNING;
    pthread_mutex_unlock(&j->mu);
    ferry_status st = run_export(j);
    if (st != FERRY_OK && !j->tmp_replaced) {
        remove_tree_at(j->rootfd, j->tmp, 0);
    } else if (st != FERRY_OK) {
        /* what this job wrote goes, through its descriptor, wherever the
         * directory was moved; under the temporary's name a link or file is
         * removed (the name is the job's), a directory of someone else's is not */
        int fd = openat(j->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd >= 0) remove_entries(fd, 0);
        unlinkat(j->rootfd, j->tmp, 0);
    }
    close(j->dirfd);
    j->dirfd = -1;
    util_map_free(j->group_buf, (size_t)j->group_cap);
    util_map_free(j->wbuf, j->wcap);
    j->group_buf = j->wbuf = NULL;
    pthread_mutex_lock(&j->mu);
    if (st == FERRY_OK) {
        j->status.state = EXPORT_DONE;
        j->status.progress = 1.0;
    } else if (atomic_load(&j->cancel)) {
        j->status.state = EXPORT_CANCELLED;
    } else {
        j->status.state = EXPORT_FAILED;
        snprintf(j->status.error, sizeof j->status.error, "%s", ferry_errmsg());
    }
    export_status final = j->status;
    pthread_mutex_unlock(&j->mu);
    if (j->on_end) j->on_end(j->on_end_arg, &final);
    return NULL;
}

static void job_free_fields(export_job *j)
{
    if (j->dirfd >= 0) close(j->dirfd);
    if (j->rootfd >= 0) close(j->rootfd);
    free(j->out);
    free(j->model_dir);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

ferry_status export_start(engine *e, const export_opts *o, export_job **out)
{
    *out = NULL;
    if (!o->name || !name_ok(o->name))
        return ferry_fail(FERRY_ERR_INVALID, "export name '%.140s' is not allowed (1 to %d of A-Z a-z 0-9 . _ -, not "
                          "'.' or '..')", o->name ? o->name : "", EXPORT_NAME_MAX);
    if (!o->root || !*o->root) return ferry_fail(FERRY_ERR_INVALID, "no export root directory given");
    export_job *j = calloc(1, sizeof *j);
    if (!j) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&j->mu, NULL);
    j->rootfd = j->dirfd = -1;
    j->e = e;
    j->s = engine_store(e);
    j->be = engine_backend(e);
    j->layout = o->layout;
    j->max_shard = o->max_shard_bytes ? o->max_shard_bytes : EXPORT_DEFAULT_SHARD;
    j->overwrite = o->overwrite;
    j->on_end = o->on_end;
    j->on_end_arg = o->on_end_arg;
    snprintf(j->name, sizeof j->name, "%s", o->name);
    uint64_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) rnd = (uint64_t)getpid() ^ (uint64_t)time(NULL) << 20;
    snprintf(j->tmp_id, sizeof j->tmp_id, "%016llx", (unsigned long long)rnd);
    snprintf(j->tmp, sizeof j->tmp, TMP_PREFIX "%s.tmp.%s", o->name, j->tmp_id);
    j->model_dir = strdup(engine_model_dir(e));
    const char *delay = getenv("FERRY_EXPORT_DELAY_MS");
    if (delay && *delay) j->delay_ms_per_mib = strtod(delay, NULL);
    ferry_status st = FERRY_OK;
    if (!j->model_dir) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    if (st == FERRY_OK) {
        j->rootfd = open(o->root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (j->rootfd < 0)
            st = ferry_fail(errno == ENOENT ? FERRY_ERR_NOT_FOUND : FERRY_ERR_INVALID,
                            "export root %s: %s%s", o->root, strerror(errno),
                            errno == ELOOP || errno == ENOTDIR ? " (it must be a directory, not a symlink)" : "");
    }
    struct stat sb;
    if (st == FERRY_OK && fstatat(j->rootfd, j->name, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
        if (!S_ISDIR(sb.st_mode))
            st = ferry_fail(FERRY_ERR_INVALID, "export '%s' exists and is not a directory (a symlink?): refused", j->name);
        else if (!o->overwrite)
            st = ferry_fail(FERRY_ERR_INVALID, "export '%s' already exists in %s (overwrite it explicitly)", j->name,
                            o->root);
        else if (!is_export(j->rootfd, j->name))
            st = ferry_fail(FERRY_ERR_INVALID, "%s/%s is not an export of ferry (no " EXPORT_MARKER "): overwrite "
                            "replaces only ferry's exports", o->root, j->name);
    }
    if (st == FERRY_OK) {
        remove_stale_temps(j->rootfd);
        st = plan_output(j);
    }
    struct statvfs vfs;
    if (st == FERRY_OK && fstatvfs(j->rootfd, &vfs) == 0) {
        uint64_t avail = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize;
        uint64_t need = j->total + (1u << 20); /* the tensors, plus headers and small files */
        char b1[32], b2[32];
        if (avail < need)
            st = ferry_fail(FERRY_ERR_TOO_LARGE, "export '%s' needs %llu bytes (%s) in %s, %llu (%s) are available", j->name,
                            (unsigned long long)need, util_fmt_bytes(need, b1, sizeof b1), o->root,
                            (unsigned long long)avail, util_fmt_bytes(avail, b2, sizeof b2));
    }
    bool made = false;
    if (st == FERRY_OK) {
        if (mkdirat(j->rootfd, j->tmp, 0755) != 0)
            st = ferry_fail(FERRY_ERR_IO, "%s/%s: %s", o->root, j->tmp, strerror(errno));
        else if ((made = true, j->dirfd = openat(j->rootfd, j->tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
            st = ferry_fail(FERRY_ERR_IO, "%s/%s: %s", o->root, j->tmp, strerror(errno));
        else if (flock(j->dirfd, LOCK_EX) != 0) /* ours while the job runs (remove_stale_temps) */
            st = ferry_fail(FERRY_ERR_IO, "%s/%s: flock: %s", o->root, j->tmp, strerror(errno));
        else if (fstat(j->dirfd, &sb) != 0)
            st = ferry_fail(FERRY_ERR_IO, "%s/%s: %s", o->root, j->tmp, strerror(errno));
        else
            j->dir_dev = sb.st_dev, j->dir_ino = sb.st_ino;
    }
    if (st == FERRY_OK) {
        j->status = (export_status){.state = EXPORT_QUEUED, .bytes_total = j->total};
        if (pthread_create(&j->thread, NULL, job_main, j) != 0)
            st = ferry_fail(FERRY_ERR_NOMEM, "cannot start the export thread");
        else j->started = true;
    }
    if (st != FERRY_OK) {
        if (made) remove_tree_at(j->rootfd, j->tmp, 0);
        job_free_fields(j);
        return st;
    }
    *out = j;
    return FERRY_OK;
}

export_status export_job_status(export_job *j)
{
    pthread_mutex_lock(&j->mu);
    export_status s = j->status;
    pthread_mutex_unlock(&j->mu);
    return s;
}

void export_job_cancel(export_job *j) { atomic_store(&j->cancel, true); }

export_status export_job_wait(export_job *j)
{
    if (j->started) {
        pthread_join(j->thread, NULL);
        j->started = false;
    }
    return export_job_status(j);
}

void export_job_free(export_job *j)
{
    if (!j) return;
    export_job_wait(j);
    job_free_fields(j);
}
