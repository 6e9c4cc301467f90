#!/usr/bin/env bash
# e2e/controlplane.sh — a real Kubernetes v1.20.2 control plane on loopback, without Docker.
#
# Usage:
#   e2e/controlplane.sh build        build (or reuse cached) kube-apiserver, kube-controller-manager,
#                                    kube-scheduler and kubectl from Debian bookworm's source package
#   e2e/controlplane.sh up DIR       start etcd + kube-apiserver + kube-controller-manager +
#                                    kube-scheduler on 127.0.0.1; state, logs, pids and kubeconfigs
#                                    go to DIR; prints the API URL on stdout when ready
#   e2e/controlplane.sh down DIR     stop everything `up DIR` started (idempotent)
#   e2e/controlplane.sh status DIR   show which components run; exit 0 only if all do
#   e2e/controlplane.sh stop-apiserver DIR
#                                    stop only the kube-apiserver of `up DIR` (an API outage:
#                                    etcd, controller-manager and scheduler keep running)
#   e2e/controlplane.sh start-apiserver DIR
#                                    start it again with the flags and port of `up DIR`; returns
#                                    when its /readyz answers ok (no-op if it runs and is ready)
#   e2e/controlplane.sh bin          print the directory holding the cached binaries
#
# After `up DIR`:
#   DIR/admin.kubeconfig     user "longtail-admin" in group system:masters (current context set)
#   DIR/operator.kubeconfig  user "longtail-operator", in no privileged group: has only what RBAC
#                            grants it (nothing, until a test binds a Role/ClusterRole)
#   DIR/env                  shell-sourceable: API_URL, ports, KUBECTL, kubeconfig paths
#   DIR/logs/*.log           one log per component; DIR/pids/*.pid one pid file per component
#
# Environment:
#   LONGTAIL_CACHE_DIR      cache root (default ~/.cache/longtail); binaries land in
#                           $LONGTAIL_CACHE_DIR/kube/v1.20.2/bin, build scratch beside them
#   LONGTAIL_KEEP_KUBE_SRC  1 = keep the extracted source tree and Go build cache after a build
#                           (about 2.2 GB; makes a forced rebuild faster). Default: delete them.
#   LONGTAIL_BUILD_JOBS     go build -p value (default 2, so a shared machine stays usable)
#   LONGTAIL_UP_TIMEOUT     seconds `up` waits for readiness before failing (default 120)
#
# Why a source build: no registry reachable here ships kube-apiserver, envtest assets or k3s, and
# kind/minikube need Docker. Debian's `kubernetes` source package is the upstream v1.20.2 tree with
# its vendored dependencies; three fixes make it build and behave with Debian's Go 1.19:
# generate pkg/generated/openapi with `make gen_openapi`; replace the vendored
# github.com/modern-go/reflect2 v1.0.1 (crashes under Go >= 1.18) with Debian's 1.0.2; and patch
# the OpenAPI validators' null check, which under Go >= 1.19 takes "" for null (see
# prepare_tree and e2e/README.md). The system's apt sources are never modified: the source
# package is fetched through a private APT_CONFIG.
set -euo pipefail

KUBE_VERSION="v1.20.2"
# Bump when the build recipe (patches, flags) changes: cached binaries of another recipe are rebuilt.
BUILD_RECIPE=2
DEB_SRC_PACKAGE="kubernetes"
DEB_SRC_VERSION="${LONGTAIL_KUBE_DEB_VERSION:-1.20.5+really1.20.2-1.1+deb12u1}"
DEB_MIRROR="${LONGTAIL_DEB_MIRROR:-http://deb.debian.org/debian}"
DEB_SECURITY_MIRROR="${LONGTAIL_DEB_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
BUILD_DEPS=(golang-go etcd-server golang-github-modern-go-reflect2-dev rsync make dpkg-dev openssl curl)
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl)

CACHE_ROOT="${LONGTAIL_CACHE_DIR:-$HOME/.cache/longtail}"
KUBE_CACHE="$CACHE_ROOT/kube/$KUBE_VERSION"
BIN_DIR="$KUBE_CACHE/bin"
SCRATCH="$KUBE_CACHE/build"
JOBS="${LONGTAIL_BUILD_JOBS:-2}"
UP_TIMEOUT="${LONGTAIL_UP_TIMEOUT:-120}"

