/* SPDX-License-Identifier: MIT */
/*
 * Engine model test: random puts, deletes, conditional writes and gets
 * against the engine (memory tier + WAL + LSM, tiny write buffer and memory
 * budget so flushes, evictions, fills and compactions all happen) and an
 * in-memory model, with forced flushes and close/reopen cycles; results must
 * be identical. Plus last-writer-wins, the no-stale-fill rule, and NHC
 * routing reads of promoted records to the slow volume.
 */
#include "tests/kv_testfw.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/kv_testclock.h"
#include "node/engine.h"
#include "node/engine_int.h" /* e->db, to have HotRAP promote now */
#include "node/node.h"       /* node_engine_nhc_stats */
#include "node/lsm/lsm_int.h"
#include "tests/node/engine_kind.h"

#define KEYS 6000

typedef struct mrec {
    bool live;
    uint64_t version;
    char val[600];
    size_t vlen;
} mrec;

/* The engines' clock: real time, except in the tests that move it. */
static tclock test_clock;

static engine *open_engine_sync(const char *dir, const char *slow, uint64_t fast_mb,
                                engine_sync sync)
{
    if (!tclock_now(&test_clock))
        tclock_init(&test_clock);
    engine_opts o = {.fast_dir = dir,
                     .slow_dir = slow,
                     .fast_mb = fast_mb,
                     .mem_mb = 1,
                     .write_buffer_kb = 96,
                     .index_rehash_cost = 2.0, /* rehashes run under the model test */
                     .sync = sync,
                     .clock = tclock_now,
                     .clock_arg = &test_clock};
    tk_engine_opts(&o);
    engine *e = NULL;
    char err[256];
    kv_err rv = engine_open(&e, &o, err, sizeof(err));
    cr_assert_eq(rv, KV_OK, "engine_open: %s", err);
    return e;
}

static engine *open_engine_mb(const char *dir, const char *slow, uint64_t fast_mb)
{
    return open_engine_sync(dir, slow, fast_mb, ENGINE_SYNC_NONE);
}

static engine *open_engine(const char *dir, const char *slow)
{
    return open_engine_mb(dir, slow, 2);
}

