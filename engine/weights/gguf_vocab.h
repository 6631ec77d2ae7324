/*
 * gguf_vocab.h - the Hugging Face tokenizer files (tokenizer.json,
 * tokenizer_config.json) a GGUF file's tokenizer.ggml.* metadata stands for.
 */
#ifndef FERRY_GGUF_VOCAB_H
#define FERRY_GGUF_VOCAB_H

#include "../base/json.h"
#include "gguf.h"

ferry_status gguf_vocab_tokenizer_json(const gguf_file *g, const char *label, strbuf *out);
ferry_status gguf_vocab_tokenizer_config_json(const gguf_file *g, const char *label, strbuf *out);

#endif
