"""Decision → AdmissionReview response, exactly as the webhook returns it."""
from __future__ import annotations

import base64
import json
from typing import Any

from .verdicts import Decision


def build_response(decision: Decision, uid: str, api_version: str = "admission.k8s.io/v1") -> dict[str, Any]:
    """The AdmissionReview answering ``uid``: only the decision's answer fields, as the API
    server reads them (a denial's status, warnings, the patch base64-encoded)."""
    response: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {"code": decision.code, "message": decision.message, "reason": decision.reason}
    if decision.warnings:
        response["warnings"] = list(decision.warnings)
    if decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = encode_patch(decision.patch)
    if decision.audit_annotations:
        response["auditAnnotations"] = dict(decision.audit_annotations)
    return {"apiVersion": api_version, "kind": "AdmissionReview", "response": response}


def encode_patch(patch: Any) -> str:
    """Strict JSON: a NaN or Infinity raises here rather than reaching the API server as invalid JSON."""
    return base64.b64encode(json.dumps(list(patch), separators=(",", ":"), allow_nan=False).encode()).decode("ascii")


def error_response(uid: str, message: str, code: int = 400) -> dict[str, Any]:
    """The answer to a review that could not be evaluated at all (malformed request)."""
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": uid, "allowed": False,
                         "status": {"code": code, "message": message, "reason": "BadRequest"}}}
