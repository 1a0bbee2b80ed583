"""Options several commands share: what the cluster would hold (--param, --context), what its
authorizer would answer (--authorizer), and the feature gates (--feature-gates), with the reading
of what they give."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import click

from .. import api, features, plugins, policyexception
from ..engine import CompiledPolicy, StaticInputs
from .documents import DocumentError, Found, objects_in
from .inputs import checked_inputs
from .output import fail


def input_options(fn: Any) -> Any:
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


def read_inputs(param_paths: Sequence[str], context_specs: Sequence[str],
                policies: Iterable[CompiledPolicy]) -> StaticInputs:
    """The objects of --param and --context files, checked against the policies that read them."""
    params = [found for path in param_paths for found in objects_in(path)]
    context: dict[str, tuple[str, list[Found]]] = {}
    for spec in context_specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise DocumentError(f"--context: {spec!r} is not NAME=FILE_OR_DIR")
        context.setdefault(name, (f"--context {name}", []))[1].extend(objects_in(path))
    return checked_inputs(policies, params, context)


def gates_option(fn: Any) -> Any:
    """--feature-gates, as `run` takes it: rules of gated-off plugins are skipped, as in the cluster."""
    return click.option("--feature-gates", "feature_gates", envvar=features.ENV, default="",
                        metavar="Name=true|false,...",
                        help="Feature gates as the operator would be given them; `admission-policy plugins` "
                             f"lists them [env {features.ENV}].")(fn)


def parse_gates(text: str, output: str = "text", found: plugins.Registry | None = None) -> features.FeatureGates:
    """The gates given, or exit 2 with one line saying whether the flag or the variable is wrong."""
    try:
        return features.parse(text, found)
    except features.FeatureGateError as exc:
        source = click.get_current_context().get_parameter_source("feature_gates")
        given = features.ENV if source == click.ParameterSource.ENVIRONMENT else "--feature-gates"
        fail(DocumentError(f"{given}: {exc}"), output)


def use_gates(text: str, output: str = "text") -> None:
    """Set the gates before any policy is compiled, for this command only (the CLI may run inside
    another program, as in tests)."""
    features.configure(parse_gates(text, output))
    click.get_current_context().call_on_close(lambda: features.configure(None))


def now_option(fn: Any) -> Any:
    """--now: the time AdmissionPolicyExceptions' expiry is judged at, so that results repeat."""
    return click.option("--now", "now_text", default=None, metavar="RFC3339",
                        help="The time to judge exceptions' expiry at, e.g. 2026-12-31T00:00:00Z "
                             "(default: the real time).")(fn)


def parse_now(text: str | None, where: str = "--now") -> float | None:
    """Seconds since the epoch of ``text`` (None: the real time, read when needed)."""
    if text is None:
        return None
    try:
        return policyexception.parse_time(text, where)
    except api.PolicyError as exc:
        raise DocumentError(str(exc)) from None
