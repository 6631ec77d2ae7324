/*
 * mm_kern.h - cpu_matmul.c's exact-mode kernels (f32 activations) for
 * F32/F16/BF16 and int8/int4 weights, written once for a vector width:
 * included by cpu_matmul.c (AVX2, 8 lanes) and cpu_matmul_avx512.c (16
 * lanes), each defining first DK_VEC, DK_W (its lanes), DK_ZERO(),
 * DK_LOADF(p), DK_STOREF(p, v), DK_FMA(a, b, c), DK_SET1(f),
 * DK_HSUM(v) (lanes summed in a fixed order), dk_loadw(dt, base, i) (DK_W
 * weights widened to f32), dk_q8, dk_q4, dk_split (the quantized section
 * says what), DK_NT (the dense prefill tile's token rows, at most 6) and
 * DK_QNR x DK_QNT (int8/int4's tile, at most 4 x DK_NT); each exports them
 * as its cpu_mm_kernels (cpu.h).
 *
 * Dense: every output is one DK_W-lane accumulator over k in steps of DK_W,
 * its lanes summed by DK_HSUM, the rest of the row added one by one.
 * Quantized: the same per group, each group's sum scaled into a total.
 * Decode (weights widened as they stream) and prefill (the GEMM below:
 * widened into scratch first, accumulators kept in scratch between column
 * blocks) take the same operations in the same order whatever the tile and
 * blocking, so a row's result does not depend on the rest of its step.
 * See cpu_matmul.c for the plan of the kernels.
 */
#ifndef FERRY_MM_KERN_H
#define FERRY_MM_KERN_H

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

/* Decode: rows [r0, r1) for n <= DENSE_DIRECT_MAX token rows. The first
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

/* ---- int8 / int4 weights against f32 activations: decode ----------------------
 * The arithmetic, the same in decode and prefill (batch invariance) and for
 * every token count: per group of columns, codes times x summed in one
 * DK_W-lane accumulator in steps of DK_W columns (int8: in column order;
 * int4: a step of 2 DK_W columns is DK_W packed bytes, whose low nibbles are
 * the even columns and high nibbles the odd ones, against x split the same
 * way once per call - the even half, then the odd half; each nibble less
 * its +8 bias before it becomes a float); the row's total += scale x group
 * sum (one FMA a lane); at the end the lanes summed by DK_HSUM, then the
 * columns after the last whole step, one by one. Each includer defines
 * dk_q8(p) (DK_W int8 codes as f32), dk_q4(p, &lo, &hi) (DK_W bytes' low
 * and high nibbles less 8, as f32) and dk_split(p, &e, &o) (the even and
 * odd columns of 2 DK_W floats). Layouts taken (q_takes): int8
 * with groups of whole steps or one group a row, int4 the same with its
 * double steps; others go to cpu_qmatmul.c. */

/* quantized weights: up to this many rows direct, more through the GEMM.
 * Measured (1B shape, int4 and int8, 2 threads, interleaved runs): at 12
 * and 16 rows direct decodes 20-60% faster than the GEMM (int4 B=16
 * 41-44 against 28-39 tok/s, int8 47-49 against 29-33), at 32 and 64 no
 * slower; prefill of 512 (chunks the GEMM takes) no faster direct. */
#define Q_DIRECT_MAX 16
#define QK_ROWS1 4 /* weight rows at a time for one token row (8 measured no faster) */

typedef struct {
    bool q4;
    const uint8_t *data; /* [rows, row_bytes] */
    size_t row_bytes;
    const void *scales; /* [rows, n_groups] of sdt */
    ferry_dtype sdt;
    size_t cols, group, n_groups;
    size_t span; /* columns per group as the kernels walk them: group, or cols for one group a row */
    size_t step; /* columns per step: DK_W (int8), 2 DK_W (int4) */
    size_t kv;   /* columns in whole steps; those after, one by one */
} qk_view;

/* x as the kernels read it: int8 x itself; int4 each 2 DK_W columns' even
 * then odd ones (kv floats a row). */
typedef struct {
    const float *xp;
    size_t ldp;
} qk_x;

static bool q_takes(const weight *w)
{
    size_t step = w->quant == WQ_INT4 ? 2 * DK_W : DK_W;
    if (w->quant != WQ_INT8 && w->quant != WQ_INT4) return false;
    return w->group >= w->cols || (size_t)w->group % step == 0;
}

