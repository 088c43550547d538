#!/usr/bin/env bash
# GPU check of the OptiFlow NCCL plugins: does a real NCCL load libnccl-tuner-optiflow.so, initialise it per
# communicator, and fail communicator creation when a pinned plan is missing?
#
# Run from the repository root on a machine with an NVIDIA GPU and CUDA + NCCL under $CUDA_ROOT (/usr/local/cuda).
# It writes its log to $OUT when that is set (else build/devcheck-logs/) and takes well under 4 minutes once built.
#
#   scripts/device-check-plugins.sh [--jobs N]          `cmake --preset default -DOPTIFLOW_BUILD_BENCH=OFF`, then
#                                                       build only optiflow, both plugins and nccl_plugin_check
#   scripts/device-check-plugins.sh --build-dir DIR     use an already configured build folder instead
#   scripts/device-check-plugins.sh --prebuilt DIR      build nothing: use a bundle made by --make-bundle
#   scripts/device-check-plugins.sh --make-bundle DIR [--build-dir B]
#        (on a machine that has the build dependencies) copy the built optiflow CLI, both plugins, nccl_plugin_check
#        and the CLI's shared libraries into DIR, for a GPU machine that lacks the dependencies (fmt, spdlog, ...)
#
# Steps: build; probe the tuner without NCCL (nccl_plugin_check --tuner-probe: dlopen + v5 init, no GPU needed);
# synthesize a tiny plan and publish it into a fresh namespace devcheck-<pid>; run tests/device/nccl_plugin_check
# three times with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING,ENV,NET and LD_LIBRARY_PATH=<plugin folder>:
#   (a) NCCL_TUNER_PLUGIN=optiflow: the tuner is loaded and its init reads the published plan;
#   (b) NCCL_TUNER_PLUGIN unset, NCCL_NET_PLUGIN=optiflow: NCCL would take the tuner from the net library only if
#       it accepted that library as a net plugin; ours exports no net symbols yet (issue 7), so by NCCL 2.28's
#       src/plugin/{net,tuner}.cc (read, not yet run) NCCL rejects it and never falls back to it for the tuner.
#       The script reports what NCCL's log actually says: PASS if the tuner was used, XFAIL (issue 7) if NCCL said
#       "External network plugin ... is unsupported", FAIL otherwise;
#   (c) as (a) with OPTIFLOW_PLAN=0123456789abcdef (not published): communicator creation must FAIL with our
#       message naming the plan and this host;
#   (d) two ranks on GPU 0, one process each, with different NCCL_HOSTID values (NCCL then treats them as two nodes
#       and their traffic goes through our net plugin), NCCL_TUNER_PLUGIN, NCCL_NET_PLUGIN and NCCL_PROFILER_PLUGIN
#       all =optiflow, OPTIFLOW_PLAN pinned to a plan synthesized for 2 nodes x 1 GPU (a multi-node communicator
#       uses only a pinned plan), AllReduce and AllGather at 4 KiB, 1 MiB and 16 MiB, 5 calls each. PASS when
#       NCCL's INFO log shows all three plugins loaded, the tuner used the pinned plan (OptiFlow/Tuner: using plan
#       ...), NCCL's TUNING lines show the plan's algorithm/protocol for a size, and `optiflow cache measurements
#       --json` lists GPU-timed rows (calls > 0) for this communicator.
# The synthesized plan is for 8 ranks; with one GPU the communicator has 1 rank, so the plan has no decisions for
# it (the tuner says "0 decisions"): the check is that the plugin is loaded and initialised, not that it changes
# NCCL's choices. With 2 or more GPUs nccl_plugin_check uses them all.
#
# Exit status: 0 all cases as expected; 1 a case failed; 2 no GPU (NCCL cases not run; the probes still ran);
# 3 build or setup failed.
#
# The script's own settings avoid the OPTIFLOW_ prefix: the plugin warns about unknown OPTIFLOW_* variables.

set -uo pipefail

CUDA_ROOT="${CUDA_ROOT:-/usr/local/cuda}"
JOBS=16
BUILD_DIR=""
PREBUILT=""
BUNDLE_OUT=""
ABSENT_PLAN=0123456789abcdef
CASE_TIMEOUT_S=90

