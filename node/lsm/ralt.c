/* SPDX-License-Identifier: MIT */
/*
 * RALT, the Recent Access Lookup Table of HotRAP (ATC'25): which records are
 * read-hot. An access appends {key, value length, tick} to an unsorted
 * buffer; a full buffer is sorted, folded and added as a sorted run with two
 * bloom filters (every tracked key, and the stably hot keys; 14 bits/key).
 * When there are more than RALT_MAX_RUNS runs, or the tracked sizes exceed
 * their limits, all runs are merged into one (the table's compaction) with
 * the merge rule of ent_fold() and the lowest scores are evicted (about 10%
 * at a time) until the table is under both limits.
 *
 * Scores: an exponentially decayed access count. The clock is a tick that
 * advances every tick_bytes of accessed key + value bytes; a score halves
 * every RALT_HALF_LIFE ticks. A key becomes stable (stably hot) once it is
 * seen again while its counter is positive; the counter starts at 5 on each
 * access and drops by one every RALT_PERIOD_TICKS ticks. "Hot" below means
 * stable and still tracked. Limits: the hot-set limit bounds the key + value
 * bytes of stable entries (the caller sets it from the FD size); the physical
 * limit bounds the table's own bytes and adapts to the stable share: the
 * fewer accessed keys turn out stable, the more entries the table needs to
 * find a hot set of the same size; it never exceeds the hot-set limit nor
 * phys_cap (the table lives in memory, see below).
 *
 * Concurrency: bmu guards the buffer; fmu serialises flushes and merges
 * (runs change only under fmu); mu (rwlock) guards the run array for
 * readers. The runs live in memory; they are not persisted (a restart
 * forgets hotness, which only costs re-learning).
 */
#include <math.h>
#include <stdlib.h>

#include "common/hash.h"
#include "node/lsm/lsm_int.h"

#define RALT_MAX_RUNS 8
#define RALT_BITS_PER_KEY 14
#define RALT_BLOOM_K 10
#define RALT_COUNTER0 5
#define RALT_PERIOD_TICKS 4
#define RALT_HALF_LIFE 16.0
#define RALT_ENT_BYTES 40 /* per-entry bytes besides the key */
#define RALT_SEED 0x52414c54u
#define RALT_MIN_PHYS (256u << 10)

typedef struct ralt_ent {
    uint8_t *key;
    uint32_t klen, vlen;
    double score; /* as of tick */
    uint64_t tick;
    uint8_t counter; /* as of tick */
    bool stable;
} ralt_ent;

typedef struct ralt_bloom {
    uint8_t *bits;
    uint64_t nbits;
} ralt_bloom;

typedef struct ralt_run {
    ralt_ent *e;
    size_t n;
    ralt_bloom all, stable;
    uint64_t hot, phys; /* stable key+value bytes, table bytes */
} ralt_run;

struct ralt {
    pthread_mutex_t bmu;
    ralt_ent *buf;
    size_t nbuf, buf_alloc, buf_cap; /* buf_cap entries trigger a flush */
    pthread_mutex_t fmu;
    pthread_rwlock_t mu;
    ralt_run runs[RALT_MAX_RUNS + 1]; /* oldest first */
    size_t nruns;
    uint64_t tick_bytes, phys_cap;
    _Atomic uint64_t accessed, hot_limit, phys_limit, evicted;
};

static double decay(uint64_t dt)
{
    return exp2(-(double)dt / RALT_HALF_LIFE);
}

static uint64_t now_tick(ralt *r)
{
    return atomic_load(&r->accessed) / r->tick_bytes;
}

static uint64_t ent_phys(const ralt_ent *e)
{
    return e->klen + RALT_ENT_BYTES;
}

/* ---- bloom filters ---- */

static kv_err bloom_build(ralt_bloom *b, const ralt_ent *e, size_t n, bool stable_only)
{
    size_t keys = 0;
    for (size_t i = 0; i < n; i++)
        keys += !stable_only || e[i].stable;
    b->nbits = keys * RALT_BITS_PER_KEY < 64 ? 64 : keys * RALT_BITS_PER_KEY;
    b->bits = calloc(b->nbits / 8 + 1, 1);
    if (!b->bits)
        return KV_RESOURCE_EXHAUSTED;
    for (size_t i = 0; i < n; i++) {
        if (stable_only && !e[i].stable)
            continue;
        uint64_t h = kv_hash64(e[i].key, e[i].klen, RALT_SEED);
        uint64_t h1 = (uint32_t)h, h2 = (h >> 32) | 1;
        for (unsigned k = 0; k < RALT_BLOOM_K; k++) {
            uint64_t bit = (h1 + k * h2) % b->nbits;
            b->bits[bit / 8] |= (uint8_t)(1u << (bit % 8));
        }
    }
    return KV_OK;
}

