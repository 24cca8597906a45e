/* SPDX-License-Identifier: MIT */
/*
 * The smart client (kv_client_opts.direct, issue 15): libkvclient learns the
 * cluster map (admin.GetMap from any router or node) and sends each request
 * straight to the key's primary replica, with Envelope.coordinate set, so
 * that node coordinates it exactly as a router would (shard/repl.h): one
 * network hop and no router CPU. The next replica takes the request when
 * the primary cannot be reached (a local UNAVAILABLE: nothing was sent, so
 * nothing is applied twice), the routers when none can or while the map is
 * unknown.
 *
 * The map is refreshed every KVD_REFRESH_MS by a ticker thread, at once
 * when a reply shows a newer epoch than the client's, and taken straight
 * from a FAILED_PRECONDITION reply that carries it. Channels to the nodes
 * (one REQ socket per address, created on first use) are kept for the
 * client's life, so a refresh never drops connections.
 *
 * Threads: every function may be called from any thread, completion
 * callbacks included (they take one short mutex and never wait for the
 * network); kvd_close only from the thread closing the client.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "client/kv_internal.h"
#include "common/clock.h"
#include "common/ticker.h"
#include "proto/kv.pb-c.h"
#include "shard/clustermap.h"

#define KVD_TICK_NS (100ull * 1000000ull)
#define KVD_REFRESH_MS 3000u
#define KVD_RETRY_MS 500u  /* while no map is known */
#define KVD_FETCH_MS 1000u /* deadline of one admin.GetMap */
#define KVD_MAX_ADDRS CMAP_MAX_NODES

struct kvd {
    kv_client *c;
    cmap_slot *maps;
    kv_ticker *ticker;
    rpc_pool *peers;        /* channels to the nodes, coordinate set on every call */
    uint64_t next_fetch_ns; /* ticker thread only */
    _Atomic bool want;      /* a reply showed a newer epoch: fetch now */
    char *map_key;          /* NULL = none: maps are only checked for plausibility */
};

static rpc_chan *peer_chan(kvd *d, const char *addr)
{
    return rpc_pool_get(d->peers, addr);
}

/* Installs m if newer and dials its nodes (so the first requests find
 * connections). With a map key, m must be signed with it; otherwise an
 * unverified map (no TLS with a CA) may not jump the epoch by more than
 * CMAP_MAX_EPOCH_JUMP (docs/protocol.md "Cluster maps from peers"; the
 * client cannot tell which node a router's map came from, so the sender
 * check is the routers' and nodes' own). */
static void install(kvd *d, cmap *m, bool verified)
{
    cmap *cur = cmap_slot_get(d->maps);
    char why[160];
    kv_err rv = cmap_vet(cur, m, NULL, verified, d->map_key, why, sizeof(why));
    cmap_unref(cur);
    if (rv != KV_OK || cmap_slot_install(d->maps, m) != KV_OK)
        return;
    for (size_t i = 0; i < cmap_node_count(m); i++)
        peer_chan(d, cmap_node_at(m, i)->addr);
}

/* Asks ch for its map; true when it answered with one. */
static bool fetch_from(kvd *d, rpc_chan *ch)
{
    Kv__GetMapRequest req = KV__GET_MAP_REQUEST__INIT;
    rpc_reply rep = {0};
    bool got = false;
    if (ch && rpc_call(ch, "admin.GetMap", 0, &req.base, KVD_FETCH_MS, &rep) == KV_OK) {
        Kv__GetMapReply *g = kv__get_map_reply__unpack(NULL, rep.len, rep.body);
        cmap *m = NULL;
        char err[256];
        if (g && g->has_map && g->map && cmap_from_pb(g->map, &m, err, sizeof(err)) == KV_OK) {
            got = true;
            install(d, m, rep.verified);
            cmap_unref(m);
        }
        if (g)
            kv__get_map_reply__free_unpacked(g, NULL);
    }
    rpc_reply_free(&rep);
    return got;
}

