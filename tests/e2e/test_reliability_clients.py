"""Issue 12, scenario 6: slow and abusive clients on the operator's webhook port while real
traffic flows through the API server.

Beside the traffic (dry-run ConfigMap creates, all denied by one policy), clients connect to the
webhook port directly and misbehave: idle TLS connections past the connection cap, TCP connections
that never finish the TLS handshake, request bodies trickled a byte a second, and many connections
at once. The traffic must be answered as the policy says, every one of it, and each abusive
connection must be closed by the server's limits (``operator/webhook.py``): the cap evicts the
longest idle, the handshake timeout and the body timeout end the slow ones.

The operator here is the test's own, with a low cap (``AP_MAX_CONNECTIONS``), so that a handful of
connections is past it; the session's operator is stopped meanwhile (one owns the webhook
configurations at a time) and started again afterwards.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import pathlib
import ssl
import time
from collections.abc import Callable

import pytest
from e2e_kube import Cluster, OperatorProcess, unique
from replicas import replicas
from traffic import Figures, PolicyDriver, Timeline, Traffic, Variant, configmap, report, scaled

from admission_policy.operator.webhook import MIN_IDLE_TO_EVICT
from builders import review

pytestmark = pytest.mark.e2e

SELECTOR_KEY = "e2e.policy-operator.dev/traffic"
CAP = 16                     # AP_MAX_CONNECTIONS of the operator under test
HANDSHAKE_TIMEOUT = 10.0     # webhook.TLS_HANDSHAKE_TIMEOUT
BODY_TIMEOUT = 5             # AP_WEBHOOK_TIMEOUT: how long a body may take once its headers are in
GRACE = 20.0                 # what the server may take beyond its timeouts to close (a loaded machine)
PACE = 0.05                  # seconds a traffic client waits between requests: it spans the abuse


def abuser_context() -> ssl.SSLContext:
    """An abusive client does not verify anything; it only needs the handshake to succeed."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


async def closed_by_server(reader: asyncio.StreamReader, within: float) -> tuple[bool, bytes]:
    """(closed, what came before the close): read until the server closes, or ``within`` passes."""
    received = b""
    try:
        async with asyncio.timeout(within):
            while chunk := await reader.read(65536):
                received += chunk
    except TimeoutError:
        return False, received
    except (ConnectionError, ssl.SSLError):
        pass
    return True, received


def close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.close()


@dataclasses.dataclass
class Abuse:
    """What each kind of abusive client saw."""
    idle_opened: int = 0
    idle_closed: int = 0         # closed by the cap, while we kept them open
    half_open: int = 0
    half_open_closed: int = 0    # closed by the handshake timeout
    slow_bodies: int = 0
    slow_bodies_408: int = 0     # answered 408 and closed by the body timeout
    slow_answers: list[str] = dataclasses.field(default_factory=list)   # the others' (closed?, first bytes)
    burst: int = 0
    burst_answered: int = 0      # answered 200
    burst_refused: int = 0       # closed unanswered: every connection was busy
    started: float = 0.0
    phases: list[float] = dataclasses.field(default_factory=list)   # when the slow ones, then the idle ones ended
    ended: float = 0.0


