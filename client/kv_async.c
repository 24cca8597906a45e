/* SPDX-License-Identifier: MIT */
/*
 * libkvclient: kv_batch and the async calls. An async call owns a small
 * context until its completion runs; on a local UNAVAILABLE (the router
 * could not be reached) it is re-sent to the next router from the
 * completion, which never blocks.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/kv_internal.h"
#include "common/limits.h"
#include "proto/kv.pb-c.h"

static kv_err validate_batch(kv_client *c, const kv_op *ops, size_t n, char *err, size_t errlen)
{
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += ops[i].klen + ops[i].vlen + 16;
    kv_err rv = kv_check_batch(kvc_limits(c), n, bytes, err, errlen);
    for (size_t i = 0; rv == KV_OK && i < n; i++) {
        char why[200];
        rv = kv_check_key(kvc_limits(c), ops[i].klen, why, sizeof(why));
        if (rv == KV_OK && ops[i].type != KV_OP_GET)
            rv = kv_check_value(kvc_limits(c), ops[i].vlen, why, sizeof(why));
        if (rv == KV_OK && (ops[i].type < KV_OP_GET || ops[i].type > KV_OP_DELETE)) {
            snprintf(why, sizeof(why), "unknown op type %d", (int)ops[i].type);
            rv = KV_INVALID_ARGUMENT;
        }
        if (rv != KV_OK)
            snprintf(err, errlen, "op %zu: %s", i, why);
    }
    return rv;
}

static kv_err copy_results(kv_op *ops, size_t n, const Kv__BatchReply *br)
{
    if (br->n_results != n)
        return KV_INTERNAL;
    for (size_t i = 0; i < n; i++) {
        const Kv__OpResult *r = br->results[i];
        ops[i].status = r->status ? (kv_err)r->status->code : KV_OK;
        ops[i].found = r->found;
        ops[i].version = r->version;
        ops[i].value = NULL;
        ops[i].value_len = 0;
        if (r->found && ops[i].type == KV_OP_GET) {
            ops[i].value = malloc(r->value.len ? r->value.len : 1);
            if (!ops[i].value) {
                kv_batch_free(ops, i);
                return KV_RESOURCE_EXHAUSTED;
            }
            if (r->value.len)
                memcpy(ops[i].value, r->value.data, r->value.len);
            ops[i].value_len = r->value.len;
        }
    }
    return KV_OK;
}

kv_err kv_batch(kv_client *c, kv_op *ops, size_t n, kv_consistency cons)
{
    char err[300];
    if (validate_batch(c, ops, n, err, sizeof(err)) != KV_OK)
        return kvc_set_error(KV_INVALID_ARGUMENT, err);
    Kv__Op *pb = calloc(n, sizeof(*pb));
    Kv__Op **ptrs = calloc(n, sizeof(*ptrs));
    if (!pb || !ptrs) {
        free(pb);
        free(ptrs);
        return KV_RESOURCE_EXHAUSTED;
    }
    for (size_t i = 0; i < n; i++) {
        kv__op__init(&pb[i]);
        pb[i].type = (Kv__OpType)ops[i].type;
        pb[i].key.data = (uint8_t *)ops[i].key;
        pb[i].key.len = ops[i].klen;
        pb[i].value.data = (uint8_t *)ops[i].val;
        pb[i].value.len = ops[i].type == KV_OP_PUT ? ops[i].vlen : 0;
        pb[i].ttl_ms = ops[i].ttl_ms;
        ptrs[i] = &pb[i];
    }
    Kv__BatchRequest req = KV__BATCH_REQUEST__INIT;
    req.n_ops = n;
    req.ops = ptrs;
    req.consistency = (Kv__Consistency)cons;
    rpc_reply rep;
    kv_err rv = n ? kvc_call_key(c, "kv.Batch", &req.base, ops[0].key, ops[0].klen, &rep)
                  : kvc_call(c, "kv.Batch", &req.base, &rep);
    if (rv == KV_OK) {
        Kv__BatchReply *br = kv__batch_reply__unpack(NULL, rep.len, rep.body);
        rv = br ? copy_results(ops, n, br) : kvc_set_error(KV_INTERNAL, "malformed BatchReply");
        if (br)
            kv__batch_reply__free_unpacked(br, NULL);
    }
    rpc_reply_free(&rep);
    free(pb);
    free(ptrs);
    return rv;
}

void kv_batch_free(kv_op *ops, size_t n)
{
    for (size_t i = 0; ops && i < n; i++) {
        free(ops[i].value);
        ops[i].value = NULL;
        ops[i].value_len = 0;
    }
}

/* ---- async ------------------------------------------------------------- */

