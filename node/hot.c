/* SPDX-License-Identifier: MIT */
/*
 * The node's merged view of cluster hot keys (issue 7). Every router pushes
 * the hot keys of its last window (admin.HotKeys); the node keeps, per key,
 * a smoothed rate from each router, sums the fresh ones (a router's entry
 * ages out after 3 of its windows, or at once when the router's next report
 * leaves the key out), and pins keys whose summed rate passes
 * --hot-threshold in the engine (memory-resident, HotRing head), unpinning
 * them when they cool down. A threshold of 0 pins nothing (hints off; the
 * view is still kept for kvctl hotkeys). Reports arrive about once per
 * second per router, so one mutex guards the table.
 *
 * Reports are input from the network, so the view is bounded: a key of
 * 1..NODE_HOT_MAX_KEY bytes and a finite rate >= 0 (clamped to
 * NODE_HOT_MAX_RATE) or the key is skipped; window_ms at most
 * NODE_HOT_MAX_WINDOW_MS, so an entry ages out within AGE_WINDOWS of that;
 * the first NODE_HOT_MAX_REPORT_KEYS keys of a report; SLOTS / 2 entries
 * and NODE_HOT_MAX_BYTES of key copies in all (new keys are left out past
 * either). What is skipped is logged once per report.
 *
 * Pins must not outlive the routers that asked for them: a router that dies
 * (or is partitioned away) sends no more reports, so a ticker thread owned
 * by the view re-evaluates every entry each HOT_TICK_MS and unpins keys whose
 * reports have all aged out, whether or not any report arrives.
 */
#include "node/hot.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/assert.h"
#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/ticker.h"

#define SLOTS 16384u /* table capacity (power of two); at most half used */
#define MAX_ROUTERS 8
#define AGE_WINDOWS 3
#define HOT_TICK_MS 250 /* ageing period without reports */

typedef struct hot_src {
    uint64_t router; /* hash of the router id, 0 = unused */
    double rate;
    uint64_t at_ns, window_ns;
} hot_src;

typedef struct hot_ent {
    uint64_t hash; /* 0 = empty */
    uint8_t *key;
    size_t klen;
    hot_src src[MAX_ROUTERS];
    bool pinned;
} hot_ent;

struct node_hot {
    engine *eng;
    double threshold;
    pthread_mutex_t mu; /* guards tab and used */
    kv_ticker *ticker;
    hot_ent *tab;
    size_t used;
    size_t key_bytes; /* the keys' copies, at most NODE_HOT_MAX_BYTES */
};

static void sweep(node_hot *h, uint64_t router, uint64_t now);

/* The ageing tick: sweeps with no reporting router, so only entries whose
 * reports went stale change (unpinned, then dropped). */
static void age(void *arg)
{
    node_hot *h = arg;
    pthread_mutex_lock(&h->mu);
    sweep(h, 0, kv_now_ns());
    pthread_mutex_unlock(&h->mu);
}

kv_err node_hot_create(node_hot **out, engine *e, double threshold)
{
    node_hot *h = calloc(1, sizeof(*h));
    if (!h || !(h->tab = calloc(SLOTS, sizeof(hot_ent)))) {
        free(h);
        return KV_RESOURCE_EXHAUSTED;
    }
    h->eng = e;
    h->threshold = threshold;
    pthread_mutex_init(&h->mu, NULL);
    kv_ticker_opts to = {.period_ns = HOT_TICK_MS * 1000000ull,
                         .fn = age,
                         .arg = h,
                         .thread_start = engine_thread_register, /* engine_pin reads the index */
                         .thread_stop = engine_thread_unregister};
    if (kv_ticker_start(&h->ticker, &to) != KV_OK) {
        pthread_mutex_destroy(&h->mu);
        free(h->tab);
        free(h);
        return KV_RESOURCE_EXHAUSTED;
    }
    *out = h;
    return KV_OK;
}

