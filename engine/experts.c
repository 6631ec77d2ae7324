/*
 * experts.c - the expert slots and on-demand expert fetches. See experts.h.
 *
 * Why LRU: a slot's use is known only when a step's router has run, and
 * decode routes consecutive tokens of a sequence to overlapping experts
 * (mixtral-offloading, Eliseev and Mazur 2023, measured LRU hit rates of
 * 0.3 to 0.6 on Mixtral with a few slots per layer); LRU keeps exactly the
 * recent ones and needs no counts that outlive the slots. LFU would keep
 * experts popular over the whole history, which batches of unrelated
 * prompts do not share.
 *
 * One run (experts_run) on the compute thread:
 *   1. each routed expert is present (device tier: computed in place; in a
 *      slot: a hit) or missing;
 *   2. the missing ones get slots, least recently used first, never one a
 *      routed expert of this run is in (busy), and their fetches start: a
 *      host-tier expert is one copy on the copy stream, a disk-tier one an
 *      io_uring read of its region of the blob (into the slot where device
 *      memory is host memory, else into a bounce buffer and then a copy);
 *   3. the present ones are computed, while the reads run;
 *   4. the missing ones are computed as they arrive (the first arrived in
 *      the order their fetches started); a slot freed by a computed expert
 *      takes the next fetch that had no slot.
 * Ordering, as the layer pipeline's (pipeline.h P3, P5, P6): a slot's copy
 * waits for its `computed` event on the copy stream; compute on a slot
 * waits for its `copied` event; a bounce buffer is read into only once the
 * host has seen its previous copy complete. Every read is reaped before the
 * run returns, failed or not, so between runs nothing is in flight.
 */
#include "experts.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "io/aio.h"

#define EXPERT_AIO_DEPTH 16 /* 4 MiB requests in flight, as the layer pipeline's */

typedef struct {
    void *dev;          /* expert_slot_bytes of device memory */
    int group;          /* the expert group it holds (or is reading); -1: none */
    uint64_t last_use;  /* LRU clock of its last compute */
    bool busy;          /* holds an expert of the running run */
    bool reading;       /* a read into it (or its bounce buffer) is in flight */
    int item;           /* the running run's item it holds; -1: a speculative fetch no run has claimed */
    bool speculative;   /* filled by experts_prefetch and not computed since */
    int bounce;         /* non-unified: the bounce buffer of its read; -1 */
    be_event *copied, *computed;
} xslot;

typedef struct {
    void *host;         /* non-unified: the read lands here, then is copied */
    bool pinned;
    be_event *copied;   /* its last copy to a slot */
    bool in_use;
} xbounce;

/* The first failure of a run: its status and whole message. */
typedef struct {
    ferry_status st; /* FERRY_OK: none */
    char msg[FERRY_MSG_MAX];
} run_err;

static void fail_run(run_err *e, ferry_status st, const char *msg)
{
    if (e->st != FERRY_OK) return;
    e->st = st;
    snprintf(e->msg, sizeof e->msg, "%s", msg);
}

/* A routed expert of the running run. */
typedef enum { X_DEVICE, X_HIT, X_WAITING, X_READING, X_READY, X_FAILED } xstate;
typedef struct {
    int k;              /* index into ids */
    int group;
    int slot;           /* -1: device tier or none yet */
    xstate state;
} xitem;

struct experts {
    backend *be;
    store *s;
    const plan *p;
    int *layer_first;    /* [n_layers] group of expert 0 of a sparse layer; -1 for a dense one */
    int n_layers;
    int n_slots;
    xslot *slots;
    int *slot_of;        /* [n_groups] the slot holding a group, -1 */
    int n_bounce;
    xbounce *bounce;
    aio *aio;
    uint64_t clock;
    bool verify;
    bool *damaged;       /* [n_groups] */
    xitem *items;        /* [n_experts] the running run */
    int *order;          /* [n_experts] its items: present ones, then in fetch order */
    int reads;           /* reads in flight, claimed or speculative */
    uint64_t keep_from;  /* experts_prefetch: slots used from this clock value on are its prediction's */
    expert_stats run;    /* the running run's figures: compute thread only */
    uint64_t step_bytes;
    pthread_mutex_t mu;  /* stats and damaged: read by metrics threads */
    expert_stats stats;
};

