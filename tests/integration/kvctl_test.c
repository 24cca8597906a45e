/* SPDX-License-Identifier: MIT */
/* kvctl against a live cluster: round trips, output and exit codes; kvctl
 * nhc and kvnode's --nhc flags. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static kvt_cluster cl;

static int kvctl(const char *args, char *out, size_t outlen)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s --router %s %s 2>&1", kvt_bin("client/kvctl"), cl.router_url,
             args);
    return kvt_run(cmd, out, outlen);
}

Test(kvctl, round_trips_and_exit_codes, .timeout = 120)
{
    cr_assert_eq(kvt_cluster_start(&cl, 3, 3, NULL), KV_OK, "logs in %s", cl.dir);
    char out[8192];
    cr_assert_eq(kvctl("put a 1", out, sizeof(out)), 0, "%s", out);
    cr_assert_str_eq(out, "OK\n");
    cr_assert_eq(kvctl("get a", out, sizeof(out)), 0, "%s", out);
    cr_assert_str_eq(out, "1\n");
    cr_assert_eq(kvctl("--json get a", out, sizeof(out)), 0);
    cr_assert(strstr(out, "\"value\":\"1\""), "%s", out);
    cr_assert_eq(kvctl("get nope", out, sizeof(out)), 1, "missing key exits 1: %s", out);
    cr_assert_eq(kvctl("del a", out, sizeof(out)), 0);
    cr_assert_str_eq(out, "1\n");
    cr_assert_eq(kvctl("get a", out, sizeof(out)), 1);
    cr_assert_eq(kvctl("frobnicate", out, sizeof(out)), 2, "unknown command exits 2");
    cr_assert_eq(kvctl("get", out, sizeof(out)), 2, "missing argument exits 2");
    cr_assert_eq(kvctl("put k v --ttl nope", out, sizeof(out)), 2, "bad flag exits 2");
    cr_assert_eq(kvctl("put '' v", out, sizeof(out)), 3, "server-side error exits 3: %s", out);
    cr_assert(strstr(out, "INVALID_ARGUMENT"), "status name on stderr: %s", out);

    cr_assert_eq(kvctl("status", out, sizeof(out)), 0, "%s", out);
    for (int i = 1; i <= 3; i++) {
        char id[8];
        snprintf(id, sizeof(id), "n%d", i);
        cr_assert(strstr(out, id), "status lists %s: %s", id, out);
    }
    cr_assert(strstr(out, "up"), "%s", out);
    cr_assert(strstr(out, "batch"), "durability (the WAL sync mode) shown: %s", out);
    cr_assert_eq(kvctl("--json status", out, sizeof(out)), 0);
    cr_assert(strstr(out, "\"durability\":\"batch\""), "%s", out);
    cr_assert_eq(kvctl("ring", out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "%"), "%s", out);
    cr_assert_eq(kvctl("ping", out, sizeof(out)), 0);
    cr_assert(strstr(out, "PONG from router"), "%s", out);

    /* kvctl pointed at a node works too */
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s --router %s status 2>&1", kvt_bin("client/kvctl"),
             cl.node_url[0]);
    cr_assert_eq(kvt_run(cmd, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "n3"), "%s", out);

    /* cluster init refuses when the nodes already have a map */
    snprintf(cmd, sizeof(cmd), "%s cluster init --rf 1 n1=%s 2>&1", kvt_bin("client/kvctl"),
             cl.node_url[0]);
    cr_assert_eq(kvt_run(cmd, out, sizeof(out)), 3, "%s", out);
    cr_assert(strstr(out, "ALREADY_EXISTS"), "%s", out);

    /* an unreachable router is a server error with the status name */
    snprintf(cmd, sizeof(cmd), "%s --timeout 500 --router tcp://127.0.0.1:1 get a 2>&1",
             kvt_bin("client/kvctl"));
    cr_assert_eq(kvt_run(cmd, out, sizeof(out)), 3, "%s", out);
    cr_assert(strstr(out, "UNAVAILABLE"), "%s", out);
    kvt_cluster_stop(&cl);
}

