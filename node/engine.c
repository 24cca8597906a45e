/* SPDX-License-Identifier: MIT */
/*
 * Engine point operations over the memory tier (HotRing) and the LSM.
 *
 * Writes: under the key's stripe lock the engine finds the current record
 * (memory, else the LSM), decides last-writer-wins and the conditions,
 * appends the record to the WAL with a fresh seqno, and inserts it into the
 * memory tier as dirty. Reads: memory first; on a miss the LSM, and a
 * record read twice within the sketch's window is filled into memory, but
 * only if no item appeared meanwhile and no flush was installed since the
 * lookup began (so a fill can never hide a newer, flushed-and-evicted
 * write).
 */
#include "node/engine_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <urcu/urcu-memb.h>

#include "common/assert.h"
#include "common/atomic.h"
#include "common/hash.h"
#include "common/limits.h"
#include "common/log.h"

static const char *const sync_names[] = {"always", "batch", "none"};

/* Registration nests: the engine registers the opening thread for WAL
 * replay, which may already be registered by its owner. */
static _Thread_local int reg_depth;

void engine_thread_register(void)
{
    if (reg_depth++ == 0)
        hr_thread_register();
}

void engine_thread_unregister(void)
{
    if (reg_depth > 0 && --reg_depth == 0)
        hr_thread_unregister();
}

uint64_t engine_rec_bytes(size_t klen, size_t vlen)
{
    return (uint64_t)klen + vlen + ENGINE_ITEM_OVERHEAD;
}

/* One memory hit in 16, drawn from a per-thread xorshift64 (a counter
 * would alias with access patterns that cycle through a key set). */
static bool sample_hit(void)
{
    static _Thread_local uint64_t x;
    if (!x)
        x = (uint64_t)(uintptr_t)&x * 0x9e3779b97f4a7c15ull | 1;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return (x & 15) == 0;
}

static bool rec_live(uint32_t flags, uint64_t expire_at, uint64_t now_ms)
{
    return !(flags & HR_F_TOMBSTONE) && (expire_at == 0 || expire_at > now_ms);
}

/* ---- recovery ---------------------------------------------------------- */

typedef struct put_acct {
    uint64_t old_bytes;
    bool old_dirty, had_old;
    uint64_t version;
} put_acct;

/* Conditions below refuse a write with SKIP. */
#define SKIP KV_ALREADY_EXISTS

/* Applies only over an older version (replay, and the write path's final
 * insert, where the stripe lock leaves fills as the only concurrent change). */
static kv_err newer_cond(void *arg, const hr_view *cur)
{
    put_acct *a = arg;
    a->had_old = cur != NULL;
    a->old_bytes = cur ? engine_rec_bytes(cur->klen, cur->vlen) : 0;
    a->old_dirty = cur && (cur->meta.flags & HR_F_DIRTY);
    if (cur && cur->meta.version > a->version)
        return SKIP;
    return KV_OK;
}

static void account(engine *e, const put_acct *a, uint64_t bytes, bool dirty)
{
    atomic_fetch_add(&e->mem_bytes, bytes);
    if (a->had_old)
        atomic_fetch_sub(&e->mem_bytes, a->old_bytes);
    if (dirty) {
        atomic_fetch_add(&e->dirty_bytes, bytes);
        atomic_fetch_add(&e->dirty_items, 1);
    }
    if (a->old_dirty) {
        atomic_fetch_sub(&e->dirty_bytes, a->old_bytes);
        atomic_fetch_sub(&e->dirty_items, 1);
    }
}

static kv_err replay_one(void *arg, const lsm_rec *r)
{
    engine *e = arg;
    hr_meta m = {.version = r->version, .seqno = r->seqno, .expire_at = r->expire_at};
    m.flags = HR_F_DIRTY | (r->type == LSM_DELETE ? HR_F_TOMBSTONE : 0);
    put_acct a = {.version = r->version};
    kv_err rv =
        hr_upsert(e->idx, r->key, r->klen, r->value ? r->value : "", r->vlen, &m, newer_cond, &a);
    if (rv == KV_OK)
        account(e, &a, engine_rec_bytes(r->klen, r->vlen), true);
    kv_hlc_observe(&e->hlc, r->version);
    kv_atomic_max(&e->max_version, r->version);
    return rv == SKIP ? KV_OK : rv;
}

/* ---- HotRAP's memory-tier check (lsm_opts.newer) ---------------------- */

static void seqno_visit(void *arg, const hr_view *v)
{
    *(uint64_t *)arg = v->meta.seqno;
}

