/* SPDX-License-Identifier: MIT */
/*
 * Tests for the HotRing item layout and its memory (node/index/hr_internal.h,
 * hr_mem.c): a compact item is one aligned 64-byte line, the extended forms
 * (expiry, 64-bit seqno, big values, long keys) keep every record field, in-
 * place writes stay in place only when the record fits the item's form, flag
 * bits outside HR_F_ALL are refused, the size-class allocator hands out
 * aligned blocks across threads, and the grace-period bookkeeping (one
 * call_rcu per retirement, LATE for a racing head mover) frees every item.
 */
#include "tests/kv_testfw.h"
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/hash.h"
#include "node/index/hotring.h"
#include "tests/node/index/hr_check.h"

static void setup(void)
{
    hr_thread_register();
}
static void teardown(void)
{
    hr_barrier();
    hr_thread_unregister();
}
TestSuite(hotring_layout, .init = setup, .fini = teardown);

static hr_index *open_idx(uint64_t buckets)
{
    hr_opts o = {buckets, HR_MODE_NONE, 5, false, 0};
    hr_index *idx = NULL;
    kv_err rv = hr_open(&idx, &o);
    cr_assert_eq(rv, KV_OK, "hr_open: %s", kv_strerror(rv));
    return idx;
}

typedef struct rec {
    int n;
    unsigned char key[HR_MAX_KLEN], val[2048];
    size_t klen, vlen;
    hr_meta meta;
    const void *keyptr;
} rec;

static void grab(void *arg, const hr_view *v)
{
    rec *r = arg;
    r->n++;
    memcpy(r->key, v->key, v->klen);
    r->klen = v->klen;
    memcpy(r->val, v->val, v->vlen);
    r->vlen = v->vlen;
    r->meta = v->meta;
    r->keyptr = v->key;
}

static rec *get(hr_index *idx, const void *k, size_t kl)
{
    static rec r;
    memset(&r, 0, sizeof r);
    kv_err rv = hr_get(idx, k, kl, grab, &r);
    cr_assert_eq(rv, KV_OK, "get: %s", kv_strerror(rv));
    return &r;
}

static void put(hr_index *idx, const void *k, size_t kl, const void *v, size_t vl, hr_meta m)
{
    kv_err rv = hr_upsert(idx, k, kl, v, vl, &m, NULL, NULL);
    cr_assert_eq(rv, KV_OK, "upsert: %s", kv_strerror(rv));
}

/* The item behind a snapshot (its key pointer is inside the item). */
static hr_item *item_of(const rec *r)
{
    size_t off = offsetof(hr_item, key) + (r->klen >= HR_KLEN_LONG ? 8 : 0);
    return (hr_item *)(uintptr_t)((const unsigned char *)r->keyptr - off);
}

static uint64_t bytes(hr_index *idx)
{
    hr_stats st;
    hr_get_stats(idx, &st);
    return st.bytes;
}

Test(hotring_layout, compact_item_is_one_aligned_line)
{
    cr_assert_eq(offsetof(hr_item, key), HR_ITEM_HDR);
    cr_assert_eq(hr_item_need(8, 0, 0), HR_LINE, "8-byte key + inline value: one line");
    hr_index *idx = open_idx(1024);
    hr_meta m = {UINT64_C(0xfeedface12345678), HR_MW_SEQNO_MAX, 0, HR_F_DIRTY | HR_F_PINNED};
    put(idx, "key-0001", 8, "val-0001", 8, m);
    rec *r = get(idx, "key-0001", 8);
    hr_item *x = item_of(r);
    cr_assert_eq((uintptr_t)x % HR_LINE, 0, "item %p not 64-byte aligned", (void *)x);
    cr_assert_eq(hr_kind(x), 0, "a compact record needs no ext block");
    cr_assert_eq(bytes(idx), HR_LINE);
    cr_assert_eq(memcmp(r->val, "val-0001", 8), 0);
    cr_assert_eq(r->vlen, 8);
    cr_assert_eq(r->meta.version, m.version);
    cr_assert_eq(r->meta.seqno, HR_MW_SEQNO_MAX);
    cr_assert_eq(r->meta.expire_at, 0);
    cr_assert_eq(r->meta.flags, HR_F_DIRTY | HR_F_PINNED);
    /* hr_set_flags rewrites only the flag bits of the meta word */
    cr_assert_eq(hr_set_flags(idx, "key-0001", 8, HR_MW_SEQNO_MAX, 0, HR_F_DIRTY), KV_OK);
    r = get(idx, "key-0001", 8);
    cr_assert_eq(r->meta.flags, HR_F_PINNED);
    cr_assert_eq(r->meta.seqno, HR_MW_SEQNO_MAX);
    cr_assert_eq(r->klen, 8);
    cr_assert_eq(memcmp(r->val, "val-0001", 8), 0);
    hr_close(idx);
}

