/* SPDX-License-Identifier: MIT */
/*
 * Tests of iteration (iter.c) and of what compaction keeps (compact.c):
 * the heap merger against a sorted model (many sources, duplicate keys,
 * seqno and rank ties, empty sources, seek, a failing source); the
 * level-concatenating source over real SSTs (lazy opening, seeks into files,
 * gaps and past the end); lsm_iter against a model across flushes and
 * compactions, over a pinned version while compactions delete its files,
 * and on a corrupt block; the tombstone grace period; the cleanup filter of
 * lsm_compact_all_filter (with and without retention, and on a store whose
 * only level is the deepest); lsm_wal_sync in every sync mode.
 */
#include "lsm_test_util.h"

#include "tests/kv_testfw.h"

#include "common/clock.h"
#include "node/lsm/iter.h"
#include "lsm_test_db.h"

/* ---- the merger over array sources ---- */

/* An array of records (sorted: key asc, seqno desc) as a source; it fails
 * with DATA_LOSS when it reaches fail_at (SIZE_MAX = never). */
typedef struct arr_src {
    lsm_src base;
    const lsm_rec *r;
    size_t n, i, fail_at;
} arr_src;

static void arr_first(lsm_src *s)
{
    ((arr_src *)s)->i = 0;
}

static void arr_seek(lsm_src *s, const void *key, size_t klen)
{
    arr_src *a = (arr_src *)s;
    for (a->i = 0; a->i < a->n && lsm_key_cmp(a->r[a->i].key, a->r[a->i].klen, key, klen) < 0;)
        a->i++;
}

static void arr_next(lsm_src *s)
{
    ((arr_src *)s)->i++;
}

static const lsm_rec *arr_cur(const lsm_src *s)
{
    return &((const arr_src *)s)->r[((const arr_src *)s)->i];
}

static bool arr_valid(const lsm_src *s)
{
    const arr_src *a = (const arr_src *)s;
    return a->i < a->n && a->i < a->fail_at;
}

static kv_err arr_error(const lsm_src *s, const char **file)
{
    const arr_src *a = (const arr_src *)s;
    if (file)
        *file = NULL;
    return a->i >= a->fail_at && a->i < a->n ? KV_DATA_LOSS : KV_OK;
}

static uint64_t arr_bytes(const lsm_src *s)
{
    (void)s;
    return 0;
}

static void arr_fini(lsm_src *s)
{
    (void)s;
}

static const lsm_src_ops arr_ops = {arr_first, arr_seek,  arr_next,  arr_cur,
                                    arr_valid, arr_error, arr_bytes, arr_fini};

#define NSRC 40
#define PER 60

/* A record with the source it came from, for the model's order. */
typedef struct tagged {
    lsm_rec r;
    int rank;
    size_t src;
} tagged;

static char mkeys[NSRC][PER][12];

static int rec_order(const lsm_rec *a, const lsm_rec *b)
{
    int c = lsm_key_cmp(a->key, a->klen, b->key, b->klen);
    if (c)
        return c;
    return a->seqno > b->seqno ? -1 : a->seqno < b->seqno;
}

static int tagged_cmp(const void *x, const void *y)
{
    const tagged *a = x, *b = y;
    int c = rec_order(&a->r, &b->r);
    if (c)
        return c;
    if (a->rank != b->rank)
        return a->rank < b->rank ? -1 : 1;
    return a->src < b->src ? -1 : a->src > b->src;
}

static int lsm_rec_cmp(const void *x, const void *y)
{
    return rec_order(x, y);
}

typedef struct arr_world {
    lsm_rec recs[NSRC][PER];
    arr_src src[NSRC];
    lsm_src *ps[NSRC];
    tagged all[NSRC * PER];
    size_t nall;
} arr_world;

/* Sources with keys from a small pool (duplicates across and inside
 * sources), seqnos from a small range (ties), ranks with ties, and every
 * fifth source empty. */
