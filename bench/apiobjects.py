"""What the end-to-end bench sends to the API server, and the objects it needs stored first.

The request mix is one fixed cycle of 20, so every scenario and level sends the same shares:
dry-run creates of a Pod that passes Pod Security "restricted" (bench/reviews.py's Pod, as a
user would send it: no server-set fields) and of a Deployment with that Pod as its template,
``kubectl set image`` on a stored Deployment (a dry-run strategic-merge PATCH: the template
changes, so every check runs again), a dry-run DELETE, and one Pod in twenty that breaks
"restricted" (no securityContext): the policies must deny it. Dry-run everywhere: admission
runs in full, nothing is stored, so the cluster is the same after a million requests.
"""
from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any, Final

import reviews

NAMESPACE: Final = "bench"
STORED_DEPLOYMENT: Final = "web"      # what the PATCHes update
STORED_CONFIGMAP: Final = "victim"    # what the DELETEs delete (dry-run: it stays)
IMAGE: Final = "nginxinc/nginx-unprivileged:1.27"
DRY_RUN: Final = "?dryRun=All"


@dataclasses.dataclass(frozen=True)
class Call:
    """One request of the mix: ``noncompliant`` calls must be denied whenever PSS is enforced."""
    kind: str
    method: str
    path: str
    body: bytes | None
    content_type: str = "application/json"
    noncompliant: bool = False


def pod(name: str, *, compliant: bool = True) -> dict[str, Any]:
    """``reviews.pod()`` as the client sends it: the API server sets uid, timestamps, status,
    managedFields and the token volume itself."""
    body = reviews.pod(name=name, namespace=NAMESPACE, image=IMAGE, restricted=compliant, validating=False)
    metadata = {"name": name, "namespace": NAMESPACE, "labels": body["metadata"]["labels"]}
    spec = {key: value for key, value in body["spec"].items()
            if key not in ("volumes", "serviceAccount", "priority", "preemptionPolicy")}
    for container in spec["containers"]:
        container.pop("volumeMounts", None)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def deployment(name: str, *, replicas: int = 3) -> dict[str, Any]:
    """A Deployment whose Pod template is the compliant Pod: the Pod Security policies judge it too."""
    template = pod(name)
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": copy.deepcopy(template["spec"])}}}


def configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NAMESPACE},
            "data": {"key": "value"}}


def stored() -> list[tuple[str, dict[str, Any]]]:
    """(collection path, body) of what must exist before the load: the PATCH and DELETE targets.
    Zero replicas: no ReplicaSet Pods to admit while measuring."""
    return [(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments", deployment(STORED_DEPLOYMENT, replicas=0)),
            (f"/api/v1/namespaces/{NAMESPACE}/configmaps", configmap(STORED_CONFIGMAP))]


def _json(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def mix() -> list[Call]:
    """The cycle of 20: 9 Pod creates, 4 Deployment creates, 4 Deployment updates, 2 deletes, 1
    non-compliant Pod create."""
    pods = f"/api/v1/namespaces/{NAMESPACE}/pods{DRY_RUN}"
    deployments = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
    create_pod = Call("pod-create", "POST", pods, _json(pod("nginx")))
    create_deployment = Call("deployment-create", "POST", deployments + DRY_RUN, _json(deployment("shop")))
    set_image = {"spec": {"template": {"spec": {"containers": [{"name": STORED_DEPLOYMENT,
                                                                 "image": IMAGE + "-alpine"}]}}}}
    update = Call("deployment-update", "PATCH", f"{deployments}/{STORED_DEPLOYMENT}{DRY_RUN}", _json(set_image),
                  "application/strategic-merge-patch+json")
    delete = Call("delete", "DELETE", f"/api/v1/namespaces/{NAMESPACE}/configmaps/{STORED_CONFIGMAP}{DRY_RUN}",
                  None)
    denied = Call("noncompliant-pod-create", "POST", pods, _json(pod("rooted", compliant=False)),
                  noncompliant=True)
    cycle = [create_pod, create_deployment, update, create_pod, delete,
             create_pod, create_deployment, update, create_pod, create_pod,
             create_pod, create_deployment, update, create_pod, delete,
             create_pod, create_deployment, update, create_pod, denied]
    return cycle