Test(hotring_layout, expiry_and_wide_seqno_use_the_ext_block)
{
    hr_index *idx = open_idx(1024);
    hr_meta m = {7, 8, 123456789, HR_F_DIRTY};
    put(idx, "exp", 3, "v1", 2, m);
    rec *r = get(idx, "exp", 3);
    hr_item *x = item_of(r);
    cr_assert_eq(hr_kind(x), HR_SEQ_EXT);
    cr_assert_eq(r->meta.expire_at, 123456789);
    cr_assert_eq(r->meta.seqno, 8);
    /* an EXT item takes any small record in place, expiry or not */
    m = (hr_meta){9, 10, 0, 0};
    put(idx, "exp", 3, "v2", 2, m);
    r = get(idx, "exp", 3);
    cr_assert_eq(item_of(r), x, "an ext item is rewritten in place");
    cr_assert_eq(r->meta.expire_at, 0);
    cr_assert_eq(r->meta.seqno, 10);
    cr_assert_eq(memcmp(r->val, "v2", 2), 0);
    /* a compact item cannot hold an expiry or a seqno of 2^48: RCU replacement */
    put(idx, "cmp", 3, "c1", 2, (hr_meta){1, 1, 0, 0});
    hr_item *c = item_of(get(idx, "cmp", 3));
    cr_assert_eq(hr_kind(c), 0);
    put(idx, "cmp", 3, "c2", 2, (hr_meta){2, UINT64_MAX, 0, 0});
    r = get(idx, "cmp", 3);
    cr_assert_neq(item_of(r), c, "a wide seqno needs a new (ext) item");
    cr_assert_eq(r->meta.seqno, UINT64_MAX);
    cr_assert_eq(memcmp(r->val, "c2", 2), 0);
    c = item_of(r);
    put(idx, "cmp", 3, "c3", 2, (hr_meta){3, 4, 99, 0});
    r = get(idx, "cmp", 3);
    cr_assert_eq(item_of(r), c);
    cr_assert_eq(r->meta.expire_at, 99);
    cr_assert_eq(hr_check_rings(idx), 2);
    hr_close(idx);
}

Test(hotring_layout, big_values_and_long_keys_round_trip)
{
    hr_index *idx = open_idx(64);
    static unsigned char key[HR_MAX_KLEN], val[2000];
    for (size_t i = 0; i < sizeof key; i++)
        key[i] = (unsigned char)(i * 7 + 1);
    for (size_t i = 0; i < sizeof val; i++)
        val[i] = (unsigned char)(i * 13 + 5);
    const size_t klens[] = {1, 8, 9, 63, 510, 511, 512, 1000, HR_MAX_KLEN};
    const size_t vlens[] = {0, 8, 9, 100, 2000};
    size_t n = 0;
    for (size_t a = 0; a < sizeof klens / sizeof klens[0]; a++) {
        for (size_t b = 0; b < sizeof vlens / sizeof vlens[0]; b++) {
            key[0] = (unsigned char)b; /* one key per (klen, vlen) pair */
            hr_meta m = {a * 10 + b, a * 100 + b, b == 2 ? 5 : 0, (uint32_t)(b % 2)};
            put(idx, key, klens[a], val, vlens[b], m);
            n++;
            rec *r = get(idx, key, klens[a]);
            cr_assert_eq(r->klen, klens[a]);
            cr_assert_eq(memcmp(r->key, key, klens[a]), 0, "key of %zu bytes", klens[a]);
            cr_assert_eq(r->vlen, vlens[b]);
            cr_assert_eq(memcmp(r->val, val, vlens[b]), 0, "value of %zu bytes", vlens[b]);
            cr_assert_eq(r->meta.version, m.version);
            cr_assert_eq(r->meta.seqno, m.seqno);
            cr_assert_eq(r->meta.expire_at, m.expire_at);
            cr_assert_eq(r->meta.flags, m.flags);
            hr_item *x = item_of(r);
            cr_assert_eq((uintptr_t)x % 8, 0);
            if (hr_item_need_of(x) <= HR_MEM_SMALL_MAX)
                cr_assert_eq((uintptr_t)x % HR_LINE, 0, "small items are line aligned");
            cr_assert_eq(!!(hr_kind(x) & HR_SEQ_BIG), vlens[b] > HR_INLINE_MAX);
        }
    }
    cr_assert_eq(hr_check_rings(idx), n);
    /* every item was counted at its size class */
    uint64_t want = 0;
    for (size_t a = 0; a < sizeof klens / sizeof klens[0]; a++)
        for (size_t b = 0; b < sizeof vlens / sizeof vlens[0]; b++) {
            uint32_t kind = vlens[b] > HR_INLINE_MAX ? HR_SEQ_BIG | HR_SEQ_EXT
                            : b == 2                 ? HR_SEQ_EXT
                                                     : 0;
            want += hr_mem_class_bytes(hr_item_need(klens[a], kind, vlens[b]));
        }
    cr_assert_eq(bytes(idx), want);
    hr_close(idx);
}

