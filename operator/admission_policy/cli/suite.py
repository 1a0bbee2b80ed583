"""AdmissionPolicyTest suites: cases with expectations, run through the same engine."""
from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import api
from ..engine import CompiledPolicy, Decision, ExceptionSet, PolicySet, ReviewError, StaticInputs, parse_review
from .admission import admit
from .authorizer import DeclaredAnswers, parse_answers
from .documents import (
    Document,
    DocumentError,
    Found,
    checked_exceptions,
    kubernetes_objects,
    load_exceptions,
    load_policies,
    objects_in,
    read_documents,
)
from .inputs import checked_inputs
from .options import parse_now
from .report import yaml_diff
from .requests import build_review, namespace_object

SUITE_KIND = "AdmissionPolicyTest"
_CASE_FIELDS = frozenset({"name", "operation", "object", "oldObject", "subResource", "resource",
                          "namespaceLabels", "userInfo", "dryRun", "params", "context", "authorizer", "now",
                          "expect"})
_SUITE_FIELDS = frozenset({"apiVersion", "kind", "metadata", "policies", "exceptions", "now", "params", "context",
                           "authorizer", "cases"})
_EXPECT_FIELDS = frozenset({"allowed", "code", "messageContains", "warnings", "auditAnnotations",
                            "patched", "mutated"})


@dataclasses.dataclass(frozen=True)
class CaseResult:
    name: str
    decision: Decision | None
    problems: tuple[str, ...]
    generated_name: str = ""    # the name the API server would generate from generateName

    @property
    def passed(self) -> bool:
        return not self.problems


@dataclasses.dataclass(frozen=True)
class SuiteResult:
    source: str
    name: str
    cases: tuple[CaseResult, ...]


def run_suite(document: Document) -> SuiteResult:
    """Load a suite's policies and run every case; unusable input raises DocumentError."""
    suite = _mapping(document.body, document.source, "the suite")
    unknown = set(suite) - _SUITE_FIELDS
    if unknown:
        raise DocumentError(f"{document.source}: unknown field {sorted(unknown)[0]!r} in AdmissionPolicyTest")
    base = Path(document.source.split("#", 1)[0]).parent
    name = str((suite.get("metadata") or {}).get("name", base.name))
    policy_paths = suite.get("policies", ["."])
    if not isinstance(policy_paths, list) or not all(isinstance(p, str) for p in policy_paths):
        raise DocumentError(f"{document.source}: policies must be a list of paths")
    if policy_paths == ["."]:
        # Only this directory, not the tree below it.
        files = [p for p in sorted(base.iterdir()) if p.suffix in (".yaml", ".yml", ".json")]
        policies = load_policies(files, allow_empty=True)    # files picked by suffix, not by name
    else:
        files = [base / p for p in policy_paths]
        policies = load_policies(files)
    if not policies:
        raise DocumentError(f"{document.source}: no AdmissionPolicy or {api.NAMESPACED_KIND} found in {policy_paths}")
    policy_set = PolicySet(policies)
    exceptions = _exceptions(suite, files, base, document.source, policies)
    cases = suite.get("cases")
    if not isinstance(cases, list) or not cases:
        raise DocumentError(f"{document.source}: cases must be a non-empty list")
    results = []
    seen: set[str] = set()
    for index, case in enumerate(cases):
        where = f"{document.source}: cases[{index}]"
        case = _mapping(case, where, "a case")
        case_name = str(case.get("name") or f"case {index}")
        if case_name in seen:
            raise DocumentError(f"{where}: duplicate case name {case_name!r}")
        seen.add(case_name)
        results.append(_run_or_fail(_Given(policy_set, exceptions, suite, base), case, case_name, f"cases[{index}]"))
    return SuiteResult(document.source, name, tuple(results))


@dataclasses.dataclass(frozen=True)
class _Given:
    """What every case of a suite is judged with."""
    policies: PolicySet
    exceptions: ExceptionSet
    suite: Mapping[str, Any]
    base: Path