static void rm_dir(const char *dir)
{
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

static void check_get(engine *e, const mrec *m, int k)
{
    char key[16];
    snprintf(key, sizeof(key), "m%d", k);
    engine_result r;
    kv_err rv = engine_get(e, key, strlen(key), &r);
    cr_assert_eq(rv, KV_OK, "get %s: %s", key, kv_err_name(rv));
    cr_assert_eq(r.found, m[k].live, "key %s found=%d model=%d", key, r.found, m[k].live);
    if (r.found) {
        cr_assert_eq(r.vlen, m[k].vlen, "key %s length", key);
        cr_assert_eq(memcmp(r.val, m[k].val, r.vlen), 0, "key %s value", key);
        cr_assert_eq(r.version, m[k].version, "key %s version", key);
    }
    free(r.val);
}

/* engine_get_many over 16 random keys agrees with the model too. */
/* 1..40 keys: the memory tier looks them up in batches of 16 */
static void check_get_many(engine *e, const mrec *m, unsigned *seed)
{
    char keys[40][16];
    const void *kp[40];
    size_t kl[40];
    int ks[40];
    engine_result r[40];
    kv_err errs[40];
    int n = 1 + (int)(rand_r(seed) % 40);
    for (int i = 0; i < n; i++) {
        ks[i] = (int)(rand_r(seed) % KEYS);
        snprintf(keys[i], sizeof(keys[i]), "m%d", ks[i]);
        kp[i] = keys[i];
        kl[i] = strlen(keys[i]);
    }
    cr_assert_eq(engine_get_many(e, (size_t)n, kp, kl, r, errs), KV_OK);
    for (int i = 0; i < n; i++) {
        cr_assert_eq(errs[i], KV_OK, "get_many %s: %s", keys[i], kv_err_name(errs[i]));
        cr_assert_eq(r[i].found, m[ks[i]].live, "get_many %s found", keys[i]);
        if (r[i].found)
            cr_assert(r[i].vlen == m[ks[i]].vlen && !memcmp(r[i].val, m[ks[i]].val, r[i].vlen),
                      "get_many %s value", keys[i]);
        free(r[i].val);
    }
}

static unsigned long mem_writes; /* do_write's writes engine_write_mem took */

static void do_write(engine *e, mrec *m, int k, unsigned *seed)
{
    char key[16], err[256];
    snprintf(key, sizeof(key), "m%d", k);
    engine_write w = {.key = key, .klen = strlen(key)};
    char val[600];
    size_t vlen = (size_t)(rand_r(seed) % 500);
    for (size_t i = 0; i < vlen; i++)
        val[i] = (char)('A' + rand_r(seed) % 50);
    int kind = rand_r(seed) % 10;
    w.is_delete = kind == 0;
    w.val = val;
    w.vlen = vlen;
    w.if_absent = kind == 1;
    w.if_version = kind == 2 ? (m[k].live ? m[k].version : 1) : 0;
    engine_result r;
    /* half the writes try the non-blocking form first, as a node's receive
     * callback does; declined, they take the blocking one */
    bool declined = true;
    kv_err rv = KV_OK;
    if (rand_r(seed) % 2) {
        rv = engine_write_mem(e, &w, &r, &declined, err, sizeof(err));
        mem_writes += !declined;
    }
    if (declined)
        rv = engine_write_one(e, &w, &r, err, sizeof(err));
    bool expect_ok = !(w.if_absent && m[k].live) && !(kind == 2 && !m[k].live);
    if (!expect_ok) {
        cr_assert(rv == KV_ALREADY_EXISTS || rv == KV_FAILED_PRECONDITION, "%s: %s", key,
                  kv_err_name(rv));
        return;
    }
    cr_assert_eq(rv, KV_OK, "%s: %s (%s)", key, kv_err_name(rv), err);
    m[k].live = !w.is_delete;
    m[k].version = r.version;
    m[k].vlen = w.is_delete ? 0 : vlen;
    memcpy(m[k].val, val, m[k].vlen);
}

Test(engine, model_100k_ops_with_flushes_and_reopens, .timeout = 280)
{
    char dir[] = "/tmp/hotkv-engine-XXXXXX", slow[300];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(slow, sizeof(slow), "%s/slow", dir);
    engine_thread_register();
    engine *e = open_engine(dir, slow);
    mrec *m = calloc(KEYS, sizeof(*m));
    unsigned seed = 42;
    engine_stats s, total = {0};
    for (int op = 0; op < 100000; op++) {
        int k = (int)(rand_r(&seed) % KEYS);
        if (rand_r(&seed) % 2)
            do_write(e, m, k, &seed);
        else if (op % 100 == 0)
            check_get_many(e, m, &seed);
        else
            check_get(e, m, k);
        if (op % 20000 == 19999) {
            cr_assert_eq(engine_flush(e), KV_OK);
            engine_get_stats(e, &s);
            total.flushes += s.flushes;
            total.reads_fd += s.reads_fd + s.reads_sd;
            total.evictions += s.evictions;
            total.fills += s.fills;
            engine_close(e);
            e = open_engine(dir, slow);
            for (int i = 0; i < KEYS; i++)
                check_get(e, m, i);
        }
    }
    cr_assert_gt(total.flushes, 10, "flushes happened (%llu)", (unsigned long long)total.flushes);
    cr_assert_gt(total.reads_fd, 1000, "reads reached the LSM (%llu)",
                 (unsigned long long)total.reads_fd);
    cr_assert_gt(total.evictions, 0, "clean items were evicted");
    cr_assert_gt(total.fills, 0, "re-read records were filled into memory");
    cr_assert_gt(mem_writes, 1000, "engine_write_mem took writes (%lu)", mem_writes);
    engine_close(e);
    engine_thread_unregister();
    free(m);
    rm_dir(dir);
}

Test(engine, last_writer_wins_and_ttl)
{
    char dir[] = "/tmp/hotkv-engine-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    engine_thread_register();
    engine *e = open_engine(dir, NULL);
    char err[256];
    engine_result r;
    engine_write w = {.key = "k", .klen = 1, .val = "new", .vlen = 3, .version = 1000};
    cr_assert_eq(engine_write_one(e, &w, &r, err, sizeof(err)), KV_OK);
    engine_write old = {.key = "k", .klen = 1, .val = "old", .vlen = 3, .version = 900};
    cr_assert_eq(engine_write_one(e, &old, &r, err, sizeof(err)), KV_OK);
    cr_assert_eq(r.version, 1000, "the older write is superseded");
    cr_assert_eq(engine_flush(e), KV_OK);
    cr_assert_eq(engine_write_one(e, &old, &r, err, sizeof(err)), KV_OK);
    cr_assert_eq(engine_get(e, "k", 1, &r), KV_OK);
    cr_assert(r.found && r.vlen == 3 && memcmp(r.val, "new", 3) == 0, "LWW across a flush");
    free(r.val);
    engine_write del = {.key = "k", .klen = 1, .version = 950, .is_delete = true};
    cr_assert_eq(engine_write_one(e, &del, &r, err, sizeof(err)), KV_OK);
    cr_assert_eq(engine_get(e, "k", 1, &r), KV_OK);
    cr_assert(r.found, "an older delete does not remove a newer value");
    free(r.val);
    engine_write ttl = {.key = "t", .klen = 1, .val = "x", .vlen = 1, .ttl_ms = 50};
    cr_assert_eq(engine_write_one(e, &ttl, &r, err, sizeof(err)), KV_OK);
    tclock_advance(&test_clock, 49);
    cr_assert_eq(engine_get(e, "t", 1, &r), KV_OK);
    cr_assert(r.found, "expired early");
    free(r.val);
    tclock_advance(&test_clock, 1);
    cr_assert_eq(engine_get(e, "t", 1, &r), KV_OK);
    cr_assert_not(r.found, "expired");
    cr_assert_eq(engine_flush(e), KV_OK); /* the store and its reads use the clock too */
    if (!tk_kallax())
        cr_assert_eq(lsm_compact_all(e->db), KV_OK);
    cr_assert_eq(engine_get(e, "t", 1, &r), KV_OK);
    cr_assert_not(r.found, "expired after a flush");
    engine_close(e);
    engine_thread_unregister();
    rm_dir(dir);
}

/* An invalid key in engine_get_many fails that key only; the others are
 * answered from memory and from the store as by engine_get. */
Test(engine, get_many_with_an_invalid_key)
{
    char dir[] = "/tmp/hotkv-engine-XXXXXX", err[256];
    cr_assert_not_null(mkdtemp(dir));
    engine_thread_register();
    engine *e = open_engine(dir, NULL);
    engine_write a = {.key = "a", .klen = 1, .val = "va", .vlen = 2};
    cr_assert_eq(engine_write_one(e, &a, &(engine_result){0}, err, sizeof(err)), KV_OK);
    cr_assert_eq(engine_flush(e), KV_OK);
    engine_close(e);
    e = open_engine(dir, NULL); /* "a" is in the store only */
    engine_write b = {.key = "b", .klen = 1, .val = "vb", .vlen = 2};
    cr_assert_eq(engine_write_one(e, &b, &(engine_result){0}, err, sizeof(err)), KV_OK);
    const void *kp[4] = {"a", "", "b", "c"};
    size_t kl[4] = {1, 0, 1, 1};
    engine_result r[4];
    kv_err errs[4];
    cr_assert_eq(engine_get_many(e, 4, kp, kl, r, errs), KV_OK);
    cr_assert_eq(errs[0], KV_OK);
    cr_assert(r[0].found && r[0].vlen == 2 && !memcmp(r[0].val, "va", 2), "a from the store");
    cr_assert_eq(errs[1], KV_INVALID_ARGUMENT, "the empty key: %s", kv_err_name(errs[1]));
    cr_assert_eq(errs[2], KV_OK);
    cr_assert(r[2].found && r[2].vlen == 2 && !memcmp(r[2].val, "vb", 2), "b from memory");
    cr_assert_eq(errs[3], KV_OK);
    cr_assert_not(r[3].found, "c was never written");
    free(r[0].val);
    free(r[2].val);
    engine_close(e);
    engine_thread_unregister();
    rm_dir(dir);
}

static uint64_t write_checks(engine *e)
{
    lsm_stats s = {0};
    if (!tk_kallax())
        cr_assert_eq(lsm_stats_get(e->db, &s), KV_OK);
    return s.check_calls;
}

/* A plain put whose version is above every stored one is applied without
 * looking its key up (blind); one that is not, a delete and a conditional
 * put still look it up, in the store after a reopen, so last-writer-wins,
 * `existed` and the conditions are exactly as before. The store's highest
 * version survives the reopen (the LSM's manifest records it per file;
 * kallax's open scan finds it). The lookups are counted by the LSM only. */
Test(engine, blind_puts_only_above_every_stored_version)
{
    char dir[] = "/tmp/hotkv-engine-XXXXXX", err[256];
    cr_assert_not_null(mkdtemp(dir));
    engine_thread_register();
    engine *e = open_engine(dir, NULL);
    bool lsm = !tk_kallax();
    engine_result r;
    char k[16], v[16];
    uint64_t vmax = 0;
    for (int i = 0; i < 100; i++) {
        snprintf(k, sizeof(k), "b%03d", i);
        engine_write w = {.key = k, .klen = 4, .val = k, .vlen = 4};
        cr_assert_eq(engine_write_one(e, &w, &r, err, sizeof(err)), KV_OK, "%s", err);
        vmax = r.version > vmax ? r.version : vmax;
    }
    cr_assert_eq(atomic_load(&e->blind_puts), 100);
    cr_assert_eq(write_checks(e), 0, "no key was looked up");
    cr_assert_eq(engine_flush(e), KV_OK);
    engine_close(e);
    e = open_engine(dir, NULL); /* memory empty: the store holds every record */
    cr_assert_eq(atomic_load(&e->max_version), vmax);

    engine_write old = {.key = "b005", .klen = 4, .val = "old", .vlen = 3, .version = 1};
    cr_assert_eq(engine_write_one(e, &old, &r, err, sizeof(err)), KV_OK, "%s", err);
    cr_assert(!r.applied && r.version > 1, "the stored record wins (v%llu)",
              (unsigned long long)r.version);
    cr_assert_eq(write_checks(e), lsm ? 1 : 0, "the older put looked its key up");
    engine_write nw = {.key = "b006", .klen = 4, .val = "new", .vlen = 3};
    cr_assert_eq(engine_write_one(e, &nw, &r, err, sizeof(err)), KV_OK, "%s", err);
    cr_assert(r.applied && r.version > vmax);
    cr_assert_eq(write_checks(e), lsm ? 1 : 0, "a newer put is blind");
    cr_assert_eq(atomic_load(&e->blind_puts), 1);
    engine_write del = {.key = "b007", .klen = 4, .is_delete = true};
    cr_assert_eq(engine_write_one(e, &del, &r, err, sizeof(err)), KV_OK, "%s", err);
    cr_assert(r.found, "the delete found the stored key (existed)");
    engine_write absent = {.key = "b008", .klen = 4, .val = "x", .vlen = 1, .if_absent = true};
    cr_assert_eq(engine_write_one(e, &absent, &r, err, sizeof(err)), KV_ALREADY_EXISTS,
                 "if_absent sees the stored record");
    engine_write ifv = {.key = "b009", .klen = 4, .val = "x", .vlen = 1, .if_version = 1};
    cr_assert_eq(engine_write_one(e, &ifv, &r, err, sizeof(err)), KV_FAILED_PRECONDITION,
                 "if_version compares with the stored record");
    cr_assert_eq(write_checks(e), lsm ? 4 : 0);
    cr_assert_eq(atomic_load(&e->blind_puts), 1);
    struct {
        const char *key, *val;
    } want[] = {
        {"b005", "b005"}, {"b006", "new"}, {"b007", NULL}, {"b008", "b008"}, {"b009", "b009"}};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        cr_assert_eq(engine_get(e, want[i].key, 4, &r), KV_OK);
        if (!want[i].val) {
            cr_assert_not(r.found, "%s deleted", want[i].key);
            continue;
        }
        snprintf(v, sizeof(v), "%.*s", (int)r.vlen, r.found ? (char *)r.val : "");
        cr_assert_str_eq(v, want[i].val, "%s", want[i].key);
        free(r.val);
    }
    engine_close(e);
    engine_thread_unregister();
    rm_dir(dir);
}

