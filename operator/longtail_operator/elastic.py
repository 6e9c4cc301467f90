"""Elastic rollout (``spec.rollout.minReplicas``): how many rollout pods a job runs now, which
lost pods count against ``backoffLimit``, and what its status says about its rollout capacity.

Pure, like the rest of the plan. ``children.py`` asks :func:`rollout_target` how many rollout
pods to want (with Kueue: the count Kueue admitted, down to ``minReplicas``; else
``replicas``: a pod with no room stays Pending); ``derive.plan`` asks :func:`charged` which
failed pods count, :func:`past_grace` whether the job has run below ``minReplicas`` for longer
than ``belowMinGraceSeconds`` (then it checkpoints and waits; with Kueue it stops and gives its
quota back as an evicted job does), and :func:`lost` which rollout pods went since the last
pass; ``status.py`` writes :func:`capacity` (``status.rollout``) and :func:`condition`
(``RolloutCapacity``).

Telling a disruption from a crash: a v1.20 API server's Eviction API, a drain or a preemption
deletes the pod gracefully and leaves no other mark, so a rollout pod that vanishes or is
being deleted by someone else (the operator deletes only what its plan says, and such pods
are not remembered by :attr:`~.model.Observed.known`), or that carries the kubelet's
``Evicted`` or a ``DisruptionTarget`` condition (Kubernetes 1.26 on), was taken away: not
charged. A pod whose container failed by itself is charged, as before. Nothing here applies
to a job without ``minReplicas``: its status and counting are as they were.
"""

from __future__ import annotations

from datetime import timedelta

from longtail_api.spec import RLJobSpec
from longtail_api.status import RolloutCapacityStatus, RolloutShrink
from longtail_operator.model import RUNNING, Event, Observed
from longtail_operator.observe import PodView, parse_time, rfc3339

ROLE = "rollout"
DELETED, EVICTED, FAILED = "PodDeleted", "PodEvicted", "PodFailed"
BELOW = "BelowMinReplicas"
CHECKPOINT_REASON = "below-min"
"""The checkpoint request's reason when the job runs below ``minReplicas`` past its grace."""


def elastic(spec: RLJobSpec) -> bool:
    """Whether the job's rollout is elastic (``minReplicas`` set)."""
    return spec.rollout.min_replicas is not None


def admitted(obs: Observed, spec: RLJobSpec) -> int | None:
    """Rollout pods Kueue admitted (None: no Workload; 0 while not admitted)."""
    w = obs.workload
    if w is None:
        return None
    if not w.admitted:
        return 0
    return min(w.counts.get(ROLE, spec.rollout.replicas), spec.rollout.replicas)


def rollout_target(obs: Observed, spec: RLJobSpec) -> int:
    """How many rollout pods the job wants now: indices ``0 .. target - 1``."""
    count = admitted(obs, spec) if elastic(spec) else None
    return spec.rollout.replicas if count is None else count


def fewest(spec: RLJobSpec) -> dict[str, int]:
    """The roles that run with fewer than their replicas ready, and how few (``readiness``)."""
    return {ROLE: spec.rollout.fewest()} if elastic(spec) else {}


def charged(pod: PodView, spec: RLJobSpec) -> bool:
    """Whether a failed pod counts against ``backoffLimit`` (see the module text)."""
    if not elastic(spec) or pod.role != ROLE:
        return True
    return pod.disruption is None and not pod.deleting


def lost(obs: Observed, spec: RLJobSpec) -> list[tuple[str, str]]:
    """``(pod, reason)`` of each rollout pod alive at the last pass that is gone, being deleted
    by someone else, or failed now (empty for a job that is not elastic)."""
    if not elastic(spec):
        return []
    by_uid = {p.uid: p for p in obs.pods}
    out = []
    for name, uid in sorted(obs.known):
        pod = by_uid.get(uid)
        if pod is not None and pod.disruption is not None:
            out.append((name, EVICTED))
        elif pod is None or pod.deleting:
            out.append((name, DELETED))
        elif pod.phase == "Failed":
            out.append((name, FAILED))
    return out