ferry_status experts_create(experts **out, backend *be, store *s, const plan *p)
{
    *out = NULL;
    if (p->first_expert >= p->n_groups) return FERRY_OK;
    experts *x = calloc(1, sizeof *x);
    if (!x) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    x->be = be;
    x->s = s;
    x->p = p;
    x->verify = true;
    pthread_mutex_init(&x->mu, NULL);
    ferry_status st = FERRY_OK;
    int n_experts = 0;
    for (int g = p->first_expert; g < p->n_groups; g++) {
        if (p->groups[g].first_layer + 1 > x->n_layers) x->n_layers = p->groups[g].first_layer + 1;
        if (p->groups[g].expert + 1 > n_experts) n_experts = p->groups[g].expert + 1;
    }
    x->layer_first = malloc((size_t)x->n_layers * sizeof *x->layer_first);
    x->slot_of = malloc((size_t)p->n_groups * sizeof *x->slot_of);
    x->damaged = calloc((size_t)p->n_groups, sizeof *x->damaged);
    x->items = calloc((size_t)n_experts, sizeof *x->items);
    x->order = calloc((size_t)n_experts, sizeof *x->order);
    x->slots = calloc((size_t)p->n_expert_slots + 1, sizeof *x->slots);
    if (!x->layer_first || !x->slot_of || !x->damaged || !x->items || !x->order || !x->slots) {
        st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int l = 0; l < x->n_layers; l++) x->layer_first[l] = -1;
    for (int g = p->n_groups - 1; g >= p->first_expert; g--) x->layer_first[p->groups[g].first_layer] = g;
    for (int g = 0; g < p->n_groups; g++) x->slot_of[g] = -1;

    char b[32];
    for (int i = 0; i < p->n_expert_slots; i++) {
        xslot *sl = &x->slots[i];
        sl->group = -1;
        x->n_slots++;
        sl->dev = be->ops->alloc(be, (size_t)p->expert_slot_bytes);
        sl->copied = be->ops->event_create(be);
        sl->computed = be->ops->event_create(be);
        if (!sl->dev || !sl->copied || !sl->computed) {
            st = ferry_fail(FERRY_ERR_NOMEM, "cannot allocate %d expert slots of %s (--expert-cache)",
                            p->n_expert_slots, util_fmt_bytes(p->expert_slot_bytes, b, sizeof b));
            goto fail;
        }
        backend_prefault(be, sl->dev, (size_t)p->expert_slot_bytes);
    }
    bool any_disk = false;
    for (int g = p->first_expert; g < p->n_groups; g++) any_disk |= p->groups[g].tier == TIER_DISK;
    if (any_disk) {
        if ((st = aio_create(EXPERT_AIO_DEPTH, &x->aio)) != FERRY_OK) goto fail;
        if (!p->opts.unified) {
            uint64_t bytes = p->expert_bounce_bytes / (uint64_t)p->expert_reads;
            x->bounce = calloc((size_t)p->expert_reads, sizeof *x->bounce);
            if (!x->bounce) {
                st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
                goto fail;
            }
            for (int i = 0; i < p->expert_reads; i++) {
                xbounce *bb = &x->bounce[i];
                x->n_bounce++;
                bb->host = be->ops->host_alloc(be, (size_t)bytes, &bb->pinned);
                bb->copied = be->ops->event_create(be);
                if (!bb->host || !bb->copied) {
                    st = ferry_fail(FERRY_ERR_NOMEM, "cannot allocate expert read buffers of %s",
                                    util_fmt_bytes(bytes, b, sizeof b));
                    goto fail;
                }
                if (!bb->pinned) memset(bb->host, 0, (size_t)bytes); /* pageable: fault it in now */
            }
        }
    }
    *out = x;
    return FERRY_OK;
fail:
    experts_free(x);
    return st;
}

