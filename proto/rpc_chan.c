/* SPDX-License-Identifier: MIT */
/*
 * RPC client channel to one peer. A message in flight holds a slot (its
 * id, deadline and completion, or the calls of an rpc.Calls message).
 *
 * Streams (tcp, tls): the REQ/REP wire format on one nng byte stream
 * (rpc_conn.h). A slot's message is appended to the connection with a wire
 * id that carries the slot's index, so a reply finds its slot at once; the
 * channel's timer fails slots past their deadline; a lost connection fails
 * the messages written on it (UNAVAILABLE: a request is never sent twice)
 * and is redialed after a backoff, while messages made meanwhile wait for
 * the next one until their deadlines. This skips the hand-offs between
 * nng's REQ socket layers (bench/README.md, "The floor without nng's
 * protocol layers").
 *
 * Sockets (inproc, ipc, or KV_RPC_SOCKETS=1): one nng REQ socket with a
 * pool of contexts; each slot's context is a small state machine driven by
 * its aio callback (send, then receive), with nng's resend timer off.
 *
 * Either way a call fails with UNAVAILABLE when the peer has no live
 * connection, or with DEADLINE_EXCEEDED when a connected peer does not
 * answer in time. "No live connection" (chan_down) starts once the
 * channel's first connect wait has passed, except while a stream's new
 * connection is still in its handshake, for up to HANDSHAKE_WAIT_MS: a
 * mutually authenticated TLS handshake costs both sides public-key
 * operations, which on a loaded host took more than the 1 s first wait
 * (a router whose prober opened its channels at start failed the first
 * writes with "no connection" while their handshakes were still running).
 *
 * Coalescing: a message costs the same transport work (syscalls, wake-ups
 * of nng's threads on both sides) whatever it carries, so while
 * coalesce_after messages are already in flight, new small calls wait in a
 * queue, and the queue goes out as one rpc.Calls message (kv.proto) when a
 * message completes, when it holds COALESCE_MAX_CALLS calls or
 * COALESCE_MAX_BYTES, or once its oldest call waited two smoothed round
 * trips of the channel's messages (1 to 8 ms: coalesce_wait). A lone call
 * is never delayed; under load, calls share messages (like a Redis client's
 * automatic pipelining). Each call keeps its own deadline (its remaining
 * time when the message leaves), status and reply. Calls started in a burst
 * (rpc_burst_begin/end: the calls of one incoming message, the calls that
 * the completions of one reply start) queue even when the channel is idle
 * and leave as one message when the burst ends. The default,
 * DEFAULT_COALESCE_AFTER = 1, keeps one message in flight and sends what
 * queued meanwhile when its reply comes (or when the queue's first call
 * has waited coalesce_wait): at 50 calls in flight it carried 1.1-1.5x the requests per
 * second of 4 messages in flight, at less CPU per call on both sides, with
 * the same latency (bench/README.md, "One message in flight").
 */
#include "proto/rpc.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc_conn.h"
#include "proto/rpc_int.h"
#include "proto/rpc_loop.h"
#include "proto/rpc_timer.h"
#include "proto/rpc_tls.h"
#include "proto/rpc_wire.h"

/* How long a stream connection's handshake (TLS, then the SP header) may
 * run before the channel counts as down again: the TLS handshake timeout
 * HTTP clients commonly use. A peer that accepts connections but never
 * answers (a stopped process: the kernel still accepts) costs calls at
 * most this, once per connection. */
#define HANDSHAKE_WAIT_MS 10000u

#define DEFAULT_COALESCE_AFTER 1u
#define COALESCE_MAX_CALLS 64u
#define COALESCE_MAX_BYTES (256u * 1024u) /* request bodies in one message */
#define COALESCE_MAX_BODY (16u * 1024u)   /* larger calls always go alone */
#define COALESCE_WAIT_NS 1000000ull       /* a queued call waits at most this, or two round trips */
#define COALESCE_WAIT_MAX_NS 8000000ull
#define METHOD_MAX 48

/* The calling thread's burst: its depth, and the channels whose queues it
 * sends at its end (a burst that touches more channels than that sends the
 * others' calls as outside one). */
#define BURST_MAX_CHANS 16
static _Thread_local struct {
    unsigned depth;
    size_t n;
    rpc_chan *chans[BURST_MAX_CHANS];
} tl_burst;

/* A call waiting to go out in an rpc.Calls message. */
typedef struct rpc_pend rpc_pend;
struct rpc_pend {
    rpc_pend *next;
    uint64_t id, epoch, deadline_ns;
    rpc_done_fn done;
    void *arg;
    uint8_t *body; /* the packed request, in the same allocation (call_async) */
    size_t blen;
    bool claimed; /* completed, or being completed (ch->mu) */
    char method[METHOD_MAX];
};

typedef struct rpc_slot rpc_slot;
struct rpc_slot {
    rpc_chan *ch;
    nng_ctx ctx;
    nng_aio *aio;
    rpc_slot *next_free;
    bool receiving;
    uint64_t id;
    uint64_t deadline_ns;
    rpc_done_fn done; /* a single call */
    void *arg;
    rpc_pend *calls; /* an rpc.Calls message: its calls, in order (ch->mu) */
    /* streams (ch->mu): the slot holds a message not yet completed (busy),
     * written to the connection (sent) or waiting for one with its request
     * (msg, on ch->wait); wire is the message's request id on the wire */
    uint64_t sent_ns; /* when its message left (round trips: coalesce_wait) */
    bool busy, sent;
    uint16_t index; /* in ch->all: the low bits of wire */
    uint16_t gen;   /* counts its messages: wire's middle bits */
    uint32_t wire;
    nng_msg *msg;
    rpc_slot *next_wait;
};

struct rpc_chan {
    /* tcp and tls (streams): the REQ/REP wire format on nng byte streams
     * (rpc_conn.h), one connection at a time, redialed with a backoff;
     * other URLs (inproc, ipc): an nng REQ socket */
    bool streams;
    nng_socket sock;
    nng_dialer dialer;
    nng_stream_dialer *sdialer;
    /* or, for tcp:// to a numeric address without TLS, connects on an
     * rpc_loop (rpc_loop.h) to sa, the one in progress in dial */
    bool looped;
    int on; /* the loop its connections are served on (opts.loop - 1; negative: any) */
    struct sockaddr_storage sa;
    unsigned salen;
    rpc_dial *dial;
    bool starting;      /* loop_dial_done runs outside mu: starting conn, or failing the
                           calls that waited for the dial (shutdown waits on cv) */
    nng_aio *dial_aio;  /* the dial in progress */
    nng_aio *sleep_aio; /* the backoff before the next dial */
    rpc_conn *conn;     /* the connection, up or handshaking (mu) */
    rpc_conn *dead;     /* the one that went down, freed before the next dial (mu) */
    bool conn_up;       /* conn's handshake completed (mu) */
    uint32_t backoff_ms;
    uint32_t next_wire;              /* request ids on the wire (mu) */
    rpc_slot *wait_head, *wait_tail; /* slots waiting for a connection (mu) */
    char *url;
    char *auth;
    size_t recv_max;
    uint32_t connect_wait_ms;
    bool coordinate;
    bool verified; /* TLS with a CA: every connection's server certificate verified */
    uint64_t opened_ns;
    _Atomic uint64_t shaking_ns; /* when the connection now in its handshake was made (streams;
                                    0 = none is) */
    pthread_mutex_t mu;          /* protects free_slots, all, nall, the queue; pairs with cv */
    pthread_cond_t cv;           /* signalled when a connection comes up */
    rpc_slot *free_slots;
    rpc_slot **all;
    size_t nall, cap;
    /* coalescing (mu) */
    unsigned coalesce_after; /* messages in flight before calls queue (0 = never) */
    unsigned inflight;       /* messages sent and not completed */
    rpc_pend *qhead, *qtail;
    size_t qn, qbytes;
    uint64_t q_since; /* when the oldest queued call was queued */
    bool closing;
    bool stopped;       /* rpc_chan_shutdown ran (the closing thread only) */
    unsigned nbatch;    /* rpc.Calls messages in flight */
    rpc_timer_ent tick; /* flushes the queue after coalesce_wait, and completes the
                           calls of rpc.Calls messages that pass their deadline */
    atomic_int pipes;
    atomic_uint_fast64_t next_id;
    _Atomic uint64_t srtt_ns; /* smoothed round trip of a message (an estimate: lossy) */
};

