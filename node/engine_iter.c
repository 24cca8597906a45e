/* SPDX-License-Identifier: MIT */
/*
 * Engine-wide operations over every record: the iterator (the memory tier's
 * dirty records merged over an LSM iterator, newest record per key), the
 * cleanup of keys the node no longer owns, the WAL sync, and the size
 * estimate. Streams and repair (DESIGN.md §4) are built on these.
 *
 * Why the iterator snapshots memory first and pins the LSM version second:
 * a record present at open time is either dirty in the memory tier or in an
 * SST. A flush installs its SST (a new version) before it clears the dirty
 * bits of what it wrote (engine_bg.c). So a record that the memory scan did
 * not see as dirty had been flushed, or was being flushed, with its SST
 * installed before its bit was cleared, hence before the version is pinned
 * (after the scan): it is in the pinned version. In the other order, a flush
 * running between the pin and the scan would install an SST the iterator
 * does not see and clear the bits the scan looks for: its records would be
 * missed. Compactions and promotions never lose the newest record of a key
 * from a version, so whatever the version holds stays readable through it.
 * Clean items are copies of SST records and are not scanned.
 *
 * A key both dirty in the snapshot and in the LSM comes out once: the
 * record with the higher seqno (the dirty one, unless it was flushed and
 * overwritten again, and that newer write flushed, between the scan and the
 * pin).
 *
 * Over kallax (engine_store.c) the same order of steps holds with "pins the
 * version" read as "opens the store's iterator": kallax pins nothing, but a
 * flush writes its blocks before the dirty bits are cleared, and a record
 * stored when its iterator opens is returned (kallax.h: records only move
 * forward in their probe window), so a record the scan did not see as dirty
 * is found in the blocks (or a newer flushed version of its key). The merge
 * runs in the store's order, engine_key_cmp: (home block, key) for kallax.
 */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "node/engine_int.h"

/* A dirty record copied from the memory tier: key then value in one
 * allocation. rejected: the filter refused the key (no value copied); the
 * LSM's records of the key are skipped without asking the filter again. */
typedef struct mem_rec {
    uint8_t *buf;
    size_t klen, vlen;
    uint64_t order; /* engine_store.order of the key */
    uint64_t version, seqno, expire_at;
    bool tombstone, rejected;
} mem_rec;

struct engine_iter {
    engine *e;
    engine_key_filter filter;
    void *filter_arg;
    mem_rec *mem; /* sorted by key, one per key */
    size_t nmem, mi;
    void *li;              /* the store's iterator */
    bool adv_mem, adv_lsm; /* the record returned last: move past it on the next call */
    uint64_t scanned;
    kv_err err; /* sticky */
};

/* ---- the memory snapshot ---- */

/* p (n elements of size used, *cap allocated) with room for one more:
 * the same or a grown array, NULL when out of memory (p unchanged). */
static void *grow(void *p, size_t *cap, size_t n, size_t size)
{
    if (n < *cap)
        return p;
    size_t ncap = *cap ? *cap * 2 : 256;
    void *q = realloc(p, ncap * size);
    if (q)
        *cap = ncap;
    return q;
}

typedef struct snap {
    engine *e;
    const engine_iter_opts *o;
    mem_rec *r;
    size_t n, cap;
    bool oom;
} snap;

static void snap_visit(void *arg, const hr_view *v)
{
    snap *s = arg;
    const engine_iter_opts *o = s->o;
    if (s->oom || !(v->meta.flags & HR_F_DIRTY))
        return;
    if (o->after && engine_key_cmp(s->e, v->key, v->klen, o->after, o->after_len) <= 0)
        return;
    mem_rec *r = grow(s->r, &s->cap, s->n, sizeof(*r));
    if (!r) {
        s->oom = true;
        return;
    }
    s->r = r;
    bool keep = !o->filter || o->filter(o->filter_arg, v->key, v->klen);
    bool tomb = v->meta.flags & HR_F_TOMBSTONE;
    size_t vlen = keep && !tomb ? v->vlen : 0;
    uint8_t *buf = malloc(v->klen + vlen + 1);
    if (!buf) {
        s->oom = true;
        return;
    }
    memcpy(buf, v->key, v->klen);
    if (vlen)
        memcpy(buf + v->klen, v->val, vlen);
    s->r[s->n++] = (mem_rec){.buf = buf,
                             .klen = v->klen,
                             .vlen = vlen,
                             .order = s->e->st->order(s->e->db, v->key, v->klen),
                             .version = v->meta.version,
                             .seqno = v->meta.seqno,
                             .expire_at = v->meta.expire_at,
                             .tombstone = tomb,
                             .rejected = !keep};
}

