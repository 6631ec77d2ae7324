/*
 * gguf_vocab_read.c - a GGUF file's tokenizer.ggml.* metadata, checked and
 * laid out as a Hugging Face tokenizer holds it (gguf_vocab_internal.h);
 * gguf_vocab.c writes the result as tokenizer.json and
 * tokenizer_config.json.
 *
 * Every array is read within its length (gguf.c has checked each against
 * the file). A token index - a hash table over the token strings, with a
 * hash whose value for a prefix, a suffix and two strings end to end
 * follows from the parts' - finds duplicate tokens and the halves of
 * merges without copying them; SentencePiece merges are derived here too.
 * What llama.cpp would read differently from a tokenizer.json (a gap in
 * the ids, a merge of strings that are not tokens) is refused, naming the
 * key and the value.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_vocab.h"
#include "gguf_vocab_internal.h"

#define KEY_MODEL "tokenizer.ggml.model"
#define KEY_PRE "tokenizer.ggml.pre"
#define KEY_TOKENS "tokenizer.ggml.tokens"
#define KEY_TYPES "tokenizer.ggml.token_type"
#define KEY_SCORES "tokenizer.ggml.scores"
#define KEY_MERGES "tokenizer.ggml.merges"
#define KEY_BOS "tokenizer.ggml.bos_token_id"
#define KEY_EOS "tokenizer.ggml.eos_token_id"
#define KEY_UNK "tokenizer.ggml.unknown_token_id"
#define KEY_PAD "tokenizer.ggml.padding_token_id"
#define KEY_ADD_BOS "tokenizer.ggml.add_bos_token"
#define KEY_ADD_EOS "tokenizer.ggml.add_eos_token"
#define KEY_ADD_PREFIX "tokenizer.ggml.add_space_prefix"
#define KEY_EXTRA_WS "tokenizer.ggml.remove_extra_whitespaces"

#define MAX_TOKENS (1u << 24) /* text/tokenizer.c's id limit */

/* llama.cpp's token types (tokenizer.ggml.token_type) */
enum { TYPE_NORMAL = 1, TYPE_UNKNOWN = 2, TYPE_CONTROL = 3, TYPE_USER_DEFINED = 4, TYPE_BYTE = 6 };

/* ---- byte-level pre-tokenizers, by tokenizer.ggml.pre -------------------------
 * llama.cpp's src/llama-vocab.cpp maps each name to regexes it runs in turn;
 * these are the regexes of the models' own tokenizer.json files, which
 * llama.cpp quotes (it runs adapted forms of some). */