/* engine_write_mem (a node's receive callback) declines, with nothing done
 * or counted, what could wait on the disk: a write that must look up a key
 * whose record is not in memory, sync mode "always"; it applies the rest as
 * engine_write_one would, conditions and bad input included, durably. A
 * plain put newer than every stored version needs no lookup. */
Test(engine, write_mem_declines_what_would_block)
{
    char dir[] = "/tmp/hotkv-engine-XXXXXX", err[256];
    cr_assert_not_null(mkdtemp(dir));
    engine_thread_register();
    engine *e = open_engine_sync(dir, NULL, 2, ENGINE_SYNC_BATCH);
    engine_result r;
    bool declined;
    engine_write empty = {.key = "", .klen = 0, .val = "v", .vlen = 1};
    cr_assert_eq(engine_write_mem(e, &empty, &r, &declined, err, sizeof(err)), KV_INVALID_ARGUMENT,
                 "bad input is refused, not declined");
    cr_assert_not(declined);
    engine_write w1 = {.key = "k", .klen = 1, .val = "one", .vlen = 3};
    cr_assert_eq(engine_write_one(e, &w1, &r, err, sizeof(err)), KV_OK);
    uint64_t v1 = r.version;
    /* an older version than one stored: last-writer-wins needs the key's
     * record, which is not in memory */
    engine_write fresh = {.key = "fresh", .klen = 5, .val = "v", .vlen = 1, .version = v1 - 1};
    uint64_t puts = atomic_load(&e->puts), blind = atomic_load(&e->blind_puts);
    cr_assert_eq(engine_write_mem(e, &fresh, &r, &declined, err, sizeof(err)), KV_OK);
    cr_assert(declined, "a key not in memory may have its record in the LSM: declined");
    cr_assert_eq(atomic_load(&e->puts), puts, "a declined write is not counted");
    cr_assert_eq(engine_get(e, "fresh", 5, &r), KV_OK);
    cr_assert_not(r.found, "a declined write stored nothing");
    engine_write fresh2 = {.key = "fresh2", .klen = 6, .val = "v", .vlen = 1};
    cr_assert_eq(engine_write_mem(e, &fresh2, &r, &declined, err, sizeof(err)), KV_OK);
    cr_assert(!declined && r.applied, "a put newer than everything stored needs no lookup");
    cr_assert_eq(atomic_load(&e->blind_puts), blind + 1);
    engine_write w2 = {.key = "k", .klen = 1, .val = "two", .vlen = 3};
    cr_assert_eq(engine_write_mem(e, &w2, &r, &declined, err, sizeof(err)), KV_OK, "%s", err);
    cr_assert_not(declined, "the record is in memory, or the put is blind");
    cr_assert(r.applied && r.version > v1, "applied over v%llu: v%llu", (unsigned long long)v1,
              (unsigned long long)r.version);
    uint64_t v2 = r.version;
    engine_write absent = {.key = "k", .klen = 1, .val = "x", .vlen = 1, .if_absent = true};
    cr_assert_eq(engine_write_mem(e, &absent, &r, &declined, err, sizeof(err)), KV_ALREADY_EXISTS);
    cr_assert_not(declined);
    engine_write stale = {.key = "k", .klen = 1, .val = "x", .vlen = 1, .if_version = v1};
    cr_assert_eq(engine_write_mem(e, &stale, &r, &declined, err, sizeof(err)),
                 KV_FAILED_PRECONDITION, "%s", err);
    engine_write old = {.key = "k", .klen = 1, .val = "old", .vlen = 3, .version = v1};
    cr_assert_eq(engine_write_mem(e, &old, &r, &declined, err, sizeof(err)), KV_OK);
    cr_assert(!declined && !r.applied && r.version == v2, "last writer wins");
    engine_write del = {.key = "d", .klen = 1, .val = "x", .vlen = 1};
    cr_assert_eq(engine_write_one(e, &del, &r, err, sizeof(err)), KV_OK);
    del = (engine_write){.key = "d", .klen = 1, .is_delete = true};
    cr_assert_eq(engine_write_mem(e, &del, &r, &declined, err, sizeof(err)), KV_OK);
    cr_assert(!declined && r.found, "the delete found the key");
    engine_close(e);
    /* the WAL kept them; "always" fsyncs each write: declined */
    e = open_engine_sync(dir, NULL, 2, ENGINE_SYNC_ALWAYS);
    cr_assert_eq(engine_get(e, "k", 1, &r), KV_OK);
    cr_assert(r.found && r.version == v2 && r.vlen == 3 && !memcmp(r.val, "two", 3),
              "the write engine_write_mem took survived a reopen");
    free(r.val);
    cr_assert_eq(engine_get(e, "d", 1, &r), KV_OK);
    cr_assert_not(r.found, "the delete survived a reopen");
    engine_write w3 = {.key = "k", .klen = 1, .val = "three", .vlen = 5};
    cr_assert_eq(engine_write_mem(e, &w3, &r, &declined, err, sizeof(err)), KV_OK);
    cr_assert(declined, "sync mode always: the write waits for its fsync elsewhere");
    engine_close(e);
    engine_thread_unregister();
    rm_dir(dir);
}

