# Thin front of CMake. The two commands of the README:
#   make demo   the main job: a verified transfer between two engines on loopback
#   make test   the whole test suite (ASan+UBSan, TSan, Python), as CI runs it
# and for packagers and users:
#   make install [PREFIX=/usr/local] [DESTDIR=staging]   headers, libferry.so.X.Y.Z
#               (SONAME libferry.so.X), libferry.a, the ferry CLI, ferry.pc and
#               the CMake package (find_package(ferry) -> ferry::ferry)
#   make uninstall   removes what the last install put there
BUILD ?= build
JOBS ?= $(shell nproc)
PREFIX ?= /usr/local

.PHONY: all deps build demo test install uninstall clean

all: build

deps:
	@scripts/deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

demo: build
	@$(BUILD)/ferry demo

test: deps
	@scripts/test.sh

install: build
	@DESTDIR="$(DESTDIR)" cmake --install $(BUILD) --prefix "$(PREFIX)"

uninstall:
	@test -f $(BUILD)/install_manifest.txt || { echo "nothing installed from $(BUILD)"; exit 1; }
	@xargs -d '\n' rm -fv < $(BUILD)/install_manifest.txt

clean:
	rm -rf build build-*
