/* SPDX-License-Identifier: MIT */
/*
 * The LSM db object: open/recovery, the WAL append path, flushes of the
 * memory tier's sorted runs into L0, point and batch lookups, stats and
 * close. Lookups pin the current version (refcount taken under vmu), then
 * probe level by level: in L0 every file whose range and bloom filter admit
 * the key is read and the highest seqno wins (promoted records keep old
 * seqnos); in L1+ one file per level, the first hit wins. The block reads of
 * one level are submitted together through the volume layer (one io_uring
 * submission), for all keys of a multiget at once. A probe whose block is
 * corrupt fails its key with DATA_LOSS (logged by sst.c), so a lookup never
 * returns data it cannot vouch for.
 *
 * Locks: vmu guards only the current-version pointer; mu guards file
 * numbers, the flushed seqno, manifest appends and compaction state; flush_mu
 * serialises flushes. Order: flush_mu, then mu, then vmu. No lock is held
 * across data I/O except manifest appends (under mu).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/assert.h"
#include "common/atomic.h"
#include "common/clock.h"
#include "common/log.h"
#include "node/lsm/iter.h"
#include "node/nhc/nhc.h"

#define MANIFEST_REWRITE_BYTES (64u << 20)

void lsm_opts_default(lsm_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->fast_mb = 1024;
    o->sync = LSM_SYNC_ALWAYS;
    o->sync_ms = 5;
    o->block_size = 4096;
    o->l0_trigger = 4;
    o->l0_stop = 20;
    o->fd_stop_pct = 100;
    o->compaction_threads = 1;
    o->hotrap = true;
}

static void fill_defaults(lsm_opts *o)
{
    lsm_opts d;
    lsm_opts_default(&d);
    o->fast_mb = o->fast_mb ? o->fast_mb : d.fast_mb;
    o->sync_ms = o->sync_ms ? o->sync_ms : d.sync_ms;
    o->block_size = o->block_size ? o->block_size : d.block_size;
    o->l0_trigger = o->l0_trigger ? o->l0_trigger : d.l0_trigger;
    o->l0_stop = o->l0_stop ? o->l0_stop : d.l0_stop;
    o->fd_stop_pct = o->fd_stop_pct ? o->fd_stop_pct : d.fd_stop_pct;
    o->compaction_threads = o->compaction_threads ? o->compaction_threads : 1;
    o->compaction_threads = o->compaction_threads > 16 ? 16 : o->compaction_threads;
    if (o->l0_stop <= o->l0_trigger)
        o->l0_stop = o->l0_trigger + 1;
}

/* With a slow volume, the fast levels (L1..last_fd, sized by fast_mb) must
 * fit the fast device beside the WAL (wal_max_bytes) and what flushes and
 * compactions need besides the levels: L0's flushed files, the two flushes
 * compact.c keeps free, and a merge's outputs, written before its inputs
 * go. Those take about as much as the levels, so fast_mb is cut to half of
 * what the device leaves after the WAL, with a warning. Otherwise
 * compaction keeps the levels under their targets only by pushing them
 * down for room, and a flush file pushed down whole covers every key of
 * SD's first level: on a 240 MiB device with fast_mb 200 and a 64 MiB WAL,
 * a 2M x 1 KiB load ran at write amplification 63 (and at 52 with 3/4
 * instead of half), every L2 -> L3 job rewriting all of L3. */
static void fit_fast(lsm_db *db)
{
    uint64_t total = lsm_vol_total_bytes(&db->vols[0]), wal = db->o.wal_max_bytes;
    if (!db->has_sd || total == UINT64_MAX || total <= wal)
        return;
    uint64_t fit = (total - wal) / 2, want = db->o.fast_mb << 20;
    if (want <= fit)
        return;
    uint64_t mb = fit >> 20 ? fit >> 20 : 1;
    KV_WARN(LSM_LOG,
            "%s: the fast device holds %" PRIu64 " MiB; with the WAL's %" PRIu64
            " MiB, flushes and compaction outputs the fast levels get %" PRIu64
            " MiB, not the %" PRIu64 " MiB asked for (--fast-mb)",
            db->fast_dir, total >> 20, wal >> 20, mb, db->o.fast_mb);
    db->o.fast_mb = mb;
}

/* L1 = FD/12 so that L1 + L2 (11/12 of FD) fit next to L0 and the WAL;
 * deeper levels go to SD once the cumulative target exceeds 95% of FD. */
static void size_levels(lsm_db *db)
{
    uint64_t fast = db->o.fast_mb << 20, cum = 0;
    uint64_t t1 = fast / 12 < (64u << 10) ? (64u << 10) : fast / 12;
    db->level_tier[0] = LSM_TIER_FD;
    for (int l = 1; l < LSM_MAX_LEVELS; l++) {
        db->target[l] = l == 1 ? t1 : db->target[l - 1] * 10;
        cum += db->target[l];
        bool fd = !db->has_sd || (db->level_tier[l - 1] == LSM_TIER_FD && cum <= fast / 100 * 95);
        db->level_tier[l] = fd ? LSM_TIER_FD : LSM_TIER_SD;
    }
    for (int l = 0; l < LSM_MAX_LEVELS; l++)
        db->codec[l] = lsm_compression_for(&db->o.compression, l, db->level_tier[l]);
    db->last_fd = 0;
    for (int l = 1; l < LSM_MAX_LEVELS && db->level_tier[l] == LSM_TIER_FD; l++)
        db->last_fd = l;
    uint64_t hot = db->target[db->last_fd ? db->last_fd : 1] / 100 * 85;
    db->hot_limit = db->o.hot_set_mb ? db->o.hot_set_mb << 20 : hot;
    uint64_t fs = db->o.file_mb ? db->o.file_mb << 20 : t1 / 4;
    db->file_size = fs < (64u << 10) ? (64u << 10) : fs > (64u << 20) ? (64u << 20) : fs;
}

lsm_version *lsm_db_current(lsm_db *db)
{
    pthread_mutex_lock(&db->vmu);
    lsm_version *v = db->cur;
    atomic_fetch_add(&v->refs, 1);
    pthread_mutex_unlock(&db->vmu);
    return v;
}

uint64_t lsm_db_new_number(lsm_db *db)
{
    KV_ASSERT_LOCKED(&db->mu);
    if (db->next_file >= LSM_FILE_NUMBER_MAX - 1) {
        KV_ERROR(LSM_LOG, "out of file numbers (the next is %" PRIu64 ")", db->next_file);
        return 0;
    }
    return db->next_file++;
}

static lsm_edit snapshot_of(lsm_db *db, const lsm_version *v)
{
    lsm_edit e = {.has_flushed = true,
                  .flushed_seq = db->flushed_seq,
                  .has_log = true,
                  .log_number = db->log_number,
                  .has_next = true};
    for (int l = 0; l < LSM_MAX_LEVELS; l++)
        for (size_t i = 0; i < v->nfiles[l]; i++)
            if (lsm_edit_add(&e, v->files[l][i]) != KV_OK)
                e.has_next = false; /* reported by the caller */
    return e;
}

