/* SPDX-License-Identifier: MIT */
/*
 * Tests of the kallax store: random puts, deletes and TTL puts against a
 * model with a test-side memtable flushed as runs and close + reopen (WAL
 * replay) along the way, on both I/O paths; iteration order and resume;
 * spills, moves and a full probe window; extents (big values, their pages
 * reclaimed and rebuilt at open); TTL and tombstones with and without the
 * grace period; bad options. Corruption is in kallax_fault_test.c.
 */
#define _GNU_SOURCE
#include "tests/kv_testfw.h"

#include "kx_test.h"

#define NKEYS 3000

typedef struct mrec {
    bool present;
    uint8_t type;
    uint64_t seq, expire;
    size_t vlen;
} mrec;

typedef struct model {
    kx_world w;
    mrec stored[NKEYS], mem[NKEYS];
    uint64_t seq, rng;
    uint8_t *vbuf;
} model;

static kv_err replay(void *arg, const lsm_rec *r)
{
    model *m = arg;
    cr_assert_eq(r->klen, KX_KLEN);
    unsigned id = kx_id(r->key);
    cr_assert(id < NKEYS && kx_value_ok(r));
    if (!m->mem[id].present || m->mem[id].seq < r->seqno)
        m->mem[id] = (mrec){true, r->type, r->seqno, r->expire_at, r->vlen};
    return KV_OK;
}

static size_t draw_vlen(model *m)
{
    uint64_t x = lt_rand(&m->rng);
    if (x % 50 == 0)
        return 3000 + (size_t)(x >> 8) % 30000; /* an extent */
    return (size_t)(x >> 8) % 300;
}

/* Flushes the memtable as one run. */
static void flush_mem(model *m)
{
    lsm_rec *run = calloc(NKEYS, sizeof(*run));
    char(*keys)[KX_KLEN + 1] = calloc(NKEYS, sizeof(*keys));
    uint8_t **vals = calloc(NKEYS, sizeof(*vals));
    size_t n = 0;
    for (unsigned id = 0; id < NKEYS; id++) {
        mrec *r = &m->mem[id];
        if (!r->present)
            continue;
        vals[n] = malloc(r->vlen + 1);
        run[n] = kx_rec(keys[id], vals[n], id, r->seq, r->vlen, r->type == LSM_DELETE, r->expire);
        n++;
    }
    kv_err rv = kallax_flush(m->w.kx, run, n, m->seq);
    cr_assert_eq(rv, KV_OK, "flush of %zu: %s", n, kv_strerror(rv));
    for (unsigned id = 0; id < NKEYS; id++)
        if (m->mem[id].present)
            m->stored[id] = m->mem[id];
    memset(m->mem, 0, sizeof(m->mem));
    for (size_t i = 0; i < n; i++)
        free(vals[i]);
    free(run);
    free(keys);
    free(vals);
}

static void one_op(model *m)
{
    uint64_t x = lt_rand(&m->rng);
    unsigned id = (unsigned)(x % NKEYS);
    bool del = (x >> 20) % 8 == 0;
    uint64_t exp = (x >> 24) % 16 == 0 ? 1000 + (x >> 30) % 1000 : 0; /* long past */
    size_t vlen = del ? 0 : draw_vlen(m);
    char k[KX_KLEN + 1];
    lsm_rec r = kx_rec(k, m->vbuf, id, ++m->seq, vlen, del, exp);
    kv_err rv = kallax_wal_append(m->w.kx, &r, 1);
    cr_assert_eq(rv, KV_OK, "wal_append: %s", kv_strerror(rv));
    m->mem[id] = (mrec){true, r.type, r.seqno, exp, vlen};
}

