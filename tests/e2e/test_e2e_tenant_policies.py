"""NamespacedAdmissionPolicies on a real API server, written by a namespace's admin under their own
identity (the built-in ``admin`` ClusterRole, bound in their namespace, into which the chart
aggregates tenant policies):

- the tenant admin's policy denies in its namespace only, and goes Active with events there;
- it cannot be written in another namespace (RBAC), nor match a cluster-scoped kind, nor select
  other namespaces (refused at apply, naming the field), nor exceed the namespace's limit;
- its webhook entries select its namespace only, so its failurePolicy cannot reach further;
- a cluster policy still applies in the tenant's namespace: a tenant policy only adds;
- the background audit reports it, named "namespace/name", in its namespace's Report;
- the tenant admin deletes it, and it is gone (finalizer released).
"""
from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import pykube
import pytest
import yaml
from e2e_kube import (
    Cluster,
    NamespacedAdmissionPolicy,
    OperatorProcess,
    Policies,
    Report,
    ValidatingWebhookConfiguration,
    chart_cluster_roles,
    eventually,
    install_report_crds,
    policy_body,
    unique,
)
from replicas import replicas

from admission_policy import api, reports

pytestmark = pytest.mark.e2e

LABEL = "e2e-tenant"
POD_RULE = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE", "UPDATE"]}


def tenant_policy(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    body = policy_body(name, **spec)
    body.update(kind=api.NAMESPACED_KIND)
    body["metadata"]["namespace"] = namespace
    return body


def require_team(namespace: str, name: str) -> dict[str, Any]:
    return tenant_policy(namespace, name, failurePolicy="Fail",
                         match={"resources": [POD_RULE], "objectSelector": {"matchLabels": {LABEL: "true"}}},
                         validations=[{"name": "team", "expression": "has(object.metadata.labels.team)",
                                       "message": "pods here need a team label"}])


def pod(namespace: str, name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {LABEL: "true", **labels}},
            "spec": {"containers": [{"name": "c", "image": "registry.example/app:1"}]}}


