/*
 * test_offload.c - the offload directory (engine/offload.h): blobs, the
 * manifest, reuse and repair, and CRC-32C.
 *
 * Three blobs whose content is a function of (key, fingerprint), written by
 * a fill callback that mixes small writes, one large write and padding and
 * counts its calls. A sequence of offload_open calls on one directory then
 * checks what is rebuilt and what reused: the first build, a reuse, a new
 * fingerprint, a changed size, one corrupted byte, a removed spec (its blob
 * deleted, an unrelated file kept), ENOSPC half way through a rebuild (the
 * old manifest and no temporary file left; the half-rebuilt directory
 * repaired by checksum on the next run), a fill that writes too little or
 * too much, bad specs, and manifests that are garbage or that name files
 * outside the directory. Then one directory and two offload_dirs at once
 * (each its own lock holder, as two processes are): other inputs or another
 * layout refused while the first is open, the same inputs joined read-only;
 * orphan blobs and temporary files deleted, files not named like ferry's
 * kept; a blob renamed over after its verification never read; a blob
 * damaged while open rebuilt (offload_rebuild), not while shared. All run
 * again in a child whose seccomp filter makes O_DIRECT opens fail with
 * EINVAL, as tmpfs used to, to take the buffered path. CRC-32C is checked against the standard check value and a
 * bitwise reference, in both implementations.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../engine/base/fault.h"
#include "../../engine/io/crc32c.h"
#include "../../engine/io/offload.h"
#include "../../engine/base/util.h"
#include "check.h"
#include "seccomp_child.h"

#define MiB (1u << 20)
#define TAIL_ZEROS 1000 /* each blob ends in this many bytes of offload_pad */

/* ---- blob content ---------------------------------------------------------- */

typedef struct {
    const char *fingerprint; /* content depends on it, like real conversions */
    int calls;
    int64_t skew;            /* bytes written beyond (or short of) the size */
    void (*hook)(void);      /* run once, at the first call (then cleared) */
} fill_ctx;

static const char *g_keys[3] = {"layers-000-002", "layers-003-005", "lm-head"};
static offload_spec g_specs[3];

static uint8_t content_byte(const char *key, const char *fp, uint64_t off)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *p = key; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
    for (const char *p = fp; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
    uint64_t w = (off / 8 + h) * 0x9E3779B97F4A7C15ull;
    w ^= w >> 31;
    return (uint8_t)(w >> (8 * (off % 8)));
}

/* The expected bytes of a blob (malloc'd). */
static uint8_t *content(const char *key, const char *fp, uint64_t size)
{
    uint8_t *b = malloc(size ? size : 1);
    if (!b) abort();
    for (uint64_t k = 0; k < size; k++) b[k] = k + TAIL_ZEROS >= size ? 0 : content_byte(key, fp, k);
    return b;
}

/* Small pieces, a piece larger than the writer's buffer, small pieces
 * again, then zero padding - as a group of tensors would come. */
static ferry_status fill(void *vctx, int i, offload_writer *w)
{
    fill_ctx *ctx = vctx;
    ctx->calls++;
    if (ctx->hook) {
        void (*hook)(void) = ctx->hook;
        ctx->hook = NULL;
        hook();
    }
    uint64_t size = (uint64_t)((int64_t)g_specs[i].size + ctx->skew);
    uint8_t *b = content(g_keys[i], ctx->fingerprint, size);
    uint64_t data = size - TAIL_ZEROS, off = 0;
    ferry_status st = FERRY_OK;
    static const size_t small[] = {100, 4000, 7, 65536};
    for (int k = 0; k < 4 && st == FERRY_OK && off < data; k++) {
        size_t n = small[k] < data - off ? small[k] : (size_t)(data - off);
        st = offload_write(w, b + off, n);
        off += n;
    }
    if (st == FERRY_OK && data - off > 3 * MiB / 2) {
        st = offload_write(w, b + off, 3 * MiB / 2);
        off += 3 * MiB / 2;
    }
    while (st == FERRY_OK && off < data) {
        size_t n = data - off < 7000 ? (size_t)(data - off) : 7000;
        st = offload_write(w, b + off, n);
        off += n;
    }
    if (st == FERRY_OK) st = offload_pad(w, TAIL_ZEROS);
    free(b);
    return st;
}

/* ---- directory helpers ------------------------------------------------------ */

static char *make_dir(const char *base)
{
    char *tmpl = util_path_join(base, "ferry-test-offload-XXXXXX");
    if (!mkdtemp(tmpl)) {
        perror("mkdtemp");
        exit(2);
    }
    return tmpl;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void remove_tree(char *dir)
{
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(dir);
}

static char *file_in(const char *dir, const char *name)
{
    char *p = util_path_join(dir, name);
    if (!p) abort();
    return p;
}

static char *read_all(const char *path, size_t *len)
{
    char *text = NULL;
    if (util_read_file(path, &text, len) != FERRY_OK) return NULL;
    return text;
}

static int64_t file_size(const char *dir, const char *name)
{
    char *p = file_in(dir, name);
    struct stat sb;
    int64_t n = stat(p, &sb) == 0 ? (int64_t)sb.st_size : -1;
    free(p);
    return n;
}

/* Names in dir containing ".tmp." */
static int temp_files(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) n++;
    if (d) closedir(d);
    return n;
}

/* ---- checking an opened directory ------------------------------------------- */

/* offload_open with the blobs given; returns the status and keeps od. */
static offload_dir *g_od;
static fill_ctx g_ctx;

