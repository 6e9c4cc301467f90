"""The operator's harvester and the local coordinator make the same role changes at every poll.

Both are transports around :class:`longtail_api.harvestloop.HarvestLoop`; this feeds each the
same scripted sequence of worker reports through fakes of its transport (fake worker and trainer
clients behind the operator's ``WorkerStatusSource``; a fake ``http_json`` behind the local
coordinator) and compares the ``PUT /v1/role`` calls each sends per poll, and pins them. Covers:
a worker going idle past ``idleSeconds``, re-dispatched work sending it back, a 409 refusal
re-sent with backoff, the rollout ending (everyone back), the trainer as a target, and the
rollout ending between the read and the send (the just-in-time re-check drops the harvest).
The trainer's report decides the rollout state in both also when the trainer is not a target
(the operator reads pod 0 apart, never switching it); when the operator cannot read it, it
falls back to "some worker is busy".
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

import pytest

from longtail_api.harvest import Activity
from longtail_api.policies import HarvestSpec
from longtail_api.wirecodec import to_wire
from longtail_api.workerapi import (
    RoleAck,
    RoleAnswer,
    RoleState,
    RolloutWorkerStatus,
    TrainerStatus,
    WorkerVersions,
)
from longtail_operator.clients import RoleResult
from longtail_operator.harvester import Harvester
from longtail_operator.sources import WorkerStatusSource, WorkerTarget
from longtail_workers.httpclient import WorkerBusy
from longtail_workers.local.coordinator import TRAINER, Coordinator

Sent = list[tuple[str, Activity]]


@dataclass
class Worker:
    """A rollout worker's state in the script."""

    generating: bool = False
    waiting: int = 0
    idle_seconds: float | None = 10.0
    observed: Activity = "rollout"


@dataclass
class Trainer:
    """The trainer's state in the script."""

    rollout_active: bool = False
    step: int = 0
    pending: tuple[str, ...] = ()
    idle_seconds: float | None = None
    observed: Activity = "train"


@dataclass
class World:
    """The workers one implementation talks to; role switches land here."""

    workers: dict[str, Worker]
    trainer: Trainer = field(default_factory=Trainer)
    trainer_down: bool = False
    """The trainer's status cannot be read (the operator's fake client answers an error)."""
    refuse: dict[str, str] = field(default_factory=dict)
    sent: Sent = field(default_factory=list)
    flip: Callable[[World], None] | None = None
    """Applied once ``flip_after`` status reads have been answered (the rollout ending while
    the loop reads)."""
    flip_after: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _read(self) -> None:
        if self.flip is not None:
            self.flip_after -= 1
            if self.flip_after == 0:
                self.flip(self)
                self.flip = None

    def worker_status(self, name: str) -> RolloutWorkerStatus:
        with self.lock:
            w = self.workers[name]
            status = RolloutWorkerStatus(
                worker=name,
                state="generating" if w.generating else "idle",
                role=RoleState(w.observed, w.observed, 0.0),
                generating=w.generating,
                running=1 if w.generating else 0,
                waiting=w.waiting,
                idle_since=None,
                idle_seconds=None if w.generating else w.idle_seconds,
                versions=WorkerVersions(0, 0, 0),
            )
            self._read()
            return status

    def trainer_status(self) -> TrainerStatus:
        with self.lock:
            t = self.trainer
            status = TrainerStatus(
                step=t.step,
                total_steps=10,
                phase="running",
                policy_version=t.step,
                drafter_version=0,
                rollout_active=t.rollout_active,
                pending_workers=t.pending,
                role=RoleState(t.observed, t.observed, 0.0),
                idle_seconds=t.idle_seconds,
            )
            self._read()
            return status

    def put_role(self, name: str, activity: Activity) -> RoleAck | str:
        """The refusal text, or the acknowledgement (the switch completes at once)."""
        with self.lock:
            self.sent.append((name, activity))
            if name in self.refuse:
                return self.refuse[name]
            if name == TRAINER:
                self.trainer.observed = activity
            else:
                self.workers[name].observed = activity
            return RoleAck(activity, activity, 0.0, False, 0.0)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@dataclass