static void arr_build(arr_world *w, uint64_t seed)
{
    memset(w, 0, sizeof(*w));
    for (size_t s = 0; s < NSRC; s++) {
        size_t n = s % 5 == 0 ? 0 : lt_rand(&seed) % PER;
        for (size_t i = 0; i < n; i++) {
            snprintf(mkeys[s][i], sizeof(mkeys[s][i]), "k%03u", (unsigned)(lt_rand(&seed) % 150));
            w->recs[s][i] = (lsm_rec){.key = mkeys[s][i],
                                      .klen = strlen(mkeys[s][i]),
                                      .seqno = i * 4 + lt_rand(&seed) % 4, /* unique inside */
                                      .type = LSM_PUT};
        }
        qsort(w->recs[s], n, sizeof(lsm_rec), lsm_rec_cmp);
        int rank = (int)(lt_rand(&seed) % 8);
        w->src[s] =
            (arr_src){.base = {&arr_ops, rank}, .r = w->recs[s], .n = n, .fail_at = SIZE_MAX};
        w->ps[s] = &w->src[s].base;
        for (size_t i = 0; i < n; i++)
            w->all[w->nall++] = (tagged){w->recs[s][i], rank, s};
    }
    qsort(w->all, w->nall, sizeof(tagged), tagged_cmp);
}

/* The merger from its position yields exactly all[from..]. */
static void arr_expect(lsm_merge *m, const arr_world *w, size_t from)
{
    size_t k = from;
    for (; lsm_merge_valid(m); lsm_merge_next(m), k++) {
        cr_assert_lt(k, w->nall, "more records than the model");
        const lsm_rec *r = lsm_merge_cur(m);
        cr_assert_eq(lsm_merge_top(m), w->all[k].src, "record %zu from source %zu, want %zu", k,
                     lsm_merge_top(m), w->all[k].src);
        cr_assert(r->seqno == w->all[k].r.seqno &&
                      lsm_key_cmp(r->key, r->klen, w->all[k].r.key, w->all[k].r.klen) == 0,
                  "record %zu", k);
    }
    cr_assert_eq(k, w->nall, "%zu records, want %zu", k, w->nall);
    cr_assert_eq(lsm_merge_error(m, NULL, NULL), KV_OK);
}

Test(merge, heap_matches_sorted_model_with_duplicates_ties_and_empty_sources)
{
    static arr_world w;
    for (uint64_t seed = 1; seed <= 5; seed++) {
        arr_build(&w, seed);
        lsm_merge m;
        cr_assert_eq(lsm_merge_init(&m, w.ps, NSRC), KV_OK);
        lsm_merge_first(&m);
        arr_expect(&m, &w, 0);
        for (int q = 0; q < 30; q++) { /* seeks: present keys, absent keys, past the end */
            char key[12];
            snprintf(key, sizeof(key), "k%03u", (unsigned)(lt_rand(&seed) % 160));
            size_t from = 0;
            while (from < w.nall &&
                   lsm_key_cmp(w.all[from].r.key, w.all[from].r.klen, key, strlen(key)) < 0)
                from++;
            lsm_merge_seek(&m, key, strlen(key));
            arr_expect(&m, &w, from);
        }
        lsm_merge_fini(&m);
    }
}

Test(merge, no_sources_and_only_empty_sources)
{
    lsm_merge m;
    cr_assert_eq(lsm_merge_init(&m, NULL, 0), KV_OK);
    lsm_merge_first(&m);
    cr_assert_not(lsm_merge_valid(&m));
    lsm_merge_fini(&m);
    arr_src a[3];
    lsm_src *ps[3];
    for (int i = 0; i < 3; i++) {
        a[i] = (arr_src){.base = {&arr_ops, 0}, .fail_at = SIZE_MAX};
        ps[i] = &a[i].base;
    }
    cr_assert_eq(lsm_merge_init(&m, ps, 3), KV_OK);
    lsm_merge_seek(&m, "a", 1);
    cr_assert_not(lsm_merge_valid(&m));
    cr_assert_eq(lsm_merge_error(&m, NULL, NULL), KV_OK);
    lsm_merge_fini(&m);
}

Test(merge, a_failing_source_stops_the_merge_and_is_named)
{
    static arr_world w;
    arr_build(&w, 9);
    size_t bad = 1;
    while (w.src[bad].n < 10)
        bad++;
    w.src[bad].fail_at = 5;
    lsm_merge m;
    cr_assert_eq(lsm_merge_init(&m, w.ps, NSRC), KV_OK);
    lsm_merge_first(&m);
    size_t n = 0;
    for (; lsm_merge_valid(&m); lsm_merge_next(&m))
        n++;
    cr_assert_lt(n, w.nall, "the merge stopped early");
    size_t src = SIZE_MAX;
    cr_assert_eq(lsm_merge_error(&m, &src, NULL), KV_DATA_LOSS);
    cr_assert_eq(src, bad);
    lsm_merge_fini(&m);
}

