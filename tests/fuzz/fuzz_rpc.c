/* SPDX-License-Identifier: MIT */
/*
 * The RPC harness driver and reply checks of fuzz_rpc.h, and the nng wraps
 * that keep every dial and listen of a harness process on inproc://, or, for
 * a channel on nng's byte streams, on a scripted peer's loopback port.
 */
#include "fuzz_rpc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc_loop.h"
#include "shard/clustermap.h"

#define NOWHERE "inproc://hotkv-fuzz-nowhere"
/* where a stream dial goes that names no scripted peer: a Unix socket path
 * that does not exist, so the dial fails at once without leaving the host */
#define NOWHERE_STREAM "ipc:///nonexistent/hotkv-fuzz-nowhere"

int __real_nng_dialer_create(nng_dialer *d, nng_socket s, const char *url);
int __wrap_nng_dialer_create(nng_dialer *d, nng_socket s, const char *url);
int __real_nng_listener_create(nng_listener *l, nng_socket s, const char *url);
int __wrap_nng_listener_create(nng_listener *l, nng_socket s, const char *url);

int __real_nng_stream_dialer_alloc(nng_stream_dialer **d, const char *url);
int __wrap_nng_stream_dialer_alloc(nng_stream_dialer **d, const char *url);
int __wrap_nng_stream_listener_alloc(nng_stream_listener **l, const char *url);
int __real_rpc_loop_connect(const struct sockaddr *addr, unsigned len, int on,
                            void (*done)(void *arg, rpc_dial *d, int fd, int err), void *arg,
                            rpc_dial **out);
int __wrap_rpc_loop_connect(const struct sockaddr *addr, unsigned len, int on,
                            void (*done)(void *arg, rpc_dial *d, int fd, int err), void *arg,
                            rpc_dial **out);
int __wrap_rpc_loop_listen(const char *url, int *port, char *err, size_t errlen);
kv_err __real_rpc_chan_open(rpc_chan **out, const char *url, const rpc_chan_opts *opts);
kv_err __wrap_rpc_chan_open(rpc_chan **out, const char *url, const rpc_chan_opts *opts);

/* Peers never answer here: a call need not wait a second for a first
 * connection (rpc_chan's default), which would make each input take seconds. */
kv_err __wrap_rpc_chan_open(rpc_chan **out, const char *url, const rpc_chan_opts *opts)
{
    rpc_chan_opts o = opts ? *opts : (rpc_chan_opts){0};
    o.connect_wait_ms = 1;
    return __real_rpc_chan_open(out, url, &o);
}

/* The loopback port each scripted peer also listens on, for channels on
 * nng's byte streams (tcp:// URLs), which inproc cannot carry. */
static int peer_port[FZ_PEERS];

/* i when url is tcp://127.0.0.1:i of a scripted peer i, else 0. */
static long peer_of(const char *url)
{
    char *end = NULL;
    long port = strncmp(url, "tcp://127.0.0.1:", 16) == 0 ? strtol(url + 16, &end, 10) : 0;
    return end && !*end && port >= 1 && port <= FZ_PEERS ? port : 0;
}

/* tcp://127.0.0.1:i for a scripted peer i, or inproc as is; else nowhere. */
static const char *redirect(const char *url, char *buf, size_t cap)
{
    if (strncmp(url, "inproc://", 9) == 0)
        return url;
    long i = peer_of(url);
    if (i) {
        snprintf(buf, cap, "inproc://hotkv-fuzz-peer-%ld", i);
        return buf;
    }
    return NOWHERE;
}

int __wrap_nng_stream_dialer_alloc(nng_stream_dialer **d, const char *url)
{
    char buf[64];
    long i = peer_of(url);
    if (i)
        snprintf(buf, sizeof(buf), "tcp://127.0.0.1:%d", peer_port[i - 1]);
    return __real_nng_stream_dialer_alloc(d, i ? buf : NOWHERE_STREAM);
}

/* Connects on hotkv's own loops (tcp:// to a numeric address): a scripted
 * peer's address goes to its loopback port, any other is refused at once. */
int __wrap_rpc_loop_connect(const struct sockaddr *addr, unsigned len, int on,
                            void (*done)(void *arg, rpc_dial *d, int fd, int err), void *arg,
                            rpc_dial **out)
{
    const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
    int i = addr->sa_family == AF_INET && ntohl(in->sin_addr.s_addr) == INADDR_LOOPBACK
                ? ntohs(in->sin_port)
                : 0;
    if (i < 1 || i > FZ_PEERS)
        return ECONNREFUSED;
    struct sockaddr_in to = *in;
    to.sin_port = htons((uint16_t)peer_port[i - 1]);
    return __real_rpc_loop_connect((const struct sockaddr *)&to, sizeof(to), on, done, arg, out);
}