void node_hot_destroy(node_hot *h)
{
    if (!h)
        return;
    kv_ticker_stop(h->ticker);
    for (size_t i = 0; i < SLOTS; i++)
        free(h->tab[i].key);
    free(h->tab);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

/* How old a report from at is at now; 0 when a racing caller's clock
 * reading was taken before the report's (not a wrap to 2^64). */
static uint64_t age_ns(uint64_t at, uint64_t now)
{
    return now > at ? now - at : 0;
}

static uint64_t key_hash(const void *k, size_t n)
{
    uint64_t x = kv_hash64(k, n, 0x486f744b6579ull);
    return x ? x : 1;
}

/* The key's slot, or the empty slot where it would go (NULL when full). */
static hot_ent *find(node_hot *h, uint64_t hash, const void *key, size_t klen)
{
    for (size_t i = hash & (SLOTS - 1), k = 0; k < SLOTS; k++, i = (i + 1) & (SLOTS - 1)) {
        hot_ent *e = &h->tab[i];
        if (!e->hash || (e->hash == hash && e->klen == klen && memcmp(e->key, key, klen) == 0))
            return e;
    }
    return NULL;
}

/* The rate a report gives key k, clamped to NODE_HOT_MAX_RATE; -1 when
 * the key or the rate is unusable (empty or over-long key, a rate that is
 * not a finite number >= 0). */
static double usable_rate(const Kv__HotKey *k)
{
    if (!k || k->key.len == 0 || k->key.len > NODE_HOT_MAX_KEY || !k->key.data ||
        !isfinite(k->ops_per_s) || k->ops_per_s < 0)
        return -1;
    return k->ops_per_s > NODE_HOT_MAX_RATE ? NODE_HOT_MAX_RATE : k->ops_per_s;
}

static void note(node_hot *h, uint64_t router, uint64_t window_ns, const Kv__HotKey *k, double rate,
                 uint64_t now)
{
    uint64_t hash = key_hash(k->key.data, k->key.len);
    hot_ent *e = find(h, hash, k->key.data, k->key.len);
    if (!e ||
        (!e->hash && (h->used >= SLOTS / 2 || h->key_bytes + k->key.len > NODE_HOT_MAX_BYTES)))
        return; /* table or key budget full: the coldest keys are the ones left out */
    if (!e->hash) {
        if (!(e->key = malloc(k->key.len)))
            return;
        memcpy(e->key, k->key.data, k->key.len);
        e->klen = k->key.len;
        e->hash = hash;
        h->used++;
        h->key_bytes += k->key.len;
    }
    hot_src *slot = NULL, *oldest = &e->src[0];
    for (int i = 0; i < MAX_ROUTERS && !slot; i++) {
        if (e->src[i].router == router || e->src[i].router == 0)
            slot = &e->src[i];
        else if (e->src[i].at_ns < oldest->at_ns)
            oldest = &e->src[i];
    }
    slot = slot ? slot : oldest;
    /* Smooth over consecutive windows of the same router (EWMA, half
     * weight on the newest): one window's sample is small at low sampling
     * rates, and a hot set that moved still takes over within 2 windows. */
    if (slot->router == router && age_ns(slot->at_ns, now) <= window_ns * 3 / 2)
        rate = 0.5 * slot->rate + 0.5 * rate;
    *slot = (hot_src){router, rate, now, window_ns};
}

static double fresh_rate(const hot_ent *e, uint64_t now)
{
    double sum = 0;
    for (int i = 0; i < MAX_ROUTERS; i++)
        if (e->src[i].router && age_ns(e->src[i].at_ns, now) <= AGE_WINDOWS * e->src[i].window_ns)
            sum += e->src[i].rate;
    return sum;
}

/* A router's report lists every key of its top-K that this node owns, so
 * a key it leaves out has cooled below its sketch's floor: that router's
 * contribution is dropped at once instead of lingering until it ages out. */
static void drop_unreported(hot_ent *e, uint64_t router, uint64_t now)
{
    for (int i = 0; i < MAX_ROUTERS; i++)
        if (e->src[i].router == router && e->src[i].at_ns != now)
            e->src[i].router = 0;
}

/* Empties slot i of the linear-probing table and shifts later members of
 * its probe run back into the hole (backward-shift deletion), so lookups
 * never need tombstones. Caller holds mu and has freed the key. */
static void remove_at(node_hot *h, size_t i)
{
    KV_ASSERT_LOCKED(&h->mu);
    size_t hole = i;
    for (size_t j = (i + 1) & (SLOTS - 1);; j = (j + 1) & (SLOTS - 1)) {
        hot_ent *e = &h->tab[j];
        if (!e->hash)
            break;
        size_t home = e->hash & (SLOTS - 1);
        /* e may fill the hole unless its home lies cyclically in (hole, j] */
        bool stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            h->tab[hole] = *e;
            hole = j;
        }
    }
    memset(&h->tab[hole], 0, sizeof(hot_ent));
    h->used--;
}

/* Applies pin decisions to every entry and drops entries with no fresh
 * rate; router (0 = none) is the one whose report was just merged, and its
 * contribution to keys it left out is withdrawn. Caller holds mu. */
static void sweep(node_hot *h, uint64_t router, uint64_t now)
{
    KV_ASSERT_LOCKED(&h->mu);
    for (size_t i = 0; i < SLOTS; i++) {
        hot_ent *e = &h->tab[i];
        if (!e->hash)
            continue;
        if (router)
            drop_unreported(e, router, now);
        double rate = fresh_rate(e, now);
        bool want = h->threshold > 0 && rate >= h->threshold; /* 0: hints off */
        if (want != e->pinned) {
            kv_err rv = engine_pin(h->eng, e->key, e->klen, want);
            e->pinned = want && (rv == KV_OK || rv == KV_NOT_FOUND);
            KV_DEBUG("hot", "%s %.*s (%.1f ops/s): %s", want ? "pin" : "unpin", (int)e->klen,
                     (const char *)e->key, rate, kv_err_name(rv));
        }
        if (rate <= 0 && !e->pinned) {
            free(e->key);
            h->key_bytes -= e->klen;
            remove_at(h, i);
            i--; /* an entry may have shifted into slot i (size_t wraps back to 0) */
        }
    }
}

