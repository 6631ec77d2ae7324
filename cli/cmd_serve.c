/*
 * cmd_serve.c - `ferry serve`: the model server. Listens at once (so that
 * an orchestrator sees the process live while weights load), loads the
 * engine on a background thread, then starts the scheduler and marks the
 * model ready. The main thread only waits for signals: SIGUSR1 from the
 * loader when loading ended, SIGINT/SIGTERM/SIGHUP to stop (SIGHUP is a
 * graceful stop too: a closed terminal must not cut answers off).
 *
 * The loader also reads the model's text files (text/text.h): a
 * checkpoint without a tokenizer serves token ids, and the text endpoints
 * answer why not (said once on stderr when the model is ready).
 *
 * The gRPC front end (server/grpc, unless --grpc-port -1) listens right
 * after HTTP and is attached to the same engine and scheduler; so does the
 * admin API (server/http/admin.c, 127.0.0.1:8003 by default) when it has a token.
 *
 * The admin token: admin_token_file (admin.h checks the file) or the
 * admin_token setting (FERRY_ADMIN_TOKEN, or a config file of mode 0600);
 * never a flag's value (it would show in ps). Without
 * one the admin API does not start - on loopback that is only said when an
 * admin setting was given; on another address it is a usage error, so that
 * an operator who asked for a reachable admin API is not left without one.
 *
 * Stopping (server/frontend.h, for every front end alike): all stop
 * accepting at once; the requests in flight on each get --drain-timeout to
 * finish (gRPC cancels its calls past it while the scheduler still runs;
 * a running export is cancelled at once: the job reads the engine); then
 * detach the model (handlers stop submitting; HTTP requests still running
 * end with 503), sched_free (every request in flight ends and its
 * connection resumes), stop each front end (no connection is suspended any
 * more, as libmicrohttpd requires), close the engine.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "../engine/engine.h"
#include "../engine/scheduler.h"
#include "../engine/base/util.h"
#include "../text/chat_template.h"
#include "cli.h"
#include "../server/grpc/grpc_server.h"
#include "../server/http/admin.h"
#include "../server/http/http_server.h"
#include "../server/metrics.h"
#include "../text/text.h"


enum { LOAD_RUNNING, LOAD_READY, LOAD_FAILED };

typedef struct {
    engine_opts eo;
    int max_queued;
    size_t max_text;    /* --max-text-bytes */
    const char *gen_override; /* --override-generation-config, or NULL */
    pthread_t main_thread;
    int state;          /* atomic: LOAD_* */
    engine *e;          /* valid once state is LOAD_READY */
    sched *s;
    text_model *tm;
    char *err;          /* the loading error, whole (NULL: out of memory) */
} loader;

static void *load_main(void *arg)
{
    loader *l = arg;
    ferry_status st = text_model_load(l->eo.model_dir, l->max_text, &l->tm);
    if (st == FERRY_OK && l->gen_override) st = text_model_override_generation(l->tm, l->gen_override);
    if (st == FERRY_OK) st = engine_open(&l->eo, &l->e);
    if (st == FERRY_OK) {
        sched_opts so = {.max_queued = l->max_queued, .serving = true};
        st = sched_create(l->e, &so, &l->s);
    }
    if (st != FERRY_OK) {
        l->err = ferry_errmsg_dup();
        engine_close(l->e);
        l->e = NULL;
        text_model_free(l->tm);
        l->tm = NULL;
    }
    __atomic_store_n(&l->state, st == FERRY_OK ? LOAD_READY : LOAD_FAILED, __ATOMIC_RELEASE);
    pthread_kill(l->main_thread, SIGUSR1);
    return NULL;
}

/* Every connection takes descriptors (a gRPC one three, relayed): raise the soft limit to what
 * max_connections needs on each front end (HTTP, and gRPC unless it is
 * off) plus the engine's own files, up to the hard limit, and say so when
 * that is not enough: the front ends then share what there is. */
static int fit_fd_limit(http_opts *ho, grpc_front_opts *go, bool grpc_on)
{
    /* descriptors one connection to each front end takes */
    int per_conn = 1 + (grpc_on ? GRPC_FDS_PER_CONNECTION : 0);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
    rlim_t want = (rlim_t)ho->max_connections * (rlim_t)per_conn + 256;
    if (rl.rlim_cur < want) {
        rl.rlim_cur = want < rl.rlim_max ? want : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < want) {
        if (rl.rlim_cur < 256 + 8 * (rlim_t)per_conn)
            return cli_error(EXIT_RUNTIME, "the open-file limit (%llu) is too low to serve", (unsigned long long)rl.rlim_cur);
        int each = (int)((rl.rlim_cur - 256) / (rlim_t)per_conn);
        ho->max_connections = go->max_connections = each;
        fprintf(stderr, "ferry: warning: open-file limit %llu: at most %d connections%s\n", (unsigned long long)rl.rlim_cur,
                each, grpc_on ? " to each front end" : "");
    }
    return 0;
}