def ready(obs: Observed) -> int:
    return sum(1 for p in obs.pods if p.role == ROLE and p.ready and p.active)


def past_grace(obs: Observed, spec: RLJobSpec) -> bool:
    """The job has had fewer than ``minReplicas`` ready rollout workers for longer than
    ``belowMinGraceSeconds`` (by the previous status's clock)."""
    prev = obs.previous.rollout
    since = parse_time(prev.below_min_since) if elastic(spec) and prev is not None else None
    grace = timedelta(seconds=spec.rollout.below_min_grace_seconds)
    return since is not None and obs.now - since >= grace


def _shrink_text(gone: list[tuple[str, str]], now_ready: int, spec: RLJobSpec) -> str:
    what = {
        DELETED: "deleted or evicted by someone else (a drain, a preemption, the Eviction API)",
        EVICTED: "evicted",
        FAILED: "failed by itself (charged to backoffLimit)",
    }
    parts = [f"{name} {what[reason]}" for name, reason in gone]
    return (
        f"rollout shrank: {'; '.join(parts)}; {now_ready} of {spec.rollout.replicas} rollout "
        f"workers ready (minReplicas {spec.rollout.fewest()}); a lost pod is made again "
        "when capacity allows"
    )[:1024]


def capacity(
    obs: Observed, spec: RLJobSpec, phase: str, holds: bool
) -> tuple[RolloutCapacityStatus | None, list[Event]]:
    """``status.rollout`` after this pass and the ``RolloutShrunk`` event of a loss (None and
    none for a job that is not elastic). ``holds``: the job still holds its pods or quota
    (running, or stopping below ``minReplicas`` with Kueue's admission still held): the
    below-minimum clock runs on; otherwise it stops."""
    if not elastic(spec):
        return None, []
    prev = obs.previous.rollout or RolloutCapacityStatus()
    now, fewest, count = rfc3339(obs.now), spec.rollout.fewest(), ready(obs)
    since = prev.below_min_since
    if count >= fewest or not holds:
        since = None
    elif since is None and prev.ready >= fewest and phase == RUNNING:
        since = now  # a drop below the minimum, not a start that has not reached it yet
    st = RolloutCapacityStatus(
        desired=spec.rollout.replicas,
        min_replicas=fewest,
        admitted=admitted(obs, spec),
        ready=count,
        below_min_since=since,
        last_shrink=prev.last_shrink,
    )
    gone = lost(obs, spec)
    if not gone:
        return st, []
    reason = next((r for _, r in gone if r != FAILED), FAILED)
    text = _shrink_text(gone, count, spec)
    st.last_shrink = RolloutShrink(now, reason, [n for n, _ in gone], text)
    return st, [Event("Normal", "RolloutShrunk", text)]


def condition(
    spec: RLJobSpec, st: RolloutCapacityStatus | None, phase: str, kueue: bool
) -> dict[str, tuple[str, str, str]]:
    """``RolloutCapacity`` of an elastic job (nothing for another)."""
    if st is None:
        return {}
    counts = f"{st.ready} of {st.desired} rollout workers ready, minReplicas {st.min_replicas}"
    if st.admitted is not None:
        counts += f", {st.admitted} admitted by Kueue"
    if phase in ("Succeeded", "Failed"):
        return {"RolloutCapacity": ("False", "JobFinished", f"job {phase.lower()}")}
    if st.ready >= st.min_replicas:
        return {"RolloutCapacity": ("True", "MinReplicasReady", counts)}
    if st.below_min_since is None:
        return {"RolloutCapacity": ("False", "WaitingForMinReplicas", counts)}
    grace = spec.rollout.below_min_grace_seconds
    then = (
        "it gives its Kueue quota back and waits to be admitted again"
        if kueue
        else "it waits for rollout workers (pods Pending for room)"
    )
    text = (
        f"{counts}, since {st.below_min_since}; past belowMinGraceSeconds={grace:g} the job "
        f"checkpoints and {then}"
    )
    return {"RolloutCapacity": ("False", BELOW, text)}
