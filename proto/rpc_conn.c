/* SPDX-License-Identifier: MIT */
/*
 * rpc_conn: nng's REQ/REP wire format on an nng byte stream, or on a plain
 * socket served by an rpc_loop (rpc_conn.h).
 *
 * Plain sockets: the loop's thread reads what the socket has (level-
 * triggered epoll: what is left comes with the next event) and hands the
 * messages on while sends are corked, then writes what they queued in one
 * system call; otherwise a send writes at once on the sender's thread,
 * under mu. A full socket leaves the rest to EPOLLOUT. The reading side's
 * end (EOF, an error, or the shutdown conn_kill makes) removes the socket
 * from its loop and runs cb.down on the loop's thread.
 *
 * nng byte streams:
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

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/assert.h"
#include "common/log.h"
#include "proto/rpc_loop.h"

#define CONN_BUF (64u * 1024u)   /* read buffer */
#define OUT_MIN (16u * 1024u)    /* write buffers start here */
#define OUT_KEEP (1024u * 1024u) /* a write buffer over this is freed after use */
#define HS_LEN 8u
/* Past any bound a caller may set: no length arithmetic below can wrap. */
#define RPC_CONN_MAX ((uint64_t)1 << 40)

struct rpc_conn {
    nng_stream *st; /* NULL: a plain socket on an rpc_loop (src) */
    rpc_src src;
    int on;      /* the loop asked for (rpc_conn_new_fd), negative: any */
    bool looped; /* src is registered (until the reading side's end) */
    bool corked; /* the loop is handing a read's messages on: sends wait */
    size_t ooff; /* plain sockets: bytes of out already written */
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
    bool writing; /* a write is in flight: wbuf is the writer's (plain
                   * sockets: the socket was full, EPOLLOUT resumes) */
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
    if (!was && c->st)
        nng_stream_close(c->st);
    else if (!was) /* the loop reads the end and runs `down` */
        shutdown(c->src.fd, SHUT_RDWR);
}

/* The reading side's end: cb.down once. */
static void conn_down(rpc_conn *c, int rv)
{
    conn_kill(c);
    pthread_mutex_lock(&c->mu);
    bool looped = c->looped;
    c->looped = false;
    pthread_mutex_unlock(&c->mu);
    if (looped) /* on the loop's thread: no event of c follows */
        rpc_loop_del(&c->src);
    if (!atomic_exchange(&c->down_done, true))
        c->cb.down(c->cb.arg, c, rv);
}

/* ---- writing ------------------------------------------------------------ */

/* A drained write buffer over OUT_KEEP (one large message) is not kept. */
static void buf_shrink(uint8_t **buf, size_t *cap)
{
    uint8_t *small = *cap > OUT_KEEP ? malloc(OUT_MIN) : NULL;
    if (small) {
        free(*buf);
        *buf = small;
        *cap = OUT_MIN;
    }
}

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
    buf_shrink(&c->wbuf, &c->wcap);
    bool go = write_take_locked(c);
    pthread_mutex_unlock(&c->mu);
    if (go)
        write_submit(c);
}

/* Plain sockets, mu held: writes what out holds. A full socket leaves the
 * rest for EPOLLOUT (writing set); an error ends the connection (the loop
 * reads the end and runs `down`). */