/* lsm_opts.newer: true when the memory tier holds a version of key (dirty
 * or clean, tombstones included) with a seqno above seqno, so the promotion
 * checker drops its copy. Runs on the LSM's promotion checker thread only,
 * which engine_promo_thread registered with liburcu (memb flavour) before
 * the first call; hotring.h requires that of every thread calling hr_get.
 * The lookup runs inside an explicit RCU read-side section (hr_get nests
 * its own): the view's item may be retired by a concurrent writer or the
 * evictor, and only its seqno is copied out before the section ends. Does
 * no I/O and takes no lock (hr_get is lock-free but for waiting out an
 * in-place rewrite of the key, a few stores). */
bool engine_mem_newer(void *arg, const void *key, size_t klen, uint64_t seqno)
{
    engine *e = arg;
    uint64_t cur = 0;
    urcu_memb_read_lock();
    kv_err rv = hr_get(e->idx, key, klen, seqno_visit, &cur);
    urcu_memb_read_unlock();
    return rv == KV_OK && cur > seqno;
}

/* lsm_opts.newer_thread: the checker thread registers with liburcu when it
 * starts and unregisters before it exits (outside any read-side section). */
void engine_promo_thread(void *arg, bool begin)
{
    (void)arg;
    if (begin)
        engine_thread_register();
    else
        engine_thread_unregister();
}

static kv_err open_tiers(engine *e, char *err, size_t errlen)
{
    hr_opts ho = {0};
    ho.buckets = e->o.index_buckets ? e->o.index_buckets : e->mem_limit / 1024;
    ho.buckets = ho.buckets < 1024 ? 1024 : ho.buckets;
    ho.mode = HR_MODE_SAMPLE;
    ho.r = 5;
    /* The index doubles its buckets (lock-free, in its own thread) when the
     * average items visited per access exceed the cost; the initial count
     * from the memory budget keeps that rare. */
    ho.rehash = true;
    ho.rehash_cost = e->o.index_rehash_cost;
    kv_err rv = hr_open(&e->idx, &ho);
    if (rv != KV_OK) {
        snprintf(err, errlen, "cannot create the HotRing index: %s", kv_strerror(rv));
        return rv;
    }
    engine_thread_register(); /* the replay callback inserts into the index */
    rv = e->st->open(e, replay_one, err, errlen);
    engine_thread_unregister();
    if (rv != KV_OK)
        return rv;
    kv_atomic_max(&e->max_version, e->st->max_version ? e->st->max_version(e->db) : UINT64_MAX);
    atomic_store(&e->next_seqno, e->st->last_seqno(e->db) + 1);
    return KV_OK;
}

kv_err engine_open(engine **out, const engine_opts *opts, char *err, size_t errlen)
{
    if (!opts->fast_dir) {
        snprintf(err, errlen, "no fast directory given");
        return KV_INVALID_ARGUMENT;
    }
    kv_err rv = engine_store_check(opts, err, errlen);
    if (rv != KV_OK)
        return rv;
    engine *e = calloc(1, sizeof(*e));
    if (!e || !(e->sketch = calloc(ENGINE_SKETCH_SIZE, 1))) {
        free(e);
        return KV_RESOURCE_EXHAUSTED;
    }
    e->o = *opts;
    e->st = opts->kind == ENGINE_KALLAX ? &engine_store_kallax : &engine_store_lsm;
    e->mem_limit = (uint64_t)(opts->mem_mb ? opts->mem_mb : 256) << 20;
    e->write_buffer = opts->write_buffer_kb   ? (uint64_t)opts->write_buffer_kb << 10
                      : opts->write_buffer_mb ? (uint64_t)opts->write_buffer_mb << 20
                                              : 64ull << 20;
    e->wal_limit = opts->wal_max_kb   ? opts->wal_max_kb << 10
                   : opts->wal_max_mb ? opts->wal_max_mb << 20
                                      : 4 * e->write_buffer;
    for (int i = 0; i < ENGINE_STRIPES; i++)
        pthread_mutex_init(&e->stripes[i], NULL);
    pthread_rwlock_init(&e->apply_lock, NULL);
    pthread_rwlock_init(&e->pin_lock, NULL);
    pthread_mutex_init(&e->bg_mu, NULL);
    pthread_cond_init(&e->bg_cv, NULL);
    pthread_cond_init(&e->done_cv, NULL);
    rv = open_tiers(e, err, errlen);
    if (rv == KV_OK && (rv = engine_bg_start(e)) != KV_OK)
        snprintf(err, errlen, "cannot start the flush thread");
    if (rv == KV_OK && (rv = engine_nhc_start(e)) != KV_OK)
        snprintf(err, errlen, "cannot start the NHC thread");
    if (rv != KV_OK) {
        engine_close(e);
        return rv;
    }
    KV_INFO("engine", "%s: recovered %llu unflushed bytes from the WAL, next seqno %llu, sync %s",
            e->st->name, (unsigned long long)atomic_load(&e->dirty_bytes),
            (unsigned long long)atomic_load(&e->next_seqno), sync_names[e->o.sync]);
    *out = e;
    return KV_OK;
}

