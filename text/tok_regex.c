/*
 * tok_regex.c - tokenizer.json's regexes in PCRE2, with the semantics of
 * Oniguruma, the engine HF tokenizers compiles them with.
 *
 * The patterns are written for Oniguruma (Ruby syntax), where a few escapes
 * mean something else than in PCRE2, so each pattern is translated first:
 *   \s \S   Unicode White_Space (PCRE2's UCP \s also takes U+180E)
 *   \w \W   letters, marks, numbers, connector punctuation (PCRE2: L, N, _)
 *   \h \H   hexadecimal digits (PCRE2: horizontal space)
 *   \uHHHH  a code point (PCRE2 has no \u)
 *   (?m)    dot matches newline (PCRE2 spells it (?s))
 * A class holding a negated escape ([\S...]) is rewritten with look-aheads,
 * since a PCRE2 class cannot hold the complement of a set. ^ and $ match at
 * line ends, as in Ruby. Differences that remain: PCRE2 10.42 has Unicode
 * 14 tables where Oniguruma has 15.1 (characters assigned since then are
 * unassigned here), and case-insensitive matching folds one character to
 * one (Oniguruma also matches "ß" with "SS"). Nested classes and class
 * intersection ([a-z&&[^x]]) are refused as unsupported.
 *
 * Matching follows the onig crate's find_iter, which HF's splits use: an
 * empty match right where the previous match ended is not taken; the search
 * moves one character on instead.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

struct tok_regex {
    pcre2_code *code;
    char what[320]; /* the field it came from, for errors */
    char shown[64]; /* the pattern as written, cut short, for errors */
};

/* ---- work limit -------------------------------------------------------------
 *
 * A pattern that backtracks (`(a|aa)+$`) can take seconds a byte, so every
 * match call runs under PCRE2's match limit (its unit: one backtracking
 * step, JIT's or the interpreter's), and the calls of one context share a
 * budget: TOK_REGEX_WORK_BASE, plus TOK_REGEX_WORK_PER_BYTE for each byte of
 * each text a search starts on (a normalizer's output counts when it is
 * searched). The budget is linear in the text, so is the time.
 *
 * PCRE2 says only whether a call stayed within its limit, not how much it
 * used, so each call starts at TOK_REGEX_CALL_START and doubles on
 * PCRE2_ERROR_MATCHLIMIT, each try charged its whole limit: the charge is
 * at least the work done and at most four times it plus the start.
 * The interpreter's depth (its backtracking frames) is limited to the same
 * count, its heap to TOK_REGEX_HEAP_KIB; JIT's stack grows to 16 MiB. */
#define TOK_REGEX_WORK_BASE 1000000u
#define TOK_REGEX_WORK_PER_BYTE 1000u
#define TOK_REGEX_CALL_START 32u
#define TOK_REGEX_HEAP_KIB (64u * 1024)
/* Each pattern is run at load over runs of one character followed by
 * another (PROBE_RUN bytes each), under the budget of that text: one that
 * blows it is refused then, not on a client's text. */
#define PROBE_RUN 1024

struct tok_match_ctx {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *stack;
    uint64_t work_left; /* of the budget */
};

/* Oniguruma's \s and \w as PCRE2 class items. */
#define WS_ITEMS "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define WORD_ITEMS                                                                                               \
    "\\p{L}\\p{M}\\p{N}\\p{Pc}\\x{24B6}-\\x{24E9}\\x{1F130}-\\x{1F149}\\x{1F150}-\\x{1F169}\\x{1F170}-\\x{1F189}"
#define HEX_ITEMS "0-9a-fA-F"

/* ---- translation --------------------------------------------------------- */

typedef struct {
    const char *p;
    size_t n, i;
    strbuf *out;
    const char *what;
} xlat;

static bool is_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Copies the whole UTF-8 character at x->i. */
static void copy_char(xlat *x)
{
    size_t k = tok_utf8_len((unsigned char)x->p[x->i]);
    if (k > x->n - x->i) k = x->n - x->i;
    sb_append(x->out, x->p + x->i, k);
    x->i += k;
}

