"""List and watch, resiliently: the one way every replica follows the cluster.

Kopf's watch streams pause when peering makes another replica the active one; admission must
not, so serving state comes from these plain watches (the policies, the namespaces, the webhook
configurations, params and context).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import client, watch

logger = logging.getLogger(__name__)

Lister = Callable[..., Any]


async def watch_objects(
    what: str,
    lister: Lister,
    on_event: Callable[[str, Mapping[str, Any]], None],
    on_listed: Callable[[set[str]], None],
) -> None:
    """List and watch anything else (the webhook configurations), the same resilient way."""
    await list_and_watch(what, lister, on_event, on_listed, asyncio.Event())


WATCH_SECONDS = 300   # each watch request's timeoutSeconds; the next one resumes where it ended
ABSENT_RECHECK = 30.0   # how often a resource whose CRD is not installed is looked for again
# Without a read timeout kubernetes_asyncio waits on a half-open connection for ever (an unlimited
# aiohttp ClientTimeout), and the last state seen keeps being served as current. The API server ends a
# healthy watch after WATCH_SECONDS; every event or bookmark restarts the count (a socket read timeout).
STALL_MARGIN = 30
CONNECT_SECONDS = 30


def read_timeout() -> aiohttp.ClientTimeout:
    """Every list and watch request's: silent for longer than this, the connection has stalled.
    (A function, not a constant: tests shorten the stall margin.)"""
    return aiohttp.ClientTimeout(sock_connect=CONNECT_SECONDS, sock_read=WATCH_SECONDS + STALL_MARGIN)


def failure_text(exc: Exception) -> str:
    """An API call's failure, for status messages: "403 Forbidden", a stall, or the error itself."""
    if isinstance(exc, client.ApiException):
        return f"{exc.status} {exc.reason}"
    if isinstance(exc, aiohttp.SocketTimeoutError):
        return f"the connection stalled: no data from the API server for {WATCH_SECONDS + STALL_MARGIN}s"
    return str(exc) or type(exc).__name__


async def list_and_watch(
    what: str,
    lister: Lister,
    on_event: Callable[[str, Mapping[str, Any]], None],
    on_listed: Callable[[set[str]], None],
    loaded: asyncio.Event,
    unsynced: dict[str, float] | None = None,
    *,
    on_error: Callable[[str], None] | None = None,
    crd: str = "",
) -> None:
    """List, then watch from the last resourceVersion seen, as client-go's reflector does: a watch
    that times out is resumed, and only an error (410 Gone: too old) or a failure lists again.
    A relist of a thousand policies every few minutes would cost every replica a burst of memory.
    A connection silent past ``read_timeout`` (stalled) is a failure too.

    ``unsynced`` holds ``what`` → since when (monotonic) while the watch has failed and not listed
    again: what keeps being served meanwhile is the last state seen (readiness says so).

    ``crd``: the file of the CRD that serves an optional resource (a cluster may run without
    tenant policies or exceptions, or a chart be upgraded without their CRDs, which Helm never
    upgrades). A listing that answers 404 then means "none": it is said once, at WARNING, the
    resource counts as loaded and in sync, and it is looked for again every ABSENT_RECHECK
    seconds, quietly, until its CRD is applied."""
    unsynced = {} if unsynced is None else unsynced
    backoff = 1.0
    version: str | None = None
    absent = False
    while True:
        listed = version is None
        try:
            if listed:
                version = await _list(lister, on_event, on_listed)
                loaded.set()
                backoff = 1.0   # back: the next failure is a new outage, retried promptly
                if absent:
                    absent = False
                    logger.info("%s are served now: watching them", what)
                if (since := unsynced.pop(what, None)) is not None:
                    logger.info("Watching %s again: listed after %.1fs without a watch", what, time.monotonic() - since)
            stream = watch.Watch()
            async with stream:
                async for event in stream.stream(lister, resource_version=version, timeout_seconds=WATCH_SECONDS,
                                                 allow_watch_bookmarks=True, _request_timeout=read_timeout()):
                    kind, body = event.get("type"), event.get("raw_object")
                    if kind == "ERROR" or not isinstance(body, Mapping) or "metadata" not in body:
                        version = None
                        break
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        on_event(str(kind), body)
                    version = body["metadata"].get("resourceVersion") or version
                    backoff = 1.0
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            resumed_from, version = version, None
            if isinstance(exc, client.ApiException) and exc.status == 410 and not listed:
                # Gone (an ERROR event, raised by the client): too old to resume; list now.
                logger.info("Watching %s: resourceVersion %s is too old to resume (410 Gone); listing again",
                            what, resumed_from)
                continue
            if crd and listed and isinstance(exc, client.ApiException) and exc.status == 404:
                if not absent:
                    logger.warning("%s are not served (is %s applied?): none applies until they are; "
                                   "looking again every %.0fs", what, crd, ABSENT_RECHECK)
                absent = True
                on_listed(set())   # none: what was seen before the CRD went is gone with it
                loaded.set()
                unsynced.pop(what, None)
                await asyncio.sleep(ABSENT_RECHECK)
                continue
            unsynced.setdefault(what, time.monotonic())
            if on_error is not None:
                on_error(failure_text(exc))
            logger.warning("Watching %s failed, retrying in %.0fs: %s", what, backoff,
                           exc if isinstance(exc, client.ApiException) else failure_text(exc))   # with its body
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 30.0)


def _status_reason(text: str) -> str:
    """A failed request's Status as the client words a watch's ERROR event: "Forbidden: configmaps
    is forbidden: User ... cannot list ...", rather than its whole JSON."""
    try:
        status = json.loads(text)
    except ValueError:
        status = None
    if isinstance(status, dict) and status.get("message"):
        return f"{status.get('reason')}: {status['message']}"[:500]
    return text[:500]


async def _list(
    lister: Lister,
    on_event: Callable[[str, Mapping[str, Any]], None],
    on_listed: Callable[[set[str]], None],
) -> str | None:
    """Apply a full listing; returns its resourceVersion. The listing is not kept while watching."""
    listing = await lister(_preload_content=False, _request_timeout=read_timeout())
    # Unread, the client raises on no status: an API server still starting answers 503 (or 404 before
    # its CRDs are served), whose Status has no items — taken as a listing, it would forget everything.
    if not 200 <= listing.status <= 299:
        raise client.ApiException(status=listing.status, reason=_status_reason(await listing.text()))
    data = await listing.json()
    if not isinstance(data.get("items"), list):
        raise ValueError(f"a listing without items: {str(data)[:500]}")
    names = set()
    # A list's items carry no kind or apiVersion (the list does): fill them, as a watch event's have them
    # and a policy may read object.kind from a context list or params.
    kind, api_version = str(data.get("kind") or "").removesuffix("List"), data.get("apiVersion")
    for item in data.get("items", []):
        if kind and api_version and "kind" not in item:
            item = {"apiVersion": api_version, "kind": kind, **item}
        metadata = item["metadata"]
        # namespace/name for namespaced objects (params and context caches); name alone otherwise.
        names.add(f"{metadata['namespace']}/{metadata['name']}" if metadata.get("namespace") else metadata["name"])
        on_event("ADDED", item)
    on_listed(names)
    return (data.get("metadata") or {}).get("resourceVersion")
