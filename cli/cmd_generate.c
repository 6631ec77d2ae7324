/*
 * cmd_generate.c - `ferry generate`: prompts in, generated ids out (text or
 * --json), optionally the last prompt position's logits to a file. Several
 * prompts separated by ';' run as one batch.
 *
 * --prompt TEXT takes the prompt as text instead (text/text.h: encoded
 * with the tokenizer's special tokens, as a completion prompt; the model's
 * generation_config.json gives the sampling defaults the flags leave unset
 * and the end-of-sequence ids that stop it) and prints the answer as text.
 * --json adds "text" (the generated ids decoded, special tokens skipped)
 * whenever the model has a tokenizer.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/engine.h"
#include "../engine/scheduler.h"
#include "../engine/weights/model.h"
#include "../engine/base/json.h"
#include "../engine/base/util.h"
#include "../text/text.h"
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

/* --prompt: the text encoded as one prompt; the model's generation
 * defaults where the flags left them, and its end-of-sequence ids. */
static ferry_status text_prompt(const ferry_config *cfg, const text_model *tm, prompt_set *ps, gen_request *proto)
{
    memset(ps, 0, sizeof *ps);
    ps->ids = calloc(1, sizeof *ps->ids);
    ps->lens = calloc(1, sizeof *ps->lens);
    if (!ps->ids || !ps->lens) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    ps->n = 1;
    FERRY_TRY(text_encode(tm, cfg->prompt, strlen(cfg->prompt), true, &ps->ids[0], &ps->lens[0]));
    if (ps->lens[0] == 0) return ferry_fail(FERRY_ERR_INVALID, "--prompt encodes to no tokens");
    gen_params gp;
    config_gen_params(cfg, &gp);
    FERRY_TRY(text_request_defaults(tm, &gp, false));
    request_set_params(proto, &gp);
    return FERRY_OK;
}

/* Every prompt against the model's config with request_check, before any
 * weight is loaded: a bad id or a prompt past max_position_embeddings costs
 * no load. */
static ferry_status engine_check_requests(const engine_opts *eo, const prompt_set *ps, const gen_request *proto, bool text)
{
    model_config mc;
    FERRY_TRY(model_config_load(eo->model_dir, &mc));
    engine_limits lim = {.vocab = mc.vocab, .max_ctx = mc.max_pos, .max_seqs = ps->n, .max_step_tokens = eo->max_step_tokens};
    /* kv_positions 0: the pool is checked once the engine is open; no server caps */
    char what[48];
    for (int i = 0; i < ps->n; i++) {
        gen_request r = *proto;
        r.prompt = ps->ids[i];
        r.prompt_len = ps->lens[i];
        if (text) snprintf(what, sizeof what, "--prompt");
        else snprintf(what, sizeof what, "--prompt-ids: prompt %d", i);
        FERRY_TRY(request_check(&r, &lim, what, NULL));
    }
    return FERRY_OK;
}

static void print_ids(strbuf *sb, const int32_t *ids, int n)
{
    sb_putc(sb, '[');
    for (int k = 0; k < n; k++) sb_printf(sb, "%s%d", k ? ", " : "", ids[k]);
    sb_putc(sb, ']');
}

/* The outcome of each prompt, collected from the scheduler's callbacks
 * (engine thread) for the main thread. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending;             /* prompts not yet done */
    ferry_status st;         /* the first failure */
    char *msg;               /* its message, whole */
} gen_wait;

typedef struct {
    gen_wait *w;
    int32_t *ids;            /* [max_new] */
    int n_ids;
    float *logits;           /* [vocab]: the last prompt position's */
} gen_out;

static void on_done(void *user, ferry_status st, const char *msg, const gen_result *res)
{
    gen_out *o = user;
    if (st == FERRY_OK) {
        memcpy(o->ids, res->tokens, (size_t)res->n_tokens * sizeof *o->ids);
        o->n_ids = res->n_tokens;
        if (res->logits) memcpy(o->logits, res->logits, (size_t)res->vocab * sizeof *o->logits);
    }
    pthread_mutex_lock(&o->w->mu);
    if (st != FERRY_OK && o->w->st == FERRY_OK) {
        o->w->st = st;
        o->w->msg = strdup(msg ? msg : "generation failed");
    }
    if (--o->w->pending == 0) pthread_cond_signal(&o->w->cv);
    pthread_mutex_unlock(&o->w->mu);
}