/* How long a queued call may wait for the message in flight to come back
 * before it leaves in a message of its own: two smoothed round trips,
 * within [COALESCE_WAIT_NS, COALESCE_WAIT_MAX_NS]. A fixed 1 ms split the
 * queue whenever a large message's round trip came near it (kv.Batch of 16
 * GETs, 50 in flight: 5 calls a message instead of 28). */
static uint64_t coalesce_wait(rpc_chan *ch)
{
    uint64_t w = 2 * atomic_load_explicit(&ch->srtt_ns, memory_order_relaxed);
    return w < COALESCE_WAIT_NS       ? COALESCE_WAIT_NS
           : w > COALESCE_WAIT_MAX_NS ? COALESCE_WAIT_MAX_NS
                                      : w;
}

/* A message's reply came after rtt ns. */
static void rtt_note(rpc_chan *ch, uint64_t rtt)
{
    uint64_t old = atomic_load_explicit(&ch->srtt_ns, memory_order_relaxed);
    atomic_store_explicit(&ch->srtt_ns, old ? (old * 7 + rtt) / 8 : rtt, memory_order_relaxed);
}

void rpc_reply_free(rpc_reply *r)
{
    if (!r)
        return;
    free(r->message);
    free(r->body);
    r->message = NULL;
    r->body = NULL;
    r->len = 0;
}

const char *rpc_chan_url(const rpc_chan *ch)
{
    return ch->url;
}

bool rpc_chan_verified(const rpc_chan *ch)
{
    return ch->verified;
}

unsigned rpc_chan_coalesce_after(const rpc_chan *ch)
{
    rpc_chan *c = (rpc_chan *)ch;
    pthread_mutex_lock(&c->mu); /* calls_finish clears it when the peer refuses rpc.Calls */
    unsigned v = c->coalesce_after;
    pthread_mutex_unlock(&c->mu);
    return v;
}

bool rpc_chan_looped(const rpc_chan *ch)
{
    return ch->looped;
}

int rpc_chan_connected(const rpc_chan *ch)
{
    return atomic_load(&((rpc_chan *)ch)->pipes);
}

/* Until when (kv_now_ns) a call on ch with no connection may still wait
 * for one: the end of the first connect wait, or of the handshake wait of
 * a connection being set up, whichever is later. The clock itself, not
 * rpc_now_ns's cached one: ch may have opened just now. */
static uint64_t chan_wait_until(rpc_chan *ch)
{
    uint64_t until = ch->opened_ns + (uint64_t)ch->connect_wait_ms * 1000000ull;
    uint64_t shaking = atomic_load(&ch->shaking_ns);
    if (shaking && shaking + HANDSHAKE_WAIT_MS * 1000000ull > until)
        until = shaking + HANDSHAKE_WAIT_MS * 1000000ull;
    return until;
}

/* True when ch has no connection and none is expected soon: a call fails
 * at once with UNAVAILABLE instead of waiting out its deadline. */
static bool chan_down(rpc_chan *ch)
{
    return atomic_load(&ch->pipes) == 0 && kv_now_ns() > chan_wait_until(ch);
}

static void pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    rpc_chan *ch = arg;
    pthread_mutex_lock(&ch->mu);
    if (ev == NNG_PIPE_EV_ADD_POST)
        atomic_fetch_add(&ch->pipes, 1);
    else if (ev == NNG_PIPE_EV_REM_POST)
        atomic_fetch_sub(&ch->pipes, 1);
    pthread_cond_broadcast(&ch->cv);
    pthread_mutex_unlock(&ch->mu);
}

static void reply_set(rpc_reply *r, kv_err st, const char *msg)
{
    memset(r, 0, sizeof(*r));
    r->status = st;
    r->message = msg ? strdup(msg) : NULL;
}

static void slot_release(rpc_slot *s)
{
    rpc_chan *ch = s->ch;
    pthread_mutex_lock(&ch->mu);
    s->next_free = ch->free_slots;
    ch->free_slots = s;
    pthread_mutex_unlock(&ch->mu);
}

static void msg_done(rpc_chan *ch);

static void slot_finish(rpc_slot *s, rpc_reply *r)
{
    rpc_done_fn done = s->done;
    void *arg = s->arg;
    rpc_chan *ch = s->ch;
    slot_release(s);
    msg_done(ch);
    done(arg, r);
}

/* Fills r from a reply envelope of ch's peer (body and message copied). */
static void reply_from(const rpc_chan *ch, const Kv__Envelope *env, rpc_reply *r)
{
    int code = env->status ? env->status->code : 0;
    reply_set(r, (code >= 0 && code < KV_ERR_COUNT_) ? (kv_err)code : KV_UNKNOWN,
              env->status && env->status->message && *env->status->message ? env->status->message
                                                                           : NULL);
    r->map_epoch = env->map_epoch;
    r->verified = ch->verified;
    if (env->body.len) {
        r->body = malloc(env->body.len);
        if (r->body) {
            memcpy(r->body, env->body.data, env->body.len);
            r->len = env->body.len;
        } else {
            rpc_reply_free(r);
            reply_set(r, KV_RESOURCE_EXHAUSTED, "out of memory for the reply");
        }
    }
}

static void parse_reply(rpc_slot *s, nng_msg *m, rpc_reply *r)
{
    uint8_t buf[1024];
    rpc_arena ar;
    rpc_arena_init(&ar, buf, sizeof(buf));
    Kv__Envelope *env =
        rpc_wire_env_unpack(rpc_arena_pb(&ar, SIZE_MAX), nng_msg_len(m), nng_msg_body(m));
    nng_msg_free(m);
    if (!env) {
        reply_set(r, KV_INTERNAL, "malformed reply envelope");
    } else {
        reply_from(s->ch, env, r); /* copies what it keeps */
        if (env->id != s->id && r->status == KV_OK) {
            rpc_reply_free(r);
            reply_set(r, KV_INTERNAL, "reply id does not match the request");
        }
    }
    rpc_arena_reset(&ar);
}

static void fail_transport(rpc_slot *s, int rv, rpc_reply *r)
{
    char msg[160];
    kv_err st = rpc_nng_err(rv);
    if (rv == NNG_ETIMEDOUT && atomic_load(&s->ch->pipes) == 0) {
        st = KV_UNAVAILABLE;
        snprintf(msg, sizeof(msg), "no connection to %s", s->ch->url);
    } else if (rv == NNG_ETIMEDOUT) {
        snprintf(msg, sizeof(msg), "%s did not answer before the deadline", s->ch->url);
    } else if (rv == NNG_ECONNSHUT) {
        snprintf(msg, sizeof(msg), "the connection to %s was lost before the reply", s->ch->url);
    } else if (rv == NNG_ECLOSED) {
        st = KV_CANCELLED;
        snprintf(msg, sizeof(msg), "channel to %s closed", s->ch->url);
    } else {
        snprintf(msg, sizeof(msg), "%s: %s", s->ch->url, nng_strerror(rv));
    }
    reply_set(r, st, msg);
    r->local = true;
}

/* ---- coalesced calls (rpc.Calls) ----------------------------------------- */

/* Completes a call that has no reply from the peer (local). */
static void fail_now(rpc_done_fn done, void *arg, kv_err status, const char *msg)
{
    rpc_reply r;
    reply_set(&r, status, msg);
    r.local = true;
    done(arg, &r);
}

