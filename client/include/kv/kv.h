/* SPDX-License-Identifier: MIT */
/*
 * libkvclient: the C client of hotkv.
 *
 *     kv_client *c;
 *     if (kv_client_open(&c, "tcp://127.0.0.1:7000", NULL) != KV_OK) ...
 *     kv_put(c, "k", 1, "v", 1, NULL, NULL);
 *     kv_value v;
 *     if (kv_get(c, "k", 1, &v) == KV_OK) { use(v.data, v.len); kv_value_free(&v); }
 *     kv_client_close(c);
 *
 * A client talks to one or more routers (or nodes) and fails over to the
 * next address when the current one is unreachable. Every function returns
 * a kv_err (gRPC numbering, see kv/kv_err.h); out-parameters are written
 * only on success. A kv_client may be shared by any number of threads.
 */
#ifndef KV_KV_H
#define KV_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/kv_err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kv_client kv_client;

typedef enum kv_consistency {
    KV_CONSISTENCY_DEFAULT = 0, /* reads ONE, writes QUORUM */
    KV_CONSISTENCY_ONE = 1,
    KV_CONSISTENCY_QUORUM = 2,
    KV_CONSISTENCY_ALL = 3,
} kv_consistency;

typedef struct kv_client_opts {
    /* Per-call deadline (default 5000). A call made before its address has
     * connected (right after kv_client_open) waits for the connection
     * within it: up to the deadline divided by the number of addresses
     * given (at least 1 s, never past the deadline), or while a connection
     * to it is still in its (TLS) handshake, before it fails over to the
     * next address. */
    uint32_t timeout_ms;
    const char *auth; /* data token (NULL = none; $KV_AUTH is not read here); copied */
    /* Smart client: learn the cluster map (from the given routers or nodes,
     * refreshed every few seconds and whenever a reply shows a newer one)
     * and send each request straight to its key's primary replica (the
     * next replica when it cannot be reached), which coordinates it as a
     * router would: same consistency levels, versions given by the node.
     * Until the map is known, and when no replica can be reached, requests
     * go to the given addresses. A batch goes to the first op's replica. */
    bool direct;
    /* The admin token (NULL = none), sent instead of auth when set: only
     * admin tools need it (admin.* methods). Copied. */
    const char *admin_auth;
    /* TLS for tls+tcp:// addresses (PEM file names, read at open): the CA
     * the servers' certificates must chain to (required for tls+tcp://),
     * and a client certificate and its key for servers that require one
     * (mutual TLS). NULL = none. */
    const char *tls_cert, *tls_key, *tls_ca;
    /* Smart client: the cluster's map key (the contents of kvctl's
     * --map-key-file; NULL = none). With it, only maps signed with that key
     * are used; without it, maps are checked for plausibility only (use TLS
     * with tls_ca). Copied. */
    const char *map_key;
} kv_client_opts;

/* Opens a client for "tcp://host:port[,tcp://host2:port]". opts may be NULL.
 * Returns INVALID_ARGUMENT for an empty or malformed address list. The
 * connection is made in the background; the first call waits for it within
 * its deadline. On success *out is the caller's; close it with
 * kv_client_close(). */
KV_API kv_err kv_client_open(kv_client **out, const char *routers, const kv_client_opts *opts);
/* Closes the client; in-flight async calls complete with CANCELLED first.
 * NULL is a no-op. Must not be called from a completion callback. */
KV_API void kv_client_close(kv_client *c);

/* A value returned by kv_get: data is malloc'ed and owned by the caller,
 * released with kv_value_free(). */
typedef struct kv_value {
    uint8_t *data;
    size_t len;
    uint64_t version;      /* HLC version of the record */
    uint64_t expire_at_ms; /* wall-clock ms at which it expires, 0 = never */
} kv_value;
KV_API void kv_value_free(kv_value *v);

/* The message of the last failed call on this thread ("" when none). */
KV_API const char *kv_last_error(void);

/* Reads key. Returns KV_OK and fills *out, or NOT_FOUND when the key is
 * missing, deleted or expired, or another error. */
