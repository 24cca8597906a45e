/* SPDX-License-Identifier: MIT */
/*
 * The helpers of fuzz_util.h: the input cursor, the scratch directory (one
 * per process, so parallel fuzzing jobs do not share files), rm -rf through
 * nftw, the property-check abort and the UTF-8 validator.
 */
#define _GNU_SOURCE
#include "fuzz_util.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"

const uint8_t *fz_take(fz_in *in, size_t want, size_t *got)
{
    size_t n = want < in->n ? want : in->n;
    const uint8_t *p = in->p;
    in->p += n;
    in->n -= n;
    *got = n;
    return p;
}

static uint64_t take_le(fz_in *in, size_t bytes)
{
    size_t got;
    const uint8_t *p = fz_take(in, bytes, &got);
    uint64_t v = 0;
    for (size_t i = 0; i < got; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

uint8_t fz_u8(fz_in *in)
{
    return (uint8_t)take_le(in, 1);
}

uint16_t fz_u16(fz_in *in)
{
    return (uint16_t)take_le(in, 2);
}

uint32_t fz_u32(fz_in *in)
{
    return (uint32_t)take_le(in, 4);
}

uint64_t fz_u64(fz_in *in)
{
    return take_le(in, 8);
}

const uint8_t *fz_chunk(fz_in *in, size_t *len)
{
    size_t want = fz_u16(in);
    return fz_take(in, want, len);
}

void fz_quiet(void)
{
    if (!getenv("FUZZ_LOG"))
        kv_log_set_level((kv_log_level)(KV_LOG_ERROR + 1));
}

/* Weak: a harness that needs more setup defines its own (calling fz_quiet). */
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_quiet();
    return 0;
}

bool fz_strict(void)
{
    const char *v = getenv("FUZZ_STRICT");
    return !v || !*v || strcmp(v, "0") != 0; /* on unless FUZZ_STRICT=0 */
}

static char workdir[256];

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

void fz_rmtree(const char *path)
{
    nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void workdir_remove(void)
{
    if (workdir[0])
        fz_rmtree(workdir);
}

const char *fz_workdir(void)
{
    if (workdir[0])
        return workdir;
    const char *t = getenv("TMPDIR");
    snprintf(workdir, sizeof(workdir), "%s/hotkv-fuzz-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(workdir)) {
        perror("fuzz: mkdtemp");
        abort();
    }
    atexit(workdir_remove);
    return workdir;
}

const char *fz_fresh_dir(char *buf, size_t cap, const char *sub)
{
    snprintf(buf, cap, "%s/%s", fz_workdir(), sub);
    fz_rmtree(buf);
    if (mkdir(buf, 0755) != 0) {
        fprintf(stderr, "fuzz: mkdir %s: %s\n", buf, strerror(errno));
        abort();
    }
    return buf;
}

void fz_write_file(const char *dir, const char *name, const void *p, size_t n)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const uint8_t *b = p;
    while (fd >= 0 && n > 0) {
        ssize_t w = write(fd, b, n);
        if (w <= 0)
            break;
        b += w;
        n -= (size_t)w;
    }
    if (fd < 0 || n > 0) {
        fprintf(stderr, "fuzz: write %s: %s\n", path, strerror(errno));
        abort();
    }
    close(fd);
}

void fz_fail(const char *file, int line, const char *cond, const char *fmt, ...)
{
    fprintf(stderr, "\n==FUZZ== invariant broken at %s:%d: %s\n==FUZZ== ", file, line, cond);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    abort();
}

/* Length of the UTF-8 sequence starting at s[0..n), 0 when ill-formed
 * (Unicode 15, table 3-7). */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t len = c >= 0xC2 && c <= 0xDF   ? 2
                 : c >= 0xE0 && c <= 0xEF ? 3
                 : c >= 0xF0 && c <= 0xF4 ? 4
                                          : 0;
    if (!len || len > n)
        return 0;
    unsigned char lo = 0x80, hi = 0xBF; /* bounds of the second byte */
    if (c == 0xE0)
        lo = 0xA0;
    else if (c == 0xED)
        hi = 0x9F;
    else if (c == 0xF0)
        lo = 0x90;
    else if (c == 0xF4)
        hi = 0x8F;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return len;
}

bool fz_utf8_ok(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(p + i, n - i);
        if (!k)
            return false;
        i += k;
    }
    return true;
}

bool fz_utf8_str_ok(const char *s)
{
    return !s || fz_utf8_ok(s, strlen(s));
}
