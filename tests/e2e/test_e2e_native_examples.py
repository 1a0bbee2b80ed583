"""Every example, enforced natively where it ports, decides every case of its suite as the webhook does,
on both control planes (``native_target``: 1.28 with ValidatingAdmissionPolicy v1beta1, 1.32 with v1).

One test per example and plane. The example is set up as test_e2e_examples.py sets it up (replay.py's
``Stage``: the stored objects, namespaces, RBAC), but its policies say ``spec.native: Auto``; each
policy's ``status.native`` is awaited for its generation. Then:

- who enforces each policy must be what ``ON_WEBHOOK`` says: a policy that stops porting, or starts to,
  fails here (update the table with the change that did it, after checking the new reason makes sense);
- every case of the suite is replayed and checked as test_e2e_examples.py checks it, the denials and
  warnings of natively enforced policies in the API server's words (``replay.vap_denial``,
  ``replay.vap_warning``); a natively enforced policy heard through the webhook is a failure too.

An example's mismatches are reported together, with the generated objects (what to fix in
``vap/native.py``, or in the example); the ones already reported are listed in ``KNOWN_MISMATCHES``,
exactly, so that a fix shows as well as a new difference. The examples replay.py does not replay (``NOT_REPLAYED``) get
their status checked only.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import pytest
import yaml
from e2e_kube import (
    EXAMPLES,
    OWNED_LABEL,
    AdmissionPolicy,
    Answer,
    Cluster,
    NamespacedAdmissionPolicy,
    OperatorProcess,
    Policies,
    Target,
    eventually,
)
from pykube.objects import APIObject
from replay import (
    NOT_REPLAYED,
    SUITES,
    Json,
    Replay,
    Server,
    Stage,
    Stages,
    Suite,
    check,
    our_warnings,
    vap_denial,
    vap_warning,
)

pytestmark = pytest.mark.e2e

V1_28, V1_32 = (1, 28), (1, 32)
PLANES = (V1_28, V1_32)

MUTATES = ("NotPortable", "spec.mutations: the API server serves no MutatingAdmissionPolicy")   # before 1.32
CONTEXT = ("NotPortable", "spec.context: a ValidatingAdmissionPolicy reads no lists of other objects")

# Who keeps each example's policies on the webhook, per plane: (status.native.reason, a fragment of its message).
# An example or plane not listed ports: its policies must be enforced natively. (Optional syntax, which 1.28's
# CEL lacks, is lowered by vap/lowering.py: the examples that use it port to 1.28 too.)
ON_WEBHOOK: dict[str, dict[tuple[int, int], tuple[str, str]]] = {
    # Its valueExpression's map literal mixes value types, which Kubernetes' CEL refuses.
    "default-resources": {V1_28: MUTATES, V1_32: ("NotPortable", "a map literal mixes")},
    "deployment-quota": {V1_28: CONTEXT, V1_32: CONTEXT},
    "image-references": {plane: ("NotPortable", "the Python plugin 'image-references' runs only in this operator")
                         for plane in PLANES},
    "lifespan-toleration": {V1_28: MUTATES},
    "node-cpu-overcommit": {V1_28: MUTATES, V1_32: ("NotPortable", "undeclared reference to 'formatQuantity'")},
    "protect-drained-pods": {V1_28: CONTEXT, V1_32: CONTEXT},
    # Our own CEL library (base64), not in Kubernetes' environment.
    "secret-min-length": {plane: ("NotPortable", "undeclared reference to 'base64'") for plane in PLANES},
    "sidecar-injection": {V1_28: MUTATES},
    "tls-secrets": {plane: ("NotPortable", "the Python plugin 'tls-secrets' runs only in this operator")
                    for plane in PLANES},
}

# Cases whose native answer is known to differ from the webhook's: (example, case name) → (the planes, the texts
# of its messageContains that the native denial lacks). Any other difference fails, and so does an entry that no
# longer matches what is missing (a fix shows: remove or shrink it). All of one kind: the webhook reports every
# failed validation of every denying policy; the API server stops at the first failed validation of the first
# denying policy (docs/vap.md).
KNOWN_MISMATCHES: dict[tuple[str, str], tuple[tuple[tuple[int, int], ...], tuple[str, ...]]] = {
    ("pod-security-baseline", "HostProcess container is denied"): (PLANES, ("Host Namespaces:",)),
    ("pod-security-baseline", "every broken control is reported"):
        (PLANES, ('Privileged Containers: container "app"', 'HostPath Volumes: volume "root"')),
    ("pod-security-restricted", "the default pod passes baseline but not restricted"):
        (PLANES, ("Running as Non-root:", "Seccomp (restricted):", "Capabilities (restricted):")),
    # Both profiles deny it; the API server answers with whichever of the two it ran first.
    ("pod-security-restricted", "hostPath volume is denied by both profiles"):
        (PLANES, ("Volume Types:", 'volume "logs" (hostPath)', "HostPath Volumes:")),
    ("pod-security-restricted", "ephemeral debug container without a securityContext is denied"):
        (PLANES, ('Capabilities (restricted): container "debugger"',)),
    ("pod-security-restricted", "a Deployment whose template passes only baseline is denied, naming it"):
        (PLANES, ("Running as Non-root:",)),
    ("pod-security-restricted", "a new image in that Deployment's template is judged, and denied"):
        (PLANES, ("Seccomp (restricted):",)),
}

EXAMPLE_NAMES = sorted(p.parent.name for p in EXAMPLES.glob("*/test.yaml") if (p.parent / "policy.yaml").exists())
assert set(ON_WEBHOOK) <= set(EXAMPLE_NAMES), set(ON_WEBHOOK) - set(EXAMPLE_NAMES)
assert set(KNOWN_MISMATCHES) <= {
    (s.example, c.name) for s in SUITES.values() for c in s.cases}

# A switch to Native waits for the operator's probe (up to 15 s, then 5 s for 1.28's compile queue) on
# a loaded machine; a pass that failed is retried after the operator's POLL/INTERVAL.
NATIVE_TIMEOUT = 150.0
DELETE_TIMEOUT = 60.0


def _native(body: Json) -> Json:
    body = copy.deepcopy(body)
    body["spec"]["native"] = "Auto"
    return body


@functools.cache
def _server(cluster: Cluster) -> Server:
    return Stages(cluster).server


def _log_size(operator: OperatorProcess) -> int:
    try:
        return operator.log_path.stat().st_size
    except FileNotFoundError:
        return 0


def _native_log(operator: OperatorProcess, since: int) -> str:
    """The operator's lines about native enforcement since ``since`` (a refused object, a failed pass)."""
    try:
        with operator.log_path.open("rb") as log:
            log.seek(since)
            text = log.read().decode(errors="replace")
    except FileNotFoundError:
        return "(no operator log)"
    lines = [line for line in text.splitlines()
             if re.search(r"Native enforcement|ValidatingAdmissionPolicy|refused|\(422\)", line)]
    return "\n".join(lines[-20:]) or "(nothing about native enforcement)"


