/* SPDX-License-Identifier: MIT */
/*
 * admin.Stats for kvnode: the names are a stable interface (kvctl status and
 * the tests read them), so add names, never rename them.
 */
#include "common/clock.h"
#include "node/node.h"

void node_collect_stats(node *n, rpc_statlist *l, bool verbose)
{
    engine_stats es;
    engine_get_stats(n->eng, &es);
    rpc_stats_add(l, "uptime_ms", "%llu",
                  (unsigned long long)((kv_now_ns() - n->started_ns) / 1000000ull));
    rpc_stats_add(l, "map_epoch", "%llu", (unsigned long long)cmap_slot_epoch(n->maps));
    rpc_stats_add(l, "durability", "%s", engine_durability(n->eng));
    rpc_stats_add(l, "engine", "%s", engine_name(n->eng)); /* lsm | kallax */
    rpc_stats_add(l, "keys", "%llu", (unsigned long long)es.items);
    rpc_stats_add(l, "mem_bytes", "%llu", (unsigned long long)es.mem_bytes);
    rpc_stats_add(l, "mem_limit_bytes", "%llu", (unsigned long long)es.mem_limit);
    rpc_stats_add(l, "gets", "%llu", (unsigned long long)es.gets);
    rpc_stats_add(l, "puts", "%llu", (unsigned long long)es.puts);
    rpc_stats_add(l, "deletes", "%llu", (unsigned long long)es.deletes);
    rpc_stats_add(l, "dirty_bytes", "%llu", (unsigned long long)es.dirty_bytes);
    rpc_stats_add(l, "hot.pinned", "%zu", node_hot_pinned(n->hot));
    char why[200];
    int serving = node_serving(n, why, sizeof(why));
    static const char *const names[] = {"serving", "catching_up", "needs_repair", "no_map",
                                        "removed"};
    rpc_stats_add(l, "serving", "%s", serving >= 0 && serving < 5 ? names[serving] : "?");
    uint64_t rec_est = 0, bytes_est = 0;
    engine_estimate(n->eng, &rec_est, &bytes_est);
    rpc_stats_add(l, "records_estimate", "%llu", (unsigned long long)rec_est);
    rpc_stats_add(l, "bytes_estimate", "%llu", (unsigned long long)bytes_est);
    node_handoff_stats(n, l);
    node_stream_src_stats(l);
    node_coord_stats(n, l);
    engine_nhc_stats(n->eng, l); /* nhc.* */
    if (!verbose)
        return;
    rpc_stats_add(l, "reads.memory", "%llu", (unsigned long long)es.reads_mem);
    rpc_stats_add(l, "reads.fast", "%llu", (unsigned long long)es.reads_fd);
    rpc_stats_add(l, "reads.slow", "%llu", (unsigned long long)es.reads_sd);
    rpc_stats_add(l, "reads.miss", "%llu", (unsigned long long)es.reads_miss);
    rpc_stats_add(l, "memory.fills", "%llu", (unsigned long long)es.fills);
    rpc_stats_add(l, "memory.evictions", "%llu", (unsigned long long)es.evictions);
    rpc_stats_add(l, "memory.flushes", "%llu", (unsigned long long)es.flushes);
    double reads = es.index_reads ? (double)es.index_reads : 1.0;
    rpc_stats_add(l, "index.buckets", "%llu", (unsigned long long)es.index_buckets);
    rpc_stats_add(l, "index.reads", "%llu", (unsigned long long)es.index_reads);
    rpc_stats_add(l, "index.visited_per_read", "%.3f", (double)es.index_visited / reads);
    rpc_stats_add(l, "index.head_hit", "%.4f", (double)es.index_head_hits / reads);
    rpc_stats_add(l, "index.pinned_reads", "%llu", (unsigned long long)es.index_pinned_reads);
    rpc_stats_add(l, "index.pinned_head_hit", "%.4f",
                  es.index_pinned_reads
                      ? (double)es.index_pinned_head_hits / (double)es.index_pinned_reads
                      : 0.0);
    rpc_stats_add(l, "index.head_moves", "%llu", (unsigned long long)es.index_head_moves);
    rpc_stats_add(l, "index.sample_rounds", "%llu", (unsigned long long)es.index_sample_rounds);
    rpc_stats_add(l, "index.rehashes", "%llu", (unsigned long long)es.index_rehashes);
    /* raw counters behind the ratios above, for deltas over a run */
    rpc_stats_add(l, "index.visited", "%llu", (unsigned long long)es.index_visited);
    rpc_stats_add(l, "index.head_hits", "%llu", (unsigned long long)es.index_head_hits);
    rpc_stats_add(l, "index.pinned_head_hits", "%llu",
                  (unsigned long long)es.index_pinned_head_hits);
    engine_lsm_stats(n->eng, l);
}
