"""``admission-policy test``: run AdmissionPolicyTest suites, or show what policies do to objects."""
from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import click

from ... import api
from ...engine import Decision, ExceptionSet, PolicySet, ReviewError, StaticInputs, parse_review
from ..admission import admit
from ..authorizer import DeclaredAnswers, combined, read_answers
from ..documents import (
    Document,
    DocumentError,
    checked_exceptions,
    documents_in,
    dump_json,
    is_exception,
    kubernetes_objects,
    load_exceptions,
    load_policies,
    read_documents,
    walk,
)
from ..options import gates_option, input_options, now_option, parse_now, read_inputs, use_gates
from ..output import fail
from ..report import decision_json, decision_text, suites_json, suites_text
from ..requests import build_review, namespace_object
from ..suite import SuiteResult, is_suite, run_suite

_OPERATIONS = click.Choice(["CREATE", "UPDATE", "DELETE", "CONNECT"], case_sensitive=False)


@click.command("test")
@click.option("-p", "--policy", "policy_paths", multiple=True, type=click.Path(),
              help="AdmissionPolicy or NamespacedAdmissionPolicy file or directory (repeatable), for the "
                   "objects given as PATHs; the AdmissionPolicyExceptions there apply too.")
@click.option("--operation", default="CREATE", type=_OPERATIONS, show_default=True,
              help="Operation for plain objects.")
@click.option("--old", "old_path", type=click.Path(), help="The old object, for UPDATE and DELETE.")
@click.option("--namespace-labels", "namespace_labels", default="",
              help="Labels of the object's namespace, as k=v,k2=v2.")
@click.option("--user", default="admission-policy-cli", show_default=True, help="userInfo.username.")
@click.option("--group", "groups", multiple=True, help="userInfo.groups entry (repeatable).")
@click.option("--subresource", default="", help="subResource for plain objects, e.g. status.")
@input_options
@now_option
@gates_option
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.argument("paths", nargs=-1, type=click.Path())
def test_command(policy_paths: Sequence[str], operation: str, old_path: str | None, namespace_labels: str,
                 user: str, groups: Sequence[str], subresource: str, param_paths: Sequence[str],
                 context_specs: Sequence[str], authorizer_paths: Sequence[str], now_text: str | None,
                 feature_gates: str, output: str, paths: Sequence[str]) -> None:
    """Run AdmissionPolicyTest suites, or evaluate objects against policies.

    Each PATH is a file or directory. In directories, AdmissionPolicyTest suites are run. In
    files, a suite is run, an AdmissionReview is evaluated as it is, and any other object (each
    item of a List) is evaluated as a request with --operation, against the policies given with
    --policy (with the AdmissionPolicyExceptions found there, judged at --now).
    Exits 1 when a suite expectation fails, 2 on unusable input.
    """
    use_gates(feature_gates, output)
    try:
        policies = PolicySet(load_policies(policy_paths)) if policy_paths else PolicySet()
        if policy_paths and not len(policies):
            raise DocumentError(f"no AdmissionPolicy or {api.NAMESPACED_KIND} found in {', '.join(policy_paths)}")
        exceptions = ExceptionSet(checked_exceptions(load_exceptions(policy_paths), policies, "--policy"))
        now = parse_now(now_text)
        suites, inputs = _classify(paths, policy_paths)
        if not suites and not inputs:
            raise DocumentError("nothing to test: give AdmissionPolicyTest suites or objects (see --help)")
        if inputs and not policy_paths:
            raise DocumentError("objects to evaluate need policies: add --policy FILE_OR_DIR")
        old = _single_object(old_path) if old_path else None
        labels = _parse_labels(namespace_labels)
        user_info = {"username": user, "groups": list(groups) or ["system:authenticated"]}
        results = [run_suite(document) for document in suites]
        given = read_inputs(param_paths, context_specs, policies)
        answers = combined(read_answers(path) for path in authorizer_paths)
        evaluated = [_evaluate_input(policies, document, operation.upper(), old, labels, user_info, subresource,
                                     given, answers, exceptions, now) for document in inputs]
    except DocumentError as exc:
        fail(exc, output)
    _print_test_results(results, evaluated, output)
    failed = sum(not case.passed for suite in results for case in suite.cases)
    sys.exit(1 if failed else 0)


