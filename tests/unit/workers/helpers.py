"""Small pieces several worker-test modules share (imported by name: ``conftest.py`` puts this
directory on sys.path): speculative decoding at one draft depth and the accepted length it
reaches, a drafter whose weights all hold one value, the trainer and upload a drafter
candidate goes through, and the CLI run where vLLM cannot be imported."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
from httpcall import http
from tiny_targets import random_prompts

from longtail_api.policies import SelectorSpec, SpeculativeSpec, StrategySpec
from longtail_workers.drafter.checkpoint import save_drafter
from longtail_workers.drafter.exchange import CANDIDATES_PATH, CHECKSUM_HEADER, DrafterEndpoints
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.payload import pack_files
from longtail_workers.drafter.registry import DrafterRegistry
from longtail_workers.drafter.vetting import DrafterReference
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import TorchEngine
from longtail_workers.trainer.service import TrainerApp


def fixed_sd(depth: int = 3, threshold: int = 64, warmup: int = 0) -> SpeculativeSpec:
    """Speculative decoding at one draft ``depth`` (the ``fixed`` selector), from step
    ``warmup`` on while a batch holds at most ``threshold`` rows."""
    return SpeculativeSpec(
        enabled=True,
        batch_threshold=threshold,
        warmup_steps=warmup,
        strategies=[StrategySpec(draft_depth=depth)],
        selector=SelectorSpec(type="fixed"),
    )


def mean_accepted_length(
    target: torch.nn.Module, drafter: EagleDrafter, temperature: float = 1.0
) -> float:
    """The engine's mean accepted length drafting with ``drafter`` (:func:`fixed_sd`) on 16
    held-out prompts (seed 99) the fitting tests never train on."""
    engine = TorchEngine(target, speculative=fixed_sd(), drafter=drafter)
    prompts = random_prompts(99, 16, target.config.vocab_size)
    engine.generate(
        [GenerationRequest(p, 32, temperature=temperature, seed=i) for i, p in enumerate(prompts)]
    )
    return engine.stats.mean_accepted_length


def constant_drafter(
    target: torch.nn.Module, value: float, target_id: str, **layout: bool
) -> EagleDrafter:
    """A drafter on ``target`` whose every own weight is ``value`` (NaN and inf included)."""
    drafter = EagleDrafter(target, target_id=target_id, **layout)
    with torch.no_grad():
        for p in drafter.parameters():
            p.fill_(value)
    return drafter


POLICY_VERSION = 2
"""The trainer's policy version in :func:`started_trainer`: uploads may name 0 to 2."""


@contextlib.contextmanager
def started_trainer(
    target: torch.nn.Module, root: Path, target_id: str
) -> Iterator[tuple[TrainerApp, DrafterRegistry]]:
    """A started trainer whose registry checks candidates against the job's drafter."""
    app = TrainerApp("127.0.0.1", 0).start()
    registry = DrafterRegistry(
        root / "drafters",
        reference=DrafterReference.of(EagleDrafter(target, target_id=target_id)),
        on_rejected=app.metrics.candidate_rejected,
    )
    app.drafters = DrafterEndpoints(registry, policy_version=lambda: POLICY_VERSION)
    try:
        yield app, registry
    finally:
        app.stop(grace_s=1.0)


def candidate_body(drafter: EagleDrafter, tmp_path: Path) -> bytes:
    """``drafter`` saved and packed as a candidate upload's body."""
    directory = save_drafter(drafter, tmp_path / "cand")
    return pack_files({p.name: p.read_bytes() for p in directory.iterdir()})


def post_candidate(url: str, body: bytes, checksum: str, query: str) -> tuple[int, str]:
    """``POST /v1/drafters/candidates?query``: (status, the body, or a refusal's error)."""
    status, _, raw = http(
        f"{url}{CANDIDATES_PATH}?{query}", "POST", body, {CHECKSUM_HEADER: checksum}, timeout=5.0
    )
    return status, raw.decode() if status < 400 else json.loads(raw)["error"]


def rejected_metric(app: TrainerApp, stage: str, reason: str | None = None) -> float:
    """The trainer's count of candidates refused at ``stage`` (for ``reason``; None: any)."""
    text = http(app.url + "/metrics")[2].decode()
    name = "longtail_trainer_drafter_candidates_rejected_total{"
    found = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if labels.get("stage") == stage and reason in (None, labels.get("reason")):
            found += float(line.split()[-1])
    return found


def cli_without_vllm(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m longtail_cli.main *args`` where ``import vllm`` fails as it does in an
    environment without vLLM (a shadow package on PYTHONPATH), with ``env`` added."""
    shadow = tmp_path / "no-vllm" / "vllm"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'vllm'\", name='vllm')\n"
    )
    return subprocess.run(
        [sys.executable, "-m", "longtail_cli.main", *args],
        env={**os.environ, "PYTHONPATH": str(shadow.parent), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
