/*
 * tmpl_lex.c - turns chat-template source into tokens, the way jinja2's
 * lexer does with transformers' settings (trim_blocks, lstrip_blocks,
 * keep_trailing_newline off).
 *
 * All whitespace control is settled here, so that the parser sees only
 * finished text (TK_DATA) between tag tokens:
 *   - "{%-", "{{-", "{#-" strip all whitespace before the tag; "-%}", "-}}",
 *     "-#}" strip all whitespace after it (newlines included);
 *   - trim_blocks drops the first newline after "%}" and "#}" (not "}}");
 *   - lstrip_blocks drops spaces and tabs between the start of a line and a
 *     "{%" or "{#" (not "{{"); "{%+" turns it off for one tag, "+%}" turns
 *     trim_blocks off for one tag.
 * "Whitespace" is Python's: str.isspace(), Unicode included, because
 * jinja's patterns use \s on str.
 *
 * jinja decides lstrip_blocks with a flag, line_starting, that says whether
 * the text before a tag begins at the start of a line: true at the start of
 * the template and after any tag whose end consumed a newline (trim_blocks,
 * or "-%}" followed by whitespace ending in one). The same flag is kept here.
 */
#include "../engine/base/util.h"
#include "tmpl_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    mem_arena *a;
    const char *s;
    size_t n, pos;
    int line;
    bool line_starting;
    tmpl_tokens *out;
    char *err;
    size_t errsz;
    char balance[TMPL_MAX_NESTING]; /* closing brackets expected inside a tag */
    int nbalance;
} lexer;

static bool lex_fail(lexer *lx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static bool lex_fail(lexer *lx, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(lx->err, lx->errsz, "line %d: %s", lx->line, msg);
    return false;
}

char *tmpl_lex_prepare(mem_arena *a, const char *src, size_t len, size_t *out_len)
{
    char *d = arena_alloc(a, len + 1);
    if (!d) return NULL;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            d[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            d[n++] = src[i];
        }
    }
    /* keep_trailing_newline=False: one final newline is not part of the output */
    if (n > 0 && d[n - 1] == '\n') n--;
    d[n] = '\0';
    *out_len = n;
    return d;
}

/* ---- helpers ---------------------------------------------------------- */

/* Length of the Python whitespace character at s[i], 0 if none. */
static size_t ws_at(const lexer *lx, size_t i)
{
    if (i >= lx->n) return 0;
    unsigned char c = (unsigned char)lx->s[i];
    if (c < 0x80) return tmpl_py_isspace(c) ? 1 : 0;
    uint32_t cp;
    size_t k = tmpl_utf8_decode((const unsigned char *)lx->s + i, lx->n - i, &cp);
    return tmpl_py_isspace(cp) ? k : 0;
}

static size_t skip_ws(const lexer *lx, size_t i)
{
    size_t k;
    while ((k = ws_at(lx, i)) > 0) i += k;
    return i;
}

/* Moves to `to`, counting the newlines passed. */
static void advance(lexer *lx, size_t to)
{
    for (size_t i = lx->pos; i < to; i++)
        if (lx->s[i] == '\n') lx->line++;
    lx->pos = to;
}

static bool push(lexer *lx, tmpl_token tok)
{
    if (lx->out->n == lx->out->cap) {
        size_t cap = lx->out->cap ? lx->out->cap * 2 : 256;
        tmpl_token *v = arena_grow(lx->a, lx->out->v, lx->out->cap * sizeof *v, cap * sizeof *v);
        if (!v) return lex_fail(lx, "out of memory");
        lx->out->v = v;
        lx->out->cap = cap;
    }
    lx->out->v[lx->out->n++] = tok;
    return true;
}

static bool push_simple(lexer *lx, tmpl_tok_kind kind, int line)
{
    tmpl_token t = {0};
    t.kind = (uint8_t)kind;
    t.line = line;
    return push(lx, t);
}

/* Whether s[start..end) is whitespace only (and not empty): jinja's
 * whitespace_re.fullmatch. */
static bool all_ws(const lexer *lx, size_t start, size_t end)
{
    if (start >= end) return false;
    size_t i = start;
    while (i < end) {
        size_t k = ws_at(lx, i);
        if (!k) return false;
        i += k;
    }
    return true;
}

/* Emits the text s[start..end) before a tag whose whitespace-control sign
 * is `sign` ('-', '+' or 0); lstrip says whether lstrip_blocks applies to
 * this kind of tag. */
