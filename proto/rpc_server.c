/* SPDX-License-Identifier: MIT */
/*
 * RPC server, completion-driven. A request arrives in a call slot
 * (rpc_scall) on an nng thread, which must not block: it decodes the
 * Envelope and queues the call on a lane; a worker thread of that lane
 * checks auth and deadline, runs the handler and sends the reply Envelope
 * for the slot. So no thread waits for one call's messages, a busy worker
 * takes the next queued call without sleeping, and more calls than workers
 * are taken off the connections at once.
 *
 * Streams (tcp, tls): the server accepts nng byte streams and speaks the
 * REQ/REP wire format on them (rpc_conn.h). Each request a connection's
 * read brings takes a free slot (more are made up to max_inflight plus the
 * contexts; past that a request is refused RESOURCE_EXHAUSTED at once), and
 * its reply is queued on its connection behind the others, which a write
 * sends together. A connection is freed when it has ended and no request
 * of it is unanswered.
 *
 * Sockets (inproc, ipc, KV_RPC_SOCKETS=1): an nng REP socket with
 * `contexts` contexts, each keeping one receive posted; its reply is sent
 * from the same context, and the send's completion posts the next receive.
 *
 * Inline calls: a method's try_inline may serve a call on the receiving
 * nng thread itself, after the same admission, credential and deadline
 * checks, when it can without blocking (a node's GET that the memory tier
 * answers); it declines otherwise and the call is queued as above. That
 * saves a worker's wake-up and a hand-off each way, and the reply is sent
 * by fewer threads (the REP socket's lock is contended by senders). In an
 * rpc.Calls message the leading calls it serves run inline, and the calls
 * from the first declined one on go to a worker together, in order, as
 * one job (the message's reply still leaves once, when all have run).
 *
 * Lanes: calls that carry Envelope.coordinate (a smart client asking a node
 * to coordinate) run on coord_workers threads of their own. A coordinating
 * node waits for its peers' replica calls; if coordination could take every
 * worker, two nodes coordinating for each other would wait on each other's
 * queued replica calls until the deadlines. Replica calls never wait on
 * another node, so with their own lane they always progress.
 *
 * Every failure before the handler (garbage bytes, unknown method, bad
 * token) is answered, never dropped, so the caller's context is not left
 * waiting and the connection keeps serving.
 *
 * Overload (issue 16 item 5): a call's deadline counts from its arrival
 * (the receive's completion), not from when a worker takes it; a call whose
 * deadline passed while it was queued is answered DEADLINE_EXCEEDED without
 * running its handler (counted: expired); and a call is refused on arrival
 * with RESOURCE_EXHAUSTED (counted: shed) when max_inflight calls are
 * admitted and unanswered already, when the oldest call queued on its lane
 * has waited more than half of the new call's deadline (or a second): it
 * would likely expire in the queue; or, at random, when the calls answered
 * lately took more than a quarter of their deadlines from arrival to reply
 * ("slowness", a moving average): always at half. The last one is what
 * keeps a router's goodput up: its calls wait on the nodes, not in its own
 * queue, so its queue stays short while the nodes fall behind; what it
 * measures is the whole path. Refusing costs the server almost nothing and
 * tells the caller to back off, and the calls admitted complete in time:
 * under overload the workers run calls that still can, instead of calls
 * whose callers have given up. A server with nothing in flight admits.
 */
#define _GNU_SOURCE /* pthread_timedjoin_np, accept4 */
#include "proto/rpc.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/supplemental/util/platform.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc_conn.h"
#include "proto/rpc_loop.h"
#include "proto/rpc_tls.h"
#include "proto/rpc_wire.h"
#include "proto/rpc_int.h"
#include "proto/statlist.h"

#define DRAIN_WAIT_NS (3ull * 1000000000ull)
/* Admission (issue 16 item 5), defaults of $KV_RPC_SHED_QUEUE_PCT and
 * $KV_RPC_SHED_SLOW_PCT: a call is refused when the oldest queued call has
 * waited more than this percent of the new call's deadline; and, with a
 * probability growing from 0 to 1, when answered calls have lately taken
 * from one to two times this percent of their deadlines (0 = off). */
#define RPC_SHED_QUEUE_PCT 50u
#define RPC_SHED_SLOW_PCT 25u
/* The longest a queue may make calls wait before new ones are refused
 * (whatever their deadlines): a second is never a useful wait. */
#define RPC_MAX_QUEUE_WAIT_NS (1000ull * 1000000ull)
/* How long rpc_server_close waits for the workers once the lanes stopped
 * (a handler waiting for another process ends by its deadline). */
#define JOIN_WAIT_NS (10ull * 1000000000ull)

/* An entry of a lane's queue: a call (rpc_scall), one call of an
 * rpc.Calls message run on its own (rpc_sub) or the blocking rest of an
 * asynchronous call (rpc_async, rpc_async_handoff). */
typedef enum rpc_job_kind { JOB_CALL = 0, JOB_SUB, JOB_ASYNC } rpc_job_kind;
typedef struct rpc_job rpc_job;
struct rpc_job {
    rpc_job *next;
    rpc_job_kind kind;
    uint64_t queued_ns; /* when it was queued (kv_now_ns) */
};

typedef struct rpc_sconn rpc_sconn;
/* Replies a connection may have queued behind the one being written: four
 * of the largest requests' worth (a peer that pipelines requests without
 * reading the replies is disconnected past it: rpc_conn_new). */
#define RPC_OUT_MAX(recv_max) (4 * (recv_max) + 16u * 1024u * 1024u)

/* One REP context (sockets) or one request taken off a connection
 * (streams), and the call it holds between its receive and its reply. */
typedef struct rpc_scall {
    rpc_job job; /* first: a job is its call */
    rpc_server *srv;
    nng_ctx ctx;
    nng_aio *aio;
    bool open; /* ctx and aio were created */
    /* streams: the connection the reply goes to (a reference), the
     * request's id words to send back, and the free list */
    rpc_sconn *conn;
    uint8_t bt[4 * RPC_SP_MAX_HOPS];
    size_t btlen;
    struct rpc_scall *next_free;
    bool sending; /* the aio's operation is the reply (else a receive) */
    nng_msg *req;
    Kv__Envelope *env;    /* the decoded request, NULL when malformed */
    rpc_arena ar;         /* env, an rpc.Calls body's calls and their group */
    uint64_t arrival_ns;  /* when the request came in: deadlines count from here */
    unsigned admitted;    /* calls it counts in rpc_server.inflight */
    uint32_t deadline_ms; /* its relative deadline (admitted requests) */
    int lane;
    bool verified; /* it came over TLS with a client certificate that verified */
} rpc_scall;

typedef struct rpc_group rpc_group;
typedef struct rpc_sub {
    rpc_job job; /* first */
    rpc_group *g;
    size_t i;
    bool rest; /* the calls from i on, those the receive callback left (serve_inline) */
} rpc_sub;

/* The calls of one rpc.Calls message and their replies. */
struct rpc_group {
    rpc_scall *k;     /* the context that answers */
    Kv__Calls *calls; /* unpacked from k's body */
    Kv__Envelope *rep;
    Kv__Status *st;
    Kv__Envelope **ptrs;
    char **msgs;  /* status messages (malloc'ed) */
    rpc_ctx *ctx; /* split mode: each call's context between start and finish */
    /* References: the receive callback's or worker's that runs the
     * message, one per queued sub job, one per asynchronous call; the one
     * that drops the last sends the reply (group_put). */
    _Atomic size_t left;
    rpc_sub subs[];
};

/* An asynchronous call (rpc_method.start_async) between its start and its
 * completion: owned by the method's work until rpc_async_done; its memory
 * is its context's arena's (rpc_scall.ar). */
struct rpc_async {
    rpc_job job; /* first: a handoff's queue entry */
    rpc_ctx c;
    rpc_server *s;
    rpc_scall *k; /* the context that answers */
    rpc_group *g; /* the rpc.Calls message it is call i of, NULL for a call alone */
    size_t i;
    const rpc_method *m;
    uint64_t t0;                           /* for the observer */
    kv_err (*work)(rpc_ctx *c, void *arg); /* rpc_async_handoff's */
    void *work_arg;
};

/* A FIFO of jobs and the workers that run them. */
typedef struct rpc_lane {
    pthread_mutex_t mu; /* protects every field below; pairs with cv */
    pthread_cond_t cv;  /* signalled when a job is queued or the lane stops */
    rpc_job *head, *tail;
    unsigned idle; /* workers waiting on cv */
    bool stop;
    bool parallel; /* run the calls of an rpc.Calls message as jobs of their own */
} rpc_lane;

typedef struct rpc_worker {
    rpc_server *srv;
    rpc_lane *lane;
    int index;
    pthread_t thread;
    bool started;
} rpc_worker;

/* Streams: one accepted connection. References: the connection's own
 * until its end, and one per request taken off it and not yet answered;
 * the last one queues it on the server's dead list, freed from the accept
 * callback or the close (never from its own callbacks). */
struct rpc_sconn {
    rpc_server *srv;
    rpc_conn *c;
    atomic_int refs;
    int verified;           /* -1 unknown yet, else whether its TLS peer verified */
    rpc_sconn *next, *prev; /* s->conns (cmu), or s->dead */
};

