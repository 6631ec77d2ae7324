/*
 * grpc_thread.h - what the gRPC front end's own threads (the accepting one,
 * grpc_listen.c, and the relay, grpc_relay.c) share: a monotonic clock in
 * milliseconds, a log line that a flood cannot turn into a flood of lines,
 * and the stop of a thread that waits on an eventfd. Private to
 * server/grpc.
 */
#ifndef FERRY_GRPC_THREAD_H
#define FERRY_GRPC_THREAD_H

#include <pthread.h>
#include <stdint.h>

int64_t grpc_now_ms(void);

/* One kind of line, written to stderr ("ferry: grpc: ...") at most every
 * 10 s; the lines held back meanwhile are counted on the next one. */
typedef struct {
    int64_t last_ms;
    int quiet;
} grpc_ratelog;

void grpc_ratelog_note(grpc_ratelog *rl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Wakes `thread` through its eventfd `wake` and joins it. */
void grpc_thread_stop(int wake, pthread_t thread);

#endif
