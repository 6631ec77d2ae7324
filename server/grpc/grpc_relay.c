/*
 * grpc_relay.c - ferry between each gRPC client and gRPC core.
 *
 * Why: Debian's gRPC core is 1.51.1. It has no bound on reset streams
 * (HTTP/2 rapid reset, CVE-2023-44487: the streams a client opens and
 * resets at once are never "open", so SETTINGS_MAX_CONCURRENT_STREAMS does
 * not count them) nor on a header block's CONTINUATION frames, and no
 * channel argument adds either; later core releases do. Building a newer
 * core in `make deps` would outlast a fresh clone's CI budget (20 minutes
 * on 2 cores). ferry already accepts every connection itself
 * (grpc_listen.c); here it stays between the client and core for the
 * connection's life, reading the 9-octet frame headers the client sends
 * (never their payloads) and ending the connection with GOAWAY
 * ENHANCE_YOUR_CALM when h2_frame.h's guard says so. Core gets one end of
 * a socketpair instead of the client's socket.
 *
 * One thread, one epoll set. A connection has two ends (client, core) and
 * two directions: UP (client -> core) and DOWN (core -> client). A
 * direction reads into the thread's scratch buffer and writes on at once;
 * what the other end does not take waits in the direction's pend
 * (allocated then, freed once written). DOWN's frame boundaries are
 * tracked too, so that ferry's GOAWAY lands between core's frames.
 *
 * A connection is
 *   OPEN     relaying both ways;
 *   CLOSING  after the guard's verdict: core's end is closed (core ends the
 *            connection's streams and frees them), what core wrote up to a
 *            frame boundary and then GOAWAY go to the client, its write side
 *            is shut, and what it still sends is read and dropped until it
 *            closes or RELAY_LINGER_MS pass (closing with unread input
 *            would send a reset that can overtake the GOAWAY).
 * It ends (both sockets closed, freed) when core's end has closed and what
 * core wrote has been written, on an error of either socket, when the
 * client hangs up, or when CLOSING's linger is over.
 *
 * Invariants:
 *   Y1. a direction holding pend reads no more: a connection holds at most
 *       2 x RELAY_CHUNK + a GOAWAY, none while idle.
 *   Y2. only octets the guard passed reach core (h2_frame.h G2).
 *   Y3. a GOAWAY follows only a frame boundary of core's stream; when the
 *       client has part of a frame already, the connection closes without.
 *   Y4. a connection is the relay thread's once its client end is in the
 *       epoll set; the list (conns, prev, next) is changed and scanned
 *       under mu, which grpc_relay_add's insert holds too.
 *   Y5. a connection ended within one epoll_wait batch is only marked dead
 *       and freed after the batch: a later event of the batch may name it.
 *   Y6. the connections of one client address count their resets in one
 *       bucket (a client that opens connection after connection gets no
 *       fresh bucket with each). An address's entry stays while it has
 *       connections or its bucket is not yet full again (a full one is as
 *       good as new), at most RELAY_MAX_PEERS of them; past that a
 *       connection keeps a bucket of its own. Only the relay thread
 *       touches the table.
 */
#define _GNU_SOURCE
#include "grpc_relay.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "grpc_thread.h"

#define RELAY_CHUNK (64 * 1024) /* one read; the most a direction holds (Y1) */
#define RELAY_ROUNDS 4          /* reads per direction per wake: a busy connection leaves room for others */
#define RELAY_LINGER_MS 1000    /* CLOSING: how long the client's input is drained */
#define RELAY_PEER_CHAINS 1024  /* the table of client addresses: hash chains */
#define RELAY_MAX_PEERS 65536   /* and its most entries (Y6) */

enum { UP, DOWN };              /* directions */
enum { CLIENT, CORE };          /* ends */

typedef struct relay_conn relay_conn;

/* A client address's reset bucket, shared by its connections (Y6). */
typedef struct relay_peer {
    grpc_peer addr;
    h2_bucket resets;
    int conns;                  /* its connections relayed now */
    struct relay_peer *next;    /* in its hash chain */
} relay_peer;

typedef struct {
    relay_conn *c;
    uint32_t events;            /* what epoll watches for now */
} relay_end;

typedef struct {
    uint8_t *pend;              /* [RELAY_CHUNK + H2_GOAWAY_LEN]: read, not yet written (Y1) */
    size_t off, len;
    bool eof;                   /* its source ended */
} relay_dir;

