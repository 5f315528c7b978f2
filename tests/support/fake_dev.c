/* SPDX-License-Identifier: Apache-2.0 */
/* A fake device memory kind for tests: fake_dev.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmocka.h>

#include "util/memkind.h"
#include "fake_dev.h"

fake_dev_t fake_dev_new(size_t len)
{
    fake_dev_t d = {.len = len};
    int fd = memfd_create("ferry-fake-device", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)len), 0);
    d.base = mmap(NULL, len, PROT_NONE, MAP_SHARED, fd, 0);
    d.alias = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    assert_true(d.base != MAP_FAILED && d.alias != MAP_FAILED);
    assert_int_equal(ferry_memkind_fake_add(d.base, len, d.alias), 0);
    return d;
}

void fake_dev_free(fake_dev_t *d)
{
    ferry_memkind_fake_remove(d->base);
    munmap(d->base, d->len);
    munmap(d->alias, d->len);
}
