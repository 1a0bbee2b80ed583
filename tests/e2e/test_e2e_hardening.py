"""Issue 18, what only a real API server shows: a policy that cannot lock itself in, webhook
configurations that come back when deleted or edited by hand, no false Degraded for a CRD applied
a moment ago, and the operator's log (decisions, whole logger names, one line for a port in use).
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pykube
import pytest
import yaml
from e2e_kube import (
    CRD_NAME,
    GUARD,
    GUARDED,
    AdmissionPolicy,
    Answer,
    Cluster,
    MutatingWebhookConfiguration,
    OperatorProcess,
    Policies,
    ValidatingWebhookConfiguration,
    assert_denied,
    cli,
    configmap,
    eventually,
    guard_policy,
    policy_body,
    unique,
)
from pykube.objects import APIObject

from ports import free_ports

pytestmark = pytest.mark.e2e

WILDCARD = {"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"], "operations": ["*"]}
NEEDS_TEAM = "object.metadata.labels.team != ''"
WILDCARD_NAMESPACES = "e2e.policy-operator.dev/wildcard"


def since(operator: OperatorProcess, mark: int) -> str:
    """The operator's log written after ``mark`` (a byte offset taken earlier)."""
    with operator.log_path.open("rb") as log:
        log.seek(mark)
        return log.read().decode(errors="replace")


def log_size(operator: OperatorProcess) -> int:
    return operator.log_path.stat().st_size


def manifest(name: str, message: str) -> str:
    """The wildcard policy as a user keeps it in a file."""
    body = policy_body(name, failurePolicy="Fail", match={
        "resources": [WILDCARD],
        # Namespaced objects only in the test's namespace; cluster-scoped ones (AdmissionPolicies,
        # CRDs, namespaces) are all matched, as in the issue.
        "namespaceSelector": {"matchLabels": {WILDCARD_NAMESPACES: "true"}},
    }, validations=[{"expression": NEEDS_TEAM, "message": message}])
    return yaml.safe_dump(body)


def crd(group: str, plural: str = "widgets", kind: str = "Widget") -> dict[str, Any]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                         "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}


def test_a_wildcard_policy_never_judges_the_objects_that_fix_it(
        cluster: Cluster, operator: OperatorProcess, policies: Policies, namespace: Callable[..., str]) -> None:
    """#5: a policy matching everything can still be fixed with kubectl apply, deleted, and its
    status written; CRDs are judged, except the AdmissionPolicy CRD itself."""
    ns = namespace({WILDCARD_NAMESPACES: "true"})
    name = unique("e2e-needs-team")
    mark = log_size(operator)
    policies.names.append(name)
    cluster.kubectl("apply", "-f", "-", input=manifest(name, "a team label is required"))
    first = policies.wait_active(name)   # its own status was written

    # It judges what it matches: a ConfigMap in the namespace, another CRD ...
    denied = eventually(lambda: cluster.create(pykube.ConfigMap, configmap(ns, "no-team"), dry_run=True),
                        lambda a: not a.ok, "a ConfigMap without a team label to be refused", cluster.settings.timeout)
    assert_denied(denied, name)   # labels absent: an evaluation error, and failurePolicy Fail
    other_crd = cluster.create(pykube.CustomResourceDefinition, crd(f"{unique('hardening')}.e2e.dev"), dry_run=True)
    assert_denied(other_crd, name)

    # ... never the AdmissionPolicy CRD, nor AdmissionPolicies themselves.
    annotated = cluster.merge_patch(pykube.CustomResourceDefinition, CRD_NAME,
                                    {"metadata": {"annotations": {"e2e.policy-operator.dev/touched": "yes"}}})
    assert annotated.ok, f"the AdmissionPolicy CRD was judged by a user policy: {annotated}"
    cluster.merge_patch(pykube.CustomResourceDefinition, CRD_NAME,
                        {"metadata": {"annotations": {"e2e.policy-operator.dev/touched": None}}})

    fixed = cluster.kubectl("apply", "-f", "-", input=manifest(name, "every object needs a team label"), check=False)
    assert fixed.returncode == 0, f"kubectl apply of the fixed policy was refused:\n{fixed.stderr}"
    after = policies.wait_active(name)
    assert after["metadata"]["generation"] == first["metadata"]["generation"] + 1
    assert after["status"]["observedGeneration"] == after["metadata"]["generation"]   # status written again

    deleted = cluster.kubectl("delete", "ap", name, "--wait=false", check=False)
    assert deleted.returncode == 0, f"kubectl delete ap was refused:\n{deleted.stderr}"
    cluster.wait_gone(AdmissionPolicy, name)

    log = since(operator, mark)
    # Kopf's and the operator's own writes to the policy were never refused.
    assert "admission webhook" not in log, log
    # The denial is one INFO line naming policy, verdict, object, user and message.
    assert re.search(rf"\[INFO\s*\] AdmissionPolicy {name}: denied CREATE ConfigMap {ns}/no-team by \S+ "
                     r"\(dry run\): spec.validations\[0\].expression: ", log), log