static bool emit_text(lexer *lx, size_t start, size_t end, char sign, bool lstrip, int line)
{
    if (sign == '-') {
        /* rstrip: drop trailing whitespace, Unicode included */
        size_t e = start, i = start;
        while (i < end) {
            size_t k = ws_at(lx, i);
            if (k) {
                i += k;
            } else {
                uint32_t cp;
                i += tmpl_utf8_decode((const unsigned char *)lx->s + i, end - i, &cp);
                e = i;
            }
        }
        end = e;
    } else if (sign != '+' && lstrip) {
        size_t lpos = start;
        for (size_t i = end; i > start; i--)
            if (lx->s[i - 1] == '\n') { lpos = i; break; }
        if ((lpos > start || lx->line_starting) && all_ws(lx, lpos, end)) end = lpos;
    }
    if (end > start) {
        tmpl_token t = {0};
        t.kind = TK_DATA;
        t.line = line;
        t.s = lx->s + start;
        t.n = end - start;
        return push(lx, t);
    }
    return true;
}

static bool starts(const lexer *lx, size_t i, const char *lit)
{
    size_t k = strlen(lit);
    return i + k <= lx->n && memcmp(lx->s + i, lit, k) == 0;
}

/* Matches `{%[-+]?\s*NAME\s*` at i; returns the position after it or 0. */
static size_t match_tag_word(const lexer *lx, size_t i, const char *word, char *sign)
{
    if (!starts(lx, i, "{%")) return 0;
    i += 2;
    *sign = 0;
    if (i < lx->n && (lx->s[i] == '-' || lx->s[i] == '+')) *sign = lx->s[i++];
    i = skip_ws(lx, i);
    if (!starts(lx, i, word)) return 0;
    i += strlen(word);
    return skip_ws(lx, i);
}

/* ---- literals --------------------------------------------------------- */