static void send_single(rpc_chan *ch, rpc_pend *p);
static void send_calls(rpc_chan *ch, rpc_pend *q);
static rpc_pend *take_queue(rpc_chan *ch);

static void pend_free(rpc_pend *p)
{
    free(p); /* its body with it (call_async) */
}

/* Completes p with status (local) and frees it. */
static void pend_fail(rpc_pend *p, kv_err status, const char *msg)
{
    rpc_reply r;
    reply_set(&r, status, msg);
    r.local = true;
    rpc_done_fn done = p->done;
    void *arg = p->arg;
    pend_free(p);
    done(arg, &r);
}

/* The reply of a whole rpc.Calls message: its Calls, unpacked into ar
 * (NULL with *outer set when the message failed as a whole). */
static Kv__Calls *calls_reply(rpc_slot *s, int rv, nng_msg *m, rpc_reply *outer, rpc_arena *ar)
{
    Kv__Envelope *env = NULL;
    Kv__Calls *cs = NULL;
    if (rv != 0) {
        fail_transport(s, rv, outer);
    } else if (!(env = rpc_wire_env_unpack(rpc_arena_pb(ar, SIZE_MAX), nng_msg_len(m),
                                           nng_msg_body(m)))) {
        reply_set(outer, KV_INTERNAL, "malformed reply envelope");
    } else if (env->status && env->status->code != KV_OK) {
        reply_from(s->ch, env, outer);
    } else if (env->id != s->id || !(cs = rpc_wire_calls_unpack(rpc_arena_pb(ar, SIZE_MAX),
                                                                env->body.len, env->body.data))) {
        reply_set(outer, KV_INTERNAL, "malformed rpc.Calls reply");
    }
    nng_msg_free(m);
    return cs;
}

/* Completes the calls of an rpc.Calls message (rv: its transport result, m
 * its reply). A peer that does not know rpc.Calls gets them again one by
 * one, and no more coalesced calls. */
static void calls_finish(rpc_slot *s, int rv, nng_msg *m)
{
    rpc_chan *ch = s->ch;
    rpc_reply outer = {0};
    rpc_arena ar; /* the reply's envelope and calls: reply_from copies what it keeps */
    rpc_arena_init(&ar, NULL, 0);
    if (rv == 0)
        rtt_note(ch, rpc_since_ns(s->sent_ns));
    Kv__Calls *cs = calls_reply(s, rv, m, &outer, &ar);
    bool resend = !cs && outer.status == KV_UNIMPLEMENTED && !outer.local;
    pthread_mutex_lock(&ch->mu);
    rpc_pend *p = s->calls;
    s->calls = NULL;
    ch->nbatch--;
    if (resend)
        ch->coalesce_after = 0;
    for (rpc_pend *q = p; q; q = q->next) {
        bool mine = !q->claimed; /* chan_tick took the others */
        q->claimed = true;
        q->done = mine ? q->done : NULL;
    }
    pthread_mutex_unlock(&ch->mu);
    slot_release(s);
    msg_done(ch);
    size_t i = 0;
    rpc_burst_begin(); /* the calls these completions start leave together */
    for (rpc_pend *next; p; p = next, i++) {
        next = p->next;
        if (resend && p->done) {
            p->claimed = false;
            send_single(ch, p);
            continue;
        }
        rpc_reply r;
        if (!p->done)
            memset(&r, 0, sizeof(r));
        else if (cs && i < cs->n_calls && cs->calls[i]->id == p->id)
            reply_from(ch, cs->calls[i], &r);
        else if (cs)
            reply_set(&r, KV_INTERNAL, "rpc.Calls reply does not match its calls");
        else {
            reply_set(&r, outer.status, outer.message);
            r.local = outer.local;
        }
        rpc_done_fn done = p->done;
        void *arg = p->arg;
        pend_free(p);
        if (done)
            done(arg, &r);
    }
    rpc_burst_end();
    rpc_arena_reset(&ar);
    rpc_reply_free(&outer);
}

static void stream_unwait_locked(rpc_chan *ch, rpc_slot *s);
static void stream_fail(rpc_slot *s, int rv);

/* The channel's timer (rpc_timer.h): the queue goes out once its oldest
 * call waited coalesce_wait, even if every message in flight is still
 * waiting for its reply; the calls of rpc.Calls messages in flight whose
 * deadline passed complete with DEADLINE_EXCEEDED (their replies, if they
 * come, are dropped), as a call in a message of its own would by its
 * message's timeout. Re-arms itself for what is next due. */
static void chan_tick(void *arg)
{
    rpc_chan *ch = arg;
    struct {
        rpc_done_fn done;
        void *arg;
    } due[COALESCE_MAX_CALLS * 4];
    size_t n = 0;
    uint64_t now = kv_now_ns(), next = UINT64_MAX;
    pthread_mutex_lock(&ch->mu);
    rpc_pend *q = NULL;
    uint64_t wait = coalesce_wait(ch);
    if (ch->qhead && now - ch->q_since >= wait)
        q = take_queue(ch);
    else if (ch->qhead)
        next = ch->q_since + wait;
    rpc_slot *expired = NULL; /* streams: messages past their deadline */
    for (size_t i = 0; i < ch->nall; i++) {
        rpc_slot *sl = ch->all[i];
        if (ch->streams && sl->busy && sl->deadline_ns <= now) {
            if (!sl->sent)
                stream_unwait_locked(ch, sl);
            sl->busy = sl->sent = false;
            sl->next_wait = expired;
            expired = sl;
            continue; /* its calls complete with it */
        }
        if (ch->streams && sl->busy && sl->deadline_ns < next)
            next = sl->deadline_ns;
        for (rpc_pend *p = sl->calls; p; p = p->next) {
            if (p->claimed)
                continue;
            if (p->deadline_ns <= now && n < sizeof(due) / sizeof(due[0])) {
                p->claimed = true;
                due[n].done = p->done;
                due[n++].arg = p->arg;
            } else if (p->deadline_ns < next) {
                next = p->deadline_ns > now ? p->deadline_ns : now + 1000000ull;
            }
        }
    }
    bool rearm = next != UINT64_MAX && !ch->closing;
    pthread_mutex_unlock(&ch->mu);
    if (rearm)
        rpc_timer_arm(&ch->tick, next);
    if (q)
        send_calls(ch, q);
    char msg[160];
    snprintf(msg, sizeof(msg), "%s did not answer before the deadline", ch->url);
    for (size_t i = 0; i < n; i++)
        fail_now(due[i].done, due[i].arg, KV_DEADLINE_EXCEEDED, msg);
    for (rpc_slot *nx; expired; expired = nx) {
        nx = expired->next_wait;
        expired->next_wait = NULL;
        stream_fail(expired, NNG_ETIMEDOUT);
    }
}

static void slot_cb(void *arg)
{
    rpc_slot *s = arg;
    rpc_reply r;
    int rv = nng_aio_result(s->aio);
    if (rv != 0) {
        if (!s->receiving)
            nng_msg_free(nng_aio_get_msg(s->aio));
        if (s->calls) {
            calls_finish(s, rv, NULL);
            return;
        }
        fail_transport(s, rv, &r);
        slot_finish(s, &r);
        return;
    }
    if (!s->receiving) {
        uint64_t now = kv_now_ns();
        if (now >= s->deadline_ns) {
            if (s->calls) {
                calls_finish(s, NNG_ETIMEDOUT, NULL);
                return;
            }
            fail_transport(s, NNG_ETIMEDOUT, &r);
            slot_finish(s, &r);
            return;
        }
        /* Under ch->mu, against rpc_chan_close: a receive submitted on an aio
         * that the close has stopped is dropped by nng without a completion,
         * and the call would never complete (its caller waiting forever). */
        rpc_chan *ch = s->ch;
        pthread_mutex_lock(&ch->mu);
        bool closing = ch->closing;
        if (!closing) {
            s->receiving = true;
            nng_aio_set_timeout(s->aio, (nng_duration)((s->deadline_ns - now) / 1000000ull + 1));
            nng_ctx_recv(s->ctx, s->aio);
        }
        pthread_mutex_unlock(&ch->mu);
        if (!closing)
            return;
        if (s->calls) {
            calls_finish(s, NNG_ECLOSED, NULL);
            return;
        }
        fail_transport(s, NNG_ECLOSED, &r);
        slot_finish(s, &r);
        return;
    }
    if (s->calls) {
        calls_finish(s, 0, nng_aio_get_msg(s->aio));
        return;
    }
    rtt_note(s->ch, rpc_since_ns(s->sent_ns));
    parse_reply(s, nng_aio_get_msg(s->aio), &r);
    slot_finish(s, &r);
}

