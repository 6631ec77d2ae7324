/*
 * admin_route.c - the admin API's routing and authentication decision; see
 * admin_route.h.
 */
#include "admin_route.h"

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

static bool is_get(const char *m) { return !strcmp(m, "GET") || !strcmp(m, "HEAD"); }

static admin_endpoint endpoint_of(const char *url)
{
    size_t pl = strlen(ADMIN_JOBS_PREFIX);
    if (!strcmp(url, "/admin/v1/status")) return AEP_STATUS;
    if (!strcmp(url, "/admin/v1/export")) return AEP_EXPORT;
    if (!strncmp(url, ADMIN_JOBS_PREFIX, pl) && url[pl] && !strchr(url + pl, '/')) return AEP_JOB;
    return AEP_OTHER;
}

admin_decision admin_route(const char *method, const char *url, const char *authorization,
                           const char token[ADMIN_TOKEN_MAX], size_t token_len)
{
    admin_decision d = {.ep = endpoint_of(url)};
    if ((d.why = auth_refusal(authorization, token, token_len))) {
        d.code = 401;
        return d;
    }
    switch (d.ep) {
    case AEP_STATUS:
        if (!is_get(method)) d.code = 405, d.allow = "GET, HEAD", d.why = "method not allowed (use GET)";
        break;
    case AEP_EXPORT:
        if (strcmp(method, "POST") != 0) d.code = 405, d.allow = "POST", d.why = "method not allowed (use POST)";
        break;
    case AEP_JOB:
        d.cancel = !strcmp(method, "DELETE");
        d.job_id = url + strlen(ADMIN_JOBS_PREFIX);
        if (!d.cancel && !is_get(method))
            d.code = 405, d.allow = "GET, HEAD, DELETE", d.why = "method not allowed (use GET or DELETE)";
        break;
    default: d.code = 404, d.why = "not found";
    }
    return d;
}
