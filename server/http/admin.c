/*
 * admin.c - the admin API: its routes on a listener of its own
 * (http/listener.h), the bearer token, and the export jobs. See admin.h.
 *
 * Small and synchronous, unlike the inference API: no handler waits on
 * the engine (status reads published figures; an export runs on the job's
 * own thread), so a request is answered within the call that sees its body
 * whole, on one of a couple of connection threads, and there are no prep
 * workers.
 *
 * A request is authenticated when its head arrives (the listener's head
 * hook, admin_route.h's decision): a client without the token is answered
 * 401 before its body is read. Routing and the body's checks come after,
 * from the table below.
 *
 * Connections (issue 29.6). Authentication needs a whole head, and a head
 * can be trickled a byte at a time; the admin API is usually on loopback,
 * where every client shares one address, so a per-address limit would
 * lock the operator out together with whoever holds the connections (there
 * is none). Instead (mhd_common.h's mhd_conns): a connection has
 * request_timeout seconds to send its request (head and body, as on the
 * inference listener), and at most admin_max_connections may be sending
 * one: the next connection to open shuts down the one that has been
 * sending longest, connections that never had a request let in first. An
 * operator's request, sent whole as the connection opens, is therefore
 * read and answered however many connections trickle heads; MHD's own
 * limit is twice admin_max_connections, room for the connections shut down
 * and not yet closed.
 *
 * Jobs. The server keeps the last ADMIN_JOBS_KEPT export jobs in a ring,
 * the newest at (n_jobs - 1) % ADMIN_JOBS_KEPT. Invariants, under jobs_mu:
 *   (J1) only the newest job may still have an export_job handle
 *        (one export at a time: a second is 409 while it runs);
 *   (J2) a job whose handle is gone has its final status in `final`;
 *   (J3) a handle is freed only after export_job_wait (reap_jobs, jobs_end).
 */
#define _GNU_SOURCE
#include "admin.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../../engine/base/json.h"
#include "../../engine/export.h"
#include "../../engine/weights/convert.h"
#include "admin_route.h"
#include "listener.h"
#include "../mhd_common.h"

#define ADMIN_WORKER_THREADS 2
#define ADMIN_CONNECTION_TIMEOUT_S 30
#define ADMIN_MAX_BODY (64u << 10)
#define ADMIN_JOBS_KEPT 16
#define JOBS_PREFIX ADMIN_JOBS_PREFIX

typedef struct {
    char id[24];
    char name[EXPORT_NAME_MAX + 1];
    export_layout layout;
    double created_unix;
    export_job *job;      /* NULL once reaped (J1-J3) */
    export_status final;  /* valid once job is NULL */
} admin_job;

struct admin_server {
    http_listener *l;
    char token[ADMIN_TOKEN_MAX]; /* zero-padded: compared over its whole size */
    size_t token_len;
    char *export_root;
    char *model_name;
    metrics *counters;
    req_budget bodies;           /* the listener's budget: room for every connection's largest body */
    pthread_rwlock_t lock;       /* guards e, s */
    engine *e;
    sched *s;
    pthread_mutex_t jobs_mu;     /* guards jobs, n_jobs */
    admin_job jobs[ADMIN_JOBS_KEPT];
    int n_jobs;                  /* jobs ever started; ids are 1..n_jobs */
};

/* ---- the token ------------------------------------------------------------------ */

ferry_status admin_token_check(const char *token, const char *from)
{
    size_t n = strlen(token);
    if (n == 0) return ferry_fail(FERRY_ERR_INVALID, "%s: the admin token is empty", from);
    if (n > ADMIN_TOKEN_MAX - 1)
        return ferry_fail(FERRY_ERR_INVALID, "%s: the admin token is longer than %d bytes", from, ADMIN_TOKEN_MAX - 1);
    for (size_t i = 0; i < n; i++)
        if (token[i] < 0x21 || token[i] > 0x7e)
            return ferry_fail(FERRY_ERR_INVALID, "%s: the admin token must be printable ASCII without blanks", from);
    return FERRY_OK;
}

