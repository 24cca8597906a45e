/* SPDX-License-Identifier: MIT */
/* kvctl against a live cluster: round trips, output and exit codes. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

static kvt_cluster cl;

static int kvctl(const char *args, char *out, size_t outlen)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s --router %s %s 2>&1", kvt_bin("client/kvctl"), cl.router_url,
             args);
    return kvt_run(cmd, out, outlen);
}

Test(kvctl, round_trips_and_exit_codes, .timeout = 120)
{
    cr_assert_eq(kvt_cluster_start(&cl, 3, 3, NULL), KV_OK, "logs in %s", cl.dir);
    char out[8192];
    cr_assert_eq(kvctl("put a 1", out, sizeof(out)), 0, "%s", out);
    cr_assert_str_eq(out, "OK\n");
    cr_assert_eq(kvctl("get a", out, sizeof(out)), 0, "%s", out);
    cr_assert_str_eq(out, "1\n");
    cr_assert_eq(kvctl("--json get a", out, sizeof(out)), 0);
    cr_assert(strstr(out, "\"value\":\"1\""), "%s", out);
    cr_assert_eq(kvctl("get nope", out, sizeof(out)), 1, "missing key exits 1: %s", out);
    cr_assert_eq(kvctl("del a", out, sizeof(out)), 0);
    cr_assert_str_eq(out, "1\n");
    cr_assert_eq(kvctl("get a", out, sizeof(out)), 1);
    cr_assert_eq(kvctl("frobnicate", out, sizeof(out)), 2, "unknown command exits 2");
    cr_assert_eq(kvctl("get", out, sizeof(out)), 2, "missing argument exits 2");
    cr_assert_eq(kvctl("put k v --ttl nope", out, sizeof(out)), 2, "bad flag exits 2");
    cr_assert_eq(kvctl("put '' v", out, sizeof(out)), 3, "server-side error exits 3: %s", out);
    cr_assert(strstr(out, "INVALID_ARGUMENT"), "status name on stderr: %s", out);

    cr_assert_eq(kvctl("status", out, sizeof(out)), 0, "%s", out);
    for (int i = 1; i <= 3; i++) {
        char id[8];
        snprintf(id, sizeof(id), "n%d", i);
        cr_assert(strstr(out, id), "status lists %s: %s", id, out);
    }
    cr_assert(strstr(out, "up"), "%s", out);
    cr_assert(strstr(out, "batch"), "durability (the WAL sync mode) shown: %s", out);
    cr_assert_eq(kvctl("--json status", out, sizeof(out)), 0);
    cr_assert(strstr(out, "\"durability\":\"batch\""), "%s", out);
    cr_assert_eq(kvctl("ring", out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "%"), "%s", out);
    cr_assert_eq(kvctl("ping", out, sizeof(out)), 0);
    cr_assert(strstr(out, "PONG from router"), "%s", out);

    /* kvctl pointed at a node works too */
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s --router %s status 2>&1", kvt_bin("client/kvctl"),
             cl.node_url[0]);
    cr_assert_eq(kvt_run(cmd, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "n3"), "%s", out);

    /* cluster init refuses when the nodes already have a map */
    snprintf(cmd, sizeof(cmd), "%s cluster init --rf 1 n1=%s 2>&1", kvt_bin("client/kvctl"),
             cl.node_url[0]);
    cr_assert_eq(kvt_run(cmd, out, sizeof(out)), 3, "%s", out);
    cr_assert(strstr(out, "ALREADY_EXISTS"), "%s", out);

    /* an unreachable router is a server error with the status name */
    snprintf(cmd, sizeof(cmd), "%s --timeout 500 --router tcp://127.0.0.1:1 get a 2>&1",
             kvt_bin("client/kvctl"));
    cr_assert_eq(kvt_run(cmd, out, sizeof(out)), 3, "%s", out);
    cr_assert(strstr(out, "UNAVAILABLE"), "%s", out);
    kvt_cluster_stop(&cl);
}
