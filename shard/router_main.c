/* SPDX-License-Identifier: MIT */
/*
 * kvrouter: the stateless router process. Learns the cluster map from the
 * seed nodes, forwards requests to the owners, and exits cleanly on
 * SIGTERM/SIGINT.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/opts.h"
#include "shard/router.h"

int main(int argc, char **argv)
{
    /* SIGINT and SIGTERM are taken by sigwait once the process serves. They
     * are blocked before any thread starts (nng starts its threads at its
     * first use), as every thread inherits the mask: a signal that came
     * during start-up would otherwise kill the process in a thread that had
     * it unblocked, without a clean shutdown. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    router r = {0};
    r.cfg.listen = "tcp://127.0.0.1:7000";
    r.cfg.workers = 32;
    r.cfg.max_inflight = RPC_DEFAULT_MAX_INFLIGHT;
    r.cfg.refresh_ms = 2000;
    r.cfg.hot_sample = 16;
    r.cfg.hot_window_ms = 1000;
    r.cfg.hot_k = 1024;
    r.cfg.hot_flag_rate = 100;
    r.cfg.probe_ms = 500;
    r.cfg.probe_fails = 2;
    long rpc_threads = 0, loops = 0;
    long max_key = KV_DEFAULT_MAX_KEY, max_value = KV_DEFAULT_MAX_VALUE;
    long max_ops = KV_DEFAULT_MAX_BATCH_OPS, max_batch = KV_DEFAULT_MAX_BATCH_BYTES;
    char *log_level = "info";
    kv_opt table[] = {
        {"listen", KV_OPT_STR, &r.cfg.listen, "RPC address", NULL, 0, 0},
        {"seeds", KV_OPT_STR, &r.cfg.seeds, "comma-separated node addresses (required)", NULL, 0,
         0},
        {"workers", KV_OPT_INT, &r.cfg.workers, "RPC worker threads", NULL, 1, 4096},
        {"max-inflight", KV_OPT_INT, &r.cfg.max_inflight,
         "calls admitted and not answered yet, at most; more are refused at once with "
         "RESOURCE_EXHAUSTED (so are calls arriving while the queue waits more than half of "
         "their deadline)",
         NULL, 1, 1 << 20},
        {"refresh-ms", KV_OPT_INT, &r.cfg.refresh_ms, "cluster map poll period", NULL, 50, 3600000},
        RPC_SEC_SERVER_OPTS(&r.cfg.sec),
        {"hot-sample", KV_OPT_INT, &r.cfg.hot_sample,
         "hot-key detection samples one key in N (0 = off)", NULL, 0, 1 << 20},
        {"hot-window-ms", KV_OPT_INT, &r.cfg.hot_window_ms, "hot-key detection window", NULL, 50,
         HK_MAX_WINDOW_MS},
        {"hot-replica-reads", KV_OPT_BOOL, &r.cfg.hot_replica_reads,
         "spread ONE reads of hot keys over their replicas (may read older replicas)", NULL, 0, 0},
        {"hot-cache-ms", KV_OPT_INT, &r.cfg.hot_cache_ms,
         "cache hot keys' values here for this long (0 = off; stale up to that long for writes "
         "through other routers)",
         NULL, 0, 600000},
        {"hot-flag-rate", KV_OPT_DOUBLE, &r.cfg.hot_flag_rate,
         "ops/s at which the mitigations treat a key as hot", NULL, 0, 0},
        {"hot-k", KV_OPT_INT, &r.cfg.hot_k, "keys tracked per hot-key sketch", NULL, 16, 1 << 20},
        {"probe-ms", KV_OPT_INT, &r.cfg.probe_ms,
         "failure detector: ping every node this often (0 = off)", NULL, 0, 600000},
        {"probe-fails", KV_OPT_INT, &r.cfg.probe_fails,
         "failure detector: consecutive failed pings that mark a node down", NULL, 1, 1000},
        {"rpc-threads", KV_OPT_INT, &rpc_threads,
         "nng callback threads (0 = one per CPU, at least 2; nng 1.5 rounds up to even)", NULL, 0,
         256},
        {"loops", KV_OPT_INT, &loops,
         "event-loop threads serving tcp:// connections (0 = one per CPU, at most 8)", NULL, 0, 8},
        {"max-key-bytes", KV_OPT_INT, &max_key, "key size limit", NULL, 1, 1 << 20},
        {"max-value-bytes", KV_OPT_INT, &max_value, "value size limit", NULL, 0, 1L << 30},
        {"max-batch-ops", KV_OPT_INT, &max_ops, "ops per batch limit", NULL, 1, 1 << 24},
        {"max-batch-bytes", KV_OPT_INT, &max_batch, "batch size limit", NULL, 1, 1L << 30},
        {"http-listen", KV_OPT_STR, &r.cfg.http_listen,
         "serve /metrics (Prometheus), /health and the dashboard (/) on http://HOST:PORT or "
         "https://HOST:PORT "
         "(default: off)",
         NULL, 0, 0},
        {"log-level", KV_OPT_STR, &log_level, "debug|info|warn|error", NULL, 0, 0},
    };
    kv_optset set = {table, sizeof(table) / sizeof(table[0]), NULL, "kvrouter", NULL};
    char err[512];
    kv_err rv = kv_opts_parse(&set, argc, argv, NULL, err, sizeof(err));
    if (rv == KV_CANCELLED) {
        rpc_sec_free(&r.cfg.sec);
        kv_opts_free(&set);
        return 0;
    }
    if (rv == KV_OK && (!r.cfg.seeds || !*r.cfg.seeds)) {
        snprintf(err, sizeof(err), "--seeds is required (comma-separated node addresses)");
        rv = KV_INVALID_ARGUMENT;
    }
    if (rv == KV_OK)
        rv = rpc_sec_load(&r.cfg.sec, err, sizeof(err));
    if (rv == KV_OK && kv_log_parse_level(log_level) < 0) {
        snprintf(err, sizeof(err), "--log-level: '%s' is not debug|info|warn|error", log_level);
        rv = KV_INVALID_ARGUMENT;
    }
    if (rv != KV_OK) {
        fprintf(stderr, "kvrouter: %s\n", err);
        rpc_sec_free(&r.cfg.sec);
        kv_opts_free(&set);
        return 2;
    }
    kv_log_set_level((kv_log_level)kv_log_parse_level(log_level));
    rpc_sec_warn(&r.cfg.sec, "kvrouter", r.cfg.listen, r.cfg.http_listen);
    r.cfg.limits =
        (kv_limits){(size_t)max_key, (size_t)max_value, (size_t)max_ops, (size_t)max_batch};
    rpc_runtime_init((unsigned)rpc_threads);
    rpc_runtime_set_loops((unsigned)loops);
    signal(SIGPIPE, SIG_IGN);
    if ((rv = router_start(&r, err, sizeof(err))) != KV_OK) {
        KV_ERROR("router", "cannot start: %s (%s)", err, kv_err_name(rv));
        router_stop(&r);
        rpc_sec_free(&r.cfg.sec);
        kv_opts_free(&set);
        return 1;
    }
    KV_INFO("router", "serving on %s, seeds %s (%u event loops, %u nng task threads)", r.cfg.listen,
            r.cfg.seeds, rpc_runtime_loops(), rpc_runtime_task_threads());
    int sig = 0;
    sigwait(&sigs, &sig);
    KV_INFO("router", "%s: shutting down", strsignal(sig));
    router_stop(&r);
    rpc_sec_free(&r.cfg.sec);
    kv_opts_free(&set);
    return 0;
}