struct rpc_server {
    rpc_server_opts opts;
    /* tcp and tls (streams): nng byte streams accepted by slis, each
     * speaking the REQ/REP wire format (rpc_conn.h); requests take an
     * rpc_scall from the free list (more are allocated up to max_scalls).
     * Other URLs (inproc, ipc) or KV_RPC_SOCKETS=1: an nng REP socket with
     * ncalls contexts. */
    bool streams;
    nng_stream_listener *slis;
    nng_aio *accept_aio;
    /* or, for tcp:// without TLS, a listening socket on an rpc_loop
     * (lsrc.fd >= 0) whose connections are served by the loops */
    rpc_src lsrc;
    int lport;
    unsigned next_on;    /* the loop for the next accepted socket, modulo the
                            loops' count (lis_event's thread only; it wraps at
                            840, a multiple of every count up to 8) */
    pthread_mutex_t cmu; /* conns, dead, free_calls, extra (streams) */
    rpc_sconn *conns, *dead;
    rpc_scall *free_calls;
    rpc_scall **extra; /* scalls allocated past ncalls */
    size_t nextra, extracap, max_scalls;
    size_t recv_max;
    _Atomic uint64_t n_conns; /* accepted */
    atomic_size_t live_conns; /* accepted and not freed */
    nng_socket sock;
    nng_listener listener;
    bool listening;
    bool tls_verify; /* a TLS listener with a CA: look up each request's pipe */
    rpc_scall *calls;
    unsigned ncalls;
    rpc_lane lanes[2]; /* [0] every call, [1] coordinate calls when coord_workers > 0 */
    rpc_worker *workers;
    unsigned nworkers;
    bool inline_ok; /* some method has try_inline or start_async */
    atomic_bool stopping;
    atomic_int busy;            /* calls queued or inside a handler */
    _Atomic unsigned async_out; /* asynchronous calls not completed (rpc_async) */
    unsigned max_inflight;
    _Atomic unsigned inflight; /* calls admitted and not answered */
    _Atomic uint64_t n_msgs, n_calls, n_expired, n_shed;
    _Atomic uint64_t n_inline, n_async, n_handoff; /* rpc_server_counters */
    _Atomic uint64_t n_refused;                    /* accepts closed: out of descriptors */
    int spare_fd;     /* with lsrc: a descriptor kept to give up when accept runs out */
    uint64_t warn_ns; /* when running out was last logged (lis_event's thread) */
    /* admission: the longest queue wait, in percent of a call's deadline;
     * the slowness (per mille) over which calls are refused (0 = never) */
    unsigned shed_queue_pct, shed_slow_pct;
    /* moving average of how much of its deadline an answered call took,
     * per mille (arrival to reply): the server's own latency and, for a
     * router or a coordinating node, the replicas' */
    _Atomic unsigned slowness;
};

kv_err rpc_nng_err(int rv)
{
    switch (rv) {
    case 0:
        return KV_OK;
    case NNG_ETIMEDOUT:
        return KV_DEADLINE_EXCEEDED;
    case NNG_ECLOSED:
    case NNG_ECANCELED:
        return KV_CANCELLED;
    case NNG_ENOMEM:
        return KV_RESOURCE_EXHAUSTED;
    case NNG_EINVAL:
    case NNG_EADDRINVAL:
    case NNG_EMSGSIZE:
        return KV_INVALID_ARGUMENT;
    case NNG_ECONNREFUSED:
    case NNG_ECONNRESET:
    case NNG_ECONNSHUT:
    case NNG_EUNREACHABLE:
    case NNG_EADDRINUSE:
        return KV_UNAVAILABLE;
    default:
        return KV_UNKNOWN;
    }
}

kv_err rpc_reply_msg(rpc_ctx *c, const ProtobufCMessage *msg)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return KV_RESOURCE_EXHAUSTED;
    protobuf_c_message_pack(msg, buf);
    free(c->reply);
    c->reply = buf;
    c->reply_len = n;
    return KV_OK;
}

kv_err rpc_fail(rpc_ctx *c, kv_err code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->message, sizeof(c->message), fmt, ap);
    va_end(ap);
    rpc_utf8_fix(c->message, sizeof(c->message)); /* request bytes echoed, a cut character */
    return code;
}

uint32_t rpc_ctx_remaining_ms(const rpc_ctx *c)
{
    uint64_t now = rpc_now_ns();
    return now >= c->deadline_ns ? 0 : (uint32_t)((c->deadline_ns - now) / 1000000ull);
}

int rpc_server_port(const rpc_server *s)
{
    int port = 0;
    if (s->lsrc.fd >= 0)
        return s->lport;
    if (s->streams ? nng_stream_listener_get_int(s->slis, NNG_OPT_TCP_BOUND_PORT, &port) != 0
                   : nng_listener_get_int(s->listener, NNG_OPT_TCP_BOUND_PORT, &port) != 0)
        return -1;
    return port;
}

/* The method called name; NULL for an unknown or missing (NULL) name. */
static const rpc_method *find_method(const rpc_server *s, const char *name)
{
    for (size_t i = 0; name && i < s->opts.nmethods; i++)
        if (strcmp(s->opts.methods[i].name, name) == 0)
            return &s->opts.methods[i];
    return NULL;
}

/* Sets c->admin and c->anonymous from the call's credentials (its token,
 * its pipe's verified certificate); returns false with c's message when
 * the token is wrong (rpc.h: data token, admin token, certificate). */
static bool authenticate(const rpc_server *s, rpc_ctx *c, const Kv__Envelope *env, bool verified)
{
    const char *data = s->opts.auth && *s->opts.auth ? s->opts.auth : NULL;
    const char *admin = s->opts.admin_auth && *s->opts.admin_auth ? s->opts.admin_auth : NULL;
    bool ca = s->tls_verify;
    const ProtobufCBinaryData *tok = &env->auth;
    bool is_admin = admin && rpc_token_eq(tok->data, tok->len, admin);
    bool is_data = data && rpc_token_eq(tok->data, tok->len, data);
    c->anonymous = !admin && !data && !ca; /* authentication off */
    c->admin = verified || is_admin || c->anonymous || (is_data && !admin && !ca);
    if (c->admin || is_data || (!data && tok->len == 0))
        return true;
    if (!data && !admin) /* a certificate is the only admin credential: tokens do not matter */
        return true;
    rpc_fail(c, KV_UNAUTHENTICATED, tok->len ? "wrong auth token" : "missing auth token");
    return false;
}

/* The method of a call whose credentials allow it; NULL with *rv (and c's
 * message) otherwise. */
static const rpc_method *dispatch(rpc_server *s, rpc_ctx *c, const Kv__Envelope *env, bool verified,
                                  kv_err *rv)
{
    if (!authenticate(s, c, env, verified)) {
        *rv = KV_UNAUTHENTICATED;
        return NULL;
    }
    const rpc_method *m = c->mdef;
    if (!m) {
        *rv = rpc_fail(c, KV_UNIMPLEMENTED, "unknown method '%.100s'", env->method);
    } else if (m->access != RPC_DATA && !c->admin) {
        *rv = rpc_fail(c, KV_PERMISSION_DENIED,
                       "%s needs admin credentials: the admin token (--admin-auth) or a "
                       "certificate of the cluster's CA; the data token is not enough",
                       m->name);
        m = NULL;
    }
    return m;
}

/* Whether m serves this call in two phases (rpc_method.start). */
static bool split(const rpc_method *m, bool coordinate)
{
    return m->start && (!m->fn || coordinate);
}

/* A handler that finished past the call's deadline: DEADLINE_EXCEEDED. */
static kv_err past_deadline(rpc_ctx *c, const rpc_method *m, kv_err rv)
{
    if (rv != KV_OK || rpc_now_ns() <= c->deadline_ns)
        return rv;
    free(c->reply);
    c->reply = NULL;
    c->reply_len = 0;
    return rpc_fail(c, KV_DEADLINE_EXCEEDED, "%s finished past its deadline", m->name);
}

/* A call whose deadline passed before its handler started (it waited in
 * the queue): DEADLINE_EXCEEDED, and the handler is not run. */
static bool expired(rpc_server *s, rpc_ctx *c, uint64_t arrival_ns, kv_err *rv)
{
    uint64_t now = rpc_now_ns();
    if (now < c->deadline_ns)
        return false;
    atomic_fetch_add_explicit(&s->n_expired, 1, memory_order_relaxed);
    *rv = rpc_fail(c, KV_DEADLINE_EXCEEDED,
                   "%s not run: its deadline passed after %llu ms in the server's queue",
                   c->method ? c->method : "call",
                   (unsigned long long)((now - arrival_ns) / 1000000ull));
    return true;
}

/* Runs one request through auth, dispatch and deadline checks; fills c and
 * returns the status for the reply. */
static kv_err serve(rpc_server *s, rpc_ctx *c, const Kv__Envelope *env, bool verified,
                    uint64_t arrival_ns)
{
    kv_err rv = KV_OK;
    const rpc_method *m = dispatch(s, c, env, verified, &rv);
    if (!m || expired(s, c, arrival_ns, &rv))
        return rv;
    if (!split(m, c->coordinate)) {
        rv = m->fn(c, env->body.data, env->body.len);
    } else {
        void *state = NULL;
        rv = m->start(c, env->body.data, env->body.len, &state);
        if (rv == KV_OK && state)
            rv = m->finish(c, state);
    }
    return past_deadline(c, m, rv);
}

/* Fills env (and st) as the reply to a call with this id and status. */
static void reply_env(Kv__Envelope *env, Kv__Status *st, uint64_t id, kv_err status, rpc_ctx *c)
{
    /* one place for every status this server sends: a handler may have
     * written request bytes into the message itself */
    rpc_utf8_fix(c->message, sizeof(c->message));
    kv__envelope__init(env);
    kv__status__init(st);
    env->id = id;
    env->map_epoch = c->reply_epoch;
    st->code = (int32_t)status;
    st->message = c->message;
    env->status = st;
    env->body.data = c->reply;
    env->body.len = c->reply_len;
}

/* The relative deadline of a call: its own, the server's default for 0,
 * at most RPC_MAX_DEADLINE_MS. */
