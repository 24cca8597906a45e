/* SPDX-License-Identifier: MIT */
/*
 * Hinted handoff and catching up (DESIGN.md §4 "Repair and failure
 * handling").
 *
 * Hints: a router that could not reach a replica asks a live one to keep
 * the versioned records (admin.Hint); they go to the durable hint store
 * (hints.c) before the reply. A replay thread delivers each target's hints
 * with admin.Apply (last-writer-wins, so a hint replayed twice is harmless),
 * paced to --stream-mbps, backing off from a target that does not answer;
 * a target that asks (HintStatus with replay_now) is retried at once. Hints
 * past --hint-window or over --hints-max-mb are dropped and their target is
 * marked lost: it needs kvctl repair.
 *
 * Catching up (the rule): a node that starts with a cluster map of more
 * than one node reports CATCHING_UP (it takes writes, routers do not read
 * from it) until every peer has answered that it holds no hint for it (each
 * asked peer replays at once). A peer that does not answer for
 * --catchup-timeout-ms is skipped (logged): its hints arrive when it is back,
 * and meanwhile the node serves. A peer that reports lost hints for it puts
 * the node in NEEDS_REPAIR, which only kvctl repair clears.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "node/hints.h"
#include "node/node.h"

#define REPLAY_TICK_NS (200ull * 1000000ull)
#define CATCHUP_TICK_NS (200ull * 1000000ull)
#define REPLAY_BATCH (1u << 20)
#define APPLY_DEADLINE_MS 10000u
#define BACKOFF_MAX_NS (5ull * 1000000000ull)

typedef struct retry {
    char id[HINT_TARGET_MAX + 1];
    uint64_t at_ns, backoff_ns;
} retry;

typedef struct peer_wait {
    char id[HINT_TARGET_MAX + 1];
    bool done;
    uint64_t silent_since_ns; /* 0 = answered last time */
} peer_wait;

struct node_handoff {
    node *n;
    hint_store *hs;
    kv_ticker *replayer, *catcher;
    pthread_mutex_t mu; /* protects retries, peers */
    retry *retries;
    size_t nretries;
    peer_wait *peers;
    size_t npeers;
    uint64_t next_expire_ns;
    _Atomic uint64_t replayed_batches;
};

/* ---- retry state ------------------------------------------------------- */

static retry *retry_of(node_handoff *h, const char *id)
{
    for (size_t i = 0; i < h->nretries; i++)
        if (strcmp(h->retries[i].id, id) == 0)
            return &h->retries[i];
    retry *nr = realloc(h->retries, (h->nretries + 1) * sizeof(*nr));
    if (!nr)
        return NULL;
    h->retries = nr;
    retry *r = &h->retries[h->nretries++];
    memset(r, 0, sizeof(*r));
    snprintf(r->id, sizeof(r->id), "%s", id);
    return r;
}

static void kick(node_handoff *h, const char *id)
{
    pthread_mutex_lock(&h->mu);
    retry *r = retry_of(h, id);
    if (r) {
        r->at_ns = 0;
        r->backoff_ns = 0;
    }
    pthread_mutex_unlock(&h->mu);
}

/* ---- replay ------------------------------------------------------------ */

typedef struct replay_ctx {
    node *n;
    const char *addr;
    uint64_t t0, bytes;
} replay_ctx;

/* hint_send_fn: one admin.Apply of the batch to the target, paced. A hint
 * that does not decode (it passed its frame's CRC, so only a bug writes
 * one) is logged and skipped rather than blocking the target forever. */
