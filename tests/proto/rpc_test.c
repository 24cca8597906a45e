/* SPDX-License-Identifier: MIT */
/* RPC runtime tests: dispatch, deadlines, auth, malformed input, oversize
 * requests and an unreachable peer, each followed by a call that must work;
 * calls coalesced into rpc.Calls messages (their own replies, statuses and
 * deadlines, from many threads at once); the coordinate lane; the channel
 * pool. Labelled tsan: the server's lanes and the channel's queue run under
 * ThreadSanitizer. */
#include "tests/kv_testfw.h"
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>
#include <pthread.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"
#include "proto/rpc_loop.h"
#include "proto/rpc_tls.h"

static kv_err h_echo(rpc_ctx *c, const uint8_t *body, size_t len)
{
    Kv__GetRequest *req = kv__get_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "bad GetRequest");
    Kv__GetReply rep = KV__GET_REPLY__INIT;
    rep.found = true;
    rep.value = req->key;
    rep.version = c->map_epoch;
    c->reply_epoch = 42;
    kv_err rv = rpc_reply_msg(c, &rep.base);
    kv__get_request__free_unpacked(req, NULL);
    return rv;
}

static kv_err h_slow(rpc_ctx *c, const uint8_t *body, size_t len)
{
    nng_msleep(300);
    return KV_OK;
}

/* Longer than any deadline the tests give it, by seconds: a call that
 * returns before it proves the deadline ended it, with room for a slow
 * scheduler (TSan on a loaded host). */
#define SLOWER_MS 3000
static kv_err h_slower(rpc_ctx *c, const uint8_t *body, size_t len)
{
    nng_msleep(SLOWER_MS);
    return KV_OK;
}

static kv_err h_fail(rpc_ctx *c, const uint8_t *body, size_t len)
{
    return rpc_fail(c, KV_ALREADY_EXISTS, "refused by the handler");
}

static rpc_server *g_server; /* for h_call_back */
static char g_url[64];

/* A coordinate call that waits for a plain call to the same server, as a
 * coordinating node waits for its peers' replica calls. */
static kv_err h_call_back(rpc_ctx *c, const uint8_t *body, size_t len)
{
    rpc_chan *ch;
    if (rpc_chan_open(&ch, g_url, NULL) != KV_OK)
        return KV_INTERNAL;
    Kv__GetRequest req = KV__GET_REQUEST__INIT;
    req.key = (ProtobufCBinaryData){2, (uint8_t *)"cb"};
    rpc_reply r;
    kv_err rv = rpc_call(ch, "test.Echo", 3, &req.base, rpc_ctx_remaining_ms(c), &r);
    if (rv == KV_OK) {
        c->reply = r.body;
        c->reply_len = r.len;
        r.body = NULL;
    }
    rpc_reply_free(&r);
    rpc_chan_close(ch);
    return rv;
}

static const rpc_method methods[] = {{"test.Echo", h_echo},
                                     {"test.Slow", h_slow},
                                     {"test.Fail", h_fail},
                                     {"test.CallBack", h_call_back},
                                     {"test.Slower", h_slower}};

static rpc_server *start(const char *auth, char *url, size_t urllen)
{
    rpc_server_opts o = {
        .url = "tcp://127.0.0.1:0", .methods = methods, .nmethods = 5, .workers = 4, .auth = auth};
    rpc_server *s = NULL;
    char err[256];
    kv_err rv = rpc_server_open(&s, &o, err, sizeof(err));
    cr_assert_eq(rv, KV_OK, "%s", err);
    snprintf(url, urllen, "tcp://127.0.0.1:%d", rpc_server_port(s));
    return s;
}

static kv_err echo(rpc_chan *ch, const char *key, uint32_t dl, char *out, size_t outlen)
{
    Kv__GetRequest req = KV__GET_REQUEST__INIT;
    req.key.data = (uint8_t *)key;
    req.key.len = strlen(key);
    rpc_reply r;
    kv_err rv = rpc_call(ch, "test.Echo", 7, &req.base, dl, &r);
    if (rv == KV_OK) {
        Kv__GetReply *g = kv__get_reply__unpack(NULL, r.len, r.body);
        cr_assert_not_null(g);
        cr_assert_eq(g->version, 7, "map_epoch reaches the handler");
        cr_assert_eq(r.map_epoch, 42, "reply carries the server's epoch");
        snprintf(out, outlen, "%.*s", (int)g->value.len, (char *)g->value.data);
        kv__get_reply__free_unpacked(g, NULL);
    }
    rpc_reply_free(&r);
    return rv;
}

Test(rpc, round_trip_and_unknown_method)
{
    char url[64], out[64];
    rpc_server *s = start(NULL, url, sizeof(url));
    rpc_chan *ch;
    cr_assert_eq(rpc_chan_open(&ch, url, NULL), KV_OK);
    cr_assert_eq(echo(ch, "hello", 2000, out, sizeof(out)), KV_OK);
    cr_assert_str_eq(out, "hello");
    rpc_reply r;
    cr_assert_eq(rpc_call(ch, "test.Nope", 0, NULL, 2000, &r), KV_UNIMPLEMENTED);
    cr_assert(r.message && strstr(r.message, "test.Nope"), "message names the method");
    rpc_reply_free(&r);
    cr_assert_eq(echo(ch, "again", 2000, out, sizeof(out)), KV_OK);
    rpc_chan_close(ch);
    rpc_server_close(s);
}

Test(rpc, deadline_exceeded_then_next_call_works)
{
    char url[64], out[64];
    rpc_server *s = start(NULL, url, sizeof(url));
    rpc_chan *ch;
    cr_assert_eq(rpc_chan_open(&ch, url, NULL), KV_OK);
    /* connected first: a call that times out with no connection up yet is
     * UNAVAILABLE, not DEADLINE_EXCEEDED (the dial is asynchronous) */
    cr_assert_eq(echo(ch, "up", 2000, out, sizeof(out)), KV_OK);
    rpc_reply r;
    uint64_t t0 = kv_now_ns();
    cr_assert_eq(rpc_call(ch, "test.Slower", 0, NULL, 100, &r), KV_DEADLINE_EXCEEDED);
    uint64_t ms = (kv_now_ns() - t0) / 1000000;
    cr_assert_lt(ms, SLOWER_MS - 1000, "the call returned at its deadline, not after the handler");
    rpc_reply_free(&r);
    /* The server enforces it too: the late handler's reply is DEADLINE_EXCEEDED. */
    cr_assert_eq(echo(ch, "x", 2000, out, sizeof(out)), KV_OK);
    rpc_chan_close(ch);
    rpc_server_close(s);
}

Test(rpc, auth_token_checked)
{
    char url[64], out[64];
    rpc_server *s = start("sesame", url, sizeof(url));
    rpc_chan *bad, *good;
    rpc_chan_opts wrong = {.auth = "wrong"}, right = {.auth = "sesame"};
    cr_assert_eq(rpc_chan_open(&bad, url, &wrong), KV_OK);
    cr_assert_eq(rpc_chan_open(&good, url, &right), KV_OK);
    cr_assert_eq(echo(bad, "k", 2000, out, sizeof(out)), KV_UNAUTHENTICATED);
    cr_assert_eq(echo(good, "k", 2000, out, sizeof(out)), KV_OK);
    rpc_chan_close(bad);
    rpc_chan_close(good);
    rpc_server_close(s);
}

static kv_err h_whoami(rpc_ctx *c, const uint8_t *body, size_t len)
{
    return rpc_fail(c, KV_OK, "%s%s", c->admin ? "admin" : "data",
                    c->anonymous ? " anonymous" : "");
}

static const rpc_method access_methods[] = {{"test.Data", h_whoami, .access = RPC_DATA},
                                            {"test.Admin", h_whoami}};

/* Status of method called with token on a server with data/admin tokens;
 * its message in msg. */
static kv_err access_call(const char *data, const char *admin, const char *token,
                          const char *method, char *msg, size_t msglen)
{
    rpc_server_opts o = {.url = "tcp://127.0.0.1:0",
                         .methods = access_methods,
                         .nmethods = 2,
                         .workers = 2,
                         .auth = data,
                         .admin_auth = admin};
    rpc_server *s;
    char err[256], url[64];
    cr_assert_eq(rpc_server_open(&s, &o, err, sizeof(err)), KV_OK, "%s", err);
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", rpc_server_port(s));
    rpc_chan *ch;
    rpc_chan_opts co = {.auth = token};
    cr_assert_eq(rpc_chan_open(&ch, url, &co), KV_OK);
    rpc_reply r;
    kv_err rv = rpc_call(ch, method, 0, NULL, 5000, &r);
    snprintf(msg, msglen, "%s", r.message ? r.message : "");
    rpc_reply_free(&r);
    rpc_chan_close(ch);
    rpc_server_close(s);
    return rv;
}

