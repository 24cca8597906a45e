/* SPDX-License-Identifier: MIT */
/*
 * kvctl nhc [NODE_ID] [--watch] [--json]: each node's NHC scheduler
 * (Orthus non-hierarchical caching, DESIGN.md §5) from the nhc.* names of
 * admin.Stats: state, data_admit, load_admit, miss ratio, per-volume
 * reads/s and latency, the twin map, and the last minute (nhc.series.N).
 * Like kvctl status: through a router every node of the map is asked via
 * the router (StatsRequest.node_id); against a node, that node is asked
 * directly and the others at their map addresses. NODE_ID limits the output
 * to one node. --watch refreshes every second (one JSON object a line with
 * --json) until interrupted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/kvctl.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"
#include "shard/clustermap.h"

typedef struct nhc_ctx {
    kvctl_env *env;
    rpc_chan *target;
    bool target_is_router;
    const char *target_id;
    int printed;
} nhc_ctx;

static const char *stat_of(const Kv__StatsReply *s, const char *name)
{
    for (size_t i = 0; s && i < s->n_stats; i++)
        if (strcmp(s->stats[i]->name, name) == 0)
            return s->stats[i]->value;
    return NULL;
}

static const char *sv(const Kv__StatsReply *s, const char *name)
{
    const char *v = stat_of(s, name);
    return v ? v : "-";
}

/* A numeric stat as a JSON number (null when missing or not a number). */
static void json_num(const Kv__StatsReply *s, const char *name)
{
    const char *v = stat_of(s, name);
    char *end = NULL;
    if (v && *v)
        strtod(v, &end);
    printf("%s", v && *v && end && !*end ? v : "null");
}

static Kv__StatsReply *fetch(nhc_ctx *c, const char *id, const char *addr)
{
    Kv__StatsRequest req = KV__STATS_REQUEST__INIT;
    rpc_chan *ch = c->target, *own = NULL;
    if (c->target_is_router) {
        req.node_id = (char *)id;
    } else if (!c->target_id || strcmp(id, c->target_id) != 0) {
        rpc_chan_opts o = {.auth = c->env->auth, .tls = c->env->tls};
        if (rpc_chan_open(&own, addr, &o) != KV_OK)
            return NULL;
        ch = own;
    }
    rpc_reply rep;
    Kv__StatsReply *s = NULL;
    if (rpc_call(ch, "admin.Stats", 0, &req.base, (uint32_t)c->env->timeout_ms, &rep) == KV_OK)
        s = kv__stats_reply__unpack(NULL, rep.len, rep.body);
    rpc_reply_free(&rep);
    rpc_chan_close(own);
    return s;
}

/* Calls fn(arg, age, state, la, miss, ops) for each point of the series. */
typedef void (*point_fn)(void *arg, int i, double age, int state, double la, double miss,
                         double ops);

static void each_point(const Kv__StatsReply *s, point_fn fn, void *arg)
{
    char name[32];
    int n = 0;
    for (int c = 0; c < 64; c++) {
        snprintf(name, sizeof(name), "nhc.series.%d", c);
        const char *v = stat_of(s, name);
        if (!v)
            break;
        while (*v) {
            double age, la, miss, ops;
            int st, used = 0;
            if (sscanf(v, " %lf,%d,%lf,%lf,%lf%n", &age, &st, &la, &miss, &ops, &used) != 5)
                break;
            fn(arg, n++, -age, st, la, miss, ops);
            v += used;
        }
    }
}

static const char *state_name(int st)
{
    return st == 2 ? "tuning" : "classic";
}

static void point_json(void *arg, int i, double age, int st, double la, double miss, double ops)
{
    (void)arg;
    printf("%s{\"age_s\":%.1f,\"state\":\"%s\",\"load_admit\":%.3f,\"miss_ratio\":%.4f,"
           "\"reads_per_s\":%.0f}",
           i ? "," : "", age, state_name(st), la, miss, ops);
}

static void point_text(void *arg, int i, double age, int st, double la, double miss, double ops)
{
    (void)arg;
    (void)i;
    printf("    %7.1f  %-8s %10.3f %10.4f %12.0f\n", -age, state_name(st), la, miss, ops);
}

