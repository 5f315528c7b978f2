/* SPDX-License-Identifier: Apache-2.0 */
/* Without libmicrohttpd the metrics endpoint cannot be served; the API
 * (ferry_metrics_prometheus) still works. Built when FERRY_HAVE_HTTP is off. */
#ifndef FERRY_HAVE_HTTP
#include "util/fail.h"
#include "link/metrics.h"

int ferry_metrics_http_start(ferry_engine_t *e, int port)
{
    (void)e;
    return ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "metrics endpoint on port %d: built without libmicrohttpd", port);
}

void ferry_metrics_http_stop(ferry_engine_t *e) { (void)e; }
#else
typedef int ferry_metrics_http_is_in_the_opt_file;
#endif
