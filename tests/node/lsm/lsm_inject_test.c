/* SPDX-License-Identifier: MIT */
/*
 * Fault injection into the LSM's volume layer (fault.c, lsm_fault_set): EIO
 * on reads and writes, short writes, failed fsyncs and truncations, ENOSPC
 * on create, a failed allocation. Whatever fails, the LSM acknowledges no
 * record it did not write, returns no wrong data (an error, never a miss
 * for a record it could not read), logs the fault with the file's name and
 * works again once the fault is gone. Also: the injected clock drives the
 * tombstone grace.
 */
#include "lsm_test_util.h"
#include "tests/kv_testclock.h"
#include "tests/kv_testlog.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>

#include "common/assert.h"
#include "common/clock.h"
#include "node/lsm/lsm_int.h"

static void disarm(void)
{
    lsm_fault_set(NULL);
}

TestSuite(inject, .fini = disarm);

/* Key <prefix><seq>, value lt_value(seq). */
static void rec_of(lsm_rec *r, char (*k)[16], char (*v)[64], char prefix, uint64_t seq)
{
    int kn = snprintf(*k, sizeof(*k), "%c%05llu", prefix, (unsigned long long)seq);
    lt_value(*v, sizeof(*v), seq);
    *r = (lsm_rec){.key = *k, .klen = (size_t)kn, .value = *v, .vlen = sizeof(*v), .seqno = seq};
    r->type = LSM_PUT;
}

static kv_err put(lsm_db *db, uint64_t seq)
{
    char k[16], v[64];
    lsm_rec r;
    rec_of(&r, &k, &v, 'k', seq);
    return lsm_wal_append(db, &r, 1);
}

/* Opens a db in dir and appends seqnos 1..n, noting which were acked. */
static lsm_db *open_put(const lsm_opts *o, bool *acked, uint64_t n)
{
    lsm_db *db;
    cr_assert_eq(lsm_open(&db, o, NULL, NULL), KV_OK);
    for (uint64_t s = 1; s <= n; s++)
        acked[s] = put(db, s) == KV_OK;
    return db;
}

/* Flushes keys <prefix><seq> for seq in [from, to) (the caller's memory
 * tier) with max_seqno max; expects want. */
static void flush_run(lsm_db *db, char prefix, uint64_t from, uint64_t to, uint64_t max,
                      kv_err want)
{
    size_t n = (size_t)(to - from);
    lsm_rec *run = calloc(n, sizeof(*run));
    char(*keys)[16] = calloc(n, 16);
    char(*vals)[64] = calloc(n, 64);
    for (size_t i = 0; i < n; i++)
        rec_of(&run[i], &keys[i], &vals[i], prefix, from + i);
    kv_err rv = lsm_flush(db, run, n, max);
    cr_assert_eq(rv, want, "flush: %s, wanted %s", kv_strerror(rv), kv_strerror(want));
    free(run);
    free(keys);
    free(vals);
}

/* Every key <prefix><seq>, seq in [from, to), reads back with its value,
 * or fails with want (never a miss, never another value). */
static void read_run(lsm_db *db, char prefix, uint64_t from, uint64_t to, kv_err want)
{
    for (uint64_t s = from; s < to; s++) {
        char k[16], v[64];
        lsm_rec want_rec, r;
        rec_of(&want_rec, &k, &v, prefix, s);
        kv_err rv = lsm_get(db, k, want_rec.klen, &r, NULL);
        cr_assert_eq(rv, want, "%s: %s", k, kv_strerror(rv));
        if (rv != KV_OK)
            continue;
        cr_assert(r.vlen == 64 && memcmp(r.value, v, 64) == 0, "%s: wrong value", k);
        lsm_rec_free(&r);
    }
}

/* Replay check: every record carries its own value; acked[seq] says which
 * may come back (and must). */
typedef struct replayed {
    bool seen[512];
} replayed;

