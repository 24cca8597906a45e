/* SPDX-License-Identifier: MIT */
/* The REQ/REP wire format on nng byte streams (proto/rpc_conn.c): a conn
 * talks to a plain nng REP socket (many messages in flight, one larger
 * than the read buffer), and a peer that is not a REP end, sends a header
 * without a request id, or a message over the bound, ends the connection
 * with the matching error, once, with no message after it. A channel on
 * streams fails a call whose connection is lost at once (UNAVAILABLE), not
 * at its deadline. ASan and TSan builds run this file too. */
#include "tests/kv_testfw.h"
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/supplemental/util/platform.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"
#include "proto/rpc_conn.h"

/* ---- a plain nng REP socket that echoes every request ------------------ */

typedef struct echo_ctx {
    nng_ctx ctx;
    nng_aio *aio;
    bool sending;
} echo_ctx;

static void echo_cb(void *arg)
{
    echo_ctx *e = arg;
    int rv = nng_aio_result(e->aio);
    if (rv == NNG_ECLOSED || rv == NNG_ECANCELED)
        return;
    if (!e->sending && rv == 0) {
        e->sending = true;
        nng_ctx_send(e->ctx, e->aio); /* the request goes back as its reply */
        return;
    }
    if (e->sending && rv != 0)
        nng_msg_free(nng_aio_get_msg(e->aio));
    e->sending = false;
    nng_ctx_recv(e->ctx, e->aio);
}

#define ECHO_CTXS 8
typedef struct echo_srv {
    nng_socket sock;
    echo_ctx ctxs[ECHO_CTXS];
    char url[64];
} echo_srv;

static void echo_start(echo_srv *s)
{
    nng_listener l;
    memset(s, 0, sizeof(*s));
    cr_assert_eq(nng_rep0_open(&s->sock), 0);
    nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, 0);
    cr_assert_eq(nng_listener_create(&l, s->sock, "tcp://127.0.0.1:0"), 0);
    cr_assert_eq(nng_listener_start(l, 0), 0);
    int port = 0;
    cr_assert_eq(nng_listener_get_int(l, NNG_OPT_TCP_BOUND_PORT, &port), 0);
    snprintf(s->url, sizeof(s->url), "tcp://127.0.0.1:%d", port);
    for (int i = 0; i < ECHO_CTXS; i++) {
        cr_assert_eq(nng_ctx_open(&s->ctxs[i].ctx, s->sock), 0);
        cr_assert_eq(nng_aio_alloc(&s->ctxs[i].aio, echo_cb, &s->ctxs[i]), 0);
        nng_ctx_recv(s->ctxs[i].ctx, s->ctxs[i].aio);
    }
}

static void echo_stop(echo_srv *s)
{
    for (int i = 0; i < ECHO_CTXS; i++)
        nng_aio_stop(s->ctxs[i].aio);
    nng_close(s->sock);
    for (int i = 0; i < ECHO_CTXS; i++)
        nng_aio_free(s->ctxs[i].aio);
}

/* ---- what a conn's callbacks saw ---------------------------------------- */

typedef struct seen {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ups, downs, down_rv;
    int frames, frames_after_down;
    size_t bytes;
    uint32_t ids_xor; /* of the request ids that came back */
    bool bad_body;    /* a body that is not what was sent for its id */
    uint8_t got[256]; /* replies per id (the first 256) */
} seen;

static seen g_seen;

/* request i's body: blen bytes of (i + offset) & 0xff */
static size_t body_len(uint32_t i)
{
    return i == 7 ? 300u * 1024u : 16u + (i * 37u) % 2000u; /* 7: larger than the read buffer */
}

static void on_up(void *arg, rpc_conn *c)
{
    (void)arg;
    (void)c;
    pthread_mutex_lock(&g_seen.mu);
    g_seen.ups++;
    pthread_cond_broadcast(&g_seen.cv);
    pthread_mutex_unlock(&g_seen.mu);
}

