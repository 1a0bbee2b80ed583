"""Python plugins on a real API server: the two shipped plugins judge what ``kubectl apply`` sends,
and a feature gate switched off disables its plugin, which the policy reports.

What a user sees: a ``kubernetes.io/tls`` Secret whose certificate expired is refused, naming the
policy and the certificate's end date; a Pod whose image is not pinned by digest is refused; an
operator started with ``AP_FEATURE_GATES=TLSSecretsPlugin=false`` (the chart's ``featureGates``)
marks the policy Degraded with ``PluginsEnabled=False`` in ``kubectl describe``, skips the plugin's
rule and says so in its metrics; with the gate back on, the policy is Active and denies again.
"""
from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import pykube
import pytest
import requests
import yaml
from e2e_kube import EXAMPLES, AdmissionPolicy, Answer, Cluster, OperatorProcess, Policies, eventually, example_policy
from prometheus_client.parser import text_string_to_metric_families
from replicas import replicas

pytestmark = pytest.mark.e2e

TLS = "tls-secrets"
IMAGES = "image-references"
GATE = "TLSSecretsPlugin"


def manifest(example: str, file: str, namespace: str) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((EXAMPLES / example / file).read_text())
    body["metadata"]["namespace"] = namespace
    return body


def kubectl_apply(cluster: Cluster, body: dict[str, Any]) -> Any:
    return cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body), check=False)


def refused(cluster: Cluster, body: dict[str, Any]) -> str:
    """kubectl apply's error once the policy judges ``body`` (the webhook may route it a moment late)."""
    result = eventually(lambda: kubectl_apply(cluster, body), lambda r: r.returncode != 0,
                        f"kubectl apply of {body['kind']} {body['metadata']['name']} to be refused",
                        cluster.settings.timeout)
    stderr: str = result.stderr
    return stderr


def samples(replica: OperatorProcess, sample_name: str, /, **labels: str) -> list[float]:
    """The values of the replica's metric samples of that name carrying those labels."""
    text = requests.get(f"http://127.0.0.1:{replica.metrics_port}/metrics", timeout=5).text
    return [sample.value for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name == sample_name and labels.items() <= sample.labels.items()]


def metric(replica: OperatorProcess, sample_name: str, /, **labels: str) -> float:
    return sum(samples(replica, sample_name, **labels))


def status_of(cluster: Cluster, name: str, phase: str) -> dict[str, Any]:
    def settled(answer: Answer) -> bool:
        status = answer.obj.get("status") or {}
        return status.get("phase") == phase and status.get("observedGeneration") == answer.obj["metadata"]["generation"]
    found: dict[str, Any] = eventually(lambda: cluster.get(AdmissionPolicy, name), settled,
                                       f"AdmissionPolicy {name} to be {phase}", cluster.settings.timeout).obj["status"]
    return found


def test_a_tls_secret_with_an_expired_certificate_is_denied_and_a_good_one_admitted(
        cluster: Cluster, operator: OperatorProcess, policies: Policies, namespace: Callable[..., str]) -> None:
    ns = namespace()
    policies.apply(example_policy(TLS))
    failed_before = metric(operator, "admission_policy_plugin_calls_total", plugin=TLS, result="failed")

    message = refused(cluster, manifest(TLS, "secret-expired.yaml", ns))
    assert f'AdmissionPolicy "{TLS}" denied the request' in message, message
    assert "expired" in message and "2021-01-01" in message, message
    assert cluster.get(pykube.Secret, "old-tls", ns).status == 404
    message = refused(cluster, manifest(TLS, "secret-wrong-key.yaml", ns))
    assert "is not the key of the certificate" in message, message

    assert kubectl_apply(cluster, manifest(TLS, "secret-good.yaml", ns)).returncode == 0
    assert metric(operator, "admission_policy_plugin_calls_total", plugin=TLS, result="failed") >= failed_before + 2
    assert metric(operator, "admission_policy_plugin_calls_total", plugin=TLS, result="passed") >= 1


def test_a_pod_image_without_a_digest_is_denied_where_the_policy_requires_one(
        cluster: Cluster, policies: Policies, namespace: Callable[..., str]) -> None:
    ns = namespace()
    policies.apply(example_policy(IMAGES))
    message = refused(cluster, manifest(IMAGES, "pod-no-digest.yaml", ns))
    assert f'AdmissionPolicy "{IMAGES}" denied the request' in message, message
    assert "registry.acme.com/shop/web:3.2" in message and "digest" in message, message
    # docker.io's defaults: "nginx@sha256:…" is docker.io/library/nginx, not an allowed registry.
    message = refused(cluster, manifest(IMAGES, "pod-docker-hub.yaml", ns))
    assert "docker.io" in message, message
    assert kubectl_apply(cluster, manifest(IMAGES, "pod-good.yaml", ns)).returncode == 0


def test_a_gate_switched_off_disables_its_plugin_and_the_policy_reports_it(
        cluster: Cluster, operator: OperatorProcess, policies: Policies, namespace: Callable[..., str],
        tmp_path: pathlib.Path, request: pytest.FixtureRequest) -> None:
    ns = namespace()
    policies.apply(example_policy(TLS))
    expired = manifest(TLS, "secret-expired.yaml", ns)
    refused(cluster, expired)

    with replicas(cluster, operator, tmp_path, request, count=1, peering=False, proxy=False,
                  env={"AP_FEATURE_GATES": f"{GATE}=false"}) as group:
        (gated,) = group.processes
        status = status_of(cluster, TLS, "Degraded")
        condition = next(c for c in status["conditions"] if c["type"] == "PluginsEnabled")
        assert condition["status"] == "False" and condition["reason"] == "FeatureGateDisabled", condition
        assert TLS in condition["message"] and GATE in condition["message"], condition
        described = cluster.kubectl("describe", "admissionpolicy", TLS).stdout
        assert "Degraded" in described and "FeatureGateDisabled" in described and GATE in described, described
        assert samples(gated, "admission_policy_feature_gate", name=GATE, stage="Beta") == [0]
        assert samples(gated, "admission_policy_feature_gate", name="ImageReferencesPlugin") == [1]

        # The plugin's rule is skipped (the policy's other rules would still hold): admitted.
        assert kubectl_apply(cluster, expired).returncode == 0
        assert metric(gated, "admission_policy_plugin_calls_total", plugin=TLS) == 0
        cluster.delete(pykube.Secret, "old-tls", ns)
        cluster.wait_gone(pykube.Secret, "old-tls", ns)

    # The session's operator, gate on (its default, Beta): Active again, and the Secret is refused.
    status = status_of(cluster, TLS, "Active")
    condition = next(c for c in status["conditions"] if c["type"] == "PluginsEnabled")
    assert condition["status"] == "True", condition
    assert "expired" in refused(cluster, expired)
