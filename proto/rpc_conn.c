/* SPDX-License-Identifier: MIT */
/*
 * rpc_conn: nng's REQ/REP wire format on an nng byte stream (rpc_conn.h).
 *
 * Reading: one receive is posted at a time into a buffer of CONN_BUF bytes;
 * its completion (nng task thread) hands every complete message in the
 * buffer to cb.frame, keeps a partial one for the next read, and posts the
 * next receive. A message larger than the buffer is read straight into its
 * own nng message. Only the reading side calls cb.down, so no frame follows
 * it; a failed write, rpc_conn_close and rpc_conn_free close the stream,
 * which ends the pending receive.
 *
 * Writing: messages are appended to `out` under mu; when no write is in
 * flight, the appender swaps `out` with `wbuf` and writes all of it at
 * once. The write's completion writes what it has not yet, then swaps
 * again if more was appended meanwhile. So at most one write is in flight
 * and a burst of replies leaves in one system call.
 */
#include "proto/rpc_conn.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define CONN_BUF (64u * 1024u)   /* read buffer */
#define OUT_MIN (16u * 1024u)    /* write buffers start here */
#define OUT_KEEP (1024u * 1024u) /* a write buffer over this is freed after use */
#define HS_LEN 8u
/* Past any bound a caller may set: no length arithmetic below can wrap. */
#define RPC_CONN_MAX ((uint64_t)1 << 40)

struct rpc_conn {
    nng_stream *st;
    nng_aio *rd, *wr;
    rpc_conn_cb cb;
    uint16_t self, peer;
    size_t recv_max;
    size_t out_max; /* queued bytes past which the connection ends (0 = none) */
    /* reading: the receive's completion only (one at a time) */
    uint8_t *in;
    size_t inlen;
    bool shaken;    /* the peer's handshake was read */
    nng_msg *big;   /* a message read straight into its body */
    size_t big_got; /* body bytes of it read so far */
    uint8_t bighdr[4 * RPC_SP_MAX_HOPS];
    size_t bighlen;
    atomic_bool down_done; /* cb.down ran (or is running) */
    /* writing */
    pthread_mutex_t mu; /* protects out, outlen, outcap, writing, dead */
    uint8_t *out, *wbuf;
    size_t outlen, outcap, wcap, wlen, woff;
    bool writing; /* a write is in flight: wbuf is the writer's */
    bool dead;    /* no more sends: the stream is closed or closing */
};

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (56 - 8 * i));
}

bool rpc_conn_url_ok(const char *url)
{
    static const char *const ok[] = {"tcp://",     "tcp4://",     "tcp6://",
                                     "tls+tcp://", "tls+tcp4://", "tls+tcp6://"};
    for (size_t i = 0; url && i < sizeof(ok) / sizeof(ok[0]); i++)
        if (strncmp(url, ok[i], strlen(ok[i])) == 0)
            return true;
    return false;
}

/* Marks c dead and closes its stream; the pending receive then ends and
 * the reading side runs cb.down. */
static void conn_kill(rpc_conn *c)
{
    pthread_mutex_lock(&c->mu);
    bool was = c->dead;
    c->dead = true;
    pthread_mutex_unlock(&c->mu);
    if (!was)
        nng_stream_close(c->st);
}

/* The reading side's end: cb.down once. */
static void conn_down(rpc_conn *c, int rv)
{
    conn_kill(c);
    if (!atomic_exchange(&c->down_done, true))
        c->cb.down(c->cb.arg, c, rv);
}

/* ---- writing ------------------------------------------------------------ */

/* With mu held: when no write is in flight and bytes wait, swaps them into
 * wbuf and returns true: the caller submits the write, outside mu. */
static bool write_take_locked(rpc_conn *c)
{
    if (c->writing || !c->outlen || c->dead)
        return false;
    uint8_t *t = c->wbuf;
    size_t tcap = c->wcap;
    c->wbuf = c->out;
    c->wcap = c->outcap;
    c->wlen = c->outlen;
    c->woff = 0;
    c->out = t;
    c->outcap = tcap;
    c->outlen = 0;
    c->writing = true;
    return true;
}

static void write_submit(rpc_conn *c)
{
    nng_iov iov = {c->wbuf + c->woff, c->wlen - c->woff};
    nng_aio_set_iov(c->wr, 1, &iov);
    nng_stream_send(c->st, c->wr);
}

