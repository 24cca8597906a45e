/* SPDX-License-Identifier: MIT */
/*
 * Space-Saving top-K sketch and its per-thread window (see hotkeys.h for the
 * algorithm and the bounds kept). Layout: K entries, a linear-probing hash
 * table (load <= 1/2, backward-shift deletion, no tombstones) from key to
 * entry, and a binary min-heap of entries by count. An update of a monitored
 * key is one probe and a sift-down; a new key when full replaces the heap
 * root in place: O(log K) either way, no allocation once key buffers have
 * grown to the keys seen.
 */
#include "shard/hotkeys.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"

#define HK_SEED 0x9e3779b97f4a7c15ull /* independent of the ring's seed 0 */
#define EMPTY 0u                      /* table slots hold entry index + 1 */

typedef struct hk_ent {
    uint64_t hash;
    uint64_t count;
    uint64_t error;
    uint8_t *key;
    uint32_t klen;
    uint32_t kcap;
    uint32_t heap_pos;
} hk_ent;

struct hk_sketch {
    size_t k;
    size_t size;
    hk_ent *ents;    /* ents[0..size) in use */
    uint32_t *heap;  /* entry indices, min count at heap[0] */
    uint32_t *table; /* mask + 1 slots */
    size_t mask;
    uint64_t floor;
    uint64_t total;
};

/* ---- hash table ---- */

/* Returns the slot holding key, or (found = false) the empty slot where the
 * probe for it ended. */
static size_t table_find(const hk_sketch *s, const void *key, size_t len, uint64_t h, bool *found)
{
    size_t i = h & s->mask;
    for (; s->table[i] != EMPTY; i = (i + 1) & s->mask) {
        const hk_ent *e = &s->ents[s->table[i] - 1];
        if (e->hash == h && e->klen == len && memcmp(e->key, key, len) == 0) {
            *found = true;
            return i;
        }
    }
    *found = false;
    return i;
}

static size_t table_slot_of(const hk_sketch *s, uint32_t idx)
{
    size_t i = s->ents[idx].hash & s->mask;
    while (s->table[i] != idx + 1)
        i = (i + 1) & s->mask;
    return i;
}

/* Backward-shift deletion (Knuth 6.4, algorithm R). */
static void table_delete(hk_sketch *s, size_t i)
{
    size_t j = i;
    s->table[i] = EMPTY;
    for (;;) {
        j = (j + 1) & s->mask;
        if (s->table[j] == EMPTY)
            return;
        size_t home = s->ents[s->table[j] - 1].hash & s->mask;
        /* The entry at j may fill the hole at i unless its home lies
         * cyclically in (i, j]. */
        bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            s->table[i] = s->table[j];
            s->table[j] = EMPTY;
            i = j;
        }
    }
}

/* ---- min-heap by count ---- */

static void heap_set(hk_sketch *s, size_t pos, uint32_t idx)
{
    s->heap[pos] = idx;
    s->ents[idx].heap_pos = (uint32_t)pos;
}

static void sift_up(hk_sketch *s, size_t pos)
{
    uint32_t idx = s->heap[pos];
    uint64_t c = s->ents[idx].count;
    while (pos > 0) {
        size_t parent = (pos - 1) / 2;
        if (s->ents[s->heap[parent]].count <= c)
            break;
        heap_set(s, pos, s->heap[parent]);
        pos = parent;
    }
    heap_set(s, pos, idx);
}

static void sift_down(hk_sketch *s, size_t pos)
{
    uint32_t idx = s->heap[pos];
    uint64_t c = s->ents[idx].count;
    for (;;) {
        size_t child = 2 * pos + 1;
        if (child >= s->size)
            break;
        if (child + 1 < s->size &&
            s->ents[s->heap[child + 1]].count < s->ents[s->heap[child]].count)
            child++;
        if (s->ents[s->heap[child]].count >= c)
            break;
        heap_set(s, pos, s->heap[child]);
        pos = child;
    }
    heap_set(s, pos, idx);
}

/* ---- sketch ---- */

kv_err hk_sketch_create(hk_sketch **out, size_t k)
{
    if (k == 0)
        k = HK_DEFAULT_K;
    if (k > HK_MAX_K)
        return KV_INVALID_ARGUMENT;
    size_t cap = 16;
    while (cap < 2 * k)
        cap *= 2;
    hk_sketch *s = calloc(1, sizeof *s);
    if (s != NULL) {
        s->ents = calloc(k, sizeof *s->ents);
        s->heap = malloc(k * sizeof *s->heap);
        s->table = calloc(cap, sizeof *s->table);
    }
    if (s == NULL || s->ents == NULL || s->heap == NULL || s->table == NULL) {
        hk_sketch_destroy(s);
        return KV_RESOURCE_EXHAUSTED;
    }
    s->k = k;
    s->mask = cap - 1;
    *out = s;
    return KV_OK;
}