/* kvctl nhc against a node with a slow volume (the scheduler runs) and
 * through a router whose nodes have none (nhc off); kvnode's --nhc flags
 * refuse bad values with exit code 2. */
/* How many of pid's threads are named name. */
static int threads_named(pid_t pid, const char *name)
{
    char path[64], comm[32];
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    cr_assert_not_null(d, "%s", path);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char p[352];
        snprintf(p, sizeof(p), "%.63s/%.255s/comm", path, e->d_name);
        FILE *f = fopen(p, "r");
        if (f && fgets(comm, sizeof(comm), f)) {
            comm[strcspn(comm, "\n")] = 0;
            n += strcmp(comm, name) == 0;
        }
        if (f)
            fclose(f);
    }
    closedir(d);
    return n;
}

Test(kvctl, nhc_state_series_and_flags, .timeout = 120)
{
    char dir[] = "/tmp/hotkv-kvctl-nhc-XXXXXX", slow[300], data[300], out[16384], cmd[2048];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(slow, sizeof(slow), "%s/slow", dir);
    snprintf(data, sizeof(data), "%s/data", dir);
    const char *bad[][2] = {{"--nhc", "maybe"},
                            {"--nhc-target", "fastest"},
                            {"--nhc-step", "0"},
                            {"--nhc-step", "1.5"},
                            {"--nhc-miss-max", "2"},
                            {"--nhc-probe-ms", "0"},
                            {"--nhc-poll-ms", "x"},
                            {"--nhc-twin-entries", "-1"},
                            {"--nhc-stable-delta", "nan"},
                            {"--nhc-backoff-max", "-1"},
                            {"--loops", "9"},
                            {"--loops", "-1"}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(cmd, sizeof(cmd), "%s --id b --data-dir %s %s %s 2>&1", kvt_bin("node/kvnode"),
                 data, bad[i][0], bad[i][1]);
        cr_assert_eq(kvt_run(cmd, out, sizeof(out)), 2, "%s %s: %s", bad[i][0], bad[i][1], out);
        cr_assert(strstr(out, bad[i][0]), "the message names the flag: %s", out);
    }

    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", kvt_free_port());
    const char *extra[] = {"--slow-dir", slow,      "--nhc", "on", "--nhc-poll-ms",
                           "100",        "--loops", "1",     NULL};
    pid_t pid = kvt_node_start(dir, "s1", url, extra);
    cr_assert_gt(pid, 0, "node did not start; log in %s", dir);
    cr_assert_eq(threads_named(pid, "kv:loop"), 1, "--loops 1 runs one event loop");
    for (int i = 0; i < 50; i++) {
        snprintf(cmd, sizeof(cmd), "%s --router %s put k%d v%d 2>&1", kvt_bin("client/kvctl"), url,
                 i, i);
        cr_assert_eq(kvt_run(cmd, out, sizeof(out)), 0, "%s", out);
    }
    usleep(1500 * 1000); /* at least one series point */
    snprintf(cmd, sizeof(cmd), "%s --router %s nhc 2>&1", kvt_bin("client/kvctl"), url);
    cr_assert_eq(kvt_run(cmd, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "node s1: state classic, data_admit on, load_admit 1.000"), "%s", out);
    cr_assert(strstr(out, "miss ratio"), "%s", out);
    cr_assert(strstr(out, "fast") && strstr(out, "slow"), "per-volume rows: %s", out);
    cr_assert(strstr(out, "last minute"), "%s", out);
    snprintf(cmd, sizeof(cmd), "%s --router %s --json nhc s1 2>&1", kvt_bin("client/kvctl"), url);
    cr_assert_eq(kvt_run(cmd, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "\"state\":\"classic\""), "%s", out);
    cr_assert(strstr(out, "\"data_admit\":true"), "%s", out);
    cr_assert(strstr(out, "\"load_admit\":1.000"), "%s", out);
    cr_assert(strstr(out, "\"fd\":{\"reads_per_s\":"), "%s", out);
    cr_assert(strstr(out, "\"series\":[{\"age_s\":"), "series present: %s", out);
    snprintf(cmd, sizeof(cmd), "%s --router %s nhc nosuch 2>&1", kvt_bin("client/kvctl"), url);
    cr_assert_eq(kvt_run(cmd, out, sizeof(out)), 1, "unknown node id exits 1: %s", out);
    snprintf(cmd, sizeof(cmd), "%s --router %s nhc a b 2>&1", kvt_bin("client/kvctl"), url);
    cr_assert_eq(kvt_run(cmd, out, sizeof(out)), 2, "extra argument exits 2: %s", out);
    /* --watch refreshes every second until interrupted: two JSON lines or
     * more within 6 s (an ASan process's start and first round included) */
    snprintf(cmd, sizeof(cmd), "timeout -s INT 6 %s --router %s --json --watch nhc 2>&1",
             kvt_bin("client/kvctl"), url);
    kvt_run(cmd, out, sizeof(out));
    int lines = 0;
    for (const char *p = out; (p = strstr(p, "{\"nodes\":[")); p++)
        lines++;
    cr_assert_geq(lines, 2, "watch refreshed: %s", out);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    kvt_forget(pid);

    /* through a router: nodes without a slow volume report nhc off */
    cr_assert_eq(kvt_cluster_start(&cl, 2, 1, NULL), KV_OK, "logs in %s", cl.dir);
    cr_assert_eq(kvctl("nhc", out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "node n1: nhc off") && strstr(out, "node n2: nhc off"), "%s", out);
    cr_assert_eq(kvctl("--json nhc n2", out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "{\"nodes\":[{\"id\":\"n2\",\"state\":\"off\"}]}"), "%s", out);
    kvt_cluster_stop(&cl);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* Runs a shell command line (kvctl at $K, router at $KV_ROUTER). */
static int sh(const char *script, char *out, size_t outlen)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "K=%s; export KV_ROUTER=%s; cd %s && { %s; } 2>&1",
             kvt_bin("client/kvctl"), cl.router_url, cl.dir, script);
    return kvt_run(cmd, out, outlen);
}

