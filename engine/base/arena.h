/*
 * arena.h - a bump allocator: allocations that live until the arena is
 * reset or freed all at once (a tokenizer's tables, a chat template's
 * parse tree and values). Blocks of at least `block_min` bytes; an optional
 * limit on the bytes held, so that hostile input (a template, a tokenizer
 * file) cannot make the server allocate without bound.
 */
#ifndef FERRY_ARENA_H
#define FERRY_ARENA_H

#include <stdbool.h>
#include <stddef.h>

typedef struct arena_block arena_block;

typedef struct {
    arena_block *head; /* the block allocations come from */
    size_t block_min;  /* bytes of a new block at least; 0: 64 KiB */
    size_t limit;      /* held may not pass this; 0: no limit */
    size_t held;       /* bytes of blocks allocated */
    bool over;         /* an allocation was refused because of the limit */
    bool oom;          /* an allocation failed for want of memory */
} mem_arena;

/* n bytes, 16-aligned; NULL when out of memory (oom) or past the limit (over). */
void *arena_alloc(mem_arena *a, size_t n);
/* Grows the newest allocation in place when it is the last of its block,
 * else copies it to a new place with as much room again (so that repeated
 * growth is amortized; near the limit, without the room). */
void *arena_grow(mem_arena *a, void *p, size_t old_n, size_t new_n);
/* A NUL-terminated copy of s[0..n). */
char *arena_strdup(mem_arena *a, const char *s, size_t n);
/* Forgets every allocation but keeps the newest block for reuse. */
void arena_reset(mem_arena *a);
void arena_free(mem_arena *a);

#endif
