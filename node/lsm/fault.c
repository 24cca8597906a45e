/* SPDX-License-Identifier: MIT */
/*
 * Fault injection for the volume layer, for tests (the model is RocksDB's
 * FaultInjectionTestEnv and SQLite's I/O error tests). One process-wide rule
 * says which volume calls fail: the kinds of call (read, write, fsync,
 * create, truncate), the files (a substring of their path), how many
 * matching calls pass first and how many fail after them, with which errno,
 * and whether a failing write first writes half its bytes (a short write);
 * or, instead of failing, how long the matching calls wait (a slow device).
 * volume.c asks lsm_fault_hit before (or, for a write's fsync, after) each
 * call. Unarmed, that is one atomic load; armed, matching is serialised by
 * a mutex and the path of a file descriptor comes from /proc/self/fd.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <unistd.h>

#include "node/lsm/lsm_int.h"

static pthread_mutex_t fault_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic bool fault_armed;
static lsm_fault fault_rule;        /* fault_mu */
static char fault_path[PATH_MAX];   /* fault_mu: the rule's path_has, copied */
static uint64_t fault_seen;         /* fault_mu: matching calls so far */
static _Atomic uint64_t fault_hits; /* calls failed since the rule was set */

void lsm_fault_set(const lsm_fault *f)
{
    pthread_mutex_lock(&fault_mu);
    if (f) {
        fault_rule = *f;
        snprintf(fault_path, sizeof(fault_path), "%s", f->path_has ? f->path_has : "");
        fault_rule.path_has = fault_path[0] ? fault_path : NULL;
    }
    fault_seen = 0;
    atomic_store(&fault_hits, 0);
    atomic_store_explicit(&fault_armed, f != NULL, memory_order_release);
    pthread_mutex_unlock(&fault_mu);
}

uint64_t lsm_fault_hits(void)
{
    return atomic_load(&fault_hits);
}

/* fault_mu held: does the rule's path filter admit the file? */
static bool path_matches(int fd, const char *name)
{
    if (!fault_rule.path_has)
        return true;
    char link[64], path[PATH_MAX];
    if (!name) {
        snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, path, sizeof(path) - 1);
        if (n < 0)
            return false;
        path[n] = '\0';
        name = path;
    }
    return strstr(name, fault_rule.path_has) != NULL;
}

int lsm_fault_hit(unsigned op, int fd, const char *name, size_t len, size_t *keep)
{
    if (keep)
        *keep = 0;
    if (!atomic_load_explicit(&fault_armed, memory_order_acquire))
        return 0;
    int e = 0;
    unsigned delay = 0;
    pthread_mutex_lock(&fault_mu);
    if (atomic_load(&fault_armed) && (fault_rule.ops & op) && path_matches(fd, name)) {
        uint64_t n = fault_seen++;
        if (n >= fault_rule.after &&
            (!fault_rule.times || n - fault_rule.after < fault_rule.times)) {
            atomic_fetch_add(&fault_hits, 1);
            if ((delay = fault_rule.delay_us) == 0) {
                e = fault_rule.err ? fault_rule.err : EIO;
                if (keep && op == LSM_FOP_WRITE && fault_rule.short_write)
                    *keep = len / 2;
            }
        }
    }
    pthread_mutex_unlock(&fault_mu);
    if (delay)
        usleep(delay); /* outside fault_mu: other calls go on meanwhile */
    return -e;
}
