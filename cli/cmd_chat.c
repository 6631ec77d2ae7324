/*
 * cmd_chat.c - `ferry chat`: a conversation in the terminal with the
 * model's chat template, the answer printed as it is generated.
 *
 * Each turn renders the whole conversation so far (the history: every
 * user message and every answer, as the model wrote it - a stopped one as
 * far as it went) with add_generation_prompt, encodes it as the server
 * encodes a chat prompt (text/text.h) and generates through the
 * scheduler, the one generation path. The engine thread hands each
 * token's text to the main thread (the callbacks must not block on a
 * terminal); the main thread prints it.
 *
 * Input: a line is a message; a line ending in '\' continues on the next
 * line. "/clear" starts the conversation over, "/quit" or Ctrl-D (EOF)
 * ends it. Ctrl-C stops the answer being written (not the program); at the
 * prompt it drops the line being typed. stdin need not be a terminal: a
 * pipe feeds one message per line, and --json prints one object per turn
 * instead of the streamed text (the rendered prompt, its token count, the
 * ids, the text and why it ended).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <utf8proc.h>

#include "../engine/base/json.h"
#include "../engine/engine.h"
#include "../engine/scheduler.h"
#include "../text/text.h"
#include "cli.h"

#define RENDER_MAX (64u << 20) /* bytes a rendered conversation may have */

static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    g_interrupted = 1;
}

/* ---- one answer ------------------------------------------------------------------------- */

/* Shared between the engine thread (callbacks) and the main thread. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    text_stream *ts;
    strbuf pending;          /* text decoded, not yet printed */
    int32_t *ids;            /* [max_new] generated ids */
    int n_ids;
    bool done;
    ferry_status st;
    char msg[256];
    text_finish finish;
} answer;

static void on_token(void *user, int32_t token, int index)
{
    (void)index;
    answer *a = user;
    pthread_mutex_lock(&a->mu);
    a->ids[a->n_ids++] = token;
    text_stream_push(a->ts, token, &a->pending);
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

static void on_done(void *user, ferry_status st, const char *msg, const gen_result *res)
{
    (void)res;
    answer *a = user;
    pthread_mutex_lock(&a->mu);
    a->st = st;
    if (st != FERRY_OK) snprintf(a->msg, sizeof a->msg, "%s", msg ? msg : "generation failed");
    a->finish = text_stream_end(a->ts, &a->pending);
    a->done = true;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

/* Generates the answer to g, printing its text as it comes unless quiet;
 * the whole text is appended to text. Ctrl-C cancels it. */
static ferry_status run_answer(sched *s, const text_model *tm, const gen_request *g, bool quiet, strbuf *text,
                               answer *a)
{
    memset(a, 0, sizeof *a);
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    a->ids = malloc((size_t)g->max_new_tokens * sizeof *a->ids);
    ferry_status st = a->ids ? text_stream_new(tm, g, NULL, &a->ts) : ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    uint64_t id = 0;
    sched_callbacks cb = {on_token, on_done};
    g_interrupted = 0;
    if (st == FERRY_OK) st = sched_submit(s, g, &cb, a, &id);
    if (st != FERRY_OK) return st;
    strbuf out; /* the text taken from a->pending, printed with the lock released */
    sb_init(&out);
    for (bool done = false; !done;) {
        pthread_mutex_lock(&a->mu);
        if (!a->pending.len && !a->done) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50 * 1000000L; /* a signal handler cannot signal the condition: poll its flag */
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&a->cv, &a->mu, &ts);
        }
        strbuf t = out;
        out = a->pending;
        a->pending = t;
        a->pending.len = 0;
        done = a->done;
        pthread_mutex_unlock(&a->mu);
        if (out.len) {
            sb_append(text, out.data, out.len);
            if (!quiet) {
                fwrite(out.data, 1, out.len, stdout);
                fflush(stdout);
            }
            out.len = 0;
        }
        if (g_interrupted && !done) {
            g_interrupted = 0;
            sched_cancel(s, id); /* on_done follows at the next step */
        }
    }
    sb_free(&out);
    if (a->st != FERRY_OK) return ferry_fail(a->st, "%s", a->msg);
    return text->oom ? ferry_fail(FERRY_ERR_NOMEM, "out of memory") : FERRY_OK;
}

static void answer_free(answer *a)
{
    text_stream_free(a->ts);
    sb_free(&a->pending);
    free(a->ids);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
}

/* ---- the conversation ----------------------------------------------------------------------- */

/* The history as a JSON list, built as text: "[{...}, {...}" (the caller
 * closes it to render). */
