"""``admission-policy convert``: ValidatingAdmissionPolicies and bindings into AdmissionPolicies."""
from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import click

from ..documents import DocumentError
from ..output import fail


@click.command("convert")
@click.option("-o", "--output", "output_path", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Write the AdmissionPolicies to FILE instead of standard output.")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
def convert_command(output_path: str | None, paths: Sequence[str]) -> None:
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
    from ..convert import convert_paths, dump

    try:
        result = convert_paths(paths)
        if result.policies and output_path is not None:
            try:
                Path(output_path).write_text(dump(result.policies), encoding="utf-8")
            except OSError as exc:
                raise DocumentError(f"-o {output_path}: cannot write: {exc.strerror or exc}") from None
        elif result.policies:
            click.echo(dump(result.policies), nl=False)
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
