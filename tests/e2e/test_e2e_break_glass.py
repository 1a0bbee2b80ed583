"""The break-glass label on a real API server: it counts only for the identities the cluster admin
names, and it works with every operator replica stopped (docs/operations.md, "Break-glass").

Each step runs under the user's own identity: the admin of the session's kubeconfig (in
``system:masters``, the default break-glass group) and a user bound to the built-in ``edit``
role in one namespace, impersonated with ``kubectl --as``.

- An ``edit`` user's Pod with an offensive name and the label is refused; an UPDATE by that user
  that adds the label to a guarded ConfigMap is judged, and so is one of an object an admin
  stored with the label.
- The admin's labelled write is held back from both webhooks (admitted, not mutated), and with
  the operator stopped it still is, while the ``edit`` user's labelled Pod fails closed.
- The chart installs, upgrades and uninstalls with Helm while a deny-everything policy is
  enforced, which meanwhile refuses the admin's unlabelled writes.
"""
from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any

import helm_python as helm
import pykube
import pytest
import yaml
from e2e_kube import (
    EXEMPT_LABEL,
    GUARD,
    GUARDED,
    MUTATED,
    Cluster,
    OperatorProcess,
    Policies,
    assert_denied,
    configmap,
    example_object,
    guard_policy,
    policy_body,
    role_binding,
    unique,
)

pytestmark = pytest.mark.e2e

CHART_DIR = pathlib.Path(__file__).resolve().parents[2] / "charts" / "admission-policy-operator"
OFFENSIVE = "deny-offensive-pod-names"
OFFENSIVE_MESSAGE = 'contains "offensive"'
GLASS = {EXEMPT_LABEL: "true"}
DENY_ALL = unique("e2e-deny-everything")


def labelled_pod(namespace: str, image: str, name: str) -> dict[str, Any]:
    pod = example_object(OFFENSIVE, "pod-offensive.yaml", namespace, image, name=name)
    pod["metadata"].setdefault("labels", {}).update(GLASS)
    return pod


def test_the_label_counts_only_for_the_named_identities_even_with_the_operator_down(
        cluster: Cluster, operator: OperatorProcess, policies: Policies, namespace: Callable[..., str]) -> None:
    ns = namespace()
    image = cluster.settings.pod_image
    editor = unique("e2e-editor")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(role_binding(ns, "edit", editor)))

    def as_editor(*args: str, input: Any = None) -> Any:
        return cluster.kubectl("--as", editor, "-n", ns, *args, check=False,
                               input=None if input is None else yaml.safe_dump(input))

    policies.apply_example(OFFENSIVE)
    policies.apply(guard_policy())

    # The edit user's label exempts nothing.
    refused = as_editor("create", "-f", "-", input=labelled_pod(ns, image, "offensive-labelled"))
    assert refused.returncode != 0 and OFFENSIVE_MESSAGE in refused.stderr, refused
    # An UPDATE that adds it is judged: the ConfigMap is guarded from then on, and refused.
    name = unique("forbidden-e2e-glass")
    assert as_editor("create", "-f", "-", input=configmap(ns, name)).returncode == 0
    added = as_editor("label", "configmap", name, f"{GUARDED}=true", f"{EXEMPT_LABEL}=true")
    assert added.returncode != 0 and "configmap names must not start with forbidden-" in added.stderr, added

    # The admin's labelled writes skip both webhooks: admitted, and not mutated.
    admin_pod = cluster.create(pykube.Pod, labelled_pod(ns, image, "offensive-admin"))
    assert admin_pod.ok, str(admin_pod)
    stored = unique("forbidden-e2e-admin")
    written = cluster.create(pykube.ConfigMap, configmap(ns, stored, {GUARDED: "true", **GLASS}))
    assert written.ok, str(written)
    assert MUTATED not in written.obj["metadata"]["labels"], written.obj
    # The label on a stored object does not hold the edit user's UPDATE back from the policies.
    edited = as_editor("patch", "configmap", stored, "--type=merge", "-p", json.dumps({"data": {"e2e": "edited"}}))
    assert edited.returncode != 0 and "configmap names must not start with forbidden-" in edited.stderr, edited
    # Removing the label puts the object back under the policies, even for the admin.
    unlabelled = cluster.merge_patch(pykube.ConfigMap, stored, {"metadata": {"labels": {EXEMPT_LABEL: None}}},
                                     namespace=ns)
    assert_denied(unlabelled, GUARD, "configmap names must not start with forbidden-", code=403)

    # With every replica stopped the API server still decides the break-glass by itself.
    operator.stop()
    try:
        assert not operator.alive()
        down = cluster.create(pykube.Pod, labelled_pod(ns, image, "offensive-admin-down"))
        assert down.ok, f"operator down: the admin's break-glass write was refused: {down}"
        closed = as_editor("create", "-f", "-", input=labelled_pod(ns, image, "offensive-editor-down"))
        assert closed.returncode != 0 and "failed calling webhook" in closed.stderr, closed
        deleted = cluster.delete(pykube.ConfigMap, stored, ns)   # DELETE: the stored object's label decides
        assert deleted.ok, f"operator down: the admin's break-glass delete was refused: {deleted}"
    finally:
        if not operator.alive():
            operator.start()