typedef enum async_kind { A_GET, A_PUT, A_DELETE } async_kind;

typedef struct async_call {
    kv_client *c;
    async_kind kind;
    const char *method;
    ProtobufCMessage *req; /* points into the union below */
    union {
        Kv__GetRequest get;
        Kv__PutRequest put;
        Kv__DeleteRequest del;
    } u;
    uint8_t *buf; /* owned copies of key and value */
    size_t klen;
    size_t attempts;
    size_t chan;
    /* direct (kv_direct.c): replica index to try next, the epoch sent, and
     * whether the call went to a node, is on the routers, was re-routed */
    size_t replica;
    uint64_t epoch;
    bool via_node, on_routers, relearned;
    kv_done_fn done;
    void *arg;
} async_call;

static void async_finish(async_call *a, kv_err rv, const rpc_reply *r)
{
    kv_result res = {0};
    res.message = rv == KV_OK ? NULL : (r && r->message ? r->message : kv_strerror(rv));
    void *msg = NULL;
    if (rv == KV_OK && r) {
        if (a->kind == A_GET && (msg = kv__get_reply__unpack(NULL, r->len, r->body))) {
            Kv__GetReply *g = msg;
            res.found = g->found;
            res.value = g->value.data;
            res.len = g->value.len;
            res.version = g->version;
        } else if (a->kind == A_PUT && (msg = kv__put_reply__unpack(NULL, r->len, r->body))) {
            res.version = ((Kv__PutReply *)msg)->version;
        } else if (a->kind == A_DELETE && (msg = kv__delete_reply__unpack(NULL, r->len, r->body))) {
            res.found = ((Kv__DeleteReply *)msg)->existed;
        } else {
            rv = KV_INTERNAL;
            res.message = "malformed reply";
        }
    }
    if (a->kind == A_GET && rv == KV_OK && !res.found)
        rv = KV_NOT_FOUND;
    a->done(a->arg, rv, &res);
    if (msg)
        protobuf_c_message_free_unpacked(msg, NULL);
    free(a->buf);
    free(a);
}

static void async_sent(void *arg, rpc_reply *r);

/* Sends a: straight to the key's next replica (direct, map known), else to
 * the current router. */
static void async_send(async_call *a)
{
    kvd *d = kvc_direct(a->c);
    rpc_chan *ch =
        d && !a->on_routers ? kvd_route(d, a->buf, a->klen, &a->replica, &a->epoch) : NULL;
    a->via_node = ch != NULL;
    a->on_routers = !ch;
    if (ch)
        rpc_call_async(ch, a->method, a->epoch, a->req, kvc_timeout(a->c), async_sent, a);
    else
        rpc_call_async(kvc_chan(a->c, a->chan), a->method, 0, a->req, kvc_timeout(a->c), async_sent,
                       a);
}

/* A direct call's reply that sends it again: nothing was sent to the
 * replica (the next one, or the routers, take it), or the replica's map
 * showed ours was old (once, from the first replica). Bounded like
 * kvc_call_key. */
static bool async_reroute(async_call *a, rpc_reply *r)
{
    if (r->status == KV_UNAVAILABLE && r->local)
        return true;
    if (kvd_saw_reply(kvc_direct(a->c), r, a->epoch) && !a->relearned) {
        a->relearned = true;
        a->replica = 0;
        return true;
    }
    return false;
}