static kv_err send_batch(void *arg, const uint8_t *const *hints, const size_t *lens, size_t n)
{
    replay_ctx *rc = arg;
    Kv__Record **recs = calloc(n, sizeof(*recs));
    kv_err rv = recs ? KV_OK : KV_RESOURCE_EXHAUSTED;
    size_t k = 0;
    for (size_t i = 0; rv == KV_OK && i < n; i++)
        if ((recs[k] = kv__record__unpack(NULL, lens[i], hints[i])) != NULL)
            k++;
        else
            KV_ERROR("handoff", "a hint of %zu bytes does not decode as a record: skipped",
                     lens[i]);
    rpc_chan *ch = rv == KV_OK && k ? node_chan(rc->n, rc->addr) : NULL;
    if (rv == KV_OK && k && !ch)
        rv = KV_INVALID_ARGUMENT;
    if (rv == KV_OK && k) {
        Kv__ApplyRequest req = KV__APPLY_REQUEST__INIT;
        req.n_records = k;
        req.records = recs;
        rpc_reply rep = {0};
        rv = rpc_call(ch, "admin.Apply", 0, &req.base, APPLY_DEADLINE_MS, &rep);
        rpc_reply_free(&rep);
    }
    for (size_t i = 0; recs && i < k; i++)
        kv__record__free_unpacked(recs[i], NULL);
    for (size_t i = 0; rv == KV_OK && i < n; i++)
        rc->bytes += lens[i];
    free(recs);
    uint64_t want = rc->bytes * 1000000000ull / ((uint64_t)rc->n->cfg.stream_mbps << 20);
    uint64_t spent = kv_now_ns() - rc->t0;
    if (rv == KV_OK && want > spent)
        kv_sleep_ns(want - spent);
    return rv;
}

/* The address of node id in the current map; false when it is not there. */
static bool addr_of(node *n, const char *id, char *addr, size_t len)
{
    cmap *m = cmap_slot_get(n->maps);
    int i = m ? cmap_find(m, id) : -1;
    if (i >= 0)
        snprintf(addr, len, "%s", cmap_node_at(m, (size_t)i)->addr);
    cmap_unref(m);
    return i >= 0;
}

static void replay_target(node_handoff *h, const hint_target_info *t, uint64_t now)
{
    char addr[CMAP_MAX_ADDR + 1];
    if (!addr_of(h->n, t->target, addr, sizeof(addr))) {
        if (cmap_slot_epoch(h->n->maps)) {
            KV_INFO("handoff", "forgetting %llu hints for %s: no longer in the cluster map",
                    (unsigned long long)t->records, t->target);
            hint_store_forget(h->hs, t->target);
        }
        return;
    }
    pthread_mutex_lock(&h->mu);
    retry *r = retry_of(h, t->target);
    bool due = r && r->at_ns <= now;
    pthread_mutex_unlock(&h->mu);
    if (!due)
        return;
    replay_ctx rc = {h->n, addr, kv_now_ns(), 0};
    uint64_t sent = 0;
    kv_err rv = hint_store_replay(h->hs, t->target, send_batch, &rc, REPLAY_BATCH, &sent);
    pthread_mutex_lock(&h->mu);
    if ((r = retry_of(h, t->target)) != NULL && rv != KV_OK && rv != KV_FAILED_PRECONDITION) {
        r->backoff_ns = r->backoff_ns ? r->backoff_ns * 2 : REPLAY_TICK_NS;
        r->backoff_ns = r->backoff_ns > BACKOFF_MAX_NS ? BACKOFF_MAX_NS : r->backoff_ns;
        r->at_ns = kv_now_ns() + r->backoff_ns;
    } else if (r) {
        r->backoff_ns = 0;
    }
    pthread_mutex_unlock(&h->mu);
    if (rv == KV_OK && sent)
        KV_INFO("handoff", "replayed %llu hints to %s", (unsigned long long)sent, t->target);
}

static void replay_tick(void *arg)
{
    node_handoff *h = arg;
    uint64_t now = kv_now_ns();
    if (now >= h->next_expire_ns) {
        uint64_t dropped = 0;
        hint_store_expire(h->hs, &dropped);
        if (dropped)
            KV_WARN("handoff", "dropped %llu hints older than --hint-window",
                    (unsigned long long)dropped);
        h->next_expire_ns = now + 10ull * 1000000000ull;
    }
    hint_target_info *ts = NULL;
    size_t nt = 0;
    if (hint_store_list(h->hs, &ts, &nt) != KV_OK)
        return;
    for (size_t i = 0; i < nt; i++)
        if (ts[i].records)
            replay_target(h, &ts[i], now);
    free(ts);
}