/* Writers racing on a few keys with both forms: every key ends with the
 * write that got the highest version (versions are drawn under the key's
 * stripe lock, so the last to apply has the highest). ThreadSanitizer runs
 * it too. */
#define RACE_THREADS 4
#define RACE_KEYS 8
#define RACE_WRITES 3000

typedef struct race_arg {
    engine *e;
    int id;
    uint64_t best[RACE_KEYS]; /* the highest version this thread applied per key */
    char best_val[RACE_KEYS][32];
} race_arg;

static void *race_main(void *p)
{
    race_arg *a = p;
    engine_thread_register();
    unsigned seed = (unsigned)a->id * 7919u + 1;
    for (int i = 0; i < RACE_WRITES; i++) {
        int k = (int)(rand_r(&seed) % RACE_KEYS);
        char key[16], val[32], err[256];
        snprintf(key, sizeof(key), "race%d", k);
        snprintf(val, sizeof(val), "t%d-w%d", a->id, i);
        engine_write w = {.key = key, .klen = strlen(key), .val = val, .vlen = strlen(val)};
        engine_result r = {0};
        bool declined = true;
        kv_err rv = KV_OK;
        if (i % 2)
            rv = engine_write_mem(a->e, &w, &r, &declined, err, sizeof(err));
        if (rv == KV_OK && declined)
            rv = engine_write_one(a->e, &w, &r, err, sizeof(err));
        if (rv != KV_OK)
            return (void *)"write failed";
        if (r.applied && r.version > a->best[k]) {
            a->best[k] = r.version;
            snprintf(a->best_val[k], sizeof(a->best_val[k]), "%s", val);
        }
    }
    engine_thread_unregister();
    return NULL;
}

