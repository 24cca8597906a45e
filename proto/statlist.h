/* SPDX-License-Identifier: MIT */
/*
 * A growable list of admin.Stats name/value pairs (kv.Stat), built by a
 * handler and packed into a StatsReply. Single-threaded; the list owns every
 * string it holds until rpc_stats_free().
 */
#ifndef KV_PROTO_STATLIST_H
#define KV_PROTO_STATLIST_H

#include <stdbool.h>
#include <stddef.h>

#include "proto/kv.pb-c.h"

typedef struct rpc_statlist {
    Kv__Stat *items;
    Kv__Stat **ptrs; /* what StatsReply.stats points at */
    size_t n, cap;
    bool oom; /* an add failed: the reply would be incomplete */
} rpc_statlist;

void rpc_stats_init(rpc_statlist *l);
/* Appends name = printf(fmt, ...). On allocation failure sets l->oom. */
void rpc_stats_add(rpc_statlist *l, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void rpc_stats_free(rpc_statlist *l);

/* Appends every entry of the typed list s that has an admin.Stats key, in
 * order, formatted (proto/stats.h; defined in proto/stats.c). */
struct kv_stats;
void kv_stats_to_statlist(const struct kv_stats *s, rpc_statlist *l);

#endif
