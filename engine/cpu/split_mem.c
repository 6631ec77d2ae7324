/*
 * split_mem.c - the device memory of the cpu-split backend: ordinary heap
 * allocations, kept in a table sorted by address so that every pointer the
 * backend is handed can be checked to be (or not to be) device memory.
 *
 * Fresh and released allocations are filled with 0xFF bytes, a NaN in every
 * float format compute reads: a staging slot read before its copy landed,
 * or a buffer read after it was released, turns the outputs into NaN rather
 * than into plausible numbers.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "split.h"

#define POISON 0xFF

typedef struct {
    uintptr_t at;
    size_t bytes;
} region;

struct split_mem {
    pthread_mutex_t mu;
    region *r; /* sorted by at; disjoint */
    size_t n, cap;
};

split_mem *split_mem_create(void)
{
    split_mem *m = calloc(1, sizeof *m);
    if (m) pthread_mutex_init(&m->mu, NULL);
    return m;
}

void split_mem_free(split_mem *m)
{
    if (!m) return;
    for (size_t i = 0; i < m->n; i++) free((void *)m->r[i].at); /* leaked by the caller; not ours to report */
    pthread_mutex_destroy(&m->mu);
    free(m->r);
    free(m);
}

/* Index of the first region with at > p (with mu held). */
static size_t upper(const split_mem *m, uintptr_t p)
{
    size_t lo = 0, hi = m->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->r[mid].at <= p) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

void *split_mem_alloc(split_mem *m, size_t bytes)
{
    if (bytes == 0) bytes = 1;
    void *p = NULL;
    /* 4096-aligned like the CPU backend's staging slots; 256 would do for compute */
    if (posix_memalign(&p, 4096, bytes) != 0) return NULL;
    memset(p, POISON, bytes);
    pthread_mutex_lock(&m->mu);
    if (m->n == m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 64;
        region *r = realloc(m->r, cap * sizeof *r);
        if (!r) {
            pthread_mutex_unlock(&m->mu);
            free(p);
            return NULL;
        }
        m->r = r;
        m->cap = cap;
    }
    size_t i = upper(m, (uintptr_t)p);
    memmove(&m->r[i + 1], &m->r[i], (m->n - i) * sizeof *m->r);
    m->r[i] = (region){(uintptr_t)p, bytes};
    m->n++;
    pthread_mutex_unlock(&m->mu);
    return p;
}

void split_mem_release(split_mem *m, void *p)
{
    if (!p) return;
    pthread_mutex_lock(&m->mu);
    size_t i = upper(m, (uintptr_t)p);
    if (i == 0 || m->r[i - 1].at != (uintptr_t)p) {
        fprintf(stderr, "ferry: internal error: cpu-split: release of %p, which is not a device allocation\n", p);
        abort();
    }
    size_t bytes = m->r[i - 1].bytes;
    memmove(&m->r[i - 1], &m->r[i], (m->n - i) * sizeof *m->r);
    m->n--;
    pthread_mutex_unlock(&m->mu);
    memset(p, POISON, bytes);
    free(p);
}

bool split_mem_holds(split_mem *m, const void *p, size_t bytes)
{
    uintptr_t a = (uintptr_t)p;
    pthread_mutex_lock(&m->mu);
    size_t i = upper(m, a);
    bool in = i > 0 && a - m->r[i - 1].at <= m->r[i - 1].bytes && bytes <= m->r[i - 1].bytes - (a - m->r[i - 1].at);
    pthread_mutex_unlock(&m->mu);
    return in;
}

/* True when [p, p + bytes) overlaps some allocation. */
static bool touches(split_mem *m, const void *p, size_t bytes)
{
    uintptr_t a = (uintptr_t)p, last = a + (bytes ? bytes - 1 : 0);
    pthread_mutex_lock(&m->mu);
    size_t i = upper(m, last); /* regions [0, i) start at or below the last byte */
    bool hit = i > 0 && m->r[i - 1].at + m->r[i - 1].bytes > a;
    pthread_mutex_unlock(&m->mu);
    return hit;
}

void split_mem_check(split_mem *m, const void *p, size_t bytes, bool device, const char *who, const char *what)
{
    if (device ? split_mem_holds(m, p, bytes) : !touches(m, p, bytes)) return;
    fprintf(stderr, "ferry: internal error: cpu-split: %s: %s (%p, %zu bytes) is %s\n", who, what, p, bytes,
            device ? "not device memory" : "device memory, where host memory was expected");
    abort();
}
