/*
 * json.h - a small strict JSON reader (RFC 8259) and a string builder that
 * writes JSON.
 *
 * The reader parses a whole document into a tree held in one arena (freed at
 * once with json_doc_free). It checks UTF-8, rejects trailing garbage, limits
 * nesting depth, and keeps integers exact: a number written without fraction
 * or exponent that fits in int64 has is_int set. Object members keep their
 * order and duplicates; callers that must reject duplicate keys (safetensors
 * headers) check for them. Used for safetensors headers, config.json, the
 * shard index, the offload manifest and request bodies.
 */
#ifndef FERRY_JSON_H
#define FERRY_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type;

typedef struct json_value json_value;
typedef struct json_member json_member;

/* 40 bytes: a tree costs at most ~20x its text ("1," per value), which is
 * what bounds parse memory by the input size (json_parse_limited). */
struct json_value {
    json_type type;
    bool boolean;
    bool is_int;          /* number literal is an integer that fits int64   */
    int64_t integer;      /* valid when is_int                              */
    double number;        /* every number                                   */
    size_t len;           /* string length in bytes, or item/member count   */
    union {
        const char *str;      /* JSON_STRING: decoded, NUL-terminated       */
        json_value *items;    /* JSON_ARRAY: len items                      */
        json_member *members; /* JSON_OBJECT: len members, in document order */
    };
};

struct json_member {
    const char *key;  /* decoded, NUL-terminated                                 */
    uint32_t key_len; /* keys of 4 GiB and more are refused                      */
    uint32_t offset;  /* byte offset of the key's '"', for line numbers (at most */
    json_value value; /* UINT32_MAX: further on, the offset saturates)           */
};

typedef struct json_doc json_doc;

/* Parses text[0..len). On error returns FERRY_ERR_INVALID with a message
 * giving the byte offset ("at byte 17: expected ':'"). */
ferry_status json_parse(const char *text, size_t len, json_doc **out);
/* The byte offset where this thread's last failed parse stopped, for callers
 * that report a line and column instead. */
size_t json_error_pos(void);
/* The same, failing with FERRY_ERR_TOO_LARGE ("... more than N bytes to
 * parse") once the memory the parse holds at any moment - tree, strings and
 * growing lists - would pass max_bytes. */
ferry_status json_parse_limited(const char *text, size_t len, size_t max_bytes, json_doc **out);
/* Bytes the tree holds (for memory accounting). */
size_t json_doc_bytes(const json_doc *doc);
const json_value *json_doc_root(const json_doc *doc);
void json_doc_free(json_doc *doc);

/* The last member named key (duplicates: the last wins, as in Python), or
 * NULL (also when obj is not an object). */
const json_value *json_get(const json_value *obj, const char *key);

/* Typed accessors for optional config-style fields: return true and store the
 * value when the member exists with the right type; false when absent or
 * null; on a wrong type they set *bad = true (so callers can name the field). */
bool json_get_int(const json_value *obj, const char *key, int64_t *out, bool *bad);
bool json_get_num(const json_value *obj, const char *key, double *out, bool *bad);
bool json_get_bool(const json_value *obj, const char *key, bool *out, bool *bad);
const char *json_get_str(const json_value *obj, const char *key, bool *bad);

/* ---- writer ---------------------------------------------------------- */

typedef struct {
    char *data;
    size_t len, cap;
    bool oom; /* set once an allocation failed; further appends are dropped */
} strbuf;

void sb_init(strbuf *sb);
void sb_free(strbuf *sb);
void sb_putc(strbuf *sb, char c);
void sb_puts(strbuf *sb, const char *s);
void sb_append(strbuf *sb, const void *p, size_t n);
void sb_printf(strbuf *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s as a quoted JSON string with escapes. */
void sb_json_str(strbuf *sb, const char *s);
/* The same for s[0..len), which may hold NUL bytes (written \u0000). */
void sb_json_strn(strbuf *sb, const char *s, size_t len);
/* Appends a float so that it reads back exactly (%.9g; nan/inf as null). */
void sb_json_f32(strbuf *sb, float v);
/* Appends a parsed value as JSON, objects one member per line indented by
 * `indent` + 2: integers as written, other numbers in the shortest form that
 * reads back exactly (with a fraction, so they stay floats). */
void sb_json_value(strbuf *sb, const json_value *v, int indent);

#endif
