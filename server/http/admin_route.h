/*
 * admin_route.h - the admin API's decision on a request head, apart from
 * the server (admin.c's head hook calls it; tests/fuzz/fuzz_admin_route.c
 * feeds it arbitrary heads): is the bearer token there, which endpoint,
 * is the method one it takes. Authentication comes first: without the
 * token every path, known or not, is 401. The endpoints and their methods
 * are admin.c's route table (admin_routes), looked up as the listener
 * looks them up (http/route.c).
 */
#ifndef FERRY_ADMIN_ROUTE_H
#define FERRY_ADMIN_ROUTE_H

#include <stdbool.h>
#include <stddef.h>

#include "listener.h"

#define ADMIN_TOKEN_MAX 1024
#define ADMIN_JOBS_PREFIX "/admin/v1/jobs/"

/* The endpoints' metrics labels, by which the table names them. */
#define ADMIN_LABEL_STATUS "admin_status"
#define ADMIN_LABEL_EXPORT "admin_export"
#define ADMIN_LABEL_JOB "admin_job"
#define ADMIN_LABEL_OTHER "admin_other"

typedef enum { AEP_STATUS, AEP_EXPORT, AEP_JOB, AEP_OTHER } admin_endpoint;

typedef struct {
    admin_endpoint ep;   /* by the path alone (a metrics label even when refused) */
    int code;            /* 0: let in, answer ep; else 401, 404 or 405 */
    char why[64];        /* 401: the reason; 404/405: the message */
    char allow[48];      /* 405: the Allow header */
    const char *job_id;  /* AEP_JOB: the id, within url */
    bool cancel;         /* AEP_JOB: DELETE */
} admin_decision;

/* The admin API's routes (admin.c). */
extern const http_route_table admin_routes;

/* method, url (as sent: no escapes decoded) and the Authorization header
 * (NULL: none) against the server's token: `token` is ADMIN_TOKEN_MAX
 * bytes, zero-padded past token_len (compared in constant time). */
admin_decision admin_route(const char *method, const char *url, const char *authorization,
                           const char token[ADMIN_TOKEN_MAX], size_t token_len);

#endif
