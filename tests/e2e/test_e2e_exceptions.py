"""AdmissionPolicyExceptions on a real API server, as the people involved would use them with
kubectl, each under their own identity (impersonated by the admin, with RBAC from the chart):

- a tenant admin (the built-in ``admin`` role and the chart's exception-editor, in its namespace)
  asks for an exception to a policy that requires approval: it cannot approve it itself, neither
  by writing the record by hand nor with the approve annotation, and the exception does nothing;
- an approver (the chart's exception-approver) approves it: the privileged Deployment is admitted,
  with a warning naming the exception and its end, and the background audit reports the Pod
  under it as ``skip``, naming the exception;
- at ``expiresAt`` the same Deployment is refused again, the status says Expired (with an event),
  and the report says ``fail``;
- four eyes: an approver who asks for an exception can neither create it approved nor approve it;
  a second approver can, and the status, ``kubectl get ape`` and the events name who.
"""
from __future__ import annotations

import datetime
import pathlib
import time
from collections.abc import Callable
from typing import Any

import pykube
import pytest
import requests
import yaml
from e2e_kube import (
    AdmissionPolicyException,
    Cluster,
    OperatorProcess,
    Policies,
    Report,
    chart_cluster_roles,
    eventually,
    install_report_crds,
    policy_body,
    role_binding,
    unique,
)
from prometheus_client.parser import text_string_to_metric_families
from replicas import replicas

from admission_policy import reports
from admission_policy.operator.exceptionreview import APPROVE
from admission_policy.policyexception import APPROVED_BY, CREATED_BY

pytestmark = pytest.mark.e2e

LABEL = "e2e-exceptions"
POLICY = unique("e2e-no-privileged")
LIFETIME = 50   # seconds from the exception's creation to its expiry: the whole flow fits in it


def deployment(namespace: str) -> dict[str, Any]:
    labels = {LABEL: "true", "app": "legacy"}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "legacy-app", "namespace": namespace, "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                         {"name": "app", "image": "registry.example/legacy:1",
                          "securityContext": {"privileged": True}}]}}}}


def exception(namespace: str, name: str, expires: datetime.datetime, **metadata: Any) -> dict[str, Any]:
    return {"apiVersion": "policy-operator.dev/v1alpha1", "kind": "AdmissionPolicyException",
            "metadata": {"name": name, "namespace": namespace, **metadata},
            "spec": {"policies": [{"name": POLICY, "rules": ["privileged"]}],
                     "match": {"names": ["legacy-*"], "objectSelector": {"matchLabels": {"app": "legacy"}}},
                     "reason": "the legacy app needs raw devices until TICKET-1234 lands",
                     "expiresAt": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}}


def no_privileged() -> dict[str, Any]:
    return policy_body(
        POLICY,
        match={"resources": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                              "operations": ["CREATE", "UPDATE"]}],
               "objectSelector": {"matchLabels": {LABEL: "true"}}},
        failurePolicy="Fail",
        exceptions={"approval": "Required", "maxDuration": "1h"},
        validations=[{"name": "privileged", "message": "privileged containers are not allowed",
                      "expression": "object.spec.containers.all(c, !c.?securityContext.?privileged.orValue(false))"}])


