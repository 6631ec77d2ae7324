/*
 * json.c - strict JSON reader into an arena-held tree, and the strbuf writer.
 * See json.h for the contract.
 */
#include "json.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 128
/* Every value costs a tree node (~56 bytes): a cap keeps a hostile 100 MB
 * header or request body from costing gigabytes. Real safetensors headers
 * hold a few thousand tensors (4 values each). */
#define JSON_MAX_NODES (1u << 22)

/* ---- arena ------------------------------------------------------------ */

typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} arena_block;

/* The tree lives in blocks: arena blocks for strings, and the finished
 * item/member lists, each its own block (a list grows in place while it is
 * parsed and is kept, not copied, when it ends). `held` counts every byte
 * allocated for the document, lists still growing included, against
 * `limit`. */
struct json_doc {
    arena_block *blocks;     /* arena blocks: the head has room */
    arena_block *lists;      /* finished lists */
    size_t held, limit;
    bool refused;            /* an allocation would have passed the limit */
    json_value root;
};

/* Accounts n more bytes; false when that would pass the limit. */
static bool doc_take(json_doc *doc, size_t n)
{
    if (n > doc->limit - doc->held) return !(doc->refused = true);
    doc->held += n;
    return true;
}

#define ARENA_BLOCK 65536

/* NULL: out of memory, or past the limit (doc->refused) */
static void *arena_alloc(json_doc *doc, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    arena_block *b = doc->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > ARENA_BLOCK ? n : ARENA_BLOCK;
        if (!doc_take(doc, sizeof *b + cap)) return NULL;
        b = malloc(sizeof *b + cap);
        if (!b) {
            doc->held -= sizeof *b + cap;
            return NULL;
        }
        b->cap = cap;
        b->used = 0;
        b->next = doc->blocks;
        doc->blocks = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    return p;
}

/* ---- parser ----------------------------------------------------------- */

typedef struct {
    const char *s;
    size_t len, pos;
    json_doc *doc;
    ferry_status st;
    size_t nodes;
} parser;

static _Thread_local size_t t_error_pos;

size_t json_error_pos(void) { return t_error_pos; }

static bool perr(parser *p, const char *what)
{
    if (p->st == FERRY_OK) {
        t_error_pos = p->pos;
        p->st = ferry_fail(FERRY_ERR_INVALID, "invalid JSON at byte %zu: %s", p->pos, what);
    }
    return false;
}

/* An allocation failed: past the limit, or the system's memory. */
static bool oom(parser *p)
{
    if (p->st != FERRY_OK) return false;
    if (p->doc->refused)
        p->st = ferry_fail(FERRY_ERR_TOO_LARGE, "JSON of %zu bytes needs more than %zu bytes to parse", p->len,
                           p->doc->limit);
    else
        p->st = ferry_fail(FERRY_ERR_NOMEM, "out of memory parsing JSON");
    return false;
}

static void skip_ws(parser *p)
{
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static bool parse_value(parser *p, json_value *v, int depth);

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool read_hex4(parser *p, unsigned *out)
{
    if (p->len - p->pos < 4) return perr(p, "truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p->s[p->pos + i]);
        if (h < 0) return perr(p, "bad hex digit in \\u escape");
        v = v * 16 + (unsigned)h;
    }
    p->pos += 4;
    *out = v;
    return true;
}

/* Length of the valid UTF-8 sequence starting at s (n bytes left), 0 if invalid:
 * no overlong forms, no surrogates, nothing above U+10FFFF. */
static size_t utf8_seq_len(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return (n >= 2 && (s[1] & 0xC0) == 0x80) ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && s[1] < 0xA0) return 0; /* overlong */
        if (c == 0xED && s[1] > 0x9F) return 0; /* surrogate */
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
            return 0;
        if (c == 0xF0 && s[1] < 0x90) return 0; /* overlong */
        if (c == 0xF4 && s[1] > 0x8F) return 0; /* > U+10FFFF */
        return 4;
    }
    return 0;
}

