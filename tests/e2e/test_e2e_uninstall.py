"""``helm uninstall``'s cleanup against a real API server, on both control planes (1.28:
ValidatingAdmissionPolicy v1beta1; 1.32: v1), run as the chart's hook runs it: the Job's command and
arguments, with a token of the hook's own ServiceAccount, its ClusterRole and binding applied for
real. It must leave nothing the operator created at runtime: the webhook configurations, and the
ValidatingAdmissionPolicies and bindings of native enforcement — gone, not terminating on their
finalizer, and no longer enforcing — while a ValidatingAdmissionPolicy that is not the operator's
stays.

The generated objects are written here as the operator writes them (its labels and finalizer),
with the plane's operator stopped: it would sweep objects no policy owns on its own, and at
post-delete time no operator runs either. It is started again afterwards.
"""
from __future__ import annotations

import contextlib
import functools
import os
import pathlib
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import helm_python as helm
import pykube
import pytest
from e2e_kube import (
    Answer,
    Cluster,
    MutatingWebhookConfiguration,
    Target,
    ValidatingWebhookConfiguration,
    cli,
    eventually,
    unique,
)
from test_e2e_chart import can_i, dump, is_hook, token_kubeconfig

# The chart's renderer lives with the chart tests (a plain module, like this directory's e2e_kube).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "chart"))
from chart_render import CHART_DIR, render

pytestmark = pytest.mark.e2e

GROUP = "admissionregistration.k8s.io"
POLICIES, BINDINGS = "validatingadmissionpolicies", "validatingadmissionpolicybindings"
# What the operator puts on every object it generates (vap/native.py), spelled out: the docs tell
# users to delete by this label, so the cleanup must find them by it.
MANAGED_BY = {"app.kubernetes.io/managed-by": "admission-policy-operator"}
NATIVE_FINALIZER = "policy-operator.dev/native"
DENIED = "e2e-uninstall: refused by a generated ValidatingAdmissionPolicy"


def _version(cluster: Cluster) -> str:
    for version in ("v1", "v1beta1"):
        answer = cluster.raw("GET", f"/apis/{GROUP}/{version}")
        if answer.ok and any(r.get("name") == POLICIES for r in answer.obj.get("resources", [])):
            return version
    pytest.fail("the control plane serves no ValidatingAdmissionPolicy API")


def _pair(version: str, name: str, namespace: str, *, generated: bool) -> list[dict[str, Any]]:
    """A policy refusing ConfigMaps named ``name`` in ``namespace``, and its binding; ``generated``:
    labelled and held as the operator's own (the policy it came from is named ``policy-name``)."""
    metadata: dict[str, Any] = {"name": name, "labels": {"e2e.policy-operator.dev/owned": "true"}}
    if generated:
        metadata = {"name": name, "finalizers": [NATIVE_FINALIZER], "labels": {
            **MANAGED_BY, "policy-operator.dev/policy-kind": "AdmissionPolicy",
            "policy-operator.dev/policy-name": name.rpartition(".")[2]}}
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}]
    where = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    policy = {"apiVersion": f"{GROUP}/{version}", "kind": "ValidatingAdmissionPolicy", "metadata": metadata,
              "spec": {"failurePolicy": "Fail",
                       "matchConstraints": {"resourceRules": rules, "namespaceSelector": where},
                       "validations": [{"expression": f"object.metadata.name != {name.replace('.', '-')!r}",
                                        "message": DENIED}]}}
    binding = {"apiVersion": f"{GROUP}/{version}", "kind": "ValidatingAdmissionPolicyBinding", "metadata": {**metadata},
               "spec": {"policyName": name, "validationActions": ["Deny"],
                        "matchResources": {"namespaceSelector": where}}}
    return [policy, binding]


def _path(version: str, plural: str, name: str = "") -> str:
    return f"/apis/{GROUP}/{version}/{plural}" + (f"/{name}" if name else "")


def _configmap_refused(cluster: Cluster, namespace: str, name: str) -> Answer:
    body = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name.replace(".", "-"), "namespace": namespace}}
    return cluster.create(pykube.ConfigMap, body, dry_run=True)


def _labelled(cluster: Cluster, version: str) -> list[str]:
    selector = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())
    names = []
    for plural in (POLICIES, BINDINGS):
        answer = cluster.raw("GET", _path(version, plural), params={"labelSelector": selector})
        assert answer.ok, str(answer)
        names += [f"{plural}/{item['metadata']['name']}" for item in answer.obj.get("items", [])]
    return names


def _force_remove(cluster: Cluster, version: str, plural: str, name: str) -> None:
    """What a failed test leaves: its finalizer off, deleted (a test must not leave a policy in force)."""
    path = _path(version, plural, name)
    if cluster.raw("GET", path).ok:
        cluster.api.session.patch(cluster.api.url + path, json={"metadata": {"finalizers": None}},
                                  headers={"Content-Type": "application/merge-patch+json"}, timeout=30)
        cluster.raw("DELETE", path)


