/* SPDX-License-Identifier: MIT */
/*
 * The persistent stores below the engine's memory tier, behind one table of
 * functions (engine_int.h, engine_store): the LSM (node/lsm, the default,
 * with HotRAP and NHC over a fast and a slow volume) and kallax
 * (node/kallax, the table-less hash store on one volume). Both take the
 * LSM's record type and WAL, so everything above the table (the write path,
 * the flush, fills, pins, the iterator, the cleanup) is shared. The kind of
 * a store is fixed when its directory is created: the LSM's has a CURRENT
 * file, kallax's a META file, and opening one kind as the other is refused
 * before anything is written (engine_store_check).
 */
#include <stdio.h>
#include <sys/stat.h>

#include "node/engine_int.h"
#include "node/kallax/kallax.h"

/* The engine's sync and WAL-recovery modes as the stores' (both take the
 * LSM's: kallax reuses its WAL). */
static lsm_sync store_sync(engine_sync s)
{
    return s == ENGINE_SYNC_ALWAYS  ? LSM_SYNC_ALWAYS
           : s == ENGINE_SYNC_BATCH ? LSM_SYNC_BATCH
                                    : LSM_SYNC_NONE;
}

static lsm_wal_recovery store_wal_recovery(engine_wal_recovery r)
{
    return r == ENGINE_WAL_POINT_IN_TIME ? LSM_WAL_POINT_IN_TIME : LSM_WAL_ABSOLUTE;
}

/* ---- the LSM ---- */

static kv_err lsm_store_open(engine *e, lsm_replay_fn fn, char *err, size_t errlen)
{
    lsm_opts lo;
    lsm_opts_default(&lo);
    lo.fast_dir = e->o.fast_dir;
    lo.slow_dir = e->o.slow_dir;
    lo.fast_mb = e->o.fast_mb ? e->o.fast_mb : 1024;
    lo.fd_stop_pct = e->o.fast_stop_pct;
    lo.wal_max_bytes = e->wal_limit;
    lo.sync = store_sync(e->o.sync);
    lo.sync_ms = e->o.sync_ms ? e->o.sync_ms : 5;
    lo.disable_io_uring = e->o.disable_io_uring;
    lo.hotrap = !e->o.no_hotrap;
    lo.no_promo_gate = e->o.no_promo_gate;
    char cerr[256];
    if (lsm_compression_parse(e->o.compression, &lo.compression, cerr, sizeof(cerr)) != KV_OK) {
        snprintf(err, errlen, "--compression: %s", cerr);
        return KV_INVALID_ARGUMENT;
    }
    lo.newer = engine_mem_newer;
    lo.newer_thread = engine_promo_thread;
    lo.newer_arg = e;
    lo.tombstone_grace_ms = e->o.tombstone_grace_ms;
    lo.wal_recovery = store_wal_recovery(e->o.wal_recovery);
    lo.clock = e->o.clock;
    lo.clock_arg = e->o.clock_arg;
    kv_err rv = engine_nhc_create(e, &lo, err, errlen); /* NHC */
    if (rv != KV_OK)
        return rv;
    lsm_db *db = NULL;
    if ((rv = lsm_open(&db, &lo, fn, e)) != KV_OK) {
        snprintf(err, errlen, "cannot open the LSM in %s%s%s: %s (see the log for the file)",
                 e->o.fast_dir, e->o.slow_dir ? " / " : "", e->o.slow_dir ? e->o.slow_dir : "",
                 kv_err_name(rv));
        return rv;
    }
    e->db = db;
    return KV_OK;
}

static void lsm_store_close(void *db)
{
    lsm_close(db);
}

static uint64_t lsm_store_last_seqno(void *db)
{
    return lsm_last_seqno(db);
}

static uint64_t lsm_store_max_version(void *db)
{
    return lsm_max_version(db);
}

