"""Native enforcement: the reconciling replica hands the policies Kubernetes can run to the API
server (``vap/native.py`` builds the objects) and takes them back when it no longer can.

Who enforces a policy is its ``status.native.enforcedBy``, which every replica's store follows
(``PolicyStore.native_scopes``): the webhooks judge a policy unless it says Native. Each switch is
make-before-break, so that no request goes unjudged:

- to Native: the generated objects are written, then *proven in effect* (a probe, below), and
  only then does the status say Native and the replicas stop routing the policy;
- to Webhook: the status says Webhook first, the webhook configurations are written with the
  policy's rules again and *proven routed* (the API server calls the operator for the one dry-run
  Event the configuration just written routes: ``webhookconfig.probe_name``), and only then are
  the generated objects deleted.

In between, both judge, and a request passes only what both admit (a mutation may be applied
by both: mutations must be idempotent, as Kubernetes asks of every mutating webhook). A generated object deleted
or edited by hand is written back (while one is missing, the webhook serves the policy); an API
no longer served, a policy switched to ``Never`` or one that stops porting goes back to the
webhook the same way. Exceptions: the generated objects leave the namespaces where an exception
for the policy is in force to the webhook, which applies it, and its expiry, to the second; with
every replica down those requests fail as the policy's failurePolicy says, so an exception never
outlives its expiry (docs/vap.md).

The probe: the API server's admission plugin loads policies and bindings from two watches, in
the order they were written. After writing, the operator rewrites a sentinel policy and binding
(``PROBE_NAME``: deny a dry-run Event named by a fresh token in its own namespace) and dry-runs
that Event until the denial carries the token: by then the plugin has every object written
before the sentinel's two. MutatingAdmissionPolicies have watches of their own, and a sentinel
of their own (it annotates another dry-run Event with the token).
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import secrets
import time
import weakref
from collections.abc import Mapping
from typing import Any, Final

from .. import api
from ..cluster.client import call_json, message_of, served_version
from ..cluster.routing import NAMESPACE_NAME_LABEL, ServedIndex, break_glass_condition
from ..engine import CompiledPolicy
from ..policyexception import within_limits
from ..vap import native as generate
from ..vap.objects import (
    BINDING,
    GROUP,
    MUTATING_BINDING,
    MUTATING_POLICY,
    MUTATING_VERSIONS,
    PLURALS,
    POLICY,
    api_path,
)
from . import conditions, metrics
from .policyio import write_status
from .state import Operator, now
from .store import object_key
from .webhookconfig import equivalent

logger = logging.getLogger(__name__)

NATIVE: Final = "Native"                 # the condition type
PROBE_NAME: Final = "admission-policy-operator.probe"
PROBE_TIMEOUT: Final = 15.0              # seconds for the API server to load what was written
INTERVAL: Final = 30.0                   # re-check at least this often (discovery, expiry)
POLICY_SETTLE: Final = 5.0               # seconds for Kubernetes 1.28 to compile what it has loaded (probe)
CONFLICT_PAUSE: Final = 0.2
MAX_CONFLICTS: Final = 5                 # status writes retried onto a status that changed meanwhile
POLL: Final = 2.0                        # how often the generated objects are listed for changes
SWITCH_TIMEOUT: Final = 30.0             # for the replicas to route a policy handed back
_BINDINGS: Final = {POLICY: BINDING, MUTATING_POLICY: MUTATING_BINDING}
_UNDECLARED_VARIABLES: Final = "undeclared reference to 'variables'"
PROBE_ANNOTATION: Final = f"{api.GROUP}/probe"
Served = dict[str, str]   # generated kind → the API version the API server serves it at


@dataclasses.dataclass(frozen=True)
class Wanted:
    """What a policy should be: Native with these objects, or Webhook for a reason."""
    native: bool
    reason: str
    message: str
    objects: tuple[dict[str, Any], ...] = ()
    handed_back: tuple[str, ...] = ()
    type_checking: tuple[dict[str, str], ...] = ()   # the API server's warnings on the objects


class _Refused(RuntimeError):
    """The API server refused a generated object as invalid (422): its CEL compiles here but not
    there (Kubernetes' stricter checks, e.g. list and map literals of one element type)."""


# The API server's refusal of a generation's objects, and its API version: that generation stays
# on the webhook rather than being tried again every pass (a new generation, or API, tries again).
_REFUSED: weakref.WeakKeyDictionary[CompiledPolicy, tuple[str, str]] = weakref.WeakKeyDictionary()


async def keep_native(op: Operator) -> None:
    """The loop: on the reconciling replica, bring every policy to what it should be; woken by a
    policy or an exception changing, and at least every ``INTERVAL`` (a generated object deleted
    or edited by hand, an API no longer served, an exception's expiry: ``_next_wake``)."""
    while True:
        policies, exceptions = op.store.policies_changed(), op.exceptions.changed()
        served: Served = {}
        wake = _next_wake(op)
        try:
            if op.store.readiness.policies_loaded.is_set() and op.exceptions.loaded.is_set() and await op.reconciles():
                served = await sync(op)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("Native enforcement: a pass failed, retrying: %s", exc)
            wake = POLL   # e.g. the API server restarting: maybe without the API it had
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(event.wait()) for event in (policies, exceptions)]
        if served:
            waits.append(asyncio.ensure_future(_generated_changed(op, served)))
        try:
            await asyncio.wait(waits, timeout=wake, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
        await asyncio.sleep(0.2)   # a burst of changes: one pass


async def _generated_changed(op: Operator, served: Served) -> None:
    """Returns once a generated object is deleted or edited by hand, or the objects can no longer be
    listed (the API server restarted without the API: the webhooks must take the policies back at
    once, it enforces them no more): a cheap labelled listing every ``POLL`` seconds (the objects
    are few; their status too, for its type checking), rather than a watch per API version."""
    seen = None
    while True:
        try:
            held = await list_generated(op, served)
        except asyncio.CancelledError:
            raise
        except Exception:
            return
        now_seen = {key: (obj["metadata"].get("resourceVersion"), obj["metadata"].get("deletionTimestamp"))
                    for key, obj in held.items() if key[1] != PROBE_NAME}
        if seen is not None and now_seen != seen:
            return
        seen = now_seen
        await asyncio.sleep(POLL)


def _next_wake(op: Operator) -> float:
    """Seconds to the next exception expiry (its namespace goes back to the generated objects), at most INTERVAL."""
    soonest = min((c.exception.expires_at for c in op.exceptions.current if c.exception.expires_at > time.time()),
                  default=time.time() + INTERVAL)
    return max(min(soonest - time.time() + 0.5, INTERVAL), 0.5)


async def sync(op: Operator) -> Served:
    """One pass over every policy; the generated kinds the API server serves, and their versions."""
    served = await served_kinds(op)
    kubernetes = await cluster_version(op)
    target = None
    if served:
        target = generate.Target(
            served[POLICY], kubernetes, ServedIndex(await op.discovery.resources()), op.config.all_exempt_namespaces,
            break_glass_condition(op.config.break_glass_users, op.config.break_glass_groups),
            served.get(MUTATING_POLICY))
    held = await list_generated(op, served)
    # The store's watch keeps every policy's status: no listing of the policies per pass.
    bodies = [_body(op, name) for name in sorted(op.store.generations)]
    known = {*op.store.generations, *op.store.rejected}
    by_owner: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
    for key, obj in held.items():
        by_owner.setdefault(_owner(obj), {})[key] = obj
    written: list[tuple[_Status, Wanted]] = []
    for body in bodies:
        name = object_key(body)
        compiled = op.store.policies.get(name)
        if compiled is None:
            continue
        mine = by_owner.get(name, {})
        wanted = decide(op, body, compiled, target)
        try:
            try:
                status = await _bring(op, body, compiled, wanted, mine)
            except _Refused as refusal:
                assert target is not None
                _REFUSED[compiled] = (target.version, str(refusal))
                wanted = decide(op, body, compiled, target)
                status = await _bring(op, body, compiled, wanted, await _held_by(op, served, name))
        except asyncio.CancelledError:
            raise
        except Exception as exc:   # one policy's trouble holds up no other
            logger.warning("Native enforcement of %s %s failed, retrying: %s", api.PolicyKey.parse(name).kind, name,
                           exc)
            continue
        if status is not None:
            written.append((status, wanted))
        elif wanted.native:
            await _Status(body).write(op, dataclasses.replace(wanted, type_checking=_type_checking(compiled, mine)))
    mutates = any(o["kind"] == MUTATING_POLICY for _, wanted in written for o in wanted.objects)
    if written and not await probe(op, served, mutates):
        logger.warning("Native enforcement: the API server did not load the generated objects within %.0fs; "
                       "the webhooks keep judging %s", PROBE_TIMEOUT, ", ".join(s.name for s, _ in written))
        written = []
    for status, wanted in written:
        await status.write(op, wanted)
    for key, obj in held.items():
        if _owner(obj) not in known and key[1] != PROBE_NAME:
            await _delete(op, _version(obj), obj)   # its policy is gone (deleted while no replica ran)
    metrics.NATIVE_POLICIES.set(len(op.store.native_scopes))
    return served


def _body(op: Operator, name: str) -> dict[str, Any]:
    """A loaded policy as far as native enforcement reads it: who it is, and its status."""
    key = api.PolicyKey.parse(name)
    metadata = {"name": key.name, "uid": op.store.uids.get(name, ""), "generation": op.store.generations[name]}
    if key.namespace:
        metadata["namespace"] = key.namespace
    return {"metadata": metadata, "status": op.store.statuses.get(name, ({}, ""))[0]}


def decide(op: Operator, body: Mapping[str, Any], compiled: CompiledPolicy,
           target: generate.Target | None) -> Wanted:
    """Native or not, and why, for this generation."""
    policy = compiled.policy
    if (policy.native or op.config.native_default) == "Never":
        where = "spec.native" if policy.native else "AP_NATIVE_DEFAULT"
        return Wanted(False, "Disabled", f"{where} is Never: the operator's webhooks judge this policy")
    if target is None:
        return Wanted(False, "APIUnavailable", "the API server serves no ValidatingAdmissionPolicy "
                                               "(admissionregistration.k8s.io v1 or v1beta1)")
    handed_back = _handed_back(op, compiled)
    if handed_back is None:
        return Wanted(False, "Exception", "an exception in force covers cluster-scoped objects or a tenant's "
                                          "namespace: the webhooks judge the policy until it ends")
    result = generate.plan(compiled, body, target, handed_back)
    if not result.native:
        return Wanted(False, "NotPortable", "; ".join(str(b) for b in result.blockers))
    refused = _REFUSED.get(compiled)
    if refused is not None and refused[0] == target.version:
        return Wanted(False, "NotPortable", f"the API server refused the generated objects: {refused[1]}")
    objects = tuple(_owned(obj, body) for obj in result.objects)
    message = "enforced by the API server: " + ", ".join(
        f"{o['kind']} {o['metadata']['name']}" for o in objects if o["kind"] in (POLICY, MUTATING_POLICY)) + \
        " (and their bindings)"
    if handed_back:
        message += f"; the webhooks judge it in {', '.join(handed_back)} (exceptions in force there)"
    return Wanted(True, "Generated", message, objects, tuple(handed_back))


def _type_checking(compiled: CompiledPolicy, held: Mapping[tuple[str, str], Mapping[str, Any]]
                   ) -> tuple[dict[str, str], ...]:
    """The type-checking warnings kube-controller-manager wrote on this generation's objects, each
    at the policy's own field (a generated object's match conditions begin with the operator's)."""
    found = []
    for (kind, name), obj in sorted(held.items()):
        annotations = obj.get("metadata", {}).get("annotations") or {}
        if kind != POLICY or annotations.get(generate.GENERATION_ANNOTATION) != str(compiled.policy.generation):
            continue
        generated = len((obj.get("spec") or {}).get("matchConditions") or ()) - len(compiled.policy.match.conditions)
        for warning in ((obj.get("status") or {}).get("typeChecking") or {}).get("expressionWarnings") or ():
            if _UNDECLARED_VARIABLES in str(warning.get("warning", "")):
                continue   # 1.28's checker declares no variables: wrong of every policy that has them
            field = str(warning.get("fieldRef", ""))
            prefix, _, rest = field.partition("[")
            if prefix == "spec.matchConditions" and rest.split("]")[0].isdigit():
                index, _, tail = rest.partition("]")
                field = f"spec.match.conditions[{int(index) - generated}]{tail}"
            found.append({"object": name, "fieldRef": field, "warning": str(warning.get("warning", ""))})
    return tuple(found)


async def _held_by(op: Operator, served: Served, name: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {key: obj for key, obj in (await list_generated(op, served)).items() if _owner(obj) == name}


def _handed_back(op: Operator, compiled: CompiledPolicy) -> list[str] | None:
    """The namespaces with an exception for this policy in force (the webhooks judge it there), or
    None when one covers more than a namespace can say (cluster-scoped objects, a tenant policy)."""
    at = time.time()
    found = sorted({c.exception.namespace for c in op.exceptions.current
                    if any(ref.name == compiled.name for ref in c.exception.policies) and c.exception.in_force(at)
                    and within_limits(c.exception, compiled.policy)})   # approved, if it must be, and allowed
    if found and (compiled.policy.namespace is not None or op.exceptions.cluster_namespace in found):
        return None
    return found


async def _bring(op: Operator, body: Mapping[str, Any], compiled: CompiledPolicy, wanted: Wanted,
                 held: Mapping[tuple[str, str], Mapping[str, Any]]) -> _Status | None:
    """Switch one policy toward ``wanted``; its status as written so far when the objects are
    written and the caller, once the probe has seen them in effect, is to set it Native."""
    status = _Status(body)
    if not wanted.native:
        if status.native:
            await _hand_back(op, status, wanted)
        else:
            await status.write(op, wanted)
            if held:   # a hand-back whose proof failed (a pass ago): prove it before the objects go
                await _await_routes(op, status.name, None)
        for obj in held.values():
            await _delete(op, _version(obj), obj)
        return None
    desired = {(obj["kind"], obj["metadata"]["name"]): obj for obj in wanted.objects}
    missing = [key for key in desired if key not in held or held[key]["metadata"].get("deletionTimestamp")]
    drifted = [key for key, obj in desired.items() if key in held and not _holds(held[key], obj)]
    # Kubernetes 1.32 refuses to update a MutatingAdmissionPolicy with variables: written anew
    # instead, as a missing one is (its policy handed back meanwhile).
    missing += [key for key in drifted if key[0] in (MUTATING_POLICY, MUTATING_BINDING)]
    # A binding outliving its policy object is not bound to the new one until written anew (1.28).
    missing += [(_BINDINGS[kind], name) for kind, name in missing if kind in _BINDINGS
                and (_BINDINGS[kind], name) not in missing and (_BINDINGS[kind], name) in desired]
    drifted = [key for key in drifted if key not in missing]
    if status.native and missing:
        # Make before break: the webhooks take the policy back while an object is missing.
        await _hand_back(op, status, Wanted(False, "Rewriting", "generated objects missing, being written back: "
                                                                + ", ".join(key[1] for key in missing)))
    elif status.native and not set(wanted.handed_back) <= status.handed_back:
        # ... and the namespaces the objects are about to leave to them, before they do.
        wider = sorted(status.handed_back | set(wanted.handed_back))
        await status.write(op, dataclasses.replace(wanted, handed_back=tuple(wider)))
        await _await_routes(op, object_key(body), frozenset(wider))
    for key in missing:
        if key in held:   # deleted by hand, held by our finalizer until now: let it go, then write it anew
            await _delete(op, _version(held[key]), held[key])
        await _write(op, _version(desired[key]), desired[key], None)
    for key in drifted:
        await _write(op, _version(desired[key]), desired[key], held[key])
    for key, obj in held.items():
        if key not in desired:
            await _delete(op, _version(obj), obj)
    body_native = (body.get("status") or {}).get("native") or {}
    changed = missing or drifted or not status.native or status.handed_back != set(wanted.handed_back) \
        or body_native.get("generation") != compiled.policy.generation
    return status if changed else None


class _Status:
    """A policy's status as last read or written in this pass."""

    def __init__(self, body: Mapping[str, Any]) -> None:
        self.body = body
        self.status = dict(body.get("status") or {})

    @property
    def name(self) -> str:
        return object_key(self.body)

    @property
    def native(self) -> bool:
        return bool((self.status.get("native") or {}).get("enforcedBy") == "Native")

    @property
    def handed_back(self) -> set[str]:
        return set((self.status.get("native") or {}).get("handedBack") or ())

    async def write(self, op: Operator, wanted: Wanted) -> None:
        """status.native and the Native condition, written only when they change, onto the status
        as last watched and only if it is still that (its resourceVersion): the conditions list is
        written whole, and reconciliation writes it too."""
        generation = int(self.body["metadata"].get("generation") or 0)
        native: dict[str, Any] = {
            "enforcedBy": "Native" if wanted.native else "Webhook", "reason": wanted.reason, "message": wanted.message,
            "generation": generation, "handedBack": list(wanted.handed_back),
            "objects": [{"apiVersion": o["apiVersion"], "kind": o["kind"], "name": o["metadata"]["name"]}
                        for o in wanted.objects], "typeChecking": list(wanted.type_checking)}
        old = self.status.get("native") or {}
        if self._written(native, wanted):
            return
        condition = conditions.Condition(NATIVE, "True" if wanted.native else "False", wanted.reason, wanted.message)
        for _ in range(MAX_CONFLICTS):
            watched, version = op.store.statuses.get(self.name, ({}, ""))
            self.status = dict(watched)
            previous = [c for c in self.status.get("conditions") or [] if isinstance(c, Mapping)]
            mine = next((c for c in previous if c.get("type") == NATIVE), None)
            patch = {"native": native, "conditions": [c for c in previous if c.get("type") != NATIVE] + [
                conditions.condition_entry(mine, condition, generation, now())]}
            if await write_status(op.api_client, self.name, patch, version or None):
                self.status.update(patch)
                break
            await asyncio.sleep(CONFLICT_PAUSE)   # the watch brings the newer status
        else:
            raise RuntimeError(f"the status of {self.name} kept changing during {MAX_CONFLICTS} attempts")
        if wanted.native and old.get("enforcedBy") != "Native":
            logger.info("%s %s: enforced natively (%s)", api.PolicyKey.parse(self.name).kind, self.name, wanted.message)
            await op.events.post_policy(op.api_client, self.name, self.body["metadata"].get("uid"), type_="Normal",
                                        reason="EnforcedNatively", message=wanted.message)
            metrics.NATIVE_SWITCHES.labels(to="Native").inc()

    def _written(self, native: Mapping[str, Any], wanted: Wanted) -> bool:
        """Whether the status (as last seen) already says this."""
        old = self.status.get("native") or {}
        mine = next((c for c in self.status.get("conditions") or [] if isinstance(c, Mapping)
                     and c.get("type") == NATIVE), None)
        return {key: old.get(key) for key in native} == native and mine is not None \
            and (mine.get("reason"), mine.get("message")) == (wanted.reason, wanted.message)


async def _hand_back(op: Operator, status: _Status, wanted: Wanted) -> None:
    """Status Webhook, then wait until the webhook configurations route the policy again."""
    await status.write(op, wanted)
    await _await_routes(op, status.name, None)
    logger.info("%s %s: handed back to the webhooks (%s)", api.PolicyKey.parse(status.name).kind, status.name,
                wanted.message)
    await op.events.post_policy(op.api_client, status.name, status.body["metadata"].get("uid"), type_="Normal",
                                reason="EnforcedByWebhook", message=wanted.message)
    metrics.NATIVE_SWITCHES.labels(to="Webhook").inc()


async def _await_routes(op: Operator, name: str, scope: frozenset[str] | None) -> None:
    """Until this replica's store follows the status just written (``scope``: the namespaces left
    to the webhooks, None for all) and a configuration write after that has gone through."""
    deadline = time.monotonic() + SWITCH_TIMEOUT
    while op.store.native_scopes.get(name) != scope:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the status of {name} was not seen within {SWITCH_TIMEOUT:.0f}s")
        await asyncio.sleep(0.1)
    count = op.store.registration.writes
    op.store.changed.set()
    if not await op.store.registration.wait_write_after(count, max(deadline - time.monotonic(), 1.0)):
        raise RuntimeError(f"the webhook configurations were not written within {SWITCH_TIMEOUT:.0f}s")
    # The API server reads webhook configurations from a watch: proven loaded once it calls the
    # operator for the one request the configuration just written routes (``webhookconfig``).
    probe = op.store.registration.probe
    while time.monotonic() < deadline:
        code, answer = await _dry_run_event(op, probe)
        if code == 409 and f"probe {probe}" in message_of(answer):   # admission.probe's refusal
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the API server did not route by the webhook configurations written within "
                       f"{SWITCH_TIMEOUT:.0f}s (its probe {probe} never reached the operator)")


def _version(obj: Mapping[str, Any]) -> str:
    return str(obj["apiVersion"]).rpartition("/")[2]


def _owned(obj: dict[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """An AdmissionPolicy owns its objects (the garbage collector removes them with it, should it be
    deleted while no replica runs); a NamespacedAdmissionPolicy cannot own cluster-scoped ones, and
    its objects go by their labels (its finalizer, or the next pass's sweep)."""
    metadata = body["metadata"]
    if metadata.get("namespace"):
        return obj
    owner = {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": metadata["name"], "uid": metadata["uid"]}
    return {**obj, "metadata": {**obj["metadata"], "ownerReferences": [owner]}}


def _owner(obj: Mapping[str, Any]) -> str:
    annotations = obj.get("metadata", {}).get("annotations") or {}
    if generate.POLICY_ANNOTATION in annotations:
        return str(annotations[generate.POLICY_ANNOTATION])
    labels = obj.get("metadata", {}).get("labels") or {}
    return str(api.PolicyKey.policy(labels.get(generate.POLICY_NAMESPACE_LABEL),
                                    labels.get(generate.POLICY_NAME_LABEL, "")))


def _holds(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    meta, want = existing.get("metadata", {}), desired["metadata"]
    held = generate.FINALIZER in (meta.get("finalizers") or ()) or generate.FINALIZER not in want.get("finalizers", ())
    return held and equivalent(
        existing.get("spec") or {}, desired["spec"]) and all(
        (meta.get("labels") or {}).get(k) == v for k, v in want["labels"].items()) and all(
        (meta.get("annotations") or {}).get(k) == v for k, v in want.get("annotations", {}).items())


# ---- the API ----------------------------------------------------------------------------------


async def served_kinds(op: Operator) -> Served:
    """The generated kinds the API server serves, each at its newest version: none without
    ValidatingAdmissionPolicy; MutatingAdmissionPolicy's where served (behind a gate, or none)."""
    call = functools.partial(call_json, op.api_client)
    validating = await served_version(call, GROUP, generate.VALIDATING_VERSIONS, PLURALS[POLICY])
    if validating is None:
        return {}
    served = dict.fromkeys((POLICY, BINDING), validating)
    changing = await served_version(call, GROUP, MUTATING_VERSIONS, PLURALS[MUTATING_POLICY])
    if changing is not None:
        served.update(dict.fromkeys((MUTATING_POLICY, MUTATING_BINDING), changing))
    return served


async def cluster_version(op: Operator) -> tuple[int, int]:
    code, answer = await call_json(op.api_client, "GET", "/version")
    if not 200 <= code <= 299:
        raise RuntimeError(f"reading the API server's version failed ({code}): {message_of(answer)}")
    major = int("".join(ch for ch in str(answer.get("major", "1")) if ch.isdigit()) or 1)
    minor = int("".join(ch for ch in str(answer.get("minor", "0")) if ch.isdigit()) or 0)
    return major, minor


async def list_generated(op: Operator, served: Served) -> dict[tuple[str, str], dict[str, Any]]:
    """The generated objects the API server holds, by (kind, name)."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    selector = ",".join(f"{k}={v}" for k, v in generate.MANAGED_BY.items())
    for kind, version in served.items():
        code, answer = await call_json(op.api_client, "GET", api_path(version, kind),
                                       query=[("labelSelector", selector)])
        if not 200 <= code <= 299:
            raise RuntimeError(f"listing {kind}s failed ({code}): {message_of(answer)}")
        for item in answer.get("items", []):
            item.setdefault("apiVersion", f"{GROUP}/{version}")
            item.setdefault("kind", kind)
            found[kind, item["metadata"]["name"]] = item
    return found


async def _write(op: Operator, version: str, desired: Mapping[str, Any], existing: Mapping[str, Any] | None) -> None:
    kind, name = desired["kind"], desired["metadata"]["name"]
    if existing is None:
        code, answer = await call_json(op.api_client, "POST", api_path(version, kind), body=dict(desired))
    else:
        body = {**desired, "metadata": {**desired["metadata"],
                                        "resourceVersion": existing["metadata"].get("resourceVersion")}}
        code, answer = await call_json(op.api_client, "PUT", api_path(version, kind, name), body=body)
    if code == 422:
        raise _Refused(f"{kind} {name}: {message_of(answer)}")
    if not 200 <= code <= 299:
        raise RuntimeError(f"writing {kind} {name} failed ({code}): {message_of(answer)}")
    logger.info("%s %s %s", "Created" if existing is None else "Updated", kind, name)


async def _delete(op: Operator, version: str, obj: Mapping[str, Any]) -> None:
    """Release our finalizer, delete, and wait until it is gone (a name written anew must be free)."""
    kind, name = obj["kind"], obj["metadata"]["name"]
    path = api_path(version, kind, name)
    held: Mapping[str, Any] = obj
    for _ in range(MAX_CONFLICTS):
        if generate.FINALIZER not in (held["metadata"].get("finalizers") or ()):
            break
        kept = [f for f in held["metadata"]["finalizers"] if f != generate.FINALIZER]
        code, answer = await call_json(op.api_client, "PATCH", path, body={"metadata": {
            "finalizers": kept or None, "resourceVersion": held["metadata"].get("resourceVersion")}},
            content_type="application/merge-patch+json")
        if code == 409:   # changed meanwhile (another pass, the deletion handler): read it again
            code, answer = await call_json(op.api_client, "GET", path)
            if code == 404:
                return
            if not 200 <= code <= 299:
                raise RuntimeError(f"reading {kind} {name} failed ({code}): {message_of(answer)}")
            held = answer
            continue
        if not 200 <= code <= 299 and code != 404:
            raise RuntimeError(f"releasing {kind} {name} failed ({code}): {message_of(answer)}")
        break
    else:
        raise RuntimeError(f"{kind} {name} kept changing while being released")
    code, answer = await call_json(op.api_client, "DELETE", path)
    if not 200 <= code <= 299 and code != 404:
        raise RuntimeError(f"deleting {kind} {name} failed ({code}): {message_of(answer)}")
    deadline = time.monotonic() + SWITCH_TIMEOUT
    while (await call_json(op.api_client, "GET", path))[0] != 404:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{kind} {name} is still there {SWITCH_TIMEOUT:.0f}s after its deletion")
        await asyncio.sleep(0.1)
    logger.info("Deleted %s %s", kind, name)


async def remove(op: Operator, name: str) -> None:
    """Delete a policy's generated objects (its deletion: the webhooks have unrouted it already)."""
    for obj in (await _held_by(op, await served_kinds(op), name)).values():
        await _delete(op, _version(obj), obj)


async def probe(op: Operator, served: Served, mutates: bool) -> bool:
    """Whether the API server has loaded everything written so far (see the module's docstring):
    its ValidatingAdmissionPolicies, and (``mutates``) its MutatingAdmissionPolicies, which it
    loads from watches of their own."""
    token = f"probe-{secrets.token_hex(8)}"
    sentinels = [_sentinel(op, served[POLICY], (POLICY, BINDING), token, {
        "validations": [{"expression": "false", "message": token, "reason": "Forbidden"}]}, {
        "validationActions": ["Deny"]})]
    if mutates:
        annotations = {PROBE_ANNOTATION: token}
        sentinels.append(_sentinel(op, served[MUTATING_POLICY], (MUTATING_POLICY, MUTATING_BINDING), f"{token}-m", {
            "reinvocationPolicy": "Never", "mutations": [{"patchType": "JSONPatch", "jsonPatch": {
                "expression": f"[JSONPatch{{op: 'add', path: '/metadata/annotations', value: {annotations!r}}}]"}}]},
            {}))
    held = await list_generated(op, served)
    for obj in (o for pair in sentinels for o in pair):
        await _write(op, _version(obj), obj, held.get((str(obj["kind"]), PROBE_NAME)))
    deadline = time.monotonic() + PROBE_TIMEOUT
    waiting = {token, f"{token}-m"} if mutates else {token}
    while time.monotonic() < deadline:
        for name in sorted(waiting):
            code, answer = await _dry_run_event(op, name)
            refused = code == 403 and token in message_of(answer)   # the sentinel's (an invalid Event is a 422)
            mutated = 200 <= code <= 299 and \
                ((answer.get("metadata") or {}).get("annotations") or {}).get(PROBE_ANNOTATION) == token
            if refused if name == token else mutated:
                waiting.discard(name)
        if not waiting:
            # Kubernetes 1.28 compiles each policy and binding on a work queue of its own after the
            # watch delivers it: the sentinel's may come first. Give the others the time they take.
            await asyncio.sleep(POLICY_SETTLE)
            return True
        await asyncio.sleep(0.2)
    return False


def _sentinel(op: Operator, version: str, kinds: tuple[str, str], name: str, spec: dict[str, Any],
              binding: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A probe's policy and binding: for the dry-run Event ``name`` alone, in the operator's namespace."""
    events = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["events"]}
    metadata = {"name": PROBE_NAME, "labels": dict(generate.MANAGED_BY)}
    policy = {"apiVersion": f"{GROUP}/{version}", "kind": kinds[0], "metadata": metadata, "spec": {
        "failurePolicy": "Fail", **spec, "matchConstraints": {
            "resourceRules": [events],
            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: op.config.namespace}}}}}
    bound = {"apiVersion": f"{GROUP}/{version}", "kind": kinds[1], "metadata": dict(metadata), "spec": {
        "policyName": PROBE_NAME, **binding,
        "matchResources": {"resourceRules": [{**events, "resourceNames": [name]}]}}}
    return policy, bound


async def _dry_run_event(op: Operator, name: str) -> tuple[int, Any]:
    """A valid Event (an invalid one is refused before admission), dry run: nothing is stored."""
    namespace = op.config.namespace
    event = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": namespace},
             "involvedObject": {"apiVersion": "v1", "kind": "ConfigMap", "namespace": namespace, "name": name},
             "reason": "Probe", "message": "dry run", "type": "Normal"}
    return await call_json(op.api_client, "POST", f"/api/v1/namespaces/{namespace}/events",
                           query=[("dryRun", "All")], body=event)

