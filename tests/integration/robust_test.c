/* SPDX-License-Identifier: MIT */
/*
 * Issue 16 against live processes: a 20 MB batch of 10M empty ops is
 * refused before it is unpacked (item 4: time and peak memory of the router
 * and the node); SIGTERM ends kvrouter and kvnode right after an overload
 * by kvbench killed mid-run (item 6); a batch op of unknown type,
 * ttl_ms 2^64 - 1 and deadline_ms >= 2^31 (item 7); concurrent admin.SetMap
 * calls leave the newest map persisted (item 10).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "harness.h"
#include "kv/kv.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"

static kvt_cluster cl;

/* Peak resident memory of pid (VmHWM, KiB), -1 if unknown. */
static long vm_hwm_kb(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "VmHWM: %ld kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb;
}

/* Sends env (packed) on a raw REQ socket and returns the reply's status
 * code and message (msg may be NULL); -1 when no reply came in 60 s. */
static int raw_call(const char *url, const Kv__Envelope *env, char *msg, size_t msglen)
{
    nng_socket s;
    cr_assert_eq(nng_req0_open(&s), 0);
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 60000);
    nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, 0);
    if (nng_dial(s, url, NULL, 0) != 0) {
        nng_close(s);
        return -1;
    }
    nng_msg *m;
    size_t n = kv__envelope__get_packed_size(env);
    cr_assert_eq(nng_msg_alloc(&m, n), 0);
    kv__envelope__pack(env, nng_msg_body(m));
    int code = -1;
    nng_msg *r = NULL;
    if (nng_sendmsg(s, m, 0) == 0 && nng_recvmsg(s, &r, 0) == 0) {
        Kv__Envelope *rep = kv__envelope__unpack(NULL, nng_msg_len(r), nng_msg_body(r));
        code = rep ? (rep->status ? rep->status->code : 0) : -2;
        if (msg)
            snprintf(msg, msglen, "%s",
                     rep && rep->status && rep->status->message ? rep->status->message : "");
        if (rep)
            kv__envelope__free_unpacked(rep, NULL);
        nng_msg_free(r);
    }
    nng_close(s);
    return code;
}

static void assert_get(const char *key, bool found)
{
    kv_client *c;
    cr_assert_eq(kv_client_open(&c, cl.router_url, NULL), KV_OK);
    kv_value v;
    kv_err rv = kv_get(c, key, strlen(key), &v);
    cr_assert_eq(rv, found ? KV_OK : KV_NOT_FOUND, "get %s: %s", key, kv_last_error());
    if (rv == KV_OK)
        kv_value_free(&v);
    kv_client_close(c);
}

/* ---- item 4 -------------------------------------------------------------- */

/* The router took 1.3 GB and 12 s, a node 1.3 GB and 21 s, to unpack such
 * a batch only to answer INVALID_ARGUMENT; the ops are now counted in the
 * wire format first. Limits: 10 s and 200 MB more peak memory (the message
 * itself is 20 MB, and it is copied once out of the envelope). */
Test(robust, twenty_megabytes_of_empty_ops_are_refused_before_unpacking, .timeout = 300)
{
    cr_assert_eq(kvt_cluster_start(&cl, 3, 2, NULL), KV_OK, "logs in %s", cl.dir);
    size_t nops = 10u * 1000 * 1000;
    uint8_t *body = malloc(2 * nops);
    for (size_t i = 0; i < nops; i++) { /* BatchRequest.ops (field 1), an empty Op */
        body[2 * i] = 0x0a;
        body[2 * i + 1] = 0x00;
    }
    struct {
        const char *url;
        pid_t pid;
        bool coordinate;
    } targets[] = {{cl.router_url, cl.router_pid, false},
                   {cl.node_url[0], cl.node_pid[0], false},
                   {cl.node_url[1], cl.node_pid[1], true}};
    for (int t = 0; t < 3; t++) {
        long before = vm_hwm_kb(targets[t].pid);
        cr_assert_gt(before, 0);
        Kv__Envelope env = KV__ENVELOPE__INIT;
        env.id = 1;
        env.method = "kv.Batch";
        env.deadline_ms = 60000;
        env.coordinate = targets[t].coordinate;
        env.body = (ProtobufCBinaryData){2 * nops, body};
        char msg[300];
        uint64_t t0 = kv_now_ns();
        int code = raw_call(targets[t].url, &env, msg, sizeof(msg));
        uint64_t ms = (kv_now_ns() - t0) / 1000000;
        long grew = vm_hwm_kb(targets[t].pid) - before;
        cr_log_info("target %d: %d (%s) in %llu ms, peak memory +%ld KiB", t, code, msg,
                    (unsigned long long)ms, grew);
        cr_assert_eq(code, KV_INVALID_ARGUMENT, "target %d: %d %s", t, code, msg);
        cr_assert(strstr(msg, "max-batch-ops") != NULL, "%s", msg);
        cr_assert_lt(ms, 10000, "target %d refused it in %llu ms", t, (unsigned long long)ms);
        cr_assert_lt(grew, 200 * 1024, "target %d: peak memory grew by %ld KiB", t, grew);
    }
    free(body);
    assert_get("nothing", false); /* still serving */
    kvt_cluster_stop(&cl);
}

