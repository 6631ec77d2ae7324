/*
 * config.c - defaults, parsing, range checks, the environment and help for
 * the settings in settings.def. The config file is read in config_file.c,
 * the printed forms (--print, the README table) are in config_print.c; all
 * of them come through config_set, so a value means the same and is checked
 * the same from every source.
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
#define ANY SETTING_ANY
#define SECRET SETTING_SECRET
#define NOFILE SETTING_NOFILE
#define FERRY_SETTING(name, type, def, valid, where, doc) {#name, SET_##type, def, valid, where, doc},
#include "settings.def"
#undef FERRY_SETTING
#undef ANY
#undef SECRET
#undef NOFILE
};

static const size_t k_offsets[SETTING_COUNT] = {
#define FERRY_SETTING(name, type, def, valid, where, doc) offsetof(ferry_config, name),
#include "settings.def"
#undef FERRY_SETTING
};

const void *config_field(const ferry_config *cfg, int id) { return (const char *)cfg + k_offsets[id]; }

static void *field(ferry_config *cfg, int id) { return (char *)cfg + k_offsets[id]; }

const char *config_flag(int id, char *buf, size_t cap)
{
    snprintf(buf, cap, "--%s", config_settings[id].name);
    for (char *p = buf; *p; p++)
        if (*p == '_') *p = '-';
    return buf;
}

const char *config_env(int id, char *buf, size_t cap)
{
    snprintf(buf, cap, "FERRY_%s", config_settings[id].name);
    for (char *p = buf; *p; p++)
        if (*p >= 'a' && *p <= 'z') *p = (char)(*p - 'a' + 'A');
    return buf;
}

/* How an error names the value: by the flag, the variable or the file's
 * line and key - whatever the user has to go and change. */
static const char *label(const ferry_config *cfg, int id, setting_source source, int line, char *buf, size_t cap)
{
    switch (source) {
    case SOURCE_FLAG: return config_flag(id, buf, cap);
    case SOURCE_ENV: return config_env(id, buf, cap);
    case SOURCE_FILE: snprintf(buf, cap, "%s:%d: %s", cfg->config_file, line, config_settings[id].name); return buf;
    case SOURCE_DEFAULT: break;
    }
    snprintf(buf, cap, "%s", config_settings[id].name);
    return buf;
}

const char *config_where(const ferry_config *cfg, int id, char *buf, size_t cap)
{
    return label(cfg, id, cfg->source[id], cfg->line[id], buf, cap);
}


/* ---- names: lookup and suggestions ------------------------------------ */