void hk_sketch_destroy(hk_sketch *s)
{
    if (s == NULL)
        return;
    for (size_t i = 0; s->ents != NULL && i < s->k; i++)
        free(s->ents[i].key);
    free(s->ents);
    free(s->heap);
    free(s->table);
    free(s);
}

void hk_sketch_reset(hk_sketch *s)
{
    memset(s->table, 0, (s->mask + 1) * sizeof *s->table);
    s->size = 0;
    s->floor = 0;
    s->total = 0;
}

/* Makes room for len bytes in e's key buffer; keeps the old one on failure. */
static kv_err key_reserve(hk_ent *e, size_t len)
{
    if (e->kcap >= len)
        return KV_OK;
    size_t cap = len < 32 ? 32 : len;
    uint8_t *p = malloc(cap);
    if (p == NULL)
        return KV_RESOURCE_EXHAUSTED;
    free(e->key);
    e->key = p;
    e->kcap = (uint32_t)cap;
    return KV_OK;
}

static void ent_set(hk_ent *e, const void *key, size_t len, uint64_t h, uint64_t count,
                    uint64_t error)
{
    memcpy(e->key, key, len);
    e->klen = (uint32_t)len;
    e->hash = h;
    e->count = count;
    e->error = error;
}

/* A new key while the sketch is full: it replaces the minimum, inheriting
 * the minimum's count as its error. */
static kv_err replace_min(hk_sketch *s, const void *key, size_t len, uint64_t h, uint64_t weight)
{
    uint32_t idx = s->heap[0];
    hk_ent *e = &s->ents[idx];
    kv_err rv = key_reserve(e, len);
    if (rv != KV_OK)
        return rv;
    uint64_t min = e->count;
    table_delete(s, table_slot_of(s, idx));
    bool found;
    size_t slot = table_find(s, key, len, h, &found);
    ent_set(e, key, len, h, min + weight, min);
    s->table[slot] = idx + 1;
    if (min > s->floor) /* the evicted key's weight was at most min */
        s->floor = min;
    sift_down(s, 0);
    return KV_OK;
}

kv_err hk_sketch_add(hk_sketch *s, const void *key, size_t len, uint64_t weight)
{
    if (len == 0 || len > HK_MAX_KEY || weight == 0)
        return KV_INVALID_ARGUMENT;
    uint64_t h = kv_hash64(key, len, HK_SEED);
    bool found;
    size_t slot = table_find(s, key, len, h, &found);
    kv_err rv = KV_OK;
    if (found) {
        hk_ent *e = &s->ents[s->table[slot] - 1];
        e->count += weight;
        sift_down(s, e->heap_pos);
    } else if (s->size < s->k) {
        uint32_t idx = (uint32_t)s->size;
        hk_ent *e = &s->ents[idx];
        if ((rv = key_reserve(e, len)) != KV_OK)
            return rv;
        ent_set(e, key, len, h, s->floor + weight, s->floor);
        s->table[slot] = idx + 1;
        s->size++;
        heap_set(s, s->size - 1, idx);
        sift_up(s, s->size - 1);
    } else if ((rv = replace_min(s, key, len, h, weight)) != KV_OK) {
        return rv;
    }
    s->total += weight;
    return KV_OK;
}

bool hk_sketch_estimate(const hk_sketch *s, const void *key, size_t len, uint64_t *count,
                        uint64_t *error)
{
    bool found = false;
    size_t slot = 0;
    if (len > 0 && len <= HK_MAX_KEY)
        slot = table_find(s, key, len, kv_hash64(key, len, HK_SEED), &found);
    const hk_ent *e = found ? &s->ents[s->table[slot] - 1] : NULL;
    *count = e ? e->count : s->floor;
    *error = e ? e->error : s->floor;
    return found;
}

/* Ranking: guaranteed desc, count desc, key bytes asc. < 0 when a is better. */
static int rank_cmp(uint64_t ga, uint64_t ca, const uint8_t *ka, size_t la, uint64_t gb,
                    uint64_t cb, const uint8_t *kb, size_t lb)
{
    if (ga != gb)
        return ga > gb ? -1 : 1;
    if (ca != cb)
        return ca > cb ? -1 : 1;
    int c = memcmp(ka, kb, la < lb ? la : lb);
    if (c != 0)
        return c;
    return (la > lb) - (la < lb);
}

