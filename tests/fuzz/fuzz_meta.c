/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: metadata records as read back from etcd or Redis. Whoever
 * can write the service's keys (another tenant, a corrupted store, a stale
 * format) controls these bytes; an engine must turn them into a clear
 * METADATA error, never crash, read out of bounds or leak. The first byte
 * picks what the rest is:
 *   0  an engine descriptor (the value under ferry/v1/engines/<name>), looked
 *      up through a backend that returns it, as after a Redis GET;
 *   1  the body of etcd's /kv/range answer (JSON, base64 value), then the
 *      descriptor in it (without etcd built in: as 0);
 *   2  a sequence of lease-table changes (src/meta/entries.c): set and
 *      drop of keys drawn from the input, checked against a model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ferry/ferry.h>

#include "engine/directory.h"
#include "engine/testing.h"
#include "fuzz.h"
#include "meta/entries.h"
#include "meta/meta.h"


static ferry_engine_t *engine;
static const ferry_meta_ops_t *p2p_ops;
static const char *current; /* the value the fake backend returns */

static int fake_lookup(void *state, const char *key, char **value)
{
    (void)state;
    (void)key;
    *value = strdup(current);
    return *value ? 0 : FERRY_ERR_MEMORY;
}

static ferry_meta_ops_t fake_ops;

static void setup(void)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.log_level = -1;
    if (ferry_engine_create(&cfg, &engine) != 0) abort();
    p2p_ops = ferry_test_meta(engine)->ops;
    fake_ops = *p2p_ops;
    fake_ops.scheme = "fuzz";
    fake_ops.lookup = fake_lookup;
    ferry_test_meta(engine)->ops = &fake_ops; /* restored in no teardown: the process ends */
}

/* A descriptor that parses must be usable as is. */
static void lookup_descriptor(const char *text)
{
    current = text;
    ferry_directory_entry_t entry;
    memset(&entry, 0, sizeof entry);
    /* The engine was made with p2p: no cache, every lookup parses. */
    int rc = ferry_directory_lookup(engine, "10.0.0.1:7000", &entry, NULL);
    if (rc == 0) {
        if (entry.port == 0 || memchr(entry.host, '\0', sizeof entry.host) == NULL) abort();
    } else if (rc != FERRY_ERR_METADATA) {
        abort();
    }
}

static void lease_table(const uint8_t *d, size_t n)
{
    struct meta_entries es = {0};
    int model[8] = {0}; /* 1 where key i is in the table */
    for (size_t i = 0; i + 1 < n; i += 2) {
        int k = d[i] & 7;
        char key[32];
        snprintf(key, sizeof key, "ferry/v1/engines/k%d", k);
        if (d[i] & 0x80) {
            meta_entries_drop(&es, key);
            model[k] = 0;
        } else {
            if (meta_entries_set(&es, key, d[i + 1], (long long)d[i + 1] << 40) != 0) abort();
            model[k] = 1;
        }
    }
    int expect = 0;
    for (int k = 0; k < 8; k++) expect += model[k];
    if (es.n != expect) abort();
    for (int a = 0; a < es.n; a++)
        for (int b = a + 1; b < es.n; b++)
            if (strcmp(es.v[a].key, es.v[b].key) == 0) abort();
    meta_entries_free(&es);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        setup();
        ready = 1;
    }
    if (size < 1 || size > (1u << 16)) return 0;
    uint8_t mode = data[0] % 3;
    if (mode == 2) {
        lease_table(data + 1, size - 1);
        return 0;
    }
    char *text = malloc(size);
    if (!text) return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    if (mode == 1) {
        char *value = NULL;
        int rc = ferry_etcd_range_answer(text, &value);
        if (rc == 0) lookup_descriptor(value);
        else if (rc == FERRY_ERR_NOT_IMPLEMENTED) lookup_descriptor(text); /* etcd not built in */
        else if (rc != FERRY_ERR_NOT_FOUND && rc != FERRY_ERR_METADATA) abort();
        free(value);
    } else {
        lookup_descriptor(text);
    }
    free(text);
    return 0;
}

static size_t put(uint8_t *buf, size_t cap, uint8_t mode, const char *text)
{
    size_t n = strlen(text);
    if (n + 1 > cap) return 0;
    buf[0] = mode;
    memcpy(buf + 1, text, n);
    return n + 1;
}

size_t fuzz_seed(int i, uint8_t *buf, size_t cap)
{
    /* base64 of {"host":"127.0.0.1","port":7000,"epoch":"00000000000000ab","protocol":1} */
    static const char *const seeds[] = {
        "{\"name\":\"127.0.0.1:7000\",\"host\":\"127.0.0.1\",\"port\":7000,\"epoch\":\"3f2a000000000001\","
        "\"engine_id\":\"0000000000001234\",\"protocol\":1,\"pid\":1234}",
        "{\"host\":\"127.0.0.1\",\"port\":70000,\"epoch\":\"1\",\"protocol\":1}",
        "{\"host\":12,\"port\":\"7000\",\"epoch\":null,\"protocol\":[]}",
        "[1,2,3]",
        "{\"host\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\",\"port\":1,\"epoch\":\"ffffffffffffffffff\","
        "\"protocol\":1}",
        "{\"header\":{\"revision\":\"7\"},\"kvs\":[{\"key\":\"Zm9v\",\"value\":"
        "\"eyJob3N0IjoiMTI3LjAuMC4xIiwicG9ydCI6NzAwMCwiZXBvY2giOiIwMDAwMDAwMDAwMDAwMGFiIiwicHJvdG9jb2wiOjF9\"}],"
        "\"count\":\"1\"}",
        "{\"header\":{},\"kvs\":[{\"key\":\"Zm9v\",\"value\":\"!!notbase64\"}]}",
        "{\"header\":{},\"kvs\":[{\"key\":\"Zm9v\"}]}",
        "{\"header\":{},\"kvs\":[]}",
        "{\"kvs\":{\"value\":\"QQ==\"}}",
    };
    static const uint8_t modes[] = {0, 0, 0, 0, 0, 1, 1, 1, 1, 1};
    if (i < (int)(sizeof seeds / sizeof seeds[0])) return put(buf, cap, modes[i], seeds[i]);
    if (i == (int)(sizeof seeds / sizeof seeds[0]) && cap >= 17) {
        static const uint8_t table[] = {2, 1, 10, 2, 20, 1, 30, 0x81, 0, 3, 5, 0x82, 0, 1, 60, 0x83, 0};
        memcpy(buf, table, sizeof table);
        return sizeof table;
    }
    return 0;
}
