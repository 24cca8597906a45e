/* SPDX-License-Identifier: MIT */
/*
 * nng_echo: the floor of the request path (issue 15). A bare nng REQ/REP
 * echo on loopback, with no envelope, no handler and no hotkv code: what
 * one round trip costs nng itself, with its own threads. The server keeps
 * `contexts` REP contexts receiving and echoes each request from the
 * receive's completion (nng's thread), or with -w hands it to one worker
 * thread first (a condition-variable hand-off, as a server with a worker
 * pool does), to show what one hand-off adds. The client keeps `inflight`
 * REQ contexts busy, each resending from its send/receive completions, and
 * prints a JSON line: ops/s and the p50 and p99 of the round trips.
 *
 * With -S a side skips nng's REQ/REP protocol layers and speaks their wire
 * format itself on nng's byte streams (nng_stream: the same TCP or TLS
 * connections and threads the protocol runs on): the SP handshake, then
 * each message as an 8-byte big-endian length, the 4-byte request id and
 * the body. The server reads whatever has arrived and echoes every complete
 * message in it with one write; the client pipelines `inflight` messages on
 * one connection. Either side works with the other's plain nng socket.
 * What is left is the cost of nng's poller and one task hand-off per read
 * or write, without the hand-offs between the protocol's layers.
 *
 * With -E a side runs the same wire format on plain sockets and an epoll
 * loop of its own, nng out of the way: one thread waits in epoll_wait,
 * reads what a socket has and handles every message in it right there, and
 * a reply is written by the thread that makes it (EPOLLOUT only when the
 * socket is full). This is the shape of redis-server's loop: what a read
 * costs without nng's poller handing it to a task thread. Plain tcp://
 * with a numeric IPv4 address only.
 *
 *   nng_echo server URL [-w] [-S|-E] [-c CONTEXTS]
 *   nng_echo client URL [-S|-E] [-n INFLIGHT] [-s SECONDS] [-d BYTES]
 *   nng_echo both URL ...   (server and client in one process)
 */
#define _GNU_SOURCE /* accept4 */
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_US 100000 /* latency histogram: 1 us buckets up to 100 ms */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static _Noreturn void die(const char *what, int rv)
{
    fprintf(stderr, "nng_echo: %s: %s\n", what, nng_strerror(rv));
    exit(1);
}

/* ---- server ------------------------------------------------------------ */

typedef struct srv_ctx {
    nng_ctx ctx;
    nng_aio *aio;
    bool sending;
    struct srv_ctx *next; /* in the worker's queue (-w) */
} srv_ctx;

/* The -w worker's queue: one mutex, one condition variable. */
static pthread_mutex_t wq_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wq_cv = PTHREAD_COND_INITIALIZER;
static srv_ctx *wq_head, *wq_tail;
static bool use_worker;

static void srv_send(srv_ctx *k)
{
    k->sending = true;
    nng_ctx_send(k->ctx, k->aio); /* the request message goes back as the reply */
}

static void srv_cb(void *arg)
{
    srv_ctx *k = arg;
    int rv = nng_aio_result(k->aio);
    if (k->sending || rv != 0) {
        if (k->sending && rv != 0)
            nng_msg_free(nng_aio_get_msg(k->aio));
        k->sending = false;
        if (rv != NNG_ECLOSED)
            nng_ctx_recv(k->ctx, k->aio);
        return;
    }
    if (!use_worker) {
        srv_send(k);
        return;
    }
    pthread_mutex_lock(&wq_mu);
    k->next = NULL;
    if (wq_tail)
        wq_tail->next = k;
    else
        wq_head = k;
    wq_tail = k;
    pthread_cond_signal(&wq_cv);
    pthread_mutex_unlock(&wq_mu);
}

static void *worker_main(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&wq_mu);
        while (!wq_head)
            pthread_cond_wait(&wq_cv, &wq_mu);
        srv_ctx *k = wq_head;
        wq_head = k->next;
        if (!wq_head)
            wq_tail = NULL;
        pthread_mutex_unlock(&wq_mu);
        srv_send(k);
    }
    return NULL;
}

