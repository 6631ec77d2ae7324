/*
 * config_file.c - the JSON config file (`--config FILE`, FERRY_CONFIG): one
 * object whose keys are setting names and whose values have the setting's
 * JSON type (a string, an integer, a number, true/false; a size as "4GiB" or
 * an integer of bytes; null leaves the default; an integer may be written
 * 2.0, a seed beyond 2^53 as a string of digits). Each value is turned back
 * into the text a flag would carry and goes through config_set, so a file
 * is checked exactly as flags are. Every error names the file and the line:
 * an operator reading "ferry.json:12: http_prot: unknown setting (did you
 * mean http_port?)" knows what to change without reading code.
 *
 * config_load_file reads the bytes (read_file) and hands them to
 * config_load_text, which parses and applies them: the fuzz target
 * (tests/fuzz/fuzz_config_file.c) calls the latter with no file.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "../engine/base/util.h"

#define CONFIG_FILE_MAX (1u << 20) /* a config file is a page of settings, not a data file */

static int line_of(const char *text, size_t len, size_t pos)
{
    int line = 1;
    for (size_t i = 0; i < pos && i < len; i++) line += text[i] == '\n';
    return line;
}

/* The file's bytes. A regular file, or a pipe (`--config <(...)`), read to
 * its end: opened without blocking so that a FIFO with no writer cannot
 * hang startup (it reads as empty), then read blocking. */
