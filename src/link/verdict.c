/* SPDX-License-Identifier: Apache-2.0 */
/* The verdict helpers shared by the transports' run (transport.h): the
 * verdicts (fall back to tcp, or leave pieces to tcp), and the answer to a
 * piece's slice. Apart from the transport table (transport.c), so that a
 * transport and the table do not depend on each other. */
#include <stdarg.h>
#include <stdio.h>

#include "util/fail.h"
#include "transport.h"

int ferry_verdict_fall_back(ferry_verdict_t *v, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->reason, sizeof v->reason, fmt, ap);
    va_end(ap);
    v->fall_back = true;
    return 0;
}

int ferry_verdict_by_tcp(ferry_verdict_t *v, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->reason, sizeof v->reason, fmt, ap);
    va_end(ap);
    v->by_tcp = true;
    return 0;
}

int ferry_recv_answer(ferry_conn_t *c, ferry_xfer_t *x, unsigned spin_us, ferry_frame_t *f, int *broken,
                      char *reason, size_t cap)
{
    int rc = ferry_conn_recv_frame_spin(c, f, x->deadline, spin_us);
    if (rc) {
        *broken = 1;
        return rc;
    }
    uint8_t want = x->opcode == FERRY_OP_WRITE ? FERRY_FRAME_WRITE_ACK : FERRY_FRAME_READ_RESP;
    if (f->type == FERRY_FRAME_ERROR && f->status < 0) {
        /* The target dropped the connection and said why. */
        *broken = 1;
        return ferry_conn_fail_from_target(c, f, x->deadline, NULL, 0);
    }
    if (f->type != want || f->req_id != x->req_id) {
        *broken = 1;
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "expected %s for request %llu, got %s for %llu",
                          ferry_frame_type_name(want), (unsigned long long)x->req_id, ferry_frame_type_name(f->type),
                          (unsigned long long)f->req_id);
    }
    if (f->status < 0) return ferry_conn_fail_from_target(c, f, x->deadline, reason, cap);
    return 0;
}
