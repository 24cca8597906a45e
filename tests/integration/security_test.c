/* SPDX-License-Identifier: MIT */
/*
 * Security of a live cluster (issue 16): client-chosen write versions,
 * separate data and admin tokens (constant-time, full-length comparison,
 * tokens from files and the environment), bounded and authenticated
 * hot-key reports, cluster maps from impostors, and TLS (plaintext and
 * foreign certificates refused, a mutual-TLS cluster that works with kvctl
 * and the client library).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "kv/kv.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"
#include "shard/clustermap.h"

#define DATA "data-tok"
#define ADMIN "admin-tok"

static kvt_cluster cl;

static void teardown(void)
{
    kvt_cluster_stop(&cl);
    kvt_sec = (kvt_security){0};
}

/* How long call_tls's call waits for its first connection: up to its
 * deadline (a TLS handshake between ASan processes on a loaded host can take
 * over a second), or 0 (the library's 1 s) where a refusal is expected. */
static uint32_t connect_wait_ms = 10000;

/* method(req) on url with token (and tls, coordinate); the reply's status,
 * its message copied to msg (may be NULL), its body kept in *out if set. */
static kv_err call_tls(const char *url, const char *token, const rpc_tls *tls, bool coordinate,
                       const char *method, const ProtobufCMessage *req, char *msg, rpc_reply *out)
{
    rpc_chan *ch;
    rpc_chan_opts o = {
        .auth = token, .tls = tls, .coordinate = coordinate, .connect_wait_ms = connect_wait_ms};
    if (rpc_chan_open(&ch, url, &o) != KV_OK)
        return KV_INVALID_ARGUMENT;
    rpc_reply r;
    kv_err rv = rpc_call(ch, method, 0, req, 10000, &r);
    if (msg)
        snprintf(msg, 300, "%s", r.message ? r.message : "");
    if (out)
        *out = r;
    else
        rpc_reply_free(&r);
    rpc_chan_close(ch);
    return rv;
}

static kv_err call(const char *url, const char *token, const char *method,
                   const ProtobufCMessage *req, char *msg)
{
    return call_tls(url, token, NULL, false, method, req, msg, NULL);
}

static kv_err put_version(const char *url, const char *token, bool coordinate, const char *key,
                          const char *val, uint64_t version, char *msg)
{
    Kv__PutRequest req = KV__PUT_REQUEST__INIT;
    req.key = (ProtobufCBinaryData){strlen(key), (uint8_t *)key};
    req.value = (ProtobufCBinaryData){strlen(val), (uint8_t *)val};
    req.version = version;
    return call_tls(url, token, NULL, coordinate, "kv.Put", &req.base, msg, NULL);
}

/* The value of key read through the router with the data token. */
static void expect_value(const char *key, const char *want)
{
    kv_client *c;
    kv_client_opts o = {.auth = DATA, .timeout_ms = 10000};
    cr_assert_eq(kv_client_open(&c, cl.router_url, &o), KV_OK);
    kv_value v;
    kv_err rv = kv_get_ex(c, key, strlen(key), KV_CONSISTENCY_ALL, &v);
    cr_assert_eq(rv, KV_OK, "get %s: %s", key, kv_last_error());
    cr_assert(v.len == strlen(want) && memcmp(v.data, want, v.len) == 0, "%s = '%.*s', not '%s'",
              key, (int)v.len, (const char *)v.data, want);
    kv_value_free(&v);
    kv_client_close(c);
}

static void start_tokens_cluster(int nnodes, int rf)
{
    kvt_sec = (kvt_security){.admin_auth = ADMIN};
    cr_assert_eq(kvt_cluster_start(&cl, nnodes, rf, DATA), KV_OK, "logs in %s", cl.dir);
}

/* Issue 16 item 1: a put with version 2^64-1 hid every later write. */
Test(security, client_versions_cannot_hide_later_writes, .fini = teardown, .timeout = 300)
{
    start_tokens_cluster(3, 3);
    char msg[300];
    /* through the router: the version is ignored, the router's clock gives one */
    cr_assert_eq(put_version(cl.router_url, DATA, false, "v1", "poison", UINT64_MAX, msg), KV_OK,
                 "%s", msg);
    kv_client *c;
    kv_client_opts o = {.auth = DATA, .timeout_ms = 10000};
    cr_assert_eq(kv_client_open(&c, cl.router_url, &o), KV_OK);
    cr_assert_eq(kv_put(c, "v1", 2, "later", 5, NULL, NULL), KV_OK, "%s", kv_last_error());
    expect_value("v1", "later");
    /* a batch op's version too */
    Kv__Op op = KV__OP__INIT, *ops = &op;
    op.type = KV__OP_TYPE__PUT;
    op.key = (ProtobufCBinaryData){2, (uint8_t *)"v2"};
    op.value = (ProtobufCBinaryData){6, (uint8_t *)"poison"};
    op.version = UINT64_MAX;
    Kv__BatchRequest b = KV__BATCH_REQUEST__INIT;
    b.n_ops = 1;
    b.ops = &ops;
    cr_assert_eq(call(cl.router_url, DATA, "kv.Batch", &b.base, msg), KV_OK, "%s", msg);
    cr_assert_eq(kv_put(c, "v2", 2, "later", 5, NULL, NULL), KV_OK, "%s", kv_last_error());
    expect_value("v2", "later");
    bool existed = false;
    cr_assert_eq(kv_delete(c, "v2", 2, NULL, &existed), KV_OK);
    cr_assert(existed);
    /* a smart client's coordinate call: ignored too */
    cr_assert_eq(put_version(cl.node_url[0], DATA, true, "v3", "poison", UINT64_MAX, msg), KV_OK,
                 "%s", msg);
    /* the node versioned "poison" from its clock, the router versions the
     * next put from its own: in the same millisecond the router's counter
     * may be the lower one (last-writer-wins by version, not by arrival;
     * CI saw 'poison' stay once), so let the wall clock move on first */
    usleep(5000);
    cr_assert_eq(kv_put(c, "v3", 2, "later", 5, NULL, NULL), KV_OK, "%s", kv_last_error());
    expect_value("v3", "later");
    kv_client_close(c);
    /* straight to a replica: refused with the data token ... */
    cr_assert_eq(put_version(cl.node_url[0], DATA, false, "v4", "x", 12345, msg),
                 KV_INVALID_ARGUMENT);
    cr_assert(strstr(msg, "coordinators"), "%s", msg);
    /* ... and even with the admin token when far ahead of the clock */
    cr_assert_eq(put_version(cl.node_url[0], ADMIN, false, "v4", "x", UINT64_MAX, msg),
                 KV_INVALID_ARGUMENT);
    cr_assert(strstr(msg, "ahead of this node's clock"), "%s", msg);
    Kv__Record rec = KV__RECORD__INIT, *recs = &rec;
    rec.key = (ProtobufCBinaryData){2, (uint8_t *)"v1"};
    rec.value = (ProtobufCBinaryData){6, (uint8_t *)"poison"};
    rec.version = UINT64_MAX;
    Kv__ApplyRequest ap = KV__APPLY_REQUEST__INIT;
    ap.n_records = 1;
    ap.records = &recs;
    cr_assert_eq(call(cl.node_url[0], ADMIN, "admin.Apply", &ap.base, msg), KV_INVALID_ARGUMENT);
    expect_value("v1", "later");
}