static kv_err check_replay(void *arg, const lsm_rec *r)
{
    replayed *c = arg;
    char want[64];
    lt_value(want, sizeof(want), r->seqno);
    cr_assert(r->seqno < 512 && r->vlen == 64 && memcmp(r->value, want, 64) == 0,
              "replayed record %llu is wrong", (unsigned long long)r->seqno);
    c->seen[r->seqno] = true;
    return KV_OK;
}

static void reopen_expect(const lsm_opts *o, const bool *acked, uint64_t upto)
{
    replayed c = {0};
    lsm_db *db;
    kv_err rv = lsm_open(&db, o, check_replay, &c);
    cr_assert_eq(rv, KV_OK, "reopen: %s", kv_strerror(rv));
    for (uint64_t s = 1; s <= upto; s++)
        cr_assert_eq(c.seen[s], acked[s], "seqno %llu: acknowledged %d, replayed %d",
                     (unsigned long long)s, acked[s], c.seen[s]);
    lsm_close(db);
}

/* A read error during recovery is not a torn frame: open fails, the log is
 * left whole, and it opens with every record once reads work. (It used to
 * be truncated at the unreadable frame.) */
Test(inject, wal_read_error_at_open_fails_and_keeps_the_log)
{
    char *dir = lt_mkdtemp("iwalr");
    lsm_opts o;
    lt_opts(&o, dir, LSM_SYNC_NONE);
    bool acked[512] = {false};
    lsm_db *db = open_put(&o, acked, 100);
    lsm_close(db);
    char *wal = lt_find(dir, ".wal", 1);
    long size = lt_size(wal);
    lsm_fault_set(&(lsm_fault){.ops = LSM_FOP_READ, .path_has = ".wal", .err = EIO});
    char logp[300];
    snprintf(logp, sizeof(logp), "%s.log", dir);
    int saved = cap_begin(logp);
    kv_err rv = lsm_open(&db, &o, NULL, NULL);
    char *log = cap_end(saved, logp);
    cr_assert_eq(rv, KV_INTERNAL, "open with an unreadable WAL: %s", kv_strerror(rv));
    cr_assert(strstr(log, strrchr(wal, '/') + 1) != NULL, "the log does not name the WAL");
    cr_assert_eq(lt_size(wal), size, "the WAL was cut");
    lsm_fault_set(NULL);
    reopen_expect(&o, acked, 100);
    free(log);
    free(wal);
    lt_rmrf(dir);
    free(dir);
}

/* EIO and ENOSPC on WAL writes (whole or short): the append fails with
 * INTERNAL / RESOURCE_EXHAUSTED, the log names the segment, later appends
 * work, and a restart replays exactly the acknowledged records. */
Test(inject, wal_write_errors_are_not_acknowledged)
{
    static const struct {
        int err;
        bool short_write;
        lsm_sync sync;
        kv_err want;
    } cases[] = {{EIO, false, LSM_SYNC_ALWAYS, KV_INTERNAL},
                 {EIO, true, LSM_SYNC_ALWAYS, KV_INTERNAL},
                 {ENOSPC, true, LSM_SYNC_BATCH, KV_RESOURCE_EXHAUSTED},
                 {EIO, true, LSM_SYNC_NONE, KV_INTERNAL}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char *dir = lt_mkdtemp("iwalw");
        lsm_opts o;
        lt_opts(&o, dir, cases[c].sync);
        bool acked[512] = {false};
        lsm_db *db = open_put(&o, acked, 50);
        uint64_t s = 51;
        lsm_fault_set(&(lsm_fault){.ops = LSM_FOP_WRITE,
                                   .path_has = ".wal",
                                   .times = 5,
                                   .err = cases[c].err,
                                   .short_write = cases[c].short_write});
        char logp[300];
        snprintf(logp, sizeof(logp), "%s.log", dir);
        int saved = cap_begin(logp);
        for (; s <= 55; s++) {
            kv_err rv = put(db, s);
            cr_assert_eq(rv, cases[c].want, "case %zu: %s", c, kv_strerror(rv));
        }
        char *log = cap_end(saved, logp);
        cr_assert(strstr(log, ".wal write of") != NULL, "case %zu: no log line naming the WAL", c);
        for (; s <= 80; s++) /* the rule is spent: the fault cleared */
            acked[s] = put(db, s) == KV_OK;
        for (uint64_t i = 56; i <= 80; i++)
            cr_assert(acked[i], "case %zu: append %llu after the fault", c, (unsigned long long)i);
        lsm_close(db);
        lsm_fault_set(NULL);
        reopen_expect(&o, acked, 80);
        free(log);
        lt_rmrf(dir);
        free(dir);
    }
}

