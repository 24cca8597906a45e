/* SPDX-License-Identifier: MIT */
/*
 * Tests of the engine's whole-store operations (engine_iter.c) and of the
 * write additions they rely on: engine_iter against a model of puts,
 * deletes and expiring records across flushes and compactions, with the
 * after and filter options; engine_iter while writers, flushes, compactions
 * and HotRAP promotion run (TSan); engine_cleanup (rejected keys gone from
 * memory and SSTs, kept keys intact, memory accounting right);
 * engine_write.expire_at, engine_result.applied and tombstones of keys never
 * seen; engine_wal_sync and engine_estimate.
 */
#include "tests/kv_testfw.h"
#include "tests/kv_testclock.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "node/engine.h"
#include "node/engine_int.h" /* e->db and e->idx, to compact and to audit memory */
#include "tests/node/engine_kind.h"

#define DAY_MS (24 * 3600 * 1000ull)

typedef struct scratch {
    char dir[64], slow[96];
} scratch;

static void scratch_init(scratch *s)
{
    snprintf(s->dir, sizeof(s->dir), "/tmp/hotkv-eiter-XXXXXX");
    cr_assert_not_null(mkdtemp(s->dir));
    snprintf(s->slow, sizeof(s->slow), "%s/slow", s->dir);
}

static void scratch_rm(scratch *s)
{
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", s->dir);
    cr_assert_eq(system(cmd), 0);
}

/* Small buffers (flushes, evictions and compactions happen), tombstones kept
 * for a day unless grace says otherwise. */
static engine *open_engine_clock(scratch *s, size_t mem_mb, size_t wb_kb, engine_sync sync,
                                 tclock *clock)
{
    engine_opts o = {.fast_dir = s->dir,
                     .slow_dir = s->slow,
                     .fast_mb = 1,
                     .mem_mb = mem_mb,
                     .write_buffer_kb = wb_kb,
                     .sync = sync,
                     .tombstone_grace_ms = DAY_MS,
                     .clock = clock ? tclock_now : NULL,
                     .clock_arg = clock};
    tk_engine_opts(&o);
    engine *e = NULL;
    char err[256];
    kv_err rv = engine_open(&e, &o, err, sizeof(err));
    cr_assert_eq(rv, KV_OK, "engine_open: %s", err);
    return e;
}

static engine *open_engine(scratch *s, size_t mem_mb, size_t wb_kb, engine_sync sync)
{
    return open_engine_clock(s, mem_mb, wb_kb, sync, NULL);
}

static void key_of(char *k, int id)
{
    snprintf(k, 8, "e%05d", id);
}

/* A full compaction over the LSM; kallax has none (its flushes rewrite
 * blocks in place), so there it is a flush. */
static void compact(engine *e)
{
    if (tk_kallax())
        cr_assert_eq(engine_flush(e), KV_OK);
    else
        cr_assert_eq(lsm_compact_all(e->db), KV_OK);
}

/* ids 0..NK-1 in the engine's iteration order (key order over the LSM,
 * (home block, key) over kallax). */
static engine *order_engine;

static int id_order_cmp(const void *a, const void *b)
{
    char ka[8], kb[8];
    key_of(ka, *(const int *)a);
    key_of(kb, *(const int *)b);
    return engine_key_cmp(order_engine, ka, 6, kb, 6);
}

static void ids_in_order(engine *e, int *ids, int n)
{
    for (int i = 0; i < n; i++)
        ids[i] = i;
    order_engine = e;
    qsort(ids, (size_t)n, sizeof(*ids), id_order_cmp);
}

static int id_of(const engine_rec *r)
{
    char k[8] = {0};
    cr_assert_eq(r->klen, 6);
    memcpy(k, r->key, 6);
    return atoi(k + 1);
}

