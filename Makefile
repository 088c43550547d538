# Thin wrapper over CMake presets. The two commands of the README are `make demo` and `make test`;
# both install missing Debian packages first (scripts/install-deps.sh is idempotent).
PRESET ?= default
BUILD_DIR := build/$(PRESET)
OPTIFLOW := $(BUILD_DIR)/cli/optiflow
DEMO_DIR := $(BUILD_DIR)/demo
JOBS ?= $(shell nproc)

.PHONY: all deps configure build test demo bench bench-scale calibration-table asan tsan clang fuzz format format-check clean package package-test k8s-check

all: build

deps:
	@./scripts/install-deps.sh

configure: deps
	@cmake --preset $(PRESET) >/dev/null

build: configure
	@cmake --build --preset $(PRESET) -j $(JOBS)

test: build
	@ctest --preset $(PRESET)

# The main job on the built-in default: synthesize All-Gather schedules for the preset dgx-a100x4 (4 nodes x 8 A100)
# with the built-in proposer and the simulator, print the table (NCCL's choice, the best discovered schedule, the
# speedup and the lower bound per size), then write the HTML report of the run. --force: each demo is a fresh run.
demo: build
	@mkdir -p $(DEMO_DIR)
	@echo "== optiflow synthesize --topo dgx-a100x4 --coll allgather --out $(DEMO_DIR)/dgx-a100x4-allgather"
	@$(OPTIFLOW) synthesize --topo dgx-a100x4 --coll allgather --out $(DEMO_DIR)/dgx-a100x4-allgather --force
	@echo
	@echo "== optiflow report $(DEMO_DIR)/dgx-a100x4-allgather"
	@$(OPTIFLOW) report $(DEMO_DIR)/dgx-a100x4-allgather
	@echo
	@echo "== optiflow verify $(DEMO_DIR)/dgx-a100x4-allgather/schedules/allgather-1MiB.xml (an exported MSCCL schedule)"
	@$(OPTIFLOW) verify $(DEMO_DIR)/dgx-a100x4-allgather/schedules/allgather-1MiB.xml | tail -n 1

# .deb and .rpm (CPack; packaging/README.md) into $(BUILD_DIR)/packages/. The packages install under /usr, so the
# build is configured with CMAKE_INSTALL_PREFIX=/usr first (it stays in the build's cache; nothing recompiles).
package: deps
	@cmake --preset $(PRESET) -DCMAKE_INSTALL_PREFIX=/usr >/dev/null
	@cmake --build --preset $(PRESET) -j $(JOBS)
	@rm -rf $(BUILD_DIR)/packages
	@cd $(BUILD_DIR) && cpack --config CPackConfig.cmake

# As root on Debian: installs the .deb, checks it (binaries, plugins found by NCCL's rules, conffile), purges it and
# checks that nothing is left; inspects the .rpm (scripts/package-test.sh).
package-test: package
	@./scripts/package-test.sh $(BUILD_DIR)

# Offline checks of the Kubernetes manifests and the container file: every overlay renders, yamllint, Kubernetes
# schemas (kubernetes-models from npm, into build/k8s-check) and the deployment's invariants (scripts/k8s-check.sh).
k8s-check: deps
	@./scripts/k8s-check.sh

# Benchmarks: simulator scaling, compile speed, the tuner's per-call cost (Google Benchmark), the net transport
# against a raw socket loop on loopback (net_bench prints a table) and synthesis runs (scripts/synthesis-bench.sh).
bench: build
	@$(BUILD_DIR)/bench/sim_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
	@$(BUILD_DIR)/bench/compile_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
	@$(BUILD_DIR)/bench/tuner_bench --benchmark_repetitions=10 --benchmark_report_aggregates_only=true
	@$(BUILD_DIR)/bench/profiler_bench --benchmark_repetitions=10 --benchmark_report_aggregates_only=true
	@$(BUILD_DIR)/bench/net_bench --reps 5 --mib 256 --msgs 200000
	@./scripts/synthesis-bench.sh $(BUILD_DIR) quick

# The synthesis table on 8 to 1024 GPUs (docs/synthesis.md); hours above 128 GPUs.
bench-scale: build
	@./scripts/synthesis-bench.sh $(BUILD_DIR) scale

# docs/calibration.md's table: optiflow calibrate on the published nccl-tests logs in LOGS=DIR (in sample and across
# node counts; the files it expects are listed in docs/calibration.md).
LOGS ?=
calibration-table: build
	@./scripts/calibration-table.sh $(BUILD_DIR) $(LOGS)

# The sanitizer build CI runs as well.
asan:
	@$(MAKE) --no-print-directory test PRESET=asan-ubsan

# The threaded suites (label `threads`) under ThreadSanitizer: the tsan preset builds only them.
tsan: deps
	@cmake --preset tsan >/dev/null
	@cmake --build --preset tsan -j $(JOBS)
	@ctest --preset tsan

# The product (libraries, plugins, CLI, daemon) built with clang, warnings as errors.
clang: deps
	@cmake --preset clang >/dev/null
	@cmake --build --preset clang -j $(JOBS)

# libFuzzer targets (clang); see tests/fuzz/README.md.
fuzz: deps
	@cmake --preset fuzz >/dev/null
	@cmake --build --preset fuzz -j $(JOBS)

format:
	@git ls-files '*.cc' '*.h' | xargs clang-format -i

format-check:
	@git ls-files '*.cc' '*.h' | xargs clang-format --dry-run --Werror

clean:
	@rm -rf build
