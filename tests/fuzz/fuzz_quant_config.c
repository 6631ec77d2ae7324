/*
 * fuzz_quant_config.c - libFuzzer target for the compressed-tensors
 * quantization metadata of a checkpoint: config.json's quantization_config
 * (model.c's parse_quantization, through model_config_parse in
 * engine/weights/model.h).
 *
 * The input is the value of quantization_config, set into a fixed, valid
 * config.json of a small Llama (so that every mutation lands in the
 * quantization parser rather than in the dimensions fuzz_model_config
 * covers). Promises: null (or the key absent) is a plain checkpoint; an
 * accepted value is a scheme the loader implements - int8 per channel
 * (int-quantized or pack-quantized) or int4 per channel or per group
 * (pack-quantized), with a group size in 1..2^24 - and the rest of the
 * config is untouched; a refused value that is valid JSON names
 * quantization_config. A broken promise aborts, which libFuzzer reports as a
 * crash. Build: README.md.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/weights/model.h"

#define LABEL "fuzz/config.json"

static const char head[] = "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 256, \"hidden_size\": 64, "
                           "\"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                           "\"num_key_value_heads\": 2, \"quantization_config\": ";
static const char tail[] = "}";

static model_config g_plain; /* the config without quantization_config */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    static const char plain[] = "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 256, \"hidden_size\": 64, "
                                "\"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                                "\"num_key_value_heads\": 2}";
    if (model_config_parse(plain, sizeof plain - 1, LABEL, &g_plain) != FERRY_OK) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t len = sizeof head - 1 + size + sizeof tail - 1;
    char *text = malloc(len);
    model_config *c = malloc(sizeof *c);
    if (!text || !c) abort();
    memcpy(text, head, sizeof head - 1);
    memcpy(text + sizeof head - 1, data, size);
    memcpy(text + sizeof head - 1 + size, tail, sizeof tail - 1);

    /* the input alone is one JSON value, and the whole config parses (a
     * value nested to the reader's limit is too deep inside the config) */
    json_doc *doc = NULL, *whole = NULL;
    bool value = json_parse((const char *)data, size, &doc) == FERRY_OK && json_parse(text, len, &whole) == FERRY_OK;
    bool null = value && json_doc_root(doc)->type == JSON_NULL;
    json_doc_free(doc);
    json_doc_free(whole);

    ferry_status st = model_config_parse(text, len, LABEL, c);
    if (st != FERRY_OK) {
        if (null || !strstr(ferry_errmsg(), LABEL)) abort();
        if (value && !strstr(ferry_errmsg(), "quantization_config")) {
            fprintf(stderr, "fuzz_quant_config: the error does not name quantization_config: %s\n", ferry_errmsg());
            abort();
        }
    } else if (value) {
        model_config q = *c; /* all but the schemes as without quantization_config */
        q.n_ckpt_schemes = 0;
        memset(q.ckpt_schemes, 0, sizeof q.ckpt_schemes);
        q.ckpt_packed = false;
        if (memcmp(&q, &g_plain, sizeof q)) abort();
        if (null != (c->n_ckpt_schemes == 0) || c->n_ckpt_schemes > MODEL_MAX_SCHEMES) abort();
        if (null && c->ckpt_packed) abort();
        for (int k = 0; k < c->n_ckpt_schemes; k++) {
            const model_quant_scheme *m = &c->ckpt_schemes[k];
            if (m->group < 0 || m->group > (1 << 24)) abort();
            if (m->quant != WQ_INT8 && (m->quant != WQ_INT4 || !c->ckpt_packed)) abort();
            for (int j = 0; j < k; j++) /* the distinct schemes, each once */
                if (c->ckpt_schemes[j].quant == m->quant && c->ckpt_schemes[j].group == m->group) abort();
        }
    }
    free(text);
    free(c);
    return 0;
}