#define LLAMA3_REGEX                                                                                   \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
static const char *const LLAMA3_SPLITS[] = {LLAMA3_REGEX, NULL};
static const char *const QWEN2_SPLITS[] = {
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
/* Qwen3.5: letters with their marks */
static const char *const QWEN35_SPLITS[] = {
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
/* StarCoder's Digits(individual_digits), written as the equivalent Split */
static const char *const DIGIT_SPLITS[] = {"\\p{N}", NULL};
static const char *const DEEPSEEK_LLM_SPLITS[] = {
    "[\r\n]",
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481"
    "\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf"
    "\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
    "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4"
    "\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
    "\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
    "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb"
    "\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    "\\s+$",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    "\\p{N}+",
    NULL};
static const char *const DEEPSEEK_CODER_SPLITS[] = {
    "[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", "\\p{N}", NULL};
/* Falcon's Punctuation(contiguous), then Digits and groups of three, as regexes */
static const char *const FALCON_SPLITS[] = {"[\\p{P}!-/:-@\\[-`{-~]+", NULL};
static const char *const FALCON_AFTER[] = {"[0-9]+", "[0-9][0-9][0-9]", NULL};

static const bpe_recipe LLAMA3 = {.splits = LLAMA3_SPLITS, .ignore_merges = true, .add_bos = true};
static const bpe_recipe DBRX = {.splits = LLAMA3_SPLITS};
static const bpe_recipe QWEN2 = {.splits = QWEN2_SPLITS, .nfc = true, .string_merges = true};
static const bpe_recipe QWEN35 = {.splits = QWEN35_SPLITS, .string_merges = true};
static const bpe_recipe GPT2 = {.gpt2_regex = true};
static const bpe_recipe DIGITS_GPT2 = {.splits = DIGIT_SPLITS, .gpt2_regex = true};
static const bpe_recipe DEEPSEEK_LLM = {.splits = DEEPSEEK_LLM_SPLITS};
static const bpe_recipe DEEPSEEK_CODER = {.splits = DEEPSEEK_CODER_SPLITS};
static const bpe_recipe FALCON = {.splits = FALCON_SPLITS, .gpt2_regex = true, .after = FALCON_AFTER};

static const struct {
    const char *pre;
    const bpe_recipe *recipe;
} PRE_NAMES[] = {
    {"llama-bpe", &LLAMA3},      {"llama3", &LLAMA3},        {"llama-v3", &LLAMA3},
    {"dbrx", &DBRX},             {"smaug-bpe", &DBRX},       {"qwen2", &QWEN2},
    {"deepseek-r1-qwen", &QWEN2}, {"qwen35", &QWEN35},       {"gpt-2", &GPT2},
    {"phi-2", &GPT2},            {"mpt", &GPT2},             {"olmo", &GPT2},
    {"starcoder", &DIGITS_GPT2}, {"smollm", &DIGITS_GPT2},   {"refact", &DIGITS_GPT2},
    {"command-r", &DIGITS_GPT2}, {"codeshell", &DIGITS_GPT2}, {"deepseek-llm", &DEEPSEEK_LLM},
    {"deepseek-coder", &DEEPSEEK_CODER}, {"falcon", &FALCON},
};
#define N_PRE_NAMES (sizeof PRE_NAMES / sizeof PRE_NAMES[0])

/* ---- strings ------------------------------------------------------------------- */

bool gguf_vocab_utf8_valid(const char *s, uint64_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    for (uint64_t i = 0; i < n;) {
        unsigned c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        unsigned len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (!len || n - i < len) return false;
        uint32_t cp = c & (0x7F >> len);
        for (unsigned k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000}; /* shorter forms are overlong */
        if (cp < least[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += len;
    }
    return true;
}

/* A GGUF string as a message shows it: at most SHOW_MAX bytes, control
 * bytes (and every byte past ASCII when it is not UTF-8) as \xNN. */
#define SHOW_MAX 48
typedef struct {
    char s[SHOW_MAX * 4 + 8];
} shown;

static const char *show(gguf_str v, shown *out)
{
    bool text = gguf_vocab_utf8_valid(v.ptr, v.len);
    size_t o = 0;
    uint64_t i = 0;
    for (; i < v.len && i < SHOW_MAX; i++) {
        unsigned char c = (unsigned char)v.ptr[i];
        if (c < 0x20 || c == 0x7F || (c >= 0x80 && !text)) o += (size_t)snprintf(out->s + o, 5, "\\x%02x", c);
        else out->s[o++] = (char)c;
    }
    if (text) /* cut at a character's start */
        while (o > 0 && i < v.len && ((unsigned char)v.ptr[i] & 0xC0) == 0x80) o--, i--;
    if (i < v.len) memcpy(out->s + o, "...", 3), o += 3;
    out->s[o] = 0;
    return out->s;
}

/* ---- the token index: token string -> id -----------------------------------------
 * A polynomial hash modulo 2^61 - 1, so that the hash of a string's prefix,
 * of its suffix and of two strings end to end all follow from the parts'
 * hashes (a merge's halves are found without copying them). */

#define HASH_P ((1ull << 61) - 1)
#define HASH_B 0x1b3f62a4c5d7e9ull /* any base below HASH_P */

static uint64_t hmul(uint64_t a, uint64_t b)
{
    unsigned __int128 r = (unsigned __int128)a * b;
    uint64_t x = (uint64_t)(r & HASH_P) + (uint64_t)(r >> 61);
    x = (x & HASH_P) + (x >> 61);
    return x >= HASH_P ? x - HASH_P : x;
}

static uint64_t hadd(uint64_t a, uint64_t b)
{
    uint64_t x = a + b;
    return x >= HASH_P ? x - HASH_P : x;
}

static uint64_t hsub(uint64_t a, uint64_t b) { return a >= b ? a - b : a + HASH_P - b; }

static uint64_t hpow(uint64_t b, uint64_t e)
{
    uint64_t r = 1;
    for (; e; e >>= 1, b = hmul(b, b))
        if (e & 1) r = hmul(r, b);
    return r;
}

/* hash(s + one more byte) */
static uint64_t hstep(uint64_t h, unsigned char c) { return hadd(hmul(h, HASH_B), (uint64_t)c + 1); }

static uint64_t hash_bytes(const char *p, uint64_t n)
{
    uint64_t h = 0;
    for (uint64_t i = 0; i < n; i++) h = hstep(h, (unsigned char)p[i]);
    return h;
}

static uint64_t slot_of(const token_index *ix, uint64_t h) { return (h * 0x9E3779B97F4A7C15ull >> 17) & ix->mask; }

/* The id of the token whose text is p1 + p2 (hash h), or -1. */
static int64_t index_find(const token_index *ix, uint64_t h, const char *p1, uint64_t n1, const char *p2, uint64_t n2)
{
    for (uint64_t s = slot_of(ix, h);; s = (s + 1) & ix->mask) {
        uint32_t e = ix->slots[s];
        if (!e) return -1;
        const gguf_str *t = &ix->tokens[e - 1];
        if (ix->hash[e - 1] == h && t->len == n1 + n2 && !memcmp(t->ptr, p1, n1) && !memcmp(t->ptr + n1, p2, n2))
            return e - 1;
    }
}

static void index_free(token_index *ix)
{
    free(ix->hash);
    free(ix->slots);
    memset(ix, 0, sizeof *ix);
}

/* ---- reading the vocabulary --------------------------------------------------------- */

void gguf_vocab_free(gguf_vocab *v)
{
    free(v->place);
    free(v->merge_kept);
    index_free(&v->index);
}

static uint32_t le32(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

static int32_t token_type(const gguf_vocab *v, uint32_t i)
{
    return v->types ? (int32_t)le32(v->types->v.arr.data + 4 * (uint64_t)i) : TYPE_NORMAL;
}

static double token_score(const gguf_vocab *v, uint32_t i)
{
    uint32_t b = le32(v->scores->v.arr.data + 4 * (uint64_t)i);
    if (v->scores->v.arr.type == GGUF_V_I32) return (int32_t)b;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* gguf_get_*'s refusal of a mistyped key, with the file's label in front */
ferry_status gguf_vocab_mistyped(const gguf_vocab *v) { return ferry_fail_context(FERRY_ERR_INVALID, "%s", v->label); }

/* key as an array of item type want (or want2); *out NULL when absent and
 * not required */
static ferry_status get_array(const gguf_vocab *v, const char *key, gguf_vtype want, gguf_vtype want2, bool required,
                              const gguf_kv **out)
{
    const gguf_kv *kv = gguf_find(v->g, key);
    *out = NULL;
    if (!kv) {
        if (!required) return FERRY_OK;
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s is missing", v->label, key);
    }
    if (kv->type != GGUF_V_ARRAY || (kv->v.arr.type != want && kv->v.arr.type != want2))
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s is %s %s, not an array of %s", v->label, key,
                          kv->type == GGUF_V_ARRAY ? "an array of" : "a",
                          gguf_vtype_name(kv->type == GGUF_V_ARRAY ? kv->v.arr.type : kv->type), gguf_vtype_name(want));
    *out = kv;
    return FERRY_OK;
}

static ferry_status get_bool(const gguf_vocab *v, const char *key, bool dflt, bool *out)
{
    const gguf_kv *kv = gguf_find(v->g, key);
    *out = dflt;
    if (!kv) return FERRY_OK;
    if (kv->type != GGUF_V_BOOL)
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s is a %s, not a bool", v->label, key, gguf_vtype_name(kv->type));
    *out = kv->v.u != 0;
    return FERRY_OK;
}

/* tokenizer.ggml.model and .pre: the recipe */
static ferry_status read_model(gguf_vocab *v)
{
    gguf_str model, pre;
    bool bad = false;
    shown a;
    if (!gguf_get_str(v->g, KEY_MODEL, &model, &bad))
        return bad ? gguf_vocab_mistyped(v) : ferry_fail(FERRY_ERR_INVALID, "%s: %s is missing", v->label, KEY_MODEL);
    bool has_pre = gguf_get_str(v->g, KEY_PRE, &pre, &bad);
    if (bad) return gguf_vocab_mistyped(v);
    if (gguf_str_eq(model, "llama")) { /* llama.cpp reads no pre-tokenizer for SentencePiece */
        v->spm = true;
        return FERRY_OK;
    }
    if (!gguf_str_eq(model, "gpt2"))
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s '%s' is not supported (llama: SentencePiece, gpt2: byte-level BPE)",
                          v->label, KEY_MODEL, show(model, &a));
    if (!has_pre) /* llama.cpp's "default" regexes, which no HF file has */
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s is missing (a gpt2 tokenizer needs its pre-tokenizer's name)",
                          v->label, KEY_PRE);
    for (size_t i = 0; i < N_PRE_NAMES; i++)
        if (gguf_str_eq(pre, PRE_NAMES[i].pre)) {
            v->bpe = PRE_NAMES[i].recipe;
            return FERRY_OK;
        }
    return ferry_fail(FERRY_ERR_INVALID, "%s: %s '%s' is not a pre-tokenizer this reads (%s, ...)", v->label, KEY_PRE,
                      show(pre, &a), "llama-bpe, qwen2, gpt-2, starcoder, smollm, deepseek-llm, falcon");
}

/* tokenizer.ggml.tokens: non-empty UTF-8 without NUL, each once */
static ferry_status read_tokens(gguf_vocab *v)
{
    const gguf_kv *kv;
    FERRY_TRY(get_array(v, KEY_TOKENS, GGUF_V_STRING, GGUF_V_STRING, true, &kv));
    if (kv->v.arr.n == 0 || kv->v.arr.n > MAX_TOKENS)
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s has %llu tokens (1 to %u)", v->label, KEY_TOKENS,
                          (unsigned long long)kv->v.arr.n, MAX_TOKENS);
    v->n = (uint32_t)kv->v.arr.n;
    v->tokens = kv->v.arr.strs;
    token_index *ix = &v->index;
    ix->tokens = v->tokens;
    ix->mask = 1;
    while (ix->mask < 2 * (uint64_t)v->n) ix->mask <<= 1;
    ix->hash = malloc(v->n * sizeof *ix->hash);
    ix->slots = calloc(ix->mask, sizeof *ix->slots);
    ix->mask--;
    if (!ix->hash || !ix->slots) return ferry_fail(FERRY_ERR_NOMEM, "%s: no memory for %u tokens", v->label, v->n);
    shown a;
    for (uint32_t i = 0; i < v->n; i++) {
        gguf_str t = v->tokens[i];
        if (!t.len || !gguf_vocab_utf8_valid(t.ptr, t.len) || memchr(t.ptr, 0, t.len))
            return ferry_fail(FERRY_ERR_INVALID, "%s: %s[%u] '%s' is %s", v->label, KEY_TOKENS, i, show(t, &a),
                              !t.len ? "empty" : memchr(t.ptr, 0, t.len) ? "holding a NUL byte" : "not UTF-8");
        uint64_t h = ix->hash[i] = hash_bytes(t.ptr, t.len);
        int64_t same = index_find(ix, h, t.ptr, t.len, "", 0);
        if (same >= 0)
            return ferry_fail(FERRY_ERR_INVALID, "%s: %s[%lld] and [%u] are both '%s'", v->label, KEY_TOKENS,
                              (long long)same, i, show(t, &a));
        uint64_t s = slot_of(ix, h);
        while (ix->slots[s]) s = (s + 1) & ix->mask;
        ix->slots[s] = i + 1;
    }
    return FERRY_OK;
}

static bool is_filler(gguf_str t, uint32_t i)
{
    char buf[24];
    int n = snprintf(buf, sizeof buf, "[PAD%u]", i);
    return t.len == (uint64_t)n && !memcmp(t.ptr, buf, (size_t)n);
}

/* The id HF tokenizers gives added token i when it loads the file: its id
 * in the vocabulary, else the next after the vocabulary and the added
 * tokens before it (AddedVocabulary::add_tokens). */
static uint32_t hf_added_id(const gguf_vocab *v, uint32_t i, int64_t max_added)
{
    if (v->place[i] & IN_VOCAB) return i;
    if (max_added < 0 || max_added < (int64_t)v->n_vocab) return v->n_vocab;
    return (uint32_t)max_added + 1;
}

/* tokenizer.ggml.token_type, and where each token goes */
static ferry_status place_tokens(gguf_vocab *v)
{
    FERRY_TRY(get_array(v, KEY_TYPES, GGUF_V_I32, GGUF_V_I32, false, &v->types));
    if (v->types && v->types->v.arr.n != v->n)
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s has %llu entries for %u tokens", v->label, KEY_TYPES,
                          (unsigned long long)v->types->v.arr.n, v->n);
    if (!(v->place = calloc(v->n, 1))) return ferry_fail(FERRY_ERR_NOMEM, "%s: no memory", v->label);
    v->n_pieces = v->n; /* vocab_to_hf.py: up to the last normal or byte token */
    if (v->spm)
        for (uint32_t i = v->n; i-- > 0;)
            if (token_type(v, i) == TYPE_NORMAL || token_type(v, i) == TYPE_BYTE) {
                v->n_pieces = i + 1;
                break;
            }
    for (uint32_t i = 0; i < v->n; i++) {
        if (is_filler(v->tokens[i], i)) continue;
        int32_t ty = token_type(v, i);
        uint8_t p = i < v->n_pieces ? IN_VOCAB : 0;
        if (v->spm && i < 3 && (ty == TYPE_UNKNOWN || ty == TYPE_CONTROL || ty == TYPE_USER_DEFINED))
            p |= ADDED | SPECIAL | NORMALIZED; /* Llama 2's file: <unk>, <s>, </s> */
        else if (ty == TYPE_CONTROL) p |= ADDED | SPECIAL;
        else if (ty == TYPE_USER_DEFINED) p |= ADDED | NORMALIZED;
        v->place[i] = p;
        v->n_vocab += (p & IN_VOCAB) != 0;
    }
    int64_t max_added = -1;
    shown a;
    for (uint32_t i = 0; i < v->n; i++) {
        if (!(v->place[i] & ADDED)) continue;
        uint32_t id = hf_added_id(v, i, max_added);
        if (id != i)
            return ferry_fail(FERRY_ERR_INVALID,
                              "%s: %s[%u] '%s' (type %d) would be id %u in a tokenizer.json: tokens before it are "
                              "left out (neither SentencePiece pieces nor added tokens)",
                              v->label, KEY_TOKENS, i, show(v->tokens[i], &a), token_type(v, i), id);
        if ((int64_t)id > max_added) max_added = id;
    }
    return FERRY_OK;
}

/* a special token's id: in range and kept in the tokenizer (-1 when absent) */
static ferry_status read_special(gguf_vocab *v, const char *key, int64_t *out)
{
    uint64_t id;
    bool bad = false;
    shown a;
    *out = -1;
    if (!gguf_get_uint(v->g, key, &id, &bad)) return bad ? gguf_vocab_mistyped(v) : FERRY_OK;
    if (id >= v->n)
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s %llu is not a token id (%u tokens)", v->label, key,
                          (unsigned long long)id, v->n);
    if (!v->place[id])
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s %llu is '%s', which the tokenizer leaves out", v->label, key,
                          (unsigned long long)id, show(v->tokens[id], &a));
    *out = (int64_t)id;
    return FERRY_OK;
}

