/*
 * crc32c.h - CRC-32C (Castagnoli), the checksum the offload manifest records
 * for every blob.
 */
#ifndef FERRY_CRC32C_H
#define FERRY_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC-32C continuing from crc (start with 0). Uses SSE4.2 when the build
 * targets it; crc32c_sw is the portable path, always built so that tests can
 * compare the two. */
uint32_t crc32c(uint32_t crc, const void *data, size_t n);
uint32_t crc32c_sw(uint32_t crc, const void *data, size_t n);

#endif