def test_an_exception_is_asked_for_approved_applied_and_ends_on_time(
        cluster: Cluster, operator: OperatorProcess, namespace: Callable[..., str], tmp_path: pathlib.Path,
        request: pytest.FixtureRequest) -> None:
    install_report_crds(cluster)
    ns = namespace()
    tenant, approver = unique("e2e-tenant-admin"), unique("e2e-approver")
    roles = chart_cluster_roles("-exception-editor", "-exception-approver")
    editor, approving = (next(r["metadata"]["name"] for r in roles if r["metadata"]["name"].endswith(suffix))
                         for suffix in ("-exception-editor", "-exception-approver"))
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([
        *roles, role_binding(ns, "admin", tenant), role_binding(ns, editor, tenant),
        role_binding(ns, approving, approver)]))
    for role in roles:
        request.addfinalizer(lambda name=role["metadata"]["name"]: cluster.kubectl(
            "delete", "clusterrole", name, "--ignore-not-found", check=False))

    def kubectl_as(user: str, *args: str, input: str | None = None) -> Any:
        return cluster.kubectl("--as", user, "-n", ns, *args, input=input, check=False)

    def apply_as(user: str, obj: dict[str, Any], *extra: str) -> Any:
        return kubectl_as(user, "apply", "-f", "-", *extra, input=yaml.safe_dump(obj))

    def deploy() -> Any:
        return apply_as(tenant, deployment(ns), "--dry-run=server")

    with replicas(cluster, operator, tmp_path, request, 1, peering=False, proxy=False,
                  env={"AP_AUDIT_INTERVAL": "2"}, prefix="ap-e2e-exceptions") as group:
        (ours,) = group.processes
        applied = Policies(cluster)
        try:
            applied.apply(no_privileged())
            applied.wait_active(POLICY)
            refused = deploy()
            assert refused.returncode != 0 and "privileged containers are not allowed" in refused.stderr, refused

            # Refused at apply, naming the field: beyond the policy's maxDuration; a rule it does not have.
            now = datetime.datetime.now(datetime.UTC)
            too_long = apply_as(tenant, exception(ns, "too-long", now + datetime.timedelta(hours=2)))
            assert too_long.returncode != 0 and "spec.expiresAt" in too_long.stderr, too_long
            assert "maxDuration" in too_long.stderr, too_long.stderr
            unknown_rule = exception(ns, "unknown-rule", now + datetime.timedelta(minutes=5))
            unknown_rule["spec"]["policies"][0]["rules"] = ["no-such-rule"]
            answer = apply_as(tenant, unknown_rule)
            assert answer.returncode != 0 and "spec.policies[0].rules[0]" in answer.stderr, answer
            # kubectl's words for a 422, as docs/exceptions.md shows them.
            assert answer.stderr.startswith("The request is invalid: error when creating"), answer.stderr

            # The tenant cannot approve its own exception: not by hand, not with the annotation.
            forged = exception(ns, "forged", now + datetime.timedelta(minutes=5), annotations={
                APPROVED_BY: tenant, "policy-operator.dev/approved-generation": "1",
                "policy-operator.dev/approved-at": now.strftime("%Y-%m-%dT%H:%M:%SZ")})
            answer = apply_as(tenant, forged)
            assert answer.returncode != 0 and "an exception is created unapproved" in answer.stderr, answer

            expires = datetime.datetime.now(datetime.UTC).replace(microsecond=0) + datetime.timedelta(seconds=LIFETIME)
            created = apply_as(tenant, exception(ns, "legacy-privileged", expires))
            assert created.returncode == 0, created
            stored = cluster.get(AdmissionPolicyException, "legacy-privileged", ns).obj
            assert stored["metadata"]["annotations"][CREATED_BY] == tenant

            def status() -> dict[str, Any]:
                return dict(cluster.get(AdmissionPolicyException, "legacy-privileged", ns).obj.get("status") or {})
            pending = eventually(status, lambda s: s.get("state") == "PendingApproval", "state PendingApproval",
                                 cluster.settings.timeout)
            assert pending["createdBy"] == tenant and pending["policies"] == f"{POLICY}/privileged", pending
            self_approval = kubectl_as(tenant, "annotate", "ape", "legacy-privileged", f"{APPROVE}=true")
            assert self_approval.returncode != 0 and "may not approve" in self_approval.stderr, self_approval
            assert deploy().returncode != 0   # not approved: the exception does nothing

            # The approver approves; the Deployment is admitted, with a warning naming the exception.
            approval = kubectl_as(approver, "annotate", "ape", "legacy-privileged", f"{APPROVE}=true")
            assert approval.returncode == 0, approval
            active = eventually(status, lambda s: s.get("state") == "Active", "state Active",
                                cluster.settings.timeout)
            assert active["approvedBy"] == approver, active
            table = kubectl_as(tenant, "get", "ape").stdout.splitlines()
            assert table[0].split() == ["NAME", "POLICIES", "EXPIRES", "APPROVED", "STATE", "AGE"], table
            assert table[1].split()[:5] == ["legacy-privileged", f"{POLICY}/privileged",
                                            expires.strftime("%Y-%m-%dT%H:%M:%SZ"), approver, "Active"], table
            admitted = deploy()
            warning = (f"admitted under exception {ns}/legacy-privileged, "
                       f"expires {expires.strftime('%Y-%m-%dT%H:%M:%SZ')}")
            assert admitted.returncode == 0 and warning in admitted.stderr, admitted

            # An existing Pod under the exception: the audit reports it as skip, naming the exception.
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": "legacy-pod", "namespace": ns, "labels": {LABEL: "true", "app": "legacy"}},
                "spec": deployment(ns)["spec"]["template"]["spec"]}
            assert apply_as(tenant, pod).returncode == 0

            def results() -> dict[str, str]:
                answer = cluster.get(Report, reports.NAME, ns)
                return {r["resources"][0]["name"]: r for r in answer.obj.get("results") or []
                        if r["policy"] == POLICY} if answer.ok else {}
            skipped = eventually(results, lambda r: r.get("legacy-pod", {}).get("result") == "skip",
                                 "the Report to say skip", cluster.settings.timeout)["legacy-pod"]
            assert skipped["properties"]["exception"] == f"{ns}/legacy-privileged", skipped
            metrics = requests.get(f"http://127.0.0.1:{ours.metrics_port}/metrics", timeout=5).text
            samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                       for family in text_string_to_metric_families(metrics) for s in family.samples}
            assert samples[("admission_policy_exceptions", (("state", "Active"),))] == 1
            assert samples[("admission_policy_exempted_requests_total", (
                ("exception", f"{ns}/legacy-privileged"), ("policy", POLICY)))] >= 1

            # expiresAt: refused again, to the second; the status and the report follow.
            time.sleep(max(0.0, expires.timestamp() - time.time()))
            again = deploy()
            assert again.returncode != 0 and "privileged containers are not allowed" in again.stderr, again
            expired = eventually(status, lambda s: s.get("state") == "Expired", "state Expired",
                                 cluster.settings.timeout)
            assert any(c["type"] == "Active" and c["reason"] == "Expired" for c in expired["conditions"]), expired
            events = eventually(lambda: cluster.items(pykube.Event, namespace=ns), lambda items: any(
                e["reason"] == "Expired" and e["involvedObject"]["name"] == "legacy-privileged" for e in items),
                "an Expired event", cluster.settings.timeout)
            assert any(e["reason"] == "Activated" for e in events)
            eventually(results, lambda r: r.get("legacy-pod", {}).get("result") == "fail",
                       "the Report to say fail after expiry", cluster.settings.timeout)
        finally:
            cluster.kubectl("delete", "ape", "--all", "-n", ns, "--ignore-not-found", check=False)
            applied.delete_all()


