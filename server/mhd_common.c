/*
 * mhd_common.c - shared by the libmicrohttpd listeners; see mhd_common.h.
 */
#include "mhd_common.h"

#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

ferry_status mhd_resolve(const char *host, int port, const char *flag, struct addrinfo **ai)
{
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    struct addrinfo hints = {0};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    *ai = NULL;
    int gai = getaddrinfo(host, p, &hints, ai);
    if (gai != 0) return ferry_fail(FERRY_ERR_INVALID, "%s %s: %s", flag, host, gai_strerror(gai));
    return FERRY_OK;
}

void mhd_log(bool on, const char *who, const char *fmt, va_list ap)
{
    if (!on) return;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = '\0';
    fprintf(stderr, "ferry: %s: %s\n", who, msg);
}
