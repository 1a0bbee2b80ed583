"""Kubernetes' own ValidatingAdmissionPolicy with the Pod Security checks (bench/pss-vap.yaml).

Rendered once for Pods and once for Deployments (the Pod template), since 1.28's type checker
gives a Pod's spec and a template's spec different types; each with a binding that denies. The
API server needs ``APISERVER_FLAGS`` to serve them.
"""
from __future__ import annotations

from typing import Any, Final

import yaml

from common import BENCH

APISERVER_FLAGS: Final = ("--feature-gates=ValidatingAdmissionPolicy=true",
                          "--runtime-config=admissionregistration.k8s.io/v1beta1=true")
API: Final = "/apis/admissionregistration.k8s.io/v1beta1"
POLICIES: Final = f"{API}/validatingadmissionpolicies"
BINDINGS: Final = f"{API}/validatingadmissionpolicybindings"

# kind → (rule, where its Pod spec is, where its Pod metadata is)
TARGETS: Final = {
    "pods": ({"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE", "UPDATE"]},
             "object.spec", "object.metadata"),
    "deployments": ({"apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments"],
                     "operations": ["CREATE", "UPDATE"]},
                    "object.spec.template.spec", "object.spec.template.metadata"),
}


def policy(kind: str) -> dict[str, Any]:
    rule, spec, meta = TARGETS[kind]
    text = (BENCH / "pss-vap.yaml").read_text()
    text = (text.replace("OLDSPEC", "old" + spec[0].upper() + spec[1:]).replace("SPEC", spec)
            .replace("META", meta).replace("KIND", kind))
    body: dict[str, Any] = yaml.safe_load(text)
    body["spec"]["matchConstraints"]["resourceRules"] = [rule]
    return body


def binding(kind: str) -> dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1beta1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": f"bench-pss-{kind}"},
            "spec": {"policyName": f"bench-pss-{kind}", "validationActions": ["Deny"]}}


def objects() -> list[tuple[str, dict[str, Any]]]:
    """(collection path, body) of every object to create, policies before their bindings."""
    return ([(POLICIES, policy(kind)) for kind in TARGETS] + [(BINDINGS, binding(kind)) for kind in TARGETS])