KV_API kv_err kv_get(kv_client *c, const void *key, size_t klen, kv_value *out);
/* kv_get with a consistency level (QUORUM/ALL return the newest version). */
KV_API kv_err kv_get_ex(kv_client *c, const void *key, size_t klen, kv_consistency cons,
                        kv_value *out);

typedef struct kv_put_opts {
    uint64_t ttl_ms;     /* 0 = no expiry */
    uint64_t if_version; /* write only if the current version is this (CAS) */
    bool if_absent;      /* write only if the key does not exist */
    kv_consistency consistency;
} kv_put_opts;

/* Writes key = val. opts may be NULL. *version_out (may be NULL) receives
 * the version written. Errors: ALREADY_EXISTS (if_absent), FAILED_PRECONDITION
 * (if_version mismatch; or a client without `direct` whose address is a node
 * of a cluster with rf > 1: writes go through routers, or direct),
 * INVALID_ARGUMENT (limits), UNAVAILABLE. */
KV_API kv_err kv_put(kv_client *c, const void *key, size_t klen, const void *val, size_t vlen,
                     const kv_put_opts *opts, uint64_t *version_out);

typedef struct kv_delete_opts {
    uint64_t if_version;
    kv_consistency consistency;
} kv_delete_opts;

/* Deletes key. *existed (may be NULL) says whether a live record existed. */
KV_API kv_err kv_delete(kv_client *c, const void *key, size_t klen, const kv_delete_opts *opts,
                        bool *existed);

typedef enum kv_op_type { KV_OP_GET = 0, KV_OP_PUT = 1, KV_OP_DELETE = 2 } kv_op_type;

/* One operation of a batch: the caller fills the inputs; kv_batch fills the
 * results. value is malloc'ed (GETs that found a record) and released by
 * kv_batch_free(). */
typedef struct kv_op {
    kv_op_type type;
    const void *key;
    size_t klen;
    const void *val;
    size_t vlen;
    uint64_t ttl_ms;
    /* results */
    kv_err status;
    bool found;
    uint8_t *value;
    size_t value_len;
    uint64_t version;
} kv_op;

/* Runs n operations in one request (split by owner at the router). Returns
 * KV_OK when the batch was processed: each op then has its own status.
 * Otherwise no op result is written. */
KV_API kv_err kv_batch(kv_client *c, kv_op *ops, size_t n, kv_consistency cons);
/* Frees the values kv_batch returned in ops. */
KV_API void kv_batch_free(kv_op *ops, size_t n);

/* Result of an async call, valid only during the callback: copy what you
 * keep. */
typedef struct kv_result {
    bool found;           /* get: found; delete: existed */
    const uint8_t *value; /* get */
    size_t len;
    uint64_t version;
    const char *message; /* error detail, NULL on success */
} kv_result;

/* Completion callback: called exactly once per async call, from a library
 * thread (or from the calling thread when the call fails before it is
 * sent), with no library lock held. It must not block or close the client.
 * Async calls in flight together are not ordered with respect to each other
 * (they may travel in one message and run in parallel): to write a key after
 * another write of it, start the second from the first's completion. */
typedef void (*kv_done_fn)(void *arg, kv_err err, const kv_result *res);

KV_API void kv_get_async(kv_client *c, const void *key, size_t klen, kv_done_fn done, void *arg);
KV_API void kv_put_async(kv_client *c, const void *key, size_t klen, const void *val, size_t vlen,
                         const kv_put_opts *opts, kv_done_fn done, void *arg);
KV_API void kv_delete_async(kv_client *c, const void *key, size_t klen, kv_done_fn done, void *arg);

/* A burst: the async calls this thread starts between kv_burst_begin() and
 * kv_burst_end() leave together, one message per connection, when the burst
 * ends (or behind the message already in flight there). Without one, a
 * client that starts many calls at once sends the first alone and the rest
 * together after its reply. Use it around a loop that starts calls, e.g.
 * the restart of every call whose completion came in; do not block inside
 * it (its calls wait for the end, with no timer to send them: every begin
 * needs its end) or close a client it used. Bursts nest: the outermost end
 * sends. A completion callback runs inside one already:
 * the calls it starts leave with those of the other completions of its
 * message. */
KV_API void kv_burst_begin(void);
KV_API void kv_burst_end(void);

#ifdef __cplusplus
}
#endif
#endif
