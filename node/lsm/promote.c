/* SPDX-License-Identifier: MIT */
/*
 * HotRAP promotion by flush (ATC'25 §3.4): records that point lookups read
 * from SD enter a mutable buffer; when it holds promo_buf bytes it is sealed
 * and a checker thread filters it: it keeps the records RALT calls hot and
 * drops every record that may have a newer version above it, then writes the
 * rest as an L0 SST on FD (records keep their seqno and get LSM_F_PROMOTED;
 * L0 lookups take the highest seqno). Fewer than half an SST of survivors go
 * back to the mutable buffer instead, up to MAX_RETURNS checks in a row.
 *
 * Never shadowing a newer write. A lookup notes fread, the flushed seqno
 * published before it pinned its version: every write with seqno <= fread
 * is in that version, so the record it read from SD is newer than all of
 * them. A later write (seqno > fread) can be shadowed by the promoted copy
 * only once it sits below L0 (in L0 the highest seqno wins), i.e. once it
 * has been flushed. lsm_flush stores the seqno of every record it flushes
 * in a flush-mark slot chosen by the key's hash before it installs the
 * file; a candidate is dropped when its key's slot holds a seqno above its
 * fread (a hash collision only costs a promotion). The check runs when the
 * buffer is filtered and again under db->mu right before the install: a
 * flush installed before it (db->mu) has stored its marks, and a write
 * flushed after it lands in L0 above the promoted copy. Writes not flushed
 * yet do not block a promotion (they will land in L0 with a higher seqno);
 * the engine's memory-tier callback (lsm_opts.newer) still drops records
 * it holds a newer version of, which would only be stale copies, and keys
 * already on FD are skipped (an exact FD lookup: bloom filter, then the
 * block). (Marks of
 * unflushed writes made ~12% of keys unpromotable in a read-only phase:
 * the memtable's last writes never flush and their slots stay above every
 * fread.) Appended writes keep their own marks for the NHC twin map.
 *
 * The gate. RALT calls a key hot once it is read twice within about five
 * FD sizes of reads; under uniform reads over a data set ten times FD that
 * happens by chance to some 9% of the keys, and promoting them buys nothing
 * (their next read is as likely as any other key's) while every promoted
 * byte pushes an original out of full FD levels into SD, a merge with SD's
 * files. So a sample of the lookups' reads (one in GATE_SAMPLE, taken
 * before RALT hears of the read) measures the lift: the share of reads that
 * find their key already hot, over the hot keys' share of the records (both
 * count the keys stable within one RALT run, ralt_stable_in_run and
 * ralt_stable_count, so that they measure the same set; the windows are
 * pooled with a decay, so a young table's few hot keys weigh little). A
 * lift near 1 means "hot" predicts nothing: the keys are read as if at
 * random. Skewed loads give far more (the tests: 40-50 with 90% of the
 * reads on 1% of the keys, 14 under hotspot 5% at 2M keys). While the lift
 * is under GATE_HI, a hot key is promoted only if its RALT score (a decayed read
 * count whose half-life is the hot-set limit's bytes of reads) reaches a
 * bar that rises to GATE_SCORE as the lift falls to GATE_LO: a key read
 * that often within a half-life is no chance under uniform reads, and a few
 * truly hot keys inside a uniform load still qualify. The lift is measured
 * from RALT's state, never from what was promoted, so a closed gate does
 * not hide a hot set that appears (a moving hotspot: the new keys turn hot
 * and are read, and the lift rises with them), and the lift's long memory
 * (GATE_DECAY) keeps the gate open while they do.
 *
 * Threads: any reader adds (mu); one checker thread; marks are atomics; the
 * gate's counters are atomics and one reader at a time (gmu, try-locked)
 * folds a window of samples into the lift.
 */
#include <sys/prctl.h>
#include <inttypes.h>
#include <stdlib.h>

