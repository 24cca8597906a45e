/* SPDX-License-Identifier: MIT */
/*
 * Concurrency stress for the HotRing index: 4 threads run mixed inserts,
 * in-place and RCU updates, deletes, gets, pins (forced head moves) while
 * rehashes run (two on long rings; eight down to sparse rings), with
 * sampling or random movement; some reads are batched (hr_get_batch).
 * Each thread owns a key range and checks that every acknowledged insert is
 * found and no deleted key reappears; all threads read all keys and check
 * that a found value belongs to its key. At the end every key must be
 * reachable from its ring's head with its last acknowledged version, absent
 * keys must be absent, and the packed words must be intact.
 */
#include "tests/kv_testfw.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/hash.h"
#include "node/index/hotring.h"
#include "tests/node/index/hr_check.h"

#define THREADS 4
#define KEYS_PER_THREAD 512

typedef struct worker {
    hr_index *idx;
    int id;
    _Atomic int *stop;
    int present[KEYS_PER_THREAD];
    uint64_t version[KEYS_PER_THREAD];
    long ops, errors;
} worker;

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int key_of(char *buf, int thread, int i)
{
    return snprintf(buf, 32, "t%d-key-%d", thread, i);
}

/* Value encodes owner, key and version. Small values are 8 raw bytes
 * (updated in place: exercises the per-item seqlock against readers); long
 * ones are text (RCU updates). Readers check value and meta agree. */
static size_t val_of(char *buf, int thread, int i, uint64_t ver, bool big)
{
    if (big)
        return (size_t)snprintf(buf, 64, "%d:%d:%llu:padding-to-force-rcu", thread, i,
                                (unsigned long long)ver);
    uint64_t v = (uint64_t)thread | (uint64_t)i << 8 | (ver & 0xffffffffffull) << 24;
    memcpy(buf, &v, 8);
    return 8;
}

typedef struct seen {
    int thread, key;
    int ok;
    uint64_t version;
    int found; /* batched reads: calls for this key */
} seen;

static void check_cb(void *arg, const hr_view *v)
{
    seen *s = arg;
    int t = -1, k = -1;
    unsigned long long ver = 0;
    if (v->vlen == 8) {
        uint64_t x;
        memcpy(&x, v->val, 8);
        t = (int)(x & 0xff);
        k = (int)(x >> 8 & 0xffff);
        ver = x >> 24;
        s->ok = t == s->thread && k == s->key && ver == (v->meta.version & 0xffffffffffull);
    } else {
        char buf[64];
        size_t n = v->vlen < sizeof buf - 1 ? v->vlen : sizeof buf - 1;
        memcpy(buf, v->val, n);
        buf[n] = 0;
        s->ok = sscanf(buf, "%d:%d:%llu", &t, &k, &ver) == 3 && t == s->thread && k == s->key &&
                ver == v->meta.version;
    }
    s->ok = s->ok && v->meta.seqno == v->meta.version;
    s->version = v->meta.version;
}

/* hr_get_batch callback: arg is an array of seen, one per key. */
static void check_at(void *arg, size_t i, const hr_view *v)
{
    seen *s = (seen *)arg + i;
    s->found++;
    check_cb(s, v);
}

typedef struct iter_ctx {
    hr_index *idx;
    unsigned char seen[THREADS][KEYS_PER_THREAD];
    long bad;
} iter_ctx;

/* hr_iterate callback: every record self-consistent, no key twice. */
static void iter_cb(void *arg, const hr_view *v)
{
    iter_ctx *c = arg;
    char k[32] = {0};
    int t, i;
    memcpy(k, v->key, v->klen < sizeof k - 1 ? v->klen : sizeof k - 1);
    if (sscanf(k, "t%d-key-%d", &t, &i) != 2 || t < 0 || t >= THREADS || i < 0 ||
        i >= KEYS_PER_THREAD) {
        c->bad++;
        return;
    }
    seen s = {t, i, 0, 0};
    check_cb(&s, v);
    if (!s.ok || c->seen[t][i]++) {
        if (c->bad++ < 3)
            fprintf(stderr, "iterate: %s ok=%d seen=%d tag=%08x aux=%p bits=%u\n", k, s.ok,
                    c->seen[t][i], hr_key_tag(v->key, v->klen), (void *)atomic_load(&c->idx->aux),
                    atomic_load(&c->idx->cur)->bits);
    }
}