/* A free slot (mu held); NULL when out of memory. */
static rpc_slot *slot_get_locked(rpc_chan *ch)
{
    rpc_slot *s = ch->free_slots;
    if (s) {
        ch->free_slots = s->next_free;
        return s;
    }
    if (ch->streams && ch->nall > 0xffff)
        return NULL; /* wire ids carry the index in 16 bits */
    if (ch->nall == ch->cap) {
        size_t ncap = ch->cap ? ch->cap * 2 : 16;
        rpc_slot **n = realloc(ch->all, ncap * sizeof(*n));
        if (!n)
            return NULL;
        ch->all = n;
        ch->cap = ncap;
    }
    s = calloc(1, sizeof(*s));
    if (s && !ch->streams &&
        (nng_ctx_open(&s->ctx, ch->sock) != 0 || nng_aio_alloc(&s->aio, slot_cb, s) != 0)) {
        free(s);
        s = NULL;
    }
    if (s) {
        s->ch = ch;
        s->index = (uint16_t)ch->nall;
        ch->all[ch->nall++] = s;
    }
    return s;
}

/* ---- streams: the wire format on an nng byte stream (rpc_conn.h) ---------- */

/* Writes s's request m on c: 0, or nng's error (the connection is going
 * down, or no memory). */
static int stream_write(rpc_conn *c, const rpc_slot *s, nng_msg *m)
{
    uint8_t hdr[4] = {(uint8_t)(s->wire >> 24), (uint8_t)(s->wire >> 16), (uint8_t)(s->wire >> 8),
                      (uint8_t)s->wire};
    return rpc_conn_send(c, hdr, sizeof(hdr), nng_msg_body(m), nng_msg_len(m));
}

/* Sends request m from slot s (mu held): on the connection when it is up,
 * else s waits for one with m (the timer fails it at its deadline). */
static void stream_send_locked(rpc_chan *ch, rpc_slot *s, nng_msg *m)
{
    s->busy = true;
    s->sent = false;
    s->gen = (uint16_t)((s->gen + 1) & 0x7fff);
    s->wire = 0x80000000u | (uint32_t)s->gen << 16 | s->index;
    if (ch->conn_up && stream_write(ch->conn, s, m) == 0) {
        s->sent = true;
        nng_msg_free(m);
        return;
    }
    s->msg = m;
    s->next_wait = NULL;
    if (ch->wait_tail)
        ch->wait_tail->next_wait = s;
    else
        ch->wait_head = s;
    ch->wait_tail = s;
}

/* Takes s off the wait list (mu held). */
static void stream_unwait_locked(rpc_chan *ch, rpc_slot *s)
{
    rpc_slot **pp = &ch->wait_head, *prev = NULL;
    while (*pp && *pp != s) {
        prev = *pp;
        pp = &(*pp)->next_wait;
    }
    if (!*pp)
        return;
    *pp = s->next_wait;
    if (ch->wait_tail == s)
        ch->wait_tail = prev;
    s->next_wait = NULL;
}

/* Takes every message waiting for a connection off the list (mu held):
 * the list, for stream_fail_all. */
static rpc_slot *stream_take_waiting_locked(rpc_chan *ch)
{
    rpc_slot *w = ch->wait_head;
    ch->wait_head = ch->wait_tail = NULL;
    for (rpc_slot *s = w; s; s = s->next_wait)
        s->busy = false;
    return w;
}

/* With mu held, when a connection attempt has just ended without a
 * connection: past the channel's first connect wait (and with no handshake
 * running now), the channel is down, so the messages waiting for a
 * connection are taken off the list, to fail as new calls fail at once
 * (stream_fail_all), rather than at their deadlines. */
static rpc_slot *stream_take_waiting_if_down_locked(rpc_chan *ch)
{
    return chan_down(ch) ? stream_take_waiting_locked(ch) : NULL;
}

static void stream_fail(rpc_slot *s, int rv);

/* Fails the slots of list w (linked by next_wait, taken off the channel)
 * with rv; mu not held. */
static void stream_fail_all(rpc_slot *w, int rv)
{
    for (rpc_slot *next; w; w = next) {
        next = w->next_wait;
        w->next_wait = NULL;
        stream_fail(w, rv);
    }
}

/* Completes a slot that got no reply (rv: why). */
static void stream_fail(rpc_slot *s, int rv)
{
    if (s->msg) {
        nng_msg_free(s->msg);
        s->msg = NULL;
    }
    if (s->calls) {
        calls_finish(s, rv, NULL);
        return;
    }
    rpc_reply r;
    fail_transport(s, rv, &r);
    slot_finish(s, &r);
}

static void stream_up(void *arg, rpc_conn *c)
{
    rpc_chan *ch = arg;
    pthread_mutex_lock(&ch->mu);
    ch->conn_up = true;
    ch->backoff_ms = 0;
    atomic_store(&ch->shaking_ns, 0);
    atomic_store(&ch->pipes, 1);
    rpc_slot *w = ch->wait_head;
    ch->wait_head = ch->wait_tail = NULL;
    for (rpc_slot *next; w; w = next) {
        next = w->next_wait;
        w->next_wait = NULL;
        nng_msg *m = w->msg;
        w->msg = NULL;
        stream_send_locked(ch, w, m); /* the wire id changes: harmless, nothing was sent */
    }
    pthread_cond_broadcast(&ch->cv);
    pthread_mutex_unlock(&ch->mu);
}

/* A reply: the slot whose message has its wire id completes with it; a
 * reply for none (its call completed by its deadline) is dropped. */
static void stream_frame(void *arg, rpc_conn *c, const uint8_t *hdr, size_t hlen, nng_msg *body)
{
    (void)c;
    rpc_chan *ch = arg;
    uint32_t id =
        hlen == 4 ? (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3]
                  : 0;
    pthread_mutex_lock(&ch->mu);
    rpc_slot *s = (id & 0xffffu) < ch->nall ? ch->all[id & 0xffffu] : NULL;
    if (s && (!s->busy || !s->sent || s->wire != id))
        s = NULL;
    if (s)
        s->busy = s->sent = false;
    pthread_mutex_unlock(&ch->mu);
    if (!s) {
        nng_msg_free(body);
        return;
    }
    if (s->calls) {
        calls_finish(s, 0, body);
        return;
    }
    rtt_note(ch, rpc_since_ns(s->sent_ns));
    rpc_reply r;
    parse_reply(s, body, &r);
    slot_finish(s, &r);
}

/* With mu held: the next dial after the backoff (50 ms, doubling to 1 s,
 * as nng's sockets). */
static void redial_later_locked(rpc_chan *ch)
{
    ch->backoff_ms = ch->backoff_ms ? (ch->backoff_ms >= 500 ? 1000 : ch->backoff_ms * 2) : 50;
    nng_sleep_aio((nng_duration)ch->backoff_ms, ch->sleep_aio);
}

/* The connection ended: the messages written on it fail (UNAVAILABLE; a
 * request is never sent twice), those waiting stay for the next one, which
 * is dialed after a backoff (50 ms doubling to 1 s, as nng's sockets). */