/* The access rules of rpc.h: data and admin tokens, one shared token, no
 * token at all. */
Test(rpc, data_and_admin_tokens)
{
    char m[256];
    /* two tokens */
    cr_assert_eq(access_call("d", "a", "d", "test.Data", m, sizeof(m)), KV_OK);
    cr_assert_str_eq(m, "data");
    cr_assert_eq(access_call("d", "a", "d", "test.Admin", m, sizeof(m)), KV_PERMISSION_DENIED);
    cr_assert(strstr(m, "test.Admin needs admin credentials"), "%s", m);
    cr_assert_eq(access_call("d", "a", "a", "test.Admin", m, sizeof(m)), KV_OK);
    cr_assert_str_eq(m, "admin");
    cr_assert_eq(access_call("d", "a", "a", "test.Data", m, sizeof(m)), KV_OK);
    cr_assert_eq(access_call("d", "a", "x", "test.Data", m, sizeof(m)), KV_UNAUTHENTICATED);
    cr_assert_eq(access_call("d", "a", NULL, "test.Data", m, sizeof(m)), KV_UNAUTHENTICATED);
    cr_assert_eq(access_call("d", "a", "dd", "test.Data", m, sizeof(m)), KV_UNAUTHENTICATED);
    cr_assert_eq(access_call("dd", "a", "d", "test.Data", m, sizeof(m)), KV_UNAUTHENTICATED);
    /* admin token only: data methods open, admin ones need the token */
    cr_assert_eq(access_call(NULL, "a", NULL, "test.Data", m, sizeof(m)), KV_OK);
    cr_assert_eq(access_call(NULL, "a", NULL, "test.Admin", m, sizeof(m)), KV_PERMISSION_DENIED);
    cr_assert_eq(access_call(NULL, "a", "x", "test.Data", m, sizeof(m)), KV_UNAUTHENTICATED);
    /* one shared token: it is the admin token too */
    cr_assert_eq(access_call("d", NULL, "d", "test.Admin", m, sizeof(m)), KV_OK);
    cr_assert_eq(access_call("d", NULL, "x", "test.Admin", m, sizeof(m)), KV_UNAUTHENTICATED);
    /* authentication off: everyone is an anonymous admin, tokens ignored */
    cr_assert_eq(access_call(NULL, NULL, "x", "test.Admin", m, sizeof(m)), KV_OK);
    cr_assert_str_eq(m, "admin anonymous");
}

Test(rpc, token_comparison_covers_the_full_length)
{
    cr_assert(rpc_token_eq("sesame", 6, "sesame"));
    cr_assert_not(rpc_token_eq("sesame\0x", 8, "sesame"), "a NUL ended the comparison");
    cr_assert_not(rpc_token_eq("sesam", 5, "sesame"));
    cr_assert_not(rpc_token_eq("sesamf", 6, "sesame"));
    cr_assert_not(rpc_token_eq("", 0, "sesame"));
    cr_assert(rpc_token_eq("", 0, ""));
}

/* Raw REQ socket sending garbage: the server answers INVALID_ARGUMENT and
 * keeps serving on the same connection. */
Test(rpc, malformed_input_gets_invalid_argument)
{
    char url[64];
    rpc_server *s = start(NULL, url, sizeof(url));
    nng_socket sock;
    cr_assert_eq(nng_req0_open(&sock), 0);
    nng_socket_set_ms(sock, NNG_OPT_RECVTIMEO, 2000);
    cr_assert_eq(nng_dial(sock, url, NULL, 0), 0);
    const char *junk[] = {"\xff\xff\xff\xff\xff",
                          "\x0a\x05"
                          "ab",
                          "garbage bytes \x01\x02"};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(nng_send(sock, (void *)junk[i], strlen(junk[i]), 0), 0);
        char *buf = NULL;
        size_t len = 0;
        cr_assert_eq(nng_recv(sock, &buf, &len, NNG_FLAG_ALLOC), 0);
        Kv__Envelope *env = kv__envelope__unpack(NULL, len, (uint8_t *)buf);
        cr_assert_not_null(env);
        cr_assert_eq(env->status->code, KV_INVALID_ARGUMENT, "junk %d", i);
        kv__envelope__free_unpacked(env, NULL);
        nng_free(buf, len);
    }
    /* A valid envelope whose body is garbage reaches the handler, which rejects it. */
    Kv__Envelope env = KV__ENVELOPE__INIT;
    env.id = 9;
    env.method = "test.Echo";
    env.body.data = (uint8_t *)"\xff\xff";
    env.body.len = 2;
    uint8_t pk[64];
    size_t n = kv__envelope__pack(&env, pk);
    cr_assert_eq(nng_send(sock, pk, n, 0), 0);
    char *buf = NULL;
    size_t len = 0;
    cr_assert_eq(nng_recv(sock, &buf, &len, NNG_FLAG_ALLOC), 0);
    Kv__Envelope *rep = kv__envelope__unpack(NULL, len, (uint8_t *)buf);
    cr_assert_eq(rep->status->code, KV_INVALID_ARGUMENT);
    cr_assert_eq(rep->id, 9);
    kv__envelope__free_unpacked(rep, NULL);
    nng_free(buf, len);
    nng_close(sock);
    rpc_chan *ch;
    char out[16];
    cr_assert_eq(rpc_chan_open(&ch, url, NULL), KV_OK);
    cr_assert_eq(echo(ch, "ok", 2000, out, sizeof(out)), KV_OK);
    rpc_chan_close(ch);
    rpc_server_close(s);
}

Test(rpc, unreachable_peer_is_unavailable_within_deadline)
{
    rpc_chan *ch;
    cr_assert_eq(rpc_chan_open(&ch, "tcp://127.0.0.1:1", NULL), KV_OK);
    char out[16];
    uint64_t t0 = kv_now_ns();
    cr_assert_eq(echo(ch, "k", 1500, out, sizeof(out)), KV_UNAVAILABLE);
    cr_assert_lt((kv_now_ns() - t0) / 1000000, 1600);
    rpc_chan_close(ch);
    cr_assert_eq(rpc_chan_open(&ch, "not a url", NULL), KV_INVALID_ARGUMENT);
}

Test(rpc, oversize_request_rejected_before_the_wire)
{
    char url[64], out[16];
    rpc_server *s = start(NULL, url, sizeof(url));
    rpc_chan *ch;
    rpc_chan_opts o = {.recv_max = 4u << 20};
    cr_assert_eq(rpc_chan_open(&ch, url, &o), KV_OK);
    size_t big = 5u << 20;
    char *key = malloc(big + 1);
    memset(key, 'a', big);
    key[big] = 0;
    cr_assert_eq(echo(ch, key, 2000, out, sizeof(out)), KV_INVALID_ARGUMENT);
    free(key);
    cr_assert_eq(echo(ch, "small", 2000, out, sizeof(out)), KV_OK);
    rpc_chan_close(ch);
    rpc_server_close(s);
}

static void async_done(void *arg, rpc_reply *r)
{
    int *count = arg;
    if (r->status == KV_OK)
        __atomic_fetch_add(count, 1, __ATOMIC_SEQ_CST);
    rpc_reply_free(r);
}

Test(rpc, many_async_calls_in_flight)
{
    char url[64];
    rpc_server *s = start(NULL, url, sizeof(url));
    rpc_chan *ch;
    cr_assert_eq(rpc_chan_open(&ch, url, NULL), KV_OK);
    char out[16];
    cr_assert_eq(echo(ch, "warm", 2000, out, sizeof(out)), KV_OK);
    int count = 0;
    Kv__GetRequest req = KV__GET_REQUEST__INIT;
    req.key.data = (uint8_t *)"k";
    req.key.len = 1;
    for (int i = 0; i < 500; i++)
        rpc_call_async(ch, "test.Echo", 1, &req.base, 5000, async_done, &count);
    for (int i = 0; i < 500 && __atomic_load_n(&count, __ATOMIC_SEQ_CST) < 500; i++)
        nng_msleep(10);
    cr_assert_eq(__atomic_load_n(&count, __ATOMIC_SEQ_CST), 500);
    rpc_chan_close(ch);
    rpc_server_close(s);
}

/* ---- coalesced calls ------------------------------------------------------ */

typedef struct coal_call {
    int i, *ok, *bad;
    uint64_t start_ns, end_ns;
    kv_err want;
    kv_err got;
} coal_call;