static bool bloom_may(const ralt_bloom *b, uint64_t h)
{
    uint64_t h1 = (uint32_t)h, h2 = (h >> 32) | 1;
    for (unsigned k = 0; k < RALT_BLOOM_K; k++) {
        uint64_t bit = (h1 + k * h2) % b->nbits;
        if (!(b->bits[bit / 8] & (1u << (bit % 8))))
            return false;
    }
    return true;
}

/* ---- entries and runs ---- */

/* The merge rule: folds the newer entry b into the older a (same key). */
static void ent_fold(ralt_ent *a, const ralt_ent *b)
{
    uint64_t t = b->tick > a->tick ? b->tick : a->tick;
    uint64_t periods = (t - a->tick) / RALT_PERIOD_TICKS;
    unsigned cnt = periods >= a->counter ? 0 : a->counter - (unsigned)periods;
    uint64_t bper = (t - b->tick) / RALT_PERIOD_TICKS;
    unsigned bcnt = bper >= b->counter ? 0 : b->counter - (unsigned)bper;
    a->stable = a->stable || b->stable || cnt > 0;
    a->score = a->score * decay(t - a->tick) + b->score * decay(t - b->tick);
    a->counter = (uint8_t)(cnt > bcnt ? cnt : bcnt);
    a->tick = t;
    a->vlen = b->vlen;
    free(b->key);
}

static int ent_cmp(const void *x, const void *y)
{
    const ralt_ent *a = x, *b = y;
    int c = lsm_key_cmp(a->key, a->klen, b->key, b->klen);
    if (c)
        return c;
    return a->tick < b->tick ? -1 : a->tick > b->tick;
}

static void run_free(ralt_run *run)
{
    for (size_t i = 0; i < run->n; i++)
        free(run->e[i].key);
    free(run->e);
    free(run->all.bits);
    free(run->stable.bits);
    memset(run, 0, sizeof(*run));
}

/* Makes a run of e[0..n) (sorted, one entry per key; takes e). */
static kv_err run_make(ralt_run *run, ralt_ent *e, size_t n)
{
    *run = (ralt_run){.e = e, .n = n};
    for (size_t i = 0; i < n; i++) {
        run->hot += e[i].stable ? e[i].klen + e[i].vlen : 0;
        run->phys += ent_phys(&e[i]);
    }
    kv_err rv = bloom_build(&run->all, e, n, false);
    if (rv == KV_OK)
        rv = bloom_build(&run->stable, e, n, true);
    if (rv != KV_OK)
        run_free(run);
    return rv;
}