static qk_view qk_view_of(const weight *w)
{
    qk_view v = {w->quant == WQ_INT4, w->data, weight_row_bytes(w), w->scales, w->scale_dtype, (size_t)w->cols,
                 (size_t)w->group, (size_t)weight_groups(w), 0, 0, 0};
    v.span = v.group < v.cols ? v.group : v.cols;
    v.step = v.q4 ? 2 * DK_W : DK_W;
    v.kv = v.cols - v.cols % v.step;
    return v;
}

static inline float qk_scale(const qk_view *v, size_t r, size_t g)
{
    return cpu_q_scale(v->scales, v->sdt, r * v->n_groups + g);
}

/* The columns after the last whole step of row r against x row xt. */
static inline float qk_tail(const qk_view *v, size_t r, const float *xt)
{
    const uint8_t *row = v->data + r * v->row_bytes;
    float tail = 0;
    for (size_t k = v->kv; k < v->cols; k++) {
        int q = v->q4 ? (int)((row[k / 2] >> (4 * (k % 2))) & 15) - 8 : ((const int8_t *)row)[k];
        tail += (float)q * qk_scale(v, r, k / v->group) * xt[k];
    }
    return tail;
}

/* floats of a call's split x for n token rows (int4; 0 for int8) */
static size_t q_split_floats(const weight *w, int n)
{
    qk_view v = qk_view_of(w);
    return v.q4 ? (size_t)n * v.kv : 0;
}

/* Token rows [t0, t1) of x (n rows) into the split layout at split. */
static void q_split(const weight *w, const float *x, int n, size_t t0, size_t t1, float *split)
{
    qk_view v = qk_view_of(w);
    (void)n;
    for (size_t t = t0; t < t1; t++)
        for (size_t k = 0; k < v.kv; k += 2 * DK_W) {
            DK_VEC e, o;
            dk_split(x + t * v.cols + k, &e, &o);
            DK_STOREF(split + t * v.kv + k, e);
            DK_STOREF(split + t * v.kv + k + DK_W, o);
        }
}

/* out[t * ldo + r0 + i] for i < NR, t < NT (token rows of xs, and of x for
 * the tail). With pf, prefetches each line of the rows NR rows on (the next
 * call's) as it starts on that line of its own: a packed row is too short
 * a stream for the hardware prefetcher. */
static inline __attribute__((always_inline)) void qkern(bool Q4, int NR, int NT, bool pf, const qk_view *v,
                                                        size_t r0, const qk_x *xs, const float *x, float *out,
                                                        size_t ldo)
{
    DK_VEC tot[4][2], acc[4][2];
    const uint8_t *row[4];
    const size_t line = Q4 ? 128 : 64; /* columns per cache line of a packed row */
#pragma GCC unroll 8
    for (int i = 0; i < NR; i++) {
        row[i] = v->data + (r0 + (size_t)i) * v->row_bytes;
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) tot[i][t] = DK_ZERO();
    }
    for (size_t g0 = 0, g = 0; g0 < v->kv; g0 += v->span, g++) {
        size_t g1 = g0 + v->span < v->kv ? g0 + v->span : v->kv;
#pragma GCC unroll 8
        for (int i = 0; i < NR; i++)
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) acc[i][t] = DK_ZERO();
        for (size_t k = g0; k < g1; k += v->step) {
            if (pf && k % line == 0)
#pragma GCC unroll 8
                for (int i = 0; i < NR; i++)
                    _mm_prefetch((const char *)row[i] + (size_t)NR * v->row_bytes + (Q4 ? k / 2 : k), _MM_HINT_T0);
#pragma GCC unroll 8
            for (int i = 0; i < NR; i++) {
                if (Q4) {
                    DK_VEC lo, hi;
                    dk_q4(row[i] + k / 2, &lo, &hi);
#pragma GCC unroll 8
                    for (int t = 0; t < NT; t++) {
                        const float *xp = xs->xp + (size_t)t * xs->ldp + k;
                        acc[i][t] = DK_FMA(lo, DK_LOADF(xp), acc[i][t]);
                        acc[i][t] = DK_FMA(hi, DK_LOADF(xp + DK_W), acc[i][t]);
                    }
                } else {
                    DK_VEC wv = dk_q8(row[i] + k);
#pragma GCC unroll 8
                    for (int t = 0; t < NT; t++)
                        acc[i][t] = DK_FMA(wv, DK_LOADF(xs->xp + (size_t)t * xs->ldp + k), acc[i][t]);
                }
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < NR; i++) {
            DK_VEC sc = DK_SET1(qk_scale(v, r0 + (size_t)i, g));
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) tot[i][t] = DK_FMA(acc[i][t], sc, tot[i][t]);
        }
    }
    for (int i = 0; i < NR; i++)
        for (int t = 0; t < NT; t++)
            out[(size_t)t * ldo + r0 + (size_t)i] =
                DK_HSUM(tot[i][t]) + qk_tail(v, r0 + (size_t)i, x + (size_t)t * v->cols);
}

