/*
 * h2_frame.c - the HTTP/2 preface check, frame boundaries and the client
 * frame guard (h2_frame.h). Everything here reads 9-octet frame headers
 * and skips payloads by count: what a frame carries is gRPC core's to
 * parse.
 */
#include "h2_frame.h"

#include <string.h>

static const char k_magic[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
_Static_assert(sizeof k_magic - 1 == H2_MAGIC_LEN, "RFC 9113 3.4's magic");

enum { FRAME_HEADERS = 1, FRAME_RST_STREAM = 3, FRAME_SETTINGS = 4, FRAME_GOAWAY = 7, FRAME_CONTINUATION = 9 };
enum { FLAG_END_HEADERS = 0x4 };

static uint32_t get24(const uint8_t *p) { return (uint32_t)p[0] << 16 | (uint32_t)p[1] << 8 | p[2]; }
static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

enum h2_preface h2_preface_check(const uint8_t *p, size_t n)
{
    size_t m = n < H2_MAGIC_LEN ? n : H2_MAGIC_LEN;
    if (memcmp(p, k_magic, m) != 0) return H2_PREFACE_BAD;
    if (n < H2_PREFACE_LEN) return H2_PREFACE_MORE;
    /* the SETTINGS frame's header: type 4 on stream 0 */
    const uint8_t *h = p + H2_MAGIC_LEN;
    return h[3] == FRAME_SETTINGS && (get32(h + 5) & 0x7fffffff) == 0 ? H2_PREFACE_OK : H2_PREFACE_BAD;
}

void h2_goaway(uint8_t out[H2_GOAWAY_LEN], uint32_t last_stream, uint32_t code)
{
    static const uint8_t head[H2_FRAME_HEAD] = {0, 0, 8, FRAME_GOAWAY, 0, 0, 0, 0, 0};
    memcpy(out, head, sizeof head);
    put32(out + H2_FRAME_HEAD, last_stream & 0x7fffffff);
    put32(out + H2_FRAME_HEAD + 4, code);
}

/* ---- frame boundaries ------------------------------------------------------------- */

void h2_frames_init(h2_frames *f, uint64_t skip)
{
    /* the skipped octets (the magic) read as one frame's payload */
    *f = (h2_frames){.payload_left = (uint32_t)skip};
}

size_t h2_frames_next(h2_frames *f, const uint8_t *p, size_t n, h2_head *h, bool *got)
{
    size_t used = 0;
    *got = false;
    while (used < n) {
        if (f->payload_left) {
            size_t k = n - used < f->payload_left ? n - used : f->payload_left;
            f->payload_left -= (uint32_t)k;
            used += k;
            f->seen += k;
            if (!f->payload_left) f->frame_start = f->seen;
            continue;
        }
        if (f->head_len == 0) f->frame_start = f->seen;
        size_t k = H2_FRAME_HEAD - f->head_len;
        if (k > n - used) k = n - used;
        memcpy(f->head + f->head_len, p + used, k);
        f->head_len += (uint32_t)k;
        used += k;
        f->seen += k;
        if (f->head_len < H2_FRAME_HEAD) break;
        f->head_len = 0;
        *h = (h2_head){.length = get24(f->head), .type = f->head[3], .flags = f->head[4],
                       .stream = get32(f->head + 5) & 0x7fffffff};
        f->payload_left = h->length;
        if (!f->payload_left) f->frame_start = f->seen;
        *got = true;
        break;
    }
    return used;
}

void h2_frames_feed(h2_frames *f, const uint8_t *p, size_t n)
{
    h2_head h;
    bool got;
    for (size_t used = 0; used < n;) used += h2_frames_next(f, p + used, n - used, &h, &got);
}

uint64_t h2_frames_boundary(const h2_frames *f)
{
    return f->head_len || f->payload_left ? f->frame_start : f->seen;
}

/* ---- the guard -------------------------------------------------------------------- */

void h2_bucket_init(h2_bucket *b, uint32_t resets_per_s, int64_t now_ms)
{
    *b = (h2_bucket){.tokens = (int64_t)resets_per_s * 1000, .refilled_ms = now_ms};
}

static void bucket_refill(h2_bucket *b, uint32_t per_s, int64_t now_ms)
{
    int64_t cap = (int64_t)per_s * 1000;
    if (now_ms <= b->refilled_ms) return;
    int64_t add = (now_ms - b->refilled_ms) * per_s;
    b->tokens = add >= cap - b->tokens ? cap : b->tokens + add;
    b->refilled_ms = now_ms;
}

bool h2_bucket_full(const h2_bucket *b, uint32_t resets_per_s, int64_t now_ms)
{
    h2_bucket now = *b;
    bucket_refill(&now, resets_per_s, now_ms);
    return now.tokens == (int64_t)resets_per_s * 1000;
}

void h2_guard_init(h2_guard *g, const h2_limits *lim, int64_t now_ms)
{
    *g = (h2_guard){.lim = *lim, .verdict = H2_OK};
    h2_bucket_init(&g->own_resets, lim->resets_per_s, now_ms);
    g->resets = &g->own_resets;
    h2_frames_init(&g->frames, H2_MAGIC_LEN);
}

void h2_guard_share_resets(h2_guard *g, h2_bucket *b) { g->resets = b; }

/* G3: one RST_STREAM takes a token */
static bool reset_allowed(h2_guard *g, int64_t now_ms)
{
    bucket_refill(g->resets, g->lim.resets_per_s, now_ms);
    if (g->resets->tokens < 1000) return false;
    g->resets->tokens -= 1000;
    return true;
}

static enum h2_verdict judge(h2_guard *g, const h2_head *h, int64_t now_ms)
{
    switch (h->type) {
    case FRAME_HEADERS:
        if (h->stream > g->last_stream) g->last_stream = h->stream;
        g->in_block = !(h->flags & FLAG_END_HEADERS);
        g->block_octets = h->length;
        g->continuations = 0;
        break;
    case FRAME_CONTINUATION:
        if (!g->in_block) return H2_OK; /* a protocol error core answers */
        g->block_octets += h->length;
        if (++g->continuations > g->lim.max_continuations) return H2_TOO_MANY_CONTINUATIONS;
        g->in_block = !(h->flags & FLAG_END_HEADERS);
        break;
    case FRAME_RST_STREAM:
        return reset_allowed(g, now_ms) ? H2_OK : H2_TOO_MANY_RESETS;
    default:
        g->in_block = false; /* a protocol error inside a block: core's to answer */
        return H2_OK;
    }
    return g->block_octets > g->lim.max_block ? H2_BLOCK_TOO_LARGE : H2_OK;
}

enum h2_verdict h2_guard_feed(h2_guard *g, const uint8_t *p, size_t n, int64_t now_ms, size_t *ok_len)
{
    *ok_len = 0;
    if (g->verdict != H2_OK) return g->verdict; /* G1 */
    uint64_t start = g->frames.seen;
    for (size_t used = 0; used < n;) {
        h2_head h;
        bool got;
        used += h2_frames_next(&g->frames, p + used, n - used, &h, &got);
        if (got && (g->verdict = judge(g, &h, now_ms)) != H2_OK) {
            /* G2: up to the offending frame's header, and not into it */
            uint64_t head_at = g->frames.seen - H2_FRAME_HEAD;
            *ok_len = head_at > start ? (size_t)(head_at - start) : 0;
            return g->verdict;
        }
    }
    *ok_len = n;
    return H2_OK;
}

const char *h2_verdict_str(enum h2_verdict v)
{
    switch (v) {
    case H2_OK: return "ok";
    case H2_TOO_MANY_RESETS: return "too many RST_STREAM frames (--grpc-max-resets)";
    case H2_BLOCK_TOO_LARGE: return "a header block over --max-header";
    case H2_TOO_MANY_CONTINUATIONS: return "too many CONTINUATION frames in one header block";
    }
    return "?";
}
