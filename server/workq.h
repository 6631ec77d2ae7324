/*
 * workq.h - a few threads that run the front ends' slow steps (parsing a
 * request, rendering a chat template, encoding text) off the threads that
 * serve connections, so that one heavy request never stalls the others on
 * the same thread (health checks, other clients' tokens).
 *
 * Items run in the order posted, each on whichever thread is free. A queue
 * that could start no thread, or an item that finds no memory, is run by
 * the caller at once (workq_post says so), so nothing is ever dropped.
 */
#ifndef FERRY_WORKQ_H
#define FERRY_WORKQ_H

#include <stdbool.h>

typedef struct workq workq;

/* Starts up to `threads` threads; NULL only without memory for the queue. */
workq *workq_new(int threads, const char *name);
/* Queues fn(arg): true. False: the queue has no thread or no memory for the
 * item, and fn(arg) has already run on the caller's thread. */
bool workq_post(workq *q, void (*fn)(void *), void *arg);
/* Threads started (0: every item runs on its poster's thread). */
int workq_threads(const workq *q);
/* Runs what is still queued, joins the threads, frees q (NULL: nothing). */
void workq_free(workq *q);

#endif
