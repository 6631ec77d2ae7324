/*
 * offload.c - see offload.h.
 *
 * offload_open runs in three phases, and the order is what makes it safe:
 * (1) every blob is verified or rebuilt (temp file, fsync, rename) while the
 * old manifest stays in place; (2) only when all are valid is the new
 * manifest written atomically; (3) then files of ours the new one does not
 * list are deleted. A blob rewritten in phase 1 of a run
 * that later fails is still listed in the old manifest with its old
 * checksum, so the next run's verification catches it: trust always comes
 * from the checksum, never from the file being there.
 *
 * Writing blobs and phases 2 and 3 happen only under the exclusive lock
 * (offload.h, L1-L4). A process that found the directory in use holds it
 * shared and only verifies; the first blob it would have to write makes it
 * try for the exclusive lock, which it gets only when the others have gone
 * (then it goes on as a writer), and otherwise ends offload_open (L3).
 *
 * Deletion only ever touches names of ferry's own forms (KEY.bin for a
 * well-formed key, its temporary files, the manifest's), whatever a manifest
 * says, so a stray or hand-edited manifest cannot make ferry delete anything
 * else.
 */
#define _GNU_SOURCE
#include "offload.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"
#include "offload_manifest.h"
#include "../base/json.h"
#include "../base/util.h"

#define WRITE_BUF (1u << 20)  /* the writer's staging buffer: small writes gather here */
#define VERIFY_BUF (4u << 20) /* read size when verifying a reused blob */

/* Opens path for reading, with O_DIRECT where the file system allows it. */
static int open_read(const char *path, bool *direct)
{
    int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    *direct = fd >= 0;
    if (fd < 0 && errno == EINVAL) fd = open(path, O_RDONLY | O_CLOEXEC); /* tmpfs and friends */
    return fd;
}

/* ---- region checksums ----------------------------------------------------- */

/* Checksums bytes fed in order, region by region (offload_spec). */
typedef struct {
    const uint64_t *size; /* NULL: one region */
    int n, cur;
    uint64_t done;        /* bytes of region cur seen */
    uint32_t *out;        /* [n] */
} region_sum;

static void region_start(region_sum *r, const offload_spec *spec, uint32_t *out)
{
    *r = (region_sum){spec->n_regions ? spec->region_size : NULL, spec->n_regions ? spec->n_regions : 1, 0, 0, out};
    memset(out, 0, (size_t)r->n * sizeof *out);
}

static void region_feed(region_sum *r, const void *data, size_t n)
{
    const uint8_t *p = data;
    while (n > 0 && r->cur < r->n) {
        uint64_t left = r->size ? r->size[r->cur] - r->done : UINT64_MAX;
        size_t k = n < left ? n : (size_t)left;
        r->out[r->cur] = crc32c(r->out[r->cur], p, k);
        p += k;
        n -= k;
        r->done += k;
        if (r->size && r->done == r->size[r->cur]) {
            r->cur++;
            r->done = 0;
        }
    }
}

static ferry_status regions_alloc(offload_blob *b, const offload_spec *spec)
{
    b->n_regions = spec->n_regions ? spec->n_regions : 1;
    free(b->region_crc);
    free(b->region_size);
    b->region_crc = calloc((size_t)b->n_regions, sizeof *b->region_crc);
    b->region_size = calloc((size_t)b->n_regions, sizeof *b->region_size);
    if (!b->region_crc || !b->region_size) return ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", b->path);
    for (int r = 0; r < b->n_regions; r++) b->region_size[r] = spec->n_regions ? spec->region_size[r] : spec->size;
    return FERRY_OK;
}

/* ---- writing -------------------------------------------------------------- */

struct offload_writer {
    int fd;
    const char *path; /* the blob's final name, which messages give */
    const char *key;
    uint64_t size;    /* what the spec promises */
    uint64_t written; /* bytes accepted so far */
    uint32_t crc;     /* of those bytes */
    region_sum regions; /* and of each region */
    uint8_t *buf;     /* [WRITE_BUF], 4096-aligned */
    size_t fill;
    ferry_status st;  /* the first failure; every later call returns it */
};

