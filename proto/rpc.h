/* SPDX-License-Identifier: MIT */
/*
 * The RPC runtime shared by every hotkv binary: a gRPC-like layer over nng
 * REQ/REP (DESIGN.md §3). A call is one nng message holding a kv.Envelope;
 * the reply is an Envelope with the same id, a Status and a body.
 *
 * Server: requests taken off connections (the REQ/REP wire format,
 * proto/rpc_conn.h: on tcp, plain sockets on hotkv's own epoll loops,
 * proto/rpc_loop.h; on tls, nng byte streams; elsewhere REP contexts
 * driven by their completions) are queued for a pool of worker threads,
 * which run handlers synchronously and send the reply. A method's
 * try_inline may serve a call that needs no blocking on the receiving
 * thread (a loop's or nng's) itself, without the hand-off, and its
 * start_async may start a call there that another thread's completion
 * finishes (a router's forwards). Methods are dispatched through a table by
 * name. Calls that ask a node to coordinate (Envelope.coordinate) may have
 * workers of their own. Deadlines are relative on the wire, counted from
 * the request's arrival, and absolute (CLOCK_MONOTONIC) in handlers; a call
 * whose deadline passed in the queue is not run, and a handler that
 * finishes past its deadline is answered DEADLINE_EXCEEDED. Under overload
 * calls are refused on arrival with RESOURCE_EXHAUSTED
 * (rpc_server_opts.max_inflight). Malformed envelopes get INVALID_ARGUMENT,
 * unknown methods UNIMPLEMENTED, wrong tokens UNAUTHENTICATED, admin
 * methods called without admin credentials PERMISSION_DENIED; the
 * connection keeps serving in every case.
 *
 * Authentication (docs/protocol.md "Authentication"): a data token (kv.*,
 * admin.Ping, admin.GetMap) and an admin token (every other method, and the
 * internal calls between routers and nodes); a peer whose TLS certificate
 * verified against the listener's CA counts as admin. Tokens are compared
 * in constant time over their full length.
 *
 * Client: one channel per peer (rpc_chan). On tcp and tls it speaks the
 * REQ/REP wire format on one connection (proto/rpc_conn.h), with any
 * number of messages in flight: a plain socket on a loop for tcp to a
 * numeric address, an nng byte stream for tls and host names; on other
 * transports (inproc, ipc), or with KV_RPC_SOCKETS=1, it is an nng REQ
 * socket with a pool of contexts. KV_RPC_NNG_STREAMS=1 keeps tcp on nng's
 * byte streams (benchmarks' A/B runs). Either
 * way a call is sent at most once and only the caller retries
 * (rpc_call_retry, for idempotent calls only).
 */
#ifndef KV_PROTO_RPC_H
#define KV_PROTO_RPC_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/limits.h"
#include "kv/kv_err.h"

#define RPC_DEFAULT_DEADLINE_MS 5000u
/* The longest deadline a call may carry: longer ones (up to 2^32 - 1 ms on
 * the wire) are cut to this, on arrival and when a call is made, so that
 * every deadline fits nng's signed 32-bit millisecond durations. */
#define RPC_MAX_DEADLINE_MS 3600000u
/* Calls one rpc.Calls message may hold (a client coalesces at most 64). */
#define RPC_MAX_CALLS 1024u
/* Default rpc_server_opts.max_inflight. */
#define RPC_DEFAULT_MAX_INFLIGHT 4096u
#define RPC_MAX_MESSAGE 256

/* ---- server ------------------------------------------------------------ */

typedef struct rpc_server rpc_server;

/* What a handler sees of one call. The handler sets the reply with
 * rpc_reply_msg() (or leaves it empty) and returns the status. */
