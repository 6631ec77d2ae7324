/*
 * fuzz_admin_route.c - libFuzzer target for the admin API's request router
 * (admin_route in server/http/admin_route.h): method + URL + Authorization
 * header -> 401 / 404 / 405 / let in, and which endpoint.
 *
 * The input is "METHOD\nURL\nAUTHORIZATION" (a part past the last newline
 * is the header; with fewer than two newlines there is no header). The
 * server's token is fixed. Checks: let in (code 0) exactly when the header
 * is "Bearer" (any case), blanks, the token, blanks - worked out here
 * independently - and 401 otherwise whatever the path; once in, 404 exactly
 * for a path that is none of the endpoints, 405 with an Allow header for a
 * method the endpoint does not take, and a job id that is non-empty, has
 * no '/' and lies inside the URL. A broken promise aborts.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../../server/http/admin_route.h"

static const char k_token[] = "adm1n-T0ken-for-fuzzing-0123456789";

/* The reference: does h present k_token as a bearer credential? */
static bool presents_token(const char *h)
{
    if (!h || strncasecmp(h, "bearer", 6) || (h[6] != ' ' && h[6] != '\t')) return false;
    h += 6;
    h += strspn(h, " \t");
    size_t n = strlen(k_token);
    return !strncmp(h, k_token, n) && h[n + strspn(h + n, " \t")] == '\0';
}

static bool known_path(const char *url)
{
    size_t pl = strlen(ADMIN_JOBS_PREFIX);
    return !strcmp(url, "/admin/v1/status") || !strcmp(url, "/admin/v1/export") ||
           (!strncmp(url, ADMIN_JOBS_PREFIX, pl) && url[pl] && !strchr(url + pl, '/'));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = '\0'; /* MHD hands over C strings: a NUL ends each part */
    char *method = buf, *url = "", *auth = NULL;
    char *nl = strchr(method, '\n');
    if (nl) {
        *nl = '\0';
        url = nl + 1;
        if ((nl = strchr(url, '\n'))) {
            *nl = '\0';
            auth = nl + 1;
        }
    }
    char token[ADMIN_TOKEN_MAX] = {0};
    memcpy(token, k_token, strlen(k_token));
    admin_decision d = admin_route(method, url, auth, token, strlen(k_token));

    if ((d.code == 401) == presents_token(auth)) abort();
    if (d.ep != AEP_OTHER && !known_path(url)) abort();
    if (d.ep == AEP_OTHER && known_path(url)) abort();
    if (d.code == 401 && !d.why[0]) abort();
    if (d.code != 401) {
        bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
        bool allowed = d.ep == AEP_STATUS ? get
                     : d.ep == AEP_EXPORT ? !strcmp(method, "POST")
                     : d.ep == AEP_JOB ? get || !strcmp(method, "DELETE") : false;
        if (d.ep == AEP_OTHER && d.code != 404) abort();
        if (d.ep != AEP_OTHER && d.code != (allowed ? 0 : 405)) abort();
        if (d.code == 405 && (!d.allow[0] || !d.why[0])) abort();
        if (d.ep == AEP_JOB) {
            if (!d.job_id || d.job_id < url || d.job_id >= url + strlen(url)) abort();
            if (!*d.job_id || strchr(d.job_id, '/')) abort();
            if (d.cancel != !strcmp(method, "DELETE")) abort();
        }
    }
    free(buf);
    return 0;
}
