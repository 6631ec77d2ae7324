/*
 * pool.h - the CPU backend's worker threads: a fork-join parallel-for.
 *
 * pool_run hands tasks 0..n-1 to the workers and the calling thread (worker
 * 0), and returns when all are done. Workers spin briefly between runs
 * before sleeping, because a decode step issues hundreds of short runs.
 */
#ifndef FERRY_CPU_POOL_H
#define FERRY_CPU_POOL_H

typedef struct pool pool;
typedef void (*pool_fn)(void *ctx, int task, int worker);

/* n_threads includes the caller; 0 means one per online core. */
pool *pool_create(int n_threads);
void pool_free(pool *p);
int pool_size(const pool *p);
void pool_run(pool *p, int n_tasks, pool_fn fn, void *ctx);

#endif
