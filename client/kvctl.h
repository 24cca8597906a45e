/* SPDX-License-Identifier: MIT */
/* kvctl internals: the command table and the shared environment. */
#ifndef KV_CLIENT_KVCTL_H
#define KV_CLIENT_KVCTL_H

#include <stdbool.h>

#include "kv/kv.h"
#include "kv/kv_err.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"
#include "proto/rpc_sec.h"
#include "shard/clustermap.h"

enum {
    KVCTL_OK = 0,
    KVCTL_NOT_FOUND = 1,
    KVCTL_USAGE = 2,
    KVCTL_SERVER = 3,
    KVCTL_INTERRUPTED = 130
};

typedef struct kvctl_env {
    char *router;
    rpc_sec sec;      /* --auth*, --admin-auth*, --tls-* */
    const char *auth; /* the token sent: the admin token when given, else the data token */
    const rpc_tls *tls;
    bool json;
    bool verbose;
    long timeout_ms;
    long ttl_ms;
    long rf;
    long top;
    bool watch;
    long weight;        /* node add: the new node's weight */
    long stream_mbps;   /* node *, repair: stream throttle (0 = the nodes' --stream-mbps) */
    char *ranges;       /* repair: LO:HI[,LO:HI...] */
    bool no_wait;       /* node *, repair: start and return without waiting */
    bool sign_unsigned; /* cluster sign: build on the current map although it is not signed */
    int consistency;    /* get/put/del: index into default|one|quorum|all */
    bool raw, hex, if_absent;
    char *output;     /* get: write the value to this file */
    char *file;       /* put: read the value from this file */
    char *if_version; /* put/del: compare-and-set version (decimal) */
    char *prefix;     /* scan: keys beginning with this */
    char *start;      /* scan: keys from this one on */
    char *cursor;     /* scan: continue after this cursor (hex, as printed) */
    long limit;       /* scan: keys to print (0 = 100) */
    bool keys_only;   /* scan: no values */
} kvctl_env;

typedef int (*kvctl_fn)(kvctl_env *env, int argc, char **argv);

typedef struct kvctl_cmd {
    const char *name;
    kvctl_fn fn;
    int min_args, max_args;
    const char *usage;
} kvctl_cmd;

/* Prints "kvctl: NAME: message" to stderr and returns KVCTL_SERVER. */
int kvctl_fail(kv_err rv, const char *msg);
/* Prints s as a JSON string literal (escaped) to stdout. */
void kvctl_json_str(const char *s, size_t len);
/* Prints "field":"text" when data is printable UTF-8, else
 * "field_b64":"base64" (JSON strings must be valid UTF-8). */
void kvctl_json_bytes(const char *field, const void *data, size_t len);
/* True when data is valid UTF-8 without control characters (tab and
 * newline allowed). */
bool kvctl_utf8_text(const void *data, size_t len);
/* A key given on the command line (hex-decoded with --hex); *out malloc'ed. */
int kvctl_key_arg(kvctl_env *env, const char *s, uint8_t **out, size_t *len);
/* Hex text s decoded into *out (malloc'ed); prints a usage error naming what. */
int kvctl_unhex(const char *what, const char *s, uint8_t **out, size_t *len);
/* The level --consistency names (KV_CONSISTENCY_DEFAULT without it). */
kv_consistency kvctl_consistency(const kvctl_env *env);
/* Bytes to stdout as they are, or in hex with --hex. */
void kvctl_print_bytes(const kvctl_env *env, const uint8_t *p, size_t n);
void kvctl_print_hex(const uint8_t *p, size_t n);
/* False (with a hint printed) when addr lacks a scheme (tcp://). */
bool kvctl_addr_ok(const char *addr);

/* ---- kvctl_rpc.c ---- */
/* Client options with env's token and TLS files (for kv_client_open). */
kv_client_opts kvctl_client_opts(const kvctl_env *env);
/* A channel to addr; NULL (message printed) for a bad address. The first
 * connection is waited for up to --timeout when addr is --router's, else
 * 1 s (RPC_CONNECT_WAIT_MS): a node of the map that is down fails fast. */