static void stream_down(void *arg, rpc_conn *c, int rv)
{
    rpc_chan *ch = arg;
    pthread_mutex_lock(&ch->mu);
    if (ch->conn == c) {
        ch->conn = NULL;
        ch->dead = c;
    }
    ch->conn_up = false;
    atomic_store(&ch->shaking_ns, 0);
    atomic_store(&ch->pipes, 0);
    rpc_slot *lost = NULL;
    for (size_t i = 0; i < ch->nall; i++) {
        rpc_slot *s = ch->all[i];
        if (s->busy && s->sent) {
            s->busy = s->sent = false;
            s->next_wait = lost;
            lost = s;
        }
    }
    bool closing = ch->closing;
    if (!closing && ch->dead == c)
        redial_later_locked(ch);
    rpc_slot *waiting = closing ? NULL : stream_take_waiting_if_down_locked(ch);
    pthread_cond_broadcast(&ch->cv);
    pthread_mutex_unlock(&ch->mu);
    stream_fail_all(waiting, NNG_ETIMEDOUT); /* "no connection" */
    if (rv != NNG_ECLOSED && rv != NNG_ECONNSHUT && rv != NNG_ECONNRESET)
        KV_DEBUG("rpc", "connection to %s ended: %s", ch->url, nng_strerror(rv));
    for (rpc_slot *next; lost; lost = next) {
        next = lost->next_wait;
        lost->next_wait = NULL;
        stream_fail(lost, closing ? NNG_ECLOSED : NNG_ECONNSHUT);
    }
}

static const rpc_conn_cb stream_cb_init = {
    .up = stream_up, .frame = stream_frame, .down = stream_down};

static void stream_dial_cb(void *arg)
{
    rpc_chan *ch = arg;
    int rv = nng_aio_result(ch->dial_aio);
    rpc_conn *c = NULL;
    if (rv == 0) {
        rpc_conn_cb cb = stream_cb_init;
        cb.arg = ch;
        c = rpc_conn_new(nng_aio_get_output(ch->dial_aio, 0), RPC_SP_REQ, RPC_SP_REP, ch->recv_max,
                         0, &cb);
    }
    pthread_mutex_lock(&ch->mu);
    bool closing = ch->closing;
    rpc_slot *waiting = NULL;
    if (!closing && c) {
        ch->conn = c;
        atomic_store(&ch->shaking_ns, kv_now_ns());
    } else if (!closing) { /* refused, unreachable, or no memory: again after the backoff */
        redial_later_locked(ch);
        waiting = stream_take_waiting_if_down_locked(ch);
    }
    pthread_mutex_unlock(&ch->mu);
    stream_fail_all(waiting, NNG_ETIMEDOUT);
    if (closing)
        rpc_conn_free(c);
    else if (c)
        rpc_conn_start(c);
}

static void loop_dial_done(void *arg, rpc_dial *d, int fd, int err);

/* With mu held: the next connect on a loop, or the backoff when none can
 * start. */
static void loop_dial_locked(rpc_chan *ch)
{
    int e = rpc_loop_connect((const struct sockaddr *)&ch->sa, ch->salen, ch->on, loop_dial_done,
                             ch, &ch->dial);
    if (e) {
        ch->dial = NULL;
        redial_later_locked(ch);
    }
}

/* A connect's end, on the loop's thread: as stream_dial_cb. Touches ch
 * only under mu, or while `starting` holds rpc_chan_shutdown off: once
 * this has given up mu otherwise, the channel may be freed. */
static void loop_dial_done(void *arg, rpc_dial *d, int fd, int err)
{
    rpc_chan *ch = arg;
    rpc_conn *c = NULL;
    rpc_slot *waiting = NULL;
    pthread_mutex_lock(&ch->mu);
    bool mine = ch->dial == d; /* else rpc_chan_shutdown is cancelling it */
    if (mine)
        ch->dial = NULL;
    bool closing = ch->closing;
    if (!closing && fd >= 0) {
        rpc_conn_cb cb = stream_cb_init;
        cb.arg = ch;
        c = rpc_conn_new_fd(fd, rpc_loop_self(), RPC_SP_REQ, RPC_SP_REP, ch->recv_max, 0,
                            &cb); /* closes fd on failure */
    } else if (fd >= 0) {
        close(fd);
    }
    if (c) {
        ch->conn = c;
        atomic_store(&ch->shaking_ns, kv_now_ns());
        ch->starting = true; /* rpc_chan_shutdown frees c only once started */
    } else if (!closing) {   /* refused, unreachable, or no memory: again after the backoff */
        redial_later_locked(ch);
        if ((waiting = stream_take_waiting_if_down_locked(ch)))
            ch->starting = true; /* the slots are ch's: no shutdown until they are failed */
        if (err)
            KV_DEBUG("rpc", "cannot connect to %s: %s", ch->url, strerror(err));
    }
    pthread_mutex_unlock(&ch->mu);
    if (mine)
        rpc_loop_dial_release(d);
    stream_fail_all(waiting, NNG_ETIMEDOUT);
    if (c)
        rpc_conn_start(c);
    if (c || waiting) {
        pthread_mutex_lock(&ch->mu);
        ch->starting = false;
        pthread_cond_broadcast(&ch->cv);
        pthread_mutex_unlock(&ch->mu);
    }
}

static void stream_sleep_cb(void *arg)
{
    rpc_chan *ch = arg;
    if (nng_aio_result(ch->sleep_aio) != 0)
        return; /* stopped: the channel is closing */
    pthread_mutex_lock(&ch->mu);
    rpc_conn *dead = ch->dead;
    ch->dead = NULL;
    if (!ch->closing && ch->looped) /* under mu, against rpc_chan_shutdown */
        loop_dial_locked(ch);
    else if (!ch->closing)
        nng_stream_dialer_dial(ch->sdialer, ch->dial_aio);
    pthread_mutex_unlock(&ch->mu);
    rpc_conn_free(dead);
}

/* Opens ch's stream dialer and starts the first dial: 0 or nng's error. */
static int stream_open(rpc_chan *ch, nng_tls_config *tls)
{
    if (!tls && rpc_loop_wanted() && rpc_loop_addr(ch->url, &ch->sa, &ch->salen)) {
        ch->looped = true;
        int rv = nng_aio_alloc(&ch->sleep_aio, stream_sleep_cb, ch);
        if (rv == 0) {
            pthread_mutex_lock(&ch->mu);
            loop_dial_locked(ch);
            pthread_mutex_unlock(&ch->mu);
        }
        return rv;
    }
    /* One dialer for the channel's life, freed at its close once no dial
     * can run (rpc_chan_close). Not per dial, freed in the dial's
     * completion: a loopback connect completes inside nng_stream_dialer_dial,
     * whose caller still unlocks the dialer after the completion may have
     * run on another thread (a use after free, seen as nng's panic
     * "pthread_mutex_unlock: Invalid argument"). */
    int rv = nng_stream_dialer_alloc(&ch->sdialer, ch->url);
    if (rv == 0 && tls)
        rv = nng_stream_dialer_set_ptr(ch->sdialer, NNG_OPT_TLS_CONFIG, tls);
    if (rv == 0) {
        (void)nng_stream_dialer_set_bool(ch->sdialer, NNG_OPT_TCP_NODELAY, true);
        rv = nng_aio_alloc(&ch->dial_aio, stream_dial_cb, ch);
    }
    if (rv == 0)
        rv = nng_aio_alloc(&ch->sleep_aio, stream_sleep_cb, ch);
    if (rv == 0) {
        pthread_mutex_lock(&ch->mu);
        nng_stream_dialer_dial(ch->sdialer, ch->dial_aio);
        pthread_mutex_unlock(&ch->mu);
    }
    return rv;
}

/* rpc_chan_shutdown's part for streams: no dial any more; the messages
 * written and those waiting complete with CANCELLED. */
