"""``admission-policy``: evaluate policies offline, with the very engine the webhook runs.

Exit codes: 0 success, 1 an expectation of a test suite failed (``audit``: an Enforce policy is
violated), 2 unusable input, 3 ``audit`` is incomplete (a resource could not be listed).
"""
from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import click

from .. import api, features, plugins
from ..engine import (
    CompiledPolicy,
    Decision,
    Phase,
    PolicySet,
    ReviewError,
    StaticInputs,
    build_response,
    evaluate,
    parse_review,
)
from ..operator.settings import OperatorSettings
from .admission import admit
from .authorizer import DeclaredAnswers, answered, combined, read_answers
from .documents import (
    Document,
    Found,
    InputError,
    documents_in,
    dump_json,
    kubernetes_objects,
    load_policies,
    objects_in,
    read_documents,
    walk,
)
from .inputs import checked_inputs
from .lint import lint_json, lint_policies, lint_text
from .report import decision_json, decision_text, suites_json, suites_text
from .requests import build_review, namespace_object
from .suite import SuiteResult, is_suite, run_suite

AUDIT_INCOMPLETE = 3   # `audit --kubeconfig`: some resources could not be listed, no Enforce violation found
_OPERATIONS = click.Choice(["CREATE", "UPDATE", "DELETE", "CONNECT"], case_sensitive=False)


def _input_options(fn: Any) -> Any:
    """--param and --context: what the cluster would hold for policies that read params or context;
    --authorizer: what its authorizer would decide for their authorizer checks."""
    fn = click.option("--authorizer", "authorizer_paths", multiple=True, type=click.Path(), metavar="FILE",
                      help="Authorizer answers for policies' authorizer checks (repeatable; a YAML or JSON list of "
                           "{user|serviceAccount, verb, group, resource, subresource, namespace, name, path, "
                           "allowed, reason, error}; a check none covers is refused).")(fn)
    fn = click.option("--context", "context_specs", multiple=True, metavar="NAME=FILE_OR_DIR",
                      help="Objects for context.NAME, a name a policy declares (repeatable; every object of "
                           "the files, Lists included; none for an empty directory).")(fn)
    return click.option("--param", "param_paths", multiple=True, type=click.Path(), metavar="FILE_OR_DIR",
                        help="Param objects of a policy's spec.paramKind (repeatable; every object of the files, "
                             "Lists included).")(fn)


def _gates_option(fn: Any) -> Any:
    """--feature-gates, as `run` takes it: rules of gated-off plugins are skipped, as in the cluster."""
    return click.option("--feature-gates", "feature_gates", envvar=features.ENV, default="",
                        metavar="Name=true|false,...",
                        help="Feature gates as the operator would be given them; `admission-policy plugins` "
                             f"lists them [env {features.ENV}].")(fn)


def _parse_gates(text: str, output: str = "text", found: plugins.Registry | None = None) -> features.FeatureGates:
    """The gates given, or exit 2 with one line saying whether the flag or the variable is wrong."""
    try:
        return features.parse(text, found)
    except features.FeatureGateError as exc:
        source = click.get_current_context().get_parameter_source("feature_gates")
        given = features.ENV if source == click.ParameterSource.ENVIRONMENT else "--feature-gates"
        _fail(InputError(f"{given}: {exc}"), output)


def _use_gates(text: str, output: str = "text") -> None:
    """Set the gates before any policy is compiled, for this command only (the CLI may run inside
    another program, as in tests)."""
    features.configure(_parse_gates(text, output))
    click.get_current_context().call_on_close(lambda: features.configure(None))


def _read_inputs(param_paths: Sequence[str], context_specs: Sequence[str],
                 policies: Iterable[CompiledPolicy]) -> StaticInputs:
    """The objects of --param and --context files, checked against the policies that read them."""
    params = [found for path in param_paths for found in objects_in(path)]
    context: dict[str, tuple[str, list[Found]]] = {}
    for spec in context_specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise InputError(f"--context: {spec!r} is not NAME=FILE_OR_DIR")
        context.setdefault(name, (f"--context {name}", []))[1].extend(objects_in(path))
    return checked_inputs(policies, params, context)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="admission-policy-operator")
