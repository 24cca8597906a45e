/* SPDX-License-Identifier: MIT */
/*
 * kvctl status: one row per node (id, address, state, live keys, memory,
 * durability, and the engine when it is kallax) from admin.Stats. Through a router the stats of
 * each node are fetched by the router (StatsRequest.node_id), so status works wherever the router
 * is reachable; against a node, the other nodes are asked directly at their map addresses.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/kvctl.h"
#include "client/kvctl_stream.h"
#include "common/clock.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"
#include "shard/clustermap.h"

typedef struct status_ctx {
    kvctl_env *env;
    rpc_chan *target;
    bool target_is_router;
    const char *target_id;
    int printed;
    Kv__StatsReply *router; /* the router's own stats (its view of the nodes) */
    int unreachable;        /* nodes that did not answer */
} status_ctx;

static const char *stat_of(const Kv__StatsReply *s, const char *name)
{
    for (size_t i = 0; s && i < s->n_stats; i++)
        if (strcmp(s->stats[i]->name, name) == 0)
            return s->stats[i]->value;
    return NULL;
}

static void human_bytes(const char *v, char *out, size_t len)
{
    double b = v ? atof(v) : 0;
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) {
        b /= 1024;
        u++;
    }
    snprintf(out, len, u ? "%.1f %s" : "%.0f %s", b, unit[u]);
}

static Kv__StatsReply *node_stats(status_ctx *sc, const char *id, const char *addr)
{
    Kv__StatsRequest req = KV__STATS_REQUEST__INIT;
    req.verbose = sc->env->verbose;
    req.count_keys = true; /* live_keys: exact (the node scans, reusing a count for 5 s) */
    rpc_chan *ch = sc->target, *own = NULL;
    if (sc->target_is_router) {
        req.node_id = (char *)id;
    } else if (!sc->target_id || strcmp(id, sc->target_id) != 0) {
        rpc_chan_opts o = {.auth = sc->env->auth, .tls = sc->env->tls};
        if (rpc_chan_open(&own, addr, &o) != KV_OK)
            return NULL;
        ch = own;
    }
    rpc_reply rep;
    Kv__StatsReply *s = NULL;
    kv_err rv = rpc_call(ch, "admin.Stats", 0, &req.base, (uint32_t)sc->env->timeout_ms, &rep);
    if (rv == KV_OK)
        s = kv__stats_reply__unpack(NULL, rep.len, rep.body);
    static bool told; /* credentials: say so once, not as "did not answer" per node */
    if ((rv == KV_PERMISSION_DENIED || rv == KV_UNAUTHENTICATED) && !told) {
        told = true;
        fprintf(stderr, "kvctl: %s: %s\n", kv_err_name(rv), rep.message ? rep.message : "");
    }
    rpc_reply_free(&rep);
    rpc_chan_close(own);
    return s;
}

/* The router's view of node id ("up", "down", ...), "-" against a node. */
static const char *view_of(status_ctx *sc, const char *id)
{
    char name[CMAP_MAX_ID + 8];
    snprintf(name, sizeof(name), "view.%s", id);
    const char *v = stat_of(sc->router, name);
    return v ? v : "-";
}

/* s's stats as the members of a JSON object (numbers as numbers). */
static void print_stats_json(const Kv__StatsReply *s)
{
    for (size_t i = 0; s && i < s->n_stats; i++) {
        printf("%s\"%s\":", i ? "," : "", s->stats[i]->name);
        const char *v = s->stats[i]->value;
        char *end = NULL;
        strtod(v, &end);
        if (*v && end && !*end && strspn(v, "0123456789.-e+") == strlen(v))
            fputs(v, stdout); /* numbers as numbers */
        else
            kvctl_json_str(v, strlen(v));
    }
}