int __wrap_rpc_loop_listen(const char *url, int *port, char *err, size_t errlen)
{
    (void)port;
    (void)err;
    (void)errlen;
    fz_fail(__FILE__, __LINE__, "no listener", "a harness listens on %s", url);
}

int __wrap_nng_stream_listener_alloc(nng_stream_listener **l, const char *url)
{
    (void)l;
    fz_fail(__FILE__, __LINE__, "no stream listener", "a harness listens on %s", url);
    return NNG_ENOTSUP;
}

int __wrap_nng_dialer_create(nng_dialer *d, nng_socket s, const char *url)
{
    char buf[64];
    return __real_nng_dialer_create(d, s, redirect(url, buf, sizeof(buf)));
}

int __wrap_nng_listener_create(nng_listener *l, nng_socket s, const char *url)
{
    FZ_CHECK(strncmp(url, "inproc://", 9) == 0, "a harness listens on %s", url);
    return __real_nng_listener_create(l, s, url);
}

static const struct {
    const char *method;
    const ProtobufCMessageDescriptor *reply;
} replies[] = {
    {"kv.Get", &kv__get_reply__descriptor},
    {"kv.Put", &kv__put_reply__descriptor},
    {"kv.Delete", &kv__delete_reply__descriptor},
    {"kv.Batch", &kv__batch_reply__descriptor},
    {"admin.Ping", &kv__ping_reply__descriptor},
    {"admin.Stats", &kv__stats_reply__descriptor},
    {"admin.HotKeys", &kv__hot_keys_reply__descriptor},
    {"admin.GetMap", &kv__get_map_reply__descriptor},
    {"admin.SetMap", &kv__set_map_reply__descriptor},
    {"admin.StreamRead", &kv__stream_read_reply__descriptor},
    {"admin.StreamStart", &kv__stream_start_reply__descriptor},
    {"admin.StreamStatus", &kv__stream_status_reply__descriptor},
    {"admin.Digest", &kv__digest_reply__descriptor},
    {"admin.Apply", &kv__apply_reply__descriptor},
    {"admin.Hint", &kv__hint_reply__descriptor},
    {"admin.HintStatus", &kv__hint_status_reply__descriptor},
    {"admin.Cleanup", &kv__cleanup_reply__descriptor},
    {"admin.Repaired", &kv__repaired_reply__descriptor},
};

const ProtobufCMessageDescriptor *fz_reply_desc(const char *method)
{
    for (size_t i = 0; i < sizeof(replies) / sizeof(replies[0]); i++)
        if (strcmp(replies[i].method, method) == 0)
            return replies[i].reply;
    return NULL;
}

cmap *fz_test_map(int which)
{
    static char *const specs[] = {"n1=tcp://127.0.0.1:1", "n2=tcp://127.0.0.1:2",
                                  "n3=tcp://127.0.0.1:3"};
    cmap *m = NULL;
    char err[256];
    bool one = which == FZ_MAP_ONE;
    FZ_CHECK(cmap_parse_spec(1, one ? 1 : 2, specs, one ? 1 : 3, &m, err, sizeof(err)) == KV_OK,
             "map: %s", err);
    if (which != FZ_MAP_JOINING)
        return m;
    Kv__ClusterMap *pb = NULL;
    FZ_CHECK(cmap_to_pb(m, &pb) == KV_OK, "cmap_to_pb");
    cmap_unref(m);
    Kv__NodeInfo joining = KV__NODE_INFO__INIT, *nodes[4];
    joining.id = "n4";
    joining.addr = "tcp://127.0.0.1:4";
    joining.state = KV__NODE_STATE__JOINING;
    memcpy(nodes, pb->nodes, 3 * sizeof(*nodes));
    nodes[3] = &joining;
    Kv__Range r = KV__RANGE__INIT, *rp = &r;
    Kv__StreamPlan sp = KV__STREAM_PLAN__INIT, *spp = &sp;
    sp.id = "s1";
    sp.source = "n1";
    sp.target = "n4";
    sp.n_ranges = 1;
    sp.ranges = &rp;
    Kv__Transition tr = KV__TRANSITION__INIT;
    tr.kind = "add";
    tr.n_streams = 1;
    tr.streams = &spp;
    Kv__ClusterMap view = *pb;
    view.epoch = 2;
    view.nodes = nodes;
    view.n_nodes = 4;
    view.transition = &tr;
    FZ_CHECK(cmap_from_pb(&view, &m, err, sizeof(err)) == KV_OK, "transition map: %s", err);
    kv__cluster_map__free_unpacked(pb, NULL);
    return m;
}

