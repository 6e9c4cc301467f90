"""The `longtail` console script, run as a real subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from longtail_api import __version__
from longtail_api.schema import render_crd

REPO = Path(__file__).resolve().parents[3]
LONGTAIL = str(Path(sys.executable).parent / "longtail")

BAD = """\
apiVersion: longtail.dev/v1alpha1
kind: RLJob
metadata: {name: bad-job}
spec:
  model: {path: builtin:tiny}
  dataset: {path: builtin:arith}
  algorithm: {groupSize: eight}
  rollout: {replicas: -1, gpuCount: 1}
"""


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LONGTAIL, *args], cwd=REPO, capture_output=True, text=True, check=False)


def test_version() -> None:
    out = run("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"longtail {__version__}"


def test_validate_examples_ok() -> None:
    examples = sorted(str(p) for p in (REPO / "examples").glob("*.yaml"))
    out = run("validate", *examples)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == len(examples)
    assert all(": ok  rljob/" in line for line in lines)


def test_validate_three_mistakes(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    out = run("validate", str(bad))
    assert out.returncode == 1
    assert "3 error(s)" in out.stderr
    for path in ("spec.algorithm.groupSize", "spec.rollout.replicas", "spec.rollout.gpuCount"):
        assert f"  - {path}: " in out.stderr, out.stderr


def test_validate_mixed_files_reports_each(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed\n")
    out = run("validate", str(REPO / "examples" / "01-tiny-arith.yaml"), str(bad), str(broken))
    assert out.returncode == 1
    assert "01-tiny-arith.yaml: ok" in out.stdout
    assert "bad.yaml: 3 error(s)" in out.stderr
    assert "broken.yaml: not valid YAML" in out.stderr


def test_validate_missing_file() -> None:
    out = run("validate", "does-not-exist.yaml")
    assert out.returncode == 1 and "cannot read file" in out.stderr


def test_crd_prints_generated_crd() -> None:
    out = run("crd")
    assert out.returncode == 0 and out.stdout == render_crd()


def test_unknown_command_is_a_usage_error() -> None:
    out = run("frobnicate")
    assert out.returncode == 2 and "invalid choice" in out.stderr


def test_unknown_option_is_a_usage_error() -> None:
    out = run("validate", str(REPO / "examples" / "01-tiny-arith.yaml"), "--bogus")
    assert out.returncode == 2 and "unrecognized arguments: --bogus" in out.stderr


def test_worker_role_help_is_the_roles_own() -> None:
    out = run("worker", "verifier", "--help")
    assert out.returncode == 0
    assert "usage: longtail worker verifier" in out.stdout and "--max-batch" in out.stdout


def test_drafter_export_is_routed_to_the_exporter(tmp_path: Path) -> None:
    out = run("drafter", "export", "--help")
    assert out.returncode == 0 and "--engine" in out.stdout
    missing = run(
        "drafter", "export", str(tmp_path / "nope"), str(tmp_path / "out"), "--target", "x"
    )
    assert missing.returncode != 0
    assert "nope" in missing.stderr + missing.stdout


def test_validate_refuses_max_new_tokens_beyond_the_models_context(tmp_path: Path) -> None:
    job = tmp_path / "too-long.yaml"
    example = (REPO / "examples" / "01-tiny-arith.yaml").read_text()
    job.write_text(example.replace("maxNewTokens: 256", "maxNewTokens: 4000"))
    out = run("validate", str(job))
    assert out.returncode == 1
    assert "  - spec.algorithm.maxNewTokens: " in out.stderr
    assert "max_position_embeddings 2048" in out.stderr and "got 4000" in out.stderr


TOPOLOGY = """\
apiVersion: longtail.dev/v1alpha1
kind: RLJob
metadata:
  name: placed
  labels: {LABELS}
spec:
  model: {path: builtin:tiny}
  dataset: {path: builtin:arith}
  scheduling:
    {GANG}
    topology: [{group: GROUP, level: topology.kubernetes.io/zone}]
"""


def topology_job(tmp_path: Path, gang: str, group: str, labels: str = "{}") -> str:
    text = TOPOLOGY.replace("{LABELS}", labels).replace("{GANG}", gang)
    path = tmp_path / "placed.yaml"
    path.write_text(text.replace("GROUP", group))
    return str(path)


def test_validate_refuses_a_topology_the_named_gang_or_kueue_cannot_express(
    tmp_path: Path,
) -> None:
    """What the file names decides: a coscheduling gang has no topology, Kueue cannot hold the
    whole job in one domain; volcano takes a role's level."""
    out = run("validate", topology_job(tmp_path, "gang: {backend: coscheduling}", "trainer"))
    assert out.returncode == 1
    assert "spec.scheduling.topology" in out.stderr and "coscheduling" in out.stderr
    kueue = "{kueue.x-k8s.io/queue-name: team}"
    out = run("validate", topology_job(tmp_path, "gang: {backend: none}", "job", kueue))
    assert out.returncode == 1 and "spec.scheduling.topology" in out.stderr, out.stderr
    out = run("validate", topology_job(tmp_path, "gang: {backend: volcano}", "rollout"))
    assert out.returncode == 0, out.stderr


def test_validate_leaves_the_placement_of_a_job_without_gang_or_queue_to_the_operator(
    tmp_path: Path,
) -> None:
    """No gang named and no queue label: the install's default gang places it, which only the
    operator knows, so the file alone is not refused."""
    out = run("validate", topology_job(tmp_path, "gang: null", "trainer"))
    assert out.returncode == 0, out.stderr
