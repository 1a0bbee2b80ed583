"""Realistic AdmissionReview requests, shaped like what kube-apiserver 1.30 sends to a webhook.

Objects are as the webhook sees them: defaulted, with what the built-in admission plugins add
(ServiceAccount token volume, default tolerations), ``managedFields``, and for validating
webhooks the ``uid``/``creationTimestamp`` the registry fills before validation. ``userInfo``
carries groups and ``extra`` like a kubeadm/kind cluster's admin certificate or a kubelet.

A request is serialised once; the load generator only splices a fresh ``request.uid`` into
the bytes (``UID_MARK``), as the API server sends a new uid per call.
"""
from __future__ import annotations

import copy
import json
from typing import Any, Final

UID_MARK: Final = "@@REQUEST-UID@@"

ADMIN = {
    "username": "kubernetes-admin",
    "groups": ["kubeadm:cluster-admins", "system:authenticated"],
    "extra": {"authentication.kubernetes.io/credential-id": [
        "X509SHA256=4f0a1c2e9b7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f"]},
}
KUBELET = {
    "username": "system:node:worker-1",
    "groups": ["system:nodes", "system:authenticated"],
    "extra": {"authentication.kubernetes.io/credential-id": [
        "X509SHA256=9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d"]},
}
CREATED = "2025-05-06T09:14:27Z"


def review(request: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request}


def encode(body: dict[str, Any]) -> bytes:
    """Compact JSON, as the API server writes it."""
    return json.dumps(body, separators=(",", ":")).encode()


def _request(*, group: str, version: str, kind: str, resource: str, name: str, namespace: str | None,
             operation: str, obj: Any, old: Any, user: dict[str, Any], options: dict[str, Any],
             sub_resource: str | None = None) -> dict[str, Any]:
    gvk = {"group": group, "version": version, "kind": kind}
    gvr = {"group": group, "version": version, "resource": resource}
    request: dict[str, Any] = {
        "uid": UID_MARK, "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
        "name": name, "operation": operation, "userInfo": copy.deepcopy(user),
        "object": obj, "oldObject": old, "dryRun": False, "options": options,
    }
    if sub_resource:
        request["subResource"] = sub_resource
        request["requestSubResource"] = sub_resource
    if namespace:
        request["namespace"] = namespace
    return request


# --- Pods: `kubectl run` -----------------------------------------------------------------------

def _token_volume() -> dict[str, Any]:
    """The projected service-account token volume the ServiceAccount admission plugin adds."""
    return {"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
            "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
    ]}}


def _container(name: str, image: str, security: dict[str, Any] | None) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": name, "image": image, "resources": {},
        "volumeMounts": [{"name": "kube-api-access-x7k2p", "readOnly": True,
                          "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
        "imagePullPolicy": "Always",
    }
    if security is not None:
        container["securityContext"] = security
    return container


def _pod_managed_fields(restricted: bool) -> list[dict[str, Any]]:
    container: dict[str, Any] = {".": {}, "f:image": {}, "f:imagePullPolicy": {}, "f:name": {},
                                 "f:resources": {}, "f:terminationMessagePath": {},
                                 "f:terminationMessagePolicy": {}}
    spec: dict[str, Any] = {"f:containers": {'k:{"name":"nginx"}': container}, "f:dnsPolicy": {},
                            "f:enableServiceLinks": {}, "f:restartPolicy": {}, "f:schedulerName": {},
                            "f:securityContext": {}, "f:terminationGracePeriodSeconds": {}}
    if restricted:
        container["f:securityContext"] = {".": {}, "f:allowPrivilegeEscalation": {},
                                          "f:capabilities": {".": {}, "f:drop": {}}}
        spec["f:securityContext"] = {".": {}, "f:runAsNonRoot": {}, "f:runAsUser": {},
                                     "f:seccompProfile": {".": {}, "f:type": {}}}
    return [{"manager": "kubectl-run", "operation": "Update", "apiVersion": "v1", "time": CREATED,
             "fieldsType": "FieldsV1",
             "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:run": {}}}, "f:spec": spec}}]


