"""Pod controllers on a real API server: a Pod policy judges the Pod templates of workloads.

What a user sees with kubectl: a Deployment whose template a Pod policy refuses is refused at
``kubectl apply``, naming the Deployment; a compliant one is admitted, and so is the ReplicaSet its
controller creates; a mutation of Pods patches a Deployment's template; a Deployment admitted
before the policy existed can still be scaled and relabelled (its template is unchanged); the
webhook configurations route workloads only while a Pod policy needs them.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pykube
import pytest
import yaml
from e2e_kube import (
    Answer,
    Cluster,
    Policies,
    ValidatingWebhookConfiguration,
    eventually,
    example_policy,
)

from builders import deployment

pytestmark = pytest.mark.e2e

BASELINE = "pod-security-baseline"
DEFAULTS = "default-resources"


def apply(cluster: Cluster, body: dict[str, Any], *, check: bool = True) -> Any:
    return cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body), check=check)


def routed_resources(cluster: Cluster) -> set[str]:
    answer = cluster.get(ValidatingWebhookConfiguration, cluster.settings.webhook_config_name)
    return {resource for webhook in answer.obj.get("webhooks") or [] for rule in webhook.get("rules") or []
            for resource in rule.get("resources") or []}


def test_a_privileged_deployment_is_denied_at_apply_and_a_compliant_one_admitted(
        cluster: Cluster, policies: Policies, namespace: Callable[..., str]) -> None:
    ns = namespace()
    image = cluster.settings.pod_image
    body = example_policy(BASELINE)
    applied = policies.apply(body)
    assert "Deployment" in applied["status"]["podControllers"]["kinds"]
    assert {"deployments", "cronjobs", "replicasets"} <= routed_resources(cluster)

    privileged = deployment("privileged-web", namespace=ns, image=image, privileged=True)
    refused = eventually(lambda: apply(cluster, privileged, check=False), lambda r: r.returncode != 0,
                         "kubectl apply of a privileged Deployment to be refused", cluster.settings.timeout)
    assert f'AdmissionPolicy "{BASELINE}" denied the request: the Pod template of Deployment "privileged-web" ' \
           "would violate the policy: Privileged Containers:" in refused.stderr, refused.stderr
    assert cluster.get(pykube.Deployment, "privileged-web", ns).status == 404

    compliant = deployment("web", namespace=ns, image=image)
    assert "deployment.apps/web created" in apply(cluster, compliant).stdout
    replica_sets = eventually(lambda: cluster.items(pykube.ReplicaSet, namespace=ns), lambda items: bool(items),
                              "the Deployment's ReplicaSet to be created (and admitted)", cluster.settings.timeout)
    assert replica_sets[0]["metadata"]["ownerReferences"][0]["name"] == "web"

    # Only while a Pod policy needs them: with the policy gone, workloads are no longer routed.
    policies.delete(body["metadata"]["name"])
    eventually(lambda: routed_resources(cluster), lambda found: "deployments" not in found,
               "deployments to leave the webhook configuration", cluster.settings.timeout)


def test_a_pod_mutation_patches_a_deployment_template(cluster: Cluster, policies: Policies,
                                                      namespace: Callable[..., str]) -> None:
    ns = namespace()
    policies.apply_example(DEFAULTS)
    bare = deployment("shop", namespace=ns, image=cluster.settings.pod_image)

    def mutated(answer: Answer) -> bool:
        containers = answer.obj.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or [{}]
        return answer.ok and "resources" in containers[0] and bool(containers[0]["resources"])
    eventually(lambda: cluster.create(pykube.Deployment, bare, dry_run=True), mutated,
               "the mutating webhook to default the template's resources", cluster.settings.timeout)
    apply(cluster, bare)
    stored = cluster.get(pykube.Deployment, "shop", ns).obj
    assert stored["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "500m", "memory": "512Mi"}}
    assert "resources" not in stored["spec"]   # the patch went into the template, nowhere else


def test_a_deployment_admitted_before_the_policy_can_be_scaled_and_updated(
        cluster: Cluster, policies: Policies, namespace: Callable[..., str]) -> None:
    ns = namespace()
    image = cluster.settings.pod_image
    apply(cluster, deployment("legacy", namespace=ns, image=image, privileged=True))
    policies.apply_example(BASELINE)
    probe = deployment("probe", namespace=ns, image=image, privileged=True)
    eventually(lambda: cluster.create(pykube.Deployment, probe, dry_run=True), lambda a: not a.ok,
               "the policy to be routed for Deployments", cluster.settings.timeout)

    scaled = cluster.kubectl("scale", "deployment/legacy", "--replicas=3", "-n", ns)
    assert "scaled" in scaled.stdout
    labelled = cluster.kubectl("label", "deployment/legacy", "team=payments", "-n", ns)
    assert "labeled" in labelled.stdout
    patched = cluster.kubectl("patch", "deployment/legacy", "-n", ns, "--type=merge",
                              "-p", json.dumps({"spec": {"revisionHistoryLimit": 3}}))
    assert "patched" in patched.stdout
    stored = cluster.get(pykube.Deployment, "legacy", ns).obj
    assert stored["spec"]["replicas"] == 3 and stored["metadata"]["labels"]["team"] == "payments"

    # Changing its template is judged: the new Pods would be refused.
    refused = cluster.kubectl("set", "image", "deployment/legacy", f"app={image}-new", "-n", ns, check=False)
    assert refused.returncode != 0
    assert 'the Pod template of Deployment "legacy" would violate the policy' in refused.stderr, refused.stderr
