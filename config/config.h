/*
 * config.h - ferry's settings as a struct generated from settings.def, read
 * from four sources: defaults, a JSON config file, FERRY_* environment
 * variables and command-line flags, each overriding the ones before. Every
 * value passes the same parser and the same range check whatever its source,
 * and an error names where the value came from ("--threads", "FERRY_THREADS"
 * or "ferry.json:7: threads"), suggesting the closest setting for an unknown
 * name. The struct remembers each setting's source for `ferry config --print`.
 */
#ifndef FERRY_CONFIG_H
#define FERRY_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>

#include "../engine/base/arena.h"
#include "../engine/base/json.h"
#include "../engine/base/status.h"
#include "../engine/gen_params.h"

typedef enum { SET_STR, SET_INT, SET_FLOAT, SET_BOOL, SET_SIZE, SET_U64 } setting_type;

/* Where a setting may come from (settings.def's `where`). */
enum { SETTING_ANY = 0, SETTING_SECRET = 1, SETTING_NOFILE = 2 };

typedef const char *setting_STR;
typedef int64_t setting_INT;
typedef double setting_FLOAT;
typedef bool setting_BOOL;
typedef uint64_t setting_SIZE;
typedef uint64_t setting_U64;

typedef enum {
#define FERRY_SETTING(name, type, def, valid, where, doc) SETTING_##name,
#include "settings.def"
#undef FERRY_SETTING
    SETTING_COUNT
} setting_id;

/* Precedence order: a source overrides every source before it. */
typedef enum { SOURCE_DEFAULT, SOURCE_FILE, SOURCE_ENV, SOURCE_FLAG } setting_source;

typedef struct ferry_config {
#define FERRY_SETTING(name, type, def, valid, where, doc) setting_##type name;
#include "settings.def"
#undef FERRY_SETTING
    setting_source source[SETTING_COUNT]; /* where each value came from              */
    int line[SETTING_COUNT];              /* SOURCE_FILE: the line of its key         */
    const char *config_file;              /* the config file read, or NULL           */
    mem_arena strings;                    /* the file's string values                */
} ferry_config;

typedef struct {
    const char *name;
    setting_type type;
    const char *def;
    const char *valid; /* "LO..HI", "a|b|c" or NULL */
    int where;         /* SETTING_ANY, _SECRET or _NOFILE */
    const char *doc;
} setting_def;

extern const setting_def config_settings[SETTING_COUNT];

/* Set by a file, the environment or a flag (not its default). */
static inline bool config_given(const ferry_config *cfg, int id) { return cfg->source[id] != SOURCE_DEFAULT; }

/* The field of setting id (a setting_STR, setting_INT, ... by its type). */
const void *config_field(const ferry_config *cfg, int id);

/* Fills every setting with its default; the config owns nothing yet. */
void config_defaults(ferry_config *cfg);
/* Frees what config_load_file kept (the file's strings). */
void config_free(ferry_config *cfg);

/* Looks a setting up by name ('-' and '_' are the same); -1 if unknown. */
int config_find(const char *name);
/* The setting whose name is nearest to name (edit distance, '-' and '_'
 * the same, a swap of neighbours one edit), when near enough to be a likely
 * typo, leaving out settings whose `where` is skip_where; -1 otherwise. */
int config_closest(const char *name, int skip_where);
/* Where setting id's value came from, as an error should name it:
 * "--threads", "FERRY_THREADS", "ferry.json:7: threads" or "threads". */
const char *config_where(const ferry_config *cfg, int id, char *buf, size_t cap);

/* The settings' values of the generation parameters that have a setting
 * (engine/gen_params.def), given[] where cfg's was set rather than
 * defaulted: the CLI's flags. */
void config_gen_params(const ferry_config *cfg, gen_params *p);
/* The settings' defaults, nothing given: where every KServe request starts. */
void config_gen_defaults(gen_params *p);

/* Parses value for setting id, checks it against its valid range and
 * records source (line: the file's line, else 0). The error names the source:
 * "--threads: must be in 0..1024 (got 2000)". */
ferry_status config_set(ferry_config *cfg, int id, const char *value, setting_source source, int line);

/* Reads a JSON config file (or a pipe: --config <(...)): one object of
 * setting names. Unknown keys, settings that are not read from files, wrong
 * JSON types, out-of-range values, duplicate keys and syntax errors are
 * errors naming the file and line. A file holding a secret must be the
 * user's own and readable by no one else (mode 0600), as a token file. */
ferry_status config_load_file(ferry_config *cfg, const char *path);
/* The same for text already read: name stands for the file in errors, and
 * sb is the file's stat for the rule on secrets (NULL: the text came from no
 * file, and a secret in it is refused). */
ferry_status config_load_text(ferry_config *cfg, const char *name, const char *text, size_t len,
                              const struct stat *sb);
/* Reads FERRY_<NAME> for every setting with wanted[id] (NULL: all); a
 * variable set to the empty string counts as unset. */
ferry_status config_load_env(ferry_config *cfg, const bool *wanted);

/* "--max-new-tokens" for SETTING_max_new_tokens. */
const char *config_flag(int id, char *buf, size_t cap);
/* "FERRY_MAX_NEW_TOKENS". */
const char *config_env(int id, char *buf, size_t cap);

/* One line per listed setting: flag, type, default, doc. */
void config_print_help(FILE *f, const int *ids, int n);
/* The effective configuration as a JSON object: the file read, and for each
 * setting its value (secrets "<redacted>") and source. */
void config_print_json(strbuf *sb, const ferry_config *cfg);
/* The settings table of the README, in Markdown. */
void config_print_markdown(FILE *f);

#endif
