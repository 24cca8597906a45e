/* SPDX-License-Identifier: MIT */
/* assert_test's second unit: KV_ASSERT with KV_ASSERTS undefined. */
#undef KV_ASSERTS
#include "common/assert.h"

int assert_off_evaluations(void);

int assert_off_evaluations(void)
{
    int n = 0;
    KV_ASSERT(n++ == 100, "never evaluated: %d", n);
    return n + KV_ASSERTS_ON;
}
