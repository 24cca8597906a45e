/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer harness for RALT and its runs (node/lsm/ralt.c): the input is a
 * program of operations on one table with tiny limits (an 8-entry buffer,
 * so nearly every access writes a run and runs merge and evict all the
 * time): access, flush, is-hot, hot range, hot bytes, set the hot limit,
 * statistics, and damaging a run file on disk (one byte, optionally
 * re-checksummed with fz_sst_fix so the access-record decoder sees it).
 * Properties: hot ranges return keys in order and inside the range; without
 * damage no run is ever reported corrupt; with damage every call still
 * returns (errors, not crashes). A fresh directory and table per input.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_lsm.h"
#include "fuzz_util.h"

#define MAX_OPS 256

typedef struct range_check {
    bool damaged; /* a re-checksummed run may hold keys out of order */
    const uint8_t *lo, *hi;
    size_t lolen, hilen;
    uint8_t last[64];
    size_t lastlen;
    bool any;
} range_check;

static void on_hot(void *arg, const void *key, size_t klen, uint32_t vlen)
{
    range_check *c = arg;
    if (c->damaged)
        return;
    FZ_CHECK(lsm_key_cmp(key, klen, c->lo, c->lolen) >= 0 &&
                 lsm_key_cmp(key, klen, c->hi, c->hilen) <= 0,
             "hot range returned a key outside [lo, hi]");
    FZ_CHECK(!c->any || lsm_key_cmp(c->last, c->lastlen, key, klen) < 0,
             "hot range keys out of order");
    c->lastlen = klen < sizeof(c->last) ? klen : sizeof(c->last);
    memcpy(c->last, key, c->lastlen);
    c->any = klen <= sizeof(c->last);
}

static const uint8_t *key_of(fz_in *in, size_t *klen)
{
    return fz_take(in, 1 + fz_u8(in) % 24, klen);
}

/* Flips one byte of one run file (re-checksummed when asked). */
static void damage(const char *dir, fz_in *in)
{
    unsigned pick = fz_u8(in), flip = fz_u8(in) | 1, fix = fz_u8(in) & 1;
    uint32_t at = fz_u32(in);
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[600] = "";
    for (unsigned i = 0; d && (e = readdir(d));)
        if (strstr(e->d_name, ".sst") && i++ <= pick)
            snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    if (d)
        closedir(d);
    int fd = path[0] ? open(path, O_RDWR) : -1;
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size > 0) {
        uint8_t *img = malloc((size_t)st.st_size);
        FZ_CHECK(img && pread(fd, img, (size_t)st.st_size, 0) == st.st_size, "read run");
        img[at % (uint64_t)st.st_size] ^= (uint8_t)flip;
        if (fix)
            fz_sst_fix(img, (size_t)st.st_size);
        FZ_CHECK(pwrite(fd, img, (size_t)st.st_size, 0) == st.st_size, "write run");
        free(img);
    }
    if (fd >= 0)
        close(fd);
}

static void hot_range(ralt *r, fz_in *in, bool damaged)
{
    range_check c = {.damaged = damaged};
    c.lo = key_of(in, &c.lolen);
    c.hi = key_of(in, &c.hilen);
    (void)ralt_hot_range(r, c.lo, c.lolen, c.hi, c.hilen, on_hot, &c);
    (void)ralt_hot_bytes(r, c.lo, c.lolen, c.hi, c.hilen);
    (void)ralt_hot_bytes_est(r, c.lo, c.lolen, c.hi, c.hilen);
}

/* Runs one operation; returns true when it damaged a file. */
static bool step(ralt *r, const char *dir, fz_in *in, bool damaged)
{
    size_t klen;
    const uint8_t *key;
    ralt_stats st;
    switch (fz_u8(in) % 8) {
    case 0:
    case 1:
        key = key_of(in, &klen);
        ralt_access(r, key, klen, fz_u16(in));
        return false;
    case 2:
        (void)ralt_flush(r);
        return false;
    case 3:
        key = key_of(in, &klen);
        (void)ralt_is_hot(r, key, klen);
        (void)ralt_score(r, key, klen);
        return false;
    case 4:
        hot_range(r, in, damaged);
        return false;
    case 5:
        ralt_set_hot_limit(r, (uint64_t)fz_u16(in) * 16);
        return false;
    case 6:
        ralt_stats_get(r, &st);
        return false;
    default:
        damage(dir, in);
        return true;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    uint8_t flags = fz_u8(&in);
    char dir[512];
    fz_fresh_dir(dir, sizeof(dir), "ralt");
    ralt_opts o = {.dir = dir,
                   .disable_io_uring = !(flags & 1),
                   .hot_limit = 4096 + (uint64_t)(flags >> 1) * 512,
                   .tick_bytes = 256,
                   .buf_entries = 8};
    ralt *r = NULL;
    FZ_CHECK(ralt_open(&r, &o) == KV_OK, "ralt_open");
    bool damaged = false;
    for (int i = 0; i < MAX_OPS && in.n > 0; i++)
        damaged |= step(r, dir, &in, damaged);
    ralt_stats st;
    ralt_stats_get(r, &st);
    FZ_CHECK(damaged || st.errors == 0, "%llu run errors without any damage",
             (unsigned long long)st.errors);
    ralt_close(r);
    return 0;
}
