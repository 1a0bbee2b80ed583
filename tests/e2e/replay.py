"""Replaying the cases of ``examples/*/test.yaml`` as real requests through the API server: the
harness of test_e2e_examples.py, which runs one test per case.

``admission-policy test examples/`` runs these cases offline: the engine is fed AdmissionReviews
that the CLI builds itself. Here each case becomes the request a user (or a controller) would send
to a real kube-apiserver, which calls the operator's webhooks over TLS, and the case's expectations
are checked against what the API server answers:

- ``allowed``, ``code``, ``messageContains``: the HTTP status and the Status message. A denial must
  come from one of the example's policies through our webhook, so that the API server's own
  refusals (a 422 for an invalid pod update, whose message quotes the images) never pass for one.
- ``warnings``: the ``Warning:`` headers our policies produced (``Answer.policy_warnings``); the
  API server may add its own, e.g. for an unknown field it dropped.
- ``mutated``: the answer's object against the same request's before the policy existed. For a
  CREATE (a dry run of the same body) all of it, but for what the API server makes up per request
  (uid, timestamps, the token volume's suffix); for an UPDATE, which goes to a stored object that
  controllers may touch meanwhile, the fields the example's mutations write to (their paths).
- ``patched``: the returned object, cut down to the fields the expected object has, must equal it.
  The API server defaults fields (``imagePullPolicy``, ``terminationMessagePath``...), which the
  expected objects do not list; list items that its admission plugins add to every pod (the
  ServiceAccount token volume and its mounts, the two default NoExecute tolerations) are left out
  of lists, so a list's length and order still count: a sidecar injected twice fails.

How a case becomes a request (every one is a dry run: nothing changes, so a retry is harmless):

- CREATE: ``POST ?dryRun=All`` of the object, in a namespace labelled as ``namespaceLabels`` says.
- UPDATE and DELETE: the case's ``oldObject`` is created first, before the policy exists (as it was
  in the story the case tells); then a JSON Patch computed from ``oldObject`` to ``object`` is sent
  to the resource or to the case's subresource (``status``, ``scale``, ``ephemeralcontainers``), or a
  DELETE. The API server applies the patch to what it stored, so fields it defaulted stay as they
  are. A ``scale`` case stores the Deployment its Scale belongs to; an ``oldObject`` with a
  ``deletionTimestamp`` is stored with a finalizer of ours and deleted for real, so that the API
  server sets the timestamp itself; the UPDATE then removes that finalizer, as the garbage
  collector does.
- ``userInfo``: sent as ``Impersonate-User`` and ``Impersonate-Group`` headers by the admin client;
  the impersonated users get RBAC rights for what they do here (a ClusterRole per example), so that
  the request gets as far as admission. A node status update goes as the kubelet of the Node it
  updates, ``system:node:<its name>``, to a Node created through the API (no kubelet runs): Nodes
  get unique names, and where the NodeRestriction plugin is on (kind), a kubelet may write its own
  Node only. The node example's policy looks at the ``system:node:`` prefix.
- ``dryRun: true``: every replay is a dry run (``dryRun=All``), so the webhook always sees
  ``dryRun: true``; no example's policy reads ``request.dryRun``.
- Objects go to fresh namespaces, Nodes get unique names; images become a tiny one and Deployments
  are paused (as ``example_object`` does), except for ``allowed-registries`` and ``image-references``,
  whose policies judge the images themselves (admission never pulls them; with no kubelet, pods
  never run).

``Stages`` sets an example up once, on its first case: its stored objects, the baselines, then its
policies, Active; the API server may route by an older webhook configuration for a moment after
that, so one request that the policy must change is repeated until it does, per webhook. The next
example's first case tears it down.

A few cases cannot be replayed as written on a real API server; ``DEVIATIONS`` lists each with the
reason and what is asserted instead. Nothing is skipped silently.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonpatch
import jsonpointer
import pykube
import requests
import yaml
from e2e_kube import (
    EXAMPLES,
    OWNED_LABEL,
    Answer,
    Cluster,
    Policies,
    eventually,
    unique,
)
from pykube.objects import APIObject, NamespacedAPIObject
from urllib3 import HTTPHeaderDict

from admission_policy.cli.report import yaml_diff

Json = dict[str, Any]

# The policies of these examples judge container images: their objects keep theirs.
KEEP_IMAGES = frozenset({"allowed-registries", "image-references"})

# A Scale (deployments/scale) belongs to a Deployment: the one stored for the example's scale cases,
# with spec.replicas taken from the case's old Scale.
SCALE_TARGETS = {
    "prod-min-replicas": "deployment-3.yaml",
    "require-team-label-enforce": "deployment-without-team.yaml",
    "require-team-label-warn": "deployment-without-team.yaml",
}

# Keeps an oldObject with a deletionTimestamp in the store after a real DELETE (see the module docstring).
HOLD_FINALIZER = "e2e.policy-operator.dev/hold"

_RESOURCE_CLASSES: tuple[type[APIObject], ...] = (
    pykube.Pod, pykube.Secret, pykube.Node, pykube.Deployment, pykube.StatefulSet, pykube.DaemonSet,
    pykube.Job, pykube.CronJob)
BY_KIND = {cls.kind: cls for cls in _RESOURCE_CLASSES}
BY_RESOURCE = {cls.endpoint: cls for cls in _RESOURCE_CLASSES}


# --- the suites --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Case:
    """One case of a test.yaml, its files read (paths are relative to the example's directory)."""
    example: str
    name: str
    operation: str
    object: Json | None
    old: Json | None
    sub_resource: str
    resource: str | None                   # the plural of the case's ``resource``, when it gives one
    namespace_labels: Mapping[str, str]
    user: Mapping[str, Any] | None
    expect: Mapping[str, Any]              # with ``patched`` read; see ``check`` for the keys

    @property
    def id(self) -> str:
        return f"{self.example}: {self.name}"


@dataclasses.dataclass(frozen=True)
class Suite:
    example: str
    policies: tuple[Json, ...]             # in the order the test.yaml lists them, applied in that order
    cases: tuple[Case, ...]

    @property
    def policy_names(self) -> list[str]:
        return [p["metadata"]["name"] for p in self.policies]


def _read(base: Path, value: Any) -> Json | None:
    """An inline object, or the single document of a file relative to the suite."""
    if value is None or isinstance(value, dict):
        return copy.deepcopy(value)
    body: Json = yaml.safe_load((base / str(value)).read_text())
    return body


def _policies(base: Path, paths: Sequence[str]) -> list[Json]:
    """The AdmissionPolicies of the suite's ``policies`` (files, or directories without their subdirectories)."""
    found: list[Json] = []
    for relative in paths:
        path = base / relative
        files = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml")) if path.is_dir() else [path]
        for file in files:
            for body in yaml.safe_load_all(file.read_text()):
                if isinstance(body, dict) and body.get("kind") == "AdmissionPolicy":
                    body["metadata"].setdefault("labels", {})[OWNED_LABEL] = "true"
                    found.append(body)
    return found


def load_suite(directory: Path) -> Suite:
    suite = yaml.safe_load((directory / "test.yaml").read_text())
    assert suite["kind"] == "AdmissionPolicyTest", directory
    example = directory.name
    cases = []
    for raw in suite["cases"]:
        expect = dict(raw["expect"])
        if "patched" in expect:
            expect["patched"] = _read(directory, expect["patched"])
        resource = raw.get("resource")
        cases.append(Case(
            example=example, name=str(raw["name"]), operation=str(raw.get("operation", "CREATE")),
            object=_read(directory, raw.get("object")), old=_read(directory, raw.get("oldObject")),
            sub_resource=str(raw.get("subResource", "")), resource=resource["resource"] if resource else None,
            namespace_labels=dict(raw.get("namespaceLabels") or {}), user=raw.get("userInfo"), expect=expect,
        ))
    return Suite(example, tuple(_policies(directory, suite.get("policies", ["."]))), tuple(cases))


# Examples whose cases cannot be replayed one request at a time, with why and where they are proven instead.
NOT_REPLAYED = {
    # Its cases give what the cluster holds per case (params and context: the namespace's quota ConfigMap
    # and other Deployments), which differs from case to case, and the operator's caches follow the
    # cluster a moment behind each write: tests/e2e/test_e2e_params_context.py plays the same story
    # against the real API server, in order, waiting for the caches where a denial depends on them.
    "deployment-quota": "params and context differ per case; see test_e2e_params_context.py",
    # A NamespacedAdmissionPolicy judges the namespace it lives in, by name, and its cases compare two
    # namespaces; the replay moves every case into a fresh namespace of its own, which would judge neither.
    # tests/e2e/test_e2e_tenant_policies.py plays the same story in real namespaces, as a tenant admin.
    "tenant-policy": "a tenant policy judges its own namespace; see test_e2e_tenant_policies.py",
}
# Cases likewise, by (example, case name).
NOT_REPLAYED_CASES = {
    # An eviction carries an Eviction, not the Pod: the policy finds the Pod in the operator's cache of
    # protected Pods, which these cases give and a single request cannot. tests/node/test_node.py drains
    # a real node instead (refused, then evicted once drained).
    **{("protect-drained-pods", name): "the Pod comes from the operator's cache; see tests/node"
       for name in ("evicting a protected pod that is not drained (kubectl drain) is denied",
                    "evicting it once drained is allowed", "evicting a pod that is not protected is allowed")},
    # Admitted only under an AdmissionPolicyException whose approval record (annotations) and clock
    # (the suite's now:) a cluster cannot be given: the operator refuses a record it did not write, and
    # time is real. test_e2e_exceptions.py runs the same flow with real identities and the real clock.
    **{("policy-exception", name): "an approval record and a clock only a real approval flow gives; see "
                                   "test_e2e_exceptions.py"
       for name in ("a legacy Pod is admitted under the approved exception, with a warning",
                    "the legacy Deployment's Pod template is covered by the same exception",
                    "one second before it expires, the legacy Pod is still admitted")},
}
SUITES = {suite.example: suite for suite in (load_suite(p.parent) for p in sorted(EXAMPLES.glob("*/test.yaml"))
                                             if p.parent.name not in NOT_REPLAYED)}
CASES = [case for suite in SUITES.values() for case in suite.cases
         if (case.example, case.name) not in NOT_REPLAYED_CASES]
assert set(NOT_REPLAYED_CASES) <= {(case.example, case.name) for suite in SUITES.values() for case in suite.cases}


# --- cases a real API server cannot replay as written ---------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Server:
    """What this API server has switched on (its ``kubernetes_feature_enabled`` metrics)."""
    features: Mapping[str, bool]

    def enabled(self, gate: str) -> bool:
        return self.features.get(gate, False)


@dataclasses.dataclass(frozen=True)
class Deviation:
    """Why a case is not replayed as written, and the replays asserted instead (each one checked as a case).

    ``applies`` says on which API servers: a feature that is off in Kubernetes 1.28 may be on elsewhere,
    and there the case is replayed as written.
    """
    reason: str
    instead: Callable[[Case], list[Case]]
    applies: Callable[[Server], bool] = lambda server: True


def _as_written(case: Case, expect: Mapping[str, Any], note: str) -> Case:
    return dataclasses.replace(case, name=f"{case.name} [as written: {note}]", expect=expect)


def _refused_by_api_server(fragment: str) -> Callable[[Case], Case]:
    """The case as written: the API server refuses it itself (422 Invalid) before validating webhooks run."""
    return lambda case: _as_written(case, {"allowed": False, "refusedByApiServer": fragment},
                                    "refused by the API server")


def _dropped_unknown_field(field: str) -> Callable[[Case], list[Case]]:
    """The case as written: allowed, the API server having dropped ``field`` (which it warns about)."""
    return lambda case: [_as_written(case, {"allowed": True, "serverWarnings": [f'unknown field "{field}"']},
                                     "the API server dropped the unknown field")]


def _adapted(case: Case, note: str, **changes: Any) -> Case:
    return dataclasses.replace(case, name=f"{case.name} [adapted: {note}]", **changes)


def _as_kubectl_debug(case: Case) -> Case:
    """The pod of a CREATE with ephemeralContainers, stored without them; `kubectl debug` adds them."""
    assert case.object is not None
    old = copy.deepcopy(case.object)
    del old["spec"]["ephemeralContainers"]
    return _adapted(case, "kubectl debug adds the ephemeral container to the stored pod", operation="UPDATE",
                    old=old, sub_resource="ephemeralcontainers", resource="pods")


EPHEMERAL_ON_CREATE = "spec.ephemeralContainers: Forbidden: cannot be set on create"


def _refused_on_create_then_debugged(case: Case) -> list[Case]:
    return [_refused_by_api_server(EPHEMERAL_ON_CREATE)(case), _as_kubectl_debug(case)]


def _with_image(pod: Json | None, container: str, image: str) -> Json:
    assert pod is not None
    changed = copy.deepcopy(pod)
    for item in changed["spec"]["containers"]:
        if item["name"] == container:
            item["image"] = image
    return changed


def _with(body: Json | None, path: str, value: Any) -> Json:
    """A copy with ``value`` at the JSON pointer ``path`` (created or replaced)."""
    assert body is not None
    result: Json = jsonpatch.apply_patch(body, [{"op": "add", "path": path, "value": value}])
    return result


def _without(body: Json | None, path: str) -> Json:
    assert body is not None
    result: Json = jsonpatch.apply_patch(body, [{"op": "remove", "path": path}])
    return result


def _unknown_field_dropped(case: Case) -> list[Case]:
    """The API server drops the field at decoding: the policy sees, and defaults, an ordinary container."""
    patched = case.expect["patched"]
    future, today = patched["spec"]["containers"]
    defaulted = copy.deepcopy(patched)
    defaulted["spec"]["containers"][0] = {"name": future["name"], "image": future["image"],
                                          "resources": today["resources"]}
    return [_as_written(case, {"allowed": True, "mutated": True, "patched": defaulted,
                               "serverWarnings": ['unknown field "spec.containers[0].someFutureField"']},
                        "the API server dropped the unknown field, the container is defaulted")]


DEVIATIONS: dict[tuple[str, str], Deviation] = {
    # Pod spec fields other than images are immutable: the case removes the initContainer and renames a
    # container, which the API server refuses before any validating webhook. A real image change is denied.
    ("allowed-registries", "changing an image to a bad one on UPDATE is denied"): Deviation(
        reason="pod updates may not add or remove containers (the API server refuses it itself, 422)",
        instead=lambda case: [
            _refused_by_api_server("pod updates may not add or remove containers")(case),
            _adapted(case, "kubectl set image proxy=nginx", object=_with_image(case.old, "proxy", "nginx")),
        ]),
    # resources.claims needs the DynamicResourceAllocation feature (alpha, off in 1.28): the API server
    # drops the field after the mutating webhooks ran. Everything else of the expected pod is checked.
    ("default-resources", "extended resources and claims survive the rebuild"): Deviation(
        reason="resources.claims is dropped by the API server when DynamicResourceAllocation is off",
        applies=lambda server: not server.enabled("DynamicResourceAllocation"),
        instead=lambda case: [_as_written(
            case, {**case.expect, "patched": _without(case.expect["patched"], "/spec/containers/0/resources/claims")},
            "without claims, dropped by the API server")]),
    # The case stands for a field of a newer Kubernetes; the API server drops fields it does not know
    # before admission (with a Warning), so the policy sees an ordinary container and defaults it.
    ("default-resources", "a container with a field the policy does not know is left unchanged, never truncated"):
        Deviation(reason="the API server drops unknown fields before admission", instead=_unknown_field_dropped),
    # Upstream requires hostNetwork for HostProcess pods; the API server refuses the pod itself (422).
    ("pod-security-baseline", "HostProcess at pod level is denied"): Deviation(
        reason="a HostProcess pod without hostNetwork is invalid (422 from the API server)",
        instead=lambda case: [
            _refused_by_api_server("hostNetwork must be true if pod contains any hostProcess containers")(case),
            _adapted(case, "with hostNetwork: true, as the API server requires",
                     object=_with(case.object, "/spec/hostNetwork", True)),
        ]),
    # Ephemeral containers cannot be set on create (422): they are added by `kubectl debug`, through
    # the pods/ephemeralcontainers subresource, which the policies match.
    ("pod-security-baseline", "ephemeral container adding NET_RAW is denied"): Deviation(
        reason="spec.ephemeralContainers cannot be set on create (422 from the API server)",
        instead=_refused_on_create_then_debugged),
    ("pod-security-restricted", "ephemeral debug container without a securityContext is denied"): Deviation(
        reason="spec.ephemeralContainers cannot be set on create (422 from the API server)",
        instead=_refused_on_create_then_debugged),
    # securityContext.appArmorProfile came in Kubernetes 1.30 (AppArmorFields): an older API server drops
    # it as an unknown field before admission, so there is nothing to judge (nor to enforce on the node).
    # The annotation form is judged: "unconfined AppArmor annotation is denied".
    ("pod-security-baseline", "unconfined container appArmorProfile is denied"): Deviation(
        reason="appArmorProfile is an unknown field before Kubernetes 1.30: dropped before admission",
        applies=lambda server: not server.enabled("AppArmorFields"),
        instead=_dropped_unknown_field("spec.containers[0].securityContext.appArmorProfile")),
    ("pod-security-baseline", "unconfined pod-level appArmorProfile is denied"): Deviation(
        reason="appArmorProfile is an unknown field before Kubernetes 1.30: dropped before admission",
        applies=lambda server: not server.enabled("AppArmorFields"),
        instead=_dropped_unknown_field("spec.securityContext.appArmorProfile")),
    # procMount needs the ProcMountType feature (alpha, off in 1.28): the API server resets it to Default
    # before the validating webhooks run, so the pod is allowed and never runs unmasked.
    ("pod-security-baseline", "Unmasked procMount is denied"): Deviation(
        reason="procMount is reset to Default by the API server when ProcMountType is off",
        applies=lambda server: not server.enabled("ProcMountType"),
        instead=lambda case: [_as_written(
            case, {"allowed": True,
                   "patched": _with(case.object, "/spec/containers/0/securityContext/procMount", "Default")},
            "the API server reset procMount to Default")]),
    # AppArmor annotations cannot be added to an existing pod: the API server refuses the update (422).
    ("pod-security-baseline", "update that only adds an unconfined AppArmor annotation is still checked"): Deviation(
        reason="AppArmor annotations may not be added on update (422 from the API server)",
        instead=lambda case: [_refused_by_api_server("may not add AppArmor annotations")(case)]),
}

# A renamed case would be replayed as written (and fail where it cannot be); its stale entry must not linger.
assert set(DEVIATIONS) <= {(case.example, case.name) for case in CASES}, set(DEVIATIONS) - {
    (case.example, case.name) for case in CASES}
assert {case.example for case in CASES if case.sub_resource == "scale"} <= set(SCALE_TARGETS)


# --- requests -------------------------------------------------------------------------------------------------

def send(cluster: Cluster, method: str, cls: type[APIObject], name: str | None = None, *,
         namespace: str | None = None, subresource: str | None = None, body: Any = None,
         params: Mapping[str, str] | None = None, content_type: str = "application/json",
         user: Mapping[str, Any] | None = None) -> Answer:
    """``Cluster.call``, optionally impersonating ``user`` (one ``Impersonate-Group`` header per group)."""
    kwargs = cluster.api.get_kwargs(version=cls.version, namespace=namespace,
                                    url="/".join(part for part in (cls.endpoint, name, subresource) if part))
    request = requests.Request(method, kwargs["url"], params=dict(params or {}),
                               data=json.dumps(body) if body is not None else None)
    prepared = cluster.api.session.prepare_request(request)
    headers = HTTPHeaderDict(dict(prepared.headers))
    if body is not None:
        headers["Content-Type"] = content_type
    if user:
        headers["Impersonate-User"] = str(user["username"])
        for group in user.get("groups") or []:
            headers.add("Impersonate-Group", str(group))  # requests' own headers cannot repeat a name
    prepared.headers = headers
    response = cluster.api.session.send(prepared, timeout=30)
    return Answer.of(method, response)


@dataclasses.dataclass(eq=False)
class Replay:
    """One case as a request: what is sent, and what the answer is compared with."""
    case: Case
    cls: type[APIObject]
    namespace: str | None
    name: str | None                       # the stored object an UPDATE or DELETE goes to
    user: Mapping[str, Any] | None         # impersonated: the case's userInfo (a kubelet: the stored Node's)
    body: Json | None = None               # CREATE
    patch: list[Json] | None = None        # UPDATE: JSON Patch from the case's oldObject to its object
    expected: Json | None = None           # ``patched``, moved and renamed as the request's object was
    baseline: Json | None = None           # the answer's object before the policy existed (for ``mutated``)

    def send(self, cluster: Cluster) -> Answer:
        user = self.user
        subresource = self.case.sub_resource or None
        dry_run = {"dryRun": "All"}
        if self.case.operation == "CREATE":
            return send(cluster, "POST", self.cls, namespace=self.namespace, body=self.body, params=dry_run,
                        user=user)
        if self.case.operation == "UPDATE":
            return send(cluster, "PATCH", self.cls, self.name, namespace=self.namespace, subresource=subresource,
                        body=self.patch, params=dry_run, content_type="application/json-patch+json", user=user)
        if self.case.operation == "DELETE":
            return send(cluster, "DELETE", self.cls, self.name, namespace=self.namespace, subresource=subresource,
                        params=dry_run, user=user)
        raise AssertionError(f"{self.case.id}: cannot replay operation {self.case.operation}")

    def describe(self) -> str:
        where = "/".join(p for p in (self.namespace, self.cls.endpoint, self.name, self.case.sub_resource) if p)
        who = f" as {self.user['username']}" if self.user else ""
        what = f" {json.dumps(self.patch)}" if self.patch is not None else ""
        return f"{self.case.operation} {where}{who}{what}"


def json_patch(old: Json, new: Json) -> list[Json]:
    """The JSON Patch from ``old`` to ``new``, its moves and copies written out as adds of the value: the API
    server applies it to what it stored, where the value at ``from`` may not be the case file's."""
    document = copy.deepcopy(old)
    operations: list[Json] = []
    for operation in jsonpatch.make_patch(old, new).patch:
        steps = [operation]
        if operation["op"] in ("move", "copy"):
            value = copy.deepcopy(jsonpointer.resolve_pointer(document, operation["from"]))
            steps = [{"op": "remove", "path": operation["from"]}] if operation["op"] == "move" else []
            steps.append({"op": "add", "path": operation["path"], "value": value})
        for step in steps:
            document = jsonpatch.apply_patch(document, [step])
            operations.append(step)
    return operations


def _containers(body: Json) -> Iterator[tuple[str, Json]]:
    """(list name, container) for a pod's containers of every kind, or a pod template's (a CronJob's
    under spec.jobTemplate.spec.template)."""
    spec = body.get("spec") or {}
    if "jobTemplate" in spec:
        spec = (spec.get("jobTemplate") or {}).get("spec") or {}
    pod_spec = (spec.get("template") or {}).get("spec") or {} if "template" in spec else spec
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for container in pod_spec.get(key) or []:
            yield key, container


def cheap(body: Json, image: str | None) -> Json:
    """As ``example_object`` makes them: every image ``image`` (unless None), Deployments paused."""
    body = copy.deepcopy(body)
    if image is not None:
        for _, container in _containers(body):
            container["image"] = image
    if body.get("kind") == "Deployment":
        body["spec"]["paused"] = True
    return body


# --- comparing ---------------------------------------------------------------------------------------------

_TOKEN_VOLUME = re.compile(r"^kube-api-access-[a-z0-9]{5}$")
_DEFAULT_TOLERATIONS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})


