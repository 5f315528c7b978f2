/* SPDX-License-Identifier: Apache-2.0 */
/* Ferry KV-cache transfer for prefill/decode disaggregation.
 *
 * A prefill rank holds the KV cache of a request in pages; the decode rank
 * that continues the request has its own pages (different indices, possibly
 * a different tensor-parallel split). This module plans the copy: which
 * bytes go where, in as few contiguous blocks as possible, and, where the
 * head split makes a token's bytes non-contiguous on one side, a staging
 * path (gather into a contiguous buffer, one bulk move, scatter out).
 *
 * Cache layout (like SGLang's paged buffers): each buffer of each layer is
 * [num_pages][page_size][row], token-major within a page, where a token's
 * row is
 *   FERRY_KV_SPLIT  K buffer and V buffer, row = [kv_heads][head_dim]
 *   FERRY_KV_FUSED  one buffer,            row = [2][kv_heads][head_dim] (K then V)
 *   FERRY_KV_MLA    one latent buffer,     row = mla_row_bytes, the same on every TP rank
 * The element size is dtype_size bytes.
 *
 * Tensor parallelism: the model's total_kv_heads H are split across TP
 * ranks; rank r of tp holds heads [r*H/tp, (r+1)*H/tp). When tp > H (and tp
 * is a multiple of H) each head is replicated on tp/H consecutive ranks and
 * rank r holds head r/(tp/H). MLA rows are never split: every rank holds them.
 *
 * Addresses are uint64_t so that a descriptor can name a peer's memory
 * (what a decode rank advertises to prefill) as well as local memory.
 * Page indices are int32_t, like the index tensors of SGLang.
 */
#ifndef FERRY_KV_H
#define FERRY_KV_H

#include <stddef.h>
#include <stdint.h>

#include <ferry/error.h>
#include <ferry/ferry.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ the cache */

enum ferry_kv_kind { FERRY_KV_SPLIT = 0, FERRY_KV_FUSED = 1, FERRY_KV_MLA = 2 };

typedef struct ferry_kv_cache_desc {
    int kind;                /* enum ferry_kv_kind */
    uint32_t num_layers;
    uint32_t num_pages;      /* pages in each buffer */
    uint32_t page_size;      /* tokens per page */
    uint32_t kv_heads;       /* KV heads held by this rank (SPLIT, FUSED) */
    uint32_t total_kv_heads; /* the model's KV heads H; 0 means kv_heads * tp_size */
    uint32_t head_dim;       /* elements per head (SPLIT, FUSED) */
    uint32_t dtype_size;     /* bytes per element (SPLIT, FUSED) */
    uint32_t mla_row_bytes;  /* bytes per token per layer (MLA) */
    uint32_t tp_rank;
    uint32_t tp_size;
    /* Base address of each layer's buffer, num_layers entries each:
     * K (SPLIT), fused KV (FUSED) or latent (MLA) in k_addrs; V in v_addrs
     * (SPLIT only, NULL otherwise). Either may be NULL in a descriptor used
     * only for sizes or for the other side's TP geometry. */
    const uint64_t *k_addrs;
    const uint64_t *v_addrs;
} ferry_kv_cache_desc_t;

/* 0 when the descriptor is consistent; INVALID_ARGUMENT naming the field. */
FERRY_API int ferry_kv_cache_validate(const ferry_kv_cache_desc_t *d);
/* Buffers per layer: 2 for SPLIT, 1 otherwise. */
FERRY_API uint32_t ferry_kv_buffers_per_layer(const ferry_kv_cache_desc_t *d);
/* Bytes of one token's row in one buffer of one layer. */
FERRY_API uint64_t ferry_kv_token_bytes(const ferry_kv_cache_desc_t *d);
/* Bytes of one page of one buffer: page_size * token bytes. */
FERRY_API uint64_t ferry_kv_page_bytes(const ferry_kv_cache_desc_t *d);
/* The heads rank tp_rank of tp_size holds out of total_heads. 0 or
 * INVALID_ARGUMENT when neither divides the other. */
FERRY_API int ferry_kv_rank_heads(uint32_t total_heads, uint32_t tp_size, uint32_t tp_rank,
                        uint32_t *first, uint32_t *count);

/* --------------------------------------------------------- coalescing */

/* One contiguous copy: [src, src+len) -> [dst, dst+len). */
typedef struct ferry_kv_block {
    uint64_t src;
    uint64_t dst;
    uint64_t len;
} ferry_kv_block_t;