/* Writes a fresh manifest holding the current state (mu held). */
static kv_err rewrite_manifest(lsm_db *db)
{
    KV_ASSERT_LOCKED(&db->mu);
    lsm_edit e = snapshot_of(db, db->cur);
    uint64_t number = lsm_db_new_number(db);
    e.next_file = db->next_file;
    kv_err rv = e.has_next && number ? KV_OK : KV_RESOURCE_EXHAUSTED;
    lsm_manifest *m = NULL;
    if (rv == KV_OK)
        rv = lsm_manifest_create(&m, &db->vols[0], number, &e,
                                 db->man ? lsm_manifest_number(db->man) : 0);
    lsm_edit_free(&e);
    if (rv != KV_OK)
        return rv;
    lsm_manifest_close(db->man);
    db->man = m;
    return KV_OK;
}

static void mark_obsolete(const lsm_version *old, const lsm_edit *e)
{
    for (size_t d = 0; d < e->ndel; d++) {
        bool readded = false;
        for (size_t a = 0; a < e->nadd; a++)
            readded |= e->adds[a]->number == e->del_numbers[d];
        int l = e->del_levels[d];
        for (size_t i = 0; !readded && i < old->nfiles[l]; i++)
            if (old->files[l][i]->number == e->del_numbers[d])
                atomic_store(&old->files[l][i]->obsolete, true);
    }
}

kv_err lsm_db_install(lsm_db *db, lsm_edit *e)
{
    KV_ASSERT_LOCKED(&db->mu);
    /* a manifest left with a torn edit is replaced by a fresh snapshot */
    kv_err rv = lsm_manifest_broken(db->man) ? rewrite_manifest(db) : KV_OK;
    e->has_next = true;
    e->next_file = db->next_file;
    if (rv == KV_OK)
        rv = lsm_manifest_append(db->man, e);
    if (rv != KV_OK) {
        KV_ERROR(LSM_LOG, "MANIFEST append: %s", kv_strerror(rv));
        return rv;
    }
    lsm_version *nv = lsm_version_apply(db->cur, e);
    if (!nv)
        return KV_RESOURCE_EXHAUSTED;
    mark_obsolete(db->cur, e);
    uint64_t fd = lsm_fd_bytes(db, nv);
    if (fd > atomic_load(&db->fd_peak))
        atomic_store(&db->fd_peak, fd); /* mu held: installs are serialized */
    pthread_mutex_lock(&db->vmu);
    lsm_version *old = db->cur;
    db->cur = nv;
    pthread_mutex_unlock(&db->vmu);
    lsm_version_unref(old);
    if (lsm_manifest_size(db->man) > MANIFEST_REWRITE_BYTES && rewrite_manifest(db) != KV_OK)
        KV_WARN(LSM_LOG, "MANIFEST rewrite failed; keeping the current one");
    return KV_OK;
}

/* ---- open / close ---- */

static void db_free(lsm_db *db)
{
    lsm_promo_close(db);
    ralt_close(db->ralt);
    lsm_twin_destroy(db->twin);
    lsm_wal_close(db->wal);
    lsm_manifest_close(db->man);
    lsm_version_unref(db->cur);
    for (int i = 0; i < 2; i++)
        lsm_vol_fini(&db->vols[i]);
    if (db->lock_fd >= 0)
        close(db->lock_fd); /* releases the flock */
    free(db->fast_dir);
    free(db->slow_dir);
    pthread_mutex_destroy(&db->vmu);
    pthread_mutex_destroy(&db->mu);
    pthread_mutex_destroy(&db->flush_mu);
    pthread_cond_destroy(&db->cv);
    free(db);
}

static bool is_live(const lsm_version *v, uint64_t number)
{
    for (int l = 0; l < LSM_MAX_LEVELS; l++)
        for (size_t i = 0; i < v->nfiles[l]; i++)
            if (v->files[l][i]->number == number)
                return true;
    return false;
}

/* Deletes SSTs no version references (left by a crash mid flush/compaction)
 * and returns the highest file number seen. */
static uint64_t sweep_orphans(lsm_db *db, lsm_vol *v)
{
    uint64_t max = 0;
    DIR *d = opendir(v->dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char *end;
        uint64_t num = strtoull(e->d_name, &end, 10);
        if (end == e->d_name || strcmp(end, ".sst") != 0)
            continue;
        max = num > max ? num : max;
        if (!is_live(db->cur, num)) {
            KV_INFO(LSM_LOG, "deleting orphan SST %s/%s", v->dir, e->d_name);
            lsm_vol_unlink(v, e->d_name);
        }
    }
    if (d)
        closedir(d);
    return max;
}

/* Opens the SSTs the manifest lists and builds the first version. */
static kv_err open_files(lsm_db *db, lsm_recovered *st, uint64_t *max_seq)
{
    for (size_t i = 0; i < st->state.nadd; i++) {
        lsm_file *f = st->state.adds[i];
        if (f->tier == LSM_TIER_SD && !db->has_sd) {
            KV_ERROR(LSM_LOG, "SST %06" PRIu64 " lives on the slow volume but no slow_dir is set",
                     f->number);
            return KV_INVALID_ARGUMENT;
        }
        f->vol = &db->vols[f->tier == LSM_TIER_SD ? 1 : 0];
        kv_err rv = lsm_sst_open(f->vol, f->number, &f->sst);
        if (rv != KV_OK)
            return rv;
        *max_seq = f->max_seq > *max_seq ? f->max_seq : *max_seq;
    }
    db->cur = lsm_version_apply(NULL, &st->state);
    if (db->cur) /* the peak since open starts at what the manifest left */
        atomic_store(&db->fd_peak, lsm_fd_bytes(db, db->cur));
    return db->cur ? KV_OK : KV_RESOURCE_EXHAUSTED;
}

/* Without CURRENT the directories must hold no SST or MANIFEST: otherwise
 * CURRENT was lost and starting afresh would delete the data as orphans. */
static kv_err check_fresh(lsm_db *db)
{
    for (int i = 0; i < (db->has_sd ? 2 : 1); i++) {
        DIR *d = opendir(db->vols[i].dir);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            size_t n = strlen(e->d_name);
            if (strncmp(e->d_name, "MANIFEST-", 9) == 0 ||
                (n > 4 && strcmp(e->d_name + n - 4, ".sst") == 0)) {
                KV_ERROR(LSM_LOG, "%s/CURRENT is missing but %s/%s exists; refusing to start empty",
                         db->vols[0].dir, db->vols[i].dir, e->d_name);
                closedir(d);
                return KV_DATA_LOSS;
            }
        }
        if (d)
            closedir(d);
    }
    return KV_OK;
}

/* One process (and one handle) per directory: an exclusive flock on LOCK. */
static kv_err lock_dir(lsm_db *db)
{
    db->lock_fd = lsm_vol_open(&db->vols[0], "LOCK", O_RDWR | O_CREAT);
    if (db->lock_fd < 0)
        return lsm_errno(db->lock_fd);
    if (flock(db->lock_fd, LOCK_EX | LOCK_NB) < 0) {
        KV_ERROR(LSM_LOG, "%s/LOCK is held by another handle or process: %s", db->fast_dir,
                 strerror(errno));
        return errno == EWOULDBLOCK ? KV_FAILED_PRECONDITION : KV_INTERNAL;
    }
    return KV_OK;
}

