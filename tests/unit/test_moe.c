/*
 * test_moe.c - mixtures of experts: routing (engine/moe.c) and the
 * architectures' configs and tensors (engine/weights/model.c).
 *
 * Routing: hand-computed softmax and top-k weights with and without
 * renormalization, ties (the lower expert index wins), each token's choices
 * sorted by expert, the grouped runs (rows, dest, scale) of a batch that
 * reaches every expert, of one that shares a single expert, of one token
 * and of none; then random batches checked against the definitions.
 * Configs: MixtralConfig's and Qwen3MoeConfig's defaults, the sparse layer
 * rule (decoder_sparse_step, mlp_only_layers, past 64 layers), the unit
 * numbering, and every refusal naming its field. Tensors: the entries of
 * sparse and dense layers in execution order, and binding a
 * compressed-tensors int8 checkpoint whose experts are quantized and whose
 * router is not.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../engine/base/util.h"
#include "../../engine/moe.h"
#include "../../engine/weights/model.h"
#include "../../engine/weights/st_writer.h"
#include "check.h"

#define CHECK_NEAR(got, want, tol)                                                                     \
    do {                                                                                               \
        double g_ = (double)(got), w_ = (double)(want);                                                \
        check_count++;                                                                                 \
        if (!(fabs(g_ - w_) <= (tol) * fmax(1.0, fabs(w_))))                                           \
            CHECK_FAIL_("%s: expected %.9g (%s), got %.9g", #got, w_, #want, g_);                      \
    } while (0)

/* ---- routing: hand-computed ---------------------------------------------- */

static void test_route_hand(void)
{
    moe_route r;
    CHECK_STATUS(moe_route_init(&r, 4, 2, 4), FERRY_OK);
    /* token 0: experts 1 (logit 3) and 2 (logit 2); token 1: 3 (4) then 0 (1) */
    const float logits[] = {1, 3, 2, 0, 1, -1, 0, 4};
    moe_route_compute(&r, logits, 2, false);
    double s0 = exp(-2.0) + 1 + exp(-1.0) + exp(-3.0), s1 = exp(-3.0) + exp(-5.0) + exp(-4.0) + 1;
    CHECK_EQ_INT(r.n_tokens, 2);
    CHECK_EQ_INT(r.choice[0], 1);
    CHECK_EQ_INT(r.choice[1], 2);
    CHECK_NEAR(r.weight[0], 1 / s0, 1e-6);
    CHECK_NEAR(r.weight[1], exp(-1.0) / s0, 1e-6);
    /* sorted by expert: 0 before 3, the weights with them */
    CHECK_EQ_INT(r.choice[2], 0);
    CHECK_EQ_INT(r.choice[3], 3);
    CHECK_NEAR(r.weight[2], exp(-3.0) / s1, 1e-6);
    CHECK_NEAR(r.weight[3], 1 / s1, 1e-6);
    /* runs: expert 0 (token 1), 1 (token 0), 2 (token 0), 3 (token 1) */
    CHECK_EQ_INT(r.n_used, 4);
    for (int e = 0; e < 4; e++) {
        CHECK_EQ_INT(r.used[e], e);
        CHECK_EQ_INT(r.count[e], 1);
        CHECK_EQ_INT(r.start[e], e);
    }
    const int32_t rows[] = {1, 0, 0, 1}, dest[] = {2, 0, 1, 3};
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_INT(r.rows[i], rows[i]);
        CHECK_EQ_INT(r.dest[i], dest[i]);
        CHECK(r.scale[i] == r.weight[dest[i]]);
    }

    /* renormalized: the top two of a softmax, divided by their sum, are the
     * sigmoid of their logits' difference */
    moe_route_compute(&r, logits, 2, true);
    CHECK_NEAR(r.weight[0], 1 / (1 + exp(-1.0)), 1e-6);
    CHECK_NEAR(r.weight[1], 1 / (1 + exp(1.0)), 1e-6);
    CHECK_NEAR(r.weight[2], 1 / (1 + exp(3.0)), 1e-6);
    CHECK_NEAR(r.weight[3], 1 / (1 + exp(-3.0)), 1e-6);
    CHECK(r.scale[0] == r.weight[2] && r.scale[3] == r.weight[3]);
    moe_route_free(&r);
}