static uint32_t call_deadline_ms(const rpc_server *s, const Kv__Envelope *env)
{
    uint32_t dl = env->deadline_ms ? env->deadline_ms : s->opts.default_deadline_ms;
    return dl < RPC_MAX_DEADLINE_MS ? dl : RPC_MAX_DEADLINE_MS;
}

/* Runs one decoded call (env NULL: malformed) that arrived at arrival_ns,
 * with worker index w; fills c and returns its status. */
static kv_err run_call_init(rpc_server *s, int w, const Kv__Envelope *env, rpc_ctx *c,
                            uint64_t arrival_ns)
{
    memset(c, 0, sizeof(*c));
    c->worker = w;
    c->server = s;
    c->user = s->opts.user;
    if (!env)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed request: not a kv.Envelope");
    c->method = env->method;
    c->mdef = find_method(s, env->method); /* once: dispatch and observe use it */
    c->map_epoch = env->map_epoch;
    c->coordinate = env->coordinate;
    c->deadline_ns = arrival_ns + (uint64_t)call_deadline_ms(s, env) * 1000000ull;
    return KV_OK;
}

/* Reports a finished call of a known method to opts.observe. */
static void observe(rpc_server *s, const rpc_ctx *c, kv_err rv, uint64_t t0)
{
    const rpc_method *m = s->opts.observe ? c->mdef : NULL;
    if (m)
        s->opts.observe(s->opts.observe_arg, (size_t)(m - s->opts.methods), rv, rpc_since_ns(t0));
}

static kv_err run_call(rpc_server *s, int w, const Kv__Envelope *env, bool verified, rpc_ctx *c,
                       uint64_t arrival_ns)
{
    uint64_t t0 = rpc_now_ns();
    kv_err rv = run_call_init(s, w, env, c, arrival_ns);
    if (rv != KV_OK)
        return rv;
    rv = serve(s, c, env, verified, arrival_ns);
    observe(s, c, rv, t0);
    return rv;
}

/* ---- lanes ------------------------------------------------------------- */

/* How long the oldest job queued on l has waited (0: none queued). */
static uint64_t lane_wait_ns(rpc_lane *l, uint64_t now)
{
    pthread_mutex_lock(&l->mu);
    uint64_t since = l->head ? l->head->queued_ns : now;
    pthread_mutex_unlock(&l->mu);
    return now > since ? now - since : 0;
}

/* Queues jobs first..last (linked) and wakes up to n idle workers; when
 * live_only, not on a stopped lane (false then, nothing queued). */
static bool lane_push_if(rpc_lane *l, rpc_job *first, rpc_job *last, unsigned n, bool live_only)
{
    uint64_t now = rpc_now_ns();
    for (rpc_job *j = first; j; j = j == last ? NULL : j->next)
        j->queued_ns = now;
    pthread_mutex_lock(&l->mu);
    if (live_only && l->stop) {
        pthread_mutex_unlock(&l->mu);
        return false;
    }
    last->next = NULL;
    if (l->tail)
        l->tail->next = first;
    else
        l->head = first;
    l->tail = last;
    if (l->idle && n >= l->idle)
        pthread_cond_broadcast(&l->cv);
    else
        for (unsigned i = 0; i < n && i < l->idle; i++)
            pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
    return true;
}

static void lane_push(rpc_lane *l, rpc_job *first, rpc_job *last, unsigned n)
{
    lane_push_if(l, first, last, n, false);
}

/* The next job, waiting for one; NULL once the lane stops. */
static rpc_job *lane_pop(rpc_lane *l)
{
    pthread_mutex_lock(&l->mu);
    while (!l->head && !l->stop) {
        l->idle++;
        pthread_cond_wait(&l->cv, &l->mu);
        l->idle--;
    }
    rpc_job *j = l->stop ? NULL : l->head;
    if (j) {
        l->head = j->next;
        if (!l->head)
            l->tail = NULL;
    }
    pthread_mutex_unlock(&l->mu);
    return j;
}

/* ---- calls ------------------------------------------------------------- */

static void post_recv(rpc_scall *k)
{
    if (!k->srv->streams && !atomic_load(&k->srv->stopping))
        nng_ctx_recv(k->ctx, k->aio);
}

static void send_msg(rpc_scall *k, nng_msg *msg);

/* Answers k at once with status and c's message, from the receive's
 * completion: no worker is involved. */
static void answer_now(rpc_scall *k, kv_err status, rpc_ctx *c)
{
    Kv__Envelope env;
    Kv__Status st;
    reply_env(&env, &st, k->env ? k->env->id : 0, status, c);
    send_msg(k, rpc_wire_env_msg(&env));
}

/* Admission of the request k just received (issue 16 item 5): KV_OK with
 * k->admitted set (its calls, counted in flight), or the status to answer
 * at once (c's message says why): INVALID_ARGUMENT for a request that is
 * not an envelope or an rpc.Calls message over RPC_MAX_CALLS,
 * RESOURCE_EXHAUSTED when max_inflight calls are in flight or the queue is
 * too slow for the call's deadline. */
static kv_err admit(rpc_server *s, rpc_scall *k, rpc_ctx *c)
{
    const Kv__Envelope *env = k->env;
    if (!env)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed request: not a kv.Envelope");
    size_t n = 1;
    if (env->method && strcmp(env->method, "rpc.Calls") == 0 &&
        rpc_pb_count(env->body.data, env->body.len, 1, &n) && n > RPC_MAX_CALLS)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "rpc.Calls message of %zu calls, over the %u limit",
                        n, RPC_MAX_CALLS);
    n = n ? n : 1; /* an empty or malformed Calls body is answered by a worker */
    atomic_fetch_add_explicit(&s->n_msgs, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->n_calls, n, memory_order_relaxed);
    unsigned before = atomic_fetch_add(&s->inflight, (unsigned)n);
    if (before && before + n > s->max_inflight) {
        atomic_fetch_sub(&s->inflight, (unsigned)n);
        atomic_fetch_add_explicit(&s->n_shed, n, memory_order_relaxed);
        return rpc_fail(c, KV_RESOURCE_EXHAUSTED,
                        "server overloaded: %u calls in flight, the limit is %u (--max-inflight)",
                        before, s->max_inflight);
    }
    k->admitted = (unsigned)n;
    uint32_t dl = call_deadline_ms(s, env);
    k->deadline_ms = dl;
    uint64_t waited = lane_wait_ns(&s->lanes[k->lane], k->arrival_ns);
    uint64_t max_wait = (uint64_t)dl * 10000ull * s->shed_queue_pct;
    if (max_wait > RPC_MAX_QUEUE_WAIT_NS) /* calls with long deadlines make no long queue */
        max_wait = RPC_MAX_QUEUE_WAIT_NS;
    unsigned slow = atomic_load_explicit(&s->slowness, memory_order_relaxed);
    unsigned lo = s->shed_slow_pct * 10u; /* per mille */
    if (before && lo && slow > lo) {
        /* refused with a probability growing from 0 at lo to 1 at 2 lo */
        uint64_t x = k->arrival_ns ^ (uint64_t)(uintptr_t)k;
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdull;
        x ^= x >> 33;
        if (x % lo < slow - lo) {
            atomic_fetch_sub(&s->inflight, k->admitted);
            k->admitted = 0;
            atomic_fetch_add_explicit(&s->n_shed, n, memory_order_relaxed);
            return rpc_fail(c, KV_RESOURCE_EXHAUSTED,
                            "server overloaded: its calls take %u%% of their deadlines", slow / 10);
        }
    }
    if (waited > max_wait) {
        atomic_fetch_sub(&s->inflight, k->admitted);
        k->admitted = 0;
        atomic_fetch_add_explicit(&s->n_shed, n, memory_order_relaxed);
        return rpc_fail(c, KV_RESOURCE_EXHAUSTED,
                        "server overloaded: calls wait %llu ms in its queue, over half of this "
                        "call's %u ms deadline",
                        (unsigned long long)(waited / 1000000ull), dl);
    }
    return KV_OK;
}

static bool serve_inline(rpc_server *s, rpc_scall *k);
static void call_arrived(rpc_server *s, rpc_scall *k);
static void stream_reply(rpc_scall *k, nng_msg *msg);

/* The context's aio completion, on an nng thread: a reply went out (post
 * the next receive) or a request came in (decode it, admit it, serve it
 * here when its method can without blocking, else queue it). */
static void call_cb(void *arg)
{
    rpc_scall *k = arg;
    rpc_server *s = k->srv;
    int rv = nng_aio_result(k->aio);
    if (k->sending) {
        k->sending = false;
        if (rv != 0) /* the peer went away: the reply is ours to free */
            nng_msg_free(nng_aio_get_msg(k->aio));
        post_recv(k);
        return;
    }
    if (rv == NNG_ECLOSED || rv == NNG_ECANCELED)
        return; /* the server is closing: this context stops */
    if (rv != 0) {
        post_recv(k);
        return;
    }
    k->req = nng_aio_get_msg(k->aio);
    nng_aio_set_msg(k->aio, NULL);
    k->verified = false;
    if (s->tls_verify &&
        nng_pipe_get_bool(nng_msg_get_pipe(k->req), NNG_OPT_TLS_VERIFIED, &k->verified) != 0)
        k->verified = false;
    call_arrived(s, k);
}

/* A request arrived in k (k->req, k->verified): decode it, admit it, serve
 * it here when its method can without blocking, else queue it. */
