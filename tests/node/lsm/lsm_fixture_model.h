/* SPDX-License-Identifier: MIT */
/*
 * The contents of tests/node/lsm/fixtures/sst_v1 and sst_v2: LSM directory
 * pairs (fast/, slow/) written by fixtures/gen_sst_v1.c with the code before
 * SST format version 2 (block compression) and before version 3 (compact
 * records), and read back by lsm_compat_test.c.
 * Both include this model, so the test knows every key's newest record.
 *
 * FX_KEYS keys "fx%05d", written in phases; a later phase wins:
 *   gen 1: every key, three flushes, compacted down to L3 (the slow volume)
 *   gen 2: keys i % 3 == 0, flushed and compacted to L2 (fast)
 *   gen 3: keys i % 4 == 1, flushed and compacted to L1 (fast)
 *   gen 4: keys i % 5 == 2 rewritten and keys i % 10 == 0 deleted, one flush
 *          left in L0
 *   gen 5: keys i % 7 == 3, appended to the WAL only (replayed at open)
 * with fast_mb 1 (L1 87381 B and L2 873810 B on FD, L3 on SD).
 */
#ifndef KV_TESTS_LSM_FIXTURE_MODEL_H
#define KV_TESTS_LSM_FIXTURE_MODEL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define FX_KEYS 1200
#define FX_FAST_MB 1

static inline int fx_key(char *buf, int i)
{
    return sprintf(buf, "fx%05d", i);
}

/* Value of key i written by gen (text that compresses, with varied lengths). */
static inline size_t fx_value(uint8_t *buf, int i, int gen)
{
    size_t len = 1 + (size_t)((i * 53 + gen * 17) % 300), n = 0;
    while (n < len) {
        char piece[48];
        int m = snprintf(piece, sizeof(piece), "value-%d-gen-%d-%zu;", i, gen, n / 64);
        for (int j = 0; j < m && n < len; j++)
            buf[n++] = (uint8_t)piece[j];
    }
    return len;
}

static inline uint64_t fx_version(int i, int gen)
{
    return (uint64_t)gen * 1000000u + (uint64_t)i;
}

/* Whether phase gen writes key i, and whether as a delete. */
static inline bool fx_writes(int i, int gen, bool *del)
{
    *del = false;
    switch (gen) {
    case 1:
        return true;
    case 2:
        return i % 3 == 0;
    case 3:
        return i % 4 == 1;
    case 4:
        *del = i % 10 == 0;
        return i % 5 == 2 || i % 10 == 0;
    case 5:
        return i % 7 == 3;
    }
    return false;
}

/* The generation of key i's newest record and whether it is a tombstone. */
static inline int fx_newest(int i, bool *del)
{
    for (int gen = 5; gen >= 1; gen--)
        if (fx_writes(i, gen, del))
            return gen;
    return 0;
}

#endif
