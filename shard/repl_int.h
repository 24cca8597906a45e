/* SPDX-License-Identifier: MIT */
/* Internals of the replication library shared by repl.c, repl_kv.c and
 * repl_batch.c (not for its users). */
#ifndef KV_SHARD_REPL_INT_H
#define KV_SHARD_REPL_INT_H

#include "shard/fan.h"
#include "shard/repl.h"

/* A call to the coordinator's own replica, made after the network sends of
 * a fan-out so that they overlap with it. slot < 0: none. */
typedef struct repl_local_call {
    int slot;
    const char *method;
    const ProtobufCMessage *msg;
    uint64_t epoch;
    uint32_t deadline_ms;
} repl_local_call;

/* Sends msg to map node i as the fan-out's next send: over the network, or,
 * for the coordinator's own node, reserved in f and recorded in *lc for
 * repl_run_local. */
void repl_send(const repl_env *env, fanout *f, cmap *m, uint32_t i, const char *method,
               const ProtobufCMessage *msg, uint32_t deadline_ms, repl_local_call *lc);
/* Runs method(msg) on the coordinator's own replica (env->local) into *out,
 * synchronously. */
void repl_call_local(const repl_env *env, const char *method, uint64_t epoch,
                     const ProtobufCMessage *msg, uint32_t deadline_ms, rpc_reply *out);
/* The same through env->local_try: false, *out untouched, when it would
 * block, memory runs out or env has no local_try. */
bool repl_try_local(const repl_env *env, const char *method, uint64_t epoch,
                    const ProtobufCMessage *msg, uint32_t deadline_ms, rpc_reply *out);
/* Runs the reserved local call, if any, and completes its send. */
void repl_run_local(const repl_env *env, fanout *f, repl_local_call *lc);
/* The current map (a reference the caller drops), with c->reply_epoch set;
 * NULL with *rv = UNAVAILABLE when there is none. */
cmap *repl_map(const repl_env *env, rpc_ctx *c, kv_err *rv);
/* A FAILED_PRECONDITION reply that carries the replica's map. */
bool repl_carries_map(const rpc_reply *r);

#endif
