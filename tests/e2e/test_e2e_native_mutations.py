"""The MutatingAdmissionPolicies ``vap/mutating.py`` generates mutate as the webhook does, on a real
Kubernetes 1.32 (``v1alpha1`` behind its gate: the secondary plane only).

The generated objects are created directly through the API, not by the operator (no AdmissionPolicy
is created, so no webhook judges these requests), their bindings confined to namespaces of this
module's own (a label with a fresh token). Then:

- each example with mutations that ports: the mutating cases of its suite (an allowed case expecting
  ``patched`` or ``mutated``) are replayed as test_e2e_examples.py replays them (replay.py's ``Stage``)
  and checked the same way; an example that does not port must be kept off by the blocker ``BLOCKED``
  names (a new blocker, or one gone, fails here);
- hand-written policies cover each operation, missing parents, escaped keys, merge patches in both
  modes, conditions and literals of every JSON type: the engine's own result on each object
  (``evaluate``, as the webhook answers) is what the API server must return from a dry run.
"""
from __future__ import annotations

import copy
import dataclasses
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pykube
import pytest
from e2e_kube import OWNED_LABEL, Answer, Cluster, Target, eventually
from pykube.objects import APIObject, NamespacedAPIObject
from replay import SUITES, Json, Server, Stage, Stages, Suite, check, touched_paths

from admission_policy.cluster.routing import ServedIndex
from admission_policy.engine import Phase, load_policy
from admission_policy.vap import mutating, native
from builders import decide, object_request, policy_body, rule

pytestmark = pytest.mark.e2e

SECONDARY = pytest.mark.parametrize("native_target", ["secondary"], indirect=True)
SCOPE_LABEL = "e2e.policy-operator.dev/native-mutations"
TARGET = native.Target("v1", (1, 32), ServedIndex(()), mutating_version="v1alpha1")
GROUP_VERSION = "admissionregistration.k8s.io/v1alpha1"
LOAD_TIMEOUT = 90.0   # the API server loads policies and bindings from watches; a CRD's type converter lags more

# Examples with mutations that stay on the webhook on 1.32, and a fragment of why.
BLOCKED = {
    # Its valueExpression's map literal mixes value types, which Kubernetes' CEL refuses.
    "default-resources": "a map literal mixes",
    # formatQuantity is this project's CEL, not Kubernetes'.
    "node-cpu-overcommit": "undeclared reference to 'formatQuantity'",
}
MUTATING_EXAMPLES = sorted(name for name, suite in SUITES.items()
                           if any(p["spec"].get("mutations") for p in suite.policies))
assert set(BLOCKED) <= set(MUTATING_EXAMPLES)


class MutatingAdmissionPolicy(APIObject):  # type: ignore[misc]
    version = GROUP_VERSION
    endpoint = "mutatingadmissionpolicies"
    kind = "MutatingAdmissionPolicy"


class MutatingAdmissionPolicyBinding(APIObject):  # type: ignore[misc]
    version = GROUP_VERSION
    endpoint = "mutatingadmissionpolicybindings"
    kind = "MutatingAdmissionPolicyBinding"


class Widget(NamespacedAPIObject):  # type: ignore[misc]
    version = "e2e.policy-operator.dev/v1"
    endpoint = "widgets"
    kind = "Widget"


WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.e2e.policy-operator.dev", "labels": {OWNED_LABEL: "true"}},
    "spec": {"group": "e2e.policy-operator.dev", "scope": "Namespaced",
             "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                 "type": "object", "properties": {"spec": {"type": "object",
                                                           "x-kubernetes-preserve-unknown-fields": True}}}}}]},
}


# --- the generated objects on the cluster ---------------------------------------------------------------