def test_a_tenant_admin_writes_a_policy_for_its_own_namespace_only(
        cluster: Cluster, operator: OperatorProcess, namespace: Callable[..., str], tmp_path: pathlib.Path,
        request: pytest.FixtureRequest) -> None:
    install_report_crds(cluster)
    own, other = namespace(), namespace()
    tenant = unique("e2e-tenant-admin")
    roles = chart_cluster_roles("-tenant-policy-editor", "-tenant-policy-viewer")   # aggregated into admin, view
    assert len(roles) == 2, [r["metadata"]["name"] for r in roles]
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "tenant-admin", "namespace": own},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": tenant}]}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([*roles, binding]))
    for role in roles:
        request.addfinalizer(lambda name=role["metadata"]["name"]: cluster.kubectl(
            "delete", "clusterrole", name, "--ignore-not-found", check=False))
    # The aggregation controller adds the chart's rules to `admin`.
    eventually(lambda: cluster.kubectl("auth", "can-i", "create", api.NAMESPACED_PLURAL, "--as", tenant, "-n", own,
                                       check=False).stdout.strip(), lambda answer: answer == "yes",
               "the admin role to grant tenant policies", cluster.settings.timeout)

    def apply_as(obj: dict[str, Any], *extra: str) -> Any:
        return cluster.kubectl("--as", tenant, "apply", "-f", "-", *extra, input=yaml.safe_dump(obj), check=False)

    def create_pod(namespace: str, name: str, **labels: str) -> Any:
        return apply_as(pod(namespace, name, **labels), "--dry-run=server")

    cluster_policy = unique("e2e-no-forbidden")
    with replicas(cluster, operator, tmp_path, request, 1, peering=False, proxy=False,
                  env={"AP_TENANT_MAX_POLICIES": "1", "AP_AUDIT_INTERVAL": "2"}, prefix="ap-e2e-tenant") as group:
        assert group.processes
        applied = Policies(cluster)
        try:
            created = apply_as(require_team(own, "require-team"))
            assert created.returncode == 0, created

            def status() -> dict[str, Any]:
                return dict(cluster.get(NamespacedAdmissionPolicy, "require-team", own).obj.get("status") or {})
            eventually(status, lambda s: s.get("phase") == "Active", "the tenant policy to be Active",
                       cluster.settings.timeout)
            table = cluster.kubectl("--as", tenant, "get", "nap", "-n", own).stdout.splitlines()
            assert table[0].split()[:3] == ["NAME", "ENFORCEMENT", "PHASE"] and table[1].split()[:3] == [
                "require-team", "Enforce", "Active"], table
            events = cluster.items(pykube.Event, namespace=own)
            assert any(e["involvedObject"]["kind"] == api.NAMESPACED_KIND and e["reason"] == "Active"
                       for e in events), events

            # Its namespace only.
            denied = create_pod(own, "no-team")
            assert denied.returncode != 0 and "pods here need a team label" in denied.stderr, denied
            assert f"{own}/require-team" in denied.stderr
            assert create_pod(own, "with-team", team="a").returncode == 0
            elsewhere = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(
                pod(other, "no-team")), check=False)
            assert elsewhere.returncode == 0, elsewhere

            # Its entries select its namespace only: its failurePolicy Fail reaches no further.
            config = cluster.get(ValidatingWebhookConfiguration, cluster.settings.webhook_config_name).obj
            tenant_entries = [w for w in config["webhooks"] if w["name"].startswith(f"{own}.tenant.")]
            assert tenant_entries and all(w["namespaceSelector"]["matchExpressions"] == [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [own]}] for w in tenant_entries)

            # What it may not do, refused at apply, naming the field; RBAC keeps it out of other namespaces.
            forbidden = apply_as(require_team(other, "require-team"))
            assert forbidden.returncode != 0 and "forbidden" in forbidden.stderr.lower(), forbidden
            cluster_kind = require_team(own, "namespaces")
            cluster_kind["spec"]["match"]["resources"] = [{**POD_RULE, "resources": ["namespaces"]}]
            answer = apply_as(cluster_kind)
            assert answer.returncode != 0 and "spec.match.resources[0].resources[0]" in answer.stderr, answer
            assert "cluster-scoped" in answer.stderr
            selector = require_team(own, "selector")
            selector["spec"]["match"]["namespaceSelector"] = {"matchLabels": {"team": "b"}}
            answer = apply_as(selector)
            assert answer.returncode != 0 and "spec.match.namespaceSelector" in answer.stderr, answer
            over = apply_as(require_team(own, "second"))
            assert over.returncode != 0 and "AP_TENANT_MAX_POLICIES=1" in over.stderr, over

            # A cluster policy still applies in the tenant's namespace.
            cluster_body = policy_body(cluster_policy, failurePolicy="Fail",
                                       match={"resources": [POD_RULE],
                                              "objectSelector": {"matchLabels": {LABEL: "true"}}},
                                       validations=[{"expression": "!has(object.metadata.labels.forbidden)",
                                                     "message": "the cluster forbids this label"}])
            applied.apply(cluster_body)
            applied.wait_active(cluster_policy)
            both = create_pod(own, "forbidden", team="a", forbidden="yes")
            assert both.returncode != 0 and "the cluster forbids this label" in both.stderr, both

            # The audit reports an existing Pod in its namespace's Report, under "namespace/name".
            created_pod = cluster.create(pykube.Pod, pod(own, "existing", team="a"))
            assert created_pod.ok, str(created_pod)
            patched = cluster.merge_patch(pykube.Pod, "existing", {"metadata": {"labels": {"team": None}}},
                                          namespace=own)
            assert not patched.ok   # the tenant policy refuses removing the label too

            def result() -> dict[str, Any]:
                answer = cluster.get(Report, reports.NAME, own)
                found = [r for r in answer.obj.get("results") or []
                         if r["policy"] == f"{own}/require-team"] if answer.ok else []
                return found[0] if found else {}
            passed = eventually(result, lambda r: r.get("result") == "pass", "the Report to hold the tenant policy",
                                cluster.settings.timeout)
            assert passed["resources"][0]["name"] == "existing"

            # The tenant admin deletes it; the finalizer is released and it no longer judges.
            deleted = cluster.kubectl("--as", tenant, "delete", "nap", "require-team", "-n", own, "--wait=true",
                                      check=False)
            assert deleted.returncode == 0, deleted
            eventually(lambda: create_pod(own, "no-team"), lambda a: a.returncode == 0,
                       "pods without a team label to be admitted again", cluster.settings.timeout)
        finally:
            cluster.kubectl("delete", "nap", "--all", "-n", own, "--ignore-not-found", "--wait=true", check=False)
            cluster.kubectl("delete", "pod", "--all", "-n", own, "--ignore-not-found", "--wait=false", check=False)
            applied.delete_all()
