/* SPDX-License-Identifier: MIT */
/*
 * Shared by the RPC harnesses (fuzz_node, fuzz_router, fuzz_envelope): a
 * driver that runs a program of calls against a method table in-process
 * (each call [u8 method][u8 epoch choice][u16 length][body], handed to the
 * handler with an rpc_ctx as rpc_server.c would), and the checks every reply
 * must pass: a known status code; an OK body that parses as the method's
 * reply message; a FAILED_PRECONDITION body that is a valid cluster map
 * (nodes only); with fz_strict(), valid UTF-8 in the status message and in
 * every string field of the reply (issue 16 item 9).
 *
 * Safety: these harnesses link with -Wl,--wrap for nng_dialer_create,
 * nng_listener_create, nng_stream_dialer_alloc and rpc_loop_connect
 * (fuzz_rpc.c): a URL that is not inproc:// is replaced by an address
 * nobody listens on (inproc, or a Unix socket path that does not exist for
 * a stream dial), and a connect on hotkv's own loops is refused at once,
 * so a fuzzed cluster map or stream job never makes the process dial a real
 * host, nor a port of a test cluster running on the same machine. The
 * exceptions are the scripted peers: tcp://127.0.0.1:1 .. :FZ_PEERS are
 * sent to fz_peers_start's inproc listeners, or, for a channel on a byte
 * stream or a loop (rpc_chan's modes for tcp://), to the ephemeral loopback
 * port each peer also listens on. nng_stream_listener_alloc and
 * rpc_loop_listen fail the input: a harness listens on nothing but inproc.
 * rpc_chan_open is wrapped too: the channels it opens wait 1 ms, not a
 * second, for a first connection.
 */
#ifndef KV_TESTS_FUZZ_RPC_H
#define KV_TESTS_FUZZ_RPC_H

#include <protobuf-c/protobuf-c.h>

#include "fuzz_util.h"
#include "proto/rpc.h"

/* Test maps, node i at tcp://127.0.0.1:i (a scripted peer): FZ_MAP_ONE is
 * n1 alone (rf 1, epoch 1), FZ_MAP_THREE n1..n3 (rf 2, epoch 1),
 * FZ_MAP_JOINING those three and n4 joining in an "add" transition with one
 * stream (epoch 2). The caller owns the reference. */
enum { FZ_MAP_ONE = 1, FZ_MAP_THREE = 2, FZ_MAP_JOINING = 3 };
struct cmap;
struct cmap *fz_test_map(int which);

/* The reply message of a method, NULL when unknown. */
const ProtobufCMessageDescriptor *fz_reply_desc(const char *method);
/* True when every string field of m (recursively) is valid UTF-8. */
bool fz_pb_strings_ok(const ProtobufCMessage *m);

/* Scripted peers: FZ_PEERS REP sockets (tcp://127.0.0.1:i in a map reaches
 * peer i), each answering its k-th request of an input with reply
 * k % nreplies of the script, the reply's envelope id echoing the request's
 * unless the reply says otherwise. They always answer, and at once (a
 * caller waiting out its deadline would make an input take seconds). They
 * run for the whole process. */
#define FZ_PEERS 3
void fz_peers_start(void);
/* Reads a script from in: [u8 count] then per reply [u8 status][u8 flags:
 * bit 0 wrong id, bit 1 an empty message, bit 2 the body is the whole raw
 * reply message, no envelope][u16 length][body]; resets the per-peer
 * counters. count 0 = peers that are down (every answer UNAVAILABLE). */
void fz_peers_script(fz_in *in);

typedef struct fz_calls {
    const rpc_method *methods;
    size_t n;
    void *user;                          /* rpc_ctx.user */
    uint64_t (*epoch)(void *user);       /* the callee's current map epoch */
    bool node;                           /* FAILED_PRECONDITION bodies are maps */
    void (*after)(void *user, int call); /* run after each call (may be NULL) */
    uint32_t deadline_ms;                /* of each call, 0 = 2000 */
    bool relayed;                        /* OK bodies may be a peer's, unchecked */
} fz_calls;

/* Runs up to max_calls calls from in. */
void fz_run_calls(const fz_calls *t, fz_in *in, int max_calls);
/* Checks one finished call (status, message, and unless relayed the reply
 * body). */
void fz_check_reply(const rpc_ctx *c, kv_err rv, bool node, bool relayed);

#endif
