/*
 * route.c - which route of a listener's tables answers a method and a
 * path, apart from MHD (the admin API's fuzz target runs it too); see
 * listener.h. A path no route has is 404; a path some route has, with a
 * method none of them takes, is 405 with the Allow header of those that
 * do, so that a table lists each (method, path) once and the refusals
 * follow from it.
 */
#include <stdio.h>
#include <string.h>

#include "listener.h"

static bool path_matches(const char *pattern, const char *path, const char **param)
{
    size_t n = strlen(pattern);
    if (n == 0 || pattern[n - 1] != '*') return !strcmp(pattern, path);
    if (strncmp(pattern, path, n - 1) != 0) return false;
    const char *rest = path + n - 1;
    if (!*rest || strchr(rest, '/')) return false;
    *param = rest;
    return true;
}

static bool method_takes(const char *route_method, const char *method)
{
    if (!strcmp(route_method, method)) return true;
    return !strcmp(route_method, "GET") && !strcmp(method, "HEAD");
}

/* "GET, HEAD" for a GET route: HEAD is answered too. */
static void allow_add(http_match *m, const char *method, bool first)
{
    size_t k = strlen(m->allow);
    snprintf(m->allow + k, sizeof m->allow - k, "%s%s%s", first ? "" : ", ", method,
             !strcmp(method, "GET") ? ", HEAD" : "");
}

void http_route_find(const http_route_table *const *tables, int n, const char *method, const char *path,
                     http_match *m)
{
    memset(m, 0, sizeof *m);
    const char *uses[4];
    int n_uses = 0;
    for (int t = 0; t < n; t++)
        for (size_t i = 0; i < tables[t]->n; i++) {
            const http_route *r = &tables[t]->routes[i];
            const char *param = NULL;
            if (!path_matches(r->path, path, &param)) continue;
            if (!m->label) m->label = r->label, m->param = param;
            if (method_takes(r->method, method)) {
                m->route = r;
                m->param = param;
                return;
            }
            if (n_uses < (int)(sizeof uses / sizeof uses[0])) uses[n_uses++] = r->method;
        }
    if (!m->label) {
        m->code = 404;
        m->why = "not found";
        return;
    }
    m->code = 405;
    size_t k = (size_t)snprintf(m->why_buf, sizeof m->why_buf, "method not allowed (use ");
    for (int i = 0; i < n_uses; i++) {
        allow_add(m, uses[i], i == 0);
        if (k < sizeof m->why_buf)
            k += (size_t)snprintf(m->why_buf + k, sizeof m->why_buf - k, "%s%s", i ? " or " : "", uses[i]);
    }
    if (k < sizeof m->why_buf) snprintf(m->why_buf + k, sizeof m->why_buf - k, ")");
    m->why = m->why_buf;
}
