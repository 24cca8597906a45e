/* SPDX-License-Identifier: MIT */
/*
 * Tests of the LSM db against an in-memory model: ~100k random puts,
 * deletes and TTL puts appended to the WAL, a test-side memtable flushed as
 * sorted runs, background and forced compactions, close + reopen (WAL
 * replay) along the way; every lookup must match the model. Runs on both
 * I/O paths, with a compaction routing hook, and with skewed reads so that
 * HotRAP promotes and retains records while writes race it. Also: L0 highest-seqno
 * lookups, concurrent group commit, readers racing compactions.
 */
#include "lsm_test_util.h"

#include "tests/kv_testfw.h"
#include <pthread.h>

#include "common/clock.h"
#include "node/lsm/lsm_int.h"

#define NKEYS 10000
#define KLEN 7

typedef struct mrec {
    bool present;
    uint8_t type;
    uint64_t seq, expire;
} mrec;

typedef struct world {
    char *dir, fd[300], sd[300];
    lsm_opts o;
    lsm_db *db;
    mrec model[NKEYS], mem[NKEYS];
    uint64_t seq, now, rng;
    uint8_t vbuf[1024];
    int hot_keys; /* > 0: 3 reads in 4 go to keys [0, hot_keys) (HotRAP) */
} world;

static void key_of(char *k, int id)
{
    snprintf(k, KLEN + 1, "k%06d", id);
}

static size_t vlen_of(uint64_t seq)
{
    return (size_t)(seq * 7 % 400);
}

static void fill_value(uint8_t *v, uint64_t seq)
{
    for (size_t j = 0; j < vlen_of(seq); j++)
        v[j] = (uint8_t)(seq * 13 + j);
}

static kv_err replay(void *arg, const lsm_rec *r)
{
    world *w = arg;
    cr_assert_eq(r->klen, KLEN);
    char k[KLEN + 1] = {0};
    memcpy(k, r->key, KLEN);
    int id = atoi(k + 1);
    cr_assert(id >= 0 && id < NKEYS);
    if (!w->mem[id].present || w->mem[id].seq < r->seqno)
        w->mem[id] = (mrec){true, r->type, r->seqno, r->expire_at};
    if (r->type == LSM_PUT) {
        cr_assert_eq(r->vlen, vlen_of(r->seqno));
        fill_value(w->vbuf, r->seqno);
        cr_assert(r->vlen == 0 || memcmp(r->value, w->vbuf, r->vlen) == 0);
    }
    return KV_OK;
}

static void w_open(world *w)
{
    memset(w->mem, 0, sizeof(w->mem));
    kv_err rv = lsm_open(&w->db, &w->o, replay, w);
    cr_assert_eq(rv, KV_OK, "lsm_open: %s", kv_strerror(rv));
    cr_assert_eq(lsm_last_seqno(w->db), w->seq, "last seqno %llu want %llu",
                 (unsigned long long)lsm_last_seqno(w->db), (unsigned long long)w->seq);
}

static world *w_new(const char *tag, bool uring, unsigned threads)
{
    world *w = calloc(1, sizeof(*w));
    w->dir = lt_mkdtemp(tag);
    snprintf(w->fd, sizeof(w->fd), "%s/fd", w->dir);
    snprintf(w->sd, sizeof(w->sd), "%s/sd", w->dir);
    lsm_opts_default(&w->o);
    w->o.fast_dir = w->fd;
    w->o.slow_dir = w->sd;
    w->o.fast_mb = 1;
    w->o.block_size = 1024;
    w->o.sync = LSM_SYNC_NONE;
    w->o.disable_io_uring = !uring;
    w->o.compaction_threads = threads;
    w->rng = 42;
    w->now = kv_wall_ms();
    w_open(w);
    return w;
}

static void w_free(world *w)
{
    lsm_close(w->db);
    lt_rmrf(w->dir);
    free(w->dir);
    free(w);
}

static bool visible(const mrec *m, uint64_t now)
{
    return m->present && m->type == LSM_PUT && (m->expire == 0 || m->expire > now);
}

