"""API calls of the operator's own tasks and of the CLI (Kopf has its own connection)."""
from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config

logger = logging.getLogger(__name__)

# Seconds an API call of the operator's own (not a watch) may take: without a limit the client
# waits on a half-open connection for ever, and the certificate renewal, the configuration writer,
# the audit, the reports or discovery with it.
CALL_TIMEOUT = 60.0
NO_ANSWER = "no answer from the API server within {:g} s"


class NoAnswer(client.ApiException):
    """A call the API server did not answer within ``CALL_TIMEOUT``: a 504, as the API server's own
    "the request timed out", so that every caller handling a failed call handles this one too."""

    def __init__(self) -> None:
        super().__init__(status=504, reason=NO_ANSWER.format(CALL_TIMEOUT))
        self.body = b""   # the client decodes the body of every ApiException passing through it


class BoundedApiClient(client.ApiClient):
    """kubernetes_asyncio's client, with every call given ``CALL_TIMEOUT`` unless it brings its own
    ``_request_timeout`` (lists and watches bring a read timeout: ``cluster/watch.py``).

    kubernetes_asyncio gives aiohttp an unlimited timeout for a call without one (its ``rest.py``),
    whatever the session's default; so the limit is set here, on the one path every typed call,
    ``call_api`` and ``call_json`` takes, as Kopf's ``settings.networking.request_timeout`` does for
    its own calls.
    """

    async def request(self, method: str, url: str, query_params: Any | None = None,
                      headers: dict[str, Any] | None = None, post_params: dict[str, Any] | None = None,
                      body: Any | None = None, _preload_content: bool = True,
                      _request_timeout: float | tuple[float] | aiohttp.ClientTimeout | None = None) -> Any:
        if _request_timeout is not None:
            return await super().request(method, url, query_params, headers, post_params, body, _preload_content,
                                         _request_timeout)
        try:
            # A total: also over reading the body, which a call without _preload_content does later.
            return await super().request(method, url, query_params, headers, post_params, body, _preload_content,
                                         aiohttp.ClientTimeout(total=CALL_TIMEOUT))
        except TimeoutError:
            raise NoAnswer() from None


async def new_api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """In-cluster credentials when running in a pod, the kubeconfig otherwise (like Kopf);
    with ``kubeconfig``, that file's current context. Every call is bounded (``BoundedApiClient``)."""
    configuration = client.Configuration()
    if kubeconfig is not None:
        await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        return BoundedApiClient(configuration=configuration)
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        await config.load_kube_config(client_configuration=configuration)
    return BoundedApiClient(configuration=configuration)


async def call_json(api: client.ApiClient, method: str, path: str, *, query: list[tuple[str, str]] | None = None,
                    body: Any = None, content_type: str = "application/json") -> tuple[int, Any]:
    """One API call on a path of any resource (the typed clients know only built-in kinds):
    the HTTP status and the decoded JSON body, whatever the status (the caller decides). No answer
    within ``CALL_TIMEOUT`` (``BoundedApiClient``'s) is a 504, an API server that cannot be reached
    a 503, each with a message."""
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type
    try:
        response: Any = await api.call_api(path, method, query_params=query or [], header_params=headers,
                                           body=body, auth_settings=["BearerToken"], _preload_content=False)
        try:
            data = await response.read()
        finally:
            response.release()
    except (NoAnswer, TimeoutError):   # the body too slow: the same limit, run out while reading it
        return 504, {"message": NO_ANSWER.format(CALL_TIMEOUT)}
    except aiohttp.ClientError as exc:
        return 503, {"message": f"cannot reach the API server: {exc}"}
    try:
        decoded = json.loads(data) if data else None
    except ValueError:
        decoded = {"message": data[:500].decode("utf-8", "replace")}
    return int(response.status), decoded


def message_of(answer: Any) -> str:
    """A failed call's Status message ("" when the answer has none)."""
    return str(answer.get("message", "")) if isinstance(answer, Mapping) else ""


def resource_path(group: str, version: str, resource: str, namespace: str = "", name: str = "") -> str:
    """``/api/v1/namespaces/NS/pods/NAME``, ``/apis/GROUP/VERSION/RESOURCE`` and the like."""
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    where = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{where}/{resource}" + (f"/{name}" if name else "")


async def served_version(call: Callable[..., Awaitable[tuple[int, Any]]], group: str, versions: Sequence[str],
                         plural: str) -> str | None:
    """The first of ``versions`` (newest first) of ``group`` that serves ``plural``, or None. Only a
    404 says a version is not served: any other failure (a 503: the API server starting, or out
    of reach) is an error, never taken for an API that is gone. ``call``: ``call_json`` bound to
    a client."""
    for version in versions:
        code, answer = await call("GET", f"/apis/{group}/{version}")
        if code == 404:
            continue
        if not 200 <= code <= 299:
            raise RuntimeError(f"discovery of {group}/{version} failed ({code}): {message_of(answer)}")
        if any(r.get("name") == plural for r in (answer or {}).get("resources") or []):
            return version
    return None

