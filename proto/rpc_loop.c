/* SPDX-License-Identifier: MIT */
/*
 * rpc_loop: epoll loops of our own for tcp:// connections (rpc_loop.h).
 *
 * Each loop is one thread, one epoll set and one eventfd. The thread takes
 * up to 64 events at a time (a batch), calls each source's handler, and
 * then counts the batch under its mutex; rpc_loop_sync waits for that count
 * to move, waking the loop through the eventfd when it sleeps. A source
 * removed from another thread may still be named by an event of the batch
 * in progress: its owner waits for the batch's end before freeing it.
 */
#define _GNU_SOURCE
#include "proto/rpc_loop.h"

#include "common/clock.h"
#include "proto/rpc.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_LOOPS 8
#define BATCH 64

typedef struct deferred {
    void (*fn)(void *arg);
    void *arg;
    struct deferred *next;
} deferred;

typedef struct loop {
    int ep, evfd;
    pthread_t thread;
    deferred *later;    /* rpc_loop_defer's, run after the batch (loop thread only) */
    pthread_mutex_t mu; /* protects batches */
    pthread_cond_t cv;
    uint64_t batches; /* batches handled so far */
    bool waiters;     /* someone waits in rpc_loop_sync */
} loop;

static loop loops[MAX_LOOPS];
static int nloops;
static atomic_uint next_loop;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static _Thread_local int self = -1; /* the loop this thread runs, or -1 */
/* On a loop's thread: the time its current event (or message) began. */
static _Thread_local uint64_t now_cache;

static void *loop_main(void *arg)
{
    loop *l = arg;
    self = (int)(l - loops);
    struct epoll_event evs[BATCH];
    for (;;) {
        int n = epoll_wait(l->ep, evs, BATCH, -1);
        for (int i = 0; i < n; i++) {
            rpc_src *src = evs[i].data.ptr;
            if (!src) { /* the eventfd: someone waits for this batch's end */
                uint64_t v;
                (void)!read(l->evfd, &v, sizeof(v));
                continue;
            }
            now_cache = kv_now_ns();
            src->fn(src, evs[i].events);
        }
        while (l->later) { /* frees that had to wait for the batch's end */
            deferred *d = l->later;
            l->later = d->next;
            d->fn(d->arg);
            free(d);
        }
        pthread_mutex_lock(&l->mu);
        l->batches++;
        if (l->waiters) {
            l->waiters = false;
            pthread_cond_broadcast(&l->cv);
        }
        pthread_mutex_unlock(&l->mu);
    }
    return NULL;
}

static atomic_int wanted; /* rpc_loop_set_count's, 0 = one per CPU */

void rpc_loop_set_count(int n)
{
    atomic_store(&wanted, n < 0 ? 0 : n > MAX_LOOPS ? MAX_LOOPS : n);
}

static void loops_start(void)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int want = atomic_load(&wanted);
    if (!want)
        want = cpus < 1 ? 1 : cpus > MAX_LOOPS ? MAX_LOOPS : (int)cpus;
    for (int i = 0; i < want; i++) {
        loop *l = &loops[i];
        l->ep = epoll_create1(EPOLL_CLOEXEC);
        l->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
        if (l->ep < 0 || l->evfd < 0 || epoll_ctl(l->ep, EPOLL_CTL_ADD, l->evfd, &ev) != 0)
            break;
        pthread_mutex_init(&l->mu, NULL);
        pthread_cond_init(&l->cv, NULL);
        if (pthread_create(&l->thread, NULL, loop_main, l) != 0)
            break;
        pthread_setname_np(l->thread, "kv:loop"); /* named once rpc_loop_count returns */
        nloops = i + 1;
    }
}

void rpc_loop_tick(void)
{
    if (self >= 0)
        now_cache = kv_now_ns();
}

uint64_t rpc_now_ns(void)
{
    return self >= 0 ? now_cache : kv_now_ns();
}

uint64_t rpc_since_ns(uint64_t t0)
{
    uint64_t now = rpc_now_ns();
    return now > t0 ? now - t0 : 0;
}