static void check_all(model *m)
{
    for (unsigned id = 0; id < NKEYS; id++) {
        uint64_t seq;
        size_t vlen;
        bool tomb;
        kv_err rv = kx_get_id(m->w.kx, id, &seq, &vlen, &tomb);
        mrec *e = &m->stored[id];
        if (!e->present) {
            cr_assert_eq(rv, KV_NOT_FOUND, "key %u: %s, want NOT_FOUND", id, kv_strerror(rv));
            continue;
        }
        cr_assert_eq(rv, KV_OK, "key %u: %s", id, kv_strerror(rv));
        cr_assert_eq(seq, e->seq, "key %u: seqno %llu want %llu", id, (unsigned long long)seq,
                     (unsigned long long)e->seq);
        cr_assert_eq(tomb, e->type == LSM_DELETE);
        cr_assert_eq(vlen, e->vlen);
    }
}

static void reopen(model *m)
{
    kallax_close(m->w.kx);
    memset(m->mem, 0, sizeof(m->mem));
    kx_world_open(&m->w, replay, m);
    cr_assert_eq(kallax_last_seqno(m->w.kx), m->seq);
}

static void run_model(bool uring)
{
    model *m = calloc(1, sizeof(*m));
    m->vbuf = malloc(33000);
    m->rng = 42;
    kx_world_init(&m->w, "kx-model", 400);
    m->w.o.disable_io_uring = !uring;
    m->w.o.journal_blocks = 64; /* several rounds per flush */
    kx_world_open(&m->w, replay, m);
    for (int op = 1; op <= 20000; op++) {
        one_op(m);
        if (op % 700 == 0)
            flush_mem(m);
        if (op % 3100 == 0)
            reopen(m); /* unflushed records come back through the replay */
        if (op % 4000 == 0)
            check_all(m);
    }
    flush_mem(m);
    check_all(m);
    reopen(m);
    check_all(m);
    kallax_stats s;
    kallax_stats_get(m->w.kx, &s);
    cr_assert_gt(s.extent_pages_used, 0);
    cr_assert_eq(s.corrupt_blocks, 0);
    cr_log_info("model: %llu records, load %.2f, %llu spilled, %llu moves, %llu extent pages",
                (unsigned long long)s.records, s.load, (unsigned long long)s.spilled,
                (unsigned long long)s.moves, (unsigned long long)s.extent_pages_used);
    kx_world_fini(&m->w);
    free(m->vbuf);
    free(m);
}

Test(kallax, model_with_reopens_io_uring, .timeout = 300)
{
    run_model(true);
}

Test(kallax, model_with_reopens_pread, .timeout = 300)
{
    run_model(false);
}

/* ---- iteration ---- */

static void load_keys(kx_world *w, unsigned n, uint8_t *v)
{
    for (unsigned id = 0; id < n; id++)
        kx_put_now(w, id, id + 1, id % 7 == 0 ? 5000 : 40 + id % 90, v);
}

Test(kallax, iteration_order_and_resume, .timeout = 120)
{
    kx_world w;
    uint8_t *v = malloc(8000);
    kx_world_init(&w, "kx-iter", 150); /* more records than blocks: spills too */
    kx_world_open(&w, NULL, NULL);
    load_keys(&w, 1200, v);
    kallax_iter *it;
    cr_assert_eq(kallax_iter_open(w.kx, &it), KV_OK);
    cr_assert_eq(kallax_iter_seek(it, NULL, 0), KV_OK);
    static char seen[1200][KX_KLEN];
    unsigned n = 0;
    for (const lsm_rec *r; (r = kallax_iter_rec(it)); kallax_iter_next(it), n++) {
        cr_assert_lt(n, 1200u);
        cr_assert(kx_value_ok(r));
        cr_assert_eq(r->seqno, kx_id(r->key) + 1);
        if (n)
            cr_assert_lt(kallax_key_cmp(w.kx, seen[n - 1], KX_KLEN, r->key, r->klen), 0,
                         "order broken at %u", n);
        memcpy(seen[n], r->key, KX_KLEN);
    }
    kallax_iter_close(it);
    cr_assert_eq(n, 1200u);
    /* resume after every 37th key with a fresh iterator each time */
    unsigned at = 0;
    while (at < n) {
        cr_assert_eq(kallax_iter_open(w.kx, &it), KV_OK);
        cr_assert_eq(kallax_iter_seek(it, at ? seen[at - 1] : NULL, at ? KX_KLEN : 0), KV_OK);
        for (int k = 0; k < 37 && at < n; k++, at++) {
            const lsm_rec *r = kallax_iter_rec(it);
            cr_assert_not_null(r, "resume lost key %u", at);
            cr_assert(memcmp(r->key, seen[at], KX_KLEN) == 0, "resume at %u", at);
            cr_assert_eq(kallax_iter_next(it), KV_OK);
        }
        kallax_iter_close(it);
    }
    kx_world_fini(&w);
    free(v);
}