log() { printf '[controlplane %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { printf '[controlplane] ERROR: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2; }

# ----------------------------------------------------------------------------------------------
# build
# ----------------------------------------------------------------------------------------------

binaries_cached() {
  local b
  for b in "${BINARIES[@]}"; do [[ -x "$BIN_DIR/$b" ]] || return 1; done
  grep -q "^recipe $BUILD_RECIPE\$" "$BIN_DIR/.complete" 2>/dev/null
}

ensure_build_deps() {
  local missing=() p
  for p in "${BUILD_DEPS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then
    log "build dependencies present"
    return
  fi
  [[ $EUID -eq 0 ]] || die "missing Debian packages: ${missing[*]} (run as root, or apt-get install them)"
  log "installing Debian packages: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq \
    || die "apt-get update failed: Debian's archive is unreachable, cannot install ${missing[*]}"
  # etcd-server's maintainer scripts may try to start a system etcd; policy-rc.d is not ours to
  # touch, and we never use a system etcd (we start our own on free ports), so that is harmless.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 \
    || die "apt-get install ${missing[*]} failed"
}

# Private apt configuration: its own sources list (with deb-src), lists and cache directories.
# Only Debian's archive is contacted; /etc/apt is never modified.
private_apt_config() {
  local d="$SCRATCH/apt"
  mkdir -p "$d/sources.list.d" "$d/lists/partial" "$d/cache/archives/partial"
  cat >"$d/sources.list" <<EOF
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $DEB_MIRROR bookworm main
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $DEB_MIRROR bookworm-updates main
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $DEB_SECURITY_MIRROR bookworm-security main
EOF
  cat >"$d/apt.conf" <<EOF
Dir::Etc::sourcelist "$d/sources.list";
Dir::Etc::sourceparts "$d/sources.list.d";
Dir::State::lists "$d/lists";
Dir::Cache "$d/cache";
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
APT::Sandbox::User "root";
EOF
  echo "$d/apt.conf"
}

fetch_source() {
  local dl="$SCRATCH/download" tree="$SCRATCH/gopath/src/k8s.io/kubernetes"
  if grep -q "^recipe $BUILD_RECIPE\$" "$tree/.longtail-prepared" 2>/dev/null; then
    log "source tree already prepared at $tree"
    return
  fi
  mkdir -p "$dl"
  if ! compgen -G "$dl/${DEB_SRC_PACKAGE}_*.dsc" >/dev/null; then
    local conf
    conf="$(private_apt_config)"
    log "fetching source package $DEB_SRC_PACKAGE=$DEB_SRC_VERSION (private APT_CONFIG $conf)"
    APT_CONFIG="$conf" apt-get update -qq \
      || die "apt-get update (deb-src, private config) failed: is $DEB_MIRROR reachable?"
    (cd "$dl" && APT_CONFIG="$conf" apt-get source -qq --download-only \
      "$DEB_SRC_PACKAGE=$DEB_SRC_VERSION") \
      || die "apt-get source $DEB_SRC_PACKAGE=$DEB_SRC_VERSION failed: Debian's archive ($DEB_MIRROR) unreachable (see apt's warnings above), or the version is gone (set LONGTAIL_KUBE_DEB_VERSION)"
  else
    log "source package already downloaded in $dl"
  fi
  local dscs=("$dl/${DEB_SRC_PACKAGE}_"*.dsc) dsc
  dsc="${dscs[0]}"
  rm -rf "$SCRATCH/extract" "$tree"
  mkdir -p "$SCRATCH/extract" "$(dirname "$tree")"
  log "extracting $(basename "$dsc") (applies Debian's patches)"
  dpkg-source --no-check -x "$dsc" "$SCRATCH/extract/src" >/dev/null
  mv "$SCRATCH/extract/src" "$tree"
  rm -rf "$SCRATCH/extract"   # dpkg-source leaves a copy of the orig tarball there
  prepare_tree "$tree"
  echo "recipe $BUILD_RECIPE" >"$tree/.longtail-prepared"
}

