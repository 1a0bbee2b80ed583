"""``admission-policy audit``: what existing objects (manifests, or a live cluster) violate."""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import click
import yaml

from ... import api, features
from ...config import OperatorConfig
from ...engine import ExceptionSet
from ..authorizer import combined, read_answers
from ..documents import DocumentError, checked_exceptions, dump_json, load_exceptions, load_policies, read_documents
from ..options import gates_option, input_options, now_option, parse_now, read_inputs, use_gates
from ..output import fail

AUDIT_INCOMPLETE = 3   # `audit --kubeconfig`: some resources could not be listed, no Enforce violation found


@click.command("audit")
@click.option("-p", "--policy", "policy_paths", multiple=True, type=click.Path(), required=True,
              help="AdmissionPolicy or NamespacedAdmissionPolicy file or directory (repeatable).")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None,
              help="Audit a live cluster's objects (read only) instead of manifests.")
@click.option("-o", "--output", type=click.Choice(["text", "json", "yaml"]), default="text", show_default=True,
              help="A table per policy, or the openreports Reports the operator would write.")
@click.option("--progress", type=click.Choice(["auto", "always", "never"]), default="auto", show_default=True,
              help="A progress bar on standard error while listing a cluster (auto: when it is a terminal).")
@input_options
@now_option
@gates_option
@click.argument("paths", nargs=-1, type=click.Path())
def audit_command(policy_paths: Sequence[str], kubeconfig: str | None, output: str, progress: str,
                  param_paths: Sequence[str], context_specs: Sequence[str], authorizer_paths: Sequence[str],
                  now_text: str | None, feature_gates: str, paths: Sequence[str]) -> None:
    """Judge existing objects as the operator's background audit does.

    \b
    Objects: PATHs (files, directories, - for standard input; multi-document YAML and List
    kinds), or with --kubeconfig every object the policies' rules name in that cluster
    (paged lists; exempt namespaces are skipped, as the operator skips them;
    AP_EXEMPT_NAMESPACES and AP_NAMESPACE are read).
    A NamespacedAdmissionPolicy judges the objects of its own namespace only; what only such
    policies name is listed in their namespaces, so a namespace's admin may audit them.
    Each object is evaluated as a background request: request.operation CREATE, no
    oldObject, an empty request.userInfo; validations judge the object as it is, and
    mutations are only reported ("would mutate"). Policies that read params or context get
    them from --param and --context files, also against a cluster. A resource the cluster
    refuses to list (RBAC's 403, an API down) is named on standard error and the audit goes on
    with the rest, as the operator's does. AdmissionPolicyExceptions among the policies' files
    and the manifests waive what they cover (result skip), judged at --now.

    Exits 1 when an Enforce policy is violated (a CI gate for manifests), 2 for unusable
    input, 3 when no Enforce policy is violated but some resources could not be listed (the
    audit is incomplete), 0 otherwise.
    """
    import asyncio

    from ..audit import audit_cluster, audit_manifests, progress_enabled, report_list, stderr_progress, table

    use_gates(feature_gates, output)
    try:
        if kubeconfig is not None and paths:
            raise DocumentError("give manifests (PATHs) or --kubeconfig, not both")
        if kubeconfig is None and not paths:
            raise DocumentError("nothing to audit: give manifests (PATHs, - for standard input) or --kubeconfig")
        if kubeconfig is not None:
            _check_kubeconfig(kubeconfig)
        policies = load_policies(policy_paths)
        if not policies:
            raise DocumentError(f"no AdmissionPolicy or {api.NAMESPACED_KIND} found in {', '.join(policy_paths)}")
        given_now = parse_now(now_text)
        now = int(time.time() if given_now is None else given_now)
        given = read_inputs(param_paths, context_specs, policies)
        answers = combined(read_answers(path) for path in authorizer_paths)
        roots = dict.fromkeys([*policy_paths, *(path for path in paths if path != "-")])   # stdin: the objects
        exceptions = ExceptionSet(checked_exceptions(load_exceptions(roots), policies, "audit"))
        if kubeconfig is None:
            run = audit_manifests(policies, paths, now, given, answers, exceptions)
        else:
            try:   # the gates as given above, whichever of the flag and the variable gave them
                settings = OperatorConfig.from_env({**os.environ, features.ENV: feature_gates})
            except ValueError as exc:
                raise DocumentError(str(exc)) from None
            try:
                run = asyncio.run(audit_cluster(policies, kubeconfig, now, settings,
                                                stderr_progress(progress_enabled(progress)), given, answers,
                                                exceptions))
            except DocumentError:
                raise
            except Exception as exc:
                raise DocumentError(f"cannot audit the cluster of {kubeconfig}: {type(exc).__name__}: {exc}") from None
    except DocumentError as exc:
        fail(exc, "json" if output == "json" else "text")
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
        raise DocumentError(f"--kubeconfig {path}: no such file")
    try:
        documents = read_documents(path, allow_empty=False)
    except DocumentError as exc:
        raise DocumentError(f"--kubeconfig {exc}") from None
    body = documents[0].body if len(documents) == 1 else None
    if not isinstance(body, dict) or not body.get("current-context"):
        raise DocumentError(f"--kubeconfig {path}: not a kubeconfig with a current-context")
