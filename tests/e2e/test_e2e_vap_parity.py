"""ValidatingAdmissionPolicy parity on a real API server: what Kubernetes decides natively, the
AdmissionPolicies that ``admission-policy convert`` makes of the same policies decide alike.

``vap_parity_policies.yaml`` holds native policies and bindings (``v1beta1``, what 1.28 serves)
exercising the CEL libraries and features a 1.28 API server accepts: strings, lists, regex, URLs,
the authorizer, variables, ``messageExpression`` and ``reason``, ``matchConditions``, ``paramKind``
with a ``paramRef`` (and a param not found), the validation actions ``Deny``, ``Warn`` and ``Audit``,
and ``failurePolicy`` ``Fail`` and ``Ignore``. A 1.28 API server type-checks new expressions in 1.27's
environment (one version back, so that a rollback can still run them): optionals and ``quantity()``
(1.28), sets (1.29) and ``ip()``/``cidr()`` (1.30) are refused there, so they are not in the file.

The same requests — dry-run creates and updates of ConfigMaps, Pods and Deployments, allowed and
denied, one as a user who may not read Secrets — are sent twice: with the native policies (and no
AdmissionPolicy), then with the converted ones (and no native policy) enforced by the session's
operator. Each answer must match the case's expectation, written from Kubernetes' documented
behaviour and checked here against the native run, and the two answers must match each other:
allowed or denied, the HTTP code, the native denial's validation message inside ours (the wording
around it differs), and the same warning messages. An evaluation or configuration error under
``failurePolicy: Fail`` is compared as a denial only: the two word errors differently, and
Kubernetes answers it 422 (Invalid, its default reason) where the operator answers 403.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
import re
import subprocess
from collections.abc import Callable, Container, Iterable, Mapping
from typing import Any

import pykube
import pytest
import yaml
from e2e_kube import OWNED_LABEL, Answer, Cluster, Policies, cli, eventually
from pykube.objects import APIObject

pytestmark = pytest.mark.e2e

POLICIES_FILE = pathlib.Path(__file__).resolve().parent / "vap_parity_policies.yaml"
PARITY_LABEL = "e2e.policy-operator.dev/vap-parity"   # what every binding's namespaceSelector asks for
PARAM = "e2e-parity-limits"                           # the params policy's paramRef.name
ALICE = "e2e-parity-alice"                            # may write ConfigMaps, may not read Secrets
REGISTRY = "registry.k8s.io/"


class ValidatingAdmissionPolicy(APIObject):  # type: ignore[misc]
    version = "admissionregistration.k8s.io/v1beta1"
    endpoint = "validatingadmissionpolicies"
    kind = "ValidatingAdmissionPolicy"


class ValidatingAdmissionPolicyBinding(APIObject):  # type: ignore[misc]
    version = "admissionregistration.k8s.io/v1beta1"
    endpoint = "validatingadmissionpolicybindings"
    kind = "ValidatingAdmissionPolicyBinding"


NATIVE_CLASSES: Mapping[str, type[APIObject]] = {cls.kind: cls for cls in (ValidatingAdmissionPolicy,
                                                                           ValidatingAdmissionPolicyBinding)}
RESOURCES: Mapping[str, type[APIObject]] = {"ConfigMap": pykube.ConfigMap, "Pod": pykube.Pod,
                                            "Deployment": pykube.Deployment}


# --- the requests ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Case:
    """One request and the answer Kubernetes gives it. ``message`` may name ``{namespace}``."""
    name: str
    kind: str
    body: Mapping[str, Any]               # CREATE: the object without namespace; UPDATE: a merge patch
    operation: str = "CREATE"
    target: str = ""                      # UPDATE: the stored object's name
    namespace: str = "main"               # "main" has the param, "bare" has none
    user: str | None = None               # impersonated; None: the admin
    policy: str | None = None             # the policy that denies or warns
    message: str = ""                     # denied: the failing validation's message
    code: int = 0                         # denied: the HTTP code (422 unless the validation gives a reason)
    warnings: tuple[str, ...] = ()
    error: bool = False                   # denied by an error under failurePolicy Fail, not a validation

    @property
    def allowed(self) -> bool:
        return not self.code


def configmap(name: str, data: Mapping[str, str], **expect: Any) -> Case:
    return Case(name, "ConfigMap", {"metadata": {"name": "parity"}, "data": dict(data)}, **expect)


def container(image: str = f"{REGISTRY}pause:3.9", *, limits: bool = True) -> dict[str, Any]:
    found: dict[str, Any] = {"name": "app", "image": image}
    if limits:
        found["resources"] = {"limits": {"cpu": "100m", "memory": "64Mi"}}
    return found


def pod(name: str, *containers: dict[str, Any], **expect: Any) -> Case:
    return Case(name, "Pod", {"metadata": {"name": "parity"}, "spec": {"containers": list(containers)}}, **expect)


def deployment_body(replicas: int, image: str = f"{REGISTRY}pause:3.9", *,
                    labels: Mapping[str, str] | None = None, limits: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": "parity", "labels": dict(labels or {})},
            "spec": {"replicas": replicas, "paused": True, "selector": {"matchLabels": {"app": "parity"}},
                     "template": {"metadata": {"labels": {"app": "parity"}},
                                  "spec": {"containers": [container(image, limits=limits)]}}}}


def deployment(name: str, replicas: int, image: str = f"{REGISTRY}pause:3.9", *,
               labels: Mapping[str, str] | None = None, limits: bool = True, **expect: Any) -> Case:
    return Case(name, "Deployment", deployment_body(replicas, image, labels=labels, limits=limits), **expect)


def denied(policy: str, message: str, code: int = 422) -> dict[str, Any]:
    return {"policy": f"e2e-parity-{policy}", "message": message, "code": code}


def failed(policy: str) -> dict[str, Any]:
    return {"policy": f"e2e-parity-{policy}", "code": 422, "error": True}


CASES: tuple[Case, ...] = (
    configmap("plain configmap", {"a": "b"}),
    # strings (ext.Strings v0)
    configmap("csv without gaps", {"csv": "a,b,c"}),
    configmap("csv with an empty item", {"csv": "a, ,c"}, **denied("strings", 'csv has an empty item: "a, ,c"')),
    configmap("team not lower case", {"team": "Platform"}, **denied("strings", "team must be lower case", 403)),
    configmap("path with dot-dot", {"path": "../etc"}, **denied("strings", "path must not contain ..")),
    configmap("file with a good suffix", {"file": "app.config.json"}),
    configmap("file with a bad suffix", {"file": "app.yml"},
              **denied("strings", "file app.yml must end in .yaml or .json")),
    configmap("title capitalised", {"title": "Hello"}),
    configmap("title empty: substring out of range", {"title": ""}, **failed("strings")),
    configmap("words with a leading space", {"words": " lead on"},
              **denied("strings", "words must not start with a space")),
    # lists (Kubernetes' lists library)
    configmap("ports sorted", {"ports": "8080,9090"}),
    configmap("ports unsorted", {"ports": "9090,8080"}, **denied("lists", "ports must be sorted: 9090,8080")),
    configmap("ports unsorted and low: the first failure", {"ports": "9090,80"},
              **denied("lists", "ports must be sorted: 9090,80")),
    configmap("port too low", {"ports": "80,8080"}, **denied("lists", "ports must be above 1024")),
    configmap("port too high", {"ports": "40000"}, **denied("lists", "ports must be below 32768")),
    configmap("port listed twice", {"ports": "8080,8080"}, **denied("lists", "port 8080 is listed twice")),
    configmap("ports over the sum", {"ports": "30000,31000"},
              **denied("lists", "ports add up to 61000, over 60000")),
    configmap("port not a number", {"ports": "http"}, **failed("lists")),
    # regex and URLs
    configmap("image with a version", {"image": "nginx:1.25"}),
    configmap("image without a version", {"image": "nginx"}, **denied("regex-url", "image nginx has no version")),
    configmap("three internal hosts", {"hosts": "a.internal,b.internal,c.internal"},
              **denied("regex-url", "at most two internal hosts")),
    configmap("https endpoint", {"endpoint": "https://api.example.com/v1?x=1"}),
    configmap("http endpoint", {"endpoint": "http://api.example.com"},
              **denied("regex-url", "endpoint must be an https URL: http://api.example.com")),
    configmap("endpoint not a URL", {"endpoint": "not a url"},
              **denied("regex-url", "endpoint must be an https URL: not a url")),
    configmap("endpoint on another port", {"endpoint": "https://api.example.com:8443/v1"},
              **denied("regex-url", "endpoint must be on example.com, port 443")),
    configmap("endpoint with a debug query", {"endpoint": "https://api.example.com/v1?debug=1"},
              **denied("regex-url", "endpoint must not be a debug or admin URL")),
    configmap("endpoint with an admin path", {"endpoint": "https://api.example.com/admin/users"},
              **denied("regex-url", "endpoint must not be a debug or admin URL")),
    # failurePolicy Ignore: a false validation denies, an error does not
    configmap("limit over", {"limit": "20"}, **denied("ignore", "limit 20 is over 10")),
    configmap("limit not a number: ignored", {"limit": "many"}),
    # Audit only: neither denied nor warned
    configmap("password audited", {"password": "hunter2"}),
    # the authorizer, and a matchCondition that leaves a request out
    Case("authz as admin", "ConfigMap", {"metadata": {"name": "authz-admin"}}),
    Case("authz as a user who may not read Secrets", "ConfigMap", {"metadata": {"name": "authz-alice"}},
         user=ALICE, **denied("authz", "only users who may read Secrets in {namespace} may create authz- ConfigMaps",
                              403)),
    Case("not matched by the authz condition", "ConfigMap", {"metadata": {"name": "plain-alice"}}, user=ALICE),
    # UPDATE: oldObject
    Case("version up", "ConfigMap", {"data": {"version": "6"}}, operation="UPDATE", target="versioned"),
    Case("version down", "ConfigMap", {"data": {"version": "4"}}, operation="UPDATE", target="versioned",
         **denied("update", "version may not go down from 5 to 4")),
    Case("update to an upper-case team", "ConfigMap", {"data": {"team": "Ops"}}, operation="UPDATE",
         target="versioned", **denied("strings", "team must be lower case", 403)),
    # Warn and Audit: allowed, with one warning per failed validation
    pod("pod with limits", container()),
    pod("pod without limits on latest", container(f"{REGISTRY}pause:latest", limits=False),
        policy="e2e-parity-pods-warn", warnings=("every container should set resource limits",
                                                 "the latest tag is discouraged: app")),
    # A Pod policy does not judge Pod templates (ours would, unless podControllers is empty)
    deployment("deployment without limits", 1, limits=False),
    # params, with a matchCondition
    deployment("deployment within the param's limits", 2),
    deployment("deployment over the param's replicas", 5,
               **denied("params", "replicas 5 over the limit of 3", 403)),
    deployment("deployment from another registry", 1, "docker.io/library/nginx:1.25",
               **denied("params", f"images must come from {REGISTRY}")),
    deployment("exempt deployment over the replicas", 5, labels={"parity-exempt": "yes"}),
    dataclasses.replace(deployment("deployment where no param exists", 1, **failed("params")), namespace="bare"),
    Case("deployment scaled within", "Deployment", {"spec": {"replicas": 3}}, operation="UPDATE", target="web"),
    Case("deployment scaled over", "Deployment", {"spec": {"replicas": 4}}, operation="UPDATE", target="web",
         **denied("params", "replicas 4 over the limit of 3", 403)),
)


# --- answers --------------------------------------------------------------------------------------------------

_NATIVE_DENIAL = re.compile(r"ValidatingAdmissionPolicy '([^']+)' with binding '[^']+' denied request: (.*)$", re.S)
_NATIVE_WARNING = re.compile(r"Validation failed for ValidatingAdmissionPolicy '[^']+' with binding '[^']+': (.*)$",
                             re.S)
_OUR_WARNING = re.compile(r'AdmissionPolicy "[^"]+": (.*)$', re.S)


@dataclasses.dataclass(frozen=True)
class Decision:
    """An answer reduced to what both kinds of policy must agree on."""
    allowed: bool
    code: int
    message: str
    warnings: tuple[str, ...]     # the validation messages the policies warned with, sorted

    @classmethod
    def of(cls, answer: Answer) -> Decision:
        texts = []
        for warning in answer.warnings:
            found = _NATIVE_WARNING.match(warning) or _OUR_WARNING.match(warning)
            if found:
                texts.append(found.group(1))
        return cls(answer.ok, 0 if answer.ok else answer.status, "" if answer.ok else answer.message,
                   tuple(sorted(texts)))

    def shows_a_policy(self) -> bool:
        return not self.allowed or bool(self.warnings)

    def __str__(self) -> str:
        verdict = "allowed" if self.allowed else f"denied {self.code}: {self.message}"
        return verdict + (f" (warnings: {list(self.warnings)})" if self.warnings else "")


def send(cluster: Cluster, case: Case, namespaces: Mapping[str, str]) -> Decision:
    """The case as a dry run, impersonating its user."""
    cls = RESOURCES[case.kind]
    namespace = namespaces[case.namespace]
    headers = {"Impersonate-User": case.user} if case.user else {}
    if case.operation == "CREATE":
        body = {"apiVersion": cls.version, "kind": case.kind, **case.body,
                "metadata": {**case.body["metadata"], "namespace": namespace}}
        method, url = "POST", cls.endpoint
    else:
        body, method, url = dict(case.body), "PATCH", f"{cls.endpoint}/{case.target}"
        headers["Content-Type"] = "application/merge-patch+json"
    response = cluster.api.request(method, version=cls.version, namespace=namespace, url=url,
                                   params={"dryRun": "All"}, data=json.dumps(body),
                                   headers={"Content-Type": "application/json", **headers})
    return Decision.of(Answer.of(method, response))


def expectation_problems(case: Case, decision: Decision, namespace: str) -> list[str]:
    """How the native policies' answer differs from what the case expects."""
    if case.allowed or decision.allowed:
        problems = [] if case.allowed == decision.allowed else [f"expected {'allowed' if case.allowed else 'denied'}"]
    else:
        problems = []
        if f"ValidatingAdmissionPolicy '{case.policy}'" not in decision.message:
            problems.append(f"not denied by ValidatingAdmissionPolicy '{case.policy}'")
        if not case.error:
            message = case.message.format(namespace=namespace)
            if message not in decision.message:
                problems.append(f"the message does not name {message!r}")
            if decision.code != case.code:
                problems.append(f"expected HTTP {case.code}")
    if decision.warnings != tuple(sorted(case.warnings)):
        problems.append(f"expected the warnings {sorted(case.warnings)}")
    return problems


