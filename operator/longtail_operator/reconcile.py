"""One reconcile of one RLJob: observe, plan (pure, ``derive.py``), act, write status, post events.

The per-job daemon in ``runtime.py`` calls :meth:`Reconciler.reconcile` whenever the RLJob or
one of its pods changes, and at least every ``reconcile_period_s``. Every call starts from a
fresh GET of the RLJob and a LIST of its children, so nothing depends on which event woke it.
What it read becomes ``Observed`` (the pods, and every other owned object by key in
``Observed.owned``: Services, ConfigMap, the NetworkPolicies this install makes, the gang
group); the plan's rows (the desired set's diff, ``children.py`` and ``diff.py``) are carried
out by ``execute.py``.
API failures raise ``kopf.TemporaryError`` (the daemon waits with backoff and tries again); the
status is written only when it changed, as a merge patch of the status subresource. Before
anything else of a job that is not finished, the job's token is derived from the operator's key
and its Secret made when missing (``access.py``; no Secret is read); the token is kept in memory
for the operator's own write calls (checkpoint, role switches) and never logged.

A plan that creates or replaces objects first asks the API server whether it takes them (a
server-side dry run of each, ``Kube.refusal``). When it refuses one for good (an annotation or
a ConfigMap too long: a spec the API server stored but cannot turn into objects), none is
created: the refusals are handled as validation errors of the spec (``specgate.py``, reason
``ChildRejected``, the API's message in ``ValidationFailed`` and a Warning event), so a new job
starts nothing, half or whole, and a running job keeps running under its last accepted spec,
nothing deleted. The trainer's checkpoint before the pods go runs in the background
(``checkpoints.py``): the status and events are written every pass while it runs.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import kopf

from longtail_api.manifest import validate_manifest
from longtail_api.scheduling import GROUP_APIS
from longtail_api.spec import RLJobSpec
from longtail_api.wirecodec import to_wire
from longtail_api.workerapi import TrainerStatus
from longtail_operator import (
    access,
    builders,
    derive,
    gang,
    kueue,
    placement,
    specgate,
    trainergroup,
)
from longtail_operator.builders import JobRef
from longtail_operator.checkpoints import CheckpointCall, Checkpointing
from longtail_operator.clients import TrainerClient
from longtail_operator.execute import execute, patch_for, prune_none, refusals
from longtail_operator.harvester import Harvester
from longtail_operator.kube import Kube, KubeError
from longtail_operator.metrics import OperatorMetrics
from longtail_operator.model import TERMINAL, ObjectKey, Observed, Plan
from longtail_operator.observe import PodView, now_utc, parse_status
from longtail_operator.settings import Settings
from longtail_operator.sources import WorkerTarget
from longtail_operator.targets import harvest_targets, rank0

log = logging.getLogger(__name__)
KUEUE_RECHECK_S = 30.0
"""How often a reconcile of a job labelled for Kueue asks API discovery again whether Kueue's
Workload API is served (installing Kueue then takes effect within this)."""


@dataclass
class JobRuntime:
    """In-memory state of one RLJob between reconciles (lost on restart, rebuilt from status)."""

    namespace: str
    name: str
    harvester: Harvester | None = None
    spec: RLJobSpec | None = None
    phase: str = "Pending"
    targets: list[WorkerTarget] = field(default_factory=list)
    trainer_target: WorkerTarget | None = None
    """Trainer pod 0, whose report gives the harvest loop the rollout state (a target too only
    when ``trainer`` is in ``harvest.eligibleRoles``)."""
    counted: set[str] = field(default_factory=set)
    known: frozenset[tuple[str, str]] = frozenset()
    """``Observed.known``: the rollout pods alive after the last pass, not deleted by it."""
    checkpointing: Checkpointing = field(default_factory=Checkpointing)
    """The trainer's checkpoint before the pods go (``checkpoints.py``)."""
    last_error: str | None = None
    invalid: bool = False
    """The spec as written failed validation, or the API server refused objects made from it, at
    the last reconcile (the job may still run under its last accepted spec)."""
    token: str | None = field(default=None, repr=False)
    """The job's token, derived from the operator's key (``access.job_token``); never logged."""


def _owned(items: Iterable[dict[str, Any]], uid: str) -> list[dict[str, Any]]:
    return [
        o
        for o in items
        if any(r.get("uid") == uid for r in o.get("metadata", {}).get("ownerReferences") or [])
    ]


@dataclass(frozen=True)
class _Seen:
    """What one reconcile read of the job: the RLJob and its children."""

    body: dict[str, Any]
    job: JobRef
    pods: list[PodView]
    services: list[dict[str, Any]]
    configmap: dict[str, Any] | None


