/*
 * test_safetensors.c - the safetensors header validator, the writer and
 * checkpoint opening (engine/safetensors.h, engine/st_writer.h).
 *
 * st_parse is fed headers built in memory: one valid layout, then one case
 * per rule of the format (header size and bounds, dtype, shape, offsets that
 * must tile the data section exactly, duplicate names), each checked for its
 * status and for a message naming the file and the tensor. Then files on
 * disk, in a fresh temporary directory per case: a st_writer round trip read
 * back through st_checkpoint_open, st_writer_abort leaving nothing behind,
 * and sharded checkpoints whose index must name bare files inside the
 * directory, each tensor in the shard the index says.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../engine/weights/dtype.h"
#include "../../engine/base/json.h"
#include "../../engine/weights/safetensors.h"
#include "../../engine/weights/st_writer.h"
#include "../../engine/base/util.h"
#include "check.h"

#define LABEL "t.safetensors"

/* ---- in-memory headers -------------------------------------------------- */

/* 8-byte little-endian length + header + data_len zero bytes (malloc'd). */
static uint8_t *make_file(const char *header, size_t data_len, size_t *len)
{
    size_t n = strlen(header);
    *len = 8 + n + data_len;
    uint8_t *buf = calloc(1, *len);
    if (!buf) abort();
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, header, n);
    return buf;
}

/* st_parse on make_file(header, data_len); keeps the header for inspection
 * (freed by the next call) and returns the status. */
static st_header *g_h;

static ferry_status parse(const char *header, size_t data_len)
{
    st_header_free(g_h);
    g_h = NULL;
    size_t len;
    uint8_t *buf = make_file(header, data_len, &len);
    ferry_status st = st_parse(buf, len, len, LABEL, &g_h);
    free(buf);
    if (st != FERRY_OK && g_h) {
        fprintf(stderr, "st_parse failed but returned a header\n");
        check_failures++;
    }
    return st;
}

/* Every rejection names the file and, when given, the tensor and a phrase
 * saying what is wrong. */
static void check_reject(const char *header, size_t data_len, ferry_status want, const char *tensor,
                         const char *phrase, int line)
{
    ferry_status st = parse(header, data_len);
    const char *msg = ferry_errmsg();
    const char *missing = !strstr(msg, LABEL) ? LABEL
                        : tensor && !strstr(msg, tensor) ? tensor
                        : phrase && !strstr(msg, phrase) ? phrase
                        : NULL;
    check_count++;
    if (st != want || missing) {
        fprintf(stderr, "%s:%d: header %s + %zu data bytes: expected '%s' with a message containing \"%s\", "
                        "got '%s': \"%s\"\n",
                __FILE__, line, header, data_len, ferry_status_name(want), missing ? missing : "", ferry_status_name(st),
                msg);
        check_failures++;
    }
}

#define CHECK_REJECT(header, data_len, status, tensor, phrase) \
    check_reject(header, data_len, status, tensor, phrase, __LINE__)
#define NONE NULL

