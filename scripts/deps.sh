#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian packages Ferry builds, tests and benchmarks with.
# Idempotent and quick when everything is present; needs root (or sudo).
set -euo pipefail
PKGS=(build-essential cmake pkg-config clang libclang-rt-14-dev
      libcmocka-dev libcurl4-openssl-dev libjansson-dev libhiredis-dev libssl-dev libmicrohttpd-dev
      libisal-dev help2man
      libibverbs-dev rdma-core
      etcd-server redis-server iperf3 libucx-dev ucx-utils
      python3 python3-numpy python3-pip python3-setuptools nftables iproute2 procps curl)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps: installing ${missing[*]}"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq

# Debian starts etcd and redis-server when their packages are installed;
# Ferry's tests start their own (scripts/services.sh) on free ports. Keep
# the packages from starting anything while we install them, through the
# policy-rc.d hook that invoke-rc.d and deb-systemd-invoke both honour
# (exit 101: action forbidden), instead of stopping servers afterwards:
# no process is ever ended, least of all one of the user's own servers.
POLICY=/usr/sbin/policy-rc.d
placed_policy=0
if [ ! -e "$POLICY" ]; then
  printf '#!/bin/sh\n# placed by ferry scripts/deps.sh during apt-get install\nexit 101\n' |
    $SUDO tee "$POLICY" >/dev/null
  $SUDO chmod 755 "$POLICY"
  placed_policy=1
fi
remove_policy() { [ "$placed_policy" -eq 1 ] && $SUDO rm -f "$POLICY"; placed_policy=0; }
trap remove_policy EXIT
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
remove_policy

# Nor start them at the next boot, for the services installed just now
# (a service the user had before is left as it was).
for pkg_unit in redis-server:redis-server etcd-server:etcd; do
  case " ${missing[*]} " in *" ${pkg_unit%%:*} "*) ;; *) continue ;; esac
  if command -v systemctl >/dev/null; then
    $SUDO systemctl disable "${pkg_unit#*:}" >/dev/null 2>&1 || true
  fi
done