/* The items a class escape stands for: 's', 'w', 'h' (positive sets). */
static const char *escape_items(char e)
{
    switch (e) {
    case 's': case 'S': return WS_ITEMS;
    case 'w': case 'W': return WORD_ITEMS;
    case 'h': case 'H': return HEX_ITEMS;
    }
    return NULL;
}

/* An escape outside a class; x->i is at the backslash. */
static void xlat_escape(xlat *x)
{
    if (x->i + 1 >= x->n) { /* a trailing backslash: PCRE2 reports it */
        copy_char(x);
        return;
    }
    char e = x->p[x->i + 1];
    const char *items = escape_items(e);
    if (items) {
        bool neg = e == 'S' || e == 'W' || e == 'H';
        sb_printf(x->out, "[%s%s]", neg ? "^" : "", items);
        x->i += 2;
        return;
    }
    if (e == 'u' && x->i + 5 < x->n && is_hex(x->p[x->i + 2]) && is_hex(x->p[x->i + 3]) &&
        is_hex(x->p[x->i + 4]) && is_hex(x->p[x->i + 5])) {
        sb_printf(x->out, "\\x{%.4s}", x->p + x->i + 2);
        x->i += 6;
        return;
    }
    sb_putc(x->out, '\\');
    x->i++;
    copy_char(x);
}

/* A bracketed class at x->i ('['). Positive escapes become items; each
 * negated one (\S \W \H) is kept apart and the class is rebuilt:
 *   [I\S]   ->  (?:[I]|[^S])          one alternative per negated escape
 *   [^I\S]  ->  (?:(?![I])[S])        a character in none of them       */
static ferry_status xlat_class(xlat *x)
{
    size_t start = x->i;
    x->i++;
    bool negated = false;
    if (x->i < x->n && x->p[x->i] == '^') {
        negated = true;
        x->i++;
    }
    strbuf items;
    sb_init(&items);
    char neg_esc[8];
    int n_neg = 0;
    bool first = true;
    for (;;) {
        if (x->i >= x->n) {
            sb_free(&items);
            /* unterminated: let PCRE2 say so on the text as written */
            sb_append(x->out, x->p + start, x->n - start);
            x->i = x->n;
            return FERRY_OK;
        }
        char c = x->p[x->i];
        if (c == ']' && !first) {
            x->i++;
            break;
        }
        first = false;
        if (c == '\\' && x->i + 1 < x->n) {
            char e = x->p[x->i + 1];
            const char *set = escape_items(e);
            if (set && (e == 's' || e == 'w' || e == 'h')) {
                sb_puts(&items, set);
                x->i += 2;
            } else if (set) {
                if (n_neg == (int)sizeof neg_esc) {
                    sb_free(&items);
                    return ferry_fail(FERRY_ERR_UNSUPPORTED, "a class with more than %d negated escapes (\\S, \\W, "
                                      "...) is not supported", (int)sizeof neg_esc);
                }
                neg_esc[n_neg++] = e;
                x->i += 2;
            } else if (e == 'u' && x->i + 5 < x->n && is_hex(x->p[x->i + 2]) && is_hex(x->p[x->i + 3]) &&
                       is_hex(x->p[x->i + 4]) && is_hex(x->p[x->i + 5])) {
                sb_printf(&items, "\\x{%.4s}", x->p + x->i + 2);
                x->i += 6;
            } else {
                strbuf *keep = x->out;
                x->out = &items;
                sb_putc(&items, '\\');
                x->i++;
                copy_char(x);
                x->out = keep;
            }
            continue;
        }
        if (c == '[') {
            if (x->i + 1 < x->n && x->p[x->i + 1] == ':') { /* POSIX [:alpha:] */
                const char *end = memchr(x->p + x->i + 2, ']', x->n - x->i - 2);
                if (end && end[-1] == ':') {
                    sb_append(&items, x->p + x->i, (size_t)(end - (x->p + x->i)) + 1);
                    x->i = (size_t)(end - x->p) + 1;
                    continue;
                }
            }
            sb_free(&items);
            return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: nested character classes are not supported", x->what);
        }
        if (c == '&' && x->i + 1 < x->n && x->p[x->i + 1] == '&') {
            sb_free(&items);
            return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: class intersection (&&) is not supported", x->what);
        }
        strbuf *keep = x->out;
        x->out = &items;
        copy_char(x);
        x->out = keep;
    }
    if (items.oom) {
        sb_free(&items);
        return ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", x->what);
    }
    const char *it = items.data ? items.data : "";
    if (n_neg == 0) {
        sb_printf(x->out, "[%s%s]", negated ? "^" : "", it);
    } else if (!negated) {
        sb_puts(x->out, "(?:");
        bool any = false;
        if (items.len) {
            sb_printf(x->out, "[%s]", it);
            any = true;
        }
        for (int k = 0; k < n_neg; k++) {
            sb_printf(x->out, "%s[^%s]", any ? "|" : "", escape_items(neg_esc[k]));
            any = true;
        }
        sb_putc(x->out, ')');
    } else {
        sb_puts(x->out, "(?:");
        if (items.len) sb_printf(x->out, "(?![%s])", it);
        for (int k = 0; k + 1 < n_neg; k++) sb_printf(x->out, "(?=[%s])", escape_items(neg_esc[k]));
        sb_printf(x->out, "[%s])", escape_items(neg_esc[n_neg - 1]));
    }
    sb_free(&items);
    return FERRY_OK;
}