struct relay_conn {
    int fd[2];                  /* [CLIENT], [CORE]; -1 once closed */
    relay_end end[2];
    relay_dir dir[2];           /* [UP], [DOWN] */
    h2_guard guard;             /* UP's frames */
    grpc_peer addr;
    relay_peer *peer;           /* NULL until its first event; then its address's bucket (or none: Y6) */
    bool peer_bound;
    h2_frames down;             /* DOWN's frame boundaries */
    uint64_t down_written;      /* octets of DOWN the client took */
    bool closing, core_shut, client_shut, dead;
    bool core_gone;             /* core's end hung up: off the epoll set, read as the client takes it */
    int64_t linger_until_ms;
    relay_conn *prev, *next;
    relay_conn *expired;        /* relay_main's list of lingers that are over */
};

struct grpc_relay {
    int ep, wake;
    pthread_t thread;
    bool running;
    h2_limits lim;
    pthread_mutex_t mu;         /* Y4 */
    relay_conn *conns;
    relay_conn *dead;           /* Y5: ended in this batch, via next */
    relay_peer *peers[RELAY_PEER_CHAINS]; /* Y6 */
    int n_peers;
    int n_closing;
    grpc_ratelog log;           /* the connections closed */
    uint8_t scratch[RELAY_CHUNK];
};

/* ---- a connection's life ---------------------------------------------------------- */

static uint32_t end_wants(const relay_conn *c, int side)
{
    uint32_t ev = 0;
    if (side == CLIENT) {
        if (!c->dir[UP].len && !c->dir[UP].eof) ev |= EPOLLIN; /* Y1; CLOSING: drained */
        if (c->dir[DOWN].len) ev |= EPOLLOUT;
    } else {
        if (!c->dir[DOWN].len && !c->dir[DOWN].eof) ev |= EPOLLIN;
        if (c->dir[UP].len) ev |= EPOLLOUT;
    }
    return ev;
}

static void rearm(grpc_relay *r, relay_conn *c)
{
    for (int s = CLIENT; s <= CORE; s++) {
        uint32_t ev = end_wants(c, s);
        if (c->fd[s] < 0 || (s == CORE && c->core_gone) || ev == c->end[s].events) continue;
        struct epoll_event e = {.events = ev, .data.ptr = &c->end[s]};
        if (epoll_ctl(r->ep, EPOLL_CTL_MOD, c->fd[s], &e) == 0) c->end[s].events = ev;
    }
}

static void close_end(relay_conn *c, int side)
{
    if (c->fd[side] >= 0) close(c->fd[side]); /* and out of the epoll set */
    c->fd[side] = -1;
}

/* ---- client addresses (Y6) ---------------------------------------------------------- */

static unsigned peer_hash(const grpc_peer *a)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    const uint8_t *p = (const uint8_t *)a;
    for (size_t i = 0; i < sizeof *a; i++) h = (h ^ p[i]) * 16777619u;
    return h % RELAY_PEER_CHAINS;
}

/* Drops the entries of chain k that hold nothing: no connection, a full
 * bucket (all of them, full or not, with `all`). */
static void peer_sweep(grpc_relay *r, unsigned k, int64_t now, bool all)
{
    for (relay_peer **pp = &r->peers[k]; *pp;) {
        relay_peer *p = *pp;
        if (p->conns == 0 && (all || h2_bucket_full(&p->resets, r->lim.resets_per_s, now))) {
            *pp = p->next;
            free(p);
            r->n_peers--;
        } else pp = &p->next;
    }
}

/* c's resets go to its address's bucket from now on (Y6). */
static void peer_bind(grpc_relay *r, relay_conn *c)
{
    c->peer_bound = true;
    int64_t now = grpc_now_ms();
    unsigned k = peer_hash(&c->addr);
    peer_sweep(r, k, now, false);
    relay_peer *p = r->peers[k];
    while (p && memcmp(&p->addr, &c->addr, sizeof p->addr) != 0) p = p->next;
    if (!p) {
        if (r->n_peers >= RELAY_MAX_PEERS)
            for (unsigned j = 0; j < RELAY_PEER_CHAINS; j++) peer_sweep(r, j, now, true);
        if (r->n_peers >= RELAY_MAX_PEERS || !(p = calloc(1, sizeof *p))) return; /* a bucket of its own */
        p->addr = c->addr;
        h2_bucket_init(&p->resets, r->lim.resets_per_s, now);
        p->next = r->peers[k];
        r->peers[k] = p;
        r->n_peers++;
    }
    p->conns++;
    c->peer = p;
    h2_guard_share_resets(&c->guard, &p->resets);
}

