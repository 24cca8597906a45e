// SPDX-License-Identifier: MIT
//
// The one piece of tier_bench that needs RocksDB's C++ API: its perf
// context, which the C API (rocksdb/c.h, 7.8) does not expose. tier_bench
// classifies every timed point read by the level that answered it (the
// per-level user_key_return_count, which RocksDB counts at the file's
// current level) and by whether the read did block I/O (block_read_count:
// index and filter blocks stay in the table readers, so a block read is a
// data block that missed the block cache). The per-level block-cache
// counters are not used: RocksDB files them under the level a table reader
// was opened at (rep_->level), which is -1 or a former level for most files
// written by compactions, so they undercount the slow levels' misses.
// Plain C linkage, thread-local state (the perf context is per thread).
#include <rocksdb/perf_context.h>
#include <rocksdb/perf_level.h>

#include <cstdint>

#include "bench/tier/rocks_perf.h"

extern "C" void tb_rocks_perf_begin(void)
{
    rocksdb::SetPerfLevel(rocksdb::PerfLevel::kEnableCount);
    rocksdb::get_perf_context()->EnablePerLevelPerfContext();
}

// The counters before the read: PerfContext::Reset() leaves the per-level
// counters alone, so a read is told by differences.
static thread_local uint64_t t_returned[TB_ROCKS_MAX_LEVELS], t_reads, t_bytes;

static uint64_t returned(const rocksdb::PerfContext *p, int level)
{
    if (!p->level_to_perf_context)
        return 0;
    auto it = p->level_to_perf_context->find((uint32_t)level);
    return it == p->level_to_perf_context->end() ? 0 : it->second.user_key_return_count;
}

extern "C" void tb_rocks_perf_get_begin(void)
{
    const rocksdb::PerfContext *p = rocksdb::get_perf_context();
    for (int l = 0; l < TB_ROCKS_MAX_LEVELS; l++)
        t_returned[l] = returned(p, l);
    t_reads = p->block_read_count;
    t_bytes = p->block_read_byte;
}

extern "C" void tb_rocks_perf_get_end(tb_rocks_get *out)
{
    const rocksdb::PerfContext *p = rocksdb::get_perf_context();
    out->level = -1;
    out->block_reads = p->block_read_count - t_reads;
    out->block_read_bytes = p->block_read_byte - t_bytes;
    for (int l = 0; l < TB_ROCKS_MAX_LEVELS && out->level < 0; l++)
        if (returned(p, l) != t_returned[l])
            out->level = l;
}

extern "C" void tb_rocks_perf_end(void)
{
    rocksdb::SetPerfLevel(rocksdb::PerfLevel::kDisable);
}