/* Ties go to the lower expert index, wherever they fall. */
static void test_route_ties(void)
{
    moe_route r;
    CHECK_STATUS(moe_route_init(&r, 4, 2, 4), FERRY_OK);
    const float logits[] = {
        0, 0, 0, 0, /* all equal: 0 and 1 */
        5, 1, 1, 0, /* second place tied: 0 and 1 */
        0, 2, 2, 2, /* first place three-way: 1 and 2 */
        3, 1, 2, 3, /* first place between the ends: 0 and 3 */
    };
    moe_route_compute(&r, logits, 4, false);
    const int32_t want[] = {0, 1, 0, 1, 1, 2, 0, 3};
    for (int i = 0; i < 8; i++) CHECK_EQ_INT(r.choice[i], want[i]);
    CHECK_NEAR(r.weight[0], 0.25, 1e-7);
    CHECK(r.weight[0] == r.weight[1]);
    CHECK(r.weight[4] == r.weight[5]);
    moe_route_compute(&r, logits, 4, true);
    CHECK_NEAR(r.weight[0], 0.5, 1e-7);
    CHECK_NEAR(r.weight[1], 0.5, 1e-7);
    CHECK_NEAR(r.weight[6], 0.5, 1e-7);
    moe_route_free(&r);

    /* top 1 of a tie between experts 1 and 2 after a lower one */
    CHECK_STATUS(moe_route_init(&r, 1, 1, 3), FERRY_OK);
    const float one[] = {1, 3, 3};
    moe_route_compute(&r, one, 1, true);
    CHECK_EQ_INT(r.choice[0], 1);
    CHECK(r.weight[0] == 1.0f);
    moe_route_free(&r);
}

/* A choice order that sorting must change: the top 3 in descending order
 * are 3, 0, 2; the runs send each (token, choice) to its own dest row. */
static void test_route_sorted_choices(void)
{
    moe_route r;
    CHECK_STATUS(moe_route_init(&r, 2, 3, 5), FERRY_OK);
    const float logits[] = {2, -1, 1, 3, 0, /* token 0: 3, 0, 2 */
                            0, 4, -2, 1, 2}; /* token 1: 1, 4, 3 */
    moe_route_compute(&r, logits, 2, true);
    const int32_t want[] = {0, 2, 3, 1, 3, 4};
    for (int i = 0; i < 6; i++) CHECK_EQ_INT(r.choice[i], want[i]);
    CHECK_NEAR(r.weight[0] + r.weight[1] + r.weight[2], 1.0, 1e-6);
    CHECK(r.weight[2] > r.weight[0] && r.weight[0] > r.weight[1]);
    /* expert 3 is token 0's choice 2 and token 1's choice 1 */
    CHECK_EQ_INT(r.n_used, 5);
    CHECK_EQ_INT(r.count[3], 2);
    CHECK_EQ_INT(r.start[3], 3);
    CHECK_EQ_INT(r.rows[3], 0);
    CHECK_EQ_INT(r.dest[3], 2);
    CHECK_EQ_INT(r.rows[4], 1);
    CHECK_EQ_INT(r.dest[4], 4);
    CHECK(r.scale[4] == r.weight[4]);
    moe_route_free(&r);
}