ferry_status admin_token_read(const char *path, const char *from, char **out)
{
    *out = NULL;
    /* O_NOFOLLOW: the checks below must be about the file read, not a link */
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ELOOP)
            return ferry_fail(FERRY_ERR_INVALID, "%s %s: a symbolic link (give the file itself)", from, path);
        return ferry_fail(FERRY_ERR_INVALID, "%s %s: %s", from, path, strerror(errno));
    }
    struct stat sb;
    ferry_status st = FERRY_OK;
    if (fstat(fd, &sb) != 0) st = ferry_fail(FERRY_ERR_IO, "%s %s: %s", from, path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        st = ferry_fail(FERRY_ERR_INVALID, "%s %s: not a regular file", from, path);
    else if (sb.st_uid != geteuid())
        st = ferry_fail(FERRY_ERR_INVALID, "%s %s: owned by uid %u, not by this user (uid %u)", from, path,
                        (unsigned)sb.st_uid, (unsigned)geteuid());
    else if (sb.st_mode & 077)
        st = ferry_fail(FERRY_ERR_INVALID,
                        "%s %s: mode %04o lets group or others read it (chmod 600 it)", from, path,
                        (unsigned)(sb.st_mode & 07777));
    char buf[ADMIN_TOKEN_MAX + 2];
    ssize_t n = 0;
    if (st == FERRY_OK) {
        size_t got = 0;
        while (got < sizeof buf - 1 && (n = read(fd, buf + got, sizeof buf - 1 - got)) > 0) got += (size_t)n;
        if (n < 0) st = ferry_fail(FERRY_ERR_IO, "%s %s: %s", from, path, strerror(errno));
        /* a NUL would end the token there, silently: a shorter token than the file says */
        else if (memchr(buf, '\0', got))
            st = ferry_fail(FERRY_ERR_INVALID, "%s %s: holds a NUL byte (the token must be printable ASCII)", from,
                            path);
        buf[got] = '\0';
    }
    close(fd);
    if (st != FERRY_OK) return st;
    char *line = buf, *end = strchr(buf, '\n');
    if (end) *end = '\0';
    while (*line == ' ' || *line == '\t') line++;
    size_t len = strlen(line);
    while (len && (line[len - 1] == ' ' || line[len - 1] == '\t' || line[len - 1] == '\r')) line[--len] = '\0';
    char label[512 + 4096];
    snprintf(label, sizeof label, "%s %s", from, path);
    if ((st = admin_token_check(line, label)) != FERRY_OK) return st;
    if (!(*out = strdup(line))) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    return FERRY_OK;
}

bool admin_host_is_loopback(const char *host)
{
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    if (getaddrinfo(host, "0", &hints, &ai) != 0) return false;
    bool all = ai != NULL;
    for (struct addrinfo *p = ai; p; p = p->ai_next) {
        bool lo = false;
        if (p->ai_family == AF_INET) {
            const struct sockaddr_in *a = (const struct sockaddr_in *)p->ai_addr;
            lo = (ntohl(a->sin_addr.s_addr) >> 24) == 127;
        } else if (p->ai_family == AF_INET6) {
            const struct in6_addr *a = &((const struct sockaddr_in6 *)p->ai_addr)->sin6_addr;
            lo = IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
        }
        all = all && lo;
    }
    freeaddrinfo(ai);
    return all;
}

/* ---- answering ------------------------------------------------------------------ */

/* Every admin answer is JSON and a newline (error bodies: error_body). */
static bool reply(http_req *rq, int code, strbuf *sb, const char *h1, const char *v1)
{
    sb_putc(sb, '\n');
    return http_reply_json(rq, code, sb, h1, v1);
}

