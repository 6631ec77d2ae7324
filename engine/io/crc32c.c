/*
 * crc32c.c - CRC-32C (Castagnoli), the checksum of the offload dir's blobs:
 * slicing-by-8 in portable C, and the SSE4.2 instruction where the build
 * targets it. See crc32c.h.
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
uint32_t crc32c(uint32_t crc, const void *data, size_t n)
{
    const uint8_t *p = data;
    uint64_t c = ~crc;
    while (n > 0 && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
    }
    while (n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
#else
uint32_t crc32c(uint32_t crc, const void *data, size_t n) { return crc32c_sw(crc, data, n); }
#endif