class Generated:
    """MutatingAdmissionPolicies and bindings created for a test, each binding confined to the namespaces
    labelled with this instance's token; deleted (and awaited gone) on ``delete``."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.token = secrets.token_hex(4)
        self.names: list[str] = []

    def create(self, objects: Sequence[Json]) -> None:
        for body in objects:
            body = copy.deepcopy(body)
            body["metadata"]["finalizers"] = []   # no operator here to release them
            # Not the operator's (the plane's operator would sweep objects no policy of its owns).
            body["metadata"]["labels"] = {key: value for key, value in body["metadata"]["labels"].items()
                                          if key != "app.kubernetes.io/managed-by"}
            body["metadata"]["labels"][OWNED_LABEL] = "true"
            body["metadata"]["name"] = f"{body['metadata']['name']}.{self.token}"
            if body["kind"] == mutating.MUTATING_POLICY:
                cls: type[APIObject] = MutatingAdmissionPolicy
                self.names.append(body["metadata"]["name"])
            else:
                cls = MutatingAdmissionPolicyBinding
                body["spec"]["policyName"] = f"{body['spec']['policyName']}.{self.token}"
                body["spec"]["matchResources"] = {"namespaceSelector": {"matchLabels": {SCOPE_LABEL: self.token}}}
            created = self.cluster.create(cls, body)
            assert created.ok, f"the API server refused the generated {cls.kind}: {created}\n{body}"

    def namespace_labels(self, labels: Mapping[str, str] | None = None) -> dict[str, str]:
        return {**(labels or {}), SCOPE_LABEL: self.token}

    def delete(self) -> None:
        for name in self.names:   # bindings first: a binding without its policy is an error of its own
            self.cluster.delete(MutatingAdmissionPolicyBinding, name)
            self.cluster.delete(MutatingAdmissionPolicy, name)
        for name in self.names:
            self.cluster.wait_gone(MutatingAdmissionPolicy, name)


def _plan(body: Json) -> native.Plan:
    """The MutatingAdmissionPolicies and bindings of the policy's plan (its validations' are not these tests')."""
    found = native.plan(load_policy(body, "Fail"), body, TARGET)
    return native.Plan(tuple(o for o in found.objects if o["kind"] in (mutating.MUTATING_POLICY,
                                                                      mutating.MUTATING_BINDING)), found.blockers)


# --- the examples ---------------------------------------------------------------------------------------

def _mutating_cases(suite: Suite) -> Suite:
    """The suite with only the cases whose expectation is a mutation (or none) of an allowed request."""
    cases = tuple(c for c in suite.cases
                  if c.expect.get("allowed") and ("patched" in c.expect or "mutated" in c.expect))
    return dataclasses.replace(suite, cases=cases)


class MutatingStage(Stage):
    """An example's Stage whose policies are the generated MutatingAdmissionPolicies, not AdmissionPolicies."""

    def __init__(self, cluster: Cluster, suite: Suite, server: Server, generated: Generated,
                 objects: Sequence[Json]) -> None:
        super().__init__(cluster, dataclasses.replace(suite, policies=()), server)
        self.paths = touched_paths(suite.policies)
        self.generated, self.objects = generated, objects

    def _new_namespace(self, labels: Mapping[str, str]) -> str:
        return super()._new_namespace(self.generated.namespace_labels(labels))

    def applied(self) -> None:
        self.generated.create(self.objects)

    def teardown(self) -> None:
        try:
            self.generated.delete()
        finally:
            super().teardown()


@SECONDARY
@pytest.mark.parametrize("example", MUTATING_EXAMPLES)
def test_an_example_mutates_natively_as_through_the_webhook(native_target: Target, example: str) -> None:
    cluster = native_target.cluster
    suite = SUITES[example]
    plans = [_plan(body) for body in suite.policies]
    reasons = [str(finding) for plan in plans for finding in plan.blockers]
    if example in BLOCKED:
        assert any(BLOCKED[example] in reason for reason in reasons), reasons
        return
    assert not reasons, f"{example} does not port: {reasons}"
    objects = [obj for plan in plans for obj in plan.objects]
    stage = MutatingStage(cluster, _mutating_cases(suite), Stages(cluster).server, Generated(cluster), objects)
    assert stage.suite.cases, f"{example} has no mutating case"
    try:
        stage.setup()
        problems = []
        for replay in stage.all_replays():
            # Each place's policy is loaded on its own: the Pods' may be in effect before a Job template's.
            deadline = time.monotonic() + LOAD_TIMEOUT
            while (found := check(replay, replay.send(cluster), suite.policy_names, stage.paths)) \
                    and time.monotonic() < deadline:
                time.sleep(1)
            problems += [f"{replay.case.name}: {problem}" for problem in found]
        assert not problems, f"{example}: the generated MutatingAdmissionPolicies mutate otherwise:\n" + \
            "\n".join(problems) + "\n\nthe generated objects:\n" + "\n".join(str(o) for o in objects)
    finally:
        stage.teardown()


