/* SPDX-License-Identifier: MIT */
/*
 * Engine-level HotRAP tests: the memory-tier check the engine hands the
 * LSM's promotion checker (lsm_opts.newer, engine_mem_newer) answers for
 * dirty, clean and tombstone items from a thread registered by the checker
 * hook, and promotion through the engine never shadows a newer write,
 * whether that write is still only in memory (dirty, unflushed) or already
 * flushed and compacted when the checker runs.
 */
#include "tests/kv_testfw.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "node/engine.h"
#include "node/engine_int.h"
#include "node/lsm/lsm_int.h"

#define NKEYS 600
#define VLEN 200

typedef struct tenv {
    char dir[64], fd[96], sd[96];
    engine *e;
} tenv;

static void t_reopen(tenv *t)
{
    if (t->e) {
        engine_close(t->e);
        t->e = NULL;
    }
    engine_opts o = {.fast_dir = t->fd,
                     .slow_dir = t->sd,
                     .fast_mb = 1,
                     .mem_mb = 4,
                     .write_buffer_kb = 4096, /* only explicit flushes */
                     .sync = ENGINE_SYNC_NONE};
    char err[256];
    kv_err rv = engine_open(&t->e, &o, err, sizeof(err));
    cr_assert_eq(rv, KV_OK, "engine_open: %s", err);
}

static tenv *t_open(void)
{
    tenv *t = calloc(1, sizeof(*t));
    snprintf(t->dir, sizeof(t->dir), "/tmp/kv_enghr_XXXXXX");
    cr_assert_not_null(mkdtemp(t->dir));
    snprintf(t->fd, sizeof(t->fd), "%s/fd", t->dir);
    snprintf(t->sd, sizeof(t->sd), "%s/sd", t->dir);
    engine_thread_register();
    t_reopen(t);
    return t;
}

static void t_close(tenv *t)
{
    engine_close(t->e);
    engine_thread_unregister();
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", t->dir);
    cr_assert_eq(system(cmd), 0);
    free(t);
}

static void key_of(char *k, int id)
{
    snprintf(k, 16, "h%05d", id);
}

static void val_of(char *v, int id, int gen)
{
    memset(v, 'a' + (id + gen) % 26, VLEN);
    snprintf(v, VLEN, "id %d gen %d", id, gen);
}

static void put(tenv *t, int id, int gen, bool del)
{
    char k[16], v[VLEN];
    key_of(k, id);
    val_of(v, id, gen);
    engine_write w = {.key = k, .klen = strlen(k), .val = v, .vlen = VLEN, .is_delete = del};
    engine_result r;
    char err[256];
    kv_err rv = engine_write_one(t->e, &w, &r, err, sizeof(err));
    cr_assert_eq(rv, KV_OK, "write %s: %s", k, err);
}

/* gen < 0: the key must be absent (deleted). */
static void check(tenv *t, int id, int gen)
{
    char k[16], v[VLEN];
    key_of(k, id);
    engine_result r;
    kv_err rv = engine_get(t->e, k, strlen(k), &r);
    cr_assert_eq(rv, KV_OK, "get %s: %s", k, kv_strerror(rv));
    if (gen < 0) {
        cr_assert(!r.found, "%s was deleted but reads back", k);
        return;
    }
    cr_assert(r.found, "%s missing", k);
    val_of(v, id, gen);
    cr_assert_eq(r.vlen, VLEN);
    cr_assert_eq(memcmp(r.val, v, VLEN), 0, "%s reads \"%.20s\", want gen %d", k, (char *)r.val,
                 gen);
    free(r.val);
}

/* The seqno of id's newest record in the LSM (0 = none) and where. */
static uint64_t lsm_seq(tenv *t, int id, lsm_tier *tier)
{
    char k[16];
    key_of(k, id);
    lsm_rec r;
    kv_err rv = lsm_get(t->e->db, k, strlen(k), &r, tier);
    if (rv == KV_NOT_FOUND)
        return 0;
    cr_assert_eq(rv, KV_OK, "lsm_get %s: %s", k, kv_strerror(rv));
    uint64_t s = r.seqno;
    lsm_rec_free(&r);
    return s;
}

