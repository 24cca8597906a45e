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
 * Coordinate calls start on the receiving nng thread (node_coord_*_async)
 * and complete from the reply that decides them; what must block (a map to
 * fetch, the own replica's disk work, a slow first replica, a retry, hints
 * for pending replicas) runs on the RPC server's coordinate lane
 * (--coord-workers). Such a worker waits for other nodes' replica calls,
 * which run on the other lane and never wait on another node, so two nodes
 * coordinating for each other cannot take each other's last worker.
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
    ProtobufCMessage *req; /* unpacked request, in ar */
    repl_call *rc;
    rpc_async *a; /* the asynchronous form's call (node_coord_*_async), and its c */
    rpc_ctx *c;
    rpc_arena ar; /* the request (a GET's fits buf) */
    uint8_t buf[256];
} coord_call;

static void coord_free(coord_call *cc)
{
    rpc_arena_reset(&cc->ar);
    free(cc);
}

/* A call whose request is unpacked from body into its arena (NULL with c's
 * status in *rv when it is malformed or memory runs out). */
static coord_call *coord_new(node *n, rpc_ctx *c, const ProtobufCMessageDescriptor *d,
                             const uint8_t *body, size_t len, kv_err *rv)
{
    coord_call *cc = malloc(sizeof(*cc));
    if (!cc) {
        *rv = rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    *cc = (coord_call){0};
    rpc_arena_init(&cc->ar, cc->buf, sizeof(cc->buf));
    if (!(cc->req = rpc_arena_request(&cc->ar, c, d, body, len, coord_budget(n, len)))) {
        *rv = KV_INVALID_ARGUMENT;
        coord_free(cc);
        return NULL;
    }
    *rv = KV_OK;
    return cc;
}

/* Starts cc's replication (or frees cc when the call failed already);
 * nb: without blocking (repl_*_start_nb), for the asynchronous form. */
static kv_err coord_start(node *n, rpc_ctx *c, kv_err rv, coord_call *cc, bool nb, void **state)
{
    ProtobufCMessage *req = cc->req;
    if (rv == KV_OK)
        rv = coord_begin(n, c);
    if (rv == KV_OK) {
        if (req->descriptor == &kv__get_request__descriptor) {
            Kv__GetRequest *g = (Kv__GetRequest *)req;
            rv = nb ? repl_get_start_nb(&n->env, c, g, &cc->rc)
                    : repl_get_start(&n->env, c, g, &cc->rc);
        } else if (req->descriptor == &kv__put_request__descriptor) {
            Kv__PutRequest *p = (Kv__PutRequest *)req;
            p->version = 0; /* the coordinator's clock gives it */
            rv = nb ? repl_put_start_nb(&n->env, c, p, &cc->rc)
                    : repl_put_start(&n->env, c, p, &cc->rc);
        } else {
            Kv__DeleteRequest *d = (Kv__DeleteRequest *)req;
            d->version = 0;
            rv = nb ? repl_delete_start_nb(&n->env, c, d, &cc->rc)
                    : repl_delete_start(&n->env, c, d, &cc->rc);
        }
    }
    if (rv == KV_OK && cc->rc) { /* NULL: the node's own replica answered (read_self) */
        *state = cc;
        return KV_OK;
    }
    coord_free(cc);
    return rv;
}

static void coord_end(coord_call *cc)
{
    coord_free(cc);
}

kv_err node_coord_finish(rpc_ctx *c, void *state)
{
    coord_call *cc = state;
    kv_err rv = repl_finish(cc->rc, c);
    coord_end(cc);
    return rv;
}

/* ---- the asynchronous form (rpc_method.start_async) ----------------------
 * Coordinate calls started on the receiving nng thread and completed from
 * the reply that decides them (repl_await), as a router's are: no
 * coordinate worker waits for the other replicas. The node's own replica
 * is written (or read) there when it can be without blocking (its
 * try_inline form: a record in memory, no fsync per write); otherwise, and
 * whenever the rest of a call must block (repl_await), a coordinate worker
 * finishes it. Calls whose map work must block (no map yet, a newer epoch
 * from the client) are declined before anything starts. */

/* repl_await's completion: the verdict here, or the rest on a worker. */
static void coord_ready(void *arg, bool ready)
{
    coord_call *cc = arg;
    kv_err rv;
    if (ready && repl_complete(cc->rc, cc->c, &rv)) {
        rpc_async *a = cc->a;
        coord_end(cc);
        rpc_async_done(a, rv);
        return;
    }
    rpc_async_handoff(cc->a, node_coord_finish, cc);
}

/* Whether a coordinate call may start here: coord_begin's map work (a
 * node without a map, a client with a newer epoch) is left to a worker. */
static bool coord_nb_ok(node *n, const rpc_ctx *c)
{
    uint64_t have = cmap_slot_epoch(n->maps);
    return have && c->map_epoch <= have;
}

/* Takes call a whose start gave rv and state (see coord_start). */
static bool coord_go_async(rpc_ctx *c, kv_err rv, void *state, rpc_async *a)
{
    if (!state) {
        rpc_async_done(a, rv);
        return true;
    }
    coord_call *cc = state;
    cc->a = a;
    cc->c = c;
    repl_await(cc->rc, coord_ready, cc);
    return true;
}

static kv_err get_begin(rpc_ctx *c, const uint8_t *body, size_t len, bool nb, void **state)
{
    node *n = c->user;
    kv_err rv;
    coord_call *cc = coord_new(n, c, &kv__get_request__descriptor, body, len, &rv);
    if (!cc)
        return rv;
    Kv__GetRequest *req = (Kv__GetRequest *)cc->req;
    rv = kv_check_key(&n->cfg.limits, req->key.len, c->message, sizeof(c->message));
    return coord_start(n, c, rv, cc, nb, state);
}

static kv_err put_begin(rpc_ctx *c, const uint8_t *body, size_t len, bool nb, void **state)
{
    node *n = c->user;
    kv_err rv;
    coord_call *cc = coord_new(n, c, &kv__put_request__descriptor, body, len, &rv);
    if (!cc)
        return rv;
    Kv__PutRequest *req = (Kv__PutRequest *)cc->req;
    rv = kv_check_key(&n->cfg.limits, req->key.len, c->message, sizeof(c->message));
    if (rv == KV_OK)
        rv = kv_check_value(&n->cfg.limits, req->value.len, c->message, sizeof(c->message));
    if (rv == KV_OK) /* before now + ttl_ms is computed for hints */
        rv = kv_check_ttl(req->ttl_ms, c->message, sizeof(c->message));
    return coord_start(n, c, rv, cc, nb, state);
}

static kv_err delete_begin(rpc_ctx *c, const uint8_t *body, size_t len, bool nb, void **state)
{
    node *n = c->user;
    kv_err rv;
    coord_call *cc = coord_new(n, c, &kv__delete_request__descriptor, body, len, &rv);
    if (!cc)
        return rv;
    Kv__DeleteRequest *req = (Kv__DeleteRequest *)cc->req;
    rv = kv_check_key(&n->cfg.limits, req->key.len, c->message, sizeof(c->message));
    return coord_start(n, c, rv, cc, nb, state);
}

kv_err node_coord_get_start(rpc_ctx *c, const uint8_t *body, size_t len, void **state)
{
    if (!cmap_slot_epoch(((node *)c->user)->maps))
        return node_plain_call(c, body, len); /* *state stays NULL: complete */
    return get_begin(c, body, len, false, state);
}

kv_err node_coord_put_start(rpc_ctx *c, const uint8_t *body, size_t len, void **state)
{
    if (!cmap_slot_epoch(((node *)c->user)->maps))
        return node_plain_call(c, body, len); /* *state stays NULL: complete */
    return put_begin(c, body, len, false, state);
}

kv_err node_coord_delete_start(rpc_ctx *c, const uint8_t *body, size_t len, void **state)
{
    if (!cmap_slot_epoch(((node *)c->user)->maps))
        return node_plain_call(c, body, len); /* *state stays NULL: complete */
    return delete_begin(c, body, len, false, state);
}

/* Starts a coordinate call with begin (get_begin, ...) without blocking
 * and completes it asynchronously; false, nothing started, when its map
 * work must block. */
static bool coord_async(rpc_ctx *c, const uint8_t *body, size_t len, rpc_async *a,
                        kv_err (*begin)(rpc_ctx *, const uint8_t *, size_t, bool, void **))
{
    if (!coord_nb_ok(c->user, c))
        return false;
    void *state = NULL;
    kv_err rv = begin(c, body, len, true, &state);
    return coord_go_async(c, rv, state, a);
}

bool node_coord_get_inline(rpc_ctx *c, const uint8_t *body, size_t len, kv_err *rv)
{
    node *n = c->user;
    cmap *m = coord_nb_ok(n, c) ? cmap_slot_get(n->maps) : NULL;
    if (!m)
        return false;
    uint8_t buf[256];
    rpc_arena ar; /* the request, gone at the return */
    rpc_arena_init(&ar, buf, sizeof(buf));
    Kv__GetRequest *req =
        kv__get_request__unpack(rpc_arena_pb(&ar, coord_budget(n, len)), len, body);
    bool served = false;
    if (req && req->key.len && req->key.len <= n->cfg.limits.max_key &&
        repl_read_alone(&n->env, m, &req->key, req->consistency, NULL)) {
        /* the own replica's call, as read_self makes it: at the node's epoch */
        uint64_t epoch = c->map_epoch;
        c->map_epoch = cmap_epoch(m);
        kv_err st = KV_OK;
        served = node_get_mem(c, req, m, &st) && st == KV_OK;
        if (served) {
            atomic_fetch_add_explicit(&n->coord_requests, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&n->coord.forwards, 1, memory_order_relaxed);
            *rv = KV_OK;
        } else { /* no verdict of its own here: the full path decides (and words) it */
            free(c->reply);
            c->reply = NULL;
            c->reply_len = 0;
            c->message[0] = '\0';
            c->map_epoch = epoch;
        }
    }
    rpc_arena_reset(&ar);
    cmap_unref(m);
    return served;
}

bool node_coord_get_async(rpc_ctx *c, const uint8_t *body, size_t len, rpc_async *a)
{
    return coord_async(c, body, len, a, get_begin);
}

bool node_coord_put_async(rpc_ctx *c, const uint8_t *body, size_t len, rpc_async *a)
{
    return coord_async(c, body, len, a, put_begin);
}

bool node_coord_delete_async(rpc_ctx *c, const uint8_t *body, size_t len, rpc_async *a)
{
    return coord_async(c, body, len, a, delete_begin);
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
