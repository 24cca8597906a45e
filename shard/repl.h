/* SPDX-License-Identifier: MIT */
/*
 * The replication and consistency rules of DESIGN.md §4, shared by every
 * coordinator of a request: kvrouter, and kvnode when a smart client sends
 * a request straight to a key's replica (Envelope.coordinate). Given a
 * request and a cluster map, this library picks the targets (the key's
 * current replicas, plus its pending ones for writes), sends to them at
 * once, waits for the consistency level's acks plus every pending replica
 * plus the primary (the primary-ack rule), leaves hints on a live replica
 * for those that failed without a verdict (synchronously for pending
 * replicas, which count as acknowledged once their hint is stored), repairs
 * stale replicas a read saw, re-sends a conditional write that won to the
 * replicas that refused it, splits batches by node and merges them, and
 * retries once after learning a newer map.
 *
 * What differs between coordinators comes in through repl_env: how to reach
 * a node, how to learn a map, the clock that gives versions, and, on a node,
 * its own id and a function that runs a call on its own replica in-process
 * (so a coordinating node does not send itself a message).
 *
 * Threads: every function may be called from any thread that may block
 * (RPC handlers): they wait for the replicas' answers. Counters in
 * repl_stats are relaxed atomics.
 */
#ifndef KV_SHARD_REPL_H
#define KV_SHARD_REPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/clock.h"
#include "common/limits.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"
#include "shard/clustermap.h"
#include "shard/fan.h"

#define REPL_MAX_RF CMAP_MAX_RF

/* What a coordinator did, for admin.Stats (relaxed atomics). */
typedef struct repl_stats {
    _Atomic uint64_t forwards, forward_errors;
    _Atomic uint64_t hints_sent, hint_errors, read_repairs, skipped_down;
} repl_stats;

/* Runs method(body) on the coordinator's own replica, synchronously, and
 * fills *out as a reply from that node would be (out->body malloc'ed and
 * owned by the caller, like any rpc_reply). */
typedef void (*repl_local_fn)(void *user, const char *method, uint64_t epoch, const uint8_t *body,
                              size_t len, uint32_t deadline_ms, rpc_reply *out);

typedef struct repl_env {
    void *user;      /* handed to every callback */
    cmap_slot *maps; /* the coordinator's current map */
    kv_hlc *hlc;     /* gives the versions of writes */
    repl_stats *stats;
    const _Atomic bool *stopping; /* set: no more side writes (hints, repairs) */
    /* The channel to a node address (created on first use, kept for the
     * process's life); NULL when out of memory or the address is invalid.
     * Any thread. */
    rpc_chan *(*chan)(void *user, const char *addr);
    /* A replica answered FAILED_PRECONDITION with its (newer) map: install it
     * if it is newer and acceptable. Any thread. */
    void (*learn_map)(void *user, const rpc_reply *r, const char *from);
    /* On a node: its id, and the in-process call to its own replica; calls
     * to that map node go to local instead of the network. NULL on a
     * router. */
    const char *self_id;
    repl_local_fn local;
    /* Optional: the same call when it can run without blocking (a read the
     * memory tier answers), else false with nothing done (*out untouched). */
    bool (*local_try)(void *user, const char *method, uint64_t epoch, const uint8_t *body,
                      size_t len, uint32_t deadline_ms, rpc_reply *out);
    /* Optional: the counters of forwards to a map node (a router's per-node
     * figures); NULL or a NULL result = not counted. Any thread, must not
     * block. */
    fan_ctr *(*target_ctr)(void *user, const char *node_id);
} repl_env;

/* ---- the data path (repl_kv.c, repl_batch.c) ----
 *
 * Each takes the unpacked request, already checked against the limits, and
 * the handler's call context: on success c->reply holds the reply body (a
 * replica's GetReply / PutReply / DeleteReply, or the merged BatchReply);
 * on failure the status is returned and c->message says why (a replica's
 * own verdict such as ALREADY_EXISTS or a CAS mismatch wins over transport
 * errors, which become UNAVAILABLE). c->reply_epoch is set to the map's
 * epoch. Writes without a version get one from env->hlc (the caller clears
 * a version it does not trust). dflt_* are the levels DEFAULT means. */
kv_err repl_get(const repl_env *env, rpc_ctx *c, Kv__GetRequest *req);
kv_err repl_put(const repl_env *env, rpc_ctx *c, Kv__PutRequest *req);
kv_err repl_delete(const repl_env *env, rpc_ctx *c, Kv__DeleteRequest *req);
/* The same in two phases, so one thread keeps many calls in flight: start
 * plans the targets and sends (a read to its first replicas, a write to all
 * of them) and returns; repl_finish waits for the replies, turns them into
 * the verdict like repl_get/put/delete, and frees the call. On KV_OK *out is
 * the caller's until it passes it to repl_finish (exactly once, from any
 * thread that may block, with the same c); req must live until then. A
 * read that the coordinator's own replica answers alone (a level of one,
 * the node first in read order) completes in repl_get_start: *out is then
 * NULL and c holds the verdict, whatever it returns. On failure nothing is
 * in flight and c->message says why. */
typedef struct repl_call repl_call;
kv_err repl_get_start(const repl_env *env, rpc_ctx *c, Kv__GetRequest *req, repl_call **out);
kv_err repl_put_start(const repl_env *env, rpc_ctx *c, Kv__PutRequest *req, repl_call **out);
kv_err repl_delete_start(const repl_env *env, rpc_ctx *c, Kv__DeleteRequest *req, repl_call **out);
kv_err repl_finish(repl_call *rc, rpc_ctx *c);
/* The same starts for a caller that must not block (an rpc_async_fn,
 * followed by repl_await): the coordinator's own replica, when it is a
 * target, is asked through env->local_try, and a call that declines is
 * held; repl_await then hands the rest to the caller's worker (done(arg,
 * false)), whose repl_finish makes the held call first. A read the own
 * replica answers alone completes as in repl_get_start when local_try
 * serves it. */
