/*
 * fuzz_tokenizer.c - libFuzzer target for tokenizers (text/tokenizer.h):
 * loading a tokenizer.json (tok_parse), and encoding and decoding text with
 * it (tok_encode, tok_decode, the streaming tok_stream).
 *
 * Byte 0 picks the mode (bits 0-1; 3 is 0) and the flags (bit 2: add_special,
 * bit 3: parse_special):
 *   0  a tokenizer.json of the input's own: the rest is its text, then a
 *      line "\n--text--\n" and the text to encode (without the line: no
 *      text, only ids from the bytes below)
 *   1  the demo tokenizer (config/demo-tokenizer: byte-level BPE with
 *      Qwen2's Split regex and NFC), loaded once; the rest is the text
 *   2  a small Llama 2 tokenizer (tests/fuzz/tokenizers/llama2-small.json:
 *      SentencePiece-style BPE with byte fallback, Llama 2's first thousand
 *      ids and its ASCII characters), loaded once; the rest is the text
 * Promises: a refused tokenizer.json leaves no tokenizer and says why,
 * naming the file. With a tokenizer: encoding gives ids inside the
 * vocabulary, the same twice; the ids, and ids made from the text's bytes
 * (two bytes each, modulo the vocabulary; one in a hole of the vocabulary
 * is refused by tok_decode and the stream alike), decode - and the streaming
 * decoder, fed them one by one and flushed, gives exactly what tok_decode
 * gives, with or without special tokens. With the two real tokenizers the
 * text comes back: decode(encode(text)) is text when it is valid UTF-8 (in
 * NFC for the demo one; without U+2581, which Llama 2 writes spaces as, and
 * special-token text not parsed, for Llama 2), and encoding it holds no
 * more memory than text_encode_bound of its tok_encode_size (text/text.h),
 * what the server reserves for it (checked through the AddressSanitizer allocator's hooks;
 * a build without ASan skips it; FUZZ_TOKENIZER_NO_ENCODE_BOUND=1 turns it
 * off, to fuzz the rest while such a finding is open). A broken promise aborts,
 * which libFuzzer reports as a crash. FUZZ_ROOT (set by the Makefile) is
 * where the fixed tokenizers are read from. Build: README.md.
 */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "../../engine/base/util.h"
#include "../../text/tokenizer.h"
#include "../../text/text.h"

#include "fuzz_asan.h"
#ifdef FUZZ_HAVE_ASAN
#if __has_include(<sanitizer/allocator_interface.h>)
#include <sanitizer/allocator_interface.h>
#else /* gcc ships no header for them; libasan has the functions */
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                              void (*free_hook)(const volatile void *));
size_t __sanitizer_get_allocated_size(const volatile void *p);
#endif
#endif

#ifndef FUZZ_ROOT
#define FUZZ_ROOT "."
#endif
#define LABEL "fuzz/tokenizer.json"
#define MAX_IDS 512 /* ids made from the text's bytes */

static tokenizer *g_demo, *g_llama2;

/* ---- the memory an encode holds ----------------------------------------- */

/* Bytes live on the heap, and their peak since the last reset: the
 * sanitizer allocator's hooks keep them (the target has one thread). */
static size_t g_live, g_peak;
static bool g_encode_bound = true; /* FUZZ_TOKENIZER_NO_ENCODE_BOUND=1: off */

#ifdef FUZZ_HAVE_ASAN
static void malloc_hook(const volatile void *p, size_t size)
{
    (void)p;
    g_live += size;
    if (g_live > g_peak) g_peak = g_live;
}

static void free_hook(const volatile void *p)
{
    if (p) g_live -= __sanitizer_get_allocated_size(p);
}
#endif

static tokenizer *load_fixed(const char *path)
{
    char *text;
    size_t len;
    tokenizer *t;
    if (util_read_file(path, &text, &len) != FERRY_OK || tok_parse(text, len, path, &t) != FERRY_OK) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", ferry_errmsg());
        abort();
    }
    free(text);
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *off = getenv("FUZZ_TOKENIZER_NO_ENCODE_BOUND");
    g_encode_bound = !(off && *off && strcmp(off, "0") != 0);
#ifdef FUZZ_HAVE_ASAN
    if (g_encode_bound && !__sanitizer_install_malloc_and_free_hooks(malloc_hook, free_hook)) abort();
#endif
    g_demo = load_fixed(FUZZ_ROOT "/config/demo-tokenizer/tokenizer.json");
    g_llama2 = load_fixed(FUZZ_ROOT "/tests/fuzz/tokenizers/llama2-small.json");
    return 0;
}

/* tok_decode of ids, and the stream fed the same ids: the same text. */
static void decode_both(const tokenizer *t, const int32_t *ids, int n, bool skip, strbuf *out)
{
    sb_init(out);
    if (tok_decode(t, ids, n, skip, out) != FERRY_OK || out->oom) abort();
    tok_stream *s = tok_stream_new(t, skip);
    if (!s) abort();
    strbuf st;
    sb_init(&st);
    for (int i = 0; i < n; i++)
        if (tok_stream_push(s, ids[i], &st) != FERRY_OK) abort();
    tok_stream_flush(s, &st);
    tok_stream_free(s);
    if (st.oom || st.len != out->len || (st.len && memcmp(st.data, out->data, st.len))) {
        fprintf(stderr, "fuzz_tokenizer: streamed %zu bytes, decoded %zu\n", st.len, out->len);
        abort();
    }
    sb_free(&st);
}

/* Encodes text (when given) and decodes its ids and ids from its bytes;
 * the text decoded from its own ids (skip_special false) goes to back.
 * bounded: the encode must hold no more than text_encode_bound (of the text's
 * tok_encode_size). Returns the
 * encoding's status. */
