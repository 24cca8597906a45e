/* SPDX-License-Identifier: MIT */
/*
 * The engine tests run over either store below the memory tier: the LSM by
 * default, kallax with KV_TEST_ENGINE=kallax (ctest's *_kallax entries).
 * tk_engine_opts turns engine options into kallax ones (one volume: the
 * slow directory is dropped; a store of TK_KALLAX_BLOCKS blocks, 16 MiB,
 * ~10% loaded by the largest test). Tests of what only the LSM has
 * (HotRAP, NHC, SST damage, compaction) return early under kallax through
 * TK_LSM_ONLY, after logging why.
 */
#ifndef KV_TESTS_NODE_ENGINE_KIND_H
#define KV_TESTS_NODE_ENGINE_KIND_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "node/engine.h"

#define TK_KALLAX_BLOCKS 4096u

static inline bool tk_kallax(void)
{
    const char *e = getenv("KV_TEST_ENGINE");
    return e && strcmp(e, "kallax") == 0;
}

static inline void tk_engine_opts(engine_opts *o)
{
    if (!tk_kallax())
        return;
    o->kind = ENGINE_KALLAX;
    o->slow_dir = NULL;
    if (!o->kallax_blocks)
        o->kallax_blocks = TK_KALLAX_BLOCKS;
}

#define TK_LSM_ONLY(why)                                                                           \
    do {                                                                                           \
        if (tk_kallax()) {                                                                         \
            cr_log_info("skipped under KV_TEST_ENGINE=kallax: %s", why);                           \
            return;                                                                                \
        }                                                                                          \
    } while (0)

#endif