def parity_problems(case: Case, native: Decision, converted: Decision) -> list[str]:
    """How the converted policies' answer differs from the native one."""
    problems = []
    if native.allowed != converted.allowed:
        problems.append("allowed where the native policy denied" if converted.allowed
                        else "denied where the native policy allowed")
    elif not native.allowed and not case.error:
        found = _NATIVE_DENIAL.search(native.message)
        if found and found.group(2) not in converted.message:
            problems.append(f"the message does not name {found.group(2)!r}")
        if native.code != converted.code:
            problems.append(f"HTTP {converted.code}, not {native.code}")
    if native.warnings != converted.warnings:
        problems.append(f"warnings {list(converted.warnings)}, not {list(native.warnings)}")
    return problems


# --- the policies ---------------------------------------------------------------------------------------------

def native_documents() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(POLICIES_FILE.read_text()) if doc]


def convert() -> tuple[list[dict[str, Any]], list[str]]:
    """``admission-policy convert`` of the policies file: the AdmissionPolicies it wrote (one per
    binding, named after it), and its lines about what it could not convert faithfully."""
    try:
        result = subprocess.run([*cli(), "convert", str(POLICIES_FILE)], capture_output=True, text=True,
                                timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"admission-policy convert could not run: {exc}", pytrace=False)
    if result.returncode not in (0, 2):
        pytest.fail(f"admission-policy convert {POLICIES_FILE.name} exited {result.returncode}:\n{result.stderr}",
                    pytrace=False)
    errors = [line for line in result.stderr.splitlines() if line.strip()] if result.returncode else []
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc], errors


