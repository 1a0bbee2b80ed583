"""Kubernetes' own ValidatingAdmissionPolicy with the Pod Security checks (bench/pss-vap.yaml).

Rendered once for Pods and once for Deployments (the Pod template), since 1.28's type checker
gives a Pod's spec and a template's spec different types; each with a binding that denies. The
control plane serves them as it starts (tests/e2e/envtest.py turns on what its version needs):
``admissionregistration.k8s.io/v1beta1`` on 1.28-1.29, ``v1`` from 1.30, :func:`objects` picks it.

:func:`same_cel_policy` is the Pods' rendering as an AdmissionPolicy for the operator to generate
objects from (scenario ``native-same-cel``): the same CEL, so that what the generated objects cost
beyond the hand-written ones is the generator's own doing.
"""
from __future__ import annotations

from typing import Any, Final

import yaml

from common import BENCH

GROUP: Final = "admissionregistration.k8s.io"

# kind → (rule, where its Pod spec is, where its Pod metadata is)
TARGETS: Final = {
    "pods": ({"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE", "UPDATE"]},
             "object.spec", "object.metadata"),
    "deployments": ({"apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments"],
                     "operations": ["CREATE", "UPDATE"]},
                    "object.spec.template.spec", "object.spec.template.metadata"),
}


def api_version(version: tuple[int, int]) -> str:
    """``admissionregistration.k8s.io/v1beta1`` (1.28, 1.29) or ``.../v1`` (1.30+) for a plane of ``version``."""
    return f"{GROUP}/{'v1beta1' if version < (1, 30) else 'v1'}"


def policy(kind: str, version: tuple[int, int] = (1, 28)) -> dict[str, Any]:
    rule, spec, meta = TARGETS[kind]
    text = (BENCH / "pss-vap.yaml").read_text()
    text = (text.replace("OLDSPEC", "old" + spec[0].upper() + spec[1:]).replace("SPEC", spec)
            .replace("META", meta).replace("KIND", kind))
    body: dict[str, Any] = yaml.safe_load(text)
    body["apiVersion"] = api_version(version)
    body["spec"]["matchConstraints"]["resourceRules"] = [rule]
    return body


def binding(kind: str, version: tuple[int, int] = (1, 28)) -> dict[str, Any]:
    return {"apiVersion": api_version(version), "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": f"bench-pss-{kind}"},
            "spec": {"policyName": f"bench-pss-{kind}", "validationActions": ["Deny"]}}


def objects(version: tuple[int, int]) -> list[tuple[str, dict[str, Any]]]:
    """(collection path, body) of every object to create on a plane of ``version`` (``ControlPlane.version``),
    policies before their bindings."""
    api = f"/apis/{api_version(version)}"
    return ([(f"{api}/validatingadmissionpolicies", policy(kind, version)) for kind in TARGETS]
            + [(f"{api}/validatingadmissionpolicybindings", binding(kind, version)) for kind in TARGETS])


SAME_CEL_NAME: Final = "bench-pss-same-cel"


def same_cel_policy() -> dict[str, Any]:
    """pss-vap.yaml's Pod policy as an AdmissionPolicy with ``spec.native: Auto``: its match
    condition, variables and validations as they are. The operator generates a ValidatingAdmission
    Policy for Pods and one for workloads' Pod templates (where the hand-written file has its
    Deployments' rendering)."""
    rendered = policy("pods")["spec"]
    rule = TARGETS["pods"][0]
    return {"apiVersion": "policy-operator.dev/v1alpha1", "kind": "AdmissionPolicy",
            "metadata": {"name": SAME_CEL_NAME},
            "spec": {"native": "Auto", "failurePolicy": rendered["failurePolicy"],
                     "match": {"resources": [rule], "conditions": rendered["matchConditions"]},
                     "variables": rendered["variables"], "validations": rendered["validations"]}}
