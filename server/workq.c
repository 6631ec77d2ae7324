/*
 * workq.c - the front ends' worker threads: a FIFO of (fn, arg) items under
 * one mutex, served by a fixed set of threads. See workq.h.
 */
#define _GNU_SOURCE
#include "workq.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define WORKQ_MAX_THREADS 16

typedef struct item {
    struct item *next;
    void (*fn)(void *);
    void *arg;
} item;

struct workq {
    pthread_mutex_t mu;
    pthread_cond_t cond; /* head or stop changed */
    item *head, *tail;
    bool stop;
    pthread_t threads[WORKQ_MAX_THREADS];
    int n_threads;
};

static void *workq_main(void *arg)
{
    workq *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->head && !q->stop) pthread_cond_wait(&q->cond, &q->mu);
        item *it = q->head;
        if (!it) break; /* stopping, and nothing left */
        if (!(q->head = it->next)) q->tail = NULL;
        pthread_mutex_unlock(&q->mu);
        it->fn(it->arg);
        free(it);
        pthread_mutex_lock(&q->mu);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

workq *workq_new(int threads, const char *name)
{
    workq *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cond, NULL);
    if (threads > WORKQ_MAX_THREADS) threads = WORKQ_MAX_THREADS;
    while (q->n_threads < threads && pthread_create(&q->threads[q->n_threads], NULL, workq_main, q) == 0) {
        if (name) pthread_setname_np(q->threads[q->n_threads], name);
        q->n_threads++;
    }
    if (q->n_threads < threads)
        fprintf(stderr, "ferry: warning: %s: %d of %d worker threads started; the rest of the work runs inline\n",
                name ? name : "workq", q->n_threads, threads);
    return q;
}

int workq_threads(const workq *q) { return q ? q->n_threads : 0; }

bool workq_post(workq *q, void (*fn)(void *), void *arg)
{
    item *it = q && q->n_threads ? malloc(sizeof *it) : NULL;
    if (!it) {
        fn(arg);
        return false;
    }
    *it = (item){NULL, fn, arg};
    pthread_mutex_lock(&q->mu);
    if (q->tail) q->tail->next = it;
    else q->head = it;
    q->tail = it;
    pthread_cond_signal(&q->cond);
    pthread_mutex_unlock(&q->mu);
    return true;
}

void workq_free(workq *q)
{
    if (!q) return;
    pthread_mutex_lock(&q->mu);
    q->stop = true;
    pthread_cond_broadcast(&q->cond);
    pthread_mutex_unlock(&q->mu);
    for (int i = 0; i < q->n_threads; i++) pthread_join(q->threads[i], NULL);
    for (item *it = q->head, *next; it; it = next) { /* no thread ever ran them */
        next = it->next;
        it->fn(it->arg);
        free(it);
    }
    pthread_cond_destroy(&q->cond);
    pthread_mutex_destroy(&q->mu);
    free(q);
}
