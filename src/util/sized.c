/* SPDX-License-Identifier: Apache-2.0 */
/* Size-aware copies of the public structs that start with struct_size. */
#include "sized.h"

#include <string.h>

#include "fail.h"

static size_t struct_size_of(const void *s)
{
    size_t n;
    memcpy(&n, s, sizeof n);
    return n;
}

int ferry_sized_check(const void *theirs, size_t min, const char *what)
{
    size_t n = struct_size_of(theirs);
    if (n > FERRY_SIZED_MAX)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "%s: struct_size=%zu is larger than any struct this library accepts (at most %u bytes, "
                          "as Linux caps extensible structs at a page): an uninitialized struct? set it to sizeof "
                          "the struct",
                          what, n, FERRY_SIZED_MAX);
    if (n < min)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "%s: struct_size=%zu is smaller than any published layout (%zu bytes); "
                          "set it to sizeof the struct (C callers get this from the header's macros)",
                          what, n, min);
    return 0;
}

int ferry_sized_ok(const void *theirs, size_t min)
{
    size_t n = struct_size_of(theirs);
    return n >= min && n <= FERRY_SIZED_MAX;
}

int ferry_sized_import(void *ours, size_t ours_size, const void *theirs, size_t min, const char *what)
{
    int rc = ferry_sized_check(theirs, min, what);
    if (rc) return rc;
    size_t n = struct_size_of(theirs);
    const unsigned char *tail = (const unsigned char *)theirs + ours_size;
    for (size_t i = 0; n > ours_size && i < n - ours_size; i++)
        if (tail[i])
            return ferry_fail(FERRY_ERR_NOT_IMPLEMENTED,
                              "%s: byte %zu of the caller's %zu-byte struct is set, but this library (%s) "
                              "knows only the first %zu bytes: a field it does not have",
                              what, ours_size + i, n, FERRY_VERSION_STRING, ours_size);
    memcpy(ours, theirs, n < ours_size ? n : ours_size);
    memcpy(ours, &ours_size, sizeof ours_size);
    return 0;
}

void ferry_sized_export(void *theirs, const void *ours, size_t ours_size)
{
    size_t n = struct_size_of(theirs);
    if (n > sizeof n) memcpy((unsigned char *)theirs + sizeof n, (const unsigned char *)ours + sizeof n,
                             (n < ours_size ? n : ours_size) - sizeof n);
    if (n > ours_size) memset((unsigned char *)theirs + ours_size, 0, n - ours_size);
}
