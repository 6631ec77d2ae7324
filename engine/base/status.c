/*
 * status.c - the per-thread error message behind ferry_status.
 */
#include "status.h"

#include <stdarg.h>
#include <string.h>

static _Thread_local char g_msg[FERRY_MSG_MAX];

ferry_status ferry_fail(ferry_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    return st;
}

ferry_status ferry_fail_context(ferry_status st, const char *fmt, ...)
{
    char prefix[512], old[sizeof g_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_msg, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof g_msg - 3) n = sizeof g_msg - 3;
    memcpy(g_msg, prefix, n);
    memcpy(g_msg + n, ": ", 2);
    size_t rest = sizeof g_msg - n - 3;
    size_t m = strlen(old);
    if (m > rest) m = rest;
    memcpy(g_msg + n + 2, old, m);
    g_msg[n + 2 + m] = '\0';
    return st;
}

const char *ferry_errmsg(void) { return g_msg; }

char *ferry_errmsg_dup(void) { return strdup(g_msg); }

const char *ferry_status_name(ferry_status st)
{
    switch (st) {
    case FERRY_OK: return "ok";
    case FERRY_ERR_INVALID: return "invalid";
    case FERRY_ERR_NOT_FOUND: return "not found";
    case FERRY_ERR_UNSUPPORTED: return "unsupported";
    case FERRY_ERR_IO: return "i/o error";
    case FERRY_ERR_NOMEM: return "out of memory";
    case FERRY_ERR_BUSY: return "busy";
    case FERRY_ERR_INTERNAL: return "internal error";
    case FERRY_ERR_TOO_LARGE: return "too large";
    }
    return "unknown";
}