static void one_op(worker *w, uint64_t *seed)
{
    char k[32], v[64];
    int i = (int)(rnd(seed) % KEYS_PER_THREAD);
    int kl = key_of(k, w->id, i);
    unsigned op = (unsigned)(rnd(seed) % 100);
    if (op < 30) { /* upsert: insert or update, small or big value */
        uint64_t ver = ++w->version[i];
        size_t vl = val_of(v, w->id, i, ver, rnd(seed) % 2);
        hr_meta m = {ver, ver, 0, HR_F_DIRTY};
        if (hr_upsert(w->idx, k, (size_t)kl, v, vl, &m, NULL, NULL) != KV_OK) {
            fprintf(stderr, "upsert failed %s\n", k);
            w->errors++;
        }
        w->present[i] = 1;
    } else if (op < 45) {
        kv_err rv = hr_remove(w->idx, k, (size_t)kl, NULL, NULL);
        if (rv != (w->present[i] ? KV_OK : KV_NOT_FOUND)) {
            fprintf(stderr, "remove %s: %d model %d\n", k, rv, w->present[i]);
            w->errors++;
        }
        w->present[i] = 0;
    } else if (op < 46 && rnd(seed) % 8 == 0) {
        static _Thread_local iter_ctx ic;
        memset(&ic, 0, sizeof ic);
        ic.idx = w->idx;
        hr_iterate(w->idx, iter_cb, &ic);
        if (ic.bad) {
            fprintf(stderr, "iterate: %ld bad records\n", ic.bad);
            w->errors++;
        }
    } else if (op < 47) {
        kv_err rv = hr_pin(w->idx, k, (size_t)kl);
        if (rv != (w->present[i] ? KV_OK : KV_NOT_FOUND))
            w->errors++;
    } else if (op < 55) { /* a batch of own keys (one repeated): as exact as single gets */
        enum { NB = 20 };
        char ks[NB][32];
        hr_key keys[NB];
        seen ss[NB];
        int ix[NB];
        for (int j = 0; j < NB; j++) {
            ix[j] = j == NB - 1 ? ix[0] : (int)(rnd(seed) % KEYS_PER_THREAD);
            keys[j] = (hr_key){ks[j], (size_t)key_of(ks[j], w->id, ix[j])};
            ss[j] = (seen){w->id, ix[j], 0, 0, 0};
        }
        size_t hits = 0, want = 0;
        if (hr_get_batch(w->idx, keys, NB, check_at, ss, &hits) != KV_OK)
            w->errors++;
        for (int j = 0; j < NB; j++) {
            int p = w->present[ix[j]];
            want += (size_t)p;
            if (ss[j].found != p || (p && (!ss[j].ok || ss[j].version != w->version[ix[j]]))) {
                fprintf(stderr, "batch get own %s: found %d model %d ok %d ver %llu model %llu\n",
                        ks[j], ss[j].found, p, ss[j].ok, (unsigned long long)ss[j].version,
                        (unsigned long long)w->version[ix[j]]);
                w->errors++;
            }
        }
        if (hits != want)
            w->errors++;
    } else if (op < 75) { /* own key: must match our model exactly */
        seen s = {w->id, i, 0, 0};
        kv_err rv = hr_get(w->idx, k, (size_t)kl, check_cb, &s);
        if (rv != (w->present[i] ? KV_OK : KV_NOT_FOUND) ||
            (rv == KV_OK && (!s.ok || s.version != w->version[i]))) {
            fprintf(stderr, "get own %s: rv %d model %d ok %d ver %llu model %llu\n", k, rv,
                    w->present[i], s.ok, (unsigned long long)s.version,
                    (unsigned long long)w->version[i]);
            w->errors++;
        }
    } else { /* someone's key: a hit must be self-consistent */
        int t = (int)(rnd(seed) % THREADS);
        kl = key_of(k, t, i);
        seen s = {t, i, 1, 0};
        if (hr_get(w->idx, k, (size_t)kl, check_cb, &s) == KV_OK && !s.ok) {
            fprintf(stderr, "get other %s inconsistent\n", k);
            w->errors++;
        }
    }
    w->ops++;
}

