"""Static and no-Docker checks of ``e2e/kind/run.sh``, the kind-cluster script for users.

The project's machines have no Docker engine, so the script is never run end to end here
(e2e/kind/README.md says so). Run by ``make test`` with the other unit tests, this checks what
can be checked without Docker: the script parses (``bash -n``) and is shellcheck-clean (where
shellcheck is installed); with docker/kind missing from PATH, or with a docker CLI but no
engine, it stops before doing anything with exit status 3 and a message naming the tool and how
to install it; the image references it loads into kind are exactly those ``images/build.sh``
tags for the same REGISTRY/TAG; every Helm value it sets exists in ``helm/longtail/values.yaml``
and ``helm template`` with them renders the operator with those images; every wait is bounded;
and, with stub docker/kind/kubectl/helm that log their arguments, ``all``, ``demo`` and ``down``
run their steps in order and report a Failed or timed-out RLJob with exit status 1. Both sides
are parsed from the files (``run.sh config`` prints the script's resolved settings).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "e2e" / "kind" / "run.sh"
BUILD_SH = REPO / "images" / "build.sh"
VALUES = REPO / "helm" / "longtail" / "values.yaml"
BASH = shutil.which("bash") or "/bin/bash"
MISSING_PREREQUISITE = 3  # run.sh's documented exit status


def run_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BASH, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env if env is not None else clean_env(),
        cwd=REPO,
    )


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without any setting run.sh or build.sh reads, plus ``extra``."""
    keep = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LONGTAIL_", "KIND_"))
        and k not in {"REGISTRY", "TAG", "WORKER_BUILD_ARGS", "DOCKER"}
    }
    return {**keep, **extra}


def script_config(**env: str) -> tuple[dict[str, str], list[str]]:
    """``run.sh config``: its key=value settings and its Helm ``--set`` values, in order."""
    done = run_script("config", env=clean_env(**env))
    assert done.returncode == 0, done.stderr
    settings: dict[str, str] = {}
    helm_sets: list[str] = []
    for line in done.stdout.splitlines():
        key, _, value = line.partition("=")
        if key == "helm_set":
            helm_sets.append(value)
        else:
            settings[key] = value
    return settings, helm_sets