static void history_add(strbuf *h, const char *role, const char *text, size_t len)
{
    sb_puts(h, h->len > 1 ? ", {\"role\": \"" : "{\"role\": \"");
    sb_puts(h, role);
    sb_puts(h, "\", \"content\": ");
    /* the history is parsed again as JSON, which holds no NUL: a model may
     * generate one; it is kept as U+FFFD (user input is checked first) */
    strbuf clean;
    sb_init(&clean);
    for (size_t i = 0; i < len; i++) {
        if (text[i]) sb_putc(&clean, text[i]);
        else sb_puts(&clean, "\xEF\xBF\xBD");
    }
    sb_json_strn(h, clean.data ? clean.data : "", clean.len);
    h->oom |= clean.oom;
    sb_free(&clean);
    sb_putc(h, '}');
}

/* Why a typed message cannot be sent (NULL: it can): the template sees
 * text, so it must be UTF-8 without NUL bytes. */
static const char *message_problem(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0) return "the message is not valid UTF-8";
        if (cp == 0) return "the message holds a NUL byte";
        i += (size_t)k;
    }
    return NULL;
}

static void history_reset(strbuf *h, const char *system)
{
    h->len = 0;
    sb_putc(h, '[');
    if (system) history_add(h, "system", system, strlen(system));
}

/* Renders and encodes the conversation in h. */
static ferry_status render(const text_model *tm, strbuf *h, strbuf *prompt, int32_t **ids, int *n)
{
    size_t open_len = h->len;
    sb_putc(h, ']');
    json_doc *doc = NULL;
    ferry_status st = h->oom ? ferry_fail(FERRY_ERR_NOMEM, "out of memory") : json_parse(h->data, h->len, &doc);
    h->len = open_len;
    prompt->len = 0;
    if (st == FERRY_OK) st = text_render_chat(tm, json_doc_root(doc), NULL, NULL, RENDER_MAX, prompt);
    json_doc_free(doc);
    if (st == FERRY_OK) st = text_encode(tm, prompt->data ? prompt->data : "", prompt->len, false, ids, n);
    return st;
}

/* Reads one message: lines joined while they end in '\'. false at EOF with
 * nothing read. A Ctrl-C while typing drops what was typed. */
static bool read_message(bool tty, strbuf *msg)
{
    char *line = NULL;
    size_t cap = 0;
    msg->len = 0;
    bool more = true, got = false;
    while (more) {
        if (tty) fputs(msg->len || got ? ". " : "> ", stderr);
        errno = 0;
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0 && errno == EINTR) {
            clearerr(stdin);
            g_interrupted = 0;
            fputs("\n(input dropped; Ctrl-D quits)\n", stderr);
            msg->len = 0;
            got = false;
            continue;
        }
        if (n < 0) break;
        got = true;
        if (n > 0 && line[n - 1] == '\n') n--;
        more = n > 0 && line[n - 1] == '\\';
        sb_append(msg, line, (size_t)(more ? n - 1 : n));
        if (more) sb_putc(msg, '\n');
    }
    free(line);
    return got;
}

static void print_turn_json(const strbuf *prompt, int prompt_tokens, const answer *a, const strbuf *text)
{
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\"prompt\": ");
    sb_json_strn(&sb, prompt->data ? prompt->data : "", prompt->len);
    sb_printf(&sb, ", \"prompt_tokens\": %d, \"output_ids\": [", prompt_tokens);
    for (int i = 0; i < a->n_ids; i++) sb_printf(&sb, "%s%d", i ? ", " : "", a->ids[i]);
    sb_puts(&sb, "], \"text\": ");
    sb_json_strn(&sb, text->data ? text->data : "", text->len);
    const char *why = text_finish_name(a->finish);
    sb_printf(&sb, ", \"finish_reason\": \"%s\"}\n", why ? why : "cancelled");
    if (!sb.oom) fwrite(sb.data, 1, sb.len, stdout);
    fflush(stdout);
    sb_free(&sb);
}

/* One turn: the user's message is in the history; generates the answer
 * and adds it. Returns false (after saying why) when the turn failed: the
 * message is taken out again. */
