/*
 * gguf_vocab.h - the Hugging Face tokenizer a GGUF file's tokenizer stands
 * for: the text of its tokenizer.json and tokenizer_config.json, written
 * from the tokenizer.ggml.* metadata, so that text/tokenizer.c (and HF
 * tokenizers) tokenize a GGUF model exactly as llama.cpp does.
 *
 * The recipes are scripts/vocab_to_hf.py's, ported (that script builds the
 * same files with the `tokenizers` library and checks them against
 * llama.cpp's tokenization vectors); the files are laid out as `tokenizers`
 * saves them. By tokenizer.ggml.model:
 *
 *   llama  SentencePiece as BPE: byte fallback, fuse_unk, the unk token; the
 *          merges derived from the pieces' scores as transformers'
 *          SentencePieceExtractor does; Prepend("▁") + Replace(" ", "▁")
 *          (no Prepend, and no Strip in the decoder, when
 *          tokenizer.ggml.add_space_prefix is false); the Replace/
 *          ByteFallback/Fuse/Strip decoder
 *   gpt2   byte-level BPE with the file's merges and the pre-tokenizer
 *          llama.cpp uses for tokenizer.ggml.pre (its regexes as the models'
 *          own tokenizer.json files write them, as Split pre-tokenizers
 *          before ByteLevel)
 *
 * Tokens of type control become special added tokens, user-defined ones
 * (non-special) added tokens; llama.cpp's "[PADn]" fillers are left out.
 * BOS/EOS are added by a TemplateProcessing post-processor when
 * tokenizer.ggml.add_bos_token / add_eos_token say so; when the file does
 * not say, as llama.cpp decides: BOS for SentencePiece and Llama 3, none
 * for the others.
 *
 * Everything is checked before it is written (types, lengths, ids in range,
 * UTF-8, duplicate tokens, merges of tokens): a file the recipe cannot
 * stand for faithfully - another model, an unknown pre-tokenizer, a
 * missing or mistyped key, a merge that is not two tokens - is refused in
 * one line naming the key and the value, and nothing is appended to out.
 * gguf_vocab_read.c reads and checks, gguf_vocab.c writes
 * (gguf_vocab_internal.h between them).
 */
#ifndef FERRY_GGUF_VOCAB_H
#define FERRY_GGUF_VOCAB_H

#include "../base/json.h" /* strbuf */
#include "gguf.h"

/* tokenizer.json's text for g's tokenizer, appended to out; label names
 * the file in errors (FERRY_ERR_INVALID; FERRY_ERR_TOO_LARGE for derived
 * SentencePiece merges past GGUF_VOCAB_MAX_MERGE_BYTES; FERRY_ERR_NOMEM). */
ferry_status gguf_vocab_tokenizer_json(const gguf_file *g, const char *label, strbuf *out);

/* tokenizer_config.json's text: add_bos_token, add_eos_token,
 * added_tokens_decoder, the bos/eos/unk/pad tokens, chat_template
 * (tokenizer.chat_template when present), tokenizer_class,
 * clean_up_tokenization_spaces false, model_max_length (the file's
 * ARCH.context_length, else transformers' "no limit"). The same checks. */
ferry_status gguf_vocab_tokenizer_config_json(const gguf_file *g, const char *label, strbuf *out);

/* The most bytes of merges derived from a SentencePiece vocabulary (Llama 2
 * and Baichuan: under 1 MB). A piece of n bytes can split n - 1 ways, so a
 * hostile file could ask for merges growing with the square of its size:
 * past this it is refused. */
#define GGUF_VOCAB_MAX_MERGE_BYTES (256u << 20)

#endif