static ferry_status writer_flush(offload_writer *w)
{
    if (w->st == FERRY_OK && w->fill > 0) w->st = util_write_all(w->fd, w->path, w->buf, w->fill);
    w->fill = 0;
    return w->st;
}

ferry_status offload_write(offload_writer *w, const void *data, size_t n)
{
    if (w->st != FERRY_OK) return w->st;
    if (n > w->size - w->written)
        return w->st = ferry_fail(FERRY_ERR_INTERNAL, "%s: blob '%s' would exceed its size of %" PRIu64 " bytes",
                                  w->path, w->key, w->size);
    w->crc = crc32c(w->crc, data, n);
    region_feed(&w->regions, data, n);
    w->written += n;
    const uint8_t *p = data;
    if (n >= WRITE_BUF) {
        /* Whole tensors go straight to the file; copying them would only
         * cost memory bandwidth. */
        if (writer_flush(w) != FERRY_OK) return w->st;
        w->st = util_write_all(w->fd, w->path, p, n);
        return w->st;
    }
    while (n > 0) {
        size_t k = WRITE_BUF - w->fill;
        if (k > n) k = n;
        memcpy(w->buf + w->fill, p, k);
        w->fill += k;
        p += k;
        n -= k;
        if (w->fill == WRITE_BUF && writer_flush(w) != FERRY_OK) return w->st;
    }
    return FERRY_OK;
}

ferry_status offload_pad(offload_writer *w, size_t n)
{
    static const uint8_t zeros[OFFLOAD_ALIGN];
    while (n > 0) {
        size_t k = n < sizeof zeros ? n : sizeof zeros;
        FERRY_TRY(offload_write(w, zeros, k));
        n -= k;
    }
    return FERRY_OK;
}

/* Writes blob i under a temporary name and renames it into place. On
 * failure nothing is left behind and the old file (if any) is untouched. */
static ferry_status blob_build(offload_blob *b, const offload_spec *spec, int i, offload_fill_fn fill, void *ctx,
                               uint8_t *buf)
{
    size_t n = strlen(b->path) + 32;
    char *tmp = malloc(n);
    if (!tmp) return ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", b->path);
    snprintf(tmp, n, "%s.tmp.%ld", b->path, (long)getpid());
    ferry_status st;
    int rfd = -1;
    offload_writer w = {.fd = -1, .path = b->path, .key = spec->key, .size = spec->size, .buf = buf};
    uint32_t *regions = calloc(spec->n_regions ? (size_t)spec->n_regions : 1, sizeof *regions);
    if (!regions) {
        free(tmp);
        return ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", b->path);
    }
    region_start(&w.regions, spec, regions);
    unlink(tmp); /* a leftover of a killed run with our pid */
    w.fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (w.fd < 0) {
        st = ferry_fail(FERRY_ERR_IO, "%s: %s", tmp, strerror(errno));
        goto fail;
    }
    st = fill(ctx, i, &w);
    if (st == FERRY_OK) st = w.st; /* a fill that ignored a failed write */
    else if (w.st == FERRY_OK) st = ferry_fail_context(st, "%s", b->path); /* the fill's own failure */
    if (st != FERRY_OK) goto fail;
    if ((st = writer_flush(&w)) != FERRY_OK) goto fail;
    if (w.written != spec->size) {
        st = ferry_fail(FERRY_ERR_INTERNAL, "%s: blob '%s' got %" PRIu64 " bytes, expected %" PRIu64, b->path,
                        spec->key, w.written, spec->size);
        goto fail;
    }
    if (util_fsync(w.fd) != 0) {
        st = ferry_fail(FERRY_ERR_IO, "%s: fsync: %s", b->path, strerror(errno));
        goto fail;
    }
    int fd = w.fd;
    w.fd = -1;
    if (close(fd) != 0) {
        st = ferry_fail(FERRY_ERR_IO, "%s: close: %s", b->path, strerror(errno));
        goto fail;
    }
    /* L4: the descriptor that reads the blob is opened on the file just
     * written, under its private name, before the rename publishes it. */
    if ((rfd = open_read(tmp, &b->direct)) < 0) {
        st = ferry_fail(FERRY_ERR_IO, "%s: %s", tmp, strerror(errno));
        goto fail;
    }
    if (rename(tmp, b->path) != 0) {
        st = ferry_fail(FERRY_ERR_IO, "%s: rename: %s", b->path, strerror(errno));
        goto fail;
    }
    util_fsync_dir_of(b->path);
    free(tmp);
    b->fd = rfd;
    b->crc = w.crc;
    b->rebuilt = true;
    free(b->region_crc);
    b->region_crc = regions;
    b->n_regions = w.regions.n;
    return FERRY_OK;

fail:
    free(regions);
    if (w.fd >= 0) close(w.fd);
    if (rfd >= 0) close(rfd);
    unlink(tmp);
    free(tmp);
    return st;
}

