/*
 * pipeline.c - the step walk and the fetcher thread. See pipeline.h for the
 * slot protocol; its invariants P1..P8 are cited where they are kept.
 */
#define _GNU_SOURCE
#include "pipeline.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/aio.h"
#include "io/crc32c.h"
#include "base/json.h"
#include "base/util.h"

#define AIO_DEPTH 16

/* ---- mutants ----------------------------------------------------------------
 * Deliberate ordering bugs, for `make test-mutants` only: a build with
 * -DFERRY_PIPELINE_MUTANT=N breaks one invariant, and the cpu-split tests
 * must then fail. 0 (every normal build) compiles each hook away.
 *   1  release a slot before queuing the ops that read it (P3)
 *   2  compute does not wait for the slot's `copied` event (P5)
 *   3  a disk read reuses the bounce buffer without event_sync (P6)
 *   4  the copy into a slot does not wait for its `computed` event (P3) */
#ifndef FERRY_PIPELINE_MUTANT
#define FERRY_PIPELINE_MUTANT 0
#endif
#define MUTANT(n) (FERRY_PIPELINE_MUTANT == (n))

enum { SLOT_FREE, SLOT_FILLING, SLOT_READY };
enum { TRACK_DISK, TRACK_COPY, TRACK_COMPUTE };

typedef struct {
    void *dev;          /* plan slot_size[i] bytes of device memory: what compute reads */
    void *host;         /* pinned bounce buffer for disk reads, slot_bounce[i] bytes (non-unified only) */
    bool host_pinned;
    be_event *copied;   /* recorded on the copy stream once the slot is whole */
    be_event *computed; /* recorded on the compute stream after the ops that read it */
    int state;
    uint64_t seq;       /* the fetch it holds (FILLING/READY) */
    ferry_status st;
    char *msg;          /* st's message (heap, whole) until compute takes it */
    double t_fetch;     /* when its fetch started */
} stage_slot;

typedef struct {
    int track, group;
    double t0, t1;
} trace_ev;

struct pipeline {
    backend *be;
    store *s;
    const plan *p;
    int n_streamed;
    int *streamed; /* groups on host/disk, in execution order */
    int n_slots;
    stage_slot *slots;
    aio *aio;

    pthread_t thread;
    bool running, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv_fetch, cv_compute;
    uint64_t next_fetch;   /* mu: next fetch the fetcher claims */
    uint64_t released;     /* mu: fetches compute has released */
    uint64_t next_compute; /* compute thread only */
    int in_flight;         /* mu: claimed, not yet READY */
    double busy_since;     /* mu: start of the current in-flight period */

    bool verify;           /* check each disk read's CRC-32C (set before the first step) */
    bool *damaged;         /* mu: [n_groups] a read of it failed its check */

    pipeline_stats stats;  /* mu for the fetcher's fields */
    bool tracing;
    double t_origin;
    trace_ev *trace;
    size_t n_trace, cap_trace; /* mu */
};

static void trace_add(pipeline *pl, int track, int group, double t0, double t1)
{
    if (pl->tracing && pl->n_trace < pl->cap_trace) pl->trace[pl->n_trace++] = (trace_ev){track, group, t0, t1};
}

/* ---- fetcher ---------------------------------------------------------------- */

/* A copy of msg for another thread to report; never truncated. */
static char *msg_dup(const char *msg)
{
    char *m = strdup(msg);
    return m ? m : strdup("out of memory copying an error message");
}

/* With pl->mu held. */
static void mark_ready(pipeline *pl, stage_slot *sl, ferry_status st, const char *msg)
{
    sl->st = st;
    free(sl->msg);
    sl->msg = st != FERRY_OK ? msg_dup(msg ? msg : ferry_status_name(st)) : NULL; /* P7 */
    sl->state = SLOT_READY;
    if (--pl->in_flight == 0) pl->stats.fetch_s += util_now() - pl->busy_since;
    pthread_cond_broadcast(&pl->cv_compute);
}

/* Queues the host -> device copy of a slot; it waits for the compute that
 * last read the slot (stream order), then records `copied`. */
static void copy_into_slot(pipeline *pl, stage_slot *sl, const void *src, uint64_t bytes, int group)
{
    backend *be = pl->be;
    double t0 = util_now();
    if (!MUTANT(4)) be->ops->stream_wait(be, STREAM_COPY, sl->computed); /* P3 */
    be->ops->copy_async(be, sl->dev, src, (size_t)bytes);
    be->ops->event_record(be, sl->copied, STREAM_COPY); /* P4, P5 */
    pthread_mutex_lock(&pl->mu);
    trace_add(pl, TRACK_COPY, group, t0, util_now());
    pthread_mutex_unlock(&pl->mu);
}

