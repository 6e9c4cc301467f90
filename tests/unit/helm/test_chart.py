"""The Helm chart with the real helm: lint, render, offline validation, schema, security, RBAC.

Renders default values, every optional feature on (``ci/all-features-values.yaml``) and
namespaced mode (``ci/namespaced-values.yaml``); validates built-in kinds with
``kubernetes-validate`` (strict) against the oldest and newest schemas it ships; checks that a
bad values file is rejected by ``values.schema.json`` naming each bad field.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from longtail_api.scheduling import BACKENDS, GROUP_APIS
from longtail_operator.settings import from_env

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "helm" / "longtail"

VALUE_FILES = {
    "default": (),
    "all-features": ("ci/all-features-values.yaml",),
    "namespaced": ("ci/namespaced-values.yaml",),
}
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
"""Prometheus Operator kinds: no offline schema exists; their shape is checked below."""
K8S_SCHEMA_VERSIONS = ("1.25.0", "1.37.0")


def kinds(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = kinds(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


@pytest.mark.parametrize("case", sorted(VALUE_FILES))
def test_lint_strict(helm, case: str) -> None:
    args = ["lint", "--strict", str(CHART)]
    for f in VALUE_FILES[case]:
        args += ["-f", str(CHART / f)]
    out = helm(*args).stdout
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("case", sorted(VALUE_FILES))
def test_rendered_builtin_kinds_validate_offline(render, case: str) -> None:
    docs = render(*VALUE_FILES[case])
    assert docs
    for doc in docs:
        if doc["kind"] in MONITORING_KINDS:
            continue
        for version in K8S_SCHEMA_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                name = f"{doc['kind']}/{doc['metadata']['name']}"
                pytest.fail(f"{case}: {name} invalid for Kubernetes {version}: {exc.message}")


def test_default_render_has_operator_rbac_dashboards_and_no_monitoring_crs(render) -> None:
    docs = render()
    counts = {k: len(kinds(docs, k)) for k in {d["kind"] for d in docs}}
    assert counts == {
        "ServiceAccount": 1,
        "ClusterRole": 3,  # operator, rljob viewer, rljob editor
        "ClusterRoleBinding": 1,
        "Role": 1,  # in the release namespace: the operator's Lease and token key
        "RoleBinding": 1,
        "Deployment": 1,
        "Service": 1,
        "ConfigMap": 3,  # one per dashboard
    }


def test_operator_deployment_is_leader_elected_and_restricted(render) -> None:
    docs = render()
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 1
    # Leader election: the new pod waits as a standby, the old one releases on SIGTERM.
    assert dep["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert container["image"] == "ghcr.io/longtail-dev/longtail-operator:0.1.0"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] in ports
    # The read-only root filesystem gets a writable /tmp.
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    # The Lease identity is the pod's name: a restarted container re-takes its own Lease.
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    sa = one(docs, "ServiceAccount")
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    svc = one(docs, "Service")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"


def test_operator_settings_env_and_digest(render) -> None:
    env = _env(render())
    assert env["LONGTAIL_OPERATOR_NAMESPACES"] == ""  # cluster scope: all namespaces
    assert env["LONGTAIL_OPERATOR_METRICS_PORT"] == "8080"
    ns_env = _env(render("ci/namespaced-values.yaml"))
    assert ns_env["LONGTAIL_OPERATOR_NAMESPACES"] == "ml-team-a,ml-team-b"
    dep = one(render("ci/all-features-values.yaml"), "Deployment")
    image = dep["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "ghcr.io/longtail-dev/longtail-operator@sha256:" + "0" * 64


def _env(docs: list[dict[str, Any]]) -> dict[str, str]:
    container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def _rules_file() -> dict[str, Any]:
    return yaml.safe_load((CHART / "files" / "operator-rbac.yaml").read_text())


def test_chart_rbac_lists_are_the_operators_cluster_roles() -> None:
    source = yaml.safe_load_all((REPO / "operator" / "rbac" / "clusterrole.yaml").read_text())
    roles = {d["metadata"]["name"]: d["rules"] for d in source if d}
    rules = _rules_file()
    assert rules["jobRules"] == roles["longtail-operator"]
    assert rules["clusterRules"] == roles["longtail-operator-discovery"]
    assert rules["homeRules"] == roles["longtail-operator-home"]
    assert rules["kueueRules"] == roles["longtail-operator-kueue"]
    assert rules["kueueClusterRules"] == roles["longtail-operator-kueue-flavors"]
    gang = rules["gangRules"]
    assert [r for b in BACKENDS for r in gang[b]] == roles["longtail-operator-gang"]
    assert {b: gang[b][0]["apiGroups"] for b in BACKENDS} == {
        b: [group] for b, (group, _) in GROUP_APIS.items()
    }


def _job_rules(rules: dict[str, Any], backends: tuple[str, ...] = BACKENDS) -> list[Any]:
    """jobRules as the chart extends them: Kueue's, then each gang backend's rule."""
    gang = [r for b in backends for r in rules["gangRules"][b]]
    return rules["jobRules"] + rules["kueueRules"] + gang


def test_scheduling_rbac_follows_the_values(render) -> None:
    """Issue #37: Kueue's and each gang backend's permissions are granted only when the values
    ask for them; ResourceFlavors (cluster-scoped) through the ClusterRole in both scopes."""
    rules = _rules_file()
    docs = render(set=("scheduling.kueue=false", "scheduling.gangBackends={volcano,kubernetes}"))
    (role,) = [d for d in kinds(docs, "ClusterRole") if d["metadata"]["name"].endswith("-operator")]
    gang = rules["gangRules"]["volcano"] + rules["gangRules"]["kubernetes"]
    assert role["rules"] == rules["clusterRules"] + rules["jobRules"] + gang
    env = _env(docs)
    assert env["LONGTAIL_OPERATOR_KUEUE"] == "false"
    assert env["LONGTAIL_OPERATOR_GANG_BACKENDS"] == "volcano,kubernetes"
    assert "LONGTAIL_OPERATOR_DEFAULT_GANG_BACKEND" not in env
    docs = render("ci/namespaced-values.yaml", set=("scheduling.gangBackends={kai}",))
    (cluster_role,) = kinds(docs, "ClusterRole")
    assert cluster_role["rules"] == rules["clusterRules"] + rules["kueueClusterRules"]
    jobs = [r for r in kinds(docs, "Role") if not _home(r)]
    assert jobs and all(r["rules"] == _job_rules(rules, ("kai",)) for r in jobs)


def test_default_gang_values_reach_the_operator_and_bad_ones_are_refused(render, helm) -> None:
    sets = ("scheduling.defaultGang.backend=kai", "scheduling.defaultGang.queue=team-a")
    env = _env(render(set=sets))
    assert env["LONGTAIL_OPERATOR_DEFAULT_GANG_BACKEND"] == "kai"
    assert env["LONGTAIL_OPERATOR_DEFAULT_GANG_QUEUE"] == "team-a"
    assert from_env(env).default_gang.backend == "kai"
    bad = {
        "scheduling.defaultGang.backend=kai": "queue",  # KAI needs a queue
        "scheduling.defaultGang.backend=slurm": "backend",
        "scheduling.gangBackends={volcano,yarn}": "gangBackends",
    }
    for value, field in bad.items():
        proc = helm("template", "t", str(CHART), "--set", value, check=False)
        assert proc.returncode != 0 and field in proc.stderr, (value, proc.stderr)


def test_cluster_scope_rbac_is_exactly_the_rules_file(render) -> None:
    docs = render()
    rules = _rules_file()
    role = next(
        d for d in kinds(docs, "ClusterRole") if d["metadata"]["name"].endswith("-operator")
    )
    assert role["rules"] == rules["clusterRules"] + rules["kueueClusterRules"] + _job_rules(rules)
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": one(docs, "ServiceAccount")["metadata"]["name"],
            "namespace": "lt",
        }
    ]
    assert [r["metadata"]["name"] for r in kinds(docs, "Role")] == ["t-longtail-operator-home"]


def test_namespaced_scope_has_a_role_per_watched_namespace(render) -> None:
    docs = render("ci/namespaced-values.yaml")
    rules = _rules_file()
    (cluster_role,) = kinds(docs, "ClusterRole")  # aggregation roles are off in this file
    assert cluster_role["rules"] == rules["clusterRules"] + rules["kueueClusterRules"]
    roles = {r["metadata"]["namespace"]: r for r in kinds(docs, "Role") if not _home(r)}
    assert set(roles) == {"ml-team-a", "ml-team-b"}
    assert all(r["rules"] == _job_rules(rules) for r in roles.values())
    bindings = {b["metadata"]["namespace"]: b for b in kinds(docs, "RoleBinding") if not _home(b)}
    assert set(bindings) == set(roles)
    for b in bindings.values():
        assert b["subjects"][0]["namespace"] == "lt" and b["roleRef"]["kind"] == "Role"
    # Empty watchNamespaces means the release namespace.
    docs = render(set=("rbac.scope=namespaced",), namespace="solo")
    assert [r["metadata"]["namespace"] for r in kinds(docs, "Role") if not _home(r)] == ["solo"]


def _home(obj: dict[str, Any]) -> bool:
    return bool(obj["metadata"]["name"].endswith("-operator-home"))


def test_operator_reads_no_secret_but_its_key_and_holds_its_lease_at_home(render) -> None:
    """Issue #32, item 9: no ``get`` on Secrets in the jobs' namespaces (the job tokens are
    derived from the operator's key); in the release namespace exactly the key Secret by name,
    and the Lease."""
    rules = _rules_file()
    for rule in rules["jobRules"] + rules["clusterRules"]:
        if "secrets" in rule["resources"]:
            assert rule["verbs"] == ["create"], rule
    for case in ((), ("ci/namespaced-values.yaml",)):
        docs = render(*case)
        (home,) = [r for r in kinds(docs, "Role") if _home(r)]
        assert home["metadata"]["namespace"] == "lt" and home["rules"] == rules["homeRules"]
        (binding,) = [b for b in kinds(docs, "RoleBinding") if _home(b)]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": home["metadata"]["name"],
        }
        assert binding["subjects"][0]["name"] == one(docs, "ServiceAccount")["metadata"]["name"]
    reads = [r for r in rules["homeRules"] if "get" in r["verbs"]]
    assert {(r["resources"][0], tuple(r["resourceNames"])) for r in reads} == {
        ("secrets", ("longtail-operator-token-key",)),
        ("leases", ("longtail-operator-leader",)),
    }


def test_two_replicas_need_leader_election(render, helm) -> None:
    docs = render(set=("replicaCount=2", "leaderElection.leaseDurationSeconds=20"))
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    env = _env(docs)
    assert env["LONGTAIL_OPERATOR_LEADER_ELECTION"] == "true"
    assert env["LONGTAIL_OPERATOR_LEASE_DURATION_S"] == "20"
    assert env["LONGTAIL_OPERATOR_RENEW_DEADLINE_S"] == "10"
    assert env["LONGTAIL_OPERATOR_RETRY_PERIOD_S"] == "2"
    single = one(render(set=("leaderElection.enabled=false",)), "Deployment")
    assert single["spec"]["strategy"] == {"type": "Recreate"}
    args = ["template", "t", str(CHART), "--set", "replicaCount=2"]
    proc = helm(*args, "--set", "leaderElection.enabled=false", check=False)
    assert proc.returncode != 0
    assert "replicaCount > 1 needs leaderElection.enabled=true" in proc.stderr


def test_aggregated_rljob_roles(render) -> None:
    roles = {r["metadata"]["name"]: r for r in kinds(render(), "ClusterRole")}
    viewer, editor = roles["t-longtail-rljob-viewer"], roles["t-longtail-rljob-editor"]
    agg = "rbac.authorization.k8s.io/aggregate-to-"
    assert viewer["metadata"]["labels"][agg + "view"] == "true"
    assert editor["metadata"]["labels"][agg + "edit"] == "true"
    assert agg + "view" not in editor["metadata"]["labels"]
    assert viewer["rules"][0]["verbs"] == ["get", "list", "watch"]
    assert "create" in editor["rules"][0]["verbs"] and "get" not in editor["rules"][0]["verbs"]


def test_optional_monitoring_objects(render) -> None:
    docs = render("ci/all-features-values.yaml")
    monitors = {m["metadata"]["name"]: m for m in kinds(docs, "ServiceMonitor")}
    assert set(monitors) == {"t-longtail-operator", "t-longtail-dcgm-exporter"}
    sm, pm = monitors["t-longtail-operator"], one(docs, "PodMonitor")
    for obj in (*monitors.values(), pm, one(docs, "PrometheusRule")):
        assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True
    assert sm["spec"]["selector"]["matchLabels"].items() <= (
        one(docs, "Service")["metadata"]["labels"].items()
    )
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["ml-team-a", "ml-team-b"]}
    relabel = {
        r["targetLabel"]: r["sourceLabels"]
        for r in pm["spec"]["podMetricsEndpoints"][0]["relabelings"]
    }
    assert relabel == {
        "rljob": ["__meta_kubernetes_pod_label_longtail_dev_rljob"],
        "worker_role": ["__meta_kubernetes_pod_label_longtail_dev_role"],
    }
    assert render(set=("workerMonitor.enabled=true",)) and one(
        render(set=("workerMonitor.enabled=true",)), "PodMonitor"
    )["spec"]["namespaceSelector"] == {"any": True}


def test_worker_monitor_matches_the_operators_pod_labels() -> None:
    builders = pytest.importorskip("longtail_operator.builders")
    values = yaml.safe_load((CHART / "values.yaml").read_text())["workerMonitor"]
    assert values["jobLabel"] == builders.LABEL_JOB
    assert values["roleLabel"] == builders.LABEL_ROLE


def test_dashboards_shipped_verbatim_as_sidecar_configmaps(render) -> None:
    docs = render("ci/all-features-values.yaml")
    maps = kinds(docs, "ConfigMap")
    files = {p.name: p.read_text() for p in (CHART / "dashboards").glob("*.json")}
    assert len(maps) == len(files) == 3
    shipped = {}
    for cm in maps:
        assert cm["metadata"]["namespace"] == "monitoring"
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "Longtail"}
        shipped.update(cm["data"])
    # Byte-identical apart from the final newline that `|-` strips: {{pod}} legends survive.
    assert shipped == {name: text.rstrip("\n") for name, text in files.items()}
    assert any("{{pod}}" in text for text in shipped.values())
    assert not kinds(render(set=("dashboards.enabled=false",)), "ConfigMap")


def test_prometheusrule_is_the_rules_file_minus_disabled_plus_labels(render) -> None:
    docs = render("ci/all-features-values.yaml")
    spec = one(docs, "PrometheusRule")["spec"]
    source = yaml.safe_load((CHART / "files" / "alerts.rules.yaml").read_text())
    expected = []
    for group in source["groups"]:
        rules = [
            {**r, "labels": {**r.get("labels", {}), "team": "ml-platform"}}
            for r in group["rules"]
            if r["alert"] != "LongtailRoleSwitchSlow"
        ]
        expected.append({"name": group["name"], "rules": rules})
    assert spec["groups"] == expected
    # An alert's own label wins over ruleLabels.
    docs = render(set=("prometheusRule.enabled=true", "prometheusRule.ruleLabels.severity=page"))
    rules = [r for g in one(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    assert {r["labels"]["severity"] for r in rules} == {"critical", "warning", "info"}


def test_rendered_prometheusrule_passes_promtool(render, promtool, tmp_path) -> None:
    spec = one(render("ci/all-features-values.yaml"), "PrometheusRule")["spec"]
    path = tmp_path / "rendered.rules.yaml"
    path.write_text(yaml.safe_dump(spec))
    proc = subprocess.run(
        [str(promtool), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 6 rules found" in proc.stdout


BAD_VALUES = """
rbac:
  scope: everywhere
  watchNamespaces: [Team_A]