/* Compares the db's answer for id (memtable first) with the model. */
static void check_one(world *w, int id, kv_err rv, const lsm_rec *r)
{
    const mrec *want = &w->model[id];
    if (w->mem[id].present) {
        cr_assert_eq(w->mem[id].seq, want->seq, "key %d mem seq %llu model %llu last %llu", id,
                     (unsigned long long)w->mem[id].seq, (unsigned long long)want->seq,
                     (unsigned long long)w->seq);
        return;
    }
    cr_assert(rv == KV_OK || rv == KV_NOT_FOUND, "key %d: %s", id, kv_strerror(rv));
    mrec got = {0};
    if (rv == KV_OK)
        got = (mrec){true, r->type, r->seqno, r->expire_at};
    bool gv = visible(&got, w->now), wv = visible(want, w->now);
    cr_assert_eq(gv, wv, "key %d: visible %d want %d (seq %llu want %llu)", id, gv, wv,
                 (unsigned long long)got.seq, (unsigned long long)want->seq);
    if (!wv)
        return;
    cr_assert_eq(got.seq, want->seq, "key %d seq", id);
    cr_assert_eq(r->vlen, vlen_of(got.seq));
    fill_value(w->vbuf, got.seq);
    cr_assert(r->vlen == 0 || memcmp(r->value, w->vbuf, r->vlen) == 0, "key %d value", id);
    cr_assert_eq(r->version, got.seq * 2);
}

static void check_get(world *w, int id)
{
    char k[KLEN + 1];
    key_of(k, id);
    lsm_rec r;
    lsm_tier t = LSM_TIER_NONE;
    kv_err rv = lsm_get(w->db, k, KLEN, &r, &t);
    check_one(w, id, rv, &r);
    if (rv == KV_OK) {
        cr_assert(t == LSM_TIER_FD || t == LSM_TIER_SD);
        lsm_rec_free(&r);
    }
}

static void check_all(world *w)
{
    enum { B = 64 };
    char keys[B][KLEN + 1];
    const void *kp[B];
    size_t kl[B];
    lsm_rec out[B];
    lsm_tier served[B];
    kv_err errs[B];
    for (int base = 0; base < NKEYS; base += B) {
        int cnt = NKEYS - base < B ? NKEYS - base : B;
        for (int i = 0; i < cnt; i++) {
            key_of(keys[i], base + i);
            kp[i] = keys[i];
            kl[i] = KLEN;
        }
        cr_assert_eq(lsm_multiget(w->db, (size_t)cnt, kp, kl, out, served, errs), KV_OK);
        for (int i = 0; i < cnt; i++) {
            check_one(w, base + i, errs[i], &out[i]);
            if (errs[i] == KV_OK)
                lsm_rec_free(&out[i]);
        }
    }
}

static void do_flush(world *w)
{
    lsm_rec *run = calloc(NKEYS, sizeof(*run));
    char(*keys)[KLEN + 1] = calloc(NKEYS, KLEN + 1);
    uint8_t *vals = malloc((size_t)NKEYS * 400);
    size_t n = 0;
    for (int id = 0; id < NKEYS; id++) {
        const mrec *m = &w->mem[id];
        if (!m->present)
            continue;
        key_of(keys[n], id);
        fill_value(vals + n * 400, m->seq);
        run[n] = (lsm_rec){.key = keys[n],
                           .klen = KLEN,
                           .value = vals + n * 400,
                           .vlen = m->type == LSM_PUT ? vlen_of(m->seq) : 0,
                           .version = m->seq * 2,
                           .seqno = m->seq,
                           .expire_at = m->expire,
                           .type = m->type};
        n++;
    }
    uint64_t gen = lsm_flush_generation(w->db);
    kv_err rv = lsm_flush(w->db, run, n, w->seq);
    cr_assert_eq(rv, KV_OK, "flush: %s", kv_strerror(rv));
    cr_assert_eq(lsm_flush_generation(w->db), gen + 1);
    memset(w->mem, 0, sizeof(w->mem));
    free(run);
    free(keys);
    free(vals);
}