static void test_parse_valid(void)
{
    /* out of name order in the file, and out of offset order relative to it */
    const char *h = "{\"b.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                    "\"a.weight\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]}}";
    const uint64_t base = 8 + strlen(h);
    CHECK_STATUS(parse(h, 32), FERRY_OK);
    if (!g_h) return;
    CHECK_EQ_INT(st_header_count(g_h), 2);
    const st_tensor *a = st_header_tensor(g_h, 0), *b = st_header_tensor(g_h, 1);
    CHECK_EQ_STR(a->name, "a.weight");
    CHECK_EQ_STR(b->name, "b.weight");
    CHECK_EQ_INT(a->dtype, DT_BF16);
    CHECK_EQ_INT(a->ndim, 1);
    CHECK_EQ_INT(a->shape[0], 4);
    CHECK_EQ_U64(a->offset, base + 24);
    CHECK_EQ_U64(a->nbytes, 8);
    CHECK_EQ_U64(st_tensor_numel(a), 4);
    CHECK_EQ_INT(b->dtype, DT_F32);
    CHECK_EQ_INT(b->ndim, 2);
    CHECK_EQ_INT(b->shape[0], 2);
    CHECK_EQ_INT(b->shape[1], 3);
    CHECK_EQ_U64(b->offset, base);
    CHECK_EQ_U64(b->nbytes, 24);
    CHECK_EQ_U64(st_tensor_numel(b), 6);
    CHECK(a->data == NULL && b->data == NULL);

    /* zero-size tensors may share an offset with the next one; a scalar has
     * shape [] and one element */
    CHECK_STATUS(parse("{\"z\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[0,0]},"
                       "\"s\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
                       "\"e\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,8]}}",
                       8),
                 FERRY_OK);
    if (g_h) {
        CHECK_EQ_INT(st_header_count(g_h), 3);
        const st_tensor *z = st_header_tensor(g_h, 2);
        CHECK_EQ_STR(z->name, "z");
        CHECK_EQ_U64(z->nbytes, 0);
        CHECK_EQ_U64(st_tensor_numel(z), 0);
        const st_tensor *s = st_header_tensor(g_h, 1);
        CHECK_EQ_INT(s->ndim, 0);
        CHECK_EQ_U64(s->nbytes, 8);
        CHECK_EQ_U64(st_tensor_numel(s), 1);
    }

    /* no tensors at all, and a header padded with spaces as writers do */
    CHECK_STATUS(parse("{}", 0), FERRY_OK);
    CHECK_STATUS(parse("{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}     ", 1), FERRY_OK);

    /* __metadata__ is not a tensor */
    CHECK_STATUS(parse("{\"__metadata__\":{\"format\":\"pt\",\"note\":\"\"},"
                       "\"w\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]}}",
                       6),
                 FERRY_OK);
    if (g_h) {
        CHECK_EQ_INT(st_header_count(g_h), 1);
        CHECK_EQ_STR(st_header_tensor(g_h, 0)->name, "w");
    }

    /* every dtype of the format is known; 8 dimensions are allowed */
    CHECK_STATUS(parse("{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]},"
                       "\"b\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[8,9]},"
                       "\"c\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[9,10]},"
                       "\"d\":{\"dtype\":\"F8_E5M2\",\"shape\":[1,1,1,1,1,1,1,2],\"data_offsets\":[10,12]}}",
                       12),
                 FERRY_OK);
    if (g_h) CHECK_EQ_INT(st_header_tensor(g_h, 3)->ndim, 8);
}