static void compact_to_sd(tenv *t)
{
    for (int l = 0; l <= 2; l++)
        cr_assert_eq(lsm_compact_level(t->e->db, l), KV_OK);
}

/* Keys 0..NKEYS-1 at gen 0, flushed and compacted into SD; then a reopen
 * so the memory tier is empty and reads go to SD. */
static tenv *t_open_on_sd(void)
{
    tenv *t = t_open();
    for (int i = 0; i < NKEYS; i++)
        put(t, i, 0, false);
    cr_assert_eq(engine_flush(t->e), KV_OK);
    compact_to_sd(t);
    lsm_stats s;
    cr_assert_eq(lsm_stats_get(t->e->db, &s), KV_OK);
    cr_assert(s.hotrap, "HotRAP is on by default with a slow directory");
    cr_assert_eq(s.levels[0].files + s.levels[1].files + s.levels[2].files, 0, "all on SD");
    t_reopen(t);
    return t;
}

/* ---- engine_mem_newer, called as the checker calls it ---- */

typedef struct probe {
    engine *e;
    const char *key;
    uint64_t seqno;
    bool below, at, absent;
} probe;

static void *probe_main(void *arg)
{
    probe *p = arg;
    engine_promo_thread(p->e, true); /* what the checker thread does first */
    p->below = engine_mem_newer(p->e, p->key, strlen(p->key), p->seqno - 1);
    p->at = engine_mem_newer(p->e, p->key, strlen(p->key), p->seqno);
    p->absent = engine_mem_newer(p->e, "nope", 4, 0);
    engine_promo_thread(p->e, false);
    return NULL;
}

static probe run_probe(tenv *t, int id)
{
    static char k[16];
    key_of(k, id);
    probe p = {.e = t->e, .key = k, .seqno = lsm_last_seqno(t->e->db)};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, probe_main, &p), 0);
    pthread_join(th, NULL);
    return p;
}

/* engine_get_mem serves memory hits on the receiving thread: its sampled
 * hits (1 in 16) feed HotRAP's tracker there too, and it declines only
 * those whose sample would make the tracker write a run (once per 1024
 * samples), which engine_get then takes. Before, every sampled hit was
 * declined, and with it, in a message of many calls, the calls after it. */
Test(engine_hotrap, memory_reads_decline_only_when_the_tracker_would_write)
{
    tenv *t = t_open();
    for (int id = 0; id < 50; id++)
        put(t, id, 0, false);
    engine_stats st0, st1;
    engine_get_stats(t->e, &st0);
    int reads = 40000, declined = 0;
    for (int i = 0; i < reads; i++) {
        char k[16], v[VLEN];
        key_of(k, i % 50);
        engine_result r;
        if (engine_get_mem(t->e, k, strlen(k), &r) == KV_NOT_FOUND) {
            declined++;
            check(t, i % 50, 0); /* what the server then does */
            continue;
        }
        val_of(v, i % 50, 0);
        cr_assert(r.found && r.vlen == VLEN && memcmp(r.val, v, VLEN) == 0, "%s", k);
        free(r.val);
    }
    engine_get_stats(t->e, &st1);
    /* ~2500 samples: a run write at most every 1023, not 1 read in 16 */
    cr_assert_geq(declined, 1, "the tracker's run writes are left to engine_get");
    cr_assert_leq(declined, reads / 16 / 100, "%d of %d memory reads declined", declined, reads);
    cr_assert_eq(st1.gets - st0.gets, (uint64_t)reads, "every read counted once");
    lsm_stats ls;
    cr_assert_eq(lsm_stats_get(t->e->db, &ls), KV_OK);
    cr_assert_geq(ls.ralt_entries, 50, "every key's samples reached the tracker (%llu entries)",
                  (unsigned long long)ls.ralt_entries);
    t_close(t);
}

