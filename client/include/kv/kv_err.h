/* SPDX-License-Identifier: MIT */
/*
 * kv_err: the one error enum of hotkv. Its numbers are gRPC's status codes
 * (DESIGN.md §3) so a status travels on the wire unchanged. The list below is
 * an X-macro: the enum, kv_err_name() and kv_strerror() are generated from it.
 */
#ifndef KV_KV_ERR_H
#define KV_KV_ERR_H

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KV_API __attribute__((visibility("default")))
#else
#define KV_API
#endif

/* X(name, number, description) */
#define KV_ERR_LIST(X)                                                                             \
    X(OK, 0, "success")                                                                            \
    X(CANCELLED, 1, "operation cancelled")                                                         \
    X(UNKNOWN, 2, "unknown error")                                                                 \
    X(INVALID_ARGUMENT, 3, "invalid argument")                                                     \
    X(DEADLINE_EXCEEDED, 4, "deadline exceeded")                                                   \
    X(NOT_FOUND, 5, "not found")                                                                   \
    X(ALREADY_EXISTS, 6, "already exists")                                                         \
    X(PERMISSION_DENIED, 7, "permission denied")                                                   \
    X(RESOURCE_EXHAUSTED, 8, "resource exhausted")                                                 \
    X(FAILED_PRECONDITION, 9, "failed precondition")                                               \
    X(ABORTED, 10, "aborted")                                                                      \
    X(OUT_OF_RANGE, 11, "out of range")                                                            \
    X(UNIMPLEMENTED, 12, "method not implemented")                                                 \
    X(INTERNAL, 13, "internal error")                                                              \
    X(UNAVAILABLE, 14, "service unavailable")                                                      \
    X(DATA_LOSS, 15, "data loss")                                                                  \
    X(UNAUTHENTICATED, 16, "unauthenticated")

typedef enum kv_err {
#define KV_ERR_ENUM_(name, num, desc) KV_##name = num,
    KV_ERR_LIST(KV_ERR_ENUM_)
#undef KV_ERR_ENUM_
        KV_ERR_COUNT_
} kv_err;

/* Returns a static, human-readable description of err ("unknown error code"
 * for numbers outside the list). Thread-safe. */
KV_API const char *kv_strerror(kv_err err);

/* Returns the static upper-case name of err ("NOT_FOUND"), or "UNKNOWN_CODE".
 * Thread-safe. */
KV_API const char *kv_err_name(kv_err err);

#ifdef __cplusplus
}
#endif
#endif