static void call_arrived(rpc_server *s, rpc_scall *k)
{
    k->arrival_ns = rpc_now_ns();
    size_t len = nng_msg_len(k->req);
    /* unknown fields cost memory too: what an envelope may make us allocate is bounded */
    k->env = rpc_wire_env_unpack(rpc_arena_pb(&k->ar, rpc_unpack_budget(len, 0)), len,
                                 nng_msg_body(k->req));
    k->lane = k->env && k->env->coordinate && s->opts.coord_workers > 0 ? 1 : 0;
    k->admitted = 0;
    rpc_ctx c = {0};
    kv_err verdict = admit(s, k, &c);
    if (verdict != KV_OK) {
        answer_now(k, verdict, &c);
        return;
    }
    if (s->inline_ok && serve_inline(s, k))
        return;
    atomic_fetch_add(&s->busy, 1);
    lane_push(&s->lanes[k->lane], &k->job, &k->job, 1);
}

/* Sends msg as k's reply (NULL: out of memory, no reply) and frees the
 * request. k is not touched after the send: its completion may already run
 * on another thread. */
static void send_reply(rpc_scall *k, nng_msg *msg)
{
    rpc_server *s = k->srv;
    atomic_fetch_sub(&s->busy, 1);
    send_msg(k, msg);
}

/* Sends msg as k's reply (NULL: out of memory, no reply), frees the request
 * and releases its admission. */
static void send_msg(rpc_scall *k, nng_msg *msg)
{
    rpc_server *s = k->srv;
    nng_msg_free(k->req);
    k->req = NULL;
    k->env = NULL;
    rpc_arena_reset(&k->ar); /* env, and the group's calls */
    if (k->admitted) {
        uint64_t took = rpc_since_ns(k->arrival_ns);
        uint64_t pm = took * 1000u / ((uint64_t)k->deadline_ms * 1000000u + 1);
        unsigned old = atomic_load_explicit(&s->slowness, memory_order_relaxed);
        unsigned v = (unsigned)((old * 7u + (pm > 4000 ? 4000 : pm)) / 8u);
        atomic_store_explicit(&s->slowness, v, memory_order_relaxed); /* lossy: an estimate */
        atomic_fetch_sub(&s->inflight, k->admitted);
    }
    k->admitted = 0;
    if (!msg)
        KV_ERROR("rpc", "out of memory building a reply");
    if (s->streams) {
        stream_reply(k, msg);
        return;
    }
    if (!msg) {
        post_recv(k);
        return;
    }
    k->sending = true;
    nng_aio_set_msg(k->aio, msg);
    nng_ctx_send(k->ctx, k->aio);
}

/* Sends the reply of single call k: status and c's message and body. */
static void reply_one(rpc_scall *k, kv_err status, rpc_ctx *c)
{
    Kv__Envelope env;
    Kv__Status st;
    reply_env(&env, &st, k->env ? k->env->id : 0, status, c);
    nng_msg *msg = rpc_wire_env_msg(&env);
    free(c->reply);
    send_reply(k, msg);
}

static void handle_one(rpc_worker *w, rpc_scall *k)
{
    rpc_ctx c;
    kv_err status = run_call(w->srv, w->index, k->env, k->verified, &c, k->arrival_ns);
    reply_one(k, status, &c);
}

/* Runs call env on the receive callback's thread with its method's
 * try_inline, through the same checks as run_call (credentials, deadline,
 * observer); false when the method has none or it declined: then the call
 * goes to a worker, which starts over with a fresh context. */
static bool try_call(rpc_server *s, const Kv__Envelope *env, bool verified, uint64_t arrival_ns,
                     rpc_ctx *c, kv_err *out)
{
    const rpc_method *m = find_method(s, env->method);
    if (!m || !m->try_inline || (split(m, env->coordinate) && !m->inline_coordinate))
        return false;
    uint64_t t0 = rpc_now_ns();
    kv_err rv = run_call_init(s, -1, env, c, arrival_ns);
    if (rv == KV_OK && dispatch(s, c, env, verified, &rv) == m && !expired(s, c, arrival_ns, &rv)) {
        if (!m->try_inline(c, env->body.data, env->body.len, &rv)) {
            free(c->reply);
            return false;
        }
        atomic_fetch_add_explicit(&s->n_inline, 1, memory_order_relaxed);
        rv = past_deadline(c, m, rv);
    }
    observe(s, c, rv, t0);
    *out = rv;
    return true;
}

/* ---- rpc.Calls: several calls in one message ----------------------------- */

/* Frees what g's replies hold; g itself, its arrays and calls are in its
 * context's arena (group_new), which the reply's send resets. */
static void group_free(rpc_group *g)
{
    for (size_t i = 0; i < g->calls->n_calls; i++) {
        free(g->rep[i].body.data);
        free(g->msgs[i]);
    }
    free(g->ctx);
}

/* Keeps call i's reply envelope (status, message, c's reply body). */
static void group_keep(rpc_group *g, size_t i, kv_err status, rpc_ctx *c)
{
    reply_env(&g->rep[i], &g->st[i], g->calls->calls[i]->id, status, c);
    g->msgs[i] = c->message[0] ? strdup(c->message) : NULL;
    g->st[i].message = g->msgs[i] ? g->msgs[i] : "";
    g->ptrs[i] = &g->rep[i];
}

/* Runs call i of g and keeps its reply envelope. */
static void group_run(rpc_server *s, int w, rpc_group *g, size_t i)
{
    rpc_ctx c;
    kv_err status = run_call(s, w, g->calls->calls[i], g->k->verified, &c, g->k->arrival_ns);
    group_keep(g, i, status, &c);
}

/* Whether every call of g has a split method (rpc_method.start). */
static bool group_split(rpc_server *s, const rpc_group *g)
{
    for (size_t i = 0; i < g->calls->n_calls; i++) {
        const rpc_method *m = find_method(s, g->calls->calls[i]->method);
        if (!m || !split(m, g->calls->calls[i]->coordinate))
            return false;
    }
    return g->calls->n_calls > 0;
}

/* Split mode: every call of g is started, then every one is finished, on
 * this worker, so all their forwards are in flight at once. */
static void group_split_run(rpc_server *s, int w, rpc_group *g)
{
    size_t n = g->calls->n_calls;
    uint64_t t0 = rpc_now_ns();
    void **state = calloc(n, sizeof(*state));
    const rpc_method **ms = calloc(n, sizeof(*ms));
    kv_err *st = calloc(n, sizeof(*st));
    g->ctx = calloc(n, sizeof(*g->ctx));
    if (!state || !ms || !st || !g->ctx) { /* one after another, as without split */
        for (size_t i = 0; i < n; i++)
            group_run(s, w, g, i);
        n = 0;
    }
    for (size_t i = 0; i < n; i++) {
        const Kv__Envelope *env = g->calls->calls[i];
        rpc_ctx *c = &g->ctx[i];
        st[i] = run_call_init(s, w, env, c, g->k->arrival_ns);
        if (st[i] == KV_OK && (ms[i] = dispatch(s, c, env, g->k->verified, &st[i])) != NULL &&
            expired(s, c, g->k->arrival_ns, &st[i]))
            ms[i] = NULL; /* not started: no finish, no past_deadline */
        else if (ms[i])
            st[i] = ms[i]->start(c, env->body.data, env->body.len, &state[i]);
    }
    for (size_t i = 0; i < n; i++) {
        if (st[i] == KV_OK && state[i])
            st[i] = ms[i]->finish(&g->ctx[i], state[i]);
        if (ms[i]) {
            st[i] = past_deadline(&g->ctx[i], ms[i], st[i]);
            observe(s, &g->ctx[i], st[i], t0);
        }
        group_keep(g, i, st[i], &g->ctx[i]);
    }
    free(state);
    free(ms);
    free(st);
}

/* Sends the Calls reply of g once every call ran, and frees g. */
static void group_reply(rpc_group *g)
{
    Kv__Calls calls = KV__CALLS__INIT;
    calls.n_calls = g->calls->n_calls;
    calls.calls = g->ptrs;
    rpc_ctx c = {0};
    Kv__Envelope env;
    Kv__Status st;
    reply_env(&env, &st, g->k->env->id, KV_OK, &c);
    nng_msg *msg = rpc_wire_env_calls_msg(&env, &calls); /* the replies as its body */
    rpc_scall *k = g->k;
    group_free(g);
    send_reply(k, msg);
}

/* A group for k's rpc.Calls body; NULL with *status and c's message when
 * the body is malformed or memory runs out. */
static rpc_group *group_new(rpc_scall *k, rpc_ctx *c, kv_err *status)
{
    const Kv__Envelope *env = k->env;
    rpc_arena *ar = &k->ar; /* this thread's until the group is handed on */
    Kv__Calls *calls =
        rpc_wire_calls_unpack(rpc_arena_pb(ar, rpc_unpack_budget(env->body.len, RPC_MAX_CALLS)),
                              env->body.len, env->body.data);
    if (!calls) {
        *status = rpc_fail(c, KV_INVALID_ARGUMENT, "malformed rpc.Calls body");
        return NULL;
    }
    size_t n = calls->n_calls;
    rpc_group *g = n > (SIZE_MAX - sizeof(*g)) / sizeof(rpc_sub)
                       ? NULL
                       : rpc_arena_calloc(ar, 1, sizeof(*g) + n * sizeof(rpc_sub));
    if (g) {
        g->calls = calls;
        g->rep = rpc_arena_calloc(ar, n ? n : 1, sizeof(*g->rep));
        g->st = rpc_arena_calloc(ar, n ? n : 1, sizeof(*g->st));
        g->ptrs = rpc_arena_calloc(ar, n ? n : 1, sizeof(*g->ptrs));
        g->msgs = rpc_arena_calloc(ar, n ? n : 1, sizeof(*g->msgs));
    }
    if (!g || !g->rep || !g->st || !g->ptrs || !g->msgs) {
        *status = rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory for %zu calls", n);
        return NULL; /* the arena keeps what was taken until the reply */
    }
    g->k = k;
    atomic_init(&g->left, 1); /* the creator's */
    return g;
}