#include "common/clock.h"
#include "common/hash.h"
#include "common/assert.h"
#include "common/atomic.h"
#include "common/log.h"
#include "node/lsm/lsm_int.h"

#define MARK_BITS 16
#define MARK_SEED 0x4d41524bu
#define MAX_SEALED 4 /* sealed buffers waiting; more are dropped */
/* Survivors under half an SST go back to the mutable buffer at most this
 * many checks in a row; the next check promotes them however few they are.
 * Without the bound, the last few hot keys left on SD (fewer than half an
 * SST of them, once the rest was promoted) waited forever. */
#define MAX_RETURNS 4

#define GATE_SAMPLE 8   /* one read in 8 is sampled */
#define GATE_WINDOW 512 /* samples per lift estimate */
#define GATE_LO 1.25    /* at or under it, the full score bar */
#define GATE_HI 1.75    /* at or over it, no bar */
#define GATE_SCORE 2.0  /* the full bar: RALT score, about reads per half-life */
/* Per window: the lift follows some 33 windows (135k reads). Under uniform
 * reads some 1000 samples are then expected hot, so the lift's noise is a
 * few per cent, well under GATE_LO; and a short dip (right after a hot set
 * moves, the reads find no hot key until the new ones turn hot) does not
 * close the gate. */
#define GATE_DECAY 0.97
#define GATE_MIN_SAMPLES 40.0 /* hot samples, seen + expected, before the lift is used */

typedef struct pent {
    lsm_rec r; /* deep copy */
    uint64_t fread;
} pent;

typedef struct pbuf {
    pent *e;
    size_t n, cap;
    uint64_t bytes;
    bool force;
} pbuf;

struct lsm_promo {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pbuf mut;
    pbuf sealed[MAX_SEALED];
    size_t nsealed;
    bool busy, stop, started;
    unsigned returns; /* checks in a row that returned survivors (checker thread) */
    uint64_t limit;
    pthread_t thread;
    _Atomic uint64_t promoted, promoted_bytes, backlog;
    /* dropped candidates by reason (stats report their sum as promo_dropped) */
    _Atomic uint64_t drop_dup, drop_cold, drop_newer, drop_on_fd, drop_full, drop_gated;
    _Atomic uint64_t marks[1u << MARK_BITS];  /* appended writes (NHC twin map) */
    _Atomic uint64_t fmarks[1u << MARK_BITS]; /* flushed writes (promotion) */
    /* the gate: reads seen, samples taken, samples whose key was hot; the
     * lift in thousandths (0: not measured), read without a lock */
    _Atomic uint64_t gate_reads, gate_samples, gate_hot;
    _Atomic uint64_t lift_milli;
    pthread_mutex_t gmu;           /* the window below */
    uint64_t win_samples, win_hot; /* counts where the current window began */
    double obs, exp;               /* samples hot, samples expected hot; decayed */
};

static size_t mark_idx(const void *key, size_t klen)
{
    return kv_hash64(key, klen, MARK_SEED) >> (64 - MARK_BITS);
}

static bool marked_since(lsm_promo *p, const pent *e)
{
    return atomic_load(&p->marks[mark_idx(e->r.key, e->r.klen)]) > e->fread;
}

static bool flushed_since(lsm_promo *p, const pent *e)
{
    return atomic_load(&p->fmarks[mark_idx(e->r.key, e->r.klen)]) > e->fread;
}

static void mark(_Atomic uint64_t *slots, const lsm_rec *recs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        /* seq_cst: the mark is visible before the caller goes on */
        kv_atomic_max(&slots[mark_idx(recs[i].key, recs[i].klen)], recs[i].seqno);
    }
}

void lsm_promo_mark(lsm_db *db, const lsm_rec *recs, size_t n)
{
    if (db->promo)
        mark(db->promo->marks, recs, n);
}

void lsm_promo_mark_flushed(lsm_db *db, const lsm_rec *recs, size_t n)
{
    if (db->promo)
        mark(db->promo->fmarks, recs, n);
}