static void test_parse_bounds(void)
{
    /* fewer than 8 bytes */
    st_header *h = NULL;
    uint8_t small[5] = {2, 0, 0, 0, 0};
    CHECK_STATUS(st_parse(small, sizeof small, sizeof small, LABEL, &h), FERRY_ERR_INVALID);
    CHECK_MSG_HAS(LABEL);
    CHECK(h == NULL);
    CHECK_STATUS(st_parse(small, 0, 0, LABEL, &h), FERRY_ERR_INVALID);

    /* header length over 100 MB, even when the file is big enough */
    uint8_t big[16] = {0};
    uint64_t n = ST_MAX_HEADER + 1;
    for (int i = 0; i < 8; i++) big[i] = (uint8_t)(n >> (8 * i));
    CHECK_STATUS(st_parse(big, sizeof big, 2 * ST_MAX_HEADER, LABEL, &h), FERRY_ERR_INVALID);
    CHECK_MSG_HAS(LABEL);
    CHECK_MSG_HAS("100 MB");
    memset(big, 0xff, 8); /* 2^64 - 1: must not wrap around any sum */
    CHECK_STATUS(st_parse(big, sizeof big, sizeof big, LABEL, &h), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("100 MB");

    /* header length past the end of the file */
    size_t len;
    uint8_t *buf = make_file("{}", 0, &len);
    buf[0] = 3;
    CHECK_STATUS(st_parse(buf, len, len, LABEL, &h), FERRY_ERR_INVALID);
    CHECK_MSG_HAS(LABEL);
    CHECK_MSG_HAS("past the end");
    buf[0] = 200;
    CHECK_STATUS(st_parse(buf, len, len, LABEL, &h), FERRY_ERR_INVALID);
    /* caller handed fewer bytes than the header needs: a bug, not bad input */
    buf[0] = 2;
    CHECK_STATUS(st_parse(buf, 9, len, LABEL, &h), FERRY_ERR_INTERNAL);
    free(buf);

    /* header that is not a JSON object */
    CHECK_REJECT("", 0, FERRY_ERR_INVALID, NONE, "'{'");
    CHECK_REJECT(" {}", 0, FERRY_ERR_INVALID, NONE, "'{'");
    CHECK_REJECT("[]", 0, FERRY_ERR_INVALID, NONE, "'{'");
    CHECK_REJECT("\"{\"", 0, FERRY_ERR_INVALID, NONE, "'{'");
    CHECK_REJECT("{\"a\":}", 0, FERRY_ERR_INVALID, NONE, "invalid JSON");
    CHECK_REJECT("{\"a\":1} x", 0, FERRY_ERR_INVALID, NONE, "invalid JSON");
    CHECK_REJECT("{\"a\xff\":1}", 0, FERRY_ERR_INVALID, NONE, "UTF-8");
}

static void test_parse_entries(void)
{
#define T(name, body) "\"" name "\":{" body "}"
    CHECK_REJECT("{" T("w", "\"dtype\":\"F128\",\"shape\":[1],\"data_offsets\":[0,16]") "}", 16, FERRY_ERR_INVALID,
                 "'w'", "F128");
    CHECK_REJECT("{" T("w", "\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]") "}", 4, FERRY_ERR_INVALID,
                 "'w'", "dtype");
    CHECK_REJECT("{" T("w", "\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]") "}", 4, FERRY_ERR_INVALID, "'w'",
                 "dtype");
    CHECK_REJECT("{" T("w", "\"shape\":[1],\"data_offsets\":[0,4]") "}", 4, FERRY_ERR_INVALID, "'w'", "dtype");
    CHECK_REJECT("{\"w\":[1,2]}", 0, FERRY_ERR_INVALID, "'w'", "not an object");

    /* shape */
    CHECK_REJECT("{" T("w", "\"dtype\":\"F32\",\"data_offsets\":[0,4]") "}", 4, FERRY_ERR_INVALID, "'w'", "shape");
    CHECK_REJECT("{" T("w", "\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]") "}", 16, FERRY_ERR_INVALID,
                 "'w'", "shape");
    CHECK_REJECT("{" T("w", "\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]") "}", 8, FERRY_ERR_INVALID,
                 "'w'", "shape[0]");
    CHECK_REJECT("{" T("w", "\"dtype\":\"F32\",\"shape\":[2,\"2\"],\"data_offsets\":[0,16]") "}", 16,
                 FERRY_ERR_INVALID, "'w'", "shape[1]");
    CHECK_REJECT("{" T("w", "\"dtype\":\"F32\",\"shape\":[1e1],\"data_offsets\":[0,40]") "}", 40, FERRY_ERR_INVALID,
                 "'w'", "shape[0]");
    CHECK_REJECT("{" T("w", "\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]") "}", 0, FERRY_ERR_INVALID,
                 "'w'", "shape[0]");
    CHECK_REJECT("{" T("w", "\"dtype\":\"F32\",\"shape\":[4,-2],\"data_offsets\":[0,0]") "}", 0, FERRY_ERR_INVALID,
                 "'w'", "shape[1]");
    CHECK_REJECT("{" T("w", "\"dtype\":\"U8\",\"shape\":[18446744073709551616],\"data_offsets\":[0,0]") "}", 0,
                 FERRY_ERR_INVALID, "'w'", "shape[0]");
    /* numel overflows uint64 */
    CHECK_REJECT("{" T("w", "\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]") "}", 0,
                 FERRY_ERR_INVALID, "'w'", "overflow");
    CHECK_REJECT("{" T("w", "\"dtype\":\"U8\",\"shape\":[9223372036854775807,3],\"data_offsets\":[0,0]") "}", 0,
                 FERRY_ERR_INVALID, "'w'", "overflow");
    /* numel fits but numel x 4 bytes does not */
    CHECK_REJECT("{" T("w", "\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]") "}", 0,
                 FERRY_ERR_INVALID, "'w'", "overflow");
    /* a zero dimension makes the product 0 even next to a huge one */
    CHECK_STATUS(parse("{" T("w", "\"dtype\":\"F32\",\"shape\":[9223372036854775807,0],\"data_offsets\":[0,0]") "}",
                       0),
                 FERRY_OK);
    CHECK_REJECT("{" T("w", "\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]") "}", 1,
                 FERRY_ERR_UNSUPPORTED, "'w'", "dimensions");

    /* data_offsets */
    CHECK_REJECT("{" T("w", "\"dtype\":\"U8\",\"shape\":[1]") "}", 1, FERRY_ERR_INVALID, "'w'", "data_offsets");
    CHECK_REJECT("{" T("w", "\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1]") "}", 1, FERRY_ERR_INVALID, "'w'",
                 "data_offsets");
    CHECK_REJECT("{" T("w", "\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]") "}", 2, FERRY_ERR_INVALID,
                 "'w'", "data_offsets");
    CHECK_REJECT("{" T("w", "\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":{\"0\":1}") "}", 1, FERRY_ERR_INVALID,
                 "'w'", "data_offsets");
    CHECK_REJECT("{" T("w", "\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,\"1\"]") "}", 1, FERRY_ERR_INVALID,
                 "'w'", "data_offsets");
    CHECK_REJECT("{" T("w", "\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]") "}", 1, FERRY_ERR_INVALID,
                 "'w'", "data_offsets");
    CHECK_REJECT("{" T("w", "\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0.0,1]") "}", 1, FERRY_ERR_INVALID,
                 "'w'", "data_offsets");
    CHECK_REJECT("{" T("w", "\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,4]") "}", 8, FERRY_ERR_INVALID,
                 "'w'", "before begin");
    /* dtype x shape disagrees with the span */
    CHECK_REJECT("{" T("w", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]") "}", 4, FERRY_ERR_INVALID,
                 "'w'", "8 bytes");
    CHECK_REJECT("{" T("w", "\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,16]") "}", 16, FERRY_ERR_INVALID,
                 "'w'", "BF16");

    /* layout of the data section: offsets must tile it exactly */
    CHECK_REJECT("{" T("a", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]") ","
                 T("b", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]") "}",
                 12, FERRY_ERR_INVALID, "'b'", "overlap");
    CHECK_REJECT("{" T("a", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]") ","
                 T("b", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]") "}",
                 8, FERRY_ERR_INVALID, NONE, "overlap");
    CHECK_REJECT("{" T("a", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]") ","
                 T("b", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]") "}",
                 20, FERRY_ERR_INVALID, "'b'", "gap");
    CHECK_REJECT("{" T("a", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]") "}", 12, FERRY_ERR_INVALID,
                 "'a'", "gap");
    CHECK_REJECT("{" T("a", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]") "}", 12, FERRY_ERR_INVALID,
                 NONE, "12 data bytes");
    CHECK_REJECT("{" T("a", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]") "}", 4, FERRY_ERR_INVALID,
                 NONE, "4 data bytes");
    CHECK_REJECT("{}", 1, FERRY_ERR_INVALID, NONE, "1 data bytes");
    CHECK_REJECT("{" T("a", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]") ","
                 T("a", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]") "}",
                 16, FERRY_ERR_INVALID, "'a'", "duplicate");

    /* __metadata__ must map strings to strings */
    CHECK_REJECT("{\"__metadata__\":{\"format\":\"pt\",\"n\":1}}", 0, FERRY_ERR_INVALID, "'n'", "__metadata__");
    CHECK_REJECT("{\"__metadata__\":{\"m\":null}}", 0, FERRY_ERR_INVALID, "'m'", "__metadata__");
    CHECK_REJECT("{\"__metadata__\":[\"pt\"]}", 0, FERRY_ERR_INVALID, NONE, "__metadata__");
    CHECK_REJECT("{\"__metadata__\":\"pt\"}", 0, FERRY_ERR_INVALID, NONE, "__metadata__");