/* "(?" followed by option letters: Ruby's m (dot matches newline) is
 * PCRE2's s. x->i is at '('. Returns false when this is another group. */
static bool xlat_options(xlat *x)
{
    size_t j = x->i + 2;
    while (j < x->n && (x->p[j] == 'i' || x->p[j] == 'm' || x->p[j] == 'x' || x->p[j] == '-')) j++;
    if (j == x->i + 2 || j >= x->n || (x->p[j] != ')' && x->p[j] != ':')) return false;
    sb_puts(x->out, "(?");
    for (size_t k = x->i + 2; k < j; k++) sb_putc(x->out, x->p[k] == 'm' ? 's' : x->p[k]);
    x->i = j;
    return true;
}

static ferry_status translate(const char *pat, size_t len, const char *what, strbuf *out)
{
    xlat x = {pat, len, 0, out, what};
    while (x.i < x.n) {
        char c = x.p[x.i];
        if (c == '\\') {
            xlat_escape(&x);
        } else if (c == '[') {
            FERRY_TRY(xlat_class(&x));
        } else if (c == '(' && x.i + 1 < x.n && x.p[x.i + 1] == '?' && xlat_options(&x)) {
            /* copied */
        } else {
            copy_char(&x);
        }
    }
    return FERRY_OK;
}

/* A String pattern: every ASCII punctuation character escaped, which PCRE2
 * reads as itself (HF escapes it with regex::escape for the same reason). */
static void escape_literal(const char *s, size_t n, strbuf *out)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80 && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) && c > ' ')
            sb_putc(out, '\\');
        sb_putc(out, (char)c);
    }
}

/* ---- compile ------------------------------------------------------------- */

static ferry_status probe(const tok_regex *re);

ferry_status tok_regex_compile(const char *pat, size_t len, bool literal, const char *what, tok_regex **out)
{
    *out = NULL;
    strbuf src;
    sb_init(&src);
    ferry_status st = FERRY_OK;
    pcre2_compile_context *cc = NULL;
    tok_regex *re = NULL;
    if (literal) escape_literal(pat, len, &src);
    else st = translate(pat, len, what, &src);
    if (st != FERRY_OK) goto fail;
    if (src.oom) {
        st = ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", what);
        goto fail;
    }
    cc = pcre2_compile_context_create(NULL);
    re = calloc(1, sizeof *re);
    if (!cc || !re) {
        st = ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", what);
        goto fail;
    }
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
    pcre2_set_bsr(cc, PCRE2_BSR_UNICODE);
    int err;
    PCRE2_SIZE at;
    snprintf(re->what, sizeof re->what, "%s", what);
    snprintf(re->shown, sizeof re->shown, "%.*s%s", len > 48 ? 48 : (int)len, pat, len > 48 ? "..." : "");
    re->code = pcre2_compile((PCRE2_SPTR)(src.data ? src.data : ""), src.len,
                             PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE | PCRE2_NO_UTF_CHECK, &err, &at, cc);
    if (!re->code) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        st = ferry_fail(FERRY_ERR_INVALID, "%s: the regex does not compile: %s", what, (const char *)msg);
        goto fail;
    }
    /* without JIT the interpreter runs the same pattern, only slower */
    (void)pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE);
    if ((st = probe(re)) != FERRY_OK) goto fail;
    pcre2_compile_context_free(cc);
    sb_free(&src);
    *out = re;
    return FERRY_OK;
