/*
 * main.c - the `ferry` command line: picks the subcommand, reads its settings
 * (config/settings.def) from a config file, the environment and its flags -
 * a command reads only the settings listed for it here - resolves --model
 * once for every command that takes it (a directory or a Hugging Face repo
 * id) and runs it.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define S(x) SETTING_##x
#define END (-1)
#define EVERY (-2)
#define PLACEMENT S(max_memory), S(max_memory_scope), S(offload_dir), S(group_size), S(prefetch), S(expert_cache), S(expert_prefetch), S(max_step_tokens), S(verify_reads), \
                  S(weights_dtype), S(quantize), S(quantize_head)

typedef struct {
    const char *name;
    int (*run)(const ferry_config *cfg);
    const char *summary;
    int settings[48]; /* END-terminated, or {EVERY}; every command reads --config too */
    int required[4];  /* END-terminated */
} command;

static const command k_commands[] = {
    {"generate", cmd_generate, "generate tokens from prompt token ids (--prompt-ids) or text (--prompt)",
     {S(model), S(prompt_ids), S(prompt), S(max_new_tokens), S(temperature), S(top_k), S(top_p), S(seed), S(device),
      S(threads), S(cpu_isa), S(cpu_activations), S(json), S(dump_logits), PLACEMENT, END},
     {S(model), END}},
    {"chat", cmd_chat, "chat with the model in the terminal (its chat template; answers stream as they are generated)",
     {S(model), S(system), S(max_new_tokens), S(temperature), S(top_k), S(top_p), S(seed), S(device), S(threads), S(cpu_isa), S(cpu_activations),
      S(context), S(kv_memory), S(json), PLACEMENT, END},
     {S(model), END}},
    {"inspect", cmd_inspect, "describe a checkpoint: architecture, tensors, bytes by dtype, and after a conversion",
     {S(model), S(json), S(weights_dtype), S(quantize), S(quantize_head), END},
     {S(model), END}},
    {"mkmodel", cmd_mkmodel, "write a random Hugging Face-layout checkpoint (demos, tests, benchmarks)",
     {S(out), S(arch), S(preset), S(dtype), S(seed), S(shard_size), S(layers), S(kv_heads), S(tied),
      S(sliding_window), S(tokenizer), END},
     {S(out), END}},
    {"plan", cmd_plan, "show where each group of layers would live (device, host, disk) and the memory needed",
     {S(model), S(device), S(batch), S(context), S(kv_memory), S(json), PLACEMENT, END},
     {S(model), END}},
    {"bench", cmd_bench, "measure prefill and decode speed, streaming and the memory roofline",
     {S(model), S(device), S(threads), S(cpu_isa), S(cpu_activations), S(batch), S(context), S(kv_memory), S(steps), S(prompt_len), S(decode_input), S(json), S(trace), PLACEMENT, END},
     {S(model), END}},
    {"export", cmd_export, "write the loaded (converted) weights as a Hugging Face checkpoint, read from wherever they live",
     {S(model), S(out), S(layout), S(max_shard_size), S(overwrite), S(device), S(threads), S(cpu_isa), S(cpu_activations), S(json), PLACEMENT, END},
     {S(model), S(out), END}},
    {"tokenize", cmd_tokenize, "text -> token ids with the checkpoint's tokenizer.json (ids space separated, or --json)",
     {S(model), S(text), S(file), S(add_special), S(json), END},
     {S(model), END}},
    {"detokenize", cmd_detokenize, "token ids -> text with the checkpoint's tokenizer.json (special tokens kept)",
     {S(model), S(ids), S(json), END},
     {S(model), S(ids), END}},
    {"serve", cmd_serve, "serve the model over HTTP (KServe v2, Triton generate, OpenAI /v1, Prometheus metrics) and gRPC (KServe v2)",
     {S(model), S(device), S(threads), S(cpu_isa), S(cpu_activations), S(batch), S(context), S(kv_memory), S(http_port), S(grpc_port), S(drain_timeout), S(host), S(name), S(max_body),
      S(max_header), S(max_queued), S(request_memory), S(request_timeout), S(connection_timeout), S(max_connections),
      S(max_connections_per_ip), S(grpc_max_streams), S(grpc_max_resets), S(max_prompt_tokens), S(max_output_tokens), S(max_text_bytes), S(override_generation_config), S(admin_port), S(admin_host), S(admin_token), S(admin_token_file), S(admin_max_connections), S(export_dir), PLACEMENT, END},
     {S(model), END}},
    {"config", cmd_config, "print the effective configuration (--print): each setting's value and where it came from",
     {EVERY}, {END}},
};
#define N_COMMANDS (int)(sizeof k_commands / sizeof k_commands[0])

