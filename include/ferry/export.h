/* SPDX-License-Identifier: Apache-2.0 */
/* FERRY_API marks the functions and objects libferry exports.
 *
 * The library is built with -fvisibility=hidden: a symbol is visible to
 * programs linking libferry.so only when its declaration in these public
 * headers carries FERRY_API. Everything else (the internals under src/) is
 * hidden, so it can change without breaking a caller's binary. The exported
 * set is pinned by tests/abi/exported.txt (see docs/ABI.md).
 */
#ifndef FERRY_EXPORT_H
#define FERRY_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define FERRY_API __attribute__((visibility("default")))
#else
#define FERRY_API
#endif

#endif