def main() -> None:
    """AdmissionPolicy: Kubernetes admission rules in CEL.

    \b
    Offline (no cluster):
      admission-policy test examples/                    run every AdmissionPolicyTest suite
      admission-policy test -p policy.yaml pod.yaml      show what the policies do to an object
      admission-policy review -p policy.yaml review.json print the webhook's AdmissionReview response
      admission-policy lint policies/                    compile only, for CI (exit 2 on any error);
                                                         says which could be ValidatingAdmissionPolicies
      admission-policy audit -p policies/ manifests/     what existing objects violate (exit 1: Enforce)
      admission-policy convert vap.yaml binding.yaml     ValidatingAdmissionPolicies → AdmissionPolicies
      admission-policy plugins                           list installed plugins and feature gates
    Operator:
      admission-policy run                               run the operator (Kopf) with settings from flags/env
      admission-policy cleanup-webhooks                  delete its webhook configurations
    """


@main.command()
@click.option("-p", "--policy", "policy_paths", multiple=True, type=click.Path(),
              help="AdmissionPolicy file or directory (repeatable), for the objects given as PATHs.")
@click.option("--operation", default="CREATE", type=_OPERATIONS, show_default=True,
              help="Operation for plain objects.")
@click.option("--old", "old_path", type=click.Path(), help="The old object, for UPDATE and DELETE.")
@click.option("--namespace-labels", "namespace_labels", default="",
              help="Labels of the object's namespace, as k=v,k2=v2.")
@click.option("--user", default="admission-policy-cli", show_default=True, help="userInfo.username.")
@click.option("--group", "groups", multiple=True, help="userInfo.groups entry (repeatable).")
@click.option("--subresource", default="", help="subResource for plain objects, e.g. status.")
@_input_options
@_gates_option
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.argument("paths", nargs=-1, type=click.Path())
def test(policy_paths: Sequence[str], operation: str, old_path: str | None, namespace_labels: str, user: str,
         groups: Sequence[str], subresource: str, param_paths: Sequence[str], context_specs: Sequence[str],
         authorizer_paths: Sequence[str], feature_gates: str, output: str, paths: Sequence[str]) -> None:
    """Run AdmissionPolicyTest suites, or evaluate objects against policies.

    Each PATH is a file or directory. In directories, AdmissionPolicyTest suites are run. In
    files, a suite is run, an AdmissionReview is evaluated as it is, and any other object (each
    item of a List) is evaluated as a request with --operation, against the policies given with
    --policy.
    Exits 1 when a suite expectation fails, 2 on unusable input.
    """
    _use_gates(feature_gates, output)
    try:
        policies = PolicySet(load_policies(policy_paths)) if policy_paths else PolicySet()
        if policy_paths and not len(policies):
            raise InputError(f"no AdmissionPolicy found in {', '.join(policy_paths)}")
        suites, inputs = _classify(paths, policy_paths)
        if not suites and not inputs:
            raise InputError("nothing to test: give AdmissionPolicyTest suites or objects (see --help)")
        if inputs and not policy_paths:
            raise InputError("objects to evaluate need policies: add --policy FILE_OR_DIR")
        old = _single_object(old_path) if old_path else None
        labels = _parse_labels(namespace_labels)
        user_info = {"username": user, "groups": list(groups) or ["system:authenticated"]}
        results = [run_suite(document) for document in suites]
        given = _read_inputs(param_paths, context_specs, policies)
        answers = combined(read_answers(path) for path in authorizer_paths)
        evaluated = [_evaluate_input(policies, document, operation.upper(), old, labels, user_info, subresource,
                                     given, answers) for document in inputs]
    except InputError as exc:
        _fail(exc, output)
    _print_test_results(results, evaluated, output)
    failed = sum(not case.passed for suite in results for case in suite.cases)
    sys.exit(1 if failed else 0)


