/* SPDX-License-Identifier: MIT */
/*
 * Replication helpers of the router (DESIGN.md §4 "Repair and failure
 * handling"): the order in which a read asks replicas (healthy ones first,
 * per the failure detector), hinted handoff (a live replica keeps the
 * versioned record for a replica that missed it) and read repair (a read
 * that saw different versions writes the newest back to the stale replicas).
 * Both writes are versioned records applied by last-writer-wins, so they are
 * idempotent and may arrive late or twice.
 */
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "shard/router.h"

#define SIDE_DEADLINE_MS 5000u

bool router_transport_err(kv_err s)
{
    return s == KV_UNAVAILABLE || s == KV_DEADLINE_EXCEEDED || s == KV_CANCELLED;
}

int router_read_order(cmap *m, const uint32_t *idx, int n, uint32_t *order)
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

typedef struct side_call {
    router *r;
    _Atomic uint64_t *errors;
} side_call;

static void side_done(void *arg, rpc_reply *rep)
{
    side_call *sc = arg;
    if (rep->status != KV_OK) {
        atomic_fetch_add(sc->errors, 1);
        KV_DEBUG("router", "side write failed: %s", rep->message ? rep->message : "");
    }
    rpc_reply_free(rep);
    free(sc);
}

static void side_send(router *r, const char *addr, const char *method, uint64_t epoch,
                      const ProtobufCMessage *msg, _Atomic uint64_t *errors)
{
    rpc_chan *ch = atomic_load(&r->stopping) ? NULL : router_chan(r, addr);
    side_call *sc = ch ? malloc(sizeof(*sc)) : NULL;
    if (!sc) {
        atomic_fetch_add(errors, 1);
        return;
    }
    *sc = (side_call){r, errors};
    rpc_call_async(ch, method, epoch, msg, SIDE_DEADLINE_MS, side_done, sc);
}

void router_send_hint(router *r, cmap *m, uint32_t holder, uint32_t target, Kv__Record *const *recs,
                      size_t n)
{
    Kv__HintRequest req = KV__HINT_REQUEST__INIT;
    req.target = (char *)cmap_node_at(m, target)->id;
    req.n_records = n;
    req.records = (Kv__Record **)recs;
    atomic_fetch_add_explicit(&r->hints_sent, n, memory_order_relaxed);
    side_send(r, cmap_node_at(m, holder)->addr, "admin.Hint", cmap_epoch(m), &req.base,
              &r->hint_errors);
}

kv_err router_store_hint(router *r, cmap *m, uint32_t holder, uint32_t target,
                         Kv__Record *const *recs, size_t n, uint32_t deadline_ms)
{
    Kv__HintRequest req = KV__HINT_REQUEST__INIT;
    req.target = (char *)cmap_node_at(m, target)->id;
    req.n_records = n;
    req.records = (Kv__Record **)recs;
    rpc_chan *ch = atomic_load(&r->stopping) ? NULL : router_chan(r, cmap_node_at(m, holder)->addr);
    rpc_reply rep = {0};
    kv_err rv = ch ? rpc_call(ch, "admin.Hint", cmap_epoch(m), &req.base, deadline_ms, &rep)
                   : KV_UNAVAILABLE;
    rpc_reply_free(&rep);
    atomic_fetch_add_explicit(rv == KV_OK ? &r->hints_sent : &r->hint_errors, n,
                              memory_order_relaxed);
    return rv;
}

/* The reply's GetReply, NULL for a failed call. */
static Kv__GetReply *get_reply(const rpc_reply *rep)
{
    return rep->status == KV_OK ? kv__get_reply__unpack(NULL, rep->len, rep->body) : NULL;
}

void router_read_repair(router *r, cmap *m, const ProtobufCBinaryData *key, const uint32_t *idx,
                        const rpc_reply *reps, const bool *have, int n)
{
    Kv__GetReply *g[CMAP_MAX_RF * 2] = {0};
    int best = -1, answers = 0;
    for (int i = 0; i < n; i++) {
        if (!have[i] || !(g[i] = get_reply(&reps[i])))
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
            atomic_fetch_add_explicit(&r->read_repairs, 1, memory_order_relaxed);
            side_send(r, cmap_node_at(m, idx[i])->addr, "admin.Apply", cmap_epoch(m), &req.base,
                      &r->hint_errors);
        }
    }
    for (int i = 0; i < n; i++)
        if (g[i])
            kv__get_reply__free_unpacked(g[i], NULL);
}