/* ---- catching up ------------------------------------------------------- */

/* Asks peer i whether it holds hints for this node (and to replay them at
 * once). Returns true when it answered, with *pending and *lost set. */
static bool ask_peer(node *n, const char *addr, bool *pending, bool *lost)
{
    rpc_chan *ch = node_chan(n, addr);
    Kv__HintStatusRequest req = KV__HINT_STATUS_REQUEST__INIT;
    req.target = n->cfg.id;
    req.replay_now = true;
    rpc_reply rep = {0};
    bool answered = false;
    if (ch && rpc_call(ch, "admin.HintStatus", 0, &req.base, 1000, &rep) == KV_OK) {
        Kv__HintStatusReply *hs = kv__hint_status_reply__unpack(NULL, rep.len, rep.body);
        answered = hs != NULL;
        *pending = *lost = false;
        for (size_t i = 0; hs && i < hs->n_targets; i++) {
            if (strcmp(hs->targets[i]->target, n->cfg.id) != 0)
                continue;
            *pending |= hs->targets[i]->records > 0;
            *lost |= hs->targets[i]->lost;
        }
        if (hs)
            kv__hint_status_reply__free_unpacked(hs, NULL);
    }
    rpc_reply_free(&rep);
    return answered;
}

/* One round over the peers not yet done; true when all are. */
static bool catchup_round(node_handoff *h, cmap *m, uint64_t now)
{
    node *n = h->n;
    bool all = true;
    for (size_t i = 0; i < cmap_node_count(m); i++) {
        const cmap_node *p = cmap_node_at(m, i);
        if (strcmp(p->id, n->cfg.id) == 0)
            continue;
        peer_wait *w = NULL;
        for (size_t k = 0; k < h->npeers && !w; k++)
            if (strcmp(h->peers[k].id, p->id) == 0)
                w = &h->peers[k];
        if (!w) {
            peer_wait *np = realloc(h->peers, (h->npeers + 1) * sizeof(*np));
            if (!np)
                return false;
            h->peers = np;
            w = &h->peers[h->npeers++];
            memset(w, 0, sizeof(*w));
            snprintf(w->id, sizeof(w->id), "%s", p->id);
        }
        if (w->done)
            continue;
        bool pending = false, lost = false;
        if (ask_peer(n, p->addr, &pending, &lost)) {
            w->silent_since_ns = 0;
            if (lost)
                node_set_needs_repair(n, true, "a peer dropped hints for it (full or too old)");
            w->done = !pending;
        } else if (!w->silent_since_ns) {
            w->silent_since_ns = now;
        } else if (now - w->silent_since_ns > (uint64_t)n->cfg.catchup_timeout_ms * 1000000ull) {
            KV_WARN("handoff", "peer %s does not answer: not waiting for its hints", p->id);
            w->done = true;
        }
        all &= w->done;
    }
    return all;
}

static void catchup_tick(void *arg)
{
    node_handoff *h = arg;
    if (!atomic_load(&h->n->catching_up))
        return;
    cmap *m = cmap_slot_get(h->n->maps);
    if (!m || cmap_find(m, h->n->cfg.id) < 0 || catchup_round(h, m, kv_now_ns())) {
        atomic_store(&h->n->catching_up, false);
        KV_INFO("handoff", "caught up: no peer holds hints for %s", h->n->cfg.id);
    }
    cmap_unref(m);
}

/* ---- handlers ---------------------------------------------------------- */

