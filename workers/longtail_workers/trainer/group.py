"""Rank 0 leads, the other trainer ranks follow: one command per collective operation.

Rank 0 runs the RL loop (``trainer/driver.py``) and reaches the policy only through
:class:`PolicyLeader`; every other rank runs :func:`follow` (``trainer/service.py``). Before
each operation the leader posts a command in the rendezvous store (:class:`CommandChannel`,
typed in ``wire/ranks.py``: ``train``, ``stream``, ``gather``, ``save``, ``load``, then ``stop``
or ``abort`` at the end);
the followers poll for it, so their wait between steps (a rollout can take many minutes) is
bounded by nothing but rank 0's liveness: the store lives in rank 0, and when it is gone the
poll fails at once. The operation itself is a collective with the process group's timeout. A
``train`` command is followed by the step's whole
:class:`~longtail_workers.trainer.batch.GrpoBatch` (reference log-probs included), broadcast
from rank 0; each rank trains on its own rows of it.
At world 1 there is no channel and the leader calls the policy directly.

A weight sync (:meth:`PolicyLeader.publish`) hands the publisher a :class:`GatherStream`: each
call announces ``stream`` and returns a pass over the policy's whole tensors, gathered one by
one in the layout's order on every rank (:meth:`Policy.gather_pass`); rank 0 yields them to the
publisher, the followers drop them. The followers run every pass to its end, so rank 0 must too:
a pass the publisher leaves unfinished (an error while packing or sending, a broadcast attempt
that failed) is drained by rank 0 (the remaining gathers run, their tensors dropped) before the
next pass starts and before ``publish`` returns or raises, so no follower is left in a gather.
A pass that failed because a rank stopped is not drained (the group is broken): its
:class:`~longtail_workers.trainer.world.TrainerRankError` is what ``publish`` raises.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from longtail_workers.trainer.batch import GrpoBatch
from longtail_workers.trainer.checkpoint import CheckpointState
from longtail_workers.trainer.optim import StepStats, UpdateAbandoned
from longtail_workers.trainer.policy import Policy
from longtail_workers.trainer.sharding import StateDict
from longtail_workers.trainer.world import TrainerRankError, TrainerWorld
from longtail_workers.weights.sync import Published, WeightPublisher
from longtail_workers.wire.ranks import (
    Abort,
    Gather,
    Load,
    RankCommand,
    Save,
    Stop,
    Stream,
    Train,
    decode,
    encode,
)

log = logging.getLogger(__name__)

POLL_S = 0.05
"""How often a follower asks the store for the next command (a cheap round trip)."""


class CommandChannel:
    """Rank 0 -> followers, in order: each command as JSON in the store (``wire/ranks.py``)."""

    def __init__(self, world: TrainerWorld) -> None:
        if world.store is None:
            raise ValueError("a command channel needs the trainer group's store (world > 1)")
        self.world, self.store, self.seq = world, world.store, 0

    def _key(self) -> str:
        return f"longtail/cmd/{self.seq}"

    def send(self, command: RankCommand) -> None:
        self.store.set(self._key(), encode(command))
        self.seq += 1

    def receive(self) -> RankCommand:
        """The next command; :class:`TrainerRankError` when rank 0 (the store) is gone."""
        key = self._key()
        try:
            while not self.store.check([key]):
                time.sleep(POLL_S)
            text = self.store.get(key)
        except (RuntimeError, ConnectionError, OSError) as exc:
            raise TrainerRankError(
                f"trainer rank 0 stopped (its rendezvous store stopped answering) while rank "
                f"{self.world.rank} waited for command {self.seq}: {exc}; see rank 0's log",
                [0],
            ) from exc
        self.seq += 1
        return decode(text)


@dataclass
class PolicyLeader:
    """Rank 0's handle on the policy: announce each operation, then run it here too."""

    policy: Policy
    channel: CommandChannel | None = None
    """None at world 1 (nobody to tell)."""

    @property
    def world(self) -> TrainerWorld:
        return self.policy.world

    def _announce(self, command: RankCommand) -> None:
        if self.channel is not None:
            self.channel.send(command)

    def train(
        self, batch: GrpoBatch, step: int, stop: Callable[[], bool] | None = None
    ) -> StepStats:
        """The update of ``step`` on every rank; ``stop`` abandons it (``UpdateAbandoned``)."""
        self._announce(Train(step))
        if self.world.sharded:
            with self.world.collective(f"sending the batch of step {step}"):
                share_batch(self.world, batch)
        return self.policy.train(batch, step, stop)

    def publish(self, publisher: WeightPublisher, version: int) -> Published:
        """Publish the policy as ``version`` through ``publisher.publish_stream``, every rank
        gathering (see the module text); ``phases.gather_s`` is the gathers' time."""
        stream = GatherStream(self)
        try:
            published = publisher.publish_stream(version, self.policy.layout, stream)
        except BaseException as exc:
            stream.finish()  # the followers finish their pass; raises if a rank stopped
            if stream.failure is not None and stream.failure is not exc:
                raise stream.failure from exc  # the publisher wrapped it: name the rank
            raise
        stream.finish()
        phases = published.phases
        if not phases.gather_s:  # the publisher did not time its wait for the stream
            phases.gather_s = stream.gather_s
        phases.bytes = phases.bytes or published.size
        return published

    def full_state(self) -> StateDict:
        """The whole state dict (:meth:`Policy.full_state`; not for a weight sync)."""
        self._announce(Gather())
        state = self.policy.full_state()
        assert state is not None  # rank 0 always gets the whole state dict
        return state

    def save(self, root: Path, *, step: int, model_sha256: str | None, **fields: Any) -> Path:
        tmp_name = f".tmp-{uuid.uuid4().hex}"
        self._announce(Save(str(root), step, tmp_name, model_sha256))
        return self.policy.save(
            root, step=step, tmp_name=tmp_name, model_sha256=model_sha256, **fields
        )

    def load(self, directory: Path) -> CheckpointState:
        self._announce(Load(str(directory)))
        return self.policy.load(directory)

    def close(self, ok: bool) -> None:
        """Release the followers: they exit 0 (``ok``) or 1."""
        try:
            self._announce(Stop() if ok else Abort())
        except (RuntimeError, ConnectionError, OSError) as exc:
            log.warning("could not tell the follower ranks to stop: %s", exc)