def stub_bin(tmp_path: Path, **tools: str) -> Path:
    """A PATH directory holding only ``bash`` and stub ``tools`` (name -> /bin/sh body)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "bash").symlink_to(BASH)
    for name, body in tools.items():
        stub = bindir / name
        stub.write_text(f"#!/bin/sh\n{body}\n")
        stub.chmod(0o755)
    return bindir


def logical_lines(text: str) -> list[str]:
    """Shell lines with backslash continuations joined."""
    return text.replace("\\\n", " ").splitlines()


# --- the script itself ------------------------------------------------------------------------


def test_script_parses_and_is_executable() -> None:
    done = subprocess.run([BASH, "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert os.access(SCRIPT, os.X_OK)
    head = SCRIPT.read_text().splitlines()[:3]
    assert head[0] == "#!/usr/bin/env bash"
    assert "set -euo pipefail" in SCRIPT.read_text()


def test_script_is_shellcheck_clean() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (apt-get install -y shellcheck)")
    done = subprocess.run(
        [shellcheck, "-x", str(SCRIPT)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_unknown_command_and_extra_arguments_are_usage_errors() -> None:
    done = run_script("bogus")
    assert done.returncode == 2
    assert 'unknown command "bogus"' in done.stderr
    assert "Usage: e2e/kind/run.sh COMMAND" in done.stderr
    assert run_script("up", "now").returncode == 2
    helped = run_script("help")
    assert helped.returncode == 0
    for command in ("up", "load", "install", "demo", "down", "all"):
        assert re.search(rf"^  {command} ", helped.stdout, re.M), command


# --- prerequisites ----------------------------------------------------------------------------

COMMAND_NEEDS = {
    "up": ["docker", "kind"],
    "load": ["docker", "kind"],
    "down": ["kind"],
    "all": ["docker", "kind"],
}


@pytest.mark.parametrize("command", sorted(COMMAND_NEEDS))
def test_missing_docker_and_kind_fail_up_front_naming_them(tmp_path: Path, command: str) -> None:
    # kubectl and helm are present (stubs that must never run); docker and kind are not.
    bindir = stub_bin(tmp_path, kubectl="exit 99", helm="exit 99")
    done = run_script(command, env=clean_env(PATH=str(bindir)))
    assert done.returncode == MISSING_PREREQUISITE, done.stderr
    missing = COMMAND_NEEDS[command]
    first = done.stderr.splitlines()[0]
    assert first == (
        f'e2e/kind/run.sh: missing prerequisite(s) for "{command}": {" ".join(missing)}'
    )
    if "docker" in missing:
        assert "docker not found on PATH; install Docker Engine: https://docs.docker.com/" in (
            done.stderr
        )
    assert "kind not found on PATH; install kind:" in done.stderr
    assert "https://kind.sigs.k8s.io/" in done.stderr
    assert "kubectl not found" not in done.stderr and "helm not found" not in done.stderr
    assert done.stdout == ""


def test_missing_helm_and_kubectl_are_named_for_install(tmp_path: Path) -> None:
    done = run_script("install", env=clean_env(PATH=str(stub_bin(tmp_path))))
    assert done.returncode == MISSING_PREREQUISITE
    assert 'missing prerequisite(s) for "install": helm kubectl' in done.stderr
    assert "https://helm.sh/docs/intro/install/" in done.stderr
    assert "https://kubernetes.io/docs/tasks/tools/" in done.stderr


def test_docker_cli_without_an_engine_is_a_missing_prerequisite(tmp_path: Path) -> None:
    bindir = stub_bin(
        tmp_path,
        docker='[ "$1" = info ] && { echo "Cannot connect to the Docker daemon" >&2; exit 1; }'
        "\nexit 99",
        kind="exit 99",
        kubectl="exit 99",
    )
    done = run_script("up", env=clean_env(PATH=str(bindir)))
    assert done.returncode == MISSING_PREREQUISITE, done.stderr
    assert 'missing prerequisite for "up": a running Docker engine' in done.stderr
    assert "'docker info' failed" in done.stderr


# --- image tags: the script's against images/build.sh's ---------------------------------------


def build_sh_tags(registry: str, tag: str | None) -> set[str]:
    """The ``-t`` references ``images/build.sh print`` gives for this REGISTRY (and TAG)."""
    env = clean_env(REGISTRY=registry, **({"TAG": tag} if tag is not None else {}))
    done = subprocess.run(
        [BASH, str(BUILD_SH), "print", "operator", "worker"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    tags = re.findall(r"\s-t\s+(\S+)", done.stdout)
    assert len(tags) == 2, done.stdout
    return set(tags)


@pytest.mark.parametrize(
    "env",
    [{}, {"REGISTRY": "registry.example.com/ml", "TAG": "9.9.9-rc1"}],
    ids=["defaults", "overridden"],
)
def test_loaded_images_are_the_ones_build_sh_tags(env: dict[str, str]) -> None:
    settings, _ = script_config(**env)
    images = {settings["operator_image"], settings["worker_image"]}
    # With TAG unset both scripts read pyproject.toml, each its own way: they must agree.
    assert images == build_sh_tags(settings["registry"], env.get("TAG"))
    if env:
        assert settings["registry"] == env["REGISTRY"] and settings["tag"] == env["TAG"]


def test_settings_passed_to_build_sh_are_ones_it_reads() -> None:
    text = SCRIPT.read_text()
    calls = [line for line in logical_lines(text) if '/images/build.sh" build' in line]
    assert len(calls) == 1, calls
    passed = set(re.findall(r"\b([A-Z_]+)=\"\$", calls[0].split('"$ROOT/images/build.sh"')[0]))
    read = set(re.findall(r"\$\{([A-Z_]+):-", BUILD_SH.read_text()))
    assert passed == {"REGISTRY", "TAG", "WORKER_BUILD_ARGS"}
    assert passed <= read, passed - read
    images = calls[0].split('"$ROOT/images/build.sh" build', 1)[1].split()
    assert images == ["operator", "worker"]
    for image in images:
        assert (REPO / "images" / image / "Dockerfile").is_file()


def test_worker_build_args_default_and_empty_override() -> None:
    assert script_config()[0]["worker_build_args"] == "--build-arg WITH_VLLM=0"
    assert script_config(WORKER_BUILD_ARGS="")[0]["worker_build_args"] == ""


# --- Helm values --------------------------------------------------------------------------------


def lookup(values: dict[str, Any], dotted: str) -> Any:
    node: Any = values
    for part in dotted.split("."):
        assert isinstance(node, dict) and part in node, f"{dotted}: no {part!r} in values.yaml"
        node = node[part]
    return node


def test_helm_values_set_by_the_script_exist_in_values_yaml() -> None:
    values = yaml.safe_load(VALUES.read_text())
    settings, helm_sets = script_config()
    assert helm_sets, "run.sh config printed no helm_set lines"
    by_key = dict(s.split("=", 1) for s in helm_sets)
    for key in by_key:
        default = lookup(values, key)
        assert isinstance(default, str), f"{key} is not a string value in values.yaml"
    # The operator image is repository:tag, the worker image one full reference.
    assert f"{by_key['image.repository']}:{by_key['image.tag']}" == settings["operator_image"]
    assert by_key["operator.workerImage"] == settings["worker_image"]


def test_helm_template_with_the_scripts_values_uses_the_loaded_images() -> None:
    helm = Path(sys.executable).parent / "helm"
    found = str(helm) if helm.exists() else shutil.which("helm")
    if found is None:
        pytest.skip("helm not installed (make install puts it in .venv/bin)")
    settings, helm_sets = script_config(REGISTRY="reg.example/x", TAG="1.2.3")
    args = [a for s in helm_sets for a in ("--set", s)]
    chart = str(VALUES.parent)
    done = subprocess.run(
        [found, "template", settings["release"], chart, "-n", "longtail-system", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == settings["operator_image"]
    assert settings["operator_image"] == "reg.example/x/longtail-operator:1.2.3"
    assert container["imagePullPolicy"] == "IfNotPresent"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LONGTAIL_OPERATOR_WORKER_IMAGE"] == settings["worker_image"]
    assert env["LONGTAIL_OPERATOR_IMAGE_PULL_POLICY"] == "IfNotPresent"


# --- cluster config, demo, waits ---------------------------------------------------------------


@pytest.mark.parametrize("gpu", ["0", "1"])
def test_kind_config_mounts_the_gpus_only_when_asked(gpu: str) -> None:
    done = run_script("kind-config", env=clean_env(LONGTAIL_KIND_GPU=gpu))
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    assert config["kind"] == "Cluster" and config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    roles = [n["role"] for n in config["nodes"]]
    assert roles == ["control-plane", "worker"]
    mounts = config["nodes"][1].get("extraMounts", [])
    expected = [{"hostPath": "/dev/null", "containerPath": "/var/run/nvidia-container-devices/all"}]
    assert mounts == (expected if gpu == "1" else [])


def test_demo_manifest_is_the_cpu_example() -> None:
    settings, _ = script_config()
    manifest = yaml.safe_load((REPO / settings["demo_manifest"]).read_text())
    assert manifest["kind"] == "RLJob"
    assert manifest["spec"]["rollout"]["resources"]["gpus"] == 0


def test_every_wait_is_bounded() -> None:
    lines = [ln.strip() for ln in logical_lines(SCRIPT.read_text())]
    code = [ln for ln in lines if ln and not ln.startswith("#")]
    waits = [ln for ln in code if re.match(r"(k|kubectl)\b.*\bwait\b", ln)]
    assert len(waits) >= 4, waits
    for line in waits:
        assert "--timeout=" in line, line
    helm = [ln for ln in code if ln.startswith("helm upgrade")]
    assert helm and all("--wait --timeout" in ln for ln in helm), helm
    kind_create = [ln for ln in code if "create cluster" in ln and "args=" in ln]
    assert kind_create and "--wait" in kind_create[0], kind_create
    # The phase loop has a deadline; docker exec into the GPU node is bounded by `timeout`.
    assert "((SECONDS < deadline)) || return 2" in code
    assert all("with_timeout" in ln for ln in code if ln.startswith("docker exec"))
    assert any(ln.startswith("with_timeout 600 docker exec") for ln in code)


# --- the whole flow against stub tools --------------------------------------------------------

# Stubs of docker, kind, kubectl and helm that log their arguments to $STATE/log and answer
# what run.sh reads: the cluster list, `apply -o name`, and the RLJob's phase from $STATE/phases
# (one per poll; the last one repeats).
STUB_LOG = 'echo "$(basename "$0") $*" >> "$STATE/log"'
STUBS = {
    "docker": f"{STUB_LOG}\nexit 0",
    "helm": f"{STUB_LOG}\nexit 0",
    "kind": f"""{STUB_LOG}
