/*
 * plan.h - placing a model's weights on tiers: which groups stay resident on
 * the device, which in host memory, which stream from the offload dir.
 *
 * Units are the embedding, each decoder layer (never split) and the head
 * (final norm + lm_head). Groups are the embedding, runs of group_size
 * consecutive layers, and the head; a group is the unit of placement and of
 * streaming. A group goes to the first tier, device then host, with room
 * for it, else to disk. Layer and head groups are placed in execution
 * order; the embedding is placed last because a step reads only a few of
 * its rows (the tokens' rows are gathered from whatever tier holds it), so
 * keeping it resident gains the least. With tied embeddings the table lives
 * in the head group and the embedding group is empty.
 *
 * Budgets (--max-memory) bound all that the model takes of a memory, not
 * only its weights. Device memory (a GPU): the device tier's weights, the
 * staging slots, the expert slots, the KV pool and the activations. Host
 * memory: the host tier's weights and the pinned bounce buffers disk reads
 * land in; on a unified backend (the CPU one, where the device tier is RAM
 * too) there is one memory, and host= bounds all of the above at once,
 * device= then only caps the part of it kept resident (alone it is refused:
 * it would bound nothing). A budget of 0 keeps weights off that memory and
 * bounds nothing else. What gives way, in order: the working memory at its
 * least (the slots the streamed groups need, the activations, the expert
 * slots, and a KV pool of one sequence of the whole context, or
 * --kv-memory) is reserved first, and the planner's read-ahead beyond
 * PLAN_DEFAULT_PREFETCH shortens before any weight leaves (a group kept
 * resident saves its whole read every step; a group more in flight, some
 * disk rate); the weights take what is left, in the placement order above,
 * the groups that do not fit going to disk (more streamed groups may need
 * bigger slots: placed again until it holds); a default KV pool then grows
 * into what the budget still has. With every weight on disk and still too
 * little, the planner's read-ahead (never a --prefetch given) shortens on,
 * down to one group ahead; a budget that cannot hold even that is refused,
 * naming the numbers. Code, libraries and small buffers (the
 * process's own baseline) are outside the budget; request buffers are
 * bounded by --request-memory.
 *
 * Every placement decision is made here, defaults included, so that `ferry
 * plan` shows what `serve` runs: a context of 0 means max_position_embeddings
 * capped at PLAN_DEFAULT_CONTEXT; without --kv-memory the KV pool is, under
 * a budget, what the budget leaves, else half of what the memory it lives
 * in (host_avail when unified, else device_avail) has left beside the rest
 * of the plan, at least one sequence of the whole context and at most
 * n_seqs of them; on a backend that is not unified, no device budget means
 * "keep resident what fits beside the working memory" (device_avail).
 * Planning reads no weights.
 */
#ifndef FERRY_PLAN_H
#define FERRY_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

typedef enum { TIER_DEVICE, TIER_HOST, TIER_DISK, TIER_COUNT } tier;
typedef enum { GROUP_EMBED, GROUP_LAYERS, GROUP_HEAD, GROUP_EXPERT } group_kind;

#define PLAN_UNLIMITED UINT64_MAX
/* The process's own baseline beside the model (code, libraries, allocator,
 * small buffers): counted in what the plan needs of host RAM, outside any
 * budget. */
#define PLAN_RUNTIME_OVERHEAD (96ull << 20)
#define PLAN_DEFAULT_CONTEXT 4096 /* context 0: min(max_position_embeddings, this) */
/* Disk groups are read as 4 MiB requests, 16 in flight (pipeline.c): groups
 * smaller than a few times that window let the queue drain at every group's
 * end (measured: 31 MB int4 groups read at 2.5 GB/s two ahead, 3.2 GB/s
 * eight ahead, on a disk that gives 3.5 to 121 MB groups). So when prefetch
 * is left to the planner (--prefetch 0, the default) it is
 * PLAN_DEFAULT_PREFETCH groups, or more where groups of at least
 * PLAN_READAHEAD_MIN_GROUP stream from disk: enough to work
 * PLAN_READAHEAD_BYTES ahead. An explicit --prefetch N is obeyed as it is:
 * it is what bounds the staging memory. */
#define PLAN_DEFAULT_PREFETCH 2
#define PLAN_READAHEAD_BYTES (256ull << 20)
#define PLAN_READAHEAD_MIN_GROUP (4ull << 20)

