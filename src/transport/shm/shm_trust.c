/* SPDX-License-Identifier: Apache-2.0 */
/* The shared-memory transport (shm.c): trust in a same-host peer. Whether
 * a connection comes from this host and from the pid its HELLO claims
 * (link/peer_pid.c), and whether the kernel lets us attach to it. The why
 * is in the comment at the top of shm.c. */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "util/fail.h"
#include "util/log.h"
#include "util/net.h"
#include "shm_internal.h"

/* ------------------------------------------------------ target: trust */

void shm_conn_free(void *p)
{
    struct shm_conn *sc = p;
    if (sc && sc->pidfd >= 0) close(sc->pidfd);
    if (sc) free(sc->order);
    free(sc);
}

static bool shm_disabled_here(void)
{
    return shm_key_set(SHM_KEY_DISABLE);
}

/* Decides once per connection whether the initiator's claimed pid may be
 * attached. probe is an address the initiator named as its own buffer. */
void shm_verify_peer(ferry_conn_t *c, struct shm_conn *sc, uint64_t probe)
{
    const ferry_hello_t *h = &c->peer;
    sc->state = -1;
    sc->pid = h->pid;
    if (shm_disabled_here()) {
        snprintf(sc->reason, sizeof sc->reason, "cross-memory attach disabled at the target (FERRY_SHM_DISABLE)");
        return;
    }
    /* FERRY_SHM_PROC_LOOKUP=1 skips netlink (tests the fallback). */
    int pidfd = -1;
    if (ferry_peer_verify_pid(c, shm_key_set(SHM_KEY_PROC_LOOKUP), &pidfd, sc->reason, sizeof sc->reason) != 0)
        return;
    /* The kernel's own check (ptrace access mode ATTACH, Yama): one byte of
     * the initiator's buffer into a scratch byte here. */
    unsigned char scratch;
    struct iovec mine = {&scratch, 1}, theirs = {(void *)(uintptr_t)probe, 1};
    if (process_vm_readv(h->pid, &mine, 1, &theirs, 1, 0) != 1 && errno != EFAULT) {
        /* EFAULT: attaching is allowed, the address is bad; the copy reports it. */
        int err = errno;
        snprintf(sc->reason, sizeof sc->reason, "the kernel refuses cross-memory attach to pid %d: %s%s", (int)h->pid,
                 strerror(err),
                 err == EPERM ? " (different user, container, or Yama ptrace_scope)" : "");
        if (pidfd >= 0) close(pidfd);
        return;
    }
    sc->pidfd = pidfd;
    sc->state = 1;
}

int shm_trusted_conn(ferry_conn_t *c, uint64_t probe, struct shm_conn **out)
{
    struct shm_conn *sc = c->xport;
    /* A connection's state is one transport's: frames of another on the
     * same connection (a hostile initiator's) must not make shm read it. */
    if (sc && c->xport_free != shm_conn_free)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "shm frames on a connection that carries another transport's");
    if (!sc) {
        sc = calloc(1, sizeof *sc);
        if (!sc) return ferry_fail(FERRY_ERR_MEMORY, "shm: out of memory");
        sc->pidfd = -1;
        c->xport = sc;
        c->xport_free = shm_conn_free;
    }
    if (sc->state == 0) shm_verify_peer(c, sc, probe);
    if (sc->state == 1 && ferry_pidfd_exited(sc->pidfd)) {
        sc->state = -1;
        snprintf(sc->reason, sizeof sc->reason, "the verified initiator pid %d has exited", (int)sc->pid);
    }
    *out = sc;
    return 0;
}