def pod(*, name: str = "nginx", namespace: str = "default", image: str = "nginxinc/nginx-unprivileged:1.27",
        restricted: bool = True, annotations: dict[str, str] | None = None, validating: bool = True) -> dict[str, Any]:
    """A Pod from ``kubectl run NAME --image=IMAGE`` after defaulting and the built-in plugins.

    ``restricted`` adds the securityContext (``--overrides``) that passes Pod Security
    "restricted"; ``validating`` adds what the registry fills before validating webhooks run.
    """
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": {"run": name},
                                "managedFields": _pod_managed_fields(restricted)}
    if annotations:
        metadata["annotations"] = dict(annotations)
    if validating:
        metadata["uid"] = "5b1f0a8e-2c3d-4e5f-8a9b-0c1d2e3f4a5b"
        metadata["creationTimestamp"] = CREATED
    else:
        metadata["creationTimestamp"] = None
    container_security = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}} if restricted else None
    pod_security = ({"runAsNonRoot": True, "runAsUser": 101, "seccompProfile": {"type": "RuntimeDefault"}}
                    if restricted else {})
    return {
        "kind": "Pod", "apiVersion": "v1", "metadata": metadata,
        "spec": {
            "volumes": [_token_volume()],
            "containers": [_container(name, image, container_security)],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "serviceAccount": "default", "securityContext": pod_security,
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300},
            ],
            "priority": 0, "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {"phase": "Pending", "qosClass": "BestEffort"},
    }


def pod_create(**pod_args: Any) -> dict[str, Any]:
    body = pod(**pod_args)
    meta = body["metadata"]
    return review(_request(group="", version="v1", kind="Pod", resource="pods", name=meta["name"],
                           namespace=meta["namespace"], operation="CREATE", obj=body, old=None, user=ADMIN,
                           options={"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1",
                                    "fieldManager": "kubectl-run"}))


def pss_pod_create() -> dict[str, Any]:
    """Matches both Pod Security policies and passes them: every check runs, none denies."""
    return pod_create()


