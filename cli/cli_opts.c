/*
 * cli_opts.c - what every model-running command builds from the same
 * settings: the model directory --model names, and the engine options
 * (device, threads, placement).
 */
#include <stdlib.h>
#include <string.h>

#include "../engine/weights/model_dir.h"
#include "cli.h"

int cli_model_resolve(ferry_config *cfg, bool sets_name, char **dir, char **name)
{
    *dir = *name = NULL;
    if (!cfg->model) return 0;
    if (model_dir_resolve(cfg->model, dir, name) != FERRY_OK) return cli_error(EXIT_RUNTIME, "%s", ferry_errmsg());
    cfg->model = *dir;
    if (sets_name && *name && !config_given(cfg, SETTING_name)) cfg->name = *name;
    return 0;
}

int cli_engine_opts(const ferry_config *cfg, engine_opts *eo)
{
    engine_opts_init(eo);
    eo->model_dir = cfg->model;
    eo->device = cfg->device;
    eo->threads = (int)cfg->threads;
    eo->cpu_isa = cfg->cpu_isa;
    eo->cpu_activations = cfg->cpu_activations;
    eo->offload_dir = cfg->offload_dir;
    eo->max_seqs = (int)cfg->batch;
    eo->max_ctx = (int)cfg->context;
    eo->kv_memory = cfg->kv_memory;
    eo->expert_cache = cfg->expert_cache;
    eo->expert_prefetch = cfg->expert_prefetch;
    eo->verify_reads = cfg->verify_reads;
    eo->group_size = (int)cfg->group_size;
    eo->prefetch = (int)cfg->prefetch;
    eo->max_step_tokens = (int)cfg->max_step_tokens;
    if (plan_parse_budgets(cfg->max_memory, eo->budget) != FERRY_OK) return cli_error(EXIT_USAGE, "%s", ferry_errmsg());
    eo->budget_weights_only = cfg->max_memory_scope && !strcmp(cfg->max_memory_scope, "weights");
    if (convert_opts_parse(cfg->weights_dtype, cfg->quantize, cfg->quantize_head, &eo->convert) != FERRY_OK)
        return cli_error(EXIT_USAGE, "%s", ferry_errmsg());
    return 0;
}
