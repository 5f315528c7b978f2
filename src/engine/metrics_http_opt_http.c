/* SPDX-License-Identifier: Apache-2.0 */
/* GET /metrics over HTTP with libmicrohttpd (Debian's libmicrohttpd-dev):
 * its own thread, bound to the engine's host (or config.metrics_host),
 * answering from ferry_metrics_prometheus(). */
#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "parts.h"
#include "util/fail.h"
#include "util/log.h"
#include "link/metrics.h"

/* What clients of the endpoint can hold: a scraper needs one connection;
 * slow or idle clients (slowloris) hold at most these, each closed after
 * FERRY_METRICS_IDLE_S without progress; more wait in a short backlog. */
#define FERRY_METRICS_MAX_CONNECTIONS 16
#define FERRY_METRICS_MAX_PER_ADDRESS 4
#define FERRY_METRICS_IDLE_S 5
#define FERRY_METRICS_BACKLOG 64

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version, (void)upload, (void)upload_size, (void)con_cls;
    ferry_engine_t *e = cls;
    struct MHD_Response *resp;
    unsigned status = MHD_HTTP_OK;
    if (strcmp(method, "GET") != 0 || strcmp(url, "/metrics") != 0) {
        static const char nf[] = "not found: GET /metrics\n";
        resp = MHD_create_response_from_buffer(sizeof nf - 1, (void *)nf, MHD_RESPMEM_PERSISTENT);
        status = MHD_HTTP_NOT_FOUND;
    } else {
        long need = ferry_metrics_prometheus(e, NULL, 0);
        char *body = malloc((size_t)need + 1);
        if (!body) return MHD_NO;
        long n = ferry_metrics_prometheus(e, body, (size_t)need + 1);
        if (n > need) n = need; /* grew in between: send what fitted */
        resp = MHD_create_response_from_buffer((size_t)n, body, MHD_RESPMEM_MUST_FREE);
        MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4");
    }
    enum MHD_Result r = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);
    return r;
}

/* libmicrohttpd's messages (a refused connection over the limits, one line
 * each under a flood) go to the debug log. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char line[256];
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    FERRY_LOG(FERRY_LOG_DEBUG, "metrics", "%s", line);
}

int ferry_metrics_http_start(ferry_engine_t *e, int port)
{
    const ferry_config_t *cfg = ferry_engine_part_config(e);
    const char *host = cfg->metrics_host ? cfg->metrics_host : cfg->host;
    char service[16];
    snprintf(service, sizeof service, "%d", port < 0 ? 0 : port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res;
    int grc = getaddrinfo(host, service, &hints, &res);
    if (grc != 0)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "metrics endpoint: cannot resolve host '%s': %s", host,
                          gai_strerror(grc));
    /* MHD_USE_AUTO: poll or epoll, not select, whose descriptors end at 1024. */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG;
    if (res->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)(port < 0 ? 0 : port), NULL, NULL, answer, e, MHD_OPTION_SOCK_ADDR, res->ai_addr,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)FERRY_METRICS_MAX_CONNECTIONS, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)FERRY_METRICS_MAX_PER_ADDRESS, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)FERRY_METRICS_IDLE_S,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)FERRY_METRICS_BACKLOG, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
        MHD_OPTION_END);
    freeaddrinfo(res);
    if (!d) return ferry_fail(FERRY_ERR_SOCKET, "metrics endpoint: cannot listen on %s port %d", host, port);
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    ferry_metrics_t *m = ferry_engine_part_metrics(e);
    m->http = d;
    m->http_port = info ? info->port : (uint16_t)port;
    return 0;
}

void ferry_metrics_http_stop(ferry_engine_t *e)
{
    ferry_metrics_t *m = ferry_engine_part_metrics(e);
    if (m->http) MHD_stop_daemon(m->http);
    m->http = NULL;
    m->http_port = 0;
}