/* Rows [r0, r1), n <= Q_DIRECT_MAX token rows: one token row 4 weight rows
 * at a time; more, 2 weight rows against chunks of 2 token rows (the first
 * chunk streams the rows in, the others find them in L1). */
static inline __attribute__((always_inline)) void qrows_direct(bool Q4, const qk_view *v, size_t r0, size_t r1,
                                                               const qk_x *xs, const float *x, int n, float *out,
                                                               size_t ldo)
{
    size_t r = r0;
    if (n == 1) {
        for (; r + QK_ROWS1 <= r1; r += QK_ROWS1) qkern(Q4, QK_ROWS1, 1, true, v, r, xs, x, out, ldo);
        for (; r < r1; r++) qkern(Q4, 1, 1, true, v, r, xs, x, out, ldo);
        return;
    }
    for (; r < r1; r += 2) {
        int nr = r + 2 <= r1 ? 2 : 1;
        for (int t = 0; t < n; t += 2) {
            qk_x xt = {xs->xp + (size_t)t * xs->ldp, xs->ldp};
            const float *x_t = x + (size_t)t * v->cols;
            float *ot = out + (size_t)t * ldo;
            bool pf = t == 0;
            switch ((n - t < 2 ? n - t : 2) * 2 + nr - 1) {
            case 2: qkern(Q4, 1, 1, pf, v, r, &xt, x_t, ot, ldo); break;
            case 3: qkern(Q4, 2, 1, pf, v, r, &xt, x_t, ot, ldo); break;
            case 4: qkern(Q4, 1, 2, pf, v, r, &xt, x_t, ot, ldo); break;
            default: qkern(Q4, 2, 2, pf, v, r, &xt, x_t, ot, ldo); break;
            }
        }
    }
}

static void qrows_direct_q8(const qk_view *v, size_t r0, size_t r1, const qk_x *xs, const float *x, int n,
                            float *out, size_t ldo)
{
    qrows_direct(false, v, r0, r1, xs, x, n, out, ldo);
}
static void qrows_direct_q4(const qk_view *v, size_t r0, size_t r1, const qk_x *xs, const float *x, int n,
                            float *out, size_t ldo)
{
    qrows_direct(true, v, r0, r1, xs, x, n, out, ldo);
}

/* ---- prefill: a cache-blocked GEMM keeping decode's order of operations ----
 * Each output takes exactly its decode kernel's operations (kern's for
 * dense weights, qkern's for int8/int4), so prefill and decode agree bit
 * for bit. What changes is where the operands come from (BLIS's loops, with
 * the weights in the role of its packed A):
 *   - TOKEN_PASS token rows at a time, a task's rows PANEL_ROWS at a time;
 *   - the panel's columns PANEL_COLS at a time, widened to f32 once into
 *     per-worker scratch (dense values, or int8/int4 codes: exact integers,
 *     int4's in its split order) and applied to every token row of the pass;
 *   - within it KC_BLOCK columns at a time: a tile of DK_NT token rows
 *     (copied, DK_NT x KC_BLOCK floats) stays in L1 while each 4 rows of
 *     the panel run their 4 x DK_NT accumulators over the block.
 * Between column blocks the accumulators (and for int8/int4 the row
 * totals) wait in scratch, lane by lane as they are: storing an f32 and
 * loading it back changes nothing. Each x tile in L1 serves the panel's 24
 * row blocks; each weight is read from memory and widened once per
 * TOKEN_PASS token rows, the next chunk's prefetched into L2 while the
 * kernels run. */

