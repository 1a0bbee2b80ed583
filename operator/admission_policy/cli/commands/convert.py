"""``admission-policy convert``: ValidatingAdmissionPolicies and bindings into AdmissionPolicies,
and with ``--to-native`` AdmissionPolicies into the ValidatingAdmissionPolicies the operator would
generate."""
from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import click

from ...config import SETTINGS
from ..documents import DocumentError
from ..output import fail


@click.command("convert")
@click.option("-o", "--output", "output_path", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Write the objects to FILE instead of standard output.")
@click.option("--to-native", is_flag=True,
              help="The other way: AdmissionPolicies and NamespacedAdmissionPolicies into the "
                   "ValidatingAdmissionPolicies and bindings the operator would generate for them.")
@click.option("--kubernetes", "kubernetes_text", default=None, metavar="MAJOR.MINOR",
              help="With --to-native: the Kubernetes version to generate for (its CEL, and the API version: "
                   "v1 from 1.30, v1beta1 for 1.28 and 1.29). Default: 1.32, the newest the project's "
                   "end-to-end tests run.")
@click.option("--mutating-api", "mutating_api", type=click.Choice(["v1alpha1", "v1beta1", "v1"]), default=None,
              help="With --to-native: the MutatingAdmissionPolicy version the cluster serves (v1alpha1 from "
                   "Kubernetes 1.32, behind its feature gate), to write a policy's mutations as one. Default: none "
                   "(a policy that mutates stays on the webhook).")
@click.option("--exempt-namespace", "exempt_namespaces", multiple=True, metavar="NS",
              help="With --to-native: a namespace the objects leave alone, as AP_EXEMPT_NAMESPACES and "
                   "AP_NAMESPACE (repeatable or comma-separated; '' for none). Default: kube-system and "
                   "admission-policy-system, the operator's defaults.")
@click.option("--break-glass-group", "break_glass_groups", multiple=True, metavar="GROUP",
              help="With --to-native: as AP_BREAK_GLASS_GROUPS (repeatable or comma-separated; '' for none). "
                   "Default: system:masters.")
@click.option("--break-glass-user", "break_glass_users", multiple=True, metavar="USER",
              help="With --to-native: as AP_BREAK_GLASS_USERS (repeatable or comma-separated). Default: none "
                   "(the Helm chart adds the operator's ServiceAccount).")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
def convert_command(output_path: str | None, to_native: bool, kubernetes_text: str | None,
                    mutating_api: str | None, exempt_namespaces: Sequence[str], break_glass_groups: Sequence[str],
                    break_glass_users: Sequence[str], paths: Sequence[str]) -> None:
    """Convert ValidatingAdmissionPolicies and their bindings into AdmissionPolicies, or
    (--to-native) AdmissionPolicies into ValidatingAdmissionPolicies and bindings.

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

    \b
    With --to-native, each PATH holds AdmissionPolicies and NamespacedAdmissionPolicies (other
    kinds are read past), and each becomes the ValidatingAdmissionPolicy and binding pairs the
    operator would write for it on that Kubernetes (one per place it judges: its resources, the
    Pod templates of workloads, those of CronJobs), and with --mutating-api its mutations as
    MutatingAdmissionPolicy and binding pairs, without the finalizer and the generation
    annotation only the operator keeps true. A policy that cannot be one writes nothing: one
    "not portable" line per obstacle on standard error, naming the file, the policy and the
    field (as `lint` does). A "*" in a rule's groups or resources is one too: the operator expands
    it from the cluster's discovery. Exits 0 when every policy converted, 2 otherwise.
    """
    options = {"--kubernetes": kubernetes_text is not None, "--mutating-api": mutating_api is not None,
               "--exempt-namespace": bool(exempt_namespaces),
               "--break-glass-group": bool(break_glass_groups), "--break-glass-user": bool(break_glass_users)}
    misplaced = [name for name, given in options.items() if given and not to_native]
    if misplaced:
        raise click.UsageError(f"{', '.join(misplaced)}: only with --to-native")
    if to_native:
        _to_native(output_path, kubernetes_text, mutating_api, exempt_namespaces, break_glass_groups,
                   break_glass_users, paths)
    from ..convert import convert_paths, dump

    try:
        result = convert_paths(paths)
        if result.policies:
            _write(dump(result.policies), output_path)
    except DocumentError as exc:
        fail(exc)
    for notice in result.notices:
        click.echo(f"warning: {notice}", err=True)
    for problem in result.problems:
        click.echo(f"error: {problem}", err=True)
    if not result.policies and not result.problems:
        click.echo(f"error: nothing converted: no ValidatingAdmissionPolicyBinding in {', '.join(paths)} "
                   "names a ValidatingAdmissionPolicy given", err=True)
    sys.exit(2 if result.problems or not result.policies else 0)


def _to_native(output_path: str | None, kubernetes_text: str | None, mutating_api: str | None,
               exempt_namespaces: Sequence[str], break_glass_groups: Sequence[str], break_glass_users: Sequence[str],
               paths: Sequence[str]) -> NoReturn:
    from .. import native
    from ..convert import dump

    try:
        kubernetes = native.DEFAULT_KUBERNETES if kubernetes_text is None else native.parse_kubernetes(kubernetes_text)
        goal = native.target(
            kubernetes,
            _names("exempt_namespaces", "--exempt-namespace", exempt_namespaces, native.DEFAULTS.all_exempt_namespaces),
            _names("break_glass_users", "--break-glass-user", break_glass_users, native.DEFAULTS.break_glass_users),
            _names("break_glass_groups", "--break-glass-group", break_glass_groups,
                   native.DEFAULTS.break_glass_groups), mutating_api)
        result = native.to_native(paths, goal)
        if result.objects:
            _write(dump(result.objects), output_path)
    except DocumentError as exc:
        fail(exc)
    for problem in result.problems:
        click.echo(problem, err=True)
    if not result.found:
        click.echo(f"error: nothing converted: no AdmissionPolicy or NamespacedAdmissionPolicy in "
                   f"{', '.join(paths)}", err=True)
    sys.exit(0 if result.found and result.converted == result.found else 2)


def _names(setting: str, option: str, given: Sequence[str], default: tuple[str, ...]) -> tuple[str, ...]:
    """The option's values, checked as the operator checks its variable; the operator's default
    when it is not given."""
    if not given:
        return default
    try:
        return tuple(dict.fromkeys(name for value in given for name in SETTINGS[setting].parse(value, option)))
    except ValueError as exc:
        raise DocumentError(str(exc)) from None


def _write(text: str, output_path: str | None) -> None:
    if output_path is None:
        click.echo(text, nl=False)
        return
    try:
        Path(output_path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise DocumentError(f"-o {output_path}: cannot write: {exc.strerror or exc}") from None