/* Drops a reference to g; the last sends the reply. acq_rel: the last
 * sees every other call's reply. */
static void group_put(rpc_group *g)
{
    if (atomic_fetch_sub_explicit(&g->left, 1, memory_order_acq_rel) == 1)
        group_reply(g);
}

static void group_run_from(rpc_worker *w, rpc_group *g, size_t from);

/* An rpc.Calls message: its calls run one after another on this worker,
 * or, on a parallel lane (handlers that wait for other processes), as jobs
 * of their own; the last to finish sends the reply. The message's own
 * token is checked too (each call's is, as if it came alone). */
static void handle_calls(rpc_worker *w, rpc_scall *k)
{
    rpc_ctx c = {0};
    kv_err status = KV_OK;
    rpc_group *g = NULL;
    if (!authenticate(w->srv, &c, k->env, k->verified))
        status = KV_UNAUTHENTICATED;
    else
        g = group_new(k, &c, &status);
    if (!g) {
        Kv__Envelope env;
        Kv__Status st;
        reply_env(&env, &st, k->env->id, status, &c);
        send_reply(k, rpc_wire_env_msg(&env));
        return;
    }
    if (group_split(w->srv, g)) {
        group_split_run(w->srv, w->index, g);
        group_reply(g);
        return;
    }
    group_run_from(w, g, 0);
}

/* Runs the calls of g from `from` on (those before ran already or run
 * asynchronously), one after another on this worker, or as jobs of their
 * own on a parallel lane; consumes the caller's reference to g. */
static void group_run_from(rpc_worker *w, rpc_group *g, size_t from)
{
    size_t n = g->calls->n_calls;
    if (from == n || !w->lane->parallel) {
        for (size_t i = from; i < n; i++)
            group_run(w->srv, w->index, g, i);
        group_put(g);
        return;
    }
    /* the caller's reference becomes the first sub's; one more per other
     * sub, taken before any is queued */
    atomic_fetch_add_explicit(&g->left, n - from - 1, memory_order_relaxed);
    for (size_t i = from; i < n; i++)
        g->subs[i] =
            (rpc_sub){.job = {.next = i + 1 < n ? &g->subs[i + 1].job : NULL, .kind = JOB_SUB},
                      .g = g,
                      .i = i};
    lane_push(w->lane, &g->subs[from].job, &g->subs[n - 1].job, (unsigned)(n - from));
}

/* ---- asynchronous calls (rpc_method.start_async) ----------------------- */

void rpc_async_done(rpc_async *a, kv_err status)
{
    rpc_server *s = a->s;
    status = past_deadline(&a->c, a->m, status);
    observe(s, &a->c, status, a->t0);
    if (a->g) {
        group_keep(a->g, a->i, status, &a->c); /* the group frees the reply body */
        group_put(a->g);
    } else {
        reply_one(a->k, status, &a->c);
    }
    /* a is in its context's arena (try_async), which the reply's send
     * resets: not touched past the reply */
    /* last: rpc_server_close may free s once this reaches 0 */
    atomic_fetch_sub_explicit(&s->async_out, 1, memory_order_release);
}

void rpc_async_handoff(rpc_async *a, kv_err (*fn)(rpc_ctx *c, void *arg), void *arg)
{
    atomic_fetch_add_explicit(&a->s->n_handoff, 1, memory_order_relaxed);
    a->work = fn;
    a->work_arg = arg;
    a->job.kind = JOB_ASYNC;
    if (lane_push_if(&a->s->lanes[a->k->lane], &a->job, &a->job, 1, true))
        return;
    /* shutting down, the workers gone: run it here (bounded by its deadline) */
    rpc_async_done(a, fn(&a->c, arg));
}

static void handle_async(rpc_worker *w, rpc_async *a)
{
    a->c.worker = w->index;
    rpc_async_done(a, a->work(&a->c, a->work_arg));
}

/* Starts call env of k (call i of group g, or alone when g is NULL) with
 * its method's start_async on the receive callback's thread. False when
 * the method has none or declined: nothing happened, the call goes to a
 * worker. True when the call was taken, or answered at once because its
 * credentials, method or deadline failed the checks. */
static bool try_async(rpc_server *s, rpc_scall *k, const Kv__Envelope *env, rpc_group *g, size_t i)
{
    const rpc_method *m = find_method(s, env->method);
    if (!m || !m->start_async || !split(m, env->coordinate))
        return false;
    /* from k's arena: only this thread allocates there until the reply
     * (a group's reply waits for this callback's reference) */
    rpc_async *a = rpc_arena_alloc(&k->ar, sizeof(*a));
    if (!a)
        return false;
    *a = (rpc_async){.s = s, .k = k, .g = g, .i = i, .m = m, .t0 = rpc_now_ns()};
    kv_err rv = run_call_init(s, -1, env, &a->c, k->arrival_ns);
    bool checked = rv == KV_OK && dispatch(s, &a->c, env, k->verified, &rv) == m &&
                   !expired(s, &a->c, k->arrival_ns, &rv);
    /* counted before the start: the work may complete the call at once */
    atomic_fetch_add_explicit(&s->async_out, 1, memory_order_relaxed);
    if (g)
        atomic_fetch_add_explicit(&g->left, 1, memory_order_relaxed);
    else
        atomic_fetch_add(&s->busy, 1);
    if (!checked) {
        rpc_async_done(a, rv);
        return true;
    }
    if (m->start_async(&a->c, env->body.data, env->body.len, a)) {
        atomic_fetch_add_explicit(&s->n_async, 1, memory_order_relaxed);
        return true;
    }
    /* declined: undo (a's c holds nothing: see rpc_async_fn) */
    if (g)
        atomic_fetch_sub_explicit(&g->left, 1, memory_order_relaxed);
    else
        atomic_fetch_sub(&s->busy, 1);
    free(a->c.reply); /* a stays in the arena until the reply */
    atomic_fetch_sub_explicit(&s->async_out, 1, memory_order_release);
    return false;
}

/* ---- inline service ------------------------------------------------------ */

/* Whether env's method serves it with start_async. */
static bool async_method(rpc_server *s, const Kv__Envelope *env)
{
    const rpc_method *m = find_method(s, env->method);
    return m && m->start_async && split(m, env->coordinate);
}

/* Serves what it can of rpc.Calls message k on the receive callback's
 * thread: calls whose methods' try_inline serve them or whose start_async
 * takes them; a call start_async declines goes to a worker alone; the
 * calls from the first that try_inline declines on go, in order, to a
 * worker as one job (handle_sub: rest). False, with nothing
 * done, when the message is malformed or unauthenticated, or split
 * (group_split_run) without asynchronous methods: a worker takes all of
 * it, as without inline service. */
static bool calls_inline(rpc_server *s, rpc_scall *k)
{
    rpc_ctx c = {0};
    kv_err status = KV_OK;
    rpc_group *g = authenticate(s, &c, k->env, k->verified) ? group_new(k, &c, &status) : NULL;
    /* split methods without start_async: a worker's group_split_run */
    if (g && group_split(s, g) && !async_method(s, g->calls->calls[0])) {
        group_free(g);
        g = NULL;
    }
    if (!g)
        return false;
    atomic_fetch_add(&s->busy, 1);
    size_t n = g->calls->n_calls, i = 0;
    rpc_burst_begin(); /* the calls the asynchronous starts make leave together */
    for (; i < n; i++) {
        const Kv__Envelope *env = g->calls->calls[i];
        if (try_call(s, env, k->verified, k->arrival_ns, &c, &status)) {
            group_keep(g, i, status, &c);
        } else if (try_async(s, k, env, g, i)) {
            continue;
        } else if (async_method(s, env)) {
            /* start_async declined this one (it would block): a worker
             * runs it alone, and the calls after it go on here */
            atomic_fetch_add_explicit(&g->left, 1, memory_order_relaxed);
            g->subs[i] = (rpc_sub){.job = {.kind = JOB_SUB}, .g = g, .i = i};
            lane_push(&s->lanes[k->lane], &g->subs[i].job, &g->subs[i].job, 1);
        } else {
            break;
        }
    }
    rpc_burst_end();
    if (i < n) {
        /* the rest is one job holding one reference (drop_queued drops it) */
        atomic_fetch_add_explicit(&g->left, 1, memory_order_relaxed);
        g->subs[i] = (rpc_sub){.job = {.kind = JOB_SUB}, .g = g, .i = i, .rest = true};
        lane_push(&s->lanes[k->lane], &g->subs[i].job, &g->subs[i].job, 1);
    }
    group_put(g); /* this callback's reference */
    return true;
}

/* Serves k on the receive callback's thread when its method can without
 * blocking (rpc_method.try_inline) or asynchronously (start_async): saves
 * a worker's wake-up and the two hand-offs. True when k was answered,
 * taken or handed on as calls left over. */
static bool serve_inline(rpc_server *s, rpc_scall *k)
{
    const Kv__Envelope *env = k->env;
    if (env->method && strcmp(env->method, "rpc.Calls") == 0)
        return calls_inline(s, k);
    rpc_ctx c;
    kv_err status;
    if (!try_call(s, env, k->verified, k->arrival_ns, &c, &status))
        return try_async(s, k, env, NULL, 0);
    atomic_fetch_add(&s->busy, 1);
    reply_one(k, status, &c);
    return true;
}

static void handle_sub(rpc_worker *w, rpc_sub *sub)
{
    rpc_group *g = sub->g;
    if (sub->rest) {
        group_run_from(w, g, sub->i);
        return;
    }
    group_run(w->srv, w->index, g, sub->i);
    group_put(g);
}