/* Sends an Envelope with auth bytes (NULs included) over a raw REQ socket;
 * returns the reply's status. */
static int raw_auth(const char *url, const void *auth, size_t alen, const char *method)
{
    Kv__PingRequest ping = KV__PING_REQUEST__INIT;
    uint8_t body[8];
    Kv__Envelope env = KV__ENVELOPE__INIT;
    env.id = 7;
    env.method = (char *)method;
    env.auth = (ProtobufCBinaryData){alen, (uint8_t *)auth};
    env.body = (ProtobufCBinaryData){kv__ping_request__pack(&ping, body), body};
    uint8_t buf[512];
    size_t len = kv__envelope__pack(&env, buf);
    nng_socket s;
    nng_req0_open(&s);
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 5000);
    int code = -1;
    char *rep = NULL;
    size_t rlen = 0;
    if (nng_dial(s, url, NULL, 0) == 0 && nng_send(s, buf, len, 0) == 0 &&
        nng_recv(s, &rep, &rlen, NNG_FLAG_ALLOC) == 0) {
        Kv__Envelope *r = kv__envelope__unpack(NULL, rlen, (uint8_t *)rep);
        code = r && r->status ? r->status->code : r ? 0 : -2;
        if (r)
            kv__envelope__free_unpacked(r, NULL);
        nng_free(rep, rlen);
    }
    nng_close(s);
    return code;
}

Test(security, data_token_refused_on_admin_methods, .fini = teardown, .timeout = 300)
{
    start_tokens_cluster(2, 2);
    char msg[300];
    Kv__PingRequest ping = KV__PING_REQUEST__INIT;
    Kv__GetMapRequest gm = KV__GET_MAP_REQUEST__INIT;
    Kv__StatsRequest st = KV__STATS_REQUEST__INIT;
    /* data methods take the data token, the admin token, not a wrong one */
    cr_assert_eq(call(cl.router_url, DATA, "admin.Ping", &ping.base, msg), KV_OK, "%s", msg);
    cr_assert_eq(call(cl.router_url, DATA, "admin.GetMap", &gm.base, msg), KV_OK, "%s", msg);
    cr_assert_eq(call(cl.router_url, ADMIN, "admin.Ping", &ping.base, msg), KV_OK, "%s", msg);
    cr_assert_eq(call(cl.router_url, "nope", "admin.Ping", &ping.base, msg), KV_UNAUTHENTICATED);
    cr_assert_eq(call(cl.node_url[0], NULL, "admin.Ping", &ping.base, msg), KV_UNAUTHENTICATED);
    /* admin methods: the data token is refused with a message */
    cr_assert_eq(call(cl.router_url, DATA, "admin.Stats", &st.base, msg), KV_PERMISSION_DENIED);
    cr_assert(strstr(msg, "admin"), "%s", msg);
    cr_assert_eq(call(cl.router_url, ADMIN, "admin.Stats", &st.base, msg), KV_OK, "%s", msg);
    const char *internal[] = {"admin.SetMap", "admin.Apply",  "admin.Hint",       "admin.HotKeys",
                              "admin.Stats",  "admin.Digest", "admin.StreamRead", "admin.Cleanup"};
    Kv__CleanupRequest empty = KV__CLEANUP_REQUEST__INIT; /* an empty body for every method */
    for (size_t i = 0; i < sizeof(internal) / sizeof(internal[0]); i++) {
        cr_assert_eq(call(cl.node_url[0], DATA, internal[i], &empty.base, msg),
                     KV_PERMISSION_DENIED, "%s with the data token: %s", internal[i], msg);
        cr_assert(strstr(msg, "admin token"), "%s", msg);
    }
    /* the comparison covers the token's full length: a NUL does not end it */
    static const char nul_tail[] = DATA "\0garbage";
    cr_assert_eq(raw_auth(cl.router_url, DATA, strlen(DATA), "admin.Ping"), KV_OK);
    cr_assert_eq(raw_auth(cl.router_url, nul_tail, sizeof(nul_tail) - 1, "admin.Ping"),
                 KV_UNAUTHENTICATED);
    cr_assert_eq(raw_auth(cl.router_url, DATA, strlen(DATA) - 1, "admin.Ping"), KV_UNAUTHENTICATED);
    /* kvctl: status needs the admin token, from the environment here */
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof(cmd), "%s --router %s --auth %s status 2>&1", kvt_bin("client/kvctl"),
             cl.router_url, DATA);
    cr_assert_eq(kvt_run(cmd, out, sizeof(out)), 3, "%s", out);
    cr_assert(strstr(out, "PERMISSION_DENIED"), "%s", out);
    snprintf(cmd, sizeof(cmd), "KV_ADMIN_AUTH=%s %s --router %s status 2>&1", ADMIN,
             kvt_bin("client/kvctl"), cl.router_url);
    cr_assert_eq(kvt_run(cmd, out, sizeof(out)), 0, "%s", out);
}

