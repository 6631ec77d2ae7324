/*
 * cmd_tokenize.c - `ferry tokenize` and `ferry detokenize`: the
 * checkpoint's tokenizer (text/tokenizer.h) on the command line, for
 * scripts and for checking ferry against HF tokenizers.
 *
 *   tokenize   --text S | --file F [--add-special] [--json]
 *              ids space separated, or {"ids": [...]}. As HF's encode:
 *              special tokens' text in the input is parsed as their ids;
 *              BOS/EOS only with --add-special.
 *   detokenize --ids 1,2,3 [--json]
 *              the text and a newline, or {"text": "..."}. Special tokens
 *              are kept, as transformers' decode (skip_special_tokens=False)
 *              does by default.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/base/json.h"
#include "../engine/base/util.h"
#include "../text/tokenizer.h"
#include "cli.h"

/* A JSON string of s[0..n): unlike sb_json_str, a NUL inside is kept. */
static void json_text(strbuf *sb, const char *s, size_t n)
{
    sb_putc(sb, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') sb_puts(sb, "\\\"");
        else if (c == '\\') sb_puts(sb, "\\\\");
        else if (c == '\n') sb_puts(sb, "\\n");
        else if (c == '\r') sb_puts(sb, "\\r");
        else if (c == '\t') sb_puts(sb, "\\t");
        else if (c < 0x20) sb_printf(sb, "\\u%04x", c);
        else sb_putc(sb, (char)c);
    }
    sb_putc(sb, '"');
}

static int load(const ferry_config *cfg, tokenizer **t)
{
    ferry_status st = tok_load(cfg->model, t);
    return st == FERRY_OK ? 0 : cli_fail(st);
}

int cmd_tokenize(const ferry_config *cfg)
{
    if (!cfg->text == !cfg->file) return cli_error(EXIT_USAGE, "tokenize: give --text or --file (one of them)");
    char *buf = NULL;
    size_t len = 0;
    const char *text = cfg->text;
    if (cfg->file) {
        ferry_status st = util_read_file(cfg->file, &buf, &len);
        if (st != FERRY_OK) return cli_fail(st);
        text = buf;
    } else {
        len = strlen(text);
    }
    tokenizer *t;
    int rc = load(cfg, &t);
    if (rc) {
        free(buf);
        return rc;
    }
    int32_t *ids = NULL;
    int n = 0;
    ferry_status st = tok_encode(t, text, len, cfg->add_special, true, &ids, &n);
    free(buf);
    tok_free(t);
    if (st != FERRY_OK) return cli_fail(st);
    strbuf sb;
    sb_init(&sb);
    if (cfg->json) sb_puts(&sb, "{\"ids\": [");
    for (int i = 0; i < n; i++) sb_printf(&sb, i ? (cfg->json ? ", %d" : " %d") : "%d", (int)ids[i]);
    sb_puts(&sb, cfg->json ? "]}\n" : "\n");
    free(ids);
    if (sb.oom) {
        sb_free(&sb);
        return cli_error(EXIT_RUNTIME, "tokenize: out of memory");
    }
    fwrite(sb.data, 1, sb.len, stdout);
    sb_free(&sb);
    return 0;
}

/* "1,2,3" (spaces allowed around the numbers; "" is no ids). */
static int parse_ids(const char *s, int32_t **out, int *n)
{
    size_t cap = 16;
    int32_t *ids = malloc(cap * sizeof *ids);
    *out = NULL;
    *n = 0;
    if (!ids) return cli_error(EXIT_RUNTIME, "detokenize: out of memory");
    const char *p = s;
    while (*p == ' ') p++;
    while (*p) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < INT32_MIN || v > INT32_MAX) {
            free(ids);
            return cli_error(EXIT_USAGE, "detokenize: --ids: '%s' is not a comma-separated list of token ids", s);
        }
        if ((size_t)*n == cap) {
            int32_t *g = realloc(ids, (cap *= 2) * sizeof *g);
            if (!g) {
                free(ids);
                return cli_error(EXIT_RUNTIME, "detokenize: out of memory");
            }
            ids = g;
        }
        ids[(*n)++] = (int32_t)v;
        p = end;
        while (*p == ' ') p++;
        if (*p == ',') {
            p++;
            while (*p == ' ') p++;
            if (!*p) {
                free(ids);
                return cli_error(EXIT_USAGE, "detokenize: --ids: '%s' ends with a comma", s);
            }
        } else if (*p) {
            free(ids);
            return cli_error(EXIT_USAGE, "detokenize: --ids: '%s' is not a comma-separated list of token ids", s);
        }
    }
    *out = ids;
    return 0;
}

int cmd_detokenize(const ferry_config *cfg)
{
    int32_t *ids;
    int n;
    int rc = parse_ids(cfg->ids, &ids, &n);
    if (rc) return rc;
    tokenizer *t;
    if ((rc = load(cfg, &t))) {
        free(ids);
        return rc;
    }
    strbuf text;
    sb_init(&text);
    ferry_status st = tok_decode(t, ids, n, false, &text);
    free(ids);
    tok_free(t);
    if (st != FERRY_OK) {
        sb_free(&text);
        return cli_fail(st);
    }
    strbuf sb;
    sb_init(&sb);
    if (cfg->json) {
        sb_puts(&sb, "{\"text\": ");
        json_text(&sb, text.data ? text.data : "", text.len);
        sb_puts(&sb, "}\n");
    } else {
        sb_append(&sb, text.data ? text.data : "", text.len);
        sb_putc(&sb, '\n');
    }
    sb_free(&text);
    if (sb.oom) {
        sb_free(&sb);
        return cli_error(EXIT_RUNTIME, "detokenize: out of memory");
    }
    fwrite(sb.data, 1, sb.len, stdout);
    sb_free(&sb);
    return 0;
}
