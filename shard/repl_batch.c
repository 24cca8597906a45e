/* SPDX-License-Identifier: MIT */
/*
 * kv.Batch at the router: validate every op, give each write a version,
 * split the ops by node (writes to every replica, reads to every replica at
 * QUORUM/ALL or to the first reachable one at ONE), send the sub-batches
 * at once, and merge the per-op results back in the request's order.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard/router.h"
#include "common/clock.h"
#include "shard/router_fan.h"

static bool carries_map(const rpc_reply *r)
{
    return r->status == KV_FAILED_PRECONDITION && r->len > 0;
}

/* Per-op bookkeeping while merging. */
typedef struct op_merge {
    int ok, sent, need;
    int pend, pend_ok;  /* pending replicas (a transition) and their acks */
    int holder;         /* a node that acknowledged the op (hints), -1 = none */
    Kv__OpResult *best; /* borrowed from a node's unpacked reply */
    kv_err err;
    const char *errmsg;
} op_merge;

typedef struct batch_plan {
    size_t nnodes;
    Kv__Op ***node_ops; /* per node: the ops it gets */
    size_t **node_pos;  /* per node: op index of each */
    bool **node_pend;   /* per node: whether it is a pending replica of each */
    size_t *node_n;
    Kv__BatchReply **replies; /* per node, unpacked */
} batch_plan;

static void plan_free(batch_plan *p)
{
    for (size_t j = 0; j < p->nnodes; j++) {
        free(p->node_ops ? p->node_ops[j] : NULL);
        free(p->node_pos ? p->node_pos[j] : NULL);
        free(p->node_pend ? p->node_pend[j] : NULL);
        if (p->replies && p->replies[j])
            kv__batch_reply__free_unpacked(p->replies[j], NULL);
    }
    free(p->node_ops);
    free(p->node_pos);
    free(p->node_pend);
    free(p->node_n);
    free(p->replies);
}

static bool plan_alloc(batch_plan *p, size_t nnodes, size_t nops)
{
    p->nnodes = nnodes;
    p->node_ops = calloc(nnodes, sizeof(*p->node_ops));
    p->node_pos = calloc(nnodes, sizeof(*p->node_pos));
    p->node_pend = calloc(nnodes, sizeof(*p->node_pend));
    p->node_n = calloc(nnodes, sizeof(*p->node_n));
    p->replies = calloc(nnodes, sizeof(*p->replies));
    if (!p->node_ops || !p->node_pos || !p->node_pend || !p->node_n || !p->replies)
        return false;
    for (size_t j = 0; j < nnodes; j++) {
        p->node_ops[j] = malloc(nops * sizeof(Kv__Op *));
        p->node_pos[j] = malloc(nops * sizeof(size_t));
        p->node_pend[j] = malloc(nops * sizeof(bool));
        if (!p->node_ops[j] || !p->node_pos[j] || !p->node_pend[j])
            return false;
    }
    return true;
}

static int consistency_need(Kv__Consistency c, bool write, int n)
{
    if (c == KV__CONSISTENCY__DEFAULT)
        c = write ? KV__CONSISTENCY__QUORUM : KV__CONSISTENCY__ONE;
    int need = c == KV__CONSISTENCY__ONE ? 1 : c == KV__CONSISTENCY__ALL ? n : n / 2 + 1;
    return need > n ? n : need;
}

/* Assigns op i to its nodes: a write to its current and pending replicas,
 * a read at ONE to the first replica that serves and is connected. */
static void plan_op(router *r, cmap *m, batch_plan *p, Kv__BatchRequest *req, size_t i,
                    op_merge *mg)
{
    Kv__Op *op = req->ops[i];
    uint32_t cur[ROUTER_MAX_RF], idx[2 * ROUTER_MAX_RF];
    int n = (int)cmap_replicas(m, op->key.data, op->key.len, cur);
    bool write = op->type != KV__OP_TYPE__GET;
    mg->need = consistency_need(req->consistency, write, n);
    mg->holder = -1;
    int targets = n, readable = router_read_order(m, cur, n, idx);
    if (write) {
        memcpy(idx, cur, (size_t)n * sizeof(cur[0]));
        mg->pend = (int)cmap_pending(m, op->key.data, op->key.len, idx + n);
        targets = n + mg->pend;
    } else if (mg->need == 1) {
        int pick = 0;
        for (int k = 0; k < n; k++) {
            rpc_chan *ch = router_chan(r, cmap_node_at(m, idx[k])->addr);
            if (ch && rpc_chan_connected(ch) > 0 && (k < readable || readable == 0)) {
                pick = k;
                break;
            }
        }
        idx[0] = idx[pick];
        targets = 1;
    }
    for (int k = 0; k < targets; k++) {
        size_t j = idx[k];
        p->node_ops[j][p->node_n[j]] = op;
        p->node_pend[j][p->node_n[j]] = k >= n;
        p->node_pos[j][p->node_n[j]++] = i;
    }
    mg->sent = targets;
}