typedef struct replay_wrap {
    lsm_db *db;
    lsm_replay_fn fn;
    void *arg;
} replay_wrap;

/* Replayed writes are marked for the promotion check like appended ones. */
static kv_err replay_mark(void *arg, const lsm_rec *rec)
{
    replay_wrap *w = arg;
    lsm_promo_mark(w->db, rec, 1);
    return w->fn ? w->fn(w->arg, rec) : KV_OK;
}

static kv_err recover(lsm_db *db, lsm_replay_fn fn, void *arg)
{
    replay_wrap wrap = {db, fn, arg};
    lsm_recovered st = {0};
    kv_err rv = lsm_manifest_recover(&db->vols[0], &st);
    if (rv == KV_NOT_FOUND) {
        st.state.next_file = 1;
        rv = check_fresh(db);
    }
    uint64_t max_seq = 0, wmax = 0, wnum = 0;
    if (rv == KV_OK)
        rv = open_files(db, &st, &max_seq);
    db->flushed_seq = st.state.flushed_seq;
    db->next_file = st.state.next_file;
    lsm_wal_seg *segs = NULL;
    size_t nsegs = 0;
    if (rv == KV_OK)
        rv = lsm_wal_recover(&db->vols[0], &db->o, db->flushed_seq, replay_mark, &wrap, &segs,
                             &nsegs, &wmax, &wnum);
    if (rv != KV_OK) {
        lsm_edit_free(&st.state);
        return rv;
    }
    atomic_store(&db->flushed_pub, db->flushed_seq);
    max_seq = wmax > max_seq ? wmax : max_seq;
    max_seq = db->flushed_seq > max_seq ? db->flushed_seq : max_seq;
    atomic_store(&db->last_seq, max_seq);
    uint64_t hi = wnum;
    for (int i = 0; i < (db->has_sd ? 2 : 1); i++) {
        uint64_t m = sweep_orphans(db, &db->vols[i]);
        hi = m > hi ? m : hi;
    }
    db->next_file = hi + 1 > db->next_file ? hi + 1 : db->next_file;
    db->man = NULL;
    pthread_mutex_lock(&db->mu); /* no other thread yet; the contract holds anyway */
    uint64_t wal_number = lsm_db_new_number(db);
    db->log_number = wal_number;
    rv = wal_number ? rewrite_manifest(db) : KV_RESOURCE_EXHAUSTED;
    pthread_mutex_unlock(&db->mu);
    if (rv == KV_OK && st.manifest && st.manifest != lsm_manifest_number(db->man)) {
        char name[64];
        snprintf(name, sizeof(name), "MANIFEST-%06" PRIu64, st.manifest);
        lsm_vol_unlink(&db->vols[0], name);
    }
    lsm_edit_free(&st.state);
    if (rv == KV_OK)
        rv = lsm_wal_open(&db->wal, &db->vols[0], &db->o, wal_number, segs, nsegs);
    else
        free(segs);
    if (rv == KV_OK)
        lsm_wal_release(db->wal, db->flushed_seq);
    return rv;
}

static kv_err check_opts(const lsm_opts *o)
{
    if (!o || !o->fast_dir || !*o->fast_dir)
        return KV_INVALID_ARGUMENT;
    if (o->block_size && (o->block_size < 256 || o->block_size > (16u << 20)))
        return KV_INVALID_ARGUMENT;
    if (o->sync > LSM_SYNC_NONE)
        return KV_INVALID_ARGUMENT;
    const lsm_compression_spec *c = &o->compression;
    for (int l = 0; l < LSM_MAX_LEVELS; l++)
        if ((unsigned)c->level[l] > LSM_COMPRESS_ZSTD)
            return KV_INVALID_ARGUMENT;
    if ((unsigned)c->fast > LSM_COMPRESS_ZSTD || (unsigned)c->slow > LSM_COMPRESS_ZSTD)
        return KV_INVALID_ARGUMENT;
    return KV_OK;
}

/* RALT and the promotion buffer, when HotRAP is on and there is an SD. */
static kv_err hotrap_create(lsm_db *db)
{
    if (!db->o.hotrap || !db->has_sd)
        return KV_OK;
    /* RALT's table (run files on FD; in memory only their blooms and
     * indexes, ~1/10 of it) may take 1/8 of FD, and its counter period is
     * the FD size (ralt.c). A key read once must stay tracked until it is
     * read again to become stable: under zipf 0.99 over 2M keys, with FD at
     * 1/10 of the data, the keys at the edge of the hot-set limit are read
     * about once per million reads. With 1/16 of FD and a period of
     * hot_limit / 4, 96k keys were stable after 270 s and the FD hit rate
     * was 0.806; with these (and promote.c's exact FD check, measured
     * together), 139k (at the hot-set limit) and 0.821. */
    uint64_t fd_bytes = db->o.fast_mb << 20;
    uint64_t cap = fd_bytes / 8;
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s/ralt", db->fast_dir); /* RALT's runs, on FD (ralt.c) */
    ralt_opts ro = {.dir = dir,
                    .disable_io_uring = db->o.disable_io_uring,
                    .hot_limit = db->hot_limit,
                    .period_bytes = fd_bytes,
                    .phys_cap = cap < (1u << 20) ? 1u << 20 : cap};
    kv_err rv = ralt_open(&db->ralt, &ro);
    if (rv == KV_OK)
        rv = lsm_promo_create(db);
    uint64_t twins = db->o.twin_entries ? db->o.twin_entries : db->o.fast_mb * 256;
    if (rv == KV_OK)
        rv = lsm_twin_create(twins < 4096         ? 4096
                             : twins > (1u << 30) ? 1u << 30
                                                  : twins,
                             &db->twin);
    return rv;
}