/* ---- the old manifest (offload_manifest.h) ------------------------------- */

/* Reads dir's manifest into m. A missing or unusable one leaves m empty:
 * then nothing is reusable, which costs a rebuild but is never wrong. */
static void manifest_load(const char *path, offload_manifest *m)
{
    *m = (offload_manifest){0};
    ferry_status st = util_read_file(path, &m->text, &m->len);
    if (st == FERRY_ERR_NOT_FOUND) return;
    if (st != FERRY_OK) {
        fprintf(stderr, "ferry: warning: %s; rebuilding every offload blob\n", ferry_errmsg());
        return;
    }
    const char *why = offload_manifest_parse(m);
    if (why) {
        fprintf(stderr, "ferry: warning: %s: unusable manifest (%s); rebuilding every offload blob\n", path, why);
        char *text = m->text;
        size_t len = m->len;
        m->text = NULL;
        offload_manifest_clear(m);
        m->text = text; /* kept only so that it is replaced, never trusted */
        m->len = len;
    }
}

/* ---- the lock (offload.h, L1-L3) ------------------------------------------ */

typedef struct {
    int fd;          /* OFFLOAD_LOCK, or -1: a read-only dir without one */
    int ro_errno;    /* why fd is not open for writing (0: it is) */
    bool exclusive;  /* this process may write and delete (L1) */
} dir_lock;

/* Sets an open file description lock on the whole file: F_WRLCK, F_RDLCK
 * or F_UNLCK; waits for it when `wait`. Converting one we hold never lets
 * it go, whether it succeeds or not. Returns 0 or an errno value. */
static int lock_set(int fd, short type, bool wait)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET}; /* l_start 0, l_len 0: all; l_pid must be 0 */
    while (fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl) != 0) {
        if (errno != EINTR) return errno == EACCES ? EAGAIN : errno;
    }
    return 0;
}

/* Takes the exclusive lock when nobody else holds the dir, else a shared
 * one, waiting while a writer finishes. A dir where the lock file cannot be
 * opened for writing (read-only) is only ever taken shared. */
