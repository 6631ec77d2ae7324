/*
 * cmd_export.c - `ferry export`: opens the model as the conversion and
 * placement flags say and writes what the engine holds as a Hugging Face
 * checkpoint (engine/export.h). --out's parent directory is the export root
 * and its base name the export's name, so the offline command keeps the
 * confinement and atomicity of the admin API's exports.
 *
 * Progress: on a terminal, one bar on stderr rewritten in place; otherwise
 * a plain line per 10% on stdout (stderr keeps its one line for an error;
 * none with --json). Ctrl-C cancels (the partial output is removed). The
 * result is one line on stdout (--json: an object with the bytes, seconds,
 * and RSS before the export and its peak during it).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../engine/base/json.h"
#include "../engine/base/util.h"
#include "../engine/export.h"
#include "cli.h"

static volatile sig_atomic_t g_interrupted;

static void on_interrupt(int sig)
{
    (void)sig;
    g_interrupted = 1;
}

/* A /proc/self/status field in bytes (VmRSS, VmHWM); 0 when unknown. */
static uint64_t proc_status_kib(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    uint64_t kib = 0;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':') kib = strtoull(line + n + 1, NULL, 10);
    fclose(f);
    return kib * 1024;
}

/* Resets VmHWM to the current RSS, so that it measures the export alone. */
static void reset_peak_rss(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return;
    fputs("5", f);
    fclose(f);
}

static void show_progress(const export_status *s, bool tty, bool quiet, int *last_decile)
{
    char b1[32], b2[32];
    int pct = (int)(s->progress * 100.0);
    if (tty) {
        char bar[31];
        int fill = (int)(s->progress * 30.0);
        for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
        bar[30] = '\0';
        fprintf(stderr, "\rexport [%s] %3d%% %s / %s ", bar, pct, util_fmt_bytes(s->bytes_written, b1, sizeof b1),
                util_fmt_bytes(s->bytes_total, b2, sizeof b2));
        fflush(stderr);
    } else if (!quiet && pct / 10 > *last_decile) {
        *last_decile = pct / 10;
        printf("export: %d%% %s / %s\n", pct, util_fmt_bytes(s->bytes_written, b1, sizeof b1),
                util_fmt_bytes(s->bytes_total, b2, sizeof b2));
        fflush(stdout);
    }
}

int cmd_export(const ferry_config *cfg)
{
    export_opts o = {.max_shard_bytes = cfg->max_shard_size, .overwrite = cfg->overwrite};
    if (!export_layout_parse(cfg->layout, &o.layout))
        return cli_error(EXIT_USAGE, "--layout must be converted or original (got '%s')", cfg->layout);
    /* --out: the root is its parent, the name its base name */
    char *out = strdup(cfg->out);
    if (!out) return cli_error(EXIT_RUNTIME, "out of memory");
    size_t len = strlen(out);
    while (len > 1 && out[len - 1] == '/') out[--len] = '\0';
    char *slash = strrchr(out, '/');
    if (!slash) {
        o.root = ".";
        o.name = out;
    } else {
        *slash = '\0';
        o.root = slash == out ? "/" : out;
        o.name = slash + 1;
    }
    engine_opts eo;
    int rc = cli_engine_opts(cfg, &eo);
    if (rc) {
        free(out);
        return rc;
    }
    /* export runs no steps: the smallest KV cache and activations */
    eo.max_seqs = 1;
    eo.max_ctx = 16;
    eo.max_step_tokens = 16;
    engine *e;
    ferry_status st = engine_open(&eo, &e);
    if (st != FERRY_OK) {
        free(out);
        return cli_fail(st);
    }
    uint64_t rss_before = proc_status_kib("VmRSS");
    reset_peak_rss();
    double t0 = util_now();
    /* before the job starts: a signal as soon as its temporary exists must
     * cancel it, not kill the process */
    struct sigaction sa = {.sa_handler = on_interrupt}, old_int, old_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    export_job *job;
    st = export_start(e, &o, &job);
    if (st != FERRY_OK) {
        sigaction(SIGINT, &old_int, NULL);
        sigaction(SIGTERM, &old_term, NULL);
        engine_close(e);
        free(out);
        return cli_fail(st);
    }
    bool tty = isatty(2);
    int decile = -1;
    export_status s;
    for (;;) {
        s = export_job_status(job);
        if (s.state != EXPORT_QUEUED && s.state != EXPORT_RUNNING) break;
        if (g_interrupted) export_job_cancel(job);
        show_progress(&s, tty, cfg->json, &decile);
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    s = export_job_wait(job);
    double secs = util_now() - t0;
    uint64_t rss_peak = proc_status_kib("VmHWM");
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (s.state == EXPORT_DONE) show_progress(&s, tty, cfg->json, &decile);
    if (tty) fputc('\n', stderr);
    export_job_free(job);
    engine_close(e);
    if (s.state == EXPORT_CANCELLED) rc = cli_error(EXIT_RUNTIME, "export '%s' cancelled (nothing was left behind)", o.name);
    else if (s.state == EXPORT_FAILED) rc = cli_error(EXIT_RUNTIME, "export '%s' failed: %s", o.name, s.error);
    else if (cfg->json) {
        strbuf sb;
        sb_init(&sb);
        sb_puts(&sb, "{\"export\": ");
        sb_json_str(&sb, cfg->out);
        sb_printf(&sb, ", \"layout\": \"%s\", \"bytes\": %llu, \"seconds\": %.3f, \"rss_before\": %llu, "
                  "\"rss_peak\": %llu}\n", cfg->layout, (unsigned long long)s.bytes_total, secs,
                  (unsigned long long)rss_before, (unsigned long long)rss_peak);
        fwrite(sb.data, 1, sb.len, stdout);
        sb_free(&sb);
    } else {
        char b[32];
        printf("exported %s (%s layout): %s of tensors in %.2f s (%.1f MB/s)\n", cfg->out, cfg->layout,
               util_fmt_bytes(s.bytes_total, b, sizeof b), secs, secs > 0 ? (double)s.bytes_total / secs / 1e6 : 0.0);
    }
    free(out);
    return rc;
}