static void coal_done(void *arg, rpc_reply *r)
{
    coal_call *k = arg;
    k->got = r->status;
    bool good = r->status == k->want;
    if (good && r->status == KV_OK) {
        Kv__GetReply *g = kv__get_reply__unpack(NULL, r->len, r->body);
        char want[16];
        snprintf(want, sizeof(want), "c%d", k->i);
        good = g && g->value.len == strlen(want) && memcmp(g->value.data, want, g->value.len) == 0;
        if (g)
            kv__get_reply__free_unpacked(g, NULL);
    }
    k->end_ns = kv_now_ns();
    __atomic_fetch_add(good ? k->ok : k->bad, 1, __ATOMIC_SEQ_CST);
    rpc_reply_free(r);
}

/* Waits up to 5 s for n completions of coal_done / async_done; asserts
 * that all came with the reply they should have. */
static void wait_coalesced(int *ok, int *bad, int n)
{
    for (int i = 0;
         i < 500 &&
         __atomic_load_n(ok, __ATOMIC_SEQ_CST) + __atomic_load_n(bad, __ATOMIC_SEQ_CST) < n;
         i++)
        nng_msleep(10);
    cr_assert_eq(__atomic_load_n(bad, __ATOMIC_SEQ_CST), 0, "calls with a wrong reply");
    cr_assert_eq(__atomic_load_n(ok, __ATOMIC_SEQ_CST), n);
}

/* With one message in flight, further calls are coalesced: each still gets
 * its own reply (echo of its key), its own status (a failing handler), and
 * its own deadline (a slow call among them). */
Test(rpc, coalesced_calls_keep_their_replies_statuses_and_deadlines)
{
    char url[64], out[16];
    rpc_server *s = start(NULL, url, sizeof(url));
    rpc_chan *ch;
    rpc_chan_opts o = {.coalesce_after = 1};
    cr_assert_eq(rpc_chan_open(&ch, url, &o), KV_OK);
    cr_assert_eq(echo(ch, "warm", 2000, out, sizeof(out)), KV_OK);
    enum { N = 120 };
    static coal_call calls[N];
    char keys[N][16];
    int ok = 0, bad = 0;
    for (int i = 0; i < N; i++) {
        calls[i] = (coal_call){.i = i, .ok = &ok, .bad = &bad, .start_ns = kv_now_ns()};
        snprintf(keys[i], sizeof(keys[i]), "c%d", i);
        Kv__GetRequest req = KV__GET_REQUEST__INIT;
        req.key = (ProtobufCBinaryData){strlen(keys[i]), (uint8_t *)keys[i]};
        const char *m = i % 10 == 3 ? "test.Fail" : i == 50 ? "test.Slower" : "test.Echo";
        calls[i].want = i % 10 == 3 ? KV_ALREADY_EXISTS : i == 50 ? KV_DEADLINE_EXCEEDED : KV_OK;
        /* 30 s: calls sharing a message with the slow one may run after its
         * handler (one worker runs a message's calls in turn) */
        rpc_call_async(ch, m, 1, &req.base, i == 50 ? 100 : 30000, coal_done, &calls[i]);
    }
    wait_coalesced(&ok, &bad, N);
    uint64_t slow_ms = (calls[50].end_ns - calls[50].start_ns) / 1000000u;
    cr_assert_lt(slow_ms, SLOWER_MS - 1000, "the slow call ended at its deadline (%llu ms)",
                 (unsigned long long)slow_ms);
    cr_assert_eq(echo(ch, "after", 2000, out, sizeof(out)), KV_OK);
    rpc_chan_close(ch);
    rpc_server_close(s);
}

typedef struct shooter {
    rpc_chan *ch;
    int ok;
} shooter;

static void *shoot(void *arg)
{
    shooter *sh = arg;
    for (int i = 0; i < 200; i++) {
        Kv__GetRequest req = KV__GET_REQUEST__INIT;
        req.key = (ProtobufCBinaryData){1, (uint8_t *)"t"};
        if (i % 4 == 0) { /* a synchronous call among the async ones */
            rpc_reply r;
            if (rpc_call(sh->ch, "test.Echo", 1, &req.base, 5000, &r) == KV_OK)
                __atomic_fetch_add(&sh->ok, 1, __ATOMIC_SEQ_CST);
            rpc_reply_free(&r);
        } else {
            rpc_call_async(sh->ch, "test.Echo", 1, &req.base, 5000, async_done, &sh->ok);
        }
    }
    return NULL;
}

/* Four threads share one coalescing channel (TSan: the queue, the flush
 * timer, the deadline sweep and the completions). */
Test(rpc, coalescing_channel_shared_by_threads)
{
    char url[64], out[16];
    rpc_server *s = start(NULL, url, sizeof(url));
    rpc_chan *ch;
    rpc_chan_opts o = {.coalesce_after = 2};
    cr_assert_eq(rpc_chan_open(&ch, url, &o), KV_OK);
    cr_assert_eq(echo(ch, "warm", 2000, out, sizeof(out)), KV_OK);
    shooter sh = {ch, 0};
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, shoot, &sh), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 1000 && __atomic_load_n(&sh.ok, __ATOMIC_SEQ_CST) < 800; i++)
        nng_msleep(10);
    cr_assert_eq(__atomic_load_n(&sh.ok, __ATOMIC_SEQ_CST), 800);
    rpc_chan_close(ch);
    rpc_server_close(s);
}

/* A channel opened without options coalesces as soon as one message is in
 * flight ($KV_RPC_COALESCE_AFTER or the options change that): the calls
 * made while a slow call is out share messages, which the server counts. */
Test(rpc, default_channel_coalesces_behind_one_message)
{
    char url[64], out[16];
    rpc_server *s = start(NULL, url, sizeof(url));
    rpc_chan *ch, *c3, *off, *two;
    unsetenv("KV_RPC_COALESCE_AFTER");
    cr_assert_eq(rpc_chan_open(&ch, url, NULL), KV_OK);
    cr_assert_eq(rpc_chan_coalesce_after(ch), 1);
    setenv("KV_RPC_COALESCE_AFTER", "3", 1);
    cr_assert_eq(rpc_chan_open(&c3, url, NULL), KV_OK);
    cr_assert_eq(rpc_chan_coalesce_after(c3), 3, "the environment sets the default");
    setenv("KV_RPC_COALESCE_AFTER", "-1", 1);
    cr_assert_eq(rpc_chan_open(&off, url, NULL), KV_OK);
    cr_assert_eq(rpc_chan_coalesce_after(off), 0, "negative: never");
    rpc_chan_opts o = {.coalesce_after = 2};
    cr_assert_eq(rpc_chan_open(&two, url, &o), KV_OK);
    cr_assert_eq(rpc_chan_coalesce_after(two), 2, "the options win over the environment");
    unsetenv("KV_RPC_COALESCE_AFTER");
    rpc_chan_close(c3);
    rpc_chan_close(off);
    rpc_chan_close(two);

    cr_assert_eq(echo(ch, "warm", 2000, out, sizeof(out)), KV_OK);
    rpc_server_counters k0, k1;
    rpc_server_counters_get(s, &k0);
    enum { N = 12 };
    static coal_call calls[N];
    char keys[N][16];
    int ok = 0, bad = 0;
    for (int i = 0; i < N; i++) { /* call 0 sleeps 300 ms in its handler */
        calls[i] = (coal_call){.i = i, .ok = &ok, .bad = &bad, .start_ns = kv_now_ns()};
        snprintf(keys[i], sizeof(keys[i]), "c%d", i);
        Kv__GetRequest req = KV__GET_REQUEST__INIT;
        req.key = (ProtobufCBinaryData){strlen(keys[i]), (uint8_t *)keys[i]};
        calls[i].want = KV_OK;
        rpc_call_async(ch, i == 0 ? "test.Slow" : "test.Echo", 1, &req.base, 5000,
                       i == 0 ? async_done : coal_done, i == 0 ? (void *)&ok : &calls[i]);
    }
    wait_coalesced(&ok, &bad, N);
    rpc_server_counters_get(s, &k1);
    cr_assert_eq(k1.calls - k0.calls, N);
    cr_assert_leq(k1.messages - k0.messages, N / 2,
                  "%llu messages for %d calls: the calls behind the slow one were not coalesced",
                  (unsigned long long)(k1.messages - k0.messages), N);
    rpc_chan_close(ch);
    rpc_server_close(s);
}

/* test.Gate: counts the handlers running at once and waits (up to 1 s) for
 * a second one to come in, so the calls of one message meet only when they
 * run in parallel. */
static int gate_in, gate_max; /* __atomic */