/* ---- the level source over real SSTs ---- */

#define NFILES 5

/* File f holds the even ids of [f * 400, f * 400 + 300). */
static lsm_file *build_file(lsm_vol *v, int f)
{
    lsm_sst_builder *b;
    cr_assert_eq(lsm_sst_builder_open(&b, v, (uint64_t)f + 1, 512), KV_OK);
    static uint8_t val[50];
    for (int id = f * 400; id < f * 400 + 300; id += 2) {
        char k[KLEN + 1];
        key_of(k, id);
        lsm_rec r = {.key = k,
                     .klen = KLEN,
                     .value = val,
                     .vlen = sizeof(val),
                     .seqno = (uint64_t)id + 1,
                     .type = LSM_PUT};
        cr_assert_eq(lsm_sst_builder_add(b, &r), KV_OK);
    }
    lsm_file *out;
    cr_assert_eq(lsm_sst_builder_finish(b, 1, &out), KV_OK);
    return out;
}

static int id_of(const lsm_rec *r)
{
    char k[KLEN + 1] = {0};
    memcpy(k, r->key, KLEN);
    return atoi(k + 1);
}

/* The level source positioned by seek(id) (first when id < 0) starts at
 * want (-1: not valid). */
static void level_expect(lsm_level_src *s, int id, int want)
{
    char k[KLEN + 1];
    key_of(k, id < 0 ? 0 : id);
    if (id < 0)
        s->base.ops->first(&s->base);
    else
        s->base.ops->seek(&s->base, k, KLEN);
    cr_assert_eq(s->base.ops->error(&s->base, NULL), KV_OK);
    if (want < 0) {
        cr_assert_not(s->base.ops->valid(&s->base), "seek %d: past the end", id);
        return;
    }
    cr_assert(s->base.ops->valid(&s->base), "seek %d", id);
    cr_assert_eq(id_of(s->base.ops->cur(&s->base)), want, "seek %d", id);
}

Test(level, concatenates_files_lazily_and_seeks_across_gaps)
{
    char *dir = lt_mkdtemp("level");
    lsm_vol v;
    cr_assert_eq(lsm_vol_init(&v, dir, LSM_TIER_FD, false), KV_OK);
    lsm_file *files[NFILES];
    uint64_t total = 0;
    for (int f = 0; f < NFILES; f++) {
        files[f] = build_file(&v, f);
        total += files[f]->size;
    }
    lsm_level_src s;
    lsm_level_src_init(&s, files, NFILES, 0);
    level_expect(&s, -1, 0);
    cr_assert_leq(s.base.ops->bytes_read(&s.base), files[0]->size, "only file 0 is read");
    int n = 0, prev = -1;
    for (; s.base.ops->valid(&s.base); s.base.ops->next(&s.base), n++) {
        int id = id_of(s.base.ops->cur(&s.base));
        cr_assert_gt(id, prev);
        prev = id;
    }
    cr_assert_eq(n, NFILES * 150);
    uint64_t read = s.base.ops->bytes_read(&s.base);
    cr_assert(read > files[0]->size && read < total, "read %llu of %llu bytes",
              (unsigned long long)read, (unsigned long long)total);
    level_expect(&s, 1001, 1002); /* inside file 2, between keys */
    level_expect(&s, 1000, 1000); /* on a key */
    level_expect(&s, 750, 800);   /* in the gap between files 1 and 2 */
    level_expect(&s, 298, 298);   /* file 0's last key */
    level_expect(&s, 299, 400);   /* just past file 0 */
    level_expect(&s, 1898, 1898);
    level_expect(&s, 1899, -1); /* past the last file */
    s.base.ops->fini(&s.base);
    lsm_level_src empty;
    lsm_level_src_init(&empty, files, 0, 0);
    level_expect(&empty, -1, -1);
    level_expect(&empty, 5, -1);
    empty.base.ops->fini(&empty.base);
    for (int f = 0; f < NFILES; f++)
        lsm_file_unref(files[f]);
    lsm_vol_fini(&v);
    lt_rmrf(dir);
    free(dir);
}