static void wr_cb(void *arg)
{
    rpc_conn *c = arg;
    int rv = nng_aio_result(c->wr);
    if (rv != 0) {
        pthread_mutex_lock(&c->mu);
        c->writing = false;
        pthread_mutex_unlock(&c->mu);
        conn_kill(c); /* the receive ends and reports it */
        return;
    }
    c->woff += nng_aio_count(c->wr);
    if (c->woff < c->wlen) {
        write_submit(c);
        return;
    }
    pthread_mutex_lock(&c->mu);
    c->writing = false;
    if (c->wcap > OUT_KEEP) { /* one large message: do not keep its buffer */
        uint8_t *small = malloc(OUT_MIN);
        if (small) {
            free(c->wbuf);
            c->wbuf = small;
            c->wcap = OUT_MIN;
        }
    }
    bool go = write_take_locked(c);
    pthread_mutex_unlock(&c->mu);
    if (go)
        write_submit(c);
}

int rpc_conn_send(rpc_conn *c, const void *hdr, size_t hlen, const void *body, size_t blen)
{
    size_t n = 8 + hlen + blen;
    pthread_mutex_lock(&c->mu);
    if (c->dead) {
        pthread_mutex_unlock(&c->mu);
        return NNG_ECLOSED;
    }
    if (c->out_max && c->writing && c->outlen + n > c->out_max) {
        /* the peer does not read what it asked for while it asks for more:
         * end it rather than hold its replies without bound (Redis closes
         * such a client too: client-output-buffer-limit) */
        pthread_mutex_unlock(&c->mu);
        conn_kill(c);
        return NNG_ENOSPC;
    }
    if (c->outlen + n > c->outcap) {
        size_t cap = c->outcap ? c->outcap : OUT_MIN;
        while (cap < c->outlen + n)
            cap *= 2;
        uint8_t *o = realloc(c->out, cap);
        if (!o) {
            pthread_mutex_unlock(&c->mu);
            return NNG_ENOMEM;
        }
        c->out = o;
        c->outcap = cap;
    }
    uint8_t *p = c->out + c->outlen;
    put64(p, hlen + blen);
    if (hlen)
        memcpy(p + 8, hdr, hlen);
    if (blen)
        memcpy(p + 8 + hlen, body, blen);
    c->outlen += n;
    bool go = write_take_locked(c);
    pthread_mutex_unlock(&c->mu);
    if (go)
        write_submit(c);
    return 0;
}

/* ---- reading ------------------------------------------------------------ */

/* Posts the next receive; false (nothing posted) once the connection is
 * dead. Under mu, against conn_kill: nng 1.5 never completes a receive
 * posted on a TCP stream after its close (tcp_doread returns early), so a
 * receive that raced the close would leave the connection without its
 * end. */
static bool read_submit(rpc_conn *c)
{
    nng_iov iov;
    if (c->big) {
        iov.iov_buf = (uint8_t *)nng_msg_body(c->big) + c->big_got;
        iov.iov_len = nng_msg_len(c->big) - c->big_got;
    } else {
        iov.iov_buf = c->in + c->inlen;
        iov.iov_len = CONN_BUF - c->inlen;
    }
    pthread_mutex_lock(&c->mu);
    bool dead = c->dead;
    if (!dead) {
        nng_aio_set_iov(c->rd, 1, &iov);
        nng_stream_recv(c->st, c->rd);
    }
    pthread_mutex_unlock(&c->mu);
    return !dead;
}

/* The header of the message at p (avail bytes of it here, len in all):
 * its length in *hlen, or 0 when more bytes are needed, or -1 when it is
 * not a REQ/REP header (no word with the high bit within the hop limit). */
static int header_len(const uint8_t *p, size_t avail, uint64_t len, size_t *hlen)
{
    for (size_t w = 0; w < RPC_SP_MAX_HOPS; w++) {
        size_t end = 4 * (w + 1);
        if (end > len)
            return -1;
        if (end > avail)
            return 0;
        if (get32(p + 4 * w) & 0x80000000u) {
            *hlen = end;
            return 1;
        }
    }
    return -1;
}

/* Hands the complete messages in the buffer to cb.frame; keeps a partial
 * one (or starts reading a large one into its own message). 0, or the
 * error that ends the connection. */