static ferry_status read_file(const char *path, char **text, size_t *len, struct stat *sb)
{
    *text = NULL;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return ferry_fail(FERRY_ERR_INVALID, "config file %s: %s", path, strerror(errno));
    ferry_status st = FERRY_OK;
    int fl = fcntl(fd, F_GETFL);
    if (fstat(fd, sb) != 0 || fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
        st = ferry_fail(FERRY_ERR_IO, "config file %s: %s", path, strerror(errno));
    else if (!S_ISREG(sb->st_mode) && !S_ISFIFO(sb->st_mode))
        st = ferry_fail(FERRY_ERR_INVALID, "config file %s: not a regular file", path);
    size_t n = 0;
    char *buf = st == FERRY_OK ? malloc(CONFIG_FILE_MAX + 1) : NULL;
    if (st == FERRY_OK && !buf) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    while (st == FERRY_OK) {
        ssize_t r = read(fd, buf + n, CONFIG_FILE_MAX + 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) st = ferry_fail(FERRY_ERR_IO, "config file %s: %s", path, strerror(errno));
        else if (r == 0) break;
        else if ((n += (size_t)r) > CONFIG_FILE_MAX)
            st = ferry_fail(FERRY_ERR_INVALID, "config file %s: more than %u bytes; a config file holds at most that",
                            path, CONFIG_FILE_MAX);
    }
    close(fd);
    if (st != FERRY_OK) {
        free(buf);
        return st;
    }
    buf[n] = '\0';
    *text = buf;
    *len = n;
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

/* The flag text for a JSON value of the setting's type: in buf, or for
 * strings in the config's arena. A wrong type is an error naming it. */
static ferry_status value_text(ferry_config *cfg, int id, const json_value *v, int line, char *buf, size_t cap,
                               const char **out)
{
    const setting_def *d = &config_settings[id];
    static const char *wants[] = {"a string", "an integer", "a number", "true or false",
                                  "a size (\"4GiB\" or an integer of bytes)",
                                  "a non-negative integer (or a string of digits)"};
    /* an integer written 2.0 is still an integer; beyond 2^53 a JSON number
     * (a double to most writers and readers) is not exact */
    bool integral = v->type == JSON_NUMBER && (v->is_int || v->number == floor(v->number));
    if (integral && !v->is_int && fabs(v->number) > 9007199254740992.0 && d->type != SET_INT)
        return ferry_fail(FERRY_ERR_INVALID, "%s:%d: %s: a JSON number beyond 2^53 is not exact: write it as a string",
                          cfg->config_file, line, d->name);
    *out = buf;
    switch (d->type) {
    case SET_STR:
    case SET_SIZE:
    case SET_U64:
        if (v->type == JSON_STRING && (d->type != SET_U64 || (v->len && strspn(v->str, "0123456789") == v->len))) {
            if (!(*out = arena_strdup(&cfg->strings, v->str, v->len))) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
            return FERRY_OK;
        }
        if (d->type == SET_STR || !integral) break;
        __attribute__((fallthrough)); /* an integer of bytes, or a seed */
    case SET_INT:
        if (!integral) break;
        if (v->is_int) snprintf(buf, cap, "%" PRId64, v->integer);
        else snprintf(buf, cap, "%.0f", v->number); /* out of range: the range check says so */
        return FERRY_OK;
    case SET_FLOAT:
        if (v->type != JSON_NUMBER) break;
        util_fmt_double(v->number, buf, cap);
        return FERRY_OK;
    case SET_BOOL:
        if (v->type != JSON_BOOL) break;
        snprintf(buf, cap, "%s", v->boolean ? "true" : "false");
        return FERRY_OK;
    }
    return ferry_fail(FERRY_ERR_INVALID, "%s:%d: %s must be %s, not %s", cfg->config_file, line, d->name,
                      wants[d->type], json_type_name(v));
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
            int near = config_closest(m->key, SETTING_NOFILE);
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
        char buf[400];
        const char *v = NULL;
        FERRY_TRY(value_text(cfg, id, &m->value, line, buf, sizeof buf, &v));
        FERRY_TRY(config_set(cfg, id, v, SOURCE_FILE, line));
    }
    return FERRY_OK;
}

/* A secret in a file someone else may read or write is no secret: refuse
 * it as a token file is refused (the user's own, mode 0600), naming the
 * setting and the fix. */
static ferry_status check_secrets(const ferry_config *cfg, const struct stat *sb)
{
    for (int i = 0; i < SETTING_COUNT; i++) {
        if (config_settings[i].where != SETTING_SECRET || cfg->source[i] != SOURCE_FILE) continue;
        if (!sb)
            return ferry_fail(FERRY_ERR_INVALID, "%s:%d: %s is a secret, which only a file of this user's, mode 0600, "
                              "may hold", cfg->config_file, cfg->line[i], config_settings[i].name);
        if (sb->st_uid != geteuid())
            return ferry_fail(FERRY_ERR_INVALID, "%s:%d: %s is a secret, but the file is owned by uid %u, not by this user (uid %u)",
                              cfg->config_file, cfg->line[i], config_settings[i].name, (unsigned)sb->st_uid,
                              (unsigned)geteuid());
        if (sb->st_mode & 077)
            return ferry_fail(FERRY_ERR_INVALID,
                              "%s:%d: %s is a secret, but the file's mode %04o lets group or others read it: chmod 600 %s",
                              cfg->config_file, cfg->line[i], config_settings[i].name,
                              (unsigned)(sb->st_mode & 07777), cfg->config_file);
    }
    return FERRY_OK;
}

ferry_status config_load_text(ferry_config *cfg, const char *name, const char *text, size_t len,
                              const struct stat *sb)
{
    if (!(cfg->config_file = arena_strdup(&cfg->strings, name, strlen(name))))
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    /* a UTF-8 byte-order mark, as some editors write, is not JSON: skip it
     * (offsets, and so lines and columns, count from after it) */
    size_t bom = len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3) ? 3 : 0;
    json_doc *doc;
    ferry_status st = json_parse(text + bom, len - bom, &doc);
    if (st != FERRY_OK && st != FERRY_ERR_INVALID) return ferry_fail_context(st, "config file %s", name);
    if (st != FERRY_OK) {
        const char *t = text + bom;
        size_t pos = json_error_pos();
        int line = line_of(t, len - bom, pos);
        size_t col = 1;
        while (col <= pos && t[pos - col] != '\n') col++;
        /* "invalid JSON at byte N: what" -> "what" */
        char msg[FERRY_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", ferry_errmsg());
        const char *what = strstr(msg, ": ");
        return ferry_fail(FERRY_ERR_INVALID, "%s:%d:%zu: invalid JSON: %s", name, line, col, what ? what + 2 : msg);
    }
    const json_value *root = json_doc_root(doc);
    if (root->type != JSON_OBJECT)
        st = ferry_fail(FERRY_ERR_INVALID, "%s: a config file holds one JSON object of settings, not %s", name,
                        json_type_name(root));
    else
        st = apply(cfg, root, text + bom, len - bom);
    if (st == FERRY_OK) st = check_secrets(cfg, sb);
    json_doc_free(doc);
    return st;
}

ferry_status config_load_file(ferry_config *cfg, const char *path)
{
    char *text;
    size_t len = 0;
    struct stat sb;
    FERRY_TRY(read_file(path, &text, &len, &sb));
    ferry_status st = config_load_text(cfg, path, text, len, &sb);
    free(text);
    return st;
}