static int entry_cmp(const hk_entry *a, const hk_entry *b)
{
    return rank_cmp(a->guaranteed, a->count, a->key, a->klen, b->guaranteed, b->count, b->key,
                    b->klen);
}

static int entry_qsort_cmp(const void *a, const void *b)
{
    return entry_cmp(a, b);
}

/* Restores the heap property of out[0..n) at pos, worst-ranked at the root. */
static void worst_heap_down(hk_entry *out, size_t n, size_t pos)
{
    for (;;) {
        size_t c = 2 * pos + 1;
        if (c >= n)
            return;
        if (c + 1 < n && entry_cmp(&out[c + 1], &out[c]) > 0)
            c++;
        if (entry_cmp(&out[c], &out[pos]) <= 0)
            return;
        hk_entry t = out[c];
        out[c] = out[pos];
        out[pos] = t;
        pos = c;
    }
}

size_t hk_sketch_topk(const hk_sketch *s, hk_entry *out, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < s->size && max > 0; i++) {
        const hk_ent *e = &s->ents[i];
        hk_entry x = {e->key, e->klen, e->count, e->error, e->count - e->error};
        if (n < max) {
            out[n++] = x;
            if (n == max) /* heapify the selection: worst at out[0] */
                for (size_t p = n / 2; p-- > 0;)
                    worst_heap_down(out, n, p);
        } else if (entry_cmp(&x, &out[0]) < 0) {
            out[0] = x;
            worst_heap_down(out, n, 0);
        }
    }
    if (n > 1)
        qsort(out, n, sizeof *out, entry_qsort_cmp);
    return n;
}

size_t hk_sketch_capacity(const hk_sketch *s)
{
    return s->k;
}

size_t hk_sketch_size(const hk_sketch *s)
{
    return s->size;
}

uint64_t hk_sketch_total(const hk_sketch *s)
{
    return s->total;
}

uint64_t hk_sketch_floor(const hk_sketch *s)
{
    return s->floor;
}

/* ---- merge ---- */

typedef struct hk_cand {
    uint64_t count;
    uint64_t error;
    const hk_ent *ent; /* the dst or src entry the key comes from */
    bool from_src;
} hk_cand;

static const hk_ent *find_ent(const hk_sketch *s, const hk_ent *like)
{
    bool found;
    size_t slot = table_find(s, like->key, like->klen, like->hash, &found);
    return found ? &s->ents[s->table[slot] - 1] : NULL;
}

static int cand_cmp(const void *a, const void *b)
{
    const hk_cand *x = a, *y = b;
    if (x->count != y->count)
        return x->count > y->count ? -1 : 1;
    return rank_cmp(x->count - x->error, x->count, x->ent->key, x->ent->klen, y->count - y->error,
                    y->count, y->ent->key, y->ent->klen);
}

/* Every key of dst or src with its merged count and error; returns the
 * number of candidates written to c (room for dst->size + src->size). */
static size_t merge_candidates(const hk_sketch *dst, const hk_sketch *src, hk_cand *c)
{
    size_t n = 0;
    for (size_t i = 0; i < dst->size; i++) {
        const hk_ent *d = &dst->ents[i], *o = find_ent(src, d);
        c[n++] = (hk_cand){d->count + (o ? o->count : src->floor),
                           d->error + (o ? o->error : src->floor), d, false};
    }
    for (size_t i = 0; i < src->size; i++) {
        const hk_ent *o = &src->ents[i];
        if (find_ent(dst, o) == NULL)
            c[n++] = (hk_cand){o->count + dst->floor, o->error + dst->floor, o, true};
    }
    return n;
}

/* Builds the kept entries into ne (k zeroed entries), copying keys that come
 * from src. On failure frees those copies and leaves dst untouched. */
static kv_err merge_build(hk_ent *ne, const hk_cand *c, size_t keep)
{
    for (size_t i = 0; i < keep; i++) {
        ne[i] = (hk_ent){.hash = c[i].ent->hash, .count = c[i].count, .error = c[i].error};
        if (!c[i].from_src)
            continue;
        if (key_reserve(&ne[i], c[i].ent->klen) != KV_OK) {
            for (size_t j = 0; j < i; j++)
                if (c[j].from_src)
                    free(ne[j].key);
            return KV_RESOURCE_EXHAUSTED;
        }
        memcpy(ne[i].key, c[i].ent->key, c[i].ent->klen);
        ne[i].klen = c[i].ent->klen;
    }
    return KV_OK;
}