static void print_row(status_ctx *sc, const char *id, const char *addr, const char *state,
                      const Kv__StatsReply *s)
{
    const kvctl_env *env = sc->env;
    const char *serving = s ? stat_of(s, "serving") : NULL;
    if (env->json) {
        printf("%s{\"id\":\"%s\",\"address\":\"%s\",\"state\":\"%s\",\"serving\":\"%s\","
               "\"view\":\"%s\",\"stats\":{",
               sc->printed++ ? "," : "", id, addr, state, serving ? serving : "-", view_of(sc, id));
        print_stats_json(s);
        printf("}}");
        return;
    }
    char mem[32] = "-", lim[32] = "-";
    if (s) {
        human_bytes(stat_of(s, "mem_bytes"), mem, sizeof(mem));
        human_bytes(stat_of(s, "mem_limit_bytes"), lim, sizeof(lim));
    }
    char memcol[80];
    snprintf(memcol, sizeof(memcol), "%s / %s", mem, lim);
    const char *keys = s ? stat_of(s, "live_keys") : NULL;
    const char *dur = s ? stat_of(s, "durability") : NULL;
    /* a node over kallax says so: its one volume has no HotRAP and no NHC */
    const char *eng = s ? stat_of(s, "engine") : NULL;
    bool kallax = eng && strcmp(eng, "kallax") == 0;
    printf("%-12s %-26s %-12s %-13s %-13s %10s  %-22s %s%s\n", id, addr, state,
           serving ? serving : "-", view_of(sc, id), keys ? keys : "-", memcol, dur ? dur : "-",
           kallax ? "  engine kallax (hotrap off, nhc off)" : "");
    for (size_t i = 0; env->verbose && s && i < s->n_stats; i++)
        printf("    %-28s %s\n", s->stats[i]->name, s->stats[i]->value);
}

static void one_node(status_ctx *sc, const char *id, const char *addr, cmap_state st)
{
    Kv__StatsReply *s = node_stats(sc, id, addr);
    sc->unreachable += s == NULL;
    const char *state = s ? (st == CMAP_UP ? "up" : cmap_state_name(st)) : "unreachable";
    print_row(sc, id, addr, state, s);
    if (s)
        kv__stats_reply__free_unpacked(s, NULL);
}

static Kv__PingReply *ping_target(status_ctx *sc)
{
    Kv__PingRequest req = KV__PING_REQUEST__INIT;
    rpc_reply rep;
    kv_err rv =
        rpc_call(sc->target, "admin.Ping", 0, &req.base, (uint32_t)sc->env->timeout_ms, &rep);
    Kv__PingReply *p = rv == KV_OK ? kv__ping_reply__unpack(NULL, rep.len, rep.body) : NULL;
    if (!p)
        kvctl_fail(rv == KV_OK ? KV_INTERNAL : rv, rep.message ? rep.message : kv_strerror(rv));
    rpc_reply_free(&rep);
    return p;
}

static cmap *target_map(status_ctx *sc, int *code)
{
    Kv__GetMapRequest req = KV__GET_MAP_REQUEST__INIT;
    rpc_reply rep;
    cmap *m = NULL;
    kv_err rv =
        rpc_call(sc->target, "admin.GetMap", 0, &req.base, (uint32_t)sc->env->timeout_ms, &rep);
    Kv__GetMapReply *g = rv == KV_OK ? kv__get_map_reply__unpack(NULL, rep.len, rep.body) : NULL;
    char err[256] = "malformed map";
    if (!g)
        *code =
            kvctl_fail(rv == KV_OK ? KV_INTERNAL : rv, rep.message ? rep.message : kv_strerror(rv));
    else if (g->has_map && cmap_from_pb(g->map, &m, err, sizeof(err)) != KV_OK)
        *code = kvctl_fail(KV_INTERNAL, err);
    if (g)
        kv__get_map_reply__free_unpacked(g, NULL);
    rpc_reply_free(&rep);
    return m;
}

/* The router's own stats (its failure detector's view). */
static Kv__StatsReply *router_stats(status_ctx *sc)
{
    Kv__StatsRequest req = KV__STATS_REQUEST__INIT;
    rpc_reply rep;
    Kv__StatsReply *s = NULL;
    if (rpc_call(sc->target, "admin.Stats", 0, &req.base, (uint32_t)sc->env->timeout_ms, &rep) ==
        KV_OK)
        s = kv__stats_reply__unpack(NULL, rep.len, rep.body);
    rpc_reply_free(&rep);
    return s;
}