static void do_write(world *w, int id, uint8_t type, uint64_t expire)
{
    char k[KLEN + 1];
    key_of(k, id);
    uint64_t seq = ++w->seq;
    fill_value(w->vbuf, seq);
    lsm_rec r = {.key = k,
                 .klen = KLEN,
                 .value = w->vbuf,
                 .vlen = type == LSM_PUT ? vlen_of(seq) : 0,
                 .version = seq * 2,
                 .seqno = seq,
                 .expire_at = expire,
                 .type = type};
    kv_err rv = lsm_wal_append(w->db, &r, 1);
    cr_assert_eq(rv, KV_OK, "append: %s", kv_strerror(rv));
    w->model[id] = w->mem[id] = (mrec){true, type, seq, expire};
}

/* Runs ops random operations; *st (may be NULL) gets the stats taken before
 * the final close + reopen. */
static void run_model(world *w, int ops, lsm_stats *st)
{
    int writes = 0;
    for (int op = 1; op <= ops; op++) {
        int r = (int)(lt_rand(&w->rng) % 100), id = (int)(lt_rand(&w->rng) % NKEYS);
        if (r < 55)
            do_write(w, id, LSM_PUT, 0);
        else if (r < 65)
            do_write(w, id, LSM_PUT, (r & 1) ? 1 : w->now + 3600 * 1000);
        else if (r < 80)
            do_write(w, id, LSM_DELETE, 0);
        else
            check_get(w, w->hot_keys && lt_rand(&w->rng) % 4 ? id % w->hot_keys : id);
        if (w->hot_keys && op % 5000 == 0)
            lsm_promo_sync(w->db); /* promote whatever the buffer holds */
        if (r < 80 && ++writes % 1500 == 0)
            do_flush(w);
        if (op % 25000 == 0) {
            if ((op / 25000) % 2 || op == ops) {
                cr_assert_eq(lsm_compact_all(w->db), KV_OK);
            } else {
                lsm_close(w->db);
                w_open(w);
            }
            check_all(w);
        }
    }
    cr_assert_eq(lsm_compact_wait_idle(w->db), KV_OK);
    check_all(w);
    if (st)
        cr_assert_eq(lsm_stats_get(w->db, st), KV_OK);
    lsm_close(w->db);
    w_open(w);
    check_all(w);
}

static void log_stats(const lsm_stats *sp)
{
    lsm_stats s = *sp;
    for (int l = 0; l < LSM_MAX_LEVELS; l++)
        cr_log_info("L%d: %llu files %llu bytes (%s)", l, (unsigned long long)s.levels[l].files,
                    (unsigned long long)s.levels[l].bytes,
                    s.levels[l].volume == LSM_TIER_SD ? "SD" : "FD");
    cr_log_info("reads fd %llu sd %llu, write-amp %.2f, compactions %llu, io_uring %d",
                (unsigned long long)s.reads_fd, (unsigned long long)s.reads_sd, s.write_amp,
                (unsigned long long)s.compactions, s.io_uring);
}

Test(model, random_ops_io_uring_with_recovery, .timeout = 200)
{
    world *w = w_new("model", true, 2);
    lsm_stats s;
    run_model(w, 100000, &s);
    log_stats(&s);
    cr_assert_gt(s.compactions, 0);
    cr_assert_gt(s.reads_sd, 0, "nothing was served from the slow volume");
    cr_assert_gt(s.reads_fd, 0);
    cr_assert_gt(s.levels[3].files + s.levels[4].files, 0);
    cr_assert_eq(s.levels[3].volume, LSM_TIER_SD);
    cr_assert_eq(s.levels[1].volume, LSM_TIER_FD);
    cr_assert_gt(s.write_amp, 1.0);
    cr_assert_gt(s.sd.write_bytes, 0);
    cr_assert_gt(s.fd.reads, 0);
    w_free(w);
}

Test(model, random_ops_pread_fallback, .timeout = 200)
{
    world *w = w_new("modelp", false, 1);
    lsm_stats s;
    run_model(w, 30000, &s);
    cr_assert(!s.io_uring);
    cr_assert_gt(s.compactions, 0);
    w_free(w);
}

