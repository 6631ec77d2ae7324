/*
 * test_sched.c - the continuous-batching scheduler against plain
 * one-at-a-time greedy generation driven by engine_step: many requests of
 * different lengths, more than there are KV-cache sequences, with prompts longer than a step (chunked prefill mixed with
 * decode rows) give exactly the tokens and logits of one-at-a-time greedy
 * generation; tokens stream in order; stop ids end a request; a full queue
 * answers FERRY_ERR_BUSY; a cancelled request ends early with its KV
 * sequence freed; bad requests are refused with a message naming the problem.
 * The model is a tiny random checkpoint written by `ferry mkmodel`.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../engine/scheduler.h"
#include "check.h"

#define N_REQ 7
#define MAX_NEW 12

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    ferry_status st;
    int32_t tokens[64];
    int n, streamed, order_errors;
    float logits[4096];
    bool has_logits, cancelled;
    int hold_at;         /* on_token waits at this index until released; -1: never */
    bool held, released; /* on_token is waiting at hold_at; it may go on */
} waiter;

static void on_token(void *user, int32_t tok, int index)
{
    waiter *w = user;
    pthread_mutex_lock(&w->mu);
    if (index != w->streamed) w->order_errors++;
    if (index < 64) w->tokens[index] = tok;
    w->streamed++;
    if (index == w->hold_at) {
        /* holds the scheduler thread (callbacks run on it) between two
         * steps, so that the test can queue work for one boundary */
        w->held = true;
        pthread_cond_broadcast(&w->cv);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 30;
        while (!w->released)
            if (pthread_cond_timedwait(&w->cv, &w->mu, &until) != 0) break;
    }
    pthread_mutex_unlock(&w->mu);
}

static void on_done(void *user, ferry_status st, const char *msg, const gen_result *res)
{
    (void)msg;
    waiter *w = user;
    pthread_mutex_lock(&w->mu);
    w->st = st;
    w->n = res->n_tokens;
    w->cancelled = res->cancelled;
    for (int i = 0; i < res->n_tokens && i < 64; i++)
        if (w->tokens[i] != res->tokens[i]) w->order_errors++;
    if (res->logits) {
        memcpy(w->logits, res->logits, (size_t)res->vocab * sizeof(float));
        w->has_logits = true;
    }
    w->done = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Waits for on_done; a request that is never answered fails the test
 * (after 30 s) instead of hanging it. */
#define wait_done(w) wait_done_at(w, __LINE__)
static void wait_done_at(waiter *w, int line)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 30;
    pthread_mutex_lock(&w->mu);
    while (!w->done)
        if (pthread_cond_timedwait(&w->cv, &w->mu, &until) != 0) break;
    bool done = w->done;
    pthread_mutex_unlock(&w->mu);
    if (!done) {
        fprintf(stderr, "tests/unit/test_sched.c:%d: request never answered\n", line);
        check_report();
        _exit(1);
    }
}

/* Waits until on_token is held at hold_at (30 s at most). */
static void waiter_wait_held(waiter *w)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 30;
    pthread_mutex_lock(&w->mu);
    while (!w->held)
        if (pthread_cond_timedwait(&w->cv, &w->mu, &until) != 0) break;
    pthread_mutex_unlock(&w->mu);
}

