"""Building AdmissionReview requests from plain objects, as the API server would send them."""
from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any, Final

# Kinds whose plural is not simply lower-case + "s"; anything else gets the regular plural.
_RESOURCES: Final[Mapping[str, str]] = {
    "Endpoints": "endpoints", "Ingress": "ingresses", "IngressClass": "ingressclasses",
    "NetworkPolicy": "networkpolicies", "PodSecurityPolicy": "podsecuritypolicies",
    "PriorityClass": "priorityclasses", "StorageClass": "storageclasses",
    "AdmissionPolicy": "admissionpolicies", "ResourceQuota": "resourcequotas",
}
_CLUSTER_KINDS: Final = frozenset({
    "Node", "Namespace", "PersistentVolume", "ClusterRole", "ClusterRoleBinding", "StorageClass",
    "CustomResourceDefinition", "PriorityClass", "IngressClass", "AdmissionPolicy",
    "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration",
})
_OPTIONS: Final = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}
# Workload versions Kubernetes has since removed, with the Pod template where v1 has it. The
# operator registers its webhooks with matchPolicy Equivalent, so a cluster that served one of
# these converted the request to v1 before sending it; offline, an old manifest (Kyverno's test
# cases have batch/v1beta1 CronJobs) is judged as that request, not left matching no rule.
_EQUIVALENT: Final[Mapping[tuple[str, str, str], str]] = {
    **{("batch", version, "CronJob"): "v1" for version in ("v1beta1", "v2alpha1")},
    **{("apps", version, kind): "v1" for version in ("v1beta1", "v1beta2")
       for kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet")},
}
_uids = itertools.count(1)


def resource_of(body: Mapping[str, Any]) -> dict[str, str]:
    """The group/version/resource for an object's apiVersion and kind."""
    group, _, version = str(body.get("apiVersion", "v1")).rpartition("/")
    kind = str(body.get("kind", ""))
    if kind in _RESOURCES:
        plural = _RESOURCES[kind]
    elif kind.endswith("y") and not kind.endswith(("ay", "ey", "oy", "uy")):
        plural = kind[:-1].lower() + "ies"
    elif kind.endswith(("s", "x", "ch", "sh")):
        plural = kind.lower() + "es"
    else:
        plural = kind.lower() + "s"
    return {"group": group, "version": version, "resource": plural}


def is_namespaced(kind: str) -> bool:
    """Offline, without discovery: the built-in cluster-scoped kinds are known, the rest are namespaced."""
    return kind not in _CLUSTER_KINDS


def build_review(
    *,
    operation: str,
    obj: Mapping[str, Any] | None,
    old: Mapping[str, Any] | None = None,
    sub_resource: str = "",
    resource: Mapping[str, str] | None = None,
    user_info: Mapping[str, Any] | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    body = obj if obj is not None else old
    if body is None:
        raise ValueError(f"{operation} needs an object (or oldObject)")
    metadata = body.get("metadata") or {}
    sent = dict(resource) if resource else resource_of(body)
    group, _, version = str(body.get("apiVersion", "v1")).rpartition("/")
    kind = str(body.get("kind", ""))
    converted = _EQUIVALENT.get((group, version, kind), version) if not resource else version
    namespace = "" if kind in _CLUSTER_KINDS else metadata.get("namespace", "default")
    request: dict[str, Any] = {
        "uid": f"cli-{next(_uids):06d}",
        "kind": {"group": group, "version": converted, "kind": kind},
        "resource": {**sent, "version": converted},
        "requestKind": {"group": group, "version": version, "kind": kind},
        "requestResource": sent,
        "name": metadata.get("name", ""),
        "namespace": namespace,
        "operation": operation,
        "userInfo": dict(user_info or {"username": "admission-policy-cli", "groups": ["system:authenticated"]}),
        "object": obj,
        "oldObject": old,
        "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": _OPTIONS[operation]} if operation in _OPTIONS else None,
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def namespace_object(name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    merged = {"kubernetes.io/metadata.name": name, **labels}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": merged}}