metrics:
  port: "8080"
  serviceMonitor:
    interval: soon
workerMonitr:
  enabled: true
image:
  pullPolicy: Sometimes
prometheusRule:
  disabledAlerts: [NoSuchAlert]
"""
EXPECTED_ERRORS = (
    "rbac.scope: rbac.scope must be one of the following",
    "rbac.watchNamespaces.0: Does not match pattern",
    "metrics.port: Invalid type. Expected: integer, given: string",
    "metrics.serviceMonitor.interval: Does not match pattern",
    "Additional property workerMonitr is not allowed",
    "image.pullPolicy: image.pullPolicy must be one of",
    "prometheusRule.disabledAlerts.0: prometheusRule.disabledAlerts.0 must be one of",
)


def test_bad_values_rejected_by_schema_naming_each_field(helm, tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_VALUES)  # every mistake at once: each must be reported
    proc = helm("template", "t", str(CHART), "-f", str(bad), check=False)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr
    for message in EXPECTED_ERRORS:
        assert message in proc.stderr, (message, proc.stderr)
    proc = helm("lint", "--strict", str(CHART), "-f", str(bad), check=False)
    assert proc.returncode != 0 and "rbac.scope" in proc.stdout + proc.stderr


def test_every_value_documented_and_in_the_schema() -> None:
    import json

    from longtail_chart.chartgen import value_docs

    text = (CHART / "values.yaml").read_text()
    documented = {d.path for d in value_docs(text)}
    schema = json.loads((CHART / "values.schema.json").read_text())

    def paths(node: Any, prefix: str = "") -> set[str]:
        out = set()
        for key, value in node.items():
            path = prefix + key
            out.add(path)
            if isinstance(value, dict) and value:
                out |= paths(value, path + ".")
        return out

    assert documented == paths(yaml.safe_load(text))

    def schema_paths(node: dict[str, Any], prefix: str = "") -> set[str]:
        out = set()
        for key, sub in node.get("properties", {}).items():
            out.add(prefix + key)
            out |= schema_paths(sub, prefix + key + ".")
        return out

    # Objects with free-form content (labels, securityContext...) stop at their own key.
    top = {
        p
        for p in documented
        if not p.startswith(("resources.", "podSecurityContext.", "securityContext."))
    }
    assert schema_paths(schema) - {"global"} == top
    with pytest.raises(ValueError, match=r"line 3: key 'b' has no '# -- description'"):
        value_docs("# -- ok\na: 1\nb: 2\n")


def test_disabled_alerts_enum_lists_every_alert() -> None:
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    enum = schema["properties"]["prometheusRule"]["properties"]["disabledAlerts"]["items"]["enum"]
    source = yaml.safe_load((CHART / "files" / "alerts.rules.yaml").read_text())
    assert enum == [r["alert"] for g in source["groups"] for r in g["rules"]]


def test_chart_crd_is_the_generated_crd_and_generated_files_are_current() -> None:
    assert (CHART / "crds" / "rljob.yaml").read_text() == (REPO / "crds" / "rljob.yaml").read_text()
    proc = subprocess.run(
        [sys.executable, "-m", "longtail_chart.chartgen", "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