/* ---- a connection's end ----------------------------------------------------------- */

static void list_unlink(grpc_relay *r, relay_conn *c)
{
    pthread_mutex_lock(&r->mu); /* Y4 */
    if (c->prev) c->prev->next = c->next;
    else r->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    pthread_mutex_unlock(&r->mu);
}

/* Ends c now; freed after the batch (Y5). */
static void conn_end(grpc_relay *r, relay_conn *c)
{
    if (c->dead) return;
    close_end(c, CLIENT);
    close_end(c, CORE);
    if (c->closing) r->n_closing--;
    if (c->peer) c->peer->conns--; /* its entry goes when its bucket is full again (Y6) */
    c->dead = true;
    list_unlink(r, c);
    c->next = r->dead;
    r->dead = c;
}

static void conn_free(relay_conn *c)
{
    free(c->dir[UP].pend);
    free(c->dir[DOWN].pend);
    free(c);
}

static void peer_str(int fd, char *buf, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    snprintf(buf, cap, "?");
    if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0) return;
    if (ss.ss_family == AF_INET6) inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, buf, (socklen_t)cap);
    else if (ss.ss_family == AF_INET) inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, buf, (socklen_t)cap);
}

/* ---- moving octets ---------------------------------------------------------------- */

static int dir_dest(const relay_conn *c, int d) { return c->fd[d == UP ? CORE : CLIENT]; }

