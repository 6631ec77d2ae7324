/*
 * backend.c - choosing a backend by name: cpu, cpu-split (the CPU kernels
 * behind a GPU's separate memory and streams, cpu/split_backend.c, so the
 * non-unified paths run without a GPU) or cuda.
 *
 * The CUDA backend is a separate library, libferry_cuda.so, loaded on
 * demand: the ferry binary links no CUDA library, so the same build runs on
 * machines without a GPU or driver, and --device cuda there is a one-line
 * error rather than a loader failure. The library is looked for in
 * $FERRY_CUDA_LIB if set, else next to the running executable, else one
 * directory up (the unit tests in build/tests find build/libferry_cuda.so).
 */
#define _GNU_SOURCE
#include "backend.h"
#include "base/util.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CUDA_LIB_NAME "libferry_cuda.so"

typedef ferry_status (*cuda_create_fn)(const backend_opts *opts, backend **out);

/* Fills path with $FERRY_CUDA_LIB as given, else the first candidate that
 * exists; false if none. */
static bool cuda_lib_find(char *path, size_t cap)
{
    const char *env = getenv("FERRY_CUDA_LIB");
    if (env && *env) {
        snprintf(path, cap, "%s", env);
        return true; /* dlopen names what is wrong with it */
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return false;
    exe[n] = '\0';
    for (int up = 0; up < 2; up++) {
        char *slash = strrchr(exe, '/');
        if (!slash) return false;
        *slash = '\0';
        if ((size_t)snprintf(path, cap, "%s/%s", exe, CUDA_LIB_NAME) < cap && access(path, F_OK) == 0) return true;
    }
    return false;
}

static ferry_status cuda_backend_open(const backend_opts *opts, backend **out)
{
    char path[PATH_MAX + 32];
    if (!cuda_lib_find(path, sizeof path))
        return ferry_fail(FERRY_ERR_UNSUPPORTED,
                          "device 'cuda': this build of ferry has no CUDA backend (build with nvcc available)");
    /* never closed: CUDA libraries do not support unloading */
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) return ferry_fail(FERRY_ERR_UNSUPPORTED, "device 'cuda': cannot load the CUDA backend: %s", dlerror());
    cuda_create_fn create;
    *(void **)&create = dlsym(lib, "ferry_cuda_backend_create");
    if (!create)
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "device 'cuda': %s has no ferry_cuda_backend_create", path);
    return create(opts, out);
}

ferry_status backend_create(const char *name, const backend_opts *opts, backend **out)
{
    *out = NULL;
    if (strcmp(name, "cpu") == 0) return cpu_backend_create(opts, out);
    if (strcmp(name, "cpu-split") == 0) return split_backend_create(opts, out);
    if (strcmp(name, "cuda") == 0) {
        /* the CPU kernels' choices mean nothing there: refused rather than ignored */
        if (opts && opts->isa && *opts->isa && strcmp(opts->isa, "auto") != 0)
            return ferry_fail(FERRY_ERR_INVALID, "cpu_isa %s: applies to the CPU backends (cpu, cpu-split), not cuda",
                              opts->isa);
        if (opts && opts->activations && *opts->activations && strcmp(opts->activations, "exact") != 0)
            return ferry_fail(FERRY_ERR_INVALID,
                              "cpu_activations %s: applies to the CPU backends (cpu, cpu-split), not cuda",
                              opts->activations);
        return cuda_backend_open(opts, out);
    }
    return ferry_fail(FERRY_ERR_INVALID, "unknown device '%s' (expected cpu, cpu-split or cuda)", name);
}

void backend_prefault(backend *be, void *dst, size_t bytes)
{
    static const char zeros[1u << 16];
    for (size_t off = 0; off < bytes; off += sizeof zeros)
        be->ops->upload(be, (char *)dst + off, zeros, bytes - off < sizeof zeros ? bytes - off : sizeof zeros);
    be->ops->sync(be);
}

void backend_warn_unpinned(size_t bytes)
{
    static atomic_bool said;
    if (atomic_exchange(&said, true)) return;
    char b[32];
    fprintf(stderr, "ferry: warning: could not pin %s of host memory; using pageable memory (host -> device copies "
                    "from it are slower)\n", util_fmt_bytes(bytes, b, sizeof b));
}