static void print_dev_json(const Kv__StatsReply *s, const char *dev)
{
    char a[48], b[48], c[48];
    snprintf(a, sizeof(a), "nhc.%s_reads_per_s", dev);
    snprintf(b, sizeof(b), "nhc.%s_lat_us", dev);
    snprintf(c, sizeof(c), "nhc.%s_p99_us", dev);
    printf("\"%s\":{\"reads_per_s\":", dev);
    json_num(s, a);
    printf(",\"lat_us\":");
    json_num(s, b);
    printf(",\"p99_us\":");
    json_num(s, c);
    printf("}");
}

static void print_json(nhc_ctx *c, const char *id, const Kv__StatsReply *s)
{
    printf("%s{\"id\":", c->printed++ ? "," : "");
    kvctl_json_str(id, strlen(id));
    if (!s) {
        printf(",\"state\":\"unreachable\"}");
        return;
    }
    printf(",\"state\":");
    kvctl_json_str(sv(s, "nhc.state"), strlen(sv(s, "nhc.state")));
    if (strcmp(sv(s, "nhc.state"), "off") == 0) {
        printf("}");
        return;
    }
    printf(",\"enabled\":%s,\"data_admit\":%s,\"load_admit\":",
           strcmp(sv(s, "nhc.enabled"), "on") == 0 ? "true" : "false",
           strcmp(sv(s, "nhc.data_admit"), "on") == 0 ? "true" : "false");
    json_num(s, "nhc.load_admit");
    printf(",\"miss_ratio\":");
    json_num(s, "nhc.miss_ratio");
    printf(",\"reads_per_s\":");
    json_num(s, "nhc.reads_per_s");
    printf(",\"p99_us\":");
    json_num(s, "nhc.p99_us");
    printf(",");
    print_dev_json(s, "fd");
    printf(",");
    print_dev_json(s, "sd");
    printf(",\"twin_entries\":");
    json_num(s, "nhc.twin_entries");
    printf(",\"twin_capacity\":");
    json_num(s, "nhc.twin_capacity");
    printf(",\"routed_sd\":");
    json_num(s, "nhc.routed_sd");
    printf(",\"fallbacks\":");
    json_num(s, "nhc.fallbacks");
    printf(",\"series\":[");
    each_point(s, point_json, NULL);
    printf("]}");
}

static void print_text(nhc_ctx *c, const char *id, const Kv__StatsReply *s)
{
    (void)c;
    if (!s) {
        printf("node %s: unreachable\n", id);
        return;
    }
    if (strcmp(sv(s, "nhc.state"), "off") == 0) {
        printf("node %s: nhc off (no slow volume, or HotRAP off)\n", id);
        return;
    }
    printf("node %s: state %s%s, data_admit %s, load_admit %s, miss ratio %s\n", id,
           sv(s, "nhc.state"), strcmp(sv(s, "nhc.enabled"), "on") ? " (--nhc off)" : "",
           sv(s, "nhc.data_admit"), sv(s, "nhc.load_admit"), sv(s, "nhc.miss_ratio"));
    printf("  reads/s %s, p99 %s us (last window %s ms)\n", sv(s, "nhc.reads_per_s"),
           sv(s, "nhc.p99_us"), sv(s, "nhc.window_ms"));
    printf("  %-4s %12s %12s %12s\n", "VOL", "READS/S", "MEAN_US", "P99_US");
    printf("  %-4s %12s %12s %12s\n", "fast", sv(s, "nhc.fd_reads_per_s"), sv(s, "nhc.fd_lat_us"),
           sv(s, "nhc.fd_p99_us"));
    printf("  %-4s %12s %12s %12s\n", "slow", sv(s, "nhc.sd_reads_per_s"), sv(s, "nhc.sd_lat_us"),
           sv(s, "nhc.sd_p99_us"));
    printf("  twins %s / %s (evicted %s), reads sent to slow %s, fallbacks %s\n",
           sv(s, "nhc.twin_entries"), sv(s, "nhc.twin_capacity"), sv(s, "nhc.twin_evicted"),
           sv(s, "nhc.routed_sd"), sv(s, "nhc.fallbacks"));
    printf("  last minute:\n    %7s  %-8s %10s %10s %12s\n", "AGE_S", "STATE", "LOAD_ADMIT", "MISS",
           "READS/S");
    each_point(s, point_text, NULL);
}