Test(model, random_ops_hotrap_promotion_and_retention, .timeout = 200)
{
    world *w = calloc(1, sizeof(*w));
    w->dir = lt_mkdtemp("hotrap");
    snprintf(w->fd, sizeof(w->fd), "%s/fd", w->dir);
    snprintf(w->sd, sizeof(w->sd), "%s/sd", w->dir);
    lsm_opts_default(&w->o);
    w->o.fast_dir = w->fd;
    w->o.slow_dir = w->sd;
    w->o.fast_mb = 1;
    w->o.block_size = 1024;
    w->o.sync = LSM_SYNC_NONE;
    w->o.compaction_threads = 2;
    w->o.promo_buf_kb = 16;
    w->hot_keys = 300;
    w->rng = 11;
    w->now = kv_wall_ms();
    w_open(w);
    lsm_stats s;
    run_model(w, 60000, &s);
    log_stats(&s);
    cr_log_info("promoted %llu retained %llu dropped %llu ralt %llu/%llu",
                (unsigned long long)s.promoted_recs, (unsigned long long)s.retained_recs,
                (unsigned long long)s.promo_dropped, (unsigned long long)s.ralt_stable,
                (unsigned long long)s.ralt_entries);
    cr_assert(s.hotrap);
    cr_assert_gt(s.promoted_recs, 0);
    cr_assert_gt(s.retained_recs, 0);
    w_free(w);
}

/* Appended keys under HotRAP: after a random load pushed to SD, writes
 * append new keys above the loaded ones while 3 reads in 4 go to a hot set
 * among the loaded keys (so promoted files, spanning the hot set, keep
 * arriving in L0), and every fifth flush holds updates of hot keys and
 * deletes of appended ones instead (so flushes also overlap promoted
 * copies of older versions, and files moved earlier). Flushes of appended keys
 * then move to L1 past the promoted files before them (l0_movable), and
 * every read, check_all and reopen must still see the model's record. */
Test(model, appended_keys_move_past_promoted_copies, .timeout = 200)
{
    world *w = w_new("append", true, 2);
    lsm_close(w->db);
    w->o.hotrap = true;
    w->o.promo_buf_kb = 16;
    w->hot_keys = 300;
    w_open(w);
    enum { LOADED = 4000 };
    for (int i = 0; i < LOADED; i++) {
        do_write(w, (int)((uint64_t)i * 7919 % LOADED), LSM_PUT, 0);
        if ((i + 1) % 1000 == 0)
            do_flush(w);
    }
    cr_assert_eq(lsm_compact_all(w->db), KV_OK);
    int next = LOADED, writes = 0;
    lsm_stats s;
    uint64_t past = 0, promoted = 0;
    for (int op = 1; next < NKEYS; op++) {
        int r = (int)(lt_rand(&w->rng) % 100);
        bool updates = writes / 400 % 5 == 4; /* every fifth flush: no appended keys */
        if (r < 48 && !updates) {
            do_write(w, next++, LSM_PUT, 0);
        } else if (r < 40) {
            do_write(w, (int)(lt_rand(&w->rng) % (uint64_t)w->hot_keys), LSM_PUT, 0);
        } else if (r < 48) {
            do_write(w, LOADED + (int)(lt_rand(&w->rng) % (uint64_t)(next - LOADED)), LSM_DELETE,
                     0);
        } else {
            int id = lt_rand(&w->rng) % 4 ? (int)(lt_rand(&w->rng) % (uint64_t)w->hot_keys)
                                          : (int)(lt_rand(&w->rng) % (uint64_t)next);
            check_get(w, id);
        }
        if (r < 48 && ++writes % 400 == 0)
            do_flush(w);
        if (op % 2000 == 0)
            lsm_promo_sync(w->db);
        if (op % 5000 == 0) {
            check_all(w);
            cr_assert_eq(lsm_stats_get(w->db, &s), KV_OK); /* counters start at 0 on open */
            past += s.l0_moves_past;
            promoted += s.promoted_recs;
            lsm_close(w->db);
            w_open(w);
            check_all(w);
        }
    }
    bool dirty = false;
    for (int id = 0; id < NKEYS; id++)
        dirty |= w->mem[id].present;
    if (dirty)
        do_flush(w);
    cr_assert_eq(lsm_compact_wait_idle(w->db), KV_OK);
    check_all(w);
    cr_assert_eq(lsm_stats_get(w->db, &s), KV_OK);
    past += s.l0_moves_past;
    promoted += s.promoted_recs;
    log_stats(&s);
    cr_log_info("promoted %llu, L0 moves past older files %llu", (unsigned long long)promoted,
                (unsigned long long)past);
    cr_assert_gt(promoted, 0);
    cr_assert_gt(past, 0, "no flush moved past an older L0 file");
    lsm_close(w->db);
    w_open(w);
    check_all(w);
    w_free(w);
}