static ferry_status read_specials(gguf_vocab *v)
{
    FERRY_TRY(read_special(v, KEY_BOS, &v->bos));
    FERRY_TRY(read_special(v, KEY_EOS, &v->eos));
    FERRY_TRY(read_special(v, KEY_UNK, &v->unk));
    FERRY_TRY(read_special(v, KEY_PAD, &v->pad));
    shown a;
    if (v->spm && v->unk >= 0 && !(v->place[v->unk] & IN_VOCAB)) /* byte fallback's unk is a piece */
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s %lld '%s' is not one of the SentencePiece pieces", v->label,
                          KEY_UNK, (long long)v->unk, show(v->tokens[v->unk], &a));
    /* llama.cpp's defaults: BOS for SentencePiece and Llama 3, never EOS */
    FERRY_TRY(get_bool(v, KEY_ADD_BOS, v->spm || v->bpe->add_bos, &v->add_bos));
    FERRY_TRY(get_bool(v, KEY_ADD_EOS, false, &v->add_eos));
    if (v->add_bos && v->bos < 0)
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s is missing (%s is %s)", v->label, KEY_BOS, KEY_ADD_BOS,
                          gguf_find(v->g, KEY_ADD_BOS) ? "true" : "true by default");
    if (v->add_eos && v->eos < 0)
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s is missing (%s is true)", v->label, KEY_EOS, KEY_ADD_EOS);
    return FERRY_OK;
}