/* ---- item 7 -------------------------------------------------------------- */

static int batch_call(const char *url, const Kv__BatchRequest *req, char *msg, size_t msglen)
{
    size_t n = kv__batch_request__get_packed_size(req);
    uint8_t *b = malloc(n ? n : 1);
    kv__batch_request__pack(req, b);
    Kv__Envelope env = KV__ENVELOPE__INIT;
    env.id = 2;
    env.method = "kv.Batch";
    env.deadline_ms = 10000;
    env.body = (ProtobufCBinaryData){n, b};
    int code = raw_call(url, &env, msg, msglen);
    free(b);
    return code;
}

/* An op of type 99 used to run as a PUT; the batch is refused whole. */
Test(robust, a_batch_op_of_unknown_type_is_refused, .timeout = 120)
{
    cr_assert_eq(kvt_cluster_start(&cl, 3, 3, NULL), KV_OK, "logs in %s", cl.dir);
    Kv__Op ops[2] = {KV__OP__INIT, KV__OP__INIT}, *ptrs[2] = {&ops[0], &ops[1]};
    ops[0].type = KV__OP_TYPE__PUT;
    ops[0].key = (ProtobufCBinaryData){2, (uint8_t *)"ok"};
    ops[0].value = (ProtobufCBinaryData){1, (uint8_t *)"v"};
    ops[1].type = (Kv__OpType)99;
    ops[1].key = (ProtobufCBinaryData){3, (uint8_t *)"t99"};
    ops[1].value = (ProtobufCBinaryData){1, (uint8_t *)"v"};
    Kv__BatchRequest req = KV__BATCH_REQUEST__INIT;
    req.n_ops = 2;
    req.ops = ptrs;
    const char *urls[] = {cl.router_url, cl.node_url[0]};
    for (int t = 0; t < 2; t++) {
        char msg[300];
        int code = batch_call(urls[t], &req, msg, sizeof(msg));
        cr_assert_eq(code, KV_INVALID_ARGUMENT, "%s: %d %s", urls[t], code, msg);
        cr_assert(strstr(msg, "op 1") && strstr(msg, "99"), "%s", msg);
    }
    assert_get("t99", false);
    assert_get("ok", false); /* refused whole */
    kvt_cluster_stop(&cl);
}

/* ttl_ms 2^64 - 1 is refused by the router itself (its hints compute now +
 * ttl), in puts and batches; deadline_ms >= 2^31 no longer becomes a
 * negative nng duration in the router's forwards (the client got
 * UNAVAILABLE for a write that was applied): it is acknowledged. */