static void *run(void *arg)
{
    worker *w = arg;
    uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(w->id + 1);
    hr_thread_register();
    while (!atomic_load(w->stop))
        for (int j = 0; j < 64; j++)
            one_op(w, &seed);
    hr_thread_unregister();
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Runs THREADS workers for `seconds` on an index of `buckets` buckets and
 * forces `rehashes` rehashes spread evenly over the run. */
static void stress(hr_mode mode, double seconds, uint64_t buckets, int want_rehashes)
{
    hr_thread_register();
    hr_opts o = {buckets, mode, 3, false, 0};
    hr_index *idx = NULL;
    cr_assert_eq(hr_open(&idx, &o), KV_OK);
    _Atomic int stop = 0;
    static worker ws[THREADS];
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) {
        memset(&ws[t], 0, sizeof ws[t]);
        ws[t] = (worker){.idx = idx, .id = t, .stop = &stop};
        pthread_create(&th[t], NULL, run, &ws[t]);
    }
    double t0 = now_s();
    int rehashes = 0;
    /* Runs on past `seconds` (workers still running) until every rehash was
     * done: a slow machine must not change what is tested. */
    while (now_s() - t0 < seconds || rehashes < want_rehashes) {
        usleep(20000);
        double el = now_s() - t0;
        if (rehashes < want_rehashes && el > seconds * (rehashes + 1) / (want_rehashes + 1)) {
            cr_assert_eq(hr_rehash(idx), KV_OK);
            rehashes++;
        }
    }
    atomic_store(&stop, 1);
    long ops = 0, errors = 0, present = 0;
    for (int t = 0; t < THREADS; t++) {
        pthread_join(th[t], NULL);
        ops += ws[t].ops;
        errors += ws[t].errors;
    }
    cr_assert_eq(errors, 0, "%ld of %ld operations saw a wrong result", errors, ops);
    cr_assert_eq(rehashes, want_rehashes);
    char k[32];
    for (int t = 0; t < THREADS; t++) {
        for (int i = 0; i < KEYS_PER_THREAD; i++) {
            int kl = key_of(k, t, i);
            present += ws[t].present[i];
            hr_rcu_lock();
            hr_okey key = {hr_key_tag(k, (size_t)kl), (uint32_t)kl, k, 0};
            hr_item *h = hr_test_head(idx, k, (size_t)kl);
            hr_table *tb = atomic_load(&idx->cur);
            unsigned vis;
            hr_item *x = h ? hr_walk(tb, hr_bucket(tb, key.tag), &key, h, &vis) : NULL;
            hr_rcu_unlock();
            cr_assert_eq(x != NULL, ws[t].present[i] != 0, "key %s reachable=%d, model=%d", k,
                         x != NULL, ws[t].present[i]);
            /* and through the API, with the last acknowledged version */
            seen sv = {t, i, 0, 0};
            kv_err rv = hr_get(idx, k, (size_t)kl, check_cb, &sv);
            cr_assert_eq(rv, ws[t].present[i] ? KV_OK : KV_NOT_FOUND, "get %s: %s", k,
                         kv_strerror(rv));
            if (rv == KV_OK)
                cr_assert(sv.ok && sv.version == ws[t].version[i],
                          "key %s: version %llu, model %llu", k, (unsigned long long)sv.version,
                          (unsigned long long)ws[t].version[i]);
        }
    }
    cr_assert_eq(hr_check_rings(idx), (uint64_t)present);
    hr_stats st;
    hr_get_stats(idx, &st);
    cr_assert_eq(st.items, (uint64_t)present);
    cr_assert_eq(st.rehashes, (uint64_t)want_rehashes);
    cr_assert_eq(st.buckets, buckets << want_rehashes);
    cr_log_info("%s: %ld ops, %llu head moves, %llu rounds",
                mode == HR_MODE_SAMPLE ? "sample" : "random", ops,
                (unsigned long long)st.head_moves, (unsigned long long)st.sample_rounds);
    hr_close(idx);
    hr_thread_unregister();
}

