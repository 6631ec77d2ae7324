/*
 * cli.h - the `ferry` subcommands. main.c parses the command line into a
 * ferry_config (config/) checking each flag against the command's list; each
 * cmd_* runs one command and returns its exit status: 0 ok, 1 runtime error,
 * 2 usage error, with exactly one line on stderr for an error.
 */
#ifndef FERRY_CLI_H
#define FERRY_CLI_H

#include "../config/config.h"
#include "../engine/base/status.h"
#include "../engine/engine.h"

#define EXIT_USAGE 2
#define EXIT_RUNTIME 1

/* Prints "ferry: <message>" as one line and returns the exit status. */
int cli_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints the current ferry_errmsg() as one line; returns 1 (runtime). */
int cli_fail(ferry_status st);

int cmd_generate(const ferry_config *cfg);
int cmd_chat(const ferry_config *cfg);
int cmd_inspect(const ferry_config *cfg);
int cmd_mkmodel(const ferry_config *cfg);
int cmd_bench(const ferry_config *cfg);
int cmd_plan(const ferry_config *cfg);
int cmd_serve(const ferry_config *cfg);
/* serve's checks of its settings alone and together (also run by `config
 * --print`): 0, or the exit status after the error is printed. Fills *eo. */
int serve_settings_check(const ferry_config *cfg, engine_opts *eo);
int cmd_export(const ferry_config *cfg);
int cmd_tokenize(const ferry_config *cfg);
int cmd_detokenize(const ferry_config *cfg);
int cmd_config(const ferry_config *cfg);

/* Resolves --model once for every command that takes it (model_dir.h): a
 * directory stays itself; a Hugging Face repo id org/name[@revision] becomes
 * its snapshot in the local cache, and gives a command with --name (serve)
 * its default name, the repo's name. cfg then points into *dir and *name
 * (malloc'd, or NULL; the caller frees them after the run). Returns 0, or
 * the exit status of the error it printed. */
int cli_model_resolve(ferry_config *cfg, bool sets_name, char **dir, char **name);

/* Fills the engine options from the settings every model-running command
 * shares (device, threads, placement, batch, context; budgets parsed);
 * returns 0, or the exit status of a usage error it printed. */
int cli_engine_opts(const ferry_config *cfg, engine_opts *eo);

#endif