kv_err repl_get_start_nb(const repl_env *env, rpc_ctx *c, Kv__GetRequest *req, repl_call **out);
kv_err repl_put_start_nb(const repl_env *env, rpc_ctx *c, Kv__PutRequest *req, repl_call **out);
kv_err repl_delete_start_nb(const repl_env *env, rpc_ctx *c, Kv__DeleteRequest *req,
                            repl_call **out);
/* repl_finish without a thread that waits (a router's asynchronous calls,
 * rpc_async_fn): after a successful start, repl_await(rc, done, arg) calls
 * done(arg, ready) exactly once, from the thread of the reply after which
 * the verdict needs no more waiting, or from this one when that is so
 * already; ready = false when the rest must block: a read whose first
 * replicas gave no verdict (or none by half the deadline: the others are
 * asked then), a write with pending replicas (their hints may be stored
 * synchronously). done must not block. With ready, done calls
 * repl_complete(rc, c, &rv): true when the verdict was reached (rv, c as
 * repl_finish leaves them, rc freed); false when the rest must block after
 * all (a retry on a newer map). Whenever the rest must block, the caller
 * passes rc to repl_finish on a thread that may. */
void repl_await(repl_call *rc, void (*done)(void *arg, bool ready), void *arg);
bool repl_complete(repl_call *rc, rpc_ctx *c, kv_err *rv);
/* kv.Batch: writes to every current and pending replica, reads to every
 * replica at QUORUM/ALL or the first reachable one at ONE, one sub-batch
 * per node sent at once, per-op results merged in order (an op's status is
 * its own). Ops must have been validated; write ops without a version get
 * one. Returns KV_OK when the batch was processed. */
kv_err repl_batch(const repl_env *env, rpc_ctx *c, Kv__BatchRequest *req);

/* ---- helpers (repl.c) ---- */

/* Checks a batch of len bytes and each of its ops against l (count, bytes,
 * key and value sizes, op types): KV_OK, or INVALID_ARGUMENT with c's
 * message naming the op and the limit. */
kv_err repl_check_ops(const kv_limits *l, rpc_ctx *c, const Kv__BatchRequest *req, size_t len);
/* The same checks of count and size on a packed BatchRequest, before it is
 * unpacked (issue 16 item 4: 10M empty ops in 20 MB would take gigabytes
 * to unpack only to be refused): counts the ops in the wire format. */
kv_err repl_check_batch_wire(const kv_limits *l, rpc_ctx *c, const uint8_t *body, size_t len);
/* INVALID_ARGUMENT (naming the op) unless every op is a GET, PUT or DELETE:
 * protobuf-c keeps an enum value it does not know, and an op of type 99
 * would otherwise run as a write. */
kv_err repl_check_op_types(rpc_ctx *c, const Kv__BatchRequest *req);

/* Deadline for a call made on behalf of c: the caller's remaining time less
 * a margin so the coordinator can still answer before the caller gives up. */
uint32_t repl_forward_deadline(const rpc_ctx *c);
/* Acks a level needs among n replicas (DEFAULT = dflt), 1..n. */
int repl_acks_needed(Kv__Consistency c, Kv__Consistency dflt, int n);
/* True for statuses that mean "no verdict from the node" (transport errors,
 * and RESOURCE_EXHAUSTED: the node shed the call under overload). */
bool repl_transport_err(kv_err s);
/* Writes to order[] the replicas idx[0..n) that may serve reads first
 * (health UNKNOWN or UP, in their ring order), then the others; returns how
 * many are readable. */
int repl_read_order(cmap *m, const uint32_t *idx, int n, uint32_t *order);
/* Whether map node i is this coordinator's own node. */
bool repl_is_self(const repl_env *env, cmap *m, uint32_t i);
/* Whether a read of key at level cons, coordinated with map m, is the
 * coordinator's own replica's alone: a level of one, and this node first
 * in read order (the primary, unless the failure detector holds it
 * unhealthy). Then that replica's verdict is the read's (no fan-out, no
 * repair). *nrep (may be NULL): the key's current replicas. */
bool repl_read_alone(const repl_env *env, cmap *m, const ProtobufCBinaryData *key,
                     Kv__Consistency cons, int *nrep);
/* Asks map node holder to keep recs for map node target (admin.Hint,
 * asynchronous, fire-and-forget; counted in hints_sent / hint_errors). */
void repl_send_hint(const repl_env *env, cmap *m, uint32_t holder, uint32_t target,
                    Kv__Record *const *recs, size_t n);
/* The same, synchronously: returns once the holder stored the hints
 * durably (KV_OK) or failed. A pending replica (membership change) that
 * cannot take a write counts as acknowledged once its hint is stored: the
 * change completes only after its hints are replayed. */
kv_err repl_store_hint(const repl_env *env, cmap *m, uint32_t holder, uint32_t target,
                       Kv__Record *const *recs, size_t n, uint32_t deadline_ms);
/* Read repair: given the replies of a read (GetReply bodies), writes the
 * newest version to the replicas that answered with an older one
 * (admin.Apply, asynchronous; counted in read_repairs). */
void repl_read_repair(const repl_env *env, cmap *m, const ProtobufCBinaryData *key,
                      const uint32_t *idx, const rpc_reply *reps, const bool *have, int n);

#endif
