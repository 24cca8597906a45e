/* SPDX-License-Identifier: MIT */
/*
 * Helpers shared by the kallax tests: a scratch store, deterministic values
 * (a record's bytes follow from its seqno, so any value read can be checked
 * against the seqno read with it), records built from a key id, and a
 * check of one record. Include after the test framework.
 */
#ifndef KV_TESTS_KALLAX_KX_TEST_H
#define KV_TESTS_KALLAX_KX_TEST_H

#include "../lsm/lsm_test_util.h"

#include "common/clock.h"
#include "node/kallax/kallax_int.h"

#define KX_KLEN 8

static inline void kx_key(char *k, unsigned id)
{
    snprintf(k, KX_KLEN + 1, "k%07u", id % 10000000u);
}

static inline unsigned kx_id(const void *key)
{
    char k[KX_KLEN + 1] = {0};
    memcpy(k, key, KX_KLEN);
    return (unsigned)atoi(k + 1);
}

static inline void kx_fill(uint8_t *v, size_t n, uint64_t seq)
{
    for (size_t j = 0; j < n; j++)
        v[j] = (uint8_t)(seq * 131 + j * 7 + (j >> 8));
}

/* True when r's value is the one a write with r's seqno made. */
static inline bool kx_value_ok(const lsm_rec *r)
{
    if (r->type == LSM_DELETE)
        return r->vlen == 0;
    const uint8_t *v = r->value;
    for (size_t j = 0; j < r->vlen; j++)
        if (v[j] != (uint8_t)(r->seqno * 131 + j * 7 + (j >> 8)))
            return false;
    return true;
}

typedef struct kx_world {
    char *dir;
    kallax_opts o;
    kallax *kx;
} kx_world;

static inline void kx_world_init(kx_world *w, const char *tag, uint64_t blocks)
{
    w->dir = lt_mkdtemp(tag);
    cr_assert(w->dir, "scratch directory");
    kallax_opts_default(&w->o);
    w->o.dir = w->dir;
    w->o.blocks = blocks;
    w->o.sync = LSM_SYNC_NONE;
    w->o.tombstone_grace_ms = 1ull << 50;
    w->kx = NULL;
}

static inline void kx_world_open(kx_world *w, lsm_replay_fn fn, void *arg)
{
    kv_err rv = kallax_open(&w->kx, &w->o, fn, arg);
    cr_assert_eq(rv, KV_OK, "kallax_open: %s", kv_strerror(rv));
}

static inline void kx_world_fini(kx_world *w)
{
    kallax_close(w->kx);
    w->kx = NULL;
    lt_rmrf(w->dir);
    free(w->dir);
}

/* A record of key id (k: the caller's KX_KLEN + 1 buffer, v: >= vlen). */
static inline lsm_rec kx_rec(char *k, uint8_t *v, unsigned id, uint64_t seq, size_t vlen, bool del,
                             uint64_t expire_at)
{
    kx_key(k, id);
    if (!del)
        kx_fill(v, vlen, seq);
    return (lsm_rec){.key = k,
                     .klen = KX_KLEN,
                     .value = del ? NULL : v,
                     .vlen = del ? 0 : vlen,
                     .version = seq << 16,
                     .seqno = seq,
                     .expire_at = expire_at,
                     .type = del ? LSM_DELETE : LSM_PUT};
}

/* Appends and flushes one record at once. */
static inline void kx_put_now(kx_world *w, unsigned id, uint64_t seq, size_t vlen, uint8_t *vbuf)
{
    char k[KX_KLEN + 1];
    lsm_rec r = kx_rec(k, vbuf, id, seq, vlen, false, 0);
    kv_err rv = kallax_wal_append(w->kx, &r, 1);
    cr_assert_eq(rv, KV_OK, "wal_append: %s", kv_strerror(rv));
    rv = kallax_flush(w->kx, &r, 1, seq);
    cr_assert_eq(rv, KV_OK, "flush: %s", kv_strerror(rv));
}

/* Looks id up: KV_OK with the record's seqno and vlen (value checked). */
static inline kv_err kx_get_id(kallax *kx, unsigned id, uint64_t *seq, size_t *vlen, bool *tomb)
{
    char k[KX_KLEN + 1];
    kx_key(k, id);
    lsm_rec r;
    kv_err rv = kallax_get(kx, k, KX_KLEN, &r);
    if (rv != KV_OK)
        return rv;
    cr_assert(kx_value_ok(&r), "key %u: value does not match seqno %llu", id,
              (unsigned long long)r.seqno);
    *seq = r.seqno;
    *vlen = r.vlen;
    *tomb = r.type == LSM_DELETE;
    lsm_rec_free(&r);
    return KV_OK;
}

#endif