static _Atomic int routed;

static int retain_even(void *arg, const lsm_rec *r, int from_level)
{
    (void)arg;
    atomic_fetch_add(&routed, 1);
    return ((const char *)r->key)[KLEN - 1] % 2 == 0 ? from_level : from_level + 1;
}

Test(model, routing_hook_retains_records, .timeout = 200)
{
    world *w = calloc(1, sizeof(*w));
    w->dir = lt_mkdtemp("route");
    snprintf(w->fd, sizeof(w->fd), "%s/fd", w->dir);
    lsm_opts_default(&w->o);
    w->o.fast_dir = w->fd;
    w->o.fast_mb = 1;
    w->o.block_size = 1024;
    w->o.sync = LSM_SYNC_NONE;
    w->o.route = retain_even;
    w->rng = 7;
    w->now = kv_wall_ms();
    w_open(w);
    run_model(w, 30000, NULL);
    cr_assert_gt(atomic_load(&routed), 0, "route hook never called");
    w_free(w);
}

/* ---- L0 must take the highest seqno, not the newest file ---- */

Test(lookup, l0_highest_seqno_wins)
{
    world *w = calloc(1, sizeof(*w));
    w->dir = lt_mkdtemp("l0");
    lsm_opts_default(&w->o);
    w->o.fast_dir = w->dir;
    w->o.no_auto_compaction = true;
    w->o.sync = LSM_SYNC_NONE;
    cr_assert_eq(lsm_open(&w->db, &w->o, NULL, NULL), KV_OK);
    lsm_rec a = {.key = "k", .klen = 1, .value = "new", .vlen = 3, .seqno = 50, .type = LSM_PUT};
    cr_assert_eq(lsm_flush(w->db, &a, 1, 50), KV_OK);
    lsm_rec b = {.key = "k",
                 .klen = 1,
                 .value = "old",
                 .vlen = 3,
                 .seqno = 20,
                 .type = LSM_PUT,
                 .flags = LSM_F_PROMOTED};
    cr_assert_eq(lsm_flush(w->db, &b, 1, 60), KV_OK);
    cr_assert_eq(lsm_flush(w->db, &b, 1, 10), KV_INVALID_ARGUMENT, "seqno above max accepted");
    lsm_db *second = NULL;
    cr_assert_eq(lsm_open(&second, &w->o, NULL, NULL), KV_FAILED_PRECONDITION,
                 "a second handle opened a locked directory");
    cr_assert_null(second);
    lsm_rec r;
    cr_assert_eq(lsm_get(w->db, "k", 1, &r, NULL), KV_OK);
    cr_assert_eq(r.seqno, 50);
    cr_assert(memcmp(r.value, "new", 3) == 0);
    lsm_rec_free(&r);
    cr_assert_eq(lsm_get(w->db, "x", 1, &r, NULL), KV_NOT_FOUND);
    lsm_rec unsorted[2] = {a, a};
    unsorted[0].key = "z";
    cr_assert_eq(lsm_flush(w->db, unsorted, 2, 100), KV_INVALID_ARGUMENT);
    cr_assert_eq(lsm_compact_all(w->db), KV_OK); /* the merge keeps seqno 50 too */
    cr_assert_eq(lsm_get(w->db, "k", 1, &r, NULL), KV_OK);
    cr_assert_eq(r.seqno, 50);
    lsm_rec_free(&r);
    lsm_close(w->db);
    lt_rmrf(w->dir);
    free(w->dir);
    free(w);
}

/* ---- tombstones, expiry and WAL segment deletion ---- */

static void flush_range(lsm_db *db, int n, uint64_t seq0, uint8_t type, uint64_t expire)
{
    static char keys[1000][16];
    static lsm_rec run[1000];
    for (int i = 0; i < n; i++) {
        int kn = snprintf(keys[i], 16, "d%05d", i);
        run[i] = (lsm_rec){.key = keys[i],
                           .klen = (size_t)kn,
                           .value = keys[i],
                           .vlen = type == LSM_PUT ? (size_t)kn : 0,
                           .seqno = seq0 + (uint64_t)i,
                           .expire_at = expire,
                           .type = type};
    }
    cr_assert_eq(lsm_flush(db, run, (size_t)n, seq0 + (uint64_t)n - 1), KV_OK);
}

