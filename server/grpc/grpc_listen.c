/*
 * grpc_listen.c - the gRPC front end's own listening socket and accept loop.
 *
 * gRPC core 1.51 takes every connection its listener accepts (a connection
 * limit, GRPC_ARG_MAX_ALLOWED_INCOMING_CONNECTIONS, came in later
 * releases), so ferry does not give core a port: one thread, listen_main,
 * accepts, and hands each connection to the relay (grpc_relay.c, which
 * bounds what 1.51 does not: reset streams, header blocks) and the
 * relay's end of it to core with grpc_server_add_channel_from_fd, which
 * builds the same transport and channel stack (the server's channel args:
 * streams per connection, idle and keepalive) as core's own listener,
 * without its handshake.
 *
 * A connection ferry holds is in one of two states:
 *
 *   WAITING  accepted; its preface (the 24 octets of HTTP/2's magic and the
 *            header of the SETTINGS frame that must follow) has not come.
 *            ferry's: polled with SO_RCVLOWAT at the preface's length, and
 *            closed when --request-timeout passes (core's handshake timeout,
 *            GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, runs only in core's own
 *            listener), or when what came is not HTTP/2's preface
 *   HANDED   given to the relay, which owns the fd and closes it when the
 *            connection ends. listen_main keeps the fd's number and its
 *            socket's inode to see when that happened.
 *
 * Invariants:
 *   L1. n_conns (both states) <= max_conns: at the limit the listening
 *       socket is not polled, and connections wait in its queue.
 *   L2. a HANDED connection counts until fstat(fd) no longer names its
 *       socket: the number may be reused at once, the inode not while the
 *       socket lives. Swept whenever a limit would refuse, and every
 *       SWEEP_MS while at the total limit.
 *   L3. connections from one address <= max_conns_per_ip: past it one is
 *       accepted and closed at once.
 * Only listen_main touches the table; no lock.
 */
#define _GNU_SOURCE
#include "grpc_listen.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../mhd_common.h"
#include "grpc_relay.h"
#include "grpc_thread.h"
#include "h2_frame.h"

#define LISTEN_BACKLOG 512     /* as the HTTP front end's (MHD_OPTION_LISTEN_BACKLOG_SIZE) */
#define SWEEP_MS 200           /* L2: how often a full table looks for ended connections */

enum { PREFACE_LEN = H2_PREFACE_LEN };

typedef grpc_peer peer_addr;

enum conn_state { WAITING, HANDED };

typedef struct {
    int fd;
    enum conn_state state;
    dev_t dev;               /* L2: the socket fstat named at accept */
    ino_t ino;
    peer_addr peer;
    int64_t deadline_ms;     /* WAITING: its preface is due */
} conn;

enum log_kind { LOG_PER_IP, LOG_FULL, LOG_ACCEPT, LOG_RELAY, LOG_KINDS };

struct grpc_listener {
    int fd;                  /* listening socket */
    int wake;                /* eventfd: grpc_listener_stop */
    int port;
    grpc_listen_opts o;
    grpc_server *server;
    grpc_relay *relay;
    grpc_server_credentials *creds;
    pthread_t thread;
    bool running;

    conn *conns;             /* [n_conns] WAITING and HANDED, any order */
    int n_conns, cap;
    int64_t paused_until_ms; /* accept failed for want of fds: try again then */
    grpc_ratelog log[LOG_KINDS]; /* per kind of log line (enum log_kind): a flood of refused connections
                              * must not become a flood of lines */
};


/* ---- the table of connections ----------------------------------------------- */

static peer_addr peer_of(const struct sockaddr_storage *ss)
{
    peer_addr p = {0};
    if (ss->ss_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a)) { /* a dual-stack socket's IPv4 client is that client */
            p.family = AF_INET;
            memcpy(p.a, a->s6_addr + 12, 4);
        } else {
            p.family = AF_INET6;
            memcpy(p.a, a->s6_addr, 16);
        }
    } else {
        p.family = AF_INET;
        memcpy(p.a, &((const struct sockaddr_in *)ss)->sin_addr, 4);
    }
    return p;
}