def test_an_approval_counts_only_from_a_second_person(
        cluster: Cluster, operator: OperatorProcess, namespace: Callable[..., str], tmp_path: pathlib.Path,
        request: pytest.FixtureRequest) -> None:
    ns = namespace()
    first, second = unique("e2e-lead-one"), unique("e2e-lead-two")
    roles = chart_cluster_roles("-exception-editor", "-exception-approver")
    bindings = [role_binding(ns, role["metadata"]["name"], user) for role in roles for user in (first, second)]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([*roles, *bindings]))
    for role in roles:
        request.addfinalizer(lambda name=role["metadata"]["name"]: cluster.kubectl(
            "delete", "clusterrole", name, "--ignore-not-found", check=False))

    def kubectl_as(user: str, *args: str, input: str | None = None) -> Any:
        return cluster.kubectl("--as", user, "-n", ns, *args, input=input, check=False)

    def status() -> dict[str, Any]:
        return dict(cluster.get(AdmissionPolicyException, "legacy", ns).obj.get("status") or {})

    expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=30)
    with replicas(cluster, operator, tmp_path, request, 1, peering=False, proxy=False, prefix="ap-e2e-four-eyes"):
        applied = Policies(cluster)
        try:
            body = no_privileged()
            del body["spec"]["exceptions"]["approval"]   # Required is the default
            applied.apply(body)
            applied.wait_active(POLICY)

            # Created already approved: refused, whoever asks.
            asked = exception(ns, "legacy", expires, annotations={APPROVE: "true"})
            answer = kubectl_as(first, "create", "-f", "-", input=yaml.safe_dump(asked))
            assert answer.returncode != 0 and "an exception is created unapproved" in answer.stderr, answer

            created = kubectl_as(first, "create", "-f", "-", input=yaml.safe_dump(exception(ns, "legacy", expires)))
            assert created.returncode == 0, created
            pending = eventually(status, lambda s: s.get("state") == "PendingApproval", "state PendingApproval",
                                 cluster.settings.timeout)
            assert pending["createdBy"] == first and pending["specChangedBy"] == first, pending
            approved = next(c for c in pending["conditions"] if c["type"] == "Approved")
            assert f"someone allowed to approve other than {first}" in approved["message"], approved

            # The record is kept, and kubectl says so.
            overwrite = kubectl_as(first, "annotate", "--overwrite", "ape", "legacy", f"{CREATED_BY}={second}")
            assert overwrite.returncode == 0, overwrite
            assert f"{CREATED_BY} is the operator's record and was not changed" in overwrite.stderr, overwrite
            stored = cluster.get(AdmissionPolicyException, "legacy", ns).obj["metadata"]["annotations"]
            assert stored[CREATED_BY] == first, stored

            own = kubectl_as(first, "annotate", "ape", "legacy", f"{APPROVE}=true")
            assert own.returncode != 0, own
            assert f"{first} created this exception or last changed its spec" in own.stderr, own
            assert "four eyes" in own.stderr, own

            # The second approver edits the spec: now only the first may approve it.
            edited = kubectl_as(second, "patch", "ape", "legacy", "--type=merge",
                                "-p", '{"spec": {"reason": "TICKET-1234, now with a date"}}')
            assert edited.returncode == 0, edited
            eventually(status, lambda s: s.get("specChangedBy") == second, "specChangedBy the second",
                       cluster.settings.timeout)
            again = kubectl_as(second, "annotate", "ape", "legacy", f"{APPROVE}=true")
            assert again.returncode != 0 and "four eyes" in again.stderr, again
            # ... and, being its creator, not the first either: a third person approves.
            third = unique("e2e-lead-three")
            cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(role_binding(
                ns, next(r["metadata"]["name"] for r in roles if r["metadata"]["name"].endswith("-approver")), third)))
            approval = kubectl_as(third, "annotate", "ape", "legacy", f"{APPROVE}=true")
            assert approval.returncode == 0, approval
            active = eventually(status, lambda s: s.get("state") == "Active", "state Active",
                                cluster.settings.timeout)
            assert active["approvedBy"] == third and active["approvedGeneration"] == 2, active
            row = kubectl_as(first, "get", "ape", "legacy", "--no-headers").stdout.split()
            assert row[3:5] == [third, "Active"], row
            events = eventually(lambda: cluster.items(pykube.Event, namespace=ns), lambda items: any(
                e["reason"] == "Activated" and e["involvedObject"]["name"] == "legacy" for e in items),
                "an Activated event", cluster.settings.timeout)
            (activated,) = [e for e in events if e["reason"] == "Activated"]
            assert activated["message"].endswith(f", approved by {third}"), activated
        finally:
            cluster.kubectl("delete", "ape", "--all", "-n", ns, "--ignore-not-found", check=False)
            applied.delete_all()