/* Flushes one L0 file of n records of ~210 bytes with keys "<p>%05d" and
 * seqnos from seq0 (WAL first, as the engine does). */
static void flush_file(lsm_db *db, char p, int n, uint64_t seq0)
{
    static char keys[4000][16], val[200];
    static lsm_rec run[4000];
    cr_assert_leq(n, 4000);
    for (int i = 0; i < n; i++) {
        int kn = snprintf(keys[i], 16, "%c%05d", p, i);
        run[i] = (lsm_rec){.key = keys[i],
                           .klen = (size_t)kn,
                           .value = val,
                           .vlen = sizeof(val),
                           .seqno = seq0 + (uint64_t)i,
                           .type = LSM_PUT};
    }
    cr_assert_eq(lsm_wal_append(db, run, (size_t)n), KV_OK);
    cr_assert_eq(lsm_flush(db, run, (size_t)n, seq0 + (uint64_t)n - 1), KV_OK);
    cr_assert_eq(lsm_compact_wait_idle(db), KV_OK);
}

static lsm_db *open_small(char *dir)
{
    lsm_opts o;
    lsm_opts_default(&o);
    o.fast_dir = dir;
    o.fast_mb = 1; /* L1 target 87 KiB: L0's byte trigger 87..349 KiB */
    o.sync = LSM_SYNC_NONE;
    lsm_db *db;
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_OK);
    return db;
}

/* L0 is due at l0_trigger files (issue 18: a flush larger than L1's target
 * no longer makes a one-file job while FD has room), or when its bytes pass
 * the room the FD levels leave, at most l0_trigger L1 targets: a large
 * flush must not sit on FD as a giant L0 file. */
Test(compaction, l0_waits_for_the_file_trigger_while_fd_has_room)
{
    char *dir = lt_mkdtemp("l0files");
    lsm_db *db = open_small(dir);
    lsm_stats s;
    for (int f = 0; f < 3; f++) { /* three files of ~95 KiB, each over L1's target */
        flush_file(db, (char)('a' + f), 450, 1 + (uint64_t)f * 450);
        cr_assert_eq(lsm_stats_get(db, &s), KV_OK);
        cr_assert_eq(s.levels[0].files, (uint64_t)f + 1, "L0 compacted at %d files", f + 1);
    }
    cr_assert_gt(s.levels[0].bytes, s.levels[1].target_bytes);
    cr_assert_eq(s.levels[0].target_bytes, s.levels[1].target_bytes * 4, "FD is empty");
    flush_file(db, 'd', 450, 1351); /* the fourth file: l0_trigger */
    cr_assert_eq(lsm_stats_get(db, &s), KV_OK);
    cr_assert_eq(s.levels[0].files, 0);
    lsm_rec r;
    cr_assert_eq(lsm_get(db, "a00007", 6, &r, NULL), KV_OK);
    lsm_rec_free(&r);
    lsm_close(db);
    lt_rmrf(dir);
    free(dir);
}

Test(compaction, l0_bytes_over_their_room_trigger_compaction)
{
    char *dir = lt_mkdtemp("l0bytes");
    lsm_db *db = open_small(dir);
    flush_file(db, 'b', 2000, 1); /* one L0 file of ~420 KiB */
    lsm_stats s;
    cr_assert_eq(lsm_stats_get(db, &s), KV_OK);
    cr_assert_eq(s.levels[0].files, 0, "L0 holds %llu bytes, its byte trigger is %llu",
                 (unsigned long long)s.levels[0].bytes,
                 (unsigned long long)s.levels[0].target_bytes);
    /* with ~1 MiB in the levels below, FD has no room left: L0's byte
     * trigger falls back to L1's target, and one ~95 KiB file is due */
    for (int f = 0; f < 3; f++)
        flush_file(db, (char)('c' + f), 2000, 2001 + (uint64_t)f * 2000);
    cr_assert_eq(lsm_stats_get(db, &s), KV_OK);
    cr_assert_eq(s.levels[0].target_bytes, s.levels[1].target_bytes, "FD is full");
    flush_file(db, 'x', 450, 8001);
    cr_assert_eq(lsm_stats_get(db, &s), KV_OK);
    cr_assert_eq(s.levels[0].files, 0);
    lsm_close(db);
    lt_rmrf(dir);
    free(dir);
}

