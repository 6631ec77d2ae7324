/*
 * scheduler.c - the engine thread and its queue. See scheduler.h.
 *
 * Locking: s->mu guards the queue, the cancel flags, the slot states as
 * seen by sched_cancel, and the stats. The engine thread builds and runs a
 * step and calls callbacks without holding it, so a callback may call back
 * into sched_cancel or sched_submit.
 */
#define _GNU_SOURCE
#include "scheduler.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

#define DEFAULT_MAX_QUEUED 64

typedef struct req {
    uint64_t id;
    sched_params p;       /* p.prompt points at prompt below */
    int32_t *prompt;
    sched_callbacks cb;
    void *user;
    double t_submit, t_admit;
    bool cancel;          /* mu */
    struct req *next;
} req;

typedef enum { SEQ_FREE, SEQ_PREFILL, SEQ_DECODE } seq_state;

typedef struct {
    seq_state state;      /* engine thread only */
    req *r;               /* set and cleared under mu (sched_cancel reads it) */
    int done_prompt;      /* prompt rows already in the KV cache */
    int n_gen;
    int32_t *gen;         /* [max_new_tokens] */
    sampler smp;
    float *logits;        /* [vocab] when want_logits */
} seq_slot;

struct sched {
    engine *e;
    pthread_t thread;
    bool running;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    req *q_head, *q_tail;
    int n_queued, max_queued;
    bool stop;
    uint64_t next_id;
    seq_slot *slots;      /* [e->n_slots] */
    int n_slots;
    int rr;               /* where the next prefill budget starts (fairness) */
    sched_stats stats;
    /* step buffers */
    int32_t *tokens, *pos;
    batch_seq *seqs;
    int *seq_slot_of;     /* [n_slots] batch sequence -> slot */
    int32_t *new_tok;     /* [n_slots] the token each batch sequence produced, or -1 */
    float *logits;        /* [n_slots, vocab] */
};

static void req_free(req *r)
{
    if (!r) return;
    free(r->prompt);
    free(r);
}

/* ---- finishing ---------------------------------------------------------------- */

/* Ends slot i's request (engine thread, mu not held). */
static void finish(sched *s, int i, ferry_status st, const char *msg, bool cancelled)
{
    seq_slot *q = &s->slots[i];
    req *r = q->r;
    double now = util_now();
    sched_result res = {q->gen, q->n_gen, q->logits, s->e->cfg.vocab, cancelled, r->t_admit - r->t_submit,
                        now - r->t_submit};
    /* the stats first: a client that got its answer finds it counted */
    pthread_mutex_lock(&s->mu);
    if (st != FERRY_OK) s->stats.requests_failed++;
    else if (cancelled) s->stats.requests_cancelled++;
    else s->stats.requests_done++;
    s->stats.running--;
    pthread_mutex_unlock(&s->mu);
    if (r->cb.on_done) r->cb.on_done(r->user, st, msg, &res);
    pthread_mutex_lock(&s->mu);
    q->r = NULL; /* from here sched_cancel cannot reach r */
    pthread_mutex_unlock(&s->mu);
    sampler_free(&q->smp);
    free(q->gen);
    free(q->logits);
    req_free(r);
    q->state = SEQ_FREE;
    q->gen = NULL;
    q->logits = NULL;
    q->n_gen = q->done_prompt = 0;
}

/* Ends a request that never got a slot (mu not held). */
static void finish_unadmitted(sched *s, req *r, ferry_status st, const char *msg, bool cancelled)
{
    double now = util_now();
    sched_result res = {NULL, 0, NULL, s->e->cfg.vocab, cancelled, now - r->t_submit, now - r->t_submit};
    pthread_mutex_lock(&s->mu);
    if (st != FERRY_OK) s->stats.requests_failed++;
    else s->stats.requests_cancelled++;
    pthread_mutex_unlock(&s->mu);
    if (r->cb.on_done) r->cb.on_done(r->user, st, msg, &res);
    req_free(r);
}

/* ---- the step ------------------------------------------------------------------ */