static void on_frame(void *arg, rpc_conn *c, const uint8_t *hdr, size_t hlen, nng_msg *body)
{
    (void)arg;
    (void)c;
    uint32_t id =
        hlen == 4
            ? ((uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3])
            : 0;
    uint32_t i = id & 0x7fffffffu;
    const uint8_t *b = nng_msg_body(body);
    bool ok = hlen == 4 && nng_msg_len(body) == body_len(i);
    for (size_t k = 0; ok && k < nng_msg_len(body); k++)
        ok = b[k] == (uint8_t)(i + k);
    pthread_mutex_lock(&g_seen.mu);
    g_seen.frames++;
    g_seen.frames_after_down += g_seen.downs > 0;
    g_seen.bytes += nng_msg_len(body);
    g_seen.ids_xor ^= id;
    if (i < 256)
        g_seen.got[i]++;
    g_seen.bad_body |= !ok;
    pthread_cond_broadcast(&g_seen.cv);
    pthread_mutex_unlock(&g_seen.mu);
    nng_msg_free(body);
}

static void on_down(void *arg, rpc_conn *c, int rv)
{
    (void)arg;
    (void)c;
    pthread_mutex_lock(&g_seen.mu);
    g_seen.downs++;
    g_seen.down_rv = rv;
    pthread_cond_broadcast(&g_seen.cv);
    pthread_mutex_unlock(&g_seen.mu);
}

static void seen_reset(void)
{
    pthread_mutex_init(&g_seen.mu, NULL);
    pthread_cond_init(&g_seen.cv, NULL);
    g_seen.ups = g_seen.downs = g_seen.down_rv = g_seen.frames = g_seen.frames_after_down = 0;
    g_seen.bytes = 0;
    g_seen.ids_xor = 0;
    g_seen.bad_body = false;
    memset(g_seen.got, 0, sizeof(g_seen.got));
}

/* Waits up to 5 s until *field reaches want. */
static void seen_wait(const int *field, int want)
{
    uint64_t end = kv_now_ns() + 5000000000ull;
    pthread_mutex_lock(&g_seen.mu);
    while (*field < want && kv_now_ns() < end) {
        pthread_mutex_unlock(&g_seen.mu);
        nng_msleep(2);
        pthread_mutex_lock(&g_seen.mu);
    }
    pthread_mutex_unlock(&g_seen.mu);
}

static const rpc_conn_cb cbs = {.up = on_up, .frame = on_frame, .down = on_down};

static nng_stream *dial(const char *url)
{
    nng_stream_dialer *d;
    nng_aio *aio;
    cr_assert_eq(nng_stream_dialer_alloc(&d, url), 0);
    cr_assert_eq(nng_aio_alloc(&aio, NULL, NULL), 0);
    nng_stream_dialer_dial(d, aio);
    nng_aio_wait(aio);
    cr_assert_eq(nng_aio_result(aio), 0, "dial %s", url);
    nng_stream *st = nng_aio_get_output(aio, 0);
    nng_aio_free(aio);
    nng_stream_dialer_free(d); /* the stream outlives its dialer */
    return st;
}

Test(rpc_conn, a_stream_talks_to_an_nng_rep_socket)
{
    seen_reset();
    echo_srv srv;
    echo_start(&srv);
    rpc_conn *c = rpc_conn_new(dial(srv.url), RPC_SP_REQ, RPC_SP_REP, 0, 0, &cbs);
    cr_assert(c);
    /* sent before the handshake is even written: they queue behind it */
    enum { N = 200 };
    uint32_t want_xor = 0;
    size_t want_bytes = 0;
    uint8_t *body = malloc(body_len(7));
    cr_assert(body);
    rpc_conn_start(c);
    for (uint32_t i = 0; i < N; i++) {
        uint32_t id = 0x80000000u | i;
        uint8_t hdr[4] = {(uint8_t)(id >> 24), (uint8_t)(id >> 16), (uint8_t)(id >> 8),
                          (uint8_t)id};
        for (size_t k = 0; k < body_len(i); k++)
            body[k] = (uint8_t)(i + k);
        cr_assert_eq(rpc_conn_send(c, hdr, 4, body, body_len(i)), 0);
        want_xor ^= id;
        want_bytes += body_len(i);
    }
    free(body);
    seen_wait(&g_seen.frames, N);
    cr_assert_eq(g_seen.ups, 1);
    int missing = -1;
    for (int i = 0; i < N && missing < 0; i++)
        missing = g_seen.got[i] != 1 ? i : -1;
    cr_assert_eq(g_seen.frames, N, "%d of %d replies (request %d: %d)", g_seen.frames, N, missing,
                 missing >= 0 ? g_seen.got[missing] : 0);
    cr_assert_eq(g_seen.ids_xor, want_xor);
    cr_assert_eq(g_seen.bytes, want_bytes);
    cr_assert_not(g_seen.bad_body, "a reply's body differs from its request's");
    cr_assert_eq(g_seen.downs, 0);
    rpc_conn_close(c);
    seen_wait(&g_seen.downs, 1);
    cr_assert_eq(rpc_conn_send(c, "\x80\0\0\1", 4, "x", 1), NNG_ECLOSED);
    rpc_conn_free(c);
    cr_assert_eq(g_seen.downs, 1, "down runs once");
    cr_assert_eq(g_seen.down_rv, NNG_ECLOSED);
    cr_assert_eq(g_seen.frames_after_down, 0);
    echo_stop(&srv);
}

