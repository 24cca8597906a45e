/* SPDX-License-Identifier: MIT */
/* Issue 16 in the RPC runtime: overload (item 5: deadlines count from
 * arrival, a call that expired in the queue is not run, excess load is
 * refused at once with RESOURCE_EXHAUSTED), deadlines past 2^31 ms (item 7),
 * what a request may make the server allocate (item 4), valid UTF-8 in every
 * status message (item 9), and the helpers behind them (rpc_util.c). None of
 * the tests depends on timing for its verdict: a worker is held on a gate,
 * the server's counters say when a call is queued, and a sleep only makes
 * sure a deadline has passed. Labelled tsan. */
#include "tests/kv_testfw.h"
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"

/* ---- a server whose one worker can be held ----------------------------- */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static bool g_open;    /* the gate lets test.Gate return */
static int g_in_gate;  /* test.Gate calls inside the handler */
static char g_put[64]; /* the key of the last test.Put that ran */
static int g_puts;
static uint32_t g_seen_ms; /* remaining ms test.Echo saw */

static kv_err h_gate(rpc_ctx *c, const uint8_t *body, size_t len)
{
    pthread_mutex_lock(&g_mu);
    g_in_gate++;
    pthread_cond_broadcast(&g_cv);
    while (!g_open)
        pthread_cond_wait(&g_cv, &g_mu);
    g_in_gate--;
    pthread_mutex_unlock(&g_mu);
    return KV_OK;
}

/* Records the key of a GetRequest body as "written". */
static kv_err h_put(rpc_ctx *c, const uint8_t *body, size_t len)
{
    Kv__GetRequest *req = kv__get_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "bad body");
    pthread_mutex_lock(&g_mu);
    snprintf(g_put, sizeof(g_put), "%.*s", (int)req->key.len, (char *)req->key.data);
    g_puts++;
    pthread_mutex_unlock(&g_mu);
    kv__get_request__free_unpacked(req, NULL);
    return KV_OK;
}

static kv_err h_echo(rpc_ctx *c, const uint8_t *body, size_t len)
{
    pthread_mutex_lock(&g_mu);
    g_seen_ms = rpc_ctx_remaining_ms(c);
    pthread_mutex_unlock(&g_mu);
    return KV_OK;
}

/* Fails with the request body's bytes in the message (a handler echoing
 * what it was sent). */
static kv_err h_bytes(rpc_ctx *c, const uint8_t *body, size_t len)
{
    return rpc_fail(c, KV_NOT_FOUND, "no '%.*s' here", (int)len, (const char *)body);
}

static const rpc_method methods[] = {
    {"test.Gate", h_gate}, {"test.Put", h_put}, {"test.Echo", h_echo}, {"test.Bytes", h_bytes}};

static rpc_server *start(unsigned max_inflight, char *url, size_t urllen)
{
    pthread_mutex_lock(&g_mu);
    g_open = false;
    g_in_gate = 0;
    g_put[0] = '\0';
    g_puts = 0;
    pthread_mutex_unlock(&g_mu);
    rpc_server_opts o = {.url = "tcp://127.0.0.1:0",
                         .methods = methods,
                         .nmethods = sizeof(methods) / sizeof(methods[0]),
                         .workers = 1,
                         .max_inflight = max_inflight};
    rpc_server *s = NULL;
    char err[256];
    cr_assert_eq(rpc_server_open(&s, &o, err, sizeof(err)), KV_OK, "%s", err);
    snprintf(url, urllen, "tcp://127.0.0.1:%d", rpc_server_port(s));
    return s;
}