fail:
    pcre2_compile_context_free(cc);
    tok_regex_free(re);
    sb_free(&src);
    return st;
}

bool tok_regex_may_match_empty(const tok_regex *re)
{
    uint32_t min = 0;
    return pcre2_pattern_info(re->code, PCRE2_INFO_MINLENGTH, &min) != 0 || min == 0;
}

void tok_regex_free(tok_regex *re)
{
    if (!re) return;
    pcre2_code_free(re->code);
    free(re);
}

tok_match_ctx *tok_match_ctx_new(void)
{
    tok_match_ctx *mc = calloc(1, sizeof *mc);
    if (!mc) return NULL;
    mc->md = pcre2_match_data_create(1, NULL);
    mc->mctx = pcre2_match_context_create(NULL);
    if (!mc->md || !mc->mctx) {
        tok_match_ctx_free(mc);
        return NULL;
    }
    /* the interpreter's backtracking frames: bounded, so that an odd pattern
     * over a long text fails with an error instead of taking gigabytes */
    pcre2_set_heap_limit(mc->mctx, TOK_REGEX_HEAP_KIB);
    mc->work_left = TOK_REGEX_WORK_BASE;
    return mc;
}

void tok_match_ctx_free(tok_match_ctx *mc)
{
    if (!mc) return;
    pcre2_match_data_free(mc->md);
    pcre2_match_context_free(mc->mctx);
    pcre2_jit_stack_free(mc->stack);
    free(mc);
}

bool tok_spans_push(tok_spans *sp, size_t start, size_t end)
{
    if (sp->n == sp->cap) {
        size_t cap = sp->cap ? sp->cap * 2 : 16;
        tok_span *v = realloc(sp->v, cap * sizeof *v);
        if (!v) return false;
        sp->v = v;
        sp->cap = cap;
    }
    sp->v[sp->n].start = start;
    sp->v[sp->n].end = end;
    sp->n++;
    return true;
}

/* One pcre2_match at it->pos under the context's budget (see "work limit"):
 * its result code, or a failure naming the pattern once the budget is spent. */
static ferry_status match_within(const tok_regex *re, tok_match_ctx *mc, const char *s, size_t n, size_t pos,
                                 int *rc)
{
    uint64_t limit = TOK_REGEX_CALL_START;
    for (;;) {
        if (limit > mc->work_left) limit = mc->work_left;
        if (limit == 0) break;
        pcre2_set_match_limit(mc->mctx, (uint32_t)limit);
        pcre2_set_depth_limit(mc->mctx, (uint32_t)limit);
        mc->work_left -= limit;
        *rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, mc->md, mc->mctx);
        if (*rc == PCRE2_ERROR_JIT_STACKLIMIT && !mc->stack) {
            /* deep backtracking over a long input: JIT's default 32 KiB
             * stack is too small, so give it one that grows to 16 MiB */
            mc->stack = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, NULL);
            if (mc->stack) {
                pcre2_jit_stack_assign(mc->mctx, NULL, mc->stack);
                continue;
            }
        }
        if (*rc == PCRE2_ERROR_JIT_STACKLIMIT)
            /* still too deep: the interpreter keeps its backtracking on the heap */
            *rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, mc->md, mc->mctx);
        if (*rc != PCRE2_ERROR_MATCHLIMIT && *rc != PCRE2_ERROR_DEPTHLIMIT) return FERRY_OK;
        limit = limit > UINT32_MAX / 2 ? UINT32_MAX : limit * 2;
    }
    return ferry_fail(FERRY_ERR_TOO_LARGE,
                      "tokenizer: the regex work limit was reached matching %s (`%s`) on this %zu-byte text: the "
                      "pattern backtracks too much (limit %u steps + %u a byte)",
                      re->what, re->shown, n, TOK_REGEX_WORK_BASE, TOK_REGEX_WORK_PER_BYTE);
}