def _added_by_api_server(item: Any) -> bool:
    """List items the API server's admission plugins add to every pod: the ServiceAccount plugin's token
    volume and its mounts, and DefaultTolerationSeconds' two NoExecute tolerations."""
    if not isinstance(item, dict):
        return False
    if _TOKEN_VOLUME.match(str(item.get("name", ""))):
        return True
    return item.get("key") in _DEFAULT_TOLERATIONS and item.get("effect") == "NoExecute" and (
        item.get("tolerationSeconds") == 300)


def projected(actual: Any, expected: Any) -> Any:
    """``actual`` cut down to the fields ``expected`` has; list items the API server adds are left out."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        return {key: projected(actual[key], value) for key, value in expected.items() if key in actual}
    if isinstance(expected, list) and isinstance(actual, list):
        items = [item for item in actual if not _added_by_api_server(item)]
        return [projected(a, e) for a, e in zip(items, expected, strict=False)] + items[len(expected):]
    return actual


def touched_paths(policies: Sequence[Json]) -> list[tuple[str, ...]]:
    """Where the policies' mutations write: their JSON Patch paths up to the first list index, and the
    leaves of their merge patches."""
    paths: dict[tuple[str, ...], None] = {}

    def leaves(value: Any, prefix: tuple[str, ...]) -> None:
        if isinstance(value, dict) and value:
            for key, item in value.items():
                leaves(item, (*prefix, str(key)))
        else:
            paths[prefix] = None

    for policy in policies:
        for mutation in policy["spec"].get("mutations") or []:
            for operation in mutation.get("jsonPatch") or []:
                segments = [s.replace("~1", "/").replace("~0", "~") for s in operation["path"].split("/")[1:]]
                cut = next((i for i, s in enumerate(segments) if s == "-" or s.isdigit()), len(segments))
                paths[tuple(segments[:cut])] = None
            if mutation.get("merge"):
                leaves(mutation["merge"], ())
    return list(paths)


def _at(body: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(body, dict):
            return None
        body = body.get(key)
    return body


_PER_REQUEST = ("uid", "creationTimestamp", "resourceVersion", "managedFields")


def _view(replay: Replay, body: Json, paths: Sequence[tuple[str, ...]]) -> Any:
    """What ``mutated`` compares. A CREATE is a dry run of the same body, which nothing else touches: all of
    the object but what the API server makes up per request. An UPDATE goes to a stored object, which
    controllers may change meanwhile: the fields the policies write to (``spec`` if they write nowhere)."""
    if replay.case.operation == "CREATE":
        view = copy.deepcopy(body)
        metadata = view.setdefault("metadata", {})
        for key in _PER_REQUEST:
            metadata.pop(key, None)
        if metadata.get("generateName"):
            metadata.pop("name", None)
    else:
        view = {".".join(path): _at(body, path) for path in (paths or [("spec",)])}
    # The ServiceAccount token volume's name ends in a random suffix, new on every request.
    return json.loads(re.sub(r"kube-api-access-[a-z0-9]{5}", "kube-api-access-*", json.dumps(view)))


def mutated(replay: Replay, actual: Json, baseline: Json, paths: Sequence[tuple[str, ...]]) -> bool:
    return bool(_view(replay, actual, paths) != _view(replay, baseline, paths))


def _texts(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def vap_denial(name: str) -> str:
    """How the API server words a denial by the ValidatingAdmissionPolicy ``name`` through its binding of the
    same name (the generated pairs of native enforcement)."""
    return f"ValidatingAdmissionPolicy '{name}' with binding '{name}' denied request: "


def vap_warning(name: str) -> str:
    """The beginning of the API server's warning for a Warn binding's failed validation (as ``vap_denial``)."""
    return f"Validation failed for ValidatingAdmissionPolicy '{name}' with binding '{name}': "


def our_warnings(answer: Answer, policy_names: Sequence[str], generated: Sequence[str] = ()) -> list[str]:
    """The warnings of the example's policies: through our webhook, or, with ``generated``, only those of
    ``policy_names`` through it and those of the generated ValidatingAdmissionPolicies."""
    if not generated:
        return answer.policy_warnings
    return [w for w in answer.warnings if any(w.startswith(f'AdmissionPolicy "{p}"') for p in policy_names)
            or any(w.startswith(vap_warning(n)) for n in generated)]


def check(replay: Replay, answer: Answer, policy_names: Sequence[str], paths: Sequence[tuple[str, ...]],
          generated: Sequence[str] = ()) -> list[str]:
    """Every way the answer differs from the case's expectations, as sentences.

    The test.yaml keys (see ``admission_policy.cli.suite.check``), and two for ``DEVIATIONS``:
    ``refusedByApiServer`` (a 422 Invalid from the API server itself, with this fragment, no webhook in it)
    and ``serverWarnings`` (fragments of warnings the API server itself sent).

    ``generated``: the ValidatingAdmissionPolicies that enforce some of the example's policies natively
    (each with its binding of the same name), whose denials and warnings are the API server's
    (``vap_denial``, ``vap_warning``); ``policy_names`` are then the policies our webhook judges.
    """
    expect = replay.case.expect
    if "refusedByApiServer" in expect:
        if answer.status != 422 or answer.reason != "Invalid" or "admission webhook" in answer.message:
            return [f"expected the API server itself to refuse it as Invalid (422), got {answer}"]
        if expect["refusedByApiServer"] not in answer.message:
            return [f"expected {expect['refusedByApiServer']!r} in the API server's message, got {answer.message!r}"]
        return []
    problems = []
    if expect["allowed"] and not answer.ok:
        return [f"expected allowed, got {answer}"]
    if not expect["allowed"]:
        if answer.ok:
            return [f"expected denied, got allowed (warnings: {answer.warnings})"]
        ours = [p for p in policy_names if f'AdmissionPolicy "{p}" denied the request: ' in answer.message]
        native = [n for n in generated if vap_denial(n) in answer.message]
        if ("admission webhook" not in answer.message or not ours) and not native:
            if generated:
                return [f"expected a denial by {' or '.join([*policy_names, *generated])} (the generated ones as "
                        f"ValidatingAdmissionPolicy), got {answer}"]
            return [f"expected a denial by {' or '.join(policy_names)} through the webhook, got {answer}"]
        if "code" in expect and answer.status != expect["code"]:
            problems.append(f"expected code {expect['code']}, got {answer.status}")
        problems += [f"expected the message to contain {text!r}, got {answer.message!r}"
                     for text in _texts(expect.get("messageContains")) if text not in answer.message]
    warnings = our_warnings(answer, policy_names, generated)
    if "warnings" in expect:
        wanted = _texts(expect["warnings"])
        if not wanted and warnings:
            problems.append(f"expected no warnings, got {warnings}")
        problems += [f"expected a warning containing {text!r}, got {warnings}"
                     for text in wanted if not any(text in warning for warning in warnings)]
    server_warnings = [w for w in answer.warnings if w not in warnings]
    problems += [f"expected the API server to warn {text!r}, got {server_warnings}"
                 for text in _texts(expect.get("serverWarnings")) if not any(text in w for w in server_warnings)]
    if not expect["allowed"]:
        return problems
    if "mutated" in expect:
        if replay.baseline is None:
            problems.append("no baseline: the same request failed before the policy existed")
        elif mutated(replay, answer.obj, replay.baseline, paths) != bool(expect["mutated"]):
            diff = yaml_diff(_view(replay, replay.baseline, paths), _view(replay, answer.obj, paths),
                             "before the policy", "with it")
            problems.append(f"expected mutated={bool(expect['mutated'])}, the answer is "
                            + (f"changed:\n{diff}" if diff else "unchanged"))
    if replay.expected is not None:
        actual = projected(answer.obj, replay.expected)
        if actual != replay.expected:
            problems.append("the returned object differs from the expected one (its fields only):\n"
                            + yaml_diff(replay.expected, actual, "expected", "returned"))
    return problems


# --- one example on the cluster --------------------------------------------------------------------------------

class Stage:
    """One example on the cluster: namespaces, the objects its UPDATE and DELETE cases start from, its policies."""

    def __init__(self, cluster: Cluster, suite: Suite, server: Server) -> None:
        self.cluster = cluster
        self.suite = suite
        self.server = server
        self.image = None if suite.example in KEEP_IMAGES else cluster.settings.pod_image
        self.policies = Policies(cluster)
        self.paths = touched_paths(suite.policies)
        self.namespaces: list[tuple[str, Mapping[str, str]]] = []     # for stored objects
        self.create_namespaces: dict[str, str] = {}                   # labels (as JSON) → name, for CREATEs
        self.occupied: dict[str, set[tuple[str, str]]] = {}           # namespace → (resource, name) stored there
        self.stored: dict[str, tuple[str | None, str]] = {}           # object key → (namespace, name)
        self.nodes: list[str] = []
        self.held: list[tuple[type[APIObject], str | None, str]] = []
        self.replays: dict[str, list[Replay]] = {}
        self.deviations: dict[str, Deviation] = {}                    # case name → the one applied
        self.rbac: list[tuple[type[APIObject], str]] = []

    # setting up: objects first, baselines, then the policies

    def setup(self) -> None:
        for case in self.suite.cases:
            if (case.example, case.name) in NOT_REPLAYED_CASES:
                continue
            deviation = DEVIATIONS.get((case.example, case.name))
            if deviation is not None and deviation.applies(self.server):
                self.deviations[case.name] = deviation
                self.replays[case.name] = [self._plan(c) for c in deviation.instead(case)]
            else:
                self.replays[case.name] = [self._plan(case)]
        self._grant(sorted({str(r.user["username"]) for r in self.all_replays() if r.user}))
        probes = self._probes()
        for replay in self.all_replays():
            if "mutated" in replay.case.expect or replay is probes.get("mutate"):
                answer = replay.send(self.cluster)
                replay.baseline = answer.obj if answer.ok else None
        for body in self.suite.policies:
            self.policies.apply(body)
        self.applied()
        # The API server may route by an older webhook configuration for a moment after the policy went
        # Active: repeat one request the policy must change (a dry run) until it does, per webhook.
        for kind, replay in probes.items():
            eventually(functools.partial(replay.send, self.cluster),
                       functools.partial(self._shows_policy, kind, replay),
                       f"{self.suite.example}: the {kind} webhook to act on {replay.case.name!r}",
                       self.cluster.settings.timeout)

    def applied(self) -> None:
        """Called once the policies are Active, before the probes (a subclass waits for more here)."""

    def _grant(self, users: Sequence[str]) -> None:
        """RBAC for the users the cases impersonate, so that their requests get as far as admission."""
        if not users:
            return
        name = unique(f"ap-e2e-{self.suite.example}-replay")
        metadata = {"name": name, "labels": {OWNED_LABEL: "true"}}
        rules = [
            {"apiGroups": [""], "resources": ["pods", "pods/ephemeralcontainers", "nodes", "nodes/status", "secrets"],
             "verbs": ["get", "create", "update", "patch", "delete"]},
            {"apiGroups": ["apps"], "resources": ["deployments", "deployments/scale", "statefulsets", "daemonsets"],
             "verbs": ["get", "create", "update", "patch", "delete"]},
        ]
        for cls, body in (
            (pykube.ClusterRole, {"metadata": metadata, "rules": rules}),
            (pykube.ClusterRoleBinding, {
                "metadata": metadata,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user} for user in users],
            }),
        ):
            created = self.cluster.create(cls, {"apiVersion": cls.version, "kind": cls.kind, **body})
            assert created.ok, f"{self.suite.example}: cannot create {cls.kind} {name}: {created}"
            self.rbac.append((cls, name))
        # The RBAC authorizer follows bindings from a watch, a moment behind: a request sent at once (a
        # baseline) could be refused before admission.
        for user in users:
            review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                      "spec": {"user": user, "resourceAttributes": {"verb": "get", "resource": "pods"}}}
            eventually(lambda review=review: self.cluster.raw(
                           "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body=review),
                       lambda answer: answer.ok and bool(answer.obj.get("status", {}).get("allowed")),
                       f"{self.suite.example}: RBAC to let {user} through", self.cluster.settings.timeout)

    def all_replays(self) -> list[Replay]:
        return [replay for replays in self.replays.values() for replay in replays]

    def _probes(self) -> dict[str, Replay]:
        """The first replay whose expected answer shows the policy at work: per webhook (validate, mutate)."""
        probes: dict[str, Replay] = {}
        for replay in self.all_replays():
            expect = replay.case.expect
            if "refusedByApiServer" in expect:
                continue
            if "validate" not in probes and (not expect["allowed"] or _texts(expect.get("warnings"))):
                probes["validate"] = replay
            if "mutate" not in probes and expect["allowed"] and expect.get("mutated") is True:
                probes["mutate"] = replay
        return probes

    def _shows_policy(self, kind: str, replay: Replay, answer: Answer) -> bool:
        if kind == "mutate":
            return answer.ok and replay.baseline is not None and mutated(replay, answer.obj, replay.baseline,
                                                                         self.paths)
        if replay.case.expect["allowed"]:
            return bool(answer.policy_warnings)
        return 'AdmissionPolicy "' in answer.message

    def _plan(self, case: Case) -> Replay:
        """The request for ``case``; an UPDATE's or DELETE's oldObject is stored on the way."""
        cls = BY_RESOURCE[case.resource] if case.resource else BY_KIND[(case.object or case.old or {})["kind"]]
        namespaced = issubclass(cls, NamespacedAPIObject)
        if case.operation == "CREATE":
            assert case.object is not None, case.id
            namespace = self._create_namespace(case.namespace_labels) if namespaced else None
            body = cheap(case.object, self.image)
            if namespace:
                body["metadata"]["namespace"] = namespace
            replay = Replay(case, cls, namespace, body["metadata"].get("name"), case.user, body=body)
            replay.expected = self._expected(case, namespace, None, sent={
                (key, c["name"], c.get("image")) for key, c in _containers(case.object)})
            return replay

        assert case.old is not None, case.id
        old = copy.deepcopy(case.old)
        stored_cls, stored = cls, old
        if case.sub_resource == "scale":
            stored_cls = pykube.Deployment
            stored = _read(EXAMPLES / case.example, SCALE_TARGETS[case.example]) or {}
            stored["spec"]["replicas"] = old["spec"]["replicas"]
        deleting = "deletionTimestamp" in old["metadata"]
        if deleting:
            old["metadata"]["finalizers"] = [HOLD_FINALIZER]
            stored = copy.deepcopy(old)
            for key in ("deletionTimestamp", "deletionGracePeriodSeconds"):
                stored["metadata"].pop(key, None)
        namespace, name = self._store(stored_cls, cheap(stored, self.image), case.namespace_labels, deleting)
        user = case.user
        if user and stored_cls is pykube.Node and user["username"] == f"system:node:{old['metadata']['name']}":
            # The kubelet of the Node, under its unique name: the NodeRestriction plugin (kind has it) lets
            # a kubelet write its own Node only; the policy looks at the system:node: prefix.
            user = {**user, "username": f"system:node:{name}"}
        replay = Replay(case, cls, namespace, name, user)
        if case.operation == "UPDATE":
            assert case.object is not None, case.id
            new = copy.deepcopy(case.object)
            new["metadata"]["name"] = old["metadata"]["name"]  # the stored object's: a request names one object
            if "namespace" in old["metadata"]:
                new["metadata"]["namespace"] = old["metadata"]["namespace"]
            replay.patch = json_patch(old, new)
            # Containers whose image the update leaves alone keep the stored (possibly swapped) image.
            old_images = {(key, c["name"], c.get("image")) for key, c in _containers(old)}
            replay.expected = self._expected(case, namespace, name, sent={
                (key, c["name"], c.get("image")) for key, c in _containers(new)} & old_images)
        return replay

    def _expected(self, case: Case, namespace: str | None, name: str | None,
                  sent: set[tuple[str, str, Any]]) -> Json | None:
        """The case's ``patched`` object, where and as the request's object went: its namespace or the stored
        name, and the swapped image for each container whose image the API server got swapped."""
        expected: Json | None = copy.deepcopy(case.expect.get("patched"))
        if expected is None:
            return None
        if namespace:
            expected["metadata"]["namespace"] = namespace
        if name and not namespace:
            expected["metadata"]["name"] = name
        if self.image is not None:
            for key, container in _containers(expected):
                if (key, container["name"], container.get("image")) in sent:
                    container["image"] = self.image
        return expected

    def _create_namespace(self, labels: Mapping[str, str]) -> str:
        """A namespace with these labels for CREATE cases: dry runs store nothing, so they all share it."""
        key = json.dumps(labels, sort_keys=True)
        if key not in self.create_namespaces:
            self.create_namespaces[key] = self._new_namespace(labels)
        return self.create_namespaces[key]

    def _new_namespace(self, labels: Mapping[str, str]) -> str:
        name = unique(f"ap-e2e-{self.suite.example}", limit=50)
        self.occupied[name] = set()
        self.cluster.create_namespace(name, labels)
        return name

    def _store(self, cls: type[APIObject], body: Json, labels: Mapping[str, str], deleting: bool
               ) -> tuple[str | None, str]:
        """Create the object a case starts from, now, before the policy exists. Cases that start from the same
        object share it (their requests are dry runs); objects of the same name go to separate namespaces."""
        key = json.dumps([cls.endpoint, body, labels], sort_keys=True)
        if key in self.stored:
            return self.stored[key]
        body = copy.deepcopy(body)
        name: str = body["metadata"]["name"]
        namespace: str | None = None
        if issubclass(cls, NamespacedAPIObject):
            namespace = next((ns for ns, ns_labels in self.namespaces
                              if ns_labels == labels and (cls.endpoint, name) not in self.occupied[ns]), None)
            if namespace is None:
                namespace = self._new_namespace(labels)
                self.namespaces.append((namespace, labels))
            self.occupied[namespace].add((cls.endpoint, name))
            body["metadata"]["namespace"] = namespace
        else:
            name = body["metadata"]["name"] = unique(name)  # cluster-scoped: one per case's object
            self.nodes.append(name)
        created = self.cluster.create(cls, body)
        assert created.ok, f"{self.suite.example}: cannot store {cls.kind} {name}: {created}"
        if deleting:
            self.held.append((cls, namespace, name))
            gone = self.cluster.call("DELETE", cls, name, namespace=namespace)
            assert gone.ok, f"{self.suite.example}: cannot delete {cls.kind} {name}: {gone}"
        self.stored[key] = (namespace, name)
        return namespace, name

    # tearing down: the policies first (the API server stops calling for them), then what was stored

    def teardown(self) -> None:
        problems = []
        steps: list[Callable[[], Any]] = [self.policies.delete_all]
        steps += [functools.partial(self.cluster.merge_patch, cls, name, {"metadata": {"finalizers": None}},
                                    namespace=namespace) for cls, namespace, name in self.held]
        steps += [functools.partial(self.cluster.delete, pykube.Node, node) for node in self.nodes]
        steps += [functools.partial(self.cluster.delete, pykube.Namespace, ns) for ns in self.occupied]
        steps += [functools.partial(self.cluster.delete, cls, name) for cls, name in reversed(self.rbac)]
        for step in steps:
            try:
                step()
            except (AssertionError, requests.RequestException) as exc:
                problems.append(str(exc))
        assert not problems, f"{self.suite.example}: cleaning up failed: " + "; ".join(problems)


class Stages:
    """The example being replayed: set up on its first case, torn down when the next example's case comes
    (cases run in file order, example by example) or at the end of the module."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.current: Stage | None = None
        self.failed: tuple[str, BaseException] | None = None
        self._server: Server | None = None

    @property
    def server(self) -> Server:
        if self._server is None:
            metrics = self.cluster.api.session.get(f"{self.cluster.api.url}/metrics", timeout=30)
            features = {}
            for match in re.finditer(r"^kubernetes_feature_enabled\{([^}]*)\} (\S+)$", metrics.text, re.MULTILINE):
                gate = re.search(r'name="([^"]+)"', match.group(1))
                if gate:
                    features[gate.group(1)] = float(match.group(2)) == 1
            self._server = Server(features)
        return self._server

    def enter(self, example: str) -> Stage:
        if self.failed is not None and self.failed[0] == example:
            raise AssertionError(f"setting up example {example} failed (see its first case)") from self.failed[1]
        if self.current is not None and self.current.suite.example == example:
            return self.current
        self.close()
        stage = Stage(self.cluster, SUITES[example], self.server)
        self.current = stage
        try:
            stage.setup()
        except BaseException as exc:
            self.failed = (example, exc)
            raise
        return stage

    def close(self) -> None:
        stage, self.current = self.current, None
        if stage is not None:
            stage.teardown()