/* Tokens from files and the environment, never on the command line. */
static pid_t solo_pid;

static void solo_teardown(void)
{
    if (solo_pid > 0)
        kill(solo_pid, SIGKILL);
    solo_pid = 0;
    teardown();
}

Test(security, tokens_from_files_and_environment, .fini = solo_teardown, .timeout = 120)
{
    memset(&cl, 0, sizeof(cl));
    snprintf(cl.dir, sizeof(cl.dir), "/tmp/hotkv-test-XXXXXX");
    cr_assert(mkdtemp(cl.dir));
    char dpath[300], apath[300], url[64], cmd[1400], out[4096];
    snprintf(dpath, sizeof(dpath), "%s/data.tok", cl.dir);
    snprintf(apath, sizeof(apath), "%s/admin.tok", cl.dir);
    FILE *f = fopen(dpath, "w");
    fputs(DATA "\n", f);
    fclose(f);
    f = fopen(apath, "w");
    fputs(ADMIN "\r\n", f);
    fclose(f);
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", kvt_free_port());
    snprintf(cmd, sizeof(cmd),
             "%s --id solo --listen %s --data-dir %s/solo --auth-file %s --admin-auth-file %s "
             "> %s/solo.log 2>&1 & echo $!",
             kvt_bin("node/kvnode"), url, cl.dir, dpath, apath, cl.dir);
    cr_assert_eq(kvt_run(cmd, out, sizeof(out)), 0);
    solo_pid = (pid_t)atoi(out);
    cr_assert(kvt_wait_ping(url, DATA, 15000), "logs in %s", cl.dir);
    char msg[300];
    Kv__StatsRequest st = KV__STATS_REQUEST__INIT;
    cr_assert_eq(call(url, DATA, "admin.Stats", &st.base, msg), KV_PERMISSION_DENIED);
    cr_assert_eq(call(url, ADMIN, "admin.Stats", &st.base, msg), KV_OK, "%s", msg);
    cr_assert_eq(call(url, ADMIN "\r", "admin.Stats", &st.base, msg), KV_UNAUTHENTICATED);
    /* the tokens are not on its command line */
    char path[64], cmdline[4096] = "";
    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)solo_pid);
    f = fopen(path, "r");
    size_t n = f ? fread(cmdline, 1, sizeof(cmdline) - 1, f) : 0;
    if (f)
        fclose(f);
    for (size_t i = 0; i < n; i++)
        cmdline[i] = cmdline[i] ? cmdline[i] : ' ';
    cr_assert(n > 0 && !strstr(cmdline, DATA) && !strstr(cmdline, ADMIN), "%s", cmdline);
    /* kvctl with its tokens from the environment */
    snprintf(cmd, sizeof(cmd), "KV_AUTH=%s KV_ADMIN_AUTH=%s %s --router %s status 2>&1", DATA,
             ADMIN, kvt_bin("client/kvctl"), url);
    cr_assert_eq(kvt_run(cmd, out, sizeof(out)), 0, "%s", out);
    snprintf(cmd, sizeof(cmd), "KV_AUTH=%s %s --router %s put k v 2>&1", DATA,
             kvt_bin("client/kvctl"), url);
    cr_assert_eq(kvt_run(cmd, out, sizeof(out)), 0, "%s", out);
    snprintf(cmd, sizeof(cmd), "KV_AUTH=%s %s --router %s status 2>&1", DATA,
             kvt_bin("client/kvctl"), url);
    cr_assert_eq(kvt_run(cmd, out, sizeof(out)), 3, "%s", out);
    /* a flag and its file together are refused */
    snprintf(cmd, sizeof(cmd), "%s --router %s --auth x --auth-file %s ping 2>&1",
             kvt_bin("client/kvctl"), url, dpath);
    cr_assert_eq(kvt_run(cmd, out, sizeof(out)), 2, "%s", out);
}

/* One hot-key report (router id, window, keys of klen bytes, rate) to url
 * with token; its status. */
static kv_err hot_report(const char *url, const char *token, const char *router_id,
                         uint32_t window_ms, size_t nkeys, size_t klen, double rate, char *msg)
{
    Kv__HotKey *hk = calloc(nkeys + 1, sizeof(*hk));
    Kv__HotKey **ptrs = calloc(nkeys + 1, sizeof(*ptrs));
    uint8_t *keys = calloc(nkeys + 1, klen);
    cr_assert(hk && ptrs && keys);
    for (size_t i = 0; i < nkeys; i++) {
        uint8_t *k = keys + i * klen;
        memset(k, 'h', klen);
        memcpy(k, &i, klen < sizeof(i) ? klen : sizeof(i));
        kv__hot_key__init(&hk[i]);
        hk[i].key = (ProtobufCBinaryData){klen, k};
        hk[i].ops_per_s = rate;
        ptrs[i] = &hk[i];
    }
    Kv__HotKeysRequest req = KV__HOT_KEYS_REQUEST__INIT;
    req.router_id = (char *)router_id;
    req.window_ms = window_ms;
    req.n_keys = nkeys;
    req.keys = ptrs;
    kv_err rv = call(url, token, "admin.HotKeys", &req.base, msg);
    free(keys);
    free(ptrs);
    free(hk);
    return rv;
}

