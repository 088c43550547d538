#!/usr/bin/env bash
# Installs the .deb `make package` built on this machine, checks what an operator relies on, purges it and checks
# that nothing is left; inspects the .rpm with rpm -qp. Run by `make package-test` (CI), as root on Debian.
#
#   scripts/package-test.sh [BUILD_DIR]      # default build/default; packages in BUILD_DIR/packages/
#
# Checks: the version in both packages is project(VERSION); `optiflow --version`, `optiflowd --version` and
# `optiflowd --check-config` of the installed files; the plugins in the multiarch library directory; the config
# registered as a conffile; the optiflow user; NCCL_TUNER_PLUGIN=optiflow and NCCL_NET_PLUGIN=optiflow resolved from
# the system library path (no LD_LIBRARY_PATH) by tests/abi/installed_plugin_check as NCCL does it; then purge: no
# file of the package, no /etc/optiflow, /var/lib/optiflow or optiflow user, no optiflow in `ldconfig -p`.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${1:-build/default}
pkg_dir=$build_dir/packages
check_bin=$build_dir/tests/abi/installed_plugin_check
pkg=optiflow

die() {
  echo "package-test: FAIL: $*" >&2
  exit 1
}
ok() { echo "package-test: ok: $*"; }

# --- preconditions ---------------------------------------------------------------------------------------------
[ "$(id -u)" -eq 0 ] || die "must run as root (it installs and purges the .deb with apt-get/dpkg)"
for tool in dpkg dpkg-deb dpkg-query apt-get rpm ldconfig getent; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not found (scripts/install-deps.sh installs rpm; dpkg/apt: Debian only)"
done
[ -d "$pkg_dir" ] || die "$pkg_dir not found: run \`make package\` first"
shopt -s nullglob
debs=("$pkg_dir"/*.deb)
rpms=("$pkg_dir"/*.rpm)
shopt -u nullglob
[ ${#debs[@]} -eq 1 ] || die "expected one .deb in $pkg_dir, found ${#debs[@]}"
[ ${#rpms[@]} -eq 1 ] || die "expected one .rpm in $pkg_dir, found ${#rpms[@]}"
deb=$(realpath "${debs[0]}")
rpmfile=$(realpath "${rpms[0]}")
[ -x "$check_bin" ] || die "$check_bin not found: build with OPTIFLOW_BUILD_TESTS=ON"
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build_dir/CMakeCache.txt")
[ -n "$version" ] || die "no CMAKE_PROJECT_VERSION in $build_dir/CMakeCache.txt"
echo "package-test: $deb"
echo "package-test: $rpmfile"
echo "package-test: project version $version"

is_installed() {
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"
}
has_any_trace() {
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -qv "not-installed" && return 0
  [ -e /etc/optiflow ] || [ -e /var/lib/optiflow ] || getent passwd optiflow >/dev/null || getent group optiflow >/dev/null
}

# A package left over by an earlier run is purged first; anything else of ours on the machine stops the test
# (it would make the "nothing left" check meaningless).
if dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -qv "not-installed"; then
  echo "package-test: $pkg is present from an earlier run: purging it first"
  DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq "$pkg" >/dev/null
fi
if has_any_trace; then
  die "/etc/optiflow, /var/lib/optiflow or the optiflow user or group exists without the package: remove them first"
fi

# --- the .deb, before installing -------------------------------------------------------------------------------
deb_version=$(dpkg-deb -f "$deb" Version)
[ "$deb_version" = "$version" ] || die ".deb version '$deb_version' is not the project version '$version'"
depends=$(dpkg-deb -f "$deb" Depends)
echo "package-test: Depends: $depends"
echo "package-test: Recommends: $(dpkg-deb -f "$deb" Recommends)"
for dep in libc6 libstdc++6 libfmt libspdlog libcurl adduser; do
  grep -q "$dep" <<<"$depends" || die ".deb Depends lacks $dep: $depends"
done
dpkg-deb -f "$deb" Recommends | grep -q libibverbs1 || die ".deb does not recommend libibverbs1"
contents=$(dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|')
if grep -E '/include/|\.a$|\.h$|_test$|installed_plugin_check' <<<"$contents"; then
  die "the .deb holds headers, static libraries or test binaries (listed above)"
fi
ctrl=$(mktemp -d)
trap 'rm -rf "$ctrl"' EXIT
dpkg-deb -e "$deb" "$ctrl"
grep -qx /etc/optiflow/optiflowd.toml "$ctrl/conffiles" || die ".deb control has no conffiles entry for the toml"
grep -q "ldconfig" "$ctrl/triggers" || die ".deb has no ldconfig trigger"
ok ".deb $deb_version: control, Depends, contents"

# --- install ---------------------------------------------------------------------------------------------------
cleanup() {
  rm -rf "$ctrl"
  if is_installed; then
    echo "package-test: purging $pkg after the failure" >&2
    DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq "$pkg" >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT
echo "package-test: apt-get install $deb"
# Dependencies are what the build needed already; --no-install-recommends keeps it offline-friendly.
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$deb" 2>&1 \
  | sed -e '/Reading database/d' -e '/apt-utils is not installed/d' \
  || die "apt-get install of the .deb failed"
is_installed || die "$pkg is not installed after apt-get install"
files=$(dpkg -L "$pkg")

for f in /usr/bin/optiflow /usr/bin/optiflowd /etc/optiflow/optiflowd.toml /usr/lib/systemd/system/optiflowd.service \
         /usr/share/doc/optiflow/README.md /usr/share/doc/optiflow/docs/config.md; do
  grep -qx "$f" <<<"$files" || die "dpkg -L $pkg lacks $f"
  [ -f "$f" ] || die "$f is listed but not on disk"
done
tuner_lib=$(grep -E '/libnccl-tuner-optiflow\.so$' <<<"$files" || true)
net_lib=$(grep -E '/libnccl-net-optiflow\.so$' <<<"$files" || true)
{ [ -n "$tuner_lib" ] && [ -n "$net_lib" ]; } || die "dpkg -L $pkg lacks the plugin libraries"
libdir=$(dirname "$tuner_lib")
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
[ "$libdir" = "/usr/lib/$multiarch" ] || die "plugins in $libdir, expected /usr/lib/$multiarch"
ok "dpkg -L: binaries, plugins in $libdir, config, systemd unit, docs"

conffiles=$(dpkg-query -W -f='${Conffiles}' "$pkg")
grep -q "/etc/optiflow/optiflowd.toml" <<<"$conffiles" || die "the toml is not a registered conffile: '$conffiles'"
ok "conffile registered:$(tr '\n' ' ' <<<"$conffiles")"

out=$(/usr/bin/optiflow --version) || die "optiflow --version failed"
grep -qF "$version" <<<"$out" || die "optiflow --version printed '$out', not $version"
ok "optiflow --version: $out"
out=$(/usr/bin/optiflowd --version) || die "optiflowd --version failed"
grep -qF "$version" <<<"$out" || die "optiflowd --version printed '$out', not $version"
ok "optiflowd --version: $out"
out=$(/usr/bin/optiflowd --config /etc/optiflow/optiflowd.toml --check-config 2>&1) \
  || die "optiflowd --check-config of the installed config failed: $out"
ok "optiflowd --check-config: $out"

getent passwd optiflow >/dev/null || die "the optiflow system user was not created"
ok "user: $(getent passwd optiflow)"
ldconfig -p | grep -q "libnccl-tuner-optiflow.so" || die "ldconfig -p does not list libnccl-tuner-optiflow.so"
ok "ldconfig -p lists the plugins"
if command -v systemd-analyze >/dev/null 2>&1; then
  # Offline check of the unit's syntax; warnings about the missing systemd runtime are not errors here.
  if ! out=$(systemd-analyze verify /usr/lib/systemd/system/optiflowd.service 2>&1); then
    die "systemd-analyze verify optiflowd.service: $out"
  fi
  ok "systemd-analyze verify optiflowd.service${out:+ ($out)}"
fi

# The plugin as NCCL finds it: the built checker, the installed library, nothing from the build tree.
echo "package-test: NCCL_TUNER_PLUGIN=optiflow $check_bin (no LD_LIBRARY_PATH)"
env -u LD_LIBRARY_PATH NCCL_TUNER_PLUGIN=optiflow "$check_bin" --kind tuner --expect-dir "$libdir" \
  || die "NCCL_TUNER_PLUGIN=optiflow did not resolve to $tuner_lib"
echo "package-test: NCCL_NET_PLUGIN=optiflow $check_bin --kind net (no LD_LIBRARY_PATH)"
env -u LD_LIBRARY_PATH NCCL_NET_PLUGIN=optiflow "$check_bin" --kind net --expect-dir "$libdir" \
  || die "NCCL_NET_PLUGIN=optiflow did not resolve to $net_lib"
ok "both plugins resolve from the system library path"

# --- purge -----------------------------------------------------------------------------------------------------
echo "package-test: apt-get purge $pkg"
DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq "$pkg" >/dev/null || die "apt-get purge failed"
if dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -qv "not-installed"; then
  die "$pkg still known to dpkg after purge: $(dpkg-query -W -f='${Status}' "$pkg")"
fi
left=()
while IFS= read -r f; do
  # Directories shared with the system (/usr, /usr/bin, ...) stay; every file and our own directories go.
  if [ -e "$f" ] && { [ ! -d "$f" ] || [[ "$f" == */optiflow ]] || [[ "$f" == */optiflow/* ]]; }; then
    left+=("$f")
  fi
done <<<"$files"
[ ${#left[@]} -eq 0 ] || die "left after purge: ${left[*]}"
[ ! -e /etc/optiflow ] || die "/etc/optiflow left after purge: $(ls -A /etc/optiflow)"
[ ! -e /var/lib/optiflow ] || die "/var/lib/optiflow left after purge"
! getent passwd optiflow >/dev/null || die "the optiflow user is left after purge"
! getent group optiflow >/dev/null || die "the optiflow group is left after purge"
if ldconfig -p | grep -q optiflow; then
  die "ldconfig -p still lists optiflow after purge: $(ldconfig -p | grep optiflow)"
fi
ok "purged: no file, directory, user or ld.so cache entry left"

# --- the .rpm (inspected only) ---------------------------------------------------------------------------------
rpmq() { rpm -qp --nosignature "$@" "$rpmfile" 2>/dev/null; }
rpm_version=$(rpmq --qf '%{VERSION}')
[ "$rpm_version" = "$version" ] || die ".rpm version '$rpm_version' is not the project version '$version'"
rpm_files=$(rpmq -l)
echo "package-test: rpm -qlp:"
sed 's/^/  /' <<<"$rpm_files"
for f in /usr/bin/optiflow /usr/bin/optiflowd /usr/lib64/libnccl-tuner-optiflow.so /usr/lib64/libnccl-net-optiflow.so \
         /etc/optiflow/optiflowd.toml /usr/lib/systemd/system/optiflowd.service /usr/share/doc/optiflow/README.md; do
  grep -qx "$f" <<<"$rpm_files" || die "rpm -qlp lacks $f"
done
if grep -E '/include/|\.a$|\.h$|_test$|^/usr/lib/systemd/system$|^/usr/lib64$' <<<"$rpm_files"; then
  die "the .rpm holds headers, static libraries, test binaries or system directories (listed above)"
fi
requires=$(rpmq --requires)
echo "package-test: rpm -qp --requires (symbol versions left out):"
grep -v -E '\((GLIBC|GLIBCXX|CXXABI|GCC|CURL)_' <<<"$requires" | sed 's/^/  /'
for dep in 'libc.so.6' 'libstdc++.so.6' 'libfmt.so' 'libspdlog.so' 'libcurl.so' 'shadow-utils'; do
  grep -qF "$dep" <<<"$requires" || die ".rpm Requires lacks $dep"
done
configfiles=$(rpmq --configfiles)
grep -qx /etc/optiflow/optiflowd.toml <<<"$configfiles" || die "rpm -qp --configfiles lacks the toml: '$configfiles'"
rpmq --qf '[%{FILEFLAGS:fflags} %{FILENAMES}\n]' | grep -q '^cn /etc/optiflow/optiflowd.toml$' \
  || die "the toml is not %config(noreplace) in the .rpm"
scripts=$(rpmq --scripts)
grep -q '/sbin/ldconfig' <<<"$scripts" || die "the .rpm scriptlets do not run /sbin/ldconfig"
ok ".rpm $rpm_version: files, Requires, %config(noreplace) toml, ldconfig scriptlets"

echo "package-test: PASS"
