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
#include "shard/fan.h"

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
 * version, a tombstone (not found, version set) included, so a newer delete
 * beats an older value; on equal versions a found record. */
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
        if (best < 0 || g->version > best_v || (g->version == best_v && g->found && !best_found)) {
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

/* Hinted handoff for the sends of one write whose replies come after the
 * handler returned: a replica that then fails gets a hint on the first
 * replica that acknowledged. */
typedef struct late_hint {
    router *r;
    cmap *m;
    uint32_t target[2 * ROUTER_MAX_RF]; /* per send: map index */
    uint8_t *rec;                       /* packed Kv__Record */
    size_t rlen;
} late_hint;

static void late_free(void *arg)
{
    late_hint *h = arg;
    if (!h)
        return;
    cmap_unref(h->m);
    free(h->rec);
    free(h);
}

static void late_reply(void *arg, int i, const rpc_reply *rep, int first_ok)
{
    late_hint *h = arg;
    if (first_ok < 0 || !router_transport_err(rep->status) || atomic_load(&h->r->stopping))
        return;
    Kv__Record *rec = kv__record__unpack(NULL, h->rlen, h->rec);
    if (rec) {
        router_send_hint(h->r, h->m, h->target[first_ok], h->target[i], &rec, 1);
        kv__record__free_unpacked(rec, NULL);
    }
}

static late_hint *late_new(router *r, cmap *m, const Kv__Record *rec)
{
    late_hint *h = calloc(1, sizeof(*h));
    if (!h)
        return NULL;
    h->rlen = kv__record__get_packed_size(rec);
    if (!(h->rec = malloc(h->rlen ? h->rlen : 1))) {
        free(h);
        return NULL;
    }
    kv__record__pack(rec, h->rec);
    h->r = r;
    h->m = cmap_ref(m);
    return h;
}

/* The targets of one forwarded call: for a read the current replicas in
 * read order, for a write the current replicas then the pending ones. */
typedef struct targets {
    uint32_t idx[2 * ROUTER_MAX_RF];
    int n, ncur, readable, need;
} targets;

static void plan_targets(cmap *m, const ProtobufCBinaryData *key, Kv__Consistency cons,
                         Kv__Consistency dflt, bool is_read, targets *t)
{
    uint32_t cur[ROUTER_MAX_RF];
    t->ncur = (int)cmap_replicas(m, key->data, key->len, cur);
    t->need = acks_needed(cons, dflt, t->ncur);
    if (is_read) {
        t->readable = router_read_order(m, cur, t->ncur, t->idx);
        t->n = t->ncur;
        return;
    }
    memcpy(t->idx, cur, (size_t)t->ncur * sizeof(cur[0]));
    t->n = t->ncur + (int)cmap_pending(m, key->data, key->len, t->idx + t->ncur);
}

/* Sends a read to `need` replicas (healthy ones first, the primary first
 * among them, so each key's reads warm one node's memory tier) and to the
 * rest only when those give no verdict: a dead node fails at once (no
 * pipe), a stalled one after half the deadline. */
static int send_read(router *r, cmap *m, fanout *f, const targets *t, const char *method,
                     const ProtobufCMessage *msg, uint32_t dl, uint64_t t0, uint32_t *left)
{
    int first = t->need;
    for (int i = 0; i < first; i++)
        fan_send(f, router_chan(r, cmap_node_at(m, t->idx[i])->addr), method, cmap_epoch(m), msg,
                 dl);
    *left = dl;
    if (first < t->n &&
        fan_wait_answers(f, t->need, t->readable >= t->need ? dl / 2 : 0) < t->need) {
        *left = ms_left(t0, dl);
        for (int i = first; i < t->n; i++)
            fan_send(f, router_chan(r, cmap_node_at(m, t->idx[i])->addr), method, cmap_epoch(m),
                     msg, *left);
        first = t->n;
    }
    return first;
}

/* Sends a write to every current and pending replica but those the failure
 * detector holds down (they fail at once and get a hint). */
static void send_write(router *r, cmap *m, fanout *f, const targets *t, const char *method,
                       const ProtobufCMessage *msg, uint32_t dl)
{
    for (int i = 0; i < t->n; i++) {
        const cmap_node *nd = cmap_node_at(m, t->idx[i]);
        if (cmap_get_health(m, t->idx[i]) == CMAP_HEALTH_DOWN) {
            char why[CMAP_MAX_ID + 64];
            snprintf(why, sizeof(why), "node %s is down (failure detector)", nd->id);
            atomic_fetch_add_explicit(&r->skipped_down, 1, memory_order_relaxed);
            fan_skip(f, KV_UNAVAILABLE, why);
            continue;
        }
        fan_send(f, router_chan(r, nd->addr), method, cmap_epoch(m), msg, dl);
    }
}

/* Waits for a write's acks: the level's from the current replicas, every
 * pending replica (DESIGN.md §4), and the primary (so a read at ONE, which
 * asks the primary, sees every write acknowledged while it was up). */
static void wait_write(fanout *f, const targets *t, uint64_t t0, uint32_t dl)
{
    fan_wait(f, t->need + (t->n - t->ncur), dl);
    for (int i = t->ncur; i < t->n; i++)
        fan_wait_slot(f, i, ms_left(t0, dl));
    if (t->ncur > 1)
        fan_wait_slot(f, 0, ms_left(t0, dl));
}

/* Hints for the sends of a write that failed without a verdict. */
static int first_ok(const targets *t, const rpc_reply *reps, const bool *have)
{
    for (int i = 0; i < t->n; i++)
        if (have[i] && reps[i].status == KV_OK)
            return i;
    return -1;
}

/* A pending replica that failed without a verdict (down, behind on the
 * map, slow) counts as acknowledged once a live replica durably stores a
 * hint for it (router_store_hint). Returns how many did; sets hinted[i]. */
static int hint_pending(router *r, cmap *m, const targets *t, const rpc_reply *reps,
                        const bool *have, const Kv__Record *rec, bool *hinted, uint32_t dl)
{
    int holder = first_ok(t, reps, have), n = 0;
    for (int i = t->ncur; holder >= 0 && i < t->n; i++) {
        if ((have[i] && !router_transport_err(reps[i].status)) || holder >= t->ncur)
            continue;
        if (router_store_hint(r, m, t->idx[holder], t->idx[i], (Kv__Record **)&rec, 1, dl) ==
            KV_OK) {
            hinted[i] = true;
            n++;
        }
    }
    return n;
}

/* Hints (asynchronous) for the other sends that failed without a verdict. */
static void hint_failed(router *r, cmap *m, const targets *t, const rpc_reply *reps,
                        const bool *have, const bool *hinted, const Kv__Record *rec)
{
    int holder = first_ok(t, reps, have);
    for (int i = 0; holder >= 0 && i < t->n; i++)
        if (have[i] && router_transport_err(reps[i].status) && !hinted[i])
            router_send_hint(r, m, t->idx[holder], t->idx[i], (Kv__Record **)&rec, 1);
}

/* Sends msg to the replicas of key and waits for enough OK replies; rec
 * (writes) is what hints carry. */
static kv_err fan_key(router *r, rpc_ctx *c, const char *method, const ProtobufCMessage *msg,
                      const ProtobufCMessage *repair, const ProtobufCBinaryData *key,
                      Kv__Consistency cons, Kv__Consistency dflt, const Kv__Record *rec,
                      bool *stale)
{
    kv_err rv = KV_OK;
    cmap *m = current_map(r, c, &rv);
    if (!m)
        return rv;
    bool is_read = rec == NULL;
    targets t;
    plan_targets(m, key, cons, dflt, is_read, &t);
    uint32_t dl = router_forward_deadline(c), left = dl;
    fanout *f = fan_create(t.n);
    late_hint *lh = f && !is_read ? late_new(r, m, rec) : NULL;
    if (!f || (!is_read && !lh)) {
        late_free(lh);
        if (f)
            fan_release(f);
        cmap_unref(m);
        return rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
    }
    if (lh && repair) { /* a conditional write may fail: no hint before its verdict */
        late_free(lh);
        lh = NULL;
    }
    if (lh) {
        memcpy(lh->target, t.idx, (size_t)t.n * sizeof(t.idx[0]));
        fan_on_late(f, late_reply, lh, late_free);
    }
    uint64_t t0 = kv_now_ns();
    int sent = t.n;
    if (is_read) {
        sent = send_read(r, m, f, &t, method, msg, dl, t0, &left);
        fan_wait(f, t.need, left);
    } else {
        send_write(r, m, f, &t, method, msg, dl);
        wait_write(f, &t, t0, dl);
    }
    atomic_fetch_add_explicit(&r->forwards, (uint64_t)sent, memory_order_relaxed);
    rpc_reply reps[2 * ROUTER_MAX_RF];
    bool have[2 * ROUTER_MAX_RF] = {false}; /* fan_take fills only the sends made */
    fan_take(f, reps, have);
    fan_release(f);
    int ok = 0, pend_ok = 0, chosen = -1;
    for (int i = 0; i < t.n; i++) {
        bool good = have[i] && reps[i].status == KV_OK;
        if (good && chosen < 0 && i < t.ncur)
            chosen = i;
        ok += good && i < t.ncur;
        pend_ok += good && i >= t.ncur;
        if (have[i] && carries_map(&reps[i])) {
            router_learn_map(r, reps[i].body, reps[i].len);
            *stale = true;
        }
    }
    bool hinted[2 * ROUTER_MAX_RF] = {false};
    if (!is_read && ok >= t.need && pend_ok < t.n - t.ncur && !repair)
        pend_ok += hint_pending(r, m, &t, reps, have, rec, hinted, ms_left(t0, dl));
    bool won = ok >= t.need && pend_ok == t.n - t.ncur;
    if (!is_read && (won || !repair))
        hint_failed(r, m, &t, reps, have, hinted, rec);
    if (won) {
        if (is_read) {
            chosen = newest_read(reps, have, t.n);
            router_read_repair(r, m, key, t.idx, reps, have, t.n);
        }
        c->reply = reps[chosen].body; /* the node's reply body is ours to return */
        c->reply_len = reps[chosen].len;
        reps[chosen].body = NULL;
        rv = KV_OK;
        repair_refusals(r, m, t.idx, reps, have, t.ncur, method, repair, dl);
    } else {
        atomic_fetch_add_explicit(&r->forward_errors, 1, memory_order_relaxed);
        rv = fan_error(c, reps, have, t.n, ok + pend_ok, t.need + t.n - t.ncur);
    }
    for (int i = 0; i < t.n; i++)
        if (have[i])
            rpc_reply_free(&reps[i]);
    cmap_unref(m);
    return rv;
}

/* Runs fan_key, and once more after learning a newer map. */
static kv_err forward_key(router *r, rpc_ctx *c, const char *method, const ProtobufCMessage *msg,
                          const ProtobufCMessage *repair, const ProtobufCBinaryData *key,
                          Kv__Consistency cons, Kv__Consistency dflt, const Kv__Record *rec)
{
    bool stale = false;
    kv_err rv = fan_key(r, c, method, msg, repair, key, cons, dflt, rec, &stale);
    if (rv == KV_OK || !stale)
        return rv;
    free(c->reply);
    c->reply = NULL;
    c->reply_len = 0;
    stale = false;
    return fan_key(r, c, method, msg, repair, key, cons, dflt, rec, &stale);
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
                         KV__CONSISTENCY__ONE, NULL);
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
        Kv__Record rec = KV__RECORD__INIT;
        rec.key = req->key;
        rec.value = req->value;
        rec.version = req->version;
        rec.expire_at_ms = req->ttl_ms ? kv_wall_ms() + req->ttl_ms : 0;
        rv = forward_key(r, c, "kv.Put", &req->base, conditional ? &repair.base : NULL, &req->key,
                         req->consistency, KV__CONSISTENCY__QUORUM, &rec);
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
        Kv__Record rec = KV__RECORD__INIT;
        rec.key = req->key;
        rec.version = req->version;
        rec.tombstone = true;
        rv = forward_key(r, c, "kv.Delete", &req->base, req->if_version ? &repair.base : NULL,
                         &req->key, req->consistency, KV__CONSISTENCY__QUORUM, &rec);
        router_mit_invalidate(r->mit, req->key.data, req->key.len);
    }
    kv__delete_request__free_unpacked(req, NULL);
    return rv;
}
