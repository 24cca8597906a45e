/* SPDX-License-Identifier: MIT */
/*
 * Engine background work: one thread that flushes dirty items to L0 when
 * they pass the write buffer (or on request) and evicts clean items when
 * the memory tier passes its budget; the admission sketch; statistics.
 *
 * Flush: take the apply lock exclusively for an instant to pick S, the
 * highest seqno handed out (every write with a seqno <= S is then in
 * memory); collect the dirty items with seqno <= S (a flush the write
 * buffer triggered keeps the oldest write_buffer bytes of them and lowers S
 * to their last seqno), sort them by key, write them with lsm_flush(.., S),
 * then clear the dirty bit of each item whose seqno is still the one
 * flushed (hr_set_flags compares it atomically).
 */
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"
#include "node/engine_int.h"
#include "node/kallax/kallax.h"

#define SKETCH_AGE_EVERY (8u << 20) /* halve every counter after this many adds */
#define WAIT_ROOM_MS 10000u
#define FLUSH_BACKOFF_NS 100000000u /* after a failed flush */

/* ---- admission sketch -------------------------------------------------- */

static void sketch_slots(const void *key, size_t klen, size_t *a, size_t *b)
{
    uint64_t h = kv_hash64(key, klen, 0x9e3779b97f4a7c15ull);
    *a = h % ENGINE_SKETCH_SIZE;
    *b = (h >> 32) % ENGINE_SKETCH_SIZE;
}

/* Counts one access of key; returns the estimate before it (the smaller of
 * the key's two counters). */
static unsigned sketch_add(engine *e, const void *key, size_t klen)
{
    size_t a, b;
    sketch_slots(key, klen, &a, &b);
    uint8_t ca = atomic_load_explicit(&e->sketch[a], memory_order_relaxed);
    uint8_t cb = atomic_load_explicit(&e->sketch[b], memory_order_relaxed);
    /* Relaxed read-modify-write: a lost increment only delays one admission. */
    if (ca < 15)
        atomic_store_explicit(&e->sketch[a], (uint8_t)(ca + 1), memory_order_relaxed);
    if (cb < 15)
        atomic_store_explicit(&e->sketch[b], (uint8_t)(cb + 1), memory_order_relaxed);
    if (atomic_fetch_add_explicit(&e->sketch_adds, 1, memory_order_relaxed) % SKETCH_AGE_EVERY ==
        SKETCH_AGE_EVERY - 1) {
        for (size_t i = 0; i < ENGINE_SKETCH_SIZE; i++) /* aging: the window slides */
            atomic_store_explicit(&e->sketch[i],
                                  atomic_load_explicit(&e->sketch[i], memory_order_relaxed) / 2,
                                  memory_order_relaxed);
    }
    return ca < cb ? ca : cb;
}

bool engine_admit(engine *e, const void *key, size_t klen)
{
    return sketch_add(e, key, klen) >= 1; /* seen before within the window */
}

void engine_touch(engine *e, const void *key, size_t klen)
{
    sketch_add(e, key, klen);
}

/* The key's access estimate (0..15), without counting an access. */
static unsigned sketch_freq(engine *e, const void *key, size_t klen)
{
    size_t a, b;
    sketch_slots(key, klen, &a, &b);
    uint8_t ca = atomic_load_explicit(&e->sketch[a], memory_order_relaxed);
    uint8_t cb = atomic_load_explicit(&e->sketch[b], memory_order_relaxed);
    return ca < cb ? ca : cb;
}

/* ---- flush ------------------------------------------------------------- */

typedef struct collect {
    uint64_t max_seqno;
    lsm_rec *recs;
    size_t n, cap;
    bool oom;
} collect;

static void collect_dirty(void *arg, const hr_view *v)
{
    collect *c = arg;
    if (!(v->meta.flags & HR_F_DIRTY) || v->meta.seqno > c->max_seqno || c->oom)
        return;
    if (c->n == c->cap) {
        size_t ncap = c->cap ? c->cap * 2 : 1024;
        lsm_rec *n = realloc(c->recs, ncap * sizeof(*n));
        if (!n) {
            c->oom = true;
            return;
        }
        c->recs = n;
        c->cap = ncap;
    }
    uint8_t *buf = malloc(v->klen + v->vlen + 1);
    if (!buf) {
        c->oom = true;
        return;
    }
    memcpy(buf, v->key, v->klen);
    if (v->vlen)
        memcpy(buf + v->klen, v->val, v->vlen);
    bool del = v->meta.flags & HR_F_TOMBSTONE;
    c->recs[c->n++] = (lsm_rec){.key = buf,
                                .klen = v->klen,
                                .value = del ? NULL : buf + v->klen,
                                .vlen = del ? 0 : v->vlen,
                                .version = v->meta.version,
                                .seqno = v->meta.seqno,
                                .expire_at = v->meta.expire_at,
                                .type = del ? LSM_DELETE : LSM_PUT};
}