static void stream_shutdown(rpc_chan *ch)
{
    if (ch->dial_aio)
        nng_aio_stop(ch->dial_aio);
    if (ch->sleep_aio)
        nng_aio_stop(ch->sleep_aio); /* no connect starts after this */
    pthread_mutex_lock(&ch->mu);
    rpc_dial *d = ch->dial;
    ch->dial = NULL;
    pthread_mutex_unlock(&ch->mu);
    if (d)
        rpc_loop_connect_cancel(d); /* its end has run, or will not */
    pthread_mutex_lock(&ch->mu);
    while (ch->starting) /* a connect's end on a loop is running outside mu */
        pthread_cond_wait(&ch->cv, &ch->mu);
    rpc_conn *c = ch->conn, *dead = ch->dead;
    ch->conn = ch->dead = NULL;
    pthread_mutex_unlock(&ch->mu);
    rpc_conn_free(c); /* its end fails what was written on it */
    rpc_conn_free(dead);
    pthread_mutex_lock(&ch->mu);
    rpc_slot *w = stream_take_waiting_locked(ch);
    pthread_mutex_unlock(&ch->mu);
    stream_fail_all(w, NNG_ECLOSED);
}

/* opts->coalesce_after, else $KV_RPC_COALESCE_AFTER (for benchmarks that
 * compare both ways), else DEFAULT_COALESCE_AFTER; negative = never. */
static unsigned coalesce_after(const rpc_chan_opts *opts)
{
    long v = opts ? opts->coalesce_after : 0;
    const char *env = v ? NULL : getenv("KV_RPC_COALESCE_AFTER");
    if (env && *env)
        v = strtol(env, NULL, 10);
    return v < 0 ? 0 : v == 0 ? DEFAULT_COALESCE_AFTER : (unsigned)v;
}

