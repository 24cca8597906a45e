/* SPDX-License-Identifier: MIT */
/*
 * Integration-test harness: starts real kvnode/kvrouter processes on free
 * loopback ports (binaries from $KV_BUILD_DIR), initialises the cluster with
 * the real kvctl, and tears everything down. Logs go to a temporary
 * directory that is printed when a test fails.
 */
#ifndef KV_TESTS_HARNESS_H
#define KV_TESTS_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kv/kv_err.h"
#include "proto/rpc.h"

#define KVT_MAX_NODES 8

/* Extra flags for the routers and nodes kvt_cluster_start starts
 * (NULL-terminated; NULL = none). Set before starting. */
extern const char *const *kvt_router_extra;
extern const char *const *kvt_node_extra;

/* Security of what the harness starts (set before starting; zero = only
 * the data token given to kvt_cluster_start). */
typedef struct kvt_security {
    const char *admin_auth; /* --admin-auth of nodes, routers and kvctl (NULL = none) */
    const char *tls_dir;    /* kvt_make_certs' directory: tls+tcp:// URLs, and every process
                               (the harness's own calls too) uses peer.crt with ca.crt */
} kvt_security;
extern kvt_security kvt_sec;

/* Makes, with openssl, in dir: ca.crt/ca.key (the cluster's CA), peer.crt/
 * peer.key (a certificate it signed), evil-ca.crt and evil.crt/evil.key (a
 * certificate of another CA). False when openssl failed. */
bool kvt_make_certs(const char *dir);
/* The options of the harness's own channels: the admin token when kvt_sec
 * has one (else auth), kvt_sec's TLS files, and a first-connection wait
 * bounded by each call's deadline only. The strings live in static
 * storage. */
rpc_chan_opts kvt_chan_opts(const char *auth);
/* "tcp" or "tls+tcp" (kvt_sec.tls_dir). */
const char *kvt_scheme(void);

typedef struct kvt_cluster {
    int nnodes, rf;
    const char *const *node_extra[KVT_MAX_NODES]; /* per-node extra flags on (re)start */
    const char *auth;
    char dir[256];
    char router_url[64];
    char node_url[KVT_MAX_NODES][64];
    pid_t node_pid[KVT_MAX_NODES];
    pid_t router_pid;
    char router2_url[64];
    pid_t router2_pid;
} kvt_cluster;

/* Starts a second router for c (c->router2_url). */
kv_err kvt_add_router(kvt_cluster *c);

/* A TCP port that was free a moment ago on 127.0.0.1. */
int kvt_free_port(void);
/* Path of a built binary, e.g. kvt_bin("client/kvctl"). Static buffer. */
const char *kvt_bin(const char *rel);
/* Starts nnodes nodes (extra node flags may be NULL), runs cluster init with
 * rf, then the router. Returns KV_OK when the router serves the map. */
kv_err kvt_cluster_start(kvt_cluster *c, int nnodes, int rf, const char *auth);
void kvt_cluster_stop(kvt_cluster *c);
/* Sends sig to node i (0-based); for SIGSTOP returns once every thread of it
 * has stopped (up to 5 s), for SIGKILL/SIGTERM reaps it. */
void kvt_kill_node(kvt_cluster *c, int i, int sig);
/* Waits until url answers admin.Ping (timeout_ms). */
bool kvt_wait_ping(const char *url, const char *auth, int timeout_ms);
/* Starts one kvnode (no cluster map: it serves every key) with the given
 * extra flags (NULL-terminated, may be NULL), logging to dir/ID.log. Returns
 * its pid once it answers admin.Ping, or -1. */
pid_t kvt_node_start(const char *dir, const char *id, const char *url, const char *const *extra);

/* Tells the harness a process it started was reaped by the caller (so the
 * exit-time cleanup does not signal a reused pid). */
void kvt_forget(pid_t pid);

/* Runs a shell command line; captures stdout (and stderr when err is set)
 * into out. Returns the exit status, or -1. */
int kvt_run(const char *cmd, char *out, size_t outlen);

/* ---- membership and repair tests ---- */

/* Starts node i (id n<i+1>) of c again with its data dir and address, or
 * (i == c->nnodes) a new node n<i+1> on a fresh port and data dir, which
 * becomes part of c (c->nnodes grows) but not of the cluster map. Returns
 * KV_OK once it answers admin.Ping. */
kv_err kvt_node_restart(kvt_cluster *c, int i);
/* Deletes node i's data dir (the node must be stopped). */
void kvt_node_wipe(kvt_cluster *c, int i);
/* Runs `kvctl --router ROUTER --auth TOKEN ARGS` (ARGS a shell word list);
 * stdout (and stderr) into out. Returns the exit status. */
int kvt_kvctl(const kvt_cluster *c, const char *args, char *out, size_t outlen);
/* Live records and tombstones node url holds (admin.Digest over the whole
 * ring). Returns KV_OK or the call's error. */
kv_err kvt_node_count(const char *url, const char *auth, uint64_t *live, uint64_t *tombs);
/* n statistics from one admin.Stats (verbose) reply, so counters that move
 * together are read together: of the process at url, or of node node_id
 * through the router at url. values[k] gets names[k]'s value, "" when the
 * reply has none. Returns KV_OK or the call's error (values all ""). */
#define KVT_STAT_LEN 64
kv_err kvt_stats(const char *url, const char *auth, const char *node_id, int n,
                 const char *const *names, char (*values)[KVT_STAT_LEN]);
/* One statistic as kvt_stats; KV_NOT_FOUND when the reply has none. */
kv_err kvt_stat(const char *url, const char *auth, const char *node_id, const char *name,
                char value[KVT_STAT_LEN]);
/* Waits until url reports Serving `serving` (Kv__Serving) in admin.Ping. */
bool kvt_wait_serving(const char *url, const char *auth, int serving, int timeout_ms);
/* Starts kvctl ARGS (argv, NULL-terminated, after --router/--auth) in the
 * background, output to log; returns its pid (reap it with waitpid). */
pid_t kvt_kvctl_spawn(const kvt_cluster *c, const char *const *args, const char *log);
/* Index of node id in c, or -1. */
int kvt_node_index(const kvt_cluster *c, const char *id);

#endif
