/*
 * export.h - writing the weights of a loaded engine out as a Hugging Face
 * checkpoint, while it serves.
 *
 * An export reads every group once, from wherever it lives (device memory,
 * host memory, a blob of the offload dir), on a thread of its own: the
 * engine thread is never blocked by it, and outputs of steps running
 * meanwhile are unchanged. Memory beyond serving is bounded by one group's
 * bytes plus one write buffer.
 *
 * Layouts:
 *   EXPORT_CONVERTED - the weights as ferry holds them, under the checkpoint's
 *     tensor names: dtype-converted weights as plain tensors, int8/int4
 *     weights in compressed-tensors' layout (pack-quantized: NAME.weight_packed
 *     I32, NAME.weight_shape I64 [2], NAME.weight_scale) with the matching
 *     quantization_config in config.json, so ferry loads it without
 *     converting again. A GGUF's blocks, which no Hugging Face format
 *     holds, are written dequantized to f32 (exact: every block value is
 *     an f32).
 *   EXPORT_ORIGINAL - the checkpoint's names, shapes and dtypes (quantized
 *     weights dequantized: lossy; a GGUF's blocks to f32), loadable by
 *     plain transformers. For a GGUF model, the checkpoint is the one it
 *     stands for (gguf_hf.h: its config.json and tokenizer files).
 *
 * The output is model-0000k-of-0000n.safetensors, model.safetensors.index.json
 * and config.json (generation_config.json, tokenizer files and the chat
 * template copied when the model dir has them). It is written into a
 * temporary directory under the export root, every file fsynced, the index
 * last, then renamed to root/name and the root fsynced: a process killed at
 * any moment leaves no directory under the final name, and a previous export
 * of that name intact until the new one replaces it. Names match
 * [A-Za-z0-9._-]{1,128} and do not start with '.'; everything is opened
 * relative to the root's descriptor without following symlinks; the rename
 * publishes only the directory the job created (its inode, held open since
 * creation: a temporary renamed away and replaced mid-job fails the job,
 * "... was replaced ...", and nothing is published). An export
 * holds a marker file, .ferry-export.json: overwrite replaces only a
 * directory that has one.
 */
#ifndef FERRY_EXPORT_H
#define FERRY_EXPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"

#define EXPORT_NAME_MAX 128 /* [A-Za-z0-9._-], not starting with '.' */

typedef enum { EXPORT_CONVERTED, EXPORT_ORIGINAL } export_layout;

typedef struct export_status export_status;

/* Called once on the job's thread when a started job has ended (done,
 * failed or cancelled), with its final status: a caller learns of the end
 * when it happens, not when it next polls. It must not wait for the job
 * (export_job_wait joins this thread). Never called when export_start
 * fails. */
typedef void (*export_end_fn)(void *arg, const export_status *final);

typedef struct {
    const char *root;         /* the export root (--export-dir); must exist */
    const char *name;         /* the directory created under it */
    export_layout layout;
    uint64_t max_shard_bytes; /* 0: 5 GB, transformers' default */
    bool overwrite;           /* replace an existing root/name, if it is an export of ferry's (its
                               * .ferry-export.json marker); else an existing name is FERRY_ERR_INVALID */
    export_end_fn on_end;     /* optional */
    void *on_end_arg;
} export_opts;

typedef enum { EXPORT_QUEUED, EXPORT_RUNNING, EXPORT_DONE, EXPORT_FAILED, EXPORT_CANCELLED } export_state;

struct export_status {
    export_state state;
    double progress;          /* 0..1, by bytes */
    uint64_t bytes_written;
    uint64_t bytes_total;
    char error[FERRY_MSG_MAX]; /* EXPORT_FAILED: what went wrong */
};

typedef struct export_job export_job;

/* Checks the options (name, root, free space: FERRY_ERR_TOO_LARGE when the
 * root's file system cannot hold it) and starts the export on a thread of
 * its own; *out is the job. The engine (and the model dir it was
 * opened from) must outlive the job. */
ferry_status export_start(engine *e, const export_opts *o, export_job **out);
export_status export_job_status(export_job *j);
/* Asks the job to stop; it removes its partial output and ends CANCELLED. */
void export_job_cancel(export_job *j);
/* Waits for the job to end and returns its final status. */
export_status export_job_wait(export_job *j);
/* Frees an ended job (after export_job_wait). */
void export_job_free(export_job *j);

/* Removes the temporaries that exports of processes no longer running left
 * under root (a server calls it at start; export_start does too). */
void export_remove_stale(const char *root);

/* "converted" / "original"; false when s is neither. */
bool export_layout_parse(const char *s, export_layout *out);
const char *export_state_name(export_state s);

#endif
