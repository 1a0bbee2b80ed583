"""The webhook server: Kopf's WebhookServer, with the engine's decision as the response.

Kopf runs the handler named by the path's last segment; the handler stores the engine's
Decision in the request's ``Exchange``. The response is then built from that Decision by the same
function the CLI's ``review`` uses, because Kopf's own response carries no ``auditAnnotations``
or ``status.reason``.

The handlers read the request parsed here, so Kopf is given the objects' identity only (kind
and names, see ``_IDENTITY``): it deep-copies the object for its patch and diffs old against new
on every request, work whose result this server never uses (a third of Kopf's cost for a Pod
UPDATE).

The listener is this module's, not Kopf's (Kopf's TLS files, reloading and client config are
kept), because the API server is its only legitimate client and Kopf's aiohttp defaults suit a
public web server instead:

- only the paths the webhook configurations name are served; any other is 404 (Kopf answers
  ``allowed: true`` for a path naming no handler, so a mistyped URL would disable enforcement);
- a review may be ``MAX_REVIEW_BYTES`` (aiohttp's default is 1 MiB, too small for an UPDATE of
  a large object); bigger is 413. The body must be UTF-8 JSON of standard numbers (400 if not);
- idle and slow connections are closed, and at most ``max_connections`` are open (see the
  constants below and ``_Connections``); each costs little while it has sent no request (``_TLS``);
- TLS 1.2 or newer with AEAD ciphers and forward secrecy only (``_harden``);
- stopping, it drains the API server's keep-alive connections (``Connection: close`` on each
  answer) before closing what is left idle, so a rollout fails no admission (``_drain``).
"""
from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import contextvars
import dataclasses
import hashlib
import logging
import pathlib
import ssl
import time
from asyncio import sslproto
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import aiohttp.web
import kopf
import orjson
from kopf._core.engines import admission as kopf_admission

from ..config import OperatorConfig
from ..engine import AdmissionRequest, Decision, ReviewError, build_response, decode_review, parse_review
from .webhookconfig import (
    MUTATE_EXCEPTION_PATH,
    MUTATE_PATH,
    PROBE_PATH,
    VALIDATE_EXCEPTION_PATH,
    VALIDATE_PATH,
    VALIDATE_POLICY_PATH,
    VALIDATE_TENANT_POLICY_PATH,
)

logger = logging.getLogger(__name__)

WEBHOOK_PATHS = (VALIDATE_PATH, MUTATE_PATH, VALIDATE_POLICY_PATH, VALIDATE_TENANT_POLICY_PATH, VALIDATE_EXCEPTION_PATH,
                 MUTATE_EXCEPTION_PATH, PROBE_PATH)
# The API server sends objects of up to 1.5 MiB (etcd's request limit); an UPDATE carries two of
# them. 1 MiB more covers the review around them and JSON being longer than the stored encoding.
MAX_REVIEW_BYTES = 4 * 1024 * 1024
# The API server keeps idle connections for 90 s (Go's http.Transport IdleConnTimeout, which
# Kubernetes' client transport uses). The server waits longer, so the client always closes an
# idle connection first: were the server first, a review written onto the connection as it closes
# fails, and the API server does not retry a POST. This also bounds how long a client may take to
# send the request line and headers (aiohttp counts a partly received request as idle).
KEEPALIVE_TIMEOUT = 120.0
# Go's client gives up a TLS handshake after 10 s; a handshake still running then is no API server's.
TLS_HANDSHAKE_TIMEOUT = 10.0
# asyncio reads TLS into a buffer of 256 KB allocated per connection at accept: 500 connections that
# never sent a byte cost 140 MB. One TLS record (16 KB and a header) is what a read can decrypt at once;
# reading a 3 MB review through it costs ~1.5 ms more CPU than through 256 KB, a 20 KB one nothing measurable.
TLS_READ_BUFFER = 17 * 1024
# After an early answer (413, 408), how long the rest of the body is read and dropped so that the
# client sees the answer rather than a reset.
LINGERING_TIME = 2.0
# At the connection cap, a connection idle for less than this is not closed to make room: it is
# between two requests of its client (the API server reuses the connection it used last first),
# and closing it races with the next one, which the API server does not retry (a burst of
# connections closed the API server's this way, issue 12). The new connection is refused instead,
# unless a connection that has sent no request yet can be closed (see ``_Connections``).
MIN_IDLE_TO_EVICT = 2.0
# TLS 1.2 suites with ECDHE and AEAD (TLS 1.3's are all such): what Go's client offers first.
CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
LOG_INTERVAL = 60.0     # at most one line per kind of connection trouble per this many seconds
# Stopping, the server drains its connections before closing them (see ``PolicyWebhookServer._drain``):
# for at most DRAIN_SECONDS, and no longer once every open connection has been idle for DRAIN_QUIET.
DRAIN_SECONDS = 5.0
DRAIN_QUIET = 1.0