static kv_err lsm_store_wal_append(void *db, const lsm_rec *recs, size_t n)
{
    return lsm_wal_append(db, recs, n);
}

static kv_err lsm_store_flush(void *db, const lsm_rec *recs, size_t n, uint64_t max_seqno)
{
    return lsm_flush(db, recs, n, max_seqno);
}

static uint64_t lsm_store_flush_gen(void *db)
{
    return lsm_flush_generation(db);
}

static kv_err lsm_store_get(void *db, const void *key, size_t klen, lsm_rec *out, lsm_tier *served)
{
    return lsm_get(db, key, klen, out, served);
}

static kv_err lsm_store_get_meta(void *db, const void *key, size_t klen, lsm_rec *out)
{
    return lsm_get_meta(db, key, klen, out);
}

static kv_err lsm_store_multiget(void *db, size_t n, const void *const *keys, const size_t *klens,
                                 lsm_rec *outs, lsm_tier *tiers, kv_err *errs)
{
    return lsm_multiget(db, n, keys, klens, outs, tiers, errs);
}

static void lsm_store_note_access(void *db, const void *key, size_t klen, size_t vlen)
{
    lsm_note_access(db, key, klen, vlen);
}

static bool lsm_store_note_access_nb(void *db, const void *key, size_t klen, size_t vlen)
{
    return lsm_note_access_nb(db, key, klen, vlen);
}

static uint64_t lsm_store_order(const void *db, const void *key, size_t klen)
{
    (void)db, (void)key, (void)klen;
    return 0; /* plain key order */
}

static kv_err lsm_store_iter_open(void *db, void **it)
{
    lsm_iter *li = NULL;
    kv_err rv = lsm_iter_open(db, &li);
    if (rv == KV_OK)
        *it = li;
    return rv;
}

static kv_err lsm_store_iter_seek(void *it, const void *after, size_t after_len)
{
    return lsm_iter_seek(it, after, after_len);
}

static kv_err lsm_store_iter_next(void *it)
{
    return lsm_iter_next(it);
}

static const lsm_rec *lsm_store_iter_rec(const void *it)
{
    return lsm_iter_rec(it);
}

static void lsm_store_iter_close(void *it)
{
    lsm_iter_close(it);
}

static kv_err lsm_store_cleanup(void *db, lsm_keep_fn keep, void *arg, uint64_t *dropped)
{
    return lsm_compact_all_filter(db, keep, arg, dropped);
}

static kv_err lsm_store_wal_sync(void *db)
{
    return lsm_wal_sync(db);
}

static uint64_t lsm_store_wal_bytes(void *db)
{
    return lsm_wal_live_bytes(db);
}

static void lsm_store_estimate(void *db, uint64_t *records, uint64_t *bytes)
{
    lsm_estimate(db, records, bytes);
}

const engine_store engine_store_lsm = {
    .name = "lsm",
    .open = lsm_store_open,
    .close = lsm_store_close,
    .last_seqno = lsm_store_last_seqno,
    .wal_append = lsm_store_wal_append,
    .max_version = lsm_store_max_version,
    .flush = lsm_store_flush,
    .flush_generation = lsm_store_flush_gen,
    .get = lsm_store_get,
    .get_meta = lsm_store_get_meta,
    .multiget = lsm_store_multiget,
    .note_access = lsm_store_note_access,
    .note_access_nb = lsm_store_note_access_nb,
    .order = lsm_store_order,
    .iter_open = lsm_store_iter_open,
    .iter_seek = lsm_store_iter_seek,
    .iter_next = lsm_store_iter_next,
    .iter_rec = lsm_store_iter_rec,
    .iter_close = lsm_store_iter_close,
    .cleanup = lsm_store_cleanup,
    .wal_sync = lsm_store_wal_sync,
    .wal_bytes = lsm_store_wal_bytes,
    .estimate = lsm_store_estimate,
    .max_key = HR_MAX_KEY_BYTES,
};

