/* SPDX-License-Identifier: MIT */
/*
 * Volumes: a directory (FD or SD) through which every SST, WAL and MANIFEST
 * byte of the LSM is read and written. I/O goes through io_uring with one
 * ring per calling thread (thread-local, created on first use, destroyed at
 * thread exit): batches of block reads are submitted together. Writes are
 * pwrite (+ fdatasync when durable): see lsm_vol_write.
 * When io_uring is unavailable (probed once, logged once) or disabled for a
 * volume, plain pread/pwrite/fdatasync do the same work. Each volume keeps
 * atomic counters and latency EWMAs (alpha 1/8) for the stats. Tests make
 * chosen calls fail through fault.c (lsm_fault_set).
 */
#define _GNU_SOURCE /* fallocate, FALLOC_FL_KEEP_SIZE */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "node/lsm/lsm_int.h"

#define RING_DEPTH 64

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static pthread_key_t ring_key;
static bool uring_ok;
static __thread struct io_uring *tl_ring;

static void ring_destroy(void *p)
{
    struct io_uring *r = p;
    io_uring_queue_exit(r);
    free(r);
}

static void probe(void)
{
    struct io_uring r;
    int e = io_uring_queue_init(4, &r, 0);
    if (e < 0) {
        KV_WARN(LSM_LOG, "io_uring unavailable (%s): volumes use pread/pwrite", strerror(-e));
        return;
    }
    io_uring_queue_exit(&r);
    uring_ok = pthread_key_create(&ring_key, ring_destroy) == 0;
    if (uring_ok)
        KV_INFO(LSM_LOG, "volume I/O through io_uring (one ring per thread)");
}

bool lsm_uring_available(void)
{
    pthread_once(&probe_once, probe);
    return uring_ok;
}

/* The calling thread's ring, or NULL (then the caller uses the sync path). */
static struct io_uring *ring_get(const lsm_vol *v)
{
    if (!v->uring || !lsm_uring_available())
        return NULL;
    if (tl_ring)
        return tl_ring;
    struct io_uring *r = malloc(sizeof(*r));
    if (!r)
        return NULL;
    if (io_uring_queue_init(RING_DEPTH, r, 0) < 0) {
        free(r);
        return NULL;
    }
    tl_ring = r;
    pthread_setspecific(ring_key, r);
    return r;
}

/* Drops the thread's ring after a submission/completion error so no stale
 * SQE can ever be submitted later; the next call creates a fresh ring. */
static void ring_reset(void)
{
    struct io_uring *r = tl_ring;
    if (!r)
        return;
    tl_ring = NULL;
    pthread_setspecific(ring_key, NULL);
    ring_destroy(r);
}

static void ewma(_Atomic uint64_t *e, uint64_t sample)
{
    uint64_t old = atomic_load_explicit(e, memory_order_relaxed);
    uint64_t nv = old ? old - old / 8 + sample / 8 : sample;
    atomic_store_explicit(e, nv, memory_order_relaxed);
}

kv_err lsm_vol_init(lsm_vol *v, const char *dir, lsm_tier tier, bool use_uring)
{
    memset(v, 0, sizeof(*v));
    v->dirfd = -1;
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
        KV_ERROR(LSM_LOG, "mkdir %s: %s", dir, strerror(errno));
        return lsm_errno(errno);
    }
    v->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (v->dirfd < 0) {
        KV_ERROR(LSM_LOG, "open %s: %s", dir, strerror(errno));
        return KV_INTERNAL;
    }
    v->dir = strdup(dir);
    if (!v->dir) {
        close(v->dirfd);
        v->dirfd = -1;
        return KV_RESOURCE_EXHAUSTED;
    }
    v->tier = tier;
    v->uring = use_uring && lsm_uring_available();
    return KV_OK;
}

void lsm_vol_fini(lsm_vol *v)
{
    if (v->dirfd >= 0)
        close(v->dirfd);
    free(v->dir);
    v->dir = NULL;
    v->dirfd = -1;
}

int lsm_vol_open(lsm_vol *v, const char *name, int flags)
{
    int f = flags & O_CREAT ? lsm_fault_hit(LSM_FOP_CREATE, -1, name, 0, NULL) : 0;
    if (f < 0)
        return f;
    int fd = openat(v->dirfd, name, flags | O_CLOEXEC, 0644);
    return fd < 0 ? -errno : fd;
}

