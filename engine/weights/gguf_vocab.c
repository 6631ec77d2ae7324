/*
 * gguf_vocab.c - tokenizer.json and tokenizer_config.json for a GGUF file's
 * tokenizer (gguf_vocab.h says what each recipe writes;
 * scripts/vocab_to_hf.py is the reference it ports).
 *
 * gguf_vocab_read.c checks the metadata and places every token; this file
 * only writes, in the layout HF tokenizers saves (the keys in its order,
 * the vocabulary by id, merges as [a, b] pairs or, for Qwen, "a b"
 * strings). A call that fails leaves out as it was.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_vocab.h"
#include "gguf_vocab_internal.h"

#define SPACE_MARK "\u2581" /* SentencePiece's "▁" */
/* transformers' "no limit" (int(1e30)), as its saved configs write it */
#define NO_MAX_LENGTH "1000000000000000019884624838656"

/* ---- tokenizer.json ------------------------------------------------------------------- */

static void put_str(strbuf *sb, gguf_str s) { sb_json_strn(sb, s.ptr, s.len); }

static gguf_str cstr(const char *s) { return (gguf_str){s, strlen(s)}; }

static void put_added_tokens(const gguf_vocab *v, strbuf *sb)
{
    bool first = true;
    sb_puts(sb, "  \"added_tokens\": [");
    for (uint32_t i = 0; i < v->n; i++) {
        uint8_t p = v->place[i];
        if (!(p & ADDED)) continue;
        sb_printf(sb, "%s\n    {\"id\": %u, \"content\": ", first ? "" : ",", i);
        put_str(sb, v->tokens[i]);
        sb_printf(sb, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": %s, "
                      "\"special\": %s}",
                  p & NORMALIZED ? "true" : "false", p & SPECIAL ? "true" : "false");
        first = false;
    }
    sb_puts(sb, first ? "],\n" : "\n  ],\n");
}

static void put_normalizer(const gguf_vocab *v, strbuf *sb)
{
    const char *replace = "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"" SPACE_MARK "\"}";
    sb_puts(sb, "  \"normalizer\": ");
    if (v->spm && v->space_prefix)
        sb_printf(sb, "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"" SPACE_MARK
                      "\"}, %s]}",
                  replace);
    else if (v->spm) sb_puts(sb, replace);
    else sb_puts(sb, v->bpe->nfc ? "{\"type\": \"NFC\"}" : "null");
    sb_puts(sb, ",\n");
}

static void put_splits(strbuf *sb, const char *const *re, bool *first)
{
    for (; re && *re; re++) {
        sb_puts(sb, *first ? "\n    " : ",\n    ");
        sb_puts(sb, "{\"type\": \"Split\", \"pattern\": {\"Regex\": ");
        sb_json_str(sb, *re);
        sb_puts(sb, "}, \"behavior\": \"Isolated\", \"invert\": false}");
        *first = false;
    }
}

static void put_pre_tokenizer(const gguf_vocab *v, strbuf *sb)
{
    sb_puts(sb, "  \"pre_tokenizer\": ");
    if (v->spm) {
        sb_puts(sb, "null,\n");
        return;
    }
    const bpe_recipe *r = v->bpe;
    bool alone = !r->splits && !r->after, first = true;
    if (!alone) {
        sb_puts(sb, "{\"type\": \"Sequence\", \"pretokenizers\": [");
        put_splits(sb, r->splits, &first);
        sb_puts(sb, ",\n    ");
    }
    sb_printf(sb, "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": %s}",
              r->gpt2_regex ? "true" : "false");
    if (!alone) {
        put_splits(sb, r->after, &first);
        sb_puts(sb, "\n  ]}");
    }
    sb_puts(sb, ",\n");
}

/* a template's piece: {"SpecialToken": ...} or {"Sequence": ...}, comma-separated */
static void put_piece(strbuf *sb, bool *first, const char *kind, gguf_str id, int type_id)
{
    sb_printf(sb, "%s{\"%s\": {\"id\": ", *first ? "" : ", ", kind);
    put_str(sb, id);
    sb_printf(sb, ", \"type_id\": %d}}", type_id);
    *first = false;
}

