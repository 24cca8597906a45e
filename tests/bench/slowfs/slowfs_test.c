/* SPDX-License-Identifier: MIT */
/*
 * slowfs tests: mount slowfs over a temporary backing directory, run the
 * file operations an LSM needs through the mount (create, write, fsync,
 * read, rename, link, truncate, mkdir/rmdir, readdir, unlink) and see them
 * land in the backing directory; check that the latency and IOPS knobs delay
 * requests (lower bounds only: a loaded machine only makes requests slower);
 * SIGTERM unmounts. Skipped with a message when /dev/fuse or fusermount3 is
 * missing (e.g. an unprivileged container).
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char base[] = "/tmp/slowfs_test.XXXXXX";
static char backing[256], mnt[256];
static pid_t child = -1;

static bool mounted(void)
{
    char line[1024], want[300];
    snprintf(want, sizeof(want), " %s fuse", mnt);
    FILE *f = fopen("/proc/mounts", "r");
    bool found = false;
    while (f && fgets(line, sizeof(line), f))
        found = found || strstr(line, want) != NULL;
    if (f)
        fclose(f);
    return found;
}

static void skip_without_fuse(void)
{
    if (access("/dev/fuse", R_OK | W_OK) != 0)
        cr_skip_test("/dev/fuse is missing or not accessible: slowfs cannot mount here");
    if (system("command -v fusermount3 >/dev/null 2>&1") != 0)
        cr_skip_test("fusermount3 is missing (install fuse3): slowfs cannot mount here");
}

/* Starts slowfs with extra flags and waits until the mount is up. */
static void start(const char *flags)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "exec %s/bench/slowfs/slowfs --backing %s %s %s 2>>%s/log",
             getenv("KV_BUILD_DIR"), backing, flags, mnt, base);
    child = fork();
    cr_assert_geq(child, 0);
    if (child == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200 && !mounted(); i++)
        usleep(20000);
    cr_assert(mounted(), "slowfs mounted %s (see %s/log)", mnt, base);
}

/* SIGTERM: slowfs must exit 0 and leave nothing mounted. */
static void stop(void)
{
    int st = 0;
    if (child <= 0)
        return;
    kill(child, SIGTERM);
    waitpid(child, &st, 0);
    child = -1;
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "slowfs exit status %d", st);
    cr_assert(!mounted(), "nothing left mounted at %s", mnt);
}

static void setup(void)
{
    cr_assert_not_null(mkdtemp(base));
    snprintf(backing, sizeof(backing), "%s/backing", base);
    snprintf(mnt, sizeof(mnt), "%s/mnt", base);
    cr_assert_eq(mkdir(backing, 0755), 0);
    cr_assert_eq(mkdir(mnt, 0755), 0);
}

static void teardown(void)
{
    char cmd[512];
    if (child > 0) {
        kill(child, SIGTERM);
        waitpid(child, NULL, 0);
    }
    if (mounted()) {
        snprintf(cmd, sizeof(cmd), "fusermount3 -uz %s", mnt);
        if (system(cmd) != 0)
            fprintf(stderr, "cannot unmount %s\n", mnt);
    }
    snprintf(cmd, sizeof(cmd), "rm -rf %s", base);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", base);
}

static char *in(const char *dir, const char *name)
{
    static char buf[2][512];
    static int k;
    k ^= 1;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", dir, name);
    return buf[k];
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

TestSuite(slowfs, .init = setup, .fini = teardown, .timeout = 60);

static void write_file(const char *path, const char *data, size_t n)
{
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    cr_assert_geq(fd, 0, "create %s: %s", path, strerror(errno));
    cr_assert_eq(write(fd, data, n), (ssize_t)n);
    cr_assert_eq(fsync(fd), 0, "fsync: %s", strerror(errno));
    cr_assert_eq(fdatasync(fd), 0, "fdatasync: %s", strerror(errno));
    cr_assert_eq(close(fd), 0);
}

static bool listed(const char *dir, const char *name)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "opendir %s: %s", dir, strerror(errno));
    struct dirent *de;
    bool found = false;
    while ((de = readdir(d)) != NULL)
        found = found || strcmp(de->d_name, name) == 0;
    closedir(d);
    return found;
}

