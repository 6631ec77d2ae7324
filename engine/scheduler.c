/*
 * scheduler.c - the engine thread and its queue. See scheduler.h.
 *
 * Locking: s->mu guards the queue, the cancel flags, the sequences' requests
 * as seen by sched_cancel, and the stats. The engine thread builds and runs a
 * step and calls callbacks without holding it, so a callback may call back
 * into sched_cancel or sched_submit.
 */
#define _GNU_SOURCE
#include "scheduler.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/util.h"

typedef struct req {
    uint64_t id;
    gen_request p;        /* p.prompt points at prompt below */
    int32_t *prompt;
    sched_callbacks cb;
    void *user;
    double t_submit, t_admit;
    bool cancel;          /* mu */
    struct req *next;
} req;

typedef enum { SEQ_FREE, SEQ_PREFILL, SEQ_DECODE } seq_state;

/* A KV-cache sequence and the request running in it. In PREFILL it fills
 * fill[0 .. fill_len) into the KV cache: the prompt, or after a preemption
 * the prompt and every generated token but the last (the prefix is
 * recomputed; the last token is the next decode row's input). It holds no
 * KV blocks until it starts filling, then blocks for the whole fill, and one
 * more block every KV_BLOCK positions while it decodes. */
typedef struct {
    seq_state state;      /* engine thread only */
    req *r;               /* set and cleared under mu (sched_cancel reads it) */
    const int32_t *fill;  /* the prompt, or resume */
    int fill_len;
    int done_fill;        /* rows of fill already in the KV cache */
    int prompt_counted;   /* rows of the prompt counted as prompt tokens: a preemption mid-prefill fills them again */
    int32_t *resume;      /* [prompt_len + max_new_tokens] after a preemption, else NULL */
    uint64_t order;       /* admission order: the highest is the newest */
    int room;             /* positions its KV blocks were reserved for; 0: it holds none */
    int n_gen;
    int32_t *gen;         /* [max_new_tokens] */
    sampler smp;
    float *logits;        /* [vocab] when want_logits */
} sched_seq;

struct sched {
    engine *e;
    pthread_t thread;
    bool running;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    req *q_head, *q_tail;
    int n_queued, max_queued;
    int n_waiting;        /* admitted sequences holding no KV blocks (publish) */
    bool stop;
    uint64_t next_id;
    uint64_t next_order;
    sched_seq *seqs;      /* [lim.max_seqs]: index = KV-cache sequence */
    engine_limits lim;
    int rr;               /* where the next prefill budget starts (fairness) */
    bool serving;         /* sched_opts.serving */
    sched_stats stats;
    /* step buffers */
    batch_builder bb;
    int *seq_of;          /* [max_seqs] batch sequence -> sched sequence */
    int32_t *new_tok;     /* [max_seqs] the token each batch sequence produced, or -1 */
    float *logits;        /* [max_seqs, vocab] */
};

static void req_free(req *r)
{
    if (!r) return;
    free(r->prompt);
    free(r);
}

/* The pool and the sequences as the stats show them (mu held, engine
 * thread). A sequence that holds no KV blocks - admitted and not yet
 * started, or preempted - counts as queued, not running: it waits, as the
 * requests in the queue do, for blocks rather than for a slot. */
static void publish(sched *s)
{
    engine_kv kv = engine_kv_info(s->e);
    s->stats.kv_blocks_free = kv.free_blocks;
    s->stats.kv_blocks_used = kv.total_blocks - kv.free_blocks;
    int running = 0, waiting = 0;
    for (int i = 0; i < s->lim.max_seqs; i++) {
        const sched_seq *q = &s->seqs[i];
        if (q->state == SEQ_FREE) continue;
        if (q->state == SEQ_PREFILL && q->room == 0) waiting++;
        else running++;
    }
    s->n_waiting = waiting;
    s->stats.running = running;
    s->stats.queued = s->n_queued + waiting;
}

/* ---- finishing ---------------------------------------------------------------- */