kv_err node_h_hint(rpc_ctx *c, const uint8_t *body, size_t len)
{
    node *n = c->user;
    Kv__HintRequest *req = kv__hint_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__HintRequest body");
    kv_err rv = kv_check_batch(&n->cfg.limits, req->n_records, len, c->message, sizeof(c->message));
    if (rv == KV_OK && (!req->target || strcmp(req->target, n->cfg.id) == 0 || !req->n_records))
        rv = rpc_fail(c, KV_INVALID_ARGUMENT, "a hint needs records and another node as target");
    uint8_t **bufs = rv == KV_OK ? calloc(req->n_records, sizeof(*bufs)) : NULL;
    size_t *lens = rv == KV_OK ? calloc(req->n_records, sizeof(*lens)) : NULL;
    if (rv == KV_OK && (!bufs || !lens))
        rv = rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t i = 0; rv == KV_OK && i < req->n_records; i++) {
        const Kv__Record *r = req->records[i];
        if (!r->key.len || !r->version)
            rv = rpc_fail(c, KV_INVALID_ARGUMENT, "hint %zu has no key or no version", i);
        lens[i] = kv__record__get_packed_size(r);
        if (rv == KV_OK && !(bufs[i] = malloc(lens[i])))
            rv = rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
        if (rv == KV_OK)
            kv__record__pack(r, bufs[i]);
    }
    if (rv == KV_OK) {
        rv = hint_store_add(n->handoff->hs, req->target, (const uint8_t *const *)bufs, lens,
                            req->n_records);
        if (rv != KV_OK)
            rpc_fail(c, rv, "cannot store hints for %s: %s", req->target,
                     rv == KV_RESOURCE_EXHAUSTED ? "hint storage full (--hints-max-mb)"
                                                 : kv_strerror(rv));
    }
    Kv__HintReply rep = KV__HINT_REPLY__INIT;
    rep.stored = rv == KV_OK ? (uint32_t)req->n_records : 0;
    for (size_t i = 0; bufs && i < req->n_records; i++)
        free(bufs[i]);
    free(bufs);
    free(lens);
    kv__hint_request__free_unpacked(req, NULL);
    return rv == KV_OK ? rpc_reply_msg(c, &rep.base) : rv;
}

kv_err node_h_hint_status(rpc_ctx *c, const uint8_t *body, size_t len)
{
    node *n = c->user;
    Kv__HintStatusRequest *req = kv__hint_status_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__HintStatusRequest body");
    bool one = req->target && *req->target;
    if (one && req->replay_now)
        kick(n->handoff, req->target);
    hint_target_info *ts = NULL;
    size_t nt = 0;
    kv_err rv = hint_store_list(n->handoff->hs, &ts, &nt);
    Kv__HintTarget *tg = rv == KV_OK ? calloc(nt ? nt : 1, sizeof(*tg)) : NULL;
    Kv__HintTarget **ptrs = rv == KV_OK ? calloc(nt ? nt : 1, sizeof(*ptrs)) : NULL;
    Kv__HintStatusReply rep = KV__HINT_STATUS_REPLY__INIT;
    for (size_t i = 0; tg && ptrs && i < nt; i++) {
        if (one && strcmp(ts[i].target, req->target) != 0)
            continue;
        Kv__HintTarget *t = &tg[rep.n_targets];
        kv__hint_target__init(t);
        t->target = ts[i].target;
        t->records = ts[i].records;
        t->bytes = ts[i].bytes;
        t->lost = ts[i].lost;
        t->dropped = ts[i].dropped;
        t->oldest_ms = ts[i].oldest_ms;
        t->replayed = ts[i].replayed;
        ptrs[rep.n_targets++] = t;
    }
    rep.targets = ptrs;
    if (rv == KV_OK)
        rv = tg && ptrs ? rpc_reply_msg(c, &rep.base)
                        : rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
    else
        rpc_fail(c, rv, "cannot list hints: %s", kv_strerror(rv));
    free(tg);
    free(ptrs);
    free(ts);
    kv__hint_status_request__free_unpacked(req, NULL);
    return rv;
}

kv_err node_handoff_repaired(node *n, const char *target)
{
    kv_err rv = hint_store_clear_lost(n->handoff->hs, target);
    return rv == KV_NOT_FOUND ? KV_OK : rv;
}

