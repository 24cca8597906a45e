/* SPDX-License-Identifier: MIT */
/*
 * kvctl's admin RPC helpers, shared by the admin commands: channels, calls
 * that print the failure, map fetches and pings.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/kvctl.h"
#include "common/clock.h"

kv_client_opts kvctl_client_opts(const kvctl_env *env)
{
    return (kv_client_opts){.timeout_ms = (uint32_t)env->timeout_ms,
                            .auth = env->auth,
                            .tls_cert = env->sec.tls.cert,
                            .tls_key = env->sec.tls.key,
                            .tls_ca = env->sec.tls.ca};
}

static rpc_chan *open_chan(kvctl_env *env, const char *addr, bool named)
{
    rpc_chan *ch = NULL;
    /* An address the user named gets the command's --timeout to connect (a
     * slow TLS handshake on a loaded host is not a failure); a node found
     * in the map gets 1 s, so one that is down does not hold up a command
     * that asks every node (status, repair). */
    uint32_t wait = named && env->timeout_ms > RPC_CONNECT_WAIT_MS ? (uint32_t)env->timeout_ms
                                                                   : RPC_CONNECT_WAIT_MS;
    rpc_chan_opts o = {.auth = env->auth, .tls = env->tls, .connect_wait_ms = wait};
    if (rpc_chan_open(&ch, addr, &o) != KV_OK) {
        if (rpc_url_tls(addr))
            fprintf(stderr,
                    "kvctl: INVALID_ARGUMENT: cannot dial '%s': tls+tcp:// needs --tls-ca "
                    "(and readable --tls-cert/--tls-key)\n",
                    addr);
        else
            fprintf(stderr, "kvctl: INVALID_ARGUMENT: bad address '%s'\n", addr);
        return NULL;
    }
    return ch;
}

rpc_chan *kvctl_open_chan(kvctl_env *env, const char *addr)
{
    return open_chan(env, addr, env->router && strcmp(addr, env->router) == 0);
}

rpc_chan *kvctl_open_named(kvctl_env *env, const char *addr)
{
    return open_chan(env, addr, true);
}

int kvctl_call(kvctl_env *env, rpc_chan *ch, const char *method, const ProtobufCMessage *req,
               uint32_t deadline_ms, rpc_reply *rep, bool quiet)
{
    kv_err rv =
        rpc_call(ch, method, 0, req, deadline_ms ? deadline_ms : (uint32_t)env->timeout_ms, rep);
    if (rv == KV_OK)
        return KVCTL_OK;
    if (!quiet) {
        char msg[400];
        snprintf(msg, sizeof(msg), "%s: %s", rpc_chan_url(ch),
                 rep->message ? rep->message : kv_strerror(rv));
        kvctl_fail(rv, msg);
    }
    rpc_reply_free(rep);
    return KVCTL_SERVER;
}

int kvctl_fetch_map(kvctl_env *env, rpc_chan *ch, cmap **out, bool quiet)
{
    Kv__GetMapRequest req = KV__GET_MAP_REQUEST__INIT;
    rpc_reply rep;
    int code = kvctl_call(env, ch, "admin.GetMap", &req.base, 0, &rep, quiet);
    if (code != KVCTL_OK)
        return code;
    Kv__GetMapReply *g = kv__get_map_reply__unpack(NULL, rep.len, rep.body);
    char err[256] = "malformed GetMapReply";
    *out = NULL;
    if (!g || (g->has_map && (!g->map || cmap_from_pb(g->map, out, err, sizeof(err)) != KV_OK)))
        code = quiet ? KVCTL_SERVER : kvctl_fail(KV_INTERNAL, err);
    if (g)
        kv__get_map_reply__free_unpacked(g, NULL);
    rpc_reply_free(&rep);
    return code;
}

Kv__PingReply *kvctl_ping_rpc(kvctl_env *env, rpc_chan *ch, double *ms, bool quiet)
{
    Kv__PingRequest req = KV__PING_REQUEST__INIT;
    rpc_reply rep;
    uint64_t t0 = kv_now_ns();
    if (kvctl_call(env, ch, "admin.Ping", &req.base, 0, &rep, quiet) != KVCTL_OK)
        return NULL;
    if (ms)
        *ms = (double)(kv_now_ns() - t0) / 1e6;
    Kv__PingReply *p = kv__ping_reply__unpack(NULL, rep.len, rep.body);
    rpc_reply_free(&rep);
    return p;
}

const char *kvctl_serving_name(int s)
{
    static const char *const names[] = {"serving", "catching_up", "needs_repair", "no_map",
                                        "removed"};
    return s >= 0 && s < 5 ? names[s] : "?";
}

/* With a map key, whether m is signed with it: kvctl builds the next map on
 * it and signs that, so a forged map must not get through here (that would
 * launder it). Without a key, every map. */
static bool trusted(const kvctl_env *env, const cmap *m, const char *from, char *why, size_t len)
{
    if (!env->sec.map_key || env->sign_unsigned ||
        cmap_check_sig(m, env->sec.map_key, why, len) == KV_OK)
        return true;
    fprintf(stderr, "kvctl: warning: ignored the map of %s: %s\n", from, why);
    return false;
}

int kvctl_fetch_latest_map(kvctl_env *env, cmap **out)
{
    rpc_chan *ch = kvctl_open_chan(env, env->router);
    cmap *m = NULL;
    char why[300];
    int code = ch ? kvctl_fetch_map(env, ch, &m, false) : KVCTL_USAGE;
    rpc_chan_close(ch);
    if (code == KVCTL_OK && !m)
        code = kvctl_fail(KV_FAILED_PRECONDITION, "no cluster map yet (run kvctl cluster init)");
    if (code == KVCTL_OK && !trusted(env, m, env->router, why, sizeof(why))) {
        char line[420];
        snprintf(line, sizeof(line), "%s (an unsigned cluster: kvctl cluster sign)", why);
        code = kvctl_fail(KV_PERMISSION_DENIED, line);
    }
    for (size_t i = 0; code == KVCTL_OK && i < cmap_node_count(m); i++) {
        rpc_chan *nc = kvctl_open_chan(env, cmap_node_at(m, i)->addr);
        cmap *theirs = NULL;
        if (nc && kvctl_fetch_map(env, nc, &theirs, true) == KVCTL_OK && theirs &&
            cmap_epoch(theirs) > cmap_epoch(m) &&
            trusted(env, theirs, cmap_node_at(m, i)->addr, why, sizeof(why))) {
            cmap_unref(m);
            m = cmap_ref(theirs);
            i = (size_t)-1; /* ask the newer map's nodes too */
        }
        cmap_unref(theirs);
        rpc_chan_close(nc);
    }
    if (code != KVCTL_OK) {
        cmap_unref(m);
        return code;
    }
    *out = m;
    return KVCTL_OK;
}

kv_err kvctl_map_pb(const kvctl_env *env, const cmap *m, Kv__ClusterMap **out)
{
    Kv__ClusterMap *pb = NULL;
    kv_err rv = cmap_to_pb(m, &pb);
    if (rv == KV_OK && env->sec.map_key)
        rv = cmap_sign_pb(m, env->sec.map_key, pb);
    if (rv != KV_OK && pb)
        kv__cluster_map__free_unpacked(pb, NULL);
    *out = rv == KV_OK ? pb : NULL;
    return rv;
}