kv_err rpc_chan_open(rpc_chan **out, const char *url, const rpc_chan_opts *opts)
{
    rpc_chan *ch = calloc(1, sizeof(*ch));
    if (!ch)
        return KV_RESOURCE_EXHAUSTED;
    pthread_mutex_init(&ch->mu, NULL);
    pthread_cond_init(&ch->cv, NULL);
    ch->url = strdup(url);
    ch->auth = strdup(opts && opts->auth ? opts->auth : "");
    ch->recv_max = opts && opts->recv_max ? opts->recv_max : kv_limits_recv_max(&kv_default_limits);
    ch->connect_wait_ms =
        opts && opts->connect_wait_ms ? opts->connect_wait_ms : RPC_CONNECT_WAIT_MS;
    ch->coordinate = opts && opts->coordinate;
    ch->coalesce_after = coalesce_after(opts);
    ch->on = opts && opts->loop > 0 ? opts->loop - 1 : -1;
    ch->opened_ns = kv_now_ns();
    ch->tick = (rpc_timer_ent){.fn = chan_tick, .arg = ch};
    nng_tls_config *tls = NULL;
    char why[512];
    int rv = 0;
    if (rpc_url_tls(url) &&
        (rv = rpc_tls_config(opts ? opts->tls : NULL, false, &tls, why, sizeof(why))) != 0)
        KV_ERROR("rpc", "cannot dial %s: %s", url, why);
    ch->verified = tls != NULL;
    const char *sockets = getenv("KV_RPC_SOCKETS"); /* 1: nng's REQ sockets (benchmarks' A/B) */
    ch->streams = rpc_conn_url_ok(url) && !(sockets && strcmp(sockets, "1") == 0);
    if (rv == 0 && ch->streams) {
        if (ch->url && ch->auth)
            rv = stream_open(ch, tls);
        if (tls)
            nng_tls_config_free(tls); /* the dialer holds it */
        if (rv != 0 || !ch->url || !ch->auth) {
            KV_DEBUG("rpc", "cannot dial %s: %s", url, nng_strerror(rv));
            rpc_chan_close(ch);
            return rv == NNG_ENOMEM || rv == 0 ? KV_RESOURCE_EXHAUSTED : KV_INVALID_ARGUMENT;
        }
        *out = ch;
        return KV_OK;
    }
    if (rv == 0)
        rv = nng_req0_open(&ch->sock);
    if (rv == 0) {
        nng_socket_set_ms(ch->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
        nng_socket_set_size(ch->sock, NNG_OPT_RECVMAXSZ, ch->recv_max);
        nng_socket_set_ms(ch->sock, NNG_OPT_RECONNMINT, 50);
        nng_socket_set_ms(ch->sock, NNG_OPT_RECONNMAXT, 1000);
        nng_pipe_notify(ch->sock, NNG_PIPE_EV_ADD_POST, pipe_cb, ch);
        nng_pipe_notify(ch->sock, NNG_PIPE_EV_REM_POST, pipe_cb, ch);
        rv = nng_dialer_create(&ch->dialer, ch->sock, url);
    }
    if (rv == 0 && tls)
        rv = nng_dialer_set_ptr(ch->dialer, NNG_OPT_TLS_CONFIG, tls);
    if (tls)
        nng_tls_config_free(tls); /* the dialer holds it */
    if (rv == 0) {
        nng_dialer_set_size(ch->dialer, NNG_OPT_RECVMAXSZ, ch->recv_max);
        rv = nng_dialer_start(ch->dialer, NNG_FLAG_NONBLOCK);
    }
    if (rv != 0 || !ch->url || !ch->auth) {
        KV_DEBUG("rpc", "cannot dial %s: %s", url, nng_strerror(rv));
        rpc_chan_close(ch);
        return rv == NNG_ENOMEM ? KV_RESOURCE_EXHAUSTED : KV_INVALID_ARGUMENT;
    }
    *out = ch;
    return KV_OK;
}

void rpc_chan_shutdown(rpc_chan *ch)
{
    if (!ch || ch->stopped)
        return;
    ch->stopped = true;
    /* Queued calls complete with CANCELLED; no completion sends the queue
     * (or arms the timer) any more. */
    pthread_mutex_lock(&ch->mu);
    ch->closing = true;
    rpc_pend *q = ch->qhead;
    ch->qhead = ch->qtail = NULL;
    ch->qn = ch->qbytes = 0;
    pthread_mutex_unlock(&ch->mu);
    for (rpc_pend *next; q; q = next) {
        next = q->next;
        pend_fail(q, KV_CANCELLED, "channel closed");
    }
    /* Stop every context's aio before closing the socket: nng (1.5) must
     * not see a completion's submission race with the socket tearing its
     * contexts down. Stopping cancels what is pending (its call completes
     * with CANCELLED) and waits for a running completion; since closing is
     * set, no completion submits anything after that (nng would drop a
     * submission on a stopped aio without ever completing it). */
    if (ch->streams)
        stream_shutdown(ch);
    for (size_t i = 0; !ch->streams && i < ch->nall; i++)
        nng_aio_stop(ch->all[i]->aio);
    /* after the stops: a completion that sent a message before closing was
     * set may have armed the timer since */
    rpc_timer_cancel(&ch->tick);
}

void rpc_chan_close(rpc_chan *ch)
{
    if (!ch)
        return;
    rpc_chan_shutdown(ch);
    if (ch->streams) {
        if (ch->sdialer) /* after the shutdown's stops: no dial runs */
            nng_stream_dialer_free(ch->sdialer);
        if (ch->dial_aio)
            nng_aio_free(ch->dial_aio);
        if (ch->sleep_aio)
            nng_aio_free(ch->sleep_aio);
    } else if (!rpc_socket_close(ch->sock, RPC_CLOSE_WAIT_MS, ch->url)) {
        rpc_keep_abandoned(ch); /* nng may still call pipe_cb with ch: leave it allocated */
        return;
    }
    for (size_t i = 0; i < ch->nall; i++) {
        if (ch->all[i]->aio)
            nng_aio_free(ch->all[i]->aio); /* waits for a running callback */
        free(ch->all[i]);
    }
    free(ch->all);
    free(ch->url);
    free(ch->auth);
    pthread_cond_destroy(&ch->cv);
    pthread_mutex_destroy(&ch->mu);
    free(ch);
}

/* The envelope of call p with deadline_ms left. */
static void call_env(rpc_chan *ch, const rpc_pend *p, uint32_t deadline_ms, Kv__Envelope *env)
{
    kv__envelope__init(env);
    env->id = p->id;
    env->method = (char *)p->method;
    env->deadline_ms = deadline_ms;
    env->auth = (ProtobufCBinaryData){strlen(ch->auth), (uint8_t *)ch->auth};
    env->map_epoch = p->epoch;
    env->coordinate = ch->coordinate;
    env->body.data = p->body;
    env->body.len = p->blen;
}

/* Sends m on a free context as the message of a single call (done, arg)
 * or of calls; on failure completes them. Counted in flight already. */
static void send_msg(rpc_chan *ch, nng_msg *m, uint64_t id, uint64_t deadline_ns, rpc_done_fn done,
                     void *arg, rpc_pend *calls)
{
    uint64_t first = UINT64_MAX; /* the earliest deadline among the calls */
    for (rpc_pend *p = calls; p; p = p->next)
        first = p->deadline_ns < first ? p->deadline_ns : first;
    /* The send is submitted under mu, against rpc_chan_close (see slot_cb):
     * once closing is set, no operation starts on an aio the close stops. */
    pthread_mutex_lock(&ch->mu);
    bool closing = ch->closing;
    rpc_slot *s = m && !closing ? slot_get_locked(ch) : NULL;
    if (s) {
        uint64_t now = rpc_now_ns();
        s->id = id;
        s->done = done;
        s->arg = arg;
        s->receiving = false;
        s->deadline_ns = deadline_ns;
        s->sent_ns = now;
        s->calls = calls;
        ch->nbatch += calls != NULL;
        if (ch->streams) {
            stream_send_locked(ch, s, m);
        } else {
            nng_aio_set_timeout(
                s->aio,
                (nng_duration)(deadline_ns > now ? (deadline_ns - now) / 1000000ull + 1 : 1));
            nng_aio_set_msg(s->aio, m);
            nng_ctx_send(s->ctx, s->aio);
        }
    }
    pthread_mutex_unlock(&ch->mu);
    if (s) {
        if (calls || ch->streams) /* streams: the timer is every message's deadline */
            rpc_timer_arm(&ch->tick, calls ? first : deadline_ns);
        return;
    }
    kv_err st = closing ? KV_CANCELLED : KV_RESOURCE_EXHAUSTED;
    const char *why = closing ? "channel closed" : "out of memory for the request";
    nng_msg_free(m);
    msg_done(ch);
    for (rpc_pend *next; calls; calls = next) {
        next = calls->next;
        pend_fail(calls, st, why);
    }
    if (done) {
        rpc_reply r;
        reply_set(&r, st, closing ? why : NULL);
        r.local = true;
        done(arg, &r);
    }
}

/* Sends call p, counted in flight already, in a message of its own and
 * frees it. */
static void send_counted(rpc_chan *ch, rpc_pend *p)
{
    uint64_t now = rpc_now_ns();
    uint64_t left = p->deadline_ns > now ? (p->deadline_ns - now) / 1000000ull : 0;
    Kv__Envelope env;
    call_env(ch, p, left ? (uint32_t)left : 1, &env);
    nng_msg *m = rpc_wire_env_msg(&env);
    uint64_t id = p->id, dl = p->deadline_ns > now ? p->deadline_ns : now + 1000000ull;
    rpc_done_fn done = p->done;
    void *arg = p->arg;
    pend_free(p);
    send_msg(ch, m, id, dl, done, arg, NULL);
}

/* Sends call p in a message of its own and frees it. */
static void send_single(rpc_chan *ch, rpc_pend *p)
{
    pthread_mutex_lock(&ch->mu);
    ch->inflight++;
    pthread_mutex_unlock(&ch->mu);
    send_counted(ch, p);
}

/* Sends queued calls q (linked, in order) as one rpc.Calls message; calls
 * whose deadline passed in the queue complete with DEADLINE_EXCEEDED.
 * Counted in flight already. */
static void send_calls(rpc_chan *ch, rpc_pend *q)
{
    Kv__Envelope envs[COALESCE_MAX_CALLS], *ptrs[COALESCE_MAX_CALLS];
    rpc_pend *live = NULL, **tail = &live;
    size_t n = 0;
    uint64_t now = rpc_now_ns(), last = now;
    char why[160];
    bool down = chan_down(ch); /* as call_async: fails at once */
    snprintf(why, sizeof(why), "no connection to %s", ch->url);
    for (rpc_pend *next; q; q = next) {
        next = q->next;
        if (down) {
            pend_fail(q, KV_UNAVAILABLE, why);
            continue;
        }
        if (q->deadline_ns <= now + 1000000ull) {
            pend_fail(q, KV_DEADLINE_EXCEEDED, "the deadline passed before the call was sent");
            continue;
        }
        call_env(ch, q, (uint32_t)((q->deadline_ns - now) / 1000000ull), &envs[n]);
        ptrs[n] = &envs[n];
        n++;
        last = q->deadline_ns > last ? q->deadline_ns : last;
        *tail = q;
        tail = &q->next;
        q->next = NULL;
    }
    if (!n) {
        msg_done(ch);
        return;
    }
    Kv__Calls calls = KV__CALLS__INIT;
    calls.n_calls = n;
    calls.calls = ptrs;
    uint64_t id = atomic_fetch_add(&ch->next_id, 1) + 1;
    Kv__Envelope env = KV__ENVELOPE__INIT;
    env.id = id;
    env.method = "rpc.Calls";
    env.deadline_ms = (uint32_t)((last - now) / 1000000ull);
    env.auth = (ProtobufCBinaryData){strlen(ch->auth), (uint8_t *)ch->auth};
    env.coordinate = ch->coordinate;
    nng_msg *m = rpc_wire_env_calls_msg(&env, &calls); /* the calls as its body */
    send_msg(ch, m, id, last, NULL, NULL, live);
}

/* Takes the queue as one message in flight (mu held); NULL when empty. */
static rpc_pend *take_queue(rpc_chan *ch)
{
    rpc_pend *q = ch->qhead;
    if (!q || ch->closing)
        return NULL;
    ch->qhead = ch->qtail = NULL;
    ch->qn = ch->qbytes = 0;
    ch->inflight++;
    return q;
}

/* A message completed: one fewer in flight, and the queue goes out. */
static void msg_done(rpc_chan *ch)
{
    pthread_mutex_lock(&ch->mu);
    ch->inflight--;
    rpc_pend *q = take_queue(ch);
    pthread_mutex_unlock(&ch->mu);
    if (q)
        send_calls(ch, q);
}

/* With ch->mu held: true when the calling thread is in a burst that sends
 * ch's queue at its end (ch joins it). */
static bool burst_join(rpc_chan *ch)
{
    if (!tl_burst.depth)
        return false;
    for (size_t i = 0; i < tl_burst.n; i++)
        if (tl_burst.chans[i] == ch)
            return true;
    if (tl_burst.n == BURST_MAX_CHANS)
        return false;
    tl_burst.chans[tl_burst.n++] = ch;
    return true;
}

void rpc_burst_begin(void)
{
    tl_burst.depth++;
}

void rpc_burst_end(void)
{
    if (!tl_burst.depth || --tl_burst.depth)
        return;
    /* a copy: sending may complete calls whose callbacks start others */
    rpc_chan *chans[BURST_MAX_CHANS];
    size_t n = tl_burst.n;
    memcpy(chans, tl_burst.chans, n * sizeof(*chans));
    tl_burst.n = 0;
    for (size_t i = 0; i < n; i++) {
        rpc_chan *ch = chans[i];
        rpc_pend *q = NULL;
        uint64_t arm = 0;
        pthread_mutex_lock(&ch->mu);
        if (!ch->coalesce_after || ch->inflight < ch->coalesce_after)
            q = take_queue(ch);
        else if (ch->qhead && !ch->closing) /* another thread's message took the room */
            arm = ch->q_since + coalesce_wait(ch);
        pthread_mutex_unlock(&ch->mu);
        if (arm)
            rpc_timer_arm(&ch->tick, arm);
        if (q && !q->next)
            send_counted(ch, q);
        else if (q)
            send_calls(ch, q);
    }
}

/* Queues p when coalesce_after messages are in flight, or in a burst (true:
 * p is the channel's now); otherwise counts the message p is about to
 * become. burst: false for a blocking call, which never waits for a burst. */
static bool try_queue(rpc_chan *ch, rpc_pend *p, bool burst)
{
    pthread_mutex_lock(&ch->mu);
    if (!ch->coalesce_after || ch->closing || p->blen > COALESCE_MAX_BODY ||
        (ch->inflight < ch->coalesce_after && !(burst && burst_join(ch)))) {
        ch->inflight++;
        pthread_mutex_unlock(&ch->mu);
        return false;
    }
    uint64_t now = rpc_now_ns();
    bool room = ch->inflight < ch->coalesce_after; /* queued for the burst's end */
    p->next = NULL;
    bool first = !ch->qhead;
    if (ch->qtail)
        ch->qtail->next = p;
    else
        ch->qhead = p;
    ch->qtail = p;
    ch->qn++;
    ch->qbytes += p->blen;
    ch->q_since = first ? now : ch->q_since;
    /* full, or waited long enough (a completion or the timer would send it) */
    rpc_pend *q = ch->qn >= COALESCE_MAX_CALLS || ch->qbytes >= COALESCE_MAX_BYTES ||
                          now >= ch->q_since + coalesce_wait(ch)
                      ? take_queue(ch)
                      : NULL;
    pthread_mutex_unlock(&ch->mu);
    if (q)
        send_calls(ch, q);
    else if (first && !room)
        rpc_timer_arm(&ch->tick, now + coalesce_wait(ch));
    return true;
}

static void call_async(rpc_chan *ch, const char *method, uint64_t map_epoch,
                       const ProtobufCMessage *req, uint32_t deadline_ms, rpc_done_fn done,
                       void *arg, bool burst)
{
    char msg[160];
    if (!deadline_ms)
        deadline_ms = RPC_DEFAULT_DEADLINE_MS;
    if (deadline_ms > RPC_MAX_DEADLINE_MS) /* nng durations are signed 32-bit ms */
        deadline_ms = RPC_MAX_DEADLINE_MS;
    uint64_t now = rpc_now_ns();
    if (chan_down(ch)) {
        snprintf(msg, sizeof(msg), "no connection to %s", ch->url);
        fail_now(done, arg, KV_UNAVAILABLE, msg);
        return;
    }
    size_t blen = req ? protobuf_c_message_get_packed_size(req) : 0;
    if (blen + KV_RPC_OVERHEAD / 2 > ch->recv_max) {
        snprintf(msg, sizeof(msg), "%s request is over the %zu-byte message limit", method,
                 ch->recv_max);
        fail_now(done, arg, KV_INVALID_ARGUMENT, msg);
        return;
    }
    /* the packed body follows the call in the same allocation */
    rpc_pend *p = blen <= SIZE_MAX - sizeof(*p) ? malloc(sizeof(*p) + blen) : NULL;
    uint8_t *body = p ? (uint8_t *)(p + 1) : NULL;
    if (!p || strlen(method) >= METHOD_MAX) {
        free(p);
        fail_now(done, arg, p ? KV_INVALID_ARGUMENT : KV_RESOURCE_EXHAUSTED,
                 p ? "method name too long" : NULL);
        return;
    }
    if (blen)
        protobuf_c_message_pack(req, body);
    *p = (rpc_pend){.id = atomic_fetch_add(&ch->next_id, 1) + 1,
                    .epoch = map_epoch,
                    .deadline_ns = now + (uint64_t)deadline_ms * 1000000ull,
                    .done = done,
                    .arg = arg,
                    .body = body,
                    .blen = blen};
    memcpy(p->method, method, strlen(method) + 1);
    if (!try_queue(ch, p, burst)) {
        /* alone: exactly the deadline the caller gave */
        Kv__Envelope env;
        call_env(ch, p, deadline_ms, &env);
        nng_msg *m = rpc_wire_env_msg(&env);
        uint64_t id = p->id, dl = p->deadline_ns;
        pend_free(p);
        send_msg(ch, m, id, dl, done, arg, NULL);
    }
}

void rpc_call_async(rpc_chan *ch, const char *method, uint64_t map_epoch,
                    const ProtobufCMessage *req, uint32_t deadline_ms, rpc_done_fn done, void *arg)
{
    call_async(ch, method, map_epoch, req, deadline_ms, done, arg, true);
}

typedef struct sync_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    rpc_reply r;
} sync_wait;