Test(kvctl, values_are_bytes, .timeout = 120)
{
    cr_assert_eq(kvt_cluster_start(&cl, 3, 3, NULL), KV_OK, "logs in %s", cl.dir);
    char out[8192];
    /* NUL bytes through stdin, printed raw */
    cr_assert_eq(
        sh("printf 'a\\0b\\0c' | $K put bin - && $K get bin --raw | od -An -c", out, sizeof(out)),
        0, "%s", out);
    cr_expect(strstr(out, "a  \\0   b  \\0   c") != NULL, "%s", out);
    /* a value that starts with -- after -- */
    cr_assert_eq(sh("$K put -- dash --weird && $K get dash", out, sizeof(out)), 0, "%s", out);
    cr_expect(strstr(out, "--weird\n") != NULL, "%s", out);
    /* 5 MB from a file and back to a file */
    cr_assert_eq(sh("head -c 5000000 /dev/urandom > big && $K put big --file big && "
                    "$K get big -o big2 && cmp big big2 && echo same",
                    out, sizeof(out)),
                 0, "%s", out);
    cr_expect(strstr(out, "same") != NULL, "%s", out);
    /* hex keys and values; JSON keeps binary as base64 and versions as strings */
    cr_assert_eq(sh("$K --hex put 00ff 80c1 && $K --hex get 00ff && $K --hex --json get 00ff", out,
                    sizeof(out)),
                 0, "%s", out);
    cr_expect(strstr(out, "80c1\n") != NULL, "%s", out);
    cr_expect(strstr(out, "\"value_b64\":\"gME=\"") != NULL, "%s", out);
    cr_expect(strstr(out, "\"version\":\"") != NULL, "%s", out);
    /* ttl, conditional writes and consistency */
    cr_assert_eq(sh("$K put t v --ttl 60000 && $K ttl t && $K ttl dash", out, sizeof(out)), 0, "%s",
                 out);
    long left = strtol(strchr(out, '\n') + 1, NULL, 10);
    cr_expect(left > 50000 && left <= 60000, "remaining ttl %ld: %s", left, out);
    cr_expect(strstr(out, "none") != NULL, "%s", out);
    cr_expect_eq(sh("$K put t w --if-absent", out, sizeof(out)), 3, "%s", out);
    cr_expect(strstr(out, "ALREADY_EXISTS") != NULL, "%s", out);
    cr_expect_eq(sh("$K put t w --if-version 12", out, sizeof(out)), 3, "%s", out);
    cr_expect(strstr(out, "FAILED_PRECONDITION") != NULL, "%s", out);
    cr_expect_eq(sh("$K put t w --if-version x12", out, sizeof(out)), 2, "%s", out);
    cr_expect_eq(sh("$K get t --consistency all", out, sizeof(out)), 0, "%s", out);
    cr_expect_str_eq(out, "v\n");
    /* batch: results in order, one line each */
    cr_assert_eq(sh("printf 'put a 1\\nget a\\ndel a\\nget a\\n# c\\n\\nget missing\\n' | $K batch",
                    out, sizeof(out)),
                 0, "%s", out);
    cr_expect_str_eq(out, "OK\n1\n1\n(not found)\n(not found)\n");
    cr_expect_eq(sh("printf 'frob a\\n' | $K batch", out, sizeof(out)), 2, "%s", out);
    cr_expect(strstr(out, "line 1") != NULL, "%s", out);
    /* addresses without a scheme get a hint; --version; per-command --help */
    cr_expect_eq(sh("$K --router 127.0.0.1:1 get a", out, sizeof(out)), 2, "%s", out);
    cr_expect(strstr(out, "tcp://HOST:PORT") != NULL, "%s", out);
    cr_expect_eq(sh("$K --version", out, sizeof(out)), 0, "%s", out);
    cr_expect(strncmp(out, "kvctl ", 6) == 0 && !strstr(out, "commands:"), "%s", out);
    cr_expect_eq(sh("$K put --help", out, sizeof(out)), 0, "%s", out);
    cr_expect(strstr(out, "--if-absent") != NULL && !strstr(out, "hotkeys"), "%s", out);
    kvt_cluster_stop(&cl);
}