static bool turn(const ferry_config *cfg, sched *s, const engine_limits *lim, const text_model *tm, strbuf *history,
                 int turn_no)
{
    strbuf prompt, text;
    sb_init(&prompt);
    sb_init(&text);
    int32_t *ids = NULL;
    int n = 0;
    bool ok = false;
    answer a;
    memset(&a, 0, sizeof a);
    bool started = false;
    ferry_status st = render(tm, history, &prompt, &ids, &n);
    gen_params gp;
    config_gen_params(cfg, &gp);
    int64_t room = request_context(lim) - n;
    if (!gp.given[GEN_max_new_tokens]) gp.max_new_tokens = (int)(room > 0 ? room : 0);
    int max_new = gp.max_new_tokens;
    if (st == FERRY_OK && (max_new < 1 || n + (int64_t)max_new > lim->max_ctx)) {
        st = ferry_fail(FERRY_ERR_INVALID, "the conversation is %d tokens and the answer may take %d: more than the "
                        "context of %d (/clear starts over)", n, max_new, lim->max_ctx);
    }
    if (st == FERRY_OK) {
        gen_request g = {.prompt = ids, .prompt_len = n, .stream = (uint64_t)turn_no};
        st = text_request_defaults(tm, &gp, false);
        request_set_params(&g, &gp);
        started = true;
        if (st == FERRY_OK) st = run_answer(s, tm, &g, cfg->json, &text, &a);
    }
    if (st == FERRY_OK) {
        if (cfg->json) print_turn_json(&prompt, n, &a, &text);
        else fputs("\n", stdout);
        fflush(stdout);
        history_add(history, "assistant", text.data ? text.data : "", text.len);
        ok = !history->oom;
    } else {
        if (!cfg->json) fflush(stdout);
        cli_error(EXIT_RUNTIME, "%s", ferry_errmsg());
    }
    if (started) answer_free(&a);
    free(ids);
    sb_free(&prompt);
    sb_free(&text);
    return ok;
}

int cmd_chat(const ferry_config *cfg)
{
    gen_params gp;
    config_gen_params(cfg, &gp);
    if (sampling_params_check(&gp.sampling) != FERRY_OK) return cli_error(EXIT_USAGE, "%s", ferry_errmsg());
    engine_opts eo;
    int rc = cli_engine_opts(cfg, &eo);
    if (rc) return rc;
    eo.max_seqs = 1; /* one conversation */
    if (eo.max_step_tokens < 1) eo.max_step_tokens = 1;

    text_model *tm = NULL;
    if (text_model_load(cfg->model, 0, &tm) != FERRY_OK) return cli_fail(FERRY_ERR_NOMEM);
    if (text_chat_error(tm)) {
        rc = cli_error(EXIT_RUNTIME, "%s", text_chat_error(tm));
        text_model_free(tm);
        return rc;
    }
    /* the engine's threads never take SIGINT: the main thread's getline and
     * wait must see it */
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, &old);
    engine *e = NULL;
    sched *s = NULL;
    ferry_status st = engine_open(&eo, &e);
    if (st == FERRY_OK) st = sched_create(e, NULL, &s);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint; /* no SA_RESTART: getline returns EINTR */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL); /* before unblocking: a Ctrl-C while loading must not end the program */
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (st != FERRY_OK) {
        rc = cli_fail(st);
        goto done;
    }

    engine_limits lim = engine_get_limits(e);
    bool tty = isatty(STDIN_FILENO);
    if (tty)
        fprintf(stderr, "ferry chat: %s (context %d). Enter sends; a line ending in '\\' continues on the next. "
                        "Ctrl-C stops an answer; /clear starts over; Ctrl-D or /quit ends.\n",
                cfg->model, lim.max_ctx);
    strbuf history, msg;
    sb_init(&history);
    sb_init(&msg);
    history_reset(&history, cfg->system);
    for (int turn_no = 0; read_message(tty, &msg);) {
        sb_putc(&msg, '\0');
        if (msg.oom) {
            fputs("ferry chat: out of memory for the message\n", stderr);
            break;
        }
        msg.len--;
        const char *problem = message_problem(msg.data, msg.len);
        if (problem) {
            fprintf(stderr, "ferry chat: %s: not sent\n", problem);
            continue;
        }
        const char *m = msg.data;
        size_t skip = strspn(m, " \t\n\r");
        if (!m[skip]) continue; /* nothing to send */
        if (!strcmp(m + skip, "/quit") || !strcmp(m + skip, "/exit")) break;
        if (!strcmp(m + skip, "/clear")) {
            history_reset(&history, cfg->system);
            if (tty) fputs("(conversation cleared)\n", stderr);
            continue;
        }
        size_t before = history.len;
        history_add(&history, "user", msg.data, msg.len);
        if (!turn(cfg, s, &lim, tm, &history, turn_no++)) {
            history.len = before; /* the message had no answer: it leaves the history */
            if (!tty) rc = EXIT_RUNTIME;
        }
    }
    sb_free(&history);
    sb_free(&msg);
done:
    sched_free(s);
    engine_close(e);
    text_model_free(tm);
    return rc;
}