#define KC_BLOCK 512    /* columns per L1 block: a multiple of 2 DK_W */
#define PANEL_COLS 512  /* columns widened at a time: a multiple of KC_BLOCK */
#define PANEL_ROWS 96   /* weight rows per panel: a multiple of 4 */
#define TOKEN_PASS 96   /* token rows per pass: a multiple of DK_NT */
#define PANEL_LD (PANEL_COLS + 16) /* floats from one widened row to the next: off the 4 KiB */
                                   /* stride, whose rows would share L1 sets */
#define TILE_LD (KC_BLOCK + 16)    /* the same for a copied x tile */
#define WIDEN_AHEAD 4              /* rows prefetched ahead of the one being widened */
#define PANEL_GROUPS (PANEL_COLS / 8 + 1) /* most groups a panel chunk touches (int8/int4 scales) */

/* Floats of a worker's prefill scratch (for up to 16 lanes): the widened
 * panel, its scales, the accumulators and totals of a panel x pass, an x
 * tile and its int4 sums, 16 to align. */
#define MM_PREFILL_SCRATCH                                                                                  \
    ((size_t)PANEL_ROWS * PANEL_LD + (size_t)PANEL_ROWS * PANEL_GROUPS + (size_t)PANEL_ROWS * TOKEN_PASS * 32 + \
     6 * (size_t)TILE_LD + 16)

/* What the GEMM multiplies: a dense weight (q == NULL) or an int8/int4 one
 * with its split x. */
typedef struct {
    const weight *w;
    const qk_view *q;
    const qk_x *qx;
} mm_src;

/* Per (i, t) of a tile, buf holds the accumulator and, for int8/int4, the
 * row total after it: Q ? 2 : 1 vectors. buf[..] += W[i, k] x[t, k] for k <
 * len (a multiple of DK_W), i < NR, t < NT: wf and x a block's columns
 * (rows ldw and ldx floats apart), starting at column k0 of the row. For
 * int8/int4 a group ending in the block is closed there: its sum times the
 * row's scale (sc: groups from g0 on, rows ldsc apart) added to the total,
 * the accumulator zeroed. Totals stay in registers (short groups
 * close every few steps), hence int8/int4's smaller tiles (DK_QNR x
 * DK_QNT). */
