"""Policy sets for the workloads, and the API resources the emulated cluster serves.

Every emulator of the bench (even the no-op baseline's) serves the same resources, so the
scenarios differ only in the policies installed: Kopf's resource lookup per admission request
scans what discovery returned, and that cost must not differ between the runs compared.
"""
from __future__ import annotations

from typing import Any, Final

import yaml

from common import EXAMPLES

SETS: Final = {
    "none": (),
    "pss": ("pod-security-baseline", "pod-security-restricted"),
    "mutation": ("default-resources", "sidecar-injection"),
}

# A cluster of a realistic size: most of kmock's bundled builtins (K3s), plus ten CRD groups.
# Skipped: metrics.k8s.io (it reuses the core plurals "pods"/"nodes"), non-preferred versions.
SKIPPED_GROUPS: Final = frozenset({"metrics.k8s.io"})
CRD_GROUPS: Final = 10
CRD_KINDS: Final = ("Widget", "Gadget", "Gizmo")

# Builtin resources the generated policies use: none of them is a Pod CREATE, a Deployment
# UPDATE or a nodes/status UPDATE, the requests the bench sends.
GENERATED_BUILTIN_RULES: Final = (
    ("", "configmaps", ("CREATE", "UPDATE")),
    ("", "secrets", ("CREATE", "UPDATE")),
    ("", "services", ("CREATE", "UPDATE")),
    ("", "serviceaccounts", ("CREATE",)),
    ("", "pods", ("DELETE",)),                   # the same resource, another operation
    ("apps", "statefulsets", ("CREATE", "UPDATE")),
    ("apps", "daemonsets", ("CREATE", "UPDATE")),
    ("batch", "jobs", ("CREATE",)),
    ("batch", "cronjobs", ("CREATE", "UPDATE")),
    ("networking.k8s.io", "ingresses", ("CREATE", "UPDATE")),
    ("policy", "poddisruptionbudgets", ("CREATE", "UPDATE")),
    ("rbac.authorization.k8s.io", "rolebindings", ("CREATE", "UPDATE")),
)


def example(name: str) -> dict[str, Any]:
    (body,) = [doc for doc in yaml.safe_load_all((EXAMPLES / name / "policy.yaml").read_text()) if doc]
    return dict(body)


def example_set(name: str) -> list[dict[str, Any]]:
    return [example(directory) for directory in SETS[name]]


def with_native(bodies: list[dict[str, Any]], mode: str) -> list[dict[str, Any]]:
    """Copies of ``bodies`` with ``spec.native`` set (``Auto``: Kubernetes enforces them if it can; ``Never``)."""
    return [{**body, "spec": {**body["spec"], "native": mode}} for body in bodies]


def crd_group(index: int) -> str:
    return f"team{index}.bench.example.com"


def crds() -> list[dict[str, Any]]:
    """Cluster-scoped CRDs of the generated groups (what the non-matching policies name)."""
    result = []
    for group_index in range(CRD_GROUPS):
        for kind in CRD_KINDS:
            plural = kind.lower() + "s"
            group = crd_group(group_index)
            result.append({
                "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{plural}.{group}"},
                "spec": {"group": group, "scope": "Namespaced",
                         "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
                         "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                                       "schema": {"openAPIV3Schema": {
                                           "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
            })
    return result


def _rule(index: int) -> dict[str, Any]:
    """Two policies in three name a CRD, the rest a builtin other than the requests sent."""
    if index % 3 != 2:
        group = crd_group(index % CRD_GROUPS)
        plural = CRD_KINDS[(index // CRD_GROUPS) % len(CRD_KINDS)].lower() + "s"
        return {"apiGroups": [group], "apiVersions": ["v1"], "resources": [plural],
                "operations": ["CREATE", "UPDATE"]}
    group, plural, operations = GENERATED_BUILTIN_RULES[(index // 3) % len(GENERATED_BUILTIN_RULES)]
    return {"apiGroups": [group], "apiVersions": ["v1"], "resources": [plural], "operations": list(operations)}


def _shape(index: int, plural: str) -> dict[str, Any]:
    """One of four common kinds of policy; the index goes into the CEL so no two are the same."""
    shape = index % 4
    if shape == 0:    # a required label, with a message naming the object
        return {"validations": [{
            "expression": f"object.metadata.?labels[?'owner-{index}'].orValue('') != ''",
            "messageExpression": f"'{plural} ' + object.metadata.name + ' needs label owner-{index}'",
            "reason": "Invalid"}]}
    if shape == 1:    # a variable shared by two checks
        return {"variables": [{"name": "annotations", "expression": "object.metadata.?annotations.orValue({})"}],
                "validations": [
                    {"expression": f"!('deprecated.bench/{index}' in variables.annotations)",
                     "message": f"annotation deprecated.bench/{index} is no longer allowed"},
                    {"expression": f"size(variables.annotations) <= {16 + index % 48}",
                     "message": "too many annotations"}]}
    if shape == 2:    # a naming convention, warn only
        return {"enforcement": "Warn", "validations": [{
            "expression": f"object.metadata.name.matches('^[a-z][a-z0-9-]{{0,{20 + index % 40}}}$')",
            "message": "names should be short, lowercase and start with a letter"}]}
    return {"failurePolicy": "Ignore", "mutations": [{     # a default label, set only if absent
        "name": "default-tier", "mergeMode": "IfAbsent",
        "merge": {"metadata": {"labels": {f"tier.bench/{index}": "standard"}}}}]}


def generated(count: int) -> list[dict[str, Any]]:
    """``count`` policies, none of which a request the bench sends matches."""
    bodies = []
    for index in range(count):
        rule = _rule(index)
        spec: dict[str, Any] = {"description": f"generated policy {index} (bench)", "match": {"resources": [rule]}}
        spec.update(_shape(index, rule["resources"][0]))
        bodies.append({"apiVersion": "policy-operator.dev/v1alpha1", "kind": "AdmissionPolicy",
                       "metadata": {"name": f"bench-generated-{index:04d}"}, "spec": spec})
    return bodies


def tenants(count: int, namespaces: int) -> list[dict[str, Any]]:
    """``count`` NamespacedAdmissionPolicies judging Pod CREATEs, spread over ``namespaces`` tenant
    namespaces none of the bench's requests is in: each request must meet none of them."""
    bodies = []
    for index in range(count):
        namespace = tenant_namespace(index % namespaces)
        bodies.append({"apiVersion": "policy-operator.dev/v1alpha1", "kind": "NamespacedAdmissionPolicy",
                       "metadata": {"name": f"bench-tenant-{index:04d}", "namespace": namespace},
                       "spec": {"description": f"tenant policy {index} (bench)",
                                "match": {"resources": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                         "resources": ["pods"], "operations": ["CREATE"]}]},
                                "validations": [{"expression": "object.metadata.name != 'forbidden'",
                                                 "message": "not that name"}]}})
    return bodies


def tenant_namespace(index: int) -> str:
    return f"bench-tenant-{index:03d}"
