/*
 * fuzz_st_index.c - libFuzzer target for a sharded checkpoint's
 * model.safetensors.index.json (st_checkpoint_open in
 * engine/weights/safetensors.h, which reads the index, opens every shard
 * its weight_map names under model_dir.h's rule and checks the map against
 * the shards' headers).
 *
 * The input is the index's text, written into a model directory that
 * LLVMFuzzerInitialize made once under $TMPDIR, else /dev/shm, else /tmp
 * (removed at exit), beside:
 *   model-00001-of-00002.safetensors   model.embed_tokens.weight, model.norm.weight
 *   model-00002-of-00002.safetensors   lm_head.weight
 *   escape.safetensors                 a link to a valid shard outside the directory
 *   dangling.safetensors               a link to nothing
 *   sub/                               a folder holding a valid shard
 *   short.safetensors                  4 bytes: no header
 * A refused index must leave no checkpoint and say why. An accepted one
 * must hold only the two real shards, each once; its tensors must be the
 * shards' own (each one's data inside its file's mapping, names distinct),
 * and every weight_map entry must name a tensor that is in the file it
 * names. A broken promise aborts, which libFuzzer reports as a crash.
 * Build: README.md.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../engine/base/json.h"
#include "../../engine/weights/safetensors.h"

static char g_root[64];  /* the temporary tree */
static char g_model[96]; /* the model directory in it */
static char g_index[160];

static const char *const k_shards[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};

/* A safetensors file: the header's length, the header, data_bytes zeros. */
static void put_shard(const char *dir, const char *name, const char *header, size_t data_bytes)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    uint64_t n = strlen(header);
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)(n >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(header, 1, n, f);
    for (size_t i = 0; i < data_bytes; i++) fputc(0, f);
    if (fclose(f) != 0) abort();
}

static void path_in(char *out, size_t cap, const char *dir, const char *name) { snprintf(out, cap, "%s/%s", dir, name); }

static void cleanup(void)
{
    static const char *const model_files[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                              "escape.safetensors", "dangling.safetensors", "short.safetensors",
                                              "model.safetensors.index.json", "sub/inner.safetensors"};
    char p[256];
    for (size_t i = 0; i < sizeof model_files / sizeof *model_files; i++) {
        path_in(p, sizeof p, g_model, model_files[i]);
        unlink(p);
    }
    path_in(p, sizeof p, g_model, "sub");
    rmdir(p);
    rmdir(g_model);
    path_in(p, sizeof p, g_root, "outside.safetensors");
    unlink(p);
    rmdir(g_root);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    /* a file is written per input: in memory where there is a tmpfs */
    struct stat sb;
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp || strlen(tmp) >= 32) tmp = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm" : "/tmp";
    snprintf(g_root, sizeof g_root, "%s/fuzz-st-index-XXXXXX", tmp);
    if (!mkdtemp(g_root)) abort();
    path_in(g_model, sizeof g_model, g_root, "model");
    path_in(g_index, sizeof g_index, g_model, "model.safetensors.index.json");
    char sub[128], p[256];
    path_in(sub, sizeof sub, g_model, "sub");
    if (mkdir(g_model, 0700) || mkdir(sub, 0700)) abort();
    atexit(cleanup);
    put_shard(g_model, k_shards[0],
              "{\"model.embed_tokens.weight\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
              "\"model.norm.weight\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}", 12);
    put_shard(g_model, k_shards[1],
              "{\"lm_head.weight\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
              "\"__metadata__\": {\"format\": \"pt\"}}", 4);
    put_shard(g_root, "outside.safetensors",
              "{\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4);
    put_shard(sub, "inner.safetensors", "{\"y\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4);
    path_in(p, sizeof p, g_model, "escape.safetensors");
    if (symlink("../outside.safetensors", p)) abort();
    path_in(p, sizeof p, g_model, "dangling.safetensors");
    if (symlink("nothing.safetensors", p)) abort();
    path_in(p, sizeof p, g_model, "short.safetensors");
    FILE *f = fopen(p, "wb");
    if (!f || fwrite("abcd", 1, 4, f) != 4 || fclose(f)) abort();
    return 0;
}

/* The index's weight_map, as the target reads it: each entry's tensor
 * must be in the file it names. */
static void check_map(const st_checkpoint *ck, const uint8_t *data, size_t size)
{
    json_doc *doc;
    if (json_parse((const char *)data, size, &doc) != FERRY_OK) abort(); /* accepted, so JSON */
    const json_value *wm = json_get(json_doc_root(doc), "weight_map");
    if (!wm || wm->type != JSON_OBJECT) abort();
    for (size_t i = 0; i < wm->len; i++) {
        const json_value *file = &wm->members[i].value;
        const st_tensor *t = st_checkpoint_find(ck, wm->members[i].key);
        if (file->type != JSON_STRING || !t || t->file < 0 || t->file >= ck->n_files) abort();
        if (strcmp(ck->files[t->file].name, file->str) != 0) abort();
    }
    json_doc_free(doc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FILE *f = fopen(g_index, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f)) abort();
    st_checkpoint *ck = (st_checkpoint *)1;
    ferry_status st = st_checkpoint_open(g_model, &ck);
    if (st != FERRY_OK) {
        if (ck || !ferry_errmsg()[0]) abort();
        return 0;
    }
    if (ck->n_files < 0 || ck->n_files > 2) abort();
    size_t total = 0;
    for (int i = 0; i < ck->n_files; i++) {
        const st_file *sf = &ck->files[i];
        int k = !strcmp(sf->name, k_shards[0]) ? 0 : !strcmp(sf->name, k_shards[1]) ? 1 : -1;
        if (k < 0) {
            fprintf(stderr, "fuzz_st_index: opened %s (%s)\n", sf->name, sf->path);
            abort();
        }
        for (int j = 0; j < i; j++)
            if (!strcmp(ck->files[j].name, sf->name)) abort();
        total += st_header_count(sf->header);
    }
    if (ck->n_tensors != total) abort();
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const st_tensor *t = &ck->tensors[i];
        if (i && strcmp(ck->tensors[i - 1].name, t->name) >= 0) abort();
        if (t->file < 0 || t->file >= ck->n_files) abort();
        const st_file *sf = &ck->files[t->file];
        const uint8_t *p = t->data;
        if (p < sf->map || t->offset > sf->size || t->nbytes > sf->size - t->offset || p != sf->map + t->offset)
            abort();
    }
    check_map(ck, data, size);
    st_checkpoint_close(ck);
    return 0;
}