static void pbuf_free(pbuf *b)
{
    for (size_t i = 0; i < b->n; i++)
        lsm_rec_free(&b->e[i].r);
    free(b->e);
    memset(b, 0, sizeof(*b));
}

static kv_err pbuf_push(pbuf *b, pent *e)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        pent *x = realloc(b->e, cap * sizeof(*x));
        if (!x)
            return KV_RESOURCE_EXHAUSTED;
        b->e = x;
        b->cap = cap;
    }
    b->e[b->n++] = *e;
    b->bytes += lsm_rec_size(&e->r);
    return KV_OK;
}

/* Moves the mutable buffer to the sealed queue (mu held). */
static void seal(lsm_promo *p, bool force)
{
    KV_ASSERT_LOCKED(&p->mu);
    if (!p->mut.n && !force)
        return;
    if (p->nsealed == MAX_SEALED) {
        atomic_fetch_add(&p->drop_full, p->mut.n);
        pbuf_free(&p->mut);
        return;
    }
    p->mut.force = force;
    atomic_fetch_add(&p->backlog, p->mut.bytes);
    p->sealed[p->nsealed++] = p->mut;
    memset(&p->mut, 0, sizeof(p->mut));
    pthread_cond_broadcast(&p->cv);
}

void lsm_promo_add(lsm_db *db, const lsm_rec *r, uint64_t fread)
{
    lsm_promo *p = db->promo;
    if (!p || r->type != LSM_PUT || (r->expire_at && r->expire_at <= lsm_now_ms(db)))
        return;
    pent e = {.fread = fread};
    if (lsm_rec_copy(&e.r, r) != KV_OK)
        return;
    e.r.flags |= LSM_F_PROMOTED | LSM_F_TWIN; /* its original stays on SD */
    pthread_mutex_lock(&p->mu);
    if (pbuf_push(&p->mut, &e) != KV_OK)
        lsm_rec_free(&e.r);
    if (p->mut.bytes >= p->limit)
        seal(p, false);
    pthread_mutex_unlock(&p->mu);
}

/* ---- the gate ---- */

/* Records in the levels of the current version, promoted copies left out
 * (a key overwritten in several levels counts in each: the share of hot
 * keys comes out lower, the lift higher, the gate more open). */
static uint64_t live_records(lsm_db *db)
{
    lsm_version *v = lsm_db_current(db);
    uint64_t n = 0;
    for (int l = 0; l < LSM_MAX_LEVELS; l++)
        for (size_t i = 0; i < v->nfiles[l]; i++)
            n += v->files[l][i]->nentries > v->files[l][i]->ntwins
                     ? v->files[l][i]->nentries - v->files[l][i]->ntwins
                     : 0;
    lsm_version_unref(v);
    return n;
}

/* Folds the samples since the window began into the lift (gmu held). */
static void gate_fold(lsm_db *db, lsm_promo *p)
{
    KV_ASSERT_LOCKED(&p->gmu);
    uint64_t hot = atomic_load(&p->gate_hot), n = atomic_load(&p->gate_samples);
    uint64_t dn = n - p->win_samples, dh = hot - p->win_hot;
    if (dn < GATE_WINDOW / 2) /* another reader folded this window already */
        return;
    p->win_samples = n;
    p->win_hot = hot;
    uint64_t stable = ralt_stable_count(db->ralt), recs = live_records(db);
    if (!recs)
        return;
    /* Samples hot (dh) against samples expected hot at the hot keys' share
     * of the records, both decayed per window: a window with few hot keys
     * (a young table) weighs little, and the estimate is trusted only once
     * GATE_MIN_SAMPLES hot samples were seen or expected. */
    double share = stable >= recs ? 1.0 : (double)stable / (double)recs;
    p->obs = p->obs * GATE_DECAY + (double)dh;
    p->exp = p->exp * GATE_DECAY + (double)dn * share;
    double milli = p->obs + p->exp >= GATE_MIN_SAMPLES && p->exp > 0 ? 1000.0 * p->obs / p->exp : 0;
    atomic_store(&p->lift_milli, milli <= 0     ? 0
                                 : milli < 1    ? 1
                                 : milli > 1e12 ? (uint64_t)1e12
                                                : (uint64_t)milli);
}