@main.command()
@click.option("-p", "--policy", "policy_paths", multiple=True, type=click.Path(), required=True,
              help="AdmissionPolicy file or directory (repeatable).")
@click.option("-n", "--namespace", "namespace_paths", multiple=True, type=click.Path(),
              help="Namespace object(s), for namespaceSelector and namespaceObject (repeatable).")
@click.option("--phase", type=click.Choice([p.value for p in Phase]), default=Phase.ALL.value, show_default=True,
              help="Which webhook to act as: mutate, validate, or both in the API server's order.")
@_input_options
@_gates_option
@click.argument("review_path", metavar="REVIEW.json|-", type=click.Path())
def review(policy_paths: Sequence[str], namespace_paths: Sequence[str], phase: str, param_paths: Sequence[str],
           context_specs: Sequence[str], authorizer_paths: Sequence[str], feature_gates: str,
           review_path: str) -> None:
    """Print the AdmissionReview response the webhook returns for an AdmissionReview request.

    Exits 0 whenever a response was produced, allowed or not; 2 for unusable input.
    """
    _use_gates(feature_gates)
    try:
        policies = PolicySet(load_policies(policy_paths))
        namespaces: dict[str, Any] = {}
        for source, body in (found for path in namespace_paths for found in objects_in(path)):
            if body["kind"] != "Namespace":
                raise InputError(f"{source}: expected a Namespace, got kind {body['kind']!r}")
            namespaces[str((body.get("metadata") or {}).get("name", ""))] = body
        given = _read_inputs(param_paths, context_specs, policies)
        answers = combined(read_answers(path) for path in authorizer_paths)
        documents = read_documents(review_path)
        if len(documents) != 1:
            raise InputError(f"{review_path}: expected one AdmissionReview, found {len(documents)} documents")
        try:
            request = parse_review(documents[0].body)
        except ReviewError as exc:
            raise InputError(f"{review_path}: invalid AdmissionReview: {exc}") from None
        decision = answered(evaluate(policies, request, namespaces.get(request.namespace), Phase(phase), inputs=given,
                                     authorization=answers))
    except InputError as exc:
        _fail(exc)
    click.echo(json.dumps(build_response(decision, request.uid, request.api_version), indent=2))


@main.command()
@click.option("-p", "--policy", "policy_paths", multiple=True, type=click.Path(), required=True,
              help="AdmissionPolicy file or directory (repeatable).")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None,
              help="Audit a live cluster's objects (read only) instead of manifests.")
@click.option("-o", "--output", type=click.Choice(["text", "json", "yaml"]), default="text", show_default=True,
              help="A table per policy, or the openreports Reports the operator would write.")
@click.option("--progress", type=click.Choice(["auto", "always", "never"]), default="auto", show_default=True,
              help="A progress bar on standard error while listing a cluster (auto: when it is a terminal).")
