#!/usr/bin/env bash
# GPU check of optiflow-bench (issue 21): two ranks on one GPU, told apart by NCCL_HOSTID so that NCCL treats them
# as two nodes (shared/reference/nccl-profiler-abi.md, last section), run a ring All-Gather, a hierarchical
# All-Gather and NCCL's own All-Gather with --check at a few sizes and print the nccl-tests table; then a 1-round
# `optiflow synthesize --evaluator hardware` on a 2-rank topology whose launcher starts both ranks locally.
#
# Run from the repository root on a machine with an NVIDIA GPU and CUDA + NCCL (+ cuBLAS) under $CUDA_ROOT
# (/usr/local/cuda). The log goes to $OUT when set (else build/devcheck-logs/). Well under 5 minutes once built.
#
#   scripts/device-check-bench.sh [--jobs N]          configure the default preset (benchmarks off) and build only
#                                                     optiflow and optiflow-bench
#   scripts/device-check-bench.sh --build-dir DIR     use an already configured build folder
#   scripts/device-check-bench.sh --prebuilt DIR      build nothing: DIR/bin/{optiflow,optiflow-bench}, DIR/lib
#   scripts/device-check-bench.sh --make-bundle DIR [--build-dir B]
#        copy the built programs and their non-system shared libraries (not NCCL, CUDA or cuBLAS) into DIR
#
# Exit status: 0 every case passed; 1 a case failed; 2 no GPU (nothing run on it); 3 build or setup failed.

set -uo pipefail

CUDA_ROOT="${CUDA_ROOT:-/usr/local/cuda}"
JOBS=16
BUILD_DIR=""
PREBUILT=""
BUNDLE_OUT=""
CASE_TIMEOUT_S=150

usage() { sed -n '2,/^# Exit status/p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) JOBS="${2:?--jobs N}"; shift 2 ;;
    --build-dir) BUILD_DIR="${2:?--build-dir DIR}"; shift 2 ;;
    --prebuilt) PREBUILT="${2:?--prebuilt DIR}"; shift 2 ;;
    --make-bundle) BUNDLE_OUT="${2:?--make-bundle DIR}"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "device-check-bench: unknown argument '$1' (--help)" >&2; exit 3 ;;
  esac
done

if [ ! -f CMakePresets.json ] || [ ! -f exec/CMakeLists.txt ]; then
  echo "device-check-bench: run me from the repository root" >&2
  exit 3
fi
REPO="$(pwd)"

if [ -n "$BUNDLE_OUT" ]; then
  B="${BUILD_DIR:-build/default}"
  for f in "$B/cli/optiflow" "$B/exec/optiflow-bench"; do
    [ -f "$f" ] || { echo "device-check-bench: $f is missing: build it first" >&2; exit 3; }
  done
  rm -rf "$BUNDLE_OUT" && mkdir -p "$BUNDLE_OUT/bin" "$BUNDLE_OUT/lib" || exit 3
  cp "$B/cli/optiflow" "$B/exec/optiflow-bench" "$BUNDLE_OUT/bin/" || exit 3
  for p in "$B/cli/optiflow" "$B/exec/optiflow-bench"; do
    ldd "$p" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
      grep -v -E '/(libc|libm|libdl|librt|libpthread|libresolv|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
      grep -v -E 'lib(nccl|cudart|cublas|cublasLt|cuda)\.so' |
      while read -r lib; do cp -L "$lib" "$BUNDLE_OUT/lib/"; done
  done
  echo "made $(date -u +%FT%TZ) from commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)" >"$BUNDLE_OUT/MANIFEST"
  echo "bundle ready: scripts/device-check-bench.sh --prebuilt $BUNDLE_OUT"
  exit 0
fi

LOGDIR="${OUT:-$REPO/build/devcheck-logs}"
mkdir -p "$LOGDIR" || exit 3
LOG="$LOGDIR/device-check-bench.log"
step() { printf '\n== [%3ds] %s\n' "$SECONDS" "$*"; }
FAILED=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; FAILED=1; }

