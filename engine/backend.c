/*
 * backend.c - choosing a backend by name.
 */
#include "backend.h"

#include <string.h>

ferry_status backend_create(const char *name, const backend_opts *opts, backend **out)
{
    *out = NULL;
    if (strcmp(name, "cpu") == 0) return cpu_backend_create(opts, out);
    if (strcmp(name, "cuda") == 0)
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "device 'cuda': this build of ferry has no CUDA backend");
    return ferry_fail(FERRY_ERR_INVALID, "unknown device '%s' (expected cpu or cuda)", name);
}