static void server_start(const char *url, int contexts)
{
    nng_socket s;
    int rv;
    if ((rv = nng_rep0_open(&s)) != 0)
        die("nng_rep0_open", rv);
    if ((rv = nng_listen(s, url, NULL, 0)) != 0)
        die("nng_listen", rv);
    if (use_worker) {
        pthread_t t;
        pthread_create(&t, NULL, worker_main, NULL);
        pthread_detach(t);
    }
    srv_ctx *ks = calloc((size_t)contexts, sizeof(*ks));
    for (int i = 0; i < contexts; i++) {
        if ((rv = nng_ctx_open(&ks[i].ctx, s)) != 0 ||
            (rv = nng_aio_alloc(&ks[i].aio, srv_cb, &ks[i])) != 0)
            die("server context", rv);
        nng_ctx_recv(ks[i].ctx, ks[i].aio);
    }
}

/* ---- byte streams (-S) ------------------------------------------------- */

#define SBUF (256u * 1024u) /* read buffer per connection */

/* One connection's two directions. The read callback and the write
 * callback can run at once on different nng task threads; mu guards the
 * outgoing bytes and whether a write is in flight. */
typedef struct sconn {
    nng_stream *s; /* NULL with -E: fd on the epoll loop */
    int fd;
    bool wblocked; /* -E: the socket was full; EPOLLOUT finishes the write */
    nng_aio *rd, *wr;
    uint8_t *in;
    size_t inlen;
    pthread_mutex_t mu;
    uint8_t *out, *wbuf; /* appended to / being written */
    size_t outlen, outcap, wlen, woff;
    bool writing;
    bool client;
    bool shaken;  /* the peer's 8-byte SP handshake was read */
    uint64_t *t0; /* the client's send times, in order (a ring of tcap) */
    size_t tcap, thead, tn;
    uint32_t next_id;
} sconn;

static int ep_fd = -1; /* -E: the loop's epoll */
static void ep_flush_locked(sconn *c);

static void sc_write_locked(sconn *c)
{
    if (c->writing || !c->outlen)
        return;
    uint8_t *t = c->wbuf;
    c->wbuf = c->out;
    c->wlen = c->outlen;
    c->woff = 0;
    c->out = t;
    c->outlen = 0;
    c->writing = true;
    if (!c->s) {
        ep_flush_locked(c);
        return;
    }
    nng_iov iov = {c->wbuf, c->wlen};
    nng_aio_set_iov(c->wr, 1, &iov);
    nng_stream_send(c->s, c->wr);
}

static void sc_append_locked(sconn *c, const uint8_t *frame, size_t n)
{
    if (c->outlen + n > c->outcap) {
        size_t cap = c->outcap * 2 > c->outlen + n ? c->outcap * 2 : c->outlen + n;
        uint8_t *o = realloc(c->out, cap);
        uint8_t *w = realloc(c->wbuf, cap);
        if (!o || !w)
            abort();
        c->out = o;
        c->wbuf = w;
        c->outcap = cap;
    }
    memcpy(c->out + c->outlen, frame, n);
    c->outlen += n;
}

static void cli_frame_locked(sconn *c);

static void sc_read(sconn *c)
{
    nng_iov iov = {c->in + c->inlen, SBUF - c->inlen};
    nng_aio_set_iov(c->rd, 1, &iov);
    nng_stream_recv(c->s, c->rd);
}

