/* SPDX-License-Identifier: MIT */
/* Process management for the integration tests (see harness.h). */
#include "harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"
#include "tests/kv_testport.h"

const char *const *kvt_router_extra;
const char *const *kvt_node_extra;
kvt_security kvt_sec;

static char tls_path[3][300]; /* peer.crt, peer.key, ca.crt of kvt_sec.tls_dir */
static rpc_tls harness_tls;

const char *kvt_scheme(void)
{
    return kvt_sec.tls_dir ? "tls+tcp" : "tcp";
}

rpc_chan_opts kvt_chan_opts(const char *auth)
{
    /* A call right after open waits for the first connection up to its own
     * deadline (not the library's 1 s): a TLS handshake between two ASan
     * processes on a loaded host takes longer. */
    rpc_chan_opts o = {.auth = kvt_sec.admin_auth ? kvt_sec.admin_auth : auth,
                       .connect_wait_ms = 30000};
    if (kvt_sec.tls_dir) {
        const char *names[3] = {"peer.crt", "peer.key", "ca.crt"};
        for (int i = 0; i < 3; i++)
            snprintf(tls_path[i], sizeof(tls_path[i]), "%s/%s", kvt_sec.tls_dir, names[i]);
        harness_tls = (rpc_tls){tls_path[0], tls_path[1], tls_path[2], false};
        o.tls = &harness_tls;
    }
    return o;
}

bool kvt_make_certs(const char *dir)
{
    char cmd[4096], out[4096];
    snprintf(
        cmd, sizeof(cmd),
        "cd '%s' && for ca in ca evil-ca; do openssl req -x509 -newkey ec -pkeyopt "
        "ec_paramgen_curve:P-256 -nodes -keyout $ca.key -subj \"/CN=hotkv test $ca\" -days 2 "
        "-out $ca.crt || exit 1; done && "
        "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\nextendedKeyUsage=serverAuth,"
        "clientAuth\\n' > ext && "
        "for c in peer:ca evil:evil-ca; do n=${c%%%%:*}; ca=${c#*:}; openssl req -new -newkey ec "
        "-pkeyopt ec_paramgen_curve:P-256 -nodes -keyout $n.key -subj \"/CN=hotkv $n\" -out "
        "$n.csr && openssl x509 -req -in $n.csr -CA $ca.crt -CAkey $ca.key -CAcreateserial "
        "-days 2 -extfile ext -out $n.crt || exit 1; done 2>&1",
        dir);
    return kvt_run(cmd, out, sizeof(out)) == 0;
}

/* Appends kvt_sec's flags for a node, router or kvctl to argv at *n (room
 * for 8 more). */
static void sec_argv(char **argv, int *n)
{
    if (kvt_sec.admin_auth) {
        argv[(*n)++] = "--admin-auth";
        argv[(*n)++] = (char *)kvt_sec.admin_auth;
    }
    if (kvt_sec.tls_dir) {
        kvt_chan_opts(NULL); /* fills tls_path */
        argv[(*n)++] = "--tls-cert";
        argv[(*n)++] = tls_path[0];
        argv[(*n)++] = "--tls-key";
        argv[(*n)++] = tls_path[1];
        argv[(*n)++] = "--tls-ca";
        argv[(*n)++] = tls_path[2];
    }
}

/* The same flags as one shell string (static buffer). */
static const char *sec_shell(void)
{
    static char buf[1200];
    char *argv[8];
    int n = 0;
    sec_argv(argv, &n);
    buf[0] = '\0';
    for (int i = 0; i < n; i++)
        snprintf(buf + strlen(buf), sizeof(buf) - strlen(buf), " '%s'", argv[i]);
    return buf;
}

int kvt_free_port(void)
{
    return kv_test_free_port();
}

/* KV_TEST_ENGINE=kallax: every kvnode the harness starts runs over kallax,
 * with a store of KVT_KALLAX_BLOCKS blocks (32 MiB logical: the tests'
 * records load it lightly). Appends the flags to argv at *n (below cap). */
#define KVT_KALLAX_BLOCKS "8192"

static void engine_args(char **argv, int *n, int cap)
{
    const char *e = getenv("KV_TEST_ENGINE");
    if (!e || strcmp(e, "kallax") != 0 || *n + 4 > cap)
        return;
    argv[(*n)++] = "--engine";
    argv[(*n)++] = "kallax";
    argv[(*n)++] = "--kallax-blocks";
    argv[(*n)++] = KVT_KALLAX_BLOCKS;
}