void engine_close(engine *e)
{
    if (!e)
        return;
    engine_bg_stop(e);
    engine_nhc_stop(e);
    if (e->db)
        e->st->close(e->db);
    engine_nhc_destroy(e);
    hr_close(e->idx);
    for (int i = 0; i < ENGINE_STRIPES; i++)
        pthread_mutex_destroy(&e->stripes[i]);
    pthread_rwlock_destroy(&e->apply_lock);
    pthread_rwlock_destroy(&e->pin_lock);
    pthread_mutex_destroy(&e->bg_mu);
    pthread_cond_destroy(&e->bg_cv);
    pthread_cond_destroy(&e->done_cv);
    free((void *)e->sketch);
    free(e);
}

/* ---- reads ------------------------------------------------------------- */

typedef struct get_state {
    uint64_t now_ms;
    engine_result *out;
    bool oom;
} get_state;

static void get_visit(void *arg, const hr_view *v)
{
    get_state *g = arg;
    g->out->version = v->meta.version;
    g->out->expire_at = v->meta.expire_at;
    if (!rec_live(v->meta.flags, v->meta.expire_at, g->now_ms))
        return;
    uint8_t *copy = malloc(v->vlen ? v->vlen : 1);
    if (!copy) {
        g->oom = true;
        return;
    }
    if (v->vlen)
        memcpy(copy, v->val, v->vlen);
    g->out->found = true;
    g->out->val = copy;
    g->out->vlen = v->vlen;
}

typedef struct fill_state {
    engine *e;
    uint64_t gen;
} fill_state;

/* A fill goes in only into an empty slot and only while no flush has been
 * installed since the lookup began: otherwise a newer record may have been
 * flushed and evicted, and this one would shadow it. */
static kv_err fill_cond(void *arg, const hr_view *cur)
{
    fill_state *f = arg;
    if (cur || f->e->st->flush_generation(f->e->db) != f->gen)
        return SKIP;
    return KV_OK;
}

static void maybe_fill(engine *e, const lsm_rec *r, lsm_tier tier, uint64_t gen)
{
    if (tier == LSM_TIER_SD && !engine_nhc_admit_sd(e))
        return; /* NHC data_admit off: SD reads stay out of memory too */
    if (!engine_admit(e, r->key, r->klen))
        return;
    uint64_t bytes = engine_rec_bytes(r->klen, r->vlen);
    if (atomic_load(&e->mem_bytes) + bytes > e->mem_limit) {
        engine_bg_kick(e);
        return;
    }
    hr_meta m = {.version = r->version, .seqno = r->seqno, .expire_at = r->expire_at};
    m.flags = r->type == LSM_DELETE ? HR_F_TOMBSTONE : 0;
    fill_state f = {e, gen};
    if (hr_upsert(e->idx, r->key, r->klen, r->value ? r->value : "", r->vlen, &m, fill_cond, &f) ==
        KV_OK) {
        atomic_fetch_add(&e->mem_bytes, bytes);
        atomic_fetch_add_explicit(&e->fills, 1, memory_order_relaxed);
    }
}

static kv_err get_from_lsm(engine *e, const void *key, size_t klen, engine_result *r,
                           uint64_t now_ms)
{
    uint64_t gen = e->st->flush_generation(e->db);
    lsm_rec rec;
    lsm_tier tier = LSM_TIER_NONE;
    kv_err rv = e->st->get(e->db, key, klen, &rec, &tier);
    if (rv == KV_NOT_FOUND) {
        atomic_fetch_add_explicit(&e->reads_miss, 1, memory_order_relaxed);
        return KV_OK;
    }
    if (rv != KV_OK)
        return rv;
    atomic_fetch_add_explicit(tier == LSM_TIER_SD ? &e->reads_sd : &e->reads_fd, 1,
                              memory_order_relaxed);
    r->version = rec.version;
    r->expire_at = rec.expire_at;
    if (rec.type == LSM_PUT && (rec.expire_at == 0 || rec.expire_at > now_ms)) {
        r->val = malloc(rec.vlen ? rec.vlen : 1);
        if (!r->val) {
            lsm_rec_free(&rec);
            return KV_RESOURCE_EXHAUSTED;
        }
        if (rec.vlen)
            memcpy(r->val, rec.value, rec.vlen);
        r->vlen = rec.vlen;
        r->found = true;
    }
    maybe_fill(e, &rec, tier, gen);
    lsm_rec_free(&rec);
    return KV_OK;
}

