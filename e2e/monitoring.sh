#!/usr/bin/env bash
# e2e/monitoring.sh — Prometheus and promtool from Debian's archive, without root or Docker.
#
# Usage:
#   e2e/monitoring.sh bin        print the directory holding `prometheus` and `promtool`
#                                (fetches them on first use; later calls return at once)
#   e2e/monitoring.sh version    print the versions of both binaries
#
# Where the binaries come from, first match wins:
#   1. `prometheus` and `promtool` already on PATH (e.g. Debian's `prometheus` package installed
#      with apt): they are used as they are, nothing is fetched;
#   2. the cache ${LONGTAIL_CACHE_DIR:-~/.cache/longtail}/prometheus/<version>/bin;
#   3. otherwise Debian bookworm's `prometheus` package (version below) is fetched with
#      `apt-get download` through a private APT_CONFIG (its own sources list, lists and cache
#      under the cache dir; /etc/apt is never touched and root is not needed), checked against
#      the SHA256 apt verified, and unpacked with `dpkg-deb -x`. Only the two static binaries
#      are kept (about 110 MB with the apt lists); they need nothing but libc.
#
# Nothing is started: tests start their own Prometheus on loopback ports and stop it.
#
# Environment:
#   LONGTAIL_CACHE_DIR            cache root (default ~/.cache/longtail)
#   LONGTAIL_PROMETHEUS_DEB       Debian version to fetch (default below)
#   LONGTAIL_DEB_MIRROR           Debian mirror (default http://deb.debian.org/debian)
#   LONGTAIL_DEB_SECURITY_MIRROR  security mirror (default http://deb.debian.org/debian-security)
#   LONGTAIL_PROMETHEUS_USE_PATH  0 = ignore binaries on PATH and use the cached Debian build
set -euo pipefail

DEB_PACKAGE="prometheus"
DEB_VERSION="${LONGTAIL_PROMETHEUS_DEB:-2.42.0+ds-5+deb12u1}"
DEB_MIRROR="${LONGTAIL_DEB_MIRROR:-http://deb.debian.org/debian}"
DEB_SECURITY_MIRROR="${LONGTAIL_DEB_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
CACHE_ROOT="${LONGTAIL_CACHE_DIR:-$HOME/.cache/longtail}"
PROM_CACHE="$CACHE_ROOT/prometheus/$DEB_VERSION"
BIN_DIR="$PROM_CACHE/bin"
BINARIES=(prometheus promtool)

log() { printf '[monitoring %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { printf '[monitoring] ERROR: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2; }

on_path() {
  [[ "${LONGTAIL_PROMETHEUS_USE_PATH:-1}" == 1 ]] || return 1
  local b
  for b in "${BINARIES[@]}"; do command -v "$b" >/dev/null || return 1; done
  dirname "$(command -v promtool)"
}

cached() {
  local b
  for b in "${BINARIES[@]}"; do [[ -x "$BIN_DIR/$b" ]] || return 1; done
  [[ -f "$BIN_DIR/.complete" ]]
}

# Private apt configuration (binary packages only); the system's apt state is never modified.
private_apt_config() {
  local d="$CACHE_ROOT/prometheus/apt"
  mkdir -p "$d/sources.list.d" "$d/lists/partial" "$d/cache/archives/partial"
  cat >"$d/sources.list" <<EOF
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $DEB_MIRROR bookworm main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $DEB_MIRROR bookworm-updates main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $DEB_SECURITY_MIRROR bookworm-security main
EOF
  cat >"$d/apt.conf" <<EOF
Dir::Etc::sourcelist "$d/sources.list";
Dir::Etc::sourceparts "$d/sources.list.d";
Dir::State::lists "$d/lists";
Dir::State::status "/dev/null";
Dir::Cache "$d/cache";
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
APT::Sandbox::User "$(id -un)";
EOF
  echo "$d/apt.conf"
}

fetch() {
  command -v apt-get >/dev/null || die "apt-get not found: install Prometheus 2.x (prometheus, promtool) on PATH by other means"
  command -v dpkg-deb >/dev/null || die "dpkg-deb not found: cannot unpack the prometheus package"
  local conf dl deb
  conf="$(private_apt_config)"
  dl="$PROM_CACHE/download"
  mkdir -p "$dl"
  log "fetching $DEB_PACKAGE=$DEB_VERSION from Debian's archive (private APT_CONFIG $conf)"
  APT_CONFIG="$conf" apt-get update -qq \
    || die "apt-get update (private config) failed: is $DEB_MIRROR reachable?"
  # apt-get download checks the package against the signed Release file's SHA256.
  (cd "$dl" && APT_CONFIG="$conf" apt-get download -qq "$DEB_PACKAGE=$DEB_VERSION") \
    || die "apt-get download $DEB_PACKAGE=$DEB_VERSION failed: archive unreachable, or the version is gone (set LONGTAIL_PROMETHEUS_DEB)"
  deb="$(compgen -G "$dl/${DEB_PACKAGE}_*.deb" | head -n1)"
  [[ -n "$deb" ]] || die "apt-get download left no .deb in $dl"
  rm -rf "$PROM_CACHE/extract" "$BIN_DIR"
  dpkg-deb -x "$deb" "$PROM_CACHE/extract"
  mkdir -p "$BIN_DIR"
  local b
  for b in "${BINARIES[@]}"; do
    install -m 0755 "$PROM_CACHE/extract/usr/bin/$b" "$BIN_DIR/$b"
  done
  rm -rf "$PROM_CACHE/extract" "$dl"
  "$BIN_DIR/promtool" --version >/dev/null || die "the unpacked promtool does not run"
  echo "$DEB_PACKAGE $DEB_VERSION" >"$BIN_DIR/.complete"
  log "installed prometheus and promtool into $BIN_DIR"
}

bin_dir() {
  local dir
  if dir="$(on_path)"; then
    echo "$dir"
    return
  fi
  if ! cached; then
    mkdir -p "$CACHE_ROOT/prometheus"
    # Two test sessions may ask at once: the second waits and reuses the first one's result.
    exec 9>"$CACHE_ROOT/prometheus/.lock"
    flock -w 600 9 || die "timed out waiting for another fetch (lock $CACHE_ROOT/prometheus/.lock)"
    cached || fetch
  fi
  echo "$BIN_DIR"
}

case "${1:-}" in
  bin) bin_dir ;;
  version)
    dir="$(bin_dir)"
    "$dir/prometheus" --version 2>&1 | head -n1
    "$dir/promtool" --version 2>&1 | head -n1
    ;;
  -h | --help | help) usage ;;
  *) usage; exit 2 ;;
esac