/* (order, key) of two snapshot records. */
static int mem_key_cmp(const mem_rec *x, const mem_rec *y)
{
    if (x->order != y->order)
        return x->order < y->order ? -1 : 1;
    return lsm_key_cmp(x->buf, x->klen, y->buf, y->klen);
}

/* Key ascending (in the store's order), then seqno descending. */
static int mem_cmp(const void *a, const void *b)
{
    const mem_rec *x = a, *y = b;
    int c = mem_key_cmp(x, y);
    if (c)
        return c;
    return x->seqno > y->seqno ? -1 : x->seqno < y->seqno;
}

/* Fills it->mem with the sorted dirty records (one per key: a key met twice
 * while a writer replaced its item keeps the newer record). */
static kv_err snapshot(engine *e, const engine_iter_opts *o, engine_iter *it)
{
    snap s = {.e = e, .o = o};
    hr_iterate(e->idx, snap_visit, &s);
    it->mem = s.r;
    it->nmem = s.n;
    if (s.oom)
        return KV_RESOURCE_EXHAUSTED;
    if (!s.n)
        return KV_OK;
    qsort(s.r, s.n, sizeof(*s.r), mem_cmp);
    size_t m = 0;
    for (size_t i = 0; i < s.n; i++) {
        if (m && mem_key_cmp(&s.r[m - 1], &s.r[i]) == 0)
            free(s.r[i].buf);
        else
            s.r[m++] = s.r[i];
    }
    it->nmem = m;
    return KV_OK;
}

/* ---- the iterator ---- */

kv_err engine_iter_open(engine *e, const engine_iter_opts *o, engine_iter **out)
{
    static const engine_iter_opts every = {0};
    o = o ? o : &every;
    engine_iter *it = calloc(1, sizeof(*it));
    if (!it)
        return KV_RESOURCE_EXHAUSTED;
    it->e = e;
    it->filter = o->filter;
    it->filter_arg = o->filter_arg;
    kv_err rv = snapshot(e, o, it); /* first: see the top of the file */
    if (rv == KV_OK)
        rv = e->st->iter_open(e->db, &it->li); /* second: pins the version */
    if (rv == KV_OK)
        rv = e->st->iter_seek(it->li, o->after, o->after_len);
    if (rv != KV_OK) {
        engine_iter_close(it);
        return rv;
    }
    *out = it;
    return KV_OK;
}

void engine_iter_close(engine_iter *it)
{
    if (!it)
        return;
    for (size_t i = 0; i < it->nmem; i++)
        free(it->mem[i].buf);
    free(it->mem);
    if (it->li)
        it->e->st->iter_close(it->li);
    free(it);
}

uint64_t engine_iter_scanned(const engine_iter *it)
{
    return it->scanned;
}

static void from_mem(const mem_rec *m, engine_rec *out)
{
    *out = (engine_rec){.key = m->buf,
                        .klen = m->klen,
                        .val = m->tombstone ? NULL : m->buf + m->klen,
                        .vlen = m->vlen,
                        .version = m->version,
                        .expire_at = m->expire_at,
                        .tombstone = m->tombstone};
}

static void from_lsm(const lsm_rec *r, engine_rec *out)
{
    bool tomb = r->type == LSM_DELETE;
    *out = (engine_rec){.key = r->key,
                        .klen = r->klen,
                        .val = tomb ? NULL : r->value,
                        .vlen = tomb ? 0 : r->vlen,
                        .version = r->version,
                        .expire_at = r->expire_at,
                        .tombstone = tomb};
}

/* Moves past the record returned by the previous call. */
static kv_err advance(engine_iter *it)
{
    kv_err rv = it->adv_lsm ? it->e->st->iter_next(it->li) : KV_OK;
    it->mi += it->adv_mem;
    it->adv_mem = it->adv_lsm = false;
    return rv;
}

/* One step of the merge: KV_OK with *out, NOT_FOUND at the end, or
 * KV_ABORTED when the key was filtered out (the caller steps again). */
static kv_err step(engine_iter *it, engine_rec *out)
{
    const mem_rec *m = it->mi < it->nmem ? &it->mem[it->mi] : NULL;
    const lsm_rec *l = it->e->st->iter_rec(it->li);
    if (!m && !l)
        return KV_NOT_FOUND;
    int c = !m ? 1 : !l ? -1 : engine_key_cmp(it->e, m->buf, m->klen, l->key, l->klen);
    it->scanned++;
    it->adv_mem = c <= 0;
    it->adv_lsm = c >= 0;
    if (c <= 0 && m->rejected)
        return KV_ABORTED;
    if (c > 0 && it->filter && !it->filter(it->filter_arg, l->key, l->klen))
        return KV_ABORTED;
    if (c < 0 || (c == 0 && m->seqno >= l->seqno)) /* the dirty record is the newer write */
        from_mem(m, out);
    else
        from_lsm(l, out);
    return KV_OK;
}

