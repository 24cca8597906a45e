/* SPDX-License-Identifier: MIT */
/* RPC runtime tests: dispatch, deadlines, auth, malformed input, oversize
 * requests and an unreachable peer, each followed by a call that must work. */
#include "tests/kv_testfw.h"
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static const rpc_method methods[] = {{"test.Echo", h_echo}, {"test.Slow", h_slow}};

static rpc_server *start(const char *auth, char *url, size_t urllen)
{
    rpc_server_opts o = {
        .url = "tcp://127.0.0.1:0", .methods = methods, .nmethods = 2, .workers = 4, .auth = auth};
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
    cr_assert_eq(rpc_call(ch, "test.Slow", 0, NULL, 100, &r), KV_DEADLINE_EXCEEDED);
    uint64_t ms = (kv_now_ns() - t0) / 1000000;
    cr_assert_lt(ms, 1000, "the call returned at its deadline, not after the handler");
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