static engine_result write_rec(engine *e, int id, const void *val, size_t vlen, bool del,
                               uint64_t version, uint64_t expire_at)
{
    char k[8], err[256];
    key_of(k, id);
    engine_write w = {.key = k,
                      .klen = 6,
                      .val = val,
                      .vlen = vlen,
                      .version = version,
                      .is_delete = del,
                      .expire_at = expire_at};
    engine_result r;
    kv_err rv = engine_write_one(e, &w, &r, err, sizeof(err));
    cr_assert_eq(rv, KV_OK, "write %d: %s", id, err);
    return r;
}

/* ---- engine_iter against a model ---- */

#define NK 3000

typedef struct mrec {
    int state; /* 0 never written, 1 put, 2 tombstone */
    uint64_t version, expire;
    uint8_t val[160];
    size_t vlen;
} mrec;

static void model_write(engine *e, mrec *m, unsigned *seed)
{
    int id = (int)(rand_r(seed) % NK), kind = rand_r(seed) % 10;
    mrec n = {.state = kind == 0 ? 2 : 1};
    uint64_t now = kv_wall_ms();
    n.expire = kind == 1 ? now - 5 : kind == 2 ? now + 3600000 : 0;
    n.vlen = n.state == 1 ? (size_t)(rand_r(seed) % 160) : 0;
    for (size_t i = 0; i < n.vlen; i++)
        n.val[i] = (uint8_t)rand_r(seed);
    engine_result r = write_rec(e, id, n.val, n.vlen, n.state == 2, 0, n.state == 1 ? n.expire : 0);
    cr_assert(r.applied, "a direct write is applied");
    n.version = r.version;
    n.expire = n.state == 1 ? n.expire : 0;
    m[id] = n;
}

static void check_rec(const engine_rec *r, const mrec *m, int id)
{
    cr_assert_neq(m->state, 0, "id %d was never written", id);
    cr_assert_eq(r->version, m->version, "id %d version", id);
    cr_assert_eq(r->expire_at, m->expire, "id %d expire_at", id);
    bool expired = m->state == 1 && m->expire && m->expire <= kv_wall_ms();
    cr_assert(r->tombstone == (m->state == 2) || (expired && r->tombstone),
              "id %d tombstone %d, model state %d", id, r->tombstone, m->state);
    if (r->tombstone) {
        cr_assert(r->val == NULL && r->vlen == 0, "id %d: a tombstone has no value", id);
        return;
    }
    cr_assert_eq(r->vlen, m->vlen, "id %d vlen", id);
    cr_assert(m->vlen == 0 || memcmp(r->val, m->val, m->vlen) == 0, "id %d value", id);
}

typedef struct fcount {
    int mod;
    uint64_t calls;
} fcount;

static bool keep_mod(void *arg, const void *key, size_t klen)
{
    fcount *f = arg;
    char k[8] = {0};
    memcpy(k, key, klen < 7 ? klen : 7);
    f->calls++;
    return atoi(k + 1) % f->mod != 0;
}

/* Iterates from after (-1 = the first key) with keys id % mod == 0 filtered
 * out (mod 0 = no filter) and compares with the model, in the engine's
 * iteration order. */