static bool reply_error(http_req *rq, int code, const char *h1, const char *v1, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static bool reply_error(http_req *rq, int code, const char *h1, const char *v1, const char *fmt, ...)
{
    char msg[FERRY_MSG_MAX + 128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return http_reply_fail(rq, code, msg, NULL, NULL, h1, v1);
}

static void error_body(const char *url, strbuf *sb, int code, const char *msg, const char *param, const char *errcode)
{
    (void)url, (void)code, (void)param, (void)errcode;
    sb_puts(sb, "{\"error\": ");
    sb_json_str(sb, msg);
    sb_puts(sb, "}\n");
}

/* ---- jobs ----------------------------------------------------------------------- */

static admin_job *newest_job(admin_server *a)
{
    return a->n_jobs ? &a->jobs[(a->n_jobs - 1) % ADMIN_JOBS_KEPT] : NULL;
}

static bool state_ended(export_state s) { return s == EXPORT_DONE || s == EXPORT_FAILED || s == EXPORT_CANCELLED; }

/* Frees the newest job's handle once it has ended (J2, J3). jobs_mu held. */
static void reap_jobs(admin_server *a)
{
    admin_job *j = newest_job(a);
    if (!j || !j->job || !state_ended(export_job_status(j->job).state)) return;
    j->final = export_job_wait(j->job);
    export_job_free(j->job);
    j->job = NULL;
}

static export_status job_status(admin_job *j) { return j->job ? export_job_status(j->job) : j->final; }

/* The job with this id, if still kept. jobs_mu held. */
static admin_job *job_find(admin_server *a, const char *id)
{
    int first = a->n_jobs > ADMIN_JOBS_KEPT ? a->n_jobs - ADMIN_JOBS_KEPT : 0;
    for (int k = first; k < a->n_jobs; k++)
        if (!strcmp(a->jobs[k % ADMIN_JOBS_KEPT].id, id)) return &a->jobs[k % ADMIN_JOBS_KEPT];
    return NULL;
}

static void job_json(strbuf *sb, admin_job *j)
{
    export_status st = job_status(j);
    sb_puts(sb, "{\"job\": ");
    sb_json_str(sb, j->id);
    sb_printf(sb, ", \"location\": \"" JOBS_PREFIX "%s\", \"kind\": \"export\", \"name\": ", j->id);
    sb_json_str(sb, j->name);
    sb_printf(sb, ", \"layout\": \"%s\", \"created\": %.3f, \"state\": \"%s\", \"progress\": %.4f",
              j->layout == EXPORT_ORIGINAL ? "original" : "converted", j->created_unix, export_state_name(st.state),
              st.progress < 0 ? 0 : st.progress > 1 ? 1 : st.progress);
    sb_printf(sb, ", \"bytes_written\": %llu, \"bytes_total\": %llu, \"error\": ", (unsigned long long)st.bytes_written,
              (unsigned long long)st.bytes_total);
    if (st.state == EXPORT_FAILED) sb_json_str(sb, st.error[0] ? st.error : "failed");
    else sb_puts(sb, "null");
    sb_putc(sb, '}');
}

/* ---- GET /admin/v1/status --------------------------------------------------------- */

static const char *group_kind_name(group_kind k)
{
    return k == GROUP_EMBED ? "embed" : k == GROUP_HEAD ? "head" : k == GROUP_EXPERT ? "expert" : "layers";
}

static void status_engine_json(strbuf *sb, engine *e, sched *s)
{
    engine_info info = engine_get_info(e);
    convert_opts conv = engine_get_convert(e);
    char conv_desc[256];
    convert_describe(&conv, conv_desc, sizeof conv_desc);
    const plan *p = engine_get_plan(e);
    pipeline_stats ps = engine_pipeline_stats(e);
    sched_stats ss = sched_get_stats(s);

    sb_puts(sb, ", \"arch\": ");
    sb_json_str(sb, info.arch ? info.arch : "");
    sb_printf(sb, ", \"layers\": %d, \"dim\": %d, \"backend\": ", info.n_layers, info.dim);
    sb_json_str(sb, info.backend);
    sb_printf(sb, ", \"unified\": %s, \"conversion\": ", info.unified ? "true" : "false");
    sb_json_str(sb, conv_desc);

    sb_printf(sb, ", \"placement\": {\"group_size\": %d, \"prefetch\": %d, \"groups\": [", p->opts.group_size,
              p->prefetch);
    for (int g = 0; g < p->n_groups; g++) {
        const plan_group *pg = &p->groups[g];
        sb_printf(sb, "%s{\"group\": %d, \"kind\": \"%s\"", g ? ", " : "", g, group_kind_name(pg->kind));
        if (pg->kind == GROUP_LAYERS)
            sb_printf(sb, ", \"first_layer\": %d, \"layers\": %d", pg->first_layer, pg->n_layers);
        sb_printf(sb, ", \"tier\": \"%s\", \"bytes\": %llu}", tier_name(pg->tier), (unsigned long long)pg->bytes);
    }
    sb_puts(sb, "]}");

    sb_printf(sb, ", \"memory\": {\"weights\": {\"device\": %llu, \"host\": %llu, \"disk\": %llu}",
              (unsigned long long)p->tier_bytes[TIER_DEVICE], (unsigned long long)p->tier_bytes[TIER_HOST],
              (unsigned long long)p->tier_bytes[TIER_DISK]);
    sb_printf(sb, ", \"staging\": {\"slots\": %d, \"slot_bytes\": %llu, \"device\": %llu, \"host\": %llu}",
              p->n_stage_slots, (unsigned long long)p->slot_bytes, (unsigned long long)p->stage_bytes,
              (unsigned long long)p->host_stage_bytes);
    sb_printf(sb, ", \"kv\": %llu, \"activations\": %llu}", (unsigned long long)p->kv_bytes,
              (unsigned long long)p->act_bytes);

    sb_printf(sb,
              ", \"pipeline\": {\"steps\": %llu, \"fetched_bytes\": {\"device\": %llu, \"host\": %llu, "
              "\"disk\": %llu}",
              (unsigned long long)ps.steps, (unsigned long long)ps.bytes[TIER_DEVICE],
              (unsigned long long)ps.bytes[TIER_HOST], (unsigned long long)ps.bytes[TIER_DISK]);
    sb_printf(sb, ", \"compute_s\": %.6f, \"stall_s\": %.6f, \"fetch_s\": %.6f, \"wall_s\": %.6f}", ps.compute_s,
              ps.stall_s, ps.fetch_s, ps.wall_s);
    sb_printf(sb,
              ", \"scheduler\": {\"running\": %d, \"queued\": %d, \"steps\": %llu, \"prompt_tokens\": %llu, "
              "\"generated_tokens\": %llu, \"last_step_s\": %.6f, \"failing_steps\": %d}",
              ss.running, ss.queued, (unsigned long long)ss.steps, (unsigned long long)ss.tokens_prompted,
              (unsigned long long)ss.tokens_generated, ss.last_step_s, ss.failing_steps);
}

static bool answer_status(http_req *rq)
{
    admin_server *a = http_req_ctx(rq);
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\"model\": ");
    sb_json_str(&sb, a->model_name);
    pthread_rwlock_rdlock(&a->lock);
    sb_printf(&sb, ", \"loaded\": %s", a->e ? "true" : "false");
    if (a->e) status_engine_json(&sb, a->e, a->s);
    pthread_rwlock_unlock(&a->lock);
    sb_puts(&sb, ", \"export_dir\": ");
    if (a->export_root) sb_json_str(&sb, a->export_root);
    else sb_puts(&sb, "null");
    /* running first (the newest, J1), then the others newest first */
    pthread_mutex_lock(&a->jobs_mu);
    reap_jobs(a);
    admin_job *run = newest_job(a);
    if (run && !run->job) run = NULL;
    sb_puts(&sb, ", \"jobs\": {\"running\": ");
    if (run) job_json(&sb, run);
    else sb_puts(&sb, "null");
    sb_puts(&sb, ", \"recent\": [");
    int first = a->n_jobs > ADMIN_JOBS_KEPT ? a->n_jobs - ADMIN_JOBS_KEPT : 0, shown = 0;
    for (int k = a->n_jobs - 1; k >= first; k--) {
        admin_job *j = &a->jobs[k % ADMIN_JOBS_KEPT];
        if (j == run) continue;
        if (shown++) sb_puts(&sb, ", ");
        job_json(&sb, j);
    }
    sb_puts(&sb, "]}}");
    pthread_mutex_unlock(&a->jobs_mu);
    return reply(rq, 200, &sb, NULL, NULL);
}

/* ---- POST /admin/v1/export ------------------------------------------------------- */

/* export_opts.on_end: says how job `arg` (its number) ended, when it ends,
 * whether or not anyone polls it. On the job's thread: no lock taken. */
static void log_job_end(void *arg, const export_status *final)
{
    int id = (int)(intptr_t)arg;
    switch (final->state) {
    case EXPORT_DONE:
        fprintf(stderr, "ferry: admin: export %d done (%llu bytes)\n", id, (unsigned long long)final->bytes_written);
        break;
    case EXPORT_FAILED: fprintf(stderr, "ferry: admin: export %d failed: %s\n", id, final->error); break;
    default: fprintf(stderr, "ferry: admin: export %d %s\n", id, export_state_name(final->state)); break;
    }
}

typedef struct {
    export_opts o;
    char msg[256]; /* why the body was refused */
} export_request;

/* Reads the body into r->o (name points into doc). False: r->msg says why. */
static bool export_parse(const json_value *root, export_request *r)
{
    if (!root || root->type != JSON_OBJECT) {
        snprintf(r->msg, sizeof r->msg, "the body must be a JSON object: {\"name\": \"...\", \"layout\": ...}");
        return false;
    }
    r->o.layout = EXPORT_CONVERTED;
    for (size_t i = 0; i < root->len; i++) {
        const json_member *m = &root->members[i];
        const json_value *v = &m->value;
        if (!strcmp(m->key, "name")) {
            if (v->type != JSON_STRING || strlen(v->str) != v->len) {
                snprintf(r->msg, sizeof r->msg, "field 'name' must be a string");
                return false;
            }
            r->o.name = v->str;
        } else if (!strcmp(m->key, "layout")) {
            if (v->type != JSON_STRING || !export_layout_parse(v->str, &r->o.layout)) {
                snprintf(r->msg, sizeof r->msg, "field 'layout' must be \"converted\" or \"original\"");
                return false;
            }
        } else if (!strcmp(m->key, "max_shard_bytes")) {
            if (v->type != JSON_NUMBER || !v->is_int || v->integer < 1) {
                snprintf(r->msg, sizeof r->msg, "field 'max_shard_bytes' must be a positive integer (bytes)");
                return false;
            }
            r->o.max_shard_bytes = (uint64_t)v->integer;
        } else if (!strcmp(m->key, "overwrite")) {
            if (v->type != JSON_BOOL) {
                snprintf(r->msg, sizeof r->msg, "field 'overwrite' must be true or false");
                return false;
            }
            r->o.overwrite = v->boolean;
        } else {
            char shown[48];
            size_t k = 0;
            for (; m->key[k] && k < sizeof shown - 1; k++) /* the message stays ASCII whatever the key holds */
                shown[k] = m->key[k] >= 0x20 && m->key[k] < 0x7f ? m->key[k] : '?';
            shown[k] = '\0';
            snprintf(r->msg, sizeof r->msg,
                     "unknown field '%s' (the fields are name, layout, max_shard_bytes, overwrite)", shown);
            return false;
        }
    }
    if (!r->o.name) {
        snprintf(r->msg, sizeof r->msg, "field 'name' is required");
        return false;
    }
    return true;
}

static int export_http_code(ferry_status st)
{
    switch (st) {
    case FERRY_ERR_INVALID:
    case FERRY_ERR_UNSUPPORTED:
    case FERRY_ERR_NOT_FOUND: return 400;
    case FERRY_ERR_BUSY: return 409;
    case FERRY_ERR_TOO_LARGE: return 507; /* not enough free space under the export root */
    case FERRY_ERR_NOMEM: return 503;
    default: return 500;
    }
}

/* The body is within ADMIN_MAX_BODY (the listener's 413 otherwise). */
static bool answer_export(http_req *rq)
{
    admin_server *a = http_req_ctx(rq);
    if (!a->export_root)
        return reply_error(rq, 400, NULL, NULL, "exports are off: this server was started without --export-dir");
    size_t len;
    const char *body = http_req_body(rq, &len);
    json_doc *doc = NULL;
    if (json_parse_limited(body, len, 16 * (size_t)ADMIN_MAX_BODY, &doc) != FERRY_OK)
        return reply_error(rq, 400, NULL, NULL, "invalid JSON body: %s", ferry_errmsg());
    export_request r = {.o = {.root = a->export_root}};
    if (!export_parse(json_doc_root(doc), &r)) {
        json_doc_free(doc);
        return reply_error(rq, 400, NULL, NULL, "%s", r.msg);
    }

    pthread_rwlock_rdlock(&a->lock);
    if (!a->e || http_req_draining(rq)) { /* stopping: no export starts */
        pthread_rwlock_unlock(&a->lock);
        json_doc_free(doc);
        return reply_error(rq, 503, NULL, NULL, a->e ? "server shutting down" : "model not ready");
    }
    pthread_mutex_lock(&a->jobs_mu);
    reap_jobs(a);
    admin_job *run = newest_job(a);
    if (run && run->job) { /* J1 */
        char loc[64];
        snprintf(loc, sizeof loc, JOBS_PREFIX "%s", run->id);
        pthread_mutex_unlock(&a->jobs_mu);
        pthread_rwlock_unlock(&a->lock);
        json_doc_free(doc);
        return reply_error(rq, 409, "Location", loc,
                           "an export is running (%s); one export at a time", loc);
    }
    export_job *job = NULL;
    /* the id it gets if it starts (ids count the jobs started) */
    r.o.on_end = log_job_end;
    r.o.on_end_arg = (void *)(intptr_t)(a->n_jobs + 1);
    ferry_status st = export_start(a->e, &r.o, &job);
    admin_job *j = NULL;
    if (st == FERRY_OK) {
        j = &a->jobs[a->n_jobs % ADMIN_JOBS_KEPT];
        memset(j, 0, sizeof *j);
        snprintf(j->id, sizeof j->id, "%d", ++a->n_jobs);
        snprintf(j->name, sizeof j->name, "%s", r.o.name);
        j->layout = r.o.layout;
        j->created_unix = (double)time(NULL);
        j->job = job;
    }
    char id[sizeof j->id] = "";
    if (j) snprintf(id, sizeof id, "%s", j->id);
    pthread_mutex_unlock(&a->jobs_mu);
    pthread_rwlock_unlock(&a->lock);
    json_doc_free(doc);
    if (st != FERRY_OK) return reply_error(rq, export_http_code(st), NULL, NULL, "%s", ferry_errmsg());

    char loc[64];
    snprintf(loc, sizeof loc, JOBS_PREFIX "%s", id);
    fprintf(stderr, "ferry: admin: export %s started\n", id);
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\"job\": ");
    sb_json_str(&sb, id);
    sb_puts(&sb, ", \"location\": ");
    sb_json_str(&sb, loc);
    sb_putc(&sb, '}');
    return reply(rq, 202, &sb, "Location", loc);
}