/* A half-written group that cannot be truncated away (the truncate fails
 * too) would sit in the middle of the segment: the WAL refuses appends
 * until a flush covers it, then writes resume, and a restart is clean. */
Test(inject, untruncatable_failed_write_stops_appends_until_a_flush)
{
    char *dir = lt_mkdtemp("iwalt");
    lsm_opts o;
    lt_opts(&o, dir, LSM_SYNC_ALWAYS);
    bool acked[512] = {false};
    lsm_db *db = open_put(&o, acked, 20);
    lsm_fault_set(&(lsm_fault){.ops = LSM_FOP_WRITE | LSM_FOP_TRUNCATE,
                               .path_has = ".wal",
                               .times = 2,
                               .short_write = true});
    cr_assert_eq(put(db, 21), KV_INTERNAL);
    cr_assert_eq(lsm_fault_hits(), 2, "the write and its truncate failed");
    cr_assert_eq(put(db, 22), KV_INTERNAL, "an append after the torn write was taken");
    flush_run(db, 'k', 1, 21, 22, KV_OK); /* the caller's memory tier: 1..20 */
    for (uint64_t s = 1; s <= 22; s++)
        acked[s] = false; /* flushed: in the SST now, not replayed */
    for (uint64_t s = 23; s <= 40; s++) {
        acked[s] = put(db, s) == KV_OK;
        cr_assert(acked[s], "append %llu after the flush", (unsigned long long)s);
    }
    lsm_close(db);
    lsm_fault_set(NULL);
    reopen_expect(&o, acked, 40);
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_OK);
    read_run(db, 'k', 1, 21, KV_OK);
    lsm_close(db);
    lt_rmrf(dir);
    free(dir);
}

/* Sync batch acknowledges before its fsync: when that fsync fails, the
 * records it should have made durable may be gone from the page cache, so
 * appends fail (with the log naming the segment) until a flush has put the
 * caller's copies in an SST. */
Test(inject, batch_fsync_failure_refuses_appends_until_a_flush)
{
    char *dir = lt_mkdtemp("iwals");
    lsm_opts o;
    lt_opts(&o, dir, LSM_SYNC_BATCH);
    o.sync_ms = 1;
    lsm_db *db;
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_OK);
    lsm_fault_set(&(lsm_fault){.ops = LSM_FOP_FSYNC, .path_has = ".wal", .times = 1});
    char logp[300];
    snprintf(logp, sizeof(logp), "%s.log", dir);
    int saved = cap_begin(logp);
    uint64_t s = 1;
    kv_err rv = KV_OK;
    uint64_t end = kv_now_ns() + 30000000000ull; /* the syncer may be slow to run */
    for (; s < 1000000 && rv == KV_OK && kv_now_ns() < end; s++) { /* until its fsync failed */
        rv = put(db, s);
        if (rv == KV_OK && lsm_fault_hits() == 0)
            usleep(200);
    }
    char *log = cap_end(saved, logp);
    cr_assert_eq(rv, KV_INTERNAL, "appends after a failed fsync: %s", kv_strerror(rv));
    cr_assert(strstr(log, ".wal: fsync failed") != NULL, "no log line naming the WAL");
    cr_assert_eq(lsm_wal_sync(db), KV_INTERNAL, "lsm_wal_sync claims durability");
    uint64_t last = s - 1; /* refused; 1..last-1 acknowledged */
    flush_run(db, 'k', 1, last, last, KV_OK);
    cr_assert_eq(put(db, last + 1), KV_OK, "appends resume after the flush");
    cr_assert_eq(lsm_wal_sync(db), KV_OK);
    lsm_close(db);
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_OK);
    read_run(db, 'k', 1, last, KV_OK);
    lsm_close(db);
    free(log);
    lt_rmrf(dir);
    free(dir);
}

