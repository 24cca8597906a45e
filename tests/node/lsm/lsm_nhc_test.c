/* SPDX-License-Identifier: MIT */
/*
 * Tests of NHC in the LSM: the twin map (bounds, removal rules), routing of
 * twin reads to SD by load_admit (never an older version than FD holds,
 * fallback and repair when the SD copy is older or absent), the twin map
 * following writes and compactions, data_admit gating promotion, and the
 * per-volume read reports the scheduler receives.
 */
#include "lsm_test_util.h"

#include "tests/kv_testfw.h"
#include <dirent.h>
#include <pthread.h>
#include <sched.h>

#include "node/lsm/lsm_int.h"
#include "node/nhc/nhc.h"
#include "lsm_test_db.h"

/* ---- the twin map alone ---- */

Test(twin, put_get_del_drop)
{
    lsm_twin *t;
    cr_assert_eq(lsm_twin_create(0, &t), KV_INVALID_ARGUMENT);
    cr_assert_eq(lsm_twin_create(100, &t), KV_OK);
    uint64_t s = 0;
    cr_assert(!lsm_twin_get(t, "a", 1, &s));
    lsm_twin_put(t, "a", 1, 10);
    lsm_twin_put(t, "b", 1, 11);
    cr_assert(lsm_twin_get(t, "a", 1, &s) && s == 10);
    lsm_twin_put(t, "a", 1, 12); /* re-promotion replaces */
    cr_assert(lsm_twin_get(t, "a", 1, &s) && s == 12);
    cr_assert_eq(lsm_twin_size(t), 2);
    cr_assert(!lsm_twin_drop(t, "a", 1, 10), "drop needs the exact seqno");
    cr_assert(lsm_twin_drop(t, "a", 1, 12));
    cr_assert(!lsm_twin_get(t, "a", 1, &s));
    lsm_twin_del(t, "b", 1);
    cr_assert(!lsm_twin_get(t, "b", 1, &s));
    cr_assert_eq(lsm_twin_size(t), 0);
    lsm_twin_destroy(t);
    lsm_twin_destroy(NULL);
}

Test(twin, bounded_evicts_oldest)
{
    lsm_twin *t;
    cr_assert_eq(lsm_twin_create(64, &t), KV_OK);
    size_t cap = lsm_twin_capacity(t);
    cr_assert_geq(cap, 64);
    cr_assert_leq(cap, 128);
    char k[16];
    for (int i = 0; i < 10000; i++) {
        int n = snprintf(k, sizeof(k), "key%d", i);
        lsm_twin_put(t, k, (size_t)n, (uint64_t)i + 1);
        cr_assert_leq(lsm_twin_size(t), cap);
    }
    cr_assert_eq(lsm_twin_size(t), cap, "full");
    cr_assert_eq(lsm_twin_evicted(t), 10000 - cap);
    /* the newest entries survive (eviction takes the lowest seqno of a set) */
    uint64_t s;
    int n = snprintf(k, sizeof(k), "key%d", 9999);
    cr_assert(lsm_twin_get(t, k, (size_t)n, &s) && s == 10000);
    lsm_twin_destroy(t);
}

/* ---- routing in the db ---- */

/* The store's scheduler lives in t->o.nhc (borrowed by the LSM). */
static tdb *t_open(const char *tag)
{
    tdb *t = calloc(1, sizeof(*t));
    lt_db_init(t, tag);
    cr_assert_eq(nhc_create(NULL, 1, &t->o.nhc), KV_OK);
    t->o.hotrap = true;
    lt_db_start(t);
    return t;
}

static void t_close(tdb *t)
{
    lt_db_close(t);
    nhc_destroy(t->o.nhc);
    free(t);
}

/* A newer version of id: WAL append, then (flush) an L0 file on FD. */
static uint64_t overwrite(tdb *t, int id, bool flush)
{
    char k[KLEN + 1];
    key_of(k, id);
    lsm_rec r = {.key = k, .klen = KLEN, .value = "new", .vlen = 3, .seqno = ++t->seq};
    r.type = LSM_PUT;
    cr_assert_eq(lsm_wal_append(t->db, &r, 1), KV_OK);
    if (flush)
        cr_assert_eq(lsm_flush(t->db, &r, 1, t->seq), KV_OK);
    return r.seqno;
}

static bool twin_of(tdb *t, int id, uint64_t *seq)
{
    char k[KLEN + 1];
    key_of(k, id);
    return lsm_twin_get(t->db->twin, k, KLEN, seq);
}