/* spm: the scores, and the options of llama.cpp's SentencePiece tokenizer */
static ferry_status read_spm(gguf_vocab *v)
{
    FERRY_TRY(get_array(v, KEY_SCORES, GGUF_V_F32, GGUF_V_I32, true, &v->scores));
    if (v->scores->v.arr.n != v->n)
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s has %llu entries for %u tokens", v->label, KEY_SCORES,
                          (unsigned long long)v->scores->v.arr.n, v->n);
    for (uint32_t i = 0; i < v->n; i++)
        if (isnan(token_score(v, i)))
            return ferry_fail(FERRY_ERR_INVALID, "%s: %s[%u] is not a number", v->label, KEY_SCORES, i);
    bool extra_ws;
    FERRY_TRY(get_bool(v, KEY_ADD_PREFIX, true, &v->space_prefix));
    FERRY_TRY(get_bool(v, KEY_EXTRA_WS, false, &extra_ws));
    if (extra_ws) /* llama.cpp then squeezes runs of spaces, which no HF normalizer here does */
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s true is not supported", v->label, KEY_EXTRA_WS);
    return FERRY_OK;
}

/* A merge "a b": a, b and ab tokens of the vocabulary, ids[] a's and b's.
 * (llama.cpp keeps any string; HF refuses a merge of tokens it lacks.) */
