/* SPDX-License-Identifier: MIT */
/*
 * kvrouter data path: kv.Get/Put/Delete forwarded to the key's replicas and
 * acknowledged by consistency level (writes QUORUM and reads ONE by
 * default), kv.Batch split by node and merged back in order. Writes carry
 * the router's HLC version so every replica applies the same
 * last-writer-wins decision and a retry is idempotent. A node answering
 * FAILED_PRECONDITION with its map makes the router learn it and retry once.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "shard/router.h"
#include "shard/router_fan.h"

static int acks_needed(Kv__Consistency c, Kv__Consistency dflt, int n)
{
    if (c == KV__CONSISTENCY__DEFAULT)
        c = dflt;
    int need = c == KV__CONSISTENCY__ONE ? 1 : c == KV__CONSISTENCY__ALL ? n : n / 2 + 1;
    return need < 1 ? 1 : need > n ? n : need;
}

static bool carries_map(const rpc_reply *r)
{
    return r->status == KV_FAILED_PRECONDITION && r->len > 0;
}

static cmap *current_map(router *r, rpc_ctx *c, kv_err *rv)
{
    cmap *m = cmap_slot_get(r->maps);
    if (!m)
        *rv =
            rpc_fail(c, KV_UNAVAILABLE, "router has no cluster map yet (cluster not initialised?)");
    else
        c->reply_epoch = cmap_epoch(m);
    return m;
}

/* Index of the reply to return for a read: the OK reply with the newest
 * version (found beats not found). */
static int newest_read(rpc_reply *reps, bool *have, int n)
{
    int best = -1;
    uint64_t best_v = 0;
    bool best_found = false;
    for (int i = 0; i < n; i++) {
        if (!have[i] || reps[i].status != KV_OK)
            continue;
        Kv__GetReply *g = kv__get_reply__unpack(NULL, reps[i].len, reps[i].body);
        if (!g)
            continue;
        if (best < 0 || (g->found && (!best_found || g->version > best_v))) {
            best = i;
            best_v = g->version;
            best_found = g->found;
        }
        kv__get_reply__free_unpacked(g, NULL);
    }
    return best;
}

/* Turns a failed fan-out into the reply status: a node's own verdict
 * (ALREADY_EXISTS, a CAS mismatch, a limit) wins over transport errors. */
static kv_err fan_error(rpc_ctx *c, rpc_reply *reps, bool *have, int n, int ok, int need)
{
    int pick = -1;
    for (int i = 0; i < n; i++) {
        if (!have[i] || reps[i].status == KV_OK)
            continue;
        kv_err s = reps[i].status;
        bool transport = s == KV_UNAVAILABLE || s == KV_DEADLINE_EXCEEDED || s == KV_CANCELLED;
        if (pick < 0 || !transport)
            pick = i;
        if (!transport)
            break;
    }
    if (pick < 0)
        return rpc_fail(c, KV_UNAVAILABLE, "%d of %d replicas answered in time (need %d)", ok, n,
                        need);
    kv_err s = reps[pick].status;
    if (s == KV_DEADLINE_EXCEEDED || s == KV_CANCELLED)
        s = KV_UNAVAILABLE;
    return rpc_fail(c, s, "%d of %d replicas acknowledged (need %d): %s", ok, n, need,
                    reps[pick].message ? reps[pick].message : kv_strerror(reps[pick].status));
}

static void repair_done(void *arg, rpc_reply *r)
{
    rpc_reply_free(r);
}

/* A conditional write that won at the consistency level is re-sent without
 * its condition (same version, so last-writer-wins makes it idempotent) to
 * the replicas that refused it: they converge instead of keeping the value
 * the condition was checked against. Fire-and-forget. */
static void repair_refusals(router *r, cmap *m, const uint32_t *idx, rpc_reply *reps, bool *have,
                            int n, const char *method, const ProtobufCMessage *repair, uint32_t dl)
{
    for (int i = 0; repair && i < n; i++) {
        bool refused = have[i] && ((reps[i].status == KV_FAILED_PRECONDITION && !reps[i].len) ||
                                   reps[i].status == KV_ALREADY_EXISTS);
        rpc_chan *ch = refused ? router_chan(r, cmap_node_at(m, idx[i])->addr) : NULL;
        if (ch)
            rpc_call_async(ch, method, cmap_epoch(m), repair, dl, repair_done, NULL);
    }
}

/* What is left of a deadline of dl ms that started at t0 (at least 1 ms). */
static uint32_t ms_left(uint64_t t0, uint32_t dl)
{
    uint64_t spent_ms = (kv_now_ns() - t0) / 1000000u;
    return spent_ms < dl ? dl - (uint32_t)spent_ms : 1;
}

