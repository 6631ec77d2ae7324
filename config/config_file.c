/*
 * config_file.c - the JSON config file (`--config FILE`, FERRY_CONFIG): one
 * object whose keys are setting names and whose values have the setting's
 * JSON type (a string, an integer, a number, true/false; a size as "4GiB" or
 * an integer of bytes; null leaves the default). Each value is turned back
 * into the text a flag would carry and goes through config_set, so a file
 * is checked exactly as flags are. Every error names the file and the line:
 * an operator reading "ferry.json:12: http_prot: unknown setting (did you
 * mean http_port?)" knows what to change without reading code.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"

#define CONFIG_FILE_MAX (1u << 20) /* a config file is a page of settings, not a data file */

static int line_of(const char *text, size_t len, size_t pos)
{
    int line = 1;
    for (size_t i = 0; i < pos && i < len; i++) line += text[i] == '\n';
    return line;
}

static ferry_status read_file(const char *path, char **text, size_t *len, mode_t *mode)
{
    *text = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ferry_fail(FERRY_ERR_INVALID, "config file %s: %s", path, strerror(errno));
    struct stat sb;
    ferry_status st = FERRY_OK;
    if (fstat(fd, &sb) != 0) st = ferry_fail(FERRY_ERR_IO, "config file %s: %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode)) st = ferry_fail(FERRY_ERR_INVALID, "config file %s: not a regular file", path);
    else if (sb.st_size > CONFIG_FILE_MAX)
        st = ferry_fail(FERRY_ERR_INVALID, "config file %s: %lld bytes; a config file holds at most %u", path,
                        (long long)sb.st_size, CONFIG_FILE_MAX);
    size_t n = 0;
    char *buf = st == FERRY_OK ? malloc((size_t)sb.st_size + 1) : NULL;
    if (st == FERRY_OK && !buf) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    while (st == FERRY_OK && n < (size_t)sb.st_size) {
        ssize_t r = read(fd, buf + n, (size_t)sb.st_size - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) st = ferry_fail(FERRY_ERR_IO, "config file %s: %s", path, strerror(errno));
        else if (r == 0) break; /* shrank while read: what is there is the file */
        else n += (size_t)r;
    }
    close(fd);
    if (st != FERRY_OK) {
        free(buf);
        return st;
    }
    buf[n] = '\0';
    *text = buf;
    *len = n;
    *mode = sb.st_mode;
    return FERRY_OK;
}

static const char *json_type_name(const json_value *v)
{
    switch (v->type) {
    case JSON_NULL: return "null";
    case JSON_BOOL: return "true/false";
    case JSON_NUMBER: return v->is_int ? "an integer" : "a number";
    case JSON_STRING: return "a string";
    case JSON_ARRAY: return "an array";
    case JSON_OBJECT: return "an object";
    }
    return "?";
}

/* The flag text for a JSON value of the setting's type, in buf or (strings)
 * in the config's arena; NULL with the error set when the type is wrong. */
static const char *value_text(ferry_config *cfg, int id, const json_value *v, int line, char *buf, size_t cap)
{
    const setting_def *d = &config_settings[id];
    static const char *wants[] = {"a string", "an integer", "a number", "true or false",
                                  "a size (\"4GiB\" or an integer of bytes)", "a non-negative integer"};
    bool ok = false;
    switch (d->type) {
    case SET_STR:
        if (v->type == JSON_STRING) { /* json.c refuses \u0000: no string is cut short */
            char *s = arena_strdup(&cfg->strings, v->str, v->len);
            if (!s) ferry_fail(FERRY_ERR_NOMEM, "out of memory");
            return s;
        }
        break;
    case SET_INT:
    case SET_U64:
        if (v->type == JSON_NUMBER && v->is_int) snprintf(buf, cap, "%" PRId64, v->integer), ok = true;
        break;
    case SET_FLOAT:
        if (v->type == JSON_NUMBER) snprintf(buf, cap, "%.17g", v->number), ok = true;
        break;
    case SET_BOOL:
        if (v->type == JSON_BOOL) snprintf(buf, cap, "%s", v->boolean ? "true" : "false"), ok = true;
        break;
    case SET_SIZE:
        if (v->type == JSON_NUMBER && v->is_int) snprintf(buf, cap, "%" PRId64, v->integer), ok = true;
        else if (v->type == JSON_STRING && strlen(v->str) < cap) snprintf(buf, cap, "%s", v->str), ok = true;
        break;
    }
    if (ok) return buf;
    ferry_fail(FERRY_ERR_INVALID, "%s:%d: %s must be %s, not %s", cfg->config_file, line, d->name, wants[d->type],
               json_type_name(v));
    return NULL;
}

static ferry_status apply(ferry_config *cfg, const json_value *root, const char *text, size_t len)
{
    int first_line[SETTING_COUNT] = {0};
    for (size_t i = 0; i < root->len; i++) {
        const json_member *m = &root->members[i];
        int line = line_of(text, len, m->offset);
        if (!strncmp(m->key, "//", 2)) continue; /* a comment */
        int id = config_find(m->key);
        if (id < 0) {
            int near = config_closest(m->key);
            if (near >= 0)
                return ferry_fail(FERRY_ERR_INVALID, "%s:%d: unknown setting '%.64s' (did you mean %s?)", cfg->config_file,
                                  line, m->key, config_settings[near].name);
            return ferry_fail(FERRY_ERR_INVALID, "%s:%d: unknown setting '%.64s' (`ferry config --print` lists them)",
                              cfg->config_file, line, m->key);
        }
        if (first_line[id])
            return ferry_fail(FERRY_ERR_INVALID, "%s:%d: %s is set twice (first at line %d)", cfg->config_file, line,
                              config_settings[id].name, first_line[id]);
        first_line[id] = line;
        if (config_settings[id].where == SETTING_NOFILE)
            return ferry_fail(FERRY_ERR_INVALID, "%s:%d: %s is not read from a config file (give it as a flag)",
                              cfg->config_file, line, config_settings[id].name);
        if (m->value.type == JSON_NULL) continue;
        char buf[128];
        const char *v = value_text(cfg, id, &m->value, line, buf, sizeof buf);
        if (!v) return FERRY_ERR_INVALID;
        FERRY_TRY(config_set(cfg, id, v, SOURCE_FILE, line));
    }
    return FERRY_OK;
}

/* A secret in a file other users may read is no secret: refuse it, naming
 * the setting and the fix, as ssh does with a private key. */
static ferry_status check_secrets(const ferry_config *cfg, mode_t mode)
{
    if (!(mode & (S_IRWXO)))
        return FERRY_OK;
    for (int i = 0; i < SETTING_COUNT; i++)
        if (config_settings[i].where == SETTING_SECRET && cfg->source[i] == SOURCE_FILE)
            return ferry_fail(FERRY_ERR_INVALID,
                              "%s:%d: %s is a secret, but other users may read the file (mode %04o): chmod o-rwx %s",
                              cfg->config_file, cfg->line[i], config_settings[i].name, (unsigned)(mode & 07777), cfg->config_file);
    return FERRY_OK;
}

ferry_status config_load_file(ferry_config *cfg, const char *path)
{
    char *text;
    size_t len = 0;
    mode_t mode = 0;
    FERRY_TRY(read_file(path, &text, &len, &mode));
    if (!(cfg->config_file = arena_strdup(&cfg->strings, path, strlen(path)))) {
        free(text);
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    json_doc *doc;
    ferry_status st = json_parse(text, len, &doc);
    if (st != FERRY_OK && st != FERRY_ERR_INVALID) {
        free(text);
        return ferry_fail_context(st, "config file %s", path);
    }
    if (st != FERRY_OK) {
        size_t pos = json_error_pos();
        int line = line_of(text, len, pos);
        size_t col = 1;
        while (col <= pos && text[pos - col] != '\n') col++;
        /* "invalid JSON at byte N: what" -> "what" */
        char msg[FERRY_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", ferry_errmsg());
        const char *what = strstr(msg, ": ");
        st = ferry_fail(FERRY_ERR_INVALID, "%s:%d:%zu: invalid JSON: %s", path, line, col, what ? what + 2 : msg);
        free(text);
        return st;
    }
    const json_value *root = json_doc_root(doc);
    if (root->type != JSON_OBJECT)
        st = ferry_fail(FERRY_ERR_INVALID, "%s: a config file holds one JSON object of settings, not %s", path,
                        json_type_name(root));
    else
        st = apply(cfg, root, text, len);
    if (st == FERRY_OK) st = check_secrets(cfg, mode);
    json_doc_free(doc);
    free(text);
    return st;
}