/* Parses a string at p->pos (which is at the opening quote). The decoded
 * form is never longer than the source, so one allocation suffices. */
static bool parse_string(parser *p, const char **out, size_t *out_len)
{
    p->pos++; /* opening quote */
    size_t start = p->pos;
    /* find the closing quote to size the buffer */
    size_t end = start;
    while (end < p->len && p->s[end] != '"') {
        if (p->s[end] == '\\') end++;
        end++;
    }
    if (end >= p->len) return perr(p, "unterminated string");
    char *dst = arena_alloc(p->doc, end - start + 1);
    if (!dst) return oom(p);
    size_t n = 0;
    while (p->s[p->pos] != '"') {
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c < 0x20) return perr(p, "control character in string");
        if (c == '\\') {
            p->pos++;
            char e = p->s[p->pos++];
            switch (e) {
            case '"': dst[n++] = '"'; break;
            case '\\': dst[n++] = '\\'; break;
            case '/': dst[n++] = '/'; break;
            case 'b': dst[n++] = '\b'; break;
            case 'f': dst[n++] = '\f'; break;
            case 'n': dst[n++] = '\n'; break;
            case 'r': dst[n++] = '\r'; break;
            case 't': dst[n++] = '\t'; break;
            case 'u': {
                unsigned cp;
                if (!read_hex4(p, &cp)) return false;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    unsigned lo;
                    if (p->len - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
                        return perr(p, "unpaired surrogate in \\u escape");
                    p->pos += 2;
                    if (!read_hex4(p, &lo)) return false;
                    if (lo < 0xDC00 || lo > 0xDFFF) return perr(p, "unpaired surrogate in \\u escape");
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    return perr(p, "unpaired surrogate in \\u escape");
                }
                if (cp == 0) return perr(p, "\\u0000 in string is not supported");
                n += util_utf8_put(dst + n, cp);
                break;
            }
            default: p->pos--; return perr(p, "bad escape in string");
            }
            continue;
        }
        size_t k = utf8_seq_len((const unsigned char *)p->s + p->pos, p->len - p->pos);
        if (k == 0) return perr(p, "invalid UTF-8 in string");
        memcpy(dst + n, p->s + p->pos, k);
        n += k;
        p->pos += k;
    }
    p->pos++; /* closing quote */
    dst[n] = '\0';
    *out = dst;
    *out_len = n;
    return true;
}

static bool parse_number(parser *p, json_value *v)
{
    size_t start = p->pos;
    bool integral = true;
    if (p->s[p->pos] == '-') p->pos++;
    if (p->pos >= p->len) return perr(p, "truncated number");
    if (p->s[p->pos] == '0') {
        p->pos++;
    } else if (p->s[p->pos] >= '1' && p->s[p->pos] <= '9') {
        while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
    } else {
        return perr(p, "bad number");
    }
    if (p->pos < p->len && p->s[p->pos] == '.') {
        integral = false;
        p->pos++;
        if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9') return perr(p, "bad fraction");
        while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
    }
    if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
        integral = false;
        p->pos++;
        if (p->pos < p->len && (p->s[p->pos] == '+' || p->s[p->pos] == '-')) p->pos++;
        if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9') return perr(p, "bad exponent");
        while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
    }
    size_t n = p->pos - start;
    char buf[64];
    char *tmp = n < sizeof buf ? buf : malloc(n + 1);
    if (!tmp) return oom(p);
    memcpy(tmp, p->s + start, n);
    tmp[n] = '\0';
    v->type = JSON_NUMBER;
    v->number = strtod(tmp, NULL);
    if (integral) {
        errno = 0;
        long long ll = strtoll(tmp, NULL, 10);
        if (errno == 0) {
            v->is_int = true;
            v->integer = ll;
        }
    }
    if (tmp != buf) free(tmp);
    return true;
}

static bool match_lit(parser *p, const char *lit)
{
    size_t n = strlen(lit);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, lit, n) != 0) return perr(p, "unexpected token");
    p->pos += n;
    return true;
}