int rpc_loop_count(void)
{
    pthread_once(&once, loops_start);
    return nloops;
}

int rpc_loop_self(void)
{
    return self;
}

int rpc_loop_add(rpc_src *src, bool out, int on)
{
    pthread_once(&once, loops_start);
    if (nloops == 0)
        return ENOMEM;
    src->loop =
        on >= 0 ? on % nloops
                : (int)(atomic_fetch_add_explicit(&next_loop, 1, memory_order_relaxed) % nloops);
    struct epoll_event ev = {.events = EPOLLIN | (out ? EPOLLOUT : 0), .data.ptr = src};
    return epoll_ctl(loops[src->loop].ep, EPOLL_CTL_ADD, src->fd, &ev) == 0 ? 0 : errno;
}

void rpc_loop_out(rpc_src *src, bool out)
{
    struct epoll_event ev = {.events = EPOLLIN | (out ? EPOLLOUT : 0), .data.ptr = src};
    (void)epoll_ctl(loops[src->loop].ep, EPOLL_CTL_MOD, src->fd, &ev);
}

void rpc_loop_del(rpc_src *src)
{
    (void)epoll_ctl(loops[src->loop].ep, EPOLL_CTL_DEL, src->fd, NULL);
}

bool rpc_loop_on_thread(const rpc_src *src)
{
    return self == src->loop;
}

void rpc_loop_sync(const rpc_src *src)
{
    if (rpc_loop_on_thread(src))
        return; /* the batch in progress is the caller's own */
    loop *l = &loops[src->loop];
    pthread_mutex_lock(&l->mu);
    uint64_t b0 = l->batches;
    uint64_t one = 1;
    (void)!write(l->evfd, &one, sizeof(one)); /* a sleeping loop runs a batch */
    while (l->batches == b0) {
        l->waiters = true;
        pthread_cond_wait(&l->cv, &l->mu);
    }
    pthread_mutex_unlock(&l->mu);
}

struct rpc_dial {
    rpc_src src;
    void (*done)(void *arg, rpc_dial *d, int fd, int err);
    void *arg;
    /* 0 pending; 1 taken by the loop (done runs); 2 cancelled. Each side
     * takes the dial with a CAS from 0. */
    atomic_int state;
    /* the loop's (while done may run) and the owner's (until
     * rpc_loop_dial_release or rpc_loop_connect_cancel): the last frees.
     * A cancelled dial is freed by its canceller once no event names it. */
    atomic_int refs;
};

static void dial_unref(rpc_dial *d)
{
    if (atomic_fetch_sub(&d->refs, 1) == 1)
        free(d);
}

