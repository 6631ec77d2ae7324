/*
 * tok_util.c - the tokenizer's building blocks: an arena, two hash maps
 * (token strings, and id pairs for merges and trie edges), UTF-8 repair as
 * Rust's from_utf8_lossy does it, the few Unicode classes HF takes from the
 * Rust standard library and the regex crate, and GPT-2's byte <-> character
 * table. See tok_internal.h.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

/* ---- hashing -------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 32;
    return x;
}

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0x100000001b3ull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = mix64(h ^ w) + 0x9e3779b97f4a7c15ull;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    return mix64(h ^ w ^ ((uint64_t)n << 56));
}

static size_t table_size(size_t expected)
{
    size_t cap = 16;
    while (cap < expected * 2 + 2) cap *= 2;
    return cap;
}

/* ---- string map ------------------------------------------------------------- */

bool tok_strmap_init(tok_strmap *m, size_t expected)
{
    size_t cap = table_size(expected);
    m->slots = calloc(cap, sizeof *m->slots);
    m->mask = cap - 1;
    m->count = 0;
    return m->slots != NULL;
}

void tok_strmap_free(tok_strmap *m)
{
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static bool strmap_grow(tok_strmap *m)
{
    size_t cap = (m->mask + 1) * 2;
    tok_strmap_slot *slots = calloc(cap, sizeof *slots);
    if (!slots) return false;
    for (size_t i = 0; i <= m->mask; i++) {
        tok_strmap_slot *s = &m->slots[i];
        if (!s->key) continue;
        size_t j = hash_bytes(s->key, s->len) & (cap - 1);
        while (slots[j].key) j = (j + 1) & (cap - 1);
        slots[j] = *s;
    }
    free(m->slots);
    m->slots = slots;
    m->mask = cap - 1;
    return true;
}

bool tok_strmap_put(tok_strmap *m, const char *key, size_t len, int32_t val)
{
    if ((m->count + 1) * 2 > m->mask + 1 && !strmap_grow(m)) return false;
    size_t i = hash_bytes(key, len) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        tok_strmap_slot *s = &m->slots[i];
        if (!s->key) {
            s->key = key;
            s->len = (uint32_t)len;
            s->val = val;
            m->count++;
            return true;
        }
        if (s->len == len && memcmp(s->key, key, len) == 0) {
            s->val = val;
            return true;
        }
    }
}

int32_t tok_strmap_get(const tok_strmap *m, const char *key, size_t len)
{
    if (!m->slots) return -1;
    size_t i = hash_bytes(key, len) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        const tok_strmap_slot *s = &m->slots[i];
        if (!s->key) return -1;
        if (s->len == len && memcmp(s->key, key, len) == 0) return s->val;
    }
}

/* ---- pair map ----------------------------------------------------------------- */

#define PAIR_EMPTY UINT64_MAX

bool tok_pairmap_init(tok_pairmap *m, size_t expected)
{
    size_t cap = table_size(expected);
    m->slots = malloc(cap * sizeof *m->slots);
    if (!m->slots) return false;
    for (size_t i = 0; i < cap; i++) m->slots[i].key = PAIR_EMPTY;
    m->mask = cap - 1;
    m->count = 0;
    return true;
}