class FakeWorkerClient:
    """``WorkerClient`` over the world: host is the worker's name."""

    world: World
    timeout: float = 2.0

    def status(self, host: str, port: int) -> RolloutWorkerStatus | str:
        return self.world.worker_status(host)

    def put_role(
        self, host: str | None, port: int, activity: Activity, token: str | None = None
    ) -> RoleResult:
        answer = self.world.put_role(host or "", activity)
        if isinstance(answer, str):
            return RoleResult(409, None, f"HTTP 409: {answer}")
        return RoleResult(200, answer, None)


@dataclass
class FakeTrainerClient:
    world: World

    def status(self, host: str, port: int) -> TrainerStatus | str:
        if self.world.trainer_down:
            return f"GET http://{host}:{port}/v1/status: ConnectionRefusedError"
        return self.world.trainer_status()


class Operator:
    """The operator's harvester over a world."""

    def __init__(self, world: World, spec: HarvestSpec) -> None:
        self.world, self.spec, self.clock = world, spec, Clock()
        client = FakeWorkerClient(world)
        self.harvester = Harvester("job", client, clock=self.clock)  # type: ignore[arg-type]
        self.source = WorkerStatusSource(client, trainer_client=FakeTrainerClient(world))  # type: ignore[arg-type]
        self.targets = [WorkerTarget(n, "rollout", n, 1, 1, uid=n) for n in world.workers]
        self.pod0 = WorkerTarget(TRAINER, "trainer", TRAINER, 1, 1, uid=TRAINER)
        if "trainer" in spec.eligible_roles:
            self.targets.append(self.pod0)
        self.reads_per_poll = len(world.workers) + 1  # the workers, then the trainer

    def poll(self) -> None:
        self.harvester.step(self.spec, self.targets, self.source, self.pod0)


class Local:
    """The local coordinator over a world (``http_json`` faked)."""

    def __init__(self, world: World, spec: HarvestSpec) -> None:
        self.world, self.spec, self.clock = world, spec, Clock()
        urls = {n: f"http://{n}" for n in world.workers}
        self.coord = Coordinator(spec, f"http://{TRAINER}", urls, clock=self.clock, http=self.http)
        self.reads_per_poll = len(world.workers) + 1  # the trainer, then every worker

    def http(self, url: str, body: Any, timeout_s: float, method: str, token: Any = None) -> Any:
        parts = urlsplit(url)
        name = parts.hostname or ""
        if method == "GET":
            if name == TRAINER:
                return to_wire(self.world.trainer_status())
            return to_wire(self.world.worker_status(name))
        answer = self.world.put_role(name, body["role"])
        if isinstance(answer, str):
            raise WorkerBusy(answer)
        return to_wire(RoleAnswer(name, answer))

    def poll(self) -> None:
        self.coord.poll_once()


Script = list[tuple[float, Callable[[World], None], Sent]]
"""Per poll: seconds the clock advances, what changes in the world, the sends expected."""


def run_both(spec: HarvestSpec, names: list[str], script: Script, arm: int | None = None) -> None:
    """Run ``script`` against both transports; at poll ``arm`` the rollout ends mid-poll."""
    impls: list[Operator | Local] = [
        Operator(World({n: Worker() for n in names}), spec),
        Local(World({n: Worker() for n in names}), spec),
    ]
    for i, (advance, change, expected) in enumerate(script):
        per_impl = []
        for impl in impls:
            impl.clock.t += advance
            change(impl.world)
            if i == arm:
                impl.world.flip, impl.world.flip_after = _end_rollout, impl.reads_per_poll
            start = len(impl.world.sent)
            impl.poll()
            per_impl.append(sorted(impl.world.sent[start:]))
        assert per_impl[0] == per_impl[1], f"poll {i}: operator {per_impl[0]}, local {per_impl[1]}"
        assert per_impl[0] == sorted(expected), f"poll {i}"


def _end_rollout(world: World) -> None:
    world.trainer = replace(world.trainer, rollout_active=False, pending=(), idle_seconds=None)
    for w in world.workers.values():
        w.generating, w.waiting = False, 0


def both(*changes: Callable[[World], None]) -> Callable[[World], None]:
    def apply(world: World) -> None:
        for change in changes:
            change(world)

    return apply


