"""Evaluating a request offline the way the API server calls its webhooks, names included.

On a CREATE with ``generateName`` and no name, the API server calls the mutating webhooks with no
name, then generates one (the prefix and 5 random characters) and calls the validating webhooks
with it in ``object.metadata.name`` and ``request.name`` (k8s.io/apiserver: ``rest.BeforeCreate``,
then ``AdmissionToValidateObjectFunc``). Offline, a validation reading ``object.metadata.name``
would otherwise fail on an object that the cluster's webhooks judge by its generated name.
"""
from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from typing import Any, NamedTuple

from ..authorization import Authorization
from ..engine import Decision, ExceptionSet, Inputs, Phase, PolicyOutcome, PolicySet, evaluate
from ..engine.request import AdmissionRequest
from .authorizer import answered

# The API server's alphabet (k8s.io/apimachinery util/rand): no vowels and no 0, 1, 3, so a
# generated suffix never spells a word.
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_RANDOM_LENGTH = 5
_MAX_NAME = 63


class Admission(NamedTuple):
    decision: Decision
    generated_name: str    # "" unless a name was generated from generateName


def generate_name(prefix: str) -> str:
    """What the API server's name generator makes of ``prefix``, seeded by the prefix itself.

    The cluster's suffix is random; offline, the same prefix always gets the same name so that
    reports and suite results are repeatable.
    """
    rng = random.Random(prefix)
    suffix = "".join(rng.choice(_ALPHABET) for _ in range(_RANDOM_LENGTH))
    return prefix[:_MAX_NAME - _RANDOM_LENGTH] + suffix


def admit(policies: PolicySet, request: AdmissionRequest, namespace: Mapping[str, Any] | None,
          inputs: Inputs | None = None, authorization: Authorization | None = None,
          exceptions: ExceptionSet | None = None, now: float | None = None) -> Admission:
    """Mutate, then validate, as the API server does; a generateName gets its name in between.
    ``inputs``: the params and context objects given in files; ``authorization``: the declared
    answers to authorizer checks (a check none covers is a DocumentError naming it);
    ``exceptions`` and ``now``: the AdmissionPolicyExceptions given, and the time they are judged at."""
    options: dict[str, Any] = {"inputs": inputs, "authorization": authorization, "exceptions": exceptions,
                               "now": now}
    if not _generates_name(request.object, request):
        return Admission(answered(evaluate(policies, request, namespace, Phase.ALL, **options)), "")
    mutated = answered(evaluate(policies, request, namespace, Phase.MUTATE, **options))
    if not mutated.allowed:
        return Admission(mutated, "")    # a mutating denial ends the request before any name exists
    final, name = _named(request, mutated.patched_object)
    validated = answered(evaluate(policies, final, namespace, Phase.VALIDATE, **options))
    return Admission(_combined(request, mutated, validated), name)


def _named(request: AdmissionRequest, body: Any) -> tuple[AdmissionRequest, str]:
    """The request the validating webhooks get for the mutated ``body``, and the name generated."""
    if not _generates_name(body, request):    # a mutation gave it a name, or took its generateName
        return dataclasses.replace(request, object=body), ""
    name = generate_name(str(body["metadata"]["generateName"]))
    named = {**body, "metadata": {**body["metadata"], "name": name}}
    return dataclasses.replace(request, name=name, object=named, raw={**request.raw, "name": name}), name


def _generates_name(body: Any, request: AdmissionRequest) -> bool:
    """A CREATE of an object that has a generateName and no name."""
    if request.operation != "CREATE" or request.sub_resource or not isinstance(body, Mapping):
        return False
    metadata = body.get("metadata")
    return (isinstance(metadata, Mapping) and not metadata.get("name")
            and isinstance(metadata.get("generateName"), str) and bool(metadata["generateName"]))


def _combined(request: AdmissionRequest, mutated: Decision, validated: Decision) -> Decision:
    """One Decision for both calls, as ``Phase.ALL`` reports one. The patch and the patched object
    are the mutations' alone: the API server, not a webhook, sets the generated name."""
    outcomes: dict[str, PolicyOutcome] = {}
    for outcome in (*mutated.outcomes, *validated.outcomes):
        earlier = outcomes.get(outcome.policy)
        outcomes[outcome.policy] = outcome if earlier is None else dataclasses.replace(
            earlier, findings=earlier.findings + outcome.findings, errors=earlier.errors + outcome.errors,
            mutated=earlier.mutated or outcome.mutated, denied=earlier.denied or outcome.denied,
            exempted=earlier.exempted + outcome.exempted)
    return dataclasses.replace(
        validated,
        warnings=tuple(dict.fromkeys(mutated.warnings + validated.warnings)),   # an exception's, said once
        audit_annotations={**mutated.audit_annotations, **validated.audit_annotations},
        patch=mutated.patch if validated.allowed else (),
        patched_object=mutated.patched_object if validated.allowed else request.object,
        outcomes=tuple(outcomes.values()),
        evaluations=mutated.evaluations + validated.evaluations,
        exempted=tuple(dict.fromkeys(mutated.exempted + validated.exempted)),
    )
