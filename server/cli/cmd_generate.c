/*
 * cmd_generate.c - `ferry generate`: prompts in, generated ids out (text or
 * --json), optionally the last prompt position's logits to a file. Several
 * prompts separated by ';' run as one batch.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/engine.h"
#include "../../engine/base/json.h"
#include "../../engine/base/util.h"
#include "cli.h"

typedef struct {
    int n;
    int32_t **ids;
    int *lens;
} prompt_set;

static void prompts_free(prompt_set *p)
{
    for (int i = 0; i < p->n; i++) free(p->ids[i]);
    free(p->ids);
    free(p->lens);
}

/* "1,2,3;4,5" -> two prompts. Ids must be integers in [0, 2^31); the
 * vocabulary bound is checked once the model is known. */
static ferry_status prompts_parse(const char *text, prompt_set *p)
{
    memset(p, 0, sizeof *p);
    int n = 1;
    for (const char *s = text; *s; s++) n += *s == ';';
    p->ids = calloc((size_t)n, sizeof *p->ids);
    p->lens = calloc((size_t)n, sizeof *p->lens);
    if (!p->ids || !p->lens) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    const char *s = text;
    for (int i = 0; i < n; i++) {
        int cap = 1;
        for (const char *q = s; *q && *q != ';'; q++) cap += *q == ',';
        p->ids[i] = malloc((size_t)cap * sizeof **p->ids);
        p->n = i + 1;
        if (!p->ids[i]) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        for (;;) {
            while (*s == ' ') s++;
            if (*s == ';' || *s == '\0') break;
            char *end;
            errno = 0;
            long long v = strtoll(s, &end, 10);
            if (end == s || errno)
                return ferry_fail(FERRY_ERR_INVALID, "--prompt-ids: prompt %d: '%.20s' is not a token id", i, s);
            if (v < 0 || v > 2147483647LL)
                return ferry_fail(FERRY_ERR_INVALID, "--prompt-ids: prompt %d: token id %lld is out of range", i, v);
            p->ids[i][p->lens[i]++] = (int32_t)v;
            s = end;
            while (*s == ' ') s++;
            if (*s == ',') {
                s++;
                while (*s == ' ') s++;
                if (*s == ';' || *s == '\0')
                    return ferry_fail(FERRY_ERR_INVALID, "--prompt-ids: prompt %d: a ',' without an id after it", i);
            } else if (*s != ';' && *s != '\0')
                return ferry_fail(FERRY_ERR_INVALID, "--prompt-ids: prompt %d: unexpected '%c'", i, *s);
        }
        if (p->lens[i] == 0) return ferry_fail(FERRY_ERR_INVALID, "--prompt-ids: prompt %d is empty", i);
        if (*s == ';') s++;
    }
    return FERRY_OK;
}

static void print_ids(strbuf *sb, const int32_t *ids, int n)
{
    sb_putc(sb, '[');
    for (int k = 0; k < n; k++) sb_printf(sb, "%s%d", k ? ", " : "", ids[k]);
    sb_putc(sb, ']');
}

int cmd_generate(const ferry_config *cfg)
{
    if (cfg->max_new_tokens < 1 || cfg->max_new_tokens > (1 << 24))
        return cli_error(EXIT_USAGE, "--max-new-tokens must be in 1..16777216 (got %lld)",
                         (long long)cfg->max_new_tokens);
    sampling_params sp = {(float)cfg->temperature, (int)cfg->top_k, (float)cfg->top_p, cfg->seed};
    if (sampling_params_check(&sp) != FERRY_OK) return cli_error(EXIT_USAGE, "%s", ferry_errmsg());
    prompt_set ps;
    if (prompts_parse(cfg->prompt_ids, &ps) != FERRY_OK) {
        prompts_free(&ps);
        return cli_error(EXIT_USAGE, "%s", ferry_errmsg());
    }
    int max_new = (int)cfg->max_new_tokens, longest = 0;
    for (int i = 0; i < ps.n; i++) longest = ps.lens[i] > longest ? ps.lens[i] : longest;

    /* what the config alone can refute, before any weight is loaded */
    model_config mc;
    if (model_config_load(cfg->model, &mc) != FERRY_OK) {
        prompts_free(&ps);
        return cli_fail(FERRY_ERR_INVALID);
    }
    for (int i = 0; i < ps.n; i++) {
        for (int k = 0; k < ps.lens[i]; k++)
            if (ps.ids[i][k] >= mc.vocab) {
                int rc = cli_error(EXIT_RUNTIME,
                                   "--prompt-ids: prompt %d: token id %d at position %d is outside the vocabulary "
                                   "(size %d)",
                                   i, ps.ids[i][k], k, mc.vocab);
                prompts_free(&ps);
                return rc;
            }
        if (max_new > mc.max_pos - ps.lens[i]) {
            int rc = cli_error(EXIT_RUNTIME,
                               "prompt %d: %d prompt + %d new tokens exceed max_position_embeddings %d", i,
                               ps.lens[i], max_new, mc.max_pos);
            prompts_free(&ps);
            return rc;
        }
    }

    int rc = 0;
    engine *e = NULL;
    int32_t **out = calloc((size_t)ps.n, sizeof *out);
    float *logits = NULL;
    engine_opts eo;
    if ((rc = cli_engine_opts(cfg, &eo)) != 0) goto done;
    eo.n_slots = ps.n;
    eo.max_ctx = longest + max_new;
    ferry_status st = out ? engine_open(&eo, &e) : ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    if (st != FERRY_OK) {
        rc = cli_fail(st);
        goto done;
    }
    logits = malloc((size_t)ps.n * (size_t)e->cfg.vocab * sizeof *logits);
    for (int i = 0; i < ps.n && logits; i++)
        if (!(out[i] = malloc((size_t)max_new * sizeof **out))) break;
    if (!logits || !out[ps.n - 1]) {
        rc = cli_error(EXIT_RUNTIME, "out of memory");
        goto done;
    }
    st = engine_generate(e, ps.n, (const int32_t *const *)ps.ids, ps.lens, max_new, &sp, out, logits);
    if (st != FERRY_OK) {
        rc = cli_fail(st);
        goto done;
    }
    if (cfg->dump_logits) {
        st = util_write_file_atomic(cfg->dump_logits, logits, (size_t)ps.n * (size_t)e->cfg.vocab * sizeof *logits);
        if (st != FERRY_OK) {
            rc = cli_fail(st);
            goto done;
        }
    }
    strbuf sb;
    sb_init(&sb);
    if (cfg->json) {
        sb_puts(&sb, "{\"output_ids\": ");
        if (ps.n == 1) {
            print_ids(&sb, out[0], max_new);
        } else {
            sb_putc(&sb, '[');
            for (int i = 0; i < ps.n; i++) {
                if (i) sb_puts(&sb, ", ");
                print_ids(&sb, out[i], max_new);
            }
            sb_putc(&sb, ']');
        }
        sb_puts(&sb, "}\n");
    } else {
        for (int i = 0; i < ps.n; i++) {
            for (int k = 0; k < max_new; k++) sb_printf(&sb, "%s%d", k ? " " : "", out[i][k]);
            sb_putc(&sb, '\n');
        }
    }
    if (sb.oom) rc = cli_error(EXIT_RUNTIME, "out of memory");
    else fwrite(sb.data, 1, sb.len, stdout);
    sb_free(&sb);
done:
    if (out)
        for (int i = 0; i < ps.n; i++) free(out[i]);
    free(out);
    free(logits);
    engine_close(e);
    prompts_free(&ps);
    return rc;
}
