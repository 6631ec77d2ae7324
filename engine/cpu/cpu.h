/*
 * cpu.h - internals shared by the CPU backend's files: the backend object,
 * per-worker scratch, and the kernels each file provides.
 */
#ifndef FERRY_CPU_H
#define FERRY_CPU_H

#include "../backend.h"
#include "pool.h"

#define CPU_MAX_WORKERS 256

typedef struct {
    float *buf;
    size_t cap; /* floats */
} cpu_scratch;

/* cpu_isa.c: the vector instructions the kernels use, chosen per backend. */
typedef enum { CPU_ISA_AVX2, CPU_ISA_AVX512, CPU_ISA_COUNT } cpu_isa;
const char *cpu_isa_name(cpu_isa isa);
bool cpu_isa_offered(cpu_isa isa); /* by the processor and the build */
/* name: auto (or NULL: the best offered), avx2, avx512; an ISA not offered is refused naming why. */
ferry_status cpu_isa_choose(const char *name, cpu_isa *out);
/* activations: exact (or NULL: f32), int8 (a GGUF's blocks against 8-bit
 * activations: needs avx512 and VNNI) or bf16 (BF16 weights against bf16
 * activations: needs avx512 and AVX-512 BF16). */
typedef enum { CPU_ACT_EXACT, CPU_ACT_INT8, CPU_ACT_BF16 } cpu_act;
ferry_status cpu_activations_choose(const char *name, cpu_isa isa, cpu_act *out);

typedef struct {
    backend base;
    pool *pool;
    cpu_isa isa;
    cpu_act act;       /* --cpu-activations: int8 (cpu_act_int8.c), bf16 (cpu_matmul_bf16.c) */
    int8_t *xq;        /* the step's activations quantized (int8), grown as needed */
    float *xd;
    uint16_t *xb;      /* ... rounded to bf16 (bf16) */
    float *xs;         /* ... split for int4 weights (exact mode, cpu_mm_kernels.q_split) */
    size_t xq_cap, xd_cap, xb_cap, xs_cap;
    const batch *b; /* the step's batch, set by set_batch; host memory */
    int *seq_of;    /* [n_tokens] index of each token's sequence in b->seqs */
    int seq_of_cap;
    cpu_scratch scratch[CPU_MAX_WORKERS];
} cpu_backend;

/* Per-worker scratch of at least n floats (NULL if it cannot be had). */
float *cpu_scratch_get(cpu_backend *cb, int worker, size_t n);

void cpu_matmul(backend *be, float *out, const float *x, const weight *w, const weight *bias, int n);
void cpu_attention(backend *be, float *out, const float *q, const kv_layer *kv, const attn_shape *shape);

/* Converts n elements of a weight row (any compute dtype, or quantized) to f32. */
void cpu_row_to_f32(float *dst, const weight *w, int64_t row, int64_t col0, int64_t n);

/* cpu_gguf.c: a GGUF's blocks (WQ_GGUF), every build: rows [r0, r1) for n
 * token rows; scratch: cpu_gguf_scratch(w) floats of the worker's own. */
bool cpu_gguf_valid(const weight *w);
void cpu_gguf_row_to_f32(float *dst, const weight *w, int64_t row, int64_t col0, int64_t n);
size_t cpu_gguf_scratch(const weight *w);
void cpu_gguf_rows(const weight *w, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo,
                   float *scratch, cpu_isa isa);
/* More token rows: a few weight rows dequantized into scratch, each dotted
 * with every token row by dot_fn (the ISA's, in its decode kernel's order). */
void cpu_gguf_rows_scratch(const weight *w, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo,
                           float *scratch, float (*dot_fn)(const float *w_row, const float *x_row, size_t n));
/* cpu_gguf_avx512.c: the same with 16 lanes, for the chunked types
 * (built where the compiler has AVX-512; called where the processor has it). */
bool cpu_gguf_avx512_built(void);
void cpu_gguf_rows_avx512(const weight *w, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo,
                          float *scratch);

