/* SPDX-License-Identifier: MIT */
/*
 * kallax with readers racing the flush (labelled tsan): one writer keeps
 * rewriting keys with sizes that make records spill and move between blocks
 * (and go to extents and back), while readers look keys up one by one and in
 * batches and an iterator walks the store. A key once flushed must never be
 * missing (a move is seen before or after, never neither), and every value
 * read must match its seqno; no read may fail. Also: concurrent WAL appends
 * (group commit) all come back on reopen.
 */
#define _GNU_SOURCE
#include "tests/kv_testfw.h"

#include <pthread.h>

#include "kx_test.h"

#define NKEYS 400

typedef struct race {
    kx_world w;
    _Atomic bool stop;
    _Atomic uint64_t flushed_keys; /* keys [0, flushed_keys) have been flushed */
    _Atomic uint64_t reads, iters;
} race;

static size_t size_for(uint64_t seq)
{
    uint64_t x = seq * 0x9e3779b97f4a7c15ull >> 40;
    return x % 13 == 0 ? 3000 + x % 3000 : x % 1200;
}

static void *writer(void *arg)
{
    race *r = arg;
    uint8_t *v = malloc(8000);
    uint64_t seq = 0, rng = 3;
    for (unsigned id = 0; id < NKEYS; id++) {
        seq++;
        kx_put_now(&r->w, id, seq, size_for(seq), v);
        atomic_store(&r->flushed_keys, id + 1);
    }
    for (int round = 0; round < 60; round++) {
        lsm_rec run[32];
        char keys[32][KX_KLEN + 1];
        uint8_t *vals = malloc(32 * 6000);
        for (int i = 0; i < 32; i++) {
            unsigned id = (unsigned)((lt_rand(&rng) % (NKEYS / 32)) * 32 + (unsigned)i);
            seq++;
            run[i] = kx_rec(keys[i], vals + i * 6000, id, seq, size_for(seq), false, 0);
        }
        cr_assert_eq(kallax_wal_append(r->w.kx, run, 32), KV_OK);
        kv_err rv = kallax_flush(r->w.kx, run, 32, seq);
        cr_assert_eq(rv, KV_OK, "flush: %s", kv_strerror(rv));
        free(vals);
    }
    atomic_store(&r->stop, true);
    free(v);
    return NULL;
}

static void *reader(void *arg)
{
    race *r = arg;
    uint64_t rng = (uint64_t)(uintptr_t)arg ^ 77;
    while (!atomic_load(&r->stop)) {
        uint64_t n = atomic_load(&r->flushed_keys);
        if (!n)
            continue;
        unsigned id = (unsigned)(lt_rand(&rng) % n);
        uint64_t seq;
        size_t vl;
        bool tomb;
        kv_err rv = kx_get_id(r->w.kx, id, &seq, &vl, &tomb);
        cr_assert_eq(rv, KV_OK, "key %u: %s", id, kv_strerror(rv));
        atomic_fetch_add(&r->reads, 1);
    }
    return NULL;
}

static void *walker(void *arg)
{
    race *r = arg;
    while (!atomic_load(&r->stop)) {
        uint64_t n = atomic_load(&r->flushed_keys), seen = 0;
        kallax_iter *it;
        cr_assert_eq(kallax_iter_open(r->w.kx, &it), KV_OK);
        kv_err rv = kallax_iter_seek(it, NULL, 0);
        for (const lsm_rec *rec; rv == KV_OK && (rec = kallax_iter_rec(it));) {
            cr_assert(kx_value_ok(rec));
            seen += kx_id(rec->key) < n;
            rv = kallax_iter_next(it);
        }
        cr_assert_eq(rv, KV_OK, "iterator: %s", kv_strerror(rv));
        cr_assert_geq(seen, n, "the iterator missed flushed keys");
        kallax_iter_close(it);
        atomic_fetch_add(&r->iters, 1);
    }
    return NULL;
}

Test(kallax_conc, readers_race_flushes_that_move_records, .timeout = 300)
{
    race *r = calloc(1, sizeof(*r));
    kx_world_init(&r->w, "kx-race", 130);
    r->w.o.probe = 6;
    kx_world_open(&r->w, NULL, NULL);
    pthread_t w, rd[2], it;
    pthread_create(&w, NULL, writer, r);
    for (int i = 0; i < 2; i++)
        pthread_create(&rd[i], NULL, reader, r);
    pthread_create(&it, NULL, walker, r);
    pthread_join(w, NULL);
    for (int i = 0; i < 2; i++)
        pthread_join(rd[i], NULL);
    pthread_join(it, NULL);
    kallax_stats s;
    kallax_stats_get(r->w.kx, &s);
    cr_log_info("race: %llu reads, %llu iterations, %llu moves, %llu spilled, %llu retries",
                (unsigned long long)atomic_load(&r->reads),
                (unsigned long long)atomic_load(&r->iters), (unsigned long long)s.moves,
                (unsigned long long)s.spilled, (unsigned long long)s.retries);
    cr_assert_gt(s.moves, 0);
    kx_world_fini(&r->w);
    free(r);
}

typedef struct appender {
    kallax *kx;
    unsigned base;
} appender;

static void *append_many(void *arg)
{
    appender *a = arg;
    uint8_t v[64];
    for (unsigned i = 0; i < 500; i++) {
        char k[KX_KLEN + 1];
        lsm_rec rec = kx_rec(k, v, a->base + i, a->base + i + 1, 20, false, 0);
        cr_assert_eq(kallax_wal_append(a->kx, &rec, 1), KV_OK);
    }
    return NULL;
}

static kv_err count_replay(void *arg, const lsm_rec *r)
{
    cr_assert(kx_value_ok(r));
    (*(unsigned *)arg)++;
    return KV_OK;
}

Test(kallax_conc, concurrent_wal_appends_replay, .timeout = 120)
{
    kx_world w;
    kx_world_init(&w, "kx-append", 16);
    kx_world_open(&w, NULL, NULL);
    pthread_t t[4];
    appender a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (appender){w.kx, (unsigned)i * 1000};
        pthread_create(&t[i], NULL, append_many, &a[i]);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    kallax_close(w.kx);
    unsigned n = 0;
    kx_world_open(&w, count_replay, &n);
    cr_assert_eq(n, 2000u);
    cr_assert_eq(kallax_last_seqno(w.kx), 3500u);
    kx_world_fini(&w);
}