typedef struct rpc_ctx {
    const char *method;
    /* The caller may use admin methods and carry internal fields (write
     * versions): it showed the admin token or a verified certificate, or
     * authentication is off altogether (then anonymous is set too). */
    bool admin;
    bool anonymous;       /* admin only because no credential is configured: nothing was proven */
    uint64_t map_epoch;   /* the caller's cluster-map epoch (0 = unknown) */
    bool coordinate;      /* Envelope.coordinate: a smart client asks the node to coordinate */
    uint64_t deadline_ns; /* absolute, kv_now_ns() clock */
    int worker;           /* index of the worker thread running the call */
    rpc_server *server;   /* the server running the call (NULL for an in-process call) */
    void *user;           /* rpc_server_opts.user */
    uint64_t reply_epoch; /* the replier's map epoch, stamped on the reply */
    uint8_t *reply;       /* packed reply body (malloc'ed; the runtime frees it) */
    size_t reply_len;
    char message[RPC_MAX_MESSAGE]; /* status message for non-OK replies */
    const struct rpc_method *mdef; /* the server's entry for method (NULL: none); the runtime's */
} rpc_ctx;

typedef kv_err (*rpc_handler_fn)(rpc_ctx *c, const uint8_t *body, size_t len);
/* A handler in two phases: start sends what the call waits for and returns
 * KV_OK with *state (NULL: the call is already complete) or an error (then
 * finish is not called); finish(c, state) waits, completes the call and
 * frees state. Both run on the same worker with the same c. */
typedef kv_err (*rpc_start_fn)(rpc_ctx *c, const uint8_t *body, size_t len, void **state);
typedef kv_err (*rpc_finish_fn)(rpc_ctx *c, void *state);

/* Optional fast path of a method: serves the call on the nng thread that
 * received it, saving the hand-off to a worker, when it can do so without
 * blocking (a read that the memory tier answers). Returns true when it
 * served the call, with fn's status in *rv and c as fn leaves it; false to
 * decline, having changed nothing that matters (the call then goes to a
 * worker and fn as usual, with a fresh c). c->worker is -1. Must not block
 * or wait for another process; only for calls without Envelope.coordinate
 * of methods that are not split (rpc_method.start), unless the method sets
 * inline_coordinate. */
typedef bool (*rpc_try_fn)(rpc_ctx *c, const uint8_t *body, size_t len, kv_err *rv);

/* The completion-driven form of a split method (rpc_method.start_async),
 * for handlers whose waiting is for other processes (a router's forwards):
 * no worker thread is held while the replies are awaited. */
typedef struct rpc_async rpc_async;
/* Runs on the nng thread that received the call (c->worker is -1), after
 * the same credential, dispatch and deadline checks as a worker's call, and
 * must not block. Either declines (returns false having started nothing
 * that matters: the call then goes to a worker and start/finish, with a
 * fresh c) or takes the call (returns true): the work it started then
 * completes the call exactly once, with rpc_async_done or rpc_async_handoff,
 * from any thread (typically a reply's completion callback), possibly
 * before start_async returns. c stays valid until then; the call's reply is
 * c as the method leaves it, as for a handler. */
typedef bool (*rpc_async_fn)(rpc_ctx *c, const uint8_t *body, size_t len, rpc_async *a);
/* Completes async call a with status (c's reply body and message as the
 * method left them); a and its c are gone when it returns. Must not block;
 * not from inside a worker's handoff fn (that one returns its status). */
void rpc_async_done(rpc_async *a, kv_err status);
/* Completes async call a on a worker instead, for a rest that must block
 * (a retry, a synchronous call): fn(c, arg) runs on a worker of the call's
 * lane (c->worker set) and its return value is the call's status. During
 * shutdown, once the workers stopped, fn runs on the calling thread. */
void rpc_async_handoff(rpc_async *a, kv_err (*fn)(rpc_ctx *c, void *arg), void *arg);

/* Who may call a method: admin credentials (the default: admin.*, internal
 * calls) or the data token too (kv.*, admin.Ping, admin.GetMap). */
