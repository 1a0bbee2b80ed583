"""``admission-policy lint``: compile policies without evaluating anything, for CI."""
from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from ..documents import DocumentError, dump_json
from ..lint import lint_json, lint_policies, lint_text
from ..options import gates_option, now_option, parse_now, use_gates
from ..output import fail


@click.command("lint")
@gates_option
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--require-portable", is_flag=True,
              help="Also exit 2 when a policy could not be a ValidatingAdmissionPolicy.")
@click.option("--strict", is_flag=True,
              help="Also exit 2 when an expression does not type-check against the schemas of the kinds it matches.")
@now_option
@click.argument("paths", nargs=-1, required=True, type=click.Path())
def lint_command(feature_gates: str, output: str, require_portable: bool, strict: bool, now_text: str | None,
                 paths: Sequence[str]) -> None:
    """Compile AdmissionPolicies without evaluating anything: a check for CI pipelines.

    Each PATH is a policy file or a directory, searched recursively (other kinds are skipped);
    NamespacedAdmissionPolicies are linted alike, named namespace/name, with the plugins
    AP_TENANT_PLUGINS allows (none when unset). Limits and discovery checks need the cluster.
    Each policy is parsed and its CEL compiled and type-checked by the code the operator's
    validating webhook runs at `kubectl apply`. Prints one line per policy: "ok", or one "error"
    line per problem naming the file, the policy, the field path and, for CEL, line and column.
    A policy using a plugin that a feature gate switches off compiles with a "warn" line: the
    operator skips those rules.

    Then, for each policy that compiles, whether it could be a ValidatingAdmissionPolicy:
    "portable" (with the oldest Kubernetes it needs), or one "not portable" line per obstacle
    (a mutation, a plugin, context, a CEL function Kubernetes lacks), and "note" lines for what
    ports only with a translation (excludeNamespaces, an unset reason...).
    AdmissionPolicyExceptions under the PATHs are checked as the operator's webhook will check
    them at `kubectl apply`, against the policies linted with them: the policies and rules they
    name exist and allow exceptions, and expiresAt is within the policy's
    spec.exceptions.maxDuration; one that has expired at --now (the real time by default) gets a
    "warn" line.
    Each policy that compiles is type-checked as Kubernetes checks a ValidatingAdmissionPolicy:
    its expressions against the schemas of the kinds its rules name (built-in kinds, and the
    CustomResourceDefinitions among the PATHs), one "warn" line per expression that does not
    check (a misspelt field, say), naming the field, line and column.
    Exits 0 when every policy compiles, 2 on any error (with --require-portable, also when one
    is not portable; with --strict, also when an expression does not type-check).
    """
    use_gates(feature_gates, output)
    try:
        now = parse_now(now_text)
    except DocumentError as exc:
        fail(exc, output)
    results = lint_policies(paths, now)
    click.echo(dump_json(lint_json(results)) if output == "json" else lint_text(results))
    stuck = require_portable and any(r.portability is not None and not r.portability.portable for r in results)
    stuck = stuck or (strict and any(result.type_warnings for result in results))
    sys.exit(0 if all(result.ok for result in results) and not stuck else 2)