Test(robust, ttl_and_deadline_edges, .timeout = 120)
{
    cr_assert_eq(kvt_cluster_start(&cl, 3, 2, NULL), KV_OK, "logs in %s", cl.dir);
    Kv__PutRequest put = KV__PUT_REQUEST__INIT;
    put.key = (ProtobufCBinaryData){3, (uint8_t *)"ttl"};
    put.value = (ProtobufCBinaryData){1, (uint8_t *)"v"};
    put.ttl_ms = UINT64_MAX;
    uint8_t b[64];
    Kv__Envelope env = KV__ENVELOPE__INIT;
    env.id = 3;
    env.method = "kv.Put";
    env.deadline_ms = 10000;
    env.body = (ProtobufCBinaryData){kv__put_request__pack(&put, b), b};
    char msg[300];
    int code = raw_call(cl.router_url, &env, msg, sizeof(msg));
    cr_assert_eq(code, KV_INVALID_ARGUMENT, "%d %s", code, msg);
    cr_assert(strstr(msg, "ttl") != NULL, "%s", msg);
    assert_get("ttl", false);
    Kv__Op op = KV__OP__INIT, *ops = &op;
    op.type = KV__OP_TYPE__PUT;
    op.key = (ProtobufCBinaryData){4, (uint8_t *)"ttl2"};
    op.ttl_ms = UINT64_MAX;
    Kv__BatchRequest req = KV__BATCH_REQUEST__INIT;
    req.n_ops = 1;
    req.ops = &ops;
    code = batch_call(cl.router_url, &req, msg, sizeof(msg));
    cr_assert_eq(code, KV_INVALID_ARGUMENT, "%d %s", code, msg);
    assert_get("ttl2", false);

    uint32_t huge[] = {0x80000000u, 0x80000010u, 0xffffffffu};
    for (int i = 0; i < 3; i++) {
        char key[16];
        snprintf(key, sizeof(key), "dl%d", i);
        put.key = (ProtobufCBinaryData){strlen(key), (uint8_t *)key};
        put.ttl_ms = 0;
        env.body = (ProtobufCBinaryData){kv__put_request__pack(&put, b), b};
        env.deadline_ms = huge[i];
        code = raw_call(cl.router_url, &env, msg, sizeof(msg));
        cr_assert_eq(code, KV_OK, "deadline_ms %u: %d %s", huge[i], code, msg);
        assert_get(key, true);
    }
    kvt_cluster_stop(&cl);
}

/* ---- item 10 ------------------------------------------------------------- */

typedef struct setmap_arg {
    const char *url;
    const uint8_t *map; /* the node's map, packed ClusterMap */
    size_t len;
    uint64_t first;
    int n, stride;
} setmap_arg;

static void *setmap_thread(void *p)
{
    setmap_arg *a = p;
    rpc_chan *ch;
    if (rpc_chan_open(&ch, a->url, NULL) != KV_OK)
        return NULL;
    Kv__ClusterMap *m = kv__cluster_map__unpack(NULL, a->len, a->map);
    for (int i = 0; i < a->n && m; i++) {
        m->epoch = a->first + (uint64_t)i * (uint64_t)a->stride;
        Kv__SetMapRequest req = KV__SET_MAP_REQUEST__INIT;
        req.map = m;
        rpc_reply r;
        rpc_call(ch, "admin.SetMap", 0, &req.base, 10000, &r); /* older epochs are refused */
        rpc_reply_free(&r);
    }
    if (m)
        kv__cluster_map__free_unpacked(m, NULL);
    rpc_chan_close(ch);
    return NULL;
}

static uint64_t node_epoch(const char *url)
{
    rpc_chan *ch;
    cr_assert_eq(rpc_chan_open(&ch, url, NULL), KV_OK);
    Kv__PingRequest req = KV__PING_REQUEST__INIT;
    rpc_reply r;
    cr_assert_eq(rpc_call_retry(ch, "admin.Ping", 0, &req.base, 10000, &r), KV_OK);
    Kv__PingReply *p = kv__ping_reply__unpack(NULL, r.len, r.body);
    uint64_t e = p ? p->map_epoch : 0;
    if (p)
        kv__ping_reply__free_unpacked(p, NULL);
    rpc_reply_free(&r);
    rpc_chan_close(ch);
    return e;
}

/* Concurrent admin.SetMap calls with interleaved epochs: each install is a
 * compare-and-set under the node's map lock, persisted before it is
 * installed (tmp, fsync, rename, fsync of the directory), so the node ends
 * with the newest map, in memory and on disk after a restart. */