/* n more bytes are in c->in: handle every complete message. */
static void sc_got(sconn *c, size_t n)
{
    c->inlen += n;
    size_t off = 0;
    if (!c->shaken && c->inlen >= 8) {
        if (memcmp(c->in, "\0SP\0", 4) != 0 || c->in[4] != 0 ||
            c->in[5] != (c->client ? 0x31 : 0x30))
            die("SP handshake", NNG_EPROTO);
        c->shaken = true;
        off = 8;
    }
    pthread_mutex_lock(&c->mu);
    while (c->shaken && c->inlen - off >= 8) {
        uint64_t len = 0;
        for (int i = 0; i < 8; i++)
            len = len << 8 | c->in[off + (size_t)i];
        if (len > SBUF - 8)
            abort();
        if (c->inlen - off < 8 + (size_t)len)
            break;
        if (c->client)
            cli_frame_locked(c);
        else /* the request's id and body, as they came, are the reply */
            sc_append_locked(c, c->in + off, 8 + (size_t)len);
        off += 8 + (size_t)len;
    }
    sc_write_locked(c);
    pthread_mutex_unlock(&c->mu);
    memmove(c->in, c->in + off, c->inlen - off);
    c->inlen -= off;
}

static void sc_rd_cb(void *arg)
{
    sconn *c = arg;
    if (nng_aio_result(c->rd) != 0)
        return; /* closed: the benchmark ends with the process */
    sc_got(c, nng_aio_count(c->rd));
    sc_read(c);
}

static void sc_wr_cb(void *arg)
{
    sconn *c = arg;
    if (nng_aio_result(c->wr) != 0)
        return;
    pthread_mutex_lock(&c->mu);
    c->woff += nng_aio_count(c->wr);
    if (c->woff < c->wlen) {
        nng_iov iov = {c->wbuf + c->woff, c->wlen - c->woff};
        nng_aio_set_iov(c->wr, 1, &iov);
        nng_stream_send(c->s, c->wr);
    } else {
        c->writing = false;
        sc_write_locked(c);
    }
    pthread_mutex_unlock(&c->mu);
}

static sconn *sc_new(nng_stream *s, int fd, bool client, size_t inflight)
{
    sconn *c = calloc(1, sizeof(*c));
    if (!c || !(c->in = malloc(SBUF)))
        abort();
    c->s = s;
    c->fd = fd;
    c->client = client;
    pthread_mutex_init(&c->mu, NULL);
    c->outcap = 64u * 1024u;
    c->out = malloc(c->outcap);
    c->wbuf = malloc(c->outcap);
    c->tcap = inflight ? inflight : 1;
    c->t0 = calloc(c->tcap, sizeof(*c->t0));
    if ((s &&
         (nng_aio_alloc(&c->rd, sc_rd_cb, c) != 0 || nng_aio_alloc(&c->wr, sc_wr_cb, c) != 0)) ||
        !c->out || !c->wbuf || !c->t0)
        abort();
    if (!s) { /* on the loop before the handshake goes: its reply may come at once */
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(ep_fd, EPOLL_CTL_ADD, fd, &ev) != 0)
            abort();
    }
    /* SP handshake: "\0SP\0", our protocol (REQ 0x30, REP 0x31), 2 zero bytes */
    uint8_t hs[8] = {0, 'S', 'P', 0, 0, client ? 0x30 : 0x31, 0, 0};
    pthread_mutex_lock(&c->mu);
    sc_append_locked(c, hs, sizeof(hs));
    sc_write_locked(c);
    pthread_mutex_unlock(&c->mu);
    return c;
}

static nng_stream_listener *s_lis;
static nng_aio *s_acc;

static void s_accept_cb(void *arg)
{
    (void)arg;
    if (nng_aio_result(s_acc) != 0)
        return;
    sconn *c = sc_new(nng_aio_get_output(s_acc, 0), -1, false, 0);
    sc_read(c);
    nng_stream_listener_accept(s_lis, s_acc);
}

static void stream_server_start(const char *url)
{
    int rv;
    if ((rv = nng_stream_listener_alloc(&s_lis, url)) != 0 ||
        (rv = nng_stream_listener_listen(s_lis)) != 0 ||
        (rv = nng_aio_alloc(&s_acc, s_accept_cb, NULL)) != 0)
        die("stream listener", rv);
    nng_stream_listener_accept(s_lis, s_acc);
}

