# SPDX-License-Identifier: BSD-3-Clause
# Thin wrapper over CMake. The two set-up commands of the README:
#   make demo   installs what is missing for it (no database servers, no
#               JDK), builds, runs the payout demo
#   make test   installs what is missing, builds, runs the whole suite
#               (plain, ASan+UBSan, and the watchdog tests under TSan),
#               warnings as errors
# make build and make install only build and install (PREFIX, DESTDIR):
# they install no packages (scripts/deps.sh lists what the build needs).

BUILD ?= build
PREFIX ?= /usr/local
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all build deps test verify demo bench bench-redlock install clean chaos fuzz

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

demo:
	@scripts/deps.sh demo
	@$(MAKE) --no-print-directory build
	@scripts/demo.sh $(BUILD)

# Then one client holding 10,000 locks on each backend (test_scale, a
# program of the test suite): RSS per lock, CPU, renewal calls per second;
# and 10,000 waiters on one client where a backend queues them.
bench: deps
	@$(MAKE) --no-print-directory build
	@$(BUILD)/bench/dlock-bench
	@$(BUILD)/bench/dlock-bench --async || true
	@$(BUILD)/bench/dlock-bench --zk --iterations 2000 || true
	@$(BUILD)/bench/dlock-bench --postgres --iterations 2000 || true
	@$(BUILD)/bench/dlock-bench --mysql --iterations 2000 || true
	@/usr/bin/python3 bindings/python/bench/bench.py --build $(BUILD) || true
	@node bindings/node/bench/bench.js --build $(BUILD) || true
	@echo "== many locks on one client (docs/bench.md)"
	@for b in redis etcd zk postgres mysql redlock; do \
		DLOCK_MODULE_DIR=$(BUILD)/dlock DLOCK_SCALE_LOCKS=10000 \
			$(BUILD)/tests/test_scale $$b hold_many 2>/dev/null | grep '^scale:' || true; \
	done
	@echo "== many waiters on one client (docs/bench.md)"
	@for b in redis etcd zk; do \
		DLOCK_MODULE_DIR=$(BUILD)/dlock DLOCK_SCALE_WAITERS=10000 \
			$(BUILD)/tests/test_scale $$b wait_many 2>/dev/null | grep '^scale:' || true; \
	done

# Redlock on 5 throwaway redis-servers beside node-redlock (npm's redlock v5
# and ioredis, installed under $(BUILD)/node-redlock; docs/bench.md).
bench-redlock: deps
	@$(MAKE) --no-print-directory build
	@if [ ! -f $(BUILD)/node-redlock/node_modules/redlock/package.json ]; then \
		if command -v npm >/dev/null 2>&1; then \
			mkdir -p $(BUILD)/node-redlock && cd $(BUILD)/node-redlock && \
			npm install --prefix . --no-audit --no-fund --no-save redlock@5.0.0-beta.2 ioredis@5 >/dev/null; \
		else echo "bench-redlock: npm is missing (apt-get install nodejs npm); measuring dlock alone"; fi; \
	fi
	@$(BUILD)/bench/dlock-bench --redlock

# Every row (a nemesis on a backend) runs until CHAOS_FAULTS faults: 10 or 11
# fault nemeses a backend, so at least 1000 faults on each (about 8 hours on
# 2 cores; docs/verification.md, "Chaos").
# CHAOS_ENSEMBLES: the 3-member etcd cluster and ZooKeeper ensemble, their
# leader killed -9 and restarted (leader-kill), to CHAOS_FAULTS each.
CHAOS_FAULTS ?= 125
CHAOS_BACKENDS ?= redis,etcd,redlock,zk,postgres,postgres-advisory,mysql,mysql-named
CHAOS_ENSEMBLES ?= etcd3,zk3
chaos: deps
	@$(MAKE) --no-print-directory build
	@$(BUILD)/tests/chaos --backend $(CHAOS_BACKENDS) --duration 15 --faults $(CHAOS_FAULTS) --markdown $(BUILD)/chaos.md
	@$(BUILD)/tests/chaos --backend $(CHAOS_ENSEMBLES) --nemesis leader-kill --duration 15 --faults $(CHAOS_FAULTS) --markdown $(BUILD)/chaos-leader.md
	@$(BUILD)/tests/chaos --backend etcd --kind rw --duration 15 --runs 3 --markdown $(BUILD)/chaos-etcd-rw.md

fuzz: deps
	@tests/fuzz/run.sh $(CURDIR)/build-fuzz $${FUZZ_SECONDS:-300}

install: build
	@cmake --install $(BUILD)

clean:
	rm -rf build build-asan build-tsan build-release build-clang