static const char *peer_str(const peer_addr *p, char *buf, size_t cap)
{
    if (!inet_ntop(p->family, p->a, buf, (socklen_t)cap)) snprintf(buf, cap, "?");
    return buf;
}

static bool peer_eq(const peer_addr *x, const peer_addr *y)
{
    return x->family == y->family && memcmp(x->a, y->a, x->family == AF_INET ? 4 : 16) == 0;
}

/* L2: is c still open? A WAITING one is ours, and open. */
static bool conn_alive(const conn *c)
{
    if (c->state == WAITING) return true;
    struct stat st;
    return fstat(c->fd, &st) == 0 && st.st_ino == c->ino && st.st_dev == c->dev;
}

static void conn_remove(grpc_listener *l, int i)
{
    l->conns[i] = l->conns[--l->n_conns];
}

/* Drops the ended connections (all, or those of one address); returns how
 * many of that address are left (all: n_conns). */
static int sweep(grpc_listener *l, const peer_addr *only)
{
    int left = 0;
    for (int i = 0; i < l->n_conns;) {
        conn *c = &l->conns[i];
        if (only && !peer_eq(&c->peer, only)) {
            i++;
            continue;
        }
        if (!conn_alive(c)) {
            conn_remove(l, i);
            continue;
        }
        left++;
        i++;
    }
    return left;
}

/* Room in the table for one more (it grows up to max_conns, L1). */
static bool conn_room(grpc_listener *l)
{
    if (l->n_conns < l->cap) return true;
    int cap = l->cap ? l->cap * 2 : 64;
    if (cap > l->o.max_conns) cap = l->o.max_conns;
    conn *n = cap > l->cap ? realloc(l->conns, (size_t)cap * sizeof *n) : NULL;
    if (!n) return false;
    l->conns = n;
    l->cap = cap;
    return true;
}

static int count_from(const grpc_listener *l, const peer_addr *p)
{
    int n = 0;
    for (int i = 0; i < l->n_conns; i++) n += peer_eq(&l->conns[i].peer, p);
    return n;
}

/* ---- accepting and handing over --------------------------------------------- */

static void set_int_opt(int fd, int level, int name, int v) { (void)setsockopt(fd, level, name, &v, sizeof v); }

static void accept_one(grpc_listener *l, int fd, const struct sockaddr_storage *ss)
{
    peer_addr p = peer_of(ss);
    if (count_from(l, &p) >= l->o.max_conns_per_ip && sweep(l, &p) >= l->o.max_conns_per_ip) { /* L3 */
        char a[INET6_ADDRSTRLEN];
        grpc_ratelog_note(&l->log[LOG_PER_IP],
                          "refused a connection from %s: %d open from that address (--max-connections-per-ip)",
                          peer_str(&p, a, sizeof a), l->o.max_conns_per_ip);
        close(fd);
        return;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !conn_room(l)) {
        close(fd);
        return;
    }
    /* what core's listener sets on the sockets it accepts */
    set_int_opt(fd, IPPROTO_TCP, TCP_NODELAY, 1);
    if (l->o.user_timeout_ms > 0) set_int_opt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, l->o.user_timeout_ms);
    /* poll says readable once the whole preface is there (or at EOF) */
    set_int_opt(fd, SOL_SOCKET, SO_RCVLOWAT, PREFACE_LEN);
    l->conns[l->n_conns++] = (conn){.fd = fd, .state = WAITING, .dev = st.st_dev, .ino = st.st_ino, .peer = p,
                                    .deadline_ms = grpc_now_ms() + (int64_t)l->o.preface_timeout_s * 1000};
}

/* Accepts what the queue holds, while there is room (L1), at most
 * ACCEPT_ROUND at a time: connections refused at once (per address) take no
 * room, and a flood of them must not keep the loop from the connections
 * waiting for their preface and from the stop signal. */
#define ACCEPT_ROUND 64

static void accept_all(grpc_listener *l)
{
    for (int k = 0; k < ACCEPT_ROUND && l->n_conns < l->o.max_conns; k++) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        int fd = accept4(l->fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            accept_one(l, fd, &ss);
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            /* the connection stays queued; polling the socket now would spin */
            grpc_ratelog_note(&l->log[LOG_ACCEPT], "cannot accept a connection: %s", strerror(errno));
            l->paused_until_ms = grpc_now_ms() + SWEEP_MS;
        }
        return; /* EAGAIN, or the socket is closing */
    }
}

