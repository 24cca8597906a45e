/* SPDX-License-Identifier: MIT */
/*
 * The node's storage engine: the tiers glued together behind point
 * operations with the semantics of the wire contract (DESIGN.md §3, §5):
 * last-writer-wins on the HLC version, TTLs, tombstones, and the conditional
 * writes of kv.Put / kv.Delete (if_version, if_absent).
 *
 * Threads: every function may be called from any thread that was registered
 * with engine_thread_register() (the RPC workers do it in their start hook).
 */
#ifndef KV_NODE_ENGINE_H
#define KV_NODE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/clock.h"
#include "kv/kv_err.h"

typedef struct engine engine;

typedef struct engine_opts {
    size_t mem_mb;          /* memory-tier budget */
    uint64_t index_buckets; /* initial HotRing buckets (0 = from mem_mb) */
} engine_opts;

/* A write. version 0 = the engine assigns one from its HLC (direct writes);
 * otherwise the coordinator's version is applied last-writer-wins. */
typedef struct engine_write {
    const void *key;
    size_t klen;
    const void *val;
    size_t vlen;
    uint64_t version;
    uint64_t ttl_ms;     /* 0 = no expiry */
    uint64_t if_version; /* 0 = unconditional */
    bool if_absent;
    bool is_delete;
} engine_write;

typedef struct engine_result {
    uint64_t version; /* version written (or of the record read) */
    bool found;       /* get: a live record; delete: a live record existed */
    uint8_t *val;     /* get: malloc'ed copy, owned by the caller (free()) */
    size_t vlen;
} engine_result;

typedef struct engine_stats {
    uint64_t items, mem_bytes, mem_limit;
    uint64_t gets, puts, deletes;
    uint64_t index_reads, index_visited, index_head_hits, index_head_moves;
    uint64_t index_sample_rounds, index_rehashes, index_buckets;
} engine_stats;

void engine_thread_register(void);
void engine_thread_unregister(void);

/* Opens the engine. On failure writes a message to err. */
kv_err engine_open(engine **out, const engine_opts *opts, char *err, size_t errlen);
/* Frees everything. No other thread may use the engine. NULL is a no-op. */
void engine_close(engine *e);

/* Reads key. Returns KV_OK with out->found false for a missing, deleted or
 * expired key. On success with found, out->val is owned by the caller. */
kv_err engine_get(engine *e, const void *key, size_t klen, engine_result *out);

/* Applies a put or delete. Returns KV_OK (out->version = the version now
 * governing the key: the write's own, or a newer one that superseded it),
 * ALREADY_EXISTS (if_absent), FAILED_PRECONDITION (if_version mismatch, with
 * a message in err), RESOURCE_EXHAUSTED (memory budget). */
kv_err engine_write_one(engine *e, const engine_write *w, engine_result *out, char *err,
                        size_t errlen);

void engine_get_stats(engine *e, engine_stats *out);
/* "none" until the persistent tiers land; then the WAL sync mode. */
const char *engine_durability(const engine *e);
/* The node's hybrid logical clock (versions for direct writes). */
kv_hlc *engine_hlc(engine *e);

#endif
