/* SPDX-License-Identifier: MIT */
/*
 * kvctl: the admin and data CLI.
 *   kvctl [--router ADDR] [--json] [--timeout MS] [--auth TOKEN] COMMAND
 *   get KEY | put KEY VALUE [--ttl MS] | del KEY | status [--verbose] | ring | ping
 *   cluster init --rf N ID=ADDR... | hotkeys [--top N] [--watch] | nhc [NODE_ID] [--watch]
 *   backup FILE|- [--prefix P] | restore FILE   (and the rest of the command table below)
 * Exit codes: 0 ok, 1 not found (get), 2 usage, 3 server error (status name
 * and message on stderr).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/kvctl.h"
#include "common/opts.h"

static const kvctl_cmd commands[] = {
    {"get", kvctl_get, 1, 1,
     "get KEY [--consistency one|quorum|all] [--raw] [-o FILE] [--hex]   (exit 1: not found)"},
    {"put", kvctl_put, 1, 2,
     "put KEY VALUE|- [--file F] [--ttl MS] [--if-version V] [--if-absent] [--consistency C] "
     "[--hex]   (- reads stdin; -- before a value that starts with --)"},
    {"del", kvctl_del, 1, 1, "del KEY [--if-version V] [--consistency C] [--hex]"},
    {"ttl", kvctl_ttl, 1, 1, "ttl KEY   remaining time to live in ms, or none"},
    {"batch", kvctl_batch, 0, 1,
     "batch [FILE|-]   one operation a line: get KEY | put KEY VALUE | del KEY"},
    {"scan", kvctl_scan, 0, 0,
     "scan [--prefix P] [--start K] [--limit N] [--cursor C] [--keys-only] [--hex]   live keys "
     "in order (key TAB value); prints the cursor to continue from on stderr"},
    {"status", kvctl_status, 0, 0, "status [--verbose]   LIVE KEYS: exact, per node"},
    {"ring", kvctl_ring, 0, 0, "ring"},
    {"ping", kvctl_ping, 0, 0, "ping"},
    {"cluster", kvctl_cluster, 1, 1000, "cluster init --rf N ID=ADDR... | cluster sign"},
    {"hotkeys", kvctl_hotkeys, 0, 0, "hotkeys [--top N] [--watch] [--json]"},
    {"node", kvctl_node, 1, 3,
     "node add ID=ADDR [--weight W] | remove ID | replace OLD_ID NEW_ID=ADDR | weight ID W | "
     "abort | cleanup ID   membership changes, with streaming (--stream-mbps N, --no-wait)"},
    {"repair", kvctl_repair, 0, 1,
     "repair [NODE_ID] [--ranges LO:HI,...]   compare replicas (Merkle trees) and stream the "
     "differences"},
    {"backup", kvctl_backup, 1, 1,
     "backup FILE|- [--prefix P]   every live key with its value and expiry, through kv.Scan, "
     "into FILE (written whole or not at all)"},
    {"restore", kvctl_restore, 1, 1,
     "restore FILE [--consistency C]   checks the whole backup, then writes its keys (new "
     "versions; keys that expired since are skipped)"},
    {"nhc", kvctl_nhc, 0, 1,
     "nhc [NODE_ID] [--watch] [--json]   NHC scheduler per node: state, data_admit, "
     "load_admit, miss ratio, per-volume reads/s and latency, last minute"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: kvctl [--router ADDR] [--json] [--timeout MS] [--auth-file F] "
               "[--admin-auth-file F] [--tls-ca F] COMMAND\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(f, "  %s\n", commands[i].usage);
    fprintf(f, "ADDR defaults to $KV_ROUTER, then tcp://127.0.0.1:7000; a node's address works "
               "too.\n");
}

/* `kvctl COMMAND --help`: that command's usage. True when printed. */
static bool command_help(int argc, char **argv)
{
    bool help = false;
    const kvctl_cmd *cmd = NULL;
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        help |= strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0;
        for (size_t k = 0; !cmd && argv[i][0] != '-' && k < sizeof(commands) / sizeof(commands[0]);
             k++)
            if (strcmp(commands[k].name, argv[i]) == 0)
                cmd = &commands[k];
    }
    if (!help || !cmd)
        return false;
    printf("usage: kvctl [--router ADDR] [--json] [--timeout MS] [--auth-file F] "
           "[--admin-auth-file F] [--tls-ca F] %s\n",
           cmd->usage);
    return true;
}

