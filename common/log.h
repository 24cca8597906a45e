/* SPDX-License-Identifier: MIT */
/*
 * Logging for every hotkv binary: one line per event on stderr,
 * "2026-11-30T02:28:32.123Z LEVEL module: message". Thread-safe (one write(2)
 * per line). The level threshold comes from kv_log_set_level() or the
 * KV_LOG_LEVEL environment variable (debug|info|warn|error, any case).
 */
#ifndef KV_COMMON_LOG_H
#define KV_COMMON_LOG_H

#include <stdarg.h>

typedef enum kv_log_level { KV_LOG_DEBUG, KV_LOG_INFO, KV_LOG_WARN, KV_LOG_ERROR } kv_log_level;

void kv_log_set_level(kv_log_level lvl);
/* Parses "debug"/"info"/"warn"/"error"; returns -1 when the name is unknown. */
int kv_log_parse_level(const char *name);
int kv_log_enabled(kv_log_level lvl);
void kv_log(kv_log_level lvl, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define KV_DEBUG(mod, ...) kv_log(KV_LOG_DEBUG, mod, __VA_ARGS__)
#define KV_INFO(mod, ...) kv_log(KV_LOG_INFO, mod, __VA_ARGS__)
#define KV_WARN(mod, ...) kv_log(KV_LOG_WARN, mod, __VA_ARGS__)
#define KV_ERROR(mod, ...) kv_log(KV_LOG_ERROR, mod, __VA_ARGS__)

#endif