static void *worker_main(void *arg)
{
    rpc_worker *w = arg;
    rpc_server *s = w->srv;
    if (s->opts.thread_start)
        s->opts.thread_start(w->index, s->opts.user);
    rpc_job *j;
    while ((j = lane_pop(w->lane)) != NULL) {
        if (j->kind == JOB_SUB) {
            handle_sub(w, (rpc_sub *)j);
            continue;
        }
        if (j->kind == JOB_ASYNC) {
            handle_async(w, (rpc_async *)j);
            continue;
        }
        rpc_scall *k = (rpc_scall *)j;
        if (k->env && k->env->method && strcmp(k->env->method, "rpc.Calls") == 0)
            handle_calls(w, k);
        else
            handle_one(w, k);
    }
    if (s->opts.thread_stop)
        s->opts.thread_stop(w->index, s->opts.user);
    return NULL;
}

/* ---- lifecycle --------------------------------------------------------- */

/* ---- streams: requests taken off nng byte streams (rpc_conn.h) ------------ */

static void sconn_unref(rpc_sconn *sc)
{
    if (atomic_fetch_sub(&sc->refs, 1) != 1)
        return;
    rpc_server *s = sc->srv;
    pthread_mutex_lock(&s->cmu);
    sc->next = s->dead;
    s->dead = sc;
    pthread_mutex_unlock(&s->cmu);
}

/* Frees the connections that ended and hold no request (not from one of
 * their callbacks: rpc_conn_free waits for those). */
static void sconn_reap(rpc_server *s)
{
    pthread_mutex_lock(&s->cmu);
    rpc_sconn *d = s->dead;
    s->dead = NULL;
    pthread_mutex_unlock(&s->cmu);
    for (rpc_sconn *next; d; d = next) {
        next = d->next;
        rpc_conn_free(d->c);
        free(d);
        atomic_fetch_sub(&s->live_conns, 1);
    }
}

/* A free call slot, or a new one while fewer than max_scalls exist; NULL
 * past that (or out of memory). */
static rpc_scall *scall_get(rpc_server *s)
{
    pthread_mutex_lock(&s->cmu);
    rpc_scall *k = s->free_calls;
    if (k) {
        s->free_calls = k->next_free;
    } else if (s->ncalls + s->nextra < s->max_scalls) {
        if (s->nextra == s->extracap) {
            size_t cap = s->extracap ? 2 * s->extracap : 64;
            rpc_scall **n = realloc(s->extra, cap * sizeof(*n));
            if (n) {
                s->extra = n;
                s->extracap = cap;
            }
        }
        k = s->nextra < s->extracap ? calloc(1, sizeof(*k)) : NULL;
        if (k) {
            k->srv = s;
            rpc_arena_init(&k->ar, NULL, 0);
            s->extra[s->nextra++] = k;
        }
    }
    pthread_mutex_unlock(&s->cmu);
    return k;
}

static void scall_put(rpc_scall *k)
{
    rpc_server *s = k->srv;
    pthread_mutex_lock(&s->cmu);
    k->next_free = s->free_calls;
    s->free_calls = k;
    pthread_mutex_unlock(&s->cmu);
}

/* send_msg's end for streams: msg (NULL: no reply) goes to k's connection
 * behind the replies before it; k and its reference are released. */
static void stream_reply(rpc_scall *k, nng_msg *msg)
{
    rpc_sconn *sc = k->conn;
    k->conn = NULL;
    if (msg) {
        /* fails only when the connection ended: the caller learns it there */
        (void)rpc_conn_send(sc->c, k->bt, k->btlen, nng_msg_body(msg), nng_msg_len(msg));
        nng_msg_free(msg);
    }
    scall_put(k);
    sconn_unref(sc);
}

/* A request that finds every call slot taken (max_scalls: the admission
 * limit and the contexts) is answered RESOURCE_EXHAUSTED from here. */
static void stream_refuse(rpc_sconn *sc, const uint8_t *hdr, size_t hlen, nng_msg *body)
{
    rpc_server *s = sc->srv;
    uint8_t buf[512];
    rpc_arena ar;
    rpc_arena_init(&ar, buf, sizeof(buf));
    size_t len = nng_msg_len(body);
    Kv__Envelope *env =
        rpc_wire_env_unpack(rpc_arena_pb(&ar, rpc_unpack_budget(len, 0)), len, nng_msg_body(body));
    rpc_ctx c = {0};
    rpc_fail(&c, KV_RESOURCE_EXHAUSTED,
             "server overloaded: %zu requests held unanswered, its limit", s->max_scalls);
    Kv__Envelope rep;
    Kv__Status st;
    reply_env(&rep, &st, env ? env->id : 0, KV_RESOURCE_EXHAUSTED, &c);
    nng_msg *m = rpc_wire_env_msg(&rep);
    if (m) {
        (void)rpc_conn_send(sc->c, hdr, hlen, nng_msg_body(m), nng_msg_len(m));
        nng_msg_free(m);
    }
    atomic_fetch_add_explicit(&s->n_shed, 1, memory_order_relaxed);
    rpc_arena_reset(&ar);
    nng_msg_free(body);
}

/* A request on connection sc (its reading thread): into a call slot, then
 * as any received request (call_arrived). */
static void stream_frame(void *arg, rpc_conn *c, const uint8_t *hdr, size_t hlen, nng_msg *body)
{
    rpc_sconn *sc = arg;
    rpc_server *s = sc->srv;
    if (atomic_load(&s->stopping)) { /* closing: as a socket with no receive posted */
        nng_msg_free(body);
        return;
    }
    rpc_scall *k = scall_get(s);
    if (!k) {
        stream_refuse(sc, hdr, hlen, body);
        return;
    }
    atomic_fetch_add(&sc->refs, 1);
    k->conn = sc;
    memcpy(k->bt, hdr, hlen);
    k->btlen = hlen;
    if (sc->verified < 0) /* TLS has finished its handshake once data flows */
        sc->verified = s->tls_verify && rpc_conn_verified(c);
    k->verified = sc->verified > 0;
    k->req = body;
    call_arrived(s, k);
}

static void stream_down(void *arg, rpc_conn *c, int rv)
{
    (void)c;
    rpc_sconn *sc = arg;
    rpc_server *s = sc->srv;
    pthread_mutex_lock(&s->cmu);
    if (sc->prev)
        sc->prev->next = sc->next;
    else if (s->conns == sc)
        s->conns = sc->next;
    if (sc->next)
        sc->next->prev = sc->prev;
    sc->next = sc->prev = NULL;
    pthread_mutex_unlock(&s->cmu);
    if (rv == NNG_EPROTO || rv == NNG_EMSGSIZE)
        KV_DEBUG("rpc", "dropped a connection to %s: %s", s->opts.url, nng_strerror(rv));
    sconn_unref(sc);
}

/* A connection accepted (st, or plain socket fd when st is NULL) joins
 * the server's list and starts. */
static void sconn_add(rpc_server *s, nng_stream *st, int fd)
{
    rpc_sconn *sc = calloc(1, sizeof(*sc));
    rpc_conn_cb cb = {.frame = stream_frame, .down = stream_down, .arg = sc};
    size_t out_max = RPC_OUT_MAX(s->recv_max);
    rpc_conn *c = NULL;
    if (sc && st)
        c = rpc_conn_new(st, RPC_SP_REP, RPC_SP_REQ, s->recv_max, out_max, &cb);
    else if (sc) { /* spread over the loops in turn, whatever else registers */
        int on = (int)s->next_on;
        s->next_on = (s->next_on + 1) % 840;
        c = rpc_conn_new_fd(fd, on, RPC_SP_REP, RPC_SP_REQ, s->recv_max, out_max, &cb);
    } else if (st)
        nng_stream_free(st);
    else
        close(fd);
    if (!c) {
        free(sc);
        return;
    }
    sc->srv = s;
    sc->c = c;
    sc->verified = -1;
    atomic_init(&sc->refs, 1);
    pthread_mutex_lock(&s->cmu);
    sc->next = s->conns;
    if (s->conns)
        s->conns->prev = sc;
    s->conns = sc;
    pthread_mutex_unlock(&s->cmu);
    atomic_fetch_add_explicit(&s->n_conns, 1, memory_order_relaxed);
    atomic_fetch_add(&s->live_conns, 1);
    rpc_conn_start(c);
}

static void stream_accept_cb(void *arg)
{
    rpc_server *s = arg;
    int rv = nng_aio_result(s->accept_aio);
    sconn_reap(s);
    if (rv == 0) {
        sconn_add(s, nng_aio_get_output(s->accept_aio, 0), -1);
    } else if (rv == NNG_ECLOSED || rv == NNG_ECANCELED) {
        return; /* the server is closing */
    } else {
        KV_WARN("rpc", "accepting a connection on %s: %s", s->opts.url, nng_strerror(rv));
        nng_msleep(10); /* out of descriptors, say: do not spin */
    }
    if (!atomic_load(&s->stopping))
        nng_stream_listener_accept(s->slis, s->accept_aio);
}

/* The listening socket's event on its loop: every connection waiting. */
/* Out of descriptors (err): gives the spare one up to accept the first
 * waiting connection and close it at once, so its client learns now
 * instead of waiting in the backlog, and the listener does not stay ready
 * for a loop that can do nothing else (libuv and nginx do the same); then
 * takes the spare back. 1: one was closed; 0: none was waiting (accept
 * reports running out before it looks at the backlog); -1: no spare. */