/* ---- lsm_iter against a model ---- */

#define NIDS 2000

typedef struct mrec {
    bool present;
    uint8_t type;
    uint64_t seq, version, expire;
} mrec;

static size_t vlen_of(uint64_t seq)
{
    return (size_t)(seq % 97 + 1);
}

static uint8_t val_byte(uint64_t seq, size_t j)
{
    return (uint8_t)(seq * 31 + j);
}

static int rec_key_cmp(const void *x, const void *y)
{
    return rec_order(x, y);
}

/* One round: nops random puts (some with an expiry, past or future) and
 * deletes, appended to the WAL and flushed as one L0 run. */
static void write_round(tdb *t, mrec *m, int nops, uint64_t *rng)
{
    lsm_rec *r = calloc((size_t)nops, sizeof(*r));
    char *keys = calloc((size_t)nops, KLEN + 1);
    uint8_t *vals = calloc((size_t)nops, 100);
    uint64_t now = kv_wall_ms();
    for (int i = 0; i < nops; i++) {
        int id = (int)(lt_rand(rng) % NIDS), kind = (int)(lt_rand(rng) % 10);
        uint64_t seq = ++t->seq;
        char *k = keys + (size_t)i * (KLEN + 1);
        key_of(k, id);
        uint8_t type = kind == 0 ? LSM_DELETE : LSM_PUT;
        uint64_t expire = kind == 1 ? now - 1 : kind == 2 ? now + 3600000 : 0;
        size_t vlen = type == LSM_PUT ? vlen_of(seq) : 0;
        for (size_t j = 0; j < vlen; j++)
            vals[(size_t)i * 100 + j] = val_byte(seq, j);
        r[i] = (lsm_rec){.key = k,
                         .klen = KLEN,
                         .value = vlen ? vals + (size_t)i * 100 : NULL,
                         .vlen = vlen,
                         .version = now << 16 | (uint64_t)i,
                         .seqno = seq,
                         .expire_at = expire,
                         .type = type};
        cr_assert_eq(lsm_wal_append(t->db, &r[i], 1), KV_OK);
        m[id] = (mrec){true, type, seq, r[i].version, expire};
    }
    qsort(r, (size_t)nops, sizeof(*r), rec_key_cmp);
    cr_assert_eq(lsm_flush(t->db, r, (size_t)nops, t->seq), KV_OK);
    free(r);
    free(keys);
    free(vals);
}

static void check_rec(const lsm_rec *r, const mrec *m, int id)
{
    cr_assert(m->present, "id %d is not in the model", id);
    cr_assert_eq(r->seqno, m->seq, "id %d: seqno %llu, want %llu", id, (unsigned long long)r->seqno,
                 (unsigned long long)m->seq);
    cr_assert_eq(r->version, m->version, "id %d version", id);
    cr_assert_eq(r->expire_at, m->expire, "id %d expire_at", id);
    bool expired = m->type == LSM_PUT && m->expire && m->expire <= kv_wall_ms();
    cr_assert(r->type == m->type || (expired && r->type == LSM_DELETE), "id %d type", id);
    if (r->type != LSM_PUT)
        return;
    cr_assert_eq(r->vlen, vlen_of(m->seq), "id %d vlen", id);
    for (size_t j = 0; j < r->vlen; j++)
        cr_assert_eq(((const uint8_t *)r->value)[j], val_byte(m->seq, j), "id %d value", id);
}

static int next_present(const mrec *m, int id)
{
    for (id++; id < NIDS && !m[id].present; id++)
        ;
    return id;
}

/* From after_id (-1: the first key) it returns exactly the model's keys. */
static void check_iter(lsm_iter *it, const mrec *m, int after_id)
{
    char k[KLEN + 1];
    key_of(k, after_id < 0 ? 0 : after_id);
    kv_err rv = lsm_iter_seek(it, after_id < 0 ? NULL : k, KLEN);
    cr_assert_eq(rv, KV_OK, "seek: %s", kv_strerror(rv));
    int want = next_present(m, after_id);
    for (const lsm_rec *r; (r = lsm_iter_rec(it)); want = next_present(m, want)) {
        cr_assert_eq(id_of(r), want, "after %d: got id %d, want %d", after_id, id_of(r), want);
        check_rec(r, &m[want], want);
        cr_assert_eq(lsm_iter_next(it), KV_OK);
    }
    cr_assert_eq(want, NIDS, "after %d: id %d and more missing", after_id, want);
}

