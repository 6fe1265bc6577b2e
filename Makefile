# SPDX-License-Identifier: BSD-3-Clause
# Thin wrapper over CMake. The two set-up commands of the README:
#   make demo   installs what is missing, builds, runs the payout demo
#   make test   installs what is missing, builds, runs the whole suite
#               (plain, ASan+UBSan, and the watchdog tests under TSan)

BUILD ?= build
PREFIX ?= /usr/local
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all build deps test verify demo bench install clean chaos fuzz

all: build

deps:
	@scripts/deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_INSTALL_PREFIX=$(PREFIX) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

test: deps
	@scripts/test.sh

verify: deps
	@models/check.sh

demo: build
	@scripts/demo.sh $(BUILD)

bench: build
	@$(BUILD)/bench/dlock-bench

chaos: build
	@$(BUILD)/tests/chaos --backend redis,etcd --duration 15 --runs 3 --markdown $(BUILD)/chaos.md

fuzz: deps
	@tests/fuzz/run.sh $(CURDIR)/build-fuzz $${FUZZ_SECONDS:-300}

install: build
	@cmake --install $(BUILD)

clean:
	rm -rf build build-asan build-tsan