/* Starts fetch q into sl (pl->mu not held). Host groups are copied at once;
 * disk groups are queued on aio and finish in finish_read. */
static void start_fetch(pipeline *pl, uint64_t q, stage_slot *sl)
{
    int g = pl->streamed[q % (uint64_t)pl->n_streamed];
    const plan_group *pg = &pl->p->groups[g];
    sl->t_fetch = util_now();
    if (pg->tier == TIER_HOST) {
        copy_into_slot(pl, sl, store_group_source(pl->s, g).resident, pg->bytes, g);
        pthread_mutex_lock(&pl->mu);
        pl->stats.bytes[TIER_HOST] += pg->bytes;
        mark_ready(pl, sl, FERRY_OK, NULL);
        pthread_mutex_unlock(&pl->mu);
        return;
    }
    store_source src = store_group_source(pl->s, g);
    void *dst = pl->p->opts.unified ? sl->dev : sl->host;
    /* P6: the bounce buffer is reused only after its last copy to the device */
    if (!pl->p->opts.unified && !MUTANT(3)) pl->be->ops->event_sync(pl->be, sl->copied);
    ferry_status st = aio_read(pl->aio, src.fd, src.path, src.offset, dst, (size_t)src.bytes, q);
    if (st != FERRY_OK) {
        pthread_mutex_lock(&pl->mu);
        mark_ready(pl, sl, st, ferry_errmsg()); /* P7 */
        pthread_mutex_unlock(&pl->mu);
    }
}

/* The bytes of a disk read against the manifest's CRC-32C: the check runs
 * on the fetcher thread while the next reads are in flight. */
static ferry_status verify_read(pipeline *pl, int g, const void *data, char **msg)
{
    char buf[FERRY_MSG_MAX];
    ferry_status st = store_check_read(pl->s, g, data, buf, sizeof buf);
    if (st != FERRY_OK) *msg = msg_dup(buf);
    return st;
}

static void finish_read(pipeline *pl, const aio_done *d)
{
    stage_slot *sl = &pl->slots[plan_slot_of(pl->p, d->tag)];
    int g = pl->streamed[d->tag % (uint64_t)pl->n_streamed];
    uint64_t bytes = pl->p->groups[g].bytes;
    double t1 = util_now();
    ferry_status st = d->st;
    char *bad = NULL;
    if (st == FERRY_OK && pl->verify)
        st = verify_read(pl, g, pl->p->opts.unified ? sl->dev : sl->host, &bad);
    bool short_blob = st != FERRY_OK && !bad && store_blob_short(pl->s, g);
    if (st == FERRY_OK && !pl->p->opts.unified) copy_into_slot(pl, sl, sl->host, bytes, g);
    pthread_mutex_lock(&pl->mu);
    trace_add(pl, TRACK_DISK, g, sl->t_fetch, t1);
    if (st == FERRY_OK) pl->stats.bytes[TIER_DISK] += bytes;
    if (bad || short_blob) pl->damaged[g] = true;
    mark_ready(pl, sl, st, st == FERRY_OK ? NULL : bad ? bad : d->msg);
    pthread_mutex_unlock(&pl->mu);
    free(bad);
}

void pipeline_set_verify(pipeline *pl, bool on) { pl->verify = on; }

int pipeline_damaged(pipeline *pl, bool *out)
{
    int n = 0;
    pthread_mutex_lock(&pl->mu);
    for (int g = 0; g < pl->p->n_groups; g++) n += out[g] = pl->damaged[g];
    pthread_mutex_unlock(&pl->mu);
    return n;
}

void pipeline_clear_damaged(pipeline *pl, int g)
{
    pthread_mutex_lock(&pl->mu);
    pl->damaged[g] = false;
    pthread_mutex_unlock(&pl->mu);
}

static void *fetcher_main(void *arg)
{
    pipeline *pl = arg;
    aio_done done[8];
    pthread_mutex_lock(&pl->mu);
    for (;;) {
        uint64_t q = pl->next_fetch;
        /* P2: fetch q may start once it is at most prefetch ahead of the
         * fetch compute needs next, and take its slot once the fetch that
         * held it before was released */
        stage_slot *sl = &pl->slots[plan_slot_of(pl->p, q)];
        if (!pl->stop && q <= pl->released + (uint64_t)pl->p->prefetch && sl->state == SLOT_FREE) {
            sl->state = SLOT_FILLING;
            sl->seq = q;
            pl->next_fetch++;
            if (pl->in_flight++ == 0) pl->busy_since = util_now();
            pthread_mutex_unlock(&pl->mu);
            start_fetch(pl, q, sl);
            pthread_mutex_lock(&pl->mu);
            continue;
        }
        if (pl->aio && aio_pending(pl->aio) > 0) {
            pthread_mutex_unlock(&pl->mu);
            int n = aio_reap(pl->aio, done, 8, true);
            for (int i = 0; i < n; i++) finish_read(pl, &done[i]);
            pthread_mutex_lock(&pl->mu);
            continue;
        }
        if (pl->stop) break;
        pthread_cond_wait(&pl->cv_fetch, &pl->mu);
    }
    pthread_mutex_unlock(&pl->mu);
    return NULL;
}

