/*
 * config_print.c - the configuration written out: `ferry config --print`
 * (the effective value of every setting and where it came from, secrets
 * redacted) and the README's settings table (`make docs`), both straight
 * from settings.def so that neither can drift from what ferry reads.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "../engine/base/util.h"

static void put_value(strbuf *sb, const ferry_config *cfg, int id)
{
    const void *f = config_field(cfg, id);
    switch (config_settings[id].type) {
    case SET_STR: {
        const char *s = *(const char *const *)f;
        if (!s) sb_puts(sb, "null");
        else if (config_settings[id].where == SETTING_SECRET) sb_puts(sb, "\"<redacted>\"");
        else sb_json_str(sb, s);
        return;
    }
    case SET_INT: sb_printf(sb, "%" PRId64, *(const int64_t *)f); return;
    case SET_FLOAT: {
        char buf[32];
        util_fmt_double(*(const double *)f, buf, sizeof buf);
        sb_puts(sb, buf);
        return;
    }
    case SET_BOOL:
        /* a BOOL without a default that nothing set (mkmodel --tied) */
        if (!config_given(cfg, id) && !config_settings[id].def) sb_puts(sb, "null");
        else sb_puts(sb, *(const bool *)f ? "true" : "false");
        return;
    case SET_SIZE:
    case SET_U64: sb_printf(sb, "%" PRIu64, *(const uint64_t *)f); return;
    }
}

void config_print_json(strbuf *sb, const ferry_config *cfg)
{
    static const char *sources[] = {"default", "file", "env", "flag"};
    sb_puts(sb, "{\n  \"config_file\": ");
    if (cfg->config_file) sb_json_str(sb, cfg->config_file);
    else sb_puts(sb, "null");
    sb_puts(sb, ",\n  \"settings\": {");
    for (int i = 0; i < SETTING_COUNT; i++) {
        char at[512];
        sb_printf(sb, "%s\n    \"%s\": {\"value\": ", i ? "," : "", config_settings[i].name);
        put_value(sb, cfg, i);
        sb_printf(sb, ", \"source\": \"%s\"", sources[cfg->source[i]]);
        switch (cfg->source[i]) {
        case SOURCE_FLAG: config_flag(i, at, sizeof at); break;
        case SOURCE_ENV: config_env(i, at, sizeof at); break;
        case SOURCE_FILE: snprintf(at, sizeof at, "%s:%d", cfg->config_file, cfg->line[i]); break;
        case SOURCE_DEFAULT: at[0] = '\0'; break;
        }
        if (at[0]) {
            sb_puts(sb, ", \"from\": ");
            sb_json_str(sb, at);
        }
        sb_putc(sb, '}');
    }
    sb_puts(sb, "\n  }\n}\n");
}

/* ---- the README table ------------------------------------------------- */

/* Markdown table cell text: '|' escaped, nothing else changed. */
static void cell(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '|') fputc('\\', f);
        fputc(*s, f);
    }
}

void config_print_markdown(FILE *f)
{
    static const char *types[] = {"string", "integer", "number", "bool", "size", "integer"};
    fprintf(f, "| setting | type | default | valid | description |\n");
    fprintf(f, "|---|---|---|---|---|\n");
    for (int i = 0; i < SETTING_COUNT; i++) {
        const setting_def *d = &config_settings[i];
        fprintf(f, "| `%s` | %s | ", d->name, types[d->type]);
        if (d->def) {
            fputc('`', f);
            cell(f, d->def);
            fputc('`', f);
        }
        fprintf(f, " | ");
        if (d->valid && strstr(d->valid, "..")) {
            cell(f, d->valid);
        } else if (d->valid) {
            for (const char *w = d->valid; *w; w++) {
                if (*w == '|') fputs(", ", f);
                else fputc(*w, f);
            }
        }
        fprintf(f, " | ");
        cell(f, d->doc);
        if (d->where == SETTING_SECRET) fprintf(f, ". **Secret**: environment or config file only, never printed");
        if (d->where == SETTING_NOFILE) fprintf(f, ". Flag or environment only");
        fprintf(f, " |\n");
    }
}