def pss_deployment_create() -> dict[str, Any]:
    """A Deployment CREATE whose Pod template is ``pss_pod_create``'s Pod (its labels and spec):
    both Pod Security policies judge the template (issue 17) and pass it, every check runs."""
    pod_body = pod()
    labels = pod_body["metadata"]["labels"]
    body = {"kind": "Deployment", "apiVersion": "apps/v1",
            "metadata": {"name": "nginx", "namespace": "default", "labels": labels,
                         "uid": "7d2e9c4a-1b3f-4a5e-9c8d-2e3f4a5b6c7d", "creationTimestamp": CREATED,
                         "generation": 1},
            "spec": {"replicas": 3, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": pod_body["spec"]}}}
    return review(_request(group="apps", version="v1", kind="Deployment", resource="deployments", name="nginx",
                           namespace="default", operation="CREATE", obj=body, old=None, user=ADMIN,
                           options={"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1",
                                    "fieldManager": "kubectl-client-side-apply"}))


def wide_pod_create(containers: int = 5_000, uid: str = "wide-pod") -> dict[str, Any]:
    """Issue 18's attack: a Pod CREATE with ``containers`` minimal containers ``{"name": "cN",
    "image": "i"}`` (5,000: 141 kB, well under the API server's limit), from any user who may
    create Pods."""
    body = pss_pod_create()
    body["request"]["uid"] = uid
    body["request"]["object"]["spec"]["containers"] = [{"name": f"c{i}", "image": "i"} for i in range(containers)]
    return body


def sidecar_pod_create() -> dict[str, Any]:
    """For the mutating webhook: asks for the sidecar and sets no resources (both policies act)."""
    return pod_create(name="orders", image="registry.acme.com/shop/orders:2.3", restricted=False,
                      annotations={"acme.com/inject": "true"}, validating=False)


# --- Deployments: `kubectl set image` -----------------------------------------------------------

def _deployment(image: str, generation: int, revision: int) -> dict[str, Any]:
    labels = {"app": "web", "app.kubernetes.io/part-of": "shop"}
    template_spec = {
        "containers": [{
            "name": "web", "image": image, "ports": [{"containerPort": 8080, "protocol": "TCP"}],
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
            "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"},
                               "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1,
                               "failureThreshold": 3},
            "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
            "imagePullPolicy": "IfNotPresent",
            # Pod Security restricted: the PSS policies judge Deployment templates too (issue 17).
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        }],
        "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
        "securityContext": {"runAsNonRoot": True, "runAsUser": 101, "seccompProfile": {"type": "RuntimeDefault"}},
        "schedulerName": "default-scheduler",
    }
    applied = {"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"annotations": {}, "labels": labels, "name": "web", "namespace": "default"},
               "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                        "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                            {"name": "web", "image": "nginx:1.27.0", "ports": [{"containerPort": 8080}]}]}}}}
    return {
        "kind": "Deployment", "apiVersion": "apps/v1",
        "metadata": {
            "name": "web", "namespace": "default", "uid": "0e6f2a1b-7c8d-4e9f-a0b1-c2d3e4f5a6b7",
            "resourceVersion": "184467", "generation": generation, "creationTimestamp": CREATED,
            "labels": labels,
            "annotations": {"deployment.kubernetes.io/revision": str(revision),
                            "kubectl.kubernetes.io/last-applied-configuration": json.dumps(applied) + "\n"},
            "managedFields": [
                {"manager": "kubectl-client-side-apply", "operation": "Update", "apiVersion": "apps/v1",
                 "time": CREATED, "fieldsType": "FieldsV1", "fieldsV1": {
                     "f:metadata": {"f:annotations": {".": {},
                                                      "f:kubectl.kubernetes.io/last-applied-configuration": {}},
                                    "f:labels": {".": {}, "f:app": {}, "f:app.kubernetes.io/part-of": {}}},
                     "f:spec": {"f:progressDeadlineSeconds": {}, "f:replicas": {}, "f:revisionHistoryLimit": {},
                                "f:selector": {}, "f:strategy": {"f:rollingUpdate": {".": {}, "f:maxSurge": {},
                                                                                      "f:maxUnavailable": {}},
                                                                   "f:type": {}}}}},
                {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "apps/v1",
                 "time": "2025-05-06T09:15:02Z", "fieldsType": "FieldsV1", "subresource": "status",
                 "fieldsV1": {"f:metadata": {"f:annotations": {"f:deployment.kubernetes.io/revision": {}}},
                              "f:status": {"f:availableReplicas": {}, "f:conditions": {}, "f:observedGeneration": {},
                                           "f:readyReplicas": {}, "f:replicas": {}, "f:updatedReplicas": {}}}},
                {"manager": "kubectl-set", "operation": "Update", "apiVersion": "apps/v1",
                 "time": "2025-05-07T11:02:41Z", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:containers": {
                     'k:{"name":"web"}': {"f:image": {}}}}}}}},
            ],
        },
        "spec": {
            "replicas": 3, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"creationTimestamp": None, "labels": labels}, "spec": template_spec},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}},
            "revisionHistoryLimit": 10, "progressDeadlineSeconds": 600,
        },
        "status": {
            "observedGeneration": 3, "replicas": 3, "updatedReplicas": 3, "readyReplicas": 3,
            "availableReplicas": 3,
            "conditions": [
                {"type": "Available", "status": "True", "lastUpdateTime": "2025-05-06T09:15:02Z",
                 "lastTransitionTime": "2025-05-06T09:15:02Z", "reason": "MinimumReplicasAvailable",
                 "message": "Deployment has minimum availability."},
                {"type": "Progressing", "status": "True", "lastUpdateTime": "2025-05-06T09:15:02Z",
                 "lastTransitionTime": CREATED, "reason": "NewReplicaSetAvailable",
                 "message": 'ReplicaSet "web-7d9c5b6f4d" has successfully progressed.'},
            ],
        },
    }


