/*
 * dense_kern.h - cpu_matmul.c's F32/F16/BF16 kernels, written once for a
 * vector width: included by cpu_matmul.c (AVX2, 8 lanes) and
 * cpu_matmul_avx512.c (16 lanes), each defining first DK_VEC, DK_W (its
 * lanes), DK_ZERO(), DK_LOADF(p), DK_FMA(a, b, c), DK_HSUM(v) (lanes
 * summed in a fixed order), dk_loadw(dt, base, i) (DK_W weights widened to
 * f32), DK_STOREF(p, v) and DK_NT (the prefill tile's token rows, a divisor
 * of TOKEN_PASS, at most 6).
 *
 * Every output is one DK_W-lane accumulator over k in steps of DK_W, its
 * lanes summed by DK_HSUM, the rest of the row added one by one - the same
 * in decode (weights widened as they stream) and prefill (widened into
 * scratch first, the accumulators kept in scratch between column blocks),
 * whatever the tile and blocking, so a row's result does not depend on the
 * rest of its step. See cpu_matmul.c for the plan of the kernels.
 */
#ifndef FERRY_DENSE_KERN_H
#define FERRY_DENSE_KERN_H

#define DIRECT_MAX_TOKENS 16 /* quantized weights: token rows per call of the direct kernels */
#define DENSE_DIRECT_MAX 8   /* dense weights: up to this many rows direct (weights widened on the fly), */
                             /* more through the GEMM (measured: the GEMM wins from 8-12 rows) */
#define PREFETCH_BYTES 1024  /* how far ahead of each weight row stream to prefetch */

static inline __attribute__((always_inline)) float load1(ferry_dtype dt, const void *base, size_t i)
{
    switch (dt) {
    case DT_BF16: return bf16_to_f32(((const uint16_t *)base)[i]);
    case DT_F16: return f16_to_f32(((const uint16_t *)base)[i]);
    default: return ((const float *)base)[i];
    }
}

/* out[t * ldo + r0 + i] = sum_k W[r0 + i, k] * x[t * ldx + k] for i < NR,
 * t < NT. With `pf`, prefetches each row PREFETCH_BYTES ahead. */
static inline __attribute__((always_inline)) void kern(ferry_dtype dt, int NR, int NT, bool pf, const void *w,
                                                       size_t cols, size_t r0, const float *x, size_t ldx,
                                                       float *out, size_t ldo)
{
    DK_VEC acc[4][DK_NT > 4 ? DK_NT : 4];
    const size_t esz = dt == DT_F32 ? 4 : 2;
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) acc[i][t] = DK_ZERO();
    size_t k = 0;
#define KERN_STEP(kk)                                                                                 \
    do {                                                                                              \
        DK_VEC xv[DK_NT > 4 ? DK_NT : 4];                                                             \
        _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) xv[t] = DK_LOADF(x + t * ldx + (kk));    \
        _Pragma("GCC unroll 4") for (int i = 0; i < NR; i++) {                                        \
            DK_VEC wv = dk_loadw(dt, w, (r0 + i) * cols + (kk));                                      \
            _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)                                      \
                acc[i][t] = DK_FMA(wv, xv[t], acc[i][t]);                                             \
        }                                                                                             \
    } while (0)
    if (pf) {
        const size_t step = 64 / esz; /* elements per cache line */
        for (; k + step <= cols; k += step) {
#pragma GCC unroll 4
            for (int i = 0; i < NR; i++)
                _mm_prefetch((const char *)w + ((r0 + i) * cols + k) * esz + PREFETCH_BYTES, _MM_HINT_T0);
#pragma GCC unroll 4
            for (size_t j = 0; j < step; j += DK_W) KERN_STEP(k + j);
        }
    }
    for (; k + DK_W <= cols; k += DK_W) KERN_STEP(k);
#undef KERN_STEP
    for (int i = 0; i < NR; i++) {
        for (int t = 0; t < NT; t++) {
            float s = DK_HSUM(acc[i][t]);
            for (size_t kk = k; kk < cols; kk++) s += load1(dt, w, (r0 + i) * cols + kk) * x[t * ldx + kk];
            out[t * ldo + r0 + i] = s;
        }
    }
}

/* Decode: rows [r0, r1) for n <= DIRECT_MAX_TOKENS token rows. The first
 * token chunk streams the rows from memory (with prefetch); later chunks
 * find them in L1. */