/* ---- an epoll loop of our own (-E) -------------------------------------- */

/* Writes what is taken for writing (mu held; c->writing). On a full socket
 * the rest waits for EPOLLOUT, which the loop turns into another call. */
static void ep_flush_locked(sconn *c)
{
    while (c->writing) {
        while (c->woff < c->wlen) {
            ssize_t w = send(c->fd, c->wbuf + c->woff, c->wlen - c->woff, MSG_NOSIGNAL);
            if (w < 0 && errno == EINTR)
                continue;
            if (w < 0 && errno == EAGAIN) {
                if (!c->wblocked) {
                    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
                    epoll_ctl(ep_fd, EPOLL_CTL_MOD, c->fd, &ev);
                    c->wblocked = true;
                }
                return;
            }
            if (w <= 0)
                return; /* closed: the benchmark ends with the process */
            c->woff += (size_t)w;
        }
        c->writing = false;
        sc_write_locked(c); /* what was appended meanwhile, if anything */
        if (!c->writing)
            break;
    }
    if (c->wblocked) {
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        epoll_ctl(ep_fd, EPOLL_CTL_MOD, c->fd, &ev);
        c->wblocked = false;
    }
}

static int ep_lfd = -1; /* the server's listening socket (data.ptr NULL) */

static void *ep_loop(void *arg)
{
    (void)arg;
    struct epoll_event evs[64];
    for (;;) {
        int n = epoll_wait(ep_fd, evs, 64, -1);
        for (int i = 0; i < n; i++) {
            sconn *c = evs[i].data.ptr;
            if (!c) { /* a connection to accept */
                int fd = accept4(ep_lfd, NULL, NULL, SOCK_NONBLOCK);
                int one = 1;
                if (fd >= 0 && setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0)
                    sc_new(NULL, fd, false, 0);
                continue;
            }
            if (evs[i].events & EPOLLOUT) {
                pthread_mutex_lock(&c->mu);
                ep_flush_locked(c);
                pthread_mutex_unlock(&c->mu);
            }
            if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                ssize_t r = recv(c->fd, c->in + c->inlen, SBUF - c->inlen, 0);
                if (r > 0)
                    sc_got(c, (size_t)r);
                else if (r == 0 || (errno != EAGAIN && errno != EINTR))
                    epoll_ctl(ep_fd, EPOLL_CTL_DEL, c->fd, NULL); /* closed */
            }
        }
    }
    return NULL;
}

/* tcp://A.B.C.D:PORT into sa. */
static void ep_addr(const char *url, struct sockaddr_in *sa)
{
    char host[64];
    int port;
    if (sscanf(url, "tcp://%63[0-9.]:%d", host, &port) != 2 ||
        inet_pton(AF_INET, host, &sa->sin_addr) != 1)
        die("-E takes tcp://A.B.C.D:PORT", NNG_EADDRINVAL);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
}

static void ep_start(void)
{
    if (ep_fd >= 0)
        return;
    ep_fd = epoll_create1(0);
    pthread_t t;
    if (ep_fd < 0 || pthread_create(&t, NULL, ep_loop, NULL) != 0)
        die("epoll loop", NNG_ENOMEM);
}