static void check_db(tdb *t, const mrec *m, uint64_t *rng)
{
    lsm_iter *it;
    cr_assert_eq(lsm_iter_open(t->db, &it), KV_OK);
    check_iter(it, m, -1);
    for (int q = 0; q < 4; q++)
        check_iter(it, m, (int)(lt_rand(rng) % NIDS));
    check_iter(it, m, NIDS - 1);
    lsm_iter_close(it);
}

Test(lsm_iter, model_across_flushes_and_compactions, .timeout = 120)
{
    tdb t;
    lt_db_init(&t, "iter");
    t.o.tombstone_grace_ms = 24 * 3600 * 1000ull; /* tombstones stay: the model keeps them */
    lt_db_start(&t);
    static mrec m[NIDS], pinned[NIDS];
    uint64_t rng = 77;
    lsm_iter *old = NULL;
    for (int round = 0; round < 14; round++) {
        write_round(&t, m, 400, &rng);
        if (round % 3 == 0)
            cr_assert_eq(lsm_compact_level(t.db, 0), KV_OK);
        if (round % 4 == 1)
            cr_assert_eq(lsm_compact_all(t.db), KV_OK);
        if (round % 5 == 2)
            cr_assert_eq(lsm_compact_level(t.db, 1), KV_OK);
        check_db(&t, m, &rng);
        if (round == 5) { /* pinned: later compactions delete its files */
            cr_assert_eq(lsm_iter_open(t.db, &old), KV_OK);
            memcpy(pinned, m, sizeof(m));
        }
    }
    lsm_stats s = stats_of(&t);
    cr_assert_gt(s.compactions, 5);
    check_iter(old, pinned, -1);
    check_iter(old, pinned, 1000);
    lsm_iter_close(old);
    lsm_iter_close(NULL);
    lt_db_close(&t);
}

Test(lsm_iter, corrupt_block_gives_data_loss_naming_the_file)
{
    tdb t;
    lt_db_init(&t, "itercorrupt");
    lt_db_start(&t);
    put_range(&t, 0, 600);
    char *path = lt_find(t.fd, ".sst", 1);
    cr_assert_not_null(path);
    cr_assert_eq(lt_flip(path, 300), 0); /* inside the first data block */
    lsm_iter *it;
    cr_assert_eq(lsm_iter_open(t.db, &it), KV_OK);
    kv_err rv = lsm_iter_seek(it, NULL, 0);
    while (rv == KV_OK && lsm_iter_rec(it))
        rv = lsm_iter_next(it);
    cr_assert_eq(rv, KV_DATA_LOSS, "%s", kv_err_name(rv));
    cr_assert_null(lsm_iter_rec(it));
    const char *file = lsm_iter_failed_file(it);
    cr_assert_not_null(file);
    cr_assert_str_eq(file, path);
    cr_assert_eq(lsm_iter_next(it), KV_DATA_LOSS, "the error sticks");
    cr_assert_eq(lsm_iter_seek(it, NULL, 0), KV_DATA_LOSS);
    lsm_iter_close(it);
    free(path);
    lt_db_close(&t);
}

/* ---- tombstone grace ---- */

/* Appends one record of id (seqno t->seq + 1) and flushes it alone. */
static void write_one(tdb *t, int id, uint8_t type, uint64_t version, uint64_t expire)
{
    char k[KLEN + 1];
    key_of(k, id);
    lsm_rec r = {.key = k,
                 .klen = KLEN,
                 .value = type == LSM_PUT ? "v" : NULL,
                 .vlen = type == LSM_PUT ? 1 : 0,
                 .version = version,
                 .seqno = ++t->seq,
                 .expire_at = expire,
                 .type = type};
    cr_assert_eq(lsm_wal_append(t->db, &r, 1), KV_OK);
    cr_assert_eq(lsm_flush(t->db, &r, 1, t->seq), KV_OK);
}

