/* SPDX-License-Identifier: MIT */
/*
 * Crash safety of the persistent engine: a node running with --sync always
 * and tiny write buffers (so flushes and compactions happen all the time)
 * is killed with SIGKILL at random points while a client writes and
 * deletes; after each restart every acknowledged write must be readable
 * with its value (or with the value of the one write that was in flight),
 * and nothing else may appear.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kv/kv.h"

#define KEYS 1500
#define ITERATIONS 20

typedef struct model {
    char acked[KEYS][48];    /* "" = absent (never written or deleted) */
    char inflight[KEYS][48]; /* the write sent but not acknowledged, if any */
    bool has_inflight[KEYS];
} model;

typedef struct writer {
    const char *url;
    model *m;
    int iteration;
    atomic_bool stop;
    _Atomic long acks; /* read by the main thread while the writer runs */
} writer;

/* The value for key k written as seq: a prefix recording both, padded to a
 * size that varies so records span many SST blocks. */
static size_t make_value(char *buf, size_t cap, const char *tag, int k)
{
    size_t n = (size_t)snprintf(buf, cap, "%s|", tag);
    size_t pad = (size_t)(k * 37 % 900);
    for (size_t i = 0; i < pad && n + 1 < cap; i++)
        buf[n++] = (char)('a' + (k + i) % 26);
    buf[n] = '\0';
    return n;
}

static void *write_loop(void *arg)
{
    writer *w = arg;
    kv_client *c;
    kv_client_opts o = {.timeout_ms = 2000};
    if (kv_client_open(&c, w->url, &o) != KV_OK)
        return NULL;
    unsigned seed = (unsigned)w->iteration * 7919u + 1;
    char val[1024], key[16];
    for (long seq = 0; !atomic_load(&w->stop); seq++) {
        int k = (int)(rand_r(&seed) % KEYS);
        bool del = rand_r(&seed) % 10 == 0;
        snprintf(key, sizeof(key), "c%d", k);
        char tag[48];
        snprintf(tag, sizeof(tag), "%s%d.%ld", del ? "" : "v", w->iteration, seq);
        if (del)
            tag[0] = '\0';
        snprintf(w->m->inflight[k], sizeof(w->m->inflight[k]), "%s", tag);
        w->m->has_inflight[k] = true;
        kv_err rv;
        if (del) {
            rv = kv_delete(c, key, strlen(key), NULL, NULL);
        } else {
            size_t n = make_value(val, sizeof(val), tag, k);
            rv = kv_put(c, key, strlen(key), val, n, NULL, NULL);
        }
        if (rv != KV_OK)
            break; /* the node died: this write stays in flight */
        snprintf(w->m->acked[k], sizeof(w->m->acked[k]), "%s", tag);
        w->m->has_inflight[k] = false;
        atomic_fetch_add(&w->acks, 1);
    }
    kv_client_close(c);
    return NULL;
}

static void verify(const char *url, model *m, int iteration)
{
    kv_client *c;
    cr_assert_eq(kv_client_open(&c, url, NULL), KV_OK);
    char key[16], want[1024];
    for (int k = 0; k < KEYS; k++) {
        snprintf(key, sizeof(key), "c%d", k);
        kv_value v;
        kv_err rv = kv_get(c, key, strlen(key), &v);
        cr_assert(rv == KV_OK || rv == KV_NOT_FOUND, "iteration %d key %s: %s", iteration, key,
                  kv_err_name(rv));
        const char *got_tag = "";
        char tagbuf[48] = "";
        if (rv == KV_OK) {
            const char *bar = memchr(v.data, '|', v.len);
            cr_assert_not_null(bar, "iteration %d key %s: garbage value", iteration, key);
            snprintf(tagbuf, sizeof(tagbuf), "%.*s", (int)(bar - (const char *)v.data), v.data);
            got_tag = tagbuf;
            size_t n = make_value(want, sizeof(want), got_tag, k);
            cr_assert(n == v.len && memcmp(want, v.data, n) == 0,
                      "iteration %d key %s: value bytes damaged", iteration, key);
            kv_value_free(&v);
        }
        bool ok = strcmp(got_tag, m->acked[k]) == 0 ||
                  (m->has_inflight[k] && strcmp(got_tag, m->inflight[k]) == 0);
        cr_assert(ok, "iteration %d key %s: got '%s', acknowledged '%s', in flight '%s'", iteration,
                  key, got_tag, m->acked[k], m->has_inflight[k] ? m->inflight[k] : "-");
        if (m->has_inflight[k]) { /* whichever survived is now the truth */
            snprintf(m->acked[k], sizeof(m->acked[k]), "%s", got_tag);
            m->has_inflight[k] = false;
        }
    }
    kv_client_close(c);
}

Test(crash, sigkill_during_writes_flushes_and_compactions, .timeout = 300)
{
    char dir[] = "/tmp/hotkv-crash-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", kvt_free_port());
    const char *flags[] = {
        "--sync", "always", "--write-buffer-kb", "64", "--fast-mb", "2", "--mem-mb", "4", NULL};
    model *m = calloc(1, sizeof(*m));
    unsigned seed = 12345;
    long total = 0;
    for (int it = 0; it < ITERATIONS; it++) {
        pid_t pid = kvt_node_start(dir, "crash", url, flags);
        cr_assert_gt(pid, 0, "node did not start (iteration %d, log in %s)", it, dir);
        verify(url, m, it);
        writer w = {.url = url, .m = m, .iteration = it};
        pthread_t t;
        pthread_create(&t, NULL, write_loop, &w);
        /* the kill lands at a random point once writes flow (a slow start
         * on a loaded host would otherwise leave nothing to check) */
        for (int waited = 0; atomic_load(&w.acks) < 50 && waited < 200; waited++)
            usleep(50000);
        usleep(150000 + rand_r(&seed) % 900000);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        kvt_forget(pid);
        atomic_store(&w.stop, true);
        pthread_join(t, NULL);
        total += atomic_load(&w.acks);
    }
    pid_t pid = kvt_node_start(dir, "crash", url, flags);
    cr_assert_gt(pid, 0);
    verify(url, m, ITERATIONS);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    kvt_forget(pid);
    cr_assert_gt(total, 1000, "the test wrote too little to mean anything (%ld acks)", total);
    char cmd[300], out[16];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    kvt_run(cmd, out, sizeof(out));
    free(m);
}
