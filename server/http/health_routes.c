/*
 * health_routes.c - whether the server lives and is ready (KServe's
 * /v2/health/live and /v2/health/ready, what an orchestrator probes), and
 * the Prometheus page (/metrics): the figures metrics.c renders, the
 * engine's read under the model's lock.
 */
#include <string.h>

#include "api.h"

static bool live(http_req *rq) { return http_reply_json_text(rq, 200, "{\"live\": true}"); }

static bool ready(http_req *rq)
{
    api_view v;
    api_look(rq, &v);
    return http_reply_json_text(rq, v.ready ? 200 : 503,
                                v.ready    ? "{\"ready\": true}"
                                : v.loaded ? "{\"ready\": false, \"error\": \"the last steps failed (see the server log)\"}"
                                           : "{\"ready\": false, \"error\": \"model not ready\"}");
}

static bool metrics_page(http_req *rq)
{
    http_server *srv = http_req_ctx(rq);
    metrics_engine_view view;
    memset(&view, 0, sizeof view);
    const api_model *m = api_hold(srv);
    if (m->s) {
        view.sched = sched_get_stats(m->s);
        /* loaded, and its steps are not failing one after another */
        view.ready = sched_healthy(&view.sched) && !http_req_draining(rq);
        view.pipe = engine_pipeline_stats(m->e);
        view.has_experts = engine_expert_stats(m->e, &view.experts);
        const plan *pl = engine_get_plan(m->e);
        memcpy(view.weight_bytes, pl->tier_bytes, sizeof view.weight_bytes);
        for (int k = 0; k < 2; k++) plan_memory_bytes(pl, k, view.mem_bytes[k]);
        view.unified = pl->opts.unified;
    }
    api_release(srv);
    req_budget *b = api_budget(srv);
    view.request_memory = req_budget_used(b);
    view.request_memory_limit = b->limit;
    strbuf sb;
    sb_init(&sb);
    metrics_render(http_req_counters(rq), &view, &sb);
    if (sb.oom) return http_reply_json(rq, 503, &sb, NULL, NULL);
    return http_reply(rq, 200, "text/plain; version=0.0.4; charset=utf-8", sb.data, sb.len, NULL, NULL);
}

static const http_route k_routes[] = {
    HTTP_ROUTE("GET", "/v2/health/live", "health_live", live),
    HTTP_ROUTE("GET", "/v2/health/ready", "health_ready", ready),
    HTTP_ROUTE("GET", "/metrics", "metrics", metrics_page),
};

const http_route_table health_routes = {k_routes, sizeof k_routes / sizeof k_routes[0]};
