/* SPDX-License-Identifier: Apache-2.0 */
/* A fake device memory kind for tests (util/memkind.h's fake kind): pages
 * the process cannot touch (PROT_NONE) at base, what Ferry is given, and a
 * read-write alias of the same pages that the kind's copy functions and the
 * test use. cmocka: a failed step fails the test. */
#ifndef FERRY_TEST_FAKE_DEV_H
#define FERRY_TEST_FAKE_DEV_H

#include <stddef.h>

typedef struct fake_dev {
    unsigned char *base;  /* PROT_NONE: what Ferry is given */
    unsigned char *alias; /* read-write view of the same pages, for the test */
    size_t len;
} fake_dev_t;

/* len bytes of fake device memory, registered with the fake kind. */
fake_dev_t fake_dev_new(size_t len);
/* Removes it from the fake kind and unmaps both views. */
void fake_dev_free(fake_dev_t *d);

#endif
