"""The objects tests build, in one place for every tier: AdmissionPolicy manifests, Pods and
Deployments, AdmissionReview requests, and the engine's decision on them.

Each builder gives what a test does not care about a plain default (a policy ``p`` on Pods'
CREATE and UPDATE, a Pod ``web`` in ``default`` running nginx, a CREATE by ``alice``), so that a
test names only what it is about; a keyword argument changes any of it. Tests import them as
``from builders import ...`` (tests/conftest.py says why that works in every tier).
"""
from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from admission_policy import api, features, plugins
from admission_policy.cli.requests import build_review
from admission_policy.engine import (
    AdmissionRequest,
    CompiledPolicy,
    Decision,
    Phase,
    PolicySet,
    compile_policy,
    evaluate,
    parse_review,
)

ALICE: Mapping[str, Any] = {"username": "alice", "groups": ["devs"]}
# As the API server sends a user: in the group every authenticated user is in.
AUTHENTICATED_ALICE: Mapping[str, Any] = {"username": "alice", "groups": ["system:authenticated"]}


def rule(*resources: str, group: str = "", version: str = "v1",
         operations: Sequence[str] = ("CREATE", "UPDATE")) -> dict[str, Any]:
    """One entry of ``spec.match.resources``."""
    return {"apiGroups": [group], "apiVersions": [version], "resources": list(resources),
            "operations": list(operations)}


POD_RULE = rule("pods")
CREATE_POD_RULE = rule("pods", operations=["CREATE"])


def policy_body(name: str = "p", *, rules: Sequence[Mapping[str, Any]] | None = None,
                metadata: Mapping[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    """An AdmissionPolicy manifest matching ``rules`` (``POD_RULE`` by default).

    A ``match`` in ``spec`` is merged over ``{"resources": rules}``, so it may add selectors or
    conditions only, or replace the resources too; ``metadata`` adds labels, a generation...
    """
    match = spec.pop("match", {})
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name, **(metadata or {})},
            "spec": {"match": {"resources": list(rules or [POD_RULE]), **match}, **spec}}


def policy(name: str = "p", *, rules: Sequence[Mapping[str, Any]] | None = None,
           registry: plugins.Registry | None = None, gates: str = "", **spec: Any) -> CompiledPolicy:
    """``policy_body`` compiled; with a ``registry``, with its plugins and the feature ``gates`` given."""
    parsed = api.parse_policy(policy_body(name, rules=rules, **spec))
    if registry is None:
        return compile_policy(parsed)
    return compile_policy(parsed, registry=registry, gates=features.parse(gates, registry))


def container(name: str = "c", image: str = "nginx", *, privileged: bool = False, **fields: Any) -> dict[str, Any]:
    found: dict[str, Any] = {"name": name, "image": image, **fields}
    if privileged:
        found["securityContext"] = {"privileged": True}
    return found


def pod(name: str = "web", *, namespace: str = "default", labels: Mapping[str, str] | None = None,
        metadata: Mapping[str, Any] | None = None, images: Sequence[str] = ("nginx",),
        **spec: Any) -> dict[str, Any]:
    """A Pod with a container per image (named ``c``, ``c1``, ``c2``...), or the ``spec`` given.

    ``labels`` are left out unless given, as a Pod created without any has none."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, **(metadata or {})}
    if labels is not None:
        meta["labels"] = dict(labels)
    containers = [container(f"c{i}" if i else "c", image) for i, image in enumerate(images)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec or {"containers": containers}}


def deployment(name: str = "web", *, namespace: str = "default", replicas: int = 1, image: str = "nginx",
               privileged: bool = False, resources: Mapping[str, Any] | None = None,
               labels: Mapping[str, str] | None = None, paused: bool = False) -> dict[str, Any]:
    """A Deployment of one container ``app``, its Pods labelled ``labels`` (``app: <name>``).

    ``paused``: the controller starts no ReplicaSet, so on a real cluster no Pod is created."""
    app = container("app", image, privileged=privileged)
    if resources:
        app["resources"] = dict(resources)
    spec: dict[str, Any] = {"replicas": replicas, **({"paused": True} if paused else {}),
                            "selector": {"matchLabels": {"app": name}},
                            "template": {"metadata": {"labels": dict(labels or {"app": name})},
                                         "spec": {"containers": [app]}}}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
            "spec": spec}


def configmap(name: str, *, namespace: str | None = "default", labels: Mapping[str, str] | None = None,
              data: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A ConfigMap; ``namespace`` None leaves it out (a manifest to be applied anywhere), and
    ``labels`` and ``data`` are left out unless given."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    if labels is not None:
        metadata["labels"] = dict(labels)
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata}
    if data is not None:
        body["data"] = dict(data)
    return body


def namespace_object(labels: Mapping[str, str], name: str = "default") -> dict[str, Any]:
    """The Namespace a namespaced request is in, as a namespaceSelector reads it."""
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels)}}


def admission_request(obj: Any = None, *, operation: str = "CREATE", old: Any = None, resource: str = "pods",
                      group: str = "", version: str = "v1", kind: str | None = None, name: str | None = None,
                      namespace: str | None = "default", sub_resource: str = "",
                      uid: str = "0000-1111", user_info: Mapping[str, Any] = ALICE, **fields: Any) -> dict[str, Any]:
    """The ``request`` of an AdmissionReview, as the API server sends it.

    ``kind``, ``name``, ``subResource`` and ``namespace`` (None) are left out unless given, as the
    API server leaves out empty fields; any other (``options``, ``dryRun``...) comes from ``fields``."""
    request: dict[str, Any] = {"uid": uid}
    if kind is not None:
        request["kind"] = {"group": group, "version": version, "kind": kind}
    request["resource"] = {"group": group, "version": version, "resource": resource}
    if sub_resource:
        request["subResource"] = sub_resource
    if name is not None:
        request["name"] = name
    if namespace is not None:
        request["namespace"] = namespace
    request |= {"operation": operation, "userInfo": copy.deepcopy(dict(user_info)), "object": obj, "oldObject": old,
                **fields}
    return request


def review(obj: Any = None, **request: Any) -> dict[str, Any]:
    """An AdmissionReview (v1) of ``admission_request(obj, **request)``."""
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": admission_request(obj, **request)}


def request(obj: Any = None, **fields: Any) -> AdmissionRequest:
    """``review(obj, **fields)`` as the engine reads it."""
    return parse_review(review(obj, **fields))


def object_request(obj: Mapping[str, Any] | None, *, operation: str = "CREATE",
                   old: Mapping[str, Any] | None = None) -> AdmissionRequest:
    """The request for any object as ``admission-policy test`` builds it, its resource, version and
    namespace read from the object (cli/requests.py): for tests about kinds other than Pods."""
    return parse_review(build_review(operation=operation, obj=obj, old=old))


def decide(policies: CompiledPolicy | Iterable[CompiledPolicy], subject: AdmissionRequest | Mapping[str, Any],
           namespace: Mapping[str, Any] | None = None, phase: Phase = Phase.ALL, **options: Any) -> Decision:
    """The engine's decision on ``subject``: a request, or an object whose CREATE it is (``object_request``).

    ``options`` as ``evaluate`` takes them (``inputs``, ``deadline``...)."""
    compiled = [policies] if isinstance(policies, CompiledPolicy) else list(policies)
    req = subject if isinstance(subject, AdmissionRequest) else object_request(subject)
    return evaluate(PolicySet(compiled), req, namespace, phase, **options)