@_input_options
@_gates_option
@click.argument("paths", nargs=-1, type=click.Path())
def audit(policy_paths: Sequence[str], kubeconfig: str | None, output: str, progress: str,
          param_paths: Sequence[str], context_specs: Sequence[str], authorizer_paths: Sequence[str], feature_gates: str,
          paths: Sequence[str]) -> None:
    """Judge existing objects as the operator's background audit does.

    \b
    Objects: PATHs (files, directories, - for standard input; multi-document YAML and List
    kinds), or with --kubeconfig every object the policies' rules name in that cluster
    (paged lists; exempt namespaces and objects labelled policy-operator.dev/exempt=true are
    skipped, as the operator skips them; AP_EXEMPT_NAMESPACES and AP_NAMESPACE are read).
    Each object is evaluated as a background request: request.operation CREATE, no
    oldObject, an empty request.userInfo; validations judge the object as it is, and
    mutations are only reported ("would mutate"). Policies that read params or context get
    them from --param and --context files, also against a cluster. A resource the cluster
    refuses to list (RBAC's 403, an API down) is named on standard error and the audit goes on
    with the rest, as the operator's does.

    Exits 1 when an Enforce policy is violated (a CI gate for manifests), 2 for unusable
    input, 3 when no Enforce policy is violated but some resources could not be listed (the
    audit is incomplete), 0 otherwise.
    """
    import asyncio
    import os
    import time

    import yaml

    from .audit import audit_cluster, audit_manifests, progress_enabled, report_list, stderr_progress, table

    _use_gates(feature_gates, output)
    try:
        if kubeconfig is not None and paths:
            raise InputError("give manifests (PATHs) or --kubeconfig, not both")
        if kubeconfig is None and not paths:
            raise InputError("nothing to audit: give manifests (PATHs, - for standard input) or --kubeconfig")
        if kubeconfig is not None:
            _check_kubeconfig(kubeconfig)
        policies = load_policies(policy_paths)
        if not policies:
            raise InputError(f"no AdmissionPolicy found in {', '.join(policy_paths)}")
        now = int(time.time())
        given = _read_inputs(param_paths, context_specs, policies)
        answers = combined(read_answers(path) for path in authorizer_paths)
        if kubeconfig is None:
            run = audit_manifests(policies, paths, now, given, answers)
        else:
            try:   # the gates as given above, whichever of the flag and the variable gave them
                settings = OperatorSettings.from_env({**os.environ, features.ENV: feature_gates})
            except ValueError as exc:
                raise InputError(str(exc)) from None
            try:
                run = asyncio.run(audit_cluster(policies, kubeconfig, now, settings,
                                                stderr_progress(progress_enabled(progress)), given, answers))
            except InputError:
                raise
            except Exception as exc:
                raise InputError(f"cannot audit the cluster of {kubeconfig}: {type(exc).__name__}: {exc}") from None
    except InputError as exc:
        _fail(exc, "json" if output == "json" else "text")
    if output == "text":
        click.echo(table(run))
    elif output == "json":
        click.echo(dump_json(report_list(run)))
    else:
        click.echo(yaml.safe_dump(report_list(run), sort_keys=False), nl=False)
    for problem in run.unlisted:
        click.echo(f"warning: {problem}: its objects are not audited", err=True)
    sys.exit(1 if run.enforce_violated else AUDIT_INCOMPLETE if run.unlisted else 0)


def _check_kubeconfig(path: str) -> None:
    """What the Kubernetes client would answer with "Expected key current-context" (a missing or
    empty file) or a bare TypeError, said plainly and naming the file."""
    if not Path(path).is_file():
        raise InputError(f"--kubeconfig {path}: no such file")
    try:
        documents = read_documents(path, allow_empty=False)
    except InputError as exc:
        raise InputError(f"--kubeconfig {exc}") from None
    body = documents[0].body if len(documents) == 1 else None
    if not isinstance(body, dict) or not body.get("current-context"):
        raise InputError(f"--kubeconfig {path}: not a kubeconfig with a current-context")


@main.command()
@_gates_option
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--require-portable", is_flag=True,
              help="Also exit 2 when a policy could not be a ValidatingAdmissionPolicy.")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
def lint(feature_gates: str, output: str, require_portable: bool, paths: Sequence[str]) -> None:
    """Compile AdmissionPolicies without evaluating anything: a check for CI pipelines.

    Each PATH is a policy file or a directory, searched recursively (other kinds are skipped).
    Each policy is parsed and its CEL compiled and type-checked by the code the operator's
    validating webhook runs at `kubectl apply`. Prints one line per policy: "ok", or one "error"
    line per problem naming the file, the policy, the field path and, for CEL, line and column.
    A policy using a plugin that a feature gate switches off compiles with a "warn" line: the
    operator skips those rules.

    Then, for each policy that compiles, whether it could be a ValidatingAdmissionPolicy:
    "portable" (with the oldest Kubernetes it needs), or one "not portable" line per obstacle
    (a mutation, a plugin, context, a CEL function Kubernetes lacks), and "note" lines for what
    ports only with a translation (excludeNamespaces, an unset reason...).
    Exits 0 when every policy compiles, 2 on any error (with --require-portable, also when one
    is not portable).
    """
    _use_gates(feature_gates, output)
    results = lint_policies(paths)
    click.echo(dump_json(lint_json(results)) if output == "json" else lint_text(results))
    stuck = require_portable and any(r.portability is not None and not r.portability.portable for r in results)
    sys.exit(0 if all(result.ok for result in results) and not stuck else 2)


