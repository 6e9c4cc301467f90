"""A worker pod built by the operator starts a service whose arguments parse and point at peers.

Joins the two sides of the pod contract: ``longtail_operator.builders`` (pod env, ConfigMap) and
``longtail_workers.podenv`` + the rollout/trainer services' real argument parsers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from longtail_api.manifest import validate_file
from longtail_operator import builders
from longtail_operator.settings import Settings
from longtail_workers.drafter_worker.service import build_parser as drafter_parser
from longtail_workers.podenv import PodEnvError, pod_args
from longtail_workers.rollout.service import build_parser as rollout_parser
from longtail_workers.trainer.service import build_parser as trainer_parser

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "01-tiny-arith.yaml"
JOB = builders.JobRef(name="tiny", namespace="ns", uid="uid-1")
SETTINGS = Settings(worker_port=9200, trainer_port=9300, weights_port=9301, verifier_port=9100)


def pod_env(role: str, tmp_path: Path, example: Path = EXAMPLE) -> tuple[list[str], dict[str, str]]:
    """(container args after ``worker ROLE``, env) of the operator's pod, config file on disk."""
    raw = yaml.safe_load(example.read_text())
    [result] = validate_file(example)
    assert result.spec is not None
    config = builders.job_configmap(JOB, raw["spec"])["data"][builders.CONFIG_FILE]
    (tmp_path / "rljob.yaml").write_text(config)
    pod = builders.worker_pod(JOB, result.spec, SETTINGS, role, 0)
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    env.update(LONGTAIL_CONFIG=str(tmp_path / "rljob.yaml"), LONGTAIL_POD_NAME=f"tiny-{role}-0")
    assert container["args"][:2] == ["worker", role]
    return container["args"][2:], env


def test_trainer_pod_finds_verifier_rollouts_and_resumes(tmp_path: Path) -> None:
    argv, env = pod_env("trainer", tmp_path)
    args = trainer_parser().parse_args(pod_args("trainer", argv, env))
    assert args.port == 9300 and args.host == "0.0.0.0" and args.weights_port == 9301
    assert args.job == env["LONGTAIL_CONFIG"]
    assert args.verifier_url == "http://tiny-verifier.ns.svc:9100"
    assert args.rollout == [  # 01-tiny-arith.yaml has 2 rollout replicas
        "tiny-rollout-0=http://tiny-rollout-0.tiny-rollout.ns.svc:9200",
        "tiny-rollout-1=http://tiny-rollout-1.tiny-rollout.ns.svc:9200",
    ]
    assert args.checkpoint_dir == env["LONGTAIL_CHECKPOINT_DIR"]
    assert args.resume is (env["LONGTAIL_RESUME"] == "true")


def test_rollout_pod_pulls_weights_from_the_trainer(tmp_path: Path) -> None:
    argv, env = pod_env("rollout", tmp_path)
    args = rollout_parser().parse_args(pod_args("rollout", argv, env))
    assert args.port == 9200 and args.name == "tiny-rollout-0"
    assert args.weights_url == "http://tiny-trainer-0.tiny-trainer.ns.svc:9301"
    assert args.job == env["LONGTAIL_CONFIG"]


def test_rollout_pod_exchanges_drafters_over_the_trainers_http_port(tmp_path: Path) -> None:
    argv, env = pod_env("rollout", tmp_path)
    assert env["LONGTAIL_DRAFTER_URL"] == "http://tiny-trainer-0.tiny-trainer.ns.svc:9300"
    args = rollout_parser().parse_args(pod_args("rollout", argv, env))
    assert args.drafters_url == env["LONGTAIL_DRAFTER_URL"] and args.drafters is None
    # The trainer keeps the registry under its checkpoint volume and serves it on --port 9300.
    targv, tenv = pod_env("trainer", tmp_path)
    targs = trainer_parser().parse_args(pod_args("trainer", targv, tenv))
    assert targs.drafters == f"{tenv['LONGTAIL_CHECKPOINT_DIR']}/drafters" and targs.port == 9300


def test_a_shared_drafter_volume_still_works_and_wins_over_the_url(tmp_path: Path) -> None:
    argv, env = pod_env("rollout", tmp_path)
    env["LONGTAIL_DRAFTER_DIR"] = "/shared/drafters"  # a user-mounted ReadWriteMany volume
    args = rollout_parser().parse_args(pod_args("rollout", argv, env))
    assert args.drafters == "/shared/drafters" and args.drafters_url is None
    mine = pod_args("rollout", [*argv, "--drafters-url", "http://t:1"], env)
    assert "--drafters" not in mine and mine.count("--drafters-url") == 1
    del env["LONGTAIL_DRAFTER_DIR"], env["LONGTAIL_DRAFTER_URL"]
    args = rollout_parser().parse_args(pod_args("rollout", argv, env))
    assert args.drafters is None and args.drafters_url is None  # drafterTraining disabled


def test_malformed_drafter_url_is_named(tmp_path: Path) -> None:
    argv, env = pod_env("rollout", tmp_path)
    env["LONGTAIL_DRAFTER_URL"] = "tiny-trainer-0:9300"
    with pytest.raises(PodEnvError, match="LONGTAIL_DRAFTER_URL='tiny-trainer-0:9300'"):
        pod_args("rollout", argv, env)


def test_explicit_arguments_win_and_outside_a_pod_nothing_changes(tmp_path: Path) -> None:
    argv, env = pod_env("rollout", tmp_path)
    mine = [*argv, "--weights-url", "http://elsewhere:1"]
    assert pod_args("rollout", mine, env).count("--weights-url") == 1
    assert pod_args("trainer", ["--job", "x.yaml"], {}) == ["--job", "x.yaml"]


def test_missing_variable_is_named(tmp_path: Path) -> None:
    argv, env = pod_env("trainer", tmp_path)
    del env["LONGTAIL_VERIFIER_SERVICE"]
    with pytest.raises(PodEnvError, match="LONGTAIL_VERIFIER_SERVICE"):
        pod_args("trainer", argv, env)


def test_drafter_pod_finds_the_trainer_and_its_weight_server(tmp_path: Path) -> None:
    argv, env = pod_env("drafter", tmp_path, EXAMPLE.with_name("05-tiny-arith-drafter-pod.yaml"))
    args = drafter_parser().parse_args(pod_args("drafter", argv, env))
    assert args.port == 9200 and args.host == "0.0.0.0" and args.name == "tiny-drafter-0"
    assert args.job == env["LONGTAIL_CONFIG"]
    assert args.trainer_url == "http://tiny-trainer-0.tiny-trainer.ns.svc:9300"
    assert args.weights_url == "http://tiny-trainer-0.tiny-trainer.ns.svc:9301"
    assert args.drafters_url in (None, args.trainer_url)  # the exchange is on the trainer's port
    del env["LONGTAIL_TRAINER_URL"]
    with pytest.raises(PodEnvError, match="LONGTAIL_TRAINER_URL is not set"):
        pod_args("drafter", argv, env)
