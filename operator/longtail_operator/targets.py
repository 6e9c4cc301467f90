"""Which of a job's pods the harvest loop polls, and trainer pod 0 (rank 0).

Called by ``reconcile.py`` after each reconcile (the harvest targets it hands ``runtime.py``'s
harvest loop, and the trainer pod whose report and checkpoint it asks for) and by the tests.
"""

from __future__ import annotations

from collections.abc import Iterable

from longtail_api.spec import RLJobSpec
from longtail_operator.naming import gpus_of, role_port
from longtail_operator.observe import PodView
from longtail_operator.settings import Settings
from longtail_operator.sources import WorkerTarget


def rank0(pods: Iterable[PodView], *, active: bool) -> PodView | None:
    """Trainer pod 0 with an IP (``active``: also not finished or being deleted): rank 0, the
    one trainer pod with an HTTP server (status, checkpoint, role, weights, drafters)."""
    return next(
        (
            p
            for p in pods
            if p.role == "trainer" and p.index == 0 and p.ip and (p.active or not active)
        ),
        None,
    )


def harvest_targets(
    spec: RLJobSpec,
    pods: Iterable[PodView],
    gone: set[str],
    settings: Settings,
    roles: set[str] | None = None,
) -> list[WorkerTarget]:
    """Running pods the harvest loop polls and may reassign: the rollout workers always, and
    the pods of the other roles in ``harvest.eligibleRoles`` (the trainer, polled and switched
    on its own port, when ``trainer`` is eligible: pod 0 only, the one that serves HTTP).
    Dedicated drafter pods never: drafter training is their only activity (no ``PUT /v1/role``);
    their GPUs are counted as ``status.gpus.drafter`` by the planner instead. ``roles``: the
    running pods of these roles instead (the trainer's, read for the rollout state alone)."""
    eligible = (set(spec.harvest.eligible_roles) | {"rollout"}) if roles is None else roles
    return [
        WorkerTarget(
            name=p.name,
            role=p.role,
            ip=p.ip,
            port=role_port(settings, p.role),
            gpus=gpus_of(spec, p.role),
            uid=p.uid,
        )
        for p in pods
        if p.active
        and p.name not in gone
        and p.role in eligible
        and p.phase == "Running"
        and (p.role != "trainer" or p.index == 0)
    ]
