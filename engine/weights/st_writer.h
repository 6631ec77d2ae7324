/*
 * st_writer.h - writing one safetensors file, tensor by tensor.
 *
 * The caller declares every tensor (name, dtype, shape) up front, then
 * streams their data in the declared order with any chunking; nothing is
 * held in memory beyond the header. The file is written under a temporary
 * name and renamed into place by st_writer_finish only when every byte was
 * written and synced, so a failed or interrupted write never leaves a
 * half-written checkpoint behind. Used by mkmodel and export.
 */
#ifndef FERRY_ST_WRITER_H
#define FERRY_ST_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "../base/status.h"

typedef struct {
    const char *name;
    ferry_dtype dtype;
    int ndim;
    int64_t shape[8];
} st_decl;

typedef struct st_writer st_writer;

/* Creates path's temporary file and writes the header (8-byte aligned, as
 * the reference writer does). */
ferry_status st_writer_open(const char *path, const st_decl *decls, int n, st_writer **out);
/* The same for `name` in the directory dirfd (AT_FDCWD: like open), never
 * following a symlink there (export writes under a confined root). */
ferry_status st_writer_openat(int dirfd, const char *name, const st_decl *decls, int n, st_writer **out);
/* Appends bytes of the current tensor(s), in declaration order. */
ferry_status st_writer_write(st_writer *w, const void *data, size_t n);
/* Checks all data arrived, syncs and renames into place; frees w. */
ferry_status st_writer_finish(st_writer *w);
/* Deletes the temporary file; frees w. Safe on NULL. */
void st_writer_abort(st_writer *w);

#endif