/* Takes one tracker sample owed by engine_get_mem, if any (the CAS retries
 * only while other readers take samples at the same time; relaxed: a
 * sample count, no data is published through it). */
static bool take_owed_sample(engine *e)
{
    uint64_t n = atomic_load_explicit(&e->samples_owed, memory_order_relaxed);
    while (n && !atomic_compare_exchange_weak_explicit(&e->samples_owed, &n, n - 1,
                                                       memory_order_relaxed, memory_order_relaxed))
        ;
    return n != 0;
}

kv_err engine_get_mem(engine *e, const void *key, size_t klen, engine_result *out)
{
    engine_result r = {0};
    get_state g = {engine_now_ms(e), &r, false};
    kv_err rv = hr_get(e->idx, key, klen, get_visit, &g);
    if (rv != KV_OK || g.oom) { /* engine_get answers it (the LSM tiers, or the error) */
        free(r.val);
        return KV_NOT_FOUND;
    }
    /* a sampled hit feeds HotRAP and the eviction sketch as engine_get's
     * does, here when that cannot block; when the tracker would write a
     * run, engine_get takes the read (and owes the sample: ralt_access) */
    if (sample_hit()) {
        if (!e->st->note_access_nb(e->db, key, klen, r.vlen)) {
            free(r.val);
            atomic_fetch_add_explicit(&e->samples_owed, 1, memory_order_relaxed);
            return KV_NOT_FOUND;
        }
        engine_touch(e, key, klen);
    }
    atomic_fetch_add_explicit(&e->gets, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&e->reads_mem, 1, memory_order_relaxed);
    *out = r;
    return KV_OK;
}

kv_err engine_get(engine *e, const void *key, size_t klen, engine_result *out)
{
    engine_result r = {0};
    get_state g = {engine_now_ms(e), &r, false};
    atomic_fetch_add_explicit(&e->gets, 1, memory_order_relaxed);
    kv_err rv = hr_get(e->idx, key, klen, get_visit, &g);
    if (rv == KV_OK) {
        /* HotRAP and the eviction sketch also learn from memory hits, at a
         * sampled rate (1 in 16) */
        atomic_fetch_add_explicit(&e->reads_mem, 1, memory_order_relaxed);
        if (sample_hit() || take_owed_sample(e)) {
            e->st->note_access(e->db, key, klen, r.vlen);
            engine_touch(e, key, klen);
        }
    } else if (rv == KV_NOT_FOUND) {
        rv = get_from_lsm(e, key, klen, &r, g.now_ms);
    }
    if (rv == KV_OK && g.oom)
        rv = KV_RESOURCE_EXHAUSTED;
    if (rv != KV_OK) {
        free(r.val);
        return rv;
    }
    *out = r;
    return KV_OK;
}

/* Turns one multiget record into a result (expiry, tombstones, fill). */
static kv_err lsm_result(engine *e, const lsm_rec *rec, lsm_tier tier, uint64_t gen,
                         uint64_t now_ms, engine_result *r)
{
    atomic_fetch_add_explicit(tier == LSM_TIER_SD ? &e->reads_sd : &e->reads_fd, 1,
                              memory_order_relaxed);
    r->version = rec->version;
    r->expire_at = rec->expire_at;
    if (rec->type == LSM_PUT && (rec->expire_at == 0 || rec->expire_at > now_ms)) {
        if (!(r->val = malloc(rec->vlen ? rec->vlen : 1)))
            return KV_RESOURCE_EXHAUSTED;
        if (rec->vlen)
            memcpy(r->val, rec->value, rec->vlen);
        r->vlen = rec->vlen;
        r->found = true;
    }
    maybe_fill(e, rec, tier, gen);
    return KV_OK;
}

/* The LSM half of engine_get_many: the misses, looked up together. */
static kv_err get_many_lsm(engine *e, size_t m, const void **mk, size_t *ml, size_t *pos,
                           engine_result *out, kv_err *errs, uint64_t gen, uint64_t now_ms)
{
    lsm_rec *recs = calloc(m, sizeof(*recs));
    lsm_tier *tiers = calloc(m, sizeof(*tiers));
    kv_err *lerrs = calloc(m, sizeof(*lerrs));
    kv_err rv = recs && tiers && lerrs ? e->st->multiget(e->db, m, mk, ml, recs, tiers, lerrs)
                                       : KV_RESOURCE_EXHAUSTED;
    for (size_t j = 0; rv == KV_OK && j < m; j++) {
        size_t i = pos[j];
        if (lerrs[j] == KV_NOT_FOUND) {
            atomic_fetch_add_explicit(&e->reads_miss, 1, memory_order_relaxed);
            errs[i] = KV_OK;
        } else if (lerrs[j] != KV_OK) {
            errs[i] = lerrs[j];
        } else {
            errs[i] = lsm_result(e, &recs[j], tiers[j], gen, now_ms, &out[i]);
            lsm_rec_free(&recs[j]);
        }
    }
    free(recs);
    free(tiers);
    free(lerrs);
    return rv;
}