static int refuse_one(rpc_server *s, int err)
{
    if (s->spare_fd < 0 && (s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0)
        return -1;
    close(s->spare_fd);
    int fd = accept4(s->lsrc.fd, NULL, NULL, SOCK_CLOEXEC), e = errno;
    if (fd >= 0) { /* counted before its client can see the end */
        atomic_fetch_add_explicit(&s->n_refused, 1, memory_order_relaxed);
        close(fd);
    }
    s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return e == EAGAIN || e == EWOULDBLOCK || e == EINTR || e == ECONNABORTED ? 0 : -1;
    uint64_t now = kv_now_ns();
    if (!s->warn_ns || now - s->warn_ns > 5000000000ull) {
        s->warn_ns = now;
        KV_WARN("rpc",
                "%s: out of descriptors (%s): closing new connections at once until some "
                "are free (raise the open-files limit, ulimit -n)",
                s->opts.url, strerror(err));
    }
    return 1;
}

static void lis_event(rpc_src *src, uint32_t events)
{
    (void)events;
    rpc_server *s = (rpc_server *)((char *)src - offsetof(rpc_server, lsrc));
    sconn_reap(s);
    for (int i = 0; i < 64 && !atomic_load(&s->stopping); i++) {
        int fd = accept4(src->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC), one = 1;
        if (fd < 0) {
            int e = errno;
            if (e == EAGAIN || e == EWOULDBLOCK || e == EINTR || e == ECONNABORTED)
                return;
            int r = e == EMFILE || e == ENFILE ? refuse_one(s, e) : -1;
            if (r > 0)
                continue;
            if (r == 0)
                return;
            /* the socket stays ready and nothing more can be done now: do
             * not spin (only when even the spare descriptor is gone) */
            KV_WARN("rpc", "accepting a connection on %s: %s", s->opts.url, strerror(e));
            nng_msleep(10);
            return;
        }
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        sconn_add(s, NULL, fd);
    }
}

/* open_socket for streams: 0 or nng's error. */
static int stream_listen(rpc_server *s, nng_tls_config *tls)
{
    int rv;
    if (!tls && strncmp(s->opts.url, "tcp://", 6) == 0 && !!rpc_loop_wanted()) {
        char err[256];
        s->lsrc = (rpc_src){.fn = lis_event, .fd = -1};
        int fd = rpc_loop_listen(s->opts.url, &s->lport, err, sizeof(err));
        if (fd < 0) {
            KV_DEBUG("rpc", "%s", err);
            return errno == EADDRINUSE ? NNG_EADDRINUSE : NNG_EADDRINVAL;
        }
        s->lsrc.fd = fd;
        s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC); /* refuse_one's */
        if ((rv = rpc_loop_add(&s->lsrc, false, -1)) != 0) {
            close(fd);
            if (s->spare_fd >= 0)
                close(s->spare_fd);
            s->lsrc.fd = s->spare_fd = -1;
            return NNG_ENOMEM;
        }
        return 0;
    }
    rv = nng_stream_listener_alloc(&s->slis, s->opts.url);
    if (rv == 0 && tls)
        rv = nng_stream_listener_set_ptr(s->slis, NNG_OPT_TLS_CONFIG, tls);
    if (rv == 0) {
        (void)nng_stream_listener_set_bool(s->slis, NNG_OPT_TCP_NODELAY, true);
        rv = nng_stream_listener_listen(s->slis);
    }
    if (rv == 0)
        rv = nng_aio_alloc(&s->accept_aio, stream_accept_cb, s);
    if (rv == 0)
        nng_stream_listener_accept(s->slis, s->accept_aio);
    return rv;
}

/* rpc_server_close's part for streams once the workers stopped: every
 * connection closes (a reply sent later goes nowhere), and every
 * connection's end runs, which comes after its last request was handed on
 * (rpc_conn.h): a request a reading thread took just before stopping was
 * set is queued by then, so drop_queued answers it. False when some end did
 * not run within JOIN_WAIT_NS. */
static bool stream_close_conns(rpc_server *s)
{
    pthread_mutex_lock(&s->cmu);
    for (rpc_sconn *sc = s->conns; sc; sc = sc->next)
        rpc_conn_close(sc->c);
    pthread_mutex_unlock(&s->cmu);
    uint64_t until = kv_now_ns() + JOIN_WAIT_NS;
    for (;;) {
        pthread_mutex_lock(&s->cmu);
        bool live = s->conns != NULL;
        pthread_mutex_unlock(&s->cmu);
        if (!live)
            return true;
        if (kv_now_ns() >= until)
            return false;
        nng_msleep(1);
    }
}

/* ... and, with every call answered, frees them (false: some request is
 * still held, so they stay). */
static bool stream_free_conns(rpc_server *s)
{
    sconn_reap(s);
    bool all = atomic_load(&s->live_conns) == 0; /* else a request holds one */
    if (s->slis)
        nng_stream_listener_free(s->slis);
    s->slis = NULL;
    return all;
}

static kv_err open_socket(rpc_server *s, char *err, size_t errlen)
{
    int rv;
    size_t recv_max = s->opts.recv_max ? s->opts.recv_max : kv_limits_recv_max(&kv_default_limits);
    s->recv_max = recv_max;
    nng_tls_config *tls = NULL;
    char why[512];
    if (rpc_url_tls(s->opts.url) &&
        rpc_tls_config(s->opts.tls, true, &tls, why, sizeof(why)) != 0) {
        snprintf(err, errlen, "cannot listen on %s: %s", s->opts.url, why);
        return KV_INVALID_ARGUMENT;
    }
    s->tls_verify = tls && s->opts.tls->ca && *s->opts.tls->ca;
    if (s->streams) {
        rv = stream_listen(s, tls);
        if (tls)
            nng_tls_config_free(tls); /* the listener holds it */
        if (rv != 0) {
            snprintf(err, errlen, "cannot listen on %s: %s", s->opts.url, nng_strerror(rv));
            return rv == NNG_EADDRINUSE ? KV_UNAVAILABLE : KV_INVALID_ARGUMENT;
        }
        s->listening = true;
        return KV_OK;
    }
    if ((rv = nng_rep0_open(&s->sock)) != 0) {
        if (tls)
            nng_tls_config_free(tls);
        snprintf(err, errlen, "nng_rep0_open: %s", nng_strerror(rv));
        return KV_INTERNAL;
    }
    nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, recv_max);
    if ((rv = nng_listener_create(&s->listener, s->sock, s->opts.url)) != 0 ||
        (rv = nng_listener_set_size(s->listener, NNG_OPT_RECVMAXSZ, recv_max)) != 0 ||
        (tls && (rv = nng_listener_set_ptr(s->listener, NNG_OPT_TLS_CONFIG, tls)) != 0) ||
        (rv = nng_listener_start(s->listener, 0)) != 0) {
        if (tls)
            nng_tls_config_free(tls);
        snprintf(err, errlen, "cannot listen on %s: %s", s->opts.url, nng_strerror(rv));
        return rv == NNG_EADDRINUSE ? KV_UNAVAILABLE : KV_INVALID_ARGUMENT;
    }
    if (tls)
        nng_tls_config_free(tls); /* the listener holds it */
    s->listening = true;
    return KV_OK;
}

static kv_err start_workers(rpc_server *s, char *err, size_t errlen)
{
    for (unsigned i = 0; i < s->nworkers; i++) {
        rpc_worker *w = &s->workers[i];
        w->srv = s;
        w->index = (int)i;
        w->lane = &s->lanes[i < s->opts.workers ? 0 : 1];
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            snprintf(err, errlen, "cannot start worker thread");
            return KV_RESOURCE_EXHAUSTED;
        }
        w->started = true;
    }
    return KV_OK;
}

static kv_err start_calls(rpc_server *s, char *err, size_t errlen)
{
    for (unsigned i = 0; i < s->ncalls; i++) {
        rpc_scall *k = &s->calls[i];
        k->srv = s;
        rpc_arena_init(&k->ar, NULL, 0);
        if (s->streams) { /* no context: a request takes a free slot */
            scall_put(k);
            continue;
        }
        int rv;
        if ((rv = nng_ctx_open(&k->ctx, s->sock)) != 0) {
            snprintf(err, errlen, "nng context: %s", nng_strerror(rv));
            return KV_INTERNAL;
        }
        if ((rv = nng_aio_alloc(&k->aio, call_cb, k)) != 0) {
            nng_ctx_close(k->ctx);
            snprintf(err, errlen, "nng aio: %s", nng_strerror(rv));
            return KV_RESOURCE_EXHAUSTED;
        }
        k->open = true;
    }
    for (unsigned i = 0; !s->streams && i < s->ncalls; i++)
        post_recv(&s->calls[i]);
    return KV_OK;
}