static ferry_status lock_take(const char *dir, dir_lock *lk)
{
    *lk = (dir_lock){.fd = -1};
    char *path = util_path_join(dir, OFFLOAD_LOCK);
    if (!path) return ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", dir);
    /* O_NONBLOCK: a FIFO planted under the name must not hang the open */
    lk->fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    if (lk->fd < 0 && (errno == EROFS || errno == EACCES || errno == EPERM)) {
        lk->ro_errno = errno;
        lk->fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (lk->fd < 0 && errno == ENOENT) {
            free(path); /* nobody can have written a dir we cannot create a file in */
            return FERRY_OK;
        }
    }
    struct stat sb;
    ferry_status st = FERRY_OK;
    if (lk->fd < 0) {
        st = ferry_fail(FERRY_ERR_IO, "%s: %s", path, strerror(errno));
    } else if (fstat(lk->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = ferry_fail(FERRY_ERR_IO, "%s: not a regular file", path);
    } else {
        int err = lk->ro_errno ? EAGAIN : lock_set(lk->fd, F_WRLCK, false);
        lk->exclusive = err == 0;
        if (err == EAGAIN) err = lock_set(lk->fd, F_RDLCK, true);
        if (err) st = ferry_fail(FERRY_ERR_IO, "%s: cannot lock: %s", path, strerror(err));
    }
    if (st != FERRY_OK && lk->fd >= 0) {
        close(lk->fd);
        lk->fd = -1;
    }
    free(path);
    return st;
}

/* Turns a shared lock into the exclusive one, without letting it go, when
 * this process is the only one holding the dir; `why` says what made the
 * write necessary. */
static ferry_status lock_upgrade(const char *dir, dir_lock *lk, const char *why)
{
    if (lk->exclusive) return FERRY_OK;
    if (lk->ro_errno || lk->fd < 0)
        return ferry_fail(FERRY_ERR_IO, "%s: cannot write the offload dir (%s) and %s", dir,
                          strerror(lk->ro_errno ? lk->ro_errno : EROFS), why);
    int err = lock_set(lk->fd, F_WRLCK, false);
    if (err == EAGAIN)
        return ferry_fail(FERRY_ERR_BUSY,
                          "%s: in use by another ferry process, and %s; give each model (and group size) its "
                          "own --offload-dir",
                          dir, why);
    if (err) return ferry_fail(FERRY_ERR_IO, "%s/%s: cannot lock: %s", dir, OFFLOAD_LOCK, strerror(err));
    lk->exclusive = true;
    return FERRY_OK;
}

/* ---- verification and the directory -------------------------------------- */

/* Opens path and checks, through that descriptor, that it holds exactly
 * `size` bytes whose CRC-32C is `want`: then *fd is the descriptor to read
 * the blob through (L4). Says on stderr why not when that is a surprise (the
 * manifest vouched for it). */
static bool blob_open_verified(const char *path, uint64_t size, uint32_t want, uint8_t *buf, int *fd_out,
                               bool *direct, region_sum *regions)
{
    *fd_out = -1;
    int fd = open_read(path, direct);
    if (fd < 0) {
        fprintf(stderr, "ferry: warning: %s: %s; rebuilding it\n", path, strerror(errno));
        return false;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != size) {
        fprintf(stderr, "ferry: warning: %s: %" PRIu64 " bytes, the manifest says %" PRIu64 "; rebuilding it\n", path,
                (uint64_t)sb.st_size, size);
        close(fd);
        return false;
    }
    uint32_t crc = 0;
    uint64_t off = 0;
    bool ok = true;
    while (off < size) {
        size_t want_n = size - off < VERIFY_BUF ? (size_t)(size - off) : VERIFY_BUF;
        ssize_t r = pread(fd, buf, want_n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        /* A short O_DIRECT read would leave the next one unaligned; a file
         * that reads short is not one to trust anyway. */
        if (r <= 0 || (*direct && (size_t)r != want_n)) {
            fprintf(stderr, "ferry: warning: %s: read at %" PRIu64 ": %s; rebuilding it\n", path, off,
                    r < 0 ? strerror(errno) : "short read");
            ok = false;
            break;
        }
        crc = crc32c(crc, buf, (size_t)r);
        region_feed(regions, buf, (size_t)r);
        off += (uint64_t)r;
    }
    if (ok && crc != want)
        fprintf(stderr, "ferry: warning: %s: checksum %08" PRIx32 ", the manifest says %08" PRIx32 "; rebuilding it\n",
                path, crc, want);
    if (!ok || crc != want) {
        close(fd);
        return false;
    }
    *fd_out = fd;
    return true;
}

/* True for "KEY<suffix>" with a well-formed KEY. */
static bool is_key_name(const char *name, size_t len, const char *suffix)
{
    size_t n = strlen(suffix);
    if (len <= n || memcmp(name + len - n, suffix, n) != 0 || len - n >= 128) return false;
    char key[128];
    memcpy(key, name, len - n);
    key[len - n] = '\0';
    return offload_key_valid(key);
}

/* True for NAME.tmp.PID, the temporary files of blob_build (NAME is
 * KEY.bin) and of util_write_file_atomic (the manifest). */
static bool is_temp_name(const char *name)
{
    const char *t = strstr(name, ".tmp.");
    if (!t || !t[5]) return false;
    for (const char *d = t + 5; *d; d++)
        if (*d < '0' || *d > '9') return false;
    size_t stem = (size_t)(t - name);
    return (stem == strlen(OFFLOAD_MANIFEST) && memcmp(name, OFFLOAD_MANIFEST, stem) == 0) ||
           is_key_name(name, stem, ".bin");
}

/* Phase 3, under the exclusive lock: deletes what the new manifest does not
 * list among ferry's own files - blobs of an older layout, or written by a
 * build that failed before its manifest (never listed anywhere), and
 * temporary files (their writers are dead: no live process writes without
 * the lock). A KEY.bin must be a regular file, listed in the old manifest or
 * of whole 4096-byte blocks as every blob is; anything else is left alone. */
static void remove_unused(const char *dir, const offload_spec *specs, int n, const offload_manifest *old)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *name = de->d_name;
        size_t len = strlen(name);
        bool temp = is_temp_name(name), blob = !temp && is_key_name(name, len, ".bin");
        if (!temp && !blob) continue;
        bool needed = false;
        for (int i = 0; blob && i < n && !needed; i++)
            needed = strlen(specs[i].key) + 4 == len && strncmp(name, specs[i].key, len - 4) == 0;
        struct stat sb;
        if (needed || fstatat(dirfd(d), name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode))
            continue;
        if (blob && sb.st_size % OFFLOAD_ALIGN) {
            char key[128];
            snprintf(key, sizeof key, "%.*s", (int)(len - 4), name);
            if (!offload_manifest_find(old, key)) continue;
        }
        if (unlinkat(dirfd(d), name, 0) != 0 && errno != ENOENT)
            fprintf(stderr, "ferry: warning: %s/%s: cannot delete unused file: %s\n", dir, name, strerror(errno));
    }
    closedir(d);
}