kv_err lsm_open(lsm_db **out, const lsm_opts *o, lsm_replay_fn fn, void *arg)
{
    kv_err rv = check_opts(o);
    if (rv != KV_OK || !out) {
        KV_ERROR(LSM_LOG, "lsm_open: invalid options (fast_dir, block_size, sync or compression)");
        return KV_INVALID_ARGUMENT;
    }
    lsm_db *db = calloc(1, sizeof(*db));
    if (!db)
        return KV_RESOURCE_EXHAUSTED;
    db->o = *o;
    fill_defaults(&db->o);
    db->has_sd = o->slow_dir && *o->slow_dir;
    db->fast_dir = strdup(o->fast_dir);
    db->slow_dir = db->has_sd ? strdup(o->slow_dir) : NULL;
    db->o.fast_dir = db->fast_dir;
    db->o.slow_dir = db->slow_dir;
    db->vols[0].dirfd = db->vols[1].dirfd = -1;
    db->lock_fd = -1;
    pthread_mutex_init(&db->vmu, NULL);
    pthread_mutex_init(&db->mu, NULL);
    pthread_mutex_init(&db->flush_mu, NULL);
    pthread_cond_init(&db->cv, NULL);
    bool uring = !db->o.disable_io_uring;
    rv = db->fast_dir && (!db->has_sd || db->slow_dir) ? KV_OK : KV_RESOURCE_EXHAUSTED;
    if (rv == KV_OK)
        rv = lsm_vol_init(&db->vols[0], db->fast_dir, LSM_TIER_FD, uring);
    if (rv == KV_OK && db->has_sd)
        rv = lsm_vol_init(&db->vols[1], db->slow_dir, LSM_TIER_SD, uring);
    if (rv == KV_OK)
        fit_fast(db);
    size_levels(db);
    if (rv == KV_OK)
        rv = lock_dir(db);
    if (rv == KV_OK)
        rv = hotrap_create(db);
    if (rv == KV_OK)
        rv = recover(db, fn, arg);
    if (rv == KV_OK)
        rv = lsm_promo_start(db);
    if (rv == KV_OK)
        rv = lsm_compact_start(db);
    if (rv != KV_OK) {
        KV_ERROR(LSM_LOG, "lsm_open %s: %s", o->fast_dir, kv_strerror(rv));
        db_free(db);
        return rv;
    }
    KV_INFO(LSM_LOG, "opened %s%s%s: last seqno %" PRIu64 ", flushed %" PRIu64 ", %s", db->fast_dir,
            db->has_sd ? " + " : "", db->has_sd ? db->slow_dir : "", atomic_load(&db->last_seq),
            db->flushed_seq, db->vols[0].uring ? "io_uring" : "pread/pwrite");
    *out = db;
    return KV_OK;
}

void lsm_close(lsm_db *db)
{
    if (!db)
        return;
    /* Compactions first: one running inside SD offers hot records to the
     * promotion buffer (compact.c, promote_from_sd), so the buffer must
     * outlive them (TSan saw a compaction read db->promo while close freed
     * it). The checker never waits for compactions. */
    lsm_compact_stop(db);
    lsm_promo_close(db);
    db_free(db);
}

/* ---- writes ---- */

static void bump_last(lsm_db *db, uint64_t seq)
{
    kv_atomic_max(&db->last_seq, seq);
}

uint64_t lsm_last_seqno(lsm_db *db)
{
    return atomic_load(&db->last_seq);
}

uint64_t lsm_max_version(lsm_db *db)
{
    lsm_version *v = lsm_db_current(db);
    uint64_t max = 0;
    for (int l = 0; l < LSM_MAX_LEVELS; l++)
        for (size_t i = 0; i < v->nfiles[l]; i++)
            max = v->files[l][i]->max_version > max ? v->files[l][i]->max_version : max;
    lsm_version_unref(v);
    return max;
}

uint64_t lsm_flush_generation(lsm_db *db)
{
    return atomic_load(&db->flush_gen);
}

uint64_t lsm_wal_live_bytes(lsm_db *db)
{
    return lsm_wal_live(db->wal);
}

uint64_t lsm_wal_headroom(lsm_db *db)
{
    uint64_t live = lsm_wal_live(db->wal), max = db->o.wal_max_bytes;
    return max > live ? max - live : 0;
}

kv_err lsm_wal_sync(lsm_db *db)
{
    return lsm_wal_sync_all(db->wal);
}

void lsm_estimate(lsm_db *db, uint64_t *records, uint64_t *bytes)
{
    lsm_version *v = lsm_db_current(db);
    uint64_t r = 0, b = 0;
    for (int l = 0; l < LSM_MAX_LEVELS; l++) {
        for (size_t i = 0; i < v->nfiles[l]; i++) {
            r += v->files[l][i]->nentries;
            b += v->files[l][i]->size;
        }
    }
    lsm_version_unref(v);
    *records = r;
    *bytes = b;
}

kv_err lsm_wal_append(lsm_db *db, const lsm_rec *recs, size_t n)
{
    if (n && recs) {
        lsm_promo_mark(db, recs, n);               /* before the write can be seen anywhere */
        for (size_t i = 0; db->twin && i < n; i++) /* a newer version: no twin (promote.c) */
            lsm_twin_del(db->twin, recs[i].key, recs[i].klen);
    }
    kv_err rv = lsm_wal_write(db->wal, recs, n);
    if (rv != KV_OK)
        return rv;
    uint64_t bytes = 0, max = 0;
    for (size_t i = 0; i < n; i++) {
        bytes += recs[i].klen + (recs[i].type == LSM_PUT ? recs[i].vlen : 0);
        max = recs[i].seqno > max ? recs[i].seqno : max;
    }
    atomic_fetch_add(&db->user_bytes, bytes);
    bump_last(db, max);
    return KV_OK;
}

static kv_err check_run(const lsm_rec *r, size_t n, uint64_t max_seqno)
{
    for (size_t i = 0; i < n; i++) {
        if (!lsm_rec_valid(&r[i]) || r[i].seqno > max_seqno)
            return KV_INVALID_ARGUMENT;
        if (i && lsm_key_cmp(r[i - 1].key, r[i - 1].klen, r[i].key, r[i].klen) > 0)
            return KV_INVALID_ARGUMENT;
    }
    return KV_OK;
}

kv_err lsm_db_builder(lsm_db *db, int level, uint64_t number, lsm_sst_builder **out)
{
    *out = NULL;
    if (!number) /* lsm_db_new_number ran out */
        return KV_RESOURCE_EXHAUSTED;
    lsm_vol *v = &db->vols[db->level_tier[level] == LSM_TIER_SD ? 1 : 0];
    kv_err rv = lsm_sst_builder_open(out, v, number, db->o.block_size);
    if (rv == KV_OK)
        lsm_sst_builder_compress(*out, db->codec[level], &db->comp_in, &db->comp_out);
    return rv;
}

/* A key's first LOG_KEY_BYTES bytes in hex, for the debug log. */
#define LOG_KEY_BYTES 16
static const char *log_key(const uint8_t *k, size_t len, char out[2 * LOG_KEY_BYTES + 1])
{
    size_t n = len < LOG_KEY_BYTES ? len : LOG_KEY_BYTES;
    for (size_t i = 0; i < n; i++)
        snprintf(out + 2 * i, 3, "%02x", k[i]);
    out[2 * n] = '\0';
    return out;
}

static kv_err build_l0(lsm_db *db, uint64_t number, const lsm_rec *r, size_t n, lsm_file **out)
{
    lsm_sst_builder *b = NULL; /* not written when the open fails */
    kv_err rv = lsm_db_builder(db, 0, number, &b);
    for (size_t i = 0; rv == KV_OK && i < n; i++)
        if (!i || lsm_key_cmp(r[i - 1].key, r[i - 1].klen, r[i].key, r[i].klen) != 0)
            rv = lsm_sst_builder_add(b, &r[i]);
    if (rv != KV_OK) {
        if (b)
            lsm_sst_builder_abort(b);
        return rv;
    }
    return lsm_sst_builder_finish(b, 0, out);
}

/* With a slow volume: true when the fast device has less than want bytes
 * free and compaction can make some room (a job runs, or an FD level has
 * files to move or push down to SD). mu held. */