static int rec_cmp(const void *a, const void *b)
{
    const lsm_rec *x = a, *y = b;
    size_t n = x->klen < y->klen ? x->klen : y->klen;
    int c = memcmp(x->key, y->key, n);
    if (c)
        return c;
    return x->klen < y->klen ? -1 : x->klen > y->klen;
}

static int rec_seqno_cmp(const void *a, const void *b)
{
    const lsm_rec *x = a, *y = b;
    return x->seqno < y->seqno ? -1 : x->seqno > y->seqno;
}

/* The largest j in [lo, hi] whose prefix recs[0, j) sorts wholly below the
 * rest recs[j, n) (recs in seqno order, keys unique), or SIZE_MAX when none
 * does. */
static size_t disjoint_cut(const lsm_rec *recs, size_t n, size_t lo, size_t hi)
{
    if (hi >= n)
        return hi; /* nothing is left behind */
    if (lo > hi)
        return SIZE_MAX;
    /* sufmin[j - lo]: the index of the smallest key of recs[j, n) */
    size_t *sufmin = malloc((hi - lo + 1) * sizeof(*sufmin));
    if (!sufmin)
        return SIZE_MAX;
    size_t m = n - 1;
    for (size_t i = n - 1; i + 1 > lo; i--) {
        if (rec_cmp(&recs[i], &recs[m]) < 0)
            m = i;
        if (i <= hi)
            sufmin[i - lo] = m;
    }
    size_t pmax = 0, best = SIZE_MAX; /* pmax: the largest key of recs[0, j) */
    for (size_t i = 1; i < lo; i++)
        if (rec_cmp(&recs[i], &recs[pmax]) > 0)
            pmax = i;
    for (size_t j = lo; j <= hi; j++) {
        if (j > 1 && rec_cmp(&recs[j - 1], &recs[pmax]) > 0)
            pmax = j - 1;
        if (rec_cmp(&recs[pmax], &recs[sufmin[j - lo]]) < 0)
            best = j; /* keep looking: the largest such j wins */
    }
    free(sufmin);
    return best;
}

size_t engine_flush_cut(lsm_rec *recs, size_t n, uint64_t limit, uint64_t *max_seqno)
{
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += engine_rec_bytes(recs[i].klen, recs[i].vlen);
    if (!limit || bytes <= limit)
        return n;
    qsort(recs, n, sizeof(*recs), rec_seqno_cmp);
    size_t k = 0, lo = 0;
    uint64_t least = limit - limit / 4; /* the shortest cut taken: 3/4 of the limit */
    for (bytes = 0; k < n && bytes < limit; k++) {
        if (bytes < least)
            lo = k + 1;
        bytes += engine_rec_bytes(recs[k].klen, recs[k].vlen);
    }
    /* Best with a margin: records written after the collection may still
     * carry keys drawn before it (a writer between choosing its key and
     * taking its seqno); the more records the cut leaves behind, the older
     * such a key must be to fall below the cut. */
    size_t hi = n;
    for (bytes = 0; hi > 0 && bytes < limit / 8; hi--)
        bytes += engine_rec_bytes(recs[hi - 1].klen, recs[hi - 1].vlen);
    size_t j = disjoint_cut(recs, n, lo, hi < k ? hi : k);
    if (j == SIZE_MAX && hi < k)
        j = disjoint_cut(recs, n, hi + 1 > lo ? hi + 1 : lo, k);
    k = j == SIZE_MAX ? k : j;
    *max_seqno = recs[k - 1].seqno; /* seqnos are unique: recs[k..] are all above */
    return k;
}

/* Frees the copies collect_dirty made of recs[a, b). */
static void free_recs(lsm_rec *recs, size_t a, size_t b)
{
    for (size_t i = a; i < b; i++)
        free((void *)recs[i].key);
}

/* Flushes the dirty items up to the highest seqno handed out; a flush the
 * write buffer triggered (not forced) takes only the oldest write_buffer
 * bytes of them, and the rest stays dirty for the next flush. Without the
 * cut, the records written while the previous flush ran (up to the 2x cap
 * where writers wait) made every flush of a steady load twice the write
 * buffer. */