class _Evaluated(NamedTuple):
    source: str
    title: str
    decision: Decision
    original: Any
    generated_name: str


def _classify(paths: Sequence[str], policy_paths: Sequence[str]) -> tuple[list[Document], list[Document]]:
    """Suites (in files and directories) and objects to evaluate (in files named on purpose; each
    document, each item of a List)."""
    policy_files = {file.resolve() for root in policy_paths for file in walk(Path(root))}
    suites: list[Document] = []
    inputs: list[Document] = []
    for root in paths:
        in_directory = Path(root).is_dir()
        for document in documents_in(root):
            if is_suite(document):
                suites.append(document)
            elif in_directory:
                continue
            elif document.kind in api.POLICY_KINDS or is_exception(document):
                if Path(root).resolve() not in policy_files:
                    raise DocumentError(_policy_as_input(document, root))
            else:   # a List (`kubectl get -o yaml`) stands for its items
                inputs.extend(Document(source, body) for source, body in kubernetes_objects(document))
    return suites, inputs


def _policy_as_input(document: Document, path: str) -> str:
    """Policies are not objects to test: saying how to pass them beats a vague "nothing to test"."""
    article = "an" if document.kind.startswith(("A", "E", "I", "O", "U")) else "a"
    return (f"{document.source}: {article} {document.kind} is not an object to test: pass policies with -p, "
            f"as in `admission-policy test -p {path} pod.yaml` (or `admission-policy lint {path}` to compile it)")


def _evaluate_input(policies: PolicySet, document: Document, operation: str, old: Any,
                    labels: dict[str, str], user_info: dict[str, Any], subresource: str,
                    given: StaticInputs, answers: DeclaredAnswers, exceptions: ExceptionSet,
                    now: float | None) -> _Evaluated:
    try:
        if document.kind == "AdmissionReview":
            review_body = document.body
        else:
            obj = None if operation == "DELETE" else document.body
            review_body = build_review(operation=operation, obj=obj, old=old if old is not None else (
                document.body if operation == "DELETE" else None), sub_resource=subresource, user_info=user_info)
        request = parse_review(review_body)
    except (ReviewError, ValueError) as exc:
        raise DocumentError(f"{document.source}: {exc}") from None
    namespace = namespace_object(request.namespace, labels) if request.namespace else None
    decision, generated_name = admit(policies, request, namespace, given, answers, exceptions, now)
    what = f"{request.resource}{'/' + request.sub_resource if request.sub_resource else ''}"
    name = generated_name or request.name
    name = f"{request.namespace}/{name}" if request.namespace else name
    title = f"{document.source} ({what} {name}, {request.operation})"
    return _Evaluated(document.source, title, decision,
                      request.object if request.object is not None else request.old_object, generated_name)


def _print_test_results(results: list[SuiteResult], evaluated: list[_Evaluated], output: str) -> None:
    if output == "json":
        click.echo(dump_json({
            "suites": suites_json(results),
            "inputs": [decision_json(item.source, item.decision, item.generated_name) for item in evaluated],
        }))
        return
    for item in evaluated:
        click.echo(decision_text(item.title, item.decision, item.original, item.generated_name))
    if results:
        click.echo(suites_text(results))
        passed = sum(case.passed for suite in results for case in suite.cases)
        failed = sum(not case.passed for suite in results for case in suite.cases)
        click.echo(f"\n{len(results)} suite(s): {passed} case(s) passed, {failed} failed")


def _single_object(path: str) -> Any:
    documents = read_documents(path)
    if len(documents) != 1 or not isinstance(documents[0].body, dict):
        raise DocumentError(f"{path}: expected exactly one object")
    return documents[0].body


def _parse_labels(text: str) -> dict[str, str]:
    labels = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise DocumentError(f"--namespace-labels: {item!r} is not key=value")
        labels[key] = value
    return labels
