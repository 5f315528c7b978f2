/* SPDX-License-Identifier: Apache-2.0 */
/* The public structs that start with size_t struct_size (docs/ABI.md):
 * the caller's struct may be older (smaller) or newer (larger) than this
 * library's. The library works on a full copy of its own size and moves
 * only the bytes both sides know between that copy and the caller's. */
#ifndef FERRY_CORE_SIZED_H
#define FERRY_CORE_SIZED_H

#include <stddef.h>

#include <ferry/ferry.h>
#include <ferry/kv.h>

/* The smallest struct_size accepted for each: the layout of the first
 * release that had struct_size (0.1.0). Fields are only ever added at the
 * end, so these never change. */
#define FERRY_CONFIG_SIZE_0_1 (offsetof(ferry_config_t, spin_us) + sizeof(int))
#define FERRY_STATS_SIZE_0_1 (offsetof(ferry_stats_t, codes) + FERRY_STATS_MAX_CODES * sizeof(ferry_stats_code_t))
#define FERRY_PEER_INFO_SIZE_0_1 (offsetof(ferry_peer_info_t, same_host) + sizeof(int))
#define FERRY_POOL_STATS_SIZE_0_1 (offsetof(ferry_pool_stats_t, allocations) + sizeof(size_t))
#define FERRY_REGION_INFO_SIZE_0_1 (offsetof(ferry_region_info_t, kind) + 24)
#define FERRY_KV_PLAN_INFO_SIZE_0_1 (offsetof(ferry_kv_plan_info_t, blocks) + sizeof(size_t))

/* The largest struct_size accepted: a page, as Linux does for its
 * extensible structs (clone3, openat2). Every byte beyond this library's
 * own size is read (it must be zero) or written (zeroed), so a garbage
 * size (an uninitialized field) would otherwise run far past the
 * caller's struct. */
#define FERRY_SIZED_MAX 4096u

/* 0 when the caller's struct_size (first field of theirs) is in
 * [min, FERRY_SIZED_MAX], else INVALID_ARGUMENT naming the struct (what)
 * and the sizes. */
int ferry_sized_check(const void *theirs, size_t min, const char *what);

/* 1 when the caller's struct_size is in [min, FERRY_SIZED_MAX] (for the
 * calls that return nothing, as ferry_config_init). */
int ferry_sized_ok(const void *theirs, size_t min);

/* Copies the caller's fields into ours (ours_size bytes, already holding
 * defaults for the fields an older caller lacks); ours->struct_size becomes
 * ours_size. A newer caller's fields that this library does not know must
 * be zero (0 means "default" for every field added later), else
 * NOT_IMPLEMENTED: the caller asks for something this build cannot do.
 * Checks the minimum size first, as ferry_sized_check. */
int ferry_sized_import(void *ours, size_t ours_size, const void *theirs, size_t min, const char *what);

/* Copies the fields both know from ours (ours_size bytes) into theirs,
 * zeroes a newer caller's fields this library does not know, and keeps
 * their struct_size. */
void ferry_sized_export(void *theirs, const void *ours, size_t ours_size);

#endif