static kv_err h_gate(rpc_ctx *c, const uint8_t *body, size_t len)
{
    int now = __atomic_add_fetch(&gate_in, 1, __ATOMIC_SEQ_CST);
    for (int m = __atomic_load_n(&gate_max, __ATOMIC_SEQ_CST); now > m;)
        if (__atomic_compare_exchange_n(&gate_max, &m, now, false, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST))
            break;
    for (int i = 0; i < 100 && __atomic_load_n(&gate_max, __ATOMIC_SEQ_CST) < 2; i++)
        nng_msleep(10);
    __atomic_sub_fetch(&gate_in, 1, __ATOMIC_SEQ_CST);
    return h_echo(c, body, len);
}

static const rpc_method gate_methods[] = {
    {"test.Echo", h_echo}, {"test.Slow", h_slow}, {"test.Gate", h_gate}};

/* Sends a slow call and then three test.Gate calls, which queue behind it
 * and normally leave together in one rpc.Calls message once they waited
 * 1 ms; returns the most gates that ran at once, or -1 when the gates did
 * not leave in one message (a thread preempted between them). */
static int gates_behind_slow(rpc_server *s, rpc_chan *ch)
{
    __atomic_store_n(&gate_in, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&gate_max, 0, __ATOMIC_SEQ_CST);
    rpc_server_counters k0, k1;
    rpc_server_counters_get(s, &k0);
    enum { N = 4 };
    static coal_call calls[N];
    static char keys[N][16];
    int ok = 0, bad = 0;
    for (int i = 0; i < N; i++) {
        calls[i] = (coal_call){.i = i, .ok = &ok, .bad = &bad, .want = KV_OK};
        snprintf(keys[i], sizeof(keys[i]), "c%d", i);
        Kv__GetRequest req = KV__GET_REQUEST__INIT;
        req.key = (ProtobufCBinaryData){strlen(keys[i]), (uint8_t *)keys[i]};
        rpc_call_async(ch, i == 0 ? "test.Slow" : "test.Gate", 1, &req.base, 10000,
                       i == 0 ? async_done : coal_done, i == 0 ? (void *)&ok : &calls[i]);
    }
    wait_coalesced(&ok, &bad, N);
    rpc_server_counters_get(s, &k1);
    return k1.messages - k0.messages == 2 ? __atomic_load_n(&gate_max, __ATOMIC_SEQ_CST) : -1;
}

/* A server whose handlers wait (a node, a router) runs the calls of one
 * rpc.Calls message in parallel on its workers; one that does not, one
 * after another on one worker. Each gets its own reply either way. */
Test(rpc, calls_of_a_message_run_in_parallel_where_handlers_wait)
{
    for (int wait = 0; wait < 2; wait++) {
        rpc_server_opts so = {.url = "tcp://127.0.0.1:0",
                              .methods = gate_methods,
                              .nmethods = 3,
                              .workers = 4,
                              .handlers_wait = wait};
        rpc_server *s = NULL;
        char err[256], url[64], out[16];
        cr_assert_eq(rpc_server_open(&s, &so, err, sizeof(err)), KV_OK, "%s", err);
        snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", rpc_server_port(s));
        rpc_chan *ch;
        rpc_chan_opts co = {.coalesce_after = 1};
        cr_assert_eq(rpc_chan_open(&ch, url, &co), KV_OK);
        cr_assert_eq(echo(ch, "warm", 2000, out, sizeof(out)), KV_OK);
        int most = -1;
        for (int attempt = 0; attempt < 5 && most < 0; attempt++)
            most = gates_behind_slow(s, ch);
        cr_assert_geq(most, 0, "the gates never left in one message");
        cr_assert(wait ? most >= 2 : most == 1, "handlers_wait %d: %d gate calls ran at once", wait,
                  most);
        rpc_chan_close(ch);
        rpc_server_close(s);
    }
}

/* One worker per lane: a coordinate call that waits for a plain call to
 * the same server completes, because the plain call has a lane of its own
 * (with one shared worker it would wait for itself until the deadline). */
Test(rpc, coordinate_calls_have_their_own_lane)
{
    rpc_server_opts so = {.url = "tcp://127.0.0.1:0",
                          .methods = methods,
                          .nmethods = 5,
                          .workers = 1,
                          .coord_workers = 1};
    char err[256];
    cr_assert_eq(rpc_server_open(&g_server, &so, err, sizeof(err)), KV_OK, "%s", err);
    snprintf(g_url, sizeof(g_url), "tcp://127.0.0.1:%d", rpc_server_port(g_server));
    rpc_chan *ch;
    rpc_chan_opts co = {.coordinate = true};
    cr_assert_eq(rpc_chan_open(&ch, g_url, &co), KV_OK);
    rpc_reply r;
    uint64_t t0 = kv_now_ns();
    cr_assert_eq(rpc_call(ch, "test.CallBack", 1, NULL, 3000, &r), KV_OK, "%s",
                 r.message ? r.message : "");
    cr_assert_lt((kv_now_ns() - t0) / 1000000u, 2000);
    rpc_reply_free(&r);
    rpc_chan_close(ch);
    rpc_server_close(g_server);
}

Test(rpc, pool_keeps_one_channel_per_address)
{
    char url[64], out[16];
    rpc_server *s = start("tok", url, sizeof(url));
    rpc_pool *p;
    rpc_chan_opts o = {.auth = "tok"};
    cr_assert_eq(rpc_pool_create(&p, &o), KV_OK);
    rpc_chan *a = rpc_pool_get(p, url), *b = rpc_pool_get(p, url);
    cr_assert(a && a == b, "one channel per address");
    cr_assert_eq(echo(a, "k", 2000, out, sizeof(out)), KV_OK, "the pool's token is used");
    cr_assert_null(rpc_pool_get(p, "not a url"));
    rpc_pool_destroy(p);
    rpc_pool_destroy(NULL);
    rpc_server_close(s);
}

/* Calls coalesced right after the channel opens, before its connection is
 * up, wait for it like single calls (they used to fail UNAVAILABLE). */
Test(rpc, coalesced_calls_wait_for_the_first_connection)
{
    char url[64];
    rpc_server *s = start(NULL, url, sizeof(url));
    rpc_chan *ch;
    rpc_chan_opts o = {.coalesce_after = 1};
    cr_assert_eq(rpc_chan_open(&ch, url, &o), KV_OK);
    int count = 0;
    Kv__GetRequest req = KV__GET_REQUEST__INIT;
    req.key = (ProtobufCBinaryData){1, (uint8_t *)"k"};
    for (int i = 0; i < 40; i++)
        rpc_call_async(ch, "test.Echo", 1, &req.base, 5000, async_done, &count);
    for (int i = 0; i < 500 && __atomic_load_n(&count, __ATOMIC_SEQ_CST) < 40; i++)
        nng_msleep(10);
    cr_assert_eq(__atomic_load_n(&count, __ATOMIC_SEQ_CST), 40);
    rpc_chan_close(ch);
    rpc_server_close(s);
}

/* ---- try_inline: calls served on the receive callback's thread ---------- */

static int inline_served, worker_served; /* __atomic */
static uint64_t inline_seq;              /* __atomic: run order */

/* Echoes key + "@i" (inline) or "@w" (worker); version = run order. */
static kv_err inline_reply(rpc_ctx *c, const uint8_t *body, size_t len, const char *tag)
{
    Kv__GetRequest *req = kv__get_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "bad GetRequest");
    char val[64];
    snprintf(val, sizeof(val), "%.*s%s", (int)req->key.len, (char *)req->key.data, tag);
    Kv__GetReply rep = KV__GET_REPLY__INIT;
    rep.found = true;
    rep.value = (ProtobufCBinaryData){strlen(val), (uint8_t *)val};
    rep.version = __atomic_add_fetch(&inline_seq, 1, __ATOMIC_SEQ_CST);
    kv_err rv = req->key.len && req->key.data[0] == 'f'
                    ? rpc_fail(c, KV_ALREADY_EXISTS, "refused %s", tag)
                    : rpc_reply_msg(c, &rep.base);
    kv__get_request__free_unpacked(req, NULL);
    return rv;
}

static kv_err h_mixed(rpc_ctx *c, const uint8_t *body, size_t len)
{
    cr_assert_geq(c->worker, 0);
    __atomic_fetch_add(&worker_served, 1, __ATOMIC_SEQ_CST);
    return inline_reply(c, body, len, "@w");
}

/* Serves keys that start with 'i' or 'f' here, declines the others. */
static bool h_mixed_try(rpc_ctx *c, const uint8_t *body, size_t len, kv_err *rv)
{
    cr_assert_eq(c->worker, -1);
    Kv__GetRequest *req = kv__get_request__unpack(NULL, len, body);
    bool here = req && req->key.len && (req->key.data[0] == 'i' || req->key.data[0] == 'f');
    if (req)
        kv__get_request__free_unpacked(req, NULL);
    if (!here)
        return false;
    __atomic_fetch_add(&inline_served, 1, __ATOMIC_SEQ_CST);
    *rv = inline_reply(c, body, len, "@i");
    return true;
}