def worker(name: str, **kw: Any) -> Callable[[World], None]:
    def apply(world: World) -> None:
        for k, v in kw.items():
            setattr(world.workers[name], k, v)

    return apply


def trainer(**kw: Any) -> Callable[[World], None]:
    def apply(world: World) -> None:
        world.trainer = replace(world.trainer, **kw)

    return apply


def refuse(name: str, text: str | None) -> Callable[[World], None]:
    def apply(world: World) -> None:
        if text is None:
            world.refuse.pop(name, None)
        else:
            world.refuse[name] = text

    return apply


def nothing(world: World) -> None:
    pass


def test_rollout_workers_get_the_same_changes_at_every_poll() -> None:
    spec = HarvestSpec(idle_seconds=1.0)  # eligibleRoles: [rollout]
    gen, rollout = {"generating": True, "idle_seconds": None}, trainer(rollout_active=True)
    script: Script = [
        (1.0, nothing, []),  # between rollouts: idle is not harvestable
        (
            1.0,
            both(
                rollout,
                worker("w0", **gen),
                worker("w1", idle_seconds=0.5),
                worker("w2", **gen),
                trainer(pending=("w0", "w2")),
            ),
            [],
        ),
        (1.0, worker("w1", idle_seconds=5.0), [("w1", "drafter-train")]),  # idle past 1 s
        (1.0, nothing, []),  # decided once; acknowledged by its report
        # Prompts re-dispatched to w1 (a worker failed): its own work again.
        (
            1.0,
            both(worker("w1", waiting=2), trainer(pending=("w0", "w1", "w2"))),
            [("w1", "rollout")],
        ),
        (
            1.0,
            both(
                worker("w1", waiting=0, **gen),
                worker("w0", generating=False, idle_seconds=2.0),
                trainer(pending=("w1", "w2")),
            ),
            [("w0", "drafter-train")],
        ),
        # w2 finishes but refuses (409): unacknowledged, re-sent after 0.25 s, then 0.5 s.
        (
            1.0,
            both(
                refuse("w2", "no rollout data captured yet"),
                worker("w2", generating=False, idle_seconds=2.0),
                trainer(pending=("w1",)),
            ),
            [("w2", "drafter-train")],
        ),
        (0.1, nothing, []),
        (0.2, nothing, [("w2", "drafter-train")]),
        (0.3, nothing, []),
        (0.3, refuse("w2", None), [("w2", "drafter-train")]),
        (1.0, nothing, []),
        # The rollout ends: everyone back to rollout.
        (1.0, _end_rollout, [("w0", "rollout"), ("w2", "rollout")]),
        (1.0, nothing, []),
        # A new rollout, w1 idle long enough, but it ends between the read and the send.
        (
            1.0,
            both(
                trainer(rollout_active=True, step=1, pending=("w0",)),
                worker("w0", **gen),
                worker("w1", idle_seconds=5.0),
            ),
            [],
        ),
        (1.0, nothing, []),  # no rollout any more: nothing to harvest
    ]
    run_both(spec, ["w0", "w1", "w2"], script, arm=len(script) - 2)


def test_trainer_as_a_target_gets_the_same_changes() -> None:
    spec = HarvestSpec(idle_seconds=1.0, eligible_roles=["rollout", "trainer"])
    gen = {"generating": True, "idle_seconds": None}
    waits = trainer(rollout_active=True, idle_seconds=2.0, pending=("w0", "w1"))
    script: Script = [
        (1.0, nothing, []),  # between rollouts the trainer is busy updating the policy
        (1.0, both(waits, worker("w0", **gen), worker("w1", **gen)), [(TRAINER, "drafter-train")]),
        (
            1.0,
            both(worker("w1", generating=False, idle_seconds=3.0), trainer(pending=("w0",))),
            [("w1", "drafter-train")],
        ),
        (1.0, nothing, []),
        # The rollout ends; the trainer went back to train by itself (the loop follows).
        (
            1.0,
            both(_end_rollout, trainer(step=1, observed="train")),
            [(TRAINER, "train"), ("w1", "rollout")],
        ),
        # The next rollout ends between the read and the send: nobody is harvested.
        (1.0, both(waits, worker("w0", **gen), worker("w1", idle_seconds=3.0)), []),
        (1.0, nothing, []),
    ]
    run_both(spec, ["w0", "w1"], script, arm=len(script) - 2)