static const ralt_ent *run_find(const ralt_run *run, const void *key, size_t klen)
{
    size_t lo = 0, hi = run->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = lsm_key_cmp(run->e[mid].key, run->e[mid].klen, key, klen);
        if (c == 0)
            return &run->e[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* First index of run whose key >= key. */
static size_t run_lower(const ralt_run *run, const void *key, size_t klen)
{
    size_t lo = 0, hi = run->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (lsm_key_cmp(run->e[mid].key, run->e[mid].klen, key, klen) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* ---- merging and eviction ---- */

typedef struct scored {
    double s;
    size_t i;
} scored;

static int scored_cmp(const void *x, const void *y)
{
    const scored *a = x, *b = y;
    return a->s < b->s ? -1 : a->s > b->s;
}

/* Physical limit from the hot-set limit and the stable share of e. */
static void adapt_phys(ralt *r, const ralt_ent *e, size_t n)
{
    uint64_t hot = 0, nst = 0, phys = 0;
    for (size_t i = 0; i < n; i++) {
        phys += ent_phys(&e[i]);
        if (e[i].stable)
            hot += e[i].klen + e[i].vlen, nst++;
    }
    uint64_t limit = atomic_load(&r->hot_limit);
    double share = n ? (double)nst / (double)n : 1.0;
    share = share < 0.1 ? 0.1 : share;
    double avg_rec = nst ? (double)hot / (double)nst : 256.0;
    double avg_ent = n ? (double)phys / (double)n : 64.0;
    double want = (double)limit / (avg_rec < 1 ? 1 : avg_rec) * avg_ent / share;
    double cap = (double)(limit < r->phys_cap ? limit : r->phys_cap);
    cap = cap > RALT_MIN_PHYS ? cap : RALT_MIN_PHYS;
    want = want < RALT_MIN_PHYS ? RALT_MIN_PHYS : want > cap ? cap : want;
    atomic_store(&r->phys_limit, (uint64_t)want);
}

/* Drops the lowest-scored entries of e (in place) until the hot bytes and
 * the table bytes are under 90% of their limits. Returns the new count. */
static size_t evict(ralt *r, ralt_ent *e, size_t n)
{
    uint64_t hot = 0, phys = 0, hl = atomic_load(&r->hot_limit);
    uint64_t pl = atomic_load(&r->phys_limit);
    for (size_t i = 0; i < n; i++) {
        hot += e[i].stable ? e[i].klen + e[i].vlen : 0;
        phys += ent_phys(&e[i]);
    }
    if (hot <= hl && phys <= pl)
        return n;
    scored *s = malloc(n * sizeof(*s));
    if (!s)
        return n;
    uint64_t t = now_tick(r);
    for (size_t i = 0; i < n; i++)
        s[i] = (scored){e[i].score * decay(t > e[i].tick ? t - e[i].tick : 0), i};
    qsort(s, n, sizeof(*s), scored_cmp);
    size_t k = 0;
    for (; k < n && (hot > hl / 10 * 9 || phys > pl / 10 * 9); k++) {
        ralt_ent *x = &e[s[k].i];
        hot -= x->stable ? x->klen + x->vlen : 0;
        phys -= ent_phys(x);
        free(x->key);
        x->key = NULL;
    }
    free(s);
    atomic_fetch_add(&r->evicted, k);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (e[i].key)
            e[m++] = e[i];
    return m;
}

/* Merges every run into one, oldest first, and evicts (fmu held). */
static kv_err merge_all(ralt *r)
{
    size_t total = 0;
    for (size_t i = 0; i < r->nruns; i++)
        total += r->runs[i].n;
    ralt_ent *out = malloc((total ? total : 1) * sizeof(*out));
    size_t pos[RALT_MAX_RUNS + 1] = {0}, m = 0;
    if (!out)
        return KV_RESOURCE_EXHAUSTED;
    for (;;) {
        int best = -1;
        for (size_t i = 0; i < r->nruns; i++) {
            if (pos[i] == r->runs[i].n)
                continue;
            const ralt_ent *x = &r->runs[i].e[pos[i]];
            if (best < 0 || lsm_key_cmp(x->key, x->klen, r->runs[best].e[pos[best]].key,
                                        r->runs[best].e[pos[best]].klen) < 0)
                best = (int)i;
        }
        if (best < 0)
            break;
        ralt_ent *x = &r->runs[best].e[pos[best]++];
        if (m && lsm_key_cmp(out[m - 1].key, out[m - 1].klen, x->key, x->klen) == 0)
            ent_fold(&out[m - 1], x); /* runs are visited oldest first */
        else
            out[m++] = *x;
    }
    adapt_phys(r, out, m);
    m = evict(r, out, m);
    ralt_run merged;
    kv_err rv = run_make(&merged, out, m); /* on failure out and its keys are freed */
    pthread_rwlock_wrlock(&r->mu);
    for (size_t i = 0; i < r->nruns; i++) {
        free(r->runs[i].e); /* keys moved to merged (or freed with it) */
        free(r->runs[i].all.bits);
        free(r->runs[i].stable.bits);
    }
    if (rv == KV_OK)
        r->runs[0] = merged;
    r->nruns = rv == KV_OK ? 1 : 0; /* out of memory: forget the table */
    pthread_rwlock_unlock(&r->mu);
    return rv;
}

static bool over_limits(ralt *r)
{
    uint64_t hot = 0, phys = 0;
    for (size_t i = 0; i < r->nruns; i++)
        hot += r->runs[i].hot, phys += r->runs[i].phys;
    return hot > atomic_load(&r->hot_limit) || phys > atomic_load(&r->phys_limit);
}

/* Sorts and folds a taken buffer into a new run (fmu held; takes e). */
static kv_err add_buffer(ralt *r, ralt_ent *e, size_t n)
{
    qsort(e, n, sizeof(*e), ent_cmp);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m && lsm_key_cmp(e[m - 1].key, e[m - 1].klen, e[i].key, e[i].klen) == 0)
            ent_fold(&e[m - 1], &e[i]);
        else
            e[m++] = e[i];
    }
    ralt_run run;
    kv_err rv = run_make(&run, e, m);
    if (rv != KV_OK)
        return rv;
    pthread_rwlock_wrlock(&r->mu);
    r->runs[r->nruns++] = run;
    pthread_rwlock_unlock(&r->mu);
    if (r->nruns > RALT_MAX_RUNS || over_limits(r))
        rv = merge_all(r);
    return rv;
}

/* Takes the buffer and turns it into a run (fmu held). */
static kv_err flush_locked(ralt *r)
{
    pthread_mutex_lock(&r->bmu);
    ralt_ent *e = r->buf;
    size_t n = r->nbuf;
    r->buf = NULL;
    r->nbuf = r->buf_alloc = 0;
    pthread_mutex_unlock(&r->bmu);
    if (!n) {
        free(e);
        return KV_OK;
    }
    return add_buffer(r, e, n);
}

/* ---- API ---- */

kv_err ralt_open(ralt **out, const ralt_opts *o)
{
    ralt *r = calloc(1, sizeof(*r));
    if (!r)
        return KV_RESOURCE_EXHAUSTED;
    pthread_mutex_init(&r->bmu, NULL);
    pthread_mutex_init(&r->fmu, NULL);
    pthread_rwlock_init(&r->mu, NULL);
    r->buf_cap = o->buf_entries ? o->buf_entries : 1024;
    uint64_t hl = o->hot_limit ? o->hot_limit : (64u << 20);
    r->tick_bytes = o->tick_bytes ? o->tick_bytes : (hl / 16 < 4096 ? 4096 : hl / 16);
    atomic_store(&r->hot_limit, hl);
    r->phys_cap = o->phys_cap ? o->phys_cap : UINT64_MAX;
    uint64_t pl = hl < r->phys_cap ? hl : r->phys_cap;
    atomic_store(&r->phys_limit, pl > RALT_MIN_PHYS ? pl : RALT_MIN_PHYS);
    *out = r;
    return KV_OK;
}

void ralt_close(ralt *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->nbuf; i++)
        free(r->buf[i].key);
    free(r->buf);
    for (size_t i = 0; i < r->nruns; i++)
        run_free(&r->runs[i]);
    pthread_mutex_destroy(&r->bmu);
    pthread_mutex_destroy(&r->fmu);
    pthread_rwlock_destroy(&r->mu);
    free(r);
}

void ralt_access(ralt *r, const void *key, size_t klen, size_t vlen)
{
    uint8_t *k = klen ? malloc(klen) : NULL;
    if (!k)
        return;
    memcpy(k, key, klen);
    uint64_t t = atomic_fetch_add(&r->accessed, klen + vlen) / r->tick_bytes;
    ralt_ent e = {.key = k,
                  .klen = (uint32_t)klen,
                  .vlen = (uint32_t)vlen,
                  .score = 1.0,
                  .tick = t,
                  .counter = RALT_COUNTER0};
    pthread_mutex_lock(&r->bmu);
    if (!r->buf || r->nbuf == r->buf_alloc) { /* full while a flush runs: grow, up to 4x */
        size_t cap = r->buf ? r->buf_alloc * 2 : r->buf_cap;
        ralt_ent *b = cap <= 4 * r->buf_cap ? realloc(r->buf, cap * sizeof(*b)) : NULL;
        if (!b) {
            pthread_mutex_unlock(&r->bmu);
            free(k); /* dropped: the table is behind */
            return;
        }
        r->buf = b;
        r->buf_alloc = cap;
    }
    r->buf[r->nbuf++] = e;
    bool full = r->nbuf >= r->buf_cap;
    pthread_mutex_unlock(&r->bmu);
    if (full && pthread_mutex_trylock(&r->fmu) == 0) { /* else a flush is running */
        flush_locked(r);
        pthread_mutex_unlock(&r->fmu);
    }
}

kv_err ralt_flush(ralt *r)
{
    pthread_mutex_lock(&r->fmu);
    kv_err rv = flush_locked(r);
    if (rv == KV_OK && r->nruns > 1)
        rv = merge_all(r);
    pthread_mutex_unlock(&r->fmu);
    return rv;
}

bool ralt_is_hot(ralt *r, const void *key, size_t klen)
{
    uint64_t h = kv_hash64(key, klen, RALT_SEED);
    ralt_ent acc = {0};
    bool have = false, hot = false;
    pthread_rwlock_rdlock(&r->mu);
    for (size_t i = r->nruns; i-- > 0 && !hot;) {
        const ralt_run *run = &r->runs[i];
        if (bloom_may(&run->stable, h)) {
            const ralt_ent *x = run_find(run, key, klen);
            hot = x && x->stable;
        }
    }
    for (size_t i = 0; i < r->nruns && !hot; i++) { /* seen in several runs */
        const ralt_run *run = &r->runs[i];
        const ralt_ent *x = bloom_may(&run->all, h) ? run_find(run, key, klen) : NULL;
        if (!x)
            continue;
        if (have) {
            ralt_ent y = *x;
            y.key = NULL;
            ent_fold(&acc, &y);
        } else {
            acc = *x;
            have = true;
        }
        hot = acc.stable;
    }
    pthread_rwlock_unlock(&r->mu);
    return hot;
}

kv_err ralt_hot_range(ralt *r, const void *lo, size_t lolen, const void *hi, size_t hilen,
                      ralt_key_fn fn, void *arg)
{
    kv_err rv = ralt_flush(r);
    if (rv != KV_OK)
        return rv;
    pthread_rwlock_rdlock(&r->mu);
    if (r->nruns) {
        const ralt_run *run = &r->runs[0];
        for (size_t i = run_lower(run, lo, lolen); i < run->n; i++) {
            const ralt_ent *x = &run->e[i];
            if (lsm_key_cmp(x->key, x->klen, hi, hilen) > 0)
                break;
            if (x->stable)
                fn(arg, x->key, x->klen, x->vlen);
        }
    }
    pthread_rwlock_unlock(&r->mu);
    return KV_OK;
}

static void add_bytes(void *arg, const void *key, size_t klen, uint32_t vlen)
{
    (void)key;
    *(uint64_t *)arg += klen + vlen;
}

uint64_t ralt_hot_bytes(ralt *r, const void *lo, size_t lolen, const void *hi, size_t hilen)
{
    uint64_t sum = 0;
    if (ralt_hot_range(r, lo, lolen, hi, hilen, add_bytes, &sum) != KV_OK)
        return 0;
    return sum;
}

void ralt_set_hot_limit(ralt *r, uint64_t bytes)
{
    atomic_store(&r->hot_limit, bytes ? bytes : 1);
}

void ralt_stats_get(ralt *r, ralt_stats *out)
{
    memset(out, 0, sizeof(*out));
    pthread_rwlock_rdlock(&r->mu);
    for (size_t i = 0; i < r->nruns; i++) {
        out->entries += r->runs[i].n;
        out->hot_bytes += r->runs[i].hot;
        out->phys_bytes += r->runs[i].phys;
        for (size_t k = 0; k < r->runs[i].n; k++)
            out->stable += r->runs[i].e[k].stable;
    }
    out->runs = r->nruns;
    pthread_rwlock_unlock(&r->mu);
    out->hot_limit = atomic_load(&r->hot_limit);
    out->phys_limit = atomic_load(&r->phys_limit);
    out->tick = now_tick(r);
    out->evicted = atomic_load(&r->evicted);
}

double ralt_score(ralt *r, const void *key, size_t klen)
{
    double s = 0;
    uint64_t t = now_tick(r);
    pthread_rwlock_rdlock(&r->mu);
    for (size_t i = 0; i < r->nruns; i++) {
        const ralt_ent *x = run_find(&r->runs[i], key, klen);
        if (x)
            s += x->score * decay(t > x->tick ? t - x->tick : 0);
    }
    pthread_rwlock_unlock(&r->mu);
    return s;
}