Test(hotring_layout, flags_outside_the_item_bits_are_refused)
{
    hr_index *idx = open_idx(16);
    hr_meta m = {1, 1, 0, HR_F_ALL + 1};
    cr_assert_eq(hr_upsert(idx, "k", 1, "v", 1, &m, NULL, NULL), KV_INVALID_ARGUMENT);
    m.flags = HR_F_ALL;
    cr_assert_eq(hr_upsert(idx, "k", 1, "v", 1, &m, NULL, NULL), KV_OK);
    cr_assert_eq(hr_set_flags(idx, "k", 1, 1, 0x10, 0), KV_INVALID_ARGUMENT);
    cr_assert_eq(hr_set_flags(idx, "k", 1, 1, 0, ~0u), KV_OK, "clearing any bit is fine");
    cr_assert_eq(get(idx, "k", 1)->meta.flags, 0);
    hr_close(idx);
}

/* ------------------------------------------------------------ allocator */

#define ALLOC_N 5000

static void *alloc_many(void *arg)
{
    void **p = arg;
    hr_thread_register();
    for (int i = 0; i < ALLOC_N; i++) {
        size_t n = (size_t)(i % HR_MEM_SMALL_MAX) + 1;
        p[i] = hr_mem_alloc(n);
        cr_assert_not_null(p[i]);
        cr_assert_eq((uintptr_t)p[i] % HR_LINE, 0);
        memset(p[i], 0xa5, n);
    }
    hr_thread_unregister();
    return NULL;
}

Test(hotring_layout, size_classes_are_aligned_and_cross_thread_safe)
{
    static void *p[2][ALLOC_N];
    pthread_t th[2];
    for (int t = 0; t < 2; t++)
        pthread_create(&th[t], NULL, alloc_many, p[t]);
    for (int t = 0; t < 2; t++)
        pthread_join(th[t], NULL);
    /* no block handed out twice */
    for (int t = 0; t < 2; t++)
        for (int i = 1; i < ALLOC_N; i += 97)
            for (int u = 0; u < 2; u++)
                for (int j = 0; j < ALLOC_N; j += 89)
                    cr_assert(p[t][i] != p[u][j] || (t == u && i == j));
    /* blocks allocated by other threads are freed here */
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < ALLOC_N; i++)
            hr_mem_free(p[t][i], (size_t)(i % HR_MEM_SMALL_MAX) + 1);
    void *big = hr_mem_alloc(HR_MEM_SMALL_MAX + 1);
    cr_assert_not_null(big);
    cr_assert_eq((uintptr_t)big % 8, 0);
    hr_mem_free(big, HR_MEM_SMALL_MAX + 1);
    cr_assert_eq(hr_mem_class_bytes(1), HR_LINE);
    cr_assert_eq(hr_mem_class_bytes(HR_LINE + 1), 2 * HR_LINE);
}

