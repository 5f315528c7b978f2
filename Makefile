# SPDX-License-Identifier: Apache-2.0
# Thin front of CMake. The two commands of the README:
#   make demo   the main job: a verified transfer between two engines on loopback
#   make test   the whole test suite (ASan+UBSan, TSan, Python), as CI runs it
# and for packagers and users:
#   make install [PREFIX=/usr/local] [DESTDIR=staging]   headers, libferry.so.X.Y.Z
#               (SONAME libferry.so.X), libferry.a, the ferry CLI, its man pages
#               and bash completion, ferry.pc and the CMake package
#               (find_package(ferry) -> ferry::ferry). Builds only those
#               (BUILD_TESTING=OFF: no tests, no cmocka) and installs no
#               packages; PREFIX is given at configure time, so libdir is
#               GNUInstallDirs' (lib/<multiarch> under /usr on Debian).
#   make uninstall [DESTDIR=staging]   removes what the last install put there,
#               the folders it created included
# and for comparing (not part of make test):
#   make bench-mooncake   Ferry against Mooncake's Transfer Engine on the same shapes
#               (bench/compare --only mooncake; builds Mooncake once into
#               .baseline/mooncake, about 10 minutes, or MOONCAKE_BUILD=DIR)
BUILD ?= build
JOBS ?= $(shell nproc)
PREFIX ?= /usr/local

.PHONY: all deps build demo test install uninstall clean bench-mooncake

all: build

deps:
	@scripts/deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

demo: build
	@$(BUILD)/ferry demo

test: deps
	@scripts/test.sh

install:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DCMAKE_INSTALL_PREFIX="$(PREFIX)" >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) --target ferry ferry_shared ferry_cli
	@DESTDIR="$(DESTDIR)" cmake --install $(BUILD)

bench-mooncake:
	@bench/compare --only mooncake

uninstall:
	@DESTDIR="$(DESTDIR)" scripts/uninstall.sh $(BUILD)

clean:
	rm -rf build build-*