/* Keys in url's hot-key view. */
static size_t hot_view(const char *url)
{
    Kv__HotKeysRequest req = KV__HOT_KEYS_REQUEST__INIT;
    req.top = 100000;
    rpc_reply r;
    char msg[300];
    cr_assert_eq(call_tls(url, ADMIN, NULL, false, "admin.HotKeys", &req.base, msg, &r), KV_OK,
                 "%s", msg);
    Kv__HotKeysReply *rep = kv__hot_keys_reply__unpack(NULL, r.len, r.body);
    cr_assert(rep);
    size_t n = rep->n_keys;
    kv__hot_keys_reply__free_unpacked(rep, NULL);
    rpc_reply_free(&r);
    return n;
}

/* Issue 16 item 3: unauthenticated, unbounded hot-key reports. */
Test(security, hot_key_reports_authenticated_and_bounded, .fini = teardown, .timeout = 300)
{
    static const char *const nflags[] = {"--max-key-bytes", "64", NULL};
    static const char *const rflags[] = {"--hot-sample", "0", "--max-key-bytes", "64", NULL};
    kvt_node_extra = nflags;
    kvt_router_extra = rflags; /* no router reports: the view is the test's */
    start_tokens_cluster(1, 1);
    kvt_node_extra = kvt_router_extra = NULL;
    const char *node = cl.node_url[0];
    char msg[300];
    /* data token (a client): refused, a report and an empty one alike */
    cr_assert_eq(hot_report(node, DATA, "r1", 1000, 2, 8, 100, msg), KV_PERMISSION_DENIED);
    cr_assert_eq(hot_report(node, DATA, "r1", 1000, 0, 8, 100, msg), KV_PERMISSION_DENIED);
    cr_assert_eq(hot_view(node), 0);
    /* a router's report (admin token) */
    /* (a window of 60 s: the entries outlive a slow run of the checks below) */
    cr_assert_eq(hot_report(node, ADMIN, "r1", 60000, 2, 8, 100, msg), KV_OK, "%s", msg);
    cr_assert_eq(hot_view(node), 2);
    /* a client cannot wipe r1's entries with an empty report under its id */
    cr_assert_eq(hot_report(node, DATA, "r1", 1000, 0, 8, 0, msg), KV_PERMISSION_DENIED);
    cr_assert_eq(hot_view(node), 2);
    /* bounds, each refused whole: a key over --max-key-bytes, a 4 MiB key,
     * a rate that is not finite, a window over 60 s, too many keys, keys
     * without a router id */
    cr_assert_eq(hot_report(node, ADMIN, "r2", 1000, 1, 65, 10, msg), KV_INVALID_ARGUMENT);
    cr_assert(strstr(msg, "max-key-bytes"), "%s", msg);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(hot_report(node, ADMIN, "r2", 1000, 2, 4u << 20, 10, msg),
                     KV_INVALID_ARGUMENT);
    cr_assert_eq(hot_report(node, ADMIN, "r2", 1000, 1, 8, INFINITY, msg), KV_INVALID_ARGUMENT);
    cr_assert_eq(hot_report(node, ADMIN, "r2", 1000, 1, 8, NAN, msg), KV_INVALID_ARGUMENT);
    cr_assert_eq(hot_report(node, ADMIN, "r2", UINT32_MAX, 1, 8, 10, msg), KV_INVALID_ARGUMENT);
    cr_assert(strstr(msg, "window_ms"), "%s", msg);
    cr_assert_eq(hot_report(node, ADMIN, "r2", 60001, 1, 8, 10, msg), KV_INVALID_ARGUMENT);
    cr_assert_eq(hot_report(node, ADMIN, "r2", 1000, 8193, 8, 10, msg), KV_INVALID_ARGUMENT);
    cr_assert_eq(hot_report(node, ADMIN, "", 1000, 1, 8, 10, msg), KV_INVALID_ARGUMENT);
    cr_assert_eq(hot_view(node), 2, "a refused report changed the view");
    /* r1's own empty report withdraws its keys */
    cr_assert_eq(hot_report(node, ADMIN, "r1", 1000, 0, 8, 0, msg), KV_OK, "%s", msg);
    cr_assert_eq(hot_view(node), 0);
}

/* ---- cluster maps from impostors (issue 16 item 2) ---- */

static uint8_t *fake_body;
static size_t fake_len;

static kv_err impostor_kv(rpc_ctx *c, const uint8_t *body, size_t len)
{
    c->reply = malloc(fake_len);
    memcpy(c->reply, fake_body, fake_len);
    c->reply_len = fake_len;
    return rpc_fail(c, KV_FAILED_PRECONDITION, "stale map epoch (impostor)");
}

static kv_err impostor_get_map(rpc_ctx *c, const uint8_t *body, size_t len)
{
    Kv__GetMapReply rep = KV__GET_MAP_REPLY__INIT;
    rep.has_map = true;
    rep.map = kv__cluster_map__unpack(NULL, fake_len, fake_body);
    kv_err rv = rpc_reply_msg(c, &rep.base);
    kv__cluster_map__free_unpacked(rep.map, NULL);
    return rv;
}

/* The impostor answers pings, so the router's failure detector keeps it up
 * and sends it requests. */
