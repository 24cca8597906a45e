/* SPDX-License-Identifier: MIT */
/*
 * rpc_loop: hotkv's own event loops for plain TCP connections (tcp://).
 *
 * nng's byte streams complete every read on its poller thread and hand it
 * to one of its task threads (a lock, a condition signal, a wake-up per
 * read: half of a router's kernel time, bench/README.md). A loop here is
 * one thread waiting in epoll_wait that calls the handler of each ready
 * source on that same thread, as redis-server's loop does: a connection's
 * bytes are read, parsed and served where they were polled.
 *
 * A source is an fd with a handler (rpc_src.fn), registered level-triggered
 * for reading, and for writing too while `out` is set. Handlers run on the
 * loop's thread, one at a time per loop, and must not block.
 *
 * Ownership: the loops live for the process (started on first use, one per
 * CPU, at most 8). A source's owner keeps it allocated until it is removed
 * (rpc_loop_del) and, when removed from another thread, until
 * rpc_loop_sync says the loop finished the events it had already taken.
 * Internal to proto/.
 */
#ifndef KV_PROTO_RPC_LOOP_H
#define KV_PROTO_RPC_LOOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rpc_src rpc_src;
struct rpc_src {
    void (*fn)(rpc_src *src, uint32_t events); /* EPOLLIN, EPOLLOUT, EPOLLHUP, EPOLLERR */
    int fd;
    int loop; /* set by rpc_loop_add */
};

/* Registers src (fd and fn set) on loop `on` (modulo the loops' count), or
 * on the next loop in turn when `on` is negative: 0, or an errno. */
int rpc_loop_add(rpc_src *src, bool out, int on);
/* Sets how many loops start (1 to 8; 0: one per CPU, at most 8, the
 * default); only before the first use of a loop (a server or channel on
 * tcp://), later calls change nothing. */
void rpc_loop_set_count(int n);
/* On a loop's thread: reads the clock for rpc_now_ns (rpc.h), which the
 * loop also does before each event; a no-op elsewhere. A routed GET read
 * the clock some ten times, 5 % of a router's CPU in this VM. */
void rpc_loop_tick(void);
/* How many loops run (starting them on first use; 0 when none could). */
int rpc_loop_count(void);
/* The loop whose thread this is, or -1 off every loop's thread. */
int rpc_loop_self(void);
/* Switches the write interest of a registered src. */
void rpc_loop_out(rpc_src *src, bool out);
/* Unregisters src; no event taken after this reaches it, but one already
 * taken by its loop may still be handled until rpc_loop_sync returns. */
void rpc_loop_del(rpc_src *src);
/* Returns once src's loop has finished the events it was handling when
 * called (at once on that loop's own thread). */
void rpc_loop_sync(const rpc_src *src);
/* True on the thread of src's loop. */
bool rpc_loop_on_thread(const rpc_src *src);
/* On the thread of src's loop: fn(arg) runs once the batch in progress is
 * handled (a source removed in it is then named by no event taken). False
 * (nothing queued) off that thread or out of memory. */
bool rpc_loop_defer(const rpc_src *src, void (*fn)(void *arg), void *arg);

/* A connect in progress (rpc_loop_connect). */
typedef struct rpc_dial rpc_dial;
/* Connects a non-blocking TCP socket to addr (len bytes) on loop `on` (any
 * loop when negative, as rpc_loop_add); done runs at most once, on the
 * loop's thread, with the connected socket
 * (TCP_NODELAY set; done owns it) or -1 and an errno. The caller holds a
 * reference to *out, given up exactly once: by rpc_loop_dial_release (from
 * done, say) or by rpc_loop_connect_cancel. 0, or an errno when nothing
 * was started (done does not run, *out is not set). */
struct sockaddr;
int rpc_loop_connect(const struct sockaddr *addr, unsigned len, int on,
                     void (*done)(void *arg, rpc_dial *d, int fd, int err), void *arg,
                     rpc_dial **out);
void rpc_loop_dial_release(rpc_dial *d);
/* Gives up the reference and stops d: done will not run, or has finished
 * when this returns (not from done itself). */
void rpc_loop_connect_cancel(rpc_dial *d);

/* tcp://ADDRESS:PORT with a numeric IPv4 or [IPv6] address into ss; false
 * for anything else (a name: nng's streams resolve those). */
struct sockaddr_storage;
bool rpc_loop_addr(const char *url, struct sockaddr_storage *ss, unsigned *len);

/* Whether tcp:// servers and channels use the loops: true unless
 * KV_RPC_NNG_STREAMS=1 (nng's byte streams, for benchmarks' A/B runs). */
bool rpc_loop_wanted(void);

/* Listens on tcp://HOST:PORT (HOST empty or "*": every IPv4 address; a
 * name is resolved; [v6] in brackets): a non-blocking socket, or -1 with
 * the reason in err. *port gets the bound port. */
int rpc_loop_listen(const char *url, int *port, char *err, size_t errlen);

#endif
