/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer harness for the RPC envelope (proto/rpc_server.c, rpc_chan.c)
 * both ways: the server over nng inproc, the client channel on hotkv's own
 * loops (rpc_conn.c, rpc_loop.c) to a scripted peer on loopback. Input byte
 * 0 bit 0 clear: the rest is sent as one raw request message to a real
 * rpc_server (bit 1: one that requires an auth token) whose methods are
 * small stubs; the reply must come (the server answers everything), parse as
 * an Envelope with a known status, echo the request's id, and refuse what it
 * must (INVALID_ARGUMENT for bytes that are no Envelope, UNAUTHENTICATED for
 * a wrong token, UNIMPLEMENTED for unknown methods); with fz_strict() its
 * status message must be UTF-8 (issue 16 item 9). Bit 0 set: a client
 * channel calls a scripted peer whose reply is the rest of the input, raw
 * (bit 1: wrapped in an envelope with the right id), and rpc_call must turn
 * it into a status, never a crash or a leak. The server and the peers live
 * for the process; the client channel is opened and closed per input.
 */
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_rpc.h"
#include "proto/kv.pb-c.h"

#define URL "inproc://hotkv-fuzz-envelope"
#define URL_AUTH "inproc://hotkv-fuzz-envelope-auth"
#define TOKEN "s3cret"

static rpc_server *srv, *srv_auth;
static nng_socket req_sock, req_auth;

/* kv.Get: found, the key as the value. */
static kv_err stub_get(rpc_ctx *c, const uint8_t *body, size_t len)
{
    Kv__GetRequest *req = kv__get_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__GetRequest body");
    Kv__GetReply rep = KV__GET_REPLY__INIT;
    rep.found = true;
    rep.value = req->key;
    kv_err rv = rpc_reply_msg(c, &rep.base);
    kv__get_request__free_unpacked(req, NULL);
    return rv;
}

static kv_err stub_ping(rpc_ctx *c, const uint8_t *body, size_t len)
{
    Kv__PingReply rep = KV__PING_REPLY__INIT;
    rep.id = "stub";
    rep.role = "node";
    rep.map_epoch = c->map_epoch;
    c->reply_epoch = c->map_epoch;
    return rpc_reply_msg(c, &rep.base);
}

static kv_err stub_fail(rpc_ctx *c, const uint8_t *body, size_t len)
{
    return rpc_fail(c, KV_FAILED_PRECONDITION, "refused a %zu-byte body", len);
}

static const rpc_method methods[] = {
    {"kv.Get", stub_get},
    {"admin.Ping", stub_ping},
    {"kv.Put", stub_fail},
};