static const rpc_method inline_methods[] = {
    {"test.Mixed", h_mixed, .access = RPC_DATA, .try_inline = h_mixed_try},
    {"test.Echo", h_echo, .access = RPC_DATA}};

typedef struct mixed_call {
    char key[16];
    kv_err got;
    char val[64];
    uint64_t seq;
    int *done;
} mixed_call;

static void mixed_done(void *arg, rpc_reply *r)
{
    mixed_call *k = arg;
    k->got = r->status;
    Kv__GetReply *g = r->status == KV_OK ? kv__get_reply__unpack(NULL, r->len, r->body) : NULL;
    if (g) {
        snprintf(k->val, sizeof(k->val), "%.*s", (int)g->value.len, (char *)g->value.data);
        k->seq = g->version;
        kv__get_reply__free_unpacked(g, NULL);
    } else if (r->message) {
        snprintf(k->val, sizeof(k->val), "%.60s", r->message);
    }
    rpc_reply_free(r);
    __atomic_fetch_add(k->done, 1, __ATOMIC_SEQ_CST);
}

/* Calls a method's try_inline serves are answered from the receive
 * callback (worker -1), those it declines by a worker; in rpc.Calls
 * messages too (coalesce_after 1), where the calls from a declined one on
 * go to a worker; each keeps its reply, status and message, and auth is
 * checked as for worker calls. */
Test(rpc, inline_calls_and_declined_ones_keep_their_replies)
{
    rpc_server_opts o = {.url = "tcp://127.0.0.1:0",
                         .methods = inline_methods,
                         .nmethods = 2,
                         .workers = 2,
                         .auth = "tok"};
    rpc_server *s = NULL;
    char err[256], url[64];
    cr_assert_eq(rpc_server_open(&s, &o, err, sizeof(err)), KV_OK, "%s", err);
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", rpc_server_port(s));
    rpc_chan *ch, *bad;
    rpc_chan_opts co = {.auth = "tok", .coalesce_after = 1}, cb = {.auth = "nope"};
    cr_assert_eq(rpc_chan_open(&ch, url, &co), KV_OK);
    cr_assert_eq(rpc_chan_open(&bad, url, &cb), KV_OK);
    enum { N = 300 };
    static mixed_call calls[N];
    int done = 0;
    for (int i = 0; i < N; i++) {
        calls[i] = (mixed_call){.done = &done, .got = KV_UNKNOWN};
        snprintf(calls[i].key, sizeof(calls[i].key), "%c%d",
                 "iiwfi"[i % 5 == 2 && i % 3 ? 2
                         : i % 5 == 3        ? 3
                                             : 0],
                 i);
        Kv__GetRequest req = KV__GET_REQUEST__INIT;
        req.key = (ProtobufCBinaryData){strlen(calls[i].key), (uint8_t *)calls[i].key};
        rpc_call_async(ch, "test.Mixed", 0, &req.base, 5000, mixed_done, &calls[i]);
    }
    for (int i = 0; i < 500 && __atomic_load_n(&done, __ATOMIC_SEQ_CST) < N; i++)
        nng_msleep(10);
    cr_assert_eq(__atomic_load_n(&done, __ATOMIC_SEQ_CST), N);
    for (int i = 0; i < N; i++) {
        const mixed_call *k = &calls[i];
        if (k->key[0] == 'f') {
            cr_assert_eq(k->got, KV_ALREADY_EXISTS, "%s: %s", k->key, kv_strerror(k->got));
            cr_assert(strstr(k->val, "refused @"), "%s: message '%s'", k->key, k->val);
            continue;
        }
        cr_assert_eq(k->got, KV_OK, "%s: %s", k->key, kv_strerror(k->got));
        char want[64];
        snprintf(want, sizeof(want), "%.15s@", k->key);
        cr_assert(strncmp(k->val, want, strlen(want)) == 0, "%s got %s", k->key, k->val);
        if (k->key[0] == 'w')
            cr_assert_str_eq(k->val + strlen(want), "w", "%s: declined, so a worker's", k->key);
    }
    cr_assert_gt(__atomic_load_n(&inline_served, __ATOMIC_SEQ_CST), 0);
    cr_assert_gt(__atomic_load_n(&worker_served, __ATOMIC_SEQ_CST), 0);
    /* a wrong token is refused on the inline path too */
    rpc_reply r;
    Kv__GetRequest req = KV__GET_REQUEST__INIT;
    req.key = (ProtobufCBinaryData){2, (uint8_t *)"i1"};
    cr_assert_eq(rpc_call(bad, "test.Mixed", 0, &req.base, 2000, &r), KV_UNAUTHENTICATED);
    rpc_reply_free(&r);
    cr_assert_eq(rpc_call(ch, "test.Mixed", 0, &req.base, 2000, &r), KV_OK);
    rpc_reply_free(&r);
    rpc_chan_close(bad);
    rpc_chan_close(ch);
    rpc_server_close(s);
}

/* ---- the pool's channel per loop ------------------------------------------ */

static rpc_pool *g_pool;   /* the forwarding server's channels */
static char g_back[64];    /* the server it forwards to */
static int fwd_elsewhere;  /* __atomic: replies that came back on another thread */
static int fwd_loops_seen; /* __atomic: bit l set when loop l forwarded */

typedef struct fwd_call {
    rpc_async *a;
    rpc_ctx *c;
    pthread_t thread;
    int loop;
} fwd_call;

static void fwd_echoed(void *arg, rpc_reply *r)
{
    fwd_call *f = arg;
    if (!pthread_equal(pthread_self(), f->thread) || rpc_loop_self() != f->loop)
        __atomic_fetch_add(&fwd_elsewhere, 1, __ATOMIC_SEQ_CST);
    kv_err rv = r->status;
    if (rv == KV_OK) {
        f->c->reply = r->body; /* the echo's GetReply, as it came */
        f->c->reply_len = r->len;
        r->body = NULL;
    }
    rpc_reply_free(r);
    rpc_async *a = f->a;
    free(f);
    rpc_async_done(a, rv);
}

/* Forwards the GetRequest to g_back through the pool, as a router does. */
static bool h_fwd_start(rpc_ctx *c, const uint8_t *body, size_t len, rpc_async *a)
{
    Kv__GetRequest *req = kv__get_request__unpack(NULL, len, body);
    fwd_call *f = req ? calloc(1, sizeof(*f)) : NULL;
    rpc_chan *ch = f ? rpc_pool_get(g_pool, g_back) : NULL;
    if (!ch) {
        free(f);
        if (req)
            kv__get_request__free_unpacked(req, NULL);
        return false;
    }
    *f = (fwd_call){.a = a, .c = c, .thread = pthread_self(), .loop = rpc_loop_self()};
    if (f->loop >= 0)
        __atomic_fetch_or(&fwd_loops_seen, 1 << f->loop, __ATOMIC_SEQ_CST);
    rpc_call_async(ch, "test.Echo", 7, &req->base, 5000, fwd_echoed, f);
    kv__get_request__free_unpacked(req, NULL);
    return true;
}

/* The worker form, for a forward h_fwd_start declined. */
static kv_err h_fwd_wstart(rpc_ctx *c, const uint8_t *body, size_t len, void **state)
{
    return rpc_fail(c, KV_INTERNAL, "the forward was declined");
}

static kv_err h_fwd_finish(rpc_ctx *c, void *state)
{
    return KV_INTERNAL;
}

static void *pool_get_thread(void *arg)
{
    *(rpc_chan **)arg = rpc_pool_get(g_pool, g_back);
    return NULL;
}

/* A server that forwards on the loop that read the request (a router) gets
 * each reply back on that same loop's thread: the pool gives each loop a
 * channel of its own whose connection that loop serves, so no other
 * thread takes the channel's locks or frees its calls (with one channel
 * per address, half of the replies came back on the other loop). The
 * threads off the loops share one channel per address. */