static kv_err impostor_ping(rpc_ctx *c, const uint8_t *body, size_t len)
{
    Kv__PingReply rep = KV__PING_REPLY__INIT;
    rep.id = "n3";
    rep.role = "node";
    return rpc_reply_msg(c, &rep.base);
}

static const rpc_method impostor_methods[] = {
    {"admin.Ping", impostor_ping, .access = RPC_DATA},
    {"kv.Get", impostor_kv, .access = RPC_DATA},
    {"kv.Put", impostor_kv, .access = RPC_DATA},
    {"kv.Delete", impostor_kv, .access = RPC_DATA},
    {"kv.Batch", impostor_kv, .access = RPC_DATA},
    {"admin.GetMap", impostor_get_map, .access = RPC_DATA},
};

/* The map epoch url serves (admin.GetMap). */
static uint64_t map_epoch(const char *url)
{
    Kv__GetMapRequest req = KV__GET_MAP_REQUEST__INIT;
    rpc_reply r;
    char msg[300];
    cr_assert_eq(call_tls(url, ADMIN, NULL, false, "admin.GetMap", &req.base, msg, &r), KV_OK, "%s",
                 msg);
    Kv__GetMapReply *g = kv__get_map_reply__unpack(NULL, r.len, r.body);
    cr_assert(g && g->has_map);
    uint64_t e = g->map->epoch;
    kv__get_map_reply__free_unpacked(g, NULL);
    rpc_reply_free(&r);
    return e;
}

/* Makes the impostor's map: epoch, the impostor alone (as n3) at addr. */
static void fake_map(uint64_t epoch, const char *addr)
{
    char spec[128];
    snprintf(spec, sizeof(spec), "n3=%s", addr);
    char *specs[1] = {spec};
    cmap *m;
    char err[200];
    cr_assert_eq(cmap_parse_spec(epoch, 1, specs, 1, &m, err, sizeof(err)), KV_OK, "%s", err);
    free(fake_body);
    cr_assert_eq(cmap_encode(m, &fake_body, &fake_len), KV_OK);
    cmap_unref(m);
}

/* Writes keys through the router so some go to n3's address. */
static void write_some(int from, int n)
{
    kv_client *c;
    kv_client_opts o = {.auth = DATA, .timeout_ms = 3000};
    cr_assert_eq(kv_client_open(&c, cl.router_url, &o), KV_OK);
    for (int i = from; i < from + n; i++) {
        char k[32];
        snprintf(k, sizeof(k), "hijack%d", i);
        kv_put(c, k, strlen(k), "v", 1, NULL, NULL); /* n3's keys fail: the impostor */
    }
    kv_client_close(c);
}

/* Kills n3 and serves its address with the impostor (its map: fake_map
 * of epoch, the impostor alone at listed; NULL = at n3's own address). */
static rpc_server *impostor_at_n3(uint64_t epoch, const char *listed)
{
    kvt_kill_node(&cl, 2, SIGKILL);
    rpc_server *imp;
    rpc_server_opts so = {.url = cl.node_url[2],
                          .methods = impostor_methods,
                          .nmethods = sizeof(impostor_methods) / sizeof(impostor_methods[0]),
                          .workers = 2};
    char err[300];
    /* the address may take a moment to be free again */
    kv_err rv = KV_UNAVAILABLE;
    for (int i = 0; i < 100 && rv != KV_OK; i++, usleep(50000)) {
        fake_map(epoch, listed ? listed : cl.node_url[2]);
        rv = rpc_server_open(&imp, &so, err, sizeof(err));
    }
    cr_assert_eq(rv, KV_OK, "%s", err);
    return imp;
}

/* The router's admin.Stats figure name (0 when absent). */
static uint64_t router_stat(const char *name)
{
    Kv__StatsRequest st = KV__STATS_REQUEST__INIT;
    rpc_reply r;
    char msg[300];
    cr_assert_eq(call_tls(cl.router_url, ADMIN, NULL, false, "admin.Stats", &st.base, msg, &r),
                 KV_OK);
    Kv__StatsReply *sr = kv__stats_reply__unpack(NULL, r.len, r.body);
    uint64_t v = 0;
    for (size_t i = 0; sr && i < sr->n_stats; i++)
        if (strcmp(sr->stats[i]->name, name) == 0)
            v = strtoull(sr->stats[i]->value, NULL, 10);
    kv__stats_reply__free_unpacked(sr, NULL);
    rpc_reply_free(&r);
    return v;
}

static void impostor_stop(rpc_server *imp)
{
    rpc_server_close(imp);
    free(fake_body);
    fake_body = NULL;
}

/* Writes through the router until its maps_refused count passes `before`
 * (the impostor's map offered and refused), up to 30 s; the count. The
 * router sends n3's keys to the impostor only once its failure detector,
 * which saw n3 die, has pinged the impostor up again: on a busy host that
 * takes several probe periods. */
static uint64_t write_until_refused(uint64_t before)
{
    uint64_t seen = before;
    for (int i = 0; i < 30 && seen <= before; i++) {
        write_some(i * 60, 60);
        if ((seen = router_stat("maps_refused")) <= before)
            usleep(1000000);
    }
    return seen;
}

Test(security, impostor_maps_refused, .fini = teardown, .timeout = 300)
{
    start_tokens_cluster(3, 1);
    uint64_t epoch = map_epoch(cl.router_url);
    rpc_server *imp = impostor_at_n3(epoch + 1000, NULL); /* an absurd epoch jump */
    uint64_t refused = write_until_refused(0);
    cr_assert_gt(refused, 0, "the router counted its refusals");
    usleep(500000);
    cr_assert_eq(map_epoch(cl.router_url), epoch, "the router took the impostor's map");
    cr_assert_eq(map_epoch(cl.node_url[0]), epoch);
    /* a map that does not list the address it came from */
    char elsewhere[64];
    snprintf(elsewhere, sizeof(elsewhere), "tcp://127.0.0.1:%d", kvt_free_port());
    fake_map(epoch + 1, elsewhere);
    refused = router_stat("maps_refused");
    cr_assert_gt(write_until_refused(refused), refused, "the router counted the second refusal");
    usleep(500000);
    cr_assert_eq(map_epoch(cl.router_url), epoch, "the router took a map not listing its sender");
    impostor_stop(imp);
}

