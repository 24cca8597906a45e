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

static void env_learn_map(void *user, const rpc_reply *r, const char *from)
{
    node_map_learn(user, r, from);
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
                        .local = node_local_call,
                        .local_try = node_local_try};
}

/* What unpacking a len-byte request may allocate (issue 16 item 4). */
static size_t coord_budget(const node *n, size_t len)
{
    return rpc_unpack_budget(len, n->cfg.limits.max_batch_ops);
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

/* A coordinate call between its start and node_coord_finish. */
typedef struct coord_call {
    ProtobufCMessage *req; /* unpacked request, freed at the finish */
    repl_call *rc;
} coord_call;

/* Starts req's replication (or frees req when the call failed already). */
static kv_err coord_start(node *n, rpc_ctx *c, kv_err rv, ProtobufCMessage *req, void **state)
{
    if (rv == KV_OK)
        rv = coord_begin(n, c);
    coord_call *cc = rv == KV_OK ? calloc(1, sizeof(*cc)) : NULL;
    if (rv == KV_OK && !cc)
        rv = rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
    if (cc) {
        cc->req = req;
        if (req->descriptor == &kv__get_request__descriptor) {
            rv = repl_get_start(&n->env, c, (Kv__GetRequest *)req, &cc->rc);
        } else if (req->descriptor == &kv__put_request__descriptor) {
            ((Kv__PutRequest *)req)->version = 0; /* the coordinator's clock gives it */
            rv = repl_put_start(&n->env, c, (Kv__PutRequest *)req, &cc->rc);
        } else {
            ((Kv__DeleteRequest *)req)->version = 0;
            rv = repl_delete_start(&n->env, c, (Kv__DeleteRequest *)req, &cc->rc);
        }
    }
    if (cc && rv == KV_OK && cc->rc) { /* NULL: the node's own replica answered (read_self) */
        *state = cc;
        return KV_OK;
    }
    free(cc);
    protobuf_c_message_free_unpacked(req, NULL);
    return rv;
}

kv_err node_coord_finish(rpc_ctx *c, void *state)
{
    coord_call *cc = state;
    kv_err rv = repl_finish(cc->rc, c);
    protobuf_c_message_free_unpacked(cc->req, NULL);
    free(cc);
    return rv;
}

kv_err node_coord_get_start(rpc_ctx *c, const uint8_t *body, size_t len, void **state)
{
    node *n = c->user;
    rpc_budget b;
    Kv__GetRequest *req =
        kv__get_request__unpack(rpc_budget_init(&b, coord_budget(n, len)), len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__GetRequest body");
    kv_err rv = kv_check_key(&n->cfg.limits, req->key.len, c->message, sizeof(c->message));
    return coord_start(n, c, rv, &req->base, state);
}

/* kv.Get's asynchronous form (rpc_async_fn), for coordinate calls: a read
 * this node's own replica answers alone from its memory tier is served on
 * the receiving nng thread, without the hand-off to a coordinate worker;
 * every other call is declined and runs on a worker as before. */
bool node_coord_get_async(rpc_ctx *c, const uint8_t *body, size_t len, rpc_async *a)
{
    node *n = c->user;
    uint64_t have = cmap_slot_epoch(n->maps);
    if (!have || c->map_epoch > have) /* coord_begin's map work: a worker's */
        return false;
    rpc_budget b;
    Kv__GetRequest *req =
        kv__get_request__unpack(rpc_budget_init(&b, coord_budget(n, len)), len, body);
    kv_err rv = KV_OK;
    bool served = req && kv_check_key(&n->cfg.limits, req->key.len, NULL, 0) == KV_OK &&
                  repl_get_try_self(&n->env, c, req, &rv);
    if (req)
        kv__get_request__free_unpacked(req, NULL);
    if (!served)
        return false;
    atomic_fetch_add_explicit(&n->coord_requests, 1, memory_order_relaxed);
    rpc_async_done(a, rv);
    return true;
}

kv_err node_coord_put_start(rpc_ctx *c, const uint8_t *body, size_t len, void **state)
{
    node *n = c->user;
    rpc_budget b;
    Kv__PutRequest *req =
        kv__put_request__unpack(rpc_budget_init(&b, coord_budget(n, len)), len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__PutRequest body");
    kv_err rv = kv_check_key(&n->cfg.limits, req->key.len, c->message, sizeof(c->message));
    if (rv == KV_OK)
        rv = kv_check_value(&n->cfg.limits, req->value.len, c->message, sizeof(c->message));
    if (rv == KV_OK) /* before now + ttl_ms is computed for hints */
        rv = kv_check_ttl(req->ttl_ms, c->message, sizeof(c->message));
    return coord_start(n, c, rv, &req->base, state);
}

kv_err node_coord_delete_start(rpc_ctx *c, const uint8_t *body, size_t len, void **state)
{
    node *n = c->user;
    rpc_budget b;
    Kv__DeleteRequest *req =
        kv__delete_request__unpack(rpc_budget_init(&b, coord_budget(n, len)), len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__DeleteRequest body");
    kv_err rv = kv_check_key(&n->cfg.limits, req->key.len, c->message, sizeof(c->message));
    return coord_start(n, c, rv, &req->base, state);
}

kv_err node_coord_batch(rpc_ctx *c, const uint8_t *body, size_t len)
{
    node *n = c->user;
    kv_err rv = repl_check_batch_wire(&n->cfg.limits, c, body, len); /* before unpacking */
    if (rv != KV_OK)
        return rv;
    rpc_budget b;
    Kv__BatchRequest *req =
        kv__batch_request__unpack(rpc_budget_init(&b, coord_budget(n, len)), len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__BatchRequest body");
    rv = repl_check_ops(&n->cfg.limits, c, req, len);
    for (size_t i = 0; i < req->n_ops; i++)
        req->ops[i]->version = 0; /* the coordinator's clock gives them */
    if (rv == KV_OK)
        rv = coord_begin(n, c);
    if (rv == KV_OK)
        rv = repl_batch(&n->env, c, req);
    kv__batch_request__free_unpacked(req, NULL);
    return rv;
}

void node_coord_stats(node *n, kv_stats *l)
{
    const repl_stats *s = &n->coord;
    kv_stat_counter(l, "coord.requests", "hotkv_node_coord_requests_total", NULL,
                    "Requests this node coordinated for smart clients.",
                    atomic_load(&n->coord_requests));
    kv_stat_counter(l, "coord.forwards", "hotkv_node_coord_forwards_total", NULL,
                    "Replica calls sent while coordinating.", atomic_load(&s->forwards));
    kv_stat_counter(l, "coord.forward_errors", "hotkv_node_coord_forward_errors_total", NULL,
                    "Coordinated requests that failed for want of replicas.",
                    atomic_load(&s->forward_errors));
    kv_stat_counter(l, "coord.hints_sent", "hotkv_node_coord_hints_sent_total", NULL,
                    "Hinted records sent while coordinating.", atomic_load(&s->hints_sent));
    kv_stat_counter(l, "coord.hint_errors", "hotkv_node_coord_hint_errors_total", NULL,
                    "Hints that could not be stored.", atomic_load(&s->hint_errors));
    kv_stat_counter(l, "coord.read_repairs", "hotkv_node_coord_read_repairs_total", NULL,
                    "Read repairs sent while coordinating.", atomic_load(&s->read_repairs));
}
