/*
 * test_tokenizer.c - the tokenizer (text/tokenizer.h) on small
 * handwritten tokenizer.json files written into a temporary directory.
 *
 * Covers: both merge forms and rank order (a reversed order gives other
 * ids), merges.txt's #version line and the space-holding merges skipped,
 * ignore_merges; byte fallback, unk and fuse_unk; added tokens' special,
 * lstrip, rstrip, single_word and normalized flags and parse_special; the
 * normalizers, the Split behaviours and Metaspace's prepend schemes; the
 * post-processor; decoding with the byte-level and SentencePiece decoder
 * chains, special tokens skipped, invalid bytes as U+FFFD, and the stream
 * (a split UTF-8 character held back, the leading-space rule, pushes + flush
 * equal to the whole decode); tokenizer_config.json; every unsupported part
 * and malformed file as an error naming the field; a 1 MB word; the memory
 * an encode holds, against what the front ends reserve for it (the demo
 * tokenizer and the fuzzer's small Llama 2 one, read from the repository:
 * run from its root, as `make unit` does); concurrent encodes. The ids
 * expected here were checked against HF tokenizers 0.23.
 */
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "../../engine/base/util.h"
#include "../../text/tokenizer.h"
#include "../../text/text.h"
#include "check.h"

/* ---- the memory an encode holds ----------------------------------------------------------- */

/* Bytes allocated and not yet freed while g_counting, and their peak: as
 * fuzz_tokenizer counts them, through the AddressSanitizer allocator's hooks
 * in an ASan build (`make asan`), else by wrapping glibc's allocator, a
 * realloc counted as the new block and the old one at once (as ASan's
 * moves it). Counted only while one thread encodes. */
static long long g_live, g_peak;
static bool g_counting;

static void counted(long long n)
{
    g_live += n;
    if (g_live > g_peak) g_peak = g_live;
}

#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif

#ifdef TEST_ASAN
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                              void (*free_hook)(const volatile void *));
size_t __sanitizer_get_allocated_size(const volatile void *p);

static void malloc_hook(const volatile void *p, size_t size)
{
    (void)p;
    if (g_counting) counted((long long)size);
}

static void free_hook(const volatile void *p)
{
    if (p && g_counting) g_live -= (long long)__sanitizer_get_allocated_size(p);
}

static void count_init(void)
{
    if (!__sanitizer_install_malloc_and_free_hooks(malloc_hook, free_hook)) abort();
}
#else
void *__libc_malloc(size_t n);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t n);
void __libc_free(void *p);

void *malloc(size_t n)
{
    void *p = __libc_malloc(n);
    if (p && g_counting) counted((long long)malloc_usable_size(p));
    return p;
}

void *calloc(size_t n, size_t size)
{
    void *p = __libc_calloc(n, size);
    if (p && g_counting) counted((long long)malloc_usable_size(p));
    return p;
}

void *realloc(void *p, size_t n)
{
    long long old = p && g_counting ? (long long)malloc_usable_size(p) : 0;
    void *q = __libc_realloc(p, n);
    if (q && g_counting) counted((long long)malloc_usable_size(q));
    if ((q || n == 0) && g_counting) g_live -= old; /* realloc(p, 0) frees p */
    return q;
}

void free(void *p)
{
    if (p && g_counting) g_live -= (long long)malloc_usable_size(p);
    __libc_free(p);
}

static void count_init(void) {}
#endif

static char g_dir[64];