def deployment_update() -> dict[str, Any]:
    old = _deployment("nginx:1.27.0", generation=3, revision=3)
    new = _deployment("nginx:1.27.1", generation=4, revision=3)
    return review(_request(group="apps", version="v1", kind="Deployment", resource="deployments", name="web",
                           namespace="default", operation="UPDATE", obj=new, old=old, user=ADMIN,
                           options={"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1",
                                    "fieldManager": "kubectl-set"}))


# --- Nodes: the kubelet's status heartbeat -------------------------------------------------------

_IMAGES = [
    ("registry.k8s.io/etcd@sha256:44a8e24dcbba3470ee1fee21d5e88d128c936e9b55d4bc51fbef8086f8ed123b",
     "registry.k8s.io/etcd:3.5.12-0", 57236178),
    ("docker.io/library/nginx@sha256:0f04e4f646a3f14bf31d8bc8d885b6c951fdcf42589d06845f64d18aec6a3c4d",
     "docker.io/library/nginx:1.27.0", 71026653),
    ("registry.k8s.io/kube-apiserver@sha256:6b8e197b2d39c321189a475ac755a77896e34b56729425590fbc99f3a96468a3",
     "registry.k8s.io/kube-apiserver:v1.30.0", 32663599),
    ("registry.k8s.io/kube-controller-manager@sha256:5f52f00f17d5784b5ca004dffca59710fa1a9eec8d54cebdf9433a1d134150fe",
     "registry.k8s.io/kube-controller-manager:v1.30.0", 31030110),
    ("registry.k8s.io/kube-proxy@sha256:ec532ff47eaf39822387e51ec73f1f2502eb74658c6303319db88d2c380d0210",
     "registry.k8s.io/kube-proxy:v1.30.0", 29020473),
    ("registry.k8s.io/kube-scheduler@sha256:2353c3a1803229970fcb571cffc9b2f120372350e01c7381b4b650c4a02b9d67",
     "registry.k8s.io/kube-scheduler:v1.30.0", 19208660),
    ("registry.k8s.io/coredns/coredns@sha256:1eeb4c7316bacb1d4c8ead65571cd92dd21e27359f0d4917f1a5822a73b75db1",
     "registry.k8s.io/coredns/coredns:v1.11.1", 18182961),
    ("docker.io/kindest/kindnetd@sha256:61f9956af8019caf6dcc4d39b31857b868aaab80521432ddcc216b805c4f7988",
     "docker.io/kindest/kindnetd:v20240202-8f1494ea", 27755257),
    ("docker.io/kindest/local-path-provisioner@sha256:e1cd5f3e8c2aa9b6f5d0a7c4a0d0d4f1c3b2a1f0e9d8c7b6a5f4e3d2c1b0a9f8",
     "docker.io/kindest/local-path-provisioner:v20240202-8f1494ea", 17583419),
    ("registry.k8s.io/pause@sha256:7031c1b283388d2c2e09b57badb803c05ebed362dc88d84b480cc47f72a21097",
     "registry.k8s.io/pause:3.9", 321520),
    ("quay.io/prometheus/node-exporter@sha256:4cb2b9019f1757be8482419002cb7afe028fdba35d47958829e4cfeaf6246d80",
     "quay.io/prometheus/node-exporter:v1.8.1", 11930426),
    ("docker.io/grafana/promtail@sha256:0f9f1d4b0f9c6a4a9cbf5b5c6a8b3b5b2d8f8a7c1c9a0e5a3b4c2d1e0f9a8b7c",
     "docker.io/grafana/promtail:3.0.0", 85341239),
]


