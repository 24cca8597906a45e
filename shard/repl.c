/* SPDX-License-Identifier: MIT */
/*
 * Replication helpers of a coordinator (DESIGN.md §4 "Repair and failure
 * handling"): the order in which a read asks replicas (healthy ones first,
 * per the failure detector's health bytes), hinted handoff (a live replica
 * keeps the versioned record for a replica that missed it), read repair (a
 * read that saw different versions writes the newest back to the stale
 * replicas), and sending to a replica, which on a coordinating node may be
 * the node itself (an in-process call). Hints and repairs are versioned
 * records applied by last-writer-wins, so they are idempotent and may
 * arrive late or twice.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "shard/repl_int.h"

#define SIDE_DEADLINE_MS 5000u
/* Time kept back from a forward's deadline so the coordinator's own verdict
 * (UNAVAILABLE for a node that died mid-call, DEADLINE_EXCEEDED for a slow
 * one) reaches the client before the client gives up: at most a tenth of
 * the deadline. 20 ms was too little on a loaded host (the client saw its
 * own DEADLINE_EXCEEDED instead of the router's UNAVAILABLE). */
#define FORWARD_MARGIN_MS 100u

uint32_t repl_forward_deadline(const rpc_ctx *c)
{
    uint32_t left = rpc_ctx_remaining_ms(c);
    uint32_t margin = left / 10 > FORWARD_MARGIN_MS ? FORWARD_MARGIN_MS : left / 10;
    return left > margin + 1 ? left - margin : 1;
}

kv_err repl_check_batch_wire(const kv_limits *l, rpc_ctx *c, const uint8_t *body, size_t len)
{
    size_t nops = 0;
    if (!rpc_pb_count(body, len, 1 /* BatchRequest.ops */, &nops))
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__BatchRequest body");
    return kv_check_batch(l, nops, len, c->message, sizeof(c->message));
}

kv_err repl_check_op_types(rpc_ctx *c, const Kv__BatchRequest *req)
{
    for (size_t i = 0; i < req->n_ops; i++) {
        Kv__OpType t = req->ops[i]->type;
        if (t != KV__OP_TYPE__GET && t != KV__OP_TYPE__PUT && t != KV__OP_TYPE__DELETE)
            return rpc_fail(c, KV_INVALID_ARGUMENT,
                            "op %zu: unknown type %d (GET %d, PUT %d, DELETE %d)", i, (int)t,
                            KV__OP_TYPE__GET, KV__OP_TYPE__PUT, KV__OP_TYPE__DELETE);
    }
    return KV_OK;
}

kv_err repl_check_ops(const kv_limits *l, rpc_ctx *c, const Kv__BatchRequest *req, size_t len)
{
    kv_err rv = kv_check_batch(l, req->n_ops, len, c->message, sizeof(c->message));
    if (rv == KV_OK)
        rv = repl_check_op_types(c, req);
    for (size_t i = 0; rv == KV_OK && i < req->n_ops; i++) {
        const Kv__Op *op = req->ops[i];
        char why[200];
        rv = kv_check_key(l, op->key.len, why, sizeof(why));
        if (rv == KV_OK && op->type != KV__OP_TYPE__GET)
            rv = kv_check_value(l, op->value.len, why, sizeof(why));
        if (rv == KV_OK && op->type == KV__OP_TYPE__PUT)
            rv = kv_check_ttl(op->ttl_ms, why, sizeof(why));
        if (rv != KV_OK)
            rv = rpc_fail(c, rv, "op %zu: %s", i, why);
    }
    return rv;
}

int repl_acks_needed(Kv__Consistency c, Kv__Consistency dflt, int n)
{
    if (c == KV__CONSISTENCY__DEFAULT)
        c = dflt;
    int need = c == KV__CONSISTENCY__ONE ? 1 : c == KV__CONSISTENCY__ALL ? n : n / 2 + 1;
    return need < 1 ? 1 : need > n ? n : need;
}

bool repl_transport_err(kv_err s)
{
    /* RESOURCE_EXHAUSTED: the node refused the call without running it
     * (overload, rpc_server.c) or could not apply it; either way it holds
     * no verdict, and a write it missed gets a hint like for a dead node */
    return s == KV_UNAVAILABLE || s == KV_DEADLINE_EXCEEDED || s == KV_CANCELLED ||
           s == KV_RESOURCE_EXHAUSTED;
}

