/*
 * split_stream.c - the streams of the cpu-split backend: commands run in
 * submission order, by a thread of the stream's own or inline on the
 * submitting thread, and counted so that events can name "the first n
 * commands of stream s". See split.h.
 *
 * Commands wait in a ring; a submitter finds it full only when a stream is
 * far behind, and then waits, as a GPU's launch queue makes the host wait.
 * Every counter is read and written under the backend's mutex; a command
 * runs without it.
 */
#include <stdlib.h>

#include "split.h"

#define RING 1024

struct split_stream {
    bool threaded;
    pthread_mutex_t *mu;
    pthread_cond_t *cv_done; /* broadcast whenever any stream completes a command */
    pthread_cond_t cv_work;  /* commands were submitted, or stop */
    split_exec_fn exec;
    void *ctx;
    split_cmd ring[RING];    /* commands done .. submitted - 1, at index % RING */
    uint64_t submitted, done;
    bool stop;
    pthread_t thread;
};

uint64_t split_stream_submitted(const split_stream *s) { return s->submitted; }

bool split_stream_reached(const split_stream *s, uint64_t seq) { return s->done >= seq; }

/* Runs c with *mu not held. */
static void run(split_stream *s, const split_cmd *c)
{
    if (c->op != SPLIT_WAIT) {
        s->exec(s->ctx, c);
        return;
    }
    pthread_mutex_lock(s->mu);
    while (!split_stream_reached(c->on, c->seq)) pthread_cond_wait(s->cv_done, s->mu);
    pthread_mutex_unlock(s->mu);
}

static void *stream_main(void *arg)
{
    split_stream *s = arg;
    pthread_mutex_lock(s->mu);
    for (;;) {
        while (!s->stop && s->done == s->submitted) pthread_cond_wait(&s->cv_work, s->mu);
        if (s->done == s->submitted) break; /* stop, and nothing left */
        split_cmd c = s->ring[s->done % RING];
        pthread_mutex_unlock(s->mu);
        run(s, &c);
        pthread_mutex_lock(s->mu);
        s->done++;
        pthread_cond_broadcast(s->cv_done);
    }
    pthread_mutex_unlock(s->mu);
    return NULL;
}

ferry_status split_stream_create(const char *name, bool threaded, pthread_mutex_t *mu, pthread_cond_t *cv_done,
                                 split_exec_fn exec, void *ctx, split_stream **out)
{
    *out = NULL;
    split_stream *s = calloc(1, sizeof *s);
    if (!s) return ferry_fail(FERRY_ERR_NOMEM, "device 'cpu-split': out of memory for the %s stream", name);
    *s = (split_stream){.threaded = threaded, .mu = mu, .cv_done = cv_done, .exec = exec, .ctx = ctx};
    pthread_cond_init(&s->cv_work, NULL);
    if (threaded && pthread_create(&s->thread, NULL, stream_main, s) != 0) {
        pthread_cond_destroy(&s->cv_work);
        free(s);
        return ferry_fail(FERRY_ERR_NOMEM, "device 'cpu-split': cannot start the %s stream's thread", name);
    }
    *out = s;
    return FERRY_OK;
}

void split_stream_free(split_stream *s)
{
    if (!s) return;
    if (s->threaded) {
        pthread_mutex_lock(s->mu);
        s->stop = true;
        pthread_cond_signal(&s->cv_work);
        pthread_mutex_unlock(s->mu);
        pthread_join(s->thread, NULL); /* it runs what was queued first */
    }
    pthread_cond_destroy(&s->cv_work);
    free(s);
}

void split_stream_submit(split_stream *s, const split_cmd *c)
{
    if (!s->threaded) {
        /* inline: the command has completed when submit returns */
        run(s, c);
        pthread_mutex_lock(s->mu);
        s->submitted++;
        s->done++;
        pthread_cond_broadcast(s->cv_done);
        pthread_mutex_unlock(s->mu);
        return;
    }
    pthread_mutex_lock(s->mu);
    while (s->submitted - s->done == RING) pthread_cond_wait(s->cv_done, s->mu);
    s->ring[s->submitted % RING] = *c;
    s->submitted++;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(s->mu);
}

void split_stream_drain(split_stream *s)
{
    pthread_mutex_lock(s->mu);
    while (s->done < s->submitted) pthread_cond_wait(s->cv_done, s->mu);
    pthread_mutex_unlock(s->mu);
}