static kv_err flush_now(engine *e, bool forced)
{
    pthread_rwlock_wrlock(&e->apply_lock);
    uint64_t s = atomic_load(&e->next_seqno) - 1;
    pthread_rwlock_unlock(&e->apply_lock);
    collect c = {.max_seqno = s};
    hr_iterate(e->idx, collect_dirty, &c);
    kv_err rv = c.oom ? KV_RESOURCE_EXHAUSTED : KV_OK;
    size_t all = c.n;
    if (rv == KV_OK && !forced)
        c.n = engine_flush_cut(c.recs, c.n, e->write_buffer, &s);
    free_recs(c.recs, c.n, all);
    if (rv == KV_OK) {
        if (c.n) /* a forced flush may find nothing dirty: recs is NULL */
            qsort(c.recs, c.n, sizeof(*c.recs), rec_cmp);
        rv = e->st->flush(e->db, c.recs, c.n, s);
    }
    for (size_t i = 0; rv == KV_OK && i < c.n; i++) {
        const lsm_rec *r = &c.recs[i];
        if (hr_set_flags(e->idx, r->key, r->klen, r->seqno, 0, HR_F_DIRTY) == KV_OK) {
            atomic_fetch_sub(&e->dirty_bytes, engine_rec_bytes(r->klen, r->vlen));
            atomic_fetch_sub(&e->dirty_items, 1);
        }
    }
    free_recs(c.recs, 0, c.n);
    free(c.recs);
    if (rv == KV_OK)
        atomic_fetch_add(&e->flushes, 1);
    else
        KV_WARN("engine", "flush of %zu records failed: %s", c.n, kv_strerror(rv));
    return rv;
}

/* ---- eviction ---------------------------------------------------------- */

/* Eviction is least-frequently-used by the admission sketch's estimate
 * (memory hits count at the sampled rate of engine_touch): a first pass
 * sums the clean, unpinned bytes per estimate, a second picks every item
 * below the threshold estimate and, at the threshold, items in index order
 * until the wanted bytes are reached. Records loaded by writes and never
 * read have estimate 0 and go first; the read-hot set stays. */
#define FREQS 16

typedef struct victims {
    engine *e;
    uint64_t want, got;
    uint64_t hist[FREQS]; /* pass 1: clean bytes per estimate */
    unsigned thresh;      /* pass 2: evict below, and at it up to at_budget */
    uint64_t at_budget, at_got;
    bool pick;
    struct victim {
        uint8_t *key;
        size_t klen;
        uint64_t seqno;
    } * v;
    size_t n, cap;
} victims;

static void pick_clean(void *arg, const hr_view *v)
{
    victims *vs = arg;
    if (v->meta.flags & (HR_F_DIRTY | HR_F_PINNED))
        return;
    unsigned f = sketch_freq(vs->e, v->key, v->klen);
    uint64_t bytes = engine_rec_bytes(v->klen, v->vlen);
    if (!vs->pick) {
        vs->hist[f] += bytes;
        return;
    }
    if (vs->got >= vs->want || f > vs->thresh || (f == vs->thresh && vs->at_got >= vs->at_budget))
        return;
    if (vs->n == vs->cap) {
        size_t ncap = vs->cap ? vs->cap * 2 : 1024;
        struct victim *n = realloc(vs->v, ncap * sizeof(*n));
        if (!n)
            return;
        vs->v = n;
        vs->cap = ncap;
    }
    uint8_t *k = malloc(v->klen);
    if (!k)
        return;
    memcpy(k, v->key, v->klen);
    vs->v[vs->n++] = (struct victim){k, v->klen, v->meta.seqno};
    vs->got += bytes;
    if (f == vs->thresh)
        vs->at_got += bytes;
}

typedef struct evict_cond_arg {
    uint64_t seqno, bytes;
} evict_cond_arg;

/* Removes only the clean, unpinned version that was picked. */
static kv_err evict_cond(void *arg, const hr_view *cur)
{
    evict_cond_arg *a = arg;
    if (!cur || (cur->meta.flags & (HR_F_DIRTY | HR_F_PINNED)) || cur->meta.seqno != a->seqno)
        return KV_ALREADY_EXISTS;
    a->bytes = engine_rec_bytes(cur->klen, cur->vlen);
    return KV_OK;
}

