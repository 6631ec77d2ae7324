/*
 * template_tool.c - renders one chat template for many variable sets with
 * text/chat_template.c, for tests/integration/test_chat_template.py
 * (and for throwing mutated templates at the interpreter under ASan).
 *
 *   template_tool [--max-out BYTES] TEMPLATE_FILE CASES_JSON
 *
 * CASES_JSON holds a JSON array of objects, each the top-level variables of
 * one render (messages, add_generation_prompt, bos_token, tools, ...). One
 * JSON object per line is printed for each case, in order:
 *   {"ok": true, "out": "<rendered text>"}
 *   {"ok": false, "status": "invalid", "error": "<message>"}
 * When the template does not parse, a single line says so instead:
 *   {"ok": false, "parse": true, "status": "invalid", "error": "<message>"}
 * Both are normal outcomes (exit status 0). Bad usage or unreadable files are
 * one line on stderr starting "template_tool: ", exit status 2.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/base/json.h"
#include "../../text/chat_template.h"

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (n < cap) break;
        cap *= 2;
        char *nb = realloc(buf, cap);
        if (!nb) {
            free(buf);
            buf = NULL;
        }
        buf = nb;
    }
    fclose(f);
    *len = n;
    return buf;
}

/* a JSON string of p[0..n), NUL bytes included */
static void put_json_str(const char *p, size_t n)
{
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        switch (c) {
        case '"': fputs("\\\"", stdout); break;
        case '\\': fputs("\\\\", stdout); break;
        case '\n': fputs("\\n", stdout); break;
        case '\r': fputs("\\r", stdout); break;
        case '\t': fputs("\\t", stdout); break;
        default:
            if (c < 0x20) printf("\\u%04x", c);
            else putchar(c);
        }
    }
    putchar('"');
}

static void put_error(ferry_status st, bool parse)
{
    const char *m = ferry_errmsg();
    printf("{\"ok\": false, %s\"status\": ", parse ? "\"parse\": true, " : "");
    put_json_str(ferry_status_name(st), strlen(ferry_status_name(st)));
    fputs(", \"error\": ", stdout);
    put_json_str(m, strlen(m));
    fputs("}\n", stdout);
}

int main(int argc, char **argv)
{
    size_t max_out = (size_t)64 << 20;
    int a = 1;
    if (a + 1 < argc && strcmp(argv[a], "--max-out") == 0) {
        max_out = strtoull(argv[a + 1], NULL, 10);
        a += 2;
    }
    if (argc - a != 2) {
        fprintf(stderr, "template_tool: usage: template_tool [--max-out BYTES] TEMPLATE_FILE CASES_JSON\n");
        return 2;
    }
    size_t tlen, clen;
    char *tsrc = read_all(argv[a], &tlen);
    if (!tsrc) {
        fprintf(stderr, "template_tool: %s: %s\n", argv[a], strerror(errno));
        return 2;
    }
    char *csrc = read_all(argv[a + 1], &clen);
    if (!csrc) {
        fprintf(stderr, "template_tool: %s: %s\n", argv[a + 1], strerror(errno));
        free(tsrc);
        return 2;
    }
    json_doc *doc = NULL;
    if (json_parse(csrc, clen, &doc) != FERRY_OK || json_doc_root(doc)->type != JSON_ARRAY) {
        fprintf(stderr, "template_tool: %s: not a JSON array of cases: %s\n", argv[a + 1],
                doc ? "top level is not an array" : ferry_errmsg());
        json_doc_free(doc);
        free(tsrc);
        free(csrc);
        return 2;
    }
    chat_template *t = NULL;
    ferry_status st = tmpl_parse(tsrc, tlen, "chat template", &t);
    if (st != FERRY_OK) {
        put_error(st, true);
    } else {
        const json_value *cases = json_doc_root(doc);
        for (size_t i = 0; i < cases->len; i++) {
            strbuf out;
            sb_init(&out);
            st = tmpl_render(t, &cases->items[i], max_out, &out);
            if (st == FERRY_OK) {
                fputs("{\"ok\": true, \"out\": ", stdout);
                put_json_str(out.data ? out.data : "", out.len);
                fputs("}\n", stdout);
            } else {
                put_error(st, false);
            }
            sb_free(&out);
        }
    }
    tmpl_free(t);
    json_doc_free(doc);
    free(tsrc);
    free(csrc);
    return fflush(stdout) == 0 ? 0 : 2;
}
