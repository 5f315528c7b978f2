/* SPDX-License-Identifier: Apache-2.0 */
#include "entries.h"

#include <stdlib.h>
#include <string.h>

#include "util/fail.h"

static struct meta_entry *find(struct meta_entries *es, const char *key)
{
    for (int i = 0; i < es->n; i++)
        if (strcmp(es->v[i].key, key) == 0) return &es->v[i];
    return NULL;
}

int meta_entries_set(struct meta_entries *es, const char *key, int ttl_s, long long lease)
{
    struct meta_entry *e = find(es, key);
    if (!e) {
        if (es->n == es->cap) {
            int cap = es->cap ? es->cap * 2 : 4;
            struct meta_entry *v = realloc(es->v, (size_t)cap * sizeof *v);
            if (!v) return ferry_fail(FERRY_ERR_MEMORY, "metadata entry list of %d", cap);
            es->v = v;
            es->cap = cap;
        }
        char *copy = strdup(key);
        if (!copy) return ferry_fail(FERRY_ERR_MEMORY, "metadata key '%s'", key);
        e = &es->v[es->n++];
        e->key = copy;
    }
    e->ttl_s = ttl_s;
    e->lease = lease;
    return 0;
}

void meta_entries_drop(struct meta_entries *es, const char *key)
{
    struct meta_entry *e = find(es, key);
    if (!e) return;
    free(e->key);
    *e = es->v[--es->n]; /* order does not matter */
}

void meta_entries_free(struct meta_entries *es)
{
    for (int i = 0; i < es->n; i++) free(es->v[i].key);
    free(es->v);
    es->v = NULL;
    es->n = es->cap = 0;
}