def _node(heartbeat: str) -> dict[str, Any]:
    conditions = [
        (kind, "False", reason, message) for kind, reason, message in (
            ("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"))
    ] + [("Ready", "True", "KubeletReady", "kubelet is posting ready status")]
    resources = {"cpu": "8", "ephemeral-storage": "102625208Ki", "hugepages-1Gi": "0", "hugepages-2Mi": "0",
                 "memory": "32863084Ki", "pods": "110"}
    return {
        "kind": "Node", "apiVersion": "v1",
        "metadata": {
            "name": "worker-1", "uid": "7a9b8c7d-6e5f-4a3b-9c2d-1e0f9a8b7c6d", "resourceVersion": "184502",
            "creationTimestamp": "2025-05-01T07:00:12Z",
            "labels": {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": "worker-1",
                       "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "m6i.2xlarge",
                       "topology.kubernetes.io/region": "eu-west-1", "topology.kubernetes.io/zone": "eu-west-1a"},
            "annotations": {"kubeadm.alpha.kubernetes.io/cri-socket": "unix:///run/containerd/containerd.sock",
                            "node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
            "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                               "time": heartbeat, "fieldsType": "FieldsV1", "subresource": "status",
                               "fieldsV1": {"f:status": {"f:conditions": {
                                   f'k:{{"type":"{c[0]}"}}': {"f:lastHeartbeatTime": {}} for c in conditions},
                                   "f:images": {}, "f:nodeInfo": {"f:bootID": {}}}}}],
        },
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"],
                 "providerID": "aws:///eu-west-1a/i-0123456789abcdef0"},
        "status": {
            "capacity": resources, "allocatable": {**resources, "cpu": "7910m", "memory": "31711084Ki"},
            "conditions": [{"type": kind, "status": status, "lastHeartbeatTime": heartbeat,
                            "lastTransitionTime": "2025-05-01T07:00:40Z", "reason": reason, "message": message}
                           for kind, status, reason, message in conditions],
            "addresses": [{"type": "InternalIP", "address": "10.0.12.34"},
                          {"type": "Hostname", "address": "worker-1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": "3c1d9a5e0f2b4c6d8e0f1a2b3c4d5e6f",
                         "systemUUID": "ec2a1b2c-3d4e-5f60-7182-93a4b5c6d7e8",
                         "bootID": "1f2e3d4c-5b6a-7980-a1b2-c3d4e5f6a7b8",
                         "kernelVersion": "6.1.90-99.173.amzn2023.x86_64",
                         "osImage": "Amazon Linux 2023", "containerRuntimeVersion": "containerd://1.7.16",
                         "kubeletVersion": "v1.30.0", "kubeProxyVersion": "v1.30.0",
                         "operatingSystem": "linux", "architecture": "amd64"},
            "images": [{"names": [digest, tag], "sizeBytes": size} for digest, tag, size in _IMAGES],
        },
    }


def node_status_update() -> dict[str, Any]:
    old = _node("2025-05-07T11:02:31Z")
    new = _node("2025-05-07T11:02:41Z")
    return review(_request(group="", version="v1", kind="Node", resource="nodes", name="worker-1", namespace=None,
                           operation="UPDATE", obj=new, old=old, user=KUBELET, sub_resource="status",
                           options={"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"}))


# The requests the load generator can send, by name: (builder, webhook path).
REQUESTS: Final = {
    "pss-pod-create": (pss_pod_create, "/validate"),
    "sidecar-pod-create": (sidecar_pod_create, "/mutate"),
    "deployment-update": (deployment_update, "/validate"),
    "node-status-update": (node_status_update, "/validate"),
}


def template(name: str) -> bytes:
    """The serialised review for ``name``, with ``UID_MARK`` where the request uid goes."""
    build, _ = REQUESTS[name]
    return encode(build())
