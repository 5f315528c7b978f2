/* SPDX-License-Identifier: Apache-2.0 */
/* The engine's worker pool (workers.c): its task queue and threads, a
 * part of the engine (engine.h: e->work) reached through
 * ferry_engine_part_work (parts.h). Private to the library. */
#ifndef FERRY_ENGINE_WORKERS_H
#define FERRY_ENGINE_WORKERS_H

#include <pthread.h>

#include "batch.h"

typedef struct ferry_workers {
    pthread_mutex_t lock;      /* guards the queue */
    pthread_cond_t cond;       /* signalled when a task is queued, or at stop */
    ferry_task_t *head, *tail; /* tasks waiting for a thread */
    pthread_t *threads;
    int n;                     /* threads running */
} ferry_workers_t;

#endif
