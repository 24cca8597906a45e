/* SPDX-License-Identifier: MIT */
/* libkvclient internals shared by kv_client.c and kv_async.c (not installed). */
#ifndef KV_CLIENT_KV_INTERNAL_H
#define KV_CLIENT_KV_INTERNAL_H

#include "common/limits.h"
#include "kv/kv.h"
#include "proto/rpc.h"

/* A synchronous call with failover; sets the thread's last error. */
kv_err kvc_call(kv_client *c, const char *method, const ProtobufCMessage *req, rpc_reply *out);
kv_err kvc_set_error(kv_err rv, const char *msg);
const kv_limits *kvc_limits(const kv_client *c);
rpc_chan *kvc_chan(kv_client *c, size_t i);
size_t kvc_nchans(const kv_client *c);
size_t kvc_current(kv_client *c);
uint32_t kvc_timeout(const kv_client *c);

#endif
