"""The pod environment contract: what the operator writes into a pod is what the workers read.

Both sides go through :class:`longtail_api.podenv.PodEnv`: the operator's pods (every role of
every example job) carry only variables the type names, the type reads back exactly what the
operator built, every variable the type names is written or read by one side, the only other
variables are the trainer rendezvous (``longtail_api.rendezvous``), and no other module spells a
``LONGTAIL_*`` name (only the operator's own settings, ``LONGTAIL_OPERATOR_*``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import replace
from pathlib import Path

import pytest

from longtail_api import podenv
from longtail_api.manifest import validate_file
from longtail_api.podenv import PodEnv, PodEnvError
from longtail_api.rendezvous import TrainerRendezvous
from longtail_operator import builders
from longtail_operator.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
JOB = builders.JobRef(name="tiny", namespace="ns", uid="uid-1")
SETTINGS = Settings()
NAME = re.compile(r"LONGTAIL_[A-Z0-9_]*")
# Read by worker code paths (longtail_workers.podenv, auth, parentwatch, models.cache) or, for
# the informational ones, kept for people and user code in the pod (their docstrings say so).
INFORMATIONAL = {
    podenv.NAMESPACE, podenv.ROLE, podenv.REPLICA_INDEX, podenv.REPLICAS, podenv.POD_IP,
    podenv.MIN_POLICY_VERSION, podenv.MIN_DRAFTER_VERSION, podenv.service_var("trainer"),
    podenv.port_var("trainer"), podenv.service_var("drafter"), podenv.port_var("drafter"),
}  # fmt: skip


def operator_pods() -> list[tuple[str, PodEnv, dict[str, object]]]:
    out = []
    for example in EXAMPLES:
        [result] = validate_file(example)
        assert result.spec is not None, example
        for role in builders.role_specs(result.spec):
            built = builders.pod_env(JOB, result.spec, SETTINGS, role, 0)
            built = replace(built, min_policy_version=3, min_drafter_version=-1)
            pod = builders.worker_pod(JOB, result.spec, SETTINGS, role, 0, min_policy_version=3)
            env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
            out.append((role, built, env))
    return out


def test_every_variable_the_operator_writes_is_named_by_the_type() -> None:
    written: set[str] = set()
    rendezvous = set(TrainerRendezvous("pod-0").to_env())
    for role, _built, env in operator_pods():
        written |= {n for n in env if n.startswith("LONGTAIL_")}
        # The rest is the trainer rendezvous (torchrun's names), which TrainerRendezvous reads.
        others = {n for n in env if not n.startswith("LONGTAIL_")}
        assert others == (rendezvous if role == "trainer" else set()), (role, others)
    assert written <= podenv.NAMES, written - podenv.NAMES
    # Everything the operator may write, and the worker-side variables, are named by the type.
    worker_side = {podenv.RUN_DIR, podenv.INSECURE_NO_AUTH, podenv.PARENT_PID, podenv.CACHE_DIR,
                   podenv.WEIGHT_SYNC_ADDR, podenv.WEIGHT_SYNC_PORT}  # fmt: skip
    assert podenv.NAMES - written <= worker_side, podenv.NAMES - written - worker_side


def test_the_workers_read_back_what_the_operator_wrote() -> None:
    for role, built, env in operator_pods():
        values = {n: e["value"] for n, e in env.items() if "value" in e}
        values |= {podenv.POD_NAME: f"tiny-{role}-0", podenv.POD_IP: "10.0.0.7"}
        read = PodEnv.from_env(values)
        assert read.pod_name == f"tiny-{role}-0" and read.pod_ip == "10.0.0.7"
        assert read == PodEnv(**{**built.__dict__, "pod_name": read.pod_name,
                                 "pod_ip": read.pod_ip})  # fmt: skip
        assert {n: e["valueFrom"]["fieldRef"]["fieldPath"] for n, e in env.items()
                if "fieldRef" in e.get("valueFrom", {})} == dict(podenv.FIELD_REFS)  # fmt: skip


def test_every_written_variable_is_read_or_informational() -> None:
    """A variable nobody reads must say why it is written (informational) or go."""
    source = (ROOT / "workers" / "longtail_workers" / "podenv.py").read_text()
    read = {f for f in PodEnv.__dataclass_fields__ if f"env.{f}" in source}
    read_names = {podenv.CONFIG, podenv.JOB_NAME, podenv.CHECKPOINT_DIR, podenv.RESUME,
                  podenv.TRAINER_URL, podenv.WEIGHTS_URL, podenv.DRAFTER_DIR, podenv.DRAFTER_URL,
                  podenv.POD_NAME, podenv.RUN_DIR, podenv.service_var("verifier"),
                  podenv.port_var("verifier"), podenv.service_var("rollout"),
                  podenv.port_var("rollout")}  # fmt: skip
    assert {"config", "job_name", "checkpoint_dir", "resume", "trainer_url", "weights_url",
            "drafter_dir", "drafter_url", "pod_name", "run_dir", "peers"} <= read  # fmt: skip
    written = set()
    for _role, _built, env in operator_pods():
        written |= {n for n in env if n.startswith("LONGTAIL_")}
    assert written - {podenv.AUTH_TOKEN} <= read_names | INFORMATIONAL
    for name in INFORMATIONAL:
        doc = _field_doc(name)
        assert doc is None or doc.startswith("Informational"), name


def _field_doc(name: str) -> str | None:
    """The docstring of the PodEnv field written as ``name`` (None for peer variables)."""
    tree = ast.parse(Path(podenv.__file__).read_text())
    consts = {
        t.id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    field = {v: k for k, v in consts.items()}.get(name, "").lower()
    [cls] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "PodEnv"]
    for stmt, doc in zip(cls.body, cls.body[1:], strict=False):
        named = isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
        if named and stmt.target.id == field and isinstance(doc, ast.Expr):  # type: ignore[union-attr]
            return str(ast.literal_eval(doc.value))
    return None


def test_malformed_values_name_the_variable() -> None:
    with pytest.raises(PodEnvError, match="LONGTAIL_REPLICAS='two'"):
        PodEnv.from_env({podenv.REPLICAS: "two"})
    with pytest.raises(PodEnvError, match="LONGTAIL_WEIGHTS_URL='trainer:1'"):
        PodEnv.from_env({podenv.WEIGHTS_URL: "trainer:1"})
    with pytest.raises(PodEnvError, match="LONGTAIL_ROLLOUT_PORT is not"):
        PodEnv.from_env({podenv.service_var("rollout"): "r.ns.svc"})


def _literals(path: Path) -> set[str]:
    """``LONGTAIL_*`` names spelled in code (string constants and f-string parts), docstrings
    and prose in messages aside: a constant that is (or starts) a variable's name."""
    tree = ast.parse(path.read_text())
    docs = {
        id(n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
    }
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            match = NAME.match(node.value)
            if match and not match.group().startswith("LONGTAIL_OPERATOR_"):
                found.add(match.group())
    return found


def test_no_module_but_the_type_spells_a_longtail_variable() -> None:
    spelled = {}
    for package in ("api", "operator", "workers", "cli"):
        for path in (ROOT / package).rglob("*.py"):
            if path.resolve() == Path(podenv.__file__).resolve():
                continue
            names = _literals(path)
            if names:
                spelled[str(path.relative_to(ROOT))] = sorted(names)
    assert spelled == {}, f"use longtail_api.podenv's constants instead: {spelled}"
