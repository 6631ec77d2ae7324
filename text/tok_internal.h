/*
 * tok_internal.h - the tokenizer's private structures, shared by
 * text/tokenizer.c (loading), tok_bpe.c (the model), tok_normalize.c,
 * tok_encode.c (added tokens, pre-tokenizers, the pipeline), tok_decode.c,
 * tok_regex.c (PCRE2 with Oniguruma's semantics) and tok_util.c (tables,
 * UTF-8, Unicode classes). Nothing here is visible outside text/.
 *
 * The pipeline mirrors HF tokenizers 0.23 stage for stage, so that each
 * piece can be checked against its Rust counterpart:
 *   added tokens (raw text) -> normalizer -> added tokens (normalized text)
 *   -> pre-tokenizer -> BPE model -> post-processor       (tok_encode)
 *   ids -> token strings -> decoder chain                  (tok_decode)
 * A Sequence of normalizers, pre-tokenizers or decoders is flattened into
 * one array at load: applying [A, [B, C]] is applying A, B, C.
 */
#ifndef FERRY_TOK_INTERNAL_H
#define FERRY_TOK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/base/arena.h"
#include "../engine/base/json.h"
#include "../engine/base/status.h"
#include "tokenizer.h"

/* Token ids are kept below this so that id-indexed tables stay small; real
 * vocabularies hold at most a few hundred thousand tokens. */
#define TOK_MAX_ID (1 << 24)

/* The tokenizer's arena (its tables) takes blocks of this size: a
 * vocabulary's strings fill a few of them. (An encode holds no arena: what
 * it holds must stay within what a front end reserves for it, see
 * tok_encode.c.) */
#define TOK_ARENA_BLOCK (256 * 1024)

/* Appends p[0..n); p may be NULL when n is 0 (an empty strbuf's data). */
static inline void tok_put(strbuf *sb, const void *p, size_t n)
{
    if (n) sb_append(sb, p, n);
}

/* ---- string -> int32 map (open addressing; keys are not copied) ------- */

typedef struct {
    const char *key;
    uint32_t len;
    int32_t val;
} tok_strmap_slot;

typedef struct {
    tok_strmap_slot *slots; /* key NULL: empty */
    size_t mask, count;
} tok_strmap;

bool tok_strmap_init(tok_strmap *m, size_t expected);
void tok_strmap_free(tok_strmap *m);
/* Inserts or overwrites; key must outlive the map. false: out of memory. */
bool tok_strmap_put(tok_strmap *m, const char *key, size_t len, int32_t val);
/* The value, or -1. */
int32_t tok_strmap_get(const tok_strmap *m, const char *key, size_t len);

/* ---- (u32, u32) -> (rank, id) map: the merges, and the added-token trie's edges */

typedef struct {
    uint64_t key; /* UINT64_MAX: empty */
    uint32_t rank;
    int32_t id;
} tok_pairmap_slot;

typedef struct {
    tok_pairmap_slot *slots;
    size_t mask, count;
} tok_pairmap;

bool tok_pairmap_init(tok_pairmap *m, size_t expected);
void tok_pairmap_free(tok_pairmap *m);
/* Inserts or overwrites. */
bool tok_pairmap_put(tok_pairmap *m, uint32_t a, uint32_t b, uint32_t rank, int32_t id);
const tok_pairmap_slot *tok_pairmap_get(const tok_pairmap *m, uint32_t a, uint32_t b);

/* ---- UTF-8 and Unicode ------------------------------------------------ */

/* Decodes the character at s (valid UTF-8, n > 0 bytes left): its length. */
static inline size_t tok_utf8_next(const char *s, size_t n, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80 || n < 2) {
        *cp = u[0];
        return 1;
    }
    if (u[0] < 0xE0) {
        *cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
        return 2;
    }
    if (u[0] < 0xF0 || n < 4) {
        *cp = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (n > 2 ? (u[2] & 0x3F) : 0);
        return n < 3 ? n : 3;
    }
    *cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) | ((uint32_t)(u[2] & 0x3F) << 6) |
          (u[3] & 0x3F);
    return 4;
}

