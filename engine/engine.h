/*
 * engine.h - a loaded model ready to run steps: the API every front end and
 * tool uses (the struct is engine.c's own).
 *
 * engine_open reads the checkpoint, asks the backend once whether its
 * memory is unified and how much it has, plans placement (plan.h: every
 * placement decision, defaults included, is the planner's, so `ferry plan`
 * shows what `serve` runs), loads the store and starts the pipeline.
 * engine_step runs one forward pass over a batch (batch.h) - any mix of
 * prompt chunks and single decode rows - and returns the logits of the last
 * row of every sequence: one pass over the weights serves the whole batch.
 * Generation (sampling, continuous batching, stop conditions) is the
 * scheduler's (scheduler.h), the one generation path of every front end.
 */
#ifndef FERRY_ENGINE_H
#define FERRY_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "batch.h"
#include "plan.h"
#include "request.h"
#include "stats.h"
#include "weights/convert.h"

typedef struct engine engine;
typedef struct backend backend;
typedef struct store store;

typedef struct {
    const char *model_dir;
    const char *device;      /* cpu, cpu-split or cuda */
    int threads;             /* CPU workers; 0 = all cores */
    const char *cpu_isa;     /* CPU kernels: auto (NULL), avx2, avx512 (backend_opts.isa) */
    const char *cpu_activations; /* CPU: exact (NULL) or int8 (backend_opts.activations) */
    int max_seqs;            /* sequences the KV cache holds */
    int max_ctx;             /* positions per sequence; 0 = the planner's default (plan.h) */
    int max_step_tokens;     /* most token rows in one step */
    uint64_t kv_memory;      /* bytes of the KV pool; 0 = the planner's default (plan.h) */
    uint64_t expert_cache;   /* bytes of expert slots (plan.h); 0 = the least */
    bool expert_prefetch;    /* fetch the next sparse layer's predicted experts early (experts.h) */
    uint64_t budget[2];      /* device, host memory budgets (PLAN_UNLIMITED; plan.h) */
    bool budget_weights_only; /* --max-memory-scope weights: they bound the weights alone (plan_place) */
    const char *offload_dir; /* disk tier; needed when the budgets do not hold every group */
    int group_size;
    int prefetch;
    bool verify_reads;       /* check every read of the disk tier against its CRC-32C */
    convert_opts convert;    /* --weights-dtype, --quantize (weights/convert.h) */
    int max_prompt;          /* a server's per-request caps (engine_limits); 0 = none */
    int max_new;
} engine_opts;

/* The engine's own defaults, no model: the CPU backend, a thread per core,
 * ENGINE_DEFAULT_MAX_SEQS sequences, the model's context, steps of
 * ENGINE_DEFAULT_MAX_STEP_TOKENS rows, one layer a group, the planner's
 * read-ahead, reads verified, budgets unlimited, weights as stored. The
 * commands fill every field from their settings (config/settings.def,
 * whose defaults test_config checks equal these). */
#define ENGINE_DEFAULT_MAX_SEQS 64
#define ENGINE_DEFAULT_MAX_STEP_TOKENS 512
void engine_opts_init(engine_opts *o);

ferry_status engine_open(const engine_opts *opts, engine **out);
void engine_close(engine *e);

/* The plan engine_open would make, without loading weights: the same
 * checks and decisions (the backend is created to ask it, then freed).
 * *po receives the options the plan was made with. */
ferry_status engine_plan(const engine_opts *opts, plan *out, plan_opts *po);

/* What the model and the engine are. */
typedef struct {
    const char *arch;        /* config.json "architectures" */
    int n_layers, dim;
    const char *backend;     /* the backend's name */
    const char *kernels;     /* its kernels' instruction set (the CPU backends: avx2, avx512), or NULL */
    bool unified;            /* device memory is host memory */
    bool head_from_embed;    /* a tied checkpoint whose head is held apart (--quantize-head, convert_config) */
} engine_info;

engine_info engine_get_info(const engine *e);
engine_limits engine_get_limits(const engine *e);
const plan *engine_get_plan(const engine *e);
/* The conversion the weights were loaded with (convert_describe names it). */
convert_opts engine_get_convert(const engine *e);
pipeline_stats engine_pipeline_stats(engine *e);
/* The experts' figures; false (and zeros) for a model without experts. */
bool engine_expert_stats(engine *e, expert_stats *out);

/* The paged KV cache (kv.h): a KV sequence holds blocks for the positions
 * reserved for it until it is released. engine_kv_reserve makes room for
 * positions 0 .. n_positions - 1 (FERRY_ERR_BUSY when the pool has too few
 * free blocks, nothing taken; FERRY_ERR_INVALID past the context). Between
 * steps, from the thread that runs them. */
typedef struct {
    int block_positions;     /* positions per block */
    int total_blocks, free_blocks;
} engine_kv;

ferry_status engine_kv_reserve(engine *e, int kv_seq, int n_positions);
void engine_kv_release(engine *e, int kv_seq);
engine_kv engine_kv_info(const engine *e);

/* One forward pass. Every token id must be < vocab and every sequence must
 * fit the context and the positions reserved for it (checked).
 * logits_out: host [b->n_seqs, vocab]. */
ferry_status engine_step(engine *e, const batch *b, float *logits_out);

/* Between steps, after one failed: rebuilds from the checkpoint every blob
 * of the offload dir that a read found damaged (checksum mismatch, or
 * shorter than its group), with the pipeline quiet, and says so on stderr.
 * Returns the first failure (the blobs stay damaged; the next failed step
 * tries again). */
ferry_status engine_repair(engine *e);

/* Weight bytes one decode step of n_seqs sequences reads: every layer and
 * the head in full, n_seqs embedding rows (for rooflines). */
uint64_t engine_decode_weight_bytes(const engine *e, int n_seqs);

/* For tools that measure the tiers (`ferry bench`) and export: the backend
 * and the store the engine runs on. */
backend *engine_backend(engine *e);
const store *engine_store(const engine *e);
/* The checkpoint directory the engine was opened from (config.json,
 * tokenizer files), for export. */
const char *engine_model_dir(const engine *e);

/* A Chrome trace of the pipeline from now on (pipeline.h). */
ferry_status engine_trace_start(engine *e, size_t max_events);
ferry_status engine_trace_write(engine *e, const char *path);

#endif
