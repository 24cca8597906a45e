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
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>
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

/* ---- an emulated device size (lsm_fault_space) ---- */

static pthread_mutex_t space_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic bool space_armed;
static char space_path[PATH_MAX];   /* space_mu */
static uint64_t space_cap;          /* space_mu */
static _Atomic uint64_t space_hits; /* writes refused since lsm_fault_space */

void lsm_fault_space(const char *path_has, uint64_t cap)
{
    pthread_mutex_lock(&space_mu);
    snprintf(space_path, sizeof(space_path), "%s", path_has ? path_has : "");
    space_cap = cap;
    atomic_store(&space_hits, 0);
    atomic_store_explicit(&space_armed, path_has != NULL, memory_order_release);
    pthread_mutex_unlock(&space_mu);
}

/* The bytes a file takes on the emulated device: its size, plus what was
 * reserved past its end (fallocate KEEP_SIZE, lsm_vol_reserve: the blocks
 * beyond the size rounded up to a page). */
static uint64_t file_used(const struct stat *st)
{
    uint64_t size = (uint64_t)st->st_size, blocks = (uint64_t)st->st_blocks * 512;
    uint64_t whole = (size + 4095) & ~(uint64_t)4095;
    return size + (blocks > whole ? blocks - whole : 0);
}

uint64_t lsm_fault_dir_bytes(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    uint64_t sum = 0;
    struct dirent *e;
    struct stat st;
    while ((e = readdir(d)) != NULL)
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
            sum += file_used(&st);
    closedir(d);
    return sum;
}

/* space_mu held: is dir the emulated device? */
static bool space_matches(const char *dir)
{
    return atomic_load(&space_armed) && dir && strstr(dir, space_path) != NULL;
}

bool lsm_fault_space_of(const char *dir, uint64_t *cap, uint64_t *free)
{
    if (!atomic_load_explicit(&space_armed, memory_order_acquire))
        return false;
    pthread_mutex_lock(&space_mu);
    bool m = space_matches(dir);
    if (m && cap)
        *cap = space_cap;
    if (m && free) {
        uint64_t used = lsm_fault_dir_bytes(dir);
        *free = used < space_cap ? space_cap - used : 0;
    }
    pthread_mutex_unlock(&space_mu);
    return m;
}

int lsm_fault_space_hit(const char *dir, int fd, uint64_t off, size_t len, bool count)
{
    if (!atomic_load_explicit(&space_armed, memory_order_acquire))
        return 0;
    int e = 0;
    pthread_mutex_lock(&space_mu);
    struct stat st;
    if (space_matches(dir) && fstat(fd, &st) == 0) {
        uint64_t end = off + len, taken = file_used(&st); /* reserved bytes need no room */
        uint64_t grow = end > taken ? end - taken : 0;
        if (grow && lsm_fault_dir_bytes(dir) + grow > space_cap) {
            e = ENOSPC;
            if (count)
                atomic_fetch_add(&space_hits, 1);
        }
    }
    pthread_mutex_unlock(&space_mu);
    return -e;
}

uint64_t lsm_fault_space_hits(void)
{
    return atomic_load(&space_hits);
}