/* Checks that n page indices are each in [0, num_pages) and distinct.
 * INVALID_ARGUMENT naming the side ("prefill"/"decode" as given in side),
 * the position and the index otherwise. */
FERRY_API int ferry_kv_check_pages(const char *side, const int32_t *pages, size_t n, uint32_t num_pages);

/* Blocks for one buffer: page src_pages[i] of the buffer at src_base goes to
 * page dst_pages[i] of the buffer at dst_base (page_bytes each). Runs where
 * both indices step by one become one block. Writes at most max blocks to
 * out (n blocks always suffice; out may be NULL with max 0 to count) and
 * returns the number of blocks, or a negative code (bad or duplicate index,
 * or max too small). *bytes, when not NULL, gets the bytes covered. */
FERRY_API long ferry_kv_coalesce_pages(uint64_t src_base, uint64_t dst_base, uint64_t page_bytes,
                             const int32_t *src_pages, uint32_t src_num_pages,
                             const int32_t *dst_pages, uint32_t dst_num_pages, size_t n,
                             ferry_kv_block_t *out, size_t max, uint64_t *bytes);

/* ------------------------------------------------ tensor-parallel mapping */

/* A run of heads that one prefill rank gives one decode rank. Offsets are in
 * heads within each rank's own rows. */
typedef struct ferry_kv_head_slice {
    uint32_t prefill_rank;
    uint32_t decode_rank;
    uint32_t src_head;  /* first head within the prefill rank's row */
    uint32_t dst_head;  /* first head within the decode rank's row */
    uint32_t heads;     /* how many */
} ferry_kv_head_slice_t;

/* The prefill ranks a decode rank receives from, one slice each, in order of
 * dst_head. When a head is replicated on several prefill ranks, the one
 * serving decode rank d is replica d % replicas, to spread the load. MLA
 * caches pass total_heads 1. Writes up to max slices, returns how many
 * exist, or INVALID_ARGUMENT. */
FERRY_API long ferry_kv_tp_sources(uint32_t total_heads, uint32_t prefill_tp, uint32_t decode_tp,
                         uint32_t decode_rank, ferry_kv_head_slice_t *out, size_t max);
/* The decode ranks a prefill rank sends to (the same slices, seen from the
 * sender), ascending by decode rank. */
FERRY_API long ferry_kv_tp_targets(uint32_t total_heads, uint32_t prefill_tp, uint32_t decode_tp,
                         uint32_t prefill_rank, ferry_kv_head_slice_t *out, size_t max);

/* --------------------------------------------------------------- plans */

/* How one (prefill rank -> decode rank) pair moves its bytes. */
enum ferry_kv_mode {
    FERRY_KV_MODE_NONE = 0,   /* the pair shares no heads: nothing to move */
    FERRY_KV_MODE_DIRECT = 1, /* whole rows on both sides: page blocks */
    FERRY_KV_MODE_STAGED = 2  /* a head slice of a row on at least one side */
};

/* A staged pair's bytes in staging memory, on either side:
 *   [layer][buffer][token][part][heads][head_dim]
 * with token = position in the page list * page_size + token in page, and
 * part 0..1 for FUSED (K, V), 0 otherwise. The decode rank's staging buffer
 * holds one such region per prefill source that needs a scatter, at
 * dst_staging_offset (the rank offset), in ferry_kv_tp_sources order.
 * Only the side whose rows are cut stages: the sender gathers when it holds
 * more heads than it sends, the receiver scatters when the pair fills only
 * part of its rows; the other side's pages are read or written directly. */
typedef struct ferry_kv_plan_info {
    size_t struct_size;          /* sizeof(ferry_kv_plan_info_t), set by the ferry_kv_plan_get_info macro */
    int mode;                    /* enum ferry_kv_mode */
    int gather;                  /* 1: sender gathers into its staging first */
    int scatter;                 /* 1: receiver scatters from its staging after */
    ferry_kv_head_slice_t slice; /* the heads this pair moves */
    size_t pages;
    uint64_t bytes;              /* payload bytes this pair moves */
    uint64_t per_layer_bytes;    /* staging bytes of one layer (all its buffers) */
    uint64_t src_staging_bytes;  /* sender staging needed (0 without gather) */
    uint64_t dst_staging_bytes;  /* decode rank's whole staging need, all sources */
    uint64_t dst_staging_offset; /* this pair's region in it (without scatter: 0) */
    size_t blocks;               /* transfer blocks (0 until bind_sender) */
} ferry_kv_plan_info_t;

typedef struct ferry_kv_plan ferry_kv_plan_t;

