"""One rank of a real 2-process gloo trainer group, for ``test_trainer_sharded.py``.

Run as ``python sharded_rank.py SCENARIO RANK WORLD PORT OUT``. Rank 0 leads through
:class:`~longtail_workers.trainer.group.PolicyLeader`, the other ranks run
:func:`~longtail_workers.trainer.group.follow`, exactly as ``longtail worker trainer`` does.
Scenarios: ``steps`` (update 1, gather, DCP checkpoint, update 2, gather; rank 0 saves what it
saw to ``OUT/result.pt``), ``abandon`` (update 1 abandoned by rank 0's stop after its first
micro-batch, then update 2; ``OUT/result.pt``), ``die`` (rank 1 exits in its first forward
pass; rank 0 writes the error it got to ``OUT/error.txt``) and ``diskfull`` (update 1, then a
DCP checkpoint into ``OUT/disk``, a full filesystem the test mounted; each rank writes the error
it got to ``OUT/error-RANK.txt``). For ``test_weight_sync_stream.py``: ``publish`` (rank 0 serves
the policy over HTTP and publishes versions 1-3 with updates between them, each streamed from
every rank's gathers; before version 2 a publisher that stops after two tensors, before
version 3 one that abandons its first pass and retries; rank 0 saves what it published, pulled
and gathered to ``OUT/result.pt``) and ``killsync`` (rank 1 SIGKILLs itself in the middle of
the second version's gather; rank 0 writes the error it got to ``OUT/error.txt``). For
``test_weight_sync_sharded_broadcast.py``: ``broadcast`` (the ``builtin:tiny`` policy; rank 0
runs the broadcast publisher and writes its addresses to ``OUT/endpoints.json``, waits for the
receivers named in ``OUT/receivers.json``, then broadcasts versions 1-3 with updates between
them, waiting after each until every receiver has loaded it; what it published and gathered
goes to ``OUT/result.json``). The model and batches come from :func:`tiny_policy` and
:func:`batches`, which the test also uses for its world-1 reference.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch

from longtail_api.rendezvous import TrainerRendezvous
from longtail_workers.trainer.batch import GrpoBatch
from longtail_workers.trainer.checkpoint import CheckpointWriteError
from longtail_workers.trainer.group import CommandChannel, PolicyLeader, follow
from longtail_workers.trainer.optim import TrainConfig, UpdateAbandoned
from longtail_workers.trainer.policy import Policy
from longtail_workers.trainer.sharding import shard_policy
from longtail_workers.trainer.world import TrainerRankError, TrainerWorld, join_world
from longtail_workers.weights.checksum import state_dict_checksum
from longtail_workers.weights.http_sync import HttpWeightClient, WeightServer
from longtail_workers.weights.store import WeightStore
from longtail_workers.weights.sync import TensorMeta, TensorStream, WeightsManifest

PIECE = 4096
"""Small pieces: the tiny policy's larger tensors span several."""

# adam_eps well above the smallest gradients: a 1e-9 summation-order difference in a ~0 gradient
# must not flip the sign of Adam's first update between world sizes.
CFG = TrainConfig(learning_rate=1e-3, adam_eps=1e-3, kl_coef=0.1, micro_batch_tokens=24)


def tiny_policy(world: TrainerWorld) -> Policy:
    # tests/doubles is on sys.path through tests/conftest.py in the test, through __main__ below
    # when run as a script.
    from tiny_targets import tiny_qwen2

    model = tiny_qwen2(seed=7, vocab_size=32, hidden_size=32, intermediate_size=64)
    return Policy(shard_policy(model, world, activation_checkpointing=False), CFG, world)


def builtin_policy(world: TrainerWorld) -> Policy:
    """``builtin:tiny`` (a model vLLM can load too), fp32, sharded over ``world``."""
    from longtail_workers.models.loading import load_policy

    model, _ = load_policy("builtin:tiny", dtype="float32")
    return Policy(shard_policy(model, world, activation_checkpointing=False), CFG, world)


def batches() -> list[GrpoBatch]:
    """Two seeded batches of 7 rows (uneven lengths: the ranks get different micro-batch counts;
    row 3 has no response token at all)."""
    out = []
    gen = torch.Generator().manual_seed(11)
    for _ in range(2):
        rows, width = 7, 12
        ids = torch.randint(0, 32, (rows, width), generator=gen)  # [B, T]
        attention = torch.zeros(rows, width, dtype=torch.long)  # [B, T]
        response = torch.zeros(rows, width, dtype=torch.long)  # [B, T]
        for r in range(rows):
            prompt, answer = 2 + r % 3, (1 + 3 * r) % 9
            attention[r, : prompt + answer] = 1
            response[r, prompt : prompt + answer] = 1
        response[3] = 0
        old = -torch.rand(rows, width, generator=gen) * 4  # [B, T]
        ref = -torch.rand(rows, width, generator=gen) * 4  # [B, T]
        adv = torch.randn(rows, generator=gen)  # [B]
        out.append(GrpoBatch(ids, attention, response, old, adv, ref))
    return out


