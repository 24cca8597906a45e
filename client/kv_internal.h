/* SPDX-License-Identifier: MIT */
/* libkvclient internals shared by kv_client.c and kv_async.c (not installed). */
#ifndef KV_CLIENT_KV_INTERNAL_H
#define KV_CLIENT_KV_INTERNAL_H

#include "common/limits.h"
#include "kv/kv.h"
#include "proto/rpc.h"

/* A synchronous call to the routers with failover; sets the thread's last
 * error. */
kv_err kvc_call(kv_client *c, const char *method, const ProtobufCMessage *req, rpc_reply *out);
/* The same for a request about key: with a direct client that knows the map,
 * straight to the key's replicas (kv_direct.c), else to the routers. */
kv_err kvc_call_key(kv_client *c, const char *method, const ProtobufCMessage *req, const void *key,
                    size_t klen, rpc_reply *out);
/* The client's smart-client state, NULL unless opened with direct. */
typedef struct kvd kvd;
kvd *kvc_direct(const kv_client *c);
kv_err kvc_set_error(kv_err rv, const char *msg);
const kv_limits *kvc_limits(const kv_client *c);
rpc_chan *kvc_chan(kv_client *c, size_t i);
size_t kvc_nchans(const kv_client *c);
size_t kvc_current(kv_client *c);
uint32_t kvc_timeout(const kv_client *c);

/* ---- kv_direct.c: the smart client ---- */

/* Starts learning the cluster map (a ticker thread asks the client's
 * addresses, then the map's nodes); copts are the options of the client's
 * channels. On success *out is owned by the client (kvd_close). */
kv_err kvd_open(kvd **out, kv_client *c, const rpc_chan_opts *copts, const char *map_key);
/* Stops the ticker and closes the node channels (in-flight calls complete
 * with CANCELLED first). NULL is a no-op. Not from a callback. */
void kvd_close(kvd *d);
/* The channel for a request about key: the first replica from *attempt on
 * that has a connection (the last one even without), in the order of the
 * map (primary first); *attempt moves past it and *epoch gets the map's
 * epoch. NULL when the map is unknown or every replica was tried: use the
 * routers. Any thread, callbacks included. */
rpc_chan *kvd_route(kvd *d, const void *key, size_t klen, size_t *attempt, uint64_t *epoch);
/* Learns from a node's reply to a call sent with map epoch sent_epoch: a
 * FAILED_PRECONDITION carrying a map is installed (returns true when it is
 * newer than sent_epoch: route again from the first replica), a newer epoch
 * on the reply asks the ticker for the map at once. NULL d: false. */
bool kvd_saw_reply(kvd *d, const rpc_reply *r, uint64_t sent_epoch);

#endif