def deny_everything() -> dict[str, Any]:
    """Refuses every write of everything it may judge, except the control plane's own (system:*)."""
    return policy_body(
        DENY_ALL,
        description="e2e: nothing may be written",
        enforcement="Enforce",
        failurePolicy="Fail",
        match={"resources": [{"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"],
                              "operations": ["CREATE", "UPDATE", "DELETE"]}],
               "conditions": [{"name": "not-the-control-plane",
                               "expression": "!request.userInfo.username.startsWith('system:')"}]},
        validations=[{"expression": "false", "message": "nothing may be written", "reason": "Forbidden"}])


def test_the_chart_installs_upgrades_and_uninstalls_under_a_deny_everything_policy(
        cluster: Cluster, operator: OperatorProcess, policies: Policies) -> None:
    """In the operator's own namespace, as the chart is meant to be installed: its namespaced
    objects are exempt there, and its cluster-scoped ones carry the break-glass label."""
    release = unique("e2e-glass", limit=20)
    own = cluster.settings.operator_namespace
    config = helm.Config(kubeconfig_path=str(cluster.settings.kubeconfig), namespace=own)
    values: dict[str, Any] = {"cleanupHook": {"enabled": False}, "replicaCount": 1}
    policies.apply(deny_everything())
    try:
        probe = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                 "metadata": {"name": unique("e2e-unlabelled")}, "rules": []}
        assert_denied(cluster.create(pykube.ClusterRole, probe, dry_run=True), DENY_ALL, "nothing may be written")
        with helm.Chart.load(CHART_DIR) as chart:
            config.install(chart, release, values, namespace=own, timeout=120)
            roles = cluster.items(pykube.ClusterRole, label_selector=f"app.kubernetes.io/instance={release}")
            assert roles and all(r["metadata"]["labels"][EXEMPT_LABEL] == "true" for r in roles), roles
            # An upgrade that changes a cluster-scoped object (the audit's list permissions).
            wider = {**values, "audit": {"listResources": [{"apiGroup": "", "resources": ["pods", "secrets"]}]}}
            config.upgrade(chart, release, wider, namespace=own, timeout=120)
            (role,) = [r for r in cluster.items(pykube.ClusterRole, label_selector=f"app.kubernetes.io/instance="
                                                f"{release}") if r["metadata"]["name"].endswith("-operator")]
            assert any("secrets" in rule.get("resources", []) and "list" in rule.get("verbs", [])
                       for rule in role["rules"]), role
        config.uninstall(release, timeout=120)
        assert cluster.items(pykube.ClusterRole, label_selector=f"app.kubernetes.io/instance={release}") == []
        assert_denied(cluster.create(pykube.ClusterRole, probe, dry_run=True), DENY_ALL, "nothing may be written")
    finally:
        policies.delete(DENY_ALL)
        config.uninstall(release, ignore_not_found=True, timeout=120)