kv_err lsm_vol_truncate(lsm_vol *v, int fd, uint64_t len)
{
    (void)v;
    int f = lsm_fault_hit(LSM_FOP_TRUNCATE, fd, NULL, 0, NULL);
    if (f < 0)
        return lsm_errno(f);
    return ftruncate(fd, (off_t)len) < 0 ? lsm_errno(errno) : KV_OK;
}

int lsm_vol_unlink(lsm_vol *v, const char *name)
{
    return unlinkat(v->dirfd, name, 0) < 0 ? -errno : 0;
}

kv_err lsm_vol_syncdir(lsm_vol *v)
{
    return lsm_vol_fsync(v, v->dirfd);
}

static long pread_full(int fd, void *buf, size_t len, uint64_t off)
{
    size_t done = 0;
    while (done < len) {
        ssize_t r = pread(fd, (char *)buf + done, len - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            break;
        done += (size_t)r;
    }
    return (long)done;
}

static long pwrite_full(int fd, const void *buf, size_t len, uint64_t off)
{
    size_t done = 0;
    while (done < len) {
        ssize_t r = pwrite(fd, (const char *)buf + done, len - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        done += (size_t)r;
    }
    return (long)done;
}

/* Submits ios[0..n) (n <= RING_DEPTH) and reaps all completions. */
static void uring_read_chunk(struct io_uring *r, lsm_io *ios, size_t n)
{
    size_t queued = 0;
    for (size_t i = 0; i < n; i++) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(r);
        if (!sqe) {
            ios[i].res = pread_full(ios[i].fd, ios[i].buf, ios[i].len, ios[i].off);
            continue;
        }
        io_uring_prep_read(sqe, ios[i].fd, ios[i].buf, (unsigned)ios[i].len, ios[i].off);
        io_uring_sqe_set_data64(sqe, i);
        queued++;
    }
    int s = io_uring_submit_and_wait(r, (unsigned)queued);
    for (size_t got = 0; got < queued;) {
        struct io_uring_cqe *cqe;
        int e = s < 0 ? s : io_uring_wait_cqe(r, &cqe);
        if (e == -EINTR)
            continue;
        if (e < 0) { /* ring broken: drop it, finish synchronously */
            ring_reset();
            for (size_t i = 0; i < n; i++)
                ios[i].res = pread_full(ios[i].fd, ios[i].buf, ios[i].len, ios[i].off);
            return;
        }
        lsm_io *io = &ios[io_uring_cqe_get_data64(cqe)];
        io->res = cqe->res;
        io_uring_cqe_seen(r, cqe);
        got++;
        if (io->res >= 0 && (size_t)io->res < io->len) { /* short: finish it */
            long more = pread_full(io->fd, (char *)io->buf + io->res, io->len - (size_t)io->res,
                                   io->off + (uint64_t)io->res);
            io->res = more < 0 ? more : io->res + more;
        }
    }
}

kv_err lsm_vol_read(lsm_io *ios, size_t n)
{
    if (n == 0)
        return KV_OK;
    uint64_t t0 = kv_now_ns();
    for (size_t i = 0; i < n; i += RING_DEPTH) {
        size_t m = n - i < RING_DEPTH ? n - i : RING_DEPTH;
        struct io_uring *r = ring_get(ios[0].vol); /* a chunk may reset it */
        if (r)
            uring_read_chunk(r, ios + i, m);
        else
            for (size_t j = i; j < i + m; j++)
                ios[j].res = pread_full(ios[j].fd, ios[j].buf, ios[j].len, ios[j].off);
    }
    uint64_t per = (kv_now_ns() - t0) / n;
    for (size_t i = 0; i < n; i++) {
        int f = lsm_fault_hit(LSM_FOP_READ, ios[i].fd, NULL, ios[i].len, NULL);
        ios[i].res = f < 0 ? f : ios[i].res;
        lsm_vol *v = ios[i].vol;
        atomic_fetch_add_explicit(&v->reads, 1, memory_order_relaxed);
        if (ios[i].res > 0)
            atomic_fetch_add_explicit(&v->read_bytes, (uint64_t)ios[i].res, memory_order_relaxed);
        ewma(&v->rlat_ns, per);
    }
    return KV_OK;
}

kv_err lsm_vol_pread(lsm_vol *v, int fd, void *buf, size_t len, uint64_t off)
{
    lsm_io io = {.vol = v, .fd = fd, .buf = buf, .len = len, .off = off};
    lsm_vol_read(&io, 1);
    if (io.res < 0)
        return lsm_errno((int)io.res);
    return (size_t)io.res == len ? KV_OK : KV_DATA_LOSS;
}

static void count_write(lsm_vol *v, size_t len, uint64_t t0, bool sync)
{
    atomic_fetch_add_explicit(&v->writes, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&v->write_bytes, len, memory_order_relaxed);
    if (sync)
        atomic_fetch_add_explicit(&v->fsyncs, 1, memory_order_relaxed);
    ewma(&v->wlat_ns, kv_now_ns() - t0);
}

/* An injected write failure: writes keep bytes first (a short write). */
static kv_err fault_write(int fd, const void *buf, size_t keep, uint64_t off, int f)
{
    if (keep)
        (void)pwrite_full(fd, buf, keep, off);
    return lsm_errno(f);
}

kv_err lsm_vol_write(lsm_vol *v, int fd, const void *buf, size_t len, uint64_t off, bool sync)
{
    size_t keep;
    int f = lsm_fault_hit(LSM_FOP_WRITE, fd, NULL, len, &keep);
    if (f == 0)
        f = lsm_fault_space_hit(v->dir, fd, off, len, true), keep = 0;
    if (f < 0)
        return fault_write(fd, buf, keep, off, f);
    /* pwrite, not io_uring: a buffered write submitted to a ring is handed
     * by the kernel to an io-wq worker thread (the filesystems here cannot
     * complete it inline), so the caller sleeps through a hand-off and a
     * wake-up for what pwrite does by copying into the page cache: the
     * WAL's group writes ran at 25-28k against 42k node writes/s with
     * --no-io-uring (bench/README.md, e2e_compare.sh). The ring serves the
     * batched block reads. */
    uint64_t t0 = kv_now_ns();
    long res = pwrite_full(fd, buf, len, off);
    if (res < 0)
        return lsm_errno((int)res);
    int sres = sync && fdatasync(fd) < 0 ? -errno : 0;
    if (sync && sres == 0)
        sres = lsm_fault_hit(LSM_FOP_FSYNC, fd, NULL, 0, NULL);
    count_write(v, len, t0, sync);
    return sync && sres < 0 ? lsm_errno(sres) : KV_OK;
}

kv_err lsm_vol_fsync(lsm_vol *v, int fd)
{
    int f = lsm_fault_hit(LSM_FOP_FSYNC, fd, NULL, 0, NULL);
    if (f < 0)
        return lsm_errno(f);
    int res = fsync(fd) < 0 ? -errno : 0; /* not through the ring: see lsm_vol_write */
    atomic_fetch_add_explicit(&v->fsyncs, 1, memory_order_relaxed);
    return res < 0 ? lsm_errno(res) : KV_OK;
}

kv_err lsm_vol_reserve(lsm_vol *v, int fd, uint64_t off, uint64_t len)
{
    int f = lsm_fault_space_hit(v->dir, fd, off, len, false);
    if (f == 0 && fallocate(fd, FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len) < 0)
        f = -errno;
    if (f == -EOPNOTSUPP || f == -ENOSYS)
        return KV_UNIMPLEMENTED;
    return f < 0 ? lsm_errno(f) : KV_OK;
}

/* The filesystem's free (unprivileged) or total bytes; UINT64_MAX when
 * unknown. */
static uint64_t vol_statvfs(const lsm_vol *v, bool total)
{
    struct statvfs s;
    if (v->dirfd < 0 || fstatvfs(v->dirfd, &s) != 0)
        return UINT64_MAX;
    return (uint64_t)(total ? s.f_blocks : s.f_bavail) * (uint64_t)s.f_frsize;
}

uint64_t lsm_vol_free_bytes(const lsm_vol *v)
{
    uint64_t free;
    return lsm_fault_space_of(v->dir, NULL, &free) ? free : vol_statvfs(v, false);
}

uint64_t lsm_vol_total_bytes(const lsm_vol *v)
{
    uint64_t cap;
    return lsm_fault_space_of(v->dir, &cap, NULL) ? cap : vol_statvfs(v, true);
}

void lsm_vol_counters(const lsm_vol *v, lsm_vol_stats *o)
{
    o->reads = atomic_load(&v->reads);
    o->read_bytes = atomic_load(&v->read_bytes);
    o->writes = atomic_load(&v->writes);
    o->write_bytes = atomic_load(&v->write_bytes);
    o->fsyncs = atomic_load(&v->fsyncs);
    o->read_lat_ewma_ns = atomic_load(&v->rlat_ns);
    o->write_lat_ewma_ns = atomic_load(&v->wlat_ns);
}
