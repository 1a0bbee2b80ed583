"""The webhook server: Kopf's WebhookServer, with the engine's decision as the response.

Kopf routes each request to the handler named by the path's last segment and runs it; the
handler stores the engine's Decision in the request's ``Exchange``. The response is then built
from that Decision by the same function the CLI's ``review`` uses, because Kopf's own response
carries no ``auditAnnotations`` or ``status.reason``.

The handlers read the request parsed here, so Kopf is given the objects' identity only (kind
and names, see ``_IDENTITY``): it deep-copies the object for its patch and diffs old against new
on every request, work whose result this server never uses (a third of Kopf's cost for a Pod
UPDATE).
"""
from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

import aiohttp.web
import kopf

from ..engine import AdmissionRequest, Decision, ReviewError, build_response, parse_review

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Exchange:
    request: AdmissionRequest
    decision: Decision | None = None


_exchange: contextvars.ContextVar[Exchange] = contextvars.ContextVar("admission_policy_exchange")


def current_exchange() -> Exchange:
    """The request being served, for the handler Kopf runs in this request's context."""
    return _exchange.get()


class PolicyWebhookServer(kopf.WebhookServer):
    def __init__(self, *, listening: asyncio.Event, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.listening = listening

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        async def serve(data: Any, *, webhook: str | None = None, headers: dict[str, str] | None = None,
                        sslpeer: dict[str, Any] | None = None) -> Any:
            try:
                request = parse_review(data)
            except ReviewError as exc:
                # Kopf answers a 500 to bodies it cannot read; this is the client's mistake.
                raise aiohttp.web.HTTPBadRequest(text=f"invalid AdmissionReview: {exc}") from None
            exchange = Exchange(request)
            token = _exchange.set(exchange)
            try:
                stubbed: Any = _identities_only(data)
                response: Any = await fn(stubbed, webhook=webhook, headers=headers, sslpeer=sslpeer)
            finally:
                _exchange.reset(token)
            if exchange.decision is not None:
                response = build_response(exchange.decision, request.uid, request.api_version)
            return response

        async for client_config in super().__call__(cast(kopf.WebhookFn, serve)):
            self.listening.set()
            yield client_config


def _identities_only(review: Mapping[str, Any]) -> dict[str, Any]:
    """The review with each object cut down to what Kopf routes and remembers it by."""
    request = dict(review["request"])
    for field in ("object", "oldObject"):
        body = request.get(field)
        if isinstance(body, Mapping):
            metadata = body.get("metadata") or {}
            request[field] = {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
                              "metadata": {key: metadata[key] for key in _IDENTITY if key in metadata}}
    return {**review, "request": request}


# No uid: Kopf keeps a memory per uid for each UPDATE/DELETE it admits, forgotten only when one
# of its own watches sees the object deleted, and it watches nothing but AdmissionPolicies. With
# the uid, every pod ever updated would stay in the operator's memory for good.
_IDENTITY = ("name", "generateName", "namespace")
