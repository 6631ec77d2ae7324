/*
 * safetensors.h - reading Hugging Face safetensors checkpoints.
 *
 * A file is an 8-byte little-endian header length N, N bytes of UTF-8 JSON
 * ({name: {dtype, shape, data_offsets}, "__metadata__": {...}}), then the
 * tensor data. st_parse validates a header the way the reference
 * implementation does (header <= 100 MB and inside the file, dtype x shape ==
 * byte length with checked arithmetic, offsets contiguous from 0 and ending
 * exactly at the end of the file) and also rejects duplicate names.
 *
 * A checkpoint is a directory holding model.safetensors, or shards listed by
 * model.safetensors.index.json whose weight_map entries must be bare file
 * names; every file is opened under model_dir.h's rule (inside the
 * directory, or a Hugging Face cache snapshot's repository folder). Files
 * are mapped read-only; the data is never copied here.
 */
#ifndef FERRY_SAFETENSORS_H
#define FERRY_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "../base/status.h"

#define ST_MAX_HEADER 100000000ull
#define ST_MAX_DIMS 8

typedef struct {
    const char *name;
    ferry_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t offset; /* of the data from the start of the file */
    uint64_t nbytes;
    int file;        /* index into the checkpoint's files */
    bool blocks;     /* a GGUF's blocks of type block_type (dtype U8; shape the values') */
    uint32_t block_type;
    const void *data; /* inside the file's mapping (NULL from st_parse) */
} st_tensor;

typedef struct st_header st_header;

/* Validates the header of a file of file_size bytes whose first bytes are
 * buf[0..buf_len) (buf_len >= the header's end, or the whole file). `label`
 * names the file in errors. */
ferry_status st_parse(const uint8_t *buf, size_t buf_len, uint64_t file_size, const char *label,
                      st_header **out);
size_t st_header_count(const st_header *h);
const st_tensor *st_header_tensor(const st_header *h, size_t i); /* sorted by name */
void st_header_free(st_header *h);

typedef struct {
    char *path;     /* as opened */
    char *name;     /* base name, for messages */
    int fd;
    const uint8_t *map;
    uint64_t size;
    st_header *header;
} st_file;

typedef struct {
    char *dir;          /* the directory; for a GGUF model, the .gguf file */
    int n_files;
    st_file *files;     /* GGUF: the file, then its converted tensors (no headers) */
    size_t n_tensors;
    st_tensor *tensors; /* all files' tensors, sorted by name */
    /* a GGUF model (gguf_hf.h) */
    bool gguf_model;
    struct gguf_file *gguf;        /* its first part: the metadata */
    struct gguf_file **gguf_parts; /* every part of a model split by gguf-split (files[0..n) too) */
    int n_gguf_parts;
    char **gguf_names;  /* the tensors' HF names */
    size_t n_gguf_names;
} st_checkpoint;

/* Opens the safetensors checkpoint in dir, or the GGUF model dir names
 * (gguf_hf.h). */
ferry_status st_checkpoint_open(const char *dir, st_checkpoint **out);
const st_tensor *st_checkpoint_find(const st_checkpoint *ck, const char *name);
void st_checkpoint_close(st_checkpoint *ck);

/* Tells the kernel this process no longer needs the mapped pages under
 * [data, data + n) (they stay in the page cache; touching them again reads
 * them back). Keeps a checkpoint that was copied elsewhere out of RSS. */
void st_release_pages(const void *data, size_t n);

/* Element count of a tensor (shapes were validated not to overflow). */
uint64_t st_tensor_numel(const st_tensor *t);

#endif