/* Writes what d holds; false on a write error. */
static bool dir_flush(relay_conn *c, int d)
{
    relay_dir *x = &c->dir[d];
    while (x->len) {
        ssize_t k = send(dir_dest(c, d), x->pend + x->off, x->len, MSG_NOSIGNAL);
        if (k < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
        x->off += (size_t)k;
        x->len -= (size_t)k;
        if (d == DOWN) c->down_written += (uint64_t)k;
    }
    free(x->pend);
    x->pend = NULL;
    x->off = 0;
    return true;
}

/* Writes p on, holding what the destination does not take (Y1); false on
 * a write error or for want of memory. */
static bool dir_forward(relay_conn *c, int d, const uint8_t *p, size_t n)
{
    ssize_t k = send(dir_dest(c, d), p, n, MSG_NOSIGNAL);
    if (k < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
        k = 0;
    }
    if (d == DOWN) c->down_written += (uint64_t)k;
    if ((size_t)k == n) return true;
    relay_dir *x = &c->dir[d];
    if (!x->pend && !(x->pend = malloc(RELAY_CHUNK + H2_GOAWAY_LEN))) return false;
    x->off = 0;
    x->len = n - (size_t)k;
    memcpy(x->pend, p + k, x->len);
    return true;
}

/* The guard's verdict: CLOSING (see the top of the file). */
static void conn_refuse(grpc_relay *r, relay_conn *c, enum h2_verdict v)
{
    char a[INET6_ADDRSTRLEN];
    peer_str(c->fd[CLIENT], a, sizeof a);
    grpc_ratelog_note(&r->log, "closed a connection from %s with GOAWAY ENHANCE_YOUR_CALM: %s", a, h2_verdict_str(v));
    c->closing = true;
    r->n_closing++;
    c->linger_until_ms = grpc_now_ms() + RELAY_LINGER_MS;
    free(c->dir[UP].pend);
    c->dir[UP] = (relay_dir){0};
    close_end(c, CORE); /* core ends the connection's streams */
    relay_dir *x = &c->dir[DOWN];
    x->eof = true;
    uint64_t b = h2_frames_boundary(&c->down);
    if (b < c->down_written) { /* Y3: the client has part of a frame */
        c->linger_until_ms = 0;
        return;
    }
    if (!x->pend && !(x->pend = malloc(RELAY_CHUNK + H2_GOAWAY_LEN))) {
        c->linger_until_ms = 0;
        return;
    }
    if (!x->len) x->off = 0;
    x->len = (size_t)(b - c->down_written); /* <= what it held: b is at most what was read */
    h2_goaway(x->pend + x->off + x->len, c->guard.last_stream, H2_ENHANCE_YOUR_CALM);
    x->len += H2_GOAWAY_LEN;
}

/* Moves what d's source has to its destination (after what d holds);
 * false when c ended. */
static bool dir_pump(grpc_relay *r, relay_conn *c, int d)
{
    relay_dir *x = &c->dir[d];
    if (!dir_flush(c, d)) {
        conn_end(r, c);
        return false;
    }
    int src = c->fd[d == UP ? CLIENT : CORE];
    for (int k = 0; k < RELAY_ROUNDS && !x->len && !x->eof && src >= 0; k++) {
        ssize_t n = recv(src, r->scratch, RELAY_CHUNK, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
        if (n < 0 && d == UP) { /* the client's socket failed */
            conn_end(r, c);
            return false;
        }
        if (n <= 0) { /* core's end closed (or failed): what it wrote is all */
            x->eof = true;
            break;
        }
        if (c->closing || (d == UP && c->core_gone)) continue; /* the client's input is dropped */
        size_t ok = (size_t)n;
        enum h2_verdict v = H2_OK;
        if (d == UP) v = h2_guard_feed(&c->guard, r->scratch, (size_t)n, grpc_now_ms(), &ok); /* Y2 */
        else h2_frames_feed(&c->down, r->scratch, (size_t)n);
        if (v != H2_OK) {
            conn_refuse(r, c, v);
            break;
        }
        if (!dir_forward(c, d, r->scratch, ok)) {
            conn_end(r, c);
            return false;
        }
        if ((size_t)n < RELAY_CHUNK) break; /* drained; epoll says when there is more */
    }
    return true;
}

/* After c moved: half-closes, ends, and what epoll watches. False when c ended. */
static bool conn_settle(grpc_relay *r, relay_conn *c)
{
    if (c->closing) {
        if (!c->dir[DOWN].len && !c->client_shut) {
            shutdown(c->fd[CLIENT], SHUT_WR);
            c->client_shut = true;
        }
        if (c->dir[UP].eof || grpc_now_ms() >= c->linger_until_ms) {
            conn_end(r, c);
            return false;
        }
    } else {
        if (c->dir[DOWN].eof && !c->dir[DOWN].len) { /* core ended the connection; all of it written */
            conn_end(r, c);
            return false;
        }
        if (c->dir[UP].eof && !c->dir[UP].len && !c->core_shut) { /* the client is done sending */
            shutdown(c->fd[CORE], SHUT_WR);
            c->core_shut = true;
        }
    }
    rearm(r, c);
    return true;
}

static void on_event(grpc_relay *r, relay_end *e, uint32_t ev)
{
    relay_conn *c = e->c;
    if (c->dead) return; /* Y5 */
    int side = e == &c->end[CLIENT] ? CLIENT : CORE;
    if (c->fd[side] < 0) return; /* closed earlier in this batch (CLOSING: core's end) */
    if (!c->peer_bound) peer_bind(r, c);
    if (side == CLIENT && (ev & (EPOLLERR | EPOLLHUP))) { /* the client is gone both ways */
        conn_end(r, c);
        return;
    }
    if (side == CORE && (ev & (EPOLLERR | EPOLLHUP)) && !c->core_gone) {
        /* core closed its end: epoll would say so for as long as it is
         * open, so it leaves the set, and what core left is read as the
         * client takes it */
        epoll_ctl(r->ep, EPOLL_CTL_DEL, c->fd[CORE], NULL);
        c->core_gone = true;
        ev &= ~(uint32_t)EPOLLIN;
        free(c->dir[UP].pend); /* the client's octets have nowhere to go */
        c->dir[UP].pend = NULL;
        c->dir[UP].len = 0;
    }
    int in = side == CLIENT ? UP : DOWN, out = side == CLIENT ? DOWN : UP;
    if ((ev & EPOLLIN) && !dir_pump(r, c, in)) return;
    if ((ev & EPOLLOUT) && !dir_pump(r, c, out)) return;
    while (c->core_gone && c->fd[CORE] >= 0 && !c->dir[DOWN].len && !c->dir[DOWN].eof)
        if (!dir_pump(r, c, DOWN)) return; /* ends in EOF: core writes no more */
    conn_settle(r, c);
}

static void *relay_main(void *arg)
{
    grpc_relay *r = arg;
    struct epoll_event ev[64];
    for (;;) {
        int n = epoll_wait(r->ep, ev, 64, r->n_closing ? 100 : -1);
        if (n > 0) { /* Y4: grpc_relay_add's writes come before (epoll orders them, but not for TSan) */
            pthread_mutex_lock(&r->mu);
            pthread_mutex_unlock(&r->mu);
        }
        for (int i = 0; i < n; i++) {
            if (!ev[i].data.ptr) goto out; /* grpc_relay_stop */
            on_event(r, ev[i].data.ptr, ev[i].events);
        }
        if (r->n_closing) { /* lingers that are over; the list is read under mu (Y4) */
            int64_t t = grpc_now_ms();
            relay_conn *over = NULL;
            pthread_mutex_lock(&r->mu);
            for (relay_conn *c = r->conns; c; c = c->next)
                if (c->closing && t >= c->linger_until_ms) {
                    c->expired = over;
                    over = c;
                }
            pthread_mutex_unlock(&r->mu);
            for (relay_conn *c = over; c; c = c->expired) conn_end(r, c);
        }
        for (relay_conn *c = r->dead, *next; c; c = next) { /* Y5 */
            next = c->next;
            conn_free(c);
        }
        r->dead = NULL;
    }
out:
    return NULL;
}

/* ---- start, add, stop --------------------------------------------------------------- */

ferry_status grpc_relay_start(const h2_limits *lim, grpc_relay **out)
{
    *out = NULL;
    grpc_relay *r = calloc(1, sizeof *r);
    if (!r) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    r->lim = *lim;
    pthread_mutex_init(&r->mu, NULL);
    r->ep = epoll_create1(EPOLL_CLOEXEC);
    r->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = NULL};
    if (r->ep < 0 || r->wake < 0 || epoll_ctl(r->ep, EPOLL_CTL_ADD, r->wake, &e) != 0 ||
        pthread_create(&r->thread, NULL, relay_main, r) != 0) {
        int err = errno;
        grpc_relay_stop(r);
        return ferry_fail(FERRY_ERR_IO, "grpc: cannot start the relay: %s", strerror(err));
    }
    r->running = true;
    *out = r;
    return FERRY_OK;
}

ferry_status grpc_relay_add(grpc_relay *r, int client_fd, const grpc_peer *peer, int *core_fd)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
        return ferry_fail(FERRY_ERR_IO, "grpc: socketpair: %s", strerror(errno));
    relay_conn *c = calloc(1, sizeof *c);
    if (!c) {
        close(sv[0]);
        close(sv[1]);
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    c->fd[CLIENT] = client_fd;
    c->fd[CORE] = sv[0];
    c->addr = *peer;
    h2_guard_init(&c->guard, &r->lim, grpc_now_ms());
    h2_frames_init(&c->down, 0);
    for (int s = CLIENT; s <= CORE; s++) c->end[s] = (relay_end){.c = c, .events = end_wants(c, s)};
    pthread_mutex_lock(&r->mu); /* Y4 */
    c->next = r->conns;
    if (r->conns) r->conns->prev = c;
    r->conns = c;
    pthread_mutex_unlock(&r->mu);
    /* core's end first: nothing comes on it before core has sv[1]; once the
     * client's end is in the set, c is the relay thread's */
    struct epoll_event ec = {.events = c->end[CORE].events, .data.ptr = &c->end[CORE]};
    struct epoll_event el = {.events = c->end[CLIENT].events, .data.ptr = &c->end[CLIENT]};
    bool core_in = epoll_ctl(r->ep, EPOLL_CTL_ADD, sv[0], &ec) == 0;
    if (core_in && epoll_ctl(r->ep, EPOLL_CTL_ADD, client_fd, &el) == 0) {
        *core_fd = sv[1];
        return FERRY_OK;
    }
    int err = errno;
    list_unlink(r, c);
    close(sv[0]); /* and out of the set */
    close(sv[1]);
    free(c);
    return ferry_fail(FERRY_ERR_IO, "grpc: epoll: %s", strerror(err));
}

void grpc_relay_stop(grpc_relay *r)
{
    if (!r) return;
    if (r->running) grpc_thread_stop(r->wake, r->thread);
    for (relay_conn *c = r->conns, *next; c; c = next) {
        next = c->next;
        close_end(c, CLIENT);
        close_end(c, CORE);
        conn_free(c);
    }
    for (relay_conn *c = r->dead, *next; c; c = next) {
        next = c->next;
        conn_free(c);
    }
    for (unsigned k = 0; k < RELAY_PEER_CHAINS; k++)
        for (relay_peer *p = r->peers[k], *next; p; p = next) {
            next = p->next;
            free(p);
        }
    if (r->ep >= 0) close(r->ep);
    if (r->wake >= 0) close(r->wake);
    pthread_mutex_destroy(&r->mu);
    free(r);
}
