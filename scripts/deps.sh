#!/usr/bin/env bash
# Installs the Debian packages Ferry builds, tests and benchmarks with.
# Idempotent and quick when everything is present; needs root (or sudo).
set -euo pipefail
PKGS=(build-essential cmake pkg-config clang libclang-rt-14-dev
      libcmocka-dev libcurl4-openssl-dev libjansson-dev libhiredis-dev libssl-dev libmicrohttpd-dev
      libibverbs-dev rdma-core
      etcd-server redis-server iperf3 libucx-dev ucx-utils
      python3 python3-numpy nftables iproute2 procps curl)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps: installing ${missing[*]}"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian starts these services on install; Ferry's tests start their own.
for svc in redis-server etcd; do
  (command -v systemctl >/dev/null && $SUDO systemctl disable --now "$svc" >/dev/null 2>&1) || true
  pkill -x "$svc" 2>/dev/null || true
done