static void write_file(const char *name, const char *text)
{
    char *path = util_path_join(g_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    fputs(text, f);
    fclose(f);
    free(path);
}

static void remove_file(const char *name)
{
    char *path = util_path_join(g_dir, name);
    unlink(path);
    free(path);
}

/* Writes tokenizer.json (and no tokenizer_config.json) and loads it. */
static ferry_status load_json(const char *json, tokenizer **t)
{
    remove_file("tokenizer_config.json");
    write_file("tokenizer.json", json);
    return tok_load(g_dir, t);
}

static tokenizer *must_load(const char *json, int line)
{
    tokenizer *t = NULL;
    ferry_status st = load_json(json, &t);
    if (st != FERRY_OK) {
        fprintf(stderr, "%s:%d: load failed: %s\n", __FILE__, line, ferry_errmsg());
        check_failures++;
    }
    return t;
}
#define LOAD(json) must_load(json, __LINE__)

/* Encodes text and compares with the expected ids (-1 terminated). */
static void expect_ids(const tokenizer *t, const char *text, bool add, bool parse, const int *want, int line)
{
    int32_t *ids = NULL;
    int n = 0;
    check_count++;
    ferry_status st = tok_encode(t, text, strlen(text), add, parse, &ids, &n);
    int nw = 0;
    while (want[nw] >= 0) nw++;
    bool same = st == FERRY_OK && n == nw;
    for (int i = 0; same && i < n; i++) same = ids[i] == want[i];
    if (!same) {
        fprintf(stderr, "%s:%d: encode(\"%s\"): expected", __FILE__, line, text);
        for (int i = 0; i < nw; i++) fprintf(stderr, " %d", want[i]);
        fprintf(stderr, ", got");
        if (st != FERRY_OK) fprintf(stderr, " error '%s'", ferry_errmsg());
        for (int i = 0; i < n; i++) fprintf(stderr, " %d", (int)ids[i]);
        fputc('\n', stderr);
        check_failures++;
    }
    free(ids);
}
#define IDS(...) ((const int[]){__VA_ARGS__, -1})
#define ENC(t, text, ...) expect_ids(t, text, false, true, IDS(__VA_ARGS__), __LINE__)
#define ENC_NONE(t, text) expect_ids(t, text, false, true, (const int[]){-1}, __LINE__)

/* Decodes ids and compares the text; also pushes them one at a time and
 * checks the stream gives the same text. */
static void expect_text(const tokenizer *t, const int32_t *ids, int n, bool skip, const char *want, int line)
{
    strbuf whole, pushed;
    sb_init(&whole);
    sb_init(&pushed);
    check_count++;
    ferry_status st = tok_decode(t, ids, n, skip, &whole);
    tok_stream *s = tok_stream_new(t, skip);
    for (int i = 0; i < n && st == FERRY_OK; i++) st = tok_stream_push(s, ids[i], &pushed);
    tok_stream_flush(s, &pushed);
    tok_stream_free(s);
    const char *w = whole.data ? whole.data : "", *p = pushed.data ? pushed.data : "";
    if (st != FERRY_OK || strcmp(w, want) != 0 || strcmp(p, want) != 0) {
        fprintf(stderr, "%s:%d: decode: expected \"%s\", got \"%s\", stream \"%s\"%s%s\n", __FILE__, line, want, w, p,
                st ? " error " : "", st ? ferry_errmsg() : "");
        check_failures++;
    }
    sb_free(&whole);
    sb_free(&pushed);
}
#define DEC(t, skip, want, ...)                                                      \
    do {                                                                             \
        const int32_t ids_[] = {__VA_ARGS__};                                        \
        expect_text(t, ids_, (int)(sizeof ids_ / sizeof ids_[0]), skip, want, __LINE__); \
    } while (0)

/* Expects loading to fail with status st and a message holding `needle`. */
static void expect_load_error(const char *json, ferry_status want, const char *needle, int line)
{
    tokenizer *t = NULL;
    ferry_status st = load_json(json, &t);
    check_count++;
    if (st != want || !strstr(ferry_errmsg(), needle)) {
        fprintf(stderr, "%s:%d: expected %s with \"%s\", got %s: \"%s\"\n", __FILE__, line, ferry_status_name(want),
                needle, ferry_status_name(st), ferry_errmsg());
        check_failures++;
    }
    if (st == FERRY_OK) tok_free(t);
    else if (t) {
        fprintf(stderr, "%s:%d: a failed load left a tokenizer\n", __FILE__, line);
        check_failures++;
    }
}
#define LOAD_ERR(json, st, needle) expect_load_error(json, st, needle, __LINE__)

/* ---- the model ------------------------------------------------------------------ */

#define ABC_VOCAB "\"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"ab\": 3, \"bc\": 4, \"abc\": 5, \" \": 6}"

static void test_merges(void)
{
    /* string and pair forms agree; rank order decides */
    tokenizer *t = LOAD("{\"model\": {\"type\": \"BPE\", " ABC_VOCAB ", \"merges\": [\"a b\", \"ab c\", \"b c\"]}}");
    ENC(t, "abc", 5);
    ENC(t, "bc", 4);
    ENC(t, "cab", 2, 3);
    ENC(t, "a bc", 0, 6, 4);
    tok_free(t);
    t = LOAD("{\"model\": {\"type\": \"BPE\", " ABC_VOCAB ", \"merges\": [[\"a\", \"b\"], [\"ab\", \"c\"], [\"b\", \"c\"]]}}");
    ENC(t, "abc", 5);
    tok_free(t);
    /* b c first: abc no longer reaches "abc" */
    t = LOAD("{\"model\": {\"type\": \"BPE\", " ABC_VOCAB ", \"merges\": [\"b c\", \"a b\", \"ab c\"]}}");
    ENC(t, "abc", 0, 4);
    tok_free(t);
    /* merges.txt's header line is not a merge; a line with two spaces is skipped */
    t = LOAD("{\"model\": {\"type\": \"BPE\", " ABC_VOCAB ", \"merges\": [\"#version: 0.2\", \"a  b\", \"a b\"]}}");
    ENC(t, "abc", 3, 2);
    tok_free(t);
    /* ignore_merges: a word in the vocabulary is taken whole */
    t = LOAD("{\"model\": {\"type\": \"BPE\", \"ignore_merges\": true, " ABC_VOCAB ", \"merges\": [\"b c\"]}}");
    ENC(t, "abc", 5);
    ENC(t, "abcc", 0, 4, 2);
    tok_free(t);
    t = LOAD("{\"model\": {\"type\": \"BPE\", \"ignore_merges\": false, " ABC_VOCAB ", \"merges\": [\"b c\"]}}");
    ENC(t, "abc", 0, 4);
    CHECK_EQ_INT(tok_vocab_size(t), 7);
    CHECK_EQ_INT(tok_token_id(t, "bc"), 4);
    CHECK_EQ_INT(tok_token_id(t, "zz"), -1);
    tok_free(t);
}

#define SPM_VOCAB                                                                                            \
    "\"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, \"<0xC3>\": 3, \"<0xA9>\": 4, \"<0xE4>\": 5, "    \
    "\"<0xB8>\": 6, \"<0xAD>\": 7, \"<0x0A>\": 8, \"\\u2581\": 9, \"h\": 10, \"i\": 11, \"\\u2581h\": 12, " \
    "\"hi\": 13, \"\\u2581hi\": 14, \"\\u2581\\u2581\": 15}, "                                             \
    "\"merges\": [\"\\u2581 h\", \"h i\", \"\\u2581h i\", \"\\u2581 \\u2581\"]"

#define SPM_REST                                                                                                \
    "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\\u2581\"}, " \
    "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]}, "                    \
    "\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": "      \
    "\"\\u2581\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": "           \
    "\"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]}, "                                             \
    "\"added_tokens\": [{\"id\": 1, \"content\": \"<s>\", \"special\": true, \"normalized\": false}, "         \
    "{\"id\": 2, \"content\": \"</s>\", \"special\": true, \"normalized\": false}], "                          \
    "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", " \
    "\"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"pair\": [], \"special_tokens\": "   \
    "{\"<s>\": {\"id\": \"<s>\", \"ids\": [1], \"tokens\": [\"<s>\"]}}}"

static void test_byte_fallback(void)
{
    tokenizer *t = LOAD("{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"unk_token\": \"<unk>\", "
                        "\"fuse_unk\": true, " SPM_VOCAB "}, " SPM_REST "}");
    ENC(t, "hi", 14);
    ENC(t, "hi hi", 14, 14);
    ENC(t, " hi", 9, 14);                      /* "▁▁hi": ▁h (rank 0) wins over ▁▁ (rank 3) */
    ENC(t, "h\xc3\xa9", 12, 3, 4);             /* é as its bytes */
    ENC(t, "hi\n", 14, 8);
    ENC(t, "h\xe4\xb8\xad\xe4\xb8\xad", 12, 5, 6, 7, 5, 6, 7);
    ENC(t, "hq", 12, 0);                       /* q: no byte token 0x71 -> unk */
    ENC(t, "hqqx", 12, 0);                     /* fused unk */
    expect_ids(t, "hi", true, true, IDS(1, 14), __LINE__);
    expect_ids(t, "<s>hi</s>", false, true, IDS(1, 14, 2), __LINE__);
    /* special text as plain text: < s > have no tokens, bytes fall back to unk */
    expect_ids(t, "<s>", false, false, IDS(9, 0), __LINE__);
    DEC(t, false, "hi hi", 14, 14);
    DEC(t, false, "h\xc3\xa9", 12, 3, 4);
    DEC(t, false, "\xe4\xb8\xad", 5, 6, 7);
    DEC(t, false, "\xef\xbf\xbd\xef\xbf\xbd", 5, 6);                 /* incomplete: one U+FFFD per byte */
    DEC(t, false, "\xef\xbf\xbd\xef\xbf\xbd" "hi", 5, 6, 13);
    DEC(t, false, "<s> hi</s>", 1, 14, 2);
    DEC(t, true, "hi", 1, 14, 2);
    DEC(t, false, " hi", 9, 14);                                   /* one leading space stripped */
    CHECK(tok_is_special(t, 1));
    CHECK(!tok_is_special(t, 14));
    CHECK_EQ_INT(tok_token_id(t, "<s>"), 1);

    /* the stream holds a byte run back until it is complete */
    tok_stream *s = tok_stream_new(t, false);
    strbuf out;
    sb_init(&out);
    CHECK_STATUS(tok_stream_push(s, 14, &out), FERRY_OK);
    CHECK_EQ_STR(out.data, "hi");
    CHECK_STATUS(tok_stream_push(s, 9, &out), FERRY_OK);
    CHECK_STATUS(tok_stream_push(s, 5, &out), FERRY_OK);
    CHECK_STATUS(tok_stream_push(s, 6, &out), FERRY_OK);
    CHECK_EQ_STR(out.data, "hi ");
    CHECK_STATUS(tok_stream_push(s, 7, &out), FERRY_OK);
    CHECK_EQ_STR(out.data, "hi ");
    CHECK_STATUS(tok_stream_push(s, 13, &out), FERRY_OK);
    CHECK_EQ_STR(out.data, "hi \xe4\xb8\xadhi");
    CHECK_STATUS(tok_stream_push(s, 99, &out), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("99");
    tok_stream_flush(s, &out);
    CHECK_EQ_STR(out.data, "hi \xe4\xb8\xadhi");
    tok_stream_free(s);
    sb_free(&out);

    /* an id outside the vocabulary */
    const int32_t bad[] = {14, 16};
    strbuf o;
    sb_init(&o);
    CHECK_STATUS(tok_decode(t, bad, 2, false, &o), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("16");
    CHECK(o.len == 0);
    sb_free(&o);
    tok_free(t);

    /* unfused unk, and no unk at all: the character is dropped */
    t = LOAD("{\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": false, " SPM_VOCAB "}}");
    ENC(t, "qq", 0, 0);
    tok_free(t);
    t = LOAD("{\"model\": {\"type\": \"BPE\", " SPM_VOCAB "}}");
    ENC(t, "qhq", 10);
    tok_free(t);
    /* an unk token missing from the vocabulary fails when it is needed */
    t = LOAD("{\"model\": {\"type\": \"BPE\", \"unk_token\": \"<nope>\", " SPM_VOCAB "}}");
    int32_t *ids;
    int n;
    CHECK_STATUS(tok_encode(t, "q", 1, false, true, &ids, &n), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("<nope>");
    tok_free(t);
}

/* ---- byte-level ----------------------------------------------------------------------- */

/* Byte-level vocabulary: 'h' 'i' 'Ġ' (space) and the UTF-8 bytes of 中
 * (E4 B8 AD as the characters ä ¸ Ń), plus merges. */
#define BL_VOCAB                                                                                              \
    "\"vocab\": {\"h\": 0, \"i\": 1, \"\\u0120\": 2, \"hi\": 3, \"\\u0120hi\": 4, \"\\u00e4\": 5, \"\\u00b8\": 6, " \
    "\"\\u0143\": 7, \"\\u010a\": 8, \"\\u0120\\u0120\": 9}, "                                                  \
    "\"merges\": [[\"h\", \"i\"], [\"\\u0120\", \"hi\"], [\"\\u0120\", \"\\u0120\"]]"

static void test_byte_level(void)
{
    tokenizer *t = LOAD("{\"model\": {\"type\": \"BPE\", " BL_VOCAB "}, "
                        "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                        "\"trim_offsets\": true, \"use_regex\": true}, "
                        "\"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, "
                        "\"use_regex\": true}, "
                        "\"added_tokens\": [{\"id\": 10, \"content\": \"<|end|>\", \"special\": true, "
                        "\"normalized\": false}, {\"id\": 11, \"content\": \"\\u65e5\\u672c\", \"special\": false, "
                        "\"normalized\": false}]}");
    ENC(t, "hi hi", 3, 4);
    ENC(t, "\xe4\xb8\xad", 5, 6, 7);
    ENC(t, "hi\n", 3, 8);
    ENC(t, "hi   hi", 3, 9, 4);      /* \s+(?!\S) leaves the last space to the word */
    ENC(t, "hi<|end|>", 3, 10);
    expect_ids(t, "<|end|>", false, false, IDS(-1), __LINE__); /* < | e ... have no tokens */
    ENC(t, "\xe6\x97\xa5\xe6\x9c\xachi", 11, 3);
    CHECK_EQ_INT(tok_vocab_size(t), 12);
    DEC(t, false, "hi hi<|end|>", 3, 4, 10);
    DEC(t, true, "hi hi", 3, 4, 10);
    DEC(t, false, "\xe6\x97\xa5\xe6\x9c\xachi", 11, 3); /* text outside the byte map is kept as it is */
    DEC(t, false, "\xe4\xb8\xad", 5, 6, 7);
    DEC(t, false, "\xef\xbf\xbd", 5, 6);          /* an incomplete character at the end */
    DEC(t, false, "\xef\xbf\xbd\xef\xbf\xbd", 7, 7); /* stray continuation bytes */
    DEC(t, false, "\xef\xbf\xbdhi", 5, 6, 3);
    /* a split character is held back until its last byte comes */
    tok_stream *s = tok_stream_new(t, false);
    strbuf out;
    sb_init(&out);
    CHECK_STATUS(tok_stream_push(s, 3, &out), FERRY_OK);
    CHECK_STATUS(tok_stream_push(s, 5, &out), FERRY_OK);
    CHECK_STATUS(tok_stream_push(s, 6, &out), FERRY_OK);
    CHECK_EQ_STR(out.data, "hi");
    CHECK_STATUS(tok_stream_push(s, 7, &out), FERRY_OK);
    CHECK_EQ_STR(out.data, "hi\xe4\xb8\xad");
    CHECK_STATUS(tok_stream_push(s, 5, &out), FERRY_OK);
    tok_stream_flush(s, &out);
    CHECK_EQ_STR(out.data, "hi\xe4\xb8\xad\xef\xbf\xbd");
    tok_stream_free(s);
    sb_free(&out);
    /* invalid UTF-8 input is encoded as U+FFFD, here the bytes EF BF BD */
    int32_t *ids;
    int n;
    CHECK_STATUS(tok_encode(t, "hi\xff", 3, false, true, &ids, &n), FERRY_OK);
    CHECK_EQ_INT(n, 1); /* "hi" then U+FFFD whose bytes have no tokens here */
    free(ids);
    tok_free(t);
}

/* ---- added tokens ----------------------------------------------------------------------- */

static void test_added_flags(void)
{
    /* characters as tokens, so that what is left around an added token shows */
    const char *vocab = "\"vocab\": {\"a\": 0, \"b\": 1, \" \": 2, \"x\": 3, \"X\": 4}, \"merges\": []";
    char json[2048];
    snprintf(json, sizeof json,
             "{\"model\": {\"type\": \"BPE\", %s}, \"normalizer\": {\"type\": \"Lowercase\"}, \"added_tokens\": ["
             "{\"id\": 5, \"content\": \"<L>\", \"lstrip\": true, \"normalized\": false, \"special\": true},"
             "{\"id\": 6, \"content\": \"<R>\", \"rstrip\": true, \"normalized\": false, \"special\": false},"
             "{\"id\": 7, \"content\": \"ab\", \"single_word\": true, \"normalized\": false, \"special\": false},"
             "{\"id\": 8, \"content\": \"XB\", \"normalized\": true, \"special\": false}]}",
             vocab);
    tokenizer *t = LOAD(json);
    ENC(t, "a  <L>b", 0, 5, 1);       /* lstrip takes the spaces before */
    ENC(t, "a<R>  b", 0, 6, 1);       /* rstrip takes the spaces after */
    ENC(t, "ab", 7);
    ENC(t, "a ab b", 0, 2, 7, 2, 1);
    ENC(t, "xab", 3, 0, 1);           /* not a single word */
    ENC(t, "abx", 0, 1, 3);
    ENC(t, "a xB b", 0, 2, 8, 2, 1);  /* normalized: matched after lowercasing, as "xb" */
    ENC(t, "a XB", 0, 2, 8);
    expect_ids(t, "a <L>", false, false, IDS(0, 2), __LINE__); /* special off: "<", "l", ">" have no tokens */
    expect_ids(t, "<R>b", false, false, IDS(6, 1), __LINE__);             /* not special: still matched */
    CHECK_EQ_INT(tok_token_id(t, "<L>"), 5);
    CHECK(tok_is_special(t, 5));
    CHECK(!tok_is_special(t, 6));
    DEC(t, true, "a   ab", 0, 5, 2, 7); /* no decoder: the tokens joined with spaces */
    DEC(t, false, "a <L>   ab", 0, 5, 2, 7);
    tok_free(t);

    /* a whitespace token with both strips: its second match lies inside the
     * spaces the first one took and adds nothing (HF drops empty splits;
     * the token is the vocabulary's " ", id 2: HF tokenizers 0.23 gives
     * [0, 2, 1] for "a  b", not [0, 2, 2, 1]) */
    t = LOAD("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \" \": 2}, \"merges\": []}, "
             "\"added_tokens\": [{\"id\": 3, \"content\": \" \", \"lstrip\": true, \"rstrip\": true, "
             "\"normalized\": false, \"special\": false}]}");
    ENC(t, "a  b", 0, 2, 1);
    tok_free(t);

    /* ids come from the vocabulary or follow it, whatever "id" says */
    t = LOAD("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []}, \"added_tokens\": ["
             "{\"id\": 100, \"content\": \"<x>\", \"special\": true}, {\"id\": 0, \"content\": \"b\", \"special\": true},"
             "{\"id\": 50, \"content\": \"<y>\", \"special\": true}]}");
    CHECK_EQ_INT(tok_token_id(t, "<x>"), 2);
    CHECK_EQ_INT(tok_token_id(t, "b"), 1);
    CHECK_EQ_INT(tok_token_id(t, "<y>"), 3);
    CHECK_EQ_INT(tok_vocab_size(t), 4);
    ENC(t, "a<y>b<x>", 0, 3, 1, 2);
    DEC(t, true, "a", 0, 3, 1, 2);
    tok_free(t);
}

/* ---- pre-tokenizers and normalizers ------------------------------------------------------ */

static void test_pretokenizers(void)
{
    const char *vocab = "\"vocab\": {\"a\": 0, \"b\": 1, \"-\": 2, \"a-\": 3, \"-b\": 4, \"\\u2581\": 5, "
                        "\"\\u2581a\": 6, \"ab\": 7}, \"merges\": [\"a -\", \"- b\", \"\\u2581 a\", \"a b\"]";
    static const struct {
        const char *behavior;
        int want[8];
    } cases[] = {
        {"Removed", {0, 1, -1}},
        {"Isolated", {0, 2, 1, -1}},
        {"MergedWithPrevious", {3, 1, -1}},
        {"MergedWithNext", {0, 4, -1}},
        {"Contiguous", {0, 2, 1, -1}},
    };
    char json[1024];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(json, sizeof json,
                 "{\"model\": {\"type\": \"BPE\", %s}, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": "
                 "{\"String\": \"-\"}, \"behavior\": \"%s\", \"invert\": false}}",
                 vocab, cases[i].behavior);
        tokenizer *t = LOAD(json);
        if (t) expect_ids(t, "a-b", false, true, cases[i].want, __LINE__);
        tok_free(t);
    }
    /* invert: the matches are the pieces kept apart */
    snprintf(json, sizeof json,
             "{\"model\": {\"type\": \"BPE\", %s}, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": "
             "{\"Regex\": \"[ab]\"}, \"behavior\": \"Removed\", \"invert\": true}}", vocab);
    tokenizer *t = LOAD(json);
    ENC(t, "a-b", 0, 1);
    tok_free(t);
    /* Metaspace: "first" prepends only to the text's first piece */
    snprintf(json, sizeof json,
             "{\"model\": {\"type\": \"BPE\", %s}, \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": "
             "\"\\u2581\", \"prepend_scheme\": \"first\", \"split\": true}, \"added_tokens\": [{\"id\": 9, "
             "\"content\": \"-\", \"special\": true, \"normalized\": false}], \"decoder\": {\"type\": \"Metaspace\", "
             "\"replacement\": \"\\u2581\", \"prepend_scheme\": \"first\"}}", vocab);
    t = LOAD(json);
    ENC(t, "a a", 6, 6);
    ENC(t, "a-a", 6, 2, 0);
    DEC(t, false, "a a", 6, 6);
    tok_free(t);
    snprintf(json, sizeof json,
             "{\"model\": {\"type\": \"BPE\", %s}, \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": "
             "\"\\u2581\", \"prepend_scheme\": \"always\", \"split\": false}, \"added_tokens\": [{\"id\": 9, "
             "\"content\": \"-\", \"special\": true, \"normalized\": false}]}", vocab);
    t = LOAD(json);
    ENC(t, "a-a", 6, 2, 6);
    DEC(t, false, "\xe2\x96\x81" "a - \xe2\x96\x81" "a", 6, 2, 6); /* no decoder: tokens joined by spaces */
    tok_free(t);
}

static void test_normalizers(void)
{
    const char *vocab = "\"vocab\": {\"a\": 0, \"e\": 1, \"\\u0301\": 2, \"\\u00e9\": 3, \"f\": 4, \"i\": 5, "
                        "\"\\ufb01\": 6, \"#\": 7, \" \": 8, \"\\u0131\": 9, \"\\u0307\": 10}, \"merges\": []";
    static const struct {
        const char *norm;
        const char *text;
        int want[8];
    } cases[] = {
        {"{\"type\": \"NFC\"}", "e\xcc\x81", {3, -1}},
        {"{\"type\": \"NFD\"}", "\xc3\xa9", {1, 2, -1}},
        {"{\"type\": \"NFKC\"}", "\xef\xac\x81", {4, 5, -1}},
        {"{\"type\": \"NFKD\"}", "\xef\xac\x81\xc3\xa9", {4, 5, 1, 2, -1}},
        {"{\"type\": \"Lowercase\"}", "AE\xc4\xb0", {0, 1, 5, 10, -1}},
        {"{\"type\": \"Strip\", \"strip_left\": true, \"strip_right\": true}", "  a e \t", {0, 8, 1, -1}},
        {"{\"type\": \"Replace\", \"pattern\": {\"Regex\": \"[0-9]+\"}, \"content\": \"#\"}", "a12e3", {0, 7, 1, 7, -1}},
        {"{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFKD\"}, {\"type\": \"Prepend\", \"prepend\": \"a\"}]}",
         "\xc3\xa9", {0, 1, 2, -1}},
    };
    char json[1024];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(json, sizeof json, "{\"model\": {\"type\": \"BPE\", %s}, \"normalizer\": %s}", vocab,
                 cases[i].norm);
        tokenizer *t = LOAD(json);
        if (t) expect_ids(t, cases[i].text, false, true, cases[i].want, __LINE__);
        tok_free(t);
    }
}

/* ---- post-processors and tokenizer_config.json ---------------------------------------------- */

static void test_post_and_config(void)
{
    const char *base = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"<s>\": 1, \"</s>\": 2}, \"merges\": []}, "
                       "\"post_processor\": {\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\"}, "
                       "{\"type\": \"RobertaProcessing\", \"sep\": [\"</s>\", 2], \"cls\": [\"<s>\", 1]}]}}";
    remove_file("tokenizer_config.json");
    write_file("tokenizer.json", base);
    write_file("tokenizer_config.json", "{\"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<s>\"}, "
                                        "\"eos_token\": \"</s>\", \"chat_template\": [{\"name\": \"tool_use\", "
                                        "\"template\": \"T\"}, {\"name\": \"default\", \"template\": \"D\"}]}");
    tokenizer *t = NULL;
    CHECK_STATUS(tok_load(g_dir, &t), FERRY_OK);
    if (t) {
        expect_ids(t, "aa", true, true, IDS(1, 0, 0, 2), __LINE__);
        expect_ids(t, "aa", false, true, IDS(0, 0), __LINE__);
        CHECK_EQ_STR(tok_bos_token(t), "<s>");
        CHECK_EQ_STR(tok_eos_token(t), "</s>");
        CHECK_EQ_STR(tok_chat_template(t), "D");
        tok_free(t);
    }
    write_file("tokenizer_config.json", "{\"chat_template\": \"{{ messages }}\"}");
    t = NULL;
    CHECK_STATUS(tok_load(g_dir, &t), FERRY_OK);
    if (t) {
        CHECK_EQ_STR(tok_chat_template(t), "{{ messages }}");
        CHECK_EQ_STR(tok_bos_token(t), "");
        tok_free(t);
    }
    write_file("tokenizer_config.json", "{\"eos_token\": 7}");
    t = NULL;
    CHECK_STATUS(tok_load(g_dir, &t), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("tokenizer_config.json: eos_token");
    write_file("tokenizer_config.json", "{\"eos_token\": ");
    CHECK_STATUS(tok_load(g_dir, &t), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("tokenizer_config.json");
    remove_file("tokenizer_config.json");
    t = LOAD(base);
    CHECK(tok_chat_template(t) == NULL);
    tok_free(t);
}

/* ---- errors ---------------------------------------------------------------------------------- */

#define MODEL "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}"

/* tok_parse: a tokenizer.json's text, no file (the fuzz target's entry);
 * the same tokenizer as tok_load reads from the file, errors naming the
 * label given. */
static void test_parse_text(void)
{
    static const char json[] = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, "
                               "\"merges\": [\"a b\"]}}";
    tokenizer *t = NULL, *f = NULL;
    CHECK_STATUS(tok_parse(json, sizeof json - 1, "inline.json", &t), FERRY_OK);
    CHECK_STATUS(load_json(json, &f), FERRY_OK);
    if (t && f) {
        int32_t *a = NULL, *b = NULL;
        int na = 0, nb = 0;
        CHECK_STATUS(tok_encode(t, "abab", 4, true, true, &a, &na), FERRY_OK);
        CHECK_STATUS(tok_encode(f, "abab", 4, true, true, &b, &nb), FERRY_OK);
        CHECK_EQ_INT(na, 2);
        CHECK(na == nb && a && b && !memcmp(a, b, (size_t)na * sizeof *a) && a[0] == 2 && a[1] == 2);
        CHECK_EQ_INT(tok_vocab_size(t), 3);
        CHECK_EQ_STR(tok_eos_token(t), ""); /* no tokenizer_config.json */
        free(a);
        free(b);
    }
    tok_free(t);
    tok_free(f);
    t = (tokenizer *)1;
    CHECK_STATUS(tok_parse("{\"model\": 1}", 12, "inline.json", &t), FERRY_ERR_INVALID);
    CHECK(t == NULL);
    CHECK_MSG_HAS("inline.json");
}

static void test_errors(void)
{
    LOAD_ERR("{" MODEL ", \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "
             "{\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"pair\": [], "
             "\"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [7], \"tokens\": [\"<s>\"]}}}}",
             FERRY_ERR_INVALID, "post_processor adds id 7, which is not in the vocabulary");
    /* nor in a hole of it (found by fuzz_tokenizer: encode added an id decode refused) */
    LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 2}, \"merges\": []}, \"post_processor\": "
             "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, "
             "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"pair\": [], \"special_tokens\": {\"<s>\": "
             "{\"id\": \"<s>\", \"ids\": [1], \"tokens\": [\"<s>\"]}}}}",
             FERRY_ERR_INVALID, "post_processor adds id 1, which is not in the vocabulary");
    LOAD_ERR("{" MODEL ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": "
             "\"[\\\\S\\\\S\\\\S\\\\S\\\\S\\\\S\\\\S\\\\S\\\\W]\"}, \"behavior\": \"Isolated\", \"invert\": false}}",
             FERRY_ERR_UNSUPPORTED, "more than 8 negated escapes");
    /* unsupported parts name themselves and their place */
    LOAD_ERR("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", FERRY_ERR_UNSUPPORTED, "model type 'Unigram'");
    LOAD_ERR("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", FERRY_ERR_UNSUPPORTED, "'WordPiece'");
    LOAD_ERR("{" MODEL ", \"normalizer\": {\"type\": \"Precompiled\"}}", FERRY_ERR_UNSUPPORTED,
             "normalizer type 'Precompiled' is not supported");
    LOAD_ERR("{" MODEL ", \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, "
             "{\"type\": \"BertNormalizer\"}]}}", FERRY_ERR_UNSUPPORTED, "normalizer.normalizers[1] type 'BertNormalizer'");
    LOAD_ERR("{" MODEL ", \"pre_tokenizer\": {\"type\": \"Digits\", \"individual_digits\": true}}", FERRY_ERR_UNSUPPORTED,
             "pre_tokenizer type 'Digits' is not supported");
    LOAD_ERR("{" MODEL ", \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Whitespace\"}]}}",
             FERRY_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers[0] type 'Whitespace'");
    LOAD_ERR("{" MODEL ", \"decoder\": {\"type\": \"WordPiece\"}}", FERRY_ERR_UNSUPPORTED,
             "decoder type 'WordPiece' is not supported");
    LOAD_ERR("{" MODEL ", \"decoder\": {\"type\": \"CTC\"}}", FERRY_ERR_UNSUPPORTED, "'CTC'");
    LOAD_ERR("{" MODEL ", \"post_processor\": {\"type\": \"Magic\"}}", FERRY_ERR_UNSUPPORTED,
             "post_processor type 'Magic' is not supported");
    LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": {}, \"merges\": []}}", FERRY_ERR_UNSUPPORTED,
             "model.dropout");
    LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"continuing_subword_prefix\": \"##\", \"vocab\": {}, \"merges\": []}}",
             FERRY_ERR_UNSUPPORTED, "continuing_subword_prefix");
    LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"end_of_word_suffix\": \"</w>\", \"vocab\": {}, \"merges\": []}}",
             FERRY_ERR_UNSUPPORTED, "end_of_word_suffix");
    LOAD_ERR("{\"version\": \"2.0\", " MODEL "}", FERRY_ERR_UNSUPPORTED, "version");
    LOAD_ERR("{" MODEL ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"[a&&[b]]\"}, "
             "\"behavior\": \"Isolated\", \"invert\": false}}", FERRY_ERR_UNSUPPORTED, "pre_tokenizer.pattern");
    LOAD_ERR("{" MODEL ", \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"Sequence\": "
             "{\"id\": \"B\", \"type_id\": 0}}], \"special_tokens\": {}}}", FERRY_ERR_UNSUPPORTED, "sequence A");
    /* malformed files */
    LOAD_ERR("{" MODEL, FERRY_ERR_INVALID, "tokenizer.json");
    LOAD_ERR("[]", FERRY_ERR_INVALID, "JSON object");
    LOAD_ERR("{}", FERRY_ERR_INVALID, "has no model");
    LOAD_ERR("{\"model\": 3}", FERRY_ERR_INVALID, "model must be an object");
    LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"vocab\": [], \"merges\": []}}", FERRY_ERR_INVALID, "model.vocab");
    LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}", FERRY_ERR_INVALID, "model.vocab['a']");
    LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 99999999999}, \"merges\": []}}", FERRY_ERR_INVALID,
             "model.vocab['a']");
    LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 1.5}, \"merges\": []}}", FERRY_ERR_INVALID, "model.vocab");
    LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", FERRY_ERR_INVALID, "vocab and merges");
    LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": {}}}", FERRY_ERR_INVALID, "model.merges");
    LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a z\"]}}", FERRY_ERR_INVALID,
             "model.merges[0]: token 'z'");
    LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a a\"]}}", FERRY_ERR_INVALID,
             "merged token 'aa'");
    LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [[\"a\", \"a\"], \"a a\"]}}",
             FERRY_ERR_INVALID, "model.merges[0]");
    LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [[\"a\"]]}}", FERRY_ERR_INVALID,
             "model.merges[0]");
    LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"byte_fallback\": \"yes\", \"vocab\": {}, \"merges\": []}}",
             FERRY_ERR_INVALID, "model.byte_fallback");
    LOAD_ERR("{\"model\": {\"type\": \"BPE\", \"unk_token\": 5, \"vocab\": {}, \"merges\": []}}", FERRY_ERR_INVALID,
             "model.unk_token");
    LOAD_ERR("{" MODEL ", \"added_tokens\": {}}", FERRY_ERR_INVALID, "added_tokens");
    LOAD_ERR("{" MODEL ", \"added_tokens\": [{\"id\": 1}]}", FERRY_ERR_INVALID, "added_tokens[0].content");
    LOAD_ERR("{" MODEL ", \"added_tokens\": [{\"id\": 1, \"content\": \"x\", \"lstrip\": 1}]}", FERRY_ERR_INVALID,
             "added_tokens[0].lstrip");
    LOAD_ERR("{" MODEL ", \"normalizer\": {\"kind\": \"NFC\"}}", FERRY_ERR_INVALID, "normalizer has no \"type\"");
    LOAD_ERR("{" MODEL ", \"normalizer\": {\"type\": \"Replace\", \"content\": \"x\"}}", FERRY_ERR_INVALID,
             "normalizer.pattern");
    LOAD_ERR("{" MODEL ", \"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"Regex\": \"(\"}, \"content\": \"x\"}}",
             FERRY_ERR_INVALID, "does not compile");
    LOAD_ERR("{" MODEL ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": "
             "\"Sideways\", \"invert\": false}}", FERRY_ERR_INVALID, "pre_tokenizer.behavior");
    LOAD_ERR("{" MODEL ", \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"ab\"}}", FERRY_ERR_INVALID,
             "pre_tokenizer.replacement");
    LOAD_ERR("{" MODEL ", \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"_\", \"add_prefix_space\": "
             "false}}", FERRY_ERR_INVALID, "add_prefix_space");
    LOAD_ERR("{" MODEL ", \"decoder\": {\"type\": \"Strip\", \"content\": \" \", \"start\": -1, \"stop\": 0}}",
             FERRY_ERR_INVALID, "decoder.start");
    LOAD_ERR("{" MODEL ", \"decoder\": {\"type\": \"Sequence\", \"decoders\": 5}}", FERRY_ERR_INVALID, "decoder.decoders");
    LOAD_ERR("{" MODEL ", \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "
             "{\"id\": \"<s>\", \"type_id\": 0}}], \"special_tokens\": {}}}", FERRY_ERR_INVALID, "'<s>'");
    LOAD_ERR("{" MODEL ", \"post_processor\": {\"type\": \"BertProcessing\", \"sep\": \"[SEP]\"}}", FERRY_ERR_INVALID,
             "post_processor.cls");
    /* Sequences nested without end */
    char deep[4096] = "{" MODEL ", \"normalizer\": ";
    for (int i = 0; i < 40; i++) strcat(deep, "{\"type\": \"Sequence\", \"normalizers\": [");
    for (int i = 0; i < 40; i++) strcat(deep, "]}");
    strcat(deep, "}");
    LOAD_ERR(deep, FERRY_ERR_INVALID, "nested too deep");
    /* no tokenizer.json */
    remove_file("tokenizer.json");
    tokenizer *t = NULL;
    CHECK_STATUS(tok_load(g_dir, &t), FERRY_ERR_NOT_FOUND);
    CHECK_MSG_HAS("tokenizer.json");
    CHECK(t == NULL);
}