Test(kvctl, status_fails_when_a_node_is_unreachable, .timeout = 120)
{
    cr_assert_eq(kvt_cluster_start(&cl, 3, 3, NULL), KV_OK, "logs in %s", cl.dir);
    char out[8192];
    cr_assert_eq(kvctl("--json status", out, sizeof(out)), 0, "%s", out);
    cr_expect(strstr(out, "\"puts\":0") != NULL || strstr(out, "\"puts\":") != NULL, "%s", out);
    cr_expect(strstr(out, "\"uptime_ms\":\"") == NULL, "numbers are numbers: %s", out);
    kvt_kill_node(&cl, 1, SIGKILL);
    cr_expect_eq(kvctl("status", out, sizeof(out)), 3, "%s", out);
    cr_expect(strstr(out, "unreachable") != NULL && strstr(out, "did not answer") != NULL, "%s",
              out);
    kvt_cluster_stop(&cl);
}

/* Reads a file into buf (NUL-terminated; empty when missing). */
static void slurp(const char *path, char *buf, size_t len)
{
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = '\0';
    fclose(f);
}

/* A command started before its address listens waits for the connection
 * for its --timeout, not for the channels' default 1 s: a dial or a TLS
 * handshake slowed by a loaded host is not a failure. Both paths: admin
 * calls (ping) and the client library (get). */
