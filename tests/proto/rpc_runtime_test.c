/* SPDX-License-Identifier: MIT */
/* rpc_runtime_init: nng starts the callback threads it was asked for, the
 * CPU count the rest of the process sees is the real one afterwards, and a
 * server and a channel in one process keep many calls in flight on the
 * smallest pool (2 threads) without waiting on each other. Each case runs
 * rpc_runtime_probe, a process of its own, since nng sizes its pools once
 * per process. */
#include "tests/kv_testfw.h"
#include <nng/nng.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/sysinfo.h>

#include "proto/rpc.h"

#define NNG_AT_LEAST_1_7 (NNG_MAJOR_VERSION > 1 || NNG_MINOR_VERSION >= 7)

/* What nng starts for a request of n: nng 1.5 only takes even counts; a
 * build that cannot size the pool (sanitizers on nng 1.5) gets nng's
 * default, two per CPU, at most 16. */
static unsigned expected(unsigned n)
{
    if (!rpc_runtime_sizes_threads()) {
        unsigned d = 2 * (unsigned)get_nprocs();
        return d > 16 ? 16 : d;
    }
    if (n < 2)
        n = 2;
    return NNG_AT_LEAST_1_7 ? n : (n + 1) / 2 * 2;
}

typedef struct probe {
    unsigned threads;
    int sizes, cpus, chains, ok, expire;
    long sysconf;
    int status;
} probe;

static probe run_probe(const char *args)
{
    const char *dir = getenv("KV_BUILD_DIR");
    cr_assert_not_null(dir, "KV_BUILD_DIR is set by ctest");
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s/tests/proto/rpc_runtime_probe %s", dir, args);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f, "%s", cmd);
    probe p = {.sizes = -1, .chains = -1, .ok = -1};
    char line[256];
    while (fgets(line, sizeof(line), f)) {
        sscanf(line, "threads %u cpus %d sysconf %ld", &p.threads, &p.cpus, &p.sysconf);
        sscanf(line, "chains %d ok %d", &p.chains, &p.ok);
        sscanf(line, "sizes %d", &p.sizes);
        sscanf(line, "expire %d", &p.expire);
    }
    p.status = pclose(f);
    return p;
}

Test(rpc_runtime, starts_the_task_threads_it_was_asked_for)
{
    probe p = run_probe("6");
    cr_assert_eq(p.status, 0);
    cr_assert_eq(p.sizes, rpc_runtime_sizes_threads());
    cr_assert_eq(p.threads, expected(6));
    /* the window in which nng is told another CPU count is closed, and
     * nng's timeout threads were sized by the real count (one per CPU) */
    cr_assert_eq(p.sysconf, p.cpus);
    cr_assert_eq(p.cpus, get_nprocs());
    if (!NNG_AT_LEAST_1_7) /* nng 1.5 starts one per CPU (1.7 caps them) */
        cr_assert_eq(p.expire, get_nprocs(), "%d timeout threads", p.expire);
}

Test(rpc_runtime, an_odd_count_is_what_this_nng_can_do)
{
    probe p = run_probe("3");
    cr_assert_eq(p.status, 0);
    cr_assert_eq(p.threads, expected(3));
}

Test(rpc_runtime, the_default_is_one_per_cpu_at_least_two)
{
    unsigned cpus = (unsigned)get_nprocs();
    cr_assert_eq(rpc_runtime_default_threads(), cpus < 2 ? 2 : cpus);
    probe p = run_probe("0");
    cr_assert_eq(p.status, 0);
    cr_assert_eq(p.threads, expected(rpc_runtime_default_threads()));
    cr_assert_eq(p.sysconf, p.cpus);
}

Test(rpc_runtime, two_threads_carry_a_server_and_a_channel_in_one_process)
{
    probe p = run_probe("2 chain");
    cr_assert_eq(p.threads, expected(2));
    cr_assert_eq(p.chains, 64, "every chain of calls ended (%d)", p.chains);
    cr_assert_eq(p.ok, 64 * 20, "every call was answered OK (%d)", p.ok);
    cr_assert_eq(p.status, 0);
}