kv_err node_hot_check(const Kv__HotKeysRequest *req, size_t max_key, char *err, size_t errlen)
{
    if (max_key > NODE_HOT_MAX_KEY)
        max_key = NODE_HOT_MAX_KEY;
    if (req->n_keys && (!req->router_id || !req->router_id[0])) {
        snprintf(err, errlen, "a hot-key report needs the reporting router's id");
        return KV_INVALID_ARGUMENT;
    }
    if (req->n_keys > NODE_HOT_MAX_REPORT_KEYS) {
        snprintf(err, errlen, "hot-key report of %zu keys, over the limit of %u", req->n_keys,
                 NODE_HOT_MAX_REPORT_KEYS);
        return KV_INVALID_ARGUMENT;
    }
    if (req->window_ms > NODE_HOT_MAX_WINDOW_MS) {
        snprintf(err, errlen, "hot-key window_ms %u is over the limit of %u", req->window_ms,
                 NODE_HOT_MAX_WINDOW_MS);
        return KV_INVALID_ARGUMENT;
    }
    for (size_t i = 0; i < req->n_keys; i++) {
        const Kv__HotKey *k = req->keys[i];
        if (usable_rate(k) < 0 || k->key.len > max_key) {
            snprintf(err, errlen,
                     "hot key %zu: a key of 1..%zu bytes (--max-key-bytes) and a finite rate >= 0 "
                     "are required",
                     i, max_key);
            return KV_INVALID_ARGUMENT;
        }
    }
    return KV_OK;
}

void node_hot_report(node_hot *h, const Kv__HotKeysRequest *req, uint64_t now_ns)
{
    const char *id = req->router_id ? req->router_id : "";
    uint64_t router = key_hash(id, strlen(id));
    uint32_t wms = req->window_ms ? req->window_ms : 1000;
    uint64_t window_ns =
        (uint64_t)(wms < NODE_HOT_MAX_WINDOW_MS ? wms : NODE_HOT_MAX_WINDOW_MS) * 1000000ull;
    size_t n = req->n_keys < NODE_HOT_MAX_REPORT_KEYS ? req->n_keys : NODE_HOT_MAX_REPORT_KEYS;
    size_t bad = 0;
    pthread_mutex_lock(&h->mu);
    for (size_t i = 0; i < n; i++) {
        double rate = usable_rate(req->keys[i]);
        if (rate < 0)
            bad++;
        else
            note(h, router, window_ns, req->keys[i], rate, now_ns);
    }
    sweep(h, router, now_ns);
    pthread_mutex_unlock(&h->mu);
    if (bad || n < req->n_keys || wms > NODE_HOT_MAX_WINDOW_MS)
        KV_WARN("hot",
                "hot-key report: %zu of %zu keys unusable (empty, over %u bytes, or a rate "
                "that is not finite and >= 0), %zu over the %u-key limit, window %u ms (at most "
                "%u taken)",
                bad, req->n_keys, NODE_HOT_MAX_KEY, req->n_keys - n, NODE_HOT_MAX_REPORT_KEYS, wms,
                NODE_HOT_MAX_WINDOW_MS);
}

static int by_rate_desc(const void *a, const void *b)
{
    const node_hot_item *x = a, *y = b;
    return x->ops_per_s < y->ops_per_s ? 1 : x->ops_per_s > y->ops_per_s ? -1 : 0;
}

size_t node_hot_view(node_hot *h, uint64_t now_ns, node_hot_item **out)
{
    pthread_mutex_lock(&h->mu);
    node_hot_item *items = calloc(h->used ? h->used : 1, sizeof(*items));
    size_t n = 0;
    for (size_t i = 0; items && i < SLOTS; i++) {
        hot_ent *e = &h->tab[i];
        double rate = e->hash ? fresh_rate(e, now_ns) : 0;
        if (!e->hash || (rate <= 0 && !e->pinned))
            continue;
        if (!(items[n].key = malloc(e->klen)))
            break;
        memcpy(items[n].key, e->key, e->klen);
        items[n].klen = e->klen;
        items[n].ops_per_s = rate;
        items[n].pinned = e->pinned;
        n++;
    }
    pthread_mutex_unlock(&h->mu);
    if (items)
        qsort(items, n, sizeof(*items), by_rate_desc);
    *out = items;
    return n;
}

void node_hot_view_free(node_hot_item *items, size_t n)
{
    for (size_t i = 0; items && i < n; i++)
        free(items[i].key);
    free(items);
}

size_t node_hot_tracked(node_hot *h)
{
    pthread_mutex_lock(&h->mu);
    size_t n = h->used;
    pthread_mutex_unlock(&h->mu);
    return n;
}

size_t node_hot_pinned(node_hot *h)
{
    size_t n = 0;
    pthread_mutex_lock(&h->mu);
    for (size_t i = 0; i < SLOTS; i++)
        n += h->tab[i].hash && h->tab[i].pinned;
    pthread_mutex_unlock(&h->mu);
    return n;
}