static void check_iter(engine *e, const mrec *m, int after, int mod)
{
    static int ids[NK];
    ids_in_order(e, ids, NK);
    char a[8];
    key_of(a, after < 0 ? 0 : after);
    fcount fc = {mod ? mod : 1, 0};
    engine_iter_opts o = {.after = after < 0 ? NULL : a,
                          .after_len = 6,
                          .filter = mod ? keep_mod : NULL,
                          .filter_arg = &fc};
    engine_iter *it;
    cr_assert_eq(engine_iter_open(e, &o, &it), KV_OK);
    int pos = -1; /* position in ids of the last id expected */
    while (after >= 0 && ids[pos + 1] != after)
        pos++;
    pos += after >= 0;
    engine_rec r;
    kv_err rv;
    uint64_t n = 0;
    while ((rv = engine_iter_next(it, &r)) == KV_OK) {
        for (pos++; pos < NK && (!m[ids[pos]].state || (mod && ids[pos] % mod == 0)); pos++)
            ;
        cr_assert_lt(pos, NK, "after %d mod %d: id %d past the end", after, mod, id_of(&r));
        cr_assert_eq(id_of(&r), ids[pos], "after %d mod %d: id %d, want %d", after, mod, id_of(&r),
                     ids[pos]);
        check_rec(&r, &m[ids[pos]], ids[pos]);
        n++;
    }
    cr_assert_eq(rv, KV_NOT_FOUND, "%s", kv_err_name(rv));
    for (pos++; pos < NK && (!m[ids[pos]].state || (mod && ids[pos] % mod == 0)); pos++)
        ;
    cr_assert_eq(pos, NK, "after %d: id %d missing", after, pos < NK ? ids[pos] : -1);
    cr_assert_eq(engine_iter_next(it, &r), KV_NOT_FOUND, "the end stays the end");
    cr_assert_geq(engine_iter_scanned(it), n);
    if (mod)
        cr_assert_eq(fc.calls, engine_iter_scanned(it), "the filter runs once per key scanned");
    engine_iter_close(it);
}

Test(engine_iter, model_with_flushes_compactions_after_and_filter, .timeout = 280)
{
    scratch s;
    scratch_init(&s);
    engine_thread_register();
    engine *e = open_engine(&s, 1, 64, ENGINE_SYNC_NONE);
    static mrec m[NK];
    unsigned seed = 5;
    for (int op = 1; op <= 24000; op++) {
        model_write(e, m, &seed);
        if (op % 3000 == 0)
            cr_assert_eq(engine_flush(e), KV_OK);
        if (op % 7000 == 0)
            compact(e);
        if (op % 6000 == 0) {
            check_iter(e, m, -1, 0);
            check_iter(e, m, (int)(rand_r(&seed) % NK), 0);
            check_iter(e, m, (int)(rand_r(&seed) % NK), 3);
            check_iter(e, m, -1, 2);
        }
    }
    engine_stats st;
    engine_get_stats(e, &st);
    cr_assert_gt(st.flushes, 3);
    engine_close(e);
    e = open_engine(&s, 1, 64, ENGINE_SYNC_NONE); /* the WAL's records come back dirty */
    check_iter(e, m, -1, 0);
    engine_iter_close(NULL);
    engine_close(e);
    engine_thread_unregister();
    scratch_rm(&s);
}

/* ---- engine_iter under concurrent writers, flushes and compactions ---- */

#define NSTABLE 1500
#define VAL 100

static void stable_val(uint8_t *v, int id)
{
    for (int i = 0; i < VAL; i++)
        v[i] = (uint8_t)(id * 7 + i);
}

typedef struct race {
    engine *e;
    _Atomic bool stop;
    unsigned seed;
} race;

/* Writes odd ids (never a stable one) until stopped. */
static void *writer_main(void *arg)
{
    race *r = arg;
    engine_thread_register();
    uint8_t v[VAL];
    unsigned seed = r->seed;
    while (!atomic_load(&r->stop)) {
        int id = (int)(rand_r(&seed) % NSTABLE) * 2 + 1;
        memset(v, (int)rand_r(&seed), sizeof(v));
        write_rec(r->e, id, v, sizeof(v), rand_r(&seed) % 8 == 0, 0, 0);
    }
    engine_thread_unregister();
    return NULL;
}

/* Reads stable ids (fills, RALT accesses, promotions) until stopped. */
static void *reader_main(void *arg)
{
    race *r = arg;
    engine_thread_register();
    unsigned seed = r->seed;
    while (!atomic_load(&r->stop)) {
        char k[8];
        key_of(k, (int)(rand_r(&seed) % 200) * 2); /* a hot set */
        engine_result res;
        cr_assert_eq(engine_get(r->e, k, 6, &res), KV_OK);
        free(res.val);
    }
    engine_thread_unregister();
    return NULL;
}