Test(compaction, last_level_drops_tombstones_and_expired)
{
    char *dir = lt_mkdtemp("drop");
    lsm_opts o;
    lsm_opts_default(&o);
    o.fast_dir = dir;
    o.sync = LSM_SYNC_NONE;
    o.no_auto_compaction = true;
    lsm_db *db;
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_OK);
    flush_range(db, 1000, 1, LSM_PUT, 0);
    cr_assert_eq(lt_count(dir, ".wal"), 1, "WAL segments covered by the flush were kept");
    flush_range(db, 500, 2001, LSM_DELETE, 0); /* d0..d499 deleted */
    lsm_rec r;
    cr_assert_eq(lsm_get(db, "d00010", 6, &r, NULL), KV_OK);
    cr_assert_eq(r.type, LSM_DELETE, "tombstone must shadow the older put");
    lsm_rec_free(&r);
    cr_assert_eq(lsm_compact_all(db), KV_OK);
    lsm_stats s;
    cr_assert_eq(lsm_stats_get(db, &s), KV_OK);
    cr_assert_eq(s.levels[0].files, 0);
    cr_assert_gt(s.levels[1].files, 0);
    cr_assert_eq(lsm_get(db, "d00010", 6, &r, NULL), KV_NOT_FOUND, "tombstone kept at last level");
    cr_assert_eq(lsm_get(db, "d00700", 6, &r, NULL), KV_OK);
    lsm_rec_free(&r);
    flush_range(db, 1000, 3001, LSM_PUT, 1); /* everything overwritten by expired puts */
    cr_assert_eq(lsm_get(db, "d00700", 6, &r, NULL), KV_OK);
    cr_assert_eq(r.expire_at, 1); /* returned as is: the caller checks expiry */
    lsm_rec_free(&r);
    cr_assert_eq(lsm_compact_all(db), KV_OK);
    cr_assert_eq(lsm_stats_get(db, &s), KV_OK);
    for (int l = 0; l < LSM_MAX_LEVELS; l++)
        cr_assert_eq(s.levels[l].files, 0, "L%d still has files", l);
    cr_assert_eq(lt_count(dir, ".sst"), 0, "obsolete SSTs not deleted");
    cr_assert_eq(lsm_get(db, "d00700", 6, &r, NULL), KV_NOT_FOUND);
    lsm_close(db);
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_OK);
    cr_assert_eq(lsm_get(db, "d00700", 6, &r, NULL), KV_NOT_FOUND);
    cr_assert_eq(lsm_last_seqno(db), 3000 + 1000);
    lsm_close(db);
    lt_rmrf(dir);
    free(dir);
}

/* ---- concurrency ---- */

typedef struct cw {
    lsm_db *db;
    int t, n;
    _Atomic uint64_t *seq;
} cw;

static void *appender(void *arg)
{
    cw *c = arg;
    char k[32];
    for (int i = 0; i < c->n; i++) {
        int n = snprintf(k, sizeof(k), "t%d-%06d", c->t, i);
        uint64_t s = atomic_fetch_add(c->seq, 1) + 1;
        lsm_rec r = {.key = k,
                     .klen = (size_t)n,
                     .value = k,
                     .vlen = (size_t)n,
                     .seqno = s,
                     .type = LSM_PUT};
        cr_assert_eq(lsm_wal_append(c->db, &r, 1), KV_OK);
    }
    return NULL;
}

static kv_err count_rec(void *arg, const lsm_rec *r)
{
    (void)r;
    (*(int *)arg)++;
    return KV_OK;
}

