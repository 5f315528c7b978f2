/* SPDX-License-Identifier: Apache-2.0 */
/* The entries a backend state published with a lease, so that keepalive
 * can refresh each of them. A short array: an engine publishes a handful. */
#ifndef FERRY_META_ENTRIES_H
#define FERRY_META_ENTRIES_H

struct meta_entry {
    char *key;
    int ttl_s;
    long long lease; /* etcd's lease id; unused by Redis */
};

struct meta_entries {
    struct meta_entry *v;
    int n, cap;
};

/* Adds key or updates its ttl and lease. 0 or FERRY_ERR_MEMORY. */
int meta_entries_set(struct meta_entries *es, const char *key, int ttl_s, long long lease);
/* Forgets key (no-op when absent). */
void meta_entries_drop(struct meta_entries *es, const char *key);
void meta_entries_free(struct meta_entries *es);

#endif
