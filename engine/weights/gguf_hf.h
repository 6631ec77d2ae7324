/*
 * gguf_hf.h - the Hugging Face checkpoint a GGUF file stands for, so that
 * `--model FILE.gguf` is served as a checkpoint directory is: the same
 * config parser, tokenizer, tensor table, placements and exports.
 *
 * A GGUF model path is a regular file named *.gguf (model_dir_resolve also
 * takes a directory without config.json holding exactly one; of a split
 * model, the first part). Its files, as
 * model_dir.c serves them under the path:
 *   config.json            from general.architecture and the ARCH.* keys
 *                          (llama -> LlamaForCausalLM, or with
 *                          expert_count MixtralForCausalLM; qwen2, qwen3,
 *                          qwen3moe); a key whose meaning ferry would not
 *                          keep (another rope scaling, rope_freqs.weight,
 *                          per-layer head counts) is refused naming it
 *   generation_config.json bos, eos (and eot/eom as more eos) ids
 *   tokenizer.json,        from tokenizer.ggml.* (gguf_vocab.h)
 *   tokenizer_config.json
 * and the tensors (gguf_hf_checkpoint_open) under HF names, shaped [rows,
 * cols]. F32/F16/BF16 tensors, and the blocks of the embedding, the linear
 * layers and the head (st_tensor.blocks: bound as WQ_GGUF weights, computed
 * from as stored, the embedding's rows dequantized as gathered), point into
 * the GGUF's mapping. What must change is written once
 * into an unlinked temporary file ($TMPDIR, else /tmp) and mapped like a
 * checkpoint file, so that its pages are the page cache's, not the heap's
 * (the store releases checkpoint pages it has copied): the blocks of the
 * other tensors (a router, norms) dequantized to f32 (gguf_quant.h),
 * and llama's q_proj/k_proj rows, whose rotary halves llama.cpp's converter
 * interleaved (LlamaModel.permute), put back in order, blocks moved as
 * whole rows. A sparse
 * layer's experts, merged in the file into one [experts, rows, cols] tensor
 * per kind (ffn_gate_exps, ...), are each a slice of it: a tensor (and a
 * unit) of their own, as in a Hugging Face checkpoint. A model split by
 * gguf-split (PREFIX-00001-of-0000N.gguf ...: split.count, split.no) is
 * named by its first part; the parts are opened, checked and mapped as
 * checkpoint files, the metadata read from the first.
 */
#ifndef FERRY_GGUF_HF_H
#define FERRY_GGUF_HF_H

#include <stdbool.h>
#include <stddef.h>

#include "../base/json.h"
#include "../base/status.h"
#include "gguf.h"
#include "safetensors.h"

/* Whether path names a GGUF model: a regular file whose name ends .gguf. */
bool gguf_hf_is_model(const char *path);

/* A directory holding no config.json and exactly one *.gguf: *file is its
 * path (malloc'd). FERRY_ERR_NOT_FOUND when it holds none (not a GGUF
 * directory); FERRY_ERR_INVALID, naming them, when it holds several. */
ferry_status gguf_hf_find_in_dir(const char *dir, char **file);

/* Whether the GGUF model at path stands for file `name` (config.json, ...). */
bool gguf_hf_has(const char *path, const char *name);
/* The text of file `name` made from the GGUF at path, NUL-terminated and
 * malloc'd; FERRY_ERR_NOT_FOUND for a name it does not stand for. */
ferry_status gguf_hf_read(const char *path, const char *name, char **text, size_t *len);

/* config.json's text for g (label names the file in errors). */
ferry_status gguf_hf_config_json(const gguf_file *g, const char *label, strbuf *out);

/* Fills the zeroed ck with the GGUF at path: files[0..n) its n parts
 * (gguf_parts), files[n] (when some tensor had to change) the converted
 * data; the tensors sorted by HF name. st_checkpoint_close frees it all. */
ferry_status gguf_hf_checkpoint_open(const char *path, st_checkpoint *ck);
void gguf_hf_checkpoint_free(st_checkpoint *ck);

#endif