void lsm_promo_note_read(lsm_db *db, const void *key, size_t klen)
{
    lsm_promo *p = db->promo;
    if (!p || !db->ralt || !key || !klen)
        return;
    if (atomic_fetch_add_explicit(&p->gate_reads, 1, memory_order_relaxed) % GATE_SAMPLE)
        return;
    if (ralt_stable_in_run(db->ralt, key, klen)) /* the set ralt_stable_count counts */
        atomic_fetch_add(&p->gate_hot, 1);
    uint64_t n = atomic_fetch_add(&p->gate_samples, 1) + 1;
    if (n % GATE_WINDOW == 0 && pthread_mutex_trylock(&p->gmu) == 0) {
        gate_fold(db, p);
        pthread_mutex_unlock(&p->gmu);
    }
}

/* The score bar for the current lift (0: no bar). No bar while the lift is
 * not known: under skew it is known within seconds (many samples find
 * their key hot), and holding back meanwhile delayed a hot set's first
 * promotions by 20 s; under uniform reads it is known once the chance-hot
 * keys are a small fraction of the records, and those few were promoted. */
static double gate_bar(lsm_promo *p)
{
    uint64_t m = atomic_load(&p->lift_milli);
    if (m == 0 || m >= (uint64_t)(GATE_HI * 1000))
        return 0;
    double lift = m / 1000.0;
    return lift <= GATE_LO ? GATE_SCORE : GATE_SCORE * (GATE_HI - lift) / (GATE_HI - GATE_LO);
}

static bool gate_pass(lsm_db *db, const void *key, size_t klen)
{
    double bar = db->o.no_promo_gate ? 0 : gate_bar(db->promo);
    if (bar <= 0 || ralt_score(db->ralt, key, klen) >= bar)
        return true;
    atomic_fetch_add(&db->promo->drop_gated, 1);
    return false;
}

bool lsm_promo_gate(lsm_db *db, const void *key, size_t klen)
{
    return !db->promo || !db->ralt || gate_pass(db, key, klen);
}

/* ---- the checker ---- */

static int pent_cmp(const void *x, const void *y)
{
    const pent *a = x, *b = y;
    int c = lsm_key_cmp(a->r.key, a->r.klen, b->r.key, b->r.klen);
    if (c)
        return c;
    return a->r.seqno > b->r.seqno ? -1 : a->r.seqno < b->r.seqno;
}

/* True when file f holds a record of key: its bloom filter first, then the
 * one block that may hold it (a read on FD). An unreadable block counts as
 * holding the key: the candidate is dropped, never promoted over a record
 * it could not compare with. */
static bool file_holds(const lsm_file *f, const void *key, size_t klen)
{
    if (!lsm_file_covers(f, key, klen) || !lsm_sst_may_contain(f->sst, key, klen))
        return false;
    int blk = lsm_sst_find_block(f->sst, key, klen);
    if (blk < 0)
        return false;
    lsm_io io;
    if (lsm_sst_read_block(f->sst, blk, &io) != KV_OK)
        return true;
    lsm_rec r;
    kv_err rv = lsm_block_search(f->sst, io.buf, io.len, key, klen, &r);
    free(io.buf);
    return rv != KV_NOT_FOUND;
}

