# ruff: noqa: RUF001, RUF003  (the policy's messages say "3 × 500m", and so do these assertions)
"""Params and context on a real API server: examples/deployment-quota, and a cache that falls behind.

The quota policy reads the namespace's ConfigMap ``deployment-quota`` as ``params`` and the
namespace's Deployments as ``context.deployments``, both from the operator's watch-backed caches.
Admissions never wait for those caches, so right after a write the operator may not have seen it
yet: a request that must be *denied* because of an earlier write is sent as a dry run until the
cache has caught up (``eventually``); one that must be allowed needs no wait (a cache behind can only
allow more). Deployments are created paused: no controller makes Pods of them.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pykube
import pytest
import requests
from e2e_kube import (
    AdmissionPolicy,
    Answer,
    Cluster,
    OperatorProcess,
    Policies,
    assert_denied,
    eventually,
    example_policy,
    policy_body,
    unique,
)

from builders import deployment

pytestmark = pytest.mark.e2e

QUOTA = "deployment-quota"
HALF_A_CPU = {"requests": {"cpu": "500m", "memory": "64Mi"}}   # what each Pod of the Deployments requests


def quota(namespace: str, cpu: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": QUOTA, "namespace": namespace},
            "data": {"cpu": cpu, "memory": "64Gi"}}


def scale(cluster: Cluster, name: str, namespace: str, replicas: int, *, dry_run: bool = False) -> Answer:
    """What `kubectl scale` sends: a patch of the deployments/scale subresource."""
    return cluster.call("PATCH", pykube.Deployment, name, namespace=namespace, subresource="scale",
                        body={"spec": {"replicas": replicas}}, params={"dryRun": "All"} if dry_run else None,
                        content_type="application/merge-patch+json")


def denied_once_seen(cluster: Cluster, send: Callable[[], Answer], what: str) -> Answer:
    """The answer to ``send`` once the operator's caches hold what the test just wrote."""
    return eventually(send, lambda answer: not answer.ok, what, cluster.settings.timeout)


def test_deployment_quota_admits_up_to_the_limit_per_namespace_and_follows_the_configmap(
        cluster: Cluster, policies: Policies, namespace: Callable[..., str]) -> None:
    image = cluster.settings.pod_image
    small, large = namespace(), namespace()
    assert cluster.create(pykube.ConfigMap, quota(small, "2")).ok
    assert cluster.create(pykube.ConfigMap, quota(large, "4")).ok
    applied = policies.apply(example_policy(QUOTA))
    synced = [c for c in applied["status"]["conditions"] if c["type"] == "InputsSynced"]
    assert synced and synced[0]["status"] == "True", applied["status"]

    # Up to the limit of namespace `small` (2 CPU): 2 × 500m, then 2 × 500m.
    for name in ("api", "web"):
        created = cluster.create(pykube.Deployment, deployment(name, namespace=small, image=image, replicas=2,
                                                               paused=True, resources=HALF_A_CPU))
        assert created.ok, str(created)
    # One more Pod's worth would exceed it, once the cache has seen both.
    worker = deployment("worker", namespace=small, image=image, replicas=1, paused=True, resources=HALF_A_CPU)
    over = denied_once_seen(cluster, lambda: cluster.create(pykube.Deployment, worker, dry_run=True),
                            "the Deployment over the quota to be denied")
    assert_denied(over, QUOTA, f"would bring the CPU requested by Deployments in namespace {small} to 2500m",
                  "in use: 2, requested: 1 × 500m", f"over the limit of 2 in ConfigMap {small}/{QUOTA}", code=403)

    # The same Deployment in namespace `large` (4 CPU) is admitted: its own param, its own Deployments.
    for name in ("api", "web", "worker"):
        created = cluster.create(pykube.Deployment, deployment(name, namespace=large, image=image, replicas=2,
                                                               paused=True, resources=HALF_A_CPU))
        assert created.ok, f"{name} in {large}: {created}"

    # kubectl scale past the limit: the Scale has no Pod template, the policy reads it from context.
    scaled = scale(cluster, "api", small, 3)
    assert_denied(scaled, QUOTA, "to 2500m (in use: 1, requested: 3 × 500m)", "over the limit of 2", code=403)
    result = cluster.kubectl("scale", "deployment/api", "--replicas=3", "-n", small, check=False)
    assert result.returncode != 0, result.stdout
    assert f'AdmissionPolicy "{QUOTA}" denied the request' in result.stderr, result.stderr
    assert scale(cluster, "api", small, 1).ok   # scaling down always is

    # Raising the limit in the ConfigMap takes effect without touching the policy.
    assert cluster.merge_patch(pykube.ConfigMap, QUOTA, {"data": {"cpu": "3"}}, namespace=small).ok
    eventually(lambda: scale(cluster, "api", small, 4, dry_run=True), lambda answer: answer.ok,
               "scaling to 4 × 500m to be allowed under the raised limit", cluster.settings.timeout)
    assert scale(cluster, "api", small, 4).ok
    assert_denied(scale(cluster, "web", small, 3, dry_run=True), QUOTA, "to 3500m", "over the limit of 3")
    policy = cluster.get(AdmissionPolicy, QUOTA).obj
    assert policy["metadata"]["generation"] == applied["metadata"]["generation"]


