#!/usr/bin/env bash
# Offline checks of the Kubernetes manifests (packaging/kubernetes) and the container file (make k8s-check; CI):
#   - base/optiflowd.toml is daemon/etc/optiflowd.toml with only the pod's settings changed (no drift);
#   - every overlay renders with `kubectl kustomize`;
#   - yamllint passes on the sources and on every rendered overlay;
#   - every rendered object validates against the Kubernetes schemas (kubernetes-models, from npm) and the
#     deployment's invariants hold (validate/validate.mjs: native sidecar, /dev/shm in memory in both containers,
#     probes on /healthz, non-root, plugin delivery, image tag = project version);
#   - negative tests: broken objects must be rejected, so the check can fail;
#   - the container file's runtime packages exist in Debian's index (when apt lists are present).
# Needs kubectl, node + npm, yamllint; network access to the npm registry the first time only (build/k8s-check).
set -euo pipefail
cd "$(dirname "$0")/.."

K8S=packaging/kubernetes
WORK=build/k8s-check
CONTAINERFILE=packaging/container/Containerfile

die() {
  echo "k8s-check: error: $*" >&2
  exit 1
}
step() { echo "-- $*"; }

need() {
  command -v "$1" >/dev/null 2>&1 || die "$1 not found: $2"
}
need kubectl "install kubectl (https://kubernetes.io/docs/tasks/tools/), 1.27 or newer for kustomize v5"
need node "install Node.js 18 or newer (e.g. apt-get install nodejs npm)"
need npm "install npm (e.g. apt-get install npm)"
need yamllint "run scripts/install-deps.sh (apt-get install yamllint)"

version=$(sed -n 's/^project(optiflow VERSION \([0-9][0-9.]*\).*/\1/p' CMakeLists.txt)
[ -n "$version" ] || die "cannot read the version from project(optiflow VERSION ...) in CMakeLists.txt"
params=$(grep -o '{"OPTIFLOW_[A-Z0-9_]*"' plugin/include/optiflow/plugin/params.h | tr -d '{"' | paste -sd, -)
[ -n "$params" ] || die "cannot read the OPTIFLOW_* variables from plugin/include/optiflow/plugin/params.h"

mkdir -p "$WORK/rendered"
build_dir=${OPTIFLOW_BUILD_DIR:-build/default}  # a build, when there is one, for the checks that need binaries

step "config drift: $K8S/base/optiflowd.toml vs daemon/etc/optiflowd.toml"
# The pod's copy differs in exactly these lines: [metrics] address (the kubelet probes the pod IP) and [cache] group
# (the image's group, the pod's fsGroup). Anything else must be changed in both files.
expected="$WORK/optiflowd.pod.expected.toml"
sed -e 's|^group = ""$|group = "optiflow"          # pod: the image'"'"'s group 65532 = the pod'"'"'s fsGroup: the training container reads it|' \
  -e 's|^address = "127.0.0.1"       # /metrics and /healthz$|address = "0.0.0.0"         # pod: the kubelet probes /healthz on the pod IP|' \
  daemon/etc/optiflowd.toml >"$expected"
if ! diff -u "$expected" "$K8S/base/optiflowd.toml"; then
  die "$K8S/base/optiflowd.toml drifted from daemon/etc/optiflowd.toml (above: - expected, + found). Apply the change \
to both files; only [metrics] address and [cache] group may differ (this script's sed says how)."
fi

if [ -x "$build_dir/daemon/optiflowd" ]; then
  "$build_dir/daemon/optiflowd" --config "$K8S/base/optiflowd.toml" --check-config ||
    die "$K8S/base/optiflowd.toml: optiflowd --check-config failed"
else
  echo "   no $build_dir/daemon/optiflowd: the pod's config is not checked with optiflowd --check-config"
fi

step "npm ci (kubernetes-models, js-yaml) into $WORK"
if ! cmp -s "$K8S/validate/package-lock.json" "$WORK/package-lock.json" || [ ! -d "$WORK/node_modules" ]; then
  rm -rf "$WORK/node_modules"
  cp "$K8S/validate/package.json" "$K8S/validate/package-lock.json" "$WORK/"
  npm ci --prefix "$WORK" --no-audit --no-fund --loglevel=error >"$WORK/npm.log" 2>&1 ||
    { cat "$WORK/npm.log" >&2; die "npm ci failed (network access to the npm registry?)"; }
fi

validate() { # overlay file
  node "$K8S/validate/validate.mjs" --modules "$WORK" --overlay "$1" --version "$version" --params "$params" "$2"
}

step "yamllint $K8S"
yamllint -s -c "$K8S/.yamllint" "$K8S" || die "yamllint found problems in $K8S"

