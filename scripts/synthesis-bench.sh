#!/usr/bin/env bash
# The synthesis table of docs/synthesis.md ("Synthesis time against GPU count"): `optiflow synthesize` with every
# default (built-in proposer, seed 1, at most 8 rounds of 8 candidates) per cluster and collective, timed by
# /usr/bin/time on this machine, one run after another. Prints one row per run: wall and CPU seconds, peak memory,
# rounds, the least speedup over NCCL's choice (simulated by the same simulator), the number of sizes where NCCL's
# choice cannot be simulated (nccl_na: NVLS, CollNet) and the worst ratio to the lower bound from 256 MiB up.
#
#   scripts/synthesis-bench.sh [BUILD_DIR] [SET]
#     SET = quick (default; `make bench`): dgx-a100x4 All-Gather (11 and 21 sizes), Reduce-Scatter, All-Reduce
#           scale: All-Gather, Reduce-Scatter and All-Reduce on 8 to 1024 GPUs (dgx-h100 x 1 ... x 128); takes
#                  hours above 128 GPUs
#     OPTIFLOW_BENCH_BUDGET_S: --time-budget per run (default 0: none)
#     OPTIFLOW_BENCH_MAX_GPUS: skip clusters with more GPUs (default: none skipped)
#     OPTIFLOW_BENCH_MIN_GPUS: skip clusters with fewer GPUs (default: none skipped)
#     OPTIFLOW_BENCH_COLLECTIVES: the scale set's collectives (default "allgather reducescatter allreduce")
set -euo pipefail

build_dir=${1:-build/default}
set_name=${2:-quick}
budget=${OPTIFLOW_BENCH_BUDGET_S:-0}
max_gpus=${OPTIFLOW_BENCH_MAX_GPUS:-0}
min_gpus=${OPTIFLOW_BENCH_MIN_GPUS:-0}
optiflow=$build_dir/cli/optiflow
[[ -x $optiflow ]] || { echo "synthesis-bench: $optiflow not found (build first: make build)" >&2; exit 2; }
command -v /usr/bin/time >/dev/null || { echo "synthesis-bench: /usr/bin/time is missing (apt-get install time)" >&2; exit 2; }

case $set_name in
  quick)
    runs=("dgx-a100x4 allgather 1KiB:1GiB:4" "dgx-a100x4 allgather 1KiB:1GiB:2" "dgx-a100x4 reducescatter 1KiB:1GiB:4"
          "dgx-a100x4 allreduce 1KiB:1GiB:4") ;;
  scale)
    runs=()
    for coll in ${OPTIFLOW_BENCH_COLLECTIVES:-allgather reducescatter allreduce}; do
      for topo in dgx-h100 dgx-h100x2 dgx-h100x4 dgx-h100x8 dgx-h100x16 dgx-h100x32 dgx-h100x64 dgx-h100x128; do
        runs+=("$topo $coll 1KiB:1GiB:4")
      done
    done ;;
  *) echo "synthesis-bench: unknown set '$set_name' (quick or scale)" >&2; exit 2 ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '%-14s %5s %-14s %5s %8s %8s %8s %6s %6s %11s %7s %13s  %s\n' topology gpus collective sizes wall_s cpu_s \
  peak_MiB rounds cands min_speedup nccl_na worst_x_bound stop
for run in "${runs[@]}"; do
  read -r topo coll sizes <<<"$run"
  nodes=1
  [[ $topo =~ x([0-9]+)$ ]] && nodes=${BASH_REMATCH[1]}
  if ((max_gpus > 0 && nodes * 8 > max_gpus)) || ((nodes * 8 < min_gpus)); then continue; fi
  out=$work/$topo-$coll
  rc=0
  /usr/bin/time -f '%e %U %S %M' -o "$work/time" "$optiflow" synthesize --topo "$topo" --coll "$coll" \
    --sizes "$sizes" --time-budget "$budget" --out "$out" --force --json -q >"$work/result.json" 2>"$work/err" || rc=$?
  # Exit status 1 with a result: some size got no best (within a time budget); the row says how many.
  if ((rc != 0)) && ! { ((rc == 1)) && python3 -c 'import json, sys; json.load(open(sys.argv[1]))["rows"]' \
      "$work/result.json" 2>/dev/null; }; then
    echo "synthesis-bench: $topo $coll failed (exit status $rc):" >&2
    cat "$work/err" >&2
    exit 1
  fi
  read -r wall user sys rss < <(tail -n 1 "$work/time")  # a failed command adds a line before it
  python3 - "$work/result.json" "$topo" "$coll" "$wall" "$user" "$sys" "$rss" <<'EOF'
import json, sys
path, topo, coll, wall, user, sys_s, rss = sys.argv[1:]
r = json.load(open(path))
rows = r["rows"]
speedups = [x["speedup_vs_nccl"] for x in rows if x.get("speedup_vs_nccl")]
least = f"{min(speedups):.2f}x" if speedups else "n/a"
# Sizes where NCCL's choice (NVLS, CollNet) cannot be simulated: min_speedup says nothing about them.
unsimulated = sum(1 for x in rows if x.get("nccl_time_us") is None)
missing = sum(1 for x in rows if x.get("best_time_us") is None)
large = [x["ratio_to_bound"] for x in rows if x["size_bytes"] >= 256 << 20 and x.get("ratio_to_bound")]
print(f"{topo:<14} {r['ranks']:>5} {coll:<14} {len(rows):>5} {float(wall):>8.1f} {float(user) + float(sys_s):>8.1f} "
      f"{int(rss) / 1024:>8.0f} {r['rounds']:>6} {r['candidates']:>6} "
      f"{least:>11} {unsimulated:>7} {(max(large) if large else 0):>12.3f}x  "
      f"{r['stop_reason']}" + (f"; no best at {missing} size(s)" if missing else ""))
EOF
done
