"""Pure planning of the trainer group: which trainer pods to make or delete, and when the whole
group restarts.

``derive.plan`` calls :func:`plan_group` on every reconcile of a job that is not finished or
suspended. The ``trainer.replicas`` trainer pods form one torch.distributed world (every pod
gets the rendezvous environment, ``builders.trainer_rendezvous``): a world cannot lose a rank
and go on, so when one trainer pod fails, exits or disappears, every trainer pod is deleted and
the group is made again, resuming from the last checkpoint. Rollout and verifier pods are left
alone; they reach the trainer through pod 0's stable DNS name and load its weights again.

Each trainer pod carries its group's number (``status.trainer.restarts`` when it was made) and
world (``<pods>x<ranks per pod>``) as labels. A pod whose labels are not the current ones is
*old*: it is deleted, and no new trainer pod is made until every old one is gone (a new rank
must never meet an old group's rank 0). Level-triggered like the rest of the planner: the
decision depends only on the pods and the previous status. Each restart after a failure or a
deletion counts one against ``backoffLimit`` (in ``roles.trainer.failed``), however many pods
of the group went down with it; a pod that exited 0 or a changed world (``trainer.replicas`` or
``trainer.resources.gpus``) restarts the group without counting.

"Disappeared" needs memory: ``status.trainer.formed`` says every pod of the current group has
existed at once, so a missing pod is one that went away, not one not made yet (creation can
fail halfway, for a quota, and is then only retried). A whole group gone at once (suspend, or
the lone pod of a one-pod group deleted while ``formed``) is handled the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from longtail_api.spec import RLJobSpec
from longtail_api.status import TrainerGroupStatus, TrainerRestart
from longtail_operator import builders
from longtail_operator.observe import PodView

RESTARTING = "TrainerGroupRestarting"
"""Reason of ``TrainerReady`` (False) from a restart until the new group is ready."""
RESTARTED = "TrainerGroupRestarted"
"""Event reason (Warning) of a restart after a failed, deleted or exited trainer pod."""
FAILED, DELETED, EXITED = "TrainerPodFailed", "TrainerPodDeleted", "TrainerPodExited"
WORLD_CHANGED = "TrainerWorldChanged"
"""Event reason (Normal) and restart reason when the spec's trainer world changed."""
MESSAGE_TAIL = 300
"""Characters of a failed pod's termination message quoted in the restart message (the
``WorkerFailed`` event carries all of it)."""


@dataclass
class GroupPlan:
    """What to do with the trainer pods in this reconcile."""

    status: TrainerGroupStatus
    """The new ``status.trainer``."""
    delete: list[str] = field(default_factory=list)
    """Trainer pods to delete now."""
    create: list[int] = field(default_factory=list)
    """Indices of the trainer pods to create now (all of the group's, or those not made yet)."""
    counted: int = 0
    """Restarts to count against ``backoffLimit`` (0 or 1)."""
    ready: int = 0
    """Ready pods of the current group (none while it restarts)."""
    event: tuple[str, str, str] | None = None
    """(type, reason, message) of the event to post, when the group restarts now."""
    restarting: str | None = None
    """While the group restarts: the ``TrainerReady`` message (reason ``RESTARTING``)."""
    checkpoint: bool = False
    """Ask pod 0 for a checkpoint before its group goes (a world change of a healthy group)."""


def group_status(spec: RLJobSpec, previous: TrainerGroupStatus) -> TrainerGroupStatus:
    """``status.trainer`` for the spec's world, keeping the restart count and last restart."""
    local = builders.trainer_local_world_size(spec)
    return TrainerGroupStatus(
        replicas=spec.trainer.replicas,
        local_world_size=local,
        world_size=spec.trainer.replicas * local,
        restarts=previous.restarts,
        formed=previous.formed,
        last_restart=previous.last_restart,
    )


def _is_current(pod: PodView, spec: RLJobSpec, group: int) -> bool:
    """Made for this group and this world (unlabelled pods of an older operator count as
    current while the world is one pod, which is all it could make)."""
    replicas = spec.trainer.replicas
    world_ok = pod.world == builders.trainer_world(spec) or (pod.world is None and replicas == 1)
    return (pod.group is None or pod.group == group) and world_ok and pod.index < replicas