/* Sets up slot i for its new request q->r (mu not held). */
static ferry_status admit(sched *s, int i)
{
    seq_slot *q = &s->slots[i];
    req *r = q->r;
    q->n_gen = q->done_prompt = 0;
    q->gen = malloc((size_t)r->p.max_new_tokens * sizeof *q->gen);
    if (r->p.want_logits) q->logits = malloc((size_t)s->e->cfg.vocab * sizeof *q->logits);
    if (!q->gen || (r->p.want_logits && !q->logits)) return ferry_fail(FERRY_ERR_NOMEM, "out of memory for a request");
    FERRY_TRY(sampler_init(&q->smp, &r->p.sampling, s->e->cfg.vocab, 0));
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
        s->stats.queued = s->n_queued;
        pthread_mutex_unlock(&s->mu);
        finish_unadmitted(s, r, FERRY_OK, NULL, true);
        pthread_mutex_lock(&s->mu);
    }
    for (int i = 0; i < s->n_slots; i++) {
        if (s->slots[i].r && s->slots[i].r->cancel) {
            pthread_mutex_unlock(&s->mu);
            finish(s, i, FERRY_OK, NULL, true);
            pthread_mutex_lock(&s->mu);
        }
    }
    int running = 0;
    for (int i = 0; i < s->n_slots; i++) {
        if (s->slots[i].state == SEQ_FREE && s->q_head) {
            req *r = s->q_head;
            s->q_head = r->next;
            if (!s->q_head) s->q_tail = NULL;
            s->n_queued--;
            s->stats.queued = s->n_queued;
            r->t_admit = util_now();
            s->stats.running++;
            s->slots[i].r = r;
            pthread_mutex_unlock(&s->mu);
            ferry_status st = admit(s, i);
            if (st != FERRY_OK) {
                char msg[256];
                snprintf(msg, sizeof msg, "%s", ferry_errmsg());
                finish(s, i, st, msg, false);
            }
            pthread_mutex_lock(&s->mu);
        }
        running += s->slots[i].state != SEQ_FREE;
    }
    s->stats.queued = s->n_queued;
    return running;
}

/* Builds the step: a decode row for every generating sequence, then prompt
 * chunks from PREFILL sequences (starting at s->rr, round robin) within
 * max_step_tokens. Returns the number of batch sequences. */
