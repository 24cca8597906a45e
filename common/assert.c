/* SPDX-License-Identifier: MIT */
/* The failure path of KV_ASSERT and the lock-held probes it uses. */
#include "common/assert.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/log.h"

void kv_assert_fail(const char *file, int line, const char *cond, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    kv_log(KV_LOG_ERROR, "assert", "assertion failed at %s:%d: %s: %s", file, line, cond, msg);
    abort();
}

bool kv_mutex_is_locked(pthread_mutex_t *mu)
{
    if (pthread_mutex_trylock(mu) != 0)
        return true; /* EBUSY: held (EINVAL etc. would be a bug elsewhere) */
    pthread_mutex_unlock(mu);
    return false;
}

bool kv_rwlock_is_locked(pthread_rwlock_t *rw)
{
    if (pthread_rwlock_trywrlock(rw) != 0)
        return true;
    pthread_rwlock_unlock(rw);
    return false;
}