@main.command()
@click.option("-o", "--output", "output_path", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Write the AdmissionPolicies to FILE instead of standard output.")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
def convert(output_path: str | None, paths: Sequence[str]) -> None:
    """Convert ValidatingAdmissionPolicies and their bindings into AdmissionPolicies.

    \b
    Each PATH is a file, a directory (searched recursively) or - for standard input, holding
    ValidatingAdmissionPolicy and ValidatingAdmissionPolicyBinding objects
    (admissionregistration.k8s.io v1, v1beta1 or v1alpha1); other objects, such as params,
    are read past. Each binding becomes one AdmissionPolicy named after it, deciding what the
    policy decides through that binding; a policy no binding names is not enforced by
    Kubernetes, and becomes nothing (a warning says so). Writes multi-document YAML.

    What an AdmissionPolicy cannot express faithfully (audit annotations, Deny+Audit, CEL this
    project lacks) is one "error:" line on standard error naming the object and the field;
    the rest is still written. Exits 0 when everything converted, 2 otherwise.
    """
    from .convert import convert_paths, dump

    try:
        result = convert_paths(paths)
        if result.policies and output_path is not None:
            try:
                Path(output_path).write_text(dump(result.policies), encoding="utf-8")
            except OSError as exc:
                raise InputError(f"-o {output_path}: cannot write: {exc.strerror or exc}") from None
        elif result.policies:
            click.echo(dump(result.policies), nl=False)
    except InputError as exc:
        _fail(exc)
    for notice in result.notices:
        click.echo(f"warning: {notice}", err=True)
    for problem in result.problems:
        click.echo(f"error: {problem}", err=True)
    if not result.policies and not result.problems:
        click.echo(f"error: nothing converted: no ValidatingAdmissionPolicyBinding in {', '.join(paths)} "
                   "names a ValidatingAdmissionPolicy given", err=True)
    sys.exit(2 if result.problems or not result.policies else 0)


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
            elif document.kind == api.KIND:
                if Path(root).resolve() not in policy_files:
                    raise InputError(_policy_as_input(document, root))
            else:   # a List (`kubectl get -o yaml`) stands for its items
                inputs.extend(Document(source, body) for source, body in kubernetes_objects(document))
    return suites, inputs


def _policy_as_input(document: Document, path: str) -> str:
    """Policies are not objects to test: saying how to pass them beats a vague "nothing to test"."""
    return (f"{document.source}: an AdmissionPolicy is not an object to test: pass policies with -p, "
            f"as in `admission-policy test -p {path} pod.yaml` (or `admission-policy lint {path}` to compile it)")


def _evaluate_input(policies: PolicySet, document: Document, operation: str, old: Any,
                    labels: dict[str, str], user_info: dict[str, Any], subresource: str,
                    given: StaticInputs, answers: DeclaredAnswers) -> _Evaluated:
    try:
        if document.kind == "AdmissionReview":
            review_body = document.body
        else:
            obj = None if operation == "DELETE" else document.body
            review_body = build_review(operation=operation, obj=obj, old=old if old is not None else (
                document.body if operation == "DELETE" else None), sub_resource=subresource, user_info=user_info)
        request = parse_review(review_body)
    except (ReviewError, ValueError) as exc:
        raise InputError(f"{document.source}: {exc}") from None
    namespace = namespace_object(request.namespace, labels) if request.namespace else None
    decision, generated_name = admit(policies, request, namespace, given, answers)
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
        raise InputError(f"{path}: expected exactly one object")
    return documents[0].body


def _parse_labels(text: str) -> dict[str, str]:
    labels = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"--namespace-labels: {item!r} is not key=value")
        labels[key] = value
    return labels


