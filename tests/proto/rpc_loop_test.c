/* SPDX-License-Identifier: MIT */
/* hotkv's own event loops (proto/rpc_loop.c): a connect to a listening
 * loopback socket ends with a connected socket, one to a closed port with
 * ECONNREFUSED, each exactly once on a loop thread; a connect cancelled
 * at once never reports after its cancel returned, whichever side wins;
 * listen refuses malformed URLs with a message and reports its port, and
 * only numeric addresses are the loops' to connect. ASan and TSan builds
 * run this file too. */
#include "tests/kv_testfw.h"
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "proto/rpc.h"
#include "proto/rpc_conn.h"
#include "proto/rpc_loop.h"

typedef struct result {
    pthread_mutex_t mu;
    rpc_dial *d; /* the owner's reference while not given up (as rpc_chan) */
    atomic_int calls;
    atomic_int fd, err;
    atomic_bool after_cancel; /* done ran once the cancel had returned */
    atomic_bool cancelled;
} result;

static void done(void *arg, rpc_dial *d, int fd, int err)
{
    result *r = arg;
    if (atomic_load(&r->cancelled))
        atomic_store(&r->after_cancel, true);
    atomic_store(&r->fd, fd);
    atomic_store(&r->err, err);
    pthread_mutex_lock(&r->mu);
    bool mine = r->d == d; /* else a cancel took the reference */
    if (mine)
        r->d = NULL;
    pthread_mutex_unlock(&r->mu);
    if (mine)
        rpc_loop_dial_release(d);
    atomic_fetch_add(&r->calls, 1); /* last: a waiter may drop r once it sees this */
}

/* Starts a connect holding r->mu, so done finds r->d set. */
static int start(result *r, struct sockaddr_in *sa)
{
    pthread_mutex_lock(&r->mu);
    int rv = rpc_loop_connect((struct sockaddr *)sa, sizeof(*sa), -1, done, r, &r->d);
    pthread_mutex_unlock(&r->mu);
    return rv;
}

static int listen_port(int *port)
{
    char err[256];
    int fd = rpc_loop_listen("tcp://127.0.0.1:0", port, err, sizeof(err));
    cr_assert_geq(fd, 0, "%s", err);
    cr_assert_gt(*port, 0);
    return fd;
}

static struct sockaddr_in loopback(int port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return sa;
}

static void wait_calls(result *r)
{
    for (int i = 0; i < 2000 && atomic_load(&r->calls) == 0; i++)
        nng_msleep(1);
}

Test(rpc_loop, connect_succeeds_or_is_refused_once)
{
    int port;
    int lfd = listen_port(&port);
    struct sockaddr_in sa = loopback(port);
    result ok = {.mu = PTHREAD_MUTEX_INITIALIZER};
    cr_assert_eq(start(&ok, &sa), 0);
    wait_calls(&ok);
    cr_assert_eq(atomic_load(&ok.calls), 1);
    cr_assert_geq(atomic_load(&ok.fd), 0, "err %d", atomic_load(&ok.err));
    close(atomic_load(&ok.fd));
    close(lfd); /* the port is closed now: the next connect is refused */
    result no = {.mu = PTHREAD_MUTEX_INITIALIZER};
    int rv = start(&no, &sa);
    if (rv == 0) {
        wait_calls(&no);
        cr_assert_eq(atomic_load(&no.calls), 1);
        cr_assert_eq(atomic_load(&no.fd), -1);
        cr_assert_eq(atomic_load(&no.err), ECONNREFUSED);
    } else {
        cr_assert_eq(rv, ECONNREFUSED, "refused at once: %d", rv);
    }
    nng_msleep(20);
    cr_assert_eq(atomic_load(&ok.calls), 1, "done ran once");
}

Test(rpc_loop, a_cancelled_connect_never_reports_after_the_cancel)
{
    int port;
    int lfd = listen_port(&port);
    struct sockaddr_in sa = loopback(port);
    enum { N = 300 };
    static result rs[N];
    int won = 0;
    for (int i = 0; i < N; i++) {
        result *r = &rs[i];
        pthread_mutex_init(&r->mu, NULL);
        cr_assert_eq(start(r, &sa), 0);
        if (i % 3)
            sched_yield(); /* let some connects complete first */
        pthread_mutex_lock(&r->mu);
        rpc_dial *d = r->d;
        r->d = NULL;
        pthread_mutex_unlock(&r->mu);
        if (d) { /* done has not taken it: cancel, whichever side wins */
            rpc_loop_connect_cancel(d);
            atomic_store(&r->cancelled, true);
            won += atomic_load(&r->calls) == 0;
        }
        int accepted; /* the backlog stays short (lfd is non-blocking) */
        while ((accepted = accept(lfd, NULL, NULL)) >= 0)
            close(accepted);
    }
    nng_msleep(100);
    for (int i = 0; i < N; i++) {
        cr_assert_not(atomic_load(&rs[i].after_cancel), "connect %d reported after its cancel", i);
        cr_assert_leq(atomic_load(&rs[i].calls), 1);
        if (atomic_load(&rs[i].fd) > 0)
            close(atomic_load(&rs[i].fd));
    }
    close(lfd);
    cr_log_info("%d of %d connects cancelled before their end", won, N);
}

Test(rpc_loop, listen_refuses_bad_urls_with_a_message)
{
    const char *bad[] = {"tcp://127.0.0.1", "tcp://127.0.0.1:x", "tcp://127.0.0.1:70000",
                         "tcp://[::1:5", "tcp://:99999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[256] = "";
        int port = 0;
        int fd = rpc_loop_listen(bad[i], &port, err, sizeof(err));
        cr_assert_eq(fd, -1, "%s", bad[i]);
        cr_assert(strstr(err, bad[i]) != NULL, "the message names the URL: %s", err);
    }
    struct sockaddr_storage ss;
    unsigned len;
    cr_assert(rpc_loop_addr("tcp://127.0.0.1:7000", &ss, &len));
    cr_assert(rpc_loop_addr("tcp://[::1]:7000", &ss, &len));
    cr_assert_not(rpc_loop_addr("tcp://localhost:7000", &ss, &len), "names go to nng");
    cr_assert_not(rpc_loop_addr("tls+tcp://127.0.0.1:7000", &ss, &len));
}

/* The loops run as threads named kv:loop, as many as rpc_loop_count says,
 * and rpc_loop_set_count once they run changes nothing (that it sets the
 * count before the first use is kvctl_test's: kvnode --loops 1 runs one;
 * here other tests of this process may have started the loops). */
Test(rpc_loop, the_count_holds_once_the_loops_run)
{
    int n = rpc_loop_count();
    cr_assert_gt(n, 0);
    rpc_loop_set_count(n == 1 ? 2 : 1);
    cr_assert_eq(rpc_loop_count(), n, "set once the loops run: no change");
    int named = (int)rpc_runtime_count_threads("kv:loop");
    cr_assert_eq(named, n, "%d kv:loop threads, %d loops", named, n);
    cr_assert_eq(rpc_loop_self(), -1, "the test's thread is no loop's");
}