# --- hand-written policies: each operation, against the engine ----------------------------------------

def _configmap(case: str, **fields: Any) -> Json:
    body: Json = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "labels": {"mut-case": case}}}
    body.update(fields)
    return body


def _widget(case: str, spec: Json) -> Json:
    return {"apiVersion": "e2e.policy-operator.dev/v1", "kind": "Widget",
            "metadata": {"name": "w", "labels": {"mut-case": case}}, "spec": spec}


@dataclasses.dataclass(frozen=True)
class Story:
    """A hand-written policy and the objects it is tried on; the first must be mutated (it waits for the
    policy to be in effect)."""
    name: str
    mutations: list[Json]
    objects: list[Json]
    resource: str = "configmaps"
    group: str = ""

    def body(self) -> Json:
        return policy_body(f"mut-{self.name}", rules=[rule(self.resource, group=self.group, operations=["CREATE"])],
                           match={"objectSelector": {"matchLabels": {"mut-case": self.name}}},
                           failurePolicy="Fail", mutations=self.mutations)


STORIES = [
    Story("json-ops", [
        {"name": "plain", "jsonPatch": [
            {"op": "add", "path": "/metadata/labels/added", "value": "yes"},
            {"op": "add", "path": "/metadata/annotations/example.com~1a", "value": "escaped"},
            {"op": "replace", "path": "/data/k", "value": "replaced"},
            {"op": "remove", "path": "/data/gone"},
            {"op": "copy", "from": "/data/k", "path": "/data/copied"},
            {"op": "move", "from": "/data/moved-from", "path": "/data/moved-to"}]},
        {"name": "lists", "jsonPatch": [
            {"op": "add", "path": "/metadata/finalizers/-", "value": "example.com/last"},
            {"op": "add", "path": "/metadata/finalizers/0", "value": "example.com/first"}]},
    ], [
        _configmap("json-ops", data={"k": "v", "gone": "x", "moved-from": "m"}),
        _configmap("json-ops", data={"k": "v", "gone": "x", "moved-from": "m"},
                   metadata={"name": "cm", "labels": {"mut-case": "json-ops"}, "annotations": {"keep": "1"},
                             "finalizers": ["example.com/own"]}),
        _configmap("json-ops", data={"k": "v", "moved-from": "m"}),   # remove fails: Fail denies
    ]),
    Story("conditions", [
        {"name": "when-on", "condition": "object.?data.?flag.orValue('') == 'on'",
         "jsonPatch": [{"op": "add", "path": "/data/out", "valueExpression": "'flag was ' + object.data.flag"}]},
        {"name": "never", "condition": "false // a comment at the end", "jsonPatch": [
            {"op": "add", "path": "/data/never", "value": "set"}]},
        {"name": "sees-the-last", "condition": "has(object.data) && 'out' in object.data", "jsonPatch": [
            {"op": "add", "path": "/metadata/labels/saw-out", "value": "true"}]},
    ], [
        _configmap("conditions", data={"flag": "on"}),
        _configmap("conditions", data={"flag": "off"}),
        _configmap("conditions"),
    ]),
    Story("merge", [
        {"name": "overwrite", "merge": {"metadata": {"labels": {"m": "1", "drop": None},
                                                     "annotations": {"n": "x", "example.com/key": "y"}},
                                        "data": {"new": "v", "old": None, "k": "over"}}},
        {"name": "if-absent", "mergeMode": "IfAbsent", "merge": {
            "data": {"k": "not-set", "fresh": "default"}, "metadata": {"annotations": {"n": "not-set", "o": "z"}},
            "binaryData": {"b": "aGk="}}},
    ], [
        _configmap("merge", data={"k": "v", "old": "o"}, metadata={"name": "cm", "labels": {
            "mut-case": "merge", "drop": "me"}}),
        _configmap("merge"),
    ]),
    Story("literals", [
        {"name": "values", "jsonPatch": [
            {"op": "add", "path": "/spec/value", "value": {
                "nested": {"list": [1, "two", True, None, 2.5, {"x": []}], "flag": False, "n": -3, "s": 'q"\\\n'},
                "empty": {}, "ints": [1, 2, 3]}},
            {"op": "add", "path": "/spec/deep/er/list/-", "value": {"a": 1}},
            {"op": "add", "path": "/spec/deep/er/other", "value": None},
            {"op": "add", "path": "/spec/new/0", "value": "first"},
            {"op": "add", "path": "/spec/odd~1key~0x/in~0side", "value": "escaped"}]},
        {"name": "merged", "merge": {"spec": {"value": {"nested": {"flag": True, "n": None}, "more": [None, 1]},
                                              "a/b~c": {"d": "e"}}}},
    ], [
        _widget("literals", {"present": 1}),
        _widget("literals", {"deep": {"er": {"list": [{"a": 0}]}}, "new": ["second"]}),
    ], resource="widgets", group="e2e.policy-operator.dev"),
]