static int read_parse(rpc_conn *c)
{
    size_t off = 0;
    int rv = 0;
    for (;;) {
        size_t avail = c->inlen - off;
        const uint8_t *p = c->in + off;
        if (!c->shaken) {
            if (avail < HS_LEN)
                break;
            if (p[0] != 0 || p[1] != 'S' || p[2] != 'P' || p[3] != 0 || p[6] != 0 || p[7] != 0 ||
                (uint16_t)(p[4] << 8 | p[5]) != c->peer) {
                rv = NNG_EPROTO;
                break;
            }
            c->shaken = true;
            off += HS_LEN;
            if (c->cb.up)
                c->cb.up(c->cb.arg, c);
            continue;
        }
        if (avail < 8)
            break;
        uint64_t len = get64(p);
        if ((c->recv_max && len > c->recv_max) || len > RPC_CONN_MAX) {
            rv = NNG_EMSGSIZE;
            break;
        }
        size_t hlen = 0;
        int h = header_len(p + 8, avail - 8, len, &hlen);
        if (h < 0) {
            rv = NNG_EPROTO;
            break;
        }
        if (h == 0)
            break;
        nng_msg *m = NULL;
        if (8 + len <= avail) { /* all here */
            if (nng_msg_alloc(&m, (size_t)len - hlen) != 0) {
                rv = NNG_ENOMEM;
                break;
            }
            memcpy(nng_msg_body(m), p + 8 + hlen, (size_t)len - hlen);
            off += 8 + (size_t)len;
            c->cb.frame(c->cb.arg, c, p + 8, hlen, m);
            continue;
        }
        if (8 + len <= CONN_BUF)
            break; /* it fits the buffer once the rest comes */
        /* larger than the buffer: read the rest straight into its body */
        if (nng_msg_alloc(&m, (size_t)len - hlen) != 0) {
            rv = NNG_ENOMEM;
            break;
        }
        size_t have = avail - 8 - hlen;
        memcpy(nng_msg_body(m), p + 8 + hlen, have);
        memcpy(c->bighdr, p + 8, hlen);
        c->bighlen = hlen;
        c->big = m;
        c->big_got = have;
        off = c->inlen;
        break;
    }
    if (off) {
        memmove(c->in, c->in + off, c->inlen - off);
        c->inlen -= off;
    }
    return rv;
}

static void rd_cb(void *arg)
{
    rpc_conn *c = arg;
    int rv = nng_aio_result(c->rd);
    if (rv == 0 && c->big) {
        c->big_got += nng_aio_count(c->rd);
        if (c->big_got == nng_msg_len(c->big)) {
            nng_msg *m = c->big;
            c->big = NULL;
            c->cb.frame(c->cb.arg, c, c->bighdr, c->bighlen, m);
        }
    } else if (rv == 0) {
        c->inlen += nng_aio_count(c->rd);
        rv = read_parse(c);
    }
    if (rv == 0 && !read_submit(c))
        rv = NNG_ECLOSED;
    if (rv != 0)
        conn_down(c, rv);
}

/* ---- life --------------------------------------------------------------- */

rpc_conn *rpc_conn_new(nng_stream *st, uint16_t self, uint16_t peer, size_t recv_max,
                       size_t out_max, const rpc_conn_cb *cb)
{
    rpc_conn *c = calloc(1, sizeof(*c));
    if (c && (!(c->in = malloc(CONN_BUF)) || nng_aio_alloc(&c->rd, rd_cb, c) != 0 ||
              nng_aio_alloc(&c->wr, wr_cb, c) != 0)) {
        if (c->rd)
            nng_aio_free(c->rd);
        free(c->in);
        free(c);
        c = NULL;
    }
    if (!c) {
        nng_stream_free(st);
        return NULL;
    }
    c->st = st;
    c->cb = *cb;
    c->self = self;
    c->peer = peer;
    c->recv_max = recv_max;
    c->out_max = out_max;
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

void rpc_conn_start(rpc_conn *c)
{
    uint16_t self = c->self;
    uint8_t hs[HS_LEN] = {0, 'S', 'P', 0, (uint8_t)(self >> 8), (uint8_t)self, 0, 0};
    /* the handshake is a message-less write: queue its bytes as they are */
    pthread_mutex_lock(&c->mu);
    c->out = malloc(OUT_MIN);
    c->outcap = c->out ? OUT_MIN : 0;
    if (c->out) {
        memcpy(c->out, hs, HS_LEN);
        c->outlen = HS_LEN;
    }
    bool go = c->out && write_take_locked(c);
    pthread_mutex_unlock(&c->mu);
    if (go)
        write_submit(c);
    else
        conn_kill(c); /* out of memory */
    if (!read_submit(c))
        conn_down(c, NNG_ENOMEM); /* its end, on this thread */
}

void rpc_conn_close(rpc_conn *c)
{
    if (c)
        conn_kill(c);
}

bool rpc_conn_verified(rpc_conn *c)
{
    bool v = false;
    return nng_stream_get_bool(c->st, NNG_OPT_TLS_VERIFIED, &v) == 0 && v;
}

void rpc_conn_free(rpc_conn *c)
{
    if (!c)
        return;
    conn_kill(c);
    nng_aio_stop(c->rd); /* waits for a running receive callback */
    nng_aio_stop(c->wr);
    /* a callback that resubmitted after the stop was dropped by nng without
     * a completion: report the end here if the reading side did not */
    if (!atomic_exchange(&c->down_done, true))
        c->cb.down(c->cb.arg, c, NNG_ECLOSED);
    nng_aio_free(c->rd);
    nng_aio_free(c->wr);
    nng_stream_free(c->st);
    if (c->big)
        nng_msg_free(c->big);
    pthread_mutex_destroy(&c->mu);
    free(c->in);
    free(c->out);
    free(c->wbuf);
    free(c);
}