def webhooks(cluster: Cluster, cls: type[APIObject]) -> Answer:
    return cluster.get(cls, cluster.settings.webhook_config_name)


def test_deleted_or_edited_webhook_configurations_are_written_back(
        cluster: Cluster, operator: OperatorProcess, policies: Policies, namespace: Callable[..., str]) -> None:
    """#6: deleted by hand while the operator runs, they came back never, and enforcement stopped."""
    ns = namespace()
    guarded = {GUARDED: "true"}
    timeout = cluster.settings.timeout
    policies.apply(guard_policy())
    kinds = (ValidatingWebhookConfiguration, MutatingWebhookConfiguration)
    original = {cls: webhooks(cluster, cls).obj["webhooks"] for cls in kinds}

    def refused() -> Answer:
        return eventually(lambda: cluster.create(pykube.ConfigMap, configmap(ns, "forbidden-x", guarded),
                                                 dry_run=True),
                          lambda a: not a.ok, "the guard to refuse a forbidden- ConfigMap", timeout)

    assert_denied(refused(), GUARD, "configmap names must not start with forbidden-")
    mark = log_size(operator)

    cluster.delete_webhook_configurations()
    for cls in kinds:
        back = eventually(lambda cls=cls: webhooks(cluster, cls), lambda a: a.ok,
                          f"{cls.kind} to be written back", timeout)
        assert back.obj["webhooks"] == original[cls], f"{cls.kind} came back different"
    assert_denied(refused(), GUARD, "configmap names must not start with forbidden-")   # no restart
    marked = cluster.create(pykube.ConfigMap, configmap(ns, "marked", guarded))
    assert marked.ok and marked.obj["metadata"]["labels"].get("e2e.policy-operator.dev/mutated") == "true", marked

    # Edited by hand: a rule removed and the failure policy loosened; reverted.
    edited = [dict(hook) for hook in original[ValidatingWebhookConfiguration]]
    routed = next(i for i, hook in enumerate(edited) if hook["name"].startswith("fail.validate."))
    edited[routed] = {**edited[routed], "failurePolicy": "Ignore", "rules": edited[routed]["rules"][:-1] or [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["DELETE"], "resources": ["secrets"], "scope": "*"}]}
    answer = cluster.merge_patch(ValidatingWebhookConfiguration, cluster.settings.webhook_config_name,
                                 {"webhooks": edited})
    assert answer.ok, str(answer)
    reverted = eventually(lambda: webhooks(cluster, ValidatingWebhookConfiguration),
                          lambda a: a.ok and a.obj["webhooks"] == original[ValidatingWebhookConfiguration],
                          "the hand edit to be reverted", timeout)

    # Written back once: what the API server fills in is not mistaken for drift (no rewrite loop).
    version = reverted.obj["metadata"]["resourceVersion"]
    time.sleep(3)
    assert webhooks(cluster, ValidatingWebhookConfiguration).obj["metadata"]["resourceVersion"] == version
    assert policies.wait_active(GUARD)["status"]["phase"] == "Active"
    log = since(operator, mark)
    assert len(re.findall(r"were deleted or changed outside the operator; written back", log)) >= 2, log