usage() { sed -n '2,/^# The script/p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) JOBS="${2:?--jobs N}"; shift 2 ;;
    --build-dir) BUILD_DIR="${2:?--build-dir DIR}"; shift 2 ;;
    --prebuilt) PREBUILT="${2:?--prebuilt DIR}"; shift 2 ;;
    --make-bundle) BUNDLE_OUT="${2:?--make-bundle DIR}"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "device-check-plugins: unknown argument '$1' (--help)" >&2; exit 3 ;;
  esac
done

if [ ! -f CMakePresets.json ] || [ ! -f plugin/CMakeLists.txt ]; then
  echo "device-check-plugins: run me from the repository root" >&2
  exit 3
fi
REPO="$(pwd)"

# ---------------------------------------------------------------------------------------------------------------
# --make-bundle: copy built artifacts for a GPU machine without the build dependencies (nothing is built here).
if [ -n "$BUNDLE_OUT" ]; then
  B="${BUILD_DIR:-build/default}"
  for f in "$B/cli/optiflow" "$B/plugin/libnccl-tuner-optiflow.so" "$B/plugin/libnccl-net-optiflow.so" \
           "$B/plugin/libnccl-profiler-optiflow.so" "$B/tests/device/nccl_plugin_check"; do
    [ -f "$f" ] || { echo "device-check-plugins: $f is missing: build it first (see --help)" >&2; exit 3; }
  done
  rm -rf "$BUNDLE_OUT" && mkdir -p "$BUNDLE_OUT/bin" "$BUNDLE_OUT/plugin" "$BUNDLE_OUT/lib" || exit 3
  cp "$B/cli/optiflow" "$B/tests/device/nccl_plugin_check" "$BUNDLE_OUT/bin/" || exit 3
  cp "$B/plugin/libnccl-tuner-optiflow.so" "$B/plugin/libnccl-net-optiflow.so" "$B/plugin/libnccl-profiler-optiflow.so" \
    "$BUNDLE_OUT/plugin/" || exit 3
  if command -v strip >/dev/null; then strip --strip-debug "$BUNDLE_OUT/bin/optiflow" "$BUNDLE_OUT"/plugin/*.so; fi
  # The CLI's shared libraries, except the C runtime (libc, libm, libstdc++, ...), which the GPU machine has in a
  # version at least as new if it is a newer distribution than this one.
  ldd "$B/cli/optiflow" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
    grep -v -E '/(libc|libm|libdl|librt|libpthread|libresolv|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$BUNDLE_OUT/lib/"; done
  {
    echo "made: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n) ($( # shellcheck source=/dev/null
      . /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}"))"
    echo "from: $REPO/$B, commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)," \
         "$(git status --porcelain 2>/dev/null | wc -l) changed paths in the working tree"
    echo "glibc: $(ldd --version 2>/dev/null | head -1)"
  } >"$BUNDLE_OUT/MANIFEST"
  du -sh "$BUNDLE_OUT"
  echo "bundle ready: on the GPU machine run  scripts/device-check-plugins.sh --prebuilt $BUNDLE_OUT"
  echo "(carry the folder $BUNDLE_OUT with the working tree)"
  exit 0
fi

# ---------------------------------------------------------------------------------------------------------------
LOGDIR="${OUT:-$REPO/build/devcheck-logs}"
mkdir -p "$LOGDIR" || exit 3
LOG="$LOGDIR/device-check-plugins.log"
step() { printf '\n== [%3ds] %s\n' "$SECONDS" "$*"; }

main() {

  # Settings from the caller's environment that would change what the cases see.
  for v in $(compgen -e); do
    case "$v" in OPTIFLOW_*) echo "note: unsetting $v for the check"; unset "$v" ;; esac
  done
  for v in NCCL_TUNER_PLUGIN NCCL_NET_PLUGIN NCCL_PROFILER_PLUGIN NCCL_HOSTID NCCL_ALGO NCCL_PROTO NCCL_DEBUG_FILE \
           NCCL_ENV_PLUGIN; do
    if [ -n "${!v+x}" ]; then echo "note: unsetting $v=${!v} for the check"; unset "$v"; fi
  done

  TMP="$(mktemp -d "${TMPDIR:-/tmp}/devcheck.XXXXXX")"
  NS="devcheck-$$"
  OPTIFLOW_BIN=""
  CLI_LD=""
  # shellcheck disable=SC2317  # called by the trap
  cleanup() {
    if [ -n "$OPTIFLOW_BIN" ] && [ -x "$OPTIFLOW_BIN" ] && [ -e "/dev/shm/optiflow-$NS" ]; then
      LD_LIBRARY_PATH="$CLI_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        "$OPTIFLOW_BIN" cache clear --remove --force --namespace "$NS" || echo "warning: could not remove namespace $NS"
    fi
    rm -rf "$TMP"
  }
  trap cleanup EXIT

  step "machine"
  echo "host $(uname -n), $(uname -m), $(nproc) cores; log: $LOG"
  if command -v nvidia-smi >/dev/null; then nvidia-smi -L || true; else echo "nvidia-smi: not found"; fi

  # NCCL and cudart: under CUDA_ROOT, else the ones pip's nvidia-* packages bring (the GPU image has them).
  NCCL_LIBDIR=""
  NCCL_INCDIR=""
  if [ -e "$CUDA_ROOT/lib64/libnccl.so.2" ]; then
    NCCL_LIBDIR="$CUDA_ROOT/lib64"
  else
    d="$(python3 -c 'import nvidia.nccl as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null)"
    [ -n "$d" ] && [ -e "$d/libnccl.so.2" ] && NCCL_LIBDIR="$d"
  fi
  if [ -e "$CUDA_ROOT/include/nccl.h" ]; then
    NCCL_INCDIR="$CUDA_ROOT/include"
  elif [ -n "$NCCL_LIBDIR" ] && [ -e "$NCCL_LIBDIR/../include/nccl.h" ]; then
    NCCL_INCDIR="$NCCL_LIBDIR/../include"
  fi
  if [ -z "$NCCL_LIBDIR" ]; then
    echo "device-check-plugins: no libnccl.so.2 under $CUDA_ROOT/lib64 nor in python3's nvidia.nccl: set CUDA_ROOT" >&2
    exit 3
  fi
  echo "NCCL: $NCCL_LIBDIR/libnccl.so.2 ($(readlink -f "$NCCL_LIBDIR/libnccl.so.2")), header: ${NCCL_INCDIR:-none}"
  RUN_LD="$NCCL_LIBDIR"
  [ -d "$CUDA_ROOT/lib64" ] && [ "$CUDA_ROOT/lib64" != "$NCCL_LIBDIR" ] && RUN_LD="$RUN_LD:$CUDA_ROOT/lib64"

  # ---------------------------------------------------------------------------------------------------------------
  step "build"
  CHECK=""
  if [ -n "$PREBUILT" ]; then
    OPTIFLOW_BIN="$PREBUILT/bin/optiflow"
    CHECK="$PREBUILT/bin/nccl_plugin_check"
    PLUGIN_DIR="$(cd "$PREBUILT/plugin" && pwd)" || exit 3
    CLI_LD="$(cd "$PREBUILT/lib" && pwd)" || exit 3
    [ -f "$PREBUILT/MANIFEST" ] && sed 's/^/bundle /' "$PREBUILT/MANIFEST"
    missing="$(LD_LIBRARY_PATH="$CLI_LD" ldd "$OPTIFLOW_BIN" 2>&1 | grep 'not found')"
    missing+="$(LD_LIBRARY_PATH="$RUN_LD" ldd "$CHECK" 2>&1 | grep 'not found')"
    if [ -n "$missing" ]; then
      echo "device-check-plugins: the bundle's programs miss libraries here:"; echo "$missing"; exit 3
    fi
  else
    if [ -z "$BUILD_DIR" ]; then
      BUILD_DIR=build/default
      echo "+ cmake --preset default -DOPTIFLOW_BUILD_BENCH=OFF"
      if ! cmake --preset default -DOPTIFLOW_BUILD_BENCH=OFF >"$LOGDIR/build.log" 2>&1; then
        tail -25 "$LOGDIR/build.log"
        echo "device-check-plugins: configure failed (missing build dependencies on this machine?)."
        echo "  Make a bundle where the project builds (scripts/device-check-plugins.sh --make-bundle build/devcheck-bundle)"
        echo "  and run with --prebuilt build/devcheck-bundle, carrying that folder."
        exit 3
      fi
    fi
    targets=(optiflow nccl_tuner_optiflow nccl_net_optiflow nccl_profiler_optiflow)
    have_check_target=0
    if [ -d "$BUILD_DIR/tests/device/CMakeFiles/nccl_plugin_check.dir" ]; then
      targets+=(nccl_plugin_check)
      have_check_target=1
    fi
    echo "+ cmake --build $BUILD_DIR --target ${targets[*]} -j$JOBS"
    if ! cmake --build "$BUILD_DIR" --target "${targets[@]}" -j"$JOBS" >>"$LOGDIR/build.log" 2>&1; then
      tail -40 "$LOGDIR/build.log"
      echo "device-check-plugins: build failed (full log: $LOGDIR/build.log)"
      exit 3
    fi
    OPTIFLOW_BIN="$BUILD_DIR/cli/optiflow"
    PLUGIN_DIR="$(cd "$BUILD_DIR/plugin" && pwd)" || exit 3
    if [ "$have_check_target" = 1 ]; then
      CHECK="$BUILD_DIR/tests/device/nccl_plugin_check"
    else
      # The target exists only when tests/CMakeLists.txt adds tests/device and CMake found CUDA and NCCL; the program
      # needs nothing but NCCL and cudart, so compile it directly.
      [ -n "$NCCL_INCDIR" ] || { echo "device-check-plugins: no nccl.h to compile nccl_plugin_check with" >&2; exit 3; }
      CHECK="$TMP/nccl_plugin_check"
      echo "+ (no nccl_plugin_check target in $BUILD_DIR) ${CXX:-g++} ... tests/device/nccl_plugin_check.cc"
      if ! "${CXX:-g++}" -std=c++20 -O2 -Wall -Wextra tests/device/nccl_plugin_check.cc -isystem "$NCCL_INCDIR" \
          -isystem "$CUDA_ROOT/include" -L"$NCCL_LIBDIR" -L"$CUDA_ROOT/lib64" -l:libnccl.so.2 -lcudart -ldl \
          -Wl,-rpath,"$NCCL_LIBDIR:$CUDA_ROOT/lib64" -o "$CHECK" >>"$LOGDIR/build.log" 2>&1; then
        tail -20 "$LOGDIR/build.log"; echo "device-check-plugins: compiling nccl_plugin_check failed"; exit 3
      fi
    fi
  fi
  echo "optiflow: $OPTIFLOW_BIN; plugins: $PLUGIN_DIR; check: $CHECK"
  ls -l "$PLUGIN_DIR"/libnccl-tuner-optiflow.so "$PLUGIN_DIR"/libnccl-net-optiflow.so || exit 3
  of() { LD_LIBRARY_PATH="$CLI_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$OPTIFLOW_BIN" "$@"; }

  # ---------------------------------------------------------------------------------------------------------------
  step "publish a tiny plan into namespace $NS"
  if ! of synthesize --topo hgx-h200x1 --coll allreduce --sizes 1KiB:64MiB:4 --rounds 1 --candidates 2 \
      --out "$TMP/run" -q >"$TMP/synth.log" 2>&1; then
    cat "$TMP/synth.log"; echo "device-check-plugins: optiflow synthesize failed"; exit 3
  fi
  pub="$(of cache publish "$TMP/run" --namespace "$NS" 2>&1)" || { echo "$pub"; echo "publish failed"; exit 3; }
  echo "$pub"
  PLAN="$(sed -n 's/^published plan \([0-9a-f]\{16\}\) .*/\1/p' <<<"$pub")"
  [ -n "$PLAN" ] || { echo "device-check-plugins: no plan hash in the publish output"; exit 3; }
  HOST="$(uname -n)"  # what the plugin's gethostname() returns

  # Environment of every run: the plugin folder first on the library path, the namespace, and no settle time (the
  # namespace is seconds old; with the default 60 s a communicator would record "no plan" instead of reading it).
  base_env=(NCCL_DEBUG=INFO "NCCL_DEBUG_SUBSYS=INIT,TUNING,ENV,NET"
            "LD_LIBRARY_PATH=$PLUGIN_DIR:$RUN_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
            "OPTIFLOW_NAMESPACE=$NS" OPTIFLOW_SETTLE_S=0)

  # ---------------------------------------------------------------------------------------------------------------
  # The probes need no GPU: they dlopen the plugin like NCCL and call the v5 init directly.
  step "tuner probes (no NCCL, no GPU)"
  env "${base_env[@]}" "$CHECK" --tuner-probe --ranks 8 >"$TMP/probe-a.log" 2>&1
  probe_a_rc=$?
  env "${base_env[@]}" OPTIFLOW_PLAN="$ABSENT_PLAN" "$CHECK" --tuner-probe >"$TMP/probe-c.log" 2>&1
  probe_c_rc=$?
  env "${base_env[@]}" "$CHECK" --tuner-probe --plugin libnccl-net-optiflow.so >"$TMP/probe-b.log" 2>&1
  probe_b_rc=$?
  cat "$TMP/probe-a.log" "$TMP/probe-c.log" "$TMP/probe-b.log" >"$LOGDIR/probes.log"
  cat "$LOGDIR/probes.log"
  declare -A RESULT WHY
  if [ $probe_a_rc = 0 ] && grep -qF "OptiFlow/Tuner: using plan $PLAN (current plan, recorded) for 8 ranks" "$TMP/probe-a.log"; then
    RESULT[probe-a]=PASS; WHY[probe-a]="tuner init read plan $PLAN for an 8-rank communicator"
  else
    RESULT[probe-a]=FAIL; WHY[probe-a]="rc $probe_a_rc, no 'using plan $PLAN' line"
  fi
  if [ $probe_c_rc = 5 ] && grep -qF "OPTIFLOW_PLAN=$ABSENT_PLAN is not usable on node $HOST" "$TMP/probe-c.log"; then
    RESULT[probe-c]=PASS; WHY[probe-c]="tuner init failed (ncclInvalidUsage) naming the plan and node $HOST"
  else
    RESULT[probe-c]=FAIL; WHY[probe-c]="rc $probe_c_rc (want 5) or no message naming the plan and $HOST"
  fi
  if [ $probe_b_rc = 0 ] && grep -qF "exports ncclTunerPlugin_v5 named 'OptiFlow'" "$TMP/probe-b.log"; then
    RESULT[probe-b]=PASS; WHY[probe-b]="libnccl-net-optiflow.so exports the same tuner"
  else
    RESULT[probe-b]=FAIL; WHY[probe-b]="rc $probe_b_rc"
  fi

  # ---------------------------------------------------------------------------------------------------------------
  # NCCL's INFO/WARN lines this script reads (NCCL 2.28.9: `strings libnccl.so.2` and src/plugin/{tuner,net,
  # plugin_open}.cc; a newer NCCL prints the same lines, (v6) for the tuner version on 2.30):
  L_TUNER_ENV="NCCL_TUNER_PLUGIN set by environment to optiflow"
  L_TUNER_USING="TUNER/Plugin: Using OptiFlow (v"                  # symbol found: "Using %s (v5)", %s = our name
  L_TUNER_LOADED="Successfully loaded external tuner plugin"       # + the library's path (not on the net fallback)
  L_TUNER_NOTFOUND="TUNER/Plugin: Could not find:"
  L_TUNER_UNSUPPORTED="External tuner plugin"                      # "... %s is unsupported": no ncclTunerPlugin_v*
  L_NET_ENV="NCCL_NET_PLUGIN set by environment to optiflow"
  L_NET_UNSUPPORTED="External network plugin"                      # "... %s is unsupported": no ncclNetPlugin_v*
  L_NET_LOADED="Successfully loaded external network plugin"
  L_NET_PLUGIN_ANY="NET/Plugin:"                                   # "Could not find: ...", or a dlopen error
  L_OURS="OptiFlow/Tuner:"
  SHOW_RE="NCCL version|NCCL_(TUNER|NET)_PLUGIN set|TUNER/Plugin|NET/Plugin|[Tt]uner plugin|network plugin|NET plugin|Assigned NET|OptiFlow/|NCCL WARN|nccl_plugin_check:"

  # Case (d): two ranks on one GPU as two "nodes" (NCCL_HOSTID), with all three plugins and a pinned 2-node plan.
  run_two_ranks_case() {
    step "case (d): 2 ranks on GPU 0, NCCL_HOSTID a/b, tuner + net + profiler plugins, pinned 2-node plan"
    local ns2="$NS-d" topo="$TMP/two-nodes.toml" idfile="$TMP/nccl-id" plan2="" pub2 rc0 rc1
    cat >"$topo" <<'TOML'
version = 1
name = "devcheck-2x1"
nodes = 2
gpus_per_node = 1
gpu_type = "H100-SXM5"

[intra]
kind = "nvswitch"
gpu_bandwidth_gbytes_per_s = 450.0
latency_us = 0.6

[[nics]]
name = "mlx5_0"
gbps = 400
latency_us = 1.0
gpus = [0]

[inter]
kind = "rail-optimized"
oversubscription = 1.0
switch_latency_us = 0.2
TOML
    for coll in allreduce allgather; do
      if ! of synthesize --topo "$topo" --coll "$coll" --sizes 4KiB:16MiB:4 --rounds 1 --candidates 2 \
          --out "$TMP/run-d-$coll" -q >"$TMP/synth-d-$coll.log" 2>&1; then
        cat "$TMP/synth-d-$coll.log"; RESULT[d]=FAIL; WHY[d]="optiflow synthesize ($coll, 2x1 topology) failed"; return
      fi
    done
    # One plan for both collectives: publish the allreduce run, then the allgather run would replace it, so the
    # allreduce plan is the pinned one (AllReduce decisions); AllGather runs with NCCL's choices plus the profiler.
    pub2="$(of cache publish "$TMP/run-d-allreduce" --namespace "$ns2" 2>&1)" || {
      echo "$pub2"; RESULT[d]=FAIL; WHY[d]="publish failed"; return; }
    echo "$pub2"
    plan2="$(sed -n 's/^published plan \([0-9a-f]\{16\}\) .*/\1/p' <<<"$pub2")"
    local env_d=(NCCL_DEBUG=INFO "NCCL_DEBUG_SUBSYS=INIT,TUNING,NET,PROFILE,ENV"
                 "LD_LIBRARY_PATH=$PLUGIN_DIR:$RUN_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
                 "OPTIFLOW_NAMESPACE=$ns2" OPTIFLOW_SETTLE_S=0 "OPTIFLOW_PLAN=$plan2"
                 NCCL_TUNER_PLUGIN=optiflow NCCL_NET_PLUGIN=optiflow NCCL_PROFILER_PLUGIN=optiflow)
    rm -f "$idfile"
    env "${env_d[@]}" NCCL_HOSTID=devcheck-a timeout "$CASE_TIMEOUT_S" "$CHECK" --rank 0 --nranks 2 \
      --id-file "$idfile" >"$LOGDIR/case-d-rank0.log" 2>&1 &
    local pid0=$!
    env "${env_d[@]}" NCCL_HOSTID=devcheck-b timeout "$CASE_TIMEOUT_S" "$CHECK" --rank 1 --nranks 2 \
      --id-file "$idfile" >"$LOGDIR/case-d-rank1.log" 2>&1
    rc1=$?
    wait "$pid0"
    rc0=$?
    CASE_LOG="$LOGDIR/case-d-rank0.log"
    echo "exit status rank 0: $rc0, rank 1: $rc1; logs: $LOGDIR/case-d-rank{0,1}.log"
    echo "-- the lines that matter (rank 0):"
    grep -E "$SHOW_RE|PROFILER/Plugin|[Pp]rofiler|OptiFlow/Profiler|AllReduce: .*Algo|AllGather: .*Algo" "$CASE_LOG" | head -40
    of cache measurements --namespace "$ns2" --json >"$LOGDIR/case-d-measurements.json" 2>&1
    of cache measurements --namespace "$ns2" | tee "$LOGDIR/case-d-measurements.txt"
    local timed
    timed="$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sum(1 for r in d["rows"] if r["calls"]>0 and r["min_us"]>0))' \
             "$LOGDIR/case-d-measurements.json" 2>/dev/null || echo 0)"
    local w=""
    [ "$rc0" = 0 ] && [ "$rc1" = 0 ] || w+=", rc $rc0/$rc1"
    has "$L_TUNER_USING" || w+=", tuner not loaded"
    has "$L_NET_LOADED" || has "NET/Plugin: Loaded net plugin OptiFlow" || w+=", no net plugin line"
    grep -qE "PROFILER/Plugin: Loaded|[Pp]rofiler plugin .*OptiFlow|OptiFlow/Profiler: timing collectives" "$CASE_LOG" ||
      w+=", no profiler line"
    has "$L_OURS using plan $plan2" || w+=", no '$L_OURS using plan $plan2' line"
    [ "${timed:-0}" -gt 0 ] || w+=", no GPU-timed rows in optiflow cache measurements"
    if [ -z "$w" ]; then
      RESULT[d]=PASS; WHY[d]="3 plugins loaded, tuner on pinned plan $plan2, $timed GPU-timed rows"
    else
      RESULT[d]=FAIL; WHY[d]="${w#, }"
    fi
    of cache clear --remove --force --namespace "$ns2" >/dev/null 2>&1 || true
  }

  # run_case NAME DESCRIPTION ENV...: runs nccl_plugin_check; sets CASE_RC and CASE_LOG.
  run_case() {
    local name="$1" desc="$2"
    shift 2
    CASE_LOG="$LOGDIR/case-$name.log"
    step "case ($name): $desc"
    echo "+ env $* $CHECK"
    env "${base_env[@]}" "$@" timeout "$CASE_TIMEOUT_S" "$CHECK" >"$CASE_LOG" 2>&1
    CASE_RC=$?
    echo "exit status $CASE_RC (0 OK, 1 failed, 2 no GPU, 3 ncclCommInitAll failed, 124 timed out); full log: $CASE_LOG"
    echo "-- the lines that matter:"
    grep -E "$SHOW_RE" "$CASE_LOG" | head -40
  }
  has() { grep -qF -- "$1" "$CASE_LOG"; }

  run_case a "NCCL_TUNER_PLUGIN=optiflow" NCCL_TUNER_PLUGIN=optiflow
  NO_GPU=0
  if [ "$CASE_RC" = 2 ] && has "nccl_plugin_check: no GPU"; then
    NO_GPU=1
    echo "no GPU here: $(grep -F 'nccl_plugin_check: no GPU' "$CASE_LOG")"
    echo "NCCL cases (a)-(c) not run; without a GPU NCCL's communicator init fails at CUDA initialisation, before it"
    echo "loads any plugin, so only the probes above say anything about the plugin."
    for c in a b c d; do RESULT[$c]=SKIP; WHY[$c]="no GPU"; done
  else
    if [ "$CASE_RC" = 0 ] && has "nccl_plugin_check: OK" && has "$L_TUNER_USING" && has "$L_OURS using plan $PLAN"; then
      RESULT[a]=PASS
      WHY[a]="NCCL: '$(grep -o "$L_TUNER_LOADED.*" "$CASE_LOG" | head -1)', '$(grep -o "TUNER/Plugin: Using OptiFlow (v[0-9]*)" "$CASE_LOG" | head -1)'; ours: '$(grep -o "$L_OURS using plan.*" "$CASE_LOG" | head -1)'"
    else
      RESULT[a]=FAIL
      w="rc $CASE_RC"
      has "nccl_plugin_check: OK" || w+=", collectives not OK"
      has "$L_TUNER_USING" || w+=", no '$L_TUNER_USING' line (tuner not loaded)"
      has "$L_OURS using plan $PLAN" || w+=", no '$L_OURS using plan $PLAN' line"
      has "$L_TUNER_ENV" || w+=", no '$L_TUNER_ENV' line"
      WHY[a]="$w"
    fi

    run_case b "NCCL_TUNER_PLUGIN unset, NCCL_NET_PLUGIN=optiflow (tuner from the net library?)" NCCL_NET_PLUGIN=optiflow
    net_said="$(grep -F -e "$L_NET_UNSUPPORTED" -e "$L_NET_LOADED" -e "$L_NET_PLUGIN_ANY" "$CASE_LOG" | head -3 |
                sed 's/.*NCCL INFO //' | paste -sd ';' -)"
    tuner_said="$(grep -F -e "$L_TUNER_NOTFOUND" -e "$L_TUNER_USING" -e "$L_TUNER_UNSUPPORTED" "$CASE_LOG" | head -2 |
                  sed 's/.*NCCL INFO //' | paste -sd ';' -)"
    if [ "$CASE_RC" != 0 ] || ! has "nccl_plugin_check: OK"; then
      RESULT[b]=FAIL; WHY[b]="rc $CASE_RC, collectives not OK; NCCL said: ${net_said:-nothing about the net library}"
    elif has "$L_TUNER_USING"; then
      RESULT[b]=PASS; WHY[b]="NCCL took the tuner from the net library; NCCL said: $net_said; $tuner_said"
    elif has "$L_NET_UNSUPPORTED"; then
      RESULT[b]=XFAIL
      WHY[b]="issue 7: NCCL rejected libnccl-net-optiflow.so as a net plugin (no ncclNetPlugin_v*), so no tuner fallback; NCCL said: $net_said; $tuner_said"
    else
      RESULT[b]=FAIL; WHY[b]="unexpected: no tuner and no 'External network plugin ... is unsupported'; NCCL said: ${net_said:-nothing}; ${tuner_said:-nothing}"
    fi
    has "$L_NET_ENV" || WHY[b]+=" (no '$L_NET_ENV' line)"

    run_two_ranks_case
    run_case c "NCCL_TUNER_PLUGIN=optiflow OPTIFLOW_PLAN=$ABSENT_PLAN (absent): init must fail" \
      NCCL_TUNER_PLUGIN=optiflow OPTIFLOW_PLAN="$ABSENT_PLAN"
    if [ "$CASE_RC" = 3 ] && has "$L_TUNER_USING" && has "OPTIFLOW_PLAN=$ABSENT_PLAN is not usable on node $HOST"; then
      RESULT[c]=PASS
      WHY[c]="communicator init failed: '$(grep -o 'ncclCommInitAll failed:.*' "$CASE_LOG" | head -1)', after '$(grep -o "$L_OURS tuner init: OPTIFLOW_PLAN=$ABSENT_PLAN is not usable on node $HOST" "$CASE_LOG" | head -1) ...'"
    else
      RESULT[c]=FAIL
      w="rc $CASE_RC (want 3: ncclCommInitAll failed)"
      has "$L_TUNER_USING" || w+=", tuner not loaded"
      has "OPTIFLOW_PLAN=$ABSENT_PLAN is not usable on node $HOST" || w+=", no message naming the plan and node $HOST"
      WHY[c]="$w"
    fi
  fi

  # ---------------------------------------------------------------------------------------------------------------
  step "summary (NCCL: $(grep -ho 'NCCL library [0-9]*' "$LOGDIR"/case-a.log 2>/dev/null | head -1); plan $PLAN; namespace $NS)"
  status=0
  for k in probe-a probe-b probe-c a b c d; do
    printf '%-8s %-5s %s\n' "$k" "${RESULT[$k]}" "${WHY[$k]}"
    case "${RESULT[$k]}" in FAIL) status=1 ;; esac
  done
  if [ $status = 0 ] && [ $NO_GPU = 1 ]; then status=2; fi
  case $status in
    0) verdict=PASS ;;
    2) verdict="NO GPU (probes only)" ;;
    *) verdict=FAIL ;;
  esac
  echo "device-check-plugins: $verdict in ${SECONDS}s"
  return $status
}

main 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