static ferry_status open_with(const char *dir, const char *fp, int n, int64_t skew)
{
    offload_close(g_od);
    g_od = NULL;
    g_ctx = (fill_ctx){.fingerprint = fp, .skew = skew};
    ferry_status st = offload_open(dir, fp, g_specs, n, fill, &g_ctx, &g_od);
    if (st != FERRY_OK && g_od) {
        fprintf(stderr, "offload_open failed but returned a directory\n");
        check_failures++;
    }
    return st;
}

/* Every blob of g_od: the right size, path, fd, CRC and bytes; rebuilt as
 * `rebuilt` says (a bit per blob). */
static void check_blobs(const char *dir, const char *fp, int n, unsigned rebuilt, int line)
{
    check_count++;
    if (!g_od || g_od->n != n) {
        fprintf(stderr, "%s:%d: expected an open directory of %d blobs\n", __FILE__, line, n);
        check_failures++;
        return;
    }
    for (int i = 0; i < n; i++) {
        offload_blob *b = &g_od->blobs[i];
        char name[64];
        snprintf(name, sizeof name, "%s.bin", g_keys[i]);
        char *want_path = file_in(dir, name);
        uint8_t *want = content(g_keys[i], fp, g_specs[i].size);
        uint8_t *got = NULL;
        bool ok = b->size == g_specs[i].size && strcmp(b->path, want_path) == 0 &&
                  b->rebuilt == (bool)(rebuilt >> i & 1) && file_size(dir, name) == (int64_t)b->size &&
                  b->crc == crc32c(0, want, b->size) && b->fd >= 0 &&
                  posix_memalign((void **)&got, 4096, b->size ? b->size : 4096) == 0 &&
                  pread(b->fd, got, b->size, 0) == (ssize_t)b->size && memcmp(got, want, b->size) == 0;
        check_count++;
        if (!ok) {
            fprintf(stderr, "%s:%d: blob %d (%s): size %llu, rebuilt %d (want %d), crc %08x, fd %d\n", __FILE__,
                    line, i, b->path, (unsigned long long)b->size, b->rebuilt, (int)(rebuilt >> i & 1), b->crc, b->fd);
            check_failures++;
        }
        free(got);
        free(want);
        free(want_path);
    }
}

#define CHECK_BLOBS(dir, fp, n, rebuilt) check_blobs(dir, fp, n, rebuilt, __LINE__)

/* Every blob's region checksums: each the CRC-32C of its part of the
 * content (one region: the whole blob's). */
static void check_regions(const offload_dir *od, const char *fp, int line)
{
    for (int i = 0; od && i < od->n; i++) {
        const offload_blob *b = &od->blobs[i];
        uint8_t *want = content(g_keys[i], fp, g_specs[i].size);
        int n = g_specs[i].n_regions ? g_specs[i].n_regions : 1;
        bool ok = b->n_regions == n;
        uint64_t at = 0;
        for (int r = 0; ok && r < n; r++) {
            uint64_t size = g_specs[i].n_regions ? g_specs[i].region_size[r] : g_specs[i].size;
            ok = b->region_size[r] == size && b->region_crc[r] == crc32c(0, want + at, size);
            at += size;
        }
        check_count++;
        if (!ok) {
            fprintf(stderr, "%s:%d: blob %d (%s): region checksums wrong\n", __FILE__, line, i, b->path);
            check_failures++;
        }
        free(want);
    }
}

static void set_fault(const char *spec)
{
    if (spec) setenv("FERRY_FAULT", spec, 1);
    else unsetenv("FERRY_FAULT");
    fault_reset();
}

/* stderr goes to a temporary file between quiet_begin and quiet_end, which
 * passes on every line but ferry's warnings and returns those (malloc'd):
 * the sequence provokes many on purpose. */
static int g_saved_stderr = -1;
static FILE *g_quiet;

static void quiet_begin(void)
{
    fflush(stderr);
    g_saved_stderr = dup(2);
    g_quiet = tmpfile();
    if (g_saved_stderr < 0 || !g_quiet) abort();
    dup2(fileno(g_quiet), 2);
}

static char *quiet_end(void)
{
    fflush(stderr);
    dup2(g_saved_stderr, 2);
    close(g_saved_stderr);
    rewind(g_quiet);
    size_t cap = 1 << 16, len = 0;
    char *warnings = calloc(1, cap), line[1024];
    while (warnings && fgets(line, sizeof line, g_quiet)) {
        if (strncmp(line, "ferry: warning: ", 16) != 0) {
            fputs(line, stderr);
            continue;
        }
        size_t n = strlen(line);
        if (len + n < cap) memcpy(warnings + len, line, n + 1), len += n;
    }
    fclose(g_quiet);
    return warnings;
}

/* True when a file in dir can be opened with O_DIRECT. */
static bool probe_direct(const char *dir)
{
    char *p = file_in(dir, "ferry-direct-probe");
    int fd = open(p, O_CREAT | O_WRONLY | O_DIRECT, 0644);
    if (fd >= 0) close(fd);
    unlink(p);
    free(p);
    return fd >= 0;
}

/* ---- the sequence ------------------------------------------------------------ */