/* Every token on one expert (top 1); one token; no token. */
static void test_route_shapes(void)
{
    moe_route r;
    CHECK_STATUS(moe_route_init(&r, 8, 1, 4), FERRY_OK);
    float logits[6 * 4];
    for (int t = 0; t < 6; t++)
        for (int e = 0; e < 4; e++) logits[t * 4 + e] = e == 2 ? 1.0f + (float)t : (float)-t;
    moe_route_compute(&r, logits, 6, true);
    CHECK_EQ_INT(r.n_used, 1);
    CHECK_EQ_INT(r.used[0], 2);
    CHECK_EQ_INT(r.count[2], 6);
    CHECK_EQ_INT(r.count[0] + r.count[1] + r.count[3], 0);
    CHECK_EQ_INT(r.start[2], 0);
    for (int t = 0; t < 6; t++) {
        CHECK_EQ_INT(r.rows[t], t);
        CHECK_EQ_INT(r.dest[t], t);
        CHECK(r.scale[t] == 1.0f);
    }
    /* without renormalization a lone choice keeps its probability */
    moe_route_compute(&r, logits, 1, false);
    CHECK_EQ_INT(r.n_tokens, 1);
    CHECK_EQ_INT(r.n_used, 1);
    CHECK_NEAR(r.scale[0], exp(1.0) / (exp(1.0) + 3), 1e-6);
    moe_route_compute(&r, logits, 0, true);
    CHECK_EQ_INT(r.n_used, 0);
    CHECK_EQ_INT(r.count[2], 0);
    moe_route_free(&r);

    /* top_k == n_experts: every token on every expert, weights the softmax */
    CHECK_STATUS(moe_route_init(&r, 3, 3, 3), FERRY_OK);
    const float all[] = {0, 1, 2, 2, 1, 0, 5, 5, 5};
    moe_route_compute(&r, all, 3, false);
    CHECK_EQ_INT(r.n_used, 3);
    for (int i = 0; i < 9; i++) CHECK_EQ_INT(r.choice[i], i % 3);
    CHECK_NEAR(r.weight[2], exp(2.0) / (1 + exp(1.0) + exp(2.0)), 1e-6);
    CHECK_NEAR(r.weight[8], 1.0 / 3, 1e-6);
    for (int e = 0; e < 3; e++)
        for (int t = 0; t < 3; t++) {
            CHECK_EQ_INT(r.rows[e * 3 + t], t);
            CHECK_EQ_INT(r.dest[e * 3 + t], t * 3 + e);
        }
    moe_route_free(&r);
}

/* NaN logits route somewhere, deterministically, to distinct experts. */
static void test_route_nan(void)
{
    moe_route r;
    CHECK_STATUS(moe_route_init(&r, 1, 2, 4), FERRY_OK);
    const float logits[] = {NAN, 1, NAN, 2};
    moe_route_compute(&r, logits, 1, true);
    CHECK(r.choice[0] != r.choice[1]);
    CHECK(r.choice[0] >= 0 && r.choice[1] < 4);
    CHECK_EQ_INT(r.count[r.choice[0]] + r.count[r.choice[1]], 2);
    moe_route_free(&r);
}

/* ---- routing: random batches against the definitions ------------------------ */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static float frand(void) /* uniform in [-1, 1) */
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

static void check_route(const moe_route *r, const float *logits, int n, bool norm)
{
    int E = r->n_experts, k = r->top_k, bad = 0;
    int32_t *seen = calloc((size_t)n * (size_t)k, sizeof *seen);
    for (int t = 0; t < n; t++) {
        const float *l = logits + (size_t)t * (size_t)E;
        const int32_t *c = r->choice + (size_t)t * (size_t)k;
        double mx = l[0], sum = 0, wsum = 0;
        for (int e = 1; e < E; e++) mx = fmax(mx, l[e]);
        for (int e = 0; e < E; e++) sum += exp(l[e] - mx);
        for (int j = 0; j < k; j++) wsum += exp(l[c[j]] - mx) / sum;
        for (int j = 0; j < k; j++) {
            bad += j > 0 && c[j] <= c[j - 1]; /* ascending, distinct */
            double want = exp(l[c[j]] - mx) / sum / (norm ? wsum : 1);
            bad += fabs(r->weight[t * k + j] - want) > 1e-6 * fmax(want, 1e-3);
            /* nothing left out is more probable; an equal one only above it */
            for (int e = 0; e < E; e++) {
                bool chosen = false;
                for (int i = 0; i < k; i++) chosen |= c[i] == e;
                if (!chosen) bad += l[e] > l[c[j]] || (l[e] == l[c[j]] && e < c[j]);
            }
        }
    }
    int32_t at = 0, used = 0;
    for (int e = 0; e < E; e++) {
        bad += r->start[e] != at;
        if (r->count[e]) bad += r->used[used++] != e;
        for (int i = at; i < at + r->count[e]; i++) {
            int32_t t = r->rows[i], d = r->dest[i];
            bad += i > at && t <= r->rows[i - 1];            /* tokens ascending */
            bad += d / k != t || r->choice[d] != e;          /* its own (token, choice) */
            bad += r->scale[i] != r->weight[d];
            seen[d]++;
        }
        at += r->count[e];
    }
    bad += at != n * k || used != r->n_used;
    for (int i = 0; i < n * k; i++) bad += seen[i] != 1;
    check_count++;
    if (bad) CHECK_FAIL_("random routing E=%d k=%d n=%d norm=%d: %d violations", E, k, n, norm, bad);
    free(seen);
}