Test(engine_hotrap, mem_newer_sees_dirty_clean_and_tombstone_items)
{
    tenv *t = t_open();
    put(t, 1, 0, false); /* dirty */
    probe p = run_probe(t, 1);
    cr_assert(p.below, "a dirty item with a higher seqno is newer");
    cr_assert(!p.at, "the same seqno is not newer");
    cr_assert(!p.absent, "an absent key has nothing newer");
    cr_assert_eq(engine_flush(t->e), KV_OK); /* now clean */
    p = run_probe(t, 1);
    cr_assert(p.below, "a clean item with a higher seqno is newer");
    cr_assert(!p.at);
    put(t, 1, 1, true); /* a tombstone, dirty */
    p = run_probe(t, 1);
    cr_assert(p.below, "a tombstone is a newer version too");
    cr_assert(!p.at);
    t_close(t);
}

/* ---- promotion through the engine ---- */

/* Reads keys [a, b) twice each: both reads miss memory (the second fills
 * it), so RALT sees two accesses (stably hot) and the promotion buffer
 * holds the SD record. */
static void read_twice(tenv *t, int a, int b)
{
    for (int round = 0; round < 2; round++)
        for (int i = a; i < b; i++)
            check(t, i, 0);
}

static uint64_t promoted(tenv *t)
{
    lsm_stats s;
    cr_assert_eq(lsm_stats_get(t->e->db, &s), KV_OK);
    return s.promoted_recs;
}

Test(engine_hotrap, promotion_never_shadows_a_dirty_write)
{
    tenv *t = t_open_on_sd();
    read_twice(t, 0, 10);
    for (int i = 0; i < 5; i++)
        put(t, i, 1, i == 3); /* newer versions, only in memory (3 is deleted) */
    lsm_promo_sync(t->e->db); /* the checker runs now, with 0..4 dirty */
    cr_assert_eq(promoted(t), 5, "5..9 promoted, 0..4 dropped (got %llu)",
                 (unsigned long long)promoted(t));
    for (int i = 0; i < 10; i++) {
        lsm_tier tier;
        lsm_seq(t, i, &tier);
        cr_assert_eq(tier, i < 5 ? LSM_TIER_SD : LSM_TIER_FD, "key %d on tier %d", i, tier);
    }
    for (int i = 0; i < 10; i++) /* memory answers */
        check(t, i, i == 3 ? -1 : i < 5 ? 1 : 0);
    engine_close(t->e); /* unflushed: the WAL brings 0..4 back */
    t->e = NULL;
    t_reopen(t);
    for (int i = 0; i < 10; i++)
        check(t, i, i == 3 ? -1 : i < 5 ? 1 : 0);
    cr_assert_eq(engine_flush(t->e), KV_OK);
    compact_to_sd(t);
    t_reopen(t); /* empty memory: the LSM answers */
    for (int i = 0; i < 10; i++)
        check(t, i, i == 3 ? -1 : i < 5 ? 1 : 0);
    t_close(t);
}

/* A write's check of the key's current record (last-writer-wins, the
 * conditions, a delete's `existed`) reads its block but is not a read: the
 * LSM counts no read served by SD, RALT no access, and the record about to
 * be superseded is not offered for promotion. The check still sees the SD
 * record's version. (Plain puts newer than everything stored skip the
 * check; deletes always make it.) */
Test(engine_hotrap, a_write_is_not_a_read_for_hotrap)
{
    tenv *t = t_open_on_sd();
    for (int i = 0; i < 50; i++)
        put(t, i, 1, true); /* each misses memory: its check finds the record on SD */
    char k[16], err[256];
    key_of(k, 100);
    engine_write w = {.key = k, .klen = strlen(k), .val = "x", .vlen = 1, .version = 1};
    engine_result r;
    cr_assert_eq(engine_write_one(t->e, &w, &r, err, sizeof(err)), KV_OK, "%s", err);
    cr_assert_not(r.applied, "an older version loses to the record on SD");
    cr_assert_gt(r.version, 1);
    lsm_promo_sync(t->e->db); /* the checker ran; RALT flushed */
    lsm_stats s;
    cr_assert_eq(lsm_stats_get(t->e->db, &s), KV_OK);
    cr_assert_eq(s.reads_sd + s.reads_fd, 0, "%llu reads counted",
                 (unsigned long long)(s.reads_sd + s.reads_fd));
    cr_assert_eq(s.check_calls, 51);
    cr_assert_geq(s.check_blocks_sd, 51);
    cr_assert_eq(s.promoted_recs + s.promo_dropped, 0, "%llu records offered for promotion",
                 (unsigned long long)(s.promoted_recs + s.promo_dropped));
    cr_assert_eq(s.ralt_entries, 0, "%llu keys tracked as read",
                 (unsigned long long)s.ralt_entries);
    for (int i = 0; i < 50; i++)
        check(t, i, -1);
    check(t, 100, 0);
    t_close(t);
}