def apply_native(cluster: Cluster, documents: Iterable[Mapping[str, Any]]) -> None:
    for document in documents:
        created = cluster.create(NATIVE_CLASSES[document["kind"]], document)
        assert created.ok, f"creating {document['kind']} {document['metadata']['name']} failed: {created}"


def delete_native(cluster: Cluster, documents: Iterable[Mapping[str, Any]]) -> None:
    for document in documents:
        cluster.delete(NATIVE_CLASSES[document["kind"]], document["metadata"]["name"])


def serves_validating_admission_policies(cluster: Cluster) -> bool:
    answer = cluster.call("GET", ValidatingAdmissionPolicy)
    return answer.ok


# --- the cluster's side ---------------------------------------------------------------------------------------

def prepare(cluster: Cluster, namespace: Callable[..., str]) -> dict[str, str]:
    """Namespaces, the param, the objects the UPDATE cases change, and RBAC for the impersonated user;
    all before any policy, which would judge them."""
    namespaces = {"main": namespace({PARITY_LABEL: "true"}), "bare": namespace({PARITY_LABEL: "true"})}
    main = namespaces["main"]
    stored: list[tuple[type[APIObject], dict[str, Any]]] = [
        (pykube.ConfigMap, {"metadata": {"name": PARAM}, "data": {"maxReplicas": "3", "registry": REGISTRY}}),
        (pykube.ConfigMap, {"metadata": {"name": "versioned"}, "data": {"version": "5"}}),
        (pykube.Deployment, {**deployment_body(2), "metadata": {"name": "web"}}),
        (pykube.Role, {"metadata": {"name": ALICE}, "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "update", "patch"]}]}),
        (pykube.RoleBinding, {"metadata": {"name": ALICE}, "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ALICE},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": ALICE}]}),
    ]
    for cls, body in stored:
        body = {"apiVersion": cls.version, "kind": cls.kind, **body,
                "metadata": {**body["metadata"], "namespace": main}}
        created = cluster.create(cls, body)
        assert created.ok, f"cannot create {cls.kind} {body['metadata']['name']}: {created}"
    return namespaces