def _settled(cluster: Cluster, cls: type[APIObject], name: str, namespace: str | None) -> dict[str, Any]:
    """``status.native`` once it speaks of the policy's current generation and is not switching, else {}."""
    answer = cluster.get(cls, name, namespace)
    assert answer.ok, str(answer)
    native: dict[str, Any] = (answer.obj.get("status") or {}).get("native") or {}
    if native.get("generation") != answer.obj["metadata"].get("generation") or native.get("reason") == "Rewriting":
        return {}
    return native if native.get("enforcedBy") in ("Native", "Webhook") else {}


def _await_native(cluster: Cluster, operator: OperatorProcess, since: int, cls: type[APIObject], name: str,
                  namespace: str | None = None) -> dict[str, Any]:
    try:
        return eventually(lambda: _settled(cluster, cls, name, namespace), bool,
                          f"{cls.kind} {name} to say who enforces it (status.native)", NATIVE_TIMEOUT, interval=1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\noperator log on native enforcement:\n{_native_log(operator, since)}") from None


# Cases whose known mismatch depends on which of two denying policies the API server runs first.
EITHER: Final = {("pod-security-restricted", "hostPath volume is denied by both profiles"):
                 ({"Volume Types:", 'volume "logs" (hostPath)'}, {"HostPath Volumes:"})}


def _lacks_as_known(case: tuple[str, str], missing: set[str], texts: set[str]) -> bool:
    """Whether an answer lacked what KNOWN_MISMATCHES says (for an EITHER case: one policy's texts)."""
    return missing in EITHER[case] if case in EITHER else missing == texts


def _generated_names(native: Mapping[str, Any]) -> list[str]:
    return [o["name"] for o in native.get("objects") or [] if o.get("kind") == "ValidatingAdmissionPolicy"]


def _enforcement_problems(example: str, version: tuple[int, int], natives: Mapping[str, Mapping[str, Any]]
                          ) -> list[str]:
    """Each policy's status.native against ``ON_WEBHOOK``."""
    expected = ON_WEBHOOK.get(example, {}).get(version)
    problems = []
    for name, native in natives.items():
        said = f"{native.get('enforcedBy')}/{native.get('reason')}: {native.get('message')!r}"
        if expected is None:
            if native.get("enforcedBy") != "Native" or native.get("reason") != "Generated":
                problems.append(f"{name}: expected to port (Native/Generated), got {said}")
            elif 2 * sum(not o["kind"].endswith("Binding") for o in native.get("objects") or []) != len(
                    native.get("objects") or []):
                problems.append(f"{name}: expected a binding per generated policy, got {native.get('objects')}")
        elif native.get("enforcedBy") != "Webhook" or native.get("reason") != expected[0] or (
                expected[1] not in str(native.get("message"))):
            problems.append(f"{name}: expected Webhook/{expected[0]} with {expected[1]!r} in the message, got {said}")
    return problems


class NativeStage(Stage):
    """An example's Stage whose policies say ``spec.native: Auto``; the probes follow who enforces them."""

    def __init__(self, cluster: Cluster, suite: Suite, server: Server, operator: OperatorProcess) -> None:
        super().__init__(cluster, dataclasses.replace(suite, policies=tuple(_native(p) for p in suite.policies)),
                         server)
        self.operator = operator
        self.since = _log_size(operator)
        self.natives: dict[str, dict[str, Any]] = {}
        self.witnesses: dict[str, Replay] = {}

    def applied(self) -> None:
        for name in self.suite.policy_names:
            self.natives[name] = _await_native(self.cluster, self.operator, self.since, AdmissionPolicy, name)

    @property
    def native_policies(self) -> list[str]:
        return [name for name, native in self.natives.items() if native.get("enforcedBy") == "Native"]

    @property
    def webhook_policies(self) -> list[str]:
        return [name for name in self.suite.policy_names if name not in self.native_policies]

    @property
    def generated(self) -> list[str]:
        return [n for name in self.native_policies for n in _generated_names(self.natives[name])]

    def _probes(self) -> dict[str, Replay]:
        # The operator proved the generated objects in effect before it said Native, and its webhook no
        # longer judges those policies: only what the webhook still judges waits for its routing.
        return super()._probes() if self.webhook_policies else {}

    def _shows_policy(self, kind: str, replay: Replay, answer: Answer) -> bool:
        if kind == "mutate" or not self.generated:
            return super()._shows_policy(kind, replay, answer)
        if replay.case.expect["allowed"]:
            return bool(our_warnings(answer, self.webhook_policies, self.generated))
        return any(vap_denial(n) in answer.message for n in self.generated) or super()._shows_policy(
            kind, replay, answer)

    def heard(self, replay: Replay, answer: Answer) -> None:
        """Keeps, per generated policy, the first replay it answered (to see it gone in ``teardown``)."""
        for name in self.generated:
            if name not in self.witnesses and _carries(answer, name):
                self.witnesses[name] = replay

    def teardown(self) -> None:
        try:
            for name in self.native_policies:
                self.cluster.delete(AdmissionPolicy, name)
                self.cluster.wait_gone(AdmissionPolicy, name, timeout=DELETE_TIMEOUT)
            # The API server follows the deletions from a watch, a moment behind: the next example's stored
            # objects must not meet these policies (they did: a Pod refused by the last example's).
            for name, replay in self.witnesses.items():
                eventually(functools.partial(replay.send, self.cluster),
                           lambda answer, name=name: not _carries(answer, name),
                           f"the API server to stop enforcing {name}", self.cluster.settings.timeout)
        finally:
            super().teardown()

    def generated_objects(self) -> list[Json]:
        """The generated ValidatingAdmissionPolicies as the API server holds them (for the report)."""
        found = []
        for name in self.native_policies:
            for ref in self.natives[name].get("objects") or []:
                if ref.get("kind") == "ValidatingAdmissionPolicy":
                    answer = self.cluster.raw("GET", f"/apis/{ref['apiVersion']}/validatingadmissionpolicies/"
                                                     f"{ref['name']}")
                    found.append(answer.obj if answer.ok else {"name": ref["name"], "error": str(answer)})
        return found


def _carries(answer: Answer, generated: str) -> bool:
    """Whether the generated policy ``generated`` denied the request or warned about it."""
    return vap_denial(generated) in answer.message or any(w.startswith(vap_warning(generated))
                                                          for w in answer.warnings)


def _heard_through_webhook(answer: Answer, native_policies: Sequence[str]) -> list[str]:
    """A natively enforced policy must not be judged by our webhook too."""
    heard = [w for w in answer.warnings if any(w.startswith(f'AdmissionPolicy "{p}"') for p in native_policies)]
    if not answer.ok:
        heard += [answer.message for p in native_policies if f'AdmissionPolicy "{p}" denied' in answer.message]
    return [f"enforced natively, yet judged by the webhook: {text!r}" for text in heard]


def _describe_generated(objects: Sequence[Json]) -> str:
    """The generated objects' CEL, for the report (what to fix in vap/native.py)."""
    shown = []
    for obj in objects:
        spec = obj.get("spec") or {}
        shown.append({"name": obj.get("metadata", {}).get("name", obj.get("name")),
                      **{key: spec[key] for key in ("matchConditions", "variables", "validations") if key in spec},
                      **({"typeChecking": obj["status"]["typeChecking"]}
                         if (obj.get("status") or {}).get("typeChecking") else {}),
                      **({"error": obj["error"]} if "error" in obj else {})})
    return yaml.safe_dump(shown, sort_keys=False, width=140)


def _replay_natively(target: Target, suite: Suite) -> tuple[list[str], list[str]]:
    """The example on the plane, natively where it ports: (problems, notes for the report)."""
    cluster, operator, version = target
    stage = NativeStage(cluster, suite, _server(cluster), operator)
    problems: list[str] = []
    notes: list[str] = []
    try:
        started = time.monotonic()
        stage.setup()
        notes.append(f"set up in {time.monotonic() - started:.0f}s; "
                     + ", ".join(f"{n}: {v.get('enforcedBy')}/{v.get('reason')}" for n, v in stage.natives.items()))
        problems += _enforcement_problems(suite.example, version, stage.natives)
        missing: dict[str, set[str]] = {}   # case → the expected texts the answers lacked
        started = time.monotonic()
        for case_name, replays in stage.replays.items():
            for replay in replays:
                answer = replay.send(cluster)
                stage.heard(replay, answer)
                found = check(replay, answer, stage.webhook_policies, stage.paths, stage.generated)
                found += _heard_through_webhook(answer, stage.native_policies)
                planes, texts = KNOWN_MISMATCHES.get((suite.example, case_name), ((), ()))
                lacks = {t: f"expected the message to contain {t!r}" for t in texts if version in planes}
                unknown = [p for p in found if not any(p.startswith(lack) for lack in lacks.values())]
                missing.setdefault(case_name, set()).update(
                    t for t, lack in lacks.items() if any(p.startswith(lack) for p in found))
                if unknown:
                    problems.append(f"{replay.case.id}\n  request: {replay.describe()}\n  answer: {answer}\n  - "
                                    + "\n  - ".join(found))
        notes.append(f"{sum(len(r) for r in stage.replays.values())} replays in {time.monotonic() - started:.0f}s")
        problems += [f"{suite.example}: {case!r} now lacks {sorted(missing.get(case, ()))} natively, not "
                     f"{list(texts)}: update its KNOWN_MISMATCHES entry"
                     for (example, case), (planes, texts) in KNOWN_MISMATCHES.items()
                     if example == suite.example and version in planes and not _lacks_as_known(
                         (example, case), missing.get(case, set()), set(texts))]
        if problems and stage.generated:
            problems.append("the generated ValidatingAdmissionPolicies:\n" + _describe_generated(
                stage.generated_objects()))
    finally:
        stage.teardown()
    return problems, notes


def _status_only(target: Target, example: str, namespace: Callable[..., str]) -> list[str]:
    """Who enforces the policies of an example that replay.py does not replay (the reason is in NOT_REPLAYED)."""
    cluster, operator, version = target
    since = _log_size(operator)
    natives: dict[str, dict[str, Any]] = {}
    policies = Policies(cluster)
    tenant: list[tuple[str, str]] = []
    try:
        for path in sorted((EXAMPLES / example).glob("policy*.yaml")):
            for body in yaml.safe_load_all(path.read_text()):
                if not isinstance(body, dict):
                    continue
                body = _native(body)
                body["metadata"].setdefault("labels", {})[OWNED_LABEL] = "true"
                name = body["metadata"]["name"]
                if body["kind"] == "AdmissionPolicy":
                    policies.apply(body)
                    natives[name] = _await_native(cluster, operator, since, AdmissionPolicy, name)
                elif body["kind"] == NamespacedAdmissionPolicy.kind:
                    # The tenant's own namespace is a fresh one here.
                    body["metadata"]["namespace"] = ns = namespace()
                    created = cluster.create(NamespacedAdmissionPolicy, body)
                    assert created.ok, str(created)
                    tenant.append((ns, name))
                    natives[f"{ns}/{name}"] = _await_native(cluster, operator, since, NamespacedAdmissionPolicy,
                                                            name, ns)
        assert natives, f"{example}: no policy found"
        return _enforcement_problems(example, version, natives)
    finally:
        for ns, name in tenant:
            cluster.delete(NamespacedAdmissionPolicy, name, ns)
            cluster.wait_gone(NamespacedAdmissionPolicy, name, ns, timeout=DELETE_TIMEOUT)
        for name in policies.names:
            cluster.delete(AdmissionPolicy, name)
            cluster.wait_gone(AdmissionPolicy, name, timeout=DELETE_TIMEOUT)


@pytest.mark.parametrize("example", EXAMPLE_NAMES)
def test_example_enforced_natively_decides_as_the_webhook(
        example: str, native_target: Target, target_namespace: Callable[..., str]) -> None:
    """The example's policies with ``spec.native: Auto``: who enforces them is what ``ON_WEBHOOK`` says, and
    every case of its suite is answered as its test.yaml expects (see the module docstring)."""
    if native_target.version not in PLANES:
        pytest.skip(f"ON_WEBHOOK knows Kubernetes {PLANES}, not {native_target.version}")
    if example not in SUITES:
        problems = _status_only(native_target, example, target_namespace)
        notes = [f"status only: {NOT_REPLAYED[example]}"]
    else:
        problems, notes = _replay_natively(native_target, SUITES[example])
    version = ".".join(map(str, native_target.version))
    print(f"{example} on {version}: " + "; ".join(notes))
    if problems:
        pytest.fail(f"{example} on Kubernetes {version} ({'; '.join(notes)}):\n" + "\n".join(problems),
                    pytrace=False)
