"""``spec.scheduling.priorityClassName`` and ``spec.scheduling.topology`` (issue #52, items 2-3):
the fields' own bounds, the rule of the spec alone (a group named twice), and what each placer
can express (``rules.placement_errors``: Kueue, Volcano, KAI, core Kubernetes, coscheduling)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from longtail_api.manifest import validate_manifest
from longtail_api.rules import placement_errors
from longtail_api.scheduling import DefaultGang, GangSpec, effective_gang
from longtail_api.spec import RLJobSpec

MINIMAL: dict[str, Any] = {
    "apiVersion": "longtail.dev/v1alpha1",
    "kind": "RLJob",
    "metadata": {"name": "job"},
    "spec": {"model": {"path": "builtin:tiny"}, "dataset": {"path": "builtin:arith"}},
}
QUEUE = {"kueue.x-k8s.io/queue-name": "team-a"}
BLOCK = "network.topology.kubernetes.io/block"


def job(scheduling: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    obj = copy.deepcopy(MINIMAL)
    obj["spec"]["scheduling"] = scheduling
    if labels:
        obj["metadata"]["labels"] = labels
    return obj


def messages(obj: dict[str, Any]) -> list[str]:
    return [str(e) for e in validate_manifest(obj).errors]


def spec_of(scheduling: dict[str, Any]) -> RLJobSpec:
    result = validate_manifest(job(scheduling))
    assert result.ok and result.spec is not None, result.errors
    return result.spec


def placed(
    topology: list[dict[str, Any]],
    gang: dict[str, Any] | None,
    labels: dict[str, str] | None = None,
) -> list[str]:
    """``placement_errors`` of a job with ``topology`` and its own ``gang`` block."""
    block: dict[str, Any] = {"topology": topology}
    if gang is not None:
        block["gang"] = gang
    spec = spec_of(block)
    return [str(e) for e in placement_errors(spec, labels or {}, spec.scheduling.gang)]


def test_priority_class_and_topology_are_parsed_with_their_defaults() -> None:
    spec = spec_of(
        {"priorityClassName": "research-high", "topology": [{"group": "trainer", "level": BLOCK}]}
    )
    assert spec.scheduling.priority_class_name == "research-high"
    (entry,) = spec.scheduling.topology
    assert (entry.group, entry.level, entry.mode) == ("trainer", BLOCK, "required")
    plain = spec_of({})
    assert plain.scheduling.priority_class_name is None and plain.scheduling.topology == []


@pytest.mark.parametrize(
    ("scheduling", "path", "words"),
    [
        ({"priorityClassName": "High_Priority"}, "spec.scheduling.priorityClassName", "Priority"),
        ({"priorityClassName": "a" * 254}, "spec.scheduling.priorityClassName", "253"),
        ({"topology": [{"group": "verifier", "level": BLOCK}]}, "group", "job, trainer or rollout"),
        ({"topology": [{"group": "job", "level": "rack/"}]}, "level", "node label key"),
        ({"topology": [{"group": "job", "level": "-rack"}]}, "level", "node label key"),
        ({"topology": [{"group": "job", "level": "a/b/c"}]}, "level", "node label key"),
        ({"topology": [{"group": "job", "level": "x/" + "r" * 64}]}, "level", "node label key"),
        ({"topology": [{"group": "job", "level": BLOCK, "mode": "soft"}]}, "mode", "preferred"),
        ({"topology": [{"group": "job"}]}, "level", "required"),
        ({"gang": {"backend": "volcano", "topologyName": "t"}}, "gang.topologyName", "kai"),
        ({"gang": {"backend": "kai", "queue": "q", "topologyName": "T_1"}}, "topologyName", "KAI"),
    ],
)
def test_a_bad_field_names_the_field_the_value_and_the_fix(
    scheduling: dict[str, Any], path: str, words: str
) -> None:
    found = messages(job(scheduling))
    assert len(found) == 1, found
    assert path in found[0] and words in found[0], found


def test_label_keys_kubernetes_takes_are_accepted() -> None:
    for level in (
        "rack",
        "topology.kubernetes.io/zone",
        "cloud.provider.com/topology-rack",
        "A_b.c",
    ):
        assert not messages(job({"topology": [{"group": "job", "level": level}]})), level
    longest_name = "x/" + "r" * 63
    assert not messages(job({"topology": [{"group": "job", "level": longest_name}]}))


def test_a_group_named_twice_is_refused_by_the_spec_alone() -> None:
    twice = [{"group": "trainer", "level": BLOCK}, {"group": "trainer", "level": "rack"}]
    found = messages(job({"topology": twice}))
    assert found == [
        "spec.scheduling.topology[1].group: group 'trainer' appears twice (give each group one "
        "entry)"
    ]


def test_the_placement_rules_are_not_rules_of_the_spec_alone() -> None:
    """A worker validates the job's ConfigMap, which has no labels: what Kueue or the install's
    default gang decides cannot be checked there (the operator checks it, placement_errors)."""
    coscheduled = {
        "gang": {"backend": "coscheduling"},
        "topology": [{"group": "trainer", "level": BLOCK}],
    }
    assert messages(job(coscheduled)) == []
    assert placed(coscheduled["topology"], coscheduled["gang"], QUEUE) == []
    assert "coscheduling" in placed(coscheduled["topology"], coscheduled["gang"])[0]


def test_no_topology_is_fine_with_every_placer() -> None:
    for gang in (None, {"backend": "coscheduling"}, {"backend": "kubernetes"}):
        assert placed([], gang) == [] and placed([], gang, QUEUE) == []


def test_coscheduling_has_no_topology() -> None:
    (found,) = placed([{"group": "job", "level": BLOCK}], {"backend": "coscheduling"})
    assert found.startswith("spec.scheduling.topology: the coscheduling plugin has no topology")
    assert "use gang backend volcano, kai or kubernetes" in found


def test_core_kubernetes_takes_one_required_constraint_for_the_whole_group() -> None:
    gang = {"backend": "kubernetes"}
    assert placed([{"group": "job", "level": BLOCK}], gang) == []
    found = placed([{"group": "trainer", "level": BLOCK, "mode": "preferred"}], gang)
    assert len(found) == 2, found
    assert found[0].startswith("spec.scheduling.topology[0].group: core Kubernetes places one")
    assert "the trainer pods alone" in found[0] and "use group job" in found[0]
    assert found[1].startswith("spec.scheduling.topology[0].mode: core Kubernetes")
    assert "required constraints only" in found[1]


def test_volcano_places_the_job_and_each_role_group_hard_or_soft() -> None:
    """Volcano >= 1.15 takes soft mode for the job and for subgroups (volcano-sh/volcano #5206)."""
    gang = {"backend": "volcano"}
    every = [
        {"group": "job", "level": BLOCK, "mode": "preferred"},
        {"group": "trainer", "level": "rack"},
        {"group": "rollout", "level": "rack", "mode": "preferred"},
    ]
    assert placed(every, gang) == []


def test_kai_needs_the_name_of_its_topology_object() -> None:
    soft_trainer = [{"group": "trainer", "level": BLOCK, "mode": "preferred"}]
    named = {"backend": "kai", "queue": "q", "topologyName": "cluster-topology"}
    assert placed(soft_trainer, named) == []
    (found,) = placed(soft_trainer, {"backend": "kai", "queue": "q"})
    assert found.startswith("spec.scheduling.gang.topologyName: KAI places by the levels")
    assert "set it to the KAI Topology" in found


@pytest.mark.parametrize("gang", [None, {"backend": "none"}])
def test_a_topology_nothing_places_is_refused(gang: dict[str, Any] | None) -> None:
    (found,) = placed([{"group": "job", "level": BLOCK}], gang)
    assert found.startswith("spec.scheduling.topology: no scheduler places the job by topology")
    assert "kueue.x-k8s.io/queue-name" in found


def test_the_installs_default_gang_is_what_the_operator_checks_against() -> None:
    spec = spec_of({"topology": [{"group": "trainer", "level": BLOCK}]})
    default = DefaultGang(backend="coscheduling")
    (found,) = placement_errors(spec, {}, effective_gang(spec.scheduling.gang, default))
    assert "coscheduling" in str(found)
    volcano = effective_gang(None, DefaultGang(backend="volcano"))
    assert placement_errors(spec, {}, volcano) == []


def test_kueue_places_role_groups_whatever_the_gang() -> None:
    trainer = [{"group": "trainer", "level": BLOCK, "mode": "preferred"}]
    for gang in (None, {"backend": "coscheduling"}, {"backend": "kubernetes"}):
        assert placed(trainer, gang, QUEUE) == [], gang


def test_kueue_cannot_place_the_whole_job_in_one_domain() -> None:
    (found,) = placed([{"group": "job", "level": BLOCK}], {"backend": "volcano"}, QUEUE)
    assert found.startswith("spec.scheduling.topology[0].group: a job admitted through Kueue")
    assert "exactly two podSets" in found and "remove the label kueue.x-k8s.io/queue-name" in found


def test_kueue_takes_levels_of_at_most_63_characters() -> None:
    level = "example.com/" + "r" * 52  # 64 characters, a valid label key
    entry = [{"group": "rollout", "level": level}]
    (found,) = placed(entry, None, QUEUE)
    assert found.startswith("spec.scheduling.topology[0].level: Kueue takes a topology level")
    assert placed(entry, {"backend": "volcano"}) == []
    assert placed([{"group": "rollout", "level": level[:-1]}], None, QUEUE) == []


def test_placement_errors_take_the_gang_in_use_not_only_the_spec() -> None:
    """The gang argument wins over the spec's own block (the operator passes the effective one)."""
    spec = spec_of({"topology": [{"group": "job", "level": BLOCK}]})
    assert placement_errors(spec, {}, GangSpec("kubernetes")) == []
    assert placement_errors(spec, {}, None) != []
