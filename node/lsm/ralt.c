/* SPDX-License-Identifier: MIT */
/*
 * RALT, the Recent Access Lookup Table of HotRAP (ATC'25): which records are
 * read-hot, kept as a small LSM on FD. An access appends {key, value length,
 * tick} to an unsorted in-memory buffer; a full buffer is sorted, folded
 * and written as a run: an SST of the engine's format (sst.c's builder and
 * reader) in <fast_dir>/ralt, one record per key whose value is the encoded
 * access record {value length, score, last and first tick, counter,
 * stable} (30 bytes, val_encode). Per run only the SST's index and bloom, two more bloom
 * filters (every tracked key, and the stably hot keys; 14 bits/key) and the
 * stably hot bytes per SST block stay in memory. The table's compaction is
 * size-tiered, with the merge rule of ent_fold() (associative: any split of
 * the accesses into runs folds to the same entry). When the tracked sizes
 * exceed their limits, every run is merged into one and the lowest scores
 * are evicted (about 10% at a time) until the table is under both limits.
 * When there are more than RALT_MAX_RUNS runs, the newest runs are merged
 * together, each older run joining while it is at most RALT_TIER_RATIO
 * times the entries of the run after it; a merge that reaches the oldest
 * run is a full one (and evicts). Merging every run whenever a ninth
 * appeared, as before, rewrote the whole table every 9 x 1024 accesses.
 *
 * Scores: an exponentially decayed access count. The clock is a tick that
 * advances every tick_bytes of accessed key + value bytes; a score halves
 * every RALT_HALF_LIFE ticks. A key becomes stable (stably hot) once it is
 * seen again while its counter is positive; the counter starts at 5 on each
 * access and drops by one every period (period_bytes of accesses, whole
 * ticks; the engine sets it to the FD size, the value HotRAP's code passes
 * as accessed_size_to_decr_counter). A key is thus stable once it is read
 * twice within about 5 x FD bytes of reads: shorter windows (the old 4
 * ticks, hot_limit / 4) left the zipf tail unstable, its keys being read
 * about once per such window. "Hot" below means
 * stable and still tracked. Limits: the hot-set limit bounds the key + value
 * bytes of stable entries (the caller sets it from the FD size); the physical
 * limit bounds the table's own bytes and adapts to the stable share: the
 * fewer accessed keys turn out stable, the more entries the table needs to
 * find a hot set of the same size; it never exceeds the hot-set limit nor
 * phys_cap.
 *
 * Restart: the run files are not recorded in a manifest. ralt_open deletes
 * whatever run files a previous process left in the directory, and the
 * table starts empty: hotness is a hint that the next few ticks of reads
 * re-learn (memory-tier hits included), a stale table would describe a
 * workload that may have moved, and no file of another process is ever
 * opened, so nothing leaks and nothing is mis-read. A corrupt run met
 * while the table runs (a checksum or a malformed access record) is logged
 * with its file name and counted; a lookup treats the key as not hot, a
 * merge drops the whole table (re-learned) and deletes the files.
 *
 * Concurrency: bmu guards the buffer; fmu serialises flushes and merges
 * (runs change only under fmu); mu (rwlock) guards the run array: readers
 * hold it shared across their block reads, a merge takes it exclusively
 * only to swap the array, then deletes the old files.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <dirent.h>

#include "common/hash.h"
#include "common/assert.h"
#include "common/log.h"
#include "node/lsm/iter.h"

#define RALT_MAX_RUNS 8
#define RALT_TIER_RATIO 4 /* an older run joins a merge of newer ones up to this */
#define RALT_BITS_PER_KEY 14
#define RALT_BLOOM_K 10
#define RALT_COUNTER0 5
#define RALT_PERIOD_TICKS 4 /* default period */
#define RALT_HALF_LIFE 16.0
#define RALT_ENT_BYTES 40 /* per-entry bytes besides the key */
#define RALT_SEED 0x52414c54u
#define RALT_MIN_PHYS (256u << 10)
#define RALT_VAL_LEN 30u
#define RALT_BLOCK 4096u

/* An access record. In the buffer key is malloc'ed; decoded from a run it
 * points into the reader's block. */
typedef struct ralt_ent {
    uint8_t *key;
    uint32_t klen, vlen;
    double score;    /* as of tick */
    uint64_t tick;   /* of the last access folded in */
    uint64_t first;  /* tick of the first access folded in */
    uint8_t counter; /* as of tick */
    bool stable;
} ralt_ent;

typedef struct ralt_bloom {
    uint8_t *bits;
    uint64_t nbits;
} ralt_bloom;

typedef struct ralt_run {
    lsm_file *f; /* the SST, reader open; obsolete + unref deletes it */
    ralt_bloom all, stable;
    uint64_t n, nstable, hot, phys; /* entries, stable ones, their k+v bytes, table bytes */
    uint64_t *blk_hot;              /* stable key + value bytes per SST block */
    uint32_t nblk;
    _Atomic bool reported; /* a read error was logged */
} ralt_run;

