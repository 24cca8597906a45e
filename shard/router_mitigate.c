/* SPDX-License-Identifier: MIT */
/*
 * Opt-in hot-key mitigations at the router (issue 7), both off by default:
 *
 * --hot-replica-reads: a read at consistency ONE of a flagged hot key goes
 *   to its replicas in turn instead of always the first, spreading the load.
 *   Cost: a read may return an older version from a replica that has not
 *   applied the newest write yet (the usual ONE staleness, now for hot keys
 *   on every replica instead of only when the first is down).
 * --hot-cache-ms T: values of flagged hot keys read at ONE are cached here
 *   for T ms (Tair's proxy cache). Writes passing through this router
 *   invalidate the entry (and a read that raced with a write does not store
 *   its result); writes through other routers or directly to nodes do not,
 *   so a read may be up to T ms stale.
 *
 * A key is flagged when the router's last window measured it at
 * --hot-flag-rate ops/s or more (guaranteed count).
 */
#include "shard/router_mitigate.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/hash.h"

#define CACHE_SLOTS 4096u

typedef struct cache_ent {
    pthread_mutex_t mu;
    uint64_t gen; /* bumped by every write that maps here */
    uint8_t *key, *body;
    size_t klen, blen;
    uint64_t expires_ns;
} cache_ent;

struct router_mit {
    bool replica_reads;
    uint64_t cache_ns;
    double flag_rate;
    pthread_rwlock_t flag_lock; /* protects flags/nflags (swapped per window) */
    uint64_t *flags;            /* sorted key hashes of flagged keys */
    size_t nflags;
    cache_ent *cache;
    _Atomic uint64_t rr, hits;
};

static uint64_t mhash(const void *k, size_t n)
{
    return kv_hash64(k, n, 0x6d697467ull);
}

kv_err router_mit_create(router_mit **out, bool replica_reads, long cache_ms, double flag_rate)
{
    router_mit *m = calloc(1, sizeof(*m));
    if (!m)
        return KV_RESOURCE_EXHAUSTED;
    m->replica_reads = replica_reads;
    m->cache_ns = (uint64_t)(cache_ms > 0 ? cache_ms : 0) * 1000000ull;
    m->flag_rate = flag_rate;
    pthread_rwlock_init(&m->flag_lock, NULL);
    if (m->cache_ns && !(m->cache = calloc(CACHE_SLOTS, sizeof(cache_ent)))) {
        free(m);
        return KV_RESOURCE_EXHAUSTED;
    }
    for (size_t i = 0; m->cache && i < CACHE_SLOTS; i++)
        pthread_mutex_init(&m->cache[i].mu, NULL);
    *out = m;
    return KV_OK;
}

void router_mit_destroy(router_mit *m)
{
    if (!m)
        return;
    for (size_t i = 0; m->cache && i < CACHE_SLOTS; i++) {
        free(m->cache[i].key);
        free(m->cache[i].body);
        pthread_mutex_destroy(&m->cache[i].mu);
    }
    free(m->cache);
    free(m->flags);
    pthread_rwlock_destroy(&m->flag_lock);
    free(m);
}

bool router_mit_active(const router_mit *m)
{
    return m && (m->replica_reads || m->cache_ns);
}

static int u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

void router_mit_update(router_mit *m, const hk_report *rep)
{
    uint64_t *f = calloc(rep->n + 1, sizeof(uint64_t));
    size_t n = 0;
    for (size_t i = 0; f && i < rep->n; i++)
        if (rep->items[i].guaranteed_rate >= m->flag_rate)
            f[n++] = mhash(rep->items[i].key, rep->items[i].klen);
    if (!f)
        return;
    qsort(f, n, sizeof(*f), u64_cmp);
    pthread_rwlock_wrlock(&m->flag_lock);
    uint64_t *old = m->flags;
    m->flags = f;
    m->nflags = n;
    pthread_rwlock_unlock(&m->flag_lock);
    free(old);
}

bool router_mit_flagged(router_mit *m, const void *key, size_t klen)
{
    uint64_t h = mhash(key, klen);
    pthread_rwlock_rdlock(&m->flag_lock);
    bool hit = m->nflags && bsearch(&h, m->flags, m->nflags, sizeof(h), u64_cmp) != NULL;
    pthread_rwlock_unlock(&m->flag_lock);
    return hit;
}

size_t router_mit_pick(router_mit *m, size_t nreplicas)
{
    return m->replica_reads && nreplicas > 1
               ? atomic_fetch_add_explicit(&m->rr, 1, memory_order_relaxed) % nreplicas
               : 0;
}

bool router_mit_cache_get(router_mit *m, const void *key, size_t klen, uint8_t **body, size_t *blen,
                          uint64_t *gen)
{
    if (!m->cache)
        return false;
    cache_ent *e = &m->cache[mhash(key, klen) % CACHE_SLOTS];
    bool hit = false;
    pthread_mutex_lock(&e->mu);
    *gen = e->gen;
    if (e->key && e->klen == klen && memcmp(e->key, key, klen) == 0 &&
        kv_now_ns() < e->expires_ns && (*body = malloc(e->blen ? e->blen : 1))) {
        memcpy(*body, e->body, e->blen);
        *blen = e->blen;
        hit = true;
    }
    pthread_mutex_unlock(&e->mu);
    if (hit)
        atomic_fetch_add_explicit(&m->hits, 1, memory_order_relaxed);
    return hit;
}

void router_mit_cache_put(router_mit *m, const void *key, size_t klen, const uint8_t *body,
                          size_t blen, uint64_t gen)
{
    if (!m->cache)
        return;
    cache_ent *e = &m->cache[mhash(key, klen) % CACHE_SLOTS];
    uint8_t *k = malloc(klen), *b = malloc(blen ? blen : 1);
    if (!k || !b) {
        free(k);
        free(b);
        return;
    }
    memcpy(k, key, klen);
    if (blen) /* an empty reply has no body (NULL) */
        memcpy(b, body, blen);
    pthread_mutex_lock(&e->mu);
    if (e->gen == gen) { /* no write through here since the read began */
        free(e->key);
        free(e->body);
        e->key = k;
        e->klen = klen;
        e->body = b;
        e->blen = blen;
        e->expires_ns = kv_now_ns() + m->cache_ns;
        k = b = NULL;
    }
    pthread_mutex_unlock(&e->mu);
    free(k);
    free(b);
}

void router_mit_invalidate(router_mit *m, const void *key, size_t klen)
{
    if (!m || !m->cache)
        return;
    cache_ent *e = &m->cache[mhash(key, klen) % CACHE_SLOTS];
    pthread_mutex_lock(&e->mu);
    e->gen++;
    free(e->key);
    free(e->body);
    e->key = e->body = NULL;
    e->klen = e->blen = 0;
    pthread_mutex_unlock(&e->mu);
}

uint64_t router_mit_hits(const router_mit *m)
{
    return m ? atomic_load(&((router_mit *)m)->hits) : 0;
}