def test_a_policy_for_a_crd_applied_a_moment_before_is_never_degraded(
        cluster: Cluster, operator: OperatorProcess, policies: Policies, namespace: Callable[..., str]) -> None:
    """#7: discovery cached for a minute said "not served by this cluster" while the policy denied."""
    ns = namespace()
    group = f"{unique('hardening')}.e2e.dev"
    definition = crd(group)
    name = unique("e2e-new-crd")
    rule = {"apiGroups": [group], "apiVersions": ["v1"], "resources": ["widgets"], "operations": ["CREATE"]}
    body = policy_body(name, match={"resources": [rule]},
                       validations=[{"expression": "object.metadata.name != 'bad'", "message": "bad widget"}])
    created = cluster.create(pykube.CustomResourceDefinition, definition)
    assert created.ok, str(created)
    try:
        policies.names.append(name)
        answer = cluster.create(AdmissionPolicy, body)
        assert answer.ok, str(answer)
        phases: list[str] = []

        def phase() -> str:
            got = cluster.get(AdmissionPolicy, name)
            phases.append((got.obj.get("status") or {}).get("phase", "") if got.ok else "")
            return phases[-1]
        eventually(phase, lambda p: p in ("Active", "Degraded"), f"{name} to settle", cluster.settings.timeout,
                   interval=0.05)
        assert "Degraded" not in phases, phases
        events = cluster.kubectl("get", "events", "-n", "default", "--field-selector",
                                 f"involvedObject.name={name}", "-o", "jsonpath={.items[*].reason}").stdout.split()
        assert "Degraded" not in events and "Active" in events, events

        widget = {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": "bad", "namespace": ns}}
        assert_denied(_create_widget(cluster, group, ns, widget), name, "bad widget")
    finally:
        policies.delete(name)
        cluster.delete(pykube.CustomResourceDefinition, definition["metadata"]["name"])


def _create_widget(cluster: Cluster, group: str, ns: str, widget: dict[str, Any]) -> Answer:
    class Widget(pykube.objects.NamespacedAPIObject):  # type: ignore[misc]
        version = f"{group}/v1"
        endpoint = "widgets"
        kind = "Widget"
    return cluster.create(Widget, widget, dry_run=True)


def test_kopf_run_prints_whole_logger_names(operator: OperatorProcess) -> None:
    """`kopf run` formats names as %(name)-20.20s: the operator's lines read "admission_policy.ope"."""
    log = operator.log_path.read_text(errors="replace")
    assert re.search(r"\] admission_policy\.operator\.lifecycle +\[INFO", log), operator.log_tail()
    assert not re.search(r"\] admission_policy\.ope +\[", log)


def test_a_port_in_use_exits_with_one_clear_line(cluster: Cluster) -> None:
    """It retried for ever; now `admission-policy run` says which port, once, and exits 1."""
    health, metrics = free_ports(2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "KUBECONFIG": str(cluster.settings.kubeconfig), "AP_HEALTH_PORT": str(health),
               "AP_METRICS_PORT": str(metrics), "AP_NAMESPACE": cluster.settings.operator_namespace}
        result = subprocess.run([*cli(), "run", "--standalone", "--listen-host", "127.0.0.1", "--listen-port",
                                 str(port)], capture_output=True, text=True, timeout=60, env=env)
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert result.returncode == 1, lines
    assert len(lines) == 1, lines
    assert f"cannot listen on 127.0.0.1:{port} (AP_LISTEN_PORT, the webhook server): Address already in use" \
        in lines[0]
