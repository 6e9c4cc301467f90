"""Topology-aware placement of an RLJob's pods: ``spec.scheduling.topology`` (issue #52, item 2).

The trainer group's collectives and the broadcast from the trainer to the rollout workers are
link-bound, so a job may ask for a role group (``trainer``, ``rollout``) or the whole ``job`` to
be placed within one domain of a node label (a rack, a block, an NVLink domain), as a hard
requirement or a preference. ``scheduling.py`` holds the list in ``SchedulingSpec``; the
operator maps each entry to what the placing scheduler takes (docs/scheduling.md, "Topology"):

- Kueue (the RLJob label :data:`KUEUE_QUEUE_LABEL`): the role's Workload podSet
  ``topologyRequest.required`` / ``preferred``, enforced by Kueue's topology ungater;
- Volcano: the PodGroup's ``networkTopology`` (the job) or a ``subGroupPolicy`` entry (a role),
  with ``highestTierName`` = the level (HyperNode tiers discovered from node labels are named
  after the label key);
- KAI: the PodGroup's ``topologyConstraint`` (the job) or the role subgroup's, naming the
  cluster's KAI ``Topology`` (``gang.topologyName``);
- core ``scheduling.k8s.io`` PodGroup: ``schedulingConstraints.topology[0].key`` (the whole
  group, required only);
- scheduler-plugins coscheduling: nothing (it has no topology).

:func:`duplicate_problems` is a rule of the spec alone (``rules.py``). :func:`topology_problems`
says what the placer cannot express; it depends on the RLJob's Kueue label and on the gang the
job actually gets (the install's default included), which the spec alone does not show, so
``rules.placement_errors`` is called by the operator (and ``longtail validate``), never by a
worker reading the job's ConfigMap, which carries no labels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from longtail_api.fields import spec_field

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
"""The RLJob label that asks for admission by Kueue (the operator's ``kueue.QUEUE_LABEL``)."""

LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
"""A Kubernetes label key: an optional DNS-subdomain prefix and ``/``, then a name of at most
63 characters (letters, digits, ``-``, ``_``, ``.``; alphanumeric at both ends)."""
LABEL_KEY_MAX = 317
"""A prefix of at most 253 characters, ``/`` and a name of at most 63."""
KUEUE_LEVEL_MAX = 63
"""Kueue's Workload takes a topology level of at most 63 characters (``topologyRequest``)."""

TopologyGroup = Literal["job", "trainer", "rollout"]
TopologyMode = Literal["required", "preferred"]


@dataclass
class TopologySpec:
    """One group of the job's pods placed within one domain of a node label."""

    group: TopologyGroup = spec_field(fix="use job, trainer or rollout")
    """Which pods: ``trainer`` (the trainer group, whose ranks run collectives), ``rollout``
    (the rollout workers) or ``job`` (every pod of the job, the verifier and drafter pods
    included). At most one entry per group."""
    level: str = spec_field(
        pattern=LABEL_KEY_PATTERN,
        pattern_hint="a node label key such as network.topology.kubernetes.io/block",
        max_length=LABEL_KEY_MAX,
    )
    """The node label whose value names a domain (``topology.kubernetes.io/zone``,
    ``network.topology.kubernetes.io/block``, a rack or NVLink-domain label): the group's pods
    go to nodes sharing one value of it. Kueue: a level of the flavour's ``Topology``; KAI: a
    level of the cluster's KAI ``Topology`` (``gang.topologyName``); Volcano: the HyperNode
    tier name (``highestTierName``), which Volcano's label discovery sets to the label key."""
    mode: TopologyMode = spec_field("required")
    """``required``: the group waits until one domain can hold all of it; ``preferred``: one
    domain if possible, else the fewest (Kueue, KAI; Volcano's soft mode packs the group as
    close as it can at any tier; core Kubernetes takes ``required`` only)."""


Problem = tuple[str, str, str]
"""``(field under spec.scheduling, what is wrong, fix)``."""


def duplicate_problems(topology: list[TopologySpec]) -> list[Problem]:
    """A group named twice (``rules.py``: a rule of the spec alone)."""
    out: list[Problem] = []
    seen: set[str] = set()
    for i, entry in enumerate(topology):
        if entry.group in seen:
            why = f"group {entry.group!r} appears twice"
            out.append((f"topology[{i}].group", why, "give each group one entry"))
        seen.add(entry.group)
    return out


def topology_problems(
    topology: list[TopologySpec],
    backend: str | None,
    kueue: bool,
    kai_topology: str | None = None,
) -> list[Problem]:
    """What the job's placer cannot express of ``topology``. ``backend``: the gang backend that
    places the pods (None: no gang); ``kueue``: the job is admitted through Kueue, whose
    topology-aware scheduling then places every entry (a gang scheduler only gangs);
    ``kai_topology``: ``gang.topologyName``. Not a rule of the spec alone: the caller must know
    the job's labels and the gang it actually gets (the install's default too), so the
    operator checks it (docs/scheduling.md), not a worker reading the job's ConfigMap."""
    if not topology:
        return []
    if kueue:
        return _kueue(topology)
    return _gang(topology, backend, kai_topology)


def _kueue(topology: list[TopologySpec]) -> list[Problem]:
    out: list[Problem] = []
    for i, entry in enumerate(topology):
        if entry.group == "job":
            why = (
                "a job admitted through Kueue gets its topology from Kueue, whose podSet groups "
                "hold exactly two podSets (one of a single pod), and an RLJob has a podSet per "
                "role (trainer, rollout, verifier, drafter)"
            )
            fix = (
                f"use group trainer and/or rollout, or remove the label {KUEUE_QUEUE_LABEL} "
                "and place the whole job with gang backend volcano, kai or kubernetes"
            )
            out.append((f"topology[{i}].group", why, fix))
        if len(entry.level) > KUEUE_LEVEL_MAX:
            why = (
                f"Kueue takes a topology level of at most {KUEUE_LEVEL_MAX} characters, got "
                f"{entry.level!r} ({len(entry.level)})"
            )
            out.append((f"topology[{i}].level", why, "use a shorter node label key"))
    return out


def _gang(topology: list[TopologySpec], backend: str | None, kai: str | None) -> list[Problem]:
    if backend is None:
        why = (
            "no scheduler places the job by topology: it has no gang backend and no Kueue "
            "queue label"
        )
        fix = (
            "set scheduling.gang.backend to volcano, kai or kubernetes, or label the job "
            f"{KUEUE_QUEUE_LABEL}"
        )
        return [("topology", why, fix)]
    if backend == "coscheduling":
        groups = ", ".join(entry.group for entry in topology)
        why = f"the coscheduling plugin has no topology placement, got groups {groups}"
        fix = "use gang backend volcano, kai or kubernetes, or remove scheduling.topology"
        return [("topology", why, fix)]
    out: list[Problem] = []
    for i, entry in enumerate(topology):
        at = f"topology[{i}]"
        if backend == "kubernetes" and entry.group != "job":
            why = (
                f"core Kubernetes places one PodGroup per RLJob, whose topology constraint "
                f"covers all its pods, not the {entry.group} pods alone"
            )
            fix = "use group job, or gang backend volcano or kai"
            out.append((f"{at}.group", why, fix))
        if backend == "kubernetes" and entry.mode == "preferred":
            why = (
                "core Kubernetes topology-aware scheduling takes required constraints only, "
                "got 'preferred'"
            )
            fix = "use mode required, or gang backend volcano or kai"
            out.append((f"{at}.mode", why, fix))
    if backend == "kai" and not kai:
        why = "KAI places by the levels of one of the cluster's KAI Topology objects, none named"
        out.append(("gang.topologyName", why, "set it to the KAI Topology holding the level"))
    return out
