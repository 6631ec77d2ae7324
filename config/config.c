/*
 * config.c - defaults, parsing and help for the settings in settings.def.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../engine/base/util.h"

const setting_def config_settings[SETTING_COUNT] = {
#define FERRY_SETTING(name, type, def, doc) {#name, SET_##type, def, doc},
#include "settings.def"
#undef FERRY_SETTING
};

static void *field(ferry_config *cfg, int id)
{
    static const size_t offsets[SETTING_COUNT] = {
#define FERRY_SETTING(name, type, def, doc) offsetof(ferry_config, name),
#include "settings.def"
#undef FERRY_SETTING
    };
    return (char *)cfg + offsets[id];
}

const char *config_flag(int id, char *buf, size_t cap)
{
    snprintf(buf, cap, "--%s", config_settings[id].name);
    for (char *p = buf; *p; p++)
        if (*p == '_') *p = '-';
    return buf;
}

static ferry_status parse_value(ferry_config *cfg, int id, const char *v)
{
    const setting_def *d = &config_settings[id];
    char flag[64];
    char *end;
    void *f = field(cfg, id);
    errno = 0;
    switch (d->type) {
    case SET_STR:
        *(const char **)f = v;
        return FERRY_OK;
    case SET_INT: {
        long long x = strtoll(v, &end, 10);
        if (!*v || *end || errno)
            return ferry_fail(FERRY_ERR_INVALID, "%s: '%s' is not an integer", config_flag(id, flag, sizeof flag), v);
        if (x < -2147483647LL || x > 2147483647LL)
            return ferry_fail(FERRY_ERR_INVALID, "%s: %s is out of range", config_flag(id, flag, sizeof flag), v);
        *(int64_t *)f = x;
        return FERRY_OK;
    }
    case SET_U64: {
        unsigned long long x = strtoull(v, &end, 10);
        if (*v < '0' || *v > '9' || *end || errno)
            return ferry_fail(FERRY_ERR_INVALID, "%s: '%s' is not a non-negative integer",
                              config_flag(id, flag, sizeof flag), v);
        *(uint64_t *)f = x;
        return FERRY_OK;
    }
    case SET_FLOAT: {
        double x = strtod(v, &end);
        if (!*v || *end || errno || !isfinite(x))
            return ferry_fail(FERRY_ERR_INVALID, "%s: '%s' is not a number", config_flag(id, flag, sizeof flag), v);
        *(double *)f = x;
        return FERRY_OK;
    }
    case SET_BOOL:
        if (!strcasecmp(v, "true") || !strcmp(v, "1") || !strcasecmp(v, "yes")) *(bool *)f = true;
        else if (!strcasecmp(v, "false") || !strcmp(v, "0") || !strcasecmp(v, "no")) *(bool *)f = false;
        else
            return ferry_fail(FERRY_ERR_INVALID, "%s: '%s' is not true or false", config_flag(id, flag, sizeof flag), v);
        return FERRY_OK;
    case SET_SIZE: {
        ferry_status st = util_parse_size(v, (uint64_t *)f);
        if (st != FERRY_OK) return ferry_fail_context(st, "%s", config_flag(id, flag, sizeof flag));
        return FERRY_OK;
    }
    }
    return FERRY_ERR_INTERNAL;
}

void config_defaults(ferry_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < SETTING_COUNT; i++)
        if (config_settings[i].def) {
            ferry_status st = parse_value(cfg, i, config_settings[i].def);
            FERRY_ASSERT(st == FERRY_OK);
        }
}

int config_find(const char *name)
{
    for (int i = 0; i < SETTING_COUNT; i++) {
        const char *a = config_settings[i].name, *b = name;
        while (*a && *b && (*a == *b || (*a == '_' && *b == '-'))) a++, b++;
        if (!*a && !*b) return i;
    }
    return -1;
}

ferry_status config_set(ferry_config *cfg, int id, const char *value)
{
    FERRY_TRY(parse_value(cfg, id, value));
    cfg->given[id] = true;
    return FERRY_OK;
}

void config_print_help(FILE *f, const int *ids, int n)
{
    static const char *type_names[] = {"STR", "N", "X", "BOOL", "SIZE", "N"};
    for (int i = 0; i < n; i++) {
        const setting_def *d = &config_settings[ids[i]];
        char flag[64], left[96];
        snprintf(left, sizeof left, "%s %s", config_flag(ids[i], flag, sizeof flag),
                 d->type == SET_BOOL ? "" : type_names[d->type]);
        fprintf(f, "  %-26s %s", left, d->doc);
        if (d->def) fprintf(f, " [default: %s]", d->def);
        fputc('\n', f);
    }
}