/* A list being parsed: its own block, grown by half each time (so it holds
 * at most 1.5x what it needs), kept as it is when the list ends. */
typedef struct {
    arena_block *blk;
    size_t n, cap, elem;
} vec;

static void *vec_push(json_doc *doc, vec *v)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap + v->cap / 2 : 8;
        if (!doc_take(doc, (cap - v->cap) * v->elem)) return NULL;
        arena_block *b = realloc(v->blk, sizeof *b + cap * v->elem);
        if (!b) {
            doc->held -= (cap - v->cap) * v->elem;
            return NULL;
        }
        if (!v->blk) doc->held += sizeof *b;
        v->blk = b;
        v->cap = cap;
    }
    return v->blk->data + v->elem * v->n++;
}

static void vec_drop(json_doc *doc, vec *v)
{
    if (v->blk) doc->held -= sizeof *v->blk + v->cap * v->elem;
    free(v->blk);
    v->blk = NULL;
}

static bool vec_finish(parser *p, vec *v, void **out)
{
    *out = NULL;
    if (!v->blk) return true;
    if (v->n < v->cap) {
        /* give back the unused room: a document of many short lists (a
         * tokenizer.json's 300k merge pairs) would otherwise hold 4x its tree */
        arena_block *b = realloc(v->blk, sizeof *b + v->n * v->elem);
        if (b) {
            p->doc->held -= (v->cap - v->n) * v->elem;
            v->blk = b;
            v->cap = v->n;
        }
    }
    v->blk->next = p->doc->lists;
    p->doc->lists = v->blk;
    *out = v->blk->data;
    return true;
}

static bool parse_array(parser *p, json_value *v, int depth)
{
    vec items = {NULL, 0, 0, sizeof(json_value)};
    p->pos++;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == ']') {
        p->pos++;
    } else {
        for (;;) {
            json_value *it = vec_push(p->doc, &items);
            if (!it) { vec_drop(p->doc, &items); return oom(p); }
            if (!parse_value(p, it, depth + 1)) { vec_drop(p->doc, &items); return false; }
            skip_ws(p);
            if (p->pos < p->len && p->s[p->pos] == ',') { p->pos++; continue; }
            if (p->pos < p->len && p->s[p->pos] == ']') { p->pos++; break; }
            vec_drop(p->doc, &items);
            return perr(p, "expected ',' or ']'");
        }
    }
    v->type = JSON_ARRAY;
    v->len = items.n;
    return vec_finish(p, &items, (void **)&v->items);
}

static bool parse_object(parser *p, json_value *v, int depth)
{
    vec mem = {NULL, 0, 0, sizeof(json_member)};
    p->pos++;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == '}') {
        p->pos++;
    } else {
        for (;;) {
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != '"') { vec_drop(p->doc, &mem); return perr(p, "expected string key"); }
            json_member *m = vec_push(p->doc, &mem);
            if (!m) { vec_drop(p->doc, &mem); return oom(p); }
            memset(m, 0, sizeof *m);
            m->offset = p->pos > UINT32_MAX ? UINT32_MAX : (uint32_t)p->pos;
            size_t key_len;
            if (!parse_string(p, &m->key, &key_len)) { vec_drop(p->doc, &mem); return false; }
            if (key_len > UINT32_MAX) { vec_drop(p->doc, &mem); return perr(p, "object key of 4 GiB or more"); }
            m->key_len = (uint32_t)key_len;
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':') { vec_drop(p->doc, &mem); return perr(p, "expected ':'"); }
            p->pos++;
            if (!parse_value(p, &m->value, depth + 1)) { vec_drop(p->doc, &mem); return false; }
            skip_ws(p);
            if (p->pos < p->len && p->s[p->pos] == ',') { p->pos++; continue; }
            if (p->pos < p->len && p->s[p->pos] == '}') { p->pos++; break; }
            vec_drop(p->doc, &mem);
            return perr(p, "expected ',' or '}'");
        }
    }
    v->type = JSON_OBJECT;
    v->len = mem.n;
    return vec_finish(p, &mem, (void **)&v->members);
}