bool repl_carries_map(const rpc_reply *r)
{
    return r->status == KV_FAILED_PRECONDITION && r->len > 0;
}

cmap *repl_map(const repl_env *env, rpc_ctx *c, kv_err *rv)
{
    cmap *m = cmap_slot_get(env->maps);
    if (!m)
        *rv = rpc_fail(c, KV_UNAVAILABLE, "%s has no cluster map yet (cluster not initialised?)",
                       env->self_id ? "node" : "router");
    else
        c->reply_epoch = cmap_epoch(m);
    return m;
}

int repl_read_order(cmap *m, const uint32_t *idx, int n, uint32_t *order)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        if (cmap_readable(m, idx[i]))
            order[k++] = idx[i];
    int readable = k;
    for (int i = 0; i < n; i++)
        if (!cmap_readable(m, idx[i]))
            order[k++] = idx[i];
    return readable;
}

bool repl_is_self(const repl_env *env, cmap *m, uint32_t i)
{
    return env->self_id && env->local && strcmp(cmap_node_at(m, i)->id, env->self_id) == 0;
}

void repl_send(const repl_env *env, fanout *f, cmap *m, uint32_t i, const char *method,
               const ProtobufCMessage *msg, uint32_t deadline_ms, repl_local_call *lc)
{
    if (repl_is_self(env, m, i) && lc->slot < 0) {
        *lc = (repl_local_call){fan_reserve(f), method, msg, cmap_epoch(m), deadline_ms};
        return;
    }
    const cmap_node *node = cmap_node_at(m, i);
    fan_send_ctr(f, env->chan(env->user, node->addr), method, cmap_epoch(m), msg, deadline_ms,
                 env->target_ctr ? env->target_ctr(env->user, node->id) : NULL);
}

/* msg packed into a malloc'ed buffer (*len bytes); NULL when out of memory. */
static uint8_t *pack(const ProtobufCMessage *msg, size_t *len)
{
    *len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = malloc(*len ? *len : 1);
    if (buf)
        protobuf_c_message_pack(msg, buf);
    return buf;
}

/* Runs method(msg) on the coordinator's own replica into *out. */
void repl_call_local(const repl_env *env, const char *method, uint64_t epoch,
                     const ProtobufCMessage *msg, uint32_t deadline_ms, rpc_reply *out)
{
    size_t len;
    uint8_t *buf = pack(msg, &len);
    if (!buf) {
        *out = (rpc_reply){.status = KV_RESOURCE_EXHAUSTED, .local = true};
        return;
    }
    env->local(env->user, method, epoch, buf, len, deadline_ms, out);
    free(buf);
}

bool repl_try_local(const repl_env *env, const char *method, uint64_t epoch,
                    const ProtobufCMessage *msg, uint32_t deadline_ms, rpc_reply *out)
{
    if (!env->local_try)
        return false;
    size_t len;
    uint8_t *buf = pack(msg, &len);
    bool done = buf && env->local_try(env->user, method, epoch, buf, len, deadline_ms, out);
    free(buf);
    return done;
}

void repl_run_local(const repl_env *env, fanout *f, repl_local_call *lc)
{
    if (lc->slot < 0)
        return;
    rpc_reply r;
    repl_call_local(env, lc->method, lc->epoch, lc->msg, lc->deadline_ms, &r);
    fan_complete(f, lc->slot, &r);
    lc->slot = -1;
}

typedef struct side_call {
    _Atomic uint64_t *errors;
} side_call;

static void side_done(void *arg, rpc_reply *rep)
{
    side_call *sc = arg;
    if (rep->status != KV_OK) {
        atomic_fetch_add(sc->errors, 1);
        KV_DEBUG("repl", "side write failed: %s", rep->message ? rep->message : "");
    }
    rpc_reply_free(rep);
    free(sc);
}

/* An asynchronous write beside the data path (a hint, a repair), to any
 * node, the coordinator's own included (through its channel: the caller
 * may be an nng callback, which must not run the call itself). */