static void run_sequence_(const char *base, bool expect_direct)
{
    uint64_t sizes[3] = {8192, 2 * MiB + 4096, 12288};
    for (int i = 0; i < 3; i++) g_specs[i] = (offload_spec){.key = g_keys[i], .size = sizes[i]};
    char *top = make_dir(base);
    char *dir = file_in(top, "a/b/offload"); /* made with its parents */
    char *manifest = file_in(dir, OFFLOAD_MANIFEST);

    /* First run: everything built. */
    CHECK_STATUS(open_with(dir, "fp-A", 3, 0), FERRY_OK);
    CHECK_EQ_INT(g_ctx.calls, 3);
    CHECK_BLOBS(dir, "fp-A", 3, 7);
    CHECK(file_size(dir, OFFLOAD_MANIFEST) > 0);
    CHECK_EQ_INT(temp_files(dir), 0);
    for (int i = 0; g_od && i < 3; i++) CHECK_EQ_INT(g_od->blobs[i].direct, expect_direct);
    size_t mlen = 0;
    char *mtext = read_all(manifest, &mlen);
    CHECK(mtext && strstr(mtext, "\"format\": 1") && strstr(mtext, "\"fingerprint\": \"fp-A\""));
    CHECK(mtext && strstr(mtext, "\"file\": \"layers-003-005.bin\", \"size\": 2101248"));
    if (g_od) {
        char crc[32];
        snprintf(crc, sizeof crc, "\"crc32c\": \"%08x\"", g_od->blobs[2].crc);
        CHECK(mtext && strstr(mtext, crc));
    }
    free(mtext);

    /* Same inputs: nothing rebuilt, the manifest not even rewritten. */
    struct stat before, after;
    stat(manifest, &before);
    CHECK_STATUS(open_with(dir, "fp-A", 3, 0), FERRY_OK);
    CHECK_EQ_INT(g_ctx.calls, 0);
    CHECK_BLOBS(dir, "fp-A", 3, 0);
    stat(manifest, &after);
    CHECK(before.st_ino == after.st_ino);

    /* New inputs: everything rebuilt. */
    CHECK_STATUS(open_with(dir, "fp-B", 3, 0), FERRY_OK);
    CHECK_EQ_INT(g_ctx.calls, 3);
    CHECK_BLOBS(dir, "fp-B", 3, 7);

    /* One size changed: that blob only. */
    g_specs[1].size = 3 * MiB;
    CHECK_STATUS(open_with(dir, "fp-B", 3, 0), FERRY_OK);
    CHECK_EQ_INT(g_ctx.calls, 1);
    CHECK_BLOBS(dir, "fp-B", 3, 2);

    /* One byte flipped on disk: found by its checksum, that blob only. */
    char *victim = file_in(dir, "lm-head.bin");
    int fd = open(victim, O_RDWR);
    uint8_t byte = 0;
    CHECK(fd >= 0 && pread(fd, &byte, 1, 5000) == 1);
    byte ^= 0x10;
    CHECK(fd >= 0 && pwrite(fd, &byte, 1, 5000) == 1);
    close(fd);
    CHECK_STATUS(open_with(dir, "fp-B", 3, 0), FERRY_OK);
    CHECK_EQ_INT(g_ctx.calls, 1);
    CHECK_BLOBS(dir, "fp-B", 3, 4);
    /* Truncated: the same. */
    CHECK(truncate(victim, 4096) == 0);
    CHECK_STATUS(open_with(dir, "fp-B", 3, 0), FERRY_OK);
    CHECK_EQ_INT(g_ctx.calls, 1);
    CHECK_BLOBS(dir, "fp-B", 3, 4);
    /* Gone: the same. */
    CHECK(unlink(victim) == 0);
    CHECK_STATUS(open_with(dir, "fp-B", 3, 0), FERRY_OK);
    CHECK_EQ_INT(g_ctx.calls, 1);
    CHECK_BLOBS(dir, "fp-B", 3, 4);
    free(victim);

    /* A spec dropped (the last, so g_specs stays in order): its blob goes,
     * a file the manifest never listed stays. */
    char *notes = file_in(dir, "notes.txt");
    FILE *f = fopen(notes, "w");
    if (f) fputs("mine\n", f), fclose(f);
    CHECK_STATUS(open_with(dir, "fp-B", 2, 0), FERRY_OK);
    CHECK_EQ_INT(g_ctx.calls, 0);
    CHECK_BLOBS(dir, "fp-B", 2, 0);
    CHECK_EQ_INT(file_size(dir, "lm-head.bin"), -1);
    CHECK_EQ_INT(file_size(dir, "notes.txt"), 5);
    CHECK_STATUS(open_with(dir, "fp-B", 3, 0), FERRY_OK);
    CHECK_EQ_INT(g_ctx.calls, 1);
    CHECK_BLOBS(dir, "fp-B", 3, 4);

    /* The disk fills up during a rebuild for new inputs: the second write
     * is the first flush of layers-003-005 (layers-000-002 is one write). */
    mtext = read_all(manifest, &mlen);
    set_fault("write_enospc=2");
    CHECK_STATUS(open_with(dir, "fp-C", 3, 0), FERRY_ERR_IO);
    char *failed_path = file_in(dir, "layers-003-005.bin");
    CHECK_MSG_HAS(failed_path);
    CHECK_MSG_HAS(": write: No space left on device");
    free(failed_path);
    CHECK_EQ_INT(temp_files(dir), 0);
    size_t mlen2 = 0;
    char *mtext2 = read_all(manifest, &mlen2);
    CHECK(mtext && mtext2 && mlen == mlen2 && memcmp(mtext, mtext2, mlen) == 0);
    free(mtext);
    free(mtext2);
    set_fault(NULL);
    /* layers-000-002.bin now holds fp-C content that the old manifest does
     * not vouch for: going back to fp-B rebuilds it, by checksum. */
    CHECK_STATUS(open_with(dir, "fp-B", 3, 0), FERRY_OK);
    CHECK_EQ_INT(g_ctx.calls, 1);
    CHECK_BLOBS(dir, "fp-B", 3, 1);
    CHECK_STATUS(open_with(dir, "fp-C", 3, 0), FERRY_OK);
    CHECK_EQ_INT(g_ctx.calls, 3);
    CHECK_BLOBS(dir, "fp-C", 3, 7);

    /* A write or an fsync fails for other inputs: of a blob (fsync 3 is the
     * second blob's; each blob's rename is followed by an fsync of the
     * directory, whose failure is not one) or of the new manifest (fsync
     * 7). The failure names the file; no temporary stays; the old manifest
     * stays, and vouches by checksum only for the blobs still holding what
     * it lists. */
    static const struct {
        const char *spec, *file, *what;
    } faults[] = {{"fsync_eio=3", "layers-003-005.bin", ": fsync: Input/output error"},
                  {"fsync_eio=7", OFFLOAD_MANIFEST, ": fsync: Input/output error"},
                  {"write_eio=1", "layers-000-002.bin", ": write: Input/output error"}};
    for (size_t k = 0; k < sizeof faults / sizeof faults[0]; k++) {
        mtext = read_all(manifest, &mlen);
        set_fault(faults[k].spec);
        CHECK_STATUS(open_with(dir, "fp-E", 3, 0), FERRY_ERR_IO);
        set_fault(NULL);
        char *named = file_in(dir, faults[k].file);
        CHECK_MSG_HAS(named);
        CHECK_MSG_HAS(faults[k].what);
        free(named);
        CHECK_EQ_INT(temp_files(dir), 0);
        mtext2 = read_all(manifest, &mlen2);
        CHECK(mtext && mtext2 && mlen == mlen2 && memcmp(mtext, mtext2, mlen) == 0);
        free(mtext);
        free(mtext2);
        CHECK_STATUS(open_with(dir, "fp-C", 3, 0), FERRY_OK);
        CHECK_EQ_INT(g_ctx.calls, k == 0 ? 1 : k == 1 ? 3 : 0); /* the blobs rewritten for fp-E */
        CHECK_BLOBS(dir, "fp-C", 3, k == 0 ? 1 : k == 1 ? 7 : 0);
    }
    /* The fsync of the directory after a rename fails: not a failure (the
     * rename happened; what a crash could undo, the checksums catch). */
    set_fault("fsync_eio=2");
    CHECK_STATUS(open_with(dir, "fp-E", 3, 0), FERRY_OK);
    set_fault(NULL);
    CHECK_BLOBS(dir, "fp-E", 3, 7);
    CHECK_STATUS(open_with(dir, "fp-C", 3, 0), FERRY_OK);
    CHECK_BLOBS(dir, "fp-C", 3, 7);

    /* A fill that writes too little or too much is a bug, named; nothing
     * of it is kept. */
    mtext = read_all(manifest, &mlen);
    CHECK_STATUS(open_with(dir, "fp-D", 3, -4096), FERRY_ERR_INTERNAL);
    CHECK_MSG_HAS("layers-000-002");
    CHECK_MSG_HAS("expected 8192");
    CHECK_STATUS(open_with(dir, "fp-D", 3, 4096), FERRY_ERR_INTERNAL);
    CHECK_MSG_HAS("layers-000-002");
    CHECK_EQ_INT(temp_files(dir), 0);
    CHECK_EQ_INT(file_size(dir, "layers-000-002.bin"), 8192);
    mtext2 = read_all(manifest, &mlen2);
    CHECK(mtext && mtext2 && mlen == mlen2 && memcmp(mtext, mtext2, mlen) == 0);
    free(mtext);
    free(mtext2);

    /* A garbage manifest: nothing reusable, everything rebuilt (warns). */
    CHECK(util_write_file_atomic(manifest, "{\"format\": 1, \"blobs\": [", 24) == FERRY_OK);
    CHECK_STATUS(open_with(dir, "fp-C", 3, 0), FERRY_OK);
    CHECK_EQ_INT(g_ctx.calls, 3);
    CHECK_BLOBS(dir, "fp-C", 3, 7);
    CHECK_STATUS(open_with(dir, "fp-C", 3, 0), FERRY_OK);
    CHECK_EQ_INT(g_ctx.calls, 0);

    /* A manifest naming a file outside the directory is not trusted, and
     * that file is never deleted. */
    char *outside = file_in(top, "a/b/victim.bin");
    f = fopen(outside, "w");
    if (f) fputs("keep\n", f), fclose(f);
    const char *evil = "{\"format\": 1, \"fingerprint\": \"fp-C\", \"blobs\": [{\"key\": \"victim\", "
                       "\"file\": \"../victim.bin\", \"size\": 4096, \"crc32c\": \"00000000\"}]}";
    CHECK(util_write_file_atomic(manifest, evil, strlen(evil)) == FERRY_OK);
    CHECK_STATUS(open_with(dir, "fp-C", 3, 0), FERRY_OK);
    CHECK_EQ_INT(g_ctx.calls, 3);
    struct stat sb;
    CHECK(stat(outside, &sb) == 0 && sb.st_size == 5);
    free(outside);

    /* Specs the engine must never produce. */
    offload_spec keep = g_specs[1];
    g_specs[1].key = "Layers_1";
    CHECK_STATUS(open_with(dir, "fp-C", 3, 0), FERRY_ERR_INTERNAL);
    CHECK_MSG_HAS("Layers_1");
    g_specs[1].key = "";
    CHECK_STATUS(open_with(dir, "fp-C", 3, 0), FERRY_ERR_INTERNAL);
    g_specs[1].key = "../x";
    CHECK_STATUS(open_with(dir, "fp-C", 3, 0), FERRY_ERR_INTERNAL);
    g_specs[1] = keep;
    g_specs[1].size = 4097;
    CHECK_STATUS(open_with(dir, "fp-C", 3, 0), FERRY_ERR_INTERNAL);
    CHECK_MSG_HAS("4096");
    g_specs[1] = keep;
    g_specs[2].key = g_specs[0].key;
    CHECK_STATUS(open_with(dir, "fp-C", 3, 0), FERRY_ERR_INTERNAL);
    CHECK_MSG_HAS("twice");
    g_specs[2].key = g_keys[2];
    CHECK_EQ_INT(g_ctx.calls, 0);

    /* No blobs at all is a valid (empty) disk tier; it deletes the rest. */
    CHECK_STATUS(open_with(dir, "fp-C", 0, 0), FERRY_OK);
    CHECK_EQ_INT(file_size(dir, "layers-000-002.bin"), -1);
    CHECK_EQ_INT(file_size(dir, "notes.txt"), 5);

    offload_close(g_od);
    g_od = NULL;
    free(notes);
    free(manifest);
    free(dir);
    remove_tree(top);
}

