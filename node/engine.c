/* SPDX-License-Identifier: MIT */
/*
 * Engine: point reads and writes over the HotRing memory tier, with the
 * wire contract's semantics. Every decision about an existing record (LWW,
 * if_absent, if_version) is taken inside hr_upsert's condition callback, so
 * it is atomic with the write that follows: a concurrent writer forces the
 * index to re-run the condition against the record that won.
 */
#include "node/engine.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/index/hotring.h"

#define ITEM_OVERHEAD 64u /* per-item bytes beyond key and value, for the budget */

struct engine {
    hr_index *idx;
    kv_hlc hlc;
    uint64_t mem_limit;
    _Atomic uint64_t mem_bytes;
    _Atomic uint64_t gets, puts, deletes;
};

void engine_thread_register(void)
{
    hr_thread_register();
}

void engine_thread_unregister(void)
{
    hr_thread_unregister();
}

kv_err engine_open(engine **out, const engine_opts *opts, char *err, size_t errlen)
{
    engine *e = calloc(1, sizeof(*e));
    if (!e)
        return KV_RESOURCE_EXHAUSTED;
    e->mem_limit = (uint64_t)(opts->mem_mb ? opts->mem_mb : 256) << 20;
    hr_opts ho = {0};
    /* About one bucket per 8 items of ~128 bytes: rehash grows it from there. */
    ho.buckets = opts->index_buckets ? opts->index_buckets : e->mem_limit / 1024;
    if (ho.buckets < 1024)
        ho.buckets = 1024;
    ho.mode = HR_MODE_SAMPLE;
    ho.r = 5;
    ho.rehash = true;
    kv_err rv = hr_open(&e->idx, &ho);
    if (rv != KV_OK) {
        snprintf(err, errlen, "cannot create the HotRing index: %s", kv_strerror(rv));
        free(e);
        return rv;
    }
    *out = e;
    return KV_OK;
}

void engine_close(engine *e)
{
    if (!e)
        return;
    hr_close(e->idx);
    free(e);
}

static bool is_live(const hr_view *v, uint64_t now_ms)
{
    if (v->meta.flags & HR_F_TOMBSTONE)
        return false;
    return v->meta.expire_at == 0 || v->meta.expire_at > now_ms;
}

typedef struct get_state {
    uint64_t now_ms;
    engine_result *out;
    bool oom;
} get_state;

static void get_visit(void *arg, const hr_view *v)
{
    get_state *g = arg;
    if (!is_live(v, g->now_ms))
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
    g->out->version = v->meta.version;
}

kv_err engine_get(engine *e, const void *key, size_t klen, engine_result *out)
{
    engine_result r = {0};
    get_state g = {kv_wall_ms(), &r, false};
    atomic_fetch_add_explicit(&e->gets, 1, memory_order_relaxed);
    kv_err rv = hr_get(e->idx, key, klen, get_visit, &g);
    if (rv != KV_OK && rv != KV_NOT_FOUND)
        return rv;
    if (g.oom)
        return KV_RESOURCE_EXHAUSTED;
    *out = r;
    return KV_OK;
}

/* State shared with the write condition; re-filled on every (re)run. */
typedef struct write_state {
    const engine_write *w;
    uint64_t version, now_ms;
    uint64_t old_bytes; /* bytes of the record replaced */
    uint64_t current;   /* version of the record that won, when superseded */
    bool existed_live;
    char *err;
    size_t errlen;
} write_state;

static uint64_t view_bytes(const hr_view *v)
{
    return v ? v->klen + v->vlen + ITEM_OVERHEAD : 0;
}

static kv_err write_cond(void *arg, const hr_view *cur)
{
    write_state *s = arg;
    const engine_write *w = s->w;
    bool live = cur && is_live(cur, s->now_ms);
    s->old_bytes = view_bytes(cur);
    s->existed_live = live;
    if (w->if_absent && live) {
        snprintf(s->err, s->errlen, "key exists (if_absent)");
        return KV_ALREADY_EXISTS;
    }
    if (w->if_version && (!live || cur->meta.version != w->if_version)) {
        snprintf(s->err, s->errlen, "version mismatch (if_version %llu, current %llu)",
                 (unsigned long long)w->if_version,
                 (unsigned long long)(live ? cur->meta.version : 0));
        return KV_FAILED_PRECONDITION;
    }
    if (cur && cur->meta.version >= s->version) {
        s->current = cur->meta.version; /* a newer (or the same) write already won */
        return KV_ABORTED;
    }
    return KV_OK;
}

kv_err engine_write_one(engine *e, const engine_write *w, engine_result *out, char *err,
                        size_t errlen)
{
    write_state s = {.w = w, .now_ms = kv_wall_ms(), .err = err, .errlen = errlen};
    if (w->version) {
        kv_hlc_observe(&e->hlc, w->version);
        s.version = w->version;
    } else {
        s.version = kv_hlc_now(&e->hlc);
    }
    uint64_t new_bytes = w->klen + (w->is_delete ? 0 : w->vlen) + ITEM_OVERHEAD;
    if (atomic_load_explicit(&e->mem_bytes, memory_order_relaxed) + new_bytes > e->mem_limit &&
        !w->is_delete) {
        snprintf(err, errlen, "memory tier is full (mem-mb budget of %llu MiB)",
                 (unsigned long long)(e->mem_limit >> 20));
        return KV_RESOURCE_EXHAUSTED;
    }
    hr_meta meta = {.version = s.version};
    meta.expire_at = w->ttl_ms && !w->is_delete ? s.now_ms + w->ttl_ms : 0;
    meta.flags = HR_F_DIRTY | (w->is_delete ? HR_F_TOMBSTONE : 0);
    atomic_fetch_add_explicit(w->is_delete ? &e->deletes : &e->puts, 1, memory_order_relaxed);
    kv_err rv = hr_upsert(e->idx, w->key, w->klen, w->is_delete ? "" : w->val,
                          w->is_delete ? 0 : w->vlen, &meta, write_cond, &s);
    engine_result r = {0};
    if (rv == KV_ABORTED) { /* superseded by a newer version: LWW says done */
        r.version = s.current;
        r.found = s.existed_live;
        *out = r;
        return KV_OK;
    }
    if (rv != KV_OK)
        return rv;
    atomic_fetch_add_explicit(&e->mem_bytes, new_bytes, memory_order_relaxed);
    atomic_fetch_sub_explicit(&e->mem_bytes, s.old_bytes, memory_order_relaxed);
    r.version = s.version;
    r.found = s.existed_live;
    *out = r;
    return KV_OK;
}

void engine_get_stats(engine *e, engine_stats *out)
{
    hr_stats hs;
    hr_get_stats(e->idx, &hs);
    engine_stats s = {0};
    s.items = hs.items;
    s.mem_bytes = atomic_load(&e->mem_bytes);
    s.mem_limit = e->mem_limit;
    s.gets = atomic_load(&e->gets);
    s.puts = atomic_load(&e->puts);
    s.deletes = atomic_load(&e->deletes);
    s.index_reads = hs.reads;
    s.index_visited = hs.read_visited;
    s.index_head_hits = hs.head_hits;
    s.index_head_moves = hs.head_moves;
    s.index_sample_rounds = hs.sample_rounds;
    s.index_rehashes = hs.rehashes;
    s.index_buckets = hs.buckets;
    *out = s;
}

const char *engine_durability(const engine *e)
{
    (void)e;
    return "none";
}

kv_hlc *engine_hlc(engine *e)
{
    return &e->hlc;
}