def _view(obj: Json) -> Json:
    """What the policies write, to compare: data, spec, and the metadata they touch."""
    metadata = obj.get("metadata") or {}
    return {"data": obj.get("data"), "binaryData": obj.get("binaryData"), "spec": obj.get("spec"),
            **{key: metadata.get(key) for key in ("labels", "annotations", "finalizers")}}


def _engine(body: Json, obj: Json, namespace: str) -> tuple[bool, Json | None]:
    """What the webhook answers: allowed, and the object as its mutations leave it."""
    compiled = load_policy(body, "Fail")
    sent = copy.deepcopy(obj)
    sent["metadata"]["namespace"] = namespace
    decision = decide(compiled, object_request(sent), phase=Phase.MUTATE)
    return decision.allowed, (decision.patched_object if decision.allowed else None)


@pytest.fixture(scope="module")
def widgets(secondary_cluster: Cluster) -> Iterator[None]:
    """The Widget CRD on the secondary plane (where these tests run), once for the module: a CRD
    deleted and created again under its name was seen answering 404 for minutes."""
    cluster = secondary_cluster
    answer = cluster.create(pykube.CustomResourceDefinition, WIDGET_CRD)
    assert answer.ok or answer.status == 409, str(answer)
    eventually(lambda: cluster.call("GET", Widget, namespace="default"), lambda a: a.ok,
               "the Widget CRD to be served", LOAD_TIMEOUT)
    yield
    cluster.delete(pykube.CustomResourceDefinition, WIDGET_CRD["metadata"]["name"])


@SECONDARY
@pytest.mark.parametrize("story", STORIES, ids=[s.name for s in STORIES])
def test_each_operation_mutates_natively_as_the_engine(native_target: Target, widgets: None, story: Story,
                                                        target_namespace: Callable[..., str]) -> None:
    cluster = native_target.cluster
    body = story.body()
    plan = _plan(body)
    assert not plan.blockers, plan.blockers
    generated = Generated(cluster)
    namespace = target_namespace(generated.namespace_labels())
    cls: type[APIObject] = Widget if story.resource == "widgets" else pykube.ConfigMap
    first_allowed, first = _engine(body, story.objects[0], namespace)
    assert first_allowed and first is not None and _view(first) != _view(story.objects[0]), \
        f"{story.name}: the first object must be mutated (it shows the policy in effect): {first}"
    try:
        generated.create(plan.objects)
        problems = []
        for index, obj in enumerate(story.objects):
            allowed, expected = _engine(body, obj, namespace)
            sent = copy.deepcopy(obj)
            sent["metadata"]["namespace"] = namespace

            def send(sent: Json = sent) -> Answer:
                return cluster.create(cls, sent, dry_run=True)

            def agrees(answer: Answer, allowed: bool = allowed, expected: Json | None = expected) -> bool:
                if not allowed:   # in the API server's words: "policy 'P' with binding 'P' denied request: ..."
                    return not answer.ok and any(f"with binding '{name}' denied" in answer.message
                                                 for name in generated.names)
                return answer.ok and expected is not None and _view(answer.obj) == _view(expected)

            answer = eventually(send, agrees, f"{story.name}: {cls.kind} {index} as the engine mutates it",
                                LOAD_TIMEOUT) if index == 0 else send()
            if not agrees(answer):
                got = _view(answer.obj) if answer.ok else str(answer)
                problems.append(f"object {index}: the engine {'allows' if allowed else 'denies'} "
                                f"{_view(expected) if expected else ''}, the API server answered {got}")
        assert not problems, f"{story.name}:\n" + "\n".join(problems) + f"\n\ngenerated: {plan.objects}"
    finally:
        generated.delete()