static ferry_status mkdir_p(const char *dir)
{
    if (!*dir) return ferry_fail(FERRY_ERR_INVALID, "offload: empty directory name");
    char *p = strdup(dir);
    if (!p) return ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", dir);
    ferry_status st = FERRY_OK;
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0') continue;
        char save = *s;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            st = ferry_fail(FERRY_ERR_IO, "%s: mkdir: %s", p, strerror(errno));
            break;
        }
        *s = save;
        if (!save) break;
    }
    free(p);
    struct stat sb;
    if (st == FERRY_OK && (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)))
        st = ferry_fail(FERRY_ERR_IO, "%s: not a directory", dir);
    return st;
}

static ferry_status specs_check(const offload_spec *specs, int n)
{
    for (int i = 0; i < n; i++) {
        if (!offload_key_valid(specs[i].key))
            return ferry_fail(FERRY_ERR_INTERNAL, "offload: blob key '%s' is not [a-z0-9-]+",
                              specs[i].key ? specs[i].key : "(null)");
        if (specs[i].size % OFFLOAD_ALIGN)
            return ferry_fail(FERRY_ERR_INTERNAL, "offload: blob '%s': size %" PRIu64 " is not a multiple of %u",
                              specs[i].key, specs[i].size, OFFLOAD_ALIGN);
        uint64_t sum = 0;
        for (int r = 0; r < specs[i].n_regions; r++) sum += specs[i].region_size[r];
        if (specs[i].n_regions < 0 || (specs[i].n_regions > 0 && sum != specs[i].size))
            return ferry_fail(FERRY_ERR_INTERNAL, "offload: blob '%s': its regions do not add up to its size",
                              specs[i].key);
        for (int j = 0; j < i; j++)
            if (strcmp(specs[i].key, specs[j].key) == 0)
                return ferry_fail(FERRY_ERR_INTERNAL, "offload: blob key '%s' appears twice", specs[i].key);
    }
    return FERRY_OK;
}

/* Joins dir and KEY.bin. */
static char *blob_path(const char *dir, const char *key)
{
    size_t n = strlen(key);
    char *name = malloc(n + 5);
    if (!name) return NULL;
    memcpy(name, key, n);
    memcpy(name + n, ".bin", 5);
    char *p = util_path_join(dir, name);
    free(name);
    return p;
}

/* ---- public --------------------------------------------------------------- */