/* True when an FD level of v holds key. The bloom filters alone are not
 * enough: a hot key whose filters answer "maybe" (about 1% per FD file at
 * 10 bits/key) was never promoted for as long as those files lived, which
 * in a read-mostly phase is the whole run. At 2M records (hotspot5, FD
 * 200 MiB) the filters alone dropped ~10k candidates as "on FD" and the FD
 * hit rate stayed at 0.949; with the block read, 0.5k and 0.952. It costs
 * an FD read per filter positive, on the checker thread. */
static bool on_fd(lsm_db *db, const lsm_version *v, const void *key, size_t klen)
{
    for (int l = 0; l <= db->last_fd; l++) {
        for (size_t i = 0; i < v->nfiles[l]; i++) {
            if (file_holds(v->files[l][i], key, klen))
                return true;
        }
    }
    return false;
}

/* Why a candidate is not promoted; DROP_NONE keeps it. Checks without I/O
 * first; the FD and RALT checks read a block only where a filter says
 * "maybe" (RALT: per run that may hold the key). */
typedef enum drop_why {
    DROP_NONE,
    DROP_DUP,
    DROP_NEWER,
    DROP_ON_FD,
    DROP_COLD,
    DROP_GATED
} drop_why;

static drop_why check(lsm_db *db, const lsm_version *v, const pent *prev, const pent *e,
                      uint64_t now)
{
    if (prev && lsm_key_cmp(prev->r.key, prev->r.klen, e->r.key, e->r.klen) == 0)
        return DROP_DUP;
    if ((e->r.expire_at && e->r.expire_at <= now) || flushed_since(db->promo, e) ||
        (db->o.newer && db->o.newer(db->o.newer_arg, e->r.key, e->r.klen, e->r.seqno)))
        return DROP_NEWER;
    if (on_fd(db, v, e->r.key, e->r.klen))
        return DROP_ON_FD;
    if (!ralt_is_hot(db->ralt, e->r.key, e->r.klen))
        return DROP_COLD;
    if (!gate_pass(db, e->r.key, e->r.klen))
        return DROP_GATED; /* counted by gate_pass */
    return DROP_NONE;
}

/* Sorts b, keeps the newest read of each key that passes every check,
 * frees the rest. */
static void filter(lsm_db *db, pbuf *b)
{
    lsm_promo *p = db->promo;
    if (b->n)
        qsort(b->e, b->n, sizeof(*b->e), pent_cmp);
    lsm_version *v = lsm_db_current(db);
    size_t m = 0;
    uint64_t bytes = 0, now = lsm_now_ms(db);
    pent prev = {0}; /* the previous entry; its record is freed once e was compared */
    bool prev_dropped = false;
    for (size_t i = 0; i < b->n; i++) {
        pent e = b->e[i];
        drop_why why = check(db, v, i ? &prev : NULL, &e, now);
        if (prev_dropped)
            lsm_rec_free(&prev.r);
        prev = e;
        prev_dropped = why != DROP_NONE;
        if (why == DROP_NONE) {
            b->e[m++] = e;
            bytes += lsm_rec_size(&e.r);
            continue;
        }
        if (why == DROP_GATED)
            continue;
        _Atomic uint64_t *c = why == DROP_DUP     ? &p->drop_dup
                              : why == DROP_NEWER ? &p->drop_newer
                              : why == DROP_ON_FD ? &p->drop_on_fd
                                                  : &p->drop_cold;
        atomic_fetch_add(c, 1);
    }
    if (prev_dropped)
        lsm_rec_free(&prev.r);
    lsm_version_unref(v);
    b->n = m;
    b->bytes = bytes;
}

static kv_err build(lsm_db *db, const pbuf *b, lsm_file **out)
{
    pthread_mutex_lock(&db->mu);
    uint64_t number = lsm_db_new_number(db);
    pthread_mutex_unlock(&db->mu);
    lsm_sst_builder *sb = NULL; /* not written when the open fails */
    kv_err rv = lsm_db_builder(db, 0, number, &sb);
    for (size_t i = 0; rv == KV_OK && i < b->n; i++)
        rv = lsm_sst_builder_add(sb, &b->e[i].r);
    if (rv != KV_OK) {
        if (sb)
            lsm_sst_builder_abort(sb);
        return rv;
    }
    return lsm_sst_builder_finish(sb, 0, out);
}

