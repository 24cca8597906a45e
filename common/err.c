/* SPDX-License-Identifier: MIT */
/* kv_strerror and kv_err_name, generated from the KV_ERR_LIST X-macro. */
#include "kv/kv_err.h"

const char *kv_strerror(kv_err err)
{
    switch (err) {
#define KV_ERR_DESC_(name, num, desc)                                                              \
    case KV_##name:                                                                                \
        return desc;
        KV_ERR_LIST(KV_ERR_DESC_)
#undef KV_ERR_DESC_
    default:
        return "unknown error code";
    }
}

const char *kv_err_name(kv_err err)
{
    switch (err) {
#define KV_ERR_NAME_(name, num, desc)                                                              \
    case KV_##name:                                                                                \
        return #name;
        KV_ERR_LIST(KV_ERR_NAME_)
#undef KV_ERR_NAME_
    default:
        return "UNKNOWN_CODE";
    }
}
