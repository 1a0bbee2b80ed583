"""The end-to-end load generator: real requests to the API server, from its own process.

    python bench/apiload.py --server https://127.0.0.1:P --ca ca.crt --cert admin.crt --key admin.key \\
        --concurrency 8 --warmup 2 --duration 10 --expect-denials --pid kube-apiserver=PID --pid operator=PID

Closed loop: ``concurrency`` keep-alive connections (aiohttp, TLS with the admin's client
certificate, as kubectl authenticates), each sending the next request of apiobjects.mix() as soon
as the answer is in. Only requests started inside the measured window count; the CPU time of
every ``--pid`` (from /proc) is read at the window's edges, so the orchestrator can divide it by
the requests. Every answer is checked: a compliant request must be admitted (2xx), a
non-compliant one denied (403/422) with ``--expect-denials`` and admitted without; anything else
is a mismatch (counted, with the first few shown).

Prints one JSON line.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import ssl
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp

import apiobjects
from common import CLIENT_CORE, emit, latency_summary, pin
from common import cpu_seconds as process_cpu

REQUEST_TIMEOUT = 30.0    # the API server's own default for a request; webhooks time out at 5 s within it
DENIED = (403, 422)       # what the API server answers for a webhook's / a VAP's denial


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    by_kind: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    denied: int = 0
    mismatches: int = 0
    samples: list[str] = field(default_factory=list)

    def mismatch(self, what: str) -> None:
        self.mismatches += 1
        if len(self.samples) < 3:
            self.samples.append(what[:300])


async def send(session: aiohttp.ClientSession, server: str, call: apiobjects.Call, expect_denials: bool,
               tally: Tally | None) -> None:
    started = time.perf_counter()
    headers = {"Content-Type": call.content_type, "Accept": "application/json"}
    try:
        async with session.request(call.method, server + call.path, data=call.body, headers=headers) as response:
            text = await response.text()
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        if tally is not None:
            tally.statuses[type(exc).__name__] += 1
            tally.mismatch(f"{call.kind}: {exc!r}")
        return
    if tally is None:
        return
    tally.latencies.append(time.perf_counter() - started)
    tally.by_kind[call.kind] += 1
    tally.statuses[str(status)] += 1
    must_deny = call.noncompliant and expect_denials
    if must_deny and status in DENIED:
        tally.denied += 1
    elif must_deny or not 200 <= status < 300:
        tally.mismatch(f"{call.kind}: HTTP {status}: {text}")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    context = ssl.create_default_context(cafile=args.ca)
    context.load_cert_chain(args.cert, args.key)
    pids = {name: int(pid) for name, pid in (item.split("=", 1) for item in args.pid)}
    connector = aiohttp.TCPConnector(ssl=context, limit=args.concurrency)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
    calls = itertools.cycle(apiobjects.mix())
    tally = Tally()
    marks: dict[str, tuple[float, dict[str, float | None], float | None]] = {}

    def mark(edge: str) -> None:
        marks[edge] = (time.perf_counter(), {name: process_cpu(pid) for name, pid in pids.items()},
                       process_cpu(os.getpid()))

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        begin = time.perf_counter()
        window_start, window_end = begin + args.warmup, begin + args.warmup + args.duration

        async def worker() -> None:
            while (now := time.perf_counter()) < window_end:
                counting = now >= window_start
                if counting and "start" not in marks:
                    mark("start")
                await send(session, args.server, next(calls), args.expect_denials, tally if counting else None)

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        mark("end")
    (wall0, cpu0, own0), (wall1, cpu1, own1) = marks["start"], marks["end"]
    wall = wall1 - wall0
    values = tally.latencies
    cpu = {name: _delta(cpu0[name], cpu1[name]) for name in pids}
    return {
        "concurrency": args.concurrency, "seconds": round(wall, 3), "requests": len(values),
        "rps": round(len(values) / wall, 1) if wall > 0 else 0.0,
        "avg_ms": round(statistics.fmean(values) * 1000, 3) if values else 0.0,
        **latency_summary(values),
        "by_kind": dict(tally.by_kind), "statuses": dict(tally.statuses), "denied": tally.denied,
        "mismatches": tally.mismatches, "mismatch_samples": tally.samples,
        "cpu_seconds": cpu,
        "client_cpu": round(own / wall, 3) if (own := _delta(own0, own1)) is not None and wall > 0 else None,
    }


def _delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else round(after - before, 3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--expect-denials", action="store_true", help="Pod Security is enforced: deny the bad Pod")
    parser.add_argument("--pid", action="append", default=[], metavar="NAME=PID", help="a process to charge CPU to")
    parser.add_argument("--core", type=int, default=CLIENT_CORE)
    args = parser.parse_args()
    pin(args.core)
    emit(**asyncio.run(run(args)))


if __name__ == "__main__":
    main()