/* A WAITING connection that poll says is readable (or ended): hand it to
 * core once its preface is all there, or close it. */
static void preface_check(grpc_listener *l, int i, short revents)
{
    conn *c = &l->conns[i];
    uint8_t buf[PREFACE_LEN];
    ssize_t n = recv(c->fd, buf, sizeof buf, MSG_PEEK);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    enum h2_preface pf = n > 0 ? h2_preface_check(buf, (size_t)n) : H2_PREFACE_MORE;
    if (pf == H2_PREFACE_BAD) { /* not HTTP/2 with prior knowledge: core would close it too */
        close(c->fd);
        conn_remove(l, i);
        return;
    }
    if (pf == H2_PREFACE_OK) {
        set_int_opt(c->fd, SOL_SOCKET, SO_RCVLOWAT, 1); /* the relay's reads want every byte */
        int core_fd;
        if (grpc_relay_add(l->relay, c->fd, &c->peer, &core_fd) != FERRY_OK) {
            grpc_ratelog_note(&l->log[LOG_RELAY], "cannot relay a connection: %s", ferry_errmsg());
            close(c->fd);
            conn_remove(l, i);
            return;
        }
        c->state = HANDED; /* the relay owns the fd now, core the other end */
        grpc_server_add_channel_from_fd(l->server, core_fd, l->creds);
        return;
    }
    if (n <= 0 || (revents & (POLLRDHUP | POLLHUP | POLLERR))) { /* ended before its preface */
        close(c->fd);
        conn_remove(l, i);
    }
}

static void *listen_main(void *arg)
{
    grpc_listener *l = arg;
    struct pollfd *pfd = NULL;
    int *who = NULL; /* pfd[k] is conns[who[k]] from k = 2 */
    int pcap = 0;
    for (;;) {
        int64_t t = grpc_now_ms();
        bool full = l->n_conns >= l->o.max_conns;
        if (full) {
            sweep(l, NULL);
            if ((full = l->n_conns >= l->o.max_conns))
                grpc_ratelog_note(&l->log[LOG_FULL],
                                  "%d connections open (--max-connections): more wait in the listen queue",
                                  l->o.max_conns);
        }
        if (pcap < l->n_conns + 2) {
            int cap = l->n_conns + 66;
            struct pollfd *pgrown = realloc(pfd, (size_t)cap * sizeof *pgrown);
            if (pgrown) pfd = pgrown;
            int *wgrown = realloc(who, (size_t)cap * sizeof *wgrown);
            if (wgrown) who = wgrown;
            if (!pgrown || !wgrown) { /* keep serving what is held; try again shortly */
                poll(NULL, 0, SWEEP_MS);
                continue;
            }
            pcap = cap;
        }
        bool accepting = !full && t >= l->paused_until_ms;
        pfd[0] = (struct pollfd){.fd = l->wake, .events = POLLIN};
        pfd[1] = (struct pollfd){.fd = accepting ? l->fd : -1, .events = POLLIN};
        int np = 2;
        int64_t next = full || !accepting ? t + SWEEP_MS : INT64_MAX;
        for (int i = 0; i < l->n_conns; i++) {
            if (l->conns[i].state != WAITING) continue;
            pfd[np] = (struct pollfd){.fd = l->conns[i].fd, .events = POLLIN | POLLRDHUP};
            who[np++] = i;
            if (l->conns[i].deadline_ms < next) next = l->conns[i].deadline_ms;
        }
        int wait = next == INT64_MAX ? -1 : next <= t ? 0 : (int)(next - t);
        int r = poll(pfd, (nfds_t)np, wait);
        if (r < 0 && errno != EINTR) { /* ENOMEM: what is held stays core's; try again shortly */
            grpc_ratelog_note(&l->log[LOG_ACCEPT], "poll: %s", strerror(errno));
            poll(NULL, 0, SWEEP_MS);
            continue;
        }
        if (r > 0 && pfd[0].revents) break; /* grpc_listener_stop */
        /* from the end: conn_remove moves the last entry into the hole */
        t = grpc_now_ms();
        for (int k = np - 1; k >= 2; k--) {
            int i = who[k];
            if (pfd[k].revents) preface_check(l, i, pfd[k].revents);
            else if (l->conns[i].deadline_ms <= t) { /* no preface within --request-timeout */
                close(l->conns[i].fd);
                conn_remove(l, i);
            }
        }
        if (r > 0 && pfd[1].revents) accept_all(l);
    }
    free(pfd);
    free(who);
    return NULL;
}

