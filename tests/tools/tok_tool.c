/*
 * tok_tool.c - runs many tokenizer cases in one process, for
 * tests/integration/test_tokenizer.py and bench/tokenizer_bench.py (the
 * CLI would pay a tokenizer load per case).
 *
 *   tok_tool DIR --cases FILE     one answer line per case line of FILE
 *   tok_tool DIR --bench FILE [N] encode FILE N times (default 3), report
 *                                 the load time and the best encode time
 *
 * A case is a header line, then for E a payload of `len` raw bytes and a
 * newline:
 *   E <add_special 0|1> <parse_special 0|1> <len>\n<bytes>\n
 *       -> "OK id id ..."
 *   D <skip_special 0|1> <n> id id ...\n  -> "OK <hex of tok_decode's text>"
 *   S <skip_special 0|1> <n> id id ...\n  -> "OK <hex of the pushes and the
 *       flush, one id at a time> <hex of tok_decode's text>"
 * A failed case answers "ERR <status name>: <message>". The whole answer for
 * the bench is one JSON line. Usage errors: exit status 2.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/base/json.h"
#include "../../engine/base/util.h"
#include "../../text/tokenizer.h"

static void put_hex(const char *s, size_t n)
{
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        putchar(hx[c >> 4]);
        putchar(hx[c & 15]);
    }
    if (n == 0) putchar('-');
}

static void put_err(ferry_status st)
{
    printf("ERR %s: %s\n", ferry_status_name(st), ferry_errmsg());
}

static int32_t *read_ids(FILE *f, int n)
{
    int32_t *ids = malloc((n > 0 ? (size_t)n : 1) * sizeof *ids);
    if (!ids) abort();
    for (int i = 0; i < n; i++) {
        long v;
        if (fscanf(f, "%ld", &v) != 1) {
            fprintf(stderr, "tok_tool: truncated id list\n");
            exit(2);
        }
        ids[i] = (int32_t)v;
    }
    return ids;
}

static void case_encode(const tokenizer *t, FILE *f, int add, int parse, size_t len)
{
    char *text = malloc(len + 1);
    if (!text || fread(text, 1, len, f) != len || fgetc(f) != '\n') {
        fprintf(stderr, "tok_tool: truncated text\n");
        exit(2);
    }
    int32_t *ids;
    int n;
    ferry_status st = tok_encode(t, text, len, add != 0, parse != 0, &ids, &n);
    free(text);
    if (st != FERRY_OK) {
        put_err(st);
        return;
    }
    fputs("OK", stdout);
    for (int i = 0; i < n; i++) printf(" %d", (int)ids[i]);
    putchar('\n');
    free(ids);
}

static void case_decode(const tokenizer *t, const int32_t *ids, int n, int skip, bool stream)
{
    strbuf whole, pushed;
    sb_init(&whole);
    sb_init(&pushed);
    ferry_status st = tok_decode(t, ids, n, skip != 0, &whole);
    if (st == FERRY_OK && stream) {
        tok_stream *s = tok_stream_new(t, skip != 0);
        if (!s) abort();
        for (int i = 0; i < n && st == FERRY_OK; i++) st = tok_stream_push(s, ids[i], &pushed);
        if (st == FERRY_OK) tok_stream_flush(s, &pushed);
        tok_stream_free(s);
    }
    if (st != FERRY_OK) {
        put_err(st);
    } else {
        fputs("OK ", stdout);
        if (stream) {
            put_hex(pushed.data, pushed.len);
            putchar(' ');
        }
        put_hex(whole.data, whole.len);
        putchar('\n');
    }
    sb_free(&whole);
    sb_free(&pushed);
}

static int run_cases(const tokenizer *t, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "tok_tool: %s: cannot open\n", path);
        return 2;
    }
    char kind;
    while (fscanf(f, " %c", &kind) == 1) {
        int a, b, n;
        size_t len;
        if (kind == 'E') {
            if (fscanf(f, "%d %d %zu", &a, &b, &len) != 3 || fgetc(f) != '\n') break;
            case_encode(t, f, a, b, len);
        } else if (kind == 'D' || kind == 'S') {
            if (fscanf(f, "%d %d", &a, &n) != 2 || n < 0) break;
            int32_t *ids = read_ids(f, n);
            case_decode(t, ids, n, a, kind == 'S');
            free(ids);
        } else {
            fprintf(stderr, "tok_tool: unknown case kind '%c'\n", kind);
            fclose(f);
            return 2;
        }
        fflush(stdout);
    }
    fclose(f);
    return 0;
}

static int run_bench(const tokenizer *t, double load_s, const char *path, int reps)
{
    char *text;
    size_t len;
    if (util_read_file(path, &text, &len) != FERRY_OK) {
        fprintf(stderr, "tok_tool: %s\n", ferry_errmsg());
        return 2;
    }
    double best = 1e30;
    int n = 0;
    for (int r = 0; r < reps; r++) {
        int32_t *ids;
        double t0 = util_now();
        ferry_status st = tok_encode(t, text, len, false, true, &ids, &n);
        double dt = util_now() - t0;
        if (st != FERRY_OK) {
            fprintf(stderr, "tok_tool: %s\n", ferry_errmsg());
            free(text);
            return 1;
        }
        free(ids);
        if (dt < best) best = dt;
    }
    printf("{\"load_s\": %.6f, \"encode_s\": %.6f, \"bytes\": %zu, \"tokens\": %d}\n", load_s, best, len, n);
    free(text);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 4 || (strcmp(argv[2], "--cases") && strcmp(argv[2], "--bench"))) {
        fprintf(stderr, "usage: tok_tool DIR --cases FILE | tok_tool DIR --bench FILE [N]\n");
        return 2;
    }
    tokenizer *t;
    double t0 = util_now();
    ferry_status st = tok_load(argv[1], &t);
    double load_s = util_now() - t0;
    if (st != FERRY_OK) {
        printf("LOADERR %s: %s\n", ferry_status_name(st), ferry_errmsg());
        return 1;
    }
    int rc = !strcmp(argv[2], "--cases") ? run_cases(t, argv[3])
                                          : run_bench(t, load_s, argv[3], argc > 4 ? atoi(argv[4]) : 3);
    tok_free(t);
    return rc;
}
