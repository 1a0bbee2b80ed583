"""``admission-policy lint``: compile policies as the operator's webhook does at `kubectl apply`.

For CI pipelines: nothing is evaluated, every file is read even when an earlier one is broken,
and every problem is one line naming the file, the policy, the field path and the column. Each
policy that compiles is also judged for portability to a ValidatingAdmissionPolicy
(``vap.portability``), after the compile results, so that those keep their place for scripts.
NamespacedAdmissionPolicies are linted alike, named "namespace/name" as the engine names them.
AdmissionPolicyExceptions among them are checked as the webhook will check them at `kubectl
apply` (``policyexception.check_exception``), against the policies linted with them. Every policy
that compiles is type-checked against the schemas of the kinds it matches (``engine.typecheck``):
the built-in kinds, and the CustomResourceDefinitions found among the files.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .. import api, policyexception
from ..engine.kinds import Catalog, is_crd
from ..engine.typecheck import TypeWarning, type_check
from ..vap.portability import Portability, portability
from .documents import (
    Document,
    DocumentError,
    compile_document,
    compile_exception_document,
    duplicate_policy,
    gated_off_warnings,
    is_exception,
    object_name,
    policy_kind,
    policy_name,
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
    kind: str = api.KIND         # or NamespacedAdmissionPolicy, AdmissionPolicyException ("namespace/name")
    spec: api.AdmissionPolicy | None = dataclasses.field(default=None, repr=False)   # a policy that compiles
    type_warnings: tuple[TypeWarning, ...] = ()   # expressions that do not type-check (engine.typecheck)

    @property
    def ok(self) -> bool:
        return not self.errors


def lint_policies(paths: Iterable[str], now: float | None = None) -> list[LintResult]:
    """Every AdmissionPolicy and NamespacedAdmissionPolicy under ``paths``, compiled; a duplicate
    name is an error, as the cluster would keep only one of them. Then every AdmissionPolicyException, checked against
    those policies at ``now`` (the real time by default)."""
    seen: dict[str, str] = {}
    results: list[LintResult] = []
    exceptions: list[Document] = []
    crds: list[Any] = []
    for root in paths:
        results.extend(_lint_root(root, seen, exceptions, crds))
    catalog = Catalog(crds)
    results = [dataclasses.replace(result, type_warnings=type_check(result.spec, catalog).warnings)
               if result.spec is not None else result for result in results]
    policies = [result.spec for result in results if result.spec is not None]
    checked_at = time.time() if now is None else now
    results.extend(_lint_exception(document, policies, checked_at) for document in exceptions)
    return results


def _lint_exception(document: Document, policies: list[api.AdmissionPolicy], now: float) -> LintResult:
    metadata = document.body.get("metadata") if isinstance(document.body, dict) else None
    name = str(api.PolicyKey(policyexception.KIND, str(metadata.get("namespace", "")), object_name(document.body))) \
        if isinstance(metadata, dict) else ""
    try:
        compiled = compile_exception_document(document)
    except DocumentError as exc:
        return LintResult(document.source, name, (str(exc),), kind=policyexception.KIND)
    # An expired exception in a repository is stale, not invalid (it was valid when applied), and
    # time alone must not turn a CI check red: it is a warning; everything else is an error.
    problems = policyexception.check_exception(compiled.exception, policies, now, expiry=False)
    prefix = f"{document.source}: AdmissionPolicyException {compiled.key!r}: "
    expired = compiled.exception.expires_at <= now
    warnings = (f"{prefix}spec.expiresAt: expired at {policyexception.format_time(compiled.exception.expires_at)} "
                "(it no longer applies, and `kubectl apply` would refuse to create it)",) if expired else ()
    return LintResult(document.source, compiled.key, tuple(prefix + problem for problem in problems), warnings,
                      kind=policyexception.KIND)


def _lint_root(root: str, seen: dict[str, str], exceptions: list[Document], crds: list[Any]) -> list[LintResult]:
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
        results.extend(_lint_document(document, seen) for document in documents
                       if document.kind in api.POLICY_KINDS)
        exceptions.extend(document for document in documents if is_exception(document))
        crds.extend(document.body for document in documents if is_crd(document.body))
    if not results and not any(document.source.startswith(root) for document in exceptions):
        results.append(LintResult(root, "", (f"{root}: no AdmissionPolicy or {api.NAMESPACED_KIND} found",)))
    return results


def _lint_document(document: Document, seen: dict[str, str]) -> LintResult:
    kind = policy_kind(document)
    try:
        policy = compile_document(document)
    except DocumentError as exc:
        return LintResult(document.source, policy_name(document), tuple(str(exc).splitlines()), kind=kind)
    if policy.name in seen:
        return LintResult(document.source, policy.name, (duplicate_policy(document, policy.name, seen[policy.name]),),
                          kind=kind)
    seen[policy.name] = document.source
    return LintResult(document.source, policy.name, (), tuple(gated_off_warnings(document, policy)),
                      portability(policy, document.body), kind=kind, spec=policy.policy)


def lint_text(results: list[LintResult]) -> str:
    lines = []
    for result in results:
        if result.ok:
            lines.append(f"ok     {result.source}: {result.kind} {result.policy!r}")
        lines.extend(f"warn   {warning}" for warning in result.warnings)
        lines.extend(f"warn   {result.source}: {result.kind} {result.policy!r}: {line}"
                     for warning in result.type_warnings for line in warning.lines())
        lines.extend(f"error  {error}" for error in result.errors)
    failed = sum(not result.ok for result in results)
    skipping = sum(bool(result.warnings) for result in results if result.kind in api.POLICY_KINDS)
    mistyped = sum(bool(result.type_warnings) for result in results)
    lines.append(f"\n{len(results) - failed} compiled, {failed} with errors"
                 + (f", {skipping} with plugin rules a feature gate switches off" if skipping else "")
                 + (f", {mistyped} with expressions that do not type-check" if mistyped else ""))
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
    policy = f"{result.source}: {result.kind} {result.policy!r}"
    if verdict.portable:
        needs = f" (Kubernetes {verdict.kubernetes} or later)" if verdict.needs else ""
        lines = [f"portable      {policy}{needs}"]
        lines += [f"needs         {policy}: {finding}" for finding in verdict.needs]
    else:
        lines = [f"not portable  {policy}: {finding}" for finding in verdict.blockers]
    return lines + [f"note          {policy}: {finding}" for finding in verdict.notes]


def lint_json(results: list[LintResult]) -> dict[str, Any]:
    return {"ok": all(result.ok for result in results),
            "policies": [{"source": r.source, "kind": r.kind, "name": r.policy or None, "ok": r.ok,
                          "errors": list(r.errors),
                          "warnings": list(r.warnings),
                          "typeChecking": [w.as_status() for w in r.type_warnings],
                          "portability": r.portability.as_json() if r.portability is not None else None}
                         for r in results]}