Test(rpc, pool_channels_answer_on_the_loop_that_called)
{
    rpc_server *back = start(NULL, g_back, sizeof(g_back));
    static const rpc_method fwd_methods[] = {
        {"test.Fwd", NULL, h_fwd_wstart, h_fwd_finish, RPC_DATA, .start_async = h_fwd_start}};
    rpc_server_opts o = {
        .url = "tcp://127.0.0.1:0", .methods = fwd_methods, .nmethods = 1, .workers = 2};
    rpc_server *front = NULL;
    char err[256], url[64];
    cr_assert_eq(rpc_pool_create(&g_pool, NULL), KV_OK);
    cr_assert_eq(rpc_server_open(&front, &o, err, sizeof(err)), KV_OK, "%s", err);
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", rpc_server_port(front));
    /* the server spreads its connections over the loops in turn */
    int nl = rpc_loop_count();
    cr_assert_gt(nl, 0);
    enum { CH = 8, N = 400 };
    rpc_chan *ch[CH];
    for (int i = 0; i < CH; i++)
        cr_assert_eq(rpc_chan_open(&ch[i], url, NULL), KV_OK);
    static mixed_call calls[N];
    int done = 0;
    for (int i = 0; i < N; i++) {
        calls[i] = (mixed_call){.done = &done, .got = KV_UNKNOWN};
        snprintf(calls[i].key, sizeof(calls[i].key), "f%d", i);
        Kv__GetRequest req = KV__GET_REQUEST__INIT;
        req.key = (ProtobufCBinaryData){strlen(calls[i].key), (uint8_t *)calls[i].key};
        rpc_call_async(ch[i % CH], "test.Fwd", 0, &req.base, 5000, mixed_done, &calls[i]);
    }
    for (int i = 0; i < 1000 && __atomic_load_n(&done, __ATOMIC_SEQ_CST) < N; i++)
        nng_msleep(10);
    cr_assert_eq(__atomic_load_n(&done, __ATOMIC_SEQ_CST), N);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(calls[i].got, KV_OK, "%s: %s (%s)", calls[i].key, kv_strerror(calls[i].got),
                     calls[i].val);
        cr_assert_str_eq(calls[i].val, calls[i].key);
    }
    int seen = __atomic_load_n(&fwd_loops_seen, __ATOMIC_SEQ_CST);
    cr_assert_eq(__builtin_popcount((unsigned)seen), nl > CH ? CH : nl,
                 "forwards ran on every loop (mask %#x of %d loops)", seen, nl);
    cr_assert_eq(__atomic_load_n(&fwd_elsewhere, __ATOMIC_SEQ_CST), 0,
                 "%d replies came back on another thread than their forward's", fwd_elsewhere);
    /* threads off the loops share one channel per address */
    cr_assert_eq(rpc_pool_get(g_pool, g_back), rpc_pool_get(g_pool, g_back));
    rpc_chan *other = NULL;
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, pool_get_thread, &other), 0);
    pthread_join(t, NULL);
    cr_assert_eq(other, rpc_pool_get(g_pool, g_back));
    for (int i = 0; i < CH; i++)
        rpc_chan_close(ch[i]);
    rpc_server_close(front);
    rpc_pool_destroy(g_pool);
    rpc_server_close(back);
}

/* ---- out of file descriptors --------------------------------------------- */

/* A server out of file descriptors closes the connections waiting to be
 * accepted at once (their clients see the end instead of hanging in the
 * backlog), counts them, and keeps serving the connections it has; once
 * descriptors are free it accepts again. */
Test(rpc, out_of_descriptors_new_connections_end_at_once_and_old_ones_work)
{
    char url[64], out[16];
    rpc_server *s = start(NULL, url, sizeof(url));
    rpc_chan *ch;
    cr_assert_eq(rpc_chan_open(&ch, url, NULL), KV_OK);
    cr_assert_eq(echo(ch, "a", 2000, out, sizeof(out)), KV_OK);
    struct rlimit old;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &old), 0);
    int top = 0;
    DIR *d = opendir("/proc/self/fd");
    cr_assert_not_null(d);
    for (struct dirent *e; (e = readdir(d));)
        top = atoi(e->d_name) > top ? atoi(e->d_name) : top;
    closedir(d);
    struct rlimit low = {.rlim_cur = (rlim_t)top + 16, .rlim_max = old.rlim_max};
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
    enum { FILL = 8192 }; /* the limit, and the holes below it other tests left */
    static int fill[FILL];
    int nfill = 0;
    while (nfill < FILL && (fill[nfill] = open("/dev/null", O_RDONLY)) >= 0)
        nfill++;
    cr_assert_lt(nfill, FILL, "the limit was reached");
    close(fill[--nfill]); /* one descriptor free: the client's socket */
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)rpc_server_port(s)),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int c = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(c, 0);
    cr_assert_eq(connect(c, (struct sockaddr *)&sa, sizeof(sa)), 0, "%s", strerror(errno));
    /* the server cannot take a descriptor for it: it must end it now */
    struct pollfd pf = {.fd = c, .events = POLLIN};
    int ready = poll(&pf, 1, 5000);
    char b;
    ssize_t got = ready == 1 ? recv(c, &b, 1, 0) : 1;
    cr_assert_eq(ready, 1, "the connection neither ended nor was served within 5 s");
    cr_assert_leq(got, 0, "the connection ended (recv %zd)", got);
    rpc_server_counters k;
    rpc_server_counters_get(s, &k);
    cr_assert_geq(k.accepts_refused, 1);
    cr_assert_eq(echo(ch, "b", 2000, out, sizeof(out)), KV_OK, "the old connection still works");
    cr_assert_str_eq(out, "b");
    close(c);
    while (nfill)
        close(fill[--nfill]);
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &old), 0);
    rpc_chan *again;
    cr_assert_eq(rpc_chan_open(&again, url, NULL), KV_OK);
    cr_assert_eq(echo(again, "c", 5000, out, sizeof(out)), KV_OK, "accepting again");
    rpc_chan_close(again);
    rpc_chan_close(ch);
    rpc_server_close(s);
}

/* ---- the request path's clock ------------------------------------------- */

static uint64_t now_seen; /* __atomic: rpc_now_ns() in the handler */
static int now_loop;      /* __atomic: rpc_loop_self() there */

static bool h_now_try(rpc_ctx *c, const uint8_t *body, size_t len, kv_err *rv)
{
    __atomic_store_n(&now_seen, rpc_now_ns(), __ATOMIC_SEQ_CST);
    __atomic_store_n(&now_loop, rpc_loop_self(), __ATOMIC_SEQ_CST);
    *rv = h_echo(c, body, len);
    return true;
}

/* rpc_now_ns in a call served on a loop is the time its message was read:
 * after the caller sent it and before the reply came back, never a time
 * of an earlier message; rpc_since_ns never goes below zero. */
Test(rpc, the_loops_clock_is_the_time_a_message_was_read)
{
    static const rpc_method now_methods[] = {
        {"test.Echo", h_echo, .access = RPC_DATA, .try_inline = h_now_try}};
    rpc_server_opts o = {
        .url = "tcp://127.0.0.1:0", .methods = now_methods, .nmethods = 1, .workers = 1};
    rpc_server *s = NULL;
    char err[256], url[64], out[16];
    cr_assert_eq(rpc_server_open(&s, &o, err, sizeof(err)), KV_OK, "%s", err);
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", rpc_server_port(s));
    rpc_chan *ch;
    cr_assert_eq(rpc_chan_open(&ch, url, NULL), KV_OK);
    for (int i = 0; i < 20; i++) {
        uint64_t before = kv_now_ns();
        cr_assert_eq(echo(ch, "k", 2000, out, sizeof(out)), KV_OK);
        uint64_t after = kv_now_ns(), seen = __atomic_load_n(&now_seen, __ATOMIC_SEQ_CST);
        cr_assert_geq(__atomic_load_n(&now_loop, __ATOMIC_SEQ_CST), 0, "served on a loop");
        cr_assert(seen >= before && seen <= after, "call %d: %llu not within [%llu, %llu]", i,
                  (unsigned long long)seen, (unsigned long long)before, (unsigned long long)after);
        nng_msleep(2); /* a stale clock would show as a time before `before` */
    }
    cr_assert_eq(rpc_since_ns(UINT64_MAX), 0);
    uint64_t t = kv_now_ns();
    cr_assert_geq(rpc_now_ns(), t, "off the loops: the clock itself");
    rpc_chan_close(ch);
    rpc_server_close(s);
}

/* ---- start_async: calls completed by other threads' callbacks ----------- */

static rpc_chan *g_self; /* a channel to the test's own server */
static int async_taken;  /* __atomic */

typedef struct async_call {
    rpc_async *a;
    rpc_ctx *c;
    char tag[8];
} async_call;

/* Replies key + tag (as inline_reply: keys starting with 'f' fail). */
static kv_err async_reply(rpc_ctx *c, const char *key, size_t klen, const char *tag)
{
    Kv__GetRequest req = KV__GET_REQUEST__INIT;
    req.key = (ProtobufCBinaryData){klen, (uint8_t *)key};
    uint8_t buf[128];
    size_t n = kv__get_request__pack(&req, buf);
    return inline_reply(c, buf, n, tag);
}

/* An 's' call's rest, on a worker: it ends past its 100 ms deadline. (Not
 * in the echo's callback: a completion must not block, and on a stream
 * channel the replies behind it would wait.) */
