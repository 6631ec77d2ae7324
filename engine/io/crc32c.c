/*
 * crc32c.c - CRC-32C (Castagnoli), the checksum of the offload dir's blobs:
 * slicing-by-8 in portable C, and the SSE4.2 instruction where the build
 * targets it. See crc32c.h.
 *
 * The instruction has a latency of three cycles and a throughput of one, so
 * one chain of it runs at a third of what the core can do (measured: ~8
 * GB/s, 72 ms of a 224 ms MoE decode step spent checking the 576 MiB of
 * experts it read). Three independent chains over three adjacent blocks,
 * joined by shifting a block's CRC over the length of the next with the
 * "zeros" operator (GF(2) matrix powers, as zlib's crc32_combine; tables
 * made once), run at the instruction's throughput.
 */
#include "crc32c.h"

#include <pthread.h>
#include <string.h>

#ifdef __SSE4_2__
#include <nmmintrin.h>
#endif

/* Slicing-by-8 tables for the reflected Castagnoli polynomial: g_crc[0] is
 * the classic byte table, g_crc[k] advances a byte that is k bytes further
 * from the end of the 8-byte word. */
static uint32_t g_crc[8][256];
static pthread_once_t g_crc_once = PTHREAD_ONCE_INIT;

static void crc_tables_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        g_crc[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int s = 1; s < 8; s++) g_crc[s][i] = (g_crc[s - 1][i] >> 8) ^ g_crc[0][g_crc[s - 1][i] & 0xff];
}

uint32_t crc32c_sw(uint32_t crc, const void *data, size_t n)
{
    pthread_once(&g_crc_once, crc_tables_init);
    const uint8_t *p = data;
    uint32_t c = ~crc;
    /* Bytes are assembled explicitly, so this is right on any endianness
     * and alignment. */
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        c = g_crc[7][lo & 0xff] ^ g_crc[6][(lo >> 8) & 0xff] ^ g_crc[5][(lo >> 16) & 0xff] ^ g_crc[4][lo >> 24] ^
            g_crc[3][hi & 0xff] ^ g_crc[2][(hi >> 8) & 0xff] ^ g_crc[1][(hi >> 16) & 0xff] ^ g_crc[0][hi >> 24];
    }
    while (n--) c = (c >> 8) ^ g_crc[0][(c ^ *p++) & 0xff];
    return ~c;
}

#ifdef __SSE4_2__
#define LONG_BLOCK 8192u /* powers of two: the zeros operator below squares its way there */
#define SHORT_BLOCK 256u

/* shift_long[k][b]: byte b at position k of a CRC, moved over LONG_BLOCK
 * zero bytes; shift_short likewise over SHORT_BLOCK. */
static uint32_t g_shift_long[4][256], g_shift_short[4][256];
static pthread_once_t g_shift_once = PTHREAD_ONCE_INIT;

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;
    for (; vec; vec >>= 1, mat++)
        if (vec & 1) sum ^= *mat;
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat)
{
    for (int n = 0; n < 32; n++) square[n] = gf2_times(mat, mat[n]);
}

/* The operator that appends `len` zero bytes (a power of two) to a CRC. */
static void zeros_operator(uint32_t *even, size_t len)
{
    uint32_t odd[32], row = 1;
    odd[0] = 0x82F63B78u; /* one zero bit */
    for (int n = 1; n < 32; n++, row <<= 1) odd[n] = row;
    gf2_square(even, odd); /* two zero bits */
    gf2_square(odd, even); /* four */
    do {                   /* eight (a byte), then doubling: len is a power of two */
        gf2_square(even, odd);
        len >>= 1;
        if (len == 0) return;
        gf2_square(odd, even);
        len >>= 1;
    } while (len);
    memcpy(even, odd, sizeof odd);
}

static void shift_table(uint32_t table[4][256], size_t len)
{
    uint32_t op[32];
    zeros_operator(op, len);
    for (uint32_t n = 0; n < 256; n++)
        for (int k = 0; k < 4; k++) table[k][n] = gf2_times(op, n << (8 * k));
}

static void shift_tables_init(void)
{
    shift_table(g_shift_long, LONG_BLOCK);
    shift_table(g_shift_short, SHORT_BLOCK);
}

static inline uint32_t shift(uint32_t table[4][256], uint32_t c)
{
    return table[0][c & 0xff] ^ table[1][(c >> 8) & 0xff] ^ table[2][(c >> 16) & 0xff] ^ table[3][c >> 24];
}

static inline uint64_t load64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Three chains over blocks [p, p+block), [p+block, ..), [p+2 block, ..):
 * crc0 continues the running CRC, the others start at 0 and are joined. */
static inline uint64_t three_way(uint64_t c0, const uint8_t *p, size_t block, uint32_t table[4][256])
{
    uint64_t c1 = 0, c2 = 0;
    for (const uint8_t *end = p + block; p < end; p += 8) {
        c0 = _mm_crc32_u64(c0, load64(p));
        c1 = _mm_crc32_u64(c1, load64(p + block));
        c2 = _mm_crc32_u64(c2, load64(p + 2 * block));
    }
    c0 = shift(table, (uint32_t)c0) ^ c1;
    return shift(table, (uint32_t)c0) ^ c2;
}

uint32_t crc32c(uint32_t crc, const void *data, size_t n)
{
    pthread_once(&g_shift_once, shift_tables_init);
    const uint8_t *p = data;
    uint64_t c = ~crc;
    while (n > 0 && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    for (; n >= 3 * LONG_BLOCK; n -= 3 * LONG_BLOCK, p += 3 * LONG_BLOCK) c = three_way(c, p, LONG_BLOCK, g_shift_long);
    for (; n >= 3 * SHORT_BLOCK; n -= 3 * SHORT_BLOCK, p += 3 * SHORT_BLOCK)
        c = three_way(c, p, SHORT_BLOCK, g_shift_short);
    for (; n >= 8; n -= 8, p += 8) c = _mm_crc32_u64(c, load64(p));
    while (n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
#else
uint32_t crc32c(uint32_t crc, const void *data, size_t n) { return crc32c_sw(crc, data, n); }
#endif