#undef T
}

/* ---- files on disk ------------------------------------------------------ */

static char *make_dir(void)
{
    char tmpl[] = "/tmp/ferry-test-st-XXXXXX";
    if (!mkdtemp(tmpl)) {
        perror("mkdtemp");
        exit(2);
    }
    return strdup(tmpl);
}

/* Number of directory entries other than . and .. */
static int dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static void remove_dir(char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char *p = util_path_join(dir, e->d_name);
            unlink(p);
            free(p);
        }
        closedir(d);
    }
    rmdir(dir);
    free(dir);
}

static void write_bytes(const char *dir, const char *name, const char *data, size_t len)
{
    char *p = util_path_join(dir, name);
    ferry_status st = util_write_file_atomic(p, data, len);
    if (st != FERRY_OK) {
        fprintf(stderr, "writing %s: %s\n", p, ferry_errmsg());
        exit(2);
    }
    free(p);
}

static void write_text(const char *dir, const char *name, const char *text)
{
    write_bytes(dir, name, text, strlen(text));
}

#define WRITE_LIT(dir, name, lit) write_bytes(dir, name, lit, sizeof(lit) - 1)

/* Writes dir/name holding U8 tensors names[i] of shape [i + 1] whose bytes
 * are fill + i. */
static void write_shard(const char *dir, const char *name, const char *const *names, int n, uint8_t fill)
{
    st_decl decls[8];
    for (int i = 0; i < n; i++) decls[i] = (st_decl){names[i], DT_U8, 1, {i + 1}};
    char *p = util_path_join(dir, name);
    st_writer *w;
    ferry_status st = st_writer_open(p, decls, n, &w);
    for (int i = 0; i < n && st == FERRY_OK; i++) {
        uint8_t bytes[8];
        memset(bytes, fill + i, sizeof bytes);
        st = st_writer_write(w, bytes, (size_t)i + 1);
    }
    if (st == FERRY_OK) st = st_writer_finish(w);
    if (st != FERRY_OK) {
        fprintf(stderr, "writing %s: %s\n", p, ferry_errmsg());
        exit(2);
    }
    free(p);
}