/* Ends sequence i's request (engine thread, mu not held). */
static void finish(sched *s, int i, ferry_status st, const char *msg, bool cancelled)
{
    sched_seq *q = &s->seqs[i];
    req *r = q->r;
    double now = util_now();
    gen_result res = {q->gen, q->n_gen, q->logits, s->lim.vocab, cancelled, r->t_admit - r->t_submit,
                      now - r->t_submit};
    engine_kv_release(s->e, i);
    q->state = SEQ_FREE; /* its buffers stay until on_done has returned */
    q->room = 0;
    /* the stats first: a client that got its answer finds it counted */
    pthread_mutex_lock(&s->mu);
    publish(s);
    if (st != FERRY_OK) {
        s->stats.requests_failed++;
        s->stats.failed_s_sum += res.total_s;
    } else if (cancelled) {
        s->stats.requests_cancelled++;
    } else {
        s->stats.requests_done++;
        s->stats.done_s_sum += res.total_s;
        s->stats.last_done_unix = util_wall_now();
    }
    s->stats.queue_s_sum += res.queue_s;
    pthread_mutex_unlock(&s->mu);
    if (st != FERRY_OK && !msg) msg = "out of memory";
    if (r->cb.on_done) r->cb.on_done(r->user, st, msg, &res);
    pthread_mutex_lock(&s->mu);
    q->r = NULL; /* from here sched_cancel cannot reach r */
    pthread_mutex_unlock(&s->mu);
    sampler_free(&q->smp);
    free(q->gen);
    free(q->logits);
    free(q->resume);
    req_free(r);
    q->gen = NULL;
    q->logits = NULL;
    q->resume = NULL;
    q->fill = NULL;
    q->n_gen = q->done_fill = q->fill_len = q->room = q->prompt_counted = 0;
}

/* Ends a request that never started (mu not held). */
static void finish_unadmitted(sched *s, req *r, ferry_status st, const char *msg, bool cancelled)
{
    double now = util_now();
    gen_result res = {NULL, 0, NULL, s->lim.vocab, cancelled, now - r->t_submit, now - r->t_submit};
    pthread_mutex_lock(&s->mu);
    if (st != FERRY_OK) s->stats.requests_failed++;
    else s->stats.requests_cancelled++;
    pthread_mutex_unlock(&s->mu);
    if (st != FERRY_OK && !msg) msg = "out of memory";
    if (r->cb.on_done) r->cb.on_done(r->user, st, msg, &res);
    req_free(r);
}

/* ---- the step ------------------------------------------------------------------ */

/* Sets up sequence i for its new request q->r (mu not held). */
static ferry_status admit(sched *s, int i)
{
    sched_seq *q = &s->seqs[i];
    req *r = q->r;
    q->n_gen = q->done_fill = q->prompt_counted = 0;
    q->fill = r->prompt;
    q->fill_len = r->p.prompt_len;
    q->order = ++s->next_order;
    q->gen = malloc((size_t)r->p.max_new_tokens * sizeof *q->gen);
    if (r->p.want_logits) q->logits = malloc((size_t)s->lim.vocab * sizeof *q->logits);
    if (!q->gen || (r->p.want_logits && !q->logits)) return ferry_fail(FERRY_ERR_NOMEM, "out of memory for a request");
    FERRY_TRY(sampler_init(&q->smp, &r->p.sampling, s->lim.vocab, r->p.stream));
    q->state = SEQ_PREFILL;
    return FERRY_OK;
}

/* Takes cancellations and admissions at the step boundary. Returns the
 * number of running sequences. mu held on entry and exit. */
