# Thin wrapper over CMake presets. The two commands of the README are `make demo` and `make test`;
# both install missing Debian packages first (scripts/install-deps.sh is idempotent).
PRESET ?= default
BUILD_DIR := build/$(PRESET)
OPTIFLOW := $(BUILD_DIR)/cli/optiflow
DEMO_DIR := $(BUILD_DIR)/demo
JOBS ?= $(shell nproc)

.PHONY: all deps configure build test demo bench asan fuzz format format-check clean

all: build

deps:
	@./scripts/install-deps.sh

configure: deps
	@cmake --preset $(PRESET) >/dev/null

build: configure
	@cmake --build --preset $(PRESET) -j $(JOBS)

test: build
	@ctest --preset $(PRESET)

# Until the synthesizer exists (issue 5), the demo runs the nearest real thing: the preset cluster, a ring
# All-Gather for it proven by the verifier, run with real bytes by the reference executor and timed by the
# simulator next to the lower bound and NCCL's own choice, and the verdicts on real MSCCL files.
demo: build
	@mkdir -p $(DEMO_DIR)
	@echo "== optiflow topo show dgx-a100x4"
	@$(OPTIFLOW) topo show dgx-a100x4
	@echo
	@echo "== optiflow fixture --coll allgather --ranks 32 --channels 2 --format msccl-xml"
	@$(OPTIFLOW) fixture --coll allgather --ranks 32 --channels 2 --format msccl-xml -o $(DEMO_DIR)/ring-ag-32.xml
	@echo "wrote $(DEMO_DIR)/ring-ag-32.xml"
	@echo
	@echo "== optiflow verify $(DEMO_DIR)/ring-ag-32.xml"
	@$(OPTIFLOW) verify $(DEMO_DIR)/ring-ag-32.xml
	@echo
	@echo "== optiflow check $(DEMO_DIR)/ring-ag-32.xml"
	@$(OPTIFLOW) check $(DEMO_DIR)/ring-ag-32.xml
	@echo
	@echo "== optiflow simulate $(DEMO_DIR)/ring-ag-32.xml --topo dgx-a100x4 (with the lower bound beside each time)"
	@$(OPTIFLOW) simulate $(DEMO_DIR)/ring-ag-32.xml --topo dgx-a100x4 --sizes 1KiB:1GiB:32
	@echo
	@echo "== optiflow baseline --topo dgx-a100x4 --coll allgather --simulate (NCCL's choice, its model and our simulator)"
	@$(OPTIFLOW) baseline --topo dgx-a100x4 --coll allgather --sizes 1KiB:1GiB:32 --simulate
	@echo
	@echo "== optiflow verify on real MSCCL files (../shared/reference/msccl-samples)"
	@if [ -d ../shared/reference/msccl-samples ]; then \
	  for f in ../shared/reference/msccl-samples/*.xml; do $(OPTIFLOW) verify $$f | tail -n 1; done; \
	else echo "(samples folder not present)"; fi

# Google Benchmark micro-benchmarks (simulator scaling); medians of 3 repetitions.
bench: build
	@$(BUILD_DIR)/bench/sim_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
	@$(BUILD_DIR)/bench/compile_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true

# The sanitizer build CI runs as well.
asan:
	@$(MAKE) --no-print-directory test PRESET=asan-ubsan

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