struct ralt {
    lsm_vol vol;
    pthread_mutex_t bmu;
    ralt_ent *buf;
    size_t nbuf, buf_alloc, buf_cap; /* buf_cap entries trigger a flush */
    pthread_mutex_t fmu;
    pthread_rwlock_t mu;
    ralt_run *runs[RALT_MAX_RUNS + 1]; /* oldest first */
    size_t nruns;
    uint64_t id; /* unique per table (ralt_ids), for the per-thread block */
    uint64_t tick_bytes, period_ticks, phys_cap, next_number;
    _Atomic uint64_t accessed, hot_limit, phys_limit, evicted, errors;
    _Atomic uint64_t merges, full_merges, merge_bytes; /* merges of runs (not flushes) */
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

static uint64_t ent_hot(const ralt_ent *e)
{
    return e->stable ? (uint64_t)e->klen + e->vlen : 0;
}

/* ---- the access record codec ---- */

static void val_encode(uint8_t *p, const ralt_ent *e)
{
    lsm_set32(p, e->vlen);
    memcpy(p + 4, &e->score, 8);
    lsm_set64(p + 12, e->tick);
    lsm_set64(p + 20, e->first);
    p[28] = e->counter;
    p[29] = e->stable ? 1 : 0;
}

/* Decodes a run's record; DATA_LOSS when it is not an access record. */
static kv_err val_decode(const lsm_rec *rec, ralt_ent *e)
{
    if (rec->type != LSM_PUT || rec->vlen != RALT_VAL_LEN || rec->klen > UINT32_MAX)
        return KV_DATA_LOSS;
    const uint8_t *p = rec->value;
    *e = (ralt_ent){.key = (uint8_t *)rec->key, .klen = (uint32_t)rec->klen};
    e->vlen = lsm_get32(p);
    memcpy(&e->score, p + 4, 8);
    e->tick = lsm_get64(p + 12);
    e->first = lsm_get64(p + 20);
    e->counter = p[28];
    e->stable = p[29] == 1;
    if (!isfinite(e->score) || e->score < 0 || e->counter > RALT_COUNTER0 || p[29] > 1 ||
        e->first > e->tick)
        return KV_DATA_LOSS;
    return KV_OK;
}

/* ---- bloom filters ---- */

static kv_err bloom_init(ralt_bloom *b, uint64_t keys)
{
    b->nbits = keys * RALT_BITS_PER_KEY < 64 ? 64 : keys * RALT_BITS_PER_KEY;
    b->bits = calloc(b->nbits / 8 + 1, 1);
    return b->bits ? KV_OK : KV_RESOURCE_EXHAUSTED;
}

static void bloom_add(ralt_bloom *b, uint64_t h)
{
    uint64_t h1 = (uint32_t)h, h2 = (h >> 32) | 1;
    for (unsigned k = 0; k < RALT_BLOOM_K; k++) {
        uint64_t bit = (h1 + k * h2) % b->nbits;
        b->bits[bit / 8] |= (uint8_t)(1u << (bit % 8));
    }
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

/* ---- the merge rule ---- */

/* e's counter as of tick t (periods of period ticks elapsed since its last
 * access). */
static unsigned counter_at(const ralt_ent *e, uint64_t t, uint64_t period)
{
    uint64_t periods = t > e->tick ? (t - e->tick) / period : 0;
    return periods >= e->counter ? 0 : e->counter - (unsigned)periods;
}

/* The merge rule: folds the newer entry b into the older a (same key; keys
 * untouched). Score: both decayed to the later tick and summed; tick: the
 * later one; stable: either was, or b's first access came while a's counter
 * was still positive; counter: the larger of the two as of the later tick.
 * Comparing against b's first access (not its last) makes the rule
 * associative: folding a key's accesses gives the same entry however they
 * were grouped into buffers and runs (the model test checks it). */
static void ent_fold(ralt_ent *a, const ralt_ent *b, uint64_t period)
{
    uint64_t t = b->tick > a->tick ? b->tick : a->tick;
    unsigned cnt = counter_at(a, t, period), bcnt = counter_at(b, t, period);
    a->stable = a->stable || b->stable || counter_at(a, b->first, period) > 0;
    a->score = a->score * decay(t - a->tick) + b->score * decay(t - b->tick);
    a->counter = (uint8_t)(cnt > bcnt ? cnt : bcnt);
    a->first = b->first < a->first ? b->first : a->first;
    a->tick = t;
    a->vlen = b->vlen;
}

static int ent_cmp(const void *x, const void *y)
{
    const ralt_ent *a = x, *b = y;
    int c = lsm_key_cmp(a->key, a->klen, b->key, b->klen);
    if (c)
        return c;
    return a->tick < b->tick ? -1 : a->tick > b->tick;
}

/* ---- runs ---- */

/* Logs a run's read error once and counts it. */
static kv_err run_error(ralt *r, ralt_run *run, kv_err rv)
{
    atomic_fetch_add(&r->errors, 1);
    if (!atomic_exchange(&run->reported, true))
        KV_ERROR(LSM_LOG,
                 "RALT run %s/%06" PRIu64 ".sst unreadable (%s): its keys count as not hot",
                 r->vol.dir, run->f->number, kv_err_name(rv));
    return rv;
}

static void run_free(ralt_run *run, bool delete_file)
{
    if (!run)
        return;
    if (run->f) {
        if (delete_file)
            atomic_store(&run->f->obsolete, true);
        lsm_file_unref(run->f);
    }
    free(run->all.bits);
    free(run->stable.bits);
    free(run->blk_hot);
    free(run);
}

/* Reads a just-written run back once: blooms, per-block hot bytes, totals.
 * Takes f (on failure it is deleted). */
static kv_err run_open(ralt *r, lsm_file *f, uint64_t nstable, ralt_run **out)
{
    ralt_run *run = calloc(1, sizeof(*run));
    if (!run) {
        atomic_store(&f->obsolete, true);
        lsm_file_unref(f);
        return KV_RESOURCE_EXHAUSTED;
    }
    run->f = f;
    run->nblk = lsm_sst_nblocks(f->sst);
    run->blk_hot = calloc(run->nblk ? run->nblk : 1, sizeof(*run->blk_hot));
    kv_err rv = run->blk_hot ? bloom_init(&run->all, f->nentries) : KV_RESOURCE_EXHAUSTED;
    if (rv == KV_OK)
        rv = bloom_init(&run->stable, nstable);
    lsm_sst_iter it;
    lsm_sst_iter_init(&it, f->sst);
    for (; rv == KV_OK && it.valid; lsm_sst_iter_next(&it)) {
        ralt_ent e;
        if ((rv = val_decode(&it.cur, &e)) != KV_OK)
            break;
        uint64_t h = kv_hash64(e.key, e.klen, RALT_SEED);
        bloom_add(&run->all, h);
        if (e.stable) {
            if (run->nstable++ == nstable) { /* more than written: not our file */
                rv = KV_DATA_LOSS;
                break;
            }
            bloom_add(&run->stable, h);
            run->blk_hot[it.blk] += ent_hot(&e);
        }
        run->n++;
        run->hot += ent_hot(&e);
        run->phys += ent_phys(&e);
    }
    if (rv == KV_OK && it.err)
        rv = it.err;
    lsm_sst_iter_fini(&it);
    if (rv != KV_OK) {
        run_error(r, run, rv);
        run_free(run, true);
        return rv;
    }
    *out = run;
    return KV_OK;
}

/* The last verified block a thread read, per thread: compactions ask for
 * keys in order, so consecutive lookups mostly hit the same RALT block. Run
 * files are immutable and their numbers are never reused by a table; id
 * tells tables apart. */
static _Atomic uint64_t ralt_ids;
static _Thread_local struct {
    uint64_t id, number;
    int blk;
    size_t len;
    uint8_t buf[2 * RALT_BLOCK];
} tl_blk;

/* Point lookup of key in run (one block read); *e's key is not set. */
static kv_err run_get(ralt *r, ralt_run *run, const void *key, size_t klen, ralt_ent *e)
{
    lsm_sst *s = run->f->sst;
    int b = lsm_sst_find_block(s, key, klen);
    if (b < 0)
        return KV_NOT_FOUND;
    lsm_rec rec;
    kv_err rv;
    if (tl_blk.id == r->id && tl_blk.number == run->f->number && tl_blk.blk == b) {
        rv = lsm_block_search(s, tl_blk.buf, tl_blk.len, key, klen, &rec);
    } else {
        lsm_io io;
        if ((rv = lsm_sst_read_block(s, b, &io)) != KV_OK) /* no memory, or a bad block */
            return rv == KV_RESOURCE_EXHAUSTED ? rv : run_error(r, run, rv);
        rv = lsm_block_search(s, io.buf, io.len, key, klen, &rec);
        if ((rv == KV_OK || rv == KV_NOT_FOUND) && io.len <= sizeof(tl_blk.buf)) {
            memcpy(tl_blk.buf, io.buf, io.len); /* verified: keep it */
            tl_blk.len = io.len;
            tl_blk.id = r->id;
            tl_blk.number = run->f->number;
            tl_blk.blk = b;
            if (rv == KV_OK) /* rec points into io.buf: look it up in the copy */
                rv = lsm_block_search(s, tl_blk.buf, tl_blk.len, key, klen, &rec);
        }
        if (rv == KV_OK)
            rv = val_decode(&rec, e);
        free(io.buf);
        if (rv != KV_OK && rv != KV_NOT_FOUND)
            return run_error(r, run, rv);
        e->key = NULL;
        return rv;
    }
    if (rv == KV_OK)
        rv = val_decode(&rec, e);
    if (rv != KV_OK && rv != KV_NOT_FOUND)
        return run_error(r, run, rv);
    e->key = NULL;
    return rv;
}

/* ---- merging: sources, eviction, writing a run ---- */

/* The folded buffer as a merge source (iter.h): its entries (owned by the
 * caller, sorted, one per key) encoded as a run's records are. */
typedef struct buf_src {
    lsm_src base;
    const ralt_ent *e;
    size_t n, i;
    uint8_t val[RALT_VAL_LEN];
    lsm_rec rec;
} buf_src;

static void buf_load(buf_src *b)
{
    if (b->i >= b->n)
        return;
    val_encode(b->val, &b->e[b->i]);
    b->rec = (lsm_rec){.key = b->e[b->i].key,
                       .klen = b->e[b->i].klen,
                       .value = b->val,
                       .vlen = RALT_VAL_LEN,
                       .type = LSM_PUT};
}

static void buf_first(lsm_src *s)
{
    ((buf_src *)s)->i = 0;
    buf_load((buf_src *)s);
}

static void buf_seek(lsm_src *s, const void *key, size_t klen)
{
    buf_src *b = (buf_src *)s;
    size_t lo = 0, hi = b->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (lsm_key_cmp(b->e[mid].key, b->e[mid].klen, key, klen) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    b->i = lo;
    buf_load(b);
}

static void buf_next(lsm_src *s)
{
    ((buf_src *)s)->i++;
    buf_load((buf_src *)s);
}

static const lsm_rec *buf_cur(const lsm_src *s)
{
    return &((const buf_src *)s)->rec;
}

static bool buf_valid(const lsm_src *s)
{
    return ((const buf_src *)s)->i < ((const buf_src *)s)->n;
}

static kv_err buf_error(const lsm_src *s, const char **file)
{
    (void)s;
    if (file)
        *file = NULL;
    return KV_OK;
}

static uint64_t buf_bytes(const lsm_src *s)
{
    (void)s;
    return 0;
}

static void buf_fini(lsm_src *s)
{
    (void)s;
}

static const lsm_src_ops buf_ops = {buf_first, buf_seek,  buf_next,  buf_cur,
                                    buf_valid, buf_error, buf_bytes, buf_fini};

/* Runs (oldest first) and the buffer (newest, when present) merged: ranks
 * are the sources' age, so equal keys come oldest first. */
typedef struct merger {
    ralt *r;
    lsm_sst_src *runs;
    ralt_run **run_of; /* per source: its run, NULL for the buffer */
    buf_src buf;
    lsm_src **ps;
    lsm_merge mg;
    lsm_buf key; /* out.key points here */
    ralt_ent out;
    kv_err err;
    ralt_run *bad; /* the run whose read failed */
} merger;

static bool merger_fail(merger *m, size_t i, kv_err rv)
{
    m->err = rv;
    m->bad = m->run_of[i];
    return false;
}

/* Decodes the merger's current record into *e (its source's index *i). */
static kv_err merger_cur(merger *m, ralt_ent *e, size_t *i)
{
    *i = lsm_merge_top(&m->mg);
    return val_decode(lsm_merge_cur(&m->mg), e);
}

/* Produces the next folded entry in key order into m->out; false at the
 * end or on an error (m->err). Equal keys fold oldest into newest. */
static bool merger_next(merger *m)
{
    size_t i;
    ralt_ent e;
    if (!lsm_merge_valid(&m->mg))
        return lsm_merge_error(&m->mg, &i, NULL) != KV_OK ? merger_fail(m, i, m->mg.err) : false;
    kv_err rv = merger_cur(m, &e, &i);
    if (rv != KV_OK)
        return merger_fail(m, i, rv);
    m->key.len = 0;
    if ((rv = lsm_buf_put(&m->key, e.key, e.klen)) != KV_OK)
        return merger_fail(m, i, rv);
    m->out = e;
    m->out.key = m->key.p;
    for (lsm_merge_next(&m->mg); lsm_merge_valid(&m->mg); lsm_merge_next(&m->mg)) {
        if ((rv = merger_cur(m, &e, &i)) != KV_OK)
            return merger_fail(m, i, rv);
        if (lsm_key_cmp(e.key, e.klen, m->out.key, m->out.klen) != 0)
            break;
        ent_fold(&m->out, &e, m->r->period_ticks); /* a newer source, same key */
    }
    if (lsm_merge_error(&m->mg, &i, NULL) != KV_OK)
        return merger_fail(m, i, m->mg.err);
    return true;
}

static kv_err merger_rewind(merger *m)
{
    size_t i;
    lsm_merge_first(&m->mg);
    kv_err rv = lsm_merge_error(&m->mg, &i, NULL);
    if (rv != KV_OK)
        merger_fail(m, i, rv);
    return rv;
}

/* Sets up the merge of runs [from, nruns) and the buffer (may be NULL). */
static kv_err merger_init(merger *m, ralt *r, size_t from, const ralt_ent *buf, size_t nbuf)
{
    size_t nr = r->nruns - from, n = nr + (buf ? 1 : 0);
    *m = (merger){.r = r};
    m->runs = calloc(nr ? nr : 1, sizeof(*m->runs));
    m->run_of = calloc(n ? n : 1, sizeof(*m->run_of));
    m->ps = calloc(n ? n : 1, sizeof(*m->ps));
    if (!m->runs || !m->run_of || !m->ps)
        return KV_RESOURCE_EXHAUSTED;
    for (size_t i = 0; i < nr; i++) {
        m->run_of[i] = r->runs[from + i];
        lsm_sst_src_init(&m->runs[i], m->run_of[i]->f->sst, (int)i);
        m->ps[i] = &m->runs[i].base;
    }
    if (buf) {
        m->buf = (buf_src){.base = {&buf_ops, (int)nr}, .e = buf, .n = nbuf};
        m->ps[nr] = &m->buf.base;
    }
    return lsm_merge_init(&m->mg, m->ps, n);
}

static void merger_fini(merger *m)
{
    if (m->mg.heap)
        lsm_merge_fini(&m->mg);
    free(m->runs);
    free(m->run_of);
    free(m->ps);
    lsm_buf_free(&m->key);
}

typedef struct scored {
    double s;
    size_t i;
} scored;

static int scored_cmp(const void *x, const void *y)
{
    const scored *a = x, *b = y;
    if (a->s != b->s)
        return a->s < b->s ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

/* Physical limit from the hot-set limit and the stable share. */
static void adapt_phys(ralt *r, uint64_t n, uint64_t nst, uint64_t hot, uint64_t phys)
{
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

/* Pass 1 of a full merge: adapts the physical limit and marks in *drop
 * (one byte per output entry, malloc'ed; NULL = keep all) the lowest-scored
 * entries to evict until hot and table bytes are under 90% of their limits. */
static kv_err plan_eviction(merger *m, uint8_t **drop)
{
    ralt *r = m->r;
    scored *s = NULL;
    uint64_t *hot = NULL, *phys = NULL;
    size_t n = 0, cap = 0;
    uint64_t th = 0, tp = 0, nst = 0, t = now_tick(r);
    *drop = NULL;
    while (merger_next(m)) {
        if (n == cap) {
            cap = cap ? cap * 2 : 1024;
            scored *s2 = realloc(s, cap * sizeof(*s));
            uint64_t *h2 = s2 ? realloc(hot, cap * sizeof(*h2)) : NULL;
            uint64_t *p2 = h2 ? realloc(phys, cap * sizeof(*p2)) : NULL;
            s = s2 ? s2 : s;
            hot = h2 ? h2 : hot;
            phys = p2 ? p2 : phys;
            if (!p2) {
                m->err = KV_RESOURCE_EXHAUSTED;
                break;
            }
        }
        const ralt_ent *e = &m->out;
        s[n] = (scored){e->score * decay(t > e->tick ? t - e->tick : 0), n};
        hot[n] = ent_hot(e);
        phys[n] = ent_phys(e);
        th += hot[n], tp += phys[n], nst += e->stable;
        n++;
    }
    kv_err rv = m->err;
    if (rv == KV_OK) {
        adapt_phys(r, n, nst, th, tp);
        uint64_t hl = atomic_load(&r->hot_limit), pl = atomic_load(&r->phys_limit);
        if ((th > hl || tp > pl) && n) {
            *drop = calloc(n, 1);
            if (!*drop) {
                rv = KV_RESOURCE_EXHAUSTED;
            } else {
                qsort(s, n, sizeof(*s), scored_cmp);
                size_t k = 0;
                for (; k < n && (th > hl / 10 * 9 || tp > pl / 10 * 9); k++) {
                    (*drop)[s[k].i] = 1;
                    th -= hot[s[k].i];
                    tp -= phys[s[k].i];
                }
                atomic_fetch_add(&r->evicted, k);
            }
        }
    }
    free(s);
    free(hot);
    free(phys);
    return rv;
}

/* Writes the merged sources (minus drop) as a new run; *out NULL when
 * nothing is left. */
static kv_err write_run(merger *m, const uint8_t *drop, ralt_run **out)
{
    ralt *r = m->r;
    *out = NULL;
    lsm_sst_builder *b = NULL;
    uint64_t nstable = 0;
    kv_err rv = KV_OK;
    for (size_t i = 0; merger_next(m); i++) {
        if (drop && drop[i])
            continue;
        if (!b) {
            if ((rv = lsm_sst_builder_open(&b, &r->vol, r->next_number++, RALT_BLOCK)) != KV_OK)
                break;
            lsm_sst_builder_nosync(b); /* runs are never recovered (see the top) */
        }
        uint8_t val[RALT_VAL_LEN];
        val_encode(val, &m->out);
        lsm_rec rec = {.key = m->out.key,
                       .klen = m->out.klen,
                       .value = val,
                       .vlen = RALT_VAL_LEN,
                       .type = LSM_PUT};
        if ((rv = lsm_sst_builder_add(b, &rec)) != KV_OK)
            break;
        nstable += m->out.stable;
    }
    if (rv == KV_OK)
        rv = m->err;
    if (rv != KV_OK) {
        if (b)
            lsm_sst_builder_abort(b);
        return rv;
    }
    if (!b)
        return KV_OK;
    lsm_file *f;
    if ((rv = lsm_sst_builder_finish(b, 0, &f)) != KV_OK)
        return rv;
    return run_open(r, f, nstable, out);
}

/* Merges the runs [from, nruns) and the folded buffer (may be NULL) into one
 * run that replaces them (fmu held). A full merge (from == 0) evicts. On a
 * read error the whole table is dropped (logged). */
static kv_err merge_runs(ralt *r, size_t from, const ralt_ent *buf, size_t nbuf)
{
    KV_ASSERT_LOCKED(&r->fmu);
    merger m;
    uint8_t *drop = NULL;
    ralt_run *run = NULL;
    kv_err rv = merger_init(&m, r, from, buf, nbuf);
    if (rv == KV_OK)
        rv = merger_rewind(&m);
    if (rv == KV_OK && from == 0) {
        rv = plan_eviction(&m, &drop);
        if (rv == KV_OK)
            rv = merger_rewind(&m);
    }
    if (rv == KV_OK)
        rv = write_run(&m, drop, &run);
    ralt_run *bad = m.bad;
    merger_fini(&m);
    free(drop);
    if (rv != KV_OK && !bad)
        return rv;                        /* e.g. FD full: the runs stay as they were */
    if (rv == KV_OK && from < r->nruns) { /* runs merged, not a buffer written alone */
        atomic_fetch_add(&r->merges, 1);
        atomic_fetch_add(&r->full_merges, from == 0);
        atomic_fetch_add(&r->merge_bytes, run ? run->f->size : 0);
    }
    size_t keep = rv == KV_OK ? from : 0;
    if (rv != KV_OK) {
        KV_ERROR(LSM_LOG,
                 "RALT run %s/%06" PRIu64 ".sst is corrupt (%s): the access table is dropped "
                 "and re-learned",
                 r->vol.dir, bad->f->number, kv_err_name(rv));
        atomic_fetch_add(&r->errors, 1);
    }
    ralt_run *old[RALT_MAX_RUNS + 1];
    size_t nold = r->nruns - keep;
    pthread_rwlock_wrlock(&r->mu);
    memcpy(old, r->runs + keep, nold * sizeof(*old));
    r->nruns = keep;
    if (run)
        r->runs[r->nruns++] = run;
    pthread_rwlock_unlock(&r->mu);
    for (size_t i = 0; i < nold; i++) /* no reader holds them: mu was taken exclusively */
        run_free(old[i], true);
    return rv;
}

static bool over_limits(ralt *r)
{
    uint64_t hot = 0, phys = 0;
    for (size_t i = 0; i < r->nruns; i++)
        hot += r->runs[i]->hot, phys += r->runs[i]->phys;
    return hot > atomic_load(&r->hot_limit) || phys > atomic_load(&r->phys_limit);
}

/* The first of the newest runs to merge when there are too many (fmu
 * held): at least the two newest; an older run joins while its entries are
 * at most RALT_TIER_RATIO times those of the run after it, so runs of like
 * sizes merge and a large one waits until the runs after it have grown
 * close to it. 0 is a full merge. */
static size_t tier_from(const ralt *r)
{
    size_t from = r->nruns - 2;
    while (from > 0 && r->runs[from - 1]->n <= RALT_TIER_RATIO * r->runs[from]->n)
        from--;
    return from;
}

/* Sorts and folds a taken buffer and writes it as a new run, then merges
 * when there are too many runs or the limits are passed (fmu held; takes
 * e and its keys). */
static kv_err add_buffer(ralt *r, ralt_ent *e, size_t n)
{
    qsort(e, n, sizeof(*e), ent_cmp);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m && lsm_key_cmp(e[m - 1].key, e[m - 1].klen, e[i].key, e[i].klen) == 0) {
            ent_fold(&e[m - 1], &e[i], r->period_ticks);
            free(e[i].key);
        } else {
            e[m++] = e[i];
        }
    }
    /* a new run of the buffer alone; but when a full merge failed (FD full)
     * and left the run array full, the buffer is merged with every run:
     * another run would be written past the array */
    kv_err rv = merge_runs(r, r->nruns <= RALT_MAX_RUNS ? r->nruns : 0, e, m);
    for (size_t i = 0; i < m; i++)
        free(e[i].key);
    free(e);
    if (rv == KV_OK && over_limits(r))
        rv = merge_runs(r, 0, NULL, 0);
    else if (rv == KV_OK && r->nruns > RALT_MAX_RUNS)
        rv = merge_runs(r, tier_from(r), NULL, 0);
    return rv;
}

/* Takes the buffer and turns it into a run (fmu held). */
static kv_err flush_locked(ralt *r)
{
    KV_ASSERT_LOCKED(&r->fmu);
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

/* Deletes run files left by a previous process (see the top comment). */
static void sweep_stale(ralt *r)
{
    DIR *d = opendir(r->vol.dir);
    struct dirent *de;
    unsigned n = 0;
    while (d && (de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l > 4 && strcmp(de->d_name + l - 4, ".sst") == 0 &&
            lsm_vol_unlink(&r->vol, de->d_name) == 0)
            n++;
    }
    if (d)
        closedir(d);
    if (n)
        KV_INFO(LSM_LOG,
                "RALT: deleted %u run files of a previous run in %s (hotness is re-learned)", n,
                r->vol.dir);
}

kv_err ralt_open(ralt **out, const ralt_opts *o)
{
    if (!o->dir)
        return KV_INVALID_ARGUMENT;
    ralt *r = calloc(1, sizeof(*r));
    if (!r)
        return KV_RESOURCE_EXHAUSTED;
    kv_err rv = lsm_vol_init(&r->vol, o->dir, LSM_TIER_FD, !o->disable_io_uring);
    if (rv != KV_OK) {
        free(r);
        return rv;
    }
    sweep_stale(r);
    pthread_mutex_init(&r->bmu, NULL);
    pthread_mutex_init(&r->fmu, NULL);
    pthread_rwlock_init(&r->mu, NULL);
    r->next_number = 1;
    r->id = atomic_fetch_add(&ralt_ids, 1) + 1;
    r->buf_cap = o->buf_entries ? o->buf_entries : 1024;
    uint64_t hl = o->hot_limit ? o->hot_limit : (64u << 20);
    r->tick_bytes = o->tick_bytes ? o->tick_bytes : (hl / 16 < 4096 ? 4096 : hl / 16);
    r->period_ticks = o->period_bytes ? o->period_bytes / r->tick_bytes : RALT_PERIOD_TICKS;
    r->period_ticks = r->period_ticks ? r->period_ticks : 1;
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
        run_free(r->runs[i], true);
    pthread_mutex_destroy(&r->bmu);
    pthread_mutex_destroy(&r->fmu);
    pthread_rwlock_destroy(&r->mu);
    lsm_vol_fini(&r->vol);
    free(r);
}

/* A new access record for key (k, malloc'ed), counted in r's ticks. */
static ralt_ent access_ent(ralt *r, uint8_t *k, size_t klen, size_t vlen)
{
    uint64_t t = atomic_fetch_add(&r->accessed, klen + vlen) / r->tick_bytes;
    return (ralt_ent){.key = k,
                      .klen = (uint32_t)klen,
                      .vlen = (uint32_t)vlen,
                      .score = 1.0,
                      .tick = t,
                      .first = t,
                      .counter = RALT_COUNTER0};
}

bool ralt_access_nb(ralt *r, const void *key, size_t klen, size_t vlen)
{
    uint8_t *k = klen ? malloc(klen) : NULL;
    if (!k)
        return true; /* dropped, as ralt_access drops it */
    memcpy(k, key, klen);
    pthread_mutex_lock(&r->bmu);
    if (!r->buf) { /* a flush took it: a new one, as ralt_access makes */
        r->buf = malloc(r->buf_cap * sizeof(*r->buf));
        r->buf_alloc = r->buf ? r->buf_cap : 0;
    }
    /* room without growing, and not full after: ralt_access would flush */
    bool room = r->buf && r->nbuf + 1 < r->buf_cap && r->nbuf < r->buf_alloc;
    if (room)
        r->buf[r->nbuf++] = access_ent(r, k, klen, vlen);
    pthread_mutex_unlock(&r->bmu);
    if (!room)
        free(k);
    return room;
}

void ralt_access(ralt *r, const void *key, size_t klen, size_t vlen)
{
    uint8_t *k = klen ? malloc(klen) : NULL;
    if (!k)
        return;
    memcpy(k, key, klen);
    ralt_ent e = access_ent(r, k, klen, vlen);
    pthread_mutex_lock(&r->bmu);
    if (!r->buf || r->nbuf == r->buf_alloc) { /* full while a flush runs: grow, up to 4x */
        size_t cap = r->buf ? r->buf_alloc * 2 : r->buf_cap;
        ralt_ent *b = cap <= 4 * r->buf_cap ? realloc(r->buf, cap * sizeof(*b)) : NULL;
        if (!b) {
            pthread_mutex_unlock(&r->bmu);
            free(k); /* dropped: the table is behind */
            /* NHC fix: the buffer is full, so flush it now if no flush runs;
             * returning without trying left it full forever once a slow flush
             * had let it grow to 4x, and every later access was dropped */
            if (pthread_mutex_trylock(&r->fmu) == 0) {
                flush_locked(r);
                pthread_mutex_unlock(&r->fmu);
            }
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
        rv = merge_runs(r, 0, NULL, 0);
    pthread_mutex_unlock(&r->fmu);
    return rv;
}

/* ralt_is_hot, or with fold false ralt_stable_in_run (runs read-locked by
 * the caller). */
static bool is_hot(ralt *r, const void *key, size_t klen, bool fold)
{
    uint64_t h = kv_hash64(key, klen, RALT_SEED);
    ralt_ent acc = {0}, x;
    bool have = false, hot = false;
    size_t maybe = 0;
    for (size_t i = r->nruns; i-- > 0 && !hot;) {
        ralt_run *run = r->runs[i];
        maybe += bloom_may(&run->all, h);
        if (bloom_may(&run->stable, h) && run_get(r, run, key, klen, &x) == KV_OK)
            hot = x.stable;
    }
    for (size_t i = 0; fold && i < r->nruns && !hot && maybe > 1; i++) { /* in several runs */
        ralt_run *run = r->runs[i];
        if (!bloom_may(&run->all, h) || run_get(r, run, key, klen, &x) != KV_OK)
            continue;
        if (have)
            ent_fold(&acc, &x, r->period_ticks);
        else
            acc = x;
        have = true;
        hot = acc.stable;
    }
    return hot;
}

bool ralt_is_hot(ralt *r, const void *key, size_t klen)
{
    pthread_rwlock_rdlock(&r->mu);
    bool hot = is_hot(r, key, klen, true);
    pthread_rwlock_unlock(&r->mu);
    return hot;
}

bool ralt_stable_in_run(ralt *r, const void *key, size_t klen)
{
    pthread_rwlock_rdlock(&r->mu);
    bool hot = is_hot(r, key, klen, false);
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
    if (r->nruns) { /* one run after the flush */
        ralt_run *run = r->runs[0];
        lsm_sst_iter it;
        lsm_sst_iter_seek(&it, run->f->sst, lo, lolen);
        for (; it.valid; lsm_sst_iter_next(&it)) {
            ralt_ent e;
            if (lsm_key_cmp(it.cur.key, it.cur.klen, hi, hilen) > 0)
                break;
            if ((rv = val_decode(&it.cur, &e)) != KV_OK)
                break;
            if (e.stable)
                fn(arg, e.key, e.klen, e.vlen);
        }
        if (rv == KV_OK)
            rv = it.err;
        lsm_sst_iter_fini(&it);
        if (rv != KV_OK)
            run_error(r, run, rv);
    }
    pthread_rwlock_unlock(&r->mu);
    return rv;
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

uint64_t ralt_hot_bytes_est(ralt *r, const void *lo, size_t lolen, const void *hi, size_t hilen)
{
    uint64_t sum = 0;
    if (lsm_key_cmp(lo, lolen, hi, hilen) > 0)
        return 0;
    pthread_rwlock_rdlock(&r->mu);
    for (size_t i = 0; i < r->nruns; i++) {
        ralt_run *run = r->runs[i];
        lsm_sst *s = run->f->sst;
        int b0 = lsm_sst_find_block(s, lo, lolen), b1 = lsm_sst_find_block(s, hi, hilen);
        if (b0 < 0)
            continue;
        uint32_t end = b1 < 0 ? run->nblk : (uint32_t)b1; /* blocks before end: keys <= hi */
        sum += run->blk_hot[b0] / 2;                      /* partly in range, if at all */
        for (uint32_t b = (uint32_t)b0 + 1; b < end; b++)
            sum += run->blk_hot[b];
        if (b1 > b0)
            sum += run->blk_hot[b1] / 2;
    }
    pthread_rwlock_unlock(&r->mu);
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
        out->entries += r->runs[i]->n;
        out->hot_bytes += r->runs[i]->hot;
        out->phys_bytes += r->runs[i]->phys;
        out->stable += r->runs[i]->nstable;
        out->file_bytes += r->runs[i]->f->size;
        const ralt_run *run = r->runs[i];
        out->mem_bytes += sizeof(*run) + lsm_sst_mem(run->f->sst) + run->all.nbits / 8 +
                          run->stable.nbits / 8 + (uint64_t)run->nblk * sizeof(*run->blk_hot);
    }
    out->runs = r->nruns;
    pthread_rwlock_unlock(&r->mu);
    pthread_mutex_lock(&r->bmu);
    out->mem_bytes += r->buf_alloc * sizeof(*r->buf);
    for (size_t i = 0; i < r->nbuf; i++)
        out->mem_bytes += r->buf[i].klen;
    pthread_mutex_unlock(&r->bmu);
    out->hot_limit = atomic_load(&r->hot_limit);
    out->phys_limit = atomic_load(&r->phys_limit);
    out->tick = now_tick(r);
    out->evicted = atomic_load(&r->evicted);
    out->merges = atomic_load(&r->merges);
    out->full_merges = atomic_load(&r->full_merges);
    out->merge_bytes = atomic_load(&r->merge_bytes);
    out->errors = atomic_load(&r->errors);
}

uint64_t ralt_stable_count(ralt *r)
{
    uint64_t n = 0;
    pthread_rwlock_rdlock(&r->mu);
    for (size_t i = 0; i < r->nruns; i++)
        n += r->runs[i]->nstable;
    pthread_rwlock_unlock(&r->mu);
    return n;
}

double ralt_score(ralt *r, const void *key, size_t klen)
{
    double s = 0;
    uint64_t t = now_tick(r);
    pthread_rwlock_rdlock(&r->mu);
    for (size_t i = 0; i < r->nruns; i++) {
        ralt_ent x;
        if (run_get(r, r->runs[i], key, klen, &x) == KV_OK)
            s += x.score * decay(t > x.tick ? t - x.tick : 0);
    }
    pthread_rwlock_unlock(&r->mu);
    return s;
}