/* Moves dst's surviving key buffers into ne, frees the rest, installs ne and
 * rebuilds the table and the heap. */
static void merge_install(hk_sketch *dst, hk_ent *ne, const hk_cand *c, size_t keep)
{
    for (size_t i = 0; i < keep; i++) {
        if (c[i].from_src)
            continue;
        hk_ent *old = &dst->ents[c[i].ent - dst->ents];
        ne[i].key = old->key;
        ne[i].kcap = old->kcap;
        ne[i].klen = old->klen;
        old->key = NULL;
    }
    for (size_t i = 0; i < dst->k; i++)
        free(dst->ents[i].key);
    free(dst->ents);
    dst->ents = ne;
    dst->size = keep;
    memset(dst->table, 0, (dst->mask + 1) * sizeof *dst->table);
    for (size_t i = 0; i < keep; i++) {
        bool found;
        size_t slot = table_find(dst, ne[i].key, ne[i].klen, ne[i].hash, &found);
        dst->table[slot] = (uint32_t)i + 1;
        heap_set(dst, i, (uint32_t)i);
    }
    for (size_t p = keep / 2; p-- > 0;)
        sift_down(dst, p);
}

kv_err hk_sketch_merge(hk_sketch *dst, const hk_sketch *src)
{
    if (dst == src)
        return KV_INVALID_ARGUMENT;
    hk_cand *c = malloc((dst->size + src->size + 1) * sizeof *c);
    hk_ent *ne = calloc(dst->k, sizeof *ne);
    if (c == NULL || ne == NULL) {
        free(c);
        free(ne);
        return KV_RESOURCE_EXHAUSTED;
    }
    size_t n = merge_candidates(dst, src, c);
    qsort(c, n, sizeof *c, cand_cmp);
    size_t keep = n < dst->k ? n : dst->k;
    uint64_t dropped = keep < n ? c[keep].count : 0; /* largest dropped count */
    kv_err rv = merge_build(ne, c, keep);
    if (rv != KV_OK) {
        free(c);
        free(ne);
        return rv;
    }
    merge_install(dst, ne, c, keep);
    free(c);
    uint64_t floor = dst->floor + src->floor;
    dst->floor = dropped > floor ? dropped : floor;
    dst->total += src->total;
    return KV_OK;
}

/* ---- window ---- */

/* One forwarding thread's state, on its own cache lines. */
typedef struct hk_slot {
    _Alignas(64) uint64_t rng; /* owner thread only */
    uint32_t countdown;        /* owner thread only: keys until the next sample */
    pthread_mutex_t mu;        /* guards active, sampled */
    hk_sketch *active;
    hk_sketch *spare; /* rotate thread only */
    uint64_t sampled;
} hk_slot;

struct hk_window {
    size_t nthreads;
    uint32_t every;
    pthread_mutex_t rotate_mu; /* one rotation at a time; guards what follows */
    uint64_t start_ns;
    hk_sketch *acc;
    hk_slot *slots;
};

/* Gap to the next sample: uniform in [1, 2*every - 1], mean `every`. */
static uint32_t next_gap(hk_slot *sl, uint32_t every)
{
    if (every <= 1)
        return 1;
    sl->rng ^= sl->rng << 13; /* xorshift64 */
    sl->rng ^= sl->rng >> 7;
    sl->rng ^= sl->rng << 17;
    return 1 + (uint32_t)(sl->rng % (2ull * every - 1));
}

static kv_err slot_init(hk_slot *sl, size_t i, size_t k, uint32_t every)
{
    memset(sl, 0, sizeof *sl);
    sl->rng = kv_hash64(&i, sizeof i, HK_SEED) | 1;
    sl->countdown = next_gap(sl, every);
    kv_err rv = hk_sketch_create(&sl->active, k);
    if (rv == KV_OK)
        rv = hk_sketch_create(&sl->spare, k);
    if (rv != KV_OK) {
        hk_sketch_destroy(sl->active);
        return rv;
    }
    pthread_mutex_init(&sl->mu, NULL);
    return KV_OK;
}

void hk_window_destroy(hk_window *w)
{
    if (w == NULL)
        return;
    for (size_t i = 0; w->slots != NULL && i < w->nthreads; i++) {
        hk_sketch_destroy(w->slots[i].active);
        hk_sketch_destroy(w->slots[i].spare);
        pthread_mutex_destroy(&w->slots[i].mu);
    }
    free(w->slots);
    hk_sketch_destroy(w->acc);
    pthread_mutex_destroy(&w->rotate_mu);
    free(w);
}