/* Plans the move of n pages from the prefill rank described by src to the
 * decode rank described by dst (their tp_rank and tp_size pick the pair).
 * The descriptors must agree on the model (kind, layers, page size, heads,
 * head size). The page lists are copied; the address arrays are read again
 * by bind, gather and scatter, so they must outlive the plan. */
FERRY_API int ferry_kv_plan_create(const ferry_kv_cache_desc_t *src, const ferry_kv_cache_desc_t *dst,
                         const int32_t *src_pages, const int32_t *dst_pages, size_t n,
                         ferry_kv_plan_t **out);
/* Must not race with a use of p. Threads may send along one bound plan at
 * once unless it gathers (they would share its staging buffer). */
FERRY_API void ferry_kv_plan_destroy(ferry_kv_plan_t *p);
FERRY_API void ferry_kv_plan_get_info(const ferry_kv_plan_t *p, ferry_kv_plan_info_t *info);
#define ferry_kv_plan_get_info(p, info) (ferry_kv_plan_get_info)((p), FERRY_SIZED_(ferry_kv_plan_info_t, info))

/* Sender side: gives the plan its staging memory and computes the transfer
 * blocks (sender addresses -> receiver addresses). Needs src and dst
 * addresses in the descriptors; src_staging (local, src_len bytes) when the
 * plan gathers; dst_staging, the decode rank's whole staging buffer as the
 * receiver advertised it (dst_len bytes; this pair writes at
 * dst_staging_offset), when it scatters. Unused ones may be 0.
 * INVALID_ARGUMENT names what is missing or short, and the size needed. */
FERRY_API int ferry_kv_plan_bind_sender(ferry_kv_plan_t *p, uint64_t src_staging, uint64_t src_len,
                              uint64_t dst_staging, uint64_t dst_len);
/* Receiver side: needs dst addresses (local memory) and, when the plan
 * scatters, the local staging buffer that the sender writes into. */
FERRY_API int ferry_kv_plan_bind_receiver(ferry_kv_plan_t *p, uint64_t dst_staging, uint64_t dst_len);
/* The blocks computed by bind_sender; *count gets how many. NULL (and 0)
 * before it. */
FERRY_API const ferry_kv_block_t *ferry_kv_plan_blocks(const ferry_kv_plan_t *p, size_t *count);

/* Sender side: copies this pair's head slice of every page into src
 * staging, so that the blocks can read it. 0 at once without gather;
 * INVALID_ARGUMENT before bind_sender. */
FERRY_API int ferry_kv_gather(const ferry_kv_plan_t *p);
/* Receiver side, after every byte landed: copies the pair's region of the
 * staging buffer into the decode pages. 0 at once without scatter;
 * INVALID_ARGUMENT before bind_receiver. */
FERRY_API int ferry_kv_scatter(const ferry_kv_plan_t *p);

/* -------------------------------------------------- completion notices */

/* What a sender tells the decode side about one request from one prefill
 * rank, through ferry_notify: sent only after every byte of the request was
 * acknowledged by the receiver, or to report why it never will be. */
#define FERRY_KV_AUX_MAX 32768u   /* auxiliary bytes (first token, logprobs, ...) */
#define FERRY_KV_REASON_MAX 512u  /* failure reason, NUL included */
#define FERRY_KV_NOTICE_HEADER 40u

typedef struct ferry_kv_notice {
    uint64_t request_id;
    int status;            /* 0: every byte landed; else the sender's failure code, a
                            * FERRY_ERR_* of error.h: encode and decode refuse any
                            * other value (INVALID_ARGUMENT / MALFORMED_FRAME) */
    uint32_t prefill_rank; /* the sender's TP rank */
    uint32_t decode_rank;
    uint64_t bytes;        /* payload bytes the sender moved for this request */
    size_t aux_len;
    const unsigned char *aux; /* encode: the caller's; decode: points into the message */
    char reason[FERRY_KV_REASON_MAX]; /* failure detail, "" on success */
} ferry_kv_notice_t;

/* Bytes ferry_kv_notice_encode writes for n. */
FERRY_API size_t ferry_kv_notice_size(const ferry_kv_notice_t *n);
/* Writes n into buf (cap bytes); returns the length, or INVALID_ARGUMENT
 * (aux over FERRY_KV_AUX_MAX, cap too small). Little-endian, versioned. */
FERRY_API long ferry_kv_notice_encode(const ferry_kv_notice_t *n, void *buf, size_t cap);
/* Reads a message: 1 and *out when it is a KV notice (out->aux points into
 * msg), 0 when it is some other message, MALFORMED_FRAME when it claims to
 * be a KV notice but is truncated or inconsistent. */