/* The model directory's base name ("models/llama-1b/" -> "llama-1b"); a
 * GGUF file's without ".gguf" ("m/SmolLM2.Q4_1.gguf" -> "SmolLM2.Q4_1"). */
static void default_name(const char *dir, char *out, size_t cap)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t start = n;
    while (start > 0 && dir[start - 1] != '/') start--;
    if (n - start > 5 && !strncasecmp(dir + n - 5, ".gguf", 5)) n -= 5;
    snprintf(out, cap, "%.*s", (int)(n - start), dir + start);
}

/* The name the model is served as: --name, or the model directory's. */
static void serve_name(const ferry_config *cfg, char name[256])
{
    if (cfg->name) snprintf(name, 256, "%s", cfg->name);
    else default_name(cfg->model ? cfg->model : "", name, 256);
}

int serve_settings_check(const ferry_config *cfg, engine_opts *eo)
{
    int rc = cli_engine_opts(cfg, eo);
    if (rc) return rc;
    if (eo->max_seqs > eo->max_step_tokens)
        return cli_error(EXIT_USAGE, "--batch %d exceeds --max-step-tokens %d (every sequence needs a row per step)",
                         eo->max_seqs, eo->max_step_tokens);
    if (cfg->request_memory < cfg->max_body)
        return cli_error(EXIT_USAGE, "--request-memory must be at least --max-body (%llu bytes)",
                         (unsigned long long)cfg->max_body);
    if (cfg->max_connections_per_ip > cfg->max_connections)
        return cli_error(EXIT_USAGE, "--max-connections-per-ip %lld exceeds --max-connections %lld",
                         (long long)cfg->max_connections_per_ip, (long long)cfg->max_connections);
    ferry_config d;
    config_defaults(&d);
    if (cfg->max_output_tokens < d.max_new_tokens) /* what a request that names none asks for */
        return cli_error(EXIT_USAGE, "--max-output-tokens must be at least %lld, the max_new_tokens of a request that names none",
                         (long long)d.max_new_tokens);
    if (!cfg->host || !*cfg->host) return cli_error(EXIT_USAGE, "--host must not be empty");
    char name[256];
    serve_name(cfg, name);
    if ((cfg->name || cfg->model) && (!*name || strchr(name, '/') || strlen(name) > 200))
        return cli_error(EXIT_USAGE, "--name must be 1..200 characters without '/' (got '%s')", name);
    if (cfg->admin_port == 0) return 0;
    char where[512];
    if (!cfg->admin_host || !*cfg->admin_host)
        return cli_error(EXIT_USAGE, "%s must not be empty", config_where(cfg, SETTING_admin_host, where, sizeof where));
    if (cfg->admin_token && cfg->admin_token_file && cfg->source[SETTING_admin_token] == cfg->source[SETTING_admin_token_file])
        return cli_error(EXIT_USAGE, "admin_token and admin_token_file are both set%s: give one",
                         cfg->source[SETTING_admin_token] == SOURCE_FILE ? " in the config file" : " in the environment");
    return 0;
}

/* The flags of serve alone (checked by serve_settings_check); fills the
 * front end's options (counters set by the caller) and the engine's
 * per-request caps. Returns 0 or the exit status it printed. */
static int serve_opts(const ferry_config *cfg, engine_opts *eo, char name[256], http_opts *ho, grpc_front_opts *go)
{
    eo->max_prompt = (int)cfg->max_prompt_tokens;
    eo->max_new = (int)cfg->max_output_tokens;
    serve_name(cfg, name);
    *ho = (http_opts){.host = cfg->host,
                      .port = (int)cfg->http_port,
                      .model_name = name,
                      .max_body = cfg->max_body,
                      .request_timeout_s = (int)cfg->request_timeout,
                      .connection_timeout_s = (int)cfg->connection_timeout,
                      .max_header = cfg->max_header,
                      .max_connections = (int)cfg->max_connections,
                      .max_connections_per_ip = (int)cfg->max_connections_per_ip};
    /* the connection limits and timeouts are each front end's (docs/limits.md) */
    *go = (grpc_front_opts){.host = cfg->host,
                            .port = (int)cfg->grpc_port,
                            .model_name = name,
                            .max_message = cfg->max_body,
                            .max_streams = (int)cfg->grpc_max_streams,
                            .max_header = cfg->max_header,
                            .max_resets = (int)cfg->grpc_max_resets,
                            .connection_timeout_s = (int)cfg->connection_timeout,
                            .request_timeout_s = (int)cfg->request_timeout,
                            .max_connections = (int)cfg->max_connections,
                            .max_connections_per_ip = (int)cfg->max_connections_per_ip};
    return fit_fd_limit(ho, go, cfg->grpc_port >= 0);
}

