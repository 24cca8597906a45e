/* SPDX-License-Identifier: MIT */
/*
 * RPC client channel: one nng REQ socket dialed to one peer, with a pool of
 * REQ contexts so many calls can be in flight at once. Each call is a small
 * state machine driven by its context's aio callback (send, then receive).
 * nng's resend timer is switched off: a request is sent once, and a call
 * fails with UNAVAILABLE when the peer has no live connection, or with
 * DEADLINE_EXCEEDED when a connected peer does not answer in time.
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

#include "common/clock.h"
#include "common/log.h"
#include "proto/kv.pb-c.h"

#define DEFAULT_CONNECT_WAIT_MS 1000u

typedef struct rpc_slot rpc_slot;
struct rpc_slot {
    rpc_chan *ch;
    nng_ctx ctx;
    nng_aio *aio;
    rpc_slot *next_free;
    bool receiving;
    uint64_t id;
    uint64_t deadline_ns;
    rpc_done_fn done;
    void *arg;
};

struct rpc_chan {
    nng_socket sock;
    nng_dialer dialer;
    char *url;
    char *auth;
    size_t recv_max;
    uint32_t connect_wait_ms;
    uint64_t opened_ns;
    pthread_mutex_t mu; /* protects free_slots, all, nall; pairs with cv */
    pthread_cond_t cv;  /* signalled when a connection comes up */
    rpc_slot *free_slots;
    rpc_slot **all;
    size_t nall, cap;
    atomic_int pipes;
    atomic_uint_fast64_t next_id;
};

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

int rpc_chan_connected(const rpc_chan *ch)
{
    return atomic_load(&((rpc_chan *)ch)->pipes);
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

static void slot_finish(rpc_slot *s, rpc_reply *r)
{
    rpc_done_fn done = s->done;
    void *arg = s->arg;
    slot_release(s);
    done(arg, r);
}

static void parse_reply(rpc_slot *s, nng_msg *m, rpc_reply *r)
{
    Kv__Envelope *env = kv__envelope__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
    nng_msg_free(m);
    if (!env) {
        reply_set(r, KV_INTERNAL, "malformed reply envelope");
        return;
    }
    int code = env->status ? env->status->code : 0;
    reply_set(r, (code >= 0 && code < KV_ERR_COUNT_) ? (kv_err)code : KV_UNKNOWN,
              env->status && env->status->message && *env->status->message ? env->status->message
                                                                           : NULL);
    r->map_epoch = env->map_epoch;
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
    if (env->id != s->id && r->status == KV_OK) {
        rpc_reply_free(r);
        reply_set(r, KV_INTERNAL, "reply id does not match the request");
    }
    kv__envelope__free_unpacked(env, NULL);
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
    } else {
        snprintf(msg, sizeof(msg), "%s: %s", s->ch->url, nng_strerror(rv));
    }
    reply_set(r, st, msg);
    r->local = true;
}

static void slot_cb(void *arg)
{
    rpc_slot *s = arg;
    rpc_reply r;
    int rv = nng_aio_result(s->aio);
    if (rv != 0) {
        if (!s->receiving)
            nng_msg_free(nng_aio_get_msg(s->aio));
        fail_transport(s, rv, &r);
        slot_finish(s, &r);
        return;
    }
    if (!s->receiving) {
        uint64_t now = kv_now_ns();
        if (now >= s->deadline_ns) {
            fail_transport(s, NNG_ETIMEDOUT, &r);
            slot_finish(s, &r);
            return;
        }
        s->receiving = true;
        nng_aio_set_timeout(s->aio, (nng_duration)((s->deadline_ns - now) / 1000000ull + 1));
        nng_ctx_recv(s->ctx, s->aio);
        return;
    }
    parse_reply(s, nng_aio_get_msg(s->aio), &r);
    slot_finish(s, &r);
}