/* one sequence of the template: [BOS] $X [EOS] */
static void put_template_seq(strbuf *sb, bool *first, const gguf_vocab *v, const char *seq, int bos_type, int type_id)
{
    if (v->add_bos) put_piece(sb, first, "SpecialToken", v->tokens[v->bos], bos_type);
    put_piece(sb, first, "Sequence", cstr(seq), type_id);
    if (v->add_eos) put_piece(sb, first, "SpecialToken", v->tokens[v->eos], type_id);
}

static void put_special_entry(strbuf *sb, const gguf_vocab *v, int64_t id)
{
    put_str(sb, v->tokens[id]);
    sb_puts(sb, ": {\"id\": ");
    put_str(sb, v->tokens[id]);
    sb_printf(sb, ", \"ids\": [%lld], \"tokens\": [", (long long)id);
    put_str(sb, v->tokens[id]);
    sb_puts(sb, "]}");
}

/* BOS/EOS as TemplateProcessing; the second sequence's BOS has type 0 in
 * SentencePiece files (Llama 2's), 1 in byte-level ones */
static void put_template(const gguf_vocab *v, strbuf *sb)
{
    bool first = true;
    sb_puts(sb, "{\"type\": \"TemplateProcessing\", \"single\": [");
    put_template_seq(sb, &first, v, "A", 0, 0);
    sb_puts(sb, "], \"pair\": [");
    first = true;
    put_template_seq(sb, &first, v, "A", 0, 0);
    put_template_seq(sb, &first, v, "B", v->spm ? 0 : 1, 1);
    sb_puts(sb, "], \"special_tokens\": {");
    if (v->add_bos) put_special_entry(sb, v, v->bos);
    if (v->add_eos && !(v->add_bos && v->eos == v->bos)) {
        if (v->add_bos) sb_puts(sb, ", ");
        put_special_entry(sb, v, v->eos);
    }
    sb_puts(sb, "}}");
}

static void put_post_processor(const gguf_vocab *v, strbuf *sb)
{
    const char *byte_level = "{\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": false, "
                             "\"use_regex\": true}";
    bool tmpl = v->add_bos || v->add_eos;
    sb_puts(sb, "  \"post_processor\": ");
    if (v->spm && tmpl) put_template(v, sb);
    else if (v->spm) sb_puts(sb, "null");
    else if (!tmpl) sb_puts(sb, byte_level);
    else {
        sb_printf(sb, "{\"type\": \"Sequence\", \"processors\": [%s, ", byte_level);
        put_template(v, sb);
        sb_puts(sb, "]}");
    }
    sb_puts(sb, ",\n");
}

static void put_decoder(const gguf_vocab *v, strbuf *sb)
{
    sb_puts(sb, "  \"decoder\": ");
    if (!v->spm) {
        sb_puts(sb, "{\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true},\n");
        return;
    }
    sb_puts(sb, "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"" SPACE_MARK
                "\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}");
    if (v->space_prefix) sb_puts(sb, ", {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}");
    sb_puts(sb, "]},\n");
}

static ferry_status put_merges(const gguf_vocab *v, strbuf *sb)
{
    bool first = true;
    sb_puts(sb, "    \"merges\": [");
    if (v->spm) {
        merge_list ml;
        ferry_status st = gguf_vocab_spm_merges(v, &ml);
        for (size_t k = 0; k < ml.n && st == FERRY_OK; k++, first = false) {
            sb_puts(sb, first ? "\n      [" : ",\n      [");
            put_str(sb, v->tokens[ml.m[k].left]);
            sb_puts(sb, ", ");
            put_str(sb, v->tokens[ml.m[k].right]);
            sb_putc(sb, ']');
        }
        free(ml.m);
        FERRY_TRY(st);
    } else {
        for (uint64_t k = 0; k < v->merges->v.arr.n; k++) {
            if (!v->merge_kept[k]) continue;
            gguf_str m = v->merges->v.arr.strs[k];
            uint64_t at = (uint64_t)((const char *)memchr(m.ptr, ' ', m.len) - m.ptr); /* check_merge found it */
            sb_puts(sb, first ? "\n      " : ",\n      ");
            first = false;
            if (v->bpe->string_merges) { /* "a b" as the file has it */
                put_str(sb, m);
                continue;
            }
            sb_putc(sb, '[');
            put_str(sb, (gguf_str){m.ptr, at});
            sb_puts(sb, ", ");
            put_str(sb, (gguf_str){m.ptr + at + 1, m.len - at - 1});
            sb_putc(sb, ']');
        }
    }
    sb_puts(sb, first ? "]\n" : "\n    ]\n");
    return FERRY_OK;
}

