/* SPDX-License-Identifier: Apache-2.0 */
/* ThreadSanitizer and the bytes of a transfer.
 *
 * A transfer's payload lives in the application's registered memory. The
 * engine moves it with recv()/send()/process_vm_*() and memcpy on its own
 * threads, and the application touches the same bytes before a write and
 * after its acknowledgement. Those accesses are ordered by the protocol (a
 * write is acknowledged only after placement, a read answered only after
 * the request arrived), through the kernel's sockets, where TSan sees no
 * happens-before edge. Suppressing the reports by function name hides them
 * but costs dearly: TSan still finds each racing word and matches it
 * against the suppressions, so an application memset of 2 MB the engine
 * had written takes minutes (it made the TSan stage's small-piece tests
 * run past their deadlines).
 *
 * So each function that moves payload between a socket (or a peer's
 * memory) and registered memory opens FERRY_TSAN_PAYLOAD_SCOPE() first: in
 * a TSan build, the thread's plain reads and writes are neither recorded
 * nor checked until the function returns (synchronisation still is). That
 * is the set tests/tsan.supp named, no wider: races of the engine's own
 * state in any other function are still reported. Elsewhere it is nothing.
 *
 * Not a public header. */
#ifndef FERRY_CORE_TSAN_H
#define FERRY_CORE_TSAN_H

#if defined(__SANITIZE_THREAD__)
#define FERRY_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FERRY_TSAN 1
#endif
#endif

#ifdef FERRY_TSAN
/* TSan's dynamic annotations (libtsan defines them). */
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);
void AnnotateIgnoreWritesBegin(const char *file, int line);
void AnnotateIgnoreWritesEnd(const char *file, int line);

static inline int ferry_tsan_payload_begin(void)
{
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
    return 0;
}

static inline void ferry_tsan_payload_end(int *scope)
{
    (void)scope;
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
}

/* Ends with the enclosing block, whichever return leaves it. */
#define FERRY_TSAN_PAYLOAD_SCOPE()                                                                                   \
    int ferry_tsan_payload_scope_ __attribute__((cleanup(ferry_tsan_payload_end), unused)) =                          \
        ferry_tsan_payload_begin()
#else
#define FERRY_TSAN_PAYLOAD_SCOPE() ((void)0)
#endif

#endif
