/*
 * grpc_relay.h - the byte relay between each gRPC client and gRPC core,
 * which reads the client's HTTP/2 frame headers on the way and ends a
 * connection that floods reset streams or sends a header block past its
 * bound (h2_frame.h's guard), with GOAWAY ENHANCE_YOUR_CALM; resets are
 * counted per client address, all its connections together. Core gets one
 * end of a socketpair per connection instead of the client's socket. See
 * grpc_relay.c. Private to server/grpc.
 */
#ifndef FERRY_GRPC_RELAY_H
#define FERRY_GRPC_RELAY_H

#include <netinet/in.h>

#include "../../engine/base/status.h"
#include "h2_frame.h"

typedef struct grpc_relay grpc_relay;

/* A client's address: what its connections share (zeroed, then filled). */
typedef struct {
    sa_family_t family;      /* AF_INET (an IPv4-mapped IPv6 address too) or AF_INET6 */
    uint8_t a[16];
} grpc_peer;

/* Starts the relay's thread. */
ferry_status grpc_relay_start(const h2_limits *lim, grpc_relay **out);
/* Takes the client's connected, non-blocking socket (its preface, still
 * unread, checked) from address *peer, and returns in *core_fd the socket
 * to give core. The connections of one address share one reset bucket
 * (--grpc-max-resets). On failure the client's socket is still the
 * caller's. */
ferry_status grpc_relay_add(grpc_relay *r, int client_fd, const grpc_peer *peer, int *core_fd);
/* Stops the thread and closes every connection it relays. */
void grpc_relay_stop(grpc_relay *r);

#endif