def test_uninstall_hook_leaves_no_generated_policy_and_no_webhook_configuration(
        native_target: Target, target_namespace: Callable[..., str], tmp_path: pathlib.Path) -> None:
    cluster, operator = native_target.cluster, native_target.operator
    version = _version(cluster)
    release_namespace, judged = target_namespace(), target_namespace()
    config = unique("e2e-uninstall")   # not the session's configurations: the hook deletes these only
    with helm.Chart.load(CHART_DIR) as chart:
        docs = render(chart, {"webhook": {"configName": config}}, release_namespace)
    hook = [d for d in docs if is_hook(d) and d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]
    (job,) = [d for d in docs if is_hook(d) and d["kind"] == "Job"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["admission-policy"]
    (account,) = [d["metadata"]["name"] for d in hook if d["kind"] == "ServiceAccount"]

    generated = sorted(f"ap.policy.{unique('e2e-uninstall', 40)}" for _ in range(2))   # as listed
    unrelated = unique("e2e-not-the-operators")
    objects = [*(obj for name in generated for obj in _pair(version, name, judged, generated=True)),
               *_pair(version, unrelated, judged, generated=False)]

    with contextlib.ExitStack() as cleanup:   # callbacks run last-registered first, each even if one fails
        cleanup.callback(cluster.kubectl, "delete", "--ignore-not-found", "--wait=false", "-f", "-", input=dump(hook))
        cluster.kubectl("apply", "-f", "-", input=dump(hook))
        token = cluster.kubectl("create", "token", account, "-n", release_namespace, "--duration=1h").stdout.strip()
        kubeconfig = token_kubeconfig(cluster.settings.kubeconfig, token, release_namespace,
                                      tmp_path / "cleanup-hook.kubeconfig")
        # The hook's identity: nothing beyond its grants.
        assert can_i(cluster, kubeconfig, "delete", f"validatingwebhookconfigurations/{config}")
        assert not can_i(cluster, kubeconfig, "delete", f"validatingwebhookconfigurations/{config}-other")
        assert not can_i(cluster, kubeconfig, "create", POLICIES)
        assert not can_i(cluster, kubeconfig, "get", f"{BINDINGS}/{generated[0]}")

        # The plane's operator makes way (it would sweep what no policy owns); it must run again after.
        cleanup.callback(lambda: None if operator.alive() else operator.start())
        operator.stop()
        for plural in (POLICIES, BINDINGS):
            for name in [*generated, unrelated]:
                cleanup.callback(_force_remove, cluster, version, plural, name)
        for cls in (ValidatingWebhookConfiguration, MutatingWebhookConfiguration):
            cleanup.callback(cluster.raw, "DELETE", f"/apis/{GROUP}/v1/{cls.endpoint}/{config}")
            created = cluster.create(cls, {"apiVersion": f"{GROUP}/v1", "kind": cls.kind, "metadata": {"name": config}})
            assert created.ok, str(created)
        for obj in objects:
            plural = POLICIES if obj["kind"] == "ValidatingAdmissionPolicy" else BINDINGS
            created = cluster.raw("POST", _path(version, plural), body=obj)
            assert created.ok, str(created)
        # In force: the API server refuses what they refuse (it loads them from a watch).
        for name in [*generated, unrelated]:
            eventually(functools.partial(_configmap_refused, cluster, judged, name),
                       lambda a: not a.ok and DENIED in a.message, f"{name} to be enforced", cluster.settings.timeout)
        # One deleted by hand: held by the finalizer, terminating and still in force, until released.
        deleted = cluster.raw("DELETE", _path(version, POLICIES, generated[0]))
        assert deleted.ok and deleted.obj["metadata"].get("deletionTimestamp"), str(deleted)

        # As the Job runs it: its command and arguments, its ServiceAccount's token.
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), **{e["name"]: e["value"] for e in container["env"]}}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        result = subprocess.run([*cli(), *container["args"]], capture_output=True, text=True, timeout=120, env=env)
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"{' '.join(container['args'])} exited {result.returncode}:\n{output}"

        lines = result.stdout.splitlines()
        expected = [f"deleted {kind}WebhookConfiguration {config}" for kind in ("Validating", "Mutating")]
        expected += [
            *(f"deleted ValidatingAdmissionPolicyBinding {name}" for name in generated),
            *(f"deleted ValidatingAdmissionPolicy {name}" for name in generated)]
        assert [line for line in lines if line in expected] == expected, output   # bindings before policies
        # Gone at once, not terminating; and nothing labelled as the operator's left (a probe included).
        for name in generated:
            for plural in (POLICIES, BINDINGS):
                answer = cluster.raw("GET", _path(version, plural, name))
                assert answer.status == 404, f"{plural}/{name} is still there: {answer.body}"
        assert _labelled(cluster, version) == []
        for cls in (ValidatingWebhookConfiguration, MutatingWebhookConfiguration):
            assert cluster.get(cls, config).status == 404, f"{cls.kind} {config} is still there"
        # No longer enforced; the policy that is not the operator's stays, and in force.
        for name in generated:
            eventually(functools.partial(_configmap_refused, cluster, judged, name), lambda a: a.ok,
                       f"{name} to be enforced no more", cluster.settings.timeout)
        for plural in (POLICIES, BINDINGS):
            assert cluster.raw("GET", _path(version, plural, unrelated)).ok, f"{plural}/{unrelated} was deleted"
        refused = _configmap_refused(cluster, judged, unrelated)
        assert not refused.ok and DENIED in refused.message, str(refused)

        # post-delete runs it again, with everything gone already: no error.
        again = subprocess.run([*cli(), *container["args"]], capture_output=True, text=True, timeout=120, env=env)
        assert again.returncode == 0, again.stdout + again.stderr
        assert again.stdout.splitlines() == [f"no webhook configurations named {config!r}",
                                             "no generated admission policies or bindings"], again.stdout