/* Drops the records of b whose key was flushed since their read (db->mu
 * held); returns how many were dropped. */
static size_t drop_marked(lsm_db *db, pbuf *b)
{
    KV_ASSERT_LOCKED(&db->mu);
    size_t m = 0, n = b->n;
    for (size_t i = 0; i < n; i++) {
        if (flushed_since(db->promo, &b->e[i]))
            lsm_rec_free(&b->e[i].r);
        else
            b->e[m++] = b->e[i];
    }
    b->n = m;
    atomic_fetch_add(&db->promo->drop_newer, n - m);
    return n - m;
}

/* NHC twin map (twin.c): the records of b, just installed on FD, still
 * have their SD originals with the same seqno. Each entry is inserted, then
 * the key's write mark is checked again: lsm_wal_append marks before it
 * removes the key's entry under the same stripe lock, so either that
 * removal comes after this insert, or its mark is visible to this check. */
static void twin_note(lsm_db *db, const pbuf *b)
{
    for (size_t i = 0; db->twin && i < b->n; i++) {
        lsm_twin_put(db->twin, b->e[i].r.key, b->e[i].r.klen, b->e[i].r.seqno);
        if (marked_since(db->promo, &b->e[i]))
            lsm_twin_drop(db->twin, b->e[i].r.key, b->e[i].r.klen, b->e[i].r.seqno);
    }
}

/* Writes b as an L0 file and installs it unless a key was written since
 * (then retries without it) or L0 is full. */
static kv_err promote(lsm_db *db, pbuf *b)
{
    for (int attempt = 0; attempt < 3 && b->n; attempt++) {
        lsm_file *f = NULL;
        kv_err rv = build(db, b, &f);
        if (rv != KV_OK)
            return rv;
        pthread_mutex_lock(&db->mu);
        bool full = db->cur->nfiles[0] >= db->o.l0_stop;
        if (!full && drop_marked(db, b) == 0) {
            lsm_edit e = {0};
            rv = lsm_edit_add(&e, f);
            if (rv == KV_OK)
                rv = lsm_db_install(db, &e);
            if (rv == KV_OK)
                pthread_cond_broadcast(&db->cv); /* wake compaction */
            pthread_mutex_unlock(&db->mu);
            lsm_edit_free(&e);
            if (rv != KV_OK) {
                atomic_store(&f->obsolete, true);
            } else {
                atomic_fetch_add(&db->promo->promoted, b->n);
                atomic_fetch_add(&db->promo->promoted_bytes, f->size);
                twin_note(db, b); /* NHC */
            }
            lsm_file_unref(f);
            return rv;
        }
        pthread_mutex_unlock(&db->mu);
        atomic_store(&f->obsolete, true);
        lsm_file_unref(f);
        if (full)
            return KV_RESOURCE_EXHAUSTED;
    }
    return KV_OK;
}

static void check_one(lsm_db *db, pbuf *b)
{
    lsm_promo *p = db->promo;
    filter(db, b);
    if (!b->force && b->bytes < db->file_size / 2 && b->n && p->returns < MAX_RETURNS) {
        p->returns++;
        pthread_mutex_lock(&p->mu); /* too few: back to the mutable buffer */
        for (size_t i = 0; i < b->n; i++)
            if (pbuf_push(&p->mut, &b->e[i]) != KV_OK)
                lsm_rec_free(&b->e[i].r);
        b->n = 0;
        pthread_mutex_unlock(&p->mu);
    } else if (b->n) {
        p->returns = 0;
        kv_err rv = promote(db, b);
        if (rv != KV_OK && rv != KV_RESOURCE_EXHAUSTED)
            KV_WARN(LSM_LOG, "promotion of %zu records: %s", b->n, kv_strerror(rv));
    }
    pbuf_free(b);
}

