/* SPDX-License-Identifier: MIT */
/*
 * A node coordinating a request for a smart client (Envelope.coordinate,
 * issue 15): kv.Get/Put/Delete/Batch are checked against the limits and
 * handed to the replication library (shard/repl.h), the code the router
 * runs, with this node's map, its channels to its peers, its engine's clock
 * for the versions, and an in-process call for its own replica (which then
 * goes through the same checks as a replica call from a router). A write's
 * version is always the coordinator's: a version sent by a client is
 * ignored, since only internal traffic may carry one.
 *
 * Coordinate calls run on the RPC server's coordinate lane (--coord-workers):
 * they wait for other nodes' replica calls, which run on the other lane and
 * never wait on another node, so two nodes coordinating for each other
 * cannot take each other's last worker.
 */
#include <stdlib.h>
#include <string.h>

#include "node/node.h"
#include "proto/kv.pb-c.h"

static rpc_chan *env_chan(void *user, const char *addr)
{
    return node_chan(user, addr);
}

static void env_learn_map(void *user, const uint8_t *body, size_t len)
{
    node_map_learn(user, body, len);
}

void node_coord_init(node *n)
{
    n->env = (repl_env){.user = n,
                        .maps = n->maps,
                        .hlc = engine_hlc(n->eng),
                        .stats = &n->coord,
                        .stopping = &n->stopping,
                        .chan = env_chan,
                        .learn_map = env_learn_map,
                        .self_id = n->cfg.id,
                        .local = node_local_call};
}

/* The map checks of a coordinate call: the node needs a map (a client that
 * knows one is talking to a cluster); a newer epoch from the client makes
 * the node fetch its map. An older one is fine: the node coordinates with
 * its own, and the reply's epoch tells the client to refresh. */
static kv_err coord_begin(node *n, rpc_ctx *c)
{
    atomic_fetch_add_explicit(&n->coord_requests, 1, memory_order_relaxed);
    uint64_t have = cmap_slot_epoch(n->maps);
    if (c->map_epoch > have)
        node_map_saw_epoch(n, c->map_epoch);
    if (!have) {
        char why[200];
        node_serving(n, why, sizeof(why));
        return rpc_fail(c, KV_UNAVAILABLE, "node %s cannot coordinate: %s", n->cfg.id, why);
    }
    return KV_OK;
}

kv_err node_coord_get(rpc_ctx *c, const uint8_t *body, size_t len)
{
    node *n = c->user;
    Kv__GetRequest *req = kv__get_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__GetRequest body");
    kv_err rv = kv_check_key(&n->cfg.limits, req->key.len, c->message, sizeof(c->message));
    if (rv == KV_OK)
        rv = coord_begin(n, c);
    if (rv == KV_OK)
        rv = repl_get(&n->env, c, req);
    kv__get_request__free_unpacked(req, NULL);
    return rv;
}

kv_err node_coord_put(rpc_ctx *c, const uint8_t *body, size_t len)
{
    node *n = c->user;
    Kv__PutRequest *req = kv__put_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__PutRequest body");
    kv_err rv = kv_check_key(&n->cfg.limits, req->key.len, c->message, sizeof(c->message));
    if (rv == KV_OK)
        rv = kv_check_value(&n->cfg.limits, req->value.len, c->message, sizeof(c->message));
    if (rv == KV_OK)
        rv = coord_begin(n, c);
    if (rv == KV_OK) {
        req->version = 0; /* the coordinator's clock gives it */
        rv = repl_put(&n->env, c, req);
    }
    kv__put_request__free_unpacked(req, NULL);
    return rv;
}

kv_err node_coord_delete(rpc_ctx *c, const uint8_t *body, size_t len)
{
    node *n = c->user;
    Kv__DeleteRequest *req = kv__delete_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__DeleteRequest body");
    kv_err rv = kv_check_key(&n->cfg.limits, req->key.len, c->message, sizeof(c->message));
    if (rv == KV_OK)
        rv = coord_begin(n, c);
    if (rv == KV_OK) {
        req->version = 0;
        rv = repl_delete(&n->env, c, req);
    }
    kv__delete_request__free_unpacked(req, NULL);
    return rv;
}

kv_err node_coord_batch(rpc_ctx *c, const uint8_t *body, size_t len)
{
    node *n = c->user;
    Kv__BatchRequest *req = kv__batch_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__BatchRequest body");
    kv_err rv = repl_check_ops(&n->cfg.limits, c, req, len);
    for (size_t i = 0; i < req->n_ops; i++)
        req->ops[i]->version = 0; /* the coordinator's clock gives them */
    if (rv == KV_OK)
        rv = coord_begin(n, c);
    if (rv == KV_OK)
        rv = repl_batch(&n->env, c, req);
    kv__batch_request__free_unpacked(req, NULL);
    return rv;
}

void node_coord_stats(node *n, rpc_statlist *l)
{
    const repl_stats *s = &n->coord;
    rpc_stats_add(l, "coord.requests", "%llu", (unsigned long long)atomic_load(&n->coord_requests));
    rpc_stats_add(l, "coord.forwards", "%llu", (unsigned long long)atomic_load(&s->forwards));
    rpc_stats_add(l, "coord.forward_errors", "%llu",
                  (unsigned long long)atomic_load(&s->forward_errors));
    rpc_stats_add(l, "coord.hints_sent", "%llu", (unsigned long long)atomic_load(&s->hints_sent));
    rpc_stats_add(l, "coord.hint_errors", "%llu", (unsigned long long)atomic_load(&s->hint_errors));
    rpc_stats_add(l, "coord.read_repairs", "%llu",
                  (unsigned long long)atomic_load(&s->read_repairs));
}
