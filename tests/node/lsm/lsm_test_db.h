/* SPDX-License-Identifier: MIT */
/*
 * A small LSM store for the HotRAP and NHC tests: FD and SD directories in
 * a scratch dir, 1 MiB of FD, 1 KiB blocks, no sync, no automatic
 * compaction. Keys are "k%07u" of an id (KLEN bytes), values VLEN bytes.
 * Usage: lt_db_init(t, tag), adjust t->o, lt_db_start(t); lt_db_close(t)
 * closes the store and removes the directory (t itself is the caller's).
 * Include after criterion and lsm_int.h.
 */
#ifndef KV_TESTS_LSM_TEST_DB_H
#define KV_TESTS_LSM_TEST_DB_H

#include "lsm_test_util.h"

#define KLEN 8
#define VLEN 200

typedef struct tdb {
    char *dir, fd[300], sd[300];
    lsm_opts o;
    lsm_db *db;
    uint64_t seq;
} tdb;

static inline void lt_db_init(tdb *t, const char *tag)
{
    t->seq = 0;
    t->dir = lt_mkdtemp(tag);
    cr_assert(t->dir, "scratch directory for %s", tag);
    snprintf(t->fd, sizeof(t->fd), "%s/fd", t->dir);
    snprintf(t->sd, sizeof(t->sd), "%s/sd", t->dir);
    lsm_opts_default(&t->o);
    t->o.fast_dir = t->fd;
    t->o.slow_dir = t->sd;
    t->o.fast_mb = 1;
    t->o.block_size = 1024;
    t->o.sync = LSM_SYNC_NONE;
    t->o.no_auto_compaction = true;
}

static inline void lt_db_start(tdb *t)
{
    kv_err rv = lsm_open(&t->db, &t->o, NULL, NULL);
    cr_assert_eq(rv, KV_OK, "lsm_open: %s", kv_strerror(rv));
}

static inline void lt_db_close(tdb *t)
{
    lsm_close(t->db);
    lt_rmrf(t->dir);
    free(t->dir);
}

static inline void key_of(char *k, int id)
{
    snprintf(k, KLEN + 1, "k%07u", (unsigned)id % 10000000u);
}

/* Writes the keys of ids[0, n) (ascending), each at the next seqno (WAL +
 * flush as one L0 run); returns the first seqno. */
static inline uint64_t put_ids(tdb *t, const int *ids, size_t n)
{
    lsm_rec *r = calloc(n, sizeof(*r));
    char *keys = calloc(n, KLEN + 1);
    static uint8_t val[VLEN];
    uint64_t first = t->seq + 1;
    for (size_t i = 0; i < n; i++) {
        key_of(keys + i * (KLEN + 1), ids[i]);
        memset(val, (int)(first + i), VLEN);
        r[i] = (lsm_rec){.key = keys + i * (KLEN + 1),
                         .klen = KLEN,
                         .value = val,
                         .vlen = VLEN,
                         .seqno = ++t->seq,
                         .type = LSM_PUT};
        cr_assert_eq(lsm_wal_append(t->db, &r[i], 1), KV_OK);
    }
    cr_assert_eq(lsm_flush(t->db, r, n, t->seq), KV_OK);
    free(r);
    free(keys);
    return first;
}

/* put_ids of [a, b). */
static inline uint64_t put_range(tdb *t, int a, int b)
{
    size_t n = (size_t)(b - a);
    int *ids = malloc(n * sizeof(*ids));
    for (size_t i = 0; i < n; i++)
        ids[i] = a + (int)i;
    uint64_t first = put_ids(t, ids, n);
    free(ids);
    return first;
}

/* Looks id up (it must exist) into *r (lsm_rec_free it); returns its tier. */
static inline lsm_tier get_rec(tdb *t, int id, lsm_rec *r)
{
    char k[KLEN + 1];
    key_of(k, id);
    lsm_tier tier;
    kv_err rv = lsm_get(t->db, k, KLEN, r, &tier);
    cr_assert_eq(rv, KV_OK, "get %d: %s", id, kv_strerror(rv));
    return tier;
}

/* Looks id up (it must exist); returns its tier and fills *seq and *flags
 * when given. */
static inline lsm_tier get_id(tdb *t, int id, uint64_t *seq, uint8_t *flags)
{
    lsm_rec r;
    lsm_tier tier = get_rec(t, id, &r);
    if (seq)
        *seq = r.seqno;
    if (flags)
        *flags = r.flags;
    lsm_rec_free(&r);
    return tier;
}

static inline lsm_stats stats_of(tdb *t)
{
    lsm_stats s;
    cr_assert_eq(lsm_stats_get(t->db, &s), KV_OK);
    return s;
}

#endif
