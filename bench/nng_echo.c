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
 *   nng_echo server URL [-w] [-c CONTEXTS]
 *   nng_echo client URL [-n INFLIGHT] [-s SECONDS] [-d BYTES]
 *   nng_echo both URL ...   (server and client in one process)
 */
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_US 100000 /* latency histogram: 1 us buckets up to 100 ms */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what, int rv)
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

static unsigned hist_pct(uint64_t total, double pct)
{
    uint64_t want = (uint64_t)((double)total * pct), seen = 0;
    for (unsigned i = 0; i <= MAX_US; i++)
        if ((seen += atomic_load(&hist[i])) > want)
            return i;
    return MAX_US;
}

static void client_run(const char *url, int inflight, double seconds, bool worker)
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
    nng_msleep(500); /* warm-up */
    memset((void *)hist, 0, sizeof(hist));
    uint64_t d0 = atomic_load(&cli_done), t0 = now_ns();
    nng_msleep((nng_duration)(seconds * 1000));
    uint64_t n = atomic_load(&cli_done) - d0, t1 = now_ns();
    atomic_store(&cli_stop, true);
    uint64_t total = 0;
    for (unsigned i = 0; i <= MAX_US; i++)
        total += atomic_load(&hist[i]);
    printf("{\"inflight\": %d, \"worker_handoff\": %s, \"ops_per_s\": %.0f, \"p50_us\": %u, "
           "\"p99_us\": %u, \"errors\": %llu}\n",
           inflight, worker ? "true" : "false", (double)n * 1e9 / (double)(t1 - t0),
           hist_pct(total, 0.5), hist_pct(total, 0.99), (unsigned long long)atomic_load(&cli_err));
    fflush(stdout);
    /* no teardown: stopping the contexts of a socket under load may wait in
     * nng 1.5 (rpc_util.c), and the process ends here anyway */
    _exit(0);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: nng_echo server|client|both URL [-w] [-c CONTEXTS] "
                        "[-n INFLIGHT] [-s SECONDS] [-d BYTES]\n");
        return 2;
    }
    const char *mode = argv[1], *url = argv[2];
    int contexts = 64, inflight = 1, opt;
    double seconds = 5;
    optind = 3;
    while ((opt = getopt(argc, argv, "wc:n:s:d:")) != -1) {
        switch (opt) {
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
    if (serve)
        server_start(url, contexts);
    if (strcmp(mode, "server") == 0)
        for (;;)
            pause();
    nng_msleep(serve ? 100 : 0);
    client_run(url, inflight, seconds, use_worker);
    return 0;
}