Test(slowfs, file_operations)
{
    skip_without_fuse();
    start("");
    char data[10000], back[10000];
    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (char)(i * 7);
    write_file(in(mnt, "a"), data, sizeof(data));
    struct stat sb;
    cr_assert_eq(stat(in(backing, "a"), &sb), 0, "the write reached the backing directory");
    cr_assert_eq(sb.st_size, (off_t)sizeof(data));
    int fd = open(in(mnt, "a"), O_RDONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(pread(fd, back, sizeof(back), 0), (ssize_t)sizeof(back));
    cr_assert_eq(memcmp(data, back, sizeof(data)), 0, "read back what was written");
    close(fd);
    cr_assert_eq(rename(in(mnt, "a"), in(mnt, "b")), 0, "rename: %s", strerror(errno));
    cr_assert(listed(mnt, "b") && !listed(mnt, "a"));
    cr_assert_eq(link(in(mnt, "b"), in(mnt, "c")), 0, "link: %s", strerror(errno));
    cr_assert_eq(truncate(in(mnt, "c"), 100), 0, "truncate: %s", strerror(errno));
    cr_assert_eq(stat(in(mnt, "b"), &sb), 0);
    cr_assert_eq(sb.st_size, 100, "hard link shares the inode");
    cr_assert_eq(mkdir(in(mnt, "d"), 0755), 0);
    write_file(in(mnt, "d/x"), "x", 1);
    cr_assert(listed(in(mnt, "d"), "x"));
    cr_assert_eq(unlink(in(mnt, "d/x")), 0);
    cr_assert_eq(rmdir(in(mnt, "d")), 0, "rmdir: %s", strerror(errno));
    cr_assert_eq(unlink(in(mnt, "b")), 0);
    cr_assert_eq(unlink(in(mnt, "c")), 0);
    cr_assert_neq(stat(in(backing, "b"), &sb), 0, "unlink reached the backing directory");
    stop();
}

/* Seconds for n 4 KiB preads of one file through the mount. */
static double timed_reads(int n)
{
    char buf[4096];
    memset(buf, 1, sizeof(buf));
    write_file(in(mnt, "r"), buf, sizeof(buf));
    int fd = open(in(mnt, "r"), O_RDONLY);
    cr_assert_geq(fd, 0);
    double t0 = now_s();
    for (int i = 0; i < n; i++)
        cr_assert_eq(pread(fd, buf, sizeof(buf), 0), (ssize_t)sizeof(buf));
    double s = now_s() - t0;
    close(fd);
    return s;
}

Test(slowfs, read_latency_knob)
{
    skip_without_fuse();
    start("--read-lat-us 20000");
    double s = timed_reads(10);
    /* direct_io: no page cache, each read pays the 20 ms */
    cr_assert_geq(s, 10 * 0.020, "10 reads at 20 ms took only %.3f s", s);
    stop();
}

Test(slowfs, iops_cap)
{
    skip_without_fuse();
    start("--iops 50 --burst-ms 0");
    double s = timed_reads(20);
    cr_assert_geq(s, 19.0 / 50.0 - 0.01, "20 reads at 50 IOPS took only %.3f s", s);
    stop();
}

Test(slowfs, sigint_unmounts)
{
    skip_without_fuse();
    start("");
    int st = 0;
    kill(child, SIGINT);
    waitpid(child, &st, 0);
    child = -1;
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status %d", st);
    cr_assert(!mounted());
}

/* Writes nblk 4 KiB blocks to path: each starts with fill bytes of noise
 * and is zero after them (fill 4096: incompressible). */
static void write_blocks(const char *path, int nblk, size_t fill)
{
    char *buf = calloc((size_t)nblk, 4096);
    uint64_t x = 88172645463325252ull;
    for (int b = 0; b < nblk; b++)
        for (size_t i = 0; i < fill; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            buf[(size_t)b * 4096 + i] = (char)x;
        }
    write_file(path, buf, (size_t)nblk * 4096);
    free(buf);
}

/* The numbers of the compress line of the exit report. */
static void comp_report(const char *kind, unsigned long long *logical, unsigned long long *physical)
{
    char line[512], want[64];
    snprintf(want, sizeof(want), "slowfs: compress=%s ", kind);
    FILE *f = fopen(in(base, "log"), "r");
    bool found = false;
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, want, strlen(want)))
            found = sscanf(line + strlen(want), "logical_bytes=%llu physical_bytes=%llu", logical,
                           physical) == 2;
    if (f)
        fclose(f);
    cr_assert(found, "no '%s' report line in %s/log", want, base);
}

Test(slowfs, compress_reports_physical_bytes)
{
    skip_without_fuse();
    start("--compress lz4");
    write_blocks(in(mnt, "sparse"), 64, 100); /* mostly empty blocks, like kallax's */
    write_blocks(in(mnt, "noise"), 16, 4096);
    write_blocks(in(mnt, "gone"), 8, 4096);
    cr_assert_eq(unlink(in(mnt, "gone")), 0);
    write_blocks(in(mnt, "cut"), 8, 4096);
    cr_assert_eq(truncate(in(mnt, "cut"), 2 * 4096 + 100), 0);
    write_blocks(in(mnt, "old"), 4, 4096);
    write_blocks(in(mnt, "new"), 1, 4096);
    cr_assert_eq(rename(in(mnt, "new"), in(mnt, "old")), 0); /* old's blocks go */
    stop();
    unsigned long long logical, physical;
    comp_report("lz4", &logical, &physical);
    cr_assert_eq(logical, (64ull + 16 + 3 + 1) * 4096, "logical %llu", logical);
    /* the incompressible blocks count whole, the sparse ones a little */
    unsigned long long hard = (16ull + 2 + 1) * 4096 + 100;
    cr_assert_geq(physical, hard, "physical %llu", physical);
    cr_assert_leq(physical, hard + 64ull * 200 + 200, "physical %llu", physical);
}

Test(slowfs, compress_zstd)
{
    skip_without_fuse();
    start("--compress zstd");
    write_blocks(in(mnt, "sparse"), 32, 50);
    stop();
    unsigned long long logical, physical;
    comp_report("zstd", &logical, &physical);
    cr_assert_eq(logical, 32ull * 4096);
    cr_assert_leq(physical, 32ull * 150, "physical %llu", physical);
}