static bool parse_value(parser *p, json_value *v, int depth)
{
    memset(v, 0, sizeof *v);
    if (depth > JSON_MAX_DEPTH) return perr(p, "nesting too deep");
    if (++p->nodes > JSON_MAX_NODES) return perr(p, "too many values (limit 4194304)");
    skip_ws(p);
    if (p->pos >= p->len) return perr(p, "unexpected end of input");
    switch (p->s[p->pos]) {
    case '{': return parse_object(p, v, depth);
    case '[': return parse_array(p, v, depth);
    case '"':
        v->type = JSON_STRING;
        return parse_string(p, &v->str, &v->len);
    case 't': v->type = JSON_BOOL; v->boolean = true; return match_lit(p, "true");
    case 'f': v->type = JSON_BOOL; return match_lit(p, "false");
    case 'n': v->type = JSON_NULL; return match_lit(p, "null");
    default: return parse_number(p, v);
    }
}

ferry_status json_parse(const char *text, size_t len, json_doc **out)
{
    return json_parse_limited(text, len, SIZE_MAX, out);
}

ferry_status json_parse_limited(const char *text, size_t len, size_t max_bytes, json_doc **out)
{
    *out = NULL;
    json_doc *doc = calloc(1, sizeof *doc);
    if (!doc) return ferry_fail(FERRY_ERR_NOMEM, "out of memory parsing JSON");
    doc->limit = max_bytes;
    parser p = {text, len, 0, doc, FERRY_OK, 0};
    if (parse_value(&p, &doc->root, 0)) {
        skip_ws(&p);
        if (p.pos != p.len) perr(&p, "trailing characters after the JSON value");
    }
    if (p.st != FERRY_OK) {
        json_doc_free(doc);
        return p.st;
    }
    *out = doc;
    return FERRY_OK;
}

const json_value *json_doc_root(const json_doc *doc) { return &doc->root; }

size_t json_doc_bytes(const json_doc *doc) { return sizeof *doc + doc->held; }

static void free_blocks(arena_block *b)
{
    while (b) {
        arena_block *next = b->next;
        free(b);
        b = next;
    }
}

void json_doc_free(json_doc *doc)
{
    if (!doc) return;
    free_blocks(doc->blocks);
    free_blocks(doc->lists);
    free(doc);
}

const json_value *json_get(const json_value *obj, const char *key)
{
    if (!obj || obj->type != JSON_OBJECT) return NULL;
    /* the last of duplicate keys wins, as in Python's json (what wrote most configs) */
    for (size_t i = obj->len; i-- > 0;)
        if (strcmp(obj->members[i].key, key) == 0) return &obj->members[i].value;
    return NULL;
}

bool json_get_int(const json_value *obj, const char *key, int64_t *out, bool *bad)
{
    const json_value *v = json_get(obj, key);
    if (!v || v->type == JSON_NULL) return false;
    if (v->type != JSON_NUMBER || !v->is_int) { *bad = true; return false; }
    *out = v->integer;
    return true;
}

bool json_get_num(const json_value *obj, const char *key, double *out, bool *bad)
{
    const json_value *v = json_get(obj, key);
    if (!v || v->type == JSON_NULL) return false;
    if (v->type != JSON_NUMBER) { *bad = true; return false; }
    *out = v->number;
    return true;
}

bool json_get_bool(const json_value *obj, const char *key, bool *out, bool *bad)
{
    const json_value *v = json_get(obj, key);
    if (!v || v->type == JSON_NULL) return false;
    if (v->type != JSON_BOOL) { *bad = true; return false; }
    *out = v->boolean;
    return true;
}

const char *json_get_str(const json_value *obj, const char *key, bool *bad)
{
    const json_value *v = json_get(obj, key);
    if (!v || v->type == JSON_NULL) return NULL;
    if (v->type != JSON_STRING) { *bad = true; return NULL; }
    return v->str;
}

/* ---- writer ----------------------------------------------------------- */

void sb_init(strbuf *sb) { memset(sb, 0, sizeof *sb); }