kv_err rpc_server_open(rpc_server **out, const rpc_server_opts *opts, char *err, size_t errlen)
{
    rpc_server *s = calloc(1, sizeof(*s));
    if (!s)
        return KV_RESOURCE_EXHAUSTED;
    s->opts = *opts;
    s->lsrc.fd = -1;
    s->spare_fd = -1;
    if (!s->opts.default_deadline_ms)
        s->opts.default_deadline_ms = RPC_DEFAULT_DEADLINE_MS;
    if (!s->opts.workers)
        s->opts.workers = 8;
    s->nworkers = s->opts.workers + s->opts.coord_workers;
    s->max_inflight = s->opts.max_inflight ? s->opts.max_inflight : RPC_DEFAULT_MAX_INFLIGHT;
    /* tuning knobs of the admission control (docs/operations.md) */
    const char *qp = getenv("KV_RPC_SHED_QUEUE_PCT"), *sp = getenv("KV_RPC_SHED_SLOW_PCT");
    s->shed_queue_pct = qp && *qp ? (unsigned)atoi(qp) : RPC_SHED_QUEUE_PCT;
    s->shed_slow_pct = sp && *sp ? (unsigned)atoi(sp) : RPC_SHED_SLOW_PCT;
    /* Enough contexts that requests are taken off the socket (and so seen,
     * admitted or refused) while many wait for a worker: a request left
     * in the socket waits where no deadline or limit applies. */
    s->ncalls = s->opts.contexts ? s->opts.contexts : 2 * s->nworkers + 32;
    if (!s->opts.contexts && s->ncalls < 256)
        s->ncalls = 256;
    for (int l = 0; l < 2; l++) {
        pthread_mutex_init(&s->lanes[l].mu, NULL);
        pthread_cond_init(&s->lanes[l].cv, NULL);
    }
    pthread_mutex_init(&s->cmu, NULL);
    const char *sockets = getenv("KV_RPC_SOCKETS"); /* 1: an nng REP socket (benchmarks' A/B) */
    s->streams = rpc_conn_url_ok(s->opts.url) && !(sockets && strcmp(sockets, "1") == 0);
    /* streams: as many requests held at once as may be admitted, plus the
     * contexts a socket would have for those being refused */
    s->max_scalls = (size_t)s->max_inflight + s->ncalls;
    s->lanes[0].parallel = s->opts.handlers_wait;
    s->lanes[1].parallel = true; /* coordinating waits for the replicas */
    for (size_t i = 0; i < s->opts.nmethods; i++)
        s->inline_ok |= s->opts.methods[i].try_inline || s->opts.methods[i].start_async;
    s->workers = calloc(s->nworkers, sizeof(*s->workers));
    s->calls = calloc(s->ncalls, sizeof(*s->calls));
    kv_err rv = s->workers && s->calls ? KV_OK : KV_RESOURCE_EXHAUSTED;
    if (rv == KV_OK)
        rv = open_socket(s, err, errlen);
    if (rv == KV_OK)
        rv = start_workers(s, err, errlen);
    if (rv == KV_OK)
        rv = start_calls(s, err, errlen);
    if (rv != KV_OK) {
        rpc_server_close(s);
        return rv;
    }
    *out = s;
    return KV_OK;
}

/* Frees what is still queued on the lanes once the workers stopped: calls,
 * and calls of rpc.Calls messages (the message's group and request go with
 * its last reference); the rests of asynchronous calls run here. */
static void drop_queued(rpc_server *s)
{
    for (int l = 0; l < 2; l++) {
        /* locked: asynchronous calls may still hand off (they see stop) */
        pthread_mutex_lock(&s->lanes[l].mu);
        rpc_job *j = s->lanes[l].head;
        s->lanes[l].head = s->lanes[l].tail = NULL;
        pthread_mutex_unlock(&s->lanes[l].mu);
        for (rpc_job *next; j; j = next) {
            next = j->next;
            if (j->kind == JOB_ASYNC) { /* its work completes it, here */
                rpc_async *a = (rpc_async *)j;
                rpc_async_done(a, a->work(&a->c, a->work_arg));
                continue;
            }
            bool sub = j->kind == JOB_SUB;
            rpc_scall *k = sub ? ((rpc_sub *)j)->g->k : (rpc_scall *)j;
            if (sub) {
                /* the calls it held get a status: a group whose asynchronous
                 * calls are still out is replied to by the last of them */
                rpc_sub *sb = (rpc_sub *)j;
                size_t end = sb->rest ? sb->g->calls->n_calls : sb->i + 1;
                for (size_t i = sb->i; i < end; i++) {
                    rpc_ctx c = {0};
                    group_keep(sb->g, i, rpc_fail(&c, KV_UNAVAILABLE, "server shutting down"), &c);
                }
                if (atomic_fetch_sub(&sb->g->left, 1) != 1)
                    continue;
                group_free(sb->g);
            }
            nng_msg_free(k->req);
            k->req = NULL;
            k->env = NULL;
            rpc_arena_reset(&k->ar);
            if (k->conn) { /* streams: no reply, the connection closed */
                rpc_sconn *sc = k->conn;
                k->conn = NULL;
                sconn_unref(sc);
            }
        }
    }
}

void rpc_server_counters_get(const rpc_server *s, rpc_server_counters *out)
{
    rpc_server *m = (rpc_server *)s;
    *out = (rpc_server_counters){.messages = atomic_load(&m->n_msgs),
                                 .calls = atomic_load(&m->n_calls),
                                 .expired = atomic_load(&m->n_expired),
                                 .shed = atomic_load(&m->n_shed),
                                 .inline_served = atomic_load(&m->n_inline),
                                 .async_started = atomic_load(&m->n_async),
                                 .async_handoffs = atomic_load(&m->n_handoff),
                                 .accepts_refused = atomic_load(&m->n_refused),
                                 .inflight = atomic_load(&m->inflight),
                                 .max_inflight = m->max_inflight};
}

/* Joins the workers, giving up at until_ns (CLOCK_MONOTONIC): false when
 * one is still in a handler then (it waits for another process, up to its
 * call's deadline). */
static bool join_workers(rpc_server *s, uint64_t until_ns)
{
    bool all = true;
    for (unsigned i = 0; s->workers && i < s->nworkers; i++) {
        if (!s->workers[i].started)
            continue;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts); /* pthread_timedjoin_np's clock */
        uint64_t now = kv_now_ns(), left = until_ns > now ? until_ns - now : 0;
        uint64_t ns = (uint64_t)ts.tv_nsec + left;
        ts.tv_sec += (time_t)(ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        if (pthread_timedjoin_np(s->workers[i].thread, NULL, &ts) == 0) {
            s->workers[i].started = false;
            continue;
        }
        KV_WARN("rpc", "worker %u still in a handler %llu s after shutdown began; not waiting", i,
                (unsigned long long)((DRAIN_WAIT_NS + JOIN_WAIT_NS) / 1000000000ull));
        all = false;
    }
    return all;
}

bool rpc_server_close(rpc_server *s)
{
    if (!s)
        return true;
    atomic_store(&s->stopping, true);      /* no receive is posted after this */
    if (s->listening && s->lsrc.fd >= 0) { /* no new connections */
        rpc_loop_del(&s->lsrc);
        rpc_loop_sync(&s->lsrc); /* an accept in progress has finished */
        close(s->lsrc.fd);
        s->lsrc.fd = -1;
        if (s->spare_fd >= 0)
            close(s->spare_fd);
        s->spare_fd = -1;
    } else if (s->listening && s->streams) {
        nng_aio_stop(s->accept_aio); /* no new connections */
        nng_stream_listener_close(s->slis);
    }
    if (s->listening) {
        if (!s->streams)
            nng_listener_close(s->listener); /* no new connections */
        uint64_t until = kv_now_ns() + DRAIN_WAIT_NS;
        while (atomic_load(&s->busy) > 0 && kv_now_ns() < until)
            nng_msleep(2);
    }
    for (int l = 0; l < 2; l++) {
        pthread_mutex_lock(&s->lanes[l].mu);
        s->lanes[l].stop = true;
        pthread_cond_broadcast(&s->lanes[l].cv);
        pthread_mutex_unlock(&s->lanes[l].mu);
    }
    bool joined = join_workers(s, kv_now_ns() + JOIN_WAIT_NS);
    /* Every context's aio stops before the socket closes: nng 1.5 panics
     * (abort: pthread_mutex_lock on a destroyed mutex, or a stopped aio in
     * nng_ctx_send) when nng_close races a context operation on another
     * thread. The workers have exited, so nothing but the completions uses
     * the aios; stopping one cancels its operation (a posted receive, or a
     * reply the peer does not take), waits for its completion to return and
     * fails any later submission (silently: a worker left in a handler that
     * sends its reply later sends nothing), and stopping is set, so no
     * completion posts another receive. */
    for (unsigned i = 0; s->calls && i < s->ncalls; i++)
        if (s->calls[i].open)
            nng_aio_stop(s->calls[i].aio);
    if (s->streams && !stream_close_conns(s))
        joined = false; /* a connection's reading thread may still queue */
    if (joined)
        drop_queued(s); /* calls received after the workers stopped */
    /* Asynchronous calls still out (the drain above waits for them too)
     * complete by their forwards' deadlines; a reply they send now goes
     * nowhere (the aios stopped). s must outlive their completions. */
    uint64_t until = kv_now_ns() + JOIN_WAIT_NS;
    while (atomic_load_explicit(&s->async_out, memory_order_acquire) > 0 && kv_now_ns() < until)
        nng_msleep(2);
    if (atomic_load_explicit(&s->async_out, memory_order_acquire) > 0) {
        KV_WARN("rpc", "%u asynchronous calls still out after shutdown; not waiting",
                atomic_load(&s->async_out));
        joined = false;
    }
    bool closed = s->streams ? (joined && stream_free_conns(s))
                             : rpc_socket_close(s->sock, RPC_CLOSE_WAIT_MS, "RPC server");
    if (!joined || !closed) {
        rpc_keep_abandoned(s); /* leaves s allocated: a worker or nng may still use it */
        return joined;
    }
    for (unsigned i = 0; s->calls && i < s->ncalls; i++) {
        if (s->calls[i].open)
            nng_aio_free(s->calls[i].aio);
        rpc_arena_reset(&s->calls[i].ar);
    }
    for (size_t i = 0; i < s->nextra; i++) {
        rpc_arena_reset(&s->extra[i]->ar);
        free(s->extra[i]);
    }
    free(s->extra);
    if (s->accept_aio)
        nng_aio_free(s->accept_aio);
    pthread_mutex_destroy(&s->cmu);
    for (int l = 0; l < 2; l++) {
        pthread_cond_destroy(&s->lanes[l].cv);
        pthread_mutex_destroy(&s->lanes[l].mu);
    }
    free(s->calls);
    free(s->workers);
    free(s);
    return true;
}