/* The admin API's options: *token is NULL when it is not to start.
 * Returns 0 or the exit status it printed. */
static int admin_setup(const ferry_config *cfg, const char *name, admin_opts *ao, char **token)
{
    *token = NULL;
    *ao = (admin_opts){.host = cfg->admin_host, .port = (int)cfg->admin_port, .model_name = name,
                       .export_root = cfg->export_dir, .request_timeout_s = (int)cfg->request_timeout,
                       .max_connections = (int)cfg->admin_max_connections};
    if (cfg->admin_port == 0) return 0;
    if (ao->port == -1) ao->port = 0; /* MHD's "any free port" */
    char where[512]; /* admin_host and the token settings' sources: serve_settings_check */
    if (cfg->export_dir) { /* checked as export_start opens it: a directory, not a symlink */
        int fd = open(cfg->export_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            return cli_error(EXIT_USAGE, "%s %s: %s%s", config_where(cfg, SETTING_export_dir, where, sizeof where),
                             cfg->export_dir, strerror(errno),
                             errno == ELOOP || errno == ENOTDIR ? " (it must be a directory, not a symlink)" : "");
        close(fd);
    }
    /* Both given: the one from the higher-precedence source (a flag over the
     * environment over the file); from the same source, it is ambiguous. */
    bool use_file = cfg->admin_token_file != NULL;
    if (cfg->admin_token && cfg->admin_token_file)
        use_file = cfg->source[SETTING_admin_token_file] > cfg->source[SETTING_admin_token];
    char from[512];
    if (use_file) {
        config_where(cfg, SETTING_admin_token_file, from, sizeof from);
        if (admin_token_read(cfg->admin_token_file, from, token) != FERRY_OK)
            return cli_error(EXIT_USAGE, "%s", ferry_errmsg());
    } else if (cfg->admin_token) {
        config_where(cfg, SETTING_admin_token, from, sizeof from);
        if (admin_token_check(cfg->admin_token, from) != FERRY_OK) return cli_error(EXIT_USAGE, "%s", ferry_errmsg());
        if (!(*token = strdup(cfg->admin_token))) return cli_error(EXIT_RUNTIME, "out of memory");
    }
    if (*token) return 0;
    if (!admin_host_is_loopback(cfg->admin_host))
        return cli_error(EXIT_USAGE,
                         "%s %s is not a loopback address: the admin API needs a token there "
                         "(--admin-token-file, FERRY_ADMIN_TOKEN or admin_token in a config file), or --admin-port 0",
                         config_where(cfg, SETTING_admin_host, where, sizeof where), cfg->admin_host);
    if (config_given(cfg, SETTING_admin_port) || config_given(cfg, SETTING_admin_host) || config_given(cfg, SETTING_export_dir))
        fprintf(stderr, "ferry: admin API off: no token (give --admin-token-file, set FERRY_ADMIN_TOKEN, or admin_token "
                        "in a config file of mode 0600)\n");
    return 0;
}

static void token_free(char *token)
{
    if (!token) return;
    memset(token, 0, strlen(token));
    free(token);
}

/* Starts the front ends into *fronts: HTTP, then gRPC (unless its port is
 * -1), then the admin API when it has a token; says where each listens.
 * On a failure the ones started are left in *fronts for the caller. */
static ferry_status start_fronts(const ferry_config *cfg, const char *name, const http_opts *ho,
                                 const grpc_front_opts *go, admin_opts *ao, const char *token, frontend_set *fronts)
{
    http_server *srv;
    if (http_server_start(ho, &srv) != FERRY_OK) return FERRY_ERR_IO;
    frontends_add(fronts, http_frontend(srv));
    bool v6 = strchr(cfg->host, ':') != NULL;
    fprintf(stderr, "ferry: listening on http://%s%s%s:%d (model %s loading)\n", v6 ? "[" : "", cfg->host,
            v6 ? "]" : "", http_server_port(srv), name);
    if (cfg->grpc_port >= 0) {
        grpc_front *gf;
        if (grpc_front_start(go, &gf) != FERRY_OK) return FERRY_ERR_IO;
        frontends_add(fronts, grpc_frontend(gf));
        fprintf(stderr, "ferry: listening on grpc://%s%s%s:%d\n", v6 ? "[" : "", cfg->host, v6 ? "]" : "",
                grpc_front_port(gf));
    }
    if (!token) return FERRY_OK;
    ao->token = token;
    ao->counters = ho->counters;
    admin_server *adm;
    ferry_status st = admin_server_start(ao, &adm);
    if (st != FERRY_OK) return st;
    frontends_add(fronts, admin_frontend(adm));
    bool a6 = strchr(cfg->admin_host, ':') != NULL;
    fprintf(stderr, "ferry: admin listening on http://%s%s%s:%d%s\n", a6 ? "[" : "", cfg->admin_host, a6 ? "]" : "",
            admin_server_port(adm), cfg->export_dir ? "" : " (no --export-dir: exports are off)");
    if (!admin_host_is_loopback(cfg->admin_host))
        fprintf(stderr, "ferry: warning: the admin API is plain HTTP on %s: the token crosses the network in the clear\n",
                cfg->admin_host);
    return FERRY_OK;
}

int cmd_serve(const ferry_config *cfg)
{
    engine_opts eo;
    http_opts ho;
    grpc_front_opts go;
    admin_opts ao;
    char name[256], *token = NULL;
    int rc = serve_settings_check(cfg, &eo);
    if (rc || (rc = serve_opts(cfg, &eo, name, &ho, &go)) != 0 || (rc = admin_setup(cfg, name, &ao, &token)) != 0)
        return rc;

    /* every thread started from here inherits the mask: signals reach only sigwait below */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    metrics m;
    metrics_init(&m);
    req_budget budget; /* --request-memory: one budget for both front ends */
    req_budget_init(&budget, cfg->request_memory);
    ho.counters = go.counters = &m;
    ho.budget = go.budget = &budget;
    frontend_set fronts = {0};
    ferry_status st = start_fronts(cfg, name, &ho, &go, &ao, token, &fronts);
    token_free(token);
    if (st != FERRY_OK) {
        frontends_stop(&fronts);
        metrics_free(&m);
        return cli_fail(st);
    }

    loader ld = {.eo = eo, .max_queued = (int)cfg->max_queued, .max_text = cfg->max_text_bytes,
                 .gen_override = cfg->override_generation_config, .main_thread = pthread_self()};
    pthread_t lt;
    if (pthread_create(&lt, NULL, load_main, &ld) != 0) {
        frontends_stop(&fronts);
        metrics_free(&m);
        return cli_error(EXIT_RUNTIME, "cannot start the loading thread");
    }
    int state = LOAD_RUNNING;
    for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) != 0) continue;
        if (sig != SIGUSR1) break;
        if (state != LOAD_RUNNING || (state = __atomic_load_n(&ld.state, __ATOMIC_ACQUIRE)) == LOAD_RUNNING)
            continue; /* a stray SIGUSR1 */
        if (state == LOAD_FAILED) {
            pthread_join(lt, NULL);
            frontends_stop(&fronts);
            metrics_free(&m);
            rc = cli_error(EXIT_RUNTIME, "%s", ld.err ? ld.err : "out of memory");
            free(ld.err);
            return rc;
        }
        frontends_attach(&fronts, ld.e, ld.s, ld.tm);
        if (text_error(ld.tm)) fprintf(stderr, "ferry: text endpoints off: %s\n", text_error(ld.tm));
        else if (text_chat_error(ld.tm)) fprintf(stderr, "ferry: chat off: %s\n", text_chat_error(ld.tm));
        fprintf(stderr, "ferry: model %s ready\n", name);
    }

    if (state == LOAD_RUNNING) {
        /* loading cannot be interrupted; nothing was submitted, so no
         * connection is suspended: stop listening and leave */
        frontends_stop(&fronts);
        fprintf(stderr, "ferry: stopped while the model was loading\n");
        _exit(0);
    }
    pthread_join(lt, NULL);
    /* every front end stops accepting at once; the requests in flight on
     * each have --drain-timeout to finish (a running export is cancelled
     * at once), then frontend.h's order: detach, sched_free, stop,
     * engine_close */
    double deadline = util_now() + (double)cfg->drain_timeout;
    frontends_quiesce(&fronts);
    tmpl_cancel_renders(); /* a render is not a request in flight yet: it ends now (503) */
    frontends_shutdown(&fronts, deadline, ld.s, ld.e);
    text_model_free(ld.tm);
    metrics_free(&m);
    fprintf(stderr, "ferry: stopped\n");
    return 0;
}