/* ---- kallax ---- */

static kv_err kx_store_open(engine *e, lsm_replay_fn fn, char *err, size_t errlen)
{
    kallax_opts ko;
    kallax_opts_default(&ko);
    ko.dir = e->o.fast_dir;
    ko.blocks = e->o.kallax_blocks;
    ko.sync = store_sync(e->o.sync);
    ko.sync_ms = e->o.sync_ms ? e->o.sync_ms : 5;
    ko.disable_io_uring = e->o.disable_io_uring;
    ko.tombstone_grace_ms = e->o.tombstone_grace_ms;
    ko.wal_recovery = store_wal_recovery(e->o.wal_recovery);
    ko.clock = e->o.clock;
    ko.clock_arg = e->o.clock_arg;
    kallax *kx = NULL;
    kv_err rv = kallax_open(&kx, &ko, fn, e);
    if (rv != KV_OK) {
        snprintf(err, errlen, "cannot open the kallax store in %s: %s (%s; see the log)",
                 e->o.fast_dir, kv_err_name(rv),
                 rv == KV_INVALID_ARGUMENT ? "its size differs from --kallax-blocks/--kallax-gb"
                                           : "the log names the file");
        return rv;
    }
    e->db = kx;
    return KV_OK;
}

static void kx_store_close(void *db)
{
    kallax_close(db);
}

static uint64_t kx_store_last_seqno(void *db)
{
    return kallax_last_seqno(db);
}

static uint64_t kx_store_max_version(void *db)
{
    return kallax_max_version(db);
}

static kv_err kx_store_wal_append(void *db, const lsm_rec *recs, size_t n)
{
    return kallax_wal_append(db, recs, n);
}

static kv_err kx_store_flush(void *db, const lsm_rec *recs, size_t n, uint64_t max_seqno)
{
    return kallax_flush(db, recs, n, max_seqno);
}

static uint64_t kx_store_flush_gen(void *db)
{
    return kallax_flush_generation(db);
}

/* One volume: every stored record is served from the fast one. */
static kv_err kx_store_get(void *db, const void *key, size_t klen, lsm_rec *out, lsm_tier *served)
{
    kv_err rv = kallax_get(db, key, klen, out);
    if (rv == KV_OK && served)
        *served = LSM_TIER_FD;
    return rv;
}

/* kallax has no read tracking: its get, without the key and value. */
static kv_err kx_store_get_meta(void *db, const void *key, size_t klen, lsm_rec *out)
{
    kv_err rv = kallax_get(db, key, klen, out);
    if (rv == KV_OK) {
        size_t vlen = out->vlen;
        lsm_rec_free(out);
        out->vlen = vlen;
    }
    return rv;
}

static kv_err kx_store_multiget(void *db, size_t n, const void *const *keys, const size_t *klens,
                                lsm_rec *outs, lsm_tier *tiers, kv_err *errs)
{
    kv_err rv = kallax_multiget(db, n, keys, klens, outs, errs);
    for (size_t i = 0; rv == KV_OK && i < n; i++)
        tiers[i] = errs[i] == KV_OK ? LSM_TIER_FD : LSM_TIER_NONE;
    return rv;
}

static void kx_store_note_access(void *db, const void *key, size_t klen, size_t vlen)
{
    (void)db, (void)key, (void)klen, (void)vlen; /* no HotRAP tracker */
}

static bool kx_store_note_access_nb(void *db, const void *key, size_t klen, size_t vlen)
{
    kx_store_note_access(db, key, klen, vlen);
    return true;
}

static uint64_t kx_store_order(const void *db, const void *key, size_t klen)
{
    return kallax_home(db, key, klen);
}

static kv_err kx_store_iter_open(void *db, void **it)
{
    kallax_iter *ki = NULL;
    kv_err rv = kallax_iter_open(db, &ki);
    if (rv == KV_OK)
        *it = ki;
    return rv;
}

