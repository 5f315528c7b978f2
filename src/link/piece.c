/* SPDX-License-Identifier: Apache-2.0 */
/* What a transport records on a piece (piece.h). */
#include <stdlib.h>
#include <string.h>

#include "util/fail.h"
#include "piece.h"

void ferry_xfer_fail(ferry_xfer_t *x, int rc)
{
    x->rc = rc;
    free(x->detail);
    x->detail = strdup(ferry_fail_message());
}