/* The sequence, checking that what went wrong on purpose was said. */
static void run_sequence(const char *base, bool expect_direct)
{
    quiet_begin();
    run_sequence_(base, expect_direct);
    char *w = quiet_end();
    CHECK(w && strstr(w, "lm-head.bin: checksum "));
    CHECK(w && strstr(w, "lm-head.bin: 4096 bytes, the manifest says 12288; rebuilding it"));
    CHECK(w && strstr(w, "lm-head.bin: No such file or directory; rebuilding it"));
    CHECK(w && strstr(w, "layers-000-002.bin: checksum "));
    CHECK(w && strstr(w, "unusable manifest (not valid JSON)"));
    CHECK(w && strstr(w, "unusable manifest (a malformed blob entry)"));
    free(w);
}

/* ---- several users of one directory ------------------------------------------- */

static void put_file(const char *dir, const char *name, size_t size)
{
    char *p = file_in(dir, name);
    FILE *f = fopen(p, "w");
    for (size_t k = 0; f && k < size; k++) fputc('x', f);
    if (!f || fclose(f) != 0) {
        perror(p);
        exit(2);
    }
    free(p);
}

static ino_t inode_of(const char *dir, const char *name)
{
    char *p = file_in(dir, name);
    struct stat sb;
    ino_t ino = lstat(p, &sb) == 0 ? sb.st_ino : 0;
    free(p);
    return ino;
}