def lead(policy: Policy, channel: CommandChannel, scenario: str, out: Path) -> None:
    leader = PolicyLeader(policy, channel)
    if scenario == "publish":
        publish_three(leader, out)
        return
    if scenario == "killsync":
        killed_mid_sync(leader, out)
        return
    if scenario == "broadcast":
        broadcast_three(leader, out)
        return
    first, second = batches()
    if scenario == "abandon":
        abandon_then_train(leader, first, second, out)
        return
    if scenario == "die":
        try:
            leader.train(first, 1)
        except TrainerRankError as exc:
            (out / "error.txt").write_text(f"{exc}\nranks={exc.ranks}")
            return
        (out / "error.txt").write_text("no error")
        return
    stats1 = leader.train(first, 1)
    if scenario == "diskfull":
        save = partial(leader.save, out / "disk", step=1, model_sha256=None, policy_version=1,
                       drafter_version=-1, keep_last=2)  # fmt: skip
        save_onto_a_full_disk(save, out, 0)
        return
    full1 = leader.full_state()
    leader.save(out / "ckpt", step=1, model_sha256=None, policy_version=1, drafter_version=-1,
                keep_last=2)  # fmt: skip
    stats2 = leader.train(second, 2)
    full2 = leader.full_state()
    leader.close(True)
    torch.save({"stats1": stats1, "full1": full1, "stats2": stats2, "full2": full2},
               out / "result.pt")  # fmt: skip


def abandon_then_train(
    leader: PolicyLeader, first: GrpoBatch, second: GrpoBatch, out: Path
) -> None:
    """Rank 0 is asked to stop after the first micro-batch of update 1 (rank 1 is never asked
    itself); then update 2 runs whole on both ranks."""
    asked = iter([False])  # the first check says go on, every later one says stop
    try:
        leader.train(first, 1, stop=lambda: next(asked, True))
        abandoned = "not abandoned"
    except UpdateAbandoned as exc:
        abandoned = str(exc)
    stats2 = leader.train(second, 2)  # no rank was left in a collective of update 1
    full2 = leader.full_state()
    leader.close(True)
    torch.save({"abandoned": abandoned, "stats2": stats2, "full2": full2}, out / "result.pt")


class StopsEarly(WeightStore):
    """A transport that fails after taking two tensors of its pass (a receiver lost)."""

    def publish_stream(
        self, version: int, layout: Sequence[TensorMeta], tensors: TensorStream
    ) -> WeightsManifest:
        stream = tensors()
        next(stream), next(stream)
        raise ConnectionError("receiver lost after two tensors")


class RetriesOnce(WeightStore):
    """A transport whose first attempt stops after three tensors; it retries with a new pass."""

    def publish_stream(
        self, version: int, layout: Sequence[TensorMeta], tensors: TensorStream
    ) -> WeightsManifest:
        stream = tensors()
        next(stream), next(stream), next(stream)
        return super().publish_stream(version, layout, tensors)


def publish_three(leader: PolicyLeader, out: Path) -> None:
    """Versions 1-3 over HTTP with an update before 2 and 3; what each looked like."""
    seen: dict[str, object] = {"versions": []}
    with WeightServer(WeightStore(piece_bytes=PIECE, keep_last=3)) as server:
        for version, batch in zip((1, 2, 3), (None, *batches()), strict=True):
            if batch is not None:
                leader.train(batch, version - 1)
            if version == 2:  # left after two tensors: the followers' pass is drained
                try:
                    leader.publish(StopsEarly(), version)
                except ConnectionError as exc:
                    seen["stopped_early"] = str(exc)
            retried = RetriesOnce(piece_bytes=PIECE) if version == 3 else None
            if retried is not None:
                seen["retried"] = leader.publish(retried, version).content_sha256()
            published = leader.publish(server.store, version)
            manifest = published.manifest()
            _, pulled = HttpWeightClient(server.url, timeout_s=30).fetch(version)
            gathered = leader.full_state()  # the whole state dict, as publishing once did
            seen["versions"].append({  # type: ignore[attr-defined]
                "manifest": published.content_sha256(), "pieces": len(manifest.pieces),
                "pulled": state_dict_checksum(pulled), "gathered": state_dict_checksum(gathered),
                "phases": published.phases, "layout": leader.policy.layout,
            })  # fmt: skip
    leader.close(True)
    torch.save(seen, out / "result.pt")


