"""The trainer pod's W&B key comes from the Secret ``spec.tracking.wandb.apiKeySecret`` names."""

from __future__ import annotations

from optest import JOB, example, spec_of

from longtail_operator import builders
from longtail_operator.settings import Settings


def test_trainer_pod_gets_the_wandb_key_from_the_named_secret_only() -> None:
    settings = Settings(worker_image="img:1")
    ref = {"name": "team-wandb", "key": "token"}
    spec = spec_of(example(tracking={"wandb": {"project": "rl", "apiKeySecret": ref}}))
    trainer = builders.worker_pod(JOB, spec, settings, "trainer", 0)
    env = trainer["spec"]["containers"][0]["env"]
    assert {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": ref}} in env
    rollout = builders.worker_pod(JOB, spec, settings, "rollout", 0)
    assert all(e["name"] != "WANDB_API_KEY" for e in rollout["spec"]["containers"][0]["env"])
    plain = builders.worker_pod(JOB, spec_of(example()), settings, "trainer", 0)
    assert all(e["name"] != "WANDB_API_KEY" for e in plain["spec"]["containers"][0]["env"])
