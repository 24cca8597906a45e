// SPDX-License-Identifier: MIT
//
// The one piece of tier_bench that needs RocksDB's C++ API: its per-level
// perf context (PerfContext::level_to_perf_context), which the C API
// (rocksdb/c.h, 7.8) does not expose. tier_bench counts, per worker thread
// and per LSM level, the point reads a level answered and its block-cache
// hits and misses, to tell reads served by the fast volume's levels from
// reads served by the slow volume's. Plain C linkage, thread-local state
// (RocksDB's perf context is per thread).
#include <rocksdb/perf_context.h>
#include <rocksdb/perf_level.h>

#include <cstdint>

#include "bench/tier/rocks_perf.h"

extern "C" void tb_rocks_perf_begin(void)
{
    rocksdb::SetPerfLevel(rocksdb::PerfLevel::kEnableCount);
    rocksdb::PerfContext *p = rocksdb::get_perf_context();
    p->EnablePerLevelPerfContext();
    p->Reset();
}

extern "C" void tb_rocks_perf_collect(tb_rocks_levels *out)
{
    rocksdb::PerfContext *p = rocksdb::get_perf_context();
    out->block_read_bytes += p->block_read_byte;
    if (p->level_to_perf_context) {
        for (const auto &kv : *p->level_to_perf_context) {
            if (kv.first >= TB_ROCKS_MAX_LEVELS)
                continue;
            out->hits[kv.first] += kv.second.user_key_return_count;
            out->cache_hits[kv.first] += kv.second.block_cache_hit_count;
            out->cache_misses[kv.first] += kv.second.block_cache_miss_count;
        }
    }
    rocksdb::SetPerfLevel(rocksdb::PerfLevel::kDisable);
}