Test(engine_hotrap, promotion_never_shadows_a_flushed_and_compacted_write)
{
    tenv *t = t_open_on_sd();
    read_twice(t, 0, 10);
    uint64_t before = lsm_last_seqno(t->e->db);
    for (int i = 0; i < 5; i++)
        put(t, i, 1, false);
    cr_assert_eq(engine_flush(t->e), KV_OK);
    cr_assert_eq(lsm_compact_level(t->e->db, 0), KV_OK); /* the new versions leave L0 */
    cr_assert_eq(lsm_compact_level(t->e->db, 1), KV_OK);
    lsm_promo_sync(t->e->db); /* an old copy in L0 now would win over L1/L2 */
    cr_assert_eq(promoted(t), 5, "got %llu", (unsigned long long)promoted(t));
    for (int i = 0; i < 5; i++) {
        lsm_tier tier;
        cr_assert_gt(lsm_seq(t, i, &tier), before, "key %d: the LSM returns the old version", i);
    }
    t_reopen(t);
    for (int i = 0; i < 10; i++)
        check(t, i, i < 5 ? 1 : 0);
    t_close(t);
}

/* ---- memory-tier eviction keeps the read-hot set ---- */

Test(engine_evict, least_frequently_read_items_go_first)
{
    tenv *t = calloc(1, sizeof(*t));
    snprintf(t->dir, sizeof(t->dir), "/tmp/kv_engev_XXXXXX");
    cr_assert_not_null(mkdtemp(t->dir));
    snprintf(t->fd, sizeof(t->fd), "%s/fd", t->dir);
    engine_thread_register();
    engine_opts o = {.fast_dir = t->fd, .mem_mb = 1, .write_buffer_kb = 64};
    o.sync = ENGINE_SYNC_NONE;
    char err[256];
    cr_assert_eq(engine_open(&t->e, &o, err, sizeof(err)), KV_OK, "%s", err);
    enum { HOT = 24, COLD = 12000 }; /* COLD x ~270 B = 3x the budget */
    for (int i = 0; i < HOT; i++)
        put(t, i, 0, false);
    cr_assert_eq(engine_flush(t->e), KV_OK);  /* clean, evictable */
    for (int round = 0; round < 300; round++) /* memory hits, sampled into the sketch */
        for (int i = 0; i < HOT; i++)
            check(t, i, 0);
    for (int i = 1000; i < 1000 + COLD; i++) /* never read */
        put(t, i, 0, false);
    cr_assert_eq(engine_flush(t->e), KV_OK);
    cr_assert_eq(engine_flush(t->e), KV_OK); /* the bg thread evicts after each flush */
    engine_stats s0, s1;
    engine_get_stats(t->e, &s0);
    cr_assert_gt(s0.evictions, COLD / 2, "evictions ran (%llu), mem %llu of %llu, items %llu",
                 (unsigned long long)s0.evictions, (unsigned long long)s0.mem_bytes,
                 (unsigned long long)s0.mem_limit, (unsigned long long)s0.items);
    cr_assert_leq(s0.mem_bytes, s0.mem_limit);
    for (int i = 0; i < HOT; i++)
        check(t, i, 0);
    engine_get_stats(t->e, &s1);
    cr_assert_eq(s1.reads_mem - s0.reads_mem, HOT, "%llu of %d hot keys still in memory",
                 (unsigned long long)(s1.reads_mem - s0.reads_mem), HOT);
    t_close(t);
}