/* ---- a raw stream peer that writes given bytes -------------------------- */

static const uint8_t rep_hs[8] = {0, 'S', 'P', 0, 0, 0x31, 0, 0}; /* a REP end's handshake */

typedef struct raw_peer {
    nng_stream_listener *l;
    char url[64];
    const uint8_t *bytes;
    size_t len;
    int delay_ms;      /* how long it waits after accepting before it writes (its handshake) */
    int hold_ms;       /* how long it keeps the connection, reading nothing (0: 300) */
    atomic_bool stop;  /* ends the hold early */
    bool lose;         /* instead: read what comes once, then close (a crash) */
    atomic_size_t got; /* what it read in lose mode */
    pthread_t th;
} raw_peer;

static void *raw_main(void *arg)
{
    raw_peer *p = arg;
    nng_aio *aio;
    cr_assert_eq(nng_aio_alloc(&aio, NULL, NULL), 0);
    nng_stream_listener_accept(p->l, aio);
    nng_aio_wait(aio);
    if (nng_aio_result(aio) == 0) {
        nng_stream *st = nng_aio_get_output(aio, 0);
        for (int t = 0; t < p->delay_ms && !atomic_load(&p->stop); t += 10)
            nng_msleep(10);
        nng_iov iov = {(void *)p->bytes, p->len};
        nng_aio_set_iov(aio, 1, &iov);
        nng_stream_send(st, aio);
        nng_aio_wait(aio);
        if (p->lose) {
            /* the handshake and the request: they may come apart */
            uint8_t buf[256];
            size_t got = 0;
            nng_aio_set_timeout(aio, 5000);
            while (got <= sizeof(rep_hs)) {
                iov = (nng_iov){buf, sizeof(buf)};
                nng_aio_set_iov(aio, 1, &iov);
                nng_stream_recv(st, aio);
                nng_aio_wait(aio);
                if (nng_aio_result(aio) != 0)
                    break;
                got += nng_aio_count(aio);
            }
            atomic_store(&p->got, got);
            nng_msleep(100);
        }
        for (int t = 0; !p->lose && t < (p->hold_ms ? p->hold_ms : 300) && !atomic_load(&p->stop);
             t += 10)
            nng_msleep(10); /* the conn ends it, not us */
        nng_stream_free(st);
    }
    nng_aio_free(aio);
    return NULL;
}

static void raw_start(raw_peer *p, const uint8_t *bytes, size_t len)
{
    p->bytes = bytes;
    p->len = len;
    cr_assert_eq(nng_stream_listener_alloc(&p->l, "tcp://127.0.0.1:0"), 0);
    cr_assert_eq(nng_stream_listener_listen(p->l), 0);
    int port = 0;
    cr_assert_eq(nng_stream_listener_get_int(p->l, NNG_OPT_TCP_BOUND_PORT, &port), 0);
    snprintf(p->url, sizeof(p->url), "tcp://127.0.0.1:%d", port);
    pthread_create(&p->th, NULL, raw_main, p);
}

static void raw_stop(raw_peer *p)
{
    pthread_join(p->th, NULL);
    nng_stream_listener_free(p->l);
}

/* The conn's end when the peer writes bytes: the error, after how many
 * messages. */