FERRY_API int ferry_kv_notice_decode(const void *msg, size_t len, ferry_kv_notice_t *out);

/* ------------------------------------------------ sending over an engine
 *
 * Memory: the sender's KV pools and its gather staging, and the receiver's
 * KV pools and its staging buffer, are registered once (at allocation) with
 * their engines: the sender's as sources, the receiver's with
 * FERRY_MEM_REMOTE_WRITE. Nothing is registered per send. */

typedef struct ferry_kv_send_args {
    uint64_t request_id;
    const void *aux;    /* delivered with the success notice (first token, ...) */
    size_t aux_len;     /* <= FERRY_KV_AUX_MAX */
    int timeout_ms;     /* the whole send; <= 0: the engine's timeout_ms */
} ferry_kv_send_args_t;

/* Moves one request's KV along a sender-bound plan to the decode rank at
 * peer: checks that a staging target lies in a region the peer registered
 * for remote write, gathers, submits every block as one batch, waits until
 * the peer acknowledged every byte, then notifies it a success notice
 * carrying the aux bytes. When any step fails it notifies a failure notice
 * instead (status = the code, reason = the detail) and returns the code;
 * the detail names the request, the peer and the step.
 * Restarts: a plan's sends are pinned to one process of the decode rank,
 * the epoch of the pinned peer name ("host:port#epoch", ferry.h) of its
 * first send, or, for a plain name, the session's epoch at that first
 * send. Every later send of the plan, and every step of each (staging
 * check, blocks, notices), goes to that epoch only: a decode restarted at
 * the same port gets nothing under the old layout, PEER_RESTARTED every
 * time (no notice either). A send pinned to another epoch than the plan's
 * fails PEER_RESTARTED. To pin from the moment the layout is learned, have
 * the decode advertise its pinned name with it (its host:port and
 * ferry_engine_epoch) and pass that name, or call ferry_session_pin when
 * the layout arrives: a plain name pins a new plan only at its first send,
 * so a restart between learning the layout and that send is not seen. */
FERRY_API int ferry_kv_send(ferry_engine_t *e, const char *peer, const ferry_kv_plan_t *plan,
                  const ferry_kv_send_args_t *args);
/* Tells the decode rank that this prefill rank will not deliver request_id
 * (aborted, out of memory, ...): a failure notice with status and reason. */
FERRY_API int ferry_kv_send_failure(ferry_engine_t *e, const char *peer, uint64_t request_id,
                          uint32_t prefill_rank, uint32_t decode_rank, int status,
                          const char *reason);

/* One entry of the engine's notification queue as the KV layer sees it.
 * Other messages are kept whole, so that polling loses nothing. */
typedef struct ferry_kv_event {
    int is_notice;             /* 1: notice is valid; 0: another message */
    ferry_kv_notice_t notice;  /* its aux points into raw.msg */
    ferry_notification_t raw;  /* owned; freed by ferry_kv_events_free */
} ferry_kv_event_t;

/* Moves up to max queued notifications into out; returns how many. A
 * message that claims to be a notice but is malformed (a status that is
 * not 0 or a Ferry code included) comes back as is_notice 0. */
FERRY_API long ferry_kv_poll(ferry_engine_t *e, ferry_kv_event_t *out, size_t max);
/* The same, with from[i] (an array of max, or NULL) describing out[i]'s
 * sender as this engine observed it: the connection's source address, the
 * engine id and epoch of its handshake (ferry.h, ferry_notification_sender_t).
 * A verified tracker (ferry_kv_recv_verify) needs it. */
FERRY_API long ferry_kv_poll_from(ferry_engine_t *e, ferry_kv_event_t *out, ferry_notification_sender_t *from,
                                  size_t max);
FERRY_API void ferry_kv_events_free(ferry_kv_event_t *ev, size_t n);

/* A decode rank's view of one request: one receiver-bound plan per prefill
 * source (ferry_kv_tp_sources). Threads may offer notices to one tracker at
 * once; destroy must not race with them. */
typedef struct ferry_kv_recv ferry_kv_recv_t;

FERRY_API int ferry_kv_recv_create(uint64_t request_id, ferry_kv_plan_t *const *plans, size_t n,
                         ferry_kv_recv_t **out);
FERRY_API void ferry_kv_recv_destroy(ferry_kv_recv_t *r);
/* Feeds one notice. A source's success notice scatters its staging region
 * at once (a verified tracker's only once verified: below). Returns 0 (another request's notice, a repeat, or sources still
 * missing), 1 once every source delivered (the KV is in place), or the
 * status of a source's failure notice, the detail carrying its reason;
 * INVALID_ARGUMENT for a notice from a prefill rank this request does not
 * expect. After 1 or a failure, later notices return the same outcome. */
