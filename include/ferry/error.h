/* SPDX-License-Identifier: Apache-2.0 */
/* Ferry error codes.
 *
 * Every Ferry call returns 0 (or a non-negative count) on success and one of
 * these negative codes on failure. Where Mooncake's Transfer Engine has a code
 * with the same meaning, Ferry keeps its numeric value, so callers that switch
 * engines keep their error handling.
 *
 * The code alone tells whether a retry can help: ferry_error_retryable().
 * The calling thread's last failure is described in full (peer, addresses,
 * sizes, failing step) by ferry_last_error_detail().
 */
#ifndef FERRY_ERROR_H
#define FERRY_ERROR_H

#include <ferry/export.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X(NAME, value, retryable, meaning) -- the single table of codes. */
#define FERRY_ERROR_TABLE(X)                                                          \
    X(OK, 0, 0, "success")                                                            \
    X(INVALID_ARGUMENT, -1, 0, "an argument is invalid (NULL, zero or overflowing length, bad opcode)") \
    X(TOO_MANY_REQUESTS, -2, 1, "the batch or queue has no room for more requests")  \
    X(ADDRESS_NOT_REGISTERED, -3, 0, "the address range is not inside a registered region") \
    X(BATCH_BUSY, -4, 1, "the batch still has requests in flight")                   \
    X(DEVICE_NOT_FOUND, -6, 0, "no device for the requested transport")              \
    X(ADDRESS_OVERLAPPED, -7, 0, "the range overlaps an already registered region")  \
    X(DNS, -101, 1, "the peer's host name could not be resolved")                    \
    X(SOCKET, -102, 1, "a socket operation failed (connect refused, reset, bind)")   \
    X(MALFORMED_FRAME, -103, 0, "a malformed or oversized frame was received")       \
    X(REJECT_HANDSHAKE, -104, 0, "the peer rejected the handshake")                  \
    X(METADATA, -200, 1, "the metadata service failed or holds no entry for the peer") \
    X(ENDPOINT, -201, 1, "no usable endpoint to the peer")                           \
    X(CONTEXT, -202, 0, "the engine is not initialised or is shutting down")         \
    X(NUMA, -300, 0, "NUMA placement failed")                                        \
    X(CLOCK, -301, 0, "the clock could not be read")                                 \
    X(MEMORY, -302, 1, "out of memory")                                              \
    X(NOT_IMPLEMENTED, -303, 0, "the operation is not supported by this build or transport") \
    X(TIMEOUT, -400, 1, "the operation did not finish before its deadline")          \
    X(PEER_CLOSED, -401, 1, "the peer closed the connection")                        \
    X(PEER_RESTARTED, -402, 0, "the peer restarted (new epoch); its old addresses are void") \
    X(VERSION_MISMATCH, -403, 0, "the peer speaks an incompatible protocol version") \
    X(OUT_OF_BOUNDS, -404, 0, "the range crosses the end of its registered region")  \
    X(ACCESS_DENIED, -405, 0, "the region is registered but not remote-accessible")  \
    X(CHECKSUM_MISMATCH, -406, 1, "the data arrived corrupted (checksum mismatch)")  \
    X(CANCELLED, -407, 0, "the request was cancelled")                               \
    X(AUTH_FAILED, -408, 0, "the peer failed the shared-secret authentication")      \
    X(STALE_SEGMENT, -409, 1, "the peer re-registered the region since it was looked up") \
    X(SESSION_INVALID, -410, 0, "the session was closed or invalidated")            \
    X(NOT_FOUND, -411, 0, "no such batch, session or entry")                         \
    X(CANCEL_UNCONFIRMED, -412, 0, "cancel could not be confirmed by the peer; late writes are possible") \
    X(INTERNAL, -500, 0, "an internal error (a bug in Ferry)")

enum ferry_error {
#define FERRY_X_ENUM(name, value, retry, text) FERRY_ERR_##name = (value),
    FERRY_ERROR_TABLE(FERRY_X_ENUM)
#undef FERRY_X_ENUM
};

/* Mooncake compatibility alias (its -103 is MALFORMED_JSON). */
#define FERRY_ERR_MALFORMED_JSON FERRY_ERR_MALFORMED_FRAME

/* "ADDRESS_NOT_REGISTERED" for -3; "UNKNOWN" for a value not in the table. */
FERRY_API const char *ferry_error_name(int code);
/* One line: what the code means. */
FERRY_API const char *ferry_strerror(int code);
/* Likely causes and what to do, a few lines of text (for `ferry explain`). */
FERRY_API const char *ferry_error_advice(int code);
/* 1 when retrying the same operation may succeed, 0 when it cannot. */
FERRY_API int ferry_error_retryable(int code);
/* Looks a code up by name ("TIMEOUT", "FERRY_ERR_TIMEOUT") or number; 1 found. */
FERRY_API int ferry_error_parse(const char *text, int *code);

/* The calling thread's last failure in full, e.g.
 * "write to 127.0.0.1:7001 [0x7f..+4096) failed at target validation:
 *  ADDRESS_NOT_REGISTERED (-3): range ends 128 bytes past region [..)".
 * Empty string when the thread saw no failure. Valid until the thread's next
 * Ferry call. */
FERRY_API const char *ferry_last_error_detail(void);
/* The code of the calling thread's last failure (0 if none). */
FERRY_API int ferry_last_error_code(void);
FERRY_API void ferry_clear_last_error(void);

#ifdef __cplusplus
}
#endif
#endif