ferry_status tok_regex_next(const tok_regex *re, tok_match_ctx *mc, const char *s, size_t n, tok_regex_iter *it,
                           tok_span *m, bool *found)
{
    *found = false;
    if (it->pos == 0 && !it->have_last) /* a search starts: its text's share of the budget */
        mc->work_left += (uint64_t)TOK_REGEX_WORK_PER_BYTE * n;
    while (it->pos <= n) {
        int rc = PCRE2_ERROR_NOMATCH;
        FERRY_TRY(match_within(re, mc, s, n, it->pos, &rc));
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return ferry_fail(rc == PCRE2_ERROR_NOMEMORY ? FERRY_ERR_NOMEM : FERRY_ERR_TOO_LARGE,
                              "tokenizer: matching %s failed on this text: %s", re->what, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(mc->md);
        size_t ms = ov[0], me = ov[1];
        if (me < ms) me = ms; /* \K past the end: treat as empty */
        if (ms == me && it->have_last && it->last_end == me) {
            /* onig: an empty match right after the last one moves on a character */
            it->pos += it->pos < n ? tok_utf8_len((unsigned char)s[it->pos]) : 1;
            continue;
        }
        it->pos = it->last_end = me;
        it->have_last = true;
        *m = (tok_span){ms, me};
        *found = true;
        return FERRY_OK;
    }
    it->pos = n + 1; /* ended: later calls find nothing */
    return FERRY_OK;
}

ferry_status tok_regex_find_all(const tok_regex *re, tok_match_ctx *mc, const char *s, size_t n, tok_spans *out)
{
    out->n = 0;
    tok_regex_iter it = {0};
    for (;;) {
        tok_span m;
        bool found;
        FERRY_TRY(tok_regex_next(re, mc, s, n, &it, &m, &found));
        if (!found) return FERRY_OK;
        if (!tok_spans_push(out, m.start, m.end)) return ferry_fail(FERRY_ERR_NOMEM, "tokenizer: out of memory");
    }
}

/* The load-time probe (PROBE_RUN above): each run under a fresh context,
 * whose budget is what an encode of that text would have. */
static ferry_status probe(const tok_regex *re)
{
    static const char *const k_chars[] = {"a", " ", "0", "!", "'", "\n", "\xc3\xa9", "\xe4\xb8\xad"};
    char text[PROBE_RUN + 8];
    tok_spans sp = {0};
    ferry_status st = FERRY_OK;
    for (size_t c = 0; c < sizeof k_chars / sizeof k_chars[0] && st == FERRY_OK; c++) {
        size_t k = strlen(k_chars[c]), n = 0;
        while (n + k <= PROBE_RUN) memcpy(text + n, k_chars[c], k), n += k;
        text[n++] = c == 0 ? '!' : 'a'; /* a character the run is not made of */
        tok_match_ctx *mc = tok_match_ctx_new();
        if (!mc) {
            st = ferry_fail(FERRY_ERR_NOMEM, "%s: out of memory", re->what);
            break;
        }
        st = tok_regex_find_all(re, mc, text, n, &sp);
        tok_match_ctx_free(mc);
        if (st == FERRY_ERR_TOO_LARGE)
            st = ferry_fail(FERRY_ERR_INVALID, "%s: the regex `%s` reaches the tokenizer's regex work limit on a "
                            "probe text (%zu bytes of '%s' and one other character): it backtracks too much to "
                            "run on clients' text, so this tokenizer is refused", re->what, re->shown, n - 1,
                            c == 5 ? "\\n" : k_chars[c]);
    }
    free(sp.v);
    return st;
}
