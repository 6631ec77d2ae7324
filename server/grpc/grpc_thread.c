/*
 * grpc_thread.c - the clock, rate-limited log lines and thread stop that
 * grpc_listen.c and grpc_relay.c share (grpc_thread.h).
 */
#include "grpc_thread.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#define LOG_EVERY_MS 10000

int64_t grpc_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

void grpc_ratelog_note(grpc_ratelog *rl, const char *fmt, ...)
{
    int64_t t = grpc_now_ms();
    if (rl->last_ms && t - rl->last_ms < LOG_EVERY_MS) {
        rl->quiet++;
        return;
    }
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (rl->quiet)
        fprintf(stderr, "ferry: grpc: %s (and %d more like it in the last %d s)\n", msg, rl->quiet,
                (int)((t - rl->last_ms) / 1000));
    else fprintf(stderr, "ferry: grpc: %s\n", msg);
    rl->last_ms = t;
    rl->quiet = 0;
}

void grpc_thread_stop(int wake, pthread_t thread)
{
    uint64_t one = 1;
    ssize_t w = write(wake, &one, sizeof one); /* fails only when already woken */
    (void)w;
    pthread_join(thread, NULL);
}
