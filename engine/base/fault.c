/*
 * fault.c - see fault.h.
 *
 * FERRY_FAULT is parsed on the first fault_hit (and again by fault_reset)
 * under a mutex; after that the hot path is one atomic load of `g_state`,
 * which says whether any fault is armed at all. Counters are atomics so that
 * I/O threads and the engine thread may count events concurrently, and the
 * "Nth event" each fault names is well defined across threads. A malformed
 * FERRY_FAULT is a test-author mistake, not a runtime outcome: it is
 * reported once on stderr and the bad item ignored.
 */
#define _GNU_SOURCE
#include "fault.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { STATE_UNPARSED, STATE_OFF, STATE_ARMED };

static const char *const g_names[FAULT_COUNT] = {
    [FAULT_READ_SHORT] = "read_short", [FAULT_READ_EIO] = "read_eio",   [FAULT_WRITE_ENOSPC] = "write_enospc",
    [FAULT_WRITE_EIO] = "write_eio",   [FAULT_FSYNC_EIO] = "fsync_eio", [FAULT_HOST_ALLOC] = "host_alloc",
    [FAULT_HOST_PIN] = "host_pin",     [FAULT_DEV_ALLOC] = "dev_alloc", [FAULT_KV_BLOCK] = "kv_block",
};

static _Atomic int g_state = STATE_UNPARSED;
static _Atomic unsigned long g_every[FAULT_COUNT]; /* N from FERRY_FAULT; 0: not armed */
static _Atomic unsigned long g_seen[FAULT_COUNT];  /* events counted so far */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

/* Parses FERRY_FAULT into g_every, zeroes the counters and publishes the
 * state last, so that a thread that sees STATE_ARMED sees the limits too.
 * Caller holds g_lock. */
static void parse_env(void)
{
    for (int k = 0; k < FAULT_COUNT; k++) {
        atomic_store(&g_every[k], 0);
        atomic_store(&g_seen[k], 0);
    }
    const char *env = getenv("FERRY_FAULT");
    bool armed = false;
    char *copy = env ? strdup(env) : NULL;
    char *save = NULL;
    for (char *item = copy ? strtok_r(copy, ",", &save) : NULL; item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        int kind = -1;
        if (eq) {
            *eq = '\0';
            for (int k = 0; k < FAULT_COUNT; k++)
                if (strcmp(item, g_names[k]) == 0) kind = k;
        }
        char *end = NULL;
        unsigned long n = eq ? strtoul(eq + 1, &end, 10) : 0;
        if (kind < 0 || n == 0 || end == eq + 1 || *end != '\0') {
            if (eq) *eq = '=';
            char kinds[256] = "";
            for (int k = 0; k < FAULT_COUNT; k++)
                snprintf(kinds + strlen(kinds), sizeof kinds - strlen(kinds), "%s%s", k ? ", " : "", g_names[k]);
            fprintf(stderr, "ferry: warning: FERRY_FAULT: ignoring '%s' (expected KIND=N with N >= 1, KIND one of %s)\n",
                    item, kinds);
            continue;
        }
        atomic_store(&g_every[kind], n);
        armed = true;
    }
    free(copy);
    atomic_store_explicit(&g_state, armed ? STATE_ARMED : STATE_OFF, memory_order_release);
}

bool fault_hit(fault_kind kind)
{
    int state = atomic_load_explicit(&g_state, memory_order_acquire);
    if (state == STATE_OFF) return false;
    if (state == STATE_UNPARSED) {
        pthread_mutex_lock(&g_lock);
        if (atomic_load_explicit(&g_state, memory_order_acquire) == STATE_UNPARSED) parse_env();
        pthread_mutex_unlock(&g_lock);
        if (atomic_load_explicit(&g_state, memory_order_acquire) == STATE_OFF) return false;
    }
    if ((unsigned)kind >= FAULT_COUNT) return false;
    unsigned long every = atomic_load(&g_every[kind]);
    if (every == 0) return false;
    unsigned long nth = atomic_fetch_add(&g_seen[kind], 1) + 1;
    /* read_short models a device that keeps returning short reads; the
     * others model a single failure that the caller must survive. */
    return kind == FAULT_READ_SHORT ? nth % every == 0 : nth == every;
}

void fault_reset(void)
{
    pthread_mutex_lock(&g_lock);
    parse_env();
    pthread_mutex_unlock(&g_lock);
}