static void side_send(const repl_env *env, const char *addr, const char *method, uint64_t epoch,
                      const ProtobufCMessage *msg, _Atomic uint64_t *errors)
{
    rpc_chan *ch = atomic_load(env->stopping) ? NULL : env->chan(env->user, addr);
    side_call *sc = ch ? malloc(sizeof(*sc)) : NULL;
    if (!sc) {
        atomic_fetch_add(errors, 1);
        return;
    }
    sc->errors = errors;
    rpc_call_async(ch, method, epoch, msg, SIDE_DEADLINE_MS, side_done, sc);
}

void repl_send_hint(const repl_env *env, cmap *m, uint32_t holder, uint32_t target,
                    Kv__Record *const *recs, size_t n)
{
    Kv__HintRequest req = KV__HINT_REQUEST__INIT;
    req.target = (char *)cmap_node_at(m, target)->id;
    req.n_records = n;
    req.records = (Kv__Record **)recs;
    atomic_fetch_add_explicit(&env->stats->hints_sent, n, memory_order_relaxed);
    side_send(env, cmap_node_at(m, holder)->addr, "admin.Hint", cmap_epoch(m), &req.base,
              &env->stats->hint_errors);
}

kv_err repl_store_hint(const repl_env *env, cmap *m, uint32_t holder, uint32_t target,
                       Kv__Record *const *recs, size_t n, uint32_t deadline_ms)
{
    Kv__HintRequest req = KV__HINT_REQUEST__INIT;
    req.target = (char *)cmap_node_at(m, target)->id;
    req.n_records = n;
    req.records = (Kv__Record **)recs;
    rpc_reply rep = {0};
    kv_err rv = KV_UNAVAILABLE;
    if (atomic_load(env->stopping)) {
        rv = KV_UNAVAILABLE;
    } else if (repl_is_self(env, m, holder)) {
        repl_call_local(env, "admin.Hint", cmap_epoch(m), &req.base, deadline_ms, &rep);
        rv = rep.status;
    } else {
        rpc_chan *ch = env->chan(env->user, cmap_node_at(m, holder)->addr);
        rv = ch ? rpc_call(ch, "admin.Hint", cmap_epoch(m), &req.base, deadline_ms, &rep)
                : KV_UNAVAILABLE;
    }
    rpc_reply_free(&rep);
    atomic_fetch_add_explicit(rv == KV_OK ? &env->stats->hints_sent : &env->stats->hint_errors, n,
                              memory_order_relaxed);
    return rv;
}

void repl_read_repair(const repl_env *env, cmap *m, const ProtobufCBinaryData *key,
                      const uint32_t *idx, const rpc_reply *reps, const bool *have, int n)
{
    int oks = 0;
    for (int i = 0; i < n; i++)
        oks += have[i] && reps[i].status == KV_OK;
    if (oks < 2)
        return; /* one answer has nothing to compare with */
    Kv__GetReply *g[CMAP_MAX_RF * 2] = {0};
    uint8_t buf[1024];
    rpc_arena ar; /* the unpacked replies, gone at the end */
    rpc_arena_init(&ar, buf, sizeof(buf));
    int best = -1, answers = 0;
    for (int i = 0; i < n; i++) {
        if (!have[i] || reps[i].status != KV_OK ||
            !(g[i] = kv__get_reply__unpack(rpc_arena_pb(&ar, SIZE_MAX), reps[i].len, reps[i].body)))
            continue;
        answers++;
        if (best < 0 || g[i]->version > g[best]->version)
            best = i;
    }
    if (answers >= 2 && g[best]->version) {
        Kv__Record rec = KV__RECORD__INIT;
        rec.key = *key;
        rec.version = g[best]->version;
        rec.tombstone = !g[best]->found;
        rec.value = g[best]->found ? g[best]->value : (ProtobufCBinaryData){0, NULL};
        rec.expire_at_ms = g[best]->expire_at_ms;
        Kv__Record *ptr = &rec;
        Kv__ApplyRequest req = KV__APPLY_REQUEST__INIT;
        req.n_records = 1;
        req.records = &ptr;
        for (int i = 0; i < n; i++) {
            if (!g[i] || g[i]->version >= g[best]->version)
                continue;
            atomic_fetch_add_explicit(&env->stats->read_repairs, 1, memory_order_relaxed);
            side_send(env, cmap_node_at(m, idx[i])->addr, "admin.Apply", cmap_epoch(m), &req.base,
                      &env->stats->hint_errors);
        }
    }
    rpc_arena_reset(&ar);
}