static void expect_end(const uint8_t *bytes, size_t len, size_t recv_max, int want_rv,
                       int want_frames)
{
    seen_reset();
    raw_peer p = {0};
    raw_start(&p, bytes, len);
    rpc_conn *c = rpc_conn_new(dial(p.url), RPC_SP_REQ, RPC_SP_REP, recv_max, 0, &cbs);
    cr_assert(c);
    rpc_conn_start(c);
    seen_wait(&g_seen.downs, 1);
    cr_assert_eq(g_seen.downs, 1, "the connection did not end");
    cr_assert_eq(g_seen.down_rv, want_rv, "ended with %s, not %s", nng_strerror(g_seen.down_rv),
                 nng_strerror(want_rv));
    cr_assert_eq(g_seen.frames, want_frames);
    cr_assert_eq(g_seen.frames_after_down, 0);
    rpc_conn_free(c);
    cr_assert_eq(g_seen.downs, 1, "down runs once");
    raw_stop(&p);
}

Test(rpc_conn, a_peer_that_is_not_a_rep_end_is_refused)
{
    static const uint8_t http[] = "HTTP/1.1 200 OK\r\n\r\n";
    expect_end(http, sizeof(http) - 1, 0, NNG_EPROTO, 0);
    static const uint8_t req_hs[8] = {0, 'S', 'P', 0, 0, 0x30, 0, 0}; /* another REQ end */
    expect_end(req_hs, sizeof(req_hs), 0, NNG_EPROTO, 0);
}

Test(rpc_conn, a_header_without_a_request_id_ends_the_connection)
{
    /* a good message, then one whose 9 header words lack the high bit */
    uint8_t b[8 + 8 + 5 + 8 + 40];
    size_t n = 0;
    memcpy(b, rep_hs, 8);
    n = 8;
    const uint8_t good[] = {0, 0, 0, 0, 0, 0, 0, 5, 0x80, 0, 0, 1, 'x'};
    memcpy(b + n, good, sizeof(good));
    n += sizeof(good);
    const uint8_t len40[8] = {0, 0, 0, 0, 0, 0, 0, 40};
    memcpy(b + n, len40, 8);
    n += 8;
    memset(b + n, 0x01, 40);
    n += 40;
    expect_end(b, n, 0, NNG_EPROTO, 1);
}

Test(rpc_conn, a_message_over_the_bound_ends_the_connection)
{
    uint8_t b[8 + 8 + 4];
    memcpy(b, rep_hs, 8);
    const uint8_t len[8] = {0, 0, 0, 0, 0, 0x10, 0, 0}; /* 1 MiB */
    memcpy(b + 8, len, 8);
    memcpy(b + 16, "\x80\0\0\1", 4);
    expect_end(b, sizeof(b), 64u * 1024u, NNG_EMSGSIZE, 0);
    /* with no bound of the caller's, a length near 2^64 is refused too (it
     * would wrap the arithmetic that checks whether it has all arrived) */
    memset(b + 8, 0xff, 8);
    b[15] = 0xf8;
    expect_end(b, sizeof(b), 0, NNG_EMSGSIZE, 0);
}

Test(rpc_conn, a_peer_that_reads_nothing_is_disconnected_past_out_max)
{
    seen_reset();
    raw_peer p = {.hold_ms = 20000};
    raw_start(&p, rep_hs, sizeof(rep_hs));
    rpc_conn *c = rpc_conn_new(dial(p.url), RPC_SP_REQ, RPC_SP_REP, 0, 256u * 1024u, &cbs);
    cr_assert(c);
    rpc_conn_start(c);
    seen_wait(&g_seen.ups, 1);
    static uint8_t body[64 * 1024];
    size_t sent = 0;
    int rv = 0;
    /* the kernel's buffers take a few MiB; then the write stays in flight
     * and what queues behind it passes 256 KiB */
    while (rv == 0 && sent < 512u * 1024u * 1024u) {
        rv = rpc_conn_send(c, "\x80\0\0\1", 4, body, sizeof(body));
        sent += rv == 0 ? sizeof(body) : 0;
    }
    cr_assert_eq(rv, NNG_ENOSPC, "after %zu bytes: %s", sent, nng_strerror(rv));
    seen_wait(&g_seen.downs, 1);
    cr_assert_eq(g_seen.downs, 1, "the connection did not end");
    cr_assert_eq(rpc_conn_send(c, "\x80\0\0\1", 4, "x", 1), NNG_ECLOSED);
    rpc_conn_free(c);
    cr_assert_eq(g_seen.downs, 1, "down runs once");
    atomic_store(&p.stop, true);
    raw_stop(&p);
}

