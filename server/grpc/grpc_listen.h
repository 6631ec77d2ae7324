/*
 * grpc_listen.h - the gRPC front end's listening socket and accept loop,
 * ferry's own rather than gRPC core's, so that ferry decides how many
 * connections it holds: gRPC core 1.51 has no connection limit. A
 * connection is handed to the relay (grpc_relay.h), and the relay's end of
 * it to core (grpc_server_add_channel_from_fd), once it has sent the
 * HTTP/2 connection preface. See grpc_listen.c. Private to server/grpc.
 */
#ifndef FERRY_GRPC_LISTEN_H
#define FERRY_GRPC_LISTEN_H

#include <grpc/grpc.h>

#include "grpc_relay.h"

#include "../../engine/base/status.h"

typedef struct {
    const char *host;       /* address to bind (--host) */
    int port;               /* 0 = any free port */
    int max_conns;          /* connections held at once, waiting and handed together; more wait in
                             * the listen queue (--max-connections) */
    int max_conns_per_ip;   /* of those, from one client address; more are closed at once
                             * (--max-connections-per-ip) */
    int preface_timeout_s;  /* a connection's preface must come within it (--request-timeout) */
    int user_timeout_ms;    /* TCP_USER_TIMEOUT of each connection (what core sets with keepalive) */
} grpc_listen_opts;

typedef struct grpc_listener grpc_listener;

/* Binds and listens (the port is known, nothing is accepted yet). */
ferry_status grpc_listener_open(const grpc_listen_opts *o, grpc_listener **out);
int grpc_listener_port(const grpc_listener *l);
/* Starts accepting for `server` (started), through `relay`; both outlive
 * the listener. */
ferry_status grpc_listener_start(grpc_listener *l, grpc_server *server, grpc_relay *relay);
/* Stops accepting, closes the listening socket and the connections not yet
 * handed on, and frees l. Connections handed on stay the relay's and
 * core's: core's shutdown ends them. */
void grpc_listener_stop(grpc_listener *l);

#endif