const char *kvt_bin(const char *rel)
{
    static char path[1024];
    const char *b = getenv("KV_BUILD_DIR");
    snprintf(path, sizeof(path), "%s/%s", b ? b : "build", rel);
    return path;
}

/* Every process a test starts is killed when the test process exits, also
 * after a failed assertion skipped the test's own cleanup (atexit), and when
 * the test dies on a signal or a Criterion timeout (the child's parent-death
 * signal; it fires when the thread that forked exits, so spawn only from the
 * test's main thread, as every kvt_* start function does). */
#define MAX_SPAWNED 64
static pid_t spawned[MAX_SPAWNED];
static int nspawned;

static void kill_spawned(void)
{
    for (int i = 0; i < nspawned; i++)
        if (spawned[i] > 0 && kill(spawned[i], SIGKILL) == 0)
            waitpid(spawned[i], NULL, 0);
}

void kvt_forget(pid_t pid)
{
    for (int i = 0; i < nspawned; i++)
        if (spawned[i] == pid)
            spawned[i] = 0;
}

static pid_t spawn(const char *log, char *const argv[])
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid > 0) {
        if (nspawned == 0)
            atexit(kill_spawned);
        if (nspawned < MAX_SPAWNED)
            spawned[nspawned++] = pid;
    }
    if (pid != 0)
        return pid;
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
        _exit(127); /* the test died before the signal was armed */
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
    }
    execv(argv[0], argv);
    _exit(127);
}

bool kvt_wait_ping(const char *url, const char *auth, int timeout_ms)
{
    rpc_chan *ch;
    rpc_chan_opts o = kvt_chan_opts(auth);
    if (rpc_chan_open(&ch, url, &o) != KV_OK)
        return false;
    uint64_t end = kv_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    bool ok = false;
    while (!ok && kv_now_ns() < end) {
        Kv__PingRequest req = KV__PING_REQUEST__INIT;
        rpc_reply r;
        ok = rpc_call(ch, "admin.Ping", 0, &req.base, 500, &r) == KV_OK;
        rpc_reply_free(&r);
        if (!ok)
            usleep(20000);
    }
    rpc_chan_close(ch);
    return ok;
}

static bool router_has_map(const char *url, const char *auth, int timeout_ms)
{
    rpc_chan *ch;
    rpc_chan_opts o = kvt_chan_opts(auth);
    if (rpc_chan_open(&ch, url, &o) != KV_OK)
        return false;
    uint64_t end = kv_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    bool ok = false;
    while (!ok && kv_now_ns() < end) {
        Kv__GetMapRequest req = KV__GET_MAP_REQUEST__INIT;
        rpc_reply r;
        if (rpc_call(ch, "admin.GetMap", 0, &req.base, 500, &r) == KV_OK) {
            Kv__GetMapReply *g = kv__get_map_reply__unpack(NULL, r.len, r.body);
            ok = g && g->has_map;
            if (g)
                kv__get_map_reply__free_unpacked(g, NULL);
        }
        rpc_reply_free(&r);
        if (!ok)
            usleep(20000);
    }
    rpc_chan_close(ch);
    return ok;
}

/* Spawns node i of c (id n<i+1>, c->node_url[i], data in c->dir). */
static void spawn_node(kvt_cluster *c, int i)
{
    char id[16], dir[300], log[300];
    snprintf(id, sizeof(id), "n%d", i + 1);
    snprintf(dir, sizeof(dir), "%s/%s", c->dir, id);
    snprintf(log, sizeof(log), "%s/%s.log", c->dir, id);
    char *argv[48] = {strdup(kvt_bin("node/kvnode")),
                      "--id",
                      id,
                      "--listen",
                      c->node_url[i],
                      "--data-dir",
                      dir,
                      "--mem-mb",
                      "512",
                      "--auth",
                      (char *)(c->auth ? c->auth : "")};
    int n = 11;
    engine_args(argv, &n, 40);
    sec_argv(argv, &n);
    for (int k = 0; kvt_node_extra && kvt_node_extra[k] && n < 40; k++)
        argv[n++] = (char *)kvt_node_extra[k];
    for (int k = 0; c->node_extra[i] && c->node_extra[i][k] && n < 47; k++)
        argv[n++] = (char *)c->node_extra[i][k];
    argv[n] = NULL;
    c->node_pid[i] = spawn(log, argv);
    free(argv[0]);
}

