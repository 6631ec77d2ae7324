/*
 * grpc_relay.h - the byte relay between each gRPC client and gRPC core,
 * which reads the client's HTTP/2 frame headers on the way and ends a
 * connection that floods reset streams or sends a header block past its
 * bound (h2_frame.h's guard), with GOAWAY ENHANCE_YOUR_CALM. Core gets one
 * end of a socketpair per connection instead of the client's socket. See
 * grpc_relay.c. Private to server/grpc.
 */
#ifndef FERRY_GRPC_RELAY_H
#define FERRY_GRPC_RELAY_H

#include "../../engine/base/status.h"
#include "h2_frame.h"

typedef struct grpc_relay grpc_relay;

/* Starts the relay's thread. */
ferry_status grpc_relay_start(const h2_limits *lim, grpc_relay **out);
/* Takes the client's connected, non-blocking socket (its preface, still
 * unread, checked) and returns in *core_fd the socket to give core. On
 * failure the client's socket is still the caller's. */
ferry_status grpc_relay_add(grpc_relay *r, int client_fd, int *core_fd);
/* Stops the thread and closes every connection it relays. */
void grpc_relay_stop(grpc_relay *r);

#endif