main() {
  for v in $(compgen -e); do
    case "$v" in OPTIFLOW_* | RANK | WORLD_SIZE | LOCAL_RANK | OMPI_COMM_WORLD_* | SLURM_PROCID | SLURM_NTASKS | PMI_*)
      echo "note: unsetting $v for the check"; unset "$v" ;;
    esac
  done
  TMP="$(mktemp -d "${TMPDIR:-/tmp}/devcheck-bench.XXXXXX")"
  # shellcheck disable=SC2317  # called by the trap
  cleanup() { rm -rf "$TMP"; }
  trap cleanup EXIT

  step "machine"
  echo "host $(uname -n), $(nproc) cores; log: $LOG"
  if command -v nvidia-smi >/dev/null; then nvidia-smi -L || true; else echo "nvidia-smi: not found"; fi
  RUN_LD="$CUDA_ROOT/lib64"

  step "build"
  if [ -n "$PREBUILT" ]; then
    OPTIFLOW_BIN="$PREBUILT/bin/optiflow"
    BENCH_BIN="$PREBUILT/bin/optiflow-bench"
    RUN_LD="$(cd "$PREBUILT/lib" && pwd):$RUN_LD"
  else
    if [ -z "$BUILD_DIR" ]; then
      BUILD_DIR=build/default
      echo "+ cmake --preset default -DOPTIFLOW_BUILD_BENCH=OFF"
      if ! cmake --preset default -DOPTIFLOW_BUILD_BENCH=OFF >"$LOGDIR/build.log" 2>&1; then
        tail -25 "$LOGDIR/build.log"; echo "device-check-bench: configure failed"; exit 3
      fi
    fi
    echo "+ cmake --build $BUILD_DIR --target optiflow optiflow-bench -j$JOBS"
    if ! cmake --build "$BUILD_DIR" --target optiflow optiflow-bench -j"$JOBS" >>"$LOGDIR/build.log" 2>&1; then
      tail -40 "$LOGDIR/build.log"; echo "device-check-bench: build failed"; exit 3
    fi
    OPTIFLOW_BIN="$BUILD_DIR/cli/optiflow"
    BENCH_BIN="$BUILD_DIR/exec/optiflow-bench"
  fi
  OPTIFLOW_BIN="$(cd "$(dirname "$OPTIFLOW_BIN")" && pwd)/$(basename "$OPTIFLOW_BIN")"
  BENCH_BIN="$(cd "$(dirname "$BENCH_BIN")" && pwd)/$(basename "$BENCH_BIN")"
  export LD_LIBRARY_PATH="$RUN_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if ! "$BENCH_BIN" --help | grep -q -- '--rendezvous'; then echo "device-check-bench: $BENCH_BIN does not run"; exit 3; fi
  if "$BENCH_BIN" x.json 2>&1 | grep -q "built without CUDA"; then
    echo "device-check-bench: this optiflow-bench was built without CUDA/NCCL/cuBLAS (see the configure log)"; exit 3
  fi
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "device-check-bench: no GPU here"; exit 2
  fi

  step "schedules for two ranks (two nodes of one GPU, as NCCL_HOSTID makes them)"
  cat >"$TMP/two.toml" <<'TOML'
name = "devcheck-2x1"
nodes = 2
gpus_per_node = 1
gpu_type = "GPU"

[intra]
kind = "nvswitch"
gpu_bandwidth_gbytes_per_s = 300
latency_us = 0.5

[[nics]]
name = "nic0"
gbps = 100
latency_us = 3.0
gpus = [0]

[inter]
kind = "rail-optimized"
oversubscription = 1.0
switch_latency_us = 0.5
TOML
  for prog in allgather_ring allgather_hier_rail; do
    if ! "$OPTIFLOW_BIN" compile "examples/programs/$prog.ofl" --topo "$TMP/two.toml" --size 1MiB \
        -o "$TMP/$prog.json"; then
      echo "device-check-bench: could not compile $prog for 2 ranks"; exit 3
    fi
  done
  echo "compiled: allgather_ring.json allgather_hier_rail.json"

  # Both ranks on GPU 0 (LOCAL_RANK=0), two host ids, loopback sockets between them.
  export NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo NCCL_DEBUG=WARN
  cat >"$TMP/launch.sh" <<EOF2