void experts_free(experts *x)
{
    if (!x) return;
    backend *be = x->be;
    if (x->aio) experts_drain(x);
    for (int i = 0; i < x->n_slots; i++) {
        xslot *sl = &x->slots[i];
        if (sl->copied) be->ops->event_sync(be, sl->copied);
        if (sl->computed) be->ops->event_sync(be, sl->computed);
        if (sl->dev) be->ops->release(be, sl->dev);
        if (sl->copied) be->ops->event_destroy(be, sl->copied);
        if (sl->computed) be->ops->event_destroy(be, sl->computed);
    }
    uint64_t bytes = x->n_bounce ? x->p->expert_bounce_bytes / (uint64_t)x->p->expert_reads : 0;
    for (int i = 0; i < x->n_bounce; i++) {
        xbounce *bb = &x->bounce[i];
        if (bb->copied) {
            be->ops->event_sync(be, bb->copied);
            be->ops->event_destroy(be, bb->copied);
        }
        if (bb->host) be->ops->host_free(be, bb->host, (size_t)bytes, bb->pinned);
    }
    aio_free(x->aio);
    pthread_mutex_destroy(&x->mu);
    free(x->bounce);
    free(x->slots);
    free(x->items);
    free(x->order);
    free(x->damaged);
    free(x->slot_of);
    free(x->layer_first);
    free(x);
}

/* ---- one run ---------------------------------------------------------------- */

/* The least recently used slot no routed expert of this run is in, and
 * (keep_from) none used at or after that clock value; -1. */
static int take_slot(experts *x, uint64_t keep_from)
{
    int best = -1;
    for (int i = 0; i < x->n_slots; i++) {
        const xslot *sl = &x->slots[i];
        if (sl->busy || sl->reading || (sl->group >= 0 && sl->last_use >= keep_from)) continue;
        if (sl->group < 0) return i;
        if (best < 0 || sl->last_use < x->slots[best].last_use) best = i;
    }
    return best;
}

static int take_bounce(experts *x)
{
    for (int i = 0; i < x->n_bounce; i++)
        if (!x->bounce[i].in_use) return i;
    return -1;
}

/* Copies src into slot s on the copy stream, after the compute that last
 * read the slot. */
static void copy_to_slot(experts *x, int s, const void *src, uint64_t bytes)
{
    const struct backend_ops *op = x->be->ops;
    xslot *sl = &x->slots[s];
    op->stream_wait(x->be, STREAM_COPY, sl->computed);
    op->copy_async(x->be, sl->dev, src, (size_t)bytes);
    op->event_record(x->be, sl->copied, STREAM_COPY);
}

/* Starts fetching group g into a slot taken for it: item `item` of the
 * running run, or -1 for a speculative fetch. false when it must wait (no
 * slot, bounce buffer or read to be had) or, speculative, would gain
 * nothing. *failed: why the read could not even be queued (its message in
 * ferry_errmsg()), FERRY_OK when it was. */
