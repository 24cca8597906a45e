/* SPDX-License-Identifier: MIT */
/*
 * The router's failure detector (DESIGN.md §4): every --probe-ms the router
 * pings every node of its map at once (admin.Ping, deadline twice the
 * period) and keeps a local view, never a change of the map:
 *   UP           the ping answered and the node serves;
 *   NOT_SERVING  it answered but is catching up, needs repair or has no map:
 *                it takes writes, reads go to other replicas;
 *   DOWN         --probe-fails pings in a row failed: writes skip it (and
 *                leave hints), reads skip it.
 * A node that answered again after being DOWN stays NOT_SERVING for reads
 * until no other node holds hints for it (the router asks them, and they
 * replay at once): a node cut off by a partition never restarted, so its own
 * catch-up rule (handoff.c) does not apply, but it missed the same writes.
 * Missed-probe counting rather than
 * phi-accrual: with a fixed period and a deadline of two periods, a count
 * of consecutive misses is the same test with a threshold one can read.
 * Each change is logged once. The view lives in the map's health bytes
 * (cmap_set_health), which the request path reads without locks, and in a
 * table by node id that carries it over to newer maps.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "shard/router.h"
#include "shard/fan.h"

typedef struct probe_node {
    char id[CMAP_MAX_ID + 1];
    int fails;
    cmap_health h;
    int serving;       /* Kv__Serving of the last answer */
    uint64_t since_ms; /* wall ms of the last change */
    double rtt_ms;
    bool rejoining; /* back from DOWN: reads wait until no peer holds hints for it */
} probe_node;

typedef struct router_probe {
    pthread_mutex_t mu; /* protects nodes, n */
    probe_node *nodes;
    size_t n;
} router_probe;

static const char *view_name(cmap_health h, int serving)
{
    if (h == CMAP_HEALTH_DOWN)
        return "down";
    if (h == CMAP_HEALTH_UNKNOWN)
        return "unknown";
    if (h == CMAP_HEALTH_NOT_SERVING && serving == KV__SERVING__SERVING)
        return "catching_up"; /* back from down, its hints not yet replayed */
    switch (serving) {
    case KV__SERVING__CATCHING_UP:
        return "catching_up";
    case KV__SERVING__NEEDS_REPAIR:
        return "needs_repair";
    case KV__SERVING__NO_MAP:
        return "no_map";
    case KV__SERVING__REMOVED:
        return "removed";
    default:
        return "up";
    }
}

/* The table entry of id, added when missing (p->mu held). */
static probe_node *entry(router_probe *p, const char *id)
{
    for (size_t i = 0; i < p->n; i++)
        if (strcmp(p->nodes[i].id, id) == 0)
            return &p->nodes[i];
    probe_node *nn = realloc(p->nodes, (p->n + 1) * sizeof(*nn));
    if (!nn)
        return NULL;
    p->nodes = nn;
    probe_node *e = &p->nodes[p->n++];
    memset(e, 0, sizeof(*e));
    snprintf(e->id, sizeof(e->id), "%s", id);
    return e;
}

/* Folds one ping result into the view of node i of m (p->mu held). */
static void observe(router *r, cmap *m, size_t i, const rpc_reply *rep, bool have, double rtt)
{
    router_probe *p = r->probe;
    const cmap_node *nd = cmap_node_at(m, i);
    probe_node *e = entry(p, nd->id);
    if (!e)
        return;
    Kv__PingReply *pr =
        have && rep->status == KV_OK ? kv__ping_reply__unpack(NULL, rep->len, rep->body) : NULL;
    cmap_health h = e->h;
    int serving = e->serving;
    if (pr) {
        e->fails = 0;
        serving = pr->serving;
        e->rejoining |= e->h == CMAP_HEALTH_DOWN;
        h = serving == KV__SERVING__SERVING && !e->rejoining ? CMAP_HEALTH_UP
                                                             : CMAP_HEALTH_NOT_SERVING;
        e->rtt_ms = rtt;
    } else if (have && rep->status == KV_RESOURCE_EXHAUSTED && !rep->local) {
        /* the node refused the ping under overload (rpc_server.c): it is
         * alive, only busy; holding it down would send its writes to hints
         * on the other, as busy, nodes */
        e->fails = 0;
    } else if (++e->fails >= r->cfg.probe_fails) {
        h = CMAP_HEALTH_DOWN;
    }
    if (h != e->h || serving != e->serving) {
        const char *why = pr ? (pr->detail && *pr->detail ? pr->detail : "")
                             : (have && rep->message ? rep->message : "no answer");
        KV_INFO("router", "node %s (%s) is %s: %s", nd->id, nd->addr, view_name(h, serving), why);
        e->since_ms = kv_wall_ms();
    }
    e->h = h;
    e->serving = serving;
    cmap_set_health(m, i, h);
    if (pr)
        kv__ping_reply__free_unpacked(pr, NULL);
}

