/* SPDX-License-Identifier: MIT */
/* Engine internals shared by engine.c (point operations) and engine_bg.c
 * (flush, eviction, admission sketch, stats). */
#ifndef KV_NODE_ENGINE_INT_H
#define KV_NODE_ENGINE_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "common/ticker.h"
#include "node/engine.h"
#include "node/index/hotring.h"
#include "node/lsm/lsm.h"

#define ENGINE_STRIPES 1024
#define ENGINE_ITEM_OVERHEAD 64u /* per-item bytes beyond key and value, for the budget */
#define ENGINE_SKETCH_SIZE (1u << 20)
#define ENGINE_MAX_PINS 4096u

/* The persistent store below the memory tier (engine_store.c): a table of
 * functions over an opaque handle, one for the LSM and one for kallax,
 * with the LSM's semantics (lsm.h) unless a comment says otherwise. */
typedef struct engine_store {
    const char *name; /* "lsm", "kallax" */
    /* Opens e->db in e->o.fast_dir (and slow_dir), replaying the WAL
     * through fn; err gets a message on failure. */
    kv_err (*open)(engine *e, lsm_replay_fn fn, char *err, size_t errlen);
    void (*close)(void *db);
    uint64_t (*last_seqno)(void *db);
    kv_err (*wal_append)(void *db, const lsm_rec *recs, size_t n);
    /* recs sorted by lsm_key_cmp (the LSM needs it; kallax takes any order) */
    kv_err (*flush)(void *db, const lsm_rec *recs, size_t n, uint64_t max_seqno);
    uint64_t (*flush_generation)(void *db);
    kv_err (*get)(void *db, const void *key, size_t klen, lsm_rec *out, lsm_tier *served);
    kv_err (*multiget)(void *db, size_t n, const void *const *keys, const size_t *klens,
                       lsm_rec *outs, lsm_tier *tiers, kv_err *errs);
    /* The writer's check before a write: the key's newest record, metadata
     * only (key and value NULL: nothing to free), not counted as a read
     * (lsm_get_meta). */
    kv_err (*get_meta)(void *db, const void *key, size_t klen, lsm_rec *out);
    /* At least the highest version of any record the store holds, outside
     * its WAL (lsm_max_version, kallax_max_version); UINT64_MAX when unknown
     * (then every write looks its key up). */
    uint64_t (*max_version)(void *db);
    /* A memory-tier hit, for HotRAP's tracker (a no-op for kallax). */
    void (*note_access)(void *db, const void *key, size_t klen, size_t vlen);
    /* The same on a thread that must not block: false, with nothing done,
     * when it would have to (lsm_note_access_nb). */
    bool (*note_access_nb)(void *db, const void *key, size_t klen, size_t vlen);
    /* The iteration order is (order(key), lsm_key_cmp): 0 for the LSM (key
     * order), the home block for kallax (kallax_key_cmp). */
    uint64_t (*order)(const void *db, const void *key, size_t klen);
    kv_err (*iter_open)(void *db, void **it);
    kv_err (*iter_seek)(void *it, const void *after, size_t after_len);
    kv_err (*iter_next)(void *it);
    const lsm_rec *(*iter_rec)(const void *it);
    void (*iter_close)(void *it);
    /* Removes every record whose key keep rejects (lsm_compact_all_filter,
     * kallax_cleanup). */
    kv_err (*cleanup)(void *db, lsm_keep_fn keep, void *arg, uint64_t *dropped);
    kv_err (*wal_sync)(void *db);
    uint64_t (*wal_bytes)(void *db); /* the WAL's live bytes (lsm_wal_live_bytes) */
    void (*estimate)(void *db, uint64_t *records, uint64_t *bytes);
    size_t max_key;
} engine_store;

extern const engine_store engine_store_lsm, engine_store_kallax;

struct engine {
    hr_index *idx;
    const engine_store *st;
    void *db; /* lsm_db or kallax, per st */
    engine_opts o;
    kv_hlc hlc;
    uint64_t mem_limit, write_buffer;
    uint64_t wal_limit;           /* engine_opts.wal_max_mb in bytes */
    _Atomic uint64_t wal_flushes; /* flushes the WAL's size set off */
    _Atomic uint64_t mem_bytes, dirty_bytes, dirty_items, next_seqno;
    /* Writers of one key are serialised by its stripe, so the condition
     * check, the WAL append and the memory-tier update act as one step. */
    pthread_mutex_t stripes[ENGINE_STRIPES];
    /* Held shared by writers from seqno assignment until their record is in
     * the memory tier; a flush takes it exclusively for an instant to pick a
     * seqno below which every write is visible in memory. */
    pthread_rwlock_t apply_lock;
    pthread_t bg;
    bool bg_started;
    pthread_mutex_t bg_mu; /* protects stop, flush_req, flush_done; pairs with the cvs */
    pthread_cond_t bg_cv, done_cv;
    bool stop;
    uint64_t flush_req, flush_done;
    kv_err flush_err;
    _Atomic uint8_t *sketch; /* admission: saturating per-slot counters */
    _Atomic uint64_t sketch_adds;
    _Atomic uint64_t gets, puts, deletes, reads_mem, reads_fd, reads_sd, reads_miss;
    /* At least the highest version of any record in memory or in the store
     * (UINT64_MAX when the store cannot tell): raised under the key's stripe
     * before a write's stripe is released, so a writer of key k holding k's
     * stripe sees every version k was ever written with below it. A plain
     * put whose version is above it cannot lose to a record already stored
     * (last-writer-wins), so it is applied without looking the key up
     * (blind_puts counts those). */
    _Atomic uint64_t max_version, blind_puts;
    /* tracker samples drawn by engine_get_mem and owed by engine_get (the
     * read deferred to a thread that may block takes one) */
    _Atomic uint64_t samples_owed;
    _Atomic uint64_t fills, evictions, flushes, write_waits, write_wait_ns;
    /* Pinned keys, by 64-bit hash (open addressing, 0 = empty, 1 = removed).
     * Read on every write (to keep HR_F_PINNED), changed by hot-key hints. */
    pthread_rwlock_t pin_lock;
    uint64_t pins[ENGINE_MAX_PINS * 2];
    _Atomic uint64_t npins;
    /* NHC (engine_nhc.c): NULL without a slow volume or HotRAP. */
    nhc *nhc;
    kv_ticker *nhc_ticker; /* calls nhc_tick every NHC_TICK_NS; NULL when none */
};

