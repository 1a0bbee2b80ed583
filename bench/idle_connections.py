"""Idle connections held against the webhook: the server's memory, and whether the API server is still served.

    python bench/idle_connections.py [--idle 500] [--reviews 30] [--hold 3]

Starts the operator as the bench does (``servers.py operator`` on an emulated cluster with the
Pod Security examples, ``AP_*`` defaults otherwise: ``AP_MAX_CONNECTIONS`` 256), then opens
``--idle`` connections that never send a request: half complete the TLS handshake and stay
silent, half open TCP and never start the handshake (a port scanner, a stuck client, someone
holding the port). With those held for ``--hold`` seconds, ``--reviews`` Pod Security reviews are
sent at once, each over a fresh TLS connection (what the API server opens when its idle ones are busy).

Prints the server's RSS before, while the idle connections are held, and after the reviews, and
how many reviews got their answer (a figure, not a verdict: see docs/design.md, "Serving").
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import pathlib
import ssl
import sys
import tempfile
import time
import uuid

import aiohttp

import reviews
from common import HOST, free_port, rss_mb
from procs import Child, running, wait_idle, wait_serving
from run import operator_env

REVIEW = "pss-pod-create"
REVIEW_TIMEOUT = 5.0   # the webhook configurations' timeoutSeconds

Held = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def hold_handshaken(port: int, context: ssl.SSLContext, count: int,
                          held: list[Held]) -> int:
    """Connections whose TLS handshake completes, then silent; returns how many were established."""
    async def one() -> bool:
        with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
            async with asyncio.timeout(30):
                held.append(await asyncio.open_connection(HOST, port, ssl=context))
            return True
        return False
    return sum(await asyncio.gather(*(one() for _ in range(count))))


async def hold_unshaken(port: int, count: int, held: list[Held]) -> int:
    """Plain TCP connections to the TLS port that never send a ClientHello."""
    async def one() -> bool:
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(30):
                held.append(await asyncio.open_connection(HOST, port))
            return True
        return False
    return sum(await asyncio.gather(*(one() for _ in range(count))))


async def send_reviews(port: int, context: ssl.SSLContext, count: int) -> tuple[int, list[str]]:
    """``count`` reviews, each on a connection of its own; returns the answered ones and the failures."""
    head, tail = reviews.template(REVIEW).split(reviews.UID_MARK.encode())
    path = reviews.REQUESTS[REVIEW][1]
    failures: list[str] = []

    async def one() -> bool:
        uid = str(uuid.uuid4())
        try:
            connector = aiohttp.TCPConnector(ssl=context, force_close=True)
            async with aiohttp.ClientSession(connector=connector) as session, \
                    session.post(f"https://{HOST}:{port}{path}", data=head + uid.encode() + tail,
                                 headers={"Content-Type": "application/json"},
                                 timeout=aiohttp.ClientTimeout(total=REVIEW_TIMEOUT)) as response:
                answer = await response.json() if response.status == 200 else None
                if answer is not None and answer["response"]["uid"] == uid:
                    return True
                failures.append(f"HTTP {response.status}")
        except (aiohttp.ClientError, ssl.SSLError, OSError, TimeoutError) as exc:
            failures.append(type(exc).__name__ + (f": {exc}" if str(exc) else ""))
        return False
    answered = sum(await asyncio.gather(*(one() for _ in range(count))))
    return answered, failures


async def probe(pid: int, port: int, cafile: str, idle: int, count: int, hold: float) -> None:
    context = ssl.create_default_context(cafile=cafile)
    held: list[Held] = []
    before = rss_mb(pid)
    try:
        shaken = await hold_handshaken(port, context, idle // 2, held)
        unshaken = await hold_unshaken(port, idle - idle // 2, held)
        await asyncio.sleep(hold)
        holding = rss_mb(pid)
        started = time.monotonic()
        answered, failures = await send_reviews(port, context, count)
        seconds = time.monotonic() - started
        after = rss_mb(pid)
        still_open = sum(1 for reader, _ in held if not reader.at_eof())   # the server closed the others
    finally:
        for _, writer in held:
            writer.close()
    print(f"idle connections opened: {shaken} with a TLS handshake, {unshaken} without; "
          f"{still_open} of them still open after the reviews")
    print(f"server RSS: {before:.1f} MB before, {holding:.1f} MB holding them (+{holding - before:.1f} MB), "
          f"{after:.1f} MB after the reviews")
    print(f"reviews answered: {answered} of {count} in {seconds:.1f} s")
    for failure in sorted(set(failures)):
        print(f"   failed: {failures.count(failure)} x {failure}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle", type=int, default=500)
    parser.add_argument("--reviews", type=int, default=30)
    parser.add_argument("--hold", type=float, default=3.0, help="seconds the idle connections are held first")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-idle-") as work, contextlib.ExitStack() as stack:
        log = stack.enter_context(open(pathlib.Path(work) / "children.log", "w"))
        emulator = stack.enter_context(running(Child("emulator", "emulator_host.py", ["--set", "pss"], log=log,
                                                     stdin=True)))
        port, cert_dir = free_port(), pathlib.Path(work) / "certs"
        env = {"KUBECONFIG": emulator.read(60)["kubeconfig"], **operator_env(port, cert_dir)}
        server = stack.enter_context(running(Child("operator", "servers.py", ["operator"], env=env, log=log)))
        emulator.read(120)   # every policy Active
        cafile = str(cert_dir / "ca.crt")
        wait_serving(server, port, reviews.REQUESTS[REVIEW][1], reviews.template(REVIEW), cafile, timeout=120)
        wait_idle(server)
        asyncio.run(probe(server.pid, port, cafile, args.idle, args.reviews, args.hold))
        if server.proc.poll() is not None:
            sys.exit(f"the operator exited with code {server.proc.returncode}")


if __name__ == "__main__":
    main()