static ferry_status check_merge(const gguf_vocab *v, uint64_t k, int64_t ids[2])
{
    gguf_str m = v->merges->v.arr.strs[k];
    const char *sp = m.len ? memchr(m.ptr, ' ', m.len) : NULL;
    shown a;
    uint64_t at = sp ? (uint64_t)(sp - m.ptr) : 0;
    if (!sp || at == 0 || at + 1 == m.len || memchr(sp + 1, ' ', m.len - at - 1))
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s[%llu] '%s' does not split at one space into two tokens",
                          v->label, KEY_MERGES, (unsigned long long)k, show(m, &a));
    const char *b = sp + 1;
    uint64_t nb = m.len - at - 1;
    uint64_t ha = hash_bytes(m.ptr, at), hb = hash_bytes(b, nb);
    ids[0] = index_find(&v->index, ha, m.ptr, at, "", 0);
    ids[1] = index_find(&v->index, hb, b, nb, "", 0);
    int64_t joined = index_find(&v->index, hadd(hmul(ha, hpow(HASH_B, nb)), hb), m.ptr, at, b, nb);
    const char *missing = ids[0] < 0 || !(v->place[ids[0]] & IN_VOCAB)   ? "its first half"
                          : ids[1] < 0 || !(v->place[ids[1]] & IN_VOCAB) ? "its second half"
                          : joined < 0 || !(v->place[joined] & IN_VOCAB) ? "the merged token"
                                                                         : NULL;
    if (missing)
        return ferry_fail(FERRY_ERR_INVALID, "%s: %s[%llu] '%s': %s is not in the vocabulary", v->label, KEY_MERGES,
                          (unsigned long long)k, show(m, &a), missing);
    return FERRY_OK;
}