/* Field f of m: the value's address and how many values (repeated). */
static const void *field_at(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f,
                            size_t *count)
{
    const char *base = (const char *)m;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
        *count = *(const size_t *)(base + f->quantifier_offset);
        return *(void *const *)(base + f->offset);
    }
    *count = 1;
    return base + f->offset;
}

bool fz_pb_strings_ok(const ProtobufCMessage *m)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        size_t n;
        const void *v = field_at(m, f, &n);
        for (size_t k = 0; k < n; k++) {
            if (f->type == PROTOBUF_C_TYPE_STRING && !fz_utf8_str_ok(((char *const *)v)[k]))
                return false;
            const ProtobufCMessage *sub =
                f->type == PROTOBUF_C_TYPE_MESSAGE ? ((ProtobufCMessage *const *)v)[k] : NULL;
            if (sub && !fz_pb_strings_ok(sub))
                return false;
        }
    }
    return true;
}

void fz_check_reply(const rpc_ctx *c, kv_err rv, bool node, bool relayed)
{
    FZ_CHECK((int)rv >= 0 && rv < KV_ERR_COUNT_, "%s returned status %d", c->method, (int)rv);
    FZ_CHECK(memchr(c->message, 0, sizeof(c->message)), "%s: status message not terminated",
             c->method);
    if (fz_strict())
        FZ_CHECK(fz_utf8_str_ok(c->message), "%s: status message is not UTF-8: %s", c->method,
                 c->message);
    const ProtobufCMessageDescriptor *d = fz_reply_desc(c->method);
    if (rv == KV_OK && d && !relayed) {
        ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, c->reply_len, c->reply);
        FZ_CHECK(m, "%s: the OK reply does not parse as %s", c->method, d->name);
        if (fz_strict())
            FZ_CHECK(fz_pb_strings_ok(m), "%s: a string of the reply is not UTF-8", c->method);
        protobuf_c_message_free_unpacked(m, NULL);
    }
    if (node && rv == KV_FAILED_PRECONDITION && c->reply_len) {
        cmap *m = NULL;
        char err[256];
        FZ_CHECK(cmap_decode(c->reply, c->reply_len, &m, err, sizeof(err)) == KV_OK,
                 "%s: FAILED_PRECONDITION body is not a map: %s", c->method, err);
        cmap_unref(m);
    }
}

/* The epoch a call claims: none, the callee's, one ahead, one behind, any. */
static uint64_t pick_epoch(const fz_calls *t, uint8_t sel)
{
    uint64_t cur = t->epoch(t->user);
    switch (sel % 5) {
    case 0:
        return 0;
    case 1:
        return cur;
    case 2:
        return cur + 1;
    case 3:
        return cur > 1 ? cur - 1 : 1;
    default:
        return (uint64_t)sel << 8;
    }
}

void fz_run_calls(const fz_calls *t, fz_in *in, int max_calls)
{
    for (int i = 0; i < max_calls && in->n > 0; i++) {
        const rpc_method *m = &t->methods[fz_u8(in) % t->n];
        uint8_t sel = fz_u8(in);
        size_t len;
        const uint8_t *body = fz_chunk(in, &len);
        /* a copy of exactly len bytes, so ASan sees reads past the body */
        uint8_t *copy = malloc(len ? len : 1);
        FZ_CHECK(copy, "out of memory");
        memcpy(copy, body, len);
        /* the caller's rights from the selector: a client (data token), an
         * admin peer (a router: versions, internal methods), auth off */
        rpc_ctx c = {.method = m->name,
                     .admin = (sel & 0x60) != 0,
                     .anonymous = (sel & 0x60) == 0x60,
                     .map_epoch = pick_epoch(t, sel),
                     .deadline_ns =
                         kv_now_ns() + (t->deadline_ms ? t->deadline_ms : 2000) * 1000000ull,
                     .user = t->user};
        /* split handlers as rpc_server.c runs them; both forms when a
         * method has both (the split one for coordinate calls); every
         * other plain call of a method with a try_inline form tries that
         * first, and a declined one runs the handler with a fresh ctx */
        kv_err rv;
        if (m->start && (!m->fn || (sel & 0x80))) {
            void *state = NULL;
            c.coordinate = m->fn != NULL;
            rv = m->start(&c, copy, len, &state);
            if (rv == KV_OK && state)
                rv = m->finish(&c, state);
        } else if (m->try_inline && (i & 1)) {
            rpc_ctx fresh = c;
            if (!m->try_inline(&c, copy, len, &rv)) {
                FZ_CHECK(!c.reply, "%s: a declined inline call left a reply", m->name);
                c = fresh;
                rv = m->fn(&c, copy, len);
            }
        } else {
            rv = m->fn(&c, copy, len);
        }
        fz_check_reply(&c, rv, t->node, t->relayed);
        free(c.reply);
        free(copy);
        if (t->after)
            t->after(t->user, i);
    }
}