class Abuser:
    def __init__(self, port: int, namespace: str) -> None:
        self.port, self.namespace = port, namespace
        self.context = abuser_context()
        self.result = Abuse()

    async def tls(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port, ssl=self.context)

    async def idle_past_the_cap(self) -> None:
        """Twice the cap, left idle: at most the cap of them can stay. The second half comes once the
        first has been idle long enough to be closed for it (the API server's own connections may
        all have been active a moment ago, and then a newcomer is refused rather than evicting)."""
        connections = []
        for half in range(2):
            if half:
                await asyncio.sleep(MIN_IDLE_TO_EVICT + 1)
            for _ in range(CAP):
                connections.append(await self.tls())
                self.result.idle_opened += 1
        # Evicted ones are closed at once; the wait is for the server to get round to it.
        outcomes = await asyncio.gather(*(closed_by_server(reader, GRACE / 4) for reader, _ in connections))
        self.result.idle_closed = sum(closed for closed, _ in outcomes)
        for _, writer in connections:
            close(writer)

    async def half_open(self, count: int) -> None:
        """TCP connections that never finish the TLS handshake: some say nothing, some start a record."""
        connections = []
        for index in range(count):
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            if index % 2:
                writer.write(b"\x16\x03\x01\x02\x00\x01")   # a handshake record header and one byte of it
                await writer.drain()
            connections.append((reader, writer))
        self.result.half_open = count
        outcomes = await asyncio.gather(*(closed_by_server(reader, HANDSHAKE_TIMEOUT + GRACE)
                                          for reader, _ in connections))
        self.result.half_open_closed = sum(closed for closed, _ in outcomes)
        for _, writer in connections:
            close(writer)

    async def slow_body(self) -> bool:
        """Headers at once, then the body a byte a second: answered 408 and closed."""
        reader, writer = await self.tls()
        body = self.review("slow-loris")
        writer.write(self.head(len(body)))
        await writer.drain()

        async def trickle() -> None:
            with contextlib.suppress(ConnectionError, ssl.SSLError, RuntimeError):
                for byte in body:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(1)

        trickling = asyncio.create_task(trickle())
        try:
            closed, received = await closed_by_server(reader, BODY_TIMEOUT + GRACE)
        finally:
            trickling.cancel()
            close(writer)
        if closed and received.startswith(b"HTTP/1.1 408"):
            return True
        self.result.slow_answers.append(f"closed={closed} {received[:120]!r}")
        return False

    async def slow_bodies(self, count: int) -> None:
        self.result.slow_bodies = count
        self.result.slow_bodies_408 = sum(await asyncio.gather(*(self.slow_body() for _ in range(count))))

    async def one_of_a_burst(self) -> str:
        """One of many connections opened at once, each with a normal review: answered, or closed
        unanswered when every connection is busy (never left hanging)."""
        try:
            reader, writer = await self.tls()
        except (ConnectionError, ssl.SSLError):
            return "refused"
        try:
            body = self.review("burst")
            writer.write(self.head(len(body)) + body)
            await writer.drain()
            closed, received = await closed_by_server(reader, GRACE)
            if received.startswith(b"HTTP/1.1 200"):
                return "answered"
            return "refused" if closed and not received else f"unexpected: {received[:200]!r}"
        except (ConnectionError, ssl.SSLError):
            return "refused"
        finally:
            close(writer)

    async def burst(self, count: int) -> None:
        outcomes = await asyncio.gather(*(self.one_of_a_burst() for _ in range(count)))
        self.result.burst = count
        self.result.burst_answered = outcomes.count("answered")
        self.result.burst_refused = outcomes.count("refused")
        unexpected = [o for o in outcomes if o not in ("answered", "refused")]
        assert not unexpected, unexpected

    def head(self, length: int) -> bytes:
        # "Connection: close": the burst's answers end with the connection, so reading to EOF ends.
        return (f"POST /validate HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nContent-Type: application/json\r\n"
                f"Connection: close\r\nContent-Length: {length}\r\n\r\n").encode()

    def review(self, name: str) -> bytes:
        """A ConfigMap create in the traffic's namespace, as the API server would send it."""
        return json.dumps(review(configmap(self.namespace, name), resource="configmaps", kind="ConfigMap", name=name,
                                 namespace=self.namespace, uid=unique(name), user_info={"username": "abuser"},
                                 dryRun=True)).encode()

    async def run(self) -> Abuse:
        self.result.started = time.monotonic()
        # The slow ones first, below the cap (so each meets its own timeout, not the cap), then the
        # idle ones past the cap, then the burst.
        await asyncio.gather(self.half_open(2 * CAP), self.slow_bodies(CAP // 4))
        self.result.phases.append(time.monotonic())
        await self.idle_past_the_cap()
        self.result.phases.append(time.monotonic())
        await self.burst(3 * CAP)
        self.result.ended = time.monotonic()
        return self.result


def test_slow_and_abusive_clients_never_keep_the_api_server_from_an_answer(
        cluster: Cluster, operator: OperatorProcess, namespace: Callable[..., str], tmp_path: pathlib.Path,
        request: pytest.FixtureRequest) -> None:
    selector = (SELECTOR_KEY, unique("clients"))
    ns = namespace({selector[0]: selector[1]})
    timeline = Timeline()
    driver = PolicyDriver(cluster, timeline, selector)
    env = {"AP_MAX_CONNECTIONS": str(CAP), "AP_WEBHOOK_TIMEOUT": str(BODY_TIMEOUT)}
    with replicas(cluster, operator, tmp_path, request, 1, peering=False, proxy=False, env=env,
                  prefix="ap-e2e-clients") as group:
        (ours,) = group.processes
        try:
            policy = unique("clients-deny")
            driver.write(policy, Variant("Enforce"))   # every request of the traffic is denied by it

            with Traffic(cluster, ns, clients=4, limit=scaled(1000), pace=PACE) as traffic:
                traffic.wait(20, cluster.settings.timeout)
                abuse = asyncio.run(Abuser(ours.listen_port, ns).run())
                answers = traffic.wait_finished(cluster.settings.timeout * 5)
        finally:
            driver.delete_all()   # while ours still runs: its finalizer
        log = ours.log_path.read_text(errors="replace")

    during = sum(1 for a in answers if abuse.started <= a.sent <= abuse.ended)
    figures = report(Figures.of(
        "slow and abusive clients", answers, timeline, during_abuse=during,
        idle=f"{abuse.idle_closed}/{abuse.idle_opened} closed past the cap of {CAP}",
        half_open=f"{abuse.half_open_closed}/{abuse.half_open} closed",
        slow_bodies=f"{abuse.slow_bodies_408}/{abuse.slow_bodies} got 408",
        burst=f"{abuse.burst_answered} answered, {abuse.burst_refused} refused of {abuse.burst}"))
    assert figures.wrong == 0, "\n".join([figures.line(), *figures.wrong_examples])
    phases = f"abuse from {abuse.started:.3f}, phases ending {abuse.phases}, to {abuse.ended:.3f}"
    assert figures.errors == 0, "\n".join([figures.line(), phases, *(str(a) for a in answers if a.error)][:8])
    assert during >= 10, f"too little traffic while the abuse lasted to prove anything: {figures.line()}"

    # Each kind of abusive connection ended by the server, not by us.
    assert abuse.idle_closed >= abuse.idle_opened - CAP, figures.line()
    assert abuse.half_open_closed == abuse.half_open, figures.line()
    assert abuse.slow_bodies_408 == abuse.slow_bodies, (figures.line(), abuse.slow_answers)
    assert abuse.burst_answered > 0 and abuse.burst_answered + abuse.burst_refused == abuse.burst, figures.line()
    # Said once per kind of trouble, never a traceback.
    assert "Traceback" not in log, ours.log_tail()
    assert "Closed the longest-idle webhook connection" in log, ours.log_tail()
