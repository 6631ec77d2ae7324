/*
 * status.h - how ferry reports outcomes.
 *
 * Two tiers, as in ggml: runtime outcomes (bad input, missing file, I/O
 * failure) are returned as a ferry_status together with a one-line message
 * kept per thread; broken invariants abort through FERRY_ASSERT, which names
 * the file and line. The status codes map one to one onto HTTP and gRPC codes
 * in the front ends, so choose the code by what the caller can do about it.
 */
#ifndef FERRY_STATUS_H
#define FERRY_STATUS_H

#include <stdio.h>
#include <stdlib.h>

typedef enum {
    FERRY_OK = 0,
    FERRY_ERR_INVALID,     /* malformed input or argument (HTTP 400)        */
    FERRY_ERR_NOT_FOUND,   /* missing file, tensor or model (HTTP 404)      */
    FERRY_ERR_UNSUPPORTED, /* well-formed but not handled here (HTTP 400)   */
    FERRY_ERR_IO,          /* read/write failure of the system (HTTP 500)   */
    FERRY_ERR_NOMEM,       /* memory could not be had (HTTP 503)            */
    FERRY_ERR_BUSY,        /* full queue or batch; retry later (HTTP 503)   */
    FERRY_ERR_INTERNAL,    /* a bug surfaced as an outcome (HTTP 500)       */
    FERRY_ERR_TOO_LARGE,   /* input past a size limit (HTTP 413)            */
} ferry_status;

/* Records the message for the calling thread and returns `st`, so that
 * `return ferry_fail(FERRY_ERR_INVALID, "%s: ...", path);` reads naturally. */
ferry_status ferry_fail(ferry_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prefixes the current message with "what: " (adds context on the way up). */
ferry_status ferry_fail_context(ferry_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The last message recorded on this thread ("" if none). */
/* Messages are at most FERRY_MSG_MAX - 1 bytes; buffers that carry one to
 * another thread are that size, so nothing is cut on the way. */
#define FERRY_MSG_MAX 1024

const char *ferry_errmsg(void);
/* A malloc'd copy of this thread's message, for handing an error to another
 * thread whole (NULL when out of memory). */
char *ferry_errmsg_dup(void);

const char *ferry_status_name(ferry_status st);

#define FERRY_ASSERT(cond)                                                   \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "ferry: internal error: %s:%d: assertion '%s' failed\n", \
                    __FILE__, __LINE__, #cond);                              \
            abort();                                                         \
        }                                                                    \
    } while (0)

#define FERRY_TRY(expr)                                                      \
    do {                                                                     \
        ferry_status st_try_ = (expr);                                       \
        if (st_try_ != FERRY_OK) return st_try_;                             \
    } while (0)

#endif
