/* SPDX-License-Identifier: MIT */
/* CRC32C (Castagnoli), the checksum of every file hotkv writes (WAL frames,
 * SST blocks, hints, KallaxDB blocks, backups). */
#ifndef KV_COMMON_CRC32C_H
#define KV_COMMON_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* The CRC32C of p[0..n) continuing from crc, the value a previous call
 * returned (0 to start): kv_crc32c(kv_crc32c(0, a, n), b, m) is the CRC of a
 * followed by b. */
uint32_t kv_crc32c(uint32_t crc, const void *p, size_t n);

#endif