void tok_pairmap_free(tok_pairmap *m)
{
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static bool pairmap_grow(tok_pairmap *m)
{
    size_t cap = (m->mask + 1) * 2;
    tok_pairmap_slot *slots = malloc(cap * sizeof *slots);
    if (!slots) return false;
    for (size_t i = 0; i < cap; i++) slots[i].key = PAIR_EMPTY;
    for (size_t i = 0; i <= m->mask; i++) {
        if (m->slots[i].key == PAIR_EMPTY) continue;
        size_t j = mix64(m->slots[i].key) & (cap - 1);
        while (slots[j].key != PAIR_EMPTY) j = (j + 1) & (cap - 1);
        slots[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = slots;
    m->mask = cap - 1;
    return true;
}

bool tok_pairmap_put(tok_pairmap *m, uint32_t a, uint32_t b, uint32_t rank, int32_t id)
{
    if ((m->count + 1) * 2 > m->mask + 1 && !pairmap_grow(m)) return false;
    uint64_t key = (uint64_t)a << 32 | b;
    size_t i = mix64(key) & m->mask;
    while (m->slots[i].key != PAIR_EMPTY && m->slots[i].key != key) i = (i + 1) & m->mask;
    if (m->slots[i].key == PAIR_EMPTY) m->count++;
    m->slots[i].key = key;
    m->slots[i].rank = rank;
    m->slots[i].id = id;
    return true;
}

const tok_pairmap_slot *tok_pairmap_get(const tok_pairmap *m, uint32_t a, uint32_t b)
{
    if (!m->slots) return NULL;
    uint64_t key = (uint64_t)a << 32 | b;
    size_t i = mix64(key) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        if (m->slots[i].key == key) return &m->slots[i];
        if (m->slots[i].key == PAIR_EMPTY) return NULL;
    }
}

/* ---- UTF-8 -------------------------------------------------------------------- */

/* How many bytes from s (n > 0 left) form a valid prefix of a UTF-8
 * sequence, and whether that prefix is the whole sequence. Unicode's
 * "maximal subpart": the second byte's range depends on the first (no
 * overlong forms, no surrogates, nothing above U+10FFFF). */
static size_t utf8_prefix(const unsigned char *s, size_t n, bool *complete)
{
    unsigned char c = s[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    *complete = false;
    if (c < 0x80) {
        *complete = true;
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return 0; /* cannot start a sequence */
    }
    size_t k = 1;
    if (k < n && s[k] >= lo && s[k] <= hi) {
        k++;
        while (k < need && k < n && s[k] >= 0x80 && s[k] <= 0xBF) k++;
    } else {
        return k < n ? 0 : 1; /* the lead byte alone: a prefix only at the end */
    }
    *complete = k == need;
    return k;
}

size_t tok_utf8_char(const char *s, size_t n, uint32_t *cp)
{
    bool complete;
    size_t k = utf8_prefix((const unsigned char *)s, n, &complete);
    if (!complete) {
        *cp = 0xFFFD;
        return k ? k : 1;
    }
    return tok_utf8_next(s, k, cp);
}

size_t tok_utf8_lossy(const char *s, size_t n, strbuf *out, size_t *hold)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0; /* run: start of valid bytes not yet copied */
    if (hold) *hold = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        bool complete;
        size_t k = utf8_prefix(u + i, n - i, &complete);
        if (complete) {
            i += k;
            continue;
        }
        if (k > 0 && i + k == n && hold) {
            /* a sequence that may still be completed by bytes to come */
            tok_put(out, s + run, i - run);
            *hold = k;
            return i;
        }
        tok_put(out, s + run, i - run);
        tok_put(out, "\xEF\xBF\xBD", 3);
        i += k ? k : 1;
        run = i;
    }
    tok_put(out, s + run, i - run);
    return i;
}

bool tok_utf8_valid(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        bool complete;
        size_t k = utf8_prefix(u + i, n - i, &complete);
        if (!complete) return false;
        i += k;
    }
    return true;
}

/* ---- Unicode classes ---------------------------------------------------------- */

bool tok_is_white_space(uint32_t cp)
{
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
    if (cp < 0x85) return false;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

#include <utf8proc.h>

bool tok_is_regex_word(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
    if (cp == 0x200C || cp == 0x200D) return true; /* Join_Control */
    /* Alphabetic outside the letter and mark categories: the circled letters */
    if ((cp >= 0x24B6 && cp <= 0x24E9) || (cp >= 0x1F130 && cp <= 0x1F149) || (cp >= 0x1F150 && cp <= 0x1F169) ||
        (cp >= 0x1F170 && cp <= 0x1F189))
        return true;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return false;
    }
}

/* ---- GPT-2's byte <-> character table ------------------------------------------ */

/* Printable Latin-1 bytes stand for themselves; the other 68 bytes map, in
 * order, to U+0100.. so that every byte is a visible character. */