/* ---- spill, moves, a full window ---- */

Test(kallax, spill_move_and_full_window, .timeout = 120)
{
    kx_world w;
    uint8_t *v = malloc(4096);
    kx_world_init(&w, "kx-spill", 32);
    kx_world_open(&w, NULL, NULL);
    uint64_t seq = 0;
    for (unsigned id = 0; id < 40; id++) /* 3 records of 1 KiB fit a block */
        kx_put_now(&w, id, ++seq, 1000, v);
    kallax_stats s;
    kallax_stats_get(w.kx, &s);
    cr_assert_gt(s.spilled, 0, "nothing spilled at load %.2f", s.load);
    for (unsigned id = 0; id < 40; id++) /* grow: some no longer fit their block */
        kx_put_now(&w, id, ++seq, id % 3 == 0 ? 2000 : 1000, v);
    kallax_stats_get(w.kx, &s);
    cr_assert_gt(s.moves, 0);
    kallax_close(w.kx);
    kx_world_open(&w, NULL, NULL);
    for (unsigned id = 0; id < 40; id++) {
        uint64_t sq;
        size_t vl;
        bool tomb;
        cr_assert_eq(kx_get_id(w.kx, id, &sq, &vl, &tomb), KV_OK, "key %u", id);
        cr_assert_eq(vl, id % 3 == 0 ? 2000u : 1000u);
    }
    /* fill until a window is full: refused whole, nothing changed */
    kv_err rv = KV_OK;
    unsigned id = 40;
    for (; rv == KV_OK && id < 1000; id++) {
        char k[KX_KLEN + 1];
        lsm_rec r = kx_rec(k, v, id, ++seq, 1800, false, 0);
        cr_assert_eq(kallax_wal_append(w.kx, &r, 1), KV_OK);
        kallax_stats_get(w.kx, &s);
        rv = kallax_flush(w.kx, &r, 1, seq);
    }
    cr_assert_eq(rv, KV_RESOURCE_EXHAUSTED, "the store never filled: %s", kv_strerror(rv));
    kallax_stats s2;
    kallax_stats_get(w.kx, &s2);
    cr_assert_eq(s2.records, s.records);
    uint64_t sq;
    size_t vl;
    bool tomb;
    cr_assert_eq(kx_get_id(w.kx, id - 1, &sq, &vl, &tomb), KV_NOT_FOUND);
    kx_world_fini(&w);
    free(v);
}

/* ---- extents ---- */

Test(kallax, extents_reclaimed_and_rebuilt, .timeout = 120)
{
    kx_world w;
    uint8_t *v = malloc(300000);
    kx_world_init(&w, "kx-ext", 64);
    kx_world_open(&w, NULL, NULL);
    kx_put_now(&w, 1, 1, 5000, v);
    kx_put_now(&w, 2, 2, 250000, v);
    kx_put_now(&w, 3, 3, 2100, v); /* just over inline_max */
    kallax_stats s;
    kallax_stats_get(w.kx, &s);
    uint64_t want = kx_ext_pages(5000) + kx_ext_pages(250000) + kx_ext_pages(2100);
    cr_assert_eq(s.extent_pages_used, want);
    kallax_close(w.kx);
    kx_world_open(&w, NULL, NULL); /* the free map comes back from the blocks */
    kallax_stats_get(w.kx, &s);
    cr_assert_eq(s.extent_pages_used, want);
    uint64_t sq;
    size_t vl;
    bool tomb;
    cr_assert_eq(kx_get_id(w.kx, 2, &sq, &vl, &tomb), KV_OK);
    cr_assert_eq(vl, 250000u);
    kx_put_now(&w, 2, 4, 10, v); /* inline now: its pages go after two flushes */
    kx_put_now(&w, 9, 5, 10, v);
    kx_put_now(&w, 9, 6, 10, v);
    kallax_stats_get(w.kx, &s);
    cr_assert_eq(s.extent_pages_used, kx_ext_pages(5000) + kx_ext_pages(2100));
    cr_assert_eq(kx_get_id(w.kx, 2, &sq, &vl, &tomb), KV_OK);
    cr_assert_eq(vl, 10u);
    kx_world_fini(&w);
    free(v);
}

