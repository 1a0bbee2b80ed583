"""The background audit against a real API server (issue 14).

Objects created before a policy exists show up as its violations in ``status.audit``, in an
openreports ``Report`` in their namespace and in a ``ClusterReport`` for cluster-scoped ones;
fixing or deleting an object clears its result at the next scan; deleting the policy removes
its results. The operator is the test's own, with a scan every few seconds.
"""
from __future__ import annotations

import concurrent.futures
import json
import pathlib
from collections.abc import Callable
from typing import Any

import pykube
import pytest
import requests
import yaml
from click.testing import CliRunner
from e2e_kube import (
    OWNED_LABEL,
    AdmissionPolicy,
    Cluster,
    ClusterReport,
    OperatorProcess,
    Policies,
    Report,
    eventually,
    install_report_crds,
    policy_body,
    unique,
)
from prometheus_client.parser import text_string_to_metric_families
from pykube.objects import APIObject
from replicas import replicas, requests_judged

from admission_policy import reports
from admission_policy.cli import main
from admission_policy.operator import handoff

INTERVAL = 3


class ClusterRole(APIObject):  # type: ignore[misc]
    version = "rbac.authorization.k8s.io/v1"
    endpoint = "clusterroles"
    kind = "ClusterRole"


def audit_policy(name: str, selector: str) -> dict[str, Any]:
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
              "operations": ["CREATE", "UPDATE"]},
             {"apiGroups": ["rbac.authorization.k8s.io"], "apiVersions": ["v1"], "resources": ["clusterroles"],
              "operations": ["CREATE", "UPDATE"]}]
    return policy_body(name, enforcement="Audit", match={"resources": rules,
                                                           "objectSelector": {"matchLabels": {"e2e-audit": selector}}},
                       validations=[{"expression": "has(object.metadata.labels) && 'team' in object.metadata.labels",
                                     "message": "a team label is required"}])


def failing(report: dict[str, Any], policy: str) -> set[str]:
    return {result["resources"][0]["name"] for result in report.get("results") or []
            if result["policy"] == policy and result["result"] == "fail"}