/* ---- a channel on streams ------------------------------------------------ */

Test(rpc_conn, a_call_whose_connection_is_lost_fails_at_once)
{
    /* a REP end that reads the request and closes the connection without
     * answering: what a node that crashes under a call looks like */
    raw_peer p = {.lose = true};
    raw_start(&p, rep_hs, sizeof(rep_hs));
    rpc_chan *ch = NULL;
    cr_assert_eq(rpc_chan_open(&ch, p.url, NULL), KV_OK);
    Kv__GetRequest req = KV__GET_REQUEST__INIT;
    req.key = (ProtobufCBinaryData){1, (uint8_t *)"k"};
    rpc_reply r = {0};
    uint64_t t0 = kv_now_ns();
    kv_err rv = rpc_call(ch, "kv.Get", 0, &req.base, 10000, &r);
    uint64_t ms = (kv_now_ns() - t0) / 1000000ull;
    cr_assert_eq(rv, KV_UNAVAILABLE, "%s (%s)", kv_strerror(rv), r.message ? r.message : "");
    cr_assert(r.local);
    cr_assert(r.message && strstr(r.message, "lost"), "message: %s", r.message);
    cr_assert_lt(ms, 5000, "the call waited %llu ms, as for its deadline", (unsigned long long)ms);
    rpc_reply_free(&r);
    raw_stop(&p);
    rpc_chan_close(ch);
}

/* Starts peer p writing bytes[len] once it has waited p->delay_ms after
 * accepting, opens a channel to it with a 200 ms first connect wait, and,
 * 400 ms later (its TCP connection is up; its handshake is what is slow),
 * makes one call with the deadline given; *ms is how long the call took.
 * Stops the peer, closes the channel and returns the call's status. */
static kv_err call_past_first_wait(raw_peer *p, const uint8_t *bytes, size_t len,
                                   uint32_t deadline_ms, rpc_reply *r, uint64_t *ms)
{
    raw_start(p, bytes, len);
    rpc_chan *ch = NULL;
    rpc_chan_opts o = {.connect_wait_ms = 200};
    cr_assert_eq(rpc_chan_open(&ch, p->url, &o), KV_OK);
    nng_msleep(400);
    Kv__GetRequest req = KV__GET_REQUEST__INIT;
    req.key = (ProtobufCBinaryData){1, (uint8_t *)"k"};
    uint64_t t0 = kv_now_ns();
    kv_err rv = rpc_call(ch, "kv.Get", 0, &req.base, deadline_ms, r);
    *ms = (kv_now_ns() - t0) / 1000000ull;
    rpc_chan_close(ch);
    atomic_store(&p->stop, true);
    raw_stop(p);
    return rv;
}

/* A connection whose handshake is still running when the channel's first
 * connect wait ends is not "no connection": the call waits for it (a TLS
 * handshake between loaded processes took longer than the 1 s first wait,
 * and a router's first writes failed). Here the peer answers its
 * handshake after 800 ms, past a 200 ms first wait; it then reads the
 * request and drops the connection, so the call ends with "lost", which
 * it can only do if it was sent. */
Test(rpc_conn, a_call_waits_for_a_handshake_past_the_first_connect_wait)
{
    raw_peer p = {.lose = true, .delay_ms = 800};
    rpc_reply r = {0};
    uint64_t ms;
    kv_err rv = call_past_first_wait(&p, rep_hs, sizeof(rep_hs), 10000, &r, &ms);
    cr_assert_eq(rv, KV_UNAVAILABLE, "%s (%s)", kv_strerror(rv), r.message ? r.message : "");
    cr_assert(r.message && strstr(r.message, "lost"), "the call was not sent: %s", r.message);
    cr_assert_gt(atomic_load(&p.got), sizeof(rep_hs), "the peer read no request");
    rpc_reply_free(&r);
}

/* A peer that accepts but never answers its handshake (a stopped process:
 * the kernel still accepts) holds a call for no longer than its deadline,
 * and the call fails as having no connection. */
