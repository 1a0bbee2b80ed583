"""An AdmissionPolicy's status: conditions are the observations, the phase only sums them up.

Pure functions, so the state machine is tested without a cluster:

    (new) → Pending → Active ⇄ Degraded
               ↘ Failed (compile error; a new generation → Pending)
    any → Terminating (deletionTimestamp)
"""
from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

Phase = Literal["Pending", "Active", "Degraded", "Failed", "Terminating"]
ConditionStatus = Literal["True", "False", "Unknown"]

COMPILED: Final = "Compiled"
REGISTERED: Final = "Registered"
READY: Final = "Ready"
PLUGINS_ENABLED: Final = "PluginsEnabled"
GATED_OFF: Final = "FeatureGateDisabled"
INPUTS_SYNCED: Final = "InputsSynced"
NOT_SYNCED: Final = "NotSynced"
OVER_MAX_OBJECTS: Final = "OverMaxObjects"
TYPE_CHECKED: Final = "TypeChecked"
_OWN_CONDITIONS: Final = frozenset({COMPILED, REGISTERED, READY, PLUGINS_ENABLED, INPUTS_SYNCED, TYPE_CHECKED})

# Registered=False for this reason is the operator's own trouble (its webhook configurations were
# deleted or edited and cannot be written back), retried by itself: Pending, not Degraded, which
# means "the user can fix the policy".
REGISTRATION_LOST: Final = "RegistrationLost"


@dataclasses.dataclass(frozen=True)
class Condition:
    """One status condition as the operator decides it; ``status_patch`` adds the times and
    the generation, keeping a transition time while the status stays the same."""
    type: str
    status: ConditionStatus
    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class Observation:
    """What reconciliation found out about one generation of a policy."""
    compiled: Condition
    registered: Condition
    # What a compiled generation does to the Pod templates of workloads (``Coverage.as_status``;
    # None: nothing, it matches no pods), written only when ``reports_pod_controllers``: an
    # observation rebuilt from the status alone (registration lost) leaves it as it is.
    pod_controllers: Mapping[str, Any] | None = None
    reports_pod_controllers: bool = False
    # PluginsEnabled: False when a plugin the policy uses is switched off by a feature gate (its
    # rules are skipped): Degraded, which the user fixes with --feature-gates. None: not observed
    # (a status rebuilt from itself), the written condition stays.
    plugins: Condition | None = None
    reports_plugins: bool = False   # True: observed; a policy without plugins has no such condition
    # InputsSynced: False while a cache of the policy's params or context (operator/sources.py) has
    # not listed, or its watch is down, or a context holds more than its maxObjects somewhere:
    # Degraded, because the requests that read it get the failurePolicy answer meanwhile (never a
    # stale or cut list). None: the policy reads neither.
    inputs: Condition | None = None
    reports_inputs: bool = False
    # TypeChecked (``operator/typechecking.py``) and the warnings behind it, as a
    # ValidatingAdmissionPolicy's ``status.typeChecking.expressionWarnings``: never a change of
    # phase. None: not observed (a status rebuilt from itself), what was written stays.
    type_checked: Condition | None = None
    type_warnings: tuple[Mapping[str, str], ...] = ()

    @property
    def phase(self) -> Phase:
        if self.compiled.status == "False":
            return "Failed"
        if self.plugins is not None and self.plugins.status == "False":
            return "Degraded"
        if self.inputs is not None and self.inputs.status == "False" and self.registered.status == "True":
            return "Degraded"
        if self.registered.status == "False" and self.registered.reason != REGISTRATION_LOST:
            return "Degraded"
        if self.compiled.status == "True" and self.registered.status == "True":
            return "Active"
        return "Pending"

    @property
    def ready(self) -> Condition:
        if self.compiled.status == "True" and self.registered.status == "True":
            if self.plugins is not None and self.plugins.status == "False":
                return Condition(READY, "False", self.plugins.reason, self.plugins.message)
            if self.inputs is not None and self.inputs.status == "False":
                return Condition(READY, "False", self.inputs.reason, self.inputs.message)
            return Condition(READY, "True", "Enforced", "the policy is enforced for every resource it matches")
        blocking = self.compiled if self.compiled.status != "True" else self.registered
        status: ConditionStatus = "Unknown" if blocking.status == "Unknown" else "False"
        return Condition(READY, status, blocking.reason, blocking.message)


def from_status(status: Mapping[str, Any] | None, type_: str) -> Condition | None:
    """A condition as written in a status, or None when absent."""
    for found in (status or {}).get("conditions") or []:
        if isinstance(found, Mapping) and found.get("type") == type_:
            state = found.get("status")
            return Condition(type_, state if state in ("True", "False") else "Unknown",
                             str(found.get("reason") or ""), str(found.get("message") or ""))
    return None