WIDGETS_CRD = "widgets.e2e.policy-operator.dev"


def widgets_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": WIDGETS_CRD},
        "spec": {"group": "e2e.policy-operator.dev", "scope": "Namespaced",
                 "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                     "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
    }


def condition(body: dict[str, Any], type_: str) -> dict[str, Any]:
    found = [c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == type_]
    return found[0] if found else {}


def test_a_context_cache_that_falls_behind_is_reported_and_never_judged_by(
        cluster: Cluster, operator: OperatorProcess, policies: Policies, namespace: Callable[..., str]) -> None:
    """The watch of a context's resource breaks (its CRD is deleted): the policy goes Degraded with
    InputsSynced=False naming the source, the metric says so, and the requests it judges get the
    failurePolicy answer naming the context, not a verdict from the last list. Back when it is served again."""
    ns = namespace()
    crd = pykube.CustomResourceDefinition
    assert cluster.create(crd, widgets_crd()).ok
    try:
        eventually(lambda: cluster.call("GET", crd, WIDGETS_CRD), lambda a: any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in (a.obj.get("status") or {}).get("conditions") or []), "the CRD to be established",
            cluster.settings.timeout)
        name = unique("e2e-widget-context", limit=50)
        policies.apply(policy_body(
            name, failurePolicy="Fail",
            match={"resources": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
                                  "operations": ["CREATE"]}],
                   "conditions": [{"name": "this-test", "expression": f"request.namespace == '{ns}'"}]},
            context=[{"name": "widgets", "group": "e2e.policy-operator.dev", "version": "v1",
                      "resource": "widgets", "scope": "RequestNamespace", "maxObjects": 10}],
            validations=[{"expression": "context.widgets.size() < 10", "message": "too many widgets"}]))
        configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "probe", "namespace": ns}}
        assert cluster.create(pykube.ConfigMap, configmap, dry_run=True).ok

        cluster.delete(crd, WIDGETS_CRD)
        cluster.wait_gone(crd, WIDGETS_CRD)
        degraded = eventually(lambda: cluster.get(AdmissionPolicy, name),
                              lambda a: (a.obj.get("status") or {}).get("phase") == "Degraded",
                              "the policy to go Degraded", cluster.settings.timeout).obj
        synced = condition(degraded, "InputsSynced")
        assert synced["status"] == "False" and synced["reason"] == "NotSynced", degraded["status"]
        assert "context 'widgets'" in synced["message"] and "widgets.e2e.policy-operator.dev/v1" in synced["message"]
        refused = cluster.create(pykube.ConfigMap, configmap, dry_run=True)
        assert not refused.ok, str(refused)
        assert f'AdmissionPolicy "{name}" could not evaluate the request' in refused.message, refused.message
        assert "context 'widgets' (widgets.e2e.policy-operator.dev/v1) is not in sync" in refused.message
        metrics = requests.get(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5).text
        assert 'admission_policy_context_synced{source="widgets.e2e.policy-operator.dev/v1"} 0.0' in metrics

        assert cluster.create(crd, widgets_crd()).ok
        eventually(lambda: cluster.get(AdmissionPolicy, name),
                   lambda a: (a.obj.get("status") or {}).get("phase") == "Active",
                   "the policy to be Active again", cluster.settings.timeout)
        eventually(lambda: cluster.create(pykube.ConfigMap, configmap, dry_run=True), lambda a: a.ok,
                   "requests to be judged again", cluster.settings.timeout)
    finally:
        cluster.delete(crd, WIDGETS_CRD)
