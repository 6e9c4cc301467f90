"""The sharded GRPO trainer (FSDP2, gloo) against the lone trainer, with real processes.

Two ``sharded_rank.py`` processes form a gloo group of 2 (rank 0 leads, rank 1 follows, as in
``longtail worker trainer``); this test process is the world-1 reference on the same model and
batches. Checked: one update at world 2 gives world 1's loss and weights (fp32, rtol 1e-5 on the
loss, atol 1e-5 on every weight); a DCP checkpoint written at world 2 resumes at world 1 and the
next update matches world 2's; the published weights' checksum is the gathered state's; a rank
that dies inside an update fails it on rank 0 with an error naming that rank, never a hang.
"""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sharded_rank
import torch
from httpcall import free_port
from tmpfs import small_disk

from longtail_workers.trainer.checkpoint import latest_checkpoint, read_state
from longtail_workers.trainer.world import TrainerWorld
from longtail_workers.weights.checksum import state_dict_checksum
from longtail_workers.weights.store import WeightStore, publish_state_dict

SCRIPT = Path(sharded_rank.__file__)
LOSS_RTOL, WEIGHT_ATOL = 1e-5, 1e-5


def start_world(scenario: str, out: Path, world: int = 2) -> list[subprocess.Popen[str]]:
    """Start every rank of ``sharded_rank.py SCENARIO`` (wait for them with :func:`wait_world`)."""
    port = free_port()
    return [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), scenario, str(r), str(world), str(port), str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]


def wait_world(
    procs: list[subprocess.Popen[str]], scenario: str, timeout_s: float = 240
) -> list[tuple[int, str]]:
    """Wait for every rank (bounded: a hang fails the test), return ``(rc, output)`` each."""
    results = []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"{scenario}: a rank hung (no exit in {timeout_s:g} s)")
        results.append((p.returncode, text))
    return results


def run_world(scenario: str, out: Path, world: int = 2) -> list[tuple[int, str]]:
    """Start every rank, wait (bounded: a hang fails the test), return ``(rc, output)`` each."""
    return wait_world(start_world(scenario, out, world), scenario)