Test(engine, racing_mem_and_blocking_writes_keep_last_writer_wins, .timeout = 120)
{
    char dir[] = "/tmp/hotkv-engine-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    engine_thread_register();
    engine *e = open_engine_sync(dir, NULL, 8, ENGINE_SYNC_BATCH);
    race_arg a[RACE_THREADS];
    pthread_t th[RACE_THREADS];
    for (int t = 0; t < RACE_THREADS; t++) {
        a[t] = (race_arg){.e = e, .id = t};
        cr_assert_eq(pthread_create(&th[t], NULL, race_main, &a[t]), 0);
    }
    for (int t = 0; t < RACE_THREADS; t++) {
        void *res;
        pthread_join(th[t], &res);
        cr_assert_null(res, "thread %d: %s", t, (const char *)res);
    }
    for (int k = 0; k < RACE_KEYS; k++) {
        int w = 0;
        for (int t = 1; t < RACE_THREADS; t++)
            if (a[t].best[k] > a[w].best[k])
                w = t;
        char key[16];
        snprintf(key, sizeof(key), "race%d", k);
        engine_result r;
        cr_assert_eq(engine_get(e, key, strlen(key), &r), KV_OK);
        cr_assert(r.found && r.version == a[w].best[k], "%s: version %llu, highest applied %llu",
                  key, (unsigned long long)r.version, (unsigned long long)a[w].best[k]);
        cr_assert(r.vlen == strlen(a[w].best_val[k]) && !memcmp(r.val, a[w].best_val[k], r.vlen),
                  "%s holds the value of its highest version", key);
        free(r.val);
    }
    engine_close(e);
    engine_thread_unregister();
    rm_dir(dir);
}

