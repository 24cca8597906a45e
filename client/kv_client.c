/* SPDX-License-Identifier: MIT */
/*
 * libkvclient: kv.* calls to a list of routers over the RPC runtime. The
 * client checks the request limits before anything reaches the wire, and
 * fails over to the next address only when a call could not reach the
 * current one (a local UNAVAILABLE), so no request is ever applied twice by
 * a failover.
 */
#include "kv/kv.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/kv_internal.h"
#include "common/limits.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"

#define MAX_ROUTERS 64

struct kv_client {
    kvd *direct; /* the smart client (kv_direct.c), NULL without opts.direct */
    rpc_chan *chans[MAX_ROUTERS];
    size_t n;
    _Atomic size_t cur; /* index of the address that answered last */
    uint32_t timeout_ms;
    kv_limits limits;
};

static _Thread_local char last_error[RPC_MAX_MESSAGE + 64];

const char *kv_last_error(void)
{
    return last_error;
}

kv_err kvc_set_error(kv_err rv, const char *msg)
{
    if (rv != KV_OK)
        snprintf(last_error, sizeof(last_error), "%s", msg && *msg ? msg : kv_strerror(rv));
    else
        last_error[0] = '\0';
    return rv;
}

void kv_value_free(kv_value *v)
{
    if (!v)
        return;
    free(v->data);
    v->data = NULL;
    v->len = 0;
}

kv_err kv_client_open(kv_client **out, const char *routers, const kv_client_opts *opts)
{
    if (!routers || !*routers)
        return kvc_set_error(KV_INVALID_ARGUMENT, "no router address given");
    kv_client *c = calloc(1, sizeof(*c));
    char *list = strdup(routers);
    if (!c || !list) {
        free(c);
        free(list);
        return KV_RESOURCE_EXHAUSTED;
    }
    c->timeout_ms = opts && opts->timeout_ms ? opts->timeout_ms : RPC_DEFAULT_DEADLINE_MS;
    c->limits = kv_default_limits;
    rpc_tls tls = {0};
    rpc_chan_opts co = {0};
    if (opts) {
        tls = (rpc_tls){opts->tls_cert, opts->tls_key, opts->tls_ca, false};
        co.auth = opts->admin_auth && *opts->admin_auth ? opts->admin_auth : opts->auth;
        co.tls = opts->tls_cert || opts->tls_ca ? &tls : NULL;
        /* a smart client's requests ask to be coordinated wherever they go:
         * its addresses may be nodes, and a node applies a plain request
         * as one replica (a router coordinates either way) */
        co.coordinate = opts->direct;
    }
    /* A call right after open waits for its address's first connection
     * (a dial or a TLS handshake still in progress) for the call's deadline
     * shared among the addresses, so that failing over from a dead first
     * address still fits one deadline; never less than the channels'
     * default of 1 s. The smart client's node channels keep that default:
     * a down replica must not use up the deadline its successor needs. */
    size_t naddr = 1;
    for (const char *p = list; *p; p++)
        naddr += *p == ',';
    uint32_t wait = (uint32_t)(c->timeout_ms / naddr);
    rpc_chan_opts rco = co;
    rco.connect_wait_ms = wait > RPC_CONNECT_WAIT_MS ? wait : RPC_CONNECT_WAIT_MS;
    kv_err rv = KV_OK;
    char *save = NULL;
    for (char *a = strtok_r(list, ",", &save); a && rv == KV_OK; a = strtok_r(NULL, ",", &save)) {
        while (*a == ' ')
            a++;
        if (c->n == MAX_ROUTERS)
            rv = kvc_set_error(KV_INVALID_ARGUMENT, "too many router addresses");
        else if ((rv = rpc_chan_open(&c->chans[c->n], a, &rco)) == KV_OK)
            c->n++;
        else
            snprintf(last_error, sizeof(last_error), "%s '%s'",
                     !rpc_url_tls(a)          ? "bad router address"
                     : !co.tls || !co.tls->ca ? "tls+tcp:// needs a CA (tls_ca, --tls-ca) for"
                                              : "cannot set up TLS (see the log) for",
                     a);
    }
    free(list);
    if (rv == KV_OK && c->n == 0)
        rv = kvc_set_error(KV_INVALID_ARGUMENT, "no router address given");
    if (rv == KV_OK && opts && opts->direct)
        rv = kvd_open(&c->direct, c, &co, opts->map_key);
    if (rv != KV_OK) {
        kv_client_close(c);
        return rv;
    }
    *out = c;
    return KV_OK;
}