case "$1 $2" in
  "get clusters") [ -f "$STATE/cluster" ] && echo longtail ;;
  "create cluster") cat > "$STATE/kind-config.yaml"; touch "$STATE/cluster" ;;
  "delete cluster") rm -f "$STATE/cluster" ;;
esac
exit 0""",
    "kubectl": f"""{STUB_LOG}
case "$*" in
  *"apply -f -"*) cat > /dev/null ;;
  *"-o name"*) echo rljob.longtail.dev/tiny-arith ;;
  *"--dry-run=client"*) printf 'apiVersion: v1\\nkind: Namespace\\n' ;;
  *"jsonpath={{.status.phase}}"*)
    n=$(cat "$STATE/polls" 2>/dev/null || echo 0); n=$((n + 1)); echo "$n" > "$STATE/polls"
    sed -n "${{n}}p" "$STATE/phases" | grep . || tail -n 1 "$STATE/phases" ;;
esac
exit 0""",
}


def run_with_stubs(
    tmp_path: Path, command: str, phases: list[str], **env: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    bindir = tmp_path / "bin" if (tmp_path / "bin").is_dir() else stub_bin(tmp_path, **STUBS)
    state = tmp_path / "state"  # kept between calls in one tmp_path: the cluster persists
    state.mkdir(exist_ok=True)
    (state / "phases").write_text("".join(f"{p}\n" for p in phases))
    path = f"{bindir}:/usr/bin:/bin"
    done = run_script(
        command, env=clean_env(PATH=path, STATE=str(state), LONGTAIL_KIND_POLL_S="0", **env)
    )
    log = (state / "log").read_text().splitlines() if (state / "log").exists() else []
    return done, log


def test_all_runs_every_step_with_the_scripts_images_and_values(tmp_path: Path) -> None:
    done, log = run_with_stubs(tmp_path, "all", ["", "Initializing", "Running", "Succeeded"])
    assert done.returncode == 0, done.stderr
    settings, helm_sets = script_config()
    operator, worker = settings["operator_image"], settings["worker_image"]
    context = f"--context {settings['context']}"
    version = f"LONGTAIL_VERSION={settings['tag']}"

    def index(prefix: str) -> int:
        hits = [i for i, line in enumerate(log) if line.startswith(prefix)]
        assert hits, f"no {prefix!r} in {log}"
        return hits[0]

    order = [
        index("kind create cluster --name longtail"),
        index(f"docker build -f images/operator/Dockerfile --build-arg {version}"),
        index(f"kind load docker-image --name longtail {operator}"),
        index(f"kind load docker-image --name longtail {worker}"),
        index("helm upgrade --install longtail"),
        index(f"kubectl {context} --request-timeout=30s -n longtail-demo apply -f"),
        index(f"kubectl {context} --request-timeout=30s -n longtail-demo get rljobs"),
        index(f"kubectl {context} --request-timeout=30s -n longtail-demo describe rljob"),
    ]
    assert order == sorted(order), log
    helm_line = log[index("helm upgrade --install longtail")]
    for value in helm_sets:
        assert f"--set {value}" in helm_line
    assert "rljob.longtail.dev/tiny-arith phase: Running" in done.stderr
    assert "reached Succeeded" in done.stderr
    assert (tmp_path / "state" / "cluster").exists()  # `all` keeps the cluster
    done, log = run_with_stubs(tmp_path, "down", [""])
    assert done.returncode == 0 and "kind delete cluster --name longtail" in log
    assert not (tmp_path / "state" / "cluster").exists()
    done, _ = run_with_stubs(tmp_path, "down", [""])  # safe to repeat
    assert done.returncode == 0 and "nothing to delete" in done.stderr


def test_demo_fails_with_describe_when_the_rljob_fails(tmp_path: Path) -> None:
    done, log = run_with_stubs(tmp_path, "demo", ["Initializing", "Failed"])
    assert done.returncode == 1
    assert "rljob.longtail.dev/tiny-arith Failed" in done.stderr
    assert any(" describe rljob.longtail.dev/tiny-arith" in line for line in log)


def test_demo_times_out_naming_the_phase_it_waited_for(tmp_path: Path) -> None:
    done, _ = run_with_stubs(
        tmp_path, "demo", ["Running", "Initializing"], LONGTAIL_KIND_JOB_TIMEOUT="0"
    )
    assert done.returncode == 1
    assert "timed out waiting for rljob.longtail.dev/tiny-arith to reach Succeeded" in done.stderr
    assert "raise LONGTAIL_KIND_JOB_TIMEOUT" in done.stderr
