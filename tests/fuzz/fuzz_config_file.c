/*
 * fuzz_config_file.c - libFuzzer target for ferry's JSON config file
 * (config_load_text in config/config.h: what config_load_file does with the
 * bytes of --config FILE once read).
 *
 * The input is the file's text, loaded with no file behind it (a secret in
 * it is refused). A refused file must say why, naming the file. An accepted
 * one must have set exactly the settings it holds (keys other than
 * "// comments", values other than null), each from the file at the line of
 * its key, and left the others at their defaults; the effective
 * configuration must print as JSON (config_print_json); and writing every
 * setting the file gave back out in its canonical form (an integer, the
 * shortest double, a string, true/false; a size or a seed as a string of
 * digits) must load again to the very same values. A broken promise aborts,
 * which libFuzzer reports as a crash. Build: README.md.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../config/config.h"

#define NAME "fuzz.json"

static ferry_config g_defaults;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    config_defaults(&g_defaults);
    return 0;
}

static bool same_value(const ferry_config *a, const ferry_config *b, int id)
{
    const void *x = config_field(a, id), *y = config_field(b, id);
    switch (config_settings[id].type) {
    case SET_STR: {
        const char *s = *(const char *const *)x, *t = *(const char *const *)y;
        return s == t || (s && t && !strcmp(s, t));
    }
    case SET_INT: return *(const int64_t *)x == *(const int64_t *)y;
    case SET_FLOAT: return *(const double *)x == *(const double *)y;
    case SET_BOOL: return *(const bool *)x == *(const bool *)y;
    case SET_SIZE:
    case SET_U64: return *(const uint64_t *)x == *(const uint64_t *)y;
    }
    return false;
}

/* The settings cfg took from the file, as a config file of their own. */
static void canonical(const ferry_config *cfg, strbuf *sb)
{
    sb_putc(sb, '{');
    bool first = true;
    for (int id = 0; id < SETTING_COUNT; id++) {
        if (cfg->source[id] != SOURCE_FILE) continue;
        sb_printf(sb, "%s\n\"%s\": ", first ? "" : ",", config_settings[id].name);
        first = false;
        const void *f = config_field(cfg, id);
        char buf[64];
        switch (config_settings[id].type) {
        case SET_STR: {
            const char *s = *(const char *const *)f;
            if (s) sb_json_str(sb, s);
            else sb_puts(sb, "null");
            break;
        }
        case SET_INT: sb_printf(sb, "%" PRId64, *(const int64_t *)f); break;
        case SET_FLOAT:
            util_fmt_double(*(const double *)f, buf, sizeof buf);
            sb_puts(sb, buf);
            break;
        case SET_BOOL: sb_puts(sb, *(const bool *)f ? "true" : "false"); break;
        case SET_SIZE:
        case SET_U64: sb_printf(sb, "\"%" PRIu64 "\"", *(const uint64_t *)f); break;
        }
    }
    sb_puts(sb, "\n}\n");
}

/* The settings the text's top-level object sets: the line of each key. */
static void keys_of(const char *text, size_t len, int line[SETTING_COUNT])
{
    memset(line, 0, SETTING_COUNT * sizeof *line);
    size_t bom = len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3) ? 3 : 0;
    json_doc *doc;
    if (json_parse(text + bom, len - bom, &doc) != FERRY_OK) abort(); /* accepted, so JSON */
    const json_value *root = json_doc_root(doc);
    if (root->type != JSON_OBJECT) abort();
    for (size_t i = 0; i < root->len; i++) {
        const json_member *m = &root->members[i];
        if (!strncmp(m->key, "//", 2)) continue;
        int id = config_find(m->key);
        if (id < 0 || line[id]) abort(); /* unknown or twice, and accepted */
        int l = 1;
        for (size_t k = 0; k < m->offset; k++) l += text[bom + k] == '\n';
        line[id] = m->value.type == JSON_NULL ? -l : l;
    }
    json_doc_free(doc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    ferry_config a, b;
    config_defaults(&a);
    ferry_status st = config_load_text(&a, NAME, text, size, NULL);
    if (st != FERRY_OK) {
        if (st != FERRY_ERR_INVALID && st != FERRY_ERR_NOMEM) abort();
        if (!strstr(ferry_errmsg(), NAME)) {
            fprintf(stderr, "fuzz_config_file: the error does not name the file: %s\n", ferry_errmsg());
            abort();
        }
        config_free(&a);
        return 0;
    }
    int line[SETTING_COUNT];
    keys_of(text, size, line);
    for (int id = 0; id < SETTING_COUNT; id++) {
        bool set = line[id] > 0;
        if (set != (a.source[id] == SOURCE_FILE) || set != config_given(&a, id)) abort();
        if (set && a.line[id] != line[id]) abort();
        if (!set && !same_value(&a, &g_defaults, id)) abort();
        if (set && config_settings[id].where != SETTING_ANY) abort();
    }

    strbuf sb;
    sb_init(&sb);
    config_print_json(&sb, &a);
    json_doc *doc;
    if (sb.oom || json_parse(sb.data, sb.len, &doc) != FERRY_OK) abort();
    json_doc_free(doc);
    sb_free(&sb);

    sb_init(&sb);
    canonical(&a, &sb);
    config_defaults(&b);
    if (sb.oom) abort();
    if (config_load_text(&b, NAME, sb.data, sb.len, NULL) != FERRY_OK) {
        fprintf(stderr, "fuzz_config_file: the canonical form does not load: %s\n%s", ferry_errmsg(), sb.data);
        abort();
    }
    for (int id = 0; id < SETTING_COUNT; id++)
        if (!same_value(&a, &b, id) || a.source[id] != b.source[id]) {
            fprintf(stderr, "fuzz_config_file: %s differs once written back\n%s", config_settings[id].name, sb.data);
            abort();
        }
    sb_free(&sb);
    config_free(&a);
    config_free(&b);
    return 0;
}