/* The LSM's compactions so far (0 under kallax, which has none). */
static uint64_t compactions_of(engine *e)
{
    lsm_stats s = {0};
    if (!tk_kallax())
        cr_assert_eq(lsm_stats_get(e->db, &s), KV_OK);
    return s.compactions;
}

/* One pass: strictly ascending in the engine's order, every stable id (each
 * once: the order is strict) with its value. */
static void race_pass(engine *e)
{
    engine_iter *it;
    cr_assert_eq(engine_iter_open(e, NULL, &it), KV_OK);
    engine_rec r;
    kv_err rv;
    int prev = -1, stable = 0;
    char pk[8];
    uint8_t v[VAL];
    while ((rv = engine_iter_next(it, &r)) == KV_OK) {
        int id = id_of(&r);
        if (prev >= 0)
            cr_assert_gt(engine_key_cmp(e, r.key, r.klen, pk, 6), 0, "order: %d after %d", id,
                         prev);
        prev = id;
        key_of(pk, id);
        if (id % 2)
            continue;
        stable_val(v, id);
        cr_assert(!r.tombstone && r.vlen == VAL && memcmp(r.val, v, VAL) == 0, "stable id %d", id);
        cr_assert_lt(id, NSTABLE * 2, "stable id %d", id);
        stable++;
    }
    cr_assert_eq(rv, KV_NOT_FOUND, "%s", kv_err_name(rv));
    cr_assert_eq(stable, NSTABLE);
    engine_iter_close(it);
}

Test(engine_iter, concurrent_writers_flushes_and_compactions, .timeout = 280)
{
    scratch s;
    scratch_init(&s);
    engine_thread_register();
    engine *e = open_engine(&s, 1, 32, ENGINE_SYNC_NONE);
    uint8_t v[VAL];
    for (int id = 0; id < NSTABLE * 2; id += 2) {
        stable_val(v, id);
        write_rec(e, id, v, VAL, false, 0, 0);
    }
    race r[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        r[i] = (race){.e = e, .seed = (unsigned)i + 11};
        cr_assert_eq(pthread_create(&th[i], NULL, i < 2 ? writer_main : reader_main, &r[i]), 0);
    }
    /* passes until flushes and compactions have run under them (at least 5
     * passes, at most ~60 s) */
    engine_stats st;
    engine_get_stats(e, &st);
    uint64_t f0 = st.flushes, t0 = kv_now_ns(), c0 = compactions_of(e);
    uint64_t cwant = tk_kallax() ? 0 : 2; /* kallax: flushes only */
    int passes = 0;
    for (; passes < 5 || ((st.flushes < f0 + 8 || compactions_of(e) < c0 + cwant) &&
                          kv_now_ns() - t0 < 60000000000ull);
         passes++) {
        race_pass(e);
        engine_get_stats(e, &st);
    }
    for (int i = 0; i < 3; i++)
        atomic_store(&r[i].stop, true);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    cr_log_info("%d passes, %llu flushes, %llu compactions under them", passes,
                (unsigned long long)(st.flushes - f0),
                (unsigned long long)(compactions_of(e) - c0));
    cr_assert_gt(st.flushes, f0, "flushes ran during the passes");
    race_pass(e);
    engine_close(e);
    engine_thread_unregister();
    scratch_rm(&s);
}

/* ---- engine_cleanup ---- */

typedef struct audit {
    uint64_t bytes, rejected;
    int mod;
} audit;

static void audit_visit(void *arg, const hr_view *v)
{
    audit *a = arg;
    a->bytes += engine_rec_bytes(v->klen, v->vlen);
    char k[8] = {0};
    memcpy(k, v->key, v->klen < 7 ? v->klen : 7);
    a->rejected += atoi(k + 1) % a->mod == 0;
}

