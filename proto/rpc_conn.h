/* SPDX-License-Identifier: MIT */
/*
 * rpc_conn: nng's REQ/REP wire format spoken on an nng byte stream
 * (nng_stream: a TCP or TLS connection), without nng's socket layers.
 *
 * Why: an nng REQ or REP socket is built in layers (the stream, the SP
 * transport that frames messages, the protocol that matches requests to
 * replies), and each layer completes the next one's operation through
 * nng's task queue, so one message crosses between nng's threads several
 * times on each side. On a stream there is one hand-off per read or write,
 * a read can bring many messages and a write can carry many: a round trip
 * at one message in flight took 55 us on streams against 130 us on
 * sockets, at half the server's CPU (bench/README.md, "The floor without
 * nng's protocol layers"). The bytes on the wire are the sockets' own, so
 * either end interoperates with a plain nng REQ or REP socket:
 *
 *   handshake, each side once:  00 'S' 'P' 00, protocol (u16 BE), 00 00
 *   message:                    length (u64 BE) | header | body
 *
 * where REQ is protocol 0x30, REP 0x31, and a REQ/REP header is the
 * request id (u32 BE, high bit set), preceded by one more u32 per hop when
 * a device forwarded the request (the REP end echoes the header as it came).
 *
 * Ownership: a conn owns its stream (or socket). Its callbacks (rpc_conn_cb)
 * run on nng's task threads (an rpc_loop's thread for a plain socket), one
 * message at a time from the reading side; `down`
 * runs exactly once, after which no `frame` runs. The owner frees the conn
 * with rpc_conn_free, never from one of its callbacks (that waits for
 * them). Internal to proto/.
 */
#ifndef KV_PROTO_RPC_CONN_H
#define KV_PROTO_RPC_CONN_H

#include <nng/nng.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RPC_SP_REQ 0x30u
#define RPC_SP_REP 0x31u
#define RPC_SP_MAX_HOPS 8u /* header words a REP end accepts (nng's own limit) */

typedef struct rpc_conn rpc_conn;

typedef struct rpc_conn_cb {
    /* the peer's handshake arrived and names the expected protocol */
    void (*up)(void *arg, rpc_conn *c);
    /* a message: its header (hlen bytes, a multiple of 4 ending with the
     * word whose high bit is set) and its body, which the callee owns */
    void (*frame)(void *arg, rpc_conn *c, const uint8_t *hdr, size_t hlen, nng_msg *body);
    /* the connection ended (rv: nng's error; NNG_ECLOSED after
     * rpc_conn_close, NNG_EPROTO for bytes that are not the wire format,
     * NNG_EMSGSIZE for a message over recv_max) */
    void (*down)(void *arg, rpc_conn *c, int rv);
    void *arg;
} rpc_conn_cb;

/* Takes st for a connection that speaks protocol self to a peer that must
 * name peer in its handshake; recv_max bounds a message (header + body; 0
 * = no bound); out_max bounds the bytes queued behind a write in flight
 * (0 = no bound): a send past it ends the connection (a server's peer that
 * sends requests without reading the replies). Nothing is sent or read
 * until rpc_conn_start, so the owner can record c before its callbacks can
 * run. NULL when out of memory (st is then freed). */
rpc_conn *rpc_conn_new(nng_stream *st, uint16_t self, uint16_t peer, size_t recv_max,
                       size_t out_max, const rpc_conn_cb *cb);
/* The same for a connected plain TCP socket (non-blocking), served by an
 * rpc_loop (rpc_loop.h) instead of nng: its callbacks run on the thread
 * of loop `on` (the next loop in turn when negative). NULL when out of
 * memory (fd is then closed). */
rpc_conn *rpc_conn_new_fd(int fd, int on, uint16_t self, uint16_t peer, size_t recv_max,
                          size_t out_max, const rpc_conn_cb *cb);
/* Sends our handshake and starts reading (out of memory: `down` runs
 * here, on the caller's thread). */
void rpc_conn_start(rpc_conn *c);

/* Queues a message (header, then body: two byte ranges copied) behind
 * the others; a write carries every message queued when it starts.
 * 0, NNG_ECLOSED once the connection is down, NNG_ENOSPC past out_max
 * (the connection then ends), or NNG_ENOMEM. Any thread. */
int rpc_conn_send(rpc_conn *c, const void *hdr, size_t hlen, const void *body, size_t blen);

/* Ends the connection: `down` runs (NNG_ECLOSED) unless it ran already. */
void rpc_conn_close(rpc_conn *c);

/* Closes c, waits for its running callbacks and frees it. Not from one of
 * c's callbacks. NULL is a no-op. */
void rpc_conn_free(rpc_conn *c);

/* Whether the stream is TLS and the peer's certificate verified. */
bool rpc_conn_verified(rpc_conn *c);

/* Whether url names a transport whose SP framing rpc_conn speaks (tcp and
 * tls+tcp; not inproc or ipc, which keep nng's sockets). */
bool rpc_conn_url_ok(const char *url);

#endif
