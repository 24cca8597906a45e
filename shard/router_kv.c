/* SPDX-License-Identifier: MIT */
/*
 * kvrouter data path: kv.Get/Put/Delete/Batch are checked against the
 * limits, sampled for hot-key detection and coordinated by the replication
 * library (shard/repl.h: replicas, consistency levels, hints, read repair),
 * the same code a node runs for a smart client. Reads at ONE of flagged hot
 * keys may take the router's opt-in mitigations (router_mitigate.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "shard/router.h"

/* What unpacking a len-byte request may allocate (issue 16 item 4). */
static size_t router_budget(const router *r, size_t len)
{
    return rpc_unpack_budget(len, r->cfg.limits.max_batch_ops);
}

/* A read at ONE of a flagged hot key: the router's cache, else replicas in
 * turn from router_mit_pick (the others on a transport error). */
static kv_err get_hot(router *r, rpc_ctx *c, Kv__GetRequest *req)
{
    uint64_t gen = 0;
    if (router_mit_cache_get(r->mit, req->key.data, req->key.len, &c->reply, &c->reply_len, &gen))
        return KV_OK;
    cmap *m = cmap_slot_get(r->maps);
    if (!m)
        return rpc_fail(c, KV_UNAVAILABLE,
                        "router has no cluster map yet (cluster not initialised?)");
    c->reply_epoch = cmap_epoch(m);
    kv_err rv = KV_OK;
    uint32_t idx[REPL_MAX_RF];
    size_t n = cmap_replicas(m, req->key.data, req->key.len, idx);
    size_t start = router_mit_pick(r->mit, n);
    rpc_reply rep = {0};
    for (size_t k = 0; k < n; k++) {
        rpc_chan *ch = router_chan(r, cmap_node_at(m, idx[(start + k) % n])->addr);
        rv = ch ? rpc_call(ch, "kv.Get", cmap_epoch(m), &req->base, repl_forward_deadline(c), &rep)
                : KV_UNAVAILABLE;
        if (rv == KV_OK || !repl_transport_err(rv)) /* else the next replica */
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

/* A forwarded call between router_*_start and router_finish. */
typedef struct router_call {
    router *r;
    ProtobufCMessage *req; /* unpacked request, in ar */
    const ProtobufCBinaryData *key;
    bool write; /* the finish drops the key from the hot-key cache */
    repl_call *rc;
    rpc_async *a; /* the asynchronous form's call (router_*_async), and its c */
    rpc_ctx *c;
    rpc_arena ar; /* the request (a GET's fits buf) */
    uint8_t buf[256];
} router_call;

static void call_free(router_call *rc)
{
    rpc_arena_reset(&rc->ar);
    free(rc);
}

/* A call whose request is unpacked from body into its arena (NULL with c's
 * status in *rv when it is malformed or memory runs out). */
static router_call *call_new(router *r, rpc_ctx *c, const ProtobufCMessageDescriptor *d,
                             const uint8_t *body, size_t len, kv_err *rv)
{
    router_call *rc = malloc(sizeof(*rc));
    if (!rc) {
        *rv = rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    *rc = (router_call){.r = r};
    rpc_arena_init(&rc->ar, rc->buf, sizeof(rc->buf));
    if (!(rc->req = rpc_arena_request(&rc->ar, c, d, body, len, router_budget(r, len)))) {
        *rv = KV_INVALID_ARGUMENT;
        call_free(rc);
        return NULL;
    }
    *rv = KV_OK;
    return rc;
}

/* Starts rc's replication (or completes a call that failed already: rc is
 * freed and *state left NULL). */
static kv_err call_start(router *r, rpc_ctx *c, kv_err rv, router_call *rc,
                         const ProtobufCBinaryData *key, void **state)
{
    ProtobufCMessage *req = rc->req;
    rc->key = key;
    if (rv == KV_OK) {
        if (req->descriptor == &kv__get_request__descriptor) {
            rv = repl_get_start(&r->env, c, (Kv__GetRequest *)req, &rc->rc);
        } else {
            rc->write = true;
            rv = req->descriptor == &kv__put_request__descriptor
                     ? repl_put_start(&r->env, c, (Kv__PutRequest *)req, &rc->rc)
                     : repl_delete_start(&r->env, c, (Kv__DeleteRequest *)req, &rc->rc);
        }
    }
    if (rv == KV_OK && rc->rc) {
        *state = rc;
        return KV_OK;
    }
    if (rc->write)
        router_mit_invalidate(r->mit, key->data, key->len);
    call_free(rc);
    return rv;
}

/* Ends a call whose replication finished: drops a written key from the
 * hot-key cache and frees the request and rc. */
static void call_end(router_call *rc)
{
    if (rc->write)
        router_mit_invalidate(rc->r->mit, rc->key->data, rc->key->len);
    call_free(rc);
}

kv_err router_finish(rpc_ctx *c, void *state)
{
    router_call *rc = state;
    kv_err rv = repl_finish(rc->rc, c);
    call_end(rc);
    return rv;
}

kv_err router_get_start(rpc_ctx *c, const uint8_t *body, size_t len, void **state)
{
    router *r = c->user;
    atomic_fetch_add_explicit(&r->requests, 1, memory_order_relaxed);
    kv_err rv;
    router_call *rc = call_new(r, c, &kv__get_request__descriptor, body, len, &rv);
    if (!rc)
        return rv;
    Kv__GetRequest *req = (Kv__GetRequest *)rc->req;
    rv = kv_check_key(&r->cfg.limits, req->key.len, c->message, sizeof(c->message));
    if (rv == KV_OK)
        router_hot_sample(r, c->worker, req->key.data, req->key.len);
    bool one =
        req->consistency == KV__CONSISTENCY__DEFAULT || req->consistency == KV__CONSISTENCY__ONE;
    if (rv == KV_OK && r->mit && one && router_mit_flagged(r->mit, req->key.data, req->key.len)) {
        rv = get_hot(r, c, req); /* complete now */
        call_free(rc);
        return rv;
    }
    return call_start(r, c, rv, rc, &req->key, state);
}

kv_err router_put_start(rpc_ctx *c, const uint8_t *body, size_t len, void **state)
{
    router *r = c->user;
    atomic_fetch_add_explicit(&r->requests, 1, memory_order_relaxed);
    kv_err rv;
    router_call *rc = call_new(r, c, &kv__put_request__descriptor, body, len, &rv);
    if (!rc)
        return rv;
    Kv__PutRequest *req = (Kv__PutRequest *)rc->req;
    rv = kv_check_key(&r->cfg.limits, req->key.len, c->message, sizeof(c->message));
    if (rv == KV_OK)
        router_hot_sample(r, c->worker, req->key.data, req->key.len);
    if (rv == KV_OK)
        rv = kv_check_value(&r->cfg.limits, req->value.len, c->message, sizeof(c->message));
    req->version = 0; /* a client's version is ignored: the router's clock gives it */
    if (rv == KV_OK)  /* before now + ttl_ms is computed for hints */
        rv = kv_check_ttl(req->ttl_ms, c->message, sizeof(c->message));
    return call_start(r, c, rv, rc, &req->key, state);
}

kv_err router_delete_start(rpc_ctx *c, const uint8_t *body, size_t len, void **state)
{
    router *r = c->user;
    atomic_fetch_add_explicit(&r->requests, 1, memory_order_relaxed);
    kv_err rv;
    router_call *rc = call_new(r, c, &kv__delete_request__descriptor, body, len, &rv);
    if (!rc)
        return rv;
    Kv__DeleteRequest *req = (Kv__DeleteRequest *)rc->req;
    rv = kv_check_key(&r->cfg.limits, req->key.len, c->message, sizeof(c->message));
    if (rv == KV_OK)
        router_hot_sample(r, c->worker, req->key.data, req->key.len);
    req->version = 0; /* a client's version is ignored: the router's clock gives it */
    return call_start(r, c, rv, rc, &req->key, state);
}

kv_err router_h_batch(rpc_ctx *c, const uint8_t *body, size_t len)
{
    router *r = c->user;
    atomic_fetch_add_explicit(&r->requests, 1, memory_order_relaxed);
    kv_err rv = repl_check_batch_wire(&r->cfg.limits, c, body, len); /* before unpacking */
    if (rv != KV_OK)
        return rv;
    rpc_budget b;
    Kv__BatchRequest *req =
        kv__batch_request__unpack(rpc_budget_init(&b, router_budget(r, len)), len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__BatchRequest body");
    rv = repl_check_ops(&r->cfg.limits, c, req, len);
    for (size_t i = 0; rv == KV_OK && i < req->n_ops; i++) {
        router_hot_sample(r, c->worker, req->ops[i]->key.data, req->ops[i]->key.len);
        req->ops[i]->version = 0; /* the router's clock gives them, never a client */
    }
    if (rv == KV_OK)
        rv = repl_batch(&r->env, c, req);
    for (size_t i = 0; r->mit && i < req->n_ops; i++)
        if (req->ops[i]->type != KV__OP_TYPE__GET)
            router_mit_invalidate(r->mit, req->ops[i]->key.data, req->ops[i]->key.len);
    kv__batch_request__free_unpacked(req, NULL);
    return rv;
}

/* ---- the asynchronous form (rpc_method.start_async) ----------------------
 * The same calls, started on the nng thread that received them and
 * completed from the reply that decides them (repl_await), so no worker
 * waits for a node: a worker only takes the rest of a call that must block
 * (a read's other replicas, a retry on a newer map, hints stored
 * synchronously). */

/* repl_await's completion: the verdict here, or the rest on a worker. */
static void call_ready(void *arg, bool ready)
{
    router_call *rc = arg;
    kv_err rv;
    if (ready && repl_complete(rc->rc, rc->c, &rv)) {
        rpc_async *a = rc->a;
        call_end(rc);
        rpc_async_done(a, rv);
        return;
    }
    rpc_async_handoff(rc->a, router_finish, rc);
}

/* Takes call a whose start gave rv and state (see call_start). */
static bool go_async(rpc_ctx *c, kv_err rv, void *state, rpc_async *a)
{
    if (!state) {
        rpc_async_done(a, rv);
        return true;
    }
    router_call *rc = state;
    rc->a = a;
    rc->c = c;
    repl_await(rc->rc, call_ready, rc);
    return true;
}

bool router_get_async(rpc_ctx *c, const uint8_t *body, size_t len, rpc_async *a)
{
    router *r = c->user;
    if (r->mit) { /* a flagged hot key's read may block (get_hot): a worker's */
        uint8_t buf[256];
        rpc_arena ar;
        rpc_arena_init(&ar, buf, sizeof(buf));
        Kv__GetRequest *req =
            kv__get_request__unpack(rpc_arena_pb(&ar, router_budget(r, len)), len, body);
        bool hot = req &&
                   (req->consistency == KV__CONSISTENCY__DEFAULT ||
                    req->consistency == KV__CONSISTENCY__ONE) &&
                   router_mit_flagged(r->mit, req->key.data, req->key.len);
        rpc_arena_reset(&ar);
        if (hot)
            return false;
    }
    void *state = NULL;
    kv_err rv = router_get_start(c, body, len, &state);
    return go_async(c, rv, state, a);
}

bool router_put_async(rpc_ctx *c, const uint8_t *body, size_t len, rpc_async *a)
{
    void *state = NULL;
    kv_err rv = router_put_start(c, body, len, &state);
    return go_async(c, rv, state, a);
}

bool router_delete_async(rpc_ctx *c, const uint8_t *body, size_t len, rpc_async *a)
{
    void *state = NULL;
    kv_err rv = router_delete_start(c, body, len, &state);
    return go_async(c, rv, state, a);
}
