"""Shared by the bench processes: repository paths, CPU pinning, /proc readings, JSON lines.

The bench runs several processes (emulator, server, load generator); they talk to the
orchestrator (run.py) with one JSON object per stdout line, so nothing here needs sockets.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys
from collections.abc import Iterable
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
EXAMPLES = REPO / "examples"
HARNESS = REPO / "tests" / "operator"     # the kmock emulator harness (test code, reused here)
HOST = "127.0.0.1"                         # every socket of the bench, servers and clients alike

sys.path.insert(0, str(REPO / "tests"))
# (tests/ports.py: below the ephemeral range, as the tests' servers)
from ports import free_port as free_port  # noqa: E402

SERVER_CORE = 0    # the server under test gets this core to itself while it is measured
CLIENT_CORE = 1    # load generator, emulator and orchestrator share the other one


def pin(core: int) -> int:
    """Pin this process to one core if the machine has it; returns the core actually used.

    Not checked against our own affinity: children inherit the orchestrator's (pinned) one,
    and the server must still move to its own core.
    """
    try:
        os.sched_setaffinity(0, {core})
    except OSError:   # no such core here (or not in our cpuset): stay where we are
        return min(os.sched_getaffinity(0))
    return core


def cores() -> list[int]:
    """The cores this machine lets us use (read before pinning anything)."""
    return sorted(os.sched_getaffinity(0))


def emit(**fields: Any) -> None:
    """One JSON line on stdout for the orchestrator (flushed: it reads line by line)."""
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def peak_rss_mb(pid: int) -> float | None:
    """VmHWM: the peak resident set size of a live process, in MiB."""
    return _status_kb(pid, "VmHWM")


def rss_mb(pid: int) -> float | None:
    return _status_kb(pid, "VmRSS")


def _status_kb(pid: int, key: str) -> float | None:
    try:
        text = pathlib.Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (all its threads), from /proc/<pid>/stat."""
    try:
        raw = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces; the fields after its ")" are fixed.
    fields = raw.rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])   # utime, stime (fields 14 and 15 of stat)
    return ticks / os.sysconf("SC_CLK_TCK")


def core_busy_seconds(core: int) -> float | None:
    """Seconds core ``core`` spent on anything but idle/iowait so far (steal included: time the
    host gave to others), from /proc/stat."""
    try:
        lines = pathlib.Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if fields[0] == f"cpu{core}":
            ticks = [int(value) for value in fields[1:9]]   # user nice system idle iowait irq softirq steal
            return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    return None


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an already sorted list (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = min(len(sorted_values) - 1, max(0, round(fraction * len(sorted_values) + 0.5) - 1))
    return sorted_values[rank]


def latency_summary(seconds: Iterable[float]) -> dict[str, float]:
    """p50/p95/p99/max in milliseconds."""
    values = sorted(seconds)
    return {
        "p50_ms": round(percentile(values, 0.50) * 1000, 3),
        "p95_ms": round(percentile(values, 0.95) * 1000, 3),
        "p99_ms": round(percentile(values, 0.99) * 1000, 3),
        "max_ms": round((values[-1] if values else 0.0) * 1000, 3),
    }