def _exceptions(suite: Mapping[str, Any], policy_files: list[Path], base: Path, source: str,
                policies: list[CompiledPolicy]) -> ExceptionSet:
    """The suite's ``exceptions`` (paths), else the AdmissionPolicyExceptions in its policies' files:
    the directory stands for the cluster."""
    paths = suite.get("exceptions")
    if paths is None:
        found = load_exceptions(policy_files, allow_empty=True)
    elif not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise DocumentError(f"{source}: exceptions must be a list of paths")
    else:
        found = load_exceptions(base / p for p in paths)
        if not found:
            raise DocumentError(f"{source}: no AdmissionPolicyException found in {paths}")
    return ExceptionSet(checked_exceptions(found, policies, source))


def _run_or_fail(given: _Given, case: Mapping[str, Any], name: str, where: str) -> CaseResult:
    """A case that cannot run (a missing file, a bad field) fails alone: the other cases still run
    and the report names the suite and this case."""
    try:
        return _run_case(given, case, name, where)
    except DocumentError as exc:
        return CaseResult(name, None, (f"cannot run: {exc}",))


def _run_case(given: _Given, case: Mapping[str, Any], name: str, where: str) -> CaseResult:
    policies, suite, base = given.policies, given.suite, given.base
    unknown = set(case) - _CASE_FIELDS
    if unknown:
        raise DocumentError(f"{where}: unknown field {sorted(unknown)[0]!r} "
                            f"(allowed: {', '.join(sorted(_CASE_FIELDS))})")
    expect = _mapping(case.get("expect"), where, "expect")
    unknown = set(expect) - _EXPECT_FIELDS
    if unknown:
        raise DocumentError(f"{where}.expect: unknown field {sorted(unknown)[0]!r}")
    if not isinstance(expect.get("allowed"), bool):
        raise DocumentError(f"{where}.expect.allowed is required (true or false)")
    operation = str(case.get("operation", "CREATE"))
    obj = _object(case.get("object"), base, f"{where}.object")
    old = _object(case.get("oldObject"), base, f"{where}.oldObject")
    try:
        review = build_review(operation=operation, obj=obj, old=old, sub_resource=str(case.get("subResource", "")),
                              resource=case.get("resource"), user_info=case.get("userInfo"),
                              dry_run=bool(case.get("dryRun", False)))
        request = parse_review(review)
    except (ValueError, ReviewError) as exc:
        raise DocumentError(f"{where}: {exc}") from None
    namespace = None
    if request.namespace:
        namespace = namespace_object(request.namespace, case.get("namespaceLabels") or {})
    now = parse_now(_text(case["now"], f"{where}.now") if "now" in case else
                    _text(suite["now"], "the suite's now") if "now" in suite else None,
                    f"{where}.now" if "now" in case else "the suite's now")
    decision, generated_name = admit(policies, request, namespace, _inputs(policies, case, suite, base, where),
                                     _answers(case, suite, base, where), given.exceptions, now)
    expected_patched = None
    if "patched" in expect:
        expected_patched = _object(expect["patched"], base, f"{where}.expect.patched")
    return CaseResult(name, decision, tuple(check(decision, expect, expected_patched)), generated_name)


def _inputs(policies: PolicySet, case: Mapping[str, Any], suite: Mapping[str, Any], base: Path,
            where: str) -> StaticInputs:
    """The case's params and context objects (files or inline), else the suite's: what the cluster
    would hold. ``params`` is a list of objects; ``context`` maps each entry name to a list. A file
    may hold several objects (multi-document YAML, a ``List``), as with --param and --context."""
    params_where = where if "params" in case else "the suite"
    raw_params = (case if "params" in case else suite).get("params") or []
    if not isinstance(raw_params, list):
        raise DocumentError(f"{params_where}.params must be a list of objects or files")
    params = [found for i, item in enumerate(raw_params)
              for found in _cluster_objects(item, base, f"{params_where}.params[{i}]")]
    context_where = where if "context" in case else "the suite"
    raw_context = (case if "context" in case else suite).get("context") or {}
    if not isinstance(raw_context, Mapping):
        raise DocumentError(f"{context_where}.context must map each context name to a list of objects or files")
    context: dict[str, tuple[str, list[Found]]] = {}
    for name, items in raw_context.items():
        named = f"{context_where}.context.{name}"
        if not isinstance(items, list):
            raise DocumentError(f"{named} must be a list of objects or files")
        context[str(name)] = (named, [found for i, item in enumerate(items)
                                      for found in _cluster_objects(item, base, f"{named}[{i}]")])
    return checked_inputs(policies, params, context)