static char fold(char c) { return c == '-' ? '_' : (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c; }

int config_find(const char *name)
{
    for (int i = 0; i < SETTING_COUNT; i++) {
        const char *a = config_settings[i].name, *b = name;
        while (*a && *b && (*a == *b || (*a == '_' && *b == '-'))) a++, b++;
        if (!*a && !*b) return i;
    }
    return -1;
}

/* Edit distance of a[0..na) and b[0..nb) counting a swap of neighbours as
 * one edit (optimal string alignment), case and '-'/'_' folded; names
 * longer than 63 bytes are too far from every setting to matter. */
static int distance(const char *a, size_t na, const char *b, size_t nb)
{
    if (na > 63 || nb > 63) return 64;
    int d[64][64];
    for (size_t i = 0; i <= na; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= nb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= na; i++)
        for (size_t j = 1; j <= nb; j++) {
            int best = d[i - 1][j - 1] + (fold(a[i - 1]) != fold(b[j - 1]));
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && fold(a[i - 1]) == fold(b[j - 2]) && fold(a[i - 2]) == fold(b[j - 1]) &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[na][nb];
}

/* Near enough to be a typo: two edits, or a third of the longer name. */
static bool near(int d, size_t na, size_t nb)
{
    size_t n = na > nb ? na : nb;
    return d <= 2 || (size_t)d * 3 <= n;
}

int config_closest(const char *name, int skip_where)
{
    int best = -1, best_d = 1 << 30;
    size_t n = strlen(name);
    for (int i = 0; i < SETTING_COUNT; i++) {
        if (config_settings[i].where == skip_where) continue;
        const char *s = config_settings[i].name;
        int d = distance(name, n, s, strlen(s));
        if (d < best_d && near(d, n, strlen(s))) best = i, best_d = d;
    }
    return best;
}

/* ---- values: parse and range ------------------------------------------ */

/* v against a "a|b|c" list; on a miss, the message lists the words and the
 * nearest one. */
static ferry_status check_word(const char *where, const char *valid, const char *v)
{
    const char *best = NULL;
    size_t best_len = 0;
    int best_d = 1 << 30;
    for (const char *w = valid; *w;) {
        size_t n = strcspn(w, "|");
        if (strlen(v) == n && !strncmp(v, w, n)) return FERRY_OK;
        int d = distance(v, strlen(v), w, n);
        if (d < best_d && near(d, strlen(v), n)) best = w, best_len = n, best_d = d;
        w += n + (w[n] == '|');
    }
    char words[256];
    size_t n = 0;
    for (const char *w = valid; *w && n + 3 < sizeof words; w++) {
        if (*w == '|') words[n++] = ',', words[n++] = ' ';
        else words[n++] = *w;
    }
    words[n] = '\0';
    if (best)
        return ferry_fail(FERRY_ERR_INVALID, "%s must be one of %s (got '%s'; did you mean %.*s?)", where, words, v,
                          (int)best_len, best);
    return ferry_fail(FERRY_ERR_INVALID, "%s must be one of %s (got '%s')", where, words, v);
}

/* A number against "LO..HI": either end may be left out, both ends are
 * included, except a low end written "LO<" (top_p: 0<..1). */
static ferry_status check_range(const char *where, const char *valid, double x, const char *v)
{
    const char *dots = strstr(valid, "..");
    FERRY_ASSERT(dots);
    bool has_lo = dots != valid, has_hi = dots[2] != '\0';
    bool lo_open = has_lo && dots[-1] == '<';
    double lo = has_lo ? strtod(valid, NULL) : 0, hi = has_hi ? strtod(dots + 2, NULL) : 0;
    if ((!has_lo || (lo_open ? x > lo : x >= lo)) && (!has_hi || x <= hi)) return FERRY_OK;
    int lo_len = (int)(dots - valid) - lo_open;
    if (has_lo && has_hi && !lo_open) return ferry_fail(FERRY_ERR_INVALID, "%s must be in %s (got %s)", where, valid, v);
    if (has_lo && has_hi)
        return ferry_fail(FERRY_ERR_INVALID, "%s must be > %.*s and <= %s (got %s)", where, lo_len, valid, dots + 2, v);
    if (has_lo)
        return ferry_fail(FERRY_ERR_INVALID, "%s must be %s %.*s (got %s)", where, lo_open ? ">" : ">=", lo_len, valid, v);
    return ferry_fail(FERRY_ERR_INVALID, "%s must be <= %s (got %s)", where, dots + 2, v);
}

static ferry_status parse_value(ferry_config *cfg, int id, const char *v, const char *where)
{
    const setting_def *d = &config_settings[id];
    char *end;
    void *f = field(cfg, id);
    errno = 0;
    switch (d->type) {
    case SET_STR:
        /* "" is "not set" where that is the default (--quantize "") */
        if (d->valid && (*v || d->def)) FERRY_TRY(check_word(where, d->valid, v));
        *(const char **)f = v;
        return FERRY_OK;
    case SET_INT: {
        long long x = strtoll(v, &end, 10);
        if (!*v || *end || (errno && errno != ERANGE))
            return ferry_fail(FERRY_ERR_INVALID, "%s: '%s' is not an integer", where, v);
        if (errno == ERANGE || x < -2147483647LL || x > 2147483647LL)
            return ferry_fail(FERRY_ERR_INVALID, "%s: %s is out of range%s%s", where, v, d->valid ? " " : "",
                              d->valid ? d->valid : "");
        if (d->valid) FERRY_TRY(check_range(where, d->valid, (double)x, v));
        *(int64_t *)f = x;
        return FERRY_OK;
    }
    case SET_U64: {
        unsigned long long x = strtoull(v, &end, 10);
        if (*v < '0' || *v > '9' || *end || errno)
            return ferry_fail(FERRY_ERR_INVALID, "%s: '%s' is not a non-negative integer", where, v);
        if (d->valid) FERRY_TRY(check_range(where, d->valid, (double)x, v));
        *(uint64_t *)f = x;
        return FERRY_OK;
    }
    case SET_FLOAT: {
        double x = strtod(v, &end);
        if (!*v || *end || errno || !isfinite(x)) return ferry_fail(FERRY_ERR_INVALID, "%s: '%s' is not a number", where, v);
        if (d->valid) FERRY_TRY(check_range(where, d->valid, x, v));
        *(double *)f = x;
        return FERRY_OK;
    }
    case SET_BOOL:
        if (!strcasecmp(v, "true") || !strcmp(v, "1") || !strcasecmp(v, "yes")) *(bool *)f = true;
        else if (!strcasecmp(v, "false") || !strcmp(v, "0") || !strcasecmp(v, "no")) *(bool *)f = false;
        else return ferry_fail(FERRY_ERR_INVALID, "%s: '%s' is not true or false", where, v);
        return FERRY_OK;
    case SET_SIZE: {
        uint64_t x;
        ferry_status st = util_parse_size(v, &x);
        if (st != FERRY_OK) return ferry_fail_context(st, "%s", where);
        if (d->valid) FERRY_TRY(check_range(where, d->valid, (double)x, v));
        *(uint64_t *)f = x;
        return FERRY_OK;
    }
    }
    return FERRY_ERR_INTERNAL;
}

/* ---- the config ------------------------------------------------------- */

void config_defaults(ferry_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < SETTING_COUNT; i++)
        if (config_settings[i].def) {
            ferry_status st = parse_value(cfg, i, config_settings[i].def, config_settings[i].name);
            FERRY_ASSERT(st == FERRY_OK);
        }
}

void config_free(ferry_config *cfg) { arena_free(&cfg->strings); }

ferry_status config_set(ferry_config *cfg, int id, const char *value, setting_source source, int line)
{
    char where[512];
    FERRY_TRY(parse_value(cfg, id, value, label(cfg, id, source, line, where, sizeof where)));
    cfg->source[id] = source;
    cfg->line[id] = line;
    return FERRY_OK;
}

ferry_status config_load_env(ferry_config *cfg, const bool *wanted)
{
    for (int i = 0; i < SETTING_COUNT; i++) {
        if (wanted && !wanted[i]) continue;
        char name[96];
        const char *v = getenv(config_env(i, name, sizeof name));
        if (v && *v) FERRY_TRY(config_set(cfg, i, v, SOURCE_ENV, 0));
    }
    return FERRY_OK;
}

void config_print_help(FILE *f, const int *ids, int n)
{
    static const char *type_names[] = {"STR", "N", "X", "BOOL", "SIZE", "N"};
    for (int i = 0; i < n; i++) {
        const setting_def *d = &config_settings[ids[i]];
        char flag[64], env[64], left[96];
        if (d->where == SETTING_SECRET) {
            snprintf(left, sizeof left, "%s (env)", config_env(ids[i], env, sizeof env));
        } else {
            snprintf(left, sizeof left, "%s %s", config_flag(ids[i], flag, sizeof flag),
                     d->type == SET_BOOL ? "" : type_names[d->type]);
        }
        fprintf(f, "  %-26s %s", left, d->doc);
        if (d->def) fprintf(f, " [default: %s]", d->def);
        fputc('\n', f);
    }
}

/* ---- generation parameters ------------------------------------------------ */

void config_gen_params(const ferry_config *cfg, gen_params *p)
{
    memset(p, 0, sizeof *p);
    for (int id = 0; id < GEN_PARAM_COUNT; id++) {
        int s = config_find(gen_param_defs[id].name);
        if (s < 0) continue;
        const void *f = config_field(cfg, s);
        switch (config_settings[s].type) {
        case SET_INT: gen_param_put_int(p, (gen_param)id, *(const setting_INT *)f); break;
        case SET_FLOAT: gen_param_put_real(p, (gen_param)id, *(const setting_FLOAT *)f); break;
        case SET_U64: gen_param_put_u64(p, (gen_param)id, *(const setting_U64 *)f); break;
        default: FERRY_ASSERT(!"a generation setting of another type");
        }
        p->given[id] = config_given(cfg, s);
    }
}

void config_gen_defaults(gen_params *p)
{
    ferry_config d;
    config_defaults(&d);
    config_gen_params(&d, p);
}