static ferry_status put_model(const gguf_vocab *v, strbuf *sb)
{
    bool qwen = !v->spm && v->bpe->string_merges;
    sb_puts(sb, "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": ");
    if (v->spm && v->unk >= 0) put_str(sb, v->tokens[v->unk]);
    else sb_puts(sb, "null");
    sb_printf(sb, ",\n    \"continuing_subword_prefix\": %s,\n    \"end_of_word_suffix\": %s,\n", qwen ? "\"\"" : "null",
              qwen ? "\"\"" : "null");
    sb_printf(sb, "    \"fuse_unk\": %s,\n    \"byte_fallback\": %s,\n    \"ignore_merges\": %s,\n",
              v->spm ? "true" : "false", v->spm ? "true" : "false", !v->spm && v->bpe->ignore_merges ? "true" : "false");
    sb_puts(sb, "    \"vocab\": {");
    bool first = true;
    for (uint32_t i = 0; i < v->n; i++) {
        if (!(v->place[i] & IN_VOCAB)) continue;
        sb_puts(sb, first ? "\n      " : ",\n      ");
        put_str(sb, v->tokens[i]);
        sb_printf(sb, ": %u", i);
        first = false;
    }
    sb_puts(sb, first ? "},\n" : "\n    },\n");
    FERRY_TRY(put_merges(v, sb));
    sb_puts(sb, "  }\n");
    return FERRY_OK;
}

/* Appending to out, undone on failure. */
static ferry_status finish(strbuf *out, size_t start, ferry_status st, const char *label)
{
    if (st == FERRY_OK && out->oom) st = ferry_fail(FERRY_ERR_NOMEM, "%s: no memory for the tokenizer's JSON", label);
    if (st != FERRY_OK && out->len > start) out->len = start;
    return st;
}

ferry_status gguf_vocab_tokenizer_json(const gguf_file *g, const char *label, strbuf *out)
{
    gguf_vocab v;
    size_t start = out->len;
    ferry_status st = gguf_vocab_read(g, label, &v);
    if (st == FERRY_OK) {
        sb_puts(out, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n");
        put_added_tokens(&v, out);
        put_normalizer(&v, out);
        put_pre_tokenizer(&v, out);
        put_post_processor(&v, out);
        put_decoder(&v, out);
        st = put_model(&v, out);
        sb_puts(out, "}\n");
    }
    gguf_vocab_free(&v);
    return finish(out, start, st, label);
}

/* ---- tokenizer_config.json --------------------------------------------------------- */

/* bos/eos/unk/pad: the token's text, null when absent; SentencePiece files
 * (Llama 2's) write bos/eos/unk as AddedToken objects */
static void put_config_token(const gguf_vocab *v, strbuf *sb, const char *name, int64_t id, bool object, const char *end)
{
    sb_printf(sb, "  \"%s\": ", name);
    if (id < 0) sb_puts(sb, "null");
    else if (!object) put_str(sb, v->tokens[id]);
    else {
        sb_puts(sb, "{\"__type\": \"AddedToken\", \"content\": ");
        put_str(sb, v->tokens[id]);
        sb_puts(sb, ", \"lstrip\": false, \"normalized\": true, \"rstrip\": false, \"single_word\": false}");
    }
    sb_puts(sb, end);
}

static void put_added_decoder(const gguf_vocab *v, strbuf *sb)
{
    bool first = true;
    sb_puts(sb, "  \"added_tokens_decoder\": {");
    for (uint32_t i = 0; i < v->n; i++) {
        uint8_t p = v->place[i];
        if (!(p & ADDED)) continue;
        sb_printf(sb, "%s\n    \"%u\": {\"content\": ", first ? "" : ",", i);
        put_str(sb, v->tokens[i]);
        sb_printf(sb, ", \"lstrip\": false, \"normalized\": %s, \"rstrip\": false, \"single_word\": false, "
                      "\"special\": %s}",
                  p & NORMALIZED ? "true" : "false", p & SPECIAL ? "true" : "false");
        first = false;
    }
    sb_puts(sb, first ? "},\n" : "\n  },\n");
}

/* ARCH.context_length (general.architecture's), else NO_MAX_LENGTH */
static ferry_status put_max_length(const gguf_vocab *v, strbuf *sb)
{
    gguf_str arch;
    bool bad = false;
    uint64_t n;
    char key[96];
    sb_puts(sb, "  \"model_max_length\": ");
    if (gguf_get_str(v->g, "general.architecture", &arch, &bad) && arch.len < 64 &&
        !memchr(arch.ptr, 0, arch.len)) {
        snprintf(key, sizeof key, "%.*s.context_length", (int)arch.len, arch.ptr);
        if (gguf_get_uint(v->g, key, &n, &bad)) {
            sb_printf(sb, "%llu,\n", (unsigned long long)n);
            return FERRY_OK;
        }
    }
    if (bad) return gguf_vocab_mistyped(v);
    sb_puts(sb, NO_MAX_LENGTH ",\n");
    return FERRY_OK;
}

static ferry_status put_chat_template(const gguf_vocab *v, strbuf *sb)
{
    gguf_str t;
    bool bad = false;
    if (!gguf_get_str(v->g, KEY_TEMPLATE, &t, &bad)) return bad ? gguf_vocab_mistyped(v) : FERRY_OK;
    if (!gguf_vocab_utf8_valid(t.ptr, t.len) || memchr(t.ptr, 0, t.len))
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s is %s", v->label, KEY_TEMPLATE,
                          memchr(t.ptr, 0, t.len) ? "holding a NUL byte" : "not UTF-8");
    sb_puts(sb, ",\n  \"chat_template\": ");
    put_str(sb, t);
    return FERRY_OK;
}

static ferry_status put_config(const gguf_vocab *v, strbuf *sb)
{
    sb_printf(sb, "{\n  \"add_bos_token\": %s,\n  \"add_eos_token\": %s,\n", v->add_bos ? "true" : "false",
              v->add_eos ? "true" : "false");
    put_added_decoder(v, sb);
    put_config_token(v, sb, "bos_token", v->bos, v->spm, ",\n");
    sb_puts(sb, "  \"clean_up_tokenization_spaces\": false,\n");
    put_config_token(v, sb, "eos_token", v->eos, v->spm, ",\n");
    FERRY_TRY(put_max_length(v, sb));
    put_config_token(v, sb, "pad_token", v->pad, false, ",\n");
    sb_printf(sb, "  \"tokenizer_class\": \"%s\",\n", v->spm ? "LlamaTokenizer" : "PreTrainedTokenizerFast");
    put_config_token(v, sb, "unk_token", v->unk, v->spm, "");
    FERRY_TRY(put_chat_template(v, sb));
    sb_puts(sb, "\n}\n");
    return FERRY_OK;
}

ferry_status gguf_vocab_tokenizer_config_json(const gguf_file *g, const char *label, strbuf *out)
{
    gguf_vocab v;
    size_t start = out->len;
    ferry_status st = gguf_vocab_read(g, label, &v);
    if (st == FERRY_OK) st = put_config(&v, out);
    gguf_vocab_free(&v);
    return finish(out, start, st, label);
}
