/*
 * st_writer.c - see st_writer.h.
 */
#define _GNU_SOURCE
#include "st_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/json.h"
#include "../base/util.h"

struct st_writer {
    int dirfd; /* AT_FDCWD, or the directory path and tmp are relative to (not owned) */
    int fd;
    char *path, *tmp;
    uint64_t expect, written; /* data bytes */
};

static ferry_status write_all(st_writer *w, const void *data, size_t n)
{
    return util_write_all(w->fd, w->path, data, n);
}

ferry_status st_writer_open(const char *path, const st_decl *decls, int n, st_writer **out)
{
    return st_writer_openat(AT_FDCWD, path, decls, n, out);
}

ferry_status st_writer_openat(int dirfd, const char *path, const st_decl *decls, int n, st_writer **out)
{
    *out = NULL;
    st_writer *w = calloc(1, sizeof *w);
    if (!w) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    w->dirfd = dirfd;
    w->fd = -1;
    w->path = strdup(path);
    w->tmp = malloc(strlen(path) + 32);
    if (!w->path || !w->tmp) {
        st_writer_abort(w);
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    sprintf(w->tmp, "%s.tmp.%ld", path, (long)getpid());

    strbuf h;
    sb_init(&h);
    /* __metadata__ as torch's save_file writes it: transformers before
     * 4.48.2 reads metadata.get("format") and fails on a file without it */
    sb_puts(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        uint64_t bytes = dtype_size(decls[i].dtype);
        for (int d = 0; d < decls[i].ndim; d++) bytes *= (uint64_t)decls[i].shape[d];
        sb_putc(&h, ',');
        sb_json_str(&h, decls[i].name);
        sb_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", dtype_name(decls[i].dtype));
        for (int d = 0; d < decls[i].ndim; d++) sb_printf(&h, "%s%lld", d ? "," : "", (long long)decls[i].shape[d]);
        sb_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off, (unsigned long long)(off + bytes));
        off += bytes;
    }
    sb_putc(&h, '}');
    while ((8 + h.len) % 8) sb_putc(&h, ' ');
    w->expect = off;
    ferry_status st = FERRY_OK;
    if (h.oom) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    if (st == FERRY_OK) {
        unlinkat(dirfd, w->tmp, 0); /* a leftover of a killed run with our pid */
        w->fd = openat(dirfd, w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (w->fd < 0) st = ferry_fail(FERRY_ERR_IO, "%s: %s", w->path, strerror(errno));
    }
    if (st == FERRY_OK) {
        uint8_t len8[8];
        for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
        st = write_all(w, len8, 8);
        if (st == FERRY_OK) st = write_all(w, h.data, h.len);
    }
    sb_free(&h);
    if (st != FERRY_OK) {
        st_writer_abort(w);
        return st;
    }
    *out = w;
    return FERRY_OK;
}

ferry_status st_writer_write(st_writer *w, const void *data, size_t n)
{
    if (w->written + n > w->expect)
        return ferry_fail(FERRY_ERR_INTERNAL, "%s: more data than the header declares", w->path);
    FERRY_TRY(write_all(w, data, n));
    w->written += n;
    return FERRY_OK;
}

ferry_status st_writer_finish(st_writer *w)
{
    ferry_status st = FERRY_OK;
    if (w->written != w->expect)
        st = ferry_fail(FERRY_ERR_INTERNAL, "%s: %llu of %llu data bytes written", w->path,
                        (unsigned long long)w->written, (unsigned long long)w->expect);
    if (st == FERRY_OK && util_fsync(w->fd) != 0) st = ferry_fail(FERRY_ERR_IO, "%s: fsync: %s", w->path, strerror(errno));
    if (st == FERRY_OK) {
        int fd = w->fd;
        w->fd = -1;
        if (close(fd) != 0) st = ferry_fail(FERRY_ERR_IO, "%s: close: %s", w->path, strerror(errno));
    }
    if (st == FERRY_OK && renameat(w->dirfd, w->tmp, w->dirfd, w->path) != 0)
        st = ferry_fail(FERRY_ERR_IO, "%s: rename: %s", w->path, strerror(errno));
    if (st == FERRY_OK && w->dirfd == AT_FDCWD) util_fsync_dir_of(w->path);
    if (st == FERRY_OK && w->dirfd != AT_FDCWD && util_fsync(w->dirfd) != 0)
        st = ferry_fail(FERRY_ERR_IO, "%s: fsync of its directory: %s", w->path, strerror(errno));
    if (st != FERRY_OK) {
        st_writer_abort(w);
        return st;
    }
    free(w->path);
    free(w->tmp);
    free(w);
    return FERRY_OK;
}

void st_writer_abort(st_writer *w)
{
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    if (w->tmp) unlinkat(w->dirfd, w->tmp, 0);
    free(w->path);
    free(w->tmp);
    free(w);
}
