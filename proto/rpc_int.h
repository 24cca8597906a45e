/* SPDX-License-Identifier: MIT */
/* Internals shared by the RPC runtime's files (not for its users). */
#ifndef KV_PROTO_RPC_INT_H
#define KV_PROTO_RPC_INT_H

#include <nng/nng.h>
#include <stdbool.h>
#include <stdint.h>

/* How long a socket's close may take before it is abandoned (rpc_util.c). */
#define RPC_CLOSE_WAIT_MS 5000u

/* nng_close(sock), abandoned (leaking the socket, logged with what) when it
 * does not return within wait_ms: nng 1.5's pipe reaper can block forever
 * (rpc_util.c). Returns whether the socket closed. */
bool rpc_socket_close(nng_socket sock, uint32_t wait_ms, const char *what);

/* Keeps p (a server or a channel left allocated because a close did not
 * finish and nng may still use it) reachable for the rest of the process:
 * it is never freed, and LeakSanitizer does not report what was abandoned
 * on purpose. */
void rpc_keep_abandoned(void *p);

typedef struct rpc_chan rpc_chan;
/* The first half of rpc_chan_close: every pending call completes (CANCELLED)
 * and no completion of ch runs any more, but ch stays allocated: calls
 * made on it fail at once with CANCELLED. rpc_chan_close does the rest. For
 * closing several channels whose completions may call one another (a
 * pool): shut them all down first, then close them. */
void rpc_chan_shutdown(rpc_chan *ch);
/* Whether ch connects on hotkv's loops (tcp:// to a numeric address, no
 * TLS, not $KV_RPC_NNG_STREAMS): then rpc_chan_opts.loop pins it. */
bool rpc_chan_looped(const rpc_chan *ch);

#endif