typedef enum rpc_access { RPC_ADMIN = 0, RPC_DATA = 1 } rpc_access;

typedef struct rpc_method {
    const char *name; /* "kv.Get", "admin.Ping", ... */
    rpc_handler_fn fn;
    /* Optional split form, for handlers that wait for other processes (when
     * fn is set too, only calls with Envelope.coordinate use it): the calls
     * of one rpc.Calls message that all use it are started one after
     * another, then finished one after another, on one worker, which so
     * keeps all their forwards in flight at once. */
    rpc_start_fn start;
    rpc_finish_fn finish;
    rpc_access access;
    rpc_try_fn try_inline; /* optional: see rpc_try_fn */
    /* optional, with start/finish (and used where they are): see
     * rpc_async_fn; calls of rpc.Calls messages too */
    rpc_async_fn start_async;
    /* try_inline also gets calls with Envelope.coordinate (c->coordinate
     * set): it serves those it can complete as their coordinator without
     * blocking (a read this node answers alone) and declines the others,
     * which then take start_async or a worker as usual */
    bool inline_coordinate;
} rpc_method;

/* TLS settings of a listener or a dialer (--tls-cert, --tls-key, --tls-ca),
 * used for tls+tcp:// URLs (nng's TLS transport over mbedTLS). PEM files. */
typedef struct rpc_tls {
    const char *cert; /* own certificate (chain): a listener needs one; a dialer presents it */
    const char *key;  /* its private key (unencrypted) */
    /* CA certificate(s) peers must chain to. A dialer needs it (the server
     * is always verified). A listener given one requires a client
     * certificate that verifies (mutual TLS), or with client_optional
     * accepts clients without one; a verified client is an admin peer. */
    const char *ca;
    bool client_optional;
} rpc_tls;

/* Whether url uses the TLS transport ("tls+tcp://"). */
bool rpc_url_tls(const char *url);

typedef struct rpc_server_opts {
    const char *url; /* "tcp://127.0.0.1:7001" */
    const rpc_method *methods;
    size_t nmethods;
    unsigned workers;       /* worker threads (default 8) */
    unsigned coord_workers; /* more workers only for coordinate calls
                               (0 = they share the others) */
    unsigned contexts;      /* REP contexts, i.e. calls taken off the
                               socket at once (0 = 2 x workers + 32) */
    bool handlers_wait;     /* handlers wait for other processes (a router's forwards) or
                               devices (a node's block reads): the calls of an rpc.Calls message
                               that reach a worker run as jobs of their own, in parallel (else
                               one after another on one worker) */
    const char *auth;       /* data token, NULL or "" = data methods open */
    /* admin token, NULL or "" = none: then the data token grants admin too
     * when no tls->ca is set (one shared token), and with neither token nor
     * CA authentication is off (every caller is an anonymous admin) */
    const char *admin_auth;
    const rpc_tls *tls;           /* for a tls+tcp:// url (read at open) */
    uint32_t default_deadline_ms; /* for requests with deadline_ms = 0 */
    /* Overload (issue 16 item 5): calls (each call of an rpc.Calls message
     * counts) admitted and not yet answered, at most; a call beyond it, or
     * one arriving while the oldest queued call has waited more than half
     * of the new call's deadline, is refused at once with
     * RESOURCE_EXHAUSTED. 0 = RPC_DEFAULT_MAX_INFLIGHT. */
    unsigned max_inflight;
    size_t recv_max;                              /* NNG_OPT_RECVMAXSZ (0 = from default limits) */
    void *user;                                   /* handed to handlers and thread hooks */
    void (*thread_start)(int worker, void *user); /* e.g. rcu_register_thread */
    void (*thread_stop)(int worker, void *user);
    /* Called after each call with a known method ran (any worker or nng thread;
     * must not block): method = its index in methods, the reply's status,
     * and the time from the call's start on a worker to its reply being
     * ready. NULL = none (proto/rpc_metrics.h counts them). */
    void (*observe)(void *arg, size_t method, kv_err status, uint64_t ns);
    void *observe_arg;
} rpc_server_opts;