/* Every prompt through the scheduler (the one generation path): prompt i
 * samples from stream i of the seed, all run in one batch. */
static ferry_status generate_all(engine *e, const prompt_set *ps, const gen_request *proto, gen_out *outs)
{
    sched *s;
    FERRY_TRY(sched_create(e, NULL, &s));
    gen_wait w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, ps->n, FERRY_OK, NULL};
    sched_callbacks cb = {NULL, on_done};
    ferry_status st = FERRY_OK;
    for (int i = 0; i < ps->n; i++) {
        gen_request r = *proto;
        r.prompt = ps->ids[i];
        r.prompt_len = ps->lens[i];
        r.stream = (uint64_t)i;
        outs[i].w = &w;
        if ((st = sched_submit(s, &r, &cb, &outs[i], NULL)) != FERRY_OK) {
            pthread_mutex_lock(&w.mu);
            w.pending -= ps->n - i; /* never submitted: no callback will come */
            pthread_mutex_unlock(&w.mu);
            break;
        }
    }
    pthread_mutex_lock(&w.mu);
    while (w.pending > 0) pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    sched_free(s);
    if (st == FERRY_OK && w.st != FERRY_OK) st = ferry_fail(w.st, "%s", w.msg ? w.msg : "out of memory");
    free(w.msg);
    return st;
}

/* The logits of each prompt's last position, prompt after prompt. */
static ferry_status dump_logits(const char *path, const gen_out *outs, int n, int vocab)
{
    size_t row = (size_t)vocab * sizeof(float);
    char *all = malloc((size_t)n * row);
    if (!all) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) memcpy(all + (size_t)i * row, outs[i].logits, row);
    ferry_status st = util_write_output(path, all, (size_t)n * row);
    free(all);
    return st;
}

/* Each prompt's text through a text_stream, as the server decodes it. */
static ferry_status decode_outputs(const text_model *tm, const gen_request *proto, gen_out *outs, int n, strbuf *texts,
                                   text_finish *finish)
{
    for (int i = 0; i < n; i++) {
        text_stream *ts;
        FERRY_TRY(text_stream_new(tm, proto, NULL, &ts));
        for (int k = 0; k < outs[i].n_ids; k++) text_stream_push(ts, outs[i].ids[k], &texts[i]);
        finish[i] = text_stream_end(ts, &texts[i]);
        text_stream_free(ts);
        if (texts[i].oom) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    return FERRY_OK;
}

static void print_outputs(strbuf *sb, const ferry_config *cfg, const gen_out *outs, int n, const strbuf *texts,
                          const text_finish *finish)
{
    if (cfg->json) {
        sb_puts(sb, "{\"output_ids\": ");
        if (n > 1) sb_putc(sb, '[');
        for (int i = 0; i < n; i++) {
            if (i) sb_puts(sb, ", ");
            print_ids(sb, outs[i].ids, outs[i].n_ids);
        }
        if (n > 1) sb_putc(sb, ']');
        if (texts) {
            sb_puts(sb, n > 1 ? ", \"text\": [" : ", \"text\": ");
            for (int i = 0; i < n; i++) {
                if (i) sb_puts(sb, ", ");
                sb_json_strn(sb, texts[i].data ? texts[i].data : "", texts[i].len);
            }
            if (n > 1) sb_putc(sb, ']');
        }
        if (texts && cfg->prompt) sb_printf(sb, ", \"finish_reason\": \"%s\"", text_finish_name(finish[0]) ? text_finish_name(finish[0]) : "none");
        sb_puts(sb, "}\n");
        return;
    }
    if (cfg->prompt) {
        sb_append(sb, texts[0].data, texts[0].len);
        sb_putc(sb, '\n');
        return;
    }
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < outs[i].n_ids; k++) sb_printf(sb, "%s%d", k ? " " : "", outs[i].ids[k]);
        sb_putc(sb, '\n');
    }
}