/* A free port that no address of c uses yet. The kernel may hand out the
 * same free port twice before the first process it went to binds it (CI
 * once started two nodes of a cluster on one port, and cluster init refused
 * the duplicate address). */
static int cluster_port(const kvt_cluster *c)
{
    for (int tries = 0;; tries++) {
        int p = kvt_free_port();
        char url[64];
        snprintf(url, sizeof(url), "%s://127.0.0.1:%d", kvt_scheme(), p);
        bool used = strcmp(url, c->router_url) == 0 || strcmp(url, c->router2_url) == 0;
        for (int i = 0; i < KVT_MAX_NODES && !used; i++)
            used = strcmp(url, c->node_url[i]) == 0;
        if (!used || tries == 100)
            return p;
    }
}

static kv_err start_nodes(kvt_cluster *c)
{
    for (int i = 0; i < c->nnodes; i++) {
        snprintf(c->node_url[i], sizeof(c->node_url[i]), "%s://127.0.0.1:%d", kvt_scheme(),
                 cluster_port(c));
        spawn_node(c, i);
    }
    for (int i = 0; i < c->nnodes; i++)
        if (!kvt_wait_ping(c->node_url[i], c->auth, 10000))
            return KV_UNAVAILABLE;
    return KV_OK;
}

static kv_err init_cluster(kvt_cluster *c)
{
    char cmd[2048];
    int n = snprintf(cmd, sizeof(cmd), "%s --timeout 30000 --auth '%s'%s cluster init --rf %d",
                     kvt_bin("client/kvctl"), c->auth ? c->auth : "", sec_shell(), c->rf);
    for (int i = 0; i < c->nnodes; i++)
        n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, " n%d=%s", i + 1, c->node_url[i]);
    char out[1024];
    return kvt_run(cmd, out, sizeof(out)) == 0 ? KV_OK : KV_INTERNAL;
}

static pid_t start_router(kvt_cluster *c, const char *url, const char *name)
{
    char seeds[1024] = "", log[300];
    for (int i = 0; i < c->nnodes; i++)
        snprintf(seeds + strlen(seeds), sizeof(seeds) - strlen(seeds), "%s%s", i ? "," : "",
                 c->node_url[i]);
    snprintf(log, sizeof(log), "%s/%s.log", c->dir, name);
    char *argv[32] = {
        strdup(kvt_bin("shard/kvrouter")), "--listen", (char *)url, "--seeds", seeds, "--auth",
        (char *)(c->auth ? c->auth : "")};
    int n = 7;
    sec_argv(argv, &n);
    for (int k = 0; kvt_router_extra && kvt_router_extra[k] && n < 31; k++)
        argv[n++] = (char *)kvt_router_extra[k];
    argv[n] = NULL;
    pid_t pid = spawn(log, argv);
    free(argv[0]);
    return pid;
}

kv_err kvt_cluster_start(kvt_cluster *c, int nnodes, int rf, const char *auth)
{
    memset(c, 0, sizeof(*c));
    c->nnodes = nnodes;
    c->rf = rf;
    c->auth = auth;
    snprintf(c->dir, sizeof(c->dir), "/tmp/hotkv-test-XXXXXX");
    if (!mkdtemp(c->dir))
        return KV_INTERNAL;
    kv_err rv = start_nodes(c);
    if (rv == KV_OK)
        rv = init_cluster(c);
    if (rv != KV_OK)
        return rv;
    snprintf(c->router_url, sizeof(c->router_url), "%s://127.0.0.1:%d", kvt_scheme(),
             cluster_port(c));
    c->router_pid = start_router(c, c->router_url, "router");
    return router_has_map(c->router_url, auth, 10000) ? KV_OK : KV_UNAVAILABLE;
}

kv_err kvt_add_router(kvt_cluster *c)
{
    snprintf(c->router2_url, sizeof(c->router2_url), "%s://127.0.0.1:%d", kvt_scheme(),
             cluster_port(c));
    c->router2_pid = start_router(c, c->router2_url, "router2");
    return router_has_map(c->router2_url, c->auth, 10000) ? KV_OK : KV_UNAVAILABLE;
}