int main(int argc, char **argv)
{
    if (command_help(argc, argv))
        return 0;
    kvctl_env env = {0};
    env.router =
        getenv("KV_ROUTER") && *getenv("KV_ROUTER") ? getenv("KV_ROUTER") : "tcp://127.0.0.1:7000";
    env.timeout_ms = 5000;
    env.rf = 0;
    static const char *const levels[] = {"default", "one", "quorum", "all", NULL};
    kv_opt table[] = {
        {"router", KV_OPT_STR, &env.router, "router (or node) address", NULL, 0, 0},
        {"json", KV_OPT_BOOL, &env.json, "machine-readable output", NULL, 0, 0},
        {"timeout", KV_OPT_INT, &env.timeout_ms, "per-call deadline in ms", NULL, 1, 3600000},
        RPC_SEC_OPTS(&env.sec),
        {"ttl", KV_OPT_INT, &env.ttl_ms, "put: time to live in ms", NULL, 0, 1L << 40},
        {"verbose", KV_OPT_BOOL, &env.verbose, "status: per-tier detail", NULL, 0, 0},
        {"rf", KV_OPT_INT, &env.rf, "cluster init: replication factor", NULL, 1, 16},
        {"top", KV_OPT_INT, &env.top, "hotkeys: how many keys", NULL, 1, 100000},
        {"watch", KV_OPT_BOOL, &env.watch, "hotkeys, nhc: refresh every second", NULL, 0, 0},
        {"weight", KV_OPT_INT, &env.weight, "node add: the new node's weight (1..1000)", NULL, 1,
         1000},
        {"stream-mbps", KV_OPT_INT, &env.stream_mbps,
         "node, repair: stream throttle in MiB/s (default: each node's --stream-mbps)", NULL, 1,
         100000},
        {"ranges", KV_OPT_STR, &env.ranges,
         "repair: only these ring ranges, LO:HI[,LO:HI...] (hash positions, (LO, HI])", NULL, 0, 0},
        {"consistency", KV_OPT_ENUM, &env.consistency,
         "get, put, del, ttl, restore: consistency level one|quorum|all", levels, 0, 0},
        {"raw", KV_OPT_BOOL, &env.raw, "get: the value alone, no newline", NULL, 0, 0},
        {"output", KV_OPT_STR, &env.output, "get: write the value to this file", NULL, 0, 0, 'o'},
        {"hex", KV_OPT_BOOL, &env.hex, "keys and values in hex", NULL, 0, 0},
        {"file", KV_OPT_STR, &env.file, "put: read the value from this file", NULL, 0, 0},
        {"if-version", KV_OPT_STR, &env.if_version, "put, del: only if the version is this", NULL,
         0, 0},
        {"if-absent", KV_OPT_BOOL, &env.if_absent, "put: only if the key does not exist", NULL, 0,
         0},
        {"prefix", KV_OPT_STR, &env.prefix, "scan, backup: keys beginning with this", NULL, 0, 0},
        {"start", KV_OPT_STR, &env.start, "scan: keys from this one on", NULL, 0, 0},
        {"cursor", KV_OPT_STR, &env.cursor, "scan: continue after this cursor (as printed)", NULL,
         0, 0},
        {"limit", KV_OPT_INT, &env.limit, "scan: keys to print (default 100)", NULL, 1, 1L << 40},
        {"keys-only", KV_OPT_BOOL, &env.keys_only, "scan: keys without values", NULL, 0, 0},
        {"no-wait", KV_OPT_BOOL, &env.no_wait,
         "node, repair: start the streams and return (rerun the command to finish)", NULL, 0, 0},
    };
    kv_optset set = {table, sizeof(table) / sizeof(table[0]), NULL, "kvctl", "COMMAND [ARGS]"};
    char err[512];
    int npos = 0;
    kv_err rv = kv_opts_parse(&set, argc, argv, &npos, err, sizeof(err));
    if (rv == KV_CANCELLED) { /* --help (usage) or --version (printed) */
        bool version = false;
        for (int i = 1; i < argc; i++)
            version |= strcmp(argv[i], "--version") == 0;
        if (!version)
            usage(stdout);
        rpc_sec_free(&env.sec);
        kv_opts_free(&set);
        return 0;
    }
    if (rv == KV_OK && npos >= 1 && (rv = rpc_sec_load(&env.sec, err, sizeof(err))) == KV_OK) {
        env.auth = rpc_sec_token(&env.sec);
        env.tls = rpc_sec_tls(&env.sec);
    }
    if (rv != KV_OK || npos < 1) {
        if (rv != KV_OK)
            fprintf(stderr, "kvctl: %s\n", err);
        usage(stderr);
        rpc_sec_free(&env.sec);
        kv_opts_free(&set);
        return KVCTL_USAGE;
    }
    if (env.watch && !isatty(STDOUT_FILENO))
        env.json = true; /* --watch into a pipe: one JSON line per tick, no redraws */
    int code = KVCTL_USAGE;
    const kvctl_cmd *cmd = NULL;
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(commands[i].name, argv[1]) == 0)
            cmd = &commands[i];
    if (!cmd) {
        fprintf(stderr, "kvctl: unknown command '%s'\n", argv[1]);
        usage(stderr);
    } else if (npos - 1 < cmd->min_args || npos - 1 > cmd->max_args) {
        fprintf(stderr, "usage: kvctl %s\n", cmd->usage);
    } else {
        code = cmd->fn(&env, npos - 1, argv + 2);
    }
    rpc_sec_free(&env.sec);
    kv_opts_free(&set);
    return code;
}