static bool room_short(lsm_db *db, uint64_t want)
{
    if (!db->has_sd)
        return false;
    uint64_t free = lsm_vol_free_bytes(&db->vols[0]);
    atomic_store_explicit(&db->fd_free, free, memory_order_relaxed);
    if (free == UINT64_MAX || free >= want)
        return false;
    if (db->running > 0)
        return true;
    for (int l = 1; l <= db->last_fd; l++) /* a level to push (or move) down */
        if (db->cur->nfiles[l] > 0)
            return true;
    return db->cur->nfiles[0] > 1 && db->cur->nfiles[1] == 0; /* L0's oldest can move */
}

/* Waits (mu held) while compaction runs and L0 is at l0_stop, the FD levels
 * are over their stop (lsm_fd_full), or the fast device lacks room for this
 * flush of about need bytes (room_short; compact.c pushes the last FD level
 * down meanwhile); counts the stall once. */
static void stall(lsm_db *db, uint64_t need)
{
    KV_ASSERT_LOCKED(&db->mu);
    uint64_t t0 = 0, file = need + need / 8 + (64u << 10); /* the file's index and bloom */
    while (!db->stop && db->nthreads && !db->o.no_auto_compaction && db->bg_err == KV_OK) {
        bool l0 = db->cur->nfiles[0] >= db->o.l0_stop;
        bool fd = !l0 && lsm_fd_full(db, db->cur);
        /* the file, and what the WAL may grow meanwhile: writers go on */
        uint64_t want = file + lsm_wal_headroom(db);
        bool room = !l0 && !fd && room_short(db, want);
        if (!l0 && !fd && !room)
            break;
        if (!t0) {
            t0 = kv_now_ns();
            atomic_fetch_add(l0 ? &db->stalls_l0 : fd ? &db->stalls_fd : &db->stalls_space, 1);
        }
        if (room) {
            /* freed room is not signalled (a file goes when its last reader
             * lets go): look again every 20 ms, and have compaction push down */
            db->space_wanted = file; /* fd_reserve adds the WAL's headroom */
            pthread_cond_broadcast(&db->cv);
            lsm_db_wait_until(db, kv_now_ns() + 20000000u);
        } else {
            pthread_cond_wait(&db->cv, &db->mu);
        }
    }
    db->space_wanted = 0;
    if (t0)
        atomic_fetch_add(&db->stall_ns, kv_now_ns() - t0);
}

/* Installs a flush's files (f, f2 may be NULL) as one edit. */
static kv_err install_flush(lsm_db *db, lsm_file *f, lsm_file *f2, uint64_t max_seqno,
                            uint64_t wal_no)
{
    lsm_edit e = {
        .has_flushed = true, .flushed_seq = max_seqno, .has_log = true, .log_number = wal_no};
    kv_err rv = f ? lsm_edit_add(&e, f) : KV_OK;
    if (rv == KV_OK && f2)
        rv = lsm_edit_add(&e, f2);
    pthread_mutex_lock(&db->mu);
    if (rv == KV_OK)
        rv = lsm_db_install(db, &e);
    if (rv == KV_OK) {
        db->flushed_seq = max_seqno;
        atomic_store(&db->flushed_pub, max_seqno); /* after the version is installed */
        db->log_number = wal_no;
        atomic_fetch_add(&db->flush_gen, 1);
        atomic_fetch_add(&db->flushes, 1);
        uint64_t bytes = (f ? f->size : 0) + (f2 ? f2->size : 0);
        atomic_fetch_add(&db->flush_bytes, bytes);
        if (bytes > atomic_load(&db->flush_max))
            atomic_store(&db->flush_max, bytes); /* mu held: flushes are serialized */
        pthread_cond_broadcast(&db->cv);
    }
    pthread_mutex_unlock(&db->mu);
    lsm_edit_free(&e);
    return rv;
}

/* Where a flush's key-sorted run splits into two L0 files, or 0: at the
 * first key above every key of the FD levels, when the records below it
 * are at most a sixteenth of the run. Keys appended above the rest reach
 * the memory tier a little out of order, and a flush can hold a few
 * stragglers below the keys flushed before it; written apart, the appended
 * body overlaps nothing and moves down (compact.c, l0_movable) and only
 * the stragglers are merged. mu held. */