/* ---- GET and DELETE /admin/v1/jobs/{id} ------------------------------------------ */

static bool answer_job(http_req *rq, bool cancel)
{
    admin_server *a = http_req_ctx(rq);
    const char *id = http_req_param(rq);
    pthread_mutex_lock(&a->jobs_mu);
    reap_jobs(a);
    admin_job *j = job_find(a, id);
    if (!j) {
        pthread_mutex_unlock(&a->jobs_mu);
        char shown[32];
        size_t k = 0;
        for (; id[k] && k < sizeof shown - 1; k++) shown[k] = id[k] >= 0x20 && id[k] < 0x7f ? id[k] : '?';
        shown[k] = '\0';
        return reply_error(rq, 404, NULL, NULL, "no job '%s' (the last %d jobs are kept)", shown,
                           ADMIN_JOBS_KEPT);
    }
    int code = 200;
    if (cancel && j->job) {
        /* the job removes its partial output and ends CANCELLED; a job
         * that ends meanwhile keeps its own final state */
        export_job_cancel(j->job);
        reap_jobs(a);
        code = j->job ? 202 : 200;
        fprintf(stderr, "ferry: admin: export %s cancelled\n", j->id);
    }
    strbuf sb;
    sb_init(&sb);
    job_json(&sb, j);
    pthread_mutex_unlock(&a->jobs_mu);
    return reply(rq, code, &sb, NULL, NULL);
}