static char *g_replace_dir; /* replace_first_blob's directory */

/* Another program's hand: renames a file of other content over
 * layers-000-002.bin, which offload_open has verified by now. */
static void replace_first_blob(void)
{
    char *tmp = file_in(g_replace_dir, "intruder");
    char *blob = file_in(g_replace_dir, "layers-000-002.bin");
    uint8_t *other = content(g_keys[0], "fp-X", g_specs[0].size);
    FILE *f = fopen(tmp, "w");
    if (!f || fwrite(other, 1, g_specs[0].size, f) != g_specs[0].size || fclose(f) != 0 || rename(tmp, blob) != 0) {
        perror(tmp);
        exit(2);
    }
    free(other);
    free(blob);
    free(tmp);
}

/* Each offload_dir holds its own open file description of the lock file,
 * so two in one process exclude each other exactly as two processes do. */
static void test_shared_dir_(const char *base)
{
    uint64_t sizes[3] = {8192, 16384, 12288};
    for (int i = 0; i < 3; i++) g_specs[i] = (offload_spec){.key = g_keys[i], .size = sizes[i]};
    char *top = make_dir(base);
    char *dir = file_in(top, "od");
    char *manifest = file_in(dir, OFFLOAD_MANIFEST);
    offload_dir *a = NULL, *b = NULL;
    fill_ctx ca = {.fingerprint = "fp-A"}, cb = {.fingerprint = "fp-B"};
    CHECK_STATUS(offload_open(dir, "fp-A", g_specs, 3, fill, &ca, &a), FERRY_OK);
    CHECK(a && !a->joined);
    size_t mlen = 0, mlen2 = 0;
    char *mtext = read_all(manifest, &mlen);
    ino_t ino0 = inode_of(dir, "layers-000-002.bin");

    /* Other inputs while a is open: refused, naming the dir; nothing written. */
    CHECK_STATUS(offload_open(dir, "fp-B", g_specs, 3, fill, &cb, &b), FERRY_ERR_BUSY);
    CHECK(b == NULL);
    CHECK_MSG_HAS(dir);
    CHECK_MSG_HAS("in use by another ferry process");
    CHECK_EQ_INT(cb.calls, 0);
    /* Another layout of the same inputs (a blob of another size): the same. */
    g_specs[1].size = 20480;
    CHECK_STATUS(offload_open(dir, "fp-A", g_specs, 3, fill, &cb, &b), FERRY_ERR_BUSY);
    g_specs[1].size = 16384;
    CHECK_EQ_INT(cb.calls, 0);
    char *mtext2 = read_all(manifest, &mlen2);
    CHECK(mtext && mtext2 && mlen == mlen2 && memcmp(mtext, mtext2, mlen) == 0);
    free(mtext2);
    CHECK(inode_of(dir, "layers-000-002.bin") == ino0);

    /* The same inputs join read-only (every blob verified), also for a
     * subset; an orphan stays while the dir is shared (nobody deletes
     * under a reader), and goes with the next exclusive open. */
    put_file(dir, "layers-000-005.bin", 8192);
    CHECK_STATUS(offload_open(dir, "fp-A", g_specs, 3, fill, &cb, &b), FERRY_OK);
    CHECK(b && b->joined);
    offload_close(b);
    CHECK_STATUS(offload_open(dir, "fp-A", g_specs, 2, fill, &cb, &b), FERRY_OK);
    CHECK(b && b->joined && b->n == 2);
    CHECK_EQ_INT(cb.calls, 0);
    CHECK(inode_of(dir, "layers-000-005.bin") != 0);
    offload_close(b);
    b = NULL;
    mtext2 = read_all(manifest, &mlen2);
    CHECK(mtext && mtext2 && mlen == mlen2 && memcmp(mtext, mtext2, mlen) == 0);
    free(mtext2);
    free(mtext);

    /* Alone again: other inputs are built, the orphan deleted. */
    offload_close(a);
    a = NULL;
    cb = (fill_ctx){.fingerprint = "fp-B"};
    CHECK_STATUS(offload_open(dir, "fp-B", g_specs, 3, fill, &cb, &a), FERRY_OK);
    CHECK(a && !a->joined);
    CHECK_EQ_INT(cb.calls, 3);
    CHECK(inode_of(dir, "layers-000-005.bin") == 0);
    offload_close(a);
    a = NULL;

    /* Left behind by failed or killed builds (an orphan blob of a layout no
     * manifest lists, temporary files): deleted. Anything not named like
     * ferry's own files: kept. */
    put_file(dir, "layers-000-001.bin", 4096);
    put_file(dir, "layers-003-005.bin.tmp.2147480000", 100);
    put_file(dir, "layers-003-005.bin.tmp.1", 100); /* a live pid: no ferry writes without the lock */
    put_file(dir, OFFLOAD_MANIFEST ".tmp.77", 10);
    static const char *keep[] = {"notes.txt", "data.bin", "Big.bin", "weights.bin.bak", "x.bin.tmp.abc",
                                 "a_b.bin", ".bin", "README"};
    put_file(dir, "data.bin", 100); /* not a multiple of 4096: never one of ours */
    put_file(dir, "Big.bin", 4096);
    put_file(dir, "a_b.bin", 4096);
    put_file(dir, ".bin", 4096);
    put_file(dir, "weights.bin.bak", 4096);
    put_file(dir, "x.bin.tmp.abc", 10);
    put_file(dir, "notes.txt", 5);
    put_file(dir, "README", 5);
    char *outside = file_in(top, "outside");
    put_file(top, "outside", 4096);
    char *link = file_in(dir, "link.bin");
    char *sub = file_in(dir, "sub.bin");
    CHECK(symlink(outside, link) == 0 && mkdir(sub, 0755) == 0);
    cb = (fill_ctx){.fingerprint = "fp-B"};
    CHECK_STATUS(offload_open(dir, "fp-B", g_specs, 3, fill, &cb, &a), FERRY_OK);
    CHECK_EQ_INT(cb.calls, 0);
    CHECK(inode_of(dir, "layers-000-001.bin") == 0);
    CHECK_EQ_INT(temp_files(dir), 1); /* x.bin.tmp.abc */
    for (size_t k = 0; k < sizeof keep / sizeof keep[0]; k++) {
        check_count++;
        if (!inode_of(dir, keep[k])) CHECK_FAIL_("%s was deleted", keep[k]);
    }
    struct stat sb;
    CHECK(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode) && stat(outside, &sb) == 0 && sb.st_size == 4096);
    CHECK(lstat(sub, &sb) == 0 && S_ISDIR(sb.st_mode));
    CHECK(inode_of(dir, OFFLOAD_LOCK) != 0);
    offload_close(a);
    a = NULL;
    free(outside);
    free(link);
    free(sub);

    /* A blob replaced by rename after it was verified (here while another
     * blob is rebuilt) is not what is read: the verified descriptor is kept,
     * and a second one is the verified file too (a dup of it when buffered)
     * or refused (opened by name, it is another file). */
    char *victim = file_in(dir, "lm-head.bin");
    CHECK(truncate(victim, 4096) == 0);
    free(victim);
    g_replace_dir = dir;
    cb = (fill_ctx){.fingerprint = "fp-B", .hook = replace_first_blob};
    quiet_begin();
    CHECK_STATUS(offload_open(dir, "fp-B", g_specs, 3, fill, &cb, &a), FERRY_OK);
    free(quiet_end());
    CHECK_EQ_INT(cb.calls, 1);
    g_od = a;
    CHECK_BLOBS(dir, "fp-B", 3, 4); /* reads through each blob's fd */
    g_od = NULL;
    int fd = -1;
    for (int i = 0; a && i < 2; i++) {
        uint8_t *want = content(g_keys[i], "fp-B", g_specs[i].size), got[100];
        if (i == 0 && a->blobs[i].direct) {
            CHECK_STATUS(offload_blob_open_buffered(&a->blobs[i], &fd), FERRY_ERR_IO);
            CHECK_MSG_HAS("layers-000-002.bin: replaced after it was verified");
            CHECK_EQ_INT(fd, -1);
        } else {
            CHECK_STATUS(offload_blob_open_buffered(&a->blobs[i], &fd), FERRY_OK);
            CHECK(fd >= 0 && pread(fd, got, 100, 333) == 100 && memcmp(got, want + 333, 100) == 0);
        }
        if (fd >= 0) close(fd);
        fd = -1;
        free(want);
    }
    offload_close(a);
    a = NULL;
    /* The next run finds the intruder by its checksum. */
    cb = (fill_ctx){.fingerprint = "fp-B"};
    quiet_begin();
    CHECK_STATUS(offload_open(dir, "fp-B", g_specs, 3, fill, &cb, &a), FERRY_OK);
    char *w = quiet_end();
    CHECK(w && strstr(w, "layers-000-002.bin: checksum "));
    free(w);
    CHECK_EQ_INT(cb.calls, 1);
    g_od = a;
    CHECK_BLOBS(dir, "fp-B", 3, 1);
    g_od = NULL;
    offload_close(a);

    free(manifest);
    free(dir);
    remove_tree(top);
}

