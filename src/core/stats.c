/* Per-engine counters (see stats.h). */
#include "stats.h"

#include <string.h>

static const int table_codes[] = {
#define FERRY_X_CODE(name, value, retry, text) (value),
    FERRY_ERROR_TABLE(FERRY_X_CODE)
#undef FERRY_X_CODE
};

_Static_assert(FERRY_ERROR_TABLE_SIZE - 1 <= FERRY_STATS_MAX_CODES, "raise FERRY_STATS_MAX_CODES");

/* Position of code in the error table; codes outside it count as INTERNAL. */
static int code_index(int code)
{
    for (int i = 0; i < FERRY_ERROR_TABLE_SIZE; i++)
        if (table_codes[i] == code) return i;
    for (int i = 0; i < FERRY_ERROR_TABLE_SIZE; i++)
        if (table_codes[i] == FERRY_ERR_INTERNAL) return i;
    return 0;
}

void ferry_stats_failure(ferry_counters_t *c, int code)
{
    if (code >= 0) return;
    atomic_fetch_add_explicit(&c->failures[code_index(code)], 1, memory_order_relaxed);
}

void ferry_stats_retry(ferry_counters_t *c, int code)
{
    atomic_fetch_add_explicit(&c->retries, 1, memory_order_relaxed);
    if (code < 0) atomic_fetch_add_explicit(&c->code_retries[code_index(code)], 1, memory_order_relaxed);
}

void ferry_stats_read(ferry_counters_t *c, ferry_stats_t *out)
{
    memset(out, 0, sizeof *out);
#define FERRY_X_COPY(f) out->f = atomic_load_explicit(&c->f, memory_order_relaxed);
    FERRY_STATS_FIELDS(FERRY_X_COPY)
#undef FERRY_X_COPY
    size_t k = 0;
    for (int i = 0; i < FERRY_ERROR_TABLE_SIZE && k < FERRY_STATS_MAX_CODES; i++) {
        if (table_codes[i] == 0) continue;
        out->codes[k].code = table_codes[i];
        out->codes[k].failures = atomic_load_explicit(&c->failures[i], memory_order_relaxed);
        out->codes[k].retries = atomic_load_explicit(&c->code_retries[i], memory_order_relaxed);
        k++;
    }
    out->ncodes = k;
}
