/* SPDX-License-Identifier: MIT */
/*
 * slowfs's file operations: a passthrough of the high-level libfuse3 API onto
 * the backing directory (every path resolved with the *at() calls relative
 * to its descriptor), with the device model's delay (slowfs_dev.c) in front
 * of read, write, fsync, fdatasync and fsyncdir. Open files keep their
 * backing descriptor in fi->fh and are served with direct_io, so the kernel
 * keeps no page cache above slowfs and every read reaches the device model.
 * The set of operations is what an LSM and RocksDB use: attributes, directory
 * listing and creation, open/create/read/write/flush/release, fsync,
 * truncate, rename (with RENAME_NOREPLACE / RENAME_EXCHANGE), link, unlink,
 * fallocate, utimens, chmod, access and statfs. Advisory locks (flock,
 * fcntl) are left to the kernel, which keeps them locally for a FUSE mount
 * that does not implement them.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "bench/slowfs/slowfs.h"

static sfs_state *st(void)
{
    return fuse_get_context()->private_data;
}

/* "/a/b" -> "a/b", "/" -> "." (relative to the backing directory). */
static const char *rel(const char *path)
{
    while (*path == '/')
        path++;
    return *path ? path : ".";
}

#define RET(expr) return (expr) < 0 ? -errno : 0

static void *sfs_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
    cfg->use_ino = 1;
    cfg->direct_io = 1; /* no page cache above the emulated device */
    cfg->kernel_cache = 0;
    cfg->hard_remove = 1; /* unlink now; open files keep their descriptor */
    cfg->nullpath_ok = 1;
    cfg->negative_timeout = 0;
    return st();
}

static int sfs_getattr(const char *path, struct stat *sb, struct fuse_file_info *fi)
{
    if (fi)
        RET(fstat((int)fi->fh, sb));
    RET(fstatat(st()->backing_fd, rel(path), sb, AT_SYMLINK_NOFOLLOW));
}

static int sfs_access(const char *path, int mask)
{
    RET(faccessat(st()->backing_fd, rel(path), mask, 0));
}

/* Directories keep a DIR stream in fi->fh (paths may be NULL: nullpath_ok). */
static int sfs_opendir(const char *path, struct fuse_file_info *fi)
{
    int fd = openat(st()->backing_fd, rel(path), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = errno;
        close(fd);
        return -e;
    }
    fi->fh = (uint64_t)(uintptr_t)d;
    return 0;
}

/* Lists the whole directory in one call (offsets 0: libfuse buffers it). */
static int sfs_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
                       struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
    DIR *d = (DIR *)(uintptr_t)fi->fh;
    struct dirent *de;
    rewinddir(d);
    while ((de = readdir(d)) != NULL) {
        struct stat sb = {.st_ino = de->d_ino, .st_mode = (mode_t)de->d_type << 12};
        if (fill(buf, de->d_name, &sb, 0, 0))
            break;
    }
    return 0;
}

static int sfs_releasedir(const char *path, struct fuse_file_info *fi)
{
    closedir((DIR *)(uintptr_t)fi->fh);
    return 0;
}

static int sfs_mkdir(const char *path, mode_t mode)
{
    RET(mkdirat(st()->backing_fd, rel(path), mode));
}

static int sfs_rmdir(const char *path)
{
    RET(unlinkat(st()->backing_fd, rel(path), AT_REMOVEDIR));
}

static int sfs_unlink(const char *path)
{
    sfs_comp_forget(st()->backing_fd, rel(path));
    RET(unlinkat(st()->backing_fd, rel(path), 0));
}

static int sfs_rename(const char *from, const char *to, unsigned int flags)
{
    int fd = st()->backing_fd;
    if (!(flags & RENAME_EXCHANGE))
        sfs_comp_forget(fd, rel(to)); /* replaced by the rename */
    if (flags)
        RET(renameat2(fd, rel(from), fd, rel(to), flags));
    RET(renameat(fd, rel(from), fd, rel(to)));
}

static int sfs_link(const char *from, const char *to)
{
    RET(linkat(st()->backing_fd, rel(from), st()->backing_fd, rel(to), 0));
}

static int sfs_chmod(const char *path, mode_t mode, struct fuse_file_info *fi)
{
    if (fi)
        RET(fchmod((int)fi->fh, mode));
    RET(fchmodat(st()->backing_fd, rel(path), mode, 0));
}

static int sfs_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
    int fd = fi ? (int)fi->fh : openat(st()->backing_fd, rel(path), O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rv = ftruncate(fd, size) < 0 ? -errno : 0;
    if (rv == 0)
        sfs_comp_truncate(fd, size);
    if (!fi)
        close(fd);
    return rv;
}