void sb_free(strbuf *sb)
{
    free(sb->data);
    memset(sb, 0, sizeof *sb);
}

static bool sb_reserve(strbuf *sb, size_t extra)
{
    if (sb->oom) return false;
    if (sb->len + extra + 1 <= sb->cap) return true;
    size_t cap = sb->cap ? sb->cap : 256;
    while (cap < sb->len + extra + 1) cap *= 2;
    char *d = realloc(sb->data, cap);
    if (!d) { sb->oom = true; return false; }
    sb->data = d;
    sb->cap = cap;
    return true;
}

void sb_append(strbuf *sb, const void *p, size_t n)
{
    if (!sb_reserve(sb, n)) return;
    memcpy(sb->data + sb->len, p, n);
    sb->len += n;
    sb->data[sb->len] = '\0';
}

void sb_putc(strbuf *sb, char c) { sb_append(sb, &c, 1); }
void sb_puts(strbuf *sb, const char *s) { sb_append(sb, s, strlen(s)); }

void sb_printf(strbuf *sb, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !sb_reserve(sb, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(sb->data + sb->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb->len += (size_t)n;
}

void sb_json_strn(strbuf *sb, const char *s, size_t len)
{
    sb_putc(sb, '"');
    size_t run = 0; /* bytes copied as they are, appended at once */
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            run++;
            continue;
        }
        if (run) sb_append(sb, s + i - run, run);
        run = 0;
        switch (c) {
        case '"': sb_puts(sb, "\\\""); break;
        case '\\': sb_puts(sb, "\\\\"); break;
        case '\n': sb_puts(sb, "\\n"); break;
        case '\r': sb_puts(sb, "\\r"); break;
        case '\t': sb_puts(sb, "\\t"); break;
        default: sb_printf(sb, "\\u%04x", c);
        }
    }
    if (run) sb_append(sb, s + len - run, run);
    sb_putc(sb, '"');
}

void sb_json_str(strbuf *sb, const char *s) { sb_json_strn(sb, s, strlen(s)); }

void sb_json_f32(strbuf *sb, float v)
{
    if (!isfinite(v)) sb_puts(sb, "null");
    else sb_printf(sb, "%.9g", (double)v);
}

/* ---- writing a parsed value back ---------------------------------------------- */

static void json_number_out(strbuf *sb, const json_value *v)
{
    if (v->is_int) {
        sb_printf(sb, "%lld", (long long)v->integer);
        return;
    }
    char buf[40];
    for (int prec = 15; prec <= 17; prec++) { /* the shortest that reads back exactly */
        snprintf(buf, sizeof buf, "%.*g", prec, v->number);
        if (strtod(buf, NULL) == v->number) break;
    }
    sb_puts(sb, buf);
    if (!strpbrk(buf, ".eEn")) sb_puts(sb, ".0"); /* written with a fraction: it stays a float */
}

void sb_json_value(strbuf *sb, const json_value *v, int indent)
{
    switch (v->type) {
    case JSON_NULL: sb_puts(sb, "null"); break;
    case JSON_BOOL: sb_puts(sb, v->boolean ? "true" : "false"); break;
    case JSON_NUMBER: json_number_out(sb, v); break;
    case JSON_STRING: sb_json_str(sb, v->str); break;
    case JSON_ARRAY:
        sb_putc(sb, '[');
        for (size_t i = 0; i < v->len; i++) {
            if (i) sb_puts(sb, ", ");
            sb_json_value(sb, &v->items[i], indent + 2);
        }
        sb_putc(sb, ']');
        break;
    case JSON_OBJECT:
        sb_puts(sb, "{");
        for (size_t i = 0; i < v->len; i++) {
            sb_printf(sb, "%s\n%*s", i ? "," : "", indent + 2, "");
            sb_json_str(sb, v->members[i].key);
            sb_puts(sb, ": ");
            sb_json_value(sb, &v->members[i].value, indent + 2);
        }
        sb_printf(sb, "\n%*s}", indent, "");
        break;
    }
}