/* ---- size and threads ------------------------------------------------------------------------- */

static void test_long_word(void)
{
    /* 1 MB of one letter: the merges pair everything up level by level */
    tokenizer *t = LOAD("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"aa\": 1, \"aaaa\": 2}, "
                        "\"merges\": [\"a a\", \"aa aa\"]}}");
    size_t n = 1 << 20;
    char *text = malloc(n + 1);
    memset(text, 'a', n);
    text[n] = '\0';
    int32_t *ids;
    int n_ids;
    double t0 = util_now();
    CHECK_STATUS(tok_encode(t, text, n, false, true, &ids, &n_ids), FERRY_OK);
    printf("1 MB word: %.3f s\n", util_now() - t0);
    CHECK_EQ_INT(n_ids, (int)(n / 4));
    bool all = true;
    for (int i = 0; i < n_ids; i++) all = all && ids[i] == 2;
    CHECK(all);
    free(ids);
    ENC(t, "aaaaaaa", 2, 1, 0);
    free(text);
    tok_free(t);
}

static tokenizer *load_file(const char *path)
{
    char *text;
    size_t len;
    tokenizer *t = NULL;
    if (util_read_file(path, &text, &len) != FERRY_OK || tok_parse(text, len, path, &t) != FERRY_OK) {
        fprintf(stderr, "%s: %s\n", path, ferry_errmsg());
        check_failures++;
        return NULL;
    }
    free(text);
    return t;
}