static kv_err async_late(rpc_ctx *c, void *arg)
{
    nng_msleep(150);
    return *(kv_err *)arg == KV_OK ? KV_OK : rpc_fail(c, KV_INTERNAL, "echo failed");
}

/* The echo that an 'a' or 's' call waits for came back: complete it. */
static void async_echoed(void *arg, rpc_reply *r)
{
    async_call *ac = arg;
    Kv__GetReply *g = r->status == KV_OK ? kv__get_reply__unpack(NULL, r->len, r->body) : NULL;
    kv_err rv = g ? async_reply(ac->c, (const char *)g->value.data, g->value.len, ac->tag)
                  : rpc_fail(ac->c, r->status, "echo failed");
    if (g && g->value.data[0] == 's') {
        static const kv_err ok = KV_OK, bad = KV_INTERNAL;
        kv__get_reply__free_unpacked(g, NULL);
        rpc_reply_free(r);
        rpc_async *a = ac->a;
        free(ac);
        rpc_async_handoff(a, async_late, (void *)(rv == KV_OK ? &ok : &bad));
        return;
    }
    if (g)
        kv__get_reply__free_unpacked(g, NULL);
    rpc_reply_free(r);
    rpc_async *a = ac->a;
    free(ac);
    rpc_async_done(a, rv);
}

static kv_err async_rest(rpc_ctx *c, void *arg)
{
    cr_assert_geq(c->worker, 0, "a handoff runs on a worker");
    char *key = arg;
    kv_err rv = async_reply(c, key, strlen(key), "@h");
    free(key);
    return rv;
}

/* 'a'/'f'/'s' keys: completed by the echo's callback; 'n': at once, in
 * here; 'h': handed to a worker; others (and 'd'): declined. */
static bool h_async_start(rpc_ctx *c, const uint8_t *body, size_t len, rpc_async *a)
{
    cr_assert_eq(c->worker, -1);
    Kv__GetRequest *req = kv__get_request__unpack(NULL, len, body);
    if (!req || !req->key.len || !strchr("afnhs", req->key.data[0])) {
        if (req)
            kv__get_request__free_unpacked(req, NULL);
        return false;
    }
    __atomic_fetch_add(&async_taken, 1, __ATOMIC_SEQ_CST);
    char k0 = (char)req->key.data[0];
    if (k0 == 'n') {
        kv_err rv = async_reply(c, (const char *)req->key.data, req->key.len, "@n");
        kv__get_request__free_unpacked(req, NULL);
        rpc_async_done(a, rv);
        return true;
    }
    if (k0 == 'h') {
        char *key = strndup((const char *)req->key.data, req->key.len);
        kv__get_request__free_unpacked(req, NULL);
        rpc_async_handoff(a, async_rest, key);
        return true;
    }
    async_call *ac = calloc(1, sizeof(*ac));
    *ac = (async_call){.a = a, .c = c};
    snprintf(ac->tag, sizeof(ac->tag), "@a");
    rpc_call_async(g_self, "test.Echo", 0, &req->base, 5000, async_echoed, ac);
    kv__get_request__free_unpacked(req, NULL);
    return true;
}

/* The worker form: start keeps the key, finish replies "@w". */
static kv_err h_async_wstart(rpc_ctx *c, const uint8_t *body, size_t len, void **state)
{
    Kv__GetRequest *req = kv__get_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "bad GetRequest");
    *state = strndup((const char *)req->key.data, req->key.len);
    kv__get_request__free_unpacked(req, NULL);
    return KV_OK;
}

static kv_err h_async_finish(rpc_ctx *c, void *state)
{
    cr_assert_geq(c->worker, 0);
    __atomic_fetch_add(&worker_served, 1, __ATOMIC_SEQ_CST);
    kv_err rv = async_reply(c, state, strlen(state), "@w");
    free(state);
    return rv;
}

static const rpc_method async_methods[] = {
    {"test.Async", NULL, h_async_wstart, h_async_finish, RPC_DATA, .start_async = h_async_start},
    {"test.Mixed", h_mixed, .access = RPC_DATA, .try_inline = h_mixed_try},
    {"test.Echo", h_echo, .access = RPC_DATA}};

/* Asynchronous calls, alone and in rpc.Calls messages beside inline and
 * declined ones (each declined call runs alone on a worker, the calls
 * after it stay asynchronous): each gets its own reply, status and deadline, whichever
 * thread completes it (a reply's callback, the receive callback itself, a
 * worker after a handoff); declined ones run start/finish on a worker; a
 * wrong token is refused before start_async; and the server closes
 * cleanly with asynchronous calls still out. */
Test(rpc, async_calls_complete_from_callbacks_and_workers)
{
    rpc_server_opts o = {.url = "tcp://127.0.0.1:0",
                         .methods = async_methods,
                         .nmethods = 3,
                         .workers = 2,
                         .handlers_wait = true,
                         .auth = "tok"};
    /* the 's' calls end past their deadlines on purpose: that slowness
     * must not make the server shed the echoes the others wait for */
    setenv("KV_RPC_SHED_SLOW_PCT", "0", 1);
    rpc_server *s = NULL;
    char err[256], url[64];
    cr_assert_eq(rpc_server_open(&s, &o, err, sizeof(err)), KV_OK, "%s", err);
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", rpc_server_port(s));
    rpc_chan *ch, *bad;
    rpc_chan_opts co = {.auth = "tok", .coalesce_after = 1}, cb = {.auth = "nope"},
                  cs = {.auth = "tok", .coalesce_after = -1};
    cr_assert_eq(rpc_chan_open(&ch, url, &co), KV_OK);
    cr_assert_eq(rpc_chan_open(&bad, url, &cb), KV_OK);
    cr_assert_eq(rpc_chan_open(&g_self, url, &cs), KV_OK);
    enum { N = 400 };
    static mixed_call calls[N];
    int done = 0;
    const char kinds[] = "afnhdsi"; /* i: test.Mixed, served inline */
    for (int i = 0; i < N; i++) {
        char kind = kinds[i % 7];
        calls[i] = (mixed_call){.done = &done, .got = KV_UNKNOWN};
        snprintf(calls[i].key, sizeof(calls[i].key), "%c%d", kind, i);
        Kv__GetRequest req = KV__GET_REQUEST__INIT;
        req.key = (ProtobufCBinaryData){strlen(calls[i].key), (uint8_t *)calls[i].key};
        rpc_call_async(ch, kind == 'i' ? "test.Mixed" : "test.Async", 0, &req.base,
                       kind == 's' ? 100 : 5000, mixed_done, &calls[i]);
    }
    for (int i = 0; i < 1000 && __atomic_load_n(&done, __ATOMIC_SEQ_CST) < N; i++)
        nng_msleep(10);
    cr_assert_eq(__atomic_load_n(&done, __ATOMIC_SEQ_CST), N);
    for (int i = 0; i < N; i++) {
        const mixed_call *k = &calls[i];
        char kind = k->key[0];
        if (kind == 'f') {
            cr_assert_eq(k->got, KV_ALREADY_EXISTS, "%s: %s", k->key, kv_strerror(k->got));
            cr_assert(strstr(k->val, "refused @a"), "%s: message '%s'", k->key, k->val);
            continue;
        }
        if (kind == 's') {
            cr_assert_eq(k->got, KV_DEADLINE_EXCEEDED, "%s: %s %s", k->key, kv_strerror(k->got),
                         k->val);
            continue;
        }
        cr_assert_eq(k->got, KV_OK, "%s: %s (%s)", k->key, kv_strerror(k->got), k->val);
        const char *want = kind == 'a'   ? "@a"
                           : kind == 'n' ? "@n"
                           : kind == 'h' ? "@h"
                           : kind == 'i' ? "@i"
                                         : "@w";
        char full[64];
        snprintf(full, sizeof(full), "%.15s%.3s", k->key, want);
        cr_assert_str_eq(k->val, full, "%s", k->key);
    }
    cr_assert_gt(__atomic_load_n(&async_taken, __ATOMIC_SEQ_CST), 0);
    /* a wrong token is refused before the method sees the call */
    int before = __atomic_load_n(&async_taken, __ATOMIC_SEQ_CST);
    rpc_reply r;
    Kv__GetRequest req = KV__GET_REQUEST__INIT;
    req.key = (ProtobufCBinaryData){2, (uint8_t *)"n1"};
    cr_assert_eq(rpc_call(bad, "test.Async", 0, &req.base, 2000, &r), KV_UNAUTHENTICATED);
    rpc_reply_free(&r);
    cr_assert_eq(__atomic_load_n(&async_taken, __ATOMIC_SEQ_CST), before);
    /* close with calls out: the close waits for their completions */
    static mixed_call late[8];
    int late_done = 0;
    for (int i = 0; i < 8; i++) {
        late[i] = (mixed_call){.done = &late_done, .got = KV_UNKNOWN};
        snprintf(late[i].key, sizeof(late[i].key), "a-late%d", i);
        req.key = (ProtobufCBinaryData){strlen(late[i].key), (uint8_t *)late[i].key};
        rpc_call_async(ch, "test.Async", 0, &req.base, 5000, mixed_done, &late[i]);
    }
    nng_msleep(5);
    cr_assert(rpc_server_close(s), "the server closed with its asynchronous calls completed");
    for (int i = 0; i < 500 && __atomic_load_n(&late_done, __ATOMIC_SEQ_CST) < 8; i++)
        nng_msleep(10);
    cr_assert_eq(__atomic_load_n(&late_done, __ATOMIC_SEQ_CST), 8, "every call got an answer");
    rpc_chan_close(g_self);
    rpc_chan_close(bad);
    rpc_chan_close(ch);
}