/* Keys 0..n-1 on SD; keys 0..hot-1 read until hot and promoted to FD, so
 * they have twins. Returns with load_admit 1 (classic). */
static void twins_setup(tdb *t, int n, int hot)
{
    put_range(t, 0, n);
    for (int l = 0; l < 3; l++)
        cr_assert_eq(lsm_compact_level(t->db, l), KV_OK);
    lsm_stats s = stats_of(t);
    cr_assert_eq(s.levels[3].volume, LSM_TIER_SD);
    cr_assert_eq(s.levels[0].files + s.levels[1].files + s.levels[2].files, 0, "all on SD");
    uint64_t seq;
    for (int round = 0; round < 3; round++)
        for (int i = 0; i < hot; i++)
            cr_assert_eq(get_id(t, i, &seq, NULL), LSM_TIER_SD);
    lsm_promo_sync(t->db);
    s = stats_of(t);
    cr_assert_eq(s.promoted_recs, (uint64_t)hot, "promoted %llu",
                 (unsigned long long)s.promoted_recs);
    cr_assert_eq(s.twin_entries, (uint64_t)hot);
    for (int i = 0; i < hot; i++) {
        uint64_t tw;
        cr_assert_eq(get_id(t, i, &seq, NULL), LSM_TIER_FD, "key %d promoted", i);
        cr_assert(twin_of(t, i, &tw) && tw == seq, "twin of %d has the promoted seqno", i);
    }
}

Test(nhc_routing, load_admit_zero_serves_twins_from_sd)
{
    tdb *t = t_open("nhc-route");
    twins_setup(t, 1000, 20);
    nhc_force(t->o.nhc, 0.0, false);
    uint64_t seq, tw;
    for (int i = 0; i < 20; i++) {
        cr_assert_eq(get_id(t, i, &seq, NULL), LSM_TIER_SD, "twin %d sent to SD", i);
        cr_assert(twin_of(t, i, &tw) && tw == seq);
    }
    cr_assert_eq(get_id(t, 500, &seq, NULL), LSM_TIER_SD, "not a twin: SD anyway");
    lsm_stats s = stats_of(t);
    cr_assert_eq(s.nhc_routed_sd, 20);
    cr_assert_eq(s.nhc_fallbacks, 0);
    nhc_force(t->o.nhc, 1.0, true);
    for (int i = 0; i < 20; i++)
        cr_assert_eq(get_id(t, i, &seq, NULL), LSM_TIER_FD, "load_admit 1 keeps twin %d on FD", i);
    cr_assert_eq(stats_of(t).nhc_routed_sd, 20);
    t_close(t);
}

Test(nhc_routing, reads_sent_to_sd_never_return_an_older_version)
{
    tdb *t = t_open("nhc-newer");
    twins_setup(t, 1000, 40);
    nhc_force(t->o.nhc, 0.0, false);
    uint64_t newest[40] = {0}, seq, tw;
    for (int i = 0; i < 40; i++)
        get_id(t, i, &newest[i], NULL);
    /* newer versions after promotion: flushed to L0, or only in the WAL */
    for (int i = 0; i < 40; i += 2)
        newest[i] = overwrite(t, i, i % 4 == 0);
    for (int i = 0; i < 40; i += 2)
        cr_assert(!twin_of(t, i, &tw), "a write removes twin %d", i);
    for (int i = 0; i < 40; i += 4) { /* flushed: the newest is on FD */
        cr_assert_eq(get_id(t, i, &seq, NULL), LSM_TIER_FD);
        cr_assert_eq(seq, newest[i], "key %d: got seqno %llu, newest %llu", i,
                     (unsigned long long)seq, (unsigned long long)newest[i]);
    }
    for (int i = 1; i < 40; i += 2) {
        cr_assert_eq(get_id(t, i, &seq, NULL), LSM_TIER_SD);
        cr_assert_eq(seq, newest[i]);
    }
    /* compact FD down: newer versions and promoted copies move towards SD */
    for (int l = 0; l < 3; l++)
        cr_assert_eq(lsm_compact_level(t->db, l), KV_OK);
    for (int i = 0; i < 40; i += 4) {
        get_id(t, i, &seq, NULL);
        cr_assert_eq(seq, newest[i], "after compaction key %d", i);
    }
    lsm_stats s = stats_of(t);
    cr_assert_lt(s.twin_entries, 20, "compaction into SD ended twins (%llu left)",
                 (unsigned long long)s.twin_entries);
    t_close(t);
}