def plugins_condition(gated_off: tuple[str, ...], used: int) -> Condition | None:
    """PluginsEnabled, from what the compiler found switched off (``CompiledPolicy.gated_off``);
    None for a policy that uses no plugin."""
    if not used:
        return None
    if gated_off:
        return Condition(PLUGINS_ENABLED, "False", GATED_OFF, "; ".join(gated_off) + " (enable it with "
                         "--feature-gates, AP_FEATURE_GATES or the chart's featureGates value)")
    return Condition(PLUGINS_ENABLED, "True", "Enabled", f"{used} plugin rule(s), all enabled")


def inputs_condition(unsynced: Sequence[str], over_cap: Sequence[str]) -> Condition:
    """InputsSynced of a policy that reads params or context, from the caches' problems for it
    (``Sources.problems``): sources not in sync, contexts over their maxObjects. Messages hold no
    relative times: an unchanged state writes nothing."""
    parts = []
    if unsynced:
        parts.append("; ".join(unsynced) + "; requests that read them get the failurePolicy answer until they are "
                     "(check the operator's RBAC: the chart's rbac.contextResources)")
    if over_cap:
        parts.append("; ".join(over_cap) + "; requests that read it there get the failurePolicy answer (raise "
                     "maxObjects, or narrow the context with scope: RequestNamespace or a labelSelector)")
    if parts:
        return Condition(INPUTS_SYNCED, "False", NOT_SYNCED if unsynced else OVER_MAX_OBJECTS, "; ".join(parts))
    return Condition(INPUTS_SYNCED, "True", "Synced", "params and context are listed and watched")


def pending(reason: str = "Reconciling", message: str = "the operator is loading this generation") -> Observation:
    """The status of a generation not judged yet: Unknown, so nothing reads it as Ready or failed."""
    unknown = Condition(COMPILED, "Unknown", reason, message)
    return Observation(unknown, Condition(REGISTERED, "Unknown", reason, message))


def status_patch(
    old_status: Mapping[str, Any] | None,
    observation: Observation,
    generation: int,
    now: datetime.datetime,
) -> dict[str, Any]:
    """The status to write: transition times move only when a condition's status changes."""
    previous = {c.get("type"): c for c in (old_status or {}).get("conditions") or [] if isinstance(c, Mapping)}
    conditions = [condition_entry(previous.get(c.type), c, generation, now)
                  for c in (observation.compiled, observation.registered, observation.ready)]
    if observation.plugins is not None:
        conditions.append(condition_entry(previous.get(PLUGINS_ENABLED), observation.plugins, generation, now))
    elif PLUGINS_ENABLED in previous and not observation.reports_plugins:
        conditions.append(dict(previous[PLUGINS_ENABLED]))
    if observation.inputs is not None:
        conditions.append(condition_entry(previous.get(INPUTS_SYNCED), observation.inputs, generation, now))
    elif INPUTS_SYNCED in previous and not observation.reports_inputs:
        conditions.append(dict(previous[INPUTS_SYNCED]))
    if observation.type_checked is not None:
        conditions.append(condition_entry(previous.get(TYPE_CHECKED), observation.type_checked, generation, now))
    elif TYPE_CHECKED in previous:
        conditions.append(dict(previous[TYPE_CHECKED]))
    # A condition another writer owns (native enforcement's ``Native``) stays as it was.
    conditions += [dict(c) for kind, c in previous.items() if kind not in _OWN_CONDITIONS]
    patch: dict[str, Any] = {"phase": observation.phase, "observedGeneration": generation, "conditions": conditions}
    if observation.type_checked is not None:
        patch["typeChecking"] = {"expressionWarnings": [dict(w) for w in observation.type_warnings]}
    if observation.reports_pod_controllers:   # a merge patch: None removes what an older generation had
        patch["podControllers"] = dict(observation.pod_controllers) if observation.pod_controllers else None
    return patch


def terminating_patch(old_status: Mapping[str, Any] | None, now: datetime.datetime) -> dict[str, Any]:
    """The status while a deleted policy is unrouted: Ready is False, the other conditions stay
    as they were (they still describe the generation being removed)."""
    message = "the policy is being removed from the webhook configurations"
    previous = {c.get("type"): c for c in (old_status or {}).get("conditions") or [] if isinstance(c, Mapping)}
    ready = Condition(READY, "False", "Terminating", message)
    generation = int((old_status or {}).get("observedGeneration") or 0)
    conditions = [c for c in (old_status or {}).get("conditions") or [] if c.get("type") != READY]
    conditions.append(condition_entry(previous.get(READY), ready, generation, now))
    return {"phase": "Terminating", "conditions": conditions}


def condition_entry(previous: Mapping[str, Any] | None, condition: Condition, generation: int,
               now: datetime.datetime) -> dict[str, Any]:
    unchanged = previous is not None and previous.get("status") == condition.status
    since = previous.get("lastTransitionTime") if unchanged and previous is not None else None
    return {
        "type": condition.type,
        "status": condition.status,
        "reason": condition.reason,
        "message": condition.message,
        "lastTransitionTime": since or now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "observedGeneration": generation,
    }