static inline __attribute__((always_inline)) void rows_direct(ferry_dtype dt, const void *w, size_t cols, size_t r0,
                                                              size_t r1, const float *x, int n, float *out, size_t ldo)
{
    if (n <= 2) {
        size_t r = r0;
        if (n == 1) {
            for (; r + 4 <= r1; r += 4) kern(dt, 4, 1, false, w, cols, r, x, cols, out, ldo);
            for (; r < r1; r++) kern(dt, 1, 1, false, w, cols, r, x, cols, out, ldo);
        } else {
            for (; r + 4 <= r1; r += 4) kern(dt, 4, 2, true, w, cols, r, x, cols, out, ldo);
            for (; r < r1; r++) kern(dt, 1, 2, false, w, cols, r, x, cols, out, ldo);
        }
        return;
    }
    for (size_t r = r0; r < r1; r += 2) {
        int nr = r + 2 <= r1 ? 2 : 1;
        for (int t = 0; t < n; t += 4) {
            const float *xt = x + (size_t)t * cols;
            float *ot = out + (size_t)t * ldo;
            bool first = t == 0;
            switch ((n - t < 4 ? n - t : 4) * 2 + nr - 1) {
            case 2: kern(dt, 1, 1, false, w, cols, r, xt, cols, ot, ldo); break;
            case 3: if (first) kern(dt, 2, 1, true, w, cols, r, xt, cols, ot, ldo); else kern(dt, 2, 1, false, w, cols, r, xt, cols, ot, ldo); break;
            case 4: kern(dt, 1, 2, false, w, cols, r, xt, cols, ot, ldo); break;
            case 5: if (first) kern(dt, 2, 2, true, w, cols, r, xt, cols, ot, ldo); else kern(dt, 2, 2, false, w, cols, r, xt, cols, ot, ldo); break;
            case 6: kern(dt, 1, 3, false, w, cols, r, xt, cols, ot, ldo); break;
            case 7: if (first) kern(dt, 2, 3, true, w, cols, r, xt, cols, ot, ldo); else kern(dt, 2, 3, false, w, cols, r, xt, cols, ot, ldo); break;
            case 8: kern(dt, 1, 4, false, w, cols, r, xt, cols, ot, ldo); break;
            default: if (first) kern(dt, 2, 4, true, w, cols, r, xt, cols, ot, ldo); else kern(dt, 2, 4, false, w, cols, r, xt, cols, ot, ldo); break;
            }
        }
    }
}

static void direct_f32(const void *w, size_t cols, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo)
{
    rows_direct(DT_F32, w, cols, r0, r1, x, n, out, ldo);
}
static void direct_bf16(const void *w, size_t cols, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo)
{
    rows_direct(DT_BF16, w, cols, r0, r1, x, n, out, ldo);
}
static void direct_f16(const void *w, size_t cols, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo)
{
    rows_direct(DT_F16, w, cols, r0, r1, x, n, out, ldo);
}

typedef void (*direct_fn)(const void *, size_t, size_t, size_t, const float *, int, float *, size_t);

static direct_fn direct_for(ferry_dtype dt)
{
    return dt == DT_BF16 ? direct_bf16 : dt == DT_F16 ? direct_f16 : direct_f32;
}

/* ---- prefill: a cache-blocked GEMM keeping decode's order of operations ----
 * Each output is still one DK_W-lane accumulator over k in steps of DK_W,
 * lanes summed by DK_HSUM at the end, then the last cols % DK_W columns one
 * by one: exactly kern's operations, so prefill and decode agree bit for
 * bit. What changes is where the operands come from (BLIS's loops, with the
 * weights in the role of its packed A):
 *   - TOKEN_PASS token rows at a time, a task's rows PANEL_ROWS at a time;
 *   - the panel's columns PANEL_COLS at a time, widened to f32 once into
 *     per-worker scratch (PANEL_ROWS x PANEL_COLS floats, 128 KiB: L2) and
 *     applied to every token row of the pass;
 *   - within it KC_BLOCK columns at a time: a tile of DK_NT token rows
 *     (DK_NT x KC_BLOCK floats) stays in L1 while each 4 rows of the panel
 *     run their 4 x DK_NT accumulators over the block.
 * Between column blocks the accumulators wait in scratch (PANEL_ROWS x
 * TOKEN_PASS vectors, 192 KiB at 16 lanes), lane by lane as they are:
 * storing an f32 and loading it back changes nothing. Each x tile loaded
 * into L1 serves the panel's 8 row blocks; each weight is read from memory
 * and widened once per TOKEN_PASS token rows. */

#define KC_BLOCK 512    /* columns per L1 block: a multiple of DK_W */
#define PANEL_COLS 512 /* columns widened at a time: a multiple of KC_BLOCK */
#define PANEL_ROWS 96   /* weight rows per panel: a multiple of 4 */
#define TOKEN_PASS 96   /* token rows per pass: a multiple of DK_NT */

