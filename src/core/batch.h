/* Batches (batch.c): cutting requests into pieces, the worker pool that
 * runs them on several connections at once. Private to the library. */
#ifndef FERRY_CORE_BATCH_H
#define FERRY_CORE_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include <ferry/ferry.h>

#include "xfer.h"

typedef struct ferry_session ferry_session_t;

/* A queued unit of an async batch: pieces run as one pipelined stream on
 * one connection by a worker. */
typedef struct ferry_task {
    ferry_batch_t *batch;
    ferry_session_t *session;  /* holds a reference */
    ferry_xfer_t *xfers;
    size_t nxfers;
    struct ferry_task *next;
} ferry_task_t;

/* batch.c */
int ferry_workers_start(ferry_engine_t *e);
void ferry_workers_stop(ferry_engine_t *e);
/* Cuts requests into pieces: big ones into stripes so that several
 * connections carry them. Returns the pieces (malloc'd) and their count. */
int ferry_make_pieces(ferry_engine_t *e, int opcode, void *const *locals, const uint64_t *remotes,
                      const size_t *lens, size_t n, uint64_t deadline, ferry_xfer_t **out, size_t *nout);
/* Runs pieces xs on several of s's connections at once. */
int ferry_run_parallel(ferry_engine_t *e, ferry_session_t *s, ferry_xfer_t *xs, size_t n);

#endif