def _answers(case: Mapping[str, Any], suite: Mapping[str, Any], base: Path, where: str) -> DeclaredAnswers:
    """The case's declared authorizer answers (inline or files), else the suite's: what the
    cluster's authorizer would decide for the checks its policies make (``cli.authorizer``)."""
    if "authorizer" in case:
        return parse_answers(case["authorizer"] or [], f"{where}.authorizer", base)
    return parse_answers(suite.get("authorizer") or [], "the suite's authorizer", base)


def _cluster_objects(value: Any, base: Path, where: str) -> list[Found]:
    """An inline object (or List), or every object of a file or directory relative to the suite."""
    if isinstance(value, Mapping):
        return kubernetes_objects(Document(where, dict(value)))
    if not isinstance(value, str):
        raise DocumentError(f"{where}: must be an object or a file path")
    try:
        return objects_in(base / value)
    except DocumentError as exc:
        raise DocumentError(f"{where}: {exc}") from None


def check(decision: Decision, expect: Mapping[str, Any], patched: Any) -> list[str]:
    """Every way the decision differs from the expectation, as readable sentences."""
    problems = []
    if decision.allowed != expect["allowed"]:
        got = "allowed" if decision.allowed else f"denied: {decision.message}"
        problems.append(f"expected {'allowed' if expect['allowed'] else 'denied'}, got {got}")
    if "code" in expect and not decision.allowed and decision.code != expect["code"]:
        problems.append(f"expected code {expect['code']}, got {decision.code}")
    for text in _texts(expect.get("messageContains")):
        if text not in decision.message:
            problems.append(f"expected the message to contain {text!r}, got {decision.message!r}")
    if "warnings" in expect:
        wanted = _texts(expect["warnings"])
        if not wanted and decision.warnings:
            problems.append(f"expected no warnings, got {list(decision.warnings)}")
        for text in wanted:
            if not any(text in warning for warning in decision.warnings):
                problems.append(f"expected a warning containing {text!r}, got {list(decision.warnings)}")
    if "auditAnnotations" in expect and dict(decision.audit_annotations) != (expect["auditAnnotations"] or {}):
        problems.append(f"expected auditAnnotations {expect['auditAnnotations']}, "
                        f"got {dict(decision.audit_annotations)}")
    if "mutated" in expect and bool(decision.patch) != bool(expect["mutated"]):
        problems.append(f"expected mutated={bool(expect['mutated'])}, got patch {list(decision.patch)}")
    if patched is not None and decision.patched_object != patched:
        problems.append("the patched object differs from the expected one:\n"
                        + yaml_diff(patched, decision.patched_object, "expected", "actual"))
    return problems


def _text(value: Any, where: str) -> str:
    """A time as the suite gives it: YAML reads an unquoted one as a datetime."""
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if not isinstance(value, str):
        raise DocumentError(f"{where} must be an RFC 3339 time")
    return value


def _texts(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _object(value: Any, base: Path, where: str) -> Any:
    """An inline object, or the single document of a file relative to the suite."""
    if value is None or isinstance(value, Mapping):
        return value
    if not isinstance(value, str):
        raise DocumentError(f"{where}: must be an object or a file path")
    try:
        documents = read_documents(base / value, allow_empty=False)
    except DocumentError as exc:
        raise DocumentError(f"{where}: {exc}") from None
    if len(documents) != 1 or not isinstance(documents[0].body, Mapping):
        raise DocumentError(f"{where}: {base / value} must hold exactly one object")
    return documents[0].body


def _mapping(value: Any, where: str, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise DocumentError(f"{where}: {what} must be an object")
    return value


def is_suite(document: Document) -> bool:
    return document.kind == SUITE_KIND and (
        not isinstance(document.body, Mapping) or document.body.get("apiVersion") in (None, api.API_VERSION))