/* ENOSPC creating the L0 file: the flush fails, nothing is installed, and
 * the flush succeeds once space is back. EIO reading blocks: lookups fail
 * with INTERNAL naming the SST (not NOT_FOUND), then read right. */
Test(inject, sst_create_and_read_faults)
{
    char *dir = lt_mkdtemp("isst");
    lsm_opts o;
    lt_opts(&o, dir, LSM_SYNC_NONE);
    lsm_db *db;
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_OK);
    lsm_fault_set(&(lsm_fault){.ops = LSM_FOP_CREATE, .path_has = ".sst", .err = ENOSPC});
    flush_run(db, 'f', 1, 301, 300, KV_RESOURCE_EXHAUSTED);
    lsm_fault_set(NULL);
    cr_assert_eq(lt_count(dir, ".sst"), 0);
    flush_run(db, 'f', 1, 301, 300, KV_OK);
    read_run(db, 'f', 1, 301, KV_OK);

    lsm_fault_set(&(lsm_fault){.ops = LSM_FOP_READ, .path_has = ".sst"});
    char logp[300];
    snprintf(logp, sizeof(logp), "%s.log", dir);
    int saved = cap_begin(logp);
    read_run(db, 'f', 1, 301, KV_INTERNAL);
    const void *kp[3] = {"f00001", "f00100", "zzz"};
    size_t kl[3] = {6, 6, 3};
    lsm_rec outs[3];
    kv_err errs[3];
    cr_assert_eq(lsm_multiget(db, 3, kp, kl, outs, NULL, errs), KV_OK);
    char *log = cap_end(saved, logp);
    cr_assert(errs[0] == KV_INTERNAL && errs[1] == KV_INTERNAL, "multiget: %s %s",
              kv_strerror(errs[0]), kv_strerror(errs[1]));
    cr_assert(strstr(log, ".sst block") != NULL, "no log line naming the SST");
    lsm_fault_set(NULL);
    read_run(db, 'f', 1, 301, KV_OK);
    lsm_close(db);
    free(log);
    lt_rmrf(dir);
    free(dir);
}

/* A MANIFEST append that fails and cannot be truncated leaves a torn edit:
 * the next install writes a fresh MANIFEST instead of appending after it,
 * and the db reopens with every flush that succeeded. */
Test(inject, torn_manifest_append_is_replaced)
{
    char *dir = lt_mkdtemp("iman");
    lsm_opts o;
    lt_opts(&o, dir, LSM_SYNC_NONE);
    lsm_db *db;
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_OK);
    lsm_fault_set(&(lsm_fault){.ops = LSM_FOP_WRITE | LSM_FOP_TRUNCATE,
                               .path_has = "MANIFEST",
                               .times = 2,
                               .short_write = true});
    static char big[3000]; /* a long key: the torn edit outlasts the next one */
    memset(big, 'b', sizeof(big));
    lsm_rec one = {.key = big, .klen = sizeof(big), .value = "v", .vlen = 1, .seqno = 1};
    one.type = LSM_PUT;
    cr_assert_eq(lsm_flush(db, &one, 1, 100), KV_INTERNAL);
    cr_assert_eq(lsm_fault_hits(), 2);
    lsm_fault_set(NULL);
    flush_run(db, 'f', 101, 201, 200, KV_OK);
    read_run(db, 'f', 101, 201, KV_OK);
    lsm_close(db);
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_OK);
    read_run(db, 'f', 101, 201, KV_OK);
    lsm_close(db);
    lt_rmrf(dir);
    free(dir);
}

/* lsm_multiget whose state cannot be allocated fails cleanly (it used to
 * walk the keys with a NULL record array). */