/* Settings that name a file or directory. An empty one is a usage error
 * naming it: "" would otherwise become paths like "/config.json", or an
 * error about whatever was derived from it (serve's --name from --model). */
static const int k_path_settings[] = {S(config), S(model), S(out), S(offload_dir), S(dump_logits), S(trace), S(admin_token_file),
                                      S(export_dir), S(tokenizer), S(file)};

int cli_error(int code, const char *fmt, ...)
{
    char msg[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (char *p = msg; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    fprintf(stderr, "ferry: %s\n", msg);
    return code;
}

int cli_fail(ferry_status st)
{
    (void)st;
    return cli_error(EXIT_RUNTIME, "%s", ferry_errmsg());
}

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry <command> [--flag value ...]\n\ncommands:\n");
    for (int i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-10s %s\n", k_commands[i].name, k_commands[i].summary);
    fprintf(f, "\n'ferry <command> --help' lists a command's flags.\n");
}

static bool accepts(const command *c, int id)
{
    if (c->settings[0] == EVERY || id == S(config)) return true;
    for (int i = 0; c->settings[i] != END; i++)
        if (c->settings[i] == id) return true;
    return false;
}

static void command_help(const command *c)
{
    int ids[SETTING_COUNT], n = 0;
    for (int id = 0; id < SETTING_COUNT; id++)
        if (accepts(c, id)) ids[n++] = id;
    printf("usage: ferry %s [flags]\n%s\n\n"
           "Each setting is also read from the environment (FERRY_ and its name in upper case) and from\n"
           "a JSON config file (--config); flags override the environment, which overrides the file.\n\n"
           "flags:\n",
           c->name, c->summary);
    config_print_help(stdout, ids, n);
}

static bool is_bool_word(const char *s)
{
    return !strcmp(s, "true") || !strcmp(s, "false") || !strcmp(s, "1") || !strcmp(s, "0") || !strcmp(s, "yes") ||
           !strcmp(s, "no");
}

/* One flag: its setting and its text, applied after the file and the
 * environment (flags override them). Returns 0 or the exit status. */
static int parse_flag(const command *c, int argc, char **argv, int *i, int *id, const char **value)
{
    const char *arg = argv[*i];
    if (strncmp(arg, "--", 2) != 0 || !arg[2])
        return cli_error(EXIT_USAGE, "%s: unexpected argument '%s' (flags are --name value)", c->name, arg);
    char name[64];
    const char *eq = strchr(arg, '=');
    size_t len = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
    if (len >= sizeof name) return cli_error(EXIT_USAGE, "%s: unknown flag '%.80s'", c->name, arg);
    memcpy(name, arg + 2, len);
    name[len] = '\0';
    char flag[64];
    *id = config_find(name);
    if (*id >= 0 && !accepts(c, *id))
        return cli_error(EXIT_USAGE, "%s: unknown flag '--%s' (ferry %s does not take it; see 'ferry %s --help')",
                         c->name, name, c->name, c->name);
    if (*id < 0) {
        int near = config_closest(name, SETTING_SECRET);
        if (near >= 0 && accepts(c, near))
            return cli_error(EXIT_USAGE, "%s: unknown flag '--%s' (did you mean %s?)", c->name, name,
                             config_flag(near, flag, sizeof flag));
        return cli_error(EXIT_USAGE, "%s: unknown flag '--%s' (see 'ferry %s --help')", c->name, name, c->name);
    }
    if (config_settings[*id].where == SETTING_SECRET) {
        char env[96];
        return cli_error(EXIT_USAGE,
                         "%s: %s is a secret and not taken as a flag (the process list and shell history show flags): "
                         "set %s, or %s in a --config file only you can read",
                         c->name, config_flag(*id, flag, sizeof flag), config_env(*id, env, sizeof env),
                         config_settings[*id].name);
    }
    if (eq) {
        *value = eq + 1;
    } else if (config_settings[*id].type == SET_BOOL) {
        *value = (*i + 1 < argc && is_bool_word(argv[*i + 1])) ? argv[++*i] : "true";
    } else {
        if (*i + 1 >= argc) return cli_error(EXIT_USAGE, "%s: flag '--%s' needs a value", c->name, name);
        *value = argv[++*i];
    }
    return 0;
}

/* Settings from, lowest precedence first: defaults, the config file (--config
 * or FERRY_CONFIG), the environment, the flags. */
static int parse_args(const command *c, int argc, char **argv, ferry_config *cfg)
{
    config_defaults(cfg);
    int *ids = calloc((size_t)argc + 1, sizeof *ids);
    const char **values = calloc((size_t)argc + 1, sizeof *values);
    int n = 0, rc = 0;
    if (!ids || !values) rc = cli_error(EXIT_RUNTIME, "out of memory");
    const char *file = getenv("FERRY_CONFIG");
    for (int i = 0; !rc && i < argc; i++) {
        if (!(rc = parse_flag(c, argc, argv, &i, &ids[n], &values[n])) && ids[n] == S(config)) file = values[n];
        n++;
    }
    if (!rc && file && *file && config_load_file(cfg, file) != FERRY_OK)
        rc = cli_error(EXIT_USAGE, "%s: %s", c->name, ferry_errmsg());
    bool wanted[SETTING_COUNT];
    for (int id = 0; id < SETTING_COUNT; id++) wanted[id] = accepts(c, id);
    if (!rc && config_load_env(cfg, wanted) != FERRY_OK) rc = cli_error(EXIT_USAGE, "%s: %s", c->name, ferry_errmsg());
    for (int k = 0; !rc && k < n; k++)
        if (config_set(cfg, ids[k], values[k], SOURCE_FLAG, 0) != FERRY_OK)
            rc = cli_error(EXIT_USAGE, "%s: %s", c->name, ferry_errmsg());
    free(ids);
    free(values);
    if (rc) return rc;
    char flag[64], env[96];
    for (int i = 0; c->required[i] != END; i++) {
        if (!config_given(cfg, c->required[i]))
            return cli_error(EXIT_USAGE, "%s: missing required flag %s (or %s, or \"%s\" in a --config file)",
                             c->name, config_flag(c->required[i], flag, sizeof flag),
                             config_env(c->required[i], env, sizeof env), config_settings[c->required[i]].name);
    }
    for (size_t i = 0; i < sizeof k_path_settings / sizeof k_path_settings[0]; i++) {
        int id = k_path_settings[i];
        const char *v = NULL;
        switch (id) { /* the settings are struct fields: no lookup by id */
        case S(config): v = cfg->config; break;
        case S(model): v = cfg->model; break;
        case S(out): v = cfg->out; break;
        case S(offload_dir): v = cfg->offload_dir; break;
        case S(dump_logits): v = cfg->dump_logits; break;
        case S(trace): v = cfg->trace; break;
        case S(admin_token_file): v = cfg->admin_token_file; break;
        case S(export_dir): v = cfg->export_dir; break;
        case S(tokenizer): v = cfg->tokenizer; break;
        case S(file): v = cfg->file; break;
        }
        char where[512];
        if (config_given(cfg, id) && v && !*v)
            return cli_error(EXIT_USAGE, "%s: %s must not be empty (it names a file or directory)", c->name,
                             config_where(cfg, id, where, sizeof where));
    }
    return 0;
}

/* Every command's results go to stdout through stdio, where a failed write
 * (a full disk, /dev/full) shows only when the buffer is flushed - after
 * main would have returned 0. So each run ends here: the results reached
 * stdout, or the exit status is 1 with one line saying so. */
static int finish_stdout(int rc)
{
    errno = 0;
    bool flush_failed = fflush(stdout) != 0;
    int err = errno;
    if (!flush_failed && !ferror(stdout)) return rc;
    if (rc) return rc; /* the command failed and said why already: one line */
    return cli_error(EXIT_RUNTIME, "stdout: %s", flush_failed && err ? strerror(err) : "write error");
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return finish_stdout(argc < 2 ? EXIT_USAGE : 0);
    }
    for (int i = 0; i < N_COMMANDS; i++) {
        const command *c = &k_commands[i];
        if (strcmp(argv[1], c->name) != 0) continue;
        for (int k = 2; k < argc; k++)
            if (!strcmp(argv[k], "--help") || !strcmp(argv[k], "-h")) {
                command_help(c);
                return finish_stdout(0);
            }
        ferry_config cfg;
        int rc = parse_args(c, argc - 2, argv + 2, &cfg);
        if (rc) {
            config_free(&cfg);
            return rc;
        }
        char *model_dir = NULL, *model_name = NULL;
        if (c->settings[0] != EVERY && accepts(c, S(model)) &&
            (rc = cli_model_resolve(&cfg, accepts(c, S(name)), &model_dir, &model_name))) {
            config_free(&cfg);
            return rc;
        }
        rc = finish_stdout(c->run(&cfg));
        config_free(&cfg);
        free(model_dir);
        free(model_name);
        return rc;
    }
    return cli_error(EXIT_USAGE, "unknown command '%s' (try 'ferry --help')", argv[1]);
}