/* A blob damaged in place while open (its descriptor reads the damage) is
 * rebuilt by offload_rebuild and read through the new file; not while the
 * dir is shared, and not into bytes the manifest does not vouch for. */
static void test_rebuild_(const char *base)
{
    uint64_t sizes[3] = {8192, 16384, 12288};
    static const uint64_t regions[3] = {4096, 8192, 4096}; /* blob 1 in three regions, as a run of experts */
    for (int i = 0; i < 3; i++) g_specs[i] = (offload_spec){g_keys[i], sizes[i], 0, NULL};
    g_specs[1].n_regions = 3;
    g_specs[1].region_size = regions;
    char *top = make_dir(base);
    char *dir = file_in(top, "od");
    offload_dir *a = NULL, *b = NULL;
    fill_ctx ca = {.fingerprint = "fp-A"};
    CHECK_STATUS(offload_open(dir, "fp-A", g_specs, 3, fill, &ca, &a), FERRY_OK);
    check_regions(a, "fp-A", __LINE__); /* as written */
    char *victim = file_in(dir, "layers-003-005.bin");
    int fd = open(victim, O_RDWR);
    uint8_t byte = 0x5a;
    CHECK(fd >= 0 && pwrite(fd, &byte, 1, 777) == 1 && fsync(fd) == 0);
    if (fd >= 0) close(fd);
    ino_t ino = inode_of(dir, "layers-003-005.bin");

    /* shared: refused, nothing written */
    fill_ctx cb = {.fingerprint = "fp-A"};
    quiet_begin();
    CHECK_STATUS(offload_open(dir, "fp-A", g_specs, 1, fill, &cb, &b), FERRY_OK);
    free(quiet_end());
    ca.calls = 0;
    if (a) CHECK_STATUS(offload_rebuild(a, 1, fill, &ca), FERRY_ERR_BUSY);
    CHECK_MSG_HAS("in use by another ferry process");
    CHECK_EQ_INT(ca.calls, 0);
    CHECK(inode_of(dir, "layers-003-005.bin") == ino);
    offload_close(b);

    /* other bytes than the manifest's: refused, the old descriptor kept */
    fill_ctx cx = {.fingerprint = "fp-X"};
    int old_fd = a ? a->blobs[1].fd : -1;
    if (a) CHECK_STATUS(offload_rebuild(a, 1, fill, &cx), FERRY_ERR_IO);
    CHECK_MSG_HAS("the manifest says");
    CHECK(a && a->blobs[1].fd == old_fd);

    /* the disk fails while it is rewritten (a write, then the fsync):
     * refused naming the blob, the file in place and its descriptor kept,
     * no temporary left - a later rebuild can still succeed */
    static const char *const disk_faults[] = {"write_enospc=1", "fsync_eio=1"};
    ino = inode_of(dir, "layers-003-005.bin"); /* fp-X's, renamed in place: refused by checksum only after */
    for (int k = 0; k < 2; k++) {
        set_fault(disk_faults[k]);
        if (a) CHECK_STATUS(offload_rebuild(a, 1, fill, &ca), FERRY_ERR_IO);
        set_fault(NULL);
        CHECK_MSG_HAS(victim);
        CHECK_MSG_HAS(k == 0 ? "write: No space left on device" : "fsync: Input/output error");
        CHECK(a && a->blobs[1].fd == old_fd);
        CHECK(inode_of(dir, "layers-003-005.bin") == ino);
        CHECK_EQ_INT(temp_files(dir), 0);
    }
    ca.calls = 0;

    /* alone: rebuilt, read through the new file */
    if (a) CHECK_STATUS(offload_rebuild(a, 1, fill, &ca), FERRY_OK);
    CHECK_EQ_INT(ca.calls, 1);
    g_od = a;
    CHECK_BLOBS(dir, "fp-A", 3, 7); /* all written by this handle, blob 1 twice */
    check_regions(a, "fp-A", __LINE__); /* as rebuilt */
    g_od = NULL;
    /* and the lock is shared again: the same inputs may join */
    cb = (fill_ctx){.fingerprint = "fp-A"};
    CHECK_STATUS(offload_open(dir, "fp-A", g_specs, 3, fill, &cb, &b), FERRY_OK);
    CHECK(b && b->joined);
    CHECK_EQ_INT(cb.calls, 0);
    check_regions(b, "fp-A", __LINE__); /* as verified */
    /* regions that do not add up to the size are refused */
    static const uint64_t bad_regions[2] = {4096, 4096};
    offload_spec bad[1] = {{g_keys[1], 16384, 2, bad_regions}};
    offload_dir *c = NULL;
    CHECK_STATUS(offload_open(dir, "fp-A", bad, 1, fill, &cb, &c), FERRY_ERR_INTERNAL);
    CHECK_MSG_HAS("regions do not add up");
    offload_close(b);
    offload_close(a);
    free(victim);
    free(dir);
    remove_tree(top);
}