static kv_err kx_store_iter_seek(void *it, const void *after, size_t after_len)
{
    return kallax_iter_seek(it, after, after_len);
}

static kv_err kx_store_iter_next(void *it)
{
    return kallax_iter_next(it);
}

static const lsm_rec *kx_store_iter_rec(const void *it)
{
    return kallax_iter_rec(it);
}

static void kx_store_iter_close(void *it)
{
    kallax_iter_close(it);
}

static kv_err kx_store_cleanup(void *db, lsm_keep_fn keep, void *arg, uint64_t *dropped)
{
    return kallax_cleanup(db, keep, arg, dropped);
}

static kv_err kx_store_wal_sync(void *db)
{
    return kallax_wal_sync(db);
}

static uint64_t kx_store_wal_bytes(void *db)
{
    return kallax_wal_live_bytes(db);
}

static void kx_store_estimate(void *db, uint64_t *records, uint64_t *bytes)
{
    kallax_estimate(db, records, bytes);
}

const engine_store engine_store_kallax = {
    .name = "kallax",
    .open = kx_store_open,
    .close = kx_store_close,
    .last_seqno = kx_store_last_seqno,
    .wal_append = kx_store_wal_append,
    .max_version = kx_store_max_version,
    .flush = kx_store_flush,
    .flush_generation = kx_store_flush_gen,
    .get = kx_store_get,
    .get_meta = kx_store_get_meta,
    .multiget = kx_store_multiget,
    .note_access = kx_store_note_access,
    .note_access_nb = kx_store_note_access_nb,
    .order = kx_store_order,
    .iter_open = kx_store_iter_open,
    .iter_seek = kx_store_iter_seek,
    .iter_next = kx_store_iter_next,
    .iter_rec = kx_store_iter_rec,
    .iter_close = kx_store_iter_close,
    .cleanup = kx_store_cleanup,
    .wal_sync = kx_store_wal_sync,
    .wal_bytes = kx_store_wal_bytes,
    .estimate = kx_store_estimate,
    .max_key = KALLAX_MAX_KEY < HR_MAX_KEY_BYTES ? KALLAX_MAX_KEY : HR_MAX_KEY_BYTES,
};

/* ---- the kind of a directory ---- */

static bool has_file(const char *dir, const char *name)
{
    char path[4096];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return stat(path, &st) == 0;
}

kv_err engine_store_check(const engine_opts *o, char *err, size_t errlen)
{
    if (o->kind != ENGINE_LSM && o->kind != ENGINE_KALLAX) {
        snprintf(err, errlen, "unknown engine kind %d (lsm or kallax)", (int)o->kind);
        return KV_INVALID_ARGUMENT;
    }
    bool kallax = o->kind == ENGINE_KALLAX;
    bool lsm_there = has_file(o->fast_dir, "CURRENT"), kx_there = has_file(o->fast_dir, "META");
    if ((kallax && lsm_there) || (!kallax && kx_there)) {
        snprintf(err, errlen,
                 "%s holds a store of engine %s, but this node runs engine %s: start it with "
                 "--engine %s, or move the data directory away to start an empty %s node",
                 o->fast_dir, kallax ? "lsm" : "kallax", kallax ? "kallax" : "lsm",
                 kallax ? "lsm" : "kallax", kallax ? "kallax" : "lsm");
        return KV_FAILED_PRECONDITION;
    }
    if (kallax && o->slow_dir) {
        snprintf(err, errlen, "engine kallax uses one volume: a slow directory does not apply");
        return KV_INVALID_ARGUMENT;
    }
    if (kallax && !kx_there && !o->kallax_blocks) {
        snprintf(err, errlen,
                 "%s has no kallax store yet: creating one needs its size (--kallax-blocks N "
                 "or --kallax-gb G)",
                 o->fast_dir);
        return KV_INVALID_ARGUMENT;
    }
    return KV_OK;
}