void kv_client_close(kv_client *c)
{
    if (!c)
        return;
    kvd_close(c->direct); /* its ticker asks the routers: first */
    for (size_t i = 0; i < c->n; i++)
        rpc_chan_close(c->chans[i]);
    free(c);
}

/* One synchronous call with failover on unreachable addresses. */
kv_err kvc_call(kv_client *c, const char *method, const ProtobufCMessage *req, rpc_reply *out)
{
    size_t start = atomic_load_explicit(&c->cur, memory_order_relaxed);
    kv_err rv = KV_UNAVAILABLE;
    for (size_t k = 0; k < c->n; k++) {
        size_t i = (start + k) % c->n;
        rv = rpc_call(c->chans[i], method, 0, req, c->timeout_ms, out);
        if (!(rv == KV_UNAVAILABLE && out->local) || k + 1 == c->n) {
            if (k)
                atomic_store_explicit(&c->cur, i, memory_order_relaxed);
            break;
        }
        rpc_reply_free(out);
    }
    kvc_set_error(rv, out->message);
    return rv;
}

kv_err kvc_call_key(kv_client *c, const char *method, const ProtobufCMessage *req, const void *key,
                    size_t klen, rpc_reply *out)
{
    size_t attempt = 0;
    bool relearned = false;
    uint64_t epoch = 0;
    rpc_chan *ch;
    /* bounded: each pass moves attempt on, and a newer map restarts once */
    while ((ch = kvd_route(c->direct, key, klen, &attempt, &epoch)) != NULL) {
        kv_err rv = rpc_call(ch, method, epoch, req, c->timeout_ms, out);
        if (rv == KV_UNAVAILABLE && out->local) { /* nothing sent: the next replica */
            rpc_reply_free(out);
            continue;
        }
        if (kvd_saw_reply(c->direct, out, epoch) && !relearned) {
            relearned = true;
            attempt = 0;
            rpc_reply_free(out);
            continue;
        }
        kvc_set_error(rv, out->message);
        return rv;
    }
    return kvc_call(c, method, req, out);
}

kv_err kv_get_ex(kv_client *c, const void *key, size_t klen, kv_consistency cons, kv_value *out)
{
    char err[200];
    if (kv_check_key(&c->limits, klen, err, sizeof(err)) != KV_OK)
        return kvc_set_error(KV_INVALID_ARGUMENT, err);
    Kv__GetRequest req = KV__GET_REQUEST__INIT;
    req.key.data = (uint8_t *)key;
    req.key.len = klen;
    req.consistency = (Kv__Consistency)cons;
    rpc_reply rep;
    kv_err rv = kvc_call_key(c, "kv.Get", &req.base, key, klen, &rep);
    Kv__GetReply *g = rv == KV_OK ? kv__get_reply__unpack(NULL, rep.len, rep.body) : NULL;
    if (rv == KV_OK && !g)
        rv = kvc_set_error(KV_INTERNAL, "malformed GetReply");
    if (rv == KV_OK && !g->found)
        rv = kvc_set_error(KV_NOT_FOUND, "key not found");
    if (rv == KV_OK) {
        uint8_t *data = malloc(g->value.len ? g->value.len : 1);
        if (!data) {
            rv = KV_RESOURCE_EXHAUSTED;
        } else {
            if (g->value.len)
                memcpy(data, g->value.data, g->value.len);
            out->data = data;
            out->len = g->value.len;
            out->version = g->version;
            out->expire_at_ms = g->expire_at_ms;
        }
    }
    if (g)
        kv__get_reply__free_unpacked(g, NULL);
    rpc_reply_free(&rep);
    return rv;
}

