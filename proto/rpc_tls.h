/* SPDX-License-Identifier: MIT */
/*
 * Internal to the RPC runtime: nng TLS configurations built from rpc_tls
 * (PEM files read at open) and the constant-time token comparison.
 */
#ifndef KV_PROTO_RPC_TLS_H
#define KV_PROTO_RPC_TLS_H

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>
#include <stdbool.h>
#include <stddef.h>

#include "proto/rpc.h"

/* A configuration for a listener (server) or a dialer: own certificate and
 * key when given (a listener must have them), the CA when given (a dialer
 * must have it) with the peer authentication the CA implies. On failure
 * writes the reason (file names, mbedTLS's error) to err and returns an nng
 * error. On success *out holds one reference (nng_tls_config_free). */
int rpc_tls_config(const rpc_tls *t, bool server, nng_tls_config **out, char *err, size_t errlen);

/* got (len bytes, may hold NULs) equals the NUL-terminated want: every byte
 * of want is looked at whatever got holds, so the time taken does not tell
 * how long a prefix matched. */
bool rpc_token_eq(const void *got, size_t len, const char *want);

#endif