static void sync_done(void *arg, rpc_reply *r)
{
    sync_wait *w = arg;
    pthread_mutex_lock(&w->mu);
    w->r = *r;
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Waits (bounded) for a first connection so a call right after open does
 * not fail just because the dial has not completed yet. */
static void wait_connected(rpc_chan *ch, uint32_t max_ms)
{
    if (atomic_load(&ch->pipes) > 0)
        return;
    uint64_t since_open = (kv_now_ns() - ch->opened_ns) / 1000000ull;
    uint32_t wait =
        ch->connect_wait_ms > since_open ? ch->connect_wait_ms - (uint32_t)since_open : 0;
    if (wait > max_ms)
        wait = max_ms;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)wait * 1000000ull;
    ts.tv_sec += (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    pthread_mutex_lock(&ch->mu);
    while (atomic_load(&ch->pipes) == 0 && wait > 0)
        if (pthread_cond_timedwait(&ch->cv, &ch->mu, &ts) != 0)
            break;
    pthread_mutex_unlock(&ch->mu);
}

kv_err rpc_call(rpc_chan *ch, const char *method, uint64_t map_epoch, const ProtobufCMessage *req,
                uint32_t deadline_ms, rpc_reply *out)
{
    if (!deadline_ms)
        deadline_ms = RPC_DEFAULT_DEADLINE_MS;
    uint64_t start = kv_now_ns();
    wait_connected(ch, deadline_ms);
    uint32_t spent = (uint32_t)((kv_now_ns() - start) / 1000000ull);
    sync_wait w = {.done = false};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    call_async(ch, method, map_epoch, req, spent < deadline_ms ? deadline_ms - spent : 1, sync_done,
               &w, false);
    pthread_mutex_lock(&w.mu);
    while (!w.done)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    *out = w.r;
    return out->status;
}

kv_err rpc_call_retry(rpc_chan *ch, const char *method, uint64_t map_epoch,
                      const ProtobufCMessage *req, uint32_t deadline_ms, rpc_reply *out)
{
    if (!deadline_ms)
        deadline_ms = RPC_DEFAULT_DEADLINE_MS;
    uint64_t end = kv_now_ns() + (uint64_t)deadline_ms * 1000000ull;
    uint32_t backoff = 10;
    for (;;) {
        uint64_t now = kv_now_ns();
        uint32_t left = now < end ? (uint32_t)((end - now) / 1000000ull) : 0;
        kv_err rv = rpc_call(ch, method, map_epoch, req, left ? left : 1, out);
        if (rv != KV_UNAVAILABLE || kv_now_ns() + backoff * 1000000ull >= end)
            return rv;
        rpc_reply_free(out);
        nng_msleep(backoff);
        backoff = backoff < 200 ? backoff * 2 : 200;
    }
}