/* ---- signed maps (--map-key-file, $KV_MAP_KEY) ---- */

#define MAP_KEY "signed-maps-test-key-0123456789"

static void map_key_teardown(void)
{
    unsetenv("KV_MAP_KEY");
    teardown();
}

/* The map of url with epoch moved to epoch, without a mac, or signed with
 * key when given: a SetMap request's map (free with free_unpacked). */
static Kv__ClusterMap *map_at(const char *url, uint64_t epoch, const char *key)
{
    Kv__GetMapRequest req = KV__GET_MAP_REQUEST__INIT;
    rpc_reply r;
    char msg[300];
    cr_assert_eq(call_tls(url, ADMIN, NULL, false, "admin.GetMap", &req.base, msg, &r), KV_OK);
    Kv__GetMapReply *g = kv__get_map_reply__unpack(NULL, r.len, r.body);
    cr_assert(g && g->has_map && g->map);
    Kv__ClusterMap *pb = g->map;
    g->map = NULL;
    kv__get_map_reply__free_unpacked(g, NULL);
    rpc_reply_free(&r);
    pb->epoch = epoch;
    free(pb->mac.data);
    pb->mac = (ProtobufCBinaryData){0, NULL};
    if (key) {
        cmap *m;
        cr_assert_eq(cmap_from_pb(pb, &m, msg, sizeof(msg)), KV_OK, "%s", msg);
        cr_assert_eq(cmap_sign_pb(m, key, pb), KV_OK);
        cmap_unref(m);
    }
    return pb;
}

/* With a map key, only maps an admin holding the key made are installed:
 * neither the admin token alone (admin.SetMap) nor a plausible impostor
 * (listing itself, one epoch ahead: what plaintext clusters without a key
 * still accept) re-routes the cluster; kvctl with the key still can. */
Test(security, signed_maps_refuse_plaintext_impostors, .fini = map_key_teardown, .timeout = 300)
{
    setenv("KV_MAP_KEY", MAP_KEY, 1); /* every process of the cluster, and kvctl */
    start_tokens_cluster(3, 1);
    char out[8192], msg[300];
    cr_assert_eq(kvt_kvctl(&cl, "--json ring", out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "\"signature\":\"valid\""), "cluster init signed the map: %s", out);
    /* kvctl with the key changes the cluster */
    uint64_t e0 = map_epoch(cl.router_url);
    cr_assert_eq(kvt_kvctl(&cl, "node weight n1 2", out, sizeof(out)), 0, "%s", out);
    uint64_t epoch = map_epoch(cl.node_url[0]);
    cr_assert_geq(epoch, e0 + 2, "the reweight's transition and its completion");
    for (int i = 0; i < 100 && map_epoch(cl.router_url) < epoch; i++)
        usleep(100000);
    cr_assert_eq(map_epoch(cl.router_url), epoch, "the router follows signed maps");
    /* smart clients: with the key the map is taken and requests skip the
     * router; with another key no map is, and they all go through it */
    for (int wrong = 0; wrong < 2; wrong++) {
        kv_client *c;
        kv_client_opts o = {.auth = DATA,
                            .timeout_ms = 3000,
                            .direct = true,
                            .map_key = wrong ? "another-key-of-sixteen-bytes" : MAP_KEY};
        cr_assert_eq(kv_client_open(&c, cl.router_url, &o), KV_OK);
        /* the map is fetched in the background: with the right key, try
         * again (up to 10 s) until it is in use; with the wrong one, the
         * last round counts, at least 3 s after the open */
        uint64_t routed = 0, now = 0;
        for (int round = 0; round < 20; round++) {
            usleep(500000);
            routed = router_stat("requests");
            for (int i = 0; i < 30; i++) {
                char k[32];
                snprintf(k, sizeof(k), "smart%d", i);
                cr_assert_eq(kv_put(c, k, strlen(k), "v", 1, NULL, NULL), KV_OK, "%s",
                             kv_last_error());
            }
            now = router_stat("requests");
            if (wrong ? round >= 5 : now < routed + 30)
                break;
        }
        if (wrong)
            cr_assert_geq(now, routed + 30, "a wrongly signed map was used: %llu -> %llu",
                          (unsigned long long)routed, (unsigned long long)now);
        else
            cr_assert_lt(now, routed + 30, "the signed map was not used: %llu -> %llu",
                         (unsigned long long)routed, (unsigned long long)now);
        kv_client_close(c);
    }
    /* the admin token without the key: refused, whatever the epoch */
    Kv__SetMapRequest req = KV__SET_MAP_REQUEST__INIT;
    req.map = map_at(cl.node_url[0], epoch + 1, NULL);
    cr_assert_eq(call(cl.node_url[0], ADMIN, "admin.SetMap", &req.base, msg), KV_PERMISSION_DENIED,
                 "%s", msg);
    cr_assert(strstr(msg, "not signed"), "%s", msg);
    kv__cluster_map__free_unpacked(req.map, NULL);
    req.map = map_at(cl.node_url[0], epoch + 1, "another-key-of-sixteen-bytes");
    cr_assert_eq(call(cl.node_url[0], ADMIN, "admin.SetMap", &req.base, msg), KV_PERMISSION_DENIED,
                 "%s", msg);
    cr_assert(strstr(msg, "another map key"), "%s", msg);
    kv__cluster_map__free_unpacked(req.map, NULL);
    cr_assert_eq(map_epoch(cl.node_url[0]), epoch);
    /* the impostor the plausibility rules let through: itself, one epoch on */
    uint64_t refused = router_stat("maps_refused");
    rpc_server *imp = impostor_at_n3(epoch + 1, NULL);
    cr_assert_gt(write_until_refused(refused), refused, "the router counted its refusals");
    usleep(1500000); /* more than one of the nodes' and router's map refreshes */
    cr_assert_eq(map_epoch(cl.router_url), epoch, "the router took the impostor's map");
    cr_assert_eq(map_epoch(cl.node_url[0]), epoch, "n1 took the impostor's map");
    cr_assert_eq(map_epoch(cl.node_url[1]), epoch, "n2 took the impostor's map");
    impostor_stop(imp);
}

