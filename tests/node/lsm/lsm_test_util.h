/* SPDX-License-Identifier: MIT */
/* Helpers shared by the LSM tests: scratch directories under /tmp, recursive
 * removal, finding files by suffix and flipping bytes in them, test options
 * and values. */
#ifndef KV_TESTS_LSM_TEST_UTIL_H
#define KV_TESTS_LSM_TEST_UTIL_H

#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "node/lsm/lsm.h"

static inline char *lt_mkdtemp(const char *tag)
{
    char *p = malloc(256);
    snprintf(p, 256, "/tmp/lsm-%s-XXXXXX", tag);
    if (!mkdtemp(p)) {
        free(p);
        return NULL;
    }
    return p;
}

static inline int lt_rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static inline void lt_rmrf(const char *dir)
{
    if (dir)
        nftw(dir, lt_rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

/* Path of the file in dir ending with suffix with the highest (pick_max) or
 * lowest number-sorted name; NULL when none. Caller frees. */
static inline char *lt_find(const char *dir, const char *suffix, int pick_max)
{
    DIR *d = opendir(dir);
    if (!d)
        return NULL;
    char best[256] = {0};
    struct dirent *e;
    size_t sl = strlen(suffix);
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < sl || strcmp(e->d_name + n - sl, suffix) != 0)
            continue;
        if (!best[0] || (pick_max ? strcmp(e->d_name, best) > 0 : strcmp(e->d_name, best) < 0))
            snprintf(best, sizeof(best), "%s", e->d_name);
    }
    closedir(d);
    if (!best[0])
        return NULL;
    char *p = malloc(strlen(dir) + strlen(best) + 2);
    sprintf(p, "%s/%s", dir, best);
    return p;
}

static inline int lt_count(const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    size_t sl = strlen(suffix);
    while (d && (e = readdir(d))) {
        size_t l = strlen(e->d_name);
        n += l >= sl && strcmp(e->d_name + l - sl, suffix) == 0;
    }
    if (d)
        closedir(d);
    return n;
}

static inline long lt_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* XORs 0xff into the byte at off. Returns 0 on success. */
static inline int lt_flip(const char *path, long off)
{
    int fd = open(path, O_RDWR);
    if (fd < 0)
        return -1;
    unsigned char c;
    int rc = -1;
    if (pread(fd, &c, 1, off) == 1) {
        c ^= 0xff;
        rc = pwrite(fd, &c, 1, off) == 1 ? 0 : -1;
    }
    close(fd);
    return rc;
}

/* Options for a test db in dir: the defaults with the given sync mode and
 * compaction only on request. */
static inline void lt_opts(lsm_opts *o, const char *dir, lsm_sync sync)
{
    lsm_opts_default(o);
    o->fast_dir = dir;
    o->sync = sync;
    o->no_auto_compaction = true;
}

/* The value the fault tests write for seqno seq: len letters. */
static inline void lt_value(char *v, size_t len, uint64_t seq)
{
    for (size_t i = 0; i < len; i++)
        v[i] = (char)('a' + (seq * 7 + i) % 26);
}

/* Deterministic PRNG (splitmix64). */
static inline uint64_t lt_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#endif
