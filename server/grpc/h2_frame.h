/*
 * h2_frame.h - HTTP/2 framing as ferry's gRPC front end reads it, ahead of
 * gRPC core: the client's connection preface (grpc_listen.c), and the
 * 9-octet frame headers of both directions of a relayed connection
 * (grpc_relay.c). Payloads are never read. Pure functions over bytes, no
 * I/O: tests/fuzz/fuzz_h2_frame.c drives them. Private to server/grpc.
 *
 * Why ferry reads frame headers at all: Debian's gRPC core (1.51) has no
 * defence against a flood of reset streams (CVE-2023-44487) nor against a
 * header block that never ends, and no channel argument that adds one;
 * see grpc_relay.c.
 */
#ifndef FERRY_H2_FRAME_H
#define FERRY_H2_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* RFC 9113 3.4: the client's preface is these 24 octets, then a SETTINGS frame */
enum { H2_MAGIC_LEN = 24, H2_FRAME_HEAD = 9, H2_PREFACE_LEN = H2_MAGIC_LEN + H2_FRAME_HEAD, H2_GOAWAY_LEN = 17 };

enum h2_preface { H2_PREFACE_MORE, H2_PREFACE_OK, H2_PREFACE_BAD };
/* The first n octets a client sent: the whole preface (the magic and the
 * SETTINGS frame's header), not yet all of it, or not HTTP/2 with prior
 * knowledge. */
enum h2_preface h2_preface_check(const uint8_t *p, size_t n);

/* RFC 9113 7 */
enum { H2_ENHANCE_YOUR_CALM = 0xb };

/* A GOAWAY frame (no debug data) into out. */
void h2_goaway(uint8_t out[H2_GOAWAY_LEN], uint32_t last_stream, uint32_t code);

/* ---- frame boundaries ------------------------------------------------------------- */

typedef struct {
    uint32_t length;    /* of the payload */
    uint8_t type;
    uint8_t flags;
    uint32_t stream;    /* reserved bit cleared */
} h2_head;

/* Where one direction's frames begin and end, fed its octets in order. */
typedef struct {
    uint64_t seen;          /* octets fed */
    uint64_t frame_start;   /* where the frame being fed began (== seen between frames) */
    uint8_t head[H2_FRAME_HEAD];
    uint32_t head_len;      /* octets of the next frame header collected */
    uint32_t payload_left;  /* of the frame whose header came last */
} h2_frames;

void h2_frames_init(h2_frames *f, uint64_t skip);
/* Feeds up to n octets, stopping after a frame header completes (*got set,
 * *h filled); returns the octets taken. */
size_t h2_frames_next(h2_frames *f, const uint8_t *p, size_t n, h2_head *h, bool *got);
/* Feeds n octets, headers ignored. */
void h2_frames_feed(h2_frames *f, const uint8_t *p, size_t n);
/* The last frame boundary at or before the octets fed: up to it a GOAWAY
 * may follow what was written. */
uint64_t h2_frames_boundary(const h2_frames *f);

/* ---- the client's frames, bounded ------------------------------------------------- */

/* A header block in the frames of any client ferry knows (16 KiB, the
 * least SETTINGS_MAX_FRAME_SIZE) needs 64 CONTINUATION frames for the
 * largest --max-header (1 MiB); empty ones cost a peer nothing to send. */
#define H2_MAX_CONTINUATIONS 64

typedef struct {
    uint32_t max_block;          /* a header block's octets, HEADERS and CONTINUATION payloads (--max-header) */
    uint32_t max_continuations;  /* CONTINUATION frames in one header block */
    uint32_t resets_per_s;       /* RST_STREAM frames: a bucket of this many, refilled at this many a
                                  * second (--grpc-max-resets) */
} h2_limits;

/* RST_STREAM frames allowed: a bucket of resets_per_s, refilled at
 * resets_per_s a second, in thousandths of a reset (G3). */
typedef struct {
    int64_t tokens;
    int64_t refilled_ms;
} h2_bucket;

void h2_bucket_init(h2_bucket *b, uint32_t resets_per_s, int64_t now_ms);
/* Whether b has refilled to the brim by now: then it is as good as a new one. */
bool h2_bucket_full(const h2_bucket *b, uint32_t resets_per_s, int64_t now_ms);

enum h2_verdict { H2_OK, H2_TOO_MANY_RESETS, H2_BLOCK_TOO_LARGE, H2_TOO_MANY_CONTINUATIONS };

/* The client -> server direction of one connection. Invariants:
 *   G1. a verdict other than H2_OK is final: later feeds return it and read nothing.
 *   G2. a frame that breaks a limit is judged on its header: none of its
 *       payload, and of its header only what earlier feeds passed, has been
 *       let through when the verdict comes (the caller forwards *ok_len).
 *   G3. 0 <= resets->tokens <= resets_per_s * 1000 (milli-resets). */
typedef struct {
    h2_limits lim;
    h2_frames frames;
    enum h2_verdict verdict;
    bool in_block;               /* a HEADERS without END_HEADERS came; CONTINUATION follows */
    uint64_t block_octets;
    uint32_t continuations;
    h2_bucket own_resets;
    h2_bucket *resets;           /* G3: own_resets, or the bucket all connections of the client's
                                  * address share (grpc_relay.c); the guard is not to be copied */
    uint32_t last_stream;        /* the highest stream a HEADERS opened (GOAWAY's last-stream-id) */
} h2_guard;

/* The stream begins with the 24 octets of the magic (checked already).
 * The guard counts resets in a bucket of its own until h2_guard_share_resets. */
void h2_guard_init(h2_guard *g, const h2_limits *lim, int64_t now_ms);
/* Counts g's resets in b from now on (b outlives g's use). */
void h2_guard_share_resets(h2_guard *g, h2_bucket *b);
/* Feeds n octets the client sent; *ok_len is how many of them may be
 * forwarded (all of them while the verdict is H2_OK). */
enum h2_verdict h2_guard_feed(h2_guard *g, const uint8_t *p, size_t n, int64_t now_ms, size_t *ok_len);
const char *h2_verdict_str(enum h2_verdict v);

#endif
