/*
 * admin.c - the admin API on libmicrohttpd (MHD). See admin.h.
 *
 * Small and synchronous, unlike http.c: no handler waits on the engine
 * (status reads published figures; an export runs on the job's own thread),
 * so a request is answered within the MHD call that sees its body whole,
 * and a couple of worker threads are enough.
 *
 * A request (struct admin_request) is authenticated when its head arrives:
 * a client without the token is answered 401 before its body is read.
 * Routing and the body's checks come after.
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
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../engine/base/json.h"
#include "../engine/export.h"
#include "../engine/weights/convert.h"
#include "admin_route.h"
#include "mhd_common.h"

#define ADMIN_WORKER_THREADS 2
#define ADMIN_CONNECTION_TIMEOUT_S 30
#define ADMIN_REAP_INTERVAL_US 250000 /* how often the receive deadline is checked */
#define ADMIN_MAX_BODY (64u << 10)
#define ADMIN_JOBS_KEPT 16
#define JOBS_PREFIX ADMIN_JOBS_PREFIX


/* metrics labels, by admin_endpoint */
static const char *const k_aep_name[] = {"admin_status", "admin_export", "admin_job", "admin_other"};

typedef struct {
    char id[24];
    char name[EXPORT_NAME_MAX + 1];
    export_layout layout;
    double created_unix;
    export_job *job;      /* NULL once reaped (J1-J3) */
    export_status final;  /* valid once job is NULL */
} admin_job;

struct admin_server {
    struct MHD_Daemon *d;
    int port;
    char token[ADMIN_TOKEN_MAX]; /* zero-padded: compared over its whole size */
    size_t token_len;
    char *export_root;
    char *model_name;
    metrics *counters;
    bool log;                    /* FERRY_HTTP_LOG: MHD's own messages */
    mhd_conns *conns;            /* open connections: the receive deadline, the waiting limit */
    pthread_t reaper;            /* calls mhd_conns_cut_slow */
    bool reaper_running;
    int reaper_stop;             /* atomic */
    pthread_rwlock_t lock;       /* guards e, s */
    engine *e;
    sched *s;
    pthread_mutex_t jobs_mu;     /* guards jobs, n_jobs */
    admin_job jobs[ADMIN_JOBS_KEPT];
    int n_jobs;                  /* jobs ever started; ids are 1..n_jobs */
    int draining;                /* atomic: stopping; no export starts */
};

typedef struct {
    admin_decision d;    /* made on the head; url (job_id) is MHD's, valid until the request completes */
    bool answered;
    bool too_large;
    char *body;
    size_t len, cap;
} admin_request;

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

static void peer_name(struct MHD_Connection *c, char *out, size_t cap)
{
    snprintf(out, cap, "unknown peer");
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!ci || !ci->client_addr) return;
    const struct sockaddr *sa = ci->client_addr;
    socklen_t len = sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    char host[INET6_ADDRSTRLEN + 8], serv[16];
    if (getnameinfo(sa, len, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) == 0)
        snprintf(out, cap, sa->sa_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, serv);
}

/* ---- answering ------------------------------------------------------------------ */

static enum MHD_Result reply(admin_server *a, admin_request *rq, struct MHD_Connection *c, int code, strbuf *sb,
                             const char *h1, const char *v1)
{
    rq->answered = true;
    if (sb->oom) {
        sb_free(sb);
        sb_puts(sb, "{\"error\": \"out of memory\"}");
        code = 503;
    }
    sb_putc(sb, '\n');
    struct MHD_Response *r = MHD_create_response_from_buffer(sb->len, sb->data ? sb->data : (char *)"",
                                                             sb->data ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        sb_free(sb);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    if (h1) MHD_add_response_header(r, h1, v1);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)code, r);
    MHD_destroy_response(r);
    metrics_count_request(a->counters, k_aep_name[rq->d.ep], code);
    return ret;
}