/* A flush's cut keeps the oldest records up to the limit, and every record
 * at or below the seqno it returns (issue 18). */
Test(engine, flush_cut_takes_the_oldest_write_buffer)
{
    static char kv[8][4] = {"h", "b", "f", "d", "a", "g", "c", "e"};
    uint64_t seq[8] = {8, 2, 6, 4, 1, 7, 3, 5};
    lsm_rec r[8];
    for (int i = 0; i < 8; i++)
        r[i] = (lsm_rec){.key = kv[i], .klen = 1, .value = kv[i], .vlen = 1, .seqno = seq[i]};
    uint64_t one = engine_rec_bytes(1, 1), max = 99;
    cr_assert_eq(engine_flush_cut(r, 8, 8 * one, &max), 8, "all fit");
    cr_assert_eq(max, 99, "max_seqno untouched when all fit");
    cr_assert_eq(r[0].seqno, 8, "order untouched when all fit");
    cr_assert_eq(engine_flush_cut(r, 8, 3 * one + 1, &max), 4, "the shortest prefix >= limit");
    cr_assert_eq(max, 4);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(r[i].seqno, (uint64_t)i + 1, "sorted by seqno");
    cr_assert_eq(engine_flush_cut(r, 8, 3 * one, &max), 3);
    cr_assert_eq(max, 3);
    cr_assert_eq(engine_flush_cut(r, 8, 0, &max), 8, "no limit");
}

/* Appended keys that reach the memory tier slightly out of order: the cut
 * moves back (by at most a quarter of the limit) to where everything it
 * keeps sorts below everything it leaves, so the next flush does not overlap
 * this one (issue 18); with no such place it is the plain cut. */
Test(engine, flush_cut_does_not_split_an_out_of_order_run)
{
    static char kv[8][4] = {"a", "b", "c", "e", "d", "f", "g", "h"};
    lsm_rec r[8];
    uint64_t one = engine_rec_bytes(1, 1), max = 99;
    for (int i = 0; i < 8; i++) /* seqno order: a b c e d f g h */
        r[i] =
            (lsm_rec){.key = kv[i], .klen = 1, .value = kv[i], .vlen = 1, .seqno = (uint64_t)i + 1};
    /* the plain cut at 4 records keeps a b c e and leaves d behind */
    cr_assert_eq(engine_flush_cut(r, 8, 4 * one, &max), 3, "the cut moves back before e");
    cr_assert_eq(max, 3);
    cr_assert_eq(engine_flush_cut(r, 8, 5 * one, &max), 5, "a cut after d keeps the run whole");
    cr_assert_eq(max, 5);
    /* 8 records' limit less one: the cut at 7 is disjoint already */
    cr_assert_eq(engine_flush_cut(r, 8, 7 * one, &max), 7);
    /* ten records in order, a limit of nine: the cut leaves an eighth of
     * the limit behind (two records) when it can */
    static char ka[10][4] = {"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"};
    lsm_rec ten[10];
    for (int i = 0; i < 10; i++)
        ten[i] =
            (lsm_rec){.key = ka[i], .klen = 1, .value = ka[i], .vlen = 1, .seqno = (uint64_t)i + 1};
    cr_assert_eq(engine_flush_cut(ten, 10, 9 * one, &max), 8, "a margin of limit / 8");
    cr_assert_eq(max, 8);
    /* a disjoint cut more than a quarter below the limit is not taken:
     * keys h a b c d e f g in seqno order (h first) have none but at 8 */
    static char kw[8][4] = {"h", "a", "b", "c", "d", "e", "f", "g"};
    for (int i = 0; i < 8; i++)
        r[i] =
            (lsm_rec){.key = kw[i], .klen = 1, .value = kw[i], .vlen = 1, .seqno = (uint64_t)i + 1};
    cr_assert_eq(engine_flush_cut(r, 8, 4 * one, &max), 4, "no disjoint cut: the plain one");
    cr_assert_eq(max, 4);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(r[i].seqno, (uint64_t)i + 1, "sorted by seqno");
}

/* A flush the write buffer triggers takes at most the write buffer (plus one
 * record) even when more is dirty by the time it starts: the rest waits for
 * the next flush instead of doubling this one (issue 18: 8.3 MB L0 files
 * from a 4 MiB buffer). The test holds a read lock on apply_lock while it
 * writes 1.75 buffers, so the flush thread can pick its seqno only after
 * all of them are dirty. */