static size_t flush_split(lsm_db *db, const lsm_rec *r, size_t n)
{
    KV_ASSERT_LOCKED(&db->mu);
    const lsm_version *v = db->cur;
    const uint8_t *k = NULL;
    size_t kl = 0;
    for (int l = 0; l <= db->last_fd; l++)
        for (size_t i = l ? (v->nfiles[l] ? v->nfiles[l] - 1 : 0) : 0; i < v->nfiles[l]; i++) {
            const lsm_file *f = v->files[l][i];
            if (!k || lsm_key_cmp(f->largest, f->llen, k, kl) > 0)
                k = f->largest, kl = f->llen;
        }
    if (!k || n < 2)
        return 0;
    size_t lo = 0, hi = n; /* the first record whose key sorts above k */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (lsm_key_cmp(r[mid].key, r[mid].klen, k, kl) > 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo > 0 && lo < n && lo <= n / 16 ? lo : 0;
}

static void log_flush_file(const lsm_file *f)
{
    char lo[2 * LOG_KEY_BYTES + 1], hi[2 * LOG_KEY_BYTES + 1];
    KV_DEBUG(LSM_LOG,
             "flush into L0 file %" PRIu64 ": %" PRIu64 " records, keys %s..%s, seqnos %" PRIu64
             "..%" PRIu64,
             f->number, f->nentries, log_key(f->smallest, f->slen, lo),
             log_key(f->largest, f->llen, hi), f->min_seq, f->max_seq);
}

kv_err lsm_flush(lsm_db *db, const lsm_rec *sorted, size_t n, uint64_t max_seqno)
{
    kv_err rv = check_run(sorted, n, max_seqno);
    if (rv != KV_OK || (n && !sorted))
        return KV_INVALID_ARGUMENT;
    pthread_mutex_lock(&db->flush_mu);
    pthread_mutex_lock(&db->mu);
    if (max_seqno < db->flushed_seq || (n == 0 && max_seqno == db->flushed_seq)) {
        rv = max_seqno < db->flushed_seq ? KV_INVALID_ARGUMENT : KV_OK; /* or nothing to do */
        pthread_mutex_unlock(&db->mu);
        pthread_mutex_unlock(&db->flush_mu);
        return rv;
    }
    uint64_t need = 0; /* the L0 file's bytes, about: records and their framing */
    for (size_t i = 0; i < n; i++)
        need += sorted[i].klen + sorted[i].vlen + 32;
    stall(db, need);
    size_t cut = n ? flush_split(db, sorted, n) : 0; /* sorted[0, cut) apart, when > 0 */
    uint64_t sst_no = lsm_db_new_number(db), sst2 = sst_no && cut ? lsm_db_new_number(db) : 0;
    uint64_t wal_no = sst_no && (sst2 || !cut) ? lsm_db_new_number(db) : 0;
    pthread_mutex_unlock(&db->mu);
    if (!wal_no) {
        pthread_mutex_unlock(&db->flush_mu);
        return KV_RESOURCE_EXHAUSTED;
    }

    lsm_file *f = NULL, *f2 = NULL;
    rv = lsm_wal_rotate(db->wal, wal_no);
    if (rv == KV_OK && n)
        rv = build_l0(db, sst_no, sorted, cut ? cut : n, &f);
    if (rv == KV_OK && cut)
        rv = build_l0(db, sst2, sorted + cut, n - cut, &f2);
    if (rv == KV_OK)
        lsm_promo_mark_flushed(db, sorted, n); /* before the install (promote.c) */
    if (rv == KV_OK)
        rv = install_flush(db, f, f2, max_seqno, wal_no);
    if (rv == KV_OK && kv_log_enabled(KV_LOG_DEBUG)) {
        if (f)
            log_flush_file(f);
        if (f2)
            log_flush_file(f2);
    }
    if (rv != KV_OK && f)
        atomic_store(&f->obsolete, true); /* written but not installed */
    if (rv != KV_OK && f2)
        atomic_store(&f2->obsolete, true);
    lsm_file_unref(f);
    lsm_file_unref(f2);
    if (rv == KV_OK) {
        lsm_wal_release(db->wal, max_seqno);
        bump_last(db, max_seqno);
    } else {
        KV_ERROR(LSM_LOG, "flush up to seqno %" PRIu64 ": %s", max_seqno, kv_strerror(rv));
    }
    pthread_mutex_unlock(&db->flush_mu);
    return rv;
}

/* ---- lookups ---- */

typedef struct probe {
    size_t key;
    lsm_file *f;
    int blk;
} probe;

typedef struct lookup {
    size_t n;
    const void *const *keys;
    const size_t *klens;
    lsm_rec *tmp; /* best record so far (deep copies) */
    lsm_tier *tier;
    kv_err *err; /* KV_NOT_FOUND until found or failed */
    bool *done;
    bool *routed;   /* NHC sent the key to SD and its SD record is the twin */
    uint64_t *want; /* twin seqno of a key sent to SD */
    probe *pr;
    lsm_io *io;
    size_t np, cap;
    bool meta;          /* lsm_get_meta: metadata only, no read side effects */
    uint64_t blocks[2]; /* data blocks read from FD, SD */
} lookup;

static kv_err add_probe(lookup *lk, size_t key, lsm_file *f)
{
    const void *k = lk->keys[key];
    size_t kl = lk->klens[key];
    if (!lsm_file_covers(f, k, kl) || !lsm_sst_may_contain(f->sst, k, kl))
        return KV_OK;
    int blk = lsm_sst_find_block(f->sst, k, kl);
    if (blk < 0)
        return KV_OK;
    if (lk->np == lk->cap) {
        size_t cap = lk->cap ? lk->cap * 2 : 16;
        probe *p = realloc(lk->pr, cap * sizeof(*p));
        if (p)
            lk->pr = p;
        lsm_io *io = realloc(lk->io, cap * sizeof(*io));
        if (io)
            lk->io = io;
        if (!p || !io)
            return KV_RESOURCE_EXHAUSTED;
        lk->cap = cap;
    }
    kv_err rv = lsm_sst_block_io(f->sst, blk, &lk->io[lk->np]);
    if (rv != KV_OK)
        return rv;
    lk->pr[lk->np++] = (probe){key, f, blk};
    return KV_OK;
}

/* Result of one probe folded into its key's state. */
static void take_probe(lookup *lk, size_t i)
{
    probe *p = &lk->pr[i];
    size_t k = p->key;
    if (lk->err[k] != KV_OK && lk->err[k] != KV_NOT_FOUND)
        return; /* already failed */
    kv_err rv = lsm_sst_block_check(p->f->sst, p->blk, &lk->io[i]);
    lsm_rec r;
    if (rv == KV_OK)
        rv = lsm_block_search(p->f->sst, lk->io[i].buf, lk->io[i].len, lk->keys[k], lk->klens[k],
                              &r);
    if (rv == KV_NOT_FOUND)
        return;
    if (rv == KV_DATA_LOSS)
        KV_ERROR(LSM_LOG, "lookup: unreadable record in SST %06llu block %d",
                 (unsigned long long)p->f->number, p->blk);
    if (rv == KV_OK && lk->err[k] == KV_OK && r.seqno <= lk->tmp[k].seqno)
        return; /* an L0 file already gave a newer record */
    lsm_rec copy = r;
    if (rv == KV_OK && lk->meta)
        copy.key = copy.value = NULL; /* metadata only: nothing to copy or free */
    else if (rv == KV_OK)
        rv = lsm_rec_copy(&copy, &r);
    if (lk->err[k] == KV_OK)
        lsm_rec_free(&lk->tmp[k]);
    lk->err[k] = rv;
    if (rv == KV_OK) {
        lk->tmp[k] = copy;
        lk->tier[k] = p->f->tier;
    }
}

static void run_probes(lookup *lk)
{
    lsm_vol_read(lk->io, lk->np);
    for (size_t i = 0; i < lk->np; i++) {
        lk->blocks[lk->pr[i].f->tier == LSM_TIER_SD]++;
        take_probe(lk, i);
        free(lk->io[i].buf);
    }
    lk->np = 0;
}

static kv_err probe_level(lookup *lk, const lsm_version *v, int l)
{
    kv_err rv = KV_OK;
    for (size_t k = 0; k < lk->n && rv == KV_OK; k++) {
        if (lk->done[k])
            continue;
        if (l == 0) {
            for (size_t i = 0; i < v->nfiles[0] && rv == KV_OK; i++)
                rv = add_probe(lk, k, v->files[0][i]);
            continue;
        }
        size_t i = lsm_level_find(v->files[l], v->nfiles[l], lk->keys[k], lk->klens[k]);
        if (i < v->nfiles[l])
            rv = add_probe(lk, k, v->files[l][i]);
    }
    if (rv != KV_OK) {
        for (size_t i = 0; i < lk->np; i++)
            free(lk->io[i].buf);
        lk->np = 0;
        return rv;
    }
    run_probes(lk);
    for (size_t k = 0; k < lk->n; k++)
        lk->done[k] = lk->done[k] || lk->err[k] != KV_NOT_FOUND;
    return KV_OK;
}

static void lookup_fini(lookup *lk)
{
    free(lk->tmp);
    free(lk->tier);
    free(lk->err);
    free(lk->done);
    free(lk->routed);
    free(lk->want);
    free(lk->pr);
    free(lk->io);
}

/* calloc, unless fault injection fails this allocation (tests). */
static void *lk_calloc(size_t n, size_t size)
{
    return lsm_fault_hit(LSM_FOP_ALLOC, -1, "lookup", 0, NULL) < 0 ? NULL : calloc(n, size);
}

/* Allocates the per-key state; on failure frees what it took and returns
 * RESOURCE_EXHAUSTED (lk is then empty). */
static kv_err lookup_init(lookup *lk, size_t n)
{
    lk->n = n;
    lk->tmp = lk_calloc(n, sizeof(*lk->tmp));
    lk->tier = lk_calloc(n, sizeof(*lk->tier));
    lk->err = lk_calloc(n, sizeof(*lk->err));
    lk->done = lk_calloc(n, sizeof(*lk->done));
    lk->routed = lk_calloc(n, sizeof(*lk->routed));
    lk->want = lk_calloc(n, sizeof(*lk->want));
    if (!lk->tmp || !lk->tier || !lk->err || !lk->done || !lk->routed || !lk->want) {
        lookup_fini(lk);
        *lk = (lookup){0};
        return KV_RESOURCE_EXHAUSTED;
    }
    for (size_t i = 0; i < n; i++)
        lk->err[i] = KV_NOT_FOUND;
    return KV_OK;
}

/*
 * NHC routing, run on the pinned version before the FD-first pass. A key of
 * the twin map that nhc_send_to_fd does not keep on FD is looked up in the SD
 * levels only. Its SD record is the newest record of the key when it carries
 * the twin seqno: an entry exists only while no write newer than that seqno
 * has been appended (lsm_wal_append removes it first, promote.c rechecks
 * after inserting), and the entry was read after the version was pinned, so
 * no flush in this version holds a newer write. Any other outcome (an older
 * record, none, an unreadable block) removes the entry and sends the key
 * down the normal FD-first path.
 */
static kv_err route_sd(lsm_db *db, lookup *lk, const lsm_version *v)
{
    size_t nr = 0;
    for (size_t k = 0; k < lk->n; k++) {
        /* the coin first: in classic state (load_admit 1) no stripe is taken */
        lk->routed[k] = !lk->done[k] && !nhc_send_to_fd(db->o.nhc) &&
                        lsm_twin_get(db->twin, lk->keys[k], lk->klens[k], &lk->want[k]);
        nr += lk->routed[k];
    }
    if (!nr)
        return KV_OK;
    for (size_t k = 0; k < lk->n; k++)
        lk->done[k] = lk->done[k] || !lk->routed[k];
    kv_err rv = KV_OK;
    for (int l = 0; rv == KV_OK && l < LSM_MAX_LEVELS; l++)
        if (db->level_tier[l] == LSM_TIER_SD && v->nfiles[l])
            rv = probe_level(lk, v, l);
    for (size_t k = 0; k < lk->n; k++) {
        if (!lk->routed[k]) {
            lk->done[k] = lk->err[k] != KV_NOT_FOUND;
            continue;
        }
        if (rv == KV_OK && lk->err[k] == KV_OK && lk->tmp[k].seqno == lk->want[k]) {
            lk->done[k] = true;
            continue;
        }
        if (lk->err[k] == KV_OK)
            lsm_rec_free(&lk->tmp[k]);
        lk->err[k] = KV_NOT_FOUND;
        lk->done[k] = lk->routed[k] = false;
        lsm_twin_drop(db->twin, lk->keys[k], lk->klens[k], lk->want[k]);
        atomic_fetch_add_explicit(&db->nhc_fallbacks, 1, memory_order_relaxed);
    }
    atomic_fetch_add_explicit(&db->nhc_routed, nr, memory_order_relaxed);
    return rv;
}

static void publish(lsm_db *db, lookup *lk, lsm_rec *outs, lsm_tier *served, kv_err *errs,
                    uint64_t fread, uint64_t t0)
{
    nhc *sched = db->o.nhc;
    uint64_t lat = sched ? kv_now_ns() - t0 : 0;
    bool admit = !sched || nhc_data_admit(sched);
    for (size_t k = 0; k < lk->n; k++) {
        errs[k] = lk->err[k];
        if (lk->err[k] != KV_OK)
            continue;
        outs[k] = lk->tmp[k];
        if (served)
            served[k] = lk->tier[k];
        atomic_fetch_add(lk->tier[k] == LSM_TIER_SD ? &db->reads_sd : &db->reads_fd, 1);
        if (db->ralt && outs[k].type == LSM_PUT) {
            lsm_promo_note_read(db, outs[k].key, outs[k].klen); /* before RALT hears of it */
            ralt_access(db->ralt, outs[k].key, outs[k].klen, outs[k].vlen);
        }
        bool sd = lk->tier[k] == LSM_TIER_SD;
        if (sd && admit && !lk->routed[k])
            lsm_promo_add(db, &outs[k], fread);
        if (sched) {
            nhc_note_read(sched, sd ? NHC_DEV_SD : NHC_DEV_FD, lat);
            if (sd && !lk->routed[k])
                nhc_note_miss(sched); /* FD did not hold it */
        }
    }
}

/* Probes every non-empty level of v, FD levels first. */
static kv_err lookup_levels(lookup *lk, const lsm_version *v)
{
    kv_err rv = KV_OK;
    for (int l = 0; rv == KV_OK && l < LSM_MAX_LEVELS; l++)
        if (v->nfiles[l])
            rv = probe_level(lk, v, l);
    return rv;
}

kv_err lsm_multiget(lsm_db *db, size_t n, const void *const *keys, const size_t *klens,
                    lsm_rec *outs, lsm_tier *served, kv_err *errs)
{
    if (n && (!keys || !klens || !outs || !errs))
        return KV_INVALID_ARGUMENT;
    lookup lk = {0};
    kv_err rv = lookup_init(&lk, n ? n : 1);
    if (rv != KV_OK)
        return rv; /* errs and outs untouched */
    lk.n = n;
    lk.keys = keys;
    lk.klens = klens;
    for (size_t k = 0; k < n; k++) {
        if (!keys[k] || klens[k] == 0 || klens[k] > LSM_MAX_KEY) {
            lk.err[k] = KV_INVALID_ARGUMENT;
            lk.done[k] = true;
        }
    }
    uint64_t t0 = db->o.nhc ? kv_now_ns() : 0;
    uint64_t fread = atomic_load(&db->flushed_pub); /* before pinning (promote.c) */
    lsm_version *v = rv == KV_OK ? lsm_db_current(db) : NULL;
    if (rv == KV_OK && db->twin && db->o.nhc)
        rv = route_sd(db, &lk, v); /* after pinning: see route_sd */
    rv = rv == KV_OK ? lookup_levels(&lk, v) : rv;
    lsm_version_unref(v);
    if (rv == KV_OK) {
        publish(db, &lk, outs, served, errs, fread, t0);
    } else {
        for (size_t k = 0; k < n; k++)
            if (lk.err[k] == KV_OK)
                lsm_rec_free(&lk.tmp[k]);
    }
    lookup_fini(&lk);
    return rv;
}

kv_err lsm_get_meta(lsm_db *db, const void *key, size_t klen, lsm_rec *out)
{
    if (!key || klen == 0 || klen > LSM_MAX_KEY || !out)
        return KV_INVALID_ARGUMENT;
    lookup lk = {0};
    kv_err rv = lookup_init(&lk, 1);
    if (rv != KV_OK)
        return rv;
    const void *keys[1] = {key};
    size_t klens[1] = {klen};
    lk.keys = keys;
    lk.klens = klens;
    lk.meta = true;
    lsm_version *v = lsm_db_current(db);
    rv = lookup_levels(&lk, v); /* FD first; NHC's routing is for reads */
    lsm_version_unref(v);
    atomic_fetch_add_explicit(&db->check_calls, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&db->check_blocks_fd, lk.blocks[0], memory_order_relaxed);
    atomic_fetch_add_explicit(&db->check_blocks_sd, lk.blocks[1], memory_order_relaxed);
    if (rv == KV_OK && (rv = lk.err[0]) == KV_OK)
        *out = lk.tmp[0];
    lookup_fini(&lk);
    return rv;
}

kv_err lsm_get(lsm_db *db, const void *key, size_t klen, lsm_rec *out, lsm_tier *served)
{
    if (!key || klen == 0 || !out)
        return KV_INVALID_ARGUMENT;
    const void *keys[1] = {key};
    size_t klens[1] = {klen};
    lsm_rec rec;
    lsm_tier tier;
    kv_err err;
    kv_err rv = lsm_multiget(db, 1, keys, klens, &rec, &tier, &err);
    if (rv != KV_OK)
        return rv;
    if (err == KV_OK) {
        *out = rec;
        if (served)
            *served = tier;
    }
    return err;
}

void lsm_note_access(lsm_db *db, const void *key, size_t klen, size_t vlen)
{
    if (db->ralt && key && klen)
        ralt_access(db->ralt, key, klen, vlen);
}

bool lsm_note_access_nb(lsm_db *db, const void *key, size_t klen, size_t vlen)
{
    return !db->ralt || !key || !klen || ralt_access_nb(db->ralt, key, klen, vlen);
}

/* ---- stats ---- */

static void hotrap_stats(lsm_db *db, lsm_stats *out)
{
    if (!db->ralt)
        return;
    ralt_stats rs;
    ralt_stats_get(db->ralt, &rs);
    out->hotrap = true;
    out->ralt_entries = rs.entries;
    out->ralt_stable = rs.stable;
    out->ralt_bytes = rs.phys_bytes;
    out->ralt_phys_limit = rs.phys_limit;
    out->ralt_hot_bytes = rs.hot_bytes;
    out->hot_set_limit = rs.hot_limit;
    out->ralt_evicted = rs.evicted;
    out->ralt_merges = rs.merges;
    out->ralt_full_merges = rs.full_merges;
    out->ralt_merge_bytes = rs.merge_bytes;
    out->ralt_file_bytes = rs.file_bytes;
    out->ralt_mem_bytes = rs.mem_bytes;
    out->ralt_errors = rs.errors;
    out->retained_recs = atomic_load(&db->retained_recs);
    out->retained_bytes = atomic_load(&db->retained_bytes);
    out->twins_dropped = atomic_load(&db->twins_dropped);
    out->twins_dropped_bytes = atomic_load(&db->twins_dropped_bytes);
    out->twin_jobs = atomic_load(&db->twin_jobs);
    out->l0_moves_past = atomic_load(&db->l0_moves_past);
    lsm_promo_stats(db, out);
    out->twin_entries = lsm_twin_size(db->twin);
    out->twin_capacity = lsm_twin_capacity(db->twin);
    out->twin_evicted = lsm_twin_evicted(db->twin);
    out->nhc_routed_sd = atomic_load(&db->nhc_routed);
    out->nhc_fallbacks = atomic_load(&db->nhc_fallbacks);
}

kv_err lsm_stats_get(lsm_db *db, lsm_stats *out)
{
    memset(out, 0, sizeof(*out));
    lsm_version *v = lsm_db_current(db);
    for (int l = 0; l < LSM_MAX_LEVELS; l++) {
        out->levels[l].files = v->nfiles[l];
        out->levels[l].bytes = lsm_level_bytes(v, l);
        out->levels[l].target_bytes = l ? db->target[l] : lsm_l0_room(db, v);
        out->levels[l].volume = db->level_tier[l];
        out->levels[l].codec = db->codec[l];
        out->levels[l].comp_read_above = atomic_load(&db->lc_above[l]);
        out->levels[l].comp_read_level = atomic_load(&db->lc_level[l]);
        out->levels[l].comp_written = atomic_load(&db->lc_written[l]);
        out->levels[l].comp_jobs = atomic_load(&db->lc_jobs[l]);
        out->levels[l].comp_moved = atomic_load(&db->lc_moved[l]);
        out->levels[l].comp_ns = atomic_load(&db->lc_ns[l]);
        for (size_t i = 0; i < v->nfiles[l]; i++) {
            out->index_mem_bytes += lsm_sst_mem(v->files[l][i]->sst);
            out->old_format_files += lsm_sst_format(v->files[l][i]->sst) < LSM_SST_FORMAT;
        }
    }
    out->fd_bytes = lsm_fd_bytes(db, v);
    lsm_version_unref(v);
    lsm_vol_counters(&db->vols[0], &out->fd);
    if (db->has_sd)
        lsm_vol_counters(&db->vols[1], &out->sd);
    out->reads_fd = atomic_load(&db->reads_fd);
    out->reads_sd = atomic_load(&db->reads_sd);
    out->check_calls = atomic_load(&db->check_calls);
    out->check_blocks_fd = atomic_load(&db->check_blocks_fd);
    out->check_blocks_sd = atomic_load(&db->check_blocks_sd);
    out->user_bytes = atomic_load(&db->user_bytes);
    lsm_wal_counters(db->wal, &out->wal_bytes, &out->wal_fsyncs, &out->wal_segments);
    out->wal_live_bytes = lsm_wal_live(db->wal);
    out->flush_bytes = atomic_load(&db->flush_bytes);
    out->flushes = atomic_load(&db->flushes);
    out->stalls_l0 = atomic_load(&db->stalls_l0);
    out->stalls_fd = atomic_load(&db->stalls_fd);
    out->stalls_space = atomic_load(&db->stalls_space);
    out->space_waits = atomic_load(&db->space_waits);
    out->fd_free_bytes = db->has_sd ? atomic_load(&db->fd_free) : 0;
    out->stall_ns = atomic_load(&db->stall_ns);
    out->fd_peak_bytes = atomic_load(&db->fd_peak);
    out->compact_read_bytes = atomic_load(&db->c_read);
    out->compact_write_bytes = atomic_load(&db->c_write);
    out->compactions = atomic_load(&db->compactions);
    out->compress_in_bytes = atomic_load(&db->comp_in);
    out->compress_out_bytes = atomic_load(&db->comp_out);
    uint64_t written = out->wal_bytes + out->flush_bytes + out->compact_write_bytes;
    out->write_amp = out->user_bytes ? (double)written / (double)out->user_bytes : 0.0;
    pthread_mutex_lock(&db->mu);
    out->flushed_seqno = db->flushed_seq;
    pthread_mutex_unlock(&db->mu);
    out->last_seqno = atomic_load(&db->last_seq);
    out->flush_generation = atomic_load(&db->flush_gen);
    out->io_uring = db->vols[0].uring;
    hotrap_stats(db, out);
    return KV_OK;
}
