/* SPDX-License-Identifier: MIT */
/*
 * The security flags every hotkv binary takes (docs/operations.md
 * "Security"): the data token (--auth, --auth-file, $KV_AUTH), the admin
 * token (--admin-auth, --admin-auth-file, $KV_ADMIN_AUTH) and TLS
 * (--tls-cert, --tls-key, --tls-ca; listeners also --tls-client-auth), and
 * for listeners the HTTP token of --http-listen (--http-token,
 * --http-token-file, $KV_HTTP_TOKEN).
 * A token comes from its flag, else its file, else the environment, so
 * that it need not appear on a command line (visible in ps).
 */
#ifndef KV_PROTO_RPC_SEC_H
#define KV_PROTO_RPC_SEC_H

#include <stdbool.h>
#include <stddef.h>

#include "common/opts.h"
#include "kv/kv_err.h"
#include "proto/rpc.h"

typedef struct rpc_sec {
    /* flags (strings owned by the kv_optset) */
    char *auth, *auth_file, *admin_auth, *admin_auth_file;
    char *tls_cert, *tls_key, *tls_ca;
    int tls_client_auth;              /* listeners: 0 = required (with --tls-ca), 1 = optional */
    char *http_auth, *http_auth_file; /* listeners: --http-token, --http-token-file */
    char *map_key_file;               /* --map-key-file */
    /* filled by rpc_sec_load */
    char *data_token;  /* NULL = none */
    char *admin_token; /* NULL = none */
    char *http_token;  /* NULL = none: /metrics and the dashboard are open */
    char *map_key;     /* NULL = none: maps are not signed (kvctl) or checked (others) */
    rpc_tls tls;
} rpc_sec;

extern const char *const rpc_sec_client_auth_choices[];

#define RPC_SEC_OPTS(s)                                                                            \
    {"auth",     KV_OPT_STR,                                                                       \
     &(s)->auth, "data token (kv.*); visible in ps: prefer --auth-file or $KV_AUTH",               \
     NULL,       0,                                                                                \
     0},                                                                                           \
        {"auth-file", KV_OPT_STR, &(s)->auth_file, "file holding the data token", NULL, 0, 0},     \
        {"admin-auth",                                                                             \
         KV_OPT_STR,                                                                               \
         &(s)->admin_auth,                                                                         \
         "admin token (admin.*, internal calls); prefer --admin-auth-file or $KV_ADMIN_AUTH",      \
         NULL,                                                                                     \
         0,                                                                                        \
         0},                                                                                       \
        {"admin-auth-file",                                                                        \
         KV_OPT_STR,                                                                               \
         &(s)->admin_auth_file,                                                                    \
         "file holding the admin token",                                                           \
         NULL,                                                                                     \
         0,                                                                                        \
         0},                                                                                       \
        {"tls-cert", KV_OPT_STR, &(s)->tls_cert, "own TLS certificate (PEM) for tls+tcp://", NULL, \
         0,          0},                                                                           \
        {"tls-key", KV_OPT_STR, &(s)->tls_key, "its private key (PEM, unencrypted)", NULL, 0, 0},  \
        {"map-key-file",                                                                           \
         KV_OPT_STR,                                                                               \
         &(s)->map_key_file,                                                                       \
         "file holding the cluster's map key (or $KV_MAP_KEY): kvctl signs the maps it makes, "    \
         "nodes, routers and smart clients install only maps signed with it",                      \
         NULL,                                                                                     \
         0,                                                                                        \
         0},                                                                                       \
    {                                                                                              \
        "tls-ca", KV_OPT_STR, &(s)->tls_ca,                                                        \
            "CA (PEM) peers' certificates must chain to (mutual TLS)", NULL, 0, 0                  \
    }
/* The flags of a process that listens: RPC_SEC_OPTS, --tls-client-auth and
 * the HTTP token. */
#define RPC_SEC_SERVER_OPTS(s)                                                                     \
    RPC_SEC_OPTS(s),                                                                               \
        {"http-token",                                                                             \
         KV_OPT_STR,                                                                               \
         &(s)->http_auth,                                                                          \
         "token that /metrics, the dashboard and /api/ of --http-listen require (Authorization: "  \
         "Bearer); prefer --http-token-file or $KV_HTTP_TOKEN",                                    \
         NULL,                                                                                     \
         0,                                                                                        \
         0},                                                                                       \
        {"http-token-file",                                                                        \
         KV_OPT_STR,                                                                               \
         &(s)->http_auth_file,                                                                     \
         "file holding the HTTP token",                                                            \
         NULL,                                                                                     \
         0,                                                                                        \
         0},                                                                                       \
    {                                                                                              \
        "tls-client-auth", KV_OPT_ENUM, &(s)->tls_client_auth,                                     \
            "with --tls-ca, clients must present a certificate (required) or may "                 \
            "(optional: then they need the tokens)",                                               \
            rpc_sec_client_auth_choices, 0, 0                                                      \
    }

/* Resolves the tokens (flag, else file, else environment; a flag and its
 * file together are an error; a file's trailing newline is dropped; an
 * empty file is an error) and the TLS settings. INVALID_ARGUMENT with a
 * message naming the flag on error. */
kv_err rpc_sec_load(rpc_sec *s, char *err, size_t errlen);
/* Logs (warning) what a listening process's settings leave open: no
 * authentication at all, one token for data and admin, TLS flags with a
 * plaintext listen URL; and for http_listen (NULL or "" = none) no HTTP
 * token, or a token sent over plain http://. */
void rpc_sec_warn(const rpc_sec *s, const char *prog, const char *listen, const char *http_listen);
/* Frees what rpc_sec_load allocated. */
void rpc_sec_free(rpc_sec *s);
/* The token this process sends: the admin token when it has one, else the
 * data token (NULL = none). */
const char *rpc_sec_token(const rpc_sec *s);
/* The TLS settings, NULL when no --tls-* flag was given. */
const rpc_tls *rpc_sec_tls(const rpc_sec *s);

#endif