/* ---- lifecycle -------------------------------------------------------------- */

ferry_status pipeline_create(pipeline **out, backend *be, store *s, const plan *p)
{
    *out = NULL;
    pipeline *pl = calloc(1, sizeof *pl);
    if (!pl) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    pl->be = be;
    pl->s = s;
    pl->p = p;
    pthread_mutex_init(&pl->mu, NULL);
    pthread_cond_init(&pl->cv_fetch, NULL);
    pthread_cond_init(&pl->cv_compute, NULL);
    ferry_status st = FERRY_OK;
    pl->verify = true;
    pl->streamed = calloc((size_t)p->n_groups, sizeof *pl->streamed);
    pl->damaged = calloc((size_t)p->n_groups, sizeof *pl->damaged);
    if (!pl->streamed || !pl->damaged) {
        st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int g = 0; g < p->n_groups; g++)
        if (p->groups[g].kind != GROUP_EMBED && p->groups[g].kind != GROUP_EXPERT && p->groups[g].tier != TIER_DEVICE)
            pl->streamed[pl->n_streamed++] = g;
    FERRY_ASSERT(pl->n_streamed == p->n_streamed);
    if (pl->n_streamed == 0) {
        *out = pl;
        return FERRY_OK;
    }
    pl->n_slots = p->n_stage_slots;
    pl->slots = calloc((size_t)pl->n_slots, sizeof *pl->slots);
    if (!pl->slots) {
        st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        goto fail;
    }
    bool any_disk = false; /* a streamed group on disk (experts are read by experts.c) */
    for (int q = 0; q < pl->n_streamed; q++) any_disk |= p->groups[pl->streamed[q]].tier == TIER_DISK;
    char b[32], c[32];
    for (int i = 0; i < pl->n_slots; i++) {
        stage_slot *sl = &pl->slots[i];
        sl->dev = be->ops->alloc(be, (size_t)p->slot_size[i]);
        sl->copied = be->ops->event_create(be);
        sl->computed = be->ops->event_create(be);
        if (!sl->dev || !sl->copied || !sl->computed) {
            st = ferry_fail(FERRY_ERR_NOMEM, "cannot allocate staging slot %d of %s (%d slots, %s in all)", i,
                            util_fmt_bytes(p->slot_size[i], b, sizeof b), pl->n_slots,
                            util_fmt_bytes(p->stage_bytes, c, sizeof c));
            goto fail;
        }
        /* the first reads into a slot must not fault its pages in: a
         * cold burst after startup spent half its time zero-filling them */
        backend_prefault(be, sl->dev, (size_t)p->slot_size[i]);
        if (p->slot_bounce[i] && !p->opts.unified) {
            sl->host = be->ops->host_alloc(be, (size_t)p->slot_bounce[i], &sl->host_pinned);
            if (!sl->host) {
                st = ferry_fail(FERRY_ERR_NOMEM, "cannot allocate disk bounce buffers (one of %s, %s in all)",
                                util_fmt_bytes(p->slot_bounce[i], b, sizeof b),
                                util_fmt_bytes(p->host_stage_bytes, c, sizeof c));
                goto fail;
            }
            if (!sl->host_pinned) memset(sl->host, 0, (size_t)p->slot_bounce[i]); /* pageable: fault it in now */
        }
    }
    if (any_disk && (st = aio_create(AIO_DEPTH, &pl->aio)) != FERRY_OK) goto fail;
    *out = pl;
    return FERRY_OK;
fail:
    pipeline_free(pl);
    return st;
}

ferry_status pipeline_start(pipeline *pl)
{
    if (pl->running || pl->n_streamed == 0) return FERRY_OK;
    if (pthread_create(&pl->thread, NULL, fetcher_main, pl) != 0)
        return ferry_fail(FERRY_ERR_NOMEM, "cannot start the fetcher thread");
    pl->running = true;
    return FERRY_OK;
}