static ferry_status exercise(const tokenizer *t, const char *text, size_t len, bool has_text, bool add, bool special,
                             bool bounded, strbuf *back)
{
    int vocab = tok_vocab_size(t);
    if (vocab < 0) abort();
    sb_init(back);
    ferry_status st = FERRY_OK;
    if (has_text) {
        int32_t *ids = NULL, *again = NULL;
        int n = -1, m = -1;
        size_t base = g_peak = g_live;
        st = tok_encode(t, text, len, add, special, &ids, &n);
#ifdef FUZZ_HAVE_ASAN
        /* what the server reserves for an encode, for a real tokenizer */
        if (bounded && g_encode_bound) {
            size_t size = tok_encode_size(t, text, len), peak = g_peak - base;
            if (peak > text_encode_bound(size)) {
                fprintf(stderr, "fuzz_tokenizer: encoding %zu bytes (%zu to encode) held %zu bytes (text_encode_bound: %zu)\n",
                        len, size, peak, text_encode_bound(size));
                abort();
            }
        }
#endif
        if (st == FERRY_OK) {
            if (n < 0 || (n && !ids)) abort();
            for (int i = 0; i < n; i++)
                if (ids[i] < 0 || ids[i] >= vocab) abort();
            if (tok_encode(t, text, len, add, special, &again, &m) != FERRY_OK || m != n ||
                (n && memcmp(ids, again, (size_t)n * sizeof *ids)))
                abort();
            strbuf skipped;
            decode_both(t, ids, n, true, &skipped);
            sb_free(&skipped);
            sb_free(back);
            decode_both(t, ids, n, false, back);
        } else if (st != FERRY_ERR_NOMEM && st != FERRY_ERR_TOO_LARGE && st != FERRY_ERR_INVALID) {
            abort();
        }
        free(ids);
        free(again);
    }
    if (vocab == 0) return st;
    int32_t raw[MAX_IDS];
    int n = 0;
    strbuf one;
    sb_init(&one);
    for (size_t i = 0; i + 1 < len && n < MAX_IDS; i += 2) {
        int32_t id = (int32_t)(((uint32_t)(uint8_t)text[i] << 8 | (uint8_t)text[i + 1]) % (uint32_t)vocab);
        (void)tok_is_special(t, id);
        /* an id in a hole of the vocabulary is refused, by the stream too */
        one.len = 0;
        if (tok_decode(t, &id, 1, false, &one) == FERRY_OK) {
            raw[n++] = id;
            continue;
        }
        tok_stream *s = tok_stream_new(t, false);
        if (!s || tok_stream_push(s, id, &one) == FERRY_OK) abort();
        tok_stream_free(s);
    }
    sb_free(&one);
    strbuf a, b;
    decode_both(t, raw, n, false, &a);
    decode_both(t, raw, n, true, &b);
    sb_free(&a);
    sb_free(&b);
    return st;
}

/* Valid UTF-8 that NFC leaves as it is. */
static bool nfc_stable(const char *s, size_t len)
{
    utf8proc_uint8_t *out = NULL;
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &out,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    bool same = n >= 0 && (size_t)n == len && !memcmp(out, s, len);
    free(out);
    return same;
}

static bool valid_utf8(const char *s, size_t len)
{
    utf8proc_int32_t c;
    for (size_t i = 0; i < len;) {
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(len - i), &c);
        if (k <= 0) return false;
        i += (size_t)k;
    }
    return true;
}

static void round_trip(const char *text, size_t len, const strbuf *back)
{
    if (back->len == len && (!len || !memcmp(back->data, text, len))) return;
    fprintf(stderr, "fuzz_tokenizer: %zu bytes of text decode back as %zu others\n", len, back->len);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int mode = (data[0] & 3) % 3;
    bool add = data[0] >> 2 & 1, special = data[0] >> 3 & 1;
    const char *rest = (const char *)data + 1;
    size_t len = size - 1;
    strbuf back;
    if (mode == 0) {
        static const char sep[] = "\n--text--\n";
        size_t jlen = len;
        const char *text = rest + len;
        for (size_t i = 0; i + sizeof sep - 1 <= len; i++)
            if (!memcmp(rest + i, sep, sizeof sep - 1)) {
                jlen = i;
                text = rest + i + sizeof sep - 1;
                break;
            }
        tokenizer *t = (tokenizer *)1;
        ferry_status st = tok_parse(rest, jlen, LABEL, &t);
        if (st != FERRY_OK) {
            if (t || !strstr(ferry_errmsg(), LABEL)) {
                fprintf(stderr, "fuzz_tokenizer: refused without naming the file: %s\n", ferry_errmsg());
                abort();
            }
            return 0;
        }
        exercise(t, text, (size_t)(rest + len - text), jlen < len, add, special, false, &back);
        sb_free(&back);
        tok_free(t);
        return 0;
    }
    const tokenizer *t = mode == 1 ? g_demo : g_llama2;
    ferry_status st = exercise(t, rest, len, true, add, special, true, &back);
    if (st != FERRY_OK && st != FERRY_ERR_NOMEM && st != FERRY_ERR_TOO_LARGE) abort(); /* any bytes encode */
    if (!add && valid_utf8(rest, len)) {
        if (mode == 1 && nfc_stable(rest, len)) round_trip(rest, len, &back);
        if (mode == 2 && !special && !memmem(rest, len, "\xE2\x96\x81", 3)) round_trip(rest, len, &back);
    }
    sb_free(&back);
    return 0;
}
