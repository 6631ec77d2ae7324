/*
 * arena.c - the bump allocator. See arena.h.
 */
#include "arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct arena_block {
    arena_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

#define ARENA_BLOCK_MIN 65536

static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

/* n bytes; when a new block is needed, it keeps `room` more bytes free
 * after them (so that a growing allocation can grow in place) */
static void *alloc_room(mem_arena *a, size_t n, size_t room)
{
    if (n > SIZE_MAX / 4 || room > SIZE_MAX / 4) return NULL;
    n = align16(n ? n : 1);
    arena_block *b = a->head;
    if (b && b->cap - b->used >= n) {
        void *p = b->data + b->used;
        b->used += n;
        return p;
    }
    size_t min = a->block_min ? a->block_min : ARENA_BLOCK_MIN;
    size_t cap = n + room > min ? n + room : min, want = sizeof *b + cap;
    if (a->limit && (want > a->limit - a->held || a->held > a->limit)) {
        a->over = true;
        return NULL;
    }
    b = malloc(want);
    if (!b) {
        a->oom = true;
        return NULL;
    }
    a->held += want;
    b->cap = cap;
    b->used = n;
    if (a->head && n > min && room == 0) {
        /* a big allocation goes behind the head, so the head's room is not wasted */
        b->next = a->head->next;
        a->head->next = b;
    } else {
        b->next = a->head;
        a->head = b;
    }
    return b->data;
}

void *arena_alloc(mem_arena *a, size_t n) { return alloc_room(a, n, 0); }

void *arena_grow(mem_arena *a, void *p, size_t old_n, size_t new_n)
{
    if (new_n <= old_n && p) return p;
    arena_block *b = a->head;
    if (p && b && (unsigned char *)p + align16(old_n) == b->data + b->used &&
        align16(new_n) - align16(old_n) <= b->cap - b->used) {
        b->used += align16(new_n) - align16(old_n);
        return p;
    }
    void *q = alloc_room(a, new_n, new_n);
    if (!q && a->over) {
        a->over = false; /* near the limit: without the room then */
        q = alloc_room(a, new_n, 0);
    }
    if (q && p && old_n) memcpy(q, p, old_n);
    return q;
}

char *arena_strdup(mem_arena *a, const char *s, size_t n)
{
    char *p = arena_alloc(a, n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

void arena_reset(mem_arena *a)
{
    if (!a->head) return;
    arena_block *keep = a->head, *b = keep->next;
    while (b) {
        arena_block *next = b->next;
        a->held -= sizeof *b + b->cap;
        free(b);
        b = next;
    }
    keep->next = NULL;
    keep->used = 0;
    a->over = a->oom = false;
}

void arena_free(mem_arena *a)
{
    arena_block *b = a->head;
    while (b) {
        arena_block *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
    a->held = 0;
    a->over = a->oom = false;
}