/* ---- TTL and tombstones ---- */

Test(kallax, ttl_and_tombstones, .timeout = 60)
{
    kx_world w;
    uint8_t v[3][64];
    char k[3][KX_KLEN + 1];
    kx_world_init(&w, "kx-ttl", 32);
    kx_world_open(&w, NULL, NULL);
    uint64_t far = kv_wall_ms() + 3600000;
    lsm_rec r[3] = {kx_rec(k[0], v[0], 1, 1, 10, false, 5), kx_rec(k[1], v[1], 2, 2, 0, true, 0),
                    kx_rec(k[2], v[2], 3, 3, 10, false, far)};
    cr_assert_eq(kallax_wal_append(w.kx, r, 3), KV_OK);
    cr_assert_eq(kallax_flush(w.kx, r, 3, 3), KV_OK);
    uint64_t sq;
    size_t vl;
    bool tomb;
    /* within the grace period: stored as written (the engine filters) */
    cr_assert_eq(kx_get_id(w.kx, 1, &sq, &vl, &tomb), KV_OK);
    cr_assert_eq(kx_get_id(w.kx, 2, &sq, &vl, &tomb), KV_OK);
    cr_assert(tomb);
    kallax_close(w.kx);
    w.o.tombstone_grace_ms = 0; /* past it: dropped when written or rewritten */
    kx_world_open(&w, NULL, NULL);
    lsm_rec again[2] = {kx_rec(k[0], v[0], 1, 5, 10, false, 5),
                        kx_rec(k[1], v[1], 2, 6, 0, true, 0)};
    cr_assert_eq(kallax_wal_append(w.kx, again, 2), KV_OK);
    cr_assert_eq(kallax_flush(w.kx, again, 2, 6), KV_OK);
    cr_assert_eq(kx_get_id(w.kx, 1, &sq, &vl, &tomb), KV_NOT_FOUND);
    cr_assert_eq(kx_get_id(w.kx, 2, &sq, &vl, &tomb), KV_NOT_FOUND);
    cr_assert_eq(kx_get_id(w.kx, 3, &sq, &vl, &tomb), KV_OK); /* not expired */
    cr_assert_eq(sq, 3u);
    kx_world_fini(&w);
}

/* ---- cleanup ---- */

static bool keep_even(void *arg, const void *key, size_t klen)
{
    (void)arg;
    (void)klen;
    return kx_id(key) % 2 == 0;
}

Test(kallax, cleanup_drops_rejected_keys, .timeout = 60)
{
    kx_world w;
    uint8_t *v = malloc(8000);
    kx_world_init(&w, "kx-clean", 40);
    kx_world_open(&w, NULL, NULL);
    load_keys(&w, 300, v);
    uint64_t dropped = 0, gen = kallax_flush_generation(w.kx);
    cr_assert_eq(kallax_cleanup(w.kx, keep_even, NULL, &dropped), KV_OK);
    cr_assert_eq(dropped, 150u);
    cr_assert_gt(kallax_flush_generation(w.kx), gen);
    kallax_close(w.kx);
    kx_world_open(&w, NULL, NULL);
    for (unsigned id = 0; id < 300; id++) {
        uint64_t sq;
        size_t vl;
        bool tomb;
        cr_assert_eq(kx_get_id(w.kx, id, &sq, &vl, &tomb), id % 2 ? KV_NOT_FOUND : KV_OK);
    }
    uint64_t recs, bytes;
    kallax_estimate(w.kx, &recs, &bytes);
    cr_assert_eq(recs, 150u);
    kx_world_fini(&w);
    free(v);
}