/* Turning signing on for a cluster made without a key: kvctl with the key
 * refuses to build on the unsigned map until kvctl cluster sign re-issues
 * it, one epoch later, signed. */
Test(security, cluster_sign_turns_signing_on, .fini = map_key_teardown, .timeout = 300)
{
    start_tokens_cluster(3, 1);       /* no key anywhere */
    setenv("KV_MAP_KEY", MAP_KEY, 1); /* kvctl from now on */
    char out[8192];
    cr_assert_eq(kvt_kvctl(&cl, "--json ring", out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "\"signature\":\"none\""), "%s", out);
    cr_assert_neq(kvt_kvctl(&cl, "node weight n1 2", out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "PERMISSION_DENIED") && strstr(out, "cluster sign"), "%s", out);
    uint64_t epoch = map_epoch(cl.node_url[0]);
    cr_assert_eq(kvt_kvctl(&cl, "cluster sign", out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "signed"), "%s", out);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(map_epoch(cl.node_url[i]), epoch + 1, "n%d has the signed map", i + 1);
    for (int i = 0; i < 100 && map_epoch(cl.router_url) < epoch + 1; i++)
        usleep(100000);
    cr_assert_eq(kvt_kvctl(&cl, "--json ring", out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "\"signature\":\"valid\""), "%s", out);
    cr_assert_eq(kvt_kvctl(&cl, "cluster sign", out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "already signed"), "%s", out);
    cr_assert_eq(kvt_kvctl(&cl, "node weight n1 2", out, sizeof(out)), 0, "%s", out);
    unsetenv("KV_MAP_KEY");
    cr_assert_neq(kvt_kvctl(&cl, "cluster sign", out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "map key"), "%s", out);
}

/* Without any authentication, admin.SetMap is open: at least it cannot
 * jump the epoch out of reach of later changes. */
Test(security, open_set_map_bounds_the_epoch_jump, .fini = teardown, .timeout = 120)
{
    cr_assert_eq(kvt_cluster_start(&cl, 1, 1, NULL), KV_OK, "logs in %s", cl.dir);
    uint64_t epoch = map_epoch(cl.node_url[0]);
    char spec[128], msg[300];
    snprintf(spec, sizeof(spec), "n1=%s", cl.node_url[0]);
    char *specs[1] = {spec};
    uint64_t tries[2] = {epoch + 1000, epoch + 1};
    kv_err want[2] = {KV_PERMISSION_DENIED, KV_OK};
    for (int i = 0; i < 2; i++) {
        cmap *m;
        cr_assert_eq(cmap_parse_spec(tries[i], 1, specs, 1, &m, msg, sizeof(msg)), KV_OK);
        Kv__SetMapRequest req = KV__SET_MAP_REQUEST__INIT;
        cr_assert_eq(cmap_to_pb(m, &req.map), KV_OK);
        cr_assert_eq(call(cl.node_url[0], NULL, "admin.SetMap", &req.base, msg), want[i], "%s",
                     msg);
        kv__cluster_map__free_unpacked(req.map, NULL);
        cmap_unref(m);
    }
    cr_assert_eq(map_epoch(cl.node_url[0]), epoch + 1);
}

/* ---- TLS ---- */