static void test_shared_dir(void)
{
    test_shared_dir_("/tmp");
    test_rebuild_("/tmp");
    struct stat sb;
    if (stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode)) {
        test_shared_dir_("/dev/shm");
        test_rebuild_("/dev/shm");
    }
}

static void test_write_all(void)
{
    char *top = make_dir("/tmp");
    char *path = file_in(top, "w.bin");
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    CHECK_STATUS(util_write_all(fd, path, "abc", 3), FERRY_OK);
    set_fault("write_enospc=1");
    CHECK_STATUS(util_write_all(fd, path, "def", 3), FERRY_ERR_IO);
    CHECK_MSG_HAS(path);
    CHECK_MSG_HAS("write: No space left on device");
    CHECK_STATUS(util_write_all(fd, path, "ghi", 3), FERRY_OK); /* it fires once */
    set_fault("write_eio=2");
    CHECK_STATUS(util_write_all(fd, path, "jkl", 3), FERRY_OK);
    CHECK_STATUS(util_write_all(fd, path, "mno", 3), FERRY_ERR_IO);
    CHECK_MSG_HAS("write: Input/output error");
    set_fault("fsync_eio=1");
    errno = 0;
    CHECK(util_fsync(fd) == -1 && errno == EIO);
    CHECK(util_fsync(fd) == 0);
    set_fault(NULL);
    close(fd);
    CHECK_STATUS(util_write_all(fd, path, "x", 1), FERRY_ERR_IO);
    CHECK_MSG_HAS("Bad file descriptor");
    /* util_write_file_atomic: a failed fsync leaves the old file and no
     * temporary */
    CHECK_STATUS(util_write_file_atomic(path, "old", 3), FERRY_OK);
    set_fault("fsync_eio=1");
    CHECK_STATUS(util_write_file_atomic(path, "new", 3), FERRY_ERR_IO);
    set_fault(NULL);
    CHECK_MSG_HAS("w.bin: fsync: Input/output error");
    size_t len = 0;
    char *text = read_all(path, &len);
    CHECK(text && len == 3 && memcmp(text, "old", 3) == 0);
    free(text);
    CHECK_EQ_INT(temp_files(top), 0);
    free(path);
    remove_tree(top);
}

