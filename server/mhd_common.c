/*
 * mhd_common.c - libmicrohttpd helpers of the HTTP listener and others; see
 * mhd_common.h.
 */
#include "mhd_common.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "../engine/base/util.h"

ferry_status mhd_resolve(const char *host, int port, const char *flag, struct addrinfo **ai)
{
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    struct addrinfo hints = {0};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    *ai = NULL;
    int gai = getaddrinfo(host, p, &hints, ai);
    if (gai != 0) return ferry_fail(FERRY_ERR_INVALID, "%s %s: %s", flag, host, gai_strerror(gai));
    return FERRY_OK;
}

void mhd_log(bool on, const char *who, const char *fmt, va_list ap)
{
    if (!on) return;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = '\0';
    fprintf(stderr, "ferry: %s: %s\n", who, msg);
}

/* ---- open connections ------------------------------------------------------------ */

typedef struct conn_track {
    struct conn_track *prev, *next;
    int fd;
    double since;   /* when the current request's head started (accept, or the last answer) */
    bool receiving; /* its head or body is still arriving */
    bool admitted;  /* a request of it was let in */
    bool cut;       /* shut down: MHD closes it at its next look */
    uint64_t url_bytes; /* mhd_conns_set_url_bytes; the connection's MHD thread only */
} conn_track;

struct mhd_conns {
    pthread_mutex_t mu; /* guards the list and every track on it */
    conn_track *list;
    int deadline_s;
    int max_waiting;
};

mhd_conns *mhd_conns_new(int deadline_s, int max_waiting)
{
    mhd_conns *cs = calloc(1, sizeof *cs);
    if (!cs) return NULL;
    pthread_mutex_init(&cs->mu, NULL);
    cs->deadline_s = deadline_s;
    cs->max_waiting = max_waiting;
    return cs;
}

/* After the daemon stopped: MHD has closed (and notified) every connection. */
void mhd_conns_free(mhd_conns *cs)
{
    if (!cs) return;
    pthread_mutex_destroy(&cs->mu);
    free(cs);
}

static void conn_cut(conn_track *t)
{
    t->cut = true;
    shutdown(t->fd, SHUT_RDWR);
}

/* The waiting limit, as t opens. cs->mu held. */
static void make_room(mhd_conns *cs, conn_track *t)
{
    int waiting = 0;
    conn_track *victim = NULL;
    for (conn_track *o = cs->list; o; o = o->next) {
        if (o == t || o->cut || !o->receiving) continue;
        waiting++;
        if (!victim || (victim->admitted && !o->admitted) ||
            (victim->admitted == o->admitted && o->since < victim->since))
            victim = o;
    }
    if (waiting < cs->max_waiting) return;
    conn_cut(victim ? victim : t);
}

void mhd_conns_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                      enum MHD_ConnectionNotificationCode toe)
{
    mhd_conns *cs = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        conn_track *t = calloc(1, sizeof *t);
        if (!t || !ci) {
            free(t);
            return; /* untracked: it only misses the deadline */
        }
        *t = (conn_track){.fd = ci->connect_fd, .since = util_now(), .receiving = true};
        pthread_mutex_lock(&cs->mu);
        t->next = cs->list;
        if (cs->list) cs->list->prev = t;
        cs->list = t;
        if (cs->max_waiting > 0) make_room(cs, t);
        pthread_mutex_unlock(&cs->mu);
        *socket_context = t;
        return;
    }
    /* CLOSED: MHD notifies before it closes the socket, so while a track is
     * listed (under mu) its fd is this connection's */
    conn_track *t = *socket_context;
    if (!t) return;
    pthread_mutex_lock(&cs->mu);
    if (t->prev) t->prev->next = t->next;
    else cs->list = t->next;
    if (t->next) t->next->prev = t->prev;
    pthread_mutex_unlock(&cs->mu);
    free(t);
    *socket_context = NULL;
}

static conn_track *track_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

void mhd_conns_mark(mhd_conns *cs, struct MHD_Connection *c, bool receiving)
{
    conn_track *t = track_of(c);
    if (!t) return;
    pthread_mutex_lock(&cs->mu);
    t->receiving = receiving;
    t->since = util_now();
    pthread_mutex_unlock(&cs->mu);
}

void mhd_conns_admit(mhd_conns *cs, struct MHD_Connection *c)
{
    conn_track *t = track_of(c);
    if (!t) return;
    pthread_mutex_lock(&cs->mu);
    t->admitted = true;
    pthread_mutex_unlock(&cs->mu);
}

void mhd_conns_set_url_bytes(mhd_conns *cs, struct MHD_Connection *c, uint64_t n)
{
    (void)cs;
    conn_track *t = track_of(c);
    if (t) t->url_bytes = n;
}

uint64_t mhd_conns_url_bytes(struct MHD_Connection *c, uint64_t otherwise)
{
    const conn_track *t = track_of(c);
    return t ? t->url_bytes : otherwise;
}

/* Has the client of a connection still receiving its request closed its
 * side? Only an end of stream with nothing left unread says so (a peek
 * returns 0): the request can then never complete. */
static bool sender_closed(int fd)
{
    char b;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

int mhd_conns_cut_slow(mhd_conns *cs)
{
    double now = util_now();
    int n = 0;
    pthread_mutex_lock(&cs->mu);
    for (conn_track *t = cs->list; t; t = t->next)
        if (t->receiving && !t->cut && (now - t->since > cs->deadline_s || sender_closed(t->fd))) {
            conn_cut(t);
            n++;
        }
    pthread_mutex_unlock(&cs->mu);
    return n;
}

bool mhd_answer_raw(struct MHD_Connection *c, unsigned code, const char *type, const char *body, size_t len)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    const char *reason = MHD_get_reason_phrase_for(code);
    char head[256];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %u %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", code,
                     reason && *reason ? reason : "Error", type, len);
    if (n < 0 || (size_t)n >= sizeof head) return false;
    struct iovec iov[2] = {{head, (size_t)n}, {(void *)body, len}};
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = 2};
    /* a few hundred bytes into a send buffer nothing else wrote to: one call */
    ssize_t w = sendmsg(ci->connect_fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    shutdown(ci->connect_fd, SHUT_WR);
    return w == (ssize_t)((size_t)n + len);
}

const char *mhd_log_escape(const char *s, char *out, size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    if (cap == 0) return out;
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        bool plain = *p >= 0x20 && *p < 0x7f && *p != '\\';
        size_t need = plain ? 1 : 4;
        if (o + need + 4 > cap) { /* room for "..." and the NUL */
            memcpy(out + o, "...", 3);
            o += 3;
            break;
        }
        if (plain) {
            out[o++] = (char)*p;
        } else {
            out[o++] = '\\';
            out[o++] = 'x';
            out[o++] = hex[*p >> 4];
            out[o++] = hex[*p & 15];
        }
    }
    out[o] = '\0';
    return out;
}

static pthread_mutex_t log_limit_mu = PTHREAD_MUTEX_INITIALIZER;

bool mhd_log_allow(mhd_log_limit *l, uint64_t *held_back)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    pthread_mutex_lock(&log_limit_mu);
    if (ts.tv_sec - l->window_start >= l->window_s) {
        l->window_start = ts.tv_sec;
        l->in_window = 0;
    }
    bool ok = l->in_window < l->burst;
    if (ok) {
        l->in_window++;
        *held_back = l->held_back;
        l->held_back = 0;
    } else {
        l->held_back++;
    }
    pthread_mutex_unlock(&log_limit_mu);
    return ok;
}
