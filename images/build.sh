#!/usr/bin/env bash
# images/build.sh — build the operator and worker images, or print the commands.
#
# Usage:
#   images/build.sh [print|build] [operator|worker ...]
#     print   print the `docker build` commands (default when no Docker engine is reachable)
#     build   run them (needs a Docker engine with BuildKit; the default when one answers)
#
# Environment:
#   REGISTRY          image name prefix (default ghcr.io/longtail-dev)
#   TAG               image tag (default: the version in pyproject.toml)
#   DOCKER            docker CLI to use (default docker)
#   WORKER_BUILD_ARGS extra args for the worker build, e.g. "--build-arg WITH_VLLM=0"
#
# The build context is the repository root; each Dockerfile has a <Dockerfile>.dockerignore
# beside it. No Docker engine exists on the project's development machines, so there the
# commands are printed and not run (docs/install.md).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REGISTRY="${REGISTRY:-ghcr.io/longtail-dev}"
DOCKER="${DOCKER:-docker}"
TAG="${TAG:-$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/pyproject.toml" | head -n1)}"
[[ -n "$TAG" ]] || { echo "images/build.sh: cannot read the version from pyproject.toml; set TAG" >&2; exit 2; }

mode="${1:-auto}"
case "$mode" in print | build | auto) shift || true ;; *) mode=auto ;; esac
images=("$@")
((${#images[@]})) || images=(operator worker)

command_for() {
  local image="$1" extra=""
  [[ "$image" == worker ]] && extra="${WORKER_BUILD_ARGS:-}"
  [[ -f "$ROOT/images/$image/Dockerfile" ]] || { echo "images/build.sh: unknown image '$image' (operator, worker)" >&2; exit 2; }
  echo "$DOCKER build -f images/$image/Dockerfile --build-arg LONGTAIL_VERSION=$TAG${extra:+ $extra} -t $REGISTRY/longtail-$image:$TAG ."
}

if [[ "$mode" == auto ]]; then
  if command -v "$DOCKER" >/dev/null && timeout 10 "$DOCKER" info >/dev/null 2>&1; then
    mode=build
  else
    mode=print
    echo "# No Docker engine reachable ('$DOCKER info' failed): printing the build commands." >&2
    echo "# Run them from the repository root on a machine with Docker (BuildKit)." >&2
  fi
fi

cd "$ROOT"
for image in "${images[@]}"; do
  cmd="$(command_for "$image")"
  if [[ "$mode" == print ]]; then
    echo "$cmd"
  else
    echo "+ $cmd" >&2
    DOCKER_BUILDKIT=1 $cmd
  fi
done