rpc_chan *kvctl_open_chan(kvctl_env *env, const char *addr);
/* kvctl_open_chan for an address named on the command line (cluster init's
 * nodes, the node that node add or replace brings in): --timeout to connect. */
rpc_chan *kvctl_open_named(kvctl_env *env, const char *addr);
/* Calls method (deadline 0 = --timeout); on failure prints the status
 * unless quiet and returns KVCTL_SERVER (rep freed). */
int kvctl_call(kvctl_env *env, rpc_chan *ch, const char *method, const ProtobufCMessage *req,
               uint32_t deadline_ms, rpc_reply *rep, bool quiet);
/* Fetches the map from ch: *out = NULL when the peer has none. */
int kvctl_fetch_map(kvctl_env *env, rpc_chan *ch, cmap **out, bool quiet);
/* m as a kv.ClusterMap for admin.SetMap, signed with the map key when kvctl
 * has one (--map-key-file, $KV_MAP_KEY). Free with free_unpacked. */
kv_err kvctl_map_pb(const kvctl_env *env, const cmap *m, Kv__ClusterMap **out);
/* kvctl cluster sign: installs the current map again, one epoch later and
 * signed with the map key, on every node (compare-and-set, like a
 * membership change). Turns signing on for a cluster made without a key. */
int kvctl_cluster_sign(kvctl_env *env);
/* The newest map: the router's (or node's) at --router, then any newer one
 * its nodes hold (a router learns a change within its refresh period).
 * Fails (message printed) when there is no map. */
int kvctl_fetch_latest_map(kvctl_env *env, cmap **out);
/* Pings ch; NULL on failure. *ms (may be NULL) gets the round trip. */
Kv__PingReply *kvctl_ping_rpc(kvctl_env *env, rpc_chan *ch, double *ms, bool quiet);
/* "serving", "catching_up", ... for a Kv__Serving. */
const char *kvctl_serving_name(int s);

/* ---- kvctl_scan.c ---- */
/* What a kv.Scan page asks for (kvctl_scan_page). */
typedef struct kvctl_scan_q {
    const uint8_t *prefix;
    size_t plen;
    const uint8_t *start;
    size_t slen;
    uint32_t limit;
    bool keys_only;
} kvctl_scan_q;
/* One kv.Scan page after *cursor (malloc'ed, *clen bytes; NULL/0 at the
 * start) into *out (free with kv__scan_reply__free_unpacked). When the page
 * is not the last, *cursor is replaced by the page's cursor. On failure
 * prints the status and returns KVCTL_SERVER. */
int kvctl_scan_page(kvctl_env *env, rpc_chan *ch, const kvctl_scan_q *q, uint8_t **cursor,
                    size_t *clen, Kv__ScanReply **out);

int kvctl_get(kvctl_env *env, int argc, char **argv);
int kvctl_put(kvctl_env *env, int argc, char **argv);
int kvctl_del(kvctl_env *env, int argc, char **argv);
int kvctl_ttl(kvctl_env *env, int argc, char **argv);
int kvctl_batch(kvctl_env *env, int argc, char **argv);
int kvctl_scan(kvctl_env *env, int argc, char **argv);
int kvctl_status(kvctl_env *env, int argc, char **argv);
int kvctl_ring(kvctl_env *env, int argc, char **argv);
int kvctl_ping(kvctl_env *env, int argc, char **argv);
int kvctl_cluster(kvctl_env *env, int argc, char **argv);
int kvctl_hotkeys(kvctl_env *env, int argc, char **argv);
int kvctl_nhc(kvctl_env *env, int argc, char **argv);
int kvctl_node(kvctl_env *env, int argc, char **argv);
int kvctl_repair(kvctl_env *env, int argc, char **argv);
int kvctl_backup(kvctl_env *env, int argc, char **argv);
int kvctl_restore(kvctl_env *env, int argc, char **argv);

#endif
