/* SPDX-License-Identifier: Apache-2.0 */
/* Shared-secret authentication of the two engines of a connection.
 *
 * Mutual challenge-response with HMAC-SHA256 (OpenSSL's libcrypto). Both
 * HELLO payloads carry a fresh 32-byte random nonce; each side proves it
 * holds the secret by a MAC over the whole handshake transcript (both HELLO
 * payloads, hence both nonces, engine ids and epochs), under a label naming
 * its role, so that neither MAC can be replayed as the other or on another
 * connection:
 *
 *   initiator -> HELLO(nonce_i)          target -> HELLO_ACK(nonce_t, F_AUTH)
 *   initiator -> AUTH(mac("initiator"))  target verifies, then
 *                                        target -> AUTH_ACK(mac("target"))
 *   initiator verifies.
 *
 * The target sends its MAC only after the initiator's verified, so it is no
 * oracle for strangers. MACs are compared in constant time (CRYPTO_memcmp).
 * This authenticates the peers at connection set-up; it does not encrypt or
 * sign the frames that follow (use a private network or a tunnel for that). */
#ifndef FERRY_AUTH_H
#define FERRY_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire/wire.h"

enum ferry_auth_role { FERRY_AUTH_INITIATOR = 0, FERRY_AUTH_TARGET = 1 };

/* Fills out with cryptographically random bytes; 0 or INTERNAL. */
int ferry_auth_nonce(uint8_t out[FERRY_WIRE_NONCE_SIZE]);
/* The MAC that role sends, over the encoded HELLO (hello, hlen) and
 * HELLO_ACK (ack, alen) payloads. 0 or INTERNAL. */
int ferry_auth_mac(const char *secret, int role, const uint8_t *hello, size_t hlen, const uint8_t *ack, size_t alen,
                   uint8_t out[FERRY_WIRE_MAC_SIZE]);
/* Constant-time comparison of two MACs. */
bool ferry_auth_equal(const uint8_t a[FERRY_WIRE_MAC_SIZE], const uint8_t b[FERRY_WIRE_MAC_SIZE]);

#endif
