/* SPDX-License-Identifier: MIT */
/*
 * C interface to RocksDB's perf context (rocks_perf.cc), per thread:
 * tb_rocks_perf_begin() turns counting on; around each point read,
 * tb_rocks_perf_get_begin() notes the counters and tb_rocks_perf_get_end()
 * says which level answered it and how many blocks it read from files;
 * tb_rocks_perf_end() turns counting off. Call them from the reading thread.
 */
#ifndef KV_BENCH_TIER_ROCKS_PERF_H
#define KV_BENCH_TIER_ROCKS_PERF_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TB_ROCKS_MAX_LEVELS 8

typedef struct tb_rocks_get {
    int level;                 /* level of the file that answered, -1 = none (memtable, miss) */
    uint64_t block_reads;      /* data blocks read from files (block-cache misses) */
    uint64_t block_read_bytes; /* their bytes */
} tb_rocks_get;

void tb_rocks_perf_begin(void);
void tb_rocks_perf_get_begin(void);
void tb_rocks_perf_get_end(tb_rocks_get *out);
void tb_rocks_perf_end(void);

#ifdef __cplusplus
}
#endif

#endif