/* ---- CRC-32C ------------------------------------------------------------------ */

static uint32_t crc_bitwise(uint32_t crc, const uint8_t *p, size_t n)
{
    crc = ~crc;
    while (n--) {
        crc ^= *p++;
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0x82F63B78u & -(crc & 1));
    }
    return ~crc;
}

static void test_crc(void)
{
    CHECK_EQ_U64(crc32c(0, "123456789", 9), 0xE3069283u);
    CHECK_EQ_U64(crc32c_sw(0, "123456789", 9), 0xE3069283u);
    CHECK_EQ_U64(crc32c(0, "", 0), 0);
    uint8_t *data = malloc(70000);
    uint64_t s = 88172645463325252ull;
    for (int k = 0; k < 70000; k++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        data[k] = (uint8_t)s;
    }
    int bad = 0;
    for (int t = 0; t < 400; t++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        size_t start = s % 61, n = t < 100 ? (size_t)t : (size_t)(s >> 20) % 69000;
        uint32_t ref = crc_bitwise(0, data + start, n);
        if (crc32c(0, data + start, n) != ref || crc32c_sw(0, data + start, n) != ref) bad++;
        /* Continuing from a partial CRC is the same as one pass. */
        size_t cut = n ? (size_t)(s >> 40) % n : 0;
        if (crc32c(crc32c(0, data + start, cut), data + start + cut, n - cut) != ref ||
            crc32c_sw(crc32c_sw(0, data + start, cut), data + start + cut, n - cut) != ref)
            bad++;
    }
    CHECK_EQ_INT(bad, 0);
    free(data);
}

/* ---- without O_DIRECT ------------------------------------------------------------ */

/* In a child whose seccomp filter fails every open with O_DIRECT with
 * EINVAL: the same sequences, every blob read through the page cache. */
static void no_direct_body(void)
{
    run_sequence("/tmp", false);
    test_shared_dir_("/tmp");
    test_rebuild_("/tmp");
}

static void test_no_direct(void)
{
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_openat, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])), /* low half, x86-64 */
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, O_DIRECT, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EINVAL),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    run_in_seccomp_child(filter, sizeof filter / sizeof filter[0], "test_offload buffered path", no_direct_body);
}

int main(void)
{
    set_fault(NULL);
    test_crc();
    test_write_all();
    run_sequence("/tmp", probe_direct("/tmp"));
    struct stat sb;
    if (stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode))
        run_sequence("/dev/shm", probe_direct("/dev/shm")); /* tmpfs: O_DIRECT only since Linux 6.6 */
    test_shared_dir();
    test_no_direct();
    return check_report();
}