def test_existing_objects_are_audited_into_status_and_reports_and_cleared_when_fixed_or_deleted(
        cluster: Cluster, operator: OperatorProcess, namespace: Callable[..., str], tmp_path: pathlib.Path,
        request: pytest.FixtureRequest) -> None:
    install_report_crds(cluster)
    ns = namespace()
    selector = unique("audit", limit=40)
    labels = {"e2e-audit": selector}
    names = {key: unique(f"audit-{key}", limit=40) for key in ("bad", "good", "fix", "gone", "role")}
    # Before any policy exists: nothing stops them.
    for key in ("bad", "fix", "gone", "good"):
        extra = {"team": "a"} if key == "good" else {}
        created = cluster.create(pykube.ConfigMap, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": names[key], "namespace": ns, "labels": {**labels, **extra}}, "data": {"k": "v"}})
        assert created.ok, str(created)
    role = cluster.create(ClusterRole, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                                        "metadata": {"name": names["role"], "labels": {**labels, OWNED_LABEL: "true"}},
                                        "rules": []})
    assert role.ok, str(role)
    request.addfinalizer(lambda: cluster.delete(ClusterRole, names["role"]))
    policy = unique("e2e-audit")
    timeout = cluster.settings.timeout

    with replicas(cluster, operator, tmp_path, request, 1, peering=False, proxy=False,
                  # Pages of 2: every listing goes through continue tokens, as a large cluster's does.
                  env={"AP_AUDIT_INTERVAL": str(INTERVAL), "AP_AUDIT_VIOLATIONS_LIMIT": "3",
                       "AP_AUDIT_PAGE_SIZE": "2"},
                  prefix="ap-e2e-audit") as group:
        (ours,) = group.processes
        applied = Policies(cluster)
        try:
            applied.apply(audit_policy(policy, selector))

            # status.audit: the four objects without a team label, three of them listed (the limit).
            def audit() -> dict[str, Any]:
                return dict((cluster.get(AdmissionPolicy, policy).obj.get("status") or {}).get("audit") or {})
            status = eventually(audit, lambda a: a.get("violations") == 4, "status.audit to count 4 violations",
                                timeout)
            assert status["objectsScanned"] >= 5 and status["scannedGeneration"] == 1, status
            assert len(status["firstViolations"]) == 3, status
            assert {v["name"] for v in status["firstViolations"]} <= {names[k] for k in ("bad", "fix", "gone", "role")}
            assert all(v["message"] == "a team label is required" for v in status["firstViolations"]), status
            assert "audits configmaps, clusterroles.rbac.authorization.k8s.io" in status["message"], status

            # kubectl get ap: the VIOLATIONS column.
            table = cluster.kubectl("get", "ap", policy).stdout.splitlines()
            assert table[0].split()[:5] == ["NAME", "ENFORCEMENT", "PHASE", "ENFORCED-BY", "VIOLATIONS"], table
            row = table[1].split()   # ENFORCED-BY: Webhook (this operator's default), or empty before it is said
            assert row[:3] == [policy, "Audit", "Active"] and row[3:5] in (["Webhook", "4"], ["4", row[4]]), table

            # The Report of the namespace and the ClusterReport, as openreports consumers read them.
            report = eventually(lambda: cluster.get(Report, reports.NAME, ns), lambda a: a.ok and failing(
                a.obj, policy) == {names["bad"], names["fix"], names["gone"]}, f"the Report in {ns}", timeout).obj
            assert report["summary"]["fail"] == 3 and report["summary"]["pass"] == 1, report["summary"]
            passed = [r for r in report["results"] if r["result"] == "pass" and r["policy"] == policy]
            assert [r["resources"][0]["name"] for r in passed] == [names["good"]], report["results"]
            result = next(r for r in report["results"] if r["resources"][0]["name"] == names["bad"])
            assert result["rule"] == "spec.validations[0]" and result["message"] == "a team label is required"
            assert result["resources"][0]["kind"] == "ConfigMap" and result["resources"][0]["namespace"] == ns
            assert result["properties"]["enforcement"] == "Audit" and result["timestamp"]["seconds"] > 0
            cluster_report = eventually(lambda: cluster.get(ClusterReport, reports.NAME), lambda a: a.ok and names[
                "role"] in failing(a.obj, policy), "the ClusterReport", timeout).obj
            assert cluster_report["summary"]["fail"] >= 1

            # The gauges of the reconciling replica.
            metrics = requests.get(f"http://127.0.0.1:{ours.metrics_port}/metrics", timeout=5).text
            samples = {(s.name, s.labels.get("policy")): s.value
                       for family in text_string_to_metric_families(metrics) for s in family.samples}
            assert samples[("admission_policy_audit_violations", policy)] == 4
            assert samples[("admission_policy_audit_objects_scanned", policy)] >= 5

            # `admission-policy audit --kubeconfig`: the same results, offline, read only.
            policy_file = tmp_path / "policy.yaml"
            policy_file.write_text(yaml.safe_dump(audit_policy(policy, selector)))
            cli = CliRunner().invoke(main, ["audit", "-p", str(policy_file), "--kubeconfig",
                                            str(cluster.settings.kubeconfig), "-o", "json", "--progress", "never"])
            assert cli.exit_code == 0, cli.output   # an Audit policy: violations do not fail the run
            offline = {(item["kind"], item["metadata"].get("namespace")): item
                       for item in json.loads(cli.stdout)["items"]}
            assert failing(offline["Report", ns], policy) == failing(report, policy)
            assert names["role"] in failing(offline["ClusterReport", None], policy)

            # Fixed and deleted objects leave status and report at the next scan.
            fixed = cluster.merge_patch(pykube.ConfigMap, names["fix"], {"metadata": {"labels": {"team": "b"}}},
                                        namespace=ns)
            assert fixed.ok, str(fixed)
            cluster.delete(pykube.ConfigMap, names["gone"], ns)
            eventually(audit, lambda a: a.get("violations") == 2, "status.audit to count 2 violations", timeout)
            report = eventually(lambda: cluster.get(Report, reports.NAME, ns),
                                lambda a: a.ok and failing(a.obj, policy) == {names["bad"]},
                                "the Report to keep only the unfixed object", timeout).obj
            assert report["summary"]["fail"] == 1 and report["summary"]["pass"] == 2, report["summary"]

            # A deleted policy's results go with it.
            applied.delete(policy)
            eventually(lambda: cluster.get(Report, reports.NAME, ns), lambda a: a.status == 404,
                       f"the Report in {ns} to be deleted", timeout)
            eventually(lambda: cluster.get(ClusterReport, reports.NAME), lambda a: a.status == 404 or names[
                "role"] not in failing(a.obj, policy), "the ClusterReport to drop the policy's results", timeout)
        finally:
            applied.delete_all()   # while ours still runs: its finalizer


