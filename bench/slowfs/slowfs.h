/* SPDX-License-Identifier: MIT */
/*
 * slowfs: a FUSE (libfuse3) passthrough that serves a backing directory with
 * an emulated device's latency and caps (DESIGN.md §6), so that every engine
 * in a tier benchmark sees the same slow volume. slowfs.c runs the mount
 * (flags, fuse_session lifetime, signals); slowfs_ops.c has the file
 * operations; slowfs_dev.c is the device model: per-request latency and a
 * shared IOPS and bandwidth budget (GCRA, a token bucket in virtual time).
 */
#ifndef KV_BENCH_SLOWFS_H
#define KV_BENCH_SLOWFS_H

#define FUSE_USE_VERSION 312

#include <fuse3/fuse.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct sfs_dev {
    long read_lat_us, write_lat_us; /* added to every read / write / fsync */
    long iops;                      /* I/O operations per second, 0 = no cap */
    long mbps;                      /* MiB per second, 0 = no cap */
    long burst_ms;                  /* budget that may accumulate while idle */
    /* state, under mu */
    pthread_mutex_t mu;
    uint64_t iops_tat, bw_tat; /* GCRA theoretical arrival times, ns */
    /* counters */
    _Atomic uint64_t reads, read_bytes, writes, write_bytes, syncs, wait_ns;
} sfs_dev;

typedef enum sfs_kind { SFS_READ, SFS_WRITE, SFS_SYNC } sfs_kind;

/* Blocks the calling FUSE thread as the device would: until the request's
 * share of the IOPS and bandwidth budget is available, then for the
 * configured latency. Thread-safe. */
void sfs_dev_delay(sfs_dev *d, sfs_kind kind, size_t bytes);
void sfs_dev_init(sfs_dev *d);
/* One line of counters (for the exit report). */
void sfs_dev_report(sfs_dev *d, const char *prefix);

/* Transparent compression (slowfs_comp.c, --compress): physical bytes are
 * the compressed sizes of the 4 KiB blocks stored. Every call is a no-op
 * with SFS_COMP_NONE; all are thread-safe. */
typedef enum sfs_compress { SFS_COMP_NONE, SFS_COMP_LZ4, SFS_COMP_ZSTD } sfs_compress;
void sfs_comp_init(sfs_compress kind);
/* True when a compression model is on (backing files are then opened
 * read-write, so written blocks can be read back). */
bool sfs_comp_on(void);
/* After a write of len bytes at off to the backing file fd. */
void sfs_comp_write(int fd, off_t off, size_t len);
/* After the backing file fd was truncated to size. */
void sfs_comp_truncate(int fd, off_t size);
/* Before rel (relative to dirfd) is unlinked or renamed over: forgets its
 * blocks when this is its last link. */
void sfs_comp_forget(int dirfd, const char *rel);
/* One line: compress=, logical_bytes=, physical_bytes=, compressed_write_bytes=. */
void sfs_comp_report(const char *prefix);

/* The state the operations share (fuse_get_context()->private_data). */
typedef struct sfs_state {
    int backing_fd; /* O_PATH directory of the backing tree */
    sfs_dev dev;
} sfs_state;

extern const struct fuse_operations sfs_ops;

#endif