static inline __attribute__((always_inline)) void kern_acc(bool Q, int NR, int NT, const float *wf,
                                                           size_t ldw, const float *x, size_t ldx, size_t len,
                                                           size_t k0, const qk_view *v, const float *sc,
                                                           size_t ldsc, size_t g0, float *buf)
{
    const size_t nv = Q ? 2 : 1;
    DK_VEC acc[4][DK_NT], tot[4][DK_NT];
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            acc[i][t] = DK_LOADF(buf + (size_t)(i * NT + t) * nv * DK_W);
            if (Q) tot[i][t] = DK_LOADF(buf + ((size_t)(i * NT + t) * nv + 1) * DK_W);
        }
    size_t k = 0, g = 0, gend = 0; /* the open group, the column after it */
    if (Q) {
        g = k0 / v->span;
        gend = (g + 1) * v->span < v->kv ? (g + 1) * v->span : v->kv;
    }
    while (k < len) {
        size_t end = Q && gend - k0 < len ? gend - k0 : len; /* stop at the group's end */
        for (; k < end; k += DK_W) {
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
        if (Q && k0 + k == gend) {
#pragma GCC unroll 4
            for (int i = 0; i < NR; i++) {
                DK_VEC s = DK_SET1(sc[(size_t)i * ldsc + (g - g0)]);
#pragma GCC unroll 8
                for (int t = 0; t < NT; t++) {
                    tot[i][t] = DK_FMA(acc[i][t], s, tot[i][t]);
                    acc[i][t] = DK_ZERO();
                }
            }
            g++;
            gend = gend + v->span < v->kv ? gend + v->span : v->kv;
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            DK_STOREF(buf + (size_t)(i * NT + t) * nv * DK_W, acc[i][t]);
            if (Q) DK_STOREF(buf + ((size_t)(i * NT + t) * nv + 1) * DK_W, tot[i][t]);
        }
}

/* kern_acc with its shape as constants (each its own unrolled code), up to
 * MR x MT. */
#define KA_ARGS wf, ldw, x, ldx, len, k0, v, sc, ldsc, g0, buf
#define KA_NT(Q, NR, MT)                                                      \
    switch (nt) {                                                                 \
    case 1: kern_acc(Q, NR, 1, KA_ARGS); return;                              \
    case 2: kern_acc(Q, NR, 2 <= MT ? 2 : 1, KA_ARGS); return;                \
    case 3: kern_acc(Q, NR, 3 <= MT ? 3 : 1, KA_ARGS); return;                \
    case 4: kern_acc(Q, NR, 4 <= MT ? 4 : 1, KA_ARGS); return;                \
    case 5: kern_acc(Q, NR, 5 <= MT ? 5 : 1, KA_ARGS); return;                \
    default: kern_acc(Q, NR, 6 <= MT ? 6 : 1, KA_ARGS); return;               \
    }
#define KA_ANY(name, Q, MR, MT)                                                                           \
    static void name(int nr, int nt, const float *wf, size_t ldw, const float *x, size_t ldx, size_t len,     \
                     size_t k0, const qk_view *v, const float *sc, size_t ldsc, size_t g0, float *buf)       \
    {                                                                                                         \
        switch (nr) {                                                                                         \
        case 1: KA_NT(Q, 1, MT)                                                                           \
        case 2: KA_NT(Q, 2 <= MR ? 2 : 1, MT)                                                             \
        case 3: KA_NT(Q, 3 <= MR ? 3 : 1, MT)                                                             \
        default: KA_NT(Q, 4 <= MR ? 4 : 1, MT)                                                            \
        }                                                                                                     \
    }
KA_ANY(kern_acc_dense, false, 4, DK_NT)
KA_ANY(kern_acc_q, true, DK_QNR, DK_QNT)
#undef KA_ANY
#undef KA_NT
#undef KA_ARGS

/* Lines of weight rows to bring into L2 a few at a time while the kernels
 * run: the next panel chunk's, which would otherwise be widened at memory
 * latency (short row pieces, far apart, that the hardware prefetcher does
 * not see coming). */
typedef struct {
    const char *row; /* the next line's row */
    size_t stride;   /* bytes from row to row */
    size_t lines;    /* cache lines per row */
    size_t line;     /* the next line in its row */
    size_t rows;     /* rows left, the current one included; 0: done */
} pf_chunk;

static inline void pf_some(pf_chunk *c, size_t count)
{
    for (; count && c->rows; count--) {
        _mm_prefetch(c->row + c->line * 64, _MM_HINT_T1);
        if (++c->line == c->lines) c->line = 0, c->row += c->stride, c->rows--;
    }
}

/* Bytes of a weight row and the byte offset of column k in it. */
static inline size_t src_row_bytes(const mm_src *s)
{
    return s->q ? s->q->row_bytes : (size_t)s->w->cols * (s->w->dtype == DT_F32 ? 4 : 2);
}
static inline size_t src_col_byte(const mm_src *s, size_t k)
{
    return s->q ? (s->q->q4 ? k / 2 : k) : k * (s->w->dtype == DT_F32 ? 4 : 2);
}

/* The chunk (rows [p0, p0 + np), columns [pc, pe)) after the given one, in
 * mm_prefill's order; none after the last pass's last. */
static pf_chunk pf_next(const mm_src *s, size_t r0, size_t r1, size_t kv, size_t p0, size_t pc, bool last_pass)
{
    if (pc + PANEL_COLS < kv) pc += PANEL_COLS;
    else if (p0 + PANEL_ROWS < r1) p0 += PANEL_ROWS, pc = 0;
    else if (!last_pass) p0 = r0, pc = 0;
    else return (pf_chunk){0};
    size_t pe = pc + PANEL_COLS < kv ? pc + PANEL_COLS : kv, np = r1 - p0 < PANEL_ROWS ? r1 - p0 : PANEL_ROWS;
    size_t rb = src_row_bytes(s), lines = (src_col_byte(s, pe) - src_col_byte(s, pc) + 63) / 64;
    return (pf_chunk){(const char *)s->w->data + p0 * rb + src_col_byte(s, pc), rb, lines, 0, np};
}

/* Columns [pc, pe) of row r as the GEMM reads them: dense values as f32,
 * int8 codes, int4 codes in split order (each 2 DK_W columns' even ones,
 * then odd ones, less 8). */
static void widen_chunk(const mm_src *s, float *dst, size_t r, size_t pc, size_t pe)
{
    if (!s->q) { /* pe - pc: whole vectors (the chunks end at kv) */
        size_t base = r * (size_t)s->w->cols;
        switch (s->w->dtype) {
        case DT_BF16:
            for (size_t k = pc; k < pe; k += DK_W) DK_STOREF(dst + (k - pc), dk_loadw(DT_BF16, s->w->data, base + k));
            return;
        case DT_F16:
            for (size_t k = pc; k < pe; k += DK_W) DK_STOREF(dst + (k - pc), dk_loadw(DT_F16, s->w->data, base + k));
            return;
        default: memcpy(dst, (const float *)s->w->data + base + pc, (pe - pc) * sizeof *dst); return;
        }
    }
    const uint8_t *row = s->q->data + r * s->q->row_bytes;
    if (s->q->q4)
        for (size_t k = pc; k < pe; k += 2 * DK_W) {
            DK_VEC lo, hi;
            dk_q4(row + k / 2, &lo, &hi);
            DK_STOREF(dst + (k - pc), lo);
            DK_STOREF(dst + (k - pc) + DK_W, hi);
        }
    else
        for (size_t k = pc; k < pe; k += DK_W) DK_STOREF(dst + (k - pc), dk_q8(row + k));
}

/* Rows [r0, r1) for n token rows through the GEMM; scratch:
 * MM_PREFILL_SCRATCH floats of the worker's. */
static void mm_prefill(const mm_src *s, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo,
                       float *scratch)
{
    const qk_view *v = s->q;
    bool q = v != NULL, q4 = q && v->q4;
    size_t cols = (size_t)s->w->cols, kv = q ? v->kv : cols - cols % DK_W; /* as the decode kernels */
    const float *xsrc = q4 ? s->qx->xp : x;
    size_t ldx = q4 ? s->qx->ldp : cols, nv = q ? 2 : 1;
    const size_t RB = q ? DK_QNR : 4, TB = q ? DK_QNT : DK_NT; /* a tile's weight rows and token rows */
    float *wf = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *sc = wf + (size_t)PANEL_ROWS * PANEL_LD, *accs = sc + (size_t)PANEL_ROWS * PANEL_GROUPS;
    float *xt = accs + (size_t)PANEL_ROWS * TOKEN_PASS * 2 * DK_W;
    for (size_t t0 = 0; t0 < (size_t)n; t0 += TOKEN_PASS) {
        size_t t1 = t0 + TOKEN_PASS < (size_t)n ? t0 + TOKEN_PASS : (size_t)n;
        for (size_t p0 = r0; p0 < r1; p0 += PANEL_ROWS) {
            size_t p1 = p0 + PANEL_ROWS < r1 ? p0 + PANEL_ROWS : r1, np = p1 - p0;
            size_t pass = t1 - t0; /* the accumulators of a row block: its pass's token rows' */
            memset(accs, 0, (np + RB - 1) / RB * RB * pass * nv * DK_W * sizeof *accs);
            for (size_t pc = 0; pc < kv; pc += PANEL_COLS) {
                size_t pe = pc + PANEL_COLS < kv ? pc + PANEL_COLS : kv, g0 = 0, ng = 0;
                size_t rb = src_row_bytes(s), c0 = src_col_byte(s, pc), c1 = src_col_byte(s, pe);
                for (size_t i = 0; i < np; i++) {
                    if (i + WIDEN_AHEAD < np) /* the row WIDEN_AHEAD on, for when pf_next's lines fall short */
                        for (size_t c = c0; c < c1; c += 64)
                            _mm_prefetch((const char *)s->w->data + (p0 + i + WIDEN_AHEAD) * rb + c, _MM_HINT_T0);
                    widen_chunk(s, wf + i * PANEL_LD, p0 + i, pc, pe);
                }
                if (q) { /* the scales of the groups the chunk touches */
                    g0 = pc / v->span, ng = (pe - 1) / v->span - g0 + 1;
                    for (size_t i = 0; i < np; i++)
                        for (size_t g = 0; g < ng; g++) sc[i * PANEL_GROUPS + g] = qk_scale(v, p0 + i, g0 + g);
                }
                pf_chunk next = pf_next(s, r0, r1, kv, p0, pc, t1 == (size_t)n);
                size_t steps = (pe - pc + KC_BLOCK - 1) / KC_BLOCK * ((t1 - t0 + TB - 1) / TB);
                size_t quota = next.lines * next.rows / steps + 1;
                for (size_t kb = pc; kb < pe; kb += KC_BLOCK) {
                    size_t ke = kb + KC_BLOCK < pe ? kb + KC_BLOCK : pe;
                    for (size_t t = t0; t < t1; t += TB) {
                        int nt = t1 - t < TB ? (int)(t1 - t) : (int)TB;
                        pf_some(&next, quota);
                        for (int b = 0; b < nt; b++) /* the tile, contiguous: its rows apart in L1's sets */
                            memcpy(xt + (size_t)b * TILE_LD, xsrc + (t + (size_t)b) * ldx + kb, (ke - kb) * sizeof *xt);
                        for (size_t i = 0; i < np; i += RB) {
                            int nr = np - i < RB ? (int)(np - i) : (int)RB;
                            float *buf = accs + ((i / RB) * pass + (t - t0)) * RB * nv * DK_W;
                            const float *w_i = wf + i * PANEL_LD + (kb - pc), *sc_i = sc + i * PANEL_GROUPS;
                            (q ? kern_acc_q : kern_acc_dense)(nr, nt, w_i, PANEL_LD, xt, TILE_LD, ke - kb, kb, v, sc_i,
                                                   PANEL_GROUPS, g0, buf);
                        }
                    }
                }
            }
            for (size_t i = 0; i < np; i += RB) {
                int nr = np - i < RB ? (int)(np - i) : (int)RB;
                for (size_t t = t0; t < t1; t += TB) {
                    int nt = t1 - t < TB ? (int)(t1 - t) : (int)TB;
                    const float *buf = accs + ((i / RB) * pass + (t - t0)) * RB * nv * DK_W;
                    for (int a = 0; a < nr; a++)
                        for (int b = 0; b < nt; b++) {
                            size_t r = p0 + i + (size_t)a, tt = t + (size_t)b;
                            const float *acc = buf + (size_t)(a * nt + b) * nv * DK_W;
                            if (q) {
                                out[tt * ldo + r] = DK_HSUM(DK_LOADF(acc + DK_W)) + qk_tail(v, r, x + tt * cols);
                                continue;
                            }
                            float sum = DK_HSUM(DK_LOADF(acc));
                            for (size_t kk = kv; kk < cols; kk++)
                                sum += load1(s->w->dtype, s->w->data, r * cols + kk) * x[tt * cols + kk];
                            out[tt * ldo + r] = sum;
                        }
                }
            }
        }
    }
}

/* Rows [r0, r1) of a dense weight for n token rows; scratch:
 * MM_PREFILL_SCRATCH floats of the worker's (more than DENSE_DIRECT_MAX). */
static void dense_rows(const weight *w, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo,
                       float *scratch)
{
    if (n <= DENSE_DIRECT_MAX) {
        direct_for(w->dtype)(w->data, (size_t)w->cols, r0, r1, x, n, out, ldo);
        return;
    }
    mm_src s = {w, NULL, NULL};
    mm_prefill(&s, r0, r1, x, n, out, ldo, scratch);
}

/* Rows [r0, r1) of an int8/int4 weight that q_takes, for n token rows (x,
 * and xs its split for int4: q_split_rows); scratch: MM_PREFILL_SCRATCH
 * floats of the worker's (more than Q_DIRECT_MAX). */
static void q_rows(const weight *w, size_t r0, size_t r1, const float *x, const qk_x *xs, int n, float *out,
                   size_t ldo, float *scratch)
{
    qk_view v = qk_view_of(w);
    qk_x x8 = {x, v.cols};
    const qk_x *xq = v.q4 ? xs : &x8;
    if (n <= Q_DIRECT_MAX) {
        (v.q4 ? qrows_direct_q4 : qrows_direct_q8)(&v, r0, r1, xq, x, n, out, ldo);
        return;
    }
    mm_src s = {w, &v, xq};
    mm_prefill(&s, r0, r1, x, n, out, ldo, scratch);
}

/* ---- the includer's cpu_mm_kernels ----------------------------------------
 * A call's split x (int4) is one buffer of q_split_floats(w, n) floats. */

static void mm_q_rows(const weight *w, size_t r0, size_t r1, const float *x, const float *split, int n, float *out,
                      size_t ldo, float *scratch)
{
    qk_view v = qk_view_of(w);
    qk_x xs = {split, v.kv};
    q_rows(w, r0, r1, x, &xs, n, out, ldo, scratch);
}

#define MM_KERNELS {dense_rows, q_takes, q_split_floats, q_split, mm_q_rows}

#endif