static int build(sched *s, batch *b)
{
    const int cap = s->e->max_step_tokens;
    int t = 0, ns = 0;
    for (int i = 0; i < s->n_slots; i++) {
        seq_slot *q = &s->slots[i];
        if (q->state != SEQ_DECODE) continue;
        int p = q->r->p.prompt_len + q->n_gen - 1;
        s->seqs[ns] = (batch_seq){i, p, 1, t};
        s->tokens[t] = q->gen[q->n_gen - 1];
        s->pos[t++] = p;
        s->seq_slot_of[ns++] = i;
    }
    for (int k = 0; k < s->n_slots && t < cap; k++) {
        int i = (s->rr + k) % s->n_slots;
        seq_slot *q = &s->slots[i];
        if (q->state != SEQ_PREFILL) continue;
        int take = q->r->p.prompt_len - q->done_prompt;
        if (take > cap - t) take = cap - t;
        s->seqs[ns] = (batch_seq){i, q->done_prompt, take, t};
        for (int j = 0; j < take; j++, t++) {
            s->tokens[t] = q->r->prompt[q->done_prompt + j];
            s->pos[t] = q->done_prompt + j;
        }
        s->seq_slot_of[ns++] = i;
    }
    s->rr = (s->rr + 1) % s->n_slots;
    /* the engine wants batch sequences in token order; they are */
    *b = (batch){t, ns, s->tokens, s->pos, s->seqs};
    return ns;
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
    if (ns == 0) return;
    int vocab = s->e->cfg.vocab;
    double t0 = util_now();
    ferry_status st = engine_step(s->e, &b, s->logits);
    double dt = util_now() - t0;
    char msg[512] = "";
    if (st != FERRY_OK) snprintf(msg, sizeof msg, "%s", ferry_errmsg());

    /* First advance every sequence and count, then publish the step's
     * figures, then call back: a client that got its answer must find it in
     * the stats already. new_tok[k] < 0: sequence k produced no token. */
    uint64_t prompted = 0, generated = 0;
    for (int k = 0; k < ns && st == FERRY_OK; k++) {
        seq_slot *q = &s->slots[s->seq_slot_of[k]];
        const float *row = s->logits + (size_t)k * (size_t)vocab;
        s->new_tok[k] = -1;
        if (q->state == SEQ_PREFILL) {
            q->done_prompt += s->seqs[k].n_tokens;
            prompted += (uint64_t)s->seqs[k].n_tokens;
            if (q->done_prompt < q->r->p.prompt_len) continue;
            if (q->logits) memcpy(q->logits, row, (size_t)vocab * sizeof *row);
            q->state = SEQ_DECODE;
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
    int bucket = 0;
    while (bucket < 7 && ns >= (2 << bucket)) bucket++;
    s->stats.batch_hist[bucket]++;
    s->stats.batch_sum += (uint64_t)ns;
    pthread_mutex_unlock(&s->mu);

    for (int k = 0; k < ns; k++) {
        int i = s->seq_slot_of[k];
        seq_slot *q = &s->slots[i];
        if (st != FERRY_OK) {
            finish(s, i, st, msg, false);
            continue;
        }
        int32_t tok = s->new_tok[k];
        if (tok < 0) continue;
        if (q->r->cb.on_token) q->r->cb.on_token(q->r->user, tok, q->n_gen - 1);
        if (q->n_gen == q->r->p.max_new_tokens || is_stop(q->r, tok)) finish(s, i, FERRY_OK, NULL, false);
    }
}

static void *engine_main(void *arg)
{
    sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        int running = boundary(s);
        if (s->stop) break;
        if (running == 0) {
            if (!s->q_head) pthread_cond_wait(&s->cv, &s->mu);
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
    if (e->n_slots > e->max_step_tokens)
        return ferry_fail(FERRY_ERR_INVALID, "%d sequences cannot decode in steps of %d tokens (raise --max-step-tokens)",
                          e->n_slots, e->max_step_tokens);
    sched *s = calloc(1, sizeof *s);
    if (!s) return ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    s->e = e;
    s->n_slots = e->n_slots;
    s->max_queued = o && o->max_queued > 0 ? o->max_queued : DEFAULT_MAX_QUEUED;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->slots = calloc((size_t)s->n_slots, sizeof *s->slots);
    s->tokens = malloc((size_t)e->max_step_tokens * sizeof *s->tokens);
    s->pos = malloc((size_t)e->max_step_tokens * sizeof *s->pos);
    s->seqs = calloc((size_t)s->n_slots, sizeof *s->seqs);
    s->seq_slot_of = calloc((size_t)s->n_slots, sizeof *s->seq_slot_of);
    s->new_tok = calloc((size_t)s->n_slots, sizeof *s->new_tok);
    s->logits = malloc((size_t)s->n_slots * (size_t)e->cfg.vocab * sizeof *s->logits);
    if (!s->slots || !s->tokens || !s->pos || !s->seqs || !s->seq_slot_of || !s->new_tok || !s->logits) {
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
    for (int i = 0; s->slots && i < s->n_slots; i++)
        if (s->slots[i].r) finish(s, i, FERRY_ERR_BUSY, "server shutting down", false);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->slots);
    free(s->tokens);
    free(s->pos);
    free(s->seqs);
    free(s->seq_slot_of);
    free(s->new_tok);
    free(s->logits);
    free(s);
}

ferry_status sched_submit(sched *s, const sched_params *p, const sched_callbacks *cb, void *user, uint64_t *id)
{
    const model_config *c = &s->e->cfg;
    if (p->prompt_len < 1) return ferry_fail(FERRY_ERR_INVALID, "input_ids is empty");
    if (p->max_new_tokens < 1) return ferry_fail(FERRY_ERR_INVALID, "max_new_tokens must be >= 1 (got %d)", p->max_new_tokens);
    if (p->n_stop < 0 || p->n_stop > SCHED_MAX_STOP)
        return ferry_fail(FERRY_ERR_INVALID, "at most %d stop_token_ids", SCHED_MAX_STOP);
    for (int k = 0; k < p->prompt_len; k++)
        if (p->prompt[k] < 0 || p->prompt[k] >= c->vocab)
            return ferry_fail(FERRY_ERR_INVALID, "input_ids[%d] = %d is outside the vocabulary (size %d)", k,
                              p->prompt[k], c->vocab);
    if (p->max_new_tokens > s->e->max_ctx - p->prompt_len)
        return ferry_fail(FERRY_ERR_INVALID, "%d prompt + %d new tokens exceed the context of %d positions",
                          p->prompt_len, p->max_new_tokens, s->e->max_ctx);
    FERRY_TRY(sampling_params_check(&p->sampling));
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
    s->stats.queued = s->n_queued;
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
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].r && s->slots[i].r->id == id) s->slots[i].r->cancel = true;
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
