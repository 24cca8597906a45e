/* SPDX-License-Identifier: MIT */
/* Line-oriented stderr logging with a global, atomically read threshold. */
#include "common/log.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static atomic_int log_level = -1; /* -1: not read from the environment yet */

static const char *const level_names[] = {"DEBUG", "INFO", "WARN", "ERROR"};

int kv_log_parse_level(const char *name)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    for (int i = 0; i < 4; i++)
        if (name && strcasecmp(name, names[i]) == 0)
            return i;
    return -1;
}

void kv_log_set_level(kv_log_level lvl)
{
    atomic_store_explicit(&log_level, (int)lvl, memory_order_relaxed);
}

int kv_log_enabled(kv_log_level lvl)
{
    int cur = atomic_load_explicit(&log_level, memory_order_relaxed);
    if (cur < 0) {
        /* First use: the environment decides once; the thread whose CAS
         * installs the level reports a value it does not understand (it
         * used to be ignored silently). */
        const char *v = getenv("KV_LOG_LEVEL");
        int env = kv_log_parse_level(v);
        int want = env < 0 ? KV_LOG_INFO : env, expect = -1;
        if (atomic_compare_exchange_strong(&log_level, &expect, want)) {
            if (v && *v && env < 0)
                fprintf(stderr, "log: KV_LOG_LEVEL=%s is not debug|info|warn|error; using info\n",
                        v);
            cur = want;
        } else {
            cur = expect;
        }
    }
    return (int)lvl >= cur;
}

void kv_log(kv_log_level lvl, const char *module, const char *fmt, ...)
{
    if (!kv_log_enabled(lvl))
        return;
    char line[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof(line),
                     "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s: ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, level_names[lvl], module);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof(line) - 2)
        len = sizeof(line) - 2;
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}
