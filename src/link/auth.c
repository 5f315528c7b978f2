/* SPDX-License-Identifier: Apache-2.0 */
/* Shared-secret authentication (see auth.h): HMAC-SHA256 from libcrypto. */
#include "auth.h"

#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "util/fail.h"

static const char *const labels[2] = {"ferry-auth-v1 initiator", "ferry-auth-v1 target"};

int ferry_auth_nonce(uint8_t out[FERRY_WIRE_NONCE_SIZE])
{
    if (RAND_bytes(out, FERRY_WIRE_NONCE_SIZE) != 1)
        return ferry_fail(FERRY_ERR_INTERNAL, "auth: the random generator failed to make a nonce");
    return 0;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

int ferry_auth_mac(const char *secret, int role, const uint8_t *hello, size_t hlen, const uint8_t *ack, size_t alen,
                   uint8_t out[FERRY_WIRE_MAC_SIZE])
{
    /* label NUL | u32 hlen | hello | u32 alen | ack: lengths make the
     * concatenation unambiguous. Both payloads are bounded by the hello's
     * maximum size. */
    enum { CAP = 32 + 2 * (4 + FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME) };
    uint8_t msg[CAP];
    const char *label = labels[role == FERRY_AUTH_TARGET];
    size_t ln = strlen(label) + 1;
    if (!secret || ln + 8 + hlen + alen > CAP)
        return ferry_fail(FERRY_ERR_INTERNAL, "auth: no secret or transcript of %zu bytes too long", hlen + alen);
    size_t k = 0;
    memcpy(msg + k, label, ln), k += ln;
    put32(msg + k, (uint32_t)hlen), k += 4;
    memcpy(msg + k, hello, hlen), k += hlen;
    put32(msg + k, (uint32_t)alen), k += 4;
    memcpy(msg + k, ack, alen), k += alen;
    unsigned int mlen = 0;
    size_t slen = strlen(secret);
    if (!HMAC(EVP_sha256(), secret, (int)(slen > 0x7fffffff ? 0x7fffffff : slen), msg, k, out, &mlen) ||
        mlen != FERRY_WIRE_MAC_SIZE)
        return ferry_fail(FERRY_ERR_INTERNAL, "auth: HMAC-SHA256 failed");
    return 0;
}

bool ferry_auth_equal(const uint8_t a[FERRY_WIRE_MAC_SIZE], const uint8_t b[FERRY_WIRE_MAC_SIZE])
{
    return CRYPTO_memcmp(a, b, FERRY_WIRE_MAC_SIZE) == 0;
}
