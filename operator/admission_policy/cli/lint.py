"""``admission-policy lint``: compile policies as the operator's webhook does at `kubectl apply`.

For CI pipelines: nothing is evaluated, every file is read even when an earlier one is broken,
and every problem is one line naming the file, the policy, the field path and the column. Each
policy that compiles is also judged for portability to a ValidatingAdmissionPolicy
(``vap.portability``), after the compile results, so that those keep their place for scripts.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .. import api
from ..vap.portability import Portability, portability
from .documents import (
    Document,
    DocumentError,
    compile_document,
    duplicate_policy,
    gated_off_warnings,
    object_name,
    read_documents,
    walk,
)


@dataclasses.dataclass(frozen=True)
class LintResult:
    source: str                  # the file, or "file#N" for a document of a stream
    policy: str                  # the policy's name; "" when a file could not be read
    errors: tuple[str, ...]      # one line each; none when the policy compiles
    warnings: tuple[str, ...] = ()   # plugin rules a feature gate switches off (skipped, not an error)
    portability: Portability | None = None   # for a policy that compiles

    @property
    def ok(self) -> bool:
        return not self.errors


def lint_policies(paths: Iterable[str]) -> list[LintResult]:
    """Every AdmissionPolicy under ``paths``, compiled; a duplicate name is an error, as the
    cluster would keep only one of them."""
    seen: dict[str, str] = {}
    results: list[LintResult] = []
    for root in paths:
        results.extend(_lint_root(root, seen))
    return results


def _lint_root(root: str, seen: dict[str, str]) -> list[LintResult]:
    in_directory = Path(root).is_dir()
    try:
        files = list(walk(Path(root)))
    except DocumentError as exc:
        return [LintResult(root, "", (str(exc),))]
    results: list[LintResult] = []
    for file in files:
        try:
            documents = read_documents(file, allow_empty=in_directory)
        except DocumentError as exc:
            results.append(LintResult(str(file), "", (str(exc),)))
            continue
        results.extend(_lint_document(document, seen) for document in documents if document.kind == api.KIND)
    if not results:
        results.append(LintResult(root, "", (f"{root}: no AdmissionPolicy found",)))
    return results


def _lint_document(document: Document, seen: dict[str, str]) -> LintResult:
    name = object_name(document.body)
    try:
        policy = compile_document(document)
    except DocumentError as exc:
        return LintResult(document.source, name, tuple(str(exc).splitlines()))
    if policy.name in seen:
        return LintResult(document.source, policy.name, (duplicate_policy(document, policy.name, seen[policy.name]),))
    seen[policy.name] = document.source
    return LintResult(document.source, policy.name, (), tuple(gated_off_warnings(document, policy)),
                      portability(policy, document.body))


def lint_text(results: list[LintResult]) -> str:
    lines = []
    for result in results:
        if result.ok:
            lines.append(f"ok     {result.source}: AdmissionPolicy {result.policy!r}")
        lines.extend(f"warn   {warning}" for warning in result.warnings)
        lines.extend(f"error  {error}" for error in result.errors)
    failed = sum(not result.ok for result in results)
    skipping = sum(bool(result.warnings) for result in results)
    lines.append(f"\n{len(results) - failed} compiled, {failed} with errors"
                 + (f", {skipping} with plugin rules a feature gate switches off" if skipping else ""))
    judged = [result for result in results if result.portability is not None]
    if judged:
        lines += ["", "As a ValidatingAdmissionPolicy:"]
        lines += [line for result in judged for line in _portability_lines(result)]
        portable = sum(result.portability.portable for result in judged if result.portability is not None)
        lines.append(f"\n{portable} of {len(judged)} portable to ValidatingAdmissionPolicy")
    return "\n".join(lines)


def _portability_lines(result: LintResult) -> list[str]:
    """``portable``, or one ``not portable`` line per obstacle; then what ports with a translation."""
    verdict = result.portability
    assert verdict is not None
    policy = f"{result.source}: AdmissionPolicy {result.policy!r}"
    if verdict.portable:
        needs = f" (Kubernetes {verdict.kubernetes} or later)" if verdict.needs else ""
        lines = [f"portable      {policy}{needs}"]
        lines += [f"needs         {policy}: {finding}" for finding in verdict.needs]
    else:
        lines = [f"not portable  {policy}: {finding}" for finding in verdict.blockers]
    return lines + [f"note          {policy}: {finding}" for finding in verdict.notes]


def lint_json(results: list[LintResult]) -> dict[str, Any]:
    return {"ok": all(result.ok for result in results),
            "policies": [{"source": r.source, "name": r.policy or None, "ok": r.ok, "errors": list(r.errors),
                          "warnings": list(r.warnings),
                          "portability": r.portability.as_json() if r.portability is not None else None}
                         for r in results]}