/* ---- multiget ---- */

Test(kallax, multiget_matches_get, .timeout = 60)
{
    kx_world w;
    uint8_t *v = malloc(8000);
    kx_world_init(&w, "kx-mget", 30);
    kx_world_open(&w, NULL, NULL);
    load_keys(&w, 200, v);
    char keys[250][KX_KLEN + 1];
    const void *kp[250];
    size_t kl[250];
    lsm_rec outs[250];
    kv_err errs[250];
    for (unsigned i = 0; i < 250; i++) {
        kx_key(keys[i], i);
        kp[i] = keys[i];
        kl[i] = KX_KLEN;
    }
    cr_assert_eq(kallax_multiget(w.kx, 250, kp, kl, outs, errs), KV_OK);
    for (unsigned i = 0; i < 250; i++) {
        cr_assert_eq(errs[i], i < 200 ? KV_OK : KV_NOT_FOUND, "key %u: %s", i,
                     kv_strerror(errs[i]));
        if (errs[i] == KV_OK) {
            cr_assert(kx_value_ok(&outs[i]));
            cr_assert_eq(outs[i].seqno, i + 1);
            lsm_rec_free(&outs[i]);
        }
    }
    kx_world_fini(&w);
    free(v);
}

/* ---- bad options ---- */

Test(kallax, bad_options, .timeout = 60)
{
    kx_world w;
    kx_world_init(&w, "kx-opts", 0);
    kallax *kx = NULL;
    cr_assert_eq(kallax_open(&kx, &w.o, NULL, NULL), KV_INVALID_ARGUMENT); /* new, no size */
    kallax_opts o = w.o;
    o.dir = NULL;
    cr_assert_eq(kallax_open(&kx, &o, NULL, NULL), KV_INVALID_ARGUMENT);
    o = w.o;
    o.blocks = 10;
    o.probe = 100;
    cr_assert_eq(kallax_open(&kx, &o, NULL, NULL), KV_INVALID_ARGUMENT);
    o.probe = 8;
    o.inline_max = 10;
    cr_assert_eq(kallax_open(&kx, &o, NULL, NULL), KV_INVALID_ARGUMENT);
    o.inline_max = 5000;
    cr_assert_eq(kallax_open(&kx, &o, NULL, NULL), KV_INVALID_ARGUMENT);
    w.o.blocks = 10;
    kx_world_open(&w, NULL, NULL);
    o = w.o;
    cr_assert_eq(kallax_open(&kx, &o, NULL, NULL), KV_FAILED_PRECONDITION); /* LOCK */
    char big[KALLAX_MAX_KEY + 1];
    memset(big, 'x', sizeof(big));
    lsm_rec r = {.key = big, .klen = sizeof(big), .type = LSM_PUT, .seqno = 1};
    cr_assert_eq(kallax_wal_append(w.kx, &r, 1), KV_INVALID_ARGUMENT);
    cr_assert_eq(kallax_get(w.kx, big, sizeof(big), &r), KV_INVALID_ARGUMENT);
    uint8_t v[16];
    kx_put_now(&w, 1, 5, 10, v);
    cr_assert_eq(kallax_flush(w.kx, NULL, 0, 4), KV_INVALID_ARGUMENT); /* below flushed */
    kallax_close(w.kx);
    w.kx = NULL;
    o = w.o;
    o.blocks = 11; /* another geometry than the store's */
    cr_assert_eq(kallax_open(&kx, &o, NULL, NULL), KV_INVALID_ARGUMENT);
    o.blocks = 0; /* the store's */
    cr_assert_eq(kallax_open(&kx, &o, NULL, NULL), KV_OK);
    kallax_close(kx);
    kx_world_fini(&w);
}
