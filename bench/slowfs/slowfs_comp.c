/* SPDX-License-Identifier: MIT */
/*
 * slowfs's transparent-compression model (--compress lz4|zstd): a drive with
 * built-in compression (a computational-storage SSD) stores each 4 KiB block
 * it is given compressed, so its physical space is the sum of the blocks'
 * compressed sizes while the host sees the logical space. After every write
 * slowfs reads back each 4 KiB block the write touched (from the backing
 * file, so partial writes see the whole block), compresses it (LZ4 default
 * level, or zstd level 1 with a per-thread context) and records its size in
 * a per-file table indexed by block (4 bytes per block of file). A truncate
 * drops the blocks past the end and measures the new last block again; an
 * unlink (or a rename over a file) of the last link drops the file's table.
 * The totals (blocks stored x 4 KiB = logical bytes, the sum of compressed
 * sizes = physical bytes, and the compressed bytes written) go to the exit
 * report. Files are found by inode number in a small chained hash table; one
 * mutex guards the tables (held only for the table update, not the I/O and
 * compression).
 */
#define _GNU_SOURCE
#include <lz4.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "bench/slowfs/slowfs.h"

#define BLK 4096u
#define NBUCKETS 1024u

typedef struct cfile {
    uint64_t ino;
    uint32_t *cs; /* compressed size + 1 per block, 0 = never written */
    uint64_t nblk;
    struct cfile *next;
} cfile;

static struct {
    sfs_compress kind;
    pthread_mutex_t mu;
    cfile *b[NBUCKETS];
    uint64_t blocks, phys; /* stored blocks, their compressed bytes */
    _Atomic uint64_t written;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

void sfs_comp_init(sfs_compress kind)
{
    g.kind = kind;
}

bool sfs_comp_on(void)
{
    return g.kind != SFS_COMP_NONE;
}

/* Per-thread zstd contexts, freed when their FUSE thread exits. */
static pthread_key_t zc_key;
static pthread_once_t zc_once = PTHREAD_ONCE_INIT;

static void zc_free(void *p)
{
    ZSTD_freeCCtx(p);
}

static void zc_init(void)
{
    pthread_key_create(&zc_key, zc_free);
}

static size_t compress_block(const uint8_t *src, size_t n)
{
    char dst[BLK + 512];
    if (g.kind == SFS_COMP_LZ4) {
        int r = LZ4_compress_default((const char *)src, dst, (int)n, (int)sizeof(dst));
        return r > 0 && (size_t)r < n ? (size_t)r : n;
    }
    pthread_once(&zc_once, zc_init);
    ZSTD_CCtx *zc = pthread_getspecific(zc_key);
    if (!zc && (zc = ZSTD_createCCtx()) != NULL)
        pthread_setspecific(zc_key, zc);
    if (!zc)
        return n;
    size_t r = ZSTD_compressCCtx(zc, dst, sizeof(dst), src, n, 1);
    return ZSTD_isError(r) || r >= n ? n : r;
}

/* The file's table, created when create is set (mu held). */
static cfile *find(uint64_t ino, bool create)
{
    cfile **p = &g.b[ino % NBUCKETS];
    for (; *p; p = &(*p)->next)
        if ((*p)->ino == ino)
            return *p;
    if (!create || !(*p = calloc(1, sizeof(**p))))
        return NULL;
    (*p)->ino = ino;
    return *p;
}

/* Records block blk of ino at csize bytes (0 = dropped). mu held. */
static void set_block(cfile *f, uint64_t blk, uint32_t csize)
{
    if (blk >= f->nblk) {
        if (!csize)
            return;
        uint64_t n = f->nblk ? f->nblk : 16;
        while (n <= blk)
            n *= 2;
        uint32_t *cs = realloc(f->cs, (size_t)n * sizeof(*cs));
        if (!cs)
            return; /* out of memory: this block goes uncounted */
        memset(cs + f->nblk, 0, (size_t)(n - f->nblk) * sizeof(*cs));
        f->cs = cs;
        f->nblk = n;
    }
    if (f->cs[blk]) {
        g.blocks--;
        g.phys -= f->cs[blk] - 1;
    }
    f->cs[blk] = csize ? csize + 1 : 0;
    if (csize) {
        g.blocks++;
        g.phys += csize;
    }
}

/* Measures block blk of the open file fd (ino) again. */
static void measure(int fd, uint64_t ino, uint64_t blk)
{
    uint8_t buf[BLK];
    ssize_t n = pread(fd, buf, BLK, (off_t)(blk * BLK));
    size_t c = n > 0 ? compress_block(buf, (size_t)n) : 0;
    atomic_fetch_add_explicit(&g.written, c, memory_order_relaxed);
    pthread_mutex_lock(&g.mu);
    cfile *f = find(ino, c > 0);
    if (f)
        set_block(f, blk, (uint32_t)c);
    pthread_mutex_unlock(&g.mu);
}

void sfs_comp_write(int fd, off_t off, size_t len)
{
    struct stat sb;
    if (g.kind == SFS_COMP_NONE || len == 0 || fstat(fd, &sb) < 0)
        return;
    for (uint64_t b = (uint64_t)off / BLK; b <= ((uint64_t)off + len - 1) / BLK; b++)
        measure(fd, sb.st_ino, b);
}

void sfs_comp_truncate(int fd, off_t size)
{
    struct stat sb;
    if (g.kind == SFS_COMP_NONE || fstat(fd, &sb) < 0)
        return;
    uint64_t keep = ((uint64_t)size + BLK - 1) / BLK;
    pthread_mutex_lock(&g.mu);
    cfile *f = find(sb.st_ino, false);
    for (uint64_t b = keep; f && b < f->nblk; b++)
        set_block(f, b, 0);
    pthread_mutex_unlock(&g.mu);
    if (size % BLK)
        measure(fd, sb.st_ino, (uint64_t)size / BLK);
}

void sfs_comp_forget(int dirfd, const char *rel)
{
    struct stat sb;
    if (g.kind == SFS_COMP_NONE || fstatat(dirfd, rel, &sb, AT_SYMLINK_NOFOLLOW) < 0 ||
        !S_ISREG(sb.st_mode) || sb.st_nlink > 1)
        return;
    pthread_mutex_lock(&g.mu);
    cfile **p = &g.b[sb.st_ino % NBUCKETS];
    while (*p && (*p)->ino != (uint64_t)sb.st_ino)
        p = &(*p)->next;
    cfile *f = *p;
    if (f) {
        for (uint64_t b = 0; b < f->nblk; b++)
            set_block(f, b, 0);
        *p = f->next;
        free(f->cs);
        free(f);
    }
    pthread_mutex_unlock(&g.mu);
}

void sfs_comp_report(const char *prefix)
{
    if (g.kind == SFS_COMP_NONE)
        return;
    pthread_mutex_lock(&g.mu);
    fprintf(stderr,
            "%s: compress=%s logical_bytes=%llu physical_bytes=%llu compressed_write_bytes=%llu\n",
            prefix, g.kind == SFS_COMP_LZ4 ? "lz4" : "zstd", (unsigned long long)(g.blocks * BLK),
            (unsigned long long)g.phys, (unsigned long long)atomic_load(&g.written));
    for (unsigned i = 0; i < NBUCKETS; i++)
        while (g.b[i]) {
            cfile *f = g.b[i];
            g.b[i] = f->next;
            free(f->cs);
            free(f);
        }
    pthread_mutex_unlock(&g.mu);
}