static void merge_node(batch_plan *p, size_t j, const rpc_reply *rep, op_merge *mg)
{
    Kv__BatchReply *br = NULL;
    if (rep->status == KV_OK)
        br = kv__batch_reply__unpack(NULL, rep->len, rep->body);
    p->replies[j] = br;
    for (size_t k = 0; k < p->node_n[j]; k++) {
        op_merge *o = &mg[p->node_pos[j][k]];
        if (!br || k >= br->n_results || !br->results[k]->status) {
            o->err = rep->status == KV_OK ? KV_INTERNAL : rep->status;
            o->errmsg = rep->message ? rep->message : "node did not answer";
            continue;
        }
        Kv__OpResult *res = br->results[k];
        if (res->status->code != KV_OK) {
            o->err = (kv_err)res->status->code;
            o->errmsg = res->status->message;
            continue;
        }
        if (o->holder < 0)
            o->holder = (int)j;
        if (p->node_pend[j][k]) {
            o->pend_ok++;
            continue;
        }
        o->ok++;
        if (!o->best || (res->found && (!o->best->found || res->version > o->best->version)))
            o->best = res;
    }
}

static void fill_result(const op_merge *o, Kv__OpResult *out, Kv__Status *st, char **msgbuf)
{
    kv__op_result__init(out);
    kv__status__init(st);
    out->status = st;
    if (o->ok >= o->need && o->pend_ok >= o->pend && o->best) {
        out->found = o->best->found;
        out->value = o->best->value;
        out->version = o->best->version;
        return;
    }
    kv_err e = o->err == KV_OK || o->err == KV_DEADLINE_EXCEEDED ? KV_UNAVAILABLE : o->err;
    st->code = (int32_t)e;
    char buf[300];
    snprintf(buf, sizeof(buf), "%d of %d replicas acknowledged (need %d): %s", o->ok + o->pend_ok,
             o->sent, o->need + o->pend, o->errmsg ? o->errmsg : kv_strerror(e));
    *msgbuf = strdup(buf);
    st->message = *msgbuf ? *msgbuf : "";
}

static kv_err reply_merged(rpc_ctx *c, size_t nops, op_merge *mg)
{
    Kv__OpResult *res = calloc(nops, sizeof(*res));
    Kv__OpResult **ptrs = calloc(nops, sizeof(*ptrs));
    Kv__Status *sts = calloc(nops, sizeof(*sts));
    char **msgs = calloc(nops, sizeof(*msgs));
    kv_err rv = KV_RESOURCE_EXHAUSTED;
    if (res && ptrs && sts && msgs) {
        for (size_t i = 0; i < nops; i++) {
            fill_result(&mg[i], &res[i], &sts[i], &msgs[i]);
            ptrs[i] = &res[i];
        }
        Kv__BatchReply rep = KV__BATCH_REPLY__INIT;
        rep.n_results = nops;
        rep.results = ptrs;
        rv = rpc_reply_msg(c, &rep.base);
    }
    for (size_t i = 0; msgs && i < nops; i++)
        free(msgs[i]);
    free(msgs);
    free(res);
    free(ptrs);
    free(sts);
    return rv;
}

/* Hints for node j, whose sub-batch failed without a verdict: each write op
 * it missed goes to a node that acknowledged that op, grouped by holder,
 * stored synchronously; an op for which j is a pending replica counts as
 * acknowledged by j once its hint is stored (as for single writes). */
static void hint_node(router *r, cmap *m, const batch_plan *p, size_t j, op_merge *mg, uint32_t dl)
{
    size_t n = p->node_n[j];
    Kv__Record *recs = calloc(n ? n : 1, sizeof(*recs));
    Kv__Record **ptrs = calloc(n ? n : 1, sizeof(*ptrs));
    uint64_t now = kv_wall_ms();
    for (size_t h = 0; recs && ptrs && h < p->nnodes; h++) {
        size_t k = 0;
        for (size_t x = 0; x < n; x++) {
            const Kv__Op *op = p->node_ops[j][x];
            if (op->type == KV__OP_TYPE__GET || mg[p->node_pos[j][x]].holder != (int)h)
                continue;
            kv__record__init(&recs[k]);
            recs[k].key = op->key;
            recs[k].version = op->version;
            recs[k].tombstone = op->type == KV__OP_TYPE__DELETE;
            recs[k].value = recs[k].tombstone ? (ProtobufCBinaryData){0, NULL} : op->value;
            recs[k].expire_at_ms = op->ttl_ms && !recs[k].tombstone ? now + op->ttl_ms : 0;
            ptrs[k] = &recs[k];
            k++;
        }
        if (!k || router_store_hint(r, m, (uint32_t)h, (uint32_t)j, ptrs, k, dl) != KV_OK)
            continue;
        for (size_t x = 0; x < n; x++) {
            op_merge *o = &mg[p->node_pos[j][x]];
            if (p->node_pend[j][x] && o->holder == (int)h &&
                p->node_ops[j][x]->type != KV__OP_TYPE__GET)
                o->pend_ok++;
        }
    }
    free(recs);
    free(ptrs);
}