static void ep_server_start(const char *url)
{
    struct sockaddr_in sa = {0};
    ep_addr(url, &sa);
    ep_start();
    int one = 1;
    ep_lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (ep_lfd < 0 || setsockopt(ep_lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(ep_lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(ep_lfd, 128) != 0 ||
        epoll_ctl(ep_fd, EPOLL_CTL_ADD, ep_lfd, &ev) != 0)
        die("listen (-E)", NNG_EADDRINUSE);
}

/* ---- client ------------------------------------------------------------ */

typedef struct cli_ctx {
    nng_ctx ctx;
    nng_aio *aio;
    bool sending;
    uint64_t t0;
} cli_ctx;

static atomic_bool cli_stop;
static _Atomic uint64_t cli_done, cli_err;
static _Atomic uint32_t hist[MAX_US + 1];
static size_t payload = 100;

static void cli_send(cli_ctx *k)
{
    nng_msg *m;
    if (nng_msg_alloc(&m, payload) != 0)
        abort();
    memset(nng_msg_body(m), 'x', payload);
    k->sending = true;
    k->t0 = now_ns();
    nng_aio_set_msg(k->aio, m);
    nng_ctx_send(k->ctx, k->aio);
}

static void cli_cb(void *arg)
{
    cli_ctx *k = arg;
    int rv = nng_aio_result(k->aio);
    if (rv != 0) {
        if (k->sending)
            nng_msg_free(nng_aio_get_msg(k->aio));
        atomic_fetch_add(&cli_err, 1);
        if (rv == NNG_ECLOSED || rv == NNG_ECANCELED || atomic_load(&cli_stop))
            return;
        cli_send(k);
        return;
    }
    if (k->sending) {
        k->sending = false;
        nng_ctx_recv(k->ctx, k->aio);
        return;
    }
    uint64_t us = (now_ns() - k->t0) / 1000u;
    atomic_fetch_add_explicit(&hist[us > MAX_US ? MAX_US : us], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&cli_done, 1, memory_order_relaxed);
    nng_msg_free(nng_aio_get_msg(k->aio));
    if (!atomic_load(&cli_stop))
        cli_send(k);
}

/* A request: its length, its id with the high bit set, payload bytes. */
static size_t frame_make(uint8_t *frame, uint32_t id)
{
    uint64_t len = 4 + payload;
    for (int i = 0; i < 8; i++)
        frame[i] = (uint8_t)(len >> (56 - 8 * i));
    id |= 0x80000000u;
    for (int i = 0; i < 4; i++)
        frame[8 + i] = (uint8_t)(id >> (24 - 8 * i));
    memset(frame + 12, 'x', payload);
    return 12 + payload;
}

/* A reply arrived (mu held): the oldest message's round trip ends, and the
 * next message goes out behind the others. */
static void cli_frame_locked(sconn *c)
{
    uint64_t now = now_ns(), us = (now - c->t0[c->thead]) / 1000u;
    c->thead = (c->thead + 1) % c->tcap;
    c->tn--;
    atomic_fetch_add_explicit(&hist[us > MAX_US ? MAX_US : us], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&cli_done, 1, memory_order_relaxed);
    if (atomic_load(&cli_stop))
        return;
    uint8_t frame[12 + 65536];
    size_t n = frame_make(frame, c->next_id++);
    c->t0[(c->thead + c->tn++) % c->tcap] = now_ns();
    sc_append_locked(c, frame, n);
}

static bool use_epoll;

static void stream_client_start(const char *url, int inflight)
{
    sconn *c;
    if (use_epoll) {
        struct sockaddr_in sa = {0};
        ep_addr(url, &sa);
        ep_start();
        int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0 ||
            fcntl(fd, F_SETFL, O_NONBLOCK) != 0)
            die("connect (-E)", NNG_ECONNREFUSED);
        c = sc_new(NULL, fd, true, (size_t)inflight);
    } else {
        nng_stream_dialer *d;
        nng_aio *aio = NULL;
        int rv;
        if ((rv = nng_stream_dialer_alloc(&d, url)) != 0 ||
            (rv = nng_aio_alloc(&aio, NULL, NULL)) != 0)
            die("stream dialer", rv);
        nng_stream_dialer_dial(d, aio);
        nng_aio_wait(aio);
        if ((rv = nng_aio_result(aio)) != 0)
            die("stream dial", rv);
        c = sc_new(nng_aio_get_output(aio, 0), -1, true, (size_t)inflight);
    }
    uint8_t frame[12 + 65536];
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < inflight; i++) {
        c->t0[c->tn++] = now_ns();
        sc_append_locked(c, frame, frame_make(frame, c->next_id++));
    }
    sc_write_locked(c);
    pthread_mutex_unlock(&c->mu);
    if (c->s)
        sc_read(c);
}