/* hr_get_batch's visitor for engine_get_many: get_visit for key i. */
typedef struct many_state {
    uint64_t now_ms;
    engine_result *out;
    kv_err *errs; /* KV_OK for a hit */
    bool *oom;    /* the hit's value could not be copied */
} many_state;

static void many_visit(void *arg, size_t i, const hr_view *v)
{
    many_state *m = arg;
    get_state g = {m->now_ms, &m->out[i], false};
    get_visit(&g, v);
    m->errs[i] = KV_OK;
    m->oom[i] = g.oom;
}

/* The memory tier's answers for all n keys (hk: n slots): one batched
 * lookup (the index overlaps the keys' cache misses, hotring.h), each hit
 * visited as hr_get would; errs[i] is KV_OK for a hit, NOT_FOUND for a miss.
 * A batch with an invalid key is looked up key by key instead, so that only
 * that key gets INVALID_ARGUMENT, as from hr_get. */
static void mem_get_many(engine *e, size_t n, const void *const *keys, const size_t *klens,
                         hr_key *hk, engine_result *out, kv_err *errs, bool *oom, uint64_t now_ms)
{
    many_state m = {now_ms, out, errs, oom};
    for (size_t i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof(out[i]));
        errs[i] = KV_NOT_FOUND;
        oom[i] = false;
        hk[i] = (hr_key){keys[i], klens[i]};
    }
    if (hr_get_batch(e->idx, hk, n, many_visit, &m, NULL) == KV_OK)
        return;
    for (size_t i = 0; i < n; i++) { /* nothing was looked up */
        get_state g = {now_ms, &out[i], false};
        errs[i] = hr_get(e->idx, keys[i], klens[i], get_visit, &g);
        oom[i] = g.oom;
    }
}

kv_err engine_get_many(engine *e, size_t n, const void *const *keys, const size_t *klens,
                       engine_result *out, kv_err *errs)
{
    uint64_t now_ms = engine_now_ms(e), gen = e->st->flush_generation(e->db);
    const void **mk = calloc(n ? n : 1, sizeof(*mk));
    size_t *ml = calloc(n ? n : 1, sizeof(*ml)), *pos = calloc(n ? n : 1, sizeof(*pos)), m = 0;
    hr_key *hk = calloc(n ? n : 1, sizeof(*hk));
    bool *oom = calloc(n ? n : 1, sizeof(*oom));
    kv_err rv = mk && ml && pos && hk && oom ? KV_OK : KV_RESOURCE_EXHAUSTED;
    if (rv == KV_OK)
        mem_get_many(e, n, keys, klens, hk, out, errs, oom, now_ms);
    for (size_t i = 0; rv == KV_OK && i < n; i++) {
        atomic_fetch_add_explicit(&e->gets, 1, memory_order_relaxed);
        if (errs[i] == KV_OK) {
            atomic_fetch_add_explicit(&e->reads_mem, 1, memory_order_relaxed);
            if (sample_hit()) {
                e->st->note_access(e->db, keys[i], klens[i], out[i].vlen);
                engine_touch(e, keys[i], klens[i]);
            }
            errs[i] = oom[i] ? KV_RESOURCE_EXHAUSTED : KV_OK;
        } else if (errs[i] == KV_NOT_FOUND) {
            mk[m] = keys[i];
            ml[m] = klens[i];
            pos[m++] = i;
        }
    }
    if (rv == KV_OK && m)
        rv = get_many_lsm(e, m, mk, ml, pos, out, errs, gen, now_ms);
    free(mk);
    free(ml);
    free(pos);
    free(hk);
    free(oom);
    return rv;
}

/* ---- writes ------------------------------------------------------------ */

typedef struct current {
    bool exists, live;
    uint64_t version, now_ms;
} current;

static void cur_visit(void *arg, const hr_view *v)
{
    current *c = arg;
    c->exists = true;
    c->version = v->meta.version;
    c->live = rec_live(v->meta.flags, v->meta.expire_at, c->now_ms);
}

