"""The desired set: every object an RLJob should own now, keyed by :class:`~.model.ObjectKey`.

Pure; ``derive.plan`` calls :func:`desired` once the job's phase is decided (a
:class:`Stage`) and hands the result to ``diff.py``, which compares it with what
``reconcile.py`` observed and yields the creates, updates and deletes. Each owned kind is one
entry of :data:`KINDS` (a function of the stage, returning the objects of that kind) plus its
builder in ``builders.py``, ``access.py``, ``gang.py`` or ``kueue.py``: adding a kind adds
neither a flag on ``Observed`` nor delete code. Stopping is a smaller set, never a hand-written
deletion list:

- running: the pods (the trainer group's as ``trainergroup.py`` plans them; a finished pod is
  left out, so the diff deletes it and the next pass makes it again), the gang group, a
  headless Service per role, the NetworkPolicies, the ConfigMap, the Kueue Workload;
- suspended or queued: the same without pods and gang group (a resume finds the rest);
- finished: what is left of the Services, ConfigMap and NetworkPolicies as they are (nothing
  made, nothing changed), and the Workload while it exists (``placement.workload_actions``
  marks it finished); once ``ttlSecondsAfterFinished`` passed, only the Workload.

The job's token Secret is not in the set: the operator may not read the jobs' Secrets, so it
cannot be diffed; ``reconcile.py`` creates it once (a 409 says it exists).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from longtail_api.spec import RLJobSpec
from longtail_operator import access, builders, elastic, kueue
from longtail_operator.model import RUNNING, TERMINAL, ObjectKey, Observed, PlanPhase
from longtail_operator.observe import parse_time
from longtail_operator.settings import Settings
from longtail_operator.trainergroup import GroupPlan

Desired = dict[ObjectKey, dict[str, Any]]
KEEPS = frozenset({"Service", "ConfigMap", "NetworkPolicy"})
"""Kinds a finished job keeps as they are until its TTL passes."""


@dataclass(frozen=True)
class Stage:
    """What the planner decided before the desired set: the phase, the trainer group's plan
    (None for a finished or suspended job; its pods are made only while running) and the
    Workload Kueue should hold (None: Kueue does not manage the job)."""

    phase: PlanPhase
    group: GroupPlan | None
    workload: dict[str, Any] | None
    completion_time: str | None = None
    """When a finished job finished (RFC 3339), for its TTL."""


def ttl_passed(obs: Observed, spec: RLJobSpec, stage: Stage) -> bool:
    """A finished job's ``ttlSecondsAfterFinished`` has passed: its objects go."""
    ttl = spec.ttl_seconds_after_finished
    done = parse_time(stage.completion_time)
    return ttl is not None and done is not None and obs.now - done >= timedelta(seconds=ttl)


def _keyed(*objects: dict[str, Any]) -> Desired:
    return {ObjectKey.of(o): o for o in objects}


def _pods(obs: Observed, spec: RLJobSpec, settings: Settings, stage: Stage) -> Desired:
    """The worker pods while running: the trainer group's kept and new pods, every other
    role's replicas but a finished one (replaced: deleted now, made again when gone); of an
    elastic rollout, as many as Kueue admitted (``elastic.rollout_target``)."""
    group = stage.group
    if stage.phase != RUNNING or group is None:
        return {}
    finished = {(p.role, p.index) for p in obs.pods if p.phase in ("Failed", "Succeeded")}
    kept = [p for p in obs.pods if p.role == "trainer" and p.name not in group.delete]
    wanted = [(p.role, p.index) for p in kept] + [("trainer", i) for i in group.create]
    rollouts = elastic.rollout_target(obs, spec)
    wanted += [
        (role, index)
        for role, index in builders.desired_pods(spec).values()
        if role != "trainer"
        and (role, index) not in finished
        and (role != "rollout" or index < rollouts)
    ]
    prev = obs.previous
    by_topology = {t.group for t in spec.scheduling.topology}
    out: Desired = {}
    for role, index in wanted:
        pod = builders.worker_pod(
            obs.job,
            spec,
            settings,
            role,
            index,
            min_policy_version=prev.policy_version,
            min_drafter_version=prev.drafter.version if prev.drafter.version else -1,
            trainer_group=group.status.restarts,
        )
        w = obs.workload
        if w is not None and role in w.placements:  # admitted: placed (gated: by topology)
            kueue.place(pod, role, w.placements[role], w.name if role in by_topology else None)
        out[ObjectKey.of(pod)] = pod
    return out


def _gang_group(obs: Observed, spec: RLJobSpec, settings: Settings, stage: Stage) -> Desired:
    """Exactly while the pods are wanted (made in the pass that makes them, before them); a
    trainer-group restart keeps it (``gang.py``)."""
    if stage.phase != RUNNING or builders.job_gang(spec, settings) is None:
        return {}
    return _keyed(builders.gang_group(obs.job, spec, settings, kueue=obs.queue is not None))


def _services(obs: Observed, spec: RLJobSpec, settings: Settings, stage: Stage) -> Desired:
    roles = builders.role_specs(spec)
    return _keyed(*(builders.role_service(obs.job, role, settings) for role in roles))


def _network_policies(obs: Observed, spec: RLJobSpec, settings: Settings, stage: Stage) -> Desired:
    """The job's policies while this install makes them; the weight-sync one exactly while
    the accepted spec's transport resolves to ``broadcast`` (a frozen field: it changes only
    while the job is suspended, when no pod depends on the policy)."""
    if not settings.network_policy:
        return {}
    out = _keyed(access.network_policy(obs.job, settings), access.trainer_network_policy(obs.job))
    if spec.weight_sync_transport() == "broadcast":
        out.update(_keyed(access.weight_sync_network_policy(obs.job, settings)))
    return out


def _configmap(obs: Observed, spec: RLJobSpec, settings: Settings, stage: Stage) -> Desired:
    return _keyed(builders.job_configmap(obs.job, obs.raw_spec))


def _workload(obs: Observed, spec: RLJobSpec, settings: Settings, stage: Stage) -> Desired:
    """The Workload while Kueue manages the job; a finished job makes none, keeps its own."""
    if stage.workload is None or (stage.phase in TERMINAL and obs.workload is None):
        return {}
    return _keyed(stage.workload)


KINDS: tuple[Callable[[Observed, RLJobSpec, Settings, Stage], Desired], ...] = (
    _pods,
    _gang_group,
    _services,
    _network_policies,
    _configmap,
    _workload,
)
"""Every owned kind, in creation order (``reconcile.py`` still makes the pods last)."""


def desired(obs: Observed, spec: RLJobSpec, settings: Settings, stage: Stage) -> Desired:
    """Every object the job should own now (see the module text)."""
    out: Desired = {}
    for kind in KINDS:
        out.update(kind(obs, spec, settings, stage))
    if stage.phase not in TERMINAL:
        return out
    keep = not ttl_passed(obs, spec, stage)
    kept = {k: v for k, v in obs.owned.items() if keep and k.kind in KEEPS}
    return {**kept, **{k: v for k, v in out.items() if k.kind == "Workload"}}