static unsigned hist_pct(uint64_t total, double pct)
{
    uint64_t want = (uint64_t)((double)total * pct), seen = 0;
    for (unsigned i = 0; i <= MAX_US; i++)
        if ((seen += atomic_load(&hist[i])) > want)
            return i;
    return MAX_US;
}

static void req_client_start(const char *url, int inflight)
{
    nng_socket s;
    int rv;
    if ((rv = nng_req0_open(&s)) != 0)
        die("nng_req0_open", rv);
    nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    if ((rv = nng_dial(s, url, NULL, 0)) != 0)
        die("nng_dial", rv);
    cli_ctx *ks = calloc((size_t)inflight, sizeof(*ks));
    for (int i = 0; i < inflight; i++)
        if ((rv = nng_ctx_open(&ks[i].ctx, s)) != 0 ||
            (rv = nng_aio_alloc(&ks[i].aio, cli_cb, &ks[i])) != 0)
            die("client context", rv);
    for (int i = 0; i < inflight; i++)
        cli_send(&ks[i]);
}

static bool use_stream;

static void client_run(const char *url, int inflight, double seconds, bool worker)
{
    if (use_stream)
        stream_client_start(url, inflight);
    else
        req_client_start(url, inflight);
    nng_msleep(500); /* warm-up */
    memset((void *)hist, 0, sizeof(hist));
    uint64_t d0 = atomic_load(&cli_done), t0 = now_ns();
    nng_msleep((nng_duration)(seconds * 1000));
    uint64_t n = atomic_load(&cli_done) - d0, t1 = now_ns();
    atomic_store(&cli_stop, true);
    uint64_t total = 0;
    for (unsigned i = 0; i <= MAX_US; i++)
        total += atomic_load(&hist[i]);
    printf("{\"inflight\": %d, \"stream\": %s, \"epoll\": %s, \"worker_handoff\": %s, "
           "\"ops_per_s\": %.0f, "
           "\"p50_us\": %u, "
           "\"p99_us\": %u, \"errors\": %llu}\n",
           inflight, use_stream ? "true" : "false", use_epoll ? "true" : "false",
           worker ? "true" : "false", (double)n * 1e9 / (double)(t1 - t0), hist_pct(total, 0.5),
           hist_pct(total, 0.99), (unsigned long long)atomic_load(&cli_err));
    fflush(stdout);
    /* no teardown: stopping the contexts of a socket under load may wait in
     * nng 1.5 (rpc_util.c), and the process ends here anyway */
    _exit(0);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: nng_echo server|client|both URL [-w] [-S|-E] [-c CONTEXTS] "
                        "[-n INFLIGHT] [-s SECONDS] [-d BYTES]\n");
        return 2;
    }
    const char *mode = argv[1], *url = argv[2];
    int contexts = 64, inflight = 1, opt;
    double seconds = 5;
    optind = 3;
    while ((opt = getopt(argc, argv, "wSEc:n:s:d:")) != -1) {
        switch (opt) {
        case 'S':
            use_stream = true;
            break;
        case 'E':
            use_stream = use_epoll = true;
            break;
        case 'w':
            use_worker = true;
            break;
        case 'c':
            contexts = atoi(optarg);
            break;
        case 'n':
            inflight = atoi(optarg);
            break;
        case 's':
            seconds = atof(optarg);
            break;
        case 'd':
            payload = (size_t)atol(optarg);
            break;
        default:
            return 2;
        }
    }
    bool serve = strcmp(mode, "server") == 0 || strcmp(mode, "both") == 0;
    if (serve && use_epoll)
        ep_server_start(url);
    else if (serve && use_stream)
        stream_server_start(url);
    else if (serve)
        server_start(url, contexts);
    if (strcmp(mode, "server") == 0)
        for (;;)
            pause();
    nng_msleep(serve ? 100 : 0);
    client_run(url, inflight, seconds, use_worker);
    return 0;
}