static void stop_fetcher(pipeline *pl)
{
    if (!pl->running) return;
    pthread_mutex_lock(&pl->mu);
    pl->stop = true;
    pthread_cond_broadcast(&pl->cv_fetch);
    pthread_mutex_unlock(&pl->mu);
    pthread_join(pl->thread, NULL); /* P8, P9: it drains its reads before exiting */
    pl->running = false;
    pl->stop = false;
}

void pipeline_quiesce(pipeline *pl)
{
    stop_fetcher(pl);
    for (int i = 0; pl->slots && i < pl->n_slots; i++) {
        stage_slot *sl = &pl->slots[i];
        pl->be->ops->event_sync(pl->be, sl->copied); /* P9: the copies have landed */
        free(sl->msg);
        sl->msg = NULL;
        sl->state = SLOT_FREE;
    }
    pthread_mutex_lock(&pl->mu);
    pl->next_fetch = pl->released = pl->next_compute; /* P9 */
    pl->in_flight = 0;
    pthread_mutex_unlock(&pl->mu);
}

void pipeline_free(pipeline *pl)
{
    if (!pl) return;
    stop_fetcher(pl);
    for (int i = 0; pl->slots && i < pl->n_slots; i++) {
        stage_slot *sl = &pl->slots[i];
        if (sl->copied) pl->be->ops->event_sync(pl->be, sl->copied); /* P8 */
        free(sl->msg);
        if (sl->dev) pl->be->ops->release(pl->be, sl->dev);
        if (sl->host) pl->be->ops->host_free(pl->be, sl->host, (size_t)pl->p->slot_bounce[i], sl->host_pinned);
        if (sl->copied) pl->be->ops->event_destroy(pl->be, sl->copied);
        if (sl->computed) pl->be->ops->event_destroy(pl->be, sl->computed);
    }
    aio_free(pl->aio);
    pthread_mutex_destroy(&pl->mu);
    pthread_cond_destroy(&pl->cv_fetch);
    pthread_cond_destroy(&pl->cv_compute);
    free(pl->slots);
    free(pl->streamed);
    free(pl->damaged);
    free(pl->trace);
    free(pl);
}

/* ---- the step --------------------------------------------------------------- */

/* Runs group g's units; a layer that fails (a sparse layer whose expert
 * could not be fetched) ends the group with its error. */
static ferry_status compute_group(pipeline *pl, int g, const pipeline_units *u)
{
    const plan_group *pg = &pl->p->groups[g];
    double t0 = util_now();
    ferry_status st = FERRY_OK;
    if (pg->kind == GROUP_LAYERS)
        for (int l = pg->first_layer; st == FERRY_OK && l < pg->first_layer + pg->n_layers; l++) st = u->layer(u->ctx, l);
    else
        u->head(u->ctx);
    double t1 = util_now();
    /* stats are read by other threads (metrics) under mu */
    pthread_mutex_lock(&pl->mu);
    pl->stats.compute_s += t1 - t0;
    trace_add(pl, TRACK_COMPUTE, g, t0, t1);
    pthread_mutex_unlock(&pl->mu);
    return st;
}

/* Hands a slot back to the fetcher: `computed` covers the ops queued on it
 * (P3), and the release lets the fetcher claim it for a later fetch (P2). */
static void release_slot(pipeline *pl, stage_slot *sl)
{
    pl->be->ops->event_record(pl->be, sl->computed, STREAM_COMPUTE);
    pthread_mutex_lock(&pl->mu);
    sl->state = SLOT_FREE;
    pl->released++;
    pthread_cond_signal(&pl->cv_fetch);
    pthread_mutex_unlock(&pl->mu);
}