Test(kvctl, waits_its_timeout_for_a_late_listener, .timeout = 120)
{
    char dir[] = "/tmp/hotkv-late-XXXXXX";
    cr_assert(mkdtemp(dir));
    char url[64], cmd[2048], ping[300], get[300], a[4096], b[4096];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", kvt_free_port());
    snprintf(ping, sizeof(ping), "%s/ping.out", dir);
    snprintf(get, sizeof(get), "%s/get.out", dir);
    const char *k = kvt_bin("client/kvctl");
    snprintf(cmd, sizeof(cmd),
             "(%s --router %s --timeout 20000 ping > %s 2>&1; echo \"rc=$?\" >> %s) & "
             "(%s --router %s --timeout 20000 get k > %s 2>&1; echo \"rc=$?\" >> %s) &",
             k, url, ping, ping, k, url, get, get);
    cr_assert_eq(system(cmd), 0);
    usleep(2500 * 1000); /* well past the default first-connection wait */
    pid_t pid = kvt_node_start(dir, "s1", url, NULL);
    cr_assert_gt(pid, 0, "node did not start; log in %s", dir);
    for (int i = 0; i < 300; i++) { /* both commands end (bounded: 30 s) */
        slurp(ping, a, sizeof(a));
        slurp(get, b, sizeof(b));
        if (strstr(a, "rc=") && strstr(b, "rc="))
            break;
        usleep(100 * 1000);
    }
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    kvt_forget(pid);
    cr_assert(strstr(a, "PONG") && strstr(a, "rc=0"), "ping waited for the node: %s", a);
    cr_assert(strstr(b, "rc="), "get ended: %s", b);
    cr_assert(!strstr(b, "no connection"), "get waited for the node: %s", b);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* kvctl backup and restore: a backup of one cluster restored into a new,
 * differently shaped one gives back every live key with its value (binary
 * ones too) and remaining TTL, skips a key that expired in between, and a
 * damaged, truncated or foreign file is refused before anything is written. */
Test(kvctl, backup_restores_into_a_new_cluster, .timeout = 180)
{
    char keep[] = "/tmp/hotkv-backup-XXXXXX", out[16384], cmd[2048];
    cr_assert_not_null(mkdtemp(keep));
    cr_assert_eq(kvt_cluster_start(&cl, 3, 2, NULL), KV_OK, "logs in %s", cl.dir);
    snprintf(cmd, sizeof(cmd),
             "for i in $(seq 1000 3499); do echo \"put k$i v$i-$(printf %%0100d $i)\"; done > "
             "%s/ops && $K batch %s/ops > /dev/null && "
             "$K --hex put 00ff01 000102ff && $K put keeps v --ttl 600000 && "
             "$K put goes v --ttl 8000 && $K backup %s/bk && $K backup --prefix k10 %s/bk10",
             keep, keep, keep, keep);
    cr_assert_eq(sh(cmd, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "backed up 2503 keys"), "%s", out);
    cr_assert(strstr(out, "backed up 100 keys"), "--prefix k10 is k1000..k1099: %s", out);
    snprintf(cmd, sizeof(cmd), "$K backup - > %s/bk-stdout && head -c 8 %s/bk-stdout", keep, keep);
    cr_assert_eq(sh(cmd, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "backed up 2503 keys (") && strstr(out, "to stdout"), "%s", out);
    cr_assert(strstr(out, "HKVBACK1"), "the backup went to stdout: %s", out);
    /* what the restore must give back: the scan once "goes" has expired (8 s
     * after its put: long enough to be in the backup on a loaded host) */
    snprintf(cmd, sizeof(cmd),
             "for i in $(seq 100); do $K get goes > /dev/null 2>&1 || break; sleep 0.2; done; "
             "$K --hex scan --limit 100000 > %s/want && wc -l < %s/want && "
             "{ $K get goes; echo \"get goes: $?\"; }",
             keep, keep);
    cr_assert_eq(sh(cmd, out, sizeof(out)), 0, "%s", out);
    cr_assert_eq(strtol(out, NULL, 10), 2502, "%s", out);
    cr_assert(strstr(out, "get goes: 1"), "goes expired: %s", out);
    kvt_cluster_stop(&cl);

    cr_assert_eq(kvt_cluster_start(&cl, 4, 3, NULL), KV_OK, "logs in %s", cl.dir);
    /* refused before anything is written: a flipped byte, a cut file, a
     * foreign file, a missing one, stdin */
    snprintf(cmd, sizeof(cmd),
             "cp %s/bk bad && printf 'X' | dd of=bad bs=1 seek=100000 conv=notrunc 2>/dev/null "
             "&& $K restore bad",
             keep);
    cr_assert_eq(sh(cmd, out, sizeof(out)), 3, "%s", out);
    cr_assert(strstr(out, "DATA_LOSS") && strstr(out, "checksum mismatch") &&
                  strstr(out, "nothing was written"),
              "%s", out);
    snprintf(cmd, sizeof(cmd), "head -c 200000 %s/bk > cut && $K restore cut", keep);
    cr_assert_eq(sh(cmd, out, sizeof(out)), 3, "%s", out);
    cr_assert(strstr(out, "DATA_LOSS") && strstr(out, "ends inside"), "%s", out);
    snprintf(cmd, sizeof(cmd), "head -c -28 %s/bk > noend && $K restore noend", keep);
    cr_assert_eq(sh(cmd, out, sizeof(out)), 3, "%s", out);
    cr_assert(strstr(out, "without its end marker"), "%s", out);
    cr_assert_eq(sh("echo hello > foreign && $K restore foreign", out, sizeof(out)), 2, "%s", out);
    cr_assert(strstr(out, "not a hotkv backup"), "%s", out);
    cr_assert_eq(sh("$K restore /nonexistent/bk", out, sizeof(out)), 2, "%s", out);
    cr_assert(strstr(out, "cannot open"), "%s", out);
    cr_assert_eq(sh("$K restore -", out, sizeof(out)), 2, "%s", out);
    cr_assert_eq(sh("$K scan --limit 10 | wc -l", out, sizeof(out)), 0, "%s", out);
    cr_assert_eq(strtol(out, NULL, 10), 0, "a refused restore wrote nothing: %s", out);

    snprintf(cmd, sizeof(cmd), "$K restore %s/bk --consistency all", keep);
    cr_assert_eq(sh(cmd, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "restored 2502 keys") && strstr(out, "1 had expired"), "%s", out);
    snprintf(cmd, sizeof(cmd),
             "$K --hex scan --limit 100000 > got && cmp got %s/want && echo same && "
             "$K --hex get 00ff01 && $K ttl keeps && $K get k2345",
             keep);
    cr_assert_eq(sh(cmd, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "same\n000102ff\n"), "every key and value came back: %s", out);
    char *ttl = strstr(out, "000102ff\n") + 9;
    long left = strtol(ttl, NULL, 10);
    cr_assert(left > 500000 && left <= 600000, "keeps kept its remaining ttl: %ld: %s", left, out);
    cr_assert(strstr(out, "v2345-0000"), "%s", out);
    /* a restore over the keys again is the same cluster */
    snprintf(cmd, sizeof(cmd),
             "$K --json restore %s/bk10 && $K --hex scan --limit 100000 > got && cmp got %s/want "
             "&& echo same",
             keep, keep);
    cr_assert_eq(sh(cmd, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "\"keys\":100,\"expired\":0}") && strstr(out, "same"), "%s", out);
    kvt_cluster_stop(&cl);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", keep);
    cr_assert_eq(system(cmd), 0);
}