/* The most tok_encode holds at once, the ids it returns included. */
static long long encode_peak(const tokenizer *t, const char *text, size_t len)
{
    int32_t *ids = NULL;
    int n;
    g_live = g_peak = 0;
    g_counting = true;
    ferry_status st = tok_encode(t, text, len, false, true, &ids, &n);
    g_counting = false;
    CHECK_EQ_INT(st, FERRY_OK);
    free(ids);
    return g_peak;
}

static void test_encode_memory(void)
{
    /* A text that splits into one word a byte (digits, under Qwen2's \p{N}
     * rule) held ~270 bytes a byte of it, the words' pieces all at once:
     * 145 KB for 1,000 digits, 8.7 MB for 32,769. Long words hold their
     * BPE scratch (4 bytes a symbol and 8 a candidate merge) and the text
     * they are made from: spaces take the most (15 bytes a byte), mapped to
     * "\u0120" (2 bytes) by ByteLevel, or to "\u2581" (3) by Llama 2's
     * normalizer, every pair of them a merge.
     * Text that grows before it is tokenized makes more than a token a byte
     * of it: 0xFF becomes U+FFFD (3 tokens through the demo tokenizer: 37
     * bytes held a byte), NFC makes U+1D160 three characters (33 a byte),
     * NFKC U+FDFA eighteen; the bound is by tok_encode_size, not len. */
    count_init();
    tokenizer *demo = load_file("config/demo-tokenizer/tokenizer.json");
    tokenizer *llama2 = load_file("tests/fuzz/tokenizers/llama2-small.json");
    tokenizer *nfkc = LOAD("{\"model\": {\"type\": \"BPE\", " BL_VOCAB "}, \"normalizer\": {\"type\": \"Sequence\", "
                           "\"normalizers\": [{\"type\": \"NFKC\"}, {\"type\": \"Lowercase\"}]}, "
                           "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false}}");
    /* tokenizer.json files that lengthen text on purpose: a Replace that
     * matches "" (content at every position), one whose content NFKC then
     * expands, one of a two-character pattern */
    tokenizer *rep_empty = LOAD("{\"model\": {\"type\": \"BPE\", " BL_VOCAB "}, \"normalizer\": {\"type\": \"Replace\", "
                                "\"pattern\": {\"Regex\": \"\"}, \"content\": \"\u2581\"}, "
                                "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false}}");
    tokenizer *rep_fdfa = LOAD("{\"model\": {\"type\": \"BPE\", " BL_VOCAB "}, \"normalizer\": {\"type\": \"Sequence\", "
                               "\"normalizers\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, "
                               "\"content\": \"\uFDFA\"}, {\"type\": \"NFKC\"}]}, "
                               "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false}}");
    tokenizer *rep_two = LOAD("{\"model\": {\"type\": \"BPE\", " BL_VOCAB "}, \"normalizer\": {\"type\": \"Replace\", "
                              "\"pattern\": {\"String\": \"ab\"}, \"content\": \"0123456789\"}, "
                              "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false}}");
    if (!demo || !llama2 || !nfkc || !rep_empty || !rep_fdfa || !rep_two) return;
    const struct {
        const tokenizer *t;
        const char *what;
        const char *unit; /* repeated to len bytes */
        size_t len;
    } cases[] = {
        {demo, "demo, digits", "7", 1000},
        {demo, "demo, digits", "7", 32769},
        {demo, "demo, spaces", " ", 32769},
        {demo, "demo, one letter", "a", 32769},
        {llama2, "llama2, digits", "7", 32769},
        {llama2, "llama2, spaces", " ", 32769},
        {llama2, "llama2, one letter", "a", 32769},
        {demo, "demo, 0xFF", "\xFF", 32768},
        {demo, "demo, cut sequences", "\xE4\xB8", 32768},
        {llama2, "llama2, 0xFF", "\xFF", 32768},
        {demo, "demo (NFC), U+1D160", "\xF0\x9D\x85\xA0", 32768},
        {demo, "demo (NFC), U+0958", "\xE0\xA5\x98", 32769},
        {demo, "demo (NFC), U+0390 and spaces", "\xCE\x90 ", 32769},
        {nfkc, "NFKC+lowercase, U+FDFA", "\xEF\xB7\xBA", 32769},
        {nfkc, "NFKC+lowercase, U+0130", "\xC4\xB0", 32768},
        {nfkc, "NFKC+lowercase, 0xFF", "\xFF", 32768},
        {rep_empty, "Replace \"\" by U+2581, letters", "a", 32769},
        {rep_fdfa, "Replace \" \" by U+FDFA, NFKC, spaces", " ", 32769},
        {rep_two, "Replace \"ab\" by 10 digits", "ab", 32768},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len = cases[i].len, k = strlen(cases[i].unit);
        char *text = malloc(len);
        for (size_t j = 0; j < len; j++) text[j] = cases[i].unit[j % k];
        long long held = encode_peak(cases[i].t, text, len);
        size_t size = tok_encode_size(cases[i].t, text, len);
        size_t bound = text_encode_bound(size);
        printf("encode of %zu bytes (%s): %zu to encode, %lld bytes held, %.1f a byte (bound %zu)\n", len,
               cases[i].what, size, held, (double)held / (double)len, bound);
        CHECK(held > 0 && (size_t)held <= bound);
        CHECK(size >= len);
        free(text);
    }
    tok_free(demo);
    tok_free(llama2);
    tok_free(nfkc);
    tok_free(rep_empty);
    tok_free(rep_fdfa);
    tok_free(rep_two);
}