def test_admission_results_reach_the_reports_whichever_replica_judged_them(
        cluster: Cluster, operator: OperatorProcess, namespace: Callable[..., str], tmp_path: pathlib.Path,
        request: pytest.FixtureRequest) -> None:
    """spec.reportAdmission with two replicas behind one Service: every object an Audit policy
    fails at admission is in the report at once — those the replica that does not reconcile
    judged too (handed over through its ConfigMap), long before any scan (the interval is an hour)."""
    install_report_crds(cluster)
    ns = namespace()
    selector = unique("handoff", limit=40)
    policy = unique("e2e-handoff")
    body = audit_policy(policy, selector)
    body["spec"]["reportAdmission"] = True
    timeout = cluster.settings.timeout
    with replicas(cluster, operator, tmp_path, request, env={"AP_AUDIT_INTERVAL": "1h"},
                  prefix="ap-e2e-handoff") as group:
        leader, follower = group.processes
        applied = Policies(cluster)
        try:
            applied.apply(body)
            # The policy's first scan (nothing to find yet) is over before any object exists.
            eventually(lambda: (cluster.get(AdmissionPolicy, policy).obj.get("status") or {}).get("audit") or {},
                       lambda a: a.get("scannedGeneration") == 1, "the policy's first scan", timeout)

            def create(index: int) -> str:
                name = f"{selector}-{index}"
                created = cluster.create(pykube.ConfigMap, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
                    "name": name, "namespace": ns, "labels": {"e2e-audit": selector}}})
                assert created.ok, str(created)
                return name

            # Concurrent creates open several connections, which the proxy spreads over both replicas.
            created: set[str] = set()
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                for batch in range(5):
                    created |= set(pool.map(create, range(batch * 16, batch * 16 + 16)))
                    if requests_judged(follower, policy) and requests_judged(leader, policy):
                        break
            assert requests_judged(follower, policy) > 0, "the replica that does not reconcile judged nothing"

            def admitted(answer: Any) -> set[str]:
                return {r["resources"][0]["name"] for r in answer.obj.get("results") or []
                        if r["policy"] == policy and r["properties"]["origin"] == "admission"} if answer.ok else set()
            eventually(lambda: cluster.get(Report, reports.NAME, ns), lambda a: admitted(a) == created,
                       f"every admission failure in the Report of {ns}", timeout)
            handed = cluster.get(pykube.ConfigMap, handoff.configmap_name(group.pod(follower)),
                                 cluster.settings.operator_namespace)
            assert handed.ok and selector in handed.obj["data"][handoff.DATA_KEY], str(handed)
        finally:
            applied.delete_all()   # while the replicas still run: their finalizer