/* Floats of a worker's prefill scratch (for up to 16 lanes): the widened
 * panel, the accumulators of a panel x pass, 16 to align. */
#define PANEL_LD (PANEL_COLS + 16) /* floats from one widened row to the next: off the 4 KiB stride, */
                                   /* whose rows would share L1 sets */
#define TILE_LD (KC_BLOCK + 16)    /* the same for a copied x tile */
#define DENSE_PREFILL_SCRATCH \
    ((size_t)PANEL_ROWS * PANEL_LD + (size_t)PANEL_ROWS * TOKEN_PASS * 16 + 6 * (size_t)TILE_LD + 16)

/* buf[i * DK_NT + t] (DK_W lanes) += W[i, k] x[t, k] for k < len (a
 * multiple of DK_W), i < NR, t < NT: wf and x a block's columns, rows ldw
 * and ldx floats apart. */
static inline __attribute__((always_inline)) void kern_acc(int NR, int NT, const float *wf, size_t ldw,
                                                           const float *x, size_t ldx, size_t len, float *buf)
{
    DK_VEC acc[4][DK_NT];
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) acc[i][t] = DK_LOADF(buf + (size_t)(i * DK_NT + t) * DK_W);
    for (size_t k = 0; k < len; k += DK_W) {
        DK_VEC xv[DK_NT];
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) xv[t] = DK_LOADF(x + (size_t)t * ldx + k);
#pragma GCC unroll 4
        for (int i = 0; i < NR; i++) {
            DK_VEC wv = DK_LOADF(wf + (size_t)i * ldw + k);
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) acc[i][t] = DK_FMA(wv, xv[t], acc[i][t]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) DK_STOREF(buf + (size_t)(i * DK_NT + t) * DK_W, acc[i][t]);
}

/* kern_acc with NR, NT as constants (each shape its own unrolled code). */
static void kern_acc_any(int nr, int nt, const float *wf, size_t ldw, const float *x, size_t ldx, size_t len,
                         float *buf)
{
#define KA_NT(NR)                                                                              \
    switch (nt) {                                                                                 \
    case 1: kern_acc(NR, 1, wf, ldw, x, ldx, len, buf); return;                         \
    case 2: kern_acc(NR, 2 <= DK_NT ? 2 : 1, wf, ldw, x, ldx, len, buf); return;         \
    case 3: kern_acc(NR, 3 <= DK_NT ? 3 : 1, wf, ldw, x, ldx, len, buf); return;         \
    case 4: kern_acc(NR, 4 <= DK_NT ? 4 : 1, wf, ldw, x, ldx, len, buf); return;         \
    case 5: kern_acc(NR, 5 <= DK_NT ? 5 : 1, wf, ldw, x, ldx, len, buf); return;         \
    default: kern_acc(NR, 6 <= DK_NT ? 6 : 1, wf, ldw, x, ldx, len, buf); return;        \
    }
    switch (nr) {
    case 1: KA_NT(1)
    case 2: KA_NT(2)
    case 3: KA_NT(3)
    default: KA_NT(4)
    }
#undef KA_NT
}

/* Lines of weight rows to bring into L2 a few at a time while the kernels
 * run: the next panel chunk's, which would otherwise be widened at memory
 * latency (short row pieces, far apart, that the hardware prefetcher does
 * not see coming). */
typedef struct {
    const char *row;  /* the next line's row, NULL: none */
    size_t stride;    /* bytes from row to row */
    size_t lines;     /* cache lines per row */
    size_t line;      /* the next line in its row */
    size_t rows;      /* rows left, the current one included */
} pf_chunk;

static inline void pf_some(pf_chunk *c, size_t count)
{
    for (; count && c->rows; count--) {
        _mm_prefetch(c->row + c->line * 64, _MM_HINT_T1);
        if (++c->line == c->lines) c->line = 0, c->row += c->stride, c->rows--;
    }
}

/* The chunk (rows [p0, p0 + np), columns [pc, pe)) after the given one, in
 * dense_prefill's order; none after the last pass's last. */
static pf_chunk pf_next(const weight *w, size_t r0, size_t r1, size_t kv, size_t p0, size_t pc, bool last_pass)
{
    size_t esz = w->dtype == DT_F32 ? 4 : 2, cols = (size_t)w->cols;
    if (pc + PANEL_COLS < kv) pc += PANEL_COLS;
    else if (p0 + PANEL_ROWS < r1) p0 += PANEL_ROWS, pc = 0;
    else if (!last_pass) p0 = r0, pc = 0;
    else return (pf_chunk){0};
    size_t pe = pc + PANEL_COLS < kv ? pc + PANEL_COLS : kv, np = r1 - p0 < PANEL_ROWS ? r1 - p0 : PANEL_ROWS;
    size_t lines = ((pe - pc) * esz + 63) / 64;
    return (pf_chunk){(const char *)w->data + (p0 * cols + pc) * esz, cols * esz, lines, 0, np};
}