/* ---- scripted peers ---- */

#define MAX_REPLIES 8

typedef struct script_reply {
    uint8_t status, flags;
    uint8_t *body;
    size_t len;
} script_reply;

static pthread_mutex_t script_mu = PTHREAD_MUTEX_INITIALIZER;
static script_reply script[MAX_REPLIES];
static size_t nscript;
static unsigned served[FZ_PEERS];

void fz_peers_script(fz_in *in)
{
    pthread_mutex_lock(&script_mu);
    for (size_t i = 0; i < nscript; i++)
        free(script[i].body);
    nscript = fz_u8(in) % (MAX_REPLIES + 1);
    for (size_t i = 0; i < nscript; i++) {
        script[i].status = fz_u8(in);
        script[i].flags = fz_u8(in);
        size_t len;
        const uint8_t *p = fz_chunk(in, &len);
        script[i].body = malloc(len ? len : 1);
        FZ_CHECK(script[i].body, "out of memory");
        memcpy(script[i].body, p, len);
        script[i].len = len;
    }
    memset(served, 0, sizeof(served));
    pthread_mutex_unlock(&script_mu);
}

/* The reply to one request of peer i, NULL for none. */
static nng_msg *fz_peer_reply(int i, const Kv__Envelope *req)
{
    pthread_mutex_lock(&script_mu);
    nng_msg *m = NULL;
    /* no script: the peer is down (a fast UNAVAILABLE: a caller waiting out
     * its deadline would make each input take seconds) */
    const script_reply down = {.status = KV_UNAVAILABLE};
    const script_reply *r = nscript ? &script[served[i]++ % nscript] : &down;
    Kv__Envelope env = KV__ENVELOPE__INIT;
    Kv__Status st = KV__STATUS__INIT;
    env.id = req->id + (r->flags & 1);
    st.code = r->status % 20;
    st.message = "scripted";
    env.status = &st;
    env.map_epoch = req->map_epoch;
    env.body.data = r->body;
    env.body.len = r->len;
    if (r->flags & 2)
        nng_msg_alloc(&m, 0); /* an empty message */
    else if (r->flags & 4 && nng_msg_alloc(&m, r->len) == 0)
        memcpy(nng_msg_body(m), r->body, r->len);
    else if (!(r->flags & 4) && nng_msg_alloc(&m, kv__envelope__get_packed_size(&env)) == 0)
        kv__envelope__pack(&env, nng_msg_body(m));
    pthread_mutex_unlock(&script_mu);
    return m;
}

static nng_socket peer_sock[FZ_PEERS];

static void *peer_main(void *arg)
{
    int i = (int)(intptr_t)arg;
    nng_socket s = peer_sock[i];
    for (;;) {
        nng_msg *req;
        if (nng_recvmsg(s, &req, 0) != 0)
            continue;
        Kv__Envelope *env = kv__envelope__unpack(NULL, nng_msg_len(req), nng_msg_body(req));
        nng_msg_free(req);
        nng_msg *rep = env ? fz_peer_reply(i, env) : NULL;
        if (env)
            kv__envelope__free_unpacked(env, NULL);
        if (rep && nng_sendmsg(s, rep, 0) != 0)
            nng_msg_free(rep);
    }
    return NULL;
}

/* Each peer listens on inproc (channels on nng's sockets) and on an
 * ephemeral loopback port (channels on streams), before any dial. */
void fz_peers_start(void)
{
    for (int i = 0; i < FZ_PEERS; i++) {
        char url[64];
        snprintf(url, sizeof(url), "inproc://hotkv-fuzz-peer-%d", i + 1);
        nng_socket s;
        nng_listener l;
        FZ_CHECK(nng_rep0_open(&s) == 0 && nng_listen(s, url, NULL, 0) == 0, "peer %s", url);
        FZ_CHECK(nng_listen(s, "tcp://127.0.0.1:0", &l, 0) == 0 &&
                     nng_listener_get_int(l, NNG_OPT_TCP_BOUND_PORT, &peer_port[i]) == 0,
                 "peer %d on loopback", i + 1);
        peer_sock[i] = s;
    }
    for (int i = 0; i < FZ_PEERS; i++) {
        pthread_t t;
        FZ_CHECK(pthread_create(&t, NULL, peer_main, (void *)(intptr_t)i) == 0, "peer thread");
        pthread_detach(t);
    }
}