kv_err kv_get(kv_client *c, const void *key, size_t klen, kv_value *out)
{
    return kv_get_ex(c, key, klen, KV_CONSISTENCY_DEFAULT, out);
}

static kv_err fill_put(kv_client *c, Kv__PutRequest *req, const void *key, size_t klen,
                       const void *val, size_t vlen, const kv_put_opts *opts)
{
    char err[200];
    if (kv_check_key(&c->limits, klen, err, sizeof(err)) != KV_OK ||
        kv_check_value(&c->limits, vlen, err, sizeof(err)) != KV_OK)
        return kvc_set_error(KV_INVALID_ARGUMENT, err);
    req->key.data = (uint8_t *)key;
    req->key.len = klen;
    req->value.data = (uint8_t *)val;
    req->value.len = vlen;
    if (opts) {
        req->ttl_ms = opts->ttl_ms;
        req->if_version = opts->if_version;
        req->if_absent = opts->if_absent;
        req->consistency = (Kv__Consistency)opts->consistency;
    }
    return KV_OK;
}

kv_err kv_put(kv_client *c, const void *key, size_t klen, const void *val, size_t vlen,
              const kv_put_opts *opts, uint64_t *version_out)
{
    Kv__PutRequest req = KV__PUT_REQUEST__INIT;
    kv_err rv = fill_put(c, &req, key, klen, val, vlen, opts);
    if (rv != KV_OK)
        return rv;
    rpc_reply rep;
    rv = kvc_call_key(c, "kv.Put", &req.base, key, klen, &rep);
    if (rv == KV_OK && version_out) {
        Kv__PutReply *p = kv__put_reply__unpack(NULL, rep.len, rep.body);
        *version_out = p ? p->version : 0;
        if (p)
            kv__put_reply__free_unpacked(p, NULL);
    }
    rpc_reply_free(&rep);
    return rv;
}

kv_err kv_delete(kv_client *c, const void *key, size_t klen, const kv_delete_opts *opts,
                 bool *existed)
{
    char err[200];
    if (kv_check_key(&c->limits, klen, err, sizeof(err)) != KV_OK)
        return kvc_set_error(KV_INVALID_ARGUMENT, err);
    Kv__DeleteRequest req = KV__DELETE_REQUEST__INIT;
    req.key.data = (uint8_t *)key;
    req.key.len = klen;
    if (opts) {
        req.if_version = opts->if_version;
        req.consistency = (Kv__Consistency)opts->consistency;
    }
    rpc_reply rep;
    kv_err rv = kvc_call_key(c, "kv.Delete", &req.base, key, klen, &rep);
    if (rv == KV_OK && existed) {
        Kv__DeleteReply *d = kv__delete_reply__unpack(NULL, rep.len, rep.body);
        *existed = d && d->existed;
        if (d)
            kv__delete_reply__free_unpacked(d, NULL);
    }
    rpc_reply_free(&rep);
    return rv;
}

const kv_limits *kvc_limits(const kv_client *c)
{
    return &c->limits;
}

rpc_chan *kvc_chan(kv_client *c, size_t i)
{
    return c->chans[i % c->n];
}

size_t kvc_nchans(const kv_client *c)
{
    return c->n;
}

size_t kvc_current(kv_client *c)
{
    return atomic_load_explicit(&c->cur, memory_order_relaxed);
}

kvd *kvc_direct(const kv_client *c)
{
    return c->direct;
}

uint32_t kvc_timeout(const kv_client *c)
{
    return c->timeout_ms;
}