/* gpt2: the merges, each checked; a repeat of an earlier one is left out
 * (llama.cpp ranks a pair by its first merge, HF by its last) */
static ferry_status read_merges(gguf_vocab *v)
{
    FERRY_TRY(get_array(v, KEY_MERGES, GGUF_V_STRING, GGUF_V_STRING, true, &v->merges));
    uint64_t n = v->merges->v.arr.n, mask = 1;
    while (mask < 2 * n) mask <<= 1;
    uint64_t *seen = calloc(mask, sizeof *seen); /* (a << 32 | b) + 1 */
    v->merge_kept = malloc(n ? n : 1);
    if (!seen || !v->merge_kept) {
        free(seen);
        return ferry_fail(FERRY_ERR_NOMEM, "%s: no memory for %llu merges", v->label, (unsigned long long)n);
    }
    ferry_status st = FERRY_OK;
    for (uint64_t k = 0; k < n && st == FERRY_OK; k++) {
        int64_t ids[2] = {-1, -1};
        if ((st = check_merge(v, k, ids)) != FERRY_OK) break;
        uint64_t key = ((uint64_t)ids[0] << 32 | (uint64_t)ids[1]) + 1;
        uint64_t s = (key * 0x9E3779B97F4A7C15ull >> 17) & (mask - 1);
        while (seen[s] && seen[s] != key) s = (s + 1) & (mask - 1);
        v->merge_kept[k] = seen[s] != key;
        seen[s] = key;
    }
    free(seen);
    return st;
}