static bool answer_job_get(http_req *rq) { return answer_job(rq, false); }
static bool answer_job_cancel(http_req *rq) { return answer_job(rq, true); }

/* ---- routes and the head ----------------------------------------------------------- */

static const http_route k_routes[] = {
    HTTP_ROUTE("GET", "/admin/v1/status", ADMIN_LABEL_STATUS, answer_status),
    {"POST", "/admin/v1/export", ADMIN_LABEL_EXPORT, answer_export, NULL, HTTP_BODY, NULL, NULL},
    HTTP_ROUTE("GET", JOBS_PREFIX "*", ADMIN_LABEL_JOB, answer_job_get),
    HTTP_ROUTE("DELETE", JOBS_PREFIX "*", ADMIN_LABEL_JOB, answer_job_cancel),
};

const http_route_table admin_routes = {k_routes, sizeof k_routes / sizeof k_routes[0]};

/* 401 lines logged at most: a burst per window (ferry_admin_auth_failures_total counts every one) */
#define ADMIN_401_LOG_BURST 10
#define ADMIN_401_LOG_WINDOW_S 10

/* Authentication, on every head before its body is read; a refusal is
 * counted, and logged with the peer's address and the reason, never the
 * token. */
static http_refusal on_head(void *ctx, http_req *rq, const char *method, const char *url)
{
    admin_server *a = ctx;
    http_refusal no = {0};
    admin_decision d = admin_route(method, url, http_req_header(rq, "Authorization"), a->token, a->token_len);
    if (d.code != 401) return no; /* let in: the table answers the rest */
    char peer[INET6_ADDRSTRLEN + 16];
    http_req_peer(rq, peer, sizeof peer);
    metrics_count_admin_auth_failure(a->counters);
    /* a client chooses the method and how often: escaped, and at most a
     * burst of lines a window (the counter has them all) */
    static mhd_log_limit limit = MHD_LOG_LIMIT_INIT(ADMIN_401_LOG_BURST, ADMIN_401_LOG_WINDOW_S);
    uint64_t held = 0;
    if (mhd_log_allow(&limit, &held)) {
        char m[48], u[160], more[64] = "";
        if (held) snprintf(more, sizeof more, " (%llu more 401s not logged)", (unsigned long long)held);
        fprintf(stderr, "ferry: admin: 401 for %s %s from %s: %s%s\n", mhd_log_escape(method, m, sizeof m),
                d.ep == AEP_OTHER ? "(other path)" : mhd_log_escape(url, u, sizeof u), peer, d.why, more);
    }
    no.code = 401;
    snprintf(no.buf, sizeof no.buf, "unauthorized: %s (send Authorization: Bearer <token>)", d.why);
    no.msg = no.buf;
    no.header = "WWW-Authenticate";
    no.value = "Bearer realm=\"ferry-admin\"";
    return no;
}