static bool start_fetch(experts *x, int g, int item, ferry_status *failed)
{
    const plan_group *pg = &x->p->groups[g];
    *failed = FERRY_OK;
    if (pg->tier == TIER_DISK && x->reads >= x->p->expert_reads) return false;
    /* a speculative host copy on a unified backend is a memcpy on this thread: no overlap to gain */
    if (item < 0 && pg->tier == TIER_HOST && x->p->opts.unified) return false;
    int b = -1;
    if (pg->tier == TIER_DISK && !x->p->opts.unified && (b = take_bounce(x)) < 0) return false;
    /* a speculative fetch never evicts what this prediction keeps (x->keep_from) */
    int s = take_slot(x, item < 0 ? x->keep_from : UINT64_MAX);
    if (s < 0) return false;
    xslot *sl = &x->slots[s];
    if (sl->group >= 0) x->slot_of[sl->group] = -1; /* evicted */
    sl->group = g;
    x->slot_of[g] = s;
    sl->item = item;
    sl->busy = item >= 0;
    sl->speculative = item < 0;
    sl->bounce = -1;
    if (item >= 0) x->items[item].slot = s;
    store_source src = store_group_source(x->s, g);
    if (pg->tier == TIER_HOST) {
        copy_to_slot(x, s, src.resident, pg->bytes);
        if (item >= 0) x->items[item].state = X_READY;
        x->run.bytes[TIER_HOST] += pg->bytes;
        return true;
    }
    void *dst = sl->dev;
    if (b >= 0) {
        xbounce *bb = &x->bounce[b];
        x->be->ops->event_sync(x->be, bb->copied); /* its last copy has read it (P6) */
        bb->in_use = true;
        sl->bounce = b;
        dst = bb->host;
    }
    /* the slot's last compute is over on a unified backend (ops finish as
     * they return), so the read may land in it now */
    if ((*failed = aio_read(x->aio, src.fd, src.path, src.offset, dst, (size_t)pg->bytes, (uint64_t)s)) != FERRY_OK) {
        if (b >= 0) x->bounce[b].in_use = false;
        sl->group = -1;
        x->slot_of[g] = -1;
        sl->busy = false;
        return true;
    }
    if (item >= 0) x->items[item].state = X_READING;
    sl->reading = true;
    x->reads++;
    return true;
}

/* Takes finished reads: verified, copied to their slot where needed, and
 * handed to their item (a speculative one stays in its slot, a cache
 * entry like any other; one that failed leaves it empty). The first
 * failure of an item's read goes to *err. */