const uint16_t tok_byte_char[256] = {
    0x100, 0x101, 0x102, 0x103, 0x104, 0x105, 0x106, 0x107, 0x108, 0x109, 0x10A, 0x10B, 0x10C, 0x10D, 0x10E, 0x10F,
    0x110, 0x111, 0x112, 0x113, 0x114, 0x115, 0x116, 0x117, 0x118, 0x119, 0x11A, 0x11B, 0x11C, 0x11D, 0x11E, 0x11F,
    0x120, 0x21,  0x22,  0x23,  0x24,  0x25,  0x26,  0x27,  0x28,  0x29,  0x2A,  0x2B,  0x2C,  0x2D,  0x2E,  0x2F,
    0x30,  0x31,  0x32,  0x33,  0x34,  0x35,  0x36,  0x37,  0x38,  0x39,  0x3A,  0x3B,  0x3C,  0x3D,  0x3E,  0x3F,
    0x40,  0x41,  0x42,  0x43,  0x44,  0x45,  0x46,  0x47,  0x48,  0x49,  0x4A,  0x4B,  0x4C,  0x4D,  0x4E,  0x4F,
    0x50,  0x51,  0x52,  0x53,  0x54,  0x55,  0x56,  0x57,  0x58,  0x59,  0x5A,  0x5B,  0x5C,  0x5D,  0x5E,  0x5F,
    0x60,  0x61,  0x62,  0x63,  0x64,  0x65,  0x66,  0x67,  0x68,  0x69,  0x6A,  0x6B,  0x6C,  0x6D,  0x6E,  0x6F,
    0x70,  0x71,  0x72,  0x73,  0x74,  0x75,  0x76,  0x77,  0x78,  0x79,  0x7A,  0x7B,  0x7C,  0x7D,  0x7E,  0x121,
    0x122, 0x123, 0x124, 0x125, 0x126, 0x127, 0x128, 0x129, 0x12A, 0x12B, 0x12C, 0x12D, 0x12E, 0x12F, 0x130, 0x131,
    0x132, 0x133, 0x134, 0x135, 0x136, 0x137, 0x138, 0x139, 0x13A, 0x13B, 0x13C, 0x13D, 0x13E, 0x13F, 0x140, 0x141,
    0x142, 0xA1,  0xA2,  0xA3,  0xA4,  0xA5,  0xA6,  0xA7,  0xA8,  0xA9,  0xAA,  0xAB,  0xAC,  0x143, 0xAE,  0xAF,
    0xB0,  0xB1,  0xB2,  0xB3,  0xB4,  0xB5,  0xB6,  0xB7,  0xB8,  0xB9,  0xBA,  0xBB,  0xBC,  0xBD,  0xBE,  0xBF,
    0xC0,  0xC1,  0xC2,  0xC3,  0xC4,  0xC5,  0xC6,  0xC7,  0xC8,  0xC9,  0xCA,  0xCB,  0xCC,  0xCD,  0xCE,  0xCF,
    0xD0,  0xD1,  0xD2,  0xD3,  0xD4,  0xD5,  0xD6,  0xD7,  0xD8,  0xD9,  0xDA,  0xDB,  0xDC,  0xDD,  0xDE,  0xDF,
    0xE0,  0xE1,  0xE2,  0xE3,  0xE4,  0xE5,  0xE6,  0xE7,  0xE8,  0xE9,  0xEA,  0xEB,  0xEC,  0xED,  0xEE,  0xEF,
    0xF0,  0xF1,  0xF2,  0xF3,  0xF4,  0xF5,  0xF6,  0xF7,  0xF8,  0xF9,  0xFA,  0xFB,  0xFC,  0xFD,  0xFE,  0xFF,
};

int tok_char_byte(uint32_t cp)
{
    if (cp >= 0x21 && cp <= 0x7E) return (int)cp;
    if ((cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) return (int)cp;
    if (cp < 0x100 || cp > 0x143) return -1;
    /* the remapped bytes, in increasing byte order */
    static const uint8_t remapped[68] = {
        0,    1,    2,    3,    4,    5,    6,    7,    8,    9,    10,   11,   12,   13,   14,   15,   16,
        17,   18,   19,   20,   21,   22,   23,   24,   25,   26,   27,   28,   29,   30,   31,   32,   127,
        128,  129,  130,  131,  132,  133,  134,  135,  136,  137,  138,  139,  140,  141,  142,  143,  144,
        145,  146,  147,  148,  149,  150,  151,  152,  153,  154,  155,  156,  157,  158,  159,  160,  173,
    };
    return remapped[cp - 0x100];
}
