/*
 * mhd_common.h - what the two libmicrohttpd listeners (http.c: KServe v2,
 * admin.c: the admin API) do alike: resolving the address to bind, and
 * passing MHD's own log lines on, quietly unless FERRY_HTTP_LOG is set.
 */
#ifndef FERRY_MHD_COMMON_H
#define FERRY_MHD_COMMON_H

#include <netdb.h>
#include <stdarg.h>
#include <stdbool.h>

#include "../engine/base/status.h"

/* Resolves host:port for binding (numeric port; any family). `flag` names
 * the setting in the error ("--host", "--admin-host"). *ai: freeaddrinfo. */
ferry_status mhd_resolve(const char *host, int port, const char *flag, struct addrinfo **ai);

/* One of MHD's messages on stderr as "ferry: WHO: ..." (trailing newlines
 * dropped) when `on`. */
void mhd_log(bool on, const char *who, const char *fmt, va_list ap);

#endif