@pytest.mark.parametrize("eligible", [["rollout"], ["rollout", "trainer"]])
def test_both_keep_a_refused_switch_unacknowledged(eligible: list[str]) -> None:
    spec = HarvestSpec(idle_seconds=1.0, eligible_roles=eligible)
    op = Operator(World({"w0": Worker(), "w1": Worker()}), spec)
    local = Local(World({"w0": Worker(), "w1": Worker()}), spec)
    for impl in (op, local):
        impl.world.refuse["w1"] = "no rollout data captured yet"
        both(trainer(rollout_active=True), worker("w0", generating=True))(impl.world)
        impl.poll()
    assert op.harvester.assignments["w1"].acked is False
    assert local.coord.loop.assignments["w1"].acked is False
    assert local.coord.assigned["w1"] == "drafter-train" == op.harvester.assignments["w1"].activity
    assert "no rollout data captured yet" in (local.coord.loop.assignments["w1"].message or "")
    assert local.coord.books.refusals == 1


def test_the_trainer_s_report_decides_the_rollout_when_it_is_not_a_target() -> None:
    spec = HarvestSpec(idle_seconds=1.0)  # eligibleRoles: [rollout]: the trainer is no target
    gen = {"generating": True, "idle_seconds": None}
    script: Script = [
        (1.0, nothing, []),
        # The trainer says a rollout runs while no worker generates (e.g. answers still being
        # scored): both harvest the idle workers (busyness alone would say "no rollout").
        (
            1.0,
            trainer(rollout_active=True, pending=()),
            [("w0", "drafter-train"), ("w1", "drafter-train"), ("w2", "drafter-train")],
        ),
        (1.0, nothing, []),
        # The trainer's list alone hands w1 work again (w1 reports nothing waiting yet).
        (1.0, trainer(pending=("w1",)), [("w1", "rollout")]),
        (1.0, worker("w1", **gen), []),
        (1.0, trainer(pending=()), []),  # w1 busy again: not harvested
    ]
    run_both(spec, ["w0", "w1", "w2"], script)


def test_the_rollout_ended_per_the_trainer_while_a_worker_still_looks_busy() -> None:
    spec = HarvestSpec(idle_seconds=1.0)  # eligibleRoles: [rollout]
    gen = {"generating": True, "idle_seconds": None}
    script: Script = [
        (
            1.0,
            both(trainer(rollout_active=True, pending=("w2",)), worker("w2", **gen)),
            [("w0", "drafter-train"), ("w1", "drafter-train")],
        ),
        (1.0, nothing, []),
        # The trainer says the rollout ended; w2's report still says it generates: everyone
        # harvested goes back, and nobody is harvested again while w2 looks busy.
        (
            1.0,
            trainer(rollout_active=False, step=1, pending=()),
            [("w0", "rollout"), ("w1", "rollout")],
        ),
        (1.0, nothing, []),
    ]
    run_both(spec, ["w0", "w1", "w2"], script)


def test_the_operator_falls_back_to_the_workers_when_the_trainer_cannot_be_read() -> None:
    spec = HarvestSpec(idle_seconds=1.0)  # eligibleRoles: [rollout]
    world = World({"w0": Worker(generating=True, idle_seconds=None), "w1": Worker()})
    op = Operator(world, spec)
    world.trainer_down = True  # and the trainer's report (were it read) says "no rollout"
    for _ in range(4):  # more polls than make a worker "unreachable"
        op.poll()
    assert world.sent == [("w1", "drafter-train")]  # some worker is busy: a rollout
    snap = op.harvester.snapshot()
    assert [w.name for w in snap.workers] == ["w0", "w1"]  # the trainer is no worker here
    assert snap.unreachable == () and TRAINER not in op.source.failures
    assert TRAINER not in op.harvester.assignments
    # Readable again: its report (no rollout) decides although w0 still looks busy.
    world.trainer_down = False
    op.poll()
    assert world.sent == [("w1", "drafter-train"), ("w1", "rollout")]
    assert all(name != TRAINER for name, _ in world.sent)
