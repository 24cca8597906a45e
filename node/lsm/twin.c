/* SPDX-License-Identifier: MIT */
/*
 * The twin map (DESIGN.md §5, NHC): a bounded in-memory map key -> seqno of
 * the records that have identical copies on FD and SD, i.e. records the
 * HotRAP promotion checker flushed to FD (same seqno, LSM_F_PROMOTED) whose
 * SD original is still there. NHC's load_admit applies to these keys only:
 * a lookup may read them from the SD levels alone (db.c verifies that the
 * SD record found carries the twin seqno, and falls back to the FD-first
 * path and removes the entry when it does not).
 *
 * Layout: a set-associative table of 16-byte slots {tag, seqno}, 8 slots a
 * set, the set chosen by the key's 64-bit hash and the tag being that hash
 * (0 = empty). Keys are not stored: a tag collision between two keys only
 * makes a lookup try SD for the other key, where the seqno check fails
 * (seqnos are unique per record) and the FD-first path runs. When a set is
 * full, the slot with the lowest seqno (the oldest promotion) is evicted, so
 * the map never grows past its capacity; an evicted twin is only read the
 * classic way.
 *
 * Concurrency: striped mutexes, TWIN_STRIPES of them, each guarding the sets
 * whose index is congruent to it. A lookup takes one stripe for the few
 * nanoseconds of an 8-slot scan, so readers of different keys rarely meet
 * and no global lock is on the read path. The size counter is a relaxed
 * atomic (a statistic and an "is the map empty" hint, never used for
 * correctness). Ordering with writers is given by the stripe lock: see
 * lsm_twin_del (lsm_wal_append) and promote.c's insert-then-recheck.
 */
#include <stdlib.h>

#include "common/hash.h"
#include "node/lsm/lsm_int.h"

#define TWIN_WAYS 8
#define TWIN_STRIPES 256
#define TWIN_SEED 0x7477696e5f6d6170ull /* "twin_map" */

typedef struct twin_slot {
    uint64_t tag; /* key hash, forced non-zero; 0 = empty */
    uint64_t seqno;
} twin_slot;

struct lsm_twin {
    twin_slot *slots; /* nsets * TWIN_WAYS */
    size_t nsets;     /* power of two */
    _Atomic size_t count;
    _Atomic uint64_t evicted;
    pthread_mutex_t stripes[TWIN_STRIPES];
};

static uint64_t twin_tag(const void *key, size_t klen)
{
    uint64_t h = kv_hash64(key, klen, TWIN_SEED);
    return h ? h : 1;
}

static twin_slot *twin_set(lsm_twin *t, uint64_t tag, pthread_mutex_t **lock)
{
    size_t set = (size_t)(tag >> 17) & (t->nsets - 1);
    *lock = &t->stripes[set % TWIN_STRIPES];
    return &t->slots[set * TWIN_WAYS];
}

kv_err lsm_twin_create(size_t max_entries, lsm_twin **out)
{
    if (max_entries == 0 || max_entries > ((size_t)1 << 30))
        return KV_INVALID_ARGUMENT;
    size_t nsets = 1;
    while (nsets * TWIN_WAYS < max_entries)
        nsets <<= 1;
    lsm_twin *t = calloc(1, sizeof(*t));
    if (!t)
        return KV_RESOURCE_EXHAUSTED;
    t->slots = calloc(nsets * TWIN_WAYS, sizeof(*t->slots));
    if (!t->slots) {
        free(t);
        return KV_RESOURCE_EXHAUSTED;
    }
    t->nsets = nsets;
    for (int i = 0; i < TWIN_STRIPES; i++)
        pthread_mutex_init(&t->stripes[i], NULL);
    *out = t;
    return KV_OK;
}

void lsm_twin_destroy(lsm_twin *t)
{
    if (!t)
        return;
    for (int i = 0; i < TWIN_STRIPES; i++)
        pthread_mutex_destroy(&t->stripes[i]);
    free(t->slots);
    free(t);
}

size_t lsm_twin_capacity(const lsm_twin *t)
{
    return t ? t->nsets * TWIN_WAYS : 0;
}

size_t lsm_twin_size(lsm_twin *t)
{
    return t ? atomic_load_explicit(&t->count, memory_order_relaxed) : 0;
}

uint64_t lsm_twin_evicted(lsm_twin *t)
{
    return t ? atomic_load_explicit(&t->evicted, memory_order_relaxed) : 0;
}

void lsm_twin_put(lsm_twin *t, const void *key, size_t klen, uint64_t seqno)
{
    pthread_mutex_t *mu;
    uint64_t tag = twin_tag(key, klen);
    twin_slot *s = twin_set(t, tag, &mu), *victim = NULL, *empty = NULL, *oldest = &s[0];
    pthread_mutex_lock(mu);
    for (int i = 0; i < TWIN_WAYS && !victim; i++) {
        if (s[i].tag == tag)
            victim = &s[i]; /* re-promotion of the key: replace */
        else if (!s[i].tag && !empty)
            empty = &s[i];
        else if (s[i].tag && (!oldest->tag || s[i].seqno < oldest->seqno))
            oldest = &s[i];
    }
    if (!victim)
        victim = empty ? empty : oldest;
    if (!victim->tag)
        atomic_fetch_add_explicit(&t->count, 1, memory_order_relaxed);
    else if (victim->tag != tag)
        atomic_fetch_add_explicit(&t->evicted, 1, memory_order_relaxed);
    victim->tag = tag;
    victim->seqno = seqno;
    pthread_mutex_unlock(mu);
}

bool lsm_twin_get(lsm_twin *t, const void *key, size_t klen, uint64_t *seqno)
{
    if (!t || atomic_load_explicit(&t->count, memory_order_relaxed) == 0)
        return false;
    pthread_mutex_t *mu;
    uint64_t tag = twin_tag(key, klen);
    twin_slot *s = twin_set(t, tag, &mu);
    bool found = false;
    pthread_mutex_lock(mu);
    for (int i = 0; i < TWIN_WAYS && !found; i++) {
        if (s[i].tag == tag) {
            *seqno = s[i].seqno;
            found = true;
        }
    }
    pthread_mutex_unlock(mu);
    return found;
}

/* Removes key's entry when its seqno is <= max_seqno; returns true if so. */
static bool twin_remove(lsm_twin *t, const void *key, size_t klen, uint64_t max_seqno,
                        uint64_t exact)
{
    pthread_mutex_t *mu;
    uint64_t tag = twin_tag(key, klen);
    twin_slot *s = twin_set(t, tag, &mu);
    bool removed = false;
    pthread_mutex_lock(mu);
    for (int i = 0; i < TWIN_WAYS; i++) {
        if (s[i].tag == tag && s[i].seqno <= max_seqno && (!exact || s[i].seqno == exact)) {
            s[i].tag = 0;
            removed = true;
            atomic_fetch_sub_explicit(&t->count, 1, memory_order_relaxed);
        }
    }
    pthread_mutex_unlock(mu);
    return removed;
}

void lsm_twin_del(lsm_twin *t, const void *key, size_t klen)
{
    /* No empty-map shortcut here: a writer must take the stripe so that an
     * insert racing with it is ordered (see promote.c). */
    if (t)
        twin_remove(t, key, klen, UINT64_MAX, 0);
}

bool lsm_twin_drop(lsm_twin *t, const void *key, size_t klen, uint64_t seqno)
{
    if (!t || atomic_load_explicit(&t->count, memory_order_relaxed) == 0)
        return false;
    return twin_remove(t, key, klen, seqno, seqno);
}