/* ---- bursts ---------------------------------------------------------------- */

static void burst_echoes(rpc_chan *ch, coal_call *calls, int from, int n, int *ok, int *bad)
{
    for (int i = from; i < from + n; i++) {
        char key[16];
        snprintf(key, sizeof(key), "c%d", i);
        calls[i] = (coal_call){.i = i, .ok = ok, .bad = bad, .want = KV_OK};
        Kv__GetRequest req = KV__GET_REQUEST__INIT;
        req.key = (ProtobufCBinaryData){strlen(key), (uint8_t *)key};
        rpc_call_async(ch, "test.Echo", 1, &req.base, 5000, coal_done, &calls[i]);
    }
}

/* Calls started in a burst leave in one message when it ends, even on an
 * idle channel (outside a burst the first would go alone); an inner end
 * sends nothing; a blocking call inside the burst is not held back. (A
 * message's completion sends the channel's queue, burst or not: the
 * blocking call goes first here.) */
Test(rpc, a_burst_sends_its_calls_in_one_message)
{
    char url[64], out[16];
    rpc_server *s = start(NULL, url, sizeof(url));
    rpc_chan *ch;
    unsetenv("KV_RPC_COALESCE_AFTER");
    cr_assert_eq(rpc_chan_open(&ch, url, NULL), KV_OK);
    cr_assert_eq(echo(ch, "warm", 2000, out, sizeof(out)), KV_OK);
    rpc_server_counters k0, k1;
    rpc_server_counters_get(s, &k0);
    enum { N = 10 };
    static coal_call calls[N];
    int ok = 0, bad = 0;
    rpc_burst_begin();
    rpc_burst_begin();
    uint64_t t0 = kv_now_ns();
    cr_assert_eq(echo(ch, "sync", 2000, out, sizeof(out)), KV_OK, "a blocking call goes at once");
    cr_assert_lt(kv_now_ns() - t0, 1000000000ull);
    burst_echoes(ch, calls, 0, N, &ok, &bad);
    rpc_burst_end(); /* inner: nothing leaves */
    nng_msleep(20);
    cr_assert_eq(__atomic_load_n(&ok, __ATOMIC_SEQ_CST), 0, "calls left before the burst ended");
    rpc_burst_end();
    wait_coalesced(&ok, &bad, N);
    rpc_server_counters_get(s, &k1);
    cr_assert_eq(k1.calls - k0.calls, N + 1);
    cr_assert_eq(k1.messages - k0.messages, 2, "%llu messages: the sync call's and the burst's",
                 (unsigned long long)(k1.messages - k0.messages));
    rpc_burst_end(); /* unbalanced: ignored */
    rpc_chan_close(ch);
    rpc_server_close(s);
}

/* Each completion of the first burst's reply starts one more call: they
 * run in the channel's completion burst, so they too leave as one message. */
static rpc_chan *g_chain;
static coal_call g_chain_calls[20];
static int g_chain_ok, g_chain_bad; /* __atomic */

static void chain_done(void *arg, rpc_reply *r)
{
    coal_call *k = arg;
    coal_done(arg, r);
    burst_echoes(g_chain, g_chain_calls, 10 + k->i, 1, &g_chain_ok, &g_chain_bad);
}

Test(rpc, calls_that_the_completions_of_a_reply_start_leave_together)
{
    char url[64], out[16];
    rpc_server *s = start(NULL, url, sizeof(url));
    unsetenv("KV_RPC_COALESCE_AFTER");
    cr_assert_eq(rpc_chan_open(&g_chain, url, NULL), KV_OK);
    cr_assert_eq(echo(g_chain, "warm", 2000, out, sizeof(out)), KV_OK);
    rpc_server_counters k0, k1;
    rpc_server_counters_get(s, &k0);
    rpc_burst_begin();
    for (int i = 0; i < 10; i++) {
        char key[16];
        snprintf(key, sizeof(key), "c%d", i);
        g_chain_calls[i] = (coal_call){.i = i, .ok = &g_chain_ok, .bad = &g_chain_bad};
        Kv__GetRequest req = KV__GET_REQUEST__INIT;
        req.key = (ProtobufCBinaryData){strlen(key), (uint8_t *)key};
        rpc_call_async(g_chain, "test.Echo", 1, &req.base, 5000, chain_done, &g_chain_calls[i]);
    }
    rpc_burst_end();
    wait_coalesced(&g_chain_ok, &g_chain_bad, 20);
    rpc_server_counters_get(s, &k1);
    cr_assert_eq(k1.calls - k0.calls, 20);
    cr_assert_eq(k1.messages - k0.messages, 2, "%llu messages for two rounds of 10 calls",
                 (unsigned long long)(k1.messages - k0.messages));
    rpc_chan_close(g_chain);
    rpc_server_close(s);
}

/* A server starts the asynchronous calls of one message in a burst: the
 * echoes that ten 'a' calls forward leave in one message, not 1 + 9. */
Test(rpc, the_forwards_of_one_message_leave_together)
{
    rpc_server_opts o = {.url = "tcp://127.0.0.1:0",
                         .methods = async_methods,
                         .nmethods = 3,
                         .workers = 2,
                         .handlers_wait = true};
    rpc_server *s = NULL;
    char err[256], url[64];
    cr_assert_eq(rpc_server_open(&s, &o, err, sizeof(err)), KV_OK, "%s", err);
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", rpc_server_port(s));
    unsetenv("KV_RPC_COALESCE_AFTER");
    rpc_chan *ch;
    cr_assert_eq(rpc_chan_open(&ch, url, NULL), KV_OK);
    cr_assert_eq(rpc_chan_open(&g_self, url, NULL), KV_OK);
    cr_assert_eq(rpc_chan_coalesce_after(g_self), 1);
    Kv__GetRequest warm = KV__GET_REQUEST__INIT;
    warm.key = (ProtobufCBinaryData){4, (uint8_t *)"warm"};
    rpc_reply r;
    cr_assert_eq(rpc_call(g_self, "test.Echo", 0, &warm.base, 2000, &r), KV_OK);
    rpc_reply_free(&r);
    rpc_server_counters k0, k1;
    rpc_server_counters_get(s, &k0);
    enum { N = 10 };
    static mixed_call calls[N];
    int done = 0;
    rpc_burst_begin();
    for (int i = 0; i < N; i++) {
        calls[i] = (mixed_call){.done = &done, .got = KV_UNKNOWN};
        snprintf(calls[i].key, sizeof(calls[i].key), "a%d", i);
        Kv__GetRequest req = KV__GET_REQUEST__INIT;
        req.key = (ProtobufCBinaryData){strlen(calls[i].key), (uint8_t *)calls[i].key};
        rpc_call_async(ch, "test.Async", 0, &req.base, 5000, mixed_done, &calls[i]);
    }
    rpc_burst_end();
    for (int i = 0; i < 500 && __atomic_load_n(&done, __ATOMIC_SEQ_CST) < N; i++)
        nng_msleep(10);
    cr_assert_eq(__atomic_load_n(&done, __ATOMIC_SEQ_CST), N);
    for (int i = 0; i < N; i++)
        cr_assert_eq(calls[i].got, KV_OK, "%s: %s (%s)", calls[i].key, kv_strerror(calls[i].got),
                     calls[i].val);
    rpc_server_counters_get(s, &k1);
    cr_assert_eq(k1.calls - k0.calls, 2 * N, "ten calls and their ten echoes");
    cr_assert_eq(k1.messages - k0.messages, 2, "%llu messages: the client's and the forwards'",
                 (unsigned long long)(k1.messages - k0.messages));
    rpc_chan_close(ch);
    rpc_chan_close(g_self);
    rpc_server_close(s);
}
