/* SPDX-License-Identifier: MIT */
/*
 * kvnode over a WAL damaged before its end: it refuses to start (exit 1, the
 * log names the segment and the offset) and leaves the files alone; with
 * --wal-recovery point-in-time it starts with the writes before the damage.
 * The WAL is written in-process by the engine, the binary comes from
 * $KV_BUILD_DIR.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "node/engine.h"
#include "tests/kv_testport.h"

static char dir[64], fast[128], logp[160];

/* Writes n keys through the engine in dir/fast (one WAL frame each). */
static void fill(int n)
{
    engine_opts o = {.fast_dir = fast, .mem_mb = 8, .sync = ENGINE_SYNC_ALWAYS};
    engine *e;
    char err[256];
    engine_thread_register();
    cr_assert_eq(engine_open(&e, &o, err, sizeof(err)), KV_OK, "%s", err);
    for (int i = 0; i < n; i++) {
        char k[16];
        snprintf(k, sizeof(k), "key%04d", i);
        engine_write w = {.key = k, .klen = strlen(k), .val = "value", .vlen = 5};
        engine_result r;
        cr_assert_eq(engine_write_one(e, &w, &r, err, sizeof(err)), KV_OK, "%s", err);
    }
    engine_close(e);
    engine_thread_unregister();
}

/* Name of the largest WAL segment in dir/fast. */
static void wal_name(char *out, size_t cap)
{
    DIR *d = opendir(fast);
    struct dirent *de;
    long best = -1;
    while (d && (de = readdir(d))) {
        struct stat st;
        char p[400];
        snprintf(p, sizeof(p), "%s/%s", fast, de->d_name);
        size_t l = strlen(de->d_name);
        if (l > 4 && strcmp(de->d_name + l - 4, ".wal") == 0 && stat(p, &st) == 0 &&
            st.st_size > best) {
            best = st.st_size;
            snprintf(out, cap, "%s", de->d_name);
        }
    }
    if (d)
        closedir(d);
    cr_assert_gt(best, 0, "no WAL written");
}

static pid_t start(const char *recovery)
{
    const char *bdir = getenv("KV_BUILD_DIR");
    cr_assert_not_null(bdir, "KV_BUILD_DIR is not set");
    char bin[512], listen[64];
    snprintf(bin, sizeof(bin), "%s/node/kvnode", bdir);
    snprintf(listen, sizeof(listen), "tcp://127.0.0.1:%d", kv_test_free_port());
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int fd = open(logp, O_CREAT | O_TRUNC | O_WRONLY, 0644);
        dup2(fd, 2);
        execl(bin, bin, "--id", "n1", "--data-dir", dir, "--listen", listen, "--wal-recovery",
              recovery, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static char *read_log(void)
{
    static char buf[65536];
    FILE *f = fopen(logp, "r");
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    return buf;
}

/* Waits up to 20 s for pid to exit (returns its status) or for the log to
 * contain until (returns -1). */
static int wait_for(pid_t pid, const char *until)
{
    for (int i = 0; i < 2000; i++) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid)
            return st;
        if (until && strstr(read_log(), until))
            return -1;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    cr_assert_fail("kvnode neither exited nor logged '%s': %s", until ? until : "-", read_log());
    return -2;
}

Test(kvnode_wal, damaged_wal_refuses_to_start_unless_point_in_time, .timeout = 60)
{
    snprintf(dir, sizeof(dir), "/tmp/kv-walnode-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(fast, sizeof(fast), "%s/fast", dir);
    snprintf(logp, sizeof(logp), "%s.log", dir);
    fill(200);
    char wal[64], path[400];
    wal_name(wal, sizeof(wal));
    snprintf(path, sizeof(path), "%s/%s", fast, wal);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    int fd = open(path, O_RDWR);
    unsigned char c;
    cr_assert_eq(pread(fd, &c, 1, st.st_size / 2), 1);
    c ^= 0xff;
    cr_assert_eq(pwrite(fd, &c, 1, st.st_size / 2), 1);
    close(fd);

    int status = wait_for(start("absolute"), NULL);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1, "kvnode started over a damaged WAL");
    char *log = read_log();
    cr_assert(strstr(log, wal) && strstr(log, "offset") && strstr(log, "DATA_LOSS"),
              "the log does not name the file, the offset and the error: %s", log);
    struct stat st2;
    cr_assert(stat(path, &st2) == 0 && st2.st_size == st.st_size, "the refused WAL changed");

    pid_t pid = start("point-in-time");
    cr_assert_eq(wait_for(pid, "serving on"), -1, "kvnode did not start: %s", read_log());
    cr_assert(strstr(read_log(), "point-in-time") != NULL, "no log line about the recovery");
    kill(pid, SIGTERM);
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s'", dir, logp);
    cr_assert_eq(system(cmd), 0);
}