Test(hotring_stress, sample_mode, .timeout = 40)
{
    stress(HR_MODE_SAMPLE, 5.0, 8, 2);
}

Test(hotring_stress, random_mode, .timeout = 40)
{
    stress(HR_MODE_RANDOM, 5.0, 8, 2);
}

/* Many rehashes, ending with ~1 key per 2 buckets: halves that hold only
 * their split item (or lose their last key during the split) are common, as
 * in the node, where a writer once waited for the rehash in that state. */
Test(hotring_stress, repeated_rehash_sparse_rings, .timeout = 60)
{
    stress(HR_MODE_SAMPLE, 5.0, 16, 8);
}

/* Several writers race on the same few keys with a last-writer-wins condition
 * (small values: in-place rewrites under the item's ownership bit; every
 * 4th write is large: RCU replacement) while a reader checks that value and
 * meta always agree. The highest version ever written must win. */
#define HOT_KEYS 4
typedef struct lww_ctx {
    hr_index *idx;
    _Atomic uint64_t *clock;
    _Atomic int *stop;
    uint64_t max_ok[HOT_KEYS];
    long bad;
} lww_ctx;

static kv_err lww_newer(void *arg, const hr_view *cur)
{
    uint64_t mine = *(const uint64_t *)arg;
    return cur && cur->meta.version >= mine ? KV_FAILED_PRECONDITION : KV_OK;
}

static void *lww_writer(void *arg)
{
    lww_ctx *c = arg;
    char k[16], v[64];
    hr_thread_register();
    for (uint64_t n = 0; !atomic_load(c->stop); n++) {
        int i = (int)(n % HOT_KEYS);
        int kl = snprintf(k, sizeof k, "hot-%d", i);
        uint64_t ver = atomic_fetch_add(c->clock, 1) + 1;
        size_t vl = val_of(v, 0, i, ver, n % 4 == 3);
        hr_meta m = {ver, ver, 0, 0};
        kv_err rv = hr_upsert(c->idx, k, (size_t)kl, v, vl, &m, lww_newer, &ver);
        if (rv == KV_OK && ver > c->max_ok[i])
            c->max_ok[i] = ver;
        else if (rv != KV_OK && rv != KV_FAILED_PRECONDITION)
            c->bad++;
    }
    hr_thread_unregister();
    return NULL;
}

static void *lww_reader(void *arg)
{
    lww_ctx *c = arg;
    char k[16];
    hr_thread_register();
    for (uint64_t n = 0; !atomic_load(c->stop); n++) {
        int i = (int)(n % HOT_KEYS);
        int kl = snprintf(k, sizeof k, "hot-%d", i);
        seen s = {0, i, 0, 0};
        if (hr_get(c->idx, k, (size_t)kl, check_cb, &s) == KV_OK && !s.ok)
            c->bad++;
    }
    hr_thread_unregister();
    return NULL;
}