/* The record governing key right now: memory, else the LSM. */
static kv_err find_current(engine *e, const engine_write *w, current *c, char *err, size_t errlen)
{
    *c = (current){.now_ms = engine_now_ms(e)};
    if (hr_get(e->idx, w->key, w->klen, cur_visit, c) == KV_OK)
        return KV_OK;
    lsm_rec rec; /* metadata only, and not a read for HotRAP (lsm_get_meta) */
    kv_err rv = e->st->get_meta(e->db, w->key, w->klen, &rec);
    if (rv == KV_NOT_FOUND)
        return KV_OK;
    if (rv != KV_OK) {
        snprintf(err, errlen, "cannot read the current record: %s", kv_strerror(rv));
        return rv;
    }
    c->exists = true;
    c->version = rec.version;
    c->live = rec.type == LSM_PUT && (rec.expire_at == 0 || rec.expire_at > c->now_ms);
    return KV_OK;
}

static kv_err check_conditions(const engine_write *w, const current *c, char *err, size_t errlen)
{
    if (w->if_absent && c->live) {
        snprintf(err, errlen, "key exists (if_absent)");
        return KV_ALREADY_EXISTS;
    }
    if (w->if_version && (!c->live || c->version != w->if_version)) {
        snprintf(err, errlen, "version mismatch (if_version %llu, current %llu)",
                 (unsigned long long)w->if_version, (unsigned long long)(c->live ? c->version : 0));
        return KV_FAILED_PRECONDITION;
    }
    return KV_OK;
}

/* The stripe lock that serialises the writers of key. */
static pthread_mutex_t *engine_stripe(engine *e, const void *key, size_t klen)
{
    return &e->stripes[kv_hash64(key, klen, 7) % ENGINE_STRIPES];
}

/* The record's expiry: an absolute expire_at wins, else now + ttl_ms (a
 * put's; checked against KV_MAX_TTL_MS, saturated anyway). */
static uint64_t expiry(engine *e, const engine_write *w)
{
    if (w->expire_at || !w->ttl_ms || w->is_delete)
        return w->expire_at;
    uint64_t now = engine_now_ms(e);
    return now > UINT64_MAX - w->ttl_ms ? UINT64_MAX : now + w->ttl_ms;
}

/* Appends to the WAL and inserts into memory; the caller holds the stripe.
 * The memory-tier item is built before the append, so that a record in the
 * WAL always reaches memory (a write that fails leaves no record a restart
 * would replay, and one acknowledged is visible at once).
 * *applied: false when the memory tier already held a newer version. */
static kv_err apply(engine *e, const engine_write *w, uint64_t version, bool *applied, char *err,
                    size_t errlen)
{
    KV_ASSERT_LOCKED(engine_stripe(e, w->key, w->klen));
    lsm_rec rec = {.key = w->key, .klen = w->klen, .version = version};
    rec.type = w->is_delete ? LSM_DELETE : LSM_PUT;
    rec.value = w->is_delete ? NULL : w->val;
    rec.vlen = w->is_delete ? 0 : w->vlen;
    rec.expire_at = expiry(e, w);
    hr_meta m = {.version = version, .expire_at = rec.expire_at};
    m.flags = HR_F_DIRTY | (w->is_delete ? HR_F_TOMBSTONE : 0);
    if (atomic_load_explicit(&e->npins, memory_order_relaxed) &&
        engine_is_pinned(e, w->key, w->klen))
        m.flags |= HR_F_PINNED;
    const void *val = rec.value ? rec.value : "";
    hr_prep prep = {0};
    pthread_rwlock_rdlock(&e->apply_lock);
    rec.seqno = m.seqno = atomic_fetch_add(&e->next_seqno, 1);
    kv_err rv = hr_prepare(e->idx, w->key, w->klen, val, rec.vlen, &m, &prep);
    if (rv != KV_OK) {
        pthread_rwlock_unlock(&e->apply_lock);
        snprintf(err, errlen, "memory tier: %s", kv_strerror(rv));
        return rv;
    }
    rv = e->st->wal_append(e->db, &rec, 1);
    if (rv != KV_OK) {
        pthread_rwlock_unlock(&e->apply_lock);
        hr_prep_release(&prep);
        engine_bg_request_flush(e); /* frees WAL space, or heals a WAL after a failed fsync */
        snprintf(err, errlen, "%s",
                 rv == KV_RESOURCE_EXHAUSTED ? "the fast volume is full (WAL append failed)"
                                             : "WAL append failed (I/O error, see the log)");
        return rv;
    }
    kv_atomic_max(&e->max_version, version); /* logged: it is stored, whatever memory says */
    put_acct a = {.version = version};
    rv = hr_upsert_prepared(e->idx, w->key, w->klen, val, rec.vlen, &m, newer_cond, &a, &prep);
    pthread_rwlock_unlock(&e->apply_lock);
    /* prepared: newer_cond's SKIP is the only way it does not store */
    KV_ASSERT(rv == KV_OK || rv == SKIP, "memory-tier insert of a logged record: %s",
              kv_strerror(rv));
    if (rv == KV_OK)
        account(e, &a, engine_rec_bytes(w->klen, rec.vlen), true);
    *applied = rv == KV_OK;
    return KV_OK;
}