prepare_tree() {
  local tree="$1" v="$1/vendor/github.com/modern-go/reflect2"
  local deb=/usr/share/gocode/src/github.com/modern-go/reflect2
  # Fix 1: reflect2 v1.0.1 faults under Go >= 1.18 ("fatal error: fault" on the first
  # custom-resource write). Debian's 1.0.2 is API-compatible.
  [[ -d "$v" ]] || die "vendored reflect2 not found at $v: unexpected source tree layout"
  [[ -d "$deb" ]] || die "$deb missing: install golang-github-modern-go-reflect2-dev"
  log "replacing vendored modern-go/reflect2 (v1.0.1) with Debian's $(dpkg-query -W -f='${Version}' golang-github-modern-go-reflect2-dev)"
  find "$v" -maxdepth 1 -type f \( -name '*.go' -o -name '*.s' \) -delete
  find "$deb" -maxdepth 1 -type f \( -name '*.go' -o -name '*.s' \) ! -name '*_test.go' \
    -exec cp -L {} "$v/" \;

  # Fix 2: the OpenAPI type validator decides "value is null" with
  #   reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data)), reflect.ValueOf(data))
  # which compares reflect.Value internals. Built with Go >= 1.19 both sides of that comparison
  # point at the runtime's shared zero buffer for an empty string, so "" is treated as null:
  # every `default: ""` in a CRD, and every "" value in a non-nullable string field of a custom
  # resource, is rejected ("in body must be of type string: "null""). Built with the Go 1.15
  # upstream used, only nil maps/pointers/chans/funcs matched; restore exactly that.
  local f
  for f in vendor/k8s.io/kube-openapi/pkg/validation/validate/type.go \
    vendor/github.com/go-openapi/validate/type.go; do
    [[ -f "$tree/$f" ]] || die "$f not found: unexpected source tree layout"
    perl -0pi -e 's/if data == nil \|\| reflect\.DeepEqual\(reflect\.Zero\(reflect\.TypeOf\(data\)\), reflect\.ValueOf\(data\)\) \{/if data == nil || longtailIsNilRef(data) {/' "$tree/$f"
    grep -q 'longtailIsNilRef(data)' "$tree/$f" || die "could not patch the null check in $f"
    cat >>"$tree/$f" <<'GOEOF'

// longtailIsNilRef is a build patch from Longtail's e2e/controlplane.sh: true for nil maps,
// pointers, channels and functions, what the replaced reflect.Value comparison matched when
// built with Go < 1.19. Empty strings are not null.
func longtailIsNilRef(data interface{}) bool {
	v := reflect.ValueOf(data)
	switch v.Kind() {
	case reflect.Map, reflect.Ptr, reflect.Chan, reflect.Func, reflect.UnsafePointer:
		return v.IsNil()
	}
	return false
}
GOEOF
  done
  log "patched the OpenAPI validators' null check (empty strings are not null under Go >= 1.19)"
}

go_env() {
  export GOPATH="$SCRATCH/gopath"
  export GOCACHE="$SCRATCH/gocache"
  export GO111MODULE=off
  export GOFLAGS=""
  export CGO_ENABLED=0
  export GOTOOLCHAIN=local
  export TMPDIR="$SCRATCH/tmp"
  mkdir -p "$TMPDIR" "$GOCACHE"
}

