"""Trainer checkpoints (atomic, pruned, verified) and rollout results -> GRPO batch tensors.

A full disk is a real one: a tmpfs of a few hundred KiB (``tests/doubles/tmpfs.py``, root
only), and a per-process file-size limit (``RLIMIT_FSIZE``, any user) in a subprocess.
"""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_targets import tiny_qwen2
from tmpfs import resize, small_disk

from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import TorchEngine
from longtail_workers.trainer.checkpoint import (
    CheckpointError,
    CheckpointWriteError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from longtail_workers.trainer.grpo import sequence_logprobs
from longtail_workers.trainer.optim import TrainConfig, build_optimizer
from longtail_workers.trainer.rollout_batch import build_grpo_batch
from longtail_workers.wire.rollout import Sample


def _model(seed: int = 0, *, big: bool = False) -> torch.nn.Module:
    if big:  # tensors over the writer's buffer: torch's zip writer fails mid-tensor
        return tiny_qwen2(seed=seed, vocab_size=512, hidden_size=128, intermediate_size=256)
    return tiny_qwen2(seed=seed, vocab_size=32, hidden_size=32, intermediate_size=64)


def _save(root: Path, step: int, model: torch.nn.Module, keep: int = 2) -> Path:
    opt = build_optimizer(model, TrainConfig(learning_rate=1e-3))
    return save_checkpoint(root, step=step, model=model, optimizer=opt, policy_version=step,
                           drafter_version=-1, keep_last=keep, extra={"x": 1})  # fmt: skip


def test_save_load_round_trip_and_keep_last(tmp_path: Path) -> None:
    a, b = _model(0), _model(1)
    for step in (1, 2, 3):
        _save(tmp_path, step, a)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 3]  # keep_last=2
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and latest.name == "step-000003"
    opt = build_optimizer(b, TrainConfig(learning_rate=1e-3))
    state = load_checkpoint(latest, b, opt)
    assert state.step == 3 and state.policy_version == 3 and state.extra == {"x": 1}
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values(),
                                                 strict=True))  # fmt: skip


def test_debris_of_a_crashed_write_is_ignored_and_cleaned(tmp_path: Path) -> None:
    model = _model()
    _save(tmp_path, 1, model)
    (tmp_path / ".tmp-dead").mkdir()  # a writer killed mid-checkpoint
    (tmp_path / "step-000009").mkdir()  # renamed dir without state.json never counts
    assert latest_checkpoint(tmp_path).name == "step-000001"  # type: ignore[union-attr]
    _save(tmp_path, 2, model)
    assert not (tmp_path / ".tmp-dead").exists()


def test_corrupt_weights_are_refused(tmp_path: Path) -> None:
    path = _save(tmp_path, 1, _model())
    state = json.loads((path / "state.json").read_text())
    state["model_sha256"] = "0" * 64
    (path / "state.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(path, _model(), None)


# (model, tmpfs size): one checkpoint fits, a second does not. The small model's shard fails when
# its file is closed (OSError from DCP); the big one's inside torch.save, where torch reports
# only "unexpected pos 704 vs 598" (issue #32 item 7) with the OSError as its context.
@pytest.mark.parametrize(("big", "size"), [(False, "700k"), (True, "8m")], ids=["close", "zip"])
def test_a_full_disk_names_the_reason_and_the_path_and_keeps_the_last_checkpoint(
    tmp_path: Path, big: bool, size: str
) -> None:
    model = _model(big=big)
    with small_disk(tmp_path / "disk", size) as root:
        _save(root, 1, model, keep=5)
        with pytest.raises(CheckpointWriteError) as caught:
            _save(root, 2, model, keep=5)
        err = caught.value
        assert err.errno == errno.ENOSPC
        text = str(err)
        assert "No space left on device" in text and "unexpected pos" not in text, text
        assert f"could not be written to {root / 'step-000002'}:" in text, text
        assert f"the last complete checkpoint, {root / 'step-000001'}, is intact" in text, text
        assert f"Free space in {root} or move it to a larger disk" in text, text
        if big:
            assert "unexpected pos" in repr(err.__cause__)  # what torch alone said
        # The failed write left nothing behind, and the last checkpoint still loads (checksum).
        assert [s for s, _ in list_checkpoints(root)] == [1]
        assert not list(root.glob(".tmp-*"))
        state = load_checkpoint(root / "step-000001", _model(1, big=big), None)
        assert state.step == 1
        resize(root, "30m")  # space freed: the next save works
        written = _save(root, 2, model, keep=5)
        assert latest_checkpoint(root) == written


FSIZE_SCRIPT = """
import json, resource, signal, sys
sys.path.insert(0, sys.argv[2])
from tiny_targets import tiny_qwen2
from longtail_workers.trainer.checkpoint import CheckpointWriteError, save_checkpoint
model = tiny_qwen2(seed=0, vocab_size=32, hidden_size=32, intermediate_size=64)
save = lambda step: save_checkpoint(sys.argv[1], step=step, model=model, optimizer=None,
                                    policy_version=step, drafter_version=-1, keep_last=5)
save(1)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    save(2)
except CheckpointWriteError as exc:
    print(json.dumps({"errno": exc.errno, "text": str(exc)}))
"""


def test_a_file_size_limit_is_reported_with_the_os_reason(tmp_path: Path) -> None:
    """Any user: RLIMIT_FSIZE makes the kernel refuse the write (EFBIG), as a quota would."""
    doubles = Path(__file__).resolve().parents[3] / "doubles"
    done = subprocess.run(
        [sys.executable, "-c", FSIZE_SCRIPT, str(tmp_path), str(doubles)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["errno"] == errno.EFBIG
    assert "File too large" in got["text"] and str(tmp_path / "step-000002") in got["text"]
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1]
    assert not list(tmp_path.glob(".tmp-*"))


def test_batch_from_engine_results_reproduces_rollout_logprobs() -> None:
    torch.set_num_threads(1)
    model = _model(3)
    engine = TorchEngine(model)
    results = engine.generate(
        [GenerationRequest([1, 2, 3][: 1 + i % 3], 8, seed=i) for i in range(5)]
    )
    batch = build_grpo_batch(results, [0.5, -0.5, 1.0, 0.0, -1.0], pad_id=0)
    assert batch.advantages.tolist() == [0.5, -0.5, 1.0, 0.0, -1.0]
    for row, r in enumerate(results):
        p, o = len(r.prompt_token_ids), len(r.output_token_ids)
        assert batch.response_mask[row].tolist() == [0] * p + [1] * o + [0] * (
            batch.input_ids.shape[1] - p - o
        )
    with torch.no_grad():
        lp = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask)
    mask = batch.response_mask.bool()
    assert torch.allclose(lp[mask], batch.old_logprobs[mask], atol=1e-4)


def test_inconsistent_samples_and_advantages_are_refused() -> None:
    # A sample whose log-probs do not match its tokens cannot even be made (nor read off the
    # wire), so no batch is ever built from one.
    with pytest.raises(ValueError, match="2 output tokens but 1 log-probs"):
        Sample("x", [1, 2], [3, 4], [-0.1], "stop")
    ok = Sample("x", [1, 2], [3, 4], [-0.1, -0.2], "stop")
    with pytest.raises(ValueError, match="one advantage per answer"):
        build_grpo_batch([ok], [1.0, 2.0], pad_id=0)
