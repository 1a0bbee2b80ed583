"""AdmissionReview request JSON → a typed request the engine can route and evaluate."""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Mapping
from types import FrameType
from typing import Any, Final

import orjson

from ..errors import AdmissionPolicyError

OPERATIONS: Final = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})

# Deeper JSON is refused (400, so the API server applies the webhook's failurePolicy). The API
# server itself accepts 10,000 levels (Go's encoding/json), but the CEL library converts an object
# recursively in native code and crashes the process somewhere between 5,000 and 10,000 levels,
# and Python code (copies, patches) stops at its 1,000-frame recursion limit: one such object
# would otherwise take down every replica. Real objects nest a few dozen levels.
MAX_JSON_DEPTH: Final = 1_000
# json.loads and its decoder's 3 frames, and up to 10 recursion entries of C code under the caller
# that a walk of the frames does not see (asyncio's task step, for one): at least MAX_JSON_DEPTH.
_DECODER_FRAMES: Final = 3 + 10


class ReviewError(AdmissionPolicyError, ValueError):
    """An AdmissionReview that cannot be evaluated; the message says which field is wrong."""


@dataclasses.dataclass(frozen=True)
class AdmissionRequest:
    """An AdmissionReview's request, checked by ``parse_review``: the engine relies on its
    fields being there and of their types (an object for CREATE and UPDATE, an old object for
    UPDATE). ``group``/``version``/``resource`` are ``request.resource``, what policies match."""
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


def decode_review(body: bytes, charset: str | None = None) -> Any:
    """The JSON of a review as the API server sends it: UTF-8, standard numbers only (no NaN or
    Infinity, which are not JSON and could come back in a patch), at most ``MAX_JSON_DEPTH`` deep."""
    if charset is not None and charset.lower().replace("-", "") != "utf8":
        raise ReviewError(f"charset {charset!r} is not supported: an AdmissionReview is UTF-8 JSON")
    # orjson, several times faster, takes what it can: it refuses what the rules above refuse
    # (not UTF-8, NaN, numbers out of range), and a body with fewer brackets than the depth limit
    # cannot nest deeper. What it refuses goes through the standard parser, which says exactly
    # what is wrong (or takes lone surrogates, which orjson does not). An integer beyond 64 bits
    # becomes a double, as in the API server's own decoding.
    if body.count(b"[") + body.count(b"{") < MAX_JSON_DEPTH:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReviewError(f"the body is not UTF-8 (byte {exc.start}): an AdmissionReview is UTF-8 JSON") from None
    try:
        return _loads(text)
    except ReviewError:
        raise
    except RecursionError:
        raise ReviewError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:    # JSONDecodeError, and integers of more digits than Python converts
        raise ReviewError(f"not JSON: {exc}") from None


def _loads(text: str) -> Any:
    """``json.loads`` with the recursion limit (one level of nesting each) at the frames already on
    the stack plus ``MAX_JSON_DEPTH``: about the same limit whoever calls, whatever the process's."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(_stack_depth() + MAX_JSON_DEPTH + _DECODER_FRAMES)
    try:
        return json.loads(text, parse_constant=_non_standard, parse_float=_finite, parse_int=_integer)
    finally:
        sys.setrecursionlimit(limit)


def _stack_depth() -> int:
    frame: FrameType | None = sys._getframe()
    depth = 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


def _non_standard(constant: str) -> Any:
    raise ReviewError(f"{constant} is not a JSON number")


def _integer(literal: str) -> int | float:
    """A double beyond 64 bits, as orjson (the fast path) and the API server read it."""
    value = int(literal)
    return value if -(1 << 63) <= value < (1 << 64) else _finite(literal)


def _finite(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise ReviewError(f"number {literal} is out of range (a JSON number the API server sends is a finite double)")
    return value


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
        if body is not None and not isinstance(body.get("metadata") or {}, Mapping):
            raise ReviewError(f"request.{field}.metadata must be an object")
    if operation in ("CREATE", "UPDATE") and new is None:
        raise ReviewError(f"request.object is required for {operation}")
    if operation == "UPDATE" and old is None:
        raise ReviewError("request.oldObject is required for UPDATE")
    return AdmissionRequest(
        uid=uid,
        group=_string(resource, "group", where="request.resource"),
        # Go decodes an absent group as "", the core group; without a version nothing can be routed.
        version=_string(resource, "version", where="request.resource", required=True),
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