static void stop_pid(pid_t pid)
{
    if (pid <= 0)
        return;
    kill(pid, SIGTERM);
    for (int i = 0; i < 100; i++) {
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            kvt_forget(pid);
            return;
        }
        usleep(20000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    kvt_forget(pid);
}

/* True once every thread of pid is stopped (state T or t in its
 * /proc/PID/task/TID/stat); false while one still runs or /proc is not
 * readable. */
static bool all_threads_stopped(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return false;
    bool stopped = true, any = false;
    for (struct dirent *e; stopped && (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char stat[384], buf[256];
        snprintf(stat, sizeof(stat), "%s/%s/stat", path, e->d_name);
        FILE *f = fopen(stat, "r");
        size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
        if (f)
            fclose(f);
        buf[n] = '\0';
        const char *rp = strrchr(buf, ')'); /* the state follows the command name */
        stopped = rp && rp[1] == ' ' && (rp[2] == 'T' || rp[2] == 't');
        any = true;
    }
    closedir(d);
    return stopped && any;
}

void kvt_kill_node(kvt_cluster *c, int i, int sig)
{
    kill(c->node_pid[i], sig);
    /* kill() only queues SIGSTOP: on a loaded machine a node went on
     * answering for a few milliseconds, and a test that stalls it expects
     * the calls it sends next to find it stopped. Wait (up to 5 s) until
     * every thread has stopped. */
    for (int w = 0; sig == SIGSTOP && w < 500 && !all_threads_stopped(c->node_pid[i]); w++)
        usleep(10000);
    if (sig == SIGKILL || sig == SIGTERM) {
        waitpid(c->node_pid[i], NULL, 0);
        kvt_forget(c->node_pid[i]);
        c->node_pid[i] = 0;
    }
}

void kvt_cluster_stop(kvt_cluster *c)
{
    stop_pid(c->router_pid);
    stop_pid(c->router2_pid);
    for (int i = 0; i < c->nnodes; i++)
        stop_pid(c->node_pid[i]);
    char cmd[400], out[16];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", c->dir);
    if (c->dir[0] && !getenv("KV_KEEP_TEST_DATA"))
        kvt_run(cmd, out, sizeof(out));
}

int kvt_run(const char *cmd, char *out, size_t outlen)
{
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    size_t n = fread(out, 1, outlen - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

pid_t kvt_node_start(const char *dir, const char *id, const char *url, const char *const *extra)
{
    char data[400], log[400];
    snprintf(data, sizeof(data), "%s/%s", dir, id);
    snprintf(log, sizeof(log), "%s/%s.log", dir, id);
    char *argv[40] = {strdup(kvt_bin("node/kvnode")),
                      "--id",
                      (char *)id,
                      "--listen",
                      (char *)url,
                      "--data-dir",
                      data};
    int n = 7;
    engine_args(argv, &n, 31);
    sec_argv(argv, &n);
    for (int i = 0; extra && extra[i] && n < 31; i++)
        argv[n++] = (char *)extra[i];
    argv[n] = NULL;
    pid_t pid = spawn(log, argv);
    free(argv[0]);
    if (!kvt_wait_ping(url, NULL, 15000)) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        kvt_forget(pid);
        return -1;
    }
    return pid;
}

kv_err kvt_node_restart(kvt_cluster *c, int i)
{
    if (i < 0 || i > c->nnodes || i >= KVT_MAX_NODES)
        return KV_INVALID_ARGUMENT;
    if (i == c->nnodes) {
        snprintf(c->node_url[i], sizeof(c->node_url[i]), "%s://127.0.0.1:%d", kvt_scheme(),
                 cluster_port(c));
        c->nnodes++;
    }
    spawn_node(c, i);
    return kvt_wait_ping(c->node_url[i], c->auth, 15000) ? KV_OK : KV_UNAVAILABLE;
}

void kvt_node_wipe(kvt_cluster *c, int i)
{
    char cmd[600], out[16];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s/n%d'", c->dir, i + 1);
    kvt_run(cmd, out, sizeof(out));
}

int kvt_kvctl(const kvt_cluster *c, const char *args, char *out, size_t outlen)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "%s --router %s --auth '%s'%s --timeout 10000 %s 2>&1",
             kvt_bin("client/kvctl"), c->router_url, c->auth ? c->auth : "", sec_shell(), args);
    return kvt_run(cmd, out, outlen);
}

kv_err kvt_node_count(const char *url, const char *auth, uint64_t *live, uint64_t *tombs)
{
    rpc_chan *ch;
    rpc_chan_opts o = kvt_chan_opts(auth);
    if (rpc_chan_open(&ch, url, &o) != KV_OK)
        return KV_INVALID_ARGUMENT;
    Kv__Range whole = KV__RANGE__INIT, *rp = &whole;
    Kv__DigestRequest req = KV__DIGEST_REQUEST__INIT;
    req.n_ranges = 1;
    req.ranges = &rp;
    req.leaves = 1;
    rpc_reply r;
    kv_err rv = rpc_call(ch, "admin.Digest", 0, &req.base, 120000, &r);
    Kv__DigestReply *d = rv == KV_OK ? kv__digest_reply__unpack(NULL, r.len, r.body) : NULL;
    if (rv == KV_OK && (!d || d->n_ranges != 1))
        rv = KV_INTERNAL;
    if (rv == KV_OK) {
        *live = d->ranges[0]->live;
        if (tombs)
            *tombs = d->ranges[0]->tombstones;
    }
    if (d)
        kv__digest_reply__free_unpacked(d, NULL);
    rpc_reply_free(&r);
    rpc_chan_close(ch);
    return rv;
}

kv_err kvt_stats(const char *url, const char *auth, const char *node_id, int n,
                 const char *const *names, char (*values)[KVT_STAT_LEN])
{
    for (int k = 0; k < n; k++)
        values[k][0] = '\0';
    rpc_chan *ch;
    rpc_chan_opts o = kvt_chan_opts(auth);
    if (rpc_chan_open(&ch, url, &o) != KV_OK)
        return KV_INVALID_ARGUMENT;
    Kv__StatsRequest req = KV__STATS_REQUEST__INIT;
    req.node_id = (char *)node_id;
    req.verbose = true; /* rpc.* and the per-peer figures are verbose */
    rpc_reply r;
    kv_err rv = rpc_call_retry(ch, "admin.Stats", 0, &req.base, 5000, &r);
    Kv__StatsReply *st = rv == KV_OK ? kv__stats_reply__unpack(NULL, r.len, r.body) : NULL;
    if (rv == KV_OK && !st)
        rv = KV_INTERNAL;
    for (size_t i = 0; st && i < st->n_stats; i++)
        for (int k = 0; k < n; k++)
            if (strcmp(st->stats[i]->name, names[k]) == 0)
                snprintf(values[k], KVT_STAT_LEN, "%s", st->stats[i]->value);
    if (st)
        kv__stats_reply__free_unpacked(st, NULL);
    rpc_reply_free(&r);
    rpc_chan_close(ch);
    return rv;
}

kv_err kvt_stat(const char *url, const char *auth, const char *node_id, const char *name,
                char value[KVT_STAT_LEN])
{
    kv_err rv = kvt_stats(url, auth, node_id, 1, &name, (char(*)[KVT_STAT_LEN])value);
    return rv == KV_OK && !value[0] ? KV_NOT_FOUND : rv;
}

bool kvt_wait_serving(const char *url, const char *auth, int serving, int timeout_ms)
{
    rpc_chan *ch;
    rpc_chan_opts o = kvt_chan_opts(auth);
    if (rpc_chan_open(&ch, url, &o) != KV_OK)
        return false;
    uint64_t end = kv_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    bool ok = false;
    while (!ok && kv_now_ns() < end) {
        Kv__PingRequest req = KV__PING_REQUEST__INIT;
        rpc_reply r;
        if (rpc_call(ch, "admin.Ping", 0, &req.base, 500, &r) == KV_OK) {
            Kv__PingReply *p = kv__ping_reply__unpack(NULL, r.len, r.body);
            ok = p && (int)p->serving == serving;
            if (p)
                kv__ping_reply__free_unpacked(p, NULL);
        }
        rpc_reply_free(&r);
        if (!ok)
            usleep(50000);
    }
    rpc_chan_close(ch);
    return ok;
}

int kvt_node_index(const kvt_cluster *c, const char *id)
{
    int i;
    return sscanf(id, "n%d", &i) == 1 && i >= 1 && i <= c->nnodes ? i - 1 : -1;
}

pid_t kvt_kvctl_spawn(const kvt_cluster *c, const char *const *args, const char *log)
{
    char *argv[40] = {strdup(kvt_bin("client/kvctl")), "--router", (char *)c->router_url, "--auth",
                      (char *)(c->auth ? c->auth : "")};
    int n = 5;
    sec_argv(argv, &n);
    for (int i = 0; args[i] && n < 39; i++)
        argv[n++] = (char *)args[i];
    argv[n] = NULL;
    pid_t pid = spawn(log, argv);
    free(argv[0]);
    return pid;
}