/* Refuses what the memory tier, the store or the TTL limit cannot take,
 * before any WAL append (a logged record that cannot be replayed stops the
 * restart). */
static kv_err check_write(const engine *e, const engine_write *w, char *err, size_t errlen)
{
    if (!w->key || w->klen == 0 || w->klen > e->st->max_key) {
        snprintf(err, errlen, "key is %zu bytes; the storage engine (%s) takes 1..%zu", w->klen,
                 e->st->name, e->st->max_key);
        return KV_INVALID_ARGUMENT;
    }
    if (!w->is_delete && !w->expire_at)
        return kv_check_ttl(w->ttl_ms, err, errlen);
    return KV_OK;
}

/* engine_write_one, or with mem_only engine_write_mem: then every wait
 * engine_write_one may make declines the write (*declined, nothing done or
 * counted) before anything is changed. */
static kv_err write_run(engine *e, const engine_write *w, engine_result *out, bool mem_only,
                        bool *declined, char *err, size_t errlen)
{
    kv_err rv = check_write(e, w, err, errlen);
    if (rv != KV_OK)
        return rv;
    if (mem_only && (e->o.sync == ENGINE_SYNC_ALWAYS || engine_full(e))) {
        *declined = true; /* an fsync, or engine_wait_room, would wait */
        return KV_OK;
    }
    pthread_mutex_t *stripe = engine_stripe(e, w->key, w->klen);
    if (mem_only) {
        if (pthread_mutex_trylock(stripe) != 0) {
            *declined = true;
            return KV_OK;
        }
    } else {
        rv = engine_wait_room(e);
        if (rv != KV_OK) {
            snprintf(err, errlen,
                     "write buffer or WAL full: flushing to the fast volume is behind");
            return rv;
        }
        pthread_mutex_lock(stripe);
    }
    /* the version is drawn under the stripe lock: a writer of the same key
     * that drew an older one before has applied it, or LWW drops it (a
     * declined write's drawn version is simply not used) */
    uint64_t version = w->version ? w->version : kv_hlc_now(&e->hlc);
    /* A plain put above every version stored (max_version, raised under
     * this stripe by every earlier write of the key) cannot lose to the
     * key's current record, and needs nothing else of it: it is applied
     * blind. Conditions and a delete's `existed` need the record. */
    bool blind =
        !w->is_delete && !w->if_absent && !w->if_version && version > atomic_load(&e->max_version);
    current c = {0}; /* blind: no record looked at */
    if (blind) {
        atomic_fetch_add_explicit(&e->blind_puts, 1, memory_order_relaxed);
    } else if (mem_only) {
        c.now_ms = engine_now_ms(e);
        if (hr_get(e->idx, w->key, w->klen, cur_visit, &c) != KV_OK) {
            pthread_mutex_unlock(stripe); /* the current record is in the LSM: block reads */
            *declined = true;
            return KV_OK;
        }
    } else {
        rv = find_current(e, w, &c, err, errlen);
    }
    if (w->version)
        kv_hlc_observe(&e->hlc, w->version);
    atomic_fetch_add_explicit(w->is_delete ? &e->deletes : &e->puts, 1, memory_order_relaxed);
    if (rv == KV_OK)
        rv = check_conditions(w, &c, err, errlen);
    engine_result r = {.found = c.live};
    if (rv == KV_OK && c.exists && c.version >= version) {
        r.version = c.version; /* a newer (or the same) write already won: LWW says done */
    } else if (rv == KV_OK) {
        /* a key never seen gets a tombstone too: it outvotes older copies
         * that a stream or a hint may still apply */
        rv = apply(e, w, version, &r.applied, err, errlen);
        r.version = version;
    }
    pthread_mutex_unlock(stripe);
    if (rv != KV_OK)
        return rv;
    if (atomic_load(&e->dirty_bytes) >= e->write_buffer ||
        atomic_load(&e->mem_bytes) > e->mem_limit || engine_wal_due(e))
        engine_bg_kick(e);
    *out = r;
    return KV_OK;
}

kv_err engine_write_one(engine *e, const engine_write *w, engine_result *out, char *err,
                        size_t errlen)
{
    bool declined = false;
    return write_run(e, w, out, false, &declined, err, errlen);
}

kv_err engine_write_mem(engine *e, const engine_write *w, engine_result *out, bool *declined,
                        char *err, size_t errlen)
{
    *declined = false;
    return write_run(e, w, out, true, declined, err, errlen);
}

const char *engine_durability(const engine *e)
{
    return sync_names[e->o.sync];
}

const char *engine_name(const engine *e)
{
    return e->st->name;
}