static enum MHD_Result reply_error(admin_server *a, admin_request *rq, struct MHD_Connection *c, int code,
                                   const char *h1, const char *v1, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

static enum MHD_Result reply_error(admin_server *a, admin_request *rq, struct MHD_Connection *c, int code,
                                   const char *h1, const char *v1, const char *fmt, ...)
{
    char msg[FERRY_MSG_MAX + 128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\"error\": ");
    sb_json_str(&sb, msg);
    sb_putc(&sb, '}');
    return reply(a, rq, c, code, &sb, h1, v1);
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

static enum MHD_Result answer_status(admin_server *a, admin_request *rq, struct MHD_Connection *c)
{
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
    return reply(a, rq, c, 200, &sb, NULL, NULL);
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

static enum MHD_Result answer_export(admin_server *a, admin_request *rq, struct MHD_Connection *c)
{
    if (rq->too_large)
        return reply_error(a, rq, c, 413, NULL, NULL, "request body larger than %u bytes", ADMIN_MAX_BODY);
    if (!a->export_root)
        return reply_error(a, rq, c, 400, NULL, NULL,
                           "exports are off: this server was started without --export-dir");
    json_doc *doc = NULL;
    if (json_parse_limited(rq->body ? rq->body : "", rq->len, 16 * (size_t)ADMIN_MAX_BODY, &doc) != FERRY_OK)
        return reply_error(a, rq, c, 400, NULL, NULL, "invalid JSON body: %s", ferry_errmsg());
    export_request r = {.o = {.root = a->export_root}};
    if (!export_parse(json_doc_root(doc), &r)) {
        json_doc_free(doc);
        return reply_error(a, rq, c, 400, NULL, NULL, "%s", r.msg);
    }

    pthread_rwlock_rdlock(&a->lock);
    if (!a->e || __atomic_load_n(&a->draining, __ATOMIC_RELAXED)) {
        pthread_rwlock_unlock(&a->lock);
        json_doc_free(doc);
        return reply_error(a, rq, c, 503, NULL, NULL, a->e ? "server shutting down" : "model not ready");
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
        return reply_error(a, rq, c, 409, MHD_HTTP_HEADER_LOCATION, loc,
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
    if (st != FERRY_OK) return reply_error(a, rq, c, export_http_code(st), NULL, NULL, "%s", ferry_errmsg());

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
    return reply(a, rq, c, 202, &sb, MHD_HTTP_HEADER_LOCATION, loc);
}

/* ---- GET and DELETE /admin/v1/jobs/{id} ------------------------------------------ */

static enum MHD_Result answer_job(admin_server *a, admin_request *rq, struct MHD_Connection *c, const char *id,
                                  bool cancel)
{
    pthread_mutex_lock(&a->jobs_mu);
    reap_jobs(a);
    admin_job *j = job_find(a, id);
    if (!j) {
        pthread_mutex_unlock(&a->jobs_mu);
        char shown[32];
        size_t k = 0;
        for (; id[k] && k < sizeof shown - 1; k++) shown[k] = id[k] >= 0x20 && id[k] < 0x7f ? id[k] : '?';
        shown[k] = '\0';
        return reply_error(a, rq, c, 404, NULL, NULL, "no job '%s' (the last %d jobs are kept)", shown,
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
    return reply(a, rq, c, code, &sb, NULL, NULL);
}

/* ---- routing and MHD ------------------------------------------------------------- */

static enum MHD_Result dispatch(admin_server *a, admin_request *rq, struct MHD_Connection *c)
{
    const admin_decision *d = &rq->d;
    if (d->code)
        return reply_error(a, rq, c, d->code, d->allow ? MHD_HTTP_HEADER_ALLOW : NULL, d->allow, "%s", d->why);
    switch (d->ep) {
    case AEP_STATUS: return answer_status(a, rq, c);
    case AEP_EXPORT: return answer_export(a, rq, c);
    case AEP_JOB: return answer_job(a, rq, c, d->job_id, d->cancel);
    default: return reply_error(a, rq, c, 404, NULL, NULL, "not found");
    }
}

static void body_append(admin_request *rq, const char *data, size_t n)
{
    if (rq->too_large || rq->d.ep != AEP_EXPORT) return; /* discard */
    if (n > ADMIN_MAX_BODY - rq->len) {
        rq->too_large = true;
        free(rq->body);
        rq->body = NULL;
        rq->len = rq->cap = 0;
        return;
    }
    if (rq->len + n + 1 > rq->cap) {
        size_t cap = rq->len + n + 1 > 1024 ? ADMIN_MAX_BODY + 1 : 1024;
        char *p = realloc(rq->body, cap);
        if (!p) {
            rq->too_large = true; /* answered 413: the body could not be held */
            return;
        }
        rq->body = p;
        rq->cap = cap;
    }
    memcpy(rq->body + rq->len, data, n);
    rq->len += n;
    rq->body[rq->len] = '\0';
}

/* 401 lines logged at most: a burst per window (ferry_admin_auth_failures_total counts every one) */
#define ADMIN_401_LOG_BURST 10
#define ADMIN_401_LOG_WINDOW_S 10

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)version;
    admin_server *a = cls;
    admin_request *rq = *con_cls;
    if (!rq) { /* the head: authenticate before reading any body */
        if (!(rq = calloc(1, sizeof *rq))) return MHD_NO;
        *con_cls = rq;
        rq->d = admin_route(method, url, MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION),
                            a->token, a->token_len);
        const char *why = rq->d.code == 401 ? rq->d.why : NULL;
        if (why) {
            mhd_conns_mark(a->conns, c, false); /* answered: off the receive deadline */
            char peer[INET6_ADDRSTRLEN + 16];
            peer_name(c, peer, sizeof peer);
            metrics_count_admin_auth_failure(a->counters);
            /* a client chooses the method and how often: escaped, and at
             * most a burst of lines a window (the counter has them all) */
            static mhd_log_limit limit = MHD_LOG_LIMIT_INIT(ADMIN_401_LOG_BURST, ADMIN_401_LOG_WINDOW_S);
            uint64_t held = 0;
            if (mhd_log_allow(&limit, &held)) {
                char m[48], u[160], more[64] = "";
                if (held)
                    snprintf(more, sizeof more, " (%llu more 401s not logged)", (unsigned long long)held);
                fprintf(stderr, "ferry: admin: 401 for %s %s from %s: %s%s\n", mhd_log_escape(method, m, sizeof m),
                        rq->d.ep == AEP_OTHER ? "(other path)" : mhd_log_escape(url, u, sizeof u), peer, why, more);
            }
            return reply_error(a, rq, c, 401, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"ferry-admin\"",
                               "unauthorized: %s (send Authorization: Bearer <token>)", why);
        }
        mhd_conns_admit(a->conns, c);
        return MHD_YES;
    }
    if (rq->answered) {
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (*upload_data_size) {
        body_append(rq, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }
    mhd_conns_mark(a->conns, c, false); /* the request is whole */
    return dispatch(a, rq, c);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)toe;
    admin_server *a = cls;
    mhd_conns_mark(a->conns, c, true); /* kept alive: the next head is on the deadline */
    admin_request *rq = *con_cls;
    if (!rq) return;
    *con_cls = NULL;
    free(rq->body);
    free(rq);
}

/* The admin paths need no escapes: they are matched as sent (a "%00"
 * cannot end a job id early). */
static size_t no_unescape(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls, (void)c;
    return strlen(s);
}

static void on_log(void *cls, const char *fmt, va_list ap)
{
    mhd_log(((const admin_server *)cls)->log, "admin: http", fmt, ap);
}

static void *reaper_main(void *arg)
{
    admin_server *a = arg;
    while (!__atomic_load_n(&a->reaper_stop, __ATOMIC_ACQUIRE)) {
        usleep(ADMIN_REAP_INTERVAL_US);
        mhd_conns_cut_slow(a->conns);
    }
    return NULL;
}

/* ---- server ---------------------------------------------------------------------- */

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
    a->log = getenv("FERRY_HTTP_LOG") != NULL;
    pthread_rwlock_init(&a->lock, NULL);
    pthread_mutex_init(&a->jobs_mu, NULL);
    if (!(a->conns = mhd_conns_new(o->request_timeout_s, o->max_connections))) {
        admin_server_stop(a);
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }

    struct addrinfo *ai;
    if ((st = mhd_resolve(o->host, o->port, "--admin-host", &ai)) != FERRY_OK) {
        admin_server_stop(a);
        return st;
    }
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    errno = 0;
    a->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, a,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, a,
                            MHD_OPTION_NOTIFY_CONNECTION, mhd_conns_notify, a->conns,
                            MHD_OPTION_UNESCAPE_CALLBACK, no_unescape, a,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(2 * o->max_connections),
                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)ADMIN_WORKER_THREADS,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)ADMIN_CONNECTION_TIMEOUT_S,
                            MHD_OPTION_EXTERNAL_LOGGER, on_log, a,
                            MHD_OPTION_END);
    int err = errno;
    freeaddrinfo(ai);
    if (!a->d) {
        st = ferry_fail(FERRY_ERR_IO, "admin API: cannot listen on %s port %d%s%s", o->host, o->port, err ? ": " : "",
                        err ? strerror(err) : "");
        admin_server_stop(a);
        return st;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(a->d, MHD_DAEMON_INFO_BIND_PORT);
    a->port = di ? di->port : o->port;
    if (!(a->reaper_running = pthread_create(&a->reaper, NULL, reaper_main, a) == 0)) {
        admin_server_stop(a);
        return ferry_fail(FERRY_ERR_NOMEM, "admin API: cannot start its reaper thread");
    }
    *out = a;
    return FERRY_OK;
}

int admin_server_port(const admin_server *a) { return a->port; }

void admin_server_attach(admin_server *a, engine *e, sched *sc)
{
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

void admin_server_quiesce(admin_server *a) { __atomic_store_n(&a->draining, 1, __ATOMIC_RELAXED); }

/* An export does not wait for the deadline: it is cancelled at once (its
 * partial output removed), as the requests are short. */
void admin_server_drain(admin_server *a, double deadline)
{
    (void)deadline;
    admin_server_quiesce(a);
    jobs_end(a);
}

void admin_server_detach(admin_server *a)
{
    pthread_rwlock_wrlock(&a->lock);
    a->e = NULL;
    a->s = NULL;
    pthread_rwlock_unlock(&a->lock);
    jobs_end(a); /* one started before the lock was taken */
}

void admin_server_stop(admin_server *a)
{
    if (!a) return;
    if (a->reaper_running) {
        __atomic_store_n(&a->reaper_stop, 1, __ATOMIC_RELEASE);
        pthread_join(a->reaper, NULL);
    }
    if (a->d) MHD_stop_daemon(a->d); /* no handler runs after this */
    mhd_conns_free(a->conns);
    jobs_end(a);
    pthread_mutex_destroy(&a->jobs_mu);
    pthread_rwlock_destroy(&a->lock);
    memset(a->token, 0, sizeof a->token);
    free(a->export_root);
    free(a->model_name);
    free(a);
}

/* ---- the front end's life cycle (frontend.h) ------------------------------------ */

static void fe_attach(void *self, engine *e, sched *sc, const text_model *tm)
{
    (void)tm;
    admin_server_attach(self, e, sc);
}
static void fe_quiesce(void *self) { admin_server_quiesce(self); }
static void fe_drain(void *self, double deadline) { admin_server_drain(self, deadline); }
static void fe_detach(void *self) { admin_server_detach(self); }
static void fe_stop(void *self) { admin_server_stop(self); }

static const frontend_ops k_admin_frontend = {"admin", fe_attach, fe_quiesce, fe_drain, fe_detach, fe_stop};

frontend admin_frontend(admin_server *a) { return (frontend){&k_admin_frontend, a}; }
