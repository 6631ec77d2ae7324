/*
 * chat_template.c - the chat-template API (chat_template.h): checks the
 * source, runs the lexer and the parser into one arena owned by the
 * template, and hands renders to the evaluator.
 *
 * The pieces are described in tmpl_internal.h. A parsed template is never
 * written again, so any number of threads may render it at once; each
 * render keeps all of its state in its own arena.
 */
#include "chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tmpl_internal.h"

/* the byte offset of the first invalid UTF-8 sequence, or len */
static size_t utf8_invalid_at(const unsigned char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        unsigned char c = s[i];
        size_t k;
        if (c < 0x80) k = 1;
        else if (c >= 0xC2 && c <= 0xDF) k = 2;
        else if (c >= 0xE0 && c <= 0xEF) k = 3;
        else if (c >= 0xF0 && c <= 0xF4) k = 4;
        else return i;
        if (len - i < k) return i;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return i;
        if (k == 3 && ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] > 0x9F))) return i;
        if (k == 4 && ((c == 0xF0 && s[i + 1] < 0x90) || (c == 0xF4 && s[i + 1] > 0x8F))) return i;
        i += k;
    }
    return len;
}

ferry_status tmpl_parse(const char *src, size_t len, const char *label, chat_template **out)
{
    *out = NULL;
    if (!label) label = "chat template";
    if (!src && len) return ferry_fail(FERRY_ERR_INVALID, "%s: no source", label);
    if (len > TMPL_MAX_SOURCE)
        return ferry_fail(FERRY_ERR_TOO_LARGE, "%s is %zu bytes (limit %u)", label, len, TMPL_MAX_SOURCE);
    size_t bad = utf8_invalid_at((const unsigned char *)src, len);
    if (bad < len) return ferry_fail(FERRY_ERR_INVALID, "%s is not valid UTF-8 (byte %zu)", label, bad);

    chat_template *t = calloc(1, sizeof *t);
    if (!t) return ferry_fail(FERRY_ERR_NOMEM, "out of memory parsing %s", label);
    t->arena.limit = SIZE_MAX;
    size_t ln = strlen(label);
    t->label = arena_alloc(&t->arena, ln + 1);
    char err[512] = "";
    tmpl_tokens toks = {0};
    ferry_status st = FERRY_OK;
    if (!t->label) {
        st = ferry_fail(FERRY_ERR_NOMEM, "out of memory parsing %s", label);
        goto fail;
    }
    memcpy(t->label, label, ln + 1);
    t->src = tmpl_lex_prepare(&t->arena, src ? src : "", len, &t->src_len);
    if (!t->src) {
        st = ferry_fail(FERRY_ERR_NOMEM, "out of memory parsing %s", label);
        goto fail;
    }
    if (!tmpl_lex(&t->arena, t->src, t->src_len, &toks, err, sizeof err) ||
        !tmpl_parse_tokens(t, &toks, err, sizeof err)) {
        /* "chat template line 12: filter 'wordwrap' is not supported" */
        st = ferry_fail(strstr(err, "out of memory") ? FERRY_ERR_NOMEM : FERRY_ERR_INVALID, "%s %s", label, err);
        goto fail;
    }
    *out = t;
    return FERRY_OK;
fail:
    tmpl_free(t);
    return st;
}

void tmpl_free(chat_template *t)
{
    if (!t) return;
    arena_free(&t->arena);
    free(t);
}

ferry_status tmpl_render(const chat_template *t, const json_value *vars, size_t max_out, strbuf *out)
{
    if (!t) return ferry_fail(FERRY_ERR_INVALID, "no chat template");
    return tmpl_render_body(t, vars, max_out, out);
}
