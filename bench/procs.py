"""Child processes of the bench: started, read line by line, and always stopped.

Every child is ended by its own pid (SIGTERM, then SIGKILL after a grace period), never by
name; the emulator host is stopped by closing its stdin, which also happens if run.py dies.
"""
from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any

from common import BENCH, HOST, cpu_seconds

STOP_GRACE = 10.0


class ChildError(RuntimeError):
    pass


class Child:
    """A Python script of bench/ as a process; its stdout JSON lines arrive through a queue."""

    def __init__(self, name: str, script: str, args: Sequence[str], *, env: Mapping[str, str] | None = None,
                 log: IO[str] | None = None, stdin: bool = False) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, str(BENCH / script), *args], cwd=BENCH, text=True,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=log if log is not None else subprocess.DEVNULL, env={**os.environ, **(env or {})})
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def read(self, timeout: float) -> dict[str, Any]:
        """The next JSON line; raises if the child exits or stays silent for ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise ChildError(f"{self.name}: no answer in {timeout:.0f}s") from None
            if line is None:
                raise ChildError(f"{self.name}: exited with code {self.proc.wait()}")
            if line.strip().startswith("{"):
                result: dict[str, Any] = json.loads(line)
                return result

    def stop(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        if self.proc.poll() is None and self.proc.stdin is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def running(child: Child) -> Iterator[Child]:
    try:
        yield child
    finally:
        child.stop()


def run_to_end(name: str, script: str, args: Sequence[str], timeout: float) -> dict[str, Any]:
    """Run a child that prints one JSON line and exits (the load generator, the micro-bench)."""
    with running(Child(name, script, args)) as child:
        return child.read(timeout)


def post(port: int, path: str, body: bytes, cafile: str, timeout: float = 5.0) -> tuple[int, Any]:
    """One HTTPS POST (stdlib, for readiness and sanity checks; the load uses aiohttp)."""
    context = ssl.create_default_context(cafile=cafile)
    connection = http.client.HTTPSConnection(HOST, port, context=context, timeout=timeout)
    try:
        connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        text = response.read()
        try:
            return response.status, json.loads(text)
        except ValueError:
            return response.status, text.decode(errors="replace")
    finally:
        connection.close()


def wait_serving(child: Child, port: int, path: str, body: bytes, cafile: str, timeout: float) -> None:
    """Until the server answers a real review with 200 (or dies, or the time is up)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        if child.proc.poll() is not None:
            raise ChildError(f"{child.name}: exited with code {child.proc.returncode}")
        if os.path.exists(cafile):
            try:
                status, last = post(port, path, body, cafile, timeout=2.0)
                if status == 200:
                    return
            except (OSError, ssl.SSLError, http.client.HTTPException) as exc:
                last = exc
        time.sleep(0.2)
    raise ChildError(f"{child.name}: not serving after {timeout:.0f}s (last: {last!r})")


def wait_idle(child: Child, *, below: float = 0.05, window: float = 1.0, timeout: float = 60.0) -> float:
    """Until the child uses less than ``below`` of a core over ``window`` seconds; returns the wait.

    After its policies are Active the operator may still be working through its backlog (status
    writes, events): measuring then would charge that to the requests.
    """
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        before = cpu_seconds(child.pid)
        time.sleep(window)
        after = cpu_seconds(child.pid)
        if before is None or after is None:
            raise ChildError(f"{child.name}: exited")
        if (after - before) / window < below:
            break
    return round(time.monotonic() - started, 1)