def assert_close_states(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        diff = (a[key].float() - b[key].float()).abs().max().item()
        assert diff <= WEIGHT_ATOL, f"{key}: max |world2 - world1| = {diff}"


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("world2")
    results = run_world("steps", out)
    for rank, (rc, text) in enumerate(results):
        assert rc == 0, f"rank {rank} exited {rc}:\n{text[-3000:]}"
    return torch.load(out / "result.pt", weights_only=False), out


def test_one_update_at_world_2_equals_world_1(two_ranks: tuple[dict[str, Any], Path]) -> None:
    torch.set_num_threads(1)
    got, _ = two_ranks
    policy = sharded_rank.tiny_policy(TrainerWorld())
    first, _ = sharded_rank.batches()
    stats = policy.train(first, 1)
    assert stats.loss == pytest.approx(got["stats1"].loss, rel=LOSS_RTOL)
    assert stats.grad_norm == pytest.approx(got["stats1"].grad_norm, rel=LOSS_RTOL)
    assert stats.entropy == pytest.approx(got["stats1"].entropy, rel=LOSS_RTOL)  # summed
    assert stats.tokens == got["stats1"].tokens and stats.sequences == got["stats1"].sequences
    assert got["stats1"].micro_batches >= 3  # rank 0 and rank 1 each packed their own rows
    assert_close_states(got["full1"], policy.full_state() or {})
    untouched = sharded_rank.tiny_policy(TrainerWorld()).full_state() or {}
    moved = max((got["full1"][k] - untouched[k]).abs().max().item() for k in untouched)
    assert moved > 50 * WEIGHT_ATOL  # the update moved weights far beyond the tolerance


def test_dcp_checkpoint_of_world_2_resumes_at_world_1(
    two_ranks: tuple[dict[str, Any], Path],
) -> None:
    torch.set_num_threads(1)
    got, out = two_ranks
    found = latest_checkpoint(out / "ckpt")
    assert found is not None and found.name == "step-000001"
    assert (found / "dcp" / ".metadata").is_file() and read_state(found).world_size == 2
    assert read_state(found).model_sha256 == state_dict_checksum(got["full1"])
    policy = sharded_rank.tiny_policy(TrainerWorld())
    state = policy.load(found)  # verifies the checksum of what it loaded
    assert state.step == 1 and state.policy_version == 1
    assert state_dict_checksum(policy.full_state() or {}) == state.model_sha256
    _, second = sharded_rank.batches()
    stats = policy.train(second, 2)  # needs the AdamW moments of step 1 to match
    assert stats.loss == pytest.approx(got["stats2"].loss, rel=LOSS_RTOL)
    assert_close_states(got["full2"], policy.full_state() or {})


def test_published_checksum_is_the_gathered_states(two_ranks: tuple[dict[str, Any], Path]) -> None:
    got, _ = two_ranks
    reference = sharded_rank.tiny_policy(TrainerWorld()).model.state_dict()
    gathered = got["full2"]
    assert {k: v.shape for k, v in gathered.items()} == {k: v.shape for k, v in reference.items()}
    content = publish_state_dict(WeightStore(keep_last=1), 2, gathered).content_sha256()
    assert content == state_dict_checksum(gathered)
    assert content != state_dict_checksum(got["full1"])


def test_a_stop_on_rank_0_abandons_the_update_on_every_rank(tmp_path: Path) -> None:
    results = run_world("abandon", tmp_path)
    assert [rc for rc, _ in results] == [0, 0], [text[-3000:] for _, text in results]
    got = torch.load(tmp_path / "result.pt", weights_only=False)
    assert "abandoned before micro-batch 2 of" in got["abandoned"], got["abandoned"]
    # Update 1 left nothing behind (weights, AdamW moments): update 2 equals a lone update 2.
    torch.set_num_threads(1)
    policy = sharded_rank.tiny_policy(TrainerWorld())
    _, second = sharded_rank.batches()
    stats = policy.train(second, 2)
    assert stats.loss == pytest.approx(got["stats2"].loss, rel=LOSS_RTOL)
    assert_close_states(got["full2"], policy.full_state() or {})


def test_a_rank_dying_mid_update_fails_it_naming_the_rank(tmp_path: Path) -> None:
    (rc0, text0), (rc1, _) = run_world("die", tmp_path)
    assert rc1 == 1  # rank 1 exited inside its forward pass
    assert rc0 == 0, text0[-3000:]
    error = (tmp_path / "error.txt").read_text()
    assert "trainer rank(s) 1 of 2 stopped during the GRPO update of step 1" in error, error
    assert error.endswith("ranks=[1]")


def test_a_full_disk_fails_the_sharded_checkpoint_on_every_rank_with_the_reason(
    tmp_path: Path,
) -> None:
    with small_disk(tmp_path / "disk", "64k") as disk:
        results = run_world("diskfull", tmp_path)
        assert [rc for rc, _ in results] == [0, 0], [text[-3000:] for _, text in results]
        for rank in (0, 1):
            error = (tmp_path / f"error-{rank}.txt").read_text()
            assert error.startswith(f"errno={errno.ENOSPC}\n"), error
            assert "No space left on device" in error, error
            assert f"could not be written to {disk / 'step-000001'}" in error, error
        assert latest_checkpoint(disk) is None and not list(disk.glob(".tmp-*"))


def test_rows_are_dealt_once_each_longest_first_to_the_lightest_rank() -> None:
    first, _ = sharded_rank.batches()
    from longtail_workers.trainer.batch import shard_rows

    dealt = shard_rows(first, 2)
    assert sorted(dealt[0] + dealt[1]) == [0, 1, 2, 4, 5, 6]  # row 3 carries no loss
    lengths = first.attention_mask.sum(dim=1).tolist()
    loads = [sum(lengths[i] for i in rows) for rows in dealt]
    assert abs(loads[0] - loads[1]) <= max(lengths)
    assert shard_rows(first, 1) == [[0, 1, 2, 4, 5, 6]]
    assert shard_rows(first, 8)[7] == []  # more ranks than rows: some train on filler passes