/* The type of id's record (0 when there is none) and its expire_at. */
static uint8_t type_of(tdb *t, int id, uint64_t *expire)
{
    char k[KLEN + 1];
    key_of(k, id);
    lsm_rec r;
    kv_err rv = lsm_get(t->db, k, KLEN, &r, NULL);
    if (rv == KV_NOT_FOUND)
        return 0;
    cr_assert_eq(rv, KV_OK);
    uint8_t type = r.type;
    if (expire)
        *expire = r.expire_at;
    lsm_rec_free(&r);
    return type;
}

Test(grace, tombstones_younger_than_the_grace_survive_compaction)
{
    for (int grace = 0; grace < 2; grace++) {
        tdb t;
        lt_db_init(&t, "grace");
        t.o.tombstone_grace_ms = grace ? 60000 : 0;
        lt_db_start(&t);
        uint64_t now = kv_wall_ms(), old = (now - 600000) << 16, young = now << 16;
        write_one(&t, 6, LSM_PUT, old, 0); /* 6: a value two levels down */
        cr_assert_eq(lsm_compact_level(t.db, 0), KV_OK);
        cr_assert_eq(lsm_compact_level(t.db, 1), KV_OK);
        write_one(&t, 1, LSM_DELETE, young, 0);          /* young tombstone */
        write_one(&t, 2, LSM_DELETE, old, 0);            /* old tombstone */
        write_one(&t, 3, LSM_PUT, old, now - 1000);      /* expired a second ago */
        write_one(&t, 4, LSM_PUT, old, now - 600000);    /* expired ten minutes ago */
        write_one(&t, 5, LSM_PUT, old, 0);               /* live */
        write_one(&t, 6, LSM_DELETE, old, 0);            /* old, but L2 holds the key */
        cr_assert_eq(lsm_compact_level(t.db, 0), KV_OK); /* into L1, above L2 */
        cr_assert_eq(type_of(&t, 6, NULL), LSM_DELETE, "a lower level may hold 6");
        cr_assert_eq(lsm_compact_all(t.db), KV_OK);
        uint64_t exp = 0;
        cr_assert_eq(type_of(&t, 1, NULL), grace ? LSM_DELETE : 0, "young tombstone");
        cr_assert_eq(type_of(&t, 2, NULL), 0, "old tombstone");
        cr_assert_eq(type_of(&t, 3, &exp), grace ? LSM_DELETE : 0, "recently expired");
        cr_assert(!grace || exp == now - 1000, "the converted tombstone keeps expire_at");
        cr_assert_eq(type_of(&t, 4, NULL), 0, "long expired");
        cr_assert_eq(type_of(&t, 5, NULL), LSM_PUT);
        cr_assert_eq(type_of(&t, 6, NULL), 0, "the tombstone met its value and both went");
        lt_db_close(&t);
    }
}

/* ---- the cleanup filter ---- */

static bool keep_odd(void *arg, const void *key, size_t klen)
{
    (void)klen;
    char k[KLEN + 1] = {0};
    memcpy(k, key, KLEN);
    int mod = *(int *)arg;
    return atoi(k + 1) % mod != 0;
}

static int retain_all(void *arg, const lsm_rec *rec, int from_level)
{
    (void)arg;
    (void)rec;
    return from_level;
}

/* The records of the current version's files that keep rejects; with
 * none, there must be none. */
static uint64_t check_files(tdb *t, int mod, bool none)
{
    uint64_t n = 0;
    lsm_version *v = lsm_db_current(t->db);
    for (int l = 0; l < LSM_MAX_LEVELS; l++) {
        for (size_t i = 0; i < v->nfiles[l]; i++) {
            lsm_sst_iter it;
            lsm_sst_iter_init(&it, v->files[l][i]->sst);
            for (; it.valid; lsm_sst_iter_next(&it)) {
                bool keep = keep_odd(&mod, it.cur.key, it.cur.klen);
                cr_assert(keep || !none, "L%d holds id %d", l, id_of(&it.cur));
                n += !keep;
            }
            cr_assert_eq(it.err, KV_OK);
            lsm_sst_iter_fini(&it);
        }
    }
    lsm_version_unref(v);
    return n;
}

