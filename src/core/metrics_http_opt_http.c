/* GET /metrics over HTTP with libmicrohttpd (Debian's libmicrohttpd-dev):
 * its own thread, bound to the engine's host, answering from
 * ferry_metrics_prometheus(). */
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "fail.h"
#include "metrics.h"

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

int ferry_metrics_http_start(ferry_engine_t *e, int port)
{
    struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG,
                                            (uint16_t)(port < 0 ? 0 : port), NULL, NULL, answer, e,
                                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
    if (!d) return ferry_fail(FERRY_ERR_SOCKET, "metrics endpoint: cannot listen on port %d", port);
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    e->metrics.http = d;
    e->metrics.http_port = info ? info->port : (uint16_t)port;
    return 0;
}

void ferry_metrics_http_stop(ferry_engine_t *e)
{
    if (e->metrics.http) MHD_stop_daemon(e->metrics.http);
    e->metrics.http = NULL;
    e->metrics.http_port = 0;
}