/* Hints the other nodes of m hold for node i; false when one of the nodes
 * the view holds up did not answer. */
static bool hints_left(router *r, cmap *m, size_t i, uint64_t *left)
{
    Kv__HintStatusRequest req = KV__HINT_STATUS_REQUEST__INIT;
    req.target = (char *)cmap_node_at(m, i)->id;
    req.replay_now = true;
    bool all = true;
    *left = 0;
    for (size_t k = 0; k < cmap_node_count(m); k++) {
        if (k == i || cmap_get_health(m, k) == CMAP_HEALTH_DOWN)
            continue;
        rpc_chan *ch = router_chan(r, cmap_node_at(m, k)->addr);
        rpc_reply rep = {0};
        Kv__HintStatusReply *hs = NULL;
        if (ch && rpc_call(ch, "admin.HintStatus", 0, &req.base, (uint32_t)r->cfg.probe_ms * 2,
                           &rep) == KV_OK)
            hs = kv__hint_status_reply__unpack(NULL, rep.len, rep.body);
        all &= hs != NULL;
        for (size_t t = 0; hs && t < hs->n_targets; t++)
            *left += hs->targets[t]->records;
        if (hs)
            kv__hint_status_reply__free_unpacked(hs, NULL);
        rpc_reply_free(&rep);
    }
    return all;
}

/* Nodes back from DOWN serve reads again once their hints are replayed. */
static void rejoin(router *r, cmap *m)
{
    for (size_t i = 0; i < cmap_node_count(m); i++) {
        pthread_mutex_lock(&r->probe->mu);
        probe_node *e = entry(r->probe, cmap_node_at(m, i)->id);
        bool check = e && e->rejoining && e->h != CMAP_HEALTH_DOWN;
        pthread_mutex_unlock(&r->probe->mu);
        uint64_t left = 0;
        if (!check || !hints_left(r, m, i, &left) || left)
            continue;
        pthread_mutex_lock(&r->probe->mu);
        e = entry(r->probe, cmap_node_at(m, i)->id);
        if (e && e->rejoining && e->h != CMAP_HEALTH_DOWN) {
            e->rejoining = false;
            e->h = e->serving == KV__SERVING__SERVING ? CMAP_HEALTH_UP : CMAP_HEALTH_NOT_SERVING;
            e->since_ms = kv_wall_ms();
            cmap_set_health(m, i, e->h);
            KV_INFO("router", "node %s is %s: no other node holds hints for it",
                    cmap_node_at(m, i)->id, view_name(e->h, e->serving));
        }
        pthread_mutex_unlock(&r->probe->mu);
    }
}

static void probe_round(router *r)
{
    cmap *m = cmap_slot_get(r->maps);
    if (!m)
        return;
    size_t n = cmap_node_count(m);
    fanout *f = fan_create((int)n);
    uint32_t dl = (uint32_t)(2 * r->cfg.probe_ms);
    Kv__PingRequest req = KV__PING_REQUEST__INIT;
    uint64_t t0 = kv_now_ns();
    for (size_t i = 0; f && i < n; i++)
        fan_send(f, router_chan(r, cmap_node_at(m, i)->addr), "admin.Ping", 0, &req.base, dl);
    if (f)
        fan_wait(f, (int)n, dl);
    double rtt = (double)(kv_now_ns() - t0) / 1e6;
    rpc_reply *reps = calloc(n ? n : 1, sizeof(*reps));
    bool *have = calloc(n ? n : 1, sizeof(*have));
    if (f && reps && have)
        fan_take(f, reps, have);
    if (f)
        fan_release(f);
    pthread_mutex_lock(&r->probe->mu);
    for (size_t i = 0; reps && have && i < n; i++)
        observe(r, m, i, &reps[i], have[i], rtt);
    pthread_mutex_unlock(&r->probe->mu);
    for (size_t i = 0; reps && have && i < n; i++)
        if (have[i])
            rpc_reply_free(&reps[i]);
    free(reps);
    free(have);
    rejoin(r, m);
    cmap_unref(m);
}