/* The engine's LSM, NULL over kallax (tests and benchmarks that drive
 * the LSM's compactions directly). */
static inline lsm_db *engine_lsm(engine *e)
{
    return e->st == &engine_store_lsm ? (lsm_db *)e->db : NULL;
}
uint64_t engine_rec_bytes(size_t klen, size_t vlen);

/* A flush's cut: when recs[0, n) (dirty records, unique seqnos and keys)
 * hold more than limit bytes, sorts them by seqno and returns k, the length
 * of an oldest prefix, and sets *max_seqno to its last seqno (every record
 * <= it is in the prefix); else returns n and leaves recs and *max_seqno
 * alone. The prefix is the longest one of at least 3/4 of limit bytes whose
 * keys all sort below the records left behind and that leaves at least
 * limit / 8 bytes behind; failing that, the longest such one without the
 * margin; both no longer than the shortest prefix of limit bytes, which is
 * the cut when neither exists. Keys appended by several writers (ids from
 * one counter) reach the memory tier a little out of order; a cut inside
 * such a run would leave the next flush overlapping this one, and an L0
 * file that overlaps L1 is merged there instead of moved. The margin is
 * for writers that drew a key before the cut and take their seqno after
 * it. Any thread. */
size_t engine_flush_cut(lsm_rec *recs, size_t n, uint64_t limit, uint64_t *max_seqno);
/* Refuses (FAILED_PRECONDITION, err names both kinds) a fast_dir that holds
 * the other kind of store, and a new kallax store without its size. */
kv_err engine_store_check(const engine_opts *o, char *err, size_t errlen);
/* The engine's wall clock (engine_opts.clock), milliseconds. */
static inline uint64_t engine_now_ms(const engine *e)
{
    return kv_clock_ms(e->o.clock, e->o.clock_arg);
}
/* Counts a read of key from an SST; true when it should enter memory. */
bool engine_admit(engine *e, const void *key, size_t klen);
/* Counts a memory-tier hit of key in the sketch (called at a sampled rate),
 * so that eviction (least frequently used by the sketch) keeps it. */
void engine_touch(engine *e, const void *key, size_t klen);
/* HotRAP's promotion checker hooks (lsm_opts.newer / newer_thread, see
 * engine.c): the memory-tier check, and the checker thread's liburcu
 * registration. */
bool engine_mem_newer(void *arg, const void *key, size_t klen, uint64_t seqno);
void engine_promo_thread(void *arg, bool begin);
/* Starts / stops the background flush + eviction thread. */
kv_err engine_bg_start(engine *e);
void engine_bg_stop(engine *e);
/* Wakes the background thread (dirty bytes or memory over their marks). */
void engine_bg_kick(engine *e);
/* Asks the background thread for a flush without waiting for it (a WAL
 * append failed: a flush persists the memory tier's records in an SST,
 * which is what a WAL refusing writes after a failed fsync waits for). */
void engine_bg_request_flush(engine *e);
/* NHC (engine_nhc.c). create: before lsm_open, sets lo->nhc (no-op without
 * a slow_dir or with HotRAP off); err gets a message on failure. start/stop:
 * the 10 ms tick thread (stop is a no-op when not started). destroy: after
 * lsm_close. admit_sd: false while data_admit is off, i.e. records read
 * from SD must not be filled into the memory tier. */
kv_err engine_nhc_create(engine *e, lsm_opts *lo, char *err, size_t errlen);
kv_err engine_nhc_start(engine *e);
void engine_nhc_stop(engine *e);
void engine_nhc_destroy(engine *e);
bool engine_nhc_admit_sd(engine *e);
/* True when the WAL's size calls for a flush of every dirty record
 * (engine_bg.c). */
bool engine_wal_due(engine *e);
/* True while writers must wait for a flush: the dirty bytes at twice the
 * write buffer, or the WAL at wal_limit. */
bool engine_full(engine *e);
/* Blocks (bounded) while engine_full. Returns RESOURCE_EXHAUSTED when the
 * flush stays behind. */
kv_err engine_wait_room(engine *e);

#endif
