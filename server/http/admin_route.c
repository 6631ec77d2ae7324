/*
 * admin_route.c - the admin API's authentication and routing decision on
 * a request head; see admin_route.h.
 */
#include "admin_route.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Compares a presented token with the server's in time that depends on
 * neither's content nor the server token's length: the presented one is
 * copied into a zero-padded buffer the size of the server's, every byte of
 * both is XORed, and the lengths are folded in. A presented token longer
 * than the buffer can hold is wrong anyway (the loop still runs whole). */
static bool token_matches(const char token[ADMIN_TOKEN_MAX], size_t token_len, const char *got, size_t got_len)
{
    char padded[ADMIN_TOKEN_MAX];
    memset(padded, 0, sizeof padded);
    memcpy(padded, got, got_len < sizeof padded ? got_len : sizeof padded);
    volatile unsigned diff = 0;
    for (size_t i = 0; i < sizeof padded; i++) diff |= (unsigned char)(padded[i] ^ token[i]);
    diff |= (unsigned)((got_len ^ token_len) != 0);
    return diff == 0;
}

/* NULL when h carries the token; else the reason it was refused. */
static const char *auth_refusal(const char *h, const char token[ADMIN_TOKEN_MAX], size_t token_len)
{
    if (!h) return "no Authorization header";
    if (strncasecmp(h, "Bearer", 6) != 0 || (h[6] != ' ' && h[6] != '\t')) return "not a Bearer credential";
    const char *t = h + 6;
    while (*t == ' ' || *t == '\t') t++;
    size_t n = strlen(t);
    while (n && (t[n - 1] == ' ' || t[n - 1] == '\t')) n--;
    return token_matches(token, token_len, t, n) ? NULL : "wrong token";
}

static admin_endpoint endpoint_of(const char *label)
{
    if (!label) return AEP_OTHER;
    if (!strcmp(label, ADMIN_LABEL_STATUS)) return AEP_STATUS;
    if (!strcmp(label, ADMIN_LABEL_EXPORT)) return AEP_EXPORT;
    if (!strcmp(label, ADMIN_LABEL_JOB)) return AEP_JOB;
    return AEP_OTHER;
}

admin_decision admin_route(const char *method, const char *url, const char *authorization,
                           const char token[ADMIN_TOKEN_MAX], size_t token_len)
{
    static const http_route_table *const tables[] = {&admin_routes};
    http_match m;
    http_route_find(tables, 1, method, url, &m);
    admin_decision d = {.ep = endpoint_of(m.label)};
    const char *refused = auth_refusal(authorization, token, token_len);
    if (refused) {
        d.code = 401;
        snprintf(d.why, sizeof d.why, "%s", refused);
        return d;
    }
    if (d.ep == AEP_JOB) {
        d.job_id = m.param;
        d.cancel = !strcmp(method, "DELETE");
    }
    if (!m.route) {
        d.code = m.code;
        snprintf(d.why, sizeof d.why, "%s", m.why);
        snprintf(d.allow, sizeof d.allow, "%s", m.allow);
    }
    return d;
}