static int boundary(sched *s)
{
    /* cancelled while queued */
    req *prev = NULL;
    for (req **pp = &s->q_head; *pp;) {
        req *r = *pp;
        if (!r->cancel) {
            prev = r;
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        if (s->q_tail == r) s->q_tail = prev;
        s->n_queued--;
        s->stats.queued = s->n_queued + s->n_waiting;
        pthread_mutex_unlock(&s->mu);
        finish_unadmitted(s, r, FERRY_OK, NULL, true);
        pthread_mutex_lock(&s->mu);
    }
    for (int i = 0; i < s->lim.max_seqs; i++) {
        if (s->seqs[i].r && s->seqs[i].r->cancel) {
            pthread_mutex_unlock(&s->mu);
            finish(s, i, FERRY_OK, NULL, true);
            pthread_mutex_lock(&s->mu);
        }
    }
    int running = 0;
    for (int i = 0; i < s->lim.max_seqs; i++) {
        if (s->seqs[i].state == SEQ_FREE && s->q_head) {
            req *r = s->q_head;
            s->q_head = r->next;
            if (!s->q_head) s->q_tail = NULL;
            s->n_queued--;
            r->t_admit = util_now();
            s->seqs[i].r = r;
            pthread_mutex_unlock(&s->mu);
            ferry_status st = admit(s, i);
            if (st != FERRY_OK) {
                char *msg = ferry_errmsg_dup();
                finish(s, i, st, msg, false);
                free(msg);
            }
            pthread_mutex_lock(&s->mu);
        }
        running += s->seqs[i].state != SEQ_FREE;
    }
    publish(s);
    return running;
}

/* ---- KV blocks: reservation and preemption -------------------------------------- */

/* Frees sequence i's blocks and sends it back to PREFILL, keeping its
 * tokens: it resumes by recomputing its prefix (struct comment). */
static void preempt(sched *s, int i)
{
    sched_seq *q = &s->seqs[i];
    engine_kv_release(s->e, i);
    q->room = 0;
    q->done_fill = 0;
    if (q->n_gen > 0) {
        int plen = q->r->p.prompt_len;
        if (!q->resume) q->resume = malloc(((size_t)plen + (size_t)q->r->p.max_new_tokens) * sizeof *q->resume);
        FERRY_ASSERT(q->resume); /* a few KiB; without it the request cannot go on */
        memcpy(q->resume, q->r->prompt, (size_t)plen * sizeof *q->resume);
        memcpy(q->resume + plen, q->gen, (size_t)(q->n_gen - 1) * sizeof *q->resume);
        q->fill = q->resume;
        q->fill_len = plen + q->n_gen - 1;
    }
    q->state = SEQ_PREFILL;
    pthread_mutex_lock(&s->mu);
    s->stats.preemptions++;
    pthread_mutex_unlock(&s->mu);
}

/* The newest sequence holding KV blocks, or -1. */
static int newest_holder(sched *s)
{
    int best = -1;
    for (int i = 0; i < s->lim.max_seqs; i++) {
        sched_seq *q = &s->seqs[i];
        if (q->state != SEQ_FREE && q->room > 0 && (best < 0 || q->order > s->seqs[best].order)) best = i;
    }
    return best;
}

/* Room for the next decode row of every generating sequence, oldest first;
 * when the pool runs out, the newest sequence holding blocks is preempted
 * (possibly the one asking). No request fails because others arrived:
 * request_check let in only requests that fit the pool alone. */
static void reserve_decode(sched *s)
{
    for (;;) {
        int i = -1; /* the oldest decoding sequence without room for its next row */
        for (int k = 0; k < s->lim.max_seqs; k++) {
            sched_seq *q = &s->seqs[k];
            if (q->state != SEQ_DECODE || q->r->p.prompt_len + q->n_gen <= q->room) continue;
            if (i < 0 || q->order < s->seqs[i].order) i = k;
        }
        if (i < 0) return;
        sched_seq *q = &s->seqs[i];
        int need = q->r->p.prompt_len + q->n_gen;
        if (engine_kv_reserve(s->e, i, need) == FERRY_OK) {
            q->room = need;
            continue;
        }
        int v = newest_holder(s);
        FERRY_ASSERT(v >= 0);
        preempt(s, v);
    }
}

/* Gives blocks to the sequences waiting for them (PREFILL, room 0), oldest
 * admission first, stopping at the first that cannot start: a preempted
 * sequence resumes before later arrivals start, and none is overtaken for
 * ever by shorter ones. A sequence starts only when the pool has blocks for
 * its whole fill, beside one spare block per decoding sequence that may
 * still grow (starting one that the next decode rows would preempt again is
 * wasted work) - unless nothing else runs (busy false), when it starts if
 * the blocks are there at all. */
static void start_waiting(sched *s, int growing, bool busy)
{
    for (;;) {
        int i = -1;
        for (int k = 0; k < s->lim.max_seqs; k++) {
            const sched_seq *q = &s->seqs[k];
            if (q->state == SEQ_PREFILL && q->room == 0 && (i < 0 || q->order < s->seqs[i].order)) i = k;
        }
        if (i < 0) return;
        sched_seq *q = &s->seqs[i];
        engine_kv kv = engine_kv_info(s->e);
        int need = (q->fill_len + kv.block_positions) / kv.block_positions; /* the fill and the first decode row */
        if (need + growing > kv.free_blocks && busy) return;
        if (engine_kv_reserve(s->e, i, q->fill_len + 1) != FERRY_OK) return;
        q->room = q->fill_len + 1;
        busy = true;
    }
}

/* Builds the step: a decode row for every generating sequence, then prompt
 * chunks from PREFILL sequences holding blocks (starting at s->rr, round
 * robin) within max_step_tokens. Returns the number of batch sequences. */
static int build(sched *s, batch *b)
{
    batch_builder *bb = &s->bb;
    batch_builder_clear(bb);
    reserve_decode(s);
    int growing = 0; /* decoding sequences that may need another block */
    engine_kv kv = engine_kv_info(s->e);
    for (int i = 0; i < s->lim.max_seqs; i++) {
        sched_seq *q = &s->seqs[i];
        if (q->state != SEQ_DECODE) continue;
        int k = batch_builder_add(bb, i, q->r->p.prompt_len + q->n_gen - 1, &q->gen[q->n_gen - 1], 1);
        s->seq_of[k] = i;
        int most = q->r->p.prompt_len + q->r->p.max_new_tokens;
        growing += (q->room + kv.block_positions - 1) / kv.block_positions < (most + kv.block_positions - 1) / kv.block_positions;
    }
    bool busy = bb->n_seqs > 0;
    for (int i = 0; i < s->lim.max_seqs; i++) busy |= s->seqs[i].state == SEQ_PREFILL && s->seqs[i].room > 0;
    start_waiting(s, growing, busy);
    for (int k = 0; k < s->lim.max_seqs && batch_builder_room(bb) > 0; k++) {
        int i = (s->rr + k) % s->lim.max_seqs;
        sched_seq *q = &s->seqs[i];
        if (q->state != SEQ_PREFILL || q->room == 0) continue;
        int take = q->fill_len - q->done_fill;
        if (take > batch_builder_room(bb)) take = batch_builder_room(bb);
        int j = batch_builder_add(bb, i, q->done_fill, q->fill + q->done_fill, take);
        s->seq_of[j] = i;
    }
    s->rr = (s->rr + 1) % s->lim.max_seqs;
    *b = batch_builder_get(bb);
    return b->n_seqs;
}

static bool is_stop(const req *r, int32_t tok)
{
    for (int k = 0; k < r->p.n_stop; k++)
        if (r->p.stop_ids[k] == tok) return true;
    return false;
}

static void run_step(sched *s)
{
    batch b;
    int ns = build(s, &b);
    pthread_mutex_lock(&s->mu);
    publish(s); /* who started: running from here, not from the end of this step */
    pthread_mutex_unlock(&s->mu);
    if (ns == 0) return;
    int vocab = s->lim.vocab;
    double t0 = util_now();
    ferry_status st = engine_step(s->e, &b, s->logits);
    double dt = util_now() - t0;
    char *msg = st != FERRY_OK ? ferry_errmsg_dup() : NULL; /* whole, for every sequence's on_done */
    if (st != FERRY_OK && s->serving) { /* the operator's record: clients see it too, but only their own */
        fprintf(stderr, "ferry: step of %d sequences failed: %s\n", ns, msg ? msg : "out of memory");
        engine_repair(s->e); /* rebuilds what the step found damaged, before the next step */
    }

    /* First advance every sequence and count, then publish the step's
     * figures, then call back: a client that got its answer must find it in
     * the stats already. new_tok[k] < 0: sequence k produced no token. */
    uint64_t prompted = 0, generated = 0, recomputed = 0;
    for (int k = 0; k < ns && st == FERRY_OK; k++) {
        sched_seq *q = &s->seqs[s->seq_of[k]];
        const float *row = s->logits + (size_t)k * (size_t)vocab;
        s->new_tok[k] = -1;
        if (q->state == SEQ_PREFILL) {
            q->done_fill += b.seqs[k].n_tokens;
            /* each prompt row counts once as a prompt token; a row filled
             * again after a preemption (mid-prefill or later) is recomputed */
            int fresh = q->n_gen == 0 && q->done_fill > q->prompt_counted ? q->done_fill - q->prompt_counted : 0;
            if (fresh) q->prompt_counted = q->done_fill;
            prompted += (uint64_t)fresh;
            recomputed += (uint64_t)(b.seqs[k].n_tokens - fresh);
            if (q->done_fill < q->fill_len) continue;
            q->state = SEQ_DECODE;
            if (q->n_gen > 0) continue; /* resumed: its next token is already known */
            if (q->logits) memcpy(q->logits, row, (size_t)vocab * sizeof *row);
        }
        s->new_tok[k] = sampler_next(&q->smp, row);
        q->gen[q->n_gen++] = s->new_tok[k];
        generated++;
    }
    pthread_mutex_lock(&s->mu);
    s->stats.steps++;
    s->stats.step_s_sum += dt;
    s->stats.last_step_s = dt;
    s->stats.last_batch = ns;
    s->stats.tokens_prompted += prompted;
    s->stats.tokens_generated += generated;
    s->stats.tokens_recomputed += recomputed;
    int bucket = 0;
    while (bucket < 7 && ns >= (2 << bucket)) bucket++;
    s->stats.batch_hist[bucket]++;
    s->stats.batch_sum += (uint64_t)ns;
    s->stats.failing_steps = st == FERRY_OK ? 0 : s->stats.failing_steps + 1;
    publish(s);
    pthread_mutex_unlock(&s->mu);

    for (int k = 0; k < ns; k++) {
        int i = s->seq_of[k];
        sched_seq *q = &s->seqs[i];
        if (st != FERRY_OK) {
            finish(s, i, st, msg, false);
            continue;
        }
        int32_t tok = s->new_tok[k];
        if (tok < 0) continue;
        if (q->r->cb.on_token) q->r->cb.on_token(q->r->user, tok, q->n_gen - 1);
        if (q->n_gen == q->r->p.max_new_tokens || is_stop(q->r, tok)) finish(s, i, FERRY_OK, NULL, false);
    }
    free(msg);
}

/* Idle after failed steps: a one-token step on KV sequence 0 (every
 * sequence is free) tells whether the engine works again - after a repair,
 * or once a passing fault is gone - so that readiness comes back without a
 * client's request having to fail first. mu not held. */
static void probe(sched *s)
{
    batch_builder_clear(&s->bb);
    int32_t tok = 0;
    batch_builder_add(&s->bb, 0, 0, &tok, 1);
    batch b = batch_builder_get(&s->bb);
    ferry_status st = engine_kv_reserve(s->e, 0, 1);
    if (st == FERRY_OK) st = engine_step(s->e, &b, s->logits);
    engine_kv_release(s->e, 0);
    if (st != FERRY_OK) {
        fprintf(stderr, "ferry: probe step failed: %s\n", ferry_errmsg());
        engine_repair(s->e);
    } else {
        fprintf(stderr, "ferry: probe step succeeded: serving again\n");
    }
    pthread_mutex_lock(&s->mu);
    s->stats.failing_steps = st == FERRY_OK ? 0 : s->stats.failing_steps + 1;
    pthread_mutex_unlock(&s->mu);
}

#define PROBE_INTERVAL_S 1

static void *engine_main(void *arg)
{
    sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        int running = boundary(s);
        if (s->stop) break;
        if (running == 0) {
            if (s->q_head) continue;
            if (!s->serving || s->stats.failing_steps < SCHED_UNHEALTHY_STEPS) {
                pthread_cond_wait(&s->cv, &s->mu);
                continue;
            }
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += PROBE_INTERVAL_S;
            if (pthread_cond_timedwait(&s->cv, &s->mu, &until) == 0 || s->q_head || s->stop) continue;
            pthread_mutex_unlock(&s->mu);
            probe(s);
            pthread_mutex_lock(&s->mu);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        run_step(s);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- API ------------------------------------------------------------------------- */

ferry_status sched_create(engine *e, const sched_opts *o, sched **out)
{
    *out = NULL;
    engine_limits lim = engine_get_limits(e);
    if (lim.max_seqs > lim.max_step_tokens)
        return ferry_fail(FERRY_ERR_INVALID, "%d sequences cannot decode in steps of %d tokens (raise --max-step-tokens)",
                          lim.max_seqs, lim.max_step_tokens);
    sched *s = calloc(1, sizeof *s);
    if (!s) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    s->e = e;
    s->lim = lim;
    s->serving = o && o->serving;
    s->max_queued = o && o->max_queued > 0 ? o->max_queued : INT_MAX;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->seqs = calloc((size_t)lim.max_seqs, sizeof *s->seqs);
    s->seq_of = calloc((size_t)lim.max_seqs, sizeof *s->seq_of);
    s->new_tok = calloc((size_t)lim.max_seqs, sizeof *s->new_tok);
    s->logits = malloc((size_t)lim.max_seqs * (size_t)lim.vocab * sizeof *s->logits);
    if (!s->seqs || !s->seq_of || !s->new_tok || !s->logits ||
        batch_builder_init(&s->bb, lim.max_step_tokens, lim.max_seqs) != FERRY_OK) {
        sched_free(s);
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory for the scheduler");
    }
    if (pthread_create(&s->thread, NULL, engine_main, s) != 0) {
        sched_free(s);
        return ferry_fail(FERRY_ERR_NOMEM, "cannot start the engine thread");
    }
    s->running = true;
    *out = s;
    return FERRY_OK;
}

void sched_free(sched *s)
{
    if (!s) return;
    if (s->running) {
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    /* the engine thread is gone: end what is left */
    while (s->q_head) {
        req *r = s->q_head;
        s->q_head = r->next;
        finish_unadmitted(s, r, FERRY_ERR_BUSY, "server shutting down", false);
    }
    for (int i = 0; s->seqs && i < s->lim.max_seqs; i++)
        if (s->seqs[i].r) finish(s, i, FERRY_ERR_BUSY, "server shutting down", false);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    batch_builder_free(&s->bb);
    free(s->seqs);
    free(s->seq_of);
    free(s->new_tok);
    free(s->logits);
    free(s);
}

ferry_status sched_submit(sched *s, const gen_request *p, const sched_callbacks *cb, void *user, uint64_t *id)
{
    FERRY_TRY(request_check(p, &s->lim, "input_ids", NULL));
    req *r = calloc(1, sizeof *r);
    if (!r || !(r->prompt = malloc((size_t)p->prompt_len * sizeof *r->prompt))) {
        free(r);
        return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    memcpy(r->prompt, p->prompt, (size_t)p->prompt_len * sizeof *r->prompt);
    r->p = *p;
    r->p.prompt = r->prompt;
    r->cb = *cb;
    r->user = user;
    r->t_submit = util_now();
    pthread_mutex_lock(&s->mu);
    if (s->stop || s->n_queued >= s->max_queued) {
        int q = s->n_queued;
        pthread_mutex_unlock(&s->mu);
        req_free(r);
        return ferry_fail(FERRY_ERR_BUSY, "server busy: %d requests queued (limit %d)", q, s->max_queued);
    }
    r->id = ++s->next_id;
    if (s->q_tail) s->q_tail->next = r;
    else s->q_head = r;
    s->q_tail = r;
    s->n_queued++;
    s->stats.queued = s->n_queued + s->n_waiting;
    if (id) *id = r->id;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return FERRY_OK;
}

void sched_cancel(sched *s, uint64_t id)
{
    pthread_mutex_lock(&s->mu);
    for (req *r = s->q_head; r; r = r->next)
        if (r->id == id) r->cancel = true;
    for (int i = 0; i < s->lim.max_seqs; i++)
        if (s->seqs[i].r && s->seqs[i].r->id == id) s->seqs[i].r->cancel = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

sched_stats sched_get_stats(sched *s)
{
    pthread_mutex_lock(&s->mu);
    sched_stats st = s->stats;
    pthread_mutex_unlock(&s->mu);
    return st;
}

int sched_max_queued(const sched *s) { return s->max_queued; }
