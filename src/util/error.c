/* SPDX-License-Identifier: Apache-2.0 */
/* The error table: names, meanings, retry advice, and the per-thread detail. */
#include <ferry/error.h>
#include <errno.h>
#include <limits.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fail.h"

struct error_entry {
    int code;
    int retryable;
    const char *name;
    const char *meaning;
};

static const struct error_entry error_table[] = {
#define FERRY_X_ENTRY(name, value, retry, text) {(value), (retry), #name, (text)},
    FERRY_ERROR_TABLE(FERRY_X_ENTRY)
#undef FERRY_X_ENTRY
};

#define ERROR_COUNT (sizeof error_table / sizeof error_table[0])

/* Causes seen in the field and what to do, for `ferry explain`. */
struct error_advice {
    int code;
    const char *text;
};

static const struct error_advice advice_table[] = {
    {FERRY_ERR_INVALID_ARGUMENT,
     "Causes: a NULL pointer, a zero length, a length that overflows the address space, an\n"
     "unknown opcode, or a malformed peer name (expected host:port).\n"
     "What to do: fix the caller; the detail names the argument. Retrying cannot help."},
    {FERRY_ERR_TOO_MANY_REQUESTS,
     "Causes: a batch received more requests than its capacity, or the engine queue is full.\n"
     "What to do: allocate a larger batch, or wait for earlier requests and retry."},
    {FERRY_ERR_ADDRESS_NOT_REGISTERED,
     "Causes: the local buffer or the remote range is not inside a registered region; the\n"
     "target deregistered it; the buffer was re-allocated (e.g. a staging buffer that grew)\n"
     "without registering the new memory; or the address belongs to another process.\n"
     "What to do: register the buffer before transferring (once, at allocation), re-register\n"
     "after growth, and check the address the peer advertised. The detail names the range\n"
     "and the nearest registered region."},
    {FERRY_ERR_BATCH_BUSY,
     "Causes: ferry_batch_free on a batch whose requests are still in flight.\n"
     "What to do: ferry_batch_wait or ferry_batch_cancel first."},
    {FERRY_ERR_DEVICE_NOT_FOUND,
     "Causes: a transport was forced (e.g. rdma) but no device for it exists on this host.\n"
     "What to do: use transport=auto or tcp, or check the device (ibv_devices)."},
    {FERRY_ERR_ADDRESS_OVERLAPPED,
     "Causes: the range overlaps a region that is already registered (double registration,\n"
     "or a sub-range of a registered pool).\n"
     "What to do: register each buffer once; deregister before registering a changed range."},
    {FERRY_ERR_DNS,
     "Causes: the host part of the peer name does not resolve.\n"
     "What to do: check the name; use an IP address; check /etc/hosts and DNS."},
    {FERRY_ERR_SOCKET,
     "Causes: nothing listens at the peer's port (the peer is down or not yet started), a\n"
     "firewall rejects the connection, or the connection was reset.\n"
     "What to do: check that the peer runs (`ferry doctor host:port`); retry after a\n"
     "backoff; if it persists, tear the session down and fail the request."},
    {FERRY_ERR_MALFORMED_FRAME,
     "Causes: the peer sent bytes that are not a Ferry frame (another service on that port),\n"
     "a frame with an out-of-range length or count, or a truncated frame.\n"
     "What to do: check that the port belongs to a Ferry engine of a compatible version."},
    {FERRY_ERR_REJECT_HANDSHAKE,
     "Causes: the peer refused the session (it is shutting down or at its session limit).\n"
     "What to do: check the peer's log; retry later."},
    {FERRY_ERR_METADATA,
     "Causes: the metadata service (etcd, Redis, HTTP) is unreachable, or holds no entry for the\n"
     "peer (it never started, or its lease expired after it died).\n"
     "What to do: check the service and the peer; existing sessions keep working."},
    {FERRY_ERR_ENDPOINT,
     "Causes: no transport can reach the peer.\n"
     "What to do: check addresses and transport settings (`ferry doctor`)."},
    {FERRY_ERR_CONTEXT,
     "Causes: the engine was destroyed (or is being destroyed) while the call ran.\n"
     "What to do: keep the engine alive until every transfer has returned."},
    {FERRY_ERR_MEMORY,
     "Causes: an allocation failed.\n"
     "What to do: free memory or reduce batch sizes; retrying may succeed."},
    {FERRY_ERR_NOT_IMPLEMENTED,
     "Causes: the operation needs a feature this build or transport lacks.\n"
     "What to do: rebuild with the feature, or use another transport."},
    {FERRY_ERR_TIMEOUT,
     "Causes: the peer stopped answering (hung, overloaded, or the network drops packets),\n"
     "or the deadline was too short for the size over this link.\n"
     "What to do: retry once; if it fails again, tear the session down and fail the\n"
     "request. Raise timeout_ms for very large transfers on slow links."},
    {FERRY_ERR_PEER_CLOSED,
     "Causes: the peer process exited or crashed, or closed the connection mid-transfer.\n"
     "What to do: retry once (the session reconnects); if the peer restarted, the retry\n"
     "reports PEER_RESTARTED."},
    {FERRY_ERR_PEER_RESTARTED,
     "Causes: the peer process restarted: its epoch changed, so every address learned from\n"
     "the old process is void. The call that finds the new epoch fails with this code and\n"
     "writes nothing (calls already under way with the old session fail too).\n"
     "A call pinned to the old epoch (\"host:port#epoch\") fails so every time.\n"
     "What to do: fetch the new process's buffer addresses and send again: the session\n"
     "re-opens by itself, so the next call learns the new process (no probe or\n"
     "ferry_session_open needed; ferry_session_open still works); pin them anew\n"
     "(ferry_session_pin) if you pin."},
    {FERRY_ERR_VERSION_MISMATCH,
     "Causes: the two engines run Ferry builds with incompatible protocol versions.\n"
     "What to do: upgrade both sides to the same release."},
    {FERRY_ERR_OUT_OF_BOUNDS,
     "Causes: the range starts inside a registered region but runs past its end (a wrong\n"
     "length, an offset computed with the wrong stride, or a region smaller than assumed).\n"
     "What to do: check offsets and lengths; the detail names the region and the overrun."},
    {FERRY_ERR_ACCESS_DENIED,
     "Causes: the region is registered for local use only, or without the access asked for\n"
     "(read vs write).\n"
     "What to do: register it with FERRY_MEM_REMOTE_READ / FERRY_MEM_REMOTE_WRITE."},
    {FERRY_ERR_CHECKSUM_MISMATCH,
     "Causes: bytes were corrupted between the two memories (faulty NIC, memory, or a bug).\n"
     "The data was not placed.\n"
     "What to do: retry; if it repeats, check the hardware path."},
    {FERRY_ERR_CANCELLED,
     "Causes: the caller cancelled the request.\nWhat to do: nothing; it did not land."},
    {FERRY_ERR_AUTH_FAILED,
     "Causes: the two engines do not share the same secret (FERRY_SECRET), or one has none.\n"
     "What to do: configure the same secret on both engines."},
    {FERRY_ERR_STALE_SEGMENT,
     "Causes: a key or mapping this engine holds belongs to an older registration of the\n"
     "target's region (RDMA, shared pools), and the range was not registered again in time\n"
     "for the call's own refetch (a target re-registering it over and over). A range that is\n"
     "registered when the target checks takes the write; one deregistered fails with\n"
     "ADDRESS_NOT_REGISTERED.\n"
     "What to do: fetch the peer's current buffer addresses, then retry."},
    {FERRY_ERR_SESSION_INVALID,
     "Causes: the session was closed, or invalidated after repeated failures.\n"
     "What to do: open the session again."},
    {FERRY_ERR_NOT_FOUND,
     "Causes: no such batch, session, notification or metadata entry.\n"
     "What to do: check the identifier."},
    {FERRY_ERR_CANCEL_UNCONFIRMED,
     "Causes: the peer could not be reached to confirm the cancel, so bytes of the request\n"
     "may still land in its memory.\n"
     "What to do: do not reuse the target pages until the peer confirms or is known dead.\n"
     "Ferry fences such requests again before its next request to that peer, so no byte of\n"
     "them lands after a later request that succeeded."},
    {FERRY_ERR_INTERNAL,
     "Causes: a bug in Ferry.\nWhat to do: report it with the detail string and a log (FERRY_LOG=3)."},
};