def probes(left_out: Container[str | None]) -> list[Case]:
    """Per policy not ``left_out``, the first case it visibly decides (a denial or a warning by a
    validation)."""
    found: dict[str, Case] = {}
    for case in CASES:
        if case.policy and not case.error and case.policy not in found and case.policy not in left_out:
            found[case.policy] = case
    return list(found.values())


def wait_until(cluster: Cluster, namespaces: Mapping[str, str], *, enforced: bool, what: str,
               left_out: Container[str | None] = ()) -> None:
    """Until every probe shows its policy (``enforced``), or none does: the API server's policy
    and webhook caches, and the operator's, take a moment."""
    def settled(decisions: list[Decision]) -> bool:
        return all(d.shows_a_policy() == enforced for d in decisions)
    eventually(lambda: [send(cluster, case, namespaces) for case in probes(left_out)], settled, what,
               cluster.settings.timeout, interval=0.25)


# --- the test -------------------------------------------------------------------------------------------------

def test_native_and_converted_policies_decide_every_request_alike(
        cluster: Cluster, policies: Policies, namespace: Callable[..., str]) -> None:
    if not serves_validating_admission_policies(cluster):
        pytest.skip("the API server does not serve admissionregistration.k8s.io/v1beta1 ValidatingAdmissionPolicies "
                    "(1.28: --feature-gates=ValidatingAdmissionPolicy=true "
                    "--runtime-config=admissionregistration.k8s.io/v1beta1=true)")
    converted, convert_errors = convert()
    documents = native_documents()
    written = {body["metadata"]["name"] for body in converted}
    # The bindings are named as their policies: a case whose policy has no AdmissionPolicy is not compared.
    unconverted = {d["metadata"]["name"] for d in documents if d["metadata"]["name"] not in written}
    delete_native(cluster, documents)   # left by a run that was killed
    namespaces = prepare(cluster, namespace)

    try:
        apply_native(cluster, documents)
        wait_until(cluster, namespaces, enforced=True, what="the native policies to be enforced")
        native = {case.name: send(cluster, case, namespaces) for case in CASES}
    finally:
        delete_native(cluster, documents)
    wait_until(cluster, namespaces, enforced=False, what="the native policies to be gone")

    for body in converted:
        body.setdefault("metadata", {}).setdefault("labels", {})[OWNED_LABEL] = "true"
        policies.apply(body)
    wait_until(cluster, namespaces, enforced=True, what="the converted policies to be enforced",
               left_out=unconverted)
    ours = {case.name: send(cluster, case, namespaces) for case in CASES}

    report: dict[str, list[str]] = collections.defaultdict(list)
    for case in CASES:
        for problem in expectation_problems(case, native[case.name], namespaces["main"]):
            report[case.name].append(f"native: {problem}; got {native[case.name]}")
        differences = parity_problems(case, native[case.name], ours[case.name])
        if differences and case.policy not in unconverted:
            report[case.name].append(f"converted: {'; '.join(differences)}\n      native: {native[case.name]}"
                                     f"\n      ours:   {ours[case.name]}")
    lines = [f"{name}:\n    " + "\n    ".join(problems) for name, problems in report.items()]
    lines += [f"admission-policy convert: {line}" for line in convert_errors]
    lines += [f"no AdmissionPolicy for {name}, its requests not compared" for name in sorted(unconverted)]
    assert not lines, f"{len(report)} of {len(CASES)} requests differ:\n" + "\n".join(lines)