ferry_status offload_open(const char *dir, const char *fingerprint, const offload_spec *specs, int n,
                          offload_fill_fn fill, void *ctx, offload_dir **out)
{
    *out = NULL;
    if (n < 0) return ferry_fail(FERRY_ERR_INTERNAL, "offload: %d blobs", n);
    FERRY_TRY(specs_check(specs, n));
    FERRY_TRY(mkdir_p(dir));

    ferry_status st = FERRY_OK;
    offload_manifest old = {0};
    strbuf sb;
    sb_init(&sb);
    uint8_t *buf = NULL;
    char *mpath = util_path_join(dir, OFFLOAD_MANIFEST);
    offload_dir *od = calloc(1, sizeof *od);
    if (od) od->lock_fd = -1;
    if (!mpath || !od || !(od->dir = strdup(dir)) || !(od->blobs = calloc(n ? (size_t)n : 1, sizeof *od->blobs))) {
        st = ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", dir);
        goto fail;
    }
    for (int i = 0; i < n; i++) od->blobs[i].fd = -1;
    od->n = n;
    /* One buffer serves verification (4 MiB reads) and writing (1 MiB). */
    if (posix_memalign((void **)&buf, OFFLOAD_ALIGN, VERIFY_BUF > WRITE_BUF ? VERIFY_BUF : WRITE_BUF) != 0) {
        buf = NULL;
        st = ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", dir);
        goto fail;
    }

    /* Before anything is read: the manifest read under the lock is the one
     * every blob is checked against until offload_close. */
    dir_lock lk;
    if ((st = lock_take(dir, &lk)) != FERRY_OK) goto fail;
    od->lock_fd = lk.fd;
    manifest_load(mpath, &old);
    bool same_inputs = old.fingerprint && strcmp(old.fingerprint, fingerprint) == 0;

    /* Phase 1: every blob valid, the old manifest untouched. A blob that
     * must be written needs the exclusive lock (L1); a joiner that cannot
     * have it stops here (L3). */
    char why[300];
    for (int i = 0; i < n; i++) {
        offload_blob *b = &od->blobs[i];
        b->size = specs[i].size;
        if (!(b->key = strdup(specs[i].key)) || !(b->path = blob_path(dir, specs[i].key))) {
            st = ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", dir);
            goto fail;
        }
        const offload_entry *e = same_inputs ? offload_manifest_find(&old, specs[i].key) : NULL;
        region_sum rs;
        if ((st = regions_alloc(b, &specs[i])) != FERRY_OK) goto fail;
        region_start(&rs, &specs[i], b->region_crc);
        if (e && e->size == b->size && blob_open_verified(b->path, b->size, e->crc, buf, &b->fd, &b->direct, &rs)) {
            b->crc = e->crc;
            continue;
        }
        if (!old.fingerprint) snprintf(why, sizeof why, "it has no valid manifest");
        else if (!same_inputs) snprintf(why, sizeof why, "its blobs were made from other inputs");
        else if (!e || e->size != b->size) snprintf(why, sizeof why, "it has no blob %s of this layout", specs[i].key);
        else snprintf(why, sizeof why, "blob %s must be rebuilt", specs[i].key);
        if ((st = lock_upgrade(dir, &lk, why)) != FERRY_OK) goto fail;
        if (!fill) {
            st = ferry_fail(FERRY_ERR_INTERNAL, "%s: must be rebuilt, but no fill callback was given", b->path);
            goto fail;
        }
        if ((st = blob_build(b, &specs[i], i, fill, ctx, buf)) != FERRY_OK) goto fail;
    }

    if (lk.exclusive) {
        /* Phase 2: the new manifest vouches for exactly these blobs. */
        if ((st = offload_manifest_render(fingerprint, od->blobs, od->n, &sb)) != FERRY_OK) goto fail;
        if (!old.text || old.len != sb.len || memcmp(old.text, sb.data, sb.len) != 0)
            if ((st = util_write_file_atomic(mpath, sb.data, sb.len)) != FERRY_OK) goto fail;
        /* Phase 3: what no manifest vouches for any more goes. */
        remove_unused(dir, specs, n, &old);
        /* L2: readers with the same inputs may join from now on. */
        lock_set(lk.fd, F_RDLCK, false);
    } else {
        od->joined = lk.fd >= 0;
    }
    *out = od;
    od = NULL;

fail:
    offload_close(od);
    offload_manifest_clear(&old);
    sb_free(&sb);
    free(buf);
    free(mpath);
    return st;
}