Test(nhc_routing, stale_entry_falls_back_to_fd_and_is_repaired)
{
    tdb *t = t_open("nhc-stale");
    twins_setup(t, 1000, 10);
    nhc_force(t->o.nhc, 0.0, false);
    char k[KLEN + 1];
    uint64_t seq, tw, sd_seq;
    /* an entry claiming a seqno SD does not hold (older copy on SD) */
    get_id(t, 600, &sd_seq, NULL);
    key_of(k, 600);
    lsm_twin_put(t->db->twin, k, KLEN, sd_seq + 100000);
    cr_assert_eq(get_id(t, 600, &seq, NULL), LSM_TIER_SD);
    cr_assert_eq(seq, sd_seq);
    cr_assert(!twin_of(t, 600, &tw), "repaired");
    /* an entry for a key SD does not hold at all */
    uint64_t fseq = overwrite(t, 5000, true);
    key_of(k, 5000);
    lsm_twin_put(t->db->twin, k, KLEN, fseq);
    cr_assert_eq(get_id(t, 5000, &seq, NULL), LSM_TIER_FD, "absent on SD: FD-first path");
    cr_assert_eq(seq, fseq);
    cr_assert(!twin_of(t, 5000, &tw), "repaired");
    cr_assert_eq(stats_of(t).nhc_fallbacks, 2);
    t_close(t);
}

Test(nhc_routing, multiget_routes_and_falls_back)
{
    tdb *t = t_open("nhc-multi");
    twins_setup(t, 1000, 16);
    nhc_force(t->o.nhc, 0.0, false);
    uint64_t newest[16];
    for (int i = 0; i < 16; i++)
        get_id(t, i, &newest[i], NULL);
    for (int i = 0; i < 16; i += 3)
        newest[i] = overwrite(t, i, true);
    char keys[17][KLEN + 1];
    const void *kp[17];
    size_t kl[17];
    for (int i = 0; i < 17; i++) {
        key_of(keys[i], i < 16 ? i : 900);
        kp[i] = keys[i];
        kl[i] = KLEN;
    }
    lsm_rec out[17];
    lsm_tier tiers[17];
    kv_err errs[17];
    cr_assert_eq(lsm_multiget(t->db, 17, kp, kl, out, tiers, errs), KV_OK);
    for (int i = 0; i < 17; i++) {
        cr_assert_eq(errs[i], KV_OK);
        if (i < 16) {
            cr_assert_eq(out[i].seqno, newest[i], "key %d", i);
            cr_assert_eq(tiers[i], i % 3 == 0 ? LSM_TIER_FD : LSM_TIER_SD, "key %d", i);
        }
        lsm_rec_free(&out[i]);
    }
    t_close(t);
}

Test(nhc_routing, data_admit_off_gates_promotion)
{
    tdb *t = t_open("nhc-admit");
    put_range(t, 0, 1000);
    for (int l = 0; l < 3; l++)
        cr_assert_eq(lsm_compact_level(t->db, l), KV_OK);
    nhc_force(t->o.nhc, 1.0, false);
    uint64_t seq;
    for (int round = 0; round < 3; round++)
        for (int i = 0; i < 20; i++)
            cr_assert_eq(get_id(t, i, &seq, NULL), LSM_TIER_SD);
    lsm_promo_sync(t->db);
    cr_assert_eq(stats_of(t).promoted_recs, 0, "data_admit off: no promotion");
    nhc_force(t->o.nhc, 1.0, true);
    for (int round = 0; round < 3; round++)
        for (int i = 0; i < 20; i++)
            get_id(t, i, &seq, NULL);
    lsm_promo_sync(t->db);
    cr_assert_eq(stats_of(t).promoted_recs, 20, "data_admit on again: promoted");
    t_close(t);
}

Test(nhc_routing, the_scheduler_sees_per_volume_reads_and_misses)
{
    tdb *t = t_open("nhc-feed");
    twins_setup(t, 1000, 10); /* 30 SD misses + 10 FD reads so far */
    nhc_force(t->o.nhc, 0.0, false);
    uint64_t seq;
    for (int i = 0; i < 10; i++)
        get_id(t, i, &seq, NULL);                               /* 10 routed SD reads: not misses */
    cr_assert_eq(nhc_tick(t->o.nhc, 1 + 5000000000ull), KV_OK); /* closes the window */
    nhc_stats s;
    nhc_get_stats(t->o.nhc, &s);
    cr_assert_eq(s.dev[NHC_DEV_FD].reads, 10);
    cr_assert_eq(s.dev[NHC_DEV_SD].reads, 40);
    cr_assert_float_eq(s.miss_ratio, 30.0 / 50.0, 1e-9);
    cr_assert(s.forced);
    cr_assert_eq(s.load_admit, 0.0);
    t_close(t);
}