static void test_writer_roundtrip(void)
{
    char *dir = make_dir();
    char *path = util_path_join(dir, "model.safetensors");
    float f32[6] = {1.5f, -2.0f, 0.0f, 3.25f, 1e-8f, -1e8f};                    /* [2, 3] */
    uint16_t f16[4] = {f32_to_f16(0.5f), f32_to_f16(-1.0f), f32_to_f16(65504.0f), f32_to_f16(0.0f)}; /* [4] */
    uint16_t bf16[4] = {f32_to_bf16(1.0f), f32_to_bf16(-3.0f), f32_to_bf16(1e30f), f32_to_bf16(0.125f)}; /* [2, 2] */
    /* declared out of name order: the file keeps this order, the reader sorts */
    st_decl decls[3] = {
        {"w.f32", DT_F32, 2, {2, 3}},
        {"w.bf16", DT_BF16, 2, {2, 2}},
        {"w.f16", DT_F16, 1, {4}},
    };
    st_writer *w = NULL;
    CHECK_STATUS(st_writer_open(path, decls, 3, &w), FERRY_OK);
    if (!w) goto out;
    /* stream in odd chunks that straddle tensors */
    uint8_t all[24 + 8 + 8];
    memcpy(all, f32, 24);
    memcpy(all + 24, bf16, 8);
    memcpy(all + 32, f16, 8);
    CHECK_STATUS(st_writer_write(w, all, 5), FERRY_OK);
    CHECK_STATUS(st_writer_write(w, all + 5, 22), FERRY_OK);
    for (size_t i = 27; i < sizeof all; i++) CHECK_STATUS(st_writer_write(w, all + i, 1), FERRY_OK);
    CHECK_STATUS(st_writer_write(w, all, 1), FERRY_ERR_INTERNAL); /* one byte too many */
    CHECK_STATUS(st_writer_finish(w), FERRY_OK);
    CHECK_EQ_INT(dir_entries(dir), 1); /* no temporary left */

    st_checkpoint *ck = NULL;
    CHECK_STATUS(st_checkpoint_open(dir, &ck), FERRY_OK);
    if (!ck) goto out;
    CHECK_EQ_INT(ck->n_files, 1);
    CHECK_EQ_INT(ck->n_tensors, 3);
    CHECK_EQ_STR(ck->files[0].name, "model.safetensors");
    const st_tensor *t32 = st_checkpoint_find(ck, "w.f32");
    const st_tensor *t16 = st_checkpoint_find(ck, "w.f16");
    const st_tensor *tb = st_checkpoint_find(ck, "w.bf16");
    CHECK(st_checkpoint_find(ck, "w") == NULL);
    CHECK(st_checkpoint_find(ck, "w.f32x") == NULL);
    CHECK(t32 && t16 && tb);
    if (t32 && t16 && tb) {
        CHECK_EQ_INT(t32->dtype, DT_F32);
        CHECK_EQ_INT(t32->ndim, 2);
        CHECK_EQ_INT(t32->shape[1], 3);
        CHECK_EQ_U64(t32->nbytes, 24);
        CHECK_EQ_U64(t32->offset % 8, 0); /* the writer aligns the data section */
        CHECK_EQ_INT(t32->file, 0);
        CHECK(t32->data == ck->files[0].map + t32->offset);
        CHECK(memcmp(t32->data, f32, sizeof f32) == 0);
        CHECK_EQ_INT(tb->dtype, DT_BF16);
        CHECK_EQ_U64(tb->offset, t32->offset + 24);
        CHECK(memcmp(tb->data, bf16, sizeof bf16) == 0);
        CHECK_EQ_INT(t16->dtype, DT_F16);
        CHECK_EQ_INT(t16->shape[0], 4);
        CHECK(memcmp(t16->data, f16, sizeof f16) == 0);
        const uint16_t *h = t16->data, *b = tb->data;
        CHECK(f16_to_f32(h[2]) == 65504.0f);
        CHECK(bf16_to_f32(b[1]) == -3.0f);
        CHECK_EQ_U64(ck->files[0].size, t16->offset + t16->nbytes);
        /* released pages read back from the file unchanged */
        st_release_pages(t32->data, t32->nbytes);
        CHECK(memcmp(t32->data, f32, sizeof f32) == 0);
        CHECK(memcmp(t16->data, f16, sizeof f16) == 0);
    }
    st_checkpoint_close(ck);

out:
    free(path);
    remove_dir(dir);
}