static void open_server(rpc_server **s, nng_socket *sock, const char *url, const char *auth)
{
    rpc_server_opts o = {.url = url,
                         .methods = methods,
                         .nmethods = sizeof(methods) / sizeof(methods[0]),
                         .workers = 2,
                         .auth = auth,
                         .recv_max = 1 << 20};
    char err[256];
    FZ_CHECK(rpc_server_open(s, &o, err, sizeof(err)) == KV_OK, "rpc_server_open: %s", err);
    FZ_CHECK(nng_req0_open(sock) == 0 && nng_dial(*sock, url, NULL, 0) == 0, "dial %s", url);
    nng_socket_set_ms(*sock, NNG_OPT_RECVTIMEO, 10000);
    nng_socket_set_ms(*sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fz_quiet();
    rpc_runtime_init(0);
    fz_peers_start();
    open_server(&srv, &req_sock, URL, NULL);
    open_server(&srv_auth, &req_auth, URL_AUTH, TOKEN);
    return 0;
}

/* What the server must answer to req (NULL: not an envelope). */
static void check_verdict(const Kv__Envelope *req, const Kv__Envelope *rep, bool auth)
{
    int code = rep->status ? rep->status->code : 0;
    if (!req) {
        FZ_CHECK(code == KV_INVALID_ARGUMENT, "garbage answered %d", code);
        return;
    }
    FZ_CHECK(rep->id == req->id, "reply id %llu for request %llu", (unsigned long long)rep->id,
             (unsigned long long)req->id);
    /* the token is bytes, compared over its full length (a NUL included) */
    bool token_ok = !auth || (req->auth.len == strlen(TOKEN) &&
                              memcmp(req->auth.data, TOKEN, req->auth.len) == 0);
    if (!token_ok)
        FZ_CHECK(code == KV_UNAUTHENTICATED, "wrong token answered %d", code);
    /* rpc.Calls is the server's own method (a batch of calls), not unknown */
    bool known = req->method && strcmp(req->method, "rpc.Calls") == 0;
    for (size_t i = 0; req->method && i < sizeof(methods) / sizeof(methods[0]); i++)
        known |= strcmp(req->method, methods[i].name) == 0;
    if (token_ok && !known)
        FZ_CHECK(code == KV_UNIMPLEMENTED, "unknown method answered %d", code);
}

static void server_side(const uint8_t *p, size_t n, bool auth)
{
    nng_socket s = auth ? req_auth : req_sock;
    nng_msg *m;
    FZ_CHECK(nng_msg_alloc(&m, n) == 0, "nng_msg_alloc");
    memcpy(nng_msg_body(m), p, n);
    FZ_CHECK(nng_sendmsg(s, m, 0) == 0, "send");
    nng_msg *r = NULL;
    int rv = nng_recvmsg(s, &r, 0);
    FZ_CHECK(rv == 0, "the server did not answer: %s", nng_strerror(rv));
    Kv__Envelope *rep = kv__envelope__unpack(NULL, nng_msg_len(r), nng_msg_body(r));
    FZ_CHECK(rep, "the reply is not an Envelope");
    int code = rep->status ? rep->status->code : 0;
    FZ_CHECK(code >= 0 && code < KV_ERR_COUNT_, "reply status %d", code);
    if (fz_strict())
        FZ_CHECK(fz_pb_strings_ok(&rep->base), "a string of the reply is not UTF-8: %s",
                 rep->status && rep->status->message ? rep->status->message : "");
    Kv__Envelope *req = kv__envelope__unpack(NULL, n, p);
    check_verdict(req, rep, auth);
    if (req)
        kv__envelope__free_unpacked(req, NULL);
    kv__envelope__free_unpacked(rep, NULL);
    nng_msg_free(r);
}

/* The scripted peer answers the call with the input, raw or enveloped. */
static void client_side(fz_in *in, bool enveloped)
{
    uint8_t script[3 + 65535 + 5];
    size_t len = in->n > 65535 ? 65535 : in->n;
    script[0] = 1;                    /* one reply */
    script[1] = in->n ? in->p[0] : 0; /* its status */
    script[2] = enveloped ? 0 : 4;    /* raw unless enveloped */
    script[3] = (uint8_t)len;
    script[4] = (uint8_t)(len >> 8);
    memcpy(script + 5, in->p, len);
    fz_in sin = {script, len + 5};
    fz_peers_script(&sin);
    rpc_chan *ch = NULL;
    FZ_CHECK(rpc_chan_open(&ch, "tcp://127.0.0.1:1", NULL) == KV_OK, "rpc_chan_open");
    for (int i = 0; i < 2000 && !rpc_chan_connected(ch); i++)
        nng_msleep(1); /* the wrapped channel waits only 1 ms for its connection */
    Kv__PingRequest req = KV__PING_REQUEST__INIT;
    rpc_reply r;
    kv_err rv = rpc_call(ch, "admin.Ping", 1, &req.base, 2000, &r);
    FZ_CHECK((int)rv >= 0 && rv < KV_ERR_COUNT_ && rv == r.status, "rpc_call returned %d", (int)rv);
    FZ_CHECK(!r.local || (rv != KV_DEADLINE_EXCEEDED && rv != KV_UNAVAILABLE),
             "the scripted reply was lost: %s", r.message ? r.message : "");
    rpc_reply_free(&r);
    rpc_chan_close(ch);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    uint8_t flags = fz_u8(&in);
    if (flags & 1)
        client_side(&in, flags & 2);
    else
        server_side(in.p, in.n, flags & 2);
    return 0;
}
