/*
 * experts.h - a mixture-of-experts model's experts at run time: which tier
 * each lives on, the expert slots in device memory (the expert cache), and
 * fetching only the experts a step's tokens were routed to.
 *
 * Each expert is a group of the plan (plan.h GROUP_EXPERT) with its own
 * tier and, on disk, its own 4096-aligned region of the offload dir. A
 * device-tier expert is computed where it is. The others are brought into
 * expert slots: n_expert_slots buffers of expert_slot_bytes in device
 * memory that keep what they hold across steps, evicted least recently used
 * first (decode reuses a token's experts for the next tokens, and LRU needs
 * no history beyond the slots; see experts.c for the measured reason).
 *
 * experts_run(layer, ids) computes a layer's routed experts: those already
 * present (device tier or a slot) first, while the missing ones are read
 * (io_uring, O_DIRECT: just their regions of the blob) or copied, in the
 * order they will be computed; each missing one is computed as soon as it
 * has arrived. It runs on the compute thread and orders itself with the
 * backend's events: a slot is refilled only after the compute that read it
 * (its `computed` event on the copy stream), and compute reads a slot only
 * after its copy (its `copied` event on the compute stream).
 *
 * Speculation (experts_prefetch, --expert-prefetch): after a sparse layer
 * followed by another (on the device tier), that layer's router applied to
 * the current hidden state predicts its experts; their fetches start before that layer's attention,
 * when the link would otherwise be idle. experts.c says what it measured.
 */
#ifndef FERRY_EXPERTS_H
#define FERRY_EXPERTS_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "plan.h"
#include "stats.h"
#include "store.h"

typedef struct experts experts;


/* NULL *out (and FERRY_OK) for a plan without experts. The store must
 * outlive it. */
ferry_status experts_create(experts **out, backend *be, store *s, const plan *p);
void experts_free(experts *x);

/* Called with the view's layers[layer].experts[ids[k]] bound (store_bind);
 * queues every op that reads it before returning. */
typedef void (*experts_fn)(void *ctx, int k);

/* Computes layer `layer`'s experts ids[0..n) (distinct): fn(ctx, k) for
 * each k, in the order they become present. A failed fetch (read error,
 * checksum) fails the call, naming the blob, after the calls already made;
 * the slots stay consistent and the next call works normally. */
ferry_status experts_run(experts *x, int layer, const int32_t *ids, int n, experts_fn fn, void *ctx);

/* Starts fetching layer `layer`'s experts ids[0..n) (a prediction) into
 * free slots, least recently used first, where reads are to be had, and
 * returns without waiting: the run of that layer finds them in their slots
 * or on their way. Read errors surface in that run. Called between runs,
 * when the next sparse layer's attention is about to compute and the disk
 * would sit idle. */
void experts_prefetch(experts *x, int layer, const int32_t *ids, int n);

/* Waits for every read in flight (speculative ones no run claimed). */
void experts_drain(experts *x);

/* Marks the end of a step (for last_step_bytes); nothing is in flight after. */
void experts_step_done(experts *x);

/* Whether reads are checked against the manifest's CRC-32C (default on). */
void experts_set_verify(experts *x, bool on);
/* Expert groups found damaged by a read and not yet cleared: out[g] set
 * (out has plan n_groups entries); returns how many. */
int experts_damaged(experts *x, bool *out);
/* Group g was rebuilt: trusted again; any slot holding it is dropped. */
void experts_clear_damaged(experts *x, int g);

expert_stats experts_get_stats(experts *x);

#endif
