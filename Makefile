# SPDX-License-Identifier: BSD-3-Clause
# Thin wrapper over CMake. The two set-up commands of the README:
#   make demo   installs what is missing, builds, runs the payout demo
#   make test   installs what is missing, builds, runs the whole suite
#               (plain, ASan+UBSan, and the watchdog tests under TSan),
#               warnings as errors
# make build and make install only build and install (PREFIX, DESTDIR):
# they install no packages (scripts/deps.sh lists what the build needs).

BUILD ?= build
PREFIX ?= /usr/local
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all build deps test verify demo bench install clean chaos fuzz

all: build

deps:
	@scripts/deps.sh

build:
	@cmake -S . -B $(BUILD) -DCMAKE_INSTALL_PREFIX=$(PREFIX) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

test: deps
	@scripts/test.sh

verify: deps
	@models/check.sh

demo: deps
	@$(MAKE) --no-print-directory build
	@scripts/demo.sh $(BUILD)

bench: deps
	@$(MAKE) --no-print-directory build
	@$(BUILD)/bench/dlock-bench

chaos: deps
	@$(MAKE) --no-print-directory build
	@$(BUILD)/tests/chaos --backend redis,etcd,redlock --duration 15 --runs 3 --markdown $(BUILD)/chaos.md

fuzz: deps
	@tests/fuzz/run.sh $(CURDIR)/build-fuzz $${FUZZ_SECONDS:-300}

install: build
	@cmake --install $(BUILD)

clean:
	rm -rf build build-asan build-tsan build-release build-clang