static rpc_slot *slot_get(rpc_chan *ch)
{
    pthread_mutex_lock(&ch->mu);
    rpc_slot *s = ch->free_slots;
    if (s) {
        ch->free_slots = s->next_free;
        pthread_mutex_unlock(&ch->mu);
        return s;
    }
    if (ch->nall == ch->cap) {
        size_t ncap = ch->cap ? ch->cap * 2 : 16;
        rpc_slot **n = realloc(ch->all, ncap * sizeof(*n));
        if (!n) {
            pthread_mutex_unlock(&ch->mu);
            return NULL;
        }
        ch->all = n;
        ch->cap = ncap;
    }
    s = calloc(1, sizeof(*s));
    if (s && (nng_ctx_open(&s->ctx, ch->sock) != 0 || nng_aio_alloc(&s->aio, slot_cb, s) != 0)) {
        free(s);
        s = NULL;
    }
    if (s) {
        s->ch = ch;
        ch->all[ch->nall++] = s;
    }
    pthread_mutex_unlock(&ch->mu);
    return s;
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
        opts && opts->connect_wait_ms ? opts->connect_wait_ms : DEFAULT_CONNECT_WAIT_MS;
    ch->opened_ns = kv_now_ns();
    int rv = nng_req0_open(&ch->sock);
    if (rv == 0) {
        nng_socket_set_ms(ch->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
        nng_socket_set_size(ch->sock, NNG_OPT_RECVMAXSZ, ch->recv_max);
        nng_socket_set_ms(ch->sock, NNG_OPT_RECONNMINT, 50);
        nng_socket_set_ms(ch->sock, NNG_OPT_RECONNMAXT, 1000);
        nng_pipe_notify(ch->sock, NNG_PIPE_EV_ADD_POST, pipe_cb, ch);
        nng_pipe_notify(ch->sock, NNG_PIPE_EV_REM_POST, pipe_cb, ch);
        rv = nng_dialer_create(&ch->dialer, ch->sock, url);
    }
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

void rpc_chan_close(rpc_chan *ch)
{
    if (!ch)
        return;
    /* Stop every context's aio before closing the socket: a completion that
     * is running may submit the receive phase, and nng (1.5) must not see
     * that race with the socket tearing its contexts down. A stopped aio
     * fails new submissions, so pending calls complete with CANCELLED. */
    for (size_t i = 0; i < ch->nall; i++)
        nng_aio_stop(ch->all[i]->aio);
    nng_close(ch->sock);
    for (size_t i = 0; i < ch->nall; i++) {
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

static nng_msg *build_request(rpc_chan *ch, uint64_t id, const char *method, uint64_t epoch,
                              const ProtobufCMessage *req, uint32_t deadline_ms, kv_err *err)
{
    Kv__Envelope env = KV__ENVELOPE__INIT;
    env.id = id;
    env.method = (char *)method;
    env.deadline_ms = deadline_ms;
    env.auth = ch->auth;
    env.map_epoch = epoch;
    size_t blen = req ? protobuf_c_message_get_packed_size(req) : 0;
    if (blen + KV_RPC_OVERHEAD / 2 > ch->recv_max) {
        *err = KV_INVALID_ARGUMENT;
        return NULL;
    }
    uint8_t *body = blen ? malloc(blen) : NULL;
    if (blen && !body) {
        *err = KV_RESOURCE_EXHAUSTED;
        return NULL;
    }
    if (blen)
        protobuf_c_message_pack(req, body);
    env.body.data = body;
    env.body.len = blen;
    nng_msg *m = NULL;
    if (nng_msg_alloc(&m, kv__envelope__get_packed_size(&env)) != 0) {
        *err = KV_RESOURCE_EXHAUSTED;
        m = NULL;
    } else {
        kv__envelope__pack(&env, nng_msg_body(m));
    }
    free(body);
    return m;
}

void rpc_call_async(rpc_chan *ch, const char *method, uint64_t map_epoch,
                    const ProtobufCMessage *req, uint32_t deadline_ms, rpc_done_fn done, void *arg)
{
    rpc_reply r;
    char msg[160];
    if (!deadline_ms)
        deadline_ms = RPC_DEFAULT_DEADLINE_MS;
    uint64_t now = kv_now_ns();
    if (atomic_load(&ch->pipes) == 0 &&
        now - ch->opened_ns > (uint64_t)ch->connect_wait_ms * 1000000ull) {
        snprintf(msg, sizeof(msg), "no connection to %s", ch->url);
        reply_set(&r, KV_UNAVAILABLE, msg);
        r.local = true;
        done(arg, &r);
        return;
    }
    kv_err err = KV_OK;
    uint64_t id = atomic_fetch_add(&ch->next_id, 1) + 1;
    nng_msg *m = build_request(ch, id, method, map_epoch, req, deadline_ms, &err);
    rpc_slot *s = m ? slot_get(ch) : NULL;
    if (!s) {
        nng_msg_free(m);
        snprintf(msg, sizeof(msg), "%s request is over the %zu-byte message limit", method,
                 ch->recv_max);
        reply_set(&r, m ? KV_RESOURCE_EXHAUSTED : err, err == KV_INVALID_ARGUMENT ? msg : NULL);
        r.local = true;
        done(arg, &r);
        return;
    }
    s->id = id;
    s->done = done;
    s->arg = arg;
    s->receiving = false;
    s->deadline_ns = now + (uint64_t)deadline_ms * 1000000ull;
    nng_aio_set_timeout(s->aio, (nng_duration)deadline_ms);
    nng_aio_set_msg(s->aio, m);
    nng_ctx_send(s->ctx, s->aio);
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
    rpc_call_async(ch, method, map_epoch, req, spent < deadline_ms ? deadline_ms - spent : 1,
                   sync_done, &w);
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

kv_err rpc_runtime_init(void)
{
    nng_socket s;
    if (nng_req0_open(&s) != 0)
        return KV_INTERNAL;
    nng_close(s);
    return KV_OK;
}
