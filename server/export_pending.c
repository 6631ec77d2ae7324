/*
 * export_pending.c - TEMPORARY: weak stand-ins for engine/export.h until the
 * export engine (branch `export`) is merged; its strong definitions replace
 * these at link time. Every export is refused as unsupported. Delete this
 * file when engine/export.c lands.
 */
#include <string.h>

#include "../engine/export.h"

__attribute__((weak)) ferry_status export_start(engine *e, const export_opts *o, export_job **out)
{
    (void)e, (void)o;
    *out = NULL;
    return ferry_fail(FERRY_ERR_UNSUPPORTED, "export is not built into this ferry");
}

__attribute__((weak)) export_status export_job_status(export_job *j)
{
    (void)j;
    return (export_status){.state = EXPORT_FAILED};
}

__attribute__((weak)) void export_job_cancel(export_job *j) { (void)j; }

__attribute__((weak)) export_status export_job_wait(export_job *j) { return export_job_status(j); }

__attribute__((weak)) void export_job_free(export_job *j) { (void)j; }

__attribute__((weak)) bool export_layout_parse(const char *s, export_layout *out)
{
    if (!strcmp(s, "converted")) *out = EXPORT_CONVERTED;
    else if (!strcmp(s, "original")) *out = EXPORT_ORIGINAL;
    else return false;
    return true;
}

__attribute__((weak)) const char *export_state_name(export_state s)
{
    static const char *const k[] = {"queued", "running", "done", "failed", "cancelled"};
    return (unsigned)s < 5 ? k[s] : "unknown";
}
