/* SPDX-License-Identifier: Apache-2.0 */
/* What the shm transport puts on the wire besides its frame ids (CMA_WRITE,
 * CMA_READ, SHM_MAP_REQ, SHM_MAP_RESP stay in wire.h's enum: the core's
 * placement logs name CMA_WRITE): its HELLO bits, which its ops declare as
 * its own (hello_bits), and the SHM_MAP_RESP payload. */
#ifndef FERRY_SHM_WIRE_H
#define FERRY_SHM_WIRE_H

#include "wire/wire.h"

/* The sender permits cross-memory attach. */
#define FERRY_HELLO_F_CMA 0x02u
/* The sender serves SHM_MAP_REQ (shared pools; no longer sent). */
#define FERRY_HELLO_F_SHMPOOL 0x08u
/* The sender serves SHM_MAP_REQ with the layout of FERRY_SHM_MAP_INFO_SIZE below (data and control
 * header in two memfds, the header writable by the owner only), seals
 * read-only pools and detaches pools at deregistration (core/share.h).
 * Initiators map only from such targets. */
#define FERRY_HELLO_F_SHMPOOL2 0x10u
/* The sender serves CMA_VEC pieces of up to FERRY_WIRE_CMA_PIECE_MAX bytes
 * (wire.h, "Vector frames"); initiators send larger pieces only to such
 * targets. */
#define FERRY_HELLO_F_CMA_BIG 0x200u
/* The sender copies a CMA_VEC frame of large pieces on two threads itself
 * (its copy helper) where a CPU is idle: an initiator sends a call of such
 * pieces on one connection, not split over two (transport.h,
 * shares_frames). */
#define FERRY_HELLO_F_CMA_SHARE 0x1000u

/* SHM map info, 40 bytes, sent in SHM_MAP_RESP:
 *     0    8 region address              8    8 region length
 *    16    8 region offset in the data memfd (0)
 *    24    4 the data memfd's fd number in the target (-1: region not shareable)
 *    28    4 region generation          32    4 region flags
 *    36    4 the control header memfd's fd number in the target (-1: none) */
#define FERRY_SHM_MAP_INFO_SIZE 40

/* Every HELLO bit shm owns. */
#define FERRY_SHM_HELLO_BITS                                                                                  \
    (FERRY_HELLO_F_CMA | FERRY_HELLO_F_SHMPOOL | FERRY_HELLO_F_SHMPOOL2 | FERRY_HELLO_F_CMA_BIG | FERRY_HELLO_F_CMA_SHARE)

#endif