/* Listens on opts->url and starts the workers. On failure writes a message
 * to err and returns UNAVAILABLE (address in use, bad URL) or another code.
 * Call from one thread; the opts strings must outlive the server. */
kv_err rpc_server_open(rpc_server **out, const rpc_server_opts *opts, char *err, size_t errlen);
/* Stops accepting new calls, lets calls in handlers finish and answer
 * (bounded wait), then joins the workers and closes the socket. NULL is a
 * no-op. Must not be called from a handler. Every wait is bounded (issue
 * 16 item 6): a socket whose close does not finish (an nng 1.5 defect,
 * rpc_util.c) is left open and the server's memory allocated, and a worker
 * still inside a handler 10 s after the drain is left running; then false
 * is returned: the caller must not free what handlers use (and should
 * exit). */
bool rpc_server_close(rpc_server *s);

/* Counters of a server's admission control (monotonic but inflight). */
typedef struct rpc_server_counters {
    uint64_t messages;        /* requests received (an rpc.Calls message counts once) */
    uint64_t calls;           /* calls received (each call of an rpc.Calls message) */
    uint64_t expired;         /* dropped before their handler: the deadline passed in the queue */
    uint64_t shed;            /* refused on arrival with RESOURCE_EXHAUSTED (overload) */
    uint64_t inline_served;   /* served by try_inline on the receiving thread */
    uint64_t async_started;   /* taken by start_async on the receiving thread */
    uint64_t async_handoffs;  /* of those, finished on a worker (rpc_async_handoff) */
    uint64_t accepts_refused; /* connections closed at once: out of file descriptors */
    unsigned inflight;        /* admitted and not answered yet */
    unsigned max_inflight;
} rpc_server_counters;
void rpc_server_counters_get(const rpc_server *s, rpc_server_counters *out);

/* The TCP port the server listens on (useful with "tcp://127.0.0.1:0"). */
int rpc_server_port(const rpc_server *s);

