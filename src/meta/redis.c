/* SPDX-License-Identifier: Apache-2.0 */
/* The Redis backend (hiredis): SET key value EX ttl, EXPIRE to keep alive,
 * GET, DEL. One blocking connection per state, with connect and command
 * timeouts; a connection that failed is dropped and made again on the next
 * call, so a restarted server is picked up without reopening. */
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "util/fail.h"
#include "entries.h"
#include "meta.h"

struct redis {
    char addr[256]; /* host:port, for details */
    char host[256];
    int port;
    struct timeval timeout;
    redisContext *ctx; /* NULL until (re)connected */
    pthread_mutex_t mu; /* a redisContext is not for two threads at once */
    struct meta_entries entries;
};

static void drop_connection(struct redis *r)
{
    if (r->ctx) redisFree(r->ctx);
    r->ctx = NULL;
}

static int connect_locked(struct redis *r, const char *step)
{
    if (r->ctx) return 0;
    redisContext *c = redisConnectWithTimeout(r->host, r->port, r->timeout);
    if (!c) return ferry_fail(FERRY_ERR_MEMORY, "redis at %s: %s: connect: no memory", r->addr, step);
    if (c->err) {
        int rc = ferry_fail(FERRY_ERR_METADATA, "redis at %s: %s: connect: %s", r->addr, step,
                            c->errstr);
        redisFree(c);
        return rc;
    }
    if (redisSetTimeout(c, r->timeout) != REDIS_OK) {
        int rc = ferry_fail(FERRY_ERR_METADATA, "redis at %s: %s: setting timeout: %s", r->addr,
                            step, c->errstr);
        redisFree(c);
        return rc;
    }
    r->ctx = c;
    return 0;
}

/* hiredis writes with write(2): to a server that died, that raises SIGPIPE,
 * which would kill the process. The signal is blocked in this thread for
 * the call, and one it raised is consumed before unblocking. */
static void sigpipe_block(sigset_t *old)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, old);
}

static void sigpipe_restore(const sigset_t *old)
{
    sigset_t pending;
    sigpending(&pending);
    /* Only consume it when it was not blocked (and maybe pending) before. */
    if (sigismember(&pending, SIGPIPE) && !sigismember(old, SIGPIPE)) {
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGPIPE);
        const struct timespec zero = {0, 0};
        sigtimedwait(&set, NULL, &zero);
    }
    pthread_sigmask(SIG_SETMASK, old, NULL);
}

/* Runs one command (hiredis format) under the lock, (re)connecting first.
 * Returns the reply, or NULL with *rc set; an error reply is a failure too.
 * step names the operation for the detail ("SET 'k'"). */
static redisReply *command_locked(struct redis *r, int *rc, const char *step, const char *fmt,
                                  ...)
{
    *rc = connect_locked(r, step);
    if (*rc) return NULL;
    va_list ap;
    va_start(ap, fmt);
    sigset_t old;
    sigpipe_block(&old);
    redisReply *reply = redisvCommand(r->ctx, fmt, ap);
    sigpipe_restore(&old);
    va_end(ap);
    if (!reply) {
        /* The connection is unusable after an I/O error or timeout. */
        *rc = ferry_fail(FERRY_ERR_METADATA, "redis at %s: %s: %s", r->addr, step,
                         r->ctx->errstr[0] ? r->ctx->errstr : "no reply");
        drop_connection(r);
        return NULL;
    }
    if (reply->type == REDIS_REPLY_ERROR) {
        *rc = ferry_fail(FERRY_ERR_METADATA, "redis at %s: %s: server error: %.*s", r->addr, step,
                         (int)reply->len, reply->str);
        freeReplyObject(reply);
        return NULL;
    }
    *rc = 0;
    return reply;
}

/* Splits "host:port" or "[v6]:port" (already checked by ferry_meta_parse). */
static int split_addr(struct redis *r, const char *addr)
{
    const char *colon = strrchr(addr, ':');
    if (!colon) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "redis at %s: not host:port", addr);
    const char *h = addr;
    size_t hlen = (size_t)(colon - addr);
    if (hlen >= 2 && h[0] == '[' && h[hlen - 1] == ']') {
        h++;
        hlen -= 2;
    }
    if (hlen == 0 || hlen >= sizeof r->host)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "redis at %s: bad host", addr);
    memcpy(r->host, h, hlen);
    r->host[hlen] = '\0';
    r->port = atoi(colon + 1);
    return 0;
}

