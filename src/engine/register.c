/* SPDX-License-Identifier: Apache-2.0 */
/* Registration: the public calls that add memory regions to the engine's
 * registry (link/registry.h) and remove them, each region's memory kind
 * detected first (util/memkind.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "parts.h"
#include "util/fail.h"
#include "util/memkind.h"

static int check_flags(unsigned flags)
{
    if (flags & ~FERRY_MEM_REMOTE) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "register: unknown flags 0x%x", flags);
    return 0;
}

int ferry_register(ferry_engine_t *e, void *addr, size_t len, unsigned flags)
{
    ferry_clear_last_error();
    if (!e) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "register: engine is NULL");
    int rc = check_flags(flags);
    if (rc) return rc;
    uint32_t kind = FERRY_MEMKIND_HOST;
    if (addr && len) rc = ferry_memkind_detect(addr, len, &kind);
    if (rc) return rc;
    return ferry_registry_add_kind(ferry_engine_part_registry(e), (uint64_t)(uintptr_t)addr, len, flags, kind);
}

int ferry_deregister(ferry_engine_t *e, void *addr)
{
    ferry_clear_last_error();
    if (!e) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "deregister: engine is NULL");
    return ferry_registry_remove(ferry_engine_part_registry(e), (uint64_t)(uintptr_t)addr);
}

int ferry_register_batch(ferry_engine_t *e, void *const *addrs, const size_t *lens, size_t n, unsigned flags)
{
    ferry_clear_last_error();
    if (!e) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "register batch: engine is NULL");
    int rc = check_flags(flags);
    if (rc) return rc;
    if (!addrs || !lens) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "register batch: NULL array");
    uint32_t one, *kinds = n > 1 ? calloc(n, sizeof *kinds) : &one;
    if (!kinds) return ferry_fail(FERRY_ERR_MEMORY, "register batch of %zu: out of memory", n);
    for (size_t i = 0; i < n && rc == 0; i++) {
        kinds[i] = FERRY_MEMKIND_HOST;
        if (addrs[i] && lens[i]) rc = ferry_memkind_detect(addrs[i], lens[i], &kinds[i]);
        if (rc) ferry_fail_context("region %zu of %zu (none registered)", i, n);
    }
    if (rc == 0) rc = ferry_registry_add_many_kinds(ferry_engine_part_registry(e), addrs, lens, n, flags, kinds);
    if (kinds != &one) free(kinds);
    return rc;
}

int ferry_deregister_batch(ferry_engine_t *e, void *const *addrs, size_t n)
{
    ferry_clear_last_error();
    if (!e || !addrs) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "deregister batch: NULL argument");
    int first = 0;
    char detail[1024] = "";
    for (size_t i = 0; i < n; i++) {
        int rc = ferry_registry_remove(ferry_engine_part_registry(e), (uint64_t)(uintptr_t)addrs[i]);
        if (rc && !first) {
            first = rc;
            snprintf(detail, sizeof detail, "region %zu of %zu: %s", i, n, ferry_fail_message());
        }
    }
    if (first) ferry_fail(first, "%s", detail);
    return first;
}

size_t ferry_region_count(ferry_engine_t *e) { return e ? ferry_registry_count(ferry_engine_part_registry(e)) : 0; }