cmd_build() {
  if binaries_cached; then
    log "cached: $BIN_DIR ($("$BIN_DIR/kube-apiserver" --version 2>/dev/null || echo '?'))"
    return 0
  fi
  mkdir -p "$KUBE_CACHE"
  # One build at a time per cache (two pytest sessions may both ask for it).
  exec 9>"$KUBE_CACHE/.build.lock"
  flock -n 9 || log "another build holds $KUBE_CACHE/.build.lock; waiting for it (up to 1 h)"
  flock -w 3600 9 || die "timed out (1 h) waiting for another build holding $KUBE_CACHE/.build.lock"
  if binaries_cached; then
    log "cached by a concurrent build: $BIN_DIR"
    return 0
  fi
  local t0=$SECONDS t
  rm -rf "$KUBE_CACHE"/.trash.* # left over if a background deletion was interrupted
  ensure_build_deps
  mkdir -p "$SCRATCH"
  t=$SECONDS; fetch_source; log "timing: fetch+extract+patch $((SECONDS - t)) s"
  go_env
  local tree="$GOPATH/src/k8s.io/kubernetes"
  log "$(go version)"

  if [[ ! -f "$tree/pkg/generated/openapi/zz_generated.openapi.go" ]]; then
    t=$SECONDS
    log "make gen_openapi (generates pkg/generated/openapi/zz_generated.openapi.go)"
    (cd "$tree" && make gen_openapi >"$SCRATCH/gen_openapi.log" 2>&1) \
      || { tail -n 40 "$SCRATCH/gen_openapi.log" >&2; die "make gen_openapi failed (log: $SCRATCH/gen_openapi.log)"; }
    [[ -f "$tree/pkg/generated/openapi/zz_generated.openapi.go" ]] \
      || die "make gen_openapi did not produce pkg/generated/openapi/zz_generated.openapi.go"
    log "timing: gen_openapi $((SECONDS - t)) s"
  fi

  local vpkg="k8s.io/kubernetes/vendor/k8s.io"
  local ldflags="-s -w"
  local pkg
  for pkg in component-base/version client-go/pkg/version; do
    ldflags+=" -X $vpkg/$pkg.gitVersion=$KUBE_VERSION -X $vpkg/$pkg.gitMajor=1 -X $vpkg/$pkg.gitMinor=20"
    ldflags+=" -X $vpkg/$pkg.gitTreeState=clean -X $vpkg/$pkg.buildDate=1970-01-01T00:00:00Z"
  done
  local out="$SCRATCH/out"
  mkdir -p "$out"
  local b
  for b in "${BINARIES[@]}"; do
    t=$SECONDS
    log "go build -p $JOBS k8s.io/kubernetes/cmd/$b"
    (cd "$tree" && nice -n 10 go build -p "$JOBS" -trimpath -ldflags "$ldflags" -o "$out/$b" \
      "k8s.io/kubernetes/cmd/$b" >"$SCRATCH/build-$b.log" 2>&1) \
      || { tail -n 40 "$SCRATCH/build-$b.log" >&2; die "go build $b failed (log: $SCRATCH/build-$b.log)"; }
    log "timing: $b $((SECONDS - t)) s"
  done
  rm -rf "$BIN_DIR"
  mkdir -p "$BIN_DIR"
  for b in "${BINARIES[@]}"; do install -m 0755 "$out/$b" "$BIN_DIR/$b"; done
  {
    echo "recipe $BUILD_RECIPE"
    echo "$KUBE_VERSION from Debian source $DEB_SRC_PACKAGE=$DEB_SRC_VERSION, $(go version)"
  } >"$BIN_DIR/.complete"
  "$BIN_DIR/kube-apiserver" --version >&2
  log "timing: build total $((SECONDS - t0)) s; binaries in $BIN_DIR ($(du -sh "$BIN_DIR" | cut -f1))"
  log "disk: scratch $(du -sh "$SCRATCH" 2>/dev/null | cut -f1) in $SCRATCH"
  if [[ "${LONGTAIL_KEEP_KUBE_SRC:-0}" != 1 ]]; then
    # The binaries are cached; keep only the downloaded source package (~tens of MB) so a rebuild
    # does not need the network.
    # Deleting ~2.2 GB of small files takes 1-2 min on a busy disk: move them aside (instant,
    # same filesystem) and delete them in the background, off the caller's critical path.
    local trash
    trash="$(mktemp -d "$KUBE_CACHE/.trash.XXXXXX")"
    mv "$SCRATCH/gopath" "$SCRATCH/gocache" "$SCRATCH/out" "$SCRATCH/tmp" "$SCRATCH/apt" "$trash/" 2>/dev/null || true
    nohup rm -rf "$trash" </dev/null >/dev/null 2>&1 9>&- &
    log "deleting the source tree and Go build cache in the background (LONGTAIL_KEEP_KUBE_SRC=1 keeps them); scratch now $(du -sh "$SCRATCH" | cut -f1)"
  fi
}