static void dial_event(rpc_src *src, uint32_t events)
{
    (void)events;
    rpc_dial *d = (rpc_dial *)src;
    int expect = 0;
    if (!atomic_compare_exchange_strong(&d->state, &expect, 1))
        return; /* cancelled: the canceller frees d after this batch */
    rpc_loop_del(src);
    int err = 0, one = 1;
    socklen_t el = sizeof(err);
    if (getsockopt(src->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0)
        err = errno;
    if (!err)
        (void)setsockopt(src->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    else
        close(src->fd);
    d->done(d->arg, d, err ? -1 : src->fd, err);
    dial_unref(d); /* its own event was this one: no other names it */
}

int rpc_loop_connect(const struct sockaddr *addr, unsigned len, int on,
                     void (*done)(void *arg, rpc_dial *d, int fd, int err), void *arg,
                     rpc_dial **out)
{
    rpc_dial *d = calloc(1, sizeof(*d));
    if (!d)
        return ENOMEM;
    int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        free(d);
        return e;
    }
    if (connect(fd, addr, len) != 0 && errno != EINPROGRESS) {
        int e = errno;
        close(fd);
        free(d);
        return e;
    }
    d->src = (rpc_src){.fn = dial_event, .fd = fd};
    d->done = done;
    d->arg = arg;
    atomic_init(&d->refs, 2);
    *out = d; /* before the loop can see d: done may run at once */
    int e = rpc_loop_add(&d->src, true, on);
    if (e) {
        close(fd);
        free(d);
        return e;
    }
    return 0;
}

void rpc_loop_dial_release(rpc_dial *d)
{
    dial_unref(d);
}

static void dial_free(void *arg)
{
    free(arg);
}

void rpc_loop_connect_cancel(rpc_dial *d)
{
    int expect = 0;
    if (!atomic_compare_exchange_strong(&d->state, &expect, 2)) {
        rpc_loop_sync(&d->src); /* done is running or ran: let it finish */
        dial_unref(d);          /* the owner's reference */
        return;
    }
    rpc_loop_del(&d->src);
    close(d->src.fd);
    if (!rpc_loop_on_thread(&d->src)) {
        rpc_loop_sync(&d->src); /* an event taken before the removal is handled */
        free(d);
    } else if (!rpc_loop_defer(&d->src, dial_free, d)) {
        /* out of memory: keep d (an event of this batch may name it) */
    }
}

bool rpc_loop_wanted(void)
{
    const char *e = getenv("KV_RPC_NNG_STREAMS");
    return !(e && strcmp(e, "1") == 0);
}

bool rpc_loop_defer(const rpc_src *src, void (*fn)(void *arg), void *arg)
{
    deferred *d = malloc(sizeof(*d));
    if (!d || !rpc_loop_on_thread(src)) {
        free(d);
        return false;
    }
    loop *l = &loops[src->loop];
    *d = (deferred){fn, arg, l->later};
    l->later = d;
    return true;
}

/* tcp://HOST:PORT split into host (empty for none) and port. */
static bool split_url(const char *url, char *host, size_t cap, const char **port)
{
    if (strncmp(url, "tcp://", 6) != 0)
        return false;
    const char *hp = url + 6, *colon;
    if (*hp == '[') { /* [v6]:port */
        const char *end = strchr(hp, ']');
        if (!end || end[1] != ':' || (size_t)(end - hp - 1) >= cap)
            return false;
        memcpy(host, hp + 1, (size_t)(end - hp - 1));
        host[end - hp - 1] = 0;
        colon = end + 1;
    } else {
        colon = strrchr(hp, ':');
        if (!colon || (size_t)(colon - hp) >= cap)
            return false;
        memcpy(host, hp, (size_t)(colon - hp));
        host[colon - hp] = 0;
    }
    *port = colon + 1;
    char *pend = NULL;
    long pv = strtol(*port, &pend, 10);
    return **port && !*pend && pv >= 0 && pv <= 65535;
}

bool rpc_loop_addr(const char *url, struct sockaddr_storage *ss, unsigned *len)
{
    char host[256];
    const char *port;
    if (!split_url(url, host, sizeof(host), &port) || !*host)
        return false;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    if (getaddrinfo(host, port, &hints, &ai) != 0)
        return false;
    bool ok = ai->ai_addrlen <= sizeof(*ss);
    if (ok) {
        memcpy(ss, ai->ai_addr, ai->ai_addrlen);
        *len = (unsigned)ai->ai_addrlen;
    }
    freeaddrinfo(ai);
    return ok;
}

int rpc_loop_listen(const char *url, int *port, char *err, size_t errlen)
{
    char host[256];
    const char *ps;
    if (!split_url(url, host, sizeof(host), &ps)) {
        snprintf(err, errlen, "cannot listen on %s: not tcp://HOST:PORT (PORT 0..65535)", url);
        errno = EINVAL;
        return -1;
    }
    bool any = !*host || strcmp(host, "*") == 0;
    struct addrinfo hints = {.ai_family = any ? AF_INET : AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int g = getaddrinfo(any ? NULL : host, ps, &hints, &ai);
    if (g != 0) {
        snprintf(err, errlen, "cannot listen on %s: %s", url, gai_strerror(g));
        errno = EINVAL;
        return -1;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    int e = 0;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0)
        e = errno;
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (!e && getsockname(fd, (struct sockaddr *)&ss, &sl) != 0)
        e = errno;
    if (e) {
        if (fd >= 0)
            close(fd);
        snprintf(err, errlen, "cannot listen on %s: %s", url, strerror(e));
        errno = e;
        return -1;
    }
    *port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                     : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}