static void group_commit(lsm_sync mode, int per_thread)
{
    char *dir = lt_mkdtemp("gc");
    lsm_opts o;
    lsm_opts_default(&o);
    o.fast_dir = dir;
    o.sync = mode;
    lsm_db *db;
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_OK);
    _Atomic uint64_t seq = 0;
    pthread_t th[4];
    cw c[4];
    for (int t = 0; t < 4; t++) {
        c[t] = (cw){db, t, per_thread, &seq};
        pthread_create(&th[t], NULL, appender, &c[t]);
    }
    for (int t = 0; t < 4; t++)
        pthread_join(th[t], NULL);
    lsm_stats s;
    lsm_stats_get(db, &s);
    cr_log_info("sync %d: %d appends, %llu WAL fsyncs", mode, 4 * per_thread,
                (unsigned long long)s.wal_fsyncs);
    if (mode == LSM_SYNC_ALWAYS)
        cr_assert_leq(s.wal_fsyncs, (uint64_t)(4 * per_thread));
    lsm_close(db);
    int n = 0;
    cr_assert_eq(lsm_open(&db, &o, count_rec, &n), KV_OK);
    cr_assert_eq(n, 4 * per_thread);
    cr_assert_eq(lsm_last_seqno(db), (uint64_t)(4 * per_thread));
    lsm_close(db);
    lt_rmrf(dir);
    free(dir);
}

Test(wal, group_commit_always)
{
    group_commit(LSM_SYNC_ALWAYS, 200);
}

Test(wal, group_commit_batch)
{
    group_commit(LSM_SYNC_BATCH, 5000);
}

typedef struct rd {
    lsm_db *db;
    _Atomic bool *stop;
    _Atomic uint64_t *checks;
} rd;

/* Readers: every record found must be self-consistent (value = key + seqno). */
static void *reader(void *arg)
{
    rd *c = arg;
    uint64_t rng = (uint64_t)(uintptr_t)c;
    char k[32], want[64];
    while (!atomic_load(c->stop)) {
        int n = snprintf(k, sizeof(k), "r%05d", (int)(lt_rand(&rng) % 2000));
        lsm_rec r;
        kv_err rv = lsm_get(c->db, k, (size_t)n, &r, NULL);
        cr_assert(rv == KV_OK || rv == KV_NOT_FOUND, "%s", kv_strerror(rv));
        if (rv != KV_OK)
            continue;
        int m = snprintf(want, sizeof(want), "%s@%llu", k, (unsigned long long)r.seqno);
        cr_assert_eq(r.vlen, (size_t)m);
        cr_assert(memcmp(r.value, want, (size_t)m) == 0);
        lsm_rec_free(&r);
        atomic_fetch_add(c->checks, 1);
    }
    return NULL;
}

Test(concurrency, readers_race_flush_and_compaction, .timeout = 120)
{
    char *dir = lt_mkdtemp("race");
    lsm_opts o;
    lsm_opts_default(&o);
    o.fast_dir = dir;
    o.fast_mb = 1;
    o.sync = LSM_SYNC_NONE;
    o.compaction_threads = 2;
    lsm_db *db;
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_OK);
    _Atomic bool stop = false;
    _Atomic uint64_t checks = 0;
    pthread_t th[2];
    rd c = {db, &stop, &checks};
    for (int t = 0; t < 2; t++)
        pthread_create(&th[t], NULL, reader, &c);
    uint64_t seq = 0;
    static char keys[2000][16], vals[2000][64];
    lsm_rec run[2000];
    for (int round = 0; round < 60; round++) {
        for (int i = 0; i < 2000; i++) {
            seq++;
            int kn = snprintf(keys[i], 16, "r%05d", i);
            int vn = snprintf(vals[i], 64, "%s@%llu", keys[i], (unsigned long long)seq);
            run[i] = (lsm_rec){.key = keys[i],
                               .klen = (size_t)kn,
                               .value = vals[i],
                               .vlen = (size_t)vn,
                               .seqno = seq,
                               .type = LSM_PUT};
        }
        cr_assert_eq(lsm_flush(db, run, 2000, seq), KV_OK);
    }
    cr_assert_eq(lsm_compact_wait_idle(db), KV_OK);
    atomic_store(&stop, true);
    for (int t = 0; t < 2; t++)
        pthread_join(th[t], NULL);
    cr_assert_gt(atomic_load(&checks), 0);
    lsm_rec r;
    cr_assert_eq(lsm_get(db, "r00010", 6, &r, NULL), KV_OK);
    cr_assert_eq(r.seqno, seq - 2000 + 11);
    lsm_rec_free(&r);
    lsm_close(db);
    lt_rmrf(dir);
    free(dir);
}