static void open_gate(void)
{
    pthread_mutex_lock(&g_mu);
    g_open = true;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

static void wait_in_gate(void)
{
    pthread_mutex_lock(&g_mu);
    while (g_in_gate == 0)
        pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
}

/* Waits until the server has n calls in flight (admitted, not answered). */
static void wait_inflight(rpc_server *s, unsigned n)
{
    for (int i = 0; i < 5000; i++) {
        rpc_server_counters k;
        rpc_server_counters_get(s, &k);
        if (k.inflight >= n)
            return;
        nng_msleep(2);
    }
    cr_assert(false, "the server never had %u calls in flight", n);
}

/* Waits until the server has answered everything it admitted. */
/* A raw REQ socket (no rpc_chan) dialed to url; receives wait recv_ms. */
static nng_socket raw_dial(const char *url, int recv_ms)
{
    nng_socket sock;
    cr_assert_eq(nng_req0_open(&sock), 0);
    nng_socket_set_ms(sock, NNG_OPT_RECVTIMEO, recv_ms);
    cr_assert_eq(nng_dial(sock, url, NULL, 0), 0);
    return sock;
}

/* Receives one reply on sock: its envelope (the caller frees it). */
static Kv__Envelope *raw_recv(nng_socket sock)
{
    char *buf = NULL;
    size_t len = 0;
    cr_assert_eq(nng_recv(sock, &buf, &len, NNG_FLAG_ALLOC), 0);
    Kv__Envelope *rep = kv__envelope__unpack(NULL, len, (uint8_t *)buf);
    cr_assert_not_null(rep);
    nng_free(buf, len);
    return rep;
}

static void wait_inflight0(rpc_server *s)
{
    for (int i = 0; i < 5000; i++) {
        rpc_server_counters k;
        rpc_server_counters_get(s, &k);
        if (k.inflight == 0)
            return;
        nng_msleep(2);
    }
    cr_assert(false, "calls stayed in flight");
}

typedef struct pending {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    rpc_reply r;
} pending;

static void pending_done(void *arg, rpc_reply *r)
{
    pending *p = arg;
    pthread_mutex_lock(&p->mu);
    p->r = *r;
    p->done = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static void pending_init(pending *p)
{
    memset(p, 0, sizeof(*p));
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
}

static kv_err pending_wait(pending *p)
{
    pthread_mutex_lock(&p->mu);
    while (!p->done)
        pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    return p->r.status;
}

static void pending_fini(pending *p)
{
    rpc_reply_free(&p->r);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
}

static void call_async(rpc_chan *ch, const char *method, const char *key, uint32_t dl, pending *p)
{
    Kv__GetRequest req = KV__GET_REQUEST__INIT;
    req.key = (ProtobufCBinaryData){strlen(key), (uint8_t *)key};
    pending_init(p);
    rpc_call_async(ch, method, 0, &req.base, dl, pending_done, p);
}

/* A channel that sends every call in a message of its own (no rpc.Calls),
 * connected before the test goes on. */
static rpc_chan *chan(const char *url)
{
    rpc_chan *ch;
    rpc_chan_opts o = {.coalesce_after = -1};
    cr_assert_eq(rpc_chan_open(&ch, url, &o), KV_OK);
    rpc_reply r;
    cr_assert_eq(rpc_call(ch, "test.Echo", 0, NULL, 2000, &r), KV_OK);
    rpc_reply_free(&r);
    return ch;
}

/* ---- item 5 -------------------------------------------------------------- */

/* A put queued behind a busy worker whose deadline passes in the queue is
 * answered DEADLINE_EXCEEDED and never runs (it used to run once a worker
 * took it, with a deadline counted from then). */
Test(overload, a_call_that_expired_in_the_queue_is_not_run)
{
    char url[64];
    rpc_server *s = start(0, url, sizeof(url));
    rpc_chan *ch = chan(url);
    pending gate, put;
    call_async(ch, "test.Gate", "g", 10000, &gate);
    wait_in_gate(); /* the only worker is busy */
    call_async(ch, "test.Put", "late", 100, &put);
    wait_inflight(s, 2); /* the put arrived and waits in the queue */
    nng_msleep(300);     /* its deadline (from its arrival) has passed */
    open_gate();
    cr_assert_eq(pending_wait(&gate), KV_OK);
    cr_assert_eq(pending_wait(&put), KV_DEADLINE_EXCEEDED);
    /* the client gave up by itself; the server's word comes as its reply,
     * which the channel drops: the counter and the handler tell */
    rpc_server_counters k;
    for (int i = 0; i < 1000; i++) {
        rpc_server_counters_get(s, &k);
        if (k.expired >= 1 && k.inflight == 0)
            break;
        nng_msleep(2);
    }
    cr_assert_eq(k.expired, 1, "the expired put was dropped before its handler");
    pthread_mutex_lock(&g_mu);
    int puts = g_puts;
    pthread_mutex_unlock(&g_mu);
    cr_assert_eq(puts, 0, "the expired put was not executed");
    /* a put that does not wait runs */
    pending ok;
    call_async(ch, "test.Put", "fresh", 2000, &ok);
    cr_assert_eq(pending_wait(&ok), KV_OK);
    pthread_mutex_lock(&g_mu);
    cr_assert_str_eq(g_put, "fresh");
    pthread_mutex_unlock(&g_mu);
    pending_fini(&gate);
    pending_fini(&put);
    pending_fini(&ok);
    rpc_chan_close(ch);
    rpc_server_close(s);
}

/* The same through the server's own reply: a raw client that waits longer
 * than the call's deadline reads DEADLINE_EXCEEDED from the server. */
Test(overload, the_server_answers_an_expired_call_deadline_exceeded)
{
    char url[64];
    rpc_server *s = start(0, url, sizeof(url));
    rpc_chan *ch = chan(url);
    pending gate;
    call_async(ch, "test.Gate", "g", 10000, &gate);
    wait_in_gate();
    nng_socket sock = raw_dial(url, 10000);
    Kv__GetRequest req = KV__GET_REQUEST__INIT;
    req.key = (ProtobufCBinaryData){3, (uint8_t *)"raw"};
    uint8_t body[32], pk[128];
    size_t blen = kv__get_request__pack(&req, body);
    Kv__Envelope env = KV__ENVELOPE__INIT;
    env.id = 77;
    env.method = "test.Put";
    env.deadline_ms = 100;
    env.body = (ProtobufCBinaryData){blen, body};
    size_t n = kv__envelope__pack(&env, pk);
    cr_assert_eq(nng_send(sock, pk, n, 0), 0);
    wait_inflight(s, 2);
    nng_msleep(300);
    open_gate();
    Kv__Envelope *rep = raw_recv(sock);
    cr_assert_eq(rep->id, 77);
    cr_assert_eq(rep->status->code, KV_DEADLINE_EXCEEDED);
    cr_assert(strstr(rep->status->message, "queue") != NULL, "%s", rep->status->message);
    kv__envelope__free_unpacked(rep, NULL);
    nng_close(sock);
    pthread_mutex_lock(&g_mu);
    cr_assert_eq(g_puts, 0, "not executed");
    pthread_mutex_unlock(&g_mu);
    pending_wait(&gate);
    pending_fini(&gate);
    rpc_chan_close(ch);
    rpc_server_close(s);
}

/* With max_inflight calls admitted and unanswered, one more is refused at
 * once with RESOURCE_EXHAUSTED (not queued); once they are answered, calls
 * are admitted again. */
Test(overload, calls_over_max_inflight_are_refused_at_once)
{
    char url[64];
    rpc_server *s = start(2, url, sizeof(url));
    rpc_chan *ch = chan(url);
    pending gate, queued, over;
    call_async(ch, "test.Gate", "g", 10000, &gate);
    wait_in_gate();
    call_async(ch, "test.Put", "queued", 10000, &queued);
    wait_inflight(s, 2);
    call_async(ch, "test.Put", "over", 10000, &over);
    cr_assert_eq(pending_wait(&over), KV_RESOURCE_EXHAUSTED, "refused while the gate is shut");
    cr_assert(over.r.message && strstr(over.r.message, "in flight"), "%s",
              over.r.message ? over.r.message : "");
    cr_assert(!over.r.local, "the server said so");
    rpc_server_counters k;
    rpc_server_counters_get(s, &k);
    cr_assert_eq(k.shed, 1);
    open_gate();
    cr_assert_eq(pending_wait(&gate), KV_OK);
    cr_assert_eq(pending_wait(&queued), KV_OK);
    pthread_mutex_lock(&g_mu);
    cr_assert_str_eq(g_put, "queued", "the refused put did not run");
    cr_assert_eq(g_puts, 1);
    pthread_mutex_unlock(&g_mu);
    pending again;
    call_async(ch, "test.Put", "again", 2000, &again);
    cr_assert_eq(pending_wait(&again), KV_OK);
    pending_fini(&gate);
    pending_fini(&queued);
    pending_fini(&over);
    pending_fini(&again);
    rpc_chan_close(ch);
    rpc_server_close(s);
}

/* A call arriving while the oldest queued call has waited more than half
 * of the new call's deadline is refused at once: it would likely expire in
 * the queue. A call with a longer deadline is still admitted. */
Test(overload, a_slow_queue_refuses_calls_with_short_deadlines)
{
    char url[64];
    rpc_server *s = start(0, url, sizeof(url));
    rpc_chan *ch = chan(url);
    pending gate, queued, shortdl, longdl;
    call_async(ch, "test.Gate", "g", 20000, &gate);
    wait_in_gate();
    call_async(ch, "test.Put", "queued", 20000, &queued);
    wait_inflight(s, 2);
    nng_msleep(150); /* the queued put has waited 150 ms at least */
    call_async(ch, "test.Put", "short", 200, &shortdl);
    cr_assert_eq(pending_wait(&shortdl), KV_RESOURCE_EXHAUSTED);
    cr_assert(shortdl.r.message && strstr(shortdl.r.message, "wait"), "%s",
              shortdl.r.message ? shortdl.r.message : "");
    call_async(ch, "test.Put", "long", 20000, &longdl);
    wait_inflight(s, 3);
    open_gate();
    cr_assert_eq(pending_wait(&queued), KV_OK);
    cr_assert_eq(pending_wait(&longdl), KV_OK);
    cr_assert_eq(pending_wait(&gate), KV_OK);
    pthread_mutex_lock(&g_mu);
    cr_assert_eq(g_puts, 2, "queued and long ran, short did not");
    pthread_mutex_unlock(&g_mu);
    pending_fini(&gate);
    pending_fini(&queued);
    pending_fini(&shortdl);
    pending_fini(&longdl);
    rpc_chan_close(ch);
    rpc_server_close(s);
}

static void close_gate(void)
{
    pthread_mutex_lock(&g_mu);
    g_open = false;
    pthread_mutex_unlock(&g_mu);
}

/* When the calls a server answered lately took more than half of their
 * deadlines (arrival to reply: a router waiting on slow nodes, whose own
 * queue stays short), new calls are refused while calls are in flight; an
 * idle server admits again. */
Test(overload, a_slow_server_refuses_calls_while_busy)
{
    char url[64];
    rpc_server *s = start(0, url, sizeof(url));
    rpc_chan *ch = chan(url);
    for (int i = 0; i < 4; i++) { /* each takes 150 ms of its 100 */
        pending slow;
        close_gate();
        call_async(ch, "test.Gate", "g", 100, &slow);
        wait_in_gate();
        nng_msleep(150);
        open_gate();
        pending_wait(&slow);
        pending_fini(&slow);
        wait_inflight0(s);
    }
    pending busy, refused, later;
    close_gate();
    call_async(ch, "test.Gate", "g", 10000, &busy);
    wait_in_gate();
    call_async(ch, "test.Put", "refused", 10000, &refused);
    cr_assert_eq(pending_wait(&refused), KV_RESOURCE_EXHAUSTED);
    cr_assert(refused.r.message && strstr(refused.r.message, "deadlines"), "%s",
              refused.r.message ? refused.r.message : "");
    open_gate();
    cr_assert_eq(pending_wait(&busy), KV_OK);
    wait_inflight0(s);
    call_async(ch, "test.Put", "later", 10000, &later); /* idle: admitted */
    cr_assert_eq(pending_wait(&later), KV_OK);
    pthread_mutex_lock(&g_mu);
    cr_assert_str_eq(g_put, "later");
    cr_assert_eq(g_puts, 1);
    pthread_mutex_unlock(&g_mu);
    pending_fini(&busy);
    pending_fini(&refused);
    pending_fini(&later);
    rpc_chan_close(ch);
    rpc_server_close(s);
}

/* The calls of an rpc.Calls message count one each against max_inflight,
 * and each keeps its own deadline from the message's arrival. */
Test(overload, coalesced_calls_are_admitted_and_expire_one_by_one)
{
    char url[64];
    rpc_server *s = start(0, url, sizeof(url));
    rpc_chan *ch = chan(url);
    pending gate;
    call_async(ch, "test.Gate", "g", 20000, &gate);
    wait_in_gate();
    /* by hand: one rpc.Calls with a put of 100 ms and one of 20 s */
    nng_socket sock = raw_dial(url, 10000);
    uint8_t b1[32], b2[32];
    Kv__GetRequest r1 = KV__GET_REQUEST__INIT, r2 = KV__GET_REQUEST__INIT;
    r1.key = (ProtobufCBinaryData){2, (uint8_t *)"k1"};
    r2.key = (ProtobufCBinaryData){2, (uint8_t *)"k2"};
    Kv__Envelope e[2] = {KV__ENVELOPE__INIT, KV__ENVELOPE__INIT}, *ep[2] = {&e[0], &e[1]};
    e[0].id = 1;
    e[0].method = "test.Put";
    e[0].deadline_ms = 100;
    e[0].body = (ProtobufCBinaryData){kv__get_request__pack(&r1, b1), b1};
    e[1].id = 2;
    e[1].method = "test.Put";
    e[1].deadline_ms = 20000;
    e[1].body = (ProtobufCBinaryData){kv__get_request__pack(&r2, b2), b2};
    Kv__Calls calls = KV__CALLS__INIT;
    calls.n_calls = 2;
    calls.calls = ep;
    uint8_t cb[256], pk[512];
    Kv__Envelope outer = KV__ENVELOPE__INIT;
    outer.id = 5;
    outer.method = "rpc.Calls";
    outer.deadline_ms = 20000;
    outer.body = (ProtobufCBinaryData){kv__calls__pack(&calls, cb), cb};
    size_t n = kv__envelope__pack(&outer, pk);
    cr_assert_eq(nng_send(sock, pk, n, 0), 0);
    wait_inflight(s, 3); /* the gate and both calls */
    nng_msleep(300);
    open_gate();
    Kv__Envelope *rep = raw_recv(sock);
    cr_assert_eq(rep->status ? rep->status->code : 0, KV_OK);
    Kv__Calls *cr = kv__calls__unpack(NULL, rep->body.len, rep->body.data);
    cr_assert_not_null(cr);
    cr_assert_eq(cr->n_calls, 2);
    cr_assert_eq(cr->calls[0]->status->code, KV_DEADLINE_EXCEEDED);
    cr_assert_eq(cr->calls[1]->status ? cr->calls[1]->status->code : 0, KV_OK);
    kv__calls__free_unpacked(cr, NULL);
    kv__envelope__free_unpacked(rep, NULL);
    nng_close(sock);
    pthread_mutex_lock(&g_mu);
    cr_assert_eq(g_puts, 1);
    cr_assert_str_eq(g_put, "k2");
    pthread_mutex_unlock(&g_mu);
    pending_wait(&gate);
    pending_fini(&gate);
    rpc_chan_close(ch);
    rpc_server_close(s);
}

/* ---- item 7 -------------------------------------------------------------- */

/* deadline_ms >= 2^31 (up to 2^32 - 1) is cut to RPC_MAX_DEADLINE_MS: the
 * handler sees a sane deadline, and a client asking for one gets its reply
 * (a negative nng duration used to time the call out at once while the
 * server ran it). */
Test(overload, deadlines_past_two_to_the_31_are_cut)
{
    char url[64];
    rpc_server *s = start(0, url, sizeof(url));
    rpc_chan *ch = chan(url);
    open_gate();
    rpc_reply r;
    uint32_t huge[] = {0x80000000u, 0x80000010u, 0xffffffffu};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(rpc_call(ch, "test.Echo", 0, NULL, huge[i], &r), KV_OK, "deadline %u: %s",
                     huge[i], r.message ? r.message : "");
        rpc_reply_free(&r);
        pthread_mutex_lock(&g_mu);
        uint32_t seen = g_seen_ms;
        pthread_mutex_unlock(&g_mu);
        cr_assert(seen <= RPC_MAX_DEADLINE_MS && seen > RPC_MAX_DEADLINE_MS - 60000,
                  "the handler saw %u ms left", seen);
    }
    /* the same from a raw client, past the channel's own clamp */
    nng_socket sock = raw_dial(url, 5000);
    Kv__Envelope env = KV__ENVELOPE__INIT;
    env.id = 3;
    env.method = "test.Echo";
    env.deadline_ms = 0xfffffff0u;
    uint8_t pk[64];
    size_t n = kv__envelope__pack(&env, pk);
    cr_assert_eq(nng_send(sock, pk, n, 0), 0);
    Kv__Envelope *rep = raw_recv(sock);
    cr_assert_eq(rep->status ? rep->status->code : 0, KV_OK);
    kv__envelope__free_unpacked(rep, NULL);
    nng_close(sock);
    pthread_mutex_lock(&g_mu);
    cr_assert(g_seen_ms <= RPC_MAX_DEADLINE_MS, "%u", g_seen_ms);
    pthread_mutex_unlock(&g_mu);
    rpc_chan_close(ch);
    rpc_server_close(s);
}

/* ---- items 4 and 9 ------------------------------------------------------- */

/* Sends raw bytes as a request and returns the reply envelope (the
 * caller frees it). */
static Kv__Envelope *raw_call(const char *url, const void *p, size_t n)
{
    nng_socket sock = raw_dial(url, 20000);
    nng_msg *m;
    cr_assert_eq(nng_msg_alloc(&m, n), 0);
    memcpy(nng_msg_body(m), p, n);
    cr_assert_eq(nng_sendmsg(sock, m, 0), 0);
    Kv__Envelope *rep = raw_recv(sock);
    nng_close(sock);
    return rep;
}

/* An envelope of millions of tiny unknown fields, and an rpc.Calls message
 * of millions of empty calls, are refused without unpacking them whole
 * (protobuf-c takes a struct per field scanned: gigabytes). */
Test(overload, what_a_message_may_allocate_is_bounded)
{
    char url[64];
    rpc_server *s = start(0, url, sizeof(url));
    open_gate();
    size_t n = 8u << 20;
    uint8_t *p = malloc(n);
    for (size_t i = 0; i < n; i += 2) { /* field 15, varint 0, repeated */
        p[i] = 15 << 3;
        p[i + 1] = 0;
    }
    uint64_t t0 = kv_now_ns();
    Kv__Envelope *rep = raw_call(url, p, n);
    cr_assert_eq(rep->status->code, KV_INVALID_ARGUMENT);
    kv__envelope__free_unpacked(rep, NULL);
    /* rpc.Calls with 4M empty calls: refused by count before unpacking */
    for (size_t i = 0; i < n; i += 2) {
        p[i] = (1 << 3) | 2; /* Calls.calls, length-delimited */
        p[i + 1] = 0;
    }
    Kv__Envelope env = KV__ENVELOPE__INIT;
    env.id = 4;
    env.method = "rpc.Calls";
    env.body = (ProtobufCBinaryData){n, p};
    size_t en = kv__envelope__get_packed_size(&env);
    uint8_t *pk = malloc(en);
    kv__envelope__pack(&env, pk);
    rep = raw_call(url, pk, en);
    cr_assert_eq(rep->status->code, KV_INVALID_ARGUMENT);
    cr_assert(strstr(rep->status->message, "limit") != NULL, "%s", rep->status->message);
    kv__envelope__free_unpacked(rep, NULL);
    cr_assert_lt((kv_now_ns() - t0) / 1000000, 10000, "refused quickly");
    free(pk);
    free(p);
    rpc_chan *ch = chan(url);
    rpc_reply r;
    cr_assert_eq(rpc_call(ch, "test.Echo", 0, NULL, 2000, &r), KV_OK, "still serving");
    rpc_reply_free(&r);
    rpc_chan_close(ch);
    rpc_server_close(s);
}

/* Status messages are valid UTF-8 whatever a request carried: an unknown
 * method's name and bytes a handler echoes are escaped (\xNN). */
Test(overload, status_messages_are_utf8)
{
    char url[64];
    rpc_server *s = start(0, url, sizeof(url));
    open_gate();
    Kv__Envelope env = KV__ENVELOPE__INIT;
    env.id = 1;
    env.method = "kv.\xff\x06t\xc3";
    uint8_t pk[256];
    size_t n = kv__envelope__pack(&env, pk);
    Kv__Envelope *rep = raw_call(url, pk, n);
    cr_assert_eq(rep->status->code, KV_UNIMPLEMENTED);
    cr_assert(rpc_utf8_valid(rep->status->message), "%s", rep->status->message);
    cr_assert(strstr(rep->status->message, "kv.\\xff\x06t\\xc3") != NULL, "%s",
              rep->status->message);
    kv__envelope__free_unpacked(rep, NULL);
    env.method = "test.Bytes";
    env.body = (ProtobufCBinaryData){6, (uint8_t *)"a\xe2\x82\xac\xed\xa0"}; /* a, euro, bad */
    n = kv__envelope__pack(&env, pk);
    rep = raw_call(url, pk, n);
    cr_assert_eq(rep->status->code, KV_NOT_FOUND);
    cr_assert_str_eq(rep->status->message, "no 'a\xe2\x82\xac\\xed\\xa0' here");
    kv__envelope__free_unpacked(rep, NULL);
    rpc_server_close(s);
}

/* ---- rpc_util.c ---------------------------------------------------------- */

Test(overload, utf8_escape_keeps_characters_and_escapes_the_rest)
{
    char out[64];
    cr_assert(rpc_utf8_valid("plain ascii"));
    cr_assert(rpc_utf8_valid("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
    cr_assert(!rpc_utf8_valid("\xc0\xaf"));         /* overlong '/' */
    cr_assert(!rpc_utf8_valid("\xed\xa0\x80"));     /* a surrogate */
    cr_assert(!rpc_utf8_valid("\xf4\x90\x80\x80")); /* past U+10FFFF */
    cr_assert(!rpc_utf8_valid("\xe2\x82"));         /* cut */
    rpc_utf8_escape("a\xffz\xc3\xa9", out, sizeof(out));
    cr_assert_str_eq(out, "a\\xffz\xc3\xa9");
    rpc_utf8_escape("\xff\xff\xff", out, 9); /* room for two escapes only */
    cr_assert_str_eq(out, "\\xff\\xff");
    rpc_utf8_escape("ab\xe2\x82\xac", out, 5); /* the euro sign does not fit whole */
    cr_assert_str_eq(out, "ab");
    char buf[16] = "x\x80y";
    rpc_utf8_fix(buf, sizeof(buf));
    cr_assert_str_eq(buf, "x\\x80y");
    char *d = rpc_utf8_dup("\xfe");
    cr_assert_str_eq(d, "\\xfe");
    free(d);
}

Test(overload, wire_count_and_budget)
{
    /* BatchRequest: ops (1) three times, consistency (2) once */
    const uint8_t b[] = {0x0a, 0x00, 0x0a, 0x02, 0x12, 0x00, 0x10, 0x02, 0x0a, 0x00};
    size_t n = 0;
    cr_assert(rpc_pb_count(b, sizeof(b), 1, &n));
    cr_assert_eq(n, 3);
    cr_assert(rpc_pb_count(b, sizeof(b), 2, &n));
    cr_assert_eq(n, 1);
    cr_assert(!rpc_pb_count(b, sizeof(b) - 1, 1, &n), "a length past the end");
    const uint8_t bad[] = {0x0b}; /* a group */
    cr_assert(!rpc_pb_count(bad, 1, 1, &n));
    cr_assert(rpc_pb_count(NULL, 0, 1, &n) && n == 0);
    /* the same bytes unpack within a budget, not within a tiny one */
    Kv__BatchRequest *req = (Kv__BatchRequest *)rpc_unpack(&kv__batch_request__descriptor,
                                                           sizeof(b), b, rpc_unpack_budget(10, 3));
    cr_assert_not_null(req);
    cr_assert_eq(req->n_ops, 3);
    kv__batch_request__free_unpacked(req, NULL);
    cr_assert_null(rpc_unpack(&kv__batch_request__descriptor, sizeof(b), b, 64));
    rpc_budget bud;
    cr_assert_null(kv__batch_request__unpack(rpc_budget_init(&bud, 64), sizeof(b), b));
}