/* One refresh: the map's nodes first, then the client's addresses. */
static void refresh(kvd *d)
{
    cmap *m = cmap_slot_get(d->maps);
    bool got = false;
    for (size_t i = 0; m && !got && i < cmap_node_count(m); i++) {
        rpc_chan *ch = peer_chan(d, cmap_node_at(m, i)->addr);
        got = ch && rpc_chan_connected(ch) > 0 && fetch_from(d, ch);
    }
    cmap_unref(m);
    for (size_t i = 0; !got && i < kvc_nchans(d->c); i++)
        got = fetch_from(d, kvc_chan(d->c, i));
}

static void tick(void *arg)
{
    kvd *d = arg;
    uint64_t now = kv_now_ns();
    if (now < d->next_fetch_ns && !atomic_exchange(&d->want, false))
        return;
    refresh(d);
    uint32_t wait = cmap_slot_epoch(d->maps) ? KVD_REFRESH_MS : KVD_RETRY_MS;
    d->next_fetch_ns = kv_now_ns() + (uint64_t)wait * 1000000ull;
}

kv_err kvd_open(kvd **out, kv_client *c, const rpc_chan_opts *copts, const char *map_key)
{
    kvd *d = calloc(1, sizeof(*d));
    if (!d)
        return KV_RESOURCE_EXHAUSTED;
    d->c = c;
    rpc_chan_opts co = *copts;
    co.coordinate = true;
    kv_err rv = KV_OK;
    if (map_key && *map_key && !(d->map_key = strdup(map_key)))
        rv = KV_RESOURCE_EXHAUSTED;
    if (rv == KV_OK)
        rv = rpc_pool_create(&d->peers, &co);
    if (rv == KV_OK)
        rv = cmap_slot_create(&d->maps);
    kv_ticker_opts to = {.period_ns = KVD_TICK_NS, .fn = tick, .arg = d};
    if (rv == KV_OK)
        rv = kv_ticker_start(&d->ticker, &to);
    if (rv != KV_OK) {
        kvd_close(d);
        return rv;
    }
    *out = d;
    return KV_OK;
}

void kvd_close(kvd *d)
{
    if (!d)
        return;
    kv_ticker_stop(d->ticker);
    rpc_pool_destroy(d->peers);
    cmap_slot_destroy(d->maps);
    if (d->map_key)
        memset(d->map_key, 0, strlen(d->map_key));
    free(d->map_key);
    free(d);
}

rpc_chan *kvd_route(kvd *d, const void *key, size_t klen, size_t *attempt, uint64_t *epoch)
{
    cmap *m = d ? cmap_slot_get(d->maps) : NULL;
    if (!m)
        return NULL;
    uint32_t idx[CMAP_MAX_RF];
    size_t n = cmap_replicas(m, key, klen, idx);
    rpc_chan *ch = NULL;
    /* the first replica from *attempt on that has a connection; the last
     * one is tried even without (its call fails locally, then the routers) */
    for (; !ch && *attempt < n; (*attempt)++) {
        rpc_chan *c = peer_chan(d, cmap_node_at(m, idx[*attempt])->addr);
        if (c && (rpc_chan_connected(c) > 0 || *attempt + 1 == n))
            ch = c;
    }
    *epoch = cmap_epoch(m);
    cmap_unref(m);
    return ch;
}

bool kvd_saw_reply(kvd *d, const rpc_reply *r, uint64_t sent_epoch)
{
    if (!d)
        return false;
    if (r->status == KV_FAILED_PRECONDITION && r->len > 0) {
        cmap *m = NULL;
        if (cmap_decode(r->body, r->len, &m, NULL, 0) == KV_OK) {
            bool newer = cmap_epoch(m) > sent_epoch;
            install(d, m, r->verified);
            cmap_unref(m);
            return newer;
        }
    }
    if (r->map_epoch > cmap_slot_epoch(d->maps))
        atomic_store(&d->want, true);
    return false;
}
