/* SPDX-License-Identifier: Apache-2.0 */
/* Registered memory seen from the owner's side: which region holds an
 * address (ferry_region_query), and copies into or out of a region that
 * check the registration first (ferry_region_write / _read): what a
 * binding's raw-memory helpers (Mooncake's write_bytes_to_buffer) use so
 * that a careless address is an error, not a crash. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "parts.h"
#include "util/fail.h"
#include "util/memkind.h"
#include "util/sized.h"

static void fill_info(const ferry_region_t *reg, ferry_region_info_t *out)
{
    memset(out, 0, sizeof *out);
    out->addr = reg->addr;
    out->len = reg->len;
    out->flags = reg->flags;
    out->device = FERRY_MEMKIND_TYPE(reg->kind) == FERRY_MEMKIND_HOST ? -1 : FERRY_MEMKIND_DEVICE(reg->kind);
    ferry_memkind_name(reg->kind, out->kind, sizeof out->kind);
}

int (ferry_region_query)(ferry_engine_t *e, const void *addr, size_t len, ferry_region_info_t *out)
{
    ferry_clear_last_error();
    if (!e || !out) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "region query: NULL argument");
    int rc = ferry_sized_check(out, FERRY_REGION_INFO_SIZE_0_1, "region info");
    if (rc) return rc;
    uint64_t a = (uint64_t)(uintptr_t)addr, n = len ? len : 1;
    ferry_region_info_t all;
    ferry_registry_read_lock(ferry_engine_part_registry(e));
    rc = ferry_registry_check_locked(ferry_engine_part_registry(e), a, n, 0, 0, "local");
    if (rc == 0) fill_info(ferry_registry_lookup_locked(ferry_engine_part_registry(e), a, n), &all);
    ferry_registry_unlock(ferry_engine_part_registry(e));
    if (rc == 0) ferry_sized_export(out, &all, sizeof all);
    return rc;
}

/* Copies with the read lock held, so a deregistration waits for the copy
 * and no byte is touched once the region is gone. */
static int copy_checked(ferry_engine_t *e, void *dst, const void *src, size_t len, bool into_region)
{
    ferry_clear_last_error();
    if (!e) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "region copy: engine is NULL");
    if (len == 0) return 0;
    const void *region_side = into_region ? dst : src, *host_side = into_region ? src : dst;
    if (!host_side) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "region copy: the host buffer is NULL");
    uint64_t a = (uint64_t)(uintptr_t)region_side;
    ferry_registry_read_lock(ferry_engine_part_registry(e));
    int rc = ferry_registry_check_locked(ferry_engine_part_registry(e), a, len, 0, 0, "local");
    if (rc == 0) {
        uint32_t kind = ferry_registry_lookup_locked(ferry_engine_part_registry(e), a, len)->kind;
        rc = into_region ? ferry_memkind_from_host(kind, dst, src, len) : ferry_memkind_to_host(kind, dst, src, len);
    }
    ferry_registry_unlock(ferry_engine_part_registry(e));
    if (rc) ferry_fail_context("%s %zu bytes %s registered memory at %p", into_region ? "writing" : "reading", len,
                               into_region ? "into" : "from", region_side);
    return rc;
}

int ferry_region_write(ferry_engine_t *e, void *dst, const void *src, size_t len)
{
    return copy_checked(e, dst, src, len, true);
}

int ferry_region_read(ferry_engine_t *e, void *dst, const void *src, size_t len)
{
    return copy_checked(e, dst, src, len, false);
}

int ferry_device_memory_supported(const char **why)
{
    if (why) *why = ferry_memkind_status();
    return ferry_memkind_device_usable();
}
