/*
 * cpu_isa.c - which vector instructions the CPU kernels use: the best the
 * processor offers and the build has kernels for, unless the cpu_isa
 * setting names one (so tests can run every path on a machine that has
 * it). Chosen once per backend, at creation, never per step: two ISAs sum
 * in different orders, and a step's rows must not depend on which ran.
 *
 * avx2:   AVX2 + FMA + F16C, the build's baseline (x86-64-v3).
 * avx512: AVX-512 F/BW/VL/DQ as well: the F32/F16/BF16 kernels
 *         (cpu_matmul_avx512.c) and the GGUF block kernels
 *         (cpu_gguf_avx512.c) with 16 lanes; int8/int4 and the rest are
 *         the AVX2 ones still.
 *
 * The activations (cpu_activations): exact (f32, the default and the
 * tests' reference); int8, a GGUF's chunked blocks against activations
 * quantized to 8 bits a 32 values, and int8/int4 weights so too
 * (cpu_act_int8.c; needs avx512 and VNNI);
 * bf16, BF16 weights against activations rounded to bf16
 * (cpu_matmul_bf16.c; needs avx512 and AVX-512 BF16).
 */
#include <string.h>

#include "cpu.h"

static const char *const k_names[] = {[CPU_ISA_AVX2] = "avx2", [CPU_ISA_AVX512] = "avx512"};

const char *cpu_isa_name(cpu_isa isa) { return isa == CPU_ISA_AVX512 ? k_names[isa] : k_names[CPU_ISA_AVX2]; }

bool cpu_isa_offered(cpu_isa isa)
{
    if (isa == CPU_ISA_AVX2) return true;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (isa == CPU_ISA_AVX512) {
        __builtin_cpu_init();
        return cpu_gguf_avx512_built() && cpu_matmul_avx512_built() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    }
#endif
    return false;
}

static bool feature(const char *name)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (!strcmp(name, "avx512vnni")) return __builtin_cpu_supports("avx512vnni");
    if (!strcmp(name, "avx512bf16")) return __builtin_cpu_supports("avx512bf16");
#endif
    (void)name;
    return false;
}

ferry_status cpu_activations_choose(const char *name, cpu_isa isa, cpu_act *out)
{
    *out = CPU_ACT_EXACT;
    if (!name || !*name || !strcmp(name, "exact")) return FERRY_OK;
    bool int8 = !strcmp(name, "int8");
    if (!int8 && strcmp(name, "bf16") != 0)
        return ferry_fail(FERRY_ERR_INVALID, "cpu_activations %s: expected exact, int8 or bf16", name);
    bool built = int8 ? cpu_gguf_int8_built() : cpu_bf16_built();
    const char *ext = int8 ? "AVX-512 VNNI" : "AVX-512 BF16";
    if (isa != CPU_ISA_AVX512 || !built || !feature(int8 ? "avx512vnni" : "avx512bf16"))
        return ferry_fail(FERRY_ERR_INVALID, "cpu_activations %s: needs the avx512 kernels and %s (%s)", name, ext,
                          isa != CPU_ISA_AVX512 && cpu_isa_offered(CPU_ISA_AVX512) ? "cpu_isa chose avx2"
                          : !built ? "this build has no such kernels"
                                   : "this processor lacks them");
    *out = int8 ? CPU_ACT_INT8 : CPU_ACT_BF16;
    return FERRY_OK;
}

ferry_status cpu_isa_choose(const char *name, cpu_isa *out)
{
    if (!name || !*name || !strcmp(name, "auto")) {
        *out = cpu_isa_offered(CPU_ISA_AVX512) ? CPU_ISA_AVX512 : CPU_ISA_AVX2;
        return FERRY_OK;
    }
    for (int i = 0; i < CPU_ISA_COUNT; i++)
        if (!strcmp(name, k_names[i])) {
            if (!cpu_isa_offered((cpu_isa)i))
                return ferry_fail(FERRY_ERR_INVALID,
                                  "cpu_isa %s: %s", name,
                                  cpu_gguf_avx512_built() ? "this processor lacks AVX-512 F/BW/VL/DQ"
                                                          : "this build has no AVX-512 kernels");
            *out = (cpu_isa)i;
            return FERRY_OK;
        }
    return ferry_fail(FERRY_ERR_INVALID, "cpu_isa %s: expected auto, avx2 or avx512", name);
}

cpu_offer backend_cpu_offer(void)
{
    cpu_offer o = {0};
    cpu_isa best;
    FERRY_ASSERT(cpu_isa_choose(NULL, &best) == FERRY_OK);
    o.isas[o.n_isas++] = cpu_isa_name(best);
    for (int i = CPU_ISA_COUNT - 1; i >= 0; i--)
        if ((cpu_isa)i != best && cpu_isa_offered((cpu_isa)i)) o.isas[o.n_isas++] = cpu_isa_name((cpu_isa)i);
    static const char *const modes[] = {"exact", "int8", "bf16"};
    for (int m = 0; m < 3; m++) {
        cpu_act act;
        if (cpu_activations_choose(modes[m], best, &act) == FERRY_OK) o.activations[o.n_activations++] = modes[m];
    }
    return o;
}
