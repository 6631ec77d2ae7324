/*
 * gguf_vocab.c - the tokenizer files a GGUF stands for: not built yet (the
 * tokenizer.ggml.* recipes land next), so a GGUF model serves token ids.
 */
#include "gguf_vocab.h"

ferry_status gguf_vocab_tokenizer_json(const gguf_file *g, const char *label, strbuf *out)
{
    (void)g;
    (void)out;
    return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: the tokenizer from GGUF metadata is not built yet", label);
}

ferry_status gguf_vocab_tokenizer_config_json(const gguf_file *g, const char *label, strbuf *out)
{
    return gguf_vocab_tokenizer_json(g, label, out);
}