/* Sends msg to the replicas of key (writes: all; reads: `need` of them
 * first, see below) and waits for `need` OK replies. */
static kv_err fan_key(router *r, rpc_ctx *c, const char *method, const ProtobufCMessage *msg,
                      const ProtobufCMessage *repair, const ProtobufCBinaryData *key,
                      Kv__Consistency cons, Kv__Consistency dflt, bool is_read, bool *stale)
{
    kv_err rv = KV_OK;
    cmap *m = current_map(r, c, &rv);
    if (!m)
        return rv;
    uint32_t idx[ROUTER_MAX_RF];
    int n = (int)cmap_replicas(m, key->data, key->len, idx);
    int need = acks_needed(cons, dflt, n);
    uint32_t dl = router_forward_deadline(c);
    fanout *f = fan_create(n);
    if (!f) {
        cmap_unref(m);
        return rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
    }
    /* Reads ask `need` replicas, primary first (so each key's reads warm
     * one node's memory tier instead of all of them), and the others only
     * when those give no verdict: a dead node fails at once (no pipe), a
     * stalled one after half the deadline. Writes go to every replica. */
    int first = is_read ? need : n;
    uint64_t t0 = kv_now_ns();
    for (int i = 0; i < first; i++)
        fan_send(f, router_chan(r, cmap_node_at(m, idx[i])->addr), method, cmap_epoch(m), msg, dl);
    uint32_t left = dl;
    if (first < n && fan_wait_answers(f, need, dl / 2) < need) {
        left = ms_left(t0, dl);
        for (int i = first; i < n; i++)
            fan_send(f, router_chan(r, cmap_node_at(m, idx[i])->addr), method, cmap_epoch(m), msg,
                     left);
        first = n;
    }
    atomic_fetch_add_explicit(&r->forwards, (uint64_t)first, memory_order_relaxed);
    fan_wait(f, need, left);
    /* A write is acknowledged once the primary has answered too (within
     * the deadline), so a read at ONE, which asks the primary, sees every
     * write acknowledged while the primary was up. */
    if (!is_read && n > 1)
        fan_wait_slot(f, 0, ms_left(t0, dl));
    rpc_reply reps[ROUTER_MAX_RF];
    bool have[ROUTER_MAX_RF] = {false}; /* fan_take fills only the sends made */
    fan_take(f, reps, have);
    fan_release(f);
    int ok = 0, chosen = -1;
    for (int i = 0; i < n; i++) {
        if (have[i] && reps[i].status == KV_OK && chosen < 0)
            chosen = i;
        ok += have[i] && reps[i].status == KV_OK;
        if (have[i] && carries_map(&reps[i])) {
            router_learn_map(r, reps[i].body, reps[i].len);
            *stale = true;
        }
    }
    if (ok >= need) {
        if (is_read)
            chosen = newest_read(reps, have, n);
        c->reply = reps[chosen].body; /* the node's reply body is ours to return */
        c->reply_len = reps[chosen].len;
        reps[chosen].body = NULL;
        rv = KV_OK;
        repair_refusals(r, m, idx, reps, have, n, method, repair, dl);
    } else {
        atomic_fetch_add_explicit(&r->forward_errors, 1, memory_order_relaxed);
        rv = fan_error(c, reps, have, n, ok, need);
    }
    for (int i = 0; i < n; i++)
        if (have[i])
            rpc_reply_free(&reps[i]);
    cmap_unref(m);
    return rv;
}

/* Runs fan_key, and once more after learning a newer map. */
static kv_err forward_key(router *r, rpc_ctx *c, const char *method, const ProtobufCMessage *msg,
                          const ProtobufCMessage *repair, const ProtobufCBinaryData *key,
                          Kv__Consistency cons, Kv__Consistency dflt, bool is_read)
{
    bool stale = false;
    kv_err rv = fan_key(r, c, method, msg, repair, key, cons, dflt, is_read, &stale);
    if (rv == KV_OK || !stale)
        return rv;
    free(c->reply);
    c->reply = NULL;
    c->reply_len = 0;
    stale = false;
    return fan_key(r, c, method, msg, repair, key, cons, dflt, is_read, &stale);
}

/* A read at ONE of a flagged hot key: the router's cache, else replicas in
 * turn from router_mit_pick (the others on a transport error). */