/* Lets an on_token held at hold_at go on. */
static void waiter_release(waiter *w)
{
    pthread_mutex_lock(&w->mu);
    w->released = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void waiter_init(waiter *w)
{
    memset(w, 0, sizeof *w);
    w->hold_at = -1;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
}

static const sched_callbacks k_cb = {on_token, on_done};

/* The reference: one prompt alone in KV sequence 0, prefilled in chunks
 * of max_step_tokens, then one greedy decode step per token. */
static ferry_status generate_alone(engine *e, const int32_t *prompt, int len, int max_new, int32_t *out,
                                   float *first_logits)
{
    engine_limits lim = engine_get_limits(e);
    batch_builder bb;
    FERRY_TRY(batch_builder_init(&bb, lim.max_step_tokens, 1));
    float *logits = malloc((size_t)lim.vocab * sizeof *logits);
    ferry_status st = engine_kv_reserve(e, 0, len + max_new);
    for (int done = 0; done < len && st == FERRY_OK;) {
        int take = len - done < lim.max_step_tokens ? len - done : lim.max_step_tokens;
        batch_builder_clear(&bb);
        batch_builder_add(&bb, 0, done, prompt + done, take);
        batch b = batch_builder_get(&bb);
        st = engine_step(e, &b, logits);
        done += take;
    }
    if (st == FERRY_OK) memcpy(first_logits, logits, (size_t)lim.vocab * sizeof *logits);
    for (int k = 0; k < max_new && st == FERRY_OK; k++) {
        out[k] = sample_argmax(logits, lim.vocab);
        if (k + 1 == max_new) break;
        batch_builder_clear(&bb);
        batch_builder_add(&bb, 0, len + k, &out[k], 1);
        batch b = batch_builder_get(&bb);
        st = engine_step(e, &b, logits);
    }
    engine_kv_release(e, 0);
    free(logits);
    batch_builder_free(&bb);
    return st;
}

int main(void)
{
    char dir[] = "/tmp/ferry-test-sched-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    /* the ferry of this build (build/, build-asan/, build-tsan/): .../tests/test_sched -> .../ferry */
    char exe[PATH_MAX], cmd[PATH_MAX + 1024], model[600];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return 1;
    exe[len] = '\0';
    *strrchr(exe, '/') = '\0';
    *strrchr(exe, '/') = '\0';
    snprintf(model, sizeof model, "%s/m", dir);
    snprintf(cmd, sizeof cmd, "%s/ferry mkmodel --out %s --arch qwen2 --preset tiny --seed 9 >/dev/null", exe, model);
    if (system(cmd) != 0) {
        fprintf(stderr, "test_sched: `%s` failed (build ferry first)\n", cmd);
        return 1;
    }
    engine *e;
    engine_opts eo;
    engine_opts_init(&eo);
    eo.model_dir = model;
    eo.threads = 2;
    eo.max_seqs = 3;
    eo.max_ctx = 64;
    eo.max_step_tokens = 8;
    CHECK_STATUS(engine_open(&eo, &e), FERRY_OK);
    if (!e) return check_report();
    int vocab = engine_get_limits(e).vocab;

    /* the KV pool: 3 x 64 positions in 16-position blocks; a step needs its
     * rows reserved */
    engine_kv kv = engine_kv_info(e);
    CHECK_EQ_INT(kv.block_positions, 16);
    CHECK_EQ_INT(kv.total_blocks, 12);
    CHECK_EQ_INT(kv.free_blocks, 12);
    CHECK_EQ_INT((int)engine_get_limits(e).kv_positions, 192);
    {
        batch_builder bb;
        CHECK_STATUS(batch_builder_init(&bb, 8, 1), FERRY_OK);
        int32_t toks[3] = {1, 2, 3};
        float *lg = malloc((size_t)vocab * sizeof *lg);
        batch_builder_add(&bb, 1, 0, toks, 3);
        batch b = batch_builder_get(&bb);
        CHECK_STATUS(engine_step(e, &b, lg), FERRY_ERR_INVALID);
        CHECK_MSG_HAS("KV sequence 1 needs 3 positions but has blocks for 0");
        CHECK_STATUS(engine_kv_reserve(e, 1, 3), FERRY_OK);
        CHECK_EQ_INT(engine_kv_info(e).free_blocks, 11);
        CHECK_STATUS(engine_step(e, &b, lg), FERRY_OK);
        CHECK_STATUS(engine_kv_reserve(e, 1, 65), FERRY_ERR_INVALID);
        CHECK_STATUS(engine_kv_reserve(e, 3, 1), FERRY_ERR_INVALID);
        engine_kv_release(e, 1);
        CHECK_EQ_INT(engine_kv_info(e).free_blocks, 12);
        free(lg);
        batch_builder_free(&bb);
    }

    /* prompts of 1..19 tokens; the reference is one request at a time */
    int32_t prompts[N_REQ][20];
    int lens[N_REQ];
    int32_t want[N_REQ][MAX_NEW];
    float *want_logits = malloc((size_t)vocab * sizeof(float) * N_REQ);
    sampling_params greedy = {0, 0, 1, 0};
    for (int r = 0; r < N_REQ; r++) {
        lens[r] = 1 + (r * 3) % 19;
        for (int k = 0; k < lens[r]; k++) prompts[r][k] = (int32_t)((r * 31 + k * 7 + 3) % vocab);
        CHECK_STATUS(generate_alone(e, prompts[r], lens[r], MAX_NEW, want[r], want_logits + (size_t)r * (size_t)vocab),
                     FERRY_OK);
    }

    sched *s;
    sched_opts so = {.max_queued = 16};
    CHECK_STATUS(sched_create(e, &so, &s), FERRY_OK);

    /* all at once: 7 requests, 3 KV sequences, steps of 8 rows */
    waiter w[N_REQ];
    for (int r = 0; r < N_REQ; r++) {
        waiter_init(&w[r]);
        gen_request p = {.prompt = prompts[r], .prompt_len = lens[r], .max_new_tokens = MAX_NEW,
                          .sampling = greedy, .want_logits = true};
        uint64_t id;
        CHECK_STATUS(sched_submit(s, &p, &k_cb, &w[r], &id), FERRY_OK);
    }
    for (int r = 0; r < N_REQ; r++) {
        wait_done(&w[r]);
        CHECK_STATUS(w[r].st, FERRY_OK);
        CHECK_EQ_INT(w[r].n, MAX_NEW);
        CHECK_EQ_INT(w[r].streamed, MAX_NEW);
        CHECK_EQ_INT(w[r].order_errors, 0);
        CHECK(memcmp(w[r].tokens, want[r], sizeof want[r]) == 0);
        CHECK(w[r].has_logits && memcmp(w[r].logits, want_logits + (size_t)r * (size_t)vocab,
                                        (size_t)vocab * sizeof(float)) == 0);
    }
    {
        /* prompts count once; a preempted sequence's prefix, prefilled
         * again, apart; at idle nothing runs or waits */
        sched_stats st0 = sched_get_stats(s);
        uint64_t prompted = 0;
        for (int r = 0; r < N_REQ; r++) prompted += (uint64_t)lens[r];
        CHECK_EQ_U64(st0.tokens_prompted, prompted);
        CHECK_EQ_U64(st0.tokens_generated, (uint64_t)N_REQ * MAX_NEW);
        CHECK(st0.preemptions > 0 ? st0.tokens_recomputed > 0 : st0.tokens_recomputed == 0);
        CHECK_EQ_INT(st0.running, 0);
        CHECK_EQ_INT(st0.queued, 0);
    }

    /* a stop id ends the request right after emitting it */
    waiter ws;
    waiter_init(&ws);
    gen_request sp = {.prompt = prompts[3], .prompt_len = lens[3], .max_new_tokens = MAX_NEW, .sampling = greedy,
                       .n_stop = 1};
    sp.stop_ids[0] = want[3][4];
    int first = 0;
    while (want[3][first] != sp.stop_ids[0]) first++;
    CHECK_STATUS(sched_submit(s, &sp, &k_cb, &ws, NULL), FERRY_OK);
    wait_done(&ws);
    CHECK_EQ_INT(ws.n, first + 1);
    CHECK(memcmp(ws.tokens, want[3], (size_t)(first + 1) * sizeof(int32_t)) == 0);

    /* refusals name the problem and call nothing */
    int32_t bad[2] = {1, vocab};
    gen_request bp = {.prompt = bad, .prompt_len = 2, .max_new_tokens = 4, .sampling = greedy};
    CHECK_STATUS(sched_submit(s, &bp, &k_cb, NULL, NULL), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("outside the vocabulary");
    bp.prompt_len = 1;
    bp.max_new_tokens = 64;
    CHECK_STATUS(sched_submit(s, &bp, &k_cb, NULL, NULL), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("context");
    bp.max_new_tokens = 0;
    CHECK_STATUS(sched_submit(s, &bp, &k_cb, NULL, NULL), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("max_new_tokens");
    sched_free(s);
    CHECK_EQ_INT(engine_kv_info(e).free_blocks, 12); /* every sequence's blocks came back */

    /* a full queue answers busy; cancelling frees the KV sequence early */
    so.max_queued = 1;
    CHECK_STATUS(sched_create(e, &so, &s), FERRY_OK);
    enum { MANY = 12 };
    waiter wm[MANY];
    uint64_t ids[MANY];
    int busy = 0, accepted = 0;
    for (int r = 0; r < MANY; r++) {
        waiter_init(&wm[r]);
        gen_request p = {.prompt = prompts[r % N_REQ], .prompt_len = lens[r % N_REQ], .max_new_tokens = 40,
                          .sampling = greedy};
        ferry_status st = sched_submit(s, &p, &k_cb, &wm[r], &ids[r]);
        if (st == FERRY_ERR_BUSY) {
            busy++;
            wm[r].done = 1;
            CHECK_MSG_HAS("busy");
        } else {
            CHECK_STATUS(st, FERRY_OK);
            accepted++;
        }
    }
    CHECK(busy > 0);
    CHECK(accepted >= 1);
    for (int r = 0; r < MANY; r++)
        if (!wm[r].done) sched_cancel(s, ids[r]);
    int cancelled = 0;
    for (int r = 0; r < MANY; r++) {
        wait_done(&wm[r]);
        cancelled += wm[r].cancelled;
        CHECK(wm[r].n <= 40);
    }
    CHECK(cancelled > 0);
    sched_stats stt = sched_get_stats(s);
    CHECK_EQ_INT(stt.running, 0);
    CHECK_EQ_INT(stt.queued, 0);
    sched_free(s);
    CHECK_EQ_INT(engine_kv_info(e).free_blocks, 12); /* every sequence's blocks came back */

    /* cancelling the request at the back of the queue keeps the one ahead
     * of it: slots full of long requests, X then Y queued, Y cancelled, D
     * queued; X and D must both be served */
    so.max_queued = 8;
    CHECK_STATUS(sched_create(e, &so, &s), FERRY_OK);
    waiter wl[3], wx, wy, wd;
    uint64_t lid[3], yid;
    gen_request lp = {.prompt = prompts[0], .prompt_len = lens[0], .max_new_tokens = 60, .sampling = greedy};
    for (int r = 0; r < 3; r++) {
        waiter_init(&wl[r]);
        CHECK_STATUS(sched_submit(s, &lp, &k_cb, &wl[r], &lid[r]), FERRY_OK);
    }
    gen_request xp = {.prompt = prompts[2], .prompt_len = lens[2], .max_new_tokens = MAX_NEW, .sampling = greedy};
    waiter_init(&wx);
    waiter_init(&wy);
    waiter_init(&wd);
    CHECK_STATUS(sched_submit(s, &xp, &k_cb, &wx, NULL), FERRY_OK);
    CHECK_STATUS(sched_submit(s, &xp, &k_cb, &wy, &yid), FERRY_OK);
    sched_cancel(s, yid);
    wait_done(&wy);
    CHECK_STATUS(sched_submit(s, &xp, &k_cb, &wd, NULL), FERRY_OK);
    for (int r = 0; r < 3; r++) sched_cancel(s, lid[r]);
    wait_done(&wx);
    wait_done(&wd);
    CHECK_EQ_INT(wx.n, MAX_NEW);
    CHECK_EQ_INT(wd.n, MAX_NEW);
    CHECK(memcmp(wx.tokens, want[2], sizeof want[2]) == 0);
    for (int r = 0; r < 3; r++) wait_done(&wl[r]);
    stt = sched_get_stats(s);
    CHECK_EQ_INT(stt.queued, 0);
    sched_free(s);
    CHECK_EQ_INT(engine_kv_info(e).free_blocks, 12); /* every sequence's blocks came back */

    /* preempted mid-prefill: A (1 prompt token) and B (45, prefilled a row
     * a step beside A's decode row) fill a pool of 4 blocks; when A needs
     * its second block, B - the newest - is preempted with part of its
     * prompt in the cache, and fills it again once A is done. Its prompt
     * counts once as prompt tokens (it counted twice before), the rows
     * filled again as recomputed; both answers are A's and B's alone.
     * A and B must start at the same boundary (B, arriving once A
     * decodes, would wait for room instead): a one-token request Z holds
     * the scheduler in its token callback until both are queued - without
     * it a slow submit (ThreadSanitizer) let A run first. */
    {
        engine_opts eo2 = eo;
        eo2.max_seqs = 2;
        eo2.max_step_tokens = 2;
        eo2.kv_memory = 1u << 20;
        engine *e2 = NULL;
        CHECK_STATUS(engine_open(&eo2, &e2), FERRY_OK);
        int per_mib = e2 ? engine_kv_info(e2).total_blocks : 0;
        engine_close(e2);
        e2 = NULL;
        CHECK(per_mib >= 10);
        eo2.kv_memory = (uint64_t)(4.5 * (double)(1u << 20) / (per_mib ? per_mib : 1));
        CHECK_STATUS(engine_open(&eo2, &e2), FERRY_OK);
        if (e2) {
            CHECK_EQ_INT(engine_kv_info(e2).total_blocks, 4);
            int32_t pb[45];
            for (int k = 0; k < 45; k++) pb[k] = (int32_t)((k * 13 + 5) % vocab);
            int32_t want_a[40], want_b[2];
            float *lg = malloc((size_t)vocab * sizeof *lg);
            CHECK_STATUS(generate_alone(e2, prompts[1], 1, 40, want_a, lg), FERRY_OK);
            CHECK_STATUS(generate_alone(e2, pb, 45, 2, want_b, lg), FERRY_OK);
            free(lg);
            sched *s2;
            CHECK_STATUS(sched_create(e2, NULL, &s2), FERRY_OK);
            waiter wz, wa, wb;
            waiter_init(&wz);
            waiter_init(&wa);
            waiter_init(&wb);
            wz.hold_at = 0;
            gen_request zp = {.prompt = prompts[1], .prompt_len = 1, .max_new_tokens = 1, .sampling = greedy};
            CHECK_STATUS(sched_submit(s2, &zp, &k_cb, &wz, NULL), FERRY_OK);
            waiter_wait_held(&wz);
            gen_request ap = {.prompt = prompts[1], .prompt_len = 1, .max_new_tokens = 40, .sampling = greedy};
            gen_request bq = {.prompt = pb, .prompt_len = 45, .max_new_tokens = 2, .sampling = greedy};
            CHECK_STATUS(sched_submit(s2, &ap, &k_cb, &wa, NULL), FERRY_OK);
            CHECK_STATUS(sched_submit(s2, &bq, &k_cb, &wb, NULL), FERRY_OK);
            waiter_release(&wz);
            wait_done(&wz);
            wait_done(&wa);
            wait_done(&wb);
            CHECK_STATUS(wa.st, FERRY_OK);
            CHECK_STATUS(wb.st, FERRY_OK);
            CHECK(wa.n == 40 && memcmp(wa.tokens, want_a, sizeof want_a) == 0);
            CHECK(wb.n == 2 && memcmp(wb.tokens, want_b, sizeof want_b) == 0);
            sched_stats s2t = sched_get_stats(s2);
            CHECK(s2t.preemptions >= 1);
            CHECK_EQ_U64(s2t.tokens_prompted, 47); /* Z's 1, A's 1, B's 45 */
            CHECK(s2t.tokens_recomputed > 0);
            sched_free(s2);
            engine_close(e2);
        }
    }

    engine_close(e);
    free(want_logits);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "test_sched: could not remove %s\n", dir);
    return check_report();
}
