/*
 * fuzz_json.c - libFuzzer target for the JSON reader (engine/json.h).
 *
 * Any input must either be rejected with no document, or parse into a tree
 * that keeps the reader's promises: strings are NUL-free and their length
 * is strlen, and writing the tree back out with the strbuf writer and
 * parsing it again gives the same tree (exact integers stay exact). A broken
 * promise aborts, which libFuzzer reports as a crash. Build: README.md.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/base/json.h"

static void write_value(strbuf *sb, const json_value *v)
{
    switch (v->type) {
    case JSON_NULL: sb_puts(sb, "null"); break;
    case JSON_BOOL: sb_puts(sb, v->boolean ? "true" : "false"); break;
    case JSON_NUMBER:
        if (v->is_int) sb_printf(sb, "%lld", (long long)v->integer);
        else if (isfinite(v->number)) sb_printf(sb, "%.17g", v->number);
        else sb_puts(sb, "0"); /* 1e999 parses to inf, which JSON cannot write */
        break;
    case JSON_STRING: sb_json_str(sb, v->str); break;
    case JSON_ARRAY:
        sb_putc(sb, '[');
        for (size_t i = 0; i < v->len; i++) {
            if (i) sb_putc(sb, ',');
            write_value(sb, &v->items[i]);
        }
        sb_putc(sb, ']');
        break;
    case JSON_OBJECT:
        sb_putc(sb, '{');
        for (size_t i = 0; i < v->len; i++) {
            if (i) sb_putc(sb, ',');
            sb_json_str(sb, v->members[i].key);
            sb_putc(sb, ':');
            write_value(sb, &v->members[i].value);
        }
        sb_putc(sb, '}');
        break;
    }
}

static void check_str(const char *s, size_t len)
{
    if (!s || strlen(s) != len) abort();
}

/* a: the fuzzed document, b: the same written out and read back. */
static void same(const json_value *a, const json_value *b)
{
    if (a->type != b->type) abort();
    switch (a->type) {
    case JSON_NULL: break;
    case JSON_BOOL:
        if (a->boolean != b->boolean) abort();
        break;
    case JSON_NUMBER:
        if (a->is_int) {
            if (!b->is_int || a->integer != b->integer || a->number != (double)a->integer) abort();
        } else if (isfinite(a->number) && b->number != a->number) {
            abort();
        }
        break;
    case JSON_STRING:
        check_str(a->str, a->len);
        if (a->len != b->len || memcmp(a->str, b->str, a->len) != 0) abort();
        break;
    case JSON_ARRAY:
        if (a->len != b->len) abort();
        for (size_t i = 0; i < a->len; i++) same(&a->items[i], &b->items[i]);
        break;
    case JSON_OBJECT:
        if (a->len != b->len) abort();
        for (size_t i = 0; i < a->len; i++) {
            check_str(a->members[i].key, a->members[i].key_len);
            if (strcmp(a->members[i].key, b->members[i].key) != 0) abort();
            same(&a->members[i].value, &b->members[i].value);
        }
        if (a->len && json_get(a, a->members[0].key) != &a->members[0].value) abort();
        break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_doc *doc = (json_doc *)1;
    if (json_parse((const char *)data, size, &doc) != FERRY_OK) {
        if (doc) abort();
        if (!strstr(ferry_errmsg(), "at byte") && !strstr(ferry_errmsg(), "out of memory")) abort();
        return 0;
    }
    strbuf sb;
    sb_init(&sb);
    write_value(&sb, json_doc_root(doc));
    json_doc *again;
    if (sb.oom) abort();
    if (json_parse(sb.data, sb.len, &again) != FERRY_OK) abort();
    same(json_doc_root(doc), json_doc_root(again));
    json_doc_free(again);
    sb_free(&sb);
    json_doc_free(doc);
    return 0;
}