static void evict(engine *e)
{
    uint64_t used = atomic_load(&e->mem_bytes), low = e->mem_limit / 10 * 8;
    if (used <= e->mem_limit / 10 * 9)
        return;
    victims vs = {.e = e, .want = used - low};
    hr_iterate(e->idx, pick_clean, &vs); /* pass 1: the histogram */
    uint64_t below = 0;
    vs.thresh = FREQS - 1;
    for (unsigned f = 0; f < FREQS; f++) {
        if (below + vs.hist[f] >= vs.want) {
            vs.thresh = f;
            break;
        }
        below += vs.hist[f];
    }
    vs.at_budget = vs.want > below ? vs.want - below : 0;
    vs.pick = true;
    hr_iterate(e->idx, pick_clean, &vs); /* pass 2: the victims */
    for (size_t i = 0; i < vs.n; i++) {
        evict_cond_arg a = {vs.v[i].seqno, 0};
        if (hr_remove(e->idx, vs.v[i].key, vs.v[i].klen, evict_cond, &a) == KV_OK) {
            atomic_fetch_sub(&e->mem_bytes, a.bytes);
            atomic_fetch_add_explicit(&e->evictions, 1, memory_order_relaxed);
        }
        free(vs.v[i].key);
    }
    free(vs.v);
}

/* ---- the background thread --------------------------------------------- */

/* The WAL at half its limit and two write buffers past the dirty bytes:
 * overwrites grew it (a record overwritten in memory stays in the WAL), and
 * only a flush of every dirty record lets all its sealed segments go (a cut
 * flush covers the oldest write buffer of them). Under inserts the WAL is
 * the dirty bytes plus about a segment not yet covered, and flushes stay
 * cut to the write buffer. At the limit always: writers wait there, also
 * when --wal-max-mb is set below the write buffer. */
bool engine_wal_due(engine *e)
{
    uint64_t wal = e->st->wal_bytes(e->db);
    if (wal >= e->wal_limit) /* writers wait (engine_full): a flush must come */
        return true;
    return wal >= e->wal_limit / 2 && wal >= atomic_load(&e->dirty_bytes) + 2 * e->write_buffer;
}

/* wal: engine_wal_due(e), which the caller has at hand */
static bool needs_flush(engine *e, bool wal)
{
    return wal || atomic_load(&e->dirty_bytes) >= e->write_buffer || e->flush_req > e->flush_done;
}

bool engine_full(engine *e)
{
    return atomic_load(&e->dirty_bytes) >= 2 * e->write_buffer ||
           e->st->wal_bytes(e->db) >= e->wal_limit;
}

/* Waits on bg_cv (bg_mu held) for at most ns. */
static void bg_wait(engine *e, uint64_t ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t t = (uint64_t)ts.tv_nsec + ns;
    ts.tv_sec += (time_t)(t / 1000000000u);
    ts.tv_nsec = (long)(t % 1000000000u);
    pthread_cond_timedwait(&e->bg_cv, &e->bg_mu, &ts);
}

static void *bg_main(void *arg)
{
    engine *e = arg;
    prctl(PR_SET_NAME, "engine:flush"); /* shown by top -H, perf, gdb */
    hr_thread_register();
    pthread_mutex_lock(&e->bg_mu);
    while (!e->stop) {
        bool wal = engine_wal_due(e), flush = needs_flush(e, wal);
        if (!flush && atomic_load(&e->mem_bytes) <= e->mem_limit / 10 * 9) {
            bg_wait(e, 1000000000u);
            continue;
        }
        uint64_t req = e->flush_req;
        bool forced = req > e->flush_done || wal;
        if (wal) /* overwrites (engine_wal_due) */
            atomic_fetch_add_explicit(&e->wal_flushes, 1, memory_order_relaxed);
        pthread_mutex_unlock(&e->bg_mu);
        kv_err rv = flush ? flush_now(e, forced) : KV_OK;
        evict(e);
        pthread_mutex_lock(&e->bg_mu);
        if (flush) {
            e->flush_done = req;
            e->flush_err = rv;
        }
        pthread_cond_broadcast(&e->done_cv);
        /* back off; writers see RESOURCE_EXHAUSTED or the WAL's error
         * meanwhile, and their flush requests do not cut the pause short */
        uint64_t until = kv_now_ns() + FLUSH_BACKOFF_NS;
        for (uint64_t now = kv_now_ns(); rv != KV_OK && !e->stop && now < until; now = kv_now_ns())
            bg_wait(e, until - now);
    }
    pthread_cond_broadcast(&e->done_cv);
    pthread_mutex_unlock(&e->bg_mu);
    hr_thread_unregister();
    return NULL;
}

kv_err engine_bg_start(engine *e)
{
    if (pthread_create(&e->bg, NULL, bg_main, e) != 0)
        return KV_RESOURCE_EXHAUSTED;
    e->bg_started = true;
    return KV_OK;
}

