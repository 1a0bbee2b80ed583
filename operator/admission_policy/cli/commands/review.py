"""``admission-policy review``: the AdmissionReview response the webhook returns for a request."""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import click

from ...engine import Phase, PolicySet, ReviewError, build_response, evaluate, parse_review
from ..authorizer import answered, combined, read_answers
from ..documents import DocumentError, load_policies, objects_in, read_documents
from ..options import gates_option, input_options, read_inputs, use_gates
from ..output import fail


@click.command("review")
@click.option("-p", "--policy", "policy_paths", multiple=True, type=click.Path(), required=True,
              help="AdmissionPolicy or NamespacedAdmissionPolicy file or directory (repeatable).")
@click.option("-n", "--namespace", "namespace_paths", multiple=True, type=click.Path(),
              help="Namespace object(s), for namespaceSelector and namespaceObject (repeatable).")
@click.option("--phase", type=click.Choice([p.value for p in Phase]), default=Phase.ALL.value, show_default=True,
              help="Which webhook to act as: mutate, validate, or both in the API server's order.")
@input_options
@gates_option
@click.argument("review_path", metavar="REVIEW.json|-", type=click.Path())
def review_command(policy_paths: Sequence[str], namespace_paths: Sequence[str], phase: str,
                   param_paths: Sequence[str], context_specs: Sequence[str], authorizer_paths: Sequence[str],
                   feature_gates: str, review_path: str) -> None:
    """Print the AdmissionReview response the webhook returns for an AdmissionReview request.

    Exits 0 whenever a response was produced, allowed or not; 2 for unusable input.
    """
    use_gates(feature_gates)
    try:
        policies = PolicySet(load_policies(policy_paths))
        namespaces: dict[str, Any] = {}
        for source, body in (found for path in namespace_paths for found in objects_in(path)):
            if body["kind"] != "Namespace":
                raise DocumentError(f"{source}: expected a Namespace, got kind {body['kind']!r}")
            namespaces[str((body.get("metadata") or {}).get("name", ""))] = body
        given = read_inputs(param_paths, context_specs, policies)
        answers = combined(read_answers(path) for path in authorizer_paths)
        documents = read_documents(review_path)
        if len(documents) != 1:
            raise DocumentError(f"{review_path}: expected one AdmissionReview, found {len(documents)} documents")
        try:
            request = parse_review(documents[0].body)
        except ReviewError as exc:
            raise DocumentError(f"{review_path}: invalid AdmissionReview: {exc}") from None
        decision = answered(evaluate(policies, request, namespaces.get(request.namespace), Phase(phase), inputs=given,
                                     authorization=answers))
    except DocumentError as exc:
        fail(exc)
    click.echo(json.dumps(build_response(decision, request.uid, request.api_version), indent=2))