class Reconciler:
    def __init__(
        self,
        kube: Kube,
        settings: Settings,
        metrics: OperatorMetrics | None = None,
        clock: Callable[[], datetime] = now_utc,
        wake: Callable[[str, str], None] | None = None,
    ) -> None:
        self.kube, self.settings, self.metrics, self.clock = kube, settings, metrics, clock
        self.wake = wake
        """Wakes a job's loop (``Operator.wake``): a background checkpoint call ended."""
        self.trainer = TrainerClient(timeout=settings.http_timeout_s)
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="reconcile-io")
        self._kueue: tuple[float, bool | None] | None = None
        """When Kueue's presence was last read, and what was found."""

    def reconcile(self, rt: JobRuntime) -> str | None:
        """Reconcile one job; returns its phase (None once the RLJob is gone)."""
        started = time.perf_counter()
        try:
            phase = self._reconcile(rt)
        except KubeError as exc:
            rt.last_error = str(exc)
            self._record("retry", started, "ApiError")
            raise kopf.TemporaryError(str(exc), delay=1.0) from exc
        invalid = rt.invalid and phase is not None
        self._record(
            "invalid" if invalid else "ok", started, "ValidationFailed" if invalid else None
        )
        rt.last_error = None
        return phase

    def _record(self, result: str, started: float, reason: str | None) -> None:
        if self.metrics is not None:
            self.metrics.reconcile(result, time.perf_counter() - started, reason)

    def _reconcile(self, rt: JobRuntime) -> str | None:
        body = self.kube.get_job(rt.namespace, rt.name)
        if body is None:
            return None
        if body["metadata"].get("deletionTimestamp"):
            self.release_workload(body)
            return None
        meta = body["metadata"]
        job = JobRef(rt.name, rt.namespace, meta["uid"], int(meta.get("generation", 1)))
        pods_raw, services, configmaps = self.kube.list_children(job.namespace, job.name)
        pods = [v for v in (PodView.from_pod(p) for p in _owned(pods_raw, job.uid)) if v]
        cm = next(iter(_owned(configmaps, job.uid)), None)
        seen = _Seen(body, job, pods, _owned(services, job.uid), cm)
        obs = self._observe(rt, seen, ())
        plan = derive.plan(obs, self.settings)
        rejected = refusals(self.kube, self.pool, plan)
        if rejected:  # create none of them: the last accepted spec runs, or nothing
            obs = self._observe(rt, seen, rejected)
            plan = derive.plan(obs, self.settings)
            if obs.spec is not None and refusals(self.kube, self.pool, plan):
                obs = self._refused_too(obs)  # its own objects are refused (not the edit's)
                plan = derive.plan(obs, self.settings)
        self._checkpoint(rt, plan, pods)
        failures = [e for e in plan.events if e.reason == "WorkerFailed"]
        for event in failures:  # a crash's last log lines are recorded before its pod goes
            self.kube.post_event(job, event)
        execute(self.kube, self.pool, job, plan)
        rt.counted.update(plan.counted)
        gone = set(plan.delete_pods)
        rt.known = frozenset(
            (q.name, q.uid) for q in pods if q.role == "rollout" and q.active and q.name not in gone
        )
        new_status = prune_none(to_wire(plan.status))
        if new_status != body.get("status"):
            self.kube.patch_status(
                job.namespace, job.name, patch_for(body.get("status"), new_status)
            )
        for event in plan.events:
            if event not in failures:
                self.kube.post_event(job, event)
        rt.phase = plan.status.phase
        rt.invalid = bool(obs.errors or obs.rejected)
        rt.targets, rt.trainer_target = self._targets(rt.spec, pods, plan)
        if self.metrics is not None:
            gpus = plan.status.gpus
            self.metrics.job_gpus(
                job.namespace, job.name, gpus.total, gpus.idle, gpus.harvested, gpus.drafter
            )
            h, running = obs.harvest, plan.status.phase in ("Running", "Initializing")
            lost = len(h.unreachable) if h is not None and running else 0
            self.metrics.unreachable_workers(job.namespace, job.name, lost)
            if h is not None and running:
                self.metrics.idleness_source_up(job.namespace, job.name, h.source_error is None)
        return rt.phase

    def _observe(self, rt: JobRuntime, seen: _Seen, rejected: tuple[str, ...]) -> Observed:
        """The planner's input; ``rejected``: the API server's refusals of objects made from
        the spec as written (the spec gate then falls back as for an invalid edit)."""
        body, job, pods, cm = seen.body, seen.job, seen.pods, seen.configmap
        labels = body["metadata"].get("labels") or {}
        admits = self.settings.kueue and derive.QUEUE_LABEL in labels
        kueue_served = self._kueue_served() if admits else None
        checked = validate_manifest({k: v for k, v in body.items() if k != "status"})
        previous = parse_status(body.get("status"))
        edit = checked.spec if not checked.errors else None
        refused = placement.refusals(edit, self.settings, labels)
        errors = tuple(str(e) for e in (*checked.errors, *refused))
        cm_data = (cm.get("data") or {}) if cm is not None else None
        gate = specgate.decide(
            checked.spec,
            body.get("spec") or {},
            errors,
            cm_data,
            pods,
            finished=previous.phase in TERMINAL,
            rejected=rejected,
        )
        rt.spec = gate.spec  # the spec the job runs under: the edit, or the last accepted one
        self._ensure_token(rt, job, (body.get("status") or {}).get("phase"))
        workload = self._workload(job) if kueue_served else None
        return Observed(
            job=job,
            spec=rt.spec,
            raw_spec=gate.raw_spec,
            errors=errors,
            rejected=rejected,
            gate=gate,
            previous=previous,
            pods=tuple(pods),
            owned=self._owned_objects(job, rt.spec, seen),
            now=self.clock(),
            trainer=self._trainer_status(pods) if rt.spec is not None else None,
            harvest=rt.harvester.snapshot() if rt.harvester is not None else None,
            counted=frozenset(rt.counted),
            known=rt.known,
            queue=labels.get(derive.QUEUE_LABEL),
            priority=labels.get(kueue.PRIORITY_LABEL),
            kueue_served=kueue_served,
            kueue_enabled=self.settings.kueue,
            workload=workload,
            workload_priority=self._priority(rt.spec, labels)
            if kueue_served and not workload
            else None,
        )

    @staticmethod
    def _refused_too(obs: Observed) -> Observed:
        """The last accepted spec's own objects are refused too (a spec made live while the job
        was suspended, a refusal of the namespace's): touch nothing, say why."""
        shown = "; ".join(obs.rejected)
        text = f"nothing is created until the API server takes the job's objects: {shown}"
        gate = dataclasses.replace(
            obs.gate or specgate.SpecGate(None, obs.raw_spec, specgate.REJECTED, ""),
            spec=None,
            reason=specgate.REJECTED,
            message=text[:32000],
        )
        return dataclasses.replace(obs, spec=None, gate=gate)

    def _ensure_token(self, rt: JobRuntime, job: JobRef, phase: str | None) -> None:
        """Have the job's token in ``rt`` while the job runs (not for invalid or finished ones)."""
        if rt.token is None and rt.spec is not None and phase not in TERMINAL:
            rt.token = self._job_token(job)

    def _job_token(self, job: JobRef) -> str:
        """The job's token, derived from the operator's key (``access.job_token``), and its
        Secret for the pods, made when absent (409: made before, by this key or an earlier one).
        No Secret is read: the operator may not read the jobs' Secrets."""
        key = self.settings.token_key
        if not key:
            raise KubeError(
                f"job token of {job.namespace}/{job.name}",
                0,
                "no token key loaded (the operator loads it at start-up from "
                f"Secret {self.settings.operator_namespace}/{self.settings.token_key_secret})",
            )
        token = access.job_token(key, job)
        self.kube.create(access.job_secret(job, token, key))
        return token

    def _owned_objects(
        self, job: JobRef, spec: RLJobSpec | None, seen: _Seen
    ) -> dict[ObjectKey, dict[str, Any]]:
        """The job's Services and ConfigMap (listed), its NetworkPolicies (read by name while
        this install makes them) and its gang group (read while the job has one), by key."""
        out = {ObjectKey("v1", "Service", o["metadata"]["name"]): o for o in seen.services}
        if seen.configmap is not None:
            name = seen.configmap["metadata"]["name"]
            out[ObjectKey("v1", "ConfigMap", name)] = seen.configmap
        if self.settings.network_policy:
            for name in access.policy_names(job.name):
                policy = self.kube.get_network_policy(job.namespace, name)
                if policy is not None:
                    out[ObjectKey(access.POLICY_API, "NetworkPolicy", name)] = policy
        placed = builders.job_gang(spec, self.settings) if spec is not None else None
        if placed is not None:
            api_version = "/".join(GROUP_APIS[placed.backend])
            name = gang.group_name(job.name)
            group = self.kube.read_custom(api_version, gang.PLURAL, job.namespace, name)
            if group is not None:
                out[ObjectKey(api_version, gang.KIND, name)] = group
        return out

    def _trainer_status(self, pods: list[PodView]) -> TrainerStatus | None:
        """The trainer's report, from pod 0 (rank 0 serves HTTP; the other pods serve none)."""
        trainer = rank0(pods, active=True)
        if trainer is None or trainer.ip is None:
            return None
        answer = self.trainer.status(trainer.ip, self.settings.trainer_port)
        if self.metrics is not None:
            self.metrics.status_poll("trainer", not isinstance(answer, str))
        return None if isinstance(answer, str) else answer

    def _checkpoint(self, rt: JobRuntime, plan: Plan, pods: list[PodView]) -> None:
        """Suspend, an eviction, or a failure the operator decides
        (``derive.CHECKPOINT_BEFORE``): the trainer checkpoints before its pods go. The call
        runs in the background (``checkpoints.py``); until it answers, or the checkpoint
        timeout passes, the pods are kept while the status and events are written as planned.
        A trainer that answers at once has its checkpoint on disk before the status is."""
        ck = rt.checkpointing
        if not plan.checkpoint:
            ck.drop()
            if rt.spec is not None and not rt.spec.suspend:
                ck.reset()
            return
        trainer = rank0(pods, active=False)
        if trainer is None:  # the planner asks only while pod 0 runs; it went meanwhile
            return
        reason = plan.checkpoint_reason

        def start(left: float) -> CheckpointCall:
            ask = functools.partial(
                self.trainer.checkpoint,
                trainer.ip or "",
                self.settings.trainer_port,
                reason=reason,
                timeout=max(left, 1.0),
                token=rt.token,
            )
            return CheckpointCall(trainer.uid, reason, ask, self._waker(rt))

        timeout_s = self.settings.checkpoint_timeout_s
        ready, events = ck.advance(trainer.uid, reason, timeout_s, start)
        plan.events.extend(events)
        if not ready:
            plan.keep_pods()  # until the trainer answers
            held = ("DeletedPods", trainergroup.WORLD_CHANGED)  # said when they do go
            plan.events = [e for e in plan.events if e.reason not in held]

    def _waker(self, rt: JobRuntime) -> Callable[[], None]:
        wake = self.wake
        if wake is None:
            return lambda: None
        return functools.partial(wake, rt.namespace, rt.name)

    def _workload(self, job: JobRef) -> kueue.View | None:
        """The job's Workload with the ResourceFlavors its admission names (None: none)."""
        name = kueue.workload_name(job.name, job.uid)
        obj = self.kube.read_custom(kueue.API_VERSION, kueue.WORKLOADS, job.namespace, name)
        if obj is None:
            return None
        flavors = {}
        for f in sorted(kueue.flavors_of(obj)):
            found = self.kube.read_custom(kueue.API_VERSION, kueue.FLAVORS, None, f)
            if found is None:
                raise KubeError(f"get resourceflavor {f}", 404, "admitted with a missing flavor")
            flavors[f] = found
        return kueue.view(obj, flavors)

    def _priority(self, spec: RLJobSpec | None, labels: dict[str, str]) -> kueue.Priority | None:
        """The priority class a Workload about to be made names, with its value read (None:
        no class named; ``value`` None: no such class)."""
        if spec is None:
            return None
        want = kueue.priority_source(
            labels.get(kueue.PRIORITY_LABEL), spec.scheduling.priority_class_name
        )
        if want is None:
            return None
        found = self.kube.read_custom(want.api_version, want.plural, None, want.name)
        value = found.get("value") if found is not None else None
        return dataclasses.replace(want, value=value if isinstance(value, int) else None)

    def release_workload(self, body: dict[str, Any]) -> None:
        """An RLJob being deleted: take Kueue's finalizer off its Workload (the garbage
        collector deletes it with the job), as Kueue's job framework does."""
        meta = body["metadata"]
        labelled = derive.QUEUE_LABEL in (meta.get("labels") or {})
        if not (self.settings.kueue and labelled and self._kueue_served()):
            return
        name = kueue.workload_name(meta["name"], meta["uid"])
        drop = {"metadata": {"finalizers": None}}
        self.kube.patch_custom(kueue.API_VERSION, kueue.WORKLOADS, meta["namespace"], name, drop)

    def _kueue_served(self) -> bool | None:
        """Whether Kueue's Workload API is served, read at most every ``KUEUE_RECHECK_S`` (None
        when discovery fails: the job waits, it never starts around a queue)."""
        now = time.monotonic()
        if self._kueue is None or now - self._kueue[0] >= KUEUE_RECHECK_S:
            try:
                served: bool | None = kueue.API_VERSION in self.kube.served_apis()
            except KubeError as exc:
                log.warning("API discovery failed, Kueue's presence unknown: %s", exc)
                served = None
            self._kueue = (now, served)
        return self._kueue[1]

    def _targets(
        self, spec: RLJobSpec | None, pods: list[PodView], plan: Plan
    ) -> tuple[list[WorkerTarget], WorkerTarget | None]:
        """The harvest targets, and trainer pod 0 (running) for its rollout report."""
        if spec is None:
            return [], None
        gone = set(plan.delete_pods)
        trainer = harvest_targets(spec, pods, gone, self.settings, roles={"trainer"})
        return harvest_targets(spec, pods, gone, self.settings), next(iter(trainer), None)
