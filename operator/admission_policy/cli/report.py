"""Human-readable and JSON renderings of decisions and suite results."""
from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import yaml

from ..engine import Decision

if TYPE_CHECKING:
    from .suite import SuiteResult


def yaml_diff(before: Any, after: Any, old_name: str = "before", new_name: str = "after") -> str:
    """A unified diff of two objects rendered as YAML: how a mutation reads in review."""
    old = yaml.safe_dump(before, sort_keys=True).splitlines(keepends=True) if before is not None else []
    new = yaml.safe_dump(after, sort_keys=True).splitlines(keepends=True) if after is not None else []
    return "".join(difflib.unified_diff(old, new, old_name, new_name))


def generated_name_text(name: str) -> str:
    """Says where a name the object does not carry came from, so no one hunts for it in their files."""
    return (f"metadata.name {name!r} generated from generateName, as the API server does before "
            "validating webhooks (offline, a prefix always gets the same name)")


def decision_text(title: str, decision: Decision, original: Any, generated_name: str = "") -> str:
    verdict = "ALLOWED" if decision.allowed else f"DENIED ({decision.code} {decision.reason})"
    if decision.allowed and decision.warnings:
        verdict = "ALLOWED with warnings"
    lines = [f"{title}: {verdict}"]
    if generated_name:
        lines.append(f"  {generated_name_text(generated_name)}")
    if not decision.outcomes:
        lines.append("  no policy matched")
    for outcome in decision.outcomes:
        judged = f", the Pod template of {outcome.template_of}" if outcome.template_of else ""
        lines.append(f"  {outcome.policy} ({outcome.enforcement}{judged}): {outcome.result}")
        lines.extend(f"    - {failure}" for failure in outcome.failures)
        # Under failurePolicy Fail an error is also a failure: print it once, as the failure.
        lines.extend(f"    ! error: {error}" for error in outcome.errors if error not in outcome.failures)
    lines.extend(f"  warning: {warning}" for warning in decision.warnings)
    lines.extend(f"  audit {key}: {value}" for key, value in decision.audit_annotations.items())
    if decision.patch:
        lines.append("  mutation:")
        diff = yaml_diff(original, decision.patched_object)
        lines.extend(f"    {line}" for line in diff.splitlines())
    return "\n".join(lines)


def decision_json(source: str, decision: Decision, generated_name: str = "") -> dict[str, Any]:
    return {
        "input": source,
        "generatedName": generated_name or None,
        "allowed": decision.allowed,
        "code": decision.code,
        "reason": decision.reason,
        "message": decision.message,
        "warnings": list(decision.warnings),
        "auditAnnotations": dict(decision.audit_annotations),
        "patch": list(decision.patch),
        "policies": [
            {"name": o.policy, "enforcement": o.enforcement, "result": o.result, "failures": list(o.failures),
             **({"podTemplateOf": o.template_of} if o.template_of else {}),
             "errors": list(o.errors), "mutated": o.mutated}
            for o in decision.outcomes
        ],
    }


def suites_text(results: Iterable[SuiteResult]) -> str:
    lines = []
    for suite in results:
        lines.append(f"{suite.source} ({suite.name})")
        for case in suite.cases:
            lines.append(f"  {'PASS' if case.passed else 'FAIL'}  {case.name}")
            if case.generated_name:
                lines.append(f"        {generated_name_text(case.generated_name)}")
            for problem in case.problems:
                first, *rest = problem.splitlines()
                lines.append(f"        {first}")
                lines.extend(f"          {line}" for line in rest)
    return "\n".join(lines)


def suites_json(results: Iterable[SuiteResult]) -> list[dict[str, Any]]:
    return [
        {"suite": s.source, "name": s.name,
         "cases": [{"name": c.name, "passed": c.passed, "problems": list(c.problems),
                    "decision": decision_json(c.name, c.decision, c.generated_name) if c.decision else None}
                   for c in s.cases]}
        for s in results
    ]