/* Rows [r0, r1) of a dense weight for n > DIRECT_MAX_TOKENS token rows;
 * scratch: DENSE_PREFILL_SCRATCH floats of the worker's. */
static void dense_prefill(const weight *w, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo,
                          float *scratch)
{
    size_t cols = (size_t)w->cols, kv = cols - cols % DK_W; /* vector steps end at kv, as in kern */
    float *wf = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *accs = wf + (size_t)PANEL_ROWS * PANEL_LD, *xt = accs + (size_t)PANEL_ROWS * TOKEN_PASS * 16;
    for (size_t t0 = 0; t0 < (size_t)n; t0 += TOKEN_PASS) {
        size_t t1 = t0 + TOKEN_PASS < (size_t)n ? t0 + TOKEN_PASS : (size_t)n;
        for (size_t p0 = r0; p0 < r1; p0 += PANEL_ROWS) {
            size_t p1 = p0 + PANEL_ROWS < r1 ? p0 + PANEL_ROWS : r1, np = p1 - p0;
            memset(accs, 0, (np + 3) / 4 * 4 * TOKEN_PASS * DK_W * sizeof *accs);
            for (size_t pc = 0; pc < kv; pc += PANEL_COLS) {
                size_t pe = pc + PANEL_COLS < kv ? pc + PANEL_COLS : kv;
                for (size_t i = 0; i < np; i++)
                    cpu_row_to_f32(wf + i * PANEL_LD, w, (int64_t)(p0 + i), (int64_t)pc, (int64_t)(pe - pc));
                pf_chunk next = pf_next(w, r0, r1, kv, p0, pc, t1 == (size_t)n);
                size_t steps = (pe - pc + KC_BLOCK - 1) / KC_BLOCK * ((t1 - t0 + DK_NT - 1) / DK_NT);
                size_t quota = next.lines * next.rows / steps + 1;
                for (size_t kb = pc; kb < pe; kb += KC_BLOCK) {
                    size_t ke = kb + KC_BLOCK < pe ? kb + KC_BLOCK : pe;
                    for (size_t t = t0; t < t1; t += DK_NT) {
                        int nt = t1 - t < DK_NT ? (int)(t1 - t) : DK_NT;
                        pf_some(&next, quota);
                        for (int b = 0; b < nt; b++) /* the tile, contiguous: its rows apart in L1's sets */
                            memcpy(xt + (size_t)b * TILE_LD, x + (t + (size_t)b) * cols + kb, (ke - kb) * sizeof *xt);
                        for (size_t i = 0; i < np; i += 4) {
                            int nr = np - i < 4 ? (int)(np - i) : 4;
                            float *buf = accs + ((i / 4) * TOKEN_PASS + (t - t0)) * 4 * DK_W;
                            kern_acc_any(nr, nt, wf + i * PANEL_LD + (kb - pc), PANEL_LD, xt, TILE_LD, ke - kb, buf);
                        }
                    }
                }
            }
            for (size_t i = 0; i < np; i += 4) {
                int nr = np - i < 4 ? (int)(np - i) : 4;
                for (size_t t = t0; t < t1; t += DK_NT) {
                    int nt = t1 - t < DK_NT ? (int)(t1 - t) : DK_NT;
                    const float *buf = accs + ((i / 4) * TOKEN_PASS + (t - t0)) * 4 * DK_W;
                    for (int a = 0; a < nr; a++)
                        for (int b = 0; b < nt; b++) {
                            size_t r = p0 + i + (size_t)a, tt = t + (size_t)b;
                            float s = DK_HSUM(DK_LOADF(buf + (size_t)(a * DK_NT + b) * DK_W));
                            for (size_t kk = kv; kk < cols; kk++)
                                s += load1(w->dtype, w->data, r * cols + kk) * x[tt * cols + kk];
                            out[tt * ldo + r] = s;
                        }
                }
            }
        }
    }
}

/* Rows [r0, r1) of a dense weight for n token rows; scratch:
 * DENSE_PREFILL_SCRATCH floats of the worker's (prefill). */
static void dense_rows(const weight *w, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo, float *wf)
{
    if (n <= DENSE_DIRECT_MAX) {
        direct_for(w->dtype)(w->data, (size_t)w->cols, r0, r1, x, n, out, ldo);
        return;
    }
    dense_prefill(w, r0, r1, x, n, out, ldo, wf);
}

#endif