Test(security, tls_cluster_mutual_auth, .fini = teardown, .timeout = 300)
{
    char dir[] = "/tmp/hotkv-certs-XXXXXX";
    cr_assert(mkdtemp(dir));
    cr_assert(kvt_make_certs(dir), "openssl failed");
    kvt_sec = (kvt_security){.tls_dir = dir};
    cr_assert_eq(kvt_cluster_start(&cl, 3, 2, NULL), KV_OK, "logs in %s", cl.dir);
    cr_assert(strncmp(cl.router_url, "tls+tcp://", 10) == 0);
    /* kvctl over TLS: data and admin (its certificate is a cluster peer's) */
    char out[8192];
    cr_assert_eq(kvt_kvctl(&cl, "put tk tv", out, sizeof(out)), 0, "%s", out);
    cr_assert_eq(kvt_kvctl(&cl, "get tk", out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "tv"), "%s", out);
    cr_assert_eq(kvt_kvctl(&cl, "status", out, sizeof(out)), 0, "%s", out);
    /* the client library */
    char crt[300], key[300], ca[300], evil_crt[300], evil_key[300], evil_ca[300];
    snprintf(crt, sizeof(crt), "%s/peer.crt", dir);
    snprintf(key, sizeof(key), "%s/peer.key", dir);
    snprintf(ca, sizeof(ca), "%s/ca.crt", dir);
    snprintf(evil_crt, sizeof(evil_crt), "%s/evil.crt", dir);
    snprintf(evil_key, sizeof(evil_key), "%s/evil.key", dir);
    snprintf(evil_ca, sizeof(evil_ca), "%s/evil-ca.crt", dir);
    kv_client *c;
    kv_client_opts o = {.timeout_ms = 10000, .tls_cert = crt, .tls_key = key, .tls_ca = ca};
    cr_assert_eq(kv_client_open(&c, cl.router_url, &o), KV_OK, "%s", kv_last_error());
    cr_assert_eq(kv_put(c, "lib", 3, "ok", 2, NULL, NULL), KV_OK, "%s", kv_last_error());
    kv_client_close(c);
    /* kvbench over TLS (when the benchmarks are built) */
    if (access(kvt_bin("bench/kvbench/kvbench"), X_OK) == 0) {
        char cmd[2048];
        snprintf(cmd, sizeof(cmd),
                 "%s --router %s --tls-cert %s --tls-key %s --tls-ca %s --workload A --keys 100 "
                 "--load --seconds 1 --threads 1 --concurrency 2 --timeout-ms 10000 2>&1",
                 kvt_bin("bench/kvbench/kvbench"), cl.router_url, crt, key, ca);
        cr_assert_eq(kvt_run(cmd, out, sizeof(out)), 0, "%s", out);
    }
    /* plaintext to a TLS listener: no connection */
    const char *port = strrchr(cl.router_url, ':') + 1;
    char plain[64];
    snprintf(plain, sizeof(plain), "tcp://127.0.0.1:%s", port);
    char msg[300];
    Kv__PingRequest ping = KV__PING_REQUEST__INIT;
    rpc_tls good = {crt, key, ca, false}, no_cert = {NULL, NULL, ca, false},
            evil = {evil_crt, evil_key, ca, false}, wrong_ca = {crt, key, evil_ca, false};
    connect_wait_ms = 0; /* these never connect: 1 s each, not the deadline */
    cr_assert_eq(call_tls(plain, NULL, NULL, false, "admin.Ping", &ping.base, msg, NULL),
                 KV_UNAVAILABLE, "%s", msg);
    /* a certificate of another CA, no certificate, a server of another CA */
    const rpc_tls *refused[] = {&evil, &no_cert, &wrong_ca};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(
            call_tls(cl.router_url, NULL, refused[i], false, "admin.Ping", &ping.base, msg, NULL),
            KV_UNAVAILABLE, "case %d: %s", i, msg);
        cr_assert_eq(
            call_tls(cl.node_url[0], NULL, refused[i], false, "admin.Ping", &ping.base, msg, NULL),
            KV_UNAVAILABLE, "node, case %d: %s", i, msg);
    }
    connect_wait_ms = 10000;
    /* a verified certificate is an admin peer, and its replies are verified */
    Kv__StatsRequest st = KV__STATS_REQUEST__INIT;
    rpc_reply r;
    cr_assert_eq(call_tls(cl.node_url[0], NULL, &good, false, "admin.Stats", &st.base, msg, &r),
                 KV_OK, "%s", msg);
    cr_assert(r.verified);
    rpc_reply_free(&r);
    /* dialing tls+tcp:// needs a CA */
    rpc_chan *ch;
    rpc_chan_opts bad = {.tls = &(rpc_tls){crt, key, NULL, false}};
    cr_assert_eq(rpc_chan_open(&ch, cl.router_url, &bad), KV_INVALID_ARGUMENT);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    kvt_run(cmd, out, sizeof(out));
}

/* --tls-client-auth optional: clients without a certificate are served with
 * the tokens; a verified certificate is an admin peer without a token. */
Test(security, tls_optional_client_certificates, .fini = teardown, .timeout = 120)
{
    memset(&cl, 0, sizeof(cl));
    snprintf(cl.dir, sizeof(cl.dir), "/tmp/hotkv-test-XXXXXX");
    cr_assert(mkdtemp(cl.dir));
    cr_assert(kvt_make_certs(cl.dir), "openssl failed");
    kvt_sec = (kvt_security){.tls_dir = cl.dir};
    char url[64], crt[300], key[300], ca[300], msg[300];
    snprintf(url, sizeof(url), "tls+tcp://127.0.0.1:%d", kvt_free_port());
    snprintf(crt, sizeof(crt), "%s/peer.crt", cl.dir);
    snprintf(key, sizeof(key), "%s/peer.key", cl.dir);
    snprintf(ca, sizeof(ca), "%s/ca.crt", cl.dir);
    const char *extra[] = {"--tls-client-auth", "optional", "--auth", DATA,
                           "--admin-auth",      ADMIN,      NULL};
    pid_t pid = kvt_node_start(cl.dir, "opt", url, extra);
    cr_assert_gt(pid, 0, "logs in %s", cl.dir);
    cl.node_pid[0] = pid;
    cl.nnodes = 1;
    rpc_tls anon = {NULL, NULL, ca, false}, peer = {crt, key, ca, false};
    Kv__PingRequest ping = KV__PING_REQUEST__INIT;
    Kv__StatsRequest st = KV__STATS_REQUEST__INIT;
    cr_assert_eq(call_tls(url, DATA, &anon, false, "admin.Ping", &ping.base, msg, NULL), KV_OK,
                 "%s", msg);
    cr_assert_eq(call_tls(url, NULL, &anon, false, "admin.Ping", &ping.base, msg, NULL),
                 KV_UNAUTHENTICATED);
    cr_assert_eq(call_tls(url, DATA, &anon, false, "admin.Stats", &st.base, msg, NULL),
                 KV_PERMISSION_DENIED);
    cr_assert_eq(call_tls(url, ADMIN, &anon, false, "admin.Stats", &st.base, msg, NULL), KV_OK,
                 "%s", msg);
    cr_assert_eq(call_tls(url, NULL, &peer, false, "admin.Stats", &st.base, msg, NULL), KV_OK, "%s",
                 msg);
}
