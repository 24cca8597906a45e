/* SPDX-License-Identifier: MIT */
/*
 * C interface to RocksDB's per-level perf context (rocks_perf.cc): per
 * thread, tb_rocks_perf_begin() turns counting on and zeroes the counters;
 * tb_rocks_perf_collect() adds this thread's counters to *out and turns
 * counting off. Call both from the same thread.
 */
#ifndef KV_BENCH_TIER_ROCKS_PERF_H
#define KV_BENCH_TIER_ROCKS_PERF_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TB_ROCKS_MAX_LEVELS 8

typedef struct tb_rocks_levels {
    uint64_t hits[TB_ROCKS_MAX_LEVELS];         /* point reads answered by the level */
    uint64_t cache_hits[TB_ROCKS_MAX_LEVELS];   /* block-cache hits in its files */
    uint64_t cache_misses[TB_ROCKS_MAX_LEVELS]; /* block reads from its files */
    uint64_t block_read_bytes;                  /* bytes of every block read */
} tb_rocks_levels;

void tb_rocks_perf_begin(void);
void tb_rocks_perf_collect(tb_rocks_levels *out);

#ifdef __cplusplus
}
#endif

#endif