static void async_sent(void *arg, rpc_reply *r)
{
    async_call *a = arg;
    if (a->via_node && async_reroute(a, r)) {
        rpc_reply_free(r);
        async_send(a);
        return;
    }
    if (!a->via_node && r->status == KV_UNAVAILABLE && r->local &&
        ++a->attempts < kvc_nchans(a->c)) {
        rpc_reply_free(r);
        a->chan = (a->chan + 1) % kvc_nchans(a->c);
        async_send(a);
        return;
    }
    async_finish(a, r->status, r);
    rpc_reply_free(r);
}

static async_call *async_new(kv_client *c, async_kind kind, const void *key, size_t klen,
                             const void *val, size_t vlen, kv_done_fn done, void *arg)
{
    async_call *a = calloc(1, sizeof(*a));
    uint8_t *buf = malloc(klen + vlen + 1);
    if (!a || !buf) {
        free(a);
        free(buf);
        kv_result res = {.message = "out of memory"};
        done(arg, KV_RESOURCE_EXHAUSTED, &res);
        return NULL;
    }
    if (klen)
        memcpy(buf, key, klen);
    if (vlen)
        memcpy(buf + klen, val, vlen);
    a->c = c;
    a->kind = kind;
    a->buf = buf;
    a->klen = klen;
    a->done = done;
    a->arg = arg;
    a->chan = kvc_current(c);
    return a;
}

static bool async_check(kv_client *c, size_t klen, size_t vlen, kv_done_fn done, void *arg)
{
    char err[200];
    if (kv_check_key(kvc_limits(c), klen, err, sizeof(err)) == KV_OK &&
        kv_check_value(kvc_limits(c), vlen, err, sizeof(err)) == KV_OK)
        return true;
    kv_result res = {.message = err};
    done(arg, KV_INVALID_ARGUMENT, &res);
    return false;
}

void kv_burst_begin(void)
{
    rpc_burst_begin();
}

void kv_burst_end(void)
{
    rpc_burst_end();
}

void kv_get_async(kv_client *c, const void *key, size_t klen, kv_done_fn done, void *arg)
{
    async_call *a;
    if (!async_check(c, klen, 0, done, arg) ||
        !(a = async_new(c, A_GET, key, klen, NULL, 0, done, arg)))
        return;
    kv__get_request__init(&a->u.get);
    a->u.get.key = (ProtobufCBinaryData){klen, a->buf};
    a->method = "kv.Get";
    a->req = &a->u.get.base;
    async_send(a);
}

void kv_put_async(kv_client *c, const void *key, size_t klen, const void *val, size_t vlen,
                  const kv_put_opts *opts, kv_done_fn done, void *arg)
{
    async_call *a;
    if (!async_check(c, klen, vlen, done, arg) ||
        !(a = async_new(c, A_PUT, key, klen, val, vlen, done, arg)))
        return;
    kv__put_request__init(&a->u.put);
    a->u.put.key = (ProtobufCBinaryData){klen, a->buf};
    a->u.put.value = (ProtobufCBinaryData){vlen, a->buf + klen};
    if (opts) {
        a->u.put.ttl_ms = opts->ttl_ms;
        a->u.put.if_version = opts->if_version;
        a->u.put.if_absent = opts->if_absent;
        a->u.put.consistency = (Kv__Consistency)opts->consistency;
    }
    a->method = "kv.Put";
    a->req = &a->u.put.base;
    async_send(a);
}

void kv_delete_async(kv_client *c, const void *key, size_t klen, kv_done_fn done, void *arg)
{
    async_call *a;
    if (!async_check(c, klen, 0, done, arg) ||
        !(a = async_new(c, A_DELETE, key, klen, NULL, 0, done, arg)))
        return;
    kv__delete_request__init(&a->u.del);
    a->u.del.key = (ProtobufCBinaryData){klen, a->buf};
    a->method = "kv.Delete";
    a->req = &a->u.del.base;
    async_send(a);
}