static void one_node(nhc_ctx *c, const char *id, const char *addr)
{
    Kv__StatsReply *s = fetch(c, id, addr);
    c->env->json ? print_json(c, id, s) : print_text(c, id, s);
    if (s)
        kv__stats_reply__free_unpacked(s, NULL);
}

static int who(nhc_ctx *c, Kv__PingReply **pout, cmap **mout)
{
    Kv__PingRequest preq = KV__PING_REQUEST__INIT;
    rpc_reply rep;
    kv_err rv =
        rpc_call(c->target, "admin.Ping", 0, &preq.base, (uint32_t)c->env->timeout_ms, &rep);
    Kv__PingReply *p = rv == KV_OK ? kv__ping_reply__unpack(NULL, rep.len, rep.body) : NULL;
    int code = KVCTL_OK;
    if (!p)
        code =
            kvctl_fail(rv == KV_OK ? KV_INTERNAL : rv, rep.message ? rep.message : kv_strerror(rv));
    rpc_reply_free(&rep);
    if (!p)
        return code;
    Kv__GetMapRequest mreq = KV__GET_MAP_REQUEST__INIT;
    rv = rpc_call(c->target, "admin.GetMap", 0, &mreq.base, (uint32_t)c->env->timeout_ms, &rep);
    Kv__GetMapReply *g = rv == KV_OK ? kv__get_map_reply__unpack(NULL, rep.len, rep.body) : NULL;
    char err[256] = "malformed map";
    cmap *m = NULL;
    if (!g)
        code =
            kvctl_fail(rv == KV_OK ? KV_INTERNAL : rv, rep.message ? rep.message : kv_strerror(rv));
    else if (g->has_map && cmap_from_pb(g->map, &m, err, sizeof(err)) != KV_OK)
        code = kvctl_fail(KV_INTERNAL, err);
    if (g)
        kv__get_map_reply__free_unpacked(g, NULL);
    rpc_reply_free(&rep);
    c->target_is_router = strcmp(p->role, "router") == 0;
    c->target_id = p->id;
    if (code == KVCTL_OK && !m && c->target_is_router)
        code = kvctl_fail(KV_FAILED_PRECONDITION, "the router has no cluster map yet");
    *pout = p;
    *mout = m;
    return code;
}

/* One refresh: every node (or only `only`). */
static int round_once(nhc_ctx *c, const Kv__PingReply *p, const cmap *m, const char *only)
{
    bool seen = false;
    c->printed = 0;
    if (c->env->json)
        printf("{\"nodes\":[");
    for (size_t i = 0; m && i < cmap_node_count(m); i++) {
        const cmap_node *nd = cmap_node_at(m, i);
        if (only && strcmp(only, nd->id) != 0)
            continue;
        seen = true;
        one_node(c, nd->id, nd->addr);
    }
    if (!m && (!only || strcmp(only, p->id) == 0)) { /* a node before cluster init */
        seen = true;
        one_node(c, p->id, c->env->router);
    }
    if (c->env->json)
        printf("]}\n");
    fflush(stdout);
    if (!seen) {
        fprintf(stderr, "kvctl: NOT_FOUND: no node '%s' in the cluster map\n", only);
        return KVCTL_NOT_FOUND;
    }
    return KVCTL_OK;
}

int kvctl_nhc(kvctl_env *env, int argc, char **argv)
{
    nhc_ctx c = {.env = env};
    rpc_chan_opts o = {.auth = env->auth, .tls = env->tls, .connect_wait_ms = 1000};
    if (rpc_chan_open(&c.target, env->router, &o) != KV_OK)
        return kvctl_fail(KV_INVALID_ARGUMENT, "bad --router address");
    Kv__PingReply *p = NULL;
    cmap *m = NULL;
    int code = who(&c, &p, &m);
    while (code == KVCTL_OK) {
        if (env->watch && !env->json)
            printf("\033[H\033[2J");
        code = round_once(&c, p, m, argc > 0 ? argv[0] : NULL);
        if (!env->watch)
            break;
        if (code == KVCTL_OK)
            sleep(1);
    }
    if (p)
        kv__ping_reply__free_unpacked(p, NULL);
    cmap_unref(m);
    rpc_chan_close(c.target);
    return code;
}