ferry_status pipeline_step(pipeline *pl, const pipeline_units *u)
{
    const plan *p = pl->p;
    double t_step = util_now();
    ferry_status st = pipeline_start(pl);
    if (st != FERRY_OK) return st;
    char *err = NULL; /* the message of the step's first error, whole (P7) */

    int eg = store_embed_group(pl->s);
    if (p->groups[eg].tier == TIER_DEVICE) {
        store_bind(pl->s, eg, store_group_source(pl->s, eg).resident);
        u->embed(u->ctx);
    } else if ((st = u->embed_rows(u->ctx)) != FERRY_OK) {
        err = msg_dup(ferry_errmsg());
    }

    for (int g = 0; g < p->n_groups; g++) {
        /* the embedding is done above, by rows; experts by the layers that route to them */
        if (p->groups[g].kind == GROUP_EMBED || p->groups[g].kind == GROUP_EXPERT) continue;
        if (p->groups[g].tier == TIER_DEVICE) {
            if (st != FERRY_OK) continue;
            store_bind(pl->s, g, store_group_source(pl->s, g).resident);
            if ((st = compute_group(pl, g, u)) != FERRY_OK) err = msg_dup(ferry_errmsg());
            continue;
        }
        uint64_t q = pl->next_compute++;
        FERRY_ASSERT(pl->streamed[q % (uint64_t)pl->n_streamed] == g); /* P1 */
        stage_slot *sl = &pl->slots[plan_slot_of(p, q)];
        pthread_mutex_lock(&pl->mu);
        double t0 = util_now();
        while (!(sl->state == SLOT_READY && sl->seq == q)) pthread_cond_wait(&pl->cv_compute, &pl->mu); /* P4 */
        pl->stats.stall_s += util_now() - t0;
        if (sl->st != FERRY_OK && st == FERRY_OK) {
            st = sl->st;
            err = sl->msg; /* P7: taken whole */
            sl->msg = NULL;
        }
        pthread_mutex_unlock(&pl->mu);
        if (MUTANT(1)) release_slot(pl, sl);
        if (st == FERRY_OK) {
            if (!MUTANT(2)) pl->be->ops->stream_wait(pl->be, STREAM_COMPUTE, sl->copied); /* P5 */
            store_bind(pl->s, g, sl->dev);
            if ((st = compute_group(pl, g, u)) != FERRY_OK) err = msg_dup(ferry_errmsg());
        }
        if (!MUTANT(1)) release_slot(pl, sl); /* P3; P7: computed or not */
    }
    pthread_mutex_lock(&pl->mu);
    pl->stats.steps++;
    pl->stats.wall_s += util_now() - t_step;
    pthread_mutex_unlock(&pl->mu);
    if (st != FERRY_OK) {
        ferry_fail(st, "%s", err ? err : ferry_status_name(st));
        free(err);
    }
    return st;
}

pipeline_stats pipeline_get_stats(pipeline *pl)
{
    pthread_mutex_lock(&pl->mu);
    pipeline_stats s = pl->stats;
    if (pl->in_flight > 0) s.fetch_s += util_now() - pl->busy_since;
    pthread_mutex_unlock(&pl->mu);
    return s;
}

/* ---- trace ------------------------------------------------------------------ */

ferry_status pipeline_trace_start(pipeline *pl, size_t max_events)
{
    pthread_mutex_lock(&pl->mu);
    free(pl->trace);
    pl->trace = calloc(max_events, sizeof *pl->trace);
    pl->cap_trace = pl->trace ? max_events : 0;
    pl->n_trace = 0;
    pl->t_origin = util_now();
    pl->tracing = pl->trace != NULL;
    pthread_mutex_unlock(&pl->mu);
    return pl->trace ? FERRY_OK : ferry_fail(FERRY_ERR_NOMEM, "out of memory for the trace");
}

static const char *group_label(const plan *p, int g, char *buf, size_t cap)
{
    const plan_group *pg = &p->groups[g];
    if (pg->kind == GROUP_EMBED) return "embed";
    if (pg->kind == GROUP_HEAD) return "head";
    snprintf(buf, cap, "layers %d-%d", pg->first_layer, pg->first_layer + pg->n_layers - 1);
    return buf;
}

ferry_status pipeline_trace_write(pipeline *pl, const char *path)
{
    static const char *tracks[] = {"disk reads", "host->device copies", "compute"};
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    for (int t = 0; t < 3; t++)
        sb_printf(&sb, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": %d, \"args\": {\"name\": \"%s\"}},\n",
                  t + 1, tracks[t]);
    pthread_mutex_lock(&pl->mu);
    char label[48];
    for (size_t i = 0; i < pl->n_trace; i++) {
        const trace_ev *e = &pl->trace[i];
        sb_printf(&sb, "{\"name\": \"%s\", \"ph\": \"X\", \"pid\": 1, \"tid\": %d, \"ts\": %.1f, \"dur\": %.1f, "
                       "\"args\": {\"bytes\": %llu}},\n",
                  group_label(pl->p, e->group, label, sizeof label), e->track + 1, (e->t0 - pl->t_origin) * 1e6,
                  (e->t1 - e->t0) * 1e6, (unsigned long long)pl->p->groups[e->group].bytes);
    }
    pthread_mutex_unlock(&pl->mu);
    sb_puts(&sb, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 1, \"args\": {\"name\": \"ferry\"}}\n]}\n");
    ferry_status st = sb.oom ? ferry_fail(FERRY_ERR_NOMEM, "out of memory writing the trace")
                             : util_write_output(path, sb.data, sb.len);
    sb_free(&sb);
    return st;
}