def _breakage(cur: list[PodView], spec: RLJobSpec, job: str, formed: bool) -> tuple[str, str, str]:
    """(reason, pod, what happened) when the current group lost a rank; ("", "", "") if not."""
    for p in sorted(cur, key=lambda q: q.index):
        if p.phase == "Failed":
            text = (
                p.message if len(p.message) <= MESSAGE_TAIL else "..." + p.message[-MESSAGE_TAIL:]
            )
            return FAILED, p.name, f"pod {p.name} failed" + (f" ({text})" if text else "")
    for p in sorted(cur, key=lambda q: q.index):
        if p.deleting:
            return DELETED, p.name, f"pod {p.name} is being deleted"
        if p.phase == "Succeeded":
            return EXITED, p.name, f"pod {p.name} exited while the job runs"
    missing = sorted(set(range(spec.trainer.replicas)) - {p.index for p in cur})
    if formed and missing:
        name = builders.pod_name(job, "trainer", missing[0])
        return DELETED, name, f"pod {name} was deleted"
    return "", "", ""


def _world_change(old: list[PodView], spec: RLJobSpec, group: int) -> str:
    """The message when healthy pods of this group were made for another world; "" if none."""
    worlds = sorted({p.world or "unlabelled" for p in old if p.active and p.group in (None, group)})
    if not worlds:
        return ""
    return (
        f"the trainer world changed from {', '.join(worlds)} to {builders.trainer_world(spec)} "
        "(trainer.replicas x ranks per pod): recreating the trainer group, which resumes from "
        "its last checkpoint; rollout and verifier pods keep running"
    )


def _restart(out: GroupPlan, spec: RLJobSpec, broken: tuple[str, str, str], now: str) -> None:
    """Record a restart of the whole group: the next group number, counted unless the pod
    exited 0, the reason in status and an event."""
    reason, pod, what = broken
    st = out.status
    st.restarts += 1
    out.counted = 0 if reason == EXITED else 1
    message = (
        f"{what}: restarting the trainer group ({spec.trainer.replicas} pods, world size "
        f"{st.world_size}) from its last checkpoint (restart {st.restarts}); rollout and "
        "verifier pods keep running"
    )
    st.last_restart = TrainerRestart(time=now, reason=reason, pod=pod, message=message)
    out.event = ("Warning", RESTARTED, message)


def _resize(
    out: GroupPlan, old: list[PodView], last: TrainerRestart | None, changed: str, now: str
) -> None:
    """A healthy group made for another world goes: checkpoint first (pod 0 runs), nothing
    counted; the record keeps its time while the same change waits for the checkpoint."""
    if last is None or (last.reason, last.message) != (WORLD_CHANGED, changed):
        out.status.last_restart = TrainerRestart(time=now, reason=WORLD_CHANGED, message=changed)
    out.event = ("Normal", WORLD_CHANGED, changed)
    out.checkpoint = any(
        p.index == 0 and p.phase == "Running" and p.ip and not p.deleting for p in old
    )


def plan_group(
    pods: tuple[PodView, ...] | list[PodView],
    spec: RLJobSpec,
    job: str,
    previous: TrainerGroupStatus,
    was_restarting: bool,
    now: str,
) -> GroupPlan:
    """The trainer pods' plan for a job that runs (see the module text). ``was_restarting``:
    the previous ``TrainerReady`` reason was ``RESTARTING``; ``now``: RFC 3339."""
    st = group_status(spec, previous)
    out = GroupPlan(status=st)
    trainers = [p for p in pods if p.role == "trainer"]
    cur = [p for p in trainers if _is_current(p, spec, previous.restarts)]
    old = [p for p in trainers if not _is_current(p, spec, previous.restarts)]
    if not previous.formed:  # leftovers of a suspend or an older group: wait for them
        old += [p for p in cur if p.deleting]
        cur = [p for p in cur if not p.deleting]
    # With old pods around (a world change), the current group is not formed yet: nothing of
    # it can be missing.
    reason, pod, what = _breakage(cur, spec, job, previous.formed and not old)
    changed = _world_change(old, spec, previous.restarts)
    if reason:
        _restart(out, spec, (reason, pod, what), now)
        cur, old = [], trainers
    elif changed and any(not p.deleting for p in old):
        _resize(out, old, previous.last_restart, changed, now)
    out.delete = [p.name for p in old if not p.deleting]
    present = {p.index for p in cur}
    if old:
        st.formed = False
    else:
        out.create = [i for i in range(spec.trainer.replicas) if i not in present]
        st.formed = len(present) == spec.trainer.replicas
    out.ready = sum(1 for p in cur if p.ready and p.active)
    if out.event or (was_restarting and (old or out.ready < spec.trainer.replicas)):
        last = st.last_restart
        out.restarting = last.message if last is not None else "the trainer group restarts"
    return out