static kv_err get_hot(router *r, rpc_ctx *c, Kv__GetRequest *req)
{
    uint64_t gen = 0;
    if (router_mit_cache_get(r->mit, req->key.data, req->key.len, &c->reply, &c->reply_len, &gen))
        return KV_OK;
    kv_err rv = KV_OK;
    cmap *m = current_map(r, c, &rv);
    if (!m)
        return rv;
    uint32_t idx[ROUTER_MAX_RF];
    size_t n = cmap_replicas(m, req->key.data, req->key.len, idx);
    size_t start = router_mit_pick(r->mit, n);
    rpc_reply rep = {0};
    for (size_t k = 0; k < n; k++) {
        rpc_chan *ch = router_chan(r, cmap_node_at(m, idx[(start + k) % n])->addr);
        rv =
            ch ? rpc_call(ch, "kv.Get", cmap_epoch(m), &req->base, router_forward_deadline(c), &rep)
               : KV_UNAVAILABLE;
        if (rv == KV_OK || !(rv == KV_UNAVAILABLE || rv == KV_DEADLINE_EXCEEDED))
            break;
        rpc_reply_free(&rep);
    }
    if (rv == KV_OK) {
        router_mit_cache_put(r->mit, req->key.data, req->key.len, rep.body, rep.len, gen);
        c->reply = rep.body;
        c->reply_len = rep.len;
        rep.body = NULL;
    } else {
        rv = rpc_fail(c, rv == KV_DEADLINE_EXCEEDED ? KV_UNAVAILABLE : rv, "%s",
                      rep.message ? rep.message : kv_strerror(rv));
    }
    rpc_reply_free(&rep);
    cmap_unref(m);
    return rv;
}

kv_err router_h_get(rpc_ctx *c, const uint8_t *body, size_t len)
{
    router *r = c->user;
    atomic_fetch_add_explicit(&r->requests, 1, memory_order_relaxed);
    Kv__GetRequest *req = kv__get_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__GetRequest body");
    kv_err rv = kv_check_key(&r->cfg.limits, req->key.len, c->message, sizeof(c->message));
    if (rv == KV_OK)
        router_hot_sample(r, c->worker, req->key.data, req->key.len);
    bool one =
        req->consistency == KV__CONSISTENCY__DEFAULT || req->consistency == KV__CONSISTENCY__ONE;
    if (rv == KV_OK && r->mit && one && router_mit_flagged(r->mit, req->key.data, req->key.len))
        rv = get_hot(r, c, req);
    else if (rv == KV_OK)
        rv = forward_key(r, c, "kv.Get", &req->base, NULL, &req->key, req->consistency,
                         KV__CONSISTENCY__ONE, true);
    kv__get_request__free_unpacked(req, NULL);
    return rv;
}

kv_err router_h_put(rpc_ctx *c, const uint8_t *body, size_t len)
{
    router *r = c->user;
    atomic_fetch_add_explicit(&r->requests, 1, memory_order_relaxed);
    Kv__PutRequest *req = kv__put_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__PutRequest body");
    kv_err rv = kv_check_key(&r->cfg.limits, req->key.len, c->message, sizeof(c->message));
    if (rv == KV_OK)
        router_hot_sample(r, c->worker, req->key.data, req->key.len);
    if (rv == KV_OK)
        rv = kv_check_value(&r->cfg.limits, req->value.len, c->message, sizeof(c->message));
    if (rv == KV_OK) {
        if (!req->version)
            req->version = kv_hlc_now(&r->hlc);
        Kv__PutRequest repair = *req;
        repair.if_version = 0;
        repair.if_absent = false;
        bool conditional = req->if_version || req->if_absent;
        rv = forward_key(r, c, "kv.Put", &req->base, conditional ? &repair.base : NULL, &req->key,
                         req->consistency, KV__CONSISTENCY__QUORUM, false);
        router_mit_invalidate(r->mit, req->key.data, req->key.len);
    }
    kv__put_request__free_unpacked(req, NULL);
    return rv;
}

kv_err router_h_delete(rpc_ctx *c, const uint8_t *body, size_t len)
{
    router *r = c->user;
    atomic_fetch_add_explicit(&r->requests, 1, memory_order_relaxed);
    Kv__DeleteRequest *req = kv__delete_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__DeleteRequest body");
    kv_err rv = kv_check_key(&r->cfg.limits, req->key.len, c->message, sizeof(c->message));
    if (rv == KV_OK)
        router_hot_sample(r, c->worker, req->key.data, req->key.len);
    if (rv == KV_OK) {
        if (!req->version)
            req->version = kv_hlc_now(&r->hlc);
        Kv__DeleteRequest repair = *req;
        repair.if_version = 0;
        rv = forward_key(r, c, "kv.Delete", &req->base, req->if_version ? &repair.base : NULL,
                         &req->key, req->consistency, KV__CONSISTENCY__QUORUM, false);
        router_mit_invalidate(r->mit, req->key.data, req->key.len);
    }
    kv__delete_request__free_unpacked(req, NULL);
    return rv;
}
