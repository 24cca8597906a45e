/* SPDX-License-Identifier: MIT */
/*
 * nng's process-wide initialisation, and the size of its callback thread
 * pool (the "task" threads that run every aio completion: a message
 * received, a send finished, a timer).
 *
 * nng sizes that pool at two threads per CPU. Every message hops between
 * those threads and the poller thread a few times, and on a small machine
 * twice as many runnable callback threads as CPUs mostly add contention:
 * on the 2-core reference VM, 4 task threads made a router switch context
 * 1.0 times per routed GET and spend 0.0106 CPU-s per 1,000; 2 threads, 0.45
 * switches and 0.0079 CPU-s, with 15-20 % more GETs per second through a
 * node and through a router (bench/README.md, "nng's task threads"). So
 * the default here is one thread per CPU, at least 2 (nng's own floor).
 *
 * How the count reaches nng: nng >= 1.7 takes it as an init parameter
 * (nng_init_set_parameter). nng 1.5 (Debian 12) has no such knob: it reads
 * sysconf(_SC_NPROCESSORS_ONLN) while it initialises: first to start
 * twice that many task threads, then as many timeout ("aio expire")
 * threads. So this file defines sysconf for the executables that link it
 * (kvnode, kvrouter, kvbench: libkvclient does not embed it) and answers
 * the first such query that rpc_runtime_init's nng initialisation makes
 * with half the count it wants; every other call, the timeout threads'
 * query included, goes to the C library's sysconf. On nng 1.5 the count is
 * therefore rounded up to an even number. The effect is
 * checked, not assumed: rpc_runtime_task_threads counts the threads nng
 * named "nng:task", and the binaries log it. Sanitized builds with nng 1.5
 * do not interpose (see KV_SANITIZED) and run nng's default pool.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "proto/rpc.h"
#include "proto/rpc_loop.h"

#define NNG_AT_LEAST(maj, min)                                                                     \
    (NNG_MAJOR_VERSION > (maj) || (NNG_MAJOR_VERSION == (maj) && NNG_MINOR_VERSION >= (min)))

/* A sanitizer's runtime calls sysconf while it initialises, before code it
 * instruments may run (ThreadSanitizer crashes there): sanitized builds
 * leave sysconf alone and get nng's own pool size. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KV_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) ||                         \
    __has_feature(memory_sanitizer)
#define KV_SANITIZED 1
#endif
#endif

#if !NNG_AT_LEAST(1, 7) && defined(__GLIBC__) && !defined(KV_SANITIZED)
#define KV_SYSCONF_WINDOW 1
/* The CPU count nng's next query is told (its task pool's); 0 = the real
 * one. Set by rpc_runtime_init on the thread that initialises nng, before
 * any other thread exists, taken by that one query, and cleared after the
 * initialisation in case nng never asked (relaxed is enough: nothing else
 * is published through it). */
static _Atomic long ncpu_window;

/* glibc's own entry point (sysconf is its weak alias). */
extern long __sysconf(int name);

long sysconf(int name)
{
    if (name == _SC_NPROCESSORS_ONLN) {
        long n = atomic_exchange_explicit(&ncpu_window, 0, memory_order_relaxed);
        if (n > 0)
            return n;
    }
    return __sysconf(name);
}
#endif

static unsigned cpus(void)
{
#ifdef KV_SYSCONF_WINDOW
    long n = __sysconf(_SC_NPROCESSORS_ONLN);
#else
    long n = sysconf(_SC_NPROCESSORS_ONLN);
#endif
    return n > 0 ? (unsigned)n : 1u;
}

bool rpc_runtime_sizes_threads(void)
{
#if NNG_AT_LEAST(1, 7) || defined(KV_SYSCONF_WINDOW)
    return true;
#else
    return false;
#endif
}

unsigned rpc_runtime_default_threads(void)
{
    unsigned n = cpus();
    return n < 2 ? 2 : n;
}

kv_err rpc_runtime_init(unsigned task_threads)
{
    unsigned want = task_threads ? task_threads : rpc_runtime_default_threads();
    if (want < 2)
        want = 2;
#if NNG_AT_LEAST(1, 7)
    nng_init_set_parameter(NNG_INIT_NUM_TASK_THREADS, want);
#elif defined(KV_SYSCONF_WINDOW)
    atomic_store_explicit(&ncpu_window, (long)((want + 1) / 2), memory_order_relaxed);
#endif
    nng_socket s;
    int rv = nng_req0_open(&s); /* initialises nng, which sizes its pools now */
#ifdef KV_SYSCONF_WINDOW
    atomic_store_explicit(&ncpu_window, 0, memory_order_relaxed);
#endif
    if (rv != 0)
        return KV_INTERNAL;
    nng_close(s);
    return KV_OK;
}

unsigned rpc_runtime_task_threads(void)
{
    return rpc_runtime_count_threads("nng:task");
}

unsigned rpc_runtime_count_threads(const char *prefix)
{
    size_t plen = strlen(prefix);
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return 0;
    unsigned n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[64], comm[32] = {0};
        snprintf(path, sizeof(path), "/proc/self/task/%.20s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        if (fgets(comm, sizeof(comm), f) && strncmp(comm, prefix, plen) == 0)
            n++;
        fclose(f);
    }
    closedir(d);
    return n;
}

void rpc_runtime_set_loops(unsigned loops)
{
    rpc_loop_set_count(loops > 8 ? 8 : (int)loops);
}

unsigned rpc_runtime_loops(void)
{
    return (unsigned)rpc_loop_count();
}
