/*
 * mhd_common.h - libmicrohttpd helpers of the HTTP listener
 * (http/listener.c, which serves both the inference API and the admin
 * API), kept apart from it because others use them too: resolving the
 * address to bind (gRPC's listener binds as HTTP does), MHD's own log
 * lines, quiet unless FERRY_HTTP_LOG is set, and log lines a client can
 * provoke (the admin API's 401s), bounded and escaped; and the listener's
 * list of open connections, which keeps a receive deadline (and, on the
 * admin API, a limit on connections still sending their request), and its
 * answer written past MHD.
 */
#ifndef FERRY_MHD_COMMON_H
#define FERRY_MHD_COMMON_H

#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>

#include "../engine/base/status.h"

/* Resolves host:port for binding (numeric port; any family). `flag` names
 * the setting in the error ("--host", "--admin-host"). *ai: freeaddrinfo. */
ferry_status mhd_resolve(const char *host, int port, const char *flag, struct addrinfo **ai);

/* One of MHD's messages on stderr as "ferry: WHO: ..." (trailing newlines
 * dropped) when `on`. */
void mhd_log(bool on, const char *who, const char *fmt, va_list ap);

/* What a client sent (a method, a path), fit for one log line: bytes
 * outside printable ASCII, and backslash, as \xNN; at most `cap` - 1 bytes
 * written, cut with "..." when longer. Returns out. */
const char *mhd_log_escape(const char *s, char *out, size_t cap);

/* Log lines a client can provoke, at most `burst` per `window_s` seconds:
 * mhd_log_allow says whether to write one now, and how many were held back
 * since the last one written (to say so in it). Thread-safe. */
typedef struct {
    int burst, window_s;
    int64_t window_start; /* monotonic seconds */
    int in_window;
    uint64_t held_back;
} mhd_log_limit;
#define MHD_LOG_LIMIT_INIT(burst, window_s) {(burst), (window_s), 0, 0, 0}
bool mhd_log_allow(mhd_log_limit *l, uint64_t *held_back);

/* An answer MHD cannot queue: libmicrohttpd 0.9.75 queues one only before
 * a request's body or after all of it, so a chunked body found over a limit
 * midway would otherwise end in a close, and a close with unread bytes
 * resets the connection before the client reads any answer. This writes
 * the whole answer (status line, Content-Type, Content-Length, Connection:
 * close, body) straight to the socket - nothing else is ever written on it
 * - and shuts down its write side, so the client reads the answer, then
 * end of stream. The caller goes on reading the body and dropping it for a
 * while (a lingering close), then closes, without queueing any answer.
 * False: not all of it could be written (the connection's MHD thread only). */
bool mhd_answer_raw(struct MHD_Connection *c, unsigned code, const char *type, const char *body, size_t len);

/* ---- open connections: the receive deadline and the waiting limit --------------

 * MHD calls the access handler only once a request's head is whole, so a
 * client that trickles its head (slow loris) is seen only in its connection
 * notifications. An mhd_conns lists every open connection of a daemon
 * (MHD_OPTION_NOTIFY_CONNECTION, mhd_conns_notify) with whether it is
 * still receiving its request - its head and body, or, kept alive, its
 * next head - and since when.
 *
 *   deadline: mhd_conns_cut_slow (called every fraction of a second)
 *     shuts down a connection receiving for longer than deadline_s, or
 *     whose client closed its side before the request was whole; MHD then
 *     sees the socket fail and closes it.
 *   waiting limit (max_waiting > 0): when a connection opens and
 *     max_waiting connections are already receiving, the one receiving
 *     longest is shut down, one that never had a request admitted
 *     (mhd_conns_admit) before one that did; if none is receiving, the new
 *     connection is. Clients that hold connections open without finishing
 *     a head thus cannot keep a client that sends its request at once out.
 *
 * The daemon's own MHD_OPTION_CONNECTION_LIMIT must leave room above
 * max_waiting: a connection shut down is counted by MHD until it closes it. */
typedef struct mhd_conns mhd_conns;

/* NULL when out of memory. */
mhd_conns *mhd_conns_new(int deadline_s, int max_waiting);
void mhd_conns_free(mhd_conns *cs);
/* MHD_OPTION_NOTIFY_CONNECTION's callback, cls the mhd_conns. */
void mhd_conns_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                      enum MHD_ConnectionNotificationCode toe);
/* A request's head is whole and its body received (receiving false), or it
 * was answered and the connection waits for the next head (true: the
 * deadline starts again). */
void mhd_conns_mark(mhd_conns *cs, struct MHD_Connection *c, bool receiving);
/* The connection's request was let in (authenticated): it is shut down for
 * the waiting limit only after every connection that never was. */
void mhd_conns_admit(mhd_conns *cs, struct MHD_Connection *c);
/* The current request's URL as the client sent it (MHD's URI log
 * callback: query included, before unescaping), kept for a head-size check
 * (http/listener.c); the connection's MHD thread only. Untracked: `otherwise`. */
void mhd_conns_set_url_bytes(mhd_conns *cs, struct MHD_Connection *c, uint64_t n);
uint64_t mhd_conns_url_bytes(struct MHD_Connection *c, uint64_t otherwise);
/* Shuts down the connections past the deadline or left by their client;
 * returns how many it shut down. */
int mhd_conns_cut_slow(mhd_conns *cs);

#endif
