/*
 * admin.h - the admin API: a listener of its own (default 127.0.0.1:8003)
 * for operators, apart from the inference front ends.
 *
 *   GET    /admin/v1/status       model, conversion, placement, memory,
 *                                 pipeline figures, running and recent jobs
 *   POST   /admin/v1/export       start an export (engine/export.h) -> 202
 *   GET    /admin/v1/jobs/{id}    a job's state and progress
 *   DELETE /admin/v1/jobs/{id}    cancel it (its partial output is removed)
 *
 * Every request needs `Authorization: Bearer <token>`; anything else is
 * 401 with `WWW-Authenticate: Bearer`, counted in /metrics
 * (ferry_admin_auth_failures_total) and logged with the peer's address and
 * the reason, never the token. The token is compared in constant time.
 *
 * Where the token comes from is the caller's (cmd_serve.c): a file of the
 * user's with mode 0600 or stricter (admin_token_read), or the admin_token
 * setting (the environment, or a config file held to the same rule).
 * Without a token the listener is not started at all; on an address other
 * than loopback that is a startup error (admin_host_is_loopback).
 *
 * One export runs at a time. Shutdown (frontend.h): drain cancels a
 * running export and waits for it to end (the job reads the engine),
 * detach makes sure none starts after, both before sched_free and
 * engine_close.
 */
#ifndef FERRY_ADMIN_H
#define FERRY_ADMIN_H

#include <stdbool.h>

#include "../../engine/engine.h"
#include "../../engine/scheduler.h"
#include "admin_route.h"
#include "../frontend.h"
#include "../metrics.h"

typedef struct {
    const char *host;        /* address to bind */
    int port;                /* 0 = any free port (admin_server_port says which) */
    const char *token;       /* the bearer token; required, copied */
    const char *export_root; /* --export-dir; NULL: exports are refused (400) */
    const char *model_name;
    metrics *counters;       /* owned by the caller, outlives the server */
    int request_timeout_s;   /* request_timeout: to send a request's head and body */
    int max_connections;     /* admin_max_connections: connections sending a request (admin.c) */
} admin_opts;

typedef struct admin_server admin_server;

ferry_status admin_server_start(const admin_opts *o, admin_server **out);
int admin_server_port(const admin_server *a);
/* Its life cycle (frontend.h): attach makes status report the model and
 * exports start; quiesce stops accepting connections, and exports (503
 * "server shutting down"); drain cancels a running export and waits for it
 * (the job reads the engine), at once whatever the deadline; after detach
 * none can start; stop closes every connection and frees. */
frontend admin_frontend(admin_server *a);

/* Reads the token from path: its first line, surrounding blanks trimmed.
 * The file must be a regular file (not a symlink) owned by this user with
 * no group or other permission bits; otherwise FERRY_ERR_INVALID with a
 * message naming where the path came from (`from`: "--admin-token-file",
 * "ferry.json:9: admin_token_file"), the file and its mode. *out is malloc'd. */
ferry_status admin_token_read(const char *path, const char *from, char **out);
/* Checks a token from any source (non-empty, printable, at most
 * ADMIN_TOKEN_MAX bytes); `from` names the source in the message. */
ferry_status admin_token_check(const char *token, const char *from);

/* True when every address host resolves to is a loopback address
 * (127.0.0.0/8, ::1, ::ffff:127.0.0.0/104). */
bool admin_host_is_loopback(const char *host);

#endif