Test(engine_cleanup, drops_rejected_keys_everywhere_and_keeps_the_rest)
{
    scratch s;
    scratch_init(&s);
    engine_thread_register();
    engine *e = open_engine(&s, 64, 64, ENGINE_SYNC_NONE);
    uint8_t v[VAL];
    for (int id = 0; id < NK; id++) {
        stable_val(v, id);
        write_rec(e, id, v, VAL, false, 0, 0);
    }
    cr_assert_eq(engine_flush(e), KV_OK);
    compact(e);
    for (int id = 0; id < NK; id += 2) /* some overwritten (versions in L0 and below) */
        write_rec(e, id, "new", 3, false, 0, 0);
    for (int round = 0; round < 2; round++) /* read twice: clean copies in memory */
        for (int id = 0; id < NK; id += 5) {
            char k[8];
            key_of(k, id);
            engine_result res;
            cr_assert_eq(engine_get(e, k, 6, &res), KV_OK);
            free(res.val);
        }
    audit a = {.mod = 4};
    hr_iterate(e->idx, audit_visit, &a);
    cr_assert_gt(a.rejected, 0, "rejected keys are in memory before the cleanup");
    fcount fc = {4, 0};
    uint64_t dropped = 0, kept = 0;
    cr_assert_eq(engine_cleanup(e, keep_mod, &fc, &dropped, &kept), KV_OK);
    cr_assert_geq(dropped, NK / 4, "%llu dropped", (unsigned long long)dropped);
    cr_assert_geq(kept, NK - NK / 4, "%llu kept", (unsigned long long)kept);
    a = (audit){.mod = 4};
    hr_iterate(e->idx, audit_visit, &a);
    cr_assert_eq(a.rejected, 0, "no rejected key left in memory");
    cr_assert_eq(a.bytes, atomic_load(&e->mem_bytes), "memory accounting");
    for (int id = 0; id < NK; id++) {
        char k[8];
        key_of(k, id);
        engine_result res;
        cr_assert_eq(engine_get(e, k, 6, &res), KV_OK);
        cr_assert_eq(res.found, id % 4 != 0, "id %d", id);
        stable_val(v, id);
        if (res.found && id % 2)
            cr_assert(res.vlen == VAL && memcmp(res.val, v, VAL) == 0, "id %d value", id);
        if (res.found && id % 2 == 0)
            cr_assert(res.vlen == 3 && memcmp(res.val, "new", 3) == 0, "id %d value", id);
        free(res.val);
    }
    engine_iter *it;
    cr_assert_eq(engine_iter_open(e, NULL, &it), KV_OK);
    engine_rec r;
    int n = 0;
    while (engine_iter_next(it, &r) == KV_OK) {
        cr_assert_neq(id_of(&r) % 4, 0, "id %d came back", id_of(&r));
        n++;
    }
    cr_assert_eq(n, NK - NK / 4);
    engine_iter_close(it);
    cr_assert_eq(engine_cleanup(e, NULL, NULL, NULL, NULL), KV_INVALID_ARGUMENT);
    engine_close(e);
    engine_thread_unregister();
    scratch_rm(&s);
}

/* ---- write additions ---- */

static bool keep_id(void *arg, const void *key, size_t klen)
{
    char k[8];
    key_of(k, *(const int *)arg);
    return klen == 6 && memcmp(key, k, 6) == 0;
}

/* The single record engine_iter returns for id (it must exist). */
static engine_rec iter_one(engine *e, int id, engine_iter **it)
{
    engine_iter_opts o = {.filter = keep_id, .filter_arg = &id};
    cr_assert_eq(engine_iter_open(e, &o, it), KV_OK);
    engine_rec r;
    cr_assert_eq(engine_iter_next(*it, &r), KV_OK);
    cr_assert_eq(id_of(&r), id);
    return r;
}