/* Mixture-of-experts models (model.h): a sparse layer's attention, norms
 * and router are in its layer group; each expert is a group of its own
 * (GROUP_EXPERT, after the head), placed on a tier of its own, never in the
 * layer pipeline: a step fetches only the experts its tokens were routed
 * to (experts.h) into the expert slots, device memory that also keeps
 * recently used experts across steps (the expert cache). Placement order:
 * the layer groups and head first (every step needs them), then the
 * experts layer by layer, then the embedding. */
typedef struct {
    group_kind kind;
    int first_layer, n_layers; /* GROUP_LAYERS; GROUP_EXPERT: its layer, 1 */
    int expert;                /* GROUP_EXPERT: its index in the layer */
    uint64_t bytes;            /* size of the group's blob (its staging slot layout) */
    tier tier;
    int slot;                  /* streamed: its own staging slot, or -1 for the shared ones (below) */
} plan_group;

typedef struct {
    uint64_t budget[2];   /* device, host memory budgets (above); PLAN_UNLIMITED when not given */
    int group_size;       /* >= 1 */
    int prefetch;         /* groups fetched ahead of the computing one, >= 1; 0 = the planner's (above) */
    int n_seqs;           /* sequences the KV cache holds */
    int context;          /* positions per sequence; 0 = the default (above) */
    uint64_t kv_memory;   /* bytes of the KV pool; 0 = what the memory affords (above) */
    int max_step_tokens;  /* most token rows in one step */
    bool unified;         /* device memory is host memory (the CPU backend) */
    uint64_t device_avail; /* not unified: device memory the backend can give; 0 = unknown */
    uint64_t host_avail;   /* unified: host memory the OS can give (util_mem_available); 0 = unknown */
    uint64_t expert_cache; /* bytes of expert slots wanted (--expert-cache); at least PLAN_EXPERT_MIN_SLOTS x top_k slots */
    int readahead_cap;     /* plan_make: the planner's prefetch at most this (0: no cap), where a budget needs it */
} plan_opts;

/* Expert slots beyond the cache: a layer's experts are fetched into free
 * slots, top_k x this many at least, so that a batch-1 step's experts are
 * all in flight at once and the next ones can come while these compute. */
#define PLAN_EXPERT_MIN_SLOTS 2
/* Expert reads in flight at most (and bounce buffers where device memory is
 * not host memory): a disk wants its queue full (measured on a 30B-A3B-
 * shaped model's 9 MiB experts: 2 in flight 229-237 ms a step, 4 244 ms,
 * 16 211-216 ms), each read's 4 MiB requests 16 deep in the aio layer. */
#define PLAN_EXPERT_READS 16

typedef struct {
    plan_opts opts;              /* as resolved: context, device budget */
    int n_groups;
    plan_group *groups;          /* embed, layer groups in order, head */
    uint64_t tier_bytes[TIER_COUNT];
    int n_streamed;              /* groups on host or disk, excluding the embedding */
    int prefetch;                /* groups fetched ahead: opts.prefetch, or plan_ahead's when that is 0 */
    /* Staging slots, sized per group (plan_slot_of): the largest streamed
     * groups may each have a slot of their own (slots 0 .. n_own_slots-1,
     * their size), and the others share n_stage_slots - n_own_slots slots
     * in turn, each the size of the largest of them; the planner picks how
     * many have their own to need the fewest bytes, so that a 525 MB head
     * does not make every 31 MB layer's slot 525 MB. */
    int n_stage_slots;           /* device staging slots */
    int n_own_slots;
    uint64_t *slot_size;         /* [n_stage_slots] bytes of each */
    uint64_t *slot_bounce;       /* [n_stage_slots] non-unified: its bounce buffer for disk reads (0: none) */
    int *stream;                 /* [n_streamed] the streamed groups in execution order */
    int *stream_rank;            /* [n_streamed] a shared-slot group's place among them in a step */
    uint64_t slot_bytes;         /* largest slot (the largest streamed group) */
    uint64_t stage_bytes;        /* the slots' bytes, device memory */
    uint64_t host_stage_bytes;   /* the bounce buffers' bytes, pinned host memory (non-unified) */
    uint64_t kv_blocks;          /* the KV pool (kv.h): blocks of KV_BLOCK_POSITIONS positions */
    int kv_block_positions;      /* positions per block */
    uint64_t kv_block_bytes;     /* one block: every layer's K and V */
    uint64_t kv_bytes;           /* kv_blocks x kv_block_bytes */
    uint64_t act_bytes;
    /* mixture of experts: groups first_expert .. n_groups-1 are the experts
     * (group first_expert + i * n_experts + e: expert e of the i-th sparse
     * layer) */
    int first_expert;            /* n_groups when the model has no experts */
    int n_expert_slots;          /* device slots for experts not on the device (0: none off it) */
    uint64_t expert_slot_bytes;  /* largest expert not on the device */
    uint64_t expert_stage_bytes; /* n_expert_slots x expert_slot_bytes, device memory */
    int expert_reads;            /* expert reads in flight at most: PLAN_EXPERT_READS, <= the slots */
    uint64_t expert_bounce_bytes; /* non-unified: expert_reads pinned host buffers for disk reads of experts */
} plan;

