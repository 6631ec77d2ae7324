/*
 * ct_config.c - compressed-tensors' quantization_config for an export. See
 * ct_config.h.
 *
 * Every quantized layer gets a pattern (its module name, dots escaped, each
 * all-digit component \d+); the layers are sorted by pattern, and a run of
 * one pattern whose layers share a scheme becomes one regex target of that
 * scheme's config group, a run with mixed schemes the exact names of its
 * layers. O(n log n) in the layers (a mixture of experts has tens of
 * thousands).
 */
#include "ct_config.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"

typedef struct {
    char *pattern;  /* "re:model\.layers\.\d+\.mlp\.down_proj$" */
    char *module;   /* "model.layers.3.mlp.down_proj" */
    int scheme;     /* index into the schemes */
} ct_target;

typedef struct {
    weight_quant quant;
    int group;
} ct_scheme;

/* NAME.weight -> NAME. */
static char *module_of(const char *name)
{
    size_t n = strlen(name), w = strlen(".weight");
    if (n > w && !strcmp(name + n - w, ".weight")) n -= w;
    char *m = malloc(n + 1);
    if (m) {
        memcpy(m, name, n);
        m[n] = '\0';
    }
    return m;
}

/* The regex of a module name: "re:" + the name with '.' escaped and every
 * all-digit component \d+, anchored at the end (re.match anchors the start). */
static char *pattern_of(const char *module)
{
    size_t n = strlen(module);
    char *p = malloc(3 + 3 * n + 2), *o = p; /* "\d+" is 3 characters for at least 1 */
    if (!p) return NULL;
    memcpy(o, "re:", 3);
    o += 3;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && module[j] != '.') j++;
        bool digits = j > i;
        for (size_t k = i; k < j; k++) digits = digits && isdigit((unsigned char)module[k]);
        if (digits) {
            memcpy(o, "\\d+", 3);
            o += 3;
        } else {
            memcpy(o, module + i, j - i);
            o += j - i;
        }
        if (j < n) {
            memcpy(o, "\\.", 2);
            o += 2;
        }
        i = j + 1;
    }
    memcpy(o, "$", 2);
    return p;
}

static int cmp_target(const void *a, const void *b)
{
    const ct_target *x = a, *y = b;
    int c = strcmp(x->pattern, y->pattern);
    return c ? c : strcmp(x->module, y->module);
}

static void scheme_weights(strbuf *sb, const ct_scheme *s)
{
    sb_printf(sb, "\"num_bits\": %d, \"type\": \"int\", \"symmetric\": true, ", s->quant == WQ_INT8 ? 8 : 4);
    if (s->group) sb_printf(sb, "\"strategy\": \"group\", \"group_size\": %d, ", s->group);
    else sb_puts(sb, "\"strategy\": \"channel\", \"group_size\": null, ");
    sb_puts(sb, "\"dynamic\": false, \"actorder\": null, \"observer\": \"minmax\", \"block_structure\": null");
}

ferry_status ct_config_write(const ct_layer *layers, int n, strbuf *sb)
{
    ct_target *t = calloc((size_t)(n ? n : 1), sizeof *t);
    ct_scheme *schemes = calloc((size_t)(n ? n : 1), sizeof *schemes);
    bool *pure = calloc((size_t)(n ? n : 1), sizeof *pure); /* per sorted target: its run has one scheme */
    int nt = 0, ns = 0;
    bool head_quantized = false;
    ferry_status st = t && schemes && pure ? FERRY_OK : ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    for (int i = 0; st == FERRY_OK && i < n; i++) {
        if (layers[i].quant == WQ_NONE) continue;
        int k = 0;
        while (k < ns && (schemes[k].quant != layers[i].quant || schemes[k].group != layers[i].group)) k++;
        if (k == ns) schemes[ns++] = (ct_scheme){layers[i].quant, layers[i].group};
        t[nt] = (ct_target){NULL, module_of(layers[i].name), k};
        if (t[nt].module) t[nt].pattern = pattern_of(t[nt].module);
        if (!t[nt].module || !t[nt++].pattern) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
        head_quantized = head_quantized || !strcmp(layers[i].name, "lm_head.weight");
    }
    if (st == FERRY_OK && nt > 0) {
        qsort(t, (size_t)nt, sizeof *t, cmp_target);
        for (int a = 0, b; a < nt; a = b) {
            bool one = true;
            for (b = a; b < nt && !strcmp(t[b].pattern, t[a].pattern); b++) one = one && t[b].scheme == t[a].scheme;
            for (int k = a; k < b; k++) pure[k] = one;
        }
        sb_puts(sb, "{\n    \"quant_method\": \"compressed-tensors\",\n    \"format\": \"pack-quantized\",\n"
                    "    \"quantization_status\": \"compressed\",\n    \"config_groups\": {");
        for (int s = 0; s < ns; s++) {
            sb_printf(sb, "%s\n      \"group_%d\": {\n        \"targets\": [", s ? "," : "", s);
            int m = 0;
            for (int k = 0; k < nt; k++) {
                if (t[k].scheme != s || (pure[k] && k > 0 && pure[k - 1] && !strcmp(t[k - 1].pattern, t[k].pattern)))
                    continue; /* another scheme's, or a pattern already written */
                sb_puts(sb, m++ ? ", " : "");
                sb_json_str(sb, pure[k] ? t[k].pattern : t[k].module);
            }
            sb_puts(sb, "],\n        \"format\": \"pack-quantized\",\n        \"weights\": {");
            scheme_weights(sb, &schemes[s]);
            sb_puts(sb, "},\n        \"input_activations\": null,\n        \"output_activations\": null\n      }");
        }
        sb_puts(sb, "\n    },\n    \"ignore\": [");
        int m = 0;
        if (!head_quantized) {
            sb_puts(sb, "\"lm_head\"");
            m++;
        }
        for (int i = 0; i < n; i++) {
            if (layers[i].quant != WQ_NONE || !strcmp(layers[i].name, "lm_head.weight")) continue;
            char *mod = module_of(layers[i].name);
            if (!mod) {
                st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
                break;
            }
            sb_puts(sb, m++ ? ", " : "");
            sb_json_str(sb, mod);
            free(mod);
        }
        sb_puts(sb, "],\n    \"kv_cache_scheme\": null\n  }");
        if (sb->oom && st == FERRY_OK) st = ferry_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    for (int k = 0; t && k < nt; k++) {
        free(t[k].pattern);
        free(t[k].module);
    }
    free(t);
    free(schemes);
    free(pure);
    return st;
}