class GatherStream:
    """Rank 0's :data:`~longtail_workers.weights.sync.TensorStream` of one publish: each call
    tells the followers to run a pass too and returns rank 0's pass (see the module text)."""

    def __init__(self, leader: PolicyLeader) -> None:
        self.leader = leader
        self.gather_s = 0.0
        """Seconds spent producing tensors, every pass of this publish together."""
        self.passes = 0
        self.failure: TrainerRankError | None = None
        """Set when a gather failed because a rank stopped: no further pass can run."""
        self._open: _Pass | None = None

    def __call__(self) -> Iterator[torch.Tensor]:
        if self.failure is not None:
            raise self.failure
        self.finish()  # a retry: the previous pass first runs to its end on every rank
        self.leader._announce(Stream())
        self._open = _Pass(self, self.leader.policy.gather_pass())
        self.passes += 1
        return self._open

    def finish(self) -> None:
        """Run the open pass to its end (gathers whose tensors nobody takes), if any."""
        opened, self._open = self._open, None
        if opened is not None:
            for _ in opened:
                pass


class _Pass:
    """One pass of a :class:`GatherStream`: an iterator that times each gather and remembers
    that it ended (by exhaustion or by an error), so :meth:`GatherStream.finish` knows what is
    left to drain."""

    def __init__(self, owner: GatherStream, tensors: Iterator[torch.Tensor]) -> None:
        self.owner, self.tensors, self.done = owner, tensors, False

    def __iter__(self) -> _Pass:
        return self

    def __next__(self) -> torch.Tensor:
        if self.done:
            raise StopIteration
        t0 = time.monotonic()
        try:
            return next(self.tensors)
        except TrainerRankError as exc:
            self.done, self.owner.failure = True, exc
            raise
        except BaseException:  # StopIteration (the end) or any other error: nothing to drain
            self.done = True
            raise
        finally:
            self.owner.gather_s += time.monotonic() - t0


def share_batch(world: TrainerWorld, batch: GrpoBatch | None) -> GrpoBatch:
    """Broadcast rank 0's ``batch`` (CPU tensors, pickled) to every rank; returns it."""
    box: list[Any] = [batch]
    device = world.device if world.device.type == "cuda" else None  # NCCL stages on the GPU
    dist.broadcast_object_list(box, src=0, device=device)
    if not isinstance(box[0], GrpoBatch):
        raise TrainerRankError(f"rank 0 broadcast a {type(box[0]).__name__}, not a batch", [])
    return box[0]


def follow(policy: Policy, channel: CommandChannel) -> int:
    """A follower rank's whole life: run rank 0's commands until ``stop`` (0) or ``abort`` (1)."""
    world = policy.world
    while True:
        command = channel.receive()
        match command:
            case Train(step=step):
                with world.collective(f"receiving the batch of step {step}"):
                    batch = share_batch(world, None)
                try:
                    policy.train(batch, step)
                except UpdateAbandoned as exc:  # rank 0 was asked to stop: it checkpoints next
                    log.info("rank %d: %s", world.rank, exc)
            case Stream():
                for _ in policy.gather_pass():
                    pass  # rank 0 publishes; this rank only takes part in each gather
            case Gather():
                policy.full_state()
            case Save(root=root, step=step, tmp=tmp, sha=sha):
                policy.save(
                    Path(root), step=step, tmp_name=tmp, model_sha256=sha,
                    policy_version=0, drafter_version=-1, keep_last=1,
                )  # fmt: skip
            case Load(path=path):
                policy.load(Path(path))
            case Stop() | Abort():
                log.info("rank %d: rank 0 says %s", world.rank, command.op)
                return 0 if isinstance(command, Stop) else 1
