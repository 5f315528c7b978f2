/* SPDX-License-Identifier: Apache-2.0 */
/* A program as a user writes it against an installed Ferry: only
 * <ferry/ferry.h>, linked through pkg-config or find_package(ferry). It
 * moves bytes between two engines in this process over loopback, checks
 * them, and prints "consumer: OK <version>". */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <ferry/ferry.h>

#define LEN (1u << 20)

static unsigned char src[LEN], dst[LEN], back[LEN];

static int fail(const char *step, int rc)
{
    fprintf(stderr, "consumer: %s: %s (%d): %s\n", step, ferry_error_name(rc), rc, ferry_last_error_detail());
    return 1;
}

int main(void)
{
    if (strcmp(ferry_version(), FERRY_VERSION_STRING) != 0) {
        fprintf(stderr, "consumer: header %s, library %s\n", FERRY_VERSION_STRING, ferry_version());
        return 1;
    }
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.host = "127.0.0.1";
    cfg.timeout_ms = 20000;
    ferry_engine_t *a = NULL, *b = NULL;
    int rc = ferry_engine_create(&cfg, &a);
    if (rc) return fail("create a", rc);
    rc = ferry_engine_create(&cfg, &b);
    if (rc) return fail("create b", rc);

    for (size_t i = 0; i < LEN; i++) src[i] = (unsigned char)(i * 31 + 7);
    if ((rc = ferry_register(a, src, LEN, FERRY_MEM_LOCAL)) != 0) return fail("register src", rc);
    if ((rc = ferry_register(a, back, LEN, FERRY_MEM_LOCAL)) != 0) return fail("register back", rc);
    if ((rc = ferry_register(b, dst, LEN, FERRY_MEM_REMOTE)) != 0) return fail("register dst", rc);

    const char *peer = ferry_engine_name(b);
    rc = ferry_transfer_sync(a, peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, LEN);
    if (rc) return fail("write", rc);
    rc = ferry_transfer_sync(a, peer, FERRY_OP_READ, back, (uint64_t)(uintptr_t)dst, LEN);
    if (rc) return fail("read", rc);
    if (memcmp(src, dst, LEN) != 0 || memcmp(src, back, LEN) != 0) {
        fprintf(stderr, "consumer: bytes differ after the round trip\n");
        return 1;
    }

    ferry_stats_t st;
    if ((rc = ferry_engine_stats(a, &st)) != 0) return fail("stats", rc);
    ferry_peer_info_t info;
    if ((rc = ferry_session_info(a, peer, &info)) != 0) return fail("session info", rc);
    printf("consumer: OK %s: %llu bytes written, %llu read, over %s\n", ferry_version(),
           (unsigned long long)st.bytes_written, (unsigned long long)st.bytes_read, info.transport);
    ferry_engine_destroy(a);
    ferry_engine_destroy(b);
    return st.bytes_written == LEN && st.bytes_read == LEN ? 0 : 1;
}