static void sock_flush_locked(rpc_conn *c)
{
    while (c->ooff < c->outlen && !c->dead) {
        ssize_t w = send(c->src.fd, c->out + c->ooff, c->outlen - c->ooff, MSG_NOSIGNAL);
        if (w > 0) {
            c->ooff += (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!c->writing && c->looped) {
                c->writing = true;
                rpc_loop_out(&c->src, true);
            }
            return;
        } else {
            c->dead = true;
            shutdown(c->src.fd, SHUT_RDWR);
            return;
        }
    }
    c->outlen = c->ooff = 0;
    if (c->writing) {
        c->writing = false;
        if (c->looped)
            rpc_loop_out(&c->src, false);
    }
    buf_shrink(&c->out, &c->outcap);
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
    if (!c->st) { /* a full socket or a read being handed on: later */
        if (!c->writing && !c->corked)
            sock_flush_locked(c);
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
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
            rpc_loop_tick();
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
            rpc_loop_tick();
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

/* A plain socket's event, on its loop's thread: EPOLLOUT resumes a write;
 * a read takes what has arrived (level-triggered: the rest comes with the
 * next event) and hands its messages on with sends corked, so the replies
 * made meanwhile leave in one write. */
static void sock_event(rpc_src *src, uint32_t events)
{
    rpc_conn *c = (rpc_conn *)((char *)src - offsetof(rpc_conn, src));
    if (atomic_load(&c->down_done))
        return; /* freed on this loop in this batch (rpc_conn_free) */
    if (events & EPOLLOUT) {
        pthread_mutex_lock(&c->mu);
        sock_flush_locked(c);
        pthread_mutex_unlock(&c->mu);
    }
    if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
        return;
    ssize_t r;
    do {
        if (c->big)
            r = recv(src->fd, (uint8_t *)nng_msg_body(c->big) + c->big_got,
                     nng_msg_len(c->big) - c->big_got, 0);
        else
            r = recv(src->fd, c->in + c->inlen, CONN_BUF - c->inlen, 0);
    } while (r < 0 && errno == EINTR);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return;
    if (r <= 0) {
        conn_down(c, r == 0 ? NNG_ECLOSED : errno == ECONNRESET ? NNG_ECONNRESET : NNG_ECLOSED);
        return;
    }
    int rv = 0;
    pthread_mutex_lock(&c->mu);
    c->corked = true;
    pthread_mutex_unlock(&c->mu);
    if (c->big) {
        c->big_got += (size_t)r;
        if (c->big_got == nng_msg_len(c->big)) {
            nng_msg *m = c->big;
            c->big = NULL;
            rpc_loop_tick();
            c->cb.frame(c->cb.arg, c, c->bighdr, c->bighlen, m);
        }
    } else {
        c->inlen += (size_t)r;
        rv = read_parse(c);
    }
    pthread_mutex_lock(&c->mu);
    c->corked = false;
    if (!c->writing)
        sock_flush_locked(c);
    pthread_mutex_unlock(&c->mu);
    if (rv != 0)
        conn_down(c, rv);
}

/* ---- life --------------------------------------------------------------- */

/* A conn with its read buffer and settings, or NULL out of memory. */
static rpc_conn *conn_alloc(uint16_t self, uint16_t peer, size_t recv_max, size_t out_max,
                            const rpc_conn_cb *cb)
{
    rpc_conn *c = calloc(1, sizeof(*c));
    if (c && !(c->in = malloc(CONN_BUF))) {
        free(c);
        return NULL;
    }
    if (!c)
        return NULL;
    c->src = (rpc_src){.fn = sock_event, .fd = -1, .loop = -1};
    c->cb = *cb;
    c->self = self;
    c->peer = peer;
    c->recv_max = recv_max;
    c->out_max = out_max;
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

rpc_conn *rpc_conn_new(nng_stream *st, uint16_t self, uint16_t peer, size_t recv_max,
                       size_t out_max, const rpc_conn_cb *cb)
{
    rpc_conn *c = conn_alloc(self, peer, recv_max, out_max, cb);
    if (c && (nng_aio_alloc(&c->rd, rd_cb, c) != 0 || nng_aio_alloc(&c->wr, wr_cb, c) != 0)) {
        if (c->rd)
            nng_aio_free(c->rd);
        pthread_mutex_destroy(&c->mu);
        free(c->in);
        free(c);
        c = NULL;
    }
    if (!c) {
        nng_stream_free(st);
        return NULL;
    }
    c->st = st;
    return c;
}

rpc_conn *rpc_conn_new_fd(int fd, int on, uint16_t self, uint16_t peer, size_t recv_max,
                          size_t out_max, const rpc_conn_cb *cb)
{
    rpc_conn *c = conn_alloc(self, peer, recv_max, out_max, cb);
    if (!c) {
        close(fd);
        return NULL;
    }
    c->src.fd = fd;
    c->on = on;
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
    if (!c->st) { /* on its loop, then the handshake out (a full socket: EPOLLOUT) */
        int e = c->out ? 0 : ENOMEM;
        c->looped = e == 0; /* before the loop can see c: conn_down reads it */
        pthread_mutex_unlock(&c->mu);
        if (!e && (e = rpc_loop_add(&c->src, false, c->on)) != 0) {
            pthread_mutex_lock(&c->mu);
            c->looped = false;
            pthread_mutex_unlock(&c->mu);
        }
        if (e) {
            conn_down(c, NNG_ENOMEM); /* its end, on this thread */
            return;
        }
        pthread_mutex_lock(&c->mu);
        sock_flush_locked(c); /* the handshake, unless a read's flush took it */
        pthread_mutex_unlock(&c->mu);
        return;
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
    if (!c->st)
        return false; /* plain TCP */
    return nng_stream_get_bool(c->st, NNG_OPT_TLS_VERIFIED, &v) == 0 && v;
}

/* The memory of c, once nothing can call into it. */
static void conn_release(void *arg)
{
    rpc_conn *c = arg;
    if (c->st) {
        nng_aio_free(c->rd);
        nng_aio_free(c->wr);
        nng_stream_free(c->st);
    } else {
        close(c->src.fd);
    }
    if (c->big)
        nng_msg_free(c->big);
    pthread_mutex_destroy(&c->mu);
    free(c->in);
    free(c->out);
    free(c->wbuf);
    free(c);
}

void rpc_conn_free(rpc_conn *c)
{
    if (!c)
        return;
    conn_kill(c);
    if (!c->st && c->src.loop >= 0 && rpc_loop_on_thread(&c->src)) {
        /* on c's own loop (another source's handler): no handler of c runs
         * now, so its end runs here; an event of c taken in this batch may
         * still come, so the memory goes after the batch */
        conn_down(c, NNG_ECLOSED);
        if (rpc_loop_defer(&c->src, conn_release, c))
            return;
        KV_ERROR("rpc", "out of memory freeing a connection: it is kept");
        return;
    }
    if (!c->st && c->src.loop >= 0) {
        /* the loop reads the end conn_kill made and runs `down`, then
         * finishes the batch that did */
        while (!atomic_load(&c->down_done))
            rpc_loop_sync(&c->src);
        rpc_loop_sync(&c->src);
    } else if (c->st) {
        nng_aio_stop(c->rd); /* waits for a running receive callback */
        nng_aio_stop(c->wr);
    }
    /* a callback that resubmitted after the stop was dropped by nng without
     * a completion: report the end here if the reading side did not */
    if (!atomic_exchange(&c->down_done, true))
        c->cb.down(c->cb.arg, c, NNG_ECLOSED);
    conn_release(c);
}
