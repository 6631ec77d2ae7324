/*
 * fuzz_h2_frame.c - libFuzzer target for what ferry reads of HTTP/2 ahead
 * of gRPC core (server/grpc/h2_frame.h): the preface check grpc_listen.c
 * makes before it hands a connection on, and the frame-header guard and
 * frame boundaries grpc_relay.c keeps for each connection.
 *
 * Input: bytes 0..3 choose the limits (header block octets, CONTINUATION
 * frames, resets per second) and a clock step; the rest is what a client
 * sends from its first octet (its preface included).
 *
 * Promises checked: the preface check says MORE only while fewer than
 * H2_PREFACE_LEN octets are in, and once BAD or OK it stays so as more
 * arrive; guards sharing a reset bucket let through no more than one
 * alone would; the guard's verdict and the octets it lets through do not depend
 * on how the stream is cut into reads, but for the start of the offending
 * frame's header that earlier reads let through (G2 holds for any cut); what it lets
 * through, fed to a fresh guard, passes; a verdict is final (G1); the
 * reset bucket stays in bounds (G3); a frame boundary is never past what
 * was fed and does not depend on the cuts either; a GOAWAY reads back as
 * one frame of type 7. Build: README.md.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../server/grpc/h2_frame.h"

#define CHECK(cond)                                                                               \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            fprintf(stderr, "fuzz_h2_frame: %s:%d: promise broken: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                              \
        }                                                                                         \
    } while (0)

static void check_preface(const uint8_t *p, size_t n)
{
    enum h2_preface last = H2_PREFACE_MORE;
    size_t upto = n < H2_PREFACE_LEN + 4 ? n : H2_PREFACE_LEN + 4;
    for (size_t k = 0; k <= upto; k++) {
        enum h2_preface v = h2_preface_check(p, k);
        if (k < H2_PREFACE_LEN) CHECK(v != H2_PREFACE_OK);
        else CHECK(v != H2_PREFACE_MORE);
        if (last != H2_PREFACE_MORE) CHECK(v == last);
        last = v;
    }
}

/* Feeds p in reads cut where cuts says (each byte a read's length, 0 = 1);
 * the clock advances step ms per read when step. Returns the verdict and
 * in *passed the octets let through. */
static enum h2_verdict feed_cut(h2_guard *g, const uint8_t *p, size_t n, const uint8_t *cuts, size_t n_cuts,
                                int64_t step, size_t *passed)
{
    size_t off = 0, c = 0;
    int64_t t = 0;
    enum h2_verdict v = H2_OK;
    *passed = 0;
    while (off < n) {
        size_t len = n_cuts ? cuts[c++ % n_cuts] : n;
        if (!len) len = 1;
        if (len > n - off) len = n - off;
        size_t ok;
        enum h2_verdict was = g->verdict;
        v = h2_guard_feed(g, p + off, len, t, &ok);
        CHECK(ok <= len);
        if (was != H2_OK) CHECK(v == was && ok == 0); /* G1 */
        if (v == H2_OK) CHECK(ok == len);
        CHECK(g->resets->tokens >= 0 && g->resets->tokens <= (int64_t)g->lim.resets_per_s * 1000); /* G3 */
        *passed += ok;
        off += len;
        t += step;
    }
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4) return 0;
    h2_limits lim = {.max_block = 64u * (data[0] + 1u), .max_continuations = data[1] % 70u,
                     .resets_per_s = (uint32_t)data[2] % 16u + 1u};
    int64_t step = data[3] % 50;
    const uint8_t *p = data + 4;
    size_t n = size - 4;
    check_preface(p, n);
    if (h2_preface_check(p, n) != H2_PREFACE_OK) return 0; /* the listener hands on nothing else */

    /* one read against reads cut by the stream's own bytes, same clock */
    h2_guard whole, cut;
    h2_guard_init(&whole, &lim, 0);
    h2_guard_init(&cut, &lim, 0);
    size_t passed_whole, passed_cut;
    enum h2_verdict v = feed_cut(&whole, p, n, NULL, 0, 0, &passed_whole);
    CHECK(feed_cut(&cut, p, n, p, n < 64 ? n : 64, 0, &passed_cut) == v);
    /* G2: a cut may have let the start of the offending frame's header through, never more */
    CHECK(passed_cut >= passed_whole && passed_cut < passed_whole + (v == H2_OK ? 1 : H2_FRAME_HEAD));
    if (v != H2_OK) {
        /* G2: what went through does not hold the offending frame */
        h2_guard again;
        h2_guard_init(&again, &lim, 0);
        size_t ok;
        CHECK(h2_guard_feed(&again, p, passed_whole, 0, &ok) == H2_OK && ok == passed_whole);
    }
    /* with a clock: verdicts stay final, the bucket in bounds */
    h2_guard timed;
    h2_guard_init(&timed, &lim, 0);
    size_t passed_timed;
    feed_cut(&timed, p, n, p + n / 2, n - n / 2 < 16 ? n - n / 2 : 16, step, &passed_timed);
    /* two connections of one address: a shared bucket, the same promises,
     * and the second never allowed more than a lone guard would be */
    h2_bucket shared;
    h2_bucket_init(&shared, lim.resets_per_s, 0);
    h2_guard first, second, lone;
    h2_guard_init(&first, &lim, 0);
    h2_guard_init(&second, &lim, 0);
    h2_guard_init(&lone, &lim, 0);
    h2_guard_share_resets(&first, &shared);
    h2_guard_share_resets(&second, &shared);
    size_t passed_first, passed_second, passed_lone;
    feed_cut(&first, p, n, NULL, 0, 0, &passed_first);
    feed_cut(&second, p, n, NULL, 0, 0, &passed_second);
    feed_cut(&lone, p, n, NULL, 0, 0, &passed_lone);
    CHECK(passed_first == passed_lone && passed_second <= passed_lone);
    CHECK(!h2_bucket_full(&shared, lim.resets_per_s, 0) || shared.tokens == (int64_t)lim.resets_per_s * 1000);

    /* frame boundaries, whole and cut */
    h2_frames fw, fc;
    h2_frames_init(&fw, H2_MAGIC_LEN);
    h2_frames_init(&fc, H2_MAGIC_LEN);
    h2_frames_feed(&fw, p, n);
    for (size_t off = 0, k = 0; off < n; k++) {
        size_t len = p[k % n] % 7 + 1;
        if (len > n - off) len = n - off;
        h2_frames_feed(&fc, p + off, len);
        CHECK(h2_frames_boundary(&fc) <= fc.seen);
        off += len;
    }
    CHECK(fw.seen == n && fc.seen == n);
    CHECK(h2_frames_boundary(&fw) == h2_frames_boundary(&fc));

    /* GOAWAY reads back */
    uint8_t ga[H2_GOAWAY_LEN];
    h2_goaway(ga, whole.last_stream, H2_ENHANCE_YOUR_CALM);
    h2_frames f;
    h2_frames_init(&f, 0);
    h2_head h;
    bool got;
    CHECK(h2_frames_next(&f, ga, sizeof ga, &h, &got) == H2_FRAME_HEAD && got);
    CHECK(h.type == 7 && h.length == 8 && h.stream == 0);
    h2_frames_feed(&f, ga + H2_FRAME_HEAD, 8);
    CHECK(h2_frames_boundary(&f) == H2_GOAWAY_LEN);
    return 0;
}