Test(engine, write_buffer_flushes_are_not_oversized, .timeout = 120)
{
    TK_LSM_ONLY("L0 file sizes are the LSM's");
    char dir[] = "/tmp/hotkv-engine-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    engine_thread_register();
    engine *e = open_engine_mb(dir, NULL, 64); /* write buffer 96 KiB, L1 target 5.3 MiB */
    const uint64_t wb = 96u << 10;
    char err[256], key[16], val[500];
    memset(val, 'v', sizeof(val));
    engine_result r;
    engine_stats es;
    pthread_rwlock_rdlock(&e->apply_lock); /* readers share it: the writes go on */
    for (int i = 0;; i++) {
        engine_get_stats(e, &es);
        if (es.dirty_bytes >= wb / 4 * 7)
            break;
        int kn = snprintf(key, sizeof(key), "w%07d", i);
        engine_write w = {
            .key = key, .klen = (size_t)kn, .val = val, .vlen = sizeof(val), .version = 1};
        cr_assert_eq(engine_write_one(e, &w, &r, err, sizeof(err)), KV_OK, "%s", err);
    }
    pthread_rwlock_unlock(&e->apply_lock);
    for (int t = 0; t < 2000; t++) { /* the flush the writes triggered */
        engine_get_stats(e, &es);
        if (es.dirty_bytes < wb)
            break;
        usleep(5000);
    }
    cr_assert_lt(es.dirty_bytes, wb, "dirty bytes left: %llu", (unsigned long long)es.dirty_bytes);
    cr_assert_gt(es.dirty_bytes, 0, "the flush took every dirty record");
    lsm_stats s;
    cr_assert_eq(engine_lsm_get_stats(e, &s), KV_OK);
    cr_assert_eq(s.flushes, 1);
    cr_assert_leq(s.flush_bytes, wb + engine_rec_bytes(8, sizeof(val)), "L0 file of %llu bytes",
                  (unsigned long long)s.flush_bytes);
    engine_close(e);
    engine_thread_unregister();
    rm_dir(dir);
}

/* Puts key = val (engine_write_one must succeed) and raises *most to the
 * WAL's live bytes after it; returns the stats it read. */
static engine_stats put_watching_wal(engine *e, const char *key, const char *val, size_t vlen,
                                     uint64_t *most)
{
    char err[256];
    engine_result r;
    engine_write w = {.key = key, .klen = strlen(key), .val = val, .vlen = vlen};
    cr_assert_eq(engine_write_one(e, &w, &r, err, sizeof(err)), KV_OK, "put %s: %s", key, err);
    engine_stats es;
    engine_get_stats(e, &es);
    *most = es.wal_bytes > *most ? es.wal_bytes : *most;
    return es;
}

/* Overwrites of a few keys keep the dirty bytes far under the write buffer,
 * so no flush ever came: the WAL grew by every write (2.1 GB in 15 s of
 * tier_bench UH over 1000 keys) until the fast volume was full, and a
 * restart replayed all of it. Now the WAL's size sets off a flush of every
 * dirty record once it outgrows them and holds writers at its limit: 8 MiB
 * of overwrites leave the WAL under its 1 MiB limit, and a reopen finds the
 * last values. Both stores. */
Test(engine, overwrites_keep_the_wal_within_its_limit, .timeout = 120)
{
    char dir[] = "/tmp/hotkv-engine-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    engine_thread_register();
    engine_opts o = {.fast_dir = dir, .mem_mb = 4, .write_buffer_kb = 256, .wal_max_kb = 1024};
    tk_engine_opts(&o);
    engine *e = NULL;
    char err[256], key[16], val[1000];
    cr_assert_eq(engine_open(&e, &o, err, sizeof(err)), KV_OK, "%s", err);
    engine_result r;
    engine_stats es;
    uint64_t most = 0;
    enum { KEYS_W = 20, ROUNDS = 420 };
    for (int round = 0; round < ROUNDS; round++) {
        memset(val, 'a' + (round % 26), sizeof(val));
        for (int k = 0; k < KEYS_W; k++) {
            snprintf(key, sizeof(key), "w%02d", k);
            es = put_watching_wal(e, key, val, sizeof(val), &most);
        }
    }
    cr_assert_eq(es.wal_limit, 1024u << 10);
    /* one writer: at most the record it appends before it sees the limit */
    cr_assert_leq(most, es.wal_limit + 2 * sizeof(val), "the WAL reached %llu bytes",
                  (unsigned long long)most);
    cr_assert_gt(es.wal_flushes, 0, "no flush was set off by the WAL");
    cr_assert_lt(es.dirty_bytes, 256u << 10, "the dirty bytes stayed under the write buffer");
    engine_close(e);
    cr_assert_eq(engine_open(&e, &o, err, sizeof(err)), KV_OK, "%s", err);
    for (int k = 0; k < KEYS_W; k++) {
        int kn = snprintf(key, sizeof(key), "w%02d", k);
        cr_assert_eq(engine_get(e, key, (size_t)kn, &r), KV_OK);
        cr_assert(r.found && r.vlen == sizeof(val) && r.val[0] == 'a' + (ROUNDS - 1) % 26,
                  "key %s after the reopen", key);
        free(r.val);
    }
    engine_close(e);
    engine_thread_unregister();
    rm_dir(dir);
}

/* --wal-max-mb below the write buffer: writers wait at the WAL's limit
 * before the dirty bytes call for a flush, so the limit itself must set
 * one off (it did not: every write after the first 256 KiB waited and
 * failed with RESOURCE_EXHAUSTED). Distinct keys, both stores. */
