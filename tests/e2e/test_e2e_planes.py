"""Both control planes run, with the admission-policy APIs of their version: the harness's own check.

Each test runs on the session's plane and on the secondary one (conftest's ``native_target``):
``admissionregistration.k8s.io`` serves ValidatingAdmissionPolicies at ``v1beta1`` on 1.28 (behind the
gate the harness turns on) and ``v1`` from 1.30, and MutatingAdmissionPolicies at ``v1alpha1`` from
1.32 (gated too); a ValidatingAdmissionPolicy created there with ``kubectl apply`` gets its type
checking from kube-controller-manager (its ``status``: the controller runs only with the gate on 1.28)
and denies the request it matches.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pykube
import pytest
import yaml
from e2e_kube import Answer, Cluster, Target, configmap, eventually, unique
from envtest import ControlPlane, minor_version

pytestmark = pytest.mark.e2e

GROUP = "admissionregistration.k8s.io"
DENIED_NAME = "deny-me"
MESSAGE = "e2e-planes: ConfigMaps named deny-me are denied"


def expected_versions(version: tuple[int, int]) -> dict[str, str]:
    """resource -> the group version it is served at (the preferred one, as kubectl lists it)."""
    expected = {"validatingadmissionpolicies": "v1beta1" if version < (1, 30) else "v1",
                "validatingadmissionpolicybindings": "v1beta1" if version < (1, 30) else "v1"}
    if version >= (1, 32):
        expected |= {"mutatingadmissionpolicies": "v1alpha1", "mutatingadmissionpolicybindings": "v1alpha1"}
    return expected


def served_by_kubectl(cluster: Cluster) -> dict[str, str]:
    """``kubectl api-resources --api-group=admissionregistration.k8s.io``: resource -> version."""
    output = cluster.kubectl("api-resources", f"--api-group={GROUP}", "--no-headers").stdout
    served = {}
    for line in output.splitlines():
        fields = line.split()
        group_version = next((f for f in fields if f.startswith(f"{GROUP}/")), None)
        if fields and group_version:
            served[fields[0]] = group_version.removeprefix(f"{GROUP}/")
    return served


def discovered(cluster: Cluster, version: str) -> set[str]:
    """The resources ``/apis/admissionregistration.k8s.io/<version>`` lists (empty when not served)."""
    response = cluster.api.session.get(f"{cluster.api.url}/apis/{GROUP}/{version}", timeout=10)
    if response.status_code == 404:
        return set()
    response.raise_for_status()
    return {r["name"] for r in response.json()["resources"]}


def test_the_two_planes_are_of_different_versions(cluster: Cluster, control_plane: ControlPlane | None,
                                                  secondary_plane: ControlPlane) -> None:
    """Else every test on both would run twice on one version (E2E_SECONDARY_ASSETS names the other)."""
    if control_plane is not None:
        primary = control_plane.version
    else:
        primary = minor_version(cluster.api.session.get(f"{cluster.api.url}/version", timeout=10).json()["gitVersion"])
    assert primary != secondary_plane.version, (
        f"the primary and the secondary plane are both Kubernetes {primary[0]}.{primary[1]}: "
        f"E2E_SECONDARY_ASSETS={secondary_plane.assets} should be another version")


def test_the_admission_policy_apis_of_the_version_are_served(native_target: Target) -> None:
    cluster, operator, version = native_target
    assert operator.alive()
    expected = expected_versions(version)
    served = served_by_kubectl(cluster)
    assert {r: served.get(r) for r in expected} == expected, f"Kubernetes {version}: kubectl lists {served}"
    for resource, group_version in expected.items():
        assert resource in discovered(cluster, group_version), f"{resource} not in {GROUP}/{group_version}"
    if version < (1, 32):
        assert not any(r.startswith("mutatingadmissionpolicies") for r in served), served


def test_a_validating_admission_policy_denies_what_it_matches(native_target: Target,
                                                              target_namespace: Callable[..., str]) -> None:
    cluster, _, version = native_target
    api = f"{GROUP}/{expected_versions(version)['validatingadmissionpolicies']}"
    namespace = target_namespace()
    name = unique("e2e-planes-deny-me")
    documents = [
        {"apiVersion": api, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name},
         "spec": {"failurePolicy": "Fail",
                  "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                          "operations": ["CREATE", "UPDATE"],
                                                          "resources": ["configmaps"]}]},
                  "validations": [{"expression": f"object.metadata.name != '{DENIED_NAME}'", "message": MESSAGE}]}},
        {"apiVersion": api, "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
         "spec": {"policyName": name, "validationActions": ["Deny"],
                  "matchResources": {"namespaceSelector": {
                      "matchLabels": {"kubernetes.io/metadata.name": namespace}}}}},
    ]
    manifest = yaml.safe_dump_all(documents)
    try:
        cluster.kubectl("apply", "-f", "-", input=manifest)

        # kube-controller-manager type-checks it: the status shows that its controller runs.
        def status() -> dict[str, Any]:
            got = cluster.kubectl("get", f"validatingadmissionpolicies.{GROUP}", name, "-o", "json").stdout
            found: dict[str, Any] = json.loads(got).get("status") or {}
            return found
        checked = eventually(status, lambda s: s.get("observedGeneration") == 1 and "typeChecking" in s,
                             f"ValidatingAdmissionPolicy {name} to be type-checked by kube-controller-manager",
                             cluster.settings.timeout)
        assert not (checked["typeChecking"] or {}).get("expressionWarnings"), checked

        def create(object_name: str) -> Answer:
            return cluster.create(pykube.ConfigMap, configmap(namespace, object_name), dry_run=True)
        denied = eventually(lambda: create(DENIED_NAME), lambda a: not a.ok,
                            f"ValidatingAdmissionPolicy {name} to deny ConfigMap {DENIED_NAME}",
                            cluster.settings.timeout)
        assert denied.status == 422, denied   # no reason given: Invalid
        assert f"ValidatingAdmissionPolicy '{name}' with binding '{name}' denied request" in denied.message, denied
        assert MESSAGE in denied.message, denied
        allowed = create("allow-me")
        assert allowed.ok, allowed
    finally:
        cluster.kubectl("delete", "--ignore-not-found", "--wait", "-f", "-", input=manifest)