static void redis_free(struct redis *r)
{
    drop_connection(r);
    meta_entries_free(&r->entries);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

static int redis_open(const char *addr, int timeout_ms, void **state)
{
    if (!addr) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "redis: open without host:port");
    struct redis *r = calloc(1, sizeof *r);
    if (!r) return ferry_fail(FERRY_ERR_MEMORY, "redis at %s: open", addr);
    pthread_mutex_init(&r->mu, NULL);
    snprintf(r->addr, sizeof r->addr, "%s", addr);
    r->timeout.tv_sec = timeout_ms / 1000;
    r->timeout.tv_usec = (timeout_ms % 1000) * 1000;
    int rc = split_addr(r, addr);
    redisReply *reply = rc ? NULL : command_locked(r, &rc, "open (PING)", "PING");
    /* Something else listening on the port would not answer PONG. */
    if (reply && (reply->type != REDIS_REPLY_STATUS || strcmp(reply->str, "PONG") != 0))
        rc = ferry_fail(FERRY_ERR_METADATA, "redis at %s: open: PING not answered with PONG",
                        addr);
    freeReplyObject(reply);
    if (rc) {
        redis_free(r);
        return rc;
    }
    *state = r;
    return 0;
}

static int redis_publish(void *state, const char *key, const char *value, int ttl_s)
{
    struct redis *r = state;
    char step[300];
    snprintf(step, sizeof step, "SET '%s'", key);
    int rc;
    pthread_mutex_lock(&r->mu);
    redisReply *reply =
        ttl_s > 0 ? command_locked(r, &rc, step, "SET %b %b EX %d", key, strlen(key), value,
                                   strlen(value), ttl_s)
                  : command_locked(r, &rc, step, "SET %b %b", key, strlen(key), value,
                                   strlen(value));
    if (reply) {
        rc = ttl_s > 0 ? meta_entries_set(&r->entries, key, ttl_s, 0) : 0;
        if (ttl_s <= 0) meta_entries_drop(&r->entries, key);
    }
    pthread_mutex_unlock(&r->mu);
    freeReplyObject(reply);
    return rc;
}

/* EXPIRE on every leased entry; an entry that is gone (EXPIRE answers 0)
 * is forgotten and reported as NOT_FOUND once the others are refreshed. */
static int redis_keepalive(void *state)
{
    struct redis *r = state;
    char gone[300] = "";
    int missing = 0, rc = 0;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->entries.n;) {
        const struct meta_entry *en = &r->entries.v[i];
        char step[300];
        snprintf(step, sizeof step, "EXPIRE '%s'", en->key);
        redisReply *reply = command_locked(r, &rc, step, "EXPIRE %b %d", en->key,
                                           strlen(en->key), en->ttl_s);
        if (!reply) break;
        int alive = reply->type == REDIS_REPLY_INTEGER && reply->integer == 1;
        freeReplyObject(reply);
        if (alive) {
            i++;
            continue;
        }
        missing++;
        snprintf(gone, sizeof gone, "%s", en->key);
        meta_entries_drop(&r->entries, gone); /* moves another entry into slot i */
    }
    pthread_mutex_unlock(&r->mu);
    if (rc) return rc;
    if (missing)
        return ferry_fail(FERRY_ERR_NOT_FOUND,
                          "redis at %s: keepalive: '%s' expired or was lost (%d gone)", r->addr,
                          gone, missing);
    return 0;
}

static int redis_lookup(void *state, const char *key, char **value)
{
    struct redis *r = state;
    *value = NULL;
    char step[300];
    snprintf(step, sizeof step, "GET '%s'", key);
    int rc;
    pthread_mutex_lock(&r->mu);
    redisReply *reply = command_locked(r, &rc, step, "GET %b", key, strlen(key));
    pthread_mutex_unlock(&r->mu);
    if (!reply) return rc;
    if (reply->type == REDIS_REPLY_NIL)
        rc = ferry_fail(FERRY_ERR_NOT_FOUND, "redis at %s: %s: no such key", r->addr, step);
    else if (reply->type != REDIS_REPLY_STRING)
        rc = ferry_fail(FERRY_ERR_METADATA, "redis at %s: %s: answer of type %d, not a string",
                        r->addr, step, reply->type);
    else if (!(*value = malloc(reply->len + 1)))
        rc = ferry_fail(FERRY_ERR_MEMORY, "redis at %s: %s: %zu bytes", r->addr, step, reply->len);
    else {
        memcpy(*value, reply->str, reply->len);
        (*value)[reply->len] = '\0';
    }
    freeReplyObject(reply);
    return rc;
}

static int redis_remove(void *state, const char *key)
{
    struct redis *r = state;
    char step[300];
    snprintf(step, sizeof step, "DEL '%s'", key);
    int rc;
    pthread_mutex_lock(&r->mu);
    redisReply *reply = command_locked(r, &rc, step, "DEL %b", key, strlen(key));
    if (reply) meta_entries_drop(&r->entries, key);
    pthread_mutex_unlock(&r->mu);
    freeReplyObject(reply);
    return rc;
}

static void redis_close(void *state)
{
    if (state) redis_free(state);
}

const ferry_meta_ops_t ferry_meta_redis_ops = {
    .scheme = "redis",
    .open = redis_open,
    .publish = redis_publish,
    .keepalive = redis_keepalive,
    .lookup = redis_lookup,
    .remove = redis_remove,
    .close = redis_close,
};