Test(hotring_stress, same_key_writers_last_writer_wins, .timeout = 40)
{
    hr_thread_register();
    hr_opts o = {2, HR_MODE_SAMPLE, 2, false, 0};
    hr_index *idx = NULL;
    cr_assert_eq(hr_open(&idx, &o), KV_OK);
    _Atomic uint64_t clock = 0;
    _Atomic int stop = 0;
    static lww_ctx ctx[4];
    pthread_t th[4];
    for (int t = 0; t < 4; t++) {
        ctx[t] = (lww_ctx){.idx = idx, .clock = &clock, .stop = &stop};
        pthread_create(&th[t], NULL, t == 3 ? lww_reader : lww_writer, &ctx[t]);
    }
    usleep(2000000);
    atomic_store(&stop, 1);
    uint64_t max_ok[HOT_KEYS] = {0};
    for (int t = 0; t < 4; t++) {
        pthread_join(th[t], NULL);
        cr_assert_eq(ctx[t].bad, 0, "thread %d saw %ld inconsistent results", t, ctx[t].bad);
        for (int i = 0; i < HOT_KEYS; i++)
            if (ctx[t].max_ok[i] > max_ok[i])
                max_ok[i] = ctx[t].max_ok[i];
    }
    char k[16];
    for (int i = 0; i < HOT_KEYS; i++) {
        int kl = snprintf(k, sizeof k, "hot-%d", i);
        seen s = {0, i, 0, 0};
        cr_assert_eq(hr_get(idx, k, (size_t)kl, check_cb, &s), KV_OK);
        cr_assert(s.ok);
        cr_assert_eq(s.version, max_ok[i], "key %d: final version %llu, newest acked %llu", i,
                     (unsigned long long)s.version, (unsigned long long)max_ok[i]);
    }
    cr_assert_eq(hr_check_rings(idx), HOT_KEYS);
    hr_close(idx);
    hr_thread_unregister();
}

/* Tiny rings under insert/replace/delete churn: rings often hold only
 * deleted or replaced items (frozen rings, lazy unlinks, head inheritance
 * chains). Values must stay self-consistent and the final structure sound. */
static void *churn(void *arg)
{
    lww_ctx *c = arg;
    char k[16], v[64];
    uint64_t seed = (uint64_t)(uintptr_t)arg | 1;
    hr_thread_register();
    while (!atomic_load(c->stop)) {
        int i = (int)(rnd(&seed) % 3);
        int kl = snprintf(k, sizeof k, "hot-%d", i);
        uint64_t ver = atomic_fetch_add(c->clock, 1) + 1;
        unsigned op = (unsigned)(rnd(&seed) % 8);
        if (op < 3) {
            size_t vl = val_of(v, 0, i, ver, op == 0);
            hr_meta m = {ver, ver, 0, 0};
            if (hr_upsert(c->idx, k, (size_t)kl, v, vl, &m, NULL, NULL) != KV_OK)
                c->bad++;
        } else if (op < 5) {
            kv_err rv = hr_remove(c->idx, k, (size_t)kl, NULL, NULL);
            if (rv != KV_OK && rv != KV_NOT_FOUND)
                c->bad++;
        } else {
            seen s = {0, i, 0, 0};
            if (hr_get(c->idx, k, (size_t)kl, check_cb, &s) == KV_OK && !s.ok)
                c->bad++;
        }
    }
    hr_thread_unregister();
    return NULL;
}

Test(hotring_stress, tiny_rings_churn, .timeout = 40)
{
    hr_thread_register();
    hr_opts o = {2, HR_MODE_RANDOM, 2, false, 0};
    hr_index *idx = NULL;
    cr_assert_eq(hr_open(&idx, &o), KV_OK);
    _Atomic uint64_t clock = 0;
    _Atomic int stop = 0;
    static lww_ctx ctx[3];
    pthread_t th[3];
    for (int t = 0; t < 3; t++) {
        ctx[t] = (lww_ctx){.idx = idx, .clock = &clock, .stop = &stop};
        pthread_create(&th[t], NULL, churn, &ctx[t]);
    }
    usleep(2000000);
    atomic_store(&stop, 1);
    for (int t = 0; t < 3; t++) {
        pthread_join(th[t], NULL);
        cr_assert_eq(ctx[t].bad, 0, "thread %d saw %ld bad results", t, ctx[t].bad);
    }
    uint64_t live = hr_check_rings(idx);
    hr_stats st;
    hr_get_stats(idx, &st);
    cr_assert_eq(st.items, live);
    hr_close(idx);
    hr_thread_unregister();
}