static void test_route_random(void)
{
    static const int shapes[][3] = {{8, 2, 1}, {8, 2, 37}, {16, 4, 64}, {128, 8, 100}, {60, 4, 3}, {5, 5, 9}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int E = shapes[s][0], k = shapes[s][1], n = shapes[s][2];
        moe_route r;
        CHECK_STATUS(moe_route_init(&r, n + 3, k, E), FERRY_OK);
        float *logits = malloc((size_t)n * (size_t)E * sizeof *logits);
        for (int rep = 0; rep < 4; rep++) {
            /* rep 3: coarse logits, many ties */
            for (int i = 0; i < n * E; i++) logits[i] = rep == 3 ? (float)(int)(3 * frand()) : 4 * frand();
            moe_route_compute(&r, logits, n, rep & 1);
            check_route(&r, logits, n, rep & 1);
        }
        free(logits);
        moe_route_free(&r);
    }
}

/* ---- configs ---------------------------------------------------------------- */

static ferry_status parse(const char *json, model_config *c)
{
    return model_config_parse(json, strlen(json), "config.json", c);
}

#define BASE                                                                                                 \
    "\"vocab_size\": 100, \"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 6, "       \
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2"
/* without intermediate_size and num_key_value_heads: the classes' defaults */
#define BARE(arch)                                                                                           \
    "{\"architectures\": [\"" arch "\"], \"vocab_size\": 100, \"hidden_size\": 64, "                         \
    "\"num_hidden_layers\": 2, \"num_attention_heads\": 16"
#define MIXTRAL "{\"architectures\": [\"MixtralForCausalLM\"], " BASE
#define QWEN3MOE "{\"architectures\": [\"Qwen3MoeForCausalLM\"], " BASE