kv_err hk_window_create(hk_window **out, size_t nthreads, size_t k, uint32_t sample_every,
                        uint64_t now_ns)
{
    if (nthreads == 0 || nthreads > 4096 || k > HK_MAX_K)
        return KV_INVALID_ARGUMENT;
    hk_window *w = calloc(1, sizeof *w);
    if (w == NULL)
        return KV_RESOURCE_EXHAUSTED;
    pthread_mutex_init(&w->rotate_mu, NULL);
    w->every = sample_every ? sample_every : 1;
    w->start_ns = now_ns;
    kv_err rv = hk_sketch_create(&w->acc, k);
    size_t bytes = (nthreads * sizeof(hk_slot) + 63) / 64 * 64;
    if (rv == KV_OK && (w->slots = aligned_alloc(64, bytes)) == NULL)
        rv = KV_RESOURCE_EXHAUSTED;
    for (; rv == KV_OK && w->nthreads < nthreads; w->nthreads++)
        rv = slot_init(&w->slots[w->nthreads], w->nthreads, k, w->every);
    if (rv != KV_OK) {
        hk_window_destroy(w);
        return rv;
    }
    *out = w;
    return KV_OK;
}

void hk_window_sample(hk_window *w, size_t thread_idx, const void *key, size_t len)
{
    hk_slot *sl = &w->slots[thread_idx];
    if (--sl->countdown > 0)
        return;
    sl->countdown = next_gap(sl, w->every);
    pthread_mutex_lock(&sl->mu);
    if (hk_sketch_add(sl->active, key, len, w->every) == KV_OK)
        sl->sampled++;
    pthread_mutex_unlock(&sl->mu);
}

/* Copies the best entries of w->acc into a report. */
static kv_err make_report(hk_window *w, size_t max, double seconds, hk_report *out)
{
    size_t n = hk_sketch_size(w->acc);
    if (max == 0 || max > n)
        max = n;
    hk_entry *top = malloc((max + 1) * sizeof *top);
    hk_item *items = calloc(max + 1, sizeof *items);
    kv_err rv = top && items ? KV_OK : KV_RESOURCE_EXHAUSTED;
    n = rv == KV_OK ? hk_sketch_topk(w->acc, top, max) : 0;
    for (size_t i = 0; rv == KV_OK && i < n; i++) {
        hk_item *it = &items[i];
        if ((it->key = malloc(top[i].klen)) == NULL) {
            rv = KV_RESOURCE_EXHAUSTED;
            break;
        }
        memcpy(it->key, top[i].key, top[i].klen);
        it->klen = top[i].klen;
        it->est_count = top[i].count;
        it->error = top[i].error;
        it->guaranteed = top[i].guaranteed;
        it->rate = (double)it->est_count / seconds;
        it->guaranteed_rate = (double)it->guaranteed / seconds;
    }
    free(top);
    hk_report r = {items, n, seconds, 0, hk_sketch_total(w->acc)};
    if (rv != KV_OK)
        hk_report_free(&r);
    else
        *out = r;
    return rv;
}

kv_err hk_window_rotate(hk_window *w, uint64_t now_ns, size_t max, hk_report *out)
{
    kv_err rv = KV_OK;
    uint64_t sampled = 0;
    pthread_mutex_lock(&w->rotate_mu);
    for (size_t i = 0; i < w->nthreads; i++) {
        hk_slot *sl = &w->slots[i];
        hk_sketch *empty = sl->spare;
        pthread_mutex_lock(&sl->mu); /* O(1) swap: samplers wait only for this */
        sl->spare = sl->active;
        sl->active = empty;
        sampled += sl->sampled;
        sl->sampled = 0;
        pthread_mutex_unlock(&sl->mu);
        if (rv == KV_OK)
            rv = hk_sketch_merge(w->acc, sl->spare);
        hk_sketch_reset(sl->spare);
    }
    double seconds = now_ns > w->start_ns ? (double)(now_ns - w->start_ns) / 1e9 : 1e-9;
    if (rv == KV_OK && (rv = make_report(w, max, seconds, out)) == KV_OK)
        out->sampled = sampled;
    hk_sketch_reset(w->acc);
    w->start_ns = now_ns;
    pthread_mutex_unlock(&w->rotate_mu);
    return rv;
}

void hk_report_free(hk_report *r)
{
    if (r == NULL)
        return;
    for (size_t i = 0; r->items != NULL && i < r->n; i++)
        free(r->items[i].key);
    free(r->items);
    memset(r, 0, sizeof *r);
}
