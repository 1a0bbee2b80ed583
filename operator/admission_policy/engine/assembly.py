"""The last stage: the policies' verdicts become one ``Decision``.

A policy denies when it could not be evaluated under failurePolicy Fail, or when it enforces
and a validation failed; Warn failures become warnings, Audit ones audit annotations. Every
denial is in the message, each naming its policy (and, for a Pod policy on a workload, whose
Pod template it judged). The patch is sent only when nothing denies.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from ..api import REASON_CODES
from .compiler import CompiledPolicy
from .exceptions import Exemption
from .patching import diff
from .podcontrollers import BY_RESOURCE
from .request import AdmissionRequest
from .verdicts import Decision, PolicyOutcome, PolicyVerdict, Work


def decide(request: AdmissionRequest, final: Any, verdicts: Iterable[tuple[CompiledPolicy, PolicyVerdict]],
           work: Work, exempted: tuple[Exemption, ...] = ()) -> Decision:
    """``final``: the object as the mutations left it; ``exempted``: what exceptions waived."""
    outcomes: list[PolicyOutcome] = []
    denials: list[str] = []
    warnings: list[str] = []
    audit: dict[str, str] = {}
    reason = ""
    for policy, verdict in verdicts:
        name, enforcement = policy.name, policy.policy.enforcement
        failures = tuple(finding.message for finding in verdict.findings)
        denied = verdict.fatal or (enforcement == "Enforce" and bool(failures))
        # A Pod policy on a workload says whose Pod template it judged.
        workload = _workload(request, final) if policy.template else ""
        about = f"the Pod template of {workload} would violate the policy: " if workload else ""
        kind = policy.policy.kind
        if verdict.fatal:
            what = f"the Pod template of {workload}" if workload else "the request"
            denials.append(f'{kind} "{name}" could not evaluate {what}: {verdict.errors[-1].text}')
        elif denied:
            denials.append(f'{kind} "{name}" denied the request: {about}{"; ".join(failures)}')
        elif failures and enforcement == "Warn":
            warnings.extend(f'{kind} "{name}": {about}{failure}' for failure in failures)
        elif failures and enforcement == "Audit":
            # The API server prefixes the key with the webhook's name and a "/": one "/" only.
            audit[name.replace("/", ".")[:63]] = json.dumps([about + failure for failure in failures])
        if denied and not reason:
            reason = verdict.reason or "Forbidden"
        waived = tuple(e for e in exempted if e.policy == name) if exempted else ()
        outcomes.append(PolicyOutcome(name, enforcement, tuple(verdict.findings), verdict.texts(),
                                      verdict.mutated, denied, workload, waived))
    if denials:
        return Decision(allowed=False, code=REASON_CODES.get(reason, 500), reason=reason,
                        message="\n".join(denials), warnings=tuple(warnings), audit_annotations=audit,
                        patched_object=request.object, outcomes=tuple(outcomes), evaluations=work.evaluations,
                        plugin_calls=tuple(work.plugin_calls), exempted=exempted)
    patch: tuple[Mapping[str, Any], ...] = ()
    if final is not request.object:
        # Every value a mutation adds is checked to be JSON (no NaN, no Infinity) where it comes from.
        patch = tuple(diff(request.object, final))
    # The person applying sees that only an exception let the request through, and until when.
    warnings.extend(dict.fromkeys(e.warning for e in exempted))
    return Decision(allowed=True, warnings=tuple(warnings), audit_annotations=audit, patch=patch,
                    patched_object=final, outcomes=tuple(outcomes), evaluations=work.evaluations,
                    plugin_calls=tuple(work.plugin_calls), exempted=exempted)


def _workload(request: AdmissionRequest, obj: Any) -> str:
    """``Deployment "web"``: the kind and name of the workload a request writes."""
    controller = BY_RESOURCE.get((request.group, request.resource))
    kind = controller.kind if controller else request.resource
    name = request.name
    if not name:
        metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
        found = metadata.get("name") or metadata.get("generateName") if isinstance(metadata, Mapping) else None
        name = found if isinstance(found, str) else ""
    return f'{kind} "{name}"' if name else kind
