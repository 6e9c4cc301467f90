"""The Dockerfiles install exactly the pyproject extras meant for each image, multi-stage, non-root.

No Docker engine exists here, so the images cannot be built in CI; these checks read the
Dockerfiles (continuation lines joined) and pyproject.toml: the operator image installs the
``operator`` extra and nothing with torch, the worker image ``workers`` plus ``gpu`` (vLLM),
neither installs ``dev``; both are multi-stage, run as a numeric non-root user and use pinned
base images. ``images/build.sh print`` yields the commands ``make images`` runs.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "images"))

from dockerfile import instructions  # noqa: E402  (images/dockerfile.py, path above)

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]
ML_LIBRARIES = ("torch", "transformers", "safetensors", "vllm", "numpy")


def installed_extras(image: str) -> set[frozenset[str]]:
    """Every set of this repository's extras the Dockerfile can pip-install."""
    found: set[frozenset[str]] = set()
    for word, args in instructions(image):
        if word != "RUN" or "pip install" not in args:
            continue
        assignments = re.findall(r'EXTRAS="([a-z,]+)"', args)
        for m in re.finditer(r'"\.\[([^\]]+)\]"', args):
            spec = m.group(1)
            choices = assignments if spec == "${EXTRAS}" else [spec]
            found |= {frozenset(c.split(",")) for c in choices}
    return found


def requirement_names(extra: str) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in EXTRAS[extra]}


def test_operator_image_installs_the_operator_extra_and_no_ml_library() -> None:
    assert installed_extras("operator") == {frozenset({"operator"})}
    assert not requirement_names("operator") & set(ML_LIBRARIES)
    runs = " ".join(a for w, a in instructions("operator") if w == "RUN")
    for lib in ML_LIBRARIES:
        assert not re.search(rf"\b{lib}\b", runs), f"operator image installs {lib}"


def test_worker_image_installs_workers_and_gpu_extras_with_pinned_torch() -> None:
    assert installed_extras("worker") == {frozenset({"workers", "gpu"}), frozenset({"workers"})}
    assert "torch==2.13.0" in EXTRAS["workers"]
    assert requirement_names("gpu") == {"vllm"}
    # The worker Dockerfile installs torch from the CUDA index at the version pyproject pins:
    # its grep pattern must find exactly that pin in pyproject.toml.
    runs = [a for w, a in instructions("worker") if w == "RUN"]
    torch_run = next(a for a in runs if "TORCH_PIN=" in a)
    assert "grep -o '\"torch==[0-9.]*\"' /src/pyproject.toml" in torch_run
    pins = re.findall(r'"torch==[0-9.]*"', (REPO / "pyproject.toml").read_text())
    assert pins == ['"torch==2.13.0"']
    args = dict(a.split("=", 1) for w, a in instructions("worker") if w == "ARG" and "=" in a)
    assert args["WITH_VLLM"] == "1"


@pytest.mark.parametrize("image", ["operator", "worker"])
def test_no_image_installs_the_dev_extra(image: str) -> None:
    assert all("dev" not in extras for extras in installed_extras(image))


@pytest.mark.parametrize("image", ["operator", "worker"])
def test_multi_stage_non_root_and_pinned(image: str) -> None:
    steps = instructions(image)
    froms = [a for w, a in steps if w == "FROM"]
    assert len(froms) >= 2 and any(" AS builder" in f for f in froms)
    assert any(w == "COPY" and a.startswith("--from=builder") for w, a in steps)
    # The last stage copies only the built venv; no compiler stage leaks in.
    users = [a for w, a in steps if w == "USER"]
    assert users, f"{image} image sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "run as a numeric non-root uid (runAsNonRoot)"
    bases = dict(a.split("=", 1) for w, a in steps if w == "ARG" and "IMAGE=" in a)
    assert bases, f"{image}: base image is not an ARG with a pinned default"
    for base in bases.values():
        name, _, tag = base.rpartition(":")
        assert name and re.search(r"\d+\.\d+", tag), f"{image}: base {base} is not pinned"
        assert "latest" not in tag
    assert any(w == "ENTRYPOINT" for w, _ in steps)
    assert (REPO / "images" / image / "Dockerfile.dockerignore").exists()


def test_the_operator_uid_matches_the_chart() -> None:
    import yaml

    values = yaml.safe_load((REPO / "helm" / "longtail" / "values.yaml").read_text())
    user = [a for w, a in instructions("operator") if w == "USER"][-1]
    pod = values["podSecurityContext"]
    assert user == f"{pod['runAsUser']}:{pod['runAsGroup']}"


def test_build_script_prints_both_builds() -> None:
    proc = subprocess.run(
        ["bash", str(REPO / "images" / "build.sh"), "print"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "TAG": "9.9.9", "REGISTRY": "example.com/lt"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"docker build -f images/{i}/Dockerfile --build-arg LONGTAIL_VERSION=9.9.9 "
        f"-t example.com/lt/longtail-{i}:9.9.9 ."
        for i in ("operator", "worker")
    ]
    bad = subprocess.run(
        ["bash", str(REPO / "images" / "build.sh"), "print", "gpu"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and "unknown image 'gpu'" in bad.stderr


def test_entrypoints_match_what_the_chart_and_operator_run() -> None:
    import json

    op = [json.loads(a) for w, a in instructions("operator") if w == "ENTRYPOINT"][-1]
    assert op == ["python", "-m", "longtail_operator"]
    assert (REPO / "operator" / "longtail_operator" / "__main__.py").exists()
    worker = [json.loads(a) for w, a in instructions("worker") if w == "ENTRYPOINT"][-1]
    assert worker == ["longtail"]  # worker pods run `longtail worker ROLE ...` via args
    # Every pod the operator builds runs `longtail worker ROLE ...` through that entrypoint.
    builders = pytest.importorskip("longtail_operator.builders")
    from longtail_api.manifest import validate_file
    from longtail_operator.settings import Settings

    spec = validate_file(REPO / "examples" / "01-tiny-arith.yaml")[0].spec
    assert spec is not None
    job = builders.JobRef(namespace="ns", name="tiny", uid="uid-1")
    for role in ("trainer", "rollout", "verifier"):
        pod = builders.worker_pod(job, spec, Settings(), role, 0)
        (container,) = pod["spec"]["containers"]
        assert container.get("command", worker) == worker  # the image's entrypoint
        assert container["args"][:2] == ["worker", role]