size_t engine_max_key(const engine *e)
{
    return e->st->max_key;
}

int engine_key_cmp(const engine *e, const void *a, size_t al, const void *b, size_t bl)
{
    uint64_t oa = e->st->order(e->db, a, al), ob = e->st->order(e->db, b, bl);
    if (oa != ob)
        return oa < ob ? -1 : 1;
    return lsm_key_cmp(a, al, b, bl);
}

kv_hlc *engine_hlc(engine *e)
{
    return &e->hlc;
}

/* ---- pins (cluster hot-key hints) -------------------------------------- */

static uint64_t pin_hash(const void *key, size_t klen)
{
    uint64_t h = kv_hash64(key, klen, 0x51ed27a1ull);
    return h < 2 ? h + 2 : h; /* 0 and 1 mark empty and removed slots */
}

/* Slot of h, or of the first free slot on its probe path; caller locks. */
static uint64_t *pin_slot(engine *e, uint64_t h, bool for_insert)
{
    KV_ASSERT_RDLOCKED(&e->pin_lock);
    size_t n = ENGINE_MAX_PINS * 2, i = h % n;
    uint64_t *free_slot = NULL;
    for (size_t k = 0; k < n; k++, i = (i + 1) % n) {
        if (e->pins[i] == h)
            return &e->pins[i];
        if (e->pins[i] == 1 && !free_slot)
            free_slot = &e->pins[i];
        if (e->pins[i] == 0)
            return for_insert ? (free_slot ? free_slot : &e->pins[i]) : NULL;
    }
    return for_insert ? free_slot : NULL;
}

bool engine_is_pinned(engine *e, const void *key, size_t klen)
{
    uint64_t h = pin_hash(key, klen);
    pthread_rwlock_rdlock(&e->pin_lock);
    bool on = pin_slot(e, h, false) != NULL;
    pthread_rwlock_unlock(&e->pin_lock);
    return on;
}

static kv_err pin_set(engine *e, uint64_t h, bool on)
{
    kv_err rv = KV_OK;
    pthread_rwlock_wrlock(&e->pin_lock);
    uint64_t *slot = pin_slot(e, h, on);
    if (on && slot && *slot != h) {
        if (atomic_load(&e->npins) >= ENGINE_MAX_PINS) {
            rv = KV_RESOURCE_EXHAUSTED;
        } else {
            *slot = h;
            atomic_fetch_add(&e->npins, 1);
        }
    } else if (on && !slot) {
        rv = KV_RESOURCE_EXHAUSTED;
    } else if (!on && slot) {
        *slot = 1;
        atomic_fetch_sub(&e->npins, 1);
    }
    pthread_rwlock_unlock(&e->pin_lock);
    return rv;
}

typedef struct seq_view {
    bool found;
    uint64_t seqno;
} seq_view;

static void seq_visit(void *arg, const hr_view *v)
{
    seq_view *s = arg;
    s->found = true;
    s->seqno = v->meta.seqno;
}

/* Loads key's record from the LSM into memory (clean) when it is absent. */
static kv_err pin_load(engine *e, const void *key, size_t klen)
{
    uint64_t gen = e->st->flush_generation(e->db);
    lsm_rec rec;
    kv_err rv = e->st->get(e->db, key, klen, &rec, NULL);
    if (rv != KV_OK)
        return rv;
    hr_meta m = {.version = rec.version, .seqno = rec.seqno, .expire_at = rec.expire_at};
    m.flags = HR_F_PINNED | (rec.type == LSM_DELETE ? HR_F_TOMBSTONE : 0);
    fill_state f = {e, gen};
    if (hr_upsert(e->idx, key, klen, rec.value ? rec.value : "", rec.vlen, &m, fill_cond, &f) ==
        KV_OK)
        atomic_fetch_add(&e->mem_bytes, engine_rec_bytes(klen, rec.vlen));
    lsm_rec_free(&rec);
    return KV_OK;
}

kv_err engine_pin(engine *e, const void *key, size_t klen, bool on)
{
    kv_err rv = pin_set(e, pin_hash(key, klen), on);
    if (rv != KV_OK || !on) {
        for (int tries = 0; !on && tries < 4; tries++) { /* clear the item's flag */
            seq_view s = {0};
            if (hr_get(e->idx, key, klen, seq_visit, &s) != KV_OK ||
                hr_set_flags(e->idx, key, klen, s.seqno, 0, HR_F_PINNED) != KV_FAILED_PRECONDITION)
                break;
        }
        return rv;
    }
    seq_view s = {0};
    if (hr_get(e->idx, key, klen, seq_visit, &s) != KV_OK && (rv = pin_load(e, key, klen)) != KV_OK)
        return rv;
    return hr_pin(e->idx, key, klen);
}