static void reap(experts *x, bool wait, run_err *err)
{
    aio_done done[8];
    double t0 = util_now();
    int n = aio_reap(x->aio, done, 8, wait);
    if (wait) x->run.stall_s += util_now() - t0;
    for (int i = 0; i < n; i++) {
        int s = (int)done[i].tag;
        xslot *sl = &x->slots[s];
        int g = sl->group;
        const plan_group *pg = &x->p->groups[g];
        x->reads--;
        sl->reading = false;
        ferry_status st = done[i].st;
        char msg[FERRY_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", done[i].msg);
        const void *data = sl->bounce >= 0 ? x->bounce[sl->bounce].host : sl->dev;
        bool bad = false;
        if (st == FERRY_OK && x->verify && (st = store_check_read(x->s, g, data, msg, sizeof msg)) != FERRY_OK)
            bad = true;
        if (st != FERRY_OK && (bad || store_blob_short(x->s, g))) {
            pthread_mutex_lock(&x->mu);
            x->damaged[g] = true;
            pthread_mutex_unlock(&x->mu);
        }
        if (st == FERRY_OK && sl->bounce >= 0) {
            copy_to_slot(x, s, data, pg->bytes);
            x->be->ops->event_record(x->be, x->bounce[sl->bounce].copied, STREAM_COPY);
        }
        if (sl->bounce >= 0) x->bounce[sl->bounce].in_use = false;
        sl->bounce = -1;
        xitem *it = sl->item >= 0 ? &x->items[sl->item] : NULL;
        if (st == FERRY_OK) {
            x->run.bytes[TIER_DISK] += pg->bytes;
            if (it) it->state = X_READY;
            continue;
        }
        sl->group = -1; /* holds nothing trusted */
        x->slot_of[g] = -1;
        if (it) {
            it->state = X_FAILED;
            fail_run(err, st, msg);
        }
    }
}

/* Runs it's expert on what is bound, and lets its slot keep it. */
/* Adds the run's figures to the published ones. */
static void publish(experts *x, int uses)
{
    pthread_mutex_lock(&x->mu);
    expert_stats *t = &x->stats, *r = &x->run;
    if (uses) t->layer_runs++;
    t->uses += (uint64_t)uses;
    t->device_uses += r->device_uses;
    t->hits += r->hits;
    t->misses += r->misses;
    t->prefetched += r->prefetched;
    t->prefetch_hits += r->prefetch_hits;
    for (int i = 0; i < TIER_COUNT; i++) {
        t->bytes[i] += r->bytes[i];
        x->step_bytes += r->bytes[i];
    }
    t->stall_s += r->stall_s;
    pthread_mutex_unlock(&x->mu);
    memset(r, 0, sizeof *r);
}

static void compute(experts *x, xitem *it, experts_fn fn, void *ctx)
{
    const struct backend_ops *op = x->be->ops;
    if (it->slot < 0) {
        store_bind(x->s, it->group, store_group_source(x->s, it->group).resident);
        fn(ctx, it->k);
        return;
    }
    xslot *sl = &x->slots[it->slot];
    op->stream_wait(x->be, STREAM_COMPUTE, sl->copied); /* P5 */
    store_bind(x->s, it->group, sl->dev);
    fn(ctx, it->k);
    op->event_record(x->be, sl->computed, STREAM_COMPUTE); /* P3 */
    sl->last_use = ++x->clock;
    sl->busy = false;
    sl->item = -1;
    sl->speculative = false;
}

ferry_status experts_run(experts *x, int layer, const int32_t *ids, int n, experts_fn fn, void *ctx)
{
    FERRY_ASSERT(layer >= 0 && layer < x->n_layers && x->layer_first[layer] >= 0);
    int first = x->layer_first[layer];
    run_err err = {FERRY_OK, ""};
    if (x->aio) reap(x, false, &err); /* speculative reads that have landed */
    int n_present = 0;
    xitem *items = x->items;
    /* present ones first in order[], missing ones after, in fetch order */
    int *order = x->order;
    for (int k = 0; k < n; k++) {
        int g = first + ids[k], s = x->slot_of[g];
        FERRY_ASSERT(g < x->p->n_groups && x->p->groups[g].first_layer == layer);
        xitem it = {k, g, -1, X_DEVICE};
        if (x->p->groups[g].tier == TIER_DEVICE) {
            x->run.device_uses++;
        } else if (s >= 0) { /* in a slot, or on its way there (a speculative fetch) */
            xslot *sl = &x->slots[s];
            it.state = sl->reading ? X_READING : X_HIT;
            it.slot = s;
            sl->busy = true;
            sl->item = k;
            x->run.hits++;
            x->run.prefetch_hits += sl->speculative;
        } else {
            it.state = X_WAITING;
            x->run.misses++;
        }
        items[k] = it;
    }
    for (int k = 0; k < n; k++)
        if (items[k].state == X_DEVICE || items[k].state == X_HIT) order[n_present++] = k;
    int n_order = n_present;
    for (int k = 0; k < n; k++) /* speculative fetches under way came first */
        if (items[k].state == X_READING) order[n_order++] = k;
    int next_fetch = n_order;
    for (int k = 0; k < n; k++)
        if (items[k].state == X_WAITING) order[n_order++] = k;

    ferry_status failed;
    while (next_fetch < n && !err.st && start_fetch(x, items[order[next_fetch]].group, order[next_fetch], &failed)) {
        if (failed) {
            items[order[next_fetch]].state = X_FAILED;
            fail_run(&err, failed, ferry_errmsg());
        }
        next_fetch++;
    }
    for (int i = 0; i < n_present; i++) compute(x, &items[order[i]], fn, ctx);
    /* the fetched ones as they land: the first landed in fetch order (a
     * queue served in parallel does not finish in order) */
    for (int left = n - n_present; left > 0;) {
        while (next_fetch < n && !err.st &&
               start_fetch(x, items[order[next_fetch]].group, order[next_fetch], &failed)) {
            if (failed) {
                items[order[next_fetch]].state = X_FAILED;
                fail_run(&err, failed, ferry_errmsg());
            }
            next_fetch++;
        }
        if (x->aio) reap(x, false, &err);
        int pick = -1;
        for (int i = n_present; i < n && pick < 0; i++) {
            if (order[i] < 0) continue; /* done */
            xstate s = items[order[i]].state;
            if (s == X_READY || s == X_FAILED || (s == X_WAITING && err.st)) pick = i;
        }
        if (pick < 0) {
            /* waiting for a read, or for a slot or read that one in flight frees */
            FERRY_ASSERT(x->reads > 0);
            reap(x, true, &err);
            continue;
        }
        xitem *it = &items[order[pick]];
        order[pick] = -1;
        left--;
        if (it->state == X_READY && !err.st) {
            compute(x, it, fn, ctx);
        } else if (it->slot >= 0 && x->slots[it->slot].item == it - items) {
            /* failed, or not computed after a failure: the slot holds nothing trusted */
            xslot *sl = &x->slots[it->slot];
            sl->busy = false;
            sl->item = -1;
            if (sl->group >= 0) x->slot_of[sl->group] = -1;
            sl->group = -1;
        }
    }
    while (x->reads > 0) reap(x, true, &err); /* nothing in flight between runs */
    publish(x, n);
    return err.st ? ferry_fail(err.st, "%s", err.msg) : FERRY_OK;
}

void experts_prefetch(experts *x, int layer, const int32_t *ids, int n)
{
    if (layer < 0 || layer >= x->n_layers || x->layer_first[layer] < 0) return;
    int first = x->layer_first[layer];
    /* the predicted experts already present are the most recent, and kept */
    x->keep_from = x->clock + 1;
    for (int k = 0; k < n; k++) {
        int s = x->slot_of[first + ids[k]];
        if (s >= 0) x->slots[s].last_use = ++x->clock;
    }
    run_err err = {FERRY_OK, ""}; /* a speculative read that fails leaves its slot empty: the run refetches */
    for (int k = 0; k < n; k++) {
        int g = first + ids[k];
        if (x->p->groups[g].tier == TIER_DEVICE || x->slot_of[g] >= 0) continue;
        ferry_status failed;
        if (!start_fetch(x, g, -1, &failed)) continue;
        if (failed) continue; /* the run that needs it fetches it again and says why */
        x->run.prefetched++;
        x->slots[x->slot_of[g]].last_use = ++x->clock;
    }
    if (x->aio) reap(x, false, &err);
    publish(x, 0);
}

void experts_drain(experts *x)
{
    run_err err = {FERRY_OK, ""}; /* a speculative read that failed: its slot is empty, nothing used it */
    while (x->reads > 0) reap(x, true, &err);
    publish(x, 0);
}

void experts_step_done(experts *x)
{
    if (x->aio) experts_drain(x);
    pthread_mutex_lock(&x->mu);
    x->stats.last_step_bytes = (double)x->step_bytes;
    x->step_bytes = 0;
    pthread_mutex_unlock(&x->mu);
}

void experts_set_verify(experts *x, bool on) { x->verify = on; }

int experts_damaged(experts *x, bool *out)
{
    int n = 0;
    pthread_mutex_lock(&x->mu);
    for (int g = 0; g < x->p->n_groups; g++)
        if (x->damaged[g]) {
            out[g] = true;
            n++;
        }
    pthread_mutex_unlock(&x->mu);
    return n;
}

void experts_clear_damaged(experts *x, int g)
{
    pthread_mutex_lock(&x->mu);
    x->damaged[g] = false;
    pthread_mutex_unlock(&x->mu);
    int s = x->slot_of[g];
    if (s >= 0) {
        x->slots[s].group = -1;
        x->slot_of[g] = -1;
    }
}

expert_stats experts_get_stats(experts *x)
{
    pthread_mutex_lock(&x->mu);
    expert_stats s = x->stats;
    pthread_mutex_unlock(&x->mu);
    return s;
}
