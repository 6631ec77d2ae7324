/*
 * config.h - ferry's settings as a struct generated from settings.def, with
 * parsing from "name" + "value" strings (the command line) and help text. Parsing errors name the setting.
 */
#ifndef FERRY_CONFIG_H
#define FERRY_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "../engine/base/status.h"

typedef enum { SET_STR, SET_INT, SET_FLOAT, SET_BOOL, SET_SIZE, SET_U64 } setting_type;

typedef const char *setting_STR;
typedef int64_t setting_INT;
typedef double setting_FLOAT;
typedef bool setting_BOOL;
typedef uint64_t setting_SIZE;
typedef uint64_t setting_U64;

typedef enum {
#define FERRY_SETTING(name, type, def, doc) SETTING_##name,
#include "settings.def"
#undef FERRY_SETTING
    SETTING_COUNT
} setting_id;

typedef struct {
#define FERRY_SETTING(name, type, def, doc) setting_##type name;
#include "settings.def"
#undef FERRY_SETTING
    bool given[SETTING_COUNT]; /* set explicitly (not a default) */
} ferry_config;

typedef struct {
    const char *name;
    setting_type type;
    const char *def;
    const char *doc;
} setting_def;

extern const setting_def config_settings[SETTING_COUNT];

/* Fills every setting with its default. */
void config_defaults(ferry_config *cfg);
/* Looks a setting up by name ('-' and '_' are the same); -1 if unknown. */
int config_find(const char *name);
/* Parses value into setting id. */
ferry_status config_set(ferry_config *cfg, int id, const char *value);
/* "--max-new-tokens" for SETTING_max_new_tokens. */
const char *config_flag(int id, char *buf, size_t cap);
/* One line per listed setting: flag, type, default, doc. */
void config_print_help(FILE *f, const int *ids, int n);

#endif