def _fail(error: Exception, output: str = "text") -> NoReturn:
    """Exit 2 with the error; under ``-o json`` as JSON on standard output, where a pipeline reads."""
    if output == "json":
        click.echo(dump_json({"errors": str(error).splitlines()}))
    else:
        click.echo(f"error: {error}", err=True)
    sys.exit(2)


# The operator's own default, so `cleanup-webhooks` with no --name finds what `run` wrote.
_DEFAULT_WEBHOOK_CONFIG_NAME = OperatorSettings.webhook_config_name

_RUN_FLAGS: list[tuple[str, str, str]] = [
    ("--namespace", "AP_NAMESPACE", "Namespace the operator runs in (its Secret, exemption)."),
    ("--service-name", "AP_SERVICE_NAME", "Service that fronts the webhook, in-cluster."),
    ("--service-port", "AP_SERVICE_PORT", "Port of that Service."),
    ("--listen-host", "AP_LISTEN_HOST", "Address the webhook server listens on."),
    ("--listen-port", "AP_LISTEN_PORT", "Port the webhook server listens on."),
    ("--advertise-host", "AP_ADVERTISE_HOST",
     "Host the API server reaches when run outside the cluster (url client config)."),
    ("--advertise-port", "AP_ADVERTISE_PORT", "Port in that url, when not the listen port (e.g. behind a proxy)."),
    ("--webhook-timeout", "AP_WEBHOOK_TIMEOUT", "timeoutSeconds of the webhooks (1-30)."),
    ("--max-connections", "AP_MAX_CONNECTIONS", "Open webhook connections at most; the longest idle makes room."),
    ("--exempt-namespaces", "AP_EXEMPT_NAMESPACES", "Comma-separated namespaces never sent to the webhooks."),
    ("--default-failure-policy", "AP_DEFAULT_FAILURE_POLICY", "failurePolicy of policies that set none."),
    ("--metrics-port", "AP_METRICS_PORT", "Prometheus port (0 disables)."),
    ("--health-port", "AP_HEALTH_PORT", "Port of /healthz and /readyz."),
    ("--log-level", "AP_LOG_LEVEL", "DEBUG, INFO, WARNING or ERROR."),
    ("--cert-secret", "AP_CERT_SECRET", "Secret holding the shared CA and serving certificate."),
    ("--cert-dir", "AP_CERT_DIR", "Directory for the serving certificate files."),
    ("--cert-lifetime", "AP_CERT_LIFETIME",
     "Validity of the serving certificate (30s..3650d; CA twice that), renewed with a third left. Default 365d."),
    ("--webhook-config-name", "AP_WEBHOOK_CONFIG_NAME", "Name of both webhook configurations."),
    ("--feature-gates", "AP_FEATURE_GATES",
     "Comma-separated Name=true|false; see `admission-policy plugins` for the gates and their defaults."),
    ("--audit-interval", "AP_AUDIT_INTERVAL",
     "Time between background scans of each policy's existing objects (e.g. 300, 5m; 0 disables). Default 5m."),
    ("--audit-page-size", "AP_AUDIT_PAGE_SIZE", "Objects per list page in the background scan (1-10000)."),
    ("--audit-violations-limit", "AP_AUDIT_VIOLATIONS_LIMIT",
     "Violations listed in each policy's status.audit (0-500; the count is always complete)."),
]


def _run_options(fn: Any) -> Any:
    for flag, variable, text in reversed(_RUN_FLAGS):
        fn = click.option(flag, variable.lower(), default=None, help=f"{text} [env {variable}]")(fn)
    return fn


