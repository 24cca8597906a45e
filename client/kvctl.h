/* SPDX-License-Identifier: MIT */
/* kvctl internals: the command table and the shared environment. */
#ifndef KV_CLIENT_KVCTL_H
#define KV_CLIENT_KVCTL_H

#include <stdbool.h>

#include "kv/kv_err.h"

enum { KVCTL_OK = 0, KVCTL_NOT_FOUND = 1, KVCTL_USAGE = 2, KVCTL_SERVER = 3 };

typedef struct kvctl_env {
    char *router;
    char *auth;
    bool json;
    bool verbose;
    long timeout_ms;
    long ttl_ms;
    long rf;
    long top;
    bool watch;
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

int kvctl_get(kvctl_env *env, int argc, char **argv);
int kvctl_put(kvctl_env *env, int argc, char **argv);
int kvctl_del(kvctl_env *env, int argc, char **argv);
int kvctl_status(kvctl_env *env, int argc, char **argv);
int kvctl_ring(kvctl_env *env, int argc, char **argv);
int kvctl_ping(kvctl_env *env, int argc, char **argv);
int kvctl_cluster(kvctl_env *env, int argc, char **argv);
int kvctl_hotkeys(kvctl_env *env, int argc, char **argv);
int kvctl_nhc(kvctl_env *env, int argc, char **argv);

#endif