@dataclasses.dataclass
class Exchange:
    request: AdmissionRequest
    decision: Decision | None = None


_exchange: contextvars.ContextVar[Exchange] = contextvars.ContextVar("admission_policy_exchange")


def current_exchange() -> Exchange:
    """The request being served, for the handler Kopf runs in this request's context."""
    return _exchange.get()


class PolicyWebhookServer(kopf.WebhookServer):
    keepalive_timeout: float = KEEPALIVE_TIMEOUT
    handshake_timeout: float = TLS_HANDSHAKE_TIMEOUT
    min_idle_to_evict: float = MIN_IDLE_TO_EVICT
    drain_seconds: float = DRAIN_SECONDS
    drain_quiet: float = DRAIN_QUIET

    def __init__(self, *, listening: asyncio.Event, max_connections: int = OperatorConfig.max_connections,
                 body_timeout: float = OperatorConfig.webhook_timeout, **kwargs: Any) -> None:
        """``max_connections``: open connections at most (past the TLS handshake; a handshake
        costs ~40 KB until it completes or ``handshake_timeout``); each costs ~75 KB idle. The API
        server keeps up to 25 idle connections to a webhook per instance, and opens more only while
        that many calls are in flight at once.

        ``body_timeout``: how long a request's body may take to arrive once its headers have — the
        webhooks' ``timeoutSeconds``, after which the API server has given up on the answer.
        """
        super().__init__(**kwargs)
        self.listening = listening
        self.max_connections = max_connections
        self.body_timeout = body_timeout
        self._throttle = _Throttle(LOG_INTERVAL)
        self._files_written = asyncio.Event()
        self._loaded = ""   # digest of the certificate files the listener serves
        self._connections: _Connections | None = None
        self._draining = False

    def files_written(self) -> None:
        """The operator wrote new certificate files: load them now rather than at the next poll."""
        self._files_written.set()

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        """Kopf's serving loop, on this module's listener.

        Changed certificate files are loaded into the listening SSL context, which every new
        handshake reads, instead of restarting the listener as Kopf does: a restart refuses
        connections while the port is closed and cuts the API server's open ones, and it does
        not retry a webhook call that fails so (a certificate renewal would fail requests).
        Connections already open keep the certificate they were made with, still trusted.
        """
        self._loaded = self._digest()
        cadata, context = self._build_ssl()
        runner = aiohttp.web.AppRunner(
            self._application(fn), handle_signals=False, access_log=None, auto_decompress=False,
            keepalive_timeout=self.keepalive_timeout, lingering_time=LINGERING_TIME)
        await runner.setup()
        try:
            port = self.port or self._allocate_free_port()
            listener = await self._listen(runner, context, port)
            try:
                self.listening.set()
                yield self._client_config(cadata, context, port)
                while True:
                    await self._until_files_change()
                    if context is not None:
                        self._reload(context)
            finally:
                try:
                    await self._drain()
                finally:
                    listener.close()
        finally:
            await runner.cleanup()

    async def _drain(self) -> None:
        """Stopping: hand the API server's keep-alive connections back before closing them.

        The API server reuses a connection for its next review, and does not retry a POST that
        fails because the server closed the connection as the review was written onto it: every
        connection closed while in use would fail one admission (a rollout did, issue 33). When
        the replica stops, the Service has already stopped sending it new connections (the
        preStop sleep saw to that), but the API server's open ones still lead here. So for up to
        ``drain_seconds`` the server goes on answering, each answer with ``Connection: close``:
        the API server closes that connection itself and opens its next one to a replica that
        stays. Once every connection left has been idle for ``drain_quiet`` (the API server
        reuses the one it used last first, so these are the ones it is not using), they are
        closed, and with them the listener."""
        self._draining = True
        connections = self._connections
        deadline = time.monotonic() + self.drain_seconds
        while connections is not None and time.monotonic() < deadline:
            now = time.monotonic()
            if all(not gate.busy and now - gate.active >= self.drain_quiet for gate in connections.open):
                break
            await asyncio.sleep(0.05)

    def _reload(self, context: ssl.SSLContext) -> None:
        """Serve the certificate in the files from the next handshake on; a pair that does not
        load (a key not matching its certificate) is refused and the current one kept."""
        # Synchronous, on the event loop: no handshake can start between the checks and the load.
        self._loaded = self._digest()
        if self.certfile is None:
            return   # Kopf's self-signed mode: no files to follow
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(self.certfile, self.pkeyfile, self.password)
        except (OSError, ssl.SSLError) as exc:
            logger.warning("Keeping the current serving certificate: the new files do not load (%s)", exc)
            return
        context.load_cert_chain(self.certfile, self.pkeyfile, self.password)
        logger.info("Serving the renewed certificate from %s", self.certfile)

    def _build_ssl(self) -> tuple[bytes | None, ssl.SSLContext | None]:
        cadata, context = super()._build_ssl()
        if context is not None:
            _harden(context)
        return cadata, context

    def _application(self, fn: kopf.WebhookFn) -> aiohttp.web.Application:
        app = aiohttp.web.Application(client_max_size=MAX_REVIEW_BYTES)
        prefix = self.path.rstrip("/") if self.path else ""

        async def answer(request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
            return await self._answer(fn, request)

        for path in WEBHOOK_PATHS:
            app.router.add_post(prefix + path, answer)
        return app

    async def _listen(self, runner: aiohttp.web.AppRunner, context: ssl.SSLContext | None,
                      port: int) -> asyncio.AbstractServer:
        server = runner.server
        assert server is not None, "the runner is set up"
        connections = self._connections = _Connections(self.max_connections, self._throttle, self.min_idle_to_evict)
        loop = asyncio.get_running_loop()

        def accept() -> asyncio.BaseProtocol:
            gate = _Gate(server, connections)
            return gate if context is None else _TLS(loop, gate, context, self.handshake_timeout)

        listener = await loop.create_server(accept, self.addr or None, port, reuse_address=True, reuse_port=True)
        logger.debug("Listening for webhooks at %s", self._build_url("https" if context else "http",
                                                                     self.addr or "*", port, self.path or ""))
        return listener

    def _client_config(self, cadata: bytes | None, context: ssl.SSLContext | None,
                       port: int) -> kopf.WebhookClientConfig:
        """What Kopf's managed mode would write (unused here: the operator writes its own)."""
        host = self.host or self.DEFAULT_HOST or self._get_accessible_addr(self.addr)
        config = kopf.WebhookClientConfig(url=self._build_url("https" if context else "http", host, port,
                                                              self.path or ""))
        if cadata is not None:
            config["caBundle"] = base64.b64encode(cadata).decode("ascii")
        return config

    def _digest(self) -> str:
        paths = [pathlib.Path(p) for p in (self.certfile, self.pkeyfile, self.cafile) if p is not None]
        try:
            return hashlib.sha256(b"".join(path.read_bytes() for path in paths)).hexdigest()
        except OSError:
            return self._loaded   # a file missing for a moment: nothing to load yet

    async def _until_files_change(self) -> None:
        """Kopf's reloading: mounted files change without events, so re-read them now and then;
        the operator's own writes say so (``files_written``)."""
        while self._digest() == self._loaded:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.file_check_interval):
                    await self._files_written.wait()
            self._files_written.clear()

    async def _answer(self, fn: kopf.WebhookFn, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        with _busy(request):
            body = await self._read(request)
            try:
                data = decode_review(body, request.charset)
                review = parse_review(data)
            except ReviewError as exc:
                # Kopf answers a 500 to bodies it cannot read; this is the client's mistake.
                raise aiohttp.web.HTTPBadRequest(text=f"invalid AdmissionReview: {exc}") from None
            response = aiohttp.web.Response(body=orjson.dumps(await _decide(fn, request, review, data)),
                                            content_type="application/json")
            if self._draining:   # the client's next review goes to a replica that stays (see _drain)
                response.force_close()
            return response

    async def _read(self, request: aiohttp.web.Request) -> bytes:
        """The body: within the size limit and ``body_timeout``; a client gone is one log line."""
        if request.content_length is not None and request.content_length > MAX_REVIEW_BYTES:
            raise _too_large(f"{request.content_length} bytes")
        try:
            async with asyncio.timeout(self.body_timeout):
                return await request.read()
        except aiohttp.web.HTTPRequestEntityTooLarge:
            raise _too_large("a chunked body") from None
        except TimeoutError:
            raise aiohttp.web.HTTPRequestTimeout(
                text=f"the AdmissionReview did not arrive within {self.body_timeout:g} s") from None
        except ConnectionError:
            self._throttle.log("disconnect", logging.INFO,
                               "Webhook client %s disconnected before sending its whole request", request.remote)
            raise aiohttp.web.HTTPBadRequest() from None   # nobody reads it; aiohttp drops it quietly


async def _decide(fn: kopf.WebhookFn, request: aiohttp.web.Request, review: AdmissionRequest,
                  data: Mapping[str, Any]) -> Any:
    """Kopf runs the handler named by the path; its Decision is the answer."""
    exchange = Exchange(review)
    token = _exchange.set(exchange)
    stubbed: Any = _identities_only(data, review)
    try:
        response: Any = await fn(stubbed, webhook=request.path.rsplit("/", 1)[-1],
                                 headers=dict(request.headers), sslpeer=_peer_certificate(request))
    except kopf_admission.AmbiguousResourceError as exc:   # Kopf's own answers to these
        raise aiohttp.web.HTTPConflict(reason=str(exc) or None) from None
    except kopf_admission.UnknownResourceError as exc:
        raise aiohttp.web.HTTPNotFound(reason=str(exc) or None) from None
    except kopf_admission.WebhookError as exc:
        raise aiohttp.web.HTTPBadRequest(reason=str(exc) or None) from None
    finally:
        _exchange.reset(token)
    if exchange.decision is not None:
        response = build_response(exchange.decision, review.uid, review.api_version)
    return response


@contextlib.contextmanager
def _busy(request: aiohttp.web.Request) -> Iterator[None]:
    """While a request is answered, its connection is never the one closed to make room."""
    gate = _Gate.of(request)
    if gate is not None:
        gate.busy = gate.served = True
    try:
        yield
    finally:
        if gate is not None:
            gate.busy = False
            gate.active = time.monotonic()   # idle from now on (see _Connections)


def _peer_certificate(request: aiohttp.web.Request) -> Any:
    return request.transport.get_extra_info("peercert") if request.transport else None


def _too_large(size: str) -> aiohttp.web.HTTPRequestEntityTooLarge:
    return aiohttp.web.HTTPRequestEntityTooLarge(
        max_size=MAX_REVIEW_BYTES, actual_size=0,
        text=f"AdmissionReview of {size} is over this webhook's limit of {MAX_REVIEW_BYTES} bytes "
             "(two objects of the API server's 1.5 MiB each fit)")


def _harden(context: ssl.SSLContext) -> None:
    """TLS 1.2+, forward-secret AEAD suites only, and no renegotiation a client could start
    to make the server spend handshakes."""
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(CIPHERS)
    context.options |= ssl.OP_NO_RENEGOTIATION | ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE


def _identities_only(review: Mapping[str, Any], parsed: AdmissionRequest) -> dict[str, Any]:
    """The review with each object cut down to what Kopf routes and remembers it by, and the
    resource as parsed (Kopf needs all three keys; a review may leave out the core group's "")."""
    request = dict(review["request"])
    request["resource"] = {"group": parsed.group, "version": parsed.version, "resource": parsed.resource}
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


class _TLS(sslproto.SSLProtocol):
    """asyncio's TLS for one connection (what ``create_server(ssl=...)`` makes), with a read buffer
    of ``TLS_READ_BUFFER`` instead of asyncio's 256 KB: that buffer is allocated at accept, for
    every connection, including those that never complete a handshake or never send a request."""

    max_size = TLS_READ_BUFFER

    def __init__(self, loop: asyncio.AbstractEventLoop, gate: _Gate, context: ssl.SSLContext,
                 handshake_timeout: float) -> None:
        # No waiter (asyncio's own accept awaits one only to log failed handshakes in debug mode);
        # typeshed asks for a future and an int timeout, asyncio takes None and a float.
        super().__init__(loop, gate, context, None, server_side=True,  # type: ignore[arg-type]
                         ssl_handshake_timeout=handshake_timeout)  # type: ignore[arg-type]


class _Gate(asyncio.Protocol):
    """One connection: admitted (or not) by ``_Connections`` once its TLS handshake is done, then
    aiohttp's protocol for it (made then, not at accept), which it forwards everything to."""

    def __init__(self, server: aiohttp.web.Server, connections: _Connections) -> None:
        self.server = server
        self.handler: Any = None
        self.connections = connections
        self.busy = False        # a request is being answered: never closed to make room
        self.served = False      # has sent a request (one that reached the webhook's handler)
        self.active = time.monotonic()   # admitted, or last answered a request
        self.peer: Any = None
        self.transport: asyncio.Transport | None = None

    @staticmethod
    def of(request: aiohttp.web.Request) -> _Gate | None:
        """The request's connection (the transport's protocol is the gate, aiohttp's is inside it);
        None once the client is gone."""
        gate = request.transport.get_protocol() if request.transport is not None else None
        return gate if isinstance(gate, _Gate) else None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.peer = transport.get_extra_info("peername")
        self.active = time.monotonic()
        if not self.connections.admit(self):
            transport.close()
            return
        self.transport = transport if isinstance(transport, asyncio.Transport) else None
        self.handler = self.server()
        self.handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        # Not activity for the cap: a client trickling bytes would keep its connection from ever
        # making room. Answers are (``_busy``).
        if self.handler is not None:
            self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self.handler.eof_received() if self.handler is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        if self.handler is not None:
            self.handler.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.handler is not None:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self.handler is not None:
            self.handler.resume_writing()

    def close(self) -> None:
        """Closed to make room: at once if it has sent no request (TLS's goodbye would keep it
        for up to 30 s more, waiting on a client that reads nothing), as aiohttp closes otherwise."""
        if not self.served and self.transport is not None:
            self.transport.abort()
        elif self.handler is not None:
            self.handler.force_close()


class _Connections:
    """The open connections, at most ``limit``.

    At the limit a new connection closes another, the first of:

    1. one that has sent no request since it was opened ``min_idle`` ago or more, the oldest:
       a client holding connections open to lock the API server out loses them first;
    2. one idle between requests for ``min_idle`` or more, the longest: the API server opens it
       again if it needs it (a connection idle for less is about to be reused, issue 12);
    3. one that has sent no request yet, opened less than ``min_idle`` ago, the oldest: the
       newcomer is as likely the API server's, and no client that means to send a request waits
       to — so connections opened in a rush to fill the cap cannot refuse the API server's.

    When every connection is busy with a request or answered one a moment ago, the new one is closed.
    """

    def __init__(self, limit: int, throttle: _Throttle, min_idle: float = MIN_IDLE_TO_EVICT) -> None:
        self.limit = limit
        self.throttle = throttle
        self.min_idle = min_idle
        self.open: set[_Gate] = set()

    def admit(self, gate: _Gate) -> bool:
        if len(self.open) >= self.limit:
            victim = self._victim()
            if victim is None:
                self.throttle.log("refused", logging.WARNING, "Refused a webhook connection from %s: all %d "
                                  "connections are answering requests or answered one in the last %g s "
                                  "(AP_MAX_CONNECTIONS)", gate.peer, self.limit, self.min_idle)
                return False
            idle = "that has sent no request" if not victim.served else "idle between requests"
            self.throttle.log("evicted", logging.WARNING, "Closed the longest-idle webhook connection (from %s, "
                              "%s) to admit one from %s: %d connections open (AP_MAX_CONNECTIONS)",
                              victim.peer, idle, gate.peer, self.limit)
            self.discard(victim)
            victim.close()
        self.open.add(gate)
        return True

    def _victim(self) -> _Gate | None:
        """The connection to close for a newcomer, as the class says; None if none may be."""
        now = time.monotonic()

        def rank(gate: _Gate) -> tuple[int, float]:
            settled = now - gate.active >= self.min_idle
            return (0 if settled else 2) if not gate.served else 1, gate.active

        candidates = (g for g in self.open if not g.busy and (not g.served or now - g.active >= self.min_idle))
        return min(candidates, key=rank, default=None)

    def discard(self, gate: _Gate) -> None:
        self.open.discard(gate)


class _Throttle:
    """At most one line per kind per ``interval``, counting the ones left out: a client
    misbehaving in a loop must not flood the log."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._next: dict[str, float] = {}
        self._skipped: collections.Counter[str] = collections.Counter()

    def log(self, kind: str, level: int, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now < self._next.get(kind, 0.0):
            self._skipped[kind] += 1
            return
        self._next[kind] = now + self.interval
        skipped = self._skipped.pop(kind, 0)
        suffix = f" (and {skipped} more in the last {self.interval:g} s)" if skipped else ""
        logger.log(level, message + suffix, *args)