Test(rpc_conn, a_handshake_that_never_ends_costs_a_call_its_deadline_at_most)
{
    raw_peer p = {.delay_ms = 20000};
    rpc_reply r = {0};
    uint64_t ms;
    kv_err rv = call_past_first_wait(&p, rep_hs, sizeof(rep_hs), 500, &r, &ms);
    cr_assert_eq(rv, KV_UNAVAILABLE, "%s (%s)", kv_strerror(rv), r.message ? r.message : "");
    cr_assert(r.message && strstr(r.message, "no connection"), "message: %s", r.message);
    cr_assert_lt(ms, 5000, "the call took %llu ms with a 500 ms deadline", (unsigned long long)ms);
    rpc_reply_free(&r);
}

/* A handshake that fails (here the peer is not a REP end; a refused TLS
 * certificate ends the same way) past the first connect wait fails the
 * calls that were waiting for it at once, as it would a new call, not at
 * their deadlines. */
Test(rpc_conn, a_failed_handshake_fails_the_calls_waiting_for_it)
{
    static const uint8_t http[] = "HTTP/1.1 200 OK\r\n\r\n";
    raw_peer p = {.delay_ms = 800, .hold_ms = 20000};
    rpc_reply r = {0};
    uint64_t ms;
    kv_err rv = call_past_first_wait(&p, http, sizeof(http) - 1, 15000, &r, &ms);
    cr_assert_eq(rv, KV_UNAVAILABLE, "%s (%s)", kv_strerror(rv), r.message ? r.message : "");
    cr_assert(r.message && strstr(r.message, "no connection"), "message: %s", r.message);
    cr_assert_lt(ms, 10000, "the call waited %llu ms, as for its deadline", (unsigned long long)ms);
    rpc_reply_free(&r);
}

typedef struct async_end {
    atomic_int status; /* -1 until the call ends */
    atomic_uint_fast64_t at_ns;
    char message[160];
} async_end;

static void async_done(void *arg, rpc_reply *r)
{
    async_end *e = arg;
    snprintf(e->message, sizeof(e->message), "%s", r->message ? r->message : "");
    atomic_store(&e->at_ns, kv_now_ns());
    atomic_store(&e->status, (int)r->status);
    rpc_reply_free(r);
}

/* A call made during the first connect wait to an address that refuses
 * connections fails at the first refused dial after that wait, as a new
 * call would at once, not at its deadline: both ways a channel dials (on
 * hotkv's loops, and with nng's stream dialer). */
Test(rpc_conn, a_call_waiting_for_a_refused_address_fails_after_the_first_wait)
{
    nng_stream_listener *l; /* a port that was just free, closed again */
    cr_assert_eq(nng_stream_listener_alloc(&l, "tcp://127.0.0.1:0"), 0);
    cr_assert_eq(nng_stream_listener_listen(l), 0);
    int port = 0;
    cr_assert_eq(nng_stream_listener_get_int(l, NNG_OPT_TCP_BOUND_PORT, &port), 0);
    nng_stream_listener_free(l);
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
    for (int nng_dialer = 0; nng_dialer < 2; nng_dialer++) {
        const char *how = nng_dialer ? "nng's dialer" : "the loops";
        if (nng_dialer)
            setenv("KV_RPC_NNG_STREAMS", "1", 1);
        rpc_chan *ch = NULL;
        rpc_chan_opts o = {.connect_wait_ms = 300};
        cr_assert_eq(rpc_chan_open(&ch, url, &o), KV_OK);
        Kv__GetRequest req = KV__GET_REQUEST__INIT;
        req.key = (ProtobufCBinaryData){1, (uint8_t *)"k"};
        async_end e = {.status = -1};
        uint64_t t0 = kv_now_ns();
        rpc_call_async(ch, "kv.Get", 0, &req.base, 15000, async_done, &e);
        for (int i = 0; i < 2000 && atomic_load(&e.status) < 0; i++)
            nng_msleep(10);
        cr_assert_eq(atomic_load(&e.status), KV_UNAVAILABLE, "%s: %d (%s)", how,
                     atomic_load(&e.status), e.message);
        cr_assert(strstr(e.message, "no connection"), "%s: message: %s", how, e.message);
        uint64_t ms = (atomic_load(&e.at_ns) - t0) / 1000000ull;
        cr_assert_lt(ms, 10000, "%s: the call waited %llu ms, as for its deadline", how,
                     (unsigned long long)ms);
        rpc_chan_close(ch);
    }
    unsetenv("KV_RPC_NNG_STREAMS");
}