ferry_status gguf_vocab_read(const gguf_file *g, const char *label, gguf_vocab *v)
{
    memset(v, 0, sizeof *v);
    v->label = label;
    v->g = g;
    v->bos = v->eos = v->unk = v->pad = -1;
    FERRY_TRY(read_model(v));
    FERRY_TRY(read_tokens(v));
    FERRY_TRY(place_tokens(v));
    FERRY_TRY(read_specials(v));
    return v->spm ? read_spm(v) : read_merges(v);
}

/* ---- SentencePiece merges ------------------------------------------------------------
 * What transformers' SentencePieceExtractor derives (vocab_to_hf.py's
 * spm_merges): every split of a piece with a non-zero score into two
 * pieces, ordered by the piece's score, highest first, ties by the left and
 * then the right half's id. */

static int merge_order(const void *pa, const void *pb)
{
    const spm_merge *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    if (a->left != b->left) return a->left < b->left ? -1 : 1;
    return (a->right > b->right) - (a->right < b->right);
}

static ferry_status merge_push(const gguf_vocab *v, merge_list *ml, double score, uint32_t left, uint32_t right)
{
    ml->bytes += v->tokens[left].len + v->tokens[right].len + 8;
    if (ml->bytes > GGUF_VOCAB_MAX_MERGE_BYTES)
        return ferry_fail(FERRY_ERR_TOO_LARGE, "%s: the SentencePiece merges of %s pass %u MiB", v->label, KEY_TOKENS,
                          GGUF_VOCAB_MAX_MERGE_BYTES >> 20);
    if (ml->n == ml->cap) {
        size_t cap = ml->cap ? 2 * ml->cap : 4096;
        spm_merge *m = realloc(ml->m, cap * sizeof *m);
        if (!m) return ferry_fail(FERRY_ERR_NOMEM, "%s: no memory for %zu merges", v->label, cap);
        ml->m = m;
        ml->cap = cap;
    }
    ml->m[ml->n++] = (spm_merge){score, left, right};
    return FERRY_OK;
}

/* the splits of piece i into two pieces: hash(p[k:]) = hash(p) - hash(p[:k]) * B^(len - k) */
static ferry_status piece_splits(const gguf_vocab *v, uint32_t i, uint64_t b_inv, merge_list *ml)
{
    gguf_str p = v->tokens[i];
    uint64_t whole = v->index.hash[i], left = 0, pw = hpow(HASH_B, p.len); /* pw = B^(len - k) */
    for (uint64_t k = 1; k < p.len; k++) {
        left = hstep(left, (unsigned char)p.ptr[k - 1]);
        pw = hmul(pw, b_inv);
        if (((unsigned char)p.ptr[k] & 0xC0) == 0x80) continue; /* inside a character */
        int64_t l = index_find(&v->index, left, p.ptr, k, "", 0);
        if (l < 0 || !(v->place[l] & IN_VOCAB)) continue;
        int64_t r = index_find(&v->index, hsub(whole, hmul(left, pw)), p.ptr + k, p.len - k, "", 0);
        if (r < 0 || !(v->place[r] & IN_VOCAB)) continue;
        FERRY_TRY(merge_push(v, ml, token_score(v, i), (uint32_t)l, (uint32_t)r));
    }
    return FERRY_OK;
}

ferry_status gguf_vocab_spm_merges(const gguf_vocab *v, merge_list *ml)
{
    uint64_t b_inv = hpow(HASH_B, HASH_P - 2); /* Fermat: HASH_P is prime */
    memset(ml, 0, sizeof *ml);
    for (uint32_t i = 0; i < v->n_pieces; i++)
        if ((v->place[i] & IN_VOCAB) && token_score(v, i) != 0) /* the extractor skips score 0 */
            FERRY_TRY(piece_splits(v, i, b_inv, ml));
    if (ml->n) qsort(ml->m, ml->n, sizeof *ml->m, merge_order);
    return FERRY_OK;
}