@main.command()
@_run_options
@click.option("--standalone", is_flag=True, help="No peering: this replica reconciles regardless of others.")
def run(standalone: bool, **flags: str | None) -> None:
    """Run the operator: reconciliation, webhooks, certificates, metrics.

    The same as `kopf run -m admission_policy.operator.handlers --all-namespaces`, with the
    settings given as flags or AP_* environment variables (flags win).
    """
    import os

    import kopf

    for variable, value in flags.items():
        if value is not None:
            os.environ[variable.upper()] = value
    try:
        settings = OperatorSettings.from_env(os.environ)
    except ValueError as exc:
        _fail(exc)
    logging_level = getattr(logging, settings.log_level)
    logging.basicConfig(level=logging_level, format="[%(asctime)s] %(name)-28s [%(levelname)-7s] %(message)s")
    import warnings

    # Kopf has logged why a start-up handler failed, in one line (e.g. a port in use): exit on it
    # without Kopf's traceback. (kopf 1.45 does not export ActivityError.)
    from kopf._core.engines.activities import ActivityError

    import admission_policy.operator.handlers  # noqa: F401  (registers the handlers)

    # Kopf leaves its login coroutine unawaited when start-up fails before it: noise, not news.
    warnings.filterwarnings("ignore", "coroutine 'authenticator' was never awaited", RuntimeWarning)
    try:
        kopf.run(clusterwide=True, standalone=standalone, liveness_endpoint=None)
    except ActivityError:
        raise SystemExit(1) from None


@main.command("plugins")
@_gates_option
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def plugins_command(feature_gates: str, output: str) -> None:
    """List the installed plugins (entry point group admission_policy.plugins), the ones that
    failed to load, and every feature gate with its stage, default and state."""
    found = plugins.registry()
    gates = _parse_gates(feature_gates, output, found)
    rows = [{"name": name, "kind": plugin.kind, "version": plugin.version, "source": found.sources[name],
             "gate": plugin.gate_name(),
             "enabled": gates.enabled(plugin.gate_name()) and gates.enabled("PythonPlugins"),
             "description": plugin.description, "configSchema": dict(plugin.config_schema)}
            for name, plugin in sorted(found.plugins.items())]
    broken = [{"name": b.name, "source": b.source, "error": b.error} for b in found.broken]
    gate_rows = [{"name": gate.name, "stage": gate.stage, "default": gate.default, "enabled": enabled}
                 for gate, enabled in gates.items()]
    if output == "json":
        click.echo(dump_json({"plugins": rows, "broken": broken, "featureGates": gate_rows}))
        return
    click.echo("PLUGIN              KIND       VERSION  ENABLED  SOURCE")
    for row in rows:
        click.echo(f"{row['name']:<19} {row['kind']:<10} {row['version']:<8} {str(row['enabled']).lower():<8} "
                   f"{row['source']}")
        if row["description"]:
            click.echo(f"    {row['description']}")
    for item in broken:
        click.echo(f"{item['name']:<19} (failed to load from {item['source']}: {item['error']})")
    click.echo("\nFEATURE GATE             STAGE  DEFAULT  ENABLED")
    for gate in gate_rows:
        click.echo(f"{gate['name']:<24} {gate['stage']:<6} {str(gate['default']).lower():<8} "
                   f"{str(gate['enabled']).lower()}")


@main.command("cleanup-webhooks")
@click.option("--name", envvar="AP_WEBHOOK_CONFIG_NAME", default=_DEFAULT_WEBHOOK_CONFIG_NAME, show_default=True,
              help="Name of both webhook configurations [env AP_WEBHOOK_CONFIG_NAME].")
def cleanup_webhooks(name: str) -> None:
    """Delete the operator's webhook configurations (uninstall). Absent ones are fine.

    Without --name, the name `admission-policy run` uses: AP_WEBHOOK_CONFIG_NAME, else the
    default. A Helm install names them after its release; list them with:

    \b
      kubectl get validatingwebhookconfigurations -l app.kubernetes.io/managed-by=admission-policy-operator
    """
    import asyncio

    from ..operator.kube import new_api_client
    from ..operator.registration import remove_configurations

    async def remove() -> list[str]:
        api_client = await new_api_client()
        async with api_client:
            return await remove_configurations(api_client, name)

    try:
        deleted = asyncio.run(remove())
    except Exception as exc:
        _fail(RuntimeError(f"cannot delete the webhook configurations {name!r}: {exc}"))
    click.echo(f"deleted: {', '.join(deleted)}" if deleted else f"no webhook configurations named {name!r}")
