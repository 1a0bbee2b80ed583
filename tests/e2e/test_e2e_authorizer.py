"""A policy's ``authorizer`` checks, decided by the real API server's RBAC.

The operator answers ``authorizer.….check(verb)`` with one SubjectAccessReview per distinct
check of a request (``operator/authorizer.py``). Here two impersonated users may both create
pods in a namespace, only one may delete them; a policy lets a user create a pod only where
they may also delete it. A RoleBinding granted during the test changes the answer at once:
nothing is cached beyond the request.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from e2e_kube import Answer, Cluster, Policies, assert_denied, eventually, policy_body, unique

pytestmark = pytest.mark.e2e

LABEL = "e2e-authorizer"
DELETE_HERE = "authorizer.group('').resource('pods').namespace(object.metadata.namespace).check('delete')"


def rbac(namespace: str, creator: str, deleter: str) -> list[dict[str, Any]]:
    """Both users may create pods in ``namespace`` (so their requests reach admission); only
    ``deleter`` may delete them."""
    def role(name: str, verbs: list[str]) -> dict[str, Any]:
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": name, "namespace": namespace},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": verbs}]}
    return [role("pod-creator", ["create"]), role("pod-deleter", ["delete"]),
            binding(namespace, "pod-creator", [creator, deleter]), binding(namespace, "pod-deleter", [deleter])]


def binding(namespace: str, role: str, users: list[str]) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": f"{role}-{len(users)}", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": u} for u in users]}


def create_pod_as(cluster: Cluster, user: str, namespace: str, name: str) -> Answer:
    """A dry-run pod CREATE sent as ``user`` (the admin impersonates it): nothing is stored."""
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace,
                                                            "labels": {LABEL: "true"}},
            "spec": {"containers": [{"name": "c", "image": cluster.settings.pod_image}]}}
    response = cluster.api.request("POST", version="v1", namespace=namespace, url="pods", data=json.dumps(body),
                                   params={"dryRun": "All"},
                                   headers={"Content-Type": "application/json", "Impersonate-User": user})
    try:
        payload: Any = response.json()
    except ValueError:
        payload = response.text
    return Answer("POST", response.url, response.status_code, payload, [])


def test_authorizer_checks_decide_by_rbac(cluster: Cluster, policies: Policies,
                                          namespace: Callable[..., str]) -> None:
    ns = namespace()
    creator, deleter = unique("e2e-creator"), unique("e2e-deleter")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac(ns, creator, deleter)))
    name = unique("e2e-authorizer")
    policies.apply(policy_body(
        name,
        match={"resources": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                              "operations": ["CREATE"]}],
               "objectSelector": {"matchLabels": {LABEL: "true"}}},
        failurePolicy="Fail",
        validations=[
            {"expression": f"{DELETE_HERE}.allowed()",
             "message": "only users who may delete pods here may create them"},
            # The request's own resource: pods in this namespace, by this name; both users may create.
            {"expression": "authorizer.requestResource.check('create').allowed()", "message": "may not create"},
            {"expression": f"!{DELETE_HERE}.errored()", "message": "the authorizer failed"},
        ]))

    denied = eventually(lambda: create_pod_as(cluster, creator, ns, "by-creator"), lambda a: not a.ok,
                        "the creator's pod to be refused", cluster.settings.timeout)
    assert_denied(denied, name, "only users who may delete pods here may create them", code=403)
    assert "may not create" not in denied.message and "the authorizer failed" not in denied.message

    allowed = create_pod_as(cluster, deleter, ns, "by-deleter")
    assert allowed.ok, str(allowed)

    # RBAC decides, at once: the creator may delete pods now, and so create them.
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(binding(ns, "pod-deleter", [deleter, creator])))
    now_allowed = eventually(lambda: create_pod_as(cluster, creator, ns, "by-creator"), lambda a: a.ok,
                             "the creator's pod to be admitted once it may delete pods", cluster.settings.timeout)
    assert now_allowed.obj["metadata"]["name"] == "by-creator"
