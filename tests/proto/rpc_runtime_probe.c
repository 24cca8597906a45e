/* SPDX-License-Identifier: MIT */
/* rpc_runtime_test's helper: a process of its own that initialises nng with
 * rpc_runtime_init(argv[1]) before anything else uses nng (a Criterion
 * worker cannot: Criterion's nanomsg calls reach nng's compatibility layer
 * and initialise it first). Prints "threads T cpus C sysconf S" and, with
 * "chain" as argv[2], runs CHAINS chains of LINKS calls between a server
 * and a channel of this process (each completion starts the next call)
 * and prints "chains D ok K". */
#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include "common/clock.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"

static kv_err h_echo(rpc_ctx *c, const uint8_t *body, size_t len)
{
    Kv__GetRequest *req = kv__get_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "bad GetRequest");
    Kv__GetReply rep = KV__GET_REPLY__INIT;
    rep.found = true;
    rep.value = req->key;
    kv_err rv = rpc_reply_msg(c, &rep.base);
    kv__get_request__free_unpacked(req, NULL);
    return rv;
}

/* A chain of calls: each completion starts the next one until `left` is 0. */
#define CHAINS 64
#define LINKS 20
typedef struct chain {
    rpc_chan *ch;
    int left;
    atomic_int *ok, *done;
} chain;

static void chain_done(void *arg, rpc_reply *r)
{
    chain *c = arg;
    if (r->status == KV_OK)
        atomic_fetch_add(c->ok, 1);
    rpc_reply_free(r);
    if (--c->left > 0) {
        Kv__GetRequest req = KV__GET_REQUEST__INIT;
        req.key.data = (uint8_t *)"k";
        req.key.len = 1;
        rpc_call_async(c->ch, "test.Echo", 0, &req.base, 5000, chain_done, c);
        return;
    }
    atomic_fetch_add(c->done, 1);
}

static int run_chains(void)
{
    static const rpc_method methods[] = {{"test.Echo", h_echo}};
    rpc_server_opts o = {
        .url = "tcp://127.0.0.1:0", .methods = methods, .nmethods = 1, .workers = 1};
    rpc_server *s = NULL;
    char err[256], url[64];
    if (rpc_server_open(&s, &o, err, sizeof(err)) != KV_OK) {
        fprintf(stderr, "server: %s\n", err);
        return 1;
    }
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", rpc_server_port(s));
    rpc_chan *ch = NULL;
    if (rpc_chan_open(&ch, url, NULL) != KV_OK)
        return 1;
    atomic_int ok = 0, done = 0;
    chain chains[CHAINS];
    rpc_burst_begin();
    for (int i = 0; i < CHAINS; i++) {
        chains[i] = (chain){ch, LINKS, &ok, &done};
        Kv__GetRequest req = KV__GET_REQUEST__INIT;
        req.key.data = (uint8_t *)"k";
        req.key.len = 1;
        rpc_call_async(ch, "test.Echo", 0, &req.base, 5000, chain_done, &chains[i]);
    }
    rpc_burst_end();
    uint64_t end = kv_now_ns() + 20ull * 1000000000ull;
    while (atomic_load(&done) < CHAINS && kv_now_ns() < end)
        nng_msleep(5);
    printf("chains %d ok %d\n", atomic_load(&done), atomic_load(&ok));
    if (atomic_load(&done) < CHAINS)
        return 1; /* calls still in flight: do not close under them */
    rpc_chan_close(ch);
    rpc_server_close(s);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    if (rpc_runtime_init((unsigned)atoi(argv[1])) != KV_OK)
        return 1;
    /* nng's threads name themselves once they run: count until both counts
     * have stayed the same for 1 s (a thread of a loaded host can take
     * longer than one sample to get there), at most 15 s */
    unsigned n = rpc_runtime_task_threads(), e = rpc_runtime_count_threads("nng:aio:expire");
    for (int i = 0, same = 0; i < 300 && same < 20; i++) {
        nng_msleep(50);
        unsigned n2 = rpc_runtime_task_threads(), e2 = rpc_runtime_count_threads("nng:aio:expire");
        same = n2 == n && e2 == e ? same + 1 : 0;
        n = n2;
        e = e2;
    }
    printf("sizes %d\n", rpc_runtime_sizes_threads());
    printf("expire %u\n", e);
    printf("threads %u cpus %d sysconf %ld\n", n, get_nprocs(), sysconf(_SC_NPROCESSORS_ONLN));
    fflush(stdout);
    return argc > 2 && strcmp(argv[2], "chain") == 0 ? run_chains() : 0;
}