/* ---- open, start, stop ---------------------------------------------------------- */

/* A listening socket on sa, or -1 with errno set. */
static int listen_on(const struct sockaddr *sa, socklen_t len)
{
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    set_int_opt(fd, SOL_SOCKET, SO_REUSEADDR, 1);
    if (sa->sa_family == AF_INET6) set_int_opt(fd, IPPROTO_IPV6, IPV6_V6ONLY, 0); /* [::] takes IPv4 too */
    if (bind(fd, sa, len) != 0 || listen(fd, LISTEN_BACKLOG) != 0) {
        int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

ferry_status grpc_listener_open(const grpc_listen_opts *o, grpc_listener **out)
{
    *out = NULL;
    struct addrinfo *ai;
    ferry_status st = mhd_resolve(o->host, o->port, "--host", &ai); /* the address as the HTTP front end binds it */
    if (st != FERRY_OK) return st;
    grpc_listener *l = calloc(1, sizeof *l);
    if (!l) {
        freeaddrinfo(ai);
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    l->o = *o;
    l->wake = -1;
    char addr[300];
    bool v6 = ai->ai_family == AF_INET6;
    snprintf(addr, sizeof addr, "%s%s%s:%d", v6 ? "[" : "", o->host, v6 ? "]" : "", o->port);
    int err = 0;
    l->fd = -1;
    /* 0.0.0.0: [::] where there is IPv6, as core's own listener binds a
     * wildcard, so that IPv6 clients keep the gRPC port they had */
    const struct sockaddr_in *sin = (const struct sockaddr_in *)ai->ai_addr;
    if (ai->ai_family == AF_INET && sin->sin_addr.s_addr == htonl(INADDR_ANY)) {
        struct sockaddr_in6 any6 = {.sin6_family = AF_INET6, .sin6_port = sin->sin_port, .sin6_addr = in6addr_any};
        if ((l->fd = listen_on((const struct sockaddr *)&any6, sizeof any6)) < 0 && errno != EAFNOSUPPORT) err = errno;
    }
    if (l->fd < 0 && !err && (l->fd = listen_on(ai->ai_addr, ai->ai_addrlen)) < 0) err = errno;
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (!err && getsockname(l->fd, (struct sockaddr *)&ss, &len) != 0) err = errno;
    if (!err && (l->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) err = errno;
    if (err) {
        if (l->fd >= 0) close(l->fd);
        if (l->wake >= 0) close(l->wake);
        free(l);
        return ferry_fail(FERRY_ERR_IO, "grpc: cannot listen on %s: %s", addr, strerror(err));
    }
    l->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
    *out = l;
    return FERRY_OK;
}

int grpc_listener_port(const grpc_listener *l) { return l->port; }

ferry_status grpc_listener_start(grpc_listener *l, grpc_server *server, grpc_relay *relay)
{
    l->server = server;
    l->relay = relay;
    l->creds = grpc_insecure_server_credentials_create();
    if (pthread_create(&l->thread, NULL, listen_main, l) != 0)
        return ferry_fail(FERRY_ERR_IO, "grpc: cannot start the accepting thread");
    l->running = true;
    return FERRY_OK;
}

void grpc_listener_stop(grpc_listener *l)
{
    if (!l) return;
    if (l->running) grpc_thread_stop(l->wake, l->thread);
    close(l->fd);
    close(l->wake);
    for (int i = 0; i < l->n_conns; i++)
        if (l->conns[i].state == WAITING) close(l->conns[i].fd);
    if (l->creds) grpc_server_credentials_release(l->creds);
    free(l->conns);
    free(l);
}