/* ---- server ---------------------------------------------------------------------- */

static void stop(void *self);

ferry_status admin_server_start(const admin_opts *o, admin_server **out)
{
    *out = NULL;
    ferry_status st = admin_token_check(o->token ? o->token : "", "admin");
    if (st != FERRY_OK) return st;
    admin_server *a = calloc(1, sizeof *a);
    if (!a || !(a->model_name = strdup(o->model_name)) ||
        (o->export_root && !(a->export_root = strdup(o->export_root)))) {
        if (a) free(a->model_name);
        free(a);
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    if (a->export_root) export_remove_stale(a->export_root); /* of exports killed with an earlier process */
    a->token_len = strlen(o->token);
    memcpy(a->token, o->token, a->token_len);
    a->counters = o->counters;
    pthread_rwlock_init(&a->lock, NULL);
    pthread_mutex_init(&a->jobs_mu, NULL);
    /* MHD's limit is twice the waiting limit (room for the connections shut
     * down and not yet closed), each with at most one body: never refused */
    int conns = 2 * o->max_connections;
    req_budget_init(&a->bodies, (uint64_t)conns * ADMIN_MAX_BODY);
    static const http_route_table *const tables[] = {&admin_routes};
    http_listener_opts lo = {
        .what = "admin API",
        .log_name = "admin: http",
        .host_flag = "--admin-host",
        .host = o->host,
        .port = o->port,
        .tables = tables,
        .n_tables = 1,
        .other_label = ADMIN_LABEL_OTHER,
        .ctx = a,
        .head = on_head,
        .error_body = error_body,
        .no_store = true,
        .unescape = false, /* the admin paths need no escapes: matched as sent (a "%00" cannot end a job id early) */
        .max_body = ADMIN_MAX_BODY,
        .budget = &a->bodies,
        .request_timeout_s = o->request_timeout_s,
        .connection_timeout_s = ADMIN_CONNECTION_TIMEOUT_S,
        .max_connections = conns,
        .max_waiting = o->max_connections,
        .threads = ADMIN_WORKER_THREADS,
        .counters = o->counters,
    };
    if ((st = http_listener_start(&lo, &a->l)) != FERRY_OK) {
        stop(a);
        return st;
    }
    *out = a;
    return FERRY_OK;
}

int admin_server_port(const admin_server *a) { return http_listener_port(a->l); }

/* ---- the front end's life cycle (frontend.h) ------------------------------------ */

static void attach(void *self, engine *e, sched *sc, const text_model *tm)
{
    (void)tm;
    admin_server *a = self;
    pthread_rwlock_wrlock(&a->lock);
    a->e = e;
    a->s = sc;
    pthread_rwlock_unlock(&a->lock);
}

/* Cancels the running export, if any, and waits for it to end. */
static void jobs_end(admin_server *a)
{
    pthread_mutex_lock(&a->jobs_mu);
    admin_job *j = newest_job(a);
    if (j && j->job) { /* J1: the only one that may run */
        /* a job that has ended (unpolled) said so itself (log_job_end); one
         * still running is cancelled, and says how it ended all the same:
         * it may finish before it sees the request */
        if (!state_ended(export_job_status(j->job).state))
            fprintf(stderr, "ferry: admin: stopping: export %s is running: cancelling it\n", j->id);
        export_job_cancel(j->job);
        j->final = export_job_wait(j->job); /* J2 */
        export_job_free(j->job);
        j->job = NULL;
    }
    pthread_mutex_unlock(&a->jobs_mu);
}

static void quiesce(void *self) { http_listener_quiesce(((admin_server *)self)->l); }

/* An export does not wait for the deadline: it is cancelled at once (its
 * partial output removed), as the requests are short. */
static void drain(void *self, double deadline)
{
    (void)deadline;
    admin_server *a = self;
    quiesce(a);
    jobs_end(a);
}

static void detach(void *self)
{
    admin_server *a = self;
    pthread_rwlock_wrlock(&a->lock);
    a->e = NULL;
    a->s = NULL;
    pthread_rwlock_unlock(&a->lock);
    jobs_end(a); /* one started before the lock was taken */
}

static void stop(void *self)
{
    admin_server *a = self;
    if (!a) return;
    http_listener_stop(a->l); /* no handler runs after this */
    jobs_end(a);
    pthread_mutex_destroy(&a->jobs_mu);
    pthread_rwlock_destroy(&a->lock);
    memset(a->token, 0, sizeof a->token);
    free(a->export_root);
    free(a->model_name);
    free(a);
}

static const frontend_ops k_admin_frontend = {"admin", attach, quiesce, drain, detach, stop};

frontend admin_frontend(admin_server *a) { return (frontend){&k_admin_frontend, a}; }