void engine_bg_stop(engine *e)
{
    if (!e->bg_started)
        return;
    pthread_mutex_lock(&e->bg_mu);
    e->stop = true;
    pthread_cond_broadcast(&e->bg_cv);
    pthread_mutex_unlock(&e->bg_mu);
    pthread_join(e->bg, NULL);
    e->bg_started = false;
}

void engine_bg_request_flush(engine *e)
{
    pthread_mutex_lock(&e->bg_mu);
    if (e->flush_req == e->flush_done) /* one pending request is enough */
        e->flush_req++;
    pthread_cond_signal(&e->bg_cv);
    pthread_mutex_unlock(&e->bg_mu);
}

void engine_bg_kick(engine *e)
{
    pthread_mutex_lock(&e->bg_mu);
    pthread_cond_signal(&e->bg_cv);
    pthread_mutex_unlock(&e->bg_mu);
}

kv_err engine_wait_room(engine *e)
{
    if (!engine_full(e))
        return KV_OK;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += WAIT_ROOM_MS / 1000;
    kv_err rv = KV_OK;
    uint64_t t0 = kv_now_ns();
    pthread_mutex_lock(&e->bg_mu);
    pthread_cond_signal(&e->bg_cv);
    while (!e->stop && engine_full(e))
        if (pthread_cond_timedwait(&e->done_cv, &e->bg_mu, &ts) != 0) {
            rv = KV_RESOURCE_EXHAUSTED;
            break;
        }
    pthread_mutex_unlock(&e->bg_mu);
    atomic_fetch_add_explicit(&e->write_waits, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&e->write_wait_ns, kv_now_ns() - t0, memory_order_relaxed);
    return rv;
}

kv_err engine_flush(engine *e)
{
    pthread_mutex_lock(&e->bg_mu);
    uint64_t ticket = ++e->flush_req;
    pthread_cond_signal(&e->bg_cv);
    while (!e->stop && e->flush_done < ticket)
        pthread_cond_wait(&e->done_cv, &e->bg_mu);
    kv_err rv = e->stop ? KV_CANCELLED : e->flush_err;
    pthread_mutex_unlock(&e->bg_mu);
    return rv;
}

/* ---- stats ------------------------------------------------------------- */

void engine_get_stats(engine *e, engine_stats *out)
{
    hr_stats hs;
    hr_get_stats(e->idx, &hs);
    engine_stats s = {.items = hs.items, .mem_limit = e->mem_limit};
    s.mem_bytes = atomic_load(&e->mem_bytes);
    s.dirty_bytes = atomic_load(&e->dirty_bytes);
    s.wal_bytes = e->st->wal_bytes(e->db);
    s.wal_limit = e->wal_limit;
    s.wal_flushes = atomic_load(&e->wal_flushes);
    s.gets = atomic_load(&e->gets);
    s.puts = atomic_load(&e->puts);
    s.deletes = atomic_load(&e->deletes);
    s.blind_puts = atomic_load(&e->blind_puts);
    s.reads_mem = atomic_load(&e->reads_mem);
    s.reads_fd = atomic_load(&e->reads_fd);
    s.reads_sd = atomic_load(&e->reads_sd);
    s.reads_miss = atomic_load(&e->reads_miss);
    s.fills = atomic_load(&e->fills);
    s.evictions = atomic_load(&e->evictions);
    s.flushes = atomic_load(&e->flushes);
    s.write_waits = atomic_load(&e->write_waits);
    s.write_wait_ns = atomic_load(&e->write_wait_ns);
    s.index_reads = hs.reads;
    s.index_visited = hs.read_visited;
    s.index_head_hits = hs.head_hits;
    s.index_head_moves = hs.head_moves;
    s.index_sample_rounds = hs.sample_rounds;
    s.index_rehashes = hs.rehashes;
    s.index_buckets = hs.buckets;
    s.index_pinned_reads = hs.pinned_reads;
    s.index_pinned_head_hits = hs.pinned_head_hits;
    *out = s;
}

kv_err engine_lsm_get_stats(engine *e, lsm_stats *out)
{
    lsm_db *db = engine_lsm(e);
    return db ? lsm_stats_get(db, out) : KV_FAILED_PRECONDITION;
}

kv_err engine_kallax_get_stats(engine *e, kallax_stats *out)
{
    return e->st == &engine_store_kallax ? kallax_stats_get(e->db, out) : KV_FAILED_PRECONDITION;
}

bool engine_has_slow(const engine *e)
{
    return e->o.slow_dir != NULL;
}