Test(robust, concurrent_set_maps_keep_the_newest_epoch, .timeout = 180)
{
    cr_assert_eq(kvt_cluster_start(&cl, 1, 1, NULL), KV_OK, "logs in %s", cl.dir);
    rpc_chan *ch;
    cr_assert_eq(rpc_chan_open(&ch, cl.node_url[0], NULL), KV_OK);
    Kv__GetMapRequest gm = KV__GET_MAP_REQUEST__INIT;
    rpc_reply r;
    cr_assert_eq(rpc_call_retry(ch, "admin.GetMap", 0, &gm.base, 10000, &r), KV_OK);
    Kv__GetMapReply *g = kv__get_map_reply__unpack(NULL, r.len, r.body);
    cr_assert(g && g->has_map);
    size_t len = kv__cluster_map__get_packed_size(g->map);
    uint8_t *map = malloc(len);
    kv__cluster_map__pack(g->map, map);
    kv__get_map_reply__free_unpacked(g, NULL);
    rpc_reply_free(&r);
    rpc_chan_close(ch);
    enum { T = 8, N = 25 };
    pthread_t th[T];
    setmap_arg a[T];
    for (int t = 0; t < T; t++) { /* thread t sends epochs 2 + t, 2 + t + T, ... */
        a[t] = (setmap_arg){cl.node_url[0], map, len, 2 + (uint64_t)t, N, T};
        pthread_create(&th[t], NULL, setmap_thread, &a[t]);
    }
    for (int t = 0; t < T; t++)
        pthread_join(th[t], NULL);
    uint64_t newest = 2 + (uint64_t)(N - 1) * T + (T - 1);
    cr_assert_eq(node_epoch(cl.node_url[0]), newest);
    kvt_kill_node(&cl, 0, SIGTERM);
    cr_assert_eq(kvt_node_restart(&cl, 0), KV_OK);
    cr_assert_eq(node_epoch(cl.node_url[0]), newest, "the persisted map is the newest");
    free(map);
    kvt_cluster_stop(&cl);
}

/* ---- item 6 -------------------------------------------------------------- */

/* Waits up to ms for pid to exit; true when it did, with status 0. */
static bool exits_within(pid_t pid, int ms, int *status)
{
    for (int i = 0; i < ms / 20; i++) {
        pid_t w = waitpid(pid, status, WNOHANG);
        if (w == pid) {
            kvt_forget(pid);
            return true;
        }
        usleep(20000);
    }
    return false;
}

/* Starts kvbench through the router, 4 x 1000 in flight with 200 ms
 * deadlines, for 3 s; returns its pid. In a process of its own: the nng
 * defect a vanishing client provokes would stall this process's own sockets
 * (Criterion talks to its workers over nng). */
static pid_t kvbench_start(const char *router_url)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s", kvt_bin("bench/kvbench/kvbench"));
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(path, path, "--router", router_url, "--workload", "A", "--dist", "uniform", "--keys",
              "10000", "--threads", "4", "--concurrency", "1000", "--timeout-ms", "200",
              "--seconds", "30", "--report-top", "0", (char *)NULL);
        _exit(127);
    }
    cr_assert_gt(pid, 0);
    sleep(3);
    return pid;
}

/* SIGKILL: a client vanishing with requests in flight. */
static void kvbench_kill(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* kvnode and kvrouter sometimes never exited on SIGTERM after an overload:
 * nng's pipe reaper blocked for good when a client went away mid-request,
 * and nng_close waited for it (proto/rpc_util.c). Every process must now
 * exit within 20 s, cleanly: after an overload whose client vanished
 * (rounds 0 and 1), and during one (round 2: kvbench goes after). */
Test(robust, sigterm_after_overload_exits, .timeout = 400)
{
    if (access(kvt_bin("bench/kvbench/kvbench"), X_OK) != 0)
        cr_skip_test("kvbench is not built (KV_BUILD_BENCH=OFF)");
    for (int round = 0; round < 3; round++) {
        cr_assert_eq(kvt_cluster_start(&cl, 3, 3, NULL), KV_OK, "logs in %s", cl.dir);
        pid_t bench = kvbench_start(cl.router_url);
        if (round < 2)
            kvbench_kill(bench);
        pid_t pids[1 + KVT_MAX_NODES];
        int np = 0;
        pids[np++] = cl.router_pid;
        for (int i = 0; i < cl.nnodes; i++)
            pids[np++] = cl.node_pid[i];
        for (int i = 0; i < np; i++)
            kill(pids[i], SIGTERM);
        for (int i = 0; i < np; i++) {
            int st = 0;
            bool gone = exits_within(pids[i], 20000, &st);
            if (!gone) {
                kill(pids[i], SIGKILL);
                waitpid(pids[i], NULL, 0);
                kvt_forget(pids[i]);
            }
            cr_assert(gone, "round %d: %s did not exit 20 s after SIGTERM (logs in %s)", round,
                      i ? "a node" : "the router", cl.dir);
            cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "round %d: exit status %d", round, st);
        }
        if (round == 2)
            kvbench_kill(bench);
        cl.router_pid = 0;
        for (int i = 0; i < cl.nnodes; i++)
            cl.node_pid[i] = 0;
        kvt_cluster_stop(&cl);
    }
}
