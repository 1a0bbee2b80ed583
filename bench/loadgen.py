"""The load generator: AdmissionReview POSTs over TLS with keep-alive, from its own process.

    python bench/loadgen.py --url https://127.0.0.1:P --ca ca.crt --request pss-pod-create \\
        --mode closed --concurrency 16 --warmup 2 --duration 8 [--server-pid PID]
    python bench/loadgen.py ... --mode open --rate 1000 --duration 8

closed: ``concurrency`` connections, each sending its next request as soon as the answer is in
(throughput). open: requests start on a fixed schedule whatever the server does, and each
latency counts from the scheduled start, so a server falling behind shows as latency instead of
silently slowing the schedule down. Both are bounded: by time, by the number of requests in
flight (open: what exceeds it is counted as dropped) and by a per-request timeout.

Prints one JSON line: requests/s, latency percentiles, errors, the client's own CPU use (near
1.0 means the client, not the server, was the limit), the server's, and the share of the
server's core that other processes (or the host, as steal) took meanwhile (above a few
percent: a disturbed run).
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

import reviews
from common import CLIENT_CORE, SERVER_CORE, core_busy_seconds, emit, latency_summary, pin
from common import cpu_seconds as process_cpu

Marks = tuple[float, float | None, float, float | None]   # wall, server CPU, own CPU, server core busy

REQUEST_TIMEOUT = 5.0        # the webhook configurations' timeoutSeconds
MAX_IN_FLIGHT_OPEN = 512     # open loop: beyond this many outstanding requests, drop


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    dropped: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    sample: Any = None

    def error(self, what: str) -> None:
        self.errors += 1
        self.statuses[what] = self.statuses.get(what, 0) + 1


class Client:
    """One session; each request gets a fresh uid spliced into the pre-serialised review."""

    def __init__(self, session: aiohttp.ClientSession, url: str, template: bytes) -> None:
        self.session = session
        self.url = url
        self.head, self.tail = template.split(reviews.UID_MARK.encode())
        self.uids = itertools.count()

    async def send(self, tally: Tally | None, started: float) -> None:
        """One request; its latency (from ``started``) goes to ``tally`` unless that is None."""
        uid = f"00000000-0000-4000-8000-{next(self.uids):012d}".encode()
        try:
            async with self.session.post(self.url, data=self.head + uid + self.tail,
                                         headers={"Content-Type": "application/json"}) as response:
                body = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            if tally is not None:
                tally.error(type(exc).__name__)
            return
        if tally is None:
            return
        if status != 200:
            tally.error(f"HTTP {status}")
            return
        tally.latencies.append(time.perf_counter() - started)
        if tally.sample is None:
            tally.sample = json.loads(body)


async def closed_loop(client: Client, concurrency: int, warmup: float, duration: float,
                      on_window: Callable[[bool], None]) -> tuple[Tally, float]:
    """``concurrency`` workers back to back; only requests started inside the window count."""
    tally = Tally()
    begin = time.perf_counter()
    window_start, window_end = begin + warmup, begin + warmup + duration
    started_window = False

    async def worker() -> None:
        nonlocal started_window
        while (now := time.perf_counter()) < window_end:
            counting = now >= window_start
            if counting and not started_window:
                started_window = True
                on_window(True)
            await client.send(tally if counting else None, now)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    on_window(False)
    return tally, duration


async def open_loop(client: Client, rate: float, warmup: float, duration: float, connections: int,
                    on_window: Callable[[bool], None]) -> tuple[Tally, float]:
    """Requests at fixed times ``i / rate``; latency from the scheduled time (no coordinated omission).

    Every connection is opened first, as an API server keeps its connections to a webhook: a
    connection opened on demand mid-run puts a TLS handshake (a millisecond or more of the
    server's CPU) in the schedule, and a stall then snowballs into ever more handshakes."""
    await asyncio.gather(*(client.send(None, time.perf_counter()) for _ in range(connections)))
    tally = Tally()
    in_flight: set[asyncio.Task[None]] = set()
    total = int(rate * (warmup + duration))
    first_counted = int(rate * warmup)
    begin = time.perf_counter()
    for index in range(total):
        scheduled = begin + index / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if index == first_counted:
            on_window(True)
        counting = index >= first_counted
        if len(in_flight) >= MAX_IN_FLIGHT_OPEN:
            tally.dropped += counting
            continue
        task = asyncio.create_task(client.send(tally if counting else None, scheduled))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    if in_flight:
        await asyncio.wait(in_flight, timeout=REQUEST_TIMEOUT + 1)
    on_window(False)
    return tally, duration


def client_context(cafile: str) -> ssl.SSLContext:
    """Trust only the server's CA, hostname checked: what the API server does with caBundle."""
    context = ssl.create_default_context(cafile=cafile)
    context.check_hostname = True
    return context


async def run(args: argparse.Namespace) -> dict[str, Any]:
    path = args.path or reviews.REQUESTS[args.request][1]
    connections = args.concurrency if args.mode == "closed" else args.connections
    connector = aiohttp.TCPConnector(ssl=client_context(args.ca), limit=connections, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
    marks: dict[bool, Marks] = {}

    def on_window(opening: bool) -> None:
        # At both ends of the window: wall time, the server's CPU time, ours, and how busy the
        # server's core was (anything beyond the server's own use is another process's).
        marks[opening] = (time.perf_counter(), process_cpu(args.server_pid) if args.server_pid else None,
                          time.process_time(), core_busy_seconds(SERVER_CORE))

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        client = Client(session, args.url.rstrip("/") + path, reviews.template(args.request))
        if args.mode == "closed":
            tally, _ = await closed_loop(client, args.concurrency, args.warmup, args.duration, on_window)
        else:
            tally, _ = await open_loop(client, args.rate, args.warmup, args.duration, connections, on_window)
    return summarise(args, tally, marks)


def summarise(args: argparse.Namespace, tally: Tally, marks: dict[bool, Marks]) -> dict[str, Any]:
    (t0, server0, client0, core0), (t1, server1, client1, core1) = marks[True], marks[False]
    wall = max(t1 - t0, 1e-9)
    server_cpu = (server1 - server0) / wall if server0 is not None and server1 is not None else None
    others = None
    if server_cpu is not None and core0 is not None and core1 is not None:
        others = max(0.0, (core1 - core0) / wall - server_cpu)
    result: dict[str, Any] = {
        "request": args.request, "mode": args.mode, "requests": len(tally.latencies),
        "rps": round(len(tally.latencies) / wall, 1), "seconds": round(wall, 2),
        **latency_summary(tally.latencies),
        "errors": tally.errors, "dropped": tally.dropped, "error_kinds": tally.statuses,
        "client_cpu": round((client1 - client0) / wall, 2),
        "server_cpu": None if server_cpu is None else round(server_cpu, 2),
        "others_on_server_core": None if others is None else round(others, 2),
        "sample_response": tally.sample,
    }
    if args.mode == "open":
        result["offered_rps"] = args.rate
    else:
        result["concurrency"] = args.concurrency
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--request", choices=sorted(reviews.REQUESTS), required=True)
    parser.add_argument("--path", help="override the request's webhook path (/validate or /mutate)")
    parser.add_argument("--mode", choices=("closed", "open"), default="closed")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--connections", type=int, default=64, help="open loop: keep-alive connections")
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--server-pid", type=int)
    args = parser.parse_args()
    pin(CLIENT_CORE)
    emit(**asyncio.run(run(args)))


if __name__ == "__main__":
    main()