Test(engine_write, expire_at_applied_and_tombstones_of_unseen_keys)
{
    scratch s;
    scratch_init(&s);
    engine_thread_register();
    tclock clock;
    tclock_init(&clock);
    engine *e = open_engine_clock(&s, 8, 64, ENGINE_SYNC_NONE, &clock);
    uint64_t now = tclock_now(&clock), v0 = (now - 1000) << 16;
    char k[8], err[256];
    key_of(k, 1);
    engine_write w = {
        .key = k, .klen = 6, .val = "x", .vlen = 1, .ttl_ms = 1, .expire_at = now + 3600000};
    engine_result r;
    cr_assert_eq(engine_write_one(e, &w, &r, err, sizeof(err)), KV_OK);
    tclock_advance(&clock, 5); /* past the ttl_ms, not the expire_at */
    cr_assert_eq(engine_get(e, k, 6, &r), KV_OK);
    cr_assert(r.found, "expire_at wins over ttl_ms");
    free(r.val);
    engine_iter *it;
    cr_assert_eq(iter_one(e, 1, &it).expire_at, now + 3600000);
    engine_iter_close(it);
    write_rec(e, 2, "y", 1, false, 0, now - 1);
    key_of(k, 2);
    cr_assert_eq(engine_get(e, k, 6, &r), KV_OK);
    cr_assert_not(r.found, "an expiry in the past");

    cr_assert(write_rec(e, 3, "a", 1, false, v0 + 10, 0).applied);
    r = write_rec(e, 3, "b", 1, false, v0 + 10, 0);
    cr_assert(!r.applied && r.version == v0 + 10, "the same version is a no-op");
    cr_assert_not(write_rec(e, 3, "c", 1, false, v0 + 5, 0).applied, "an older one too");
    cr_assert(write_rec(e, 3, "d", 1, false, v0 + 20, 0).applied);

    /* a tombstone of a key never seen is stored and outvotes older copies */
    r = write_rec(e, 4, NULL, 0, true, v0 + 100, now + 60000);
    cr_assert(r.applied && !r.found);
    for (int round = 0; round < 3; round++) {
        r = write_rec(e, 4, "old", 3, false, v0 + 50, 0);
        cr_assert(!r.applied && r.version == v0 + 100, "round %d: the older copy lost", round);
        key_of(k, 4);
        cr_assert_eq(engine_get(e, k, 6, &r), KV_OK);
        cr_assert_not(r.found);
        engine_rec t = iter_one(e, 4, &it);
        cr_assert(t.tombstone && t.version == v0 + 100 && t.expire_at == now + 60000,
                  "round %d: the tombstone keeps its version and expiry", round);
        engine_iter_close(it);
        if (round == 0)
            cr_assert_eq(engine_flush(e), KV_OK);
        if (round == 1)
            compact(e); /* younger than the grace: kept */
    }
    engine_close(e);
    engine_thread_unregister();
    scratch_rm(&s);
}

Test(engine_write, wal_sync_and_estimate_in_every_sync_mode)
{
    for (int mode = ENGINE_SYNC_ALWAYS; mode <= ENGINE_SYNC_NONE; mode++) {
        scratch s;
        scratch_init(&s);
        engine_thread_register();
        engine *e = open_engine(&s, 8, 64, (engine_sync)mode);
        uint64_t keys = 0, bytes = 0;
        engine_estimate(e, &keys, &bytes);
        cr_assert(keys == 0 && bytes == 0, "empty");
        uint8_t v[VAL] = {0};
        for (int id = 0; id < 200; id++)
            write_rec(e, id, v, VAL, false, 0, 0);
        cr_assert_eq(engine_wal_sync(e), KV_OK);
        engine_estimate(e, &keys, &bytes);
        cr_assert_eq(keys, 200, "dirty items count");
        cr_assert_eq(bytes, 200 * (6 + VAL), "their keys and values");
        cr_assert_eq(engine_flush(e), KV_OK);
        engine_estimate(e, &keys, &bytes);
        cr_assert_eq(keys, 200, "SST entries count");
        cr_assert_gt(bytes, 200 * (6 + VAL));
        write_rec(e, 7, v, VAL, false, 0, 0);
        cr_assert_eq(engine_wal_sync(e), KV_OK);
        engine_close(e);
        engine_thread_unregister();
        scratch_rm(&s);
    }
}