# The rendered ConfigMap carries optiflowd.toml verbatim, 4 columns deeper than in the file (whose lines are <= 122).
rendered_lint="{extends: $K8S/.yamllint, rules: {line-length: {max: 130}}}"
overlays=()
for dir in "$K8S"/overlays/*/; do
  overlays+=("$(basename "$dir")")
done
[ ${#overlays[@]} -gt 0 ] || die "no overlays under $K8S/overlays"
for overlay in "${overlays[@]}"; do
  out="$WORK/rendered/$overlay.yaml"
  step "overlay $overlay: kubectl kustomize, yamllint, schemas and invariants"
  kubectl kustomize "$K8S/overlays/$overlay" >"$out" || die "kubectl kustomize $K8S/overlays/$overlay failed"
  yamllint -s -d "$rendered_lint" "$out" || die "yamllint found problems in the rendered overlay $overlay ($out)"
  validate "$overlay" "$out" || die "overlay $overlay: the rendered objects are not valid (above)"
done

step "negative tests: broken objects must be rejected"
expect_rejected() { # name overlay file expected-text
  local log="$WORK/negative-$1.log"
  if validate "$2" "$3" >"$log" 2>&1; then
    die "negative test '$1': validate.mjs accepted a broken object ($3)"
  fi
  grep -qF -- "$4" "$log" || { cat "$log" >&2; die "negative test '$1': rejected, but without '$4'"; }
  echo "   $1: rejected as expected"
}
base="$WORK/rendered/sidecar.yaml"
neg="$WORK/negative"
mkdir -p "$neg"
sed 's/containerPort: 9464/containerPort: "ninety"/' "$base" >"$neg/schema.yaml"
expect_rejected schema sidecar "$neg/schema.yaml" "containerPort must be integer"
sed '/restartPolicy: Always/d' "$base" >"$neg/no-sidecar.yaml"
expect_rejected not-a-native-sidecar sidecar "$neg/no-sidecar.yaml" "optiflowd: restartPolicy is not Always"
sed '/medium: Memory/d' "$base" >"$neg/shm-on-disk.yaml"
expect_rejected shm-not-in-memory sidecar "$neg/shm-on-disk.yaml" "not emptyDir medium Memory"
sed 's|path: /healthz|path: /metrics|' "$base" >"$neg/probe.yaml"
expect_rejected probe-path sidecar "$neg/probe.yaml" "path is not /healthz"
sed 's/runAsNonRoot: true/runAsNonRoot: false/' "$base" >"$neg/root.yaml"
expect_rejected root sidecar "$neg/root.yaml" "runAsNonRoot is not true"
{ cat "$base"; printf -- '---\napiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\n'; } >"$neg/unknown-kind.yaml"
expect_rejected unknown-kind sidecar "$neg/unknown-kind.yaml" "unknown apiVersion/kind example.com/v1/Widget"

step "container file: $CONTAINERFILE"
[ -f "$CONTAINERFILE" ] || die "$CONTAINERFILE is missing"
grep -q '^USER 65532' "$CONTAINERFILE" || die "$CONTAINERFILE: no USER 65532 (the manifests' runAsUser)"
grep -q '^EXPOSE 9464' "$CONTAINERFILE" || die "$CONTAINERFILE: no EXPOSE 9464 ([metrics] port)"
runtime_pkgs=$(sed -n 's/^ARG RUNTIME_PACKAGES="\(.*\)"$/\1/p' "$CONTAINERFILE")
[ -n "$runtime_pkgs" ] || die "$CONTAINERFILE: no ARG RUNTIME_PACKAGES=\"...\" line"
# The libraries the binaries link must come from those packages or the base image (libc6, libgcc-s1, libstdc++6).
if [ -x "$build_dir/daemon/optiflowd" ] && [ -x "$build_dir/cli/optiflow" ] && command -v objdump >/dev/null; then
  for lib in $(objdump -p "$build_dir/daemon/optiflowd" "$build_dir/cli/optiflow" | awk '/NEEDED/ {print $2}' | sort -u); do
    case "$lib" in ld-linux*) continue ;; esac
    pkg=$(dpkg -S "/$lib" 2>/dev/null | grep -v -- '-dev:\|i386\|lib32\|libx32' | head -n 1 | cut -d: -f1) || true
    [ -n "$pkg" ] || pkg=$(dpkg -S "$lib" 2>/dev/null | grep -v -- '-dev:\|gdb\|i386\|lib32\|libx32' | head -n 1 | cut -d: -f1) || true
    [ -n "$pkg" ] || die "no Debian package provides $lib (linked by $build_dir's binaries)"
    case " $runtime_pkgs libc6 libgcc-s1 libstdc++6 " in
      *" $pkg "*) ;;
      *) die "$CONTAINERFILE: RUNTIME_PACKAGES lacks $pkg ($lib, linked by $build_dir/daemon/optiflowd or cli/optiflow)" ;;
    esac
  done
  echo "   every library $build_dir's optiflowd and optiflow link is in RUNTIME_PACKAGES or the base image"
else
  echo "   no build in $build_dir: the runtime packages are not checked against the binaries' libraries"
fi
if compgen -G "/var/lib/apt/lists/*_Packages*" >/dev/null; then
  for p in $runtime_pkgs; do
    apt-cache show "$p" >/dev/null 2>&1 || die "$CONTAINERFILE: runtime package $p is not in the apt index"
  done
  echo "   runtime packages found in the apt index: $runtime_pkgs"
else
  echo "   apt lists absent: the runtime package names are not checked"
fi
if command -v hadolint >/dev/null 2>&1; then
  hadolint "$CONTAINERFILE" || die "hadolint found problems in $CONTAINERFILE"
else
  echo "   hadolint not installed: not linted (no container runtime here either: the image is not built)"
fi

echo "k8s-check: ok (${overlays[*]}; version $version)"