static void test_writer_abort(void)
{
    char *dir = make_dir();
    char *path = util_path_join(dir, "model.safetensors");
    st_decl d = {"x", DT_F32, 1, {16}};
    float zeros[16] = {0};

    /* aborted part-way through */
    st_writer *w = NULL;
    CHECK_STATUS(st_writer_open(path, &d, 1, &w), FERRY_OK);
    CHECK_EQ_INT(dir_entries(dir), 1); /* the temporary */
    if (w) CHECK_STATUS(st_writer_write(w, zeros, 32), FERRY_OK);
    st_writer_abort(w);
    CHECK_EQ_INT(dir_entries(dir), 0);
    st_writer_abort(NULL);

    /* finish with data missing fails and cleans up as well */
    CHECK_STATUS(st_writer_open(path, &d, 1, &w), FERRY_OK);
    if (w) CHECK_STATUS(st_writer_write(w, zeros, 60), FERRY_OK);
    if (w) CHECK_STATUS(st_writer_finish(w), FERRY_ERR_INTERNAL);
    CHECK_MSG_HAS("60 of 64");
    CHECK_EQ_INT(dir_entries(dir), 0);

    /* a directory without a checkpoint */
    st_checkpoint *ck = (st_checkpoint *)1;
    CHECK_STATUS(st_checkpoint_open(dir, &ck), FERRY_ERR_NOT_FOUND);
    CHECK(ck == NULL);
    CHECK_MSG_HAS(dir);
    CHECK_STATUS(st_checkpoint_open("/nonexistent-ferry-dir", &ck), FERRY_ERR_NOT_FOUND);

    /* a broken model.safetensors is reported under its path */
    WRITE_LIT(dir, "model.safetensors", "\x02\0\0\0\0\0\0\0[]");
    CHECK_STATUS(st_checkpoint_open(dir, &ck), FERRY_ERR_INVALID);
    CHECK_MSG_HAS(path);
    write_text(dir, "model.safetensors", "1234");
    CHECK_STATUS(st_checkpoint_open(dir, &ck), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("too small");
    free(path);
    remove_dir(dir);
}

/* ---- sharded checkpoints ------------------------------------------------ */

#define SHARD1 "model-00001-of-00002.safetensors"
#define SHARD2 "model-00002-of-00002.safetensors"
#define INDEX "model.safetensors.index.json"

static void write_index(const char *dir, const char *a, const char *b, const char *c)
{
    char text[1024];
    snprintf(text, sizeof text,
             "{\"metadata\": {\"total_size\": 6},\n"
             " \"weight_map\": {\"a\": \"%s\", \"b\": \"%s\", \"c\": \"%s\"}}\n",
             a, b, c);
    write_text(dir, INDEX, text);
}

/* Opens dir expecting `want`; the message must contain `phrase`. */
static void check_open(const char *dir, ferry_status want, const char *phrase, int line)
{
    st_checkpoint *ck = NULL;
    ferry_status st = st_checkpoint_open(dir, &ck);
    check_count++;
    if (st != want || (phrase && !strstr(ferry_errmsg(), phrase))) {
        fprintf(stderr, "%s:%d: st_checkpoint_open: expected '%s' with \"%s\", got '%s': %s\n", __FILE__, line,
                ferry_status_name(want), phrase ? phrase : "", ferry_status_name(st), ferry_errmsg());
        check_failures++;
    }
    st_checkpoint_close(ck);
}

static void test_sharded(void)
{
    char *dir = make_dir(), *outside = make_dir();
    static const char *const s1[] = {"a", "b"}, *const s2[] = {"c"}, *const s3[] = {"a"};
    write_shard(dir, SHARD1, s1, 2, 10);  /* a = [10], b = [11, 11] */
    write_shard(dir, SHARD2, s2, 1, 20);  /* c = [20] */
    write_index(dir, SHARD1, SHARD1, SHARD2);

    st_checkpoint *ck = NULL;
    CHECK_STATUS(st_checkpoint_open(dir, &ck), FERRY_OK);
    if (ck) {
        CHECK_EQ_INT(ck->n_files, 2);
        CHECK_EQ_INT(ck->n_tensors, 3);
        const st_tensor *a = st_checkpoint_find(ck, "a"), *b = st_checkpoint_find(ck, "b"),
                        *c = st_checkpoint_find(ck, "c");
        CHECK(a && b && c);
        if (a && b && c) {
            CHECK_EQ_STR(ck->files[a->file].name, SHARD1);
            CHECK_EQ_STR(ck->files[b->file].name, SHARD1);
            CHECK_EQ_STR(ck->files[c->file].name, SHARD2);
            CHECK_EQ_U64(b->nbytes, 2);
            CHECK_EQ_INT(((const uint8_t *)a->data)[0], 10);
            CHECK_EQ_INT(((const uint8_t *)b->data)[1], 11);
            CHECK_EQ_INT(((const uint8_t *)c->data)[0], 20);
        }
        st_checkpoint_close(ck);
    }

    /* weight_map files must be bare names */
    write_index(dir, "../" SHARD1, SHARD1, SHARD2);
    check_open(dir, FERRY_ERR_INVALID, "'../" SHARD1 "' is not a bare file name", __LINE__);
    char abs[PATH_MAX + 64];
    snprintf(abs, sizeof abs, "%s/%s", dir, SHARD1);
    write_index(dir, abs, SHARD1, SHARD2);
    check_open(dir, FERRY_ERR_INVALID, "is not a bare file name", __LINE__);
    write_index(dir, "a/b", SHARD1, SHARD2);
    check_open(dir, FERRY_ERR_INVALID, "'a/b' is not a bare file name", __LINE__);
    write_index(dir, "..", SHARD1, SHARD2);
    check_open(dir, FERRY_ERR_INVALID, "is not a bare file name", __LINE__);
    write_index(dir, "", SHARD1, SHARD2);
    check_open(dir, FERRY_ERR_INVALID, "is not a bare file name", __LINE__);

    /* a symlink whose target is outside the directory, even a valid shard */
    write_shard(outside, "evil.safetensors", s1, 2, 10);
    char target[PATH_MAX + 64], link_path[PATH_MAX + 64];
    snprintf(target, sizeof target, "%s/evil.safetensors", outside);
    snprintf(link_path, sizeof link_path, "%s/evil.safetensors", dir);
    if (symlink(target, link_path) != 0) perror("symlink");
    write_index(dir, "evil.safetensors", "evil.safetensors", SHARD2);
    check_open(dir, FERRY_ERR_INVALID, "outside the model directory", __LINE__);
    /* a symlink to a shard inside the directory is fine */
    snprintf(link_path, sizeof link_path, "%s/alias.safetensors", dir);
    if (symlink(SHARD1, link_path) != 0) perror("symlink");
    write_index(dir, "alias.safetensors", "alias.safetensors", SHARD2);
    check_open(dir, FERRY_OK, NULL, __LINE__);

    /* a missing shard */
    write_index(dir, SHARD1, SHARD1, "model-00003-of-00002.safetensors");
    check_open(dir, FERRY_ERR_NOT_FOUND, "model-00003-of-00002.safetensors", __LINE__);

    /* the index names the wrong shard: c is in shard 2, not 1 */
    write_index(dir, SHARD1, SHARD2, SHARD2);
    check_open(dir, FERRY_ERR_INVALID, "tensor 'b' is in " SHARD2, __LINE__);
    write_index(dir, SHARD1, SHARD1, SHARD1); /* shard 2 is never opened */
    check_open(dir, FERRY_ERR_INVALID, "tensor 'c'", __LINE__);

    /* the same tensor in two shards */
    write_shard(dir, "model-extra.safetensors", s3, 1, 30);
    char text[512];
    snprintf(text, sizeof text, "{\"weight_map\": {\"a\": \"%s\", \"b\": \"%s\", \"c\": \"%s\", \"x\": \"%s\"}}",
             SHARD1, SHARD1, SHARD2, "model-extra.safetensors");
    write_text(dir, INDEX, text);
    check_open(dir, FERRY_ERR_INVALID, "tensor 'a' appears in both", __LINE__);

    /* a broken index */
    write_text(dir, INDEX, "{\"weight_map\": ");
    check_open(dir, FERRY_ERR_INVALID, INDEX, __LINE__);
    write_text(dir, INDEX, "{\"metadata\": {}}");
    check_open(dir, FERRY_ERR_INVALID, "weight_map", __LINE__);
    write_text(dir, INDEX, "{\"weight_map\": {\"a\": 1}}");
    check_open(dir, FERRY_ERR_INVALID, "weight_map['a']", __LINE__);

    /* a broken shard is reported under its own path */
    write_index(dir, SHARD1, SHARD1, SHARD2);
    WRITE_LIT(dir, SHARD2, "\x02\0\0\0\0\0\0\0{}x");
    check_open(dir, FERRY_ERR_INVALID, SHARD2, __LINE__);

    remove_dir(dir);
    remove_dir(outside);
}

int main(void)
{
    test_parse_valid();
    test_parse_bounds();
    test_parse_entries();
    test_writer_roundtrip();
    test_writer_abort();
    test_sharded();
    st_header_free(g_h);
    return check_report();
}