static int hexdig(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes a string literal body s[i..j) as Python's unicode-escape codec
 * does after jinja's backslashreplace (so non-ASCII text passes through). */
static bool decode_string(lexer *lx, size_t i, size_t j, tmpl_token *tok)
{
    char *d = arena_alloc(lx->a, (j - i) * 4 + 1);
    if (!d) return lex_fail(lx, "out of memory");
    size_t n = 0;
    const char *s = lx->s;
    while (i < j) {
        unsigned char c = (unsigned char)s[i];
        if (c != '\\') {
            d[n++] = (char)c;
            i++;
            continue;
        }
        i++;
        if (i >= j) { d[n++] = '\\'; break; }
        c = (unsigned char)s[i];
        uint32_t cp = 0;
        int want = 0;
        switch (c) {
        case '\n': i++; continue; /* line continuation */
        case '\\': d[n++] = '\\'; i++; continue;
        case '\'': d[n++] = '\''; i++; continue;
        case '"': d[n++] = '"'; i++; continue;
        case 'a': d[n++] = '\a'; i++; continue;
        case 'b': d[n++] = '\b'; i++; continue;
        case 'f': d[n++] = '\f'; i++; continue;
        case 'n': d[n++] = '\n'; i++; continue;
        case 'r': d[n++] = '\r'; i++; continue;
        case 't': d[n++] = '\t'; i++; continue;
        case 'v': d[n++] = '\v'; i++; continue;
        case 'x': want = 2; break;
        case 'u': want = 4; break;
        case 'U': want = 8; break;
        case 'N': return lex_fail(lx, "string escape \\N{...} is not supported");
        default:
            if (c >= '0' && c <= '7') {
                int k = 0;
                while (k < 3 && i < j && s[i] >= '0' && s[i] <= '7') cp = cp * 8 + (uint32_t)(s[i++] - '0'), k++;
                n += util_utf8_put(d + n, cp);
                continue;
            }
            if (c >= 0x80) {
                /* backslashreplace turned the character into \xNN / \uNNNN /
                 * \UNNNNNNNN and the backslash before it escapes that one */
                size_t k = tmpl_utf8_decode((const unsigned char *)s + i, j - i, &cp);
                i += k;
                if (cp < 0x100) n += (size_t)sprintf(d + n, "\\x%02x", cp);
                else if (cp < 0x10000) n += (size_t)sprintf(d + n, "\\u%04x", cp);
                else n += (size_t)sprintf(d + n, "\\U%08x", cp);
                continue;
            }
            /* an unknown escape keeps its backslash */
            d[n++] = '\\';
            continue;
        }
        i++;
        for (int k = 0; k < want; k++) {
            int h = i < j ? hexdig(s[i]) : -1;
            if (h < 0) return lex_fail(lx, "truncated \\%c escape in a string", c);
            cp = cp * 16 + (uint32_t)h;
            i++;
        }
        if (cp > 0x10FFFF) return lex_fail(lx, "illegal Unicode character in a string");
        if (cp >= 0xD800 && cp <= 0xDFFF) return lex_fail(lx, "surrogate escapes in strings are not supported");
        n += util_utf8_put(d + n, cp);
    }
    d[n] = '\0';
    tok->kind = TK_STRING;
    tok->s = d;
    tok->n = n;
    return true;
}

static bool isdig(char c) { return c >= '0' && c <= '9'; }

/* (\d+_)*\d+ at i: returns the end, or i when there is none */
static size_t scan_digits(const lexer *lx, size_t i)
{
    if (i >= lx->n || !isdig(lx->s[i])) return i;
    size_t e = i;
    while (e < lx->n && isdig(lx->s[e])) e++;
    while (e + 1 < lx->n && lx->s[e] == '_' && isdig(lx->s[e + 1])) {
        e++;
        while (e < lx->n && isdig(lx->s[e])) e++;
    }
    return e;
}

/* the text without underscores, NUL-terminated, in buf */
static bool copy_number(lexer *lx, size_t i, size_t e, char *buf, size_t bufsz)
{
    size_t k = 0;
    for (; i < e; i++) {
        if (lx->s[i] == '_') continue;
        if (k + 1 >= bufsz) return lex_fail(lx, "number literal too long");
        buf[k++] = lx->s[i];
    }
    buf[k] = '\0';
    return true;
}

static bool lex_number(lexer *lx, tmpl_token *tok, size_t *end)
{
    size_t i = lx->pos;
    char buf[128];
    /* float first, as jinja's rules are ordered; not right after a '.' */
    if (i == 0 || lx->s[i - 1] != '.') {
        size_t e = scan_digits(lx, i);
        size_t f = e;
        if (e < lx->n && lx->s[e] == '.') {
            size_t g = scan_digits(lx, e + 1);
            if (g > e + 1) f = g;
        }
        size_t x = f;
        if (x < lx->n && (lx->s[x] == 'e' || lx->s[x] == 'E')) {
            size_t y = x + 1;
            if (y < lx->n && (lx->s[y] == '+' || lx->s[y] == '-')) y++;
            size_t z = scan_digits(lx, y);
            if (z > y) x = z;
        }
        if (x > e) {
            if (!copy_number(lx, i, x, buf, sizeof buf)) return false;
            tok->kind = TK_FLOAT;
            tok->f = strtod(buf, NULL);
            *end = x;
            return true;
        }
    }
    int base = 10;
    size_t e;
    const char *s = lx->s;
    if (s[i] == '0' && i + 1 < lx->n && s[i + 1] != '\0' && strchr("bBoOxX", s[i + 1])) {
        char p = (char)(s[i + 1] | 0x20);
        base = p == 'b' ? 2 : p == 'o' ? 8 : 16;
        e = i + 2;
        size_t start = e;
        for (;;) {
            size_t k = e;
            if (k < lx->n && s[k] == '_') k++;
            if (k < lx->n && hexdig(s[k]) >= 0 && hexdig(s[k]) < base) e = k + 1;
            else break;
        }
        if (e == start) { /* "0x" alone: the integer 0 then a name */
            base = 10;
            e = i + 1;
        } else {
            i += 2;
        }
    } else if (s[i] == '0') {
        e = i + 1;
        for (;;) { /* 0(_?0)* */
            size_t k = e;
            if (k < lx->n && s[k] == '_') k++;
            if (k < lx->n && s[k] == '0') e = k + 1;
            else break;
        }
    } else {
        e = i + 1;
        for (;;) {
            size_t k = e;
            if (k < lx->n && s[k] == '_') k++;
            if (k < lx->n && isdig(s[k])) e = k + 1;
            else break;
        }
    }
    if (!copy_number(lx, i, e, buf, sizeof buf)) return false;
    errno = 0;
    char *endp;
    unsigned long long v = strtoull(buf, &endp, base);
    if (errno || v > (unsigned long long)INT64_MAX) return lex_fail(lx, "integer literal %s is too large", buf);
    tok->kind = TK_INT;
    tok->i = (int64_t)v;
    *end = e;
    return true;
}

static const struct {
    const char *s;
    uint8_t op;
} ops[] = {
    {"//", OP_FLOORDIV}, {"**", OP_POW}, {"==", OP_EQ}, {"!=", OP_NE}, {">=", OP_GE}, {"<=", OP_LE},
    {"+", OP_ADD}, {"-", OP_SUB}, {"/", OP_DIV}, {"*", OP_MUL}, {"%", OP_MOD}, {"~", OP_TILDE},
    {"[", OP_LBRACKET}, {"]", OP_RBRACKET}, {"(", OP_LPAREN}, {")", OP_RPAREN}, {"{", OP_LBRACE},
    {"}", OP_RBRACE}, {">", OP_GT}, {"<", OP_LT}, {"=", OP_ASSIGN}, {".", OP_DOT}, {":", OP_COLON},
    {"|", OP_PIPE}, {",", OP_COMMA}, {";", OP_SEMICOLON},
};

static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_name_char(char c) { return is_name_start(c) || isdig(c); }

/* ---- states ----------------------------------------------------------- */

/* Inside {{ ... }} or {% ... %} until its end. */
static bool lex_tag(lexer *lx, bool block)
{
    lx->nbalance = 0;
    for (;;) {
        size_t i = lx->pos;
        if (i >= lx->n) return lex_fail(lx, "unexpected end of template inside a tag (missing '%s')", block ? "%}" : "}}");
        const char *end = block ? "%}" : "}}";
        if (lx->nbalance == 0) {
            size_t stop = 0;
            bool trim_nl = false, ws_after = false;
            if (block && lx->s[i] == '+' && starts(lx, i + 1, end)) stop = i + 3;
            else if (lx->s[i] == '-' && starts(lx, i + 1, end)) stop = i + 3, ws_after = true;
            else if (starts(lx, i, end)) stop = i + 2, trim_nl = block;
            if (stop) {
                int line = lx->line;
                if (ws_after) stop = skip_ws(lx, stop);
                else if (trim_nl && stop < lx->n && lx->s[stop] == '\n') stop++;
                lx->line_starting = lx->s[stop - 1] == '\n';
                advance(lx, stop);
                return push_simple(lx, block ? TK_BLOCK_END : TK_VAR_END, line);
            }
        }
        size_t w = skip_ws(lx, i);
        if (w > i) {
            advance(lx, w);
            continue;
        }
        tmpl_token tok = {0};
        tok.line = lx->line;
        char c = lx->s[i];
        size_t e = i + 1;
        if (isdig(c)) {
            if (!lex_number(lx, &tok, &e)) return false;
        } else if (is_name_start(c)) {
            e = i + 1;
            while (e < lx->n && is_name_char(lx->s[e])) e++;
            tok.kind = TK_NAME;
            tok.s = lx->s + i;
            tok.n = e - i;
        } else if (c == '\'' || c == '"') {
            e = i + 1;
            while (e < lx->n && lx->s[e] != c) e += lx->s[e] == '\\' ? 2 : 1;
            if (e >= lx->n) return lex_fail(lx, "unexpected char '%c' (unterminated string)", c);
            if (!decode_string(lx, i + 1, e, &tok)) return false;
            e++;
        } else {
            size_t k;
            for (k = 0; k < sizeof ops / sizeof ops[0]; k++)
                if (starts(lx, i, ops[k].s)) break;
            if (k == sizeof ops / sizeof ops[0]) {
                if ((unsigned char)c >= 0x80) return lex_fail(lx, "unexpected character in a tag (only ASCII names are supported)");
                return lex_fail(lx, "unexpected char '%c'", c);
            }
            tok.kind = TK_OP;
            tok.op = ops[k].op;
            e = i + strlen(ops[k].s);
            char close = 0;
            if (tok.op == OP_LBRACE) close = '}';
            else if (tok.op == OP_LPAREN) close = ')';
            else if (tok.op == OP_LBRACKET) close = ']';
            if (close) {
                if (lx->nbalance >= TMPL_MAX_NESTING) return lex_fail(lx, "brackets nested too deeply");
                lx->balance[lx->nbalance++] = close;
            } else if (c == '}' || c == ')' || c == ']') {
                if (lx->nbalance == 0) return lex_fail(lx, "unexpected '%c'", c);
                char want = lx->balance[--lx->nbalance];
                if (want != c) return lex_fail(lx, "unexpected '%c', expected '%c'", c, want);
            }
        }
        if (!push(lx, tok)) return false;
        lx->line_starting = lx->s[e - 1] == '\n';
        advance(lx, e);
    }
}

/* After "{#" and its sign: skips to the end of the comment. */
static bool lex_comment(lexer *lx)
{
    for (size_t i = lx->pos; i < lx->n; i++) {
        size_t stop = 0;
        if (lx->s[i] == '+' && starts(lx, i + 1, "#}")) {
            stop = i + 3;
        } else if (lx->s[i] == '-' && starts(lx, i + 1, "#}")) {
            stop = skip_ws(lx, i + 3);
        } else if (starts(lx, i, "#}")) {
            stop = i + 2;
            if (stop < lx->n && lx->s[stop] == '\n') stop++;
        }
        if (stop) {
            lx->line_starting = lx->s[stop - 1] == '\n';
            advance(lx, stop);
            return true;
        }
    }
    return lex_fail(lx, "missing end of comment tag");
}

/* After {% raw %}: the text up to {% endraw %} is data. */
static bool lex_raw(lexer *lx)
{
    for (size_t i = lx->pos; i < lx->n; i++) {
        if (lx->s[i] != '{') continue;
        char sign;
        size_t j = match_tag_word(lx, i, "endraw", &sign);
        if (!j) continue;
        size_t stop = 0;
        if (lx->s[j] == '+' && starts(lx, j + 1, "%}")) stop = j + 3;
        else if (lx->s[j] == '-' && starts(lx, j + 1, "%}")) stop = skip_ws(lx, j + 3);
        else if (starts(lx, j, "%}")) {
            stop = j + 2;
            if (stop < lx->n && lx->s[stop] == '\n') stop++;
        }
        if (!stop) continue;
        if (!emit_text(lx, lx->pos, i, sign, true, lx->line)) return false;
        lx->line_starting = lx->s[stop - 1] == '\n';
        advance(lx, stop);
        return true;
    }
    return lex_fail(lx, "missing end of raw directive");
}

bool tmpl_lex(mem_arena *a, const char *src, size_t len, tmpl_tokens *out, char *err, size_t errsz)
{
    lexer lx = {.a = a, .s = src, .n = len, .line = 1, .line_starting = true, .out = out, .err = err, .errsz = errsz};
    while (lx.pos < lx.n) {
        /* the next tag opener */
        size_t p = lx.pos;
        const char *hit = NULL;
        for (; p + 1 < lx.n; p++) {
            if (lx.s[p] != '{') continue;
            char c = lx.s[p + 1];
            if (c == '%' || c == '{' || c == '#') {
                hit = lx.s + p;
                break;
            }
        }
        if (!hit) {
            if (!emit_text(&lx, lx.pos, lx.n, 0, false, lx.line)) return false;
            advance(&lx, lx.n);
            break;
        }
        char kind = lx.s[p + 1];
        char sign = 0;
        if (p + 2 < lx.n && (lx.s[p + 2] == '-' || lx.s[p + 2] == '+')) sign = lx.s[p + 2];
        size_t after = p + 2 + (sign ? 1 : 0);
        /* {% raw %}: its end may strip what follows but never trims a newline */
        size_t raw_end = 0;
        if (kind == '%') {
            char rs;
            size_t j = match_tag_word(&lx, p, "raw", &rs);
            if (j) {
                if (lx.s[j] == '-' && starts(&lx, j + 1, "%}")) raw_end = skip_ws(&lx, j + 3);
                else if (starts(&lx, j, "%}")) raw_end = j + 2;
            }
        }
        int line = lx.line;
        if (!emit_text(&lx, lx.pos, p, sign, kind != '{', line)) return false;
        if (raw_end) {
            lx.line_starting = lx.s[raw_end - 1] == '\n';
            advance(&lx, raw_end);
            if (!lex_raw(&lx)) return false;
            continue;
        }
        lx.line_starting = false;
        advance(&lx, after);
        if (kind == '#') {
            if (!lex_comment(&lx)) return false;
        } else {
            if (!push_simple(&lx, kind == '%' ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, lx.line)) return false;
            if (!lex_tag(&lx, kind == '%')) return false;
        }
    }
    return push_simple(&lx, TK_EOF, lx.line);
}
