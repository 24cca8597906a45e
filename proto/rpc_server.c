/* SPDX-License-Identifier: MIT */
/*
 * RPC server over an nng REP socket: N worker threads, each owning one REP
 * context, receive an Envelope, check auth and deadline, dispatch the method
 * by name and send the reply Envelope. Every failure before the handler
 * (garbage bytes, unknown method, bad token) is answered, never dropped, so
 * the caller's context is not left waiting and the connection keeps serving.
 */
#include "proto/rpc.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/supplemental/util/platform.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "proto/kv.pb-c.h"

#define DRAIN_WAIT_NS (3ull * 1000000000ull)

typedef struct rpc_worker {
    rpc_server *srv;
    int index;
    nng_ctx ctx;
    nng_aio *aio;
    pthread_t thread;
    bool started;
    _Atomic bool exited; /* worker_main returned: it makes no more nng calls */
} rpc_worker;

struct rpc_server {
    rpc_server_opts opts;
    nng_socket sock;
    nng_listener listener;
    rpc_worker *workers;
    unsigned nworkers;
    atomic_bool stopping;
    atomic_int busy; /* workers inside a handler */
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
    return code;
}

uint32_t rpc_ctx_remaining_ms(const rpc_ctx *c)
{
    uint64_t now = kv_now_ns();
    return now >= c->deadline_ns ? 0 : (uint32_t)((c->deadline_ns - now) / 1000000ull);
}

int rpc_server_port(const rpc_server *s)
{
    int port = 0;
    if (nng_listener_get_int(s->listener, NNG_OPT_TCP_BOUND_PORT, &port) != 0)
        return -1;
    return port;
}

static const rpc_method *find_method(const rpc_server *s, const char *name)
{
    for (size_t i = 0; i < s->opts.nmethods; i++)
        if (strcmp(s->opts.methods[i].name, name) == 0)
            return &s->opts.methods[i];
    return NULL;
}

/* Runs one request through auth, dispatch and deadline checks; fills c and
 * returns the status for the reply. */
static kv_err serve(rpc_server *s, rpc_ctx *c, const Kv__Envelope *env)
{
    const char *want = s->opts.auth;
    if (want && *want && (!env->auth || strcmp(env->auth, want) != 0))
        return rpc_fail(c, KV_UNAUTHENTICATED, "missing or wrong auth token");
    const rpc_method *m = find_method(s, env->method ? env->method : "");
    if (!m)
        return rpc_fail(c, KV_UNIMPLEMENTED, "unknown method '%.100s'", env->method);
    kv_err rv = m->fn(c, env->body.data, env->body.len);
    if (rv == KV_OK && kv_now_ns() > c->deadline_ns) {
        free(c->reply);
        c->reply = NULL;
        c->reply_len = 0;
        return rpc_fail(c, KV_DEADLINE_EXCEEDED, "%s finished past its deadline", m->name);
    }
    return rv;
}

static nng_msg *build_reply(uint64_t id, kv_err status, rpc_ctx *c, uint64_t epoch)
{
    Kv__Envelope env = KV__ENVELOPE__INIT;
    Kv__Status st = KV__STATUS__INIT;
    env.id = id;
    env.map_epoch = epoch;
    st.code = (int32_t)status;
    st.message = c->message;
    env.status = &st;
    env.body.data = c->reply;
    env.body.len = c->reply_len;
    nng_msg *msg;
    size_t n = kv__envelope__get_packed_size(&env);
    if (nng_msg_alloc(&msg, n) != 0)
        return NULL;
    kv__envelope__pack(&env, nng_msg_body(msg));
    return msg;
}

static void handle_one(rpc_worker *w, nng_msg *req)
{
    rpc_server *s = w->srv;
    rpc_ctx c = {0};
    c.worker = w->index;
    c.user = s->opts.user;
    uint64_t id = 0;
    kv_err status;
    Kv__Envelope *env = kv__envelope__unpack(NULL, nng_msg_len(req), nng_msg_body(req));
    if (!env) {
        status = rpc_fail(&c, KV_INVALID_ARGUMENT, "malformed request: not a kv.Envelope");
    } else {
        id = env->id;
        uint32_t dl = env->deadline_ms ? env->deadline_ms : s->opts.default_deadline_ms;
        c.method = env->method;
        c.map_epoch = env->map_epoch;
        c.deadline_ns = kv_now_ns() + (uint64_t)dl * 1000000ull;
        atomic_fetch_add(&s->busy, 1);
        status = serve(s, &c, env);
        atomic_fetch_sub(&s->busy, 1);
    }
    nng_msg_free(req);
    nng_msg *rep = build_reply(id, status, &c, c.reply_epoch);
    if (env)
        kv__envelope__free_unpacked(env, NULL);
    free(c.reply);
    if (!rep) {
        KV_ERROR("rpc", "out of memory building a reply");
        return;
    }
    nng_aio_set_msg(w->aio, rep);
    nng_ctx_send(w->ctx, w->aio);
    nng_aio_wait(w->aio);
    if (nng_aio_result(w->aio) != 0)
        nng_msg_free(rep);
}