/* Plans, sends and merges one attempt; *stale when a node sent its map. */
static kv_err batch_attempt(router *r, rpc_ctx *c, Kv__BatchRequest *req, op_merge *mg, bool *stale)
{
    kv_err rv = KV_OK;
    cmap *m = cmap_slot_get(r->maps);
    if (!m)
        return rpc_fail(c, KV_UNAVAILABLE, "router has no cluster map yet");
    c->reply_epoch = cmap_epoch(m);
    size_t nn = cmap_node_count(m), nops = req->n_ops;
    batch_plan p = {0};
    fanout *f = plan_alloc(&p, nn, nops) ? fan_create((int)nn) : NULL;
    if (!f) {
        plan_free(&p);
        cmap_unref(m);
        return rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory planning the batch");
    }
    memset(mg, 0, nops * sizeof(*mg));
    for (size_t i = 0; i < nops; i++)
        plan_op(r, m, &p, req, i, &mg[i]);
    uint32_t dl = router_forward_deadline(c);
    size_t *sent_node = malloc(nn * sizeof(size_t));
    int nsent = 0;
    for (size_t j = 0; j < nn && sent_node; j++) {
        if (!p.node_n[j])
            continue;
        Kv__BatchRequest sub = KV__BATCH_REQUEST__INIT;
        sub.n_ops = p.node_n[j];
        sub.ops = p.node_ops[j];
        sent_node[nsent++] = j;
        fan_send(f, router_chan(r, cmap_node_at(m, (uint32_t)j)->addr), "kv.Batch", cmap_epoch(m),
                 &sub.base, dl);
    }
    atomic_fetch_add_explicit(&r->forwards, (uint64_t)nsent, memory_order_relaxed);
    fan_wait(f, nsent, dl);
    rpc_reply *reps = calloc((size_t)nsent + 1, sizeof(*reps));
    bool *have = calloc((size_t)nsent + 1, sizeof(*have));
    if (reps && have)
        fan_take(f, reps, have);
    fan_release(f);
    for (int s = 0; reps && have && s < nsent; s++) {
        rpc_reply none = {.status = KV_UNAVAILABLE, .message = "node did not answer in time"};
        if (have[s] && carries_map(&reps[s])) {
            router_learn_map(r, reps[s].body, reps[s].len);
            *stale = true;
        }
        merge_node(&p, sent_node[s], have[s] ? &reps[s] : &none, mg);
    }
    for (int s = 0; reps && have && !*stale && s < nsent; s++)
        if (!have[s] || router_transport_err(reps[s].status))
            hint_node(r, m, &p, sent_node[s], mg, dl);
    if (!*stale)
        rv = (reps && have) ? reply_merged(c, nops, mg)
                            : rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
    for (int s = 0; reps && have && s < nsent; s++)
        if (have[s])
            rpc_reply_free(&reps[s]);
    free(reps);
    free(have);
    free(sent_node);
    plan_free(&p);
    cmap_unref(m);
    return rv;
}

static kv_err validate_ops(router *r, rpc_ctx *c, Kv__BatchRequest *req, size_t len)
{
    kv_err rv = kv_check_batch(&r->cfg.limits, req->n_ops, len, c->message, sizeof(c->message));
    for (size_t i = 0; rv == KV_OK && i < req->n_ops; i++) {
        Kv__Op *op = req->ops[i];
        char why[200];
        rv = kv_check_key(&r->cfg.limits, op->key.len, why, sizeof(why));
        if (rv == KV_OK && op->type != KV__OP_TYPE__GET)
            rv = kv_check_value(&r->cfg.limits, op->value.len, why, sizeof(why));
        if (rv != KV_OK)
            rv = rpc_fail(c, rv, "op %zu: %s", i, why);
        if (op->type != KV__OP_TYPE__GET && !op->version)
            op->version = kv_hlc_now(&r->hlc);
        if (rv == KV_OK)
            router_hot_sample(r, c->worker, op->key.data, op->key.len);
    }
    return rv;
}

kv_err router_h_batch(rpc_ctx *c, const uint8_t *body, size_t len)
{
    router *r = c->user;
    atomic_fetch_add_explicit(&r->requests, 1, memory_order_relaxed);
    Kv__BatchRequest *req = kv__batch_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__BatchRequest body");
    kv_err rv = validate_ops(r, c, req, len);
    op_merge *mg = rv == KV_OK ? calloc(req->n_ops, sizeof(*mg)) : NULL;
    if (rv == KV_OK && !mg)
        rv = rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
    for (int attempt = 0; rv == KV_OK && attempt < 2; attempt++) {
        bool stale = false;
        rv = batch_attempt(r, c, req, mg, &stale);
        if (!stale)
            break;
        if (attempt == 1)
            rv = rpc_fail(c, KV_UNAVAILABLE, "cluster map changed twice during the batch");
    }
    for (size_t i = 0; r->mit && i < req->n_ops; i++)
        if (req->ops[i]->type != KV__OP_TYPE__GET)
            router_mit_invalidate(r->mit, req->ops[i]->key.data, req->ops[i]->key.len);
    free(mg);
    kv__batch_request__free_unpacked(req, NULL);
    return rv;
}