/* tok_encode_size: a byte a byte of ASCII and of what no normalizer
 * lengthens; the replacement and the unicode forms counted. */
static void test_encode_size(void)
{
    tokenizer *plain = LOAD("{\"model\": {\"type\": \"BPE\", " BL_VOCAB "}}");
    tokenizer *nfc = LOAD("{\"model\": {\"type\": \"BPE\", " BL_VOCAB "}, \"normalizer\": {\"type\": \"NFC\"}}");
    tokenizer *nfkc = LOAD("{\"model\": {\"type\": \"BPE\", " BL_VOCAB "}, \"normalizer\": {\"type\": \"NFKC\"}}");
    tokenizer *lower = LOAD("{\"model\": {\"type\": \"BPE\", " BL_VOCAB "}, \"normalizer\": {\"type\": \"Lowercase\"}}");
    if (!plain || !nfc || !nfkc || !lower) return;
    const struct {
        const tokenizer *t;
        const char *text;
        size_t size;
    } cases[] = {
        {plain, "hello world", 11},
        {plain, "\xE4\xB8\xAD", 3},                 /* U+4E2D: as is */
        {plain, "\xFF", 3},                         /* U+FFFD */
        {plain, "a\xE4\xB8", 4},                    /* a cut sequence: one U+FFFD */
        {plain, "\xF0\x9D\x85\xA0", 4},              /* no normalizer: as is */
        {nfc, "\xF0\x9D\x85\xA0", 12},               /* U+1D160: U+1D158 U+1D165 U+1D16E */
        {nfc, "\xE0\xA5\x98", 6},                    /* U+0958: U+0915 U+093C */
        {nfc, "\xC3\xA9", 3},                        /* U+00E9 decomposes (and composes back) */
        {nfc, "\xEF\xB7\xBA", 3},                    /* U+FDFA: no canonical decomposition */
        {nfkc, "\xEF\xB7\xBA", 33},                  /* U+FDFA: 18 characters */
        {nfc, "\xFF\xFF", 6},
        {lower, "\xC4\xB0", 3},                      /* U+0130: "i" U+0307 */
        {lower, "ABC", 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t got = tok_encode_size(cases[i].t, cases[i].text, strlen(cases[i].text));
        if (got != cases[i].size) {
            fprintf(stderr, "tok_encode_size case %zu: %zu, want %zu\n", i, got, cases[i].size);
            check_failures++;
        }
    }
    tok_free(plain);
    tok_free(nfc);
    tok_free(nfkc);
    tok_free(lower);
}

typedef struct {
    const tokenizer *t;
    const char *text;
    int32_t *ids;
    int n;
    bool ok;
} job;

static void *encode_job(void *arg)
{
    job *j = arg;
    j->ok = true;
    for (int r = 0; r < 50 && j->ok; r++) {
        int32_t *ids;
        int n;
        if (tok_encode(j->t, j->text, strlen(j->text), true, true, &ids, &n) != FERRY_OK || n != j->n ||
            memcmp(ids, j->ids, (size_t)n * sizeof *ids) != 0)
            j->ok = false;
        free(ids);
    }
    return NULL;
}

static void test_threads(void)
{
    tokenizer *t = LOAD("{\"model\": {\"type\": \"BPE\", " BL_VOCAB "}, \"normalizer\": {\"type\": \"NFC\"}, "
                        "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
                        "\"pattern\": {\"Regex\": \"\\\\s+|\\\\p{L}+\"}, \"behavior\": \"Isolated\", \"invert\": false}, "
                        "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}}");
    const char *text = "hi hi   hi\n\xe4\xb8\xad hi";
    job jobs[4];
    pthread_t th[4];
    int32_t *ids;
    int n;
    CHECK_STATUS(tok_encode(t, text, strlen(text), true, true, &ids, &n), FERRY_OK);
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job){t, text, ids, n, false};
        pthread_create(&th[i], NULL, encode_job, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(jobs[i].ok);
    }
    free(ids);
    tok_free(t);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/ferry-tok-XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_merges();
    test_byte_fallback();
    test_byte_level();
    test_added_flags();
    test_pretokenizers();
    test_normalizers();
    test_post_and_config();
    test_parse_text();
    test_errors();
    test_long_word();
    test_encode_memory();
    test_encode_size();
    test_threads();
    remove_file("tokenizer.json");
    remove_file("tokenizer_config.json");
    rmdir(g_dir);
    return check_report();
}