int cmd_generate(const ferry_config *cfg)
{
    if (!cfg->prompt_ids == !cfg->prompt) return cli_error(EXIT_USAGE, "give the prompt as --prompt-ids or as --prompt (one of them)");
    gen_request proto = {.want_logits = cfg->dump_logits != NULL};
    gen_params gp;
    config_gen_params(cfg, &gp);
    request_set_params(&proto, &gp);
    if (sampling_params_check(&proto.sampling) != FERRY_OK) return cli_error(EXIT_USAGE, "%s", ferry_errmsg());
    /* the text files: needed for --prompt, and for --json's "text" when there */
    text_model *tm = NULL;
    if ((cfg->prompt || cfg->json) && text_model_load(cfg->model, 0, &tm) != FERRY_OK) return cli_fail(FERRY_ERR_NOMEM);
    if (cfg->prompt && text_error(tm)) {
        int rc = cli_error(EXIT_RUNTIME, "--prompt: %s", text_error(tm));
        text_model_free(tm);
        return rc;
    }
    prompt_set ps;
    ferry_status pst = cfg->prompt ? text_prompt(cfg, tm, &ps, &proto) : prompts_parse(cfg->prompt_ids, &ps);
    if (pst != FERRY_OK) {
        prompts_free(&ps);
        text_model_free(tm);
        return cli_error(EXIT_USAGE, "%s", ferry_errmsg());
    }
    int longest = 0;
    for (int i = 0; i < ps.n; i++) longest = ps.lens[i] > longest ? ps.lens[i] : longest;

    int rc = 0;
    engine *e = NULL;
    gen_out *outs = calloc((size_t)ps.n, sizeof *outs);
    engine_opts eo;
    if ((rc = cli_engine_opts(cfg, &eo)) != 0) goto done;
    /* the KV cache holds exactly this batch: every prompt at once, each
     * sequence as long as the longest needs */
    eo.max_seqs = ps.n;
    eo.max_ctx = longest + proto.max_new_tokens;
    if (eo.max_step_tokens < ps.n) eo.max_step_tokens = ps.n;
    /* what the config alone can refute, before any weight is loaded */
    ferry_status st = outs ? engine_check_requests(&eo, &ps, &proto, cfg->prompt != NULL) : ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    if (st == FERRY_OK) st = engine_open(&eo, &e);
    engine_limits lim = e ? engine_get_limits(e) : (engine_limits){0};
    for (int i = 0; st == FERRY_OK && i < ps.n; i++) {
        outs[i].ids = malloc((size_t)proto.max_new_tokens * sizeof *outs[i].ids);
        outs[i].logits = malloc((size_t)lim.vocab * sizeof *outs[i].logits);
        if (!outs[i].ids || !outs[i].logits) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    if (st == FERRY_OK) st = generate_all(e, &ps, &proto, outs);
    if (st == FERRY_OK && cfg->dump_logits) st = dump_logits(cfg->dump_logits, outs, ps.n, lim.vocab);
    if (st != FERRY_OK) {
        rc = cli_fail(st);
        goto done;
    }
    strbuf *texts = tm && !text_error(tm) ? calloc((size_t)ps.n, sizeof *texts) : NULL;
    text_finish *finish = texts ? calloc((size_t)ps.n, sizeof *finish) : NULL;
    if (texts && (!finish || decode_outputs(tm, &proto, outs, ps.n, texts, finish) != FERRY_OK)) {
        rc = cli_error(EXIT_RUNTIME, "out of memory");
    } else {
        strbuf sb;
        sb_init(&sb);
        print_outputs(&sb, cfg, outs, ps.n, texts, finish);
        if (sb.oom) rc = cli_error(EXIT_RUNTIME, "out of memory");
        else fwrite(sb.data, 1, sb.len, stdout);
        sb_free(&sb);
    }
    for (int i = 0; texts && i < ps.n; i++) sb_free(&texts[i]);
    free(texts);
    free(finish);
done:
    for (int i = 0; outs && i < ps.n; i++) {
        free(outs[i].ids);
        free(outs[i].logits);
    }
    free(outs);
    engine_close(e);
    prompts_free(&ps);
    text_model_free(tm);
    return rc;
}