/* Model shape the plan needs beyond unit sizes. */
typedef struct {
    int n_layers;
    int dim, hidden, vocab, q_dim, kv_dim;
    int max_pos;          /* max_position_embeddings */
    int n_experts, top_k, moe_hidden; /* 0 for a dense model */
    int n_moe_layers;
    const int *moe_layers; /* [n_moe_layers] the sparse layers, ascending */
} plan_model;

/* unit_bytes: [n_layers + 2 + n_moe_layers * n_experts] = embedding, layer
 * 0 .. n_layers-1, head, then the experts (model.h's unit numbering); each a
 * multiple of the blob alignment. */
ferry_status plan_make(const plan_model *m, const uint64_t *unit_bytes, const plan_opts *o, plan *out);
/* The placement alone, as plan_make runs it for each try: o->budget are
 * the weight bytes each tier may hold (independent tiers, working memory
 * not counted), the KV pool --kv-memory or the default without a budget.
 * What the unit tests of first-fit placement and slot sizing call. */
ferry_status plan_place(const plan_model *m, const uint64_t *unit_bytes, const plan_opts *o, plan *out);
/* Groups fetched ahead of the computing one: prefetch when it is given
 * (>= 1); for 0, PLAN_DEFAULT_PREFETCH, or more where groups of slot_bytes
 * stream from disk (PLAN_READAHEAD_BYTES). */
int plan_ahead(int prefetch, uint64_t slot_bytes, bool disk);
void plan_free(plan *p);

/* The staging slot of fetch q (pipeline.h: fetch q holds stream[q %
 * n_streamed]). Any prefetch + 1 consecutive fetches have distinct slots. */
int plan_slot_of(const plan *p, uint64_t q);

/* Sequences of n_positions each that the KV pool holds at once. */
uint64_t plan_kv_sequences(const plan *p, int n_positions);

/* Parses "device=SIZE,host=SIZE" (either key optional; cpu= is host=, as in
 * accelerate; a bare "SIZE" is host=SIZE) into budget[2]. */
ferry_status plan_parse_budgets(const char *s, uint64_t budget[2]);

/* What the plan takes of each memory a --max-memory budget bounds (plan.h):
 * [0] device memory (0 when unified), [1] host memory (unified: all of it;
 * else the host tier and the bounce buffers). */
void plan_budget_used(const plan *p, const plan_opts *o, uint64_t used[2]);

/* What the plan allocates in each memory, by kind, for metrics (the
 * process's baseline not included): mem 0 device memory (all zero when
 * unified), 1 host memory. */
typedef enum { PLAN_MEM_WEIGHTS, PLAN_MEM_STAGING, PLAN_MEM_KV, PLAN_MEM_ACTIVATIONS, PLAN_MEM_EXPERTS,
               PLAN_MEM_KINDS } plan_mem_kind;
extern const char *const plan_mem_kind_names[PLAN_MEM_KINDS];
void plan_memory_bytes(const plan *p, int mem, uint64_t out[PLAN_MEM_KINDS]);

/* Memory the plan needs in host RAM and in device memory (equal for unified),
 * the process's own baseline (PLAN_RUNTIME_OVERHEAD) included in host RAM. */
void plan_needs(const plan *p, const plan_opts *o, uint64_t *host, uint64_t *device);

/* Fails, saying how much is needed and of what, when the plan does not fit
 * the memory available (device_avail ignored when unified). */
ferry_status plan_check(const plan *p, const plan_opts *o, uint64_t host_avail, uint64_t device_avail);

const char *tier_name(tier t);


#endif