static void *checker_main(void *arg)
{
    lsm_db *db = arg;
    prctl(PR_SET_NAME, "lsm:promote"); /* shown by top -H, perf, gdb */
    lsm_promo *p = db->promo;
    if (db->o.newer_thread)
        db->o.newer_thread(db->o.newer_arg, true);
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        if (!p->nsealed) {
            pthread_cond_wait(&p->cv, &p->mu);
            continue;
        }
        pbuf b = p->sealed[0];
        memmove(&p->sealed[0], &p->sealed[1], (p->nsealed - 1) * sizeof(pbuf));
        p->nsealed--;
        p->busy = true;
        pthread_mutex_unlock(&p->mu);
        uint64_t bytes = b.bytes;
        check_one(db, &b);
        atomic_fetch_sub(&p->backlog, bytes);
        pthread_mutex_lock(&p->mu);
        p->busy = false;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    if (db->o.newer_thread)
        db->o.newer_thread(db->o.newer_arg, false);
    return NULL;
}

/* ---- lifecycle ---- */

kv_err lsm_promo_create(lsm_db *db)
{
    lsm_promo *p = calloc(1, sizeof(*p));
    if (!p)
        return KV_RESOURCE_EXHAUSTED;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    pthread_mutex_init(&p->gmu, NULL);
    uint64_t auto_kb = (64u << 10) * db->o.fast_mb / 1024;
    p->limit = (db->o.promo_buf_kb ? db->o.promo_buf_kb : auto_kb < 1024 ? 1024 : auto_kb) << 10;
    db->promo = p;
    return KV_OK;
}

kv_err lsm_promo_start(lsm_db *db)
{
    lsm_promo *p = db->promo;
    if (!p)
        return KV_OK;
    if (pthread_create(&p->thread, NULL, checker_main, db) != 0)
        return KV_INTERNAL;
    p->started = true;
    return KV_OK;
}

void lsm_promo_close(lsm_db *db)
{
    lsm_promo *p = db->promo;
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (p->started)
        pthread_join(p->thread, NULL);
    pbuf_free(&p->mut);
    for (size_t i = 0; i < p->nsealed; i++)
        pbuf_free(&p->sealed[i]);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->gmu);
    free(p);
    db->promo = NULL;
}

void lsm_promo_sync(lsm_db *db)
{
    lsm_promo *p = db->promo;
    if (!p)
        return;
    if (db->ralt)
        ralt_flush(db->ralt);
    pthread_mutex_lock(&p->mu);
    seal(p, true);
    while (p->started && !p->stop && (p->nsealed || p->busy))
        pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void lsm_promo_stats(lsm_db *db, lsm_stats *out)
{
    lsm_promo *p = db->promo;
    if (!p)
        return;
    out->promoted_recs = atomic_load(&p->promoted);
    out->promoted_bytes = atomic_load(&p->promoted_bytes);
    out->promo_drop_dup = atomic_load(&p->drop_dup);
    out->promo_drop_cold = atomic_load(&p->drop_cold);
    out->promo_drop_newer = atomic_load(&p->drop_newer);
    out->promo_drop_on_fd = atomic_load(&p->drop_on_fd);
    out->promo_drop_full = atomic_load(&p->drop_full);
    out->promo_drop_gated = atomic_load(&p->drop_gated);
    out->promo_lift = atomic_load(&p->lift_milli) / 1000.0;
    out->promo_dropped = out->promo_drop_dup + out->promo_drop_cold + out->promo_drop_newer +
                         out->promo_drop_on_fd + out->promo_drop_full + out->promo_drop_gated;
    out->promo_backlog = atomic_load(&p->backlog);
    pthread_mutex_lock(&p->mu);
    out->promo_buf_bytes = p->mut.bytes;
    pthread_mutex_unlock(&p->mu);
}
