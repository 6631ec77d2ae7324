/*
 * gguf_vocab_internal.h - what gguf_vocab_read.c makes of a GGUF file's
 * tokenizer metadata, for gguf_vocab.c to write as Hugging Face files (the
 * two halves of gguf_vocab.h; nothing else includes this).
 *
 * gguf_vocab_read() checks every tokenizer.ggml.* key it uses and decides
 * where each GGUF token goes in the Hugging Face tokenizer: the BPE model's
 * vocabulary, an added token (special or not), or left out ("[PADn]"
 * fillers; SentencePiece tokens after the pieces that are neither control
 * nor user-defined). After a successful read every id in a gguf_vocab is a
 * token the tokenizer keeps, every string is UTF-8 without NUL, and each
 * added token keeps its GGUF id when HF tokenizers loads the file.
 */
#ifndef FERRY_GGUF_VOCAB_INTERNAL_H
#define FERRY_GGUF_VOCAB_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf.h"

#define KEY_TEMPLATE "tokenizer.chat_template"

/* A byte-level pre-tokenizer: what llama.cpp's tokenizer.ggml.pre name
 * stands for in a tokenizer.json (gguf_vocab_read.c holds the table). */
typedef struct {
    const char *const *splits; /* Split (Isolated) regexes before ByteLevel, NULL-terminated */
    bool gpt2_regex;           /* ByteLevel splits with GPT-2's regex too */
    const char *const *after;  /* Split regexes after ByteLevel (Falcon's digit groups) */
    bool nfc;                  /* an NFC normalizer */
    bool ignore_merges;        /* a pre-token found whole in the vocabulary is one token */
    bool add_bos;              /* llama.cpp's add_bos when the file does not say */
    bool string_merges;        /* merges written "a b", as Qwen's files do */
} bpe_recipe;

/* token string -> id (gguf_vocab_read.c) */
typedef struct {
    const gguf_str *tokens;
    uint64_t *hash;  /* [n]: each token's */
    uint32_t *slots; /* [mask + 1]: id + 1, 0 when empty */
    uint64_t mask;
} token_index;

/* Where a GGUF token goes in the Hugging Face tokenizer (bits of gguf_vocab.place;
 * none: left out) */
enum { IN_VOCAB = 1, ADDED = 2, SPECIAL = 4, NORMALIZED = 8 };

typedef struct {
    const char *label;
    const gguf_file *g;
    bool spm;                /* tokenizer.ggml.model "llama"; else "gpt2" */
    const bpe_recipe *bpe;   /* gpt2: tokenizer.ggml.pre's recipe */
    uint32_t n;              /* tokens */
    uint32_t n_pieces;       /* spm: the SentencePiece model's own pieces are [0, n_pieces) */
    const gguf_str *tokens;  /* [n] */
    const gguf_kv *types;    /* INT32 [n], or NULL: all normal */
    const gguf_kv *scores;   /* spm: FLOAT32 or INT32 [n] */
    const gguf_kv *merges;   /* gpt2: STRING [] */
    uint8_t *place;          /* [n]: IN_VOCAB | ADDED | SPECIAL | NORMALIZED */
    uint8_t *merge_kept;     /* gpt2 [merges]: 0 for a repeat of an earlier merge */
    uint32_t n_vocab;        /* tokens IN_VOCAB */
    int64_t bos, eos, unk, pad; /* ids, -1 when the file has none */
    bool add_bos, add_eos;
    bool space_prefix;       /* spm: "▁" before the text */
    token_index index;
} gguf_vocab;

/* One SentencePiece merge: the pieces left and right, the merged piece's score */
typedef struct {
    double score;
    uint32_t left, right;
} spm_merge;

typedef struct {
    spm_merge *m;
    size_t n, cap;
    uint64_t bytes; /* as written */
} merge_list;

/* Reads and checks g's tokenizer metadata into v (label names the file in
 * errors). v is to be freed with gguf_vocab_free whatever the outcome. */
ferry_status gguf_vocab_read(const gguf_file *g, const char *label, gguf_vocab *v);
void gguf_vocab_free(gguf_vocab *v);

/* spm: the merges transformers' SentencePieceExtractor derives, in rank
 * order; ml->m is malloc'd (free it on success and failure). */
ferry_status gguf_vocab_spm_merges(const gguf_vocab *v, merge_list *ml);

bool gguf_vocab_utf8_valid(const char *s, uint64_t n);
/* gguf_get_*'s refusal of a mistyped key (the message is set), with the
 * file's label in front */
ferry_status gguf_vocab_mistyped(const gguf_vocab *v);

#endif
