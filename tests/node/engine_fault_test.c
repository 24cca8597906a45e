/* SPDX-License-Identifier: MIT */
/*
 * The engine under faults: a memory-tier allocation that fails (the write
 * fails and leaves nothing in the WAL for a restart to bring back), keys
 * the memory tier cannot hold and TTLs past the limit (refused before the
 * WAL), and I/O faults injected into the LSM's volume layer (EIO, ENOSPC,
 * failed fsyncs): no write is acknowledged that was not persisted, no read
 * returns wrong data or a false miss, each fault is reported (kv_err, a
 * message, a log line naming the file), and writes work again once the
 * fault clears. Time moves through the engine's injected clock.
 */
#include "tests/kv_testfw.h"
#include "tests/kv_testclock.h"
#include "tests/kv_testlog.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/limits.h"
#include "node/engine.h"
#include "node/index/hotring.h"
#include "node/lsm/lsm_int.h"
#include "tests/node/engine_kind.h"

static char dir[64];
static tclock clock_;

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/kv-efault-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    tclock_init(&clock_);
    engine_thread_register();
}

static void teardown(void)
{
    lsm_fault_set(NULL);
    hr_test_fail_allocs(0);
    engine_thread_unregister();
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(efault, .init = setup, .fini = teardown, .timeout = 60);

static engine *open_sync(engine_sync sync)
{
    engine_opts o = {.fast_dir = dir,
                     .mem_mb = 8,
                     .write_buffer_kb = 4096,
                     .sync = sync,
                     .sync_ms = 1,
                     .clock = tclock_now,
                     .clock_arg = &clock_};
    tk_engine_opts(&o);
    engine *e = NULL;
    char err[256];
    kv_err rv = engine_open(&e, &o, err, sizeof(err));
    cr_assert_eq(rv, KV_OK, "engine_open: %s", err);
    return e;
}

static void value_of(char *v, size_t len, int id)
{
    for (size_t i = 0; i < len; i++)
        v[i] = (char)('a' + ((size_t)id * 7 + i) % 26);
}

static kv_err put(engine *e, int id, char *err, size_t errlen)
{
    char k[16], v[40];
    snprintf(k, sizeof(k), "key%05d", id);
    value_of(v, sizeof(v), id);
    engine_write w = {.key = k, .klen = strlen(k), .val = v, .vlen = sizeof(v)};
    engine_result r;
    return engine_write_one(e, &w, &r, err, errlen);
}

/* id reads back with its value (want true) or as absent (want false). */
static void expect(engine *e, int id, bool want)
{
    char k[16], v[40];
    snprintf(k, sizeof(k), "key%05d", id);
    engine_result r;
    kv_err rv = engine_get(e, k, strlen(k), &r);
    cr_assert_eq(rv, KV_OK, "get %s: %s", k, kv_strerror(rv));
    cr_assert_eq(r.found, want, "%s: found %d, wanted %d", k, r.found, want);
    value_of(v, sizeof(v), id);
    cr_assert(!r.found || (r.vlen == sizeof(v) && memcmp(r.val, v, sizeof(v)) == 0),
              "%s: wrong value", k);
    free(r.val);
}

/* A memory-tier insert that cannot get its item used to come after the WAL
 * append: the client got an error, and the record came back on restart. */
Test(efault, memory_tier_failure_leaves_nothing_in_the_wal)
{
    engine *e = open_sync(ENGINE_SYNC_ALWAYS);
    char err[256];
    cr_assert_eq(put(e, 1, err, sizeof(err)), KV_OK);
    hr_test_fail_allocs(1);
    kv_err rv = put(e, 2, err, sizeof(err)); /* a new key: an insert */
    cr_assert_eq(rv, KV_RESOURCE_EXHAUSTED, "%s", kv_strerror(rv));
    cr_assert(strstr(err, "memory") != NULL, "message: %s", err);
    hr_test_fail_allocs(1);
    char big[100];
    memset(big, 'z', sizeof(big));
    engine_write w = {.key = "key00001", .klen = 8, .val = big, .vlen = sizeof(big)};
    engine_result r;
    cr_assert_eq(engine_write_one(e, &w, &r, err, sizeof(err)), KV_RESOURCE_EXHAUSTED);
    hr_test_fail_allocs(0);
    expect(e, 1, true);
    expect(e, 2, false);
    engine_close(e);
    e = open_sync(ENGINE_SYNC_ALWAYS);
    expect(e, 1, true); /* not the refused 100-byte value */
    expect(e, 2, false);
    cr_assert_eq(put(e, 2, err, sizeof(err)), KV_OK);
    expect(e, 2, true);
    engine_close(e);
}

/* A key the memory tier cannot hold used to reach the WAL first: the
 * write failed, and every restart then failed replaying it. */
Test(efault, key_over_the_memory_tier_limit_is_refused_before_the_wal)
{
    engine *e = open_sync(ENGINE_SYNC_NONE);
    char err[256], *key = malloc(5000);
    memset(key, 'k', 5000);
    engine_write w = {.key = key, .klen = 5000, .val = "v", .vlen = 1};
    engine_result r;
    cr_assert_eq(engine_write_one(e, &w, &r, err, sizeof(err)), KV_INVALID_ARGUMENT);
    cr_assert(strstr(err, tk_kallax() ? "1024" : "4096") != NULL, "the message names the limit: %s",
              err);
    engine_close(e);
    e = open_sync(ENGINE_SYNC_NONE); /* asserts the open works */
    engine_close(e);
    free(key);
}

/* ttl_ms 2^64 - 1 used to wrap now + ttl: acknowledged, then gone at once.
 * It is refused, naming the limit; the limit itself is accepted. */
Test(efault, ttl_over_the_limit_is_refused)
{
    engine *e = open_sync(ENGINE_SYNC_NONE);
    char err[256];
    engine_result r;
    engine_write w = {.key = "t", .klen = 1, .val = "x", .vlen = 1, .ttl_ms = UINT64_MAX};
    cr_assert_eq(engine_write_one(e, &w, &r, err, sizeof(err)), KV_INVALID_ARGUMENT);
    cr_assert(strstr(err, "limit") != NULL, "message: %s", err);
    cr_assert_eq(engine_get(e, "t", 1, &r), KV_OK);
    cr_assert_not(r.found);
    w.ttl_ms = KV_MAX_TTL_MS;
    cr_assert_eq(engine_write_one(e, &w, &r, err, sizeof(err)), KV_OK, "%s", err);
    tclock_advance(&clock_, 365ull * 86400 * 1000);
    cr_assert_eq(engine_get(e, "t", 1, &r), KV_OK);
    cr_assert(r.found, "a 100-year TTL expired within a year");
    cr_assert_eq(r.expire_at, tclock_now(&clock_) - 365ull * 86400 * 1000 + KV_MAX_TTL_MS);
    free(r.val);
    engine_write del = {.key = "t", .klen = 1, .is_delete = true, .ttl_ms = UINT64_MAX};
    cr_assert_eq(engine_write_one(e, &del, &r, err, sizeof(err)), KV_OK, "a delete has no TTL");
    engine_close(e);
}

/* Fails every WAL write with err (whole or short) for `times` writes. */
static void fail_wal_writes(int err, bool short_write, uint64_t times)
{
    lsm_fault_set(&(lsm_fault){.ops = LSM_FOP_WRITE,
                               .path_has = ".wal",
                               .times = times,
                               .err = err,
                               .short_write = short_write});
}

Test(efault, wal_write_errors_are_reported_and_not_acknowledged)
{
    engine *e = open_sync(ENGINE_SYNC_ALWAYS);
    char err[256];
    for (int i = 0; i < 20; i++)
        cr_assert_eq(put(e, i, err, sizeof(err)), KV_OK);
    char logp[100];
    snprintf(logp, sizeof(logp), "%s.log", dir);
    fail_wal_writes(EIO, true, 0);
    int saved = cap_begin(logp);
    for (int i = 20; i < 30; i++)
        cr_assert_eq(put(e, i, err, sizeof(err)), KV_INTERNAL, "put %d", i);
    char *log = cap_end(saved, logp);
    cr_assert(strstr(err, "WAL") != NULL, "message: %s", err);
    cr_assert(strstr(log, ".wal write of") != NULL, "no log line naming the WAL file");
    free(log);
    fail_wal_writes(ENOSPC, false, 0);
    cr_assert_eq(put(e, 30, err, sizeof(err)), KV_RESOURCE_EXHAUSTED);
    cr_assert(strstr(err, "full") != NULL, "message: %s", err);
    lsm_fault_set(NULL);
    for (int i = 31; i < 40; i++)
        cr_assert_eq(put(e, i, err, sizeof(err)), KV_OK, "put %d after the fault: %s", i, err);
    for (int i = 0; i < 40; i++)
        expect(e, i, i < 20 || i > 30);
    engine_close(e);
    e = open_sync(ENGINE_SYNC_ALWAYS);
    for (int i = 0; i < 40; i++)
        expect(e, i, i < 20 || i > 30);
    engine_close(e);
}

/* Sync batch: the WAL thread's fsync fails after writes were acknowledged.
 * Writes fail from then on (the records may be lost from the page cache)
 * until the engine's flush has put them in an SST, which it asks for on
 * its own; then they work again and nothing acknowledged is lost. */
Test(efault, batch_fsync_failure_heals_through_a_flush)
{
    engine *e = open_sync(ENGINE_SYNC_BATCH);
    char err[256];
    lsm_fault_set(&(lsm_fault){.ops = LSM_FOP_FSYNC, .path_has = ".wal", .times = 1});
    /* Bounded by time, not by a count of writes: the WAL thread's first
     * fsync (where the fault hits) and the healing flush come when their
     * threads get to run, seconds later under TSan on a loaded host. */
    enum { MAX_IDS = 60000, HEAL_TRIES = 3000 };
    static bool acked[MAX_IDS];
    memset(acked, 0, sizeof(acked));
    int id = 0;
    kv_err rv = KV_OK;
    uint64_t end = kv_now_ns() + 30000000000ull;
    for (; id < MAX_IDS - HEAL_TRIES && rv == KV_OK && kv_now_ns() < end; id++) {
        rv = put(e, id, err, sizeof(err));
        acked[id] = rv == KV_OK;
        if (rv == KV_OK && lsm_fault_hits() == 0)
            usleep(100);
    }
    cr_assert_eq(rv, KV_INTERNAL, "writes after a failed fsync: %s", kv_strerror(rv));
    cr_assert_eq(engine_wal_sync(e), KV_INTERNAL, "durability claimed after a failed fsync");
    for (int tries = 0; tries < HEAL_TRIES && rv != KV_OK; tries++, id++) { /* up to 30 s */
        usleep(10000);
        rv = put(e, id, err, sizeof(err));
        acked[id] = rv == KV_OK;
    }
    cr_assert_eq(rv, KV_OK, "writes did not resume: %s", err);
    cr_assert_eq(engine_wal_sync(e), KV_OK);
    for (int i = 0; i < id; i++)
        expect(e, i, acked[i]);
    engine_close(e);
    e = open_sync(ENGINE_SYNC_BATCH);
    for (int i = 0; i < id; i++)
        expect(e, i, acked[i]);
    engine_close(e);
}

/* Reads that hit an unreadable SST (kallax: block file) fail (no miss, no
 * other value), the write path too (it reads the current record), and all
 * is well after. */
Test(efault, sst_read_errors_fail_reads_not_answer_them)
{
    const char *file = tk_kallax() ? "BLOCKS" : ".sst";
    const char *line = tk_kallax() ? "BLOCKS: read of block" : ".sst block";
    engine *e = open_sync(ENGINE_SYNC_NONE);
    char err[256];
    for (int i = 0; i < 50; i++)
        cr_assert_eq(put(e, i, err, sizeof(err)), KV_OK);
    cr_assert_eq(engine_flush(e), KV_OK);
    engine_close(e);
    e = open_sync(ENGINE_SYNC_NONE); /* an empty memory tier: reads go to the SST */
    lsm_fault_set(&(lsm_fault){.ops = LSM_FOP_READ, .path_has = file});
    char logp[100];
    snprintf(logp, sizeof(logp), "%s.log", dir);
    int saved = cap_begin(logp);
    engine_result r;
    kv_err rv = engine_get(e, "key00007", 8, &r);
    const void *keys[2] = {"key00008", "key00009"};
    size_t klens[2] = {8, 8};
    engine_result rs[2];
    kv_err errs[2];
    cr_assert_eq(engine_get_many(e, 2, keys, klens, rs, errs), KV_OK);
    engine_write w = {.key = "key00010", .klen = 8, .val = "x", .vlen = 1, .if_absent = true};
    kv_err wrv = engine_write_one(e, &w, &r, err, sizeof(err));
    char *log = cap_end(saved, logp);
    cr_assert_eq(rv, KV_INTERNAL, "get over a read error: %s", kv_strerror(rv));
    cr_assert(errs[0] == KV_INTERNAL && errs[1] == KV_INTERNAL, "get_many");
    cr_assert_eq(wrv, KV_INTERNAL, "a conditional write over a read error: %s", kv_strerror(wrv));
    cr_assert(strstr(log, line) != NULL, "no log line naming the file (%s)", line);
    free(log);
    lsm_fault_set(NULL);
    for (int i = 0; i < 50; i++)
        expect(e, i, true);
    engine_close(e);
}