FERRY_API int ferry_kv_recv_offer(ferry_kv_recv_t *r, const ferry_kv_notice_t *n);
/* The aux bytes of the first success notice that carried any. */
FERRY_API const void *ferry_kv_recv_aux(const ferry_kv_recv_t *r, size_t *len);

/* Verified completion. A notice is a claim: anyone who can notify this
 * engine (without a secret, anyone who can connect; with one, any holder)
 * can write one. A verified tracker takes it only when the transfer layer
 * backs it:
 *  - the notice's sender, as this engine observed it (engine id and epoch
 *    of its handshake, and the connection's source IP when host is set),
 *    is the source given here for the notice's prefill rank;
 *  - for a success notice, this engine's target side counted, from writes
 *    placed by connections of that same source, at least the pair's bytes
 *    (plan info's bytes) inside the pair's destination on this rank: its
 *    staging region when the plan scatters, else its decode pages. The
 *    count starts at ferry_kv_recv_verify, so call it before the prefill
 *    side may send, and it is a count, not a map: bytes the source wrote
 *    twice count twice (a source can always write wrong bytes; what this
 *    stops is a completion no bytes, or another engine's bytes, back).
 * Only then is a success notice's staging region scattered and the source
 * counted delivered, and only a verified source's failure notice fails the
 * request. Anything else is refused: ferry_kv_recv_offer_from returns
 * ACCESS_DENIED (the detail names what did not match), counts it
 * (ferry_kv_recv_refused), and leaves the tracker as it was: keep polling.
 * Limits: the source's identity is what its handshake claimed; with a
 * secret only holders can claim one, and host pins the source's address
 * (which a peer off its host cannot choose). Writes this engine's CPU does
 * not see (RDMA one-sided writes, mapped shared pools) are not counted:
 * verify suits the tcp and shm transports. */
typedef struct ferry_kv_source {
    uint64_t engine_id; /* the prefill engine's, e.g. from ferry_session_info */
    uint64_t epoch;
    char host[64];      /* its IP address ("10.0.0.5", "::1"); "" accepts any */
} ferry_kv_source_t;

/* Makes r a verified tracker of engine e (the decode rank's): sources[i]
 * is the source of r's plan i (as given to ferry_kv_recv_create). From then
 * on, notices must come with their sender (ferry_kv_recv_offer_from);
 * ferry_kv_recv_offer refuses them. 0, INVALID_ARGUMENT (called twice, a
 * host that is not an IP address) or MEMORY. */
FERRY_API int ferry_kv_recv_verify(ferry_kv_recv_t *r, ferry_engine_t *e, const ferry_kv_source_t *sources);
/* ferry_kv_recv_offer with the notice's sender (ferry_kv_poll_from), which
 * a verified tracker checks as described above. Notices with a status that
 * is not 0 or a Ferry code are refused by every tracker (ACCESS_DENIED,
 * counted). */
FERRY_API int ferry_kv_recv_offer_from(ferry_kv_recv_t *r, const ferry_kv_notice_t *n,
                                       const ferry_notification_sender_t *from);
/* Notices r refused so far. */
FERRY_API uint64_t ferry_kv_recv_refused(const ferry_kv_recv_t *r);

/* -------------------------------------------------------- embeddings
 *
 * A per-request buffer registered once with the engine and reused by every
 * send of the request (multimodal embeddings, hidden states, ...). */
typedef struct ferry_kv_embed ferry_kv_embed_t;

FERRY_API int ferry_kv_embed_create(ferry_engine_t *e, size_t capacity, ferry_kv_embed_t **out);
/* Deregisters and frees. NULL is ignored. Must not race with a send on b. */
FERRY_API void ferry_kv_embed_destroy(ferry_kv_embed_t *b);
FERRY_API void *ferry_kv_embed_data(ferry_kv_embed_t *b);
FERRY_API size_t ferry_kv_embed_capacity(const ferry_kv_embed_t *b);
/* Writes the first len bytes to remote at peer, waits for the peer's
 * acknowledgement, then notifies a success notice (bytes = len, aux from
 * args); on failure, a failure notice, as ferry_kv_send. */
FERRY_API int ferry_kv_embed_send(ferry_kv_embed_t *b, const char *peer, size_t len, uint64_t remote,
                        const ferry_kv_send_args_t *args);

#ifdef __cplusplus
}
#endif
#endif
