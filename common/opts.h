/* SPDX-License-Identifier: MIT */
/*
 * Command-line and INI configuration from one option table. Every option is
 * a flag `--name VALUE` (or `--name=VALUE`) and an INI key `name` (or
 * `name_with_underscores`, in any section). `--config FILE` loads the INI file
 * first; flags always override it. Strings set from the INI file or flags are
 * owned by the kv_optset and released by kv_opts_free(); defaults are never
 * freed. Not thread-safe: call from main() before starting threads.
 */
#ifndef KV_COMMON_OPTS_H
#define KV_COMMON_OPTS_H

#include <stdbool.h>
#include <stddef.h>

#include "kv/kv_err.h"

typedef enum kv_opt_type {
    KV_OPT_STR,    /* ptr: char ** (default may be a literal or NULL) */
    KV_OPT_INT,    /* ptr: long * */
    KV_OPT_DOUBLE, /* ptr: double * */
    KV_OPT_BOOL,   /* ptr: bool *; `--name` alone sets true; on/off/true/false/1/0 */
    KV_OPT_ENUM,   /* ptr: int *, index into choices (NULL-terminated) */
} kv_opt_type;

typedef struct kv_opt {
    const char *name;
    kv_opt_type type;
    void *ptr;
    const char *help;
    const char *const *choices; /* KV_OPT_ENUM only */
    long min, max;              /* KV_OPT_INT bounds when min < max */
    char short_name;            /* optional one-letter alias: -x VALUE (0 = none) */
} kv_opt;

typedef struct kv_optset {
    const kv_opt *opts;
    size_t n;
    bool *owned; /* owned[i]: *(char **)opts[i].ptr was allocated here */
    const char *prog;
    const char *usage; /* extra usage text after the flags */
} kv_optset;

/* Parses `--config FILE` and then every flag of argv[1..]. Non-flag words are
 * compacted to argv[1..*npos] in order (for subcommands); with npos NULL a
 * non-flag word is an error. `--` ends the flags: every later word is a
 * non-flag word (a value that starts with --). `-` alone is a word (stdin).
 * On failure writes a message naming the flag or INI line to err and returns
 * INVALID_ARGUMENT; `--help` returns CANCELLED after printing usage to
 * stdout, `--version` after printing "PROG VERSION". */
kv_err kv_opts_parse(kv_optset *set, int argc, char **argv, int *npos, char *err, size_t errlen);
/* Prints every option with its help and default. */
void kv_opts_usage(const kv_optset *set, void *file);
/* Frees the strings the set allocated. Safe on a set that never parsed. */
void kv_opts_free(kv_optset *set);

#endif
