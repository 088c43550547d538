#!/usr/bin/env bash
# Installs the Debian packages OptiFlow builds and tests with. Idempotent: does nothing when all are present.
# CUDA/NCCL under /usr/local/cuda are optional and never installed here.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libtomlplusplus-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libboost-dev libcurl4-openssl-dev libpugixml-dev libibverbs-dev libcpp-httplib-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev clang-format
  rpm dpkg-dev
  yamllint
  time python3  # make bench (scripts/synthesis-bench.sh)
  kubectl nodejs  # make k8s-check (nodejs ships npm on these machines)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