void offload_close(offload_dir *od)
{
    if (!od) return;
    for (int i = 0; od->blobs && i < od->n; i++) {
        if (od->blobs[i].fd >= 0) close(od->blobs[i].fd);
        free(od->blobs[i].key);
        free(od->blobs[i].path);
        free(od->blobs[i].region_crc);
        free(od->blobs[i].region_size);
    }
    if (od->lock_fd >= 0) close(od->lock_fd); /* lets the lock go */
    free(od->blobs);
    free(od->dir);
    free(od);
}

ferry_status offload_rebuild(offload_dir *od, int i, offload_fill_fn fill, void *ctx)
{
    FERRY_ASSERT(i >= 0 && i < od->n);
    offload_blob *b = &od->blobs[i];
    if (od->lock_fd < 0)
        return ferry_fail(FERRY_ERR_IO, "%s: cannot rebuild it: the offload dir is read-only", b->path);
    int err = lock_set(od->lock_fd, F_WRLCK, false);
    if (err == EAGAIN)
        return ferry_fail(FERRY_ERR_BUSY, "%s: cannot rebuild it: %s is in use by another ferry process", b->path,
                          od->dir);
    if (err) return ferry_fail(FERRY_ERR_IO, "%s/%s: cannot lock: %s", od->dir, OFFLOAD_LOCK, strerror(err));
    uint8_t *buf = NULL;
    offload_blob nb = {.key = b->key, .path = b->path, .fd = -1, .size = b->size};
    offload_spec spec = {b->key, b->size, b->n_regions, b->region_size};
    ferry_status st;
    if (posix_memalign((void **)&buf, OFFLOAD_ALIGN, WRITE_BUF) != 0) {
        buf = NULL;
        st = ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", b->path);
    } else {
        st = blob_build(&nb, &spec, i, fill, ctx, buf);
    }
    if (st == FERRY_OK && nb.crc != b->crc) {
        /* not what the manifest vouches for (the checkpoint changed under a
         * running process?): the next offload_open finds it by checksum */
        st = ferry_fail(FERRY_ERR_IO, "%s: rebuilt with checksum %08" PRIx32 ", the manifest says %08" PRIx32,
                        b->path, nb.crc, b->crc);
    }
    if (st == FERRY_OK) {
        close(b->fd);
        b->fd = nb.fd;
        b->direct = nb.direct;
        b->rebuilt = true;
        memcpy(b->region_crc, nb.region_crc, (size_t)b->n_regions * sizeof *b->region_crc);
    } else if (nb.fd >= 0) {
        close(nb.fd);
    }
    free(nb.region_crc);
    free(buf);
    lock_set(od->lock_fd, F_RDLCK, false); /* L2 again */
    return st;
}

ferry_status offload_blob_open_buffered(const offload_blob *b, int *fd)
{
    *fd = -1;
    if (!b->direct) {
        /* the verified descriptor is buffered already: share it */
        *fd = fcntl(b->fd, F_DUPFD_CLOEXEC, 0);
        return *fd >= 0 ? FERRY_OK : ferry_fail(FERRY_ERR_IO, "%s: dup: %s", b->path, strerror(errno));
    }
    int nfd = open(b->path, O_RDONLY | O_CLOEXEC);
    if (nfd < 0) return ferry_fail(FERRY_ERR_IO, "%s: %s", b->path, strerror(errno));
    /* b->fd keeps its inode alive, so no other file can have the same
     * (device, inode) pair: equal means the very file verified. */
    struct stat a, c;
    if (fstat(b->fd, &a) != 0 || fstat(nfd, &c) != 0 || a.st_dev != c.st_dev || a.st_ino != c.st_ino) {
        close(nfd);
        return ferry_fail(FERRY_ERR_IO,
                          "%s: replaced after it was verified (is another program writing the offload dir?)",
                          b->path);
    }
    *fd = nfd;
    return FERRY_OK;
}