static void *worker_main(void *arg)
{
    rpc_worker *w = arg;
    rpc_server *s = w->srv;
    if (s->opts.thread_start)
        s->opts.thread_start(w->index, s->opts.user);
    while (!atomic_load(&s->stopping)) {
        nng_ctx_recv(w->ctx, w->aio);
        nng_aio_wait(w->aio);
        int rv = nng_aio_result(w->aio);
        if (rv == NNG_ECLOSED || rv == NNG_ECANCELED)
            break;
        if (rv != 0)
            continue;
        handle_one(w, nng_aio_get_msg(w->aio));
    }
    if (s->opts.thread_stop)
        s->opts.thread_stop(w->index, s->opts.user);
    atomic_store(&w->exited, true);
    return NULL;
}

static kv_err open_socket(rpc_server *s, char *err, size_t errlen)
{
    int rv;
    if ((rv = nng_rep0_open(&s->sock)) != 0) {
        snprintf(err, errlen, "nng_rep0_open: %s", nng_strerror(rv));
        return KV_INTERNAL;
    }
    size_t recv_max = s->opts.recv_max ? s->opts.recv_max : kv_limits_recv_max(&kv_default_limits);
    nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, recv_max);
    if ((rv = nng_listener_create(&s->listener, s->sock, s->opts.url)) != 0 ||
        (rv = nng_listener_set_size(s->listener, NNG_OPT_RECVMAXSZ, recv_max)) != 0 ||
        (rv = nng_listener_start(s->listener, 0)) != 0) {
        snprintf(err, errlen, "cannot listen on %s: %s", s->opts.url, nng_strerror(rv));
        return rv == NNG_EADDRINUSE ? KV_UNAVAILABLE : KV_INVALID_ARGUMENT;
    }
    return KV_OK;
}

static kv_err start_workers(rpc_server *s, char *err, size_t errlen)
{
    for (unsigned i = 0; i < s->nworkers; i++) {
        rpc_worker *w = &s->workers[i];
        w->srv = s;
        w->index = (int)i;
        int rv;
        if ((rv = nng_ctx_open(&w->ctx, s->sock)) != 0 ||
            (rv = nng_aio_alloc(&w->aio, NULL, NULL)) != 0) {
            snprintf(err, errlen, "nng context: %s", nng_strerror(rv));
            return KV_INTERNAL;
        }
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            snprintf(err, errlen, "cannot start worker thread");
            return KV_RESOURCE_EXHAUSTED;
        }
        w->started = true;
    }
    return KV_OK;
}

kv_err rpc_server_open(rpc_server **out, const rpc_server_opts *opts, char *err, size_t errlen)
{
    rpc_server *s = calloc(1, sizeof(*s));
    if (!s)
        return KV_RESOURCE_EXHAUSTED;
    s->opts = *opts;
    if (!s->opts.default_deadline_ms)
        s->opts.default_deadline_ms = RPC_DEFAULT_DEADLINE_MS;
    s->nworkers = opts->workers ? opts->workers : 8;
    s->workers = calloc(s->nworkers, sizeof(*s->workers));
    kv_err rv = s->workers ? KV_OK : KV_RESOURCE_EXHAUSTED;
    if (rv == KV_OK)
        rv = open_socket(s, err, errlen);
    if (rv == KV_OK)
        rv = start_workers(s, err, errlen);
    if (rv != KV_OK) {
        rpc_server_close(s);
        return rv;
    }
    *out = s;
    return KV_OK;
}

void rpc_server_close(rpc_server *s)
{
    if (!s)
        return;
    atomic_store(&s->stopping, true);
    if (s->workers && s->workers[0].started) {
        nng_listener_close(s->listener); /* no new connections */
        uint64_t until = kv_now_ns() + DRAIN_WAIT_NS;
        while (atomic_load(&s->busy) > 0 && kv_now_ns() < until)
            nng_msleep(2);
    }
    /* The workers leave nng before the socket closes: nng 1.5 panics
     * (abort: pthread_mutex_lock on a destroyed mutex, or a stopped aio in
     * nng_ctx_send) when nng_close races a context operation on another
     * thread, so the close must not start while a worker may be inside one.
     * stopping is set, so a worker submits nothing after its current
     * operation; cancelling aborts that operation (a blocked receive, or a
     * reply the peer does not take). A worker that checked stopping just
     * before it was set may still submit one receive after a cancel, hence
     * the loop until every worker has exited. */
    for (unsigned i = 0; s->workers && i < s->nworkers; i++) {
        rpc_worker *w = &s->workers[i];
        if (!w->started)
            continue;
        while (!atomic_load(&w->exited)) {
            nng_aio_cancel(w->aio);
            nng_msleep(1);
        }
        pthread_join(w->thread, NULL);
    }
    nng_close(s->sock);
    for (unsigned i = 0; s->workers && i < s->nworkers; i++)
        if (s->workers[i].aio)
            nng_aio_free(s->workers[i].aio);
    free(s->workers);
    free(s);
}