static void *probe_main(void *arg)
{
    router *r = arg;
    while (!atomic_load(&r->stopping)) {
        uint64_t t0 = kv_now_ns();
        probe_round(r);
        uint64_t period = (uint64_t)r->cfg.probe_ms * 1000000ull;
        while (!atomic_load(&r->stopping) && kv_now_ns() - t0 < period) {
            struct timespec ts = {0, 20 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

kv_err router_probe_start(router *r)
{
    r->probe = calloc(1, sizeof(*r->probe));
    if (!r->probe)
        return KV_RESOURCE_EXHAUSTED;
    pthread_mutex_init(&r->probe->mu, NULL);
    if (r->cfg.probe_ms <= 0)
        return KV_OK; /* detection off */
    if (pthread_create(&r->probe_thread, NULL, probe_main, r) != 0)
        return KV_RESOURCE_EXHAUSTED;
    r->probe_started = true;
    return KV_OK;
}

void router_probe_stop(router *r)
{
    if (!r->probe)
        return;
    if (r->probe_started)
        pthread_join(r->probe_thread, NULL);
    pthread_mutex_destroy(&r->probe->mu);
    free(r->probe->nodes);
    free(r->probe);
    r->probe = NULL;
}

void router_probe_map_changed(router *r, cmap *old, cmap *m)
{
    (void)old;
    if (!r->probe)
        return;
    pthread_mutex_lock(&r->probe->mu);
    for (size_t i = 0; i < cmap_node_count(m); i++)
        for (size_t k = 0; k < r->probe->n; k++)
            if (strcmp(r->probe->nodes[k].id, cmap_node_at(m, i)->id) == 0)
                cmap_set_health(m, i, r->probe->nodes[k].h);
    pthread_mutex_unlock(&r->probe->mu);
}

void router_probe_stats(router *r, kv_stats *l)
{
    static const char *const views[] = {"up",     "down",    "catching_up", "needs_repair",
                                        "no_map", "removed", "unknown",     NULL};
    cmap *m = cmap_slot_get(r->maps);
    if (!m || !r->probe) {
        cmap_unref(m);
        return;
    }
    pthread_mutex_lock(&r->probe->mu);
    for (size_t i = 0; i < cmap_node_count(m); i++) {
        const char *id = cmap_node_at(m, i)->id;
        probe_node *e = NULL;
        for (size_t k = 0; k < r->probe->n && !e; k++)
            if (strcmp(r->probe->nodes[k].id, id) == 0)
                e = &r->probe->nodes[k];
        char name[CMAP_MAX_ID + 16], lab[CMAP_MAX_ID + 32];
        kv_stat_label(lab, sizeof(lab), "node", id);
        snprintf(name, sizeof(name), "view.%s", id);
        kv_stat_enum(l, name, "hotkv_router_node_state", lab,
                     "The router's view of a node (failure detector and serving state).",
                     e ? view_name(e->h, e->serving) : "unknown", views);
        snprintf(name, sizeof(name), "view.%s.since_ms", id);
        kv_stat_gauge(l, name, NULL, NULL, NULL, e ? e->since_ms : 0);
        if (e)
            kv_stat_gaugef(l, NULL, 0, "hotkv_router_node_ping_seconds", lab,
                           "Round trip of the last failure-detector ping.", e->rtt_ms, 1e-3);
    }
    pthread_mutex_unlock(&r->probe->mu);
    cmap_unref(m);
}

const char *router_probe_view(router *r, const char *id, uint64_t *since_ms, double *rtt_ms)
{
    const char *v = "unknown";
    *since_ms = 0;
    *rtt_ms = 0;
    if (!r->probe)
        return v;
    pthread_mutex_lock(&r->probe->mu);
    for (size_t k = 0; k < r->probe->n; k++)
        if (strcmp(r->probe->nodes[k].id, id) == 0) {
            v = view_name(r->probe->nodes[k].h, r->probe->nodes[k].serving);
            *since_ms = r->probe->nodes[k].since_ms;
            *rtt_ms = r->probe->nodes[k].rtt_ms;
        }
    pthread_mutex_unlock(&r->probe->mu);
    return v;
}
