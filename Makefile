# Thin front of CMake. The two commands of the README:
#   make demo   the main job: a verified transfer between two engines on loopback
#   make test   the whole test suite (ASan+UBSan, TSan, Python), as CI runs it
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: all deps build demo test clean

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

clean:
	rm -rf build build-*
