/*
 * model_dir.h - the model directory: what --model names (a directory, or a
 * repository of the Hugging Face cache named org/name[@revision]) and which
 * files under it may be read.
 *
 * The confinement rule is here, once, and every reader of a model's files
 * goes through model_dir_open / model_dir_read: config.json, the safetensors
 * files and their index, and the tokenizer, chat template and generation
 * config files (export copies them; the tokenizer and the server read them).
 *   1. A file is named by a bare name: not empty, no '/', not "." or "..".
 *   2. Resolved (every symlink followed), it must lie directly inside the
 *      model directory - or, when the model directory is a snapshot of the
 *      Hugging Face cache, <cache>/models--org--name/snapshots/<rev>/, whose
 *      files are symlinks to ../../blobs/<sha256>, anywhere inside that
 *      repository's folder models--org--name/. A link leading anywhere else
 *      (another repository's blobs, /etc) is refused with an error naming
 *      the file and where it leads.
 *   3. What is opened is what was checked: the opened file must be the
 *      resolved one (same device and inode).
 * A GGUF model (gguf_hf.h: `dir` is the .gguf file) holds the files its
 * metadata stands for - config.json, generation_config.json and the
 * tokenizer's - made from it when opened or read (an open gives an
 * anonymous file); nothing else.
 */
#ifndef FERRY_MODEL_DIR_H
#define FERRY_MODEL_DIR_H

#include <stdbool.h>
#include <stddef.h>

#include "../base/status.h"

/* Opens dir/name read-only (O_NONBLOCK: a FIFO must not hang the open)
 * after the rule above; *fd is the descriptor and *path (malloc'd) dir/name
 * for messages. FERRY_ERR_NOT_FOUND when there is no such file or the link
 * leads to nothing (the message says where it leads); FERRY_ERR_INVALID
 * when the name or where it leads breaks the rule. Nothing to free on error. */
ferry_status model_dir_open(const char *dir, const char *name, int *fd, char **path);

/* Reads a small file (at most 100 MB: configs, indexes, tokenizers) opened
 * by model_dir_open into a NUL-terminated malloc'd buffer; errors name
 * dir/name. */
ferry_status model_dir_read(const char *dir, const char *name, char **text, size_t *len);

/* Whether dir holds an entry called name (a link counts, even one leading
 * to nothing: opening it says what is wrong). */
bool model_dir_has(const char *dir, const char *name);

/* What --model names, resolved once for every command:
 *   - an existing directory: itself - or, when it holds no config.json and
 *     exactly one *.gguf, that file (several: FERRY_ERR_INVALID naming them);
 *   - else, when spec looks like a Hugging Face repo id "org/name" (one '/',
 *     each part letters, digits, '-', '_', '.', no "--" or ".."), with an
 *     optional "@revision": its snapshot in the cache, found offline. The
 *     caches looked in, in huggingface_hub's order: $HF_HUB_CACHE, then
 *     $HF_HOME/hub, then $XDG_CACHE_HOME/huggingface/hub or
 *     ~/.cache/huggingface/hub; the first holding models--org--name is used.
 *     The revision (default "main") is a commit hash (40 hex digits) used as
 *     is, or a ref name whose commit refs/<revision> holds;
 *     snapshots/<commit>/ must exist (a snapshot without config.json
 *     holding one .gguf is that file, as a directory is). Not found:
 *     FERRY_ERR_NOT_FOUND naming
 *     the repo id, the revision and every place looked at;
 *   - anything else: itself (opening config.json then says what is missing).
 * *dir is malloc'd; *repo_name (malloc'd) is the repo id's name part
 * ("Llama-3.2-1B" for meta-llama/Llama-3.2-1B@main), NULL for a directory. */
ferry_status model_dir_resolve(const char *spec, char **dir, char **repo_name);

#endif
