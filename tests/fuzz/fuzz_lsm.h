/* SPDX-License-Identifier: MIT */
/*
 * On-disk framing for the LSM harnesses (fuzz_wal, fuzz_sst, fuzz_manifest,
 * fuzz_ralt). Random bytes almost never carry a valid CRC32C, so a harness
 * that only wrote the fuzzer's bytes would test the checksum test and little
 * else; these helpers let it choose to frame or re-checksum what the fuzzer
 * wrote, so the decoders behind the checksums see arbitrary contents too.
 * The formats are those of node/lsm (lsm_int.h, wal.c, manifest.c, sst.c).
 */
#ifndef KV_TESTS_FUZZ_LSM_H
#define KV_TESTS_FUZZ_LSM_H

#include <stddef.h>
#include <stdint.h>

#include "node/lsm/lsm_int.h"

/* Appends a WAL frame [crc32c(len || payload)][len][payload] to b; compact
 * sets len's top bit (the payload holds compact records). */
void fz_wal_frame(lsm_buf *b, const void *payload, size_t len, bool compact);
/* Appends a MANIFEST frame [crc][len][crc(len)][payload] to b. */
void fz_man_frame(lsm_buf *b, const void *payload, size_t len);
/* Makes the checksums of an SST image right where its footer, index and
 * block table let it find them: the footer's magic (the one of the format
 * version the footer names, version 1's for an unknown one) and CRC, then the index
 * and bloom CRCs, then every data block's CRC the index names (when inside
 * the image). Leaves everything else as it is. */
void fz_sst_fix(uint8_t *img, size_t len);

#endif