/* cpu_act_int8.c: the chunked blocks, and int8/int4 weights whose groups
 * are whole 32-column chunks, against 8-bit activations (AVX-512 VNNI
 * builds; called where the processor has it). cpu_gguf_quantize_x:
 * n rows of cols floats to int8 (xq, n * cols) with a scale a 32 values
 * (xd, n * cols / 32), then each 32 values' scale x the sum of their int8
 * (xd + n * cols / 32, as many), for cpu_gguf_rows_int8. cpu_q_prep_x: the
 * same rounding for an int8/int4 weight, in the records cpu_q_rows_int8
 * reads (cpu_q_prep_bytes(w, n) bytes). cpu_gguf_int8_takes: whether the
 * weight's type is one. */
bool cpu_gguf_int8_built(void);
bool cpu_gguf_int8_takes(const weight *w); /* a GGUF chunked type, or int8/int4 in whole chunks */
void cpu_gguf_quantize_x(const float *x, int n, size_t cols, int8_t *xq, float *xd);
void cpu_gguf_rows_int8(const weight *w, size_t r0, size_t r1, const int8_t *xq, const float *xd, int n, float *out,
                        size_t ldo);
size_t cpu_q_prep_bytes(const weight *w, int n);
void cpu_q_prep_x(const weight *w, const float *x, int n, void *prep);
void cpu_q_rows_int8(const weight *w, size_t r0, size_t r1, const void *prep, int n, float *out, size_t ldo);

/* cpu_matmul_bf16.c: BF16 weights against bf16-rounded activations
 * (AVX-512 BF16 builds; called where the processor has it). */
bool cpu_bf16_built(void);
void cpu_bf16_round_x(const float *x, int n, size_t cols, uint16_t *xb);
size_t cpu_bf16_scratch(void); /* floats of a worker's scratch that cpu_bf16_rows needs */
void cpu_bf16_rows(const weight *w, size_t r0, size_t r1, const uint16_t *xb, int n, float *out, size_t ldo,
                   float *scratch);

/* The exact-mode (f32 activations) kernels of one vector width (mm_kern.h):
 * cpu_matmul.c's with 8 lanes (AVX2), cpu_matmul_avx512.c's with 16.
 * dense_rows / q_rows: out[t * ldo + r] for rows [r0, r1) and n token rows,
 * scratch MM_PREFILL_SCRATCH (mm_kern.h) floats of the worker's; q_rows for int8/int4 weights
 * that q_takes, with `split` (int4): q_split_floats(w, n) floats filled by
 * q_split for token rows [0, n) (any ranges of them, in parallel). */
typedef struct {
    void (*dense_rows)(const weight *w, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo,
                       float *scratch);
    bool (*q_takes)(const weight *w);
    size_t (*q_split_floats)(const weight *w, int n);
    void (*q_split)(const weight *w, const float *x, int n, size_t t0, size_t t1, float *split);
    void (*q_rows)(const weight *w, size_t r0, size_t r1, const float *x, const float *split, int n, float *out,
                   size_t ldo, float *scratch);
} cpu_mm_kernels;
extern const cpu_mm_kernels cpu_mm_avx2, cpu_mm_avx512; /* avx512: all NULL where not built */
bool cpu_matmul_avx512_built(void);

/* Scale i of a quantized weight's scales (of dtype sdt) as f32. */
static inline float cpu_q_scale(const void *scales, ferry_dtype sdt, size_t i)
{
    switch (sdt) {
    case DT_BF16: return bf16_to_f32(((const uint16_t *)scales)[i]);
    case DT_F16: return f16_to_f32(((const uint16_t *)scales)[i]);
    default: return ((const float *)scales)[i];
    }
}

/* cpu_qmatmul.c: quantized weights (WQ_INT8, WQ_INT4). */
bool cpu_qweight_valid(const weight *w); /* packing dtype, group >= 1, scales present */
void cpu_qrow_to_f32(float *dst, const weight *w, int64_t row, int64_t col0, int64_t n);
/* The layouts cpu_mm_kernels.q_takes refuses (AVX2 builds):
 * out[t * ldo + r] for rows [r0, r1), n <= 16 token rows; scratch:
 * cpu_qmatmul_scratch(w, n) floats of the worker's own. */
size_t cpu_qmatmul_scratch(const weight *w, int n);
void cpu_qmatmul_direct(const weight *w, size_t r0, size_t r1, const float *x, int n, float *out, size_t ldo,
                        float *scratch);

#endif