static void test_config_mixtral(void)
{
    model_config c;
    /* MixtralConfig's defaults */
    CHECK_STATUS(parse(MIXTRAL "}", &c), FERRY_OK);
    CHECK_EQ_INT(c.arch, ARCH_MIXTRAL);
    CHECK_EQ_INT(c.n_experts, 8);
    CHECK_EQ_INT(c.top_k, 2);
    CHECK_EQ_INT(c.moe_hidden, 96);
    CHECK(c.norm_topk);
    CHECK_EQ_INT(c.n_moe_layers, 6);
    for (int l = 0; l < 6; l++) CHECK(model_layer_moe(&c, l));
    CHECK_EQ_INT(c.head_dim, 16);
    CHECK_EQ_INT(c.sliding_window, 0);
    CHECK_EQ_INT(c.max_pos, 131072);
    CHECK(c.rope.theta == 1e6);
    CHECK(c.norm_eps == 1e-5f);
    CHECK(!c.qkv_bias && !c.o_bias && !c.qk_norm);
    CHECK_EQ_INT(model_unit_count(&c), 6 + 2 + 6 * 8);
    CHECK_EQ_INT(model_expert_unit(&c, 0, 0), 8);
    CHECK_EQ_INT(model_expert_unit(&c, 5, 7), 8 + 5 * 8 + 7);

    /* num_key_value_heads absent: 8, not num_attention_heads; the experts
     * of intermediate_size 14336 */
    CHECK_STATUS(parse(BARE("MixtralForCausalLM") "}", &c), FERRY_OK);
    CHECK_EQ_INT(c.n_kv_heads, 8);
    CHECK_EQ_INT(c.hidden, 14336);
    CHECK_EQ_INT(c.moe_hidden, 14336);
    CHECK_EQ_INT(c.head_dim, 4);

    CHECK_STATUS(parse(MIXTRAL ", \"num_local_experts\": 4, \"num_experts_per_tok\": 3, \"sliding_window\": 32, "
                               "\"rope_theta\": 10000, \"attention_bias\": true, \"head_dim\": 32}", &c), FERRY_OK);
    CHECK_EQ_INT(c.n_experts, 4);
    CHECK_EQ_INT(c.top_k, 3);
    CHECK_EQ_INT(c.sliding_window, 32);
    CHECK(c.rope.theta == 10000);
    CHECK(!c.qkv_bias && !c.o_bias); /* MixtralAttention has none */
    CHECK_EQ_INT(c.head_dim, 32);
    /* v5 configs carry rope_theta in rope_parameters */
    CHECK_STATUS(parse(MIXTRAL ", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 500000}}", &c),
                 FERRY_OK);
    CHECK(c.rope.theta == 500000);

    CHECK_STATUS(parse(MIXTRAL ", \"num_experts_per_tok\": 9}", &c), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("num_experts_per_tok");
    CHECK_STATUS(parse(MIXTRAL ", \"num_experts_per_tok\": 0}", &c), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("num_experts_per_tok");
    CHECK_STATUS(parse(MIXTRAL ", \"num_local_experts\": 1025}", &c), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("num_local_experts");
    CHECK_STATUS(parse(MIXTRAL ", \"num_local_experts\": 0}", &c), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("num_local_experts");
    CHECK_STATUS(parse(MIXTRAL ", \"num_local_experts\": \"8\"}", &c), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("num_local_experts");
    CHECK_STATUS(parse(MIXTRAL ", \"hidden_act\": \"gelu\"}", &c), FERRY_ERR_UNSUPPORTED);
    CHECK_MSG_HAS("hidden_act");
}

static void test_config_qwen3moe(void)
{
    model_config c;
    /* Qwen3MoeConfig's defaults; head_dim, absent from it, is hidden / heads */
    CHECK_STATUS(parse(QWEN3MOE "}", &c), FERRY_OK);
    CHECK_EQ_INT(c.arch, ARCH_QWEN3_MOE);
    CHECK_EQ_INT(c.n_experts, 128);
    CHECK_EQ_INT(c.top_k, 8);
    CHECK_EQ_INT(c.moe_hidden, 768);
    CHECK_EQ_INT(c.hidden, 96);
    CHECK(!c.norm_topk);
    CHECK_EQ_INT(c.n_moe_layers, 6);
    CHECK_EQ_INT(c.head_dim, 16);
    CHECK_EQ_INT(c.max_pos, 32768);
    CHECK(c.rope.theta == 10000);
    CHECK(c.norm_eps == 1e-6f);
    CHECK(c.qk_norm && !c.qkv_bias);

    /* num_key_value_heads absent: 4; intermediate_size absent: 6144 */
    CHECK_STATUS(parse(BARE("Qwen3MoeForCausalLM") "}", &c), FERRY_OK);
    CHECK_EQ_INT(c.n_kv_heads, 4);
    CHECK_EQ_INT(c.hidden, 6144);
    CHECK_EQ_INT(c.moe_hidden, 768);
    CHECK_EQ_INT(c.head_dim, 4);
    /* a dense architecture still needs intermediate_size */
    CHECK_STATUS(parse(BARE("Qwen3ForCausalLM") "}", &c), FERRY_ERR_INVALID);
    CHECK_MSG_HAS("intermediate_size");

    /* sparse iff (l + 1) % step == 0 and not in mlp_only_layers: 1 and 5 */
    CHECK_STATUS(parse(QWEN3MOE ", \"num_experts\": 16, \"num_experts_per_tok\": 4, \"moe_intermediate_size\": 32, "
                                "\"norm_topk_prob\": true, \"decoder_sparse_step\": 2, \"mlp_only_layers\": [3], "
                                "\"attention_bias\": true}", &c), FERRY_OK);
    CHECK_EQ_INT(c.n_experts, 16);
    CHECK_EQ_INT(c.top_k, 4);
    CHECK_EQ_INT(c.moe_hidden, 32);
    CHECK(c.norm_topk);
    CHECK(c.qkv_bias && c.o_bias);
    CHECK_EQ_INT(c.n_moe_layers, 2);
    for (int l = 0; l < 6; l++) CHECK_EQ_INT(model_layer_moe(&c, l), l == 1 || l == 5);
    CHECK_EQ_INT(model_moe_index(&c, 1), 0);
    CHECK_EQ_INT(model_moe_index(&c, 3), -1);
    CHECK_EQ_INT(model_moe_index(&c, 5), 1);
    CHECK_EQ_INT(model_unit_count(&c), 6 + 2 + 2 * 16);
    CHECK_EQ_INT(model_expert_unit(&c, 1, 3), 8 + 3);
    CHECK_EQ_INT(model_expert_unit(&c, 5, 15), 8 + 16 + 15);

    /* null lists and no experts: every layer dense */
    CHECK_STATUS(parse(QWEN3MOE ", \"mlp_only_layers\": null, \"num_experts\": 0}", &c), FERRY_OK);
    CHECK_EQ_INT(c.n_moe_layers, 0);
    CHECK_EQ_INT(c.n_experts, 0);
    CHECK(!model_layer_moe(&c, 0));
    CHECK_EQ_INT(model_unit_count(&c), 8);
    CHECK_STATUS(parse(QWEN3MOE ", \"mlp_only_layers\": [0, 1, 2, 3, 4, 5]}", &c), FERRY_OK);
    CHECK_EQ_INT(c.n_moe_layers, 0);
    CHECK_EQ_INT(model_unit_count(&c), 8);

    /* the mask past one word: 130 layers, dense 0, 64 and 129 */
    CHECK_STATUS(parse("{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"vocab_size\": 10, \"hidden_size\": 8, "
                       "\"intermediate_size\": 8, \"num_hidden_layers\": 130, \"num_attention_heads\": 4, "
                       "\"num_experts\": 4, \"num_experts_per_tok\": 2, \"mlp_only_layers\": [0, 64, 129]}", &c),
                 FERRY_OK);
    CHECK_EQ_INT(c.n_moe_layers, 127);
    CHECK(!model_layer_moe(&c, 64) && model_layer_moe(&c, 63) && model_layer_moe(&c, 65) && model_layer_moe(&c, 128));
    CHECK_EQ_INT(model_moe_index(&c, 63), 62);
    CHECK_EQ_INT(model_moe_index(&c, 65), 63);
    CHECK_EQ_INT(model_moe_index(&c, 128), 126);
    CHECK_EQ_INT(model_expert_unit(&c, 128, 3), 132 + 126 * 4 + 3);

    static const struct {
        const char *extra, *field;
        ferry_status st;
    } bad[] = {
        {"\"mlp_only_layers\": [1.5]", "mlp_only_layers", FERRY_ERR_INVALID},
        {"\"mlp_only_layers\": 3", "mlp_only_layers", FERRY_ERR_INVALID},
        {"\"decoder_sparse_step\": 0", "decoder_sparse_step", FERRY_ERR_INVALID},
        {"\"num_experts_per_tok\": 129", "num_experts_per_tok", FERRY_ERR_INVALID},
        {"\"num_experts\": 2048", "num_experts", FERRY_ERR_INVALID},
        {"\"moe_intermediate_size\": 0", "moe_intermediate_size", FERRY_ERR_INVALID},
        {"\"norm_topk_prob\": \"yes\"", "norm_topk_prob", FERRY_ERR_INVALID},
        {"\"shared_expert_intermediate_size\": 512", "shared_expert_intermediate_size", FERRY_ERR_UNSUPPORTED},
        {"\"use_sliding_window\": true", "use_sliding_window", FERRY_ERR_UNSUPPORTED},
    };
    /* transformers asks `layer_idx not in mlp_only_layers`: indices that are no layer change nothing */
    static const char *const ignored[] = {"\"mlp_only_layers\": [6]", "\"mlp_only_layers\": [-1, 99]"};
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++) {
        char json[512];
        snprintf(json, sizeof json, QWEN3MOE ", %s}", ignored[i]);
        CHECK_STATUS(parse(json, &c), FERRY_OK);
        for (int l = 0; l < c.n_layers; l++) CHECK(model_layer_moe(&c, l));
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char json[512];
        snprintf(json, sizeof json, QWEN3MOE ", %s}", bad[i].extra);
        CHECK_STATUS(parse(json, &c), bad[i].st);
        CHECK_MSG_HAS(bad[i].field);
    }
    CHECK_STATUS(parse("{\"architectures\": [\"Qwen2MoeForCausalLM\"], " BASE "}", &c), FERRY_ERR_UNSUPPORTED);
    CHECK_MSG_HAS("Qwen2MoeForCausalLM");
    CHECK_MSG_HAS("shared expert");
    CHECK_MSG_HAS("Qwen3MoeForCausalLM"); /* the supported list */
}

/* ---- tensors ---------------------------------------------------------------- */

static void test_entries(void)
{
    model_config c;
    CHECK_STATUS(parse(QWEN3MOE ", \"num_hidden_layers\": 2, \"num_experts\": 3, \"num_experts_per_tok\": 2, "
                                "\"moe_intermediate_size\": 24, \"mlp_only_layers\": [0]}", &c), FERRY_OK);
    model_weights w;
    CHECK_STATUS(model_weights_alloc(&c, &w), FERRY_OK);
    CHECK(w.layers[0].experts == NULL);
    CHECK(w.layers[1].experts != NULL);
    tensor_entry *v;
    int n;
    CHECK_STATUS(model_tensor_entries(&c, &w, &v, &n), FERRY_OK);
    /* embedding; layer 0: norms, q/k/v/o and q/k norm (8), dense MLP (3);
     * layer 1: the 8 and its router, then 3 experts x 3; norm and lm_head */
    CHECK_EQ_INT(n, 1 + 11 + 9 + 9 + 2);
    int i = 1;
    while (i < n && v[i].layer == 0 && v[i].unit == UNIT_LAYER) i++;
    CHECK_EQ_STR(v[i - 1].name, "model.layers.0.mlp.down_proj.weight");
    CHECK_EQ_INT(v[i - 1].rows, 64);
    CHECK_EQ_INT(v[i - 1].cols, 96);
    CHECK(v[i - 1].linear);
    while (i < n && v[i].unit == UNIT_LAYER) i++;
    const tensor_entry *router = &v[i - 1];
    CHECK_EQ_STR(router->name, "model.layers.1.mlp.gate.weight");
    CHECK(router->rows == 3 && router->cols == 64 && !router->linear);
    CHECK(router->dst == &w.layers[1].router);
    static const char *const proj[] = {"gate_proj", "up_proj", "down_proj"};
    for (int e = 0; e < 3; e++)
        for (int p = 0; p < 3; p++) {
            const tensor_entry *t = &v[i + e * 3 + p];
            char want[96];
            snprintf(want, sizeof want, "model.layers.1.mlp.experts.%d.%s.weight", e, proj[p]);
            CHECK_EQ_STR(t->name, want);
            CHECK(t->unit == UNIT_EXPERT && t->layer == 1 && t->expert == e && t->linear);
            CHECK_EQ_INT(t->rows, p == 2 ? 64 : 24);
            CHECK_EQ_INT(t->cols, p == 2 ? 24 : 64);
            const expert_weights *ew = &w.layers[1].experts[e];
            CHECK(t->dst == (p == 0 ? &ew->w_gate : p == 1 ? &ew->w_up : &ew->w_down));
        }
    CHECK_EQ_STR(v[i + 9].name, "model.norm.weight");
    for (int j = 0; j < n; j++) CHECK(strstr(v[j].name, "layers.1.mlp.gate_proj") == NULL);
    free(v);
    model_weights_free(&w);

    /* Mixtral's names */
    CHECK_STATUS(parse(MIXTRAL ", \"num_hidden_layers\": 1, \"num_local_experts\": 2}", &c), FERRY_OK);
    CHECK_STATUS(model_weights_alloc(&c, &w), FERRY_OK);
    CHECK_STATUS(model_tensor_entries(&c, &w, &v, &n), FERRY_OK);
    CHECK_EQ_INT(n, 1 + 7 + 2 * 3 + 2);
    CHECK_EQ_STR(v[7].name, "model.layers.0.block_sparse_moe.gate.weight");
    CHECK_EQ_STR(v[8].name, "model.layers.0.block_sparse_moe.experts.0.w1.weight");
    CHECK_EQ_STR(v[9].name, "model.layers.0.block_sparse_moe.experts.0.w3.weight");
    CHECK_EQ_STR(v[10].name, "model.layers.0.block_sparse_moe.experts.0.w2.weight");
    CHECK_EQ_STR(v[13].name, "model.layers.0.block_sparse_moe.experts.1.w2.weight");
    CHECK(v[10].rows == 64 && v[10].cols == 96 && v[10].dst == &w.layers[0].experts[0].w_down);
    free(v);
    model_weights_free(&w);
}

/* A compressed-tensors int8 checkpoint (int-quantized, per channel) of a
 * Qwen3-MoE layer whose experts are quantized and whose router and
 * attention are not (its ignore list): experts bind as WQ_INT8, the rest
 * plain. */
static void test_bind_quantized(void)
{
    char dir[] = "/tmp/ferry_test_moe_XXXXXX";
    FERRY_ASSERT(mkdtemp(dir));
    const char *cfg_json =
        "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"vocab_size\": 16, \"hidden_size\": 8, "
        "\"intermediate_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 4, "
        "\"num_experts\": 2, \"num_experts_per_tok\": 1, \"moe_intermediate_size\": 6, \"tie_word_embeddings\": true, "
        "\"quantization_config\": {\"quant_method\": \"compressed-tensors\", \"format\": \"int-quantized\", "
        "\"quantization_status\": \"compressed\", \"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], "
        "\"weights\": {\"type\": \"int\", \"num_bits\": 8, \"symmetric\": true, \"dynamic\": false, "
        "\"strategy\": \"channel\"}, \"input_activations\": null, \"output_activations\": null}}, "
        "\"ignore\": [\"lm_head\", \"re:.*self_attn.*\", \"re:.*mlp.gate$\"]}}";
    char *path = util_path_join(dir, "config.json");
    CHECK_STATUS(util_write_file_atomic(path, cfg_json, strlen(cfg_json)), FERRY_OK);
    free(path);
    model_config c;
    CHECK_STATUS(model_config_load(dir, &c), FERRY_OK);
    CHECK_EQ_INT(c.n_ckpt_schemes, 1);
    CHECK_EQ_INT(c.ckpt_schemes[0].quant, WQ_INT8);

    /* declare every tensor: expert linears as int8 + scales, the rest f32 */
    model_weights w;
    tensor_entry *v;
    int n;
    CHECK_STATUS(model_weights_alloc(&c, &w), FERRY_OK);
    CHECK_STATUS(model_tensor_entries(&c, &w, &v, &n), FERRY_OK);
    st_decl decls[64];
    char names[64][160];
    int nd = 0;
    size_t bytes = 0;
    for (int i = 0; i < n; i++) {
        bool q = v[i].unit == UNIT_EXPERT;
        int64_t rows = v[i].rows ? v[i].rows : 1;
        decls[nd] = (st_decl){v[i].name, q ? DT_I8 : DT_F32, v[i].rows ? 2 : 1, {v[i].rows ? v[i].rows : v[i].cols, v[i].cols}};
        bytes += (size_t)(rows * v[i].cols) * (q ? 1 : 4);
        nd++;
        if (q) {
            snprintf(names[nd], sizeof names[nd], "%.*sweight_scale", (int)strlen(v[i].name) - 6, v[i].name);
            decls[nd] = (st_decl){names[nd], DT_F32, 2, {rows, 1}};
            bytes += (size_t)rows * 4;
            nd++;
        }
    }
    path = util_path_join(dir, "model.safetensors");
    st_writer *sw;
    CHECK_STATUS(st_writer_open(path, decls, nd, &sw), FERRY_OK);
    char *zeros = calloc(1, bytes);
    CHECK_STATUS(st_writer_write(sw, zeros, bytes), FERRY_OK);
    CHECK_STATUS(st_writer_finish(sw), FERRY_OK);
    free(zeros);
    free(v);
    model_weights_free(&w);

    st_checkpoint *ck;
    CHECK_STATUS(st_checkpoint_open(dir, &ck), FERRY_OK);
    CHECK_STATUS(model_weights_bind(&c, ck, &w), FERRY_OK);
    const layer_weights *lw = &w.layers[0];
    CHECK(lw->router.quant == WQ_NONE && lw->router.dtype == DT_F32 && lw->router.rows == 2 && lw->router.cols == 8);
    CHECK(lw->wq.quant == WQ_NONE);
    for (int e = 0; e < 2; e++) {
        const expert_weights *ew = &lw->experts[e];
        CHECK(ew->w_gate.quant == WQ_INT8 && ew->w_gate.dtype == DT_I8 && ew->w_gate.rows == 6 && ew->w_gate.cols == 8);
        CHECK(ew->w_up.quant == WQ_INT8 && ew->w_up.scales != NULL);
        CHECK(ew->w_down.quant == WQ_INT8 && ew->w_down.rows == 8 && ew->w_down.cols == 6 && ew->w_down.group == 6);
    }
    CHECK(w.lm_head.data == w.embed.data);
    model_weights_free(&w);
    st_checkpoint_close(ck);

    unlink(path);
    free(path);
    path = util_path_join(dir, "config.json");
    unlink(path);
    free(path);
    rmdir(dir);
}

int main(void)
{
    test_route_hand();
    test_route_ties();
    test_route_sorted_choices();
    test_route_shapes();
    test_route_nan();
    test_route_random();
    test_config_mixtral();
    test_config_qwen3moe();
    test_entries();
    test_bind_quantized();
    return check_report();
}