cmd_bin() { echo "$BIN_DIR"; }

# ----------------------------------------------------------------------------------------------
# up / down
# ----------------------------------------------------------------------------------------------

# Components in start order; `down` stops them in reverse.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler)
USED_PORTS=()

# pick_port VAR: a free loopback TCP port (nothing accepts connections on it), distinct from
# the ones picked before in this run, and below the kernel's ephemeral range: a port picked
# inside it can be taken as the local port of an outgoing connection (the apiserver's to etcd)
# before the component meant to listen on it starts ("bind: address already in use").
pick_port() {
  local _p _i _lo=20000 _hi=32768 _rest
  read -r _hi _rest < /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true
  if ((_hi - _lo < 2000)); then  # an unusual ephemeral range: fall back to a wide one
    _lo=20000 _hi=50000
  fi
  for _i in $(seq 1 500); do
    _p=$((_lo + RANDOM % (_hi - _lo)))
    [[ " ${USED_PORTS[*]:-} " == *" $_p "* ]] && continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$_p") 2>/dev/null; then
      USED_PORTS+=("$_p")
      printf -v "$1" '%s' "$_p"
      return 0
    fi
  done
  die "no free loopback port found"
}

pid_of() { # pid_of DIR NAME -> prints the pid if that component runs, else fails
  local f="$1/pids/$2.pid" pid
  [[ -f "$f" ]] || return 1
  pid="$(cat "$f")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  # Guard against pid reuse: the process must still be the binary we started.
  [[ -r "/proc/$pid/cmdline" ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$2" || return 1
  echo "$pid"
}

start_component() { # start_component DIR NAME BINARY ARGS...
  local dir="$1" name="$2"
  shift 2
  printf '\n==== %(%F %T)T starting: %s\n' -1 "$*" >>"$dir/logs/$name.log"
  # stdin/stdout/stderr detached from the caller so `up` can return (and a caller capturing our
  # output, like subprocess.run, does not wait for the servers to exit).
  nohup "$@" </dev/null >>"$dir/logs/$name.log" 2>&1 9>&- &
  echo $! >"$dir/pids/$name.pid"
}

stop_components() { # stop_components DIR NAME...: SIGTERM all, wait up to 15 s, then SIGKILL
  local dir="$1" name pid
  shift
  local -A pids=()
  for name in "$@"; do
    if pid="$(pid_of "$dir" "$name")"; then
      kill -TERM "$pid" 2>/dev/null || true
      pids[$name]=$pid
    fi
  done
  for _ in $(seq 1 150); do
    for name in "${!pids[@]}"; do
      kill -0 "${pids[$name]}" 2>/dev/null || { log "stopped $name (pid ${pids[$name]})"; unset "pids[$name]"; }
    done
    ((${#pids[@]} == 0)) && break
    sleep 0.1
  done
  for name in "${!pids[@]}"; do
    log "$name (pid ${pids[$name]}) did not exit 15 s after SIGTERM; sending SIGKILL"
    kill -KILL "${pids[$name]}" 2>/dev/null || true
  done
  for name in "$@"; do rm -f "$dir/pids/$name.pid"; done
}

make_pki() { # make_pki DIR: CA, apiserver serving cert, service-account key pair, tokens
  local pki="$1/pki"
  [[ -f "$pki/.complete" ]] && return 0
  log "generating certificates, service-account key and tokens in $pki"
  rm -rf "$pki"
  mkdir -p "$pki"
  chmod 700 "$pki"
  (
    cd "$pki"
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 -keyout ca.key -out ca.crt \
      -subj "/CN=longtail-test-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
      2>/dev/null
    openssl req -newkey rsa:2048 -nodes -sha256 -keyout serving.key -out serving.csr \
      -subj "/CN=kube-apiserver" 2>/dev/null
    cat >serving.ext <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
authorityKeyIdentifier=keyid,issuer
subjectKeyIdentifier=hash
EOF
    openssl x509 -req -sha256 -days 3650 -in serving.csr -CA ca.crt -CAkey ca.key \
      -CAcreateserial -extfile serving.ext -out serving.crt 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    # Static tokens: token,user,uid,"groups". The operator identity is in no privileged group:
    # it gets system:authenticated only, so it can do nothing RBAC does not grant it.
    {
      echo "$(openssl rand -hex 24),longtail-admin,longtail-admin,\"system:masters\""
      echo "$(openssl rand -hex 24),longtail-operator,longtail-operator"
      echo "$(openssl rand -hex 24),system:kube-controller-manager,system:kube-controller-manager"
      echo "$(openssl rand -hex 24),system:kube-scheduler,system:kube-scheduler"
    } >tokens.csv
    chmod 600 ./*.key tokens.csv
  ) || die "certificate/key generation with openssl failed"
  touch "$pki/.complete"
}

token_of() { grep -F ",$2,$2" "$1/pki/tokens.csv" | cut -d, -f1; }

write_kubeconfig() { # write_kubeconfig DIR FILE USER
  local dir="$1" file="$2" user="$3"
  cat >"$file.tmp" <<EOF
# Written by e2e/controlplane.sh up: user "$user" on the local test control plane.
apiVersion: v1
kind: Config
clusters:
- name: longtail-test
  cluster:
    server: $API_URL
    certificate-authority-data: $(base64 -w0 "$dir/pki/ca.crt")
users:
- name: $user
  user:
    token: $(token_of "$dir" "$user")
contexts:
- name: $user@longtail-test
  context:
    cluster: longtail-test
    user: $user
    namespace: default
current-context: $user@longtail-test
preferences: {}
EOF
  chmod 600 "$file.tmp"
  mv "$file.tmp" "$file"
}

# wait_until DIR WHAT TIMEOUT CMD...: run CMD with exponential backoff (0.1 s .. 2 s) until it
# succeeds; fail after TIMEOUT seconds, or at once if one of the started components died.
wait_until() {
  local dir="$1" what="$2" timeout="$3" delay=0.1 c
  shift 3
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    for c in "${COMPONENTS[@]}"; do
      # kill -0, not pid_of: these pids were written by this very run, and a component that was
      # just forked may not have exec'd its binary yet (its cmdline is still ours under load).
      if [[ -f "$dir/pids/$c.pid" ]] && ! kill -0 "$(cat "$dir/pids/$c.pid")" 2>/dev/null; then
        tail -n 30 "$dir/logs/$c.log" >&2 || true
        die "$c exited while waiting for $what (log: $dir/logs/$c.log)"
      fi
    done
    if ((SECONDS >= deadline)); then
      die "timed out after ${timeout} s waiting for $what (logs: $dir/logs/)"
    fi
    sleep "$delay"
    delay="$(awk -v d="$delay" 'BEGIN { d *= 2; if (d > 2) d = 2; print d }')"
  done
}

healthz() { curl -fsS --max-time 5 -k "$1" | grep -qx ok; }
healthz_etcd() { curl -fsS --max-time 5 "$1" | grep -q '"health":"true"'; }
api_readyz() {
  curl -fsS --max-time 5 --cacert "$1/pki/ca.crt" \
    -H "Authorization: Bearer $(token_of "$1" longtail-admin)" "$API_URL/readyz" | grep -qx ok
}
default_sa_ready() { # the default ServiceAccount exists and has its token: Pods can be created
  [[ -n "$("$BIN_DIR/kubectl" --kubeconfig "$1/admin.kubeconfig" -n default \
    get serviceaccount default -o 'jsonpath={.secrets[0].name}' 2>/dev/null)" ]]
}

start_apiserver() { # start_apiserver DIR ETCD_PORT API_PORT: the one set of flags (up, start-apiserver)
  local dir="$1" pki="$1/pki"
  start_component "$dir" kube-apiserver "$BIN_DIR/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$2" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 \
    --secure-port "$3" --insecure-port 0 \
    --tls-cert-file "$pki/serving.crt" --tls-private-key-file "$pki/serving.key" \
    --client-ca-file "$pki/ca.crt" \
    --token-auth-file "$pki/tokens.csv" \
    --authorization-mode Node,RBAC \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$pki/sa.pub" \
    --service-account-signing-key-file "$pki/sa.key" \
    --service-cluster-ip-range 10.0.0.0/24 \
    --allow-privileged=true --profiling=false --v=1
}

all_running() {
  local c
  for c in "${COMPONENTS[@]}"; do pid_of "$1" "$c" >/dev/null || return 1; done
}

cmd_up() {
  local dir="${1:-}"
  [[ -n "$dir" ]] || { usage; die "up needs a state directory: $0 up DIR"; }
  binaries_cached || die "no cached binaries in $BIN_DIR: run '$0 build' first"
  local tool
  for tool in etcd openssl curl; do
    command -v "$tool" >/dev/null || die "$tool not found: run '$0 build' (installs etcd-server, openssl, curl)"
  done
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  mkdir -p "$dir/logs" "$dir/pids"

  if [[ -f "$dir/env" ]] && all_running "$dir"; then
    API_URL="$(sed -n 's/^API_URL=//p' "$dir/env")"
    if api_readyz "$dir"; then
      log "already up in $dir"
      echo "$API_URL"
      return 0
    fi
  fi
  cmd_down "$dir" 2>/dev/null # a half-started or stale instance: start afresh (data is kept)
  rm -f "$dir/env"

  local t0=$SECONDS
  UP_DIR="$dir"
  UP_OK=0
  trap '((UP_OK)) || { log "up failed; stopping what was started"; cmd_down "$UP_DIR" || true; }' EXIT
  make_pki "$dir"
  local pki="$dir/pki"
  local etcd_port etcd_peer_port api_port cm_port sched_port
  pick_port etcd_port
  pick_port etcd_peer_port
  pick_port api_port
  pick_port cm_port
  pick_port sched_port
  API_URL="https://127.0.0.1:$api_port"

  start_component "$dir" etcd etcd --name longtail-test --data-dir "$dir/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" \
    --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster "longtail-test=http://127.0.0.1:$etcd_peer_port" \
    --log-level warn --logger zap
  wait_until "$dir" "etcd /health" 30 healthz_etcd "http://127.0.0.1:$etcd_port/health"

  start_apiserver "$dir" "$etcd_port" "$api_port"
  wait_until "$dir" "kube-apiserver $API_URL/readyz" "$UP_TIMEOUT" api_readyz "$dir"
  log "kube-apiserver ready at $API_URL after $((SECONDS - t0)) s"

  write_kubeconfig "$dir" "$dir/admin.kubeconfig" longtail-admin
  write_kubeconfig "$dir" "$dir/operator.kubeconfig" longtail-operator
  write_kubeconfig "$dir" "$dir/controller-manager.kubeconfig" system:kube-controller-manager
  write_kubeconfig "$dir" "$dir/scheduler.kubeconfig" system:kube-scheduler

  # Fake Nodes have no kubelet heartbeats: long grace periods keep a Node that a test marked
  # Ready schedulable for an hour instead of tainting it unreachable after 40 s.
  start_component "$dir" kube-controller-manager "$BIN_DIR/kube-controller-manager" \
    --kubeconfig "$dir/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$dir/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$dir/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$cm_port" --port 0 \
    --leader-elect=false --use-service-account-credentials=true \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --cluster-name longtail-test \
    --node-monitor-grace-period 1h --node-startup-grace-period 1h --v=1
  start_component "$dir" kube-scheduler "$BIN_DIR/kube-scheduler" \
    --kubeconfig "$dir/scheduler.kubeconfig" \
    --authentication-kubeconfig "$dir/scheduler.kubeconfig" \
    --authorization-kubeconfig "$dir/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$sched_port" --port 0 \
    --leader-elect=false --v=1
  wait_until "$dir" "kube-controller-manager /healthz" "$UP_TIMEOUT" \
    healthz "https://127.0.0.1:$cm_port/healthz"
  wait_until "$dir" "kube-scheduler /healthz" "$UP_TIMEOUT" \
    healthz "https://127.0.0.1:$sched_port/healthz"
  wait_until "$dir" "the default ServiceAccount and its token (controller-manager working)" \
    "$UP_TIMEOUT" default_sa_ready "$dir"

  cat >"$dir/env" <<EOF
# Written by e2e/controlplane.sh up; source it in a shell.
API_URL=$API_URL
ETCD_URL=http://127.0.0.1:$etcd_port
CONTROLLER_MANAGER_URL=https://127.0.0.1:$cm_port
SCHEDULER_URL=https://127.0.0.1:$sched_port
KUBECTL=$BIN_DIR/kubectl
ADMIN_KUBECONFIG=$dir/admin.kubeconfig
OPERATOR_KUBECONFIG=$dir/operator.kubeconfig
EOF
  # shellcheck disable=SC2034  # read by the EXIT trap set above
  UP_OK=1
  trap - EXIT
  log "control plane up in $((SECONDS - t0)) s; state in $dir"
  log "  try: $BIN_DIR/kubectl --kubeconfig $dir/admin.kubeconfig get namespaces"
  echo "$API_URL"
}

cmd_down() {
  local dir="${1:-}"
  [[ -n "$dir" ]] || { usage; die "down needs the state directory given to up: $0 down DIR"; }
  [[ -d "$dir/pids" ]] || { log "nothing to stop in $dir"; return 0; }
  # Clients first, then the API server, then its storage.
  stop_components "$dir" kube-scheduler kube-controller-manager
  stop_components "$dir" kube-apiserver
  stop_components "$dir" etcd
}

up_dir() { # up_dir DIR: DIR made absolute, after checking that `up DIR` completed there
  [[ -n "$1" ]] || { usage; die "a state directory is needed: the DIR given to up"; }
  [[ -f "$1/env" ]] || die "$1/env not found: '$0 up $1' did not complete there"
  (cd "$1" && pwd)
}

env_value() { sed -n "s/^$2=//p" "$1/env"; } # env_value DIR NAME: a value from DIR/env

cmd_stop_apiserver() {
  local dir
  dir="$(up_dir "${1:-}")" || exit 1
  stop_components "$dir" kube-apiserver
}

cmd_start_apiserver() {
  local dir etcd_url t0=$SECONDS
  dir="$(up_dir "${1:-}")" || exit 1
  API_URL="$(env_value "$dir" API_URL)"
  etcd_url="$(env_value "$dir" ETCD_URL)"
  [[ -n "$API_URL" && -n "$etcd_url" ]] || die "no API_URL or ETCD_URL in $dir/env"
  pid_of "$dir" etcd >/dev/null || die "etcd of $dir is not running: use '$0 up $dir'"
  if ! pid_of "$dir" kube-apiserver >/dev/null; then
    start_apiserver "$dir" "${etcd_url##*:}" "${API_URL##*:}"
  fi
  wait_until "$dir" "kube-apiserver $API_URL/readyz" "$UP_TIMEOUT" api_readyz "$dir"
  log "kube-apiserver ready at $API_URL after $((SECONDS - t0)) s"
}

cmd_status() {
  local dir="${1:-}" c pid
  [[ -n "$dir" ]] || die "status needs the state directory: $0 status DIR"
  for c in "${COMPONENTS[@]}"; do
    if pid="$(pid_of "$dir" "$c")"; then echo "$c: running (pid $pid)"; else echo "$c: stopped"; fi
  done
  [[ -f "$dir/env" ]] && cat "$dir/env"
  all_running "$dir"
}

case "${1:-}" in
  build) cmd_build ;;
  bin) cmd_bin ;;
  up) cmd_up "${2:-}" ;;
  down) cmd_down "${2:-}" ;;
  status) cmd_status "${2:-}" ;;
  stop-apiserver) cmd_stop_apiserver "${2:-}" ;;
  start-apiserver) cmd_start_apiserver "${2:-}" ;;
  -h|--help|help|"") usage; [[ -n "${1:-}" ]] ;;
  *) usage; die "unknown subcommand: $1" ;;
esac
