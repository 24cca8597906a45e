/* SPDX-License-Identifier: MIT */
/* Name/value statistics lists for admin.Stats replies. */
#include "proto/statlist.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void rpc_stats_init(rpc_statlist *l)
{
    memset(l, 0, sizeof(*l));
}

static bool grow(rpc_statlist *l)
{
    size_t cap = l->cap ? l->cap * 2 : 32;
    Kv__Stat *items = malloc(cap * sizeof(*items));
    Kv__Stat **ptrs = malloc(cap * sizeof(*ptrs));
    if (!items || !ptrs) {
        free(items);
        free(ptrs);
        return false;
    }
    if (l->n)
        memcpy(items, l->items, l->n * sizeof(*items));
    for (size_t i = 0; i < l->n; i++)
        ptrs[i] = &items[i];
    free(l->items);
    free(l->ptrs);
    l->items = items;
    l->ptrs = ptrs;
    l->cap = cap;
    return true;
}

void rpc_stats_add(rpc_statlist *l, const char *name, const char *fmt, ...)
{
    if (l->oom || (l->n == l->cap && !grow(l))) {
        l->oom = true;
        return;
    }
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    Kv__Stat *s = &l->items[l->n];
    kv__stat__init(s);
    s->name = strdup(name);
    s->value = strdup(buf);
    if (!s->name || !s->value) {
        free(s->name);
        free(s->value);
        l->oom = true;
        return;
    }
    l->ptrs[l->n++] = s;
}

void rpc_stats_free(rpc_statlist *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free(l->items[i].name);
        free(l->items[i].value);
    }
    free(l->items);
    free(l->ptrs);
    memset(l, 0, sizeof(*l));
}
