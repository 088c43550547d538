#!/usr/bin/env bash
# The tables of docs/calibration.md ("Calibrating on your cluster"): `optiflow calibrate` on the nccl-tests logs of
# real clusters, each fit checked on its own rows (in sample) and on the other node counts of the same cluster.
# Usage: scripts/calibration-table.sh BUILD_DIR LOGS_DIR   (make calibration-table LOGS=DIR)
# LOGS_DIR holds the published logs as all_reduce_perf printed them: abci-a100x{1,2,4,16}-allreduce.log (ABCI 2.0
# A-nodes, aistabci/abci2.0benchmark), p4de-a100x2-allreduce.log (aws-samples/awsome-distributed-training) and
# dgx-h100x1-allreduce.log (NVIDIA/dgxc-benchmarking).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/default}
logs=${2:-}
bin="$build/cli/optiflow"
[[ -x "$bin" ]] || { echo "calibration-table: $bin not built (make build)" >&2; exit 2; }
[[ -n "$logs" && -d "$logs" ]] || { echo "calibration-table: give the folder of the logs (LOGS=DIR): '$logs' is not one" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# examples/topologies/abci-a100x4.toml at N nodes.
abci() {
  sed -e "s/^nodes = 4/nodes = $1/" -e "s/abci-a100x4/abci-a100x$1/" examples/topologies/abci-a100x4.toml \
    >"$tmp/abci-a100x$1.toml"
  echo "$tmp/abci-a100x$1.toml"
}

# One summary line of calibrate's output -> "before -> after | >=16MiB before -> after".
cells() {
  awk -v model="$1" '
    index($0, model) == 1 {
      all = "-"; large = "-"
      if (match($0, /median error [0-9.]+% -> [0-9.]+%/)) { s = substr($0, RSTART + 13, RLENGTH - 13); all = s }
      if (match($0, /from 16MiB: [0-9.]+% -> [0-9.]+%/)) { s = substr($0, RSTART + 12, RLENGTH - 12); large = s }
      printf "%s | %s", all, large
    }'
}

row() {  # fitted-on label, checked-on label, calibrate output
  local out=$3 rows believe
  rows=$(sed -n 's/.* against \([0-9]*\) row(s).*/\1/p' <<<"$out" | head -1)
  believe=$(sed -n 's/.*reports believe the \(.*\) (lower.*/\1/p' <<<"$out" | head -1)
  printf '| %s | %s | %s | %s | %s | %s |\n' "$1" "$2" "$rows" "$(cells simulator: <<<"$out")" \
    "$(cells 'NCCL model:' <<<"$out")" "$believe"
}

echo "| fitted on | checked on | rows | simulator: median error before -> after | from 16 MiB | NCCL model: before -> after | from 16 MiB | believed |"
echo "|---|---|---|---|---|---|---|---|"
# ABCI: fitted on four nodes, checked on four (in sample) and on one, two and sixteen.
x4=$(abci 4)
out=$("$bin" calibrate "$logs/abci-a100x4-allreduce.log" --topo "$x4" -o "$tmp/abci4.toml")
row "ABCI x4" "ABCI x4 (in sample)" "$out"
for n in 1 2 16; do
  out=$("$bin" calibrate "$logs/abci-a100x$n-allreduce.log" --topo "$(abci "$n")" --calibration "$tmp/abci4.toml")
  row "ABCI x4" "ABCI x$n" "$out"
done
# Two node counts fitted together, checked on sixteen.
x2=$(abci 2)
out=$("$bin" calibrate "$logs/abci-a100x2-allreduce.log" "$logs/abci-a100x4-allreduce.log" --topo "$x2" --topo "$x4" \
  -o "$tmp/abci24.toml")
row "ABCI x2 + x4" "ABCI x2 + x4 (in sample)" "$out"
out=$("$bin" calibrate "$logs/abci-a100x16-allreduce.log" --topo "$(abci 16)" --calibration "$tmp/abci24.toml")
row "ABCI x2 + x4" "ABCI x16" "$out"
# The clusters with one log: in sample only.
out=$("$bin" calibrate "$logs/p4de-a100x2-allreduce.log" --topo examples/topologies/p4de-a100x2.toml)
row "p4de x2" "p4de x2 (in sample)" "$out"
out=$("$bin" calibrate "$logs/dgx-h100x1-allreduce.log" --topo dgx-h100x1)
row "DGX H100 x1" "DGX H100 x1 (in sample)" "$out"