/* ---- RALT keeps learning after its buffer overflowed ---- */

/*
 * NHC tunes again after a workload change only once HotRAP promoted the new
 * hot set, which needs RALT to learn it. An access that finds RALT's buffer
 * at its cap (4x, grown while a slow flush ran) is dropped; it must still
 * flush the buffer when no flush runs any more, or the table never changes
 * again (measured: every promotion candidate then dropped as not hot, for
 * the rest of nhc_bench's workload-change run). A hot-range reader blocked
 * in its callback holds the table's lock, so a flush started meanwhile holds
 * the flush lock until the reader is let go.
 */
typedef struct ralt_hold {
    ralt *r;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool entered, release;
} ralt_hold;

static void hold_cb(void *arg, const void *key, size_t klen, uint32_t vlen)
{
    (void)key, (void)klen, (void)vlen;
    ralt_hold *h = arg;
    pthread_mutex_lock(&h->mu);
    h->entered = true;
    pthread_cond_broadcast(&h->cv);
    while (!h->release)
        pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
}

static void *hold_reader(void *arg)
{
    ralt_hold *h = arg;
    cr_assert_eq(ralt_hot_range(h->r, "a", 1, "z", 1, hold_cb, h), KV_OK);
    return NULL;
}

static void *hold_flusher(void *arg)
{
    ralt_hold *h = arg;
    cr_assert_eq(ralt_flush(h->r), KV_OK);
    return NULL;
}

static size_t run_files(const char *dir)
{
    size_t n = 0;
    DIR *d = opendir(dir);
    for (struct dirent *de; d && (de = readdir(d));)
        n += strstr(de->d_name, ".sst") != NULL;
    if (d)
        closedir(d);
    return n;
}

Test(ralt, flushes_again_after_its_buffer_overflowed)
{
    char *dir = lt_mkdtemp("ralt-overflow"), rdir[300];
    snprintf(rdir, sizeof(rdir), "%s/ralt", dir);
    ralt_opts o = {.dir = rdir, .buf_entries = 8};
    ralt_hold h = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    cr_assert_eq(ralt_open(&h.r, &o), KV_OK);
    ralt_access(h.r, "hot", 3, 10); /* seen twice: stable, so the range reader finds it */
    ralt_access(h.r, "hot", 3, 10);
    cr_assert_eq(ralt_flush(h.r), KV_OK);
    cr_assert(ralt_is_hot(h.r, "hot", 3));
    pthread_t reader, flusher;
    pthread_create(&reader, NULL, hold_reader, &h);
    pthread_mutex_lock(&h.mu);
    while (!h.entered)
        pthread_cond_wait(&h.cv, &h.mu);
    pthread_mutex_unlock(&h.mu);
    ralt_access(h.r, "b0", 2, 10); /* something for the flush to write */
    size_t files = run_files(rdir);
    pthread_create(&flusher, NULL, hold_flusher, &h);
    while (run_files(rdir) == files) /* its new run is written: it holds the flush lock */
        sched_yield();
    char k[16];
    for (int i = 0; i < 40; i++) { /* fills the buffer to its cap (32), then dropped */
        snprintf(k, sizeof(k), "c%02d", i);
        ralt_access(h.r, k, strlen(k), 10);
    }
    pthread_mutex_lock(&h.mu);
    h.release = true;
    pthread_cond_broadcast(&h.cv);
    pthread_mutex_unlock(&h.mu);
    pthread_join(reader, NULL);
    pthread_join(flusher, NULL);
    ralt_stats before, after;
    ralt_stats_get(h.r, &before);
    ralt_access(h.r, "d", 1, 10); /* dropped, but flushes the full buffer */
    ralt_stats_get(h.r, &after);
    cr_assert_eq(after.entries, before.entries + 32, "entries %llu -> %llu",
                 (unsigned long long)before.entries, (unsigned long long)after.entries);
    ralt_close(h.r);
    lt_rmrf(dir);
    free(dir);
}
