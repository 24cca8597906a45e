/* SPDX-License-Identifier: MIT */
/*
 * kv.Batch at its coordinator (kvrouter, or a node for a smart client):
 * give each write a version, split the ops by node (writes to every current
 * and pending replica, reads to every replica at QUORUM/ALL or to the first
 * reachable one at ONE), send the sub-batches at once (the coordinating
 * node's own in-process), and merge the per-op results back in the
 * request's order.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "shard/repl_int.h"

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

/* Assigns op i to its nodes: a write to its current and pending replicas,
 * a read at ONE to the first replica that serves and is connected. */
static void plan_op(const repl_env *env, cmap *m, batch_plan *p, Kv__BatchRequest *req, size_t i,
                    op_merge *mg)
{
    Kv__Op *op = req->ops[i];
    uint32_t cur[REPL_MAX_RF], idx[2 * REPL_MAX_RF];
    int n = (int)cmap_replicas(m, op->key.data, op->key.len, cur);
    bool write = op->type != KV__OP_TYPE__GET;
    mg->need = repl_acks_needed(req->consistency,
                                write ? KV__CONSISTENCY__QUORUM : KV__CONSISTENCY__ONE, n);
    mg->holder = -1;
    int targets = n, readable = repl_read_order(m, cur, n, idx);
    if (write) {
        memcpy(idx, cur, (size_t)n * sizeof(cur[0]));
        mg->pend = (int)cmap_pending(m, op->key.data, op->key.len, idx + n);
        targets = n + mg->pend;
    } else if (mg->need == 1) {
        int pick = 0;
        for (int k = 0; k < n; k++) {
            rpc_chan *ch = repl_is_self(env, m, idx[k])
                               ? NULL
                               : env->chan(env->user, cmap_node_at(m, idx[k])->addr);
            bool up = repl_is_self(env, m, idx[k]) || (ch && rpc_chan_connected(ch) > 0);
            if (up && (k < readable || readable == 0)) {
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
    *msgbuf = rpc_utf8_dup(buf); /* a node's message, cut: valid UTF-8 on the wire */
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
static void hint_node(const repl_env *env, cmap *m, const batch_plan *p, size_t j, op_merge *mg,
                      uint32_t dl)
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
        if (!k || repl_store_hint(env, m, (uint32_t)h, (uint32_t)j, ptrs, k, dl) != KV_OK)
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

/* Sends every node's sub-batch (the coordinator's own last, in-process);
 * sent_node[s] = the node of send s. Returns the number of sends. */
static int batch_send(const repl_env *env, cmap *m, fanout *f, const batch_plan *p,
                      size_t *sent_node, uint32_t dl)
{
    Kv__BatchRequest sub[2] = {KV__BATCH_REQUEST__INIT, KV__BATCH_REQUEST__INIT};
    repl_local_call lc = {.slot = -1};
    int nsent = 0;
    for (size_t j = 0; j < p->nnodes; j++) {
        if (!p->node_n[j])
            continue;
        Kv__BatchRequest *b = &sub[repl_is_self(env, m, (uint32_t)j)]; /* [1] outlives the loop */
        b->n_ops = p->node_n[j];
        b->ops = p->node_ops[j];
        sent_node[nsent++] = j;
        if (cmap_get_health(m, j) == CMAP_HEALTH_DOWN) { /* failure detector: fail fast, hint */
            char why[CMAP_MAX_ID + 64];
            snprintf(why, sizeof(why), "node %s is down (failure detector)",
                     cmap_node_at(m, j)->id);
            atomic_fetch_add_explicit(&env->stats->skipped_down, 1, memory_order_relaxed);
            fan_skip(f, KV_UNAVAILABLE, why);
            continue;
        }
        repl_send(env, f, m, (uint32_t)j, "kv.Batch", &b->base, dl, &lc);
    }
    repl_run_local(env, f, &lc);
    atomic_fetch_add_explicit(&env->stats->forwards, (uint64_t)nsent, memory_order_relaxed);
    return nsent;
}

/* Merges the replies of the sends into mg, hints the writes of nodes that
 * gave no verdict and builds the reply (unless a node sent a newer map). */
static kv_err batch_collect(const repl_env *env, rpc_ctx *c, cmap *m, batch_plan *p,
                            const size_t *sent_node, int nsent, rpc_reply *reps, bool *have,
                            size_t nops, op_merge *mg, uint32_t dl, bool *stale)
{
    for (int s = 0; s < nsent; s++) {
        rpc_reply none = {.status = KV_UNAVAILABLE, .message = "node did not answer in time"};
        if (have[s] && repl_carries_map(&reps[s])) {
            env->learn_map(env->user, &reps[s], cmap_node_at(m, sent_node[s])->addr);
            *stale = true;
        }
        merge_node(p, sent_node[s], have[s] ? &reps[s] : &none, mg);
    }
    for (int s = 0; !*stale && s < nsent; s++)
        if (!have[s] || repl_transport_err(reps[s].status))
            hint_node(env, m, p, sent_node[s], mg, dl);
    return *stale ? KV_OK : reply_merged(c, nops, mg);
}

/* Plans, sends and merges one attempt; *stale when a node sent its map. */
static kv_err batch_attempt(const repl_env *env, rpc_ctx *c, Kv__BatchRequest *req, op_merge *mg,
                            bool *stale)
{
    kv_err rv = KV_OK;
    cmap *m = repl_map(env, c, &rv);
    if (!m)
        return rv;
    size_t nn = cmap_node_count(m), nops = req->n_ops;
    batch_plan p = {0};
    fanout *f = plan_alloc(&p, nn, nops) ? fan_create((int)nn) : NULL;
    size_t *sent_node = malloc(nn * sizeof(size_t));
    rpc_reply *reps = calloc(nn + 1, sizeof(*reps));
    bool *have = calloc(nn + 1, sizeof(*have));
    if (!f || !sent_node || !reps || !have) {
        rv = rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory planning the batch");
    } else {
        memset(mg, 0, nops * sizeof(*mg));
        for (size_t i = 0; i < nops; i++)
            plan_op(env, m, &p, req, i, &mg[i]);
        uint32_t dl = repl_forward_deadline(c);
        int nsent = batch_send(env, m, f, &p, sent_node, dl);
        fan_wait(f, nsent, dl);
        fan_take(f, reps, have);
        rv = batch_collect(env, c, m, &p, sent_node, nsent, reps, have, nops, mg, dl, stale);
        for (int s = 0; s < nsent; s++)
            if (have[s])
                rpc_reply_free(&reps[s]);
    }
    if (f)
        fan_release(f);
    free(reps);
    free(have);
    free(sent_node);
    plan_free(&p);
    cmap_unref(m);
    return rv;
}

kv_err repl_batch(const repl_env *env, rpc_ctx *c, Kv__BatchRequest *req)
{
    for (size_t i = 0; i < req->n_ops; i++)
        if (req->ops[i]->type != KV__OP_TYPE__GET && !req->ops[i]->version)
            req->ops[i]->version = kv_hlc_now(env->hlc);
    op_merge *mg = calloc(req->n_ops ? req->n_ops : 1, sizeof(*mg));
    if (!mg)
        return rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
    kv_err rv = KV_OK;
    for (int attempt = 0; rv == KV_OK && attempt < 2; attempt++) {
        bool stale = false;
        rv = batch_attempt(env, c, req, mg, &stale);
        if (!stale)
            break;
        if (attempt == 1)
            rv = rpc_fail(c, KV_UNAVAILABLE, "cluster map changed twice during the batch");
    }
    free(mg);
    return rv;
}
