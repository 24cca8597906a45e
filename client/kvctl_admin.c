/* SPDX-License-Identifier: MIT */
/*
 * kvctl status / ring / ping / cluster init: admin.* calls over the RPC
 * runtime. status and ring work against a router or a node; cluster init
 * talks to the listed nodes directly.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/kvctl.h"
#include "common/clock.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"
#include "shard/clustermap.h"

int kvctl_ping(kvctl_env *env, int argc, char **argv)
{
    rpc_chan *ch = kvctl_open_chan(env, env->router);
    if (!ch)
        return KVCTL_USAGE;
    double ms = 0;
    Kv__PingReply *p = kvctl_ping_rpc(env, ch, &ms, false);
    int code = p ? KVCTL_OK : KVCTL_SERVER;
    if (p && env->json)
        printf("{\"role\":\"%s\",\"id\":\"%s\",\"map_epoch\":%llu,\"uptime_ms\":%llu,"
               "\"rtt_ms\":%.3f}\n",
               p->role, p->id, (unsigned long long)p->map_epoch, (unsigned long long)p->uptime_ms,
               ms);
    else if (p)
        printf("PONG from %s %s (map epoch %llu, up %llu s) in %.2f ms\n", p->role, p->id,
               (unsigned long long)p->map_epoch, (unsigned long long)(p->uptime_ms / 1000), ms);
    if (p)
        kv__ping_reply__free_unpacked(p, NULL);
    rpc_chan_close(ch);
    return code;
}

int kvctl_ring(kvctl_env *env, int argc, char **argv)
{
    rpc_chan *ch = kvctl_open_chan(env, env->router);
    cmap *m = NULL;
    int code = ch ? kvctl_fetch_map(env, ch, &m, false) : KVCTL_USAGE;
    if (code == KVCTL_OK && !m)
        code = kvctl_fail(KV_FAILED_PRECONDITION, "no cluster map yet (run kvctl cluster init)");
    if (code == KVCTL_OK) {
        size_t n = cmap_node_count(m);
        double *share = calloc(n, sizeof(double));
        cmap_shares(m, false, share);
        char why[200];
        const char *sig = !cmap_signed(m)     ? "none"
                          : !env->sec.map_key ? "unchecked"
                          : cmap_check_sig(m, env->sec.map_key, why, sizeof(why)) == KV_OK
                              ? "valid"
                              : "invalid";
        if (env->json)
            printf("{\"epoch\":%llu,\"rf\":%u,\"vnodes\":%u,\"signature\":\"%s\",\"nodes\":[",
                   (unsigned long long)cmap_epoch(m), cmap_rf(m), cmap_vnodes(m), sig);
        else
            printf("epoch %llu, rf %u, %u vnodes per unit weight, signature %s\n%-16s %-28s %6s "
                   "%8s\n",
                   (unsigned long long)cmap_epoch(m), cmap_rf(m), cmap_vnodes(m), sig, "ID",
                   "ADDRESS", "WEIGHT", "SHARE");
        for (size_t i = 0; i < n; i++) {
            const cmap_node *nd = cmap_node_at(m, i);
            if (env->json)
                printf("%s{\"id\":\"%s\",\"address\":\"%s\",\"weight\":%u,\"share\":%.4f}",
                       i ? "," : "", nd->id, nd->addr, nd->weight, share[i]);
            else
                printf("%-16s %-28s %6u %7.2f%%\n", nd->id, nd->addr, nd->weight, share[i] * 100.0);
        }
        if (env->json)
            printf("]}\n");
        free(share);
    }
    cmap_unref(m);
    rpc_chan_close(ch);
    return code;
}

int kvctl_cluster(kvctl_env *env, int argc, char **argv)
{
    if (strcmp(argv[0], "sign") == 0 && argc == 1)
        return kvctl_cluster_sign(env);
    if (strcmp(argv[0], "init") != 0 || argc < 2 || env->rf < 1) {
        fprintf(stderr, "usage: kvctl cluster init --rf N ID=ADDR...\n"
                        "       kvctl cluster sign     (with --map-key-file)\n");
        return KVCTL_USAGE;
    }
    cmap *m = NULL;
    char err[300];
    kv_err rv = cmap_parse_spec(1, (unsigned)env->rf, argv + 1, argc - 1, &m, err, sizeof(err));
    if (rv != KV_OK) {
        fprintf(stderr, "kvctl: %s: %s\n", kv_err_name(rv), err);
        return KVCTL_USAGE;
    }
    size_t n = cmap_node_count(m);
    rpc_chan **chans = calloc(n, sizeof(*chans));
    int code = KVCTL_OK;
    for (size_t i = 0; code == KVCTL_OK && i < n; i++) { /* refuse before writing anything */
        cmap *old = NULL;
        chans[i] = kvctl_open_named(env, cmap_node_at(m, i)->addr); /* named by the user */
        code = chans[i] ? kvctl_fetch_map(env, chans[i], &old, false) : KVCTL_USAGE;
        if (code == KVCTL_OK && old) {
            snprintf(err, sizeof(err), "node %s (%s) already has a cluster map (epoch %llu)",
                     cmap_node_at(m, i)->id, cmap_node_at(m, i)->addr,
                     (unsigned long long)cmap_epoch(old));
            code = kvctl_fail(KV_ALREADY_EXISTS, err);
        }
        cmap_unref(old);
    }
    Kv__ClusterMap *pb = NULL;
    if (code == KVCTL_OK && kvctl_map_pb(env, m, &pb) != KV_OK)
        code = kvctl_fail(KV_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t i = 0; code == KVCTL_OK && i < n; i++) {
        Kv__SetMapRequest req = KV__SET_MAP_REQUEST__INIT;
        req.map = pb;
        req.only_if_empty = true;
        rpc_reply rep;
        code = kvctl_call(env, chans[i], "admin.SetMap", &req.base, 0, &rep, false);
        if (code == KVCTL_OK)
            rpc_reply_free(&rep);
    }
    if (code == KVCTL_OK)
        printf("cluster initialised: epoch 1, rf %ld, %zu nodes\n", env->rf, n);
    if (pb)
        kv__cluster_map__free_unpacked(pb, NULL);
    for (size_t i = 0; i < n; i++)
        rpc_chan_close(chans[i]);
    free(chans);
    cmap_unref(m);
    return code;
}