#!/usr/bin/env bash
# The launcher: both ranks of optiflow-bench locally; usage: launch.sh ARGS... (passed to every rank)
key="dc\$\$"
pids=()
for r in 0 1; do
  NCCL_HOSTID="devcheck-host\$r" RANK=\$r WORLD_SIZE=2 LOCAL_RANK=0 \\
    timeout $CASE_TIMEOUT_S "$BENCH_BIN" "\$@" --rendezvous-dir "$TMP" --rendezvous-key "\$key" &
  pids+=(\$!)
done
rc=0
for p in "\${pids[@]}"; do wait "\$p" || rc=\$?; done
exit \$rc
EOF2
  chmod +x "$TMP/launch.sh"

  step "optiflow-bench: ring, hierarchical and NCCL's All-Gather, two ranks on one GPU, --check"
  "$TMP/launch.sh" "$TMP/allgather_ring.json" "$TMP/allgather_hier_rail.json" --nccl --check \
    --sizes 4KiB:16MiB:16 --iters 10 --warmup 3 >"$TMP/bench.txt" 2>"$TMP/bench.err"
  rc=$?
  cat "$TMP/bench.txt"
  [ -s "$TMP/bench.err" ] && { echo "--- stderr"; tail -30 "$TMP/bench.err"; }
  if [ "$rc" = 0 ]; then pass "optiflow-bench exited 0"; else fail "optiflow-bench exited $rc"; fi
  runs=$(grep -c '^# Collective test starting' "$TMP/bench.txt")
  oks=$(grep -c '^# Out of bounds values : 0 OK' "$TMP/bench.txt")
  rows=$(grep -c -E '^ +[0-9]+ +[0-9]+ +float' "$TMP/bench.txt")
  if [ "$runs" = 3 ] && [ "$oks" = 3 ]; then pass "3 runs, every one checked OK"; else fail "$runs runs, $oks OK"; fi
  if [ "$rows" -ge 9 ]; then pass "$rows table rows"; else fail "only $rows table rows"; fi
  if grep -q 'all_gather_perf_optiflow-allgather_ring.json' "$TMP/bench.txt" &&
     grep -q '^#  Rank  1 ' "$TMP/bench.txt"; then
    pass "nccl-tests layout (program names, one Rank line per rank)"
  else
    fail "not the nccl-tests layout"
  fi

  step "optiflow synthesize --evaluator hardware: 1 round on the 2-rank topology"
  "$OPTIFLOW_BIN" synthesize --topo "$TMP/two.toml" --coll allgather --sizes 64KiB,4MiB --rounds 1 --candidates 3 \
    --evaluator hardware --launcher "$TMP/launch.sh {batch} --json -o {out} --iters 10 --warmup 3 --check" \
    --launcher-timeout $((CASE_TIMEOUT_S + 30)) --out "$TMP/run" --json -q >"$TMP/synth.json" 2>"$TMP/synth.err"
  rc=$?
  cat "$TMP/synth.json"; tail -20 "$TMP/synth.err"
  if [ "$rc" = 0 ]; then pass "synthesize exited 0"; else fail "synthesize exited $rc"; fi
  if grep -q '"round 0: measured [1-9]' "$TMP/synth.json"; then
    pass "round 0 measured on the GPU"
  else
    fail "round 0 not measured (see $TMP/run/hardware/round-0/launcher.log):"
    tail -20 "$TMP/run/hardware/round-0/launcher.log" 2>/dev/null
  fi
  grep -h '"measured":true' "$TMP/run/history.jsonl" | head -3 | cut -c1-300

  step "result"
  if [ "$FAILED" = 0 ]; then echo "device-check-bench: all cases passed"; else echo "device-check-bench: FAILED"; fi
  return "$FAILED"
}

main 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