static int sfs_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi)
{
    if (fi)
        RET(futimens((int)fi->fh, tv));
    RET(utimensat(st()->backing_fd, rel(path), tv, AT_SYMLINK_NOFOLLOW));
}

/* Applications' O_DIRECT would impose alignment on the backing file system;
 * slowfs already bypasses the page cache above itself (direct_io). */
static int open_flags(int flags)
{
    flags = (flags & ~(O_DIRECT | O_NOFOLLOW)) | O_CLOEXEC;
    if (sfs_comp_on() && (flags & O_ACCMODE) == O_WRONLY) /* the model reads written blocks */
        flags = (flags & ~O_ACCMODE) | O_RDWR;
    return flags;
}

static int sfs_open(const char *path, struct fuse_file_info *fi)
{
    int fd = openat(st()->backing_fd, rel(path), open_flags(fi->flags));
    if (fd < 0)
        return -errno;
    fi->fh = (uint64_t)fd;
    fi->direct_io = 1;
    return 0;
}

static int sfs_create(const char *path, mode_t mode, struct fuse_file_info *fi)
{
    int fd = openat(st()->backing_fd, rel(path), open_flags(fi->flags) | O_CREAT, mode);
    if (fd < 0)
        return -errno;
    fi->fh = (uint64_t)fd;
    fi->direct_io = 1;
    return 0;
}

static int sfs_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
    sfs_dev *d = &st()->dev;
    sfs_dev_delay(d, SFS_READ, size);
    ssize_t n = pread((int)fi->fh, buf, size, off);
    if (n < 0)
        return -errno;
    atomic_fetch_add_explicit(&d->reads, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&d->read_bytes, (uint64_t)n, memory_order_relaxed);
    return (int)n;
}

static int sfs_write(const char *path, const char *buf, size_t size, off_t off,
                     struct fuse_file_info *fi)
{
    sfs_dev *d = &st()->dev;
    sfs_dev_delay(d, SFS_WRITE, size);
    ssize_t n = pwrite((int)fi->fh, buf, size, off);
    if (n < 0)
        return -errno;
    sfs_comp_write((int)fi->fh, off, (size_t)n);
    atomic_fetch_add_explicit(&d->writes, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&d->write_bytes, (uint64_t)n, memory_order_relaxed);
    return (int)n;
}

static int sfs_statfs(const char *path, struct statvfs *sv)
{
    RET(fstatvfs(st()->backing_fd, sv));
}

/* close() of a duplicate reports write-back errors at each close(2), as the
 * libfuse passthrough example does. */
static int sfs_flush(const char *path, struct fuse_file_info *fi)
{
    int fd = dup((int)fi->fh);
    if (fd < 0)
        return -errno;
    RET(close(fd));
}

static int sfs_release(const char *path, struct fuse_file_info *fi)
{
    close((int)fi->fh);
    return 0;
}

static int sfs_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
    sfs_dev *d = &st()->dev;
    sfs_dev_delay(d, SFS_SYNC, 0);
    atomic_fetch_add_explicit(&d->syncs, 1, memory_order_relaxed);
    RET(datasync ? fdatasync((int)fi->fh) : fsync((int)fi->fh));
}

static int sfs_fsyncdir(const char *path, int datasync, struct fuse_file_info *fi)
{
    sfs_dev *d = &st()->dev;
    sfs_dev_delay(d, SFS_SYNC, 0);
    atomic_fetch_add_explicit(&d->syncs, 1, memory_order_relaxed);
    RET(fsync(dirfd((DIR *)(uintptr_t)fi->fh)));
}

/* Punched or zeroed ranges change what the blocks hold: measured again. */
static int sfs_fallocate(const char *path, int mode, off_t off, off_t len,
                         struct fuse_file_info *fi)
{
    if (fallocate((int)fi->fh, mode, off, len) < 0)
        return -errno;
    if (mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE))
        sfs_comp_write((int)fi->fh, off, (size_t)len);
    return 0;
}

const struct fuse_operations sfs_ops = {
    .init = sfs_init,
    .getattr = sfs_getattr,
    .access = sfs_access,
    .opendir = sfs_opendir,
    .readdir = sfs_readdir,
    .releasedir = sfs_releasedir,
    .mkdir = sfs_mkdir,
    .rmdir = sfs_rmdir,
    .unlink = sfs_unlink,
    .rename = sfs_rename,
    .link = sfs_link,
    .chmod = sfs_chmod,
    .truncate = sfs_truncate,
    .utimens = sfs_utimens,
    .open = sfs_open,
    .create = sfs_create,
    .read = sfs_read,
    .write = sfs_write,
    .statfs = sfs_statfs,
    .flush = sfs_flush,
    .release = sfs_release,
    .fsync = sfs_fsync,
    .fsyncdir = sfs_fsyncdir,
    .fallocate = sfs_fallocate,
};