/* Length in bytes of the character starting with byte b (valid UTF-8). */
static inline size_t tok_utf8_len(unsigned char b)
{
    return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

/* Writes cp as UTF-8 into dst (4 bytes of room); returns the length. */

/* Appends s[0..n) to out with each ill-formed sequence replaced by U+FFFD,
 * exactly as Rust's String::from_utf8_lossy and Python's
 * decode('utf-8', 'replace') do (one U+FFFD per maximal subpart). When
 * `hold` is given, a valid but incomplete sequence at the end is not
 * converted: its length is stored in *hold and the caller keeps those bytes
 * for later. Returns the number of bytes consumed. */
size_t tok_utf8_lossy(const char *s, size_t n, strbuf *out, size_t *hold);
/* The character at s[0..n) as tok_utf8_lossy reads it: its code point
 * (U+FFFD for an ill-formed sequence) and the bytes it spans (n > 0). */
size_t tok_utf8_char(const char *s, size_t n, uint32_t *cp);
/* Whether s[0..n) is well-formed UTF-8. */
bool tok_utf8_valid(const char *s, size_t n);

/* Unicode White_Space (Rust's char::is_whitespace, regex's \s). */
bool tok_is_white_space(uint32_t cp);
/* Rust regex's \w: Alphabetic, marks, decimal digits, connector
 * punctuation, join controls (for added tokens' single_word). */
bool tok_is_regex_word(uint32_t cp);

/* GPT-2's byte <-> character table (byte-level BPE). */
extern const uint16_t tok_byte_char[256];
/* The byte a byte-level character stands for, or -1. */
int tok_char_byte(uint32_t cp);

/* ---- regexes: PCRE2 running patterns written for Oniguruma ------------- */

typedef struct tok_regex tok_regex;
typedef struct tok_match_ctx tok_match_ctx;

/* Compiles a tokenizer.json pattern. literal: the text itself is the pattern
 * (a "String" pattern, escaped as HF does). `what` names the field in
 * errors ("tokenizer.json: pre_tokenizer.pattern.Regex"). */
ferry_status tok_regex_compile(const char *pat, size_t len, bool literal, const char *what, tok_regex **out);
void tok_regex_free(tok_regex *re);
/* Whether re may match the empty string (PCRE2's lower bound on a match's
 * length is 0; true when unsure). */
bool tok_regex_may_match_empty(const tok_regex *re);

/* Per-call matching state (match data, JIT stack): one per thread at a time. */
tok_match_ctx *tok_match_ctx_new(void);
void tok_match_ctx_free(tok_match_ctx *mc);

typedef struct {
    size_t start, end;
} tok_span;

typedef struct {
    tok_span *v;
    size_t n, cap;
} tok_spans;

/* Where a search through one text stands (zeroed to start). */
typedef struct {
    size_t pos;      /* where the next search starts; past the text: ended */
    size_t last_end; /* the end of the last match given */
    bool have_last;
} tok_regex_iter;

/* The next match of re in s[0..n), with the Oniguruma find_iter rules HF
 * relies on (an empty match right after the previous match is skipped one
 * character on): *found, and its span in *m. The same s and n each call;
 * mc may serve other searches in between. */
ferry_status tok_regex_next(const tok_regex *re, tok_match_ctx *mc, const char *s, size_t n, tok_regex_iter *it,
                           tok_span *m, bool *found);
/* All matches of re in s[0..n), in order (tok_regex_next's). Replaces the
 * contents of *out. */
ferry_status tok_regex_find_all(const tok_regex *re, tok_match_ctx *mc, const char *s, size_t n, tok_spans *out);
bool tok_spans_push(tok_spans *sp, size_t start, size_t end);

/* ---- the pipeline's parts --------------------------------------------- */

typedef enum {
    TOK_NORM_NFC,
    TOK_NORM_NFD,
    TOK_NORM_NFKC,
    TOK_NORM_NFKD,
    TOK_NORM_LOWERCASE,
    TOK_NORM_PREPEND,
    TOK_NORM_REPLACE,
    TOK_NORM_STRIP,
} tok_norm_kind;

typedef struct {
    tok_norm_kind kind;
    const char *str; /* Prepend: the text; Replace: the content */
    size_t str_len;
    tok_regex *re;   /* Replace */
    int32_t lit_cp;  /* Replace: the pattern when it is one character (a String), else -1 */
    bool may_match_empty; /* Replace: re may match "" (content at every position) */
    bool left, right; /* Strip */
} tok_normalizer;

typedef enum { TOK_SPLIT_REMOVED, TOK_SPLIT_ISOLATED, TOK_SPLIT_MERGED_PREV, TOK_SPLIT_MERGED_NEXT, TOK_SPLIT_CONTIGUOUS } tok_split_behavior;
typedef enum { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER } tok_prepend_scheme;

typedef enum { TOK_PRE_SPLIT, TOK_PRE_BYTE_LEVEL, TOK_PRE_METASPACE } tok_pre_kind;

typedef struct {
    tok_pre_kind kind;
    tok_regex *re;               /* Split; ByteLevel with use_regex (GPT-2's pattern) */
    tok_split_behavior behavior; /* Split */
    bool invert;                 /* Split */
    bool add_prefix_space;       /* ByteLevel */
    uint32_t replacement;        /* Metaspace */
    char rep[5];                 /* Metaspace: the replacement as UTF-8 */
    size_t rep_len;
    tok_prepend_scheme prepend;  /* Metaspace */
    bool split;                  /* Metaspace */
} tok_pretok;

typedef enum { TOK_DEC_BYTE_LEVEL, TOK_DEC_METASPACE, TOK_DEC_REPLACE, TOK_DEC_FUSE, TOK_DEC_STRIP, TOK_DEC_BYTE_FALLBACK } tok_dec_kind;

typedef struct {
    tok_dec_kind kind;
    tok_regex *re;           /* Replace: the pattern (regex, or a literal that is empty) */
    const char *lit;         /* Replace: a non-empty String pattern, matched without PCRE2 */
    size_t lit_len;
    const char *content;     /* Replace */
    size_t content_len;
    uint32_t ch;             /* Strip: content; Metaspace: replacement */
    size_t start, stop;      /* Strip */
    bool meta_prepend;       /* Metaspace: prepend_scheme is not never */
} tok_decoder;

/* A post-processor step: `single` template items, -1 standing for the
 * sequence, other values ids. Applied in order (a Sequence of processors). */
typedef struct {
    int32_t *items;
    size_t n;
} tok_template;

typedef struct {
    const char *content; /* as written in added_tokens */
    uint32_t len;
    const char *form; /* what is matched and decoded: the normalizer's output for normalized tokens */
    uint32_t form_len;
    int32_t id;
    bool special, lstrip, rstrip, normalized, single_word;
} tok_added;

/* An Aho-Corasick-free trie for leftmost-longest matching of added tokens:
 * edges in a pair map keyed (node, byte). */
typedef struct {
    tok_pairmap edges;   /* (node, byte) -> child node in .id */
    int32_t *value;      /* node -> added token index, or -1 */
    size_t n_nodes;
    bool first[256];     /* bytes that start some pattern */
} tok_trie;

/* ---- BPE model (tok_bpe.c) ----------------------------------------------- */

typedef struct {
    tok_strmap vocab;      /* token -> id */
    const char **id_str;   /* id -> token (NULL for ids the vocab lacks); max_id + 1 of them */
    uint32_t *id_len;
    int32_t max_id;        /* -1 when empty */
    size_t n_entries;      /* distinct tokens: HF's get_vocab_size */
    tok_pairmap merges;    /* (left id, right id) -> rank, merged id */
    const char *unk_token; /* NULL: none */
    bool byte_fallback, fuse_unk, ignore_merges;
    int32_t byte_id[256];  /* "<0xNN>" ids, -1 when absent */
    int32_t *bmp_id;       /* single-character tokens below U+10000, -1 when absent */
} tok_bpe;

ferry_status tok_bpe_load(tok_bpe *m, const json_value *model, mem_arena *arena, const char *file);
void tok_bpe_free(tok_bpe *m);

typedef struct tok_bpe_scratch tok_bpe_scratch;
/* Appends the ids of one pre-token w[0..n) to *ids. */
ferry_status tok_bpe_word(const tok_bpe *m, const char *w, size_t n, tok_bpe_scratch **scratch, int32_t **ids,
                          size_t *n_ids, size_t *cap);
void tok_bpe_scratch_free(tok_bpe_scratch *s);

/* ---- the tokenizer ------------------------------------------------------- */

struct tokenizer {
    mem_arena arena; /* every string and table that lives as long as the tokenizer */
    char *path;      /* dir/tokenizer.json, for messages */

    tok_bpe bpe;

    tok_normalizer *norm;
    size_t n_norm;

    tok_pretok *pretok;
    size_t n_pretok;

    tok_decoder *dec;
    size_t n_dec;
    bool has_decoder; /* no decoder: tokens are joined with spaces */

    tok_template *post;
    size_t n_post;

    tok_added *added;   /* one per distinct added token, the last flags given winning */
    size_t n_added;
    tok_strmap added_by_content; /* content -> index in added */
    int32_t *added_at;  /* id -> index in added, or -1; vocab_size entries */
    tok_strmap special_set; /* contents ever added as special (HF's special_tokens_set) */
    tok_trie trie_raw;  /* non-normalized tokens, matched on the input */
    tok_trie trie_norm; /* normalized tokens, matched on normalized pieces */

    int32_t vocab_size; /* highest id + 1 */
    uint8_t *skippable; /* id -> 1 when decode(skip_special) drops it */

    const char *bos, *eos, *chat_template;
};

/* Runs the normalizers on s[0..n) and sets out to the result (s must not
 * point into out).
 *
 * *zero tracks what HF's alignments decide for the Metaspace "first"
 * prepend scheme: on entry the number of leading bytes of s that come from
 * the original text's first character (0 when s does not start the text),
 * on return the number of leading bytes of the result that do (NFKC turns
 * a leading "\uFB01" into "fi", both from it; Strip may drop it). */
ferry_status tok_normalize(const tokenizer *t, tok_match_ctx *mc, const char *s, size_t n, strbuf *out,
                           size_t *zero);

/* The text decode writes for id (an added token's form or the vocab's
 * token), or NULL when id is not in the vocabulary. */
const char *tok_id_text(const tokenizer *t, int32_t id, size_t *len);

#endif
