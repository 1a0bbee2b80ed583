"""AdmissionReview request JSON → a typed request the engine can route and evaluate."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

OPERATIONS: Final = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})


class ReviewError(ValueError):
    """An AdmissionReview that cannot be evaluated; the message says which field is wrong."""


@dataclasses.dataclass(frozen=True)
class AdmissionRequest:
    uid: str
    group: str
    version: str
    resource: str
    sub_resource: str
    operation: str
    namespace: str
    name: str
    object: Any
    old_object: Any
    dry_run: bool
    raw: Mapping[str, Any]          # CEL's ``request``: the request without object/oldObject
    api_version: str = "admission.k8s.io/v1"


def parse_review(review: Any) -> AdmissionRequest:
    """Check and unpack an AdmissionReview (v1 or v1beta1) as the API server sends it."""
    if not isinstance(review, Mapping):
        raise ReviewError("an AdmissionReview must be a JSON object")
    if review.get("kind") != "AdmissionReview":
        raise ReviewError(f"kind must be 'AdmissionReview', got {review.get('kind')!r}")
    api_version = review.get("apiVersion", "admission.k8s.io/v1")
    if api_version not in ("admission.k8s.io/v1", "admission.k8s.io/v1beta1"):
        raise ReviewError(f"apiVersion {api_version!r} is not admission.k8s.io/v1")
    request = review.get("request")
    if not isinstance(request, Mapping):
        raise ReviewError("request is missing or not an object")
    uid = _string(request, "uid", required=True)
    operation = _string(request, "operation", required=True)
    if operation not in OPERATIONS:
        raise ReviewError(f"request.operation must be one of {', '.join(sorted(OPERATIONS))}, got {operation!r}")
    resource = request.get("resource")
    if not isinstance(resource, Mapping):
        raise ReviewError("request.resource is missing or not an object")
    new, old = request.get("object"), request.get("oldObject")
    for field, body in (("object", new), ("oldObject", old)):
        if body is not None and not isinstance(body, Mapping):
            raise ReviewError(f"request.{field} must be an object or null")
    if operation in ("CREATE", "UPDATE") and new is None:
        raise ReviewError(f"request.object is required for {operation}")
    if operation == "UPDATE" and old is None:
        raise ReviewError("request.oldObject is required for UPDATE")
    return AdmissionRequest(
        uid=uid,
        group=_string(resource, "group", where="request.resource"),
        version=_string(resource, "version", where="request.resource"),
        resource=_string(resource, "resource", where="request.resource", required=True),
        sub_resource=_string(request, "subResource"),
        operation=operation,
        namespace=_string(request, "namespace"),
        name=_string(request, "name"),
        object=new,
        old_object=old,
        dry_run=bool(request.get("dryRun", False)),
        # As in Kubernetes, the objects are their own variables; leaving them out of ``request`` also
        # spares converting them again whenever an expression reads request.operation.
        raw={key: value for key, value in request.items() if key not in ("object", "oldObject")},
        api_version=api_version,
    )


def _string(data: Mapping[str, Any], key: str, *, where: str = "request", required: bool = False) -> str:
    value = data.get(key)
    if value is None or value == "":
        if required:
            raise ReviewError(f"{where}.{key} is required")
        return ""
    if not isinstance(value, str):
        raise ReviewError(f"{where}.{key} must be a string")
    return value