Test(filter, cleanup_drops_every_version_of_rejected_keys)
{
    for (int retain = 0; retain < 2; retain++) {
        tdb t;
        lt_db_init(&t, "filter");
        t.o.route = retain ? retain_all : NULL;
        lt_db_start(&t);
        put_range(&t, 0, 1000); /* versions on three levels */
        cr_assert_eq(lsm_compact_level(t.db, 0), KV_OK);
        cr_assert_eq(lsm_compact_level(t.db, 1), KV_OK);
        put_range(&t, 0, 500);
        cr_assert_eq(lsm_compact_level(t.db, 0), KV_OK);
        uint64_t last = put_range(&t, 250, 750);
        int mod = 2;
        uint64_t dropped = 0, rejected = check_files(&t, mod, false);
        cr_assert_geq(rejected, retain ? 500 : 1000, "versions of even ids: %llu",
                      (unsigned long long)rejected);
        cr_assert_eq(lsm_compact_all_filter(t.db, keep_odd, &mod, &dropped), KV_OK);
        cr_assert_eq(dropped, rejected, "%llu of %llu even records dropped",
                     (unsigned long long)dropped, (unsigned long long)rejected);
        check_files(&t, mod, true);
        for (int id = 0; id < 1000; id++) {
            if (id % 2 == 0) {
                cr_assert_eq(type_of(&t, id, NULL), 0, "id %d survived", id);
                continue;
            }
            uint64_t seq;
            get_id(&t, id, &seq, NULL);
            if (id >= 250 && id < 750)
                cr_assert_eq(seq, last + (uint64_t)(id - 250), "id %d keeps its newest", id);
        }
        lt_db_close(&t);
    }
}

Test(filter, cleanup_rewrites_a_lone_deepest_level)
{
    tdb t;
    lt_db_init(&t, "filterdeep");
    lt_db_start(&t);
    put_range(&t, 0, 400);
    cr_assert_eq(lsm_compact_level(t.db, 0), KV_OK); /* everything in L1, nothing above */
    uint64_t gen = lsm_flush_generation(t.db);
    int mod = 3;
    uint64_t dropped = 0;
    cr_assert_eq(lsm_compact_all_filter(t.db, keep_odd, &mod, &dropped), KV_OK);
    cr_assert_eq(dropped, 134);
    cr_assert_gt(lsm_flush_generation(t.db), gen, "racing fills are refused");
    check_files(&t, mod, true);
    lsm_stats s = stats_of(&t);
    cr_assert_eq(s.levels[0].files, 0);
    cr_assert_gt(s.levels[1].files, 0, "the level was rewritten into itself");
    for (int id = 0; id < 400; id++)
        cr_assert_eq(type_of(&t, id, NULL), id % 3 ? LSM_PUT : 0, "id %d", id);
    uint64_t recs, bytes;
    lsm_estimate(t.db, &recs, &bytes);
    cr_assert_eq(recs, 400 - 134);
    cr_assert_gt(bytes, recs * VLEN);
    cr_assert_eq(lsm_compact_all_filter(t.db, NULL, NULL, NULL), KV_INVALID_ARGUMENT);
    lt_db_close(&t);
}

/* ---- WAL sync ---- */

Test(wal, sync_makes_acknowledged_appends_durable_in_every_mode)
{
    for (int mode = LSM_SYNC_ALWAYS; mode <= LSM_SYNC_NONE; mode++) {
        tdb t;
        lt_db_init(&t, "walsync");
        t.o.sync = (lsm_sync)mode;
        lt_db_start(&t);
        put_range(&t, 0, 50); /* a flush: the old segment is sealed */
        char k[KLEN + 1];
        key_of(k, 7);
        lsm_rec r = {
            .key = k, .klen = KLEN, .value = "x", .vlen = 1, .seqno = ++t.seq, .type = LSM_PUT};
        cr_assert_eq(lsm_wal_append(t.db, &r, 1), KV_OK);
        uint64_t before = stats_of(&t).wal_fsyncs;
        cr_assert_eq(lsm_wal_sync(t.db), KV_OK);
        uint64_t after = stats_of(&t).wal_fsyncs;
        if (mode == LSM_SYNC_ALWAYS)
            cr_assert_eq(after, before, "every append was synced already");
        else
            cr_assert_gt(after, before, "mode %d: the segment was fsynced", mode);
        cr_assert_eq(lsm_wal_sync(t.db), KV_OK);
        lt_db_close(&t);
    }
}