/* Packs msg into c->reply. Returns KV_OK or RESOURCE_EXHAUSTED. */
kv_err rpc_reply_msg(rpc_ctx *c, const ProtobufCMessage *msg);
/* Sets c->message (printf style) and returns code, for `return rpc_fail(...)`. */
kv_err rpc_fail(rpc_ctx *c, kv_err code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Milliseconds left before c's deadline (0 when past it). */
uint32_t rpc_ctx_remaining_ms(const rpc_ctx *c);

/* ---- input bounds and output hygiene (rpc_util.c) -------------------------- */

/* Allocation budget for unpacking a len-byte message with at most max_elems
 * elements in its repeated fields (a request's limit, e.g. max_batch_ops). */
size_t rpc_unpack_budget(size_t len, size_t max_elems);
/* An allocator for protobuf-c's unpack functions that fails once budget
 * bytes are allocated: kv__x__unpack(rpc_budget_init(&b, budget), len, p)
 * then returns NULL. Free what it unpacked with the default allocator
 * (kv__x__free_unpacked(m, NULL)); b may go once the unpack returned. */
typedef struct rpc_budget {
    ProtobufCAllocator a;
    size_t left;
} rpc_budget;
ProtobufCAllocator *rpc_budget_init(rpc_budget *b, size_t budget);
/* protobuf_c_message_unpack with such a budget. */
ProtobufCMessage *rpc_unpack(const ProtobufCMessageDescriptor *d, size_t len, const uint8_t *data,
                             size_t budget);

/* ---- unpack arenas (rpc_arena.c) ---------------------------------------------
 * A bump allocator for messages whose parts all go at once: what protobuf-c
 * unpacks through rpc_arena_pb(ar, budget), and what rpc_arena_alloc gives,
 * lives until rpc_arena_reset(ar), which frees it all. Never free such a
 * message with kv__x__free_unpacked(m, NULL) (the arena owns its memory;
 * the allocator's own free does nothing). The caller's buf (cap bytes, may
 * be NULL) is used first, then blocks from the heap. An arena belongs to
 * one thread at a time; it may be filled on one and reset on another. */
typedef struct rpc_arena_blk rpc_arena_blk;
typedef struct rpc_arena {
    ProtobufCAllocator a;
    size_t left;        /* what unpacking may still take (rpc_arena_pb) */
    uint8_t *buf;       /* the caller's buffer, aligned */
    size_t cap;         /* its bytes */
    uint8_t *cur, *end; /* the free room of the current block */
    rpc_arena_blk *blks;
} rpc_arena;
void rpc_arena_init(rpc_arena *ar, void *buf, size_t cap);
/* The allocator to unpack with, which fails (the unpack returns NULL) once
 * budget bytes (e.g. rpc_unpack_budget) are taken through it. */
ProtobufCAllocator *rpc_arena_pb(rpc_arena *ar, size_t budget);
/* n bytes aligned to 16 (NULL when out of memory), outside any budget. */
void *rpc_arena_alloc(rpc_arena *ar, size_t n);
void *rpc_arena_calloc(rpc_arena *ar, size_t n, size_t size);
/* Frees everything allocated since init or the last reset. */
void rpc_arena_reset(rpc_arena *ar);
/* A request body of type d unpacked into ar within budget; NULL when it
 * is malformed or over the budget, with c's INVALID_ARGUMENT status and
 * message ("malformed <type> body") set for the handler to return. */
ProtobufCMessage *rpc_arena_request(rpc_arena *ar, rpc_ctx *c, const ProtobufCMessageDescriptor *d,
                                    const uint8_t *body, size_t len, size_t budget);

/* Counts the occurrences of top-level field number `field` in the
 * wire-format bytes p[0..len) without allocating: elements of a repeated
 * field, before unpacking. False when the bytes are not wire format. */
bool rpc_pb_count(const uint8_t *p, size_t len, uint32_t field, size_t *count);
/* Status messages are proto3 strings, which strict protobuf libraries
 * refuse unless they are valid UTF-8 (issue 16 item 9). */
bool rpc_utf8_valid(const char *s);
/* Copies in to out (outlen bytes, NUL included), whole valid characters
 * as they are and every other byte as "\xNN", cut at a character
 * boundary; returns the length written. */
size_t rpc_utf8_escape(const char *in, char *out, size_t outlen);
/* Escapes s in place (its buffer holds size bytes) when it is not UTF-8. */
void rpc_utf8_fix(char *s, size_t size);
/* A malloc'ed copy of s with invalid bytes escaped (NULL when out of memory). */
char *rpc_utf8_dup(const char *s);

/* ---- client ------------------------------------------------------------ */

typedef struct rpc_chan rpc_chan;

/* A channel's default wait for its first connection (rpc_chan_opts). */
#define RPC_CONNECT_WAIT_MS 1000u

typedef struct rpc_chan_opts {
    const char *auth;         /* token sent with every call (NULL = none) */
    const rpc_tls *tls;       /* for tls+tcp:// urls (files read at open; ca required) */
    size_t recv_max;          /* 0 = from default limits */
    uint32_t connect_wait_ms; /* how long a call right after open waits for the first connection
                                 (0 = RPC_CONNECT_WAIT_MS) */
    bool coordinate;          /* set Envelope.coordinate on every call (a smart client's
                                 channels to nodes) */
    int coalesce_after;       /* messages in flight before further small calls wait and go
                                 out together in one rpc.Calls message (0 =
                                 $KV_RPC_COALESCE_AFTER, else 1; < 0 = never) */
    int loop;                 /* tcp:// to a numeric address: 1 + the rpc_loop its connection
                                 is served on (rpc_pool's channel per loop); 0 = any */
} rpc_chan_opts;

/* A reply. body/message are malloc'ed and owned by whoever holds the reply;
 * rpc_reply_free() releases them. body may be set for non-OK statuses too
 * (FAILED_PRECONDITION carries the node's cluster map). */
typedef struct rpc_reply {
    kv_err status;
    char *message; /* NULL or the status message */
    uint8_t *body;
    size_t len;
    uint64_t map_epoch; /* the replier's map epoch */
    bool local;         /* the status was produced here (transport), not by the peer */
    /* the peer proved who it is: the reply came over TLS from a server whose
     * certificate verified against the channel's CA (or from the process
     * itself); maps in unverified replies are only hints (shard/cmap_trust.c) */
    bool verified;
} rpc_reply;

void rpc_reply_free(rpc_reply *r);

/* Opens a channel dialing url (asynchronously; reconnects forever). The
 * opts strings are copied. Returns INVALID_ARGUMENT for a bad URL, or a
 * tls+tcp:// URL without a usable opts->tls (no CA, unreadable files; the
 * reason is logged). */
kv_err rpc_chan_open(rpc_chan **out, const char *url, const rpc_chan_opts *opts);
/* Closes the socket; pending async calls complete with CANCELLED before it
 * returns. NULL is a no-op. Not from a completion callback. */
void rpc_chan_close(rpc_chan *ch);
const char *rpc_chan_url(const rpc_chan *ch);
/* Whether replies on ch are verified (TLS with a CA: see rpc_reply.verified). */
bool rpc_chan_verified(const rpc_chan *ch);
/* Number of live connections (0 = peer unreachable right now). */
int rpc_chan_connected(const rpc_chan *ch);
/* Messages in flight on ch before further small calls are coalesced (0 =
 * never: opened so, or the peer does not know rpc.Calls). */
unsigned rpc_chan_coalesce_after(const rpc_chan *ch);

/* Monotonic nanoseconds for the request path's deadlines and latencies: on
 * an event loop's thread the time the message being handled was read (one
 * clock read per message, not per call), elsewhere kv_now_ns(). Not for
 * waiting on time to pass. */
uint64_t rpc_now_ns(void);
/* rpc_now_ns() - t0, or 0 when t0 is later: a time read on another thread
 * may be later than the message this thread is handling. */
uint64_t rpc_since_ns(uint64_t t0);

/* Completion callback: called exactly once per rpc_call_async, from an nng
 * thread, with no runtime lock held; it must not block. It owns r's
 * contents (call rpc_reply_free, or move the pointers out). */
typedef void (*rpc_done_fn)(void *arg, rpc_reply *r);

/* Sends method(req) with a relative deadline (0 = RPC_DEFAULT_DEADLINE_MS)
 * and calls done(arg, reply) when the reply, an error or the deadline comes.
 * Transport errors: UNAVAILABLE (no connection to the peer), DEADLINE_EXCEEDED,
 * INVALID_ARGUMENT (request over recv_max), RESOURCE_EXHAUSTED. Thread-safe. */
void rpc_call_async(rpc_chan *ch, const char *method, uint64_t map_epoch,
                    const ProtobufCMessage *req, uint32_t deadline_ms, rpc_done_fn done, void *arg);
/* Same, blocking. Returns out->status; *out is always initialised and must be
 * released with rpc_reply_free(). Thread-safe. */
kv_err rpc_call(rpc_chan *ch, const char *method, uint64_t map_epoch, const ProtobufCMessage *req,
                uint32_t deadline_ms, rpc_reply *out);
/* rpc_call, retried on UNAVAILABLE with backoff until the deadline: only for
 * idempotent methods (Get, admin reads, versioned replica writes). */
kv_err rpc_call_retry(rpc_chan *ch, const char *method, uint64_t map_epoch,
                      const ProtobufCMessage *req, uint32_t deadline_ms, rpc_reply *out);

/* A burst: between rpc_burst_begin and rpc_burst_end on one thread, small
 * calls rpc_call_async makes on a coalescing channel wait in its queue even
 * when the channel has room for a message, and rpc_burst_end sends each
 * channel's queue as one message (or leaves it behind the message in
 * flight, as coalescing does). So calls started together leave together:
 * without it the first goes alone and the rest wait for its reply. A burst
 * must not block (a queued call waits for its end: no timer sends it, so
 * every begin needs its end), and the
 * channels it used must stay open until it ends; rpc_call (blocking) sends
 * as outside a burst. Bursts nest; only the outermost end sends. The
 * server runs the asynchronous calls of an rpc.Calls message in one, and a
 * channel the completions of an rpc.Calls reply. */
void rpc_burst_begin(void);
void rpc_burst_end(void);

/* ---- runtime (rpc_runtime.c; linked into executables, not libkvclient) -- */

/* Initialises nng on the calling thread with task_threads callback threads
 * (0 = rpc_runtime_default_threads(); at least 2; nng 1.5 rounds it up to
 * an even count). Call it once from main() before starting threads and
 * before any other nng call: nng initialises itself lazily on first use,
 * sizes its thread pools then, and two threads making their first nng
 * calls at once race inside that initialisation (found by
 * ThreadSanitizer). Returns KV_OK or INTERNAL. */
kv_err rpc_runtime_init(unsigned task_threads);
/* Sets how many event-loop threads serve tcp:// connections (rpc_loop.c;
 * 0 = one per CPU, at most 8; larger counts are 8). From main() before the
 * first server or channel; later calls change nothing. */
void rpc_runtime_set_loops(unsigned loops);
/* How many event-loop threads run (starting them if none did yet). */
unsigned rpc_runtime_loops(void);
/* Whether rpc_runtime_init can size the pool here: nng >= 1.7, or nng 1.5
 * on glibc in a build without sanitizers; otherwise nng keeps its own
 * default (two per CPU, at most 16). */
bool rpc_runtime_sizes_threads(void);
/* One per CPU, at least 2 (nng's own default is two per CPU). */
unsigned rpc_runtime_default_threads(void);
/* nng's callback threads running in this process, counted by their names
 * (0 where /proc is missing). A thread names itself when it first runs, so
 * right after rpc_runtime_init the count may still be rising. */
unsigned rpc_runtime_task_threads(void);
/* The threads of this process whose names start with prefix (0 where /proc
 * is missing); "nng:aio:expire" are nng's timeout threads. */
unsigned rpc_runtime_count_threads(const char *prefix);

/* ---- channel pool (rpc_pool.c) -------------------------------------------- */

/* One channel per peer address, opened on first use and kept for the
 * pool's life. */
typedef struct rpc_pool rpc_pool;

/* A pool whose channels are opened with opts (NULL = defaults; copied).
 * On success *out is the caller's (rpc_pool_destroy). RESOURCE_EXHAUSTED
 * when out of memory. */
kv_err rpc_pool_create(rpc_pool **out, const rpc_chan_opts *opts);
/* The calling thread's channel to addr (a peer on hotkv's loops has one
 * per loop: see rpc_pool.c); NULL when out of memory or addr is not a
 * valid URL. The channel belongs to the pool. Thread-safe, completion callbacks
 * included (opening a channel does not wait for the network). */
rpc_chan *rpc_pool_get(rpc_pool *p, const char *addr);
/* Closes every channel (their pending calls complete with CANCELLED first)
 * and frees the pool. NULL is a no-op. No other thread may use the pool
 * any more; not from a completion callback. */
void rpc_pool_destroy(rpc_pool *p);

/* Maps an nng error number to kv_err (ETIMEDOUT -> DEADLINE_EXCEEDED, ...). */
kv_err rpc_nng_err(int nng_rv);

#endif