static const struct error_entry *find_entry(int code)
{
    for (size_t i = 0; i < ERROR_COUNT; i++)
        if (error_table[i].code == code) return &error_table[i];
    return NULL;
}

const char *ferry_error_name(int code)
{
    const struct error_entry *e = find_entry(code);
    return e ? e->name : "UNKNOWN";
}

const char *ferry_strerror(int code)
{
    const struct error_entry *e = find_entry(code);
    return e ? e->meaning : "unknown error code";
}

int ferry_error_retryable(int code)
{
    const struct error_entry *e = find_entry(code);
    return e ? e->retryable : 0;
}

const char *ferry_error_advice(int code)
{
    for (size_t i = 0; i < sizeof advice_table / sizeof advice_table[0]; i++)
        if (advice_table[i].code == code) return advice_table[i].text;
    return code == 0 ? "Nothing went wrong." : "No advice for this code.";
}

int ferry_error_parse(const char *text, int *code)
{
    if (!text || !*text || !code) return 0;
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (*end == '\0') {
        /* Out of int's range is no code: a cast would wrap 4294966894 to -402. */
        if (errno == ERANGE || v < INT_MIN || v > INT_MAX || !find_entry((int)v)) return 0;
        *code = (int)v;
        return 1;
    }
    if (strncasecmp(text, "FERRY_ERR_", 10) == 0) text += 10;
    if (strcasecmp(text, "MALFORMED_JSON") == 0) text = "MALFORMED_FRAME";
    for (size_t i = 0; i < ERROR_COUNT; i++) {
        if (strcasecmp(error_table[i].name, text) == 0) {
            *code = error_table[i].code;
            return 1;
        }
    }
    return 0;
}

/* ------------------------------------------------------- per-thread detail */

/* The message (contexts prefixed, outermost first) and code are kept apart;
 * the public detail is "NAME (code): message", built when asked for. */
#define DETAIL_MAX 1024

static _Thread_local char last_msg[DETAIL_MAX];
static _Thread_local char last_detail[DETAIL_MAX + 64];
static _Thread_local int last_code;

int ferry_fail(int code, const char *fmt, ...)
{
    char msg[DETAIL_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    last_code = code;
    memcpy(last_msg, msg, sizeof msg);
    return code;
}

int ferry_fail_context(const char *fmt, ...)
{
    char prefix[DETAIL_MAX];
    char old[DETAIL_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, last_msg, sizeof old);
    snprintf(last_msg, sizeof last_msg, "%s: %s", prefix, old);
    return last_code;
}

const char *ferry_fail_message(void) { return last_msg; }

const char *ferry_last_error_detail(void)
{
    if (!last_code && !last_msg[0]) return "";
    snprintf(last_detail, sizeof last_detail, "%s (%d): %s", ferry_error_name(last_code), last_code, last_msg);
    return last_detail;
}

int ferry_last_error_code(void) { return last_code; }

void ferry_clear_last_error(void)
{
    last_msg[0] = '\0';
    last_code = 0;
}