Test(inject, multiget_out_of_memory)
{
    char *dir = lt_mkdtemp("ioom");
    lsm_opts o;
    lt_opts(&o, dir, LSM_SYNC_NONE);
    lsm_db *db;
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_OK);
    flush_run(db, 'f', 1, 101, 100, KV_OK);
    const void *kp[4] = {"f00001", "f00002", "f00003", "nope"};
    size_t kl[4] = {6, 6, 6, 4};
    lsm_rec outs[4];
    kv_err errs[4] = {KV_CANCELLED, KV_CANCELLED, KV_CANCELLED, KV_CANCELLED};
    for (uint64_t site = 0; site < 6; site++) { /* each of lookup_init's allocations */
        lsm_fault_set(&(lsm_fault){.ops = LSM_FOP_ALLOC, .after = site, .times = 1});
        cr_assert_eq(lsm_multiget(db, 4, kp, kl, outs, NULL, errs), KV_RESOURCE_EXHAUSTED);
        cr_assert_eq(errs[0], KV_CANCELLED, "errs written on failure");
        lsm_fault_set(NULL);
    }
    lsm_rec r;
    cr_assert_eq(lsm_get(db, "f00002", 6, &r, NULL), KV_OK);
    lsm_rec_free(&r);
    lsm_close(db);
    lt_rmrf(dir);
    free(dir);
}

static bool keep_all(void *arg, const void *key, size_t klen)
{
    (void)arg;
    (void)key;
    (void)klen;
    return true;
}

/* Rewrites every file (the deepest level into itself). */
static void compact(lsm_db *db)
{
    cr_assert_eq(lsm_compact_all_filter(db, keep_all, NULL, NULL), KV_OK);
}

/* The tombstone grace and expiry follow lsm_opts.clock: a tombstone stays
 * until the clock passes its grace, with no sleeping. */
Test(inject, tombstone_grace_follows_the_injected_clock)
{
    char *dir = lt_mkdtemp("iclk");
    tclock clock;
    tclock_init(&clock);
    lsm_opts o;
    lt_opts(&o, dir, LSM_SYNC_NONE);
    o.tombstone_grace_ms = 3600000;
    o.clock = tclock_now;
    o.clock_arg = &clock;
    lsm_db *db;
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_OK);
    uint64_t now = tclock_now(&clock);
    lsm_rec run[2] = {
        {.key = "dead", .klen = 4, .version = now << 16, .seqno = 1, .type = LSM_DELETE},
        {.key = "ttl",
         .klen = 3,
         .value = "v",
         .vlen = 1,
         .version = now << 16,
         .seqno = 2,
         .expire_at = now + 1000,
         .type = LSM_PUT}};
    cr_assert_eq(lsm_flush(db, run, 2, 2), KV_OK);
    compact(db);
    lsm_rec r;
    cr_assert_eq(lsm_get(db, "dead", 4, &r, NULL), KV_OK, "dropped inside its grace");
    lsm_rec_free(&r);
    cr_assert_eq(lsm_get(db, "ttl", 3, &r, NULL), KV_OK);
    cr_assert_eq(r.type, LSM_PUT, "expired early");
    lsm_rec_free(&r);
    tclock_advance(&clock, 3600000 + 1);
    compact(db);
    cr_assert_eq(lsm_get(db, "dead", 4, &r, NULL), KV_NOT_FOUND, "kept past its grace");
    cr_assert_eq(lsm_get(db, "ttl", 3, &r, NULL), KV_OK, "expired within its grace");
    cr_assert_eq(r.type, LSM_DELETE, "an expired put turns into a tombstone");
    lsm_rec_free(&r);
    tclock_advance(&clock, 1000);
    compact(db);
    cr_assert_eq(lsm_get(db, "ttl", 3, &r, NULL), KV_NOT_FOUND);
    lsm_close(db);
    lt_rmrf(dir);
    free(dir);
}

#if KV_ASSERTS_ON
/* Debug and sanitizer builds check the "mu held" contracts at run time. */
Test(inject, lock_contract_is_checked, .signal = SIGABRT)
{
    char *dir = lt_mkdtemp("iassert");
    lsm_opts o;
    lt_opts(&o, dir, LSM_SYNC_NONE);
    lsm_db *db;
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_OK);
    lt_rmrf(dir); /* before the abort */
    free(dir);
    (void)lsm_db_new_number(db); /* db->mu not held */
}
#endif