Test(engine, a_wal_limit_under_the_write_buffer_still_flushes, .timeout = 120)
{
    char dir[] = "/tmp/hotkv-engine-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    engine_thread_register();
    engine_opts o = {.fast_dir = dir, .mem_mb = 8, .write_buffer_kb = 4096, .wal_max_kb = 256};
    tk_engine_opts(&o);
    engine *e = NULL;
    char err[256], key[16], val[1000];
    memset(val, 'q', sizeof(val));
    cr_assert_eq(engine_open(&e, &o, err, sizeof(err)), KV_OK, "%s", err);
    engine_stats es;
    uint64_t most = 0;
    for (int k = 0; k < 2000; k++) {
        snprintf(key, sizeof(key), "d%05d", k);
        es = put_watching_wal(e, key, val, sizeof(val), &most);
    }
    cr_assert_leq(most, es.wal_limit + 2 * sizeof(val), "the WAL reached %llu bytes",
                  (unsigned long long)most);
    cr_assert_gt(es.flushes, 0);
    engine_close(e);
    engine_thread_unregister();
    rm_dir(dir);
}

/* A numeric nhc.* stat of e (node_engine_nhc_stats), -1 when missing. */
static double nhc_stat(engine *e, const char *name)
{
    kv_stats l;
    kv_stats_init(&l);
    node_engine_nhc_stats(e, &l);
    const kv_stat *s = kv_stats_find(&l, name);
    char buf[512];
    double v = s ? atof(kv_stat_format(s, buf, sizeof(buf))) : -1;
    kv_stats_free(&l);
    return v;
}

/* With NHC routing reads of promoted records to the slow volume (load_admit
 * forced to 0, then 0.5, data_admit off) and writes going on, the engine
 * still agrees with the model: a read sent to SD never sees an old version. */
Test(engine, nhc_routing_keeps_answers_correct, .timeout = 280)
{
    TK_LSM_ONLY("NHC needs the LSM's slow volume");
    char dir[] = "/tmp/hotkv-engine-XXXXXX", slow[300];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(slow, sizeof(slow), "%s/slow", dir);
    engine_thread_register();
    /* 2 MiB of FD: about half the records end up on SD. With 1 MiB the last
     * FD level sits at its target after the load, and the promoted copies
     * go straight back to SD (copies-only pushes) in the round that promoted
     * them, leaving too few twins for the phases below to meet. */
    engine *e = open_engine_mb(dir, slow, 2);
    nhc *sched = engine_nhc(e);
    cr_assert_not_null(sched, "a slow volume and HotRAP give a scheduler");
    nhc_force(sched, 1.0, true); /* classic while loading */
    mrec *m = calloc(KEYS, sizeof(*m));
    unsigned seed = 7;
    for (int k = 0; k < KEYS; k++) {
        char key[16], err[256], val[550];
        snprintf(key, sizeof(key), "m%d", k);
        memset(val, 'a' + k % 26, sizeof(val));
        engine_write w = {.key = key, .klen = strlen(key), .val = val, .vlen = sizeof(val)};
        engine_result r;
        cr_assert_eq(engine_write_one(e, &w, &r, err, sizeof(err)), KV_OK, "%s", err);
        m[k] = (mrec){.live = true, .version = r.version, .vlen = sizeof(val)};
        memcpy(m[k].val, val, sizeof(val));
    }
    cr_assert_eq(engine_flush(e), KV_OK);
    cr_assert_eq(lsm_compact_wait_idle(e->db), KV_OK);
    /* read a hot set (within the hot-set limit) until HotRAP promotes part
     * of it: the promoted records are twins. The reads go to the LSM
     * directly: through the engine, a key read twice is admitted to the
     * memory tier, and the phases below would then read the twins from
     * memory and never ask NHC. */
    double twins = 0;
    for (int round = 0; round < 20 && twins < 16; round++) { /* enough for the phases below */
        for (int k = 0; k < KEYS; k += 8) { /* spread over the key range: FD and SD */
            char key[16];
            lsm_rec r;
            snprintf(key, sizeof(key), "m%d", k);
            cr_assert_eq(lsm_get(e->db, key, strlen(key), &r, NULL), KV_OK, "get %s", key);
            lsm_rec_free(&r);
        }
        lsm_promo_sync(e->db);
        cr_assert_eq(lsm_compact_wait_idle(e->db), KV_OK);
        twins = nhc_stat(e, "nhc.twin_entries");
    }
    cr_assert_geq(twins, 1, "no twins after promotion rounds");
    for (int phase = 0; phase < 2; phase++) {
        nhc_force(sched, phase ? 0.5 : 0.0, false);
        for (int op = 0; op < 30000; op++) {
            int k = (int)(rand_r(&seed) % KEYS);
            if (rand_r(&seed) % 10 == 0)
                do_write(e, m, k, &seed);
            else if (op % 100 == 0)
                check_get_many(e, m, &seed);
            else
                check_get(e, m, k);
        }
    }
    cr_assert_gt(nhc_stat(e, "nhc.routed_sd"), 0, "reads were sent to the slow volume");
    for (int k = 0; k < KEYS; k++)
        check_get(e, m, k);
    nhc_unforce(sched);
    engine_close(e);
    engine_thread_unregister();
    free(m);
    rm_dir(dir);
}