/* ------------------------------------------------------------ retirement */

Test(hotring_layout, late_install_of_a_dead_item_is_marked)
{
    hr_index *idx = open_idx(16);
    put(idx, "a", 1, "1", 1, (hr_meta){1, 1, 0, 0});
    hr_item *x = item_of(get(idx, "a", 1));
    hr_rcu_lock();
    hr_installed(x); /* live: nothing to mark */
    cr_assert_eq(atomic_load(&x->seq) & HR_SEQ_LATE, 0);
    hr_rcu_unlock();
    /* delete it and, inside one read section, play a mover that installed it
     * after its deletion: the item must wait for a second grace period */
    hr_rcu_lock();
    cr_assert_eq(hr_remove(idx, "a", 1, NULL, NULL), KV_OK);
    hr_installed(x);
    cr_assert_neq(atomic_load(&x->seq) & HR_SEQ_LATE, 0);
    hr_rcu_unlock();
    hr_barrier(); /* frees x through both callbacks (ASan checks it) */
    cr_assert_eq(hr_check_rings(idx), 0);
    hr_close(idx);
}

/* RCU updates of big values under concurrent readers: every read sees one
 * whole value (its bytes derived from its version), never a freed item. */
typedef struct upd_ctx {
    hr_index *idx;
    _Atomic int *stop;
    _Atomic uint64_t *clock;
    long bad, ops;
    bool writer;
} upd_ctx;

static void fill(unsigned char *v, size_t n, uint64_t ver)
{
    for (size_t i = 0; i < n; i++)
        v[i] = (unsigned char)(ver * 31 + i);
}

static void check_val(void *arg, const hr_view *v)
{
    upd_ctx *c = arg;
    unsigned char want[64];
    fill(want, sizeof want, v->meta.version);
    if (v->vlen != (v->meta.version % 2 ? 8u : 64u) || memcmp(v->val, want, v->vlen) != 0)
        c->bad++;
}

static void *upd_thread(void *arg)
{
    upd_ctx *c = arg;
    unsigned char v[64];
    char k[8];
    hr_thread_register();
    for (unsigned i = 0; !atomic_load(c->stop); i++) {
        int kl = snprintf(k, sizeof k, "u%u", i % 4);
        if (c->writer) {
            uint64_t ver = atomic_fetch_add(c->clock, 1) + 1;
            fill(v, sizeof v, ver);
            hr_meta m = {ver, ver, 0, 0};
            if (hr_upsert(c->idx, k, (size_t)kl, v, ver % 2 ? 8 : 64, &m, NULL, NULL) != KV_OK)
                c->bad++;
        } else if (hr_get(c->idx, k, (size_t)kl, check_val, c) != KV_OK) {
            c->bad++;
        }
        c->ops++;
        if (c->ops >= 100000)
            break;
    }
    hr_thread_unregister();
    return NULL;
}

Test(hotring_layout, rcu_updates_under_concurrent_readers, .timeout = 60)
{
    hr_opts o = {2, HR_MODE_RANDOM, 2, false, 0};
    hr_index *idx = NULL;
    cr_assert_eq(hr_open(&idx, &o), KV_OK);
    _Atomic int stop = 0;
    _Atomic uint64_t clock = 0;
    unsigned char v[64];
    for (int i = 0; i < 4; i++) {
        char k[8];
        int kl = snprintf(k, sizeof k, "u%d", i);
        uint64_t ver = atomic_fetch_add(&clock, 1) + 1;
        fill(v, sizeof v, ver);
        put(idx, k, (size_t)kl, v, ver % 2 ? 8 : 64, (hr_meta){ver, ver, 0, 0});
    }
    static upd_ctx ctx[4];
    pthread_t th[4];
    for (int t = 0; t < 4; t++) {
        ctx[t] = (upd_ctx){idx, &stop, &clock, 0, 0, t < 2};
        pthread_create(&th[t], NULL, upd_thread, &ctx[t]);
    }
    for (int t = 0; t < 4; t++) {
        pthread_join(th[t], NULL);
        cr_assert_eq(ctx[t].bad, 0, "thread %d: %ld bad of %ld", t, ctx[t].bad, ctx[t].ops);
    }
    cr_assert_eq(hr_check_rings(idx), 4);
    hr_close(idx);
}