def broadcast_three(leader: PolicyLeader, out: Path) -> None:
    """Versions 1-3 broadcast to the receivers (updates between them); see the module text."""
    from longtail_workers.weights.broadcast import Broadcast
    from longtail_workers.weights.plan import BroadcastConfig

    names = json.loads((out / "receivers.json").read_text())
    result: dict[str, Any] = {"versions": []}
    store = WeightStore(keep_last=2)
    with WeightServer(store) as server:
        config = BroadcastConfig(bucket_bytes=256 << 10, phase_timeout_s=30.0)
        broadcast = Broadcast(0, config)
        store.attach(broadcast)
        try:
            addr = f"127.0.0.1:{broadcast.port}"
            (out / "endpoints.json").write_text(json.dumps({"addr": addr, "url": server.url}))
            until(lambda: set(names) <= set(broadcast.roster.live()), 240, f"{names} registered")
            for version, batch in zip((1, 2, 3), (None, *batches()), strict=True):
                if batch is not None:
                    leader.train(batch, version - 1)
                published = leader.publish(store, version)
                gathered = state_dict_checksum(leader.full_state())
                phases, content = published.phases, published.content_sha256()
                result["versions"].append({
                    "version": version, "manifest": content, "gathered": gathered,
                    "receivers": phases.receivers, "dropped": phases.dropped,
                    "attempts": phases.attempts, "gather_s": phases.gather_s,
                })  # fmt: skip
                until(lambda v=version: all(loaded(out, n) >= v for n in names), 120,
                      f"every receiver loaded version {version}")  # fmt: skip
        finally:
            broadcast.close()
    leader.close(True)
    (out / "result.json").write_text(json.dumps(result))


def loaded(out: Path, name: str) -> int:
    """The newest version receiver ``name`` reports loaded (0: none yet)."""
    path = out / f"{name}.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return max((json.loads(x).get("version", 0) for x in lines if x.strip()), default=0)


def until(done: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout_s:g}s: {what}")
        time.sleep(0.1)


def killed_mid_sync(leader: PolicyLeader, out: Path) -> None:
    """Version 1 publishes; rank 1 dies in the middle of version 2's gathers."""
    store = WeightStore(keep_last=1, piece_bytes=PIECE)
    leader.publish(store, 1)
    t0 = time.monotonic()
    try:
        leader.publish(store, 2)
    except TrainerRankError as exc:
        (out / "error.txt").write_text(f"{exc}\nranks={exc.ranks}\nseconds={time.monotonic() - t0}")
        leader.close(False)
        return
    (out / "error.txt").write_text("no error")


def die_in_second_pass(policy: Policy) -> None:
    """Rank 1 SIGKILLs itself after gathering 3 tensors of its second pass."""
    inner, passes = policy.gather_pass, [0]

    def dying() -> Iterator[torch.Tensor]:
        passes[0] += 1
        for i, tensor in enumerate(inner()):
            if passes[0] == 2 and i == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            yield tensor

    policy.gather_pass = dying  # type: ignore[method-assign]


def save_onto_a_full_disk(save: Callable[[], object], out: Path, rank: int) -> None:
    try:
        save()
    except CheckpointWriteError as exc:
        (out / f"error-{rank}.txt").write_text(f"errno={exc.errno}\n{exc}")
    else:
        (out / f"error-{rank}.txt").write_text("no error")
    # Leave together: rank 0 hosts the rendezvous store, and a rank whose heartbeat is still in
    # a store call when the store's process has gone can abort at its own exit ("terminate
    # called without an active exception", exit -6) after doing everything the test checks.
    torch.distributed.barrier()


def follow_onto_a_full_disk(policy: Policy, channel: CommandChannel, out: Path, rank: int) -> int:
    """A follower until the save fails on it (as in ``follow``, which lets the error out)."""
    save_onto_a_full_disk(partial(follow, policy, channel), out, rank)
    return 0


def main(scenario: str, rank: int, world_size: int, port: int, out: Path) -> int:
    torch.set_num_threads(1)
    rendezvous = TrainerRendezvous("127.0.0.1", port, nnodes=world_size, node_rank=rank)
    world = join_world(rendezvous, 0, "cpu", timeout_s=60.0)
    policy = builtin_policy(world) if scenario == "broadcast" else tiny_policy(world)
    if scenario == "die" and rank == 1:
        layer = policy.model.model.layers[1]  # type: ignore[union-attr,index]
        layer.register_forward_pre_hook(lambda *_: os._exit(1))  # dies inside the update
    if scenario == "killsync" and rank == 1:
        die_in_second_pass(policy)
    channel = CommandChannel(world)
    try:
        if rank == 0:
            lead(policy, channel, scenario, out)
            return 0
        if scenario == "diskfull":
            return follow_onto_a_full_disk(policy, channel, out, rank)
        return follow(policy, channel)
    finally:
        # As the trainer service does: stop the heartbeat and leave the group before exiting
        # (otherwise a rank can abort at exit, "terminate called without an active exception").
        world.close()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "doubles"))
    scenario, rank, world_size, port, out = sys.argv[1:6]
    sys.exit(main(scenario, int(rank), int(world_size), int(port), Path(out)))
