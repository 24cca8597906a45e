/* SPDX-License-Identifier: MIT */
/* The router's dashboard (placeholder until the page lands). */
#include "shard/router.h"

kv_err router_dash_start(router *r)
{
    return KV_OK;
}

void router_dash_stop(router *r)
{
}

size_t router_dash_routes(router *r, kv_http_route *routes, size_t cap)
{
    return 0;
}