kv_err engine_iter_next(engine_iter *it, engine_rec *out)
{
    kv_err rv = it->err;
    engine_rec r;
    do {
        if (rv == KV_OK || rv == KV_ABORTED)
            rv = advance(it);
        if (rv == KV_OK)
            rv = step(it, &r);
    } while (rv == KV_ABORTED);
    if (rv != KV_OK && rv != KV_NOT_FOUND)
        it->err = rv;
    if (rv == KV_OK)
        *out = r;
    return rv;
}

/* ---- cleanup ---- */

typedef struct victim {
    uint8_t *key;
    size_t klen;
    uint64_t seqno;
} victim;

typedef struct sweep {
    engine_key_filter keep;
    void *arg;
    victim *v;
    size_t n, cap;
    bool oom;
} sweep;

static void sweep_visit(void *arg, const hr_view *v)
{
    sweep *s = arg;
    if (s->oom || (v->meta.flags & HR_F_DIRTY) || s->keep(s->arg, v->key, v->klen))
        return;
    victim *nv = grow(s->v, &s->cap, s->n, sizeof(*nv));
    uint8_t *k = nv ? malloc(v->klen) : NULL;
    if (nv)
        s->v = nv;
    if (!k) {
        s->oom = true;
        return;
    }
    memcpy(k, v->key, v->klen);
    s->v[s->n++] = (victim){k, v->klen, v->meta.seqno};
}

typedef struct drop_arg {
    uint64_t seqno, bytes;
} drop_arg;

/* Removes the picked item only while it is the same clean record (pinned
 * or not: a pinned copy of a dropped record must go too). */
static kv_err drop_cond(void *arg, const hr_view *cur)
{
    drop_arg *a = arg;
    if (!cur || (cur->meta.flags & HR_F_DIRTY) || cur->meta.seqno != a->seqno)
        return KV_ALREADY_EXISTS;
    a->bytes = engine_rec_bytes(cur->klen, cur->vlen);
    return KV_OK;
}

/* Removes the clean memory items of the keys keep rejects. */
static kv_err drop_clean(engine *e, engine_key_filter keep, void *arg)
{
    sweep s = {.keep = keep, .arg = arg};
    hr_iterate(e->idx, sweep_visit, &s);
    for (size_t i = 0; i < s.n; i++) {
        drop_arg a = {s.v[i].seqno, 0};
        if (hr_remove(e->idx, s.v[i].key, s.v[i].klen, drop_cond, &a) == KV_OK)
            atomic_fetch_sub(&e->mem_bytes, a.bytes);
        free(s.v[i].key);
    }
    free(s.v);
    return s.oom ? KV_RESOURCE_EXHAUSTED : KV_OK;
}

kv_err engine_cleanup(engine *e, engine_key_filter keep, void *arg, uint64_t *dropped,
                      uint64_t *kept)
{
    if (!keep)
        return KV_INVALID_ARGUMENT;
    uint64_t d = 0, recs, bytes;
    kv_err rv = engine_flush(e);
    if (rv == KV_OK)
        rv = drop_clean(e, keep, arg);
    if (rv == KV_OK)
        rv = e->st->cleanup(e->db, keep, arg, &d);
    if (rv == KV_OK) /* fills that raced the compaction (it bumped the flush generation) */
        rv = drop_clean(e, keep, arg);
    if (rv != KV_OK) {
        KV_WARN("engine", "cleanup failed: %s", kv_strerror(rv));
        return rv;
    }
    e->st->estimate(e->db, &recs, &bytes);
    KV_INFO("engine", "cleanup: %llu records dropped, %llu kept", (unsigned long long)d,
            (unsigned long long)recs);
    if (dropped)
        *dropped = d;
    if (kept)
        *kept = recs + atomic_load(&e->dirty_items);
    return KV_OK;
}

/* ---- durability and size ---- */

kv_err engine_wal_sync(engine *e)
{
    return e->st->wal_sync(e->db);
}

void engine_estimate(engine *e, uint64_t *keys, uint64_t *bytes)
{
    uint64_t recs, sst_bytes;
    e->st->estimate(e->db, &recs, &sst_bytes);
    uint64_t items = atomic_load(&e->dirty_items), dirty = atomic_load(&e->dirty_bytes);
    uint64_t overhead = items * ENGINE_ITEM_OVERHEAD;
    *keys = recs + items;
    *bytes = sst_bytes + (dirty > overhead ? dirty - overhead : 0);
}