/* The open transition and its streams (asked of the target nodes). */
static void print_transition(status_ctx *sc, const cmap *m)
{
    const Kv__Transition *t = cmap_transition(m);
    size_t n = 0;
    kvctl_stream *s = kvctl_transition_streams(m, &n);
    if (!s)
        return;
    kvctl_streams_poll(sc->env, s, n);
    double age = (double)(kv_wall_ms() - t->started_ms) / 1000.0;
    if (sc->env->json) {
        printf("\"transition\":{\"kind\":\"%s\",\"node\":\"%s\",\"from_epoch\":%llu,"
               "\"age_s\":%.0f,\"streams\":",
               t->kind, t->nodes[0], (unsigned long long)t->from_epoch, age);
        kvctl_streams_print_json(s, n);
        printf("},");
        free(s);
        return;
    }
    printf("transition: %s %s%s%s (since %.0f s), %zu streams\n", t->kind, t->nodes[0],
           t->n_nodes > 1 ? " for " : "", t->n_nodes > 1 ? t->nodes[1] : "", age, n);
    for (size_t i = 0; i < n; i++) {
        char b[32], r[32];
        kvctl_human((double)s[i].bytes, b, sizeof(b));
        kvctl_human(s[i].rate, r, sizeof(r));
        double eta = s[i].rate > 0 && s[i].est_bytes > s[i].bytes
                         ? (double)(s[i].est_bytes - s[i].bytes) / s[i].rate
                         : 0;
        printf("  %-24s %s -> %-10s %-9s %10llu keys %12s %12s/s  ETA %.0f s%s%s\n", s[i].job.id,
               s[i].source, s[i].target, s[i].state[0] ? s[i].state : "?",
               (unsigned long long)s[i].keys, b, r, eta, s[i].error[0] ? "  " : "", s[i].error);
    }
    free(s);
}

int kvctl_status(kvctl_env *env, int argc, char **argv)
{
    status_ctx sc = {.env = env};
    rpc_chan_opts o = {.auth = env->auth, .tls = env->tls, .connect_wait_ms = 1000};
    if (rpc_chan_open(&sc.target, env->router, &o) != KV_OK)
        return kvctl_fail(KV_INVALID_ARGUMENT, "bad --router address");
    int code = KVCTL_OK;
    Kv__PingReply *p = ping_target(&sc);
    cmap *m = p ? target_map(&sc, &code) : NULL;
    if (!p)
        code = KVCTL_SERVER;
    if (code == KVCTL_OK) {
        sc.target_is_router = strcmp(p->role, "router") == 0;
        sc.target_id = p->id;
        if (!m && sc.target_is_router)
            code = kvctl_fail(KV_FAILED_PRECONDITION, "the router has no cluster map yet");
    }
    if (code == KVCTL_OK && sc.target_is_router)
        sc.router = router_stats(&sc);
    if (code == KVCTL_OK) {
        if (env->json)
            printf("{\"map_epoch\":%llu,\"rf\":%u,", (unsigned long long)(m ? cmap_epoch(m) : 0),
                   m ? cmap_rf(m) : 1);
        else
            printf("map epoch %llu, rf %u\n", (unsigned long long)(m ? cmap_epoch(m) : 0),
                   m ? cmap_rf(m) : 1);
        if (m && cmap_transition(m))
            print_transition(&sc, m);
        if (env->json)
            printf("\"nodes\":[");
        else
            printf("%-12s %-26s %-12s %-13s %-13s %10s  %-22s %s\n", "ID", "ADDRESS", "STATE",
                   "SERVING", "ROUTER VIEW", "LIVE KEYS", "MEMORY", "DURABILITY");
        for (size_t i = 0; m && i < cmap_node_count(m); i++)
            one_node(&sc, cmap_node_at(m, i)->id, cmap_node_at(m, i)->addr,
                     cmap_node_at(m, i)->state);
        if (!m) /* a node before cluster init serves alone */
            one_node(&sc, p->id, env->router, CMAP_UP);
        if (env->json && sc.router) { /* the router's own stats too */
            printf("],\"router\":{");
            print_stats_json(sc.router);
            printf("}}\n");
        } else if (env->json) {
            printf("]}\n");
        }
        if (sc.unreachable) {
            fprintf(stderr, "kvctl: UNAVAILABLE: %d node%s did not answer\n", sc.unreachable,
                    sc.unreachable > 1 ? "s" : "");
            code = KVCTL_SERVER;
        }
    }
    if (p)
        kv__ping_reply__free_unpacked(p, NULL);
    if (sc.router)
        kv__stats_reply__free_unpacked(sc.router, NULL);
    cmap_unref(m);
    rpc_chan_close(sc.target);
    return code;
}