void node_handoff_stats(node *n, kv_stats *l)
{
    hint_target_info *ts = NULL;
    size_t nt = 0;
    if (!n->handoff || hint_store_list(n->handoff->hs, &ts, &nt) != KV_OK)
        return;
    uint64_t records = 0;
    for (size_t i = 0; i < nt; i++) {
        char name[HINT_TARGET_MAX + 32], lab[HINT_TARGET_MAX + 64];
        records += ts[i].records;
        kv_stat_label(lab, sizeof(lab), "target", ts[i].target);
        snprintf(name, sizeof(name), "hints.%s.records", ts[i].target);
        kv_stat_gauge(l, name, "hotkv_node_hints_records", lab,
                      "Hinted records held for an unreachable replica.", ts[i].records);
        snprintf(name, sizeof(name), "hints.%s.bytes", ts[i].target);
        kv_stat_gauge(l, name, "hotkv_node_hints_bytes", lab, "Bytes of hints held for a replica.",
                      ts[i].bytes);
        snprintf(name, sizeof(name), "hints.%s.dropped", ts[i].target);
        kv_stat_counter(l, name, "hotkv_node_hints_dropped_total", lab,
                        "Hints dropped (window or bound passed): the replica needs repair.",
                        ts[i].dropped);
        snprintf(name, sizeof(name), "hints.%s.replayed", ts[i].target);
        kv_stat_counter(l, name, "hotkv_node_hints_replayed_total", lab,
                        "Hinted records delivered to their replica.", ts[i].replayed);
        snprintf(name, sizeof(name), "hints.%s.needs_repair", ts[i].target);
        kv_stat_gauge(l, name, "hotkv_node_hints_target_needs_repair", lab,
                      "1 when hints for the replica were lost (kvctl repair needed).",
                      ts[i].lost ? 1 : 0);
    }
    kv_stat_gauge(l, "hints.records", NULL, NULL, NULL, records);
    kv_stat_gauge(l, "hints.bytes", "hotkv_node_hints_total_bytes", NULL,
                  "Bytes of all hints held.", hint_store_total_bytes(n->handoff->hs));
    free(ts);
}

/* ---- lifecycle --------------------------------------------------------- */

kv_err node_handoff_open(node *n, node_handoff **out, char *err, size_t errlen)
{
    node_handoff *h = calloc(1, sizeof(*h));
    if (!h)
        return KV_RESOURCE_EXHAUSTED;
    h->n = n;
    pthread_mutex_init(&h->mu, NULL);
    char dir[4200];
    snprintf(dir, sizeof(dir), "%s/hints", n->cfg.data_dir);
    hint_opts ho = {.dir = dir,
                    .max_bytes = (uint64_t)n->cfg.hints_max_mb << 20,
                    .window_ms = (uint64_t)n->cfg.hint_window_s * 1000u};
    kv_err rv = hint_store_open(&h->hs, &ho, err, errlen);
    cmap *m = cmap_slot_get(n->maps);
    atomic_store(&n->catching_up, m && cmap_node_count(m) > 1 && cmap_find(m, n->cfg.id) >= 0);
    cmap_unref(m);
    kv_ticker_opts ro = {.period_ns = REPLAY_TICK_NS, .fn = replay_tick, .arg = h};
    kv_ticker_opts co = {.period_ns = CATCHUP_TICK_NS, .fn = catchup_tick, .arg = h};
    if (rv == KV_OK && (kv_ticker_start(&h->replayer, &ro) != KV_OK ||
                        kv_ticker_start(&h->catcher, &co) != KV_OK)) {
        snprintf(err, errlen, "cannot start the hint threads");
        rv = KV_RESOURCE_EXHAUSTED;
    }
    if (rv != KV_OK) {
        node_handoff_close(h);
        return rv;
    }
    *out = h;
    return KV_OK;
}

void node_handoff_close(node_handoff *h)
{
    if (!h)
        return;
    kv_ticker_stop(h->catcher);
    kv_ticker_stop(h->replayer);
    hint_store_close(h->hs);
    pthread_mutex_destroy(&h->mu);
    free(h->retries);
    free(h->peers);
    free(h);
}
