/* SPDX-License-Identifier: MIT */
/*
 * fanout: send one request to several peers asynchronously and wait for
 * enough answers. Lifetime: fan_create() gives the caller one reference;
 * every fan_send() adds one that its completion drops; fan_release() drops
 * the caller's. Replies taken with fan_take() belong to the caller; replies
 * still missing then are freed when they arrive.
 */
#ifndef KV_SHARD_FAN_H
#define KV_SHARD_FAN_H

#include <pthread.h>
#include <stdbool.h>

#include "proto/prom.h"
#include "proto/rpc.h"

typedef struct fanout fanout;
/* Per-target counters a send may carry (the router's forwards per node):
 * every reply counts a call, a transport failure (UNAVAILABLE,
 * DEADLINE_EXCEEDED, CANCELLED) an error, and the time to the reply goes
 * into lat. Relaxed atomics; owned by the caller, who keeps it alive. */
typedef struct fan_ctr {
    _Atomic uint64_t calls, errors;
    prom_hist lat;
} fan_ctr;
/* Called for a reply that arrives after fan_take (the handler moved on),
 * from an nng thread, with the fanout's lock held: it must not block and
 * must not call into the fanout. first_ok: the first send that answered OK,
 * -1 when none did. */
typedef void (*fan_late_fn)(void *arg, int i, const rpc_reply *r, int first_ok);
/* Completion-driven waiting (fan_arm): whether the replies in so far are
 * enough for the waiter, evaluated with the fanout's lock held (read f's
 * counters and have[]/rep[] statuses; must not block or call into f). */
typedef bool (*fan_ready_fn)(void *arg, const struct fanout *f);
/* Called once when the armed waiter may go on, without the lock: ready
 * tells whether the replies satisfy it (else fan_poke triggered it). */
typedef void (*fan_fire_fn)(void *arg, bool ready);
typedef struct fan_slot {
    fanout *f;
    int i;
    fan_ctr *ctr; /* NULL = not counted */
    uint64_t t0;  /* when it was sent (kv_now_ns), with ctr */
} fan_slot;

struct fanout {
    pthread_mutex_t mu; /* protects every field below */
    pthread_cond_t cv;
    int refs, sent, done, ok, max;
    int answered; /* replies that are a node's verdict, not a transport error */
    fan_slot *slots;
    rpc_reply *rep;
    bool *have;
    bool taken;       /* fan_take ran: later replies are late */
    int first_ok;     /* first send that answered OK, -1 = none yet */
    fan_late_fn late; /* may be NULL */
    void *late_arg;
    void (*late_free)(void *arg); /* frees late_arg with the fanout */
    /* fan_arm's waiter: fire runs once, when ready holds or on a poke */
    fan_ready_fn ready;
    fan_fire_fn fire;
    void *fire_arg;
    bool poked; /* fan_poke ran */
    bool fired; /* the armed fire ran (or fan_arm triggered at once) */
};

/* A fanout for at most max sends; NULL when out of memory. */
fanout *fan_create(int max);
/* Sends msg to ch (NULL ch = UNAVAILABLE reply) as send number f->sent. */
void fan_send(fanout *f, rpc_chan *ch, const char *method, uint64_t epoch,
              const ProtobufCMessage *msg, uint32_t deadline_ms);
/* fan_send, counting the send and its reply in ctr (NULL = not counted). */
void fan_send_ctr(fanout *f, rpc_chan *ch, const char *method, uint64_t epoch,
                  const ProtobufCMessage *msg, uint32_t deadline_ms, fan_ctr *ctr);
/* Reserves send number f->sent for a reply made here (a coordinating
 * node's own replica): the fanout waits for it like for a sent call until
 * fan_complete(f, i, r) records it (ownership of r's contents moves to the
 * fanout). Every reserved send must be completed, once. Thread-safe. */
int fan_reserve(fanout *f);
void fan_complete(fanout *f, int i, rpc_reply *r);
/* Records a send that was not made, as send number f->sent, with status
 * and message (copied). */
void fan_skip(fanout *f, kv_err status, const char *message);
/* Waits until need_ok replies are OK, every send has answered, or the
 * deadline passed (plus a small grace for the transport's own timeout). */
void fan_wait(fanout *f, int need_ok, uint32_t deadline_ms);
/* Waits until need replies are verdicts (anything but UNAVAILABLE,
 * DEADLINE_EXCEEDED, CANCELLED or RESOURCE_EXHAUSTED, the node's refusal
 * under overload), every send has answered, or wait_ms passed (no grace). Returns
 * the number of verdicts. For staged reads: ask a few replicas, then the
 * rest only if these did not answer. */
int fan_wait_answers(fanout *f, int need, uint32_t wait_ms);
/* Waits until send number i has its reply or wait_ms passed (no grace).
 * Returns whether the reply is in. */
bool fan_wait_slot(fanout *f, int i, uint32_t wait_ms);
/* Moves the replies received so far into out[i] (have[i] says which, for
 * i below the number of sends made) and returns the number of sends. */
int fan_take(fanout *f, rpc_reply *out, bool *have);
void fan_release(fanout *f);
/* Arms fire(arg, ready) to run once, from the thread of the send's
 * completion after which ready(arg, f) holds (or fan_poke's), instead of a
 * thread waiting in fan_wait. Returns true without arming when it holds
 * already or fan_poke ran, with *now_ready = ready(arg, f): the caller goes
 * on itself. Arm once, after the sends; the caller keeps its reference
 * (fan_release) until fire ran, and fire may release it. */
bool fan_arm(fanout *f, fan_ready_fn ready, fan_fire_fn fire, void *arg, bool *now_ready);
/* Replies that are verdicts so far (see fan_wait_answers), without waiting. */
int fan_answers(fanout *f);
/* Triggers the armed fire now (with ready as ready(arg, f) says), e.g. at a
 * timeout; before fan_arm, makes fan_arm trigger at once. No-op once fired.
 * Any thread. */
void fan_poke(fanout *f);
/* Registers fn for late replies (call it before any fan_send);
 * free_arg(arg) runs when the fanout is freed. */
void fan_on_late(fanout *f, fan_late_fn fn, void *arg, void (*free_arg)(void *arg));

#endif
