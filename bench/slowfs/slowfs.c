/* SPDX-License-Identifier: MIT */
/*
 * slowfs: serves --backing DIR at MOUNTPOINT through FUSE, in the
 * foreground, as an emulated block volume (slowfs.h): --read-lat-us and
 * --write-lat-us per request, --iops and --mbps caps shared by all threads.
 * Lifetime: fuse_new, libfuse's signal handlers (SIGINT,
 * SIGTERM, SIGHUP end the session loop), fuse_mount, the multi-threaded loop, then
 * fuse_unmount + fuse_destroy, so a clean exit leaves nothing mounted; the
 * device counters go to stderr on exit.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "bench/slowfs/slowfs.h"
#include "common/opts.h"

typedef struct sfs_cli {
    char *backing;
    long read_lat_us, write_lat_us, iops, mbps, burst_ms, threads;
    int compress; /* index into compress_choices */
    char *mountpoint;
} sfs_cli;

static const char *const compress_choices[] = {"none", "lz4", "zstd", NULL};

/* The parsed option set; it owns the strings it set until exit. */
static kv_optset opt_set;

static void free_opts(void)
{
    kv_opts_free(&opt_set);
    free((void *)opt_set.opts);
    opt_set.opts = NULL;
}

/* Parses the flags and the one positional MOUNTPOINT; CANCELLED after --help. */
static kv_err parse(sfs_cli *c, int argc, char **argv)
{
    const kv_opt table[] = {
        {"backing", KV_OPT_STR, &c->backing, "directory served at MOUNTPOINT (required)"},
        {"read-lat-us", KV_OPT_INT, &c->read_lat_us, "latency added to each read", NULL, 0,
         10000000},
        {"write-lat-us", KV_OPT_INT, &c->write_lat_us, "latency added to each write and fsync",
         NULL, 0, 10000000},
        {"iops", KV_OPT_INT, &c->iops, "I/O per second cap (256 KiB units), 0 = none", NULL, 0,
         100000000},
        {"mbps", KV_OPT_INT, &c->mbps, "MiB per second cap, 0 = none", NULL, 0, 1000000},
        {"burst-ms", KV_OPT_INT, &c->burst_ms, "budget an idle device may bank", NULL, 0, 10000},
        {"threads", KV_OPT_INT, &c->threads, "max FUSE worker threads (queue depth)", NULL, 1,
         1024},
        {"compress", KV_OPT_ENUM, &c->compress,
         "none|lz4|zstd: report physical bytes as the compressed size of each 4 KiB block "
         "stored (a drive with transparent compression)",
         compress_choices},
    };
    kv_opt *copy = malloc(sizeof(table)); /* the set outlives this frame */
    if (!copy)
        return KV_RESOURCE_EXHAUSTED;
    memcpy(copy, table, sizeof(table));
    opt_set = (kv_optset){copy, sizeof(table) / sizeof(table[0]), NULL, "slowfs", "MOUNTPOINT"};
    atexit(free_opts);
    char err[512] = "";
    int npos = 0;
    kv_err rv = kv_opts_parse(&opt_set, argc, argv, &npos, err, sizeof(err));
    if (rv == KV_OK && (npos != 1 || !c->backing)) {
        snprintf(err, sizeof(err), "usage: slowfs --backing DIR [flags] MOUNTPOINT");
        rv = KV_INVALID_ARGUMENT;
    }
    if (rv != KV_OK && rv != KV_CANCELLED)
        fprintf(stderr, "slowfs: %s\n", err);
    c->mountpoint = rv == KV_OK ? argv[1] : NULL;
    return rv;
}

static struct fuse *make_fuse(sfs_state *s, const char *prog)
{
    struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
    if (fuse_opt_add_arg(&args, prog) || fuse_opt_add_arg(&args, "-o") ||
        fuse_opt_add_arg(&args, "fsname=slowfs,subtype=slowfs,default_permissions")) {
        fuse_opt_free_args(&args);
        return NULL;
    }
    struct fuse *f = fuse_new(&args, &sfs_ops, sizeof(sfs_ops), s);
    fuse_opt_free_args(&args);
    return f;
}

/* Mounts, serves until a signal or an unmount, unmounts. 0 on a clean run. */
static int serve(sfs_state *s, const sfs_cli *c, const char *prog)
{
    struct fuse *f = make_fuse(s, prog);
    if (!f)
        return 1;
    struct fuse_session *se = fuse_get_session(f);
    /* libfuse only takes over signals left at their default; a shell starts
     * background jobs with SIGINT ignored, and slowfs must still stop on it.
     * The handlers go in before the mount: a signal in between killed the
     * process by the default action and left the mount behind (seen as a
     * flaky sigint_unmounts test on a loaded host). A signal that arrives
     * after this and before the loop makes the loop return at once. */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    if (fuse_set_signal_handlers(se) != 0) {
        fprintf(stderr, "slowfs: cannot install signal handlers\n");
        fuse_destroy(f);
        return 1;
    }
    if (fuse_mount(f, c->mountpoint) != 0) {
        fprintf(stderr, "slowfs: cannot mount at %s\n", c->mountpoint);
        fuse_remove_signal_handlers(se);
        fuse_destroy(f);
        return 1;
    }
    struct fuse_loop_config *lc = fuse_loop_cfg_create();
    fuse_loop_cfg_set_max_threads(lc, (unsigned)c->threads);
    fuse_loop_cfg_set_idle_threads(lc, (unsigned)c->threads);
    fprintf(stderr, "slowfs: %s at %s (read %ld us, write %ld us, %ld IOPS, %ld MiB/s)\n",
            c->backing, c->mountpoint, c->read_lat_us, c->write_lat_us, c->iops, c->mbps);
    int rc = fuse_loop_mt(f, lc) < 0 ? 1 : 0;
    fuse_loop_cfg_destroy(lc);
    fuse_remove_signal_handlers(se);
    fuse_unmount(f);
    fuse_destroy(f);
    return rc;
}

int main(int argc, char **argv)
{
    static sfs_cli c = {.burst_ms = 10, .threads = 64}; /* static: its strings are freed at exit */
    kv_err rv = parse(&c, argc, argv);
    if (rv == KV_CANCELLED)
        return 0;
    if (rv != KV_OK)
        return 2;
    sfs_state s;
    memset(&s, 0, sizeof(s));
    s.backing_fd = open(c.backing, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (s.backing_fd < 0) {
        perror(c.backing);
        return 1;
    }
    s.dev.read_lat_us = c.read_lat_us;
    s.dev.write_lat_us = c.write_lat_us;
    s.dev.iops = c.iops;
    s.dev.mbps = c.mbps;
    s.dev.burst_ms = c.burst_ms;
    sfs_dev_init(&s.dev);
    sfs_comp_init((sfs_compress)c.compress);
    prctl(PR_SET_TIMERSLACK, 1UL); /* sleeps of tens of us stay accurate */
    int rc = serve(&s, &c, argv[0]);
    sfs_dev_report(&s.dev, "slowfs");
    sfs_comp_report("slowfs");
    close(s.backing_fd);
    return rc;
}
